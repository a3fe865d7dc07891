//! The report's sections on an SBCL process: its dynamic space at the census where it
//! holds the most free space, objects by type, and the Lisp functions that allocate.

use std::fmt::Write as _;

use fragscope_model::report::Report;

use super::{fill_histogram, pct, secs};
use crate::units::{bytes, count};

/// SBCL's dynamic space at the snapshot where it holds the most free space.
pub(super) fn section(o: &mut String, r: &Report) {
    if let Some(note) = &r.sbcl_note {
        let _ = writeln!(o, "\nnote: {note}");
    }
    let Some((s, p)) = r
        .sbcl_snapshot
        .and_then(|i| r.snapshots[i].sbcl.as_ref().map(|p| (&r.snapshots[i], p)))
    else {
        return;
    };
    let _ = writeln!(
        o,
        "\nSBCL {} dynamic space at {}: {} in use on {} pages of {} (page table), {} \
         resident; {} collections so far",
        p.version,
        secs(s.t_ms),
        bytes(p.bytes_used),
        count(p.pages_in_use),
        bytes(p.page_bytes),
        bytes(p.resident),
        count(p.collections)
    );
    for (name, v) in [
        ("objects (resident)", p.in_use),
        ("free in pages in use", p.free_in_used_pages),
        ("free pages kept mapped", p.free_pages),
    ] {
        let _ = writeln!(o, "  {name:<30} {:>10} {:>7}", bytes(v), pct(v, p.resident));
    }
    let _ = writeln!(
        o,
        "  generation      pages     in use   resident  large objects  collections (promoted after)"
    );
    for g in &p.generations {
        let _ = writeln!(
            o,
            "  {:>10} {:>10} {:>10} {:>10} {:>14} {:>12} ({})",
            g.gen,
            count(g.pages),
            bytes(g.bytes_used),
            bytes(g.resident),
            bytes(g.large_bytes),
            g.collections,
            g.collections_before_promotion
        );
    }
    let _ = writeln!(
        o,
        "  pages in use by bytes used (census paused the program {:.1} ms)",
        p.pause_ms
    );
    fill_histogram(o, &p.page_fill, "pages", "used");
    objects_by_type(o, r);
}

/// SBCL's objects by type and generation, from the census that marked the most garbage,
/// else the last one that walked them.
fn objects_by_type(o: &mut String, r: &Report) {
    // Objects by type come from the census that marked the most garbage, else the last
    // one that walked them.
    let marked = r
        .snapshots
        .iter()
        .filter_map(|s| {
            s.sbcl
                .as_ref()
                .filter(|p| p.garbage.is_some())
                .map(|p| (s, p))
        })
        .max_by_key(|(_, p)| p.garbage);
    let walked = marked.or_else(|| {
        r.snapshots.iter().rev().find_map(|s| {
            s.sbcl
                .as_ref()
                .filter(|p| p.objects.is_some())
                .map(|p| (s, p))
        })
    });
    if marked.is_none() {
        // A census that asked for a mark and was refused one: say why there is no
        // garbage by generation.
        if let Some((rs, why)) = r.snapshots.iter().rev().find_map(|s| {
            s.sbcl
                .as_ref()
                .and_then(|p| p.mark_refused.as_ref())
                .map(|w| (s, w))
        }) {
            let _ = writeln!(
                o,
                "  no garbage by generation: the mark from the roots was refused at {} ({why})",
                secs(rs.t_ms)
            );
        }
    }
    let Some((ws, p)) = walked else {
        return;
    };
    match (p.garbage, p.mark_ms) {
        (Some(garbage), Some(ms)) => {
            let _ = writeln!(
                o,
                "  objects by type at {} (the census that found the most garbage: {} of \
                 {} in use unreachable from the roots, which (gc :full t) would free; the \
                 mark paused the program {ms:.1} ms more)",
                secs(ws.t_ms),
                bytes(garbage),
                bytes(p.bytes_used)
            );
            if let Some(n @ 1..) = p.threads_in_lisp {
                let _ = writeln!(
                    o,
                    "  ({n} thread(s) were stopped running Lisp code: their registers are not \
                     read, so an object only a register held counts as garbage)"
                );
            }
        }
        _ => {
            let _ = writeln!(
                o,
                "  objects by type at {} (the last census that walked the heap)",
                secs(ws.t_ms)
            );
        }
    }
    for g in &p.generations {
        let Some(objects) = &g.objects else { continue };
        let mut largest: Vec<_> = objects.iter().filter(|c| c.bytes > 0).collect();
        largest.sort_by_key(|c| std::cmp::Reverse(c.bytes));
        let listed: Vec<String> = largest
            .iter()
            .take(3)
            .map(|c| match c.garbage {
                Some(g) if g > 0 => {
                    format!("{} {} ({} garbage)", c.class, bytes(c.bytes), bytes(g))
                }
                _ => format!("{} {}", c.class, bytes(c.bytes)),
            })
            .collect();
        if !listed.is_empty() {
            let _ = writeln!(
                o,
                "  generation {} holds most: {}",
                g.gen,
                listed.join(", ")
            );
        }
    }
    if let Some(objects) = &p.objects {
        for c in objects.iter().filter(|c| c.count > 0) {
            let garbage = c
                .garbage
                .map(|g| format!(" {:>10} garbage", bytes(g)))
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "    {:<16} {:>10} {:>12}{garbage}",
                c.class,
                bytes(c.bytes),
                count(c.count)
            );
        }
    }
}

/// The Lisp functions that allocate: sites by their own bytes, with callers, then
/// functions by the bytes allocated while they ran.
pub(super) fn lisp_sites(o: &mut String, r: &Report) {
    if let Some(note) = &r.lisp_sites_note {
        let _ = writeln!(o, "\n{note}");
    }
    let Some(ls) = &r.lisp_sites else {
        return;
    };
    let _ = writeln!(
        o,
        "\nLisp allocation sites ({} allocated, estimated from {} allocation regions of {} \
         sampled, {} of them large objects)",
        bytes(ls.allocated_bytes as u64),
        count(ls.samples),
        bytes(ls.region_bytes),
        count(ls.large_samples)
    );
    let _ = writeln!(o, "  {:>10} {:>6}  function", "allocated", "share");
    for s in &ls.sites {
        let _ = writeln!(
            o,
            "  {:>10} {:>5.1}%  {}",
            bytes(s.allocated_bytes as u64),
            s.share * 100.0,
            s.function
        );
        for c in s.callers.iter().take(3) {
            let _ = writeln!(o, "  {:>18}  <- {c}", "");
        }
    }
    let _ = writeln!(
        o,
        "  Functions by bytes allocated while they ran\n  {:>10} {:>6} {:>10} {:>6}  function",
        "inclusive", "share", "itself", "share"
    );
    for f in fragscope_model::lisp_sites::listed(ls) {
        let _ = writeln!(
            o,
            "  {:>10} {:>5.1}% {:>10} {:>5.1}%  {}",
            bytes(f.inclusive_bytes as u64),
            f.inclusive_share * 100.0,
            bytes(f.leaf_bytes as u64),
            f.leaf_share * 100.0,
            f.function
        );
    }
    if let Some(p) = &ls.problem {
        let _ = writeln!(o, "  note: {p}");
    }
}
