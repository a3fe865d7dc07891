//! What the merge orders and hands on: a thread's malloc-family calls, and the rare
//! other items of its buffers that keep their place among them. Kept out of `merge`
//! because the buffers' decoder and the spill to disk, which the merge uses, make and
//! read them too.

use crate::format::event::{Func, StatsSource};
use crate::format::hash::FastMap;

/// A malloc-family call in merged order. Addresses are 0 for NULL; `stack` is an index
/// into [`Merger::stack`](crate::order::merge::Merger::stack) (0: none recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub tick: u64,
    pub tid: u32,
    pub func: Func,
    pub addr: u64,
    pub old_addr: u64,
    pub size: u64,
    /// Usable size when the allocator told us; otherwise 0.
    pub usable: u64,
    pub align: u64,
    pub stack: u32,
    /// A realloc that gave its old block back before its own place (its reading of the
    /// order counter after the call): the counter value it took before the call, in the
    /// tick `release_ticks_back` before its own ([`Call::release_when`]).
    pub release_value: u32,
    /// [`NO_RELEASE`] when no release is known (a call other than a realloc, a realloc
    /// that kept its block, a trace older than releases).
    pub release_ticks_back: u8,
    /// A realloc whose old block an allocation of another thread took between the release
    /// and the realloc's own place: the realloc releases nothing when it is merged.
    pub old_taken: bool,
}

impl Call {
    /// A call of `func` on `addr` with no size, alignment or stack (a free, or a start
    /// to fill in).
    pub fn on(tick: u64, tid: u32, func: Func, addr: u64) -> Self {
        Self {
            tick,
            tid,
            func,
            addr,
            old_addr: 0,
            size: 0,
            usable: 0,
            align: 0,
            stack: 0,
            release_value: 0,
            release_ticks_back: NO_RELEASE,
            old_taken: false,
        }
    }

    /// The address this call makes live, if any.
    pub fn allocates(&self) -> Option<u64> {
        (self.func != Func::Free && self.addr != 0).then_some(self.addr)
    }
    /// The address this call ends, if any (a realloc that moved or freed its block, unless
    /// its old block was taken from it: [`Call::old_taken`]).
    pub fn releases(&self) -> Option<u64> {
        match self.func {
            Func::Free => (self.addr != 0).then_some(self.addr),
            Func::Realloc | Func::Reallocarray => {
                // realloc(p, 0) may free p and return NULL; a failed realloc keeps p.
                let freed = self.addr != 0 || self.size == 0;
                (self.old_addr != 0 && freed && !self.old_taken).then_some(self.old_addr)
            }
            _ => None,
        }
    }

    /// The (tick, place) at which a realloc gave its old block back, when known: a place
    /// as a free's, taken before the call.
    pub fn release_when(&self) -> Option<(u64, u64)> {
        (self.release_ticks_back != NO_RELEASE).then(|| {
            let tick = self.tick.saturating_sub(self.release_ticks_back.into());
            (tick, u64::from(self.release_value) * 2 + 1)
        })
    }

    /// Sets the release of a realloc at `tick` to (`release_tick`, `place`), if it fits:
    /// a counter value (half the place) fits 32 bits, as the interposer keeps it, and a
    /// release more than 254 ticks before the call's end is left unknown.
    pub fn set_release(&mut self, (release_tick, place): (u64, u64)) {
        let back = self
            .tick
            .checked_sub(release_tick)
            .and_then(|b| u8::try_from(b).ok());
        if let (Some(back), Ok(value)) =
            (back.filter(|&b| b != NO_RELEASE), u32::try_from(place / 2))
        {
            self.release_ticks_back = back;
            self.release_value = value;
        }
    }
}

/// [`Call::release_ticks_back`] of a call with no release known.
pub const NO_RELEASE: u8 = u8::MAX;

/// Something the merge hands on, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Merged {
    Call(Call),
    /// The allocator's own statistics, answered at this tick.
    Stats {
        tick: u64,
        source: StatsSource,
        values: Vec<(String, u64)>,
    },
    /// The thread forked a child here; the child names `mark` (see [`Merger::heap_at_fork`](crate::order::merge::Merger::heap_at_fork)).
    Forked {
        tick: u64,
        mark: u32,
    },
    /// What an aggregated recording says here in place of the calls it left out.
    Summary {
        tick: u64,
        summary: Summary,
    },
}

impl Merged {
    /// The tick it happened at.
    pub fn tick(&self) -> u64 {
        match self {
            Merged::Call(c) => c.tick,
            Merged::Stats { tick, .. }
            | Merged::Forked { tick, .. }
            | Merged::Summary { tick, .. } => *tick,
        }
    }
}

/// An aggregated recording's account of the calls it left out (see
/// [`crate::order::aggregate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// `allocations` blocks of `stack` (a process-wide stack index, 0: none) and `size`
    /// bytes, allocated and freed between two snapshots; `temporaries` of the stack's
    /// blocks of that size (these or others) were temporary.
    Summed {
        stack: u32,
        size: u64,
        allocations: u64,
        temporaries: u64,
    },
    /// Live and usable bytes as every call had them here, the most live bytes since the
    /// last such summary (at tick `peak_tick`), and the calls made since it.
    Live {
        live: u64,
        usable: u64,
        peak: u64,
        peak_tick: u64,
        calls: u64,
    },
}

/// Each thread's last allocated address, to tell temporary allocations (freed by their
/// thread before it allocates again, as heaptrack counts them). The entry of the thread
/// of the last call is held out of the map: runs of calls are mostly one thread's, and a
/// lookup and an insert per call cost more than a reader's other work per call.
#[derive(Default)]
pub struct LastAllocs {
    current: Option<(u32, Option<u64>)>,
    others: FastMap<u32, u64>,
}

impl LastAllocs {
    /// Whether `c` frees the block its thread allocated last; follows the thread's
    /// allocations (frees of other blocks in between do not matter).
    #[inline]
    pub fn frees_last(&mut self, c: &Call) -> bool {
        let last = self.of(c.tid);
        let temporary = c.func == Func::Free && c.addr != 0 && *last == Some(c.addr);
        if let Some(a) = c.allocates() {
            *last = Some(a);
        } else if temporary {
            *last = None;
        }
        temporary
    }

    /// Thread `tid`'s entry.
    #[inline]
    fn of(&mut self, tid: u32) -> &mut Option<u64> {
        if self.current.is_none_or(|(t, _)| t != tid) {
            if let Some((t, Some(addr))) = self.current {
                self.others.insert(t, addr);
            }
            self.current = Some((tid, self.others.remove(&tid)));
        }
        let (_, entry) = self.current.get_or_insert((tid, None));
        entry
    }
}

/// A thread buffer's calls as they wait between the decoder and the merge, 32 bytes
/// each instead of a [`Call`]'s 64: the read-ahead keeps a few buffers of tens of
/// thousands of calls in flight (16 MiB of a redis-server recording's report, a
/// ninth of its peak). Most calls need only their address, size, usable size, stack and
/// tick; the others (a realloc's old block, an alignment, a tick before the array's
/// first, another thread's call, a rounding past 32 bits) are kept whole beside.
#[derive(Debug, Default)]
pub struct CallArray {
    compact: Vec<CompactCall>,
    whole: Vec<Call>,
    /// The thread and tick of the first call, which the compact calls share and count
    /// from.
    tid: u32,
    first_tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct CompactCall {
    /// The address; for a call kept whole, its index in `whole`.
    addr: u64,
    size: u64,
    ticks_after_first: u32,
    /// The usable size less the requested size; [`CompactCall::NO_USABLE`] when the
    /// usable size is not known (0).
    rounding: u32,
    stack: u32,
    func: Func,
    kept_whole: bool,
}

impl CompactCall {
    const NO_USABLE: u32 = u32::MAX;
}

impl CallArray {
    pub fn len(&self) -> usize {
        self.compact.len()
    }

    pub fn is_empty(&self) -> bool {
        self.compact.is_empty()
    }

    pub fn clear(&mut self) {
        self.compact.clear();
        self.whole.clear();
    }

    #[inline(always)]
    pub fn push(&mut self, c: Call) {
        if self.compact.is_empty() {
            self.tid = c.tid;
            self.first_tick = c.tick;
        }
        let rounding = match c.usable {
            0 => Some(CompactCall::NO_USABLE),
            u => u
                .checked_sub(c.size)
                .and_then(|r| u32::try_from(r).ok())
                .filter(|&r| r != CompactCall::NO_USABLE),
        };
        let ticks_after_first = c
            .tick
            .checked_sub(self.first_tick)
            .and_then(|t| u32::try_from(t).ok());
        let plain = c.old_addr == 0
            && c.align == 0
            && c.release_value == 0
            && c.release_ticks_back == NO_RELEASE
            && !c.old_taken
            && c.tid == self.tid;
        let compact = match (rounding, ticks_after_first) {
            (Some(rounding), Some(ticks_after_first)) if plain => CompactCall {
                addr: c.addr,
                size: c.size,
                ticks_after_first,
                rounding,
                stack: c.stack,
                func: c.func,
                kept_whole: false,
            },
            _ => {
                self.whole.push(c);
                CompactCall {
                    addr: self.whole.len() as u64 - 1,
                    size: 0,
                    ticks_after_first: 0,
                    rounding: 0,
                    stack: 0,
                    func: c.func,
                    kept_whole: true,
                }
            }
        };
        self.compact.push(compact);
    }

    /// The call at `i`, as it was pushed.
    #[inline(always)]
    pub fn get(&self, i: usize) -> Option<Call> {
        let c = *self.compact.get(i)?;
        if c.kept_whole {
            return self.whole.get(c.addr as usize).copied();
        }
        Some(Call {
            tick: self.first_tick + u64::from(c.ticks_after_first),
            tid: self.tid,
            func: c.func,
            addr: c.addr,
            old_addr: 0,
            size: c.size,
            usable: match c.rounding {
                CompactCall::NO_USABLE => 0,
                r => c.size + u64::from(r),
            },
            align: 0,
            stack: c.stack,
            release_value: 0,
            release_ticks_back: NO_RELEASE,
            old_taken: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call comes back as it was pushed, kept compact or whole, across a clear.
    #[test]
    fn a_call_array_gives_back_each_call_as_pushed() {
        assert_eq!(std::mem::size_of::<CompactCall>(), 32);
        let base = Call {
            size: 40,
            usable: 48,
            stack: 7,
            ..Call::on(1000, 12, Func::Malloc, 0x7f00_0000_1000)
        };
        let mut realloc = Call {
            func: Func::Realloc,
            old_addr: 0x7f00_0000_2000,
            ..base
        };
        realloc.set_release((998, 41));
        let calls = [
            base,
            Call::on(1000, 12, Func::Free, 0x7f00_0000_1000),
            Call { usable: 0, ..base },
            Call { usable: 39, ..base },
            Call {
                usable: 40 + u64::from(u32::MAX) - 1,
                ..base
            },
            Call {
                usable: 40 + u64::from(u32::MAX),
                ..base
            },
            Call {
                usable: u64::MAX,
                size: u64::MAX - 8,
                ..base
            },
            Call { tick: 999, ..base },
            Call {
                tick: 1000 + u64::from(u32::MAX),
                ..base
            },
            Call {
                tick: 1001 + u64::from(u32::MAX),
                ..base
            },
            Call { tid: 13, ..base },
            Call {
                align: 64,
                func: Func::PosixMemalign,
                ..base
            },
            realloc,
            Call {
                old_taken: true,
                ..realloc
            },
            Call {
                stack: u32::MAX,
                ..base
            },
            base,
        ];
        let mut a = CallArray::default();
        for round in 0..2 {
            a.clear();
            assert!(a.is_empty() && a.get(0).is_none());
            for &c in &calls[round..] {
                a.push(c);
            }
            assert_eq!(a.len(), calls.len() - round);
            for (i, c) in calls[round..].iter().enumerate() {
                assert_eq!(a.get(i), Some(*c), "call {i} of round {round}");
            }
            assert_eq!(a.get(a.len()), None);
            assert!(a.whole.len() >= 8, "kept whole: {}", a.whole.len());
        }
    }
}
