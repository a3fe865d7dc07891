//! `fragscope compare`: the same program under several allocators (or settings), or
//! existing traces, side by side.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use fragscope_model::compare::{GhcRunFigures, RunFigures};
use fragscope_model::ghc::GhcReport;
use fragscope_model::{analyze, Options};
use serde::Serialize;

use crate::input::Input;
use crate::units::{bytes, count};

/// Compare allocators on one program, or compare recorded traces.
///
/// With a command, runs it once per allocator (preloading the system's library) and per
/// --variant, each run recorded; prints peak and end RSS, live data, heap resident, the
/// waste by part and the fragmentation ratio side by side (medians with --runs). The
/// program's output goes to a log beside each trace.
/// With trace files instead, compares those (e.g. before and after a fix). Traces of
/// GHC programs, and GHC eventlogs, are compared with the GHC model: live data, heap
/// size, free blocks, the block census and the GC table, where memory settled.
///
/// Examples:
///   fragscope compare -- ./server --bench
///   fragscope compare --allocators glibc,jemalloc --variant jemalloc:MALLOC_CONF=dirty_decay_ms:0 -- ./prog
///   fragscope compare --variant glibc:MALLOC_ARENA_MAX=2 --runs 3 -- ./prog
///   fragscope compare strip.fsc take.fsc
///   fragscope compare strip.fsc take.fsc --html compare.html
///   fragscope compare strip.eventlog take.eventlog
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct CompareArgs {
    /// Traces to compare (instead of a command).
    traces: Vec<PathBuf>,
    /// Allocators to run the command under (glibc, jemalloc, tcmalloc, mimalloc).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "glibc,jemalloc,tcmalloc,mimalloc"
    )]
    allocators: Vec<String>,
    /// An extra configuration: ALLOCATOR:NAME=VALUE[;NAME=VALUE...] (environment settings).
    #[arg(long, value_name = "ALLOCATOR:K=V")]
    variant: Vec<String>,
    /// Runs per configuration; the table shows medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Environment for every run (K=V, repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Keep the traces and program logs in this directory (default: a temporary one).
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the comparison as one self-contained HTML page to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// The program to run and its arguments.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// One configuration: an allocator library (none: glibc) and environment settings.
struct Config {
    label: String,
    preload: Option<PathBuf>,
    env: Vec<(String, String)>,
}

#[derive(Serialize)]
struct Column {
    label: String,
    /// A short name for the table's header (the label when it is short).
    #[serde(skip)]
    short: String,
    runs: usize,
    traces: Vec<String>,
    /// "malloc", or "ghc" for a GHC program's trace or eventlog.
    kind: &'static str,
    #[serde(flatten)]
    figures: Figures,
    /// The report of the (last) run, for --html.
    #[serde(skip)]
    report: Option<Report>,
}

/// A column's figures: the malloc model's, or the GHC model's.
#[derive(Serialize)]
#[serde(untagged)]
enum Figures {
    Malloc(Box<RunFigures>),
    Ghc(Box<GhcRunFigures>),
}

/// A trace's report, by model.
enum Report {
    Malloc(Box<fragscope_model::Report>),
    Ghc(Box<GhcReport>),
}

/// The GHC report of `path` when it is a GHC program's trace or an eventlog, else the
/// malloc report.
fn load(path: &Path) -> Result<Report> {
    let input = Input::read(path, "analysing")?;
    if let Some(g) = crate::ghc_report::load(path, &input)? {
        return Ok(Report::Ghc(Box::new(g)));
    }
    let r = analyze(path, &Options::default(), |_, _| {})
        .with_context(|| format!("analysing {}", path.display()))?;
    Ok(Report::Malloc(Box::new(r)))
}

/// Refuses GHC traces beside malloc traces: a GHC heap is the RTS's megablocks, which
/// malloc never sees, so no figure of one model means the same in the other.
fn same_model(cols: &[Column]) -> Result<()> {
    let names = |kind: &str| {
        cols.iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.short.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (ghc, malloc) = (names("ghc"), names("malloc"));
    if !ghc.is_empty() && !malloc.is_empty() {
        bail!(
            "cannot compare GHC programs with malloc programs: {ghc} {} the GHC RTS's heap \
             (megablocks and blocks, from its eventlog), {malloc} {} a malloc heap, and no \
             figure means the same in both (a GHC heap is not made with malloc). Compare \
             GHC traces or eventlogs with each other, malloc traces with each other, or \
             read each with `fragscope report`",
            if ghc.contains(", ") { "show" } else { "shows" },
            if malloc.contains(", ") {
                "show"
            } else {
                "shows"
            },
        );
    }
    Ok(())
}

/// Where Debian puts each allocator, and the package that does.
fn allocator_library(name: &str) -> Result<Option<PathBuf>> {
    let (candidates, package): (&[&str], &str) = match name {
        "glibc" => return Ok(None),
        "jemalloc" => (&["libjemalloc.so.2"], "libjemalloc2"),
        "tcmalloc" => (
            &["libtcmalloc.so.4", "libtcmalloc_minimal.so.4"],
            "libgoogle-perftools4 (or libtcmalloc-minimal4)",
        ),
        "mimalloc" => (&["libmimalloc.so.2", "libmimalloc.so"], "libmimalloc2.0"),
        other => {
            bail!("unknown allocator {other:?}: choose from glibc, jemalloc, tcmalloc, mimalloc")
        }
    };
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ] {
        for c in candidates {
            let p = Path::new(dir).join(c);
            if p.exists() {
                return Ok(Some(p));
            }
        }
    }
    bail!("{name} is not installed: install Debian's package {package}, or leave it out with --allocators")
}

fn parse_env(kv: &str) -> Result<(String, String)> {
    match kv.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => bail!("{kv:?} is not NAME=VALUE"),
    }
}

fn configs(a: &CompareArgs) -> Result<Vec<Config>> {
    let mut out = Vec::new();
    for name in &a.allocators {
        out.push(Config {
            label: name.clone(),
            preload: allocator_library(name)?,
            env: Vec::new(),
        });
    }
    for v in &a.variant {
        let Some((alloc, settings)) = v.split_once(':') else {
            bail!("--variant {v:?}: expected ALLOCATOR:NAME=VALUE, e.g. jemalloc:MALLOC_CONF=dirty_decay_ms:0");
        };
        let env = settings
            .split(';')
            .map(parse_env)
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("--variant {v:?}"))?;
        out.push(Config {
            label: format!("{alloc} {settings}"),
            preload: allocator_library(alloc)?,
            env,
        });
    }
    if out.is_empty() {
        bail!("nothing to compare: give --allocators or --variant");
    }
    Ok(out)
}

/// Records one run of the command under `c`; returns the trace and the figures.
fn run_once(
    a: &CompareArgs,
    c: &Config,
    dir: &Path,
    n: usize,
) -> Result<(PathBuf, RunFigures, fragscope_model::Report)> {
    let slug: String = c
        .label
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect();
    let trace = dir.join(format!("{slug}-{n}.fsc"));
    let log = dir.join(format!("{slug}-{n}.log"));
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["record", "--stacks", "none", "-o"])
        .arg(&trace)
        .arg("--")
        .args(&a.command)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    match &c.preload {
        Some(p) => cmd.env("LD_PRELOAD", p),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    for kv in &a.env {
        let (k, v) = parse_env(kv).context("--env")?;
        cmd.env(k, v);
    }
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let cpu_before = children_cpu_ms();
    let start = Instant::now();
    let status = cmd.status().context("cannot run fragscope record")?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let cpu_ms = children_cpu_ms() - cpu_before;
    if !trace.exists() {
        bail!(
            "the run under {} left no trace (exit status {status}); see {}",
            c.label,
            log.display()
        );
    }
    if !status.success() {
        eprintln!(
            "fragscope: note: under {} the program ended with {status} (its output: {})",
            c.label,
            log.display()
        );
    }
    let report = analyze(&trace, &Options::default(), |_, _| {})
        .with_context(|| format!("analysing {}", trace.display()))?;
    let mut f = RunFigures::of(&report);
    f.wall_ms = Some(wall_ms);
    f.cpu_ms = Some(cpu_ms);
    Ok((trace, f, report))
}

/// User + system CPU of all waited-for children so far.
fn children_cpu_ms() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

pub fn run(a: CompareArgs) -> Result<ExitCode> {
    let columns = if a.command.is_empty() {
        if a.traces.is_empty() {
            bail!("give traces to compare, or a command after -- to run under each allocator (see --help)");
        }
        let cols = a
            .traces
            .iter()
            .map(|t| {
                let report = load(t)?;
                let name = t.file_name().map_or(t.display().to_string(), |n| {
                    n.to_string_lossy().into_owned()
                });
                let (kind, figures) = match &report {
                    Report::Malloc(r) => ("malloc", Figures::Malloc(Box::new(RunFigures::of(r)))),
                    Report::Ghc(g) => ("ghc", Figures::Ghc(Box::new(GhcRunFigures::of(g)))),
                };
                Ok(Column {
                    short: name,
                    label: t.display().to_string(),
                    runs: 1,
                    traces: vec![t.display().to_string()],
                    kind,
                    figures,
                    report: a.html.is_some().then_some(report),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        same_model(&cols)?;
        cols
    } else {
        if !a.traces.is_empty() {
            bail!("give either traces or a command after --, not both");
        }
        let configs = configs(&a)?;
        let temp;
        let dir = match &a.keep {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .with_context(|| format!("cannot create {}", d.display()))?;
                d.clone()
            }
            None => {
                temp = tempfile::tempdir()?;
                temp.path().to_path_buf()
            }
        };
        let total = configs.len() * a.runs as usize;
        let bar = crate::progress::steps(total as u64, "running");
        let mut cols = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let mut figures = Vec::new();
            let mut traces = Vec::new();
            let mut last = None;
            for n in 0..a.runs as usize {
                bar.set_message(format!("running under {}", c.label));
                let (t, f, report) = run_once(&a, c, &dir, n)?;
                traces.push(t.display().to_string());
                figures.push(f);
                last = a.html.is_some().then(|| Report::Malloc(Box::new(report)));
                bar.inc(1);
            }
            let alloc = c.label.split(' ').next().unwrap_or("");
            cols.push(Column {
                short: if c.label.len() <= 14 {
                    c.label.clone()
                } else {
                    format!("{alloc}#{}", i + 1)
                },
                label: c.label.clone(),
                runs: figures.len(),
                traces: if a.keep.is_some() { traces } else { Vec::new() },
                kind: "malloc",
                figures: Figures::Malloc(Box::new(RunFigures::median(&figures))),
                report: last,
            });
        }
        bar.finish_and_clear();
        cols
    };
    if let Some(path) = &a.html {
        let columns_json = serde_json::to_value(&columns)?;
        if columns.iter().any(|c| c.kind == "ghc") {
            let reports: Vec<_> = columns
                .iter()
                .map(|c| match &c.report {
                    Some(Report::Ghc(g)) => Some(g.as_ref()),
                    _ => None,
                })
                .collect();
            crate::html::write_ghc_compare(path, &columns_json, &reports)?;
        } else {
            let reports: Vec<_> = columns
                .iter()
                .map(|c| match &c.report {
                    Some(Report::Malloc(r)) => Some(r.as_ref()),
                    _ => None,
                })
                .collect();
            crate::html::write_compare(path, &columns_json, &reports)?;
        }
        eprintln!("fragscope: wrote {}", path.display());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "columns": columns }))?
        );
    } else if a.html.is_none() {
        if columns.iter().any(|c| c.kind == "ghc") {
            print!("{}", render_ghc(&columns));
        } else {
            print!("{}", render(&columns));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Formats one figure of a run for the table.
type FigureText = fn(&RunFigures) -> String;

/// The table's column width: the longest short name, at least 12, plus 2.
fn column_width(cols: &[Column]) -> usize {
    cols.iter()
        .map(|c| c.short.len())
        .max()
        .unwrap_or(0)
        .max(12)
        + 2
}

/// A figure at the focus snapshot; a run with none (no snapshot held live data, or its
/// heap was not read) has no such figure: unknown, not 0.
fn at_focus(f: &RunFigures, v: u64) -> String {
    f.focus_t_ms.map_or("–".into(), |_| bytes(v))
}

fn render(cols: &[Column]) -> String {
    let width = column_width(cols);
    let malloc = |c: &Column| match &c.figures {
        Figures::Malloc(f) => f.as_ref().clone(),
        Figures::Ghc(_) => RunFigures::default(),
    };
    let mut o = String::new();
    let runs = cols.iter().map(|c| c.runs).max().unwrap_or(1);
    let _ = write!(o, "{:<26}", if runs > 1 { "(medians)" } else { "" });
    for c in cols {
        let _ = write!(o, "{:>width$}", c.short);
    }
    o.push('\n');
    let rows: [(&str, FigureText); 22] = [
        ("peak RSS", |f| {
            f.peak_rss.map_or_else(|| "not sampled".into(), bytes)
        }),
        ("end RSS", |f| bytes(f.end_rss)),
        ("peak live", |f| f.peak_live.map_or("–".into(), bytes)),
        ("at the most waste:", |_| String::new()),
        ("  heap resident", |f| at_focus(f, f.heap_resident)),
        ("  live", |f| at_focus(f, f.live)),
        ("  rounding", |f| at_focus(f, f.rounding)),
        ("  allocator overhead", |f| {
            at_focus(f, f.allocator_overhead)
        }),
        ("  free in used pages", |f| {
            at_focus(f, f.free_in_used_pages)
        }),
        ("  free resident pages", |f| {
            at_focus(f, f.free_resident_pages)
        }),
        ("  lazily freed", |f| at_focus(f, f.lazy_free)),
        ("  other anonymous", |f| at_focus(f, f.other_anon)),
        ("  fragmentation ratio", |f| {
            f.fragmentation_ratio
                .map_or("-".into(), |r| format!("{r:.2}"))
        }),
        ("pymalloc arenas (CPython)", |f| count(f.pymalloc_arenas)),
        ("  resident", |f| bytes(f.pymalloc_resident)),
        ("  in use", |f| bytes(f.pymalloc_in_use)),
        ("  free", |f| bytes(f.pymalloc_free)),
        ("SBCL dynamic space", |f| bytes(f.sbcl_resident)),
        ("  objects", |f| bytes(f.sbcl_in_use)),
        ("  free", |f| bytes(f.sbcl_free)),
        ("wall time (recorded)", |f| {
            f.wall_ms
                .map_or("-".into(), |t| format!("{:.2} s", t / 1e3))
        }),
        ("CPU time (recorded)", |f| {
            f.cpu_ms.map_or("-".into(), |t| format!("{:.2} s", t / 1e3))
        }),
    ];
    // pymalloc's rows only when a column is a CPython program, SBCL's when one is SBCL.
    let python = cols.iter().any(|c| malloc(c).pymalloc_arenas > 0);
    let sbcl = cols.iter().any(|c| malloc(c).sbcl_resident > 0);
    for (i, (name, get)) in rows.into_iter().enumerate() {
        if ((13..17).contains(&i) && !python) || ((17..20).contains(&i) && !sbcl) {
            continue;
        }
        let _ = write!(o, "{name:<26}");
        for c in cols {
            let _ = write!(o, "{:>width$}", get(&malloc(c)));
        }
        o.push('\n');
    }
    for c in cols.iter().filter(|c| c.short != c.label) {
        let _ = writeln!(o, "{}: {}", c.short, c.label);
    }
    o
}

/// Formats one figure of a GHC run for the table.
type GhcFigureText = fn(&GhcRunFigures) -> String;

fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// How the GHC table shows a figure a run does not have.
const UNKNOWN: &str = "\u{2013}";

fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| UNKNOWN.into(), bytes)
}

fn opt_count(v: Option<u64>) -> String {
    v.map_or_else(|| UNKNOWN.into(), count)
}

/// The GHC programs' table: the RTS's heap where memory settled, its block census and the
/// GC table, side by side; then each column's headline.
fn render_ghc(cols: &[Column]) -> String {
    let width = column_width(cols);
    let figures: Vec<&GhcRunFigures> = cols
        .iter()
        .filter_map(|c| match &c.figures {
            Figures::Ghc(f) => Some(f.as_ref()),
            Figures::Malloc(_) => None,
        })
        .collect();
    let mut o = String::new();
    let _ = write!(o, "{:<34}", "(GHC programs)");
    for c in cols {
        let _ = write!(o, "{:>width$}", c.short);
    }
    o.push('\n');
    let row = |o: &mut String, name: &str, get: &dyn Fn(&GhcRunFigures) -> String| {
        let _ = write!(o, "{name:<34}");
        for f in &figures {
            let _ = write!(o, "{:>width$}", get(f));
        }
        o.push('\n');
    };
    let census = |f: &GhcRunFigures,
                  get: fn(&fragscope_model::compare::GhcCensusFigures) -> String| {
        f.census.as_ref().map_or_else(|| UNKNOWN.into(), get)
    };
    let rows: [(&str, GhcFigureText); 4] = [
        ("peak RSS", |f| opt_bytes(f.peak_rss)),
        ("end RSS", |f| opt_bytes(f.end_rss)),
        ("maximum residency (live)", |f| opt_bytes(f.max_residency)),
        ("memory in use (largest heap)", |f| {
            opt_bytes(f.memory_in_use)
        }),
    ];
    for (name, get) in rows {
        row(&mut o, name, &get);
    }
    row(&mut o, "where memory settled:", &|f| {
        f.settled_phase
            .map_or_else(|| UNKNOWN.into(), |k| k.name().into())
    });
    row(&mut o, "  from", &|f| {
        f.settled_start_ms.map_or(UNKNOWN.into(), secs)
    });
    row(&mut o, "  to", &|f| {
        f.settled_end_ms.map_or(UNKNOWN.into(), secs)
    });
    row(&mut o, "  read at", &|f| {
        f.settled_t_ms.map_or(UNKNOWN.into(), secs)
    });
    let rows: [(&str, GhcFigureText); 9] = [
        ("  RSS", |f| opt_bytes(f.rss)),
        ("  RSS - LazyFree", |f| opt_bytes(f.rss_minus_lazy_free)),
        ("  live (HEAP_LIVE)", |f| opt_bytes(f.live)),
        ("  heap size (megablocks)", |f| opt_bytes(f.heap_size)),
        ("  copy reserve and slop", |f| {
            opt_bytes(f.copy_reserve_and_slop)
        }),
        ("  free blocks in heap", |f| opt_bytes(f.free_blocks)),
        ("  lazily freed", |f| opt_bytes(f.lazy_free)),
        ("  other anonymous", |f| opt_bytes(f.other_anon)),
        ("block census at", |f| {
            f.census
                .as_ref()
                .map_or_else(|| "none".into(), |c| secs(c.t_ms))
        }),
    ];
    for (name, get) in rows {
        row(&mut o, name, &get);
    }
    row(&mut o, "  heap (megablocks)", &|f| {
        census(f, |c| bytes(c.heap_size))
    });
    row(&mut o, "  blocks in use", &|f| {
        census(f, |c| bytes(c.blocks_in_use))
    });
    row(&mut o, "  free blocks", &|f| {
        census(f, |c| bytes(c.free_blocks))
    });
    row(&mut o, "  pinned blocks", &|f| {
        census(f, |c| count(c.pinned_blocks))
    });
    row(&mut o, "  pinned blocks held", &|f| {
        census(f, |c| bytes(c.pinned_held))
    });
    row(&mut o, "  pinned objects referred to", &|f| {
        census(f, |c| opt_bytes(c.pinned_live))
    });
    row(&mut o, "  megablocks <= 25 blocks in use", &|f| {
        census(f, |c| bytes(c.sparse_megablocks))
    });
    if figures.iter().any(|f| {
        f.census
            .as_ref()
            .is_some_and(|c| c.pinned_occupancy.is_some())
    }) {
        let _ = writeln!(o, "  pinned blocks by how full:");
        for i in 0..10 {
            let name = format!("    {:>3}%-{:>3}%", i * 10, (i + 1) * 10);
            row(&mut o, &name, &|f| {
                f.census
                    .as_ref()
                    .and_then(|c| c.pinned_occupancy.as_ref())
                    .and_then(|occ| occ.get(i))
                    .map_or_else(|| UNKNOWN.into(), |n| count(*n))
            });
        }
    }
    let rows: [(&str, GhcFigureText); 8] = [
        ("garbage collection:", |_| String::new()),
        ("  major collections", |f| opt_count(f.major_collections)),
        ("  minor collections", |f| opt_count(f.minor_collections)),
        ("  bytes copied", |f| opt_bytes(f.copied_bytes)),
        ("  bytes allocated", |f| opt_bytes(f.allocated_bytes)),
        ("  GC time", |f| {
            f.gc_ms.map_or_else(|| UNKNOWN.into(), secs)
        }),
        ("  max pause", |f| {
            f.max_pause_ms
                .map_or_else(|| UNKNOWN.into(), |p| format!("{p:.1} ms"))
        }),
        ("  maximum slop", |f| opt_bytes(f.max_slop)),
    ];
    for (name, get) in rows {
        row(&mut o, name, &get);
    }
    for (c, f) in cols.iter().zip(&figures) {
        let what = match (&f.headline, &f.census) {
            (Some(h), _) => h.as_str(),
            (None, Some(_)) => "no block-level waste stands out in its block censuses",
            (None, None) => "no block census where memory settled",
        };
        let _ = writeln!(o, "{}: {what}", c.short);
    }
    for c in cols.iter().filter(|c| c.short != c.label) {
        let _ = writeln!(o, "{}: {}", c.short, c.label);
    }
    o
}
