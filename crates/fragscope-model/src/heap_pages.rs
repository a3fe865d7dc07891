//! The live blocks by page, kept as the merged calls are applied, so that evaluating a
//! snapshot costs the pages the heap holds, not its blocks. [`crate::heap::evaluate`] visits
//! every live block at every snapshot: over a million live blocks that was 20 times the
//! report of the same calls over 4096 blocks.
//!
//! The figures are [`crate::heap::evaluate`]'s: the integer ones identical, the sites' sums of
//! page shares (floating point) added in another order. [`crate::heap::evaluate`] stays for
//! a process with many calls between snapshots for its live blocks (following each call
//! by page would cost more than visiting every block at each snapshot: the rule is
//! `follows_by_page` in `analyze`), for the snapshots of a forked process that shares its
//! parent's blocks (kept as a copy of its table and evaluated later, see `analyze`), and
//! as the reference the tests compare with ([`Evaluation`]).

use fragscope_trace::hash::{AddrMap, FastMap, PageMap};
use fragscope_trace::merge::{Call, LiveBlock, LiveTable, Merger};
use fragscope_trace::records::Pagemap;
use thin_vec::ThinVec;

use crate::heap::{
    class_entry, classes_at, BlockHeaders, BlockWeights, ClassAtSnapshot, HeapHistory,
    HeapSnapshot, PageAcc, PageTally, Residency, SiteTally, SiteWeighting, INTERIOR_PAGES,
};

/// [`BlockGroup::from_first`] of a group that has only its blocks' headers on the page.
const HEADER_ONLY: u32 = u32::MAX;

/// Blocks on one page that a snapshot's evaluation tells apart by nothing but their
/// number: same site, size and rounding, the page at the same place in them and the same
/// bytes of them on it. Blocks of one site and size side by side in a page are one group.
/// What a page keeps of it is a [`Group`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BlockGroup {
    size: u64,
    rounding: u32,
    stack: u32,
    /// Pages between the blocks' first page and this one (a large block's last page is
    /// far from its first); `HEADER_ONLY`: only their headers are on this page.
    from_first: u32,
    /// Usable and requested bytes of each block on the page.
    usable_part: u32,
    live_part: u32,
    count: u32,
}

impl BlockGroup {
    fn class(&self) -> u64 {
        (self.size + u64::from(self.rounding)).max(1)
    }

    fn kind(&self) -> Kind {
        (self.size, self.rounding, self.stack)
    }

    /// Where on the page its blocks lie, unless they lie wholly on it (`None`), as most
    /// blocks of a heap of small blocks do.
    fn place(&self) -> Option<Place> {
        let whole = self.from_first == 0
            && u64::from(self.usable_part) == self.class()
            && u64::from(self.live_part) == self.size;
        (!whole).then_some((self.from_first, self.usable_part, self.live_part))
    }
}

/// A group's blocks' requested size, rounding and stack.
type Kind = (u64, u32, u32);
/// Where on a page a group's blocks lie: [`BlockGroup`]'s `from_first`, `usable_part`
/// and `live_part`.
type Place = (u32, u32, u32);

/// A [`BlockGroup`] as its page keeps it: its kind and place by their index in the
/// [`GroupParts`], 12 bytes. The groups were kept whole with a hash of each beside them,
/// 36 bytes: over a million blocks of a few hundred sizes nearly every block is a group of
/// its own, and the blocks by page took 41 MiB.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Group {
    kind: u32,
    /// [`Group::WHOLE`]: the blocks lie wholly on the page.
    place: u32,
    count: u32,
}

impl Group {
    const WHOLE: u32 = u32::MAX;
}

/// The kinds and places the pages' groups name by index, each kept while a group names it.
#[derive(Default, Debug)]
struct GroupParts {
    kinds: Interned<Kind>,
    places: Interned<Place>,
}

impl GroupParts {
    /// The group `g` as a page keeps it, its parts found or (`add`) made; `None` when a
    /// part is not there to be found (no such group).
    fn group_of(&mut self, g: &BlockGroup, add: bool) -> Option<Group> {
        let place = match g.place() {
            None => Group::WHOLE,
            Some(p) => self.places.id(p, add)?,
        };
        Some(Group {
            kind: self.kinds.id(g.kind(), add)?,
            place,
            count: g.count,
        })
    }

    /// A page's group starts (`named`) or stops naming its parts.
    fn name(&mut self, g: &Group, named: bool) {
        self.kinds.name(g.kind, named);
        if g.place != Group::WHOLE {
            self.places.name(g.place, named);
        }
    }

    /// The group a page keeps as `g`.
    #[inline]
    fn block_group(&self, g: &Group) -> BlockGroup {
        let (size, rounding, stack) = self.kinds.get(g.kind);
        let (from_first, usable_part, live_part) = match g.place {
            Group::WHOLE => (0, (size + u64::from(rounding)).max(1) as u32, size as u32),
            p => self.places.get(p),
        };
        BlockGroup {
            size,
            rounding,
            stack,
            from_first,
            usable_part,
            live_part,
            count: g.count,
        }
    }
}

/// Values by index, each with the number of groups that name it: an index whose last
/// group went is taken again by the next new value.
#[derive(Debug)]
struct Interned<T> {
    index: FastMap<T, u32>,
    values: Vec<(T, u32)>,
    free: Vec<u32>,
}

impl<T> Default for Interned<T> {
    fn default() -> Self {
        Self {
            index: FastMap::default(),
            values: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T: Copy + Eq + std::hash::Hash> Interned<T> {
    /// The index of `v`, made if it has none and `add`.
    #[inline]
    fn id(&mut self, v: T, add: bool) -> Option<u32> {
        if !add {
            return self.index.get(&v).copied();
        }
        let (values, free) = (&mut self.values, &mut self.free);
        Some(*self.index.entry(v).or_insert_with(|| match free.pop() {
            Some(id) => {
                values[id as usize] = (v, 0);
                id
            }
            None => {
                values.push((v, 0));
                values.len() as u32 - 1
            }
        }))
    }

    #[inline]
    fn get(&self, id: u32) -> T {
        self.values[id as usize].0
    }

    /// One more group names `id` (`named`), or one fewer: with none left it goes.
    fn name(&mut self, id: u32, named: bool) {
        let (v, groups) = &mut self.values[id as usize];
        if named {
            *groups += 1;
        } else {
            *groups -= 1;
            if *groups == 0 {
                self.index.remove(v);
                self.free.push(id);
            }
        }
    }
}

/// A page's blocks. A map of these is a big heap's second biggest part after the live
/// blocks' table (a million blocks over 39 k pages), so the lists are thin (one word
/// where they are kept, their length and room in their allocation) and grow by a quarter
/// (doubled, a page's 17 to 32 groups had room for 32).
#[derive(Default, Debug)]
struct PageBlocks {
    /// Header bytes on the page (glibc's chunk size fields).
    headers: u64,
    groups: ThinVec<Group>,
    /// What a snapshot reads of the groups, as of the last snapshot they changed before.
    summary: PageSummary,
    /// The groups changed since `summary` was taken (the page is in `changed_pages`).
    changed: bool,
}

/// The figures of a page's groups that a snapshot reads: a snapshot reads these, not the
/// groups, of a page that is not sparse (most of a heap's pages, with most of its blocks).
#[derive(Default, Debug, Clone)]
struct PageSummary {
    /// Requested and usable bytes of the blocks on the page (their sums wrap as
    /// [`PageAcc`]'s do).
    live: u64,
    usable: u64,
    /// The dominant class, as [`PageAcc::dominate`] picks it over every group.
    class: u64,
    class_bytes: u32,
    /// Whether a group of its blocks has a stack: a sampled site's blocks are weighed one
    /// by one.
    stacked: bool,
    /// The classes of its blocks (by [`ClassTotals`] index), each once.
    classes: ThinVec<u32>,
}

impl PageSummary {
    fn of(groups: &[Group], parts: &GroupParts, class_ids: &mut FastMap<u64, u32>) -> Self {
        let mut acc = PageAcc::default();
        let mut summary = Self::default();
        for g in groups.iter().map(|g| parts.block_group(g)) {
            acc.dominate(g.usable_part, g.class());
            if g.from_first == HEADER_ONLY {
                continue;
            }
            summary.live += u64::from(g.count) * u64::from(g.live_part);
            summary.usable += u64::from(g.count) * u64::from(g.usable_part);
            summary.stacked |= g.stack != 0;
            let next = class_ids.len() as u32;
            let id = *class_ids.entry(g.class()).or_insert(next);
            if !summary.classes.contains(&id) {
                push_tight(&mut summary.classes, id);
            }
        }
        summary.class = acc.class;
        summary.class_bytes = acc.class_bytes;
        summary
    }

    /// The page's figures as a snapshot adds them up, with `headers` header bytes.
    fn acc(&self, headers: u64) -> PageAcc {
        PageAcc {
            live: self.live as u32,
            usable: self.usable as u32,
            headers: headers as u32,
            class: self.class,
            class_bytes: self.class_bytes,
        }
    }
}

/// One class's pages: how many hold a block of it, and their live bytes summed (each
/// page's as [`PageAcc`] holds it). Its pages' mean occupancy is their sum over the page
/// size: each page's share of a page is exact in floating point (a page size is a power
/// of two), so the mean is the same as from the shares added page by page.
#[derive(Default, Debug, Clone, Copy)]
struct ClassTotals {
    pages: u64,
    live: u64,
}

impl ClassTotals {
    /// Adds (`add`) or takes away the pages of `summary` for each of its classes.
    fn count(totals: &mut Vec<ClassTotals>, summary: &PageSummary, add: bool) {
        let live = u64::from(summary.live as u32);
        for &id in &summary.classes {
            let i = id as usize;
            if i >= totals.len() {
                totals.resize(i + 1, ClassTotals::default());
            }
            let t = &mut totals[i];
            if add {
                t.pages += 1;
                t.live += live;
            } else {
                t.pages -= 1;
                t.live -= live;
            }
        }
    }
}

/// The live blocks of a process by page (see the module's comment).
pub struct HeapPages {
    shift: u32,
    headers: BlockHeaders,
    pages: PageMap<PageBlocks>,
    /// Blocks whose interior pages hold nothing else (see [`INTERIOR_PAGES`]): those
    /// pages are counted at each snapshot, not stored.
    large: AddrMap<LiveBlock>,
    /// `weighting.weight(size)` by size: an exp() per size, not per block and snapshot.
    weights: FastMap<u64, f64>,
    weighting: Option<SiteWeighting>,
    /// The block the last call freed, not taken away yet (see `follow`).
    freed: Option<(u64, LiveBlock)>,
    /// Live blocks by (size, rounding, stack): their classes' objects and bytes, and the
    /// sums over blocks that are whole numbers, whatever the pages.
    kinds: FastMap<(u64, u32, u32), u64>,
    /// Pages whose groups changed since the last snapshot: only their summaries are
    /// taken again.
    changed_pages: Vec<u64>,
    /// Each class's index in `class_totals`.
    class_ids: FastMap<u64, u32>,
    /// What the pages' groups name.
    group_parts: GroupParts,
    /// By class index, over the pages' summaries (resident or not).
    class_totals: Vec<ClassTotals>,
    /// The last snapshot's map of resident pages, emptied, for the next one to fill: made
    /// anew at each snapshot, it grew by doubling to megabytes each time (167 MiB
    /// allocated over 30 snapshots of a million blocks). Read by lookups and in sums of
    /// whole numbers only, so its order does not matter.
    spare_resident_pages: PageMap<PageAcc>,
}

impl HeapPages {
    /// The blocks of `live`, by pages of `page_size` bytes, each with the header
    /// `headers` says the allocator keeps before it.
    pub fn new(live: &LiveTable, page_size: u32, headers: BlockHeaders) -> Self {
        let mut pages = Self {
            shift: page_size.max(1).trailing_zeros(),
            headers,
            pages: PageMap::default(),
            large: AddrMap::default(),
            weights: FastMap::default(),
            weighting: None,
            freed: None,
            kinds: FastMap::default(),
            changed_pages: Vec::new(),
            class_ids: FastMap::default(),
            group_parts: GroupParts::default(),
            class_totals: Vec::new(),
            spare_resident_pages: PageMap::default(),
        };
        for (addr, b) in live {
            pages.apply(addr, &b, true);
        }
        pages
    }

    /// Whether the blocks are kept as snapshot `pm` with `headers` reads them (else they
    /// are to be taken again from the live table).
    pub fn fits(&self, pm: &Pagemap, headers: BlockHeaders) -> bool {
        pm.page_size.max(1).trailing_zeros() == self.shift && headers == self.headers
    }

    /// Follows call `c`, the one `merger` popped last: the blocks it ended go, the one it
    /// allocated comes.
    #[inline]
    pub fn follow(&mut self, merger: &Merger, c: &Call) {
        let mut ended = merger.ended_by_last_pop();
        let Some(addr) = c.allocates() else {
            self.settle_freed();
            // A free is held back: the next call may allocate the same block again.
            self.freed = ended.next().copied();
            for &(addr, b) in ended {
                self.apply(addr, &b, false);
            }
            return;
        };
        let block = LiveBlock::of(c);
        let first_ended = ended.next();
        if first_ended.is_none() {
            // A thread cache hands a freed chunk straight back: free and allocation of
            // the same block at the same address leave the pages as they were.
            if let Some((freed, b)) = self.freed {
                if freed == addr
                    && (b.size, b.rounding, b.stack) == (block.size, block.rounding, block.stack)
                {
                    self.freed = None;
                    return;
                }
            }
        }
        self.settle_freed();
        for &(addr, b) in first_ended.into_iter().chain(ended) {
            self.apply(addr, &b, false);
        }
        self.apply(addr, &block, true);
    }

    /// Takes away the block whose free was held back.
    fn settle_freed(&mut self) {
        if let Some((addr, b)) = self.freed.take() {
            self.apply(addr, &b, false);
        }
    }

    /// Adds (`add`) or takes away the block `b` at `addr`, as [`crate::heap::evaluate`] places it.
    fn apply(&mut self, addr: u64, b: &LiveBlock, add: bool) {
        let shift = self.shift;
        let ps = 1u64 << shift;
        let usable = b.usable().max(1);
        let (live_end, end) = (addr + b.size, addr + usable);
        let (first, last) = (addr >> shift, (end - 1) >> shift);
        let header = self.headers.before(usable).min(addr);
        let header_page = (addr - header) >> shift;
        if header > 0 && header_page != first {
            // Its class, only for the page's dominant class: the block is not there.
            let alone = BlockGroup {
                size: usable,
                rounding: 0,
                stack: 0,
                from_first: HEADER_ONLY,
                usable_part: 0,
                live_part: 0,
                count: 1,
            };
            self.change(header_page, header, Some(alone), add);
        }
        let header_on_first = if header_page == first { header } else { 0 };
        self.count_kind(b, add);
        let large = last - first > 2 * INTERIOR_PAGES;
        if large {
            if add {
                self.large.insert(addr, *b);
            } else {
                self.large.remove(&addr);
            }
        }
        let mut visit = |page: u64| {
            let p_start = page << shift;
            let p_end = p_start + ps;
            let group = BlockGroup {
                size: b.size,
                rounding: b.rounding,
                stack: b.stack,
                from_first: (page - first).min(u64::from(HEADER_ONLY - 1)) as u32,
                usable_part: (end.clamp(p_start, p_end) - addr.clamp(p_start, p_end)) as u32,
                live_part: (live_end.clamp(p_start, p_end) - addr.clamp(p_start, p_end)) as u32,
                count: 1,
            };
            let headers = if page == first { header_on_first } else { 0 };
            self.change(page, headers, Some(group), add);
        };
        if large {
            visit(first);
            visit(last);
        } else {
            (first..=last).for_each(visit);
        }
    }

    /// Counts (`add`) or takes away block `b` in `kinds`.
    fn count_kind(&mut self, b: &LiveBlock, add: bool) {
        let key = (b.size, b.rounding, b.stack);
        if add {
            *self.kinds.entry(key).or_default() += 1;
        } else if let Some(n) = self.kinds.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.kinds.remove(&key);
            }
        }
    }

    /// Adds (`add`) or takes away `headers` bytes and one block of `group` on `page`.
    fn change(&mut self, page: u64, headers: u64, group: Option<BlockGroup>, add: bool) {
        let parts = &mut self.group_parts;
        let group = group.map(|g| parts.group_of(&g, add));
        let on = self.pages.entry(page).or_default();
        if !on.changed {
            on.changed = true;
            self.changed_pages.push(page);
        }
        if add {
            on.headers += headers;
        } else {
            on.headers -= headers;
        }
        if let Some(g) = group {
            let found = g.and_then(|g| {
                (on.groups.iter()).position(|o| (o.kind, o.place) == (g.kind, g.place))
            });
            match (found, add) {
                (Some(i), true) => on.groups[i].count += 1,
                (None, true) => {
                    let g = g.expect("made");
                    push_tight(&mut on.groups, g);
                    parts.name(&g, true);
                }
                (Some(i), false) => {
                    on.groups[i].count -= 1;
                    if on.groups[i].count == 0 {
                        parts.name(&on.groups.swap_remove(i), false);
                    }
                }
                (None, false) => debug_assert!(false, "no such block on page {page:#x}"),
            }
        }
        if on.headers == 0 && on.groups.is_empty() {
            ClassTotals::count(&mut self.class_totals, &on.summary, false);
            self.pages.remove(&page);
        }
    }

    /// Takes the summaries of the pages changed since the last snapshot again.
    fn summarize_changed_pages(&mut self) {
        for page in self.changed_pages.drain(..) {
            // A page that went since has taken its summary away with it.
            let Some(on) = self.pages.get_mut(&page) else {
                continue;
            };
            if !on.changed {
                continue;
            }
            on.changed = false;
            ClassTotals::count(&mut self.class_totals, &on.summary, false);
            on.summary = PageSummary::of(&on.groups, &self.group_parts, &mut self.class_ids);
            ClassTotals::count(&mut self.class_totals, &on.summary, true);
        }
    }

    /// Evaluates the heap at snapshot `pm` (see [`crate::heap::evaluate`], whose figures these
    /// are, from every live block).
    ///
    /// Most of it costs the pages, not the blocks: a page's totals and classes come from
    /// its summary (taken again only if its groups changed since the last snapshot), the
    /// classes' objects and bytes and the sums over blocks that are whole numbers from
    /// `kinds`. Only two things are read block group by block group, in the order of the
    /// pages and their groups as ever (they are sums of fractions, whose last bits depend
    /// on the order): the sparse pages' pins, and the blocks of sampled sites.
    pub fn evaluate(
        &mut self,
        pm: &Pagemap,
        fork: Option<&Pagemap>,
        history: &mut HeapHistory,
        weighting: SiteWeighting,
        sparse_pct: u32,
    ) -> HeapSnapshot {
        self.settle_freed();
        self.summarize_changed_pages();
        let mut res = Residency::new(pm).with_fork(fork);
        let shift = res.shift;
        let mut tally = PageTally::new(pm);
        tally.pages = std::mem::take(&mut self.spare_resident_pages);
        let ps = tally.ps;
        for (&addr, b) in &self.large {
            let usable = b.usable().max(1);
            let (first, last) = (addr >> shift, (addr + usable - 1) >> shift);
            tally.interior(&mut res, (first + 1, last - 1), addr + b.size, usable);
        }
        if self.weighting != Some(weighting) {
            self.weights.clear();
            self.weighting = Some(weighting);
        }
        let mut classes = FastMap::default();
        let mut sites = SiteTally::default();
        self.add_kinds(weighting, &mut classes, &mut sites);
        let mut class_pages = self.class_totals.clone();
        let pinned_later = self.add_pages(
            &mut res,
            &mut tally,
            &mut class_pages,
            &mut sites,
            (weighting, sparse_pct),
        );
        for (&class, &id) in &self.class_ids {
            let Some(t) = class_pages.get(id as usize).filter(|t| t.pages > 0) else {
                continue;
            };
            let (c, occ_sum) = class_entry(&mut classes, class);
            c.pages += t.pages;
            *occ_sum += t.live as f64 / ps as f64;
        }
        let resident = &tally.pages;
        let sparse_page = |page: u64| {
            resident
                .get(&page)
                .is_some_and(|acc| is_sparse(acc, weighting, ps, sparse_pct))
        };
        for (page, from, stack, w, n, share, waste) in pinned_later {
            // A block pins once, at the first of its pages that it pins.
            let pinned_before = if from > 2 * INTERIOR_PAGES {
                sparse_page(page - from)
            } else {
                (page - from..page).any(sparse_page)
            };
            let objects = if pinned_before { 0.0 } else { n as f64 };
            sites.add_pinning(stack, w, objects, share, waste);
        }
        let class_free = tally.settle(&mut res, history);
        let snapshot = HeapSnapshot {
            classes: classes_at(classes, &tally.interior_by_class, class_free, ps),
            parts: tally.parts,
            sites: sites.finish(weighting),
        };
        self.spare_resident_pages = tally.pages;
        self.spare_resident_pages.clear();
        snapshot
    }

    /// The classes' objects and bytes, and the sites' sums that are whole numbers: the
    /// exact totals of sampled blocks' live bytes, and every site's when every allocation
    /// has its stack (each block weighs 1). A sampled site's blocks weigh fractions: those
    /// are added block group by block group in `add_pages`.
    fn add_kinds(
        &mut self,
        weighting: SiteWeighting,
        classes: &mut FastMap<u64, (ClassAtSnapshot, f64)>,
        sites: &mut SiteTally,
    ) {
        for (&(size, rounding, stack), &n) in &self.kinds {
            let usable = (size + u64::from(rounding)).max(1);
            let (c, _) = class_entry(classes, usable);
            c.objects += n;
            c.live_bytes += n * size;
            c.usable_bytes += n * usable;
            let weight = *self
                .weights
                .entry(size)
                .or_insert_with(|| weighting.weight(size));
            let w = BlockWeights::from_weight(weighting, stack, weight);
            if w.uncertain {
                sites.add_exact(n as f64, size);
            }
            if weighting == SiteWeighting::Every {
                sites.add_to_site(stack, w, n as f64, size, (0.0, 0.0, false));
            }
        }
    }

    /// Each page's totals into `tally` (its classes that are not resident taken out of
    /// `class_pages`), and the block groups that a sampled site weighs or a sparse page
    /// is pinned by into `sites`, in the order of the pages and their groups. Returns the
    /// sparse pages' shares of blocks that started on an earlier page: (page, pages from
    /// the block's first, stack, weights, blocks, share, waste), settled once every page
    /// is known (a block pins only the first of its pages that it pins).
    fn add_pages(
        &mut self,
        res: &mut Residency,
        tally: &mut PageTally,
        class_pages: &mut Vec<ClassTotals>,
        sites: &mut SiteTally,
        (weighting, sparse_pct): (SiteWeighting, u32),
    ) -> Vec<PinnedLater> {
        let ps = tally.ps;
        let sampled = matches!(weighting, SiteWeighting::Sampled { .. });
        let weights = &mut self.weights;
        let parts = &self.group_parts;
        let mut pinned_later = Vec::new();
        for (&page, on) in &self.pages {
            let summary = &on.summary;
            let acc = match res.is_resident(page) {
                None => {
                    tally.parts.live_not_resident += summary.live;
                    ClassTotals::count(class_pages, summary, false);
                    None
                }
                Some(ri) => {
                    tally.held_now.insert(ri);
                    let acc = summary.acc(on.headers);
                    tally.pages.insert(page, acc);
                    Some(acc)
                }
            };
            let sparse = acc.filter(|acc| is_sparse(acc, weighting, ps, sparse_pct));
            if sparse.is_none() && !(sampled && summary.stacked) {
                continue;
            }
            let groups = on.groups.iter().map(|g| parts.block_group(g));
            for g in groups.filter(|g| g.from_first != HEADER_ONLY) {
                let weighs_site = sampled && g.from_first == 0 && g.stack != 0;
                if !weighs_site && sparse.is_none() {
                    continue;
                }
                let n = u64::from(g.count);
                let weight = *weights
                    .entry(g.size)
                    .or_insert_with(|| weighting.weight(g.size));
                let w = BlockWeights::from_weight(weighting, g.stack, weight);
                if weighs_site {
                    sites.add_to_site(g.stack, w, n as f64, g.size, (0.0, 0.0, false));
                }
                let Some(acc) = &sparse else { continue };
                let share = (n * u64::from(g.live_part)) as f64 / f64::from(acc.live);
                let waste = share * (ps - u64::from(acc.live)) as f64;
                match u64::from(g.from_first) {
                    0 => sites.add_pinning(g.stack, w, n as f64, share, waste),
                    from => pinned_later.push((page, from, g.stack, w, n, share, waste)),
                }
            }
        }
        pinned_later
    }
}

/// Pushes `v` onto `list`, which grows by a quarter when full (see [`PageBlocks`]).
#[inline]
fn push_tight<T>(list: &mut ThinVec<T>, v: T) {
    if list.len() == list.capacity() {
        list.reserve_exact(list.len() / 4 + 1);
    }
    list.push(v);
}

/// A sparse page's share of blocks that started on an earlier page (see
/// `HeapPages::add_pages`).
type PinnedLater = (u64, u64, u32, BlockWeights, u64, f64, f64);

/// Whether a page of `acc` is pinned by its blocks: it holds live bytes, fewer than
/// `sparse_pct` percent of a page of `ps` bytes, and there are sites to pin it.
fn is_sparse(acc: &PageAcc, weighting: SiteWeighting, ps: u64, sparse_pct: u32) -> bool {
    let sparse_live = ps * u64::from(sparse_pct) / 100;
    weighting != SiteWeighting::None && u64::from(acc.live) < sparse_live && acc.live > 0
}

/// How a report evaluates the snapshots of a process from its live blocks.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Evaluation {
    /// By page while following the calls by page pays, else from every block (see
    /// `follows_by_page` in `analyze`).
    #[default]
    Chosen,
    /// Always from every live block ([`crate::heap::evaluate`]): `FRAGSCOPE_EVALUATION=blocks`.
    Blocks,
    /// Always from the live blocks by page: `FRAGSCOPE_EVALUATION=pages`.
    Pages,
}

impl Evaluation {
    /// The evaluation `FRAGSCOPE_EVALUATION` asks for, for the tests that compare them
    /// on recordings of real programs; [`Evaluation::Chosen`] when it is not set.
    pub fn asked() -> Self {
        match std::env::var_os("FRAGSCOPE_EVALUATION") {
            Some(v) if v == "blocks" => Self::Blocks,
            Some(v) if v == "pages" => Self::Pages,
            _ => Self::Chosen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heap::ClassAtSnapshot;
    use fragscope_trace::records::{ResidentRange, SnapshotReason};

    /// `a` and `b` agree: integers exactly, floating-point sums to rounding.
    fn assert_same(a: &HeapSnapshot, b: &HeapSnapshot, what: &str) {
        assert_eq!(a.parts, b.parts, "{what}: parts");
        let classes = |s: &HeapSnapshot| -> Vec<ClassAtSnapshot> {
            (s.classes.iter())
                .map(|c| ClassAtSnapshot {
                    mean_occupancy: 0.0,
                    ..c.clone()
                })
                .collect()
        };
        assert_eq!(classes(a), classes(b), "{what}: classes");
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0);
        for (x, y) in a.classes.iter().zip(&b.classes) {
            assert!(
                close(x.mean_occupancy, y.mean_occupancy),
                "{what}: {x:?} {y:?}"
            );
        }
        let mut sa = a.sites.clone();
        let mut sb = b.sites.clone();
        sa.sort_by_key(|s| s.stack);
        sb.sort_by_key(|s| s.stack);
        assert_eq!(sa.len(), sb.len(), "{what}: sites");
        for (x, y) in sa.iter().zip(&sb) {
            let same = x.stack == y.stack
                && close(x.live_objects, y.live_objects)
                && close(x.live_bytes, y.live_bytes)
                && close(x.pinning_objects, y.pinning_objects)
                && close(x.pinned_pages, y.pinned_pages)
                && close(x.pinned_waste, y.pinned_waste);
            assert!(same, "{what}: site {x:?} against {y:?}");
        }
    }

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Two mappings of 64 pages, some pages resident, some shared, some resident when
    /// the process started.
    fn residency(x: &mut u64, tick: u64) -> Pagemap {
        let mut bits = || {
            (0..8)
                .map(|_| xorshift(x) as u8 | 0x11)
                .collect::<Vec<u8>>()
        };
        let range = |start: u64, resident: Vec<u8>, shared: Vec<u8>| ResidentRange {
            start,
            pages: 64,
            resident,
            shared,
        };
        Pagemap {
            stream: 0,
            tick,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![
                range(0x100000, bits(), bits()),
                range(0x200000, bits(), Vec::new()),
            ],
        }
    }

    /// Random calls over two mappings (small blocks side by side, blocks straddling
    /// pages, large blocks, zero-byte ones, some at a page's start), snapshots between
    /// them: every figure of every snapshot is the same both ways, under each weighting
    /// and both kinds of headers.
    #[test]
    fn blocks_by_page_give_the_figures_of_every_block() {
        let weightings = [
            SiteWeighting::Every,
            SiteWeighting::Sampled { mean_bytes: 2048.0 },
            SiteWeighting::None,
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        // What the snapshots held, so that the comparison is not of empty figures.
        let (mut pinned, mut not_resident, mut overhead, mut sampled) = (0.0, 0, 0, 0);
        for round in 0..24 {
            let weighting = weightings[round % 3];
            let headers = if round % 2 == 0 {
                BlockHeaders::Glibc
            } else {
                BlockHeaders::None
            };
            let mut live = LiveTable::default();
            let mut pages = HeapPages::new(&live, 4096, headers);
            let (mut history_a, mut history_b) = (HeapHistory::default(), HeapHistory::default());
            let start = residency(&mut x, 0);
            for step in 0..4000u64 {
                let r = xorshift(&mut x);
                let base = if r & 1 == 0 { 0x100000 } else { 0x200000 };
                let addr = base + ((r >> 8) % (60 * 4096 / 16)) * 16;
                let size = match (r >> 40) % 16 {
                    0 => 0,
                    1 => 4096 * (1 + (r >> 50) % 14) + (r >> 20) % 64,
                    2..=4 => 1000 + (r >> 20) % 5000,
                    _ => 8 + (r >> 20) % 200,
                };
                if (r >> 33).is_multiple_of(3) {
                    if let Some(b) = live.remove(&addr) {
                        pages.apply(addr, &b, false);
                    }
                } else if !live.contains_key(&addr) {
                    let b = LiveBlock {
                        size,
                        rounding: ((r >> 28) % 24) as u32,
                        stack: ((r >> 36) % 5) as u32,
                        ..Default::default()
                    };
                    live.insert(addr, b);
                    pages.apply(addr, &b, true);
                }
                if step % 500 == 499 {
                    let pm = residency(&mut x, step);
                    let fork = (round % 4 == 1).then_some(&start);
                    let full = crate::heap::evaluate(
                        &live,
                        &pm,
                        fork,
                        &mut history_a,
                        weighting,
                        10,
                        headers,
                    );
                    let by_pages = pages.evaluate(&pm, fork, &mut history_b, weighting, 10);
                    assert_same(&full, &by_pages, &format!("round {round} step {step}"));
                    pinned += full.sites.iter().map(|s| s.pinned_pages).sum::<f64>();
                    not_resident += full.parts.live_not_resident;
                    overhead += full.parts.allocator_overhead;
                    if matches!(weighting, SiteWeighting::Sampled { .. }) {
                        sampled += full.sites.len();
                    }
                }
            }
        }
        assert!(pinned > 0.0 && not_resident > 0 && overhead > 0 && sampled > 0);
    }

    /// Every block taken away leaves no page behind: what a page keeps is what is on it.
    #[test]
    fn a_page_goes_with_its_last_block() {
        let mut live = LiveTable::default();
        let blocks = [(0x10ff0, 40), (0x11000, 24), (0x20010, 64 * 1024)];
        for (addr, size) in blocks {
            live.insert(
                addr,
                LiveBlock {
                    size,
                    rounding: 8,
                    stack: 1,
                    ..Default::default()
                },
            );
        }
        let mut pages = HeapPages::new(&live, 4096, BlockHeaders::Glibc);
        assert_eq!(pages.large.len(), 1);
        assert!(pages.pages.len() >= 4);
        for (addr, _) in blocks {
            let b = live.remove(&addr).unwrap();
            pages.apply(addr, &b, false);
        }
        assert!(pages.pages.is_empty(), "{:?}", pages.pages);
        assert!(pages.large.is_empty());
        // Nor any kind or place of their groups.
        let parts = &pages.group_parts;
        assert!(parts.kinds.index.is_empty() && parts.places.index.is_empty());
    }
}
