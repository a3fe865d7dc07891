//! The runtimes whose sampled stacks the exports carry beside malloc's sites: CPython's
//! Python stacks, SBCL's Lisp stacks, a Go program's heap profile. Each is one entry of
//! [`RUNTIMES`]: its stacks for pprof and folded stacks, its Parquet table, and its
//! columns of the Parquet snapshots table.

use std::sync::Arc;

use anyhow::Result;
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field};
use fragscope_model::golang::{GoParts, GoSite};
use fragscope_model::lisp_sites::{LispStack, NO_LISP_FRAME};
use fragscope_model::pymalloc::PymallocParts;
use fragscope_model::python_sites::{PythonFrame, PythonStack};
use fragscope_model::report::{Report, Snapshot};
use fragscope_model::symbols::Frame;

use super::parquet_tables::{batch, f64_col, optional_u64_col, str_col, u64_col};
use super::{named_frame, Value};

/// A runtime's part of the exports.
pub(super) struct RuntimeExports {
    /// Its sampled stacks in `r` (none for a process that does not run it), frames named
    /// for pprof when `for_pprof`.
    pub stacks: fn(r: &Report, for_pprof: bool) -> Vec<SampledStack>,
    /// Its Parquet table, when the process runs it.
    pub table: fn(r: &Report) -> Option<Table>,
    /// Its split of its heap at each snapshot, as columns of the snapshots table (null
    /// where no census came with a snapshot).
    pub snapshot_columns: fn(s: &[Snapshot]) -> Vec<(Field, ArrayRef)>,
}

/// A Parquet table's name and rows.
pub(super) type Table = (&'static str, Result<RecordBatch>);

/// Every runtime's sites, in the order the exports write them.
pub(super) const RUNTIMES: [RuntimeExports; 3] = [
    RuntimeExports {
        stacks: python_sampled,
        table: |r| {
            let stacks = python_stacks(r);
            r.python_sites
                .is_some()
                .then(|| ("python_sites", python_sites_batch(stacks)))
        },
        snapshot_columns: pymalloc_columns,
    },
    RuntimeExports {
        stacks: lisp_sampled,
        table: |r| {
            let stacks = lisp_stacks(r);
            r.lisp_sites
                .is_some()
                .then(|| ("lisp_sites", lisp_sites_batch(stacks)))
        },
        // The dynamic space is one part of the decomposition, with no split of its own.
        snapshot_columns: |_| Vec::new(),
    },
    RuntimeExports {
        stacks: go_sampled,
        table: |r| {
            let g = r.go_sites.as_ref()?;
            Some(("go_sites", go_sites_batch(&g.sites)))
        },
        snapshot_columns: go_columns,
    },
];

/// The split of pymalloc's arenas.
fn pymalloc_columns(s: &[Snapshot]) -> Vec<(Field, ArrayRef)> {
    let col = |name: &str, f: fn(&PymallocParts) -> u64| {
        optional_u64_col(name, s.iter().map(|x| x.pymalloc.as_ref().map(f)).collect())
    };
    vec![
        col("pymalloc_in_use", |p| p.in_use),
        col("pymalloc_free_in_used_pools", |p| p.free_in_used_pools),
        col("pymalloc_free_pools", |p| p.free_pools),
        col("pymalloc_empty_arenas", |p| p.empty_arenas),
    ]
}

/// The split of a Go heap.
fn go_columns(s: &[Snapshot]) -> Vec<(Field, ArrayRef)> {
    let col = |name: &str, f: fn(&GoParts) -> u64| {
        optional_u64_col(name, s.iter().map(|x| x.go.as_ref().map(f)).collect())
    };
    vec![
        col("go_objects", |p| p.objects),
        col("go_free_slots", |p| p.free_slots),
        col("go_idle_kept", |p| p.idle_kept),
        col("go_stacks", |p| p.stacks),
    ]
}

/// A runtime's sampled stack (CPython's, SBCL's) as frames without addresses, innermost
/// first, with its figures in [`Value::ALL`]'s order.
pub(super) struct SampledStack {
    /// pprof's `kind` label.
    pub kind: &'static str,
    /// The name of a stack without frames.
    pub none: &'static str,
    pub frames: Vec<Frame>,
    pub values: Vec<u64>,
}

impl Value {
    /// The figure of a sampled Lisp stack: only its bytes allocated (an estimate).
    fn of_lisp(self, s: &LispStack) -> u64 {
        match self {
            Value::AllocSpace => s.allocated_bytes.round() as u64,
            _ => 0,
        }
    }

    /// The figure of a Go heap profile's stack (estimates, scaled as pprof scales them);
    /// leaks and temporary objects are not followed (0).
    fn of_go(self, s: &GoSite) -> u64 {
        match self {
            Value::AllocSpace => s.allocated_bytes,
            Value::AllocObjects => s.allocated_objects,
            Value::InuseSpace => s.in_use_bytes,
            Value::InuseObjects => s.in_use_objects,
            Value::PinnedWaste => s.pinned_free_bytes,
            Value::LeakedSpace | Value::TemporaryObjects => 0,
        }
    }

    /// The figure of a sampled Python stack: an estimate; leaks and temporary objects are
    /// not followed for Python objects (0).
    fn of_python(self, s: &PythonStack) -> u64 {
        let v = match self {
            Value::AllocSpace => s.allocated_bytes,
            Value::AllocObjects => s.allocations,
            Value::InuseSpace => s.live_bytes,
            Value::InuseObjects => s.live_objects,
            Value::PinnedWaste => s.held_bytes,
            Value::LeakedSpace | Value::TemporaryObjects => 0.0,
        };
        v.round() as u64
    }
}

/// A Python frame as a frame without an address, so that it is named and placed as
/// native frames are ("function (file:line)").
fn python_frame(f: &PythonFrame) -> Frame {
    Frame {
        addr: 0,
        function: Some(f.function.clone()),
        file: Some(f.file.clone()),
        line: Some(f.line),
        module: String::new(),
        offset: 0,
        inlined: false,
    }
}

/// A Python frame for pprof. pprof takes a name with `<` or `>` for demangled C++ and drops
/// the bracketed part, which leaves `<module>`, `<listcomp>` or `<lambda>` nameless (all
/// one "<unknown>" in `-top`); qualified by their file's name ("keep_a_tenth.<module>")
/// they read as Java's "Class.<init>", which pprof keeps whole.
fn pprof_python_frame(f: &PythonFrame) -> Frame {
    let mut frame = python_frame(f);
    if f.function.starts_with('<') {
        let base = f.file.rsplit('/').next().unwrap_or(&f.file);
        let stem = base.strip_suffix(".py").unwrap_or(base);
        frame.function = Some(format!("{stem}.{}", f.function));
    }
    frame
}

/// A CPython process's sampled Python stacks (none for other programs).
pub(super) fn python_stacks(r: &Report) -> &[PythonStack] {
    r.python_sites.as_ref().map_or(&[], |p| &p.stacks)
}

/// An SBCL process's sampled Lisp stacks (none for other programs).
fn lisp_stacks(r: &Report) -> &[LispStack] {
    r.lisp_sites.as_ref().map_or(&[], |l| &l.stacks)
}

/// A CPython process's sampled Python stacks as [`SampledStack`]s.
fn python_sampled(r: &Report, for_pprof: bool) -> Vec<SampledStack> {
    python_stacks(r)
        .iter()
        .map(|s| SampledStack {
            kind: "python",
            none: "(no Python frame)",
            frames: s
                .frames
                .iter()
                .map(|f| {
                    if for_pprof {
                        pprof_python_frame(f)
                    } else {
                        python_frame(f)
                    }
                })
                .collect(),
            values: Value::ALL.iter().map(|v| v.of_python(s)).collect(),
        })
        .collect()
}

/// An SBCL process's sampled Lisp stacks as [`SampledStack`]s.
fn lisp_sampled(r: &Report, _for_pprof: bool) -> Vec<SampledStack> {
    lisp_stacks(r)
        .iter()
        .map(|s| SampledStack {
            kind: "lisp",
            none: NO_LISP_FRAME,
            frames: s.frames.iter().map(|f| named_frame(f)).collect(),
            values: Value::ALL.iter().map(|v| v.of_lisp(s)).collect(),
        })
        .collect()
}

/// A Go program's heap profile's stacks as [`SampledStack`]s. A Go site's frames are
/// labels, "function (file:line)": the function names the frame, the line its location.
fn go_sampled(r: &Report, _for_pprof: bool) -> Vec<SampledStack> {
    (r.go_sites.iter().flat_map(|g| &g.sites))
        .map(|s| SampledStack {
            kind: "go",
            none: "(no Go frame)",
            frames: s.stack.iter().map(|label| go_frame(label)).collect(),
            values: Value::ALL.iter().map(|v| v.of_go(s)).collect(),
        })
        .collect()
}

/// A Go site's frame from its label, "function (file.go:12)".
fn go_frame(label: &str) -> Frame {
    let (function, location) = label.split_once(" (").unwrap_or((label, ""));
    let (file, line) = location
        .trim_end_matches(')')
        .rsplit_once(':')
        .map_or((None, None), |(f, l)| (Some(f.to_string()), l.parse().ok()));
    Frame {
        file,
        line,
        ..named_frame(function)
    }
}

/// One row per sampled Python stack of a CPython process.
fn python_sites_batch(stacks: &[PythonStack]) -> Result<RecordBatch> {
    fn leaf(s: &PythonStack) -> Option<&PythonFrame> {
        s.frames.first()
    }
    let mut frames = ListBuilder::new(StringBuilder::new());
    for s in stacks {
        for f in &s.frames {
            frames.values().append_value(f.name());
        }
        frames.append(true);
    }
    let frames = frames.finish();
    let f = |name: &str, v: fn(&PythonStack) -> f64| f64_col(name, stacks.iter().map(v).collect());
    batch(vec![
        str_col(
            "location",
            stacks
                .iter()
                .map(|s| Some(leaf(s).map_or("(no Python frame)".into(), PythonFrame::name)))
                .collect(),
        ),
        str_col(
            "function",
            stacks
                .iter()
                .map(|s| leaf(s).map(|f| f.function.clone()))
                .collect(),
        ),
        str_col(
            "file",
            stacks
                .iter()
                .map(|s| leaf(s).map(|f| f.file.clone()))
                .collect(),
        ),
        (
            Field::new("line", DataType::UInt32, true),
            Arc::new(UInt32Array::from(
                stacks
                    .iter()
                    .map(|s| leaf(s).map(|f| f.line))
                    .collect::<Vec<_>>(),
            )),
        ),
        (
            Field::new("frames", frames.data_type().clone(), false),
            Arc::new(frames),
        ),
        f("allocations", |s| s.allocations),
        f("allocated_bytes", |s| s.allocated_bytes),
        f("live_objects", |s| s.live_objects),
        f("live_bytes", |s| s.live_bytes),
        f("held_bytes", |s| s.held_bytes),
    ])
}

/// One row per stack of a Go program's heap profile.
fn go_sites_batch(sites: &[GoSite]) -> Result<RecordBatch> {
    let mut frames = ListBuilder::new(StringBuilder::new());
    for s in sites {
        for f in &s.stack {
            frames.values().append_value(f);
        }
        frames.append(true);
    }
    let frames = frames.finish();
    let first = |s: &GoSite| s.stack.first().map(|l| go_frame(l));
    batch(vec![
        str_col(
            "function",
            sites.iter().map(|s| first(s)?.function).collect(),
        ),
        str_col("file", sites.iter().map(|s| first(s)?.file).collect()),
        (
            Field::new("frames", frames.data_type().clone(), false),
            Arc::new(frames),
        ),
        u64_col(
            "in_use_bytes",
            sites.iter().map(|s| s.in_use_bytes).collect(),
        ),
        u64_col(
            "in_use_objects",
            sites.iter().map(|s| s.in_use_objects).collect(),
        ),
        u64_col(
            "allocated_bytes",
            sites.iter().map(|s| s.allocated_bytes).collect(),
        ),
        u64_col(
            "allocated_objects",
            sites.iter().map(|s| s.allocated_objects).collect(),
        ),
        u64_col(
            "sampled_in_sparse_spans",
            sites.iter().map(|s| s.sampled_in_sparse_spans).collect(),
        ),
        u64_col(
            "pinned_free_bytes",
            sites.iter().map(|s| s.pinned_free_bytes).collect(),
        ),
    ])
}

/// One row per sampled Lisp stack of an SBCL process.
fn lisp_sites_batch(stacks: &[LispStack]) -> Result<RecordBatch> {
    let mut frames = ListBuilder::new(StringBuilder::new());
    for s in stacks {
        for f in &s.frames {
            frames.values().append_value(f);
        }
        frames.append(true);
    }
    let frames = frames.finish();
    batch(vec![
        str_col(
            "function",
            stacks
                .iter()
                .map(|s| {
                    Some(
                        s.frames
                            .first()
                            .map_or(NO_LISP_FRAME, String::as_str)
                            .into(),
                    )
                })
                .collect(),
        ),
        (
            Field::new("frames", frames.data_type().clone(), false),
            Arc::new(frames),
        ),
        f64_col(
            "allocated_bytes",
            stacks.iter().map(|s| s.allocated_bytes).collect(),
        ),
        u64_col("samples", stacks.iter().map(|s| s.samples).collect()),
    ])
}
