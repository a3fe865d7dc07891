//! One process of the trace as the model follows it: its merged calls, live bytes and
//! sites, and its snapshots evaluated as the calls reach their moment.

use std::collections::VecDeque;

use fragscope_trace::call::{LastAllocs, Summary};
use fragscope_trace::event::StatsSource;
use fragscope_trace::merge::{Call, LiveTable, Merged, Merger};
use fragscope_trace::records::{
    Mapping, Pagemap, ProcessEnd, PymallocPools, RssSample, SnapshotReason, WaitStatus,
};

use crate::forks::{ForkLink, Forked, Inherited};
use crate::golang::{self, GoParts};
use crate::heap::{self, ClassAtSnapshot, HeapHistory, HeapParts, SiteAtSnapshot, SiteWeighting};
use crate::heap_pages::{Evaluation, HeapPages};
use crate::jvm::{self, JvmParts};
use crate::lisp_sites::LispLog;
use crate::pymalloc::{self, PymallocParts};
use crate::python_sites::{PoolIndex, PythonLog};
use crate::sbcl::{self, SbclParts};
use crate::sharing::{self, Owners, PartSharing, RollupSharing, Sharing};
use crate::v8::{self, V8Parts};
use fragscope_trace::go_heap::GoHeap;
use fragscope_trace::heap_census::HeapCensus;
use fragscope_trace::jvm_heap::{JvmAreaKind, JvmHeap};
use fragscope_trace::sbcl_heap::SbclHeap;
use fragscope_trace::v8_heap::V8Heap;

use super::SITES_PER_SNAPSHOT;

/// (tick, source, name-value pairs, fragscope's live + rounding at that point of the
/// merged calls) of one answer of the allocator's own statistics.
pub(super) type AllocatorStats = (u64, StatsSource, Vec<(String, u64)>, u64);

pub(super) struct Evaluated {
    pub(super) tick: u64,
    pub(super) reason: SnapshotReason,
    pub(super) page_size: u64,
    pub(super) heap: HeapParts,
    pub(super) classes: Vec<ClassAtSnapshot>,
    pub(super) sites: Vec<SiteAtSnapshot>,
    pub(super) own_memory: u64,
    pub(super) pymalloc: Option<PymallocParts>,
    pub(super) sbcl: Option<SbclParts>,
    pub(super) go: Option<GoParts>,
    pub(super) jvm: Option<JvmParts>,
    pub(super) v8: Option<V8Parts>,
    /// Pages by owner, when the residency says which are shared (its rollup is joined
    /// when the snapshot is reported).
    pub(super) sharing: Option<Sharing>,
    /// Its heap census could not read the allocator: its malloc heap is unknown.
    pub(super) census_refused: bool,
}

#[derive(Default)]
pub(super) struct Stream {
    pub(super) stream: u32,
    pub(super) pid: u32,
    pub(super) ppid: u32,
    pub(super) argv: Vec<String>,
    /// Running before `record -p` attached: its earlier blocks were never seen allocated.
    pub(super) attached: bool,
    /// Its parent and fork, and the heaps at its own forks.
    pub(super) fork: ForkLink,
    /// The heap it started from, its parent's at the fork.
    pub(super) inherited: Option<Inherited>,
    /// The blocks it held then, as read from its heap (blocks, usable bytes).
    pub(super) starting_heap: Option<(u64, u64)>,
    pub(super) merger: Merger,
    pub(super) pending: VecDeque<Pagemap>,
    /// Its residency as it started, when it was forked (`Chunk::ForkResidency`).
    pub(super) fork_residency: Option<Pagemap>,
    /// Each snapshot's heap mappings by owner, as its residency arrives, for the list of
    /// processes (which does not wait for the snapshots' evaluation).
    pub(super) anonymous_sharing: Vec<(u64, SnapshotReason, Owners)>,
    /// pymalloc censuses waiting for the snapshot of their tick (written just before it).
    pub(super) pymalloc_pending: VecDeque<(u64, PymallocPools)>,
    /// Why the process has no pymalloc census, when it is CPython.
    pub(super) pymalloc_note: Option<String>,
    /// CPython's sampled objects, and where the pools of the census with the most
    /// pymalloc waste so far were (the one the report explains).
    pub(super) python: PythonLog,
    pub(super) python_census: Option<PoolIndex>,
    /// A forked process: the pools of the census with the most arena pages copied since
    /// the fork (the one its copies are explained at).
    pub(super) python_copies: Option<PoolIndex>,
    /// SBCL's sampled allocation regions.
    pub(super) lisp: LispLog,
    /// SBCL censuses waiting for the snapshot of their tick (written just before it).
    pub(super) sbcl_pending: VecDeque<(u64, SbclHeap)>,
    /// Why the process has no SBCL census, when it runs SBCL.
    pub(super) sbcl_note: Option<String>,
    /// Go heap censuses waiting for the snapshot of their tick (written just before it).
    pub(super) go_pending: VecDeque<(u64, GoHeap)>,
    /// Why the process has no Go heap census, when it is a Go program.
    pub(super) go_note: Option<String>,
    /// The Go heap census with the most waste so far, with its tick (the one whose heap
    /// profile the report joins with its spans).
    pub(super) go_census: Option<(u64, u64, GoHeap)>,
    /// JVM heap censuses waiting for the snapshot of their tick (written just before it).
    pub(super) jvm_pending: VecDeque<(u64, JvmHeap)>,
    /// Why the process has no JVM heap census, when it runs a JVM.
    pub(super) jvm_note: Option<String>,
    /// V8 heap figures waiting for the snapshot of their tick (written just before it).
    pub(super) v8_pending: VecDeque<(u64, V8Heap)>,
    /// Why a Node.js process has no V8 figures (a snapshot whose inspector did not answer).
    pub(super) v8_note: Option<String>,
    pub(super) evaluated: Vec<Evaluated>,
    /// Snapshots whose evaluation waits until the report knows which process it explains,
    /// each with the live blocks of its moment (see `evaluate_next`).
    deferred: VecDeque<(Moment, LiveTable)>,
    /// Blocks the tables in `deferred` hold apart from those they share.
    pub(super) deferred_cost: usize,
    /// Another pid was asked for: the report only lists this process, so its snapshots
    /// are not evaluated against its live blocks (a forked worker's are its parent's
    /// whole heap); the list's figures come from `anonymous_sharing`.
    pub(super) listed_only: bool,
    pub(super) history: HeapHistory,
    /// Its live blocks by page, followed call by call while that pays (see
    /// `follows_by_page`): what its snapshots are then evaluated from.
    pub(super) heap_pages: Option<HeapPages>,
    /// `calls` at the last snapshot evaluated from its live blocks.
    pub(super) calls_at_snapshot: u64,
    pub(super) rss: Vec<RssSample>,
    /// smaps_rollup by tick: LazyFree, and the figures of sharing.
    pub(super) rollups: Vec<(u64, u64, Option<RollupSharing>)>,
    pub(super) live_bytes: u64,
    pub(super) usable_bytes: u64,
    /// (10 ms bucket, live, usable) at the end of each bucket with calls.
    pub(super) live_timeline: Vec<(u64, u64, u64)>,
    pub(super) peak_live: (u64, u64),
    pub(super) calls: u64,
    /// Blocks allocated (every call that returned one).
    pub(super) allocations: u64,
    pub(super) site_allocs: StackSums,
    /// Each thread's last allocated address, while the thread allocates nothing else: a
    /// free of it by the same thread makes the block a temporary allocation.
    last_alloc: LastAllocs,
    /// Temporary allocations (count, bytes), exact, and by stack (weighted).
    pub(super) temporaries: (u64, u64),
    pub(super) site_temporaries: StackSums,
    /// The allocator's own statistics, as answered (about once per snapshot).
    pub(super) stats: Vec<AllocatorStats>,
    pub(super) code_maps: Vec<Mapping>,
    pub(super) end: Option<ProcessEnd>,
    pub(super) wait: Option<WaitStatus>,
    pub(super) allocator: Option<&'static str>,
    /// The process's first heap census that read its allocator, else its first (a
    /// snapshot trace's one): whether the allocator could be read at all. A census
    /// stands for the calls the trace has not.
    pub(super) census: Option<HeapCensus>,
    /// Heap censuses waiting for the snapshot of their tick.
    pub(super) census_pending: VecDeque<(u64, HeapCensus)>,
    /// The heap censuses read, with their snapshot's tick and waste (free bytes in used
    /// pages and free pages): a recording takes one at each snapshot of a program whose
    /// allocator is linked into it. At most [`CENSUSES_KEPT`], the least wasteful
    /// dropped first: the report shows the focus snapshot's.
    pub(super) censuses: Vec<(u64, u64, HeapCensus)>,
    /// An allocator linked into its program, whose calls the trace does not hold.
    pub(super) linked_allocator: Option<fragscope_trace::heap_census::LinkedAllocator>,
    /// An aggregated trace: the usable bytes of its last LIVE record.
    aggregated_usable: Option<u64>,
}

/// Weighted allocations and bytes per stack, indexed by the merge's stack ids (dense, from
/// 1): one add per allocation, with no hashing on the way.
#[derive(Default)]
pub(super) struct StackSums(Vec<(f64, f64)>);

impl StackSums {
    fn add(&mut self, stack: u32, weight: f64, size: u64) {
        let i = stack as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, (0.0, 0.0));
        }
        self.0[i].0 += weight;
        self.0[i].1 += weight * size as f64;
    }

    pub(super) fn get(&self, stack: &u32) -> Option<(f64, f64)> {
        self.0.get(*stack as usize).copied().filter(|e| e.0 > 0.0)
    }

    /// The stacks with a sum.
    pub(super) fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.0.len() as u32).filter(|&i| self.0[i as usize].0 > 0.0)
    }
}

pub(super) struct Ctx {
    pub(super) weighting: SiteWeighting,
    /// An aggregated recording: its calls are those the snapshots see, and its summaries
    /// count the others (calls, allocations, temporaries, live bytes between snapshots).
    pub(super) aggregated: bool,
    pub(super) sparse_pct: u32,
    /// How snapshots are evaluated from the live blocks (see [`Evaluation::asked`]).
    pub(super) evaluation: Evaluation,
}

/// Whether few live blocks carry a stack: none were recorded, or they were sampled with a
/// mean of 64 KiB or more between samples (512 KiB by default), so that the live table
/// keeps the few that do whole beside it (see [`LiveTable::without_birth_ticks`]).
fn stacks_rare(weighting: SiteWeighting) -> bool {
    match weighting {
        SiteWeighting::Every => false,
        SiteWeighting::Sampled { mean_bytes } => mean_bytes >= 65536.0,
        SiteWeighting::None => true,
    }
}

impl Stream {
    /// The process of trace stream `stream`, before any of its records, whose stacks are
    /// weighed as `weighting` says.
    pub(super) fn new(stream: u32, weighting: SiteWeighting) -> Self {
        Self {
            stream,
            fork: ForkLink::new(stream),
            // A report never reads when a block was born.
            merger: Merger::without_birth_ticks(stacks_rare(weighting)),
            ..Default::default()
        }
    }

    /// The heap census the report shows: the focus snapshot's (`focus`, an index into
    /// the evaluated snapshots), else the most wasteful kept, else the first (a refusal).
    pub(super) fn census_shown(&self, focus: Option<usize>) -> Option<&HeapCensus> {
        let tick = focus.and_then(|f| self.evaluated.get(f)).map(|e| e.tick);
        let shown = self.censuses.iter().find(|c| Some(c.0) == tick);
        shown
            .or_else(|| self.censuses.iter().max_by_key(|c| c.1))
            .map(|c| &c.2)
            .or(self.census.as_ref())
    }

    /// The malloc heap is unknown: its only view is censuses (a snapshot's, or a linked
    /// allocator's in a recording), and none could read the allocator.
    pub(super) fn heap_unread(&self) -> bool {
        self.census.as_ref().is_some_and(|c| c.result.is_err())
    }

    /// Takes every call the merge can order now; evaluates snapshots as their moment passes.
    pub(super) fn drain(&mut self, ctx: &Ctx) {
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
                        // An aggregated trace says the live bytes as every call had them
                        // in a LIVE record just before.
                        let usable = match self.aggregated_usable {
                            Some(u) if ctx.aggregated => u,
                            _ => self.usable_bytes,
                        };
                        self.stats.push((tick, source, values, usable));
                    }
                }
                Some(Merged::Forked { tick, mark }) => {
                    self.fork.forked(&mut self.merger, mark, tick);
                }
                Some(Merged::Summary { tick, summary }) => self.take_summary(ctx, tick, summary),
            }
        }
    }

    /// Its merge started from the heap it inherited: its blocks are live data, and their
    /// frees are known.
    pub(super) fn start_from(&mut self, ctx: &Ctx, inherited: Inherited) {
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
        // An aggregated recording counts calls and temporaries in its summaries: its
        // calls are not all, and they are written as one thread's.
        self.calls += u64::from(!ctx.aggregated);
        let temporary = self.last_alloc.frees_last(&c) && !ctx.aggregated;
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

    /// What an aggregated recording says of the calls it left out.
    fn take_summary(&mut self, ctx: &Ctx, tick: u64, summary: Summary) {
        match summary {
            Summary::Summed {
                stack,
                size,
                allocations,
                temporaries,
            } => {
                self.allocations += allocations;
                self.temporaries.0 += temporaries;
                self.temporaries.1 += temporaries * size;
                if stack != 0 {
                    let w = ctx.weighting.weight(size);
                    if allocations > 0 {
                        self.site_allocs.add(stack, w * allocations as f64, size);
                    }
                    if temporaries > 0 {
                        self.site_temporaries
                            .add(stack, w * temporaries as f64, size);
                    }
                }
            }
            Summary::Live {
                live,
                usable,
                peak,
                peak_tick,
                calls,
            } => {
                self.calls += calls;
                self.aggregated_usable = Some(usable);
                // The first time the most was reached, as every call would have it: the
                // calls written may have reached the same figure later, the ones left out
                // sooner.
                let (most, at) = self.peak_live;
                if peak > most || (peak == most && peak_tick < at) {
                    self.peak_live = (peak, peak_tick);
                }
                let bucket = tick / 10;
                match self.live_timeline.last_mut() {
                    Some(last) if last.0 == bucket => {
                        last.1 = live;
                        last.2 = usable;
                    }
                    _ => self.live_timeline.push((bucket, live, usable)),
                }
            }
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

    /// The Go heap census taken with snapshot `pm`, split by its residency.
    fn go_at(&mut self, pm: &Pagemap) -> Option<(GoParts, Owners)> {
        let heap = census_at(&mut self.go_pending, pm.tick)?;
        let owners = sharing::owners_in(
            pm,
            self.fork_residency.as_ref(),
            heap.ranges.iter().copied(),
        );
        let parts = golang::split(&heap, pm);
        // As the report picks its Go snapshot: the most waste, the latest of equals.
        if self.go_census.as_ref().is_none_or(|c| parts.waste() >= c.1) {
            self.go_census = Some((pm.tick, parts.waste(), heap));
        }
        Some((parts, owners))
    }

    /// Every runtime's census taken with snapshot `pm`, split by its residency (`parts`:
    /// the malloc heap's, which pymalloc's arenas are taken out of).
    fn runtimes_at(&mut self, pm: &Pagemap, parts: &mut HeapParts) -> RuntimeParts {
        let (pymalloc, pymalloc_owners) = self.pymalloc_at(pm, parts).unzip();
        let (sbcl, sbcl_owners) = self.sbcl_at(pm).unzip();
        let (go, go_owners) = self.go_at(pm).unzip();
        let (jvm, jvm_owners) = self.jvm_at(pm).unzip();
        let (jvm_owners, jvm_runtime_owners) = jvm_owners.unzip();
        // V8's figures are its own counts, not pages: it has no part in the sharing.
        let v8 = census_at(&mut self.v8_pending, pm.tick).map(|h| v8::split(&h));
        RuntimeParts {
            pymalloc,
            sbcl,
            go,
            jvm,
            v8,
            owners: [
                ("pymalloc_arenas", pymalloc_owners),
                ("sbcl_dynamic_space", sbcl_owners),
                ("go_heap", go_owners),
                ("jvm_heap", jvm_owners),
                ("jvm_runtime", jvm_runtime_owners),
            ],
        }
    }

    /// The JVM heap census taken with snapshot `pm`, split by its residency.
    /// Its pages by owner: the heap's, and the runtime areas' the residency reads.
    fn jvm_at(&mut self, pm: &Pagemap) -> Option<(JvmParts, (Owners, Owners))> {
        let heap = census_at(&mut self.jvm_pending, pm.tick)?;
        let fork = self.fork_residency.as_ref();
        let spaces = heap.spaces.iter().map(|s| (s.bottom, s.end));
        let areas = (heap.areas.iter())
            .filter(|a| a.0 != JvmAreaKind::ClassDataArchive)
            .map(|a| (a.1, a.2));
        let owners = (
            sharing::owners_in(pm, fork, spaces),
            sharing::owners_in(pm, fork, areas),
        );
        Some((jvm::split(&heap, pm), owners))
    }

    /// The snapshot's pages by owner, when its residency says which are shared; the
    /// malloc heap's parts when the calls placed them (`heap`), else only its total.
    fn sharing_at(
        &self,
        pm: &Pagemap,
        heap: Option<&HeapParts>,
        runtimes: &[(&str, Option<Owners>)],
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
        for (name, owners) in runtimes {
            if let Some(o) = owners {
                parts.push(part(name, *o));
            }
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
    pub(super) fn evaluate_next(&mut self, ctx: &Ctx, past: Option<&Call>) {
        self.merger.apply_held_free();
        let Some(pm) = self.pending.pop_front() else {
            return;
        };
        let census = census_at(&mut self.census_pending, pm.tick).map(|c| {
            let (parts, classes) = crate::census::heap_parts(&c, &pm);
            let refused = c.result.is_err();
            if !refused {
                let waste = parts.free_in_used_pages + parts.free_resident_pages;
                self.censuses.push((pm.tick, waste, c));
                if self.censuses.len() > CENSUSES_KEPT {
                    let least = (0..self.censuses.len()).min_by_key(|&i| self.censuses[i].1);
                    self.censuses.remove(least.unwrap_or(0));
                }
            }
            (parts, classes, refused)
        });
        if let Some((mut parts, classes, census_refused)) = census {
            self.evaluate_deferred(ctx);
            let runtimes = self.runtimes_at(&pm, &mut parts);
            let sharing = self.sharing_at(&pm, None, &runtimes.owners);
            let live = parts.live;
            self.evaluated.push(Evaluated {
                tick: pm.tick,
                reason: pm.reason,
                page_size: u64::from(pm.page_size),
                heap: parts,
                classes,
                sites: Vec::new(),
                own_memory: 0,
                pymalloc: runtimes.pymalloc,
                sbcl: runtimes.sbcl,
                go: runtimes.go,
                jvm: runtimes.jvm,
                v8: runtimes.v8,
                sharing,
                census_refused,
            });
            self.peak_live = self.peak_live.max((live, pm.tick));
            self.live_timeline.push((pm.tick / 10, live, live));
            return;
        }
        if self.listed_only {
            // Their runtimes' censuses of this moment go unread.
            census_at(&mut self.pymalloc_pending, pm.tick);
            census_at(&mut self.sbcl_pending, pm.tick);
            census_at(&mut self.go_pending, pm.tick);
            census_at(&mut self.jvm_pending, pm.tick);
            census_at(&mut self.v8_pending, pm.tick);
            return;
        }
        let at = Moment {
            headers: heap::BlockHeaders::of_process(self.allocator, &self.code_maps),
            fork_residency_read: self.fork_residency.is_some(),
            own_memory: self.merger.own_memory_at(pm.tick),
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

    /// Lets go of the live blocks, kept by the merge, by page and for deferred snapshots,
    /// once every snapshot that needs them is evaluated: what the report goes on to do
    /// needs only their sums.
    pub(super) fn release_blocks(&mut self) {
        self.merger.release_blocks();
        self.heap_pages = None;
        self.deferred = VecDeque::new();
    }

    /// Evaluates the snapshots kept for later (see `evaluate_next`), in order.
    pub(super) fn evaluate_deferred(&mut self, ctx: &Ctx) {
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
        let runtimes = self.runtimes_at(pm, &mut snap.parts);
        let sharing = self.sharing_at(pm, Some(&snap.parts), &runtimes.owners);
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
            pymalloc: runtimes.pymalloc,
            sbcl: runtimes.sbcl,
            go: runtimes.go,
            jvm: runtimes.jvm,
            v8: runtimes.v8,
            sharing,
            census_refused: false,
        });
    }
}

/// The runtimes' censuses taken with one snapshot, split by its residency, and their
/// pages by owner as the sharing's parts name them.
struct RuntimeParts {
    pymalloc: Option<PymallocParts>,
    sbcl: Option<SbclParts>,
    go: Option<GoParts>,
    jvm: Option<JvmParts>,
    v8: Option<V8Parts>,
    owners: [(&'static str, Option<Owners>); 5],
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
/// Heap censuses a stream keeps for its report (see `Stream::censuses`).
const CENSUSES_KEPT: usize = 64;

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
