//! Segregated size classes (jemalloc/tcmalloc-like): a small request is rounded up to its
//! class and placed in a span (slab) of pages that holds only that class; a request above
//! the largest class gets its own span, rounded to the table's large granule. Within a
//! class, allocation takes the lowest-numbered span with room (jemalloc prefers its
//! oldest, lowest slab) and in it the lowest free slot. A span that becomes empty goes
//! back to the page heap, whose free pages are purged at once (`purge=immediate`), after
//! a delay of trace time (`purge=decay:MS`) or never; new spans reuse free resident pages
//! first. The page heap counts pages: contiguity between spans is not modelled.
//!
//! [`Slabs`] is also the engine of the compacting and mesh models, which move objects
//! between spans of a class.
//!
//! Settings: `classes=jemalloc|tcmalloc|8,16,32,...`, `page=4096`, `purge=immediate|
//! decay:MS|never`, `max_span_pages=8` (spans of a custom table).

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use super::{parse_u64, prefetch_line, unknown_key, Costs, Model, MoveEvent, Op, MAX_EVENTS};

/// What happens to the pages of an empty span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    Immediate,
    /// Purged after this many ms of trace time (reused before, if needed).
    Decay(u64),
    Never,
}

impl Purge {
    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "immediate" | "0" => Ok(Self::Immediate),
            "never" => Ok(Self::Never),
            _ => match v.strip_prefix("decay:") {
                Some(ms) => Ok(Self::Decay(parse_u64("purge=decay", ms)?)),
                None => Err(format!(
                    "purge={v}: expected immediate, decay:MS (e.g. decay:10000) or never"
                )),
            },
        }
    }
    pub fn describe(self) -> String {
        match self {
            Self::Immediate => "immediate".into(),
            Self::Decay(ms) => format!("decay:{ms}"),
            Self::Never => "never".into(),
        }
    }
}

/// A size-class table: class sizes and the bytes of a span of each class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassTable {
    pub name: String,
    pub sizes: Vec<u32>,
    pub span_bytes: Vec<u64>,
    /// Large requests are rounded up to this.
    pub large_granule: u64,
    /// (size + 7) / 8 -> class index, for sizes up to the largest class.
    lookup: Vec<u16>,
}

impl ClassTable {
    fn new(name: &str, sizes: Vec<u32>, span_bytes: Vec<u64>, large_granule: u64) -> Self {
        let max = *sizes.last().unwrap_or(&8) as usize;
        let mut lookup = vec![0u16; max.div_ceil(8) + 1];
        let mut c = 0;
        for (i, l) in lookup.iter_mut().enumerate() {
            while (sizes[c] as usize) < i * 8 {
                c += 1;
            }
            *l = c as u16;
        }
        Self {
            name: name.to_string(),
            sizes,
            span_bytes,
            large_granule,
            lookup,
        }
    }

    /// jemalloc 5's small classes for 4 KiB pages (8, 16, 32, 48, 64, 80, ..., 14336:
    /// four per doubling) with its slab sizes (the least common multiple of the page and
    /// the class); larger requests are page-rounded extents.
    pub fn jemalloc(page: u64) -> Self {
        let mut sizes: Vec<u32> = vec![8, 16, 32, 48, 64, 80, 96, 112, 128];
        let mut base = 128u32;
        while sizes
            .last()
            .is_some_and(|&s| u64::from(s) < 4 * page - page / 2)
        {
            let delta = base / 4;
            for k in 1..=4 {
                let s = base + k * delta;
                if u64::from(s) <= 4 * page - page / 2 {
                    sizes.push(s);
                }
            }
            base *= 2;
        }
        let span_bytes = sizes.iter().map(|&s| lcm_span(s, page, 64)).collect();
        Self::new("jemalloc", sizes, span_bytes, page)
    }

    /// gperftools tcmalloc's classes (8 KiB pages, up to 256 KiB) and span lengths, by its
    /// own construction: spans leave at most 1/8 unused and hold a transfer batch.
    pub fn tcmalloc() -> Self {
        const TC_PAGE: u64 = 8192;
        const MAX: u64 = 256 << 10;
        let mut sizes: Vec<u32> = Vec::new();
        let mut pages: Vec<u64> = Vec::new();
        let mut size = 8u64;
        let mut alignment;
        while size <= MAX {
            alignment = if size >= 128 {
                ((1u64 << (63 - size.leading_zeros())) / 8).min(TC_PAGE)
            } else if size >= 16 {
                16
            } else {
                8
            };
            let num_move = ((64.0 * 1024.0 / size as f64) as u64).clamp(2, 32);
            let blocks_to_move = num_move / 4;
            let mut psize = 0;
            loop {
                psize += TC_PAGE;
                while psize % size > psize >> 3 {
                    psize += TC_PAGE;
                }
                if psize / size >= blocks_to_move {
                    break;
                }
            }
            let my_pages = psize / TC_PAGE;
            let merged = match (sizes.last_mut(), pages.last()) {
                (Some(prev), Some(&pp))
                    if pp == my_pages
                        && (my_pages * TC_PAGE) / size == (pp * TC_PAGE) / u64::from(*prev) =>
                {
                    *prev = size as u32;
                    true
                }
                _ => false,
            };
            if !merged {
                sizes.push(size as u32);
                pages.push(my_pages);
            }
            size += alignment;
        }
        let span_bytes = pages.iter().map(|p| p * TC_PAGE).collect();
        Self::new("tcmalloc", sizes, span_bytes, TC_PAGE)
    }

    /// A custom list of class sizes; spans by jemalloc's rule, at most `max_pages` pages.
    pub fn custom(sizes: Vec<u32>, page: u64, max_pages: u64) -> Result<Self, String> {
        if sizes.is_empty() || sizes.windows(2).any(|w| w[0] >= w[1]) || sizes[0] == 0 {
            return Err("classes: give increasing sizes, e.g. classes=16,32,64,128".into());
        }
        if sizes.iter().any(|&s| u64::from(s) > max_pages * page) {
            return Err(format!(
                "classes: a class larger than max_span_pages ({max_pages}) pages"
            ));
        }
        let span_bytes = sizes
            .iter()
            .map(|&s| lcm_span(s, page, max_pages))
            .collect();
        let name = sizes
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",");
        Ok(Self::new(&name, sizes, span_bytes, page))
    }

    pub fn max_small(&self) -> u64 {
        u64::from(*self.sizes.last().unwrap_or(&0))
    }

    /// The class of a small request (size <= max_small).
    #[inline]
    pub fn class_of(&self, size: u64) -> usize {
        self.lookup[size.div_ceil(8) as usize] as usize
    }
}

/// The smallest span (in pages, at most `max_pages`) that divides evenly into `size`;
/// if none does, the one of those that wastes the least.
fn lcm_span(size: u32, page: u64, max_pages: u64) -> u64 {
    let size = u64::from(size);
    let first = size.div_ceil(page).max(1);
    for p in first..=max_pages.max(first) {
        if (p * page).is_multiple_of(size) {
            return p * page;
        }
    }
    (first..=max_pages.max(first))
        .map(|p| p * page)
        .min_by(|a, b| ((a % size) * b).cmp(&((b % size) * a)))
        .unwrap_or(first * page)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeClassConfig {
    pub page: u64,
    pub table: ClassTable,
    pub purge: Purge,
}

pub const SIZECLASS_KEYS: [&str; 4] = ["classes", "page", "purge", "max_span_pages"];

impl SizeClassConfig {
    /// Reads the size-class settings among `settings`; returns the others.
    pub fn from_settings_partial(
        settings: &[(String, String)],
        page: u64,
    ) -> Result<(Self, Vec<(String, String)>), String> {
        let mut page = page;
        let mut classes = "jemalloc".to_string();
        let mut purge = Purge::Immediate;
        let mut max_pages = 8;
        let mut rest = Vec::new();
        for (k, v) in settings {
            match k.as_str() {
                "classes" => classes = v.clone(),
                "page" => page = parse_u64(k, v)?,
                "purge" => purge = Purge::parse(v)?,
                "max_span_pages" => max_pages = parse_u64(k, v)?.clamp(1, 1024),
                _ => rest.push((k.clone(), v.clone())),
            }
        }
        if !(512..=1 << 30).contains(&page) || !page.is_power_of_two() {
            return Err(format!(
                "page={page}: expected a power of two from 512 to 1 GiB"
            ));
        }
        let table = match classes.as_str() {
            "jemalloc" => ClassTable::jemalloc(page),
            "tcmalloc" => ClassTable::tcmalloc(),
            list => {
                let sizes = list
                    .split([',', ' ', '/'])
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.parse::<u32>().map_err(|_| {
                            format!("classes={list}: expected jemalloc, tcmalloc or sizes")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                ClassTable::custom(sizes, page, max_pages)?
            }
        };
        Ok((Self { page, table, purge }, rest))
    }

    pub fn from_settings(settings: &[(String, String)], page: u64) -> Result<Self, String> {
        let (c, rest) = Self::from_settings_partial(settings, page)?;
        if let Some((k, _)) = rest.first() {
            return Err(unknown_key(k, &SIZECLASS_KEYS));
        }
        Ok(c)
    }

    pub fn describe(&self, out: &mut BTreeMap<String, String>) {
        out.insert("classes".into(), self.table.name.clone());
        out.insert("page".into(), self.page.to_string());
        out.insert("purge".into(), self.purge.describe());
        out.insert("small_classes".into(), self.table.sizes.len().to_string());
        out.insert(
            "largest_small_class".into(),
            self.table.max_small().to_string(),
        );
    }
}

const NONE: u32 = u32::MAX;
/// The class of a span that holds one large block.
const LARGE: u32 = u32::MAX;

#[derive(Debug, Clone, Default)]
pub(crate) struct Span {
    pub class: u32,
    pub nregs: u32,
    pub nfree: u32,
    pub bytes: u64,
    /// Bit per slot (1: used; bits past nregs are set).
    pub used: Vec<u64>,
    /// Slot -> block id.
    pub ids: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ClassState {
    /// Spans of this class with at least one free slot, by number.
    pub nonfull: BTreeSet<u32>,
    /// The first of `nonfull` (NONE when empty).
    cur: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Loc {
    span: u32,
    slot: u32,
}

/// Resident pages outside spans, waiting to be purged or reused.
#[derive(Debug, Clone, Default)]
struct PageHeap {
    active: u64,
    dirty: u64,
    /// (ms freed, bytes), oldest first.
    queue: VecDeque<(u64, u64)>,
    purged: u64,
}

/// xorshift64*: reproducible placement for the randomized models.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    #[inline]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Spans of size classes: the placement engine shared by the size-class models.
pub(crate) struct Slabs {
    pub cfg: SizeClassConfig,
    pub classes: Vec<ClassState>,
    pub spans: Vec<Span>,
    free_spans: BinaryHeap<std::cmp::Reverse<u32>>,
    blocks: Vec<Loc>,
    pages: PageHeap,
    /// Random slot choice within a span (mesh), or the lowest free slot.
    pub random: Option<Rng>,
    pub now_ms: u64,
    pub spans_created: u64,
}

impl Slabs {
    pub fn new(cfg: SizeClassConfig) -> Self {
        let n = cfg.table.sizes.len();
        Self {
            cfg,
            classes: vec![
                ClassState {
                    nonfull: BTreeSet::new(),
                    cur: NONE,
                };
                n
            ],
            spans: Vec::new(),
            free_spans: BinaryHeap::new(),
            blocks: Vec::new(),
            pages: PageHeap::default(),
            random: None,
            now_ms: 0,
            spans_created: 0,
        }
    }

    pub fn rss(&self) -> u64 {
        self.pages.active + self.pages.dirty
    }

    fn new_span(&mut self, class: u32, nregs: u32, bytes: u64) -> u32 {
        let id = match self.free_spans.pop() {
            Some(std::cmp::Reverse(id)) => id,
            None => {
                self.spans.push(Span::default());
                (self.spans.len() - 1) as u32
            }
        };
        self.spans_created += 1;
        let s = &mut self.spans[id as usize];
        s.class = class;
        s.nregs = nregs;
        s.nfree = nregs;
        s.bytes = bytes;
        let words = (nregs as usize).div_ceil(64);
        s.used.clear();
        s.used.resize(words, 0);
        if !nregs.is_multiple_of(64) {
            s.used[words - 1] = !0u64 << (nregs % 64);
        }
        s.ids.clear();
        s.ids.resize(nregs as usize, 0);
        // Pages: free resident ones first, the newest of them.
        let p = &mut self.pages;
        p.active += bytes;
        let mut need = bytes.min(p.dirty);
        p.dirty -= need;
        while need > 0 {
            let Some(back) = p.queue.back_mut() else {
                break;
            };
            let take = back.1.min(need);
            back.1 -= take;
            need -= take;
            if back.1 == 0 {
                p.queue.pop_back();
            }
        }
        id
    }

    fn release_span(&mut self, id: u32) {
        let bytes = self.spans[id as usize].bytes;
        let p = &mut self.pages;
        p.active -= bytes;
        match self.cfg.purge {
            Purge::Immediate => p.purged += bytes,
            Purge::Decay(_) | Purge::Never => {
                p.dirty += bytes;
                p.queue.push_back((self.now_ms, bytes));
            }
        }
        self.free_spans.push(std::cmp::Reverse(id));
    }

    fn insert_nonfull(&mut self, class: usize, span: u32) {
        let c = &mut self.classes[class];
        c.nonfull.insert(span);
        if c.cur == NONE || span < c.cur {
            c.cur = span;
        }
    }

    pub(crate) fn remove_nonfull(&mut self, class: usize, span: u32) {
        let c = &mut self.classes[class];
        c.nonfull.remove(&span);
        if c.cur == span {
            c.cur = c.nonfull.first().copied().unwrap_or(NONE);
        }
    }

    /// Takes a free slot of `span` (which has one) for block `id`.
    pub(crate) fn take_slot(&mut self, span: u32, id: u32) -> u32 {
        let s = &mut self.spans[span as usize];
        let slot = match &mut self.random {
            None => {
                let w = s.used.iter().position(|&w| w != !0).unwrap_or(0);
                w as u32 * 64 + (!s.used[w]).trailing_zeros()
            }
            Some(rng) => {
                let mut k = rng.below(u64::from(s.nfree)) as u32;
                let mut found = 0;
                for (w, &word) in s.used.iter().enumerate() {
                    let mut free = !word;
                    let n = free.count_ones();
                    if k < n {
                        for _ in 0..k {
                            free &= free - 1;
                        }
                        found = w as u32 * 64 + free.trailing_zeros();
                        break;
                    }
                    k -= n;
                }
                found
            }
        };
        s.used[(slot / 64) as usize] |= 1 << (slot % 64);
        s.ids[slot as usize] = id;
        s.nfree -= 1;
        slot
    }

    fn place(&mut self, id: u32, loc: Loc) {
        let i = id as usize;
        if i >= self.blocks.len() {
            self.blocks.resize(i + 1, Loc::default());
        }
        self.blocks[i] = loc;
    }

    pub fn alloc(&mut self, id: u32, size: u64) {
        let size = size.max(1);
        if size > self.cfg.table.max_small() {
            let bytes = size.next_multiple_of(self.cfg.table.large_granule);
            let span = self.new_span(LARGE, 1, bytes);
            let slot = self.take_slot(span, id);
            self.place(id, Loc { span, slot });
            return;
        }
        let class = self.cfg.table.class_of(size);
        let mut span = self.classes[class].cur;
        if span == NONE {
            let csize = u64::from(self.cfg.table.sizes[class]);
            let bytes = self.cfg.table.span_bytes[class];
            span = self.new_span(class as u32, (bytes / csize) as u32, bytes);
            self.insert_nonfull(class, span);
        }
        let slot = self.take_slot(span, id);
        if self.spans[span as usize].nfree == 0 {
            self.remove_nonfull(class, span);
        }
        self.place(id, Loc { span, slot });
    }

    /// Empties a slot; returns the span to the page heap when it becomes empty.
    pub(crate) fn clear_slot(&mut self, span: u32, slot: u32) {
        let s = &mut self.spans[span as usize];
        s.used[(slot / 64) as usize] &= !(1 << (slot % 64));
        s.nfree += 1;
        let (class, nfree, nregs) = (s.class, s.nfree, s.nregs);
        if class == LARGE {
            self.release_span(span);
            return;
        }
        if nfree == nregs {
            if nregs > 1 {
                self.remove_nonfull(class as usize, span);
            }
            self.release_span(span);
        } else if nfree == 1 {
            self.insert_nonfull(class as usize, span);
        }
    }

    pub fn free(&mut self, id: u32) {
        let Some(&loc) = self.blocks.get(id as usize) else {
            return;
        };
        self.clear_slot(loc.span, loc.slot);
    }

    /// Moves the block in (`from`, `slot`) to a free slot of span `to` (`to_slot`: that
    /// slot, or any free one).
    pub(crate) fn move_block(&mut self, from: u32, slot: u32, to: u32, to_slot: Option<u32>) {
        let id = self.spans[from as usize].ids[slot as usize];
        let new_slot = match to_slot {
            Some(t) => {
                let s = &mut self.spans[to as usize];
                s.used[(t / 64) as usize] |= 1 << (t % 64);
                s.ids[t as usize] = id;
                s.nfree -= 1;
                t
            }
            None => self.take_slot(to, id),
        };
        self.blocks[id as usize] = Loc {
            span: to,
            slot: new_slot,
        };
        // The source's slot is emptied without the span bookkeeping: callers release it.
        let s = &mut self.spans[from as usize];
        s.used[(slot / 64) as usize] &= !(1 << (slot % 64));
        s.nfree += 1;
    }

    /// A span emptied by moves: out of its class's lists and back to the page heap.
    pub(crate) fn retire(&mut self, span: u32) {
        let class = self.spans[span as usize].class as usize;
        self.remove_nonfull(class, span);
        self.release_span(span);
    }

    /// Used slots of a span.
    pub(crate) fn used_slots(&self, span: u32) -> Vec<u32> {
        let s = &self.spans[span as usize];
        let mut out = Vec::with_capacity((s.nregs - s.nfree) as usize);
        for (w, &word) in s.used.iter().enumerate() {
            let mut bits = word;
            if w == s.used.len() - 1 && !s.nregs.is_multiple_of(64) {
                bits &= (1u64 << (s.nregs % 64)) - 1;
            }
            while bits != 0 {
                out.push(w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        out
    }

    /// Brings in what `op` will touch: its block's location (stage 0); for a free, its
    /// span (stage 1) and the span's bitmap word (stage 2).
    #[inline]
    pub fn prefetch(&self, op: &Op, stage: u8) {
        let (id, free) = match *op {
            Op::Free { id, .. } => (id, true),
            Op::Alloc { id, .. } => (id, false),
            Op::Time { .. } => return,
        };
        let Some(loc) = self.blocks.get(id as usize) else {
            return;
        };
        if !free && stage > 0 {
            return; // an allocation writes its location only
        }
        match stage {
            0 => prefetch_line(loc),
            1 => {
                if let Some(s) = self.spans.get(loc.span as usize) {
                    prefetch_line(s);
                }
            }
            _ => {
                if let Some(w) = self
                    .spans
                    .get(loc.span as usize)
                    .and_then(|s| s.used.get((loc.slot / 64) as usize))
                {
                    prefetch_line(w);
                }
            }
        }
    }

    /// Purges pages freed long enough ago.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms = ms;
        if let Purge::Decay(d) = self.cfg.purge {
            let p = &mut self.pages;
            while let Some(&(t, bytes)) = p.queue.front() {
                if t + d > ms {
                    break;
                }
                p.queue.pop_front();
                p.dirty -= bytes;
                p.purged += bytes;
            }
        }
    }

    pub fn counters(&self, out: &mut BTreeMap<String, u64>) {
        out.insert("spans_created".into(), self.spans_created);
        out.insert("purged_bytes".into(), self.pages.purged);
        out.insert("free_resident_bytes".into(), self.pages.dirty);
    }
}

/// Size classes alone: the moving model without a pass.
pub(crate) type SizeClass = Moving<NoPass>;

impl SizeClass {
    pub fn new(cfg: SizeClassConfig) -> Self {
        Moving::with(NoPass, Slabs::new(cfg))
    }
}

/// The pass that never runs.
pub(crate) struct NoPass;

impl Pass for NoPass {
    fn period_ms(&self) -> Option<u64> {
        None
    }
    fn run(&mut self, _slabs: &mut Slabs) -> PassResult {
        PassResult::default()
    }
    fn describe(&self, _out: &mut BTreeMap<String, String>) {}
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    fn cfg(s: &[(&str, &str)]) -> SizeClassConfig {
        let s: Vec<(String, String)> = s
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        SizeClassConfig::from_settings(&s, 4096).unwrap()
    }

    #[test]
    fn jemalloc_table_and_slabs() {
        let t = ClassTable::jemalloc(4096);
        assert_eq!(
            &t.sizes[..12],
            &[8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224]
        );
        assert_eq!(t.max_small(), 14336);
        let span = |s: u32| t.span_bytes[t.sizes.iter().position(|&x| x == s).unwrap()];
        assert_eq!(span(64), 4096);
        assert_eq!(span(80), 5 * 4096);
        assert_eq!(span(48), 3 * 4096);
        assert_eq!(span(320), 5 * 4096);
        assert_eq!(t.sizes[t.class_of(288)], 320);
        assert_eq!(t.sizes[t.class_of(1)], 8);
        assert_eq!(t.sizes[t.class_of(8)], 8);
        assert_eq!(t.sizes[t.class_of(9)], 16);
    }

    #[test]
    fn tcmalloc_table() {
        let t = ClassTable::tcmalloc();
        for s in [
            8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 240, 256, 288,
        ] {
            assert!(t.sizes.contains(&s), "{s} in {:?}", t.sizes);
        }
        assert_eq!(t.max_small(), 256 << 10);
        assert_eq!(t.span_bytes[t.class_of(64)], 8192);
    }

    #[test]
    fn spans_are_returned_when_empty() {
        let mut m = SizeClass::new(cfg(&[]));
        play(&mut m, &allocs(640, 64)); // 10 spans of 64 slots
        assert_eq!(m.rss(), 10 * 4096);
        // Keep every tenth: every span stays.
        let ops: Vec<Op> = (0..640)
            .filter(|i| i % 10 != 0)
            .map(|i| free(i, 64))
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), 10 * 4096);
        // Free the survivors of the first 5 spans.
        let ops: Vec<Op> = (0..320)
            .filter(|i| i % 10 == 0)
            .map(|i| free(i, 64))
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), 5 * 4096);
        // Large blocks are page-rounded spans of their own.
        play(
            &mut m,
            &[Op::Alloc {
                id: 1000,
                tid: 1,
                size: 20000,
            }],
        );
        assert_eq!(m.rss(), 5 * 4096 + 20480);
        play(&mut m, &[free(1000, 20000)]);
        assert_eq!(m.rss(), 5 * 4096);
    }

    #[test]
    fn decay_keeps_free_pages_for_a_while_and_reuses_them() {
        let mut m = SizeClass::new(cfg(&[("purge", "decay:1000")]));
        play(&mut m, &allocs(128, 64));
        let mut ops: Vec<Op> = (0..64).map(|i| free(i, 64)).collect();
        ops.push(Op::Time { ms: 500 });
        let s = play(&mut m, &ops);
        assert_eq!(m.rss(), 2 * 4096, "{:?}", s.rss);
        play(
            &mut m,
            &[Op::Alloc {
                id: 0,
                tid: 1,
                size: 64,
            }],
        );
        assert_eq!(m.rss(), 2 * 4096, "reused the free page");
        play(&mut m, &[free(0, 64), Op::Time { ms: 1600 }]);
        assert_eq!(m.rss(), 4096);
    }

    #[test]
    fn bad_settings_are_explained() {
        let e = |k: &str, v: &str| {
            SizeClassConfig::from_settings(&[(k.to_string(), v.to_string())], 4096)
                .err()
                .unwrap()
        };
        assert!(e("purge", "sometimes").contains("decay:MS"));
        assert!(e("classes", "64,32").contains("increasing"));
        assert!(e("page", "1000").contains("power of two"));
        assert!(e("colour", "red").contains("known are"));
        let c = cfg(&[("classes", "16,32,64,96")]);
        assert_eq!(c.table.span_bytes[3], 3 * 4096);
    }
}

/// What one pass of a moving model did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassResult {
    pub bytes: u64,
    pub objects: u64,
    pub spans_freed: u64,
    pub meshes: u64,
}

/// A pass that moves blocks between the spans of size-class slabs, run every
/// `period_ms` of trace time: what the compacting and mesh models add to size classes.
pub(crate) trait Pass {
    /// How often it runs (never: none).
    fn period_ms(&self) -> Option<u64>;
    fn run(&mut self, slabs: &mut Slabs) -> PassResult;
    /// The pass's settings, beside the size classes'.
    fn describe(&self, out: &mut BTreeMap<String, String>);
}

/// Size classes plus a periodic [`Pass`], with its costs (bytes and objects moved, when).
pub(crate) struct Moving<P> {
    pub pass: P,
    pub slabs: Slabs,
    /// When the pass runs next.
    next_ms: Option<u64>,
    costs: Costs,
}

impl<P: Pass> Moving<P> {
    pub fn with(pass: P, slabs: Slabs) -> Self {
        Self {
            next_ms: pass.period_ms(),
            pass,
            slabs,
            costs: Costs::default(),
        }
    }
}

impl<P: Pass> Model for Moving<P> {
    fn alloc(&mut self, id: u32, size: u64, _tid: u32) {
        self.slabs.alloc(id, size);
    }
    fn free(&mut self, id: u32, _size: u64, _tid: u32) {
        self.slabs.free(id);
    }
    fn advance(&mut self, ms: u64) {
        while let Some(at) = self.next_ms.filter(|&at| at <= ms) {
            self.slabs.advance(at);
            let r = self.pass.run(&mut self.slabs);
            self.costs.passes += 1;
            self.costs.bytes_moved += r.bytes;
            self.costs.objects_moved += r.objects;
            self.costs.meshes += r.meshes;
            if (r.objects > 0 || r.meshes > 0) && self.costs.events.len() < MAX_EVENTS {
                self.costs.events.push(MoveEvent {
                    t_ms: at as f64,
                    bytes: r.bytes,
                    objects: r.objects,
                    spans_freed: r.spans_freed,
                });
            }
            self.next_ms = self.pass.period_ms().and_then(|p| at.checked_add(p));
        }
        self.slabs.advance(ms);
    }
    fn prefetch(&self, op: &Op, stage: u8) {
        self.slabs.prefetch(op, stage);
    }
    fn rss(&self) -> u64 {
        self.slabs.rss()
    }
    fn costs(&self) -> Costs {
        let mut c = self.costs.clone();
        self.slabs.counters(&mut c.counters);
        c
    }
    fn config(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        self.slabs.cfg.describe(&mut m);
        self.pass.describe(&mut m);
        m
    }
}
