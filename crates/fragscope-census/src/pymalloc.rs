//! CPython's small-object allocator (pymalloc), read from outside the interpreter.
//!
//! pymalloc serves every request of 512 bytes or less from *pools* (one size class
//! each) carved out of *arenas* it maps itself, so malloc never sees those objects. Each
//! pool starts with a header whose layout has not changed from Python 2.7 to 3.14
//! (Objects/obmalloc.c, `struct pool_header`, 64-bit):
//!
//! | offset | field | read as |
//! |---|---|---|
//! | 0 | `ref.count` (a uint in an 8-byte union) | blocks in use |
//! | 8 | `freeblock` | NULL or a block of this pool |
//! | 16, 24 | `nextpool`, `prevpool` | list links (non-NULL in a used pool) |
//! | 32 | `arenaindex` | the arena's slot in `arenas[]`: groups pools by arena |
//! | 36 | `szidx` | size class: blocks of `(szidx + 1) << ALIGNMENT_SHIFT` bytes |
//! | 40 | `nextoffset` | where the next never-used block starts |
//! | 44 | `maxnextoffset` | `POOL_SIZE - size`, always |
//!
//! The arena table itself is a static variable (3.11 and older) or deep inside
//! `_PyRuntime` at an offset that changes with every release, and Debian's interpreter
//! has no symbol table; so the census finds pools by their headers instead: at every
//! pool-aligned address of the anonymous mappings large enough to hold an arena, a header
//! whose fields agree with each other (the size class, `maxnextoffset == POOL_SIZE -
//! size`, `nextoffset` on a block boundary within the pool, `count` at most the blocks
//! carved, `freeblock` on a block of the pool). The pools of one arena must then lie
//! within one arena's span and be no more than an arena holds; anything else refuses the
//! census rather than give wrong figures.

use std::path::Path;

use fragscope_trace::records::{PymallocPool, PymallocPools};

use crate::ghc::CensusError;
use crate::{Pause, ProcessMemory};

/// Bytes of a pool header (48, rounded up to the alignment: 48 on every release).
const POOL_HEADER: u64 = 48;

/// The layout of one CPython release's pymalloc. Its alignment (8 or 16 bytes: size
/// classes of 8 or 16 bytes) is not needed: a header's `maxnextoffset` gives its block
/// size, which is all the census keeps, and some releases changed it in a patch release
/// (3.7.16 aligns to 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pymalloc {
    pub major: u32,
    pub minor: u32,
    pub pool_size: u64,
    pub arena_size: u64,
}

impl Pymalloc {
    /// The layout of CPython `major.minor`: 16 KiB pools in 1 MiB arenas from 3.10 (the
    /// radix tree's USE_LARGE_POOLS), 4 KiB in 256 KiB before. None for releases before
    /// 2.7.
    pub fn of_release(major: u32, minor: u32) -> Option<Self> {
        let (pool_size, arena_size) = match (major, minor) {
            (2, 7) | (3, 0..=9) => (4 << 10, 256 << 10),
            (3, _) => (16 << 10, 1 << 20),
            _ => return None,
        };
        Some(Self {
            major,
            minor,
            pool_size,
            arena_size,
        })
    }

    /// Whether process `pid` runs CPython, and which: `None` for another program,
    /// `Some(Err)` for an interpreter whose pymalloc fragscope cannot read.
    pub fn detect(pid: u32) -> Option<Result<Self, String>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let from_lib = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter_map(|path| Path::new(path).file_name()?.to_str())
            .find_map(|name| name.strip_prefix("libpython").and_then(release_of));
        let exe_name = exe.file_name()?.to_str()?;
        let release = from_lib.or_else(|| exe_name.strip_prefix("python").and_then(release_of));
        let Some((major, minor)) = release else {
            // A CPython whose version its file names do not say (a renamed or custom
            // build): say so rather than guess its layout.
            let looks_like_python = exe_name.starts_with("python")
                || maps.contains("/libpython")
                || maps.contains("/lib/python3");
            return looks_like_python.then(|| {
                Err(format!(
                    "no pymalloc census: cannot tell which CPython release {} is",
                    exe.display()
                ))
            });
        };
        Some(Self::of_release(major, minor).ok_or_else(|| {
            format!("no pymalloc census: CPython {major}.{minor} is not a release fragscope reads")
        }))
    }

    /// The pool whose header is `h` at `address`, when its fields agree with each other.
    fn pool(&self, address: u64, h: &[u8]) -> Option<PymallocPool> {
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        let (count, freeblock, next, prev) = (u32_at(0), u64_at(8), u64_at(16), u64_at(24));
        let (arena, szidx, nextoffset, maxnextoffset) =
            (u32_at(32), u32_at(36), u32_at(40), u32_at(44));
        // Blocks of (szidx + 1) times the alignment, up to 512 bytes.
        let size = self.pool_size.checked_sub(u64::from(maxnextoffset))?;
        let class = u64::from(szidx) + 1;
        if !(size == class * 8 || size == class * 16) || size > 512 {
            return None;
        }
        let capacity = (self.pool_size - POOL_HEADER) / size;
        let nextoffset = u64::from(nextoffset);
        let carved = nextoffset.checked_sub(POOL_HEADER)? / size;
        let fits = (nextoffset - POOL_HEADER).is_multiple_of(size)
            && carved >= 1
            && carved <= capacity
            && u64::from(count) <= carved
            && (freeblock == 0
                || (freeblock >= address + POOL_HEADER
                    && freeblock < address + self.pool_size
                    && (freeblock - address - POOL_HEADER).is_multiple_of(size)))
            && next.is_multiple_of(8)
            && prev.is_multiple_of(8)
            && (count == 0 || (next != 0 && prev != 0))
            && arena < 1 << 24;
        fits.then_some(PymallocPool {
            address,
            arena,
            block_size: size as u32,
            blocks_in_use: count,
            blocks_carved: carved as u32,
        })
    }
}

/// "3.11.so.1.0" or "3.11" -> (3, 11).
fn release_of(rest: &str) -> Option<(u32, u32)> {
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The anonymous private writable mappings of `pid` that could hold an arena.
fn arena_candidates(pid: u32, arena_size: u64) -> Result<Vec<(u64, u64)>, CensusError> {
    let maps = crate::maps::read(pid)
        .map_err(|e| CensusError::Unreadable(format!("cannot read /proc/{pid}/maps: {e}")))?;
    let mut ranges = Vec::new();
    for m in crate::maps::parse(&maps) {
        let anonymous =
            m.path.is_empty() || (m.path.starts_with("[anon:") && m.path != "[anon:fragscope]");
        if m.perms == "rw-p" && m.inode == "0" && anonymous && m.hi - m.lo >= arena_size {
            ranges.push((m.lo, m.hi));
        }
    }
    Ok(ranges)
}

/// Candidate headers read per batch: 48 bytes each, so a few MiB of buffer at most.
const HEADERS_PER_BATCH: usize = 64 * 1024;

/// Takes a census of the pymalloc pools of process `pid`, held stopped meanwhile.
pub fn census(pid: u32, layout: &Pymalloc) -> Result<PymallocPools, CensusError> {
    let mut mem = ProcessMemory::open(pid)?;
    let pause = Pause::stop(pid).map_err(CensusError::Unreadable)?;
    let mut pools = Vec::new();
    let mut candidates = Vec::with_capacity(HEADERS_PER_BATCH);
    let mut headers = Vec::new();
    let pool_size = layout.pool_size;
    for (lo, hi) in arena_candidates(pid, layout.arena_size)? {
        let mut at = lo.next_multiple_of(pool_size);
        while at + pool_size <= hi {
            candidates.push((at, POOL_HEADER as usize));
            at += pool_size;
            if candidates.len() == HEADERS_PER_BATCH || at + pool_size > hi {
                mem.read_ranges(&candidates, &mut headers)?;
                for (i, &(address, _)) in candidates.iter().enumerate() {
                    let h = &headers[i * POOL_HEADER as usize..][..POOL_HEADER as usize];
                    pools.extend(layout.pool(address, h));
                }
                candidates.clear();
            }
        }
    }
    let pause_us = pause.held().as_micros() as u64;
    drop(pause);
    check_arenas(layout, &mut pools)?;
    Ok(PymallocPools {
        python: format!("{}.{}", layout.major, layout.minor),
        pool_size: pool_size as u32,
        arena_size: layout.arena_size as u32,
        pool_header: POOL_HEADER as u32,
        pools,
        pause_us,
    })
}

/// The pools of each arena must lie within one arena's span, no more of them than an
/// arena holds. Sorts `pools` by address.
fn check_arenas(layout: &Pymalloc, pools: &mut [PymallocPool]) -> Result<(), CensusError> {
    pools.sort_unstable_by_key(|p| (p.arena, p.address));
    for arena in pools.chunk_by(|a, b| a.arena == b.arena) {
        let span = arena.last().unwrap().address + layout.pool_size - arena[0].address;
        if span > layout.arena_size || arena.len() as u64 > layout.arena_size / layout.pool_size {
            return Err(CensusError::Inconsistent(format!(
                "{} pools over {} KiB claim arena {}, more than one arena of {} KiB holds",
                arena.len(),
                span >> 10,
                arena[0].arena,
                layout.arena_size >> 10
            )));
        }
    }
    pools.sort_unstable_by_key(|p| p.address);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(
        count: u32,
        freeblock: u64,
        arena: u32,
        szidx: u32,
        nextoffset: u32,
        max: u32,
    ) -> Vec<u8> {
        let mut h = vec![0u8; 48];
        h[0..4].copy_from_slice(&count.to_le_bytes());
        h[8..16].copy_from_slice(&freeblock.to_le_bytes());
        h[16..24].copy_from_slice(&0x5555_0000_1000u64.to_le_bytes());
        h[24..32].copy_from_slice(&0x5555_0000_1000u64.to_le_bytes());
        h[32..36].copy_from_slice(&arena.to_le_bytes());
        h[36..40].copy_from_slice(&szidx.to_le_bytes());
        h[40..44].copy_from_slice(&nextoffset.to_le_bytes());
        h[44..48].copy_from_slice(&max.to_le_bytes());
        h
    }

    #[test]
    fn releases_map_to_their_pool_layouts() {
        assert_eq!(release_of("3.11.so.1.0"), Some((3, 11)));
        assert_eq!(release_of("3.13"), Some((3, 13)));
        assert_eq!(release_of("3"), None);
        let new = Pymalloc::of_release(3, 12).unwrap();
        assert_eq!((new.pool_size, new.arena_size), (16384, 1 << 20));
        let old = Pymalloc::of_release(3, 9).unwrap();
        assert_eq!((old.pool_size, old.arena_size), (4096, 256 << 10));
        assert!(Pymalloc::of_release(1, 5).is_none());
    }

    #[test]
    fn a_header_whose_fields_agree_is_a_pool_and_others_are_not() {
        let layout = Pymalloc::of_release(3, 11).unwrap();
        let at = 0x7f00_0000_4000u64;
        // 32-byte blocks (szidx 1), 100 carved, 60 in use, a free block at the 70th.
        let good = header(60, at + 48 + 70 * 32, 3, 1, 48 + 100 * 32, 16384 - 32);
        let pool = layout.pool(at, &good).unwrap();
        assert_eq!(
            (
                pool.arena,
                pool.block_size,
                pool.blocks_in_use,
                pool.blocks_carved
            ),
            (3, 32, 60, 100)
        );
        // maxnextoffset of another pool size, a free block off the block grid, more in
        // use than carved, an all-zero page.
        assert!(layout
            .pool(at, &header(60, 0, 3, 1, 48 + 100 * 32, 4096 - 32))
            .is_none());
        assert!(layout
            .pool(at, &header(60, at + 50, 3, 1, 48 + 100 * 32, 16384 - 32))
            .is_none());
        assert!(layout
            .pool(at, &header(101, 0, 3, 1, 48 + 100 * 32, 16384 - 32))
            .is_none());
        assert!(layout.pool(at, &[0u8; 48]).is_none());
        // 8-byte classes (older releases): szidx 4 is 40-byte blocks.
        let eight = header(2, 0, 3, 4, 48 + 10 * 40, 16384 - 40);
        assert_eq!(layout.pool(at, &eight).unwrap().block_size, 40);
        // An empty pool keeps its last class and may end its free list.
        let mut empty = header(0, at + 48, 3, 1, 48 + 100 * 32, 16384 - 32);
        empty[16..24].fill(0);
        assert_eq!(layout.pool(at, &empty).unwrap().blocks_in_use, 0);
    }

    #[test]
    fn pools_of_one_arena_spread_over_more_than_an_arena_are_refused() {
        let layout = Pymalloc::of_release(3, 11).unwrap();
        let pool = |address, arena| PymallocPool {
            address,
            arena,
            block_size: 32,
            blocks_in_use: 1,
            blocks_carved: 2,
        };
        let mut fine = vec![
            pool(0x10_0000 + 0xF_C000, 1),
            pool(0x10_0000, 1),
            pool(0x40_0000, 2),
        ];
        check_arenas(&layout, &mut fine).unwrap();
        assert_eq!(fine[0].address, 0x10_0000);
        let mut spread = vec![pool(0x10_0000, 1), pool(0x30_0000, 1)];
        assert!(matches!(
            check_arenas(&layout, &mut spread),
            Err(CensusError::Inconsistent(_))
        ));
    }
}
