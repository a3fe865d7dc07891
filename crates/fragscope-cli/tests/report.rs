//! `fragscope report` on real programs under real allocators: the decomposition must tell
//! a heap whose survivors are spread over every page (free space pinned inside pages) from
//! one whose survivors are packed (whole free pages kept), agree with the program's own
//! count of live bytes, and agree with the allocator's own statistics.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::JEMALLOC;
use serde_json::Value;

const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4";

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

/// Records `exe args` with `preload` (an allocator) and `env`, and returns the JSON report
/// and the program's stdout.
fn record_and_report(
    dir: &Path,
    tag: &str,
    preload: Option<&str>,
    env: &[(&str, &str)],
    exe: &Path,
    args: &[&str],
) -> (Value, String) {
    let trace = dir.join(format!("{tag}.fsc"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    cmd.args(["record", "--snapshot-ms", "250", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args(args);
    match preload {
        Some(p) => cmd.env("LD_PRELOAD", p),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "record failed: {}",
        common::stderr(&out)
    );
    (
        common::report_json(&trace),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// stripe's plateau: of the snapshots while it holds its survivors (live bytes the
/// program's, within 256 KiB), the one with the most heap waste. Not the report's focus:
/// a periodic snapshot can fall into the teardown after the plateau, while the survivors
/// are being freed, and hold more waste than the plateau (the report's focus then; seen
/// under load, 10.7 MB live of 14.4).
fn plateau(report: &Value) -> &Value {
    let holding =
        |s: &&Value| s["reason"] != "exit" && u(s, "live").abs_diff(expected_live()) < 256 << 10;
    let waste = |s: &&Value| u(s, "heap_resident").saturating_sub(u(s, "live"));
    report["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(holding)
        .max_by_key(waste)
        .unwrap_or_else(|| {
            panic!(
                "no snapshot holds the program's {} live bytes: {report}",
                expected_live()
            )
        })
}

/// `report --json --at` the moment of snapshot `s` of `trace`.
fn report_at(trace: &Path, s: &Value) -> Value {
    let at = format!("{}ms", s["t_ms"].as_f64().expect("a snapshot's time"));
    common::report_json_with(trace, &["--at", &at])
}

/// Every part is non-negative and the parts add up to RSS exactly.
fn assert_adds_up(s: &Value) {
    let parts = [
        "live",
        "rounding",
        "allocator_overhead",
        "free_in_used_pages",
        "free_resident_pages",
        "lazy_free",
        "other_anon",
        "file",
        "fragscope_own",
    ];
    let sum: i64 =
        parts.iter().map(|k| u(s, k) as i64).sum::<i64>() + s["unexplained"].as_i64().unwrap();
    assert_eq!(sum, u(s, "rss") as i64, "{s}");
}

fn occupancy_pages(s: &Value, lo_pct: u64, hi_pct: u64) -> u64 {
    s["occupancy"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| u(b, "lo_pct") == lo_pct && u(b, "hi_pct") == hi_pct)
        .map_or(0, |b| u(b, "pages"))
}

const N: u64 = 1_000_000;
const SIZE: u64 = 64;

/// stripe's survivors are N/10 objects of SIZE bytes, held through an array of N pointers.
fn expected_live() -> u64 {
    N / 10 * SIZE + N * 8
}

#[test]
fn stripe_under_jemalloc_strip_pins_pages_take_keeps_free_pages() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "stripe") else {
        return;
    };
    let n = N.to_string();
    let (strip, _) = record_and_report(
        dir.path(),
        "strip",
        Some(JEMALLOC),
        &[],
        &exe,
        &["strip", &n],
    );
    let (take, _) = record_and_report(dir.path(), "take", Some(JEMALLOC), &[], &exe, &["take", &n]);
    let (take_purged, _) = record_and_report(
        dir.path(),
        "take_purged",
        Some(JEMALLOC),
        &[("MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")],
        &exe,
        &["take", &n],
    );
    for r in [&strip, &take, &take_purged] {
        assert_eq!(r["allocator"], "jemalloc");
        for s in r["snapshots"].as_array().unwrap() {
            assert_adds_up(s);
        }
        // A snapshot holds the program's live bytes (the plateau, found by them).
        plateau(r);
    }
    let s = plateau(&strip);
    assert!(
        u(s, "free_in_used_pages") > 4 * u(s, "free_resident_pages"),
        "strip: waste should be inside pinned pages: {s}"
    );
    let sparse = occupancy_pages(s, 0, 10);
    for (lo, hi) in [(0, 0), (10, 20), (20, 30), (90, 100)] {
        assert!(sparse > occupancy_pages(s, lo, hi), "strip occupancy: {s}");
    }
    // The headline of the plateau: the report's own focus may be a snapshot caught inside
    // the teardown under load (see `plateau`), whose waste is freed pages.
    let at_plateau = report_at(&dir.path().join("strip.fsc"), s);
    assert_eq!(at_plateau["headline"]["dominant"], "free_in_used_pages");

    let t = plateau(&take);
    assert!(
        u(t, "free_resident_pages") + u(t, "lazy_free") > 4 * u(t, "free_in_used_pages"),
        "take: waste should be whole free pages: {t}"
    );
    assert_eq!(take["headline"]["dominant"], "free_resident_pages");

    // Purging at once returns take's free pages: RSS and the free-page part fall.
    let p = plateau(&take_purged);
    assert!(
        u(p, "rss") * 2 < u(t, "rss"),
        "purged take RSS {} vs {}",
        u(p, "rss"),
        u(t, "rss")
    );
    assert!(u(p, "free_resident_pages") * 4 < u(t, "free_resident_pages"));
}

#[test]
fn stripe_under_glibc_strip_pins_pages() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "stripe") else {
        return;
    };
    let (strip, _) = record_and_report(
        dir.path(),
        "strip",
        None,
        &[],
        &exe,
        &["strip", &N.to_string()],
    );
    let s = plateau(&strip);
    assert_adds_up(s);
    // glibc's 64-byte requests get 72 usable bytes.
    assert!(u(s, "rounding") >= N / 10 * 8, "{s}");
    assert!(
        u(s, "free_in_used_pages") > 4 * u(s, "free_resident_pages"),
        "{s}"
    );
    assert_eq!(strip["allocator"], "glibc");
}

/// sizeclass_churn prints its live bytes after every fill and free; fragscope's live
/// bytes must follow, and the allocator's own count of bytes in use must agree with
/// fragscope's live + rounding.
fn churn_agrees(preload: &str, name: &str) {
    if !Path::new(preload).exists() {
        panic!("{preload} is missing: run scripts/install-deps.sh");
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "sizeclass_churn") else {
        return;
    };
    let (r, stdout) = record_and_report(dir.path(), name, Some(preload), &[], &exe, &["64", "1"]);
    assert_eq!(r["allocator"], name);
    let printed_max_live = stdout
        .lines()
        .filter_map(|l| l.split("live=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .fold(0.0f64, f64::max);
    assert!(printed_max_live > 50.0, "{stdout}");
    let printed = (printed_max_live * 1048576.0) as u64;
    let peak_live = u(&r["headline"], "peak_live");
    // The program's own bookkeeping array is live too, and its count is rounded to 0.1 MiB.
    assert!(
        peak_live + (200 << 10) >= printed && peak_live <= printed + printed / 10,
        "peak live {peak_live} vs printed {printed}"
    );
    let mut compared = 0;
    for s in r["snapshots"].as_array().unwrap() {
        assert_adds_up(s);
        let Some(cmp) = s["allocator"]["comparisons"].as_array() else {
            continue;
        };
        let in_use = cmp.iter().find(|c| c["quantity"] == "in use").unwrap();
        let (theirs, ours) = (u(in_use, "allocator"), u(in_use, "fragscope"));
        assert!(
            theirs.abs_diff(ours) <= ours / 20 + (1 << 20),
            "{name} in use {theirs} vs fragscope {ours} at {}",
            s["t_ms"]
        );
        compared += 1;
    }
    assert!(compared > 0, "no snapshot carried {name}'s statistics");
}

#[test]
fn sizeclass_churn_under_jemalloc_agrees_with_the_program_and_the_allocator() {
    churn_agrees(JEMALLOC, "jemalloc");
}

#[test]
fn sizeclass_churn_under_tcmalloc_agrees_with_the_program_and_the_allocator() {
    churn_agrees(TCMALLOC, "tcmalloc");
}

#[test]
fn bad_input_gets_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.fsc");
    std::fs::write(&junk, b"this is not a trace").unwrap();
    for args in [
        vec!["report".into(), junk.clone().into_os_string()],
        vec![
            "report".into(),
            dir.path().join("missing.fsc").into_os_string(),
        ],
        vec![
            "report".into(),
            junk.into_os_string(),
            "--sparse-pct".into(),
            "0".into(),
        ],
    ] {
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = common::fragscope(&refs);
        let err = common::stderr(&out);
        assert!(!out.status.success());
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains("error"), "{err}");
    }
}

/// Sites are named from DWARF (function and file:line), from the symbol table alone
/// (function and module: all its calls are one site then), or, with neither, as
/// module+offset — never dropped.
#[test]
fn sites_are_symbolized_with_whatever_the_binary_has() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scatter.c");
    for (flags, expect) in [
        (&["-g"][..], "main (scatter.c:"),
        (&["-g0"][..], "main (scatter_symtab)"),
        (&["-s"][..], "scatter_stripped+0x"),
    ] {
        let name = match flags[0] {
            "-g" => "scatter_dwarf",
            "-g0" => "scatter_symtab",
            _ => "scatter_stripped",
        };
        let exe = dir.path().join(name);
        let ok = Command::new("cc")
            .args(["-O1", "-fPIE", "-pie"])
            .args(flags)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .unwrap();
        assert!(ok.success());
        let trace = dir.path().join(format!("{name}.fsc"));
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--stacks", "all", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .args(["20000", "1200"])
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        let rep = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["report", "--json"])
            .arg(&trace)
            .output()
            .unwrap();
        assert!(rep.status.success(), "{}", common::stderr(&rep));
        let r: Value = serde_json::from_slice(&rep.stdout).unwrap();
        let top = &r["sites"]["by_allocations"][0];
        let label = top["label"].as_str().unwrap();
        assert!(label.starts_with(expect), "{flags:?}: {label}");
        // main's two calls of malloc are two sites with line tables, one without.
        let rows = r["sites"]["by_allocations"].as_array().unwrap();
        let mains = rows
            .iter()
            .filter(|s| s["label"].as_str().unwrap().starts_with("main ("))
            .count();
        if flags[0] == "-g0" {
            assert_eq!(mains, 1, "{}", r["sites"]);
            assert_eq!(u(top, "allocations"), 20001, "{top}");
            assert_eq!(u(top, "stacks"), 2, "{top}");
        } else {
            assert_eq!(u(top, "allocations"), 20000, "{top}");
        }
        if flags[0] == "-g" {
            assert_eq!(mains, 2, "{}", r["sites"]);
            // The decomposition's columns are labelled by every role they have: the
            // snapshot of most waste is not called only "peak RSS".
            let text = Command::new(env!("CARGO_BIN_EXE_fragscope"))
                .arg("report")
                .arg(&trace)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&text.stdout);
            let header = text
                .lines()
                .find(|l| l.starts_with("Where RSS goes"))
                .expect("a decomposition");
            assert!(header.contains("most waste"), "{header}");
            assert!(header.trim_end().ends_with("end"), "{header}");
            let focus = r["focus_snapshot"].as_u64().unwrap() as usize;
            let t = r["snapshots"][focus]["t_ms"].as_f64().unwrap() / 1000.0;
            assert!(text.contains("(snapshot at)"), "{text}");
            assert!(text.contains(&format!("{t:.2} s")), "{text}");
        }
        // the scattered survivors are the site that pins pages
        let pinning = &r["sites"]["by_pinned_waste"][0];
        assert_eq!(pinning["stack"], top["stack"], "{}", r["sites"]);
    }
}

/// A command run through a shell records the shell and every program it starts; the
/// report explains the one with the largest heap, says it is one of several, and lists
/// the others with how to pick one.
#[test]
fn of_many_processes_the_largest_heap_is_explained_and_the_others_listed() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scatter.c");
    let exe = dir.path().join("scatter");
    let ok = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
    let trace = dir.path().join("t.fsc");
    let e = exe.display();
    let script = format!("{e} 2000 10; {e} 40000 10; {e} 1000 10");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--", "sh", "-c", &script])
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let rep = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("report")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&rep.stdout);
    let first = text.lines().next().unwrap();
    assert!(first.contains("scatter 40000"), "{text}");
    assert!(text.contains("one of 4 processes"), "{text}");
    assert!(text.contains("--pid N"), "{text}");
    let listed = text
        .split("Processes in this trace")
        .nth(1)
        .expect("a list of the processes");
    let rows: Vec<&str> = listed
        .lines()
        .filter(|l| l.contains("(exited 0)"))
        .collect();
    assert_eq!(rows.len(), 4, "{listed}");
    let this: Vec<&&str> = rows
        .iter()
        .filter(|l| l.contains("(this report)"))
        .collect();
    assert!(
        this.len() == 1 && this[0].contains("scatter 40000"),
        "{listed}"
    );
}

/// A program whose stacks outnumber the interposer's first stack table defines each
/// stack once, and every allocation keeps its stack.
#[test]
fn a_stack_seen_again_is_not_defined_again() {
    // 8192 distinct stacks, each reached 6 times in turn: more than the interposer's first
    // stack table holds.
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "many_stacks", &["-fno-omit-frame-pointer"]);
    let trace = dir.path().join("t.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "all", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .arg("49152")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let info = common::info(&trace);
    let p = &info["processes"][0];
    let defined = p["stacks"].as_u64().unwrap();
    // 8192 stacks of the recursion, and a few of the start and the end.
    assert!(
        (8192..8192 + 16).contains(&defined),
        "{defined} stack definitions for 8192 distinct stacks"
    );
    let r = common::report_json(&trace);
    // Every allocation still has its stack: the sites add up to all of them.
    let top = &r["sites"]["by_allocations"][0];
    assert_eq!(u(top, "allocations"), 49152, "{top}");
}

/// Leaks (live at exit) and temporary allocations (freed by their thread before it
/// allocates anything else), exactly and by site, as heaptrack users expect them.
#[test]
fn leaks_and_temporary_allocations_are_counted_by_site() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "leaks", &["-O2", "-g"]);
    let trace = dir.path().join("t.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "all", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let rep = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["report", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(rep.status.success(), "{}", common::stderr(&rep));
    let r: Value = serde_json::from_slice(&rep.stdout).unwrap();
    let l = &r["leaks"];
    assert_eq!(l["at_exit"], true, "{l}");
    // libc may keep a few blocks of its own; the program's are exact.
    assert!((1000..1010).contains(&u(l, "leaked_blocks")), "{l}");
    assert!((5000..5010).contains(&u(l, "temporary_allocations")), "{l}");
    let leak = &r["sites"]["by_leaked_bytes"][0];
    assert!(
        leak["label"].as_str().unwrap().starts_with("leak_some"),
        "{leak}"
    );
    assert_eq!(
        (u(leak, "leaked_objects"), u(leak, "leaked_bytes")),
        (1000, 100_000)
    );
    let temp = &r["sites"]["by_temporary_allocations"][0];
    assert!(
        temp["label"]
            .as_str()
            .unwrap()
            .starts_with("use_temporarily"),
        "{temp}"
    );
    assert_eq!(u(temp, "temporary_allocations"), 5000, "{temp}");
    // Blocks kept for a while and freed are neither.
    let kept = r["sites"]["by_allocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"].as_str().unwrap().starts_with("keep_for_a_while"))
        .expect("keep_for_a_while allocates");
    assert_eq!(
        (u(kept, "leaked_objects"), u(kept, "temporary_allocations")),
        (0, 0)
    );
    let text = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("report")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Leaked at exit"), "{text}");
    assert!(text.contains("Temporary allocations: 5"), "{text}");
}

/// A figure and its moment agree: live data that peaks a moment before the snapshot at
/// exit (which sees it freed) is not shown as the same moment with two figures; the
/// report gives both times to the millisecond and says which came first.
#[test]
fn a_peak_between_calls_and_a_snapshot_of_the_same_moment_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "peak_at_exit", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("report")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    // The program frees and exits at once; on a loaded machine its exit snapshot can
    // come milliseconds after the peak, and then the two are simply different moments.
    let r = common::report_json(&trace);
    let peak_ms = r["headline"]["peak_live_t_ms"].as_f64().unwrap();
    let exit_ms = r["snapshots"].as_array().unwrap().last().unwrap()["t_ms"]
        .as_f64()
        .unwrap();
    if peak_ms.floor() != exit_ms.floor() {
        // Different moments: no snapshot shows the peak's figure at another time. Either
        // none came while live data was held, or one came on the way up (a periodic
        // snapshot while the program still allocated), with less live data than the peak.
        let peak_live = r["headline"]["peak_live"].as_u64().unwrap();
        match r["focus_snapshot"].as_u64() {
            None => assert!(
                text.contains("No page-residency snapshot came while live data was held"),
                "{text}"
            ),
            Some(i) => {
                let live = r["snapshots"][i as usize]["live"].as_u64().unwrap();
                assert!(live < peak_live, "{text}");
            }
        }
        eprintln!("peak at {peak_ms} ms, exit snapshot at {exit_ms} ms: not the same moment");
        return;
    }
    let note = text
        .lines()
        .find(|l| l.starts_with("note: live data peaked at 7.8 MiB"))
        .unwrap_or_else(|| panic!("no note on the peak: {text}"));
    assert!(
        note.contains("was read after the calls of its millisecond"),
        "{note}"
    );
}

/// A program that frees nothing it allocated reports no frees of unknown blocks: the
/// interposer's own start-up leaves no block for the program to free (/bin/true once
/// showed 2, the dlerror messages of lookups that failed at start-up).
#[test]
fn a_program_without_frees_reports_no_unknown_frees() {
    let dir = tempfile::tempdir().unwrap();
    for stacks in ["sampled", "all", "none"] {
        let trace = dir.path().join(format!("true-{stacks}.fsc"));
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--stacks", stacks, "-o"])
            .arg(&trace)
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        let report = common::report_json(&trace);
        assert_eq!(
            report["merge"]["unknown_frees"], 0,
            "{stacks}: {}",
            report["merge"]
        );
        assert_eq!(report["calls"], 0, "{stacks}");
    }
}

/// A forked worker's live data at its exit: within 2% of `want` bytes.
fn assert_live_at_exit(w: &Value, want: f64) {
    let last = w["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(last["reason"], "exit", "{last}");
    let live = last["live"].as_f64().unwrap();
    assert!(
        (live - want).abs() <= want * 0.02,
        "live {live}, want {want}"
    );
}

/// A forked worker starts from its parent's heap at the fork: its frees of the blocks it
/// inherited are known, and those it keeps are in its live data (tests/c/prefork.c: it
/// holds 50 000 of its parent's blocks of 100 bytes and 50 000 of its own of 64).
#[test]
fn a_fork_child_starts_from_its_parents_heap() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, workers) = common::record_prefork(dir.path(), "prefork");
    let w = common::report_json_of(&trace, &workers[0]);
    let merge = &w["merge"];
    assert_eq!(merge["unknown_frees"], 0, "{merge}");
    assert_eq!(merge["inherited_frees"], 0, "{merge}");
    assert_eq!(merge["forced_allocs"], 0, "{merge}");
    assert_eq!(merge["inherited_blocks"], 100_000, "{merge}");
    assert_eq!(merge["inherited_bytes"], 10_000_000, "{merge}");
    assert_live_at_exit(&w, 50_000.0 * 100.0 + 50_000.0 * 64.0);
    // What it kept of its parent's is not leaked; what it allocated is.
    assert_eq!(w["leaks"]["leaked_bytes"], 3_200_000, "{}", w["leaks"]);
    assert_eq!(
        w["leaks"]["inherited_live_blocks"], 50_000,
        "{}",
        w["leaks"]
    );
    assert_eq!(
        w["leaks"]["inherited_live_bytes"], 5_000_000,
        "{}",
        w["leaks"]
    );
    // The parent's figures are its own.
    let parent = common::report_json_of(&trace, &w["processes"][0]["pid"]);
    let pm = &parent["merge"];
    assert!(
        pm["forked_from"].is_null() && pm["inherited_blocks"].is_null(),
        "{pm}"
    );
    assert_eq!(pm["unknown_frees"], 0, "{pm}");
    let peak = parent["headline"]["peak_live"].as_u64().unwrap();
    assert!((10_000_000..10_010_000).contains(&peak), "{peak}");
    assert_eq!(merge["forked_from"], parent["pid"], "{merge}");
    let text = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--pid".as_ref(),
        workers[0].as_ref(),
    ]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("started from its parent's heap at the fork"),
        "{text}"
    );
    assert!(!text.contains("frees of unknown blocks"), "{text}");
    assert!(!text.contains("are counted apart"), "{text}");
    // Freeing every other inherited block wrote to every page of them: the pages that
    // hold its live data are copies of its parent's, no longer shared.
    let sharing = &w["snapshots"].as_array().unwrap().last().unwrap()["sharing"];
    assert_eq!(sharing["forked"], true, "{sharing}");
    assert!(
        sharing["inherited"].as_u64().unwrap() >= 10_000_000,
        "{sharing}"
    );
    let live = sharing["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["part"] == "live")
        .unwrap();
    let resident = live["resident"].as_f64().unwrap();
    assert!(live["copied"].as_f64().unwrap() >= 0.9 * resident, "{live}");
    assert_eq!(live["shared"], 0, "{live}");
    assert!(text.contains("Shared and private at"), "{text}");
    let brief = w["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == w["pid"])
        .unwrap();
    assert_eq!(brief["forked_from"], parent["pid"], "{brief}");
}

/// A second thread of the parent allocates and frees while the main thread forks: each
/// worker's merge loses and forces nothing, and its live data is what it holds (its
/// parent's blocks it kept, its own, and the other thread's blocks live at the fork).
#[test]
fn a_fork_childs_heap_is_its_parents_while_another_thread_allocates() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, workers) = common::record_prefork(dir.path(), "prefork_threads");
    assert_eq!(workers.len(), 3);
    for pid in &workers {
        let w = common::report_json_of(&trace, pid);
        let merge = &w["merge"];
        for field in [
            "unknown_frees",
            "inherited_frees",
            "forced_allocs",
            "lost_events",
        ] {
            assert_eq!(merge[field], 0, "{pid} {field}: {merge}");
        }
        let inherited = merge["inherited_blocks"].as_u64().unwrap();
        assert!((100_000..=100_000 + 1100).contains(&inherited), "{merge}");
        assert_live_at_exit(&w, 50_000.0 * 100.0 + 50_000.0 * 64.0);
    }
    let parent = common::report_json_of(
        &trace,
        &common::report_json_of(&trace, &workers[0])["processes"][0]["pid"],
    );
    let pm = &parent["merge"];
    assert_eq!(
        (pm["unknown_frees"].as_u64(), pm["forced_allocs"].as_u64()),
        (Some(0), Some(0)),
        "{pm}"
    );
}

/// `report --json` of `trace` (for `pid`, when given), its snapshots evaluated as
/// `evaluation` says: from every live block (`blocks`), from the blocks kept by page
/// (`pages`), or each process's as the report chooses (`None`).
fn report_evaluated(trace: &Path, pid: Option<&str>, evaluation: Option<&str>) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    cmd.args(["report", "--json"]).arg(trace);
    if let Some(pid) = pid {
        cmd.args(["--pid", pid]);
    }
    if let Some(evaluation) = evaluation {
        cmd.env("FRAGSCOPE_EVALUATION", evaluation);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The three evaluations of `trace` (for `pid`) against every block's: where one first
/// differs, if one does.
fn evaluations_differ(trace: &Path, pid: Option<&str>) -> Option<String> {
    let full = report_evaluated(trace, pid, Some("blocks"));
    let snapshots = full["snapshots"].as_array().unwrap();
    assert!(!snapshots.is_empty(), "{}", trace.display());
    [Some("pages"), None].into_iter().find_map(|evaluation| {
        let other = report_evaluated(trace, pid, evaluation);
        let at = first_difference(&full, &other, String::new())?;
        Some(format!("{}: {at}", evaluation.unwrap_or("chosen")))
    })
}

/// Where `a` and `b` first differ (a JSON path), if they do. Fractional numbers may
/// differ in their last bits (sums of page shares added in another order); integers,
/// strings and everything else must be equal.
fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    let fraction = |v: &Value| v.as_f64().filter(|_| v.is_f64());
    match (a, b) {
        (Value::Number(_), Value::Number(_)) if fraction(a).is_some() && fraction(b).is_some() => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            let close = (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
            (!close).then(|| format!("{path}: {x} against {y}"))
        }
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            x.iter().find_map(|(k, v)| match y.get(k) {
                Some(w) => first_difference(v, w, format!("{path}.{k}")),
                None => Some(format!("{path}.{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => (x.iter().zip(y))
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} against {b}")),
    }
}

/// Snapshots evaluated from the live blocks kept by page, as calls are applied, report
/// what evaluating every live block at each snapshot reports (fractions to rounding), and
/// so does the report that chooses between the two per process and snapshot: on real programs
/// with threads, reallocs, thousands of sites, leaks, edge-case sizes, a forked worker
/// starting from its parent's heap, the shared cases, and the stored recordings.
#[test]
fn snapshots_evaluated_by_page_report_what_every_block_reports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let c = |name: &str, flags: &[&str]| common::build(d, name, flags);
    let mut runs: Vec<(String, PathBuf, Vec<&str>, Vec<&str>)> = vec![
        (
            "larson".into(),
            c("larson", &["-O2"]),
            vec!["4", "50000", "bursts"],
            vec![],
        ),
        (
            "realloc_ring".into(),
            c("realloc_ring", &["-O2"]),
            vec![],
            vec![],
        ),
        (
            "many_stacks".into(),
            c("many_stacks", &["-fno-omit-frame-pointer"]),
            vec!["49152"],
            vec!["--stacks", "all"],
        ),
        (
            "leaks".into(),
            c("leaks", &["-O2", "-g"]),
            vec![],
            vec!["--stacks", "all"],
        ),
        (
            "alloc_edges".into(),
            c("alloc_edges", &["-ldl"]),
            vec![],
            vec![],
        ),
    ];
    for (name, args) in [
        ("stripe", vec!["strip", "1000000"]),
        ("stripe", vec!["take", "1000000"]),
        ("churn", vec!["2000000"]),
        ("sizeclass_churn", vec!["64", "2"]),
    ] {
        if let Some(exe) = build_case(d, name) {
            runs.push((format!("{name} {}", args[0]), exe, args, vec![]));
        }
    }
    for (i, (name, exe, args, options)) in runs.iter().enumerate() {
        let trace = d.join(format!("{i}.fsc"));
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .arg("record")
            .args(options)
            .args(["--snapshot-ms", "50", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(exe)
            .args(args)
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", common::stderr(&out));
        if let Some(at) = evaluations_differ(&trace, None) {
            panic!("{name}: {at}");
        }
    }
    // A forked worker, whose snapshots are evaluated after its parent's.
    let (trace, workers) = common::record_prefork(d, "prefork");
    for pid in &workers {
        if let Some(at) = evaluations_differ(&trace, Some(pid)) {
            panic!("prefork worker {pid}: {at}");
        }
    }
    if let Some(at) = evaluations_differ(&trace, None) {
        panic!("prefork: {at}");
    }
    // The stored recordings: the trace crate's fixtures (threads with every stack, packed
    // calls without stacks) and `stripe strip` with stacks sampled every 4 KiB, whose
    // sites pin sparse pages at 186 snapshots (`fragscope record --snapshot-ms 2
    // --sample-bytes 4096 -- stripe strip 40000`).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in [
        "fragscope-model/tests/fixtures",
        "fragscope-trace/tests/fixtures",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let trace = entry.unwrap().path();
            if trace.extension().is_some_and(|e| e == "fsc") {
                if let Some(at) = evaluations_differ(&trace, None) {
                    panic!("{}: {at}", trace.display());
                }
            }
        }
    }
    let stripe = root.join("fragscope-model/tests/fixtures/stripe-strip-sampled.fsc");
    let pinning = report_evaluated(&stripe, None, Some("pages"));
    let pinning = pinning["sites"]["by_pinned_waste"].as_array().unwrap();
    assert!(
        (pinning.iter()).any(|s| s["pinned_pages"].as_f64().unwrap() > 100.0),
        "the stripe fixture's sites pin no pages: {pinning:?}"
    );
}
