//! A HotSpot JVM's heap, read from outside a running Java program and checked against
//! what the JVM says of itself at the same quiet moment (`jcmd PID GC.heap_info` after
//! the program's System.gc()), under each collector the census reads.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use fragscope_census::jvm::{census, Collector, HotSpot};
use fragscope_census::{Pause, ProcessMemory};
use fragscope_trace::jvm_heap::{JvmAreaKind, JvmCollector, JvmHeap, JvmSpaceKind};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// tests/java/KeepTenth.java compiled once for every test (tests run at once: one
/// compiling while another starts a JVM on the class gave it half a file); None (with a
/// note) without a JDK.
fn classes() -> Option<PathBuf> {
    static CLASSES: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    CLASSES
        .get_or_init(|| {
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("java-classes");
            let javac = Command::new("javac")
                .arg("-d")
                .arg(&out)
                .arg(repo().join("tests/java/KeepTenth.java"))
                .output();
            match javac {
                Ok(o) if o.status.success() => Some(out),
                Ok(o) => panic!("javac: {}", String::from_utf8_lossy(&o.stderr)),
                Err(_) => {
                    eprintln!("skipped: no JDK (scripts/install-deps.sh installs one)");
                    None
                }
            }
        })
        .clone()
}

struct Running {
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// KeepTenth under `flags`, once it says it is ready.
fn run(classes: &Path, flags: &[&str], args: &[&str]) -> Running {
    let mut child = Command::new("java")
        .args(flags)
        .arg("-cp")
        .arg(classes)
        .arg("KeepTenth")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The JVM may warn on its standard output first.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    while !said.lines().any(|l| l.starts_with("ready")) {
        assert!(
            out.read_line(&mut said).unwrap() > 0,
            "KeepTenth said {said:?}"
        );
    }
    Running { child }
}

/// (committed, used) bytes of the heap as `jcmd GC.heap_info` gives them: G1's "total"
/// and "used"; for the generational collectors, every space's size (eden, from, to,
/// the old generation's) and each generation's "used".
fn jcmd_heap(pid: u32) -> (u64, u64) {
    let out = Command::new("jcmd")
        .arg(pid.to_string())
        .arg("GC.heap_info")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let kib = |s: &str| -> u64 {
        s.trim_end_matches(',')
            .trim_end_matches('K')
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let (mut committed, mut used, mut spaces) = (0, 0, 0);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if *w == "total" && !line.contains("Metaspace") && !line.contains("class space") {
                committed += kib(words[i + 1]);
            }
            if *w == "used" && i > 0 && words[i - 1].ends_with("K,") && !line.contains("Metaspace")
            {
                used += kib(words[i + 1]);
            }
            if *w == "space" && i + 1 < words.len() && words[i + 1].ends_with("K,") {
                spaces += kib(words[i + 1]);
            }
        }
    }
    let g1 = text.contains("garbage-first heap");
    (if g1 { committed } else { spaces }, used)
}

fn read_census(pid: u32) -> JvmHeap {
    let jvm = HotSpot::detect(pid).expect("a JVM").unwrap();
    let mut mem = ProcessMemory::open(pid).unwrap();
    let _pause = Pause::stop(pid).unwrap();
    census(&mut mem, &jvm).unwrap()
}

fn within(ours: u64, theirs: u64, pct: f64, what: &str) {
    let d = (ours as f64 - theirs as f64).abs() / theirs.max(1) as f64 * 100.0;
    assert!(
        d <= pct,
        "{what}: census {ours}, JVM {theirs} ({d:.2}% apart)"
    );
}

#[test]
fn heap_matches_the_jvm_under_g1_parallel_and_serial() {
    let Some(classes) = classes() else { return };
    for (flag, collector) in [
        ("-XX:+UseG1GC", JvmCollector::G1),
        ("-XX:+UseParallelGC", JvmCollector::Parallel),
        ("-XX:+UseSerialGC", JvmCollector::Serial),
    ] {
        let running = run(&classes, &[flag, "-Xmx1g"], &["1000000"]);
        let pid = running.child.id();
        let (committed, used) = jcmd_heap(pid);
        let heap = read_census(pid);
        eprintln!(
            "{flag}: JVM {committed} committed {used} used; census {} committed ({} own) {} used ({} own), {} spaces, {:?}",
            heap.spaces.iter().map(|s| s.bytes()).sum::<u64>(),
            heap.committed,
            heap.spaces.iter().map(|s| s.used()).sum::<u64>(),
            heap.used,
            heap.spaces.len(),
            heap.areas.iter().map(|a| (a.0, a.2 - a.1)).take(4).collect::<Vec<_>>()
        );
        assert_eq!(heap.collector, collector);
        assert!(
            heap.jvm.starts_with(char::is_numeric),
            "release {:?}",
            heap.jvm
        );
        assert_eq!(heap.max_heap, 1 << 30, "-Xmx1g");
        let spaces: u64 = heap.spaces.iter().map(|s| s.bytes()).sum();
        let in_use: u64 = heap.spaces.iter().map(|s| s.used()).sum();
        within(spaces, committed, 2.0, &format!("{flag} committed"));
        within(in_use, used, 2.0, &format!("{flag} used"));
        // 100 000 records of 40 + 40 bytes survive the collection.
        assert!(in_use > 8_000_000, "{flag}: {in_use} bytes used");
        assert!(heap
            .spaces
            .iter()
            .any(|s| s.kind == JvmSpaceKind::Old && s.used() > 0));
        let stacks = heap
            .areas
            .iter()
            .filter(|a| a.0 == JvmAreaKind::ThreadStack);
        assert!(
            stacks.count() >= 2,
            "the main thread and the JVM's own Java threads"
        );
        assert!(heap.areas.iter().any(|a| a.0 == JvmAreaKind::CodeCache));
        assert!(heap.areas.iter().any(|a| a.0 == JvmAreaKind::CardTable));
    }
}

#[test]
fn humongous_objects_take_whole_regions() {
    let Some(classes) = classes() else { return };
    let running = run(
        &classes,
        &["-XX:+UseG1GC", "-Xmx512m", "-XX:G1HeapRegionSize=1m"],
        &["10000", "humongous"],
    );
    let heap = read_census(running.child.id());
    assert_eq!(heap.region_bytes, 1 << 20);
    let starts: Vec<_> = (heap.spaces.iter())
        .filter(|s| s.kind == JvmSpaceKind::HumongousStart)
        .collect();
    let continues = (heap.spaces.iter())
        .filter(|s| s.kind == JvmSpaceKind::HumongousContinues)
        .count();
    // 16 arrays of 2.2 regions: 3 regions each, the last 20% used.
    assert_eq!(starts.len(), 16, "{:?}", heap.spaces);
    assert_eq!(continues, 32);
    assert!(starts.iter().all(|s| s.used() == s.bytes()));
}

#[test]
fn a_process_without_a_jvm_is_not_one() {
    assert!(HotSpot::detect(std::process::id()).is_none());
    let Some(classes) = classes() else { return };
    let running = run(
        &classes,
        &["-XX:+UnlockExperimentalVMOptions", "-XX:+UseEpsilonGC"],
        &["1000"],
    );
    let pid = running.child.id();
    let jvm = HotSpot::detect(pid).unwrap().unwrap();
    assert_eq!(jvm.collector, Collector::Other("Epsilon"));
    let mut mem = ProcessMemory::open(pid).unwrap();
    let refused = census(&mut mem, &jvm).unwrap_err().to_string();
    assert!(refused.contains("Epsilon"), "{refused}");
}
