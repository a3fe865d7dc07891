//! Times the two halves of reading a trace on one thread, apart, each the best of a few
//! rounds: decoding its event chunks into calls (`StreamDecoder`), and merging the
//! decoded calls (`Merger`), with the chunks already in memory.
//! usage: read_speed TRACE [rounds=5]
use std::collections::HashMap;
use std::time::{Duration, Instant};

use fragscope_trace::merge::{Merged, Merger};
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::stream_decoder::{DecodedEvents, StreamDecoder};
use fragscope_trace::EventsHeader;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: read_speed TRACE [rounds=5]");
        std::process::exit(2);
    };
    let rounds: usize = args.next().and_then(|r| r.parse().ok()).unwrap_or(5);
    let mut reader = TraceReader::open(std::path::Path::new(&path)).expect("a trace");
    let mut buffers: Vec<(EventsHeader, Vec<u8>)> = Vec::new();
    while let Some(chunk) = reader.next_chunk() {
        if let Chunk::Events(h, bytes) = chunk {
            buffers.push((h, bytes));
        }
    }
    let (mut best_decode, mut best_merge) = (Duration::MAX, Duration::MAX);
    let mut calls = 0u64;
    for _ in 0..rounds {
        let mut decoders: HashMap<u32, StreamDecoder> = HashMap::new();
        let mut mergers: HashMap<u32, Merger> = HashMap::new();
        let mut events = DecodedEvents::default();
        let (mut decode, mut merge) = (Duration::ZERO, Duration::ZERO);
        calls = 0;
        for (h, bytes) in &buffers {
            let started = Instant::now();
            decoders
                .entry(h.stream)
                .or_default()
                .decode(h, bytes, &mut events);
            let decoded = Instant::now();
            let m = mergers.entry(h.stream).or_default();
            m.push_decoded(h, &mut events).expect("merges");
            while let Some(item) = m.pop() {
                calls += matches!(item, Merged::Call(_)) as u64;
            }
            decode += decoded - started;
            merge += decoded.elapsed();
        }
        let started = Instant::now();
        for m in mergers.values_mut() {
            m.finish();
            while let Some(item) = m.pop() {
                calls += matches!(item, Merged::Call(_)) as u64;
            }
        }
        merge += started.elapsed();
        best_decode = best_decode.min(decode);
        best_merge = best_merge.min(merge);
    }
    let per_call = |d: Duration| d.as_secs_f64() * 1e9 / calls.max(1) as f64;
    println!(
        "{calls} calls: decode {:.3} s ({:.1} ns/call), merge {:.3} s ({:.1} ns/call)",
        best_decode.as_secs_f64(),
        per_call(best_decode),
        best_merge.as_secs_f64(),
        per_call(best_merge),
    );
}
