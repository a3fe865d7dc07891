//! `fragscope snapshot PID`: a census of a process that is already running, with no
//! preload and no restart, written as a trace of one snapshot. The process is held with
//! SIGSTOP while its heap metadata, maps, pagemap and RSS are read (unless `stop` is
//! off), and continued at once.

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use fragscope_census::allocators::{allocator_of, linked_allocators, LinkedAllocator};
use fragscope_census::ghc::{CensusError, CensusLimits, GhcRts, RtsInfo};
use fragscope_census::golang::{GoCensusError, GoRuntime};
use fragscope_census::jvm::HotSpot;
use fragscope_census::{glibc, jemalloc, mimalloc, tcmalloc, Pause, ProcessMemory};
use fragscope_trace::go_heap::GoHeap;
use fragscope_trace::heap_census::{AllocatorHeap, HeapCensus};
use fragscope_trace::jvm_heap::JvmHeap;
use fragscope_trace::records::{
    Census, CensusBody, GhcBlocks, GhcCensus, Maps, Pagemap, Process, PymallocPools, Rollup,
    RssBatch, RssSample, SnapshotReason,
};
use fragscope_trace::v8_heap::V8Heap;
use fragscope_trace::{ChunkKind, ChunkWriter, End, Mapping, Origin, ResidentRange, StackMode};

use crate::access::{access_error, gone};
use crate::output::{create_output, meta_now};
use crate::procfs;

#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    pub pid: u32,
    pub output: PathBuf,
    pub force: bool,
    /// Hold the process stopped while it is read (the figures then describe one moment).
    pub stop: bool,
    /// When the heap is read from a forked copy of the process instead of the process
    /// held stopped (glibc heaps): the stop then lasts only as long as the fork.
    pub fork_copy: ForkCopy,
    pub compression_level: i32,
}

/// When `snapshot` reads a glibc heap from a copy of the process made by fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkCopy {
    /// When the heap's resident pages come to `FORK_COPY_FROM` or more.
    Auto,
    Always,
    Never,
}

/// Resident heap from which `ForkCopy::Auto` reads a copy: below it, reading the process
/// stopped takes a few milliseconds, less than stopping it twice would.
pub const FORK_COPY_FROM: u64 = 32 << 20;

#[derive(Debug, Clone)]
pub struct SnapshotOutcome {
    pub file_bytes: u64,
    /// The process's allocator or runtime: "glibc", "jemalloc", ..., "ghc".
    pub allocator: String,
    /// How long the process was held stopped (None: it was not).
    pub stopped_for: Option<Duration>,
    /// The heap was read from a forked copy of the process (the stop covered the fork).
    pub read_from_copy: bool,
    /// Bytes of heap the census covered (arenas' heaps and mmapped chunks, or the GHC
    /// RTS's megablocks), for the stop time per GiB.
    pub heap_bytes: u64,
    /// Why the allocator's own metadata was not read, when it was not.
    pub note: Option<String>,
}

/// Takes the snapshot and writes the trace.
pub fn snapshot(opts: &SnapshotOptions) -> Result<SnapshotOutcome> {
    let pid = opts.pid;
    if pid == std::process::id() {
        bail!("fragscope cannot take a snapshot of itself");
    }
    if gone(pid) {
        bail!("no process {pid} (it does not exist or has exited)");
    }
    let (mut mem, mut build_ids, maps) = open_readable(pid)?;
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let heap = HeapReader::find(pid, &maps, &mut mem);

    // A CPython process: its pymalloc pools, read with the program held for their own
    // short stop, before the residency that splits them.
    let pymalloc = fragscope_census::pymalloc::Pymalloc::detect(pid).map(|layout| {
        layout.and_then(|layout| {
            fragscope_census::pymalloc::census(pid, &layout)
                .map_err(|e| format!("no pymalloc census: {e}"))
        })
    });
    // A Node.js process: its V8 heap as V8 counts it, asked through its inspector while
    // it runs (it answers on its own main thread), just before the stop.
    let v8 = fragscope_census::v8_inspector::is_node(pid).then(|| {
        fragscope_census::v8_inspector::heap_of(pid).map_err(|e| format!("no V8 heap figures: {e}"))
    });
    let reading = match &heap.ghc {
        Some(rts) => read_ghc(pid, rts, &mut build_ids, maps, page)?,
        None => read_malloc_heap(opts, &heap, &mut mem, &mut build_ids, page)?,
    };
    let resident_heap_bytes = resident_bytes(&reading.residency, page);
    if gone(pid) && reading.rss.is_none() {
        bail!("process {pid} exited while it was read");
    }
    let rollup = procfs::read_rollup(pid);

    let file = create_output(&opts.output, opts.force)?;
    let mut w = ChunkWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        opts.compression_level,
    )?;
    let process = Process {
        stream: 0,
        pid,
        ppid: procfs::parent_pid(pid).unwrap_or(0),
        origin: Origin::Started,
        parent_stream: None,
        start_tick: 0,
        argv,
        exe,
        fork_mark: None,
    };
    write_process(&mut w, process, page, heap.linked.as_ref())?;
    let Reading {
        stopped_for,
        maps,
        residency,
        rss,
        census,
        ghc_census,
        go_census,
        jvm_census,
        read_from_copy,
        copy_note,
    } = reading;
    let go_heap = go_census.as_ref().map(|c| match c {
        Ok(h) => (h.range_bytes(), None),
        Err(why) => (0, Some(why.clone())),
    });
    let runtimes = RuntimeCensuses {
        pymalloc,
        go: go_census,
        jvm: jvm_census,
        v8,
    };
    write_readings(&mut w, maps, rss, rollup, runtimes, residency, page)?;
    let (heap_bytes, note) = write_censuses(
        &mut w,
        opts,
        heap.allocator,
        stopped_for,
        ghc_census,
        census,
        resident_heap_bytes,
    )?;
    w.write_chunk(
        ChunkKind::End,
        &End {
            tick: 0,
            event_bytes: 0,
        }
        .encode(),
    )?;
    w.flush()?;
    let (heap_bytes, note) = match go_heap {
        // A Go program without cgo: the Go heap is its only one.
        Some((bytes, go_note)) if heap.allocator == "go" => (bytes, go_note),
        Some((_, Some(go_note))) => (
            heap_bytes,
            Some(go_note)
                .into_iter()
                .chain(note)
                .reduce(|a, b| format!("{a}; {b}")),
        ),
        _ => (heap_bytes, note),
    };
    let note = match (note, copy_note) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    Ok(SnapshotOutcome {
        file_bytes: w.bytes_written(),
        allocator: heap.allocator.into(),
        stopped_for,
        read_from_copy,
        heap_bytes,
        note,
    })
}

/// Build-ids by the path of the file mapped (`procfs::read_maps` fills it).
type BuildIds = HashMap<String, Vec<u8>>;

/// Opens `pid`'s memory, with its build-ids and maps, once a read of a page it maps
/// succeeded (reading is checked apart from the open).
fn open_readable(pid: u32) -> Result<(ProcessMemory, BuildIds, Vec<Mapping>)> {
    let mut mem = ProcessMemory::open(pid).map_err(|e| access_error(pid, &e))?;
    // Reading is checked apart from the open: try it on a page we know.
    let mut build_ids = HashMap::new();
    let maps = procfs::read_maps(pid, &mut build_ids)
        .ok_or_else(|| anyhow::anyhow!("process {pid} exited before it could be read"))?;
    if let Some(m) = maps.iter().find(|m| m.perms.starts_with('r')) {
        let mut one = Vec::new();
        if let Err(e) = mem.read_ranges(&[(m.start, 8)], &mut one) {
            if gone(pid) {
                bail!("process {pid} exited before it could be read");
            }
            return Err(access_error(pid, &e));
        }
    }
    Ok((mem, build_ids, maps))
}

/// What reads the heap: the GHC RTS's census, glibc's, tcmalloc's, jemalloc's, mimalloc's, or none
/// (page level only), found before the process is stopped.
struct HeapReader {
    pid: u32,
    ghc: Option<Result<GhcRts, String>>,
    /// A copy linked into the program (or a library).
    linked: Option<LinkedAllocator>,
    allocator: &'static str,
    glibc: Option<Result<glibc::GlibcLayout, String>>,
    tcmalloc: Option<Result<tcmalloc::TcmallocLayout, String>>,
    jemalloc: Option<Result<jemalloc::JemallocLayout, String>>,
    mimalloc: Option<Result<mimalloc::MimallocLayout, String>>,
    /// A Go program: its runtime's heap layout.
    go: Option<Result<GoRuntime, String>>,
    /// A JVM: its tables and collector.
    jvm: Option<Result<HotSpot, String>>,
}

impl HeapReader {
    fn find(pid: u32, maps: &[Mapping], mem: &mut ProcessMemory) -> Self {
        let elf = std::fs::read(format!("/proc/{pid}/exe")).unwrap_or_default();
        let ghc = crate::ghc::inspect(&elf).map(|_| {
            RtsInfo::query(std::path::Path::new(&format!("/proc/{pid}/exe")), None)
                .and_then(|info| GhcRts::new(&elf, info, Some(pid)))
        });
        // A copy linked into the program (or a library) serves its allocations, whatever
        // the C library's malloc does beside it.
        let linked = if ghc.is_some() {
            None
        } else {
            linked_allocators(maps).into_iter().next()
        };
        let go = if ghc.is_some() {
            None
        } else {
            GoRuntime::detect(pid)
        };
        let jvm = if ghc.is_some() {
            None
        } else {
            HotSpot::detect(pid)
        };
        let allocator = match (&ghc, &linked) {
            (Some(_), _) => "ghc",
            (None, Some(l)) => l.allocator,
            (None, None) => match allocator_of(maps) {
                // A Go program without cgo: its runtime's heap is the only one.
                "unknown" if go.is_some() => "go",
                a => a,
            },
        };
        let glibc = match allocator {
            "glibc" => Some(glibc::locate(pid, maps, mem)),
            _ => None,
        };
        // tcmalloc as a shared library (a copy linked into the program is not read yet);
        // jemalloc as a shared library or linked into the program.
        let tcmalloc =
            (allocator == "tcmalloc" && linked.is_none()).then(|| tcmalloc::locate(pid, mem));
        let jemalloc =
            (allocator == "jemalloc").then(|| jemalloc::locate(pid, mem, linked.as_ref()));
        let mimalloc = (allocator == "mimalloc").then(|| mimalloc::locate(pid, linked.as_ref()));
        Self {
            pid,
            ghc,
            linked,
            allocator,
            glibc,
            tcmalloc,
            jemalloc,
            mimalloc,
            go,
            jvm,
        }
    }
}

/// What was read of the process.
struct Reading {
    /// How long it was held stopped.
    stopped_for: Option<Duration>,
    maps: Vec<Mapping>,
    residency: Vec<ResidentRange>,
    rss: Option<RssSample>,
    /// The malloc heap's census (None: a GHC program).
    census: Option<Result<AllocatorHeap, String>>,
    ghc_census: Option<Result<GhcBlocks, String>>,
    /// A Go program's heap census.
    go_census: Option<Result<GoHeap, String>>,
    /// A JVM's heap census.
    jvm_census: Option<Result<JvmHeap, String>>,
    read_from_copy: bool,
    /// Why the heap was not read from a copy when one was wanted.
    copy_note: Option<String>,
}

/// A GHC program: its block census, which holds the program itself (about 1 ms per
/// 50 MiB of heap), then its maps, residency and RSS.
fn read_ghc(
    pid: u32,
    rts: &Result<GhcRts, String>,
    build_ids: &mut BuildIds,
    maps: Vec<Mapping>,
    page: u64,
) -> Result<Reading> {
    let result = match rts {
        Ok(rts) => match crate::census::ghc_census_outside_collections(
            pid,
            rts,
            CensusLimits::default(),
            || (),
        )
        .1
        {
            Ok(b) => Ok(b),
            Err(CensusError::Unreadable(e)) if gone(pid) => {
                bail!("process {pid} exited while it was read ({e})")
            }
            Err(e) => Err(format!("no block census: {e}")),
        },
        Err(why) => Err(why.clone()),
    };
    let pause = result
        .as_ref()
        .ok()
        .map(|b| Duration::from_micros(b.pause_us));
    let maps = procfs::read_maps(pid, build_ids).unwrap_or(maps);
    let residency = read_residency(pid, &maps, page);
    let rss = procfs::read_rss(pid, 0);
    Ok(Reading {
        stopped_for: pause,
        maps,
        residency,
        rss,
        census: None,
        ghc_census: Some(result),
        go_census: None,
        jvm_census: None,
        read_from_copy: false,
        copy_note: None,
    })
}

/// A malloc heap: the process held stopped (unless `opts.stop` is off) while its maps,
/// residency and RSS are read, and its heap too, or only while a copy is forked that the
/// heap is then read from.
fn read_malloc_heap(
    opts: &SnapshotOptions,
    heap: &HeapReader,
    mem: &mut ProcessMemory,
    build_ids: &mut BuildIds,
    page: u64,
) -> Result<Reading> {
    let pid = heap.pid;
    // Ready before the stop, so that the stop lasts only for the fork.
    let forker =
        (opts.stop && matches!(heap.glibc, Some(Ok(_))) && opts.fork_copy != ForkCopy::Never)
            .then(|| crate::fork_copy::Forker::new(pid));
    let mut pause = if opts.stop {
        Some(Pause::stop(pid).map_err(|e| {
            if gone(pid) {
                anyhow::anyhow!("process {pid} exited before it could be read")
            } else {
                anyhow::anyhow!(e)
            }
        })?)
    } else {
        None
    };
    let go_census = match &heap.go {
        Some(Ok(rt)) => Some(go_census_held(pid, rt, mem, &mut pause)?),
        Some(Err(why)) => Some(Err(why.clone())),
        None => None,
    };
    let jvm_census = match &heap.jvm {
        Some(Ok(jvm)) => Some(jvm_census_held(pid, jvm, mem, &mut pause)?),
        Some(Err(why)) => Some(Err(why.clone())),
        None => None,
    };
    let maps = procfs::read_maps(pid, build_ids)
        .ok_or_else(|| anyhow::anyhow!("process {pid} exited while it was read"))?;
    let residency = read_residency(pid, &maps, page);
    let rss = procfs::read_rss(pid, 0);
    let wants_copy = match opts.fork_copy {
        ForkCopy::Always => true,
        ForkCopy::Never => false,
        ForkCopy::Auto => resident_bytes(&residency, page) >= FORK_COPY_FROM,
    };
    let mut copy_note = None;
    // The heap as it is now, read from a copy while the process runs on.
    let copy = match forker.as_ref().filter(|_| wants_copy && pause.is_some()) {
        Some(forker) => match forker
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .and_then(|f| f.fork())
        {
            Ok(c) => Some(c),
            Err(e) => {
                copy_note = Some(format!(
                    "the heap was read from the process held stopped, not from a copy \
                     ({e:#})"
                ));
                None
            }
        },
        None => None,
    };
    let mut copy_mem = match &copy {
        Some(c) => Some(ProcessMemory::open(c.pid()).map_err(|e| access_error(pid, &e))?),
        None => None,
    };
    let mut held = None;
    if copy_mem.is_some() {
        held = pause.as_ref().map(Pause::held);
        drop(pause.take());
    }
    // The malloc heap is looked for outside the runtimes' heaps, whose objects can begin
    // as glibc begins a chunk it mmaps alone.
    let malloc_maps = without_ranges(&maps, &runtime_heap_ranges(&go_census, &jvm_census));
    let census = (heap.allocator != "go")
        .then(|| {
            read_allocator(
                opts,
                heap,
                mem,
                copy_mem.as_mut(),
                &malloc_maps,
                &residency,
                page,
            )
        })
        .transpose()?;
    let read_from_copy = copy.is_some();
    drop(copy_mem);
    drop(copy);
    let held = held.or_else(|| pause.as_ref().map(Pause::held));
    drop(pause);
    // Asked of the JVM once it runs again: it answers on a thread of its own.
    let mut jvm_census = jvm_census;
    if let (Some(Ok(jvm)), Some(Ok(h))) = (&heap.jvm, jvm_census.as_mut()) {
        h.native_memory = jvm.native_memory(pid);
    }
    Ok(Reading {
        stopped_for: held,
        maps,
        residency,
        rss,
        census,
        ghc_census: None,
        go_census,
        jvm_census,
        read_from_copy,
        copy_note,
    })
}

/// The address ranges the runtimes' heaps the snapshot read hold: a Go heap's (its page
/// allocator's ranges) and a JVM's (the range reserved for its Java heap).
fn runtime_heap_ranges(
    go: &Option<Result<GoHeap, String>>,
    jvm: &Option<Result<JvmHeap, String>>,
) -> Vec<(u64, u64)> {
    let go = go.as_ref().and_then(|c| c.as_ref().ok());
    let jvm = jvm.as_ref().and_then(|c| c.as_ref().ok());
    let mut ranges: Vec<(u64, u64)> = (go.iter().flat_map(|g| g.ranges.iter().copied()))
        .chain(jvm.map(|j| j.reserved))
        .collect();
    ranges.sort_unstable();
    ranges
}

/// `maps` with the address `ranges` (sorted) another heap holds cut out of them (a
/// mapping split where a range lies inside it). glibc's census looks through anonymous
/// mappings for chunks mmapped alone, and for a main arena's segments, by the header
/// glibc writes at a page's start, and a runtime's objects can begin the same way: a cgo
/// server's snapshot found such a "chunk" in its Go heap, and the census was refused.
fn without_ranges(maps: &[Mapping], ranges: &[(u64, u64)]) -> Vec<Mapping> {
    let mut out = Vec::with_capacity(maps.len());
    for m in maps {
        let mut piece = |start: u64, end: u64| {
            out.push(Mapping {
                start,
                end,
                offset: m.offset + (start - m.start),
                ..m.clone()
            })
        };
        let mut from = m.start;
        for &(lo, hi) in ranges
            .iter()
            .filter(|&&(lo, hi)| lo < m.end && hi > m.start)
        {
            if lo > from {
                piece(from, lo);
            }
            from = from.max(hi);
        }
        if from < m.end {
            piece(from, m.end);
        }
    }
    out
}

/// A Go program's heap census, read while `pause` holds it (if it does). Err when the
/// process exited.
fn go_census_held(
    pid: u32,
    rt: &GoRuntime,
    mem: &mut ProcessMemory,
    pause: &mut Option<Pause>,
) -> Result<Result<GoHeap, String>> {
    match fragscope_census::golang::census_held(pid, rt, mem, pause) {
        Ok(h) => Ok(Ok(h)),
        Err(_) if gone(pid) => bail!("process {pid} exited while it was read"),
        Err(GoCensusError::Unreadable(e)) => Err(anyhow::anyhow!(e)),
        Err(GoCensusError::Inconsistent(e)) => Ok(Err(format!(
            "no Go heap census: the runtime's spans did not hold together ({e})"
        ))),
    }
}

/// A JVM's heap census, read while `pause` holds it (if it does). Err when the process
/// exited.
fn jvm_census_held(
    pid: u32,
    jvm: &HotSpot,
    mem: &mut ProcessMemory,
    pause: &mut Option<Pause>,
) -> Result<Result<JvmHeap, String>> {
    match fragscope_census::jvm::census_held(pid, jvm, mem, pause) {
        Ok(h) => Ok(Ok(h)),
        Err(_) if gone(pid) => bail!("process {pid} exited while it was read"),
        Err(CensusError::Unreadable(e)) => Err(anyhow::anyhow!(e)),
        Err(CensusError::NoHeap) => Ok(Err(
            "no JVM heap census: the JVM has not made its heap yet".into(),
        )),
        Err(CensusError::Inconsistent(e)) => Ok(Err(format!("no JVM heap census: {e}"))),
    }
}

/// The census of a malloc heap: glibc's read from the copy when there is one, else from
/// the process (`mem`); tcmalloc's, jemalloc's and mimalloc's from the process. Err when the process exited
/// meanwhile; Ok(Err) says why the heap was not read.
fn read_allocator(
    opts: &SnapshotOptions,
    heap: &HeapReader,
    mem: &mut ProcessMemory,
    copy_mem: Option<&mut ProcessMemory>,
    maps: &[Mapping],
    residency: &[ResidentRange],
    page: u64,
) -> Result<Result<AllocatorHeap, String>> {
    let pid = heap.pid;
    Ok(match &heap.glibc {
        Some(Ok(layout)) => {
            let reading = copy_mem.unwrap_or(mem);
            match glibc::census(reading, layout, maps, residency, page) {
                Ok(h) => Ok(AllocatorHeap::Glibc(h)),
                Err(_) if gone(pid) => bail!("process {pid} exited while it was read"),
                Err(CensusError::NoHeap) => {
                    Err("glibc malloc has not been used yet in this process".into())
                }
                Err(e) if !opts.stop => Err(format!(
                    "the heap changed while it was read without stopping the process \
                     (--no-stop): {e}; take the snapshot without --no-stop"
                )),
                Err(e) => Err(format!("glibc's heap did not hold together: {e}")),
            }
        }
        Some(Err(why)) => Err(why.clone()),
        None => match (&heap.tcmalloc, &heap.jemalloc, &heap.mimalloc) {
            (Some(Ok(l)), _, _) => allocator_census(opts, pid, "tcmalloc", || {
                tcmalloc::census(mem, l).map(AllocatorHeap::Tcmalloc)
            })?,
            (_, Some(Ok(l)), _) => allocator_census(opts, pid, "jemalloc", || {
                jemalloc::census(mem, l, residency).map(AllocatorHeap::Jemalloc)
            })?,
            (_, _, Some(Ok(l))) => allocator_census(opts, pid, "mimalloc", || {
                mimalloc::census(mem, l, residency).map(AllocatorHeap::Mimalloc)
            })?,
            (Some(Err(why)), _, _) | (_, Some(Err(why)), _) | (_, _, Some(Err(why))) => {
                Err(why.clone())
            }
            (None, None, None) => Err(format!(
                "the process runs on {}; fragscope does not read that allocator's own \
                 metadata yet, so this snapshot gives the page-level picture (RSS, \
                 resident heap pages, lazily freed pages), not live and free bytes",
                match (heap.allocator, &heap.linked) {
                    (_, Some(l)) => format!(
                        "a {} linked into {}",
                        l.allocator,
                        l.image.rsplit('/').next().unwrap_or(&l.image)
                    ),
                    ("unknown", None) => "an allocator fragscope does not recognise".into(),
                    (a, None) => a.into(),
                }
            )),
        },
    })
}

/// The census of an allocator read from the process itself (tcmalloc, jemalloc, mimalloc): Err
/// when the process exited meanwhile; Ok(Err) says why the heap was not read.
fn allocator_census(
    opts: &SnapshotOptions,
    pid: u32,
    name: &str,
    read: impl FnOnce() -> Result<AllocatorHeap, String>,
) -> Result<Result<AllocatorHeap, String>> {
    Ok(match read() {
        Ok(h) => Ok(h),
        Err(_) if gone(pid) => bail!("process {pid} exited while it was read"),
        Err(e) if !opts.stop => Err(format!(
            "the heap changed while it was read without stopping the process \
             (--no-stop): {e}; take the snapshot without --no-stop"
        )),
        Err(e) => Err(format!("{name}'s heap did not hold together: {e}")),
    })
}

type TraceWriter = ChunkWriter<BufWriter<std::fs::File>>;

/// The censuses of runtime heaps malloc never sees, taken with the snapshot: written
/// just before its residency, which splits them.
struct RuntimeCensuses {
    pymalloc: Option<Result<PymallocPools, String>>,
    go: Option<Result<GoHeap, String>>,
    jvm: Option<Result<JvmHeap, String>>,
    v8: Option<Result<V8Heap, String>>,
}

/// The trace's Meta, the process, and the allocator linked into it.
fn write_process(
    w: &mut TraceWriter,
    process: Process,
    page: u64,
    linked: Option<&LinkedAllocator>,
) -> Result<()> {
    let meta = meta_now(page, StackMode::None, 0, 0, process.argv.clone());
    w.write_chunk(ChunkKind::Meta, &meta.encode())?;
    w.write_chunk(ChunkKind::Process, &process.encode())?;
    if let Some(l) = linked {
        w.write_chunk(ChunkKind::LinkedAllocator, &l.record(0).encode())?;
    }
    Ok(())
}

/// The process's maps, RSS, smaps_rollup, pymalloc, Go and JVM censuses, and residency.
fn write_readings(
    w: &mut TraceWriter,
    maps: Vec<Mapping>,
    rss: Option<RssSample>,
    rollup: Option<Vec<(String, u64)>>,
    runtimes: RuntimeCensuses,
    residency: Vec<ResidentRange>,
    page: u64,
) -> Result<()> {
    let RuntimeCensuses {
        pymalloc,
        go,
        jvm,
        v8,
    } = runtimes;
    w.write_chunk(
        ChunkKind::Maps,
        &Maps {
            stream: 0,
            tick: 0,
            mappings: maps,
        }
        .encode(),
    )?;
    if let Some(rss) = rss {
        w.write_chunk(
            ChunkKind::Rss,
            &RssBatch {
                stream: 0,
                samples: vec![rss],
            }
            .encode(),
        )?;
    }
    if let Some(fields) = rollup {
        w.write_chunk(
            ChunkKind::Rollup,
            &Rollup {
                stream: 0,
                tick: 0,
                fields,
            }
            .encode(),
        )?;
    }
    write_runtime_census(w, ChunkKind::PymallocCensus, pymalloc)?;
    write_runtime_census(w, ChunkKind::GoCensus, go)?;
    write_runtime_census(w, ChunkKind::JvmCensus, jvm)?;
    write_runtime_census(w, ChunkKind::V8Census, v8)?;
    w.write_chunk(
        ChunkKind::Pagemap,
        &Pagemap {
            stream: 0,
            tick: 0,
            reason: SnapshotReason::Periodic,
            page_size: page as u32,
            ranges: residency,
        }
        .encode(),
    )?;
    Ok(())
}

/// A runtime heap's census of the snapshot's moment, when the process runs that runtime.
fn write_runtime_census<T: CensusBody>(
    w: &mut TraceWriter,
    kind: ChunkKind,
    result: Option<Result<T, String>>,
) -> Result<()> {
    if let Some(result) = result {
        let census = Census {
            stream: 0,
            tick: 0,
            reason: SnapshotReason::Periodic,
            result,
        };
        w.write_chunk(kind, &census.encode())?;
    }
    Ok(())
}

/// The GHC block census or the malloc heap's; returns the heap's bytes and why its
/// allocator's metadata was not read, when it was not.
fn write_censuses(
    w: &mut TraceWriter,
    opts: &SnapshotOptions,
    allocator: &str,
    stopped_for: Option<Duration>,
    ghc_census: Option<Result<GhcBlocks, String>>,
    census: Option<Result<AllocatorHeap, String>>,
    resident_heap_bytes: u64,
) -> Result<(u64, Option<String>)> {
    let mut heap_bytes = 0;
    let mut note = None;
    if let Some(result) = ghc_census {
        if let Ok(b) = &result {
            heap_bytes = b.megablocks << 20;
        }
        note = result.as_ref().err().cloned().or_else(|| {
            (!opts.stop).then(|| {
                "--no-stop applies to malloc heaps: the GHC block census always holds the \
                 program, for a few milliseconds"
                    .to_string()
            })
        });
        w.write_chunk(
            ChunkKind::GhcCensus,
            &GhcCensus {
                stream: 0,
                tick: 0,
                reason: SnapshotReason::Periodic,
                result,
            }
            .encode(),
        )?;
    }
    let census = census.unwrap_or_else(|| {
        if allocator == "go" {
            return Ok(AllocatorHeap::Unused);
        }
        Err("a GHC program: its heap is described by the RTS's block census".into())
    });
    if let Ok(h) = &census {
        heap_bytes = match h {
            AllocatorHeap::Glibc(h) => {
                h.arenas.iter().map(|a| a.system_mem).sum::<u64>() + h.mmapped_bytes
            }
            AllocatorHeap::Tcmalloc(h) => h.system_bytes - h.unmapped_bytes,
            AllocatorHeap::Jemalloc(h) => h.mapped_bytes(),
            // 3.x commits its arenas whole where the OS overcommits: its heap is what
            // it holds resident.
            AllocatorHeap::Mimalloc(h) if h.is_v3() => {
                h.used_page_resident() + h.free_pages_resident() + h.metadata_resident
            }
            AllocatorHeap::Mimalloc(h) => h.committed_bytes,
            AllocatorHeap::Unused => 0,
        };
    } else if allocator != "ghc" {
        note = census.as_ref().err().cloned();
        // The page-level picture: the heap is what its mappings hold resident.
        heap_bytes = resident_heap_bytes;
    }
    w.write_chunk(
        ChunkKind::HeapCensus,
        &HeapCensus {
            stream: 0,
            tick: 0,
            allocator: allocator.into(),
            stopped: stopped_for.is_some(),
            pause_us: stopped_for.map_or(0, |d| d.as_micros() as u64),
            result: census,
        }
        .encode(),
    )?;
    Ok((heap_bytes, note))
}

/// Bytes of the heap's mappings resident, by pagemap.
fn resident_bytes(residency: &[fragscope_trace::ResidentRange], page: u64) -> u64 {
    residency.iter().map(|r| r.resident_pages()).sum::<u64>() * page
}

fn read_residency(
    pid: u32,
    maps: &[fragscope_trace::Mapping],
    page: u64,
) -> Vec<fragscope_trace::ResidentRange> {
    let heap: Vec<&fragscope_trace::Mapping> =
        maps.iter().filter(|m| procfs::may_hold_heap(m)).collect();
    procfs::read_residency(pid, &heap, page).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range inside a mapping splits it; one over its end or start trims it; one over a
    /// whole mapping takes it out; mappings outside every range stay whole.
    #[test]
    fn a_heaps_ranges_are_cut_out_of_the_mappings() {
        let mapping = |start: u64, end: u64| Mapping {
            start,
            end,
            perms: "rw-p".into(),
            offset: 0,
            inode: 0,
            path: String::new(),
            build_id: Vec::new(),
        };
        let maps = [
            mapping(0x1000, 0x9000),
            mapping(0xa000, 0xc000),
            mapping(0xd000, 0xe000),
            mapping(0xf000, 0x10000),
        ];
        let ranges = [(0x2000, 0x3000), (0x8000, 0xb000), (0xd000, 0xe000)];
        let cut: Vec<(u64, u64, u64)> = without_ranges(&maps, &ranges)
            .iter()
            .map(|m| (m.start, m.end, m.offset))
            .collect();
        assert_eq!(
            cut,
            [
                (0x1000, 0x2000, 0),
                (0x3000, 0x8000, 0x2000),
                (0xb000, 0xc000, 0x1000),
                (0xf000, 0x10000, 0),
            ]
        );
        assert_eq!(without_ranges(&maps, &[]), maps);
    }
}
