//! `fragscope record -p PID`: a process fragscope did not start is recorded from the
//! moment fragscope attaches, in order, and left running as it was.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use common::{report_json, Running, JEMALLOC};

fn attach(pid: u32, trace: &Path, extra: &[&str]) -> std::process::Output {
    let pid = pid.to_string();
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("record"),
        OsStr::new("-p"),
        OsStr::new(&pid),
        OsStr::new("-o"),
        trace.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    common::fragscope(&args)
}

/// Operations the program has made so far, and the bytes its table holds.
fn operations(p: &mut Running) -> (u64, u64) {
    p.send("count");
    let l = p.line();
    let mut f = l.trim().strip_prefix("ops ").unwrap().split(' ');
    let mut next = || f.next().unwrap().parse().unwrap();
    (next(), next())
}

/// Records the program (4 workers, `nap` µs between operations) for `seconds`, and checks
/// it runs on afterwards. Returns the trace's replayed calls and its report.
fn record_running_program(
    dir: &Path,
    preload: Option<&str>,
    nap: &str,
    seconds: &str,
) -> (common::StreamCalls, serde_json::Value) {
    let exe = common::build(dir, "attach_target", &["-pthread"]);
    let mut cmd = Command::new(&exe);
    cmd.args(["4", nap]);
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let mut p = Running::start(cmd);
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.join("live.fsc");
    let out = attach(p.pid(), &trace, &["--duration", seconds]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Left running, its calls back with its allocator: it goes on and ends as it would.
    let (before, _) = operations(&mut p);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        operations(&mut p).0 > before,
        "the program stopped after the detach"
    );
    p.send("quit");
    assert!(p.line().starts_with("done "));
    assert!(p.line().starts_with("live 4096 "));
    let info = common::info(&trace);
    assert_eq!(
        info["processes"][0]["end"], "left running (fragscope detached)",
        "{info}"
    );
    let mut calls = common::stream_calls(&trace);
    let r = report_json(&trace);
    assert_eq!(r["merge"]["attached"], true);
    (calls.remove(0), r)
}

#[test]
fn a_running_program_is_recorded_in_order_from_its_heap_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (c, r) = record_running_program(dir.path(), None, "0", "1");
    // Every call in order, and every free of a block that exists: the heap was read with
    // the process stopped, and its calls rebound before it ran again. A thread stopped
    // inside free finishes that call unrecorded: at most one block per thread was freed
    // before the first recorded call (the merge replaces it when its address comes back;
    // this replay counts it as allocated twice).
    // Calls in flight when the calls are put back at the detach may lose their
    // allocations' records (a few dozen at most in runs here); every other free is of a
    // block the trace knows.
    assert!(c.unknown_frees <= 64, "{c:#?}");
    assert_eq!(c.merge.forced_allocs + c.merge.late, 0, "{c:#?}");
    assert!(c.merge.starting_stale <= 5, "{c:#?}");
    assert!(c.live_twice <= c.merge.starting_stale, "{c:#?}");
    assert!(c.calls > 10_000, "{c:#?}");
    // The table's 4096 blocks and libc's own were there before.
    assert!(
        r["merge"]["starting_blocks"].as_u64().unwrap() >= 4096,
        "{}",
        r["merge"]
    );
    assert_eq!(r["merge"]["unknown_frees"], c.unknown_frees);
}

/// attach_target with 4 workers, each sleeping `nap_us` microseconds after an operation.
fn start_slow_target(dir: &Path, nap_us: &str) -> Running {
    let exe = common::build(dir, "attach_target", &["-pthread"]);
    let mut cmd = Command::new(&exe);
    cmd.args(["4", nap_us]);
    let mut p = Running::start(cmd);
    assert_eq!(p.line().trim(), "ready");
    p
}

#[test]
fn the_live_data_of_an_attached_program_holds_the_blocks_it_had_before() {
    // Workers so slow (50 ms between operations) that most of the table is still what it
    // was at the attach: without its starting heap the trace would hold a fifth of it.
    let dir = tempfile::tempdir().unwrap();
    let mut p = start_slow_target(dir.path(), "50000");
    let (before, _) = operations(&mut p);
    let trace = dir.path().join("slow.fsc");
    let out = attach(p.pid(), &trace, &["--duration", "1"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // What the table holds just after, and the operations since the count before that
    // the trace did not see: on a loaded machine seconds can pass around the attach and
    // the detach (a CI run counted 998 KB here, against 565 KB live at the detach, with
    // 5 ms between operations), and each operation changes the table by under 500 bytes.
    let (after, table) = operations(&mut p);
    p.send("quit");
    assert!(p.line().starts_with("done "));
    let c = common::stream_calls(&trace).remove(0);
    assert!(c.unknown_frees <= 64, "{c:#?}");
    assert!(c.calls < 5_000, "the workers were to be slow: {c:#?}");
    let unseen = after.saturating_sub(before + c.calls / 2);
    let r = report_json(&trace);
    let end = &r["snapshots"][r["end_snapshot"].as_u64().unwrap() as usize];
    let live = end["live"].as_u64().unwrap();
    // The table's blocks and libc's few own ones.
    assert!(
        live.abs_diff(table) < table / 8 + unseen * 500,
        "live {live} B at the detach, the table {table} B, {unseen} operations unseen: {end}"
    );
    // Text and HTML say where the recording began and what the heap held then.
    let text = common::fragscope(&[OsStr::new("report"), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.contains("attached to the running process; its heap then held"),
        "{text}"
    );
    if let Some(browser) = common::chromium() {
        let page = dir.path().join("slow.html");
        let out = common::fragscope(&[
            OsStr::new("report"),
            trace.as_os_str(),
            OsStr::new("--html"),
            page.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let dom = common::load_page(&browser, &page, &common::artefacts().join("attached.png"));
        assert!(
            dom.contains("Recorded from the moment fragscope attached to the running process; its heap then held"),
            "the attach note is missing from the page"
        );
    }
}

/// Each mapping of `pid` by its start: (path or "[anon]", anonymous KiB, resident KiB).
fn mappings(pid: u32) -> std::collections::BTreeMap<u64, (String, u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out = std::collections::BTreeMap::new();
    let mut current = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some((lo, _)) = fields.first().and_then(|f| f.split_once('-')) {
            if let Ok(start) = u64::from_str_radix(lo, 16) {
                let name = fields
                    .get(5)
                    .map_or("[anon]".to_string(), |n| n.to_string());
                out.insert(start, (name, 0, 0));
                current = Some(start);
                continue;
            }
        }
        let kib = || fields[1].parse::<u64>().unwrap();
        match (fields.first(), current) {
            (Some(&"Anonymous:"), Some(at)) => out.get_mut(&at).unwrap().1 = kib(),
            (Some(&"Rss:"), Some(at)) => out.get_mut(&at).unwrap().2 = kib(),
            _ => {}
        }
    }
    out
}

#[test]
fn after_the_detach_the_process_holds_only_what_fragscope_brought() {
    // Workers so slow (50 ms between operations) that the program's own heap barely
    // moves meanwhile: at 5 ms each worker's arena grew by about 60 KiB over the test,
    // and by four times that on a loaded machine, where the attach takes longer.
    let dir = tempfile::tempdir().unwrap();
    let mut p = start_slow_target(dir.path(), "50000");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = mappings(p.pid());
    let trace = dir.path().join("detached.fsc");
    let out = attach(p.pid(), &trace, &["--duration", "1"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let after = mappings(p.pid());
    // The program's own mappings: their anonymous memory as before (its heap, its
    // threads' stacks, which the hooks used a little).
    let grew: Vec<(String, u64)> = after
        .iter()
        .filter_map(|(at, (name, anon, _))| {
            let by = anon.saturating_sub(before.get(at)?.1);
            (by > 0).then(|| (format!("{at:x} {name}"), by))
        })
        .collect();
    let grown: u64 = grew.iter().map(|g| g.1).sum();
    assert!(
        grown <= 512,
        "the program's own mappings grew by {grown} KiB of anonymous memory: {grew:?}"
    );
    // The rest is what the attach brought: the interposer, the libraries it loads
    // (libunwind, libm, ...) and their memory, the clock page.
    let brought: Vec<&(String, u64, u64)> = after
        .iter()
        .filter(|(at, _)| !before.contains_key(at))
        .map(|(_, m)| m)
        .collect();
    let brought_rss: u64 = brought.iter().map(|m| m.2).sum();
    eprintln!("after the detach: own mappings +{grown} KiB anonymous, {brought_rss} KiB resident in mappings the attach made");
    assert!(
        brought.iter().any(|m| m.0.contains("libfragscope_preload")),
        "{brought:?}"
    );
    assert!(
        brought_rss <= 8 << 10,
        "the attach left {brought_rss} KiB resident: {brought:?}"
    );
    p.send("quit");
    assert!(p.line().starts_with("done "));
}

#[test]
fn a_running_program_on_jemalloc_is_recorded_in_order_without_its_earlier_heap() {
    if !Path::new(JEMALLOC).exists() {
        eprintln!("skipped: {JEMALLOC} is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (c, r) = record_running_program(dir.path(), Some(JEMALLOC), "0", "1");
    assert_eq!(c.live_twice, 0, "{c:#?}");
    assert_eq!(c.merge.forced_allocs + c.merge.late, 0, "{c:#?}");
    // jemalloc's blocks are not read: the frees of the table's blocks from before the
    // attach are the unknown ones, counted apart; so are, as under glibc above, the frees
    // of a block per thread whose malloc finished unrecorded at the attach, and of blocks
    // whose allocations were in flight when the calls were put back at the detach (4101
    // seen once; 4218 once on a loaded machine, where the program ran further between
    // the rebinding of its threads' call slots).
    assert!(
        c.unknown_frees >= 1000 && c.unknown_frees <= 4096 + 4 + 256,
        "{c:#?}"
    );
    assert!(r["merge"]["starting_blocks"].is_null());
}

#[test]
fn a_process_that_exits_while_recorded_ends_the_recording() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "attach_target", &["-pthread"]);
    let mut p = Running::start(Command::new(&exe));
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.path().join("exit.fsc");
    let pid = p.pid();
    let t = dir.path().to_path_buf();
    let recorder = std::thread::spawn(move || attach(pid, &t.join("exit.fsc"), &[]));
    std::thread::sleep(std::time::Duration::from_millis(700));
    p.send("quit");
    assert!(p.line().starts_with("done "));
    let out = recorder.join().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let info = common::info(&trace);
    let end = info["processes"][0]["end"].as_str().unwrap().to_string();
    assert!(end.starts_with("exited"), "{end}");
}

#[test]
fn attaching_to_no_process_is_a_clear_error_and_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("none.fsc");
    let out = attach(u32::MAX / 2, &trace, &[]);
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(err.contains("no process"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!trace.exists());
    // A flag that needs -p is refused with the reason.
    let out = common::fragscope(&[
        OsStr::new("record"),
        OsStr::new("--duration"),
        OsStr::new("1"),
        OsStr::new("--"),
        OsStr::new("true"),
    ]);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("--pid"),
        "{}",
        common::stderr(&out)
    );
}

#[test]
fn a_python_http_server_is_recorded_and_serves_on() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let Ok(python) = which_python() else {
        eprintln!("skipped: no python3");
        return;
    };
    // A free port, then the server on it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut server = std::process::Command::new(python)
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = || -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        Some(answer)
    };
    let started = std::time::Instant::now();
    while get().is_none() {
        assert!(started.elapsed().as_secs() < 20, "the server did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let trace = dir.path().join("http.fsc");
    let pid = server.id();
    let t = trace.clone();
    let recorder = std::thread::spawn(move || attach(pid, &t, &["--duration", "2"]));
    std::thread::sleep(std::time::Duration::from_millis(700));
    for _ in 0..30 {
        assert!(get().unwrap().starts_with("HTTP/1.0 200"));
    }
    let out = recorder.join().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Served on after the detach.
    assert!(get().unwrap().starts_with("HTTP/1.0 200"));
    let _ = server.kill();
    let _ = server.wait();
    let c = common::stream_calls(&trace).remove(0);
    assert!(c.calls > 100, "the requests' calls: {c:#?}");
    assert_eq!(c.merge.forced_allocs + c.merge.late, 0, "{c:#?}");
    let r = report_json(&trace);
    assert!(
        r["merge"]["starting_blocks"].as_u64().unwrap() > 1000,
        "{}",
        r["merge"]
    );
}

fn which_python() -> Result<std::path::PathBuf, ()> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .ok_or(())
}

#[test]
fn a_running_ghc_program_gets_its_block_census_diagnosis() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = common::build_ghc(dir.path(), &common::ghc_case("Conns"), "Conns", &[]) else {
        return;
    };
    // Seed 001's shape: 20 000 connections' pinned buffers, a few cells kept after they
    // close, then an idle plateau; attached to once they have closed.
    let mut program = std::process::Command::new(&exe)
        .args(["20000", "keep"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let trace = dir.path().join("conns.fsc");
    let out = attach(program.id(), &trace, &["--duration", "1.5"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Left to run to its end as it would.
    let status = program.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let text = common::fragscope(&[OsStr::new("report"), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("attached to the running program"), "{text}");
    assert!(text.contains("pinned blocks"), "{text}");
}

#[test]
fn another_users_process_is_refused_with_what_permission_is_missing() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped: it needs root and setpriv");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "attach_target", &["-pthread"]);
    let mut p = Running::start(Command::new(&exe));
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.path().join("never.fsc");
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-p", &p.pid().to_string(), "-o"])
        .arg(&trace)
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/proc/sys/kernel/yama/ptrace_scope") && err.contains("CAP_SYS_PTRACE"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!trace.exists());
    // Untouched: it runs on.
    let (before, _) = operations(&mut p);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(operations(&mut p).0 > before);
}

/// A real server on jemalloc (Debian's redis-server), recorded while clients write to
/// it: every call in order, and it serves on as before after the detach.
#[test]
fn redis_server_is_recorded_while_it_serves_and_answers_after() {
    let dir = tempfile::tempdir().unwrap();
    // A port of our own (the snapshot test's is 20000 + pid % 20000).
    let port = (40000 + std::process::id() % 20000).to_string();
    let Some((mut server, cli)) = common::start_redis(dir.path(), &port, &[]) else {
        return;
    };
    let trace = dir.path().join("redis.fsc");
    let pid = server.id();
    let t = trace.clone();
    let recorder = std::thread::spawn(move || attach(pid, &t, &["--duration", "2"]));
    std::thread::sleep(std::time::Duration::from_millis(600));
    for i in 0..200 {
        assert_eq!(cli(&["SET", &format!("key{i}"), &"v".repeat(300)]), "OK");
    }
    let out = recorder.join().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(cli(&["PING"]), "PONG");
    assert_eq!(cli(&["DBSIZE"]), "200");
    let _ = cli(&["SHUTDOWN", "NOSAVE"]);
    let _ = server.wait();
    let c = common::stream_calls(&trace).remove(0);
    // Each SET allocates (its key, value, dict entry, the client's buffers).
    assert!(c.calls > 1000, "{c:#?}");
    assert_eq!(
        c.merge.forced_allocs + c.merge.late + c.live_twice,
        0,
        "{c:#?}"
    );
    let info = common::info(&trace);
    assert_eq!(
        info["processes"][0]["end"],
        "left running (fragscope detached)"
    );
}

#[test]
fn ctrl_c_ends_the_recording_and_leaves_the_process_running() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "attach_target", &["-pthread"]);
    let mut p = Running::start(Command::new(&exe));
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.path().join("interrupted.fsc");
    let recorder = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-p", &p.pid().to_string(), "-o"])
        .arg(&trace)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    // SAFETY: kill with a pid we started.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let out = recorder.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let (before, _) = operations(&mut p);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(operations(&mut p).0 > before, "the program stopped");
    let info = common::info(&trace);
    assert_eq!(
        info["processes"][0]["end"],
        "left running (fragscope detached)"
    );
    assert!(info["events"].as_u64().unwrap() > 1000, "{info}");
}
