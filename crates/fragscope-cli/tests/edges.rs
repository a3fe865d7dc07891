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

#[test]
fn a_trace_cut_by_a_full_disk_says_what_failed_and_what_survives() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    let trace = dir.path().join("t.fsc");
    // A file size limit stands in for a full disk: the trace's write fails (EFBIG) at
    // 16 KiB, with nothing else of the machine's disks at stake.
    let mut cmd = common::record_command(
        Allocator::Glibc,
        &trace,
        &[],
        &exe,
        &["300", "2000", "1000"],
    );
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 16 << 10,
                rlim_max: 16 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&trace.display().to_string()),
        "names the file: {stderr}"
    );
    assert!(stderr.contains("File too large"), "says why: {stderr}");
    assert!(
        stderr.contains("intact and readable"),
        "says what survives: {stderr}"
    );
    // And it does survive.
    let j = info(&trace);
    assert_eq!(j["truncated"], true, "{j:#}");
    assert!(j["events"].as_u64().unwrap() > 1000, "{j:#}");
    let report = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    assert!(report.status.success(), "{}", common::stderr(&report));
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("truncated"), "{text}");
    assert!(!text.contains("peak RSS 0 B"), "{text}");
}

#[test]
fn a_report_without_an_rss_sample_says_so_instead_of_printing_zero() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &["20", "2000", "10000"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // Cut the trace where its first RSS samples begin, as a full disk or a killed
    // recorder may: the calls before are there, no RSS sample is.
    let mut reader = fragscope_trace::TraceReader::open(&trace).unwrap();
    let mut cut_at = None;
    let mut events_before = 0;
    loop {
        let offset = reader.offset();
        match reader.next_chunk() {
            Some(fragscope_trace::Chunk::Rss(_)) => {
                cut_at = Some(offset);
                break;
            }
            Some(fragscope_trace::Chunk::Events(..)) => events_before += 1,
            Some(_) => {}
            None => break,
        }
    }
    let cut_at = cut_at.expect("the trace has RSS samples");
    assert!(events_before > 0, "calls come before the first RSS samples");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&trace)
        .unwrap()
        .set_len(cut_at)
        .unwrap();
    let out = common::fragscope(&["report".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["headline"]["peak_rss"],
        serde_json::Value::Null,
        "{:#}",
        r["headline"]
    );
    assert_eq!(r["headline"]["peak_rss_t_ms"], serde_json::Value::Null);
    let snapshots = r["snapshots"].as_array().unwrap();
    assert!(
        !snapshots.is_empty(),
        "the exit snapshot came before the RSS samples"
    );
    for s in snapshots {
        assert_eq!(s["rss_measured"], false, "{s:#}");
    }
    let out = common::fragscope(&["report".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("peak RSS not measured"), "{text}");
    let rss_row = text.lines().find(|l| l.trim_start().starts_with("= RSS"));
    assert!(rss_row.is_some_and(|l| l.contains("not sampled")), "{text}");
    assert!(!text.contains("peak RSS 0 B"), "{text}");
    let out = common::fragscope(&["replay".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(text.contains("no RSS sample was taken"), "{text}");
    assert!(!text.contains("peak RSS 0 B"), "{text}");
    assert!(!text.contains("outside the heap 0 B"), "{text}");
    let out = common::fragscope(&["info".as_ref(), trace.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0 RSS samples,"), "{text}");
    assert!(!text.contains("(peak 0 B)"), "{text}");
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// None (after saying why) where mounting is not allowed.
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping the full-disk test: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(Self { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_recording_onto_a_full_disk_says_so_and_leaves_a_readable_trace() {
    let Some(disk) = SmallDisk::mount(16 << 10) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    let trace = disk.dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &["300", "2000", "1000"]);
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&trace.display().to_string()), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("intact and readable"), "{stderr}");
    let j = info(&trace);
    assert_eq!(j["truncated"], true, "{j:#}");
    assert!(j["events"].as_u64().unwrap() > 1000, "{j:#}");
}

#[test]
fn a_program_that_removes_the_recorders_socket_still_gets_its_trace_written() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("rm.fsc");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .args([
            "--",
            "sh",
            "-c",
            "rm -rf \"$(dirname \"$FRAGSCOPE_SOCK\")\"; echo removed",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The recorder used to wait for ever for a connection that could no longer come.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("fragscope record did not finish once the program removed its socket");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success());
    let info = info(&trace);
    assert!(!info["processes"].as_array().unwrap().is_empty(), "{info}");
}

/// An intact chunk of RSS samples whose payload does not decode (put into a real trace
/// after its second chunk) is passed over: report, info and replay read every call after
/// it, do not call the trace truncated, and say what they skipped.
#[test]
fn a_chunk_that_does_not_decode_is_skipped_and_said_so() {
    use fragscope_trace::chunk::FILE_HEADER_BYTES;
    use fragscope_trace::{ChunkKind, ChunkWriter, TraceReader};
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "paced", &[]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &["4", "2000", "5"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let whole = common::report_json(&trace);

    let bytes = std::fs::read(&trace).unwrap();
    let mut r = TraceReader::open(&trace).unwrap();
    r.next_chunk();
    r.next_chunk();
    let at = r.offset() as usize;
    let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
    w.write_chunk(ChunkKind::Rss, &[0xff; 40]).unwrap();
    let bad = w.into_inner();
    let spliced = dir.path().join("spliced.fsc");
    let mut data = bytes[..at].to_vec();
    data.extend_from_slice(&bad[FILE_HEADER_BYTES as usize..]);
    data.extend_from_slice(&bytes[at..]);
    std::fs::write(&spliced, data).unwrap();

    let j = common::report_json(&spliced);
    assert_eq!(j["truncated"], false, "{j:#}");
    assert_eq!(j["calls"], whole["calls"]);
    assert_eq!(whole["skipped"], serde_json::Value::Null);
    let note = j["skipped"].as_str().expect("a note of the skipped chunk");
    assert!(
        note.contains(&format!("byte {at}")) && note.contains("Rss"),
        "{note}"
    );
    let text = common::fragscope(&["report".as_ref(), spliced.as_os_str()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("note: skipped the chunk"));
    let i = info(&spliced);
    assert_eq!(i["truncated"], false, "{i:#}");
    assert_eq!(i["events"], info(&trace)["events"]);
    assert!(i["skipped"].is_string(), "{i:#}");
    let text = common::fragscope(&["info".as_ref(), spliced.as_os_str()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("note       skipped the chunk"));
    let replay = common::fragscope(&["replay".as_ref(), spliced.as_os_str()]);
    assert!(replay.status.success(), "{}", common::stderr(&replay));
    assert!(String::from_utf8_lossy(&replay.stdout).contains("note: skipped the chunk"));
}
