//! jemalloc's heap (5.3.0 as Debian 12's libjemalloc2 ships it, and the builds Rust's
//! tikv-jemalloc-sys vendors: `RELEASES`), read from outside a running process.
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
//!   threads' caches bound to it (`cache_bin_array_descriptor_ql`; a build without
//!   statistics keeps no such list: its caches are read from its list of threads' data,
//!   `tsd_nominal_tsds`, when its symbol names it).
//!
//! Checked: each bin's regions in use are its slabs' regions less the free ones walked;
//! its non-full slabs walked are as many as it counts; the active pages are the slabs'
//! and large extents' pages; the dirty list adds up to the dirty page count. A census that
//! does not hold together is refused.

use fragscope_trace::heap_census::{
    JemallocArena, JemallocBin, JemallocHeap, JemallocLarge, OCCUPANCY_BUCKETS,
};

use fragscope_trace::ResidentRange;

use crate::allocators::LinkedAllocator;
use crate::library::{MappedLibrary, StaticData};
use crate::memory::{le_u32, le_u64};
use crate::residency::Residency;
use crate::{ProcessMemory, Symbols};

mod caches;
mod emap;
mod locate;
pub use locate::locate;

/// One build whose layout is verified: the version string its image carries, the
/// release named in the census, and where its structures keep the fields read (those
/// that differ between the builds; the others are the constants below).
struct Release {
    version: &'static str,
    name: &'static str,
    /// `arena_t`: its large classes' statistics, their size, `pac_mapped`, the threads'
    /// caches' descriptors, the page allocator shard, its dirty extent cache (`pac_t`'s
    /// first), the shard's index and base, the arena's, and `sizeof(arena_t)` (the bins
    /// follow).
    lstats: usize,
    lstats_size: usize,
    /// Where a large class's bytes are counted (`active_bytes`): None when its extents
    /// are all of the class's size.
    lstats_active_bytes: Option<usize>,
    pac_mapped: usize,
    tcache_descriptors: usize,
    pa_shard: usize,
    ecache_dirty: usize,
    pa_shard_ind: usize,
    pa_shard_base: usize,
    arena_ind: usize,
    arena_base: usize,
    arena_bins: usize,
    /// `base_t`: its size and its allocated, resident and mapped counts.
    base_size: usize,
    base_allocated: usize,
    base_resident: usize,
    base_mapped: usize,
    /// Bins in a thread's cache (`TCACHE_NBINS_MAX`).
    tcache_bins: usize,
    /// `rtree_t`: where its root follows its base and lock (the extent map's).
    emap_root: usize,
    /// A thread's data, built without statistics and with them (5.3.1 keeps more with
    /// them).
    tsd: TsdLayout,
    tsd_with_stats: TsdLayout,
}

/// `tsd_t`: its link on the list of nominal threads' data, its state, its thread cache
/// (whose bins follow a pointer) and the cache's slow part.
struct TsdLayout {
    link: usize,
    state: usize,
    tcache: usize,
    tcache_slow: usize,
}

/// Debian 12's libjemalloc2 (5.3.0, `--enable-prof`; also its static libjemalloc_pic.a).
/// Offsets from that source so configured (`offsetof`, x86-64), as for every build read.
const DEBIAN_5_3_0: Release = Release {
    version: "5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c",
    name: "5.3.0",
    lstats: 24 + 952,
    lstats_size: 48,
    lstats_active_bytes: None,
    pac_mapped: 24 + 88 + 8 + 56,
    tcache_descriptors: 10400,
    pa_shard: 10648,
    ecache_dirty: 10648 + 24 + 56,
    pa_shard_ind: 10648 + 68240,
    pa_shard_base: 10648 + 68272,
    arena_ind: 78928,
    arena_base: 78936,
    arena_bins: 78952,
    base_size: 3912,
    base_allocated: 3880,
    base_resident: 3888,
    base_mapped: 3896,
    tcache_bins: 73,
    emap_root: 120,
    tsd: TSD_5_3_0,
    tsd_with_stats: TSD_5_3_0,
};

/// 5.3.0's thread data, the same with and without statistics (and with `--enable-prof`).
const TSD_5_3_0: TsdLayout = TsdLayout {
    link: 200,
    state: 816,
    tcache: 856,
    tcache_slow: 256,
};

/// The builds read (their thread data's layouts taken the same way, with and without
/// `--enable-stats`): Debian's 5.3.0; the 5.3.0-1-ge13ca993 that tikv-jemalloc-sys 0.6
/// vendors (5.3.0's include/ and src/ unchanged, only its configure and install rules
/// patched; configured as its build script configures it, with `--enable-stats` or
/// `--disable-stats`, without `--enable-prof`, every offset above is the same); and the
/// 5.3.1 snapshot that tikv-jemalloc-sys 0.7 vendors (with or without `--enable-stats`,
/// which leaves the layout alone), built as its build script builds it.
const RELEASES: [Release; 3] = [
    DEBIAN_5_3_0,
    Release {
        version: "5.3.0-1-ge13ca993e8ccb9ba9847cc330696e02839f328f7",
        name: "5.3.0-1-ge13ca993 (tikv-jemalloc-sys 0.6)",
        ..DEBIAN_5_3_0
    },
    // Rounds large requests to whole pages (`opt_disable_large_size_classes`), so a
    // large class's bytes are its `active_bytes`, not its count times its size.
    Release {
        version: "5.3.1-0-g81034ce1f1373e37dc865038e1bc8eeecf559ce8",
        name: "5.3.1-0-g81034ce1 (tikv-jemalloc-sys 0.7)",
        lstats: 24 + 968,
        lstats_size: 56,
        lstats_active_bytes: Some(16),
        pac_mapped: 192,
        tcache_descriptors: 11984,
        pa_shard: 12288,
        ecache_dirty: 12352,
        pa_shard_ind: 80592,
        pa_shard_base: 80624,
        arena_ind: 80640,
        arena_base: 80648,
        arena_bins: 80704,
        base_size: 3944,
        base_allocated: 3896,
        base_resident: 3920,
        base_mapped: 3928,
        tcache_bins: 41,
        emap_root: 120,
        tsd: TsdLayout {
            link: 240,
            state: 904,
            tcache: 944,
            tcache_slow: 280,
        },
        tsd_with_stats: TsdLayout {
            link: 256,
            state: 920,
            tcache: 960,
            tcache_slow: 296,
        },
    },
];

/// What a census of a build without statistics is refused with when its extent map was
/// not found: it never will be read.
pub const NO_STATISTICS: &str = "was built without statistics";

/// What the release read is named with when it keeps no statistics: its slabs and large
/// extents come from its extent map, and its threads' caches are on no list of its arenas
/// (they are read from its threads' data when its symbol table names their list).
pub const UNCOUNTED: &str = "built without statistics (threads' caches not seen)";
pub const UNCOUNTED_CACHES_SEEN: &str = "built without statistics";

const PAGE: u64 = 4096;
/// Small size classes (`SC_NBINS`), large ones (`SC_NSIZES - SC_NBINS`), arenas
/// (`MALLOCX_ARENA_LIMIT`).
const BINS: usize = 36;
const LARGE_CLASSES: usize = 196;
const MAX_ARENAS: usize = 4095;

// bin_info_t.
const BIN_INFO_SIZE: usize = 40;
const BIN_INFO_SLAB_SIZE: usize = 8;
const BIN_INFO_NREGS: usize = 16;
const BIN_INFO_SHARDS: usize = 20;

// arena_stats_large_t, pa_shard_t, ecache_t, eset_t.
const LSTATS_NDALLOC: usize = 8;
const PA_SHARD_NACTIVE: usize = 8;
const ECACHE_SIZE: usize = 19440;
const ECACHE_ESET: usize = 112;
const ECACHE_GUARDED_ESET: usize = 9768;
const ESET_LRU: usize = 9632;
const ESET_NPAGES: usize = 9640;

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
const BASE_BLOCKS: usize = 160;

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
    /// The image that carries it: its shared library, or the program (or a library) it
    /// is linked into.
    pub library: String,
    pub release: &'static str,
    build: &'static Release,
    bins: Vec<BinInfo>,
    /// Each bin's offset in `arena_t` (`arena_bin_offsets`).
    bin_offsets: Vec<u64>,
    /// `arenas[]`: its address.
    arenas: u64,
    /// The extent map's root (`arena_emap_global`), or why it was not found.
    emap: Result<u64, String>,
    /// The page jemalloc adds to each large extent (`sz_large_pad`), when its symbol
    /// names it.
    large_pad: Option<u64>,
    /// The list of threads' data in a nominal state (`tsd_nominal_tsds`, every thread with
    /// a cache), when its symbol names it: a build without statistics keeps its threads'
    /// caches on no other list.
    tsds: Option<u64>,
}

/// An extent descriptor's fields (`edata_t`'s `e_bits`).
struct Extent {
    arena: u64,
    slab: bool,
    /// Served by the huge-page allocator (`pai`).
    pai: bool,
    state: u64,
    /// Its size class (a slab's bin).
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
            pai: field(14, 1) == 1,
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
    /// Bytes of each large class's extents.
    large_bytes: Vec<u64>,
    occupancy_pages: Vec<u64>,
    occupancy_in_use: Vec<u64>,
    /// An arena was read without jemalloc's statistics (from its extent map alone).
    uncounted: bool,
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
        large_bytes: vec![0; LARGE_CLASSES],
        occupancy_pages: vec![0; OCCUPANCY_BUCKETS],
        occupancy_in_use: vec![0; OCCUPANCY_BUCKETS],
        uncounted: false,
    };
    let bins_end =
        layout.bin_offsets[BINS - 1] as usize + layout.bins[BINS - 1].shards as usize * BIN_SIZE;
    let mut listed = Vec::new();
    for i in 0..MAX_ARENAS {
        let at = le_u64(&table, 8 * i);
        if at != 0 {
            let mut a = vec![0u8; bins_end];
            mem.read(at, &mut a)
                .map_err(|e| format!("arena {i} could not be read ({e})"))?;
            listed.push((i, a));
        }
    }
    let mut extents = emap::Descriptors::new(residency);
    // Every extent, from jemalloc's extent map: what a build without statistics is read
    // by. A build with them is read by them (the map's walk made a census of 750 MiB
    // hold the program 40% longer), and checked against the map on request
    // (`FRAGSCOPE_JEMALLOC_MAP=always`, for the test that compares them).
    let uncounted = listed.iter().any(|(_, a)| !keeps_counts(a, layout));
    let always = std::env::var_os("FRAGSCOPE_JEMALLOC_MAP").is_some_and(|v| v == "always");
    let map = match &layout.emap {
        _ if !uncounted && !always => Err("not needed"),
        Ok(root) => Ok(emap::read(mem, &mut extents, residency, *root)?),
        Err(why) => Err(why.as_str()),
    };
    let none = emap::ArenaExtents::default();
    let mut arenas = Vec::new();
    for (i, a) in &listed {
        let reading = ArenaReading {
            mem: &mut *mem,
            extents: &mut extents,
            residency,
            layout,
            map: map.as_ref().map_err(|why| *why).map(|m| Mapped {
                arena: m.arenas.get(&(*i as u64)).unwrap_or(&none),
                slabs: &m.slabs,
            }),
        };
        arenas.push(arena(reading, &mut tally, *i, a)?);
    }
    if arenas.is_empty() {
        return Err("jemalloc has no arena".into());
    }
    if let Ok(m) = &map {
        if let Some(i) = m
            .arenas
            .keys()
            .find(|&&i| le_u64(&table, 8 * i as usize) == 0)
        {
            return Err(format!(
                "jemalloc's extent map names arena {i}, which jemalloc does not list"
            ));
        }
    }
    let caches_seen = caches::from_threads_data(
        mem,
        &mut tally,
        layout,
        (&table, &listed),
        &mut arenas,
        always,
    )?;
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
    // A build that rounds large requests to whole pages: each class's extents at their
    // mean size, so that their sum is the bytes jemalloc counts.
    for (l, &bytes) in tally.large.iter_mut().zip(&tally.large_bytes) {
        if let Some(mean) = (bytes + l.extents / 2).checked_div(l.extents) {
            l.size = mean;
        }
    }
    let mut heap = JemallocHeap {
        release: match (tally.uncounted, caches_seen) {
            (false, _) => layout.release.into(),
            (true, false) => format!("{}, {UNCOUNTED}", layout.release),
            (true, true) => format!("{}, {UNCOUNTED_CACHES_SEEN}", layout.release),
        },
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
struct ArenaReading<'a, 'r> {
    mem: &'a mut ProcessMemory,
    extents: &'a mut emap::Descriptors<'r>,
    residency: &'a Residency<'a>,
    layout: &'a JemallocLayout,
    /// Its extents in jemalloc's extent map, or why the map was not found.
    map: Result<Mapped<'a>, &'a str>,
}

/// An arena's extents in the extent map, and every slab the map names.
struct Mapped<'a> {
    arena: &'a emap::ArenaExtents,
    slabs: &'a std::collections::HashSet<u64>,
}

/// One arena: its bins, large classes, page caches and threads' caches, added to
/// `tally`; its pages returned.
fn arena(
    reading: ArenaReading<'_, '_>,
    tally: &mut Tally,
    index: usize,
    a: &[u8],
) -> Result<JemallocArena, String> {
    let ArenaReading {
        mem,
        extents,
        residency,
        layout,
        map,
    } = reading;
    let build = layout.build;
    let names_itself = |off: usize| le_u32(a, off) as usize == index;
    if !names_itself(build.arena_ind)
        || !names_itself(build.pa_shard_ind)
        || le_u64(a, build.arena_base) != le_u64(a, build.pa_shard_base)
    {
        return Err(format!("arena {index} does not carry its index"));
    }
    let word = |off: usize| le_u64(a, off);
    let active_pages = word(build.pa_shard + PA_SHARD_NACTIVE);
    // A build configured with --disable-stats (tikv-jemallocator without its `stats`
    // feature, its default) keeps no count of its slabs, large extents, metadata or
    // threads' caches: its slabs and large extents are then those of jemalloc's extent
    // map, and it is refused when the map was not found.
    let stats = keeps_counts(a, layout);
    tally.uncounted |= !stats;
    let map = match map {
        Ok(m) => Some(m),
        Err(_) if stats => None,
        Err(why) => {
            return Err(format!(
                "{} {NO_STATISTICS} (--disable-stats; tikv-jemallocator without its \"stats\" \
                 feature), so the census reads jemalloc's extent map instead, which was not \
                 found: {why}",
                layout.library.rsplit('/').next().unwrap_or(&layout.library)
            ))
        }
    };
    let slab_pages = bins(mem, extents, layout, a, map.as_ref(), stats, tally, index)?;
    let (large_pages, large_extents) = large_extents(a, layout, map.as_ref(), stats, tally, index)?;
    let pad = active_pages
        .checked_sub(slab_pages + large_pages)
        .filter(|&p| p == 0 || p == large_extents)
        .filter(|_| {
            // The map's extents, their offset pages included, are every active page.
            map.as_ref().is_none_or(|m| {
                let pages: u64 = m.arena.large.iter().map(|l| l.1 / PAGE).sum();
                slab_pages + pages == active_pages
            })
        })
        .ok_or_else(|| {
            format!(
                "arena {index} counts {active_pages} active pages; its slabs take {slab_pages} \
                 and its large extents {large_pages} ({large_extents} extents): the heap \
                 changed while it was read"
            )
        })?;
    tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += pad;
    let ecache = |k: usize, part: usize| build.ecache_dirty + k * ECACHE_SIZE + part;
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
    if let Some(m) = &map {
        let listed = [
            m.arena.dirty_pages,
            m.arena.muzzy_pages,
            m.arena.retained_pages,
        ];
        if listed != [dirty_pages, muzzy_pages, retained_pages] {
            return Err(format!(
                "arena {index} counts {dirty_pages} dirty, {muzzy_pages} muzzy and \
                 {retained_pages} retained pages; jemalloc's extent map names {}, {} and {}: \
                 the heap changed while it was read",
                listed[0], listed[1], listed[2]
            ));
        }
    }
    tally.occupancy_pages[0] += dirty_pages;
    let held_pages = active_pages
        .saturating_add(dirty_pages)
        .saturating_add(muzzy_pages);
    // Without statistics jemalloc counts no mapped bytes: those of the pages it holds.
    let mapped_bytes = if stats {
        word(build.pac_mapped)
    } else {
        held_pages * PAGE
    };
    if mapped_bytes / PAGE < held_pages {
        return Err(format!("arena {index} maps fewer pages than it holds"));
    }
    let (metadata_allocated, metadata_resident, metadata_mapped, metadata_by_pagemap) =
        metadata(mem, residency, build, stats, word(build.arena_base), index)?;
    let thread_caches =
        caches::thread_caches(mem, tally, word(build.tcache_descriptors), index, build)?;
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

/// An arena's bins (`a`: the arena's bytes): each shard's slabs, the current one and the
/// non-full ones walked, checked against the bin's counts, or taken from the extent map
/// (`map`) when jemalloc keeps none (`stats`), and added to `tally`; the pages its slabs
/// take.
#[allow(clippy::too_many_arguments)]
fn bins(
    mem: &mut ProcessMemory,
    extents: &mut emap::Descriptors<'_>,
    layout: &JemallocLayout,
    a: &[u8],
    map: Option<&Mapped<'_>>,
    stats: bool,
    tally: &mut Tally,
    index: usize,
) -> Result<u64, String> {
    let word = |off: usize| le_u64(a, off);
    let mut slab_pages = 0u64;
    for (b, info) in layout.bins.iter().enumerate() {
        for shard in 0..info.shards {
            let bin = layout.bin_offsets[b] as usize + shard as usize * BIN_SIZE;
            let current = word(bin + BIN_SLABCUR);
            // The bin's slabs in the extent map: its counts when jemalloc keeps none.
            let listed = map.map(|m| {
                m.arena
                    .slabs
                    .get(&(b as u64, shard))
                    .map_or(&[][..], Vec::as_slice)
            });
            let (in_use, slabs, nonfull) = match listed {
                Some(l) if !stats => {
                    let free: u64 = l.iter().map(|s| s.free).sum();
                    let nonfull = l.iter().filter(|s| s.free > 0 && s.at != current).count();
                    let slabs = l.len() as u64;
                    let in_use = (slabs * info.regions).checked_sub(free).ok_or_else(|| {
                        format!(
                            "a slab of arena {index}'s bin {b} holds more free regions than it can"
                        )
                    })?;
                    (in_use, slabs, nonfull as u64)
                }
                _ => (
                    word(bin + BIN_CURREGS),
                    word(bin + BIN_CURSLABS),
                    word(bin + BIN_NONFULL),
                ),
            };
            let mut walked = Vec::new();
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
                    && (is_current || slab.free > 0)
                    && map.is_none_or(|m| m.slabs.contains(&e));
                if !holds {
                    return Err(format!(
                        "a slab of arena {index}'s bin {b} at {e:#x} does not hold together"
                    ));
                }
                free += slab.free;
                if listed.is_none() {
                    tally.slab(
                        info.regions,
                        info.regions - slab.free,
                        info.size,
                        info.slab_bytes / PAGE,
                    );
                }
            }
            if let Some(l) = listed {
                // Every slab of the bin, full ones included; those with free regions are
                // the ones walked.
                for s in l {
                    if s.free >= info.regions || s.bytes != info.slab_bytes {
                        return Err(format!(
                            "a slab of arena {index}'s bin {b} at {:#x} does not hold together",
                            s.at
                        ));
                    }
                    tally.slab(
                        info.regions,
                        info.regions - s.free,
                        info.size,
                        info.slab_bytes / PAGE,
                    );
                }
                let listed_free: u64 = l.iter().map(|s| s.free).sum();
                if l.len() as u64 != slabs || listed_free != free {
                    return Err(format!(
                        "arena {index}'s bin {b} has {slabs} slabs, {free} regions free in \
                         those it lists; jemalloc's extent map names {} slabs with \
                         {listed_free} free: the heap changed while it was read",
                        l.len()
                    ));
                }
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
            if listed.is_none() {
                tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += full * info.slab_bytes / PAGE;
                tally.occupancy_in_use[OCCUPANCY_BUCKETS - 1] += full * info.regions * info.size;
            }
            slab_pages += slabs * info.slab_bytes / PAGE;
            let t = &mut tally.bins[b];
            t.slabs += slabs;
            t.nonfull_slabs += nonfull;
            t.full_slabs += full;
            t.regions_in_use += in_use;
            t.free_regions += free;
        }
    }
    Ok(slab_pages)
}

/// An arena's large extents by class, added to `tally`: their pages, and how many.
fn large_extents(
    a: &[u8],
    layout: &JemallocLayout,
    map: Option<&Mapped<'_>>,
    stats: bool,
    tally: &mut Tally,
    index: usize,
) -> Result<(u64, u64), String> {
    let (build, word) = (layout.build, |off: usize| le_u64(a, off));
    // Large extents: allocations less deallocations per class; each takes its size in
    // pages, and one more when jemalloc offsets large objects within their first page
    // (`cache_oblivious`, on by default). Or, from the extent map, each extent.
    let mapped_large = match map {
        Some(m) => Some(large_from_map(
            &m.arena.large,
            build,
            layout.large_pad,
            index,
        )?),
        None => None,
    };
    let mut large_pages = 0u64;
    let mut large_extents = 0u64;
    for j in 0..tally.large.len() {
        let size = tally.large[j].size;
        let l = build.lstats + j * build.lstats_size;
        let count = word(l).wrapping_sub(word(l + LSTATS_NDALLOC));
        let counted_bytes = || {
            match build.lstats_active_bytes {
                // Whole pages each, up to the class's size.
                Some(field) => Some(word(l + field)).filter(|&b| {
                    b.is_multiple_of(PAGE)
                        && count.checked_mul(size).is_some_and(|most| b <= most)
                        && b >= count.saturating_mul(size / 2)
                }),
                None => count.checked_mul(size),
            }
            .filter(|&b| b < 1 << 48)
            .ok_or_else(|| format!("arena {index}'s large class {j} does not add up"))
        };
        let (count, bytes) = match &mapped_large {
            Some(m) if !stats => m[j],
            Some(m) => {
                let bytes = counted_bytes()?;
                if m[j] != (count, bytes) {
                    return Err(format!(
                        "arena {index}'s large class {j} counts {count} extents of {bytes} \
                         bytes; jemalloc's extent map names {} of {}: the heap changed while \
                         it was read",
                        m[j].0, m[j].1
                    ));
                }
                (count, bytes)
            }
            None => (count, counted_bytes()?),
        };
        tally.large[j].extents += count;
        tally.large_bytes[j] += bytes;
        large_pages += bytes / PAGE;
        large_extents += count;
        tally.occupancy_pages[OCCUPANCY_BUCKETS - 1] += bytes / PAGE;
        tally.occupancy_in_use[OCCUPANCY_BUCKETS - 1] += bytes;
    }
    Ok((large_pages, large_extents))
}

/// An arena's metadata (its base at `base_at`): allocated, resident and mapped bytes, and
/// those pagemap finds resident.
fn metadata(
    mem: &mut ProcessMemory,
    residency: &Residency<'_>,
    build: &Release,
    stats: bool,
    base_at: u64,
    index: usize,
) -> Result<(u64, u64, u64, u64), String> {
    let mut base = vec![0u8; build.base_size];
    mem.read(base_at, &mut base)
        .map_err(|e| format!("arena {index}'s metadata could not be read ({e})"))?;
    let (blocks_bytes, metadata_by_pagemap) =
        base_blocks(mem, residency, le_u64(&base, BASE_BLOCKS))?;
    // Without statistics the base counts nothing: its blocks are what it maps, pagemap
    // what is resident, and what it handed out is not known.
    let (metadata_allocated, metadata_resident, metadata_mapped) = if stats {
        (
            le_u64(&base, build.base_allocated),
            le_u64(&base, build.base_resident),
            le_u64(&base, build.base_mapped),
        )
    } else {
        (0, metadata_by_pagemap, blocks_bytes)
    };
    if metadata_allocated > metadata_mapped
        || metadata_resident > metadata_mapped
        || blocks_bytes != metadata_mapped
    {
        return Err(format!(
            "arena {index}'s metadata counts do not hold together ({metadata_mapped} bytes \
             mapped, its blocks {blocks_bytes})"
        ));
    }
    Ok((
        metadata_allocated,
        metadata_resident,
        metadata_mapped,
        metadata_by_pagemap,
    ))
}

/// Whether the arena `a` (its bytes, bins included) keeps jemalloc's statistics: pages in
/// use and not one slab or large extent counted is a build configured without them.
fn keeps_counts(a: &[u8], layout: &JemallocLayout) -> bool {
    let (build, word) = (layout.build, |off: usize| le_u64(a, off));
    let counted = layout.bins.iter().enumerate().any(|(b, info)| {
        (0..info.shards).any(|shard| {
            let bin = layout.bin_offsets[b] as usize + shard as usize * BIN_SIZE;
            word(bin + BIN_CURSLABS) != 0
        })
    }) || (0..LARGE_CLASSES).any(|j| word(build.lstats + j * build.lstats_size) != 0);
    counted || word(build.pa_shard + PA_SHARD_NACTIVE) == 0
}

/// Each large class's extents and usable bytes, from the extent map's large extents
/// (size class, bytes): a class's size each, or, in a build that rounds large requests to
/// whole pages, the extent's bytes less the page jemalloc adds to each when it offsets
/// large objects in their first page (`sz_large_pad`: its symbol's value, else the one
/// that puts every extent in its class, the page first, `cache_oblivious` being the
/// default).
fn large_from_map(
    large: &[(u64, u64)],
    build: &Release,
    known_pad: Option<u64>,
    index: usize,
) -> Result<Vec<(u64, u64)>, String> {
    let sizes = size_classes();
    let usable = |class: u64, bytes: u64, pad: u64| {
        let c = usize::try_from(class)
            .ok()
            .filter(|c| (BINS..BINS + LARGE_CLASSES).contains(c))?;
        let u = bytes.checked_sub(pad)?;
        let fits = match build.lstats_active_bytes {
            Some(_) => u > sizes[c - 1] && u <= sizes[c] && u.is_multiple_of(PAGE),
            None => u == sizes[c],
        };
        fits.then_some((c - BINS, u))
    };
    let pads = known_pad.map_or(vec![PAGE, 0], |p| vec![p]);
    let fitting = |&p: &u64| large.iter().all(|&(c, b)| usable(c, b, p).is_some());
    let pad = pads.into_iter().find(fitting).ok_or_else(|| {
        format!("arena {index}'s large extents are not the sizes of their classes")
    })?;
    let mut classes = vec![(0u64, 0u64); LARGE_CLASSES];
    for (j, u) in large.iter().filter_map(|&(c, b)| usable(c, b, pad)) {
        classes[j].0 += 1;
        classes[j].1 += u;
    }
    Ok(classes)
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
    extents: &mut emap::Descriptors,
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
        let e = extents.read(mem, at)?;
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
    extents: &mut emap::Descriptors,
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
        let e = extents.read(mem, at)?;
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
