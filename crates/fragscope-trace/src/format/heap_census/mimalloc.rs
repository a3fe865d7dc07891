//! mimalloc's heap as the census reads it (outcome tag 5 of chunk 16): its segments, the
//! pages carved from them by block size, and the free spans and metadata beside them.

use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

/// mimalloc's heap: every page the process holds (2.x: inside the segments found through
/// mimalloc's arenas and its segment map; 3.x: in its arenas, found through each heap's map
/// of its pages there), its pages grouped by block size, and the bytes resident by pagemap
/// that no page holds. Blocks are counted at their block size, as mimalloc hands them out.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct MimallocHeap {
    /// The mimalloc release whose layout was read, and the image it is in.
    pub release: String,
    pub library: String,
    /// 2.x: segments (32 MiB each, more for a huge one), the huge ones among them (one huge
    /// block each), and those whose thread ended without freeing them (abandoned: their
    /// pages wait for another thread to reclaim them). 3.x has none.
    pub segments: u64,
    pub huge_segments: u64,
    pub abandoned_segments: u64,
    /// The segments' address space (2.x), and what mimalloc has committed (2.x: of its
    /// segments; 3.x: of its arenas, and pages taken from the OS outside them).
    pub segment_bytes: u64,
    pub committed_bytes: u64,
    /// Resident bytes (by pagemap) of mimalloc's own metadata (2.x: the segments' headers,
    /// their info slices; 3.x: the arenas' info slices, with their bitmaps and page
    /// descriptors, and the arena slices neither free nor a page: thread heaps' and other
    /// metadata), of the free spans inside segments (2.x), and of the arenas' free room
    /// (2.x: blocks that hold no segment; 3.x: free slices), not yet purged.
    pub metadata_resident: u64,
    pub free_span_resident: u64,
    pub arena_free_resident: u64,
    /// Pages by block size.
    pub classes: Vec<MimallocClass>,
    /// System pages of mimalloc's pages (those resident) by blocks in use / blocks the page
    /// can hold (none, then [0, 10%) ... [90%, 100%]), and the bytes in use in them.
    pub occupancy_pages: Vec<u64>,
    pub occupancy_in_use: Vec<u64>,
    pub bytes_read: u64,
    /// 3.x: its arenas, their address space, and its thread heaps (`theap`s, one per
    /// thread and heap; a thread that ended leaves its pages abandoned). 0 for 2.x, and in
    /// traces written before 3.x was read.
    pub arenas: u64,
    pub arena_bytes: u64,
    pub thread_heaps: u64,
}

/// mimalloc's pages of one block size.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct MimallocClass {
    pub block_size: u64,
    /// Pages, those with no block in use (retired, kept for reuse), and those of abandoned
    /// segments.
    pub pages: u64,
    pub empty_pages: u64,
    pub abandoned_pages: u64,
    /// The pages' spans (64 KiB slices), what of them is resident by pagemap in pages
    /// with a block in use, and in empty pages.
    pub span_bytes: u64,
    pub resident_bytes: u64,
    pub empty_resident_bytes: u64,
    /// Blocks the pages could hold (`reserved`), have been carved into (`capacity`), and
    /// those the program holds: `used` less the blocks other threads freed that wait on the
    /// page's thread-free list or its heap's delayed-free list (mimalloc counts those in
    /// `used` until the owning thread collects them).
    pub blocks_reserved: u64,
    pub blocks_capacity: u64,
    pub blocks_in_use: u64,
    /// Free blocks on the pages' `free` and `local_free` lists (`capacity - used`).
    pub blocks_free: u64,
    /// Blocks freed by other threads, not yet collected: on the pages' thread-free lists
    /// and on their heaps' delayed-free lists.
    pub blocks_thread_freed: u64,
    pub blocks_delayed: u64,
}

impl MimallocClass {
    /// Bytes the program holds in this class, at the block size.
    pub fn in_use_bytes(&self) -> u64 {
        self.blocks_in_use * self.block_size
    }
    /// Bytes of blocks free inside the pages, waiting lists included.
    pub fn free_block_bytes(&self) -> u64 {
        (self.blocks_free + self.blocks_thread_freed + self.blocks_delayed) * self.block_size
    }
}

impl MimallocHeap {
    /// Bytes the program holds, at the block size.
    pub fn in_use_bytes(&self) -> u64 {
        self.classes.iter().map(MimallocClass::in_use_bytes).sum()
    }
    /// Resident bytes of the pages that hold blocks (an empty page counts as free pages).
    pub fn used_page_resident(&self) -> u64 {
        self.classes.iter().map(|c| c.resident_bytes).sum()
    }
    /// Resident bytes of pages with no block in use.
    pub fn empty_page_resident(&self) -> u64 {
        self.classes.iter().map(|c| c.empty_resident_bytes).sum()
    }
    /// Resident bytes mimalloc keeps free, not inside a page in use: empty pages, free
    /// spans, arena blocks with no segment.
    pub fn free_pages_resident(&self) -> u64 {
        self.empty_page_resident() + self.free_span_resident + self.arena_free_resident
    }
    pub fn pages(&self) -> u64 {
        self.classes.iter().map(|c| c.pages).sum()
    }
    /// Whether this is mimalloc 3.x's heap (arenas, no segments), by its release.
    pub fn is_v3(&self) -> bool {
        self.release.starts_with("mimalloc 3.")
    }

    pub(super) fn encode(&self, w: &mut Writer) {
        w.str(&self.release).str(&self.library);
        for v in [
            self.segments,
            self.huge_segments,
            self.abandoned_segments,
            self.segment_bytes,
            self.committed_bytes,
            self.metadata_resident,
            self.free_span_resident,
            self.arena_free_resident,
            self.bytes_read,
        ] {
            w.varint(v);
        }
        for list in [&self.occupancy_pages, &self.occupancy_in_use] {
            w.varint(list.len() as u64);
            for &v in list {
                w.varint(v);
            }
        }
        w.varint(self.classes.len() as u64);
        for c in &self.classes {
            for v in class_fields(c) {
                w.varint(v);
            }
        }
        // Added with mimalloc 3.x, at the end: older readers stop before them.
        for v in [self.arenas, self.arena_bytes, self.thread_heaps] {
            w.varint(v);
        }
    }

    pub(super) fn decode(r: &mut Reader) -> Result<Self, TraceError> {
        let release = r.string()?;
        let library = r.string()?;
        let mut f = [0u64; 9];
        for x in &mut f {
            *x = r.varint()?;
        }
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.count(1)?;
            *list = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        }
        let [occupancy_pages, occupancy_in_use] = lists;
        let n = r.count(CLASS_FIELDS)?;
        let mut classes = Vec::with_capacity(n);
        for _ in 0..n {
            let mut v = [0u64; CLASS_FIELDS];
            for x in &mut v {
                *x = r.varint()?;
            }
            classes.push(class_from(v));
        }
        // Absent from traces written before mimalloc 3.x was read.
        let mut v3 = [0u64; 3];
        if !r.is_empty() {
            for x in &mut v3 {
                *x = r.varint()?;
            }
        }
        let [arenas, arena_bytes, thread_heaps] = v3;
        let [segments, huge_segments, abandoned_segments, segment_bytes, committed_bytes, metadata_resident, free_span_resident, arena_free_resident, bytes_read] =
            f;
        Ok(Self {
            release,
            library,
            segments,
            huge_segments,
            abandoned_segments,
            segment_bytes,
            committed_bytes,
            metadata_resident,
            free_span_resident,
            arena_free_resident,
            classes,
            occupancy_pages,
            occupancy_in_use,
            bytes_read,
            arenas,
            arena_bytes,
            thread_heaps,
        })
    }
}

const CLASS_FIELDS: usize = 13;

fn class_fields(c: &MimallocClass) -> [u64; CLASS_FIELDS] {
    [
        c.block_size,
        c.pages,
        c.empty_pages,
        c.abandoned_pages,
        c.span_bytes,
        c.resident_bytes,
        c.empty_resident_bytes,
        c.blocks_reserved,
        c.blocks_capacity,
        c.blocks_in_use,
        c.blocks_free,
        c.blocks_thread_freed,
        c.blocks_delayed,
    ]
}

fn class_from(v: [u64; CLASS_FIELDS]) -> MimallocClass {
    let [block_size, pages, empty_pages, abandoned_pages, span_bytes, resident_bytes, empty_resident_bytes, blocks_reserved, blocks_capacity, blocks_in_use, blocks_free, blocks_thread_freed, blocks_delayed] =
        v;
    MimallocClass {
        block_size,
        pages,
        empty_pages,
        abandoned_pages,
        span_bytes,
        resident_bytes,
        empty_resident_bytes,
        blocks_reserved,
        blocks_capacity,
        blocks_in_use,
        blocks_free,
        blocks_thread_freed,
        blocks_delayed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap_census::{AllocatorHeap, HeapCensus, OCCUPANCY_BUCKETS};

    fn census_classes(c: &HeapCensus) -> Vec<MimallocClass> {
        match &c.result {
            Ok(AllocatorHeap::Mimalloc(h)) => h.classes.clone(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn a_mimalloc_census_round_trips_and_a_cut_or_garbled_one_is_an_error_not_a_panic() {
        let class = MimallocClass {
            block_size: 80,
            pages: 3,
            empty_pages: 1,
            abandoned_pages: 0,
            span_bytes: 3 << 16,
            resident_bytes: 2 << 16,
            empty_resident_bytes: 4096,
            blocks_reserved: 3 * 819,
            blocks_capacity: 1500,
            blocks_in_use: 100,
            blocks_free: 1390,
            blocks_thread_freed: 6,
            blocks_delayed: 4,
        };
        let heap = MimallocHeap {
            release: "mimalloc 2.3.2".into(),
            library: "/usr/bin/prog".into(),
            segments: 2,
            huge_segments: 1,
            abandoned_segments: 0,
            segment_bytes: 96 << 20,
            committed_bytes: 40 << 20,
            metadata_resident: 8192,
            free_span_resident: 12288,
            arena_free_resident: 4096,
            classes: vec![class],
            occupancy_pages: vec![1; OCCUPANCY_BUCKETS],
            occupancy_in_use: vec![64; OCCUPANCY_BUCKETS],
            bytes_read: 4242,
            arenas: 1,
            arena_bytes: 1 << 30,
            thread_heaps: 3,
        };
        assert_eq!(heap.in_use_bytes(), 8000);
        assert_eq!(heap.used_page_resident(), 2 << 16);
        assert_eq!(heap.free_pages_resident(), 4096 + 12288 + 4096);
        let census = HeapCensus {
            stream: 0,
            tick: 9,
            allocator: "mimalloc".into(),
            stopped: true,
            pause_us: 300,
            result: Ok(AllocatorHeap::Mimalloc(heap)),
        };
        let bytes = census.encode();
        assert_eq!(HeapCensus::decode(&bytes).unwrap(), census);
        // Cut anywhere, an error; except just before the fields 3.x added (7 bytes of
        // varints here), where it reads as a trace written before them.
        let before_v3 = bytes.len() - 7;
        assert!((0..bytes.len())
            .filter(|&cut| cut != before_v3)
            .all(|cut| HeapCensus::decode(&bytes[..cut]).is_err()));
        let Ok(AllocatorHeap::Mimalloc(older)) =
            HeapCensus::decode(&bytes[..before_v3]).unwrap().result
        else {
            panic!("not read as a mimalloc census")
        };
        assert_eq!(
            (older.arenas, older.arena_bytes, older.thread_heaps),
            (0, 0, 0)
        );
        assert_eq!(older.classes, census_classes(&census));
        // Every byte garbled in turn: read or refused, never a panic.
        for i in 0..bytes.len() {
            let mut garbled = bytes.clone();
            garbled[i] ^= 0xa5;
            let _ = HeapCensus::decode(&garbled);
        }
    }
}
