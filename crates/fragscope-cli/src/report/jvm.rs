//! The report's section on a JVM's Java heap: its collector's regions or spaces at the
//! snapshot where they hold the most free space, split into objects, the young
//! generation's room, free space among old objects and free regions, beside the JVM's own
//! figures, with the runtime areas its tables locate.

use std::fmt::Write as _;

use fragscope_model::report::Report;

use super::{fill_histogram, pct, secs};
use crate::units::{bytes, count};

pub fn section(o: &mut String, r: &Report) {
    if let Some(note) = &r.jvm_note {
        let _ = writeln!(o, "\nnote: {note}");
    }
    let Some((s, p)) = r
        .jvm_snapshot
        .and_then(|i| r.snapshots[i].jvm.as_ref().map(|p| (&r.snapshots[i], p)))
    else {
        return;
    };
    let regions = if p.region_bytes > 0 {
        format!(", regions of {}", bytes(p.region_bytes))
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "\nJava heap (JDK {}, {} collector{regions}) at {}: {} resident of {} committed, \
         {} reserved (-Xmx {}, -Xms {})",
        p.jvm,
        p.collector,
        secs(s.t_ms),
        bytes(p.resident),
        bytes(p.committed),
        bytes(p.reserved),
        bytes(p.max_heap),
        bytes(p.initial_heap)
    );
    for (name, v) in [
        ("objects (live or not yet collected)", p.objects),
        ("young generation's free room", p.young_free),
        ("free space among old objects", p.old_free),
        ("free regions kept", p.free_regions),
    ] {
        let _ = writeln!(o, "  {name:<38} {:>10} {:>7}", bytes(v), pct(v, p.resident));
    }
    if p.humongous_objects > 0 {
        let _ = writeln!(
            o,
            "  {} humongous objects take {} regions ({} resident): committed heap that \
             counts against -Xmx",
            count(p.humongous_objects),
            count(p.humongous_regions),
            bytes(p.humongous_resident)
        );
    }
    let _ = writeln!(
        o,
        "  as the collector counts them: {} committed, {} used (census paused the JVM \
         {:.1} ms)",
        bytes(p.committed_reported),
        bytes(p.used_reported),
        p.pause_ms
    );
    let _ = writeln!(
        o,
        "  {:<24} {:>8} {:>11} {:>11} {:>11}",
        "spaces", "count", "bytes", "used", "resident"
    );
    for k in &p.spaces {
        let _ = writeln!(
            o,
            "  {:<24} {:>8} {:>11} {:>11} {:>11}",
            k.kind,
            count(k.spaces),
            bytes(k.bytes),
            bytes(k.used),
            bytes(k.resident)
        );
    }
    if p.region_fill.iter().any(|b| b.count > 0) {
        let _ = writeln!(o, "  old regions by bytes used");
        fill_histogram(o, &p.region_fill, "regions", "used");
    }
    if let Some(note) = &p.native_memory_note {
        let _ = writeln!(o, "  no native memory tracking figures: {note}");
    }
    if !p.native_memory.is_empty() {
        let _ = writeln!(
            o,
            "  as the JVM's native memory tracking counts it (committed, not all resident)"
        );
        for c in &p.native_memory {
            let _ = writeln!(
                o,
                "    {:<36} {:>11} committed {:>11} reserved",
                c.category,
                bytes(c.committed),
                bytes(c.reserved)
            );
        }
    }
    if !p.areas.is_empty() {
        let _ = writeln!(
            o,
            "  runtime areas outside the heap: {} resident",
            bytes(p.runtime)
        );
        for a in &p.areas {
            let _ = writeln!(
                o,
                "    {:<36} {:>6} {:>11} mapped {:>11} resident",
                a.area,
                count(a.count),
                bytes(a.bytes),
                bytes(a.resident)
            );
        }
    }
}
