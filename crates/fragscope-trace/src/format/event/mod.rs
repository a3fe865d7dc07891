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
//!            with flag 0x10, an anchor of older traces: cycles:varint (skipped);
//!            with flags 0x50, released: (value << 8 | ticks_back):varint (the realloc
//!            that follows, whose order record comes before this one, gave its old block
//!            back at a counter value taken before the real call as a free takes its
//!            own, in the tick `ticks_back` before this one: `value` below the realloc's
//!            own reading when `ticks_back` is 0, else the value itself; the realloc is
//!            placed by its reading; older readers skip it as an anchor)
//! kind 11    stack:       id:varint depth:varint frame-delta:svarint*depth
//! kind 12    usable:      size:varint usable:varint (for malloc/calloc of `size`)
//! kind 13    stats:       source:u8 count:u8 (name_len:u8 name value:varint)*count
//! kind 14    lost:        count:varint (events a signal handler could not queue);
//!            with flag 0x10, joined: tid:varint (this thread joined thread `tid`: all
//!            of that thread's records come before this thread's next ones);
//!            with flag 0x20, forked: mark:varint (this thread forked here; the child's
//!            Process chunk names `mark`);
//!            with flag 0x40, summed: stack:varint size:varint allocations:varint
//!            temporaries:varint (an aggregated recording's calls of that stack and size
//!            left out: allocated and freed between two snapshots);
//!            with flag 0x80, live: live:varint usable:varint peak:varint
//!            peak_age:varint calls:varint (an aggregated recording's live bytes as every
//!            call had them here, the most since the last such record, `peak_age` ticks
//!            before it, and the calls made since it)
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

use crate::format::columns::{Field, FieldReader};
use crate::format::records::EventsHeader;
use crate::format::TraceError;

pub(crate) mod packed_writer;
mod tables;

pub use tables::{StreamTables, USABLE_TABLE};

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
    /// realloc and reallocarray: they take a block and may give it back.
    pub fn takes_old_block(self) -> bool {
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
/// With KIND_LOST: a SUMMED record (aggregated recordings).
const FLAG_SUMMED: u8 = 0x40;
/// With KIND_LOST: a LIVE record (aggregated recordings).
const FLAG_LIVE: u8 = 0x80;
/// With KIND_TICK: an anchor (a cycle counter reading), which older interposers wrote to
/// estimate time inside a tick; the order counter replaced it.
pub(crate) const FLAG_ANCHOR: u8 = 0x10;
/// With KIND_TICK: the order counter moved on.
pub(crate) const FLAG_ORDER: u8 = 0x20;
/// With KIND_TICK and FLAG_ANCHOR (which older readers skip): the realloc that follows
/// released its old block at a place of its own ([`ChunkDecoder::take_released`]).
pub(crate) const FLAG_RELEASED: u8 = 0x40;
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
    /// An aggregated recording left out `allocations` calls of thread-local `stack` (0:
    /// none recorded) for `size` bytes, each freed before the next snapshot, and counts
    /// `temporaries` of them and of its other blocks of that stack and size as temporary.
    Summed {
        stack: u32,
        size: u64,
        allocations: u64,
        temporaries: u64,
    },
    /// An aggregated recording's live figures as all of the process's calls had them
    /// here: live and usable bytes, the most live bytes since the last such record
    /// (`peak_age` ticks before this one), and the calls made since it.
    Live {
        live: u64,
        usable: u64,
        peak: u64,
        peak_age: u64,
        calls: u64,
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
    /// The realloc that follows gave its old block back at a counter value taken before
    /// the real call, in the tick `ticks_back` before this record's: `value` below the
    /// realloc's own reading when `ticks_back` is 0, else that value (only from
    /// [`ChunkDecoder::report_all`] decoders; others give it with the realloc:
    /// [`ChunkDecoder::take_released`]).
    Released {
        ticks_back: u64,
        value: u64,
    },
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
    /// The tick and place of a RELEASED record, until its realloc is returned and then
    /// taken.
    released: Option<(u64, u64)>,
    /// The slot planes' look-ahead reading is [`SLOTS_AHEAD`] slots ahead of the records.
    slots_ahead: bool,
}

/// How many slots ahead of a free's the decoder asks for the memory of the slot it will
/// name: a free's slot is anywhere in the stream's table of live blocks, a cache miss
/// once that table outgrows the cache (77% of the decoding of a recording over a
/// million live blocks went on that one read). 16 slots are about 30 calls, time enough
/// for the memory to come.
const SLOTS_AHEAD: usize = 16;

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
            released: None,
            slots_ahead: false,
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
                    if self.released.is_some() {
                        self.keep_released_for(kind);
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
                KIND_TICK if tag & FLAG_RELEASED != 0 => {
                    // Placed as a free: the value the realloc took before the call.
                    let told = self.r.varint(Field::Other)?;
                    let (ticks_back, value) = (told & 0xff, told >> 8);
                    let taken = if ticks_back == 0 {
                        self.order.saturating_sub(value)
                    } else {
                        value
                    };
                    let place = taken.saturating_mul(2).saturating_add(1);
                    self.released = Some((self.tick.saturating_sub(ticks_back), place));
                    if self.report_all {
                        return Ok(Some(Record::Released { ticks_back, value }));
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

    /// A RELEASED record is for the realloc that follows it; before any other call
    /// (which no interposer writes) it is dropped.
    #[cold]
    fn keep_released_for(&mut self, kind: u8) {
        if !Func::from_kind(kind).is_some_and(Func::takes_old_block) {
            self.released = None;
        }
    }

    /// The tick and place at which the realloc last returned gave its old block back,
    /// when a RELEASED record said so: before its own, which is its reading of the
    /// counter after the call (a tick record may come between the two). Another thread
    /// may have been handed that block between.
    pub fn take_released(&mut self) -> Option<(u64, u64)> {
        self.released.take()
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
            KIND_LOST if tag & FLAG_SUMMED != 0 => {
                let stack = u32::try_from(self.r.varint(Field::Other)?)
                    .map_err(|_| Self::bad("a summed record's stack out of range"))?;
                return Ok(Some(Record::Summed {
                    stack,
                    size: self.r.varint(Field::Other)?,
                    allocations: self.r.varint(Field::Other)?,
                    temporaries: self.r.varint(Field::Other)?,
                }));
            }
            KIND_LOST if tag & FLAG_LIVE != 0 => {
                return Ok(Some(Record::Live {
                    live: self.r.varint(Field::Other)?,
                    usable: self.r.varint(Field::Other)?,
                    peak: self.r.varint(Field::Other)?,
                    peak_age: self.r.varint(Field::Other)?,
                    calls: self.r.varint(Field::Other)?,
                }));
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

    /// Asks for the memory of the slot [`SLOTS_AHEAD`] slots after the one read next
    /// (the first time, of every slot up to it).
    #[inline(always)]
    fn prefetch_slot_ahead(&mut self) {
        if !self.slots_ahead {
            self.start_slots_ahead();
        }
        if let Some(slot) = self.r.slot_ahead() {
            self.tables.prefetch_slot(slot);
        }
    }

    #[cold]
    fn start_slots_ahead(&mut self) {
        self.slots_ahead = true;
        for _ in 0..SLOTS_AHEAD {
            if let Some(slot) = self.r.slot_ahead() {
                self.tables.prefetch_slot(slot);
            }
        }
    }

    /// The block a slot names, which ends (`by_free`: a free, else a realloc's old block).
    #[inline(always)]
    fn slot_block(&mut self, by_free: bool) -> Result<u64, TraceError> {
        self.prefetch_slot_ahead();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::wire::Writer;

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
