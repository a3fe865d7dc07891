//! A page-residency snapshot describes the heap at its own moment: the call that comes
//! after it, which the model must take before it knows the moment has passed, is not
//! part of it.
use fragscope_model::analyze::{analyze, Options};
use fragscope_trace::records::{Pagemap, ResidentRange, SnapshotReason};
use fragscope_trace::wire::Writer;
use fragscope_trace::{ChunkKind, ChunkWriter, EventsHeader};

const PAGE: u64 = 4096;
const HEAP: u64 = 0x7f00_0000_0000;

/// One thread's raw buffer of mallocs of one page each, at `tick`.
fn mallocs(seq: u32, tick: u64, addrs: &[u64]) -> Vec<u8> {
    let mut w = Writer::new();
    let mut prev = 0u64;
    for &addr in addrs {
        w.u8(0); // malloc
        w.svarint((addr.wrapping_sub(prev) as i64) / 16);
        prev = addr;
        w.varint(PAGE);
    }
    EventsHeader {
        tid: 1,
        seq,
        first_tick: tick,
        last_tick: tick,
        ..Default::default()
    }
    .encode_with(&w.bytes)
}

/// A trace with a snapshot at tick 20 between a call at tick 10 and `later` at tick 30,
/// in the order the recorder may write them: the snapshot before either buffer.
fn live_at_the_snapshot(later: &[u64]) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fsc");
    let mut w = ChunkWriter::new(std::fs::File::create(&path).unwrap(), 3).unwrap();
    let pagemap = Pagemap {
        stream: 0,
        tick: 20,
        reason: SnapshotReason::Periodic,
        page_size: PAGE as u32,
        ranges: vec![ResidentRange {
            start: HEAP,
            pages: 8,
            resident: vec![0xff],
            ..Default::default()
        }],
    };
    w.write_chunk(ChunkKind::Pagemap, &pagemap.encode())
        .unwrap();
    w.write_chunk(ChunkKind::Events, &mallocs(0, 10, &[HEAP]))
        .unwrap();
    w.write_chunk(ChunkKind::Events, &mallocs(1, 30, later))
        .unwrap();
    w.flush().unwrap();
    drop(w);
    let report = analyze(&path, &Options::default(), |_, _| {}).unwrap();
    assert_eq!(report.snapshots.len(), 1, "{:?}", report.snapshots);
    report.snapshots[0].parts.live
}

#[test]
fn a_snapshot_holds_the_calls_before_it_and_not_the_one_after() {
    // The first call after the moment is left out, whatever follows it.
    assert_eq!(live_at_the_snapshot(&[HEAP + PAGE]), PAGE);
    assert_eq!(live_at_the_snapshot(&[HEAP + PAGE, HEAP + 2 * PAGE]), PAGE);
}
