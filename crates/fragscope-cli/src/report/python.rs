//! The report's section on a CPython process: pymalloc's arenas at the census where they
//! hold the most free space, and the Python lines whose sampled objects keep them.

use std::fmt::Write as _;

use fragscope_model::report::Report;

use super::{fill_histogram, pct, secs};
use crate::units::{bytes, count};

/// CPython's pymalloc arenas at the snapshot where they hold the most free space.
pub(super) fn section(o: &mut String, r: &Report) {
    if let Some(note) = &r.pymalloc_note {
        let _ = writeln!(o, "\nnote: {note}");
    }
    let Some(p) = r.pymalloc_snapshot.and_then(|i| {
        let s = &r.snapshots[i];
        s.pymalloc.as_ref().map(|p| (s, p))
    }) else {
        if let Some(note) = &r.python_sites_note {
            let _ = writeln!(o, "note: {note}");
        }
        return;
    };
    let (s, p) = p;
    let _ = writeln!(
        o,
        "\nCPython {} small objects (pymalloc) at {}: {} in {} arenas of {} ({} hold a pool in \
         use), {} pools of {}",
        p.python,
        secs(s.t_ms),
        bytes(p.resident),
        count(p.arenas),
        bytes(p.arena_size),
        count(p.arenas_in_use),
        count(p.pools),
        bytes(p.pool_size)
    );
    for (name, v) in [
        ("blocks in use", p.in_use),
        ("free in pools in use", p.free_in_used_pools),
        ("free pools in arenas in use", p.free_pools),
        ("arenas with no pool in use", p.empty_arenas),
    ] {
        let _ = writeln!(o, "  {name:<30} {:>10} {:>7}", bytes(v), pct(v, p.resident));
    }
    let _ = writeln!(
        o,
        "  pools in use by bytes in use (census paused the program {:.1} ms)",
        p.pause_ms
    );
    fill_histogram(o, &p.pool_fill, "pools", "in use");
    let _ = writeln!(o, "  size classes with the most free bytes in pools in use");
    for c in p.classes.iter().take(5) {
        let _ = writeln!(
            o,
            "    {:>5} B blocks {:>9} pools {:>11} in use {:>11} free",
            c.block_size,
            count(c.pools),
            bytes(c.blocks_in_use * c.block_size),
            bytes(c.blocks_free * c.block_size)
        );
    }
    python_sites(o, r);
}

/// The Python lines whose sampled objects survive in pymalloc's arenas.
fn python_sites(o: &mut String, r: &Report) {
    if let Some(note) = &r.python_sites_note {
        let _ = writeln!(o, "  {note}");
    }
    let Some(ps) = &r.python_sites else {
        return;
    };
    let _ = writeln!(
        o,
        "  Python lines whose objects keep the arenas ({} objects sampled, one per {} \
         allocated on average; {} live at this census, in {} of the {} arenas in use)",
        count(ps.samples),
        bytes(ps.mean_bytes),
        count(ps.live_samples),
        count(ps.arenas_sampled),
        count(ps.arenas_in_use)
    );
    let _ = writeln!(
        o,
        "    {:>10} {:>10} {:>7} {:>11}  line",
        "holds", "live", "arenas", "allocated"
    );
    for s in ps.sites.iter().filter(|s| s.allocated_bytes > 0.0).take(5) {
        let _ = writeln!(
            o,
            "    {:>10} {:>10} {:>7} {:>11}  {}",
            bytes(s.held_bytes as u64),
            bytes(s.live_bytes as u64),
            count(s.arenas),
            bytes(s.allocated_bytes as u64),
            s.location
        );
        for c in s.callers.iter().take(2) {
            let _ = writeln!(o, "    {:>42}  <- {c}", "");
        }
    }
    if ps.held_unattributed > 0 {
        let _ = writeln!(
            o,
            "    {:>10} in arenas where no sampled object lives (a smaller --sample-bytes \
             samples more)",
            bytes(ps.held_unattributed)
        );
    }
    let mut copied: Vec<_> = ps.sites.iter().filter(|s| s.copied_bytes >= 1.0).collect();
    if !copied.is_empty() {
        copied.sort_by(|a, b| b.copied_bytes.total_cmp(&a.copied_bytes));
        let _ = writeln!(
            o,
            "  Python lines whose objects are in the arena pages this process copied from its \
             parent since the fork (each line's share by its objects' bytes)"
        );
        let _ = writeln!(o, "    {:>10} {:>10}  line", "copied", "live");
        for s in copied.iter().take(5) {
            let _ = writeln!(
                o,
                "    {:>10} {:>10}  {}",
                bytes(s.copied_bytes as u64),
                bytes(s.live_bytes as u64),
                s.location
            );
        }
        if ps.copied_unattributed > 0 {
            let _ = writeln!(
                o,
                "    {:>10} in arenas where no sampled object lives",
                bytes(ps.copied_unattributed)
            );
        }
    }
    if let Some(p) = &ps.problem {
        let _ = writeln!(o, "    note: {p}");
    }
}
