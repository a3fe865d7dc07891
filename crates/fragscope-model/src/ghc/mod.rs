//! The model of a GHC program: its RSS decomposed with the RTS's own figures from the
//! eventlog (live data, blocks, megablocks, per-collection statistics, -hT censuses) and,
//! when the program was recorded, its RSS and LazyFree.
//!
//! The heap's three levels (seed 000) map onto the parts of the malloc model:
//! megablocks held = `heap_size` (HEAP_SIZE); free blocks inside them = block-level waste
//! (`free_resident_pages`: GC_STATS_GHC frag, or heap size minus BLOCKS_SIZE on 9.2+);
//! blocks in use minus live data = copy reserve, nursery, slop and not-yet-collected
//! objects (`copy_reserve_and_slop`); megablocks returned with MADV_FREE but still
//! counted in RSS = `lazy_free`; the rest of RSS is outside the heap.
//!
//! `recording` reads the files (an eventlog, a trace and the eventlog it references);
//! `series` follows the heap's figures over time; `decomposition` splits one moment;
//! `phase_table` finds and shows the phases; `gc_table` sums the collections.

mod decomposition;
mod gc_table;
mod phase_table;
mod recording;
mod series;

use std::path::PathBuf;

use fragscope_ghc::{Eventlog, HeapProfile};
use serde::Serialize;

use crate::ghc_blocks::{self, BlockCensus, BlockDiagnosis};
use crate::phases::PhaseKind;
use fragscope_trace::records::{GhcBlocks, SnapshotReason};

pub use decomposition::decompose;
pub use recording::{
    analyze_eventlog_file, analyze_trace, analyze_trace_without_eventlog, is_eventlog,
};

use phase_table::{add_pinned_notes, PhaseSources};
use series::{thin, HeapSeries};

/// A block census read from the trace, on the trace's clock.
#[derive(Debug, Clone)]
pub struct CensusInput {
    pub t_ms: f64,
    pub reason: SnapshotReason,
    pub blocks: GhcBlocks,
}

/// RSS at one moment, from the recording (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RssPoint {
    pub t_ms: f64,
    pub rss: u64,
    pub rss_anon: u64,
    /// File-backed and shared.
    pub rss_file: u64,
    pub lazy_free: u64,
    /// LazyFree was read with this sample (smaps_rollup is read every 100 ms, RSS every
    /// 10): otherwise `lazy_free` is the reading before, which may predate a release.
    pub lazy_free_fresh: bool,
}

/// One moment of the timeline: the RTS's figures (the latest posted at or before it)
/// and, when recorded, RSS. The RTS's figures are `None` until it posts them (HEAP_LIVE
/// at the first major collection, the others at the first collection), and with no
/// eventlog at all.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GhcPoint {
    pub t_ms: f64,
    /// HEAP_LIVE.
    pub live: Option<u64>,
    /// HEAP_SIZE: megablocks held.
    pub heap_size: Option<u64>,
    /// BLOCKS_SIZE (GHC 9.2+).
    pub blocks_size: Option<u64>,
    /// GC_STATS_GHC frag of the last collection.
    pub gc_frag: Option<u64>,
    pub gc_slop: Option<u64>,
    pub rss: Option<u64>,
    pub rss_anon: Option<u64>,
    pub rss_file: Option<u64>,
    pub lazy_free: Option<u64>,
    pub rss_minus_lazy_free: Option<u64>,
    /// Set for an RSS sample read during a collection (between the eventlog's GC_START
    /// and GC_END): the megablocks the collection took for its to-space, not yet in
    /// HEAP_SIZE (posted when it ends), estimated as the anonymous memory beyond the heap
    /// above what it was at the nearest sample outside a collection.
    pub to_space: Option<u64>,
}

/// RSS at one moment split into parts; without RSS (an eventlog made elsewhere) only the
/// heap's parts, which add up to `heap_size`. With RSS: `live + copy_reserve_and_slop +
/// free_resident_pages + lazy_free + other_anon + file + unexplained = rss`. A part the
/// figures do not give (no heap size, no live data yet) is `None`, never 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GhcDecomposition {
    pub t_ms: f64,
    pub rss: Option<u64>,
    pub live: Option<u64>,
    /// Blocks in use minus live data: the copy reserve, the nursery, slop at block ends
    /// and objects not yet collected; during a collection, its to-space too.
    pub copy_reserve_and_slop: Option<u64>,
    /// The moment fell inside a collection: of `copy_reserve_and_slop`, the megablocks
    /// taken for the to-space beyond HEAP_SIZE (see [`GhcPoint::to_space`]).
    pub to_space: Option<u64>,
    /// Block-level waste: free blocks inside the megablocks the heap holds.
    pub free_resident_pages: Option<u64>,
    pub lazy_free: Option<u64>,
    /// Anonymous memory outside the heap (stacks, the RTS's own malloc, foreign code).
    pub other_anon: Option<u64>,
    pub file: Option<u64>,
    pub unexplained: Option<i64>,
    pub heap_size: Option<u64>,
    pub blocks_size: Option<u64>,
    pub gc_frag: Option<u64>,
    pub gc_slop: Option<u64>,
    pub rss_minus_lazy_free: Option<u64>,
    /// Memory the program holds beyond its live data: RSS minus LazyFree minus live, or
    /// heap size minus live without RSS.
    pub outside_live: Option<u64>,
    /// RSS minus heap size minus LazyFree (signed: megablocks not yet touched are in the
    /// heap size but not in RSS).
    pub non_heap: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClosureType {
    pub label: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GhcPhase {
    pub start_ms: f64,
    pub end_ms: f64,
    pub kind: PhaseKind,
    pub live_max: Option<u64>,
    pub live_end: Option<u64>,
    pub rss_max: Option<u64>,
    pub heap_size_max: Option<u64>,
    /// The moment that `decomposition` describes: the phase's middle, or the RSS sample
    /// nearest it whose LazyFree was read with it.
    pub snapshot_t_ms: f64,
    pub decomposition: GhcDecomposition,
    /// The heap profile census nearest that moment, largest first.
    pub census_t_ms: Option<f64>,
    pub closure_types: Vec<ClosureType>,
    /// Set when ARR_WORDS dominates a plateau whose live data fell: the pinned-block
    /// explanation of seed 000.
    pub pinned_note: Option<String>,
    /// The block census nearest `snapshot_t_ms` inside the phase.
    pub block_census: Option<BlockCensus>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GcGeneration {
    pub generation: u16,
    pub collections: u64,
    pub copied_bytes: u64,
    /// GC_START to GC_END, elapsed.
    pub gc_ms: f64,
    pub max_pause_ms: f64,
}

/// The RTS's summary, as `+RTS -s` prints it, from the eventlog. A figure the eventlog
/// does not give (no eventlog, no collection, no major collection) is `None`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GcTable {
    pub generations: Vec<GcGeneration>,
    /// The eventlog's time at its last event (the RTS's clock starts with the program).
    pub elapsed_ms: Option<f64>,
    pub gc_ms: Option<f64>,
    pub mutator_ms: Option<f64>,
    pub allocated_bytes: Option<u64>,
    pub copied_bytes: Option<u64>,
    /// Largest live data after a major collection (`-s`: maximum residency).
    pub max_residency: Option<u64>,
    /// Largest heap size (`-s`: total memory in use).
    pub memory_in_use: Option<u64>,
    /// The largest slop a major collection reported (`-s`: maximum slop); `None`
    /// without a major collection, or when one reported a slop larger than the heap
    /// (`slop_underflowed`).
    pub max_slop: Option<u64>,
    /// A major collection reported a slop larger than the heap: the RTS's count
    /// underflowed, as the nonmoving collector's does in GHC 9.0.
    pub slop_underflowed: bool,
    /// GC_STATS_GHC frag when the heap was largest (`-s`: lost due to fragmentation).
    pub fragmentation_at_peak: Option<u64>,
    pub max_fragmentation: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GhcReport {
    /// The trace, or the eventlog when it was read on its own.
    pub source: String,
    pub eventlog: String,
    pub ghc_version: Option<String>,
    pub rts: Option<String>,
    pub argv: Vec<String>,
    /// The eventlog stops before its end marker (the program was killed).
    pub truncated: bool,
    pub damage: Option<String>,
    /// False for an eventlog made elsewhere: the figures are the RTS's alone.
    pub rss_recorded: bool,
    /// False when the eventlog holds no heap size (the program was killed before its
    /// first collection's events were written), or there is no eventlog: nothing is
    /// split out of RSS then.
    pub heap_known: bool,
    /// Why the eventlog's figures (live data, heap size, the GC table) are all unknown,
    /// when they are: said once where each would be shown.
    pub eventlog_figures_missing: Option<String>,
    pub notes: Vec<String>,
    pub duration_ms: f64,
    pub timeline: Vec<GhcPoint>,
    pub phases: Vec<GhcPhase>,
    pub gc: GcTable,
    /// The RTS's block censuses, read by the recorder at each snapshot (none for an
    /// eventlog alone, or a program whose RTS the census cannot read: `notes` says why).
    pub block_censuses: Vec<BlockCensus>,
    /// What holds the megablocks, from the censuses; `None` when nothing stands out.
    pub diagnosis: Option<BlockDiagnosis>,
    /// The report's first line: the diagnosis's, else what the largest census says
    /// (`None` without a census).
    pub headline: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GhcError {
    #[error(transparent)]
    Trace(#[from] fragscope_trace::TraceError),
    #[error("cannot read the eventlog {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a readable GHC eventlog: {source}")]
    Eventlog {
        path: PathBuf,
        source: fragscope_ghc::Error,
    },
}

/// Points kept in the report's timeline.
const TIMELINE_POINTS: usize = 1200;
/// Heap-profile rows per phase (the rest is summed as "other").
const CLOSURE_TYPES_PER_PHASE: usize = 8;

/// Analyses `log` (sorted by time). `rss` in time order on the recording's clock; the
/// eventlog's time 0 is `offset_ms` on that clock; so are the block `censuses`.
pub fn analyze(
    log: &Eventlog,
    rss: Option<&[RssPoint]>,
    offset_ms: f64,
    censuses: &[CensusInput],
) -> GhcReport {
    let series = HeapSeries::read(log, offset_ms);
    let full = series.points(log, rss, offset_ms);
    let curve = series::curve(&full);
    let block_censuses = series.block_censuses(censuses);
    let profile = log.heap_profile();
    let mut phases = PhaseSources {
        full: &full,
        rss,
        series: &series,
        profile: &profile,
        block_censuses: &block_censuses,
        offset_ms,
    }
    .phases(&curve);
    let heap_known = series.heap_known();
    add_pinned_notes(&mut phases);
    let notes = notes(log, &block_censuses, &profile, heap_known);
    let diagnosis = ghc_blocks::diagnose(&block_censuses, |t| series.at(t).live);
    let headline = diagnosis
        .as_ref()
        .map(|d| d.headline.clone())
        .or_else(|| ghc_blocks::plain_headline(&block_censuses));
    let HeapSeries { gc, end_ms, .. } = series;
    GhcReport {
        source: String::new(),
        eventlog: String::new(),
        ghc_version: log.ghc_version().map(str::to_owned),
        rts: log.rts_identifier().map(str::to_owned),
        argv: log
            .program_args()
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
        truncated: log.is_truncated(),
        damage: log.corruption.as_ref().map(|e| e.to_string()),
        rss_recorded: rss.is_some(),
        heap_known,
        eventlog_figures_missing: (!heap_known).then(|| {
            "the eventlog holds none (the program ended, or was killed, before the RTS \
             wrote its first collection's events)"
                .into()
        }),
        notes,
        duration_ms: end_ms.max(full.last().map_or(0.0, |p| p.t_ms)),
        timeline: thin(full, TIMELINE_POINTS),
        phases,
        gc: gc.finish((!log.events.is_empty()).then_some(end_ms - offset_ms)),
        block_censuses,
        diagnosis,
        headline,
    }
}

/// What the report cannot tell, and why.
fn notes(
    log: &Eventlog,
    block_censuses: &[BlockCensus],
    profile: &HeapProfile,
    heap_known: bool,
) -> Vec<String> {
    let mut notes = Vec::new();
    // A stripped program: what its censuses could not tell, once (the last one's count).
    notes.extend(
        block_censuses
            .last()
            .and_then(BlockCensus::without_symbols_note),
    );
    if log.is_truncated() {
        // The start-up facts come first in a log: a log cut later still has them.
        let missing = log.ghc_version().is_none() || log.program_args().is_none();
        notes.push(format!(
            "the eventlog stops before its end marker (the program was killed, or ended \
             without the RTS's shutdown): it is read to its last whole event{}",
            if missing {
                ", and the RTS's start-up facts (version, arguments) are missing"
            } else {
                ""
            }
        ));
    }
    if profile.samples.is_empty() {
        notes.push(
            "the eventlog has no heap profile by closure type (`fragscope record \
             --ghc-heap-profile`, or +RTS -hT, adds one, at the cost of a major collection \
             per census)"
                .into(),
        );
    }
    if !heap_known {
        notes.push(
            "the eventlog holds no heap figures (the program ended, or was killed, before \
             the RTS wrote its first collection's events): the heap is unknown, so RSS is \
             not split into heap and outside it"
                .into(),
        );
    }
    notes
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use fragscope_ghc::EventKind;

    use super::recording::read_eventlog;
    use super::series::collections;
    use super::*;

    #[test]
    fn the_parts_add_up_to_rss() {
        let p = GhcPoint {
            t_ms: 1.0,
            live: Some(100),
            heap_size: Some(1000),
            blocks_size: None,
            gc_frag: Some(300),
            gc_slop: Some(5),
            rss: Some(2000),
            rss_anon: Some(1800),
            rss_file: Some(200),
            lazy_free: Some(500),
            rss_minus_lazy_free: Some(1500),
            to_space: None,
        };
        let d = decompose(&p);
        assert_eq!(d.live, Some(100));
        assert_eq!(d.free_resident_pages, Some(300));
        assert_eq!(d.copy_reserve_and_slop, Some(600));
        assert_eq!(d.other_anon, Some(300));
        assert_eq!(d.unexplained, Some(0));
        assert_eq!(d.outside_live, Some(1400));
        let sum = d.live.unwrap()
            + d.copy_reserve_and_slop.unwrap()
            + d.free_resident_pages.unwrap()
            + d.lazy_free.unwrap()
            + d.other_anon.unwrap()
            + d.file.unwrap();
        assert_eq!(sum as i64 + d.unexplained.unwrap(), 2000);
    }

    /// RSS every 10 ms and LazyFree every 100 ms, as recorded: a phase is shown at a
    /// sample whose LazyFree was read with it, not at a staler reading that may predate
    /// the RTS's release of memory.
    #[test]
    fn phases_are_shown_where_lazy_free_was_read() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-take-200000.eventlog");
        let log = read_eventlog(&path).unwrap();
        let end_ms = log.events.iter().map(|e| e.time_ns).max().unwrap() as f64 / 1e6;
        const MIB: u64 = 1 << 20;
        let rss: Vec<RssPoint> = (0..=(end_ms / 10.0) as u64 + 1)
            .map(|i| {
                let fresh = i % 10 == 0;
                RssPoint {
                    t_ms: i as f64 * 10.0,
                    rss: 400 * MIB,
                    rss_anon: 390 * MIB,
                    rss_file: 10 * MIB,
                    // The stale readings stand for ones taken before a release.
                    lazy_free: if fresh { 100 * MIB } else { 0 },
                    lazy_free_fresh: fresh,
                }
            })
            .collect();
        let report = analyze(&log, Some(&rss), 0.0, &[]);
        let mut checked = 0;
        for phase in &report.phases {
            let holds_a_reading = rss
                .iter()
                .any(|r| r.lazy_free_fresh && r.t_ms >= phase.start_ms && r.t_ms <= phase.end_ms);
            if holds_a_reading {
                assert_eq!(phase.snapshot_t_ms % 100.0, 0.0, "{phase:?}");
                assert_eq!(phase.decomposition.lazy_free, Some(100 * MIB));
                checked += 1;
            }
        }
        assert!(checked >= 2, "{:?}", report.phases);
    }

    /// The RTS posts a collection's GC_STATS_GHC before its HEAP_SIZE: the free blocks at
    /// the largest heap are those of the collection that posted that heap size, not of
    /// the one after it.
    #[test]
    fn free_blocks_at_the_largest_heap_come_from_the_same_collection() {
        for name in [
            "pinned-strip-200000.eventlog",
            "pinned-take-200000.eventlog",
        ] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fragscope-ghc/tests/fixtures")
                .join(name);
            let log = read_eventlog(&path).unwrap();
            // (heap size, frag of the stats posted last before it), per HEAP_SIZE.
            let mut frag = None;
            let mut pairs = Vec::new();
            for e in &log.events {
                match &e.kind {
                    EventKind::GcStats(s) => frag = Some(s.frag_bytes),
                    EventKind::HeapSize { bytes, .. } => pairs.push((*bytes, frag)),
                    _ => {}
                }
            }
            let largest = pairs.iter().map(|p| p.0).max().unwrap();
            let (_, expected) = pairs.iter().find(|p| p.0 == largest).unwrap();
            let report = analyze(&log, None, 0.0, &[]);
            assert_eq!(report.gc.memory_in_use, Some(largest));
            assert_eq!(
                report.gc.fragmentation_at_peak, *expected,
                "{name}: {pairs:?}"
            );
        }
    }

    /// `+RTS -s` reports the largest slop of major collections; a minor collection's may
    /// be larger. A slop beyond the heap is an underflow, shown as unknown.
    #[test]
    fn maximum_slop_is_that_of_major_collections() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-strip-200000.eventlog");
        let mut log = read_eventlog(&path).unwrap();
        let major_max = log
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::GcStats(s) if s.generation >= 1 => Some(s.slop_bytes),
                _ => None,
            })
            .max()
            .unwrap();
        // A minor collection with more slop than any major one.
        let minor = log
            .events
            .iter_mut()
            .find_map(|e| match &mut e.kind {
                EventKind::GcStats(s) if s.generation == 0 => Some(s),
                _ => None,
            })
            .unwrap();
        minor.slop_bytes = major_max + 4096;
        assert_eq!(analyze(&log, None, 0.0, &[]).gc.max_slop, Some(major_max));
        let major = log
            .events
            .iter_mut()
            .find_map(|e| match &mut e.kind {
                EventKind::GcStats(s) if s.generation == 1 => Some(s),
                _ => None,
            })
            .unwrap();
        major.slop_bytes = u64::MAX - 4095;
        assert_eq!(analyze(&log, None, 0.0, &[]).gc.max_slop, None);
    }

    /// A log cut after its start-up events keeps them (the RTS writes them from a buffer
    /// it flushes late, at exit for a short run): only a log without them says so.
    #[test]
    fn a_cut_eventlog_says_what_is_missing() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-take-200000.eventlog");
        let bytes = std::fs::read(path).unwrap();
        // Every event, but not the end-of-data marker (a 16-bit 0xffff).
        let late = Eventlog::parse_intact(&bytes[..bytes.len() - 2]).unwrap();
        assert!(late.ghc_version().is_some());
        assert!(late.is_truncated());
        let notes = analyze(&late, None, 0.0, &[]).notes;
        let cut = notes
            .iter()
            .find(|n| n.contains("stops before its end"))
            .unwrap();
        assert!(!cut.contains("missing"), "{cut}");
        // Just past the header: no event at all.
        let header_end = bytes.windows(4).position(|w| w == b"datb").unwrap() + 4;
        let early = Eventlog::parse_intact(&bytes[..header_end]).unwrap();
        let notes = analyze(&early, None, 0.0, &[]).notes;
        let cut = notes
            .iter()
            .find(|n| n.contains("stops before its end"))
            .unwrap();
        assert!(cut.contains("start-up facts"), "{cut}");
    }

    /// A program killed before the RTS wrote a heap event: its RSS is not filed outside
    /// a heap of 0 bytes.
    #[test]
    fn a_log_without_heap_events_leaves_the_heap_unknown() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-take-200000.eventlog");
        let bytes = std::fs::read(path).unwrap();
        let header_end = bytes.windows(4).position(|w| w == b"datb").unwrap() + 4;
        let log = Eventlog::parse_intact(&bytes[..header_end]).unwrap();
        const MIB: u64 = 1 << 20;
        let rss: Vec<RssPoint> = (0..100)
            .map(|i| RssPoint {
                t_ms: i as f64 * 10.0,
                rss: 310 * MIB,
                rss_anon: 300 * MIB,
                rss_file: 10 * MIB,
                lazy_free: 0,
                lazy_free_fresh: true,
            })
            .collect();
        let r = analyze(&log, Some(&rss), 0.0, &[]);
        assert!(!r.heap_known);
        assert!(
            r.notes.iter().any(|n| n.contains("the heap is unknown")),
            "{:?}",
            r.notes
        );
        assert!(!r.phases.is_empty());
        for p in &r.phases {
            assert_eq!(p.decomposition.other_anon, None, "{p:?}");
            assert_eq!(p.decomposition.rss, Some(310 * MIB));
        }
    }

    /// Without an eventlog (a program built without -eventlog) every figure the RTS
    /// would have posted is unknown, not 0; RSS's own figures are still there.
    #[test]
    fn without_an_eventlog_its_figures_are_unknown() {
        let log = Eventlog {
            header: fragscope_ghc::Header::default(),
            events: Vec::new(),
            end: fragscope_ghc::End::Complete,
            corruption: None,
        };
        const MIB: u64 = 1 << 20;
        let rss: Vec<RssPoint> = (0..300)
            .map(|i| RssPoint {
                t_ms: i as f64 * 10.0,
                rss: if i < 100 { 20 * MIB } else { 90 * MIB },
                rss_anon: if i < 100 { 17 * MIB } else { 87 * MIB },
                rss_file: 3 * MIB,
                lazy_free: if i < 200 { 0 } else { 15 * MIB },
                lazy_free_fresh: true,
            })
            .collect();
        let r = analyze(&log, Some(&rss), 0.0, &[]);
        assert!(!r.heap_known);
        assert!(r.eventlog_figures_missing.is_some());
        for p in &r.timeline {
            assert_eq!((p.live, p.heap_size), (None, None), "{p:?}");
            assert!(p.rss.is_some());
        }
        assert!(r.phases.len() >= 2, "{:?}", r.phases);
        for p in &r.phases {
            assert_eq!(
                (p.live_max, p.live_end, p.heap_size_max),
                (None, None, None)
            );
            let d = &p.decomposition;
            assert_eq!(
                (
                    d.live,
                    d.copy_reserve_and_slop,
                    d.free_resident_pages,
                    d.heap_size
                ),
                (None, None, None, None),
                "{d:?}"
            );
            assert_eq!(
                (d.outside_live, d.other_anon, d.unexplained),
                (None, None, None)
            );
            assert_eq!(d.file, Some(3 * MIB));
            assert!(d.rss.is_some() && d.lazy_free.is_some(), "{d:?}");
        }
        let g = &r.gc;
        assert!(g.generations.is_empty());
        assert_eq!((g.elapsed_ms, g.gc_ms, g.mutator_ms), (None, None, None));
        assert_eq!(
            (
                g.allocated_bytes,
                g.copied_bytes,
                g.max_residency,
                g.memory_in_use,
                g.max_slop,
                g.fragmentation_at_peak,
                g.max_fragmentation
            ),
            (None, None, None, None, None, None, None)
        );
    }

    /// Live data is unknown until the RTS posts it, at its first major collection: the
    /// moments before read as unknown, the ones after as the RTS's figures.
    #[test]
    fn live_data_is_unknown_before_the_first_major_collection() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-take-200000.eventlog");
        let log = read_eventlog(&path).unwrap();
        let first_live_ms = log
            .events
            .iter()
            .find(|e| matches!(e.kind, EventKind::HeapLive { .. }))
            .map(|e| e.time_ns as f64 / 1e6)
            .unwrap();
        let rss: Vec<RssPoint> = (0..100)
            .map(|i| RssPoint {
                t_ms: i as f64 * 0.5,
                rss: 30 << 20,
                rss_anon: 28 << 20,
                rss_file: 2 << 20,
                lazy_free: 0,
                lazy_free_fresh: true,
            })
            .collect();
        let r = analyze(&log, Some(&rss), 0.0, &[]);
        let (before, after): (Vec<&GhcPoint>, Vec<&GhcPoint>) =
            r.timeline.iter().partition(|p| p.t_ms < first_live_ms);
        assert!(!before.is_empty() && !after.is_empty());
        assert!(before.iter().all(|p| p.live.is_none()), "{before:?}");
        assert!(after.iter().all(|p| p.live.is_some()), "{after:?}");
        assert!(r.gc.max_residency.is_some() && r.gc.memory_in_use.is_some());
        assert!(r.gc.gc_ms.is_some() && r.gc.copied_bytes.is_some());
    }

    /// RSS read during a collection holds the to-space's megablocks, which HEAP_SIZE
    /// counts only once the collection ends: they are the heap's copy reserve, not
    /// memory outside the heap.
    #[test]
    fn the_to_space_of_a_collection_in_progress_is_heap() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fragscope-ghc/tests/fixtures/pinned-strip-200000.eventlog");
        let log = read_eventlog(&path).unwrap();
        let gcs = collections(&log, 0.0);
        let longest = *gcs
            .iter()
            .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
            .unwrap();
        assert!(longest.1 - longest.0 > 4.0, "{longest:?}");
        let end_ms = log.events.iter().map(|e| e.time_ns).max().unwrap() as f64 / 1e6;
        const MIB: u64 = 1 << 20;
        let samples = |anon: &dyn Fn(f64) -> u64| -> Vec<RssPoint> {
            (0..(end_ms / 1.0) as u64)
                .map(|i| {
                    let t_ms = i as f64;
                    RssPoint {
                        t_ms,
                        rss: anon(t_ms) + 5 * MIB,
                        rss_anon: anon(t_ms),
                        rss_file: 5 * MIB,
                        lazy_free: 0,
                        lazy_free_fresh: true,
                    }
                })
                .collect()
        };
        // The heap size at each sample, then RSS: the heap, 3 MiB outside it, and 40 MiB
        // of to-space during the longest collection.
        let heap = analyze(&log, Some(&samples(&|_| 0)), 0.0, &[]).timeline;
        let heap_at = |t: f64| {
            let p = heap.iter().find(|p| p.t_ms == t).unwrap();
            p.heap_size.unwrap_or(0)
        };
        let during = |t: f64| t > longest.0 && t < longest.1;
        let rss = samples(&|t| heap_at(t) + 3 * MIB + if during(t) { 40 * MIB } else { 0 });
        let r = analyze(&log, Some(&rss), 0.0, &[]);
        let mut inside = 0;
        for p in &r.timeline {
            let d = decompose(p);
            // Before the RTS posts a heap size nothing is split out of RSS.
            if p.heap_size.is_none() {
                assert_eq!((d.other_anon, d.unexplained), (None, None), "{p:?}");
                continue;
            }
            assert_eq!(d.other_anon, Some(3 * MIB), "{p:?}");
            assert_eq!(d.unexplained, Some(0), "{p:?}");
            if during(p.t_ms) {
                assert_eq!(d.to_space, Some(40 * MIB), "{p:?}");
                assert!(d.copy_reserve_and_slop.unwrap() >= 40 * MIB);
                inside += 1;
            }
        }
        assert!(inside >= 3, "{longest:?}");
    }

    /// An eventlog alone, shaped like seed 001's server: live data built in many small
    /// steps over 90 ms, held to 1.61 s, then a fall to 0.8 MiB held to 4.63 s.
    fn a_server_eventlog() -> Eventlog {
        const MIB: u64 = 1 << 20;
        let mut events = Vec::new();
        let mut push = |t_ms: f64, kind: EventKind| {
            events.push(fragscope_ghc::Event {
                time_ns: (t_ms * 1e6) as u64,
                capability: Some(0),
                kind,
            })
        };
        let mut at = |t_ms: f64, live: u64, heap: u64| {
            push(
                t_ms,
                EventKind::HeapLive {
                    heap_capset: 0,
                    bytes: live,
                },
            );
            push(
                t_ms + 0.001,
                EventKind::HeapSize {
                    heap_capset: 0,
                    bytes: heap,
                },
            );
        };
        for i in 1..=200u64 {
            at(
                i as f64 * 0.45,
                (i * 350) << 10,
                10 * MIB + ((i * 385) << 10),
            );
        }
        at(1610.5, 816 << 10, 87 * MIB);
        at(1610.6, 816 << 10, 71 * MIB);
        at(4633.5, 43 << 10, 10 * MIB);
        Eventlog {
            header: fragscope_ghc::Header::default(),
            events,
            end: fragscope_ghc::End::Complete,
            corruption: None,
        }
    }

    /// A phase's figures are those of its own span: the plateau after the fall does not
    /// report the live data held before it, and is shown at its middle moment.
    #[test]
    fn phases_of_an_eventlog_alone_hold_their_own_figures() {
        let r = analyze(&a_server_eventlog(), None, 0.0, &[]);
        let last = r.phases.last().unwrap();
        assert!(r.phases.len() >= 2, "{:?}", r.phases);
        assert_eq!(last.start_ms, 1610.5, "{:?}", r.phases);
        assert_eq!(r.phases[r.phases.len() - 2].end_ms, 1610.5);
        assert_eq!(last.live_max, Some(816 << 10), "{last:?}");
        assert!((2500.0..3500.0).contains(&last.snapshot_t_ms), "{last:?}");
        let before = &r.phases[r.phases.len() - 2];
        assert_eq!(before.live_max, Some((200 * 350) << 10), "{before:?}");
        assert_eq!(before.live_end, Some((200 * 350) << 10), "{before:?}");
    }

    #[test]
    fn blocks_size_wins_over_frag_when_present() {
        let p = GhcPoint {
            t_ms: 0.0,
            live: Some(10),
            heap_size: Some(100),
            blocks_size: Some(60),
            gc_frag: Some(10),
            gc_slop: None,
            rss: None,
            rss_anon: None,
            rss_file: None,
            lazy_free: None,
            rss_minus_lazy_free: None,
            to_space: None,
        };
        let d = decompose(&p);
        assert_eq!(
            (d.free_resident_pages, d.copy_reserve_and_slop),
            (Some(40), Some(50))
        );
        assert_eq!(d.outside_live, Some(90));
        assert_eq!(d.unexplained, None);
    }
}
