//! `fragscope export`: every format checked against `fragscope report --json` of the same
//! trace, and read by the tools it is meant for — the real `go tool pprof` for pprof,
//! DuckDB (from PyPI, in the virtualenv scripts/install-deps.sh makes) for Parquet.
//!
//! The recorded program is tests/c/html_sites.c: big_buffers allocates 64 blocks of
//! 1 MiB (the most bytes), scatter_records keeps every 16th of 200000 records of 48 bytes
//! (the most live bytes and the pinned waste).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use arrow_array::{Array, Float64Array, StringArray, UInt64Array};
use serde_json::Value;

use common::{go, pprof_top};

fn fragscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One recording shared by the tests of this file: (its directory, the trace).
fn recorded() -> &'static (tempfile::TempDir, PathBuf) {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = common::build(dir.path(), "html_sites", &["-g"]);
        let trace = dir.path().join("html_sites.fsc");
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--stacks", "all", "--snapshot-ms", "100", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&exe)
            .arg("300")
            .env_remove("LD_PRELOAD")
            .output()
            .unwrap();
        assert!(out.status.success(), "record: {}", common::stderr(&out));
        (dir, trace)
    })
}

fn trace() -> &'static str {
    recorded().1.to_str().unwrap()
}

fn out_path(name: &str) -> PathBuf {
    recorded().0.path().join(name)
}

/// `report --json` with every site in its tables.
fn report() -> &'static Value {
    static REPORT: OnceLock<Value> = OnceLock::new();
    REPORT.get_or_init(|| {
        let out = ok(
            fragscope(&["report", "--json", "--top", "100000", trace()]),
            "report",
        );
        serde_json::from_slice(&out.stdout).unwrap()
    })
}

/// Every site of the report's tables, once, by stack id.
fn sites() -> BTreeMap<u64, Value> {
    let mut all = BTreeMap::new();
    for list in [
        "by_live_bytes",
        "by_pinned_waste",
        "by_allocated_bytes",
        "by_allocations",
    ] {
        for s in report()["sites"][list].as_array().unwrap() {
            all.insert(s["stack"].as_u64().unwrap(), s.clone());
        }
    }
    assert!(!all.is_empty(), "the report has no sites");
    all
}

/// The report's sum of one site figure over every site.
fn site_total(field: &str) -> u64 {
    sites().values().map(|s| s[field].as_u64().unwrap()).sum()
}

/// The function of the first site of a report table (the site its label names).
fn top_function(list: &str) -> String {
    let s = &report()["sites"][list][0];
    let label = s["label"].as_str().unwrap();
    s["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["function"]
                .as_str()
                .is_some_and(|name| label.starts_with(&format!("{name} (")))
        })
        .and_then(|f| f["function"].as_str())
        .unwrap_or_else(|| panic!("no frame of {label} has a function"))
        .to_string()
}

/// (report figure, pprof sample type / collapsed --value)
const FIGURES: [(&str, &str); 5] = [
    ("allocated_bytes", "alloc_space"),
    ("allocations", "alloc_objects"),
    ("live_bytes", "inuse_space"),
    ("live_objects", "inuse_objects"),
    ("pinned_waste", "pinned_waste"),
];

#[test]
fn json_is_the_report_document() {
    let path = out_path("report.json");
    ok(
        fragscope(&[
            "export",
            trace(),
            "--format",
            "json",
            "-o",
            path.to_str().unwrap(),
        ]),
        "export json",
    );
    let report = ok(fragscope(&["report", "--json", trace()]), "report");
    assert_eq!(std::fs::read(&path).unwrap(), report.stdout);
    let stdout = ok(
        fragscope(&["export", trace(), "-f", "json", "-o", "-", "--top", "3"]),
        "export json to stdout",
    );
    let three = ok(
        fragscope(&["report", "--json", "--top", "3", trace()]),
        "report",
    );
    assert_eq!(stdout.stdout, three.stdout);
    assert_ne!(stdout.stdout, report.stdout, "--top reaches the document");
}

/// Parses folded stacks into (frames root first, value).
fn folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .map(|l| {
            let (path, v) = l
                .rsplit_once(' ')
                .expect("a folded line ends with its value");
            let frames: Vec<String> = path.split(';').map(str::to_string).collect();
            assert!(frames.iter().all(|f| !f.is_empty()), "empty frame in {l}");
            (frames, v.parse().expect("an integer value"))
        })
        .collect()
}

#[test]
fn collapsed_stacks_sum_to_the_reports_totals() {
    for (field, value) in FIGURES {
        let out = ok(
            fragscope(&[
                "export",
                trace(),
                "-f",
                "collapsed",
                "--value",
                value,
                "-o",
                "-",
            ]),
            "export collapsed",
        );
        let lines = folded(&String::from_utf8(out.stdout).unwrap());
        let sum: u64 = lines.iter().map(|l| l.1).sum();
        assert_eq!(
            sum,
            site_total(field),
            "{value}: folded sum vs the report's sites"
        );
        assert!(lines.iter().all(|l| l.1 > 0), "{value}: no zero lines");
        if value == "alloc_space" {
            // big_buffers allocates 64 MiB: the largest line ends in it, with exactly that.
            let top = lines.iter().max_by_key(|l| l.1).unwrap();
            assert!(top.0.last().unwrap().starts_with("big_buffers "), "{top:?}");
            assert_eq!(top.1, 64 << 20);
            assert!(top.0.iter().any(|f| f.starts_with("main ")), "{top:?}");
        }
    }
    // The file form is the same text.
    let path = out_path("pinned.folded");
    ok(
        fragscope(&[
            "export",
            trace(),
            "-f",
            "collapsed",
            "--value",
            "pinned_waste",
            "-o",
            path.to_str().unwrap(),
        ]),
        "export collapsed to a file",
    );
    let lines = folded(&std::fs::read_to_string(&path).unwrap());
    let top = lines.iter().max_by_key(|l| l.1).unwrap();
    assert!(
        top.0
            .last()
            .unwrap()
            .starts_with(&top_function("by_pinned_waste")),
        "{top:?}"
    );
}

#[test]
fn pprof_reads_in_go_tool_pprof() {
    let path = out_path("heap.pb.gz");
    ok(
        fragscope(&[
            "export",
            trace(),
            "-f",
            "pprof",
            "-o",
            path.to_str().unwrap(),
        ]),
        "export pprof",
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip");
    let Some(go) = go() else {
        eprintln!("skipped go tool pprof: go is not installed (scripts/install-deps.sh installs golang-go)");
        return;
    };
    for (field, sample) in FIGURES {
        let (total, rows) = pprof_top(&go, &path, sample, &[]);
        assert_eq!(total, site_total(field), "{sample}: pprof's total");
        let flat: u64 = rows.iter().map(|r| r.0).sum();
        assert!(flat <= total);
        let list = match field {
            "allocated_bytes" => "by_allocated_bytes",
            "allocations" => "by_allocations",
            "pinned_waste" => "by_pinned_waste",
            _ => "by_live_bytes",
        };
        if field == "live_objects" {
            continue; // the report ranks sites by live bytes, not objects
        }
        assert_eq!(
            rows[0].1,
            top_function(list),
            "{sample}: pprof's top function vs the report's top site"
        );
    }
    let raw = Command::new(&go)
        .args(["tool", "pprof", "-raw"])
        .arg(&path)
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&raw.stdout);
    assert!(raw.contains("inuse_space/bytes[dflt]"), "{raw}");
    assert!(raw.contains("pinned_waste/bytes"), "{raw}");
}

/// A CPython recording's pprof and folded stacks hold its Python lines (the sampled
/// stacks, beside the interpreter's native sites), with the report's figures for them.
#[test]
fn a_cpython_recordings_exports_name_its_python_lines() {
    let dir = tempfile::tempdir().unwrap();
    let trace = common::record_keep_a_tenth(dir.path(), &["300000", "0.5"]);
    let report = common::report_json(&trace);
    let trace = trace.to_str().unwrap();
    let top = &report["python_sites"]["sites"][0];
    let what = format!("{}", report["python_sites"]);
    assert!(
        top["location"]
            .as_str()
            .unwrap()
            .contains("keep_a_tenth.py:11 ("),
        "{what}"
    );
    // Each stack's figure is rounded to a byte: the line's sum is the report's to a byte a
    // stack.
    let near = |got: u64, field: &str| {
        let want = top[field].as_f64().unwrap();
        assert!(want > 0.0, "{field}: {what}");
        assert!(
            (got as f64 - want).abs() <= 64.0,
            "{field}: {got} in the export, {want} in the report: {what}"
        );
    };
    let out = ok(
        fragscope(&[
            "export",
            trace,
            "-f",
            "collapsed",
            "--value",
            "inuse_space",
            "-o",
            "-",
        ]),
        "export collapsed",
    );
    let lines = folded(&String::from_utf8(out.stdout).unwrap());
    let line11: u64 = lines
        .iter()
        .filter(|l| l.0.last().unwrap().contains("(keep_a_tenth.py:11)"))
        .map(|l| l.1)
        .sum();
    near(line11, "live_bytes");

    let path = dir.path().join("py.pb.gz");
    ok(
        fragscope(&["export", trace, "-f", "pprof", "-o", path.to_str().unwrap()]),
        "export pprof",
    );
    let Some(go) = go() else {
        eprintln!("skipped go tool pprof: go is not installed (scripts/install-deps.sh installs golang-go)");
        return;
    };
    let python = ["-lines", "-tagfocus=kind=python"];
    let row = |sample: &str| {
        let (_, rows) = pprof_top(&go, &path, sample, &python);
        rows.into_iter()
            .find(|r| r.1.ends_with("keep_a_tenth.py:11") && r.0 > 0)
            .unwrap_or_else(|| panic!("{sample}: no keep_a_tenth.py:11 line with a value"))
    };
    near(row("inuse_space").0, "live_bytes");
    near(row("alloc_space").0, "allocated_bytes");
    // What holds the arenas' free space, ranked with the native sites: line 11 first,
    // named by its function (not pprof's "<unknown>" for `<listcomp>`).
    let (_, rows) = pprof_top(&go, &path, "pinned_waste", &["-lines"]);
    assert!(rows[0].1.ends_with("keep_a_tenth.py:11"), "{rows:?}");
    assert!(rows[0].1.starts_with("keep_a_tenth.<"), "{rows:?}");
    near(rows[0].0, "held_bytes");

    // Parquet: a row per stack, whose line-11 rows sum to the report's line; the pymalloc
    // parts beside each snapshot (read back with the parquet crate's own reader).
    let pq = dir.path().join("py.parquet");
    ok(
        fragscope(&[
            "export",
            trace,
            "-f",
            "parquet",
            "--no-events",
            "-o",
            pq.to_str().unwrap(),
        ]),
        "export parquet",
    );
    let stacks = pq.join("python_sites.parquet");
    let location = parquet_column(&stacks, "location", |a: &StringArray, i| {
        a.value(i).to_string()
    });
    let live = parquet_column(&stacks, "live_bytes", |a: &Float64Array, i| a.value(i));
    let line11: f64 = location
        .iter()
        .zip(&live)
        .filter(|(l, _)| l.contains("keep_a_tenth.py:11 ("))
        .map(|(_, v)| v)
        .sum();
    near(line11.round() as u64, "live_bytes");
    let in_use = parquet_column(
        &pq.join("snapshots.parquet"),
        "pymalloc_in_use",
        |a: &UInt64Array, i| (!a.is_null(i)).then(|| a.value(i)),
    );
    let census: Vec<Option<u64>> = report["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pymalloc"]["in_use"].as_u64())
        .collect();
    assert!(census.iter().any(Option::is_some));
    assert_eq!(in_use, census, "pymalloc_in_use by snapshot");
}

/// One column of a Parquet file, every row through `value` (read with the parquet
/// crate's own reader).
fn parquet_column<A: Array + 'static, T>(
    path: &Path,
    name: &str,
    value: impl Fn(&A, usize) -> T,
) -> Vec<T> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let column = batch
            .column_by_name(name)
            .unwrap_or_else(|| panic!("{}: no column {name}", path.display()));
        let a = column
            .as_any()
            .downcast_ref::<A>()
            .unwrap_or_else(|| panic!("{name}: {:?}", column.data_type()));
        out.extend((0..a.len()).map(|i| value(a, i)));
    }
    out
}

/// A Python that can import duckdb: $FRAGSCOPE_PYTHON, the virtualenv of
/// scripts/install-deps.sh, or python3.
fn python_with_duckdb() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv/bin/python");
    std::env::var_os("FRAGSCOPE_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv, PathBuf::from("python3")])
        .find(|p| {
            Command::new(p)
                .args(["-c", "import duckdb"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Figures of the Parquet tables, computed by DuckDB.
const QUERIES: &str = r#"
import duckdb, json, sys
d = sys.argv[1]
c = duckdb.connect()
def one(q):
    return c.execute(q.replace("T(", "read_parquet('" + d + "/").replace(".pq)", ".parquet')")).fetchone()
out = {}
out["sites"] = one("select count(*), sum(alloc_space), sum(alloc_objects), sum(inuse_space), sum(inuse_objects), sum(pinned_waste) from T(sites.pq)")
out["top_pinned"] = one("select function from T(sites.pq) order by pinned_waste desc limit 1")
out["snapshots"] = one("select count(*), sum(rss), sum(live), sum(rounding), sum(free_in_used_pages), sum(free_resident_pages), sum(other_anon), sum(file), sum(unexplained), sum(used_pages + empty_pages) from T(snapshots.pq)")
out["parts_add_up"] = one("select bool_and(live + rounding + allocator_overhead + free_in_used_pages + free_resident_pages + lazy_free + pymalloc_arenas + other_anon + file + fragscope_own + unexplained = rss) from T(snapshots.pq)")
out["occupancy"] = one("select count(*), sum(pages) from T(occupancy.pq)")
out["events"] = one("select count(*), sum(size), count(distinct tid), bool_and(seq = rn) from (select *, row_number() over () - 1 as rn from T(events.pq))")
out["allocations"] = one("select count(*) from T(events.pq) where func <> 'free' and address <> 0")
out["rss"] = one("select count(*), max(rss) from T(rss.pq)")
out["pid"] = one("select value::varchar from parquet_kv_metadata('" + d + "/sites.parquet') where key::varchar = 'fragscope.pid'")
print(json.dumps(out))
"#;

#[test]
fn parquet_tables_agree_with_the_report() {
    let dir = out_path("run.parquet");
    let out = ok(
        fragscope(&[
            "export",
            trace(),
            "-f",
            "parquet",
            "-o",
            dir.to_str().unwrap(),
        ]),
        "export parquet",
    );
    let said = common::stderr(&out);
    for t in ["sites", "snapshots", "occupancy", "events", "rss"] {
        assert!(dir.join(format!("{t}.parquet")).is_file(), "{t}: {said}");
    }
    let Some(python) = python_with_duckdb() else {
        eprintln!("skipped reading the Parquet tables: no Python with duckdb (scripts/install-deps.sh makes target/pyenv)");
        return;
    };
    let q = Command::new(python)
        .args(["-c", QUERIES])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(q.status.success(), "duckdb: {}", common::stderr(&q));
    let got: Value = serde_json::from_slice(&q.stdout).unwrap();
    let n = |v: &Value| v.as_u64().or_else(|| v.as_f64().map(|f| f as u64)).unwrap();
    let r = report();

    let s = &got["sites"];
    assert_eq!(n(&s[0]), sites().len() as u64, "one row per site");
    for (i, (field, _)) in FIGURES.iter().enumerate() {
        assert_eq!(n(&s[i + 1]), site_total(field), "sites.{field}");
    }
    assert_eq!(got["top_pinned"][0], top_function("by_pinned_waste"));

    let snaps = r["snapshots"].as_array().unwrap();
    let sum = |k: &str| snaps.iter().map(|x| x[k].as_i64().unwrap()).sum::<i64>();
    let sn = &got["snapshots"];
    assert_eq!(n(&sn[0]), snaps.len() as u64);
    for (i, k) in [
        "rss",
        "live",
        "rounding",
        "free_in_used_pages",
        "free_resident_pages",
        "other_anon",
        "file",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(n(&sn[i + 1]) as i64, sum(k), "snapshots.{k}");
    }
    assert_eq!(sn[8].as_i64().unwrap(), sum("unexplained"));
    assert_eq!(got["parts_add_up"][0], true);
    let pages = sum("used_pages") + sum("empty_pages");
    assert_eq!(n(&sn[9]) as i64, pages);
    assert_eq!(n(&got["occupancy"][0]), 11 * snaps.len() as u64);
    assert_eq!(n(&got["occupancy"][1]) as i64, pages, "occupancy pages");

    // Every call, in merged order; the requested bytes of allocations are the sites'.
    let ev = &got["events"];
    assert_eq!(n(&ev[0]), r["calls"].as_u64().unwrap(), "one row per call");
    assert_eq!(n(&ev[1]), site_total("allocated_bytes"), "allocated bytes");
    assert_eq!(ev[3], true, "seq numbers the rows in order");
    assert_eq!(
        n(&got["allocations"][0]),
        site_total("allocations"),
        "allocating calls"
    );
    let timeline = r["timeline"].as_array().unwrap();
    assert!(n(&got["rss"][0]) >= timeline.len() as u64);
    assert_eq!(
        n(&got["rss"][1]),
        r["headline"]["peak_rss"].as_u64().unwrap()
    );
    assert_eq!(
        got["pid"][0].as_str().unwrap(),
        r["pid"].as_u64().unwrap().to_string()
    );

    // Without the events table.
    let lean = out_path("lean.parquet");
    ok(
        fragscope(&[
            "export",
            trace(),
            "-f",
            "parquet",
            "--no-events",
            "-o",
            lean.to_str().unwrap(),
        ]),
        "export parquet --no-events",
    );
    assert!(!lean.join("events.parquet").exists());
    assert!(
        !lean.join("python_sites.parquet").exists(),
        "not a CPython program"
    );
    assert!(lean.join("sites.parquet").is_file());
}

#[test]
fn clear_errors() {
    let dir = recorded().0.path();
    let fails = |args: &[&str], says: &str| {
        let out = fragscope(args);
        let err = common::stderr(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    let not_trace = dir.join("not-a-trace.fsc");
    std::fs::write(&not_trace, b"hello, this is no trace").unwrap();
    let not_trace = not_trace.to_str().unwrap();
    let out = out_path("x.pb.gz");
    let out = out.to_str().unwrap();
    fails(
        &["export", not_trace, "-f", "pprof", "-o", out],
        "not a fragscope trace",
    );
    fails(
        &["export", "/nonexistent.fsc", "-f", "json", "-o", out],
        "/nonexistent.fsc",
    );
    fails(
        &["export", trace(), "-f", "svg", "-o", out],
        "possible values",
    );
    fails(
        &[
            "export",
            trace(),
            "-f",
            "pprof",
            "-o",
            "/nonexistent/dir/x.pb.gz",
        ],
        "cannot write /nonexistent/dir/x.pb.gz",
    );
    fails(&["export", trace(), "-f", "pprof", "-o", "-"], "stdout");
    fails(
        &[
            "export",
            trace(),
            "-f",
            "pprof",
            "--value",
            "inuse_space",
            "-o",
            out,
        ],
        "--value",
    );
    // A file where the Parquet directory should be.
    fails(
        &["export", trace(), "-f", "parquet", "-o", not_trace],
        "cannot create",
    );
    assert!(!Path::new(out).exists(), "nothing written on failure");

    // A trace cut short still exports what is intact.
    let bytes = std::fs::read(trace()).unwrap();
    let cut = dir.join("cut.fsc");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let cut_out = out_path("cut.folded");
    ok(
        fragscope(&[
            "export",
            cut.to_str().unwrap(),
            "-f",
            "collapsed",
            "-o",
            cut_out.to_str().unwrap(),
        ]),
        "export of a cut trace",
    );
}

#[test]
fn help_has_examples() {
    let out = ok(fragscope(&["export", "--help"]), "export --help");
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("Examples:"), "{help}");
    for f in [
        "pprof",
        "collapsed",
        "parquet",
        "json",
        "pinned_waste",
        "go tool pprof",
    ] {
        assert!(help.contains(f), "{f} missing from --help");
    }
}

#[test]
fn a_ghc_eventlog_exports_as_its_report_json_only() {
    let eventlog = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/fragscope-ghc/tests/fixtures/pinned-strip-200000.eventlog");
    let eventlog = eventlog.to_str().unwrap();
    let json = ok(
        fragscope(&["export", eventlog, "-f", "json", "-o", "-"]),
        "export json of an eventlog",
    );
    let report = ok(fragscope(&["report", "--json", eventlog]), "report");
    assert_eq!(json.stdout, report.stdout);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["gc"].is_object(), "the GHC document");
    let out = out_path("ghc.pb.gz");
    let pprof = fragscope(&[
        "export",
        eventlog,
        "-f",
        "pprof",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!pprof.status.success());
    assert!(common::stderr(&pprof).contains("only --format json"));
}

/// A forked worker's calls start from its parent's heap at the fork, as its report does:
/// its frees of its parent's blocks free known blocks (tests/c/prefork.c: the worker
/// frees every other one of its parent's 100 000 blocks of 100 bytes). Merged alone,
/// each freed 0 bytes.
#[test]
fn a_fork_childs_events_free_its_parents_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, workers) = common::record_prefork(dir.path(), "prefork");
    let worker = workers[0].as_str();
    let tables = dir.path().join("worker.parquet");
    ok(
        fragscope(&[
            "export",
            trace.to_str().unwrap(),
            "--pid",
            worker,
            "-f",
            "parquet",
            "-o",
            tables.to_str().unwrap(),
        ]),
        "export parquet --pid",
    );
    let events = tables.join("events.parquet");
    let funcs = parquet_column(&events, "func", |a: &StringArray, i| a.value(i).to_string());
    let freed = parquet_column(&events, "freed", |a: &UInt64Array, i| a.value(i));
    let frees: Vec<u64> = (funcs.iter().zip(&freed))
        .filter(|(f, _)| *f == "free")
        .map(|(_, &b)| b)
        .collect();
    assert_eq!(frees.len(), 50_000);
    assert!(frees.iter().all(|&b| b == 100), "{:?}", &frees[..8]);
}
