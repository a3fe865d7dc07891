//! GHC programs: `fragscope report` on eventlogs alone (the fixtures of fragscope-ghc), and
//! the acceptance case of seed 000 — ../shared/cases/ghc/Pinned.hs built with Debian's ghc
//! and recorded, strip (every 10th ByteString kept: pinned blocks stay) vs take (the first
//! tenth kept: whole blocks freed).

mod common;

use common::report_json;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use fragscope_ghc::{EventKind, Eventlog};
use serde_json::Value;

const FRAGSCOPE: &str = env!("CARGO_BIN_EXE_fragscope");
const MIB: f64 = 1024.0 * 1024.0;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fragscope-ghc/tests/fixtures/{name}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// (HEAP_LIVE values, HEAP_SIZE values) of an eventlog.
fn heap_series(path: &Path) -> (Vec<u64>, Vec<u64>) {
    let log = Eventlog::parse(&std::fs::read(path).unwrap()).unwrap();
    let mut live = Vec::new();
    let mut size = Vec::new();
    for e in &log.events {
        match e.kind {
            EventKind::HeapLive { bytes, .. } => live.push(bytes),
            EventKind::HeapSize { bytes, .. } => size.push(bytes),
            _ => {}
        }
    }
    (live, size)
}

fn plateaus(report: &Value) -> Vec<&Value> {
    report["phases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "plateau")
        .collect()
}

/// Bytes held by the block groups of `kind` ("nursery", "compact regions", ...) in a
/// census of the report's JSON.
fn kind_held(census: &Value, kind: &str) -> u64 {
    census["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == kind)
        .map_or(0, |k| u(&k["held"]))
}

/// The block censuses taken within `phase`.
fn censuses_in<'a>(report: &'a Value, phase: &Value) -> Vec<&'a Value> {
    let (from, to) = (
        phase["start_ms"].as_f64().unwrap(),
        phase["end_ms"].as_f64().unwrap(),
    );
    report["block_censuses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| (from..=to).contains(&c["t_ms"].as_f64().unwrap()))
        .collect()
}

#[test]
fn an_eventlog_alone_is_reported_without_rss() {
    for mode in ["strip", "take"] {
        let path = fixture(&format!("pinned-{mode}-200000.eventlog"));
        let r = report_json(&path);
        assert_eq!(r["rss_recorded"], false);
        assert!(r["notes"][0].as_str().unwrap().contains("no RSS"), "{r}");
        assert_eq!(r["ghc_version"], "9.0.2");
        let (live, size) = heap_series(&path);
        assert_eq!(u(&r["gc"]["memory_in_use"]), *size.iter().max().unwrap());
        assert!(u(&r["gc"]["max_residency"]) <= *live.iter().max().unwrap());
        assert!(u(&r["gc"]["max_residency"]) > 20 << 20);
        let gens = r["gc"]["generations"].as_array().unwrap();
        assert_eq!(gens.len(), 2, "{gens:?}");
        // The eventlog gives the whole GC table.
        for k in ["elapsed_ms", "gc_ms", "mutator_ms"] {
            assert!(r["gc"][k].as_f64().unwrap() > 0.0, "{k}: {}", r["gc"]);
        }
        for k in [
            "allocated_bytes",
            "copied_bytes",
            "max_slop",
            "fragmentation_at_peak",
            "max_fragmentation",
        ] {
            u(&r["gc"][k]);
        }
        // Unknown only before the RTS posted them (HEAP_LIVE comes with the first major
        // collection, a few milliseconds in), then numbers to the end.
        let timeline = r["timeline"].as_array().unwrap();
        let first_known = |k: &str| {
            let i = timeline.iter().position(|p| !p[k].is_null()).unwrap();
            assert!(
                timeline[i..].iter().all(|p| !p[k].is_null()),
                "{mode}: {k} unknown after it was posted"
            );
            assert!(timeline[i]["t_ms"].as_f64().unwrap() < 10.0, "{mode}: {k}");
            i
        };
        let known = first_known("heap_size").max(first_known("live"));
        for p in &timeline[known..] {
            assert!(p["rss"].is_null());
            let d = fragscope_heap_parts(p);
            assert_eq!(d, u(&p["heap_size"]));
        }
        for p in r["phases"].as_array().unwrap() {
            u(&p["live_max"]);
            u(&p["heap_size_max"]);
        }
        let ps = plateaus(&r);
        assert!(ps.len() >= 2, "{mode}: {ps:?}");
        let last = ps.last().unwrap();
        let top = &last["closure_types"][0];
        if mode == "strip" {
            // Seed 000: ARR_WORDS dominates the second plateau, kept by pinned blocks.
            assert_eq!(top["label"], "ARR_WORDS", "{last}");
            assert!(last["pinned_note"]
                .as_str()
                .unwrap()
                .contains("pinned blocks"));
        } else {
            assert!(last["pinned_note"].is_null(), "{last}");
        }
    }
}

/// Heap size rebuilt from the parts at one timeline point: live, plus blocks in use
/// beyond it, plus free blocks (GC frag).
fn fragscope_heap_parts(p: &Value) -> u64 {
    let heap = u(&p["heap_size"]);
    let frag = p["gc_frag"].as_u64().unwrap_or(0).min(heap);
    let in_use = heap - frag;
    let live = u(&p["live"]).min(in_use);
    live + (in_use - live) + frag
}

#[test]
fn a_file_that_is_neither_trace_nor_eventlog_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.eventlog");
    std::fs::write(&path, b"hdrbxxxx").unwrap();
    let out = Command::new(FRAGSCOPE)
        .arg("report")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("eventlog"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Builds Pinned.hs with `ghc -O -rtsopts -eventlog` (and, with `eventlog` false,
/// without -eventlog); `None` when ghc or the case is missing. From GHC 9.4 on, the
/// bytestring it ships returns one static ByteString per byte value from `singleton`,
/// so the case keeps no pinned block at all; there each element is copied into a pinned
/// buffer of its own (`BS.copy`), which is what `singleton` allocated before.
fn build_pinned(dir: &Path, eventlog: bool) -> Option<PathBuf> {
    let mut src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cases/ghc/Pinned.hs");
    if common::ghc_version().is_some_and(|v| v >= (9, 4)) {
        let text = std::fs::read_to_string(&src).ok()?;
        assert!(text.contains("BS.singleton x"), "Pinned.hs changed: {text}");
        src = dir.join("Pinned.hs");
        std::fs::write(
            &src,
            text.replace("BS.singleton x", "BS.copy (BS.singleton x)"),
        )
        .unwrap();
    }
    let (tag, flags): (&str, &[&str]) = if eventlog {
        ("eventlog", &["-eventlog"])
    } else {
        ("plain", &[])
    };
    common::build_ghc(dir, &src, &format!("Pinned-{tag}"), flags)
}

/// `fragscope record --ghc-heap-profile` of `exe n mode +RTS -s`: (trace, fragscope's
/// and the RTS's stderr).
fn record(dir: &Path, exe: &Path, n: u32, mode: &str) -> (PathBuf, String) {
    let trace = dir.join(format!("{mode}.fsc"));
    let out = Command::new(FRAGSCOPE)
        .current_dir(dir)
        .arg("record")
        .arg("--ghc-heap-profile")
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(exe)
        .args([&n.to_string(), mode, "+RTS", "-s", "-RTS"])
        .env_remove("GHCRTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "record failed: {stderr}");
    (trace, stderr)
}

/// A number before `label` on a line of `+RTS -s` ("223,903,464 bytes maximum residency").
fn rts_s_figure(stderr: &str, label: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no '{label}' in: {stderr}"));
    line.split_whitespace()
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap()
}

#[test]
fn pinned_strip_keeps_three_times_the_memory_outside_live_data_of_take() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_pinned(dir.path(), true) else {
        return;
    };
    const N: u32 = 2_000_000;
    let seed_000_holds = common::ghc_version().is_some_and(|v| v < (9, 4));
    let mut outside = Vec::new();
    for mode in ["strip", "take"] {
        let (trace, stderr) = record(dir.path(), &exe, N, mode);
        let eventlog = dir.path().join(format!("{mode}.eventlog"));
        assert!(stderr.contains("GHC eventlog written"), "{stderr}");
        let r = report_json(&trace);
        assert_eq!(r["rss_recorded"], true, "{mode}");
        assert_eq!(r["argv"][1], N.to_string());

        // Seed 000's two plateaus: the first holds the whole superset, the second a tenth.
        let ps = plateaus(&r);
        assert!(ps.len() >= 2, "{mode}: {:#}", r["phases"]);
        let first = ps
            .iter()
            .max_by_key(|p| u(&p["live_max"]))
            .copied()
            .unwrap();
        let second = *ps.last().unwrap();
        assert!(u(&first["live_max"]) > 150 << 20, "{first}");
        assert!(
            u(&second["decomposition"]["live"]) * 2 < u(&first["live_max"]),
            "{mode}: {second}"
        );
        assert!(second["start_ms"].as_f64() > first["start_ms"].as_f64());

        // The figures are the eventlog's and /proc's.
        let d = &second["decomposition"];
        let (live, size) = heap_series(&eventlog);
        assert!(live.contains(&u(&d["live"])), "{mode}: {d}");
        assert!(size.contains(&u(&d["heap_size"])), "{mode}: {d}");
        let rss = u(&d["rss"]);
        let lazy = u(&d["lazy_free"]);
        assert_eq!(u(&d["rss_minus_lazy_free"]), rss - lazy);
        assert_eq!(u(&d["outside_live"]), rss - lazy - u(&d["live"]));
        let parts: u64 = [
            "live",
            "copy_reserve_and_slop",
            "free_resident_pages",
            "lazy_free",
            "other_anon",
            "file",
        ]
        .iter()
        .map(|k| u(&d[k]))
        .sum();
        let unexplained = d["unexplained"].as_i64().unwrap();
        assert_eq!(parts as i64 + unexplained, rss as i64, "{d}");
        assert!(unexplained.unsigned_abs() < rss / 20, "{mode}: {d}");

        // And agree with the RTS's own summary where it reports the same quantity.
        let g = &r["gc"];
        assert_eq!(
            u(&g["max_residency"]),
            rts_s_figure(&stderr, "bytes maximum residency"),
            "{mode}"
        );
        assert_eq!(
            u(&g["memory_in_use"]) >> 20,
            rts_s_figure(&stderr, "MiB total memory in use"),
            "{mode}"
        );
        assert_eq!(
            u(&g["copied_bytes"]),
            rts_s_figure(&stderr, "bytes copied during GC"),
            "{mode}"
        );
        eprintln!(
            "{mode}: second plateau at {:.2} s: RSS {:.1} MiB, LazyFree {:.1} MiB, live {:.1} \
             MiB, heap {:.1} MiB, free blocks {:.1} MiB, outside live {:.1} MiB",
            second["snapshot_t_ms"].as_f64().unwrap() / 1000.0,
            rss as f64 / MIB,
            lazy as f64 / MIB,
            u(&d["live"]) as f64 / MIB,
            u(&d["heap_size"]) as f64 / MIB,
            u(&d["free_resident_pages"]) as f64 / MIB,
            u(&d["outside_live"]) as f64 / MIB
        );
        if mode == "strip" && seed_000_holds {
            assert!(second["pinned_note"].is_string(), "{second}");
        }
        outside.push(u(&d["outside_live"]));
    }
    if !seed_000_holds {
        // From 9.4 the run takes a second, its RTS hands freed megablocks back at once
        // (LazyFree) and -hT counts pinned objects, not their blocks: the strip keeps
        // about 2.5 times the take's memory outside live data, not 3, and its short
        // second plateau needs censuses every 100 ms. There the censuses name the pinned
        // blocks for the strip, and not for the take.
        let mut settled_pinned = Vec::new();
        for (mode, pinned) in [("strip", true), ("take", false)] {
            let trace = dir.path().join(format!("{mode}-censuses.fsc"));
            record_in(
                dir.path(),
                &["--snapshot-ms", "100"],
                &trace,
                &[
                    exe.as_os_str(),
                    OsStr::new(&N.to_string()),
                    OsStr::new(mode),
                ],
            );
            let r = report_json(&trace);
            // Where memory settled, the strip keeps its survivors' pinned blocks.
            let settled = plateaus(&r)
                .last()
                .copied()
                .unwrap_or_else(|| panic!("{r}"));
            let census = &settled["block_census"];
            assert!(
                census.is_object(),
                "{mode}: no census on the last plateau: {settled}"
            );
            settled_pinned.push(u(&census["pinned_blocks"]));
            // Naming them needs a census whose references were scanned there (on a
            // loaded machine a collection can spoil every scan of a short plateau).
            let scanned = censuses_in(&r, settled)
                .iter()
                .any(|c| !c["pinned_live"].is_null());
            let headline = r["headline"].as_str().unwrap_or_default();
            if scanned || !pinned {
                assert_eq!(
                    headline.contains("of pinned blocks hold only"),
                    pinned,
                    "{mode}: {headline}"
                );
            }
        }
        assert!(
            settled_pinned[0] >= 5 * settled_pinned[1],
            "pinned blocks where memory settled: strip {}, take {}",
            settled_pinned[0],
            settled_pinned[1]
        );
        return;
    }
    assert!(
        outside[0] >= 3 * outside[1],
        "strip keeps {} MiB outside live data, take {} MiB",
        outside[0] >> 20,
        outside[1] >> 20
    );
}

#[test]
fn a_ghc_program_without_eventlog_is_recorded_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_pinned(dir.path(), false) else {
        return;
    };
    // Snapshots every 100 ms: the run is short, and each brings a census.
    let trace = dir.path().join("take.fsc");
    let out = Command::new(FRAGSCOPE)
        .current_dir(dir.path())
        .args(["record", "--snapshot-ms", "100", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .args(["200000", "take"])
        .env_remove("GHCRTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    if common::ghc_version().is_some_and(|v| v >= (9, 4)) {
        // Every RTS of GHC 9.4 on can write an eventlog: the program gets one.
        assert!(stderr.contains("GHC eventlog written"), "{stderr}");
        assert!(dir.path().join("take.eventlog").exists());
        return;
    }
    assert!(
        stderr.contains("rebuild it with `ghc -eventlog -rtsopts`"),
        "{stderr}"
    );
    assert!(!dir.path().join("take.eventlog").exists());
    // The RSS and the block censuses are there: the GHC report reads them, says what is
    // missing, and does not pass the program off as a malloc program.
    let out = Command::new(FRAGSCOPE)
        .arg("report")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(GHC program)"), "{text}");
    assert!(text.contains("recorded without an eventlog"), "{text}");
    assert!(!text.contains("fragmentation ratio"), "{text}");
    // The census's own figures, beside no eventlog figure.
    assert!(!text.contains("HEAP_SIZE 0 B"), "{text}");
    let r = report_json(&trace);
    let censuses = r["block_censuses"].as_array().unwrap();
    assert!(!censuses.is_empty(), "{r}");
    for c in censuses {
        u(&c["heap_size"]);
        for k in [
            "eventlog_heap_size",
            "eventlog_free_blocks",
            "eventlog_live",
        ] {
            assert!(c[k].is_null(), "{k}: {c}");
        }
    }
    assert_eq!(r["heap_known"], false);
}

/// Seed 003's static cache in a compact region: the census counts the region's blocks as
/// their own kind, and its heap agrees with the eventlog's after a collection.
#[test]
fn a_compact_region_is_counted_by_the_census() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "Compact") else {
        return;
    };
    let trace = dir.path().join("compact.fsc");
    record_in(
        dir.path(),
        &["--snapshot-ms", "100"],
        &trace,
        &[
            exe.as_os_str(),
            OsStr::new("200000"),
            OsStr::new("200000"),
            OsStr::new("compact"),
        ],
    );
    let r = report_json(&trace);
    let censuses = r["block_censuses"].as_array().unwrap();
    // 200 000 entries: several MiB of compact region once it is built.
    let with_region: Vec<&Value> = censuses
        .iter()
        .filter(|c| kind_held(c, "compact regions") > 4 << 20)
        .collect();
    assert!(!with_region.is_empty(), "{censuses:?}");
    // Where the eventlog's last collection saw the same heap (no collection in between),
    // the census's megablocks are the RTS's HEAP_SIZE within 2%.
    assert!(
        with_region
            .iter()
            .any(|c| !c["eventlog_heap_size"].is_null()
                && within(u(&c["heap_size"]), u(&c["eventlog_heap_size"]), 0.02)),
        "{with_region:?}"
    );
}

/// Seed 001's server on the threaded RTS with two capabilities (two nurseries, parallel
/// collections): its censuses agree with the eventlog and name the same pinned blocks.
#[test]
fn a_threaded_server_on_two_capabilities_is_diagnosed_alike() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = common::build_ghc(
        dir.path(),
        &common::ghc_case("Conns"),
        "Conns-threaded",
        &["-eventlog", "-threaded"],
    ) else {
        return;
    };
    let trace = dir.path().join("threaded.fsc");
    record_in(
        dir.path(),
        &[],
        &trace,
        &[
            exe.as_os_str(),
            OsStr::new("20000"),
            OsStr::new("keep"),
            OsStr::new("+RTS"),
            OsStr::new("-N2"),
            OsStr::new("-RTS"),
        ],
    );
    let r = report_json(&trace);
    assert!(
        r["rts"].as_str().unwrap_or_default().contains("thr"),
        "{}",
        r["rts"]
    );
    let censuses = r["block_censuses"].as_array().unwrap();
    assert!(censuses.len() >= 3, "{censuses:?}");
    // The nursery of each capability is found from the RTS's list of nurseries.
    assert!(
        censuses.iter().all(|c| kind_held(c, "nursery") > 0),
        "{censuses:?}"
    );
    let after = censuses_in(&r, plateaus(&r).last().unwrap());
    assert!(!after.is_empty(), "no census on the last plateau");
    for c in after {
        assert!(
            within(u(&c["heap_size"]), u(&c["eventlog_heap_size"]), 0.02),
            "{c}"
        );
    }
    let headline = r["diagnosis"]["headline"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        headline.contains("MiB of megablocks are kept by"),
        "{headline}"
    );
}

/// Seed 001's server as a distribution ships it (stripped, no -rtsopts): its block
/// censuses, read from the descriptors alone, give the same diagnosis as with symbols.
/// Linked with -rdynamic too, as Debian's pandoc is: the dynamic symbol table then
/// exports the RTS's public symbols (ARR_WORDS's info table, mblocks_allocated) and not
/// its private ones (the megablock map), and the census reads the descriptors the same.
#[test]
fn a_stripped_server_is_diagnosed_from_its_descriptors_alone() {
    let dir = tempfile::tempdir().unwrap();
    for link in [&[][..], &["-optl-rdynamic"][..]] {
        let Some(exe) = build_shipped(dir.path(), "Conns", link) else {
            return;
        };
        let trace = dir.path().join(format!("stripped{}.fsc", link.len()));
        record_in(
            dir.path(),
            &[],
            &trace,
            &[exe.as_os_str(), OsStr::new("20000"), OsStr::new("keep")],
        );
        let r = report_json(&trace);
        let censuses = r["block_censuses"].as_array().unwrap();
        assert!(censuses.len() >= 3, "{link:?}: {r}");
        assert!(censuses.iter().all(|c| c["without_symbols"] == true));
        let d = &r["diagnosis"];
        let headline = d["headline"].as_str().unwrap_or_else(|| panic!("{r}"));
        let words: Vec<&str> = headline.split(' ').collect();
        assert_eq!(
            &words[1..7],
            ["MiB", "of", "megablocks", "are", "kept", "by"],
            "{link:?}: {headline}"
        );
        let pinned_blocks: u64 = words[7].parse().unwrap();
        assert!((150..=260).contains(&pinned_blocks), "{headline}");
        assert!(headline.ends_with("full"), "{headline}");
    }
}

/// Builds tests/ghc/`name`.hs as a distribution ships a GHC program: `ghc -O` alone (no
/// -eventlog, no -rtsopts) with `flags`, then stripped; `None` without ghc.
fn build_shipped(dir: &Path, name: &str, flags: &[&str]) -> Option<PathBuf> {
    let src = common::ghc_case(name);
    if Command::new("ghc").arg("--version").output().is_err() {
        eprintln!("skipped: ghc is missing");
        return None;
    }
    let exe = dir.join(format!("{name}-shipped{}", flags.join("")));
    let out = Command::new("ghc")
        .arg("-O")
        .args(flags)
        .arg("-outputdir")
        .arg(dir.join(format!("build-{name}-shipped{}", flags.join(""))))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ghc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("strip").arg(&exe).output().unwrap();
    assert!(out.status.success(), "strip failed");
    Some(exe)
}

/// The part of a text report from the line that starts with `from` to the next that
/// starts with `to` (or the end).
fn text_section<'a>(text: &'a str, from: &str, to: &str) -> &'a str {
    let start = text
        .find(&format!("\n{from}"))
        .unwrap_or_else(|| panic!("no '{from}' in: {text}"));
    let rest = &text[start + 1..];
    let end = rest.find(&format!("\n{to}")).unwrap_or(rest.len());
    &rest[..end]
}

/// A GHC program as a distribution ships it (no -eventlog, no -rtsopts, stripped: no
/// eventlog and no RTS symbols for a block census) has RSS only. What the report does
/// not have — live data, heap size, the GC table — is unknown, not 0: "–" or one line
/// saying why in the text, null in the JSON, no series in the page; RSS is shown.
#[test]
fn a_stripped_program_without_eventlog_shows_unknown_figures_not_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_shipped(dir.path(), "Conns", &[]) else {
        return;
    };
    let trace = dir.path().join("shipped.fsc");
    let stderr = record_in(
        dir.path(),
        &["--snapshot-ms", "100"],
        &trace,
        &[exe.as_os_str(), OsStr::new("5000"), OsStr::new("keep")],
    );
    assert!(
        stderr.contains("linked without an eventlog-capable RTS"),
        "{stderr}"
    );
    let out = Command::new(FRAGSCOPE)
        .arg("report")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let why = "the program's RTS wrote no eventlog";

    let timeline = text_section(&text, "Timeline", "Phases");
    assert!(
        timeline.contains(&format!("no live data or heap size: {why}")),
        "{timeline}"
    );
    let rows: Vec<&str> = timeline
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(rows.len() >= 10, "{timeline}");
    for row in &rows {
        // time, RSS, RSS - LazyFree: measured, none of them 0.
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(cells.len(), 3, "{row}");
        assert!(cells[1].ends_with("iB"), "{row}");
        assert!(!cells.contains(&"0 B"), "{row}");
    }

    let phases = text_section(&text, "Phases", "Garbage collection");
    assert!(
        phases.contains(&format!("no heap figures: {why}")),
        "{phases}"
    );
    assert!(!phases.contains("live up to"), "{phases}");
    assert!(!phases.contains("heap up to"), "{phases}");
    assert!(phases.contains("RSS up to"), "{phases}");

    // The GC table is its title and one line.
    let gc = text_section(&text, "Garbage collection", "\n");
    let gc_lines: Vec<&str> = gc.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(gc_lines.len(), 2, "{gc}");
    assert!(
        gc_lines[1].contains(&format!("no GC figures: {why}")),
        "{gc}"
    );
    for zero in ["0 B", "0.00 s", "-0.00"] {
        assert!(!gc.contains(zero), "{zero}: {gc}");
    }

    let r = report_json(&trace);
    assert_eq!(r["heap_known"], false);
    assert!(
        r["eventlog_figures_missing"]
            .as_str()
            .unwrap()
            .contains(why),
        "{}",
        r["eventlog_figures_missing"]
    );
    // Stripped: the censuses are read from the descriptors alone, and say so.
    let censuses = r["block_censuses"].as_array().unwrap();
    assert!(!censuses.is_empty(), "{r}");
    for c in censuses {
        assert_eq!(c["without_symbols"], true, "{c}");
        // A megablock's 1 MiB is its 252 blocks and their descriptors.
        let blocks = u(&c["blocks_in_use"]) + u(&c["free_blocks"]);
        assert_eq!(blocks, u(&c["heap_size"]) / (1 << 20) * 252 * 4096, "{c}");
    }
    assert!(
        text.contains("note: read without symbols (a stripped executable)"),
        "{text}"
    );
    // Its first line says where the heap stood.
    let headline = r["headline"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(text.contains(headline), "{text}");
    let points = r["timeline"].as_array().unwrap();
    assert!(!points.is_empty());
    for p in points {
        for k in ["live", "heap_size", "gc_frag", "gc_slop"] {
            assert!(p[k].is_null(), "{k}: {p}");
        }
        assert!(u(&p["rss"]) > 0, "{p}");
    }
    let phases = r["phases"].as_array().unwrap();
    assert!(!phases.is_empty());
    for p in phases {
        for k in ["live_max", "live_end", "heap_size_max"] {
            assert!(p[k].is_null(), "{k}: {p}");
        }
        let d = &p["decomposition"];
        // Live data stays unknown; the heap is the block census's where the phase has one.
        for k in ["live", "copy_reserve_and_slop", "outside_live"] {
            assert!(d[k].is_null(), "{k}: {d}");
        }
        let census = &p["block_census"];
        for k in [
            "free_resident_pages",
            "heap_size",
            "other_anon",
            "unexplained",
        ] {
            assert_eq!(d[k].is_null(), census.is_null(), "{k}: {d}");
        }
        if !census.is_null() {
            assert_eq!(d["heap_size"], census["heap_size"], "{p}");
            assert_eq!(d["blocks_size"], census["blocks_in_use"], "{p}");
        }
        assert!(u(&d["rss"]) > 0 && u(&d["file"]) > 0, "{d}");
        u(&d["lazy_free"]);
        u(&p["rss_max"]);
    }
    let g = &r["gc"];
    assert!(g["generations"].as_array().unwrap().is_empty());
    for k in [
        "elapsed_ms",
        "gc_ms",
        "mutator_ms",
        "allocated_bytes",
        "copied_bytes",
        "max_residency",
        "memory_in_use",
        "max_slop",
        "fragmentation_at_peak",
        "max_fragmentation",
    ] {
        assert!(g[k].is_null(), "{k}: {g}");
    }

    // compare: the same figures unknown side by side.
    let out = Command::new(FRAGSCOPE)
        .args(["compare", "--json"])
        .arg(&trace)
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["columns"][0];
    for k in ["max_residency", "live", "major_collections", "gc_ms"] {
        assert!(c[k].is_null(), "{k}: {c}");
    }
    // The heap where memory settled is its block census's.
    assert_eq!(c["heap_size"], c["census"]["heap_size"], "{c}");
    u(&c["peak_rss"]);

    // The page draws RSS and RSS minus LazyFree, and no line for live data or heap size.
    let html = dir.path().join("shipped.html");
    let out = Command::new(FRAGSCOPE)
        .arg("report")
        .arg(&trace)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(browser) = common::chromium() else {
        eprintln!("skipped the page: chromium is not installed");
        return;
    };
    let dom = common::load_page(
        &browser,
        &html,
        &common::artefacts().join("ghc-shipped.png"),
    );
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the page did not finish"
    );
    // RSS and RSS minus LazyFree over time, and the censuses' four series.
    assert_eq!(dom.matches("class=\"series ghc-line\"").count(), 6);
    for line in [
        "No live data or heap size: ",
        "No heap figures: ",
        "No GC figures: ",
    ] {
        assert!(dom.contains(&format!("{line}{why}")), "{line}");
    }
    // Side by side: unknown collections and pauses are shown as such, and draw nothing.
    let html = dir.path().join("shipped-compare.html");
    let out = Command::new(FRAGSCOPE)
        .arg("compare")
        .arg(&trace)
        .arg(&trace)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = common::load_page(
        &browser,
        &html,
        &common::artefacts().join("ghc-shipped-compare.png"),
    );
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the page did not finish"
    );
    // RSS's two lines in each run's chart.
    assert_eq!(dom.matches("class=\"series ghc-line\"").count(), 4);
    // No heap figures: no parts to draw where memory settled.
    assert_eq!(dom.matches("class=\"cmp-bar\"").count(), 0);
    assert_eq!(
        dom.matches(">no heap figures: RSS is not split</text>")
            .count(),
        2
    );
}

/// Builds tests/ghc/`name`.hs with `ghc -O -rtsopts -eventlog`; `None` without ghc.
fn build_case(dir: &Path, name: &str) -> Option<PathBuf> {
    common::build_ghc(dir, &common::ghc_case(name), name, &["-eventlog"])
}

/// `fragscope record OPTIONS -o TRACE -- COMMAND` in `dir`, without the caller's GHCRTS;
/// fails the test if it fails. Returns fragscope's and the program's stderr.
fn record_in(dir: &Path, options: &[&str], trace: &Path, command: &[&OsStr]) -> String {
    let out = Command::new(FRAGSCOPE)
        .current_dir(dir)
        .arg("record")
        .args(options)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .args(command)
        .env_remove("GHCRTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn within(a: u64, b: u64, share: f64) -> bool {
    (a as f64 - b as f64).abs() <= share * b.max(1) as f64
}

/// Seed 001's server: 20 000 connections with pinned buffers; after they close, one
/// slice in a hundred is kept. Recorded without a heap profile, the report names the
/// pinned blocks that keep the megablocks, from the block census, whose figures agree
/// with the eventlog's; copying the slices out leaves nothing to report.
#[test]
fn a_seed_001_server_is_diagnosed_from_the_block_census_without_a_heap_profile() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "Conns") else {
        return;
    };
    for mode in ["keep", "copy"] {
        let trace = dir.path().join(format!("conns-{mode}.fsc"));
        let html = dir.path().join(format!("conns-{mode}.html"));
        record_in(
            dir.path(),
            &[],
            &trace,
            &[exe.as_os_str(), OsStr::new("20000"), OsStr::new(mode)],
        );
        let r = report_json(&trace);
        // No -hT census ran: the program was left to collect as it would alone.
        for p in r["phases"].as_array().unwrap() {
            assert!(p["closure_types"].as_array().unwrap().is_empty(), "{p}");
        }
        let censuses = r["block_censuses"].as_array().unwrap();
        assert!(censuses.len() >= 3, "{mode}: {censuses:?}");
        // After the close: the last plateau, idle, so the eventlog's figures (posted at
        // the last collection) describe the same heap the census read.
        let after = censuses_in(&r, plateaus(&r).last().unwrap());
        assert!(!after.is_empty(), "{mode}: no census on the last plateau");
        for c in &after {
            let heap = u(&c["heap_size"]);
            assert!(
                within(heap, u(&c["eventlog_heap_size"]), 0.02),
                "{mode}: {c}"
            );
            assert!(
                within(u(&c["free_blocks"]), u(&c["eventlog_free_blocks"]), 0.02),
                "{mode}: {c}"
            );
            // A megablock's 1 MiB is its 252 blocks and their descriptors.
            let blocks = u(&c["blocks_in_use"]) + u(&c["free_blocks"]);
            assert_eq!(blocks, heap / (1 << 20) * 252 * 4096, "{mode}: {c}");
        }
        let text = Command::new(FRAGSCOPE)
            .arg("report")
            .arg(&trace)
            .arg("--html")
            .arg(&html)
            .output()
            .unwrap();
        assert!(text.status.success());
        let page = std::fs::read_to_string(&html).unwrap();
        let text = String::from_utf8(
            Command::new(FRAGSCOPE)
                .arg("report")
                .arg(&trace)
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        if mode == "copy" {
            assert!(r["diagnosis"].is_null(), "{}", r["diagnosis"]);
            assert!(u(&after[0]["heap_size"]) <= 16 << 20, "{}", after[0]);
            continue;
        }
        let d = &r["diagnosis"];
        let headline = d["headline"].as_str().unwrap();
        // "67 MiB of megablocks are kept by 197 pinned blocks 12% full"
        let words: Vec<&str> = headline.split(' ').collect();
        assert_eq!(
            &words[1..7],
            ["MiB", "of", "megablocks", "are", "kept", "by"],
            "{headline}"
        );
        let kept_mib: u64 = words[0].parse().unwrap();
        let pinned_blocks: u64 = words[7].parse().unwrap();
        assert_eq!(&words[8..10], ["pinned", "blocks"], "{headline}");
        assert!(headline.ends_with("full"), "{headline}");
        // 200 slices kept, each in its own block (or a few sharing one).
        assert!((150..=260).contains(&pinned_blocks), "{headline}");
        let c = censuses
            .iter()
            .find(|c| c["t_ms"] == d["census_t_ms"])
            .unwrap();
        assert!(kept_mib * 2 >= u(&c["heap_size"]) >> 20, "{headline}: {c}");
        assert!(
            within(u(&c["heap_size"]), u(&c["eventlog_heap_size"]), 0.02),
            "{c}"
        );
        // Seed 001's histogram: most pinned blocks less than 20% full.
        let occ: Vec<u64> = c["pinned_occupancy"]
            .as_array()
            .unwrap()
            .iter()
            .map(u)
            .collect();
        assert_eq!(occ.len(), 10);
        let blocks: u64 = occ.iter().sum();
        assert!(occ[0] + occ[1] >= blocks * 8 / 10, "{occ:?}");
        assert!(text.contains(headline), "{text}");
        assert!(
            text.contains("pinned blocks by how full they are"),
            "{text}"
        );
        assert!(text.contains(" 0%- 10%"), "{text}");
        assert!(page.contains(headline));
        assert!(d["advice"][0]
            .as_str()
            .unwrap()
            .contains("Data.ByteString.copy"));
    }
}

/// GHC 9.0 refuses a heap profile with the nonmoving collector and aborts: asked for
/// one, fragscope leaves -hT out for a program run with -xn, says so, and the program
/// runs with its eventlog and block census.
#[test]
fn a_nonmoving_program_is_not_given_a_heap_profile_it_would_abort_on() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "Conns") else {
        return;
    };
    let trace = dir.path().join("xn.fsc");
    let out = Command::new(FRAGSCOPE)
        .current_dir(dir.path())
        .args(["record", "--ghc-heap-profile", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .args(["2000", "keep", "+RTS", "-xn", "-RTS"])
        .env_remove("GHCRTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("nonmoving collector (-xn)"), "{stderr}");
    assert!(stderr.contains("GHC eventlog written"), "{stderr}");
    let r = report_json(&trace);
    assert!(!r["block_censuses"].as_array().unwrap().is_empty(), "{r}");
    assert!(r["gc"]["memory_in_use"].as_u64().unwrap() > 0);
}

/// Seed 000 through `compare`: strip and take recorded, side by side with the GHC model.
/// Where memory settles (the second plateau), strip holds more live data (HEAP_LIVE counts
/// its pinned blocks whole), a larger heap and more pinned blocks than take, after the
/// same collections; the eventlogs compare too; a malloc trace beside them is refused.
#[test]
fn compare_puts_strip_and_take_side_by_side_with_the_ghc_model() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_pinned(dir.path(), true) else {
        return;
    };
    for mode in ["strip", "take"] {
        record_in(
            dir.path(),
            &["--snapshot-ms", "100"],
            &dir.path().join(format!("{mode}.fsc")),
            &[exe.as_os_str(), OsStr::new("2000000"), OsStr::new(mode)],
        );
        // Where the eventlog's last collection saw the same heap, the census's megablocks
        // are the RTS's HEAP_SIZE within 2% (recorded without a heap profile, whose
        // censuses are collections of their own). Its free blocks are not compared: the
        // program collects without pause (performGC in a loop), so a census most often
        // lands while the mutator or the next collection has taken blocks since the last
        // one posted its figures (seed 001's idle server holds free blocks to 2% too).
        let r = report_json(&dir.path().join(format!("{mode}.fsc")));
        let censuses = r["block_censuses"].as_array().unwrap();
        assert!(
            censuses.iter().any(|c| !c["eventlog_heap_size"].is_null()
                && u(&c["heap_size"]) > 64 << 20
                && within(u(&c["heap_size"]), u(&c["eventlog_heap_size"]), 0.02)),
            "{mode}: {censuses:?}"
        );
    }
    let compare = |args: &[&str]| {
        Command::new(FRAGSCOPE)
            .current_dir(dir.path())
            .arg("compare")
            .args(args)
            .output()
            .unwrap()
    };
    let out = compare(&["--json", "strip.fsc", "take.fsc"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (s, t) = (&v["columns"][0], &v["columns"][1]);
    for c in [s, t] {
        assert_eq!(c["kind"], "ghc", "{c}");
        assert_eq!(c["settled_phase"], "plateau", "{c}");
        assert!(
            c["census"].is_object(),
            "no census where memory settled: {c}"
        );
    }
    let more = |k: &str, factor: u64| {
        assert!(
            u(&s[k]) > factor * u(&t[k]),
            "{k}: strip {} take {}",
            s[k],
            t[k]
        );
    };
    more("live", 2);
    more("heap_size", 2);
    more("rss_minus_lazy_free", 2);
    assert!(u(&s["census"]["pinned_blocks"]) > 4 * u(&t["census"]["pinned_blocks"]));
    // The same program's collections: same counts, same bytes copied within 5%.
    assert_eq!(s["major_collections"], t["major_collections"]);
    assert!(within(u(&s["copied_bytes"]), u(&t["copied_bytes"]), 0.05));
    assert!(u(&s["major_collections"]) >= 30, "{s}");

    let text = compare(&["strip.fsc", "take.fsc"]);
    let text = String::from_utf8_lossy(&text.stdout);
    for line in [
        "(GHC programs)",
        "live (HEAP_LIVE)",
        "heap size (megablocks)",
        "free blocks in heap",
        "RSS - LazyFree",
        "pinned blocks",
        "major collections",
        "bytes copied",
        "max pause",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    assert!(!text.contains("fragmentation ratio"), "{text}");

    // Eventlogs, alone or beside a trace.
    let out = compare(&["--json", "strip.eventlog", "take.fsc"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["columns"][0]["kind"], "ghc");
    assert!(v["columns"][0]["rss"].is_null());
    assert_eq!(v["columns"][0]["major_collections"], s["major_collections"]);

    let html = dir.path().join("cmp.html");
    let out = compare(&["strip.fsc", "take.fsc", "--html", html.to_str().unwrap()]);
    assert!(out.status.success());
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("\"kind\":\"ghc_compare\""));

    // A malloc program's trace beside them: refused, saying why.
    let c_src = dir.path().join("m.c");
    std::fs::write(
        &c_src,
        "#include <stdlib.h>\nint main(void){free(malloc(64));return 0;}\n",
    )
    .unwrap();
    let m = dir.path().join("m");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&m)
        .arg(&c_src)
        .status()
        .unwrap()
        .success());
    assert!(Command::new(FRAGSCOPE)
        .current_dir(dir.path())
        .args(["record", "-o", "m.fsc", "--"])
        .arg(&m)
        .status()
        .unwrap()
        .success());
    let out = compare(&["strip.fsc", "m.fsc"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot compare GHC programs with malloc programs"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A shell script that execs the GHC program, recorded: the program still gets its
/// eventlog and block census (GHCRTS reaches it through the script), and the report
/// explains the GHC process, not the shell.
#[test]
fn a_ghc_program_run_by_a_shell_script_is_recognised() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_case(dir.path(), "Conns") else {
        return;
    };
    let script = dir.path().join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho starting\nexec {} 2000 keep\n",
            exe.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, cmd) in [
        ("script", vec![script.to_str().unwrap().to_string()]),
        (
            "sh-c",
            vec![
                "sh".to_string(),
                "-c".to_string(),
                format!("{} 2000 copy; true", exe.display()),
            ],
        ),
    ] {
        let trace = dir.path().join(format!("{name}.fsc"));
        let cmd: Vec<&OsStr> = cmd.iter().map(OsStr::new).collect();
        let stderr = record_in(dir.path(), &["--snapshot-ms", "100"], &trace, &cmd);
        assert!(stderr.contains("runs the GHC program"), "{stderr}");
        assert!(stderr.contains("GHC eventlog written"), "{stderr}");
        let r = report_json(&trace);
        assert!(
            r["argv"][0].as_str().unwrap().ends_with("Conns"),
            "{}",
            r["argv"]
        );
        assert!(u(&r["gc"]["memory_in_use"]) > 0);
        assert_eq!(r["rss_recorded"], true);
        assert!(
            !r["block_censuses"].as_array().unwrap().is_empty(),
            "{name}"
        );
        assert!(
            r["notes"][0]
                .as_str()
                .unwrap()
                .contains("the GHC program is"),
            "{}",
            r["notes"]
        );
        // RSS is the GHC process's: far more than a shell's few MiB.
        let peak = r["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["rss"].as_u64())
            .max()
            .unwrap();
        assert!(peak > 8 << 20, "{name}: {peak}");
    }
}
