//! `fragscope export`: the model's figures in formats other tools read — pprof's
//! profile.proto, folded stacks, Parquet tables, and the report's JSON document.
//!
//! Like the other views, this module only reshapes what the model returns: the sites
//! (with their symbolized stacks) and snapshots of a [`Report`], and for Parquet's raw
//! tables the merged calls and RSS samples of [`fragscope_model::calls`]. The formats are
//! described in docs/export.md.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use clap::{Args, ValueEnum};
use fragscope_model::calls::{self, Row};
use fragscope_model::golang::{GoParts, GoSite};
use fragscope_model::lisp_sites::{LispStack, NO_LISP_FRAME};
use fragscope_model::pymalloc::PymallocParts;
use fragscope_model::python_sites::{PythonFrame, PythonStack};
use fragscope_model::report::{Report, Site};
use fragscope_model::symbols::Frame;
use fragscope_model::{analyze, Options};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use parquet::format::KeyValue;
use parquet::schema::types::ColumnPath;

use crate::progress;

/// Export a recorded run for other tools: a pprof heap profile (go tool pprof, Grafana
/// Pyroscope), folded stacks (FlameGraph, inferno, speedscope), Parquet tables (DuckDB,
/// pandas, Spark, Trino), or the report's JSON document.
///
/// Examples:
///   fragscope export run.fsc --format pprof -o heap.pb.gz
///   go tool pprof -top -sample_index=inuse_space heap.pb.gz
///   fragscope export run.fsc --format collapsed --value pinned_waste -o pinned.folded
///   flamegraph.pl pinned.folded > pinned.svg        (or: inferno-flamegraph)
///   fragscope export run.fsc --format parquet -o run.parquet/
///   duckdb -c "select label, pinned_waste from 'run.parquet/sites.parquet' order by 2 desc limit 5"
///   fragscope export run.fsc --format json -o report.json
///
/// pprof's sample types: alloc_objects and alloc_space (over the whole run), inuse_objects
/// and inuse_space (live at the report's focus snapshot, the one with the most heap
/// waste), and pinned_waste (free bytes that each site's live objects keep resident in
/// sparse pages, at the same snapshot). `-o -` writes collapsed stacks or JSON to stdout.
/// For a CPython program, pprof and collapsed also carry the sampled Python stacks
/// (pprof: labelled kind=python, inuse_* at the pymalloc census, pinned_waste their share
/// of the arenas' free space; `go tool pprof -lines` names their lines), and Parquet a
/// python_sites table and the pymalloc parts in snapshots. For an SBCL program, the
/// sampled Lisp stacks with their estimated bytes allocated (pprof: labelled kind=lisp,
/// alloc_space only), and Parquet a lisp_sites table. For a Go program that keeps a heap
/// profile, its stacks as `go tool pprof` would show them (pprof: labelled kind=go,
/// inuse_* and alloc_* scaled as pprof scales them, pinned_waste their share of the
/// sparse spans' free bytes).
/// The formats and the Parquet schema are described in docs/export.md.
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct ExportArgs {
    /// The trace (from `fragscope record`).
    trace: PathBuf,
    /// The output format.
    #[arg(long, short, value_enum)]
    format: Format,
    /// Where to write: a file, or for parquet a directory (created if needed) that gets
    /// one file per table; `-` is stdout for collapsed and json.
    #[arg(long, short, value_name = "PATH")]
    output: PathBuf,
    /// The figure each folded stack carries (collapsed only; default alloc_space).
    #[arg(long, value_enum)]
    value: Option<Value>,
    /// Export this process (default: the one with the highest RSS; see `fragscope info`).
    #[arg(long)]
    pid: Option<u32>,
    /// Pages whose live bytes fill less than this percentage count as pinned by the
    /// objects in them (pinned waste).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    sparse_pct: u32,
    /// Rows in each table of sites and size classes of the JSON document (as `report --top`).
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Parquet: leave out the table of every call (events.parquet), the largest by far.
    #[arg(long)]
    no_events: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// gzipped profile.proto heap profile
    Pprof,
    /// folded stacks: "root;...;leaf value" per line
    Collapsed,
    /// a directory of Parquet tables
    Parquet,
    /// the `report --json` document
    Json,
}

/// A figure of an allocation site.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
enum Value {
    /// bytes allocated over the whole run
    AllocSpace,
    /// allocations over the whole run
    AllocObjects,
    /// bytes live at the focus snapshot
    InuseSpace,
    /// objects live at the focus snapshot
    InuseObjects,
    /// free bytes kept resident in sparse pages by the site's live objects
    PinnedWaste,
    /// bytes still live at the end of the trace (leaked, if the process exited)
    LeakedSpace,
    /// allocations freed by their thread before it allocated anything else
    TemporaryObjects,
}

impl Value {
    const ALL: [Value; 7] = [
        Value::AllocObjects,
        Value::AllocSpace,
        Value::InuseObjects,
        Value::InuseSpace,
        Value::PinnedWaste,
        Value::LeakedSpace,
        Value::TemporaryObjects,
    ];

    fn of(self, s: &Site) -> u64 {
        match self {
            Value::AllocSpace => s.allocated_bytes,
            Value::AllocObjects => s.allocations,
            Value::InuseSpace => s.live_bytes,
            Value::InuseObjects => s.live_objects,
            Value::PinnedWaste => s.pinned_waste,
            Value::LeakedSpace => s.leaked_bytes,
            Value::TemporaryObjects => s.temporary_allocations,
        }
    }

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

    /// pprof's name and unit for the figure.
    fn pprof(self) -> (&'static str, &'static str) {
        match self {
            Value::AllocSpace => ("alloc_space", "bytes"),
            Value::AllocObjects => ("alloc_objects", "count"),
            Value::InuseSpace => ("inuse_space", "bytes"),
            Value::InuseObjects => ("inuse_objects", "count"),
            Value::PinnedWaste => ("pinned_waste", "bytes"),
            Value::LeakedSpace => ("leaked_space", "bytes"),
            Value::TemporaryObjects => ("temporary_objects", "count"),
        }
    }
}

pub fn run(a: ExportArgs) -> Result<ExitCode> {
    if a.value.is_some() && a.format != Format::Collapsed {
        bail!("--value applies to --format collapsed only (pprof carries every figure)");
    }
    let to_stdout = a.output.as_os_str() == "-";
    if to_stdout && matches!(a.format, Format::Pprof | Format::Parquet) {
        bail!("-o - (stdout) is for collapsed and json; pprof and parquet need a path");
    }
    if !to_stdout && a.format != Format::Parquet && a.output.is_dir() {
        bail!("{} is a directory: give a file name", a.output.display());
    }
    if !to_stdout && a.format != Format::Parquet {
        writable(&a.output)?;
    }
    if let Some(ghc) = crate::ghc_report::load(&a.trace)? {
        if a.format != Format::Json {
            bail!(
                "{} is a GHC program's recording: its heap is the RTS's, with no malloc \
                 allocation sites; only --format json applies",
                a.trace.display()
            );
        }
        return write_output(&a.output, json_text(&ghc)?.as_bytes());
    }
    let size = std::fs::metadata(&a.trace)
        .with_context(|| format!("cannot open {}", a.trace.display()))?
        .len();
    let opts = Options {
        pid: a.pid,
        sparse_pct: a.sparse_pct,
        top: a.top,
        all_sites: a.format != Format::Json,
    };
    let bar = progress::bar(size, "analysing");
    let report = analyze(&a.trace, &opts, |done, _| bar.set_position(done))
        .with_context(|| format!("analysing {}", a.trace.display()))?;
    bar.finish_and_clear();
    if a.format != Format::Json && report.stacks == "none" {
        eprintln!(
            "fragscope: warning: {} was recorded with --stacks none: it has no allocation \
             sites, so the export holds no stacks",
            a.trace.display()
        );
    }
    match a.format {
        Format::Json => write_output(&a.output, json_text(&report)?.as_bytes()),
        Format::Collapsed => write_output(
            &a.output,
            collapsed(&report, a.value.unwrap_or(Value::AllocSpace)).as_bytes(),
        ),
        Format::Pprof => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&pprof(&report))?;
            write_output(&a.output, &gz.finish()?)
        }
        Format::Parquet => {
            let tables = parquet_tables(&a.trace, &a.output, &report, !a.no_events, size)?;
            eprintln!(
                "fragscope: wrote {} ({})",
                a.output.display(),
                tables.join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The same text as `fragscope report --json` prints.
fn json_text(v: &impl serde::Serialize) -> Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

/// Fails early, before a long analysis, when `path` cannot be written; leaves no file.
fn writable(path: &Path) -> Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn write_output(path: &Path, bytes: &[u8]) -> Result<ExitCode> {
    if path.as_os_str() == "-" {
        std::io::stdout().lock().write_all(bytes)?;
    } else {
        std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("fragscope: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// A frame's name in folded stacks and flame graphs, without the characters that the
/// folded format uses as separators.
fn folded_name(f: &Frame) -> String {
    f.label()
        .chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
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
fn python_stacks(r: &Report) -> &[PythonStack] {
    r.python_sites.as_ref().map_or(&[], |p| &p.stacks)
}

/// An SBCL process's sampled Lisp stacks (none for other programs).
fn lisp_stacks(r: &Report) -> &[LispStack] {
    r.lisp_sites.as_ref().map_or(&[], |l| &l.stacks)
}

/// A runtime's sampled stack (CPython's, SBCL's) as frames without addresses, innermost
/// first, with its figures in [`Value::ALL`]'s order.
struct SampledStack {
    /// pprof's `kind` label.
    kind: &'static str,
    /// The name of a stack without frames.
    none: &'static str,
    frames: Vec<Frame>,
    values: Vec<u64>,
}

/// A frame of only a name (a Lisp function, a placeholder), without an address.
fn named_frame(name: &str) -> Frame {
    Frame {
        addr: 0,
        function: Some(name.to_string()),
        file: None,
        line: None,
        module: String::new(),
        offset: 0,
        inlined: false,
    }
}

/// The runtimes' sampled stacks of `r`; Python frames named for pprof when `for_pprof`.
fn sampled_stacks(r: &Report, for_pprof: bool) -> Vec<SampledStack> {
    let python = python_stacks(r).iter().map(|s| SampledStack {
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
    });
    let lisp = lisp_stacks(r).iter().map(|s| SampledStack {
        kind: "lisp",
        none: NO_LISP_FRAME,
        frames: s.frames.iter().map(|f| named_frame(f)).collect(),
        values: Value::ALL.iter().map(|v| v.of_lisp(s)).collect(),
    });
    // A Go site's frames are labels, "function (file:line)": the function names the
    // frame, the line its location.
    let go = (r.go_sites.iter().flat_map(|g| &g.sites)).map(|s| SampledStack {
        kind: "go",
        none: "(no Go frame)",
        frames: s.stack.iter().map(|label| go_frame(label)).collect(),
        values: Value::ALL.iter().map(|v| v.of_go(s)).collect(),
    });
    python.chain(lisp).chain(go).collect()
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

/// Folded stacks, root first, one line per distinct stack (sites whose frames read the
/// same are summed), sites without the figure left out. A CPython process's Python
/// stacks and an SBCL process's Lisp stacks follow as stacks of their own (rooted at
/// their outermost frame).
fn collapsed(r: &Report, value: Value) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    // Frames innermost first, as the model keeps them; folded stacks go root first.
    let mut add = |frames: &[Frame], none: &str, v: u64| {
        if v == 0 {
            return;
        }
        let path = if frames.is_empty() {
            none.to_string()
        } else {
            frames
                .iter()
                .rev()
                .map(folded_name)
                .collect::<Vec<_>>()
                .join(";")
        };
        *lines.entry(path).or_default() += v;
    };
    for s in &r.all_sites {
        add(&s.frames, "(no stack)", value.of(s));
    }
    let column = Value::ALL.iter().position(|&v| v == value).unwrap_or(0);
    for s in sampled_stacks(r, false) {
        add(&s.frames, s.none, s.values[column]);
    }
    let mut out = String::new();
    for (path, v) in lines {
        out.push_str(&path);
        out.push(' ');
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

/// pprof's profile.proto (github.com/google/pprof/proto/profile.proto), the messages this
/// export writes. Field numbers and types are the proto's.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Builds a profile's string table, locations, functions and mappings.
#[derive(Default)]
struct ProfileBuilder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<u64, u64>,
    /// Locations of frames without an address, by function and line.
    line_locations: HashMap<(u64, i64), u64>,
    mappings: HashMap<String, usize>,
}

impl ProfileBuilder {
    fn new() -> Self {
        let mut b = Self::default();
        b.s("");
        b
    }

    fn s(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> proto::ValueType {
        proto::ValueType {
            r#type: self.s(kind),
            unit: self.s(unit),
        }
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let name = match &f.function {
            Some(n) => self.s(n),
            None => self.s(&format!("{}+{:#x}", f.module, f.offset)),
        };
        let file = self.s(f.file.as_deref().unwrap_or(""));
        let next = self.p.function.len() as u64 + 1;
        let id = *self.functions.entry((name, file)).or_insert(next);
        if id == next {
            self.p.function.push(proto::Function {
                id,
                name,
                system_name: name,
                filename: file,
                start_line: 0,
            });
        }
        id
    }

    fn mapping(&mut self, f: &Frame) -> u64 {
        if f.module.is_empty() || f.module == "?" {
            return 0;
        }
        let start = f.addr.saturating_sub(f.offset);
        let i = match self.mappings.get(&f.module) {
            Some(&i) => i,
            None => {
                let filename = self.s(&f.module);
                self.p.mapping.push(proto::Mapping {
                    id: self.p.mapping.len() as u64 + 1,
                    memory_start: start,
                    memory_limit: f.addr + 1,
                    filename,
                    ..Default::default()
                });
                self.mappings
                    .insert(f.module.clone(), self.p.mapping.len() - 1);
                self.p.mapping.len() - 1
            }
        };
        let m = &mut self.p.mapping[i];
        m.memory_start = m.memory_start.min(start);
        m.memory_limit = m.memory_limit.max(f.addr + 1);
        m.has_functions |= f.function.is_some();
        m.has_filenames |= f.file.is_some();
        m.has_line_numbers |= f.line.is_some();
        m.has_inline_frames |= f.inlined;
        m.id
    }

    /// The location of one return address: its frames (inlined ones first, as pprof
    /// lists a location's lines).
    fn location(&mut self, frames: &[Frame]) -> u64 {
        let addr = frames[0].addr;
        if let Some(&id) = self.locations.get(&addr) {
            return id;
        }
        let mapping_id = self.mapping(&frames[frames.len() - 1]);
        let line = frames
            .iter()
            .map(|f| proto::Line {
                function_id: self.function(f),
                line: i64::from(f.line.unwrap_or(0)),
            })
            .collect();
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id,
            address: addr,
            line,
        });
        self.locations.insert(addr, id);
        id
    }

    /// The location of a frame without an address (an interpreted line): one per function
    /// and line, in no mapping.
    fn line_location(&mut self, f: &Frame) -> u64 {
        let function_id = self.function(f);
        let line = i64::from(f.line.unwrap_or(0));
        if let Some(&id) = self.line_locations.get(&(function_id, line)) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line { function_id, line }],
        });
        self.line_locations.insert((function_id, line), id);
        id
    }
}

/// The heap profile: one sample per allocation site, with every figure of [`Value::ALL`].
///
/// A CPython process's sampled Python stacks are samples of the same profile, with the
/// same sample types, labelled `kind=python`: the objects sampled (512 bytes or less) live
/// in pymalloc's arenas, which it maps itself, not in malloc's blocks, so nothing is
/// counted twice, and `go tool pprof
/// -top` then ranks Python lines beside native sites by the same figure (what holds
/// memory, whichever allocator), while `-tagfocus=kind=python` keeps the Python lines
/// alone. Separate sample types would leave every Python figure out of the default view.
fn pprof(r: &Report) -> Vec<u8> {
    use prost::Message as _;
    let mut b = ProfileBuilder::new();
    b.p.sample_type = Value::ALL.iter().map(|v| b.value_type(v.pprof())).collect();
    b.p.default_sample_type = b.s("inuse_space");
    b.p.period_type = Some(b.value_type(("space", "bytes")));
    b.p.period = 1;
    b.p.duration_nanos = (r.duration_ms * 1e6) as i64;
    let mut comments = vec![
        format!("fragscope export of {} (pid {})", r.trace, r.pid),
        format!("program: {}", r.argv.join(" ")),
    ];
    if let Some(t) = r.sites.t_ms {
        comments.push(format!(
            "inuse_* and pinned_waste at {t:.0} ms (the report's focus snapshot); \
             pinned_waste: free bytes in pages under {}% live",
            r.sites.sparse_pct
        ));
    }
    if r.stacks == "sampled" {
        comments.push("stacks were sampled: figures are estimates".into());
    }
    let census_ms = r
        .pymalloc_snapshot
        .and_then(|i| r.snapshots.get(i))
        .map(|s| s.t_ms);
    if !python_stacks(r).is_empty() {
        comments.push(format!(
            "samples labelled kind=python: CPython objects of 512 bytes or less by Python \
             stack, estimated from sampled allocations; inuse_* {}, pinned_waste their \
             share of the free space of the arenas they are in; leaked and temporary not \
             followed (0)",
            census_ms.map_or("unknown (no pymalloc census)".to_string(), |t| format!(
                "at the pymalloc census at {t:.0} ms"
            ))
        ));
    }
    b.p.comment = comments.iter().map(|c| b.s(c)).collect();
    // pprof names the profile after its first mapping: make it the program's.
    let program = r.argv.first().map(|a| a.rsplit('/').next().unwrap_or(a));
    if let Some(f) = r
        .all_sites
        .iter()
        .flat_map(|s| &s.frames)
        .find(|f| Some(f.module.as_str()) == program)
    {
        b.mapping(f);
    }
    let stack_key = b.s("stack");
    let no_stack = Frame {
        addr: 0,
        function: Some("(no stack)".into()),
        file: None,
        line: None,
        module: String::new(),
        offset: 0,
        inlined: false,
    };
    for s in &r.all_sites {
        let value: Vec<i64> = Value::ALL.iter().map(|v| v.of(s) as i64).collect();
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let mut location_id = Vec::new();
        // Frames sharing a return address (inlined, then their caller) make one location.
        for group in s.frames.chunk_by(|a, b| a.addr == b.addr) {
            location_id.push(b.location(group));
        }
        if location_id.is_empty() {
            location_id.push(b.location(std::slice::from_ref(&no_stack)));
        }
        b.p.sample.push(proto::Sample {
            location_id,
            value,
            label: vec![proto::Label {
                key: stack_key,
                num: i64::from(s.stack),
                ..Default::default()
            }],
        });
    }
    runtime_samples(&mut b, &sampled_stacks(r, true));
    b.p.encode_to_vec()
}

/// The samples of a runtime's stacks (CPython's, SBCL's), labelled kind=python or
/// kind=lisp (see [`pprof`]).
fn runtime_samples(b: &mut ProfileBuilder, stacks: &[SampledStack]) {
    for s in stacks {
        let value: Vec<i64> = s.values.iter().map(|&v| v as i64).collect();
        if value.iter().all(|&v| v == 0) {
            continue;
        }
        let mut location_id: Vec<u64> = s.frames.iter().map(|f| b.line_location(f)).collect();
        if location_id.is_empty() {
            location_id.push(b.line_location(&named_frame(s.none)));
        }
        let kind = proto::Label {
            key: b.s("kind"),
            str: b.s(s.kind),
            ..Default::default()
        };
        b.p.sample.push(proto::Sample {
            location_id,
            value,
            label: vec![kind],
        });
    }
}

// ---------------------------------------------------------------------------------------
// Parquet

/// Rows per record batch (and so per row group at most) of the event table.
const EVENT_BATCH: usize = 1 << 16;

fn u64_col(name: &str, v: Vec<u64>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt64, false),
        Arc::new(UInt64Array::from(v)),
    )
}

fn u32_col(name: &str, v: Vec<u32>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::UInt32, false),
        Arc::new(UInt32Array::from(v)),
    )
}

fn f64_col(name: &str, v: Vec<f64>) -> (Field, ArrayRef) {
    (
        Field::new(name, DataType::Float64, false),
        Arc::new(Float64Array::from(v)),
    )
}

fn str_col(name: &str, v: Vec<Option<String>>) -> (Field, ArrayRef) {
    let nullable = v.iter().any(Option::is_none);
    (
        Field::new(name, DataType::Utf8, nullable),
        Arc::new(StringArray::from(v)),
    )
}

/// A batch from named columns (and the schema it fixes).
fn batch(cols: Vec<(Field, ArrayRef)>) -> Result<RecordBatch> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = cols.into_iter().unzip();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}

/// Writes Parquet files of one run, each with the run's identity in its key-value metadata.
struct TableWriter<'a> {
    dir: &'a Path,
    metadata: Vec<KeyValue>,
}

impl TableWriter<'_> {
    fn open(&self, name: &str, schema: Arc<Schema>) -> Result<ArrowWriter<std::fs::File>> {
        let path = self.dir.join(format!("{name}.parquet"));
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_key_value_metadata(Some(self.metadata.clone()));
        // Sequence numbers and addresses (neighbours come close together in time) move by
        // small steps: deltas take a few bits where a dictionary fails. Sizes repeat: they
        // keep the default dictionary.
        for field in schema.fields() {
            if ["seq", "address", "old_address"].contains(&field.name().as_str()) {
                let col = ColumnPath::from(field.name().as_str());
                props = props
                    .set_column_dictionary_enabled(col.clone(), false)
                    .set_column_encoding(col, Encoding::DELTA_BINARY_PACKED);
            }
        }
        let props = props.build();
        ArrowWriter::try_new(file, schema, Some(props))
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// One table written in one go.
    fn write(&self, name: &str, b: RecordBatch) -> Result<String> {
        let mut w = self.open(name, b.schema())?;
        w.write(&b)?;
        w.close()?;
        Ok(format!("{name}: {} rows", b.num_rows()))
    }
}

/// Writes the tables into `dir`; returns a line per table.
fn parquet_tables(
    trace: &Path,
    dir: &Path,
    r: &Report,
    events: bool,
    trace_bytes: u64,
) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let kv = |k: &str, v: String| KeyValue::new(format!("fragscope.{k}"), v);
    let w = TableWriter {
        dir,
        metadata: vec![
            kv("trace", r.trace.clone()),
            kv("pid", r.pid.to_string()),
            kv("stream", r.stream.to_string()),
            kv("argv", serde_json::to_string(&r.argv)?),
            kv("stacks", r.stacks.clone()),
            kv("version", env!("CARGO_PKG_VERSION").to_string()),
        ],
    };
    let mut done = vec![
        w.write("sites", sites_batch(r)?)?,
        w.write("snapshots", snapshots_batch(r)?)?,
        w.write("occupancy", occupancy_batch(r)?)?,
    ];
    if r.python_sites.is_some() {
        done.push(w.write("python_sites", python_sites_batch(python_stacks(r))?)?);
    }
    if r.lisp_sites.is_some() {
        done.push(w.write("lisp_sites", lisp_sites_batch(lisp_stacks(r))?)?);
    }
    if let Some(g) = &r.go_sites {
        done.push(w.write("go_sites", go_sites_batch(&g.sites)?)?);
    }
    done.extend(raw_tables(&w, trace, r.stream, events, trace_bytes)?);
    Ok(done)
}

fn sites_batch(r: &Report) -> Result<RecordBatch> {
    let sites = &r.all_sites;
    let leaf = |s: &Site| {
        s.frames
            .iter()
            .find(|f| f.label() == s.label)
            .or(s.frames.first())
            .cloned()
    };
    let leaves: Vec<Option<Frame>> = sites.iter().map(leaf).collect();
    let mut frames = ListBuilder::new(StringBuilder::new());
    for s in sites {
        for f in &s.frames {
            frames.values().append_value(f.label());
        }
        frames.append(true);
    }
    let frames = frames.finish();
    let mut cols = vec![
        u32_col("stack", sites.iter().map(|s| s.stack).collect()),
        str_col(
            "label",
            sites.iter().map(|s| Some(s.label.clone())).collect(),
        ),
        str_col(
            "function",
            leaves
                .iter()
                .map(|f| f.as_ref().and_then(|f| f.function.clone()))
                .collect(),
        ),
        str_col(
            "file",
            leaves
                .iter()
                .map(|f| f.as_ref().and_then(|f| f.file.clone()))
                .collect(),
        ),
        (
            Field::new("line", DataType::UInt32, true),
            Arc::new(UInt32Array::from(
                leaves
                    .iter()
                    .map(|f| f.as_ref().and_then(|f| f.line))
                    .collect::<Vec<_>>(),
            )),
        ),
        str_col(
            "module",
            leaves
                .iter()
                .map(|f| f.as_ref().map(|f| f.module.clone()))
                .collect(),
        ),
        (
            Field::new("frames", frames.data_type().clone(), false),
            Arc::new(frames),
        ),
    ];
    for v in Value::ALL {
        cols.push(u64_col(
            v.pprof().0,
            sites.iter().map(|s| v.of(s)).collect(),
        ));
    }
    cols.push(u64_col(
        "pinning_objects",
        sites.iter().map(|s| s.pinning_objects).collect(),
    ));
    cols.push(f64_col(
        "pinned_pages",
        sites.iter().map(|s| s.pinned_pages).collect(),
    ));
    batch(cols)
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

/// One row per sampled Lisp stack of an SBCL process.
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

fn snapshots_batch(r: &Report) -> Result<RecordBatch> {
    let s = &r.snapshots;
    let u = |name: &str, f: fn(&fragscope_model::report::Snapshot) -> u64| {
        u64_col(name, s.iter().map(f).collect())
    };
    // A part unknown at some snapshots (a runtime's heap without its census there): null.
    let unknown_or_u64 = |name: &str, f: fn(&fragscope_model::report::Snapshot) -> Option<u64>| {
        (
            Field::new(name, DataType::UInt64, true),
            Arc::new(UInt64Array::from(s.iter().map(f).collect::<Vec<_>>())) as ArrayRef,
        )
    };
    // The split of pymalloc's arenas: null where no census came with the snapshot.
    let pm = |name: &str, f: fn(&PymallocParts) -> u64| -> (Field, ArrayRef) {
        (
            Field::new(name, DataType::UInt64, true),
            Arc::new(UInt64Array::from(
                s.iter()
                    .map(|x| x.pymalloc.as_ref().map(f))
                    .collect::<Vec<_>>(),
            )),
        )
    };
    // The split of a Go heap: null where no census came with the snapshot.
    let go = |name: &str, f: fn(&GoParts) -> u64| -> (Field, ArrayRef) {
        (
            Field::new(name, DataType::UInt64, true),
            Arc::new(UInt64Array::from(
                s.iter().map(|x| x.go.as_ref().map(f)).collect::<Vec<_>>(),
            )),
        )
    };
    batch(vec![
        u32_col("snapshot", (0..s.len() as u32).collect()),
        f64_col("t_ms", s.iter().map(|x| x.t_ms).collect()),
        str_col("reason", s.iter().map(|x| Some(x.reason.clone())).collect()),
        u("rss", |x| x.parts.rss),
        unknown_or_u64("live", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.live)
        }),
        unknown_or_u64("rounding", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.rounding)
        }),
        unknown_or_u64("allocator_overhead", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.allocator_overhead)
        }),
        unknown_or_u64("free_in_used_pages", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.free_in_used_pages)
        }),
        unknown_or_u64("free_resident_pages", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.free_resident_pages)
        }),
        unknown_or_u64("lazy_free", |x| {
            (!x.parts.malloc_unknown).then_some(x.parts.lazy_free)
        }),
        unknown_or_u64("pymalloc_arenas", |x| x.parts.pymalloc_arenas),
        unknown_or_u64("sbcl_dynamic_space", |x| x.parts.sbcl_dynamic_space),
        unknown_or_u64("go_heap", |x| x.parts.go_heap),
        unknown_or_u64("jvm_heap", |x| x.parts.jvm_heap),
        unknown_or_u64("jvm_runtime", |x| x.parts.jvm_runtime),
        unknown_or_u64("v8_heap", |x| x.parts.v8_heap),
        u("other_anon", |x| x.parts.other_anon),
        u("file", |x| x.parts.file),
        u("fragscope_own", |x| x.parts.fragscope_own),
        (
            Field::new("unexplained", DataType::Int64, false),
            Arc::new(Int64Array::from(
                s.iter().map(|x| x.parts.unexplained).collect::<Vec<_>>(),
            )),
        ),
        u("rss_anon", |x| x.parts.rss_anon),
        u("heap_resident", |x| x.parts.heap_resident),
        u("live_not_resident", |x| x.live_not_resident),
        u("page_size", |x| x.page_size),
        u("used_pages", |x| x.used_pages),
        u("empty_pages", |x| x.empty_pages),
        pm("pymalloc_in_use", |p| p.in_use),
        pm("pymalloc_free_in_used_pools", |p| p.free_in_used_pools),
        pm("pymalloc_free_pools", |p| p.free_pools),
        pm("pymalloc_empty_arenas", |p| p.empty_arenas),
        go("go_objects", |p| p.objects),
        go("go_free_slots", |p| p.free_slots),
        go("go_idle_kept", |p| p.idle_kept),
        go("go_stacks", |p| p.stacks),
    ])
}

fn occupancy_batch(r: &Report) -> Result<RecordBatch> {
    let rows: Vec<(u32, f64, &fragscope_model::report::OccupancyBucket)> = r
        .snapshots
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.occupancy.iter().map(move |b| (i as u32, s.t_ms, b)))
        .collect();
    batch(vec![
        u32_col("snapshot", rows.iter().map(|x| x.0).collect()),
        f64_col("t_ms", rows.iter().map(|x| x.1).collect()),
        u32_col("lo_pct", rows.iter().map(|x| x.2.lo_pct).collect()),
        u32_col("hi_pct", rows.iter().map(|x| x.2.hi_pct).collect()),
        u64_col("pages", rows.iter().map(|x| x.2.pages).collect()),
        u64_col("live_bytes", rows.iter().map(|x| x.2.live_bytes).collect()),
    ])
}

/// Columns of the event table, filled a batch at a time.
#[derive(Default)]
struct Events {
    seq: Vec<u64>,
    t_ms: Vec<f64>,
    tid: Vec<u32>,
    func: Vec<&'static str>,
    address: Vec<u64>,
    old_address: Vec<u64>,
    size: Vec<u64>,
    usable: Vec<u64>,
    freed: Vec<u64>,
    stack: Vec<u32>,
}

impl Events {
    fn push(&mut self, seq: u64, c: calls::CallRow) {
        self.seq.push(seq);
        self.t_ms.push(c.t_ms);
        self.tid.push(c.tid);
        self.func.push(c.func);
        self.address.push(c.address);
        self.old_address.push(c.old_address);
        self.size.push(c.size);
        self.usable.push(c.usable);
        self.freed.push(c.freed);
        self.stack.push(c.stack);
    }

    fn take(&mut self) -> Result<RecordBatch> {
        let e = std::mem::take(self);
        batch(vec![
            u64_col("seq", e.seq),
            f64_col("t_ms", e.t_ms),
            u32_col("tid", e.tid),
            (
                Field::new("func", DataType::Utf8, false),
                Arc::new(StringArray::from(e.func)),
            ),
            u64_col("address", e.address),
            u64_col("old_address", e.old_address),
            u64_col("size", e.size),
            u64_col("usable", e.usable),
            u64_col("freed", e.freed),
            u32_col("stack", e.stack),
        ])
    }
}

/// The RSS table, and the event table unless `events` is false: a second pass over the
/// trace, written a batch at a time.
fn raw_tables(
    w: &TableWriter,
    trace: &Path,
    stream: u32,
    events: bool,
    trace_bytes: u64,
) -> Result<Vec<String>> {
    let mut rss: Vec<calls::RssRow> = Vec::new();
    let mut ev = Events::default();
    let mut writer = if events {
        Some(w.open("events", ev.take()?.schema())?)
    } else {
        None
    };
    let mut seq = 0u64;
    let mut failed: Option<anyhow::Error> = None;
    let bar = progress::bar(trace_bytes, "exporting calls");
    calls::for_each(
        trace,
        stream,
        events,
        |row| match row {
            Row::Rss(r) => rss.push(r),
            Row::Call(c) => {
                let Some(out) = writer.as_mut() else { return };
                if failed.is_some() {
                    return;
                }
                ev.push(seq, c);
                seq += 1;
                if ev.seq.len() >= EVENT_BATCH {
                    if let Err(e) = ev.take().and_then(|b| Ok(out.write(&b)?)) {
                        failed = Some(e);
                    }
                }
            }
        },
        |done, _| bar.set_position(done),
    )
    .with_context(|| format!("reading {}", trace.display()))?;
    bar.finish_and_clear();
    if let Some(e) = failed {
        return Err(e.context("writing events.parquet"));
    }
    let mut done = Vec::new();
    if let Some(mut out) = writer {
        if !ev.seq.is_empty() {
            out.write(&ev.take()?)?;
        }
        out.close()?;
        done.push(format!("events: {seq} rows"));
    }
    rss.sort_by(|a, b| a.t_ms.total_cmp(&b.t_ms));
    done.push(w.write(
        "rss",
        batch(vec![
            f64_col("t_ms", rss.iter().map(|x| x.t_ms).collect()),
            u64_col("rss", rss.iter().map(|x| x.rss).collect()),
            u64_col("rss_anon", rss.iter().map(|x| x.rss_anon).collect()),
            u64_col("rss_file", rss.iter().map(|x| x.rss_file).collect()),
            u64_col("rss_shmem", rss.iter().map(|x| x.rss_shmem).collect()),
        ])?,
    )?);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_names_cannot_split_a_line_or_a_stack() {
        let f = Frame {
            addr: 0x1234,
            function: Some("a;b\nc".into()),
            file: Some("/src/x;y.c".into()),
            line: Some(7),
            module: "prog".into(),
            offset: 0x234,
            inlined: false,
        };
        let name = folded_name(&f);
        assert!(!name.contains(';') && !name.contains('\n'), "{name}");
        assert!(name.starts_with("a:b c"), "{name}");
    }
}
