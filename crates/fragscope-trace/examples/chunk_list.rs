//! Lists the events chunks of a trace (thread, seq, ticks, bytes): a debugging aid.
use fragscope_trace::reader::{Chunk, TraceReader};
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let mut r = TraceReader::open(std::path::Path::new(&path)).unwrap();
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, recs) = c {
            println!(
                "tid {} seq {} ticks {}..{} exited {} idle {} bytes {} head {:02x?}",
                h.tid,
                h.seq,
                h.first_tick,
                h.last_tick,
                h.thread_exited,
                h.thread_idle,
                recs.len(),
                &recs[..recs.len().min(8)]
            );
        }
    }
}
