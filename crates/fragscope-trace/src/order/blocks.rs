//! The table of live blocks by address that [`crate::order::live::LiveTable`] is made of:
//! hashbrown's table with the locality hash, each block packed with its address into 20
//! bytes, on huge pages once it is big.
//!
//! A bucket was an address and a [`LiveBlock`], 32 bytes, and a table is at most 7/8
//! full: a million live blocks took 2^21 buckets, 66 MiB, and 99 MiB while the table grew
//! to them (the old buckets and the new). Packed, a bucket is 20 bytes: 42 MiB and 63 MiB.
//! The address takes 48 bits (a user-space address on x86-64 and arm64), the rounding 15
//! and whether the block is inherited 1, in one word. A block whose size or rounding does
//! not fit (4 GiB or more, 32 KiB or more) is kept whole in a map beside the table, its
//! bucket marked; one at an address above 48 bits is kept in another map, with no bucket.
//!
//! A report never reads a block's birth tick (replay and aggregation do): its table
//! leaves it out, 16 bytes a bucket (`Blocks::without_birth_ticks`), 34 MiB for a million
//! blocks instead of 42. Where stacks are sampled, as by default (a stack every 512 KiB
//! allocated), nearly every block has none: a report's table then leaves the stack out
//! too, and so most of the rounding and size, and the address in 32 bits
//! ([`AddressWindows`]): 8 bytes a bucket (18 MiB), a block with a stack, of 512 KiB or
//! more or rounded up by 4 KiB or more kept whole beside it, and one at an address that
//! does not fit 32 bits kept with the far ones. When such a table grows and all but one
//! in 64 of its blocks are under 1023 bytes and rounded up by less than 32, its buckets
//! become 6 bytes ([`Small`]; the others kept beside), and 8 again at a growth where more
//! do not fit, or at once where more than one in 16 do not: 16 MiB less of a
//! redis-server's 2^23 buckets.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocator_api2::alloc::{AllocError, Allocator, Global};

use crate::format::hash::{addr_hash, prefetch, AddrMap, AddressWindows, FastMap};
use crate::order::buckets::{Packing, Small, Timed, Unstacked, Untimed};
use crate::order::live::LiveBlock;

/// Live blocks by address, in buckets of `B` (see the module's comment).
#[derive(Clone, Debug)]
pub(crate) struct Table<B> {
    table: hashbrown::HashTable<B, HugePages>,
    /// The blocks that do not fit a bucket, by key (an address, or [`Unstacked`]'s 32
    /// bits, which have no locality to keep: a map with a scattering hash).
    wide: FastMap<u64, LiveBlock>,
    /// The blocks at addresses that do not fit a bucket, by address.
    far: AddrMap<LiveBlock>,
    /// Where the addresses of [`Unstacked`] buckets lie.
    windows: AddressWindows,
    /// Tests: how many times the table grew here (not by hashbrown).
    #[cfg(test)]
    grown_here: usize,
}

impl<B: Packing> Default for Table<B> {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl<B: Packing> Table<B> {
    fn with_capacity(n: usize) -> Self {
        Self {
            table: hashbrown::HashTable::with_capacity_in(n, HugePages::of::<B>()),
            wide: FastMap::default(),
            far: AddrMap::default(),
            windows: AddressWindows::default(),
            #[cfg(test)]
            grown_here: 0,
        }
    }

    fn len(&self) -> usize {
        self.table.len() + self.far.len()
    }

    #[inline(always)]
    fn block(&self, b: B) -> LiveBlock {
        if b.is_wide() {
            self.wide[&b.key()]
        } else {
            b.unpacked()
        }
    }

    /// The address of bucket `b`.
    #[inline(always)]
    fn addr(&self, b: &B) -> u64 {
        B::addr_of(b.key(), &self.windows)
    }

    /// The hash of bucket `b`, its address's (a growing table hashes every bucket).
    #[inline(always)]
    fn hash_of(windows: &AddressWindows, b: &B) -> u64 {
        addr_hash(B::addr_of(b.key(), windows))
    }

    #[inline(always)]
    fn get(&self, addr: u64) -> Option<LiveBlock> {
        let Some(key) = B::key_of(addr, &self.windows) else {
            return self.far.get(&addr).copied();
        };
        let &b = self.table.find(addr_hash(addr), |e| e.key() == key)?;
        Some(self.block(b))
    }

    /// Puts `block` in place of the live block at `addr`, and returns that one, when
    /// removing it and inserting `block` would leave the table exactly as this does: the
    /// emptied bucket is the first free one where the probe for `addr` starts (so the
    /// insertion would take it again) and the table has room (so it would not be
    /// rehashed first). The blocks are then read in the same order as ever. `None`, and
    /// nothing changed, otherwise (or when either block is kept beside the table).
    #[inline(always)]
    fn replace_where_it_lies(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        let held = self.table.allocator();
        let ctrl = held.ctrl.load(Ordering::Relaxed);
        let mask = held.bucket_mask.load(Ordering::Relaxed);
        // hashbrown probes 16 control bytes at a time; a smaller table is laid out
        // otherwise.
        const GROUP: usize = 16;
        if ctrl == 0 || mask < GROUP - 1 || self.table.len() >= self.table.capacity() {
            return None;
        }
        let key = B::key_of(addr, &self.windows)?;
        let new = B::of(key, &block)?;
        let hash = addr_hash(addr);
        let bucket = self.table.find_mut(hash, |e| e.key() == key)?;
        if bucket.is_wide() {
            return None;
        }
        // Buckets lie below the control bytes, the first highest.
        let at = (ctrl - (bucket as *mut B as usize)) / size_of::<B>() - 1;
        let home = hash as usize & mask;
        let before = at.wrapping_sub(home) & mask;
        if before >= GROUP {
            return None;
        }
        // A control byte with its top bit set marks a free bucket (empty or emptied).
        // SAFETY: 16 control bytes from `home`, within the table's `mask + 1` and the 16
        // that follow them (a copy of the first, for such reads across the end).
        let group = unsafe { ((ctrl + home) as *const u128).read_unaligned() };
        let free = u128::from_le(group) & u128::from_le_bytes([0x80; GROUP]);
        if free & ((1u128 << (8 * before)) - 1) != 0 {
            return None;
        }
        let old = bucket.unpacked();
        *bucket = new;
        Some(old)
    }

    /// What a bucket holds of `block` of key `key`: a wide block goes into `wide`.
    #[inline(always)]
    fn packed(wide: &mut FastMap<u64, LiveBlock>, key: u64, block: LiveBlock) -> B {
        B::of(key, &block).unwrap_or_else(|| {
            wide.insert(key, Self::as_kept(block));
            B::wide(key)
        })
    }

    /// `block` as the table keeps it: without its birth tick unless it keeps them.
    #[inline(always)]
    fn as_kept(block: LiveBlock) -> LiveBlock {
        if B::TICKS {
            block
        } else {
            LiveBlock {
                born_tick: 0,
                ..block
            }
        }
    }

    /// The block of bucket `b`, taken out of `wide` if it is there.
    #[inline(always)]
    fn taken(wide: &mut FastMap<u64, LiveBlock>, b: B) -> LiveBlock {
        if b.is_wide() {
            wide.remove(&b.key())
                .expect("a wide block beside the table")
        } else {
            b.unpacked()
        }
    }

    /// Makes `addr` live as `block`; returns the block it replaced.
    #[inline(always)]
    fn insert(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        let Some(key) = B::new_key(addr, &mut self.windows) else {
            return self.far.insert(addr, Self::as_kept(block));
        };
        if self.table.len() == self.table.capacity() {
            self.grow();
        }
        let (wide, windows) = (&mut self.wide, &self.windows);
        let hash = addr_hash(addr);
        let rehash = |e: &B| Self::hash_of(windows, e);
        match (self.table).entry(hash, |e| e.key() == key, rehash) {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                let old = Self::taken(wide, *o.get());
                *o.get_mut() = Self::packed(wide, key, block);
                Some(old)
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(Self::packed(wide, key, block));
                None
            }
        }
    }

    /// Makes `addr`, which is not live, live as `block`.
    #[inline(always)]
    fn insert_unique(&mut self, addr: u64, block: LiveBlock) {
        let Some(key) = B::new_key(addr, &mut self.windows) else {
            self.far.insert(addr, Self::as_kept(block));
            return;
        };
        let b = Self::packed(&mut self.wide, key, block);
        let windows = &self.windows;
        (self.table).insert_unique(addr_hash(addr), b, |e| Self::hash_of(windows, e));
    }

    /// Ends the block at `addr`, if it is live. The block is read where it lies before its
    /// bucket is emptied: `HashMap::remove` returned it through memory, stored in pieces
    /// narrower than the copy that read it back (a store-forwarding stall, a third of the
    /// merge's time on `--stacks all` traces).
    #[inline(always)]
    fn remove(&mut self, addr: u64) -> Option<LiveBlock> {
        let Some(key) = B::key_of(addr, &self.windows) else {
            return self.far.remove(&addr);
        };
        let entry = self
            .table
            .find_entry(addr_hash(addr), |e| e.key() == key)
            .ok()?;
        let b = *entry.get();
        entry.remove();
        Some(Self::taken(&mut self.wide, b))
    }

    /// Tables of fewer buckets grow as hashbrown grows them.
    const GROWN_HERE: usize = if cfg!(test) { 64 } else { 1 << 16 };

    fn is_full(&self) -> bool {
        self.table.len() == self.table.capacity()
    }

    /// The table is full, and hashbrown would move its blocks into one of twice as many
    /// buckets or more at the next insertion (which looks for room before it looks for
    /// the address): moves them here instead (see [`Table::grown`]).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        if let Some(grown) = self.grown::<B>(Room::Doubled) {
            *self = grown;
        }
    }

    /// The capacity of the table [`Table::grown`] moves the blocks into with `room`, or
    /// `None` when the table is left to hashbrown.
    fn capacity_moved_into(&self, room: Room) -> Option<usize> {
        let held = self.table.allocator();
        let ctrl = held.ctrl.load(Ordering::Relaxed);
        let buckets = held.bucket_mask.load(Ordering::Relaxed).wrapping_add(1);
        let items = self.table.len();
        // hashbrown's capacity of a table of `buckets` (8 or more): 7/8 of them.
        let full = buckets / 8 * 7;
        if ctrl == 0 || buckets < Self::GROWN_HERE {
            return None;
        }
        match room {
            Room::Doubled if items >= full / 2 => Some(items.max(full) + 1),
            Room::Doubled => None,
            Room::Same => Some(full),
        }
    }

    /// Whether more than one in [`Blocks::MOST_BESIDE`] of the blocks of a table grown
    /// here are kept beside it.
    fn too_many_beside(&self) -> bool {
        self.wide.len() * Blocks::MOST_BESIDE > self.table.len()
            && self.table.capacity() >= Self::GROWN_HERE / 8 * 7
    }

    /// The blocks of a full table moved into one of buckets of `C` (this kind, or one
    /// with the same keys: [`Unstacked`] and [`Small`]) the way hashbrown grows a table
    /// (in the old table's order, each to the first free bucket of its probe in a table
    /// of as many buckets as hashbrown would make), so that each lands where hashbrown
    /// would put it and the blocks are read in the same order as ever, the old table's
    /// memory given back as it goes. hashbrown holds all of both tables until the end:
    /// 63 MiB for a million blocks where the new table alone is 42 MiB. `None` for a
    /// table that has room locked up in removed buckets (hashbrown rehashes it where it
    /// is) and a small one: they are left to hashbrown. With [`Room::Same`], the blocks
    /// of a table that is not full move the same way into as many buckets.
    fn grown<C: Packing>(&mut self, room: Room) -> Option<Table<C>> {
        const PAGE: usize = 4096;
        let capacity = self.capacity_moved_into(room)?;
        let ctrl = self.table.allocator().ctrl.load(Ordering::Relaxed);
        let mut grown = Table::<C> {
            table: hashbrown::HashTable::with_capacity_in(capacity, HugePages::of::<C>()),
            wide: FastMap::default(),
            far: std::mem::take(&mut self.far),
            windows: self.windows.clone(),
            #[cfg(test)]
            grown_here: self.grown_here + 1,
        };
        // The old buckets below `ctrl` (the first highest) that are still held.
        let mut held_to = ctrl & !(PAGE - 1);
        let windows = &self.windows;
        let hash = |e: &C| Table::<C>::hash_of(windows, e);
        for b in self.table.iter() {
            let block = self.block(*b);
            let moved = Table::<C>::packed(&mut grown.wide, b.key(), block);
            grown.table.insert_unique(hash(&moved), moved, hash);
            // Every bucket from this one up is copied.
            let done = (b as *const B as usize).next_multiple_of(PAGE);
            if held_to - done.min(held_to) >= HugePages::PAGE {
                // SAFETY: old buckets that are copied and never read again (the table's
                // iteration reads the control bytes, above `ctrl`, and the buckets below
                // this one; dropping the table reads none), whole pages inside its
                // allocation; the allocator's own header is before its start.
                unsafe {
                    libc::madvise(
                        done as *mut libc::c_void,
                        held_to - done,
                        libc::MADV_DONTNEED,
                    )
                };
                held_to = done;
            }
        }
        Some(grown)
    }

    fn reserve(&mut self, additional: usize) {
        let windows = &self.windows;
        (self.table).reserve(additional, |e| Self::hash_of(windows, e));
    }

    /// Asks for the memory where the block at `addr` would be, ahead of a lookup of it.
    #[inline(always)]
    fn prefetch(&self, addr: u64) {
        self.table.allocator().prefetch(addr_hash(addr));
    }

    fn iter(&self) -> TableIter<'_, B> {
        TableIter {
            buckets: self.table.iter(),
            far: self.far.iter(),
            blocks: self,
        }
    }
}

/// How many buckets a table moved into another has.
#[derive(Clone, Copy)]
enum Room {
    /// As many as hashbrown would grow a full table to.
    Doubled,
    /// As many as it has.
    Same,
}

/// Live blocks by address (see the module's comment): with their birth ticks, or (a
/// table made `without_birth_ticks`) without, and then with or without their stacks in
/// the buckets.
#[derive(Clone, Debug)]
pub(crate) enum Blocks {
    Timed(Table<Timed>),
    Untimed(Table<Untimed>),
    Unstacked(Table<Unstacked>),
    Small(Table<Small>),
}

impl Default for Blocks {
    fn default() -> Self {
        Self::Timed(Table::default())
    }
}

/// `$body` with `$t` the table of `$blocks`, whichever its buckets.
macro_rules! each {
    ($blocks:expr, $t:ident => $body:expr) => {
        match $blocks {
            Blocks::Timed($t) => $body,
            Blocks::Untimed($t) => $body,
            Blocks::Unstacked($t) => $body,
            Blocks::Small($t) => $body,
        }
    };
}

impl Blocks {
    /// A table whose blocks read back with a birth tick of 0, for blocks of which few
    /// have a stack (`stacks_rare`) or not (see the module's comment).
    pub(crate) fn without_birth_ticks(stacks_rare: bool) -> Self {
        if stacks_rare {
            Self::Unstacked(Table::default())
        } else {
            Self::Untimed(Table::default())
        }
    }

    /// An empty table for `n` blocks, whose buckets hold what this one's hold.
    pub(crate) fn empty_like(&self, n: usize) -> Self {
        match self {
            Self::Timed(_) => Self::Timed(Table::with_capacity(n)),
            Self::Untimed(_) => Self::Untimed(Table::with_capacity(n)),
            Self::Unstacked(_) => Self::Unstacked(Table::with_capacity(n)),
            Self::Small(_) => Self::Small(Table::with_capacity(n)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        each!(self, t => t.len())
    }

    #[inline(always)]
    pub(crate) fn get(&self, addr: u64) -> Option<LiveBlock> {
        each!(self, t => t.get(addr))
    }

    /// See [`Table::replace_where_it_lies`].
    #[inline(always)]
    pub(crate) fn replace_where_it_lies(
        &mut self,
        addr: u64,
        block: LiveBlock,
    ) -> Option<LiveBlock> {
        each!(self, t => t.replace_where_it_lies(addr, block))
    }

    /// Makes `addr` live as `block`; returns the block it replaced.
    #[inline(always)]
    pub(crate) fn insert(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        let regrow = match self {
            Self::Unstacked(t) => t.is_full(),
            Self::Small(t) => t.is_full() || t.too_many_beside(),
            _ => false,
        };
        if regrow {
            self.grow_unstacked();
        }
        each!(self, t => t.insert(addr, block))
    }

    /// A table of [`Small`] buckets has them while at most one block in this many does
    /// not fit one when it grows.
    const SMALL_BESIDE: usize = 64;
    /// ... and in between, while at most one in this many does not (each block kept
    /// beside costs 40 bytes or more, against 9 a bucket of [`Unstacked`]).
    const MOST_BESIDE: usize = 16;

    /// A full table of blocks without stacks grows (when it is grown here, see
    /// [`Table::grown`]) into buckets of [`Small`] when all but one in
    /// [`Blocks::SMALL_BESIDE`] of its blocks fit them, else of [`Unstacked`]; the
    /// buckets it has are kept when they are the ones. A table of [`Small`] buckets with
    /// more than one block in [`Blocks::MOST_BESIDE`] beside it (its blocks grew bigger)
    /// takes [`Unstacked`] buckets at once, as many as it has: moved so, its blocks may
    /// be read in another order than had it grown.
    #[cold]
    #[inline(never)]
    fn grow_unstacked(&mut self) {
        let grown = match self {
            // Its blocks are counted only when it is moved here.
            Self::Unstacked(t) if t.capacity_moved_into(Room::Doubled).is_some() => {
                // A block kept beside an [`Unstacked`] bucket does not fit a [`Small`].
                let beside = t.wide.len()
                    + (t.table.iter())
                        .filter(|b| !b.is_wide() && !Small::holds(&b.unpacked()))
                        .count();
                if beside * Self::SMALL_BESIDE > t.table.len() {
                    return;
                }
                t.grown::<Small>(Room::Doubled).map(Self::Small)
            }
            Self::Small(t) if t.wide.len() * Self::SMALL_BESIDE > t.table.len() => {
                let room = if t.is_full() {
                    Room::Doubled
                } else {
                    Room::Same
                };
                t.grown::<Unstacked>(room).map(Self::Unstacked)
            }
            _ => return,
        };
        if let Some(grown) = grown {
            *self = grown;
        }
    }

    /// Makes `addr`, which is not live, live as `block`.
    #[inline(always)]
    pub(crate) fn insert_unique(&mut self, addr: u64, block: LiveBlock) {
        each!(self, t => t.insert_unique(addr, block))
    }

    /// Ends the block at `addr`, if it is live.
    #[inline(always)]
    pub(crate) fn remove(&mut self, addr: u64) -> Option<LiveBlock> {
        each!(self, t => t.remove(addr))
    }

    pub(crate) fn reserve(&mut self, additional: usize) {
        each!(self, t => t.reserve(additional))
    }

    /// Asks for the memory where the block at `addr` would be, ahead of a lookup of it.
    #[inline(always)]
    pub(crate) fn prefetch(&self, addr: u64) {
        each!(self, t => t.prefetch(addr))
    }

    pub(crate) fn iter(&self) -> BlocksIter<'_> {
        match self {
            Self::Timed(t) => BlocksIter::Timed(t.iter()),
            Self::Untimed(t) => BlocksIter::Untimed(t.iter()),
            Self::Unstacked(t) => BlocksIter::Unstacked(t.iter()),
            Self::Small(t) => BlocksIter::Small(t.iter()),
        }
    }
}

/// Every block of a [`Blocks`], (address, block), in its table's order.
pub(crate) enum BlocksIter<'a> {
    Timed(TableIter<'a, Timed>),
    Untimed(TableIter<'a, Untimed>),
    Unstacked(TableIter<'a, Unstacked>),
    Small(TableIter<'a, Small>),
}

impl Iterator for BlocksIter<'_> {
    type Item = (u64, LiveBlock);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Timed(i) => i.next(),
            Self::Untimed(i) => i.next(),
            Self::Unstacked(i) => i.next(),
            Self::Small(i) => i.next(),
        }
    }
}

/// Every block of a [`Table`], (address, block), in the table's order, then the far ones.
pub(crate) struct TableIter<'a, B> {
    buckets: hashbrown::hash_table::Iter<'a, B>,
    far: std::collections::hash_map::Iter<'a, u64, LiveBlock>,
    blocks: &'a Table<B>,
}

impl<B: Packing> Iterator for TableIter<'_, B> {
    type Item = (u64, LiveBlock);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        match self.buckets.next() {
            Some(b) => Some((self.blocks.addr(b), self.blocks.block(*b))),
            None => self.far.next().map(|(&addr, &b)| (addr, b)),
        }
    }
}

/// Memory of the live blocks' tables: a table of 4 MiB or more on huge pages (2 MiB,
/// asked with madvise: the kernel's transparent huge pages are "madvise" by default on
/// Debian, and glibc asks for none). Each free looks up a block anywhere in the table,
/// two cache misses (its control bytes, then the block), each also a TLB miss once the
/// table spans thousands of 4 KiB pages: over a million live blocks that made the report
/// 10-15% slower. Smaller tables are the global allocator's as they are.
///
/// Also where the table it serves lies, for [`LiveTable::prefetch`].
#[derive(Debug)]
pub(crate) struct HugePages {
    /// The table's control bytes (see `held`), 0 while it has no memory.
    ctrl: AtomicUsize,
    /// Its buckets less one.
    bucket_mask: AtomicUsize,
    /// The size of its buckets.
    bucket: usize,
}

/// A clone serves another table (a table's clone allocates through its allocator's).
impl Clone for HugePages {
    fn clone(&self) -> Self {
        Self {
            ctrl: AtomicUsize::new(0),
            bucket_mask: AtomicUsize::new(0),
            bucket: self.bucket,
        }
    }
}

impl HugePages {
    const PAGE: usize = 2 << 20;

    /// The memory of a table of `B`.
    fn of<B>() -> Self {
        Self {
            ctrl: AtomicUsize::new(0),
            bucket_mask: AtomicUsize::new(0),
            bucket: size_of::<B>(),
        }
    }

    /// How an allocation of `layout` is asked of the global allocator: a big one aligned
    /// to a huge page, so that all its whole huge pages can be.
    fn placed(layout: Layout) -> Layout {
        if layout.size() < 2 * Self::PAGE {
            return layout;
        }
        Layout::from_size_align(layout.size(), layout.align().max(Self::PAGE)).unwrap_or(layout)
    }

    /// Notes the table's memory, `bytes` at `start`: hashbrown 0.15 lays out a table of
    /// `n` buckets (a power of two) of `self.bucket` bytes (the first last), padded
    /// to a multiple of 16 bytes before them, then `n` + 16 control bytes. Memory of
    /// any other size is not noted: only a prefetch reads what is noted, and a prefetch of
    /// a wrong address costs nothing but the prefetch.
    fn held(&self, start: usize, bytes: usize) {
        let bucket = self.bucket;
        // The padding is under 16 bytes, and every table hashbrown makes has 4 buckets or
        // more: the count is the power of two at or below the quotient.
        let quotient = bytes.saturating_sub(16) / (bucket + 1);
        let buckets = quotient.checked_ilog2().map_or(0, |l| 1 << l);
        let ctrl_at = (buckets * bucket).next_multiple_of(16);
        let ours = buckets.is_power_of_two() && ctrl_at + buckets + 16 == bytes;
        let ctrl = if ours { start + ctrl_at } else { 0 };
        self.ctrl.store(ctrl, Ordering::Relaxed);
        self.bucket_mask
            .store(buckets.saturating_sub(1), Ordering::Relaxed);
    }

    /// Asks for the cache lines of the control byte and the buckets where the probe of
    /// `hash` starts: the first and the next two lines' worth below it (later buckets lie
    /// lower), where its block usually is (the table is at most 7/8 full; with the first
    /// bucket's lines alone, the block's own was still missed: a report over a million
    /// blocks spent a fifth of its time on that load).
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        let ctrl = self.ctrl.load(Ordering::Relaxed);
        if ctrl == 0 {
            return;
        }
        let i = hash as usize & self.bucket_mask.load(Ordering::Relaxed);
        const LINE: usize = 64;
        let bucket = ctrl.wrapping_sub((i + 1) * self.bucket);
        prefetch(ctrl.wrapping_add(i));
        // A bucket may straddle two cache lines.
        prefetch(bucket);
        prefetch(bucket + self.bucket - 1);
        prefetch(bucket.wrapping_sub(LINE));
        prefetch(bucket.wrapping_sub(2 * LINE));
    }
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
        if ctrl != 0 && ptr.as_ptr() as usize == ctrl - buckets * self.bucket {
            self.held(0, 0);
        }
        // SAFETY: allocated by `allocate` with the same `layout`.
        unsafe { Global.deallocate(ptr, Self::placed(layout)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::buckets::{ADDR_BITS, ADDR_MASK};

    /// The memory a table's allocator notes for prefetches is the table's, laid out as
    /// `HugePages::held` says, through its growth from empty, a clone, and after a drop.
    #[test]
    fn prefetches_find_the_table_where_it_lies() {
        prefetches_find_the_table::<Timed>();
        prefetches_find_the_table::<Untimed>();
        prefetches_find_the_table::<Unstacked>();
        prefetches_find_the_table::<Small>();
    }

    fn prefetches_find_the_table<B: Packing>() {
        let bucket = size_of::<B>();
        let noted = |t: &Table<B>| {
            let a = t.table.allocator();
            let ctrl = a.ctrl.load(Ordering::Relaxed);
            (ctrl, a.bucket_mask.load(Ordering::Relaxed) + 1)
        };
        let in_place = |t: &Table<B>| {
            let (ctrl, buckets) = noted(t);
            assert_ne!(ctrl, 0);
            if buckets >= 8 {
                assert_eq!(buckets / 8 * 7, t.table.capacity());
            }
            for e in t.table.iter() {
                let at = e as *const B as usize;
                let i = (ctrl - at) / bucket - 1;
                assert_eq!(ctrl - at, (i + 1) * bucket);
                assert!(i < buckets);
                // Its probe starts within a group of 16 buckets of it (the table is
                // sparse enough here for every block to be found in its first group).
                let home = addr_hash(t.addr(e)) as usize & (buckets - 1);
                assert!(i.wrapping_sub(home) & (buckets - 1) < 16, "{i} {home}");
            }
        };
        let mut t = Table::<B>::default();
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
        t.table = hashbrown::HashTable::new_in(HugePages::of::<B>());
        assert_eq!(noted(&t).0, 0);
    }

    /// A table grown here holds each block in the bucket hashbrown would put it in: the
    /// same insertions and removals into a table left to hashbrown read back in the same
    /// order, through growths of full tables with removed buckets and without.
    #[test]
    fn a_table_grown_here_is_laid_out_as_hashbrown_lays_it_out() {
        let mut ours = Table::<Timed>::default();
        let mut theirs: hashbrown::HashTable<Timed, HugePages> =
            hashbrown::HashTable::new_in(HugePages::of::<Timed>());
        let hash = |e: &Timed| addr_hash(e.key());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..300_000u64 {
            let r = crate::xorshift(&mut x);
            // Addresses from a range that widens, so that the table grows with removals
            // between its growths.
            let addr = 0x7f00_0000_0000 + (r >> 24) % (256 << (step / 20_000)) * 16;
            let b = LiveBlock {
                size: r % 300,
                ..Default::default()
            };
            if r.is_multiple_of(3) {
                ours.remove(addr);
                if let Ok(e) = theirs.find_entry(addr_hash(addr), |e| e.key() == addr) {
                    e.remove();
                }
            } else {
                ours.insert(addr, b);
                let packed = Timed::of(addr, &b).unwrap();
                match theirs.entry(addr_hash(addr), |e| e.key() == addr, hash) {
                    hashbrown::hash_table::Entry::Occupied(mut o) => *o.get_mut() = packed,
                    hashbrown::hash_table::Entry::Vacant(v) => {
                        v.insert(packed);
                    }
                }
            }
            if step % 5000 == 0 || step == 299_999 {
                let order = |t: &hashbrown::HashTable<Timed, HugePages>| -> Vec<u64> {
                    t.iter().map(|b| b.key()).collect()
                };
                assert_eq!(order(&ours.table), order(&theirs), "step {step}");
            }
        }
        assert!(ours.grown_here >= 5, "grown here {} times", ours.grown_here);
    }

    /// A block ended and made live again at once (`replace_where_it_lies`, else a removal
    /// and an insertion) leaves the table as a removal and an insertion alone do: the
    /// same blocks read back in the same order, with the same room, through growths and
    /// removed buckets, whether the bucket was taken where it lay or not.
    #[test]
    fn a_block_taken_again_where_it_lies_leaves_the_table_as_removal_and_insertion_do() {
        taken_again_as_removed_and_inserted::<Timed>();
        taken_again_as_removed_and_inserted::<Untimed>();
        taken_again_as_removed_and_inserted::<Unstacked>();
        taken_again_as_removed_and_inserted::<Small>();
    }

    fn taken_again_as_removed_and_inserted<B: Packing>() {
        let (mut ours, mut theirs) = (Table::<B>::default(), Table::<B>::default());
        let mut live: Vec<u64> = Vec::new();
        let (mut in_place, mut not) = (0, 0);
        let mut take_again =
            |ours: &mut Table<B>, theirs: &mut Table<B>, addr: u64, b: LiveBlock| {
                let old = theirs.remove(addr);
                theirs.insert(addr, b);
                match ours.replace_where_it_lies(addr, b) {
                    Some(was) => {
                        assert_eq!(Some(was), old);
                        in_place += 1;
                    }
                    None => {
                        assert_eq!(ours.remove(addr), old);
                        ours.insert(addr, b);
                        not += 1;
                    }
                }
            };
        let order = |t: &Table<B>| -> Vec<(u64, LiveBlock)> { t.iter().collect() };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..400_000u64 {
            let r = crate::xorshift(&mut x);
            let b = LiveBlock {
                size: r % 300,
                // A stack on one block in 16, as sampled stacks are rare (a table
                // without stacks keeps such a block beside it).
                stack: if r >> 60 == 0 {
                    (r >> 40) as u32 & 0xff
                } else {
                    0
                },
                ..Default::default()
            };
            match r % 8 {
                // Taken again: a live block's address, freed and allocated at once.
                0..=3 if !live.is_empty() => {
                    let addr = live[(r >> 16) as usize % live.len()];
                    take_again(&mut ours, &mut theirs, addr, b);
                }
                4 if !live.is_empty() => {
                    let addr = live.swap_remove((r >> 16) as usize % live.len());
                    assert_eq!(ours.remove(addr), theirs.remove(addr));
                }
                _ => {
                    // From a range that widens, so that the table grows.
                    let addr = 0x7f00_0000_0000 + (r >> 24) % (4096 << (step / 50_000)) * 16;
                    if ours.insert(addr, b).is_none() {
                        live.push(addr);
                    }
                    theirs.insert(addr, b);
                }
            }
            if step % 10_000 == 0 || step == 399_999 {
                assert_eq!(order(&ours), order(&theirs), "step {step}");
                assert_eq!(ours.table.capacity(), theirs.table.capacity());
            }
        }
        // A block taken again in a table filled to its capacity: its blocks side by side
        // fill a run of buckets side by side, where a removal marks its bucket removed
        // rather than empty and so leaves no room (hashbrown then grows the table before
        // the insertion; a bucket taken where it lies would not).
        for grown in 0..6 {
            let (mut ours, mut theirs) = (Table::<B>::default(), Table::<B>::default());
            let mut k = 0u64;
            loop {
                let addr = 0x7e00_0000_0000 + k * 16;
                ours.insert(addr, LiveBlock::default());
                theirs.insert(addr, LiveBlock::default());
                k += 1;
                if ours.len() == ours.table.capacity() && ours.len() > 64 << grown {
                    break;
                }
            }
            let before = theirs.table.capacity();
            let middle = 0x7e00_0000_0000 + k / 2 * 16;
            let b = LiveBlock {
                size: 7,
                ..Default::default()
            };
            take_again(&mut ours, &mut theirs, middle, b);
            assert!(theirs.table.capacity() > before, "{grown}: not grown");
            assert_eq!(order(&ours), order(&theirs), "{grown}");
            assert_eq!(ours.table.capacity(), theirs.table.capacity(), "{grown}");
        }
        assert!(
            in_place > 100_000 && not > 1_000,
            "{in_place} in place, {not} not"
        );
    }

    /// A table of blocks without stacks takes 6-byte buckets as it grows while nearly all
    /// its blocks fit them, and 8-byte ones again at a growth where too many do not: its
    /// blocks read back as a table of 16-byte buckets reads the same ones, in the same
    /// order, through every change of buckets.
    #[test]
    fn a_table_of_small_blocks_changes_buckets_as_it_grows_and_reads_the_same() {
        let mut changing = Blocks::without_birth_ticks(true);
        let mut whole = Blocks::without_birth_ticks(false);
        let mut live: Vec<u64> = Vec::new();
        let mut x = 0x5851_f42d_4c95_7f2du64;
        let mut forms = Vec::new();
        let form = |t: &Blocks| match t {
            Blocks::Small(_) => "small",
            Blocks::Unstacked(_) => "unstacked",
            _ => "other",
        };
        // Small blocks; then one in 24 of 2000 bytes (more than one in 64 at the next
        // growth, never more than one in 16); then small ones again.
        for (phase, (steps, big_every)) in [(60_000u64, 0u64), (120_000, 24), (400_000, 0)]
            .into_iter()
            .enumerate()
        {
            if phase == 2 {
                // The big blocks end.
                live.retain(|&addr| {
                    let big = changing.get(addr).is_some_and(|b| b.size == 2000);
                    if big {
                        assert_eq!(changing.remove(addr), whole.remove(addr));
                    }
                    !big
                });
            }
            for step in 0..steps {
                let r = crate::xorshift(&mut x);
                if r.is_multiple_of(4) && !live.is_empty() {
                    let addr = live.swap_remove((r >> 8) as usize % live.len());
                    assert_eq!(changing.remove(addr), whole.remove(addr));
                    continue;
                }
                let b = LiveBlock {
                    size: if big_every > 0 && r % big_every == 1 {
                        2000
                    } else {
                        r >> 40 & 511
                    },
                    rounding: (r >> 20) as u32 & 15,
                    inherited: r >> 63 == 0,
                    ..Default::default()
                };
                let addr = 0x7f00_0000_0000 + (r >> 24) % (1 << 22) * 16;
                let replaced = changing.insert(addr, b);
                assert_eq!(replaced, whole.insert(addr, b));
                if replaced.is_none() {
                    live.push(addr);
                }
                if step % 4096 == 0 {
                    let all = |t: &Blocks| t.iter().collect::<Vec<_>>();
                    assert_eq!(all(&changing), all(&whole), "phase {phase} step {step}");
                    if forms.last() != Some(&form(&changing)) {
                        forms.push(form(&changing));
                    }
                }
            }
        }
        assert_eq!(forms, ["unstacked", "small", "unstacked", "small"]);
        let all = |t: &Blocks| t.iter().collect::<Vec<_>>();
        assert_eq!(all(&changing), all(&whole));
        assert_eq!(changing.len(), live.len());
    }

    /// A table of 6-byte buckets whose blocks grow bigger takes 8-byte buckets before it
    /// holds more than one block in 16 beside it, without waiting to grow; every block
    /// reads back as it went in.
    #[test]
    fn a_table_of_small_blocks_that_grow_bigger_changes_buckets_at_once() {
        let mut changing = Blocks::without_birth_ticks(true);
        let mut whole = Blocks::without_birth_ticks(false);
        let mut x = 0x1405_7b7e_f767_814fu64;
        let mut insert = |changing: &mut Blocks, size: u64| {
            let r = crate::xorshift(&mut x);
            let addr = 0x7f00_0000_0000 + (r >> 24) % (1 << 22) * 16;
            let b = LiveBlock {
                size,
                ..Default::default()
            };
            assert_eq!(changing.insert(addr, b), whole.insert(addr, b));
        };
        for _ in 0..40_000 {
            insert(&mut changing, 40);
        }
        assert!(matches!(changing, Blocks::Small(_)));
        let mut big = 0;
        while matches!(changing, Blocks::Small(_)) {
            insert(&mut changing, 2000);
            big += 1;
            let Blocks::Small(t) = &changing else { break };
            assert!(t.wide.len() <= t.table.len() / Blocks::MOST_BESIDE + 1);
            assert!(!t.is_full(), "{big} big blocks: a full table grows");
        }
        assert!(matches!(changing, Blocks::Unstacked(_)), "{big}");
        let sorted = |t: &Blocks| {
            let mut all: Vec<_> = t.iter().collect();
            all.sort_by_key(|e| e.0);
            all
        };
        assert_eq!(sorted(&changing), sorted(&whole));
    }

    /// Every block comes back as it went in: packed, or whole beside the table when its
    /// size or rounding is too large, or apart from it at an address above 48 bits,
    /// through replacement, removal and iteration; in a table without birth ticks, with a
    /// tick of 0 and all else the same.
    #[test]
    fn blocks_come_back_whole_packed_or_not() {
        blocks_come_back_whole(Blocks::default());
        blocks_come_back_whole(Blocks::without_birth_ticks(false));
        blocks_come_back_whole(Blocks::without_birth_ticks(true));
        blocks_come_back_whole(Blocks::Small(Table::default()));
    }

    fn blocks_come_back_whole(mut t: Blocks) {
        let timed = matches!(t, Blocks::Timed(_));
        // A table made like it (a child's at a fork) holds what it holds.
        assert_eq!(
            std::mem::discriminant(&t.empty_like(4)),
            std::mem::discriminant(&t)
        );
        let block = |size: u64, rounding: u32, inherited: bool, stacked: bool| LiveBlock {
            size,
            rounding,
            stack: if stacked {
                7 | u32::from(inherited) << 31
            } else {
                0
            },
            born_tick: u32::MAX - size as u32 % 5,
            inherited,
        };
        let kinds: Vec<LiveBlock> = [false, true]
            .into_iter()
            .flat_map(|stacked| {
                [
                    block(0, 0, false, stacked),
                    block(24, 8, true, stacked),
                    block(u64::from(u32::MAX) - 1, (1 << 15) - 1, true, stacked),
                    block(u64::from(u32::MAX), 0, false, stacked),
                    block(1 << 40, 12, true, stacked),
                    block(100, 1 << 15, false, stacked),
                    block(100, 1 << 31, false, stacked),
                    block(100, u32::MAX, true, stacked),
                    block(Unstacked::WIDE - 1, (1 << 12) - 1, true, stacked),
                    block(Unstacked::WIDE, 16, false, stacked),
                    block(Unstacked::WIDE + 1, 0, true, stacked),
                    block(4000, 1 << 12, true, stacked),
                    block(u64::from(Small::WIDE) - 1, 31, true, stacked),
                    block(u64::from(Small::WIDE), 0, false, stacked),
                    block(16, 32, true, stacked),
                ]
            })
            .collect();
        // Each kind at a low address, at the highest that fits a 48-bit bucket, and above
        // it; not 16-byte aligned; and in 14 more windows of 4 GiB, 18 in all.
        let mut places = vec![
            0x10_0000,
            ADDR_MASK & !0xfff,
            1 << ADDR_BITS,
            !0xfff,
            0x20_0008,
        ];
        places.extend((0..14).map(|w| 0x7f00_0000_0000 + (w << 32)));
        let blocks: Vec<(u64, LiveBlock)> = (places.iter())
            .flat_map(|&at| (kinds.iter().enumerate()).map(move |(i, b)| (at + i as u64 * 16, *b)))
            .collect();
        // The windows of 32-bit addresses, in the order they are taken.
        let mut windows: Vec<u64> = Vec::new();
        for &at in places.iter().filter(|at| at.is_multiple_of(16)) {
            if !windows.contains(&(at >> 32)) {
                windows.push(at >> 32);
            }
        }
        // What comes back of block `b` at `addr`: without ticks, none, packed or not.
        let back = |_addr: u64, b: LiveBlock| {
            let born_tick = if timed { b.born_tick } else { 0 };
            LiveBlock { born_tick, ..b }
        };
        for &(addr, b) in &blocks {
            assert_eq!(t.insert(addr, b), None);
        }
        for &(addr, b) in &blocks {
            assert_eq!(t.get(addr), Some(back(addr, b)), "{addr:#x} {b:?}");
        }
        let mut seen: Vec<(u64, LiveBlock)> = t.iter().collect();
        seen.sort_by_key(|e| e.0);
        let mut expected: Vec<_> = blocks.iter().map(|&(a, b)| (a, back(a, b))).collect();
        expected.sort_by_key(|e| e.0);
        assert_eq!(seen, expected);
        // Each replaced by the next kind (a wide block by a packed one and back).
        let next = |i: usize| blocks[(i + 1) % kinds.len() + i / kinds.len() * kinds.len()].1;
        for (i, &(addr, b)) in blocks.iter().enumerate() {
            assert_eq!(t.insert(addr, next(i)), Some(back(addr, b)));
            assert_eq!(t.get(addr), Some(back(addr, next(i))));
        }
        for (i, &(addr, _)) in blocks.iter().enumerate() {
            assert_eq!(t.remove(addr), Some(back(addr, next(i))));
            assert_eq!(t.remove(addr), None);
        }
        assert_eq!(t.len(), 0);
        each!(&t, t => assert!(t.wide.is_empty() && t.far.is_empty()));
        assert!(windows.len() > AddressWindows::COUNT);
    }
}
