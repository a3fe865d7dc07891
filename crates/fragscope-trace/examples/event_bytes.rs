//! Prints how many bytes a trace's event records take before compression, per call: a
//! measuring aid for the packed form. usage: event_bytes TRACE
use fragscope_trace::reader::{Chunk, TraceReader};

fn main() {
    let path = std::env::args().nth(1).expect("usage: event_bytes TRACE");
    let mut r = TraceReader::open(std::path::Path::new(&path)).expect("a trace");
    let (mut bytes, mut chunks) = (0u64, 0u64);
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(_, recs) = c {
            bytes += recs.len() as u64;
            chunks += 1;
        }
    }
    println!(
        "{chunks} event chunks, {bytes} bytes of records, file {} bytes",
        r.file_bytes()
    );
}
