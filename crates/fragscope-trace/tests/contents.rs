//! A trace's contents, read from the first bytes of each chunk, against the same trace
//! read whole: the same processes, the same chunks per process, the same bytes of calls.

use std::collections::BTreeMap;

use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::{ChunkKind, StreamContents, TraceContents};

/// `fragscope record --stacks none -- reuse_threads`: events in zstd frames (codec 1).
const TRACE: &[u8] = include_bytes!("fixtures/threads.fsc");
/// The same program `--pack`ed: events stored in sections (codec 2).
const PACKED: &[u8] = include_bytes!("fixtures/threads-packed.fsc");

/// Each stream's chunks, read whole by the trace reader.
fn read_whole(data: &[u8]) -> (Vec<u32>, BTreeMap<u32, StreamContents>) {
    let mut r = TraceReader::<&[u8]>::from_reader(data, data.len() as u64).unwrap();
    let mut processes = Vec::new();
    let mut streams: BTreeMap<u32, StreamContents> = BTreeMap::new();
    fn count(
        streams: &mut BTreeMap<u32, StreamContents>,
        stream: u32,
        kind: ChunkKind,
    ) -> &mut StreamContents {
        let s = streams.entry(stream).or_default();
        *s.chunks.entry(kind).or_default() += 1;
        s
    }
    while let Some(c) = r.next_chunk() {
        match c {
            Chunk::Process(p) => processes.push(p.stream),
            Chunk::Events(h, records) => {
                let kind = if h.packed {
                    ChunkKind::PackedEvents
                } else {
                    ChunkKind::Events
                };
                count(&mut streams, h.stream, kind).event_bytes += records.len() as u64;
            }
            Chunk::Rss(b) => _ = count(&mut streams, b.stream, ChunkKind::Rss),
            Chunk::Pagemap(p) => _ = count(&mut streams, p.stream, ChunkKind::Pagemap),
            Chunk::Maps(m) => _ = count(&mut streams, m.stream, ChunkKind::Maps),
            Chunk::Rollup(x) => _ = count(&mut streams, x.stream, ChunkKind::Rollup),
            Chunk::ProcessEnd(e) => _ = count(&mut streams, e.stream, ChunkKind::ProcessEnd),
            _ => {}
        }
    }
    for p in &processes {
        streams.entry(*p).or_default();
    }
    (processes, streams)
}

#[test]
fn contents_match_the_trace_read_whole() {
    for (name, data) in [("threads", TRACE), ("threads-packed", PACKED)] {
        let contents = TraceContents::from_reader(data).unwrap();
        let (processes, streams) = read_whole(data);
        assert!(contents.damage.is_none(), "{name}");
        assert!(contents.meta.is_some(), "{name}");
        let seen: Vec<u32> = contents.processes.iter().map(|p| p.stream).collect();
        assert_eq!(seen, processes, "{name}");
        assert_eq!(contents.streams, streams, "{name}");
        let first = &contents.streams[&contents.first_stream().unwrap()];
        assert!(first.event_bytes > 4_000, "{name}: {}", first.event_bytes);
        assert!(!contents.first_process_has(ChunkKind::GhcCensus), "{name}");
    }
}

#[test]
fn a_cut_trace_has_the_contents_of_what_is_left() {
    let (_, whole) = read_whole(PACKED);
    let events =
        |s: &BTreeMap<u32, StreamContents>| -> u64 { s.values().map(|s| s.event_bytes).sum() };
    let mut last = 0;
    for cut in (17..PACKED.len()).step_by(97) {
        let contents = TraceContents::from_reader(&PACKED[..cut]).unwrap();
        assert!(
            contents.damage.is_some() || cut == PACKED.len(),
            "cut at {cut}"
        );
        let got = events(&contents.streams);
        assert!(got >= last && got <= events(&whole), "cut at {cut}");
        last = got;
    }
    assert!(TraceContents::from_reader(&PACKED[..10]).is_err());
}
