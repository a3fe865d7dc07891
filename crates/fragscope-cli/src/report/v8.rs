//! The report's section on a Node.js process's V8 heap: its spaces as V8 counts them.

use std::fmt::Write as _;

use fragscope_model::report::Report;

use super::{pct, secs};
use crate::units::bytes;

/// A Node.js process's V8 heap at the snapshot where it holds the most free space.
pub fn section(o: &mut String, r: &Report) {
    if let Some(note) = &r.v8_note {
        let _ = writeln!(o, "\nnote: {note}");
    }
    let Some((s, p)) = r
        .v8_snapshot
        .and_then(|i| r.snapshots[i].v8.as_ref().map(|p| (&r.snapshots[i], p)))
    else {
        return;
    };
    let _ = writeln!(
        o,
        "\nV8 heap (Node {}, {} isolate{}) at {}: {} physical of {} committed, as V8 counted \
         it {} ms before",
        p.node,
        p.isolates,
        if p.isolates == 1 { "" } else { "s" },
        secs(s.t_ms),
        bytes(p.physical),
        bytes(p.committed),
        p.age_ms
    );
    for (name, v) in [("objects", p.objects), ("free space in its spaces", p.free)] {
        let _ = writeln!(o, "  {name:<38} {:>10} {:>7}", bytes(v), pct(v, p.physical));
    }
    let _ = writeln!(
        o,
        "  old generation limit {}; external memory {} (ArrayBuffers' backing stores: in \
         malloc's heap); V8's own malloc'd memory {}",
        bytes(p.heap_size_limit),
        bytes(p.external_memory),
        bytes(p.malloced_memory)
    );
    let _ = writeln!(
        o,
        "  {:<26} {:>11} {:>11} {:>11} {:>11}",
        "space", "committed", "used", "available", "physical"
    );
    for x in &p.spaces {
        let _ = writeln!(
            o,
            "  {:<26} {:>11} {:>11} {:>11} {:>11}",
            x.space,
            bytes(x.size),
            bytes(x.used),
            bytes(x.available),
            bytes(x.physical)
        );
    }
}
