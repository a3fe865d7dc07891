//! Merges a trace's first process and reports the calls that break the ordering
//! invariant; with an address, also prints every merged call on it and every buffer as
//! it is pushed. Ends with the
//! merge's statistics and what is live at the end, split between the first thread to
//! call (the main thread, and libc's own blocks) and the others.
//! usage: check_order TRACE [0xADDR]
use fragscope_trace::hash::AddrMap;
use fragscope_trace::merge::{Merged, Merger};
use fragscope_trace::reader::{Chunk, TraceReader};

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: check_order TRACE [0xADDR]");
        std::process::exit(2);
    };
    let watch = std::env::args()
        .nth(2)
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    let mut r = match TraceReader::open(std::path::Path::new(&path)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("check_order: {path}: {e}");
            std::process::exit(1);
        }
    };
    let mut m = Merger::new();
    // Live blocks: size and allocating thread.
    let mut live: AddrMap<(u64, u32)> = AddrMap::default();
    let mut first_tid = None;
    // `taken`: the merge says the call took its block from a realloc of another thread
    // placed after it (MergeStats::taken_from_reallocs), which then releases nothing.
    let mut check = |x: Merged, live: &mut AddrMap<(u64, u32)>, taken: bool| {
        if let Merged::Call(c) = x {
            first_tid.get_or_insert(c.tid);
            if watch.is_some_and(|w| c.releases() == Some(w) || c.allocates() == Some(w)) {
                println!("merged {c:?}");
            }
            if let Some(a) = c.releases() {
                if live.remove(&a).is_none() {
                    println!("bad free {a:#x} {c:?}");
                }
            }
            if let Some(a) = c.allocates() {
                if live.insert(a, (c.size, c.tid)).is_some() && !taken {
                    println!("double {a:#x} {c:?}");
                }
            }
        }
    };
    while let Some(c) = r.next_chunk() {
        if let Chunk::Process(p) = &c {
            if p.origin == fragscope_trace::Origin::Attached {
                m.set_attached();
            }
        }
        if let Chunk::StartingHeap(h) = &c {
            m.seed_starting_heap(h.tick, &h.blocks);
            for &(a, usable) in &h.blocks {
                live.entry(a).or_insert((usable, 0));
            }
        }
        if let Chunk::Events(h, recs) = c {
            if watch.is_some() {
                println!(
                    "push tid {} seq {} ticks {}..{}",
                    h.tid, h.seq, h.first_tick, h.last_tick
                );
            }
            if let Err(e) = m.push_chunk(&h, &recs) {
                let n = recs.len().min(48);
                println!("chunk {h:?} len {}: {e}: {:02x?}", recs.len(), &recs[..n]);
            }
            let mut reordered = m.stats().reordered;
            let mut taken = m.stats().taken_from_reallocs;
            while let Some(x) = m.pop() {
                if watch.is_some() && m.stats().reordered > reordered {
                    reordered = m.stats().reordered;
                    if let Merged::Call(c) = &x {
                        println!("taken past a waiting call: {c:?}");
                    }
                }
                let took = m.stats().taken_from_reallocs > taken;
                taken = m.stats().taken_from_reallocs;
                check(x, &mut live, took);
            }
        }
    }
    m.finish();
    let mut taken = m.stats().taken_from_reallocs;
    while let Some(x) = m.pop() {
        let took = m.stats().taken_from_reallocs > taken;
        taken = m.stats().taken_from_reallocs;
        check(x, &mut live, took);
    }
    let live_of = |first: bool| {
        live.values()
            .filter(|&&(_, tid)| (Some(tid) == first_tid) == first)
            .fold((0u64, 0u64), |(b, n), &(size, _)| (b + size, n + 1))
    };
    let (first, others) = (live_of(true), live_of(false));
    println!(
        "live at end: first thread {} bytes in {} blocks, other threads {} bytes in {} blocks",
        first.0, first.1, others.0, others.1
    );
    if let Some(why) = m.spill_problem() {
        println!("spill: {why}");
    }
    println!("{:?}", m.stats());
}
