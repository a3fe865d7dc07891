//! `fragscope report`: the RSS decomposition, phases, timeline, page occupancy, size
//! classes and allocation sites of a recorded run, in the terminal or as JSON. The
//! allocator's census of a snapshot (`allocator_census`), the runtime heaps' sections (one
//! module each, listed in [`RUNTIME_SECTIONS`]) and sharing (`sharing`) have modules of
//! their own.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use fragscope_model::heaps::{self, Heap};
use fragscope_model::pymalloc::FillBucket;
use fragscope_model::report::{Decomposition, Report, Site, Snapshot};
use fragscope_model::{analyze, At, Options};

use crate::input::Input;
use crate::progress;
use crate::units::{bytes, count};

mod allocator_census;
mod go;
mod jvm;
mod python;
mod sbcl;
mod sharing;
mod v8;

/// The runtime heaps' sections, in the report's order: each says nothing of a process
/// that does not run its runtime.
const RUNTIME_SECTIONS: [fn(&mut String, &Report); 6] = [
    python::section,
    sbcl::section,
    go::section,
    jvm::section,
    v8::section,
    sbcl::lisp_sites,
];

/// Explain a recorded run's RSS: what part is live data, size-class rounding, free space
/// in pages that live objects pin, free pages the allocator keeps, lazily freed pages,
/// and memory outside the heap; when it happened; which allocation sites are to blame.
///
/// Examples:
///   fragscope report run.fsc
///   fragscope report run.fsc --json > report.json
///   fragscope report run.fsc --html report.html
///   fragscope report run.fsc --pid 4242 --sparse-pct 25
///   fragscope report run.fsc --at peak-live      (who held the memory at the live peak)
///   fragscope report prog.eventlog
///
/// A GHC program recorded with `fragscope record` gets the GHC report: its eventlog
/// (written beside the trace) with its RSS. An eventlog made elsewhere (`+RTS -l -hT`)
/// can be given instead of a trace: the same report without RSS.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct ReportArgs {
    /// The trace (from `fragscope record`), or a GHC eventlog.
    trace: PathBuf,
    /// Print the whole report as one JSON document (see docs/report-json.md).
    #[arg(long)]
    json: bool,
    /// Also write the report as one self-contained HTML page (charts, flame graphs) to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Analyse this process (default: the one with the highest RSS; see `fragscope info`).
    #[arg(long)]
    pid: Option<u32>,
    /// Pages whose live bytes fill less than this percentage count as pinned by the
    /// objects in them (the "pinned waste" of allocation sites).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    sparse_pct: u32,
    /// Rows in each table of allocation sites and size classes.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Explain this moment instead of the one with the most heap waste: the headline,
    /// sites, size classes and page occupancy are then of the snapshot nearest it.
    /// WHEN is peak-live, peak-rss, end, or a time into the recording (930ms, 1.5s, or
    /// seconds: 12).
    #[arg(long, value_name = "WHEN", value_parser = At::parse)]
    at: Option<At>,
}

pub fn run(a: ReportArgs) -> Result<ExitCode> {
    let input = Input::read(&a.trace, "analysing")?;
    if let Some(code) = crate::ghc_report::run_if_ghc(&a.trace, &input, a.json, a.html.as_deref())?
    {
        return Ok(code);
    }
    let size = std::fs::metadata(&a.trace)
        .with_context(|| format!("cannot open {}", a.trace.display()))?
        .len();
    let bar = progress::bar(size, "analysing");
    let opts = Options {
        pid: a.pid,
        sparse_pct: a.sparse_pct,
        top: a.top,
        all_sites: a.html.is_some(),
        at: a.at,
        ..Options::default()
    };
    let mut report = analyze(&a.trace, &opts, |done, _| bar.set_position(done))
        .with_context(|| format!("analysing {}", a.trace.display()))?;
    bar.finish_and_clear();
    if let Some(path) = &a.html {
        crate::html::write_report(path, &report)?;
        eprintln!("fragscope: wrote {}", path.display());
        report.all_sites.clear();
        if !a.json {
            return Ok(ExitCode::SUCCESS);
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, a.top));
    }
    Ok(ExitCode::SUCCESS)
}

/// Which snapshot the report describes: asked for with `--at`, or the most waste.
pub(crate) fn focus_phrase(r: &Report) -> &str {
    r.focus_asked.as_deref().unwrap_or("the most heap waste")
}

/// The snapshot the report describes, as its tables' titles name it.
pub(crate) fn focus_noun(r: &Report) -> &'static str {
    if r.focus_asked.is_some() {
        "the snapshot asked for (--at)"
    } else {
        "the most-waste snapshot"
    }
}

/// Its role among the snapshots shown side by side.
pub(crate) fn focus_role(r: &Report) -> &'static str {
    if r.focus_asked.is_some() {
        "asked"
    } else {
        "most waste"
    }
}

pub(crate) fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

pub(crate) fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

/// The whole terminal report.
pub fn render(r: &Report, top: usize) -> String {
    let mut o = String::new();
    identity(&mut o, r);
    merge_notes(&mut o, r);
    headline(&mut o, r);
    if let Some(s) = &r.snapshot {
        allocator_census::snapshot_census(
            &mut o,
            s,
            (r.duration_ms > 0.0).then(|| focus_phrase(r)),
        );
    }
    decomposition_table(&mut o, r);
    sharing::section(&mut o, r);
    for section in RUNTIME_SECTIONS {
        section(&mut o, r);
    }
    phases(&mut o, r);
    timeline(&mut o, r);
    if let Some(f) = r.focus_snapshot {
        occupancy(&mut o, &r.snapshots[f]);
        size_classes(&mut o, r, top);
        allocator_view(&mut o, &r.snapshots[f]);
    }
    if r.snapshot.is_some() {
        let _ = writeln!(
            o,
            "\nAllocation sites: none (a snapshot has no history; `fragscope record` the \
             program to see who allocates)"
        );
    } else if r.calls == 0 && r.go_snapshot.is_some() {
        let _ = writeln!(
            o,
            "\nAllocation sites: none (a Go program without cgo makes no malloc call; its \
             heap above is read by census)"
        );
    } else {
        sites(&mut o, r);
        leaks_and_temporaries(&mut o, r);
    }
    sharing::processes(&mut o, r);
    untraced(&mut o, r);
    o
}

/// What was analysed: the program, its allocator, which of the trace's processes, how
/// much of the trace.
fn identity(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "fragscope report: {} (pid {}{}, {} calls{}, {})",
        r.argv.join(" "),
        r.pid,
        r.allocator
            .as_deref()
            .map(|a| format!(", {a}"))
            .unwrap_or_default(),
        count(r.calls),
        if r.aggregated {
            ", aggregated between snapshots"
        } else {
            ""
        },
        secs(r.duration_ms)
    );
    if let Some(l) = &r.linked_allocator {
        let _ = writeln!(
            o,
            "allocator: a {} linked into {} ({}); its calls are not in the trace",
            l.allocator, l.image, l.evidence
        );
    }
    if r.processes.len() > 1 {
        let _ = writeln!(
            o,
            "one of {} processes in this trace, {}; all are listed at the end",
            r.processes.len(),
            if r.chosen_by_pid {
                "as asked with --pid"
            } else {
                "the one with the largest heap (--pid N explains another)"
            }
        );
    }
    if r.truncated {
        let _ = writeln!(
            o,
            "note: the trace is truncated ({}); this is the analysis of what is intact",
            r.damage.as_deref().unwrap_or("no end marker")
        );
    }
    if let Some(skipped) = &r.skipped {
        let _ = writeln!(o, "note: {skipped}");
    }
}

/// What the merge of the process's calls met that its figures depend on: attaching to a
/// running process, a heap inherited at a fork, calls it could not place.
fn merge_notes(o: &mut String, r: &Report) {
    if r.merge.attached {
        match (r.merge.starting_blocks, r.merge.starting_bytes) {
            (Some(blocks), Some(held)) => {
                let _ = writeln!(
                    o,
                    "note: recorded from the moment fragscope attached to the running process; \
                     its heap then held {blocks} blocks ({}), read from glibc's heap, which \
                     count as live data from the start{}",
                    bytes(held),
                    if r.merge.unknown_frees > 0 {
                        format!(
                            " ({} frees of blocks whose allocation was in flight as its \
                             calls were rebound or put back are counted apart)",
                            r.merge.unknown_frees
                        )
                    } else {
                        String::new()
                    }
                );
            }
            _ => {
                let _ = writeln!(
                    o,
                    "note: recorded from the moment fragscope attached to the running \
                     process, whose heap was not read then: its {} frees of blocks allocated \
                     before are counted apart, and live data counts only blocks allocated \
                     since",
                    r.merge.unknown_frees
                );
            }
        }
        if r.merge.forced_allocs + r.merge.lost_events > 0 {
            let _ = writeln!(
                o,
                "note: {} allocations of still-live addresses, {} lost events",
                r.merge.forced_allocs, r.merge.lost_events
            );
        }
    } else if r.merge.forced_allocs + r.merge.unknown_frees + r.merge.lost_events > 0 {
        let _ = writeln!(
            o,
            "note: {} allocations of still-live addresses, {} frees of unknown blocks, {} lost events",
            r.merge.forced_allocs, r.merge.unknown_frees, r.merge.lost_events
        );
    }
    if let (Some(parent), Some(blocks), Some(held)) = (
        r.merge.forked_from,
        r.merge.inherited_blocks,
        r.merge.inherited_bytes,
    ) {
        let _ = writeln!(
            o,
            "note: started from its parent's heap {} (pid {parent}): {} blocks ({}), which \
             count as live data from the start and whose frees are known{}",
            if r.merge.inherited_from_parent_end {
                "as the parent's calls end in this cut trace, before the fork"
            } else {
                "at the fork"
            },
            count(blocks),
            bytes(held),
            match r.merge.inherited_stale {
                0 => String::new(),
                n => format!(
                    " ({n} of them had been freed around the fork with no record: their \
                     addresses were allocated again)"
                ),
            }
        );
    }
    if let (Some(parent), n @ 1..) = (r.merge.forked_from, r.merge.inherited_frees) {
        let _ = writeln!(
            o,
            "note: {n} frees of blocks this process inherited from its parent (pid {parent}) \
             at the fork are counted apart; the blocks it inherited and kept are not in its \
             live data"
        );
    }
    if let Some(why) = &r.merge.spill_problem {
        let _ = writeln!(o, "note: {why}");
    }
    if !r.untraced.is_empty() {
        let _ = writeln!(
            o,
            "note: {} process image{} could not be traced (listed at the end)",
            r.untraced.len(),
            if r.untraced.len() == 1 { "" } else { "s" }
        );
    }
}

/// The process images that could not be traced, listed.
fn untraced(o: &mut String, r: &Report) {
    if !r.untraced.is_empty() {
        let _ = writeln!(o, "\nNot traced (their calls are missing from this trace):");
        for u in &r.untraced {
            let by = u
                .exec_by_pid
                .map(|p| format!(", exec'd by pid {p}"))
                .unwrap_or_default();
            let command = if u.argv.is_empty() {
                u.path.clone()
            } else {
                u.argv.join(" ")
            };
            let _ = writeln!(
                o,
                "  pid {:<8} at {}{by}  {command}\n    {}",
                u.pid,
                secs(u.t_ms),
                u.reason
            );
        }
    }
}

fn headline(o: &mut String, r: &Report) {
    let h = &r.headline;
    let rss = match (h.peak_rss, h.peak_rss_t_ms) {
        (Some(peak), Some(t)) => format!("peak RSS {} at {}", bytes(peak), secs(t)),
        // Not 0: nothing was measured (the run, or what is left of the trace, ended
        // before the first sample).
        _ => "peak RSS not measured (no RSS sample was taken)".into(),
    };
    let live = match (h.peak_live, h.peak_live_t_ms) {
        (Some(peak), Some(t)) => format!("peak live {} at {}", bytes(peak), secs(t)),
        _ => "peak live – (the heap was not read)".into(),
    };
    let _ = writeln!(o, "\n{rss};  {live}");
    if let (Some(t), Some(f)) = (h.focus_t_ms, r.focus_snapshot) {
        let s = &r.snapshots[f];
        // Each heap apart when the process has more than one (a runtime's and malloc's).
        let each = if s.heaps.len() > 1 {
            let list: Vec<String> = s
                .heaps
                .iter()
                .filter(|x| x.resident > 0)
                .map(|x| {
                    format!(
                        "{} {} for {}",
                        x.heap.name(),
                        bytes(x.resident),
                        bytes(x.live)
                    )
                })
                .collect();
            format!(" ({})", list.join("; "))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "at {} ({}): {} of heap resident for {} live{}{each}",
            secs(t),
            focus_phrase(r),
            bytes(heaps::resident(s)),
            bytes(heaps::live(s)),
            h.fragmentation_ratio
                .map(|x| format!(": fragmentation ratio {x:.2}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(o, "=> {}", h.sentence);
    // Live bytes peak at a call, snapshots are read between calls: a snapshot of the
    // same moment as shown (to 10 ms) that saw far less live data was read after the
    // frees that followed the peak. Both times are shown to the millisecond.
    let shown = [r.focus_snapshot, r.peak_snapshot, r.end_snapshot];
    let (Some(peak_live), Some(peak_live_t_ms)) = (h.peak_live, h.peak_live_t_ms) else {
        return;
    };
    // Without calls, the peak is a census's: of a snapshot, not between two calls.
    if r.calls == 0 {
        return;
    }
    if let Some(s) = shown
        .into_iter()
        .flatten()
        .map(|i| &r.snapshots[i])
        .find(|s| {
            (s.t_ms - peak_live_t_ms).abs() < 10.0 && (s.parts.live as f64) < 0.9 * peak_live as f64
        })
    {
        let _ = writeln!(
            o,
            "note: live data peaked at {} at {:.3} s, between two calls; the snapshot at {:.3} s \
             was read after the calls of its millisecond, {} live",
            bytes(peak_live),
            peak_live_t_ms / 1000.0,
            s.t_ms / 1000.0,
            bytes(s.parts.live)
        );
    }
}

/// Reads one part of a decomposition (signed: `unexplained` can be negative; `None`:
/// not known at that snapshot).
type PartOf = fn(&Decomposition) -> Option<i64>;

const PARTS: [(&str, PartOf); 16] = [
    ("live", |d| malloc_part(d, d.live)),
    ("rounding", |d| malloc_part(d, d.rounding)),
    ("allocator overhead", |d| {
        malloc_part(d, d.allocator_overhead)
    }),
    ("free in used pages", |d| {
        malloc_part(d, d.free_in_used_pages)
    }),
    ("free resident pages", |d| {
        malloc_part(d, d.free_resident_pages)
    }),
    ("lazily freed", |d| malloc_part(d, d.lazy_free)),
    ("pymalloc arenas", |d| d.pymalloc_arenas.map(|v| v as i64)),
    ("SBCL dynamic space", |d| {
        d.sbcl_dynamic_space.map(|v| v as i64)
    }),
    ("Go heap", |d| d.go_heap.map(|v| v as i64)),
    ("Java heap", |d| d.jvm_heap.map(|v| v as i64)),
    ("JVM runtime areas", |d| d.jvm_runtime.map(|v| v as i64)),
    ("V8 heap", |d| d.v8_heap.map(|v| v as i64)),
    ("other anonymous", |d| Some(d.other_anon as i64)),
    ("file-backed", |d| Some(d.file as i64)),
    ("fragscope's own", |d| Some(d.fragscope_own as i64)),
    ("unexplained", |d| Some(d.unexplained)),
];

/// The rows of malloc's heap.
const MALLOC_PARTS: [&str; 6] = [
    "live",
    "rounding",
    "allocator overhead",
    "free in used pages",
    "free resident pages",
    "lazily freed",
];

/// A part of the malloc heap, unknown when a snapshot's census could not read it.
fn malloc_part(d: &Decomposition, v: u64) -> Option<i64> {
    (!d.malloc_unknown).then_some(v as i64)
}

fn signed_bytes(v: i64) -> String {
    if v < 0 {
        format!("-{}", bytes(v.unsigned_abs()))
    } else {
        bytes(v as u64)
    }
}

fn decomposition_table(o: &mut String, r: &Report) {
    // Each column is a snapshot, labelled by every role it has: the snapshot of most
    // waste may also be the one of highest RSS, which need not be at the peak of RSS
    // itself (sampled every 10 ms, snapshots every second).
    let peak_role = match r.peak_snapshot.map(|i| &r.snapshots[i]) {
        Some(s)
            if r.headline
                .peak_rss
                .is_some_and(|peak| s.parts.rss as f64 >= 0.99 * peak as f64) =>
        {
            "peak RSS"
        }
        _ => "highest RSS",
    };
    let mut cols: Vec<(Vec<&str>, &Snapshot)> = Vec::new();
    let mut add = |role: &'static str, i: Option<usize>| {
        let Some(i) = i else { return };
        match cols
            .iter_mut()
            .find(|(_, s)| std::ptr::eq(*s, &r.snapshots[i]))
        {
            Some((roles, _)) => roles.push(role),
            None => cols.push((vec![role], &r.snapshots[i])),
        }
    };
    add(focus_role(r), r.focus_snapshot);
    add(peak_role, r.peak_snapshot);
    add("end", r.end_snapshot);
    add("pymalloc", r.pymalloc_snapshot);
    add("SBCL", r.sbcl_snapshot);
    add("Go", r.go_snapshot);
    add("JVM", r.jvm_snapshot);
    add("V8", r.v8_snapshot);
    if cols.is_empty() {
        return;
    }
    cols.sort_by(|a, b| a.1.t_ms.total_cmp(&b.1.t_ms));
    let _ = write!(o, "\nWhere RSS goes{:10}", "");
    for (roles, _) in &cols {
        let _ = write!(o, "{:>22}", roles.join(" + "));
    }
    let _ = write!(o, "\n  (snapshot at){:10}", "");
    for (_, s) in &cols {
        let _ = write!(o, "{:>22}", format!("{:.2} s", s.t_ms / 1000.0));
    }
    o.push('\n');
    // A program whose only heap is a runtime's (a Go program without cgo): no malloc rows.
    let no_malloc = cols.iter().all(|(_, s)| {
        s.heaps
            .iter()
            .all(|h| h.heap != Heap::Malloc || h.resident == 0)
            && s.heaps.len() > 1
    });
    for (name, get) in PARTS {
        let values: Vec<Option<i64>> = cols.iter().map(|(_, s)| get(&s.parts)).collect();
        if no_malloc && MALLOC_PARTS.contains(&name) {
            continue;
        }
        if matches!(
            name,
            "unexplained"
                | "lazily freed"
                | "fragscope's own"
                | "pymalloc arenas"
                | "SBCL dynamic space"
                | "Go heap"
                | "Java heap"
                | "JVM runtime areas"
                | "V8 heap"
        ) && values.iter().all(|&v| v == Some(0))
        {
            continue;
        }
        let from_proc = matches!(
            name,
            "other anonymous" | "file-backed" | "fragscope's own" | "unexplained"
        );
        let _ = write!(o, "  {name:<22}");
        for (v, (_, s)) in values.iter().zip(&cols) {
            if from_proc && !s.rss_measured {
                let _ = write!(o, "{:>14} {:>7}", "not sampled", "");
                continue;
            }
            let Some(v) = *v else {
                let _ = write!(o, "{:>14} {:>7}", "–", "");
                continue;
            };
            let share = if v >= 0 {
                pct(v as u64, s.parts.rss)
            } else {
                String::new()
            };
            let _ = write!(o, "{:>14} {:>7}", signed_bytes(v), share);
        }
        o.push('\n');
    }
    let _ = write!(o, "  {:<22}", "= RSS");
    for (_, s) in &cols {
        let rss = if s.rss_measured {
            bytes(s.parts.rss)
        } else {
            "not sampled".into()
        };
        let _ = write!(o, "{rss:>14} {:>7}", "");
    }
    o.push('\n');
    if !no_malloc {
        let _ = write!(o, "  {:<22}", "(heap resident)");
        for (_, s) in &cols {
            let _ = write!(o, "{:>14} {:>7}", bytes(s.parts.heap_resident), "");
        }
        o.push('\n');
    }
    // A "–" above: say why once, for each runtime heap and the snapshots it is missing at.
    for heap in Heap::ALL {
        let at: Vec<String> = cols
            .iter()
            .filter(|(_, s)| s.missing_census.contains(&heap))
            .map(|(_, s)| format!("{:.2} s ({})", s.t_ms / 1000.0, s.reason.replace('_', " ")))
            .collect();
        if !at.is_empty() {
            let _ = writeln!(
                o,
                "  – no census of the {} at {}: its pages are counted in other anonymous there",
                heap.name(),
                at.join(", ")
            );
        }
    }
}

fn phases(o: &mut String, r: &Report) {
    if r.phases.is_empty() {
        return;
    }
    // A runtime's heap (pymalloc's arenas, SBCL's dynamic space) in a column of its own,
    // "–" where the phase's snapshot had no census of it.
    let runtime_of = |d: &Decomposition| {
        Some(d.pymalloc_arenas? + d.sbcl_dynamic_space? + d.go_heap? + d.jvm_heap? + d.v8_heap?)
    };
    let runtime = r
        .snapshots
        .iter()
        .any(|s| !s.heaps.iter().all(|h| h.heap == Heap::Malloc));
    let _ = writeln!(
        o,
        "\nPhases{:27}{:>11}{:>11}{:>11}{:>11}{:>11}{}{:>11}",
        "",
        "RSS max",
        "live",
        "rounding",
        "in used pg",
        "free pages",
        if runtime {
            format!("{:>11}", "runtime")
        } else {
            String::new()
        },
        "non-heap"
    );
    for (i, p) in r.phases.iter().enumerate() {
        let _ = write!(
            o,
            "  {:>2} {:>8}-{:<8} {:<9}{:>11}",
            i + 1,
            secs(p.start_ms),
            secs(p.end_ms),
            p.kind.name(),
            bytes(p.rss_max)
        );
        match &p.decomposition {
            Some(d) => {
                let runtime_cell = match (runtime, runtime_of(d)) {
                    (false, _) => String::new(),
                    (true, Some(v)) => format!("{:>11}", bytes(v)),
                    (true, None) => format!("{:>11}", "–"),
                };
                let _ = writeln!(
                    o,
                    "{:>11}{:>11}{:>11}{:>11}{runtime_cell}{:>11}",
                    bytes(d.live),
                    bytes(d.rounding),
                    bytes(d.free_in_used_pages),
                    bytes(d.free_resident_pages + d.lazy_free),
                    bytes(d.other_anon + d.file)
                );
            }
            None => {
                let _ = writeln!(o, "{:>11}   (no snapshot inside)", bytes(p.live_end));
            }
        }
    }
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

fn spark(values: &[u64], max: u64) -> String {
    values
        .iter()
        .map(|&v| {
            if max == 0 {
                ' '
            } else {
                BARS[((v as f64 / max as f64) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

fn timeline(o: &mut String, r: &Report) {
    const WIDTH: usize = 64;
    let tl = &r.timeline;
    if tl.len() < 2 {
        return;
    }
    let group = tl.len().div_ceil(WIDTH);
    let rss: Vec<u64> = tl
        .chunks(group)
        .map(|g| g.iter().map(|p| p.rss).max().unwrap_or(0))
        .collect();
    let live: Vec<u64> = tl
        .chunks(group)
        .map(|g| g.iter().map(|p| p.live).max().unwrap_or(0))
        .collect();
    let max = rss.iter().chain(&live).copied().max().unwrap_or(0);
    let _ = writeln!(
        o,
        "\nTimeline (0 to {}, one scale: {} full height)",
        secs(tl[tl.len() - 1].t_ms),
        bytes(max)
    );
    let _ = writeln!(o, "  RSS   {}", spark(&rss, max));
    let _ = writeln!(o, "  live  {}", spark(&live, max));
    if !r.snapshots.is_empty() {
        let t_end = tl[tl.len() - 1].t_ms.max(1.0);
        let mut heap = vec![' '; rss.len()];
        for s in &r.snapshots {
            let i = ((s.t_ms / t_end) * (rss.len() - 1) as f64).round() as usize;
            let v = heaps::resident(s);
            heap[i.min(rss.len() - 1)] = BARS[((v as f64 / max.max(1) as f64) * 7.0)
                .round()
                .clamp(0.0, 7.0) as usize];
        }
        let _ = writeln!(
            o,
            "  heap  {}  (at snapshots)",
            heap.iter().collect::<String>()
        );
    }
}

/// A runtime heap's pools or pages by fill, one bar per bucket ("pools", "in use").
pub(crate) fn fill_histogram(o: &mut String, buckets: &[FillBucket], units: &str, used: &str) {
    let max = buckets.iter().map(|b| b.count).max().unwrap_or(1).max(1);
    for b in buckets {
        let _ = writeln!(
            o,
            "    {:>3}%-{:>3}% {:>9} {units}  {:>10} {used}  {}",
            b.lo_pct,
            b.hi_pct,
            count(b.count),
            bytes(b.bytes_in_use),
            "#".repeat((b.count * 30).div_ceil(max) as usize)
        );
    }
}

fn occupancy(o: &mut String, s: &Snapshot) {
    let total: u64 = s.occupancy.iter().map(|b| b.pages).sum();
    if total == 0 {
        return;
    }
    let _ = writeln!(
        o,
        "\nPage occupancy at {} ({} resident heap pages of {}, by live bytes per page)",
        secs(s.t_ms),
        count(total),
        bytes(s.page_size)
    );
    let max = s
        .occupancy
        .iter()
        .map(|b| b.pages)
        .max()
        .unwrap_or(1)
        .max(1);
    for b in &s.occupancy {
        let label = if b.hi_pct == 0 {
            "empty".to_string()
        } else {
            format!("{}.0%-{}.0%", b.lo_pct, b.hi_pct)
        };
        let bar_len = (b.pages * 30).div_ceil(max) as usize;
        let _ = writeln!(
            o,
            "  {label:<12} {:>9} pages {:>6}  {:>10} live  {}",
            b.pages,
            pct(b.pages, total),
            bytes(b.live_bytes),
            "#".repeat(if b.pages == 0 { 0 } else { bar_len })
        );
    }
}

fn size_classes(o: &mut String, r: &Report, top: usize) {
    if r.size_classes.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\nSize classes (usable size) at {}, top {top} by bytes held\n  {:>10} {:>10} {:>11} {:>9} {:>9} {:>14} {:>12}",
        focus_noun(r),
        "class", "objects", "live", "pages", "mean occ", "retained free", "growth"
    );
    for c in r.size_classes.iter().take(top) {
        let class = if c.usable == 0 {
            "unknown".to_string()
        } else {
            format!("{} B", c.usable)
        };
        let growth = c.retained_free as i64 - c.retained_free_first as i64;
        let _ = writeln!(
            o,
            "  {:>10} {:>10} {:>11} {:>9} {:>8.1}% {:>14} {:>12}",
            class,
            count(c.objects),
            bytes(c.live_bytes),
            count(c.pages),
            c.mean_occupancy * 100.0,
            bytes(c.retained_free),
            if growth > 0 {
                format!("+{}", bytes(growth as u64))
            } else {
                signed_bytes(growth)
            }
        );
    }
}

/// The allocator's statistics beside fragscope's figures, with the differences.
fn allocator_view(o: &mut String, s: &Snapshot) {
    let Some(a) = &s.allocator else { return };
    let _ = writeln!(
        o,
        "\nThe allocator's own view ({}, answered at {})",
        a.source,
        secs(a.t_ms)
    );
    let _ = writeln!(
        o,
        "  {:<30} {:>12} {:>12} {:>12}",
        "", a.source, "fragscope", "difference"
    );
    for c in &a.comparisons {
        let _ = writeln!(
            o,
            "  {:<30} {:>12} {:>12} {:>12}   ({} vs {})",
            c.quantity,
            bytes(c.allocator),
            bytes(c.fragscope),
            signed_bytes(c.difference),
            c.allocator_formula,
            c.fragscope_formula
        );
    }
}

fn site_rows(o: &mut String, title: &str, list: &[Site], value: impl Fn(&Site) -> String) {
    if list.is_empty() {
        return;
    }
    let _ = writeln!(o, "  {title}");
    for s in list {
        let _ = writeln!(o, "    {:>24}  {}", value(s), s.label);
    }
}

/// What users of heaptrack look for: leaks (live at exit) and temporary allocations,
/// with what each means for fragmentation.
fn leaks_and_temporaries(o: &mut String, r: &Report) {
    let l = &r.leaks;
    let when = if l.at_exit {
        "Leaked at exit (still live when the process ended)"
    } else {
        "Live when the trace ends (the process did not exit within it, so not known leaked)"
    };
    let _ = writeln!(
        o,
        "\n{when}: {} in {} blocks",
        bytes(l.leaked_bytes),
        count(l.leaked_blocks)
    );
    if l.inherited_live_blocks > 0 {
        let _ = writeln!(
            o,
            "  not counted: {} in {} blocks inherited from its parent at the fork and kept",
            bytes(l.inherited_live_bytes),
            count(l.inherited_live_blocks)
        );
    }
    site_rows(o, "by site", &r.sites.by_leaked_bytes, |x| {
        format!("{} in {}", bytes(x.leaked_bytes), count(x.leaked_objects))
    });
    let _ = writeln!(
        o,
        "Temporary allocations: {} of {} allocations ({}, {}) were freed by their thread \
         before it allocated anything else",
        count(l.temporary_allocations),
        count(l.allocations),
        pct(l.temporary_allocations, l.allocations).trim(),
        bytes(l.temporary_bytes)
    );
    site_rows(o, "by site", &r.sites.by_temporary_allocations, |x| {
        count(x.temporary_allocations)
    });
    if l.temporary_allocations > 0 {
        let _ = writeln!(
            o,
            "  (a temporary block placed between long-lived ones is what leaves them scattered \
             over pages once it is freed: allocating such blocks from a separate arena, or on \
             the stack, keeps the survivors packed)"
        );
    }
}

fn sites(o: &mut String, r: &Report) {
    let s = &r.sites;
    if s.stacks == "none" {
        let _ = writeln!(
            o,
            "\nAllocation sites: none recorded (recorded with --stacks none)"
        );
        return;
    }
    let estimate = if s.stacks == "sampled" {
        " (estimates from sampled stacks; --stacks all for exact counts)"
    } else {
        ""
    };
    let _ = writeln!(o, "\nAllocation sites{estimate}");
    site_rows(
        o,
        &format!(
            "pinned waste: free bytes their live objects keep resident in pages under {}% full",
            s.sparse_pct
        ),
        &s.by_pinned_waste,
        |x| format!("{} in {:.0} pages", bytes(x.pinned_waste), x.pinned_pages),
    );
    site_rows(
        o,
        &format!("live bytes at {}", focus_noun(r)),
        &s.by_live_bytes,
        |x| format!("{} in {}", bytes(x.live_bytes), count(x.live_objects)),
    );
    site_rows(
        o,
        "bytes allocated over the run",
        &s.by_allocated_bytes,
        |x| bytes(x.allocated_bytes),
    );
    site_rows(o, "allocations over the run", &s.by_allocations, |x| {
        count(x.allocations)
    });
}
