//! What an analysis produces: plain data, serialisable as the `--json` report
//! (docs/report-json.md). Byte counts are integers; times are milliseconds since the
//! recording started.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::phases::PhaseKind;
use crate::symbols::Frame;

/// RSS at one moment, split into parts that add up to it (see PRODUCT.md, "The model").
/// `unexplained` is what remains when the sources disagree (e.g. the heap's resident pages
/// exceed RssAnon because the two were read a moment apart): the sum of every field
/// except `rss`, `rss_anon` and `heap_resident` equals `rss`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decomposition {
    pub rss: u64,
    pub live: u64,
    pub rounding: u64,
    /// The allocator's own bytes in heap pages that hold live data: a header before each
    /// block (glibc's chunk size field, 8 bytes; none under jemalloc, tcmalloc and
    /// mimalloc) and, in a `fragscope snapshot`, its structures inside the heap.
    pub allocator_overhead: u64,
    pub free_in_used_pages: u64,
    pub free_resident_pages: u64,
    pub lazy_free: u64,
    /// CPython's pymalloc arenas (resident), split in [`Snapshot::pymalloc`]; 0 for other
    /// programs; `None` (unknown) at a snapshot of a CPython process that has no census
    /// (their pages are then within `other_anon`).
    pub pymalloc_arenas: Option<u64>,
    /// SBCL's dynamic space (resident), split in [`Snapshot::sbcl`]; 0 for other
    /// programs; `None` (unknown) at a snapshot of an SBCL process that has no census.
    pub sbcl_dynamic_space: Option<u64>,
    /// A Go program's heap and stacks (resident), split in [`Snapshot::go`]; 0 for other
    /// programs; `None` (unknown) at a snapshot of a Go program that has no census.
    pub go_heap: Option<u64>,
    /// A JVM's Java heap (resident), split in [`Snapshot::jvm`]; 0 for other programs;
    /// `None` (unknown) at a snapshot of a JVM that has no census.
    pub jvm_heap: Option<u64>,
    /// A JVM's runtime areas its tables locate (code cache, Java thread stacks, card
    /// table; resident), with the same zero and `None`.
    pub jvm_runtime: Option<u64>,
    /// A Node.js process's V8 heap (its spaces' physical bytes, as V8 counts them), split
    /// in [`Snapshot::v8`]; 0 for other programs; `None` at a snapshot of a Node.js
    /// process without its figures.
    pub v8_heap: Option<u64>,
    pub other_anon: u64,
    pub file: u64,
    /// fragscope's own buffers in the traced process: shown, kept out of the other parts.
    pub fragscope_own: u64,
    pub unexplained: i64,
    /// RssAnon as /proc reported it, and the heap's resident bytes as pagemap showed them.
    pub rss_anon: u64,
    pub heap_resident: u64,
    /// The malloc heap's parts (`live` to `lazy_free`) are unknown: a `fragscope snapshot`
    /// whose census could not read the allocator (its resident pages are then within
    /// `other_anon`). They hold 0 and serialise as null.
    pub malloc_unknown: bool,
}

impl Serialize for Decomposition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let malloc = |v: u64| (!self.malloc_unknown).then_some(v);
        let mut m = s.serialize_struct("Decomposition", 19)?;
        m.serialize_field("rss", &self.rss)?;
        m.serialize_field("live", &malloc(self.live))?;
        m.serialize_field("rounding", &malloc(self.rounding))?;
        m.serialize_field("allocator_overhead", &malloc(self.allocator_overhead))?;
        m.serialize_field("free_in_used_pages", &malloc(self.free_in_used_pages))?;
        m.serialize_field("free_resident_pages", &malloc(self.free_resident_pages))?;
        m.serialize_field("lazy_free", &malloc(self.lazy_free))?;
        m.serialize_field("pymalloc_arenas", &self.pymalloc_arenas)?;
        m.serialize_field("sbcl_dynamic_space", &self.sbcl_dynamic_space)?;
        m.serialize_field("go_heap", &self.go_heap)?;
        m.serialize_field("jvm_heap", &self.jvm_heap)?;
        m.serialize_field("jvm_runtime", &self.jvm_runtime)?;
        m.serialize_field("v8_heap", &self.v8_heap)?;
        m.serialize_field("other_anon", &self.other_anon)?;
        m.serialize_field("file", &self.file)?;
        m.serialize_field("fragscope_own", &self.fragscope_own)?;
        m.serialize_field("unexplained", &self.unexplained)?;
        m.serialize_field("rss_anon", &self.rss_anon)?;
        m.serialize_field("heap_resident", &self.heap_resident)?;
        m.end()
    }
}

impl Decomposition {
    /// Bytes resident in the heap but not holding requested data (the allocator's headers
    /// included: they are what small blocks cost beyond their size).
    pub fn heap_waste(&self) -> u64 {
        self.rounding
            + self.allocator_overhead
            + self.free_in_used_pages
            + self.free_resident_pages
            + self.lazy_free
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OccupancyBucket {
    /// [lo_pct, hi_pct) of a page's bytes that are live; the first bucket (0, 0) is the
    /// resident heap pages with no live byte at all.
    pub lo_pct: u32,
    pub hi_pct: u32,
    pub pages: u64,
    pub live_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorView {
    pub t_ms: f64,
    pub source: String,
    pub values: BTreeMap<String, u64>,
    /// The allocator's figures beside fragscope's for the same quantity.
    pub comparisons: Vec<Comparison>,
}

/// One quantity as the allocator counts it and as fragscope measures it. They differ by
/// design in places (glibc counts chunk headers as in use; jemalloc's resident includes
/// its metadata): `difference` is shown, never hidden.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub quantity: String,
    pub allocator: u64,
    pub allocator_formula: String,
    pub fragscope: u64,
    pub fragscope_formula: String,
    pub difference: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub t_ms: f64,
    /// "periodic", "near_peak" or "exit".
    pub reason: String,
    #[serde(flatten)]
    pub parts: Decomposition,
    /// An RSS sample was near: without one, the parts that come from /proc (rss,
    /// rss_anon, other_anon, file, fragscope_own, unexplained) are not measured, not 0.
    pub rss_measured: bool,
    pub live_not_resident: u64,
    pub page_size: u64,
    pub used_pages: u64,
    pub empty_pages: u64,
    pub occupancy: Vec<OccupancyBucket>,
    /// The allocator's own statistics, answered just before this snapshot.
    pub allocator: Option<AllocatorView>,
    /// A CPython process's pymalloc arenas, from a census taken with the snapshot.
    pub pymalloc: Option<crate::pymalloc::PymallocParts>,
    /// An SBCL process's dynamic space, from a census taken with the snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sbcl: Option<crate::sbcl::SbclParts>,
    /// A Go program's heap, from a census of its spans taken with the snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go: Option<crate::golang::GoParts>,
    /// A JVM's Java heap, from a census of its regions or spaces taken with the snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jvm: Option<crate::jvm::JvmParts>,
    /// A Node.js process's V8 heap, as its isolates last counted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v8: Option<crate::v8::V8Parts>,
    /// Every heap this snapshot has figures for: resident, live and waste of each.
    pub heaps: Vec<crate::heaps::HeapFigures>,
    /// Runtime heaps the process runs (other snapshots have their census) that this
    /// snapshot has no census of: their figures here are unknown, not 0.
    pub missing_census: Vec<crate::heaps::Heap>,
    /// Resident pages shared with other processes (after fork: the parent, siblings,
    /// children) and the process's own, with smaps_rollup's Pss; absent from traces
    /// that did not read which pages are shared.
    pub sharing: Option<crate::sharing::Sharing>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    pub start_ms: f64,
    pub end_ms: f64,
    pub kind: PhaseKind,
    pub rss_max: u64,
    pub live_max: u64,
    pub live_end: u64,
    /// The last snapshot inside the phase, and its decomposition (none when no snapshot
    /// fell inside: record with a smaller --snapshot-ms).
    pub snapshot_t_ms: Option<f64>,
    pub decomposition: Option<Decomposition>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    pub t_ms: f64,
    pub rss: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    /// Requested and usable bytes live at that moment, from the trace.
    pub live: u64,
    pub usable: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeClass {
    /// The allocator's usable size for the class (0: pages freed before any snapshot saw
    /// who used them).
    pub usable: u64,
    pub objects: u64,
    pub live_bytes: u64,
    pub usable_bytes: u64,
    pub pages: u64,
    pub mean_occupancy: f64,
    pub retained_free: u64,
    /// Retained free bytes at the first snapshot, for growth.
    pub retained_free_first: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassPoint {
    pub usable: u64,
    pub live_bytes: u64,
    pub retained_free: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassHistory {
    pub t_ms: f64,
    pub classes: Vec<ClassPoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Site {
    /// The trace's stack id (of the stack that weighs most, when `stacks` > 1).
    pub stack: u32,
    /// The first frame outside allocator wrappers, as "function (file:line)".
    pub label: String,
    pub frames: Vec<Frame>,
    /// Call stacks summed in this site: those with the same label.
    pub stacks: usize,
    /// At the focus snapshot (estimates when stacks were sampled).
    pub live_objects: u64,
    pub live_bytes: u64,
    pub pinning_objects: u64,
    pub pinned_pages: f64,
    pub pinned_waste: u64,
    /// Over the whole run.
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Live at the end of the trace (leaked, when the process ended).
    pub leaked_objects: u64,
    pub leaked_bytes: u64,
    /// Freed by the thread that allocated them before it allocated anything else.
    pub temporary_allocations: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sites {
    /// "every", "sampled" (figures are estimates) or "none" (no stacks recorded).
    pub stacks: String,
    pub t_ms: Option<f64>,
    pub sparse_pct: u32,
    pub by_live_bytes: Vec<Site>,
    pub by_pinned_waste: Vec<Site>,
    pub by_allocated_bytes: Vec<Site>,
    pub by_allocations: Vec<Site>,
    pub by_leaked_bytes: Vec<Site>,
    pub by_temporary_allocations: Vec<Site>,
}

/// Leaks and temporary allocations, as heaptrack counts them (exact; by site in `Sites`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeakFacts {
    /// The process ended (exit, exec) within the trace: what is live at the end was
    /// leaked; otherwise it is only live when the trace ends.
    pub at_exit: bool,
    /// Live at the end, not counting `inherited_live_*`.
    pub leaked_bytes: u64,
    pub leaked_blocks: u64,
    /// Blocks a forked process inherited from its parent at the fork and still held at
    /// the end (requested bytes): its parent's data, not counted as leaked.
    pub inherited_live_blocks: u64,
    pub inherited_live_bytes: u64,
    /// Blocks freed by the thread that allocated them before it allocated another.
    pub temporary_allocations: u64,
    pub temporary_bytes: u64,
    /// Every block allocated, for scale.
    pub allocations: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headline {
    /// None when no RSS sample was taken (a run shorter than the first 10 ms sample, or
    /// a trace cut before it).
    pub peak_rss: Option<u64>,
    pub peak_rss_t_ms: Option<f64>,
    /// None when the malloc heap is unknown (a `fragscope snapshot` whose census could
    /// not read the allocator).
    pub peak_live: Option<u64>,
    pub peak_live_t_ms: Option<f64>,
    /// The snapshot with the most heap waste, which the sentence is about.
    pub focus_t_ms: Option<f64>,
    /// Heap resident / live at the focus snapshot, over every heap it knows.
    pub fragmentation_ratio: Option<f64>,
    /// The heap whose waste the sentence is about (the one with the most waste at the
    /// focus snapshot, or malloc's when the sentence is not about waste).
    pub heap: Option<crate::heaps::Heap>,
    /// The part that dominates the waste there ("free_in_used_pages", ...).
    pub dominant: Option<String>,
    pub sentence: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeFacts {
    pub forced_allocs: u64,
    /// Frees of blocks the trace never saw allocated, other than those counted apart
    /// below (`inherited_frees`, and an attached process's blocks from before the attach).
    pub unknown_frees: u64,
    /// A forked process whose parent's heap at the fork is not in the trace (older
    /// traces): its frees of blocks it never saw allocated, which it inherited. 0 for
    /// other processes, and when `inherited_blocks` is known.
    pub inherited_frees: u64,
    /// The pid of the process this one was forked from, when it was.
    pub forked_from: Option<u32>,
    /// A forked process starts from its parent's live blocks at the fork: how many, and
    /// their requested bytes. They are live data from the start and their frees are
    /// known. Null when not forked, or when the parent's heap at the fork is not known.
    pub inherited_blocks: Option<u64>,
    pub inherited_bytes: Option<u64>,
    /// Of those, blocks whose address it allocated again with no free in the trace: freed
    /// before the fork without a record (the parent's own `forced_allocs`), or by another
    /// thread of the parent around the fork. Not counted in `forced_allocs`.
    pub inherited_stale: u64,
    /// The parent's calls in the trace end before the fork (a cut trace): the heap it
    /// started from is its parent's at their end, the nearest known.
    pub inherited_from_parent_end: bool,
    pub late: u64,
    pub lost_events: u64,
    /// Calls that waited on disk for slow threads (order kept, memory bounded).
    pub spilled: u64,
    /// Why calls that waited could not go to disk (or come back), if so.
    pub spill_problem: Option<String>,
    /// The process was already running when recording began (`record -p`): its frees of
    /// blocks allocated before then are among `unknown_frees`, unless its heap could be
    /// read then (`starting_blocks`).
    pub attached: bool,
    /// The blocks (and their usable bytes) its heap held when recording began, read from
    /// glibc's heap; null when it was not read (another allocator).
    pub starting_blocks: Option<u64>,
    pub starting_bytes: Option<u64>,
    /// Of those, blocks freed before the first recorded call (their address was
    /// allocated again with no free in the trace).
    pub starting_stale: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessBrief {
    pub stream: u32,
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
    pub calls: u64,
    /// None when no RSS sample was taken.
    pub peak_rss: Option<u64>,
    pub peak_live: u64,
    pub end: String,
    /// The traced process it was forked from.
    pub forked_from: Option<u32>,
    /// The live bytes of its parent's heap it started from, when the fork's heap is known.
    pub inherited_bytes: Option<u64>,
    /// Its pages shared and its own, at its last snapshot that read them.
    pub sharing: Option<BriefSharing>,
}

/// A process's sharing at one snapshot, for the list of processes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BriefSharing {
    pub t_ms: f64,
    /// smaps_rollup's Rss, Pss, Shared_* and Private_*.
    pub rollup: Option<crate::sharing::RollupSharing>,
    /// The mappings that can hold heap objects, by owner.
    pub anonymous: crate::sharing::Owners,
    /// Resident bytes of those mappings as it started, when it was forked.
    pub inherited: Option<u64>,
}

/// A process image the program ran that fragscope could not trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UntracedImage {
    pub pid: u32,
    /// The pid of the traced image that exec'd it (None: the program itself).
    pub exec_by_pid: Option<u32>,
    pub t_ms: f64,
    pub path: String,
    pub argv: Vec<String>,
    /// Why, and what to do.
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub trace: String,
    pub truncated: bool,
    pub damage: Option<String>,
    /// Chunks passed over because they did not decode (the rest was read).
    pub skipped: Option<String>,
    pub stacks: String,
    /// An aggregated trace (`record --aggregate`): its calls between snapshots are summed
    /// by site; absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub aggregated: bool,
    pub duration_ms: f64,
    /// The process analysed below (the one with the highest RSS unless one was chosen).
    pub stream: u32,
    pub pid: u32,
    pub argv: Vec<String>,
    pub allocator: Option<String>,
    /// An allocator linked into the program, whose calls the trace does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linked_allocator: Option<crate::linked_allocator::LinkedAllocatorFacts>,
    pub calls: u64,
    pub merge: MergeFacts,
    pub headline: Headline,
    pub timeline: Vec<TimelinePoint>,
    pub snapshots: Vec<Snapshot>,
    /// Indexes into `snapshots`.
    pub peak_snapshot: Option<usize>,
    pub end_snapshot: Option<usize>,
    pub focus_snapshot: Option<usize>,
    /// How the focus snapshot was asked for (`--at`); `None`: the one with the most heap
    /// waste.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub focus_asked: Option<String>,
    pub phases: Vec<Phase>,
    /// At the focus snapshot.
    pub size_classes: Vec<SizeClass>,
    pub size_class_history: Vec<ClassHistory>,
    pub sites: Sites,
    /// Every allocation site with its stack, sorted by stack id; only with
    /// `Options::all_sites` (absent from the JSON otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub all_sites: Vec<Site>,
    pub processes: Vec<ProcessBrief>,
    /// Images whose calls are missing: they could not be traced.
    pub untraced: Vec<UntracedImage>,
    /// The process explained was named with `--pid` (else: the largest heap).
    pub chosen_by_pid: bool,
    pub leaks: LeakFacts,
    /// A CPython process: the snapshot whose pymalloc arenas hold the most free space.
    pub pymalloc_snapshot: Option<usize>,
    /// The snapshot whose shared and private pages the views show: of a forked process
    /// the one with the most copied since the fork, else the focus when it read them,
    /// else the last that did (see `sharing::shown`).
    pub sharing_snapshot: Option<usize>,
    /// Why a CPython process has no pymalloc census.
    pub pymalloc_note: Option<String>,
    /// A CPython process: the Python lines whose sampled objects survive in pymalloc's
    /// arenas, at the census of `pymalloc_snapshot`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python_sites: Option<crate::python_sites::PythonSites>,
    /// A CPython process with no Python lines: why none were sampled (an unknown release,
    /// a debug or free-threaded build, `--stacks none`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python_sites_note: Option<String>,
    /// An SBCL process: the Lisp functions that allocated, from sampled region refills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lisp_sites: Option<crate::lisp_sites::LispSites>,
    /// An SBCL process with a census and no Lisp lines: why (its release, --stacks none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lisp_sites_note: Option<String>,
    /// An SBCL process: the snapshot whose dynamic space holds the most free space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sbcl_snapshot: Option<usize>,
    /// Why an SBCL process has no census.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sbcl_note: Option<String>,
    /// A Go program: the snapshot whose heap holds the most free space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_snapshot: Option<usize>,
    /// Why a Go program has no census of its heap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_note: Option<String>,
    /// A JVM: the snapshot whose Java heap holds the most free space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jvm_snapshot: Option<usize>,
    /// Why a JVM has no census of its heap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jvm_note: Option<String>,
    /// A Node.js process: the snapshot whose V8 heap holds the most free space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v8_snapshot: Option<usize>,
    /// Why a Node.js process has no V8 heap figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v8_note: Option<String>,
    /// A Go program that keeps a heap profile: its allocation stacks at the census with
    /// the most waste, joined with the spans their sampled objects lie in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_sites: Option<crate::golang::GoSites>,
    /// A Go program whose heap profile was not read: why (linked without the profiler).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_sites_note: Option<String>,
    /// A `fragscope snapshot` of a running process: the census that stands for the calls
    /// (absent from recordings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotFacts>,
}

/// How a snapshot was taken and what the allocator's metadata said.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotFacts {
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc", "ghc" or "unknown".
    pub allocator: String,
    /// Held stopped while read; false with --no-stop (the figures may not hold together).
    pub stopped: bool,
    pub pause_ms: f64,
    /// Why the allocator's metadata was not read (the page-level picture only).
    pub note: Option<String>,
    pub glibc: Option<GlibcFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcmalloc: Option<TcmallocFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jemalloc: Option<JemallocFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mimalloc: Option<MimallocFigures>,
}

/// mimalloc's heap as its pages count it, with the census behind them. Blocks at their
/// block size; resident bytes by pagemap.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MimallocFigures {
    /// Blocks the program holds.
    pub in_use_bytes: u64,
    /// Free blocks on the pages' free lists (carved, not handed out).
    pub free_block_bytes: u64,
    /// Blocks other threads freed that wait on thread-free and delayed-free lists.
    pub thread_freed_bytes: u64,
    /// Resident bytes of the pages with a block in use, and of the free pages mimalloc
    /// keeps (empty pages, free spans, arena blocks with no segment).
    pub used_page_resident: u64,
    pub free_pages_resident: u64,
    /// Pages of every block size.
    pub pages: u64,
    /// The census: segments, and pages by block size.
    pub heap: fragscope_trace::heap_census::MimallocHeap,
}

/// jemalloc's heap as its own statistics count it (`mallctl`'s `stats.*`), with the
/// census behind them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JemallocFigures {
    /// `stats.allocated`, `stats.active`, `stats.resident`, `stats.mapped`.
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub resident_bytes: u64,
    pub mapped_bytes: u64,
    /// Allocated less the threads' caches: what the program holds.
    pub in_use_bytes: u64,
    /// Regions waiting in threads' caches (`tcache_bytes`).
    pub tcache_bytes: u64,
    /// Free regions inside slabs in use.
    pub slab_free_bytes: u64,
    /// Free pages kept: dirty (resident) and muzzy (`pdirty`, `pmuzzy` in bytes).
    pub dirty_bytes: u64,
    pub muzzy_bytes: u64,
    /// The allocator's metadata, resident.
    pub metadata_resident: u64,
    /// Slabs of the small size classes, and those with a free region.
    pub slabs: u64,
    pub nonfull_slabs: u64,
    /// The census: every arena, small size class and large class in use.
    pub heap: fragscope_trace::heap_census::JemallocHeap,
}

/// tcmalloc's heap as its own statistics count it (MallocExtension's properties), with
/// the census behind them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcmallocFigures {
    /// `generic.current_allocated_bytes`.
    pub in_use_bytes: u64,
    /// `tcmalloc.central_cache_free_bytes`, `tcmalloc.transfer_cache_free_bytes`,
    /// `tcmalloc.thread_cache_free_bytes`.
    pub central_bytes: u64,
    pub transfer_bytes: u64,
    pub thread_cache_bytes: u64,
    /// Spans of the size classes.
    pub spans: u64,
    /// The census: page heap totals and every size class.
    pub heap: fragscope_trace::heap_census::TcmallocHeap,
}

/// glibc malloc's heap, whole. Bytes are whole chunks, headers included, as glibc counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GlibcFigures {
    pub version: String,
    pub layout_source: String,
    /// Chunks the program holds (arenas and mmapped).
    pub in_use_chunks: u64,
    pub in_use_bytes: u64,
    /// What the program can use of them: the sum of their malloc_usable_size, which is
    /// `in_use_bytes` less each chunk's header (8 bytes, 16 for a mmapped one).
    pub usable_bytes: u64,
    /// Free chunks in the bins, the fastbins and the threads' caches, and the top chunks.
    pub free_chunks: u64,
    pub free_bytes: u64,
    pub fastbin_chunks: u64,
    pub fastbin_bytes: u64,
    pub tcache_chunks: u64,
    pub tcache_bytes: u64,
    pub top_bytes: u64,
    /// Heap and arena headers, threads' cache tables, fenceposts.
    pub overhead_bytes: u64,
    /// Resident bytes malloc_trim(0) would return: predicted, never done.
    pub trimmable_bytes: u64,
    pub mmapped_chunks: u64,
    pub mmapped_bytes: u64,
    pub mmapped_resident: u64,
    pub thread_caches: u64,
    /// The same heap as mallinfo2 counts it: uordblks + hblkhd, and fordblks.
    pub mallinfo_in_use: u64,
    pub mallinfo_free: u64,
    pub bytes_read: u64,
    /// Each arena as the census read it.
    pub arenas: Vec<fragscope_trace::heap_census::GlibcArena>,
}
