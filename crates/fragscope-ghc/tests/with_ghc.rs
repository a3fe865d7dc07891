//! Builds small Haskell programs with the machine's GHC and reads their eventlogs: one that
//! exits normally and one killed while it runs. Skipped, with the reason printed, when
//! `ghc` is not on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fragscope_ghc::{EventKind, Eventlog, HeapProfBreakdown};

/// Keeps 5000 ByteStrings live while it computes. It must compute, not sleep: the RTS
/// takes a heap census on its ticks, which count only while the program runs (with
/// `threadDelay` in the loop, 6 runs in 40 took no census while the payloads lived).
const ALLOCATES: &str = r#"
import Control.Monad (forM_)
import qualified Data.ByteString as BS
import System.Mem (performGC)

main :: IO ()
main = do
  let chunks = [BS.replicate 200 (fromIntegral i) | i <- [1 .. 5000 :: Int]]
  print (sum (map BS.length chunks))
  forM_ [1 .. 50 :: Int] $ \i -> print (sum [i .. i + 4000000]) >> performGC
  print (length chunks)
"#;

const RUNS_FOREVER: &str = r#"
import Control.Monad (forM_)
import System.Mem (performGC)

main :: IO ()
main = forM_ [1 :: Int ..] $ \i -> print (sum [i .. i + 20000]) >> performGC
"#;

fn ghc_version() -> Option<String> {
    let out = Command::new("ghc").arg("--numeric-version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("fragscope-ghc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn build(dir: &Path, source: &str) -> PathBuf {
    std::fs::write(dir.join("Main.hs"), source).unwrap();
    let status = Command::new("ghc")
        .args(["-O", "-rtsopts", "-eventlog", "Main.hs", "-o", "prog"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "ghc failed in {}", dir.display());
    dir.join("prog")
}

/// The program's environment is emptied: the RTS writes it into the eventlog.
fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["+RTS", "-l", "-hT", "-i0.005", "-olprog.eventlog", "-RTS"])
        .current_dir(program.parent().unwrap())
        .stdout(Stdio::null());
    cmd
}

#[test]
fn reads_the_eventlog_of_a_program_built_here() {
    let Some(version) = ghc_version() else {
        eprintln!("skipping: no ghc on PATH (install GHC to run this test)");
        return;
    };
    let dir = ScratchDir::new("allocates");
    let program = build(&dir.0, ALLOCATES);
    let run = command(&program).stderr(Stdio::piped()).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{}: {stderr}", run.status);

    let log = Eventlog::parse(&std::fs::read(dir.0.join("prog.eventlog")).unwrap()).unwrap();
    assert!(!log.is_truncated());
    assert_eq!(log.ghc_version(), Some(version.as_str()));
    assert!(log.program_args().unwrap().iter().any(|a| a == "-hT"));
    let count = |f: fn(&EventKind) -> bool| log.events.iter().filter(|e| f(&e.kind)).count();
    assert!(count(|k| matches!(k, EventKind::HeapLive { .. })) >= 20);
    assert!(count(|k| matches!(k, EventKind::HeapSize { .. })) >= 20);
    assert!(count(|k| matches!(k, EventKind::GcStats(_))) >= 20);
    let profile = log.heap_profile();
    assert_eq!(profile.breakdown, Some(HeapProfBreakdown::ClosureType));
    let arr_words = profile
        .find_label("ARR_WORDS")
        .expect("ByteString payloads");
    assert!(profile
        .samples
        .iter()
        .any(|s| s.bytes_of(arr_words) >= 5000 * 200));
}

#[test]
fn reads_the_eventlog_of_a_killed_program() {
    if ghc_version().is_none() {
        eprintln!("skipping: no ghc on PATH (install GHC to run this test)");
        return;
    }
    let dir = ScratchDir::new("killed");
    let program = build(&dir.0, RUNS_FOREVER);
    let mut child = command(&program).spawn().unwrap();
    let path = dir.0.join("prog.eventlog");
    // The RTS writes a capability's buffer when it fills (a few MiB): wait for one.
    let started = Instant::now();
    while std::fs::metadata(&path).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(started.elapsed() < Duration::from_secs(60), "no eventlog");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the program stopped by itself: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let log = Eventlog::parse(&std::fs::read(&path).unwrap()).unwrap();
    assert!(log.is_truncated());
    // The start-up information waits in the global buffer, written only at exit.
    assert_eq!(log.rts_identifier(), None);
    assert!(log
        .events
        .iter()
        .any(|e| matches!(e.kind, EventKind::HeapLive { .. })));
}
