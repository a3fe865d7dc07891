//! One process's threads, merged into a single sequence of calls in which no address is
//! ever live twice.
//!
//! Each thread's records arrive in program order, buffer by buffer, carrying the shared
//! millisecond tick and, once a process has a second thread, each call's reading of the
//! shared order counter ([`ChunkDecoder::place`]). Across threads the merge goes by
//! (tick, place): a free takes a counter value before the real free, an allocation reads
//! the counter after the real allocation returns, so an allocation of a block always has
//! a higher place than the free that gave the block back, in whichever thread.
//!
//! A realloc frees and allocates in one call: it takes a counter value before the call,
//! for the block it gives back inside it, and reads the counter after, which places it
//! (its allocation comes after the free of the block it got). Another thread can be
//! handed the old block between the two: that allocation, placed between them, takes the
//! block from the realloc waiting at the head of its thread ([`Call::old_taken`]).
//!
//! Causality backs the places up where they cannot decide (a realloc of a trace older
//! than its release's place; calls of a thread that had not seen the counter switched on
//! yet; traces older than the counter):
//! - an allocation returning an address that is still live waits for the free of it
//!   (in another thread) to be merged first;
//! - a free (or realloc) of an address not live waits for its allocation.
//!
//! A call waits at most [`WAIT_WINDOW_TICKS`] behind the newest tick seen; past that (a
//! block allocated before tracing began, a lost buffer) it is merged anyway and counted
//! in [`MergeStats`]. The calls held back meanwhile (with hundreds of threads on a few
//! cores, millions of them behind one preempted thread) wait in memory up to a budget
//! and on disk past it ([`crate::order::spill`]), so memory is bounded by the live addresses
//! plus one segment per thread, never by the length of the trace, and the merge never
//! gives up order for memory.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::format::event::Func;
use crate::format::hash::{AddrSet, FastMap};
use crate::format::reader::{Chunk, TraceReader};
use crate::format::records::EventsHeader;
use crate::format::TraceError;
use crate::order::call::CallArray;
pub use crate::order::call::{Call, Merged};
use crate::order::spill::{SpillFile, ThreadSpill};
use crate::order::stream_decoder::{DecodedEvents, DecodedOther, StreamDecoder};

/// How long (in ticks, i.e. ms) a call may wait for its causal partner, and for a
/// silent thread of a process whose idle threads are not flagged.
pub const WAIT_WINDOW_TICKS: u64 = 1000;
/// How long calls wait for a silent thread of a process that flags its idle threads:
/// such a thread is inside a call (with hundreds of threads on a few cores, the
/// scheduler or the socket's lock can leave it waiting for over a second) and its calls
/// will come. The bound is for a thread that never returns to the interposer (a signal
/// handler that longjmp'd out of it): what waits meanwhile is on disk.
pub const SILENT_THREAD_WAIT_TICKS: u64 = 60_000;
/// Calls held in memory, across all threads, before later ones go to disk (about 80
/// bytes each).
pub const MEMORY_BUDGET_ITEMS: usize = 1 << 18;
/// Calls a thread keeps in memory however full the budget is.
const HEAD_ITEMS: usize = 64;
/// How many calls ahead of the one popped a thread's free has its block's memory asked
/// for ([`Merger::pop_lone_call`], `Merger::pop_queued`).
const PREFETCH_AHEAD: usize = 16;

pub use crate::order::live::{is_inherited_stack, InheritedHeap, LiveBlock, LiveIter, LiveTable};
use crate::order::live::{InheritedStackTable, INHERITED_STACK};

impl LiveBlock {
    /// The block call `c` allocates, as the merge makes it live.
    pub fn of(c: &Call) -> Self {
        Self {
            size: c.size,
            rounding: c.usable.saturating_sub(c.size).min(u64::from(u32::MAX)) as u32,
            stack: c.stack,
            born_tick: c.tick.min(u64::from(u32::MAX)) as u32,
            inherited: false,
        }
    }
}

/// What the merge could not order by the rules and merged anyway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Allocations returning an address still live (its free never came).
    pub forced_allocs: u64,
    /// Frees of addresses never allocated in the trace (allocated before tracing began).
    pub unknown_frees: u64,
    /// Calls that arrived after later ticks had been merged (an idle thread's buffer).
    pub late: u64,
    /// Events a signal handler could not queue (from lost records).
    pub lost_events: u64,
    /// Calls merged ahead of an earlier-placed call of another thread that had to wait
    /// for causality (a realloc's blocks; calls made before ordering was switched on).
    pub reordered: u64,
    /// Allocations that took a block a realloc of another thread gave back before they
    /// were made but is placed after them (see [`Call::old_taken`]): ordered, not forced.
    pub taken_from_reallocs: u64,
    /// Calls that waited past the memory budget, in their compact form and mostly on
    /// disk, for a slow thread (see [`crate::order::spill`]).
    pub spilled: u64,
    /// Calls lost because the disk gave back what it was given wrong (counted in
    /// `lost_events` too; [`Merger::spill_problem`] says why).
    pub spill_lost: u64,
    /// Blocks of the starting heap ([`Merger::seed_starting_heap`]) whose address was
    /// allocated again with no free recorded: freed between the heap's reading and the
    /// first recorded call.
    pub starting_stale: u64,
    /// Blocks inherited at the fork ([`Merger::seed_inherited`]) whose address was
    /// allocated again with no free recorded: freed in the parent before the fork with no
    /// record of it (the parent's own merge forced their address), or by another thread
    /// of the parent between the fork's mark and the fork.
    pub inherited_stale: u64,
}

struct ThreadQueue {
    tid: u32,
    /// Items with their places inside their ticks ([`ChunkDecoder::place`]; 0 when the
    /// thread recorded none). Across threads the merge takes the earliest (tick, place)
    /// among the calls it may take. Empty only when `spill` is empty too.
    queue: VecDeque<(Merged, u64)>,
    /// The items after `queue`'s, when the merge's memory budget is spent.
    spill: ThreadSpill,
    /// No future item of this thread comes before this (tick, place).
    known_through: (u64, u64),
    /// The thread sent its last buffer: the merge no longer waits for it.
    exited: bool,
    /// The thread was idle with nothing buffered when its last chunk was sent: it sends
    /// again right after its next call, so the merge does not wait for it till then.
    idle: bool,
    /// Items popped so far (with the queue's length, the items queued so far).
    popped: u64,
    /// Threads this one joined, each with the number of its items queued before the
    /// join: items from there on wait until the joined thread's are all merged.
    joins: VecDeque<(u64, u32)>,
}

impl ThreadQueue {
    /// Items queued, in memory and on disk.
    fn queued(&self) -> u64 {
        self.queue.len() as u64 + self.spill.items()
    }
}

/// The calls of a chunk of the only thread the merge knows, in a plain array popped in
/// turn. A lone thread's program order is the order, so it needs neither its queue of
/// items, nor the heap of heads, nor the watermark: with `--stacks all` and one thread
/// they cost more than the model's own work. When another chunk comes before the run is
/// popped (a second thread's, or the same thread's) the rest of the run goes to the
/// thread's queue, places and all, and the general merge takes over.
#[derive(Default)]
struct LoneRun {
    /// The thread's index in `Merger::threads`.
    thread: usize,
    calls: CallArray,
    /// The places of `calls` (see `ThreadQueue::queue`); shorter than `calls` when the
    /// rest are 0, and empty for a chunk with none.
    places: Vec<u64>,
    /// The other items (the allocator's statistics), each with the index in `calls` of
    /// the call it comes before, and its place.
    others: VecDeque<(usize, Merged, u64)>,
    /// The next call to pop.
    next: usize,
    /// Items popped since the thread's `popped` was last brought up to date.
    popped: u64,
}

impl LoneRun {
    fn is_empty(&self) -> bool {
        self.next == self.calls.len() && self.others.is_empty()
    }

    /// Starts the run of a new chunk of thread `thread` (`popped` counted already).
    fn restart(&mut self, thread: usize) {
        self.thread = thread;
        self.popped = 0;
        self.calls.clear();
        self.places.clear();
        self.others.clear();
        self.next = 0;
    }

    /// Takes the next item if it is a call.
    #[inline]
    fn pop_call(&mut self) -> Option<Call> {
        let c = self.calls.get(self.next)?;
        if self.others.front().is_some_and(|&(at, ..)| at == self.next) {
            return None;
        }
        self.next += 1;
        self.popped += 1;
        Some(c)
    }

    /// Takes the next item if it is not a call.
    fn pop_other(&mut self) -> Option<Merged> {
        let (at, ..) = self.others.front()?;
        if *at != self.next {
            return None;
        }
        self.popped += 1;
        self.others.pop_front().map(|(_, m, _)| m)
    }

    /// Hands the items left to `put`, in order, with their places.
    fn drain_into(&mut self, mut put: impl FnMut((Merged, u64))) {
        while let Some(&(at, ..)) = self.others.front() {
            while self.next < at {
                put(self.take_call());
            }
            if let Some((_, m, place)) = self.others.pop_front() {
                put((m, place));
            }
        }
        while self.next < self.calls.len() {
            put(self.take_call());
        }
    }

    fn take_call(&mut self) -> (Merged, u64) {
        let i = self.next;
        self.next += 1;
        let place = self.places.get(i).copied().unwrap_or(0);
        let c = self.calls.get(i).expect("a call of the run");
        (Merged::Call(c), place)
    }
}

/// Merges the threads of one process.
pub struct Merger {
    threads: Vec<ThreadQueue>,
    thread_index: FastMap<u32, usize>,
    live: LiveTable,
    /// Blocks the last popped call ended: the one it freed, and the one a forced
    /// allocation replaced.
    ended: [Option<(u64, LiveBlock)>; 2],
    /// A free of the lone run popped while its block stays in the table, because the run's
    /// next call allocates the same address again (a thread cache hands back the block
    /// freed last): that call then takes the bucket as it lies, a lookup instead of a
    /// removal and an insertion, unless anything else comes first (see
    /// [`Merger::apply_held_free`]).
    free_held: Option<u64>,
    /// Decodes the buffers given as bytes ([`Merger::push_chunk`]).
    decoder: StreamDecoder,
    /// The decoded buffer's arrays, kept for the next one.
    scratch: DecodedEvents,
    /// Stacks by process-wide id (0: none).
    stacks: Vec<Vec<u64>>,
    /// The stacks of blocks inherited at the fork (see [`is_inherited_stack`]).
    inherited_stacks: InheritedStackTable,
    max_seen: u64,
    last_tick: u64,
    /// The process flags its idle threads ([`EventsHeader::process_marks_idle`]).
    marks_idle: bool,
    /// The process was running before its calls were recorded (`record -p`): its heap
    /// holds blocks the trace never saw allocated, whose frees no call will unblock.
    attached: bool,
    /// Blocks of the starting heap still live (see [`Merger::seed_starting_heap`]).
    starting: AddrSet,
    /// Items in the threads' in-memory queues.
    in_memory: usize,
    /// Items the threads' in-memory queues have room for.
    queue_capacity: usize,
    memory_budget: usize,
    spill_file: SpillFile,
    finishing: bool,
    stats: MergeStats,
    own_memory: OwnMemory,
    /// Every thread with queued calls, once, by the (tick, place) of its next call (ties
    /// by thread index): choosing the next call costs O(log threads), not a pass over
    /// hundreds of threads per call.
    heads: BinaryHeap<Reverse<Head>>,
    /// Heads taken off `heads` while choosing (blocked calls), put back after.
    set_aside: Vec<Head>,
    /// The watermark as of the last chunk (`None`: not computed since).
    watermark: Option<Watermark>,
    /// The calls of the only thread so far, from its last chunk, when they are not in
    /// its queue (see [`LoneRun`]).
    lone: LoneRun,
    /// Tests: choose by a pass over every thread, the reference the heap must agree with.
    #[cfg(test)]
    scan_every_call: bool,
    /// Tests: queue a lone thread's calls like any thread's, the reference the lone run
    /// must agree with.
    #[cfg(test)]
    no_lone_run: bool,
    /// Tests: frees held back for the next call (see `free_held`).
    #[cfg(test)]
    frees_held: usize,
}

/// Whether call `c` makes `addr` live again without ending a block (what a held free
/// waits for).
#[inline(always)]
fn allocates_again(c: &Call, addr: u64) -> bool {
    c.allocates() == Some(addr) && c.releases().is_none()
}

/// A thread's next call: its (tick, place), then the thread's index.
type Head = ((u64, u64), usize);

impl Default for Merger {
    fn default() -> Self {
        Self::new()
    }
}

impl Merger {
    pub fn new() -> Self {
        Self::with_memory_budget(MEMORY_BUDGET_ITEMS)
    }

    /// A merge whose live blocks read back with a birth tick of 0 (see
    /// [`LiveTable::without_birth_ticks`]).
    pub fn without_birth_ticks(stacks_rare: bool) -> Self {
        Self {
            live: LiveTable::without_birth_ticks(stacks_rare),
            ..Self::new()
        }
    }

    /// A merge that holds at most about `items` waiting calls in memory (plus a few per
    /// thread), the rest on disk.
    pub fn with_memory_budget(items: usize) -> Self {
        Self {
            threads: Vec::new(),
            thread_index: FastMap::default(),
            live: LiveTable::default(),
            ended: [None; 2],
            free_held: None,
            decoder: StreamDecoder::default(),
            scratch: DecodedEvents::default(),
            stacks: vec![Vec::new()],
            inherited_stacks: InheritedStackTable::default(),
            max_seen: 0,
            last_tick: 0,
            marks_idle: false,
            attached: false,
            starting: AddrSet::default(),
            in_memory: 0,
            queue_capacity: 0,
            memory_budget: items,
            spill_file: SpillFile::default(),
            finishing: false,
            stats: MergeStats::default(),
            own_memory: OwnMemory::default(),
            heads: BinaryHeap::new(),
            set_aside: Vec::new(),
            watermark: None,
            lone: LoneRun::default(),
            #[cfg(test)]
            scan_every_call: false,
            #[cfg(test)]
            no_lone_run: false,
            #[cfg(test)]
            frees_held: 0,
        }
    }

    /// The process's heap existed before its first recorded call (`record -p`): a blocked
    /// call that every thread has passed is taken at once (a free of a block from before
    /// the attach, most often) instead of after the wait window, in which every other
    /// thread's calls would pile up behind it.
    pub fn set_attached(&mut self) {
        self.attached = true;
    }

    /// Starts from the blocks a running process held when recording began (`record -p`):
    /// (address, usable bytes). Their frees are then known; one whose address is
    /// allocated again before any free of it was freed before the first recorded call,
    /// and is replaced without counting as forced. Returns the bytes of the blocks taken
    /// (those whose address no merged call holds already).
    pub fn seed_starting_heap(&mut self, tick: u64, blocks: &[(u64, u64)]) -> u64 {
        let mut bytes = 0;
        for &(addr, usable) in blocks {
            if self.live.contains_key(&addr) {
                continue; // allocated again, and recorded, since the heap was read
            }
            bytes += usable;
            self.live.insert(
                addr,
                LiveBlock {
                    size: usable,
                    rounding: 0,
                    stack: 0,
                    born_tick: tick.min(u64::from(u32::MAX)) as u32,
                    inherited: false,
                },
            );
            self.starting.insert(addr);
        }
        bytes
    }

    /// The live blocks after the items popped so far, as a child forked now inherits them
    /// (shared with it from here on: see [`crate::order::live`]).
    pub fn heap_at_fork(&mut self) -> InheritedHeap {
        self.apply_held_free();
        let (stacks, inherited_stacks) = (&self.stacks, &self.inherited_stacks);
        self.live
            .hand_on(|id| stack_of(stacks, inherited_stacks, id))
    }

    /// Starts from the blocks a forked process inherited: they are live, and their frees
    /// are known. Before the first pop.
    pub fn seed_inherited(&mut self, heap: InheritedHeap) {
        if self.live.is_empty() {
            self.live = heap.live;
        } else {
            self.live.extend(heap.live.iter());
        }
        self.inherited_stacks = heap.stacks;
    }

    /// Every live block after the calls popped so far, by address. Not between a pop
    /// and [`Merger::apply_held_free`]: call that first whenever a pop may have been the
    /// last one (reading the blocks between two pops, as a snapshot does).
    pub fn live_blocks(&self) -> &LiveTable {
        assert!(
            self.free_held.is_none(),
            "the live blocks read with a free held back"
        );
        &self.live
    }

    /// Takes the block of a free held back (see `free_held`) out of the table, as its
    /// pop would have: before anything reads the table or another call is settled.
    #[inline]
    pub fn apply_held_free(&mut self) {
        if let Some(addr) = self.free_held.take() {
            self.live.remove(&addr);
        }
    }

    /// The blocks (address, block) that the last popped call ended: a freed block, and
    /// for a forced allocation the block it displaced.
    pub fn ended_by_last_pop(&self) -> impl Iterator<Item = &(u64, LiveBlock)> {
        self.ended.iter().flatten()
    }

    /// Runs `f` on the live blocks as they were before `last`, the call popped last, then
    /// puts that call's effect back. A moment that falls between two calls (a snapshot)
    /// is known only once the later call is popped, which has applied it already.
    pub fn with_live_before_last_pop<R>(
        &mut self,
        last: &Call,
        f: impl FnOnce(&LiveTable) -> R,
    ) -> R {
        self.apply_held_free();
        let added = last
            .allocates()
            .and_then(|a| self.live.remove(&a).map(|b| (a, b)));
        for &(a, b) in self.ended.iter().flatten() {
            self.live.insert(a, b);
        }
        let result = f(&self.live);
        for (a, _) in self.ended.iter().flatten() {
            self.live.remove(a);
        }
        if let Some((a, b)) = added {
            self.live.insert(a, b);
        }
        result
    }

    pub fn stats(&self) -> MergeStats {
        self.stats
    }

    /// Why calls that waited could not go to disk or come back from it, if so.
    pub fn spill_problem(&self) -> Option<&str> {
        self.spill_file.problem()
    }

    /// The interposer's own mapped bytes, as last reported.
    pub fn own_memory(&self) -> u64 {
        self.own_memory.at(u64::MAX)
    }

    /// The interposer's own mapped bytes as reported up to `tick`: a snapshot's, the same
    /// however far past it the merge has read its threads' buffers.
    pub fn own_memory_at(&self, tick: u64) -> u64 {
        self.own_memory.at(tick)
    }

    /// Return addresses of a stack (innermost first); empty for 0.
    pub fn stack(&self, id: u32) -> &[u64] {
        stack_of(&self.stacks, &self.inherited_stacks, id)
    }

    pub fn stack_count(&self) -> usize {
        self.stacks.len() - 1
    }

    /// Adds one thread buffer (an events chunk of this process).
    pub fn push_chunk(&mut self, h: &EventsHeader, records: &[u8]) -> Result<(), TraceError> {
        let mut events = std::mem::take(&mut self.scratch);
        self.decoder.decode(h, records, &mut events);
        let result = self.push_decoded(h, &mut events);
        self.scratch = events;
        result
    }

    /// Adds one thread buffer that a [`StreamDecoder`] of this process decoded (a
    /// [`crate::order::ahead::ReadAhead`]'s: a merger fed this way never decodes). `events` is
    /// left empty, its arrays kept for the next buffer.
    pub fn push_decoded(
        &mut self,
        h: &EventsHeader,
        events: &mut DecodedEvents,
    ) -> Result<(), TraceError> {
        self.apply_held_free();
        self.watermark = None;
        let ti = *self.thread_index.entry(h.tid).or_insert_with(|| {
            self.threads.push(ThreadQueue {
                tid: h.tid,
                queue: VecDeque::new(),
                spill: ThreadSpill::default(),
                known_through: (0, 0),
                exited: false,
                idle: false,
                popped: 0,
                joins: VecDeque::new(),
            });
            self.threads.len() - 1
        });
        self.count_lone_pops();
        if !self.lone.is_empty() {
            self.queue_lone_run();
        }
        self.stacks.append(&mut events.new_stacks);
        // A join's position among the thread's items: every item before it was merged.
        let items_before = self.threads[ti].popped + self.threads[ti].queued();
        let lone =
            self.threads.len() == 1 && self.threads[ti].queued() == 0 && !self.lone_run_disabled();
        // The buffer's arrays become a run, and the run's old ones the buffer's: popped
        // as they are when the thread is alone, else queued.
        self.lone.restart(ti);
        std::mem::swap(&mut self.lone.calls, &mut events.calls);
        std::mem::swap(&mut self.lone.places, &mut events.places);
        // Items other than calls before the current one, which count in a join's position.
        let mut other_items = 0;
        for (at, other) in events.others.drain(..) {
            match other {
                DecodedOther::Stats {
                    tick,
                    place,
                    source,
                    values,
                } => {
                    let stats = Merged::Stats {
                        tick,
                        source,
                        values,
                    };
                    self.lone.others.push_back((at, stats, place));
                    other_items += 1;
                }
                DecodedOther::Forked { tick, place, mark } => {
                    let forked = Merged::Forked { tick, mark };
                    self.lone.others.push_back((at, forked, place));
                    other_items += 1;
                }
                DecodedOther::Lost(count) => {
                    self.stats.lost_events = self.stats.lost_events.saturating_add(count);
                }
                DecodedOther::Joined(tid) => {
                    let at_item = items_before + (at + other_items) as u64;
                    self.threads[ti].joins.push_back((at_item, tid));
                }
                DecodedOther::OwnMemory { tick, bytes } => self.own_memory.said(tick, bytes),
                DecodedOther::Summary {
                    tick,
                    place,
                    summary,
                } => {
                    let item = Merged::Summary { tick, summary };
                    self.lone.others.push_back((at, item, place));
                    other_items += 1;
                }
            }
        }
        if !lone {
            self.queue_lone_run();
        }
        let sent = (events.end_tick, events.end_next_place.unwrap_or(0));
        let t = &mut self.threads[ti];
        t.known_through = t.known_through.max(sent).max((h.last_tick, 0));
        // Records after a thread's last buffer (what glibc frees once the thread has gone,
        // sent when its state is reused or the process exits) do not bring it back; a
        // new thread that got the same tid starts again at seq 0.
        t.exited = h.thread_exited || (t.exited && h.seq != 0);
        t.idle = h.thread_idle;
        self.marks_idle |= h.process_marks_idle;
        self.max_seen = self.max_seen.max(t.known_through.0);
        events.error.take().map_or(Ok(()), Err)
    }

    #[cfg(test)]
    fn lone_run_disabled(&self) -> bool {
        self.no_lone_run
    }

    #[cfg(not(test))]
    fn lone_run_disabled(&self) -> bool {
        false
    }

    /// Hands the rest of the lone run to its thread's queue (in memory or, past the
    /// budget, on disk), where the general merge takes it. Only from `push_decoded`, which
    /// took any held free out.
    fn queue_lone_run(&mut self) {
        let ti = self.lone.thread;
        let had_head = !self.threads[ti].queue.is_empty();
        let mut run = std::mem::take(&mut self.lone);
        run.drain_into(|item| self.enqueue(ti, item));
        self.lone = run;
        if !had_head {
            if let Some(head) = head_of(&self.threads[ti], ti) {
                self.heads.push(Reverse(head));
            }
        }
    }

    /// Queues thread `ti`'s next item: to disk behind items on disk, or past the budget.
    fn enqueue(&mut self, ti: usize, item: (Merged, u64)) {
        let t = &mut self.threads[ti];
        if t.spill.items() > 0
            || (self.in_memory >= self.memory_budget
                && t.queue.len() >= HEAD_ITEMS.min(self.memory_budget).max(1))
        {
            t.spill.push(&mut self.spill_file, &item);
            self.stats.spilled += 1;
        } else {
            let room = t.queue.capacity();
            t.queue.push_back(item);
            self.in_memory += 1;
            self.queue_capacity += t.queue.capacity() - room;
        }
    }

    /// No more chunks will come: `pop` now drains everything.
    pub fn finish(&mut self) {
        self.finishing = true;
    }

    /// Gives back the memory of a finished merge's live blocks, its queues and decoder,
    /// for a reader done with them (a report keeps only their sums from here on, while it
    /// names sites and assembles: holding a big heap's table meanwhile was its peak).
    /// What stays: the stacks, the statistics and the figures of its own memory.
    pub fn release_blocks(&mut self) {
        self.free_held = None;
        self.live = LiveTable::default();
        self.starting = AddrSet::default();
        self.decoder = StreamDecoder::default();
        self.scratch = DecodedEvents::default();
        self.lone = LoneRun::default();
        for t in &mut self.threads {
            t.queue = VecDeque::new();
        }
        self.queue_capacity = 0;
        self.heads = BinaryHeap::new();
        self.set_aside = Vec::new();
    }

    /// How far each thread's calls are safe to merge: a thread's calls before
    /// `Watermark::allows` it, where every other thread active within the wait window has
    /// sent all its calls before that (tick, place).
    fn compute_watermark(&self) -> Watermark {
        let window = if self.marks_idle {
            SILENT_THREAD_WAIT_TICKS
        } else {
            WAIT_WINDOW_TICKS
        };
        let floor = self.max_seen.saturating_sub(window);
        let mut lowest = ((u64::MAX, u64::MAX), usize::MAX);
        let mut second = (u64::MAX, u64::MAX);
        for (i, t) in self.threads.iter().enumerate() {
            if t.exited || t.idle || t.known_through.0 < floor {
                continue;
            }
            if t.known_through < lowest.0 {
                second = lowest.0;
                lowest = (t.known_through, i);
            } else {
                second = second.min(t.known_through);
            }
        }
        Watermark {
            lowest_thread: lowest.1,
            below_lowest: lowest.0,
            below_second: second,
            floor,
        }
    }

    /// Whether call `m`, placed at `when`, must wait for another thread's call.
    fn blocked(&self, m: &Merged, when: (u64, u64)) -> bool {
        let Merged::Call(c) = m else { return false };
        if let Some(old) = c.releases() {
            if !self.live.contains_key(&old) {
                return true;
            }
            // realloc in place releases and re-allocates the same address
            if c.allocates() == Some(old) {
                return false;
            }
        } else if c.func == Func::Free {
            return false; // free(NULL)
        }
        c.allocates().is_some_and(|a| {
            self.live.contains_key(&a) && self.realloc_releasing(a, c.tid, when).is_none()
        })
    }

    /// The thread whose next call is a realloc that gave block `addr` back before `when`
    /// (at the value it took before the call), though placed after it: an allocation of
    /// `addr` by thread `tid` placed at `when` got the block from it. Scans every thread,
    /// but only for an allocation of a live address, which the places make rare.
    fn realloc_releasing(&self, addr: u64, tid: u32, when: (u64, u64)) -> Option<usize> {
        self.threads.iter().position(|t| match t.queue.front() {
            Some((Merged::Call(r), _)) => {
                r.tid != tid
                    && r.releases() == Some(addr)
                    && r.release_when().is_some_and(|released| released < when)
            }
            _ => false,
        })
    }

    /// Whether thread `t`'s next item must wait for a thread it joined: one that has not
    /// sent its last buffer, or whose calls are not all merged.
    fn waits_for_join(&self, t: &ThreadQueue) -> bool {
        let due = t.joins.iter().take_while(|&&(pos, _)| pos <= t.popped);
        due.map(|&(_, tid)| self.thread_index.get(&tid))
            .any(|joined| {
                joined.is_some_and(|&j| {
                    let joined = &self.threads[j];
                    !joined.exited || !joined.queue.is_empty()
                })
            })
    }

    /// Chooses the thread whose next call goes next, or returns `None` when the merge
    /// must wait. Its head is left on top of `heads` (true) or taken off it. The call is the earliest (tick, place)
    /// that the watermark allows and that neither waits for causality nor for a joined
    /// thread; a blocked call is forced once waiting longer cannot help.
    fn choose(&mut self, alone: bool) -> Option<(usize, bool)> {
        // At the end nothing is waited for.
        if !self.finishing && self.watermark.is_none() {
            self.watermark = Some(self.compute_watermark());
        }
        let watermark = if self.finishing {
            None
        } else {
            self.watermark.as_ref()
        };
        let mut chosen = None;
        let mut oldest_blocked: Option<Head> = None;
        // Allowance falls with (tick, place) for every thread but the lowest, whose own
        // head is at most the others' bound: past the first head not allowed, only heads
        // tied with it can be.
        let mut refused_at = None;
        while let Some(&Reverse((when, i))) = self.heads.peek() {
            if refused_at.is_some_and(|r| when > r) {
                break;
            }
            if watermark.is_some_and(|w| !w.allows(i, when)) {
                refused_at.get_or_insert(when);
                self.set_aside.push(self.heads.pop()?.0);
                continue;
            }
            let t = &self.threads[i];
            let head = &t.queue.front()?.0;
            if !alone && (self.blocked(head, when) || self.waits_for_join(t)) {
                // In an attached process the earliest call of all, blocked, waits for
                // nothing: what would unblock it comes before it or not at all.
                if self.attached && refused_at.is_none() && oldest_blocked.is_none() {
                    chosen = Some((when, i));
                    break;
                }
                oldest_blocked.get_or_insert((when, i));
                self.set_aside.push(self.heads.pop()?.0);
                continue;
            }
            chosen = Some((when, i));
            break;
        }
        // The usual case: the top was chosen at once, and stays until its thread's next
        // call replaces it (one sift instead of a pop and a push).
        if chosen.is_some() && self.set_aside.is_empty() {
            return chosen.map(|(_, i)| (i, true));
        }
        if chosen.is_some() {
            self.heads.pop();
        }
        let chosen = match (chosen, oldest_blocked) {
            (Some((when, i)), blocked) => {
                if blocked.is_some_and(|(bw, _)| bw < when) {
                    self.stats.reordered += 1;
                }
                Some((i, false))
            }
            (None, Some((when, i)))
                if self.finishing || when.0.saturating_add(WAIT_WINDOW_TICKS) < self.max_seen =>
            {
                self.set_aside.retain(|&(_, j)| j != i);
                Some((i, false))
            }
            _ => None,
        };
        self.heads.extend(self.set_aside.drain(..).map(Reverse));
        chosen
    }

    /// The reference `choose` must agree with: a pass over every thread.
    #[cfg(test)]
    fn choose_by_scanning_every_thread(&mut self, alone: bool) -> Option<(usize, bool)> {
        let watermark = (!self.finishing).then(|| self.compute_watermark());
        let mut best: Option<Head> = None;
        let mut oldest_blocked: Option<Head> = None;
        // The earliest head of all, and whether the watermark allows it.
        let mut earliest: Option<(Head, bool)> = None;
        for (i, t) in self.threads.iter().enumerate() {
            let Some((head, place)) = t.queue.front() else {
                continue;
            };
            let when = (merged_tick(head), *place);
            let allowed = watermark.as_ref().is_none_or(|w| w.allows(i, when));
            if earliest.is_none_or(|(e, _)| (when, i) < e) {
                earliest = Some(((when, i), allowed));
            }
            if !allowed {
                continue;
            }
            if !alone && (self.blocked(head, when) || self.waits_for_join(t)) {
                if oldest_blocked.is_none_or(|(bw, _)| when < bw) {
                    oldest_blocked = Some((when, i));
                }
            } else if best.is_none_or(|(bw, _)| when < bw) {
                best = Some((when, i));
            }
        }
        let earliest_blocked = earliest
            .filter(|&(e, allowed)| allowed && oldest_blocked == Some(e))
            .map(|(e, _)| e);
        let i = match (best, oldest_blocked) {
            _ if self.attached && earliest_blocked.is_some() => earliest_blocked?.1,
            (Some((when, i)), blocked) => {
                if blocked.is_some_and(|(bw, _)| bw < when) {
                    self.stats.reordered += 1;
                }
                i
            }
            (None, Some((when, i)))
                if self.finishing || when.0.saturating_add(WAIT_WINDOW_TICKS) < self.max_seen =>
            {
                i
            }
            _ => return None,
        };
        self.heads.retain(|&Reverse((_, j))| j != i);
        Some((i, false))
    }

    /// The next call in merged order, or `None` when the merge must wait for more chunks
    /// (or, after `finish`, when all is merged).
    #[inline]
    pub fn pop(&mut self) -> Option<Merged> {
        if let Some(c) = self.pop_lone_call() {
            return Some(Merged::Call(c));
        }
        self.pop_rest()
    }

    /// The next item when it is a call of a lone thread's run, which is most calls: what
    /// [`Merger::pop`] returns then, without building a [`Merged`] (returned through
    /// memory, 72 bytes a call were written and read back). `None`: ask `pop`.
    #[inline(always)]
    pub fn pop_lone_call(&mut self) -> Option<Call> {
        let Some(mut c) = self.lone.pop_call() else {
            self.apply_held_free();
            return None;
        };
        // The block a later call frees is anywhere in the table: its memory is asked for
        // now, to be in cache by then.
        let ahead = self.lone.calls.get(self.lone.next + PREFETCH_AHEAD);
        if let Some(old) = ahead.and_then(|c| c.releases()) {
            self.live.prefetch(old);
        }
        // The call after a held free is the one that was seen to allocate its address
        // (anything else in between took the free out).
        if let Some(addr) = self.free_held.take() {
            debug_assert!(allocates_again(&c, addr));
            self.settle_tick(&mut c.tick);
            self.ended = [None; 2];
            self.live.take_again(addr, LiveBlock::of(&c));
            return Some(c);
        }
        if self.holds_free(&mut c) {
            return Some(c);
        }
        // A lone thread's call: no other thread's realloc can have given its block back.
        self.settle_call(&mut c, 0);
        Some(c)
    }

    /// Pops free `c` with its block left in the table (`free_held`) when the lone run's
    /// next call allocates the same address again; whether it did.
    #[inline(always)]
    fn holds_free(&mut self, c: &mut Call) -> bool {
        if c.func != Func::Free || c.addr == 0 || !self.starting.is_empty() {
            return false;
        }
        let next = self.lone.next;
        let other_first = self.lone.others.front().is_some_and(|&(at, ..)| at == next);
        let again = !other_first
            && (self.lone.calls.get(next)).is_some_and(|n| allocates_again(&n, c.addr));
        let Some(b) = again.then(|| self.live.get_unshared(c.addr)).flatten() else {
            return false;
        };
        self.settle_tick(&mut c.tick);
        self.ended = [Some((c.addr, b)), None];
        self.free_held = Some(c.addr);
        #[cfg(test)]
        {
            self.frees_held += 1;
        }
        true
    }

    /// [`Merger::pop`] past the lone run's calls (`pop_lone_call` took any held free out).
    fn pop_rest(&mut self) -> Option<Merged> {
        if let Some(mut m) = self.lone.pop_other() {
            self.settle(&mut m, 0);
            return Some(m);
        }
        self.count_lone_pops();
        self.pop_queued()
    }

    /// Adds the lone run's pops to its thread's (whose joins count by them).
    fn count_lone_pops(&mut self) {
        if self.lone.popped == 0 {
            return;
        }
        let t = &mut self.threads[self.lone.thread];
        t.popped += std::mem::take(&mut self.lone.popped);
        while t.joins.front().is_some_and(|&(pos, _)| pos < t.popped) {
            t.joins.pop_front();
        }
    }

    /// [`Merger::pop`] from the threads' queues.
    fn pop_queued(&mut self) -> Option<Merged> {
        // One thread alone has nobody to wait for: its program order is the order, and
        // the causal check (a table lookup per call) is skipped.
        let alone = self.threads.len() == 1;
        #[cfg(test)]
        let chosen = if self.scan_every_call {
            self.choose_by_scanning_every_thread(alone)
        } else {
            self.choose(alone)
        };
        #[cfg(not(test))]
        let chosen = self.choose(alone);
        let (i, on_top) = chosen?;
        let t = &mut self.threads[i];
        let (mut m, place) = t.queue.pop_front()?;
        // As in `pop_lone_call`: the block of the thread's free a few calls ahead, looked
        // up when that call is a head (whether it must wait) and when it is taken.
        if let Some((Merged::Call(ahead), _)) = t.queue.get(PREFETCH_AHEAD) {
            if let Some(old) = ahead.releases() {
                self.live.prefetch(old);
            }
        }
        t.popped += 1;
        while t.joins.front().is_some_and(|&(pos, _)| pos < t.popped) {
            t.joins.pop_front();
        }
        self.in_memory -= 1;
        while t.queue.is_empty() && t.spill.items() > 0 {
            // Counted as `enqueue` counts: the shrink below subtracts what refill grew.
            let room = t.queue.capacity();
            let read = t.spill.refill(&mut self.spill_file, t.tid, &mut t.queue);
            self.queue_capacity += t.queue.capacity() - room;
            if let Err((lost, why)) = read {
                self.stats.lost_events = self.stats.lost_events.saturating_add(lost);
                self.stats.spill_lost = self.stats.spill_lost.saturating_add(lost);
                self.spill_file.fail(format!(
                    "{lost} calls that waited on disk could not be read back: {why}"
                ));
            }
            self.in_memory += t.queue.len();
        }
        // Queues that once held a burst give their memory back when the threads' queues
        // together hold far more room than the budget.
        if t.queue.is_empty() && self.queue_capacity > self.memory_budget.saturating_mul(2) {
            self.queue_capacity -= t.queue.capacity();
            t.queue.shrink_to(HEAD_ITEMS);
            self.queue_capacity += t.queue.capacity();
        }
        let next = head_of(t, i);
        if on_top {
            if let Some(mut top) = self.heads.peek_mut() {
                match next {
                    Some(head) => *top = Reverse(head),
                    None => {
                        PeekMut::pop(top);
                    }
                }
            }
        } else if let Some(head) = next {
            self.heads.push(Reverse(head));
        }
        self.settle(&mut m, place);
        Some(m)
    }

    /// Brings the live blocks up to date with `m`, the next item in merged order (at
    /// `place` in its tick), and keeps ticks from going back.
    #[inline]
    fn settle(&mut self, m: &mut Merged, place: u64) {
        match m {
            Merged::Call(c) => self.settle_call(c, place),
            Merged::Stats { tick, .. }
            | Merged::Forked { tick, .. }
            | Merged::Summary { tick, .. } => {
                self.settle_tick(tick);
                self.ended = [None; 2];
            }
        }
    }

    #[inline]
    fn settle_tick(&mut self, tick: &mut u64) {
        if *tick < self.last_tick {
            if self.last_tick - *tick > 1 {
                self.stats.late += 1;
            }
            *tick = self.last_tick;
        }
        self.last_tick = *tick;
    }

    #[inline(always)]
    fn settle_call(&mut self, c: &mut Call, place: u64) {
        let when = (c.tick, place);
        self.settle_tick(&mut c.tick);
        self.ended = [None; 2];
        if let Some(old) = c.releases() {
            if !self.starting.is_empty() {
                self.starting.remove(&old);
            }
            match self.live.remove(&old) {
                Some(b) => self.ended[0] = Some((old, b)),
                // Only a forced call (or a lone thread's) can miss: the block was
                // allocated before tracing began, or its allocation was lost.
                None => self.stats.unknown_frees += 1,
            }
        }
        if let Some(a) = c.allocates() {
            if let Some(displaced) = self.live.insert(a, LiveBlock::of(c)) {
                self.ended[1] = Some((a, displaced));
                if let Some(j) = self.realloc_releasing(a, c.tid, when) {
                    self.take_old_block(j);
                } else if displaced.inherited {
                    self.stats.inherited_stale += 1;
                } else if !self.starting.is_empty() && self.starting.remove(&a) {
                    self.stats.starting_stale += 1;
                } else {
                    self.stats.forced_allocs += 1;
                }
            }
        }
    }

    /// The realloc at the head of thread `j` gave back the block the call just popped
    /// took: it releases nothing when it is merged.
    #[cold]
    fn take_old_block(&mut self, j: usize) {
        if let Some((Merged::Call(r), _)) = self.threads[j].queue.front_mut() {
            r.old_taken = true;
            self.stats.taken_from_reallocs += 1;
        }
    }

    /// Thread ids seen, in order of first appearance.
    pub fn threads(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().map(|t| t.tid)
    }
}

/// [`Merger::stack`], from the merge's two tables of stacks.
fn stack_of<'a>(stacks: &'a [Vec<u64>], inherited: &'a InheritedStackTable, id: u32) -> &'a [u64] {
    let found = if is_inherited_stack(id) {
        inherited.get((id & !INHERITED_STACK) as usize)
    } else {
        stacks.get(id as usize).map(Vec::as_slice)
    };
    found.unwrap_or(&[])
}

/// See [`Merger::compute_watermark`].
struct Watermark {
    /// The active thread that has sent the least (usize::MAX: none).
    lowest_thread: usize,
    /// Every other thread's calls before this (tick, place) are safe.
    below_lowest: (u64, u64),
    /// The lowest thread's own calls before this are safe (its own next buffer comes
    /// after its calls anyway).
    below_second: (u64, u64),
    /// Calls of ticks before this one have waited the whole window: they go.
    floor: u64,
}

impl Watermark {
    fn allows(&self, thread: usize, when: (u64, u64)) -> bool {
        let below = if thread == self.lowest_thread {
            self.below_second
        } else {
            self.below_lowest
        };
        when < below || when.0 < self.floor
    }
}

/// Thread `index`'s next call, if it has one queued.
fn head_of(t: &ThreadQueue, index: usize) -> Option<Head> {
    t.queue
        .front()
        .map(|(m, place)| ((merged_tick(m), *place), index))
}

fn merged_tick(m: &Merged) -> u64 {
    m.tick()
}

/// Reads every chunk of an in-memory trace and decodes every event record, merging each
/// process's threads: the whole reading path, for fuzzing. Never panics; returns the
/// number of calls merged.
pub fn read_all_from_bytes(data: &[u8]) -> u64 {
    let Ok(mut r) = TraceReader::<&[u8]>::from_reader(data, data.len() as u64) else {
        return 0;
    };
    let mut mergers: HashMap<u32, Merger> = Default::default();
    let mut calls = 0;
    while let Some(chunk) = r.next_chunk() {
        if let Chunk::Events(h, records) = chunk {
            let m = mergers.entry(h.stream).or_default();
            let _ = m.push_chunk(&h, &records);
            while m.pop().is_some() {
                calls += 1;
            }
        }
    }
    for m in mergers.values_mut() {
        m.finish();
        while m.pop().is_some() {
            calls += 1;
        }
    }
    calls
}

/// The interposer's reports of its own mapped bytes, which only grow: those no earlier
/// report exceeds, by tick (both increasing). Threads' buffers come in any order, so a
/// report may come after a later, larger one.
#[derive(Default, Debug)]
struct OwnMemory {
    reports: Vec<(u64, u64)>,
}

impl OwnMemory {
    fn said(&mut self, tick: u64, bytes: u64) {
        let i = self.reports.partition_point(|&(t, _)| t <= tick);
        if i > 0 && self.reports[i - 1].1 >= bytes {
            return;
        }
        let later_smaller = self.reports[i..].iter().take_while(|&&(_, b)| b <= bytes);
        let end = i + later_smaller.count();
        self.reports.splice(i..end, [(tick, bytes)]);
    }

    fn at(&self, tick: u64) -> u64 {
        let i = self.reports.partition_point(|&(t, _)| t <= tick);
        i.checked_sub(1).map_or(0, |i| self.reports[i].1)
    }
}

#[cfg(test)]
mod tests;
