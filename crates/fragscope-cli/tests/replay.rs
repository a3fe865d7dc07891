//! `fragscope replay` on real recordings: the models must show what differs between a heap
//! whose survivors are spread over every page (stripe strip: only moving objects gets the
//! pages back) and one whose survivors are packed (stripe take: returning free pages is
//! enough), never predict less than the ideal bound, sit beside the measured figures, and
//! refuse bad input with a message, never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::JEMALLOC;
use serde_json::Value;

/// Compiles one of the shared example programs (../shared/cases beside the repository).
fn build_case(dir: &Path, name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../../shared/cases/{name}.c"));
    if !src.exists() {
        eprintln!("skipped: {} is not there", src.display());
        return None;
    }
    let exe = dir.join(name);
    let ok = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(ok.success(), "cc failed on {}", src.display());
    Some(exe)
}

/// Records `exe args` under jemalloc into DIR/TAG.fsc.
fn record(dir: &Path, tag: &str, exe: &Path, args: &[&str]) -> PathBuf {
    let trace = dir.join(format!("{tag}.fsc"));
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "250", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args)
        .env("LD_PRELOAD", JEMALLOC)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "record failed: {}",
        common::stderr(&out)
    );
    trace
}

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

fn replay_json(trace: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["replay", "--json", trace.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = fragscope(&args);
    assert!(
        out.status.success(),
        "replay failed: {}",
        common::stderr(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

fn model<'a>(r: &'a Value, label: &str) -> &'a Value {
    r["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["label"] == label)
        .unwrap_or_else(|| panic!("no model {label}"))
}

/// The ideal bound is at or below every model at every sample, and at their peaks.
fn assert_ideal_is_a_lower_bound(r: &Value) {
    let ideal = model(r, "ideal");
    let floor: Vec<u64> = ideal["rss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert!(floor.iter().any(|&x| x > 0));
    for m in r["models"].as_array().unwrap() {
        let rss = m["rss"].as_array().unwrap();
        assert_eq!(rss.len(), floor.len(), "{}", m["label"]);
        for (i, (x, f)) in rss.iter().zip(&floor).enumerate() {
            assert!(
                x.as_u64().unwrap() >= *f,
                "{} below ideal at point {i}: {x} < {f}",
                m["label"]
            );
        }
        assert!(n(m, "peak_rss") >= n(ideal, "peak_rss"), "{}", m["label"]);
    }
}

const MODELS: &str =
    "ideal,sizeclass,sizeclass[purge=never],sizeclass[purge=decay:500],glibc,compacting,mesh";

#[test]
fn stripe_strip_needs_moving_and_take_needs_purging() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "stripe") else {
        return;
    };
    let strip = record(dir.path(), "strip", &exe, &["strip", "1000000"]);
    let take = record(dir.path(), "take", &exe, &["take", "1000000"]);
    let s = replay_json(&strip, &["--models", MODELS]);
    let t = replay_json(&take, &["--models", MODELS]);

    for r in [&s, &t] {
        assert_ideal_is_a_lower_bound(r);
        // The same program: 1 M objects of 64 bytes at the peak, a tenth kept.
        assert!(n(r, "peak_live") >= 64_000_000, "{}", r["peak_live"]);
        let held = n(r, "held_live");
        assert!(
            held >= 6_400_000 && held < n(r, "peak_live") / 2,
            "the plateau holds the survivors: {held}"
        );
        // Peak: every size-class model packs 64-byte objects without waste.
        let ideal_peak = n(model(r, "ideal"), "peak_rss");
        for m in ["sizeclass", "compacting", "mesh"] {
            let p = n(model(r, m), "peak_rss");
            assert!(
                p <= ideal_peak + ideal_peak / 10,
                "{m}: {p} vs {ideal_peak}"
            );
        }
        // Measured figures beside the models, with an error per model.
        let measured = &r["measured"];
        assert!(n(measured, "peak_rss") >= n(r, "peak_live"));
        assert!(measured["peak_heap_resident"].as_u64().unwrap() >= n(r, "peak_live"));
        let acc = r["accuracy"].as_array().unwrap();
        assert_eq!(acc.len(), r["models"].as_array().unwrap().len());
        assert!(acc.iter().all(|a| a["peak_heap_error_pct"].is_f64()));
    }

    // strip: survivors pin every span, so freeing pages helps nothing ...
    let sc = model(&s, "sizeclass");
    assert!(
        n(sc, "held_rss") > n(sc, "peak_rss") * 8 / 10,
        "strip: sizeclass keeps its pinned spans: {sc}"
    );
    // ... while packing and meshing get most of them back, and say what it cost.
    let compacting = model(&s, "compacting");
    let mesh = model(&s, "mesh");
    assert!(
        n(compacting, "held_rss") * 3 < n(sc, "held_rss"),
        "compacting recovers the strip's waste: {compacting}"
    );
    assert!(
        n(mesh, "held_rss") * 3 < n(sc, "held_rss") * 2,
        "mesh recovers much of the strip's waste: {mesh}"
    );
    assert!(n(&compacting["costs"], "bytes_moved") > 0);
    assert!(n(&mesh["costs"], "meshes") > 0);
    assert!(n(&mesh["costs"], "bytes_moved") > 0);
    // The real jemalloc kept the pinned pages too: sizeclass is the one near it.
    let measured_held = s["measured"]["held_heap_resident"].as_u64().unwrap();
    assert!(
        measured_held > n(sc, "held_rss") / 2 && n(compacting, "held_rss") < measured_held / 2,
        "measured plateau {measured_held}"
    );

    // take: the free spans are whole, so every model that purges returns them ...
    let peak = n(model(&t, "sizeclass"), "peak_rss");
    for m in [
        "sizeclass",
        "sizeclass[purge=decay:500]",
        "compacting",
        "mesh",
    ] {
        let held = n(model(&t, m), "held_rss");
        assert!(held * 2 < peak, "take: {m} holds {held} of {peak}");
    }
    // ... and moving is not needed for it.
    assert_eq!(n(&model(&t, "compacting")["costs"], "bytes_moved"), 0);
    // A model that never purges keeps them: the test above could fail.
    let never = model(&t, "sizeclass[purge=never]");
    assert!(n(never, "held_rss") > peak * 8 / 10, "{never}");
}

#[test]
fn size_class_churn_creeps_and_the_table_reads() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "sizeclass_churn") else {
        return;
    };
    let trace = record(dir.path(), "churn", &exe, &["32", "1"]);
    let r = replay_json(&trace, &[]);
    assert_ideal_is_a_lower_bound(&r);
    let labels: Vec<&str> = r["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["ideal", "sizeclass", "glibc", "compacting", "mesh"]
    );
    // Classes take turns under a fixed live budget: spans of old classes stay pinned by
    // their survivors, so a size-class heap grows well past the live peak ...
    let ideal = n(model(&r, "ideal"), "peak_rss");
    let sc = n(model(&r, "sizeclass"), "peak_rss");
    assert!(sc > ideal * 3 / 2, "sizeclass {sc} vs ideal {ideal}");
    // ... as jemalloc's did (same direction, same order of size).
    let measured = r["measured"]["peak_heap_resident"].as_u64().unwrap();
    assert!(
        measured > ideal * 3 / 2,
        "measured {measured} vs ideal {ideal}"
    );
    assert!(sc < measured * 2 && sc > measured / 2, "{sc} vs {measured}");
    // Every call was replayed by every model, at a positive speed.
    for m in r["models"].as_array().unwrap() {
        assert!(m["calls_per_s"].as_f64().unwrap() > 0.0);
        assert!(!m["config"].as_object().unwrap().is_empty());
    }

    // The terminal view: a row per model, the measured line, binary units, timelines.
    let out = fragscope(&[
        "replay",
        trace.to_str().unwrap(),
        "--set",
        "sizeclass:classes=tcmalloc",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("measured (jemalloc)"), "{text}");
    assert!(text.contains("MiB"), "{text}");
    assert!(!text.contains(" MB") && !text.contains(" kB"), "{text}");
    for m in labels {
        assert!(
            text.lines().filter(|l| l.starts_with(m)).count() >= 2,
            "{m}: a row and a timeline\n{text}"
        );
    }
    assert!(text.contains("classes=tcmalloc"), "{text}");
}

#[test]
fn bad_input_gets_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let fails = |args: &[&str], expect: &str| {
        let out = fragscope(args);
        let err = common::stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err}"
        );
    };
    let missing = dir.path().join("missing.fsc");
    let missing = missing.to_str().unwrap();
    fails(&["replay", missing], "cannot open");
    let junk = dir.path().join("junk.fsc");
    std::fs::write(
        &junk,
        b"this is not a trace at all, just some text\n".repeat(100),
    )
    .unwrap();
    fails(&["replay", junk.to_str().unwrap()], "replaying");
    let empty = dir.path().join("empty.fsc");
    std::fs::write(&empty, b"").unwrap();
    fails(&["replay", empty.to_str().unwrap()], "replaying");
    // Models and settings are checked before the trace is read.
    fails(
        &["replay", missing, "--models", "ideal,jemalloc"],
        "unknown model \"jemalloc\"",
    );
    fails(&["replay", missing, "--models", ""], "no model given");
    fails(
        &["replay", missing, "--set", "sizeclass:colour=red"],
        "known are",
    );
    fails(
        &["replay", missing, "--set", "glibc:trim_threshold=lots"],
        "whole number",
    );
    fails(
        &["replay", missing, "--set", "mesh:occupancy_max=2"],
        "expected 0 to 1",
    );
    fails(
        &[
            "replay",
            missing,
            "--models",
            "ideal",
            "--set",
            "mesh:probes=8",
        ],
        "not among the models",
    );
    fails(
        &["replay", missing, "--set", "sizeclass"],
        "MODEL:KEY=VALUE",
    );

    let help = fragscope(&["replay", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Examples:") && help.contains("--set"),
        "{help}"
    );
}

#[test]
fn a_cut_trace_replays_what_is_intact_and_a_wrong_pid_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "stripe") else {
        return;
    };
    let trace = record(dir.path(), "take", &exe, &["take", "300000"]);
    let bytes = std::fs::read(&trace).unwrap();
    let cut = dir.path().join("cut.fsc");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = fragscope(&[
        "replay",
        "--json",
        "--models",
        "ideal,sizeclass",
        cut.to_str().unwrap(),
    ]);
    let err = common::stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    if out.status.success() {
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["truncated"], true, "{r}");
    } else {
        assert!(err.contains("replaying"), "{err}");
    }
    let out = fragscope(&["replay", trace.to_str().unwrap(), "--pid", "1"]);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("no process with pid 1"),
        "{}",
        common::stderr(&out)
    );
}

/// A forked worker is replayed from its parent's heap at the fork, as the report
/// explains it: its inherited blocks are allocated first and its frees of them are
/// frees, so the models hold what the worker held (tests/c/prefork.c: 100 000 blocks of
/// 100 bytes from the parent; the worker frees every other one and allocates 50 000 of
/// 64 bytes). Merged alone, it freed nothing and held 3.2 MB.
#[test]
fn a_fork_child_is_replayed_from_its_parents_heap() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, workers) = common::record_prefork(dir.path(), "prefork");
    let worker = workers[0].as_str();
    let r = replay_json(&trace, &["--pid", worker]);
    assert_eq!(n(&r, "calls"), 100_000);
    assert_eq!(n(&r, "inherited_blocks"), 100_000);
    assert_eq!(n(&r, "inherited_bytes"), 10_000_000);
    assert_eq!(n(&r, "peak_live"), 10_000_000);
    assert_eq!(n(&r, "held_live"), 5_000_000 + 3_200_000);
    assert_ideal_is_a_lower_bound(&r);
    // glibc's model of it comes near the heap the worker had.
    let glibc = r["accuracy"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["label"] == "glibc")
        .unwrap();
    let error = glibc["peak_heap_error_pct"].as_f64().unwrap();
    assert!(error.abs() < 15.0, "{glibc}");
}
