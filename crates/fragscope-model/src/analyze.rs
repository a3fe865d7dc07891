//! One pass over a trace: merge each process's threads, follow its live bytes, evaluate
//! the heap at each page-residency snapshot as the merged calls reach that moment, and
//! turn it all into a [`Report`]. Memory is bounded by the live blocks (held once, in the
//! merge) and the /proc samples, never by the number of calls.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;

use fragscope_trace::ahead::{AheadChunk, EventsOf, ReadAhead};
use fragscope_trace::event::StatsSource;
use fragscope_trace::hash::FastMap;
use fragscope_trace::merge::{Call, LiveTable, Merged, Merger};
use fragscope_trace::reader::Chunk;
use fragscope_trace::records::{
    EndHow, Mapping, Meta, Pagemap, ProcessEnd, PymallocPools, Rollup, RssSample, SnapshotReason,
    StackMode, WaitStatus,
};
use fragscope_trace::Func;
use fragscope_trace::TraceError;

use crate::forks::{self, ForkLink, Forked, Inherited};
use crate::heap::{self, ClassAtSnapshot, HeapHistory, HeapParts, SiteAtSnapshot, SiteWeighting};
use crate::heap_pages::{Evaluation, HeapPages};
use crate::heaps::{self, Heap};
use crate::linked_allocator;
use crate::lisp_sites::{self, LispLog};
use crate::phases;
use crate::pymalloc::{self, PymallocParts};
use crate::python_sites::{self, PoolIndex, PythonLog};
use crate::report::*;
use crate::sbcl::{self, SbclParts};
use crate::sharing::{self, Owners, PartSharing, RollupSharing, Sharing};
use crate::symbols::{Frame, Symbolizer};
use fragscope_trace::sbcl_heap::SbclHeap;

#[derive(Debug, Clone)]
pub struct Options {
    /// Analyse this pid (the last image of it, after exec) instead of the largest process.
    pub pid: Option<u32>,
    /// Pages under this live occupancy (percent) count as pinned by their objects.
    pub sparse_pct: u32,
    /// Rows per site table.
    pub top: usize,
    /// Also list every allocation site with its stack (`Report::all_sites`), for flame
    /// graphs and exports.
    pub all_sites: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pid: None,
            sparse_pct: 10,
            top: 10,
            all_sites: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("no process with pid {0} in this trace (see `fragscope info`)")]
    NoSuchPid(u32),
    #[error("the trace holds no process (it was cut before the program started)")]
    Empty,
    #[error("no process of this trace could be traced: {0}")]
    NothingTraced(String),
}

/// Sites kept per snapshot (by live bytes and by pinned waste each).
const SITES_PER_SNAPSHOT: usize = 64;
/// Classes kept per snapshot for the history (by usable plus retained bytes).
const CLASSES_PER_SNAPSHOT: usize = 64;
/// Points of the timeline in the report.
const TIMELINE_POINTS: usize = 600;
/// Allocator statistics further than this from a snapshot describe another moment.
const STATS_MAX_DISTANCE_TICKS: u64 = 250;

/// (tick, source, name-value pairs, fragscope's live + rounding at that point of the
/// merged calls) of one answer of the allocator's own statistics.
type AllocatorStats = (u64, StatsSource, Vec<(String, u64)>, u64);

struct Evaluated {
    tick: u64,
    reason: SnapshotReason,
    page_size: u64,
    heap: HeapParts,
    classes: Vec<ClassAtSnapshot>,
    sites: Vec<SiteAtSnapshot>,
    own_memory: u64,
    pymalloc: Option<PymallocParts>,
    sbcl: Option<SbclParts>,
    /// Pages by owner, when the residency says which are shared (its rollup is joined
    /// when the snapshot is reported).
    sharing: Option<Sharing>,
}

#[derive(Default)]
struct Stream {
    stream: u32,
    pid: u32,
    ppid: u32,
    argv: Vec<String>,
    /// Running before `record -p` attached: its earlier blocks were never seen allocated.
    attached: bool,
    /// Its parent and fork, and the heaps at its own forks.
    fork: ForkLink,
    /// The heap it started from, its parent's at the fork.
    inherited: Option<Inherited>,
    /// The blocks it held then, as read from its heap (blocks, usable bytes).
    starting_heap: Option<(u64, u64)>,
    merger: Merger,
    pending: VecDeque<Pagemap>,
    /// Its residency as it started, when it was forked (`Chunk::ForkResidency`).
    fork_residency: Option<Pagemap>,
    /// Each snapshot's heap mappings by owner, as its residency arrives, for the list of
    /// processes (which does not wait for the snapshots' evaluation).
    anonymous_sharing: Vec<(u64, SnapshotReason, Owners)>,
    /// pymalloc censuses waiting for the snapshot of their tick (written just before it).
    pymalloc_pending: VecDeque<(u64, PymallocPools)>,
    /// Why the process has no pymalloc census, when it is CPython.
    pymalloc_note: Option<String>,
    /// CPython's sampled objects, and where the pools of the census with the most
    /// pymalloc waste so far were (the one the report explains).
    python: PythonLog,
    python_census: Option<PoolIndex>,
    /// A forked process: the pools of the census with the most arena pages copied since
    /// the fork (the one its copies are explained at).
    python_copies: Option<PoolIndex>,
    /// SBCL's sampled allocation regions.
    lisp: LispLog,
    /// SBCL censuses waiting for the snapshot of their tick (written just before it).
    sbcl_pending: VecDeque<(u64, SbclHeap)>,
    /// Why the process has no SBCL census, when it runs SBCL.
    sbcl_note: Option<String>,
    evaluated: Vec<Evaluated>,
    /// Snapshots whose evaluation waits until the report knows which process it explains,
    /// each with the live blocks of its moment (see `evaluate_next`).
    deferred: VecDeque<(Moment, LiveTable)>,
    /// Blocks the tables in `deferred` hold apart from those they share.
    deferred_cost: usize,
    /// Another pid was asked for: the report only lists this process, so its snapshots
    /// are not evaluated against its live blocks (a forked worker's are its parent's
    /// whole heap); the list's figures come from `anonymous_sharing`.
    listed_only: bool,
    history: HeapHistory,
    /// Its live blocks by page, followed call by call while that pays (see
    /// `follows_by_page`): what its snapshots are then evaluated from.
    heap_pages: Option<HeapPages>,
    /// `calls` at the last snapshot evaluated from its live blocks.
    calls_at_snapshot: u64,
    rss: Vec<RssSample>,
    /// smaps_rollup by tick: LazyFree, and the figures of sharing.
    rollups: Vec<(u64, u64, Option<RollupSharing>)>,
    live_bytes: u64,
    usable_bytes: u64,
    /// (10 ms bucket, live, usable) at the end of each bucket with calls.
    live_timeline: Vec<(u64, u64, u64)>,
    peak_live: (u64, u64),
    calls: u64,
    /// Blocks allocated (every call that returned one).
    allocations: u64,
    site_allocs: StackSums,
    /// Each thread's last allocated address, while the thread allocates nothing else: a
    /// free of it by the same thread makes the block a temporary allocation.
    last_alloc: LastAllocs,
    /// Temporary allocations (count, bytes), exact, and by stack (weighted).
    temporaries: (u64, u64),
    site_temporaries: StackSums,
    /// The allocator's own statistics, as answered (about once per snapshot).
    stats: Vec<AllocatorStats>,
    code_maps: Vec<Mapping>,
    end: Option<ProcessEnd>,
    wait: Option<WaitStatus>,
    allocator: Option<&'static str>,
    /// The heap census of a snapshot, which stands for the calls it has not.
    census: Option<fragscope_trace::heap_census::HeapCensus>,
    /// An allocator linked into its program, whose calls the trace does not hold.
    linked_allocator: Option<fragscope_trace::heap_census::LinkedAllocator>,
}

/// Weighted allocations and bytes per stack, indexed by the merge's stack ids (dense, from
/// 1): one add per allocation, with no hashing on the way.
#[derive(Default)]
struct StackSums(Vec<(f64, f64)>);

impl StackSums {
    fn add(&mut self, stack: u32, weight: f64, size: u64) {
        let i = stack as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, (0.0, 0.0));
        }
        self.0[i].0 += weight;
        self.0[i].1 += weight * size as f64;
    }

    fn get(&self, stack: &u32) -> Option<(f64, f64)> {
        self.0.get(*stack as usize).copied().filter(|e| e.0 > 0.0)
    }

    /// The stacks with a sum.
    fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.0.len() as u32).filter(|&i| self.0[i as usize].0 > 0.0)
    }
}

/// Each thread's last allocated address (see `Stream::last_alloc`). The entry of the
/// thread of the last call is held out of the map: runs of calls are mostly one thread's,
/// and a lookup and an insert per call cost more than the model's other work per call.
#[derive(Default)]
struct LastAllocs {
    current: Option<(u32, Option<u64>)>,
    others: FastMap<u32, u64>,
}

impl LastAllocs {
    /// Thread `tid`'s entry.
    #[inline]
    fn of(&mut self, tid: u32) -> &mut Option<u64> {
        if self.current.is_none_or(|(t, _)| t != tid) {
            if let Some((t, Some(addr))) = self.current {
                self.others.insert(t, addr);
            }
            self.current = Some((tid, self.others.remove(&tid)));
        }
        let (_, entry) = self.current.get_or_insert((tid, None));
        entry
    }
}

struct Ctx {
    weighting: SiteWeighting,
    sparse_pct: u32,
    /// How snapshots are evaluated from the live blocks (see [`Evaluation::asked`]).
    evaluation: Evaluation,
}

impl Stream {
    /// The malloc heap is unknown: the only view of it, a snapshot's census, could not
    /// read the allocator.
    fn heap_unread(&self) -> bool {
        self.census.as_ref().is_some_and(|c| c.result.is_err())
    }

    /// Takes every call the merge can order now; evaluates snapshots as their moment passes.
    fn drain(&mut self, ctx: &Ctx) {
        loop {
            if let Some(c) = self.merger.pop_lone_call() {
                self.take_call(ctx, c);
                continue;
            }
            match self.merger.pop() {
                None => return,
                Some(Merged::Call(c)) => self.take_call(ctx, c),
                Some(Merged::Stats {
                    tick,
                    source,
                    values,
                }) => {
                    if !values.is_empty() {
                        self.allocator = Some(source.name());
                        self.stats.push((tick, source, values, self.usable_bytes));
                    }
                }
                Some(Merged::Forked { tick, mark }) => {
                    self.fork.forked(&mut self.merger, mark, tick);
                }
            }
        }
    }

    /// Its merge started from the heap it inherited: its blocks are live data, and their
    /// frees are known.
    fn start_from(&mut self, ctx: &Ctx, inherited: Inherited) {
        let tick = inherited.tick;
        self.heap_pages = None; // its blocks changed without a call
        self.inherited = Some(inherited);
        self.live_bytes += inherited.bytes;
        self.usable_bytes += inherited.usable_bytes;
        if self.live_bytes > self.peak_live.0 {
            self.peak_live = (self.live_bytes, tick);
        }
        self.live_timeline
            .push((tick / 10, self.live_bytes, self.usable_bytes));
        self.drain(ctx);
    }

    /// Adds call `c`, the last the merge popped, to the figures.
    #[inline(always)]
    fn take_call(&mut self, ctx: &Ctx, c: Call) {
        if self.pending.front().is_some_and(|p| c.tick > p.tick) {
            self.evaluate_passed(ctx, c);
        }
        if let Some(pages) = &mut self.heap_pages {
            pages.follow(&self.merger, &c);
        }
        self.calls += 1;
        let last_alloc = self.last_alloc.of(c.tid);
        let temporary = c.func == Func::Free && c.addr != 0 && *last_alloc == Some(c.addr);
        // As heaptrack counts them: frees of other blocks in between do not matter.
        if let Some(a) = c.allocates() {
            *last_alloc = Some(a);
        } else if temporary {
            *last_alloc = None;
        }
        for (_, b) in self.merger.ended_by_last_pop() {
            self.live_bytes -= b.size;
            self.usable_bytes -= b.usable();
            if temporary {
                self.temporaries.0 += 1;
                self.temporaries.1 += b.size;
                if b.stack != 0 {
                    let w = ctx.weighting.weight(b.size);
                    self.site_temporaries.add(b.stack, w, b.size);
                }
            }
        }
        if c.allocates().is_some() {
            self.allocations += 1;
            let usable = c.usable.max(c.size);
            self.live_bytes += c.size;
            self.usable_bytes += usable;
            if c.stack != 0 {
                let w = ctx.weighting.weight(c.size);
                self.site_allocs.add(c.stack, w, c.size);
            }
            if self.live_bytes > self.peak_live.0 {
                self.peak_live = (self.live_bytes, c.tick);
            }
        }
        let bucket = c.tick / 10;
        match self.live_timeline.last_mut() {
            Some(last) if last.0 == bucket => {
                last.1 = self.live_bytes;
                last.2 = self.usable_bytes;
            }
            _ => self
                .live_timeline
                .push((bucket, self.live_bytes, self.usable_bytes)),
        }
    }

    /// The pymalloc census taken with snapshot `pm`, split by its residency; its pages
    /// that the heap's own evaluation counted as empty heap pages are left out of `parts`.
    fn pymalloc_at(
        &mut self,
        pm: &Pagemap,
        parts: &mut HeapParts,
    ) -> Option<(PymallocParts, Owners)> {
        let pools = census_at(&mut self.pymalloc_pending, pm.tick)?;
        let pymalloc::Split {
            parts: split,
            by_range,
            arenas,
        } = pymalloc::split(&pools, pm, self.fork_residency.as_ref());
        // As the report picks its pymalloc snapshot: the most waste, the latest of equals.
        if self
            .python_census
            .as_ref()
            .is_none_or(|c| split.waste() >= c.waste)
        {
            let index = PoolIndex::new(pm.tick, split.waste(), &pools, arenas.clone());
            self.python_census = Some(index);
        }
        let copied: u64 = arenas.values().map(|a| a.copied).sum();
        if copied > 0
            && self
                .python_copies
                .as_ref()
                .is_none_or(|c| copied >= c.copied)
        {
            self.python_copies = Some(PoolIndex::new(pm.tick, split.waste(), &pools, arenas));
        }
        // Its pages in mappings the malloc heap holds too, which the heap counted as its
        // own empty pages.
        let (mut owners, mut in_heap) = (Owners::default(), Owners::default());
        for (start, o) in &by_range {
            owners.merge(o);
            if self.history.held(*start) {
                in_heap.merge(o);
            }
        }
        parts.leave_out_empty_pages(in_heap.resident, &in_heap, u64::from(pm.page_size));
        Some((split, owners))
    }

    /// The SBCL census taken with snapshot `pm`, split by its residency.
    fn sbcl_at(&mut self, pm: &Pagemap) -> Option<(SbclParts, Owners)> {
        let heap = census_at(&mut self.sbcl_pending, pm.tick)?;
        let space = (
            heap.dynamic_space_start,
            heap.dynamic_space_start + heap.dynamic_space_size,
        );
        let owners = sharing::owners_in(pm, self.fork_residency.as_ref(), [space]);
        Some((sbcl::split(&heap, pm), owners))
    }

    /// The snapshot's pages by owner, when its residency says which are shared; the
    /// malloc heap's parts when the calls placed them (`heap`), else only its total.
    fn sharing_at(
        &self,
        pm: &Pagemap,
        heap: Option<&HeapParts>,
        pymalloc: Option<&Owners>,
        sbcl: Option<&Owners>,
    ) -> Option<Sharing> {
        if !sharing::known(pm) {
            return None;
        }
        let fork = self.fork_residency.as_ref();
        let part = |name: &str, owners: Owners| PartSharing {
            part: name.into(),
            owners,
        };
        let mut parts = Vec::new();
        if let Some(h) = heap {
            let o = &h.owners;
            parts.push(part("live", o.live));
            parts.push(part("rounding", o.rounding));
            parts.push(part("allocator_overhead", o.allocator_overhead));
            parts.push(part("free_in_used_pages", o.free_in_used_pages));
            parts.push(part("free_resident_pages", o.free_resident_pages));
        }
        if let Some(o) = pymalloc {
            parts.push(part("pymalloc_arenas", *o));
        }
        if let Some(o) = sbcl {
            parts.push(part("sbcl_dynamic_space", *o));
        }
        // Computed as the residency arrived (for the list of processes).
        let anonymous = (self.anonymous_sharing.iter().rev())
            .find(|a| a.0 == pm.tick)
            .map_or_else(|| sharing::owners_of(pm, fork), |a| a.2);
        let mut other = anonymous;
        for p in &parts {
            other.subtract(&p.owners);
        }
        parts.push(part("other_anon", other));
        Some(Sharing {
            forked: fork.is_some(),
            inherited: fork.map(sharing::resident_bytes),
            anonymous,
            parts,
            rollup: None,
        })
    }

    /// Evaluates the snapshots whose moment call `c` passed. Out of line, and `c` by
    /// value: a reference to it kept every call in memory (23 instructions a call).
    #[cold]
    #[inline(never)]
    fn evaluate_passed(&mut self, ctx: &Ctx, c: Call) {
        while self.pending.front().is_some_and(|p| c.tick > p.tick) {
            self.evaluate_next(ctx, Some(&c));
        }
    }

    /// Evaluates the next pending snapshot; `past` is the call popped just after its
    /// moment (whose effect the snapshot must not see), `None` once every call is in.
    fn evaluate_next(&mut self, ctx: &Ctx, past: Option<&Call>) {
        let Some(pm) = self.pending.pop_front() else {
            return;
        };
        let census = self
            .census
            .as_ref()
            .map(|c| crate::census::heap_parts(c, &pm));
        if let Some((mut parts, classes)) = census {
            self.evaluate_deferred(ctx);
            let (pymalloc, pymalloc_owners) = self.pymalloc_at(&pm, &mut parts).unzip();
            let (sbcl, sbcl_owners) = self.sbcl_at(&pm).unzip();
            let sharing =
                self.sharing_at(&pm, None, pymalloc_owners.as_ref(), sbcl_owners.as_ref());
            let live = parts.live;
            self.evaluated.push(Evaluated {
                tick: pm.tick,
                reason: pm.reason,
                page_size: u64::from(pm.page_size),
                heap: parts,
                classes,
                sites: Vec::new(),
                own_memory: 0,
                pymalloc,
                sbcl,
                sharing,
            });
            self.peak_live = self.peak_live.max((live, pm.tick));
            self.live_timeline.push((pm.tick / 10, live, live));
            return;
        }
        if self.listed_only {
            // Their runtimes' censuses of this moment go unread.
            census_at(&mut self.pymalloc_pending, pm.tick);
            census_at(&mut self.sbcl_pending, pm.tick);
            return;
        }
        let at = Moment {
            headers: heap::BlockHeaders::of_process(self.allocator, &self.code_maps),
            fork_residency_read: self.fork_residency.is_some(),
            own_memory: self.merger.own_memory(),
            pm,
        };
        // A table that shares nearly all its blocks with other processes (a fork's) is
        // kept cheaply, and the snapshot evaluated only if the report explains this
        // process (every forked worker's snapshots hold its parent's whole heap). Those
        // kept share the blocks the process shares now: no other fork's are held for it.
        let live = self.merger.live_blocks();
        let cost = live.clone_cost();
        let same = self
            .deferred
            .back()
            .is_none_or(|(_, kept)| kept.shares_with(live));
        if same && cost * 8 <= live.shared_len() && self.deferred_cost + cost <= live.shared_len() {
            let live = match past {
                Some(c) => self.merger.with_live_before_last_pop(c, LiveTable::clone),
                None => self.merger.live_blocks().clone(),
            };
            self.deferred_cost += cost;
            self.deferred.push_back((at, live));
            return;
        }
        let live = live.len() as u64;
        self.evaluate_deferred(ctx);
        let by_page = match ctx.evaluation {
            Evaluation::Blocks => false,
            Evaluation::Pages => true,
            Evaluation::Chosen => follows_by_page(
                self.heap_pages.is_some(),
                self.calls - self.calls_at_snapshot,
                live,
            ),
        };
        self.calls_at_snapshot = self.calls;
        if !by_page {
            // Its calls are no longer followed by page.
            self.heap_pages = None;
        }
        let history = &mut self.history;
        let fork = self.fork_residency.as_ref();
        let pages = &mut self.heap_pages;
        let mut evaluate = |live: &LiveTable| {
            if by_page {
                at.evaluate_by_pages(pages, live, fork, history, ctx)
            } else {
                at.evaluate(live, fork, history, ctx)
            }
        };
        let snap = match past {
            Some(c) => self.merger.with_live_before_last_pop(c, evaluate),
            None => evaluate(self.merger.live_blocks()),
        };
        self.add_evaluated(at, snap);
    }

    /// Evaluates the snapshots kept for later (see `evaluate_next`), in order.
    fn evaluate_deferred(&mut self, ctx: &Ctx) {
        while let Some((at, live)) = self.deferred.pop_front() {
            let fork = self.fork_residency.as_ref();
            let snap = at.evaluate(&live, fork, &mut self.history, ctx);
            self.add_evaluated(at, snap);
        }
        self.deferred_cost = 0;
    }

    /// Joins the runtimes' censuses and the pages' sharing to the heap's evaluation at
    /// `at`, and keeps it.
    fn add_evaluated(&mut self, at: Moment, mut snap: heap::HeapSnapshot) {
        let pm = &at.pm;
        let (pymalloc, pymalloc_owners) = self.pymalloc_at(pm, &mut snap.parts).unzip();
        let (sbcl, sbcl_owners) = self.sbcl_at(pm).unzip();
        let sharing = self.sharing_at(
            pm,
            Some(&snap.parts),
            pymalloc_owners.as_ref(),
            sbcl_owners.as_ref(),
        );
        // Keep the sites that can make a top list.
        let mut keep: Vec<SiteAtSnapshot> = snap
            .sites
            .iter()
            .take(SITES_PER_SNAPSHOT)
            .cloned()
            .collect();
        snap.sites.sort_by(|a, b| {
            (b.pinned_waste.total_cmp(&a.pinned_waste)).then(a.stack.cmp(&b.stack))
        });
        for s in snap.sites.iter().take(SITES_PER_SNAPSHOT) {
            if !keep.iter().any(|k| k.stack == s.stack) {
                keep.push(s.clone());
            }
        }
        self.evaluated.push(Evaluated {
            tick: pm.tick,
            reason: pm.reason,
            page_size: u64::from(pm.page_size),
            heap: snap.parts,
            classes: snap.classes,
            sites: keep,
            own_memory: at.own_memory,
            pymalloc,
            sbcl,
            sharing,
        });
    }
}

/// A snapshot to evaluate, with what its evaluation reads of the process at its moment.
struct Moment {
    pm: Pagemap,
    headers: heap::BlockHeaders,
    /// The residency of the process as it started had been read.
    fork_residency_read: bool,
    own_memory: u64,
}

/// Whether a process's snapshots are to be evaluated from its live blocks by page,
/// followed call by call until the next snapshot ([`HeapPages`]), rather than from every
/// live block at the snapshot ([`heap::evaluate`]); `following`: they are now, `calls`:
/// the calls since its last snapshot (the next interval is guessed to hold as many),
/// `live`: its live blocks.
///
/// Following a call costs about 8 ns (15 with a million blocks: a page's groups are a
/// cache miss), visiting a block at a snapshot 40 to 120 ns, so following pays only
/// when there are fewer calls between two snapshots than about 7 times the live blocks.
/// Measured (bench/report_scaling.sh's held_churn, 20 M calls, snapshots every 100 ms):
/// with 32 Ki blocks (87 calls a block between snapshots) following was 15% slower, with
/// 128 Ki (7 calls a block) the same, with 384 Ki (1.3) 10% faster, with 1 Mi (0.33) 2.2
/// times faster. A process starts following below 4 calls a block and stops above 16:
/// between the two both ways cost about the same, and a switch to following costs a
/// table built from every live block.
fn follows_by_page(following: bool, calls: u64, live: u64) -> bool {
    let calls_per_block = if following { 16 } else { 4 };
    calls < calls_per_block * live
}

impl Moment {
    fn evaluate(
        &self,
        live: &LiveTable,
        fork_residency: Option<&Pagemap>,
        history: &mut HeapHistory,
        ctx: &Ctx,
    ) -> heap::HeapSnapshot {
        heap::evaluate(
            live,
            &self.pm,
            fork_residency.filter(|_| self.fork_residency_read),
            history,
            ctx.weighting,
            ctx.sparse_pct,
            self.headers,
        )
    }
}

impl Moment {
    /// [`Moment::evaluate`] from the blocks by page, `pages` (taken from `live`, the
    /// blocks at the moment, when there are none yet or they were kept for another page
    /// size or other headers).
    fn evaluate_by_pages(
        &self,
        pages: &mut Option<HeapPages>,
        live: &LiveTable,
        fork_residency: Option<&Pagemap>,
        history: &mut HeapHistory,
        ctx: &Ctx,
    ) -> heap::HeapSnapshot {
        let pages = match pages {
            Some(p) if p.fits(&self.pm, self.headers) => p,
            _ => pages.insert(HeapPages::new(live, self.pm.page_size, self.headers)),
        };
        pages.evaluate(
            &self.pm,
            fork_residency.filter(|_| self.fork_residency_read),
            history,
            ctx.weighting,
            ctx.sparse_pct,
        )
    }
}

impl Forked for Stream {
    fn link(&mut self) -> &mut ForkLink {
        &mut self.fork
    }
    fn merger(&mut self) -> &mut Merger {
        &mut self.merger
    }
}

/// The runtime census taken with the snapshot of `tick`, from censuses queued by tick;
/// those older than it never met their snapshot (a pagemap not read) and go.
fn census_at<T>(pending: &mut VecDeque<(u64, T)>, tick: u64) -> Option<T> {
    while pending.front().is_some_and(|(t, _)| *t < tick) {
        pending.pop_front();
    }
    if pending.front().is_some_and(|(t, _)| *t == tick) {
        pending.pop_front().map(|(_, census)| census)
    } else {
        None
    }
}

/// Reads and analyses a whole trace. `progress` is told the bytes read so far.
pub fn analyze(
    path: &Path,
    opts: &Options,
    mut progress: impl FnMut(u64, u64),
) -> Result<Report, AnalysisError> {
    let mut reader = ReadAhead::open(path, EventsOf::All)?;
    let mut meta: Option<Meta> = None;
    let mut streams: Vec<Stream> = Vec::new();
    let mut by_stream: HashMap<u32, usize> = HashMap::new();
    let mut ctx = Ctx {
        weighting: SiteWeighting::None,
        sparse_pct: opts.sparse_pct,
        evaluation: Evaluation::asked(),
    };
    let mut seen_end = false;
    let mut last_tick = 0u64;
    let mut chunks = 0u64;
    let mut damage: Option<String> = None;
    let mut untraced: Vec<fragscope_trace::Untraced> = Vec::new();
    let index = |streams: &mut Vec<Stream>, by: &mut HashMap<u32, usize>, s: u32| -> usize {
        *by.entry(s).or_insert_with(|| {
            streams.push(Stream {
                stream: s,
                fork: ForkLink::new(s),
                ..Default::default()
            });
            streams.len() - 1
        })
    };
    while let Some(chunk) = reader.next_chunk() {
        chunks += 1;
        if chunks.is_multiple_of(64) {
            progress(reader.offset(), reader.file_bytes());
        }
        let chunk = match chunk {
            AheadChunk::Events(h, events) => {
                let i = index(&mut streams, &mut by_stream, h.stream);
                last_tick = last_tick.max(h.last_tick);
                let s = &mut streams[i];
                if let Err(e) = reader.push_events(&mut s.merger, &h, events) {
                    damage.get_or_insert(format!("thread {} of pid {}: {e}", h.tid, s.pid));
                }
                if !s.fork.awaiting_parent_heap {
                    s.drain(&ctx);
                    forks::hand_over(&mut streams, i, &mut |s, inh| s.start_from(&ctx, inh));
                }
                continue;
            }
            AheadChunk::Other(chunk) => chunk,
        };
        match chunk {
            Chunk::Meta(m) => {
                ctx.weighting = match m.stacks {
                    StackMode::All => SiteWeighting::Every,
                    StackMode::Sampled => SiteWeighting::Sampled {
                        mean_bytes: m.sample_bytes.max(1) as f64,
                    },
                    StackMode::None => SiteWeighting::None,
                };
                meta = Some(m);
            }
            Chunk::Process(p) => {
                let i = index(&mut streams, &mut by_stream, p.stream);
                let s = &mut streams[i];
                s.fork.read(&p);
                s.pid = p.pid;
                s.ppid = p.ppid;
                s.argv = p.argv;
                s.attached = p.origin == fragscope_trace::Origin::Attached;
                if s.attached {
                    s.merger.set_attached();
                }
                s.listed_only = opts.pid.is_some_and(|pid| pid != s.pid);
                let parent = (s.fork.parent_stream).and_then(|p| by_stream.get(&p).copied());
                forks::child_came(&mut streams, i, parent, &mut |s, inh| {
                    s.start_from(&ctx, inh)
                });
            }
            // Handed on as `AheadChunk::Events`.
            Chunk::Events(..) => {}
            Chunk::Maps(m) => {
                let i = index(&mut streams, &mut by_stream, m.stream);
                let s = &mut streams[i];
                for mapping in m.mappings {
                    if mapping.perms.contains('x')
                        && !mapping.path.is_empty()
                        && !s.code_maps.contains(&mapping)
                    {
                        s.code_maps.push(mapping);
                    }
                }
            }
            Chunk::Rss(b) => {
                let i = index(&mut streams, &mut by_stream, b.stream);
                for smp in &b.samples {
                    last_tick = last_tick.max(smp.tick);
                }
                streams[i].rss.extend(b.samples);
            }
            Chunk::Rollup(r) => {
                let i = index(&mut streams, &mut by_stream, r.stream);
                streams[i]
                    .rollups
                    .push((r.tick, lazy_free_bytes(&r), RollupSharing::of(&r)));
            }
            Chunk::Pagemap(p) => {
                let i = index(&mut streams, &mut by_stream, p.stream);
                let s = &mut streams[i];
                if sharing::known(&p) {
                    let owners = sharing::owners_of(&p, s.fork_residency.as_ref());
                    s.anonymous_sharing.push((p.tick, p.reason, owners));
                }
                // Snapshots are evaluated when the merged calls reach their tick.
                s.pending.push_back(p);
            }
            Chunk::ForkResidency(p) => {
                let i = index(&mut streams, &mut by_stream, p.stream);
                streams[i].fork_residency = Some(p);
            }
            Chunk::ProcessEnd(e) => {
                let i = index(&mut streams, &mut by_stream, e.stream);
                last_tick = last_tick.max(e.tick);
                streams[i].end = Some(e);
            }
            Chunk::WaitStatus(w) => {
                if let Some(s) = streams.iter_mut().rev().find(|s| s.pid == w.pid) {
                    s.wait = Some(w);
                }
            }
            Chunk::Untraced(u) => {
                last_tick = last_tick.max(u.tick);
                untraced.push(u);
            }
            Chunk::End(e) => {
                seen_end = true;
                last_tick = last_tick.max(e.tick);
            }
            // Read by the GHC model (`ghc.rs`).
            Chunk::GhcCensus(_) => {}
            Chunk::PymallocCensus(c) => {
                let i = index(&mut streams, &mut by_stream, c.stream);
                let s = &mut streams[i];
                match c.result {
                    Ok(pools) => s.pymalloc_pending.push_back((c.tick, pools)),
                    Err(note) => {
                        s.pymalloc_note.get_or_insert(note);
                    }
                }
            }
            Chunk::HeapCensus(c) => {
                let i = index(&mut streams, &mut by_stream, c.stream);
                streams[i].census = Some(c);
            }
            Chunk::LinkedAllocator(l) => {
                let i = index(&mut streams, &mut by_stream, l.stream);
                streams[i].linked_allocator = Some(l);
            }
            Chunk::StartingHeap(h) => {
                let i = index(&mut streams, &mut by_stream, h.stream);
                let s = &mut streams[i];
                let bytes = s.merger.seed_starting_heap(h.tick, &h.blocks);
                s.heap_pages = None; // its blocks changed without a call
                s.live_bytes += bytes;
                s.usable_bytes += bytes;
                s.starting_heap = Some((h.blocks.len() as u64, h.blocks.iter().map(|b| b.1).sum()));
            }
            Chunk::SbclCensus(c) => {
                let i = index(&mut streams, &mut by_stream, c.stream);
                let s = &mut streams[i];
                match c.result {
                    Ok(heap) => s.sbcl_pending.push_back((c.tick, heap)),
                    Err(note) => {
                        s.sbcl_note.get_or_insert(note);
                    }
                }
            }
            Chunk::PythonSamples(c) => {
                let i = index(&mut streams, &mut by_stream, c.stream);
                streams[i].python.add(&c);
            }
            Chunk::LispSamples(c) => {
                let i = index(&mut streams, &mut by_stream, c.stream);
                streams[i].lisp.add(&c);
            }
        }
    }
    progress(reader.offset(), reader.file_bytes());
    if let Some(d) = reader.damage() {
        damage = Some(format!("at byte {}: {}", d.offset, d.reason));
    }
    // Parents before their children, which their last calls may seed.
    for i in 0..streams.len() {
        let s = &mut streams[i];
        // Not seeded by its parent, which comes before it: it goes on without.
        s.fork.awaiting_parent_heap = false;
        s.merger.finish();
        s.drain(&ctx);
        forks::parent_ended(&mut streams, i, &mut |s, inh| s.start_from(&ctx, inh));
        let s = &mut streams[i];
        while !s.pending.is_empty() {
            s.evaluate_next(&ctx, None);
        }
        s.rss.sort_by_key(|r| r.tick);
        s.rollups.sort_by_key(|r| r.0);
    }
    if streams.is_empty() {
        if !untraced.is_empty() {
            let each: Vec<String> = untraced
                .iter()
                .map(|u| format!("{}: {}", u.label(), u.reason))
                .collect();
            return Err(AnalysisError::NothingTraced(each.join("; ")));
        }
        return Err(AnalysisError::Empty);
    }
    let tick_ms = meta.as_ref().map_or(1.0, |m| m.tick_ns as f64 / 1e6);
    let chosen = match opts.pid {
        Some(pid) => streams
            .iter()
            .rposition(|s| s.pid == pid)
            .ok_or(AnalysisError::NoSuchPid(pid))?,
        // The largest heap: a command run through wrappers (sh -c, make, pyenv shims)
        // records them too, and they are not what the user asks about.
        None => (0..streams.len())
            .max_by_key(|&i| {
                let s = &streams[i];
                (
                    s.calls > 0,
                    s.peak_live.0,
                    s.rss.iter().map(|r| r.vm_rss_kib).max().unwrap_or(0),
                )
            })
            .unwrap_or(0),
    };
    // Its snapshots that waited for this choice; the others' are not needed.
    streams[chosen].evaluate_deferred(&ctx);
    let processes = streams
        .iter()
        .map(|x| brief(x, &streams, tick_ms))
        .collect();
    let stacks = match ctx.weighting {
        SiteWeighting::Every => "every",
        SiteWeighting::Sampled { .. } => "sampled",
        SiteWeighting::None => "none",
    };
    let s = &streams[chosen];
    let python = python_log(&streams, chosen);
    let (timeline_full, timeline) = timeline(s, tick_ms);
    let mut snapshots: Vec<Snapshot> = s
        .evaluated
        .iter()
        .map(|e| snapshot(s, e, tick_ms))
        .collect();
    mark_missing_censuses(&mut snapshots);
    let peak_snapshot = (0..snapshots.len()).max_by_key(|&i| snapshots[i].parts.rss);
    let end_snapshot = snapshots.len().checked_sub(1);
    let focus_snapshot = focus_of(&snapshots, s.peak_live.0);
    let phases = phases_of(&timeline_full, &snapshots);
    let (size_classes, size_class_history) = size_classes(s, focus_snapshot, tick_ms);
    // What is live at the end: leaked, if the process ended (by site, weighted). Blocks
    // inherited at the fork and kept are the parent's data, not leaks of this process.
    let mut site_leaks: HashMap<u32, (f64, f64)> = HashMap::new();
    let (mut inherited_live_blocks, mut inherited_live_bytes) = (0u64, 0u64);
    for b in s.merger.live_blocks().values() {
        if b.inherited {
            inherited_live_blocks += 1;
            inherited_live_bytes += b.size;
        } else if b.stack != 0 {
            let w = ctx.weighting.weight(b.size);
            let l = site_leaks.entry(b.stack).or_default();
            l.0 += w;
            l.1 += w * b.size as f64;
        }
    }
    let leaks = LeakFacts {
        // Blocks live when a detach ended the recording are the running program's, not leaks.
        at_exit: s
            .end
            .as_ref()
            .is_some_and(|e| !matches!(e.how, EndHow::Vanished | EndHow::Detached)),
        leaked_bytes: s.live_bytes.saturating_sub(inherited_live_bytes),
        leaked_blocks: s.merger.live_blocks().len() as u64 - inherited_live_blocks,
        inherited_live_blocks,
        inherited_live_bytes,
        temporary_allocations: s.temporaries.0,
        temporary_bytes: s.temporaries.1,
        allocations: s.allocations,
    };
    let (sites, all_sites) = sites(s, &site_leaks, focus_snapshot, opts, stacks, tick_ms);
    let peak_rss = timeline_full.iter().max_by_key(|p| p.1).map(|p| (p.0, p.1));
    let mut headline = headline(
        peak_rss,
        (!s.heap_unread()).then_some((s.peak_live.0, s.peak_live.1 as f64 * tick_ms)),
        focus_snapshot.map(|i| &snapshots[i]),
    );
    if focus_snapshot.is_none() && !snapshots.is_empty() {
        headline.sentence = format!(
            "No page-residency snapshot came while live data was held ({} taken): only \
             RSS and live bytes describe the rest (record for longer, or with a smaller \
             --snapshot-ms).",
            if snapshots.len() == 1 {
                "one was".to_string()
            } else {
                format!("{} were", snapshots.len())
            }
        );
    }
    let python_sites = (!python.is_empty())
        .then(|| python_sites::sites(&python, s.python_census.as_ref(), s.python_copies.as_ref()));
    let pymalloc_snapshot = (0..snapshots.len())
        .filter(|&i| snapshots[i].pymalloc.is_some())
        .max_by_key(|&i| snapshots[i].pymalloc.as_ref().map_or(0, |p| p.waste()));
    let python_sites_note = python_sites::unsampled_note(
        &python,
        pymalloc_snapshot.is_some() || s.pymalloc_note.is_some(),
        stacks,
    );
    // The heap with the most waste at the focus makes the sentence: a runtime's heap
    // (pymalloc's arenas, SBCL's dynamic space) has its own, when its waste is worth one.
    let focus = focus_snapshot.map(|i| &snapshots[i]);
    let most_wasteful = focus.and_then(heaps::most_wasteful).map(|h| h.heap);
    let walked = snapshots
        .iter()
        .rev()
        .find_map(|s| s.sbcl.as_ref().filter(|p| p.objects.is_some()));
    let runtime_sentence = match (most_wasteful, focus) {
        (Some(Heap::Pymalloc), Some(f)) => {
            f.pymalloc
                .as_ref()
                .and_then(pymalloc::headline)
                .map(|(dominant, sentence)| {
                    match python_sites
                        .as_ref()
                        .and_then(python_sites::headline_clause)
                    {
                        Some(clause) => (dominant, format!("{sentence} Here {clause}.")),
                        // Said where the line would be, so its absence is explained
                        // (unless the user turned stacks off).
                        None => match python_sites_note.as_ref().filter(|_| stacks != "none") {
                            Some(note) => (dominant, format!("{sentence} {note}")),
                            None => (dominant, sentence),
                        },
                    }
                })
        }
        (Some(Heap::Sbcl), Some(f)) => f.sbcl.as_ref().and_then(|p| sbcl::headline(p, walked)),
        _ => None,
    };
    if let Some((dominant, sentence)) = runtime_sentence {
        headline.dominant = Some(dominant.into());
        headline.sentence = sentence;
        headline.heap = most_wasteful;
    }
    // A CPython process whose malloc heap wastes more than pymalloc's arenas: the waste
    // is in objects over 512 bytes, which pymalloc hands to malloc.
    let cpython = pymalloc_snapshot.is_some() || !python.is_empty();
    let malloc_dominant = headline.heap == Some(Heap::Malloc)
        && headline.dominant.as_deref().is_some_and(|d| {
            matches!(
                d,
                "free_resident_pages" | "free_in_used_pages" | "lazy_free" | "rounding"
            )
        });
    if cpython && malloc_dominant {
        headline.sentence = format!(
            "{} In CPython this is malloc's heap, not pymalloc's arenas: objects over 512 \
             bytes (bytes, bytearray, long str, the tables of big lists, dicts and sets) \
             come from malloc, so its trim and its choice matter here (glibc's \
             malloc_trim(0) through ctypes returns free pages, MALLOC_ARENA_MAX=2 bounds a \
             threaded server's arenas, jemalloc or mimalloc by LD_PRELOAD keep fewer free \
             pages); reusing large buffers (a bytearray pool, memoryview slices) avoids the \
             churn.",
            headline.sentence
        );
    }
    // The census with the most waste; one that walked the objects (and can name them)
    // when it has nine tenths of that.
    let sbcl_waste = |i: usize| snapshots[i].sbcl.as_ref().map_or(0, |p| p.waste());
    let most = (0..snapshots.len())
        .filter(|&i| snapshots[i].sbcl.is_some())
        .max_by_key(|&i| sbcl_waste(i));
    let walked = (0..snapshots.len())
        .filter(|&i| {
            snapshots[i]
                .sbcl
                .as_ref()
                .is_some_and(|p| p.objects.is_some())
        })
        .max_by_key(|&i| sbcl_waste(i));
    let sbcl_snapshot = match (most, walked) {
        (Some(m), Some(w)) if sbcl_waste(w) * 10 >= sbcl_waste(m) * 9 => Some(w),
        _ => most,
    };
    // Garbage waiting for a full collection (the census that marked the most) says more
    // than free pages when it holds more than the malloc heap wastes.
    let heap_waste = focus_snapshot.map_or(0, |i| snapshots[i].parts.heap_waste());
    if let Some((dominant, sentence)) = snapshots
        .iter()
        .filter_map(|s| s.sbcl.as_ref())
        .filter(|p| p.garbage.unwrap_or(0) > heap_waste)
        .max_by_key(|p| p.garbage)
        .and_then(sbcl::garbage_headline)
    {
        headline.dominant = Some(dominant.into());
        headline.sentence = sentence;
        headline.heap = Some(Heap::Sbcl);
    }
    // What allocates is the lever on an SBCL program's collections, whatever holds its
    // memory.
    let lisp_sites = (!s.lisp.is_empty()).then(|| lisp_sites::sites(&s.lisp));
    let sbcl_version = snapshots
        .iter()
        .find_map(|x| x.sbcl.as_ref().map(|p| p.version.as_str()));
    let lisp_sites_note = lisp_sites::unsampled_note(&s.lisp, sbcl_version, stacks);
    if let Some(clause) = lisp_sites.as_ref().and_then(lisp_sites::headline_clause) {
        headline.sentence = format!("{} Here {clause}.", headline.sentence);
    }
    if let Some(c) = &s.census {
        crate::census::headline(&mut headline, c, focus_snapshot.map(|i| &snapshots[i]));
    } else if let Some(l) = &s.linked_allocator {
        // A snapshot's census note already names it.
        linked_allocator::headline(&mut headline, l, &snapshots);
    }
    // A forked worker that copied more of its parent's memory than its heaps waste.
    let heaps_waste = focus.map_or(0, heaps::waste);
    if let Some((dominant, mut sentence)) = sharing::headline(&snapshots, heaps_waste, cpython) {
        if let Some(clause) = python_sites.as_ref().and_then(python_sites::copied_clause) {
            sentence = format!("{sentence} Here {clause}.");
        }
        headline.dominant = Some(dominant.into());
        headline.sentence = format!("{sentence} {}", headline.sentence);
    }
    let sharing_snapshot = sharing::shown(&snapshots, focus_snapshot);
    let merge = s.merger.stats();
    // A fork child's frees of blocks it never allocated are of its parent's blocks.
    let forked_from = s.fork.parent_stream.map(|p| {
        streams
            .iter()
            .find(|x| x.stream == p)
            .map_or(s.ppid, |x| x.pid)
    });
    // Without its parent's heap at the fork (an older trace, a fork not marked), they are
    // all of the frees of blocks it never saw allocated.
    let inherited_frees = if forked_from.is_some() && s.inherited.is_none() {
        merge.unknown_frees
    } else {
        0
    };
    Ok(Report {
        trace: path.display().to_string(),
        truncated: !seen_end || damage.is_some(),
        damage,
        skipped: reader.skipped().note(),
        stacks: stacks.into(),
        duration_ms: last_tick as f64 * tick_ms,
        stream: s.stream,
        pid: s.pid,
        argv: s.argv.clone(),
        allocator: s.allocator.map(str::to_string),
        linked_allocator: s.linked_allocator.as_ref().map(linked_allocator::facts),
        calls: s.calls,
        merge: MergeFacts {
            forced_allocs: merge.forced_allocs,
            unknown_frees: merge.unknown_frees - inherited_frees,
            inherited_frees,
            forked_from,
            inherited_blocks: s.inherited.map(|h| h.blocks),
            inherited_bytes: s.inherited.map(|h| h.bytes),
            inherited_stale: merge.inherited_stale,
            inherited_from_parent_end: s.inherited.is_some_and(|h| h.at_parent_end),
            late: merge.late,
            lost_events: merge.lost_events,
            spilled: merge.spilled,
            spill_problem: s.merger.spill_problem().map(str::to_string),
            attached: s.attached,
            starting_blocks: s.starting_heap.map(|h| h.0),
            starting_bytes: s.starting_heap.map(|h| h.1),
            starting_stale: merge.starting_stale,
        },
        headline,
        timeline,
        snapshots,
        peak_snapshot,
        end_snapshot,
        focus_snapshot,
        phases,
        size_classes,
        size_class_history,
        sites,
        all_sites,
        processes,
        untraced: untraced
            .iter()
            .map(|u| UntracedImage {
                pid: u.pid,
                exec_by_pid: u
                    .parent_stream
                    .and_then(|p| streams.iter().find(|s| s.stream == p))
                    .map(|s| s.pid),
                t_ms: u.tick as f64 * tick_ms,
                path: u.path.clone(),
                argv: u.argv.clone(),
                reason: u.reason.clone(),
            })
            .collect(),
        chosen_by_pid: opts.pid.is_some(),
        pymalloc_snapshot,
        sharing_snapshot,
        pymalloc_note: s.pymalloc_note.clone(),
        python_sites,
        python_sites_note,
        lisp_sites,
        lisp_sites_note,
        sbcl_snapshot,
        sbcl_note: s.sbcl_note.clone(),
        leaks,
        snapshot: s.census.as_ref().map(crate::census::facts),
    })
}

/// The snapshot the report explains: the most heap waste that lasted, over every heap
/// the process has (malloc's and its runtime's), among snapshots that still hold a
/// meaningful amount of live data (at teardown a program frees everything, and the empty
/// heap left then says nothing about what pinned it while it ran) and that know every
/// heap the process runs (one without the runtime's census, as at exit, would weigh that
/// heap as nothing). A snapshot's waste lasts as far as the next snapshot (any) still
/// shows it: an instant during a ramp is not what a user asks about, and two runs of one
/// program then agree on the moment. Of equals, the latest wins (the settled state).
/// "Meaningful" is against the peak of live data in the calls (`peak_live`), not only at
/// snapshots: a short peak that no snapshot caught must not let a teardown heap qualify.
fn focus_of(snapshots: &[Snapshot], peak_live: u64) -> Option<usize> {
    let max_live = snapshots.iter().map(heaps::live).max()?.max(peak_live);
    let complete = |i: usize| snapshots[i].missing_census.is_empty();
    let waste = |i: usize| heaps::waste(&snapshots[i]);
    // Waste that is gone by the next snapshot was passing; but not when the next one is
    // the exit's, taken after the program's own teardown freed what it kept, or one that
    // does not know every heap.
    let lasting = |i: usize| match snapshots.get(i + 1) {
        Some(next) if next.reason != "exit" && complete(i + 1) => waste(i).min(waste(i + 1)),
        _ => waste(i),
    };
    (0..snapshots.len())
        .filter(|&i| complete(i) && heaps::live(&snapshots[i]) * 100 >= max_live)
        .max_by_key(|&i| lasting(i))
}

fn lazy_free_bytes(r: &Rollup) -> u64 {
    r.get("LazyFree").unwrap_or(0) * 1024
}

/// Stream `i`'s CPython samples; a forked process's start with its parent's up to the
/// fork, which name the objects it inherited.
fn python_log(streams: &[Stream], i: usize) -> std::borrow::Cow<'_, PythonLog> {
    let s = &streams[i];
    let parent = s
        .fork
        .parent_stream
        .filter(|_| s.fork.fork_mark.is_some())
        .and_then(|p| streams.iter().position(|x| x.stream == p))
        .filter(|&p| p < i);
    match parent {
        Some(p) => std::borrow::Cow::Owned(
            s.python
                .forked_from(&python_log(streams, p), s.fork.start_tick),
        ),
        None => std::borrow::Cow::Borrowed(&s.python),
    }
}

fn brief(s: &Stream, streams: &[Stream], tick_ms: f64) -> ProcessBrief {
    // Its sharing at its last snapshot that read it, before its exit when it can (a
    // runtime's heap is gone or unread there).
    let sharing = (s.anonymous_sharing.iter().rev())
        .find(|e| e.1 != SnapshotReason::Exit)
        .or(s.anonymous_sharing.last())
        .map(|&(tick, _, anonymous)| BriefSharing {
            t_ms: tick as f64 * tick_ms,
            rollup: nearest(&s.rollups, tick, |r| r.0).and_then(|r| r.2),
            anonymous,
            inherited: s.fork_residency.as_ref().map(sharing::resident_bytes),
        });
    ProcessBrief {
        forked_from: s.fork.parent_stream.map(|p| {
            streams
                .iter()
                .find(|x| x.stream == p)
                .map_or(s.ppid, |x| x.pid)
        }),
        inherited_bytes: s.inherited.map(|h| h.bytes),
        sharing,
        stream: s.stream,
        pid: s.pid,
        ppid: s.ppid,
        argv: s.argv.clone(),
        calls: s.calls,
        peak_rss: s
            .rss
            .iter()
            .map(|r| r.vm_rss_kib)
            .max()
            .map(|kib| kib * 1024),
        peak_live: s.peak_live.0,
        end: describe_end(s),
    }
}

fn describe_end(s: &Stream) -> String {
    if let Some(w) = s.wait {
        if let Some(sig) = w.signal {
            return format!("killed by signal {sig}");
        }
        if let Some(code) = w.exit_code {
            return format!("exited {code}");
        }
    }
    match &s.end {
        Some(end) => end.describe(),
        None => "still running when the trace ends".into(),
    }
}

/// Live and usable bytes at a tick, from the 10 ms live timeline.
fn live_at(s: &Stream, tick: u64) -> (u64, u64) {
    let i = s.live_timeline.partition_point(|p| p.0 <= tick / 10);
    i.checked_sub(1)
        .map_or((0, 0), |i| (s.live_timeline[i].1, s.live_timeline[i].2))
}

/// (t_ms, rss, live) at every RSS sample, and a timeline thinned to a few hundred points
/// (keeping each group's highest RSS, so peaks survive).
fn timeline(s: &Stream, tick_ms: f64) -> (Vec<(f64, u64, u64)>, Vec<TimelinePoint>) {
    let full: Vec<(f64, u64, u64)> = s
        .rss
        .iter()
        .map(|r| {
            (
                r.tick as f64 * tick_ms,
                r.vm_rss_kib * 1024,
                live_at(s, r.tick).0,
            )
        })
        .collect();
    let group = s.rss.len().div_ceil(TIMELINE_POINTS).max(1);
    let thin = s
        .rss
        .chunks(group)
        .filter_map(|g| g.iter().max_by_key(|r| r.vm_rss_kib))
        .map(|r| {
            let (live, usable) = live_at(s, r.tick);
            TimelinePoint {
                t_ms: r.tick as f64 * tick_ms,
                rss: r.vm_rss_kib * 1024,
                rss_anon: r.rss_anon_kib * 1024,
                rss_file: (r.rss_file_kib + r.rss_shmem_kib) * 1024,
                live,
                usable,
            }
        })
        .collect();
    (full, thin)
}

/// The sample closest to `tick`, preferring the one taken at or just after it (the
/// recorder reads /proc right after pagemap, under the same tick).
fn nearest<T>(items: &[T], tick: u64, tick_of: impl Fn(&T) -> u64) -> Option<&T> {
    let i = items.partition_point(|x| tick_of(x) < tick);
    let after = items.get(i);
    let before = i.checked_sub(1).and_then(|j| items.get(j));
    match (before, after) {
        (Some(b), Some(a)) => {
            if tick_of(a) - tick <= tick - tick_of(b) + 20 {
                Some(a)
            } else {
                Some(b)
            }
        }
        (b, a) => a.or(b),
    }
}

fn snapshot(s: &Stream, e: &Evaluated, tick_ms: f64) -> Snapshot {
    let h = &e.heap;
    let rss = nearest(&s.rss, e.tick, |r| r.tick);
    let rollup = nearest(&s.rollups, e.tick, |r| r.0);
    let lazy_reported = rollup.map_or(0, |r| r.1);
    let (vm_rss, anon, file) = rss.map_or((0, 0, 0), |r| {
        (
            r.vm_rss_kib * 1024,
            r.rss_anon_kib * 1024,
            (r.rss_file_kib + r.rss_shmem_kib) * 1024,
        )
    });
    // Lazily freed pages are resident heap pages with no live object.
    let lazy_free = lazy_reported.min(h.free_resident_pages);
    let own = e.own_memory.min(anon);
    let heap_total =
        h.live + h.rounding + h.allocator_overhead + h.free_in_used_pages + h.free_resident_pages;
    let pymalloc = e.pymalloc.as_ref().map_or(0, |p| p.resident);
    let sbcl = e.sbcl.as_ref().map_or(0, |p| p.resident);
    let other = anon as i64 - heap_total as i64 - own as i64 - pymalloc as i64 - sbcl as i64;
    let parts = Decomposition {
        rss: vm_rss,
        live: h.live,
        rounding: h.rounding,
        allocator_overhead: h.allocator_overhead,
        free_in_used_pages: h.free_in_used_pages,
        free_resident_pages: h.free_resident_pages - lazy_free,
        lazy_free,
        pymalloc_arenas: Some(pymalloc),
        sbcl_dynamic_space: Some(sbcl),
        other_anon: other.max(0) as u64,
        file,
        fragscope_own: own,
        unexplained: other.min(0) + (vm_rss as i64 - anon as i64 - file as i64),
        rss_anon: anon,
        heap_resident: h.heap_resident,
        malloc_unknown: s.heap_unread(),
    };
    // Threads answer a stats request at their next call: close to the snapshot, on
    // either side of it.
    let allocator = nearest(&s.stats, e.tick, |x| x.0)
        .filter(|x| x.0.abs_diff(e.tick) <= STATS_MAX_DISTANCE_TICKS)
        .map(|(t, src, values, in_use)| {
            let values: BTreeMap<String, u64> = values.iter().cloned().collect();
            AllocatorView {
                t_ms: *t as f64 * tick_ms,
                source: src.name().into(),
                comparisons: compare_with_allocator(*src, &values, &parts, *in_use),
                values,
            }
        });
    let mut occupancy = Vec::with_capacity(heap::OCCUPANCY_BUCKETS);
    for b in 0..heap::OCCUPANCY_BUCKETS {
        let (lo, hi) = if b == 0 {
            (0, 0)
        } else {
            ((b as u32 - 1) * 10, b as u32 * 10)
        };
        occupancy.push(OccupancyBucket {
            lo_pct: lo,
            hi_pct: hi,
            pages: h.occupancy_pages[b],
            live_bytes: h.occupancy_live[b],
        });
    }
    let mut snapshot = Snapshot {
        t_ms: e.tick as f64 * tick_ms,
        reason: match e.reason {
            SnapshotReason::Periodic => "periodic",
            SnapshotReason::NearPeak => "near_peak",
            SnapshotReason::Exit => "exit",
        }
        .into(),
        parts,
        rss_measured: rss.is_some(),
        live_not_resident: h.live_not_resident,
        page_size: e.page_size,
        used_pages: h.used_pages,
        empty_pages: h.empty_pages,
        occupancy,
        allocator,
        pymalloc: e.pymalloc.clone(),
        sbcl: e.sbcl.clone(),
        heaps: Vec::new(),
        missing_census: Vec::new(),
        sharing: e.sharing.clone().map(|mut sh| {
            sh.rollup = rollup.and_then(|r| r.2);
            sh
        }),
    };
    snapshot.heaps = crate::heaps::at(&snapshot);
    snapshot
}

/// Marks, at each snapshot, the runtime heaps the process runs whose census it lacks
/// (the exit snapshot, most often): their part of the decomposition is unknown there.
fn mark_missing_censuses(snapshots: &mut [Snapshot]) {
    let runtimes = crate::heaps::runtimes_seen(snapshots);
    for s in snapshots {
        s.missing_census = runtimes
            .iter()
            .copied()
            .filter(|h| h.figures(s).is_none())
            .collect();
        if s.parts.malloc_unknown {
            s.missing_census.insert(0, Heap::Malloc);
        }
        for h in &s.missing_census {
            match h {
                Heap::Pymalloc => s.parts.pymalloc_arenas = None,
                Heap::Sbcl => s.parts.sbcl_dynamic_space = None,
                Heap::Malloc => {}
            }
        }
    }
}

/// The allocator's statistics next to fragscope's figures for the same quantity. Bytes in
/// use are compared at the very point of the calls where the allocator answered
/// (`in_use`); page figures come from the snapshot, a moment apart.
fn compare_with_allocator(
    source: StatsSource,
    v: &BTreeMap<String, u64>,
    d: &Decomposition,
    in_use: u64,
) -> Vec<Comparison> {
    let get = |k: &str| v.get(k).copied();
    let mut out = Vec::new();
    let mut add = |quantity: &str, theirs: Option<u64>, their_f: &str, ours: u64, our_f: &str| {
        if let Some(theirs) = theirs {
            out.push(Comparison {
                quantity: quantity.into(),
                allocator: theirs,
                allocator_formula: their_f.into(),
                fragscope: ours,
                fragscope_formula: our_f.into(),
                difference: theirs as i64 - ours as i64,
            });
        }
    };
    let free_pages = d.free_resident_pages + d.lazy_free;
    match source {
        StatsSource::Jemalloc => {
            let (alloc, active, resident, meta) = (
                get("stats.allocated"),
                get("stats.active"),
                get("stats.resident"),
                get("stats.metadata").unwrap_or(0),
            );
            add("in use", alloc, "allocated", in_use, "live + rounding");
            add(
                "free inside active pages",
                active.zip(alloc).map(|(a, b)| a.saturating_sub(b)),
                "active - allocated",
                d.free_in_used_pages,
                "free in used pages",
            );
            add(
                "free pages kept resident",
                resident
                    .zip(active)
                    .map(|(r, a)| r.saturating_sub(a + meta)),
                "resident - active - metadata",
                free_pages,
                "free resident pages + lazily freed",
            );
            add(
                "heap resident",
                resident.map(|r| r.saturating_sub(meta)),
                "resident - metadata",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Tcmalloc => {
            let lists = ["central", "transfer", "thread"]
                .iter()
                .map(|c| get(&format!("tcmalloc.{c}_cache_free_bytes")))
                .sum::<Option<u64>>();
            add(
                "in use",
                get("generic.current_allocated_bytes"),
                "current_allocated_bytes",
                in_use,
                "live + rounding",
            );
            add(
                "free in size-class free lists",
                lists,
                "central + transfer + thread cache free bytes",
                d.free_in_used_pages,
                "free in used pages",
            );
            add(
                "free pages kept",
                get("tcmalloc.pageheap_free_bytes"),
                "pageheap_free_bytes",
                free_pages,
                "free resident pages + lazily freed",
            );
            add(
                "heap",
                get("generic.heap_size")
                    .zip(get("tcmalloc.pageheap_unmapped_bytes"))
                    .map(|(h, u)| h.saturating_sub(u)),
                "heap_size - pageheap_unmapped_bytes",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Glibc => {
            // uordblks leaves out the chunks mmap'ed on their own (blocks above the mmap
            // threshold), which hblkhd counts and live + rounding holds.
            add(
                "in use",
                get("uordblks").zip(get("hblkhd")).map(|(u, h)| u + h),
                "uordblks + hblkhd (chunks in use, headers included, mmapped ones too)",
                in_use,
                "live + rounding",
            );
            add(
                "free in the heap",
                get("fordblks"),
                "fordblks",
                d.free_in_used_pages + free_pages,
                "free in used pages + free resident pages + lazily freed",
            );
            add(
                "heap",
                get("arena").zip(get("hblkhd")).map(|(a, h)| a + h),
                "arena + hblkhd (mapped, touched or not)",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Mimalloc => add(
            "heap",
            get("current_commit"),
            "current_commit",
            d.heap_resident,
            "heap resident (pagemap)",
        ),
        StatsSource::Unknown => {}
    }
    out
}

fn phases_of(full: &[(f64, u64, u64)], snapshots: &[Snapshot]) -> Vec<Phase> {
    phases::detect(full)
        .into_iter()
        .map(|p| {
            let inside = full.iter().filter(|x| x.0 >= p.start_ms && x.0 <= p.end_ms);
            let (mut rss_max, mut live_max, mut live_end) = (0, 0, 0);
            for x in inside {
                rss_max = rss_max.max(x.1);
                live_max = live_max.max(x.2);
                live_end = x.2;
            }
            // The last snapshot inside, unless it is the exit one and another exists:
            // a program's teardown is not the state of its phase; and one that knows
            // every heap (has the runtime's census) before one that does not.
            let inside: Vec<&Snapshot> = snapshots
                .iter()
                .filter(|s| s.t_ms >= p.start_ms && s.t_ms <= p.end_ms)
                .collect();
            let snap = inside
                .iter()
                .rev()
                .find(|s| s.reason != "exit" && s.missing_census.is_empty())
                .or_else(|| inside.iter().rev().find(|s| s.reason != "exit"))
                .or(inside.last())
                .copied();
            Phase {
                start_ms: p.start_ms,
                end_ms: p.end_ms,
                kind: p.kind,
                rss_max,
                live_max,
                live_end,
                snapshot_t_ms: snap.map(|s| s.t_ms),
                decomposition: snap.map(|s| s.parts.clone()),
            }
        })
        .collect()
}

fn size_classes(
    s: &Stream,
    focus: Option<usize>,
    tick_ms: f64,
) -> (Vec<SizeClass>, Vec<ClassHistory>) {
    let Some(f) = focus else {
        return (Vec::new(), Vec::new());
    };
    let first = &s.evaluated[0].classes;
    let mut classes: Vec<SizeClass> = s.evaluated[f]
        .classes
        .iter()
        .map(|c| SizeClass {
            usable: c.usable,
            objects: c.objects,
            live_bytes: c.live_bytes,
            usable_bytes: c.usable_bytes,
            pages: c.pages,
            mean_occupancy: c.mean_occupancy,
            retained_free: c.retained_free,
            retained_free_first: first
                .iter()
                .find(|x| x.usable == c.usable)
                .map_or(0, |x| x.retained_free),
        })
        .collect();
    classes.sort_by_key(|c| std::cmp::Reverse(c.usable_bytes + c.retained_free));
    let history = s
        .evaluated
        .iter()
        .map(|e| {
            let mut cs: Vec<&ClassAtSnapshot> = e.classes.iter().collect();
            cs.sort_by_key(|c| std::cmp::Reverse(c.usable_bytes + c.retained_free));
            ClassHistory {
                t_ms: e.tick as f64 * tick_ms,
                classes: cs
                    .into_iter()
                    .take(CLASSES_PER_SNAPSHOT)
                    .map(|c| ClassPoint {
                        usable: c.usable,
                        live_bytes: c.live_bytes,
                        retained_free: c.retained_free,
                    })
                    .collect(),
            }
        })
        .collect();
    (classes, history)
}

/// Wrappers whose frame says nothing about who allocated.
fn is_allocator_frame(f: &Frame) -> bool {
    let Some(name) = &f.function else {
        return false;
    };
    const WRAPPERS: [&str; 12] = [
        "operator new",
        "operator delete",
        "malloc",
        "calloc",
        "realloc",
        "__libc_",
        "__rust_alloc",
        "__rust_realloc",
        "alloc::alloc::",
        "alloc::raw_vec::",
        "__rdl_alloc",
        "xmalloc",
    ];
    WRAPPERS.iter().any(|w| name.starts_with(w))
}

/// The site tables, and every site (sorted by stack id) when `opts.all_sites`.
fn sites(
    s: &Stream,
    leaks: &HashMap<u32, (f64, f64)>,
    focus: Option<usize>,
    opts: &Options,
    stacks: &str,
    tick_ms: f64,
) -> (Sites, Vec<Site>) {
    let empty = |t_ms| Sites {
        stacks: stacks.into(),
        t_ms,
        sparse_pct: opts.sparse_pct,
        by_live_bytes: Vec::new(),
        by_pinned_waste: Vec::new(),
        by_allocated_bytes: Vec::new(),
        by_allocations: Vec::new(),
        by_leaked_bytes: Vec::new(),
        by_temporary_allocations: Vec::new(),
    };
    if stacks == "none" {
        return (empty(None), Vec::new());
    }
    let at: HashMap<u32, &SiteAtSnapshot> = focus
        .map(|f| s.evaluated[f].sites.iter().map(|x| (x.stack, x)).collect())
        .unwrap_or_default();
    let mut ids: Vec<u32> = at.keys().copied().collect();
    for id in s.site_allocs.keys().chain(leaks.keys().copied()) {
        if !at.contains_key(&id) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let mut symbolizer = Symbolizer::new(s.code_maps.clone());
    let mut frames_of = |id: u32| -> Vec<Frame> {
        s.merger
            .stack(id)
            .iter()
            .flat_map(|&a| symbolizer.frames(a))
            // fragscope's own wrapper of main is not the program's code
            .filter(|f| !f.module.starts_with("libfragscope_preload"))
            .collect()
    };
    let label_of = |frames: &[Frame]| {
        frames
            .iter()
            .find(|f| !is_allocator_frame(f))
            .or(frames.first())
            .map_or_else(|| "(no stack)".to_string(), Frame::label)
    };
    // The figures of a set of stacks, summed; frames and stack id of the first.
    let site_of = |label: String, frames: Vec<Frame>, group: &[u32]| -> Site {
        let mut site = Site {
            stack: group[0],
            label,
            frames,
            stacks: group.len(),
            live_objects: 0,
            live_bytes: 0,
            pinning_objects: 0,
            pinned_pages: 0.0,
            pinned_waste: 0,
            allocations: 0,
            allocated_bytes: 0,
            leaked_objects: 0,
            leaked_bytes: 0,
            temporary_allocations: 0,
        };
        let (mut objects, mut live, mut pinning, mut waste) = (0.0, 0.0, 0.0, 0.0);
        let (mut allocations, mut allocated) = (0.0, 0.0);
        let (mut leaked_objects, mut leaked, mut temporary) = (0.0, 0.0, 0.0);
        for id in group {
            if let Some(l) = leaks.get(id) {
                leaked_objects += l.0;
                leaked += l.1;
            }
            if let Some(t) = s.site_temporaries.get(id) {
                temporary += t.0;
            }
            if let Some(x) = at.get(id) {
                objects += x.live_objects;
                live += x.live_bytes;
                pinning += x.pinning_objects;
                site.pinned_pages += x.pinned_pages;
                waste += x.pinned_waste;
            }
            let a = s.site_allocs.get(id).unwrap_or_default();
            allocations += a.0;
            allocated += a.1;
        }
        site.live_objects = objects.round() as u64;
        site.live_bytes = live.round() as u64;
        site.pinning_objects = pinning.round() as u64;
        site.pinned_waste = waste.round() as u64;
        site.allocations = allocations.round() as u64;
        site.allocated_bytes = allocated.round() as u64;
        site.leaked_objects = leaked_objects.round() as u64;
        site.leaked_bytes = leaked.round() as u64;
        site.temporary_allocations = temporary.round() as u64;
        site
    };
    // The tables list places in the code, not stacks: the stacks whose first frame
    // outside the allocator has the same label (function and line; the function alone
    // without line tables) are one row, shown with the stack that weighs most.
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        let mut index: HashMap<String, usize> = HashMap::new();
        for id in sorted {
            let label = label_of(&frames_of(id));
            let i = *index.entry(label.clone()).or_insert_with(|| {
                groups.push((label, Vec::new()));
                groups.len() - 1
            });
            groups[i].1.push(id);
        }
    }
    let top = opts.top;
    let mut pick = |key: &dyn Fn(&u32) -> f64| -> Vec<Site> {
        let mut v: Vec<(f64, usize)> = groups
            .iter()
            .enumerate()
            .map(|(g, (_, group))| (group.iter().map(key).sum(), g))
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter()
            .filter(|(k, _)| *k > 0.0)
            .take(top)
            .map(|(_, g)| {
                let (label, group) = &groups[g];
                let mut group = group.clone();
                // The heaviest stack first: its frames stand for the row.
                group.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
                site_of(label.clone(), frames_of(group[0]), &group)
            })
            .collect()
    };
    let by_live_bytes = pick(&|id| at.get(id).map_or(0.0, |x| x.live_bytes));
    let by_pinned_waste = pick(&|id| at.get(id).map_or(0.0, |x| x.pinned_waste));
    let by_allocated_bytes = pick(&|id| s.site_allocs.get(id).map_or(0.0, |x| x.1));
    let by_allocations = pick(&|id| s.site_allocs.get(id).map_or(0.0, |x| x.0));
    let by_leaked_bytes = pick(&|id| leaks.get(id).map_or(0.0, |x| x.1));
    let by_temporary_allocations = pick(&|id| s.site_temporaries.get(id).map_or(0.0, |x| x.0));
    let mut all = Vec::new();
    if opts.all_sites {
        ids.sort_unstable();
        all = ids
            .iter()
            .map(|&id| {
                let frames = frames_of(id);
                site_of(label_of(&frames), frames, &[id])
            })
            .collect();
    }
    let tables = Sites {
        by_live_bytes,
        by_pinned_waste,
        by_allocated_bytes,
        by_allocations,
        by_leaked_bytes,
        by_temporary_allocations,
        ..empty(focus.map(|f| s.evaluated[f].tick as f64 * tick_ms))
    };
    (tables, all)
}

fn headline(
    peak_rss: Option<(f64, u64)>,
    peak_live: Option<(u64, f64)>,
    focus: Option<&Snapshot>,
) -> Headline {
    let mut h = Headline {
        peak_rss: peak_rss.map(|p| p.1),
        peak_rss_t_ms: peak_rss.map(|p| p.0),
        peak_live: peak_live.map(|p| p.0),
        peak_live_t_ms: peak_live.map(|p| p.1),
        focus_t_ms: None,
        fragmentation_ratio: None,
        heap: None,
        dominant: None,
        sentence: "No page-residency snapshot was taken: only RSS and live bytes are known \
                   (record for longer, or with a smaller --snapshot-ms)."
            .into(),
    };
    let Some(f) = focus else { return h };
    let d = &f.parts;
    h.focus_t_ms = Some(f.t_ms);
    let (all_resident, all_live) = (heaps::resident(f), heaps::live(f));
    if all_live > 0 {
        h.fragmentation_ratio = Some(all_resident as f64 / all_live as f64);
    }
    let candidates = [
        ("free_resident_pages", d.free_resident_pages),
        ("free_in_used_pages", d.free_in_used_pages),
        ("rounding", d.rounding),
        ("lazy_free", d.lazy_free),
    ];
    let (name, biggest) = candidates
        .into_iter()
        .max_by_key(|c| c.1)
        .unwrap_or(("", 0));
    let waste = d.heap_waste();
    let all_waste = heaps::waste(f);
    h.sentence = if d.other_anon > all_resident.max(1) * 2 {
        "Most of RSS is outside the traced heap (thread stacks, allocator metadata, runtimes \
         or mappings that never held a malloc'd object): see other_anon."
            .into()
    } else if all_waste * 10 < all_resident {
        // Dense over every heap the process has: a runtime's dense heap beside a small
        // malloc heap with a few free pages is not a malloc problem.
        h.heap = heaps::most_wasteful(f).map(|x| x.heap);
        if f.heaps.len() > 1 {
            "The heaps are dense: under a tenth of their resident bytes (malloc's and the \
             runtime's) is waste, so only holding less live data lowers RSS."
                .into()
        } else {
            "The heap is dense: under a tenth of its resident bytes is waste, so only holding \
             less live data lowers RSS."
                .into()
        }
    } else if let Some(top) = heaps::most_wasteful(f).filter(|t| t.heap != Heap::Malloc) {
        // A runtime's heap wastes most, too little for its own sentence (which follows
        // when it is worth one): malloc's parts are not the story.
        h.heap = Some(top.heap);
        format!(
            "Most of the waste is in the {}: {} of its {} resident ({}%), too little for \
             its own settings to recover much; holding less live data lowers RSS most.",
            top.heap.name(),
            crate::mib(top.waste),
            crate::mib(top.resident),
            100 * top.waste / top.resident.max(1)
        )
    } else {
        h.heap = Some(Heap::Malloc);
        h.dominant = Some(name.into());
        let pct = 100 * biggest / waste.max(1);
        match name {
            "free_resident_pages" => format!(
                "{pct}% of the waste is whole free pages the allocator keeps: a purge/trim \
                 setting would return them (jemalloc dirty_decay_ms, glibc malloc_trim or \
                 M_TRIM_THRESHOLD, tcmalloc's release rate)."
            ),
            "free_in_used_pages" => format!(
                "{pct}% of the waste is free space inside pages pinned by a few live objects: \
                 no purge returns it; only moving objects or not mixing lifetimes in the same \
                 pages helps (separate arenas for long-lived data, compaction)."
            ),
            "rounding" => format!(
                "{pct}% of the waste is size-class rounding: requested sizes sit just above \
                 class boundaries; resize the objects or choose an allocator with finer classes."
            ),
            _ => format!(
                "{pct}% of the waste is pages freed lazily (MADV_FREE): the kernel reclaims \
                 them under memory pressure, so RSS overstates what the program holds."
            ),
        }
    };
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc's bytes in use are its heap's chunks in use and its mmapped chunks (a process
    /// holding a block above the mmap threshold once showed that block as a difference).
    #[test]
    fn glibcs_bytes_in_use_count_its_mmapped_chunks() {
        let v: BTreeMap<String, u64> = [
            ("arena", 200_000),
            ("uordblks", 150_000),
            ("fordblks", 50_000),
            ("hblkhd", 1_052_672),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        let d = Decomposition::default();
        let cmp = compare_with_allocator(StatsSource::Glibc, &v, &d, 1_200_000);
        let in_use = cmp.iter().find(|c| c.quantity == "in use").unwrap();
        assert_eq!(in_use.allocator, 150_000 + 1_052_672);
        assert_eq!(in_use.difference, 2_672);
    }

    /// A runtime's heap that wastes most, though too little for its own sentence, is not
    /// told as malloc's free pages (an SBCL job with 0.4 MiB of malloc waste once got
    /// malloc's purge advice for 7 MiB of its dynamic space's).
    #[test]
    fn the_headline_names_the_heap_that_wastes_most() {
        let figures = |heap, resident: u64, live: u64| heaps::HeapFigures {
            heap,
            resident,
            live,
            waste: resident - live,
        };
        let snapshot = |heaps: Vec<heaps::HeapFigures>| Snapshot {
            t_ms: 266.0,
            reason: "periodic".into(),
            parts: Decomposition {
                free_resident_pages: 370_000,
                ..Default::default()
            },
            rss_measured: true,
            live_not_resident: 0,
            page_size: 4096,
            used_pages: 0,
            empty_pages: 0,
            occupancy: vec![],
            allocator: None,
            pymalloc: None,
            sbcl: None,
            heaps,
            missing_census: vec![],
            sharing: None,
        };
        let sbcl = snapshot(vec![
            figures(Heap::Malloc, 1_105_920, 718_823),
            figures(Heap::Sbcl, 58_593_280, 50_840_000),
        ]);
        let h = headline(None, None, Some(&sbcl));
        assert_eq!(h.heap, Some(Heap::Sbcl));
        assert!(
            h.sentence
                .starts_with("Most of the waste is in the SBCL dynamic space: 7.4 MiB of its 56 MiB resident (13%)"),
            "{}",
            h.sentence
        );
        // Malloc's own waste keeps malloc's words.
        let malloc = snapshot(vec![figures(Heap::Malloc, 4_000_000, 1_000_000)]);
        let h = headline(None, None, Some(&malloc));
        assert_eq!(h.heap, Some(Heap::Malloc));
        assert!(h.sentence.contains("purge/trim"), "{}", h.sentence);
    }
}
