//! Prints every recorded call on one address, per thread in program order, with ticks
//! and places (docs/trace-format.md, "Order"; `-`: before the buffer's first order record):
//! a debugging aid for the merge. usage: addr_history TRACE 0xADDR|tid=TID
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::{ChunkDecoder, Record, StreamTables};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `tid=T` instead of an address: every call of thread T.
    let tid: Option<u32> = args[2].strip_prefix("tid=").map(|t| t.parse().unwrap());
    let addr = match tid {
        Some(_) => 0,
        None => u64::from_str_radix(args[2].trim_start_matches("0x"), 16).unwrap(),
    };
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
                let released = d.take_released();
                let hit = match (tid, &rec) {
                    (Some(t), Record::Alloc { .. } | Record::Free { .. }) => t == h.tid,
                    (Some(_), _) => false,
                    (
                        None,
                        Record::Alloc {
                            addr: a,
                            old_addr: o,
                            ..
                        },
                    ) => *a == addr || *o == addr,
                    (None, Record::Free { addr: a }) => *a == addr,
                    (None, _) => false,
                };
                if hit {
                    let place = place.map_or("-".to_string(), |p| p.to_string());
                    let released = released.map_or(String::new(), |(tick, place)| {
                        format!(" (its old block released at tick {tick} place {place})")
                    });
                    println!(
                        "file chunk #{n} tid {} seq {} rec {i} tick {} place {place}: {rec:?}{released}",
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
