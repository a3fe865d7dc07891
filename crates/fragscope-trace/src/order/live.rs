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

use std::sync::{Arc, OnceLock};

use crate::format::hash::{AddrSet, FastMap};
use crate::order::blocks::{Blocks, BlocksIter};

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

/// The live blocks by address, in hashbrown's table with the locality hash
/// ([`crate::order::blocks`]).
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
        let b = self.base.blocks.get(addr)?;
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
    /// An empty table whose blocks read back with a birth tick of 0, four bytes fewer a
    /// block, for a reader that never reads the ticks (a report); four fewer again where
    /// few blocks have a stack (`stacks_rare`: sampled stacks), whose blocks with one are
    /// then kept whole beside the table.
    pub fn without_birth_ticks(stacks_rare: bool) -> Self {
        Self {
            own: Blocks::without_birth_ticks(stacks_rare),
            shared: None,
        }
    }

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
        match self.own.get(addr) {
            Some(b) => Some(b),
            None => self.shared.as_ref()?.get(addr),
        }
    }

    /// Asks for the memory where the block at `addr` would be, ahead of a lookup of it
    /// (the table's own blocks only).
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        self.own.prefetch(addr);
    }

    /// Makes `addr` live; returns the block it replaced.
    #[inline(always)]
    pub fn insert(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        match self.own.insert(addr, block) {
            Some(replaced) => Some(replaced),
            None => match &mut self.shared {
                None => None,
                Some(_) => self.insert_beside_shared(addr),
            },
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

    /// The block at `addr`, when it is the table's own and the table shares none (see
    /// [`LiveTable::take_again`]).
    #[inline(always)]
    pub(crate) fn get_unshared(&self, addr: u64) -> Option<LiveBlock> {
        if self.shared.is_some() {
            return None;
        }
        self.own.get(addr)
    }

    /// Ends the block at `addr` (found by [`LiveTable::get_unshared`]) and makes `addr`
    /// live again as `block`: as `remove` then `insert` would, in place when that leaves
    /// the table the same.
    #[inline(always)]
    pub(crate) fn take_again(&mut self, addr: u64, block: LiveBlock) {
        if self.own.replace_where_it_lies(addr, block).is_none() {
            self.remove(&addr);
            self.insert(addr, block);
        }
    }

    /// Ends the block at `addr`, if it is live.
    #[inline(always)]
    pub fn remove(&mut self, addr: &u64) -> Option<LiveBlock> {
        let addr = *addr;
        match self.own.remove(addr) {
            Some(block) => Some(block),
            None => match &self.shared {
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
        self.own.reserve(shared.len());
        for (addr, b) in shared.base.blocks.iter() {
            if !shared.gone.contains(&addr) {
                self.own.insert_unique(addr, shared.view(b));
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
        let mut own = self.own.empty_like(self.own.len());
        let (mut bytes, mut usable_bytes) = (
            shared.base.bytes.0 - shared.gone_bytes.0,
            shared.base.bytes.1 - shared.gone_bytes.1,
        );
        for (addr, b) in self.own.iter() {
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
            own.insert_unique(addr, b);
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
    own: BlocksIter<'a>,
    shared: Option<(BlocksIter<'a>, &'a Shared)>,
}

impl Iterator for LiveIter<'_> {
    type Item = (u64, LiveBlock);

    /// Inlined into the loops over every block (a snapshot's evaluation) as the table's
    /// own part: a call per block cost 2% of a report.
    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        match self.own.next() {
            Some(block) => Some(block),
            None => self.next_shared(),
        }
    }
}

impl LiveIter<'_> {
    #[inline(never)]
    fn next_shared(&mut self) -> Option<(u64, LiveBlock)> {
        let (blocks, shared) = self.shared.as_mut()?;
        loop {
            let (addr, b) = blocks.next()?;
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

/// Asks the C allocator to give the system back the free memory it keeps, once a reader
/// has let go of big tables (see `Merger::release_blocks`): glibc keeps freed chunks
/// below its mmap threshold, which it raises to the size of every mapped chunk freed,
/// so the read-ahead buffers and the blocks by page of a big heap stayed resident, a
/// quarter of a report's peak, beside what it allocated afterwards.
pub fn return_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps glibc's mmap threshold (256 KiB) and trim threshold (1 MiB) where they are set
/// here for the rest of the process. By default glibc raises the mmap threshold to the
/// size of each mapped chunk freed (the read-ahead's arrays of decoded calls are 2 MiB)
/// and its trim threshold to twice that, so from then on it kept up to that much freed
/// memory resident in each arena: 5 to 8 MiB of a big report's peak (measured on a
/// redis-server recording's report and on one over a million blocks). The trim threshold
/// is not left at its 128 KiB either: the heap's top was then given back and faulted in
/// again chunk after chunk (twice the page faults of a report over 4096 blocks).
pub fn fix_malloc_thresholds() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes settings of glibc's allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
            assert_eq!(c.live.own.len(), 0);
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
