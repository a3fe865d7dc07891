//! `fragscope info`

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use fragscope_trace::heap_census::{AllocatorHeap, HeapCensus};
use fragscope_trace::summary::{summarize, ProcessSummary, TraceSummary};
use serde_json::json;

use crate::units;

/// Summarise a trace: its processes, threads, call counts, samples and size.
#[derive(Args)]
pub struct InfoArgs {
    /// The trace (from `fragscope record`).
    trace: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InfoArgs) -> Result<ExitCode> {
    let size = std::fs::metadata(&a.trace)
        .with_context(|| format!("cannot open {}", a.trace.display()))?
        .len();
    let bar = crate::progress::bar(size, "reading trace");
    let sum = summarize(&a.trace, |done, _| bar.set_position(done))
        .with_context(|| format!("reading {}", a.trace.display()))?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&sum))?);
    } else {
        print_text(&a.trace, &sum);
    }
    Ok(ExitCode::SUCCESS)
}

fn to_json(s: &TraceSummary) -> serde_json::Value {
    let tick_ms = s.meta.as_ref().map_or(1.0, |m| m.tick_ns as f64 / 1e6);
    json!({
        "truncated": s.truncated,
        "damage": s.damage,
        "skipped": s.skipped,
        "events": s.events,
        "file_bytes": s.file_bytes,
        "bytes_per_event": s.bytes_per_event(),
        "duration_ms": (s.duration_ticks as f64 * tick_ms) as u64,
        "command": s.meta.as_ref().map(|m| m.argv.clone()),
        "stacks": s.meta.as_ref().map(|m| m.stacks.name()),
        "aggregated": s.meta.as_ref().is_some_and(|m| m.aggregated),
        "processes": s.processes.iter().map(|p| json!({
            "stream": p.stream,
            "pid": p.pid,
            "ppid": p.ppid,
            "parent_stream": p.parent_stream,
            "forked": p.forked,
            "argv": p.argv,
            "exe": p.exe,
            "threads": p.threads.len(),
            "calls": p.calls.iter().map(|(f, n)| (f.name().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "aggregated_calls": (p.aggregated_calls > 0).then_some(p.aggregated_calls),
            "summed_allocations": (p.aggregated_calls > 0).then_some(p.summed_allocations),
            "events": p.events,
            "event_bytes": p.event_bytes,
            "buffers": p.buffers,
            "packed_buffers": p.packed_buffers,
            "packing_resumed": p.packing_resumed,
            "stacks": p.stacks,
            "rss_samples": p.rss_samples,
            "peak_rss": (p.rss_samples > 0).then_some(p.peak_rss_kib * 1024),
            "snapshots": p.snapshots,
            "ghc_censuses": p.ghc_censuses,
            "ghc_census_note": p.ghc_census_note,
            "pymalloc_censuses": p.pymalloc_censuses,
            "pymalloc_census_note": p.pymalloc_census_note,
            "python_samples": p.python_samples,
            "lisp_samples": p.lisp_samples,
            "snapshot_allocator": p.heap_census.as_ref().map(|c| c.allocator.clone()),
            "linked_allocator": p.linked_allocator.as_ref().map(|l| json!({
                "allocator": l.allocator,
                "image": l.image,
                "evidence": l.evidence,
                "serves_malloc": l.serves_malloc,
            })),
            "exit_code": p.wait.and_then(|w| w.exit_code).or(p.end.map(|e| e.status)),
            "signal": p.wait.and_then(|w| w.signal),
            "end": p.describe_end(),
            "lost_buffers": p.lost_buffers,
            "lost_events": p.lost_events,
            "own_memory": p.own_memory_bytes,
            "allocator": p.allocator,
        })).collect::<Vec<_>>(),
        "untraced": s.untraced.iter().map(|u| json!({
            "pid": u.pid,
            "parent_stream": u.parent_stream,
            "t_ms": u.tick as f64 * tick_ms,
            "path": u.path,
            "argv": u.argv,
            "reason": u.reason,
        })).collect::<Vec<_>>(),
    })
}

fn print_text(path: &std::path::Path, s: &TraceSummary) {
    let tick_ms = s.meta.as_ref().map_or(1.0, |m| m.tick_ns as f64 / 1e6);
    println!("trace      {}", path.display());
    if let Some(m) = &s.meta {
        println!("command    {}", m.argv.join(" "));
        println!(
            "stacks     {} (mean {} between samples)",
            m.stacks.name(),
            units::bytes(m.sample_bytes)
        );
        if m.aggregated {
            println!(
                "aggregated the calls each snapshot sees are written; the blocks allocated \
                 and freed between two snapshots are counted by site and size"
            );
        }
    }
    println!(
        "duration   {:.2} s",
        s.duration_ticks as f64 * tick_ms / 1000.0
    );
    println!(
        "size       {} for {} events ({:.2} bytes/event)",
        units::bytes(s.file_bytes),
        units::count(s.events),
        s.bytes_per_event()
    );
    let raw: u64 = s.processes.iter().map(|p| p.event_bytes).sum();
    if s.events > 0 {
        println!(
            "events     {:.2} bytes/event before compression",
            raw as f64 / s.events as f64
        );
    }
    if s.truncated {
        println!(
            "truncated  yes: {}; everything before it is intact",
            s.damage
                .as_deref()
                .unwrap_or("the recording ended without its end marker (fragscope was killed?)")
        );
    }
    if let Some(skipped) = &s.skipped {
        println!("note       {skipped}");
    }
    for p in &s.processes {
        print_process(p);
    }
    for u in &s.untraced {
        println!();
        let origin = u
            .parent_stream
            .map(|ps| format!(", exec'd from stream {ps}"))
            .unwrap_or_default();
        println!("not traced {}{origin}", u.label());
        println!("  why      {}", u.reason);
    }
}

/// One process of the trace: its identity, calls, buffers and samples.
fn print_process(p: &ProcessSummary) {
    println!();
    let origin = match (p.forked, p.parent_stream) {
        (true, Some(ps)) => format!(", forked from stream {ps}"),
        (false, Some(ps)) => format!(", exec'd from stream {ps}"),
        _ => String::new(),
    };
    println!(
        "process    pid {} (stream {}{}): {}",
        p.pid,
        p.stream,
        origin,
        p.argv.join(" ")
    );
    println!("  end      {}", p.describe_end());
    println!("  threads  {}", p.threads.len());
    if let Some(a) = p.allocator {
        println!("  allocator {a}");
    }
    let calls: Vec<String> = p
        .calls
        .iter()
        .map(|(f, n)| format!("{} {}", f.name(), n))
        .collect();
    println!(
        "  calls    {}",
        if calls.is_empty() {
            "none".into()
        } else {
            calls.join(", ")
        }
    );
    if p.aggregated_calls > 0 {
        println!(
            "           written of {} calls in all ({} blocks left out, counted by site)",
            units::count(p.aggregated_calls),
            units::count(p.summed_allocations)
        );
    }
    if p.packing_resumed > 0 {
        println!(
            "  buffers  {} ({} packed; packing resumed {} times)",
            p.buffers, p.packed_buffers, p.packing_resumed
        );
    } else {
        println!("  buffers  {} ({} packed)", p.buffers, p.packed_buffers);
    }
    let peak = if p.rss_samples > 0 {
        format!(" (peak {})", units::bytes(p.peak_rss_kib * 1024))
    } else {
        String::new()
    };
    println!(
        "  samples  {} RSS samples{peak}, {} page-residency snapshots, {} stacks",
        p.rss_samples, p.snapshots, p.stacks
    );
    print_runtimes(p);
    if let Some(l) = &p.linked_allocator {
        println!(
            "  linked   {} in {} ({}): its calls are not traced",
            l.allocator, l.image, l.evidence
        );
    }
    if let Some(c) = &p.heap_census {
        print_heap_census(c);
    }
    if p.lost_buffers + p.lost_events > 0 {
        println!(
            "  lost     {} buffers, {} events",
            p.lost_buffers, p.lost_events
        );
    }
}

/// What a process's runtimes left in the trace: censuses and sampled stacks.
fn print_runtimes(p: &ProcessSummary) {
    if p.ghc_censuses > 0 {
        println!(
            "  ghc      {} block censuses of the RTS heap",
            p.ghc_censuses
        );
    }
    if let Some(note) = &p.ghc_census_note {
        println!("  ghc      {note}");
    }
    if p.pymalloc_censuses > 0 {
        println!(
            "  python   {} censuses of pymalloc's pools",
            p.pymalloc_censuses
        );
    }
    if let Some(note) = &p.pymalloc_census_note {
        println!("  python   {note}");
    }
    if p.python_samples > 0 {
        println!(
            "  python   {} objects sampled with their Python stacks",
            p.python_samples
        );
    }
    if p.lisp_samples > 0 {
        println!(
            "  sbcl     {} allocation regions sampled with their Lisp stacks",
            p.lisp_samples
        );
    }
}

/// A snapshot's census of the allocator's heap, in one line.
fn print_heap_census(c: &HeapCensus) {
    let how = if c.stopped {
        format!("stopped {:.1} ms", c.pause_us as f64 / 1e3)
    } else {
        "not stopped".into()
    };
    match &c.result {
        Ok(AllocatorHeap::Glibc(h)) => println!(
            "  snapshot {} {} heap census ({how}): {} arenas, {} chunks in use",
            c.allocator,
            h.version,
            h.arenas.len(),
            h.in_use_chunks()
        ),
        Ok(AllocatorHeap::Tcmalloc(h)) => println!(
            "  snapshot tcmalloc (gperftools {}) heap census ({how}): {} size classes, \
             {} spans",
            h.release,
            h.classes.len(),
            h.classes.iter().map(|k| k.spans).sum::<u64>()
        ),
        Ok(AllocatorHeap::Jemalloc(h)) => println!(
            "  snapshot jemalloc {} heap census ({how}): {} arenas, {} size classes, \
             {} slabs",
            h.release,
            h.arenas.len(),
            h.bins.len(),
            h.bins.iter().map(|k| k.slabs).sum::<u64>()
        ),
        Ok(AllocatorHeap::Mimalloc(h)) => println!(
            "  snapshot {} heap census ({how}): {} {}, {} pages of {} block sizes",
            h.release,
            if h.is_v3() { h.arenas } else { h.segments },
            if h.is_v3() { "arenas" } else { "segments" },
            h.pages(),
            h.classes.len()
        ),
        Ok(AllocatorHeap::Unused) => {
            println!("  snapshot ({how}): no malloc heap (the process maps no C library)")
        }
        Err(note) => println!("  snapshot {} ({how}): {note}", c.allocator),
    }
}
