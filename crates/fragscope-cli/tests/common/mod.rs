//! What the integration tests share: building the programs in tests/c/, recording them
//! under each allocator, reading `fragscope info --json`, and checking a trace's merged
//! calls against a live set of our own.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

use fragscope_trace::hash::AddrMap;
use fragscope_trace::merge::{MergeStats, Merged, Merger};
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::Func;

pub const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// The allocator a traced program runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    Glibc,
    Jemalloc,
}

impl Allocator {
    /// What to put in LD_PRELOAD for it, if anything.
    pub fn preload(self) -> Option<&'static str> {
        match self {
            Allocator::Glibc => None,
            Allocator::Jemalloc => {
                assert!(
                    Path::new(JEMALLOC).exists(),
                    "{JEMALLOC} is missing: install Debian's libjemalloc2"
                );
                Some(JEMALLOC)
            }
        }
    }

    /// Sets the allocator for `cmd` (and so for what it runs).
    pub fn apply(self, cmd: &mut Command) {
        match self.preload() {
            Some(p) => cmd.env("LD_PRELOAD", p),
            None => cmd.env_remove("LD_PRELOAD"),
        };
    }
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}"))
}

fn compile(compiler: &str, src: &Path, out: &Path, flags: &[&str]) {
    let ok = Command::new(compiler)
        .args(["-O1", "-pthread"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .unwrap();
    assert!(ok.success(), "{compiler} failed on {}", src.display());
}

/// Compiles tests/c/NAME.c into `dir`; `extra` flags are added (and named in the file name).
pub fn build(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let exe = dir.join(format!("{name}{}", extra.join("")));
    if !prebuilt(&exe) {
        compile("cc", &source(&format!("{name}.c")), &exe, extra);
    }
    exe
}

/// Inside another release's chroot, which has no compiler, the test programs come built
/// (scripts/version-matrix.sh) in $FRAGSCOPE_TEST_PROGRAMS, under the file name `exe`
/// would have: copies it there and says so; false without $FRAGSCOPE_TEST_PROGRAMS.
pub fn prebuilt(exe: &Path) -> bool {
    let Some(dir) = std::env::var_os("FRAGSCOPE_TEST_PROGRAMS") else {
        return false;
    };
    let built = Path::new(&dir).join(exe.file_name().expect("a program's file name"));
    std::fs::copy(&built, exe)
        .unwrap_or_else(|e| panic!("{}: {e} (FRAGSCOPE_TEST_PROGRAMS)", built.display()));
    true
}

/// Compiles tests/c/NAME.cpp into `dir`.
pub fn build_cxx(dir: &Path, name: &str) -> PathBuf {
    let exe = dir.join(name);
    compile("c++", &source(&format!("{name}.cpp")), &exe, &[]);
    exe
}

/// Compiles tests/c/NAME.c into the shared library `dir`/libNAME.so.
pub fn build_shared(dir: &Path, name: &str) -> PathBuf {
    let lib = dir.join(format!("lib{name}.so"));
    compile(
        "cc",
        &source(&format!("{name}.c")),
        &lib,
        &["-shared", "-fPIC"],
    );
    lib
}

/// tests/ghc/`name`.hs.
pub fn ghc_case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/ghc/{name}.hs"))
}

/// The installed ghc's (major, minor) version; None without ghc.
pub fn ghc_version() -> Option<(u32, u32)> {
    let out = Command::new("ghc").arg("--numeric-version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.trim().split('.').map(|p| p.parse().ok());
    Some((parts.next()??, parts.next()??))
}

/// Builds the Haskell program `src` with `ghc -O -rtsopts` and `extra` flags into
/// `dir`/`name`; `None` when ghc or the source is missing.
pub fn build_ghc(dir: &Path, src: &Path, name: &str, extra: &[&str]) -> Option<PathBuf> {
    if !src.exists() || Command::new("ghc").arg("--version").output().is_err() {
        eprintln!("skipped: ghc or {} is missing", src.display());
        return None;
    }
    let exe = dir.join(name);
    let out = Command::new("ghc")
        .args(["-O", "-rtsopts"])
        .args(extra)
        .arg("-outputdir")
        .arg(dir.join(format!("build-{name}")))
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ghc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// `fragscope snapshot PID -o trace`, which must succeed: its stderr.
pub fn snapshot(pid: u32, trace: &Path) -> String {
    let out = fragscope(&[
        "snapshot".as_ref(),
        pid.to_string().as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    err
}

pub fn fragscope(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .output()
        .unwrap()
}

/// A `fragscope record` command (no stacks: the tests count calls) of `exe args` into
/// `trace`, the program running on `alloc`. `options` go before the `--`.
pub fn record_command(
    alloc: Allocator,
    trace: &Path,
    options: &[&str],
    exe: &Path,
    args: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fragscope"));
    cmd.args(["record", "--stacks", "none"])
        .args(options)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .arg(exe)
        .args(args);
    alloc.apply(&mut cmd);
    cmd
}

/// Records `exe args` on `alloc` into `trace`.
pub fn record(alloc: Allocator, trace: &Path, exe: &Path, args: &[&str]) -> Output {
    record_command(alloc, trace, &[], exe, args)
        .output()
        .unwrap()
}

/// `fragscope info TRACE --json`, which must succeed.
pub fn info(trace: &Path) -> serde_json::Value {
    let out = fragscope(&["info".as_ref(), trace.as_os_str(), "--json".as_ref()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One stream's (process image's) calls, merged and replayed against a live set.
#[derive(Debug, Default)]
pub struct StreamCalls {
    pub stream: u32,
    pub calls: u64,
    /// Allocating calls that returned a block, by function and requested size.
    pub allocs: BTreeMap<(Func, u64), u64>,
    /// Allocating calls that returned NULL, by function and requested size.
    pub failed: BTreeMap<(Func, u64), u64>,
    /// Blocks ended (by free, or by a realloc that moved or freed them), by the size
    /// they were allocated with.
    pub freed: BTreeMap<u64, u64>,
    pub free_null: u64,
    /// Allocations returning an address that was still live: never right.
    pub live_twice: u64,
    /// Frees of addresses not live: inherited from a parent, or misordered.
    pub unknown_frees: u64,
    /// Blocks whose address is not a multiple of the alignment the call asked for.
    pub misaligned: u64,
    /// malloc returning an address last allocated by another thread.
    pub cross_thread_reuse: u64,
    /// (bytes, blocks) live, allocated by threads other than the first to call, when
    /// the free of the first block of the mark size was merged (see [`stream_calls_marked`]).
    pub others_live_at_mark: Option<(u64, u64)>,
    /// The same at the end of the trace.
    pub others_live_at_end: (u64, u64),
    /// (bytes, blocks) live at the end, allocated by the first thread to call.
    pub first_thread_live_at_end: (u64, u64),
    pub merge: MergeStats,
}

impl StreamCalls {
    pub fn allocated(&self, func: Func, size: u64) -> u64 {
        self.allocs.get(&(func, size)).copied().unwrap_or(0)
    }
    pub fn freed(&self, size: u64) -> u64 {
        self.freed.get(&size).copied().unwrap_or(0)
    }
    /// Calls out of order in the merged sequence (the merge's forced calls among them).
    pub fn disorder(&self) -> u64 {
        self.live_twice + self.unknown_frees
    }
    /// `pairs` malloc/free pairs of `size` bytes, exactly, and nothing out of order.
    pub fn assert_pairs(&self, size: u64, pairs: u64, what: &str) {
        assert_eq!(
            self.allocated(Func::Malloc, size),
            pairs,
            "{what}: {self:#?}"
        );
        assert_eq!(self.freed(size), pairs, "{what}: {self:#?}");
        assert_eq!(self.disorder(), 0, "{what}: {self:#?}");
        assert_eq!(self.merge.lost_events, 0, "{what}: {self:#?}");
    }
}

/// Merges every stream of the trace on its own and replays its calls.
pub fn stream_calls(trace: &Path) -> Vec<StreamCalls> {
    stream_calls_marked(trace, None)
}

/// [`stream_calls`], also counting what other threads than the first hold live when the
/// first block of `mark` bytes is freed: a program marks a moment with free(malloc(mark)).
pub fn stream_calls_marked(trace: &Path, mark: Option<u64>) -> Vec<StreamCalls> {
    struct Replay {
        merger: Merger,
        /// Live blocks: size and allocating thread.
        live: AddrMap<(u64, u32)>,
        owner: AddrMap<u32>,
        first_tid: Option<u32>,
        calls: StreamCalls,
    }
    /// (bytes, blocks) live whose allocating thread is (`first`) or is not the first.
    fn live_of(r: &Replay, first: bool) -> (u64, u64) {
        r.live
            .values()
            .filter(|&&(_, tid)| (Some(tid) == r.first_tid) == first)
            .fold((0, 0), |(bytes, n), &(size, _)| (bytes + size, n + 1))
    }
    fn replay(r: &mut Replay, mark: Option<u64>) {
        let mut taken = r.merger.stats().taken_from_reallocs;
        while let Some(m) = r.merger.pop() {
            // The call took its block from a realloc of another thread placed after it,
            // which then releases nothing (the merge's `Call::old_taken`).
            let took = r.merger.stats().taken_from_reallocs > taken;
            taken = r.merger.stats().taken_from_reallocs;
            let Merged::Call(c) = m else { continue };
            r.first_tid.get_or_insert(c.tid);
            r.calls.calls += 1;
            if let Some(a) = c.releases() {
                match r.live.remove(&a) {
                    Some((size, _)) => {
                        *r.calls.freed.entry(size).or_default() += 1;
                        if Some(size) == mark && r.calls.others_live_at_mark.is_none() {
                            r.calls.others_live_at_mark = Some(live_of(r, false));
                        }
                    }
                    None => r.calls.unknown_frees += 1,
                }
            } else if c.func == Func::Free {
                r.calls.free_null += 1;
            }
            if c.func == Func::Free {
                continue;
            }
            let Some(a) = c.allocates() else {
                *r.calls.failed.entry((c.func, c.size)).or_default() += 1;
                continue;
            };
            let s = &mut r.calls;
            *s.allocs.entry((c.func, c.size)).or_default() += 1;
            if r.live.insert(a, (c.size, c.tid)).is_some() && !took {
                s.live_twice += 1;
            }
            if c.align > 1 && a % c.align != 0 {
                s.misaligned += 1;
            }
            let last = r.owner.insert(a, c.tid);
            if last.is_some_and(|t| t != c.tid) && c.func == Func::Malloc {
                s.cross_thread_reuse += 1;
            }
        }
    }
    let mut reader = TraceReader::open(trace).unwrap();
    let mut streams: HashMap<u32, Replay> = HashMap::new();
    // Processes `record -p` attached to: their merge knows the heap began before them.
    let mut attached = std::collections::HashSet::new();
    // And the blocks they held then, when read: the merge and the live set start there.
    let mut starting: HashMap<u32, fragscope_trace::heap_census::StartingHeap> = HashMap::new();
    while let Some(chunk) = reader.next_chunk() {
        if let Chunk::Process(p) = &chunk {
            if p.origin == fragscope_trace::Origin::Attached {
                attached.insert(p.stream);
            }
        }
        if let Chunk::StartingHeap(h) = &chunk {
            starting.insert(h.stream, h.clone());
        }
        let Chunk::Events(h, records) = chunk else {
            continue;
        };
        let r = streams.entry(h.stream).or_insert_with(|| Replay {
            merger: {
                let mut m = Merger::new();
                if attached.contains(&h.stream) {
                    m.set_attached();
                }
                m
            },
            live: AddrMap::default(),
            owner: AddrMap::default(),
            first_tid: None,
            calls: StreamCalls {
                stream: h.stream,
                ..Default::default()
            },
        });
        if let Some(heap) = starting.remove(&h.stream) {
            r.merger.seed_starting_heap(heap.tick, &heap.blocks);
            // Tid 0: no thread's (the heap was there before any recorded call).
            r.live
                .extend(heap.blocks.iter().map(|&(a, usable)| (a, (usable, 0))));
        }
        r.merger.push_chunk(&h, &records).unwrap();
        replay(r, mark);
    }
    let mut out: Vec<StreamCalls> = streams
        .into_values()
        .map(|mut r| {
            r.merger.finish();
            replay(&mut r, mark);
            r.calls.others_live_at_end = live_of(&r, false);
            r.calls.first_thread_live_at_end = live_of(&r, true);
            r.calls.merge = r.merger.stats();
            r.calls
        })
        .collect();
    out.sort_by_key(|s| s.stream);
    out
}

/// The replayed calls of one stream (an empty record if it made none).
pub fn calls_of(all: &[StreamCalls], stream: u64) -> &StreamCalls {
    static NONE: std::sync::OnceLock<StreamCalls> = std::sync::OnceLock::new();
    all.iter()
        .find(|s| u64::from(s.stream) == stream)
        .unwrap_or_else(|| NONE.get_or_init(StreamCalls::default))
}

/// `fragscope report TRACE`'s text, which must succeed.
pub fn report_text(trace: &Path) -> String {
    let out = fragscope(&["report".as_ref(), trace.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first line of `text` that contains `needle`.
pub fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

/// `fragscope report TRACE --json`, which must succeed.
pub fn report_json(trace: &Path) -> serde_json::Value {
    report_json_with(trace, &[])
}

/// `fragscope report TRACE --json OPTIONS...`, which must succeed.
pub fn report_json_with(trace: &Path, options: &[&str]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec!["report".as_ref(), trace.as_os_str(), "--json".as_ref()];
    args.extend(options.iter().map(OsStr::new));
    let out = fragscope(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Records tests/c/`name`.c (a pre-fork program printing "worker PID" per worker) under
/// glibc into `dir`, and returns the trace and the workers' pids.
pub fn record_prefork(dir: &Path, name: &str) -> (PathBuf, Vec<String>) {
    let exe = build(dir, name, &[]);
    let trace = dir.join(format!("{name}.fsc"));
    let out = record(Allocator::Glibc, &trace, &exe, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let workers = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("worker ").to_string())
        .collect();
    (trace, workers)
}

/// `fragscope report TRACE --json --pid PID`: one process of a trace.
pub fn report_json_of(trace: &Path, pid: impl std::fmt::Display) -> serde_json::Value {
    report_json_with(trace, &["--pid", &pid.to_string()])
}

/// Records tests/python/keep_a_tenth.py `args` with Debian's interpreter as a user would
/// (Python sites sampled, censuses every 300 ms) into `dir`/keep_a_tenth.fsc.
pub fn record_keep_a_tenth(dir: &Path, args: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/keep_a_tenth.py");
    let trace = dir.join("keep_a_tenth.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--snapshot-ms", "300", "-o"])
        .arg(&trace)
        .args(["--", "/usr/bin/python3"])
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "record: {}", stderr(&out));
    trace
}

/// A program that waits on stdin, started by the test (not by fragscope): for snapshot
/// PID and record -p.
pub struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Running {
    pub fn start(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        assert!(!l.is_empty(), "the program ended");
        l
    }
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Where screenshots are kept.
pub fn artefacts() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/html-report");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Loads `page` in headless Chromium; returns the DOM after the script ran. Fails on any
/// console message (errors, policy violations) and writes a screenshot to `shot`.
/// `fragscope report TRACE --html` into `dir`, loaded in a headless browser (its
/// screenshot kept as artefacts/NAME.png): its DOM once the page's script finished
/// without errors; None (with a note) without a browser.
pub fn rendered_page(trace: &Path, dir: &Path, name: &str) -> Option<String> {
    let page = dir.join(format!("{name}.html"));
    let out = fragscope(&[
        "report".as_ref(),
        trace.as_os_str(),
        "--html".as_ref(),
        page.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let Some(browser) = chromium() else {
        eprintln!("skipped the browser checks: chromium is not installed");
        return None;
    };
    let dom = load_page(&browser, &page, &artefacts().join(format!("{name}.png")));
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the script did not finish"
    );
    assert!(!dom.contains("data-errors"), "the page reported errors");
    Some(dom)
}

pub fn load_page(browser: &Path, page: &Path, shot: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.display());
    let base = |cmd: &mut Command| {
        cmd.args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
    };
    let mut cmd = Command::new(browser);
    base(&mut cmd);
    let out = cmd
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(&url)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!dom.is_empty(), "chromium printed no DOM: {log}");
    let mut cmd = Command::new(browser);
    base(&mut cmd);
    let out = cmd
        .args(["--window-size=1280,2600"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(out.status.success(), "screenshot failed");
    assert!(
        std::fs::metadata(shot).unwrap().len() > 10_000,
        "empty screenshot"
    );
    dom
}

/// Debian's redis-server started on `port` with its files in `dir`, answering PING, and a
/// redis-cli for it; None (the test skips) when redis is not installed.
pub fn start_redis(
    dir: &Path,
    port: &str,
    extra: &[&str],
) -> Option<(Child, impl Fn(&[&str]) -> String)> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: redis-server is missing");
        return None;
    }
    let server = Command::new("redis-server")
        .args(["--port", port, "--save", "", "--appendonly", "no"])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let port = port.to_string();
    let cli = move |args: &[&str]| -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cli(&["PING"]) != "PONG" {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some((server, cli))
}

/// The go command (for `go tool pprof`), when installed.
pub fn go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("go"))
            .find(|g| g.is_file())
    });
    on_path.or_else(|| {
        ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
    })
}

/// `go tool pprof -top` of one sample type, in bytes or counts, with `options`: (total,
/// [(flat, function)]).
pub fn pprof_top(
    go: &Path,
    profile: &Path,
    sample: &str,
    options: &[&str],
) -> (u64, Vec<(u64, String)>) {
    let out = Command::new(go)
        .args(["tool", "pprof", "-top", "-nodecount=1000", "-unit=B"])
        .arg(format!("-sample_index={sample}"))
        .args(options)
        .arg(profile)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let number = |s: &str| -> u64 { s.trim_end_matches('B').parse().unwrap_or(0) };
    let total = text
        .lines()
        .find_map(|l| l.split("Total samples = ").nth(1))
        .map(|t| number(t.split_whitespace().next().unwrap()))
        .unwrap_or_else(|| panic!("no total in {text}"));
    let rows = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 6).then(|| (number(cols[0]), cols[5..].join(" ")))
        })
        .collect();
    (total, rows)
}

/// tests/rust/linked_alloc built with `feature` (`tikv-jemallocator`, `mimalloc`): a Rust
/// program whose allocator is linked into it. Built once per feature, beside the
/// workspace's own build.
pub fn build_linked_alloc(feature: &str) -> PathBuf {
    build_linked_alloc_from("", feature)
}

/// The same program on tikv-jemallocator 0.6 (its manifest in linked_alloc/jemalloc-0.6),
/// with `feature` (`tikv-jemallocator`, `jemalloc-stats`).
pub fn build_linked_alloc_on_jemalloc_0_6(feature: &str) -> PathBuf {
    build_linked_alloc_from("jemalloc-0.6", feature)
}

/// tests/rust/linked_alloc built from the manifest in its directory `manifest_dir` ("" for
/// its own) with `feature`.
fn build_linked_alloc_from(manifest_dir: &str, feature: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/rust/linked_alloc")
        .join(manifest_dir);
    let name = if manifest_dir.is_empty() {
        format!("linked_alloc-{feature}")
    } else {
        format!("linked_alloc-{manifest_dir}-{feature}")
    };
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join(name);
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--features",
            feature,
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build --features {feature} ({}): {}",
        root.display(),
        stderr(&out)
    );
    target.join("release/linked_alloc")
}
