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
        assert!(
            headline.contains(&format!("allocates through a {allocator} linked into it")),
            "{allocator}: {headline}"
        );
        // Never malloc's advice for memory malloc does not hold.
        for advice in ["purge", "trim", "pinned by a few live objects"] {
            assert!(!headline.contains(advice), "{allocator}: {headline}");
        }
        assert_eq!(r["headline"]["dominant"], "other_anon");
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
        let out = fragscope(&[
            "snapshot".as_ref(),
            p.pid().to_string().as_ref(),
            "-o".as_ref(),
            trace.as_os_str(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let r = report_json(&trace);
        let s = &r["snapshot"];
        assert_eq!(s["allocator"], allocator, "{s}");
        let note = s["note"].as_str().unwrap_or_default();
        assert!(
            note.contains(&format!("a {allocator} linked into linked_alloc")),
            "{note}"
        );
        assert_eq!(r["linked_allocator"]["allocator"], allocator);
        p.send("");
    }
}

/// A C program linked with Debian's static jemalloc defines malloc itself: every call,
/// the C library's own included, goes to it, and the trace holds none.
#[test]
fn a_c_program_linked_with_a_static_jemalloc_takes_every_malloc_call() {
    let archive = "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a";
    assert!(
        std::path::Path::new(archive).exists(),
        "{archive} is missing: install Debian's libjemalloc-dev"
    );
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("usable_sum_static_jemalloc");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/c/usable_sum.c");
    let ok = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .args([archive, "-lm", "-ldl"])
        .status()
        .unwrap();
    assert!(ok.success());
    let trace = dir.path().join("static.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .arg("20000")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("every malloc call in the process goes to it"),
        "{err}"
    );
    let r = report_json(&trace);
    assert_eq!(r["linked_allocator"]["serves_malloc"], true);
    assert_eq!(r["calls"], 0, "{}", r["calls"]);
    let headline = r["headline"]["sentence"].as_str().unwrap();
    assert!(headline.contains("defines malloc"), "{headline}");
}

/// A program on the C library's malloc links no allocator: no warning, no field.
#[test]
fn a_program_on_glibc_links_no_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "usable_sum", &[]);
    let trace = dir.path().join("glibc.fsc");
    let out = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["record", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&exe)
        .arg("20000")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
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
