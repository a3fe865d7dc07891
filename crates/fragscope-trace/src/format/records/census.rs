//! A runtime's heap census taken with a snapshot, framed the same way for each runtime
//! ([`Census`]): the GHC RTS's block groups and CPython's pymalloc pools.

use super::memory::SnapshotReason;
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

/// The kinds of in-use block groups a GHC block census counts, in the order their
/// figures are stored. A reader takes the kinds it knows from the front of a stored list,
/// so kinds may only be appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GhcBlockKind {
    /// The allocation area, where new objects go (the RTS's nursery lists).
    Nursery = 0,
    /// Generation 0 blocks outside the nursery.
    Gen0 = 1,
    /// Blocks of the older generations (copied survivors).
    OldGenerations = 2,
    /// Pinned byte arrays: blocks of small ones, and large ones (a group each).
    Pinned = 3,
    /// Large unpinned objects, one per block group.
    Large = 4,
    /// Compact regions.
    Compact = 5,
    /// The nonmoving collector's segments (`-xn`).
    Nonmoving = 6,
    /// Blocks with no generation: the RTS's own lists (mutable lists, arenas, ...).
    Other = 7,
}

impl GhcBlockKind {
    pub const ALL: [GhcBlockKind; 8] = [
        GhcBlockKind::Nursery,
        GhcBlockKind::Gen0,
        GhcBlockKind::OldGenerations,
        GhcBlockKind::Pinned,
        GhcBlockKind::Large,
        GhcBlockKind::Compact,
        GhcBlockKind::Nonmoving,
        GhcBlockKind::Other,
    ];
    pub fn name(self) -> &'static str {
        match self {
            GhcBlockKind::Nursery => "nursery",
            GhcBlockKind::Gen0 => "generation 0",
            GhcBlockKind::OldGenerations => "old generations",
            GhcBlockKind::Pinned => "pinned",
            GhcBlockKind::Large => "large objects",
            GhcBlockKind::Compact => "compact regions",
            GhcBlockKind::Nonmoving => "nonmoving segments",
            GhcBlockKind::Other => "RTS lists",
        }
    }
}

/// One kind's block groups in a census.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GhcKindFigures {
    pub groups: u64,
    pub blocks: u64,
    /// Bytes from each group's start to its free pointer: what was allocated into it.
    pub used_bytes: u64,
}

/// Upper bounds (inclusive) of the megablock-fill buckets: megablocks counted by how many
/// of their 252 blocks are in use. The last bucket is the full megablock (and every
/// megablock of a large group spanning several).
pub const MEGABLOCK_FILL_BOUNDS: [u32; 6] = [1, 5, 25, 126, 251, 252];

/// A megablock with at most this many blocks in use (10% of 252) is *sparse*: a few
/// survivors keep the rest of it from being returned.
pub const SPARSE_MEGABLOCK_BLOCKS: u32 = 25;

/// What the pinned blocks' objects hold, found by a scan of the heap for references into
/// them. A reference from a dead object not yet collected counts too, so live bytes are
/// an upper bound and the waste a lower bound.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GhcPinnedLiveness {
    pub objects: u64,
    pub live_objects: u64,
    pub live_bytes: u64,
    /// Pinned groups by live bytes / bytes held: 0-10%, 10-20%, ..., 90-100%.
    pub occupancy: [u64; 10],
    /// The live bytes of the pinned blocks inside sparse megablocks.
    pub sparse_live_bytes: u64,
    /// Bytes of heap read for references.
    pub scanned_bytes: u64,
}

/// The block census itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GhcBlocks {
    /// Megablocks (1 MiB) the RTS holds.
    pub megablocks: u64,
    /// In-use block groups by kind, in [`GhcBlockKind::ALL`] order.
    pub kinds: Vec<GhcKindFigures>,
    /// Free blocks inside the megablocks held (block-level fragmentation).
    pub free_blocks: u64,
    /// Megablocks by blocks in use: [0] none, then one bucket per bound of
    /// [`MEGABLOCK_FILL_BOUNDS`] (1, 2-5, 6-25, 26-126, 127-251, 252).
    pub megablock_fill: Vec<u64>,
    /// Sparse megablocks (at most [`SPARSE_MEGABLOCK_BLOCKS`] blocks in use) and the
    /// in-use blocks inside them by kind, in [`GhcBlockKind::ALL`] order.
    pub sparse_megablocks: u64,
    pub sparse_blocks: Vec<u64>,
    /// `None` when the scan was not made (too large a heap, or no pinned blocks).
    pub pinned_liveness: Option<GhcPinnedLiveness>,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
    /// Read without the RTS's symbols (a stripped executable): the heap found from
    /// /proc/PID/maps and checked against its own descriptors, not the RTS's counters;
    /// the nursery is counted in generation 0, and empty megablocks are not counted in
    /// `megablocks` (the RTS's own and those it returned to the OS look alike): they are
    /// `empty_megablocks_uncounted`. A tail of the record: older traces read false, 0.
    pub without_symbols: bool,
    pub empty_megablocks_uncounted: u64,
}

impl GhcBlocks {
    pub fn kind(&self, kind: GhcBlockKind) -> GhcKindFigures {
        self.kinds.get(kind as usize).copied().unwrap_or_default()
    }
    pub fn sparse_blocks_of(&self, kind: GhcBlockKind) -> u64 {
        self.sparse_blocks.get(kind as usize).copied().unwrap_or(0)
    }
    pub fn blocks_in_use(&self) -> u64 {
        self.kinds.iter().map(|k| k.blocks).sum()
    }
}

/// A census of a runtime's heap taken with a snapshot, or why none could be taken: the
/// framing chunks 14 (GHC) and 17 (pymalloc) share, `stream tick reason outcome`, then the
/// note (outcome 0) or the census itself (outcome 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census<T> {
    pub stream: u32,
    pub tick: u64,
    pub reason: SnapshotReason,
    pub result: Result<T, String>,
}

/// What a [`Census`] holds when one was taken.
pub trait CensusBody: Sized {
    /// Names it in errors: "a GHC census".
    const WHAT: &'static str;
    fn encode_body(&self, w: &mut Writer);
    fn decode_body(r: &mut Reader) -> Result<Self, TraceError>;
}

fn encode_reason(r: SnapshotReason) -> u8 {
    r as u8
}

fn decode_reason(b: u8) -> SnapshotReason {
    match b {
        1 => SnapshotReason::NearPeak,
        2 => SnapshotReason::Exit,
        _ => SnapshotReason::Periodic,
    }
}

impl<T: CensusBody> Census<T> {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .u8(encode_reason(self.reason));
        match &self.result {
            Err(note) => {
                w.u8(0).str(note);
            }
            Ok(body) => {
                w.u8(1);
                body.encode_body(&mut w);
            }
        }
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let reason = decode_reason(r.u8()?);
        let result = match r.u8()? {
            0 => Err(r.string()?),
            1 => Ok(T::decode_body(&mut r)?),
            other => {
                return Err(TraceError::Malformed(format!(
                    "{} with an unknown outcome tag {other}",
                    T::WHAT
                )))
            }
        };
        Ok(Self {
            stream,
            tick,
            reason,
            result,
        })
    }
}

/// Chunk 14: a block census of a GHC program's heap, read from its RTS's own block
/// descriptors at a snapshot; or why none could be taken.
pub type GhcCensus = Census<GhcBlocks>;

impl CensusBody for GhcBlocks {
    const WHAT: &'static str = "a GHC census";

    fn encode_body(&self, w: &mut Writer) {
        w.varint(self.megablocks).varint(self.free_blocks);
        w.varint(self.kinds.len() as u64);
        for k in &self.kinds {
            w.varint(k.groups).varint(k.blocks).varint(k.used_bytes);
        }
        w.varint(self.megablock_fill.len() as u64);
        for &n in &self.megablock_fill {
            w.varint(n);
        }
        w.varint(self.sparse_megablocks)
            .varint(self.sparse_blocks.len() as u64);
        for &n in &self.sparse_blocks {
            w.varint(n);
        }
        match &self.pinned_liveness {
            None => {
                w.u8(0);
            }
            Some(p) => {
                w.u8(1)
                    .varint(p.objects)
                    .varint(p.live_objects)
                    .varint(p.live_bytes);
                for &n in &p.occupancy {
                    w.varint(n);
                }
                w.varint(p.sparse_live_bytes).varint(p.scanned_bytes);
            }
        }
        w.varint(self.pause_us);
        w.u8(u8::from(self.without_symbols))
            .varint(self.empty_megablocks_uncounted);
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let megablocks = r.varint()?;
        let free_blocks = r.varint()?;
        let n = r.count(3)?;
        let mut kinds = Vec::with_capacity(n);
        for _ in 0..n {
            kinds.push(GhcKindFigures {
                groups: r.varint()?,
                blocks: r.varint()?,
                used_bytes: r.varint()?,
            });
        }
        let n = r.count(1)?;
        let megablock_fill = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        let sparse_megablocks = r.varint()?;
        let n = r.count(1)?;
        let sparse_blocks = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        let pinned_liveness = match r.u8()? {
            0 => None,
            _ => {
                let objects = r.varint()?;
                let live_objects = r.varint()?;
                let live_bytes = r.varint()?;
                let mut occupancy = [0u64; 10];
                for o in &mut occupancy {
                    *o = r.varint()?;
                }
                Some(GhcPinnedLiveness {
                    objects,
                    live_objects,
                    live_bytes,
                    occupancy,
                    sparse_live_bytes: r.varint()?,
                    scanned_bytes: r.varint()?,
                })
            }
        };
        let pause_us = r.varint()?;
        let (without_symbols, empty_megablocks_uncounted) = if r.is_empty() {
            (false, 0)
        } else {
            (r.u8()? != 0, r.varint()?)
        };
        Ok(GhcBlocks {
            megablocks,
            kinds,
            free_blocks,
            megablock_fill,
            sparse_megablocks,
            sparse_blocks,
            pinned_liveness,
            pause_us,
            without_symbols,
            empty_megablocks_uncounted,
        })
    }
}

/// A pymalloc pool (CPython's small-object allocator), as its header said at a census.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PymallocPool {
    /// Address of the pool (and of its header).
    pub address: u64,
    /// Index of its arena in the interpreter's arena table: the pools of one arena
    /// share it.
    pub arena: u32,
    /// Block size of the pool's size class, in bytes (for an empty pool: of its last class).
    pub block_size: u32,
    /// Blocks in use (0: an empty pool, free for any class).
    pub blocks_in_use: u32,
    /// Blocks ever carved out of the pool (the rest lie untouched above them).
    pub blocks_carved: u32,
}

/// The census itself: every pool found, in address order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PymallocPools {
    /// The interpreter's version, as "3.11".
    pub python: String,
    pub pool_size: u32,
    pub arena_size: u32,
    /// Bytes of each pool taken by its header.
    pub pool_header: u32,
    pub pools: Vec<PymallocPool>,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
}

/// Chunk 17: a census of a CPython process's pymalloc pools, read from their headers at a
/// snapshot; or why none could be taken.
pub type PymallocCensus = Census<PymallocPools>;

impl CensusBody for PymallocPools {
    const WHAT: &'static str = "a pymalloc census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.python)
            .varint(self.pool_size.into())
            .varint(self.arena_size.into())
            .varint(self.pool_header.into())
            .varint(self.pause_us)
            .varint(self.pools.len() as u64);
        // Addresses as steps in pools from the one before: mostly 1.
        let mut prev = 0u64;
        for pool in &self.pools {
            w.varint(pool.address.wrapping_sub(prev) / u64::from(self.pool_size.max(1)))
                .varint(pool.arena.into())
                .varint(pool.block_size.into())
                .varint(pool.blocks_in_use.into())
                .varint(pool.blocks_carved.into());
            prev = pool.address;
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let python = r.string()?;
        let pool_size = r.varint()? as u32;
        let arena_size = r.varint()? as u32;
        let pool_header = r.varint()? as u32;
        let pause_us = r.varint()?;
        if pool_size == 0 || !pool_size.is_power_of_two() {
            return Err(TraceError::Malformed(format!(
                "a pymalloc census with a pool size of {pool_size} bytes"
            )));
        }
        let n = r.count(5)?;
        let mut pools = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            let address = prev.wrapping_add(r.varint()?.wrapping_mul(u64::from(pool_size)));
            let pool = PymallocPool {
                address,
                arena: r.varint()? as u32,
                block_size: r.varint()? as u32,
                blocks_in_use: r.varint()? as u32,
                blocks_carved: r.varint()? as u32,
            };
            prev = address;
            pools.push(pool);
        }
        Ok(PymallocPools {
            python,
            pool_size,
            arena_size,
            pool_header,
            pools,
            pause_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pymalloc_censuses_round_trip() {
        let pool = |address, arena, block_size, blocks_in_use| PymallocPool {
            address,
            arena,
            block_size,
            blocks_in_use,
            blocks_carved: blocks_in_use + 3,
        };
        let taken = PymallocCensus {
            stream: 2,
            tick: 4000,
            reason: SnapshotReason::NearPeak,
            result: Ok(PymallocPools {
                python: "3.11".into(),
                pool_size: 16384,
                arena_size: 1 << 20,
                pool_header: 48,
                pools: vec![
                    pool(0x7f00_0000_4000, 0, 32, 500),
                    pool(0x7f00_0000_8000, 0, 32, 0),
                    pool(0x7f10_0000_0000, 7, 512, 31),
                ],
                pause_us: 812,
            }),
        };
        assert_eq!(PymallocCensus::decode(&taken.encode()).unwrap(), taken);
        let none = PymallocCensus {
            result: Err("not read".into()),
            ..taken.clone()
        };
        assert_eq!(PymallocCensus::decode(&none.encode()).unwrap(), none);
        let mut bad = taken.encode();
        bad.truncate(bad.len() - 2);
        assert!(PymallocCensus::decode(&bad).is_err());
    }

    #[test]
    fn ghc_censuses_round_trip() {
        let taken = GhcCensus {
            stream: 2,
            tick: 1234,
            reason: SnapshotReason::NearPeak,
            result: Ok(GhcBlocks {
                megablocks: 143,
                kinds: GhcBlockKind::ALL
                    .iter()
                    .enumerate()
                    .map(|(i, _)| GhcKindFigures {
                        groups: i as u64,
                        blocks: 10 * i as u64,
                        used_bytes: 4096 * i as u64,
                    })
                    .collect(),
                free_blocks: 35_000,
                megablock_fill: vec![100, 3, 2, 1, 0, 37],
                sparse_megablocks: 105,
                sparse_blocks: vec![0, 0, 1, 210, 0, 0, 0, 0],
                pinned_liveness: Some(GhcPinnedLiveness {
                    objects: 50_000,
                    live_objects: 210,
                    live_bytes: 210 * 40,
                    occupancy: [210, 0, 0, 0, 0, 0, 0, 0, 1, 5],
                    sparse_live_bytes: 8400,
                    scanned_bytes: 1 << 20,
                }),
                pause_us: 850,
                without_symbols: true,
                empty_megablocks_uncounted: 12,
            }),
        };
        assert_eq!(GhcCensus::decode(&taken.encode()).unwrap(), taken);
        // A census written before the tail reads as one taken with symbols.
        let mut bytes = taken.encode();
        bytes.truncate(bytes.len() - 2);
        let old = GhcCensus::decode(&bytes).unwrap();
        let old = old.result.unwrap();
        assert!(!old.without_symbols && old.empty_megablocks_uncounted == 0);
        assert_eq!(old.pause_us, 850);
        let mut none = taken.clone();
        none.result =
            Err("the RTS is GHC 9.8.1, whose block layout fragscope does not know".into());
        assert_eq!(GhcCensus::decode(&none.encode()).unwrap(), none);
        let mut no_scan = taken;
        if let Ok(b) = &mut no_scan.result {
            b.pinned_liveness = None;
        }
        assert_eq!(GhcCensus::decode(&no_scan.encode()).unwrap(), no_scan);
        assert!(GhcCensus::decode(&[2, 1, 0, 7]).is_err());
    }
}
