//! Merges a trace's first process and reports the calls that break the ordering
//! invariant; with an address, also prints every merged call on it.
//! usage: check_order TRACE [0xADDR]
use fragscope_trace::merge::{AddrSet, Merged, Merger};
use fragscope_trace::reader::{Chunk, TraceReader};

fn main() {
    let path = std::env::args().nth(1).unwrap();
    let watch = std::env::args()
        .nth(2)
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    let mut r = TraceReader::open(std::path::Path::new(&path)).unwrap();
    let mut m = Merger::new();
    let mut live = AddrSet::default();
    let check = |x: Merged, live: &mut AddrSet| {
        if let Merged::Call(c) = x {
            if watch.is_some_and(|w| c.releases() == Some(w) || c.allocates() == Some(w)) {
                println!("merged {c:?}");
            }
            if let Some(a) = c.releases() {
                if !live.remove(&a) {
                    println!("bad free {a:#x} {c:?}");
                }
            }
            if let Some(a) = c.allocates() {
                if !live.insert(a) {
                    println!("double {a:#x} {c:?}");
                }
            }
        }
    };
    while let Some(c) = r.next_chunk() {
        if let Chunk::Events(h, recs) = c {
            if let Err(e) = m.push_chunk(&h, &recs) {
                let n = recs.len().min(48);
                println!("chunk {h:?} len {}: {e}: {:02x?}", recs.len(), &recs[..n]);
            }
            while let Some(x) = m.pop() {
                check(x, &mut live);
            }
        }
    }
    m.finish();
    while let Some(x) = m.pop() {
        check(x, &mut live);
    }
    println!("{:?}", m.stats());
}
