//! The ordering invariant on real programs: threads free each other's blocks and the
//! allocator hands the addresses out again at once; the merged trace must never have an
//! address live twice, and must need no forcing to get there.

mod common;

use common::Allocator;

/// Records reuse_threads with 8 threads of 40000 rounds, replays its merged calls and
/// checks that no address was ever live twice, with nothing forced.
fn check_order(alloc: Allocator) {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "reuse_threads", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(alloc, &trace, &exe, &["8", "40000"]);
    assert!(
        out.status.success(),
        "record failed: {}",
        common::stderr(&out)
    );
    let streams = common::stream_calls(&trace);
    assert_eq!(streams.len(), 1, "{streams:#?}");
    let s = &streams[0];
    assert_eq!(s.merge.lost_events, 0);
    // 8 threads x 40000 rounds x (malloc + free), the final frees and libc's own calls.
    assert!((640_000..641_000).contains(&s.calls), "{} calls", s.calls);
    assert!(
        s.cross_thread_reuse > 100,
        "the test must exercise cross-thread address reuse ({} seen)",
        s.cross_thread_reuse
    );
    assert_eq!(
        s.live_twice, 0,
        "addresses returned while still live: {s:#?}"
    );
    assert_eq!(s.unknown_frees, 0, "frees of addresses not live: {s:#?}");
    assert_eq!(
        s.merge.forced_allocs + s.merge.unknown_frees,
        0,
        "the merge had to force calls: {s:#?}"
    );
}

#[test]
fn cross_thread_address_reuse_is_never_misordered_under_glibc() {
    check_order(Allocator::Glibc);
}

#[test]
fn cross_thread_address_reuse_is_never_misordered_under_jemalloc() {
    check_order(Allocator::Jemalloc);
}

/// Reallocs of blocks that change threads: a realloc gives its old block back inside the
/// call, so another thread can be handed it and read the order counter before the realloc
/// reads it after the call. The realloc takes a value before the call for its release, and
/// the merge lets such an allocation take the block from it. Before that, 17 of 40
/// recordings had forced calls (1 to 31) and 16 calls merged late.
#[test]
fn reallocs_of_blocks_that_change_threads_are_never_forced() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "realloc_ring", &["-O2"]);
    for round in 0..5 {
        let trace = dir.path().join(format!("t{round}.fsc"));
        let out = common::record(Allocator::Glibc, &trace, &exe, &[]);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let streams = common::stream_calls(&trace);
        let s = &streams[0];
        // 4 threads x 100000 rounds x (realloc, or free + malloc) + the displaced frees.
        assert!(s.calls > 400_000, "{} calls", s.calls);
        assert_eq!(s.unknown_frees, 0, "round {round}: {s:#?}");
        assert_eq!(s.live_twice, 0, "round {round}: {s:#?}");
        let m = &s.merge;
        assert_eq!(
            (m.forced_allocs, m.unknown_frees, m.late, m.reordered),
            (0, 0, 0, 0),
            "round {round}: {s:#?}"
        );
    }
}

/// A thread that hands its blocks to workers and waits for them makes no call that
/// would send its buffer: it is sent when the thread starts another or joins one, and
/// by another thread once it has been idle for 10 ms, so its allocations come before
/// the workers' frees (before, 500 to 2000 of the frees were of blocks never allocated,
/// and those blocks stayed live).
#[test]
fn blocks_handed_to_other_threads_are_allocated_before_they_are_freed() {
    for alloc in [Allocator::Glibc, Allocator::Jemalloc] {
        for when in ["before", "after", "sleep"] {
            let dir = tempfile::tempdir().unwrap();
            let exe = common::build(dir.path(), "handoff", &["-O2"]);
            let trace = dir.path().join("t.fsc");
            let out = common::record(alloc, &trace, &exe, &[when, "2000", "400000"]);
            assert!(out.status.success(), "{}", common::stderr(&out));
            let streams = common::stream_calls(&trace);
            let s = &streams[0];
            let case = format!("{alloc:?}, {when}");
            assert!(s.calls > 3_200_000, "{case}: {} calls", s.calls);
            assert_eq!(
                s.unknown_frees, 0,
                "{case}: frees of blocks not live: {s:#?}"
            );
            assert_eq!(s.live_twice, 0, "{case}: {s:#?}");
            assert_eq!(
                s.merge.forced_allocs + s.merge.unknown_frees,
                0,
                "{case}: {s:#?}"
            );
        }
    }
}

/// larson.c's mark: the main thread frees a block of this size while every worker waits.
const LARSON_MARK: u64 = 1_234_567;

/// Records larson.c (blocks handed between `threads` threads) and checks the merge
/// exactly: nothing forced, unknown, late or lost; at the mark, the workers' live blocks
/// are exactly those the program counted in its slots; at the end, none.
fn larson_is_merged_exactly(alloc: Allocator, threads: u32, operations: u32, mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "larson", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let args = [
        threads.to_string(),
        operations.to_string(),
        mode.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::record(alloc, &trace, &exe, &args);
    let err = common::stderr(&out);
    assert!(out.status.success(), "record failed: {err}");
    // "mid: BYTES bytes in BLOCKS blocks"
    let counted: Vec<u64> = err
        .lines()
        .find_map(|l| l.strip_prefix("mid: "))
        .expect("larson prints its live blocks at the mark")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let streams = common::stream_calls_marked(&trace, Some(LARSON_MARK));
    assert_eq!(streams.len(), 1, "{streams:#?}");
    let s = &streams[0];
    let m = s.merge;
    assert_eq!(
        (m.forced_allocs, m.unknown_frees, m.late, m.lost_events),
        (0, 0, 0, 0),
        "{threads} threads ({mode}) under {alloc:?}: {s:#?}"
    );
    assert_eq!(s.disorder(), 0, "{s:#?}");
    // Each operation is a malloc and a free, and each worker's blocks change threads.
    let calls = 2 * u64::from(threads) * u64::from(operations);
    assert!(
        s.calls >= calls,
        "{} calls, expected {calls} at least",
        s.calls
    );
    assert_eq!(
        s.others_live_at_mark,
        Some((counted[0], counted[1])),
        "live blocks of the workers at the mark: {s:#?}"
    );
    assert_eq!(s.others_live_at_end, (0, 0), "{s:#?}");
    // What libc itself keeps (thread descriptors' memory, stdio): the program keeps none.
    assert!(s.first_thread_live_at_end.0 < 256 << 10, "{s:#?}");
}

#[test]
fn larson_48_threads_is_merged_exactly_under_glibc() {
    larson_is_merged_exactly(Allocator::Glibc, 48, 10_000, "saturate");
}

#[test]
fn larson_256_threads_is_merged_exactly_under_glibc() {
    larson_is_merged_exactly(Allocator::Glibc, 256, 4_000, "saturate");
}

#[test]
fn larson_128_threads_in_bursts_is_merged_exactly_under_glibc() {
    larson_is_merged_exactly(Allocator::Glibc, 128, 4_000, "bursts");
}

#[test]
fn larson_64_threads_is_merged_exactly_under_jemalloc() {
    larson_is_merged_exactly(Allocator::Jemalloc, 64, 10_000, "saturate");
}

#[test]
fn larson_128_threads_in_bursts_is_merged_exactly_under_jemalloc() {
    larson_is_merged_exactly(Allocator::Jemalloc, 128, 4_000, "bursts");
}

/// With hundreds of threads, calls that wait for slow threads go to a temporary file;
/// where none can be made, they wait in memory instead: the report's figures are the
/// same either way, and the report says why memory grew.
#[test]
fn calls_wait_in_memory_when_no_temporary_file_can_be_made() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "larson", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &["256", "4000"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let report = |tmpdir: &std::path::Path| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fragscope"))
            .args(["report", "--json"])
            .arg(&trace)
            .env("TMPDIR", tmpdir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let on_disk = report(dir.path());
    let in_memory = report(&dir.path().join("no such directory"));
    let merge = &on_disk["merge"];
    assert!(merge["spilled"].as_u64().unwrap() > 0, "{merge}");
    assert!(merge["spill_problem"].is_null(), "{merge}");
    let problem = in_memory["merge"]["spill_problem"].as_str().unwrap();
    assert!(problem.contains("no such directory"), "{problem}");
    for key in ["forced_allocs", "unknown_frees", "late", "lost_events"] {
        assert_eq!(in_memory["merge"][key], 0, "{key}: {}", in_memory["merge"]);
    }
    for key in ["snapshots", "timeline", "size_classes"] {
        assert_eq!(on_disk[key], in_memory[key], "{key}");
    }
}
