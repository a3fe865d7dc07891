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

/// Operations the program has made so far.
fn operations(p: &mut Running) -> u64 {
    p.send("count");
    let l = p.line();
    l.trim().strip_prefix("ops ").unwrap().parse().unwrap()
}

fn recorded_running_program(preload: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "attach_target", &["-pthread"]);
    let mut cmd = Command::new(&exe);
    cmd.arg("4");
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let mut p = Running::start(cmd);
    assert_eq!(p.line().trim(), "ready");
    let trace = dir.path().join("live.fsc");
    let out = attach(p.pid(), &trace, &["--duration", "1"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Left running, its calls back with its allocator: it goes on and ends as it would.
    let before = operations(&mut p);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        operations(&mut p) > before,
        "the program stopped after the detach"
    );
    p.send("quit");
    assert!(p.line().starts_with("done "));
    assert!(p.line().starts_with("live 4096 "));
    let info = common::info(&trace);
    let process = &info["processes"][0];
    assert_eq!(
        process["end"], "left running (fragscope detached)",
        "{info}"
    );
    let calls = common::stream_calls(&trace);
    let c = &calls[0];
    // Every call in order: no allocation of a live address, nothing late. The frees of
    // blocks allocated before the recording are the only unknown ones: the table's 4096
    // and what the workers allocated while their calls were being rebound (frees first).
    assert_eq!(c.live_twice, 0, "{c:#?}");
    assert_eq!(c.merge.forced_allocs, 0, "{c:#?}");
    assert_eq!(c.merge.late, 0, "{c:#?}");
    assert!(
        c.unknown_frees >= 1000 && c.unknown_frees <= 4096 + c.calls / 100,
        "{c:#?}"
    );
    assert!(c.calls > 10_000, "{c:#?}");
    let r = report_json(&trace);
    assert_eq!(r["merge"]["attached"], true);
    assert_eq!(r["merge"]["unknown_frees"], c.merge.unknown_frees);
}

#[test]
fn a_running_program_is_recorded_in_order_and_left_running_under_glibc() {
    recorded_running_program(None);
}

#[test]
fn a_running_program_is_recorded_in_order_and_left_running_under_jemalloc() {
    if !Path::new(JEMALLOC).exists() {
        eprintln!("skipped: {JEMALLOC} is missing");
        return;
    }
    recorded_running_program(Some(JEMALLOC));
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
