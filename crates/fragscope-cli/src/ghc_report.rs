//! `fragscope report` for a GHC program: its eventlog (with RSS when it was recorded).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use fragscope_model::ghc::{self, GhcDecomposition, GhcReport};

use crate::input::Input;
use crate::units::{bytes, count};

/// Rows of the terminal timeline.
const TIMELINE_ROWS: usize = 16;

/// The GHC report of `path` when it is an eventlog or a GHC program's recording; `None`
/// to fall through to the malloc report.
pub fn run_if_ghc(
    path: &Path,
    input: &Input,
    json: bool,
    html: Option<&Path>,
) -> Result<Option<ExitCode>> {
    let Some(report) = load(path, input)? else {
        return Ok(None);
    };
    if let Some(out) = html {
        crate::html::write_ghc(out, &report)?;
        eprintln!("fragscope: wrote {}", out.display());
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if html.is_none() {
        print!("{}", render(&report));
    }
    Ok(Some(ExitCode::SUCCESS))
}

/// The GHC model of `path` when it is an eventlog or a GHC program's recording; `None`
/// for any other trace (the malloc model's input).
pub fn load(path: &Path, input: &Input) -> Result<Option<GhcReport>> {
    let report = match input {
        Input::Eventlog => ghc::analyze_eventlog_file(path),
        Input::GhcRecording {
            eventlog: Some(eventlog),
            ..
        } => ghc::analyze_trace(path, eventlog),
        Input::GhcRecording { eventlog: None, .. } => ghc::analyze_trace_without_eventlog(path),
        Input::Trace(_) => return Ok(None),
    };
    report
        .map(Some)
        .with_context(|| format!("analysing {}", path.display()))
}

fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// How the text shows a figure the report does not have.
const UNKNOWN: &str = "\u{2013}";

fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| UNKNOWN.into(), bytes)
}

fn opt_secs(ms: Option<f64>) -> String {
    ms.map_or_else(|| UNKNOWN.into(), secs)
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        UNKNOWN.into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

/// The whole terminal report.
pub fn render(r: &GhcReport) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "fragscope report: {} (GHC program)", r.source);
    if !r.eventlog.is_empty() {
        let _ = writeln!(o, "  eventlog: {}", r.eventlog);
    }
    if !r.argv.is_empty() {
        let _ = writeln!(o, "  program:  {}", r.argv.join(" "));
    }
    if let Some(rts) = &r.rts {
        let _ = writeln!(o, "  RTS:      {rts}");
    }
    let _ = writeln!(o, "  duration: {}", secs(r.duration_ms));
    if let Some(d) = &r.damage {
        let _ = writeln!(o, "  damage:   {d} (the events before it are analysed)");
    }
    for n in &r.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    if let Some(d) = &r.diagnosis {
        let _ = writeln!(o, "\n{}", d.headline);
        for line in &d.details {
            let _ = writeln!(o, "  {line}");
        }
        for a in &d.advice {
            let _ = writeln!(o, "  - {a}");
        }
    } else if let Some(h) = &r.headline {
        let _ = writeln!(o, "\n{h}");
    }

    render_timeline(&mut o, r);
    render_phases(&mut o, r);
    render_block_censuses(&mut o, r);
    render_gc(&mut o, r);
    o
}

/// Why the eventlog's figures are missing, for the one line that replaces them.
fn missing_figures(r: &GhcReport, what: &str) -> String {
    format!(
        "no {what}: {}",
        r.eventlog_figures_missing
            .as_deref()
            .unwrap_or("the eventlog holds none")
    )
}

fn render_timeline(o: &mut String, r: &GhcReport) {
    let madv_free = if r.rss_recorded {
        "; the RTS returns memory with MADV_FREE, so VmRSS alone may not fall"
    } else {
        ""
    };
    // A column the eventlog would fill, empty in every row, is one line instead.
    if r.timeline
        .iter()
        .all(|p| p.live.is_none() && p.heap_size.is_none())
    {
        let _ = writeln!(
            o,
            "\nTimeline (RSS only{madv_free})\n  {}",
            missing_figures(r, "live data or heap size")
        );
        let _ = writeln!(
            o,
            "  {:>8}  {:>11}  {:>15}",
            "time", "RSS", "RSS - LazyFree"
        );
        for (t_ms, i) in timeline_rows(r) {
            let p = &r.timeline[i];
            let _ = writeln!(
                o,
                "  {:>8}  {:>11}  {:>15}",
                secs(t_ms),
                opt_bytes(p.rss),
                opt_bytes(p.rss_minus_lazy_free)
            );
        }
        return;
    }
    let _ = writeln!(
        o,
        "\nTimeline (live = HEAP_LIVE, heap = HEAP_SIZE megablocks{}{madv_free})",
        if r.timeline.iter().any(|p| p.blocks_size.is_some()) {
            ", blocks = BLOCKS_SIZE"
        } else {
            ""
        },
    );
    let _ = writeln!(
        o,
        "  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>15}",
        "time", "live", "blocks", "heap", "GC frag", "RSS", "RSS - LazyFree"
    );
    for (t_ms, i) in timeline_rows(r) {
        let p = &r.timeline[i];
        let _ = writeln!(
            o,
            "  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>15}",
            secs(t_ms),
            opt_bytes(p.live),
            opt_bytes(p.blocks_size),
            opt_bytes(p.heap_size),
            opt_bytes(p.gc_frag),
            opt_bytes(p.rss),
            opt_bytes(p.rss_minus_lazy_free)
        );
    }
}

fn render_phases(o: &mut String, r: &GhcReport) {
    let _ = writeln!(o, "\nPhases");
    if !r.heap_known {
        let _ = writeln!(
            o,
            "  {}; the phases show RSS{}",
            missing_figures(r, "heap figures"),
            if r.block_censuses.is_empty() {
                ""
            } else {
                " and the block censuses"
            }
        );
    }
    for (i, ph) in r.phases.iter().enumerate() {
        let heap = if r.heap_known {
            format!(
                ": live up to {}, heap up to {}",
                opt_bytes(ph.live_max),
                opt_bytes(ph.heap_size_max)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "\n  {} {} {} - {}{heap}{}",
            i + 1,
            ph.kind.name(),
            secs(ph.start_ms),
            secs(ph.end_ms),
            ph.rss_max.map_or_else(String::new, |m| format!(
                "{} RSS up to {}",
                if heap.is_empty() { ":" } else { "," },
                bytes(m)
            ))
        );
        let d = &ph.decomposition;
        if r.heap_known || d.heap_size.is_some() {
            let _ = writeln!(o, "    at {}:", secs(ph.snapshot_t_ms));
            render_decomposition(o, d);
        } else if d.rss.is_some() {
            let _ = writeln!(
                o,
                "    at {}: RSS {}, lazily freed {}, file-backed {}",
                secs(ph.snapshot_t_ms),
                opt_bytes(d.rss),
                opt_bytes(d.lazy_free),
                opt_bytes(d.file)
            );
        }
        if !ph.closure_types.is_empty() {
            let total: u64 = ph.closure_types.iter().map(|c| c.bytes).sum();
            let _ = writeln!(
                o,
                "    heap profile by closure type (-hT) at {}:",
                opt_secs(ph.census_t_ms)
            );
            for c in &ph.closure_types {
                let _ = writeln!(
                    o,
                    "      {:<24} {:>11}  {:>6}",
                    c.label,
                    bytes(c.bytes),
                    pct(c.bytes, total)
                );
            }
        }
        if let Some(c) = &ph.block_census {
            // The eventlog's figures beside the census's, when there are any.
            let beside = |name: &str, v: Option<u64>| {
                v.map_or_else(String::new, |v| format!(" ({name} {})", bytes(v)))
            };
            let _ = writeln!(
                o,
                "    block census at {}: heap {}{}, blocks in use {}, free blocks {}{}, pinned \
                 blocks {}{}, {} in megablocks with at most 25 blocks in use",
                secs(c.t_ms),
                bytes(c.heap_size),
                beside("HEAP_SIZE", c.eventlog_heap_size),
                bytes(c.blocks_in_use),
                bytes(c.free_blocks),
                beside("GC frag", c.eventlog_free_blocks),
                count(c.pinned_blocks),
                c.pinned_live
                    .map_or_else(String::new, |l| format!(" ({} referred to)", bytes(l))),
                bytes(c.sparse_megablocks)
            );
        }
        if let Some(note) = &ph.pinned_note {
            let _ = writeln!(o, "    => {note}");
        }
    }
}

fn render_gc(o: &mut String, r: &GhcReport) {
    let g = &r.gc;
    if g.generations.is_empty() {
        let _ = writeln!(
            o,
            "\nGarbage collection\n  {}",
            missing_figures(r, "GC figures")
        );
        return;
    }
    let _ = writeln!(
        o,
        "\nGarbage collection (as +RTS -s would say, from the eventlog)"
    );
    let _ = writeln!(
        o,
        "  {:<6} {:>8} {:>14} {:>10} {:>10}",
        "", "colls", "copied", "GC time", "max pause"
    );
    for gen in &g.generations {
        let _ = writeln!(
            o,
            "  Gen {:<2} {:>8} {:>14} {:>10} {:>10}",
            gen.generation,
            count(gen.collections),
            bytes(gen.copied_bytes),
            secs(gen.gc_ms),
            format!("{:.1} ms", gen.max_pause_ms)
        );
    }
    let _ = writeln!(
        o,
        "  mutator {} vs GC {} of {} elapsed ({} in GC)",
        opt_secs(g.mutator_ms),
        opt_secs(g.gc_ms),
        opt_secs(g.elapsed_ms),
        match (g.gc_ms, g.elapsed_ms) {
            (Some(gc), Some(e)) if e > 0.0 => format!("{:.1}%", 100.0 * gc / e),
            _ => UNKNOWN.into(),
        }
    );
    let _ = writeln!(o, "  allocated          {}", opt_bytes(g.allocated_bytes));
    let _ = writeln!(o, "  copied during GC   {}", opt_bytes(g.copied_bytes));
    let _ = writeln!(
        o,
        "  maximum residency  {}",
        g.max_residency
            .map_or_else(|| format!("{UNKNOWN} (no major collection)"), bytes)
    );
    let _ = writeln!(
        o,
        "  maximum slop       {}",
        match g.max_slop {
            Some(s) => bytes(s),
            None if g.slop_underflowed => "unknown (a major collection reported a slop \
                                           larger than the heap: the RTS's count underflowed)"
                .into(),
            None => format!("{UNKNOWN} (no major collection)"),
        }
    );
    let _ = writeln!(o, "  memory in use      {}", opt_bytes(g.memory_in_use));
    let _ = writeln!(
        o,
        "  free blocks in heap {} at the largest heap ({} at most; GC_STATS_GHC frag)",
        opt_bytes(g.fragmentation_at_peak),
        opt_bytes(g.max_fragmentation)
    );
}

/// The timeline rows the text shows, as (moment, point): evenly spaced moments of the
/// run with the figures of the last point at or before each (an eventlog alone has a
/// point per change of the heap, bunched where it grows, so a row per point would skip
/// its long plateaus), and the first point of each phase, so no phase is skipped.
fn timeline_rows(r: &GhcReport) -> Vec<(f64, usize)> {
    let t = &r.timeline;
    let (Some(first), Some(last)) = (t.first(), t.last()) else {
        return Vec::new();
    };
    let mut rows: Vec<(f64, usize)> = (0..TIMELINE_ROWS)
        .map(|k| {
            let at = first.t_ms + (last.t_ms - first.t_ms) * k as f64 / (TIMELINE_ROWS - 1) as f64;
            (at, t.partition_point(|p| p.t_ms <= at).saturating_sub(1))
        })
        .collect();
    rows.extend(
        r.phases
            .iter()
            .map(|ph| t.partition_point(|p| p.t_ms < ph.start_ms))
            .filter(|&i| i < t.len())
            .map(|i| (t[i].t_ms, i)),
    );
    rows.push((last.t_ms, t.len() - 1));
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    rows.dedup_by(|a, b| a.1 == b.1 && (a.0 - b.0).abs() < 0.5);
    rows
}

/// The block censuses over time, and the one the diagnosis reads in detail.
fn render_block_censuses(o: &mut String, r: &GhcReport) {
    if r.block_censuses.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nBlock census (the RTS's block descriptors, read at each snapshot)"
    );
    let _ = writeln!(
        o,
        "  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}  {:>13}  {:>11}  {:>8}",
        "time", "heap", "in use", "free blocks", "pinned", "pinned live", "sparse MBs", "pause"
    );
    let step = (r.block_censuses.len() / TIMELINE_ROWS).max(1);
    for c in r.block_censuses.iter().step_by(step) {
        let pinned = r.block_censuses.first().map_or(0, |_| {
            c.kinds
                .iter()
                .find(|k| k.kind == "pinned")
                .map_or(0, |k| k.held)
        });
        let _ = writeln!(
            o,
            "  {:>8}  {:>11}  {:>11}  {:>11}  {:>11}  {:>13}  {:>11}  {:>8}",
            secs(c.t_ms),
            bytes(c.heap_size),
            bytes(c.blocks_in_use),
            bytes(c.free_blocks),
            bytes(pinned),
            opt_bytes(c.pinned_live),
            bytes(c.sparse_megablocks),
            format!("{:.1} ms", c.pause_ms)
        );
    }
    let focus = r
        .diagnosis
        .as_ref()
        .and_then(|d| r.block_censuses.iter().find(|c| c.t_ms == d.census_t_ms))
        .or(r.block_censuses.last());
    let Some(c) = focus else { return };
    let _ = writeln!(o, "\n  at {}: blocks by kind", secs(c.t_ms));
    let _ = writeln!(
        o,
        "    {:<20} {:>9} {:>11} {:>11}",
        "", "groups", "held", "used"
    );
    for k in c.kinds.iter().filter(|k| k.groups > 0) {
        let _ = writeln!(
            o,
            "    {:<20} {:>9} {:>11} {:>11}",
            k.kind,
            count(k.groups),
            bytes(k.held),
            bytes(k.used)
        );
    }
    let _ = writeln!(o, "  megablocks by blocks in use (of 252)");
    for f in c.megablock_fill.iter().filter(|f| f.megablocks > 0) {
        let _ = writeln!(o, "    {:<24} {:>8}", f.label, count(f.megablocks));
    }
    if let Some(occ) = &c.pinned_occupancy {
        let _ = writeln!(
            o,
            "  pinned blocks by how full they are (bytes still referred to / bytes held)"
        );
        let most = occ.iter().copied().max().unwrap_or(0).max(1);
        for (i, n) in occ.iter().enumerate() {
            let _ = writeln!(
                o,
                "    {:>3}%-{:>3}%  {:>8}  {}",
                i * 10,
                (i + 1) * 10,
                count(*n),
                "#".repeat(((n * 40).div_ceil(most)) as usize)
            );
        }
    }
}

fn render_decomposition(o: &mut String, d: &GhcDecomposition) {
    let whole = d.rss.or(d.heap_size).unwrap_or(0);
    let mut row = |name: &str, v: Option<u64>, why: &str| {
        if let Some(v) = v {
            let _ = writeln!(
                o,
                "      {:<24} {:>11}  {:>6}  {why}",
                name,
                bytes(v),
                pct(v, whole)
            );
        }
    };
    row("RSS", d.rss, "VmRSS; the parts below add up to it");
    row("live", d.live, "HEAP_LIVE");
    if d.live.is_none() {
        // No eventlog: the block census's blocks in use, undivided.
        row(
            "blocks in use",
            d.heap_size.and(d.blocks_size),
            "the block census's (live data is not known without an eventlog)",
        );
    }
    let copy_reserve_why = d.to_space.filter(|t| *t >= 1 << 20).map_or_else(
        || "blocks in use minus live: nursery, copy space, block ends, uncollected".into(),
        |t| {
            format!(
                "blocks in use minus live, and {} of to-space: read during a collection, whose \
                 megablocks join HEAP_SIZE when it ends",
                bytes(t)
            )
        },
    );
    row(
        "copy reserve and slop",
        d.copy_reserve_and_slop,
        &copy_reserve_why,
    );
    row(
        "free blocks in heap",
        d.free_resident_pages,
        "block-level waste: free blocks inside held megablocks (GC frag)",
    );
    row(
        "lazily freed",
        d.lazy_free,
        "returned with MADV_FREE, still in RSS (LazyFree)",
    );
    row(
        "other anonymous",
        d.other_anon,
        "outside the heap: stacks, the RTS's malloc, foreign code",
    );
    row("file-backed", d.file, "code, libraries, mapped files");
    if let Some(u) = d.unexplained.filter(|u| *u != 0) {
        let _ = writeln!(
            o,
            "      {:<24} {:>11}          sources read a moment apart, or megablocks not yet touched",
            "unexplained",
            if u < 0 {
                format!("-{}", bytes(u.unsigned_abs()))
            } else {
                bytes(u as u64)
            }
        );
    }
    let _ = writeln!(
        o,
        "      heap size {}{}; outside live data {}{}",
        opt_bytes(d.heap_size),
        d.blocks_size
            .map_or_else(String::new, |b| format!(", blocks {}", bytes(b))),
        opt_bytes(d.outside_live),
        d.rss_minus_lazy_free.map_or_else(String::new, |r| format!(
            " (RSS - LazyFree {} minus live)",
            bytes(r)
        ))
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_ghc::{End, Event, EventKind, Eventlog, Header};

    /// An eventlog alone has a point per change of the heap: 300 while the heap grows in
    /// its first 0.3 s, then one when live data falls at 1 s and one at the end (4 s).
    /// The text's rows still cover the whole run, the plateau after the fall included.
    #[test]
    fn the_timeline_of_an_eventlog_alone_covers_the_whole_run() {
        let mut events = Vec::new();
        let mut live = |t_ms: u64, bytes: u64| {
            events.push(Event {
                time_ns: t_ms * 1_000_000,
                capability: Some(0),
                kind: EventKind::HeapLive {
                    heap_capset: 0,
                    bytes,
                },
            });
            events.push(Event {
                time_ns: t_ms * 1_000_000 + 1,
                capability: Some(0),
                kind: EventKind::HeapSize {
                    heap_capset: 0,
                    bytes: 100 << 20,
                },
            });
        };
        for i in 1..=300 {
            live(i, i << 20);
        }
        live(1000, 1 << 20);
        live(4000, 0);
        let log = Eventlog {
            header: Header::default(),
            events,
            end: End::Complete,
            corruption: None,
        };
        let r = ghc::analyze(&log, None, 0.0, &[]);
        let times: Vec<f64> = timeline_rows(&r).iter().map(|(t, _)| *t).collect();
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|g| *g <= 4000.0 / 15.0 + 1.0), "{times:?}");
        let text = render(&r);
        let after_fall = text
            .lines()
            .filter(|l| l.contains("  1.0 MiB  ") && !l.contains("live up to"))
            .count();
        assert!(after_fall >= 8, "{text}");
    }
}
