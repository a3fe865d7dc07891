//! A ptmalloc2-like model (glibc's malloc), faithful where it decides RSS:
//! - chunks: the request plus an 8-byte header, 16-byte aligned, at least 32 bytes;
//! - per-thread tcache (7 chunks per size up to 1040 bytes) and fastbins (chunks up to
//!   128 bytes): LIFO, never coalesced while there; fastbins are consolidated when a
//!   large request (1024 bytes or more) comes, when the top cannot serve a request, or
//!   when a free coalesces to 64 KiB or more;
//! - other free chunks coalesce with free neighbours at once and are reused best-fit
//!   (smallest that fits, lowest address), split when the rest is at least 32 bytes;
//! - the top chunk grows the heap (plus `top_pad`) and is trimmed back to `top_pad` when
//!   it reaches `trim_threshold`; nothing else is returned: free chunks below a live one
//!   stay resident, so a heap whose top is pinned keeps its pages;
//! - requests of `mmap_threshold` or more that no free chunk or top can serve get their
//!   own mapping, returned at free; freeing one raises the thresholds (glibc's dynamic
//!   threshold, up to 32 MiB) unless `dynamic=false`;
//! - threads get arenas of their own up to `arena_max` (then share them round-robin); a
//!   chunk goes back to the arena it came from, through the freeing thread's tcache.
//!
//! Resident bytes: each arena's heap up to the highest byte handed out since its last
//! trim (every chunk is assumed written), plus the mappings.
//!
//! Settings: `mmap_threshold=128k`, `trim_threshold=128k`, `top_pad=128k`,
//! `dynamic=true`, `tcache_count=7`, `max_fast=128`, `arena_max=8`, `page`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use fragscope_trace::hash::FastMap;

use super::{parse_u64, prefetch_line, unknown_key, Costs, Model, Op};

const MINSIZE: u64 = 32;
const TCACHE_MAX_CHUNK: u64 = 1040;
const MIN_LARGE: u64 = 1024;
const CONSOLIDATION_THRESHOLD: u64 = 64 << 10;
const MMAP_THRESHOLD_MAX: u64 = 32 << 20;
const MMAPPED: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlibcConfig {
    pub page: u64,
    pub mmap_threshold: u64,
    pub trim_threshold: u64,
    pub top_pad: u64,
    pub dynamic: bool,
    pub tcache_count: u64,
    pub max_fast: u64,
    pub arena_max: u64,
}

const KEYS: [&str; 8] = [
    "mmap_threshold",
    "trim_threshold",
    "top_pad",
    "dynamic",
    "tcache_count",
    "max_fast",
    "arena_max",
    "page",
];

impl GlibcConfig {
    pub fn from_settings(settings: &[(String, String)], page: u64) -> Result<Self, String> {
        let mut c = Self {
            page,
            mmap_threshold: 128 << 10,
            trim_threshold: 128 << 10,
            top_pad: 128 << 10,
            dynamic: true,
            tcache_count: 7,
            max_fast: 128,
            arena_max: 8,
        };
        for (k, v) in settings {
            match k.as_str() {
                "mmap_threshold" => {
                    c.mmap_threshold = parse_u64(k, v)?;
                    c.dynamic = false; // as mallopt does
                }
                "trim_threshold" => {
                    c.trim_threshold = parse_u64(k, v)?;
                    c.dynamic = false;
                }
                "top_pad" => c.top_pad = parse_u64(k, v)?,
                "dynamic" => {
                    c.dynamic = match v.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(format!("dynamic={v}: expected true or false")),
                    }
                }
                "tcache_count" => c.tcache_count = parse_u64(k, v)?.min(65535),
                "max_fast" => {
                    let m = parse_u64(k, v)?;
                    if m > 160 {
                        return Err(format!("max_fast={m}: glibc allows at most 160"));
                    }
                    c.max_fast = (m + 8) & !15;
                }
                "arena_max" => c.arena_max = parse_u64(k, v)?.clamp(1, 1024),
                "page" => c.page = parse_u64(k, v)?,
                _ => return Err(unknown_key(k, &KEYS)),
            }
        }
        if !c.page.is_power_of_two() || c.page < 512 {
            return Err(format!("page={}: expected a power of two", c.page));
        }
        Ok(c)
    }
}

#[inline]
fn chunk_size(req: u64) -> u64 {
    ((req + 8 + 15) & !15).max(MINSIZE)
}

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    arena: u32,
    start: u64,
    size: u64,
}

/// Free chunks up to this size are kept in exact-size bins; larger ones in one ordered set.
const EXACT_MAX: u64 = 64 << 10;
const EXACT_BINS: usize = (EXACT_MAX / 16) as usize + 1;

/// Free chunks of one exact size: a min-heap of starts (lowest address first) whose
/// entries may be stale (the chunk was since coalesced or taken): an entry is valid while
/// a free chunk of this size starts there. `count` is the number of such chunks.
#[derive(Default, Clone)]
struct Bin {
    starts: BinaryHeap<Reverse<u64>>,
    count: u32,
}

struct Arena {
    /// End of the heap's mapped part.
    brk: u64,
    /// Start of the top chunk (it runs to `brk`).
    top: u64,
    /// End of the highest chunk handed out since the last trim: resident below.
    touched: u64,
    /// A bit per 16-byte granule in a coalesced free chunk. Free chunks are always
    /// coalesced with free neighbours, so each is a maximal run of set bits (fastbin and
    /// tcache chunks count as in use, as in glibc).
    free_bits: Vec<u64>,
    /// For best fit: exact-size bins (with a bitmap of the non-empty ones), and
    /// (size, start) above [`EXACT_MAX`].
    bins: Vec<Bin>,
    bin_map: Vec<u64>,
    by_size: BTreeSet<(u64, u64)>,
    /// Bytes in free chunks.
    free_bytes: u64,
    /// Fastbins by chunk size / 16 (chunk starts).
    fast: Vec<Vec<u64>>,
    fast_count: usize,
}

impl Arena {
    fn new(fast_bins: usize) -> Self {
        Self {
            brk: 0,
            top: 0,
            touched: 0,
            free_bits: Vec::new(),
            bins: vec![Bin::default(); EXACT_BINS],
            bin_map: vec![0; EXACT_BINS.div_ceil(64)],
            by_size: BTreeSet::new(),
            free_bytes: 0,
            fast: vec![Vec::new(); fast_bins],
            fast_count: 0,
        }
    }

    #[inline]
    fn is_free(&self, g: u64) -> bool {
        self.free_bits
            .get((g / 64) as usize)
            .is_some_and(|w| w & (1 << (g % 64)) != 0)
    }

    /// Sets (`on`) or clears the bits of granules `lo..hi`.
    fn mark(&mut self, lo: u64, hi: u64, on: bool) {
        if lo >= hi {
            return;
        }
        let need = hi.div_ceil(64) as usize;
        if self.free_bits.len() < need {
            self.free_bits.resize(need.next_power_of_two(), 0);
        }
        let mut g = lo;
        while g < hi {
            let w = (g / 64) as usize;
            let first = g % 64;
            let n = (hi - g).min(64 - first);
            let mask = if n == 64 {
                !0
            } else {
                ((1u64 << n) - 1) << first
            };
            if on {
                self.free_bits[w] |= mask;
            } else {
                self.free_bits[w] &= !mask;
            }
            g += n;
        }
    }

    /// The first granule at or after `g` that is not free.
    fn run_end(&self, g: u64) -> u64 {
        let mut w = (g / 64) as usize;
        let Some(&first) = self.free_bits.get(w) else {
            return g;
        };
        let mut bits = !first & (!0u64 << (g % 64));
        loop {
            if bits != 0 {
                return w as u64 * 64 + u64::from(bits.trailing_zeros());
            }
            w += 1;
            match self.free_bits.get(w) {
                Some(&x) => bits = !x,
                None => return w as u64 * 64,
            }
        }
    }

    /// The first granule of the free run that holds granule `g` (which is free).
    fn run_start(&self, g: u64) -> u64 {
        let mut w = (g / 64) as usize;
        let keep = g % 64;
        let mask = if keep == 63 {
            !0
        } else {
            (1u64 << (keep + 1)) - 1
        };
        let mut bits = !self.free_bits[w] & mask;
        loop {
            if bits != 0 {
                return w as u64 * 64 + 64 - u64::from(bits.leading_zeros());
            }
            if w == 0 {
                return 0;
            }
            w -= 1;
            bits = !self.free_bits[w];
        }
    }

    /// Whether a coalesced free chunk of `size` bytes starts at `start`.
    fn free_chunk_at(&self, start: u64, size: u64) -> bool {
        let g = start / 16;
        self.is_free(g) && (g == 0 || !self.is_free(g - 1)) && self.run_end(g) == g + size / 16
    }

    /// Lists a free chunk (its bits are set by the caller).
    fn insert_free(&mut self, start: u64, size: u64) {
        self.free_bytes += size;
        if size <= EXACT_MAX {
            let b = (size / 16) as usize;
            let bin = &mut self.bins[b];
            bin.starts.push(Reverse(start));
            bin.count += 1;
            self.bin_map[b / 64] |= 1 << (b % 64);
            if bin.starts.len() > 4 * bin.count as usize + 1024 {
                // Drop the stale entries (and duplicates of valid ones).
                let mut v = std::mem::take(&mut self.bins[b].starts).into_vec();
                v.retain(|Reverse(s)| self.free_chunk_at(*s, size));
                v.sort_unstable();
                v.dedup();
                self.bins[b].starts = BinaryHeap::from(v);
            }
        } else {
            self.by_size.insert((size, start));
        }
    }

    /// Unlists a free chunk (its bits are left to the caller).
    fn remove_free(&mut self, start: u64, size: u64) {
        self.free_bytes -= size;
        if size <= EXACT_MAX {
            let b = (size / 16) as usize;
            let bin = &mut self.bins[b];
            bin.count -= 1;
            if bin.count == 0 {
                bin.starts.clear();
                self.bin_map[b / 64] &= !(1 << (b % 64));
            }
        } else {
            self.by_size.remove(&(size, start));
        }
    }

    /// The first non-empty exact bin at or above `b`.
    fn next_bin(&self, b: usize) -> Option<usize> {
        let mut w = b / 64;
        let mut bits = self.bin_map.get(w)? & (!0u64 << (b % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *self.bin_map.get(w)?;
        }
    }

    /// Frees a chunk with coalescing; returns the size of the chunk it became (the top's
    /// size when it joined the top).
    fn free_chunk(&mut self, start: u64, size: u64) -> u64 {
        let g = start / 16;
        let mut merged_start = start;
        if g > 0 && self.is_free(g - 1) {
            merged_start = self.run_start(g - 1) * 16;
            self.remove_free(merged_start, start - merged_start);
        }
        let end = start + size;
        if end == self.top {
            self.mark(merged_start / 16, g, false);
            self.top = merged_start;
            return self.brk - self.top;
        }
        let mut merged_end = end;
        if self.is_free(end / 16) {
            merged_end = self.run_end(end / 16) * 16;
            self.remove_free(end, merged_end - end);
        }
        self.mark(g, end / 16, true);
        self.insert_free(merged_start, merged_end - merged_start);
        merged_end - merged_start
    }

    /// The smallest free chunk that fits `nb` (the lowest among equals), split when the
    /// rest makes a chunk; returns its start and the bytes handed out.
    fn best_fit(&mut self, nb: u64) -> Option<(u64, u64)> {
        let mut found = None;
        if nb <= EXACT_MAX {
            if let Some(b) = self.next_bin((nb / 16) as usize) {
                let size = b as u64 * 16;
                while let Some(Reverse(start)) = self.bins[b].starts.pop() {
                    if self.free_chunk_at(start, size) {
                        found = Some((size, start));
                        break;
                    }
                }
            }
        }
        let (size, start) = match found {
            Some(f) => f,
            None => *self.by_size.range((nb.max(EXACT_MAX + 1), 0)..).next()?,
        };
        self.remove_free(start, size);
        if size - nb >= MINSIZE {
            self.mark(start / 16, (start + nb) / 16, false);
            self.insert_free(start + nb, size - nb);
            Some((start, nb))
        } else {
            self.mark(start / 16, (start + size) / 16, false);
            Some((start, size))
        }
    }
}

pub struct Glibc {
    cfg: GlibcConfig,
    arenas: Vec<Arena>,
    thread_arena: FastMap<u32, u32>,
    threads_seen: u32,
    /// Per thread: tcache bins by chunk size / 16, of (arena, start).
    tcache: FastMap<u32, Vec<Vec<(u32, u64)>>>,
    blocks: Vec<Block>,
    mmapped: u64,
    mmap_threshold: u64,
    trim_threshold: u64,
    resident: u64,
    mmaps: u64,
    trims: u64,
    consolidations: u64,
}

impl Glibc {
    pub fn new(cfg: GlibcConfig) -> Self {
        Self {
            mmap_threshold: cfg.mmap_threshold,
            trim_threshold: cfg.trim_threshold,
            cfg,
            arenas: Vec::new(),
            thread_arena: FastMap::default(),
            threads_seen: 0,
            tcache: FastMap::default(),
            blocks: Vec::new(),
            mmapped: 0,
            resident: 0,
            mmaps: 0,
            trims: 0,
            consolidations: 0,
        }
    }

    fn arena_of(&mut self, tid: u32) -> u32 {
        if let Some(&a) = self.thread_arena.get(&tid) {
            return a;
        }
        let a = (u64::from(self.threads_seen) % self.cfg.arena_max) as u32;
        self.threads_seen += 1;
        self.thread_arena.insert(tid, a);
        while self.arenas.len() <= a as usize {
            self.arenas
                .push(Arena::new((self.cfg.max_fast / 16 + 1) as usize));
        }
        a
    }

    /// Resident bytes of an arena.
    fn arena_resident(&self, a: usize) -> u64 {
        self.arenas[a].touched.next_multiple_of(self.cfg.page)
    }

    /// Runs `f` on arena `a`, keeping the resident total up to date.
    fn with_arena<R>(&mut self, a: u32, f: impl FnOnce(&mut Arena, &GlibcConfig) -> R) -> R {
        let before = self.arena_resident(a as usize);
        let r = f(&mut self.arenas[a as usize], &self.cfg);
        let after = self.arena_resident(a as usize);
        self.resident = self.resident + after - before;
        r
    }

    fn consolidate(&mut self, a: u32) {
        self.consolidations += 1;
        self.with_arena(a, |ar, _| {
            let mut fast = std::mem::take(&mut ar.fast);
            for (i, bin) in fast.iter_mut().enumerate() {
                for start in bin.drain(..) {
                    ar.free_chunk(start, i as u64 * 16);
                }
            }
            ar.fast = fast;
            ar.fast_count = 0;
        });
    }

    /// glibc's systrim / heap_trim: gives back the top above `top_pad`.
    fn trim(&mut self, a: u32) {
        let threshold = self.trim_threshold;
        let trimmed = self.with_arena(a, |ar, cfg| {
            let top_size = ar.brk - ar.top;
            if top_size < threshold || top_size <= cfg.top_pad + MINSIZE + 1 {
                return false;
            }
            let extra = (top_size - cfg.top_pad - MINSIZE - 1) / cfg.page * cfg.page;
            if extra == 0 {
                return false;
            }
            ar.brk -= extra;
            ar.touched = ar.touched.min(ar.brk);
            true
        });
        self.trims += u64::from(trimmed);
    }

    fn malloc_in_arena(&mut self, a: u32, nb: u64, req: u64) -> Block {
        let fast_idx = (nb / 16) as usize;
        if nb <= self.cfg.max_fast {
            let ar = &mut self.arenas[a as usize];
            if let Some(start) = ar.fast[fast_idx].pop() {
                ar.fast_count -= 1;
                return Block {
                    arena: a,
                    start,
                    size: nb,
                };
            }
        }
        if nb >= MIN_LARGE && self.arenas[a as usize].fast_count > 0 {
            self.consolidate(a);
        }
        for attempt in 0..2 {
            let ar = &mut self.arenas[a as usize];
            if let Some((start, size)) = ar.best_fit(nb) {
                return Block {
                    arena: a,
                    start,
                    size,
                };
            }
            if ar.brk - ar.top >= nb + MINSIZE {
                return self.carve_top(a, nb);
            }
            if attempt == 0 && ar.fast_count > 0 {
                self.consolidate(a);
            } else {
                break;
            }
        }
        if nb >= self.mmap_threshold {
            let bytes = (nb + 8).next_multiple_of(self.cfg.page);
            self.mmapped += bytes;
            self.mmaps += 1;
            let _ = req;
            return Block {
                arena: MMAPPED,
                start: 0,
                size: bytes,
            };
        }
        let (pad, page) = (self.cfg.top_pad, self.cfg.page);
        let ar = &mut self.arenas[a as usize];
        ar.brk = (ar.top + nb + MINSIZE + pad).next_multiple_of(page);
        self.carve_top(a, nb)
    }

    fn carve_top(&mut self, a: u32, nb: u64) -> Block {
        let start = self.with_arena(a, |ar, _| {
            let start = ar.top;
            ar.top += nb;
            ar.touched = ar.touched.max(ar.top);
            start
        });
        Block {
            arena: a,
            start,
            size: nb,
        }
    }
}

impl Model for Glibc {
    fn alloc(&mut self, id: u32, size: u64, tid: u32) {
        let nb = chunk_size(size);
        let mut block = None;
        if nb <= TCACHE_MAX_CHUNK && self.cfg.tcache_count > 0 {
            if let Some(tc) = self.tcache.get_mut(&tid) {
                if let Some((arena, start)) = tc[(nb / 16) as usize].pop() {
                    block = Some(Block {
                        arena,
                        start,
                        size: nb,
                    });
                }
            }
        }
        let block = match block {
            Some(b) => b,
            None => {
                let a = self.arena_of(tid);
                self.malloc_in_arena(a, nb, size)
            }
        };
        let i = id as usize;
        if i >= self.blocks.len() {
            self.blocks.resize(i + 1, Block::default());
        }
        self.blocks[i] = block;
    }

    fn free(&mut self, id: u32, _size: u64, tid: u32) {
        let Some(&b) = self.blocks.get(id as usize) else {
            return;
        };
        if b.arena == MMAPPED {
            self.mmapped -= b.size;
            if self.cfg.dynamic && b.size > self.mmap_threshold && b.size <= MMAP_THRESHOLD_MAX {
                self.mmap_threshold = b.size;
                self.trim_threshold = 2 * b.size;
            }
            return;
        }
        if b.size <= TCACHE_MAX_CHUNK && self.cfg.tcache_count > 0 {
            let tc = self
                .tcache
                .entry(tid)
                .or_insert_with(|| vec![Vec::new(); (TCACHE_MAX_CHUNK / 16 + 1) as usize]);
            let bin = &mut tc[(b.size / 16) as usize];
            if (bin.len() as u64) < self.cfg.tcache_count {
                bin.push((b.arena, b.start));
                return;
            }
        }
        if b.size <= self.cfg.max_fast {
            let ar = &mut self.arenas[b.arena as usize];
            ar.fast[(b.size / 16) as usize].push(b.start);
            ar.fast_count += 1;
            return;
        }
        let merged = self.with_arena(b.arena, |ar, _| ar.free_chunk(b.start, b.size));
        if merged >= CONSOLIDATION_THRESHOLD {
            if self.arenas[b.arena as usize].fast_count > 0 {
                self.consolidate(b.arena);
            }
            self.trim(b.arena);
        }
    }

    fn advance(&mut self, _ms: u64) {}

    fn prefetch(&self, op: &Op, stage: u8) {
        if let (Op::Free { id, .. } | Op::Alloc { id, .. }, 0) = (*op, stage) {
            if let Some(b) = self.blocks.get(id as usize) {
                prefetch_line(b);
            }
        }
    }

    fn rss(&self) -> u64 {
        self.resident + self.mmapped
    }

    fn costs(&self) -> Costs {
        let mut c = Costs::default();
        let free: u64 = self.arenas.iter().map(|a| a.free_bytes).sum();
        c.counters = BTreeMap::from([
            ("arenas".to_string(), self.arenas.len() as u64),
            ("mmaps".to_string(), self.mmaps),
            ("trims".to_string(), self.trims),
            ("consolidations".to_string(), self.consolidations),
            ("free_chunk_bytes".to_string(), free),
            ("mmap_threshold".to_string(), self.mmap_threshold),
        ]);
        c
    }

    fn config(&self) -> BTreeMap<String, String> {
        let c = &self.cfg;
        BTreeMap::from([
            ("mmap_threshold".to_string(), c.mmap_threshold.to_string()),
            ("trim_threshold".to_string(), c.trim_threshold.to_string()),
            ("top_pad".to_string(), c.top_pad.to_string()),
            ("dynamic".to_string(), c.dynamic.to_string()),
            ("tcache_count".to_string(), c.tcache_count.to_string()),
            ("max_fast".to_string(), c.max_fast.to_string()),
            ("arena_max".to_string(), c.arena_max.to_string()),
            ("page".to_string(), c.page.to_string()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Op;
    use super::*;

    fn glibc(s: &[(&str, &str)]) -> Glibc {
        let s: Vec<(String, String)> = s
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Glibc::new(GlibcConfig::from_settings(&s, 4096).unwrap())
    }

    #[test]
    fn free_runs_coalesce_across_bitmap_words() {
        let mut a = Arena::new(9);
        a.top = 1 << 20;
        a.brk = 1 << 20;
        // Freed pieces join into maximal runs (granules 60..130 span three words).
        assert_eq!(a.free_chunk(1008, 1024), 1024);
        assert_eq!(a.free_chunk(2032, 48), 1072, "joins its left neighbour");
        assert_eq!(a.free_chunk(960, 48), 1120, "and its right one");
        assert!(a.free_chunk_at(960, 1120));
        assert!(!a.free_chunk_at(1008, 1024), "no longer a chunk of its own");
        assert_eq!(a.run_start(2079 / 16), 60);
        assert_eq!(a.run_end(60), 130);
        assert_eq!(a.free_bytes, 1120);
        // Best fit splits the lowest chunk that fits and keeps the rest listed.
        assert_eq!(a.best_fit(64), Some((960, 64)));
        assert!(a.free_chunk_at(1024, 1056));
        assert_eq!(
            a.best_fit(1040),
            Some((1024, 1056)),
            "a rest under 32 bytes goes along"
        );
        assert_eq!(a.free_bytes, 0);
        assert_eq!(a.best_fit(16), None);
        // A chunk that ends at the top joins it.
        a.top = 4096;
        assert_eq!(a.free_chunk(3904, 192), a.brk - 3904);
        assert_eq!(a.top, 3904);
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size(0), 32);
        assert_eq!(chunk_size(24), 32);
        assert_eq!(chunk_size(25), 48);
        assert_eq!(chunk_size(64), 80);
    }

    #[test]
    fn a_pinned_top_keeps_the_heap_and_a_free_top_is_trimmed() {
        // 1000 chunks of 1008 bytes (no fastbins, past tcache once its 7 are full).
        let mut m = glibc(&[]);
        play(&mut m, &allocs(1000, 1000));
        let full = m.rss();
        assert!(
            (1000 * 1008..1000 * 1008 + (132 << 10)).contains(&full),
            "{full}"
        );
        // Free all but the last: the last pins the top, nothing goes back.
        let ops: Vec<Op> = (0..999).map(|i| free(i, 1000)).collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), full);
        // Freeing the last coalesces everything into the top, which is trimmed to top_pad;
        // only the tcache's 7 chunks (and the tcache itself) stay below it.
        play(&mut m, &[free(999, 1000)]);
        assert!(m.rss() <= (128 << 10) + 8 * 1008 + 4096, "{}", m.rss());
        assert!(m.costs().counters["trims"] >= 1);
    }

    #[test]
    fn fastbins_do_not_coalesce_until_consolidated() {
        let mut m = glibc(&[("tcache_count", "0")]);
        play(&mut m, &allocs(10000, 64));
        let full = m.rss();
        let ops: Vec<Op> = (0..10000).map(|i| free(i, 64)).collect();
        play(&mut m, &ops);
        assert_eq!(m.rss(), full, "fast chunks stay where they are");
        // A large request consolidates them into the top, and a large free trims it.
        play(
            &mut m,
            &[
                Op::Alloc {
                    id: 0,
                    tid: 1,
                    size: 2000,
                },
                Op::Alloc {
                    id: 1,
                    tid: 1,
                    size: 70000,
                },
                free(1, 70000),
            ],
        );
        assert!(m.rss() < full / 2, "{} of {full}", m.rss());
    }

    #[test]
    fn big_blocks_are_mapped_and_raise_the_threshold() {
        let mut m = glibc(&[]);
        play(
            &mut m,
            &[
                Op::Time { ms: 0 },
                Op::Alloc {
                    id: 0,
                    tid: 1,
                    size: 1 << 20,
                },
            ],
        );
        assert_eq!(m.rss(), (1 << 20) + 4096);
        play(&mut m, &[free(0, 1 << 20)]);
        assert_eq!(m.rss(), 0);
        assert_eq!(m.costs().counters["mmap_threshold"], (1 << 20) + 4096);
        // The same size now comes from the heap.
        play(
            &mut m,
            &[Op::Alloc {
                id: 0,
                tid: 1,
                size: 1 << 20,
            }],
        );
        assert_eq!(m.costs().counters["mmaps"], 1);
    }

    #[test]
    fn threads_get_arenas() {
        let mut m = glibc(&[("arena_max", "2")]);
        let ops: Vec<Op> = (0..3)
            .map(|t| Op::Alloc {
                id: t,
                tid: 10 + t,
                size: 100,
            })
            .collect();
        play(&mut m, &ops);
        assert_eq!(m.costs().counters["arenas"], 2);
        let e = GlibcConfig::from_settings(&[("max_fast".into(), "500".into())], 4096);
        assert!(e.unwrap_err().contains("160"));
    }
}
