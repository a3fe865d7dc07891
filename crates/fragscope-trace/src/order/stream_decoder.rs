//! A process's thread buffers decoded into what the merge takes: calls with
//! process-wide stack ids, and the rare other items beside them. Decoding depends on file
//! order alone, never on the merge, so it can run ahead of it ([`crate::order::ahead`]) or
//! inside it ([`crate::order::merge::Merger::push_chunk`]).

use std::collections::HashMap;

use crate::format::event::{ChunkDecoder, Func, Record, StatsSource, StreamTables};
use crate::format::hash::FastMap;
use crate::format::records::EventsHeader;
use crate::format::TraceError;
use crate::order::call::NO_RELEASE;
use crate::order::call::{Call, CallArray, Summary};

/// A thread buffer's records, decoded into what the merge takes: its calls (with
/// process-wide stack ids) in the array a lone thread's run is popped from, and the
/// rare other items beside them.
#[derive(Debug, Default)]
pub struct DecodedEvents {
    pub(crate) calls: CallArray,
    /// The places of `calls`; shorter than `calls` when the rest are 0, empty for a
    /// buffer with none (see `merge::LoneRun`).
    pub(crate) places: Vec<u64>,
    /// The other items, each with the number of calls that come before it.
    pub(crate) others: Vec<(usize, DecodedOther)>,
    /// Stacks this buffer defined first in its process, in the order of their ids.
    pub(crate) new_stacks: Vec<Vec<u64>>,
    /// The decoder's tick and `next_place` after its last record (or at its error).
    pub(crate) end_tick: u64,
    pub(crate) end_next_place: Option<u64>,
    /// Why decoding stopped before the end of the buffer, if it did.
    pub(crate) error: Option<TraceError>,
}

/// A buffer's item other than a call.
#[derive(Debug)]
pub(crate) enum DecodedOther {
    Stats {
        tick: u64,
        place: u64,
        source: StatsSource,
        values: Vec<(String, u64)>,
    },
    Lost(u64),
    Joined(u32),
    /// The thread forked a child that names this mark.
    Forked {
        tick: u64,
        place: u64,
        mark: u32,
    },
    /// The interposer's own mapped bytes, as it said at `tick`.
    OwnMemory {
        tick: u64,
        bytes: u64,
    },
    /// An aggregated recording's account of calls it left out.
    Summary {
        tick: u64,
        place: u64,
        summary: Summary,
    },
}

impl DecodedEvents {
    #[inline(always)]
    fn push_call(&mut self, c: Call, place: u64) {
        if place != 0 || !self.places.is_empty() {
            self.places.resize(self.calls.len(), 0);
            self.places.push(place);
        }
        self.calls.push(c);
    }

    fn clear(&mut self) {
        self.calls.clear();
        self.places.clear();
        self.others.clear();
        self.new_stacks.clear();
        self.end_tick = 0;
        self.end_next_place = None;
        self.error = None;
    }
}

/// What decoding a process's buffers carries from one to the next, in file order: the
/// packed form's tables of blocks, and its threads' stack ids.
#[derive(Default)]
pub struct StreamDecoder {
    tables: StreamTables,
    /// Process-wide stack ids (from 1) by frames.
    stack_ids: HashMap<Vec<u64>, u32>,
    /// Each thread's own stack ids.
    threads: FastMap<u32, LocalStacks>,
}

impl StreamDecoder {
    /// Decodes buffer `h` (its records `bytes`) into `out`, whose allocations are reused.
    pub fn decode(&mut self, h: &EventsHeader, bytes: &[u8], out: &mut DecodedEvents) {
        out.clear();
        let locals = self.threads.entry(h.tid).or_default();
        let mut d = ChunkDecoder::new(bytes, h, &mut self.tables);
        loop {
            let rec = match d.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    out.error = Some(e);
                    break;
                }
            };
            let tick = d.tick();
            let place = d.place().unwrap_or(0);
            let other = match rec {
                Record::Alloc {
                    func,
                    addr,
                    old_addr,
                    size,
                    align,
                    usable,
                    stack,
                } => {
                    let mut call = Call {
                        tick,
                        tid: h.tid,
                        func,
                        addr,
                        old_addr,
                        size,
                        usable: usable.unwrap_or(0),
                        align,
                        stack: if stack == 0 { 0 } else { locals.get(stack) },
                        release_value: 0,
                        release_ticks_back: NO_RELEASE,
                        old_taken: false,
                    };
                    if func.takes_old_block() {
                        if let Some(released) = d.take_released() {
                            call.set_release(released);
                        }
                    }
                    out.push_call(call, place);
                    continue;
                }
                Record::Free { addr } => {
                    out.push_call(Call::on(tick, h.tid, Func::Free, addr), place);
                    continue;
                }
                Record::StackDef { id, frames } => {
                    let next = self.stack_ids.len() as u32 + 1;
                    let global = *self.stack_ids.entry(frames.clone()).or_insert(next);
                    if global == next {
                        out.new_stacks.push(frames);
                    }
                    locals.insert(id, global);
                    continue;
                }
                Record::Stats { source, values } => DecodedOther::Stats {
                    tick,
                    place,
                    source,
                    values,
                },
                Record::Lost { count } => DecodedOther::Lost(count),
                Record::Joined { tid } => DecodedOther::Joined(tid),
                Record::Forked { mark } => DecodedOther::Forked { tick, place, mark },
                Record::OwnMemory { bytes } => DecodedOther::OwnMemory { tick, bytes },
                Record::Summed {
                    stack,
                    size,
                    allocations,
                    temporaries,
                } => DecodedOther::Summary {
                    tick,
                    place,
                    summary: Summary::Summed {
                        stack: if stack == 0 { 0 } else { locals.get(stack) },
                        size,
                        allocations,
                        temporaries,
                    },
                },
                Record::Live {
                    live,
                    usable,
                    peak,
                    peak_age,
                    calls,
                } => DecodedOther::Summary {
                    tick,
                    place,
                    summary: Summary::Live {
                        live,
                        usable,
                        peak,
                        peak_tick: tick.saturating_sub(peak_age),
                        calls,
                    },
                },
                Record::Tick { .. }
                | Record::Usable { .. }
                | Record::Order { .. }
                | Record::Released { .. } => continue,
            };
            out.others.push((out.calls.len(), other));
        }
        // A thread without places may have more calls at place 0 of its last tick.
        out.end_tick = d.tick();
        out.end_next_place = d.next_place();
    }
}

/// A thread's stack ids, which the interposer hands out from 1 upwards: looked up by
/// index, with no hashing, on every allocation. Ids past `DENSE` (a damaged trace's, or
/// a thread with millions of stacks) go to a map, so one id cannot make the table huge.
#[derive(Default)]
struct LocalStacks {
    dense: Vec<u32>,
    sparse: FastMap<u32, u32>,
}

impl LocalStacks {
    const DENSE: u32 = 1 << 22;

    /// The process stack index of thread-local `id`; 0 when it was never defined.
    #[inline]
    fn get(&self, id: u32) -> u32 {
        if id < Self::DENSE {
            self.dense.get(id as usize).copied().unwrap_or(0)
        } else {
            self.sparse.get(&id).copied().unwrap_or(0)
        }
    }

    fn insert(&mut self, id: u32, global: u32) {
        if id < Self::DENSE {
            let i = id as usize;
            if i >= self.dense.len() {
                self.dense.resize(i + 1, 0);
            }
            self.dense[i] = global;
        } else {
            self.sparse.insert(id, global);
        }
    }
}
