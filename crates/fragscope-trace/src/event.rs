//! Event records: what the interposer writes into a thread's buffer, and their decoder.
//!
//! ```text
//! record  := tag:u8 body
//! tag     := kind (low 4 bits) | flags (high 4 bits)
//! flags   := 0x10 STACK      a stack id follows the body
//!            0x20 UNALIGNED  the address delta is in bytes (else in 16-byte units)
//!            0x40 NULL       no address (NULL returned, or free(NULL))
//!            0x80 USABLE     usable-minus-requested size follows
//! kind 0..8  allocation:  [realloc_flags:u8 (kinds 2,3)] [old delta (kinds 2,3)]
//!                         [addr delta] size:varint [align:varint (kinds 4..8)]
//!                         [usable-size:varint] [stack:varint]
//! kind 9     free:        [addr delta]
//! kind 10    tick:        delta:varint       (ms since the previous tick record)
//! kind 11    stack:       id:varint depth:varint frame-delta:svarint*depth
//! kind 12    usable:      size:varint usable:varint (for malloc/calloc of `size`)
//! kind 13    stats:       source:u8 count:u8 (name_len:u8 name value:varint)*count
//! kind 14    lost:        count:varint (events a signal handler could not queue)
//! kind 15    own memory:  bytes:varint (the interposer's own mapped bytes, process-wide)
//! addr delta := svarint of (address - previous address in this chunk), the previous
//!               address being 0 at a chunk's start; in 16-byte units unless UNALIGNED.
//! ```
//! The kinds 0..9 are the hooks listed in crates/fragscope-record/preload/hooks.h.

use crate::wire::Reader;
use crate::TraceError;

/// A malloc-family function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    Malloc = 0,
    Calloc = 1,
    Realloc = 2,
    Reallocarray = 3,
    PosixMemalign = 4,
    AlignedAlloc = 5,
    Memalign = 6,
    Valloc = 7,
    Pvalloc = 8,
    Free = 9,
}

impl Func {
    pub const ALL: [Func; 10] = [
        Func::Malloc,
        Func::Calloc,
        Func::Realloc,
        Func::Reallocarray,
        Func::PosixMemalign,
        Func::AlignedAlloc,
        Func::Memalign,
        Func::Valloc,
        Func::Pvalloc,
        Func::Free,
    ];
    pub fn from_kind(kind: u8) -> Option<Self> {
        Self::ALL.get(kind as usize).copied()
    }
    pub fn name(self) -> &'static str {
        match self {
            Func::Malloc => "malloc",
            Func::Calloc => "calloc",
            Func::Realloc => "realloc",
            Func::Reallocarray => "reallocarray",
            Func::PosixMemalign => "posix_memalign",
            Func::AlignedAlloc => "aligned_alloc",
            Func::Memalign => "memalign",
            Func::Valloc => "valloc",
            Func::Pvalloc => "pvalloc",
            Func::Free => "free",
        }
    }
    fn takes_old_block(self) -> bool {
        matches!(self, Func::Realloc | Func::Reallocarray)
    }
    fn takes_alignment(self) -> bool {
        matches!(
            self,
            Func::PosixMemalign
                | Func::AlignedAlloc
                | Func::Memalign
                | Func::Valloc
                | Func::Pvalloc
        )
    }
}

const KIND_TICK: u8 = 10;
const KIND_STACK: u8 = 11;
const KIND_USABLE: u8 = 12;
const KIND_STATS: u8 = 13;
const KIND_LOST: u8 = 14;
const KIND_OWN_MEMORY: u8 = 15;
const FLAG_STACK: u8 = 0x10;
const FLAG_UNALIGNED: u8 = 0x20;
const FLAG_NULL: u8 = 0x40;
const FLAG_USABLE: u8 = 0x80;
const REALLOC_OLD_NULL: u8 = 1;
const REALLOC_OLD_UNALIGNED: u8 = 2;

/// Sizes below this have their usable size given once per thread by a usable record.
pub const USABLE_TABLE: u64 = 32768;

/// Which allocator answered a stats record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsSource {
    Glibc,
    Jemalloc,
    Tcmalloc,
    Mimalloc,
    Unknown,
}

impl StatsSource {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Glibc,
            2 => Self::Jemalloc,
            3 => Self::Tcmalloc,
            4 => Self::Mimalloc,
            _ => Self::Unknown,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Glibc => "glibc",
            Self::Jemalloc => "jemalloc",
            Self::Tcmalloc => "tcmalloc",
            Self::Mimalloc => "mimalloc",
            Self::Unknown => "unknown",
        }
    }
}

/// One decoded record. Addresses are 0 for NULL.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An allocation-family call. For realloc, `old_addr` is the block passed in.
    Alloc {
        func: Func,
        addr: u64,
        old_addr: u64,
        size: u64,
        align: u64,
        /// The allocator's usable size, when known.
        usable: Option<u64>,
        /// The thread-local stack id, 0 when this allocation was not sampled.
        stack: u32,
    },
    Free {
        addr: u64,
    },
    StackDef {
        id: u32,
        frames: Vec<u64>,
    },
    Stats {
        source: StatsSource,
        values: Vec<(String, u64)>,
    },
    Lost {
        count: u64,
    },
    OwnMemory {
        bytes: u64,
    },
}

/// Decodes one thread's chunk of records. `usable` is the process's table of usable sizes
/// (index: requested size), filled by usable records as they come.
pub struct ChunkDecoder<'a, 't> {
    r: Reader<'a>,
    tick: u64,
    prev_addr: u64,
    usable: &'t mut Vec<u32>,
}

impl<'a, 't> ChunkDecoder<'a, 't> {
    pub fn new(records: &'a [u8], first_tick: u64, usable: &'t mut Vec<u32>) -> Self {
        Self {
            r: Reader::new(records),
            tick: first_tick,
            prev_addr: 0,
            usable,
        }
    }

    /// The tick of the record last returned.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    fn addr(&mut self, unaligned: bool) -> Result<u64, TraceError> {
        let d = self.r.svarint()?;
        let d = if unaligned { d } else { d.wrapping_mul(16) };
        self.prev_addr = self.prev_addr.wrapping_add(d as u64);
        Ok(self.prev_addr)
    }

    /// The next record, skipping tick records (whose time `tick()` then reflects).
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            if self.r.is_empty() {
                return Ok(None);
            }
            let tag = self.r.u8()?;
            let kind = tag & 0x0f;
            match kind {
                0..=9 => return self.call(tag).map(Some),
                KIND_TICK => self.tick = self.tick.saturating_add(self.r.varint()?),
                KIND_STACK => {
                    let id = self.r.varint()? as u32;
                    let depth = self.r.count(1)?;
                    let mut frames = Vec::with_capacity(depth);
                    let mut ip = 0u64;
                    for _ in 0..depth {
                        ip = ip.wrapping_add(self.r.svarint()? as u64);
                        frames.push(ip);
                    }
                    return Ok(Some(Record::StackDef { id, frames }));
                }
                KIND_USABLE => {
                    let size = self.r.varint()?;
                    let usable = self.r.varint()?;
                    if size < USABLE_TABLE {
                        if self.usable.len() < USABLE_TABLE as usize {
                            self.usable.resize(USABLE_TABLE as usize, 0);
                        }
                        self.usable[size as usize] = usable.min(u64::from(u32::MAX)) as u32;
                    }
                }
                KIND_STATS => {
                    let source = StatsSource::from_u8(self.r.u8()?);
                    let n = self.r.u8()?;
                    let mut values = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        let len = self.r.u8()? as usize;
                        let name = String::from_utf8_lossy(self.r.take(len)?).into_owned();
                        values.push((name, self.r.varint()?));
                    }
                    return Ok(Some(Record::Stats { source, values }));
                }
                KIND_LOST => {
                    return Ok(Some(Record::Lost {
                        count: self.r.varint()?,
                    }))
                }
                KIND_OWN_MEMORY => {
                    return Ok(Some(Record::OwnMemory {
                        bytes: self.r.varint()?,
                    }))
                }
                _ => unreachable!("kind is 4 bits"),
            }
        }
    }

    fn call(&mut self, tag: u8) -> Result<Record, TraceError> {
        let func = Func::from_kind(tag & 0x0f).expect("kinds 0..=9 are functions");
        if func == Func::Free {
            let addr = if tag & FLAG_NULL != 0 {
                0
            } else {
                self.addr(tag & FLAG_UNALIGNED != 0)?
            };
            return Ok(Record::Free { addr });
        }
        let mut old_addr = 0;
        if func.takes_old_block() {
            let rflags = self.r.u8()?;
            if rflags & REALLOC_OLD_NULL == 0 {
                old_addr = self.addr(rflags & REALLOC_OLD_UNALIGNED != 0)?;
            }
        }
        let addr = if tag & FLAG_NULL != 0 {
            0
        } else {
            self.addr(tag & FLAG_UNALIGNED != 0)?
        };
        let size = self.r.varint()?;
        let align = if func.takes_alignment() {
            self.r.varint()?
        } else {
            0
        };
        let usable = if tag & FLAG_USABLE != 0 {
            Some(size.saturating_add(self.r.varint()?))
        } else if addr != 0 && size < USABLE_TABLE && matches!(func, Func::Malloc | Func::Calloc) {
            self.usable
                .get(size as usize)
                .copied()
                .filter(|&u| u != 0)
                .map(u64::from)
        } else {
            None
        };
        let stack = if tag & FLAG_STACK != 0 {
            self.r.varint()? as u32
        } else {
            0
        };
        Ok(Record::Alloc {
            func,
            addr,
            old_addr,
            size,
            align,
            usable,
            stack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Writer;

    #[test]
    fn decodes_the_interposer_layout() {
        // malloc(24) at 0x1000 with usable 32 known, tick +3, free(0x1000), free(NULL),
        // realloc(0x1000 -> 0x2008, 100) unaligned, posix_memalign(64, 10) failed.
        let mut w = Writer::new();
        w.u8(KIND_USABLE).varint(24).varint(32);
        w.u8(0).svarint(0x1000 / 16).varint(24);
        w.u8(KIND_TICK).varint(3);
        w.u8(9).svarint(0);
        w.u8(9 | FLAG_NULL);
        w.u8(2 | FLAG_UNALIGNED | FLAG_USABLE | FLAG_STACK)
            .u8(0)
            .svarint(0)
            .svarint(0x1008)
            .varint(100)
            .varint(4)
            .varint(7);
        w.u8(4 | FLAG_NULL).varint(10).varint(64);
        let mut usable = Vec::new();
        let mut d = ChunkDecoder::new(&w.bytes, 100, &mut usable);
        let mut got = Vec::new();
        while let Some(r) = d.next_record().unwrap() {
            got.push((d.tick(), r));
        }
        let alloc = |func, addr, old_addr, size, align, usable, stack| Record::Alloc {
            func,
            addr,
            old_addr,
            size,
            align,
            usable,
            stack,
        };
        assert_eq!(
            got,
            vec![
                (100, alloc(Func::Malloc, 0x1000, 0, 24, 0, Some(32), 0)),
                (103, Record::Free { addr: 0x1000 }),
                (103, Record::Free { addr: 0 }),
                (
                    103,
                    alloc(Func::Realloc, 0x2008, 0x1000, 100, 0, Some(104), 7)
                ),
                (103, alloc(Func::PosixMemalign, 0, 0, 10, 64, None, 0)),
            ]
        );
    }

    #[test]
    fn garbage_gives_errors_not_panics() {
        let mut usable = Vec::new();
        for seed in 0u64..2000 {
            let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
            let bytes: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let mut d = ChunkDecoder::new(&bytes, 0, &mut usable);
            while let Ok(Some(_)) = d.next_record() {}
        }
    }
}
