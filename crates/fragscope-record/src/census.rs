//! Censuses of runtime heaps malloc never sees, taken with each page-residency snapshot
//! and read from outside (fragscope-census): a GHC program's block descriptors (so it
//! runs without a heap-profile census of its own) and a CPython process's pymalloc pools.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fragscope_census::ghc::{census, CensusError, CensusLimits, GhcRts, RtsInfo};
use fragscope_census::pymalloc::{self, Pymalloc};
use fragscope_trace::chunk::ChunkKind;
use fragscope_trace::records::{GhcCensus, PymallocCensus, SnapshotReason};

/// A census as the trace stores it.
pub enum CensusRecord {
    Ghc(GhcCensus),
    Pymalloc(PymallocCensus),
}

impl CensusRecord {
    pub fn chunk(&self) -> (ChunkKind, Vec<u8>) {
        match self {
            CensusRecord::Ghc(c) => (ChunkKind::GhcCensus, c.encode()),
            CensusRecord::Pymalloc(c) => (ChunkKind::PymallocCensus, c.encode()),
        }
    }
}

/// What a stream's census can be.
enum Target {
    /// Not a program whose runtime heap fragscope reads (or censuses are off).
    None,
    /// A CPython process: its pymalloc pools.
    Python { layout: Pymalloc, refused: u32 },
    Ready {
        rts: Arc<GhcRts>,
        last_long_stop: Option<Instant>,
        /// Megablocks at the last census: a heap that stopped growing is where a
        /// liveness scan matters (live data fell, or holds).
        last_megablocks: u64,
        /// Censuses refused in a row: one stop may land while the RTS is setting its
        /// heap up; only a refusal that repeats says the layout is not the one read.
        refused: u32,
    },
}

/// A census may stop the program for a whole liveness scan (when a collection spoilt
/// the one made while it ran, and the heap has not grown since the census before) at
/// most this often: tens to hundreds of milliseconds, now and then.
const LONG_STOP_EVERY: Duration = Duration::from_secs(5);

/// Refused censuses in a row that make a note in the trace.
const REFUSALS_TO_NOTE: u32 = 3;

/// A pause longer than this counts as a long stop.
const LONG_STOP: Duration = Duration::from_millis(20);

/// The census state of a recording: which streams run a GHC RTS fragscope can read.
pub struct Censuses {
    enabled: bool,
    /// `+RTS --info` by executable, asked once.
    rts_info: Mutex<HashMap<PathBuf, Result<RtsInfo, String>>>,
    targets: Mutex<HashMap<u32, Target>>,
}

impl Censuses {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            rts_info: Mutex::default(),
            targets: Mutex::default(),
        }
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
    /// first time only); `None` for a process whose runtime heap fragscope does not read,
    /// or that holds no heap at the moment (starting, shutting down).
    pub fn take(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<CensusRecord> {
        // By the time the program calls exit, the runtime has shut its heap down (GHC's
        // storage manager, CPython's finalization) and freed part of it: a census then
        // describes no moment of the run.
        if !self.enabled || reason == SnapshotReason::Exit {
            return None;
        }
        if !self.targets.lock().unwrap().contains_key(&stream) {
            let target = match self.resolve(pid) {
                Some(Ok(rts)) => Target::Ready {
                    rts: Arc::new(rts),
                    last_long_stop: None,
                    last_megablocks: 0,
                    refused: 0,
                },
                Some(Err(why)) => {
                    self.targets.lock().unwrap().insert(stream, Target::None);
                    return Some(CensusRecord::Ghc(GhcCensus {
                        stream,
                        tick,
                        reason,
                        result: Err(why),
                    }));
                }
                None => match Pymalloc::detect(pid) {
                    Some(Ok(layout)) => Target::Python { layout, refused: 0 },
                    Some(Err(why)) => {
                        self.targets.lock().unwrap().insert(stream, Target::None);
                        return Some(CensusRecord::Pymalloc(PymallocCensus {
                            stream,
                            tick,
                            reason,
                            result: Err(why),
                        }));
                    }
                    None => Target::None,
                },
            };
            self.targets.lock().unwrap().insert(stream, target);
        }
        let python = match self.targets.lock().unwrap().get(&stream) {
            Some(Target::Python { layout, .. }) => Some(*layout),
            _ => None,
        };
        if let Some(layout) = python {
            return self.take_pymalloc(stream, pid, layout).map(|result| {
                CensusRecord::Pymalloc(PymallocCensus {
                    stream,
                    tick,
                    reason,
                    result,
                })
            });
        }
        self.take_ghc(stream, pid, tick, reason)
            .map(CensusRecord::Ghc)
    }

    /// A pymalloc census, or the note that the last few were refused.
    fn take_pymalloc(
        &self,
        stream: u32,
        pid: u32,
        layout: Pymalloc,
    ) -> Option<Result<fragscope_trace::records::PymallocPools, String>> {
        let result = pymalloc::census(pid, &layout);
        let mut targets = self.targets.lock().unwrap();
        let Some(Target::Python { refused, .. }) = targets.get_mut(&stream) else {
            return None;
        };
        match result {
            Ok(pools) => {
                *refused = 0;
                Some(Ok(pools))
            }
            Err(CensusError::NoHeap | CensusError::Unreadable(_)) => None,
            Err(CensusError::Inconsistent(why)) => {
                *refused += 1;
                (*refused == REFUSALS_TO_NOTE).then(|| {
                    Err(format!(
                        "{REFUSALS_TO_NOTE} pymalloc censuses in a row were refused: {why}"
                    ))
                })
            }
        }
    }

    fn take_ghc(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
    ) -> Option<GhcCensus> {
        let targets = self.targets.lock().unwrap();
        let note = |result| GhcCensus {
            stream,
            tick,
            reason,
            result,
        };
        // A long stop is allowed when none was made lately, up to the heap size of the
        // census before (a heap that grows is being built, and its scan would be stale).
        let (rts, stop_when_spoilt) = match targets.get(&stream) {
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
            _ => return None,
        };
        drop(targets);
        let limits = CensusLimits {
            stop_when_spoilt,
            ..CensusLimits::default()
        };
        match census(pid, &rts, limits) {
            Ok(blocks) => {
                if let Some(Target::Ready {
                    last_long_stop,
                    last_megablocks,
                    refused,
                    ..
                }) = self.targets.lock().unwrap().get_mut(&stream)
                {
                    *refused = 0;
                    *last_megablocks = blocks.megablocks;
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
                *refused += 1;
                (*refused == REFUSALS_TO_NOTE).then(|| {
                    note(Err(format!(
                        "{REFUSALS_TO_NOTE} block censuses in a row were refused: {why}"
                    )))
                })
            }
        }
    }

    /// `None`: not a GHC program. Err: a GHC program whose RTS the census cannot read.
    fn resolve(&self, pid: u32) -> Option<Result<GhcRts, String>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let elf = std::fs::read(&exe).ok()?;
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
