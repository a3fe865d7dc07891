//! A copy of a running process made by fork on a borrowed thread (`remote_call`), for
//! `snapshot` to read a heap from while the process runs on.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use crate::remote_call::{libc_image, remote_syscall, wait_stop, CALL_TIMEOUT};

/// A copy of a process made by fork while the process was held stopped: the memory the
/// process had at that moment (its private pages shared copy-on-write), readable at
/// leisure while the process itself runs on. The copy never runs: it starts stopped and
/// traced by us, and is killed when dropped. Its parent, the process, is not told of it:
/// it is forked with no exit signal, and the process is made to reap it (a `wait4` with
/// `__WALL` on a borrowed thread) after it is killed, so no SIGCHLD and no zombie is left.
pub struct ForkedCopy {
    parent: u32,
    /// libc's `syscall` in the parent, for the reaping.
    syscall: u64,
    child: i32,
}

impl ForkedCopy {
    pub fn pid(&self) -> u32 {
        self.child as u32
    }
}

impl Drop for ForkedCopy {
    fn drop(&mut self) {
        // SAFETY: signalling and waiting for a process we created and trace.
        unsafe {
            libc::kill(self.child, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.child, &mut status, libc::__WALL);
        }
        let reaped = remote_syscall(
            self.parent,
            self.syscall,
            &[
                libc::SYS_wait4 as u64,
                self.child as u64,
                0,
                libc::__WALL as u64,
                0,
            ],
            &mut |_, _| {},
        );
        if let Err(e) = reaped {
            if !crate::access::gone(self.parent) {
                eprintln!(
                    "fragscope: warning: process {}'s copy {} could not be reaped by it ({e:#}); \
                     it stays a zombie until process {} waits for it or exits",
                    self.parent, self.child, self.parent
                );
            }
        }
    }
}

/// What forking a copy of a process needs, found before the process is stopped (reading
/// libc's symbols would lengthen the stop): libc's `syscall` in it.
pub struct Forker {
    pid: u32,
    syscall: u64,
}

impl Forker {
    /// Err says why `pid` is not to be forked (a seccomp filter) or cannot be.
    pub fn new(pid: u32) -> Result<Self> {
        if seccomp_filtered(pid) {
            bail!(
                "process {pid} runs under a seccomp filter, which could forbid (or kill it \
                 for) the fork that makes the copy"
            );
        }
        let syscall = libc_image(pid)?
            .need("syscall")
            .map_err(|e| anyhow!("process {pid}'s C library: {e}"))?;
        Ok(Self { pid, syscall })
    }

    /// Forks the process (held stopped by the caller) on a borrowed thread, with no exit
    /// signal and nothing shared: the child has the process's memory as it is now. Err
    /// says why the copy could not be made (no memory to commit, a process limit); the
    /// process is left as it was.
    pub fn fork(&self) -> Result<ForkedCopy> {
        let pid = self.pid;
        let mut child = None;
        // clone(flags = 0): a fork whose exit sends no signal; newsp, parent_tid,
        // child_tid, tls all 0.
        let r = remote_syscall(
            pid,
            self.syscall,
            &[libc::SYS_clone as u64, 0, 0, 0, 0, 0],
            &mut |event, message| {
                if matches!(
                    event,
                    libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE
                ) {
                    child = Some(message as i32);
                }
            },
        )?;
        if r < 0 {
            bail!(
                "the fork that makes the copy failed in process {pid}: {}",
                std::io::Error::from_raw_os_error(-r as i32)
            );
        }
        let child = child.unwrap_or(r as i32);
        let copy = ForkedCopy {
            parent: pid,
            syscall: self.syscall,
            child,
        };
        // It starts stopped, traced by this thread: wait for that stop before reading it.
        let deadline = Instant::now() + CALL_TIMEOUT;
        wait_stop(child, deadline, &mut Vec::new(), |_| true)?;
        Ok(copy)
    }
}

/// True when `pid` runs under a seccomp filter (Seccomp: 2 in its status).
fn seccomp_filtered(pid: u32) -> bool {
    crate::procfs::status_field(pid, "Seccomp").is_some_and(|v| v == "2")
}
