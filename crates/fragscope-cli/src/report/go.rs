//! The report's section on a Go program's heap: its runtime's spans at the snapshot where
//! they hold the most free space, split into objects, free slots, free pages kept and
//! stacks, beside the runtime's own figures, with spans by fill and the size classes.

use std::fmt::Write as _;

use fragscope_model::report::Report;

use super::{fill_histogram, pct, secs};
use crate::units::{bytes, count};

/// Size classes listed: those with the most free bytes in their spans.
const CLASSES_LISTED: usize = 5;

/// Allocation sites shown: those holding the most live bytes.
const SITES_SHOWN: usize = 10;

pub fn section(o: &mut String, r: &Report) {
    if let Some(note) = &r.go_note {
        let _ = writeln!(o, "\nnote: {note}");
    }
    let Some((s, p)) = r
        .go_snapshot
        .and_then(|i| r.snapshots[i].go.as_ref().map(|p| (&r.snapshots[i], p)))
    else {
        return;
    };
    let _ = writeln!(
        o,
        "\nGo heap ({}) at {}: {} resident, {} spans in use",
        p.go,
        secs(s.t_ms),
        bytes(p.resident),
        count(p.spans_in_use)
    );
    for (name, v) in [
        ("objects (at their size class)", p.objects),
        ("free slots in spans in use", p.free_slots),
        ("free pages kept", p.idle_kept),
        ("goroutine stacks", p.stacks),
    ] {
        let _ = writeln!(o, "  {name:<30} {:>10} {:>7}", bytes(v), pct(v, p.resident));
    }
    let _ = writeln!(
        o,
        "  (released to the kernel, not in RSS: {}; Go's runtime keeps no object's requested \
         size, so rounding up to the size class is counted among the objects)",
        bytes(p.released)
    );
    let _ = writeln!(
        o,
        "  as runtime.MemStats counts them: HeapAlloc {}, HeapInuse {}, HeapIdle {}, \
         HeapReleased {}, StackInuse {}",
        bytes(p.heap_alloc),
        bytes(p.heap_in_use),
        bytes(p.heap_idle),
        bytes(p.released),
        bytes(p.stack_in_use)
    );
    if p.unswept_spans > 0 {
        let _ = writeln!(
            o,
            "  {} spans were not swept since the last collection: their slots still count \
             the objects it found dead",
            count(p.unswept_spans)
        );
    }
    let _ = writeln!(
        o,
        "  spans of small objects by slots in use (census paused the program {:.1} ms)",
        p.pause_ms
    );
    fill_histogram(o, &p.span_fill, "spans", "in use");
    let _ = writeln!(o, "  size classes with the most free bytes in their spans");
    for c in p.classes.iter().take(CLASSES_LISTED) {
        let slot = if c.class == 0 {
            "large objects".to_string()
        } else {
            format!("{} B slots", c.slot_bytes)
        };
        let _ = writeln!(
            o,
            "    {slot:>14} {:>9} spans {:>11} in use {:>11} free",
            count(c.spans),
            bytes(c.in_use_bytes),
            bytes(c.free_bytes())
        );
    }
    sites(o, r);
}

/// The Go heap profile's stacks, as `go tool pprof` scales them, beside what their
/// sampled objects keep of sparse spans.
fn sites(o: &mut String, r: &Report) {
    let Some(g) = &r.go_sites else {
        if let Some(note) = &r.go_sites_note {
            let _ = writeln!(o, "  Go allocation sites: none: {note}");
        }
        return;
    };
    let _ = writeln!(
        o,
        "\nGo allocation sites at {} (the runtime's heap profile, one sample per {} \
         allocated, scaled as go tool pprof does; {} sampled objects live, {} of them in \
         spans at most 25% full)",
        secs(g.t_ms),
        bytes(g.rate),
        count(g.sampled_live),
        count(g.sampled_in_sparse_spans)
    );
    let _ = writeln!(
        o,
        "  {:>11} {:>11} {:>11} {:>13}  site",
        "in use", "objects", "allocated", "sparse spans"
    );
    for s in g.sites.iter().take(SITES_SHOWN) {
        let pinned = if s.sampled_in_sparse_spans > 0 {
            format!("{} kept", bytes(s.pinned_free_bytes))
        } else {
            "-".into()
        };
        let _ = writeln!(
            o,
            "  {:>11} {:>11} {:>11} {:>13}  {}",
            bytes(s.in_use_bytes),
            count(s.in_use_objects),
            bytes(s.allocated_bytes),
            pinned,
            s.stack.first().map_or("?", String::as_str)
        );
        for caller in s.stack.iter().skip(1).take(2) {
            let _ = writeln!(o, "  {:>50}  <- {caller}", "");
        }
    }
}
