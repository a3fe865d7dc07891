//! `fragscope replay`: a recorded call sequence played against allocator models, each
//! model's resident heap over time beside what the recorded run measured.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use fragscope_model::replay::measured::{Accuracy, Measured};
use fragscope_model::replay::{self, ModelResult, ModelSpec, Replay, MODEL_NAMES};
use fragscope_model::{analyze, Options};
use serde::Serialize;

use crate::input::Input;
use crate::progress;
use crate::units::{bytes, count};

/// Replay a recorded run against allocator models: what would its heap have cost?
///
/// Reads the recorded malloc/free sequence (sizes, order, threads, time) of one process
/// and plays it against each model, which places the blocks itself. Prints, per model,
/// peak and end resident heap, the plateau before teardown, what the model paid (bytes
/// moved, meshes, trims...), the resident heap over time, and how far each prediction is
/// from what the recorded run measured (heap resident and RSS).
///
/// Models (docs/replay.md describes each and its settings):
///   ideal       the lower bound: live bytes packed into whole pages
///   sizeclass   segregated size classes in spans, jemalloc-like (classes=tcmalloc too)
///   glibc       ptmalloc2-like: bins, coalescing, top trimming, mmap threshold, arenas
///   compacting  sizeclass plus a periodic packing of live objects into the fewest spans
///   mesh        sizeclass with randomized placement and meshing of disjoint spans
///
/// Examples:
///   fragscope replay run.fsc
///   fragscope replay run.fsc --models ideal,sizeclass,mesh --json > replay.json
///   fragscope replay run.fsc --set sizeclass:classes=tcmalloc --set sizeclass:purge=decay:10000
///   fragscope replay run.fsc --set glibc:trim_threshold=1m --set compacting:period_ms=100
///   fragscope replay run.fsc --models 'sizeclass,sizeclass[purge=never],glibc[arena_max=1]'
#[derive(Args)]
#[command(verbatim_doc_comment)]
pub struct ReplayArgs {
    /// The trace (from `fragscope record`).
    trace: PathBuf,
    /// Models to replay, comma-separated; settings may follow a name in brackets
    /// (sizeclass[purge=never;classes=tcmalloc]) to replay one model several ways.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "ideal,sizeclass,glibc,compacting,mesh"
    )]
    models: String,
    /// A model setting, MODEL:KEY=VALUE[;KEY=VALUE] (repeatable); MODEL is a name given
    /// in --models and the setting applies to every model of that name. Sizes take k/KiB
    /// and m/MiB.
    #[arg(long = "set", value_name = "MODEL:K=V")]
    set: Vec<String>,
    /// Replay this process (default: the one with the most calls; see `fragscope info`).
    #[arg(long)]
    pid: Option<u32>,
    /// Trace time between the models' RSS samples, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    sample_ms: u64,
    /// Do not analyse the trace for the measured figures (one pass instead of two).
    #[arg(long)]
    no_measured: bool,
    /// Print one JSON document instead of the tables (see docs/replay.md).
    #[arg(long)]
    json: bool,
}

/// Adds the `--set` settings to the specs they name.
fn apply_settings(specs: &mut [ModelSpec], sets: &[String]) -> Result<()> {
    for s in sets {
        let Some((model, kvs)) = s.split_once(':') else {
            bail!("--set {s:?}: expected MODEL:KEY=VALUE, e.g. sizeclass:purge=decay:1000");
        };
        let model = model.trim();
        if !MODEL_NAMES.contains(&model) {
            bail!(
                "--set {s:?}: unknown model {model:?}: choose from {}",
                MODEL_NAMES.join(", ")
            );
        }
        let mut kv = Vec::new();
        for part in kvs.split(';').filter(|p| !p.trim().is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                bail!("--set {s:?}: {part:?} is not KEY=VALUE");
            };
            kv.push((k.trim().to_string(), v.trim().to_string()));
        }
        if kv.is_empty() {
            bail!("--set {s:?}: no KEY=VALUE after {model}:");
        }
        let mut hit = false;
        for spec in specs.iter_mut().filter(|sp| sp.kind == model) {
            spec.settings.extend(kv.iter().cloned());
            hit = true;
        }
        if !hit {
            let given: Vec<&str> = specs.iter().map(|sp| sp.label.as_str()).collect();
            bail!(
                "--set {s:?}: {model} is not among the models replayed ({}); add it to --models",
                given.join(", ")
            );
        }
    }
    Ok(())
}

/// The JSON document: the replay, the measured figures and each model's error.
#[derive(Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    replay: &'a Replay,
    measured: Option<Measured>,
    accuracy: Vec<Accuracy>,
}

pub fn run(a: ReplayArgs) -> Result<ExitCode> {
    let mut models = replay::parse_models(&a.models).context("--models")?;
    apply_settings(&mut models, &a.set)?;
    // Settings are checked before the trace is read.
    for m in &models {
        replay::build(m, 4096)?;
    }
    let contents = match Input::read(&a.trace, "replaying")? {
        Input::Eventlog => bail!(
            "{} is a GHC eventlog: replay needs a fragscope trace of the program's \
             allocation calls (record it with `fragscope record`)",
            a.trace.display()
        ),
        // A GHC program's malloc calls are replayed; its own heap is the RTS's.
        // A GHC program's malloc calls are replayed like any other's.
        Input::GhcRecording { contents, .. } | Input::Trace(contents) => contents,
    };
    if contents.meta.as_ref().is_some_and(|m| m.aggregated) {
        bail!(
            "{} is an aggregated trace (recorded with --aggregate, or written by fragscope              aggregate): it keeps only the blocks a snapshot sees, and a replay needs every              call. Record the program again without --aggregate to replay it",
            a.trace.display()
        );
    }
    let size = std::fs::metadata(&a.trace)
        .with_context(|| format!("cannot open {}", a.trace.display()))?
        .len();
    let opts = replay::Options {
        pid: a.pid,
        models,
        sample_ms: a.sample_ms,
    };
    let bar = progress::bar_over(size, 8 << 20, "replaying");
    let result =
        replay::replay_with_progress(&a.trace, &contents, &opts, |done, _| bar.set_position(done))
            .with_context(|| format!("replaying {}", a.trace.display()));
    bar.finish_and_clear();
    let r = result?;

    let measured = if a.no_measured {
        None
    } else {
        let bar = progress::bar_over(size, 8 << 20, "measuring");
        let aopts = Options {
            pid: Some(r.pid),
            top: 0,
            ..Options::default()
        };
        let report = analyze(&a.trace, &aopts, |done, _| bar.set_position(done));
        bar.finish_and_clear();
        match report {
            Ok(report) => Some((
                Measured::of(&report, r.held_t_ms, r.sample_ms as f64),
                report,
            )),
            Err(e) => {
                eprintln!("fragscope: warning: no measured figures: {e}");
                None
            }
        }
    };
    let accuracy = measured
        .as_ref()
        .map(|(m, _)| m.accuracies(&r))
        .unwrap_or_default();
    if a.json {
        let out = Output {
            replay: &r,
            measured: measured.as_ref().map(|(m, _)| m.clone()),
            accuracy,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let recorded_rss: Option<Vec<u64>> = measured.as_ref().map(|(_, rep)| {
            r.timeline
                .t_ms
                .iter()
                .map(|&t| {
                    let i = rep.timeline.partition_point(|p| p.t_ms <= t);
                    rep.timeline[i.saturating_sub(1)..(i + 1).min(rep.timeline.len())]
                        .iter()
                        .map(|p| p.rss)
                        .max()
                        .unwrap_or(0)
                })
                .collect()
        });
        print!(
            "{}",
            render(
                &r,
                measured.as_ref().map(|(m, _)| m),
                &accuracy,
                recorded_rss.as_deref()
            )
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

fn signed_pct(p: Option<f64>) -> String {
    p.map_or_else(|| "-".into(), |p| format!("{p:+.1}%"))
}

const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Columns of the RSS-over-time lines.
const WIDTH: usize = 60;

/// `values` (one per timeline point) as WIDTH columns of bars scaled to `max`: each
/// column the largest value of its points; a blank column is zero.
fn sparkline(values: &[u64], max: u64) -> String {
    if values.is_empty() {
        return String::new();
    }
    let cols = WIDTH.min(values.len());
    (0..cols)
        .map(|c| {
            let (lo, hi) = (c * values.len() / cols, (c + 1) * values.len() / cols);
            let v = values[lo..hi.max(lo + 1)]
                .iter()
                .copied()
                .max()
                .unwrap_or(0);
            if v == 0 || max == 0 {
                ' '
            } else {
                let k = ((v as f64 / max as f64) * 8.0).ceil() as usize;
                SPARK[k.clamp(1, 8) - 1]
            }
        })
        .collect()
}

fn costs_line(m: &ModelResult) -> String {
    let c = &m.costs;
    let mut parts: Vec<String> = Vec::new();
    if c.passes > 0 {
        let moving = c.events.len();
        parts.push(format!(
            "{} moved ({} objects) in {} of {} passes",
            bytes(c.bytes_moved),
            count(c.objects_moved),
            moving,
            c.passes
        ));
        if c.meshes > 0 || m.model == "mesh" {
            parts.push(format!("{} meshes", count(c.meshes)));
        }
        if let Some(e) = c.events.iter().max_by_key(|e| e.bytes) {
            parts.push(format!(
                "largest at {}: {} ({} spans freed)",
                secs(e.t_ms),
                bytes(e.bytes),
                count(e.spans_freed)
            ));
        }
    }
    for (k, v) in &c.counters {
        let name = k.replace('_', " ");
        let shown = if k.ends_with("bytes") || k.ends_with("threshold") {
            bytes(*v)
        } else {
            count(*v)
        };
        parts.push(format!("{name} {shown}"));
    }
    if parts.is_empty() {
        "none (a bound, not an allocator)".into()
    } else {
        parts.join(", ")
    }
}

/// The terminal view.
fn render(
    r: &Replay,
    measured: Option<&Measured>,
    accuracy: &[Accuracy],
    recorded_rss: Option<&[u64]>,
) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fragscope replay: {} (pid {}, {} calls, {} of trace time, {} pages)",
        r.argv.join(" "),
        r.pid,
        count(r.calls),
        secs(r.duration_ms),
        bytes(r.page_size)
    );
    if r.truncated {
        let _ = writeln!(
            o,
            "note: the trace is truncated ({}); this is the replay of what is intact",
            r.damage.as_deref().unwrap_or("no end marker")
        );
    }
    if let Some(skipped) = &r.skipped {
        let _ = writeln!(o, "note: {skipped}");
    }
    if let (Some(blocks), Some(b)) = (r.inherited_blocks, r.inherited_bytes) {
        let _ = writeln!(
            o,
            "note: started from its parent's heap at the fork: {} blocks ({}), placed \
             first, in the order its parent allocated them",
            count(blocks),
            bytes(b)
        );
    }
    let _ = writeln!(
        o,
        "live data: peak {}; {} held at {} (the plateau before the program let go)",
        bytes(r.peak_live),
        bytes(r.held_live),
        secs(r.held_t_ms)
    );
    measured_line(&mut o, r, measured);
    let _ = writeln!(o);

    // One row per model.
    let label_w = r
        .models
        .iter()
        .map(|m| m.label.chars().count())
        .chain([12])
        .max()
        .unwrap_or(12);
    model_table(&mut o, r, measured, accuracy, label_w);

    // Resident heap over time, one scale for all.
    let max = r
        .models
        .iter()
        .flat_map(|m| m.rss.iter().copied())
        .chain(r.timeline.live.iter().copied())
        .max()
        .unwrap_or(0);
    let _ = writeln!(
        o,
        "\nresident heap over time (0 to {}, full bar = {}):",
        secs(r.duration_ms),
        bytes(max)
    );
    let _ = writeln!(
        o,
        "{:<label_w$}  {}",
        "live",
        sparkline(&r.timeline.live, max)
    );
    for m in &r.models {
        let _ = writeln!(o, "{:<label_w$}  {}", m.label, sparkline(&m.rss, max));
    }
    if let Some(rec) = recorded_rss {
        let rmax = rec.iter().copied().max().unwrap_or(0);
        let _ = writeln!(
            o,
            "{:<label_w$}  {}  (own scale: full bar = {})",
            "measured RSS",
            sparkline(rec, rmax),
            bytes(rmax)
        );
    }

    let _ = writeln!(o, "\ncosts:");
    for m in &r.models {
        let _ = writeln!(o, "  {:<label_w$}  {}", m.label, costs_line(m));
    }
    let _ = writeln!(o, "\nsettings:");
    for m in &r.models {
        let s: Vec<String> = m.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(o, "  {:<label_w$}  {}", m.label, s.join(" "));
    }
    o
}

/// What the recording measured: RSS and heap resident at the peak and on the plateau.
fn measured_line(o: &mut String, r: &Replay, measured: Option<&Measured>) {
    match measured {
        Some(m) => {
            let peak = match (m.peak_rss, m.peak_rss_t_ms) {
                (Some(peak), Some(t)) => format!("peak RSS {} at {}", bytes(peak), secs(t)),
                _ => "no RSS sample was taken".into(),
            };
            let _ = write!(
                o,
                "measured{}: {peak}",
                m.allocator
                    .as_deref()
                    .map(|a| format!(" ({a})"))
                    .unwrap_or_default(),
            );
            match (m.peak_heap_resident, m.peak_heap_t_ms, m.outside_heap) {
                (Some(h), Some(t), Some(out)) => {
                    let _ = write!(
                        o,
                        "; heap resident {} at {} (outside the heap {})",
                        bytes(h),
                        secs(t),
                        bytes(out)
                    );
                }
                (Some(h), Some(t), None) => {
                    let _ = write!(o, "; heap resident {} at {}", bytes(h), secs(t));
                }
                _ => {
                    let _ = write!(o, "; no page-residency snapshot, so no heap resident");
                }
            }
            if let (Some(h), Some(t)) = (m.held_heap_resident, m.held_t_ms) {
                let _ = write!(o, "; {} on the plateau at {}", bytes(h), secs(t));
            }
            if let Some(end) = m.end_rss {
                let _ = write!(o, "; end RSS {}", bytes(end));
            }
            o.push('\n');
        }
        None => {
            let _ = writeln!(
                o,
                "recorded: peak RSS {} at {}, end RSS {}",
                bytes(r.recorded.peak_rss),
                secs(r.recorded.peak_t_ms),
                bytes(r.recorded.end_rss)
            );
        }
    }
}

/// One row per model, with its errors against what was measured.
fn model_table(
    o: &mut String,
    r: &Replay,
    measured: Option<&Measured>,
    accuracy: &[Accuracy],
    label_w: usize,
) {
    let _ = writeln!(
        o,
        "{:<label_w$}  {:>10} {:>8}  {:>10} {:>10}  {:>9} {:>9} {:>9}  {:>8}",
        "model", "peak", "at", "plateau", "end", "vs heap", "plateau", "vs RSS", "calls/s"
    );
    for (i, m) in r.models.iter().enumerate() {
        let acc = accuracy.get(i);
        let _ = writeln!(
            o,
            "{:<label_w$}  {:>10} {:>8}  {:>10} {:>10}  {:>9} {:>9} {:>9}  {:>8}",
            m.label,
            bytes(m.peak_rss),
            secs(m.peak_t_ms),
            bytes(m.held_rss),
            bytes(m.end_rss),
            signed_pct(acc.and_then(|a| a.peak_heap_error_pct)),
            signed_pct(acc.and_then(|a| a.held_heap_error_pct)),
            signed_pct(acc.and_then(|a| a.peak_rss_error_pct)),
            count(m.calls_per_s as u64)
        );
    }
    if measured.is_some() {
        let _ = writeln!(
            o,
            "(vs heap: the peak against the measured peak heap resident; plateau: against \
             the measured heap resident on the plateau; vs RSS: the peak plus the memory \
             outside the heap, against the peak RSS)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_go_to_the_models_they_name() {
        let mut specs = replay::parse_models("ideal,sizeclass,sizeclass[purge=never]").unwrap();
        apply_settings(&mut specs, &["sizeclass:classes=tcmalloc;page=8k".into()]).unwrap();
        assert!(specs[0].settings.is_empty());
        assert_eq!(specs[1].settings.len(), 2);
        assert_eq!(specs[2].settings.len(), 3);
        let e = apply_settings(&mut specs, &["glibc:arena_max=1".into()]).unwrap_err();
        assert!(e.to_string().contains("not among"), "{e}");
        let e = apply_settings(&mut specs, &["jemalloc:x=1".into()]).unwrap_err();
        assert!(e.to_string().contains("unknown model"), "{e}");
        assert!(apply_settings(&mut specs, &["sizeclass".into()]).is_err());
        assert!(apply_settings(&mut specs, &["sizeclass:purge".into()]).is_err());
    }

    #[test]
    fn sparklines_share_a_scale() {
        assert_eq!(sparkline(&[0, 4, 8], 8), " ▄█");
        assert_eq!(sparkline(&[1, 1], 8), "▁▁");
        assert_eq!(sparkline(&vec![8; 600], 8).chars().count(), WIDTH);
    }
}
