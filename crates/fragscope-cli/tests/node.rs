//! Node.js programs: `fragscope record` of a Node program gets its V8 heap as V8 counts it
//! at each snapshot (a module the recorder has Node load, NODE_OPTIONS=--require), and
//! `fragscope snapshot PID` of a running one asks it through Node's inspector; the report
//! splits RSS by it: the V8 heap beside malloc's, little left as "other anonymous", and a
//! headline in V8's terms rather than malloc's.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{fragscope, report_json, report_text, stderr};

fn node_installed() -> bool {
    let there = Command::new("node").arg("--version").output().is_ok();
    if !there {
        eprintln!("skipped: node is not installed");
    }
    there
}

fn keep_tenth() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/node/keep_tenth.js")
}

/// `node`'s own old space figure `key` in the JSON line keep_tenth.js printed.
fn own_old_space(line: &str, key: &str) -> u64 {
    let own: serde_json::Value = serde_json::from_str(line).unwrap();
    (own["spaces"].as_array().unwrap().iter())
        .find(|s| s["space_name"] == "old_space")
        .map_or(0, |s| s[key].as_u64().unwrap())
}

fn within(ours: u64, theirs: u64, pct: f64, what: &str) {
    let d = (ours as f64 - theirs as f64).abs() / theirs.max(1) as f64 * 100.0;
    assert!(
        d <= pct,
        "{what}: fragscope {ours}, V8 {theirs} ({d:.2}% apart)"
    );
}

/// keep_tenth.js run by `node` with `flags`, idle for a minute once ready: the process,
/// and the line in which it printed its own V8 heap.
fn running_keep_tenth(flags: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new("node")
        .args(flags)
        .arg("--expose-gc")
        .arg(keep_tenth())
        .args(["1000000", "60000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    (child, ready)
}

#[test]
fn record_of_a_node_program_splits_rss_by_its_v8_heap() {
    if !node_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("node.fsc");
    let program = keep_tenth();
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "250", "-o"])
        .arg(&trace)
        .args(["--", "node", "--expose-gc"])
        .arg(&program)
        .args(["1000000", "1500"])
        .env("NODE_OPTIONS", "--max-old-space-size=2048")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // The program's own view of its heap once it settled, as its first line says it.
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let own: serde_json::Value =
        serde_json::from_str(said.lines().find(|l| l.contains("\"ready\"")).unwrap()).unwrap();
    let own_space = |name: &str, key: &str| -> u64 {
        (own["spaces"].as_array().unwrap().iter())
            .find(|s| s["space_name"] == name)
            .map_or(0, |s| s[key].as_u64().unwrap())
    };
    let r = report_json(&trace);
    let snapshots = r["snapshots"].as_array().unwrap();
    // The last snapshot of the idle stretch: the heap as the program printed it.
    let idle = (snapshots.iter().rev())
        .find(|s| !s["v8"].is_null())
        .unwrap_or_else(|| panic!("no V8 census: {}", stderr(&out)));
    let v8 = &idle["v8"];
    let space = (v8["spaces"].as_array().unwrap().iter())
        .find(|s| s["space"] == "old_space")
        .unwrap();
    // Used is V8's count at the snapshot, up to 1.5 s after the program's own: the
    // module's writes every 100 ms leave garbage that scavenges promote into old space
    // until the next mark-compact (2.07% more once, under the whole suite's load).
    within(
        space["used"].as_u64().unwrap(),
        own_space("old_space", "space_used_size"),
        3.0,
        "old space used",
    );
    within(
        space["size"].as_u64().unwrap(),
        own_space("old_space", "space_size"),
        2.0,
        "old space committed",
    );
    within(
        v8["heap_size_limit"].as_u64().unwrap() >> 20,
        2048 + 48,
        5.0,
        "the old generation's limit (--max-old-space-size, which Node's own NODE_OPTIONS kept)",
    );
    let (rss, other) = (
        idle["rss"].as_u64().unwrap(),
        idle["other_anon"].as_u64().unwrap(),
    );
    assert!(other * 10 < rss, "other anonymous {other} of RSS {rss}");
    assert_eq!(idle["v8_heap"], v8["physical"]);
    // Its malloc calls are traced beside it.
    assert!(r["calls"].as_u64().unwrap() > 1000);
    let h = &r["headline"];
    assert_eq!(h["heap"], "v8", "{h}");
    let sentence = h["sentence"].as_str().unwrap();
    assert!(sentence.contains("V8 heap"), "{sentence}");
    assert!(
        !sentence.contains("purge/trim"),
        "malloc advice: {sentence}"
    );
    assert!(report_text(&trace).contains("V8 heap (Node v"));
}

#[test]
fn snapshot_of_a_running_node_program_asks_its_inspector() {
    if !node_installed() {
        return;
    }
    let (mut child, ready) = running_keep_tenth(&[]);
    let pid = child.id();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("snap.fsc");
    let snap = fragscope(&[
        "snapshot".as_ref(),
        pid.to_string().as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(snap.status.success(), "{}", stderr(&snap));
    assert!(still_running, "the program ended");
    let r = report_json(&trace);
    let s = &r["snapshots"][0];
    let v8 = &s["v8"];
    let old = (v8["spaces"].as_array().unwrap().iter())
        .find(|x| x["space"] == "old_space")
        .unwrap_or_else(|| panic!("{r}"));
    within(
        old["size"].as_u64().unwrap(),
        own_old_space(&ready, "space_size"),
        2.0,
        "old space committed",
    );
    // The program's own reading is from before the inspector's session, whose evaluation
    // allocates objects of its own in the same heap.
    within(
        old["used"].as_u64().unwrap(),
        own_old_space(&ready, "space_used_size"),
        5.0,
        "old space used",
    );
    let (rss, other) = (
        s["rss"].as_u64().unwrap(),
        s["other_anon"].as_u64().unwrap(),
    );
    assert!(other * 10 < rss, "other anonymous {other} of RSS {rss}");
    // The headline is V8's. (A Node process's main arena is sometimes not contiguous, V8's
    // reservations next to the brk heap: the glibc census reads it whole.)
    assert_eq!(r["headline"]["heap"], "v8", "{}", r["headline"]);
    assert!(r["snapshot"]["glibc"].is_object(), "{}", r["snapshot"]);
    // The inspector it opened is closed again.
    let list = std::net::TcpStream::connect("127.0.0.1:9229")
        .ok()
        .map(|mut c| {
            use std::io::{Read, Write};
            let _ = c.write_all(b"GET /json/list HTTP/1.0\r\n\r\n");
            let mut text = String::new();
            let _ = c.read_to_string(&mut text);
            text
        });
    assert!(
        list.is_none_or(|t| !t.contains(&format!("[{pid}]"))),
        "the inspector of {pid} is still open"
    );
}

#[test]
fn record_p_of_a_running_node_program_asks_its_inspector_at_each_snapshot() {
    if !node_installed() {
        return;
    }
    // Its own port, so that the other test's inspector on 9229 is not in its way.
    let (mut child, ready) = running_keep_tenth(&["--inspect-port=0"]);
    let pid = child.id();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("attached.fsc");
    let rec = fragscope(&[
        "record".as_ref(),
        "-p".as_ref(),
        pid.to_string().as_ref(),
        "--duration".as_ref(),
        "2".as_ref(),
        "-o".as_ref(),
        trace.as_os_str(),
    ]);
    let still_running = child.try_wait().unwrap().is_none();
    let ports = fragscope_census::v8_inspector::listening_ports(pid);
    let _ = child.kill();
    let _ = child.wait();
    let err = stderr(&rec);
    assert!(rec.status.success(), "{err}");
    assert!(err.contains("asked through its"), "{err}");
    assert!(still_running, "the program ended");
    assert!(ports.is_empty(), "the inspector still listens: {ports:?}");
    let r = report_json(&trace);
    let asked: Vec<&serde_json::Value> = (r["snapshots"].as_array().unwrap().iter())
        .filter(|s| s["v8"].is_object())
        .collect();
    assert!(!asked.is_empty(), "no snapshot has V8 figures: {r}");
    // The recording's end is taken before the detach, while the process runs: its V8
    // heap is asked there too.
    let last = r["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(last["reason"], "exit", "{last}");
    assert!(
        last["v8"].is_object(),
        "the end snapshot has no V8 figures: {last}"
    );
    for s in asked {
        let old = (s["v8"]["spaces"].as_array().unwrap().iter())
            .find(|x| x["space"] == "old_space")
            .unwrap();
        within(
            old["size"].as_u64().unwrap(),
            own_old_space(&ready, "space_size"),
            2.0,
            "old space committed",
        );
        let (rss, other) = (
            s["rss"].as_u64().unwrap(),
            s["other_anon"].as_u64().unwrap(),
        );
        assert!(other * 10 < rss, "other anonymous {other} of RSS {rss}");
    }
    assert_eq!(r["headline"]["heap"], "v8", "{}", r["headline"]);
}

/// The V8 space `name`'s figure `key` in a line of `v8.getHeapSpaceStatistics()`.
fn own_space(line: &serde_json::Value, name: &str, key: &str) -> u64 {
    (line["spaces"].as_array().unwrap().iter())
        .find(|s| s["space_name"] == name)
        .map_or(0, |s| s[key].as_u64().unwrap())
}

#[test]
fn record_of_a_node_service_under_load_follows_its_v8_heap() {
    if !node_installed() {
        return;
    }
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/node");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("service.fsc");
    let mut rec = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "--stacks", "none", "--snapshot-ms", "250", "-o"])
        .arg(&trace)
        .args(["--", "node"])
        .arg(node.join("session_service.js"))
        .arg("1000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    said.read_line(&mut line).unwrap();
    let port: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("the service said {line:?}"));
    // Eight clients for four seconds, then /quit.
    let load = Command::new("node")
        .arg(node.join("load.js"))
        .arg(port["port"].to_string())
        .args(["4", "8"])
        .output()
        .unwrap();
    let out = rec.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let load: serde_json::Value = serde_json::from_slice(&load.stdout).unwrap();
    assert!(load["requests"].as_u64().unwrap() > 1000, "{load}");
    assert_eq!(load["failed"], 0, "{load}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut said, &mut rest).unwrap();
    let quiet: serde_json::Value = serde_json::from_str(
        rest.lines()
            .find(|l| l.contains("\"quiet\""))
            .unwrap_or_else(|| panic!("the service said {rest:?}")),
    )
    .unwrap();

    let r = report_json(&trace);
    let snapshots = r["snapshots"].as_array().unwrap();
    // Under load the module's timer still runs between requests: the periodic snapshots
    // once it is loaded have V8's figures (a few may find them older than two intervals,
    // when the machine is busy with other tests too).
    let periodic: Vec<&serde_json::Value> = (snapshots.iter())
        .filter(|s| s["reason"] == "periodic" && s["t_ms"].as_f64().unwrap() > 500.0)
        .collect();
    let with_v8 = periodic.iter().filter(|s| s["v8"].is_object()).count();
    assert!(
        periodic.len() >= 12 && with_v8 * 10 >= periodic.len() * 8,
        "{with_v8} of {} periodic snapshots have V8 figures",
        periodic.len()
    );
    // V8's heap leaves little unexplained: other anonymous under a tenth of RSS at most
    // snapshots. Not at every one: V8's figures are those its timer last posted, and a
    // heap that grew since shows as other anonymous until the next (0.4% to 14.7% at the
    // worst snapshot of a run, in 6 runs; 10.3% failed CI once when every snapshot had to
    // be under a tenth). Without V8's heap it would be most of RSS.
    let v8: Vec<(u64, u64, f64)> = (periodic.iter().filter(|s| s["v8"].is_object()))
        .map(|s| {
            let (rss, other) = (
                s["rss"].as_u64().unwrap(),
                s["other_anon"].as_u64().unwrap(),
            );
            (rss, other, s["t_ms"].as_f64().unwrap())
        })
        .collect();
    let under_a_tenth = v8
        .iter()
        .filter(|&&(rss, other, _)| other * 10 < rss)
        .count();
    assert!(
        under_a_tenth * 10 >= v8.len() * 8,
        "{under_a_tenth} of {}: {v8:?}",
        v8.len()
    );
    for &(rss, other, t) in &v8 {
        assert!(
            other * 4 < rss,
            "at {t} ms: other anonymous {other} of RSS {rss}"
        );
    }
    // The last one is in the quiet second after the load, when the service printed its
    // own figures.
    let last = periodic.iter().rev().find(|s| s["v8"].is_object()).unwrap();
    for name in ["old_space", "new_space"] {
        let space = (last["v8"]["spaces"].as_array().unwrap().iter())
            .find(|s| s["space"] == name)
            .unwrap();
        within(
            space["size"].as_u64().unwrap(),
            own_space(&quiet, name, "space_size"),
            2.0,
            &format!("{name} committed"),
        );
        // Up to a second apart: the module's own writes allocate in the same heap
        // meanwhile, in new space until a scavenge. Right after one, new space holds a
        // few hundred KiB, of which that garbage is a large share (17% once): its used
        // bytes are compared as a share of the space.
        let (ours, theirs) = (
            space["used"].as_u64().unwrap(),
            own_space(&quiet, name, "space_used_size"),
        );
        if name == "new_space" {
            let size = own_space(&quiet, name, "space_size");
            assert!(
                ours.abs_diff(theirs) * 50 <= size,
                "new_space used: fragscope {ours}, V8 {theirs}, of {size} (over 2% of the space)"
            );
        } else {
            within(ours, theirs, 3.0, "old_space used");
        }
    }
    assert_eq!(r["headline"]["heap"], "v8", "{}", r["headline"]);
}
