//! The parts of the report about the whole trace: its processes, the merge of the
//! chosen one, and the images that could not be traced.

use std::path::Path;

use fragscope_trace::records::SnapshotReason;

use super::decomposition::nearest;
use super::reading::TraceRead;
use super::stream::Stream;
use super::{decomposition, headline, sites, timeline, At, Options};
use crate::linked_allocator;
use crate::python_sites::PythonLog;
use crate::report::*;
use crate::sharing::{self};
use fragscope_trace::Untraced;

/// Stream `i`'s CPython samples; a forked process's start with its parent's up to the
/// fork, which name the objects it inherited.
fn python_log(streams: &[Stream], i: usize) -> std::borrow::Cow<'_, PythonLog> {
    let s = &streams[i];
    let parent = s
        .fork
        .parent_stream
        .filter(|_| s.fork.fork_mark.is_some())
        .and_then(|p| streams.iter().position(|x| x.stream == p))
        .filter(|&p| p < i);
    match parent {
        Some(p) => std::borrow::Cow::Owned(
            s.python
                .forked_from(&python_log(streams, p), s.fork.start_tick),
        ),
        None => std::borrow::Cow::Borrowed(&s.python),
    }
}

/// The Go heap profile of the census with the most waste, its stacks named from the
/// program's own symbols and DWARF.
fn go_sites(s: &Stream, tick_ms: f64) -> Option<crate::golang::GoSites> {
    let (tick, _, heap) = s.go_census.as_ref()?;
    let mut symbolizer = crate::symbols::Symbolizer::new(s.code_maps.clone());
    crate::golang::sites(heap, *tick as f64 * tick_ms, |pc| {
        symbolizer.frames(pc).first().map_or_else(
            || (None, format!("{pc:#x}")),
            |f| (f.function.clone(), f.label()),
        )
    })
}

/// A line of the list of processes.
fn brief(s: &Stream, streams: &[Stream], tick_ms: f64) -> ProcessBrief {
    // Its sharing at its last snapshot that read it, before its exit when it can (a
    // runtime's heap is gone or unread there).
    let sharing = (s.anonymous_sharing.iter().rev())
        .find(|e| e.1 != SnapshotReason::Exit)
        .or(s.anonymous_sharing.last())
        .map(|&(tick, _, anonymous)| BriefSharing {
            t_ms: tick as f64 * tick_ms,
            rollup: nearest(&s.rollups, tick, |r| r.0).and_then(|r| r.2),
            anonymous,
            inherited: s.fork_residency.as_ref().map(sharing::resident_bytes),
        });
    ProcessBrief {
        forked_from: forked_from(s, streams),
        inherited_bytes: s.inherited.map(|h| h.bytes),
        sharing,
        stream: s.stream,
        pid: s.pid,
        ppid: s.ppid,
        argv: s.argv.clone(),
        calls: s.calls,
        peak_rss: s
            .rss
            .iter()
            .map(|r| r.vm_rss_kib)
            .max()
            .map(|kib| kib * 1024),
        peak_live: s.peak_live.0,
        end: describe_end(s),
    }
}

fn describe_end(s: &Stream) -> String {
    if let Some(w) = s.wait {
        if let Some(sig) = w.signal {
            return format!("killed by signal {sig}");
        }
        if let Some(code) = w.exit_code {
            return format!("exited {code}");
        }
    }
    match &s.end {
        Some(end) => end.describe(),
        None => "still running when the trace ends".into(),
    }
}

/// The pid of the process `s` was forked from.
fn forked_from(s: &Stream, streams: &[Stream]) -> Option<u32> {
    s.fork.parent_stream.map(|p| {
        streams
            .iter()
            .find(|x| x.stream == p)
            .map_or(s.ppid, |x| x.pid)
    })
}

/// How the chosen process's calls merged.
fn merge_facts(s: &Stream, streams: &[Stream]) -> MergeFacts {
    let merge = s.merger.stats();
    // A fork child's frees of blocks it never allocated are of its parent's blocks.
    let forked_from = forked_from(s, streams);
    // Without its parent's heap at the fork (an older trace, a fork not marked), they are
    // all of the frees of blocks it never saw allocated.
    let inherited_frees = if forked_from.is_some() && s.inherited.is_none() {
        merge.unknown_frees
    } else {
        0
    };
    MergeFacts {
        forced_allocs: merge.forced_allocs,
        unknown_frees: merge.unknown_frees - inherited_frees,
        inherited_frees,
        forked_from,
        inherited_blocks: s.inherited.map(|h| h.blocks),
        inherited_bytes: s.inherited.map(|h| h.bytes),
        inherited_stale: merge.inherited_stale,
        inherited_from_parent_end: s.inherited.is_some_and(|h| h.at_parent_end),
        late: merge.late,
        lost_events: merge.lost_events,
        spilled: merge.spilled,
        spill_problem: s.merger.spill_problem().map(str::to_string),
        attached: s.attached,
        starting_blocks: s.starting_heap.map(|h| h.0),
        starting_bytes: s.starting_heap.map(|h| h.1),
        starting_stale: merge.starting_stale,
    }
}

/// The program images that ran without being traced.
fn untraced_images(untraced: &[Untraced], streams: &[Stream], tick_ms: f64) -> Vec<UntracedImage> {
    untraced
        .iter()
        .map(|u| UntracedImage {
            pid: u.pid,
            exec_by_pid: u
                .parent_stream
                .and_then(|p| streams.iter().find(|s| s.stream == p))
                .map(|s| s.pid),
            t_ms: u.tick as f64 * tick_ms,
            path: u.path.clone(),
            argv: u.argv.clone(),
            reason: u.reason.clone(),
        })
        .collect()
}

/// The report of process `chosen`, whose snapshots are all evaluated: each stage of the
/// analysis of its calls and snapshots, put together.
pub(super) fn assemble(
    path: &Path,
    opts: &Options,
    read: &TraceRead,
    chosen: usize,
    (site_leaks, leaks): (sites::SiteSums, LeakFacts),
) -> Report {
    let streams = &read.streams;
    let tick_ms = read.tick_ms();
    let stacks = read.stacks();
    let processes = streams.iter().map(|x| brief(x, streams, tick_ms)).collect();
    let s = &streams[chosen];
    let python = python_log(streams, chosen);
    let (timeline_full, timeline) = timeline::timeline(s, tick_ms);
    let snapshots = decomposition::snapshots(s, tick_ms);
    let peak_snapshot = (0..snapshots.len()).max_by_key(|&i| snapshots[i].parts.rss);
    let end_snapshot = snapshots.len().checked_sub(1);
    let focus_snapshot = match opts.at {
        None => decomposition::focus_of(&snapshots, s.peak_live.0),
        Some(At::Ms(ms)) => decomposition::nearest_snapshot(&snapshots, ms),
        Some(At::PeakLive) => {
            decomposition::nearest_snapshot(&snapshots, s.peak_live.1 as f64 * tick_ms)
        }
        Some(At::PeakRss) => peak_snapshot,
        Some(At::End) => end_snapshot,
    };
    let phases = timeline::phases_of(&timeline_full, &snapshots);
    let (size_classes, size_class_history) =
        decomposition::size_classes(s, focus_snapshot, tick_ms);
    let (sites, all_sites) = sites::sites(s, &site_leaks, focus_snapshot, opts, stacks, tick_ms);
    let told = headline::tell(
        s,
        &python,
        &snapshots,
        focus_snapshot,
        &timeline_full,
        stacks,
        tick_ms,
    );
    let sharing_snapshot = sharing::shown(&snapshots, focus_snapshot);
    Report {
        trace: path.display().to_string(),
        truncated: !read.seen_end || read.damage.is_some(),
        damage: read.damage.clone(),
        skipped: read.skipped.clone(),
        stacks: stacks.into(),
        aggregated: read.ctx.aggregated,
        duration_ms: read.last_tick as f64 * tick_ms,
        stream: s.stream,
        pid: s.pid,
        argv: s.argv.clone(),
        allocator: s.allocator.map(str::to_string),
        linked_allocator: s.linked_allocator.as_ref().map(linked_allocator::facts),
        calls: s.calls,
        merge: merge_facts(s, streams),
        headline: told.headline,
        timeline,
        snapshots,
        peak_snapshot,
        end_snapshot,
        focus_snapshot,
        focus_asked: opts
            .at
            .filter(|_| focus_snapshot.is_some())
            .map(|a| a.describe()),
        phases,
        size_classes,
        size_class_history,
        sites,
        all_sites,
        processes,
        untraced: untraced_images(&read.untraced, streams, tick_ms),
        chosen_by_pid: opts.pid.is_some(),
        pymalloc_snapshot: told.pymalloc_snapshot,
        sharing_snapshot,
        pymalloc_note: s.pymalloc_note.clone(),
        python_sites: told.python_sites,
        python_sites_note: told.python_sites_note,
        lisp_sites: told.lisp_sites,
        lisp_sites_note: told.lisp_sites_note,
        sbcl_snapshot: told.sbcl_snapshot,
        sbcl_note: s.sbcl_note.clone(),
        go_snapshot: told.go_snapshot,
        go_note: s.go_note.clone(),
        jvm_snapshot: told.jvm_snapshot,
        jvm_note: s.jvm_note.clone(),
        v8_snapshot: told.v8_snapshot,
        v8_note: s.v8_note.clone(),
        go_sites: go_sites(s, tick_ms),
        go_sites_note: (s.go_census.as_ref()).and_then(|c| c.2.profile.as_ref().err().cloned()),
        leaks,
        snapshot: s.census_shown(focus_snapshot).map(crate::census::facts),
    }
}
