//! Each runtime heap's part of the page's data, one entry of [`RUNTIMES`] per heap: its
//! fields of the report (its census at the snapshot the report explains, its notes, its
//! sites) and its fill buckets at each snapshot.

use fragscope_model::report::{Report, Snapshot};
use serde_json::{json, Map, Value};

use super::flame;

/// A runtime heap's part of the page's data.
pub(super) struct RuntimeData {
    /// Adds its fields to the report's.
    pub fields: fn(&Report, &mut Map<String, Value>),
    /// Its fill buckets (pools, pages, spans) at each snapshot, when it has them.
    pub fill: Option<FillColumn>,
}

/// A column of the snapshots' data: its key, and its value at a snapshot (null without
/// the heap's census there).
type FillColumn = (&'static str, fn(&Snapshot) -> Value);

/// Every runtime heap the page shows.
pub(super) const RUNTIMES: [RuntimeData; 5] = [
    RuntimeData {
        fields: python,
        fill: Some(("pymalloc_fill", |s| {
            json!(s.pymalloc.as_ref().map(
                |p| json!({"unit": "pools", "unit_bytes": p.pool_size, "buckets": p.pool_fill})
            ))
        })),
    },
    RuntimeData {
        fields: sbcl,
        fill: Some(("sbcl_fill", |s| {
            json!(s.sbcl.as_ref().map(
                |p| json!({"unit": "pages", "unit_bytes": p.page_bytes, "buckets": p.page_fill})
            ))
        })),
    },
    RuntimeData {
        fields: go,
        fill: Some(("go_fill", |s| {
            json!(s
                .go
                .as_ref()
                .map(|p| json!({"unit": "spans", "unit_bytes": 8192, "buckets": p.span_fill})))
        })),
    },
    RuntimeData {
        fields: jvm,
        fill: None,
    },
    RuntimeData {
        fields: v8,
        fill: None,
    },
];

/// A runtime's census at the snapshot the report explains, with that snapshot's time;
/// null for other programs.
fn census_at<T: serde::Serialize>(
    r: &Report,
    snapshot: Option<usize>,
    census: fn(&Snapshot) -> Option<&T>,
) -> Value {
    snapshot
        .and_then(|i| r.snapshots.get(i))
        .and_then(|s| census(s).map(|c| json!({"t_ms": s.t_ms, "census": c})))
        .unwrap_or(Value::Null)
}

/// A CPython process: the pymalloc census the report explains (the one with the most
/// free space) and the Python lines that keep its arenas.
fn python(r: &Report, data: &mut Map<String, Value>) {
    data.insert("pymalloc_note".into(), json!(r.pymalloc_note));
    data.insert(
        "pymalloc".into(),
        census_at(r, r.pymalloc_snapshot, |s| s.pymalloc.as_ref()),
    );
    data.insert("python_sites".into(), json!(r.python_sites));
    data.insert("python_sites_note".into(), json!(r.python_sites_note));
}

/// An SBCL process: the Lisp functions that allocate, and their flame graph.
fn sbcl(r: &Report, data: &mut Map<String, Value>) {
    data.insert("lisp_sites".into(), json!(r.lisp_sites));
    let lisp_flame = r.lisp_sites.as_ref().map(|l| {
        flame(l.stacks.iter().map(|s| {
            (
                s.frames.iter().rev().cloned().collect(),
                [s.allocated_bytes.round() as u64, 0, 0],
            )
        }))
    });
    data.insert("lisp_flame".into(), json!(lisp_flame));
}

/// A Go program: its span census and its heap profile's sites.
fn go(r: &Report, data: &mut Map<String, Value>) {
    data.insert("go".into(), census_at(r, r.go_snapshot, |s| s.go.as_ref()));
    data.insert("go_note".into(), json!(r.go_note));
    data.insert("go_sites".into(), json!(r.go_sites));
    data.insert("go_sites_note".into(), json!(r.go_sites_note));
}

/// A JVM: its heap census.
fn jvm(r: &Report, data: &mut Map<String, Value>) {
    data.insert(
        "jvm".into(),
        census_at(r, r.jvm_snapshot, |s| s.jvm.as_ref()),
    );
    data.insert("jvm_note".into(), json!(r.jvm_note));
}

/// A Node.js process: its V8 heap as V8 counts it.
fn v8(r: &Report, data: &mut Map<String, Value>) {
    data.insert("v8".into(), census_at(r, r.v8_snapshot, |s| s.v8.as_ref()));
}
