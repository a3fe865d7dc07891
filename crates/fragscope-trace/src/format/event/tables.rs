//! What a stream's records mean beyond their own chunk, kept alike by the packed form's
//! writer ([`super::packed_writer`]) and by the decoder ([`super::ChunkDecoder`]), call by
//! call, so that the two cannot drift apart: the usable sizes of small requests, the live
//! blocks by slot, and each thread's recently freed blocks.

use crate::format::hash::{addr_hash, prefetch, AddressWindows, FastMap};

/// Recently freed blocks remembered per thread and usable size (allocator thread caches
/// hand the last freed block of a size class back first).
const FREED_DEPTH: usize = 8;

/// Sizes below this have their usable size given once per thread by a usable record.
pub const USABLE_TABLE: u64 = 32768;

/// What a stream's records mean beyond their own chunk, kept from chunk to chunk by the
/// writer and the reader alike: the usable sizes of small requests and, for the packed
/// form, the live blocks by slot and each thread's recently freed blocks.
#[derive(Default)]
pub struct StreamTables {
    usable: Vec<u32>,
    /// The reader's live blocks by slot, and its free slots. (The writer finds them by
    /// address in `slot_of` instead.) Both sides give a new block the slot freed last, or
    /// else the next one never used.
    live: SlotTable,
    /// The writer's live blocks by address, with their slots and usable sizes, and its
    /// free slots.
    slot_of: Option<AddrSlots>,
    /// Blocks each thread freed last, by thread and usable size.
    freed: FreedTables,
}

/// A thread's recently freed blocks of one usable size: a ring, newest at `newest`.
#[derive(Default, Clone, Copy)]
struct Freed {
    addrs: [u64; FREED_DEPTH],
    newest: u8,
    len: u8,
}

impl Freed {
    /// Where the block `depth` places below the newest is.
    #[inline]
    fn at(&self, depth: usize) -> usize {
        (self.newest as usize).wrapping_sub(depth) % FREED_DEPTH
    }

    /// Remembers `addr` as the newest; the oldest drops out of a full list.
    #[inline]
    fn push(&mut self, addr: u64) {
        self.newest = ((self.newest as usize + 1) % FREED_DEPTH) as u8;
        self.addrs[self.newest as usize] = addr;
        self.len = (self.len + 1).min(FREED_DEPTH as u8);
    }

    /// How far below the newest `addr` is, if it is in the list.
    fn depth_of(&self, addr: u64) -> Option<usize> {
        (0..self.len as usize).find(|&d| self.addrs[self.at(d)] == addr)
    }

    /// Takes out the block `depth` places below the newest; the newer ones move down.
    #[inline]
    fn take(&mut self, depth: usize) -> Option<u64> {
        if depth >= self.len as usize {
            return None;
        }
        let addr = self.addrs[self.at(depth)];
        for d in (1..=depth).rev() {
            self.addrs[self.at(d)] = self.addrs[self.at(d - 1)];
        }
        self.newest = self.at(1) as u8;
        self.len -= 1;
        Some(addr)
    }
}

/// Usable sizes below this that are multiples of 8 have their lists in an array.
const SMALL_USABLE: u32 = 4096;

/// One thread's lists of recently freed blocks, by usable size.
#[derive(Default)]
struct ThreadFreed {
    /// By usable size / 8, grown to the largest size seen.
    small: Vec<Freed>,
    large: FastMap<u32, Freed>,
}

impl ThreadFreed {
    /// The index in `small` of a usable size kept there.
    #[inline]
    fn small_index(usable: u32) -> Option<usize> {
        (usable < SMALL_USABLE && usable.is_multiple_of(8)).then_some((usable / 8) as usize)
    }

    #[inline]
    fn get_mut(&mut self, usable: u32) -> Option<&mut Freed> {
        if let Some(i) = Self::small_index(usable) {
            self.small.get_mut(i)
        } else {
            self.large.get_mut(&usable)
        }
    }

    #[inline]
    fn list(&mut self, usable: u32) -> &mut Freed {
        if let Some(i) = Self::small_index(usable) {
            if i >= self.small.len() {
                self.small.resize(i + 1, Freed::default());
            }
            &mut self.small[i]
        } else {
            self.large.entry(usable).or_default()
        }
    }
}

/// Every thread's recently freed blocks. A buffer is one thread's, so the lists of the
/// thread last asked for are kept at hand, out of the map.
#[derive(Default)]
struct FreedTables {
    tid: u32,
    current: ThreadFreed,
    others: FastMap<u32, ThreadFreed>,
}

impl FreedTables {
    #[inline(always)]
    fn of(&mut self, tid: u32) -> &mut ThreadFreed {
        if tid != self.tid {
            self.switch_to(tid);
        }
        &mut self.current
    }

    #[cold]
    fn switch_to(&mut self, tid: u32) {
        let mine = self.others.remove(&tid).unwrap_or_default();
        let last = std::mem::replace(&mut self.current, mine);
        self.others.insert(self.tid, last);
        self.tid = tid;
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl StreamTables {
    /// The tables of a packed form's writer, which finds blocks by address.
    pub(crate) fn for_writer() -> Self {
        Self {
            slot_of: Some(AddrSlots::default()),
            ..Self::default()
        }
    }

    /// Forgets the live blocks and the recently freed ones (a chunk flagged
    /// [`EventsHeader::tables_reset`](crate::format::records::EventsHeader::tables_reset)); usable sizes stay.
    pub(crate) fn forget_blocks(&mut self) {
        self.live.clear();
        if let Some(index) = &mut self.slot_of {
            *index = AddrSlots::default();
        }
        self.freed.clear();
    }

    pub(crate) fn set_usable(&mut self, size: u64, usable: u64) {
        if size < USABLE_TABLE {
            if self.usable.len() < USABLE_TABLE as usize {
                self.usable.resize(USABLE_TABLE as usize, 0);
            }
            self.usable[size as usize] = usable.min(u64::from(u32::MAX)) as u32;
        }
    }

    /// The usable size of a malloc or calloc of `size`, from the table.
    #[inline]
    pub(super) fn table_usable(&self, size: u64) -> Option<u64> {
        if size >= USABLE_TABLE {
            return None;
        }
        self.usable
            .get(size as usize)
            .copied()
            .filter(|&u| u != 0)
            .map(u64::from)
    }

    /// Asks for the memory of the reader's block in `slot`, ahead of its free.
    #[inline(always)]
    pub(super) fn prefetch_slot(&self, slot: u64) {
        if let Some(at) = self.live.at(slot as usize) {
            prefetch(at as *const [u16; 3] as usize);
        }
    }

    /// Ends the block in `slot`, whose slot becomes the next one taken; a block freed by
    /// `tid` (`by_free`) is remembered as the next one that thread may get back.
    #[inline(always)]
    pub(super) fn end_slot(&mut self, slot: u32, tid: u32, by_free: bool) -> Option<u64> {
        let Slot { addr, usable } = self.live.release(slot as usize);
        if addr == 0 {
            return None;
        }
        self.block_ended(addr, usable, tid, by_free);
        Some(addr)
    }

    /// The block `addr` of `usable` bytes ended: a free's is the next its thread may get
    /// back.
    #[inline(always)]
    fn block_ended(&mut self, addr: u64, usable: u32, tid: u32, by_free: bool) {
        if by_free && usable != 0 {
            self.freed.of(tid).list(usable).push(addr);
        }
    }

    /// Writer: ends the live block at `addr`, if there is one, and returns its slot.
    #[inline]
    pub(super) fn end_block(&mut self, addr: u64, tid: u32, by_free: bool) -> Option<u32> {
        let (slot, usable) = self.slot_of.as_mut()?.remove(addr)?;
        self.block_ended(addr, usable, tid, by_free);
        Some(slot)
    }

    /// Writer: if `addr` is among the blocks `tid` freed last at `usable` bytes, claims
    /// it and says where it was (0: the last).
    #[inline]
    pub(super) fn take_if_freed(&mut self, tid: u32, usable: u64, addr: u64) -> Option<u64> {
        let f = self.freed.of(tid).get_mut(u32::try_from(usable).ok()?)?;
        let depth = f.depth_of(addr)?;
        f.take(depth);
        Some(depth as u64)
    }

    /// Reader: claims the block `depth` places below the one `tid` freed last at
    /// `usable` bytes.
    #[inline]
    pub(super) fn take_freed(&mut self, tid: u32, usable: u64, depth: u64) -> Option<u64> {
        let f = self.freed.of(tid).get_mut(u32::try_from(usable).ok()?)?;
        f.take(usize::try_from(depth).ok()?)
    }

    /// A block became live at `addr`, in the slot freed last (or a new one). An address
    /// still live in another slot (its free was never recorded) leaves that slot taken
    /// for good, on both sides alike: the writer's index names the new one.
    #[inline]
    pub(super) fn allocated(&mut self, addr: u64, usable: Option<u64>) {
        let usable = usable.map_or(0, |u| u.min(u64::from(u32::MAX)) as u32);
        match &mut self.slot_of {
            Some(index) => index.insert(addr, usable),
            None => {
                let slot = self.live.claim();
                self.live.set(slot, Slot { addr, usable });
            }
        }
    }
}

/// A reader's live block: its address (0: a free slot) and usable size (0: not known).
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct Slot {
    addr: u64,
    usable: u32,
}

/// The reader's live blocks by slot, 6 bytes each (see [`SlotTable::value`]): the address
/// in 32 bits, within one of the windows of 4 GiB where the stream's blocks lie
/// ([`AddressWindows`]), and the usable size. A block whose address or usable size does
/// not fit (another window, an address not 16-byte aligned, a usable size of 64 KiB or
/// more) is kept whole in a map beside, its slot marked
/// [`SlotTable::BESIDE`]. In segments of [`SlotTable::SEGMENT`] slots: a vector of them
/// grew by doubling, which copied every slot and held the old copy and the new, twice the
/// memory, at each step (96 MiB for the 3.6 M live blocks of a redis-server under load).
/// Whatever holds a block is paid for each live block of the stream: a redis-server's
/// report made 6.3 M slots, 48 MiB at 8 bytes each, 36 MiB at 6.
///
/// The free slots are a list through their own slots, marked [`SlotTable::FREE`], the one
/// freed last first: a vector of their numbers beside the table held 8 MiB at the peak of
/// a redis-server trace's report.
#[derive(Default)]
struct SlotTable {
    segments: Vec<Box<[[u16; 3]]>>,
    len: usize,
    beside: FastMap<u32, Slot>,
    /// The free slot a new block takes, plus one (0: none, the next new slot).
    free_head: u32,
    /// The windows blocks lie in.
    windows: AddressWindows,
}

impl SlotTable {
    const SEGMENT: usize = 1 << 12;
    /// The mark of a block kept beside (usable sizes below [`SlotTable::FREE`] fit).
    const BESIDE: u16 = u16::MAX;
    /// The mark of a free slot, whose low 32 bits are the next free slot plus one.
    const FREE: u16 = u16::MAX - 1;

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    /// A slot's 48 bits: its usable size or mark in the top 16; below them, for a block,
    /// its address in 32 bits ([`AddressWindows`]).
    #[inline(always)]
    fn value(s: [u16; 3]) -> (u32, u16) {
        (u32::from(s[0]) | u32::from(s[1]) << 16, s[2])
    }

    #[inline(always)]
    fn slot_of(low: u32, mark: u16) -> [u16; 3] {
        [low as u16, (low >> 16) as u16, mark]
    }

    #[inline(always)]
    fn at(&self, slot: usize) -> Option<&[u16; 3]> {
        if slot >= self.len {
            return None;
        }
        Some(&self.segments[slot / Self::SEGMENT][slot % Self::SEGMENT])
    }

    #[inline(always)]
    fn at_mut(&mut self, slot: usize) -> Option<&mut [u16; 3]> {
        if slot >= self.len {
            return None;
        }
        Some(&mut self.segments[slot / Self::SEGMENT][slot % Self::SEGMENT])
    }

    /// The block a slot holds (address 0 for a free slot), or `None` when it is kept
    /// beside.
    #[inline(always)]
    fn in_slot(&self, s: [u16; 3]) -> Option<Slot> {
        let (low, mark) = Self::value(s);
        match mark {
            Self::BESIDE => None,
            Self::FREE => Some(Slot::default()),
            usable => Some(Slot {
                addr: self.windows.addr(low),
                usable: u32::from(usable),
            }),
        }
    }

    /// The low 32 bits of block `b` in a slot, when it fits one.
    #[inline(always)]
    fn packed(&mut self, b: Slot) -> Option<u32> {
        if b.usable >= u32::from(Self::FREE) {
            return None;
        }
        self.windows.short_or_add(b.addr)
    }

    /// The block in `slot` (address 0: none, or no such slot).
    #[cfg(test)]
    fn get(&self, slot: usize) -> Slot {
        self.at(slot).map_or_else(Slot::default, |&s| {
            self.in_slot(s)
                .unwrap_or_else(|| self.beside[&(slot as u32)])
        })
    }

    /// Ends the block in `slot` and returns it, the slot becoming the next a new block
    /// takes; a slot with no block is left as it is (address 0).
    #[inline(always)]
    fn release(&mut self, slot: usize) -> Slot {
        let Some(&s) = self.at(slot) else {
            return Slot::default();
        };
        let block = match self.in_slot(s) {
            Some(b) => b,
            None => self.beside.remove(&(slot as u32)).unwrap_or_default(),
        };
        if block.addr == 0 {
            return block;
        }
        let link = Self::slot_of(self.free_head, Self::FREE);
        if let Some(s) = self.at_mut(slot) {
            *s = link;
        }
        self.free_head = slot as u32 + 1;
        block
    }

    /// The slot a new block takes: the one freed last, or else a new one.
    #[inline(always)]
    fn claim(&mut self) -> usize {
        if let Some(slot) = self.free_head.checked_sub(1) {
            self.free_head = self.at(slot as usize).map_or(0, |&s| Self::value(s).0);
            return slot as usize;
        }
        if self.len.is_multiple_of(Self::SEGMENT) {
            self.segments
                .push(vec![[0; 3]; Self::SEGMENT].into_boxed_slice());
        }
        self.len += 1;
        self.len - 1
    }

    /// Puts block `b` in `slot`, which [`SlotTable::claim`] gave.
    #[inline(always)]
    fn set(&mut self, slot: usize, b: Slot) {
        let s = match self.packed(b) {
            Some(low) => Self::slot_of(low, b.usable as u16),
            None => {
                self.beside.insert(slot as u32, b);
                Self::slot_of(0, Self::BESIDE)
            }
        };
        if let Some(at) = self.at_mut(slot) {
            *at = s;
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Address to slot, for the writer of the packed form, and its free slots (a new block
/// takes the slot freed last, as the reader's [`SlotTable`] gives it). Every call makes
/// one lookup and one insert or remove here. A hashbrown table keyed by the address's
/// locality hash (as the merge's live table): a hand-written open-addressing table with
/// backward-shift deletion cost 108 instructions a remove and 71 an insert.
#[derive(Default)]
struct AddrSlots {
    /// (address, slot, usable size).
    entries: hashbrown::HashTable<(u64, u32, u32)>,
    /// Slots ever used: a new block with no free slot takes the next one.
    slots_made: u32,
    /// Free slots, the one freed last on top.
    free_slots: Vec<u32>,
}

impl AddrSlots {
    #[cfg(test)]
    fn get(&self, addr: u64) -> Option<u32> {
        self.entries
            .find(addr_hash(addr), |e| e.0 == addr)
            .map(|e| e.1)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// A block became live at `addr`: it takes the slot freed last, or a new one.
    #[inline(always)]
    fn insert(&mut self, addr: u64, usable: u32) {
        if addr == 0 {
            return;
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.slots_made += 1;
            self.slots_made - 1
        });
        self.entries
            .entry(addr_hash(addr), |e| e.0 == addr, |e| addr_hash(e.0))
            .insert((addr, slot, usable));
    }

    /// Removes `addr`, returning its slot (now free) and usable size.
    #[inline(always)]
    fn remove(&mut self, addr: u64) -> Option<(u32, u32)> {
        let entry = self
            .entries
            .find_entry(addr_hash(addr), |e| e.0 == addr)
            .ok()?;
        let (_, slot, usable) = *entry.get();
        entry.remove();
        self.free_slots.push(slot);
        Some((slot, usable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_of_freed_blocks_keeps_the_newest_in_order() {
        // Against a plain list, newest last: pushes past the depth drop the oldest, and a
        // take from the middle closes the gap.
        let mut ring = Freed::default();
        let mut list: Vec<u64> = Vec::new();
        let mut x = 7u64;
        for step in 0..2000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if x >> 62 == 0 && !list.is_empty() {
                let depth = (x >> 8) as usize % (list.len() + 1);
                let want = list.len().checked_sub(1 + depth).map(|i| list.remove(i));
                assert_eq!(ring.take(depth), want, "step {step}");
            } else {
                ring.push(step);
                list.push(step);
                if list.len() > FREED_DEPTH {
                    list.remove(0);
                }
            }
            for (depth, &a) in list.iter().rev().enumerate() {
                assert_eq!(ring.depth_of(a), Some(depth));
            }
        }
    }

    /// Slots across segments hold what was put in them, in their slot or beside it (an
    /// address not 16-byte aligned or in a 4 GiB window past the first 16 seen, a usable
    /// size of 64 KiB or more); past the last made there is none; a freed slot is the next
    /// taken, the one freed last first, and a slot freed twice gives nothing the second
    /// time.
    #[test]
    fn the_slot_table_keeps_each_slot_across_segments() {
        let mut t = SlotTable::default();
        let n = 2 * SlotTable::SEGMENT + 5;
        let block = |i: usize| Slot {
            addr: match i % 7 {
                3 => 0x1_0000_0000_0000 + i as u64 * 16,
                5 => 0x5555_0000_0000 + i as u64 * 16 + 8,
                // 24 windows of 4 GiB, blocks up to the top of each.
                _ => 0x7f00_0000_0000 + (((i % 24) as u64) << 32) + (!i as u64 & 0xffff_fff0),
            },
            usable: match i % 5 {
                2 => 70_000 + i as u32,
                4 => 65_534 - (i % 2) as u32,
                _ => i as u32 % 65_534,
            },
        };
        for i in 0..n {
            assert_eq!(t.get(i), Slot::default());
            assert_eq!(t.claim(), i);
            t.set(i, block(i));
        }
        assert_eq!(t.len(), n);
        assert_eq!(t.windows.len(), AddressWindows::COUNT);
        assert!(!t.beside.is_empty() && t.beside.len() < n * 2 / 3);
        for i in (0..n).rev() {
            assert_eq!(t.get(i), block(i), "slot {i}");
        }
        let freed: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
        for &i in &freed {
            assert_eq!(t.release(i), block(i), "slot {i}");
            assert_eq!(t.get(i).addr, 0);
            assert_eq!(t.release(i), Slot::default(), "slot {i} again");
        }
        assert_eq!(t.release(n), Slot::default());
        assert!(t.beside.keys().all(|&s| s % 3 == 1));
        for &i in freed.iter().rev() {
            assert_eq!(t.claim(), i);
            t.set(i, block(i + 1));
        }
        assert_eq!(t.claim(), n, "every freed slot taken, then a new one");
        for i in 0..n {
            let want = if i % 3 != 1 { block(i + 1) } else { block(i) };
            assert_eq!(t.get(i), want, "slot {i}");
        }
        t.clear();
        assert!(t.len() == 0 && t.at(0).is_none() && t.claim() == 0);
    }

    #[test]
    fn the_address_index_agrees_with_a_hash_map() {
        // Few distinct addresses, so the same ones are inserted and removed many times.
        // A new block takes the slot freed last, or the next never used; an address
        // inserted again while live (its free was lost) takes a new slot and leaves its
        // old one taken for good.
        let mut index = AddrSlots::default();
        let mut want = std::collections::HashMap::new();
        let (mut free, mut made, mut inserts) = (Vec::new(), 0u32, 0u32);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000u32 {
            crate::xorshift(&mut x);
            let addr = 0x7f00_0000_0000 + (x % 5000) * 16;
            match x >> 62 {
                0 | 1 => {
                    index.insert(addr, step / 3);
                    inserts += 1;
                    let slot = free.pop().unwrap_or_else(|| {
                        made += 1;
                        made - 1
                    });
                    want.insert(addr, (slot, step / 3));
                }
                2 => {
                    let gone = want.remove(&addr);
                    free.extend(gone.map(|g| g.0));
                    assert_eq!(index.remove(addr), gone, "step {step}");
                }
                _ => assert_eq!(index.get(addr), want.get(&addr).map(|e| e.0), "step {step}"),
            }
            assert_eq!(index.len(), want.len());
        }
        assert!(
            made < inserts * 3 / 4,
            "{made} slots made for {inserts} blocks"
        );
        for (addr, (slot, _)) in want {
            assert_eq!(index.get(addr), Some(slot));
        }
    }
}
