//! The figures `fragscope compare` puts side by side, one set per run or trace, and the
//! median over repeated runs of one configuration; for GHC programs, the GHC model's
//! figures ([`GhcRunFigures`]).

use serde::Serialize;

use crate::ghc::GhcReport;
use crate::phases::PhaseKind;
use crate::report::Report;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunFigures {
    /// None when no RSS sample was taken.
    pub peak_rss: Option<u64>,
    /// The last RSS sample before the program exited.
    pub end_rss: u64,
    /// None when unknown (a snapshot whose census could not read the allocator).
    pub peak_live: Option<u64>,
    /// At the report's focus snapshot (the most heap waste while live data was held).
    pub focus_t_ms: Option<f64>,
    pub heap_resident: u64,
    pub live: u64,
    pub rounding: u64,
    pub allocator_overhead: u64,
    pub free_in_used_pages: u64,
    pub free_resident_pages: u64,
    pub lazy_free: u64,
    pub other_anon: u64,
    pub fragmentation_ratio: Option<f64>,
    /// A CPython process's pymalloc arenas at the snapshot where they hold the most free
    /// space (0 for other programs): arenas, resident bytes, bytes in use, and free
    /// (inside pools in use, free pools, empty arenas).
    pub pymalloc_arenas: u64,
    pub pymalloc_resident: u64,
    pub pymalloc_in_use: u64,
    pub pymalloc_free: u64,
    /// An SBCL process's dynamic space at the census where it holds the most free space
    /// (0 for other programs): resident bytes, of objects, and free (inside pages in use
    /// and free pages kept mapped).
    pub sbcl_resident: u64,
    pub sbcl_in_use: u64,
    pub sbcl_free: u64,
    /// Of the recorded run (recording included), when fragscope ran it.
    pub wall_ms: Option<f64>,
    pub cpu_ms: Option<f64>,
}

impl RunFigures {
    pub fn of(report: &Report) -> Self {
        let mut f = Self {
            peak_rss: report.headline.peak_rss,
            end_rss: report.timeline.last().map_or(0, |p| p.rss),
            peak_live: report.headline.peak_live,
            fragmentation_ratio: report.headline.fragmentation_ratio,
            ..Default::default()
        };
        if let Some(i) = report.focus_snapshot {
            let s = &report.snapshots[i];
            let d = &s.parts;
            f.focus_t_ms = Some(s.t_ms);
            f.heap_resident = d.live + d.heap_waste();
            f.live = d.live;
            f.rounding = d.rounding;
            f.allocator_overhead = d.allocator_overhead;
            f.free_in_used_pages = d.free_in_used_pages;
            f.free_resident_pages = d.free_resident_pages;
            f.lazy_free = d.lazy_free;
            f.other_anon = d.other_anon;
        }
        if let Some(p) = report
            .pymalloc_snapshot
            .and_then(|i| report.snapshots[i].pymalloc.as_ref())
        {
            f.pymalloc_arenas = p.arenas;
            f.pymalloc_resident = p.resident;
            f.pymalloc_in_use = p.in_use;
            f.pymalloc_free = p.waste();
        }
        if let Some(p) = report
            .sbcl_snapshot
            .and_then(|i| report.snapshots[i].sbcl.as_ref())
        {
            f.sbcl_resident = p.resident;
            f.sbcl_in_use = p.in_use;
            f.sbcl_free = p.waste();
        }
        f
    }

    /// Field by field medians (the lower middle for an even count).
    pub fn median(runs: &[RunFigures]) -> RunFigures {
        fn med<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            v.get(v.len().saturating_sub(1) / 2).copied()
        }
        let m = |f: fn(&RunFigures) -> u64| med(runs.iter().map(f).collect()).unwrap_or(0);
        let mo = |f: fn(&RunFigures) -> Option<f64>| med(runs.iter().filter_map(f).collect());
        RunFigures {
            peak_rss: med(runs.iter().filter_map(|r| r.peak_rss).collect()),
            end_rss: m(|r| r.end_rss),
            peak_live: med(runs.iter().filter_map(|r| r.peak_live).collect()),
            focus_t_ms: mo(|r| r.focus_t_ms),
            heap_resident: m(|r| r.heap_resident),
            live: m(|r| r.live),
            rounding: m(|r| r.rounding),
            allocator_overhead: m(|r| r.allocator_overhead),
            free_in_used_pages: m(|r| r.free_in_used_pages),
            free_resident_pages: m(|r| r.free_resident_pages),
            lazy_free: m(|r| r.lazy_free),
            other_anon: m(|r| r.other_anon),
            fragmentation_ratio: mo(|r| r.fragmentation_ratio),
            pymalloc_arenas: m(|r| r.pymalloc_arenas),
            pymalloc_resident: m(|r| r.pymalloc_resident),
            pymalloc_in_use: m(|r| r.pymalloc_in_use),
            pymalloc_free: m(|r| r.pymalloc_free),
            sbcl_resident: m(|r| r.sbcl_resident),
            sbcl_in_use: m(|r| r.sbcl_in_use),
            sbcl_free: m(|r| r.sbcl_free),
            wall_ms: mo(|r| r.wall_ms),
            cpu_ms: mo(|r| r.cpu_ms),
        }
    }
}

/// A GHC program's figures: the RTS's heap where memory settled (the last plateau), its
/// block census, and the GC table, as the GHC report shows them; the eventlog's figures
/// are `None` when the report does not have them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GhcRunFigures {
    pub peak_rss: Option<u64>,
    pub end_rss: Option<u64>,
    /// `-s`: maximum residency (HEAP_LIVE after major collections).
    pub max_residency: Option<u64>,
    /// `-s`: total memory in use (the largest HEAP_SIZE).
    pub memory_in_use: Option<u64>,
    /// The phase the figures below describe: the last plateau, else the last phase.
    pub settled_phase: Option<PhaseKind>,
    pub settled_start_ms: Option<f64>,
    pub settled_end_ms: Option<f64>,
    /// The moment of that phase they are read at.
    pub settled_t_ms: Option<f64>,
    pub rss: Option<u64>,
    pub rss_minus_lazy_free: Option<u64>,
    /// HEAP_LIVE.
    pub live: Option<u64>,
    /// HEAP_SIZE: megablocks held.
    pub heap_size: Option<u64>,
    pub copy_reserve_and_slop: Option<u64>,
    /// Free blocks inside the megablocks held.
    pub free_blocks: Option<u64>,
    pub lazy_free: Option<u64>,
    pub other_anon: Option<u64>,
    /// False when there are no heap figures (no eventlog, or none in it).
    pub heap_known: bool,
    /// The block census of that phase (else the last one after its start).
    pub census: Option<GhcCensusFigures>,
    /// `None` without the eventlog's collections, as are the figures below.
    pub major_collections: Option<u64>,
    pub minor_collections: Option<u64>,
    pub copied_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    pub gc_ms: Option<f64>,
    pub max_pause_ms: Option<f64>,
    pub max_slop: Option<u64>,
    /// The report's headline (what holds the megablocks), when it has one.
    pub headline: Option<String>,
}

/// One block census, as compared.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GhcCensusFigures {
    pub t_ms: f64,
    pub heap_size: u64,
    pub blocks_in_use: u64,
    pub free_blocks: u64,
    pub pinned_blocks: u64,
    pub pinned_held: u64,
    /// Bytes of pinned objects something still refers to (`None`: not scanned).
    pub pinned_live: Option<u64>,
    /// Megablocks with at most 25 blocks in use, in bytes.
    pub sparse_megablocks: u64,
    /// Pinned block groups by how full they are: 0-10%, ..., 90-100%.
    pub pinned_occupancy: Option<Vec<u64>>,
}

impl GhcRunFigures {
    pub fn of(r: &GhcReport) -> Self {
        let settled = r
            .phases
            .iter()
            .rev()
            .find(|p| p.kind == PhaseKind::Plateau)
            .or(r.phases.last());
        let oldest = r.gc.generations.iter().map(|g| g.generation).max();
        let collected = !r.gc.generations.is_empty();
        let mut f = Self {
            peak_rss: r.timeline.iter().filter_map(|p| p.rss).max(),
            end_rss: r.timeline.last().and_then(|p| p.rss),
            max_residency: r.gc.max_residency,
            memory_in_use: r.gc.memory_in_use,
            heap_known: r.heap_known,
            major_collections: collected.then(|| {
                r.gc.generations
                    .iter()
                    .filter(|g| Some(g.generation) == oldest && g.generation > 0)
                    .map(|g| g.collections)
                    .sum()
            }),
            minor_collections: collected.then(|| {
                r.gc.generations
                    .iter()
                    .filter(|g| Some(g.generation) != oldest || g.generation == 0)
                    .map(|g| g.collections)
                    .sum()
            }),
            copied_bytes: r.gc.copied_bytes,
            allocated_bytes: r.gc.allocated_bytes,
            gc_ms: r.gc.gc_ms,
            max_pause_ms: collected.then(|| {
                r.gc.generations
                    .iter()
                    .map(|g| g.max_pause_ms)
                    .fold(0.0, f64::max)
            }),
            max_slop: r.gc.max_slop,
            headline: r.diagnosis.as_ref().map(|d| d.headline.clone()),
            ..Default::default()
        };
        if let Some(p) = settled {
            let d = &p.decomposition;
            f.settled_phase = Some(p.kind);
            f.settled_start_ms = Some(p.start_ms);
            f.settled_end_ms = Some(p.end_ms);
            f.settled_t_ms = Some(p.snapshot_t_ms);
            f.rss = d.rss;
            f.rss_minus_lazy_free = d.rss_minus_lazy_free;
            f.live = d.live;
            f.heap_size = d.heap_size;
            f.copy_reserve_and_slop = d.copy_reserve_and_slop;
            f.free_blocks = d.free_resident_pages;
            f.lazy_free = d.lazy_free;
            f.other_anon = d.other_anon;
            // The last census before the phase's end: the phase's own when it has one, and
            // when a short phase on a loaded machine fell between two censuses, the one
            // before it (the table shows when it was taken).
            let census = p
                .block_census
                .as_ref()
                .or_else(|| r.block_censuses.iter().rev().find(|c| c.t_ms <= p.end_ms))
                .or_else(|| r.block_censuses.iter().rev().find(|c| c.t_ms >= p.start_ms));
            f.census = census.map(|c| GhcCensusFigures {
                t_ms: c.t_ms,
                heap_size: c.heap_size,
                blocks_in_use: c.blocks_in_use,
                free_blocks: c.free_blocks,
                pinned_blocks: c.pinned_blocks,
                pinned_held: c
                    .kinds
                    .iter()
                    .find(|k| k.kind == "pinned")
                    .map_or(0, |k| k.held),
                pinned_live: c.pinned_live,
                sparse_megablocks: c.sparse_megablocks,
                pinned_occupancy: c.pinned_occupancy.clone(),
            });
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_are_per_field() {
        let runs: Vec<RunFigures> = [(10, Some(1.0)), (30, None), (20, Some(3.0))]
            .into_iter()
            .map(|(rss, w)| RunFigures {
                peak_rss: Some(rss),
                wall_ms: w,
                ..Default::default()
            })
            .collect();
        let m = RunFigures::median(&runs);
        assert_eq!(m.peak_rss, Some(20));
        assert_eq!(m.wall_ms, Some(1.0));
        assert_eq!(RunFigures::median(&runs[..2]).peak_rss, Some(10));
    }
}
