//! Go's heap, read from outside a running Go program and checked against what its runtime
//! says of itself at the same quiet moment (runtime.MemStats after runtime.GC()), on the
//! installed Go and the oldest and newest releases the module proxy serves
//! (`GOTOOLCHAIN`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fragscope_census::golang::{census, GoRuntime, GO_PAGE};
use fragscope_census::{Pause, ProcessMemory};
use fragscope_trace::go_heap::{GoHeap, GoSpanKind};

/// The Go releases the census is checked on: the installed one, and the toolchains
/// `GOTOOLCHAIN` fetches (the oldest release the census reads, and the newest).
const TOOLCHAINS: [&str; 3] = ["local", "go1.22.12", "go1.27.3"];

fn go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("go"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// tests/go/NAME built by `toolchain` with `flags`; None (with a note) when Go or the
/// toolchain cannot be had.
fn build(name: &str, toolchain: &str, flags: &[&str]) -> Option<PathBuf> {
    let Some(go) = go() else {
        eprintln!("skipped: go is not installed (scripts/install-deps.sh installs it)");
        return None;
    };
    // A directory of its own for each build: two tests building the same program
    // into one place could each run the other's half-written file.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!(
            "go-{}-{n}-{toolchain}-{}",
            std::process::id(),
            flags.join("_").replace(['-', '=', ' '], "")
        ))
        .join(name);
    let mut c = Command::new(go);
    c.current_dir(repo().join("tests/go").join(name))
        .args(["build", "-o"])
        .arg(&out)
        .args(flags)
        .arg(".");
    if toolchain != "local" {
        c.env("GOTOOLCHAIN", toolchain);
    }
    let built = c.output().unwrap();
    assert!(
        built.status.success(),
        "go build with {toolchain}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Some(out)
}

struct Running {
    child: Child,
    stats: serde_json::Value,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs keep_tenth until it is ready, with its MemStats.
fn run(exe: &Path, args: &[&str]) -> Running {
    let stats = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "memstats-{}-{}.json",
        std::process::id(),
        exe.parent().unwrap().file_name().unwrap().to_string_lossy()
    ));
    let mut child = Command::new(exe)
        .arg(&stats)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let ready = out
        .lines()
        .map_while(Result::ok)
        .any(|l| l.starts_with("ready"));
    assert!(ready, "{} never said it was ready", exe.display());
    let stats = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    Running { child, stats }
}

fn take(pid: u32) -> GoHeap {
    let rt = GoRuntime::detect(pid)
        .expect("a Go program")
        .expect("a Go program whose heap is read");
    let _pause = Pause::stop(pid).unwrap();
    let mut mem = ProcessMemory::open(pid).unwrap();
    census(&mut mem, &rt).unwrap()
}

fn within(what: &str, census: u64, runtime: u64, pct: f64) {
    let diff = (census as f64 - runtime as f64).abs();
    assert!(
        diff <= runtime as f64 * pct / 100.0,
        "{what}: census {census}, the runtime's own {runtime} (more than {pct}% apart)"
    );
}

/// keep_tenth built by `toolchain` with `flags`, run, and its census held to its own
/// runtime.MemStats.
fn census_is_the_runtimes_own_accounting(toolchain: &str, flags: &[&str]) {
    let Some(exe) = build("keep_tenth", toolchain, flags) else {
        return;
    };
    let running = run(&exe, &["2000000", "50000000"]);
    let heap = take(running.child.id());
    let m = &running.stats;
    let stat = |k: &str| m[k].as_u64().unwrap();
    let objects = heap.spans.iter().filter(|s| s.kind == GoSpanKind::Objects);
    let allocated: u64 = objects.clone().map(|s| s.in_use_bytes()).sum();
    let in_use: u64 = objects.clone().map(|s| s.bytes(GO_PAGE)).sum();
    let stacks: u64 = heap
        .spans
        .iter()
        .filter(|s| s.kind == GoSpanKind::Stacks)
        .map(|s| s.bytes(GO_PAGE))
        .sum();
    let idle = heap.range_bytes() - in_use - stacks;
    eprintln!(
        "{} {flags:?}: HeapAlloc {} census {allocated}; HeapInuse {} census {in_use}; \
         StackInuse {} census {stacks}; HeapIdle {} census {idle}",
        heap.go,
        stat("HeapAlloc"),
        stat("HeapInuse"),
        stat("StackInuse"),
        stat("HeapIdle")
    );
    if toolchain != "local" {
        assert!(heap.go.starts_with(toolchain), "{} {toolchain}", heap.go);
    }
    within("HeapAlloc", allocated, stat("HeapAlloc"), 2.0);
    within("HeapInuse", in_use, stat("HeapInuse"), 2.0);
    // The program runs on between its own reading and the census: a goroutine may
    // have taken a stack span (32 KiB) since.
    let stack_in_use = stat("StackInuse");
    assert!(
        stacks.abs_diff(stack_in_use) <= (64 << 10).max(stack_in_use / 50),
        "StackInuse: census {stacks}, the runtime's own {stack_in_use}"
    );
    // Idle pages are what is left: what the program allocated since its own reading
    // came out of them, so they are held to 2% of the heap, not of themselves.
    assert!(
        idle.abs_diff(stat("HeapIdle")) * 50 <= stat("HeapSys"),
        "HeapIdle: census {idle}, the runtime's own {}",
        stat("HeapIdle")
    );
    // Every tenth record kept: their spans are about a tenth full.
    let small: Vec<_> = objects
        .filter(|s| s.class != 0 && s.slots >= 100 && s.slot_bytes == 64)
        .collect();
    let (used, slots) = small.iter().fold((0u64, 0u64), |(u, n), s| {
        (u + u64::from(s.in_use), n + u64::from(s.slots))
    });
    assert!(small.len() > 1000, "{} spans of 64-byte slots", small.len());
    assert!(
        (0.08..0.15).contains(&(used as f64 / slots as f64)),
        "{used} of {slots} slots"
    );
    // keep_tenth links no heap profiler, which the census reads (stripped too: the
    // linker's switch is found in the code).
    let why = heap.profile.as_ref().unwrap_err();
    assert!(why.contains("linked without the heap profiler"), "{why}");
}

#[test]
fn the_census_of_a_quiet_go_heap_is_the_runtimes_own_accounting() {
    for toolchain in TOOLCHAINS {
        census_is_the_runtimes_own_accounting(toolchain, &[]);
    }
}

/// As shipped: no symbol table, no DWARF. The layouts come from the release table,
/// `runtime.mheap_` from the code; the oldest release the census reads and the newest.
#[test]
fn the_census_of_a_stripped_go_program_is_the_runtimes_own_accounting() {
    for toolchain in ["go1.22.12", "go1.27.3"] {
        census_is_the_runtimes_own_accounting(toolchain, &["-ldflags=-s -w"]);
    }
    // Position-independent: what the code gives is placed by the load bias.
    census_is_the_runtimes_own_accounting("local", &["-buildmode=pie", "-ldflags=-s -w"]);
}

#[test]
fn a_go_program_without_dwarf_or_symbols_is_read_from_the_table_and_its_code() {
    for flags in [["-ldflags=-w"], ["-ldflags=-s"]] {
        let Some(exe) = build("keep_tenth", "local", &flags) else {
            return;
        };
        let elf = std::fs::read(&exe).unwrap();
        let rt = GoRuntime::of_executable(&elf, None).expect("still a Go program");
        assert!(rt.is_ok(), "{flags:?}: {:?}", rt.unwrap_err());
    }
}

/// `elf` with its release ("go1.26.8") replaced everywhere (its build information, the
/// runtime's own string) by another of the same length.
fn with_release(elf: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut patched = elf.to_vec();
    let mut at = 0;
    while let Some(found) = patched[at..]
        .windows(from.len())
        .position(|w| w == from.as_bytes())
    {
        at += found;
        patched[at..at + to.len()].copy_from_slice(to.as_bytes());
    }
    assert!(at > 0, "no {from} in the program");
    patched
}

#[test]
fn a_stripped_go_program_of_a_release_the_table_lacks_is_refused_with_a_note_naming_it() {
    let Some(exe) = build("keep_tenth", "local", &["-ldflags=-s -w"]) else {
        return;
    };
    let elf = std::fs::read(&exe).unwrap();
    let rt = GoRuntime::of_executable(&elf, None).expect("a Go program");
    let version = rt.expect("the installed release is in the table").version;
    // A release after the newest in the table, as its toolchain would write it.
    let unknown = format!("go1.99{}", &version["go1.NN".len()..]);
    let err = GoRuntime::of_executable(&with_release(&elf, &version, &unknown), None)
        .expect("still a Go program")
        .unwrap_err();
    eprintln!("{err}");
    assert!(err.contains("no Go heap census"), "{err}");
    assert!(
        err.contains(&format!("{unknown} is not a release the table holds")),
        "{err}"
    );
}

/// The Go toolchains on this machine: the installed one, and those the go command has
/// fetched already (none is fetched for this).
fn toolchains_here() -> Vec<String> {
    let mut found = vec!["local".to_string()];
    let Some(go) = go() else { return found };
    let out = Command::new(go)
        .args(["env", "GOMODCACHE"])
        .output()
        .unwrap();
    let cache = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if let Ok(dir) = std::fs::read_dir(cache.join("golang.org")) {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let release = name
                .strip_prefix("toolchain@v0.0.1-")
                .and_then(|n| n.strip_suffix(".linux-amd64"));
            if let Some(release) = release.filter(|_| entry.path().join("bin/go").is_file()) {
                found.push(release.to_string());
            }
        }
    }
    found.sort();
    found
}

/// The release table is each release's DWARF: every toolchain here builds keep_tenth,
/// and the table's entry for its release is what its DWARF gives (the entry to write
/// is printed when it is not). Releases before 1.22 are not read.
#[test]
fn the_release_table_is_each_releases_dwarf() {
    let mut checked = Vec::new();
    for toolchain in toolchains_here() {
        let Some(exe) = build("keep_tenth", &toolchain, &[]) else {
            return;
        };
        let elf = std::fs::read(&exe).unwrap();
        let entry = fragscope_census::golang::release_entry(&elf)
            .unwrap_or_else(|e| panic!("{toolchain}: {e}"));
        match entry.agrees {
            Some((true, _)) => checked.push(entry.version),
            Some((false, _)) => panic!(
                "the table's entry for {} is not its DWARF's; the DWARF gives:\n{}",
                entry.version, entry.line
            ),
            None => assert!(
                before_go_1_22(&entry.version),
                "{} is not in the table; its DWARF gives:\n{}",
                entry.version,
                entry.line
            ),
        }
    }
    eprintln!("the table agrees with the DWARF of {checked:?}");
}

fn before_go_1_22(version: &str) -> bool {
    let minor = version
        .strip_prefix("go1.")
        .and_then(|v| v.split('.').next());
    minor
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|m| m < 22)
}

/// What a stripped program's census finds in its code is what the symbol table names,
/// on every toolchain here, in a program without the heap profiler and one with it.
#[test]
fn the_runtimes_variables_found_in_the_code_are_those_its_symbols_name() {
    for toolchain in toolchains_here() {
        for program in ["keep_tenth", "sites"] {
            let Some(exe) = build(program, &toolchain, &[]) else {
                return;
            };
            let elf = std::fs::read(&exe).unwrap();
            let found = fragscope_census::golang::variables_found_in_code(&elf)
                .unwrap_or_else(|e| panic!("{toolchain} {program}: {e}"));
            for v in found {
                let name = v.name;
                let in_code = v.in_code.unwrap_or_else(|| {
                    panic!("{toolchain} {program}: {name} not found in the code")
                });
                // The linker may leave a variable it sets itself out of the table.
                if let Some(symbol) = v.symbol {
                    assert_eq!(in_code, symbol, "{toolchain} {program}: {name}");
                }
            }
        }
    }
}

#[test]
fn the_heap_profile_is_read_with_its_sampled_objects_on_every_release() {
    // Stripped too: the profile's variables found in the code.
    let stripped = ["go1.22.12", "go1.27.3"].map(|t| (t, &["-ldflags=-s -w"][..]));
    for (toolchain, flags) in TOOLCHAINS.map(|t| (t, &[][..])).into_iter().chain(stripped) {
        let Some(exe) = build("sites", toolchain, flags) else {
            return;
        };
        let toolchain = &format!("{toolchain} {flags:?}");
        let tag = format!(
            "{}-{}",
            std::process::id(),
            toolchain.replace(['"', ' ', '[', ']'], "")
        );
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let profile = dir.join(format!("heap-{tag}.pprof"));
        let mut child = Command::new(&exe)
            .arg(dir.join(format!("sites-{tag}.json")))
            .arg(&profile)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let running = Running {
            child,
            stats: serde_json::Value::Null,
        };
        assert!(out
            .lines()
            .map_while(Result::ok)
            .any(|l| l.starts_with("ready")));
        let heap = take(running.child.id());
        let p = heap
            .profile
            .as_ref()
            .unwrap_or_else(|e| panic!("{toolchain}: {e}"));
        assert_eq!(p.rate, 512 * 1024, "{toolchain}");
        // The index's and the cache's samples, each with a stack and still live.
        let live: Vec<_> = (p.buckets.iter())
            .filter(|b| b.allocs > b.frees && !b.stack.is_empty())
            .collect();
        assert!(live.len() >= 2, "{toolchain}: {:?}", p.buckets);
        let sampled_live: u64 = live.iter().map(|b| b.allocs - b.frees).sum();
        // Every sampled object still live has its special in its span; the published
        // profile is the last collection's, so objects sampled since have one too.
        let found = p.objects.len() as u64;
        assert!(
            found >= sampled_live && found <= sampled_live + sampled_live / 10 + 4,
            "{toolchain}: {found} specials, {sampled_live} sampled live"
        );
        let in_spans = (p.objects.iter())
            .filter(|(a, _)| {
                (heap.spans.iter()).any(|s| s.start <= *a && *a < s.start + s.bytes(GO_PAGE))
            })
            .count();
        assert_eq!(in_spans, p.objects.len(), "{toolchain}");
    }
}
