//! `record -p`: the process joined instead of started, its interposer loaded, and let go.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use fragscope_trace::ChunkKind;

use super::options::{AttachOptions, RecordOptions};
use super::shared::Shared;

/// The command line of the process `record -p` attaches to (its name in brackets when it
/// has none, as a kernel thread's).
pub(super) fn attach_command(pid: u32) -> Result<Vec<OsString>> {
    if pid == std::process::id() {
        bail!("fragscope cannot record itself");
    }
    if crate::access::gone(pid) {
        bail!("no process {pid} (it does not exist or has exited)");
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| crate::access::access_error(pid, &e))?;
    let args: Vec<OsString> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
        .collect();
    if args.is_empty() {
        bail!("process {pid} has no command line (a kernel thread?): nothing to record");
    }
    Ok(args)
}

/// Set by Ctrl-C, SIGTERM or SIGHUP during `record -p`: detach and finish the trace.
pub(super) static STOP_ATTACHED: AtomicBool = AtomicBool::new(false);

extern "C" fn stop_attached(_sig: libc::c_int) {
    STOP_ATTACHED.store(true, Ordering::Relaxed);
}

/// How long a detached process's connection may take to close (its last snapshot).
pub(super) const DETACH_WAIT: Duration = Duration::from_secs(10);

/// What `record -p` loads into the process: a link to the interposer, beside the settings
/// a preloaded one would read from its environment (preload/attach.h reads them there),
/// in a directory of its own; both go when the recording ends.
pub(super) struct AttachFiles {
    _dir: tempfile::TempDir,
    library: PathBuf,
}

impl AttachFiles {
    pub(super) fn write(preload: &Path, pid: u32, settings: &[(&str, &OsStr)]) -> Result<Self> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // Beside the interposer's own copy: a place every user can read and map code from.
        let parent = preload.parent().unwrap_or(Path::new("/tmp"));
        let dir = tempfile::Builder::new()
            .prefix("attach-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a directory in {}", parent.display()))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let library = dir.path().join("libfragscope_preload.so");
        if std::fs::hard_link(preload, &library).is_err() {
            std::fs::copy(preload, &library)
                .with_context(|| format!("copying {}", preload.display()))?;
            std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o644))?;
        }
        let conf = dir.path().join("attach.conf");
        let mut text = Vec::new();
        for (name, value) in settings {
            text.extend_from_slice(name.as_bytes());
            text.push(b'=');
            text.extend_from_slice(value.as_bytes());
            text.push(b'\n');
        }
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&conf)
                .with_context(|| format!("writing {}", conf.display()))?;
            f.write_all(&text)?;
        }
        // It holds the recording's token: readable by the process's user alone.
        let target = std::fs::metadata(format!("/proc/{pid}"))
            .map_err(|e| crate::access::access_error(pid, &e))?;
        // SAFETY: geteuid cannot fail.
        if target.uid() != unsafe { libc::geteuid() } {
            std::os::unix::fs::chown(&conf, Some(target.uid()), Some(target.gid())).with_context(
                || {
                    format!(
                        "handing {} to process {pid}'s user (uid {})",
                        conf.display(),
                        target.uid()
                    )
                },
            )?;
        }
        Ok(Self { _dir: dir, library })
    }
}

/// `record -p`: loads the interposer into the running process, lets it record until the
/// duration is up, Ctrl-C / SIGTERM / SIGHUP, or the process ends, then detaches from it
/// (its calls go back to its allocator) after a last snapshot. Returns the exit code of
/// the recording (0), or Err when the process could not be attached to.
pub(super) fn run_attached(
    shared: &Arc<Shared>,
    a: &AttachOptions,
    preload: &Path,
    sock_path: &Path,
    clock_path: &Path,
    opts: &RecordOptions,
    token: &str,
) -> Result<i32> {
    let pid = a.pid;
    let sample_bytes = opts.sample_bytes.to_string();
    let flush_ms = opts.flush_ms.to_string();
    let files = AttachFiles::write(
        preload,
        pid,
        &[
            ("FRAGSCOPE_SOCK", sock_path.as_os_str()),
            ("FRAGSCOPE_CLOCK", clock_path.as_os_str()),
            ("FRAGSCOPE_STACKS", OsStr::new(opts.stacks.name())),
            ("FRAGSCOPE_SAMPLE_BYTES", OsStr::new(&sample_bytes)),
            ("FRAGSCOPE_FLUSH_MS", OsStr::new(&flush_ms)),
            ("FRAGSCOPE_TOKEN", OsStr::new(token)),
        ],
    )?;
    // The process is not ours to signal: these end the recording instead.
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(sig, stop_attached as *const () as libc::sighandler_t);
        }
    }
    crate::attach::load_library(pid, &files.library)?;
    // Its HELLO came during the dlopen: its stream, before any of its calls.
    let until = Instant::now() + DETACH_WAIT;
    let stream = loop {
        let found = shared
            .procs
            .lock()
            .unwrap()
            .streams
            .iter()
            .rposition(|s| s.pid == pid && !s.ended);
        match found {
            Some(s) => break s as u32,
            None if Instant::now() < until => thread::sleep(Duration::from_millis(2)),
            None => bail!("process {pid} loaded the interposer but never connected to fragscope"),
        }
    };
    // The heap as it is, read with the process stopped, and its calls rebound before it
    // runs again: the merge starts from these blocks, so their frees are known and the
    // report's live data holds them.
    // (Written while it is stopped: no chunk of its calls can come before this one.)
    let (heap, slots, held) = crate::attach::rebind_library(pid, &files.library, || {
        crate::attach::glibc_live_blocks(pid).map(|blocks| {
            let heap = fragscope_trace::heap_census::StartingHeap {
                stream,
                tick: shared.tick(),
                blocks,
            };
            shared.send(ChunkKind::StartingHeap, heap.encode());
        })
    })?;
    if let Err(why) = heap {
        eprintln!(
            "fragscope: note: the heap process {pid} holds was not read ({why}); frees of \
             its blocks will be counted apart, and its live data will count only blocks \
             allocated from now on"
        );
    }
    if fragscope_census::v8_inspector::is_node(pid) {
        // The module `record` has Node load cannot be loaded into a running process.
        eprintln!(
            "fragscope: process {pid} runs Node.js: its V8 heap is asked through its \
             inspector at each snapshot (opened with SIGUSR1 unless it is open: Node prints \
             \"Debugger listening\" and listens on 127.0.0.1 until the recording ends)"
        );
        shared.censuses.ask_v8_by_inspector(stream, pid);
    }
    eprintln!(
        "fragscope: recording process {pid}{} (held {:.1} ms while its heap was read and \
         {slots} call slots rebound); Ctrl-C stops the recording and leaves the process \
         running",
        a.duration
            .map(|d| format!(" for {:.0} s", d.as_secs_f64()))
            .unwrap_or_default(),
        held.as_secs_f64() * 1000.0
    );
    let registered = || {
        let procs = shared.procs.lock().unwrap();
        let mine: Vec<_> = procs.streams.iter().filter(|s| s.pid == pid).collect();
        (
            !mine.is_empty(),
            mine.iter().all(|s| s.ended || s.connections == 0),
        )
    };
    let deadline = a.duration.map(|d| Instant::now() + d);
    loop {
        let (connected, all_ended) = registered();
        if crate::access::gone(pid) || (connected && all_ended) {
            // It exited or exec'd: its connection said so.
            return Ok(0);
        }
        if STOP_ATTACHED.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    shared.last_snapshot_before_detach(stream, pid);
    let detached = crate::attach::detach_library(pid, &files.library);
    let until = Instant::now() + DETACH_WAIT;
    while Instant::now() < until && !crate::access::gone(pid) {
        let (connected, all_ended) = registered();
        if !connected || all_ended {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    shared.censuses.close_v8_inspectors();
    detached.map(|_| 0).with_context(|| {
        format!(
            "process {pid} still runs with fragscope's interposer recording into a closed \
             connection (its calls pass through it)"
        )
    })
}
