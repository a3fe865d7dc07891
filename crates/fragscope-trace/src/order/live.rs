//! The live blocks of one process's merge ([`LiveTable`]), and what a forked child starts
//! from ([`InheritedHeap`]).
//!
//! A child starts from its parent's live blocks at the fork. Copying them cost a whole
//! table per child: a parent with 2 million blocks forking 8 workers held 9 copies. So at
//! a fork the parent's table is frozen instead, shared (an `Arc`) by the parent and every
//! child forked while it holds; each table that holds it keeps the addresses of its
//! blocks that ended there since (`gone`) and its own blocks beside it. A table that
//! freed most of what it shares, or whose own blocks dwarf it, copies what is left into
//! its own (`flatten`).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use allocator_api2::alloc::{AllocError, Allocator, Global};

use crate::format::hash::{addr_hash, AddrSet, FastMap};

/// A block that is live after the merged calls so far: what the model needs of it.
/// Kept small (24 bytes) because a heap can hold hundreds of millions of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveBlock {
    /// Requested bytes.
    pub size: u64,
    /// Usable minus requested bytes (0 when the allocator did not say).
    pub rounding: u32,
    /// Process stack index (0: not sampled).
    pub stack: u32,
    /// Tick of the allocation.
    pub born_tick: u32,
    /// Allocated before this process was forked, by the process it was forked from.
    pub inherited: bool,
}

const _: () = assert!(std::mem::size_of::<LiveBlock>() == 24);

impl LiveBlock {
    pub fn usable(&self) -> u64 {
        self.size + u64::from(self.rounding)
    }
}

/// Marks the stack ids of inherited blocks ([`InheritedHeap`]): their frames are the
/// parent's, kept apart from the ids the process's own decoder hands out from 1.
pub(crate) const INHERITED_STACK: u32 = 1 << 31;

/// Whether `stack` is the stack of a block inherited at a fork (its frames in
/// [`crate::order::merge::Merger::stack`] as any other's, but no allocation of this process has
/// it).
pub fn is_inherited_stack(stack: u32) -> bool {
    stack & INHERITED_STACK != 0
}

type Blocks = hashbrown::HashTable<(u64, LiveBlock), HugePages>;

/// Memory of the live blocks' tables: a table of 4 MiB or more on huge pages (2 MiB,
/// asked with madvise: the kernel's transparent huge pages are "madvise" by default on
/// Debian, and glibc asks for none). Each free looks up a block anywhere in the table,
/// two cache misses (its control bytes, then the block), each also a TLB miss once the
/// table spans thousands of 4 KiB pages: over a million live blocks that made the report
/// 10-15% slower. Smaller tables are the global allocator's as they are.
///
/// Also where the table it serves lies, for [`LiveTable::prefetch`].
#[derive(Default, Debug)]
pub struct HugePages {
    /// The table's control bytes (see `held`), 0 while it has no memory.
    ctrl: AtomicUsize,
    /// Its buckets less one.
    bucket_mask: AtomicUsize,
}

/// A clone serves another table (a table's clone allocates through its allocator's).
impl Clone for HugePages {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl HugePages {
    const PAGE: usize = 2 << 20;

    /// How an allocation of `layout` is asked of the global allocator: a big one aligned
    /// to a huge page, so that all its whole huge pages can be.
    fn placed(layout: Layout) -> Layout {
        if layout.size() < 2 * Self::PAGE {
            return layout;
        }
        Layout::from_size_align(layout.size(), layout.align().max(Self::PAGE)).unwrap_or(layout)
    }

    /// Notes the table's memory, `bytes` at `start`: hashbrown 0.15 lays out a table of
    /// `n` buckets (a power of two) of `(u64, LiveBlock)` as the buckets (the first
    /// last), then `n` + 16 control bytes. Memory of any other size is not noted: only a
    /// prefetch reads what is noted, and a prefetch of a wrong address costs nothing but
    /// the prefetch.
    fn held(&self, start: usize, bytes: usize) {
        const BUCKET: usize = size_of::<(u64, LiveBlock)>();
        let buckets = bytes.saturating_sub(16) / (BUCKET + 1);
        let ours = buckets.is_power_of_two() && buckets * (BUCKET + 1) + 16 == bytes;
        let ctrl = if ours { start + buckets * BUCKET } else { 0 };
        self.ctrl.store(ctrl, Ordering::Relaxed);
        self.bucket_mask
            .store(buckets.saturating_sub(1), Ordering::Relaxed);
    }

    /// Asks for the cache lines of the control byte and the bucket where the probe of
    /// `hash` starts (where its block usually is: the table is at most 7/8 full).
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        let ctrl = self.ctrl.load(Ordering::Relaxed);
        if ctrl == 0 {
            return;
        }
        let i = hash as usize & self.bucket_mask.load(Ordering::Relaxed);
        let bucket = ctrl.wrapping_sub((i + 1) * size_of::<(u64, LiveBlock)>());
        prefetch(ctrl.wrapping_add(i));
        prefetch(bucket);
    }
}

/// Asks for the cache line at `addr` ahead of its use. Never faults: any address will do.
#[inline(always)]
fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

// SAFETY: every allocation is Global's, of the layout `placed` gives, both ways.
unsafe impl Allocator for HugePages {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let placed = Self::placed(layout);
        let block = Global.allocate(placed)?;
        if placed.align() >= Self::PAGE {
            let whole = placed.size() & !(Self::PAGE - 1);
            // SAFETY: advice on memory just allocated, huge-page aligned, that the
            // allocation holds; the kernel may ignore it.
            unsafe { libc::madvise(block.as_ptr().cast(), whole, libc::MADV_HUGEPAGE) };
        }
        self.held(block.as_ptr().cast::<u8>() as usize, layout.size());
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // The memory noted goes (the table dropped; a table that grows has its new
        // memory noted before the old goes).
        let ctrl = self.ctrl.load(Ordering::Relaxed);
        let buckets = self.bucket_mask.load(Ordering::Relaxed).wrapping_add(1);
        if ctrl != 0 && ptr.as_ptr() as usize == ctrl - buckets * size_of::<(u64, LiveBlock)>() {
            self.held(0, 0);
        }
        // SAFETY: allocated by `allocate` with the same `layout`.
        unsafe { Global.deallocate(ptr, Self::placed(layout)) }
    }
}

/// The live blocks by address, in hashbrown's table with the locality hash. A block is
/// read where it lies before its bucket is emptied: `HashMap::remove` returned it through
/// memory, stored in pieces narrower than the copy that read it back (a store-forwarding
/// stall, a third of the merge's time on `--stacks all` traces).
///
/// After a fork, part of the blocks may be shared with the other processes of the fork
/// (see the module's comment); blocks are then handed out by value, as this table sees
/// them.
#[derive(Default, Clone, Debug)]
pub struct LiveTable {
    own: Blocks,
    shared: Option<Shared>,
}

/// Blocks frozen at a fork, as one table that holds them sees them.
#[derive(Clone, Debug)]
struct Shared {
    base: Arc<Base>,
    /// Addresses of `base`'s blocks that are no longer live in this table.
    gone: AddrSet,
    /// Requested and usable bytes of the `gone` blocks.
    gone_bytes: (u64, u64),
    /// `None` in the table that froze them (its own blocks, as they are); in a child's,
    /// the names of their stacks there: each block is inherited.
    inherited: Option<Arc<InheritedStacks>>,
}

#[derive(Debug)]
struct Base {
    blocks: Blocks,
    /// Requested and usable bytes of all of `blocks`.
    bytes: (u64, u64),
    /// The blocks' stacks as a child names them, made at the first fork that hands the
    /// base on and the same for every later child (see [`InheritedStacks`]).
    stacks: OnceLock<Arc<InheritedStacks>>,
}

/// The stacks of a base's blocks in a child's table of inherited stacks: each stack the
/// blocks carry, by order of first appearance among them, with its frames. A child's
/// inherited stack `INHERITED_STACK | i` is `frames[i]` for `i` below their number, and
/// one of its own extra ones above (the parent's blocks beside the base).
#[derive(Debug, Default)]
pub(crate) struct InheritedStacks {
    index: FastMap<u32, u32>,
    pub(crate) frames: Vec<Vec<u64>>,
}

impl InheritedStacks {
    fn of<'f>(blocks: &Blocks, frames_of: &impl Fn(u32) -> &'f [u64]) -> Self {
        let mut s = Self::default();
        for (_, b) in blocks.iter() {
            if b.stack != 0 && !s.index.contains_key(&b.stack) {
                s.index.insert(b.stack, s.frames.len() as u32);
                s.frames.push(frames_of(b.stack).to_vec());
            }
        }
        s
    }
}

impl Shared {
    /// Block `b` of the base as this table sees it.
    #[inline(always)]
    fn view(&self, b: LiveBlock) -> LiveBlock {
        match &self.inherited {
            None => b,
            Some(stacks) => LiveBlock {
                inherited: true,
                stack: match b.stack {
                    0 => 0,
                    s => INHERITED_STACK | stacks.index[&s],
                },
                ..b
            },
        }
    }

    /// The base's block at `addr`, if it is still live here.
    #[inline]
    fn get(&self, addr: u64) -> Option<LiveBlock> {
        let &(_, b) = self.base.blocks.find(addr_hash(addr), |e| e.0 == addr)?;
        (self.gone.is_empty() || !self.gone.contains(&addr)).then(|| self.view(b))
    }

    /// Ends the base's block at `addr` here, if it is live.
    fn take(&mut self, addr: u64) -> Option<LiveBlock> {
        let b = self.get(addr)?;
        self.gone.insert(addr);
        self.gone_bytes.0 += b.size;
        self.gone_bytes.1 += b.usable();
        Some(b)
    }

    fn len(&self) -> usize {
        self.base.blocks.len() - self.gone.len()
    }

    /// Time to copy what is left of the base: most of it ended here (the rest is
    /// smaller than the addresses kept of what ended), or the table's own blocks dwarf
    /// it (a copy adds little, and saves a probe of the base per allocation).
    fn outgrown(&self, own: usize) -> bool {
        let base = self.base.blocks.len();
        self.gone.len() * 2 > base || own > 2 * base
    }
}

impl LiveTable {
    pub fn len(&self) -> usize {
        self.own.len() + self.shared.as_ref().map_or(0, Shared::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries a clone copies: its own blocks, and the addresses of shared blocks that
    /// ended here. It shares the rest ([`LiveTable::shared_len`]).
    pub fn clone_cost(&self) -> usize {
        self.own.len() + self.shared.as_ref().map_or(0, |s| s.gone.len())
    }

    /// Blocks the table shares with the other processes of a fork (those ended here
    /// included).
    pub fn shared_len(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.base.blocks.len())
    }

    /// Whether the two tables share the same blocks of a fork.
    pub fn shares_with(&self, other: &LiveTable) -> bool {
        match (&self.shared, &other.shared) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a.base, &b.base),
            _ => false,
        }
    }

    #[inline]
    pub fn contains_key(&self, addr: &u64) -> bool {
        self.get(addr).is_some()
    }

    #[inline]
    pub fn get(&self, addr: &u64) -> Option<LiveBlock> {
        let addr = *addr;
        match self.own.find(addr_hash(addr), |e| e.0 == addr) {
            Some(&(_, b)) => Some(b),
            None => self.shared.as_ref()?.get(addr),
        }
    }

    /// Asks for the memory where the block at `addr` would be, ahead of a lookup of it
    /// (the table's own blocks only).
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        self.own.allocator().prefetch(addr_hash(addr));
    }

    /// Makes `addr` live; returns the block it replaced.
    #[inline(always)]
    pub fn insert(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        match self
            .own
            .entry(addr_hash(addr), |e| e.0 == addr, |e| addr_hash(e.0))
        {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                Some(std::mem::replace(&mut o.get_mut().1, block))
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert((addr, block));
                match &mut self.shared {
                    None => None,
                    Some(_) => self.insert_beside_shared(addr),
                }
            }
        }
    }

    /// After `addr` went into the table's own blocks: the shared block it replaced.
    #[cold]
    #[inline(never)]
    fn insert_beside_shared(&mut self, addr: u64) -> Option<LiveBlock> {
        let shared = self.shared.as_mut()?;
        let displaced = shared.take(addr);
        if shared.outgrown(self.own.len()) {
            self.flatten();
        }
        displaced
    }

    /// Ends the block at `addr`, if it is live.
    #[inline(always)]
    pub fn remove(&mut self, addr: &u64) -> Option<LiveBlock> {
        let addr = *addr;
        match self.own.find_entry(addr_hash(addr), |e| e.0 == addr) {
            Ok(entry) => {
                let block = entry.get().1;
                entry.remove();
                Some(block)
            }
            Err(_) => match &self.shared {
                None => None,
                Some(_) => self.remove_shared(addr),
            },
        }
    }

    #[cold]
    #[inline(never)]
    fn remove_shared(&mut self, addr: u64) -> Option<LiveBlock> {
        let shared = self.shared.as_mut()?;
        let block = shared.take(addr)?;
        if shared.outgrown(self.own.len()) {
            self.flatten();
        }
        Some(block)
    }

    /// Copies the shared blocks still live here into the table's own, and lets the
    /// shared ones go.
    fn flatten(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        self.own.reserve(shared.len(), |e| addr_hash(e.0));
        for &(addr, b) in shared.base.blocks.iter() {
            if !shared.gone.contains(&addr) {
                self.own
                    .insert_unique(addr_hash(addr), (addr, shared.view(b)), |e| addr_hash(e.0));
            }
        }
    }

    /// Freezes the blocks for a fork: afterwards the table shares them (all but a few of
    /// its own, when it shares a base already and has few beside it).
    fn freeze(&mut self) {
        match &self.shared {
            // A child gets a copy of the blocks beside the base: few, or the copy made
            // now, once, is cheaper than one per child.
            Some(s) if (self.own.len() + s.gone.len()) * 16 <= s.base.blocks.len() => return,
            Some(_) => self.flatten(),
            None => {}
        }
        let blocks = std::mem::take(&mut self.own);
        let bytes = blocks
            .iter()
            .fold((0, 0), |(r, u), (_, b)| (r + b.size, u + b.usable()));
        self.shared = Some(Shared {
            base: Arc::new(Base {
                blocks,
                bytes,
                stacks: OnceLock::new(),
            }),
            gone: AddrSet::default(),
            gone_bytes: (0, 0),
            inherited: None,
        });
    }

    /// The blocks as a child forked now starts from them, each inherited, its stack named
    /// in the child's table of inherited stacks; `frames_of` gives the frames of this
    /// table's stack ids. The table shares its blocks with the child from here on.
    pub(crate) fn hand_on<'f>(&mut self, frames_of: impl Fn(u32) -> &'f [u64]) -> InheritedHeap {
        self.freeze();
        let shared = self.shared.as_ref().expect("frozen");
        let names = match &shared.inherited {
            // Its stacks there are named as a child of the same base names them.
            Some(names) => names.clone(),
            None => (shared.base.stacks)
                .get_or_init(|| Arc::new(InheritedStacks::of(&shared.base.blocks, &frames_of)))
                .clone(),
        };
        let named = names.frames.len() as u32;
        // This table's stack id, as the child names it.
        let in_base = |stack: u32| match &shared.inherited {
            None => names.index.get(&stack).copied(),
            Some(_) => (is_inherited_stack(stack) && stack & !INHERITED_STACK < named)
                .then_some(stack & !INHERITED_STACK),
        };
        let mut extra_stacks: Vec<Vec<u64>> = Vec::new();
        let mut extra: FastMap<u32, u32> = FastMap::default();
        let mut own = Blocks::with_capacity_in(self.own.len(), HugePages::default());
        let (mut bytes, mut usable_bytes) = (
            shared.base.bytes.0 - shared.gone_bytes.0,
            shared.base.bytes.1 - shared.gone_bytes.1,
        );
        for &(addr, b) in self.own.iter() {
            bytes += b.size;
            usable_bytes += b.usable();
            let stack = match b.stack {
                0 => 0,
                s => {
                    let i = in_base(s).unwrap_or_else(|| {
                        *extra.entry(s).or_insert_with(|| {
                            extra_stacks.push(frames_of(s).to_vec());
                            named + extra_stacks.len() as u32 - 1
                        })
                    });
                    INHERITED_STACK | i
                }
            };
            let b = LiveBlock {
                inherited: true,
                stack,
                ..b
            };
            own.insert_unique(addr_hash(addr), (addr, b), |e| addr_hash(e.0));
        }
        InheritedHeap {
            live: LiveTable {
                own,
                shared: Some(Shared {
                    base: shared.base.clone(),
                    gone: shared.gone.clone(),
                    gone_bytes: shared.gone_bytes,
                    inherited: Some(names.clone()),
                }),
            },
            stacks: InheritedStackTable {
                named: Some(names),
                extra: extra_stacks,
            },
            bytes,
            usable_bytes,
        }
    }

    pub fn iter(&self) -> LiveIter<'_> {
        self.into_iter()
    }

    pub fn values(&self) -> impl Iterator<Item = LiveBlock> + '_ {
        self.iter().map(|(_, b)| b)
    }
}

/// Every live block of a [`LiveTable`], (address, block), in no particular order.
pub struct LiveIter<'a> {
    own: hashbrown::hash_table::Iter<'a, (u64, LiveBlock)>,
    shared: Option<(
        hashbrown::hash_table::Iter<'a, (u64, LiveBlock)>,
        &'a Shared,
    )>,
}

impl Iterator for LiveIter<'_> {
    type Item = (u64, LiveBlock);

    /// Inlined into the loops over every block (a snapshot's evaluation) as the table's
    /// own part: a call per block cost 2% of a report.
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        match self.own.next() {
            Some(&(addr, b)) => Some((addr, b)),
            None => self.next_shared(),
        }
    }
}

impl LiveIter<'_> {
    #[inline(never)]
    fn next_shared(&mut self) -> Option<(u64, LiveBlock)> {
        let (blocks, shared) = self.shared.as_mut()?;
        loop {
            let &(addr, b) = blocks.next()?;
            if shared.gone.is_empty() || !shared.gone.contains(&addr) {
                return Some((addr, shared.view(b)));
            }
        }
    }
}

impl<'a> IntoIterator for &'a LiveTable {
    type Item = (u64, LiveBlock);
    type IntoIter = LiveIter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        LiveIter {
            own: self.own.iter(),
            shared: self.shared.as_ref().map(|s| (s.base.blocks.iter(), s)),
        }
    }
}

/// The same blocks at the same addresses, whatever the tables' layouts.
impl PartialEq for LiveTable {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(a, b)| other.get(&a) == Some(b))
    }
}

impl Extend<(u64, LiveBlock)> for LiveTable {
    fn extend<I: IntoIterator<Item = (u64, LiveBlock)>>(&mut self, blocks: I) {
        for (addr, block) in blocks {
            self.insert(addr, block);
        }
    }
}

/// The frames of a process's inherited stacks (`INHERITED_STACK | i`): those of the
/// shared blocks' stacks, then its own extra ones.
#[derive(Default, Clone, Debug)]
pub(crate) struct InheritedStackTable {
    named: Option<Arc<InheritedStacks>>,
    extra: Vec<Vec<u64>>,
}

impl InheritedStackTable {
    pub(crate) fn get(&self, i: usize) -> Option<&[u64]> {
        let named = self.named.as_ref().map_or(&[][..], |n| &n.frames[..]);
        match named.get(i) {
            Some(frames) => Some(frames),
            None => self.extra.get(i - named.len()).map(Vec::as_slice),
        }
    }
}

/// A process's live blocks at a fork, which its child starts from
/// ([`crate::order::merge::Merger::heap_at_fork`], [`crate::order::merge::Merger::seed_inherited`]):
/// shared with the parent, not copied.
#[derive(Default, Clone, Debug)]
pub struct InheritedHeap {
    /// Each block flagged `inherited`, its stack named in `stacks`.
    pub(crate) live: LiveTable,
    pub(crate) stacks: InheritedStackTable,
    /// The blocks' requested and usable bytes.
    pub bytes: u64,
    pub usable_bytes: u64,
}

impl InheritedHeap {
    pub fn blocks(&self) -> usize {
        self.live.len()
    }

    /// The blocks, as the child holds them.
    pub fn live(&self) -> &LiveTable {
        &self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The memory a table's allocator notes for prefetches is the table's, laid out as
    /// `HugePages::held` says, through its growth from empty, a clone, and after a drop.
    #[test]
    fn prefetches_find_the_table_where_it_lies() {
        let noted = |t: &LiveTable| {
            let a = t.own.allocator();
            let ctrl = a.ctrl.load(Ordering::Relaxed);
            (ctrl, a.bucket_mask.load(Ordering::Relaxed) + 1)
        };
        let in_place = |t: &LiveTable| {
            let (ctrl, buckets) = noted(t);
            assert_ne!(ctrl, 0);
            if buckets >= 8 {
                assert_eq!(buckets / 8 * 7, t.own.capacity());
            }
            for e in t.own.iter() {
                let at = e as *const (u64, LiveBlock) as usize;
                let i = (ctrl - at) / 32 - 1;
                assert_eq!(ctrl - at, (i + 1) * 32);
                assert!(i < buckets);
                // Its probe starts within a group of 16 buckets of it (the table is
                // sparse enough here for every block to be found in its first group).
                let home = addr_hash(e.0) as usize & (buckets - 1);
                assert!(i.wrapping_sub(home) & (buckets - 1) < 16, "{i} {home}");
            }
        };
        let mut t = LiveTable::default();
        assert_eq!(noted(&t).0, 0);
        for k in 0..300_000u64 {
            t.insert(0x7f00_0000_0000 + k * 48, LiveBlock::default());
            if k.is_power_of_two() {
                in_place(&t);
            }
        }
        in_place(&t);
        in_place(&t.clone());
        for k in 0..300_000u64 {
            t.prefetch(0x7f00_0000_0000 + k * 48);
        }
        t.own = Blocks::default();
        assert_eq!(noted(&t).0, 0);
    }

    /// A process as the merge holds it: its live table and its stacks, and beside them
    /// what its live blocks must be (by address: requested size, inherited, frames).
    struct Process {
        live: LiveTable,
        inherited_stacks: InheritedStackTable,
        /// Its own stack `id` has the frames [id, pid].
        pid: u64,
        expected: HashMap<u64, (u64, bool, Vec<u64>)>,
    }

    impl Process {
        fn new(pid: u64) -> Self {
            Self {
                live: LiveTable::default(),
                inherited_stacks: InheritedStackTable::default(),
                pid,
                expected: HashMap::new(),
            }
        }

        fn frames(&self, stack: u32) -> Vec<u64> {
            frames_in(self.pid, &self.inherited_stacks, stack).to_vec()
        }

        fn allocate(&mut self, addr: u64, size: u64, stack: u32) {
            let block = LiveBlock {
                size,
                rounding: 8,
                stack,
                ..Default::default()
            };
            let displaced = self.live.insert(addr, block);
            let frames = self.frames(stack);
            let before = self.expected.insert(addr, (size, false, frames));
            assert_eq!(displaced.map(|b| b.size), before.map(|b| b.0), "{addr:#x}");
        }

        fn free(&mut self, addr: u64) {
            let freed = self.live.remove(&addr);
            let before = self.expected.remove(&addr);
            assert_eq!(freed.map(|b| b.size), before.map(|b| b.0), "{addr:#x}");
        }

        fn fork(&mut self, pid: u64) -> Process {
            let (me, stacks) = (self.pid, &self.inherited_stacks);
            let heap = self.live.hand_on(|id| frames_in(me, stacks, id));
            let expected = (self.expected.iter())
                .map(|(&a, (size, _, frames))| (a, (*size, true, frames.clone())))
                .collect();
            let bytes: u64 = self.expected.values().map(|e| e.0).sum();
            assert_eq!(heap.bytes, bytes);
            assert_eq!(heap.usable_bytes, bytes + 8 * self.expected.len() as u64);
            Process {
                live: heap.live,
                inherited_stacks: heap.stacks,
                pid,
                expected,
            }
        }

        fn check(&self) {
            assert_eq!(self.live.len(), self.expected.len());
            let mut seen = 0;
            for (addr, b) in &self.live {
                let (size, inherited, frames) = &self.expected[&addr];
                assert_eq!((b.size, b.inherited), (*size, *inherited), "{addr:#x}");
                assert_eq!(&self.frames(b.stack), frames, "{addr:#x}");
                assert_eq!(self.live.get(&addr), Some(b));
                seen += 1;
            }
            assert_eq!(seen, self.expected.len());
        }
    }

    fn frames_in(pid: u64, inherited: &InheritedStackTable, stack: u32) -> &[u64] {
        thread_local! {
            static OWN: std::cell::RefCell<HashMap<(u64, u32), &'static [u64]>> =
                Default::default();
        }
        if stack == 0 {
            return &[];
        }
        if is_inherited_stack(stack) {
            return inherited.get((stack & !INHERITED_STACK) as usize).unwrap();
        }
        OWN.with(|own| {
            *(own.borrow_mut().entry((pid, stack)))
                .or_insert_with(|| Vec::leak(vec![u64::from(stack), pid]))
        })
    }

    #[test]
    fn forked_tables_hold_what_copies_would_hold() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..40 {
            let mut procs = vec![Process::new(1)];
            for step in 0..3000 {
                let r = crate::xorshift(&mut x);
                let p = (r % procs.len() as u64) as usize;
                // Few addresses, so that frees, reuses and displaced blocks are common.
                let addr = 0x10_0000 + ((r >> 8) % 512) * 16;
                let stack = ((r >> 20) % 6) as u32;
                match (r >> 32) % 100 {
                    0 if procs.len() < 12 => {
                        let pid = procs.len() as u64 + 1;
                        let child = procs[p].fork(pid);
                        procs.push(child);
                    }
                    1..=45 => procs[p].allocate(addr, (r >> 40) % 300, stack),
                    _ => procs[p].free(addr),
                }
                if step % 97 == 0 || round == 0 {
                    procs[p].check();
                }
            }
            procs.iter().for_each(Process::check);
        }
    }

    #[test]
    fn children_forked_in_a_row_share_one_table() {
        let mut parent = Process::new(1);
        for i in 0..10_000 {
            parent.allocate(0x10_0000 + i * 16, 48, (i % 3) as u32);
        }
        let mut children: Vec<Process> = (2..10).map(|pid| parent.fork(pid)).collect();
        let base = |p: &Process| p.live.shared.as_ref().unwrap().base.clone();
        for c in &children {
            assert!(Arc::ptr_eq(&base(c), &base(&parent)));
            assert!(c.live.own.is_empty());
        }
        // Each frees and allocates a little: still shared, each with its own changes.
        for (i, c) in children.iter_mut().enumerate() {
            c.free(0x10_0000 + i as u64 * 16);
            c.allocate(0x20_0000, 64, 1);
            c.check();
            assert!(Arc::ptr_eq(&base(c), &base(&parent)));
        }
        // A child that frees most of what it inherited lets the shared blocks go.
        let c = &mut children[0];
        for i in 0..6000 {
            c.free(0x10_0000 + i * 16);
        }
        assert!(c.live.shared.is_none());
        c.check();
        // A grandchild shares its parent's table, and names its stacks as it does.
        let g = children[1].fork(20);
        assert!(Arc::ptr_eq(&base(&g), &base(&parent)));
        g.check();
        let g2 = children[1].fork(21);
        assert_eq!(g2.live.own.len(), 1);
        g2.check();
    }
}
