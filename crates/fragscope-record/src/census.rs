//! Censuses of runtime heaps malloc never sees, taken with each page-residency snapshot
//! and read from outside (fragscope-census): a GHC program's block descriptors (so it
//! runs without a heap-profile census of its own; on the census thread, [`Censuses::take`])
//! and, with the snapshot itself, every heap in [`RUNTIMES`] (CPython's pymalloc pools,
//! SBCL's dynamic space, Go's spans, a JVM's heap, Node's V8 heap, a jemalloc or mimalloc
//! linked into the program), each one [`RuntimeCensus`]: a process is found to run it once, then read
//! at each snapshot, its refusals counted.

mod runtimes;
mod v8;

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fragscope_census::allocators::LinkedAllocator;
use fragscope_census::ghc::{census, CensusError, CensusLimits, GhcRts, RtsInfo};
use fragscope_census::v8_inspector::V8Inspector;
use fragscope_trace::records::{GhcBlocks, GhcCensus, SnapshotReason};
use fragscope_trace::ChunkKind;

/// Every runtime heap read with a snapshot, in the order their chunks are written.
const RUNTIMES: [&dyn SnapshotCensus; 7] = [
    &runtimes::Python,
    &runtimes::Sbcl,
    &runtimes::Go,
    &runtimes::Jvm,
    &v8::V8,
    &runtimes::LinkedJemalloc,
    &runtimes::LinkedMimalloc,
];

/// Where a census is taken: its chunk's stream, tick and reason, and whether the process
/// is ending (an exit snapshot, but not the last one of a process `record -p` leaves
/// running: its runtimes' heaps are still a moment of its run).
#[derive(Clone, Copy)]
pub(crate) struct At {
    pub stream: u32,
    pub tick: u64,
    pub reason: SnapshotReason,
    pub ending: bool,
}

/// One census of a process at a snapshot, as the sampler asks for it: its chunk's kind
/// and body, or nothing to write.
pub(crate) trait SnapshotCensus: Sync {
    fn take(&self, censuses: &Censuses, at: At, pid: u32) -> Option<(ChunkKind, Vec<u8>)>;
}

/// What looking for a runtime in a process found.
pub(crate) enum Finding<T> {
    /// It runs the runtime, read this way.
    Runs(T),
    /// It runs the runtime, which the census cannot read: why (written once).
    Unreadable(String),
    /// It does not run it: not looked at again.
    Not,
    /// Nothing to tell yet (gone, not ours to read, the runtime not loaded yet): looked
    /// at again at the next snapshot.
    Unknown,
}

/// What one census of a process came to, with how long it held the program when the
/// chunk says so.
pub(crate) enum Reading<H> {
    Heap(H, Option<Duration>),
    /// Gone, not ours to read, or no heap at this moment: nothing to say.
    Nothing,
    /// Figures that do not hold together: refused, a note after a few in a row.
    Refused(String, Option<Duration>),
    /// No later census would be read either: said at once, and not tried again.
    Final(String, Option<Duration>),
}

/// A runtime heap read at each snapshot of a recording: the generic step
/// ([`Censuses::take_runtime`]) finds it once per process, keeps what it found, takes
/// the census and counts refusals in a row; a runtime says only how it is found, read
/// and written.
pub(crate) trait RuntimeCensus: Sync {
    /// Names it in the note on refusals in a row ("pymalloc").
    const NAME: &'static str;
    /// The chunk its census is written as.
    const KIND: ChunkKind;
    /// Whether its census is taken at the exit snapshot too (a runtime's heap is being
    /// torn down then: no moment of the run).
    const AT_EXIT: bool = false;
    /// Whether it is loaded after the process starts (libjvm.so, by the java launcher): a
    /// process another census found none of its own is looked at still, and one whose
    /// runtime cannot be read is left to the other censuses.
    const LOADED_LATE: bool = false;
    /// What finding it in a process learns (its layout), kept for the process.
    type Found: Clone + Send + 'static;
    /// What one census reads.
    type Heap;

    fn find(&self, censuses: &Censuses, pid: u32) -> Finding<Self::Found>;
    fn read(&self, pid: u32, found: &Self::Found) -> Reading<Self::Heap>;
    /// What a census taught about the process, kept for the next ones.
    fn learn(_found: &mut Self::Found, _heap: &Self::Heap) {}
    /// Finishes a census once the program runs again.
    fn complete(&self, _pid: u32, _found: &Self::Found, _heap: &mut Self::Heap) {}
    /// The chunk: the census, or the note saying why there is none.
    fn encode(at: At, result: Result<Self::Heap, String>, pause: Option<Duration>) -> Vec<u8>;
}

impl<R: RuntimeCensus> SnapshotCensus for R {
    fn take(&self, censuses: &Censuses, at: At, pid: u32) -> Option<(ChunkKind, Vec<u8>)> {
        censuses
            .take_runtime(self, at, pid)
            .map(|body| (R::KIND, body))
    }
}

/// What a [`RuntimeCensus`] keeps of a process.
struct Kept<T> {
    found: T,
    /// Censuses refused in a row.
    refused: u32,
}

/// What a stream's census can be.
enum Target {
    /// Not a program whose runtime heap fragscope reads (or censuses are off).
    None,
    /// A heap of [`RUNTIMES`]: what finding it learnt, a `Kept<R::Found>` of the runtime
    /// named `runtime`.
    Runtime {
        runtime: &'static str,
        kept: Box<dyn Any + Send>,
    },
    /// A GHC program's RTS.
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
    /// Streams a runtime's census does not look at again, by its name: found not to run
    /// it, or (a runtime loaded late) to run one it cannot read.
    passed_over: Mutex<HashSet<(&'static str, u32)>>,
    /// Where Node.js processes write their V8 heap's figures, one file per isolate named
    /// "PID-THREADID" (`runtime/v8_heap.js`).
    v8_dir: Option<PathBuf>,
    /// How often they write them, in ms.
    v8_every_ms: u64,
    /// Node.js processes asked through their inspector instead (`record -p`: the module
    /// cannot be loaded into a running process), by stream; None once it failed.
    v8_inspectors: Mutex<HashMap<u32, Option<V8Inspector>>>,
    /// The allocator linked into each program seen, by its path.
    linked_programs: Mutex<HashMap<PathBuf, Option<LinkedAllocator>>>,
}

impl Censuses {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            rts_info: Mutex::default(),
            targets: Mutex::default(),
            passed_over: Mutex::default(),
            v8_dir: None,
            v8_every_ms: 100,
            v8_inspectors: Mutex::default(),
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
            Some(Target::None | Target::Runtime { .. }) => return None,
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

    /// Whether stream `stream` is a Go program whose heap the census reads.
    pub fn reads_go_heap(&self, stream: u32) -> bool {
        matches!(
            self.targets.lock().unwrap().get(&stream),
            Some(Target::Runtime { runtime, .. }) if *runtime == runtimes::Go::NAME
        )
    }

    /// The censuses of every heap in [`RUNTIMES`] that process `pid` runs, at `at`, or
    /// the notes saying why it has none (the first time, or after a few refusals in a
    /// row), each handed to `write` as it is taken.
    pub fn take_runtimes(&self, at: At, pid: u32, mut write: impl FnMut(ChunkKind, Vec<u8>)) {
        for runtime in RUNTIMES {
            if let Some((kind, body)) = runtime.take(self, at, pid) {
                write(kind, body);
            }
        }
    }

    /// The allocator linked into `program`, read once per program: a pre-fork server's
    /// workers share it.
    fn linked_allocator(&self, program: PathBuf) -> Option<LinkedAllocator> {
        self.linked_programs
            .lock()
            .unwrap()
            .entry(program.clone())
            .or_insert_with(|| fragscope_census::allocators::linked_allocator(&program))
            .clone()
    }

    /// One census of `runtime` in stream `at.stream` (process `pid`): the process looked
    /// at (once, unless the runtime says to look again), then read; the chunk to write.
    fn take_runtime<R: RuntimeCensus>(&self, runtime: &R, at: At, pid: u32) -> Option<Vec<u8>> {
        if !self.enabled || (at.ending && !R::AT_EXIT) {
            return None;
        }
        let found = match self.known::<R>(at.stream) {
            Known::Mine(found) => found,
            Known::Another => return None,
            Known::Unknown => match self.find(runtime, at, pid) {
                Ok(found) => found,
                Err(note) => return note,
            },
        };
        let reading = runtime.read(pid, &found);
        let mut targets = self.targets.lock().unwrap();
        let kept = kept_mut::<R>(targets.get_mut(&at.stream))?;
        match reading {
            Reading::Heap(mut heap, pause) => {
                kept.refused = 0;
                R::learn(&mut kept.found, &heap);
                drop(targets);
                runtime.complete(pid, &found, &mut heap);
                Some(R::encode(at, Ok(heap), pause))
            }
            Reading::Nothing => None,
            Reading::Refused(why, pause) => refusal(&mut kept.refused, R::NAME, &why)
                .map(|note| R::encode(at, Err(note), pause)),
            Reading::Final(why, pause) => {
                targets.insert(at.stream, Target::None);
                Some(R::encode(at, Err(why), pause))
            }
        }
    }

    /// What stream `stream` is to `R`'s census: found to run it, claimed by another, or
    /// to be looked at.
    fn known<R: RuntimeCensus>(&self, stream: u32) -> Known<R::Found> {
        match self.targets.lock().unwrap().get_mut(&stream) {
            Some(Target::None) if R::LOADED_LATE => {}
            None => {}
            mine @ Some(Target::Runtime { .. }) => {
                if let Some(kept) = kept_mut::<R>(mine) {
                    return Known::Mine(kept.found.clone());
                }
                return Known::Another;
            }
            Some(_) => return Known::Another,
        }
        if self
            .passed_over
            .lock()
            .unwrap()
            .contains(&(R::NAME, stream))
        {
            return Known::Another;
        }
        Known::Unknown
    }

    /// Looks for `R`'s runtime in stream `at.stream` (process `pid`) and keeps what it
    /// found; else the note to write, if any.
    fn find<R: RuntimeCensus>(
        &self,
        runtime: &R,
        at: At,
        pid: u32,
    ) -> Result<R::Found, Option<Vec<u8>>> {
        match runtime.find(self, pid) {
            Finding::Runs(found) => {
                let kept = Kept {
                    found: found.clone(),
                    refused: 0,
                };
                let target = Target::Runtime {
                    runtime: R::NAME,
                    kept: Box::new(kept),
                };
                self.targets.lock().unwrap().insert(at.stream, target);
                Ok(found)
            }
            Finding::Unreadable(why) => {
                if R::LOADED_LATE {
                    self.passed_over
                        .lock()
                        .unwrap()
                        .insert((R::NAME, at.stream));
                } else {
                    self.targets.lock().unwrap().insert(at.stream, Target::None);
                }
                Err(Some(R::encode(at, Err(why), None)))
            }
            Finding::Not => {
                self.passed_over
                    .lock()
                    .unwrap()
                    .insert((R::NAME, at.stream));
                Err(None)
            }
            Finding::Unknown => Err(None),
        }
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

/// What a stream is to one runtime's census.
enum Known<T> {
    Mine(T),
    /// Another runtime's, or passed over.
    Another,
    /// To be looked at.
    Unknown,
}

/// What `R`'s census keeps of a process, when `target` is `R`'s.
fn kept_mut<R: RuntimeCensus>(target: Option<&mut Target>) -> Option<&mut Kept<R::Found>> {
    match target {
        Some(Target::Runtime { runtime, kept }) if *runtime == R::NAME => kept.downcast_mut(),
        _ => None,
    }
}
