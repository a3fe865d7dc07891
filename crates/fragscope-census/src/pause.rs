//! Holding a process stopped while its heap metadata is read, so that the census sees
//! one moment: the runtime cannot allocate, collect or move anything meanwhile.

use std::time::{Duration, Instant};

/// A process stopped with SIGSTOP; SIGCONT when dropped. A process that was already
/// stopped (by its user, a debugger) is left as it was, and not continued afterwards.
pub struct Pause {
    pid: u32,
    stopped_by_us: bool,
    started: Instant,
}

/// How long to wait for every thread to stop before reading anyway.
const STOP_WAIT: Duration = Duration::from_millis(200);

impl Pause {
    /// Stops `pid` and waits until all its threads have stopped. Err when the process
    /// is gone or every thread did not stop in time (it is continued again then).
    pub fn stop(pid: u32) -> Result<Self, String> {
        let started = Instant::now();
        if all_threads_stopped(pid)? {
            return Ok(Self {
                pid,
                stopped_by_us: false,
                started,
            });
        }
        // SAFETY: kill has no memory effects; pid is a process we were asked to read.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) } != 0 {
            return Err(format!(
                "cannot stop process {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let pause = Self {
            pid,
            stopped_by_us: true,
            started,
        };
        loop {
            if all_threads_stopped(pid)? {
                return Ok(pause);
            }
            if started.elapsed() > STOP_WAIT {
                // Dropping `pause` continues it.
                return Err(format!(
                    "process {pid} did not stop within {} ms",
                    STOP_WAIT.as_millis()
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// How long the process has been held so far.
    pub fn held(&self) -> Duration {
        self.started.elapsed()
    }
}

/// How often a census that found the runtime mid-change is taken again, after letting the
/// process run 4, 8 and 16 ms.
const RETRIES: u32 = 3;

/// `census()`, taken again while it fails with an error `retryable` accepts (a stop that
/// landed while the runtime changed what the census reads) and the process is held by
/// `pause`, which is let go between tries. Err(Err(why)): the process could not be
/// stopped again.
pub(crate) fn retrying<T, E>(
    pid: u32,
    pause: &mut Option<Pause>,
    mut census: impl FnMut() -> Result<T, E>,
    retryable: impl Fn(&E) -> bool,
) -> Result<T, Result<E, String>> {
    let mut attempt = 0;
    loop {
        match census() {
            Ok(t) => return Ok(t),
            Err(e) if attempt < RETRIES && pause.is_some() && retryable(&e) => {
                drop(pause.take());
                std::thread::sleep(Duration::from_millis(4 << attempt));
                attempt += 1;
                *pause = Some(Pause::stop(pid).map_err(Err)?);
            }
            Err(e) => return Err(Ok(e)),
        }
    }
}

impl Drop for Pause {
    fn drop(&mut self) {
        if self.stopped_by_us {
            // SAFETY: as above.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGCONT) };
        }
    }
}

/// True when every thread of `pid` is stopped (state T or t); Err when the process is gone.
fn all_threads_stopped(pid: u32) -> Result<bool, String> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("process {pid} is gone ({e})"))?;
    let mut any = false;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue; // the thread just exited
        };
        // The state follows the parenthesised command name, which may hold spaces.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .unwrap_or("");
        match state {
            "T" | "t" => any = true,
            // A zombie thread stays so; it no longer runs.
            "Z" | "X" => {}
            _ => return Ok(false),
        }
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn stops_a_process_and_continues_it() {
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        {
            let pause = Pause::stop(pid).unwrap();
            assert!(all_threads_stopped(pid).unwrap());
            assert!(pause.held() < Duration::from_secs(1));
        }
        // Continued: it runs (or sleeps) again.
        let deadline = Instant::now() + Duration::from_secs(2);
        while all_threads_stopped(pid).unwrap() {
            assert!(Instant::now() < deadline, "the process stayed stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(Pause::stop(pid).is_err());
    }
}
