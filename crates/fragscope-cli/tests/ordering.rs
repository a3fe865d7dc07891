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
/// call but reads the order counter after it, so another thread handed that block
/// meanwhile can read a lower value; causality orders most such pairs, and a few are
/// forced (0 to 57 in 400 000 calls; 273 to 760 before the order counter).
#[test]
fn reallocs_of_blocks_that_change_threads_are_rarely_forced() {
    let dir = tempfile::tempdir().unwrap();
    let exe = common::build(dir.path(), "realloc_ring", &["-O2"]);
    let trace = dir.path().join("t.fsc");
    let out = common::record(Allocator::Glibc, &trace, &exe, &[]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let streams = common::stream_calls(&trace);
    let s = &streams[0];
    // 4 threads x 100000 rounds x (realloc, or free + malloc) + the displaced frees.
    assert!(s.calls > 400_000, "{} calls", s.calls);
    let forced = s.merge.forced_allocs + s.merge.unknown_frees;
    assert!(forced <= 200, "{forced} calls forced: {s:#?}");
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
