//! A snapshot's heap from the allocator's own metadata (`fragscope snapshot`): the heap
//! census (chunk 16) takes the place of the merged calls, which a snapshot does not have.
//! It gives the same parts as a recording's snapshot (`heap::HeapParts`), so the rest of
//! the report (RSS decomposition, occupancy, size classes, headline) is built as for any
//! trace, plus the census's own figures ([`SnapshotFacts`]).

use fragscope_trace::heap_census::{GlibcArena, HeapCensus, OCCUPANCY_BUCKETS};
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::records::Pagemap;

use crate::heap::{ClassAtSnapshot, HeapParts};
use crate::report::{GlibcFigures, Headline, Snapshot, SnapshotFacts};

/// The heap's parts and size classes at the snapshot. A census that could not read the
/// allocator leaves only the resident heap pages, which then count as other anonymous
/// memory: nothing says which of them are live.
pub fn heap_parts(c: &HeapCensus, pm: &Pagemap) -> (HeapParts, Vec<ClassAtSnapshot>) {
    let page = u64::from(pm.page_size).max(1);
    let Ok(h) = &c.result else {
        let resident: u64 = pm.ranges.iter().map(|r| r.resident_pages()).sum();
        let parts = HeapParts {
            heap_resident: resident * page,
            never_held_resident: resident * page,
            ..HeapParts::default()
        };
        return (parts, Vec::new());
    };
    let mut parts = HeapParts::default();
    for b in 0..OCCUPANCY_BUCKETS {
        let pages = h.occupancy_pages.get(b).copied().unwrap_or(0);
        let in_use = h.occupancy_in_use.get(b).copied().unwrap_or(0);
        parts.occupancy_pages[b] = pages;
        parts.occupancy_live[b] = in_use;
        parts.live += in_use;
        if b == 0 {
            parts.empty_pages += pages;
        } else {
            parts.used_pages += pages;
            parts.free_in_used_pages += (pages * page).saturating_sub(in_use);
        }
    }
    parts.free_resident_pages = parts.empty_pages * page;
    parts.heap_resident = (parts.used_pages + parts.empty_pages) * page;
    let in_use_total = h.sum(|a| a.in_use_bytes + a.overhead_bytes) + h.mmapped_bytes;
    parts.live_not_resident = in_use_total.saturating_sub(parts.live);
    let classes = h
        .classes
        .iter()
        .filter(|k| k.in_use > 0 || k.free > 0)
        .map(|k| ClassAtSnapshot {
            usable: k.chunk_size,
            objects: k.in_use,
            live_bytes: k.in_use_bytes,
            usable_bytes: k.in_use_bytes,
            pages: k.pages,
            mean_occupancy: if k.pages > 0 {
                (k.in_use_bytes as f64 / (k.pages * page) as f64).min(1.0)
            } else {
                0.0
            },
            retained_free: k.free_bytes,
        })
        .collect();
    (parts, classes)
}

/// The census's own figures, for the report.
pub fn facts(c: &HeapCensus) -> SnapshotFacts {
    let heap = c.result.as_ref().ok().map(|h| GlibcFigures {
        version: h.version.clone(),
        layout_source: h.layout_source.clone(),
        in_use_chunks: h.in_use_chunks(),
        in_use_bytes: h.in_use_bytes(),
        free_chunks: h.sum(|a| a.free_chunks),
        free_bytes: h.sum(|a| a.free_bytes),
        fastbin_chunks: h.sum(|a| a.fastbin_chunks),
        fastbin_bytes: h.sum(|a| a.fastbin_bytes),
        tcache_chunks: h.sum(|a| a.tcache_chunks),
        tcache_bytes: h.sum(|a| a.tcache_bytes),
        top_bytes: h.sum(|a| a.top_bytes),
        overhead_bytes: h.sum(|a| a.overhead_bytes),
        trimmable_bytes: h.sum(|a| a.trimmable_bytes),
        mmapped_chunks: h.mmapped_chunks,
        mmapped_bytes: h.mmapped_bytes,
        mmapped_resident: h.mmapped_resident,
        thread_caches: h.tcaches,
        mallinfo_in_use: h.sum(GlibcArena::allocator_in_use) + h.mmapped_bytes,
        mallinfo_free: h.sum(GlibcArena::allocator_free),
        bytes_read: h.bytes_read,
        arenas: h.arenas.clone(),
    });
    SnapshotFacts {
        allocator: c.allocator.clone(),
        stopped: c.stopped,
        pause_ms: c.pause_us as f64 / 1e3,
        note: c.result.as_ref().err().cloned(),
        glibc: heap,
    }
}

/// The headline of a snapshot: what its census adds to the sentence of a recording (the
/// trim prediction), or, without a census, why live and free bytes are unknown.
pub fn headline(h: &mut Headline, c: &HeapCensus, focus: Option<&Snapshot>) {
    match &c.result {
        Ok(heap) => {
            let trim: u64 = heap.sum(|a| a.trimmable_bytes);
            let free_pages = focus.map_or(0, |f| f.parts.free_resident_pages);
            h.sentence = format!(
                "{} malloc_trim(0) would give back {} of resident memory now (predicted from \
                 the free chunks' whole pages; nothing was done to the process){}.",
                h.sentence,
                crate::mib(trim),
                if free_pages > 0 {
                    format!(", of {} in whole free pages", crate::mib(free_pages))
                } else {
                    String::new()
                }
            );
        }
        Err(note) => {
            h.focus_t_ms = None;
            h.fragmentation_ratio = None;
            h.dominant = None;
            h.sentence = format!(
                "A snapshot without the allocator's figures: {note}. The heap's resident \
                 pages are counted as other anonymous memory."
            );
        }
    }
}

/// The heap census of `trace` when it is a snapshot (`fragscope snapshot` writes one, a few
/// chunks in); None for a recording. Reads only the first chunks.
pub fn snapshot_of(trace: &std::path::Path) -> Option<HeapCensus> {
    let mut reader = TraceReader::open(trace).ok()?;
    for _ in 0..16 {
        match reader.next_chunk()? {
            Chunk::HeapCensus(c) => return Some(c),
            Chunk::Events(..) => return None,
            _ => {}
        }
    }
    None
}
