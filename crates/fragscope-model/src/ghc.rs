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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fragscope_ghc::{EventKind, Eventlog, HeapProfile};
use fragscope_trace::{Chunk, TraceReader};
use serde::Serialize;

use crate::ghc_blocks::{self, BlockCensus, BlockDiagnosis};
use crate::phases::{self, PhaseKind};
use fragscope_trace::records::{GhcBlocks, SnapshotReason};

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
    #[error("the trace references no GHC eventlog")]
    NoEventlog,
}

/// Points kept in the report's timeline.
const TIMELINE_POINTS: usize = 1200;
/// Heap-profile rows per phase (the rest is summed as "other").
const CLOSURE_TYPES_PER_PHASE: usize = 8;

/// True when `bytes` start like a GHC eventlog ("hdrb", the header-begin marker).
pub fn is_eventlog(bytes: &[u8]) -> bool {
    bytes.starts_with(b"hdrb")
}

/// The eventlog a trace references, resolved against the trace's directory.
pub fn referenced_eventlog(trace: &Path) -> Result<Option<PathBuf>, GhcError> {
    let mut reader = TraceReader::open(trace)?;
    Ok(match reader.next_chunk() {
        Some(Chunk::Meta(m)) => m.ghc_eventlog.map(|e| {
            let dir = trace.parent().unwrap_or(Path::new(""));
            dir.join(e)
        }),
        _ => None,
    })
}

/// The GHC report of an eventlog on its own (no RSS).
pub fn analyze_eventlog_file(path: &Path) -> Result<GhcReport, GhcError> {
    let log = read_eventlog(path)?;
    let mut report = analyze(&log, None, 0.0, &[]);
    report.source = path.display().to_string();
    report.eventlog = path.display().to_string();
    report.notes.insert(
        0,
        "read from an eventlog alone: no RSS was recorded, so the figures are the RTS's \
         (heap size, blocks, live data); record the program with `fragscope record` for RSS \
         and LazyFree"
            .into(),
    );
    Ok(report)
}

/// The GHC report of a recorded GHC program: its eventlog with stream 0's RSS.
pub fn analyze_trace(trace: &Path) -> Result<GhcReport, GhcError> {
    let eventlog = referenced_eventlog(trace)?.ok_or(GhcError::NoEventlog)?;
    let log = read_eventlog(&eventlog)?;
    let mut report = analyze_trace_with(trace, &log)?;
    report.eventlog = eventlog.display().to_string();
    Ok(report)
}

/// True when the trace's first snapshot of its first process came with a GHC block
/// census (or a note that none could be taken): a GHC program, recorded without an
/// eventlog. Reads only up to that snapshot.
pub fn has_ghc_census(trace: &Path) -> Result<bool, GhcError> {
    let mut reader = TraceReader::open(trace)?;
    let mut main_stream = None;
    // The census follows its snapshot's Pagemap chunk, from the census thread: a few
    // chunks later.
    let mut after_pagemap: Option<u32> = None;
    for _ in 0..100_000 {
        let Some(chunk) = reader.next_chunk() else {
            break;
        };
        match chunk {
            Chunk::Process(p) if main_stream.is_none() => main_stream = Some(p.stream),
            Chunk::GhcCensus(c) if Some(c.stream) == main_stream => return Ok(true),
            Chunk::Pagemap(p) if Some(p.stream) == main_stream => {
                after_pagemap.get_or_insert(0);
            }
            _ => {}
        }
        if let Some(n) = after_pagemap.as_mut() {
            *n += 1;
            if *n > 64 {
                break;
            }
        }
    }
    Ok(false)
}

/// Whether the trace's first process was already running when `record -p` attached.
fn first_process_attached(trace: &Path) -> bool {
    let Ok(mut reader) = TraceReader::open(trace) else {
        return false;
    };
    while let Some(chunk) = reader.next_chunk() {
        if let Chunk::Process(p) = chunk {
            return p.origin == fragscope_trace::Origin::Attached;
        }
    }
    false
}

/// The GHC report of a GHC program recorded without an eventlog: RSS and the RTS's
/// block censuses only.
pub fn analyze_trace_without_eventlog(trace: &Path) -> Result<GhcReport, GhcError> {
    let log = Eventlog {
        header: fragscope_ghc::Header::default(),
        events: Vec::new(),
        end: fragscope_ghc::End::Complete,
        corruption: None,
    };
    let mut report = analyze_trace_with(trace, &log)?;
    report.eventlog = String::new();
    // Said once, by the note below.
    report
        .notes
        .retain(|n| !n.contains("heap profile by closure type") && !n.contains("heap is unknown"));
    // The census's own note ends by sending the reader to the eventlog, which this
    // recording does not have.
    for n in &mut report.notes {
        if let Some(cut) = n.find("; the figures come from the eventlog alone") {
            n.truncate(cut);
        }
    }
    let figures = if report.block_censuses.is_empty() {
        "RSS alone"
    } else {
        "RSS and the RTS's block censuses"
    };
    let (note, missing) = match crate::census::snapshot_of(trace) {
        Some(c) => (
            format!(
                "a snapshot of a running program (fragscope snapshot), {}: one block census \
                 and RSS, with no history, so no eventlog figures, timeline or GC table \
                 (`fragscope record` the program for those){}",
                if c.stopped {
                    "held stopped while its block descriptors were read"
                } else {
                    "read without stopping it"
                },
                if c.stopped {
                    ""
                } else {
                    "; the block census always holds the program for its few milliseconds"
                }
            ),
            "a snapshot has no eventlog",
        ),
        None if first_process_attached(trace) => (
            format!(
                "recorded from the moment fragscope attached to the running program (record \
                 -p), whose RTS cannot be asked for an eventlog once it runs: the figures are \
                 {figures}; start it under `fragscope record` (built with `ghc -eventlog \
                 -rtsopts`) for live data, the heap's size over time and the GC table"
            ),
            "the program was attached to while running, when its RTS can no longer be asked \
             for an eventlog",
        ),
        None => (
            format!(
                "recorded without an eventlog (the program's RTS was not linked with \
                 -eventlog, or refused GHCRTS): the figures are {figures}; rebuild with `ghc \
                 -eventlog -rtsopts` for live data, the heap's size over time and the GC table"
            ),
            "the program's RTS wrote no eventlog (a binary built without -eventlog, or \
             without -rtsopts, whose RTS refuses GHCRTS)",
        ),
    };
    report.eventlog_figures_missing = Some(missing.into());
    report.notes.insert(0, note);
    Ok(report)
}

/// `(stream, argv)` of each process of a trace.
type Processes = Vec<(u32, Vec<String>)>;

/// The process of the trace that ran the GHC program: the first with a block census,
/// else the first whose program name is the eventlog's, else the first process. A
/// wrapper (a shell, a script, `stack exec`) comes first in the trace; the GHC program
/// is one of its children. `(stream, argv)` of each, and the chosen stream.
fn ghc_process(trace: &Path, log: &Eventlog) -> Result<(Processes, Option<u32>), GhcError> {
    let mut reader = TraceReader::open(trace)?;
    let mut processes: Vec<(u32, Vec<String>, String)> = Vec::new();
    let mut census = None;
    while let Some(chunk) = reader.next_chunk() {
        match chunk {
            Chunk::Process(p) => processes.push((p.stream, p.argv, p.exe)),
            Chunk::GhcCensus(c) if census.is_none() => census = Some(c.stream),
            _ => {}
        }
    }
    let name = |s: &str| Path::new(s).file_name().map(|n| n.to_os_string());
    let by_name = log
        .program_args()
        .and_then(|a| a.first())
        .and_then(|a| name(a))
        .and_then(|prog| {
            processes
                .iter()
                .find(|p| {
                    name(&p.2).as_ref() == Some(&prog)
                        || p.1.first().and_then(|a| name(a)).as_ref() == Some(&prog)
                })
                .map(|p| p.0)
        });
    let chosen = census.or(by_name).or(processes.first().map(|p| p.0));
    Ok((processes.into_iter().map(|p| (p.0, p.1)).collect(), chosen))
}

fn analyze_trace_with(trace: &Path, log: &Eventlog) -> Result<GhcReport, GhcError> {
    let (processes, ghc_stream) = ghc_process(trace, log)?;
    let mut reader = TraceReader::open(trace)?;
    let mut start_unix_ns = 0u64;
    let mut tick_ms = 1.0;
    let mut main_stream: Option<u32> = None;
    let mut start_tick = 0u64;
    let mut rss: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut lazy: Vec<(u64, u64)> = Vec::new();
    let mut censuses: Vec<(u64, SnapshotReason, GhcBlocks)> = Vec::new();
    let mut census_note: Option<String> = None;
    while let Some(chunk) = reader.next_chunk() {
        match chunk {
            Chunk::Meta(m) => {
                start_unix_ns = m.start_unix_ns;
                tick_ms = m.tick_ns as f64 / 1e6;
            }
            Chunk::Process(p) if main_stream.is_none() && Some(p.stream) == ghc_stream => {
                main_stream = Some(p.stream);
                start_tick = p.start_tick;
            }
            Chunk::Rss(b) if Some(b.stream) == main_stream => {
                rss.extend(b.samples.iter().map(|s| {
                    (
                        s.tick,
                        s.vm_rss_kib * 1024,
                        s.rss_anon_kib * 1024,
                        (s.rss_file_kib + s.rss_shmem_kib) * 1024,
                    )
                }))
            }
            Chunk::Rollup(r) if Some(r.stream) == main_stream => {
                lazy.push((r.tick, r.get("LazyFree").unwrap_or(0) * 1024))
            }
            Chunk::GhcCensus(c) if Some(c.stream) == main_stream => match c.result {
                Ok(b) => censuses.push((c.tick, c.reason, b)),
                Err(note) => {
                    census_note.get_or_insert(note);
                }
            },
            _ => {}
        }
    }
    rss.sort_by_key(|r| r.0);
    lazy.sort_by_key(|r| r.0);
    let points: Vec<RssPoint> = rss
        .iter()
        .map(|&(tick, rss, anon, file)| {
            // LazyFree is read every 100 ms: the latest reading at or before the sample.
            let i = lazy.partition_point(|l| l.0 <= tick);
            RssPoint {
                t_ms: tick as f64 * tick_ms,
                rss,
                rss_anon: anon,
                rss_file: file,
                lazy_free: if i > 0 { lazy[i - 1].1 } else { 0 },
                lazy_free_fresh: i > 0 && lazy[i - 1].0 == tick,
            }
        })
        .collect();
    // Eventlog times count from the RTS's start: placed on the trace's clock by the
    // wall-clock event when the log has it, else by the process's start.
    let offset_ms = log
        .events
        .iter()
        .find_map(|e| match e.kind {
            EventKind::WallClockTime {
                unix_seconds,
                nanoseconds,
                ..
            } if start_unix_ns > 0 => {
                let wall_ns = unix_seconds as f64 * 1e9 + f64::from(nanoseconds);
                Some((wall_ns - start_unix_ns as f64 - e.time_ns as f64) / 1e6)
            }
            _ => None,
        })
        .unwrap_or(start_tick as f64 * tick_ms)
        .max(0.0);
    let censuses: Vec<CensusInput> = censuses
        .into_iter()
        .map(|(tick, reason, blocks)| CensusInput {
            t_ms: tick as f64 * tick_ms,
            reason,
            blocks,
        })
        .collect();
    let mut report = analyze(
        log,
        if points.is_empty() {
            None
        } else {
            Some(&points)
        },
        offset_ms,
        &censuses,
    );
    if let Some(note) = census_note {
        report.notes.push(format!("no block census: {note}"));
    }
    report.source = trace.display().to_string();
    if let (Some(first), Some(stream)) = (processes.first(), ghc_stream) {
        if first.0 != stream {
            let argv = |s: u32| {
                processes
                    .iter()
                    .find(|p| p.0 == s)
                    .map_or_else(String::new, |p| p.1.join(" "))
            };
            report.notes.insert(
                0,
                format!(
                    "the GHC program is `{}`, run by `{}`: the report is that process's \
                     ({} processes in the trace)",
                    argv(stream),
                    first.1.join(" "),
                    processes.len()
                ),
            );
        }
    }
    if points.is_empty() {
        report
            .notes
            .push("the trace holds no RSS sample of the program".into());
    }
    Ok(report)
}

fn read_eventlog(path: &Path) -> Result<Eventlog, GhcError> {
    let bytes = std::fs::read(path).map_err(|source| GhcError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut log = Eventlog::parse_intact(&bytes).map_err(|source| GhcError::Eventlog {
        path: path.to_path_buf(),
        source,
    })?;
    log.sort_by_time();
    Ok(log)
}

/// The RTS's state after each event that changes it, in time order (ms on the RTS clock).
#[derive(Debug, Clone, Copy, Default)]
struct HeapState {
    t_ms: f64,
    live: Option<u64>,
    heap_size: Option<u64>,
    blocks_size: Option<u64>,
    gc_frag: Option<u64>,
    gc_slop: Option<u64>,
}

/// Analyses `log` (sorted by time). `rss` in time order on the recording's clock; the
/// eventlog's time 0 is `offset_ms` on that clock; so are the block `censuses`.
pub fn analyze(
    log: &Eventlog,
    rss: Option<&[RssPoint]>,
    offset_ms: f64,
    censuses: &[CensusInput],
) -> GhcReport {
    let mut states: Vec<HeapState> = Vec::new();
    let mut state = HeapState::default();
    let mut gc = GcAccumulator::default();
    for e in &log.events {
        let t_ms = e.time_ns as f64 / 1e6 + offset_ms;
        let before = (
            state.live,
            state.heap_size,
            state.blocks_size,
            state.gc_frag,
        );
        match &e.kind {
            EventKind::HeapLive { bytes, .. } => state.live = Some(*bytes),
            EventKind::HeapSize { bytes, .. } => state.heap_size = Some(*bytes),
            EventKind::BlocksSize { bytes, .. } => state.blocks_size = Some(*bytes),
            EventKind::GcStats(s) => {
                state.gc_frag = Some(s.frag_bytes);
                state.gc_slop = Some(s.slop_bytes);
            }
            _ => {}
        }
        gc.push(e, &state);
        if before
            != (
                state.live,
                state.heap_size,
                state.blocks_size,
                state.gc_frag,
            )
        {
            state.t_ms = t_ms;
            match states.last_mut() {
                Some(last) if last.t_ms == t_ms => *last = state,
                _ => states.push(state),
            }
        }
    }
    let end_ms = log
        .events
        .last()
        .map_or(0.0, |e| e.time_ns as f64 / 1e6 + offset_ms);
    let heap_at = |t_ms: f64| -> HeapState {
        let i = states.partition_point(|s| s.t_ms <= t_ms);
        if i == 0 {
            HeapState::default()
        } else {
            states[i - 1]
        }
    };
    // With RSS, a point per sample (every 10 ms); without, a point per change of the heap.
    let full: Vec<GhcPoint> = match rss {
        Some(rss) => rss
            .iter()
            .map(|r| point(r.t_ms, &heap_at(r.t_ms), Some(r)))
            .collect(),
        None => states.iter().map(|s| point(s.t_ms, s, None)).collect(),
    };
    let mut full = full;
    if rss.is_some() {
        mark_collections(&mut full, &collections(log, offset_ms));
    }
    let curve: Vec<(f64, u64, u64)> = full
        .iter()
        // VmRSS, not RSS minus LazyFree: a flat RSS over falling live data is the plateau
        // seed 000 describes, and LazyFree moves as the kernel pleases.
        .map(|p| {
            (
                p.t_ms,
                p.rss.or(p.heap_size).unwrap_or(0),
                p.live.unwrap_or(0),
            )
        })
        .collect();
    let block_censuses: Vec<BlockCensus> = censuses
        .iter()
        .map(|c| {
            let s = heap_at(c.t_ms);
            BlockCensus::new(
                c.t_ms,
                c.reason,
                &c.blocks,
                (s.heap_size, s.gc_frag, s.live),
            )
        })
        .collect();
    let profile = log.heap_profile();
    let mut spans = phases::detect(&curve);
    snap_to_steps(&mut spans, &curve);
    let last_end = spans.last().map_or(0.0, |s| s.end_ms);
    let mut phases: Vec<GhcPhase> = spans
        .into_iter()
        .map(|span| {
            // A phase holds the points from its start up to the next phase's start: the
            // point where the next one begins is that one's (the heap's figures are steps,
            // each holding until the next event).
            let inside_at: Vec<usize> = (0..full.len())
                .filter(|&i| {
                    full[i].t_ms >= span.start_ms
                        && (full[i].t_ms < span.end_ms
                            || (span.end_ms == last_end && full[i].t_ms <= span.end_ms))
                })
                .collect();
            let inside: Vec<&GhcPoint> = inside_at.iter().map(|&i| &full[i]).collect();
            // The phase is shown at its middle, or at the sample nearest it whose LazyFree
            // was read with it: a staler reading may predate the RTS's release of memory
            // and leave the released pages outside every part but `outside_live`.
            let middle = inside_at.len() / 2;
            let shown = rss
                .and_then(|rss| {
                    (0..inside_at.len())
                        .filter(|&k| rss[inside_at[k]].lazy_free_fresh)
                        .min_by_key(|&k| k.abs_diff(middle))
                })
                .unwrap_or(middle);
            // Without RSS the points are the heap's changes, bunched where it grows: the
            // middle moment of the phase, not its middle point.
            let middle_ms = (span.start_ms + span.end_ms) / 2.0;
            let mid = match rss {
                Some(_) => inside.get(shown).copied().cloned(),
                None => Some(point(middle_ms, &heap_at(middle_ms), None)),
            }
            .unwrap_or_else(|| point(span.start_ms, &heap_at(span.start_ms), None));
            let (census_t_ms, closure_types) = census_near(
                &profile,
                (span.start_ms - offset_ms, span.end_ms - offset_ms),
                mid.t_ms - offset_ms,
                offset_ms,
            );
            let block_census = block_censuses
                .iter()
                .filter(|c| c.t_ms >= span.start_ms && c.t_ms <= span.end_ms)
                .min_by(|a, b| {
                    (a.t_ms - mid.t_ms)
                        .abs()
                        .total_cmp(&(b.t_ms - mid.t_ms).abs())
                })
                .cloned();
            // Without the eventlog's heap figures, the block census gives the heap (its
            // megablocks and blocks in use), beside the RSS sample nearest it.
            let shown_point = match (&block_census, mid.heap_size) {
                (Some(c), None) => {
                    let at = inside
                        .iter()
                        .filter(|p| p.rss.is_some())
                        .min_by(|a, b| (a.t_ms - c.t_ms).abs().total_cmp(&(b.t_ms - c.t_ms).abs()))
                        .map_or_else(|| mid.clone(), |p| (*p).clone());
                    GhcPoint {
                        heap_size: Some(c.heap_size),
                        blocks_size: Some(c.blocks_in_use),
                        ..at
                    }
                }
                _ => mid.clone(),
            };
            GhcPhase {
                start_ms: span.start_ms,
                end_ms: span.end_ms,
                kind: span.kind,
                live_max: inside.iter().filter_map(|p| p.live).max().or(mid.live),
                live_end: inside.last().map_or(mid.live, |p| p.live),
                rss_max: inside.iter().filter_map(|p| p.rss).max(),
                heap_size_max: inside
                    .iter()
                    .filter_map(|p| p.heap_size)
                    .max()
                    .or(mid.heap_size),
                snapshot_t_ms: shown_point.t_ms,
                decomposition: decompose(&shown_point),
                census_t_ms,
                closure_types,
                pinned_note: None,
                block_census,
            }
        })
        .collect();
    let heap_known = states.iter().any(|s| s.heap_size.is_some());
    add_pinned_notes(&mut phases);
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
    let diagnosis = ghc_blocks::diagnose(&block_censuses, |t| heap_at(t).live);
    let headline = diagnosis
        .as_ref()
        .map(|d| d.headline.clone())
        .or_else(|| ghc_blocks::plain_headline(&block_censuses));
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

/// Moves each boundary between phases to the step it stands for: phase detection cuts
/// on a grid (up to 1000 cells over the run), so a boundary can fall a cell before the
/// collection that changed the heap, and the phase after it would then begin with the
/// figures before the change (an eventlog alone has a point only where the heap
/// changes). The boundary goes to the largest change of RSS (heap size without it) or
/// live data within two cells of it, among the points between its neighbours.
fn snap_to_steps(spans: &mut [phases::PhaseSpan], curve: &[(f64, u64, u64)]) {
    let (Some(first), Some(last)) = (curve.first(), curve.last()) else {
        return;
    };
    let cells = curve.len().clamp(2, 1000) - 1;
    let window = 2.0 * (last.0 - first.0) / cells as f64;
    let peak_rss = curve.iter().map(|p| p.1).max().unwrap_or(0).max(1) as f64;
    let peak_live = curve.iter().map(|p| p.2).max().unwrap_or(0).max(1) as f64;
    let change = |a: &(f64, u64, u64), b: &(f64, u64, u64)| {
        ((b.1 as f64 - a.1 as f64).abs() / peak_rss)
            .max((b.2 as f64 - a.2 as f64).abs() / peak_live)
    };
    for k in 1..spans.len() {
        let at = spans[k].start_ms;
        let (lo, hi) = (
            spans[k - 1].start_ms.max(at - window),
            spans[k].end_ms.min(at + window),
        );
        let best = (1..curve.len())
            .filter(|&i| curve[i].0 > lo && curve[i].0 < hi)
            .map(|i| (i, change(&curve[i - 1], &curve[i])))
            .filter(|&(_, c)| c > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((best, _)) = best {
            // A collection posts its figures in a few events a moment apart: the step
            // begins at the first of them.
            let mut i = best;
            while i > 1
                && curve[i - 1].0 > lo
                && curve[best].0 - curve[i - 1].0 < 1.0
                && change(&curve[i - 2], &curve[i - 1]) > 0.0
            {
                i -= 1;
            }
            spans[k - 1].end_ms = curve[i].0;
            spans[k].start_ms = curve[i].0;
        }
    }
}

fn point(t_ms: f64, s: &HeapState, r: Option<&RssPoint>) -> GhcPoint {
    GhcPoint {
        t_ms,
        live: s.live,
        heap_size: s.heap_size,
        blocks_size: s.blocks_size,
        gc_frag: s.gc_frag,
        gc_slop: s.gc_slop,
        rss: r.map(|r| r.rss),
        rss_anon: r.map(|r| r.rss_anon),
        rss_file: r.map(|r| r.rss_file),
        lazy_free: r.map(|r| r.lazy_free),
        rss_minus_lazy_free: r.map(|r| r.rss.saturating_sub(r.lazy_free)),
        to_space: None,
    }
}

/// The collections of `log` as (start, end) on the recording's clock: from a GC_START
/// to the GC_END that closes the last capability's part in it.
fn collections(log: &Eventlog, offset_ms: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut open = 0usize;
    let mut start = 0.0;
    for e in &log.events {
        let t = e.time_ns as f64 / 1e6 + offset_ms;
        match e.kind {
            EventKind::GcStart => {
                if open == 0 {
                    start = t;
                }
                open += 1;
            }
            EventKind::GcEnd if open > 0 => {
                open -= 1;
                if open == 0 {
                    out.push((start, t));
                }
            }
            _ => {}
        }
    }
    out
}

/// Anonymous memory beyond the heap and LazyFree at `p` (signed: megablocks not yet
/// touched are in the heap size but not in RSS).
fn anon_beyond_heap(p: &GhcPoint) -> Option<i64> {
    Some(p.rss_anon? as i64 - p.heap_size? as i64 - p.lazy_free? as i64)
}

/// Sets `to_space` of the points read inside a collection: the copying collector takes
/// megablocks for its to-space as it copies, and HEAP_SIZE counts them only once it
/// ends, so without this they would look like memory outside the heap.
fn mark_collections(points: &mut [GhcPoint], gcs: &[(f64, f64)]) {
    let inside = |t: f64| {
        let i = gcs.partition_point(|g| g.0 <= t);
        i > 0 && t <= gcs[i - 1].1
    };
    let flags: Vec<bool> = points.iter().map(|p| inside(p.t_ms)).collect();
    // What lies outside the heap at the nearest sample outside a collection, before
    // (else after) each point.
    let mut before = vec![None; points.len()];
    let mut last = None;
    for (i, p) in points.iter().enumerate() {
        if !flags[i] {
            last = anon_beyond_heap(p).or(last);
        }
        before[i] = last;
    }
    let mut next = None;
    for i in (0..points.len()).rev() {
        if !flags[i] {
            next = anon_beyond_heap(&points[i]).or(next);
            continue;
        }
        let Some(now) = anon_beyond_heap(&points[i]) else {
            continue;
        };
        let baseline = before[i].or(next).unwrap_or(0).max(0);
        points[i].to_space = Some((now - baseline).max(0) as u64);
    }
}

/// Splits one moment into the parts of the model (see [`GhcDecomposition`]): the heap's
/// parts need its size, the split of blocks in use needs live data, and the parts
/// outside the heap need RSS too.
pub fn decompose(p: &GhcPoint) -> GhcDecomposition {
    // Blocks handed out by the block allocator: reported on 9.2+, else heap size minus
    // the free blocks the last collection counted.
    let blocks_in_use = p.heap_size.map(|heap| match (p.blocks_size, p.gc_frag) {
        (Some(b), _) => b.min(heap),
        (None, Some(frag)) => heap.saturating_sub(frag),
        (None, None) => heap,
    });
    let live = p.live.map(|l| blocks_in_use.map_or(l, |b| l.min(b)));
    let mut d = GhcDecomposition {
        t_ms: p.t_ms,
        rss: p.rss,
        live,
        copy_reserve_and_slop: blocks_in_use.zip(live).map(|(b, l)| b - l),
        free_resident_pages: p.heap_size.zip(blocks_in_use).map(|(h, b)| h - b),
        lazy_free: p.lazy_free,
        heap_size: p.heap_size,
        blocks_size: p.blocks_size,
        gc_frag: p.gc_frag,
        gc_slop: p.gc_slop,
        rss_minus_lazy_free: p.rss_minus_lazy_free,
        outside_live: p.heap_size.zip(p.live).map(|(h, l)| h.saturating_sub(l)),
        ..Default::default()
    };
    let (Some(rss), Some(anon), Some(file), Some(lazy)) =
        (p.rss, p.rss_anon, p.rss_file, p.lazy_free)
    else {
        return d;
    };
    d.file = Some(file);
    d.outside_live = p.live.map(|l| rss.saturating_sub(lazy).saturating_sub(l));
    // Without a heap size every byte of RSS would look outside the heap.
    let Some(heap_size) = p.heap_size else {
        return d;
    };
    let to_space = p.to_space.unwrap_or(0);
    let non_heap = rss as i64 - heap_size as i64 - lazy as i64 - to_space as i64;
    let other_anon = (anon as i64 - heap_size as i64 - lazy as i64 - to_space as i64).max(0) as u64;
    // The heap's parts add up to heap size plus to-space whether or not live data is
    // known.
    let explained = heap_size + to_space + lazy + other_anon + file;
    d.copy_reserve_and_slop = d.copy_reserve_and_slop.map(|c| c + to_space);
    d.to_space = p.to_space;
    d.other_anon = Some(other_anon);
    d.unexplained = Some(rss as i64 - explained as i64);
    d.non_heap = Some(non_heap);
    d
}

/// The census within `span` (on the RTS clock) nearest `t_rts_ms`, largest labels first.
fn census_near(
    profile: &HeapProfile,
    span: (f64, f64),
    t_rts_ms: f64,
    offset_ms: f64,
) -> (Option<f64>, Vec<ClosureType>) {
    let within = |t_ns: u64| {
        let t = t_ns as f64 / 1e6;
        t >= span.0 && t <= span.1
    };
    let Some(sample) = profile
        .samples
        .iter()
        .filter(|s| within(s.time_ns))
        .min_by(|a, b| {
            let da = (a.time_ns as f64 / 1e6 - t_rts_ms).abs();
            let db = (b.time_ns as f64 / 1e6 - t_rts_ms).abs();
            da.total_cmp(&db)
        })
    else {
        return (None, Vec::new());
    };
    let mut by_label: BTreeMap<&str, u64> = BTreeMap::new();
    for e in &sample.entries {
        *by_label.entry(profile.label(e.label)).or_default() += e.residency_bytes;
    }
    let mut rows: Vec<ClosureType> = by_label
        .into_iter()
        .map(|(label, bytes)| ClosureType {
            label: label.to_owned(),
            bytes,
        })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    if rows.len() > CLOSURE_TYPES_PER_PHASE {
        let rest: u64 = rows[CLOSURE_TYPES_PER_PHASE..]
            .iter()
            .map(|r| r.bytes)
            .sum();
        rows.truncate(CLOSURE_TYPES_PER_PHASE);
        rows.push(ClosureType {
            label: "other".into(),
            bytes: rest,
        });
    }
    (Some(sample.time_ns as f64 / 1e6 + offset_ms), rows)
}

/// Seed 000: after a fall of live data, a plateau whose block census shows megablocks or
/// pinned blocks kept by a few survivors, or (without a census) where ARR_WORDS
/// dominates the -hT profile, points at pinned blocks kept whole by the few objects
/// still alive in them.
fn add_pinned_notes(phases: &mut [GhcPhase]) {
    const FALL: f64 = 0.7;
    const DOMINANT: f64 = 0.5;
    let mut earlier_live_max = 0u64;
    for phase in phases.iter_mut() {
        let total: u64 = phase.closure_types.iter().map(|c| c.bytes).sum();
        let arr_words = phase
            .closure_types
            .iter()
            .find(|c| c.label == "ARR_WORDS")
            .map_or(0, |c| c.bytes);
        // Without live data nothing is known to have fallen.
        let live = phase.decomposition.live;
        let fell = live.is_some_and(|l| (l as f64) < FALL * earlier_live_max as f64);
        if let Some(note) = phase
            .block_census
            .as_ref()
            .filter(|_| phase.kind == PhaseKind::Plateau && fell)
            .and_then(ghc_blocks::phase_note)
        {
            phase.pinned_note = Some(note);
        } else if phase.kind == PhaseKind::Plateau
            && total > 0
            && arr_words as f64 >= DOMINANT * total as f64
            && fell
        {
            phase.pinned_note = Some(format!(
                "ARR_WORDS is {:.0}% of the heap profile on this plateau, after live data fell \
                 from {} to {}: pinned blocks are the likely cause. Byte arrays of \
                 ByteString, Text and storable vectors are pinned; the RTS never moves pinned \
                 data and keeps a whole pinned block (and its megablock) while any object in it \
                 lives, and the heap profile counts such a block as live. Copy what you keep \
                 (Data.ByteString.copy) so the survivors share few blocks.",
                100.0 * arr_words as f64 / total as f64,
                mib(earlier_live_max),
                mib(live.unwrap_or(0))
            ));
        }
        earlier_live_max = earlier_live_max.max(phase.live_max.unwrap_or(0));
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// At most `n` points, evenly spaced, keeping the last.
fn thin<T: Clone>(v: Vec<T>, n: usize) -> Vec<T> {
    if v.len() <= n || n < 2 {
        return v;
    }
    let step = (v.len() - 1) as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| v[((i as f64 * step).round() as usize).min(v.len() - 1)].clone())
        .collect()
}

#[derive(Default)]
struct GcAccumulator {
    generations: BTreeMap<u16, GcGeneration>,
    gc_start_ns: Option<u64>,
    gc_end_ns: Option<u64>,
    allocated: BTreeMap<Option<u16>, u64>,
    copied: Option<u64>,
    max_residency: Option<u64>,
    memory_in_use: Option<u64>,
    frag_at_peak: Option<u64>,
    max_frag: Option<u64>,
    max_slop: Option<u64>,
    slop_underflowed: bool,
    oldest_generation: u16,
    live_before_stats: Option<u64>,
}

impl GcAccumulator {
    fn push(&mut self, e: &fragscope_ghc::Event, state: &HeapState) {
        match &e.kind {
            EventKind::HeapInfo(info) => {
                self.oldest_generation = info.generations.saturating_sub(1)
            }
            // Every capability takes part in a parallel collection: from the first start
            // to the last end.
            EventKind::GcStart => {
                self.gc_start_ns.get_or_insert(e.time_ns);
            }
            EventKind::GcEnd => self.gc_end_ns = Some(e.time_ns),
            EventKind::HeapAllocated { bytes, .. } => {
                self.allocated.insert(e.capability, *bytes);
            }
            EventKind::HeapLive { bytes, .. } => self.live_before_stats = Some(*bytes),
            EventKind::HeapSize { bytes, .. } if Some(*bytes) > self.memory_in_use => {
                self.memory_in_use = Some(*bytes);
                self.frag_at_peak = state.gc_frag;
            }
            EventKind::GcStats(s) => {
                let pause_ms = match (self.gc_start_ns, self.gc_end_ns) {
                    (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e6,
                    _ => 0.0,
                };
                self.gc_start_ns = None;
                self.gc_end_ns = None;
                let g = self
                    .generations
                    .entry(s.generation)
                    .or_insert(GcGeneration {
                        generation: s.generation,
                        collections: 0,
                        copied_bytes: 0,
                        gc_ms: 0.0,
                        max_pause_ms: 0.0,
                    });
                g.collections += 1;
                g.copied_bytes += s.copied_bytes;
                g.gc_ms += pause_ms;
                g.max_pause_ms = g.max_pause_ms.max(pause_ms);
                *self.copied.get_or_insert(0) += s.copied_bytes;
                // `-s` takes the slop of major collections only; a slop beyond the heap
                // is the RTS's count gone below zero, not a size.
                if s.generation >= self.oldest_generation {
                    let heap = state.heap_size.max(self.memory_in_use).unwrap_or(0);
                    if s.slop_bytes > heap {
                        self.slop_underflowed = true;
                    } else {
                        self.max_slop = self.max_slop.max(Some(s.slop_bytes));
                    }
                }
                // The free blocks at the largest heap are paired with its HEAP_SIZE, which
                // the RTS posts after this collection's stats (the heap size known here is
                // the previous collection's).
                self.max_frag = self.max_frag.max(Some(s.frag_bytes));
                // `-s` counts residency after major collections only.
                if s.generation >= self.oldest_generation {
                    if let Some(live) = self.live_before_stats {
                        self.max_residency = self.max_residency.max(Some(live));
                    }
                }
            }
            _ => {}
        }
    }

    /// `elapsed_ms`: the eventlog's time at its last event; `None` without events.
    fn finish(self, elapsed_ms: Option<f64>) -> GcTable {
        let gc_ms = (!self.generations.is_empty())
            .then(|| self.generations.values().map(|g| g.gc_ms).sum::<f64>());
        let elapsed_ms = elapsed_ms.map(|e| e.max(0.0));
        GcTable {
            generations: self.generations.into_values().collect(),
            elapsed_ms,
            gc_ms,
            mutator_ms: elapsed_ms.zip(gc_ms).map(|(e, g)| (e - g).max(0.0)),
            allocated_bytes: (!self.allocated.is_empty()).then(|| self.allocated.values().sum()),
            copied_bytes: self.copied,
            max_residency: self.max_residency,
            memory_in_use: self.memory_in_use,
            max_slop: if self.slop_underflowed {
                None
            } else {
                self.max_slop
            },
            slop_underflowed: self.slop_underflowed,
            fragmentation_at_peak: self.frag_at_peak,
            max_fragmentation: self.max_frag,
        }
    }
}

#[cfg(test)]
mod tests {
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
