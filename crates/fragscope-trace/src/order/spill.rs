//! Calls waiting in the merge, kept in a temporary file once too many wait in memory.
//!
//! A thread the scheduler leaves behind holds back every other thread's calls after its
//! last one: with hundreds of threads on a few cores, millions of calls. Each thread's
//! queue keeps its head in memory; past the merge's memory budget, what comes after goes
//! to that thread's run of segments in one unlinked temporary file, read back in order as
//! the head drains. Memory then grows with the number of threads, not with the calls held
//! behind the slowest one, and the merge never has to trade order for memory.
//!
//! Items are encoded compactly (deltas and varints, 10-15 bytes a call) and each segment
//! is one zstd frame. If the file cannot be made or written (no temporary directory, a
//! full disk), a thread's tail stays in memory in its encoded form, still in order.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::format::event::{Func, StatsSource};
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;
use crate::order::call::{Call, Merged, Summary, NO_RELEASE};

/// Items of one segment: small enough that every thread's head, read back a segment at a
/// time, fits in memory (1024 threads x 1024 calls x ~80 bytes = 80 MiB at worst).
const SEGMENT_ITEMS: u32 = 1024;
/// An item's first byte: the call's function, and which of its fields follow.
const STATS_TAG: u8 = 0x80;
const FORKED_TAG: u8 = 0x81;
const SUMMED_TAG: u8 = 0x82;
const LIVE_TAG: u8 = 0x83;
const FUNC_BITS: u8 = 0x0f;
const HAS_OLD_ADDR: u8 = 0x10;
const HAS_ALIGN: u8 = 0x20;
const HAS_SIZE: u8 = 0x40;
/// A realloc, which has no alignment: its release and whether its old block was taken
/// follow ([`Call::release_when`], [`Call::old_taken`]).
const HAS_RELEASE: u8 = HAS_ALIGN;

/// zstd's fastest levels: a spilled call is written once and read once, soon after.
const LEVEL: i32 = -3;

/// The temporary file every thread's segments go to, made when first needed.
#[derive(Default)]
pub(crate) struct SpillFile {
    file: Option<File>,
    compressor: Option<zstd::bulk::Compressor<'static>>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    end: u64,
    /// Why segments stay in memory from now on, if they do.
    failed: Option<String>,
    /// Items written to the file so far.
    items_written: u64,
    scratch: Vec<u8>,
}

impl SpillFile {
    /// Why the merge could not spill to disk, if it could not.
    pub(crate) fn problem(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// From now on segments stay in memory, for this reason (the first one given).
    pub(crate) fn fail(&mut self, why: String) {
        self.failed.get_or_insert(why);
    }

    /// Writes one compressed segment, or says why not (and from then on, always not).
    fn write(&mut self, raw: &[u8]) -> Option<(u64, u32)> {
        if self.failed.is_some() {
            return None;
        }
        let result = (|| -> std::io::Result<(u64, u32)> {
            if self.file.is_none() {
                self.file = Some(tempfile::tempfile()?);
            }
            let compressor = match &mut self.compressor {
                Some(c) => c,
                None => self.compressor.insert(zstd::bulk::Compressor::new(LEVEL)?),
            };
            let packed = compressor.compress(raw)?;
            let file = self.file.as_ref().expect("made above");
            file.write_all_at(&packed, self.end)?;
            let at = self.end;
            self.end += packed.len() as u64;
            Ok((at, packed.len() as u32))
        })();
        match result {
            Ok(placed) => Some(placed),
            Err(e) => {
                self.failed = Some(format!(
                    "calls waiting for slow threads stay in memory: the temporary file for them \
                     could not be written in {} ({e})",
                    std::env::temp_dir().display()
                ));
                None
            }
        }
    }

    /// Reads one segment back, decompressed, into `scratch`.
    fn read(&mut self, s: &Segment) -> Result<&[u8], String> {
        let file = self.file.as_ref().ok_or("no temporary file")?;
        let mut packed = vec![0; s.bytes as usize];
        file.read_exact_at(&mut packed, s.offset)
            .map_err(|e| e.to_string())?;
        let decompressor = match &mut self.decompressor {
            Some(d) => d,
            None => self
                .decompressor
                .insert(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?),
        };
        self.scratch.clear();
        self.scratch.reserve(s.raw_bytes as usize);
        decompressor
            .decompress_to_buffer(&packed, &mut self.scratch)
            .map_err(|e| e.to_string())?;
        Ok(&self.scratch)
    }
}

/// One thread's items on disk.
struct Segment {
    offset: u64,
    bytes: u32,
    raw_bytes: u32,
    items: u32,
}

/// What one item's fields are encoded against: the item before it in the same segment.
#[derive(Default, Clone, Copy)]
struct Previous {
    tick: u64,
    place: u64,
    addr: u64,
}

/// One thread's spilled items, in order: whole segments (on disk, or in memory when the
/// file failed), then a tail still being filled.
#[derive(Default)]
pub(crate) struct ThreadSpill {
    segments: VecDeque<Segment>,
    /// Segments kept in memory because the file failed (their encoded bytes, in order).
    kept: VecDeque<(Vec<u8>, u32)>,
    tail: Writer,
    tail_items: u32,
    previous: Previous,
    items: u64,
}

impl ThreadSpill {
    /// Items spilled and not yet read back.
    pub(crate) fn items(&self) -> u64 {
        self.items
    }

    /// Appends an item after every item spilled so far.
    pub(crate) fn push(&mut self, file: &mut SpillFile, item: &(Merged, u64)) {
        encode(&mut self.tail, &mut self.previous, item);
        self.tail_items += 1;
        self.items += 1;
        if self.tail_items >= SEGMENT_ITEMS {
            self.seal(file);
        }
    }

    /// Closes the tail as a segment: to the file, or kept in memory if the file failed.
    fn seal(&mut self, file: &mut SpillFile) {
        let raw = std::mem::take(&mut self.tail.bytes);
        let items = std::mem::take(&mut self.tail_items);
        self.previous = Previous::default();
        // Once one segment is kept in memory, later ones must be too (they come after it).
        let placed = if self.kept.is_empty() {
            file.write(&raw)
        } else {
            None
        };
        match placed {
            Some((offset, bytes)) => {
                file.items_written += u64::from(items);
                self.segments.push_back(Segment {
                    offset,
                    bytes,
                    raw_bytes: raw.len() as u32,
                    items,
                });
            }
            None => self.kept.push_back((raw, items)),
        }
    }

    /// Moves the earliest spilled items (one segment, or the tail) into `queue`. On a
    /// read error the segment's items are lost: returns how many, and why.
    pub(crate) fn refill(
        &mut self,
        file: &mut SpillFile,
        tid: u32,
        queue: &mut VecDeque<(Merged, u64)>,
    ) -> Result<(), (u64, String)> {
        if let Some(s) = self.segments.pop_front() {
            self.items -= u64::from(s.items);
            let raw = file.read(&s).map_err(|e| (u64::from(s.items), e))?;
            return decode_into(raw, tid, queue).map_err(|e| (u64::from(s.items), e.to_string()));
        }
        let (raw, items) = match self.kept.pop_front() {
            Some(k) => k,
            None => {
                self.previous = Previous::default();
                (
                    std::mem::take(&mut self.tail.bytes),
                    std::mem::take(&mut self.tail_items),
                )
            }
        };
        self.items -= u64::from(items);
        decode_into(&raw, tid, queue).map_err(|e| (u64::from(items), e.to_string()))
    }
}

fn encode(w: &mut Writer, prev: &mut Previous, (item, place): &(Merged, u64)) {
    let tick = item.tick();
    match item {
        Merged::Call(c) => {
            let sized = c.size != 0 || c.usable != 0 || c.stack != 0;
            w.u8(c.func as u8
                | if c.old_addr != 0 { HAS_OLD_ADDR } else { 0 }
                | if c.align != 0 { HAS_ALIGN } else { 0 }
                | if c.release_ticks_back != NO_RELEASE || c.old_taken {
                    HAS_RELEASE
                } else {
                    0
                }
                | if sized { HAS_SIZE } else { 0 })
        }
        Merged::Stats { .. } => w.u8(STATS_TAG),
        Merged::Forked { .. } => w.u8(FORKED_TAG),
        Merged::Summary {
            summary: Summary::Summed { .. },
            ..
        } => w.u8(SUMMED_TAG),
        Merged::Summary {
            summary: Summary::Live { .. },
            ..
        } => w.u8(LIVE_TAG),
    };
    w.svarint(tick.wrapping_sub(prev.tick) as i64)
        .svarint(place.wrapping_sub(prev.place) as i64);
    prev.tick = tick;
    prev.place = *place;
    match item {
        Merged::Call(c) => {
            w.svarint(c.addr.wrapping_sub(prev.addr) as i64);
            prev.addr = c.addr;
            if c.old_addr != 0 {
                w.svarint(c.old_addr.wrapping_sub(c.addr) as i64);
            }
            if c.align != 0 {
                w.varint(c.align);
            }
            if c.release_ticks_back != NO_RELEASE || c.old_taken {
                w.u8(c.release_ticks_back)
                    .varint(c.release_value.into())
                    .u8(c.old_taken.into());
            }
            if c.size != 0 || c.usable != 0 || c.stack != 0 {
                w.varint(c.size)
                    .svarint(c.usable.wrapping_sub(c.size) as i64)
                    .varint(c.stack.into());
            }
        }
        Merged::Stats { source, values, .. } => {
            w.u8(source.to_u8()).varint(values.len() as u64);
            for (name, v) in values {
                w.str(name).varint(*v);
            }
        }
        Merged::Forked { mark, .. } => {
            w.varint((*mark).into());
        }
        Merged::Summary { summary, .. } => match *summary {
            Summary::Summed {
                stack,
                size,
                allocations,
                temporaries,
            } => {
                w.varint(stack.into())
                    .varint(size)
                    .varint(allocations)
                    .varint(temporaries);
            }
            Summary::Live {
                live,
                usable,
                peak,
                peak_tick,
                calls,
            } => {
                w.varint(live)
                    .varint(usable)
                    .varint(peak)
                    .varint(tick.wrapping_sub(peak_tick))
                    .varint(calls);
            }
        },
    }
}

fn decode_into(
    raw: &[u8],
    tid: u32,
    queue: &mut VecDeque<(Merged, u64)>,
) -> Result<(), TraceError> {
    let mut r = Reader::new(raw);
    let mut prev = Previous::default();
    while !r.is_empty() {
        let tag = r.u8()?;
        let tick = prev.tick.wrapping_add(r.svarint()? as u64);
        let place = prev.place.wrapping_add(r.svarint()? as u64);
        prev.tick = tick;
        prev.place = place;
        let item = if tag == STATS_TAG {
            let source = StatsSource::from_u8(r.u8()?);
            let n = r.count(2)?;
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                values.push((r.string()?, r.varint()?));
            }
            Merged::Stats {
                tick,
                source,
                values,
            }
        } else if tag == SUMMED_TAG {
            let stack = u32::try_from(r.varint()?)
                .map_err(|_| TraceError::Malformed("spilled summed stack".into()))?;
            let summary = Summary::Summed {
                stack,
                size: r.varint()?,
                allocations: r.varint()?,
                temporaries: r.varint()?,
            };
            Merged::Summary { tick, summary }
        } else if tag == LIVE_TAG {
            let (live, usable, peak) = (r.varint()?, r.varint()?, r.varint()?);
            let summary = Summary::Live {
                live,
                usable,
                peak,
                peak_tick: tick.wrapping_sub(r.varint()?),
                calls: r.varint()?,
            };
            Merged::Summary { tick, summary }
        } else if tag == FORKED_TAG {
            let mark = u32::try_from(r.varint()?)
                .map_err(|_| TraceError::Malformed("spilled fork mark".into()))?;
            Merged::Forked { tick, mark }
        } else {
            let func = Func::from_kind(tag & FUNC_BITS)
                .ok_or_else(|| TraceError::Malformed(format!("spilled call of kind {tag}")))?;
            let addr = prev.addr.wrapping_add(r.svarint()? as u64);
            prev.addr = addr;
            let mut c = Call::on(tick, tid, func, addr);
            if tag & HAS_OLD_ADDR != 0 {
                c.old_addr = addr.wrapping_add(r.svarint()? as u64);
            }
            if tag & HAS_RELEASE != 0 && func.takes_old_block() {
                c.release_ticks_back = r.u8()?;
                c.release_value = u32::try_from(r.varint()?)
                    .map_err(|_| TraceError::Malformed("spilled release value".into()))?;
                c.old_taken = r.u8()? != 0;
            } else if tag & HAS_ALIGN != 0 {
                c.align = r.varint()?;
            }
            if tag & HAS_SIZE != 0 {
                c.size = r.varint()?;
                c.usable = c.size.wrapping_add(r.svarint()? as u64);
                c.stack = u32::try_from(r.varint()?)
                    .map_err(|_| TraceError::Malformed("spilled stack id".into()))?;
            }
            Merged::Call(c)
        };
        queue.push_back((item, place));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(i: u64) -> (Merged, u64) {
        let func = Func::ALL[(i % 10) as usize];
        (
            Merged::Call(Call {
                tick: 1000 + i / 7,
                tid: 42,
                func,
                addr: if i.is_multiple_of(13) {
                    0
                } else {
                    0x5555_0000 + i * 48
                },
                old_addr: if func == Func::Realloc {
                    0x7f00_0000_0000 - i
                } else {
                    0
                },
                size: i * 3 % 5000,
                usable: i * 3 % 5000 + 8,
                align: if i.is_multiple_of(4) && func != Func::Realloc {
                    64
                } else {
                    0
                },
                stack: (i % 3) as u32,
                release_value: if func == Func::Realloc { i as u32 } else { 0 },
                release_ticks_back: if func == Func::Realloc {
                    (i % 3) as u8
                } else {
                    NO_RELEASE
                },
                old_taken: func == Func::Realloc && i % 3 == 2,
            }),
            (i % 7) * 2 + u64::from(func == Func::Free),
        )
    }

    fn stats(i: u64) -> (Merged, u64) {
        (
            Merged::Stats {
                tick: 1000 + i / 7,
                source: StatsSource::Jemalloc,
                values: vec![("allocated".into(), i), ("resident".into(), u64::MAX)],
            },
            0,
        )
    }

    /// Every item read back equals the item spilled, in order, across segments, the
    /// tail, and extreme values.
    #[test]
    fn spilled_items_read_back_in_order_and_unchanged() {
        let mut items: Vec<_> = (0..5000u64)
            .map(|i| {
                if i.is_multiple_of(700) {
                    stats(i)
                } else if i % 700 == 100 {
                    let summary = Summary::Summed {
                        stack: i as u32,
                        size: i * 3,
                        allocations: i,
                        temporaries: i / 2,
                    };
                    (
                        Merged::Summary {
                            tick: 1000 + i / 7,
                            summary,
                        },
                        0,
                    )
                } else if i % 700 == 200 {
                    let summary = Summary::Live {
                        live: i << 20,
                        usable: (i << 20) + 7,
                        peak: i << 21,
                        peak_tick: 990 + i / 7,
                        calls: i,
                    };
                    (
                        Merged::Summary {
                            tick: 1000 + i / 7,
                            summary,
                        },
                        0,
                    )
                } else if i % 700 == 350 {
                    (
                        Merged::Forked {
                            tick: 1000 + i / 7,
                            mark: i as u32,
                        },
                        (i % 7) * 2,
                    )
                } else {
                    call(i)
                }
            })
            .collect();
        items.push((
            Merged::Call(Call {
                tick: u64::MAX,
                tid: 42,
                func: Func::Malloc,
                addr: u64::MAX,
                old_addr: 1,
                size: u64::MAX,
                usable: 0,
                align: u64::MAX,
                stack: u32::MAX,
                release_value: 0,
                release_ticks_back: NO_RELEASE,
                old_taken: false,
            }),
            u64::MAX,
        ));
        let mut file = SpillFile::default();
        let mut spill = ThreadSpill::default();
        for it in &items {
            spill.push(&mut file, it);
        }
        assert_eq!(spill.items(), items.len() as u64);
        assert_eq!(file.items_written, 4 * u64::from(SEGMENT_ITEMS));
        let mut back = VecDeque::new();
        while spill.items() > 0 {
            spill.refill(&mut file, 42, &mut back).unwrap();
        }
        assert_eq!(back.into_iter().collect::<Vec<_>>(), items);
        assert!(file.problem().is_none());
    }

    /// With a file that cannot be written, segments stay in memory, still in order, and
    /// the reason is kept.
    #[test]
    fn a_failed_file_keeps_items_in_memory_in_order() {
        let mut file = SpillFile {
            failed: Some("test: no file".into()),
            ..Default::default()
        };
        let items: Vec<_> = (0..3000).map(call).collect();
        let mut spill = ThreadSpill::default();
        let mut back = VecDeque::new();
        for (i, it) in items.iter().enumerate() {
            spill.push(&mut file, it);
            if i == 1500 {
                spill.refill(&mut file, 42, &mut back).unwrap();
            }
        }
        while spill.items() > 0 {
            spill.refill(&mut file, 42, &mut back).unwrap();
        }
        assert_eq!(back.into_iter().collect::<Vec<_>>(), items);
        assert_eq!(file.items_written, 0);
        assert!(file.problem().is_some());
    }
}
