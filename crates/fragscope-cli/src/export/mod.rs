//! `fragscope export`: the model's figures in formats other tools read — pprof's
//! profile.proto, folded stacks, Parquet tables, and the report's JSON document.
//!
//! Like the other views, this module only reshapes what the model returns: the sites
//! (with their symbolized stacks) and snapshots of a [`Report`], and for Parquet's raw
//! tables the merged calls and RSS samples of [`fragscope_model::calls`]. The formats are
//! described in docs/export.md.

mod parquet_tables;
mod pprof_profile;
mod runtimes;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use fragscope_model::report::{Report, Site};
use fragscope_model::symbols::Frame;
use fragscope_model::{analyze, At, Options};

use crate::input::Input;
use crate::progress;
use parquet_tables::parquet_tables;
use pprof_profile::pprof;
use runtimes::{SampledStack, RUNTIMES};

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
/// waste, or the one `--at` asks for), and pinned_waste (free bytes that each site's live objects keep resident in
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
    /// The snapshot whose live bytes and pinned waste are exported, as `report --at`:
    /// peak-live, peak-rss, end, or a time into the recording (930ms, 1.5s, 12).
    #[arg(long, value_name = "WHEN", value_parser = At::parse)]
    at: Option<At>,
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
    let input = Input::read(&a.trace, "analysing")?;
    if let Some(ghc) = crate::ghc_report::load(&a.trace, &input)? {
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
        at: a.at,
        ..Options::default()
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

/// The runtimes' sampled stacks of `r`, runtime by runtime in [`RUNTIMES`]' order; Python
/// frames named for pprof when `for_pprof`.
fn sampled_stacks(r: &Report, for_pprof: bool) -> Vec<SampledStack> {
    RUNTIMES
        .iter()
        .flat_map(|runtime| (runtime.stacks)(r, for_pprof))
        .collect()
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
