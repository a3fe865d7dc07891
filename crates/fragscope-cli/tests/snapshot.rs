//! `fragscope snapshot PID`: a census of a process fragscope did not start, checked
//! against the process's own view of its heap, and the process left running as before.

mod common;

use common::{report_json, Running};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The `key=value` fields of a `mallinfo2 ...` line.
fn mallinfo(line: &str) -> std::collections::HashMap<String, u64> {
    assert!(line.starts_with("mallinfo2 "), "{line}");
    line.split_whitespace()
        .skip(1)
        .filter_map(|f| {
            let (k, v) = f.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn snapshot(pid: u32, trace: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .arg("snapshot")
        .arg(pid.to_string())
        .arg("-o")
        .arg(trace)
        .args(extra)
        .output()
        .unwrap()
}

/// Whether glibc `release` ("2.41") has fastbins: 2.43 removed them.
fn release_has_fastbins(release: &str) -> bool {
    let mut parts = release.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap()) < (2, 43)
}

fn within(ours: u64, theirs: u64, share: f64) -> bool {
    (ours as f64 - theirs as f64).abs() <= share * theirs.max(1) as f64
}

fn helper(dir: &Path) -> PathBuf {
    common::build(dir, "glibc_heap", &["-pthread"])
}

/// The helper running with `args`, and the mallinfo2 it printed once its heap was built.
fn start_helper(dir: &Path, args: &[&str]) -> (Running, std::collections::HashMap<String, u64>) {
    let mut cmd = Command::new(helper(dir));
    cmd.args(args);
    let mut p = Running::start(cmd);
    let before = mallinfo(&p.line());
    (p, before)
}

#[test]
fn glibc_census_agrees_with_mallinfo_and_the_process_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut p, before) = start_helper(dir.path(), &[]);
    // Read from a copy made by fork, then from the process held stopped: the same heap.
    // (In this order: reading the process itself maps the zero page at heap pages it never
    // touched, which pagemap then shows present; reading the copy leaves the process's
    // page tables as they were.)
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &["--fork-copy", "always"]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("was stopped for")
            && (err.contains("ms per GiB") || err.contains("(its heap: "))
            && err.contains("its heap was read from a copy made by fork"),
        "{err}"
    );
    let stopped = dir.path().join("stopped.fsc");
    let out = snapshot(p.pid(), &stopped, &["--fork-copy", "never"]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("copy made by fork"), "{err}");
    // The copy is gone and reaped, and the process was told nothing of it.
    let children: String = std::fs::read_dir(format!("/proc/{}/task", p.pid()))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("children")).unwrap())
        .collect();
    assert_eq!(children.trim(), "", "the process has children left");
    p.send("sigchld");
    assert_eq!(p.line().trim(), "sigchld 0");
    assert_eq!(
        report_json(&stopped)["snapshot"]["glibc"],
        report_json(&trace)["snapshot"]["glibc"]
    );

    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], "glibc", "{s}");
    assert_eq!(s["stopped"], true);
    let g = &s["glibc"];
    let n = |v: &Value| v.as_u64().unwrap();
    // glibc's own view: in use = uordblks + hblkhd, free = fordblks.
    let their_in_use = before["uordblks"] + before["hblkhd"];
    assert!(
        within(n(&g["mallinfo_in_use"]), their_in_use, 0.05),
        "in use: census {} vs mallinfo2 {their_in_use}",
        g["mallinfo_in_use"]
    );
    assert!(
        within(n(&g["mallinfo_free"]), before["fordblks"], 0.05),
        "free: census {} vs mallinfo2 {}",
        g["mallinfo_free"],
        before["fordblks"]
    );
    // The helper's threads are blocked: nothing moved between mallinfo2 and the census,
    // which then agree to the byte.
    assert_eq!(n(&g["mallinfo_in_use"]), their_in_use, "{g}");
    assert_eq!(n(&g["mallinfo_free"]), before["fordblks"], "{g}");
    assert_eq!(n(&g["mmapped_chunks"]), before["hblks"], "{g}");
    assert_eq!(n(&g["mmapped_bytes"]), before["hblkhd"], "{g}");
    // The main arena and one per thread, each thread's cache found and counted free.
    let arenas = g["arenas"].as_array().unwrap();
    assert_eq!(arenas.len(), 4, "{g}");
    assert_eq!(n(&g["thread_caches"]), 4, "{g}");
    assert!(n(&g["tcache_chunks"]) > 0, "{g}");
    // The fastbins as glibc counts them: some, in a release that has them (2.43 removed
    // them, and its mallinfo2 says none).
    assert_eq!(n(&g["fastbin_chunks"]), before["smblks"], "{g}");
    assert_eq!(n(&g["fastbin_bytes"]), before["fsmblks"], "{g}");
    assert_eq!(
        before["smblks"] > 0,
        release_has_fastbins(g["version"].as_str().unwrap()),
        "{g}"
    );
    // Live bytes (what the program can use of its chunks, on resident pages or not) are
    // the census's, not 0; the chunks' headers are the allocator's.
    let snap = &r["snapshots"][0];
    let live = n(&snap["live"]) + n(&snap["live_not_resident"]);
    assert_eq!(live, n(&g["usable_bytes"]), "{snap}");
    // What the program can use: each arena chunk less its 8-byte size field; of the
    // mmapped chunks (the helper's 4 big blocks, and only those), what malloc_usable_size
    // gives, against their mappings (16 bytes less each up to glibc 2.42, 24 from 2.43).
    assert_eq!(before["hblks"], 4, "{before:?}");
    let arena_chunks = n(&g["in_use_chunks"]) - n(&g["mmapped_chunks"]);
    assert_eq!(
        n(&g["usable_bytes"]),
        n(&g["in_use_bytes"]) - 8 * arena_chunks - (before["hblkhd"] - before["big_usable"]),
        "{g}"
    );
    assert!(n(&snap["allocator_overhead"]) > 0, "{snap}");
    assert!(n(&snap["free_in_used_pages"]) > n(&snap["live"]), "{snap}");
    assert!(r["sites"]["by_live_bytes"].as_array().unwrap().is_empty());
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("a snapshot has no history"), "{text}");
    assert!(text.contains("malloc_trim(0) would"), "{text}");
    // The HTML page carries the census too; compare and export read the trace.
    let html = dir.path().join("snap.html");
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--html".as_ref(),
        html.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("\"mallinfo_in_use\":"),
        "no census in the page"
    );
    let exported = dir.path().join("e.json");
    for args in [
        vec!["compare".as_ref(), trace.as_os_str(), trace.as_os_str()],
        vec![
            "export".as_ref(),
            trace.as_os_str(),
            "--format".as_ref(),
            "json".as_ref(),
            "-o".as_ref(),
            exported.as_os_str(),
        ],
    ] {
        let out = common::fragscope(&args);
        assert!(out.status.success(), "{args:?}: {}", common::stderr(&out));
    }

    // The process goes on, its heap as it was.
    p.send("again");
    assert_eq!(mallinfo(&p.line()), before);
    // What malloc_trim gives back is what the census predicted (the RSS it drops).
    p.send("trim");
    let trimmed = p.line();
    let kib: Vec<u64> = trimmed
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let dropped = (kib[0] - kib[1]) * 1024;
    let predicted = n(&g["trimmable_bytes"]);
    assert!(predicted > 0, "{g}");
    assert!(
        within(predicted, dropped, 0.25),
        "malloc_trim dropped RSS by {dropped} bytes, the census predicted {predicted}"
    );
}

/// The parts of a snapshot's decomposition that add up to RSS.
const PARTS: [&str; 11] = [
    "live",
    "rounding",
    "allocator_overhead",
    "free_in_used_pages",
    "free_resident_pages",
    "lazy_free",
    "pymalloc_arenas",
    "sbcl_dynamic_space",
    "other_anon",
    "file",
    "fragscope_own",
];

fn assert_adds_up(s: &Value) {
    let sum: i64 = PARTS.iter().map(|k| s[k].as_i64().unwrap()).sum::<i64>()
        + s["unexplained"].as_i64().unwrap();
    assert_eq!(sum, s["rss"].as_i64().unwrap(), "{s}");
}

/// tests/c/usable_sum.c, recorded, and snapshotted while it idles: the snapshot's live
/// bytes are the program's own sum of malloc_usable_size, the recording's live +
/// rounding the same bytes, and glibc's chunk headers are the allocator's overhead in
/// both.
/// A main arena whose brk heap could not grow (a mapping sits at the break, as other
/// mappings crowd a Node process's): glibc extends it with mappings of its own, each
/// ending in fenceposts, and keeps no list of them. The census finds every one, from a
/// copy and from the process held stopped, and agrees with mallinfo2 to the byte.
#[test]
fn a_main_arena_that_grew_by_mmap_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (mut p, before) = start_helper(dir.path(), &["noncontiguous"]);
    let n = |v: &Value| v.as_u64().unwrap();
    let mut seen = Vec::new();
    for fork_copy in ["always", "never"] {
        let trace = dir.path().join(format!("{fork_copy}.fsc"));
        let out = snapshot(p.pid(), &trace, &["--fork-copy", fork_copy]);
        let err = common::stderr(&out);
        assert!(out.status.success() && !err.contains("note:"), "{err}");
        let r = report_json(&trace);
        let g = r["snapshot"]["glibc"].clone();
        assert_eq!(
            n(&g["mallinfo_in_use"]),
            before["uordblks"] + before["hblkhd"],
            "{g}"
        );
        assert_eq!(n(&g["mallinfo_free"]), before["fordblks"], "{g}");
        assert_eq!(n(&g["mmapped_chunks"]), before["hblks"], "{g}");
        assert_eq!(n(&g["mmapped_bytes"]), before["hblkhd"], "{g}");
        let main = &g["arenas"][0];
        assert!(
            main["main"].as_bool().unwrap() && n(&main["heaps"]) > 10,
            "{main}"
        );
        let snap = &r["snapshots"][0];
        assert!(
            n(&snap["other_anon"]) < n(&snap["rss"]) / 10,
            "the segments' pages are the heap's: {snap}"
        );
        seen.push(g);
    }
    assert_eq!(seen[0], seen[1]);
    p.send("");
    assert!(p.line().starts_with("mallinfo2 "), "the process runs on");
}

#[test]
fn snapshot_and_recording_of_one_program_agree_on_live_bytes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "usable_sum", &[]);
    let recording = dir.path().join("recorded.fsc");
    let mut record = common::record_command(
        common::Allocator::Glibc,
        &recording,
        &["--snapshot-ms", "100"],
        &exe,
        &[],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(record.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    let (usable, blocks, pid) = (field("usable"), field("blocks"), field("pid"));
    // A few periodic snapshots of the idle program, then one from outside.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let snapped = dir.path().join("snapped.fsc");
    let out = snapshot(pid as u32, &snapped, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    drop(record.stdin.take());
    let out = record.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));

    let n = |v: &Value| v.as_u64().unwrap();
    let s = report_json(&snapped);
    let g = &s["snapshot"]["glibc"];
    let snap = &s["snapshots"][0];
    assert_adds_up(snap);
    // The census: exactly what the program holds, as malloc_usable_size counts it.
    assert!(within(n(&g["usable_bytes"]), usable, 0.01), "{g} vs {line}");
    assert!(within(n(&snap["live"]), usable, 0.01), "{snap} vs {line}");
    assert_eq!(n(&snap["rounding"]), 0);
    let r = report_json(&recording);
    // The last snapshot that saw every block resident: on a loaded machine the last
    // periodic one can come while the program still fills its big blocks (then
    // `live_not_resident`), and the exit's comes after it has filled them all.
    let idle = r["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|x| x["live_not_resident"] == 0)
        .unwrap_or_else(|| panic!("no snapshot saw every block resident: {r}"));
    assert_adds_up(idle);
    let recorded = n(&idle["live"]) + n(&idle["rounding"]);
    assert!(within(recorded, usable, 0.01), "{idle} vs {line}");
    assert!(within(n(&snap["live"]), recorded, 0.01), "{snap} vs {idle}");
    // The headers: 8 bytes a chunk (16 for the few mmapped), plus, in the census, the
    // allocator's tables.
    for (what, d) in [("snapshot", snap), ("recording", idle)] {
        let overhead = n(&d["allocator_overhead"]);
        assert!(
            overhead >= 8 * blocks && overhead <= 8 * blocks + (64 << 10),
            "{what}: {overhead} bytes of overhead for {blocks} blocks: {d}"
        );
    }
    assert!(
        within(
            n(&snap["allocator_overhead"]),
            n(&idle["allocator_overhead"]),
            0.01
        ),
        "{snap} vs {idle}"
    );
    // Named in the text, the HTML page and compare.
    let text = common::fragscope(&["report".as_ref(), snapped.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("allocator overhead"), "{text}");
    let html = dir.path().join("snapped.html");
    let out = common::fragscope(&[
        "report".as_ref(),
        snapped.as_os_str(),
        "--html".as_ref(),
        html.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("\"allocator_overhead\""), "not in the page");
    let out = common::fragscope(&[
        "compare".as_ref(),
        snapped.as_os_str(),
        recording.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("allocator overhead"), "{text}");
}

#[test]
fn a_process_under_seccomp_is_read_stopped_rather_than_forked() {
    let dir = tempfile::tempdir().unwrap();
    let (mut p, before) = start_helper(dir.path(), &["seccomp"]);
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &["--fork-copy", "always"]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("copy made by fork") && err.contains("seccomp filter"),
        "{err}"
    );
    let g = &report_json(&trace)["snapshot"]["glibc"];
    assert_eq!(
        g["mallinfo_in_use"].as_u64().unwrap(),
        before["uordblks"] + before["hblkhd"],
        "{g}"
    );
    p.send("again");
    assert_eq!(mallinfo(&p.line()), before);
}

#[test]
fn without_debug_symbols_the_arena_is_found_by_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let exe = helper(dir.path());
    let mut p = Running::start(Command::new(&exe));
    let before = mallinfo(&p.line());
    let trace = dir.path().join("snap.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .env("FRAGSCOPE_DEBUG_DIR", dir.path())
        .args(["snapshot", &p.pid().to_string(), "-o"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let g = &report_json(&trace)["snapshot"]["glibc"];
    assert!(g["layout_source"].as_str().unwrap().contains("scan"), "{g}");
    let their_in_use = before["uordblks"] + before["hblkhd"];
    assert!(
        within(g["mallinfo_in_use"].as_u64().unwrap(), their_in_use, 0.05),
        "{g}"
    );
    assert!(
        within(
            g["mallinfo_free"].as_u64().unwrap(),
            before["fordblks"],
            0.05
        ),
        "{g}"
    );
}

#[test]
fn no_stop_reads_a_running_process_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let exe = helper(dir.path());
    let mut p = Running::start(Command::new(&exe));
    let _ = p.line();
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &["--no-stop"]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("without stopping") && err.contains("may not hold together"),
        "{err}"
    );
    let r = report_json(&trace);
    assert_eq!(r["snapshot"]["stopped"], false);
    // An idle process: the census holds together even so.
    assert!(r["snapshot"]["glibc"].is_object(), "{}", r["snapshot"]);
}

/// Debian's mimalloc (2.0.9, stripped to its exported names) is not read: its release is
/// not one whose layout is verified (the census reads 2.3.2), which the note names.
#[test]
fn another_allocator_gets_the_page_level_picture_and_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let exe = helper(dir.path());
    let mut cmd = Command::new(&exe);
    let mimalloc = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
    assert!(
        std::path::Path::new(mimalloc).exists(),
        "{mimalloc} is missing: install Debian's libmimalloc-dev"
    );
    cmd.env("LD_PRELOAD", mimalloc);
    let mut p = Running::start(cmd);
    let _ = p.line();
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], "mimalloc", "{s}");
    assert!(s["glibc"].is_null());
    let note = s["note"].as_str().unwrap();
    assert!(note.contains("mimalloc 2.0.9"), "{s}");
    assert!(note.contains("not verified"), "{s}");
    let snap = &r["snapshots"][0];
    // No live bytes claimed: the malloc heap's parts are unknown (null, not 0), and so is
    // peak live; the resident heap pages are there, as other anonymous.
    for part in [
        "live",
        "rounding",
        "allocator_overhead",
        "free_in_used_pages",
        "free_resident_pages",
    ] {
        assert!(snap[part].is_null(), "{part}: {snap}");
    }
    assert_eq!(
        snap["missing_census"],
        serde_json::json!(["malloc"]),
        "{snap}"
    );
    assert!(r["headline"]["peak_live"].is_null(), "{}", r["headline"]);
    let text = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("peak live – (the heap was not read)"),
        "{text}"
    );
    let live_row = text
        .lines()
        .find(|l| l.trim_start().starts_with("live "))
        .unwrap();
    assert!(
        live_row.contains('–') && !live_row.contains(" 0 B"),
        "{live_row}"
    );
    assert!(snap["heap_resident"].as_u64().unwrap() > 32 << 20, "{snap}");
    assert!(snap["other_anon"].as_u64().unwrap() > 32 << 20, "{snap}");
    assert!(r["headline"]["sentence"]
        .as_str()
        .unwrap()
        .contains("without the allocator's figures"));
    p.send("again");
    assert!(p.line().starts_with("mallinfo2"));
}

#[test]
fn refusals_are_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    // A process that does not exist (one that has exited and been reaped).
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let out = snapshot(pid, &dir.path().join("a.fsc"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::stderr(&out).contains(&format!("no process {pid}")),
        "{}",
        common::stderr(&out)
    );
    assert!(!dir.path().join("a.fsc").exists());
    // One that has exited and not been reaped yet (a zombie): no memory left to read.
    let mut zombie = Command::new("true").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = snapshot(zombie.id(), &dir.path().join("z.fsc"), &[]);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("has exited") && !err.contains("panicked"),
        "{err}"
    );
    zombie.wait().unwrap();

    // Another user may not read a root process's memory.
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped the permission check: it needs root and setpriv");
        return;
    }
    let mut p = Running::start(Command::new("cat"));
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_fragscope"))
        .args([
            "snapshot",
            &p.pid().to_string(),
            "-o",
            "/tmp/never-written.fsc",
        ])
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/proc/sys/kernel/yama/ptrace_scope") && err.contains("CAP_SYS_PTRACE"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // cat was never stopped: it still echoes.
    p.send("hello");
    assert_eq!(p.line(), "hello\n");
}

#[test]
fn ghc_program_gets_its_block_census() {
    let dir = tempfile::tempdir().unwrap();
    // Without -eventlog: a server built as most are.
    let Some(exe) = common::build_ghc(dir.path(), &common::ghc_case("Conns"), "Conns", &[]) else {
        return;
    };
    let mut cmd = Command::new(&exe);
    cmd.args(["20000", "keep"]);
    let mut p = Running::start(cmd);
    assert!(p.line().starts_with("open:"));
    // After the close the program idles for 3 s: the plateau a snapshot explains.
    assert!(p.line().starts_with("closed:"));
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &[]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("(ghc) was stopped for"), "{err}");
    let r = report_json(&trace);
    let censuses = r["block_censuses"].as_array().unwrap();
    assert_eq!(censuses.len(), 1, "{r}");
    // 1 in 100 connections keeps a slice of its pinned buffer: megablocks stay, sparse.
    assert!(
        censuses[0]["sparse_megablocks"].as_u64().unwrap() > 20 << 20,
        "{}",
        censuses[0]
    );
    assert!(r["notes"][0]
        .as_str()
        .unwrap()
        .contains("a snapshot of a running program"));
    // It finishes as it would have.
    assert!(p.line().trim().parse::<u64>().is_ok());
}

/// A real server on jemalloc (Debian's redis-server): the page-level picture holds its
/// data, and it answers after the snapshot as before.
#[test]
fn redis_server_on_jemalloc_answers_after_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    // A port of our own: from the test's pid, above the usual ones.
    let port = (20000 + std::process::id() % 20000).to_string();
    let Some((mut server, cli)) =
        common::start_redis(dir.path(), &port, &["--enable-debug-command", "yes"])
    else {
        return;
    };
    assert_eq!(cli(&["DEBUG", "POPULATE", "200000", "key", "500"]), "OK");
    let info = cli(&["INFO", "memory"]);
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let used = field("used_memory:");
    // jemalloc's stats.resident: the pages of its own mappings that are resident.
    let allocator_resident = field("allocator_resident:");
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(server.id(), &trace, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r = report_json(&trace);
    assert_eq!(r["snapshot"]["allocator"], "jemalloc", "{}", r["snapshot"]);
    let snap = &r["snapshots"][0];
    // jemalloc's resident pages hold what redis counts as used (its own allocations).
    let resident = snap["heap_resident"].as_u64().unwrap();
    assert!(
        resident >= used * 9 / 10,
        "heap resident {resident}, used_memory {used}"
    );
    assert!(snap["rss"].as_u64().unwrap() >= used);
    assert!(
        within(resident, allocator_resident, 0.05),
        "heap resident {resident}, jemalloc's allocator_resident {allocator_resident}"
    );
    let err = common::stderr(&out);
    // The heap it speaks of is the resident heap it read, not nothing.
    assert!(
        !err.contains("(its heap: 0 B)") && err.contains("was stopped for"),
        "{err}"
    );
    assert_eq!(cli(&["PING"]), "PONG");
    assert_eq!(cli(&["DBSIZE"]), "200000");
    let _ = cli(&["SHUTDOWN", "NOSAVE"]);
    let _ = server.wait();
}

/// Memory a program or a runtime maps itself (a Go heap beside a cgo program's glibc
/// heap) can begin as glibc begins a chunk it mmaps alone. Where glibc counts no such
/// chunk, none is looked for, and the census holds: a cgo server's snapshot was refused
/// over a "chunk" of 7.5 MiB found in its Go heap.
#[test]
fn memory_that_looks_like_an_mmapped_chunk_leaves_the_glibc_census_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Running::start(Command::new(common::build(dir.path(), "chunk_decoy", &[])));
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.path().join("snap.fsc");
    let out = snapshot(p.pid(), &trace, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let s = &report_json(&trace)["snapshot"];
    assert_eq!(s["note"], Value::Null, "{s:#}");
    assert_eq!(s["glibc"]["mmapped_chunks"], 0, "{s:#}");
    assert!(
        s["glibc"]["mallinfo_in_use"].as_u64().unwrap() >= 64 * 100,
        "{s:#}"
    );
}
