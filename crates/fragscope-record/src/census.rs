//! Censuses of runtime heaps malloc never sees, taken with each page-residency snapshot
//! and read from outside (fragscope-census): a GHC program's block descriptors (so it
//! runs without a heap-profile census of its own; on the census thread) and a CPython
//! process's pymalloc pools (a few milliseconds, taken with the snapshot itself: its
//! residency splits them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fragscope_census::allocators::LinkedAllocator;
use fragscope_census::ghc::{census, CensusError, CensusLimits, GhcRts, RtsInfo};
use fragscope_census::golang::{GoCensusError, GoRuntime};
use fragscope_census::jemalloc::{self, JemallocLayout};
use fragscope_census::jvm::HotSpot;
use fragscope_census::pymalloc::{self, Pymalloc};
use fragscope_census::sbcl::{self, SbclRuntime};
use fragscope_census::v8_inspector::V8Inspector;
use fragscope_census::{Pause, ProcessMemory};
use fragscope_trace::go_heap::GoCensus;
use fragscope_trace::heap_census::{AllocatorHeap, HeapCensus};
use fragscope_trace::jvm_heap::JvmCensus;
use fragscope_trace::records::{GhcBlocks, GhcCensus, PymallocCensus, SnapshotReason};
use fragscope_trace::sbcl_heap::SbclCensus;
use fragscope_trace::v8_heap::{V8Census, V8Heap, V8Space};

/// What a stream's census can be.
enum Target {
    /// Not a program whose runtime heap fragscope reads (or censuses are off).
    None,
    /// A CPython process: its pymalloc pools.
    Python { layout: Pymalloc, refused: u32 },
    /// An SBCL process: its dynamic space, and the object walks' budget (see
    /// [`Censuses::take_sbcl`]).
    Sbcl {
        runtime: Box<SbclRuntime>,
        refused: u32,
        first_census: Instant,
        /// How long the walks so far held the program.
        walked: Duration,
        /// What the next walk is expected to cost (none before a first census).
        next_walk: Option<Duration>,
    },
    /// A Go program: its runtime's spans.
    Go {
        runtime: Box<GoRuntime>,
        refused: u32,
    },
    /// A JVM: its collector's regions or spaces.
    Jvm { jvm: Box<HotSpot>, refused: u32 },
    /// A program with a jemalloc linked into it (its calls never reach the interposer):
    /// jemalloc's own metadata.
    Jemalloc {
        layout: Arc<JemallocLayout>,
        refused: u32,
    },
    Ready {
        rts: Arc<GhcRts>,
        last_long_stop: Option<Instant>,
        /// Megablocks at the last census: a heap that stopped growing is where a
        /// liveness scan matters (live data fell, or holds).
        last_megablocks: u64,
        /// Censuses refused in a row: one stop may land while the RTS is setting its
        /// heap up; only a refusal that repeats says the layout is not the one read.
        refused: u32,
        /// Blocks in use at the last census whose liveness scan was made.
        scanned_blocks: Option<u64>,
    },
}

/// A census may stop the program for a whole liveness scan (when a collection spoilt
/// the one made while it ran, and the heap has not grown since the census before) at
/// most this often: tens to hundreds of milliseconds, now and then.
const LONG_STOP_EVERY: Duration = Duration::from_secs(5);

/// Censuses taken again, 4, 8 and 16 ms later, when the first found the RTS's counts
/// in flux.
const RETRIES_IN_A_COLLECTION: u32 = 3;

/// A GHC census of `pid`. A stop inside a collection finds the RTS's counts in flux
/// (blocks moved from one list to another, megablocks taken for the to-space): the
/// collection is let finish and the census taken again, a few times, before it is
/// refused. `before` runs before each attempt; what it returned for the one kept comes
/// back with it (the recorder's clock).
pub(crate) fn ghc_census_outside_collections<T>(
    pid: u32,
    rts: &GhcRts,
    limits: CensusLimits,
    before: impl Fn() -> T,
) -> (T, Result<GhcBlocks, CensusError>) {
    let mut attempt = 0;
    loop {
        let t = before();
        match census(pid, rts, limits) {
            Err(CensusError::Inconsistent(_)) if attempt < RETRIES_IN_A_COLLECTION => {
                std::thread::sleep(Duration::from_millis(4 << attempt));
                attempt += 1;
            }
            result => return (t, result),
        }
    }
}

/// Refused censuses in a row that make a note in the trace.
const REFUSALS_TO_NOTE: u32 = 3;

/// Counts one more refused census in a row; the note to write when the refusals reach
/// [`REFUSALS_TO_NOTE`] (once): `what` names the census ("pymalloc").
fn refusal(refused: &mut u32, what: &str, why: &str) -> Option<String> {
    *refused += 1;
    (*refused == REFUSALS_TO_NOTE)
        .then(|| format!("{REFUSALS_TO_NOTE} {what} censuses in a row were refused: {why}"))
}

/// A pause longer than this counts as a long stop.
const LONG_STOP: Duration = Duration::from_millis(20);

/// The census state of a recording: which streams run a GHC RTS fragscope can read.
pub struct Censuses {
    enabled: bool,
    /// `+RTS --info` by executable, asked once.
    rts_info: Mutex<HashMap<PathBuf, Result<RtsInfo, String>>>,
    targets: Mutex<HashMap<u32, Target>>,
    /// Streams found not to run SBCL (its detection reads the executable).
    not_sbcl: Mutex<std::collections::HashSet<u32>>,
    /// Streams found not to run Go (its detection reads the executable too).
    not_go: Mutex<std::collections::HashSet<u32>>,
    /// Streams running a JVM whose tables could not be read (noted once).
    jvm_unreadable: Mutex<std::collections::HashSet<u32>>,
    /// Where Node.js processes write their V8 heap's figures, one file per isolate named
    /// "PID-THREADID" (`runtime/v8_heap.js`).
    v8_dir: Option<PathBuf>,
    /// How often they write them, in ms.
    v8_every_ms: u64,
    /// Node.js processes asked through their inspector instead (`record -p`: the module
    /// cannot be loaded into a running process), by stream; None once it failed.
    v8_inspectors: Mutex<HashMap<u32, Option<V8Inspector>>>,
    /// Streams found to have no jemalloc linked into their program.
    not_jemalloc: Mutex<std::collections::HashSet<u32>>,
    /// The allocator linked into each program seen, by its path.
    linked_programs: Mutex<HashMap<PathBuf, Option<LinkedAllocator>>>,
}

impl Censuses {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            rts_info: Mutex::default(),
            targets: Mutex::default(),
            not_sbcl: Mutex::default(),
            not_go: Mutex::default(),
            jvm_unreadable: Mutex::default(),
            v8_dir: None,
            v8_every_ms: 100,
            v8_inspectors: Mutex::default(),
            not_jemalloc: Mutex::default(),
            linked_programs: Mutex::default(),
        }
    }

    /// Reads the V8 heap figures Node.js processes write into `dir` every `every_ms`.
    pub fn watch_v8(&mut self, dir: PathBuf, every_ms: u64) {
        self.v8_dir = Some(dir);
        self.v8_every_ms = every_ms;
    }

    /// Asks stream `stream`'s V8 heap of its Node.js process through its inspector at each
    /// snapshot (see [`V8Inspector`]), opened at the first.
    pub fn ask_v8_by_inspector(&self, stream: u32, pid: u32) {
        let session = V8Inspector::open(pid).map_err(|why| {
            eprintln!("fragscope: note: process {pid}'s V8 heap will not be read: {why}");
        });
        self.v8_inspectors
            .lock()
            .unwrap()
            .insert(stream, session.ok());
    }

    /// Closes the inspectors opened for the recording (those open before stay open).
    pub fn close_v8_inspectors(&self) {
        self.v8_inspectors.lock().unwrap().clear();
    }

    /// The V8 heap of stream `stream` (process `pid`) as its isolates last wrote it, when
    /// it is a Node.js process that loaded the recording's module, their figures summed;
    /// or as its inspector gives it now, when it is asked so.
    pub fn take_v8(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<V8Census> {
        // At exit the isolate's heap is being torn down: its last figures are no moment
        // of the run.
        if reason == SnapshotReason::Exit || !self.enabled {
            return None;
        }
        if let Some(session) = self.v8_inspectors.lock().unwrap().get_mut(&stream) {
            let asked = session.as_mut()?.heap();
            if asked.is_err() {
                // Said once: the session is not asked again.
                *session = None;
            }
            return Some(V8Census {
                stream,
                tick,
                reason,
                result: asked.map_err(|e| format!("no V8 heap figures: {e}")),
            });
        }
        let dir = self.v8_dir.as_ref()?;
        let prefix = format!("{pid}-");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut heap = V8Heap::default();
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(&prefix) || name.ends_with(".tmp") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(entry.path()) else {
                continue;
            };
            if let Some(written_ms) = add_isolate(&mut heap, &text) {
                heap.isolates += 1;
                heap.age_ms = heap.age_ms.max(now_ms.saturating_sub(written_ms));
            }
        }
        // An isolate whose event loop was busy (a long synchronous stretch) wrote its
        // figures too long ago to be this moment's: the snapshot has none, rather than
        // stale ones.
        let fresh = heap.age_ms <= 2 * self.v8_every_ms + 50;
        (heap.isolates > 0 && fresh).then_some(V8Census {
            stream,
            tick,
            reason,
            result: Ok(heap),
        })
    }

    /// Asks `program`'s RTS about itself now, before the program runs: during the
    /// recording, the recorder reaps every child it has, this one's included.
    pub fn learn(&self, program: &Path) {
        if !self.enabled {
            return;
        }
        let exe = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
        let info = RtsInfo::query(&exe, None);
        self.rts_info.lock().unwrap().insert(exe, info);
    }

    /// A census of stream `stream` (process `pid`), or a note saying why it has none (the
    /// first time only); `None` for a process that is not a GHC program, or whose RTS
    /// holds no heap at the moment (starting, shutting down).
    pub fn take(
        &self,
        stream: u32,
        pid: u32,
        tick: impl Fn() -> u64,
        reason: SnapshotReason,
    ) -> Option<GhcCensus> {
        // By the time the program calls exit, the RTS has shut its storage manager down
        // and freed part of its heap: a census then describes no moment of the run.
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        let mut targets = self.targets.lock().unwrap();
        let first_tick = tick();
        let note = |result| GhcCensus {
            stream,
            tick: first_tick,
            reason,
            result,
        };
        // A long stop is allowed when none was made lately, up to the heap size of the
        // census before (a heap that grows is being built, and its scan would be stale).
        let (rts, stop_when_spoilt) = match targets.get(&stream) {
            Some(
                Target::None
                | Target::Python { .. }
                | Target::Sbcl { .. }
                | Target::Go { .. }
                | Target::Jvm { .. }
                | Target::Jemalloc { .. },
            ) => return None,
            Some(Target::Ready {
                rts,
                last_long_stop,
                last_megablocks,
                ..
            }) => (
                rts.clone(),
                last_long_stop
                    .is_none_or(|t| t.elapsed() >= LONG_STOP_EVERY)
                    .then_some(*last_megablocks),
            ),
            None => match self.resolve(pid) {
                None => {
                    targets.insert(stream, Target::None);
                    return None;
                }
                Some(Err(why)) => {
                    targets.insert(stream, Target::None);
                    return Some(note(Err(why)));
                }
                Some(Ok(rts)) => {
                    let rts = Arc::new(rts);
                    targets.insert(
                        stream,
                        Target::Ready {
                            rts: rts.clone(),
                            last_long_stop: None,
                            last_megablocks: 0,
                            refused: 0,
                            scanned_blocks: None,
                        },
                    );
                    (rts, None)
                }
            },
        };
        drop(targets);
        let limits = CensusLimits {
            stop_when_spoilt,
            ..CensusLimits::default()
        };
        let (tick, result) = ghc_census_outside_collections(pid, &rts, limits, &tick);
        let note = |result| GhcCensus {
            stream,
            tick,
            reason,
            result,
        };
        // Live data fell by a quarter or more since the last scan, and this census's scan
        // was spoilt by a collection: what keeps the pinned blocks now is what the report
        // is about, so the census is taken again with the program stopped for its scan.
        let fell = |b: &fragscope_trace::records::GhcBlocks| {
            let targets = self.targets.lock().unwrap();
            matches!(targets.get(&stream), Some(Target::Ready { scanned_blocks: Some(s), .. })
                if b.pinned_liveness.is_none() && b.blocks_in_use() * 4 < s * 3)
        };
        let result = match result {
            Ok(b) if fell(&b) => {
                let stopped = CensusLimits {
                    stopped_scan_bytes: limits.scan_bytes,
                    stop_when_spoilt: None,
                    ..limits
                };
                census(pid, &rts, stopped).or(Ok(b))
            }
            other => other,
        };
        match result {
            Ok(blocks) => {
                if let Some(Target::Ready {
                    last_long_stop,
                    last_megablocks,
                    refused,
                    scanned_blocks,
                    ..
                }) = self.targets.lock().unwrap().get_mut(&stream)
                {
                    *refused = 0;
                    *last_megablocks = blocks.megablocks;
                    if blocks.pinned_liveness.is_some() {
                        *scanned_blocks = Some(blocks.blocks_in_use());
                    }
                    if Duration::from_micros(blocks.pause_us) > LONG_STOP {
                        *last_long_stop = Some(Instant::now());
                    }
                }
                Some(note(Ok(blocks)))
            }
            Err(CensusError::NoHeap | CensusError::Unreadable(_)) => None,
            Err(CensusError::Inconsistent(why)) => {
                let mut targets = self.targets.lock().unwrap();
                let Some(Target::Ready { refused, .. }) = targets.get_mut(&stream) else {
                    return None;
                };
                refusal(refused, "block", &why).map(|n| note(Err(n)))
            }
        }
    }

    /// A pymalloc census of stream `stream` (process `pid`) if it runs CPython, or a note
    /// saying why it has none (the first time, or after a few refusals in a row).
    pub fn take_pymalloc(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<PymallocCensus> {
        // At exit CPython's finalization has freed part of its objects: no moment of the
        // run.
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        let note = |result| PymallocCensus {
            stream,
            tick,
            reason,
            result,
        };
        let known = match self.targets.lock().unwrap().get(&stream) {
            Some(Target::Python { layout, .. }) => Some(Some(*layout)),
            Some(_) => Some(None),
            None => None,
        };
        let layout = match known {
            Some(Some(layout)) => layout,
            Some(None) => return None,
            // Not known yet: a CPython process is told here, anything else by `take`.
            None => match Pymalloc::detect(pid)? {
                Ok(layout) => {
                    self.targets
                        .lock()
                        .unwrap()
                        .insert(stream, Target::Python { layout, refused: 0 });
                    layout
                }
                Err(why) => {
                    self.targets.lock().unwrap().insert(stream, Target::None);
                    return Some(note(Err(why)));
                }
            },
        };
        let result = pymalloc::census(pid, &layout);
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Python { refused, .. }) = targets.get_mut(&stream) else {
            return None;
        };
        match result {
            Ok(pools) => {
                *refused = 0;
                Some(note(Ok(pools)))
            }
            Err(CensusError::NoHeap | CensusError::Unreadable(_)) => None,
            Err(CensusError::Inconsistent(why)) => {
                refusal(refused, "pymalloc", &why).map(|n| note(Err(n)))
            }
        }
    }

    /// An SBCL census of stream `stream` (process `pid`) if it runs SBCL, or a note saying
    /// why it has none (the first time, or after a few refusals in a row). The page table
    /// is read at every snapshot (about a millisecond); the objects are walked and marked
    /// from the roots too when the walks so far and the next one together hold the
    /// program for at most 1/20 of the time since the first census (walk and mark read
    /// every used byte and every reachable object; see ARCHITECTURE.md for the cost;
    /// before a first one it is expected to take 2 ms per MiB in use).
    pub fn take_sbcl(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<SbclCensus> {
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        let note = |result| SbclCensus {
            stream,
            tick,
            reason,
            result,
        };
        let known = self.targets.lock().unwrap().get(&stream).map(|t| match t {
            Target::Sbcl {
                runtime,
                first_census,
                walked,
                next_walk,
                ..
            } => Some((
                runtime.clone(),
                next_walk.is_some_and(|w| (*walked + w) * 20 <= first_census.elapsed()),
            )),
            _ => None,
        });
        let (runtime, objects) = match known {
            Some(Some(known)) => known,
            Some(None) => return None,
            None => {
                if self.not_sbcl.lock().unwrap().contains(&stream) {
                    return None;
                }
                match SbclRuntime::detect(pid) {
                    None => {
                        self.not_sbcl.lock().unwrap().insert(stream);
                        return None;
                    }
                    Some(Err(why)) => {
                        self.targets.lock().unwrap().insert(stream, Target::None);
                        return Some(note(Err(why)));
                    }
                    Some(Ok(runtime)) => {
                        let runtime = Box::new(runtime);
                        self.targets.lock().unwrap().insert(
                            stream,
                            Target::Sbcl {
                                runtime: runtime.clone(),
                                refused: 0,
                                first_census: Instant::now(),
                                walked: Duration::ZERO,
                                next_walk: None,
                            },
                        );
                        (runtime, false)
                    }
                }
            }
        };
        // The walk goes with a mark from the roots (live and garbage by generation),
        // within the same budget: its cost is the last one's.
        let result = sbcl::census(
            pid,
            &runtime,
            sbcl::CensusOptions {
                objects,
                mark: objects,
            },
        );
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Sbcl {
            refused,
            walked,
            next_walk,
            ..
        }) = targets.get_mut(&stream)
        else {
            return None;
        };
        match result {
            Ok(census) => {
                *refused = 0;
                if census.objects.is_some() {
                    let pause = Duration::from_micros(census.pause_us);
                    *walked += pause;
                    *next_walk = Some(pause);
                } else if next_walk.is_none() {
                    // Before a first walk and mark: 2 ms per MiB in use (measured: 1.6
                    // to 2.2, see ARCHITECTURE.md).
                    *next_walk = Some(Duration::from_millis(2 * (census.bytes_used >> 20)));
                }
                Some(note(Ok(census.to_record())))
            }
            Err(CensusError::NoHeap | CensusError::Unreadable(_)) => None,
            Err(CensusError::Inconsistent(why)) => {
                refusal(refused, "SBCL", &why).map(|n| note(Err(n)))
            }
        }
    }

    /// A census of the jemalloc linked into stream `stream`'s program (process `pid`),
    /// whose calls the interposer never sees, or a note saying why it has none (the first
    /// time, or after a few refusals in a row). The program is held while jemalloc's
    /// metadata and its heap's residency are read (a few milliseconds per 100 MiB).
    pub fn take_jemalloc(&self, stream: u32, pid: u32, tick: u64) -> Option<HeapCensus> {
        // At exit too: jemalloc's heap is whatever the program left in it (a census that
        // lands inside jemalloc is refused).
        if !self.enabled {
            return None;
        }
        let note = |result, pause: Option<Duration>| HeapCensus {
            stream,
            tick,
            allocator: "jemalloc".into(),
            stopped: pause.is_some(),
            pause_us: pause.map_or(0, |d| d.as_micros() as u64),
            result,
        };
        let known = match self.targets.lock().unwrap().get(&stream) {
            Some(Target::Jemalloc { layout, .. }) => Some(Some(layout.clone())),
            Some(_) => Some(None),
            None => None,
        };
        let layout = match known {
            Some(Some(layout)) => layout,
            Some(None) => return None,
            None => {
                if self.not_jemalloc.lock().unwrap().contains(&stream) {
                    return None;
                }
                // The program's own file, read once per program: a pre-fork server's
                // workers share it.
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
                let linked = self
                    .linked_programs
                    .lock()
                    .unwrap()
                    .entry(exe.clone())
                    .or_insert_with(|| fragscope_census::allocators::linked_allocator(&exe))
                    .clone()
                    .filter(|l| l.allocator == "jemalloc");
                let Some(linked) = linked else {
                    self.not_jemalloc.lock().unwrap().insert(stream);
                    return None;
                };
                let found = ProcessMemory::open(pid)
                    .map_err(|e| e.to_string())
                    .and_then(|mut mem| jemalloc::locate(pid, &mut mem, Some(&linked)));
                match found {
                    Err(why) => {
                        self.targets.lock().unwrap().insert(stream, Target::None);
                        return Some(note(Err(why), None));
                    }
                    Ok(layout) => {
                        let layout = Arc::new(layout);
                        let target = Target::Jemalloc {
                            layout: layout.clone(),
                            refused: 0,
                        };
                        self.targets.lock().unwrap().insert(stream, target);
                        layout
                    }
                }
            }
        };
        let (Ok(mut mem), Ok(pause)) = (ProcessMemory::open(pid), Pause::stop(pid)) else {
            // Gone, or not ours to read: nothing to say at this moment.
            return None;
        };
        // The residency that tells which of jemalloc's dirty pages and metadata are
        // resident, read while the program is held.
        let residency = crate::procfs::read_maps(pid, &mut HashMap::new()).and_then(|maps| {
            let heap: Vec<_> = maps
                .iter()
                .filter(|m| crate::procfs::may_hold_heap(m))
                .collect();
            crate::procfs::read_residency(pid, &heap, 4096)
        });
        let result = residency
            .ok_or_else(|| "its residency could not be read".to_string())
            .and_then(|r| jemalloc::census(&mut mem, &layout, &r));
        let held = pause.held();
        drop(pause);
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Jemalloc { refused, .. }) = targets.get_mut(&stream) else {
            return None;
        };
        match result {
            Ok(heap) => {
                *refused = 0;
                Some(note(Ok(AllocatorHeap::Jemalloc(heap)), Some(held)))
            }
            // No later census would be read: said at once, and not tried again.
            Err(why) if why.contains(jemalloc::NO_STATISTICS) => {
                targets.insert(stream, Target::None);
                Some(note(Err(why), Some(held)))
            }
            Err(why) => refusal(refused, "jemalloc", &why).map(|n| note(Err(n), Some(held))),
        }
    }

    /// A census of the Go heap of stream `stream` (process `pid`) if it is a Go program,
    /// or a note saying why it has none (the first time, or after a few refusals in a
    /// row). It holds the program for about 65 ms per GiB of heap.
    pub fn take_go(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<GoCensus> {
        // At exit the runtime may be tearing its heap down: no moment of the run.
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        let note = |result| GoCensus {
            stream,
            tick,
            reason,
            result,
        };
        let known = match self.targets.lock().unwrap().get(&stream) {
            Some(Target::Go { runtime, .. }) => Some(Some(runtime.clone())),
            Some(_) => Some(None),
            None => None,
        };
        let runtime = match known {
            Some(Some(runtime)) => runtime,
            Some(None) => return None,
            None => {
                if self.not_go.lock().unwrap().contains(&stream) {
                    return None;
                }
                match GoRuntime::detect(pid) {
                    None => {
                        self.not_go.lock().unwrap().insert(stream);
                        return None;
                    }
                    Some(Err(why)) => {
                        self.targets.lock().unwrap().insert(stream, Target::None);
                        return Some(note(Err(why)));
                    }
                    Some(Ok(runtime)) => {
                        let runtime = Box::new(runtime);
                        let target = Target::Go {
                            runtime: runtime.clone(),
                            refused: 0,
                        };
                        self.targets.lock().unwrap().insert(stream, target);
                        runtime
                    }
                }
            }
        };
        let result = match (ProcessMemory::open(pid), Pause::stop(pid)) {
            (Ok(mut mem), Ok(pause)) => {
                fragscope_census::golang::census_held(pid, &runtime, &mut mem, &mut Some(pause))
            }
            // Gone, or not ours to read: nothing to say at this moment.
            _ => return None,
        };
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Go { refused, .. }) = targets.get_mut(&stream) else {
            return None;
        };
        match result {
            Ok(heap) => {
                *refused = 0;
                Some(note(Ok(heap)))
            }
            Err(GoCensusError::Unreadable(_)) => None,
            Err(GoCensusError::Inconsistent(why)) => {
                refusal(refused, "Go heap", &why).map(|n| note(Err(n)))
            }
        }
    }

    /// A census of the Java heap of stream `stream` (process `pid`) if it runs a JVM, or
    /// a note saying why it has none (the first time, or after a few refusals in a row).
    /// A process is looked at again at every snapshot until it maps libjvm.so: the java
    /// launcher loads it after it starts.
    pub fn take_jvm(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<JvmCensus> {
        // At exit the JVM may be tearing its heap down: no moment of the run.
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        let note = |result| JvmCensus {
            stream,
            tick,
            reason,
            result,
        };
        // Another census's "not mine" (`Target::None`) does not say it is not a JVM.
        let known = match self.targets.lock().unwrap().get(&stream) {
            Some(Target::Jvm { jvm, .. }) => Some(jvm.clone()),
            Some(Target::None) | None => None,
            Some(_) => return None,
        };
        let jvm = match known {
            Some(jvm) => jvm,
            None if self.jvm_unreadable.lock().unwrap().contains(&stream) => return None,
            None => match HotSpot::detect(pid)? {
                Err(why) => {
                    self.jvm_unreadable.lock().unwrap().insert(stream);
                    return Some(note(Err(why)));
                }
                Ok(jvm) => {
                    let jvm = Box::new(jvm);
                    let target = Target::Jvm {
                        jvm: jvm.clone(),
                        refused: 0,
                    };
                    self.targets.lock().unwrap().insert(stream, target);
                    jvm
                }
            },
        };
        let result = match (ProcessMemory::open(pid), Pause::stop(pid)) {
            (Ok(mut mem), Ok(pause)) => {
                fragscope_census::jvm::census_held(pid, &jvm, &mut mem, &mut Some(pause))
            }
            // Gone, or not ours to read: nothing to say at this moment.
            _ => return None,
        };
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Jvm { refused, .. }) = targets.get_mut(&stream) else {
            return None;
        };
        match result {
            Ok(mut heap) => {
                *refused = 0;
                drop(targets);
                // Asked of the JVM once it runs again: it answers on a thread of its own.
                heap.native_memory = jvm.native_memory(pid);
                Some(note(Ok(heap)))
            }
            // Starting: no heap yet.
            Err(CensusError::NoHeap | CensusError::Unreadable(_)) => None,
            Err(CensusError::Inconsistent(why)) => {
                refusal(refused, "JVM heap", &why).map(|n| note(Err(n)))
            }
        }
    }

    /// Whether stream `stream` is a Go program whose heap the census reads.
    pub fn reads_go_heap(&self, stream: u32) -> bool {
        matches!(
            self.targets.lock().unwrap().get(&stream),
            Some(Target::Go { .. })
        )
    }

    /// `None`: not a GHC program. Err: a GHC program whose RTS the census cannot read.
    fn resolve(&self, pid: u32) -> Option<Result<GhcRts, String>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let elf = fragscope_census::image::map(&exe).ok()?;
        crate::ghc::inspect(&elf)?;
        let info = {
            let mut known = self.rts_info.lock().unwrap();
            known
                .entry(exe.clone())
                .or_insert_with(|| RtsInfo::query(&exe, None))
                .clone()
        };
        Some(match info {
            Ok(info) => GhcRts::new(&elf, info, Some(pid)),
            Err(e) => Err(format!(
                "no block census: fragscope could not learn which RTS {} runs ({e})",
                exe.display()
            )),
        })
    }
}

/// Adds one isolate's figures, as `runtime/v8_heap.js` writes them, to `heap`; the time
/// they were written (ms since the epoch), or None when the text is not such figures.
fn add_isolate(heap: &mut V8Heap, text: &str) -> Option<u64> {
    let mut written = None;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match (f.next(), f.next()) {
            (Some("time_ms"), Some(t)) => written = t.parse().ok(),
            (Some("node"), Some(v)) => heap.node = v.to_string(),
            (Some("space"), Some(name)) => {
                let n: Vec<u64> = f.filter_map(|x| x.parse().ok()).collect();
                let [size, used, available, physical] = n[..] else {
                    continue;
                };
                let space = match heap.spaces.iter_mut().find(|s| s.name == name) {
                    Some(s) => s,
                    None => {
                        heap.spaces.push(V8Space {
                            name: name.to_string(),
                            ..V8Space::default()
                        });
                        heap.spaces.last_mut().unwrap()
                    }
                };
                space.size += size;
                space.used += used;
                space.available += available;
                space.physical += physical;
            }
            (Some("heap"), Some(name)) => {
                let Some(v) = f.next().and_then(|x| x.parse::<u64>().ok()) else {
                    continue;
                };
                match heap.figures.iter_mut().find(|(n, _)| n == name) {
                    Some(x) => x.1 += v,
                    None => heap.figures.push((name.to_string(), v)),
                }
            }
            _ => {}
        }
    }
    written
}

#[cfg(test)]
mod v8_tests {
    use super::*;

    #[test]
    fn isolates_figures_are_summed() {
        let mut heap = V8Heap::default();
        let main = "time_ms 1000\nnode v20.20.2\nspace old_space 100 60 30 90\n\
                    heap external_memory 7\n";
        let worker = "time_ms 900\nnode v20.20.2\nspace old_space 10 6 3 9\n\
                      space new_space 8 1 3 8\nheap external_memory 5\nspace bad 1 2\n";
        assert_eq!(add_isolate(&mut heap, main), Some(1000));
        assert_eq!(add_isolate(&mut heap, worker), Some(900));
        assert_eq!(add_isolate(&mut heap, "not figures"), None);
        assert_eq!(heap.node, "v20.20.2");
        let old = &heap.spaces[0];
        assert_eq!(
            (old.size, old.used, old.available, old.physical),
            (110, 66, 33, 99)
        );
        assert_eq!(heap.spaces.len(), 2);
        assert_eq!(heap.figure("external_memory"), 12);
    }
}
