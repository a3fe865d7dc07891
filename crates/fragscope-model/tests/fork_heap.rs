//! A forked process starts from its parent's live blocks at the fork, whichever of the
//! parent's mark and the child's chunks the trace holds first.
use fragscope_model::analyze::{analyze, Options};
use fragscope_model::report::Report;
use fragscope_trace::records::{Origin, Process};
use fragscope_trace::wire::Writer;
use fragscope_trace::{ChunkKind, ChunkWriter, EventsHeader};

const PARENT: u32 = 100;
const CHILD: u32 = 200;
const GRANDCHILD: u32 = 300;

/// A record of one thread's buffer.
enum Rec {
    Malloc(u64, u64),
    Free(u64),
    Fork(u32),
}

/// Thread `tid`'s raw buffer `seq` of `stream` at `tick`.
fn events(stream: u32, tid: u32, seq: u32, tick: u64, recs: &[Rec]) -> Vec<u8> {
    let mut w = Writer::new();
    let mut prev = 0u64;
    for r in recs {
        match *r {
            Rec::Malloc(addr, size) => {
                w.u8(0).svarint((addr.wrapping_sub(prev) as i64) / 16);
                w.varint(size);
                prev = addr;
            }
            Rec::Free(addr) => {
                w.u8(9).svarint((addr.wrapping_sub(prev) as i64) / 16);
                prev = addr;
            }
            Rec::Fork(mark) => {
                w.u8(14 | 0x20).varint(mark.into());
            }
        }
    }
    EventsHeader {
        stream,
        tid,
        seq,
        first_tick: tick,
        last_tick: tick,
        ..Default::default()
    }
    .encode_with(&w.bytes)
}

fn process(stream: u32, pid: u32, parent: Option<(u32, u32)>, fork_mark: Option<u32>) -> Vec<u8> {
    Process {
        stream,
        pid,
        ppid: parent.map_or(1, |p| p.1),
        origin: if parent.is_some() {
            Origin::Forked
        } else {
            Origin::Started
        },
        parent_stream: parent.map(|p| p.0),
        start_tick: 0,
        argv: vec!["prefork".into()],
        exe: "/bin/prefork".into(),
        fork_mark,
    }
    .encode()
}

/// The parent allocates 0x1000 (100 bytes) and 0x2000 (200), forks (mark 1), then frees
/// 0x1000 and allocates 0x3000; the child frees 0x2000 and allocates 0x4000 (50).
fn parent_events() -> Vec<u8> {
    events(
        0,
        PARENT,
        0,
        1,
        &[
            Rec::Malloc(0x1000, 100),
            Rec::Malloc(0x2000, 200),
            Rec::Fork(1),
            Rec::Free(0x1000),
            Rec::Malloc(0x3000, 300),
        ],
    )
}

fn child_events() -> Vec<u8> {
    events(
        1,
        CHILD,
        0,
        2,
        &[Rec::Free(0x2000), Rec::Malloc(0x4000, 50)],
    )
}

/// Writes `chunks` as a trace and reports on `pid`.
fn report(chunks: &[(ChunkKind, Vec<u8>)], pid: u32) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fsc");
    let mut w = ChunkWriter::new(std::fs::File::create(&path).unwrap(), 3).unwrap();
    for (kind, payload) in chunks {
        w.write_chunk(*kind, payload).unwrap();
    }
    w.flush().unwrap();
    drop(w);
    let opts = Options {
        pid: Some(pid),
        ..Options::default()
    };
    analyze(&path, &opts, |_, _| {}).unwrap()
}

fn assert_started_from_the_parents_heap(r: &Report) {
    let m = &r.merge;
    assert_eq!(
        (m.unknown_frees, m.inherited_frees, m.forced_allocs),
        (0, 0, 0),
        "{m:?}"
    );
    assert_eq!(m.forked_from, Some(PARENT));
    assert_eq!(
        (m.inherited_blocks, m.inherited_bytes),
        (Some(2), Some(300))
    );
    // It kept 0x1000 (100 bytes, its parent's) and allocated 0x4000 (50).
    assert_eq!(r.headline.peak_live, Some(300));
    assert_eq!((r.leaks.leaked_blocks, r.leaks.leaked_bytes), (1, 50));
    assert_eq!(
        (r.leaks.inherited_live_blocks, r.leaks.inherited_live_bytes),
        (1, 100)
    );
}

#[test]
fn a_child_whose_chunks_come_before_the_parents_mark_waits_for_it() {
    let r = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), Some(1)),
            ),
            (ChunkKind::Events, child_events()),
            (ChunkKind::Events, parent_events()),
        ],
        CHILD,
    );
    assert_started_from_the_parents_heap(&r);
    assert!(!r.merge.inherited_from_parent_end);
}

#[test]
fn a_child_whose_chunks_come_after_the_parents_mark_takes_the_heap_kept_there() {
    let r = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (ChunkKind::Events, parent_events()),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), Some(1)),
            ),
            (ChunkKind::Events, child_events()),
        ],
        CHILD,
    );
    assert_started_from_the_parents_heap(&r);
    // The parent's own figures do not change.
    let p = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (ChunkKind::Events, parent_events()),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), Some(1)),
            ),
            (ChunkKind::Events, child_events()),
        ],
        PARENT,
    );
    assert_eq!(p.merge.inherited_blocks, None);
    assert_eq!((p.leaks.leaked_blocks, p.leaks.leaked_bytes), (2, 500));
}

#[test]
fn a_grandchild_starts_from_its_parents_heap_which_started_from_its_own_parents() {
    // The child forks (its mark 2) after freeing 0x2000: the grandchild holds 0x1000,
    // the first parent's block, and 0x4000, the child's, and frees both.
    let child = events(
        1,
        CHILD,
        0,
        2,
        &[Rec::Free(0x2000), Rec::Malloc(0x4000, 50), Rec::Fork(2)],
    );
    let grandchild = events(2, GRANDCHILD, 0, 3, &[Rec::Free(0x1000), Rec::Free(0x4000)]);
    let r = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), Some(1)),
            ),
            (
                ChunkKind::Process,
                process(2, GRANDCHILD, Some((1, CHILD)), Some(2)),
            ),
            (ChunkKind::Events, grandchild),
            (ChunkKind::Events, child),
            (ChunkKind::Events, parent_events()),
        ],
        GRANDCHILD,
    );
    let m = &r.merge;
    assert_eq!((m.unknown_frees, m.inherited_frees), (0, 0), "{m:?}");
    assert_eq!(
        (m.inherited_blocks, m.inherited_bytes),
        (Some(2), Some(150))
    );
    assert_eq!(r.leaks.leaked_blocks + r.leaks.inherited_live_blocks, 0);
}

#[test]
fn without_a_mark_the_frees_of_inherited_blocks_are_counted_apart() {
    // An older trace names no mark.
    let r = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), None),
            ),
            (ChunkKind::Events, child_events()),
            (ChunkKind::Events, parent_events()),
        ],
        CHILD,
    );
    let m = &r.merge;
    assert_eq!((m.unknown_frees, m.inherited_frees), (0, 1), "{m:?}");
    assert_eq!(m.inherited_blocks, None);
    assert_eq!(r.headline.peak_live, Some(50));
    assert_eq!(r.leaks.leaked_bytes, 50);
}

#[test]
fn a_trace_cut_before_the_parents_mark_starts_the_child_from_the_parents_last_heap() {
    let parent_cut = events(
        0,
        PARENT,
        0,
        1,
        &[Rec::Malloc(0x1000, 100), Rec::Malloc(0x2000, 200)],
    );
    let r = report(
        &[
            (ChunkKind::Process, process(0, PARENT, None, None)),
            (
                ChunkKind::Process,
                process(1, CHILD, Some((0, PARENT)), Some(1)),
            ),
            (ChunkKind::Events, child_events()),
            (ChunkKind::Events, parent_cut),
        ],
        CHILD,
    );
    assert_started_from_the_parents_heap(&r);
    assert!(r.merge.inherited_from_parent_end);
}
