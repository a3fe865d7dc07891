//! CPython's pymalloc at a snapshot: the pools a census found (fragscope-census reads
//! their headers), set against the page residency read at the same moment. pymalloc maps
//! its arenas itself, so their pages are anonymous memory that no malloc'd block ever
//! lived in; this splits them into the bytes of blocks in use, free space inside pools in
//! use, empty pools kept by arenas that still hold a pool in use, and arenas with no pool
//! in use at all.

use std::collections::{BTreeMap, HashMap};

use fragscope_trace::records::{Pagemap, PymallocPools};

use crate::heap::Residency;
use crate::sharing::{Owner, Owners};
use serde::Serialize;

/// Pools or arenas whose bytes in use are [lo_pct, hi_pct) of what they can hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FillBucket {
    pub lo_pct: u32,
    pub hi_pct: u32,
    pub count: u64,
    pub bytes_in_use: u64,
}

/// One size class of pymalloc (blocks of `block_size` bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PymallocClass {
    pub block_size: u64,
    pub pools: u64,
    pub blocks_in_use: u64,
    /// Blocks of the class's pools not in use (freed, or never handed out).
    pub blocks_free: u64,
}

/// The split of pymalloc's resident bytes at one snapshot. `in_use + free_in_used_pools
/// + free_pools + empty_arenas == resident`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PymallocParts {
    /// The interpreter, as "3.11".
    pub python: String,
    pub pool_size: u64,
    pub arena_size: u64,
    pub arenas: u64,
    /// Arenas holding at least one pool in use: the rest could be returned.
    pub arenas_in_use: u64,
    pub pools: u64,
    pub pools_in_use: u64,
    /// Resident bytes of every pool found.
    pub resident: u64,
    /// Blocks in use times their block size: the objects, with their rounding up to a
    /// multiple of the alignment (unknown apart without per-object sizes).
    pub in_use: u64,
    /// Resident bytes of pools in use that no block in use holds: freed blocks, blocks
    /// never handed out, and the pool headers.
    pub free_in_used_pools: u64,
    /// Resident bytes of empty pools in arenas that still hold a pool in use: kept
    /// because pymalloc returns only whole arenas.
    pub free_pools: u64,
    /// Resident bytes of arenas with no pool in use.
    pub empty_arenas: u64,
    /// Pools in use by bytes in use / bytes they can hold: 0-10%, ..., 90-100%.
    pub pool_fill: Vec<FillBucket>,
    /// Arenas by bytes in use / arena size, the same buckets.
    pub arena_fill: Vec<FillBucket>,
    /// Size classes with a pool, largest free bytes first.
    pub classes: Vec<PymallocClass>,
    /// How long the census stopped the program, in milliseconds.
    pub pause_ms: f64,
}

impl PymallocParts {
    /// Resident bytes pymalloc holds beyond its blocks in use.
    pub fn waste(&self) -> u64 {
        self.free_in_used_pools + self.free_pools + self.empty_arenas
    }
}

/// pymalloc's waste worth a headline: at least 4 MiB and a quarter of what it holds.
fn worth_a_headline(p: &PymallocParts) -> bool {
    p.waste() >= 4 << 20 && p.waste() * 4 >= p.resident
}

/// What the snapshot with the most pymalloc waste says, when that waste is worth a
/// headline: the part that dominates it and a sentence with what helps.
pub fn headline(p: &PymallocParts) -> Option<(&'static str, String)> {
    if !worth_a_headline(p) {
        return None;
    }
    let used_pct = 100 * p.in_use / p.resident.max(1);
    let held = format!(
        "{} in {} pymalloc arenas (CPython {}) hold {} of objects ({used_pct}%)",
        crate::mib(p.resident),
        p.arenas,
        p.python,
        crate::mib(p.in_use)
    );
    let keep_apart = "objects that outlive the others allocated beside them keep their \
        pools and arenas. Build what you keep apart from what you throw away (first, or in \
        a subprocess whose memory goes back when it exits), or hold many small records in \
        fewer objects (array, numpy, tuples of columns, __slots__ classes).";
    let parts = [
        ("pymalloc_free_in_used_pools", p.free_in_used_pools),
        ("pymalloc_free_pools", p.free_pools),
        ("pymalloc_empty_arenas", p.empty_arenas),
    ];
    let (dominant, _) = parts.into_iter().max_by_key(|x| x.1)?;
    let sentence = match dominant {
        "pymalloc_free_in_used_pools" => format!(
            "{held}: {} is free space inside pools that still hold a live object ({} \
             pools in use, most {}). pymalloc gives a pool back only when its last object \
             is freed, and an arena only when all its pools are: {keep_apart}",
            crate::mib(p.free_in_used_pools),
            p.pools_in_use,
            fill_words(&p.pool_fill),
        ),
        "pymalloc_free_pools" => format!(
            "{held}: {} is empty pools inside arenas that still hold a pool in use ({} \
             of {} arenas). pymalloc returns only whole arenas: {keep_apart}",
            crate::mib(p.free_pools),
            p.arenas_in_use,
            p.arenas
        ),
        _ => format!(
            "{held}: {} is arenas with no pool in use that were not returned yet.",
            crate::mib(p.empty_arenas)
        ),
    };
    Some((dominant, sentence))
}

/// "less than 10% full": the fill bucket with the most pools.
pub(crate) fn fill_words(buckets: &[FillBucket]) -> String {
    match buckets.iter().max_by_key(|b| b.count) {
        Some(b) if b.lo_pct == 0 => format!("less than {}% full", b.hi_pct),
        Some(b) => format!("{}-{}% full", b.lo_pct, b.hi_pct),
        None => "of unknown fill".into(),
    }
}

pub(crate) fn fill_buckets() -> Vec<FillBucket> {
    (0..10)
        .map(|b| FillBucket {
            lo_pct: b * 10,
            hi_pct: b * 10 + 10,
            count: 0,
            bytes_in_use: 0,
        })
        .collect()
}

pub(crate) fn add_to(buckets: &mut [FillBucket], in_use: u64, capacity: u64) {
    let b = ((in_use * 10 / capacity.max(1)) as usize).min(9);
    buckets[b].count += 1;
    buckets[b].bytes_in_use += in_use;
}

/// One arena's figures in a census.
#[derive(Default, Debug, Clone, Copy)]
pub struct ArenaAcc {
    pub pools_in_use: u64,
    /// Bytes of blocks in use.
    pub in_use: u64,
    /// Resident bytes of its pools with no block in use.
    pub empty_resident: u64,
    /// Resident bytes of its pools in use beyond their blocks in use.
    pub free_in_used_pools: u64,
    /// A forked process: resident bytes of its pools it shared with its parent at the
    /// fork and has copied since (`sharing::Owner::Copied`).
    pub copied: u64,
}

impl ArenaAcc {
    /// What the arena's blocks in use keep resident beyond themselves: its free space,
    /// which pymalloc gives back only once the arena is empty.
    pub fn held(&self) -> u64 {
        if self.pools_in_use == 0 {
            0
        } else {
            self.free_in_used_pools + self.empty_resident
        }
    }
}

/// A census split by its residency (see [`split`]).
pub struct Split {
    pub parts: PymallocParts,
    /// Resident pool bytes, by owner, by the start of the pagemap range that holds them,
    /// for the heap's own count to leave out.
    pub by_range: HashMap<u64, Owners>,
    /// Each arena's figures, by the census's arena number.
    pub arenas: BTreeMap<u32, ArenaAcc>,
}

/// Splits a census's pools by the residency `pm` read with it.
pub fn split(pools: &PymallocPools, pm: &Pagemap, fork: Option<&Pagemap>) -> Split {
    let pool_size = u64::from(pools.pool_size);
    let header = u64::from(pools.pool_header);
    let mut residency = Residency::new(pm).with_fork(fork);
    let page_size = u64::from(pm.page_size.max(1));
    let mut parts = PymallocParts {
        python: pools.python.clone(),
        pool_size,
        arena_size: u64::from(pools.arena_size),
        arenas: 0,
        arenas_in_use: 0,
        pools: pools.pools.len() as u64,
        pools_in_use: 0,
        resident: 0,
        in_use: 0,
        free_in_used_pools: 0,
        free_pools: 0,
        empty_arenas: 0,
        pool_fill: fill_buckets(),
        arena_fill: fill_buckets(),
        classes: Vec::new(),
        pause_ms: pools.pause_us as f64 / 1000.0,
    };
    let mut by_range: HashMap<u64, Owners> = HashMap::new();
    let mut arenas: BTreeMap<u32, ArenaAcc> = BTreeMap::new();
    let mut classes: HashMap<u32, PymallocClass> = HashMap::new();
    for p in &pools.pools {
        let (mut bytes, mut copied) = (0, 0);
        for page in p.address / page_size..(p.address + pool_size).div_ceil(page_size) {
            if let Some(range) = residency.is_resident(page) {
                bytes += page_size;
                let owner = residency.owner(range, page);
                (by_range.entry(residency.range_start(range)).or_default()).add(owner, page_size);
                if owner == Owner::Copied {
                    copied += page_size;
                }
            }
        }
        parts.resident += bytes;
        let arena = arenas.entry(p.arena).or_default();
        arena.copied += copied;
        let block = u64::from(p.block_size);
        if p.blocks_in_use == 0 {
            arena.empty_resident += bytes;
            continue;
        }
        let in_use = (u64::from(p.blocks_in_use) * block).min(bytes);
        parts.pools_in_use += 1;
        parts.in_use += in_use;
        parts.free_in_used_pools += bytes - in_use;
        arena.free_in_used_pools += bytes - in_use;
        add_to(&mut parts.pool_fill, in_use, pool_size - header);
        arena.pools_in_use += 1;
        arena.in_use += in_use;
        let class = classes.entry(p.block_size).or_insert(PymallocClass {
            block_size: block,
            pools: 0,
            blocks_in_use: 0,
            blocks_free: 0,
        });
        class.pools += 1;
        class.blocks_in_use += u64::from(p.blocks_in_use);
        class.blocks_free += (pool_size - header) / block.max(1) - u64::from(p.blocks_in_use);
    }
    parts.arenas = arenas.len() as u64;
    for a in arenas.values() {
        if a.pools_in_use > 0 {
            parts.arenas_in_use += 1;
            parts.free_pools += a.empty_resident;
        } else {
            parts.empty_arenas += a.empty_resident;
        }
        add_to(&mut parts.arena_fill, a.in_use, parts.arena_size);
    }
    parts.classes = classes.into_values().collect();
    parts.classes.sort_by_key(|c| {
        (
            std::cmp::Reverse(c.blocks_free * c.block_size),
            c.block_size,
        )
    });
    Split {
        parts,
        by_range,
        arenas,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::records::{PymallocPool, ResidentRange, SnapshotReason};

    fn pool(address: u64, arena: u32, block_size: u32, blocks_in_use: u32) -> PymallocPool {
        PymallocPool {
            address,
            arena,
            block_size,
            blocks_in_use,
            blocks_carved: blocks_in_use.max(1),
        }
    }

    #[test]
    fn pools_split_into_blocks_in_use_free_space_free_pools_and_empty_arenas() {
        let base = 0x7f00_0000_0000u64;
        let pools = PymallocPools {
            python: "3.11".into(),
            pool_size: 16384,
            arena_size: 1 << 20,
            pool_header: 48,
            pools: vec![
                // Arena 0: one pool with 10 blocks of 64 bytes, one empty pool.
                pool(base, 0, 64, 10),
                pool(base + 16384, 0, 64, 0),
                // Arena 1: only an empty pool.
                pool(base + (1 << 20), 1, 32, 0),
            ],
            pause_us: 1500,
        };
        // Every page of the first 2 MiB resident but the empty pool of arena 0's last
        // page.
        let pages = 512u64;
        let mut resident = vec![0xffu8; (pages / 8) as usize];
        resident[0] &= 0xff; // pages 0-3: pool 0
        resident[0] &= !(1 << 7); // page 7: the last page of arena 0's empty pool
        let pm = Pagemap {
            stream: 0,
            tick: 5,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start: base,
                pages,
                resident,
                ..Default::default()
            }],
        };
        let Split {
            parts: p, by_range, ..
        } = split(&pools, &pm, None);
        assert_eq!(p.resident, 16384 + 12288 + 16384);
        assert_eq!(p.in_use, 640);
        assert_eq!(p.free_in_used_pools, 16384 - 640);
        assert_eq!(p.free_pools, 12288);
        assert_eq!(p.empty_arenas, 16384);
        assert_eq!(
            p.in_use + p.free_in_used_pools + p.free_pools + p.empty_arenas,
            p.resident
        );
        assert_eq!((p.arenas, p.arenas_in_use, p.pools_in_use), (3 - 1, 1, 1));
        assert_eq!(p.pool_fill[0].count, 1);
        assert_eq!(p.classes[0].block_size, 64);
        assert_eq!(p.classes[0].blocks_free, (16384 - 48) / 64 - 10);
        assert_eq!(by_range[&base].resident, p.resident);
        assert_eq!(p.pause_ms, 1.5);
    }
}
