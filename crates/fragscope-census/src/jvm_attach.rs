//! HotSpot's attach mechanism, the one `jcmd` uses, spoken directly: a diagnostic command
//! sent to a running JVM without starting another JVM to send it (jcmd itself is a Java
//! program: 300 ms of CPU beside the one it asks, at every snapshot).
//!
//! The JVM listens on the Unix socket /tmp/.java_pid<PID> once asked: a file
//! .attach_pid<PID> in its working directory (or /tmp) and a SIGQUIT make its signal
//! thread start the listener. Both paths are the JVM's own view: through /proc/PID/root
//! and /proc/PID/cwd, and with its pid in its own namespace, so a JVM in a container is
//! reached the same way. A JVM that handles no SIGQUIT (-Xrs) would die of one: the caller
//! asks only a JVM whose flags allow it (`HotSpot::attach_allowed`). The JVM answers only
//! a peer of its own user.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The pid of `pid` in its own namespace (the last of /proc/PID/status's NSpid).
fn pid_in_namespace(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("NSpid:"))?;
            line.split_whitespace().last()?.parse().ok()
        })
        .unwrap_or(pid)
}

/// Runs the diagnostic command `command` (as `jcmd PID command` would) in JVM `pid` and
/// returns its output; Err says why not.
pub fn jcmd(pid: u32, command: &str, wait: Duration) -> Result<String, String> {
    let ns = pid_in_namespace(pid);
    let socket = PathBuf::from(format!("/proc/{pid}/root/tmp/.java_pid{ns}"));
    if !socket.exists() {
        start_listener(pid, ns, &socket, wait)?;
    }
    let mut s = UnixStream::connect(&socket)
        .map_err(|e| format!("the JVM's attach socket refused the connection ({e})"))?;
    s.set_read_timeout(Some(wait)).ok();
    // Protocol version 1, then the operation and three arguments, each NUL-terminated.
    let request = format!("1\0jcmd\0{command}\0\0\0");
    s.write_all(request.as_bytes())
        .map_err(|e| format!("the JVM's attach socket closed ({e})"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("the JVM did not answer `{command}` ({e})"))?;
    match answer.split_once('\n') {
        Some(("0", out)) => Ok(out.to_string()),
        Some((code, out)) => Err(format!(
            "the JVM refused `{command}` ({code}: {})",
            out.trim()
        )),
        None => Err(format!("the JVM answered `{command}` with {answer:?}")),
    }
}

/// Asks the JVM to start its attach listener and waits for its socket.
fn start_listener(pid: u32, ns: u32, socket: &Path, wait: Duration) -> Result<(), String> {
    let candidates = [
        PathBuf::from(format!("/proc/{pid}/cwd/.attach_pid{ns}")),
        PathBuf::from(format!("/proc/{pid}/root/tmp/.attach_pid{ns}")),
    ];
    let trigger = candidates
        .iter()
        .find_map(|p| Trigger::make(p))
        .ok_or("no .attach_pid file could be made where the JVM looks for one")?;
    // SAFETY: kill has no memory effects; the caller checked the JVM handles SIGQUIT.
    let sent = unsafe { libc::kill(pid as libc::pid_t, libc::SIGQUIT) } == 0;
    let started = Instant::now();
    while sent && !socket.exists() && started.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(10));
    }
    trigger.remove();
    if socket.exists() {
        Ok(())
    } else {
        Err(format!(
            "the JVM did not start its attach listener within {} ms",
            wait.as_millis()
        ))
    }
}

/// The .attach_pid file made in the JVM's directory, and where it lies as this process
/// sees it: a JVM that ends meanwhile takes its /proc/PID paths with it, and the file
/// would stay behind in its working directory.
struct Trigger {
    through_proc: PathBuf,
    /// Its path once resolved, with its device and inode to recognise it there.
    resolved: Option<(PathBuf, u64, u64)>,
}

impl Trigger {
    fn make(through_proc: &Path) -> Option<Trigger> {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::create(through_proc).ok()?;
        let resolved = file.metadata().ok().and_then(|m| {
            let path = std::fs::canonicalize(through_proc).ok()?;
            Some((path, m.dev(), m.ino()))
        });
        Some(Trigger {
            through_proc: through_proc.to_path_buf(),
            resolved,
        })
    }

    /// Removes it, by its resolved path when the process is gone, if the file there is
    /// still the one made (another mount namespace may show another file at that path).
    fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::remove_file(&self.through_proc).is_ok() {
            return;
        }
        if let Some((path, dev, ino)) = &self.resolved {
            let same =
                std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == *dev && m.ino() == *ino);
            if same {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

pub use fragscope_trace::jvm_heap::NativeCategory;

/// The categories of a `VM.native_memory summary` answer, as "- Java Heap (reserved=
/// 4194304KB, committed=262144KB)" lines give them.
pub fn parse_native_memory(summary: &str) -> Vec<NativeCategory> {
    let kib = |line: &str, key: &str| -> Option<u64> {
        let at = line.find(key)? + key.len();
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some(digits.parse::<u64>().ok()? * 1024)
    };
    summary
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix('-')?;
            let (name, figures) = rest.split_once("(reserved=")?;
            let figures = format!("(reserved={figures}");
            Some((
                name.trim().to_string(),
                kib(&figures, "reserved=")?,
                kib(&figures, "committed=")?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trigger made in a process's working directory is removed even when the
    /// process ended before it was (its /proc paths gone with it).
    #[test]
    fn a_trigger_is_removed_after_its_process_ended() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let through_proc = PathBuf::from(format!("/proc/{}/cwd/.attach_pid1", child.id()));
        let trigger = Trigger::make(&through_proc).unwrap();
        assert!(dir.path().join(".attach_pid1").exists());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!through_proc.exists(), "the process's paths outlived it");
        trigger.remove();
        assert!(!dir.path().join(".attach_pid1").exists());
    }

    #[test]
    fn native_memory_categories_are_read_from_a_summary() {
        // The head of a JDK 17 answer.
        let summary = "\nNative Memory Tracking:\n\n(Omitting categories weighting less than \
                       1KB)\n\nTotal: reserved=5716475KB, committed=387695KB\n       malloc: \
                       19967KB #32191\n\n-                 Java Heap (reserved=4194304KB, \
                       committed=262144KB)\n                            (mmap: reserved=4194304KB, \
                       committed=262144KB) \n \n-                     Class (reserved=1048972KB, \
                       committed=652KB)\n                            (classes #1142)\n";
        assert_eq!(
            parse_native_memory(summary),
            vec![
                ("Java Heap".to_string(), 4194304 * 1024, 262144 * 1024),
                ("Class".to_string(), 1048972 * 1024, 652 * 1024),
            ]
        );
        assert!(parse_native_memory("Native memory tracking is not enabled").is_empty());
    }
}
