//! Real traces (recorded from tests/c/reuse_threads.c, raw and `--pack`ed) cut, flipped
//! and spliced in many ways: the reader returns what is intact and reports where it
//! stopped; it never panics.

use fragscope_trace::ahead::{EventsOf, ReadAhead};
use fragscope_trace::chunk::FILE_HEADER_BYTES;
use fragscope_trace::merge::read_all_from_bytes;
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::{ChunkDecoder, ChunkKind, ChunkWriter, Record, StreamTables};

/// `fragscope record --stacks none -- reuse_threads`: raw event chunks.
const TRACE: &[u8] = include_bytes!("fixtures/threads.fsc");
/// `fragscope record --pack --stacks none -- reuse_threads 3 400`: packed events, stored
/// in sections (chunk codec 2), with order records (three threads).
const PACKED: &[u8] = include_bytes!("fixtures/threads-packed.fsc");
/// `fragscope record --pack --stacks none -- realloc_ring 400`: four threads reallocating
/// blocks they hand to each other, packed, with released records (a moving realloc's
/// counter value taken before the call).
const REALLOCS: &[u8] = include_bytes!("fixtures/reallocs-packed.fsc");

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
    for trace in [TRACE, PACKED, REALLOCS] {
        let (n, clean) = chunks_of(trace);
        assert!(n > 5 && clean);
    }
    assert!(read_all_from_bytes(TRACE) > 24_000);
    // Its 2473 calls (`fragscope info`) and one allocator-statistics record.
    assert_eq!(read_all_from_bytes(PACKED), 2474);
    assert!(
        order_records(PACKED).0 > 0,
        "the fixture must carry order records"
    );
    // Its 4103 calls (`fragscope info`) and one allocator-statistics record.
    assert_eq!(read_all_from_bytes(REALLOCS), 4104);
    assert!(
        order_records(REALLOCS).1 > 100,
        "the fixture must carry released records"
    );
}

/// The order and released records of a trace's event chunks (one stream).
fn order_records(data: &[u8]) -> (usize, usize) {
    let mut r = TraceReader::<&[u8]>::from_reader(data, data.len() as u64).expect("header intact");
    let mut tables = StreamTables::default();
    let (mut orders, mut releases) = (0, 0);
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, records) = c {
            let mut d = ChunkDecoder::new(&records, &h, &mut tables).report_all();
            while let Ok(Some(rec)) = d.next_record() {
                orders += usize::from(matches!(rec, Record::Order { .. }));
                releases += usize::from(matches!(rec, Record::Released { .. }));
            }
        }
    }
    (orders, releases)
}

#[test]
fn a_trace_cut_at_any_byte_keeps_its_whole_chunks() {
    for trace in [TRACE, PACKED, REALLOCS] {
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
        let mut data = [TRACE, PACKED, REALLOCS][round / 3 % 3].to_vec();
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

/// One intact chunk of `kind` whose payload is `payload`, without the file's header.
fn chunk_bytes(kind: ChunkKind, payload: &[u8]) -> Vec<u8> {
    let mut w = ChunkWriter::new(Vec::new(), 3).expect("in memory");
    w.write_chunk(kind, payload).expect("in memory");
    w.into_inner()[FILE_HEADER_BYTES as usize..].to_vec()
}

/// `trace` with `extra` put between its second and third chunks; and where it went.
fn spliced_after_two_chunks(trace: &[u8], extra: &[u8]) -> (Vec<u8>, u64) {
    let mut r =
        TraceReader::<&[u8]>::from_reader(trace, trace.len() as u64).expect("header intact");
    r.next_chunk();
    r.next_chunk();
    let at = r.offset() as usize;
    let mut out = trace[..at].to_vec();
    out.extend_from_slice(extra);
    out.extend_from_slice(&trace[at..]);
    (out, at as u64)
}

/// A census (or any other observation nothing later builds on) whose checksum holds but
/// whose payload does not decode is passed over, said so, and every chunk and call after
/// it still read; the same bytes as a process record still stop the reading there.
#[test]
fn an_observation_that_does_not_decode_is_skipped_and_the_rest_read() {
    let garbage = [0xffu8; 40];
    for trace in [TRACE, PACKED, REALLOCS] {
        let (all, _) = chunks_of(trace);
        let calls = read_all_from_bytes(trace);
        let (data, at) =
            spliced_after_two_chunks(trace, &chunk_bytes(ChunkKind::SbclCensus, &garbage));
        assert_eq!(chunks_of(&data), (all, true));
        assert_eq!(read_all_from_bytes(&data), calls);

        for ahead in [false, true] {
            let reader =
                TraceReader::from_reader(std::io::Cursor::new(data.clone()), data.len() as u64)
                    .unwrap();
            let mut r = ReadAhead::new(reader, ahead, EventsOf::All).unwrap();
            while r.next_chunk().is_some() {}
            assert!(r.damage().is_none());
            let skipped = r.skipped();
            assert_eq!(skipped.count, 1, "read ahead: {ahead}");
            assert_eq!(skipped.first.as_ref().map(|d| d.offset), Some(at));
            let note = skipped.note().unwrap();
            assert!(
                note.contains("SbclCensus") && note.contains(&at.to_string()),
                "{note}"
            );
        }

        let (data, at) =
            spliced_after_two_chunks(trace, &chunk_bytes(ChunkKind::Process, &garbage));
        let mut r = TraceReader::<&[u8]>::from_reader(&data, data.len() as u64).unwrap();
        let mut n = 0;
        while r.next_chunk().is_some() {
            n += 1;
        }
        assert_eq!(n, 2);
        assert_eq!(r.damage().map(|d| d.offset), Some(at));
        assert_eq!(r.skipped().count, 0);
    }
}
