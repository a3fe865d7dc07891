//! Programs that change identity: privilege drops before an exec (setpriv, su, gosu), a
//! daemon that calls setuid and forks, set-user-ID programs, and other users' processes
//! knocking on the recorder's socket. Most need root (to become uid 65534, nobody) and
//! skip with a message without it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{build, fragscope, info, stream_calls, Allocator};
use fragscope_trace::Func;

const NOBODY: &str = "65534";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True (after saying why) when the test cannot run here.
fn skip_unless_root(test: &str) -> bool {
    if is_root() && which("setpriv") {
        return false;
    }
    eprintln!(
        "skipping {test}: needs root and setpriv (util-linux) to run programs as uid {NOBODY}"
    );
    true
}

fn which(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A temporary directory every user can enter and read (programs in it run as nobody).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn as_nobody() -> Vec<&'static str> {
    vec![
        "setpriv",
        "--reuid",
        NOBODY,
        "--regid",
        NOBODY,
        "--clear-groups",
    ]
}

fn record(trace: &Path, command: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    cmd.args(["record", "--stacks", "none", "-o"])
        .arg(trace)
        .arg("--")
        .args(command);
    Allocator::Glibc.apply(&mut cmd);
    cmd.output().unwrap()
}

fn processes(j: &serde_json::Value) -> &Vec<serde_json::Value> {
    j["processes"].as_array().unwrap()
}

#[test]
fn a_program_started_through_setpriv_as_another_user_is_recorded_with_all_its_calls() {
    if skip_unless_root("the setpriv test") {
        return;
    }
    let dir = open_dir();
    let exe = build(dir.path(), "cross_free_threads", &[]);
    let trace = dir.path().join("t.fsc");
    let (threads, rounds) = (4u64, 20_000u64);
    let mut command = as_nobody();
    let (t, r) = (threads.to_string(), rounds.to_string());
    command.extend([exe.to_str().unwrap(), &t, &r]);
    let out = record(&trace, &command);
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("cannot be preloaded"), "{stderr}");
    assert!(!stderr.contains("not traced"), "{stderr}");
    let j = info(&trace);
    let procs = processes(&j);
    // setpriv, then the program it exec'd as nobody.
    assert_eq!(procs.len(), 2, "{j:#}");
    assert_eq!(j["untraced"].as_array().unwrap().len(), 0, "{j:#}");
    let program = &procs[1];
    assert!(
        program["exe"]
            .as_str()
            .unwrap()
            .ends_with("cross_free_threads"),
        "{j:#}"
    );
    assert_eq!(program["exit_code"], 0, "{j:#}");
    assert!(program["rss_samples"].as_u64().unwrap() > 0, "{j:#}");
    let s = &stream_calls(&trace)[1];
    let blocks = threads * rounds;
    assert_eq!(s.allocated(Func::Malloc, 40), blocks, "{s:#?}");
    assert_eq!(s.freed(40), blocks, "{s:#?}");
    // The clock reached it (handed over by the recorder): its threads' calls are in
    // order, and its time runs.
    assert_eq!(s.disorder(), 0, "calls out of order: {s:#?}");
    assert!(j["duration_ms"].as_u64().unwrap() > 0, "{j:#}");
}

#[test]
fn a_daemon_that_drops_privileges_and_forks_has_its_worker_recorded() {
    if skip_unless_root("the setuid-then-fork test") {
        return;
    }
    let dir = open_dir();
    let exe = build(dir.path(), "drop_privileges", &[]);
    let trace = dir.path().join("t.fsc");
    let out = record(&trace, &[exe.to_str().unwrap(), NOBODY]);
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let j = info(&trace);
    let procs = processes(&j);
    assert_eq!(procs.len(), 2, "the daemon and its worker: {j:#}");
    assert_eq!(procs[1]["forked"], true, "{j:#}");
    assert_eq!(procs[1]["threads"], 5, "{j:#}");
    let calls = stream_calls(&trace);
    let daemon = &calls[0];
    daemon.assert_pairs(1001, 100, "the daemon as root");
    daemon.assert_pairs(1002, 200, "the daemon as nobody");
    let worker = &calls[1];
    worker.assert_pairs(1003, 4 * 300, "the worker's threads");
}

/// `wait_for_file` recorded in `dir` until the returned guard's drop; its pid and the
/// environment fragscope gave it.
struct Recording {
    recorder: std::process::Child,
    go: PathBuf,
    env: Vec<(String, String)>,
}

impl Recording {
    fn start(dir: &Path) -> Self {
        let exe = build(dir, "wait_for_file", &[]);
        let (pid_file, go) = (dir.join("pid"), dir.join("go"));
        let recorder = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["record", "--stacks", "none", "-o"])
            .arg(dir.join("t.fsc"))
            .arg("--")
            .arg(&exe)
            .arg(&pid_file)
            .arg(&go)
            .env_remove("LD_PRELOAD")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let pid = loop {
            if let Ok(p) = std::fs::read_to_string(&pid_file) {
                break p.trim().to_string();
            }
            assert!(
                started.elapsed().as_secs() < 30,
                "wait_for_file never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let env = environ
            .split(|&b| b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                (k.starts_with("FRAGSCOPE_") || k == "LD_PRELOAD").then(|| (k.into(), v.into()))
            })
            .collect();
        Recording { recorder, go, env }
    }

    fn finish(self) -> std::process::Output {
        std::fs::write(&self.go, b"").unwrap();
        self.recorder.wait_with_output().unwrap()
    }
}

#[test]
fn another_users_processes_cannot_add_to_the_trace_nor_hold_up_the_recorder() {
    if skip_unless_root("the intruder test") {
        return;
    }
    let dir = open_dir();
    let intruder = build(dir.path(), "fork_exit", &[]);
    let rec = Recording::start(dir.path());
    let sock = rec
        .env
        .iter()
        .find(|(k, _)| k == "FRAGSCOPE_SOCK")
        .map(|(_, v)| v.clone())
        .unwrap();
    // A program of another user, outside the recorded tree, with fragscope's interposer
    // and every variable of the recording, its token included: everything but ancestry.
    let mut cmd = Command::new("setpriv");
    cmd.args(&as_nobody()[1..])
        .arg("env")
        .args(rec.env.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(&intruder)
        .arg("0")
        .env_remove("LD_PRELOAD");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    // And a flood of connections that each send a HELLO with the token.
    let knock = build(dir.path(), "knock", &[]);
    let token = rec
        .env
        .iter()
        .find(|(k, _)| k == "FRAGSCOPE_TOKEN")
        .map(|(_, v)| v.clone())
        .unwrap();
    let out = Command::new("setpriv")
        .args(&as_nobody()[1..])
        .arg(&knock)
        .args([&sock, &token, "500"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let out = rec.finish();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    let trace = dir.path().join("t.fsc");
    let j = info(&trace);
    let procs = processes(&j);
    assert_eq!(procs.len(), 1, "only the recorded program: {j:#}");
    assert!(procs[0]["exe"].as_str().unwrap().ends_with("wait_for_file"));
    let calls = &stream_calls(&trace)[0];
    assert_eq!(calls.allocated(Func::Malloc, 777), 0, "{calls:#?}");
    assert!(calls.allocated(Func::Malloc, 901) > 0, "{calls:#?}");
    assert_eq!(calls.disorder(), 0, "{calls:#?}");
}

/// A copy of tests/c/fork_exit.c owned by nobody with `mode` (set-user-ID, ...).
fn privileged_copy(dir: &Path, name: &str, mode: u32) -> PathBuf {
    let exe = build(dir, "fork_exit", &[]);
    let copy = dir.join(name);
    std::fs::copy(&exe, &copy).unwrap();
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(mode)).unwrap();
    copy
}

fn refused(trace: &Path, command: &[&std::ffi::OsStr]) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "record".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
    ];
    args.extend(command);
    let out = fragscope(&args);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!trace.exists(), "no empty trace is left behind");
    err
}

#[test]
fn set_user_id_and_set_group_id_programs_are_refused_with_the_reason_and_the_way_out() {
    if skip_unless_root("the set-user-ID test") {
        return;
    }
    let dir = open_dir();
    let trace = dir.path().join("t.fsc");
    let setuid = privileged_copy(dir.path(), "setuid_prog", 0o4755);
    let err = refused(&trace, &[setuid.as_os_str()]);
    assert!(err.contains("set-user-ID"), "{err}");
    assert!(err.contains("LD_PRELOAD"), "{err}");
    assert!(err.contains("a copy without the bit"), "{err}");
    let setgid = privileged_copy(dir.path(), "setgid_prog", 0o2755);
    let err = refused(&trace, &[setgid.as_os_str()]);
    assert!(err.contains("set-group-ID"), "{err}");
    // A set-user-ID program of the recording user gains nothing: it is traced.
    let own = privileged_copy(dir.path(), "own_setuid_prog", 0o755);
    std::os::unix::fs::chown(&own, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let out = record(&trace, &[own.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(processes(&info(&trace)).len(), 2);
}

#[test]
fn a_program_with_file_capabilities_is_refused_for_a_user_without_them() {
    if skip_unless_root("the file-capability test") {
        return;
    }
    if !which("setcap") {
        eprintln!("skipping the file-capability test: setcap (libcap2-bin) is not installed");
        return;
    }
    let dir = open_dir();
    let prog = privileged_copy(dir.path(), "cap_prog", 0o755);
    let ok = Command::new("setcap")
        .args(["cap_net_bind_service+ep"])
        .arg(&prog)
        .status()
        .unwrap()
        .success();
    if !ok {
        eprintln!("skipping the file-capability test: this file system takes no capabilities");
        return;
    }
    // fragscope run as nobody, who lacks the capability.
    let trace = dir.path().join("t.fsc");
    let out = Command::new("setpriv")
        .args(&as_nobody()[1..])
        .arg(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("file capabilities"), "{err}");
}

#[test]
fn an_image_that_cannot_be_traced_is_named_with_the_reason_when_recording_and_in_the_trace() {
    if skip_unless_root("the untraced-image test") {
        return;
    }
    let dir = open_dir();
    let setuid = privileged_copy(dir.path(), "setuid_prog", 0o4755);
    let static_exe = build(dir.path(), "fork_exit", &["-static"]);
    let spawner = build(dir.path(), "run_spawned", &[]);
    let trace = dir.path().join("t.fsc");
    // Exec'd by the shell's vfork children, then posix_spawn'd by a traced program.
    let script = format!(
        "{setuid} 0; {} 0; {} {setuid} 0; exit 0",
        static_exe.display(),
        spawner.display(),
        setuid = setuid.display(),
    );
    let out = record(&trace, &["sh", "-c", &script]);
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("was not traced"), "{stderr}");
    assert!(stderr.contains("set-user-ID"), "{stderr}");
    assert!(stderr.contains("statically linked"), "{stderr}");
    let j = info(&trace);
    let untraced = j["untraced"].as_array().unwrap();
    assert_eq!(untraced.len(), 3, "{j:#}");
    let field = |i: usize, key: &str| untraced[i][key].as_str().unwrap().to_string();
    assert!(field(0, "path").ends_with("setuid_prog"), "{j:#}");
    assert!(field(0, "reason").contains("set-user-ID"), "{j:#}");
    assert!(field(1, "reason").contains("statically linked"), "{j:#}");
    assert!(field(2, "reason").contains("set-user-ID"), "{j:#}");
    // The spawned one is named with its spawner's stream.
    let spawner_stream = processes(&j)
        .iter()
        .find(|p| p["exe"].as_str().unwrap().ends_with("run_spawned"))
        .map(|p| p["stream"].clone())
        .unwrap();
    assert_eq!(untraced[2]["parent_stream"], spawner_stream, "{j:#}");
    // Each is a process of its own (the shell's vfork children): the shell went on.
    let shell = &processes(&j)[0];
    assert!(untraced.iter().all(|u| u["pid"] != shell["pid"]), "{j:#}");
    assert_eq!(shell["exit_code"], 0, "{j:#}");
    let text = fragscope(&["info".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("not traced"), "{text}");
    let report = fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("Not traced"), "{text}");
    assert!(text.contains("setuid_prog"), "{text}");
    let report = fragscope(&["report".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    let r: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(r["untraced"].as_array().unwrap().len(), 3, "{r:#}");
}

#[test]
fn a_program_that_never_connects_is_named_and_report_says_why_instead_of_blaming_a_cut_trace() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exit", &[]);
    let trace = dir.path().join("t.fsc");
    let missing = dir.path().join("no-such-interposer.so");
    let mut cmd = common::record_command(Allocator::Glibc, &trace, &[], &exe, &["0"]);
    let out = cmd.env("FRAGSCOPE_PRELOAD", &missing).output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("was not traced"), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    let j = info(&trace);
    assert_eq!(processes(&j).len(), 0, "{j:#}");
    assert_eq!(j["truncated"], false, "{j:#}");
    let untraced = j["untraced"].as_array().unwrap();
    assert_eq!(untraced.len(), 1, "{j:#}");
    assert_eq!(
        untraced[0]["parent_stream"],
        serde_json::Value::Null,
        "{j:#}"
    );
    let report = fragscope(&["report".as_ref(), trace.as_os_str()]);
    let err = common::stderr(&report);
    assert_eq!(report.status.code(), Some(2), "{err}");
    assert!(err.contains("could be traced"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!err.contains("cut before"), "{err}");
}
