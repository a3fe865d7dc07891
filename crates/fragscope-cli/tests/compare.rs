//! `fragscope compare` runs one program under several allocators and settings, and puts
//! the same figures side by side; it also compares existing traces.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn fragscope(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap()
}

#[test]
fn allocators_and_settings_side_by_side() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cases/stripe.c");
    if !src.exists() {
        eprintln!("skipped: {} is not there", src.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("stripe");
    assert!(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let keep = dir.path().join("runs");
    let out = fragscope(&[
        "compare",
        "--json",
        "--allocators",
        "glibc,jemalloc",
        "--variant",
        "jemalloc:MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0",
        "--keep",
        keep.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        "take",
        "500000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cols = v["columns"].as_array().unwrap();
    let labels: Vec<&str> = cols.iter().map(|c| c["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "glibc",
            "jemalloc",
            "jemalloc MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0"
        ]
    );
    let n = |c: &Value, k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
    // The same program holds the same live data whatever the allocator.
    for c in cols {
        assert!(
            n(c, "live").abs_diff(n(&cols[1], "live")) < 256 << 10,
            "{c}"
        );
        assert_eq!(c["traces"].as_array().unwrap().len(), 1);
        assert!(c["wall_ms"].as_f64().unwrap() > 0.0);
    }
    // Purging at once returns take's free pages.
    assert!(n(&cols[2], "free_resident_pages") * 4 < n(&cols[1], "free_resident_pages"));
    assert!(n(&cols[2], "end_rss") * 2 < n(&cols[1], "end_rss"));
    // The kept traces compare as files too.
    let traces: Vec<String> = cols
        .iter()
        .map(|c| c["traces"][0].as_str().unwrap().to_string())
        .collect();
    let mut args = vec!["compare", "--json"];
    args.extend(traces.iter().map(String::as_str));
    let again = fragscope(&args);
    assert!(again.status.success());
    let v2: Value = serde_json::from_slice(&again.stdout).unwrap();
    for (a, b) in v2["columns"].as_array().unwrap().iter().zip(cols) {
        assert_eq!(a["peak_rss"], b["peak_rss"]);
        assert_eq!(a["free_resident_pages"], b["free_resident_pages"]);
    }
}

#[test]
fn wrong_allocators_and_arguments_get_clear_messages() {
    for (args, expect) in [
        (
            vec!["compare", "--allocators", "foo", "--", "true"],
            "unknown allocator",
        ),
        (vec!["compare"], "give traces to compare"),
        (
            vec!["compare", "--variant", "jemalloc", "--", "true"],
            "ALLOCATOR:NAME=VALUE",
        ),
        (vec!["compare", "/nonexistent.fsc"], "nonexistent"),
    ] {
        let out = fragscope(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
