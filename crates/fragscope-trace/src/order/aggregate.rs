//! An aggregated recording (`record --aggregate`): each process's calls merged as the
//! model merges them, and written as one thread's calls without the blocks allocated
//! and freed between two snapshots. What a snapshot sees (its live blocks, their sizes,
//! stacks and pages) is what every call gave it, so its evaluation is the same; what the
//! left-out calls counted is written in their place: allocations and temporaries per
//! stack and size (SUMMED records), and every 10 ms the live bytes, their peak and the
//! calls made (LIVE records). A trace then grows with the snapshots and the blocks that
//! outlive one, not with the calls: a server that allocates and frees at a high rate
//! around a steady heap writes little.
//!
//! A pair is left out only when nothing between its two calls can see the block: no
//! snapshot (a snapshot at tick T follows every call of a tick up to T, as the model
//! places it) and no fork (the child inherits the block). An answer of the allocator's
//! own statistics, compared with the live bytes there, gets a LIVE record just before it. The recorder says each
//! snapshot before it hands on a buffer with a call past it (`snapshot_at`, `chunk`).
//!
//! Chunks other than thread buffers pass through unchanged. The merge is the model's
//! (forked children start from their parent's heap, a `record -p` process from the
//! blocks it held), so the live figures it writes are the model's.

use std::collections::VecDeque;

use crate::format::chunk::ChunkKind;
use crate::format::event::Record;
use crate::format::hash::{AddrSet, FastMap, FastSet};
use crate::format::pack::{PackedBuffer, Packer};
use crate::format::reader::{decode_chunk, Chunk};
use crate::format::records::{EventsHeader, Origin};
use crate::format::TraceError;
use crate::order::call::{Call, LastAllocs, Merged, Summary};
use crate::order::live::{is_inherited_stack, InheritedHeap, LiveBlock};
use crate::order::merge::Merger;
use crate::order::stream_decoder::{DecodedEvents, StreamDecoder};

/// A chunk for the file: its kind, payload and, for one compressed in sections, where
/// the sections end (empty: compressed whole).
pub type OutChunk = (ChunkKind, Vec<u8>, Vec<usize>);

/// Records in one written thread buffer at most.
const RECORDS_PER_CHUNK: usize = 1 << 16;
/// The live-bytes timeline's resolution, in ticks (the model's).
const TIMELINE_TICKS: u64 = 10;

/// Aggregates a recording's chunks, in the order they reach the file.
#[derive(Default)]
pub struct Aggregator {
    streams: FastMap<u32, StreamAggregate>,
    /// Heaps at forks, by (parent stream, mark), until the child takes them.
    fork_heaps: FastMap<(u32, u32), InheritedHeap>,
    /// Streams whose calls were all taken.
    finished: FastSet<u32>,
    out: Vec<OutChunk>,
}

impl Aggregator {
    /// A snapshot of `stream` is taken at `tick`: the calls of ticks up to it come before
    /// it. Said before any buffer with a call after it ([`Aggregator::chunk`]).
    pub fn snapshot_at(&mut self, stream: u32, tick: u64) {
        let s = self.stream(stream);
        if s.snapshots.back().is_none_or(|&t| t < tick) {
            s.snapshots.push_back(tick);
        }
    }

    /// Takes one chunk: a thread buffer goes into its process's merge, whose calls are
    /// then taken as far as it orders them (every snapshot before them must have been
    /// said, [`Aggregator::snapshot_at`]); a chunk that matters to the merge (a
    /// process's start, its starting heap) is read too; every other chunk, and those,
    /// are handed on as they are.
    pub fn chunk(&mut self, kind: ChunkKind, payload: Vec<u8>, sections: Vec<usize>) {
        match kind {
            ChunkKind::Events | ChunkKind::PackedEvents => {
                if let Ok((mut h, records)) = EventsHeader::decode(&payload) {
                    h.packed = kind == ChunkKind::PackedEvents;
                    self.stream(h.stream).push(&h, records);
                    self.advance(h.stream);
                    return;
                }
            }
            ChunkKind::Process | ChunkKind::StartingHeap | ChunkKind::ProcessEnd => {
                match decode_chunk(kind, &payload) {
                    Ok(Chunk::Process(p)) => {
                        let s = self.stream(p.stream);
                        s.tid.get_or_insert(p.pid);
                        if p.origin == Origin::Attached {
                            s.merger.set_attached();
                        }
                        if p.origin == Origin::Forked {
                            s.awaiting_fork = p.parent_stream.zip(p.fork_mark);
                        }
                    }
                    Ok(Chunk::StartingHeap(h)) => {
                        let s = (self.streams.entry(h.stream))
                            .or_insert_with(|| StreamAggregate::new(h.stream));
                        // Its blocks are in the trace already (the model seeds them too):
                        // seen, as everything allocated before them.
                        s.write_changes(None, s.last_tick, &mut self.out);
                        s.seen.mid_tick(h.tick);
                        let bytes = s.merger.seed_starting_heap(h.tick, &h.blocks);
                        s.live += bytes;
                        s.usable += bytes;
                    }
                    Ok(Chunk::ProcessEnd(e)) => self.finish_stream(e.stream),
                    _ => {}
                }
            }
            // Every process's calls before the recording's end.
            ChunkKind::End => self.finish(),
            _ => {}
        }
        self.out.push((kind, payload, sections));
    }

    /// Takes the calls `stream`'s merge can order, and those of the children waiting
    /// for a heap it forked them with.
    fn advance(&mut self, stream: u32) {
        if self.advance_stream(stream) {
            let waiting: Vec<u32> = (self.streams.iter())
                .filter(|(_, s)| s.awaiting_fork.is_some())
                .map(|(&id, _)| id)
                .collect();
            for id in waiting {
                self.advance_stream(id);
            }
        }
    }

    /// Every call of `stream` is taken and written: the process ended.
    pub fn finish_stream(&mut self, stream: u32) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.merger.finish();
            // A child whose parent's heap never came goes on without it.
            if s.awaiting_fork
                .is_some_and(|(p, _)| self.finished.contains(&p))
            {
                s.awaiting_fork = None;
            }
        }
        self.advance_stream(stream);
        if let Some(mut s) = self.streams.remove(&stream) {
            s.close_interval(None, u64::MAX, &mut self.out);
            self.finished.insert(stream);
        }
    }

    /// Takes and writes every call of every process: the recording ended.
    pub fn finish(&mut self) {
        // Parents first (lower streams), whose heaps their children wait for.
        let mut ids: Vec<u32> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(s) = self.streams.get_mut(&id) {
                s.awaiting_fork = None;
            }
            self.finish_stream(id);
        }
    }

    /// The chunks ready for the file, in order.
    pub fn take_output(&mut self) -> std::vec::Drain<'_, OutChunk> {
        self.out.drain(..)
    }

    fn stream(&mut self, stream: u32) -> &mut StreamAggregate {
        self.streams
            .entry(stream)
            .or_insert_with(|| StreamAggregate::new(stream))
    }

    /// Takes the calls stream `id`'s merge can order; whether it forked any child.
    fn advance_stream(&mut self, id: u32) -> bool {
        let Some(s) = self.streams.get_mut(&id) else {
            return false;
        };
        if let Some(key) = s.awaiting_fork {
            match self.fork_heaps.remove(&key) {
                Some(heap) => {
                    s.live += heap.bytes;
                    s.usable += heap.usable_bytes;
                    s.merger.seed_inherited(heap);
                    s.awaiting_fork = None;
                }
                None if self.finished.contains(&key.0) => s.awaiting_fork = None,
                None => return false,
            }
        }
        let forks = s.take(&mut self.out);
        let forked = !forks.is_empty();
        for (mark, heap) in forks {
            self.fork_heaps.insert((id, mark), heap);
        }
        forked
    }
}

/// How the left-out calls of one stack and size counted.
#[derive(Default, Clone, Copy)]
struct Sums {
    allocations: u64,
    temporaries: u64,
}

/// Requested sizes below this without a stack are counted in an array: most left-out
/// blocks are, and a map's lookup was a quarter of the aggregation's own time per call.
const SMALL_SIZES: u64 = 4096;

/// The left-out calls' sums of an interval, by stack and size.
#[derive(Default)]
struct IntervalSums {
    /// Without a stack, by size below [`SMALL_SIZES`].
    small: Vec<Sums>,
    other: FastMap<(u32, u64), Sums>,
}

impl IntervalSums {
    #[inline]
    fn of(&mut self, stack: u32, size: u64) -> &mut Sums {
        if stack == 0 && size < SMALL_SIZES {
            if self.small.is_empty() {
                self.small.resize(SMALL_SIZES as usize, Sums::default());
            }
            &mut self.small[size as usize]
        } else {
            self.other.entry((stack, size)).or_default()
        }
    }

    /// Every (stack, size) counted, its sums, and none after.
    fn drain(&mut self) -> impl Iterator<Item = ((u32, u64), Sums)> + '_ {
        let small = (self.small.iter_mut().enumerate())
            .filter(|(_, s)| s.allocations != 0 || s.temporaries != 0)
            .map(|(size, s)| ((0, size as u64), std::mem::take(s)));
        small.chain(self.other.drain())
    }
}

/// Which blocks a snapshot or fork has seen: those allocated at ticks up to
/// `through`, but for those allocated in that tick after a fork or a starting heap took
/// the blocks there (`late`: the tick alone cannot tell them from those before).
#[derive(Default)]
struct Seen {
    through: Option<u64>,
    late: AddrSet,
    late_tick: Option<u64>,
}

impl Seen {
    /// Whether block `b` at `addr` has not been seen.
    fn not(&self, addr: u64, b: &LiveBlock) -> bool {
        if b.inherited {
            return false;
        }
        let born = u64::from(b.born_tick);
        match self.through {
            None => true,
            Some(t) if born > t => true,
            Some(t) => born == t && self.late_tick == Some(t) && self.late.contains(&addr),
        }
    }

    /// Every block allocated up to `tick` was seen (a snapshot).
    fn through(&mut self, tick: u64) {
        self.through = Some(tick);
        self.late.clear();
        self.late_tick = None;
    }

    /// Every block live now was seen in the middle of `tick` (a fork, a starting heap):
    /// later blocks of the same tick are told apart by address.
    fn mid_tick(&mut self, tick: u64) {
        self.through(tick);
        self.late_tick = Some(tick);
    }

    /// A block allocated at `tick` (at `addr`).
    fn allocated(&mut self, tick: u64, addr: u64) {
        if self.late_tick == Some(tick) {
            self.late.insert(addr);
        }
    }

    /// An unseen block ended.
    fn ended(&mut self, addr: u64) {
        if self.late_tick.is_some() {
            self.late.remove(&addr);
        }
    }
}

/// One process's merge and what it writes.
///
/// A block is *unseen* while no snapshot or fork has seen it: allocated after the last
/// one (its allocation tick is past `seen_through`, or it is in `late`). Its allocation
/// is not written as it comes: a snapshot (or fork) writes the unseen blocks still live,
/// from the merge's live table, and a free of an unseen block leaves both out. A free of
/// a block already seen is written there too, before them (`write_changes`). So what is
/// kept per call is the merge's own table, and per interval the addresses of the seen
/// blocks that ended.
struct StreamAggregate {
    stream: u32,
    /// The thread the written calls are given to (the process's first).
    tid: Option<u32>,
    decoder: StreamDecoder,
    decoded: DecodedEvents,
    merger: Merger,
    /// Its parent's stream and the fork's mark, until its heap there is taken.
    awaiting_fork: Option<(u32, u32)>,
    /// Snapshots said and not yet passed.
    snapshots: VecDeque<u64>,
    /// Which blocks a snapshot or fork has seen.
    seen: Seen,
    /// The items taken since the last write (at a snapshot or fork), in order: the
    /// allocator's statistics, LIVE records, a fork.
    open: Vec<Merged>,
    /// The seen blocks that ended since the last snapshot or fork, and their usable
    /// sizes.
    ended: Vec<(u64, u64)>,
    sums: IntervalSums,
    /// Each thread's last allocated address (temporaries, as the model counts them).
    last_alloc: LastAllocs,
    live: u64,
    usable: u64,
    /// The most live bytes since the last LIVE record, and when.
    peak: (u64, u64),
    calls: u64,
    last_tick: u64,
    /// The timeline bucket of the last item taken.
    bucket: Option<u64>,
    writer: StreamWriter,
}

impl StreamAggregate {
    fn new(stream: u32) -> Self {
        Self {
            stream,
            tid: None,
            decoder: StreamDecoder::default(),
            decoded: DecodedEvents::default(),
            merger: Merger::new(),
            awaiting_fork: None,
            snapshots: VecDeque::new(),
            seen: Seen::default(),
            open: Vec::new(),
            ended: Vec::new(),
            sums: IntervalSums::default(),
            last_alloc: LastAllocs::default(),
            live: 0,
            usable: 0,
            peak: (0, 0),
            calls: 0,
            last_tick: 0,
            bucket: None,
            writer: StreamWriter::default(),
        }
    }

    fn push(&mut self, h: &EventsHeader, records: &[u8]) {
        self.tid.get_or_insert(h.tid);
        self.decoder.decode(h, records, &mut self.decoded);
        // A buffer that ends early keeps what decoded; the merge counts what it lost.
        let _ = self.merger.push_decoded(h, &mut self.decoded);
    }

    /// Takes every merged item there is; returns the heaps at the forks among them, by
    /// mark.
    fn take(&mut self, out: &mut Vec<OutChunk>) -> Vec<(u32, InheritedHeap)> {
        let mut forks = Vec::new();
        loop {
            // A lone thread's calls come without the general merge's item (as the model
            // takes them).
            if let Some(c) = self.merger.pop_lone_call() {
                self.take_item(Merged::Call(c), out);
                continue;
            }
            let Some(item) = self.merger.pop() else { break };
            if let Merged::Forked { mark, .. } = item {
                forks.push((mark, self.merger.heap_at_fork()));
            }
            self.take_item(item, out);
        }
        forks
    }

    fn take_item(&mut self, item: Merged, out: &mut Vec<OutChunk>) {
        let tick = item.tick();
        while let Some(snapshot) = self.snapshots.front().copied().filter(|&t| tick > t) {
            self.snapshots.pop_front();
            // The merge has applied this item already: the snapshot is before it.
            let before = match &item {
                Merged::Call(c) => Some(c),
                _ => None,
            };
            self.close_interval(before, snapshot, out);
        }
        if self.bucket.is_some_and(|b| b != tick / TIMELINE_TICKS) {
            self.push_live();
        }
        self.bucket = Some(tick / TIMELINE_TICKS);
        self.last_tick = tick;
        match item {
            Merged::Call(c) => self.take_call(c),
            // Compared with the live bytes there: the LIVE record just before it says
            // them as every call had them.
            Merged::Stats { .. } => {
                self.push_live();
                self.open.push(item);
            }
            // The child inherits every block live here: all are written before it.
            Merged::Forked { .. } => {
                self.write_changes(None, tick, out);
                self.seen.mid_tick(tick);
                self.open.push(item);
            }
            Merged::Summary { .. } => self.open.push(item),
        }
    }

    /// One call as the model takes it: the frees of seen blocks are written, the blocks
    /// it allocates wait for the next snapshot, and a free of an unseen block leaves both
    /// out, counted by stack and size.
    fn take_call(&mut self, c: Call) {
        self.calls += 1;
        let temporary = self.last_alloc.frees_last(&c);
        for &(addr, b) in self.merger.ended_by_last_pop() {
            self.live -= b.size.min(self.live);
            self.usable -= b.usable().min(self.usable);
            let stack = if is_inherited_stack(b.stack) {
                0
            } else {
                b.stack
            };
            let unseen = self.seen.not(addr, &b);
            if temporary || unseen {
                let sums = self.sums.of(stack, b.size);
                sums.temporaries += u64::from(temporary);
                sums.allocations += u64::from(unseen);
            }
            if unseen {
                self.seen.ended(addr);
            } else {
                // A free, a realloc's old block, or a block a forced allocation displaced.
                self.ended.push((addr, b.usable()));
            }
        }
        if c.allocates().is_some() {
            self.live += c.size;
            self.usable += c.usable.max(c.size);
            if self.live > self.peak.0 {
                self.peak = (self.live, c.tick);
            }
            self.seen.allocated(c.tick, c.addr);
        }
    }

    fn push_live(&mut self) {
        let summary = Summary::Live {
            live: self.live,
            usable: self.usable,
            peak: self.peak.0.max(self.live),
            peak_tick: if self.peak.0 > self.live {
                self.peak.1
            } else {
                self.last_tick
            },
            calls: std::mem::take(&mut self.calls),
        };
        self.open.push(Merged::Summary {
            tick: self.last_tick,
            summary,
        });
        self.peak = (self.live, self.last_tick);
    }

    /// Writes the items taken since the last write, then what changed in the live blocks
    /// since the last snapshot or fork (before call `before`, which the merge applied
    /// already), at the last tick: the seen blocks that ended and the unseen blocks still
    /// live, by address ([`in_written_order`]); all are seen from here on. Not at their
    /// own ticks: so ordered they cost a quarter as much over a heap that turns over
    /// between snapshots, and what the calls' times gave (the live bytes over time, their
    /// peak, the allocator's statistics beside them) is in the LIVE records. The blocks go
    /// to the writer as they are read, never all held as calls.
    ///
    /// The interposer's own memory follows, as reported up to `moment` (the snapshot's
    /// tick; `u64::MAX` at the end), as the model reads it there.
    fn write_changes(&mut self, before: Option<&Call>, moment: u64, out: &mut Vec<OutChunk>) {
        self.merger.apply_held_free();
        let seen = &self.seen;
        let unseen = |live: &crate::order::live::LiveTable| -> Vec<(u64, LiveBlock)> {
            live.iter().filter(|(addr, b)| seen.not(*addr, b)).collect()
        };
        let mut born = match before {
            Some(c) => self.merger.with_live_before_last_pop(c, unseen),
            None => unseen(self.merger.live_blocks()),
        };
        born.sort_unstable_by_key(|&(addr, _)| addr);
        self.ended.sort_unstable();
        let (at, tid) = (self.last_tick, self.tid.unwrap_or(0));
        let changes = in_written_order(&self.ended, &born).map(|change| match change {
            Change::Ended(addr) => Merged::Call(Call::on(at, tid, crate::Func::Free, addr)),
            Change::Born(addr, b) => {
                let mut c = Call::on(at, tid, crate::Func::Malloc, addr);
                c.size = b.size;
                c.usable = b.usable();
                c.stack = b.stack;
                Merged::Call(c)
            }
        });
        let items = self.open.drain(..).chain(changes);
        let lost = self.merger.stats().lost_events;
        let own_tick = if moment == u64::MAX {
            at
        } else {
            moment.max(at)
        };
        let own = (own_tick, self.merger.own_memory_at(moment));
        (self.writer).write(self.stream, tid, items, &self.merger, lost, own, out);
        self.ended.clear();
    }

    /// A snapshot passed (or the process ended): the interval's items are written, with
    /// the sums of what was left out and the changes in the live blocks.
    fn close_interval(&mut self, before: Option<&Call>, moment: u64, out: &mut Vec<OutChunk>) {
        if self.bucket.is_some() {
            self.push_live();
        }
        let tick = self.last_tick;
        for ((stack, size), s) in self.sums.drain() {
            let summary = Summary::Summed {
                stack,
                size,
                allocations: s.allocations,
                temporaries: s.temporaries,
            };
            self.open.push(Merged::Summary { tick, summary });
        }
        self.write_changes(before, moment, out);
        self.seen.through(self.last_tick);
    }
}

/// A change in the live blocks between two snapshots, as written.
enum Change {
    Ended(u64),
    Born(u64, LiveBlock),
}

/// The changes of an interval in the order they are written: the ended blocks by
/// address, each followed by the block born in its place (same address and usable size:
/// an allocator's chunk handed out again, which the packed form then names as the block
/// its thread freed last, at no cost), then the other blocks born, by address. A block
/// born in an ended block's place takes exactly its room, so no two live blocks ever
/// overlap. `ended` and `born` are sorted by address.
fn in_written_order<'a>(ended: &'a [(u64, u64)], born: &'a [(u64, LiveBlock)]) -> WrittenOrder<'a> {
    WrittenOrder {
        ended,
        born,
        in_place: vec![false; born.len()],
        next_ended: 0,
        match_at: 0,
        next_born: 0,
        pending: None,
    }
}

struct WrittenOrder<'a> {
    ended: &'a [(u64, u64)],
    born: &'a [(u64, LiveBlock)],
    /// The born blocks written after the ended one in their place.
    in_place: Vec<bool>,
    next_ended: usize,
    /// The first born block not below the ended blocks written so far.
    match_at: usize,
    next_born: usize,
    /// The block born in the place of the ended block just written.
    pending: Option<Change>,
}

impl Iterator for WrittenOrder<'_> {
    type Item = Change;

    fn next(&mut self) -> Option<Change> {
        if let Some(c) = self.pending.take() {
            return Some(c);
        }
        if let Some(&(addr, usable)) = self.ended.get(self.next_ended) {
            self.next_ended += 1;
            while self.born.get(self.match_at).is_some_and(|&(a, _)| a < addr) {
                self.match_at += 1;
            }
            let again = self.born.get(self.match_at);
            if let Some(&(a, b)) = again.filter(|(a, b)| *a == addr && b.usable() == usable) {
                self.in_place[self.match_at] = true;
                self.pending = Some(Change::Born(a, b));
            }
            return Some(Change::Ended(addr));
        }
        while let Some(&(a, b)) = self.born.get(self.next_born) {
            self.next_born += 1;
            if !self.in_place[self.next_born - 1] {
                return Some(Change::Born(a, b));
            }
        }
        None
    }
}

/// Writes one process's aggregated items as one thread's packed buffers.
#[derive(Default)]
struct StreamWriter {
    packer: Packer,
    packed: PackedBuffer,
    records: Vec<Record>,
    /// The tick the buffer being written starts at, and the tick of its last record.
    first_tick: u64,
    tick: u64,
    seq: u32,
    /// The process's stacks defined so far in the written thread, whose ids are the
    /// process's own (each defined as the merge learns it, so that ids stay as in a
    /// full recording).
    stacks_defined: u32,
    /// The usable size of each requested size, as the reader's table will have it
    /// (USABLE records, as the interposer writes them: a malloc then needs none).
    usable: FastMap<u64, u64>,
    lost: u64,
    own_memory: u64,
}

impl StreamWriter {
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        stream: u32,
        tid: u32,
        items: impl Iterator<Item = Merged>,
        merger: &Merger,
        lost: u64,
        (own_tick, own_memory): (u64, u64),
        out: &mut Vec<OutChunk>,
    ) {
        if lost > self.lost {
            self.push(Record::Lost {
                count: lost - self.lost,
            });
            self.lost = lost;
        }
        while (self.stacks_defined as usize) < merger.stack_count() {
            self.stacks_defined += 1;
            let id = self.stacks_defined;
            self.push(Record::StackDef {
                id,
                frames: merger.stack(id).to_vec(),
            });
        }
        for item in items {
            self.item(item);
            if self.records.len() >= RECORDS_PER_CHUNK {
                self.flush(stream, tid, out);
            }
        }
        if own_memory > self.own_memory {
            self.advance_to(own_tick);
            self.push(Record::OwnMemory { bytes: own_memory });
            self.own_memory = own_memory;
        }
        self.flush(stream, tid, out);
    }

    /// Moves the written thread's clock on to `tick` (never back).
    fn advance_to(&mut self, tick: u64) {
        if tick > self.tick {
            self.push(Record::Tick {
                delta: tick - self.tick,
            });
            self.tick = tick;
        }
    }

    fn item(&mut self, item: Merged) {
        let tick = item.tick();
        self.advance_to(tick);
        let record = match item {
            Merged::Call(c) if c.func == crate::Func::Free => Record::Free { addr: c.addr },
            Merged::Call(c) => {
                let small = matches!(c.func, crate::Func::Malloc | crate::Func::Calloc);
                if small && c.usable != 0 && self.usable.get(&c.size) != Some(&c.usable) {
                    self.usable.insert(c.size, c.usable);
                    self.push(Record::Usable {
                        size: c.size,
                        usable: c.usable,
                    });
                }
                Record::Alloc {
                    func: c.func,
                    addr: c.addr,
                    old_addr: c.old_addr,
                    size: c.size,
                    align: c.align,
                    usable: (c.usable != 0).then_some(c.usable),
                    stack: self.stack(c.stack),
                }
            }
            Merged::Stats { source, values, .. } => Record::Stats { source, values },
            Merged::Forked { mark, .. } => Record::Forked { mark },
            Merged::Summary { summary, .. } => match summary {
                Summary::Summed {
                    stack,
                    size,
                    allocations,
                    temporaries,
                } => Record::Summed {
                    stack: self.stack(stack),
                    size,
                    allocations,
                    temporaries,
                },
                Summary::Live {
                    live,
                    usable,
                    peak,
                    peak_tick,
                    calls,
                } => Record::Live {
                    live,
                    usable,
                    peak,
                    peak_age: tick.saturating_sub(peak_tick),
                    calls,
                },
            },
        };
        self.push(record);
    }

    /// Adds a record to the buffer being written; the first one starts it at the
    /// current tick.
    fn push(&mut self, record: Record) {
        if self.records.is_empty() {
            self.first_tick = self.tick;
        }
        self.records.push(record);
    }

    /// The written thread's id of process stack `stack`: its own, once defined.
    fn stack(&self, stack: u32) -> u32 {
        if stack <= self.stacks_defined {
            stack
        } else {
            0
        }
    }

    fn flush(&mut self, stream: u32, tid: u32, out: &mut Vec<OutChunk>) {
        if self.records.is_empty() {
            return;
        }
        let first_tick = self.first_tick;
        self.packer
            .pack_records(tid, &self.records, &mut self.packed);
        self.records.clear();
        let h = EventsHeader {
            stream,
            tid,
            seq: self.seq,
            first_tick,
            last_tick: self.tick,
            thread_exited: false,
            thread_idle: false,
            process_marks_idle: false,
            packed: true,
            tables_reset: self.packed.tables_reset,
        };
        self.seq += 1;
        let payload = h.encode_with(&self.packed.bytes);
        let header_len = payload.len() - self.packed.bytes.len();
        let ends = self.packed.section_ends.iter().map(|e| e + header_len);
        out.push((ChunkKind::PackedEvents, payload, ends.collect()));
    }
}

/// Event buffers held back until the snapshots taken before their calls are in the
/// file. The model evaluates a snapshot when the merged calls pass its tick, as it reads
/// them: a buffer with a later call read before the snapshot's chunk would have the
/// snapshot evaluated late, with that buffer's frees and allocations in it (a burst of
/// frees while a 140 MiB heap's residency was read: 16 MiB fewer live bytes than at the
/// snapshot's tick). A stream's buffers keep their order: one held holds those after it.
#[derive(Default)]
pub struct SnapshotsFirst {
    /// Snapshots started and not yet in the file, by stream.
    open: FastMap<u32, Vec<u64>>,
    held: FastMap<u32, VecDeque<(u64, OutChunk)>>,
}

impl SnapshotsFirst {
    /// A snapshot of `stream` at `tick` started: its chunk will come.
    pub fn started(&mut self, stream: u32, tick: u64) {
        self.open.entry(stream).or_default().push(tick);
    }

    /// The snapshot's chunk went out, or it wrote none: the buffers it held go to `out`.
    pub fn ended(&mut self, stream: u32, tick: u64, out: &mut Vec<OutChunk>) {
        if let Some(open) = self.open.get_mut(&stream) {
            if let Some(i) = open.iter().position(|&t| t == tick) {
                open.swap_remove(i);
            }
        }
        self.release(stream, out);
    }

    /// Takes one chunk for the file: to `out`, unless it is a thread buffer with a call
    /// past a snapshot whose chunk has not gone out yet (or behind one such).
    pub fn chunk(&mut self, chunk: OutChunk, out: &mut Vec<OutChunk>) {
        let (kind, payload, _) = &chunk;
        if *kind == ChunkKind::End {
            self.release_all(out);
        }
        if !matches!(kind, ChunkKind::Events | ChunkKind::PackedEvents) {
            out.push(chunk);
            return;
        }
        let Ok((h, _)) = EventsHeader::decode(payload) else {
            out.push(chunk);
            return;
        };
        let queue = self.held.entry(h.stream).or_default();
        queue.push_back((h.last_tick, chunk));
        self.release(h.stream, out);
    }

    /// Every held buffer, in order: the recording ended.
    pub fn release_all(&mut self, out: &mut Vec<OutChunk>) {
        self.open.clear();
        let mut streams: Vec<u32> = self.held.keys().copied().collect();
        streams.sort_unstable();
        for s in streams {
            self.release(s, out);
        }
    }

    fn release(&mut self, stream: u32, out: &mut Vec<OutChunk>) {
        let first_open = self
            .open
            .get(&stream)
            .and_then(|o| o.iter().min().copied())
            .unwrap_or(u64::MAX);
        let Some(queue) = self.held.get_mut(&stream) else {
            return;
        };
        while queue.front().is_some_and(|(last, _)| *last <= first_open) {
            if let Some((_, chunk)) = queue.pop_front() {
                out.push(chunk);
            }
        }
    }
}

/// What aggregating a trace file gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregatedFile {
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// The file ended at damage: what came before it was aggregated.
    pub damaged: bool,
}

/// Aggregates the trace at `input` into `out` (as `record --aggregate` would have
/// written it): first its snapshots' ticks are read, then its chunks aggregated in
/// order. `progress` is told the bytes read so far of the two passes' total.
pub fn aggregate_file<W: std::io::Write>(
    input: &std::path::Path,
    out: &mut crate::format::chunk::ChunkWriter<W>,
    progress: &mut impl FnMut(u64, u64),
) -> Result<AggregatedFile, TraceError> {
    let file_bytes = std::fs::metadata(input)?.len();
    let total = 2 * file_bytes;
    let mut agg = Aggregator::default();
    let mut order = SnapshotsFirst::default();
    let open = || -> Result<_, TraceError> {
        let file = std::fs::File::open(input)?;
        crate::format::chunk::ChunkReader::new(std::io::BufReader::with_capacity(1 << 20, file))
    };
    // The snapshots first: a snapshot's chunk may come after calls past its tick.
    let mut reader = open()?;
    let mut raw = Vec::new();
    let mut chunks = 0u64;
    while let Some(kind) = reader.next_chunk_into(&mut raw) {
        chunks += 1;
        if chunks.is_multiple_of(256) {
            progress(reader.offset(), total);
        }
        match kind {
            ChunkKind::Pagemap => {
                if let Some((stream, tick)) = snapshot_moment(&raw) {
                    agg.snapshot_at(stream, tick);
                    order.started(stream, tick);
                }
            }
            ChunkKind::Meta => {
                if let Ok(Chunk::Meta(m)) = decode_chunk(kind, &raw) {
                    if m.aggregated {
                        return Err(TraceError::Malformed(
                            "the trace is aggregated already".into(),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let mut reader = open()?;
    while let Some(kind) = reader.next_chunk_into(&mut raw) {
        chunks += 1;
        if chunks.is_multiple_of(256) {
            progress(file_bytes + reader.offset(), total);
        }
        let meta = match kind {
            ChunkKind::Meta => crate::format::records::Meta::decode(&raw).ok(),
            _ => None,
        };
        let payload = match meta {
            Some(m) => crate::format::records::Meta {
                aggregated: true,
                ..m
            }
            .encode(),
            None => std::mem::take(&mut raw),
        };
        agg.chunk(kind, payload, Vec::new());
        write_out(&mut agg, &mut order, out)?;
    }
    agg.finish();
    write_out(&mut agg, &mut order, out)?;
    let mut rest = Vec::new();
    order.release_all(&mut rest);
    for (kind, payload, sections) in rest {
        out.write(kind, &payload, &sections)?;
    }
    out.flush()?;
    progress(total, total);
    Ok(AggregatedFile {
        bytes_read: file_bytes,
        bytes_written: out.bytes_written(),
        damaged: reader.damage().is_some(),
    })
}

/// The aggregator's chunks so far into the file, each thread buffer after the snapshots
/// before it.
fn write_out<W: std::io::Write>(
    agg: &mut Aggregator,
    order: &mut SnapshotsFirst,
    out: &mut crate::format::chunk::ChunkWriter<W>,
) -> std::io::Result<()> {
    let mut ready = Vec::new();
    for chunk in agg.take_output() {
        let snapshot = match chunk.0 {
            ChunkKind::Pagemap => snapshot_moment(&chunk.1),
            _ => None,
        };
        order.chunk(chunk, &mut ready);
        if let Some((stream, tick)) = snapshot {
            order.ended(stream, tick, &mut ready);
        }
    }
    for (kind, payload, sections) in ready {
        out.write(kind, &payload, &sections)?;
    }
    Ok(())
}

/// The stream and tick a Pagemap chunk's payload starts with, without its residency.
fn snapshot_moment(payload: &[u8]) -> Option<(u32, u64)> {
    let mut r = crate::format::wire::Reader::new(payload);
    let stream = u32::try_from(r.varint().ok()?).ok()?;
    Some((stream, r.varint().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(size: u64, rounding: u32) -> LiveBlock {
        LiveBlock {
            size,
            rounding,
            stack: 0,
            born_tick: 0,
            inherited: false,
        }
    }

    fn written(ended: &[(u64, u64)], born: &[(u64, LiveBlock)]) -> Vec<String> {
        let name = |c: Change| match c {
            Change::Ended(a) => format!("-{a:#x}"),
            Change::Born(a, b) => format!("+{a:#x}/{}", b.usable()),
        };
        in_written_order(ended, born).map(name).collect()
    }

    /// A block born where one ended, with its usable size, follows that one's end; the
    /// others come after every end, by address.
    #[test]
    fn a_block_born_in_an_ended_ones_place_is_written_right_after_it() {
        let ended = [(0x1000, 32), (0x1040, 48), (0x2000, 64)];
        let born = [
            (0x1000, block(30, 2)), // in 0x1000's place
            (0x1010, block(8, 8)),  // elsewhere
            (0x1040, block(64, 0)), // at 0x1040, but larger: not in its place
            (0x2000, block(60, 4)), // in 0x2000's place
            (0x3000, block(16, 0)), // elsewhere
        ];
        assert_eq!(
            written(&ended, &born),
            [
                "-0x1000",
                "+0x1000/32",
                "-0x1040",
                "-0x2000",
                "+0x2000/64",
                "+0x1010/16",
                "+0x1040/64",
                "+0x3000/16"
            ]
        );
        assert_eq!(written(&[], &born[..2]), ["+0x1000/32", "+0x1010/16"]);
        assert_eq!(written(&ended[..1], &[]), ["-0x1000"]);
    }
}
