//! `--html`: one self-contained page (inline SVG drawn by a little vanilla JavaScript, no
//! network fetch) for `fragscope report` and `fragscope compare`.
//!
//! The page is a fixed template (`html/page.html`, `html/page.css`, `html/page.js`) plus
//! the figures of the report as one JSON document in a non-executed
//! `<script type="application/json">` element. Every name in it (symbols, file names,
//! argv) comes from the traced program: the JSON has `<`, `>` and `&` written as `\u`
//! escapes, so it cannot close its element, and the script only ever puts strings in the
//! page with `textContent`. A Content-Security-Policy forbids every fetch and any script
//! but the page's own (by nonce).
//!
//! This module only reshapes what the model returns into compact columns (and folds the
//! model's per-site stacks into a tree for the flame graphs); it computes no figure.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use anyhow::{Context, Result};
use fragscope_model::ghc::GhcReport;
use fragscope_model::report::{Decomposition, Report, Site};
use serde_json::{json, Value};

mod runtime_data;

use runtime_data::RUNTIMES;

const TEMPLATE: &str = include_str!("html/page.html");
const STYLE: &str = include_str!("html/page.css");
const SCRIPT: &str = include_str!("html/page.js");

/// Size classes drawn over time (the largest by peak live plus retained bytes).
const HISTORY_CLASSES: usize = 10;
/// Rows of the size-class table.
const TABLE_CLASSES: usize = 50;
/// Flame-graph nodes under this share of every metric's total are folded into their
/// parent, so that the page stays small for programs with many sites.
const FLAME_MIN_SHARE: f64 = 1e-4;

/// Reads one part of a snapshot's decomposition for the page: `None` where it is unknown
/// (a runtime's heap at a snapshot without its census, malloc's heap without its calls).
type PartOf = fn(&Decomposition) -> Option<u64>;

/// A part of malloc's heap, unknown when a snapshot's census could not read it.
fn malloc(d: &Decomposition, v: u64) -> Option<u64> {
    (!d.malloc_unknown).then_some(v)
}

/// The malloc report's parts, in stacking order, with their names in the page.
pub const PARTS: [(&str, &str, PartOf); 15] = [
    ("live", "live", |d| malloc(d, d.live)),
    ("rounding", "rounding", |d| malloc(d, d.rounding)),
    ("allocator_overhead", "allocator overhead", |d| {
        malloc(d, d.allocator_overhead)
    }),
    ("free_in_used_pages", "free in used pages", |d| {
        malloc(d, d.free_in_used_pages)
    }),
    ("free_resident_pages", "free resident pages", |d| {
        malloc(d, d.free_resident_pages)
    }),
    ("lazy_free", "lazily freed", |d| malloc(d, d.lazy_free)),
    ("pymalloc_arenas", "pymalloc arenas", |d| d.pymalloc_arenas),
    ("sbcl_dynamic_space", "SBCL dynamic space", |d| {
        d.sbcl_dynamic_space
    }),
    ("go_heap", "Go heap", |d| d.go_heap),
    ("jvm_heap", "Java heap", |d| d.jvm_heap),
    ("jvm_runtime", "JVM runtime areas", |d| d.jvm_runtime),
    ("v8_heap", "V8 heap", |d| d.v8_heap),
    ("other_anon", "other anonymous", |d| Some(d.other_anon)),
    ("file", "file-backed", |d| Some(d.file)),
    ("fragscope_own", "fragscope's buffers", |d| {
        Some(d.fragscope_own)
    }),
];

/// Writes the page for one malloc report (`r.all_sites` feeds the flame graphs).
pub fn write_report(path: &Path, r: &Report) -> Result<()> {
    write_page(path, &json!({"kind": "malloc", "report": malloc_data(r)}))
}

/// Writes the page for a GHC report.
pub fn write_ghc(path: &Path, r: &GhcReport) -> Result<()> {
    write_page(path, &json!({"kind": "ghc", "report": r}))
}

/// Writes the comparison page: `columns` is `fragscope compare --json`'s list, `reports`
/// the report of each column (when one was analysed), in the same order.
pub fn write_compare(path: &Path, columns: &Value, reports: &[Option<&Report>]) -> Result<()> {
    let reports: Vec<Value> = reports
        .iter()
        .map(|r| r.map_or(Value::Null, malloc_data))
        .collect();
    write_page(
        path,
        &json!({"kind": "compare", "columns": columns, "reports": reports}),
    )
}

/// Writes the comparison page of GHC programs: `columns` as for [`write_compare`], with
/// each column's GHC report.
pub fn write_ghc_compare(
    path: &Path,
    columns: &Value,
    reports: &[Option<&GhcReport>],
) -> Result<()> {
    write_page(
        path,
        &json!({"kind": "ghc_compare", "columns": columns, "reports": reports}),
    )
}

fn write_page(path: &Path, data: &Value) -> Result<()> {
    let page = page(data, &nonce());
    std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// The whole page for `data`, its script and style allowed by `nonce`.
fn page(data: &Value, nonce: &str) -> String {
    TEMPLATE
        .replace("{{NONCE}}", nonce)
        .replace("{{STYLE}}", STYLE)
        .replace("{{SCRIPT}}", SCRIPT)
        .replace("{{DATA}}", &script_safe_json(data))
}

/// JSON that cannot end the `<script>` element it sits in, nor start a comment in it.
fn script_safe_json(v: &Value) -> String {
    let s = serde_json::to_string(v).expect("JSON values always serialise");
    let mut out = String::with_capacity(s.len() + s.len() / 32);
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// A fresh nonce for the page's Content-Security-Policy.
fn nonce() -> String {
    let mut b = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // Not secret material: it only has to differ from anything a name could guess.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The malloc report in columns for the page, each runtime heap's fields added by its
/// entry of [`RUNTIMES`].
fn malloc_data(r: &Report) -> Value {
    let tl = &r.timeline;
    let timeline = json!({
        "t_ms": tl.iter().map(|p| p.t_ms).collect::<Vec<_>>(),
        "rss": tl.iter().map(|p| p.rss).collect::<Vec<_>>(),
        "live": tl.iter().map(|p| p.live).collect::<Vec<_>>(),
    });
    let phases: Vec<Value> = r
        .phases
        .iter()
        .map(|p| json!({"start_ms": p.start_ms, "end_ms": p.end_ms, "kind": p.kind}))
        .collect();
    let mut data = json!({
        "trace": r.trace,
        "argv": r.argv,
        "pid": r.pid,
        "allocator": r.allocator,
        "calls": r.calls,
        "duration_ms": r.duration_ms,
        "truncated": r.truncated,
        "damage": r.damage,
        "skipped": r.skipped,
        "merge": r.merge,
        "stacks": r.stacks,
        "headline": r.headline,
        "parts_names": PARTS.iter().map(|(k, n, _)| json!([k, n])).collect::<Vec<_>>(),
        "heap_names": fragscope_model::heaps::Heap::ALL
            .iter()
            .map(|h| (json!(h).as_str().unwrap_or_default().to_string(), h.name()))
            .collect::<HashMap<_, _>>(),
        "snapshots": snapshot_columns(r),
        "peak_snapshot": r.peak_snapshot,
        "end_snapshot": r.end_snapshot,
        "focus_snapshot": r.focus_snapshot,
        "focus_phrase": crate::report::focus_phrase(r),
        "focus_noun": crate::report::focus_noun(r),
        "focus_role": crate::report::focus_role(r),
        "timeline": timeline,
        "phases": phases,
        "size_classes": r.size_classes.iter().take(TABLE_CLASSES).collect::<Vec<_>>(),
        "class_history": class_history(r),
        "sites": sites_data(r),
        "leaks": r.leaks,
        "untraced": r.untraced,
        "snapshot": r.snapshot,
        "flame": flame(r.all_sites.iter().map(|s| {
            (
                s.frames.iter().rev().map(|f| f.label()).collect(),
                [s.allocated_bytes, s.live_bytes, s.pinned_waste],
            )
        })),
        "sharing": r.sharing_snapshot.map(|i| json!({
            "t_ms": r.snapshots[i].t_ms,
            "sharing": r.snapshots[i].sharing,
        })),
        "processes": r.processes,
        "stream": r.stream,
    });
    if let Value::Object(data) = &mut data {
        for runtime in &RUNTIMES {
            (runtime.fields)(r, data);
        }
    }
    data
}

/// The snapshots' figures, a column each: the decomposition's parts by [`PARTS`], page
/// occupancy, and each runtime heap's fill buckets (null without its census).
fn snapshot_columns(r: &Report) -> Value {
    let snaps = &r.snapshots;
    let mut parts = serde_json::Map::new();
    for (key, _, part) in PARTS {
        let col: Vec<Option<u64>> = snaps.iter().map(|s| part(&s.parts)).collect();
        parts.insert(key.into(), json!(col));
    }
    let mut snapshots = json!({
        "t_ms": snaps.iter().map(|s| s.t_ms).collect::<Vec<_>>(),
        "reason": snaps.iter().map(|s| s.reason.as_str()).collect::<Vec<_>>(),
        "rss": snaps.iter().map(|s| s.parts.rss).collect::<Vec<_>>(),
        "unexplained": snaps.iter().map(|s| s.parts.unexplained).collect::<Vec<_>>(),
        "heap_resident": snaps.iter().map(|s| s.parts.heap_resident).collect::<Vec<_>>(),
        "heaps": snaps.iter().map(|s| &s.heaps).collect::<Vec<_>>(),
        "parts": parts,
        "occupancy": snaps
            .iter()
            .map(|s| s.occupancy.iter().map(|b| json!([b.lo_pct, b.hi_pct, b.pages, b.live_bytes])).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        "page_size": snaps.iter().map(|s| s.page_size).collect::<Vec<_>>(),
    });
    if let Value::Object(columns) = &mut snapshots {
        for runtime in &RUNTIMES {
            if let Some((key, fill)) = runtime.fill {
                let col: Vec<Value> = snaps.iter().map(fill).collect();
                columns.insert(key.into(), json!(col));
            }
        }
    }
    snapshots
}

/// The size classes drawn over time: the largest by peak live plus retained bytes.
fn class_history(r: &Report) -> Value {
    let mut peak: HashMap<u64, u64> = HashMap::new();
    for h in &r.size_class_history {
        for c in &h.classes {
            let e = peak.entry(c.usable).or_default();
            *e = (*e).max(c.live_bytes + c.retained_free);
        }
    }
    let mut drawn: Vec<(u64, u64)> = peak.into_iter().collect();
    drawn.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    drawn.truncate(HISTORY_CLASSES);
    let drawn: Vec<u64> = drawn.into_iter().map(|(u, _)| u).collect();
    let series = |field: fn(&fragscope_model::report::ClassPoint) -> u64| -> Vec<Vec<u64>> {
        drawn
            .iter()
            .map(|&u| {
                r.size_class_history
                    .iter()
                    .map(|h| h.classes.iter().find(|c| c.usable == u).map_or(0, &field))
                    .collect()
            })
            .collect()
    };
    json!({
        "t_ms": r.size_class_history.iter().map(|h| h.t_ms).collect::<Vec<_>>(),
        "usable": drawn,
        "retained_free": series(|c| c.retained_free),
        "live_bytes": series(|c| c.live_bytes),
    })
}

/// The top lists of allocation sites, a row per site.
fn sites_data(r: &Report) -> Value {
    let site_row = |s: &Site| {
        json!([
            s.label,
            s.live_bytes,
            s.pinned_waste,
            s.allocated_bytes,
            s.allocations,
            s.live_objects,
            s.leaked_bytes,
            s.temporary_allocations
        ])
    };
    json!({
        "stacks": r.sites.stacks,
        "t_ms": r.sites.t_ms,
        "sparse_pct": r.sites.sparse_pct,
        "by_pinned_waste": r.sites.by_pinned_waste.iter().map(site_row).collect::<Vec<_>>(),
        "by_live_bytes": r.sites.by_live_bytes.iter().map(site_row).collect::<Vec<_>>(),
        "by_allocated_bytes": r.sites.by_allocated_bytes.iter().map(site_row).collect::<Vec<_>>(),
        "by_leaked_bytes": r.sites.by_leaked_bytes.iter().map(site_row).collect::<Vec<_>>(),
        "by_temporary_allocations": r.sites.by_temporary_allocations.iter().map(site_row).collect::<Vec<_>>(),
    })
}

/// One node of the flame tree: a frame's name, its totals for three metrics (malloc
/// sites: allocated bytes, live bytes at the focus snapshot, pinned waste; Lisp stacks:
/// allocated bytes only) and its callees.
#[derive(Default)]
struct Node {
    values: [u64; 3],
    children: HashMap<u32, Node>,
}

/// Folds stacks (frame names root first, with their three figures) into a tree; names
/// are indexes into `names`.
fn flame(stacks: impl Iterator<Item = (Vec<String>, [u64; 3])>) -> Value {
    let mut names: Vec<String> = vec!["all".into()];
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut root = Node::default();
    for (frames, v) in stacks {
        let mut node = &mut root;
        for (i, x) in v.iter().enumerate() {
            node.values[i] += x;
        }
        for name in frames {
            let id = *index.entry(name.clone()).or_insert_with(|| {
                names.push(name);
                names.len() as u32 - 1
            });
            node = node.children.entry(id).or_default();
            for (i, x) in v.iter().enumerate() {
                node.values[i] += x;
            }
        }
    }
    let totals = root.values;
    let mut used = vec![false; names.len()];
    let tree = encode(0, &root, &totals, &mut used);
    // Drop names only folded nodes used, renumbering the rest.
    let mut renumber = vec![0u32; names.len()];
    let mut kept = Vec::new();
    for (i, n) in names.into_iter().enumerate() {
        if used[i] {
            renumber[i] = kept.len() as u32;
            kept.push(n);
        }
    }
    json!({"names": kept, "totals": totals, "root": renumbered(tree, &renumber)})
}

/// `[name, allocated, live, pinned, [children...]]`, largest allocated first.
fn encode(name: u32, n: &Node, totals: &[u64; 3], used: &mut [bool]) -> Value {
    used[name as usize] = true;
    let mut kids: Vec<(&u32, &Node)> = n
        .children
        .iter()
        .filter(|(_, c)| {
            (0..3).any(|i| {
                c.values[i] as f64 >= totals[i] as f64 * FLAME_MIN_SHARE && c.values[i] > 0
            })
        })
        .collect();
    kids.sort_by(|a, b| b.1.values.cmp(&a.1.values).then(a.0.cmp(b.0)));
    let children: Vec<Value> = kids
        .into_iter()
        .map(|(id, c)| encode(*id, c, totals, used))
        .collect();
    json!([name, n.values[0], n.values[1], n.values[2], children])
}

fn renumbered(v: Value, map: &[u32]) -> Value {
    match v {
        Value::Array(mut a) if a.len() == 5 => {
            let name = a[0].as_u64().unwrap_or(0) as usize;
            a[0] = json!(map[name]);
            let kids = std::mem::take(&mut a[4]);
            if let Value::Array(k) = kids {
                a[4] = Value::Array(k.into_iter().map(|c| renumbered(c, map)).collect());
            }
            Value::Array(a)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_close_the_data_element() {
        let hostile = "</script><img src=x onerror=alert(1)><!-- &amp; \u{2028}";
        let page = page(&json!({"argv": [hostile]}), "n0nce");
        assert!(!page.contains("<img src=x"));
        assert!(!page.contains("</script><img"));
        let start = page.find("id=\"data\"").unwrap();
        let json_start = page[start..].find('>').unwrap() + start + 1;
        let json_end = page[json_start..].find("</script>").unwrap() + json_start;
        let back: Value = serde_json::from_str(&page[json_start..json_end]).unwrap();
        assert_eq!(back["argv"][0], hostile);
        assert!(page.contains("'nonce-n0nce'"));
        for p in ["{{NONCE}}", "{{STYLE}}", "{{SCRIPT}}", "{{DATA}}"] {
            assert!(!page.contains(p));
        }
    }
}
