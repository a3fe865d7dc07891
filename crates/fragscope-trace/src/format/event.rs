//! Event records: what the interposer writes into a thread's buffer, and their decoder.
//!
//! ```text
//! record  := tag:u8 body
//! tag     := kind (low 4 bits) | flags (high 4 bits)
//! flags   := 0x10 STACK      a stack id follows the body
//!            0x20 UNALIGNED  the address delta is in bytes (else in 16-byte units)
//!            0x40 NULL       no address (NULL returned, or free(NULL))
//!            0x80 USABLE     usable-minus-requested size follows
//! kind 0..8  allocation:  [realloc_flags:u8 (kinds 2,3)] [old delta (kinds 2,3)]
//!                         [addr delta] size:varint [align:varint (kinds 4..8)]
//!                         [usable-size:varint] [stack:varint]
//! kind 9     free:        [addr delta]
//! kind 10    tick:        delta:varint       (ms since the previous tick record);
//!            with flag 0x20, order: delta:varint (the shared order counter, which
//!            counts every thread's frees within the tick, moved on by `delta` since
//!            this thread's last call: see "Order" in docs/trace-format.md);
//!            with flag 0x10, an anchor of older traces: cycles:varint (skipped)
//! kind 11    stack:       id:varint depth:varint frame-delta:svarint*depth
//! kind 12    usable:      size:varint usable:varint (for malloc/calloc of `size`)
//! kind 13    stats:       source:u8 count:u8 (name_len:u8 name value:varint)*count
//! kind 14    lost:        count:varint (events a signal handler could not queue);
//!            with flag 0x10, joined: tid:varint (this thread joined thread `tid`: all
//!            of that thread's records come before this thread's next ones);
//!            with flag 0x20, forked: mark:varint (this thread forked here; the child's
//!            Process chunk names `mark`)
//! kind 15    own memory:  bytes:varint (the interposer's own mapped bytes, process-wide)
//! addr delta := svarint of (address - previous address in this chunk), the previous
//!               address being 0 at a chunk's start; in 16-byte units unless UNALIGNED.
//! ```
//! The kinds 0..9 are the hooks listed in crates/fragscope-record/preload/hooks.h.
//!
//! The recorder rewrites each buffer into the *packed* form ([`crate::format::pack`]) before it
//! is stored: the same records, except that an address the stream has seen before is
//! named instead of spelled out. A free names its block by its slot in the stream's
//! table of live blocks (SLOT, 0x10: `slot:varint` instead of the delta), a realloc's
//! old block likewise (realloc flag 4), and a malloc or calloc that returned the block
//! its thread freed last at that usable size says so (PREDICTED: UNALIGNED|NULL, no
//! address). Both sides keep the tables ([`StreamTables`]) the same way, call by call;
//! only the writer needs to find a slot by address.

use crate::format::columns::{ColumnWriter, Field, FieldReader};
use crate::format::hash::{addr_hash, FastMap};
use crate::format::records::EventsHeader;
use crate::format::TraceError;

/// A malloc-family function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Func {
    Malloc = 0,
    Calloc = 1,
    Realloc = 2,
    Reallocarray = 3,
    PosixMemalign = 4,
    AlignedAlloc = 5,
    Memalign = 6,
    Valloc = 7,
    Pvalloc = 8,
    Free = 9,
}

impl Func {
    pub const ALL: [Func; 10] = [
        Func::Malloc,
        Func::Calloc,
        Func::Realloc,
        Func::Reallocarray,
        Func::PosixMemalign,
        Func::AlignedAlloc,
        Func::Memalign,
        Func::Valloc,
        Func::Pvalloc,
        Func::Free,
    ];
    pub fn from_kind(kind: u8) -> Option<Self> {
        Self::ALL.get(kind as usize).copied()
    }
    pub fn name(self) -> &'static str {
        match self {
            Func::Malloc => "malloc",
            Func::Calloc => "calloc",
            Func::Realloc => "realloc",
            Func::Reallocarray => "reallocarray",
            Func::PosixMemalign => "posix_memalign",
            Func::AlignedAlloc => "aligned_alloc",
            Func::Memalign => "memalign",
            Func::Valloc => "valloc",
            Func::Pvalloc => "pvalloc",
            Func::Free => "free",
        }
    }
    fn takes_old_block(self) -> bool {
        matches!(self, Func::Realloc | Func::Reallocarray)
    }
    fn takes_alignment(self) -> bool {
        matches!(
            self,
            Func::PosixMemalign
                | Func::AlignedAlloc
                | Func::Memalign
                | Func::Valloc
                | Func::Pvalloc
        )
    }
}

pub(crate) const KIND_TICK: u8 = 10;
pub(crate) const KIND_STACK: u8 = 11;
pub(crate) const KIND_USABLE: u8 = 12;
pub(crate) const KIND_STATS: u8 = 13;
const KIND_LOST: u8 = 14;
/// With KIND_LOST: a JOINED record.
const FLAG_JOINED: u8 = 0x10;
/// With KIND_LOST: a FORKED record.
const FLAG_FORKED: u8 = 0x20;
/// With KIND_TICK: an anchor (a cycle counter reading), which older interposers wrote to
/// estimate time inside a tick; the order counter replaced it.
const FLAG_ANCHOR: u8 = 0x10;
/// With KIND_TICK: the order counter moved on.
const FLAG_ORDER: u8 = 0x20;
const KIND_OWN_MEMORY: u8 = 15;
pub(crate) const FLAG_STACK: u8 = 0x10;
pub(crate) const FLAG_UNALIGNED: u8 = 0x20;
pub(crate) const FLAG_NULL: u8 = 0x40;
pub(crate) const FLAG_USABLE: u8 = 0x80;
/// Packed form: a free's block is named by its slot in the live table.
const FLAG_SLOT: u8 = 0x10;
/// Packed form: the address mode of an allocation (UNALIGNED|NULL, meaningless in the
/// raw form): the block this thread freed last at this usable size.
const FLAG_PREDICTED: u8 = FLAG_UNALIGNED | FLAG_NULL;
const ADDR_MODE: u8 = FLAG_UNALIGNED | FLAG_NULL;
const REALLOC_OLD_NULL: u8 = 1;
pub(crate) const REALLOC_OLD_UNALIGNED: u8 = 2;
/// Packed form: the old block is named by its slot in the live table.
const REALLOC_OLD_SLOT: u8 = 4;
/// Recently freed blocks remembered per thread and usable size (allocator thread caches
/// hand the last freed block of a size class back first).
const FREED_DEPTH: usize = 8;

/// Sizes below this have their usable size given once per thread by a usable record.
pub const USABLE_TABLE: u64 = 32768;

/// Which allocator answered a stats record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsSource {
    Glibc,
    Jemalloc,
    Tcmalloc,
    Mimalloc,
    Unknown,
}

impl StatsSource {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Self::Glibc => 1,
            Self::Jemalloc => 2,
            Self::Tcmalloc => 3,
            Self::Mimalloc => 4,
            Self::Unknown => 0,
        }
    }
    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Glibc,
            2 => Self::Jemalloc,
            3 => Self::Tcmalloc,
            4 => Self::Mimalloc,
            _ => Self::Unknown,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Glibc => "glibc",
            Self::Jemalloc => "jemalloc",
            Self::Tcmalloc => "tcmalloc",
            Self::Mimalloc => "mimalloc",
            Self::Unknown => "unknown",
        }
    }
}

/// One decoded record. Addresses are 0 for NULL.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An allocation-family call. For realloc, `old_addr` is the block passed in.
    Alloc {
        func: Func,
        addr: u64,
        old_addr: u64,
        size: u64,
        align: u64,
        /// The allocator's usable size, when known.
        usable: Option<u64>,
        /// The thread-local stack id, 0 when this allocation was not sampled.
        stack: u32,
    },
    Free {
        addr: u64,
    },
    StackDef {
        id: u32,
        frames: Vec<u64>,
    },
    Stats {
        source: StatsSource,
        values: Vec<(String, u64)>,
    },
    Lost {
        count: u64,
    },
    /// This thread joined thread `tid` (pthread_join returned): every call `tid` recorded
    /// came before this thread's next one.
    Joined {
        tid: u32,
    },
    /// This thread forked a child here, which names `mark` in its Process chunk: the
    /// child's heap is its process's live blocks at this point of the merged calls.
    Forked {
        mark: u32,
    },
    OwnMemory {
        bytes: u64,
    },
    /// The clock moved on (only from [`ChunkDecoder::report_all`] decoders).
    Tick {
        delta: u64,
    },
    /// A usable-size table entry (only from [`ChunkDecoder::report_all`] decoders).
    Usable {
        size: u64,
        usable: u64,
    },
    /// The order counter moved on (only from [`ChunkDecoder::report_all`] decoders; others
    /// give it as [`ChunkDecoder::place`]).
    Order {
        delta: u64,
    },
}

/// What a stream's records mean beyond their own chunk, kept from chunk to chunk by the
/// writer and the reader alike: the usable sizes of small requests and, for the packed
/// form, the live blocks by slot and each thread's recently freed blocks.
#[derive(Default)]
pub struct StreamTables {
    usable: Vec<u32>,
    /// The reader's live blocks (address, usable size or 0) by slot; address 0: a free
    /// slot. (The writer finds them by address in `slot_of` instead.)
    live: Vec<(u64, u32)>,
    /// Slots ever used: a new block with no free slot takes the next one.
    slots_made: u32,
    /// Free slots, the one freed last on top: the next new block takes it.
    free_slots: Vec<u32>,
    /// The writer's live blocks by address, with their slots and usable sizes.
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
    /// [`EventsHeader::tables_reset`]); usable sizes stay.
    pub(crate) fn forget_blocks(&mut self) {
        self.live.clear();
        self.slots_made = 0;
        self.free_slots.clear();
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
    fn table_usable(&self, size: u64) -> Option<u64> {
        if size >= USABLE_TABLE {
            return None;
        }
        self.usable
            .get(size as usize)
            .copied()
            .filter(|&u| u != 0)
            .map(u64::from)
    }

    /// Ends the block in `slot`, whose slot becomes the next one taken; a block freed by
    /// `tid` (`by_free`) is remembered as the next one that thread may get back.
    #[inline(always)]
    fn end_slot(&mut self, slot: u32, tid: u32, by_free: bool) -> Option<u64> {
        let entry = self.live.get_mut(slot as usize)?;
        let (addr, usable) = std::mem::take(entry);
        if addr == 0 {
            return None;
        }
        self.slot_freed(slot, addr, usable, tid, by_free);
        Some(addr)
    }

    /// The block `addr` of `usable` bytes left `slot`.
    #[inline(always)]
    fn slot_freed(&mut self, slot: u32, addr: u64, usable: u32, tid: u32, by_free: bool) {
        self.free_slots.push(slot);
        if by_free && usable != 0 {
            self.freed.of(tid).list(usable).push(addr);
        }
    }

    /// Writer: ends the live block at `addr`, if there is one, and returns its slot.
    #[inline]
    fn end_block(&mut self, addr: u64, tid: u32, by_free: bool) -> Option<u32> {
        let (slot, usable) = self.slot_of.as_mut()?.remove(addr)?;
        self.slot_freed(slot, addr, usable, tid, by_free);
        Some(slot)
    }

    /// Writer: if `addr` is among the blocks `tid` freed last at `usable` bytes, claims
    /// it and says where it was (0: the last).
    #[inline]
    fn take_if_freed(&mut self, tid: u32, usable: u64, addr: u64) -> Option<u64> {
        let f = self.freed.of(tid).get_mut(u32::try_from(usable).ok()?)?;
        let depth = f.depth_of(addr)?;
        f.take(depth);
        Some(depth as u64)
    }

    /// Reader: claims the block `depth` places below the one `tid` freed last at
    /// `usable` bytes.
    #[inline]
    fn take_freed(&mut self, tid: u32, usable: u64, depth: u64) -> Option<u64> {
        let f = self.freed.of(tid).get_mut(u32::try_from(usable).ok()?)?;
        f.take(usize::try_from(depth).ok()?)
    }

    /// A block became live at `addr`, in the slot freed last (or a new one). An address
    /// still live in another slot (its free was never recorded) leaves that slot taken
    /// for good, on both sides alike: the writer's index names the new one.
    #[inline]
    fn allocated(&mut self, addr: u64, usable: Option<u64>) {
        let usable = usable.map_or(0, |u| u.min(u64::from(u32::MAX)) as u32);
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.slots_made += 1;
            self.slots_made - 1
        });
        match &mut self.slot_of {
            Some(index) => index.insert(addr, slot, usable),
            None => {
                if slot as usize == self.live.len() {
                    self.live.push((0, 0));
                }
                self.live[slot as usize] = (addr, usable);
            }
        }
    }
}

/// Address to slot, for the writer of the packed form. Every call makes one lookup and
/// one insert or remove here. A hashbrown table keyed by the address's locality hash
/// (as the merge's live table): a hand-written open-addressing table with backward-shift
/// deletion cost 108 instructions a remove and 71 an insert.
#[derive(Default)]
struct AddrSlots {
    /// (address, slot, usable size).
    entries: hashbrown::HashTable<(u64, u32, u32)>,
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

    #[inline(always)]
    fn insert(&mut self, addr: u64, slot: u32, usable: u32) {
        if addr == 0 {
            return;
        }
        self.entries
            .entry(addr_hash(addr), |e| e.0 == addr, |e| addr_hash(e.0))
            .insert((addr, slot, usable));
    }

    /// Removes `addr`, returning its slot and usable size.
    #[inline(always)]
    fn remove(&mut self, addr: u64) -> Option<(u32, u32)> {
        let entry = self
            .entries
            .find_entry(addr_hash(addr), |e| e.0 == addr)
            .ok()?;
        let (_, slot, usable) = *entry.get();
        entry.remove();
        Some((slot, usable))
    }
}

/// Decodes one thread's chunk of records. `tables` are the stream's (see
/// [`StreamTables`]): chunks of one stream must be decoded in the order of the file.
pub struct ChunkDecoder<'a, 't> {
    r: FieldReader<'a>,
    /// Why the packed form's planes could not be laid out (then `r` is empty, and the
    /// first read returns it).
    broken: Option<TraceError>,
    tick: u64,
    prev_addr: u64,
    /// Packed form: the last allocation address spelled out (the base of the next one).
    prev_alloc: u64,
    tid: u32,
    packed: bool,
    report_all: bool,
    tables: &'t mut StreamTables,
    /// The order counter's value this thread expects next: its last reading, plus one if
    /// that call was a free (whose reading took the value). 0 at a chunk's start and at
    /// each tick record, as the interposer counts.
    order: u64,
    /// The chunk has an order record: its calls from the first one on have places.
    ordered: bool,
    /// The place of the record last returned (see [`ChunkDecoder::place`]).
    place: u64,
}

impl<'a, 't> ChunkDecoder<'a, 't> {
    pub fn new(records: &'a [u8], h: &EventsHeader, tables: &'t mut StreamTables) -> Self {
        if h.packed && h.tables_reset {
            tables.forget_blocks();
        }
        Self::with_form(records, h.first_tick, h.tid, h.packed, tables)
    }

    /// A decoder of `records` in the raw (`packed` false) or packed form.
    pub fn with_form(
        records: &'a [u8],
        first_tick: u64,
        tid: u32,
        packed: bool,
        tables: &'t mut StreamTables,
    ) -> Self {
        let (r, broken) = if packed {
            match FieldReader::columns(records) {
                Ok(r) => (r, None),
                Err(e) => (FieldReader::row(&[]), Some(e)),
            }
        } else {
            (FieldReader::row(records), None)
        };
        Self {
            r,
            broken,
            tick: first_tick,
            prev_addr: 0,
            prev_alloc: 0,
            tid,
            packed,
            report_all: false,
            tables,
            order: 0,
            ordered: false,
            place: 0,
        }
    }

    /// Also returns tick and usable records (which a rewriter must carry over).
    pub fn report_all(mut self) -> Self {
        self.report_all = true;
        self
    }

    /// The tick of the record last returned.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// The place of the record last returned among all of its process's calls in its
    /// tick: twice the order counter it read, plus one for a free, which takes a value
    /// of its own (a free reads the counter before the real free, an allocation after the
    /// real allocation, so a block's free has a lower place than its next allocation).
    /// `None` before the chunk's first order record: the thread was alone (or the trace
    /// is older than the order counter).
    pub fn place(&self) -> Option<u64> {
        self.ordered.then_some(self.place)
    }

    /// The lowest place any later record of this thread can have in the current tick.
    pub fn next_place(&self) -> Option<u64> {
        self.ordered.then(|| self.order.saturating_mul(2))
    }

    #[inline(always)]
    fn addr(&mut self, unaligned: bool) -> Result<u64, TraceError> {
        read_delta(&mut self.r, &mut self.prev_addr, unaligned)
    }

    /// The next record, skipping tick records (whose time `tick()` then reflects).
    #[inline(always)]
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            if self.r.is_empty() {
                // A chunk whose planes could not be laid out reads as empty, then fails.
                return self.broken.take().map_or(Ok(None), Err);
            }
            let tag = self.r.u8(Field::Tag)?;
            let kind = tag & 0x0f;
            self.place = self.order.saturating_mul(2);
            match kind {
                0..=9 => {
                    let call = if self.packed {
                        self.packed_call(tag)?
                    } else {
                        self.call(tag)?
                    };
                    if kind == Func::Free as u8 && self.ordered {
                        self.place = self.place.saturating_add(1);
                        self.order = self.order.saturating_add(1);
                    }
                    return Ok(Some(call));
                }
                KIND_TICK if tag & FLAG_ORDER != 0 => {
                    let delta = self.r.varint(Field::Other)?;
                    self.order = self.order.saturating_add(delta);
                    self.ordered = true;
                    if self.report_all {
                        return Ok(Some(Record::Order { delta }));
                    }
                }
                KIND_TICK if tag & FLAG_ANCHOR != 0 => {
                    self.r.varint(Field::Other)?;
                }
                KIND_TICK => {
                    let delta = self.r.varint(Field::Other)?;
                    self.tick = self.tick.saturating_add(delta);
                    self.order = 0;
                    if self.report_all {
                        return Ok(Some(Record::Tick { delta }));
                    }
                }
                _ => {
                    if let Some(record) = self.rare_record(tag)? {
                        return Ok(Some(record));
                    }
                }
            }
        }
    }

    /// A record of the kinds a buffer holds few of (stacks, usable sizes, statistics,
    /// losses, joins, own memory), out of line: `next_record` stays small enough to be
    /// inlined where calls are decoded. `None`: a record that is not returned.
    #[inline(never)]
    fn rare_record(&mut self, tag: u8) -> Result<Option<Record>, TraceError> {
        let kind = tag & 0x0f;
        match kind {
            KIND_STACK => {
                let id = self.r.varint(Field::Other)? as u32;
                let depth = self.r.count(Field::Other)?;
                let mut frames = Vec::with_capacity(depth);
                let mut ip = 0u64;
                for _ in 0..depth {
                    ip = ip.wrapping_add(self.r.svarint(Field::Other)? as u64);
                    frames.push(ip);
                }
                return Ok(Some(Record::StackDef { id, frames }));
            }
            KIND_USABLE => {
                let size = self.r.varint(Field::Other)?;
                let usable = self.r.varint(Field::Other)?;
                self.tables.set_usable(size, usable);
                if self.report_all {
                    return Ok(Some(Record::Usable { size, usable }));
                }
            }
            KIND_STATS => {
                let source = StatsSource::from_u8(self.r.u8(Field::Other)?);
                let n = self.r.u8(Field::Other)?;
                let mut values = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let len = self.r.u8(Field::Other)? as usize;
                    let name =
                        String::from_utf8_lossy(self.r.take(Field::Other, len)?).into_owned();
                    values.push((name, self.r.varint(Field::Other)?));
                }
                return Ok(Some(Record::Stats { source, values }));
            }
            KIND_LOST if tag & FLAG_JOINED != 0 => {
                return Ok(Some(Record::Joined {
                    tid: self.r.varint(Field::Other)? as u32,
                }))
            }
            KIND_LOST if tag & FLAG_FORKED != 0 => {
                return Ok(Some(Record::Forked {
                    mark: self.r.varint(Field::Other)? as u32,
                }))
            }
            KIND_LOST => {
                return Ok(Some(Record::Lost {
                    count: self.r.varint(Field::Other)?,
                }))
            }
            KIND_OWN_MEMORY => {
                return Ok(Some(Record::OwnMemory {
                    bytes: self.r.varint(Field::Other)?,
                }))
            }
            _ => unreachable!("kinds 0 to 10 are next_record's, and a kind is 4 bits"),
        }
        Ok(None)
    }

    // Inlined, like `packed_call`, so that the record stays in registers: returned
    // through memory, it was written field by field and read back in wider loads, which
    // stall (store forwarding fails) on every call.
    #[inline(always)]
    fn call(&mut self, tag: u8) -> Result<Record, TraceError> {
        let func = Func::from_kind(tag & 0x0f).expect("kinds 0..=9 are functions");
        if func == Func::Free {
            let addr = if tag & FLAG_NULL != 0 {
                0
            } else {
                self.addr(tag & FLAG_UNALIGNED != 0)?
            };
            return Ok(Record::Free { addr });
        }
        let mut old_addr = 0;
        if func.takes_old_block() {
            let rflags = self.r.u8(Field::Tag)?;
            if rflags & REALLOC_OLD_NULL == 0 {
                old_addr = self.addr(rflags & REALLOC_OLD_UNALIGNED != 0)?;
            }
        }
        let addr = if tag & FLAG_NULL != 0 {
            0
        } else {
            self.addr(tag & FLAG_UNALIGNED != 0)?
        };
        let size = self.r.varint(Field::Size)?;
        let align = if func.takes_alignment() {
            self.r.varint(Field::Other)?
        } else {
            0
        };
        let usable = if tag & FLAG_USABLE != 0 {
            Some(size.saturating_add(self.r.varint(Field::Other)?))
        } else if addr != 0 && matches!(func, Func::Malloc | Func::Calloc) {
            self.tables.table_usable(size)
        } else {
            None
        };
        let stack = if tag & FLAG_STACK != 0 {
            self.r.varint(Field::Other)? as u32
        } else {
            0
        };
        Ok(Record::Alloc {
            func,
            addr,
            old_addr,
            size,
            align,
            usable,
            stack,
        })
    }

    fn bad(what: &str) -> TraceError {
        TraceError::Malformed(format!("packed events: {what}"))
    }

    /// The block a slot names, which ends (`by_free`: a free, else a realloc's old block).
    #[inline(always)]
    fn slot_block(&mut self, by_free: bool) -> Result<u64, TraceError> {
        let slot = u32::try_from(self.r.varint(Field::Slot)?)
            .map_err(|_| Self::bad("slot out of range"))?;
        let addr = self
            .tables
            .end_slot(slot, self.tid, by_free)
            .ok_or_else(|| Self::bad("a slot with no block"))?;
        self.prev_addr = addr;
        Ok(addr)
    }

    /// A call in the packed form (see the module documentation).
    #[inline(always)]
    fn packed_call(&mut self, tag: u8) -> Result<Record, TraceError> {
        let func = Func::from_kind(tag & 0x0f).expect("kinds 0..=9 are functions");
        if func == Func::Free {
            let addr = if tag & FLAG_NULL != 0 {
                0
            } else if tag & FLAG_SLOT != 0 {
                self.slot_block(true)?
            } else {
                self.addr(tag & FLAG_UNALIGNED != 0)?
            };
            return Ok(Record::Free { addr });
        }
        let mut old_addr = 0;
        if func.takes_old_block() {
            let rflags = self.r.u8(Field::Tag)?;
            if rflags & REALLOC_OLD_SLOT != 0 {
                old_addr = self.slot_block(false)?;
            } else if rflags & REALLOC_OLD_NULL == 0 {
                old_addr = self.addr(rflags & REALLOC_OLD_UNALIGNED != 0)?;
            }
        }
        let mode = tag & ADDR_MODE;
        let mut addr = match mode {
            FLAG_NULL | FLAG_PREDICTED => 0,
            _ => read_delta(&mut self.r, &mut self.prev_alloc, mode == FLAG_UNALIGNED)?,
        };
        let size = self.r.varint(Field::Size)?;
        let align = if func.takes_alignment() {
            self.r.varint(Field::Other)?
        } else {
            0
        };
        // With a predicted block, USABLE says a depth follows (the usable size is the
        // table's); otherwise it says the usable size follows.
        let (explicit, depth) = match (mode, tag & FLAG_USABLE != 0) {
            (FLAG_PREDICTED, true) => (None, self.r.varint(Field::Other)?),
            (_, true) => (Some(size.saturating_add(self.r.varint(Field::Other)?)), 0),
            (_, false) => (None, 0),
        };
        let small = matches!(func, Func::Malloc | Func::Calloc);
        let usable = explicit.or_else(|| {
            (mode != FLAG_NULL && small)
                .then(|| self.tables.table_usable(size))
                .flatten()
        });
        if mode == FLAG_PREDICTED {
            let u = usable
                .filter(|_| small)
                .ok_or_else(|| Self::bad("a predicted block without a usable size"))?;
            addr = self
                .tables
                .take_freed(self.tid, u, depth)
                .ok_or_else(|| Self::bad("a predicted block with nothing freed"))?;
            self.prev_addr = addr;
        }
        let stack = if tag & FLAG_STACK != 0 {
            self.r.varint(Field::Other)? as u32
        } else {
            0
        };
        if addr != 0 {
            self.tables.allocated(addr, usable);
        }
        Ok(Record::Alloc {
            func,
            addr,
            old_addr,
            size,
            align,
            usable,
            stack,
        })
    }
}

/// An address given as a delta from `base` (in 16-byte units unless `unaligned`); it
/// becomes the base.
#[inline(always)]
fn read_delta(r: &mut FieldReader, base: &mut u64, unaligned: bool) -> Result<u64, TraceError> {
    let d = r.svarint(Field::Addr)?;
    let d = if unaligned { d } else { d.wrapping_mul(16) };
    *base = base.wrapping_add(d as u64);
    Ok(*base)
}

/// The other side of [`read_delta`]: whether the delta is in bytes, and the delta.
fn write_delta(base: &mut u64, addr: u64) -> (bool, i64) {
    let d = addr.wrapping_sub(*base) as i64;
    *base = addr;
    if d % 16 == 0 {
        (false, d / 16)
    } else {
        (true, d)
    }
}

/// Writes records in the packed form. Keeps the stream's tables as the reader will.
pub(crate) struct PackedWriter<'t> {
    w: &'t mut ColumnWriter,
    prev_addr: u64,
    prev_alloc: u64,
    tid: u32,
    tables: &'t mut StreamTables,
}

impl<'t> PackedWriter<'t> {
    pub fn new(tid: u32, tables: &'t mut StreamTables, w: &'t mut ColumnWriter) -> Self {
        Self {
            w,
            prev_addr: 0,
            prev_alloc: 0,
            tid,
            tables,
        }
    }

    /// Whether the delta of a literal address is in bytes, and the delta.
    fn delta(&mut self, addr: u64) -> (bool, i64) {
        write_delta(&mut self.prev_addr, addr)
    }

    /// Rewrites one record. Calls are written inline, into the packer's loop; the other
    /// kinds out of line.
    #[inline(always)]
    pub fn record(&mut self, rec: &Record) {
        match *rec {
            Record::Free { addr } => {
                let kind = Func::Free as u8;
                if addr == 0 {
                    self.w.u8(Field::Tag, kind | FLAG_NULL);
                } else if let Some(slot) = self.tables.end_block(addr, self.tid, true) {
                    self.prev_addr = addr;
                    self.w
                        .u8(Field::Tag, kind | FLAG_SLOT)
                        .varint(Field::Slot, slot.into());
                } else {
                    let (unaligned, d) = self.delta(addr);
                    let flag = if unaligned { FLAG_UNALIGNED } else { 0 };
                    self.w.u8(Field::Tag, kind | flag).svarint(Field::Addr, d);
                }
            }
            Record::Alloc {
                func,
                addr,
                old_addr,
                size,
                align,
                usable,
                stack,
            } => self.alloc(func, addr, old_addr, size, align, usable, stack),
            _ => self.rare_record(rec),
        }
    }

    #[inline(never)]
    fn rare_record(&mut self, rec: &Record) {
        match *rec {
            Record::Free { .. } | Record::Alloc { .. } => unreachable!("calls are record's"),
            Record::StackDef { id, ref frames } => {
                self.w
                    .u8(Field::Tag, KIND_STACK)
                    .varint(Field::Other, id.into());
                self.w.varint(Field::Other, frames.len() as u64);
                let mut prev = 0u64;
                for &ip in frames {
                    self.w.svarint(Field::Other, ip.wrapping_sub(prev) as i64);
                    prev = ip;
                }
            }
            Record::Stats { source, ref values } => {
                let values = &values[..values.len().min(255)];
                self.w
                    .u8(Field::Tag, KIND_STATS)
                    .u8(Field::Other, source.to_u8())
                    .u8(Field::Other, values.len() as u8);
                for (name, v) in values {
                    let name = &name.as_bytes()[..name.len().min(255)];
                    self.w.u8(Field::Other, name.len() as u8);
                    self.w.raw(Field::Other, name);
                    self.w.varint(Field::Other, *v);
                }
            }
            Record::Lost { count } => {
                self.w.u8(Field::Tag, KIND_LOST).varint(Field::Other, count);
            }
            Record::Joined { tid } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_JOINED)
                    .varint(Field::Other, tid.into());
            }
            Record::Forked { mark } => {
                self.w
                    .u8(Field::Tag, KIND_LOST | FLAG_FORKED)
                    .varint(Field::Other, mark.into());
            }
            Record::OwnMemory { bytes } => {
                self.w
                    .u8(Field::Tag, KIND_OWN_MEMORY)
                    .varint(Field::Other, bytes);
            }
            Record::Tick { delta } => {
                self.w.u8(Field::Tag, KIND_TICK).varint(Field::Other, delta);
            }
            Record::Order { delta } => {
                self.w
                    .u8(Field::Tag, KIND_TICK | FLAG_ORDER)
                    .varint(Field::Other, delta);
            }
            Record::Usable { size, usable } => {
                self.tables.set_usable(size, usable);
                self.w
                    .u8(Field::Tag, KIND_USABLE)
                    .varint(Field::Other, size)
                    .varint(Field::Other, usable);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn alloc(
        &mut self,
        func: Func,
        addr: u64,
        old_addr: u64,
        size: u64,
        align: u64,
        usable: Option<u64>,
        stack: u32,
    ) {
        let small = matches!(func, Func::Malloc | Func::Calloc);
        let from_table = if addr != 0 && small {
            self.tables.table_usable(size)
        } else {
            None
        };
        // The usable size is written unless the reader's table gives it (as the raw form).
        let explicit = usable.filter(|&u| from_table != Some(u) && u >= size);
        let usable = explicit.or(from_table);
        // The tables change in the reader's order: the old block ends, then the new one
        // is claimed from the thread's frees and takes a slot.
        let old_slot = if func.takes_old_block() && old_addr != 0 {
            self.tables.end_block(old_addr, self.tid, false)
        } else {
            None
        };
        let depth = match (explicit, from_table) {
            (None, Some(u)) => self.tables.take_if_freed(self.tid, u, addr),
            _ => None,
        };
        let mut tag = func as u8;
        if stack != 0 {
            tag |= FLAG_STACK;
        }
        if explicit.is_some() || depth.is_some_and(|d| d > 0) {
            tag |= FLAG_USABLE;
        }
        let tag_at = self.w.tags_len();
        self.w.u8(Field::Tag, tag);
        if func.takes_old_block() {
            if old_addr == 0 {
                self.w.u8(Field::Tag, REALLOC_OLD_NULL);
            } else if let Some(slot) = old_slot {
                self.prev_addr = old_addr;
                self.w
                    .u8(Field::Tag, REALLOC_OLD_SLOT)
                    .varint(Field::Slot, slot.into());
            } else {
                let (unaligned, d) = self.delta(old_addr);
                let flag = if unaligned { REALLOC_OLD_UNALIGNED } else { 0 };
                self.w.u8(Field::Tag, flag).svarint(Field::Addr, d);
            }
        }
        if addr == 0 {
            self.w.amend_tag(tag_at, FLAG_NULL);
        } else if depth.is_some() {
            self.w.amend_tag(tag_at, FLAG_PREDICTED);
            self.prev_addr = addr;
        } else {
            let (unaligned, d) = write_delta(&mut self.prev_alloc, addr);
            if unaligned {
                self.w.amend_tag(tag_at, FLAG_UNALIGNED);
            }
            self.w.svarint(Field::Addr, d);
        }
        self.w.varint(Field::Size, size);
        if func.takes_alignment() {
            self.w.varint(Field::Other, align);
        }
        if let Some(u) = explicit {
            self.w.varint(Field::Other, u - size);
        }
        if let Some(d) = depth.filter(|&d| d > 0) {
            self.w.varint(Field::Other, d);
        }
        if stack != 0 {
            self.w.varint(Field::Other, stack.into());
        }
        if addr != 0 {
            self.tables.allocated(addr, usable);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::wire::Writer;

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

    #[test]
    fn decodes_the_interposer_layout() {
        // malloc(24) at 0x1000 with usable 32 known, tick +3, free(0x1000), free(NULL),
        // realloc(0x1000 -> 0x2008, 100) unaligned, posix_memalign(64, 10) failed.
        let mut w = Writer::new();
        w.u8(KIND_USABLE).varint(24).varint(32);
        w.u8(0).svarint(0x1000 / 16).varint(24);
        w.u8(KIND_TICK).varint(3);
        w.u8(9).svarint(0);
        w.u8(9 | FLAG_NULL);
        w.u8(2 | FLAG_UNALIGNED | FLAG_USABLE | FLAG_STACK)
            .u8(0)
            .svarint(0)
            .svarint(0x1008)
            .varint(100)
            .varint(4)
            .varint(7);
        w.u8(4 | FLAG_NULL).varint(10).varint(64);
        let mut tables = StreamTables::default();
        let mut d = ChunkDecoder::with_form(&w.bytes, 100, 1, false, &mut tables);
        let mut got = Vec::new();
        while let Some(r) = d.next_record().unwrap() {
            got.push((d.tick(), r));
        }
        let alloc = |func, addr, old_addr, size, align, usable, stack| Record::Alloc {
            func,
            addr,
            old_addr,
            size,
            align,
            usable,
            stack,
        };
        assert_eq!(
            got,
            vec![
                (100, alloc(Func::Malloc, 0x1000, 0, 24, 0, Some(32), 0)),
                (103, Record::Free { addr: 0x1000 }),
                (103, Record::Free { addr: 0 }),
                (
                    103,
                    alloc(Func::Realloc, 0x2008, 0x1000, 100, 0, Some(104), 7)
                ),
                (103, alloc(Func::PosixMemalign, 0, 0, 10, 64, None, 0)),
            ]
        );
    }

    #[test]
    fn the_address_index_agrees_with_a_hash_map() {
        // Few distinct addresses, so the same ones are inserted and removed many times.
        let mut index = AddrSlots::default();
        let mut want = std::collections::HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000u32 {
            crate::xorshift(&mut x);
            let addr = 0x7f00_0000_0000 + (x % 5000) * 16;
            match x >> 62 {
                0 | 1 => {
                    index.insert(addr, step, step / 3);
                    want.insert(addr, (step, step / 3));
                }
                2 => assert_eq!(index.remove(addr), want.remove(&addr), "step {step}"),
                _ => assert_eq!(index.get(addr), want.get(&addr).map(|e| e.0), "step {step}"),
            }
            assert_eq!(index.len(), want.len());
        }
        for (addr, (slot, _)) in want {
            assert_eq!(index.get(addr), Some(slot));
        }
    }

    #[test]
    fn a_packed_chunk_whose_planes_do_not_fit_is_an_error() {
        let mut tables = StreamTables::default();
        // The first plane claims five bytes of a chunk that has one.
        let mut d =
            ChunkDecoder::with_form(&[5, 0, 0, 0, 0, 0, 0, 0, 0, 9], 0, 1, true, &mut tables);
        assert!(d.next_record().is_err());
        assert!(matches!(d.next_record(), Ok(None)));
    }

    #[test]
    fn garbage_gives_errors_not_panics() {
        let mut tables = StreamTables::default();
        let mut packed_records = 0;
        for seed in 0u64..2000 {
            let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
            let bytes: Vec<u8> = (0..64).map(|_| crate::xorshift(&mut x) as u8).collect();
            let mut d = ChunkDecoder::with_form(&bytes, 0, 1, false, &mut tables);
            while let Ok(Some(_)) = d.next_record() {}
            // Packed: the same bytes cut into planes by a valid directory (a random one
            // would rarely get past the directory).
            let mut planes = crate::format::wire::Writer::new();
            let mut left = bytes.len() as u64;
            for i in 0..crate::format::columns::PLANES {
                let len = if i + 1 == crate::format::columns::PLANES {
                    left
                } else {
                    (x >> (i * 6)) % 16
                };
                let len = len.min(left);
                left -= len;
                planes.varint(len);
            }
            planes
                .bytes
                .extend_from_slice(&bytes[..bytes.len() - left as usize]);
            let mut d = ChunkDecoder::with_form(&planes.bytes, 0, 1, true, &mut tables);
            while let Ok(Some(_)) = d.next_record() {
                packed_records += 1;
            }
        }
        assert!(
            packed_records > 500,
            "{packed_records} packed records decoded"
        );
    }
}
