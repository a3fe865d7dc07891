//! Go programs: `fragscope snapshot PID` of a running Go program reads its runtime's
//! spans, and the report splits RSS by them, against the program's own runtime.MemStats.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{fragscope, report_json, snapshot, stderr};

/// tests/go/NAME built with the installed Go into `dir` (None when Go is not installed).
fn build_go(dir: &Path, name: &str) -> Option<PathBuf> {
    build_go_with(dir, name, &[])
}

/// As [`build_go`], with `go build`'s `flags`.
fn build_go_with(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    build_go_by(dir, name, flags, "local")
}

/// As [`build_go_with`], by the Go release `toolchain` ("local": the installed one;
/// another is fetched as `GOTOOLCHAIN` does).
fn build_go_by(dir: &Path, name: &str, flags: &[&str], toolchain: &str) -> Option<PathBuf> {
    let Some(go) = common::go() else {
        eprintln!("skipped: go is not installed (scripts/install-deps.sh installs it)");
        return None;
    };
    let out = dir.join(toolchain).join(name);
    let mut build = Command::new(go);
    build
        .current_dir(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/go")
                .join(name),
        )
        .args(["build", "-o"])
        .arg(&out)
        .args(flags)
        .arg(".");
    if toolchain != "local" {
        build.env("GOTOOLCHAIN", toolchain);
    }
    let built = build.output().unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    Some(out)
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `command` started, once it says it is ready (a line starting "ready"); its stdin a
/// pipe, which ends when it is dropped.
fn started_ready(mut command: Command) -> Running {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let ready = out
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("ready"));
    let running = Running(child);
    assert!(ready, "{command:?} never said it was ready");
    running
}

/// keep_tenth, once it says it is ready, with its runtime.MemStats.
fn keep_tenth(dir: &Path, exe: &Path) -> (Running, serde_json::Value) {
    let stats = dir.join("memstats.json");
    let mut command = Command::new(exe);
    command.arg(&stats).args(["2000000", "30000000"]);
    let running = started_ready(command);
    let stats = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    (running, stats)
}

fn within(what: &str, ours: u64, theirs: u64, pct: f64) {
    assert!(
        (ours as f64 - theirs as f64).abs() <= theirs as f64 * pct / 100.0,
        "{what}: fragscope {ours}, the runtime's own {theirs}"
    );
}

#[test]
fn a_snapshot_of_a_go_program_splits_its_heap_by_span_as_its_runtime_counts_it() {
    // The oldest release the census reads, the installed one, and the newest.
    for toolchain in ["go1.22.12", "local", "go1.27.3"] {
        snapshot_splits_keep_tenth_as_its_runtime_counts_it(&[], toolchain);
    }
}

/// As shipped, without symbol table or DWARF: the same split, the same figures.
#[test]
fn a_snapshot_of_a_stripped_go_program_splits_its_heap_as_its_runtime_counts_it() {
    snapshot_splits_keep_tenth_as_its_runtime_counts_it(&["-ldflags=-s -w"], "local");
}

/// keep_tenth built by `toolchain` with `flags`, its snapshot's Go heap held to its
/// runtime.MemStats.
fn snapshot_splits_keep_tenth_as_its_runtime_counts_it(flags: &[&str], toolchain: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go_by(dir.path(), "keep_tenth", flags, toolchain) else {
        return;
    };
    let (running, m) = keep_tenth(dir.path(), &exe);
    let trace = dir.path().join("go.fsc");
    let err = snapshot(running.0.id(), &trace);
    assert!(err.contains("(go) was stopped for"), "{err}");

    let r = report_json(&trace);
    let s = &r["snapshots"][r["go_snapshot"].as_u64().unwrap() as usize];
    let go = &s["go"];
    let field = |k: &str| go[k].as_u64().unwrap();
    let stat = |k: &str| m[k].as_u64().unwrap();
    within(
        &format!("{toolchain}: HeapAlloc"),
        field("heap_alloc"),
        stat("HeapAlloc"),
        2.0,
    );
    within(
        &format!("{toolchain}: HeapInuse"),
        field("heap_in_use"),
        stat("HeapInuse"),
        2.0,
    );
    // Idle pages are what is left: what the program allocated since its own reading
    // came out of them, so they are held to 2% of the heap, not of themselves. Released
    // ones are the idle pages not resident.
    for (ours, theirs) in [("heap_idle", "HeapIdle"), ("released", "HeapReleased")] {
        assert!(
            field(ours).abs_diff(stat(theirs)) * 50 <= stat("HeapSys"),
            "{toolchain}: {theirs} {go:#} against {m:#}"
        );
    }
    // The parts add up to the heap's resident bytes, which are the decomposition's row.
    let parts = ["objects", "free_slots", "idle_kept", "stacks"];
    assert_eq!(
        parts.iter().map(|k| field(k)).sum::<u64>(),
        field("resident")
    );
    assert_eq!(s["go_heap"].as_u64(), Some(field("resident")));
    // Nine records in ten died: most of the heap in use is free slots of sparse spans.
    assert!(field("free_slots") > field("objects"), "{go:#}");
    assert!(field("sparse_spans") * 2 > field("spans_in_use"), "{go:#}");
    // Every byte of RSS is named: the runtime's own structures are all that is left.
    let (other, rss) = (
        s["other_anon"].as_u64().unwrap(),
        s["rss"].as_u64().unwrap(),
    );
    assert!(other * 10 < rss, "other anonymous {other} of RSS {rss}");
    assert_eq!(r["headline"]["heap"], "go", "{:#}", r["headline"]);
    assert_eq!(r["headline"]["dominant"], "go_free_slots");
    assert!(s["missing_census"].as_array().unwrap().is_empty());

    let text = common::report_text(&trace);
    assert!(text.contains("Go heap (go1."), "{text}");
    assert!(text.contains("HeapAlloc"), "{text}");
    assert!(text.contains("64 B slots"), "{text}");
    assert!(!text.contains("free resident pages"), "{text}");
}

#[test]
fn a_go_program_without_cgo_is_recorded_with_a_census_of_its_heap_at_every_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go(dir.path(), "keep_tenth") else {
        return;
    };
    let stats = dir.path().join("memstats.json");
    let trace = dir.path().join("go.fsc");
    let out = fragscope(&[
        "record".as_ref(),
        "--snapshot-ms".as_ref(),
        "250".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
        stats.as_os_str(),
        "2000000".as_ref(),
        "0".as_ref(),
        "1.5".as_ref(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("is a Go program without cgo"), "{err}");
    assert!(!err.contains("warning"), "{err}");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();

    let r = report_json(&trace);
    let snapshots = r["snapshots"].as_array().unwrap();
    let censused = snapshots.iter().filter(|s| s["go"].is_object()).count();
    assert!(censused >= 3, "{censused} of {} snapshots", snapshots.len());
    // Held still after its collection: the last census is the runtime's own accounting.
    let last = snapshots
        .iter()
        .rev()
        .find(|s| s["go"].is_object())
        .unwrap();
    let go = &last["go"];
    within(
        "HeapAlloc",
        go["heap_alloc"].as_u64().unwrap(),
        m["HeapAlloc"].as_u64().unwrap(),
        2.0,
    );
    within(
        "HeapInuse",
        go["heap_in_use"].as_u64().unwrap(),
        m["HeapInuse"].as_u64().unwrap(),
        2.0,
    );
    assert_eq!(r["headline"]["heap"], "go", "{:#}", r["headline"]);
    // Peak live is the censuses': the program made no malloc call.
    assert_eq!(r["calls"], 0);
    let peak_live = r["headline"]["peak_live"].as_u64().unwrap();
    assert!(
        peak_live as f64 >= 0.98 * m["HeapAlloc"].as_u64().unwrap() as f64,
        "{peak_live}"
    );
    let (other, rss) = (
        last["other_anon"].as_u64().unwrap(),
        last["rss"].as_u64().unwrap(),
    );
    assert!(other * 10 < rss, "other anonymous {other} of RSS {rss}");
    let text = common::report_text(&trace);
    assert!(
        text.contains("a Go program without cgo makes no malloc call"),
        "{text}"
    );
}

/// `go tool pprof -top` of a heap profile's in-use bytes: (flat bytes, function) rows.
fn pprof_in_use_by_function(
    go: &Path,
    exe: &Path,
    profile: &Path,
    options: &[&str],
) -> Vec<(u64, String)> {
    let out = Command::new(go)
        .args(["tool", "pprof", "-top", "-nodecount=100", "-unit=B"])
        .arg("-sample_index=inuse_space")
        .args(options)
        .arg(exe)
        .arg(profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let bytes = cols.first()?.trim_end_matches('B').parse().ok()?;
            (cols.len() >= 6).then(|| (bytes, cols[5..].join(" ")))
        })
        .collect()
}

/// `sites` (built as `exe`) run until it is ready, then snapshotted into DIR/go.fsc: its
/// report, and its sites' bytes in use by function as pprof's -top sums them (flat: the
/// stack's first frame). `stats` and `profile`: where it writes its MemStats and heap
/// profile.
fn snapshot_of_sites(
    dir: &Path,
    exe: &Path,
    stats: &Path,
    profile: &Path,
) -> (
    Running,
    serde_json::Value,
    std::collections::HashMap<String, u64>,
) {
    let mut child = Command::new(exe)
        .arg(stats)
        .arg(profile)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let running = Running(child);
    let ready = out
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("ready"));
    assert!(ready, "sites never said it was ready");
    let trace = dir.join("go.fsc");
    snapshot(running.0.id(), &trace);
    let r = report_json(&trace);
    let mut ours: std::collections::HashMap<String, u64> = Default::default();
    for s in r["go_sites"]["sites"].as_array().unwrap() {
        let label = s["stack"][0].as_str().unwrap();
        let function = label.split(" (").next().unwrap().to_string();
        *ours.entry(function).or_default() += s["in_use_bytes"].as_u64().unwrap();
    }
    (running, r, ours)
}

/// A program stripped of its symbol table and DWARF still carries its function table,
/// which names its allocation sites: the same two functions keep its memory.
#[test]
fn a_stripped_go_programs_allocation_sites_are_named_by_its_function_table() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go_with(dir.path(), "sites", &["-ldflags=-s -w"]) else {
        return;
    };
    let (_running, _, ours) = snapshot_of_sites(
        dir.path(),
        &exe,
        &dir.path().join("memstats.json"),
        &dir.path().join("heap.pprof"),
    );
    let mut top: Vec<(u64, String)> = ours.into_iter().map(|(f, b)| (b, f)).collect();
    top.sort_unstable_by(|a, b| b.cmp(a));
    let mut names: Vec<&str> = top.iter().take(2).map(|t| t.1.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["main.buildIndex", "main.fillCache"], "{top:?}");
}

#[test]
fn the_go_allocation_sites_are_the_heap_profiles_and_name_who_keeps_sparse_spans() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go(dir.path(), "sites") else {
        return;
    };
    let (stats, profile) = (
        dir.path().join("memstats.json"),
        dir.path().join("heap.pprof"),
    );
    let (_running, r, ours) = snapshot_of_sites(dir.path(), &exe, &stats, &profile);
    let trace = dir.path().join("go.fsc");
    let sites = r["go_sites"]["sites"].as_array().unwrap();
    let theirs = pprof_in_use_by_function(&common::go().unwrap(), &exe, &profile, &[]);
    // The two that keep memory, in either order (sampling decides which looks larger).
    let top: Vec<&(u64, String)> = theirs.iter().filter(|r| r.0 > 0).take(2).collect();
    let mut names: Vec<&str> = top.iter().map(|r| r.1.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["main.buildIndex", "main.fillCache"], "{theirs:?}");
    for (bytes, function) in top {
        let mine = ours.get(function).copied().unwrap_or(0);
        within(function, mine, *bytes, 1.0);
    }
    // The index's survivors, one in ten, are what the sparse spans hold.
    let index = sites
        .iter()
        .find(|s| {
            s["stack"][0]
                .as_str()
                .unwrap()
                .starts_with("main.buildIndex")
        })
        .unwrap();
    assert!(
        index["sampled_in_sparse_spans"].as_u64().unwrap() > 0,
        "{index:#}"
    );
    assert!(
        r["go_sites"]["sampled_live"].as_u64().unwrap() > 10,
        "{:#}",
        r["go_sites"]
    );
    let text = common::report_text(&trace);
    assert!(text.contains("Go allocation sites"), "{text}");
    assert!(text.contains("main.buildIndex (main.go:"), "{text}");

    // The export carries them for pprof, labelled kind=go, and pprof reads them back.
    let pb = dir.path().join("go.pb.gz");
    let out = fragscope(&[
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "pprof".as_ref(),
        "-o".as_ref(),
        pb.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let exported =
        pprof_in_use_by_function(&common::go().unwrap(), &exe, &pb, &["-tagfocus=kind=go"]);
    for function in ["main.fillCache", "main.buildIndex"] {
        let bytes_of = |rows: &[(u64, String)]| rows.iter().find(|r| r.1 == function).map(|r| r.0);
        let mine = bytes_of(&exported).unwrap_or_else(|| panic!("{exported:?}"));
        within(function, mine, bytes_of(&theirs).unwrap(), 1.0);
    }
    // And as Parquet: a go_sites table, and the Go heap in the snapshots' parts.
    let tables = dir.path().join("go.parquet");
    let out = fragscope(&[
        "export".as_ref(),
        trace.as_os_str(),
        "--format".as_ref(),
        "parquet".as_ref(),
        "-o".as_ref(),
        tables.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let columns = |table: &str| -> (i64, Vec<String>) {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let file = std::fs::File::open(tables.join(table)).unwrap();
        let meta = SerializedFileReader::new(file).unwrap().metadata().clone();
        let schema = meta.file_metadata().schema_descr();
        let names = schema.columns().iter().map(|c| c.path().string()).collect();
        (meta.file_metadata().num_rows(), names)
    };
    let (rows, names) = columns("go_sites.parquet");
    assert_eq!(rows as usize, sites.len());
    assert!(names.iter().any(|n| n == "pinned_free_bytes"), "{names:?}");
    let (_, names) = columns("snapshots.parquet");
    assert!(names.iter().any(|n| n == "go_heap"), "{names:?}");
    assert!(names.iter().any(|n| n == "go_free_slots"), "{names:?}");

    // The page shows the same section.
    let Some(dom) = common::rendered_page(&trace, dir.path(), "go") else {
        return;
    };
    assert!(dom.contains("Go heap (go1."), "{dom}");
    assert!(dom.contains("main.fillCache (main.go:"), "{dom}");
    assert!(dom.contains("free slots in spans in use"), "{dom}");
}

#[test]
fn a_go_program_without_the_heap_profiler_says_why_it_has_no_sites() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go(dir.path(), "keep_tenth") else {
        return;
    };
    let (running, _) = keep_tenth(dir.path(), &exe);
    let trace = dir.path().join("go.fsc");
    snapshot(running.0.id(), &trace);
    let r = report_json(&trace);
    assert!(r["go_sites"].is_null(), "{:#}", r["go_sites"]);
    let note = r["go_sites_note"].as_str().unwrap();
    assert!(note.contains("linked without the heap profiler"), "{note}");
}

/// One HTTP/1.0 GET to 127.0.0.1:`port`: the response's body.
fn get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

/// tests/go/server started by `command` (the program itself, or fragscope recording it):
/// its port, once it listens.
fn start_server(mut command: Command) -> (Running, u16) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port = (line.strip_prefix("listening "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the server said {line:?}"));
    (Running(child), port)
}

/// Two clients putting sessions at once, `requests` requests in all.
fn load(port: u16, requests: usize) {
    let clients: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                (0..requests / 2).for_each(|_| drop(get(port, "/put?n=4000")))
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
}

#[test]
fn a_go_http_server_after_load_is_read_as_its_runtime_counts_it() {
    // The oldest release the census reads, the installed one, and the newest.
    for toolchain in ["go1.22.12", "local", "go1.27.3"] {
        go_http_server_after_load_is_read_as_its_runtime_counts_it(toolchain);
    }
}

fn go_http_server_after_load_is_read_as_its_runtime_counts_it(toolchain: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go_by(dir.path(), "server", &[], toolchain) else {
        return;
    };
    let (server, port) = start_server(Command::new(&exe));
    load(port, 150);
    // A quiet moment: the server collects and says what it holds.
    let m: serde_json::Value = serde_json::from_str(&get(port, "/stats")).unwrap();
    let trace = dir.path().join("server.fsc");
    snapshot(server.0.id(), &trace);
    // Still serving after the stop.
    assert!(get(port, "/put?n=1").trim().parse::<u64>().is_ok());
    let after: serde_json::Value = serde_json::from_str(&get(port, "/stats")).unwrap();
    let r = report_json(&trace);
    let go = &r["snapshots"][0]["go"];
    let field = |k: &str| go[k].as_u64().unwrap();
    let stat = |k: &str| m[k].as_u64().unwrap();
    let what = |figure: &str| format!("{toolchain} ({}): {figure}", go["go"]);
    within(
        &what("HeapAlloc"),
        field("heap_alloc"),
        stat("HeapAlloc"),
        2.0,
    );
    within(
        &what("HeapInuse"),
        field("heap_in_use"),
        stat("HeapInuse"),
        2.0,
    );
    // A goroutine may have taken or left a stack span (32 KiB) since its own reading:
    // the connection that asked for it ends.
    let stacks = field("stack_in_use").abs_diff(stat("StackInuse"));
    assert!(
        stacks <= (64 << 10).max(stat("StackInuse") / 50),
        "{}: {go:#} against {m:#}",
        what("StackInuse")
    );
    // Idle pages are what is left: what the program allocated since its own reading
    // came out of them, so they are held to 2% of the heap, not of themselves.
    assert!(
        field("heap_idle").abs_diff(stat("HeapIdle")) * 50 <= stat("HeapSys"),
        "{}: {go:#} against {m:#}",
        what("HeapIdle")
    );
    // Released pages are the idle ones not resident (the scavenger's, and those never
    // touched). The scavenger goes on giving pages back in the background, so the stop's
    // count is held between the runtime's readings before and after it, within 2% of the
    // heap (a CI run's scavenger gave back 1.5 MB between the first reading and the stop).
    let released = [&m, &after].map(|s| s["HeapReleased"].as_u64().unwrap());
    let slack = stat("HeapSys") / 50;
    let (low, high) = (
        released.iter().min().unwrap(),
        released.iter().max().unwrap(),
    );
    assert!(
        (low.saturating_sub(slack)..=high + slack).contains(&field("released")),
        "{}: {go:#} against {m:#} and after the stop {after:#}",
        what("HeapReleased")
    );
    assert_eq!(r["headline"]["heap"], "go", "{:#}", r["headline"]);
    // net/http/pprof is linked in: the sessions' stack holds most of the heap.
    let top = &r["go_sites"]["sites"][0];
    assert!(
        top["stack"][0].as_str().unwrap().starts_with("main.put"),
        "{}: {top:#}",
        what("the top site")
    );
}

#[test]
fn a_cgo_server_is_recorded_with_its_malloc_calls_and_its_go_heap() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go(dir.path(), "server") else {
        return;
    };
    let trace = dir.path().join("server.fsc");
    let mut record = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    record
        .args(["record", "--snapshot-ms", "200", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe);
    let (recorder, port) = start_server(record);
    load(port, 60);
    get(port, "/stats");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // The server ends on SIGTERM, passed on by the recorder.
    let pid = recorder.0.id() as libc::pid_t;
    // SAFETY: kill with a pid we started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut recorder = recorder;
    let status = recorder.0.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}");
    let r = report_json(&trace);
    // The C side's calls (the resolver, cgo's threads) are traced, and the Go heap read.
    assert!(r["calls"].as_u64().unwrap() > 0, "{}", r["calls"]);
    let censused = (r["snapshots"].as_array().unwrap().iter())
        .filter(|s| s["go"].is_object())
        .count();
    assert!(censused >= 2, "{censused}");
    assert_eq!(r["headline"]["heap"], "go", "{:#}", r["headline"]);
}

/// A cgo program's Go heap can hold objects that begin as glibc begins a chunk it mmaps
/// alone. Where glibc counts such chunks of its own, the census looks for them outside
/// the Go heap's ranges, finds exactly glibc's, and holds: a cgo server's snapshot was
/// refused over a "chunk" found in its Go heap.
#[test]
fn a_lookalike_chunk_in_a_go_heap_leaves_the_glibc_census_whole() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_go(dir.path(), "chunk_decoy") else {
        return;
    };
    let running = started_ready(Command::new(&exe));
    let trace = dir.path().join("decoy.fsc");
    snapshot(running.0.id(), &trace);
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["note"], serde_json::Value::Null, "{s:#}");
    assert_eq!(s["glibc"]["mmapped_chunks"], 1, "{s:#}");
    assert!(
        s["glibc"]["mmapped_bytes"].as_u64().unwrap() > 1 << 20,
        "{s:#}"
    );
    assert!(
        r["snapshots"][0]["go"].is_object(),
        "{:#}",
        r["snapshots"][0]
    );
}
