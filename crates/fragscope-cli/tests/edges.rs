//! The edges of the command line: a reader that closes the pipe early, a disk that fills
//! up mid-recording.

mod common;

use std::ffi::OsStr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{build, info, Allocator};

/// Records tests/c/fork_exit.c (two processes) into `dir`/t.fsc.
fn small_trace(dir: &Path) -> std::path::PathBuf {
    let exe = build(dir, "fork_exit", &[]);
    let trace = dir.join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    trace
}

/// Runs fragscope with `args` and its stdout a pipe whose reading end is already closed,
/// as `fragscope ... | head -c 0` leaves it; returns its status and stderr.
fn with_closed_stdout(args: &[&OsStr]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The only reading end: every write of the child now fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_command_writing_to_stdout_ends_quietly_when_the_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path());
    let t = trace.as_os_str();
    let commands: Vec<Vec<&OsStr>> = vec![
        vec!["info".as_ref(), t],
        vec!["info".as_ref(), t, "--json".as_ref()],
        vec!["report".as_ref(), t],
        vec!["report".as_ref(), t, "--json".as_ref()],
        vec![
            "export".as_ref(),
            t,
            "--format".as_ref(),
            "json".as_ref(),
            "-o".as_ref(),
            "-".as_ref(),
        ],
        vec![
            "export".as_ref(),
            t,
            "--format".as_ref(),
            "collapsed".as_ref(),
            "-o".as_ref(),
            "-".as_ref(),
        ],
        vec!["replay".as_ref(), t],
        vec!["compare".as_ref(), t, t],
        vec!["--help".as_ref()],
    ];
    for args in commands {
        let (status, stderr) = with_closed_stdout(&args);
        // 0, or killed by SIGPIPE (141 in a shell), as coreutils end.
        let quiet_status = status.success() || status.signal() == Some(libc::SIGPIPE);
        assert!(quiet_status, "{args:?}: {status:?}\n{stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
    // And the trace was only read.
    assert_eq!(info(&trace)["truncated"], false);
}
