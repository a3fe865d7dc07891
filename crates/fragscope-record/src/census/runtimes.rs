//! The runtime heaps a recording reads at each snapshot, one [`RuntimeCensus`] each: how
//! a process is found to run it, and one census of it. [`super::RUNTIMES`] lists them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fragscope_census::allocators::LinkedAllocator;
use fragscope_census::ghc::CensusError;
use fragscope_census::golang::{GoCensusError, GoRuntime};
use fragscope_census::jemalloc::{self, JemallocLayout};
use fragscope_census::jvm::HotSpot;
use fragscope_census::mimalloc::{self, MimallocLayout};
use fragscope_census::pymalloc::{self, Pymalloc};
use fragscope_census::sbcl::{self, SbclRuntime};
use fragscope_census::{Pause, ProcessMemory};
use fragscope_trace::go_heap::GoHeap;
use fragscope_trace::heap_census::{AllocatorHeap, HeapCensus};
use fragscope_trace::jvm_heap::JvmHeap;
use fragscope_trace::records::{Census, CensusBody, PymallocPools};
use fragscope_trace::{ChunkKind, ResidentRange};

use super::{At, Censuses, Finding, Reading, RuntimeCensus};

/// A runtime census's chunk: `Census<T>`'s framing around the heap, or the note.
fn census_chunk<T: CensusBody>(at: At, result: Result<T, String>) -> Vec<u8> {
    Census {
        stream: at.stream,
        tick: at.tick,
        reason: at.reason,
        result,
    }
    .encode()
}

/// What the runtime's own census crate says of a heap it could not read in full: gone or
/// starting (nothing to say), or figures that do not hold together (refused).
fn reading<H>(result: Result<H, CensusError>) -> Reading<H> {
    match result {
        Ok(heap) => Reading::Heap(heap, None),
        Err(CensusError::NoHeap | CensusError::Unreadable(_)) => Reading::Nothing,
        Err(CensusError::Inconsistent(why)) => Reading::Refused(why, None),
    }
}

/// A detection's answer: `None` is not this runtime (`Finding::Not`, or `Finding::Unknown`
/// when `unknown`: asked again at the next snapshot).
fn finding<T>(detected: Option<Result<T, String>>, unknown: bool) -> Finding<T> {
    match detected {
        Some(Ok(found)) => Finding::Runs(found),
        Some(Err(why)) => Finding::Unreadable(why),
        None if unknown => Finding::Unknown,
        None => Finding::Not,
    }
}

/// Process `pid`'s memory, the process held stopped; `None` when it is gone or not ours to
/// read: nothing to say at this moment.
fn held(pid: u32) -> Option<(ProcessMemory, Pause)> {
    match (ProcessMemory::open(pid), Pause::stop(pid)) {
        (Ok(mem), Ok(pause)) => Some((mem, pause)),
        _ => None,
    }
}

/// A CPython process: its pymalloc pools (a few milliseconds, taken with the snapshot
/// itself: its residency splits them).
pub(super) struct Python;

impl RuntimeCensus for Python {
    const NAME: &'static str = "pymalloc";
    const KIND: ChunkKind = ChunkKind::PymallocCensus;
    type Found = Pymalloc;
    type Heap = PymallocPools;

    fn find(&self, _: &Censuses, pid: u32) -> Finding<Pymalloc> {
        // A process not found to run CPython now is looked at again: nothing else marks
        // it (the GHC census, once it finds it is no GHC program, does).
        finding(Pymalloc::detect(pid), true)
    }

    fn read(&self, pid: u32, layout: &Pymalloc) -> Reading<PymallocPools> {
        reading(pymalloc::census(pid, layout))
    }

    fn encode(at: At, result: Result<PymallocPools, String>, _: Option<Duration>) -> Vec<u8> {
        census_chunk(at, result)
    }
}

/// An SBCL process: its dynamic space. The page table is read at every snapshot (about a
/// millisecond); the objects are walked and marked from the roots too when the walks so
/// far and this one together hold the program for at most 1/20 of the time since the
/// first census: the census walks only a space small enough for what is left of that
/// budget at the last walk's cost per byte (walk and mark read every used byte and every
/// reachable object; see ARCHITECTURE.md for the cost; before a first one it is expected
/// to take 2 ms per MiB in use).
pub(super) struct Sbcl;

/// An SBCL process's runtime and its object walks' budget.
#[derive(Clone)]
pub(super) struct SbclWalks {
    runtime: Box<SbclRuntime>,
    first_census: Instant,
    /// How long the walks so far held the program.
    walked: Duration,
    /// What a walk costs per byte in use, in nanoseconds: the last one's.
    walk_ns_per_byte: f64,
}

/// A walk's cost before a first one: 2 ms per MiB in use (measured: 1.6 to 2.2, see
/// ARCHITECTURE.md).
const FIRST_WALK_NS_PER_BYTE: f64 = 2e6 / (1 << 20) as f64;

impl RuntimeCensus for Sbcl {
    const NAME: &'static str = "SBCL";
    const KIND: ChunkKind = ChunkKind::SbclCensus;
    type Found = SbclWalks;
    type Heap = sbcl::SbclCensus;

    fn find(&self, _: &Censuses, pid: u32) -> Finding<SbclWalks> {
        // Its detection reads the executable: a process found not to run SBCL is not
        // looked at again.
        let detected = SbclRuntime::detect(pid).map(|found| {
            found.map(|runtime| SbclWalks {
                runtime: Box::new(runtime),
                first_census: Instant::now(),
                walked: Duration::ZERO,
                walk_ns_per_byte: FIRST_WALK_NS_PER_BYTE,
            })
        });
        finding(detected, false)
    }

    fn read(&self, pid: u32, walks: &SbclWalks) -> Reading<sbcl::SbclCensus> {
        let budget = (walks.first_census.elapsed() / 20).saturating_sub(walks.walked);
        // The walk goes with a mark from the roots (live and garbage by generation),
        // within the same budget: none left, no space is small enough.
        let options = sbcl::CensusOptions {
            objects: true,
            mark: true,
            walk_only_up_to: Some((budget.as_nanos() as f64 / walks.walk_ns_per_byte) as u64),
        };
        reading(sbcl::census(pid, &walks.runtime, options))
    }

    fn learn(walks: &mut SbclWalks, census: &sbcl::SbclCensus) {
        if census.objects.is_some() {
            let pause = Duration::from_micros(census.pause_us);
            walks.walked += pause;
            walks.walk_ns_per_byte = pause.as_nanos() as f64 / census.bytes_used.max(1) as f64;
        }
    }

    fn encode(at: At, result: Result<sbcl::SbclCensus, String>, _: Option<Duration>) -> Vec<u8> {
        census_chunk(at, result.map(|census| census.to_record()))
    }
}

/// A Go program: its runtime's spans. It holds the program for about 65 ms per GiB of
/// heap.
pub(super) struct Go;

impl RuntimeCensus for Go {
    const NAME: &'static str = "Go heap";
    const KIND: ChunkKind = ChunkKind::GoCensus;
    type Found = Box<GoRuntime>;
    type Heap = GoHeap;

    fn find(&self, _: &Censuses, pid: u32) -> Finding<Box<GoRuntime>> {
        // Its detection reads the executable too: asked once.
        finding(GoRuntime::detect(pid).map(|r| r.map(Box::new)), false)
    }

    fn read(&self, pid: u32, runtime: &Box<GoRuntime>) -> Reading<GoHeap> {
        let Some((mut mem, pause)) = held(pid) else {
            return Reading::Nothing;
        };
        match fragscope_census::golang::census_held(pid, runtime, &mut mem, &mut Some(pause)) {
            Ok(heap) => Reading::Heap(heap, None),
            Err(GoCensusError::Unreadable(_)) => Reading::Nothing,
            Err(GoCensusError::Inconsistent(why)) => Reading::Refused(why, None),
        }
    }

    fn encode(at: At, result: Result<GoHeap, String>, _: Option<Duration>) -> Vec<u8> {
        census_chunk(at, result)
    }
}

/// A JVM: its collector's regions or spaces, and native memory tracking's summary when
/// the JVM keeps one.
pub(super) struct Jvm;

impl RuntimeCensus for Jvm {
    const NAME: &'static str = "JVM heap";
    const KIND: ChunkKind = ChunkKind::JvmCensus;
    const LOADED_LATE: bool = true;
    type Found = Box<HotSpot>;
    type Heap = JvmHeap;

    fn find(&self, _: &Censuses, pid: u32) -> Finding<Box<HotSpot>> {
        // Looked at again at every snapshot until the process maps libjvm.so: the java
        // launcher loads it after it starts.
        finding(HotSpot::detect(pid).map(|j| j.map(Box::new)), true)
    }

    fn read(&self, pid: u32, jvm: &Box<HotSpot>) -> Reading<JvmHeap> {
        let Some((mut mem, pause)) = held(pid) else {
            return Reading::Nothing;
        };
        // Starting: no heap yet (`Reading::Nothing`).
        reading(fragscope_census::jvm::census_held(
            pid,
            jvm,
            &mut mem,
            &mut Some(pause),
        ))
    }

    fn complete(&self, pid: u32, jvm: &Box<HotSpot>, heap: &mut JvmHeap) {
        // Asked of the JVM once it runs again: it answers on a thread of its own.
        heap.native_memory = jvm.native_memory(pid);
    }

    fn encode(at: At, result: Result<JvmHeap, String>, _: Option<Duration>) -> Vec<u8> {
        census_chunk(at, result)
    }
}

/// A program with a jemalloc linked into it (its calls never reach the interposer):
/// jemalloc's own metadata. The program is held while jemalloc's metadata and its heap's
/// residency are read (a few milliseconds per 100 MiB).
pub(super) struct LinkedJemalloc;

impl RuntimeCensus for LinkedJemalloc {
    const NAME: &'static str = "jemalloc";
    const KIND: ChunkKind = ChunkKind::HeapCensus;
    // At exit too: jemalloc's heap is whatever the program left in it (a census that
    // lands inside jemalloc is refused).
    const AT_EXIT: bool = true;
    type Found = Arc<JemallocLayout>;
    type Heap = AllocatorHeap;

    fn find(&self, censuses: &Censuses, pid: u32) -> Finding<Arc<JemallocLayout>> {
        let linked = match linked_copy(censuses, pid, Self::NAME) {
            Ok(linked) => linked,
            Err(finding) => return finding,
        };
        let found = ProcessMemory::open(pid)
            .map_err(|e| e.to_string())
            .and_then(|mut mem| jemalloc::locate(pid, &mut mem, Some(&linked)));
        match found {
            Ok(layout) => Finding::Runs(Arc::new(layout)),
            Err(why) => Finding::Unreadable(why),
        }
    }

    fn read(&self, pid: u32, layout: &Arc<JemallocLayout>) -> Reading<AllocatorHeap> {
        // A build without statistics whose extent map was not found: no later census
        // would be read, said at once and not tried again.
        held_allocator_census(
            pid,
            |mem, residency| jemalloc::census(mem, layout, residency).map(AllocatorHeap::Jemalloc),
            |why| why.contains(jemalloc::NO_STATISTICS),
        )
    }

    fn encode(at: At, result: Result<AllocatorHeap, String>, pause: Option<Duration>) -> Vec<u8> {
        heap_census_chunk(Self::NAME, at, result, pause)
    }
}

/// A program with a mimalloc linked into it (the mimalloc crate): mimalloc's segments and
/// pages. The program is held while they and its heap's residency are read.
pub(super) struct LinkedMimalloc;

impl RuntimeCensus for LinkedMimalloc {
    const NAME: &'static str = "mimalloc";
    const KIND: ChunkKind = ChunkKind::HeapCensus;
    // At exit too, as jemalloc's: the heap is whatever the program left in it.
    const AT_EXIT: bool = true;
    type Found = Arc<MimallocLayout>;
    type Heap = AllocatorHeap;

    fn find(&self, censuses: &Censuses, pid: u32) -> Finding<Arc<MimallocLayout>> {
        let linked = match linked_copy(censuses, pid, Self::NAME) {
            Ok(linked) => linked,
            Err(finding) => return finding,
        };
        match mimalloc::locate(pid, Some(&linked)) {
            Ok(layout) => Finding::Runs(Arc::new(layout)),
            Err(why) => Finding::Unreadable(why),
        }
    }

    fn read(&self, pid: u32, layout: &Arc<MimallocLayout>) -> Reading<AllocatorHeap> {
        held_allocator_census(
            pid,
            |mem, residency| mimalloc::census(mem, layout, residency).map(AllocatorHeap::Mimalloc),
            |_| false,
        )
    }

    fn encode(at: At, result: Result<AllocatorHeap, String>, pause: Option<Duration>) -> Vec<u8> {
        heap_census_chunk(Self::NAME, at, result, pause)
    }
}

/// The copy of allocator `name` linked into `pid`'s program; else what finding it came to
/// (the program not known yet, or not on such a copy).
fn linked_copy<T>(
    censuses: &Censuses,
    pid: u32,
    name: &str,
) -> Result<LinkedAllocator, Finding<T>> {
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return Err(Finding::Unknown);
    };
    censuses
        .linked_allocator(exe)
        .filter(|l| l.allocator == name)
        .ok_or(Finding::Not)
}

/// A census of an allocator linked into `pid`'s program: `census` reads its metadata with
/// the residency that tells which of its pages are resident, both while the program is
/// held. A refusal `is_final` says no later census would be read either.
fn held_allocator_census(
    pid: u32,
    census: impl Fn(&mut ProcessMemory, &[ResidentRange]) -> Result<AllocatorHeap, String>,
    is_final: impl Fn(&str) -> bool,
) -> Reading<AllocatorHeap> {
    let Some((mut mem, pause)) = held(pid) else {
        return Reading::Nothing;
    };
    let result = heap_residency(pid).and_then(|r| census(&mut mem, &r));
    let held = Some(pause.held());
    drop(pause);
    match result {
        Ok(heap) => Reading::Heap(heap, held),
        Err(why) if is_final(&why) => Reading::Final(why, held),
        Err(why) => Reading::Refused(why, held),
    }
}

/// The pagemap of the mappings that may hold a heap, read while the program is held: what
/// tells an allocator census which of its pages are resident.
fn heap_residency(pid: u32) -> Result<Vec<ResidentRange>, String> {
    crate::procfs::read_maps(pid, &mut HashMap::new())
        .and_then(|maps| {
            let heap: Vec<_> = maps
                .iter()
                .filter(|m| crate::procfs::may_hold_heap(m))
                .collect();
            crate::procfs::read_residency(pid, &heap, 4096)
        })
        .ok_or_else(|| "its residency could not be read".to_string())
}

/// A linked allocator's census as a HeapCensus chunk (chunk 16).
fn heap_census_chunk(
    allocator: &str,
    at: At,
    result: Result<AllocatorHeap, String>,
    pause: Option<Duration>,
) -> Vec<u8> {
    HeapCensus {
        stream: at.stream,
        tick: at.tick,
        allocator: allocator.into(),
        stopped: pause.is_some(),
        pause_us: pause.map_or(0, |d| d.as_micros() as u64),
        result,
    }
    .encode()
}
