//! The allocator's heap as its own metadata tells it, at a snapshot of a running process
//! or at a recording's census of an allocator linked into the program: glibc's arenas,
//! tcmalloc's and jemalloc's own statistics, mimalloc's segments and pages.

use std::fmt::Write as _;

use fragscope_model::report::SnapshotFacts;

use crate::units::{bytes, count};

/// tcmalloc's heap as its own statistics count it (MallocExtension's lines), then its
/// size classes by the bytes their central free lists hold.
fn tcmalloc_census(o: &mut String, t: &fragscope_model::report::TcmallocFigures) {
    let h = &t.heap;
    let _ = writeln!(
        o,
        "tcmalloc (gperftools {}, {}), as its own statistics count it:\n  \
         {:>10} in use by the program\n  {:>10} in the page heap's free spans\n  \
         {:>10} in the central free lists\n  {:>10} in the transfer caches\n  \
         {:>10} in {} threads' caches\n  {:>10} returned to the system (unmapped)\n  \
         {:>10} taken from the system, in {} spans of {} size classes",
        h.release,
        h.library,
        bytes(t.in_use_bytes),
        bytes(h.pageheap_free_bytes),
        bytes(t.central_bytes),
        bytes(t.transfer_bytes),
        bytes(t.thread_cache_bytes),
        count(h.thread_caches),
        bytes(h.unmapped_bytes),
        bytes(h.system_bytes),
        count(t.spans),
        count(h.classes.len() as u64)
    );
    let mut classes: Vec<_> = h.classes.iter().collect();
    classes.sort_by_key(|k| std::cmp::Reverse(h.central_bytes_of(k)));
    let _ = writeln!(
        o,
        "  size classes by central free list, top 10:\n  {:>5} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
        "class", "size", "spans", "full", "in use", "free", "cached", "free bytes"
    );
    for k in classes.iter().take(10) {
        let _ = writeln!(
            o,
            "  {:>5} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
            k.class,
            bytes(k.size),
            count(k.spans),
            count(k.full_spans),
            count(k.in_use()),
            count(k.central_free),
            count(k.transfer_free + k.thread_cache_free),
            bytes(h.central_bytes_of(k))
        );
    }
}

/// jemalloc's heap as its own statistics count it (`stats.*`), then its size classes by
/// the free bytes their slabs hold.
fn jemalloc_census(o: &mut String, j: &fragscope_model::report::JemallocFigures) {
    let h = &j.heap;
    let _ = writeln!(
        o,
        "jemalloc {} ({}), as its own statistics count it:\n  \
         {:>10} allocated ({} in use by the program, {} in {} threads' caches)\n  \
         {:>10} active: {} of free regions inside slabs, in {} slabs ({} not full)\n  \
         {:>10} resident: {} of dirty pages, {} of metadata ({} muzzy, not counted)\n  \
         {:>10} mapped, in {} arenas",
        h.release,
        h.library,
        bytes(j.allocated_bytes),
        bytes(j.in_use_bytes),
        bytes(j.tcache_bytes),
        count(h.arenas.iter().map(|a| a.thread_caches).sum()),
        bytes(j.active_bytes),
        bytes(j.slab_free_bytes),
        count(j.slabs),
        count(j.nonfull_slabs),
        bytes(j.resident_bytes),
        bytes(j.dirty_bytes),
        bytes(j.metadata_resident),
        bytes(j.muzzy_bytes),
        bytes(j.mapped_bytes),
        count(h.arenas.len() as u64)
    );
    let mut bins: Vec<_> = h.bins.iter().collect();
    bins.sort_by_key(|k| std::cmp::Reverse(k.free_regions * k.size));
    let _ = writeln!(
        o,
        "  size classes by free bytes in slabs, top 10:\n  {:>5} {:>8} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10}",
        "bin", "size", "slabs", "full", "in use", "free", "cached", "free bytes"
    );
    for k in bins.iter().take(10) {
        let _ = writeln!(
            o,
            "  {:>5} {:>8} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10}",
            k.bin,
            bytes(k.size),
            count(k.slabs),
            count(k.full_slabs),
            count(k.program_regions()),
            count(k.free_regions),
            count(k.tcache_regions),
            bytes(k.free_regions * k.size)
        );
    }
    let large: u64 = h.large.iter().map(|l| l.extents).sum();
    if large > 0 {
        let _ = writeln!(
            o,
            "  large extents: {} in {} size classes, {}",
            count(large),
            count(h.large.len() as u64),
            bytes(h.large.iter().map(|l| l.extents * l.size).sum())
        );
    }
}

/// mimalloc's heap as its segments (2.x) or arenas (3.x) and pages count it, then its
/// block sizes by the free bytes their pages hold.
fn mimalloc_census(o: &mut String, m: &fragscope_model::report::MimallocFigures) {
    let h = &m.heap;
    let _ = writeln!(
        o,
        "{} ({}), as its {} and pages count it:\n  \
         {:>10} in use by the program, in {} pages of {} block sizes\n  \
         {:>10} resident in those pages: {} of free blocks, {} freed by other threads \
         not yet collected",
        h.release,
        h.library,
        if h.is_v3() { "arenas" } else { "segments" },
        bytes(m.in_use_bytes),
        count(m.pages),
        count(h.classes.len() as u64),
        bytes(m.used_page_resident),
        bytes(m.free_block_bytes),
        bytes(m.thread_freed_bytes),
    );
    if h.is_v3() {
        let abandoned: u64 = h.classes.iter().map(|k| k.abandoned_pages).sum();
        let _ = writeln!(
            o,
            "  {:>10} of free pages kept resident ({} in empty pages, {} in free arena \
             slices)\n  \
             {:>10} of arena metadata (page tables, bitmaps, thread heaps), resident\n  \
             {:>10} committed of {} in {} arenas; {} thread heaps, {} pages abandoned",
            bytes(m.free_pages_resident),
            bytes(h.empty_page_resident()),
            bytes(h.arena_free_resident),
            bytes(h.metadata_resident),
            bytes(h.committed_bytes),
            bytes(h.arena_bytes),
            count(h.arenas),
            count(h.thread_heaps),
            count(abandoned)
        );
    } else {
        let _ = writeln!(
            o,
            "  {:>10} of free pages kept resident ({} in empty pages, {} in free spans, {} \
             in arena blocks)\n  \
             {:>10} of segment headers, resident\n  \
             {:>10} committed of {} in {} segments ({} huge, {} abandoned)",
            bytes(m.free_pages_resident),
            bytes(h.empty_page_resident()),
            bytes(h.free_span_resident),
            bytes(h.arena_free_resident),
            bytes(h.metadata_resident),
            bytes(h.committed_bytes),
            bytes(h.segment_bytes),
            count(h.segments),
            count(h.huge_segments),
            count(h.abandoned_segments)
        );
    }
    let mut classes: Vec<_> = h.classes.iter().collect();
    classes.sort_by_key(|k| std::cmp::Reverse(k.resident_bytes.saturating_sub(k.in_use_bytes())));
    let _ = writeln!(
        o,
        "  block sizes by free bytes in their pages, top 10:\n  {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>10} {:>10}",
        "block", "pages", "empty", "in use", "free", "freed", "resident", "free bytes"
    );
    for k in classes.iter().take(10) {
        let _ = writeln!(
            o,
            "  {:>8} {:>7} {:>7} {:>10} {:>10} {:>9} {:>10} {:>10}",
            bytes(k.block_size),
            count(k.pages),
            count(k.empty_pages),
            count(k.blocks_in_use),
            count(k.blocks_free),
            count(k.blocks_thread_freed + k.blocks_delayed),
            bytes(k.resident_bytes + k.empty_resident_bytes),
            bytes(k.resident_bytes.saturating_sub(k.in_use_bytes()))
        );
    }
}

/// How a snapshot was taken, and the allocator's heap as its own metadata tells it.
/// `recorded`: a recording's census (an allocator linked into the program, read at each
/// snapshot), with the report's name for the snapshot it shows; `None`: `fragscope
/// snapshot` of a running process.
pub(super) fn snapshot_census(o: &mut String, s: &SnapshotFacts, recorded: Option<&str>) {
    let how = if s.stopped {
        format!(
            "the process was stopped for {:.1} ms while it was read",
            s.pause_ms
        )
    } else {
        "read without stopping the process (--no-stop): the figures may not hold together".into()
    };
    let what = match recorded {
        Some(which) => {
            format!("Census of the allocator's own metadata at the snapshot shown ({which})")
        }
        None => "Snapshot of a running process".into(),
    };
    let _ = writeln!(o, "\n{what} ({}): {how}", s.allocator);
    if let Some(note) = &s.note {
        let _ = writeln!(o, "note: {note}");
    }
    if let Some(t) = &s.tcmalloc {
        tcmalloc_census(o, t);
    }
    if let Some(j) = &s.jemalloc {
        jemalloc_census(o, j);
    }
    if let Some(m) = &s.mimalloc {
        mimalloc_census(o, m);
    }
    let Some(g) = &s.glibc else { return };
    let _ = writeln!(
        o,
        "glibc {} malloc, read from {}\n  in use {} in {} chunks ({} in {} mmapped); free {} \
         ({} in bins, {} in fastbins, {} in {} threads' caches, {} at the top of the heaps)\n  \
         as mallinfo2 counts it: uordblks + hblkhd {}, fordblks {}\n  malloc_trim(0) would \
         return {} (predicted, not done)",
        g.version,
        g.layout_source,
        bytes(g.in_use_bytes),
        count(g.in_use_chunks),
        bytes(g.mmapped_bytes),
        count(g.mmapped_chunks),
        bytes(g.free_bytes + g.fastbin_bytes + g.tcache_bytes + g.top_bytes),
        bytes(g.free_bytes),
        bytes(g.fastbin_bytes),
        bytes(g.tcache_bytes),
        count(g.thread_caches),
        bytes(g.top_bytes),
        bytes(g.mallinfo_in_use),
        bytes(g.mallinfo_free),
        bytes(g.trimmable_bytes)
    );
    let _ = writeln!(
        o,
        "  {:<7} {:>7} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11} {:>10}",
        "arena",
        "threads",
        "heaps",
        "system",
        "in use",
        "free",
        "resident",
        "free in used",
        "free pages",
        "trimmable"
    );
    for (i, a) in g.arenas.iter().enumerate() {
        let _ = writeln!(
            o,
            "  {:<7} {:>7} {:>5} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11} {:>10}",
            if a.main {
                "main".to_string()
            } else {
                format!("#{i}")
            },
            count(a.threads),
            count(a.heaps),
            bytes(a.system_mem),
            bytes(a.in_use_bytes),
            bytes(a.free_bytes + a.fastbin_bytes + a.tcache_bytes + a.top_bytes),
            bytes(a.resident_bytes),
            bytes(a.free_in_used_pages),
            bytes(a.free_pages_bytes),
            bytes(a.trimmable_bytes)
        );
    }
}
