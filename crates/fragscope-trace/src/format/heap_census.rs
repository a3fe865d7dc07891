//! Chunk 16, HeapCensus: a malloc heap read from outside a running process by `fragscope
//! snapshot` (glibc's arenas and chunks), or why it could not be (another allocator, a
//! glibc whose layout fragscope has not verified). docs/trace-format.md, "Heap census".

use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

mod mimalloc;
pub use mimalloc::{MimallocClass, MimallocHeap};

/// Chunk 21, StartingHeap: the blocks a running process held when `record -p` attached to
/// it, read from glibc's heap with the process stopped just before its calls were
/// rebound. The merge starts from them (their frees are then known, and the report's
/// live data holds them), as a fork child starts from its parent's blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartingHeap {
    pub stream: u32,
    pub tick: u64,
    /// (address, usable bytes), in address order.
    pub blocks: Vec<(u64, u64)>,
}

impl StartingHeap {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .varint(self.blocks.len() as u64);
        let mut prev = 0u64;
        for &(addr, usable) in &self.blocks {
            // In address order: each address as its distance from the last.
            w.varint(addr.wrapping_sub(prev)).varint(usable);
            prev = addr;
        }
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let n = r.count(2)?;
        let mut blocks = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            let addr = prev.wrapping_add(r.varint()?);
            blocks.push((addr, r.varint()?));
            prev = addr;
        }
        Ok(Self {
            stream,
            tick,
            blocks,
        })
    }
}

/// Chunk 24, LinkedAllocator: an allocator compiled into a process's program (or a
/// library it maps), found by its symbols or messages, whose calls the interposer does
/// not see: the objects it holds are missing from the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedAllocator {
    pub stream: u32,
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub allocator: String,
    /// The image that carries it.
    pub image: String,
    /// What gave it away (a symbol, or a message of a stripped image).
    pub evidence: String,
    /// The image defines malloc: every malloc call of the process goes to it.
    pub serves_malloc: bool,
}

impl LinkedAllocator {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .str(&self.allocator)
            .str(&self.image)
            .str(&self.evidence)
            .u8(self.serves_malloc.into());
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        Ok(Self {
            stream: r.varint()? as u32,
            allocator: r.string()?,
            image: r.string()?,
            evidence: r.string()?,
            serves_malloc: r.u8()? != 0,
        })
    }
}

/// Upper bounds (exclusive, percent) of the page-occupancy buckets after the first: the
/// first bucket is resident pages with no in-use byte, then [0, 10), [10, 20) ... [90, 100].
pub const OCCUPANCY_BUCKETS: usize = 11;

/// One arena of glibc malloc: the main one (the brk heap) or a thread arena (its 64 MiB
/// heaps). Bytes are whole chunks, headers included, as glibc counts them.
/// Serialised as it is into the report (`snapshot.glibc.arenas`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct GlibcArena {
    pub main: bool,
    /// Heaps walked (1 for the main arena).
    pub heaps: u64,
    /// The arena's own count of the memory it took from the system.
    pub system_mem: u64,
    /// Threads attached to it (`attached_threads`).
    pub threads: u64,
    /// Chunks the program holds.
    pub in_use_chunks: u64,
    pub in_use_bytes: u64,
    /// Free chunks in the arena's bins (unsorted, small, large), the top chunk excluded.
    pub free_chunks: u64,
    pub free_bytes: u64,
    /// Freed chunks waiting in the fastbins and in threads' caches (tcache): free to the
    /// program, marked in use in the heap.
    pub fastbin_chunks: u64,
    pub fastbin_bytes: u64,
    pub tcache_chunks: u64,
    pub tcache_bytes: u64,
    /// The top chunk: the free end of the current heap.
    pub top_bytes: u64,
    /// The allocator's own bytes inside its heaps: heap and arena headers, the threads'
    /// cache tables, fenceposts.
    pub overhead_bytes: u64,
    /// Resident bytes of the arena's heaps (pagemap).
    pub resident_bytes: u64,
    /// Free bytes on resident pages that a chunk in use touches.
    pub free_in_used_pages: u64,
    /// Resident pages no chunk in use touches, in bytes.
    pub free_pages_bytes: u64,
    /// Resident bytes malloc_trim(0) would give back (predicted, never done).
    pub trimmable_bytes: u64,
}

impl GlibcArena {
    /// What mallinfo2 counts as in use in this arena (`uordblks`): everything but the
    /// bins, the fastbins and the top chunk.
    pub fn allocator_in_use(&self) -> u64 {
        self.in_use_bytes + self.tcache_bytes + self.overhead_bytes
    }
    /// What mallinfo2 counts as free (`fordblks`).
    pub fn allocator_free(&self) -> u64 {
        self.free_bytes + self.fastbin_bytes + self.top_bytes
    }
}

/// Chunks of one size (exact below 1 KiB, then in quarter-power-of-two ranges named by
/// their largest size).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GlibcClass {
    pub chunk_size: u64,
    pub in_use: u64,
    pub in_use_bytes: u64,
    /// Free chunks of this size: in bins, fastbins and thread caches.
    pub free: u64,
    pub free_bytes: u64,
    /// Pages the chunks in use of this size touch.
    pub pages: u64,
}

/// A glibc malloc heap, whole: every arena, every chunk, the mmapped chunks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GlibcHeap {
    /// The glibc release, e.g. "2.36".
    pub version: String,
    /// Where the arenas were found: the debug file whose symbols named them, or the scan
    /// of libc's data.
    pub layout_source: String,
    pub page_size: u64,
    pub arenas: Vec<GlibcArena>,
    /// Chunks glibc mmapped on their own (above the mmap threshold), and their mappings'
    /// bytes, as glibc counts them.
    pub mmapped_chunks: u64,
    pub mmapped_bytes: u64,
    /// The allocator's bytes at the end of each mmapped chunk's mapping, after what the
    /// program can use: 0 up to glibc 2.42 (the program has all of it after the 16-byte
    /// header), 8 from 2.43 (such a chunk is laid out as one in an arena, its mapping's
    /// last 16 bytes where the next chunk's header would be, the first 8 of them lent to
    /// the program). 0 in traces written before it was counted.
    pub mmapped_trailer: u64,
    pub mmapped_resident: u64,
    /// Threads' caches (tcache_perthread_struct) found.
    pub tcaches: u64,
    /// Resident heap pages by in-use bytes: no byte in use, then 0-10% ... 90-100%
    /// ([`OCCUPANCY_BUCKETS`]); and the in-use bytes on the pages of each bucket.
    pub occupancy_pages: Vec<u64>,
    pub occupancy_in_use: Vec<u64>,
    /// Of those in-use bytes, the allocator's own: chunk headers (8 bytes an in-use chunk,
    /// 16 a mmapped one) and its structures (heap and arena headers, cache tables,
    /// fenceposts); the rest is what the program can use (malloc_usable_size). Empty in
    /// traces written before it was counted.
    pub occupancy_overhead: Vec<u64>,
    pub classes: Vec<GlibcClass>,
    /// Bytes of the process read for the census.
    pub bytes_read: u64,
}

impl GlibcHeap {
    pub fn in_use_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.in_use_bytes).sum::<u64>() + self.mmapped_bytes
    }
    pub fn in_use_chunks(&self) -> u64 {
        self.arenas.iter().map(|a| a.in_use_chunks).sum::<u64>() + self.mmapped_chunks
    }
    pub fn sum(&self, f: impl Fn(&GlibcArena) -> u64) -> u64 {
        self.arenas.iter().map(f).sum()
    }
}

/// Chunk 16.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapCensus {
    pub stream: u32,
    pub tick: u64,
    /// The allocator the process runs on, as its maps tell: "glibc", "jemalloc",
    /// "tcmalloc", "mimalloc" or "unknown".
    pub allocator: String,
    /// The process was held stopped while it was read (`--no-stop`: not, and the figures
    /// may not hold together).
    pub stopped: bool,
    /// How long it was held, in microseconds.
    pub pause_us: u64,
    /// The heap, or why it could not be read.
    pub result: Result<AllocatorHeap, String>,
}

/// A heap the census reads, by allocator: one variant per allocator it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorHeap {
    Glibc(GlibcHeap),
    Tcmalloc(TcmallocHeap),
    Jemalloc(JemallocHeap),
    Mimalloc(MimallocHeap),
    /// No malloc heap: the process maps no C library (a Go program without cgo), so its
    /// runtime's heap is its only one (chunk 25).
    Unused,
}

/// tcmalloc's heap (gperftools): its size classes with their spans and free objects
/// wherever they wait, and the page heap's totals. Bytes are tcmalloc's own (objects at
/// their class size).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct TcmallocHeap {
    /// The gperftools release whose layout was read, and the library.
    pub release: String,
    pub library: String,
    pub page_size: u64,
    /// The page heap's statistics: what it took from the system (unmapped included), its
    /// free spans still mapped, and those it gave back (MADV_DONTNEED).
    pub system_bytes: u64,
    pub pageheap_free_bytes: u64,
    pub unmapped_bytes: u64,
    pub thread_caches: u64,
    pub classes: Vec<TcmallocClass>,
    /// The size classes' span pages by objects handed out / objects carved (none, then
    /// [0, 10%) ... [90%, 100%]), and the bytes handed out in them.
    pub occupancy_pages: Vec<u64>,
    pub occupancy_in_use: Vec<u64>,
    pub bytes_read: u64,
}

/// One size class of tcmalloc.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct TcmallocClass {
    pub class: u32,
    /// Its objects' size, and the pages of each span it carves.
    pub size: u64,
    pub pages_per_span: u64,
    /// Spans carved for it, those with no free object left, and their pages.
    pub spans: u64,
    pub full_spans: u64,
    pub pages: u64,
    /// Objects the spans hold, and those handed out of them (to the program or to the
    /// caches).
    pub objects: u64,
    pub handed_out: u64,
    /// Free objects in the central free list (inside its spans), in the transfer cache
    /// and in the threads' caches.
    pub central_free: u64,
    pub transfer_free: u64,
    pub thread_cache_free: u64,
}

impl TcmallocClass {
    /// Objects the program holds.
    pub fn in_use(&self) -> u64 {
        self.handed_out - self.transfer_free - self.thread_cache_free
    }
}

impl TcmallocHeap {
    /// Free bytes of the central free lists: their free objects, and the tail of each span
    /// too short for one more object (as tcmalloc counts them,
    /// `tcmalloc.central_cache_free_bytes`).
    pub fn central_bytes(&self) -> u64 {
        self.classes.iter().map(|c| self.central_bytes_of(c)).sum()
    }
    /// [`TcmallocHeap::central_bytes`] of one class: its free objects, and the bytes at
    /// the end of its spans too short for one more object.
    pub fn central_bytes_of(&self, c: &TcmallocClass) -> u64 {
        c.central_free * c.size + (c.pages * self.page_size).saturating_sub(c.objects * c.size)
    }
    pub fn transfer_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.transfer_free * c.size).sum()
    }
    pub fn thread_cache_bytes(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| c.thread_cache_free * c.size)
            .sum()
    }
    pub fn cached_bytes(&self) -> u64 {
        self.central_bytes() + self.transfer_bytes() + self.thread_cache_bytes()
    }
    /// What tcmalloc counts as in use by the program (`generic.current_allocated_bytes`):
    /// every page it took and still maps, less the free ones and the free objects.
    pub fn in_use_bytes(&self) -> u64 {
        self.system_bytes
            .saturating_sub(self.unmapped_bytes + self.pageheap_free_bytes + self.cached_bytes())
    }
    /// The pages of small-object spans.
    pub fn span_bytes(&self) -> u64 {
        self.classes.iter().map(|c| c.pages).sum::<u64>() * self.page_size
    }

    fn encode(&self, w: &mut Writer) {
        w.str(&self.release).str(&self.library);
        for v in [
            self.page_size,
            self.system_bytes,
            self.pageheap_free_bytes,
            self.unmapped_bytes,
            self.thread_caches,
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
            w.varint(c.class.into());
            for v in [
                c.size,
                c.pages_per_span,
                c.spans,
                c.full_spans,
                c.pages,
                c.objects,
                c.handed_out,
                c.central_free,
                c.transfer_free,
                c.thread_cache_free,
            ] {
                w.varint(v);
            }
        }
    }

    fn decode(r: &mut Reader) -> Result<Self, TraceError> {
        let release = r.string()?;
        let library = r.string()?;
        let mut v = [0u64; 6];
        for x in &mut v {
            *x = r.varint()?;
        }
        let [page_size, system_bytes, pageheap_free_bytes, unmapped_bytes, thread_caches, bytes_read] =
            v;
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.count(1)?;
            *list = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        }
        let [occupancy_pages, occupancy_in_use] = lists;
        let n = r.count(11)?;
        let mut classes = Vec::with_capacity(n);
        for _ in 0..n {
            let class = r.varint()? as u32;
            let mut f = [0u64; 10];
            for x in &mut f {
                *x = r.varint()?;
            }
            let [size, pages_per_span, spans, full_spans, pages, objects, handed_out, central_free, transfer_free, thread_cache_free] =
                f;
            if transfer_free + thread_cache_free > handed_out || handed_out > objects {
                return Err(TraceError::Malformed(format!(
                    "tcmalloc size class {class} holds more objects than it has"
                )));
            }
            classes.push(TcmallocClass {
                class,
                size,
                pages_per_span,
                spans,
                full_spans,
                pages,
                objects,
                handed_out,
                central_free,
                transfer_free,
                thread_cache_free,
            });
        }
        Ok(Self {
            release,
            library,
            page_size,
            system_bytes,
            pageheap_free_bytes,
            unmapped_bytes,
            thread_caches,
            classes,
            occupancy_pages,
            occupancy_in_use,
            bytes_read,
        })
    }
}

/// jemalloc's heap (5.x): each arena's pages, each small size class's slabs (over every
/// arena), the large extents by size class, and what the threads' caches hold. Bytes are
/// jemalloc's own (regions at their class size), as its `stats.*` count them.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct JemallocHeap {
    /// The jemalloc release whose layout was read, and the library.
    pub release: String,
    pub library: String,
    pub page_size: u64,
    pub arenas: Vec<JemallocArena>,
    /// Small size classes that hold a slab or a cached region.
    pub bins: Vec<JemallocBin>,
    /// Large size classes with extents in use.
    pub large: Vec<JemallocLarge>,
    /// Slab and large-extent pages by regions in use / regions in the slab (none, then
    /// [0, 10%) ... [90%, 100%]; a large extent is one region), and the bytes in use in
    /// them.
    pub occupancy_pages: Vec<u64>,
    pub occupancy_in_use: Vec<u64>,
    pub bytes_read: u64,
}

/// One jemalloc arena's pages.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct JemallocArena {
    pub index: u32,
    /// Pages of extents in use, slabs and large extents (`stats.arenas.<i>.pactive`).
    pub active_pages: u64,
    /// Free pages it keeps: dirty (resident, until `dirty_decay_ms` purges them), muzzy
    /// (MADV_FREE'd, until `muzzy_decay_ms`), and retained (virtual memory only).
    pub dirty_pages: u64,
    pub muzzy_pages: u64,
    pub retained_pages: u64,
    /// Free extents in the dirty cache, and the bytes of its pages that are resident by
    /// pagemap (jemalloc counts them all resident).
    pub dirty_extents: u64,
    pub dirty_by_pagemap: u64,
    /// Bytes the arena maps for extents (`pac_mapped`), and its metadata (its base):
    /// allocated, resident (as jemalloc counts it: every page it handed out of its
    /// blocks), mapped, and resident by pagemap.
    pub mapped_bytes: u64,
    pub metadata_allocated: u64,
    pub metadata_resident: u64,
    pub metadata_mapped: u64,
    pub metadata_by_pagemap: u64,
    /// Threads' caches bound to it.
    pub thread_caches: u64,
}

/// One small size class of jemalloc, over every arena.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct JemallocBin {
    pub bin: u32,
    /// Its regions' size, and the bytes and regions of each slab.
    pub size: u64,
    pub slab_bytes: u64,
    pub regions_per_slab: u64,
    /// Slabs (`curslabs`), those with a free region in the bins' heaps (`nonfull_slabs`),
    /// and those with none.
    pub slabs: u64,
    pub nonfull_slabs: u64,
    pub full_slabs: u64,
    /// Regions handed out of the slabs (`curregs`: to the program or to threads' caches),
    /// regions free inside them, and regions waiting in threads' caches.
    pub regions_in_use: u64,
    pub free_regions: u64,
    pub tcache_regions: u64,
}

impl JemallocBin {
    /// Regions the program holds.
    pub fn program_regions(&self) -> u64 {
        self.regions_in_use - self.tcache_regions
    }
}

/// Large extents of one size class.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct JemallocLarge {
    /// The bytes each extent takes: the class's size, or, for a jemalloc that rounds large
    /// requests to whole pages (5.3.1), the mean of the class's extents.
    pub size: u64,
    /// Extents handed out (to the program or to threads' caches), and those cached.
    pub extents: u64,
    pub tcache_extents: u64,
}

impl JemallocHeap {
    /// What jemalloc counts as allocated (`stats.allocated`): regions and large extents
    /// handed out, at their class size (large ones at `JemallocLarge::size`), threads'
    /// caches included.
    pub fn allocated_bytes(&self) -> u64 {
        self.bins
            .iter()
            .map(|b| b.regions_in_use * b.size)
            .sum::<u64>()
            + self.large.iter().map(|l| l.extents * l.size).sum::<u64>()
    }
    /// Bytes waiting in threads' caches (`stats.arenas.<i>.tcache_bytes`).
    pub fn tcache_bytes(&self) -> u64 {
        self.bins
            .iter()
            .map(|b| b.tcache_regions * b.size)
            .sum::<u64>()
            + self
                .large
                .iter()
                .map(|l| l.tcache_extents * l.size)
                .sum::<u64>()
    }
    /// What the program holds: allocated, less the threads' caches.
    pub fn in_use_bytes(&self) -> u64 {
        self.allocated_bytes() - self.tcache_bytes()
    }
    /// Free regions inside slabs in use.
    pub fn slab_free_bytes(&self) -> u64 {
        self.bins.iter().map(|b| b.free_regions * b.size).sum()
    }
    fn pages(&self, f: impl Fn(&JemallocArena) -> u64) -> u64 {
        self.arenas.iter().map(f).sum::<u64>() * self.page_size
    }
    /// `stats.active`: pages of extents in use.
    pub fn active_bytes(&self) -> u64 {
        self.pages(|a| a.active_pages)
    }
    pub fn dirty_bytes(&self) -> u64 {
        self.pages(|a| a.dirty_pages)
    }
    pub fn muzzy_bytes(&self) -> u64 {
        self.pages(|a| a.muzzy_pages)
    }
    pub fn metadata_resident(&self) -> u64 {
        self.arenas.iter().map(|a| a.metadata_resident).sum()
    }
    /// Of the dirty pages and the metadata, the bytes resident by pagemap.
    pub fn dirty_by_pagemap(&self) -> u64 {
        self.arenas.iter().map(|a| a.dirty_by_pagemap).sum()
    }
    pub fn metadata_by_pagemap(&self) -> u64 {
        self.arenas.iter().map(|a| a.metadata_by_pagemap).sum()
    }
    /// `stats.resident`: metadata resident, active and dirty pages (muzzy ones are not
    /// counted: the kernel may have taken them).
    pub fn resident_bytes(&self) -> u64 {
        self.metadata_resident() + self.active_bytes() + self.dirty_bytes()
    }
    /// `stats.mapped`: the extents' mappings and the metadata's.
    pub fn mapped_bytes(&self) -> u64 {
        self.arenas
            .iter()
            .map(|a| a.mapped_bytes + a.metadata_mapped)
            .sum()
    }

    fn encode(&self, w: &mut Writer) {
        w.str(&self.release).str(&self.library);
        w.varint(self.page_size).varint(self.bytes_read);
        for list in [&self.occupancy_pages, &self.occupancy_in_use] {
            w.varint(list.len() as u64);
            for &v in list {
                w.varint(v);
            }
        }
        w.varint(self.arenas.len() as u64);
        for a in &self.arenas {
            w.varint(a.index.into());
            for v in [
                a.active_pages,
                a.dirty_pages,
                a.muzzy_pages,
                a.retained_pages,
                a.dirty_extents,
                a.dirty_by_pagemap,
                a.mapped_bytes,
                a.metadata_allocated,
                a.metadata_resident,
                a.metadata_mapped,
                a.metadata_by_pagemap,
                a.thread_caches,
            ] {
                w.varint(v);
            }
        }
        w.varint(self.bins.len() as u64);
        for b in &self.bins {
            w.varint(b.bin.into());
            for v in [
                b.size,
                b.slab_bytes,
                b.regions_per_slab,
                b.slabs,
                b.nonfull_slabs,
                b.full_slabs,
                b.regions_in_use,
                b.free_regions,
                b.tcache_regions,
            ] {
                w.varint(v);
            }
        }
        w.varint(self.large.len() as u64);
        for l in &self.large {
            w.varint(l.size).varint(l.extents).varint(l.tcache_extents);
        }
    }

    fn decode(r: &mut Reader) -> Result<Self, TraceError> {
        let release = r.string()?;
        let library = r.string()?;
        let page_size = r.varint()?;
        let bytes_read = r.varint()?;
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.count(1)?;
            *list = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        }
        let [occupancy_pages, occupancy_in_use] = lists;
        let n = r.count(13)?;
        let mut arenas = Vec::with_capacity(n);
        for _ in 0..n {
            let index = r.varint()? as u32;
            let mut f = [0u64; 12];
            for x in &mut f {
                *x = r.varint()?;
            }
            let [active_pages, dirty_pages, muzzy_pages, retained_pages, dirty_extents, dirty_by_pagemap, mapped_bytes, metadata_allocated, metadata_resident, metadata_mapped, metadata_by_pagemap, thread_caches] =
                f;
            arenas.push(JemallocArena {
                index,
                active_pages,
                dirty_pages,
                muzzy_pages,
                retained_pages,
                dirty_extents,
                dirty_by_pagemap,
                mapped_bytes,
                metadata_allocated,
                metadata_resident,
                metadata_mapped,
                metadata_by_pagemap,
                thread_caches,
            });
        }
        let n = r.count(10)?;
        let mut bins = Vec::with_capacity(n);
        for _ in 0..n {
            let bin = r.varint()? as u32;
            let mut f = [0u64; 9];
            for x in &mut f {
                *x = r.varint()?;
            }
            let [size, slab_bytes, regions_per_slab, slabs, nonfull_slabs, full_slabs, regions_in_use, free_regions, tcache_regions] =
                f;
            if tcache_regions > regions_in_use {
                return Err(TraceError::Malformed(format!(
                    "jemalloc bin {bin} caches more regions than it handed out"
                )));
            }
            bins.push(JemallocBin {
                bin,
                size,
                slab_bytes,
                regions_per_slab,
                slabs,
                nonfull_slabs,
                full_slabs,
                regions_in_use,
                free_regions,
                tcache_regions,
            });
        }
        let n = r.count(3)?;
        let mut large = Vec::with_capacity(n);
        for _ in 0..n {
            let (size, extents, tcache_extents) = (r.varint()?, r.varint()?, r.varint()?);
            if tcache_extents > extents {
                return Err(TraceError::Malformed(format!(
                    "jemalloc's large class of {size} bytes caches more extents than it has"
                )));
            }
            large.push(JemallocLarge {
                size,
                extents,
                tcache_extents,
            });
        }
        Ok(Self {
            release,
            library,
            page_size,
            arenas,
            bins,
            large,
            occupancy_pages,
            occupancy_in_use,
            bytes_read,
        })
    }
}

impl HeapCensus {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .str(&self.allocator)
            .u8(self.stopped.into())
            .varint(self.pause_us);
        match &self.result {
            Err(note) => {
                w.u8(0).str(note);
            }
            Ok(AllocatorHeap::Tcmalloc(h)) => {
                w.u8(2);
                h.encode(&mut w);
            }
            Ok(AllocatorHeap::Jemalloc(h)) => {
                w.u8(3);
                h.encode(&mut w);
            }
            Ok(AllocatorHeap::Unused) => {
                w.u8(4);
            }
            Ok(AllocatorHeap::Mimalloc(h)) => {
                w.u8(5);
                h.encode(&mut w);
            }
            Ok(AllocatorHeap::Glibc(h)) => {
                w.u8(1)
                    .str(&h.version)
                    .str(&h.layout_source)
                    .varint(h.page_size)
                    .varint(h.arenas.len() as u64);
                for a in &h.arenas {
                    w.u8(a.main.into());
                    for v in arena_fields(a) {
                        w.varint(v);
                    }
                }
                w.varint(h.mmapped_chunks)
                    .varint(h.mmapped_bytes)
                    .varint(h.mmapped_resident)
                    .varint(h.tcaches);
                for list in [&h.occupancy_pages, &h.occupancy_in_use] {
                    w.varint(list.len() as u64);
                    for &v in list {
                        w.varint(v);
                    }
                }
                w.varint(h.classes.len() as u64);
                for c in &h.classes {
                    w.varint(c.chunk_size)
                        .varint(c.in_use)
                        .varint(c.in_use_bytes)
                        .varint(c.free)
                        .varint(c.free_bytes)
                        .varint(c.pages);
                }
                w.varint(h.bytes_read);
                // Added later, at the end: older readers stop before it.
                w.varint(h.occupancy_overhead.len() as u64);
                for &v in &h.occupancy_overhead {
                    w.varint(v);
                }
                // Added later still.
                w.varint(h.mmapped_trailer);
            }
        }
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let allocator = r.string()?;
        let stopped = r.u8()? != 0;
        let pause_us = r.varint()?;
        let result = match r.u8()? {
            0 => Err(r.string()?),
            1 => {
                let version = r.string()?;
                let layout_source = r.string()?;
                let page_size = r.varint()?;
                let n = r.count(ARENA_FIELDS + 1)?;
                let mut arenas = Vec::with_capacity(n);
                for _ in 0..n {
                    let main = r.u8()? != 0;
                    let mut v = [0u64; ARENA_FIELDS];
                    for x in &mut v {
                        *x = r.varint()?;
                    }
                    arenas.push(arena_from(main, v));
                }
                let mmapped_chunks = r.varint()?;
                let mmapped_bytes = r.varint()?;
                let mmapped_resident = r.varint()?;
                let tcaches = r.varint()?;
                let mut lists = [Vec::new(), Vec::new()];
                for list in &mut lists {
                    let n = r.count(1)?;
                    *list = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
                }
                let [occupancy_pages, occupancy_in_use] = lists;
                let n = r.count(6)?;
                let mut classes = Vec::with_capacity(n);
                for _ in 0..n {
                    classes.push(GlibcClass {
                        chunk_size: r.varint()?,
                        in_use: r.varint()?,
                        in_use_bytes: r.varint()?,
                        free: r.varint()?,
                        free_bytes: r.varint()?,
                        pages: r.varint()?,
                    });
                }
                let bytes_read = r.varint()?;
                // Absent from traces written before the allocator's bytes were split out.
                let occupancy_overhead = if r.is_empty() {
                    Vec::new()
                } else {
                    let n = r.count(1)?;
                    (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?
                };
                // Absent from traces written before glibc 2.43 was read.
                let mmapped_trailer = if r.is_empty() { 0 } else { r.varint()? };
                Ok(AllocatorHeap::Glibc(GlibcHeap {
                    version,
                    layout_source,
                    page_size,
                    arenas,
                    mmapped_chunks,
                    mmapped_bytes,
                    mmapped_resident,
                    tcaches,
                    occupancy_pages,
                    occupancy_in_use,
                    classes,
                    bytes_read,
                    occupancy_overhead,
                    mmapped_trailer,
                }))
            }
            2 => Ok(AllocatorHeap::Tcmalloc(TcmallocHeap::decode(&mut r)?)),
            3 => Ok(AllocatorHeap::Jemalloc(JemallocHeap::decode(&mut r)?)),
            4 => Ok(AllocatorHeap::Unused),
            5 => Ok(AllocatorHeap::Mimalloc(MimallocHeap::decode(&mut r)?)),
            other => {
                return Err(TraceError::Malformed(format!(
                    "a heap census with an unknown outcome tag {other}"
                )))
            }
        };
        Ok(Self {
            stream,
            tick,
            allocator,
            stopped,
            pause_us,
            result,
        })
    }
}

const ARENA_FIELDS: usize = 17;

fn arena_fields(a: &GlibcArena) -> [u64; ARENA_FIELDS] {
    [
        a.heaps,
        a.system_mem,
        a.threads,
        a.in_use_chunks,
        a.in_use_bytes,
        a.free_chunks,
        a.free_bytes,
        a.fastbin_chunks,
        a.fastbin_bytes,
        a.tcache_chunks,
        a.tcache_bytes,
        a.top_bytes,
        a.overhead_bytes,
        a.resident_bytes,
        a.free_in_used_pages,
        a.free_pages_bytes,
        a.trimmable_bytes,
    ]
}

fn arena_from(main: bool, v: [u64; ARENA_FIELDS]) -> GlibcArena {
    let [heaps, system_mem, threads, in_use_chunks, in_use_bytes, free_chunks, free_bytes, fastbin_chunks, fastbin_bytes, tcache_chunks, tcache_bytes, top_bytes, overhead_bytes, resident_bytes, free_in_used_pages, free_pages_bytes, trimmable_bytes] =
        v;
    GlibcArena {
        main,
        heaps,
        system_mem,
        threads,
        in_use_chunks,
        in_use_bytes,
        free_chunks,
        free_bytes,
        fastbin_chunks,
        fastbin_bytes,
        tcache_chunks,
        tcache_bytes,
        top_bytes,
        overhead_bytes,
        resident_bytes,
        free_in_used_pages,
        free_pages_bytes,
        trimmable_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starting_heap_round_trips_and_a_cut_one_is_an_error() {
        let h = StartingHeap {
            stream: 3,
            tick: 17,
            blocks: vec![
                (0x5555_0000_0010, 24),
                (0x5555_0000_0030, 1000),
                (0x7f00_0000_0010, 1 << 20),
            ],
        };
        let bytes = h.encode();
        assert_eq!(StartingHeap::decode(&bytes).unwrap(), h);
        for cut in 0..bytes.len() {
            assert!(StartingHeap::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // A count no payload could hold is refused before anything is reserved.
        let mut w = Writer::new();
        w.varint(0).varint(0).varint(u64::MAX >> 1);
        assert!(StartingHeap::decode(&w.bytes).is_err());
    }

    #[test]
    fn heap_censuses_round_trip_and_cut_ones_are_errors() {
        let arena = GlibcArena {
            main: true,
            heaps: 1,
            system_mem: 1 << 20,
            threads: 1,
            in_use_chunks: 10,
            in_use_bytes: 4000,
            free_chunks: 2,
            free_bytes: 300,
            tcache_chunks: 3,
            tcache_bytes: 96,
            top_bytes: 5000,
            trimmable_bytes: 4096,
            ..Default::default()
        };
        let heap = GlibcHeap {
            version: "2.36".into(),
            layout_source: "symbols".into(),
            page_size: 4096,
            arenas: vec![
                arena.clone(),
                GlibcArena {
                    main: false,
                    heaps: 2,
                    ..arena
                },
            ],
            mmapped_chunks: 1,
            mmapped_bytes: 1 << 18,
            mmapped_resident: 1 << 17,
            mmapped_trailer: 8,
            tcaches: 2,
            occupancy_pages: vec![1; OCCUPANCY_BUCKETS],
            occupancy_in_use: vec![2; OCCUPANCY_BUCKETS],
            occupancy_overhead: vec![1; OCCUPANCY_BUCKETS],
            classes: vec![GlibcClass {
                chunk_size: 48,
                in_use: 3,
                in_use_bytes: 144,
                free: 1,
                free_bytes: 48,
                pages: 1,
            }],
            bytes_read: 12345,
        };
        let glibc = HeapCensus {
            stream: 0,
            tick: 3,
            allocator: "glibc".into(),
            stopped: true,
            pause_us: 812,
            result: Ok(AllocatorHeap::Glibc(heap)),
        };
        // A census written before the allocator's bytes were counted apart ends before
        // them (a count and one byte a bucket), and one written before glibc 2.43 was read
        // before the mmapped chunks' trailer (one byte): each reads as one without them.
        let before_trailer = glibc.encode().len() - 1;
        let old_end = before_trailer - 1 - OCCUPANCY_BUCKETS;
        let tcmalloc = HeapCensus {
            allocator: "tcmalloc".into(),
            result: Ok(AllocatorHeap::Tcmalloc(TcmallocHeap {
                release: "2.10".into(),
                library: "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4.5.10".into(),
                page_size: 8192,
                system_bytes: 1 << 20,
                pageheap_free_bytes: 8192,
                thread_caches: 2,
                classes: vec![TcmallocClass {
                    class: 3,
                    size: 32,
                    pages_per_span: 1,
                    spans: 2,
                    pages: 2,
                    objects: 512,
                    handed_out: 40,
                    central_free: 472,
                    transfer_free: 32,
                    thread_cache_free: 3,
                    ..Default::default()
                }],
                occupancy_pages: vec![1; OCCUPANCY_BUCKETS],
                occupancy_in_use: vec![64; OCCUPANCY_BUCKETS],
                bytes_read: 99,
                ..Default::default()
            })),
            ..glibc.clone()
        };
        let jemalloc = HeapCensus {
            allocator: "jemalloc".into(),
            result: Ok(AllocatorHeap::Jemalloc(JemallocHeap {
                release: "5.3.0".into(),
                library: "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2".into(),
                page_size: 4096,
                arenas: vec![JemallocArena {
                    index: 0,
                    active_pages: 30,
                    dirty_pages: 4,
                    dirty_extents: 2,
                    dirty_by_pagemap: 3 * 4096,
                    mapped_bytes: 1 << 20,
                    metadata_resident: 8192,
                    metadata_by_pagemap: 4096,
                    thread_caches: 1,
                    ..Default::default()
                }],
                bins: vec![JemallocBin {
                    bin: 2,
                    size: 32,
                    slab_bytes: 4096,
                    regions_per_slab: 128,
                    slabs: 3,
                    nonfull_slabs: 2,
                    full_slabs: 1,
                    regions_in_use: 200,
                    free_regions: 184,
                    tcache_regions: 7,
                }],
                large: vec![JemallocLarge {
                    size: 20480,
                    extents: 4,
                    tcache_extents: 1,
                }],
                occupancy_pages: vec![1; OCCUPANCY_BUCKETS],
                occupancy_in_use: vec![64; OCCUPANCY_BUCKETS],
                bytes_read: 77,
            })),
            ..glibc.clone()
        };
        for c in [&tcmalloc, &jemalloc] {
            let bytes = c.encode();
            assert_eq!(&HeapCensus::decode(&bytes).unwrap(), c);
            assert!((0..bytes.len()).all(|cut| HeapCensus::decode(&bytes[..cut]).is_err()));
        }
        let Ok(AllocatorHeap::Jemalloc(j)) = &jemalloc.result else {
            unreachable!()
        };
        assert_eq!(j.allocated_bytes(), 200 * 32 + 4 * 20480);
        assert_eq!(j.in_use_bytes(), 193 * 32 + 3 * 20480);
        assert_eq!(j.resident_bytes(), 8192 + 34 * 4096);
        for c in [
            glibc.clone(),
            HeapCensus {
                stream: 1,
                tick: 0,
                allocator: "jemalloc".into(),
                stopped: false,
                pause_us: 0,
                result: Err("not read".into()),
            },
        ] {
            let bytes = c.encode();
            assert_eq!(HeapCensus::decode(&bytes).unwrap(), c);
            for cut in 0..bytes.len() {
                let read = HeapCensus::decode(&bytes[..cut]);
                if c.result.is_ok() && (cut == old_end || cut == before_trailer) {
                    let mut old = c.clone();
                    if let Ok(AllocatorHeap::Glibc(h)) = old.result.as_mut() {
                        h.mmapped_trailer = 0;
                        if cut == old_end {
                            h.occupancy_overhead.clear();
                        }
                    }
                    assert_eq!(read.unwrap(), old);
                } else {
                    assert!(read.is_err(), "cut at {cut}");
                }
            }
        }
        assert_eq!(arena.allocator_in_use(), 4096);
        assert_eq!(arena.allocator_free(), 5300);
    }
}
