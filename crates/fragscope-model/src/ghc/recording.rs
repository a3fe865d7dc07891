//! The files a GHC report reads: an eventlog alone, or a trace with the eventlog it
//! references (or none), and which of its processes ran the GHC program.

use std::path::Path;

use fragscope_ghc::{EventKind, Eventlog};
use fragscope_trace::{Chunk, TraceReader};

use fragscope_trace::records::{GhcBlocks, SnapshotReason};

use super::{analyze, CensusInput, GhcError, GhcReport, RssPoint};

/// True when `bytes` start like a GHC eventlog ("hdrb", the header-begin marker).
pub fn is_eventlog(bytes: &[u8]) -> bool {
    bytes.starts_with(b"hdrb")
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

/// The GHC report of a recorded GHC program: its `eventlog` (the one the trace's
/// metadata names) with stream 0's RSS.
pub fn analyze_trace(trace: &Path, eventlog: &Path) -> Result<GhcReport, GhcError> {
    let log = read_eventlog(eventlog)?;
    let mut report = analyze_trace_with(trace, &log)?;
    report.eventlog = eventlog.display().to_string();
    Ok(report)
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

pub(super) fn read_eventlog(path: &Path) -> Result<Eventlog, GhcError> {
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
