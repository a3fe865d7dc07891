//! The GHC block censuses of a recording (read by the recorder from the RTS's block
//! descriptors), in bytes, beside the eventlog's figures of the same moment; and the
//! diagnosis they support: what holds the heap's megablocks once live data has fallen.

use fragscope_trace::records::{
    GhcBlockKind, GhcBlocks, SnapshotReason, MEGABLOCK_FILL_BOUNDS, SPARSE_MEGABLOCK_BLOCKS,
};
use serde::Serialize;

use crate::mib;

const MBLOCK: u64 = 1 << 20;
const BLOCK: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockKindFigures {
    pub kind: &'static str,
    pub groups: u64,
    /// Bytes of the blocks held.
    pub held: u64,
    /// Bytes allocated into them (start to free pointer).
    pub used: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MegablockFill {
    /// "no block in use", "1 block", "2-5 blocks", ..., "all 252 blocks".
    pub label: String,
    pub megablocks: u64,
}

/// One census, in bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockCensus {
    pub t_ms: f64,
    /// "periodic", "near peak" or "exit".
    pub reason: &'static str,
    /// Megablocks held, in bytes (what HEAP_SIZE reports).
    pub heap_size: u64,
    pub blocks_in_use: u64,
    /// Free blocks inside the megablocks held (what GC_STATS_GHC frag reports).
    pub free_blocks: u64,
    pub kinds: Vec<BlockKindFigures>,
    pub megablock_fill: Vec<MegablockFill>,
    /// Megablocks with at most 25 of their 252 blocks in use, in bytes, and the blocks in
    /// use inside them.
    pub sparse_megablocks: u64,
    pub sparse_blocks_in_use: u64,
    pub sparse_pinned_blocks: u64,
    /// Blocks in use inside sparse megablocks that hold survivors: not the nursery (the
    /// allocation area, refilled after every collection) nor the RTS's own lists.
    pub sparse_survivor_blocks: u64,
    /// Sparse megablocks' blocks in use by kind (bytes), largest first.
    pub sparse_by_kind: Vec<(&'static str, u64)>,
    pub pinned_blocks: u64,
    /// Bytes of pinned objects something in the heap still refers to (`None`: not
    /// scanned); an upper bound, as a dead object not yet collected counts too.
    pub pinned_live: Option<u64>,
    pub sparse_pinned_live: Option<u64>,
    /// Pinned block groups by live bytes / bytes held: 0-10%, ..., 90-100%.
    pub pinned_occupancy: Option<Vec<u64>>,
    /// How long the program was held stopped for the census.
    pub pause_ms: f64,
    /// The eventlog's HEAP_SIZE and GC_STATS_GHC frag posted last before this moment
    /// (both are posted at collections only; `None` before the first, or without an
    /// eventlog).
    pub eventlog_heap_size: Option<u64>,
    pub eventlog_free_blocks: Option<u64>,
    /// HEAP_LIVE posted last before this moment (it counts a pinned block whole while any
    /// object in it lives).
    pub eventlog_live: Option<u64>,
    /// Read from a stripped executable (no RTS symbols): the nursery is in generation 0,
    /// and `empty_megablocks` bytes of wholly free megablocks below the high watermark
    /// are not in `heap_size` (the RTS's own and those it returned to the OS look alike).
    pub without_symbols: bool,
    pub empty_megablocks: u64,
}

impl BlockCensus {
    /// What a census read without symbols cannot tell, in words; None with symbols.
    pub fn without_symbols_note(&self) -> Option<String> {
        self.without_symbols.then(|| {
            let empty = if self.empty_megablocks > 0 {
                format!(
                    "; {} of empty megablocks are not counted in the heap (the RTS's own and \
                     those it gave back with MADV_FREE look alike)",
                    crate::mib(self.empty_megablocks)
                )
            } else {
                String::new()
            };
            format!(
                "read without symbols (a stripped executable): the heap was found from the \
                 process's mappings and its block descriptors checked against each other, \
                 not against the RTS's counters; the nursery is counted in generation 0{empty}."
            )
        })
    }
}

/// What the censuses say holds the heap, in words.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockDiagnosis {
    /// The census the diagnosis reads.
    pub census_t_ms: f64,
    pub headline: String,
    pub details: Vec<String>,
    pub advice: Vec<String>,
}

pub fn reason_name(r: SnapshotReason) -> &'static str {
    match r {
        SnapshotReason::Periodic => "periodic",
        SnapshotReason::NearPeak => "near peak",
        SnapshotReason::Exit => "exit",
    }
}

fn fill_label(i: usize) -> String {
    if i == 0 {
        return "no block in use".into();
    }
    let hi = MEGABLOCK_FILL_BOUNDS[i - 1];
    let lo = if i == 1 {
        1
    } else {
        MEGABLOCK_FILL_BOUNDS[i - 2] + 1
    };
    match (lo, hi) {
        (1, 1) => "1 block in use".into(),
        (_, 252) if lo == hi => "all 252 blocks in use".into(),
        _ => format!("{lo}-{hi} blocks in use"),
    }
}

impl BlockCensus {
    /// `eventlog`: (HEAP_SIZE, GC frag, HEAP_LIVE) last posted before the census.
    pub fn new(
        t_ms: f64,
        reason: SnapshotReason,
        b: &GhcBlocks,
        eventlog: (Option<u64>, Option<u64>, Option<u64>),
    ) -> Self {
        let pinned = b.kind(GhcBlockKind::Pinned);
        let sparse_pinned_blocks = b.sparse_blocks_of(GhcBlockKind::Pinned);
        Self {
            t_ms,
            reason: reason_name(reason),
            heap_size: b.megablocks * MBLOCK,
            blocks_in_use: b.blocks_in_use() * BLOCK,
            free_blocks: b.free_blocks * BLOCK,
            kinds: GhcBlockKind::ALL
                .iter()
                .map(|&k| {
                    let f = b.kind(k);
                    BlockKindFigures {
                        kind: k.name(),
                        groups: f.groups,
                        held: f.blocks * BLOCK,
                        used: f.used_bytes,
                    }
                })
                .collect(),
            megablock_fill: b
                .megablock_fill
                .iter()
                .enumerate()
                .filter(|&(i, _)| i <= MEGABLOCK_FILL_BOUNDS.len())
                .map(|(i, &n)| MegablockFill {
                    label: fill_label(i),
                    megablocks: n,
                })
                .collect(),
            sparse_megablocks: b.sparse_megablocks * MBLOCK,
            sparse_blocks_in_use: b.sparse_blocks.iter().sum::<u64>() * BLOCK,
            sparse_pinned_blocks,
            sparse_survivor_blocks: GhcBlockKind::ALL
                .iter()
                .filter(|k| !matches!(k, GhcBlockKind::Nursery | GhcBlockKind::Other))
                .map(|&k| b.sparse_blocks_of(k))
                .sum(),
            sparse_by_kind: {
                let mut v: Vec<(&'static str, u64)> = GhcBlockKind::ALL
                    .iter()
                    .map(|&k| (k.name(), b.sparse_blocks_of(k) * BLOCK))
                    .filter(|&(_, n)| n > 0)
                    .collect();
                v.sort_by_key(|k| std::cmp::Reverse(k.1));
                v
            },
            pinned_blocks: pinned.blocks,
            pinned_live: b.pinned_liveness.as_ref().map(|p| p.live_bytes),
            sparse_pinned_live: b.pinned_liveness.as_ref().map(|p| p.sparse_live_bytes),
            pinned_occupancy: b.pinned_liveness.as_ref().map(|p| p.occupancy.to_vec()),
            pause_ms: b.pause_us as f64 / 1000.0,
            eventlog_heap_size: eventlog.0,
            eventlog_free_blocks: eventlog.1,
            eventlog_live: eventlog.2,
            without_symbols: b.without_symbols,
            empty_megablocks: b.empty_megablocks_uncounted * MBLOCK,
        }
    }
}

/// Share of `part` in `whole` as words: "less than 1%", "7%".
fn percent_words(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    let p = 100.0 * part as f64 / whole as f64;
    if p < 1.0 {
        "less than 1%".into()
    } else {
        format!("{p:.0}%")
    }
}

/// The advice for megablocks kept by pinned blocks.
pub fn pinned_advice() -> Vec<String> {
    vec![
        "Copy what you keep out of pinned memory: a slice of a ByteString shares its whole \
         buffer, so store `Data.ByteString.copy` of it, or a ShortByteString \
         (`Data.ByteString.Short.toShort`), which is unpinned and moved (compacted) by the \
         collector."
            .into(),
        "Avoid keeping small slices of large pinned buffers (a parser's results that point \
         into the input, a session id cut from a request buffer) beyond the request that \
         read them."
            .into(),
        "Compact regions (GHC.Compact) do not help here: they only take unpinned data, so a \
         ByteString must become a ShortByteString before it can be compacted."
            .into(),
    ]
}

/// The two block-level wastes a census can show, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waste {
    /// Megablocks kept by a few blocks in use: their free blocks.
    Sparse(u64),
    /// Pinned blocks kept whole by a few objects: their bytes nothing refers to.
    Pinned(u64),
}

impl Waste {
    fn bytes(self) -> u64 {
        match self {
            Waste::Sparse(b) | Waste::Pinned(b) => b,
        }
    }
}

/// `pinned_kept`: the bytes of pinned blocks the heap kept after this census (see
/// [`pinned_kept_after`]).
fn wastes(c: &BlockCensus, pinned_kept: u64) -> [Waste; 2] {
    let pinned_held = pinned_kept.min(c.pinned_blocks * BLOCK);
    // Megablocks kept by survivors only: sparse megablocks whose blocks are mostly the
    // nursery's are the allocation area spread thin (after the last collection of a
    // run, say), which the next allocations fill.
    let by_survivors = c.sparse_survivor_blocks * 2 >= c.sparse_blocks_in_use / BLOCK;
    [
        Waste::Sparse(if by_survivors {
            c.sparse_megablocks.saturating_sub(c.sparse_blocks_in_use)
        } else {
            0
        }),
        // Only a scan tells: HEAP_LIVE counts a pinned block whole while any object in it
        // lives.
        Waste::Pinned(c.pinned_live.map_or(0, |l| pinned_held.saturating_sub(l))),
    ]
}

/// The pinned blocks census `i` holds that the next census still holds, in bytes. A
/// scan finds the objects something refers to; a dead object the collector has not
/// reached yet is not referred to, but its block goes at the next major collection.
/// Between a program dropping its pinned data and that collection (a moment a census
/// near the peak often catches), the blocks are garbage awaiting collection, not kept
/// by survivors: the next census tells them apart. The last census has no next one.
fn pinned_kept_after(censuses: &[BlockCensus], i: usize) -> u64 {
    let held = censuses[i].pinned_blocks * BLOCK;
    censuses
        .get(i + 1)
        .map_or(held, |next| held.min(next.pinned_blocks * BLOCK))
}

/// A waste worth a headline: at least 4 MiB and a quarter of the heap. Dead bytes in
/// pinned blocks count against the blocks in use too: the RTS counts those blocks as
/// live, and keeps a multiple of what it counts live as free megablocks after a major
/// collection, so a heap mostly free can still be there for them.
fn significant(w: Waste, c: &BlockCensus) -> bool {
    let share_of = match w {
        Waste::Sparse(_) => c.heap_size,
        Waste::Pinned(_) => c.heap_size.min(c.blocks_in_use),
    };
    w.bytes() >= 4 * MBLOCK && w.bytes() * 4 >= share_of
}

/// The diagnosis from the censuses: the census and waste with the most bytes, when that
/// is a real share of the heap; what kind of blocks keep them, and how full those are.
/// `live_at(t_ms)`: HEAP_LIVE at that moment, when the eventlog has it.
/// The first line when no megablocks are kept by a few survivors ([`diagnose`] found
/// nothing): the largest heap the censuses saw, and what its free blocks are. None
/// without a census.
pub fn plain_headline(censuses: &[BlockCensus]) -> Option<String> {
    let c = censuses.iter().max_by(|a, b| {
        a.heap_size
            .cmp(&b.heap_size)
            .then(b.t_ms.total_cmp(&a.t_ms))
    })?;
    let held = format!(
        "at {:.2} s the RTS held {} of megablocks, {} of blocks in use",
        c.t_ms / 1000.0,
        mib(c.heap_size),
        mib(c.blocks_in_use)
    );
    Some(if c.free_blocks * 4 < c.heap_size {
        format!(
            "The heap is dense: {held}, and no megablock is kept by a few survivors; only \
             holding less live data lowers its size."
        )
    } else {
        format!(
            "{} of free blocks inside the heap's megablocks ({held}), in megablocks that \
             still hold many blocks in use: room the copying collector keeps for its next \
             copies (+RTS -F sets how much; the compacting or nonmoving collector needs \
             less), not megablocks kept by a few survivors.",
            crate::mib(c.free_blocks)
        )
    })
}

pub fn diagnose(
    censuses: &[BlockCensus],
    live_at: impl Fn(f64) -> Option<u64>,
) -> Option<BlockDiagnosis> {
    let (c, waste) = censuses
        .iter()
        .enumerate()
        .flat_map(|(i, c)| wastes(c, pinned_kept_after(censuses, i)).map(|w| (c, w)))
        .filter(|(c, w)| significant(*w, c))
        // The largest; among equals, the earliest.
        .max_by(|a, b| {
            a.1.bytes()
                .cmp(&b.1.bytes())
                .then(b.0.t_ms.total_cmp(&a.0.t_ms))
        })?;
    let live = live_at(c.t_ms);
    let sparse_blocks = c.sparse_blocks_in_use / BLOCK;
    let mut details = vec![format!(
        "At {:.2} s the RTS held {} of megablocks{}: {} of free blocks inside them, and {} \
         ({} megablocks) with at most {} of their 252 blocks in use, {} blocks in all.",
        c.t_ms / 1000.0,
        mib(c.heap_size),
        live.map_or_else(String::new, |l| format!(
            " for {} of live data (HEAP_LIVE)",
            mib(l)
        )),
        mib(c.free_blocks),
        mib(c.sparse_megablocks),
        c.sparse_megablocks / MBLOCK,
        SPARSE_MEGABLOCK_BLOCKS,
        sparse_blocks
    )];
    let pinned_detail = match (&c.pinned_occupancy, c.pinned_live) {
        (Some(occ), Some(live)) => format!(
            "Of the heap's {} pinned blocks ({}), {} groups are less than 10% full; the \
             objects still referred to in them add up to {} (found by a scan of the heap for \
             references into them). The RTS never moves pinned objects and frees a pinned \
             block only when every object in it is dead, so each survivor keeps its block, \
             and a block in use keeps its whole megablock.",
            c.pinned_blocks,
            mib(c.pinned_blocks * BLOCK),
            occ.first().copied().unwrap_or(0),
            mib(live)
        ),
        _ => "The RTS never moves pinned objects and frees a pinned block only when every \
              object in it is dead, so each survivor keeps its block, and a block in use \
              keeps its whole megablock (how full the blocks are was not measured: the heap \
              was too large to scan at that census)."
            .into(),
    };
    match waste {
        Waste::Sparse(_)
            if c.sparse_pinned_blocks > 0
                && c.sparse_pinned_blocks * 2 >= c.sparse_survivor_blocks =>
        {
            let fill = c.sparse_pinned_live.map(|live| {
                format!(
                    " {} full",
                    percent_words(live, c.sparse_pinned_blocks * BLOCK)
                )
            });
            details.push(pinned_detail);
            Some(BlockDiagnosis {
                census_t_ms: c.t_ms,
                headline: format!(
                    "{} of megablocks are kept by {} pinned blocks{}",
                    mib(c.sparse_megablocks),
                    c.sparse_pinned_blocks,
                    fill.unwrap_or_default()
                ),
                details,
                advice: pinned_advice(),
            })
        }
        Waste::Pinned(_) => {
            details.push(pinned_detail);
            let empty = c.megablock_fill.first().map_or(0, |f| f.megablocks);
            if empty > 0 {
                details.push(format!(
                    "The RTS counts a pinned block as live data while any object in it lives \
                     (HEAP_LIVE), and after a major collection keeps megablocks for (F+2) \
                     times the blocks it counts live (rts/sm/GC.c; F is +RTS -F, 2 by \
                     default): the {} of megablocks with no block in use at this census are \
                     held for them too.",
                    mib(empty * MBLOCK)
                ));
            }
            let held = c.pinned_blocks * BLOCK;
            let occ = c.pinned_occupancy.as_deref().unwrap_or(&[]);
            let headline = format!(
                "{} of pinned blocks hold only {} of objects still referred to: {} of them \
                 are less than 20% full",
                mib(held),
                mib(c.pinned_live.unwrap_or(0)),
                occ.iter().take(2).sum::<u64>()
            );
            Some(BlockDiagnosis {
                census_t_ms: c.t_ms,
                headline,
                details,
                advice: pinned_advice(),
            })
        }
        Waste::Sparse(_) => {
            // Another kind of block keeps the sparse megablocks: name the largest.
            let kind = c.sparse_by_kind.first().map_or("blocks", |k| k.0);
            Some(BlockDiagnosis {
                census_t_ms: c.t_ms,
                headline: format!(
                    "{} of megablocks are kept by {} blocks in use, mostly {kind}",
                    mib(c.sparse_megablocks),
                    sparse_blocks
                ),
                details,
                advice: vec![
                    "A megablock goes back to the OS only when all of its blocks are free; \
                     blocks that live long (large objects, old-generation data allocated \
                     among short-lived data) keep theirs. The -hT profile (`fragscope record \
                     --ghc-heap-profile`) shows which closures survive."
                        .into(),
                ],
            })
        }
    }
}

/// The census's reading of a plateau whose live data fell, for the phase: `None` when
/// its block-level waste is not significant.
pub fn phase_note(c: &BlockCensus) -> Option<String> {
    let [sparse, pinned] = wastes(c, c.pinned_blocks * BLOCK);
    if significant(sparse, c) && c.sparse_pinned_blocks * 2 >= c.sparse_survivor_blocks {
        Some(format!(
            "The block census at {:.2} s: {} of this plateau's {} of megablocks hold at most \
             {} blocks in use each, {} of them pinned blocks: pinned objects that survived \
             keep their blocks, and those blocks their megablocks.",
            c.t_ms / 1000.0,
            mib(c.sparse_megablocks),
            mib(c.heap_size),
            SPARSE_MEGABLOCK_BLOCKS,
            c.sparse_pinned_blocks
        ))
    } else if significant(pinned, c) {
        Some(format!(
            "The block census at {:.2} s: pinned blocks hold {}, of which objects still \
             referred to are {}: the survivors keep whole pinned blocks.",
            c.t_ms / 1000.0,
            mib(c.pinned_blocks * BLOCK),
            mib(c.pinned_live.unwrap_or(0))
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::records::{GhcKindFigures, GhcPinnedLiveness};

    /// The figures of a census after Conns.hs closed its connections (tests/ghc), as
    /// the recorder read them from GHC 9.0.2's RTS.
    fn after_close() -> GhcBlocks {
        let mut kinds = vec![GhcKindFigures::default(); 8];
        kinds[GhcBlockKind::Nursery as usize] = GhcKindFigures {
            groups: 256,
            blocks: 256,
            used_bytes: 594_680,
        };
        kinds[GhcBlockKind::OldGenerations as usize] = GhcKindFigures {
            groups: 6,
            blocks: 6,
            used_bytes: 18_808,
        };
        kinds[GhcBlockKind::Pinned as usize] = GhcKindFigures {
            groups: 206,
            blocks: 212,
            used_bytes: 784_872,
        };
        GhcBlocks {
            megablocks: 71,
            kinds,
            free_blocks: 17_409,
            megablock_fill: vec![0, 4, 61, 2, 4, 0, 0],
            sparse_megablocks: 67,
            sparse_blocks: vec![12, 1, 5, 197, 8, 0, 0, 0],
            pinned_liveness: Some(GhcPinnedLiveness {
                objects: 1575,
                live_objects: 212,
                live_bytes: 129_976,
                occupancy: [69, 132, 1, 0, 0, 0, 3, 0, 1, 0],
                sparse_live_bytes: 99_472,
                scanned_bytes: 646_256,
            }),
            pause_us: 3123,
            without_symbols: false,
            empty_megablocks_uncounted: 0,
        }
    }

    #[test]
    fn without_a_diagnosis_the_headline_says_where_the_heap_stood() {
        let mut dense = BlockCensus::new(
            1850.0,
            SnapshotReason::Periodic,
            &after_close(),
            (None, None, None),
        );
        dense.heap_size = 74 << 20;
        dense.blocks_in_use = 72 << 20;
        dense.free_blocks = 2 << 20;
        let mut earlier = dense.clone();
        earlier.t_ms = 400.0;
        earlier.heap_size = 12 << 20;
        let h = plain_headline(&[earlier.clone(), dense.clone()]).unwrap();
        assert!(
            h.starts_with("The heap is dense: at 1.85 s the RTS held 74 MiB of megablocks"),
            "{h}"
        );
        let mut roomy = dense;
        roomy.free_blocks = 30 << 20;
        let h = plain_headline(&[earlier, roomy]).unwrap();
        assert!(
            h.starts_with("30 MiB of free blocks inside the heap's megablocks"),
            "{h}"
        );
        assert_eq!(plain_headline(&[]), None);
    }

    #[test]
    fn megablocks_kept_by_pinned_blocks_make_the_headline() {
        let c = BlockCensus::new(
            3200.0,
            SnapshotReason::Periodic,
            &after_close(),
            (Some(71 << 20), None, Some(800 << 10)),
        );
        assert_eq!(c.heap_size, 71 << 20);
        assert_eq!(c.free_blocks, 17_409 * 4096);
        assert_eq!(c.megablock_fill[2].label, "2-5 blocks in use");
        assert_eq!(c.megablock_fill[6].label, "all 252 blocks in use");
        let d = diagnose(&[c], |_| Some(800 << 10)).unwrap();
        assert_eq!(
            d.headline,
            "67 MiB of megablocks are kept by 197 pinned blocks 12% full"
        );
        assert!(
            d.details[0].contains("0.8 MiB of live data"),
            "{:?}",
            d.details
        );
        assert!(
            d.details[1].contains("69 groups are less than 10% full"),
            "{:?}",
            d.details
        );
        assert!(phase_note(&c2())
            .unwrap()
            .contains("197 of them pinned blocks"));
        assert!(d.advice[0].contains("Data.ByteString.copy"));
        assert!(d.advice[2].contains("unpinned"));
    }

    fn c2() -> BlockCensus {
        BlockCensus::new(
            3200.0,
            SnapshotReason::Periodic,
            &after_close(),
            (Some(71 << 20), None, Some(800 << 10)),
        )
    }

    #[test]
    fn pinned_blocks_kept_by_a_tenth_of_their_objects_make_the_headline() {
        // Seed 000's strip: every pinned block keeps a tenth of its byte arrays, so the
        // megablocks are full of blocks in use, and the waste is inside the blocks.
        let mut b = after_close();
        b.megablocks = 60;
        b.sparse_megablocks = 0;
        b.sparse_blocks = vec![0; 8];
        b.free_blocks = 100;
        b.kinds[GhcBlockKind::Pinned as usize].blocks = 12_000;
        let p = b.pinned_liveness.as_mut().unwrap();
        p.live_bytes = 4_900_000;
        p.occupancy = [0, 11_900, 100, 0, 0, 0, 0, 0, 0, 0];
        let c = BlockCensus::new(
            5000.0,
            SnapshotReason::Periodic,
            &b,
            (Some(60 << 20), None, Some(5 << 20)),
        );
        let d = diagnose(std::slice::from_ref(&c), |_| Some(5 << 20)).unwrap();
        assert_eq!(
            d.headline,
            "47 MiB of pinned blocks hold only 4.7 MiB of objects still referred to: 11900 of \
             them are less than 20% full"
        );
        assert!(phase_note(&c)
            .unwrap()
            .contains("pinned blocks hold 47 MiB"));
    }

    /// Seed 000's strip at n = 2M, as recorded: 15.6 k pinned blocks less than 10% full,
    /// 78 MiB of blocks in use in a 307 MiB heap whose 194 empty megablocks the RTS keeps
    /// for what it counts live. The dead pinned bytes are less than a quarter of the heap
    /// but most of the blocks in use: they make the headline.
    #[test]
    fn dead_bytes_in_pinned_blocks_count_against_the_blocks_in_use() {
        let mut b = after_close();
        b.megablocks = 307;
        b.sparse_megablocks = 1;
        b.sparse_blocks = vec![0, 0, 0, 1, 0, 0, 0, 0];
        b.megablock_fill = vec![194, 1, 0, 23, 80, 9, 0];
        b.kinds[GhcBlockKind::Nursery as usize].blocks = 256;
        b.kinds[GhcBlockKind::OldGenerations as usize].blocks = 4127;
        b.kinds[GhcBlockKind::Pinned as usize].blocks = 15_640;
        b.kinds[GhcBlockKind::Pinned as usize].groups = 15_600;
        b.free_blocks = 307 * 252 - 256 - 4127 - 15_640 - 6;
        let p = b.pinned_liveness.as_mut().unwrap();
        p.live_bytes = 4_824_624;
        p.occupancy = [15_597, 0, 0, 0, 0, 0, 3, 0, 0, 0];
        let c = BlockCensus::new(
            1299.0,
            SnapshotReason::Periodic,
            &b,
            (Some(307 << 20), None, Some(76 << 20)),
        );
        assert!(c.blocks_in_use < c.heap_size / 3);
        let d = diagnose(std::slice::from_ref(&c), |_| Some(76 << 20)).unwrap();
        assert!(
            d.headline
                .starts_with("61 MiB of pinned blocks hold only 4.6 MiB"),
            "{}",
            d.headline
        );
        assert!(
            d.details
                .iter()
                .any(|l| l.contains("194 MiB of megablocks with no block")),
            "{:?}",
            d.details
        );
        assert!(phase_note(&c).is_some());
    }

    /// Seed 000's take on GHC 9.6, as recorded: a census just after the program dropped
    /// its superset and before the next major collection found 61 MiB of pinned blocks
    /// and 4.6 MiB referred to; the next census, 6 MiB of pinned blocks. No headline.
    #[test]
    fn pinned_blocks_freed_by_the_next_collection_are_not_kept_by_survivors() {
        let mut b = after_close();
        b.megablocks = 80;
        b.sparse_megablocks = 0;
        b.sparse_blocks = vec![0; 8];
        b.free_blocks = 100;
        b.kinds[GhcBlockKind::Pinned as usize].blocks = 15_616;
        let p = b.pinned_liveness.as_mut().unwrap();
        p.live_bytes = 4_824_624;
        p.occupancy = [14_063, 0, 0, 0, 0, 0, 0, 0, 0, 1_553];
        let before = BlockCensus::new(
            900.0,
            SnapshotReason::NearPeak,
            &b,
            (Some(80 << 20), None, Some(70 << 20)),
        );
        assert!(diagnose(std::slice::from_ref(&before), |_| None).is_some());
        let mut after = before.clone();
        after.t_ms = 1000.0;
        after.pinned_blocks = 1_560;
        after.pinned_live = Some(4_824_624);
        assert!(diagnose(&[before.clone(), after.clone()], |_| None).is_none());
        // Blocks the next census still holds are kept by survivors.
        after.pinned_blocks = 15_600;
        let d = diagnose(&[before, after], |_| None).unwrap();
        assert!(d
            .headline
            .starts_with("61 MiB of pinned blocks hold only 4.6 MiB"));
    }

    #[test]
    fn megablocks_that_hold_only_the_nursery_are_not_a_waste() {
        // After a run's last collection: nothing survives, and the nursery's blocks
        // are spread over megablocks that held data before.
        let mut b = after_close();
        b.sparse_blocks = vec![150, 0, 2, 7, 0, 0, 0, 0];
        b.pinned_liveness = None;
        let c = BlockCensus::new(1.0, SnapshotReason::Periodic, &b, (None, None, None));
        assert_eq!(c.sparse_survivor_blocks, 9);
        assert!(diagnose(std::slice::from_ref(&c), |_| None).is_none());
        assert!(phase_note(&c).is_none());
    }

    #[test]
    fn a_dense_heap_has_no_block_headline() {
        let mut b = after_close();
        b.sparse_megablocks = 2;
        b.megablocks = 71;
        let c = BlockCensus::new(1.0, SnapshotReason::Periodic, &b, (None, None, None));
        assert!(diagnose(&[c], |_| None).is_none());
    }

    #[test]
    fn without_a_scan_the_headline_does_not_guess_how_full() {
        let mut b = after_close();
        b.pinned_liveness = None;
        let c = BlockCensus::new(1.0, SnapshotReason::Periodic, &b, (None, None, None));
        let d = diagnose(&[c], |_| None).unwrap();
        assert_eq!(
            d.headline,
            "67 MiB of megablocks are kept by 197 pinned blocks"
        );
        assert!(d.details[1].contains("not measured"));
    }
}
