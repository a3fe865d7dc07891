//! JVM programs: `fragscope snapshot PID` of a running JVM and `fragscope record` of one
//! read its Java heap from outside, and the report splits RSS by it: the Java heap
//! against `jcmd GC.heap_info`, the runtime areas beside it, little left as "other
//! anonymous", a headline in the JVM's terms rather than malloc's, and the JVM's native
//! memory tracking by category when it is on.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{report_json, report_text, stderr};

/// tests/java/KeepTenth.java compiled into `dir`; None (with a note) without a JDK.
fn classes(dir: &Path) -> Option<PathBuf> {
    let javac = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/java/KeepTenth.java"))
        .output();
    match javac {
        Ok(o) if o.status.success() => Some(dir.to_path_buf()),
        Ok(o) => panic!("javac: {}", String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            eprintln!("skipped: no JDK (scripts/install-deps.sh installs one)");
            None
        }
    }
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    while !said.lines().any(|l| l.starts_with("ready")) {
        assert!(
            out.read_line(&mut said).unwrap() > 0,
            "KeepTenth said {said:?}"
        );
    }
    Running(child)
}

/// G1's committed and used bytes as `jcmd GC.heap_info` says them.
fn jcmd_g1(pid: u32) -> (u64, u64) {
    let out = Command::new("jcmd")
        .args([&pid.to_string(), "GC.heap_info"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("garbage-first heap"))
        .unwrap_or_else(|| panic!("jcmd said {text}"));
    let kib = |after: &str| -> u64 {
        let at = line.find(after).unwrap() + after.len();
        let digits: String = line[at..]
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<u64>().unwrap() * 1024
    };
    (kib("total"), kib("used"))
}

fn within(ours: u64, theirs: u64, pct: f64, what: &str) {
    let d = (ours as f64 - theirs as f64).abs() / theirs.max(1) as f64 * 100.0;
    assert!(
        d <= pct,
        "{what}: fragscope {ours}, the JVM {theirs} ({d:.2}% apart)"
    );
}

#[test]
fn snapshot_of_a_running_jvm_splits_rss_by_its_java_heap() {
    let dir = tempfile::tempdir().unwrap();
    let Some(classes) = classes(dir.path()) else {
        return;
    };
    let running = run(&classes, &["-XX:+UseG1GC", "-Xmx1g"], &["1000000"]);
    let pid = running.0.id();
    // jcmd first: its attach makes a thread that allocates in eden, before the snapshot.
    let (committed, used) = jcmd_g1(pid);
    let trace = dir.path().join("jvm.fsc");
    common::snapshot(pid, &trace);
    let r = report_json(&trace);
    let s = &r["snapshots"][0];
    let jvm = &s["jvm"];
    assert_eq!(jvm["collector"], "G1", "{jvm}");
    within(
        jvm["committed"].as_u64().unwrap(),
        committed,
        2.0,
        "committed",
    );
    within(jvm["used"].as_u64().unwrap(), used, 2.0, "used");
    let d = s; // the decomposition's parts are the snapshot's fields
    let rss = d["rss"].as_u64().unwrap();
    let java = d["jvm_heap"].as_u64().unwrap();
    assert_eq!(java, jvm["resident"].as_u64().unwrap());
    assert!(d["jvm_runtime"].as_u64().unwrap() > 0, "{d}");
    let other = d["other_anon"].as_u64().unwrap();
    assert!(
        other * 10 < rss,
        "other anonymous {other} of RSS {rss} (the allocator's census: {}): {d}",
        r["snapshot"]["note"]
    );
    // The Java heap's split adds up to its resident bytes.
    let sum: u64 = ["objects", "young_free", "old_free", "free_regions"]
        .iter()
        .map(|k| jvm[k].as_u64().unwrap())
        .sum();
    assert_eq!(sum, java);
    // 100 000 kept records of 80 bytes each are objects.
    assert!(jvm["objects"].as_u64().unwrap() > 8_000_000, "{jvm}");
    let h = &r["headline"];
    assert_eq!(h["heap"], "jvm", "{h}");
    let sentence = h["sentence"].as_str().unwrap();
    assert!(sentence.contains("Java heap"), "{sentence}");
    assert!(
        !sentence.contains("purge/trim"),
        "malloc advice: {sentence}"
    );
    let text = report_text(&trace);
    assert!(text.contains("Java heap (JDK "), "{text}");
    assert!(text.contains("code cache"), "{text}");

    // The snapshot left the JVM's memory as it found it: reading a page never touched
    // maps the kernel's zero page there, which pagemap shows present from then on (the
    // glibc census's search for mmapped chunks once made 16 MiB of untouched regions and
    // thread stacks look resident to the next snapshot).
    let again = dir.path().join("again.fsc");
    common::snapshot(pid, &again);
    let second = report_json(&again);
    let resident = |r: &serde_json::Value| -> u64 {
        r["snapshots"][0]["jvm_heap"].as_u64().unwrap()
            + r["snapshots"][0]["jvm_runtime"].as_u64().unwrap()
    };
    let (first, then) = (resident(&r), resident(&second));
    assert!(
        then <= first + first / 50,
        "the JVM's heap and areas went from {first} to {then} resident bytes between two snapshots"
    );

    // The page shows the same section.
    let Some(dom) = common::rendered_page(&trace, dir.path(), "jvm") else {
        return;
    };
    assert!(dom.contains("Java heap (JDK "), "{dom}");
    assert!(dom.contains("free regions kept"), "{dom}");
    assert!(dom.contains("Java thread stacks"), "{dom}");
}

#[test]
fn record_of_a_jvm_takes_its_heap_census_at_its_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let Some(classes) = classes(dir.path()) else {
        return;
    };
    let trace = dir.path().join("rec.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "250", "-o"])
        .arg(&trace)
        .args(["--", "java", "-XX:+UseParallelGC", "-Xmx512m"])
        .arg("-XX:NativeMemoryTracking=summary")
        .arg("-cp")
        .arg(&classes)
        .args(["KeepTenth", "1000000", "plain", "1500"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r = report_json(&trace);
    let with_census: Vec<&serde_json::Value> = (r["snapshots"].as_array().unwrap().iter())
        .filter(|s| !s["jvm"].is_null())
        .collect();
    assert!(
        with_census.len() >= 3,
        "{} snapshots with a census",
        with_census.len()
    );
    for s in &with_census {
        let d = s;
        let (rss, other) = (
            d["rss"].as_u64().unwrap(),
            d["other_anon"].as_u64().unwrap(),
        );
        assert!(
            other * 10 < rss,
            "other anonymous {other} of RSS {rss}: {d}"
        );
        let jvm = &s["jvm"];
        assert_eq!(jvm["collector"], "Parallel");
        // Native memory tracking is on: the JVM's own categories, asked through its
        // attach mechanism, beside the census; its Java heap is the census's.
        let nmt = jvm["native_memory"].as_array().unwrap();
        let heap = (nmt.iter())
            .find(|c| c["category"] == "Java Heap")
            .unwrap_or_else(|| panic!("{jvm}"));
        within(
            jvm["committed"].as_u64().unwrap(),
            heap["committed"].as_u64().unwrap(),
            2.0,
            "committed against native memory tracking",
        );
        assert!(nmt.iter().any(|c| c["category"] == "GC"), "{nmt:?}");
    }
    // The malloc calls are traced beside the census: the JVM's native memory.
    assert!(r["calls"].as_u64().unwrap() > 1000, "{}", r["calls"]);
    // Peak live counts the Java objects (100 000 kept records at least).
    let peak_live = &r["headline"]["peak_live"];
    assert!(peak_live.as_u64().unwrap() > 8_000_000, "{peak_live}");
    assert_eq!(r["headline"]["heap"], "jvm", "{}", r["headline"]);
}

#[test]
fn humongous_objects_are_counted_with_their_regions() {
    let dir = tempfile::tempdir().unwrap();
    let Some(classes) = classes(dir.path()) else {
        return;
    };
    let running = run(
        &classes,
        &["-XX:+UseG1GC", "-Xmx512m", "-XX:G1HeapRegionSize=1m"],
        &["10000", "humongous"],
    );
    let trace = dir.path().join("humongous.fsc");
    common::snapshot(running.0.id(), &trace);
    let r = report_json(&trace);
    let jvm = &r["snapshots"][0]["jvm"];
    assert_eq!(jvm["humongous_objects"], 16, "{jvm}");
    // Three regions each: 2.2 MiB of array, the rest of the third a filler object whose
    // pages are never touched.
    assert_eq!(jvm["humongous_regions"], 48, "{jvm}");
    let resident = jvm["humongous_resident"].as_u64().unwrap();
    assert!(
        (16 * (2 << 20)..16 * (5 << 19)).contains(&resident),
        "{resident} of the humongous regions resident"
    );
    let text = report_text(&trace);
    assert!(
        text.contains("16 humongous objects take 48 regions"),
        "{text}"
    );
}
