//! Aggregated traces (`record --aggregate`, `fragscope aggregate`): the blocks allocated
//! and freed between two snapshots left out and counted by site, every snapshot's figures
//! as a full recording's.

mod common;

use std::path::{Path, PathBuf};

use common::{build, fragscope, info, report_json, stderr};
use serde_json::Value;

/// Records `exe args` in full, snapshots every 50 ms (stacks sampled, as by default).
fn record_full(dir: &Path, name: &str, exe: &Path, args: &[&str], extra: &[&str]) -> PathBuf {
    let trace = dir.join(format!("{name}.fsc"));
    let mut cmd: Vec<&std::ffi::OsStr> = vec!["record".as_ref(), "-o".as_ref()];
    cmd.push(trace.as_os_str());
    cmd.extend(["--snapshot-ms", "50"].iter().map(std::ffi::OsStr::new));
    cmd.extend(extra.iter().map(std::ffi::OsStr::new));
    cmd.push("--".as_ref());
    cmd.push(exe.as_os_str());
    cmd.extend(args.iter().map(std::ffi::OsStr::new));
    let out = fragscope(&cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    trace
}

fn aggregate(trace: &Path, out: &Path) -> std::process::Output {
    fragscope(&[
        "aggregate".as_ref(),
        trace.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ])
}

/// The report without what names the file, says it is aggregated, or describes the
/// merge's work (the aggregated trace's calls come merged already).
fn comparable(mut r: Value) -> Value {
    let o = r.as_object_mut().unwrap();
    o.remove("trace");
    o.remove("aggregated");
    o.remove("merge");
    r
}

/// The first difference between two JSON documents, as a path and both values.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            first_difference(
                &x[k],
                y.get(k).unwrap_or(&Value::Null),
                &format!("{path}.{k}"),
            )
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        // Site estimates are sums of weights: one sum of n weights for the calls left
        // out instead of n additions may differ in the last bits.
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (p, q) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            ((p - q).abs() > 1e-9 * p.abs().max(q.abs())).then(|| format!("{path}: {p} vs {q}"))
        }
        _ => (a != b).then(|| format!("{path}: {a} vs {b}")),
    }
}

/// A program's trace aggregated reports as the trace it came from: the same snapshots
/// (decomposition, occupancy, size classes, pinning sites), the same calls, allocations,
/// temporaries and leaks, the same live-bytes timeline and peak. Threads handing blocks
/// to each other (larson), reallocs moving blocks between threads (realloc_ring), a
/// worker forked from its parent's heap (prefork).
#[test]
fn an_aggregated_trace_reports_as_the_trace_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 3] = [
        ("larson", &["2", "300000"]),
        ("realloc_ring", &[]),
        ("prefork", &[]),
    ];
    for (name, args) in cases {
        let exe = build(dir.path(), name, &["-pthread"]);
        let full = record_full(dir.path(), name, &exe, args, &[]);
        let small = dir.path().join(format!("{name}-aggregated.fsc"));
        let out = aggregate(&full, &small);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let (a, b) = (report_json(&full), report_json(&small));
        assert!(!a["snapshots"].as_array().unwrap().is_empty(), "{name}");
        assert_eq!(
            (&a["aggregated"], &b["aggregated"]),
            (&Value::Null, &Value::Bool(true))
        );
        let differs = first_difference(&comparable(a), &comparable(b), "");
        assert_eq!(
            differs, None,
            "{name}: the aggregated trace reports otherwise"
        );
        let i = info(&small);
        assert_eq!(i["aggregated"], true, "{name}");
        // larson's 1.2 M calls are nearly all left out: its blocks live a few calls.
        if name == "larson" {
            let (full_bytes, small_bytes) = (
                std::fs::metadata(&full).unwrap().len(),
                std::fs::metadata(&small).unwrap().len(),
            );
            assert!(
                small_bytes * 10 < full_bytes,
                "{small_bytes} vs {full_bytes}"
            );
            let p = &i["processes"][0];
            assert!(p["aggregated_calls"].as_u64().unwrap() > 1_000_000, "{p}");
        }
    }
}

/// `record --aggregate` writes an aggregated trace as the program runs: its report counts
/// every call, its snapshots see what a full recording's see, and replay refuses it.
#[test]
fn record_aggregate_writes_what_the_snapshots_see() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "larson", &["-pthread"]);
    // Long enough for periodic snapshots once its array is full: with 300 000 operations
    // a run could end before the first, its only other snapshot the one taken as RSS
    // neared a peak, which can fall while the array is half full (a CI run saw 0.97 MB
    // live there against 2.09 MB).
    let args = ["2", "1000000"];
    let full = record_full(dir.path(), "full", &exe, &args, &[]);
    let small = record_full(dir.path(), "small", &exe, &args, &["--aggregate"]);
    let (a, b) = (report_json(&full), report_json(&small));
    // larson makes the same calls in every run; the two recordings count all of them.
    assert_eq!(a["calls"], b["calls"]);
    assert_eq!(info(&small)["aggregated"], true);
    assert!(
        std::fs::metadata(&small).unwrap().len() * 10 < std::fs::metadata(&full).unwrap().len()
    );
    // The snapshots see larson's heap as a full recording's do: the most live bytes
    // any of them saw within a factor of the full recording's (the two runs' snapshots
    // fall at different moments of the program), and nothing at the end.
    let most_live = |r: &Value| {
        let snaps = r["snapshots"].as_array().unwrap();
        assert!(snaps.len() >= 2, "{}", snaps.len());
        snaps
            .iter()
            .map(|s| s["live"].as_u64().unwrap())
            .max()
            .unwrap()
    };
    let (full_most, small_most) = (most_live(&a), most_live(&b));
    assert!(
        small_most > 100_000 && small_most * 2 > full_most && small_most < 2 * full_most,
        "{small_most} vs {full_most}"
    );
    let end = b["snapshots"].as_array().unwrap().last().unwrap();
    assert!(end["live"].as_u64().unwrap() < 100_000, "{end}");
    // The same aggregated again is refused, and so is a replay.
    let again = aggregate(&small, &dir.path().join("again.fsc"));
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("aggregated already"),
        "{}",
        stderr(&again)
    );
    let replay = fragscope(&["replay".as_ref(), small.as_os_str()]);
    assert!(!replay.status.success());
    let err = stderr(&replay);
    assert!(
        err.contains("aggregated trace") && err.contains("without --aggregate"),
        "{err}"
    );
    // Aggregating a trace onto itself would destroy it: refused.
    let onto = aggregate(&full, &full);
    assert!(!onto.status.success());
    assert!(stderr(&onto).contains("being read"), "{}", stderr(&onto));
    assert!(report_json(&full)["snapshots"].as_array().is_some());
}
