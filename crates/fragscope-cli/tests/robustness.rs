//! Recording real programs must never break them: exit statuses pass through, forked
//! children are their own processes with exact counts, static binaries are refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn build(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}.c"));
    let exe = dir.join(format!("{name}{}", extra.join("")));
    let ok = Command::new("cc")
        .args(["-O1", "-pthread"])
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success(), "cc failed on {}", src.display());
    exe
}

fn fragscope(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .output()
        .unwrap()
}

fn info(trace: &Path) -> serde_json::Value {
    let out = fragscope(&["info".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn exit_status_passes_through_and_a_forked_child_is_its_own_process() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exit", &[]);
    let trace = dir.path().join("t.fsc");
    let out = fragscope(&[
        "record".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
        "7".as_ref(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = info(&trace);
    assert_eq!(j["truncated"], false);
    let procs = j["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{j:#}");
    let (parent, child) = (&procs[0], &procs[1]);
    assert_eq!(child["forked"], true);
    assert_eq!(child["parent_stream"], parent["stream"]);
    assert_eq!(child["ppid"], parent["pid"]);
    assert_eq!(child["exit_code"], 3);
    assert_eq!(parent["exit_code"], 7);
    // 777-byte blocks: libc allocates none of these itself.
    let mallocs = |p: &serde_json::Value| p["calls"]["malloc"].as_u64().unwrap();
    assert!((1000..1010).contains(&mallocs(parent)), "{parent:#}");
    assert!((500..505).contains(&mallocs(child)), "{child:#}");
}

#[test]
fn a_statically_linked_program_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "fork_exit", &["-static"]);
    let trace = dir.path().join("t.fsc");
    let out = fragscope(&[
        "record".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
        "--".as_ref(),
        exe.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("statically linked"), "{err}");
    assert!(!trace.exists(), "no empty trace is left behind");
}

#[test]
fn a_missing_program_and_a_bad_flag_get_clear_messages() {
    let out = fragscope(&[
        "record".as_ref(),
        "--".as_ref(),
        "/no/such/program".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such program"));
    let out = fragscope(&[
        "record".as_ref(),
        "--stacks".as_ref(),
        "some".as_ref(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));
}

#[test]
fn a_file_that_is_not_a_trace_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.fsc");
    std::fs::write(&bogus, b"hello, this is not a trace").unwrap();
    let out = fragscope(&["info".as_ref(), bogus.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a fragscope trace"));
}
