//! Prints every recorded call on one address, per thread in program order, with ticks
//! and places (docs/trace-format.md, "Order"; `-`: before the buffer's first order record):
//! a debugging aid for the merge. usage: addr_history TRACE 0xADDR
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::{ChunkDecoder, Record, StreamTables};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = u64::from_str_radix(args[2].trim_start_matches("0x"), 16).unwrap();
    let mut r = TraceReader::open(std::path::Path::new(&args[1])).unwrap();
    let mut tables: std::collections::HashMap<u32, StreamTables> = Default::default();
    let mut n = 0u64;
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, recs) = c {
            let mut d = ChunkDecoder::new(&recs, &h, tables.entry(h.stream).or_default());
            let mut i = 0;
            while let Ok(Some(rec)) = d.next_record() {
                i += 1;
                let place = d.place();
                let hit = match &rec {
                    Record::Alloc {
                        addr: a,
                        old_addr: o,
                        ..
                    } => *a == addr || *o == addr,
                    Record::Free { addr: a } => *a == addr,
                    _ => false,
                };
                if hit {
                    let place = place.map_or("-".to_string(), |p| p.to_string());
                    println!(
                        "file chunk #{n} tid {} seq {} rec {i} tick {} place {place}: {rec:?}",
                        h.tid,
                        h.seq,
                        d.tick()
                    );
                }
            }
            n += 1;
        }
    }
}
