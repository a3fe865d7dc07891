//! Prints how many bytes a trace's event records take before compression, per call, and
//! how many records of each kind they hold: a measuring aid for the trace's forms.
//! usage: event_bytes TRACE
use std::collections::{BTreeMap, HashMap};

use fragscope_trace::event::{ChunkDecoder, Record, StreamTables};
use fragscope_trace::reader::{Chunk, TraceReader};

fn main() {
    let path = std::env::args().nth(1).expect("usage: event_bytes TRACE");
    let mut r = TraceReader::open(std::path::Path::new(&path)).expect("a trace");
    let (mut bytes, mut chunks) = (0u64, 0u64);
    let mut tables: HashMap<u32, StreamTables> = HashMap::new();
    let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, recs) = c {
            bytes += recs.len() as u64;
            chunks += 1;
            let t = tables.entry(h.stream).or_default();
            let mut d = ChunkDecoder::new(&recs, &h, t).report_all();
            while let Ok(Some(rec)) = d.next_record() {
                let kind = match rec {
                    Record::Alloc { stack: 0, .. } => "alloc",
                    Record::Alloc { .. } => "alloc with stack",
                    Record::Free { .. } => "free",
                    Record::StackDef { .. } => "stack definition",
                    Record::Stats { .. } => "allocator statistics",
                    Record::Lost { .. } => "lost",
                    Record::Joined { .. } => "joined",
                    Record::Forked { .. } => "forked",
                    Record::OwnMemory { .. } => "own memory",
                    Record::Tick { .. } => "tick",
                    Record::Usable { .. } => "usable size",
                    Record::Order { .. } => "order",
                    Record::Released { .. } => "released",
                    Record::Summed { .. } => "summed",
                    Record::Live { .. } => "live",
                };
                *kinds.entry(kind).or_default() += 1;
            }
        }
    }
    println!(
        "{chunks} event chunks, {bytes} bytes of records, file {} bytes",
        r.file_bytes()
    );
    for (kind, n) in kinds {
        println!("{n:>12} {kind}");
    }
}
