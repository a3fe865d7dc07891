//! SBCL programs: the dynamic space, read from gencgc's own page table at each snapshot,
//! inside the decomposition; figures checked against what the Lisp says of its heap.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use common::report_json;

/// A figure the Lisp printed: "dynamic-usage 34224784", "generation 1 2609824".
fn figure(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{prefix}' in:\n{text}"))
}

#[test]
fn the_dynamic_space_is_split_and_agrees_with_the_lisps_own_figures() {
    if Command::new("sbcl").arg("--version").output().is_err() {
        eprintln!("skipped: sbcl is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("lisp.fsc");
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/import_job.lisp");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .args(["--", "sbcl", "--script"])
        .arg(&job)
        .args(["600", "2"])
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    let report = report_json(&trace);
    // The program idles after printing its figures: the last census (the one at exit
    // is not taken) sees the same heap.
    let snaps: Vec<&Value> = report["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s.get("sbcl").is_some())
        .collect();
    assert!(snaps.len() >= 4, "{report}");
    let last = &snaps.last().unwrap()["sbcl"];
    let what = format!("{last}\n{err}");
    let near = |ours: u64, theirs: u64| (ours as f64 - theirs as f64).abs() <= 0.05 * theirs as f64;
    let used = last["bytes_used"].as_u64().unwrap();
    assert!(near(used, figure(&err, "dynamic-usage ")), "{what}");
    for g in last["generations"].as_array().unwrap() {
        let gen = g["gen"].as_u64().unwrap();
        let theirs = figure(&err, &format!("generation {gen} "));
        assert!(
            near(g["bytes_used"].as_u64().unwrap(), theirs),
            "generation {gen}: {what}"
        );
    }
    // The split adds up, and the space is its own part of RSS, not "other anonymous".
    let parts = ["in_use", "free_in_used_pages", "free_pages"];
    let sum: u64 = parts.iter().map(|k| last[k].as_u64().unwrap()).sum();
    assert_eq!(sum, last["resident"].as_u64().unwrap(), "{what}");
    let snap = snaps.last().unwrap();
    assert_eq!(snap["sbcl_dynamic_space"], last["resident"], "{what}");
    assert!(
        snap["other_anon"].as_u64().unwrap() < last["resident"].as_u64().unwrap(),
        "{snap}"
    );
    // The heap was walked now and then (within the pause budget), octet vectors found.
    let walked = snaps
        .iter()
        .filter_map(|s| s["sbcl"]["objects"].as_array())
        .next_back()
        .expect("at least one census walked the objects");
    let octets = walked
        .iter()
        .find(|c| c["class"] == "octet vectors")
        .unwrap();
    assert!(octets["count"].as_u64().unwrap() > 0, "{walked:?}");
    // The same walk by generation adds up to it, class by class.
    let census = snaps
        .iter()
        .rev()
        .find(|s| s["sbcl"]["objects"].is_array())
        .unwrap();
    let gens = census["sbcl"]["generations"].as_array().unwrap();
    for (k, class) in walked.iter().enumerate() {
        let by_gen: u64 = gens
            .iter()
            .filter_map(|g| g["objects"].as_array())
            .map(|o| o[k]["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            by_gen,
            class["bytes"].as_u64().unwrap(),
            "{class}: {census}"
        );
    }
    // Freed buffers leave pages the collector keeps: the headline says so.
    let dominant = report["headline"]["dominant"].as_str().unwrap_or_default();
    assert!(dominant.starts_with("sbcl_"), "{}", report["headline"]);
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("SBCL dynamic space"), "{text}");
    assert!(text.contains("dynamic space at"), "{text}");
    assert!(text.contains("generation 0 holds most:"), "{text}");
}

#[test]
fn a_program_that_is_not_sbcl_has_no_sbcl_census() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("sh.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "100", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", "sleep 0.5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = report_json(&trace);
    assert!(report.get("sbcl_snapshot").is_none(), "{report}");
    assert!(report.get("sbcl_note").is_none(), "{report}");
}

/// The same job with its buffers malloc'd outside the dynamic space (sb-alien): compare
/// shows both dynamic spaces side by side, and no CPython rows.
#[test]
fn compare_shows_buffers_moved_out_of_the_dynamic_space() {
    if Command::new("sbcl").arg("--version").output().is_err() {
        eprintln!("skipped: sbcl is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/lisp/import_job.lisp");
    let record = |name: &str, extra: &[&str]| {
        let trace = dir.path().join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--snapshot-ms", "200", "-o"])
            .arg(&trace)
            .args(["--", "sbcl", "--script"])
            .arg(&job)
            .args(["600", "1"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        trace
    };
    let inside = record("inside.fsc", &[]);
    let outside = record("alien.fsc", &["alien"]);
    let out = common::fragscope(&["compare".as_ref(), inside.as_os_str(), outside.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.get(..26).is_some_and(|label| label.trim_end() == name))
            .unwrap_or_else(|| panic!("no row {name:?} in:\n{text}"))[26..]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    // Both runs' dynamic spaces, split, side by side (which is smaller depends on
    // where each run's collections fell: the buffers here are transient).
    for name in ["SBCL dynamic space", "  objects", "  free"] {
        assert_eq!(row(name).len(), 2, "{name}: {text}");
    }
    assert!(!text.contains("pymalloc"), "{text}");
}
