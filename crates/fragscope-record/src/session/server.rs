//! The recorder's socket: where it lies (with the clock page), who may connect to it, and
//! the thread that accepts each connection and starts serving it.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};

use super::connection::serve_arrival;
use super::shared::{Arrival, Shared};
use crate::procfs;

/// The recording's directory, with the socket's and the clock page's paths.
pub(super) struct Rendezvous {
    /// Removed with what it holds when the recording ends.
    _dir: tempfile::TempDir,
    pub(super) sock_path: PathBuf,
    pub(super) clock_path: PathBuf,
    /// Where Node.js processes write their V8 heap's figures (`runtime/v8_heap.js`): any
    /// user may add a file (mode 1733, sticky), none may list or replace another's.
    pub(super) v8_dir: PathBuf,
}

impl Rendezvous {
    /// Makes the directory and listens on its socket, which every user may connect to.
    pub(super) fn open() -> Result<(Self, UnixListener)> {
        let dir = rendezvous_dir()?;
        let sock_path = dir.path().join("sock");
        let clock_path = dir.path().join("clock");
        let listener = UnixListener::bind(&sock_path)
            .with_context(|| format!("listening on {}", sock_path.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            // Connecting needs write permission on the socket, whatever user a process became.
            std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o666))
                .with_context(|| {
                    format!("opening {} to the program's users", sock_path.display())
                })?;
        }
        let v8_dir = dir.path().join("v8");
        {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .mode(0o1733)
                .create(&v8_dir)
                .with_context(|| format!("creating {}", v8_dir.display()))?;
            // The umask may have taken bits from what we asked for.
            std::fs::set_permissions(&v8_dir, std::fs::Permissions::from_mode(0o1733))
                .with_context(|| format!("opening {} to the program's users", v8_dir.display()))?;
        }
        let rendezvous = Self {
            _dir: dir,
            sock_path,
            clock_path,
            v8_dir,
        };
        Ok((rendezvous, listener))
    }
}

/// The directory of the recorder's socket and clock page: in /dev/shm where there is one,
/// as its files live in memory. Under a disk's journal, removing the directory at the end
/// waited for the commit of the trace's writes (12 ms after a 37 MiB trace on ext4).
/// Every user may pass through it (mode 0711), since the program's processes may become
/// any user: who is served is decided per connection (`kinship`, the token).
fn rendezvous_dir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let shm = Path::new("/dev/shm");
    sweep_stale_rendezvous(shm);
    sweep_stale_rendezvous(&std::env::temp_dir());
    let mut builder = tempfile::Builder::new();
    builder.prefix("fragscope-");
    let dir = builder
        .tempdir_in(shm)
        .or_else(|_| builder.tempdir())
        .context("creating a temporary directory")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("opening {} to the program's users", dir.path().display()))?;
    Ok(dir)
}

/// Removes the rendezvous directories in `parent` that a recorder left when it was killed:
/// ours (same uid), whose socket no process has bound any more (it is not among the bound
/// Unix sockets in /proc/net/unix), or, without a socket, older than a minute (one that
/// was just made is about to get its socket). The list of bound sockets is read for each
/// socket file, after it was seen and once it is 200 ms old: a list read once before the
/// loop would miss the sockets of recorders that started meanwhile (which then hung,
/// their directory gone, in parallel tests).
fn sweep_stale_rendezvous(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let is_bound = |sock: &Path| -> Option<bool> {
        let list = std::fs::read_to_string("/proc/net/unix").ok()?;
        let sock = sock.to_string_lossy();
        Some(
            list.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(7) == Some(sock.as_ref())),
        )
    };
    let older_than = |p: &Path, age: Duration| {
        std::fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > age))
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let dir = entry.path();
        let ours = entry
            .file_name()
            .to_string_lossy()
            .starts_with("fragscope-")
            && entry.metadata().is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.is_dir() && m.uid() == uid
            });
        if !ours {
            continue;
        }
        let sock = dir.join("sock");
        let stale = if sock.exists() {
            // Without the list, a live recorder cannot be told apart: keep it.
            older_than(&sock, Duration::from_millis(200)) && is_bound(&sock) == Some(false)
        } else {
            older_than(&dir, Duration::from_secs(60))
        };
        if stale {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Where a connecting process stands to the recorded program.
#[derive(Debug, PartialEq, Eq)]
enum Kinship {
    /// The recorder or one of its descendants: the program and whatever it started
    /// (orphans are re-parented to the recorder, their subreaper).
    InTree,
    /// Its ancestry leads elsewhere.
    Outsider,
    /// It is gone already: its HELLO's token decides.
    Unknown,
}

/// `attached`: the process `record -p` attached to, whose descendants are the program's.
fn kinship(pid: u32, attached: Option<u32>) -> Kinship {
    let me = std::process::id();
    for _attempt in 0..3 {
        let mut p = pid;
        let mut chain_broke = false;
        for _depth in 0..4096 {
            if p == me || Some(p) == attached {
                return Kinship::InTree;
            }
            if p <= 1 {
                return Kinship::Outsider;
            }
            match procfs::parent_pid(p) {
                Some(parent) => p = parent,
                None if p == pid => return Kinship::Unknown,
                None => {
                    chain_broke = true;
                    break;
                }
            }
        }
        if !chain_broke {
            return Kinship::Outsider;
        }
        // An ancestor exited while we walked: its children are being re-parented.
        thread::sleep(Duration::from_millis(1));
    }
    Kinship::Unknown
}

/// A random secret for this recording (hex), handed to the program in its environment.
pub(super) fn recording_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: getrandom writes at most the given length into the buffer.
        let n = unsafe { libc::getrandom(bytes[got..].as_mut_ptr().cast(), bytes.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("reading random bytes for the recording's token");
        }
        got += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The pid and uid of the process at the other end of a Unix socket (pid 0 if unknown).
fn peer_credentials(conn: &UnixStream) -> (u32, u32) {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        (cred.pid as u32, cred.uid)
    } else {
        (0, u32::MAX)
    }
}

/// The thread accepting connections, and what stops it.
pub(super) struct Acceptor {
    stop_accepting: Arc<AtomicBool>,
    open_connections: Arc<Mutex<Vec<UnixStream>>>,
    listener_fd: std::os::fd::RawFd,
    thread: JoinHandle<Vec<JoinHandle<()>>>,
}

impl Acceptor {
    /// Accepts connections from the recorded program's processes (`attached`: the
    /// process `record -p` attached to), each served by a thread of its own.
    pub(super) fn spawn(
        listener: UnixListener,
        shared: &Arc<Shared>,
        attached: Option<u32>,
    ) -> std::io::Result<Self> {
        let stop_accepting = Arc::new(AtomicBool::new(false));
        let open_connections: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
        let listener_fd = listener.as_raw_fd();
        let thread = {
            let shared = shared.clone();
            let stop_accepting = stop_accepting.clone();
            let open_connections = open_connections.clone();
            thread::Builder::new()
                .name("fragscope-accept".into())
                .spawn(move || {
                    accept(
                        &listener,
                        &shared,
                        attached,
                        &stop_accepting,
                        &open_connections,
                    )
                })?
        };
        Ok(Self {
            stop_accepting,
            open_connections,
            listener_fd,
            thread,
        })
    }

    /// Stops accepting, closes the connections still open and waits for their threads.
    pub(super) fn finish(self, sock_path: &Path) {
        self.stop_accepting.store(true, Ordering::Release);
        // The acceptor sees the flag at its next connection: this one. When the socket's
        // name is gone (the program cleaned the temporary directory up), shutting the
        // listener down wakes it instead: until it has seen the flag it holds the listener
        // open, so the descriptor is still ours.
        if UnixStream::connect(sock_path).is_err() {
            // SAFETY: shutdown has no memory effects on a descriptor we own.
            unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        }
        let servers = self.thread.join().unwrap_or_default();
        // Descendants still running past the grace period are no longer traced.
        for c in self.open_connections.lock().unwrap().iter() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        for s in servers {
            let _ = s.join();
        }
    }
}

/// The acceptor's loop: until `stop_accepting`, each connection from the program is
/// served by a thread of its own; returns those threads.
fn accept(
    listener: &UnixListener,
    shared: &Arc<Shared>,
    attached: Option<u32>,
    stop_accepting: &AtomicBool,
    open_connections: &Mutex<Vec<UnixStream>>,
) -> Vec<JoinHandle<()>> {
    // SAFETY: geteuid cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    let mut servers = Vec::new();
    for conn in listener.incoming() {
        if stop_accepting.load(Ordering::Acquire) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let (pid, uid) = peer_credentials(&conn);
        let refuse = match kinship(pid, attached) {
            Kinship::InTree => false,
            Kinship::Outsider => true,
            // Gone before we could tell: another user's connection is refused
            // (its ancestry can no longer be checked), our own user's is left
            // to the token.
            Kinship::Unknown => uid != own_uid,
        };
        if refuse {
            // Refused before it costs a thread: no one outside the program
            // can add to the trace or load the recorder.
            shared.refused_connections.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if let Ok(c) = conn.try_clone() {
            open_connections.lock().unwrap().push(c);
        }
        let id = servers.len() as u64;
        shared.arrivals.lock().unwrap().push(Arrival {
            id,
            pid,
            registered: false,
        });
        let shared = shared.clone();
        servers.push(thread::spawn(move || serve_arrival(shared, conn, id)));
    }
    servers
}
