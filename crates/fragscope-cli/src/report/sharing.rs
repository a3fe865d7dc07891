//! The report's views of sharing: a process's pages shared with others and its own (after
//! fork: still shared with its parent, copied since, or made), and the list of the
//! trace's processes with their RSS, PSS and private bytes side by side.

use std::fmt::Write as _;

use fragscope_model::report::{ProcessBrief, Report};
use fragscope_model::sharing::Owners;

use super::{pct, secs};
use crate::units::{bytes, count};

/// "Shared and private": printed when the process shares heap pages with another or was
/// forked from a traced one.
pub fn section(o: &mut String, r: &Report) {
    let Some(s) = r.sharing_snapshot.map(|i| &r.snapshots[i]) else {
        return;
    };
    let Some(sh) = &s.sharing else { return };
    if !sh.forked && sh.anonymous.shared == 0 {
        return;
    }
    let _ = writeln!(
        o,
        "\nShared and private at {} (pages another process maps too, from pagemap; totals \
         from smaps_rollup):",
        secs(s.t_ms)
    );
    if let Some(ru) = &sh.rollup {
        let _ = writeln!(
            o,
            "  RSS {} = shared {} + private {}; PSS {} (shared pages divided among the \
             processes that map them)",
            bytes(ru.rss),
            bytes(ru.shared),
            bytes(ru.private),
            bytes(ru.pss)
        );
    }
    if let Some(inherited) = sh.inherited {
        let _ = writeln!(
            o,
            "  started with {} of heap memory resident, shared with its parent: {} ({}) \
             copied since, {} still shared",
            bytes(inherited),
            bytes(sh.anonymous.copied),
            pct(sh.anonymous.copied, inherited),
            bytes(sh.anonymous.shared),
        );
    }
    let _ = writeln!(
        o,
        "  {:<24} {:>11} {:>11} {:>11}{}",
        "part",
        "resident",
        "shared",
        "private",
        if sh.forked { "  (copied)" } else { "" }
    );
    for p in sh.parts.iter().filter(|p| p.owners.resident > 0) {
        // V8 counts its heap in bytes, not pages: its pages are among the others here.
        let name = match part_name(&p.part) {
            "other anonymous" if s.v8.is_some() => "V8 heap, other anonymous",
            name => name,
        };
        row(o, name, &p.owners, sh.forked);
    }
    row(o, "all heap mappings", &sh.anonymous, sh.forked);
}

fn row(o: &mut String, name: &str, w: &Owners, forked: bool) {
    let _ = writeln!(
        o,
        "  {:<24} {:>11} {:>11} {:>11}{}",
        name,
        bytes(w.resident),
        bytes(w.shared),
        bytes(w.private()),
        if forked {
            format!("  ({})", bytes(w.copied))
        } else {
            String::new()
        }
    );
}

/// How the decomposition's text names a part.
fn part_name(part: &str) -> &str {
    match part {
        "live" => "live data",
        "rounding" => "size-class rounding",
        "allocator_overhead" => "allocator overhead",
        "free_in_used_pages" => "free in used pages",
        "free_resident_pages" => "free pages kept",
        "pymalloc_arenas" => "pymalloc arenas",
        "sbcl_dynamic_space" => "SBCL dynamic space",
        "go_heap" => "Go heap",
        "jvm_heap" => "Java heap",
        "jvm_runtime" => "JVM runtime areas",
        "other_anon" => "other anonymous",
        other => other,
    }
}

/// The processes of the trace, this one marked; with their sharing when any was read,
/// each under the parent it was forked from.
pub fn processes(o: &mut String, r: &Report) {
    if r.processes.len() <= 1 {
        return;
    }
    let _ = writeln!(
        o,
        "\nProcesses in this trace (fragscope report --pid N explains another):"
    );
    let with_sharing = r.processes.iter().any(|p| p.sharing.is_some());
    if with_sharing {
        let _ = writeln!(
            o,
            "  {:<14} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10}  command (end)",
            "pid", "calls", "peak RSS", "RSS", "PSS", "private", "copied"
        );
    }
    // Parents first, each followed by the processes forked from it.
    let mut order: Vec<(&ProcessBrief, usize)> = Vec::new();
    fn visit<'a>(
        p: &'a ProcessBrief,
        depth: usize,
        all: &'a [ProcessBrief],
        order: &mut Vec<(&'a ProcessBrief, usize)>,
    ) {
        if order.iter().any(|(q, _)| q.stream == p.stream) {
            return;
        }
        order.push((p, depth));
        for c in all.iter().filter(|c| c.forked_from == Some(p.pid)) {
            visit(c, depth + 1, all, order);
        }
    }
    let known = |pid: u32| r.processes.iter().any(|q| q.pid == pid);
    for p in r
        .processes
        .iter()
        .filter(|p| p.forked_from.is_none_or(|f| !known(f)))
    {
        visit(p, 0, &r.processes, &mut order);
    }
    for p in &r.processes {
        visit(p, 0, &r.processes, &mut order);
    }
    for (p, depth) in order {
        let me = if p.stream == r.stream {
            " (this report)"
        } else {
            ""
        };
        let pid = format!("{}{}", "  ".repeat(depth.min(4)), p.pid);
        if with_sharing {
            let sh = p.sharing.as_ref();
            let ru = sh.and_then(|s| s.rollup);
            let or_dash = |v: Option<u64>| v.map_or_else(|| "–".into(), bytes);
            let _ = writeln!(
                o,
                "  {:<14} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10}  {}  ({}){me}",
                pid,
                count(p.calls),
                p.peak_rss.map_or_else(|| "–".into(), bytes),
                or_dash(ru.map(|u| u.rss)),
                or_dash(ru.map(|u| u.pss)),
                or_dash(ru.map(|u| u.private)),
                or_dash(
                    sh.filter(|s| s.inherited.is_some())
                        .map(|s| s.anonymous.copied)
                ),
                p.argv.join(" "),
                p.end
            );
        } else {
            let _ = writeln!(
                o,
                "  pid {:<8} {:>9} calls  peak RSS {:>10}  {}  ({}){me}",
                p.pid,
                count(p.calls),
                p.peak_rss.map_or_else(|| "not sampled".into(), bytes),
                p.argv.join(" "),
                p.end
            );
        }
    }
    if with_sharing {
        let _ = writeln!(
            o,
            "  (RSS, PSS and private bytes at each process's last snapshot, from \
             smaps_rollup; copied: heap pages shared with the parent at the fork that the \
             process has written since)"
        );
    }
    // Each parent's heap at the fork, once for all its workers.
    let mut parents: Vec<u32> = r.processes.iter().filter_map(|p| p.forked_from).collect();
    parents.sort_unstable();
    parents.dedup();
    for parent in parents {
        let children: Vec<&ProcessBrief> = r
            .processes
            .iter()
            .filter(|p| p.forked_from == Some(parent))
            .collect();
        if children.len() < 2 {
            continue;
        }
        let range = |v: Vec<u64>| -> Option<String> {
            let (lo, hi) = (*v.iter().min()?, *v.iter().max()?);
            Some(if hi - lo <= hi / 50 {
                bytes(hi)
            } else {
                format!("{} to {}", bytes(lo), bytes(hi))
            })
        };
        let resident = range(
            (children.iter())
                .filter_map(|c| c.sharing.as_ref()?.inherited)
                .collect(),
        );
        let live = range(children.iter().filter_map(|c| c.inherited_bytes).collect());
        let _ = writeln!(
            o,
            "  pid {parent} forked {} traced processes; each started from its memory at its \
             fork{}{}",
            children.len(),
            resident.map_or_else(String::new, |r| format!(
                ", sharing {r} resident in its heap mappings"
            )),
            live.map_or_else(String::new, |l| format!(" ({l} live in malloc's heap)")),
        );
    }
}
