//! Real traces (recorded from tests/c/reuse_threads.c, raw and `--pack`ed) cut, flipped
//! and spliced in many ways: the reader returns what is intact and reports where it
//! stopped; it never panics.

use fragscope_trace::reader::{read_all_from_bytes, Chunk, TraceReader};
use fragscope_trace::{ChunkDecoder, Record, StreamTables};

/// `fragscope record --stacks none -- reuse_threads`: raw event chunks.
const TRACE: &[u8] = include_bytes!("fixtures/threads.fsc");
/// `fragscope record --pack --stacks none -- reuse_threads 3 400`: packed events, stored
/// in sections (chunk codec 2), with order records (three threads).
const PACKED: &[u8] = include_bytes!("fixtures/threads-packed.fsc");

fn chunks_of(data: &[u8]) -> (usize, bool) {
    let mut r = TraceReader::<&[u8]>::from_reader(data, data.len() as u64).expect("header intact");
    let mut n = 0;
    let mut ended = false;
    while let Some(c) = r.next_chunk() {
        ended = matches!(c, Chunk::End(_));
        n += 1;
    }
    (n, ended && r.damage().is_none())
}

#[test]
fn the_intact_fixtures_read_completely() {
    let (n, clean) = chunks_of(TRACE);
    assert!(n > 5 && clean);
    assert!(read_all_from_bytes(TRACE) > 24_000);
    let (n, clean) = chunks_of(PACKED);
    assert!(n > 5 && clean);
    // Its 2473 calls (`fragscope info`) and one allocator-statistics record.
    assert_eq!(read_all_from_bytes(PACKED), 2474);
    assert!(
        order_records(PACKED) > 0,
        "the fixture must carry order records"
    );
}

/// The order records of a trace's event chunks (one stream).
fn order_records(data: &[u8]) -> usize {
    let mut r = TraceReader::<&[u8]>::from_reader(data, data.len() as u64).expect("header intact");
    let mut tables = StreamTables::default();
    let mut n = 0;
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, records) = c {
            let mut d = ChunkDecoder::new(&records, &h, &mut tables).report_all();
            while let Ok(Some(rec)) = d.next_record() {
                n += usize::from(matches!(rec, Record::Order { .. }));
            }
        }
    }
    n
}

#[test]
fn a_trace_cut_at_any_byte_keeps_its_whole_chunks() {
    for trace in [TRACE, PACKED] {
        let (all, _) = chunks_of(trace);
        let mut previous = 0;
        for cut in 16..trace.len() {
            let (n, clean) = chunks_of(&trace[..cut]);
            assert!(!clean, "a cut trace must not look complete (cut at {cut})");
            assert!(n >= previous && n < all, "cut at {cut}: {n} chunks");
            previous = n;
            if cut % 97 == 0 {
                read_all_from_bytes(&trace[..cut]);
            }
        }
    }
}

#[test]
fn flipped_bits_and_spliced_bytes_never_panic() {
    let mut x = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..3000 {
        let mut data = if round / 3 % 2 == 0 { TRACE } else { PACKED }.to_vec();
        match round % 3 {
            0 => {
                let at = (next() as usize) % data.len();
                data[at] ^= 1 << (next() % 8);
            }
            1 => {
                let at = (next() as usize) % data.len();
                let len = (next() as usize % 64).min(data.len() - at);
                for b in &mut data[at..at + len] {
                    *b = next() as u8;
                }
            }
            _ => {
                let from = (next() as usize) % data.len();
                let to = (next() as usize) % data.len();
                let len = (next() as usize % 200).min(data.len() - from.max(to));
                data.copy_within(from..from + len, to);
            }
        }
        read_all_from_bytes(&data);
    }
}
