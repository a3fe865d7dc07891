//! Programs whose allocator is linked into them (Rust services on tikv-jemallocator or
//! the mimalloc crate, a C program linked with a static jemalloc): the interposer never
//! sees that allocator's calls, so `record` must say so before the program runs, and the
//! report and `snapshot PID` must name the allocator instead of explaining the few calls
//! that reached the C library's malloc.

mod common;

use std::process::Command;

use common::*;

/// The Rust program on each linked allocator: (cargo feature, allocator).
const LINKED: [(&str, &str); 2] = [("tikv-jemallocator", "jemalloc"), ("mimalloc", "mimalloc")];

#[test]
fn a_rust_program_on_a_linked_allocator_is_named_before_it_runs_and_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    for (feature, allocator) in LINKED {
        let exe = build_linked_alloc(feature);
        let trace = dir.path().join(format!("{allocator}.fsc"));
        let out = record_command(
            Allocator::Glibc,
            &trace,
            &["--snapshot-ms", "50"],
            &exe,
            &["400000", "10", "0.3"],
        )
        .output()
        .unwrap();
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        // The warning comes before anything the program prints.
        let warning = err
            .find(&format!("links its own {allocator}"))
            .unwrap_or_else(|| panic!("{allocator}: no warning in: {err}"));
        assert!(err[..warning].lines().count() <= 1, "{err}");
        let r = report_json(&trace);
        let linked = &r["linked_allocator"];
        assert_eq!(linked["allocator"], allocator, "{linked}");
        assert_eq!(linked["serves_malloc"], false, "{linked}");
        let headline = r["headline"]["sentence"].as_str().unwrap();
        // Both crates' default builds are read (tikv-jemallocator's, without statistics,
        // from jemalloc's extent map; the mimalloc crate's 3.x from its arenas; the tests
        // below check their figures): the headline is the allocator's own, never malloc's
        // advice for memory malloc does not hold.
        assert!(
            headline.starts_with(&format!("{allocator} "))
                || headline.starts_with(&format!("{allocator}'s ")),
            "{headline}"
        );
        assert!(!headline.contains("not read"), "{headline}");
        for advice in ["malloc_trim", "pinned by a few live objects"] {
            assert!(!headline.contains(advice), "{allocator}: {headline}");
        }
        let text = report_text(&trace);
        assert!(
            line_with(&text, "allocator: a").contains(&format!("a {allocator} linked into")),
            "{text}"
        );
        assert_eq!(
            info(&trace)["processes"][0]["linked_allocator"]["allocator"],
            allocator
        );
    }
}

#[test]
fn a_snapshot_names_the_allocator_linked_into_a_running_program() {
    let dir = tempfile::tempdir().unwrap();
    for (feature, allocator) in LINKED {
        let exe = build_linked_alloc(feature);
        let mut cmd = Command::new(&exe);
        cmd.args(["200000", "10", "stdin"]);
        let mut p = Running::start(cmd);
        assert!(p.line().starts_with("holding 20000 boxes"));
        let trace = dir.path().join(format!("{allocator}-snapshot.fsc"));
        common::snapshot(p.pid(), &trace);
        let r = report_json(&trace);
        let s = &r["snapshot"];
        assert_eq!(s["allocator"], allocator, "{s}");
        if allocator == "jemalloc" {
            // Built by default, without statistics: read from its extent map, and said; its
            // threads' caches (on no arena's list) from its threads' data.
            assert!(s["note"].is_null(), "{s}");
            let release = s["jemalloc"]["heap"]["release"].as_str().unwrap();
            assert!(release.ends_with(", built without statistics"), "{release}");
            let cached = s["jemalloc"]["tcache_bytes"].as_u64().unwrap();
            assert!(cached > 0, "{s}");
        } else {
            // The mimalloc crate's default, mimalloc 3.x: read from its arenas.
            assert!(s["note"].is_null(), "{s}");
            assert_eq!(s["mimalloc"]["heap"]["release"], "mimalloc 3.3.2", "{s}");
        }
        assert_eq!(r["linked_allocator"]["allocator"], allocator);
        p.send("");
    }
}

/// A Rust program on tikv-jemallocator built with jemalloc's statistics, a tenth of its
/// boxes kept: `snapshot PID` reads the jemalloc linked into it — by its symbols (one
/// thread, then four: several arenas), and stripped by the shape of its statics — and
/// counts what the program holds (the usable sizes of its boxes and of the vectors of
/// them) within 5%, jemalloc's own `stats.*` within 2% (resident 5%; its threads' caches
/// and dirty pages exactly; with the extent map read too, the threads' caches are also
/// read from the threads' data, and must be those the arenas list), and leaves under 10%
/// of RSS to "other anonymous". Both
/// releases of the crate services pin: 0.7 (jemalloc 5.3.1) and 0.6 (5.3.0-1-ge13ca993).
#[test]
fn a_snapshot_reads_the_jemalloc_linked_into_a_rust_program() {
    for (exe, release) in [
        (
            build_linked_alloc("jemalloc-stats"),
            "(tikv-jemalloc-sys 0.7)",
        ),
        (
            build_linked_alloc_on_jemalloc_0_6("jemalloc-stats"),
            "(tikv-jemalloc-sys 0.6)",
        ),
    ] {
        snapshots_of_linked_jemalloc(&exe, release);
    }
}

/// The snapshots of `a_snapshot_reads_the_jemalloc_linked_into_a_rust_program` of one
/// build, `exe`, whose release is named ending with `release`.
fn snapshots_of_linked_jemalloc(exe: &std::path::Path, release: &str) {
    let dir = tempfile::tempdir().unwrap();
    let stripped = dir.path().join("linked_alloc");
    std::fs::copy(exe, &stripped).unwrap();
    let ok = Command::new("strip")
        .arg("--strip-all")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(ok.success(), "strip failed");
    // The last two: jemalloc's extent map read too, each checked against the other.
    for (program, found_by, threads, map) in [
        (exe, "symbols", 1, "when needed"),
        (exe, "symbols", 4, "when needed"),
        (stripped.as_path(), "shape", 1, "when needed"),
        (exe, "symbols", 4, "always"),
        (stripped.as_path(), "shape", 1, "always"),
    ] {
        let found_by = format!("{found_by}, {threads} threads, extent map {map}");
        let mut cmd = Command::new(program);
        cmd.args(["400000", "10", "stdin", &threads.to_string()]);
        let mut p = Running::start(cmd);
        assert!(p.line().starts_with("holding 40000 boxes"));
        let own = figures_until_kept(&mut p);
        let trace = dir.path().join(format!("linked-{found_by}.fsc"));
        let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["snapshot", &p.pid().to_string(), "-o"])
            .arg(&trace)
            .env("FRAGSCOPE_JEMALLOC_MAP", map)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let r = report_json(&trace);
        let s = &r["snapshot"];
        assert_eq!(s["allocator"], "jemalloc", "{found_by}: {s}");
        assert!(s["note"].is_null(), "{found_by}: {s}");
        assert_eq!(r["linked_allocator"]["allocator"], "jemalloc");
        let j = &s["jemalloc"];
        let read = j["heap"]["release"].as_str().unwrap_or_default();
        assert!(read.ends_with(release), "{found_by}: {read}");
        let figure = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{j}"));
        let within = |ours: u64, name: &str, share: f64| assert_within(&own, ours, name, share);
        within(figure(&j["allocated_bytes"]), "stats.allocated", 0.02);
        within(figure(&j["active_bytes"]), "stats.active", 0.02);
        within(figure(&j["resident_bytes"]), "stats.resident", 0.05);
        within(figure(&j["mapped_bytes"]), "stats.mapped", 0.05);
        within(
            figure(&j["tcache_bytes"]),
            "stats.arenas.4096.tcache_bytes",
            0.0,
        );
        let h = &j["heap"];
        let arenas = h["arenas"].as_array().unwrap();
        let pages = |field: &str| arenas.iter().map(|a| figure(&a[field])).sum::<u64>();
        within(pages("dirty_pages"), "stats.arenas.4096.pdirty", 0.0);
        within(pages("muzzy_pages"), "stats.arenas.4096.pmuzzy", 0.0);
        assert!(own["stats.arenas.4096.pdirty"] > 0, "{own:?}");
        if threads > 1 {
            assert!(arenas.len() > 1, "{found_by}: {h}");
        }
        // 5.3.1 rounds large requests to pages: each class at its extents' mean.
        let large: u64 = h["large"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| figure(&l["extents"]) * figure(&l["size"]))
            .sum();
        within(large, "stats.arenas.4096.large.allocated", 0.001);
        census_splits_what_the_program_holds(&own, &r["snapshots"][0], &found_by);
        let headline = r["headline"]["sentence"].as_str().unwrap();
        assert!(headline.starts_with("jemalloc's slabs hold"), "{headline}");
        let text = report_text(&trace);
        assert!(
            line_with(&text, "allocator: a").contains("a jemalloc linked into"),
            "{text}"
        );
        assert!(text.contains("tikv-jemalloc-sys"), "{text}");
        p.send("");
    }
}

/// A Rust program on the mimalloc crate, a tenth of its boxes kept, with mimalloc 2.x (its
/// `v2`) and 3.x (its default): `snapshot PID` reads its pages — one thread, then four,
/// whose workers' pages are abandoned when they end — and finds what mimalloc's own area
/// visitor counts (pages, blocks in use with those other threads freed not yet collected,
/// their bytes, committed and reserved bytes: 2.x's of the main thread's heap, with one
/// thread; 3.x's of the main heap, every thread's pages and the abandoned ones), counts
/// what the program holds within 5%, leaving under 10% of RSS to "other anonymous".
#[test]
fn a_snapshot_reads_the_mimalloc_linked_into_a_rust_program() {
    let dir = tempfile::tempdir().unwrap();
    for (feature, release) in [
        ("mimalloc-v2", "mimalloc 2.3.2"),
        ("mimalloc", "mimalloc 3.3.2"),
    ] {
        let exe = build_linked_alloc(feature);
        let v3 = release.starts_with("mimalloc 3");
        for threads in [1, 4] {
            let case = format!("{release}, {threads} threads");
            let mut cmd = Command::new(&exe);
            cmd.args(["400000", "10", "stdin", &threads.to_string()]);
            let mut p = Running::start(cmd);
            assert!(p.line().starts_with("holding 40000 boxes"));
            let own = figures_until_kept(&mut p);
            let trace = dir.path().join(format!("{feature}-{threads}.fsc"));
            common::snapshot(p.pid(), &trace);
            let r = report_json(&trace);
            let s = &r["snapshot"];
            assert_eq!(s["allocator"], "mimalloc", "{s}");
            assert!(s["note"].is_null(), "{case}: {s}");
            assert_eq!(r["linked_allocator"]["allocator"], "mimalloc");
            let m = &s["mimalloc"];
            let figure = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{m}"));
            let classes = m["heap"]["classes"].as_array().unwrap();
            let sum = |f: &dyn Fn(&serde_json::Value) -> u64| classes.iter().map(f).sum::<u64>();
            let size = |k: &serde_json::Value| figure(&k["block_size"]);
            // mimalloc counts the blocks other threads freed until their owner collects them.
            let used = |k: &serde_json::Value| {
                figure(&k["blocks_in_use"])
                    + figure(&k["blocks_thread_freed"])
                    + figure(&k["blocks_delayed"])
            };
            if threads == 1 || v3 {
                let within = |ours: u64, name: &str| assert_within(&own, ours, name, 0.0);
                within(figure(&m["pages"]), "mi.pages");
                within(sum(&used), "mi.blocks");
                within(sum(&|k| used(k) * size(k)), "mi.used_bytes");
                within(
                    sum(&|k| figure(&k["blocks_capacity"]) * size(k)),
                    "mi.committed",
                );
                within(
                    sum(&|k| figure(&k["blocks_reserved"]) * size(k)),
                    "mi.reserved",
                );
            }
            if threads > 1 && v3 {
                assert!(sum(&|k| figure(&k["abandoned_pages"])) > 0, "{case}: {m}");
            } else if threads > 1 {
                assert!(figure(&m["heap"]["abandoned_segments"]) > 0, "{case}: {m}");
            }
            if v3 {
                assert_eq!(figure(&m["heap"]["arenas"]), 1, "{case}: {m}");
                assert!(figure(&m["heap"]["thread_heaps"]) >= 1, "{case}: {m}");
            }
            census_splits_what_the_program_holds(&own, &r["snapshots"][0], &case);
            let headline = r["headline"]["sentence"].as_str().unwrap();
            assert!(headline.starts_with("mimalloc's pages hold"), "{headline}");
            let text = report_text(&trace);
            assert!(text.contains(release), "{text}");
            assert!(text.contains("block sizes by free bytes"), "{text}");
            let counted_by = if v3 {
                "as its arenas and pages"
            } else {
                "as its segments and pages"
            };
            assert!(text.contains(counted_by), "{text}");
            p.send("");
        }
    }
}

/// The same program stripped of its symbol table: mimalloc's statics are file-local, so
/// nothing names them; the snapshot names the allocator and refuses its census with a
/// note rather than guess where they are (2.x and 3.x).
#[test]
fn a_snapshot_of_a_stripped_program_on_mimalloc_is_refused_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    for feature in ["mimalloc-v2", "mimalloc"] {
        let stripped = dir.path().join(format!("linked_alloc-{feature}"));
        std::fs::copy(build_linked_alloc(feature), &stripped).unwrap();
        let ok = Command::new("strip")
            .arg("--strip-all")
            .arg(&stripped)
            .status()
            .unwrap();
        assert!(ok.success(), "strip failed");
        let s = snapshot_of_linked_alloc(&stripped, &dir.path().join(format!("{feature}.fsc")));
        assert_eq!(s["allocator"], "mimalloc", "{s}");
        let note = s["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("keeps no symbol for mimalloc's"),
            "{feature}: {s}"
        );
        assert!(s.get("mimalloc").is_none(), "{s}");
    }
}

/// A mimalloc 3.x whose statics are not those of a verified build (the program's symbol
/// table given another size for `subproc_main`, as another release or a `secure` build
/// would have it): refused with a note naming what differs, never read with a layout
/// that may not be its own.
#[test]
fn a_snapshot_of_an_unverified_mimalloc_3_build_is_refused_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_linked_alloc("mimalloc");
    let other = dir.path().join("linked_alloc-other");
    let mut bytes = std::fs::read(&exe).unwrap();
    let at = {
        use object::{Object, ObjectSection, ObjectSymbol};
        let file = object::File::parse(&*bytes).unwrap();
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok("subproc_main"))
            .expect("subproc_main in the symbol table");
        let (symtab, _) = file
            .section_by_name(".symtab")
            .and_then(|s| s.file_range())
            .unwrap();
        // Elf64_Sym: st_size at byte 16 of 24.
        symtab as usize + sym.index().0 * 24 + 16
    };
    bytes[at..at + 8].copy_from_slice(&5904u64.to_le_bytes());
    std::fs::write(&other, &bytes).unwrap();
    std::fs::set_permissions(&other, std::fs::metadata(&exe).unwrap().permissions()).unwrap();
    let s = snapshot_of_linked_alloc(&other, &dir.path().join("other.fsc"));
    let note = s["note"].as_str().unwrap_or_default();
    assert!(note.contains("a mimalloc 3.x"), "{s}");
    assert!(note.contains("not verified"), "{s}");
    assert!(note.contains("subproc_main 5904 bytes"), "{s}");
    assert!(s.get("mimalloc").is_none(), "{s}");
}

/// A running program on Debian 13's libmimalloc3 (mimalloc 3.0.1, stripped to its exported
/// names; preloaded, as the package is used), a tenth of its blocks kept and one of 40 MiB
/// (taken from the OS outside mimalloc's arenas, found in its heap's queues): `snapshot PID`
/// finds mimalloc's statics by their shape, counts what mimalloc's own area visitor
/// counts of the main thread's heap (pages, blocks in use, their bytes, carved and
/// reserved bytes; within 0.1%: waiting on stdin allocates after the program printed
/// them) and what the program holds within 2%, and leaves under 10% of RSS to "other
/// anonymous". Debian 12 ships no mimalloc 3: scripts/version-matrix.sh runs this test in
/// Debian 13's chroot, on its library.
#[test]
#[ignore = "needs Debian 13's libmimalloc3: scripts/version-matrix.sh runs it in that chroot"]
fn a_snapshot_of_a_program_on_debians_mimalloc_3_counts_what_mimalloc_counts() {
    let library = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.3";
    assert!(
        std::path::Path::new(library).exists(),
        "{library} is missing: install Debian 13's libmimalloc3"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("mimalloc_keep_tenth");
    compile_linked(&exe, "mimalloc_keep_tenth", &["-ldl"]);
    let mut cmd = Command::new(&exe);
    cmd.arg("1000000").env("LD_PRELOAD", library);
    let mut p = Running::start(cmd);
    let own = figures_until_kept(&mut p);
    assert_eq!(own["mi.version"], 301, "{own:?}");
    let trace = dir.path().join("mimalloc3.fsc");
    common::snapshot(p.pid(), &trace);
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], "mimalloc", "{s}");
    assert!(s["note"].is_null(), "{s}");
    let heap = &s["mimalloc"]["heap"];
    assert_eq!(heap["release"], "mimalloc 3.0.1", "{heap}");
    let figure = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{heap}"));
    let sum = |f: &dyn Fn(&serde_json::Value) -> u64| -> u64 {
        heap["classes"].as_array().unwrap().iter().map(f).sum()
    };
    // mimalloc counts the blocks other threads freed as used until it collects them.
    let used =
        |c: &serde_json::Value| figure(&c["blocks_in_use"]) + figure(&c["blocks_thread_freed"]);
    let size = |c: &serde_json::Value| figure(&c["block_size"]);
    for (ours, name) in [
        (sum(&|c| figure(&c["pages"])), "mi.pages"),
        (sum(&used), "mi.blocks"),
        (sum(&|c| used(c) * size(c)), "mi.used_bytes"),
        (
            sum(&|c| figure(&c["blocks_capacity"]) * size(c)),
            "mi.committed",
        ),
        (
            sum(&|c| figure(&c["blocks_reserved"]) * size(c)),
            "mi.reserved",
        ),
    ] {
        assert_within(&own, ours, name, 0.001);
    }
    let d = &r["snapshots"][0];
    let part = |f: &str| d[f].as_u64().unwrap_or_else(|| panic!("{d}"));
    assert_within(&own, part("live") + part("rounding"), "usable", 0.02);
    assert!(part("other_anon") * 10 < part("rss"), "{d}");
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.starts_with("mimalloc's pages hold"), "{headline}");
    p.send("");
}

/// `snapshot PID` of `exe` (tests/rust/linked_alloc) holding 2000 boxes, written to
/// `trace`: its report's snapshot facts.
fn snapshot_of_linked_alloc(exe: &std::path::Path, trace: &std::path::Path) -> serde_json::Value {
    let mut cmd = Command::new(exe);
    cmd.args(["20000", "10", "stdin"]);
    let mut p = Running::start(cmd);
    assert!(p.line().starts_with("holding 2000 boxes"));
    common::snapshot(p.pid(), trace);
    let s = report_json(trace)["snapshot"].clone();
    p.send("");
    s
}

/// The same program recorded, with jemalloc's statistics and as tikv-jemallocator builds
/// it by default, without them (read from jemalloc's extent map), and on tikv-jemallocator
/// 0.6 with its statistics: its jemalloc's calls never reach the interposer, so the
/// recorder reads jemalloc's metadata at every snapshot instead, and the report explains
/// RSS from it — live+rounding within 5% of what the program holds, "other anonymous"
/// under 10% of RSS at the focus snapshot — and names the allocator.
#[test]
fn a_recording_reads_the_jemalloc_linked_into_a_rust_program_at_each_snapshot() {
    for feature in ["jemalloc-stats", "tikv-jemallocator"] {
        recording_of_linked_alloc(&build_linked_alloc(feature), feature, "jemalloc");
    }
    let on_0_6 = build_linked_alloc_on_jemalloc_0_6("jemalloc-stats");
    recording_of_linked_alloc(&on_0_6, "jemalloc-stats on 0.6", "jemalloc");
}

/// The same for the program on the mimalloc crate, its mimalloc 2.x (segments and pages)
/// and 3.x (arenas and pages) read at every snapshot.
#[test]
fn a_recording_reads_the_mimalloc_linked_into_a_rust_program_at_each_snapshot() {
    for feature in ["mimalloc-v2", "mimalloc"] {
        recording_of_linked_alloc(&build_linked_alloc(feature), feature, "mimalloc");
    }
}

/// A recording of a program on a linked mimalloc whose census was refused once, early
/// (stored, --stacks none: tests/rust/linked_alloc 400000 10 1 on the crate's default
/// build): that snapshot's malloc heap is unknown, and only that one's; the censuses after
/// it give the heap the program holds.
#[test]
fn one_refused_census_leaves_the_other_snapshots_of_a_recording_known() {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fragscope-model/tests/fixtures/linked_mimalloc_early_refusal.fsc");
    let r = report_json(&trace);
    let snapshots = r["snapshots"].as_array().unwrap();
    let unknown: Vec<_> = snapshots
        .iter()
        .filter(|d| d["live"].is_null())
        .map(|d| d["t_ms"].clone())
        .collect();
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    let read = snapshots
        .iter()
        .filter(|d| d["live"].as_u64().is_some_and(|live| live > 20 << 20))
        .count();
    assert!(read >= 3, "{}", r["snapshots"]);
    assert!(snapshots
        .iter()
        .all(|d| d["live"].is_null() == (d["missing_census"] == serde_json::json!(["malloc"]))));
}

/// A recording of `exe`, the program built with `feature` (the case named), on its
/// linked `allocator`.
fn recording_of_linked_alloc(exe: &std::path::Path, feature: &str, allocator: &str) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("linked-recorded.fsc");
    let out = record_command(
        Allocator::Glibc,
        &trace,
        &["--snapshot-ms", "100"],
        exe,
        &["400000", "10", "1"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "holding N boxes, U usable bytes"
    let usable: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("holding ")?.strip_suffix(" usable bytes"))
        .and_then(|v| v.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    let r = report_json(&trace);
    assert_eq!(r["linked_allocator"]["allocator"], allocator);
    let snapshots = r["snapshots"].as_array().unwrap();
    // A census at every snapshot while the program holds its boxes (the focus may be its
    // end, after it dropped them, its dirty pages then the most waste): three at least
    // within 5% of what it holds, each leaving under 10% of RSS to "other anonymous". A
    // snapshot whose census was refused (one may land while mimalloc sets its heap up)
    // has its malloc heap unknown (live null): it is not one of them.
    let figure = |d: &serde_json::Value, f: &str| d[f].as_u64().unwrap_or_else(|| panic!("{d}"));
    let holding: Vec<_> = snapshots
        .iter()
        .filter(|d| {
            let (Some(live), Some(rounding)) = (d["live"].as_u64(), d["rounding"].as_u64()) else {
                return false;
            };
            (live + rounding).abs_diff(usable) * 20 <= usable
        })
        .collect();
    assert!(
        holding.len() >= 3,
        "{feature}: the program holds {usable}: {}",
        r["snapshots"]
    );
    for d in holding {
        assert!(
            figure(d, "other_anon") * 10 < figure(d, "rss"),
            "{feature}: {d}"
        );
    }
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], allocator, "{s}");
    assert!(s["note"].is_null(), "{s}");
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.starts_with(allocator), "{feature}: {headline}");
    let text = report_text(&trace);
    assert!(
        line_with(&text, "allocator: a").contains(&format!("a {allocator} linked into")),
        "{text}"
    );
}

/// A C program linked with Debian's static jemalloc defines malloc itself: every call,
/// the C library's own included, goes to it, and the trace holds none. Its jemalloc is
/// Debian's 5.3.0, found by its symbols (`je_arenas`, ...) in the program: the census
/// taken at each snapshot explains the heap instead, what the program holds within 5%.
#[test]
fn a_c_program_linked_with_a_static_jemalloc_takes_every_malloc_call() {
    let archive = "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a";
    assert!(
        std::path::Path::new(archive).exists(),
        "{archive} is missing: install Debian's libjemalloc-dev"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("usable_sum_static_jemalloc");
    compile_linked(&exe, "usable_sum", &[archive, "-lm", "-ldl"]);
    let trace = dir.path().join("static.fsc");
    let out = record_usable_sum(&exe, &trace);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("every malloc call in the process goes to it"),
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let usable: u64 = stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix("usable="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    let r = report_json(&trace);
    assert_eq!(r["linked_allocator"]["serves_malloc"], true);
    assert_eq!(r["calls"], 0, "{}", r["calls"]);
    assert!(r["snapshot"]["note"].is_null(), "{}", r["snapshot"]);
    assert_eq!(r["snapshot"]["allocator"], "jemalloc");
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.starts_with("jemalloc "), "{headline}");
    let d = &r["snapshots"][r["focus_snapshot"].as_u64().unwrap() as usize];
    let held = d["live"].as_u64().unwrap() + d["rounding"].as_u64().unwrap();
    assert!(
        held.abs_diff(usable) * 20 <= usable,
        "the program holds {usable}, the census {held}"
    );
}

/// A program on the C library's malloc links no allocator: no warning, no field.
#[test]
fn a_program_on_glibc_links_no_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "usable_sum", &[]);
    let trace = dir.path().join("glibc.fsc");
    let out = record_usable_sum(&exe, &trace);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("links its own"), "{}", stderr(&out));
    let r = report_json(&trace);
    assert!(
        r.get("linked_allocator").is_none(),
        "{}",
        r["linked_allocator"]
    );
    assert!(r["calls"].as_u64().unwrap() > 20000 / 2);
}

/// A running program on Debian's libtcmalloc, a tenth of its blocks kept: `snapshot PID`
/// reads tcmalloc's own metadata from outside and counts what MallocExtension counts —
/// bytes in use within 2%, the central free lists within 5%, the page heap alike — and
/// the headline names the central free lists and the size class that holds most.
#[test]
fn a_snapshot_of_a_tcmalloc_program_counts_what_tcmalloc_counts() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("tcmalloc_keep_tenth");
    compile_linked(&exe, "tcmalloc_keep_tenth", &["-ltcmalloc"]);
    let mut cmd = Command::new(&exe);
    cmd.arg("1000000");
    let mut p = Running::start(cmd);
    let own = figures_until_kept(&mut p);
    let trace = dir.path().join("tcmalloc.fsc");
    common::snapshot(p.pid(), &trace);
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], "tcmalloc");
    assert!(s["note"].is_null(), "{s}");
    let t = &s["tcmalloc"];
    let figure = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{t}"));
    let within = |ours: u64, name: &str, share: f64| assert_within(&own, ours, name, share);
    within(
        figure(&t["in_use_bytes"]),
        "generic.current_allocated_bytes",
        0.02,
    );
    within(
        figure(&t["central_bytes"]),
        "tcmalloc.central_cache_free_bytes",
        0.05,
    );
    within(figure(&t["heap"]["system_bytes"]), "generic.heap_size", 0.0);
    within(
        figure(&t["heap"]["pageheap_free_bytes"]),
        "tcmalloc.pageheap_free_bytes",
        0.02,
    );
    // The decomposition is the census's: live is what the program holds, the free
    // objects are inside pages in use.
    let d = &r["snapshots"][0];
    assert_eq!(d["live"], t["in_use_bytes"]);
    assert!(
        figure(&d["free_in_used_pages"]) > 4 * figure(&d["live"]),
        "{d}"
    );
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(
        headline.starts_with("tcmalloc's central free lists hold"),
        "{headline}"
    );
    let text = report_text(&trace);
    assert!(text.contains("in the central free lists"), "{text}");
    assert!(text.contains("size classes by central free list"), "{text}");
    p.send("");
}

/// A running program on Debian's libjemalloc, a tenth of its blocks kept: `snapshot PID`
/// reads jemalloc's own metadata from outside and counts what its `stats.*` count —
/// allocated within 2%, free regions in slabs within 5%, the bins' regions and slabs, the
/// dirty and muzzy pages and the threads' caches exactly — and the headline names where
/// the resident bytes wait. One thread, then four (several arenas and caches).
#[test]
fn a_snapshot_of_a_jemalloc_program_counts_what_jemalloc_counts() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("jemalloc_keep_tenth");
    compile_linked(&exe, "jemalloc_keep_tenth", &["-ljemalloc"]);
    for threads in [1, 4] {
        snapshot_of_jemalloc_keep_tenth(&exe, dir.path(), threads);
    }
}

fn snapshot_of_jemalloc_keep_tenth(exe: &std::path::Path, dir: &std::path::Path, threads: u64) {
    let mut cmd = Command::new(exe);
    cmd.args(["1000000", &threads.to_string()]);
    let mut p = Running::start(cmd);
    assert_eq!(p.line().trim(), "start");
    let own = figures_until_kept(&mut p);
    let trace = dir.join(format!("jemalloc-{threads}.fsc"));
    common::snapshot(p.pid(), &trace);
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert_eq!(s["allocator"], "jemalloc");
    assert!(s["note"].is_null(), "{s}");
    let j = &s["jemalloc"];
    let figure = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{j}"));
    let within = |ours: u64, name: &str, share: f64| assert_within(&own, ours, name, share);
    within(figure(&j["allocated_bytes"]), "stats.allocated", 0.02);
    within(figure(&j["active_bytes"]), "stats.active", 0.02);
    within(figure(&j["resident_bytes"]), "stats.resident", 0.05);
    within(figure(&j["mapped_bytes"]), "stats.mapped", 0.05);
    within(
        figure(&j["tcache_bytes"]),
        "stats.arenas.4096.tcache_bytes",
        0.0,
    );
    let bins = j["heap"]["bins"].as_array().unwrap();
    let sum = |field: &str| bins.iter().map(|b| figure(&b[field])).sum::<u64>();
    within(sum("free_regions"), "bins.free_regions", 0.05);
    within(sum("regions_in_use"), "bins.curregs", 0.0);
    within(sum("slabs"), "bins.curslabs", 0.0);
    within(sum("nonfull_slabs"), "bins.nonfull_slabs", 0.0);
    let arenas = j["heap"]["arenas"].as_array().unwrap();
    let pages = |field: &str| arenas.iter().map(|a| figure(&a[field])).sum::<u64>();
    within(pages("dirty_pages"), "stats.arenas.4096.pdirty", 0.0);
    within(pages("muzzy_pages"), "stats.arenas.4096.pmuzzy", 0.0);
    // Each thread's cache is found, in the arena it is bound to.
    assert!(pages("thread_caches") >= threads, "{}", j["heap"]["arenas"]);
    if threads > 1 {
        assert!(arenas.len() > 1, "{}", j["heap"]["arenas"]);
    }
    let large: u64 = j["heap"]["large"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| figure(&l["extents"]) * figure(&l["size"]))
        .sum();
    within(large, "stats.arenas.4096.large.allocated", 0.0);
    // The decomposition is the census's: live is what the program holds, the free
    // regions are inside pages in use, the dirty pages (those resident) are free resident
    // pages; with the metadata they explain the heap's share of RSS within 1%.
    let d = &r["snapshots"][0];
    assert_eq!(d["live"], j["in_use_bytes"]);
    assert!(
        figure(&d["free_in_used_pages"]) > 4 * figure(&d["live"]),
        "{d}"
    );
    let (resident_dirty, dirty) = (figure(&d["free_resident_pages"]), figure(&j["dirty_bytes"]));
    assert!(
        resident_dirty <= dirty && resident_dirty >= dirty * 9 / 10,
        "{d}"
    );
    let unexplained = d["unexplained"].as_i64().unwrap().unsigned_abs();
    assert!(unexplained * 100 <= figure(&d["rss"]), "{d}");
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.starts_with("jemalloc "), "{headline}");
    assert!(
        headline.contains("dirty") || headline.contains("slabs"),
        "{headline}"
    );
    let text = report_text(&trace);
    assert!(text.contains("free regions inside slabs"), "{text}");
    assert!(
        text.contains("size classes by free bytes in slabs"),
        "{text}"
    );
    p.send("");
}

/// Debian's redis-server (on Debian's libjemalloc, with its background thread), a tenth of
/// a million keys kept: the census counts what jemalloc's own statistics print (MEMORY
/// MALLOC-STATS, read just before) — allocated within 2%, resident within 5% — names the
/// free regions in slabs that the survivors keep, and the server answers after.
#[test]
fn a_snapshot_of_redis_server_counts_what_its_jemalloc_counts() {
    let dir = tempfile::tempdir().unwrap();
    // A port of our own: from the test's pid, apart from the snapshot tests' ones.
    let port = (40000 + std::process::id() % 20000).to_string();
    let Some((mut server, cli)) =
        start_redis(dir.path(), &port, &["--enable-debug-command", "yes"])
    else {
        return;
    };
    assert_eq!(cli(&["DEBUG", "POPULATE", "1000000", "k", "100"]), "OK");
    let keep_tenth = "for i = 0, 999999 do if i % 10 ~= 0 then redis.call('DEL', 'k:' .. i) \
                      end end return 1";
    assert_eq!(cli(&["EVAL", keep_tenth, "0"]), "1");
    // "Allocated: 20255480, active: 178868224, metadata: 5345408 (n_thp 0), resident: ..."
    let stats = cli(&["MEMORY", "MALLOC-STATS"]);
    let line = stats
        .lines()
        .find(|l| l.starts_with("Allocated: "))
        .unwrap_or_else(|| panic!("{stats}"));
    let own: std::collections::HashMap<String, u64> = line
        .split(", ")
        .filter_map(|part| {
            let (name, value) = part.split_once(": ")?;
            let number = value.split_whitespace().next()?.parse().ok()?;
            Some((name.to_lowercase(), number))
        })
        .collect();
    let trace = dir.path().join("redis.fsc");
    common::snapshot(server.id(), &trace);
    let r = report_json(&trace);
    let s = &r["snapshot"];
    assert!(s["note"].is_null(), "{s}");
    let j = &s["jemalloc"];
    let figure = |name: &str| j[name].as_u64().unwrap_or_else(|| panic!("{j}"));
    assert_within(&own, figure("allocated_bytes"), "allocated", 0.02);
    assert_within(&own, figure("active_bytes"), "active", 0.02);
    assert_within(&own, figure("resident_bytes"), "resident", 0.05);
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.starts_with("jemalloc's slabs hold"), "{headline}");
    assert_eq!(cli(&["PING"]), "PONG");
    assert_eq!(cli(&["DBSIZE"]), "100000");
    let _ = cli(&["SHUTDOWN", "NOSAVE"]);
    let _ = server.wait();
}

/// A jemalloc build other than the one whose layout was verified (here Debian's library
/// with its version string changed) is refused with a note, never read blind.
#[test]
fn a_snapshot_of_another_jemalloc_build_is_refused_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("jemalloc_keep_tenth");
    compile_linked(&exe, "jemalloc_keep_tenth", &["-ljemalloc"]);
    let lib = std::fs::read("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").unwrap();
    let (verified, other) = (b"5.3.0-0-g54eaed1d8b56", b"5.3.9-0-g54eaed1d8b56");
    let mut patched = lib.clone();
    let mut found = 0;
    for at in 0..lib.len() - verified.len() {
        if &lib[at..at + verified.len()] == verified {
            patched[at..at + other.len()].copy_from_slice(other);
            found += 1;
        }
    }
    assert!(
        found > 0,
        "Debian's libjemalloc.so.2 carries no 5.3.0 version string"
    );
    std::fs::write(dir.path().join("libjemalloc.so.2"), patched).unwrap();
    let mut cmd = Command::new(&exe);
    cmd.arg("10000").env("LD_LIBRARY_PATH", dir.path());
    let mut p = Running::start(cmd);
    assert_eq!(p.line().trim(), "start");
    figures_until_kept(&mut p);
    let trace = dir.path().join("other.fsc");
    common::snapshot(p.pid(), &trace);
    let r = report_json(&trace);
    let note = r["snapshot"]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("a jemalloc build whose layout fragscope has not verified"),
        "{note}"
    );
    assert!(r["snapshot"].get("jemalloc").is_none());
    p.send("");
}

/// The census's figure `ours` is within `share` of the allocator's own figure `name`.
/// A linked allocator's census at snapshot `d` of the program that keeps every tenth of
/// its boxes: live and rounding within 5% of the usable bytes it holds (`own["usable"]`),
/// under 10% of RSS left to "other anonymous", and the free blocks the survivors keep in
/// their pages more than what lives there.
fn census_splits_what_the_program_holds(
    own: &std::collections::HashMap<String, u64>,
    d: &serde_json::Value,
    case: &str,
) {
    let figure = |f: &str| d[f].as_u64().unwrap_or_else(|| panic!("{case}: {d}"));
    assert_within(own, figure("live") + figure("rounding"), "usable", 0.05);
    assert!(figure("other_anon") * 10 < figure("rss"), "{case}: {d}");
    assert!(figure("free_in_used_pages") > figure("live"), "{case}: {d}");
}

fn assert_within(own: &std::collections::HashMap<String, u64>, ours: u64, name: &str, share: f64) {
    let theirs = own[name];
    assert!(
        (ours as f64 - theirs as f64).abs() <= share * theirs as f64,
        "{name}: the allocator's {theirs}, the census's {ours}"
    );
}

/// Lines NAME=VALUE a program prints of its allocator's own figures, up to `kept=`.
fn figures_until_kept(p: &mut Running) -> std::collections::HashMap<String, u64> {
    let mut own = std::collections::HashMap::new();
    loop {
        let line = p.line();
        let (name, value) = line.trim().split_once('=').unwrap();
        if name == "kept" {
            return own;
        }
        own.insert(name.to_string(), value.parse::<u64>().unwrap());
    }
}

/// Compiles tests/c/`name`.c into `exe`, linked with `libs` (after the source, as the
/// linker needs them).
fn compile_linked(exe: &std::path::Path, name: &str, libs: &[&str]) {
    // Inside another release's chroot, which has no compiler, the program comes built.
    if common::prebuilt(exe) {
        return;
    }
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}.c"));
    let ok = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(exe)
        .arg(&src)
        .args(libs)
        .status()
        .unwrap();
    assert!(ok.success(), "cc {name}.c {libs:?} failed");
}

/// `fragscope record` of tests/c/usable_sum.c's `exe` with 20 000 blocks (stdin closed:
/// it exits once it has printed its sum).
fn record_usable_sum(exe: &std::path::Path, trace: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(trace)
        .arg("--")
        .arg(exe)
        .arg("20000")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}
