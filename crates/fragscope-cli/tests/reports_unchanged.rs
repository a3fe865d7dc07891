//! The reports of real recordings, one per heap fragscope knows (glibc's calls from one
//! thread and from several, a snapshot of glibc's arenas, forked workers, pymalloc, SBCL,
//! GHC with its eventlog, Go), against the reports they gave when they were stored: a change to how traces are read
//! or modelled must leave every figure and word as it was, or say so by storing the new
//! report (`FRAGSCOPE_BLESS=1 cargo test --test reports_unchanged`, and a commit that
//! says why).
//!
//! The recordings were made with `--stacks none`, so nothing in their reports depends on
//! the binaries of this machine (allocation sites are named from the files they ran).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reports")
}

/// `fragscope report ARGS TRACE`, run beside the trace (so the report names it as a
/// file name, wherever the repository is).
fn report(trace: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("report")
        .args(args)
        .arg(trace)
        .current_dir(fixtures())
        .output()
        .unwrap();
    assert!(out.status.success(), "{trace}: {}", common::stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// The first line where `got` and `stored` differ, for the failure message.
fn first_difference(got: &str, stored: &str) -> String {
    let (mut g, mut s) = (got.lines(), stored.lines());
    for n in 1.. {
        match (g.next(), s.next()) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => return format!("line {n}: now {a:?}, stored {b:?}"),
        }
    }
    unreachable!()
}

#[test]
fn the_stored_recordings_report_as_they_did() {
    let bless = std::env::var_os("FRAGSCOPE_BLESS").is_some();
    let mut traces: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".fsc"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 7, "{traces:?}");
    let mut changed = Vec::new();
    for trace in &traces {
        for (args, ext) in [(&["--json"][..], "json"), (&[][..], "txt")] {
            let got = report(trace, args);
            let path = fixtures().join(format!("{}.{ext}", trace.trim_end_matches(".fsc")));
            if bless {
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let stored = std::fs::read_to_string(&path).unwrap_or_default();
            if got != stored {
                changed.push(format!(
                    "{}: {}",
                    path.display(),
                    first_difference(&got, &stored)
                ));
            }
        }
    }
    assert!(
        changed.is_empty(),
        "reports changed (if on purpose, store them with FRAGSCOPE_BLESS=1):\n{}",
        changed.join("\n")
    );
}

/// `--at` makes the report describe the snapshot asked for (by time, or the last, or the
/// highest RSS) and says so; without it the report is the one stored; a moment that is
/// not one is refused with what would be.
#[test]
fn at_asks_for_the_snapshot_the_report_describes() {
    let json = |args: &[&str]| -> serde_json::Value {
        let args: Vec<&str> = ["--json"].iter().chain(args).copied().collect();
        serde_json::from_str(&report("prefork.fsc", &args)).unwrap()
    };
    let plain = json(&[]);
    assert!(
        plain.get("focus_asked").is_none(),
        "{}",
        plain["focus_asked"]
    );
    let times: Vec<f64> = (plain["snapshots"].as_array().unwrap().iter())
        .map(|s| s["t_ms"].as_f64().unwrap())
        .collect();
    assert!(times.len() >= 3, "{times:?}");
    let nearest = |ms: f64| {
        (0..times.len())
            .min_by(|&a, &b| (times[a] - ms).abs().total_cmp(&(times[b] - ms).abs()))
            .unwrap()
    };
    let first = format!("{}ms", times[0]);
    let second = format!("{}s", (times[1] + 1.0) / 1000.0);
    let asked = [
        (first.as_str(), nearest(times[0]), "nearest"),
        (second.as_str(), 1, "nearest"),
        ("end", times.len() - 1, "the last"),
        (
            "peak-rss",
            plain["peak_snapshot"].as_u64().unwrap() as usize,
            "highest RSS",
        ),
    ];
    for (at, want, said) in asked {
        let r = json(&["--at", at]);
        assert_eq!(r["focus_snapshot"].as_u64(), Some(want as u64), "--at {at}");
        let phrase = r["focus_asked"].as_str().unwrap_or_default();
        assert!(
            phrase.contains(said) && phrase.ends_with("as asked"),
            "--at {at}: {phrase}"
        );
    }
    let text = report("prefork.fsc", &["--at", &second]);
    assert!(text.contains(", as asked): "), "{text}");
    assert!(text.contains("at the snapshot asked for (--at)"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["report", "--at", "soon", "prefork.fsc"])
        .current_dir(fixtures())
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`soon` is not a moment") && !err.contains("panicked"),
        "{err}"
    );
}
