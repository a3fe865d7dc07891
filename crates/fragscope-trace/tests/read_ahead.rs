//! Reading ahead on a thread of its own (`ahead::ReadAhead`) merges real traces (three
//! threads, raw and packed) exactly as the merge decoding each buffer itself does, and
//! stops at damage where the plain reader stops, saying the same.

use std::collections::HashMap;

use fragscope_trace::ahead::{AheadChunk, EventsOf, ReadAhead};
use fragscope_trace::merge::{Merged, Merger};
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::Damage;

/// `fragscope record --stacks none -- reuse_threads`: raw event chunks.
const TRACE: &[u8] = include_bytes!("fixtures/threads.fsc");
/// `fragscope record --pack --stacks none -- reuse_threads 3 400`: packed, with places.
const PACKED: &[u8] = include_bytes!("fixtures/threads-packed.fsc");

/// What a merge of every stream gave: its items in order, stats, the chunks seen, and
/// where reading stopped.
#[derive(Debug, PartialEq, Default)]
struct Outcome {
    items: Vec<(u32, Merged)>,
    stats: Vec<(u32, String)>,
    chunks: usize,
    damage: Option<Damage>,
    errors: Vec<String>,
}

fn drain(stream: u32, m: &mut Merger, items: &mut Vec<(u32, Merged)>) {
    while let Some(item) = m.pop() {
        items.push((stream, item));
    }
}

fn finish(mut mergers: HashMap<u32, Merger>, mut out: Outcome) -> Outcome {
    let mut streams: Vec<u32> = mergers.keys().copied().collect();
    streams.sort();
    for s in streams {
        let m = mergers.get_mut(&s).unwrap();
        m.finish();
        drain(s, m, &mut out.items);
        out.stats.push((s, format!("{:?}", m.stats())));
    }
    out
}

/// The merge decoding each buffer itself, from the plain reader.
fn merged_in_place(data: &'static [u8]) -> Outcome {
    let mut r = TraceReader::from_reader(data, data.len() as u64).expect("header intact");
    let mut mergers: HashMap<u32, Merger> = HashMap::new();
    let mut out = Outcome::default();
    while let Some(c) = r.next_chunk() {
        out.chunks += 1;
        if let Chunk::Events(h, records) = c {
            let m = mergers.entry(h.stream).or_default();
            if let Err(e) = m.push_chunk(&h, &records) {
                out.errors.push(e.to_string());
            }
            drain(h.stream, m, &mut out.items);
        }
    }
    out.damage = r.damage().cloned();
    finish(mergers, out)
}

/// The same through a `ReadAhead` (on its thread, or inline: the merge decodes).
fn merged_ahead(data: &'static [u8], ahead: bool) -> Outcome {
    let r = TraceReader::from_reader(data, data.len() as u64).expect("header intact");
    let mut r = ReadAhead::new(r, ahead, EventsOf::All).expect("reader starts");
    let mut mergers: HashMap<u32, Merger> = HashMap::new();
    let mut out = Outcome::default();
    while let Some(c) = r.next_chunk() {
        out.chunks += 1;
        let AheadChunk::Events(h, events) = c else {
            continue;
        };
        let m = mergers.entry(h.stream).or_default();
        let result = r.push_events(m, &h, events);
        if let Err(e) = result {
            out.errors.push(e.to_string());
        }
        drain(
            h.stream,
            mergers.get_mut(&h.stream).unwrap(),
            &mut out.items,
        );
    }
    out.damage = r.damage().cloned();
    finish(mergers, out)
}

#[test]
fn reading_ahead_merges_as_decoding_in_place() {
    for trace in [TRACE, PACKED] {
        let reference = merged_in_place(trace);
        assert!(reference.items.len() > 2000, "{}", reference.items.len());
        assert!(reference.damage.is_none() && reference.errors.is_empty());
        assert_eq!(merged_ahead(trace, true), reference);
        assert_eq!(merged_ahead(trace, false), reference);
    }
}

#[test]
fn reading_ahead_stops_at_damage_as_the_reader_does() {
    for trace in [TRACE, PACKED] {
        // Cuts inside chunks, and a flipped byte in the middle of an events chunk's
        // payload (a checksum mismatch), each far enough in to have merged calls.
        for cut in [trace.len() / 3, trace.len() / 2, trace.len() - 7] {
            let data: &'static [u8] = Box::leak(trace[..cut].to_vec().into_boxed_slice());
            let reference = merged_in_place(data);
            assert!(reference.damage.is_some(), "cut at {cut}");
            assert_eq!(merged_ahead(data, true), reference, "cut at {cut}");
        }
        let mut flipped = trace.to_vec();
        let at = flipped.len() / 2;
        flipped[at] ^= 0x40;
        let data: &'static [u8] = Box::leak(flipped.into_boxed_slice());
        let reference = merged_in_place(data);
        assert!(reference.damage.is_some());
        assert_eq!(merged_ahead(data, true), reference);
    }
}

#[test]
fn an_analysis_that_stops_early_lets_the_reader_go() {
    let r = TraceReader::from_reader(TRACE, TRACE.len() as u64).expect("header intact");
    let mut r = ReadAhead::new(r, true, EventsOf::All).expect("reader starts");
    assert!(r.next_chunk().is_some());
    // Dropping it with chunks still queued must not hang on the reading thread.
    drop(r);
}

#[test]
fn reading_ahead_for_one_stream_leaves_the_others_out() {
    // The fixture's one process image, then one that is not there.
    let reference = merged_in_place(PACKED);
    let stream = reference.items[0].0;
    for ahead in [true, false] {
        let events = |of: EventsOf| {
            let r = TraceReader::from_reader(PACKED, PACKED.len() as u64).unwrap();
            let mut r = ReadAhead::new(r, ahead, of).unwrap();
            let mut n = 0;
            while let Some(c) = r.next_chunk() {
                n += usize::from(matches!(c, AheadChunk::Events(..)));
                assert!(!matches!(c, AheadChunk::Other(Chunk::Events(..))));
            }
            n
        };
        let all = events(EventsOf::All);
        assert!(all > 3);
        assert_eq!(events(EventsOf::Streams(vec![stream])), all);
        assert_eq!(events(EventsOf::Streams(vec![stream + 1])), 0);
        assert_eq!(events(EventsOf::None), 0);
    }
}
