//! A snapshot's heap from the allocator's own metadata (`fragscope snapshot`): the heap
//! census (chunk 16) takes the place of the merged calls, which a snapshot does not have.
//! It gives the same parts as a recording's snapshot (`heap::HeapParts`), so the rest of
//! the report (RSS decomposition, occupancy, size classes, headline) is built as for any
//! trace, plus the census's own figures ([`SnapshotFacts`]).

use fragscope_trace::heap_census::{GlibcArena, GlibcHeap, HeapCensus, OCCUPANCY_BUCKETS};
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
    // The allocator's own bytes: its structures inside the heaps, and each chunk's
    // header (8 bytes in an arena, 16 for a chunk mmapped alone); the rest of the chunks
    // in use is what the program can use, as malloc_usable_size counts it.
    let own_total = h.sum(|a| a.overhead_bytes) + header_bytes(h);
    let in_use_total = h.sum(|a| a.in_use_bytes + a.overhead_bytes) + h.mmapped_bytes;
    let mut parts = HeapParts::default();
    for b in 0..OCCUPANCY_BUCKETS {
        let pages = h.occupancy_pages.get(b).copied().unwrap_or(0);
        let in_use = h.occupancy_in_use.get(b).copied().unwrap_or(0);
        // A census written before the allocator's bytes were placed page by page: they
        // are spread over the pages in proportion to the bytes in use.
        let own = match h.occupancy_overhead.get(b) {
            Some(&own) => own.min(in_use),
            None if h.occupancy_overhead.is_empty() => {
                (u128::from(in_use) * u128::from(own_total) / u128::from(in_use_total.max(1)))
                    as u64
            }
            None => 0,
        };
        parts.occupancy_pages[b] = pages;
        parts.occupancy_live[b] = in_use - own;
        parts.live += in_use - own;
        parts.allocator_overhead += own;
        if b == 0 {
            parts.empty_pages += pages;
        } else {
            parts.used_pages += pages;
            parts.free_in_used_pages += (pages * page).saturating_sub(in_use);
        }
    }
    parts.free_resident_pages = parts.empty_pages * page;
    parts.heap_resident = (parts.used_pages + parts.empty_pages) * page;
    parts.live_not_resident = in_use_total
        .saturating_sub(own_total)
        .saturating_sub(parts.live);
    // Classes by usable size, as a recording has them: a chunk less its 8-byte size field
    // (a chunk mmapped alone lends 8 bytes less, a rounding error in its class of
    // hundreds of KiB).
    let classes = h
        .classes
        .iter()
        .filter(|k| k.in_use > 0 || k.free > 0)
        .map(|k| {
            let usable_bytes = k.in_use_bytes.saturating_sub(8 * k.in_use);
            ClassAtSnapshot {
                usable: k.chunk_size.saturating_sub(8),
                objects: k.in_use,
                live_bytes: usable_bytes,
                usable_bytes,
                pages: k.pages,
                mean_occupancy: if k.pages > 0 {
                    (usable_bytes as f64 / (k.pages * page) as f64).min(1.0)
                } else {
                    0.0
                },
                retained_free: k.free_bytes,
            }
        })
        .collect();
    (parts, classes)
}

/// The headers of glibc's chunks in use: each chunk's size field (8 bytes) in an arena,
/// 16 bytes for a chunk mmapped alone.
fn header_bytes(h: &GlibcHeap) -> u64 {
    8 * h.sum(|a| a.in_use_chunks) + 16 * h.mmapped_chunks
}

/// The census's own figures, for the report.
pub fn facts(c: &HeapCensus) -> SnapshotFacts {
    let heap = c.result.as_ref().ok().map(|h| GlibcFigures {
        version: h.version.clone(),
        layout_source: h.layout_source.clone(),
        in_use_chunks: h.in_use_chunks(),
        in_use_bytes: h.in_use_bytes(),
        usable_bytes: h.in_use_bytes() - header_bytes(h),
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

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::heap_census::GlibcClass;
    use fragscope_trace::records::SnapshotReason;

    /// One arena page holding ten 96-byte chunks and a thread's cache table (656 bytes),
    /// and a chunk mmapped alone over two pages; three free pages.
    fn census(occupancy_overhead: Vec<u64>) -> HeapCensus {
        let mut occupancy_pages = vec![0; OCCUPANCY_BUCKETS];
        let mut occupancy_in_use = vec![0; OCCUPANCY_BUCKETS];
        occupancy_pages[0] = 3;
        (occupancy_pages[5], occupancy_in_use[5]) = (1, 960 + 656);
        (occupancy_pages[10], occupancy_in_use[10]) = (2, 8192);
        HeapCensus {
            stream: 0,
            tick: 1,
            allocator: "glibc".into(),
            stopped: true,
            pause_us: 1,
            result: Ok(GlibcHeap {
                page_size: 4096,
                arenas: vec![GlibcArena {
                    main: true,
                    in_use_chunks: 10,
                    in_use_bytes: 960,
                    overhead_bytes: 656,
                    ..Default::default()
                }],
                mmapped_chunks: 1,
                mmapped_bytes: 8192,
                occupancy_pages,
                occupancy_in_use,
                occupancy_overhead,
                classes: vec![GlibcClass {
                    chunk_size: 96,
                    in_use: 10,
                    in_use_bytes: 960,
                    pages: 1,
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }

    fn pagemap() -> Pagemap {
        Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: Vec::new(),
        }
    }

    #[test]
    fn live_is_what_the_program_can_use_and_headers_are_the_allocators() {
        let mut own = vec![0; OCCUPANCY_BUCKETS];
        own[5] = 656 + 10 * 8;
        own[10] = 16;
        let (p, classes) = heap_parts(&census(own), &pagemap());
        // malloc_usable_size's sum: 10 x 88 + 8192 - 16.
        assert_eq!(p.live, 880 + 8176);
        assert_eq!(p.live_not_resident, 0);
        assert_eq!(p.rounding, 0);
        assert_eq!(p.allocator_overhead, 656 + 80 + 16);
        assert_eq!(p.free_in_used_pages, 4096 - 960 - 656);
        assert_eq!(
            p.live + p.allocator_overhead + p.free_in_used_pages + p.free_resident_pages,
            p.heap_resident
        );
        assert_eq!(p.occupancy_live[5], 880);
        assert_eq!((classes[0].usable, classes[0].live_bytes), (88, 880));
        let facts = facts(&census(Vec::new()));
        assert_eq!(facts.glibc.unwrap().usable_bytes, 880 + 8176);
    }

    #[test]
    fn an_older_census_spreads_the_allocators_bytes_over_its_pages() {
        let (p, _) = heap_parts(&census(Vec::new()), &pagemap());
        let own = 656 + 80 + 16;
        assert!(p.allocator_overhead.abs_diff(own) <= 2, "{p:?}");
        assert!(
            (p.live + p.live_not_resident).abs_diff(880 + 8176) <= 2,
            "{p:?}"
        );
        assert_eq!(p.live + p.allocator_overhead, 960 + 656 + 8192);
    }
}
