//! jemalloc's heap (5.3.0 as Debian 12's libjemalloc2 ships it), read from outside a
//! running process.
//!
//! jemalloc serves small requests (up to 14 KiB) from *bins*, one per size class in each
//! arena: a bin carves *slabs* (runs of pages) into regions of its size. A slab with a
//! free region waits in its bin's heap of non-full slabs; a full one is not tracked (in
//! automatic arenas); a slab returns its pages only when all of its regions are free. One
//! survivor keeps its slab. Freed pages stay *dirty* (resident) until `dirty_decay_ms`
//! purges them (then *muzzy*, MADV_FREE'd, until `muzzy_decay_ms`). Larger requests are
//! *large extents* of whole pages. Threads cache freed regions in their tcache.
//!
//! Where each figure is read (layouts of jemalloc 5.3.0 built as Debian builds it,
//! `--enable-prof`, x86-64, taken from the debug information of that source so built; the
//! library is stripped to its exported symbols, so the hidden statics are found by their
//! shape in its data and checked against each other):
//! - `bin_infos[36]` (40 bytes each: region size, slab size, regions, shards) by its
//!   sizes 8, 16, 32, 48, ...; `arena_bin_offsets[36]` by its values, each bin's offset in
//!   `arena_t`: the first is `sizeof(arena_t)`, then one `bin_t` per shard — which checks
//!   both sizes against the library.
//! - `arenas[4095]`, pointers to each arena, by their shape; each arena's `ind` must be
//!   its index.
//! - Per arena: its bins' statistics (`curregs`, `curslabs`, `nonfull_slabs`), the
//!   current slab and the pairing heap of non-full slabs, each slab's extent descriptor
//!   (`edata_t`: its bin, arena and free regions); its large classes' counts (`nmalloc`
//!   less `ndalloc`); its active pages (`nactive`); the page counts of its dirty, muzzy and
//!   retained extent caches, the dirty ones' list; its base's metadata counts; the
//!   threads' caches bound to it (`cache_bin_array_descriptor_ql`).
//!
//! Checked: each bin's regions in use are its slabs' regions less the free ones walked;
//! its non-full slabs walked are as many as it counts; the active pages are the slabs'
//! and large extents' pages; the dirty list adds up to the dirty page count. A census that
//! does not hold together is refused.

use fragscope_trace::heap_census::{
    JemallocArena, JemallocBin, JemallocHeap, JemallocLarge, OCCUPANCY_BUCKETS,
};

use fragscope_trace::ResidentRange;

use crate::library::{MappedLibrary, StaticData};
use crate::memory::{le_u32, le_u64, RecordReader};
use crate::residency::Residency;
use crate::ProcessMemory;

/// The release whose layout is checked, by the version string its library carries.
const VERIFIED: (&str, &str) = ("5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c", "5.3.0");

const PAGE: u64 = 4096;
/// Small size classes (`SC_NBINS`), large ones (`SC_NSIZES - SC_NBINS`), bins in a
/// thread's cache (`TCACHE_NBINS_MAX`), arenas (`MALLOCX_ARENA_LIMIT`).
const BINS: usize = 36;
const LARGE_CLASSES: usize = 196;
const TCACHE_BINS: usize = 73;
const MAX_ARENAS: usize = 4095;

// bin_info_t.
const BIN_INFO_SIZE: usize = 40;
const BIN_INFO_SLAB_SIZE: usize = 8;
const BIN_INFO_NREGS: usize = 16;
const BIN_INFO_SHARDS: usize = 20;

// arena_t.
const ARENA_STATS: usize = 24;
const ARENA_LSTATS: usize = ARENA_STATS + 952;
const LSTATS_SIZE: usize = 48;
const LSTATS_NDALLOC: usize = 8;
const ARENA_PAC_MAPPED: usize = ARENA_STATS + 88 + 8 + 56;
const ARENA_TCACHE_DESCRIPTORS: usize = 10400;
const ARENA_PA_SHARD: usize = 10648;
const ARENA_NACTIVE: usize = ARENA_PA_SHARD + 8;
const ARENA_PAC: usize = ARENA_PA_SHARD + 24;
const PAC_ECACHE_DIRTY: usize = ARENA_PAC + 56;
const ECACHE_SIZE: usize = 19440;
const ECACHE_ESET: usize = 112;
const ECACHE_GUARDED_ESET: usize = 9768;
const ESET_LRU: usize = 9632;
const ESET_NPAGES: usize = 9640;
const PA_SHARD_IND: usize = ARENA_PA_SHARD + 68240;
const PA_SHARD_BASE: usize = ARENA_PA_SHARD + 68272;
const ARENA_IND: usize = 78928;
const ARENA_BASE: usize = 78936;
/// `sizeof(arena_t)`: the bins follow.
const ARENA_BINS: usize = 78952;

// bin_t.
const BIN_SIZE: usize = 224;
const BIN_CURREGS: usize = 112 + 24;
const BIN_CURSLABS: usize = 112 + 64;
const BIN_NONFULL: usize = 112 + 72;
const BIN_SLABCUR: usize = 192;
const BIN_HEAP_ROOT: usize = 200;

// edata_t.
const EDATA_SIZE: usize = 128;
const EDATA_ADDR: usize = 8;
const EDATA_SIZE_ESN: usize = 16;
const EDATA_HEAP_NEXT: usize = 48;
const EDATA_HEAP_LCHILD: usize = 56;
const EDATA_LRU_NEXT: usize = 64;

// base_t.
const BASE_SIZE: usize = 3912;
const BASE_BLOCKS: usize = 160;
const BASE_ALLOCATED: usize = 3880;
const BASE_RESIDENT: usize = 3888;
const BASE_MAPPED: usize = 3896;

// cache_bin_t and its array's descriptor.
const CACHE_BIN_SIZE: usize = 24;
const CACHE_BIN_LOW_BITS_FULL: usize = 18;
const CACHE_BIN_LOW_BITS_EMPTY: usize = 20;
const DESCRIPTOR_BINS: usize = 16;

/// Extents and caches walked at most per list: a longer one is corrupt.
const MAX_WALK: u64 = 1 << 26;

/// jemalloc's size classes for 4 KiB pages and a 16-byte quantum: 8, then 16 to 64 by
/// 16, then four classes per doubling (`sz_index2size`).
fn size_classes() -> Vec<u64> {
    let mut sizes = vec![8, 16, 32, 48, 64];
    let mut base = 64u64;
    while sizes.len() < BINS + LARGE_CLASSES {
        let delta = base / 4;
        sizes.extend((1..=4).map(|k| base + k * delta));
        base *= 2;
    }
    sizes.truncate(BINS + LARGE_CLASSES);
    sizes
}

/// One small size class as the library's `bin_infos` describes it.
#[derive(Debug, Clone, Copy)]
struct BinInfo {
    size: u64,
    slab_bytes: u64,
    regions: u64,
    shards: u64,
}

/// Where a process's jemalloc keeps its state.
pub struct JemallocLayout {
    pub library: String,
    pub release: &'static str,
    bins: Vec<BinInfo>,
    /// Each bin's offset in `arena_t` (`arena_bin_offsets`).
    bin_offsets: Vec<u64>,
    /// `arenas[]`: its address.
    arenas: u64,
}

/// Finds jemalloc's library in `pid`'s mappings and its hidden statics. Err: why this
/// process's jemalloc cannot be read (none, another build).
pub fn locate(pid: u32, mem: &mut ProcessMemory) -> Result<JemallocLayout, String> {
    let Some(lib) = MappedLibrary::find(pid, "libjemalloc")? else {
        return Err(
            "no jemalloc library is mapped (a copy linked into the program is not read yet)".into(),
        );
    };
    let elf = lib.elf(pid)?;
    let (version, release) = VERIFIED;
    if memchr::memmem::find(&elf, version.as_bytes()).is_none() {
        return Err(format!(
            "the process runs on {}, a jemalloc build whose layout fragscope has not \
             verified (it reads {release} as Debian 12 builds it)",
            lib.path
        ));
    }
    let statics = StaticData::read(mem, lib.data, "jemalloc")?;
    let bins = find_bin_infos(&statics)?;
    let bin_offsets = find_bin_offsets(&statics, &bins)?;
    let arenas = find_arenas(mem, &statics)?;
    Ok(JemallocLayout {
        library: lib.path,
        release,
        bins,
        bin_offsets,
        arenas,
    })
}

/// `bin_infos`: 36 entries whose region sizes are jemalloc's small classes, each slab
/// whole pages carved into as many regions as fit.
fn find_bin_infos(s: &StaticData) -> Result<Vec<BinInfo>, String> {
    let sizes = size_classes();
    let first: Vec<u8> = 8u64.to_le_bytes().to_vec();
    let mut found = None;
    for at in memchr::memmem::find_iter(&s.bytes, &first) {
        if !at.is_multiple_of(8) || at + BINS * BIN_INFO_SIZE > s.bytes.len() {
            continue;
        }
        let entry = |i: usize| {
            let e = at + i * BIN_INFO_SIZE;
            BinInfo {
                size: le_u64(&s.bytes, e),
                slab_bytes: le_u64(&s.bytes, e + BIN_INFO_SLAB_SIZE),
                regions: u64::from(le_u32(&s.bytes, e + BIN_INFO_NREGS)),
                shards: u64::from(le_u32(&s.bytes, e + BIN_INFO_SHARDS)),
            }
        };
        let table: Vec<BinInfo> = (0..BINS).map(entry).collect();
        let holds = table.iter().zip(&sizes).all(|(b, &size)| {
            b.size == size
                && b.slab_bytes > 0
                && b.slab_bytes.is_multiple_of(PAGE)
                && b.regions == b.slab_bytes / size
                && (1..=64).contains(&b.shards)
        });
        if holds && found.replace(table).is_some() {
            return Err("two tables look like jemalloc's bins".into());
        }
    }
    found.ok_or_else(|| "jemalloc's size classes were not found in its data".into())
}

/// `arena_bin_offsets`: the bins' offsets in an arena, `sizeof(arena_t)` and then one
/// `bin_t` per shard. Found only when the library's arena and bin sizes are those read.
fn find_bin_offsets(s: &StaticData, bins: &[BinInfo]) -> Result<Vec<u64>, String> {
    let mut offsets = Vec::with_capacity(bins.len());
    let mut at = ARENA_BINS as u64;
    for b in bins {
        offsets.push(at);
        at += b.shards * BIN_SIZE as u64;
    }
    let pattern: Vec<u8> = offsets
        .iter()
        .flat_map(|&o| (o as u32).to_le_bytes())
        .collect();
    match memchr::memmem::find_iter(&s.bytes, &pattern).count() {
        1 => Ok(offsets),
        0 => {
            Err("jemalloc's bins are not where its 5.3.0 layout puts them (another build?)".into())
        }
        _ => Err("two tables look like jemalloc's bin offsets".into()),
    }
}

/// `arenas[]`: 4095 pointers, the first set, each either null or an arena (allocated on
/// a cache line, outside the library) that names itself: its `ind` and its page
/// allocator's are its index, and both name the same base.
fn find_arenas(mem: &mut ProcessMemory, s: &StaticData) -> Result<u64, String> {
    let len = MAX_ARENAS * 8;
    let pointer = |w: u64| w.is_multiple_of(64) && w > 0xffff && !s.contains(w) && w < 1 << 47;
    let mut found = None;
    let mut off = 0usize;
    while off + len <= s.bytes.len() {
        let first = le_u64(&s.bytes, off);
        if !pointer(first) {
            off += 8;
            continue;
        }
        let words = (0..MAX_ARENAS).map(|i| le_u64(&s.bytes, off + 8 * i));
        if words.clone().all(|w| w == 0 || pointer(w)) {
            let named_by_index = words
                .enumerate()
                .filter(|&(_, w)| w != 0)
                .all(|(i, w)| names_itself(mem, w, i));
            if named_by_index && found.replace(s.base + off as u64).is_some() {
                return Err("two arrays look like jemalloc's arenas".into());
            }
        }
        off += 8;
    }
    found.ok_or_else(|| "jemalloc's arenas were not found in its data".into())
}

/// The arena at `at` carries `index` as its own and its page allocator's, with one base.
fn names_itself(mem: &mut ProcessMemory, at: u64, index: usize) -> bool {
    let mut tail = [0u8; ARENA_BINS - ARENA_PA_SHARD];
    if mem.read(at + ARENA_PA_SHARD as u64, &mut tail).is_err() {
        return false;
    }
    let field = |off: usize| off - ARENA_PA_SHARD;
    let base = le_u64(&tail, field(ARENA_BASE));
    le_u32(&tail, field(ARENA_IND)) as usize == index
        && le_u32(&tail, field(PA_SHARD_IND)) as usize == index
        && base != 0
        && le_u64(&tail, field(PA_SHARD_BASE)) == base
}

/// An extent descriptor's fields (`edata_t`'s `e_bits`).
struct Extent {
    arena: u64,
    slab: bool,
    state: u64,
    bin: u64,
    free: u64,
    shard: u64,
    addr: u64,
    bytes: u64,
}

impl Extent {
    fn of(e: &[u8; EDATA_SIZE]) -> Self {
        let bits = le_u64(e, 0);
        let field = |shift: u32, width: u32| (bits >> shift) & ((1 << width) - 1);
        Self {
            arena: field(0, 12),
            slab: field(12, 1) == 1,
            state: field(17, 3),
            bin: field(20, 8),
            free: field(28, 10),
            shard: field(38, 6),
            addr: le_u64(e, EDATA_ADDR),
            bytes: le_u64(e, EDATA_SIZE_ESN) & !(PAGE - 1),
        }
    }
}

/// What one census gathers, over every arena.
struct Tally {
    bins: Vec<JemallocBin>,
    large: Vec<JemallocLarge>,
    occupancy_pages: Vec<u64>,
    occupancy_in_use: Vec<u64>,
}

impl Tally {
    fn slab(&mut self, regions: u64, in_use: u64, size: u64, pages: u64) {
        let bucket = if in_use == 0 {
            0
        } else {
            1 + ((in_use * 10 / regions.max(1)) as usize).min(9)
        };
        self.occupancy_pages[bucket] += pages;
        self.occupancy_in_use[bucket] += in_use * size;
    }
}

/// Reads the heap: every arena's bins and slabs, large classes, page caches and threads'
/// caches. The caller holds the process stopped; `residency`: its pagemap, read meanwhile,
/// which says how much of the dirty pages and metadata jemalloc counts is resident.
pub fn census(
    mem: &mut ProcessMemory,
    layout: &JemallocLayout,
    residency: &[ResidentRange],
) -> Result<JemallocHeap, String> {
    let residency = &Residency::new(residency, PAGE);
    let start_read = mem.bytes_read();
    let sizes = size_classes();
    let mut table = vec![0u8; MAX_ARENAS * 8];
    mem.read(layout.arenas, &mut table)
        .map_err(|e| format!("jemalloc's arenas could not be read ({e})"))?;
    let mut tally = Tally {
        bins: layout
            .bins
            .iter()
            .enumerate()
            .map(|(i, b)| JemallocBin {
                bin: i as u32,
                size: b.size,
                slab_bytes: b.slab_bytes,
                regions_per_slab: b.regions,
                ..JemallocBin::default()
            })
            .collect(),
        large: sizes[BINS..]
            .iter()
            .map(|&size| JemallocLarge {
                size,
                ..JemallocLarge::default()
            })
            .collect(),
        occupancy_pages: vec![0; OCCUPANCY_BUCKETS],
        occupancy_in_use: vec![0; OCCUPANCY_BUCKETS],
    };
    let mut extents = RecordReader::default();
    let mut arenas = Vec::new();
    for i in 0..MAX_ARENAS {
        let at = le_u64(&table, 8 * i);
        if at != 0 {
            let reading = ArenaReading {
                mem: &mut *mem,
                extents: &mut extents,
                residency,
                layout,
            };
            arenas.push(arena(reading, &mut tally, i, at)?);
        }
    }
    if arenas.is_empty() {
        return Err("jemalloc has no arena".into());
    }
    // A thread's cache fills from its arena, but may have moved to another since: the
    // caches are checked against the classes over every arena.
    for b in &tally.bins {
        if b.tcache_regions > b.regions_in_use {
            return Err(format!(
                "threads' caches hold more regions of {} bytes than the bins handed out",
                b.size
            ));
        }
    }
    for l in &tally.large {
        if l.tcache_extents > l.extents {
            return Err(format!(
                "threads' caches hold more large extents of {} bytes than were handed out",
                l.size
            ));
        }
    }
    let mut heap = JemallocHeap {
        release: layout.release.into(),
        library: layout.library.clone(),
        page_size: PAGE,
        arenas,
        bins: tally.bins,
        large: tally.large,
        occupancy_pages: tally.occupancy_pages,
        occupancy_in_use: tally.occupancy_in_use,
        bytes_read: 0,
    };
    heap.bins
        .retain(|b| b.slabs > 0 || b.tcache_regions > 0 || b.regions_in_use > 0);
    heap.large.retain(|l| l.extents > 0);
    heap.bytes_read = mem.bytes_read() - start_read;
    Ok(heap)
}

/// What an arena is read with.
struct ArenaReading<'a> {
    mem: &'a mut ProcessMemory,
    extents: &'a mut RecordReader,
    residency: &'a Residency<'a>,
    layout: &'a JemallocLayout,
}

/// One arena: its bins, large classes, page caches and threads' caches, added to
/// `tally`; its pages returned.
fn arena(
    reading: ArenaReading,
    tally: &mut Tally,
    index: usize,
    at: u64,
) -> Result<JemallocArena, String> {
    let ArenaReading {
        mem,
        extents,
        residency,
        layout,
    } = reading;
    let bins_end =
        layout.bin_offsets[BINS - 1] as usize + layout.bins[BINS - 1].shards as usize * BIN_SIZE;
    let mut a = vec![0u8; bins_end];
    mem.read(at, &mut a)
        .map_err(|e| format!("arena {index} could not be read ({e})"))?;
    let names_itself = |off: usize| le_u32(&a, off) as usize == index;
    if !names_itself(ARENA_IND)
        || !names_itself(PA_SHARD_IND)
        || le_u64(&a, ARENA_BASE) != le_u64(&a, PA_SHARD_BASE)
    {
        return Err(format!("arena {index} does not carry its index"));
    }
    let word = |off: usize| le_u64(&a, off);
    let mut slab_pages = 0u64;
    for (b, info) in layout.bins.iter().enumerate() {
        for shard in 0..info.shards {
            let bin = layout.bin_offsets[b] as usize + shard as usize * BIN_SIZE;
            let in_use = word(bin + BIN_CURREGS);
            let slabs = word(bin + BIN_CURSLABS);
            let nonfull = word(bin + BIN_NONFULL);
            let mut walked = Vec::new();
            let current = word(bin + BIN_SLABCUR);
            if current != 0 {
                walked.push((current, Extent::of(&extents.read(mem, current)?), true));
            }
            for (at, e) in heap_nodes(mem, extents, word(bin + BIN_HEAP_ROOT), nonfull)? {
                walked.push((at, e, false));
            }
            if walked.len() as u64 - u64::from(current != 0) != nonfull {
                return Err(format!(
                    "arena {index}'s bin {b} counts {nonfull} non-full slabs, {} were found",
                    walked.len() as u64 - u64::from(current != 0)
                ));
            }
            let mut free = 0u64;
            for (e, slab, is_current) in &walked {
                let (e, is_current) = (*e, *is_current);
                let holds = slab.slab
                    && slab.arena as usize == index
                    && slab.state == 0
                    && slab.bin as usize == b
                    && slab.shard == shard
                    && slab.addr != 0
                    && slab.bytes == info.slab_bytes
                    && slab.free < info.regions
                    && (is_current || slab.free > 0);
                if !holds {
                    return Err(format!(
                        "a slab of arena {index}'s bin {b} at {e:#x} does not hold together"
                    ));
                }
                free += slab.free;
                tally.slab(
                    info.regions,
                    info.regions - slab.free,
                    info.size,
                    info.slab_bytes / PAGE,
                );
            }
            if slabs.checked_mul(info.regions) != in_use.checked_add(free) {
                return Err(format!(
                    "arena {index}'s bin {b} counts {in_use} regions in use in {slabs} slabs \
                     of {}, its slabs hold {free} free: the heap changed while it was read",
                    info.regions
                ));
            }
            let full = slabs
                .checked_sub(walked.len() as u64)
                .ok_or_else(|| format!("arena {index}'s bin {b} has fewer slabs than it lists"))?;
            tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += full * info.slab_bytes / PAGE;
            tally.occupancy_in_use[OCCUPANCY_BUCKETS - 1] += full * info.regions * info.size;
            slab_pages += slabs * info.slab_bytes / PAGE;
            let t = &mut tally.bins[b];
            t.slabs += slabs;
            t.nonfull_slabs += nonfull;
            t.full_slabs += full;
            t.regions_in_use += in_use;
            t.free_regions += free;
        }
    }
    // Large extents: allocations less deallocations per class; each takes its size in
    // pages, and one more when jemalloc offsets large objects within their first page
    // (`cache_oblivious`, on by default).
    let mut large_pages = 0u64;
    let mut large_extents = 0u64;
    for (j, large) in tally.large.iter_mut().enumerate() {
        let l = ARENA_LSTATS + j * LSTATS_SIZE;
        let count = word(l).wrapping_sub(word(l + LSTATS_NDALLOC));
        let bytes = count
            .checked_mul(large.size)
            .filter(|&b| b < 1 << 48)
            .ok_or_else(|| format!("arena {index}'s large class {j} does not add up"))?;
        large.extents += count;
        large_pages += bytes / PAGE;
        large_extents += count;
        tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += bytes / PAGE;
        tally.occupancy_in_use[OCCUPANCY_BUCKETS - 1] += bytes;
    }
    let active_pages = word(ARENA_NACTIVE);
    let pad = active_pages
        .checked_sub(slab_pages + large_pages)
        .filter(|&p| p == 0 || p == large_extents)
        .ok_or_else(|| {
            format!(
                "arena {index} counts {active_pages} active pages; its slabs take {slab_pages} \
                 and its large extents {large_pages} ({large_extents} extents): the heap \
                 changed while it was read"
            )
        })?;
    tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += pad;
    let ecache = |k: usize, part: usize| PAC_ECACHE_DIRTY + k * ECACHE_SIZE + part;
    let pages_of = |k: usize| {
        word(ecache(k, ECACHE_ESET + ESET_NPAGES))
            .saturating_add(word(ecache(k, ECACHE_GUARDED_ESET + ESET_NPAGES)))
    };
    let (dirty_pages, muzzy_pages, retained_pages) = (pages_of(0), pages_of(1), pages_of(2));
    let (dirty_extents, dirty_listed, dirty_by_pagemap) = extent_list(
        mem,
        extents,
        residency,
        word(ecache(0, ECACHE_ESET + ESET_LRU)),
    )?;
    let guarded_dirty = word(ecache(0, ECACHE_GUARDED_ESET + ESET_NPAGES));
    if dirty_listed.checked_add(guarded_dirty) != Some(dirty_pages) {
        return Err(format!(
            "arena {index}'s dirty extents hold {dirty_listed} pages, it counts {dirty_pages}"
        ));
    }
    tally.occupancy_pages[0] += dirty_pages;
    let mapped_bytes = word(ARENA_PAC_MAPPED);
    let held_pages = active_pages
        .saturating_add(dirty_pages)
        .saturating_add(muzzy_pages);
    if mapped_bytes / PAGE < held_pages {
        return Err(format!("arena {index} maps fewer pages than it holds"));
    }
    let mut base = [0u8; BASE_SIZE];
    mem.read(word(ARENA_BASE), &mut base)
        .map_err(|e| format!("arena {index}'s metadata could not be read ({e})"))?;
    let (metadata_allocated, metadata_resident, metadata_mapped) = (
        le_u64(&base, BASE_ALLOCATED),
        le_u64(&base, BASE_RESIDENT),
        le_u64(&base, BASE_MAPPED),
    );
    let (blocks_bytes, metadata_by_pagemap) =
        base_blocks(mem, residency, le_u64(&base, BASE_BLOCKS))?;
    if metadata_allocated > metadata_mapped
        || metadata_resident > metadata_mapped
        || blocks_bytes != metadata_mapped
    {
        return Err(format!(
            "arena {index}'s metadata counts do not hold together ({metadata_mapped} bytes \
             mapped, its blocks {blocks_bytes})"
        ));
    }
    let thread_caches = thread_caches(mem, tally, word(ARENA_TCACHE_DESCRIPTORS), index)?;
    Ok(JemallocArena {
        index: index as u32,
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
    })
}

/// The blocks of an arena's base (its metadata), each `size, next` at its start, from
/// `first`: their bytes, and those resident by pagemap.
fn base_blocks(
    mem: &mut ProcessMemory,
    residency: &Residency,
    first: u64,
) -> Result<(u64, u64), String> {
    let (mut bytes, mut resident, mut walked) = (0u64, 0u64, 0u64);
    let mut at = first;
    while at != 0 {
        walked += 1;
        if walked > MAX_WALK {
            return Err("the list of jemalloc's metadata blocks does not end".into());
        }
        let mut block = [0u8; 16];
        mem.read(at, &mut block)
            .map_err(|e| format!("a metadata block at {at:#x} could not be read ({e})"))?;
        let size = le_u64(&block, 0);
        bytes += size;
        resident += residency.resident_bytes(at, at.saturating_add(size));
        at = le_u64(&block, 8);
    }
    Ok((bytes, resident))
}

/// The extents of a pairing heap (a bin's non-full slabs) from its root: each node's
/// first child and next sibling (the root's siblings are the heap's auxiliary list).
/// More than `count` nodes (a cycle among them too) is an error.
fn heap_nodes(
    mem: &mut ProcessMemory,
    extents: &mut RecordReader,
    root: u64,
    count: u64,
) -> Result<Vec<(u64, Extent)>, String> {
    let mut nodes = Vec::new();
    let mut stack = vec![root];
    while let Some(at) = stack.pop() {
        if at == 0 {
            continue;
        }
        if nodes.len() as u64 >= count.min(MAX_WALK) {
            return Err(format!(
                "a heap of non-full slabs holds more than the {count} its bin counts"
            ));
        }
        let e: [u8; EDATA_SIZE] = extents.read(mem, at)?;
        stack.push(le_u64(&e, EDATA_HEAP_NEXT));
        stack.push(le_u64(&e, EDATA_HEAP_LCHILD));
        nodes.push((at, Extent::of(&e)));
    }
    Ok(nodes)
}

/// The ring of dirty extents (the dirty cache's LRU) from its first: (extents, pages,
/// bytes resident by pagemap).
fn extent_list(
    mem: &mut ProcessMemory,
    extents: &mut RecordReader,
    residency: &Residency,
    first: u64,
) -> Result<(u64, u64, u64), String> {
    const DIRTY: u64 = 1;
    let (mut count, mut pages, mut resident) = (0u64, 0u64, 0u64);
    let mut at = first;
    while at != 0 {
        if count >= MAX_WALK {
            return Err("a list of free extents does not end".into());
        }
        let e: [u8; EDATA_SIZE] = extents.read(mem, at)?;
        let x = Extent::of(&e);
        // A freed slab keeps its slab bit (jemalloc no longer reads it).
        if x.state != DIRTY || x.bytes == 0 {
            return Err(format!("a free extent at {at:#x} does not hold together"));
        }
        count += 1;
        pages += x.bytes / PAGE;
        resident += residency.resident_bytes(x.addr, x.addr.saturating_add(x.bytes));
        at = le_u64(&e, EDATA_LRU_NEXT);
        if at == first {
            break;
        }
    }
    Ok((count, pages, resident))
}

/// The threads' caches bound to an arena (a ring of their bin arrays' descriptors from
/// `first`): their cached regions added to `tally`'s bins and large classes. Returns the
/// caches counted.
fn thread_caches(
    mem: &mut ProcessMemory,
    tally: &mut Tally,
    first: u64,
    index: usize,
) -> Result<u64, String> {
    let mut count = 0u64;
    let mut at = first;
    let mut bins = vec![0u8; TCACHE_BINS * CACHE_BIN_SIZE];
    while at != 0 {
        if count >= MAX_WALK {
            return Err(format!(
                "arena {index}'s list of thread caches does not end"
            ));
        }
        let mut descriptor = [0u8; 24];
        mem.read(at, &mut descriptor)
            .map_err(|e| format!("a thread cache at {at:#x} could not be read ({e})"))?;
        mem.read(le_u64(&descriptor, DESCRIPTOR_BINS), &mut bins)
            .map_err(|e| format!("a thread cache's bins could not be read ({e})"))?;
        for i in 0..TCACHE_BINS {
            let c = i * CACHE_BIN_SIZE;
            let head = le_u64(&bins, c) as u16;
            let full = le_u32(&bins, c + CACHE_BIN_LOW_BITS_FULL) as u16;
            let empty = le_u32(&bins, c + CACHE_BIN_LOW_BITS_EMPTY) as u16;
            // Its stack of pointers grows down from `empty` to `full`.
            let cached = u64::from(empty.wrapping_sub(head)) / 8;
            let capacity = u64::from(empty.wrapping_sub(full)) / 8;
            if cached > capacity {
                return Err(format!(
                    "a thread cache of arena {index} holds more than its bin {i} can"
                ));
            }
            if i < BINS {
                tally.bins[i].tcache_regions += cached;
            } else {
                tally.large[i - BINS].tcache_extents += cached;
            }
        }
        count += 1;
        at = le_u64(&descriptor, 0);
        if at == first {
            break;
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_jemallocs() {
        let s = size_classes();
        assert_eq!(s.len(), 232);
        assert_eq!(&s[..9], &[8, 16, 32, 48, 64, 80, 96, 112, 128]);
        assert_eq!(s[BINS - 1], 14336);
        assert_eq!(&s[BINS..BINS + 5], &[16384, 20480, 24576, 28672, 32768]);
    }
}
