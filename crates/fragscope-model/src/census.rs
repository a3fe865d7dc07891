//! A snapshot's heap from the allocator's own metadata (`fragscope snapshot`): the heap
//! census (chunk 16) takes the place of the merged calls, which a snapshot does not have.
//! It gives the same parts as a recording's snapshot (`heap::HeapParts`), so the rest of
//! the report (RSS decomposition, occupancy, size classes, headline) is built as for any
//! trace, plus the census's own figures ([`SnapshotFacts`]).

use fragscope_trace::heap_census::{
    AllocatorHeap, GlibcArena, GlibcHeap, HeapCensus, JemallocHeap, MimallocHeap, TcmallocHeap,
    OCCUPANCY_BUCKETS,
};
use fragscope_trace::reader::{Chunk, TraceReader};
use fragscope_trace::records::Pagemap;

use crate::heap::{ClassAtSnapshot, HeapParts};
use crate::report::{
    GlibcFigures, Headline, JemallocFigures, MimallocFigures, Snapshot, SnapshotFacts,
    TcmallocFigures,
};

/// The heap's parts and size classes at the snapshot. A census that could not read the
/// allocator leaves only the resident heap pages, which then count as other anonymous
/// memory: nothing says which of them are live.
pub fn heap_parts(c: &HeapCensus, pm: &Pagemap) -> (HeapParts, Vec<ClassAtSnapshot>) {
    let page = u64::from(pm.page_size).max(1);
    match &c.result {
        Ok(AllocatorHeap::Glibc(h)) => glibc_parts(h, page),
        Ok(AllocatorHeap::Tcmalloc(h)) => tcmalloc_parts(h, page),
        Ok(AllocatorHeap::Jemalloc(h)) => jemalloc_parts(h, page),
        Ok(AllocatorHeap::Mimalloc(h)) => mimalloc_parts(h, page),
        Ok(AllocatorHeap::Unused) => (HeapParts::default(), Vec::new()),
        Err(_) => {
            let resident: u64 = pm.ranges.iter().map(|r| r.resident_pages()).sum();
            let parts = HeapParts {
                heap_resident: resident * page,
                never_held_resident: resident * page,
                ..HeapParts::default()
            };
            (parts, Vec::new())
        }
    }
}

/// tcmalloc's heap as the parts: objects in use at their class size (large spans whole),
/// free objects inside spans in use (central free lists, transfer and thread caches),
/// and the page heap's free spans. Rounding is inside `live`: the census sees classes,
/// not the sizes asked for.
/// `page`: the system's page, which occupancy counts in (tcmalloc's are 8 KiB).
fn tcmalloc_parts(h: &TcmallocHeap, page: u64) -> (HeapParts, Vec<ClassAtSnapshot>) {
    let per_span_page = (h.page_size / page).max(1);
    let mut parts = HeapParts {
        live: h.in_use_bytes(),
        free_in_used_pages: h.cached_bytes(),
        free_resident_pages: h.pageheap_free_bytes,
        ..HeapParts::default()
    };
    for b in 0..OCCUPANCY_BUCKETS {
        parts.occupancy_pages[b] = h.occupancy_pages.get(b).copied().unwrap_or(0) * per_span_page;
        parts.occupancy_live[b] = h.occupancy_in_use.get(b).copied().unwrap_or(0);
    }
    // Large spans (objects over 256 KiB) are in use whole; free page-heap spans are pages
    // with nothing in use.
    let small_in_use: u64 = h.classes.iter().map(|c| c.in_use() * c.size).sum();
    let large = parts.live.saturating_sub(small_in_use);
    parts.occupancy_pages[OCCUPANCY_BUCKETS - 1] += large / page;
    parts.occupancy_live[OCCUPANCY_BUCKETS - 1] += large;
    parts.occupancy_pages[0] += h.pageheap_free_bytes / page;
    parts.empty_pages = parts.occupancy_pages[0];
    parts.used_pages = parts.occupancy_pages[1..].iter().sum();
    parts.heap_resident = parts.live + parts.free_in_used_pages + parts.free_resident_pages;
    let classes = h
        .classes
        .iter()
        .map(|k| {
            let bytes = k.in_use() * k.size;
            ClassAtSnapshot {
                usable: k.size,
                objects: k.in_use(),
                live_bytes: bytes,
                usable_bytes: bytes,
                pages: k.pages * per_span_page,
                mean_occupancy: (bytes as f64 / (k.pages.max(1) * h.page_size) as f64).min(1.0),
                retained_free: (k.transfer_free + k.thread_cache_free) * k.size
                    + h.central_bytes_of(k),
            }
        })
        .collect();
    (parts, classes)
}

/// jemalloc's heap as the parts: regions and large extents the program holds at their
/// class size (rounding inside `live`), free space inside active pages (free regions of
/// slabs in use, slab tails, threads' caches, large extents' first-page offset), the
/// dirty pages it keeps, and its metadata, those two as pagemap finds them resident
/// (jemalloc's `stats.resident` counts every page of them).
fn jemalloc_parts(h: &JemallocHeap, page: u64) -> (HeapParts, Vec<ClassAtSnapshot>) {
    let per_jemalloc_page = (h.page_size / page).max(1);
    let mut parts = HeapParts {
        live: h.in_use_bytes(),
        free_in_used_pages: h.active_bytes().saturating_sub(h.in_use_bytes()),
        free_resident_pages: h.dirty_by_pagemap(),
        allocator_overhead: h.metadata_by_pagemap(),
        ..HeapParts::default()
    };
    for b in 0..OCCUPANCY_BUCKETS {
        parts.occupancy_pages[b] =
            h.occupancy_pages.get(b).copied().unwrap_or(0) * per_jemalloc_page;
        parts.occupancy_live[b] = h.occupancy_in_use.get(b).copied().unwrap_or(0);
    }
    parts.empty_pages = parts.occupancy_pages[0];
    parts.used_pages = parts.occupancy_pages[1..].iter().sum();
    parts.heap_resident = parts.live
        + parts.free_in_used_pages
        + parts.free_resident_pages
        + parts.allocator_overhead;
    let classes = h
        .bins
        .iter()
        .map(|k| {
            let bytes = k.program_regions() * k.size;
            ClassAtSnapshot {
                usable: k.size,
                objects: k.program_regions(),
                live_bytes: bytes,
                usable_bytes: bytes,
                pages: k.slabs * k.slab_bytes / page,
                mean_occupancy: (bytes as f64 / (k.slabs * k.slab_bytes).max(1) as f64).min(1.0),
                retained_free: (k.free_regions + k.tcache_regions) * k.size
                    + k.slabs * k.slab_bytes.saturating_sub(k.regions_per_slab * k.size),
            }
        })
        .chain(h.large.iter().map(|l| {
            let bytes = (l.extents - l.tcache_extents) * l.size;
            ClassAtSnapshot {
                usable: l.size,
                objects: l.extents - l.tcache_extents,
                live_bytes: bytes,
                usable_bytes: bytes,
                pages: l.extents * l.size / page,
                mean_occupancy: if l.extents > 0 {
                    (l.extents - l.tcache_extents) as f64 / l.extents as f64
                } else {
                    0.0
                },
                retained_free: l.tcache_extents * l.size,
            }
        }))
        .collect();
    (parts, classes)
}

/// mimalloc's heap as the parts: blocks the program holds at their block size (rounding
/// inside `live`), the rest of the resident bytes of pages with a block in use (free
/// blocks, blocks other threads freed not yet collected, the uncarved tail), the free
/// pages it keeps resident (empty pages, free spans, arena blocks or slices not yet
/// purged), and its metadata (2.x: the segments' headers; 3.x: the arenas' page tables and
/// bitmaps, thread heaps); all as pagemap finds them resident.
fn mimalloc_parts(h: &MimallocHeap, page: u64) -> (HeapParts, Vec<ClassAtSnapshot>) {
    let mut parts = HeapParts {
        live: h.in_use_bytes(),
        free_in_used_pages: h.used_page_resident().saturating_sub(h.in_use_bytes()),
        free_resident_pages: h.free_pages_resident(),
        allocator_overhead: h.metadata_resident,
        ..HeapParts::default()
    };
    for b in 0..OCCUPANCY_BUCKETS {
        parts.occupancy_pages[b] = h.occupancy_pages.get(b).copied().unwrap_or(0);
        parts.occupancy_live[b] = h.occupancy_in_use.get(b).copied().unwrap_or(0);
    }
    // Free spans and arena blocks or slices are pages with nothing in use, as empty pages
    // are.
    parts.occupancy_pages[0] += (h.free_span_resident + h.arena_free_resident) / page;
    parts.empty_pages = parts.occupancy_pages[0];
    parts.used_pages = parts.occupancy_pages[1..].iter().sum();
    parts.heap_resident = parts.live
        + parts.free_in_used_pages
        + parts.free_resident_pages
        + parts.allocator_overhead;
    let classes = h
        .classes
        .iter()
        .map(|k| {
            let bytes = k.in_use_bytes();
            ClassAtSnapshot {
                usable: k.block_size,
                objects: k.blocks_in_use,
                live_bytes: bytes,
                usable_bytes: bytes,
                pages: (k.resident_bytes + k.empty_resident_bytes) / page,
                mean_occupancy: (bytes as f64 / k.resident_bytes.max(1) as f64).min(1.0),
                retained_free: k.free_block_bytes(),
            }
        })
        .collect();
    (parts, classes)
}

/// glibc's heap as the parts, from its chunks page by page.
fn glibc_parts(h: &GlibcHeap, page: u64) -> (HeapParts, Vec<ClassAtSnapshot>) {
    // The allocator's own bytes: its structures inside the heaps, and each chunk's
    // header (`header_bytes`); the rest of the chunks in use is what the program can use,
    // as malloc_usable_size counts it.
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
    // (a chunk mmapped alone lends 8 bytes less, 16 from glibc 2.43, a rounding error in
    // its class of hundreds of KiB).
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

/// The allocator's bytes in glibc's chunks in use: each chunk's size field (8 bytes) in
/// an arena; for a chunk mmapped alone its 16-byte header and, from glibc 2.43, the 8
/// bytes its mapping keeps after the program's (`mmapped_trailer`).
fn header_bytes(h: &GlibcHeap) -> u64 {
    8 * h.sum(|a| a.in_use_chunks) + (16 + h.mmapped_trailer) * h.mmapped_chunks
}

/// The census's own figures, for the report.
pub fn facts(c: &HeapCensus) -> SnapshotFacts {
    let glibc = match &c.result {
        Ok(AllocatorHeap::Glibc(h)) => Some(h),
        _ => None,
    };
    let tcmalloc = match &c.result {
        Ok(AllocatorHeap::Tcmalloc(h)) => Some(TcmallocFigures {
            in_use_bytes: h.in_use_bytes(),
            central_bytes: h.central_bytes(),
            transfer_bytes: h.transfer_bytes(),
            thread_cache_bytes: h.thread_cache_bytes(),
            spans: h.classes.iter().map(|k| k.spans).sum(),
            heap: h.clone(),
        }),
        _ => None,
    };
    let jemalloc = match &c.result {
        Ok(AllocatorHeap::Jemalloc(h)) => Some(JemallocFigures {
            allocated_bytes: h.allocated_bytes(),
            active_bytes: h.active_bytes(),
            resident_bytes: h.resident_bytes(),
            mapped_bytes: h.mapped_bytes(),
            in_use_bytes: h.in_use_bytes(),
            tcache_bytes: h.tcache_bytes(),
            slab_free_bytes: h.slab_free_bytes(),
            dirty_bytes: h.dirty_bytes(),
            muzzy_bytes: h.muzzy_bytes(),
            metadata_resident: h.metadata_resident(),
            slabs: h.bins.iter().map(|b| b.slabs).sum(),
            nonfull_slabs: h.bins.iter().map(|b| b.nonfull_slabs).sum(),
            heap: h.clone(),
        }),
        _ => None,
    };
    let mimalloc = match &c.result {
        Ok(AllocatorHeap::Mimalloc(h)) => Some(MimallocFigures {
            in_use_bytes: h.in_use_bytes(),
            free_block_bytes: h.classes.iter().map(|k| k.blocks_free * k.block_size).sum(),
            thread_freed_bytes: h
                .classes
                .iter()
                .map(|k| (k.blocks_thread_freed + k.blocks_delayed) * k.block_size)
                .sum(),
            used_page_resident: h.used_page_resident(),
            free_pages_resident: h.free_pages_resident(),
            pages: h.pages(),
            heap: h.clone(),
        }),
        _ => None,
    };
    let heap = glibc.map(|h| GlibcFigures {
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
        tcmalloc,
        jemalloc,
        mimalloc,
    }
}

/// The headline of a snapshot: what its census adds to the sentence of a recording (the
/// trim prediction), or, without a census, why live and free bytes are unknown.
pub fn headline(h: &mut Headline, c: &HeapCensus, focus: Option<&Snapshot>) {
    match &c.result {
        Ok(AllocatorHeap::Tcmalloc(heap)) => h.sentence = tcmalloc_sentence(heap),
        Ok(AllocatorHeap::Jemalloc(heap)) => h.sentence = jemalloc_sentence(heap),
        Ok(AllocatorHeap::Mimalloc(heap)) => h.sentence = mimalloc_sentence(heap),
        // The runtime's heap told the headline.
        Ok(AllocatorHeap::Unused) => {}
        Ok(AllocatorHeap::Glibc(heap)) => {
            let trim: u64 = heap.sum(|a| a.trimmable_bytes);
            // A runtime's heap told the headline (a cgo program's Go heap, a JVM's Java
            // heap): malloc's trim is said beside it only when it would give back at
            // least a MiB and a quarter of what that heap wastes.
            if let Some(told) = h.heap.filter(|x| *x != crate::heaps::Heap::Malloc) {
                let told_waste = (focus.into_iter().flat_map(|f| &f.heaps))
                    .find(|x| x.heap == told)
                    .map_or(0, |x| x.waste);
                if trim < 1 << 20 || trim * 4 < told_waste {
                    return;
                }
            }
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

/// What tcmalloc's heap holds, in one sentence: where its free bytes wait, and when most
/// are in the central free lists, the size class that keeps most and how full its spans
/// are (seed 002's question).
fn tcmalloc_sentence(h: &TcmallocHeap) -> String {
    let central = h.central_bytes();
    let in_use = h.in_use_bytes();
    let held = in_use + h.cached_bytes() + h.pageheap_free_bytes;
    let share = |b: u64| 100 * b / held.max(1);
    let worst = h.classes.iter().max_by_key(|k| k.central_free * k.size);
    match worst {
        Some(k) if central >= h.pageheap_free_bytes && central * 4 >= held => format!(
            "tcmalloc's central free lists hold {} ({}% of the {} it holds, {} in use by the \
             program): free objects inside spans that survivors keep, which tcmalloc returns \
             to its page heap only when a span is wholly free. Most are in size class {} ({} \
             bytes): {} of its {} spans hold {} objects in use for {} free. No release rate \
             returns them; only not mixing long- and short-lived objects of one size (or \
             freeing the survivors) does.",
            crate::mib(central),
            share(central),
            crate::mib(held),
            crate::mib(in_use),
            k.class,
            k.size,
            k.spans - k.full_spans,
            k.spans,
            k.in_use(),
            k.central_free
        ),
        _ if h.pageheap_free_bytes * 4 >= held => format!(
            "tcmalloc's page heap keeps {} of free spans ({}% of the {} it holds): \
             TCMALLOC_RELEASE_RATE (or MallocExtension::ReleaseFreeMemory) returns them to \
             the system.",
            crate::mib(h.pageheap_free_bytes),
            share(h.pageheap_free_bytes),
            crate::mib(held)
        ),
        _ => format!(
            "tcmalloc holds {}, {} of it in use by the program; its free lists and page heap \
             keep the rest ({} in central free lists, {} in the page heap).",
            crate::mib(held),
            crate::mib(in_use),
            crate::mib(central),
            crate::mib(h.pageheap_free_bytes)
        ),
    }
}

/// What jemalloc's heap holds, in one sentence: where its resident bytes wait beside what
/// the program holds. Free regions in slabs that survivors keep (the size class that
/// keeps most, how many of its slabs are not full), or dirty pages the decay has not
/// purged yet, each with what returns them.
fn jemalloc_sentence(h: &JemallocHeap) -> String {
    let resident = h.resident_bytes();
    let in_use = h.in_use_bytes();
    let in_slabs = h.slab_free_bytes();
    let dirty = h.dirty_bytes();
    let share = |b: u64| 100 * b / resident.max(1);
    let worst = h.bins.iter().max_by_key(|k| k.free_regions * k.size);
    match worst {
        Some(k) if in_slabs >= dirty && in_slabs * 4 >= resident => format!(
            "jemalloc's slabs hold {} of free regions ({}% of its {} resident, {} in use by \
             the program): free space inside slabs that survivors keep, which jemalloc gives \
             back only when a slab is wholly free. Most are in size class {} ({} bytes): {} \
             of its {} slabs have free regions, {} regions in use for {} free. No decay or \
             purge (arena.<i>.purge) returns them; only not mixing long- and short-lived \
             objects of one size (or freeing the survivors) does.",
            crate::mib(in_slabs),
            share(in_slabs),
            crate::mib(resident),
            crate::mib(in_use),
            k.bin,
            k.size,
            k.slabs.saturating_sub(k.full_slabs),
            k.slabs,
            k.program_regions(),
            k.free_regions
        ),
        _ if dirty * 4 >= resident => format!(
            "jemalloc keeps {} of dirty pages ({}% of its {} resident): free pages it has not \
             purged yet. They go back as dirty_decay_ms elapses, but only while the program \
             calls into jemalloc (or with background_thread:true); mallctl \"arena.<i>.purge\" \
             returns them at once, and a shorter dirty_decay_ms (MALLOC_CONF) sooner.",
            crate::mib(dirty),
            share(dirty),
            crate::mib(resident)
        ),
        _ => format!(
            "jemalloc holds {} resident, {} of it in use by the program; the rest is {} of \
             free regions in slabs, {} of dirty pages and {} of its own metadata.",
            crate::mib(resident),
            crate::mib(in_use),
            crate::mib(in_slabs),
            crate::mib(dirty),
            crate::mib(h.metadata_resident())
        ),
    }
}

/// What mimalloc's heap holds, in one sentence: free blocks inside pages that survivors
/// keep (the block size that keeps most), or free pages not purged yet, each with what
/// returns them.
fn mimalloc_sentence(h: &MimallocHeap) -> String {
    let in_use = h.in_use_bytes();
    let in_pages = h.used_page_resident().saturating_sub(in_use);
    let free_pages = h.free_pages_resident();
    let resident = h.used_page_resident() + free_pages + h.metadata_resident;
    let share = |b: u64| 100 * b / resident.max(1);
    let worst = h
        .classes
        .iter()
        .max_by_key(|k| k.resident_bytes.saturating_sub(k.in_use_bytes()));
    match worst {
        Some(k) if in_pages >= free_pages && in_pages * 4 >= resident => format!(
            "mimalloc's pages hold {} of free space ({}% of its {} resident, {} in use by the \
             program): free blocks inside pages that survivors keep, which mimalloc gives back \
             only when a page is wholly free. Most are in pages of {}-byte blocks: {} pages \
             hold {} blocks in use for {} free. No option or mi_collect returns them; only not \
             mixing long- and short-lived objects of one size (or freeing the survivors) does.",
            crate::mib(in_pages),
            share(in_pages),
            crate::mib(resident),
            crate::mib(in_use),
            k.block_size,
            k.pages - k.empty_pages,
            k.blocks_in_use,
            k.blocks_free + k.blocks_thread_freed + k.blocks_delayed
        ),
        _ if free_pages * 4 >= resident => format!(
            "mimalloc keeps {} of free pages resident ({}% of its {} resident): {} it has not \
             purged yet. It purges them once purge_delay has passed (MIMALLOC_PURGE_DELAY, \
             {} by default), but only while the program calls into it; mi_collect(true) \
             returns them at once.",
            crate::mib(free_pages),
            share(free_pages),
            crate::mib(resident),
            if h.is_v3() {
                "empty pages and free arena slices"
            } else {
                "empty pages, free spans and arena blocks"
            },
            if h.is_v3() {
                "1 s"
            } else {
                "10 ms, ten times that in arenas"
            }
        ),
        _ => format!(
            "mimalloc holds {} resident, {} of it in use by the program; the rest is {} of \
             free space in pages in use, {} of free pages and {} of {}.",
            crate::mib(resident),
            crate::mib(in_use),
            crate::mib(in_pages),
            crate::mib(free_pages),
            crate::mib(h.metadata_resident),
            if h.is_v3() {
                "arena metadata"
            } else {
                "segment headers"
            }
        ),
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
    use fragscope_trace::heap_census::{GlibcClass, TcmallocClass};
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
            result: Ok(AllocatorHeap::Glibc(GlibcHeap {
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
            })),
        }
    }

    /// Seed 002's shape: one class whose spans each keep a few survivors, its free
    /// objects in the central free list.
    fn tcmalloc_census() -> TcmallocHeap {
        let class = TcmallocClass {
            class: 5,
            size: 64,
            pages_per_span: 1,
            spans: 100,
            full_spans: 0,
            pages: 100,
            objects: 100 * 128,
            handed_out: 100 * 16,
            central_free: 100 * 112,
            transfer_free: 64,
            thread_cache_free: 32,
        };
        TcmallocHeap {
            release: "2.10".into(),
            library: "libtcmalloc.so.4.5.10".into(),
            page_size: 8192,
            // The class's spans, 2 free spans in the page heap, 1 returned.
            system_bytes: 103 * 8192,
            pageheap_free_bytes: 2 * 8192,
            unmapped_bytes: 8192,
            thread_caches: 1,
            classes: vec![class],
            occupancy_pages: vec![0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0],
            occupancy_in_use: vec![0, 0, 1600 * 64, 0, 0, 0, 0, 0, 0, 0, 0],
            bytes_read: 1,
        }
    }

    #[test]
    fn tcmallocs_parts_are_its_own_figures() {
        let h = tcmalloc_census();
        let c = HeapCensus {
            stream: 0,
            tick: 1,
            allocator: "tcmalloc".into(),
            stopped: true,
            pause_us: 1,
            result: Ok(AllocatorHeap::Tcmalloc(h.clone())),
        };
        let (p, classes) = heap_parts(&c, &pagemap());
        // In use: what the program holds of the class's objects, as tcmalloc counts it.
        assert_eq!(p.live, (1600 - 96) * 64);
        assert_eq!(p.live, h.in_use_bytes());
        assert_eq!(p.free_in_used_pages, (100 * 112 + 96) * 64);
        assert_eq!(p.free_resident_pages, 2 * 8192);
        assert_eq!(
            p.live + p.free_in_used_pages + p.free_resident_pages,
            p.heap_resident
        );
        // Occupancy in the system's 4 KiB pages.
        assert_eq!(p.occupancy_pages[2], 200);
        assert_eq!(p.occupancy_pages[0], 4);
        assert_eq!(classes[0].objects, 1504);
        let facts = facts(&c);
        let t = facts.tcmalloc.unwrap();
        assert_eq!(t.central_bytes, 100 * 112 * 64);
        let sentence = headline_of(&c);
        assert!(
            sentence.starts_with("tcmalloc's central free lists hold 0.7 MiB"),
            "{sentence}"
        );
        assert!(sentence.contains("size class 5 (64 bytes)"));
    }

    /// Survivors in one size class's slabs, one large extent, dirty pages and metadata.
    #[test]
    fn jemallocs_parts_add_up_to_its_resident_bytes() {
        use fragscope_trace::heap_census::{JemallocArena, JemallocBin, JemallocLarge};
        let h = JemallocHeap {
            release: "5.3.0".into(),
            page_size: 4096,
            arenas: vec![JemallocArena {
                // 100 slabs of one page, a 20 KiB extent and its first-page offset.
                active_pages: 100 + 5 + 1,
                dirty_pages: 300,
                dirty_by_pagemap: 290 * 4096,
                mapped_bytes: 1 << 22,
                metadata_resident: 8192,
                metadata_by_pagemap: 4096,
                ..Default::default()
            }],
            bins: vec![JemallocBin {
                bin: 4,
                size: 64,
                slab_bytes: 4096,
                regions_per_slab: 64,
                slabs: 100,
                nonfull_slabs: 100,
                regions_in_use: 100 * 8,
                free_regions: 100 * 56,
                tcache_regions: 30,
                ..Default::default()
            }],
            large: vec![JemallocLarge {
                size: 20480,
                extents: 1,
                tcache_extents: 0,
            }],
            occupancy_pages: vec![300, 0, 100, 0, 0, 0, 0, 0, 0, 0, 6],
            occupancy_in_use: vec![0, 0, 800 * 64, 0, 0, 0, 0, 0, 0, 0, 20480],
            ..Default::default()
        };
        let c = HeapCensus {
            stream: 0,
            tick: 1,
            allocator: "jemalloc".into(),
            stopped: true,
            pause_us: 1,
            result: Ok(AllocatorHeap::Jemalloc(h.clone())),
        };
        let (p, classes) = heap_parts(&c, &pagemap());
        assert_eq!(p.live, (800 - 30) * 64 + 20480);
        assert_eq!(p.free_in_used_pages, 106 * 4096 - p.live);
        // Dirty pages and metadata as pagemap finds them resident.
        assert_eq!(p.free_resident_pages, 290 * 4096);
        assert_eq!(p.allocator_overhead, 4096);
        assert_eq!(p.heap_resident, h.resident_bytes() - 10 * 4096 - 4096);
        assert_eq!((p.empty_pages, p.used_pages), (300, 106));
        assert_eq!(classes[0].objects, 770);
        assert_eq!(classes[0].retained_free, (100 * 56 + 30) * 64);
        let f = facts(&c).jemalloc.unwrap();
        assert_eq!(f.slab_free_bytes, 100 * 56 * 64);
        let sentence = headline_of(&c);
        // Dirty pages are most of what it holds: the decay and purge are the advice.
        assert!(
            sentence.starts_with("jemalloc keeps 1.2 MiB of dirty pages"),
            "{sentence}"
        );
        assert!(sentence.contains("dirty_decay_ms"));
    }

    /// Survivors in pages of 64-byte blocks, one empty page, a free span and segment
    /// headers, all as pagemap found them resident.
    #[test]
    fn mimallocs_parts_add_up_to_its_resident_bytes() {
        use fragscope_trace::heap_census::MimallocClass;
        let h = MimallocHeap {
            release: "mimalloc 2.3.2".into(),
            segments: 1,
            metadata_resident: 2 * 65536,
            free_span_resident: 8 * 4096,
            classes: vec![MimallocClass {
                block_size: 64,
                pages: 11,
                empty_pages: 1,
                resident_bytes: 10 * 65536,
                empty_resident_bytes: 4 * 4096,
                blocks_reserved: 11 * 1024,
                blocks_capacity: 11 * 1024,
                blocks_in_use: 1000,
                blocks_free: 11 * 1024 - 1010,
                blocks_thread_freed: 10,
                ..Default::default()
            }],
            occupancy_pages: vec![4, 160, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            occupancy_in_use: vec![0, 64_000, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        let c = HeapCensus {
            stream: 0,
            tick: 1,
            allocator: "mimalloc".into(),
            stopped: true,
            pause_us: 1,
            result: Ok(AllocatorHeap::Mimalloc(h)),
        };
        let (p, classes) = heap_parts(&c, &pagemap());
        assert_eq!(p.live, 64_000);
        assert_eq!(p.free_in_used_pages, 10 * 65536 - 64_000);
        assert_eq!(p.free_resident_pages, 4 * 4096 + 8 * 4096);
        assert_eq!(p.allocator_overhead, 2 * 65536);
        assert_eq!(p.heap_resident, 12 * 65536 + 12 * 4096);
        // The empty page and the free span are pages with nothing in use.
        assert_eq!((p.empty_pages, p.used_pages), (12, 160));
        assert_eq!(classes[0].objects, 1000);
        assert_eq!(classes[0].retained_free, (11 * 1024 - 1000) * 64);
        let f = facts(&c).mimalloc.unwrap();
        assert_eq!(f.thread_freed_bytes, 640);
        let sentence = headline_of(&c);
        // Free blocks in pages survivors keep are most of what it holds.
        assert!(
            sentence.starts_with("mimalloc's pages hold 0.6 MiB"),
            "{sentence}"
        );
        assert!(sentence.contains("64-byte blocks: 10 pages"));
    }

    /// The sentence of a headline about census `c` alone.
    fn headline_of(c: &HeapCensus) -> String {
        let mut h = Headline {
            peak_rss: None,
            peak_rss_t_ms: None,
            peak_live: None,
            peak_live_t_ms: None,
            focus_t_ms: None,
            fragmentation_ratio: None,
            heap: None,
            dominant: None,
            sentence: String::new(),
        };
        headline(&mut h, c, None);
        h.sentence
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
