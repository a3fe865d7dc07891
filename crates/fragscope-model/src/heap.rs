//! The heap at one page-residency snapshot: which resident pages hold live bytes, how
//! full they are, and who (size class, allocation site) keeps the sparse ones resident.
//!
//! Inputs are the live blocks after the calls merged up to the snapshot's tick and the
//! residency bitmaps of the mappings that may hold heap objects. An object that straddles
//! pages counts towards each page by its bytes in it.

use fragscope_trace::hash::{FastMap, FastSet, PageMap};
use fragscope_trace::merge::LiveTable;
use fragscope_trace::records::{Pagemap, ResidentRange};
use fragscope_trace::Mapping;

use crate::sharing::{HeapOwners, Owner, Owners};

/// Occupancy buckets: one for resident heap pages without a live byte, then ten of 10%.
pub const OCCUPANCY_BUCKETS: usize = 11;

/// Byte counts inside the heap mappings at one snapshot (the parts of the decomposition
/// that come from the trace and pagemap; /proc's totals are added later).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeapParts {
    /// Requested bytes of live blocks, on resident pages.
    pub live: u64,
    /// Usable minus requested bytes of live blocks, on resident pages.
    pub rounding: u64,
    /// The allocator's own bytes on resident heap pages in use: its header before each
    /// block (glibc's chunk size field) and, in a census, its structures inside the heap.
    /// Not free: no block can be put there.
    pub allocator_overhead: u64,
    /// Free bytes in resident pages that hold at least one live byte.
    pub free_in_used_pages: u64,
    /// Resident pages of heap mappings with no live byte.
    pub free_resident_pages: u64,
    /// Live bytes on pages that are not resident (allocated, never touched or swapped).
    pub live_not_resident: u64,
    pub used_pages: u64,
    pub empty_pages: u64,
    /// Bytes of resident pages in mappings that held a live block (the heap as the OS sees it).
    pub heap_resident: u64,
    /// Resident bytes of mappings that may hold heap objects but never held one
    /// (thread stacks, allocator metadata): these belong to "other anonymous".
    pub never_held_resident: u64,
    /// [empty, 0-10%, ..., 90-100%]: pages and live bytes.
    pub occupancy_pages: [u64; OCCUPANCY_BUCKETS],
    pub occupancy_live: [u64; OCCUPANCY_BUCKETS],
    /// The parts above (`live` to `free_resident_pages`) by the owner of their pages.
    pub owners: HeapOwners,
}

/// One size class (the allocator's usable size) at a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassAtSnapshot {
    pub usable: u64,
    pub objects: u64,
    pub live_bytes: u64,
    pub usable_bytes: u64,
    /// Resident pages holding at least one live object of the class.
    pub pages: u64,
    /// Mean live occupancy (0..1) of those pages.
    pub mean_occupancy: f64,
    /// Free bytes in resident pages the class dominates or last dominated.
    pub retained_free: u64,
}

/// One allocation site at a snapshot (weights extrapolate sampled stacks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SiteAtSnapshot {
    pub stack: u32,
    pub live_objects: f64,
    pub live_bytes: f64,
    /// Objects on pages under the sparse threshold, the share of those pages they hold
    /// (a page shared by two sites counts half to each, by live bytes), and the free
    /// bytes of those shares.
    pub pinning_objects: f64,
    pub pinned_pages: f64,
    pub pinned_waste: f64,
}

impl SiteAtSnapshot {
    /// Adds a block standing for `w` blocks; `pin`: (page shares, waste, pins any page).
    fn add(&mut self, w: f64, size: u64, pin: (f64, f64, bool)) {
        self.live_objects += w;
        self.live_bytes += w * size as f64;
        if pin.2 {
            self.pinning_objects += w;
            self.pinned_pages += w * pin.0;
            self.pinned_waste += w * pin.1;
        }
    }

    /// Adds what blocks standing for `w` blocks each pin: `objects` of them pin a page
    /// for the first time, and their page shares and waste (summed over the blocks).
    fn add_pinning(&mut self, w: f64, objects: f64, pages: f64, waste: f64) {
        self.pinning_objects += w * objects;
        self.pinned_pages += w * pages;
        self.pinned_waste += w * waste;
    }
}

#[derive(Debug, Clone, Default)]
pub struct HeapSnapshot {
    pub parts: HeapParts,
    pub classes: Vec<ClassAtSnapshot>,
    pub sites: Vec<SiteAtSnapshot>,
}

/// How sampled stacks stand for all allocations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SiteWeighting {
    /// Every allocation has its stack: weight 1.
    Every,
    /// Poisson sampling by bytes with this mean: a sampled block of size s stands for
    /// 1 / (1 - exp(-s / mean)) blocks, as in tcmalloc's and jemalloc's heap profiles.
    Sampled { mean_bytes: f64 },
    /// No stacks were recorded.
    None,
}

impl SiteWeighting {
    pub fn weight(self, size: u64) -> f64 {
        match self {
            Self::Every => 1.0,
            Self::Sampled { mean_bytes } => {
                let p = 1.0 - (-(size.max(1) as f64) / mean_bytes).exp();
                if p > 0.0 {
                    1.0 / p
                } else {
                    0.0
                }
            }
            Self::None => 0.0,
        }
    }
}

/// Bytes an allocator keeps just before each block it hands out, which a recording
/// does not see allocated but which are not free either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BlockHeaders {
    /// No header before a block: jemalloc, tcmalloc and mimalloc keep their metadata
    /// apart (in "other anonymous" or in pages of their own), or the allocator is not
    /// known.
    #[default]
    None,
    /// glibc: a chunk's size field, the 8 bytes before the block (the 8 before those are
    /// the previous chunk's when it is in use); 16 bytes for a chunk mmapped on its own.
    Glibc,
}

impl BlockHeaders {
    /// The headers of the allocator named by its statistics (`stats`, when it answered),
    /// else by the libraries the process maps: glibc's malloc unless jemalloc, tcmalloc or
    /// mimalloc is loaded.
    pub fn of_process(stats: Option<&str>, code_maps: &[Mapping]) -> Self {
        let name = stats.filter(|n| *n != "unknown").unwrap_or_else(|| {
            let loaded = |prefix: &str| {
                code_maps
                    .iter()
                    .any(|m| m.path.rsplit('/').next().unwrap_or("").starts_with(prefix))
            };
            if ["libjemalloc", "libtcmalloc", "libmimalloc"]
                .iter()
                .any(|p| loaded(p))
            {
                "other"
            } else if loaded("libc.so.6") {
                "glibc"
            } else {
                "unknown"
            }
        });
        if name == "glibc" {
            Self::Glibc
        } else {
            Self::None
        }
    }

    /// Header bytes just before a block of `usable` bytes (malloc_usable_size). glibc's
    /// usable size says which kind of chunk holds it: one in an arena lends the program
    /// all but its 8-byte size field (a multiple of 16, less 8), one mmapped on its own
    /// all but its 16-byte header (whole pages less 16).
    pub fn before(self, usable: u64) -> u64 {
        match self {
            Self::None => 0,
            Self::Glibc if usable.is_multiple_of(16) => 16,
            Self::Glibc => 8,
        }
    }
}

/// What a snapshot remembers for the next one.
#[derive(Default)]
pub struct HeapHistory {
    /// Mappings (by start address) that ever held a live block.
    held_ranges: FastSet<u64>,
    /// Page -> the size class that last dominated it: free pages are charged to it.
    last_class: PageMap<u64>,
}

impl HeapHistory {
    /// Whether the mapping starting at `start` ever held a live block (its resident pages
    /// are then the heap's).
    pub fn held(&self, start: u64) -> bool {
        self.held_ranges.contains(&start)
    }
}

impl HeapParts {
    /// Leaves out `bytes` of resident pages that the evaluation counted as empty heap
    /// pages but another allocator holds (pymalloc's arenas can share a mapping with
    /// malloc's).
    pub fn leave_out_empty_pages(&mut self, bytes: u64, owners: &Owners, page_size: u64) {
        self.owners.free_resident_pages.subtract(owners);
        let bytes = bytes.min(self.free_resident_pages);
        let pages = bytes / page_size.max(1);
        self.heap_resident -= bytes;
        self.free_resident_pages -= bytes;
        self.empty_pages = self.empty_pages.saturating_sub(pages);
        self.occupancy_pages[0] = self.occupancy_pages[0].saturating_sub(pages);
    }
}

#[derive(Default, Clone, Copy)]
pub(crate) struct PageAcc {
    pub(crate) live: u32,
    pub(crate) usable: u32,
    /// Block headers on the page.
    pub(crate) headers: u32,
    /// The class with the largest single contribution (a cheap "dominant class"); of
    /// equal contributions the largest class, so that it does not depend on the order
    /// the blocks are seen in. A header alone contributes 0 bytes.
    pub(crate) class: u64,
    pub(crate) class_bytes: u32,
}

impl PageAcc {
    /// A block of class `class` with `part` usable bytes on the page (0: only its header).
    #[inline]
    pub(crate) fn dominate(&mut self, part: u32, class: u64) {
        if (part, class) > (self.class_bytes, self.class) {
            self.class_bytes = part;
            self.class = class;
        }
    }
}

/// Sorted residency ranges with a one-entry cache (objects arrive in hash order, but
/// large runs fall in the same range).
pub(crate) struct Residency<'a> {
    ranges: Vec<&'a ResidentRange>,
    pub(crate) shift: u32,
    last: usize,
    /// A forked process's residency as it started: its private pages resident then were
    /// copied since (`sharing::Owner::Copied`).
    fork: Option<Box<Residency<'a>>>,
}

impl<'a> Residency<'a> {
    pub(crate) fn new(pm: &'a Pagemap) -> Self {
        let mut ranges: Vec<&ResidentRange> = pm.ranges.iter().collect();
        ranges.sort_by_key(|r| r.start);
        Self {
            ranges,
            shift: pm.page_size.max(1).trailing_zeros(),
            last: 0,
            fork: None,
        }
    }

    /// Resident bytes of the pages that [lo, hi) touches.
    pub(crate) fn resident_bytes(&mut self, lo: u64, hi: u64) -> u64 {
        let page = 1u64 << self.shift;
        (lo >> self.shift..hi.div_ceil(page))
            .filter(|&p| self.is_resident(p).is_some())
            .count() as u64
            * page
    }

    /// With the residency the process had as it started from its parent's memory.
    pub(crate) fn with_fork(mut self, fork: Option<&'a Pagemap>) -> Self {
        self.fork = fork.map(|f| Box::new(Residency::new(f)));
        self
    }

    /// Whom resident page `page` of range `range` belongs to (see [`Owner`]).
    pub(crate) fn owner(&mut self, range: usize, page: u64) -> Owner {
        let r = self.ranges[range];
        if r.is_shared(page - (r.start >> self.shift)) == Some(true) {
            Owner::Shared
        } else if self
            .fork
            .as_mut()
            .is_some_and(|f| f.is_resident(page).is_some())
        {
            Owner::Copied
        } else {
            Owner::Own
        }
    }

    /// The owner of `page` when it is resident.
    pub(crate) fn resident_owner(&mut self, page: u64) -> Option<Owner> {
        let i = self.is_resident(page)?;
        Some(self.owner(i, page))
    }

    /// The range holding `page` (a page number) and the page's index in it.
    fn find(&mut self, page: u64) -> Option<(usize, u64)> {
        let addr = page << self.shift;
        let hit =
            |r: &ResidentRange, shift: u32| addr >= r.start && page < (r.start >> shift) + r.pages;
        if let Some(r) = self.ranges.get(self.last) {
            if hit(r, self.shift) {
                return Some((self.last, page - (r.start >> self.shift)));
            }
        }
        let i = self
            .ranges
            .partition_point(|r| r.start <= addr)
            .checked_sub(1)?;
        let r = self.ranges[i];
        if !hit(r, self.shift) {
            return None;
        }
        self.last = i;
        Some((i, page - (r.start >> self.shift)))
    }

    /// The index of the range holding `page` (a page number), when the page is resident.
    pub(crate) fn is_resident(&mut self, page: u64) -> Option<usize> {
        let (i, idx) = self.find(page)?;
        self.ranges[i].is_resident(idx).then_some(i)
    }

    /// The start address of range `i`.
    pub(crate) fn range_start(&self, i: usize) -> u64 {
        self.ranges[i].start
    }
}

/// Pages a block this large spans beyond which interior pages are counted arithmetically
/// (they hold only this block, so they are full) instead of one by one.
pub(crate) const INTERIOR_PAGES: u64 = 4;

fn bucket_of(live: u64, page_size: u64) -> usize {
    if live == 0 {
        0
    } else {
        1 + ((live * 10 / page_size) as usize).min(9)
    }
}

/// Evaluates the heap at a snapshot from every live block. `sparse_pct`: pages under this
/// live occupancy count as pinned by the objects in them; `headers`: what the allocator
/// keeps before each block. [`crate::heap_pages::HeapPages`] gives the same figures from
/// the blocks by page, kept as calls are applied.
pub fn evaluate(
    live: &LiveTable,
    pm: &Pagemap,
    fork: Option<&Pagemap>,
    history: &mut HeapHistory,
    weighting: SiteWeighting,
    sparse_pct: u32,
    headers: BlockHeaders,
) -> HeapSnapshot {
    let mut res = Residency::new(pm).with_fork(fork);
    let shift = res.shift;
    let mut tally = PageTally::new(pm);
    let ps = tally.ps;

    // Pass 1: live and usable bytes per resident page.
    for (addr, b) in live {
        let usable = b.usable().max(1);
        let live_end = addr + b.size;
        let end = addr + usable;
        let first = addr >> shift;
        let last = (end - 1) >> shift;
        // Aligned to 16 bytes, a header never straddles two pages: it is on the block's
        // first page, counted with it below, or (a block at a page's start) on the page
        // before.
        let header = headers.before(usable).min(addr);
        let header_page = (addr - header) >> shift;
        if header > 0 && header_page != first {
            if let Some(ri) = res.is_resident(header_page) {
                tally.held_now.insert(ri);
                let acc = tally.pages.entry(header_page).or_default();
                acc.headers += header as u32;
                acc.dominate(0, usable);
            }
        }
        let header_on_first = if header_page == first { header } else { 0 };
        let mut page = first;
        while page <= last {
            if last - first > 2 * INTERIOR_PAGES && page > first && page < last {
                tally.interior(&mut res, (page, last - 1), live_end, usable);
                page = last;
                continue;
            }
            let p_start = page << shift;
            let p_end = p_start + ps;
            let live_part = live_end.clamp(p_start, p_end) - addr.clamp(p_start, p_end);
            let usable_part = end.clamp(p_start, p_end) - addr.clamp(p_start, p_end);
            match res.is_resident(page) {
                Some(ri) => {
                    tally.held_now.insert(ri);
                    let acc = tally.pages.entry(page).or_default();
                    acc.live += live_part as u32;
                    acc.usable += usable_part as u32;
                    if page == first {
                        acc.headers += header_on_first as u32;
                    }
                    acc.dominate(usable_part as u32, usable);
                }
                None => tally.parts.live_not_resident += live_part,
            }
            page += 1;
        }
    }
    let class_free = tally.settle(&mut res, history);

    // Pass 2: size classes and sites, by the pages their objects sit on.
    let pages = &tally.pages;
    let sparse_live = ps * u64::from(sparse_pct) / 100;
    let mut classes: FastMap<u64, (ClassAtSnapshot, f64)> = FastMap::default();
    let mut class_pages: FastSet<(u64, u64)> = FastSet::default();
    // Blocks come roughly in address order: most repeats of (class, page) are the last one.
    let mut last_class_page = (u64::MAX, u64::MAX);
    let mut sites = SiteTally::default();
    for (addr, b) in live {
        let usable = b.usable().max(1);
        let (c, occ_sum) = class_entry(&mut classes, usable);
        c.objects += 1;
        c.live_bytes += b.size;
        c.usable_bytes += usable;
        let first = addr >> shift;
        let last = (addr + usable - 1) >> shift;
        let mut pin = (0.0f64, 0.0f64, false);
        // Only the edge pages of a large block can be shared or sparse.
        let edge_pages: &[u64] = if last - first > 2 * INTERIOR_PAGES {
            &[first, last]
        } else {
            &[]
        };
        let mut visit = |page: u64, pin: &mut (f64, f64, bool), occ_sum: &mut f64| {
            let Some(acc) = pages.get(&page) else { return };
            if last_class_page != (usable, page) {
                last_class_page = (usable, page);
                if class_pages.insert((usable, page)) {
                    c.pages += 1;
                    *occ_sum += f64::from(acc.live) / ps as f64;
                }
            }
            if weighting != SiteWeighting::None && u64::from(acc.live) < sparse_live && acc.live > 0
            {
                let p_start = page << shift;
                let mine = (addr + b.size).clamp(p_start, p_start + ps)
                    - addr.clamp(p_start, p_start + ps);
                let share = mine as f64 / f64::from(acc.live);
                pin.0 += share;
                pin.1 += share * (ps - u64::from(acc.live)) as f64;
                pin.2 = true;
            }
        };
        if edge_pages.is_empty() {
            for page in first..=last {
                visit(page, &mut pin, occ_sum);
            }
        } else {
            for &page in edge_pages {
                visit(page, &mut pin, occ_sum);
            }
        }
        let weights = BlockWeights::of(weighting, b.stack, b.size);
        sites.add(b.stack, weights, 1.0, b.size, pin);
    }
    HeapSnapshot {
        parts: tally.parts,
        classes: classes_at(classes, &tally.interior_by_class, class_free, ps),
        sites: sites.finish(weighting),
    }
}

/// The class's entry and its pages' summed occupancy, made empty the first time.
pub(crate) fn class_entry(
    classes: &mut FastMap<u64, (ClassAtSnapshot, f64)>,
    usable: u64,
) -> &mut (ClassAtSnapshot, f64) {
    classes.entry(usable).or_insert_with(|| {
        (
            ClassAtSnapshot {
                usable,
                ..Default::default()
            },
            0.0,
        )
    })
}

/// The resident pages of a snapshot with live blocks, as they are added up: what both
/// ways of evaluating a snapshot (from every block, from the blocks by page) share.
pub(crate) struct PageTally {
    pub(crate) ps: u64,
    /// Resident pages holding a block or a block's header.
    pub(crate) pages: PageMap<PageAcc>,
    /// Residency ranges holding such a page.
    pub(crate) held_now: FastSet<usize>,
    pub(crate) parts: HeapParts,
    /// Full interior pages of large blocks: counted (in total and per class), not stored.
    interior_full: u64,
    pub(crate) interior_by_class: FastMap<u64, (u64, u64)>,
    interior_runs: Vec<(u64, u64)>,
}

impl PageTally {
    pub(crate) fn new(pm: &Pagemap) -> Self {
        Self {
            ps: u64::from(pm.page_size.max(1)),
            pages: PageMap::default(),
            held_now: FastSet::default(),
            parts: HeapParts::default(),
            interior_full: 0,
            interior_by_class: FastMap::default(),
            interior_runs: Vec::new(),
        }
    }

    /// Interior pages `run` (first and last) of a large block of class `usable` whose
    /// requested bytes end at `live_end`: resident ones are full of it.
    pub(crate) fn interior(
        &mut self,
        res: &mut Residency,
        run: (u64, u64),
        live_end: u64,
        usable: u64,
    ) {
        let (ps, shift) = (self.ps, res.shift);
        let parts = &mut self.parts;
        self.interior_runs.push(run);
        for p in run.0..=run.1 {
            let p_start = p << shift;
            let live_part = live_end.clamp(p_start, p_start + ps) - p_start;
            match res.is_resident(p) {
                Some(ri) => {
                    self.held_now.insert(ri);
                    let owner = res.owner(ri, p);
                    parts
                        .owners
                        .add_page(owner, live_part, ps - live_part, 0, 0);
                    self.interior_full += 1;
                    let ic = self.interior_by_class.entry(usable).or_default();
                    ic.0 += 1;
                    ic.1 += live_part;
                    parts.live += live_part;
                    parts.rounding += ps - live_part;
                    let bk = bucket_of(live_part, ps);
                    parts.occupancy_pages[bk] += 1;
                    parts.occupancy_live[bk] += live_part;
                }
                None => parts.live_not_resident += live_part,
            }
        }
    }

    /// Adds up the pages once every block is in: the parts, the ranges that held a block,
    /// the empty resident pages of those. Returns the free bytes charged to each class.
    pub(crate) fn settle(
        &mut self,
        res: &mut Residency,
        history: &mut HeapHistory,
    ) -> FastMap<u64, u64> {
        let (ps, shift) = (self.ps, res.shift);
        for ri in &self.held_now {
            history.held_ranges.insert(res.ranges[*ri].start);
        }
        let parts = &mut self.parts;
        let pages = &self.pages;
        // Page totals.
        let mut class_free: FastMap<u64, u64> = FastMap::default();
        for (&page, acc) in pages {
            let (live_b, usable_b) = (u64::from(acc.live), u64::from(acc.usable).min(ps));
            let used_b = (usable_b + u64::from(acc.headers)).min(ps);
            parts.live += live_b;
            parts.rounding += usable_b.saturating_sub(live_b);
            parts.allocator_overhead += used_b - usable_b;
            parts.free_in_used_pages += ps - used_b;
            if let Some(owner) = res.resident_owner(page) {
                parts.owners.add_page(
                    owner,
                    live_b,
                    usable_b.saturating_sub(live_b),
                    used_b - usable_b,
                    ps - used_b,
                );
            }
            let bk = bucket_of(live_b, ps);
            parts.occupancy_pages[bk] += 1;
            parts.occupancy_live[bk] += live_b;
            *class_free.entry(acc.class).or_default() += ps - used_b;
            history.last_class.insert(page, acc.class);
        }
        parts.used_pages = pages.len() as u64 + self.interior_full;

        let runs = &mut self.interior_runs;
        runs.sort_unstable();
        let in_interior = |page: u64| {
            let i = runs.partition_point(|r| r.0 <= page);
            i > 0 && runs[i - 1].1 >= page
        };
        // Resident pages of heap mappings: empty ones are charged to the class that last
        // used them (0 when none did while we watched).
        for ri in 0..res.ranges.len() {
            let r = res.ranges[ri];
            let resident = r.resident_pages();
            if !history.held_ranges.contains(&r.start) {
                parts.never_held_resident += resident * ps;
                continue;
            }
            parts.heap_resident += resident * ps;
            let base = r.start >> shift;
            for idx in 0..r.pages {
                if r.resident[(idx / 8) as usize] == 0 {
                    continue;
                }
                let page = base + idx;
                if r.is_resident(idx) && !pages.contains_key(&page) && !in_interior(page) {
                    let class = history.last_class.get(&page).copied().unwrap_or(0);
                    *class_free.entry(class).or_default() += ps;
                    let owner = res.owner(ri, page);
                    parts.owners.free_resident_pages.add(owner, ps);
                }
            }
        }
        let heap_pages = parts.heap_resident / ps;
        parts.empty_pages = heap_pages.saturating_sub(parts.used_pages);
        parts.free_resident_pages = parts.empty_pages * ps;
        // Bucket 0 already holds used pages without a live byte (only a block's rounding
        // tail or a zero-byte block): the empty pages join them.
        parts.occupancy_pages[0] += parts.empty_pages;
        class_free
    }
}

/// The classes of a snapshot: their interior pages of large blocks added, their mean
/// occupancy, the free bytes charged to them (also to classes with no object left).
pub(crate) fn classes_at(
    classes: FastMap<u64, (ClassAtSnapshot, f64)>,
    interior_by_class: &FastMap<u64, (u64, u64)>,
    mut class_free: FastMap<u64, u64>,
    ps: u64,
) -> Vec<ClassAtSnapshot> {
    let mut classes: Vec<ClassAtSnapshot> = classes
        .into_values()
        .map(|(mut c, mut occ_sum)| {
            if let Some((n, live_b)) = interior_by_class.get(&c.usable) {
                c.pages += n;
                occ_sum += *live_b as f64 / ps as f64;
            }
            c.mean_occupancy = if c.pages > 0 {
                occ_sum / c.pages as f64
            } else {
                0.0
            };
            c.retained_free = class_free.remove(&c.usable).unwrap_or(0);
            c
        })
        .collect();
    // Classes with no live object left but free pages charged to them.
    for (usable, free) in class_free {
        if free > 0 {
            classes.push(ClassAtSnapshot {
                usable,
                retained_free: free,
                ..Default::default()
            });
        }
    }
    classes.sort_by_key(|c| c.usable);
    classes
}

/// How a block of a size counts towards its site's figures.
#[derive(Clone, Copy)]
pub(crate) struct BlockWeights {
    /// Blocks it stands for in its site's figures (0: none, an unsampled stack).
    pub(crate) site: f64,
    /// Sampled with less than near certainty: its site's figures are estimates, scaled to
    /// the exact totals over every such block.
    pub(crate) uncertain: bool,
}

impl BlockWeights {
    pub(crate) fn of(weighting: SiteWeighting, stack: u32, size: u64) -> Self {
        Self::from_weight(weighting, stack, weighting.weight(size))
    }

    /// From `weight`, `weighting.weight` of the block's size.
    pub(crate) fn from_weight(weighting: SiteWeighting, stack: u32, weight: f64) -> Self {
        Self {
            site: if stack == 0 && weighting != SiteWeighting::Every {
                0.0
            } else {
                weight
            },
            // Blocks sampled with near certainty (large ones) are counted as they are.
            uncertain: weight > 1.01,
        }
    }
}

/// The sites of a snapshot as blocks are added: per site, the blocks counted as they are
/// and the estimated ones, and the exact totals over every estimated block.
#[derive(Default)]
pub(crate) struct SiteTally {
    sites: FastMap<u32, (SiteAtSnapshot, SiteAtSnapshot)>,
    exact: SiteAtSnapshot,
}

impl SiteTally {
    /// Adds `n` blocks of `size` bytes of site `stack`; `pin`: what they pin
    /// (page shares, waste, pin any page), per block.
    pub(crate) fn add(
        &mut self,
        stack: u32,
        w: BlockWeights,
        n: f64,
        size: u64,
        pin: (f64, f64, bool),
    ) {
        if w.uncertain {
            self.exact.add(n, size, pin);
        }
        self.add_to_site(stack, w, n, size, pin);
    }

    /// [`SiteTally::add`] without the exact totals: those of blocks that pin nothing are
    /// sums of whole numbers, the same in any order, so [`crate::heap_pages::HeapPages`]
    /// adds them per kind of block ([`SiteTally::add_exact`]) and each site's blocks
    /// one by one.
    pub(crate) fn add_to_site(
        &mut self,
        stack: u32,
        w: BlockWeights,
        n: f64,
        size: u64,
        pin: (f64, f64, bool),
    ) {
        if w.site > 0.0 {
            self.site(stack, w).add(n * w.site, size, pin);
        }
    }

    /// Adds `n` estimated blocks of `size` bytes that pin nothing to the exact totals.
    pub(crate) fn add_exact(&mut self, n: f64, size: u64) {
        self.exact.add(n, size, (0.0, 0.0, false));
    }

    /// Site `stack`'s blocks counted as they are or estimated, as `w` says.
    fn site(&mut self, stack: u32, w: BlockWeights) -> &mut SiteAtSnapshot {
        let s = self.sites.entry(stack).or_insert_with(|| {
            let empty = SiteAtSnapshot {
                stack,
                ..Default::default()
            };
            (empty.clone(), empty)
        });
        if w.uncertain {
            &mut s.1
        } else {
            &mut s.0
        }
    }

    /// Adds what `objects` blocks (and the share `pages`, `waste` of all the blocks
    /// counted) of site `stack` pin; see [`SiteAtSnapshot::add_pinning`].
    pub(crate) fn add_pinning(
        &mut self,
        stack: u32,
        w: BlockWeights,
        objects: f64,
        pages: f64,
        waste: f64,
    ) {
        if w.uncertain {
            self.exact.add_pinning(1.0, objects, pages, waste);
        }
        if w.site > 0.0 {
            self.site(stack, w)
                .add_pinning(w.site, objects, pages, waste);
        }
    }

    /// The sites, most live bytes first (of equals, the lowest stack id).
    pub(crate) fn finish(self, weighting: SiteWeighting) -> Vec<SiteAtSnapshot> {
        let (certain, mut estimated): (Vec<SiteAtSnapshot>, Vec<SiteAtSnapshot>) =
            self.sites.into_values().unzip();
        if let SiteWeighting::Sampled { .. } = weighting {
            scale_to_exact_totals(&mut estimated, &self.exact);
        }
        let mut sites: Vec<SiteAtSnapshot> = certain
            .into_iter()
            .zip(estimated)
            .map(|(mut c, e)| {
                c.live_objects += e.live_objects;
                c.live_bytes += e.live_bytes;
                c.pinning_objects += e.pinning_objects;
                c.pinned_pages += e.pinned_pages;
                c.pinned_waste += e.pinned_waste;
                c
            })
            .collect();
        sites.sort_by(|a, b| (b.live_bytes.total_cmp(&a.live_bytes)).then(a.stack.cmp(&b.stack)));
        sites
    }
}

/// Sampled stacks say who; the exact totals over all blocks say how much. Each figure of
/// each site is scaled so the sites sum to the exact total (a ratio estimator: with a few
/// dozen samples per site, far closer than the weights alone).
fn scale_to_exact_totals(sites: &mut [SiteAtSnapshot], exact: &SiteAtSnapshot) {
    type Field = fn(&mut SiteAtSnapshot) -> &mut f64;
    let fields: [(Field, f64); 5] = [
        (|s| &mut s.live_objects, exact.live_objects),
        (|s| &mut s.live_bytes, exact.live_bytes),
        (|s| &mut s.pinning_objects, exact.pinning_objects),
        (|s| &mut s.pinned_pages, exact.pinned_pages),
        (|s| &mut s.pinned_waste, exact.pinned_waste),
    ];
    for (field, total) in fields {
        let estimated: f64 = sites.iter_mut().map(|s| *field(s)).sum();
        if estimated > 0.0 {
            let k = total / estimated;
            for s in sites.iter_mut() {
                *field(s) *= k;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::merge::LiveBlock;

    fn block(size: u64, rounding: u32, stack: u32) -> LiveBlock {
        LiveBlock {
            size,
            rounding,
            stack,
            born_tick: 0,
            inherited: false,
        }
    }

    /// A 16-page mapping at 0x10000 with every page resident.
    fn all_resident() -> Pagemap {
        Pagemap {
            stream: 0,
            tick: 0,
            reason: fragscope_trace::records::SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start: 0x10000,
                pages: 16,
                resident: vec![0xff, 0xff],
                ..Default::default()
            }],
        }
    }

    /// Every page of [`all_resident`] resident, no earlier snapshot, every site exact.
    fn evaluate_every(live: &LiveTable) -> HeapSnapshot {
        evaluate(
            live,
            &all_resident(),
            None,
            &mut HeapHistory::default(),
            SiteWeighting::Every,
            10,
            BlockHeaders::None,
        )
    }

    /// Page by page, each part goes to its page's owner: shared (another process maps
    /// it), copied (private now, resident when the process started as a fork child) or
    /// its own.
    #[test]
    fn each_part_is_split_by_the_owner_of_its_pages() {
        let mut live = LiveTable::default();
        live.insert(0x10000, block(1000, 24, 1)); // page 0: shared
        live.insert(0x11000, block(2000, 0, 1)); // page 1: copied
        live.insert(0x12000, block(3000, 0, 1)); // page 2: its own
        let mut now = all_resident();
        now.ranges[0].shared = vec![0b0000_1001, 0]; // pages 0 and 3 (empty)
        let mut start = all_resident();
        start.ranges[0].resident = vec![0b0000_0011, 0];
        let snap = evaluate(
            &live,
            &now,
            Some(&start),
            &mut HeapHistory::default(),
            SiteWeighting::Every,
            10,
            BlockHeaders::None,
        );
        let o = &snap.parts.owners;
        assert_eq!(
            (o.live.resident, o.live.shared, o.live.copied),
            (6000, 1000, 2000)
        );
        assert_eq!((o.rounding.shared, o.rounding.copied), (24, 0));
        assert_eq!(o.free_in_used_pages.shared, 4096 - 1024);
        assert_eq!(o.free_in_used_pages.copied, 4096 - 2000);
        // 13 empty pages, page 3 of them shared.
        let free = o.free_resident_pages;
        assert_eq!(
            (free.resident, free.shared, free.copied),
            (13 * 4096, 4096, 0)
        );
        assert_eq!(free.resident, snap.parts.free_resident_pages);
    }

    #[test]
    fn every_resident_heap_page_is_in_one_occupancy_bucket() {
        let mut live = LiveTable::default();
        // A zero-byte block (malloc(0): 24 usable bytes) is the only block of page 5: the
        // page is used, without a live byte.
        live.insert(0x15000, block(0, 24, 1));
        live.insert(0x13000, block(100, 12, 2));
        let snap = evaluate_every(&live);
        let p = &snap.parts;
        assert_eq!(p.used_pages, 2);
        assert_eq!(p.occupancy_pages.iter().sum::<u64>(), 16);
        assert_eq!(
            p.occupancy_pages[0], 15,
            "14 empty pages and the zero-byte one"
        );
    }

    #[test]
    fn parts_add_up_to_the_heap_and_straddling_objects_split_by_page() {
        let mut live = LiveTable::default();
        // 100 bytes straddling pages 0 and 1 (60 in page 0, 40 in page 1), usable 112.
        live.insert(0x10000 + 4096 - 60, block(100, 12, 1));
        // One full page's worth in page 3.
        live.insert(0x13000, block(4096, 0, 2));
        let snap = evaluate_every(&live);
        let p = &snap.parts;
        assert_eq!(p.live, 4196);
        assert_eq!(p.rounding, 12);
        assert_eq!(p.used_pages, 3);
        assert_eq!(p.empty_pages, 13);
        assert_eq!(p.heap_resident, 16 * 4096);
        assert_eq!(
            p.live + p.rounding + p.free_in_used_pages + p.free_resident_pages,
            p.heap_resident
        );
        // page 0: 60 live; page 1: 40 live; page 3 full.
        assert_eq!(p.occupancy_pages[1], 2);
        assert_eq!(p.occupancy_live[1], 100);
        assert_eq!(p.occupancy_pages[10], 1);
        // the straddler pins both its pages, which hold nothing else
        let s1 = snap.sites.iter().find(|s| s.stack == 1).unwrap();
        assert!((s1.pinned_pages - 2.0).abs() < 1e-9);
        assert!((s1.pinned_waste - (2.0 * 4096.0 - 100.0)).abs() < 1e-9);
        let s2 = snap.sites.iter().find(|s| s.stack == 2).unwrap();
        assert_eq!(s2.pinned_pages, 0.0);
    }

    #[test]
    fn glibcs_chunk_headers_are_the_allocators_not_free_space() {
        let mut live = LiveTable::default();
        // 20 bytes asked, 24 usable: its size field is the 8 bytes before it.
        live.insert(0x10010, block(20, 4, 1));
        // A block at the start of page 2: its header is the last 8 bytes of page 1,
        // which holds nothing else and is used all the same.
        live.insert(0x12000, block(24, 0, 1));
        // A chunk mmapped alone (whole pages less 16 usable): a 16-byte header.
        live.insert(0x14010, block(4000, 80, 2));
        let snap = evaluate(
            &live,
            &all_resident(),
            None,
            &mut HeapHistory::default(),
            SiteWeighting::Every,
            10,
            BlockHeaders::Glibc,
        );
        let p = &snap.parts;
        assert_eq!(p.live, 20 + 24 + 4000);
        assert_eq!(p.rounding, 4 + 80);
        assert_eq!(p.allocator_overhead, 8 + 8 + 16);
        assert_eq!(p.used_pages, 4);
        assert_eq!(
            p.live + p.rounding + p.allocator_overhead + p.free_in_used_pages,
            4 * 4096
        );
        assert_eq!(p.free_resident_pages, 12 * 4096);
        // Under another allocator the same bytes are free space.
        let other = evaluate_every(&live);
        assert_eq!(other.parts.allocator_overhead, 0);
        assert_eq!(other.parts.used_pages, 3);
    }

    #[test]
    fn the_headers_follow_the_allocator_of_the_process() {
        let map = |path: &str| Mapping {
            start: 0x1000,
            end: 0x2000,
            perms: "r-xp".into(),
            offset: 0,
            inode: 1,
            path: path.into(),
            build_id: Vec::new(),
        };
        let libc = map("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let je = map("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        let of = BlockHeaders::of_process;
        assert_eq!(of(None, std::slice::from_ref(&libc)), BlockHeaders::Glibc);
        assert_eq!(of(None, &[libc.clone(), je.clone()]), BlockHeaders::None);
        assert_eq!(
            of(Some("jemalloc"), std::slice::from_ref(&libc)),
            BlockHeaders::None
        );
        assert_eq!(of(Some("glibc"), &[]), BlockHeaders::Glibc);
        assert_eq!(of(Some("unknown"), &[libc]), BlockHeaders::Glibc);
        assert_eq!(of(None, &[]), BlockHeaders::None);
        assert_eq!(BlockHeaders::Glibc.before(24), 8);
        assert_eq!(BlockHeaders::Glibc.before(128 * 1024 - 16), 16);
        assert_eq!(BlockHeaders::None.before(24), 0);
    }

    #[test]
    fn mappings_that_never_held_an_object_are_not_heap() {
        let live = LiveTable::default();
        let snap = evaluate_every(&live);
        assert_eq!(snap.parts.heap_resident, 0);
        assert_eq!(snap.parts.never_held_resident, 16 * 4096);
    }

    #[test]
    fn freed_pages_are_charged_to_the_class_that_used_them() {
        let mut history = HeapHistory::default();
        let mut live = LiveTable::default();
        for i in 0..64 {
            live.insert(0x10000 + i * 64, block(64, 0, 0));
        }
        live.insert(0x11000, block(4000, 96, 0));
        evaluate(
            &live,
            &all_resident(),
            None,
            &mut history,
            SiteWeighting::None,
            10,
            BlockHeaders::None,
        );
        for i in 1..64 {
            live.remove(&(0x10000 + i * 64));
        }
        let snap = evaluate(
            &live,
            &all_resident(),
            None,
            &mut history,
            SiteWeighting::None,
            10,
            BlockHeaders::None,
        );
        let c64 = snap.classes.iter().find(|c| c.usable == 64).unwrap();
        assert_eq!(c64.objects, 1);
        assert_eq!(c64.retained_free, 4096 - 64);
        assert!((c64.mean_occupancy - 64.0 / 4096.0).abs() < 1e-9);
        let unknown = snap.classes.iter().find(|c| c.usable == 0).unwrap();
        assert_eq!(unknown.retained_free, 14 * 4096);
    }

    #[test]
    fn large_blocks_count_their_interior_pages_without_storing_them() {
        let mut live = LiveTable::default();
        live.insert(0x10000 + 100, block(12 * 4096, 0, 7));
        let snap = evaluate_every(&live);
        let p = &snap.parts;
        assert_eq!(p.live, 12 * 4096);
        assert_eq!(p.used_pages, 13);
        assert_eq!(
            p.live + p.rounding + p.free_in_used_pages + p.free_resident_pages,
            p.heap_resident
        );
    }

    #[test]
    fn sampled_sites_are_scaled_to_exact_totals_and_certain_blocks_are_not() {
        let mut live = LiveTable::default();
        // 64 small blocks, only two sampled (stacks 1 and 2), one 12-page block (stack 3).
        for i in 0..64 {
            let stack = match i {
                0 => 1,
                32 => 2,
                _ => 0,
            };
            live.insert(0x10000 + i * 64, block(64, 0, stack));
        }
        live.insert(0x11000, block(12 * 4096, 0, 3));
        let snap = evaluate(
            &live,
            &all_resident(),
            None,
            &mut HeapHistory::default(),
            SiteWeighting::Sampled { mean_bytes: 4096.0 },
            10,
            BlockHeaders::None,
        );
        let site = |id| snap.sites.iter().find(|s| s.stack == id).unwrap();
        assert!((site(1).live_bytes + site(2).live_bytes - 64.0 * 64.0).abs() < 1e-6);
        assert!((site(1).live_objects - 32.0).abs() < 1e-6);
        assert!((site(3).live_bytes - 12.0 * 4096.0).abs() < 1.0);
        assert!((site(3).live_objects - 1.0).abs() < 1e-3);
    }
}
