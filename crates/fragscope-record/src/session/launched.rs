//! The program `record` starts: run with the interposer preloaded, signals passed on to
//! it, and waited for with its descendants.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fragscope_trace::{ChunkKind, WaitStatus};

use super::options::RecordOptions;
use super::server::Rendezvous;
use super::shared::Shared;

/// After the program exits, how long its descendants may keep their connections open.
const DESCENDANT_GRACE: Duration = Duration::from_secs(2);

static CHILD_PID: AtomicU64 = AtomicU64::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD_PID.load(Ordering::Relaxed);
    if pid != 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

/// How the program is started besides its command.
pub(super) struct Launch<'a> {
    pub(super) preload: &'a Path,
    pub(super) rendezvous: &'a Rendezvous,
    pub(super) token: &'a str,
    /// The GHC RTS flags asked for.
    pub(super) ghcrts: Option<&'a OsString>,
    /// A program that will never connect (a Go program without cgo: the dynamic loader
    /// never runs): its stream is opened as it starts, and its heap read by census.
    pub(super) unconnected: bool,
}

/// Starts `command` with the interposer preloaded and the recording's settings in its
/// environment, and waits for it and its descendants. Returns its exit code (None: not
/// seen) and pid.
pub(super) fn run_program(
    shared: &Shared,
    command: &[OsString],
    launch: &Launch,
    opts: &RecordOptions,
) -> Result<(Option<i32>, u32)> {
    let Launch {
        preload,
        rendezvous,
        token,
        ghcrts,
        unconnected,
    } = *launch;
    // Orphaned descendants are re-parented to us, so their exit status is ours to read.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let program = &command[0];
    let existing_preload = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty());
    let mut preload_value = preload.as_os_str().to_owned();
    if let Some(theirs) = existing_preload {
        preload_value.push(":");
        preload_value.push(theirs);
    }
    let mut cmd = Command::new(program);
    cmd.args(&command[1..])
        .env("LD_PRELOAD", preload_value)
        .env("FRAGSCOPE_SOCK", &rendezvous.sock_path)
        .env("FRAGSCOPE_CLOCK", &rendezvous.clock_path)
        .env("FRAGSCOPE_STACKS", opts.stacks.name())
        .env("FRAGSCOPE_SAMPLE_BYTES", opts.sample_bytes.to_string())
        .env("FRAGSCOPE_FLUSH_MS", opts.flush_ms.to_string())
        .env("FRAGSCOPE_TOKEN", token);
    if let Some(ghcrts) = ghcrts {
        cmd.env("GHCRTS", ghcrts);
    }
    // Node.js processes load the module that hands over their V8 heap's figures.
    if let Some(module) = crate::preload::v8_module(preload) {
        let mut node_options = std::ffi::OsString::from("--require \"");
        node_options.push(&module);
        node_options.push("\"");
        if let Some(theirs) = std::env::var_os("NODE_OPTIONS").filter(|v| !v.is_empty()) {
            node_options.push(" ");
            node_options.push(theirs);
        }
        let every = super::v8_interval_ms(opts.snapshot_ms);
        cmd.env("NODE_OPTIONS", node_options)
            .env("FRAGSCOPE_V8_DIR", &rendezvous.v8_dir)
            .env("FRAGSCOPE_V8_MS", every.to_string());
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    let child_pid = child.id();
    CHILD_PID.store(u64::from(child_pid), Ordering::Relaxed);
    if unconnected {
        let argv = command.iter().map(|a| a.to_string_lossy().into_owned());
        let exe = std::fs::read_link(format!("/proc/{child_pid}/exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        shared.open_unconnected_stream(child_pid, argv.collect(), exe);
    }
    // The terminal's ^C reaches the program directly (same process group); we stay to
    // finish the trace. SIGTERM and SIGHUP sent to us are passed on.
    // SAFETY: installing handlers that only call kill.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(
            libc::SIGTERM,
            forward_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGHUP,
            forward_signal as *const () as libc::sighandler_t,
        );
    }
    // Reaped below with waitpid, with every orphan.
    std::mem::forget(child);
    let exit_code = wait_for_program(shared, child_pid);
    CHILD_PID.store(0, Ordering::Relaxed);
    Ok((exit_code, child_pid))
}

/// Reaps the program and every orphan (each exit status written), until the program has
/// exited and its descendants closed their connections or had `DESCENDANT_GRACE`.
fn wait_for_program(shared: &Shared, child_pid: u32) -> Option<i32> {
    // Polled, the program's pidfd wakes us the moment it exits (Linux 5.3+; without one,
    // waitpid is polled every few milliseconds).
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw_pidfd =
        unsafe { libc::syscall(libc::SYS_pidfd_open, child_pid as libc::c_int, 0) } as i32;
    // SAFETY: a descriptor we just opened and nothing else owns.
    let child_pidfd = (raw_pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw_pidfd) });

    let mut exit_code = None;
    let mut grace_until: Option<Instant> = None;
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            let st = std::process::ExitStatus::from_raw(status);
            let ws = WaitStatus {
                pid: pid as u32,
                tick: shared.tick(),
                exit_code: st.code(),
                signal: st.signal(),
            };
            shared.send(ChunkKind::WaitStatus, ws.encode());
            if pid as u32 == child_pid {
                exit_code = Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
                grace_until = Some(Instant::now() + DESCENDANT_GRACE);
            }
            continue;
        }
        if let Some(until) = grace_until {
            let all_ended = shared
                .procs
                .lock()
                .unwrap()
                .streams
                .iter()
                .all(|s| s.ended || s.connections == 0);
            if all_ended || Instant::now() >= until {
                break;
            }
        }
        if let Some(pidfd) = child_pidfd.as_ref().filter(|_| exit_code.is_none()) {
            let mut pfd = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 5) };
        } else {
            let nap = if exit_code.is_some() { 1 } else { 5 };
            thread::sleep(Duration::from_millis(nap));
        }
    }
    exit_code
}
