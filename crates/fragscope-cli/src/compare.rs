//! `fragscope compare`: the same program under several allocators (or settings), or
//! existing traces, side by side.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use fragscope_model::compare::RunFigures;
use fragscope_model::{analyze, Options};
use serde::Serialize;

use crate::units::bytes;

/// Compare allocators on one program, or compare recorded traces.
///
/// With a command, runs it once per allocator (preloading the system's library) and per
/// --variant, each run recorded; prints peak and end RSS, live data, heap resident, the
/// waste by part and the fragmentation ratio side by side (medians with --runs). The
/// program's output goes to a log beside each trace.
/// With trace files instead, compares those (e.g. before and after a fix).
///
/// Examples:
///   fragscope compare -- ./server --bench
///   fragscope compare --allocators glibc,jemalloc --variant jemalloc:MALLOC_CONF=dirty_decay_ms:0 -- ./prog
///   fragscope compare --variant glibc:MALLOC_ARENA_MAX=2 --runs 3 -- ./prog
///   fragscope compare strip.fsc take.fsc
///   fragscope compare strip.fsc take.fsc --html compare.html
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
    #[serde(flatten)]
    figures: RunFigures,
    /// The report of the (last) run, for --html.
    #[serde(skip)]
    report: Option<fragscope_model::Report>,
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
        a.traces
            .iter()
            .map(|t| {
                let report = analyze(t, &Options::default(), |_, _| {})
                    .with_context(|| format!("analysing {}", t.display()))?;
                let name = t.file_name().map_or(t.display().to_string(), |n| {
                    n.to_string_lossy().into_owned()
                });
                Ok(Column {
                    short: name,
                    label: t.display().to_string(),
                    runs: 1,
                    traces: vec![t.display().to_string()],
                    figures: RunFigures::of(&report),
                    report: a.html.is_some().then_some(report),
                })
            })
            .collect::<Result<Vec<_>>>()?
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
                last = a.html.is_some().then_some(report);
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
                figures: RunFigures::median(&figures),
                report: last,
            });
        }
        bar.finish_and_clear();
        cols
    };
    if let Some(path) = &a.html {
        let reports: Vec<_> = columns.iter().map(|c| c.report.as_ref()).collect();
        crate::html::write_compare(path, &serde_json::to_value(&columns)?, &reports)?;
        eprintln!("fragscope: wrote {}", path.display());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "columns": columns }))?
        );
    } else if a.html.is_none() {
        print!("{}", render(&columns));
    }
    Ok(ExitCode::SUCCESS)
}

/// Formats one figure of a run for the table.
type FigureText = fn(&RunFigures) -> String;

fn render(cols: &[Column]) -> String {
    let width = cols
        .iter()
        .map(|c| c.short.len())
        .max()
        .unwrap_or(0)
        .max(12)
        + 2;
    let mut o = String::new();
    let runs = cols.iter().map(|c| c.runs).max().unwrap_or(1);
    let _ = write!(o, "{:<26}", if runs > 1 { "(medians)" } else { "" });
    for c in cols {
        let _ = write!(o, "{:>width$}", c.short);
    }
    o.push('\n');
    let rows: [(&str, FigureText); 14] = [
        ("peak RSS", |f| {
            f.peak_rss.map_or_else(|| "not sampled".into(), bytes)
        }),
        ("end RSS", |f| bytes(f.end_rss)),
        ("peak live", |f| bytes(f.peak_live)),
        ("at the most waste:", |_| String::new()),
        ("  heap resident", |f| bytes(f.heap_resident)),
        ("  live", |f| bytes(f.live)),
        ("  rounding", |f| bytes(f.rounding)),
        ("  free in used pages", |f| bytes(f.free_in_used_pages)),
        ("  free resident pages", |f| bytes(f.free_resident_pages)),
        ("  lazily freed", |f| bytes(f.lazy_free)),
        ("  other anonymous", |f| bytes(f.other_anon)),
        ("  fragmentation ratio", |f| {
            f.fragmentation_ratio
                .map_or("-".into(), |r| format!("{r:.2}"))
        }),
        ("wall time (recorded)", |f| {
            f.wall_ms
                .map_or("-".into(), |t| format!("{:.2} s", t / 1e3))
        }),
        ("CPU time (recorded)", |f| {
            f.cpu_ms.map_or("-".into(), |t| format!("{:.2} s", t / 1e3))
        }),
    ];
    for (name, get) in rows {
        let _ = write!(o, "{name:<26}");
        for c in cols {
            let _ = write!(o, "{:>width$}", get(&c.figures));
        }
        o.push('\n');
    }
    for c in cols.iter().filter(|c| c.short != c.label) {
        let _ = writeln!(o, "{}: {}", c.short, c.label);
    }
    o
}
