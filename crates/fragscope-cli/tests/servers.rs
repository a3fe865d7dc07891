//! Real servers recorded as their users run them: Debian's PostgreSQL under pgbench, its
//! postmaster forking a backend per connection and its auxiliary processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Debian's PostgreSQL programs: the newest /usr/lib/postgresql/N/bin with a postgres.
fn postgres_bin() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("no /usr/lib/postgresql: scripts/install-deps.sh installs Debian's postgresql")
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("no /usr/lib/postgresql/N/bin/postgres")
        .1
}

/// `id -u` or `id -g` of `user`.
fn id_of(flag: &str, user: &str) -> u32 {
    let out = Command::new("id").args([flag, user]).output().unwrap();
    assert!(out.status.success(), "no user {user}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// PostgreSQL refuses to run as root: as root, its programs run as the postgres user
/// (setpriv, as a service manager would); otherwise as the user running the tests.
fn as_server_user(program: &Path) -> Command {
    if root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory effects; a pid gone is an error we ignore.
    unsafe { libc::kill(pid as i32, sig) };
}

/// A PostgreSQL server recorded by `fragscope record`, listening on a Unix socket in its
/// own directory only. Dropped before it was stopped (a failed assertion), it is shut
/// down all the same: fast, then immediate, then killed.
struct Recorded {
    recording: Child,
    data: PathBuf,
    socket_dir: PathBuf,
    bin: PathBuf,
}

/// Only names the socket file, in a directory of the test's own (no TCP).
const PORT: &str = "54329";

impl Recorded {
    fn postmaster(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
    }

    fn ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .arg("-q")
            .arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", PORT, "-U", "postgres"])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// pgbench `args` against the server, which must succeed; its standard output.
    fn pgbench(&self, args: &[&str]) -> String {
        let out = Command::new(self.bin.join("pgbench"))
            .arg("-h")
            .arg(&self.socket_dir)
            .args(["-p", PORT, "-U", "postgres"])
            .args(args)
            .arg("postgres")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pgbench {args:?}: {}",
            common::stderr(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits up to `secs` for the recording to end.
    fn wait(&mut self, secs: u64) -> Option<ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut status = None;
        wait_until(deadline, || {
            status = self.recording.try_wait().unwrap();
            status.is_some()
        });
        status
    }

    /// A fast shutdown (SIGINT to the postmaster); the recording's exit status.
    fn stop(&mut self) -> ExitStatus {
        signal(self.postmaster().expect("no postmaster.pid"), libc::SIGINT);
        self.wait(30)
            .expect("the recording did not end after a fast shutdown")
    }
}

/// The processes whose parent is `pid` (from /proc/N/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // After the command's parentheses: state, then the parent's pid.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == pid).then_some(child)
    })
    .collect()
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if self.recording.try_wait().ok().flatten().is_some() {
            return;
        }
        for (sig, secs) in [(libc::SIGINT, 15), (libc::SIGQUIT, 5), (libc::SIGKILL, 5)] {
            // The postmaster is the recording's child (setpriv execs it), and has no
            // postmaster.pid yet if it never started.
            let mut server = children_of(self.recording.id());
            server.extend(self.postmaster());
            for &pid in &server {
                signal(pid, sig);
            }
            if self.wait(secs).is_some() {
                return;
            }
        }
        let _ = self.recording.kill();
        let _ = self.recording.wait();
    }
}

/// PostgreSQL's backends and auxiliary processes start from the postmaster's heap at their
/// fork: every free they make of a block is of a block known, their merge forces and loses
/// nothing, and each names the postmaster as the process it was forked from.
#[test]
fn postgres_backends_under_pgbench_free_only_known_blocks() {
    let bin = postgres_bin();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let socket_dir = dir.path().join("socket");
    for d in [&data, &socket_dir] {
        std::fs::create_dir(d).unwrap();
    }
    if root() {
        // The postgres user reaches its directories, and owns them.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (uid, gid) = (id_of("-u", "postgres"), id_of("-g", "postgres"));
        for d in [&data, &socket_dir] {
            std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
        }
    }
    let out = as_server_user(&bin.join("initdb"))
        .args(["-A", "trust", "-U", "postgres", "-N", "-D"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "initdb: {}", common::stderr(&out));

    let trace = dir.path().join("pg.fsc");
    // The server's log and fragscope's messages (a pipe could fill and stop the server).
    let log = dir.path().join("server.log");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut recording = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    recording.args(["record", "-o"]).arg(&trace).arg("--");
    let server = as_server_user(&bin.join("postgres"));
    recording
        .arg(server.get_program())
        .args(server.get_args())
        .arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&socket_dir)
        .args(["-p", PORT, "-c", "listen_addresses="])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut pg = Recorded {
        recording: recording.spawn().unwrap(),
        data: data.clone(),
        socket_dir,
        bin,
    };
    let started = wait_until(Instant::now() + Duration::from_secs(20), || {
        pg.ready() || pg.recording.try_wait().unwrap().is_some()
    });
    assert!(
        started && pg.ready(),
        "PostgreSQL did not start under fragscope: {}",
        log_text()
    );
    pg.pgbench(&["-i", "-q", "-s", "2"]);
    let run = pg.pgbench(&["-c", "4", "-j", "2", "-T", "5"]);
    let transactions: u64 = common::line_with(&run, "number of transactions actually processed")
        .rsplit(": ")
        .next()
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{run}"));
    assert!(transactions > 0, "{run}");
    let postmaster = pg.postmaster().unwrap();
    let status = pg.stop();
    assert!(status.success(), "{status}: {}", log_text());

    let report = common::report_json(&trace);
    let processes = report["processes"].as_array().unwrap();
    let postmaster = u64::from(postmaster);
    // As root, setpriv's image and then the postmaster's, under the same pid.
    let images = processes.iter().filter(|p| p["pid"] == postmaster).count();
    assert_eq!(images, if root() { 2 } else { 1 }, "{processes:#?}");
    let mut pids: Vec<u64> = processes
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    pids.sort();
    pids.dedup();
    let mut forked = Vec::new();
    for &pid in &pids {
        // The postmaster's pid: its last image, postgres.
        let r = common::report_json_of(&trace, pid);
        let merge = &r["merge"];
        for field in ["unknown_frees", "inherited_frees", "forced_allocs", "late"] {
            assert_eq!(merge[field], 0, "{pid} {field}: {merge}");
        }
        assert_eq!(merge["lost_events"], 0, "{pid}: {merge}");
        if pid == postmaster {
            assert!(
                merge["forked_from"].is_null() && merge["inherited_blocks"].is_null(),
                "{merge}"
            );
            continue;
        }
        assert_eq!(merge["forked_from"], postmaster, "{pid}: {merge}");
        assert_eq!(merge["inherited_stale"], 0, "{pid}: {merge}");
        assert_eq!(merge["inherited_from_parent_end"], false, "{pid}: {merge}");
        let inherited = merge["inherited_bytes"].as_u64().unwrap_or(0);
        assert!(
            merge["inherited_blocks"].as_u64().unwrap_or(0) > 1000 && inherited > 100_000,
            "{pid}: {merge}"
        );
        // The blocks it inherited are live data from its start.
        let peak_live = r["headline"]["peak_live"].as_u64().unwrap();
        assert!(peak_live >= inherited, "{pid}: {peak_live} < {inherited}");
        forked.push((r["calls"].as_u64().unwrap(), pid));
    }
    // The startup process, checkpointer, background writer, WAL writer, autovacuum and
    // logical replication launchers, and pgbench's backends: one to load, four to run.
    assert!(forked.len() >= 11, "{forked:?}: {processes:#?}");
    // The busiest backend's text says where its heap began, and nothing of unknown frees.
    let busiest = forked.iter().max().unwrap().1;
    let out = common::fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--pid".as_ref(),
        busiest.to_string().as_ref(),
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let note = format!("started from its parent's heap at the fork (pid {postmaster})");
    assert!(text.contains(&note), "{text}");
    assert!(!text.contains("unknown blocks"), "{text}");
}
