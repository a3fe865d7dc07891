//! One recording: launch, serve the interposer's connections, sample /proc, write.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{BufWriter, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fragscope_trace::runtime_samples::RuntimeSamples;
use fragscope_trace::{
    ChunkKind, ChunkWriter, EndHow, EventsHeader, Mapping, Maps, Meta, Origin, PackedBuffer,
    Packer, Pagemap, Process, ProcessEnd, Rollup, RssBatch, RssSample, SnapshotReason, StackMode,
    WaitStatus,
};

use crate::clock::ClockPage;
use crate::output::{create_output, meta_now};
use crate::procfs;
use crate::protocol::{
    self, ExecTarget, MsgHeader, MsgType, HELLO_ATTACHED, HELLO_FORKED, HELLO_MARKS_IDLE,
    HELLO_RESUMED, HELLO_WANTS_CLOCK,
};

/// What `fragscope record` was asked to do.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub output: PathBuf,
    pub stacks: StackMode,
    /// Mean bytes between stack samples (sampled mode).
    pub sample_bytes: u64,
    /// Interval of page-residency snapshots.
    pub snapshot_ms: u32,
    /// A thread sends its buffer at least this often while it allocates.
    pub flush_ms: u32,
    /// zstd level of the trace chunks; None: level 3, and level 1 for event buffers
    /// (`ChunkWriter::with_events_level`).
    pub compression_level: Option<i32>,
    /// When to rewrite event buffers into the packed form (fragscope_trace::pack).
    pub pack: PackMode,
    /// The program and its arguments.
    pub command: Vec<OsString>,
    /// Replace whatever is at `output` (a file that is not a trace, a symbolic link).
    pub force: bool,
    /// Take a block census of a GHC program's heap at each snapshot.
    pub ghc_census: bool,
    /// Ask a GHC program for a -hT heap profile too (it changes the program's collections).
    pub ghc_heap_profile: bool,
    /// Record a process that is already running instead of starting `command`.
    pub attach: Option<AttachOptions>,
}

/// `record -p`: the process, and when to let it go (else at Ctrl-C, SIGTERM or its exit).
#[derive(Debug, Clone)]
pub struct AttachOptions {
    pub pid: u32,
    pub duration: Option<Duration>,
}

/// When event buffers are stored in the packed form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackMode {
    /// While the recorder keeps up: a process whose buffers queue up behind the packing
    /// is stored raw from then on (the program would otherwise wait for fragscope).
    Auto,
    /// Every buffer, even if the program must wait.
    Always,
    Never,
}

/// Auto packing stops for a process once this many bytes wait on its connection after
/// each of `BEHIND_STREAK` packed buffers in a row: its buffers arrive faster than they
/// are packed, and the queue is half full (an interposer buffer holds at most 128 KiB).
/// A burst of a few buffers is packed: stopping at the first buffer that waited made
/// how much of a bursty program got packed depend on the scheduler (many_stacks.c's
/// trace varied by 126% of its median over 5 runs; 58% since).
const BEHIND_BYTES: usize = (QUEUED_MESSAGES / 2) * (128 << 10);
const BEHIND_STREAK: u32 = 2;
/// Packing resumes after this many buffers in a row were stored raw with nothing waiting
/// behind them, doubled each time it resumes (up to the most), so a program that
/// allocates flat out is tried again less often; back to the first once packing kept up
/// for `KEPT_UP_BUFFERS` buffers in a row (a program busy only in bursts). A try costs
/// the recorder's CPU, not the program's time (it stops at half a queue), so the most is
/// low: with 256, a flat-out program (churn.c, 371 buffers) had 40 to 250 buffers packed
/// from run to run (2.5 to 3.7 bytes a call); with 16, 124 to 161 (3.0 to 3.2).
const FIRST_RESUME_AFTER: u32 = 1;
const MOST_RESUME_AFTER: u32 = 16;
const KEPT_UP_BUFFERS: u32 = 16;

/// Messages a connection's reader may hold for its handler (each at most an interposer
/// buffer): enough that the program goes on while a few buffers are packed, few enough
/// that a recorder that falls behind makes the program wait rather than piling up its
/// buffers.
const QUEUED_MESSAGES: usize = 16;

/// A process that made no malloc-family call.
#[derive(Debug, Clone)]
pub struct SilentProcess {
    /// Its command line and pid.
    pub label: String,
    /// Its executable is a Go program (whose runtime does not allocate through malloc).
    pub go: bool,
    /// The program fragscope started (its first image), rather than one it ran.
    pub main: bool,
    /// Its highest VmRSS at a snapshot, in KiB: a small tool that needs no malloc (true,
    /// sleep) is told apart from a program whose heap fragscope cannot see.
    pub peak_rss_kib: u64,
}

/// How a recording ended.
#[derive(Debug, Clone)]
pub struct RecordOutcome {
    /// The program's exit code, or 128 + the signal that ended it.
    pub exit_code: i32,
    pub file_bytes: u64,
    pub event_bytes: u64,
    pub processes: u32,
    pub duration: Duration,
    /// Process images that made no malloc-family call at all.
    pub silent_processes: Vec<SilentProcess>,
    /// The GHC RTS eventlog written beside the trace, when one was asked for.
    pub ghc_eventlog: Option<PathBuf>,
    /// Why a GHC program was recorded without an eventlog, and how to rebuild it.
    pub ghc_advice: Option<String>,
    /// Process images the program ran that could not be traced (also in the trace).
    pub untraced: Vec<fragscope_trace::Untraced>,
    /// Connections refused: from processes outside the recorded program, or without the
    /// recording's token.
    pub refused_connections: u64,
}

/// zstd levels of a trace by default: event buffers at the fastest (the recorder competes
/// with the program for CPU; raw ones are stored so when their process makes calls faster
/// than the recorder packs them, and packed ones lose 0-2% to level 3), everything else
/// at 3.
const DEFAULT_COMPRESSION_LEVEL: i32 = 3;
const EVENTS_COMPRESSION_LEVEL: i32 = 1;

const RSS_INTERVAL: Duration = Duration::from_millis(10);
const ROLLUP_EVERY: u32 = 10; // RSS intervals
const NEAR_PEAK_GROWTH: f64 = 1.10;
const NEAR_PEAK_MIN_GAP: Duration = Duration::from_millis(250);
/// After the program exits, how long its descendants may keep their connections open.
const DESCENDANT_GRACE: Duration = Duration::from_secs(2);
/// How long a connection waits for the same process's earlier one (see `Arrival`).
const EARLIER_CONNECTION_WAIT: Duration = Duration::from_secs(2);

/// A chunk for the writer: its kind, payload and, for one compressed in sections, where
/// the sections end (empty: compressed whole).
type Chunk = (ChunkKind, Vec<u8>, Vec<usize>);

struct ProcState {
    pid: u32,
    connections: u32,
    ended: bool,
    end: Option<(EndHow, i32)>,
    rss: Vec<RssSample>,
    last_maps: Vec<Mapping>,
    peak_rss_at_snapshot: u64,
    last_snapshot: Option<Instant>,
    event_bytes: u64,
    label: String,
    /// The executable, as the process's interposer saw it.
    exe: String,
    /// Packs this stream's buffers; shared by the stream's connections, which may follow
    /// one another, and held while a packed buffer is sent, so that buffers are stored in
    /// the order they were packed.
    packer: Arc<Mutex<Packer>>,
    /// Its buffers are packed. Off while the recorder is behind; back on (from empty
    /// tables of blocks, `Packer::resume`) after `resume_after` raw buffers in a row with
    /// nothing waiting behind them.
    packing: bool,
    resume_after: u32,
    /// Raw buffers in a row stored with nothing waiting behind them.
    quiet_raw: u32,
    /// Buffers packed since packing last started.
    packed_run: u32,
}

struct Shared {
    out: SyncSender<Chunk>,
    clock: ClockPage,
    procs: Mutex<Procs>,
    build_ids: Mutex<HashMap<String, Vec<u8>>>,
    page_size: u64,
    event_bytes: AtomicU64,
    arrivals: Mutex<Vec<Arrival>>,
    /// When to store event buffers in the packed form.
    pack: PackMode,
    censuses: crate::census::Censuses,
    /// The recording's secret: a connection whose HELLO lacks it is refused.
    token: String,
    refused_connections: AtomicU64,
    /// Images announced by an exec (EXEC messages): each should connect as a process.
    announced_images: Mutex<Vec<AnnouncedImage>>,
}

/// An exec announced by a traced process (or a vfork child of one).
struct AnnouncedImage {
    target: ExecTarget,
    tick: u64,
    /// The stream whose connection announced it: the image, if it connected, is a later
    /// stream (it may connect before the announcement is read, when a vfork child
    /// exec'd it).
    parent_stream: u32,
}

/// A connection being served. Each is read by its own thread, so nothing but this keeps
/// one process's connections in the order it made them: after an exec, or after the
/// program closed our descriptor and the interposer reconnected, the new connection
/// must not be registered before the old one has been read to its end (else the new
/// image has no parent, or a resumed stream becomes a process of its own and its buffers
/// arrive out of order); nor a forked child's before its parent's is registered.
struct Arrival {
    id: u64,
    /// The connecting process, from SO_PEERCRED.
    pid: u32,
    registered: bool,
}

#[derive(Default)]
struct Procs {
    streams: Vec<ProcState>,
}

impl Shared {
    fn send(&self, kind: ChunkKind, payload: Vec<u8>) {
        self.send_sections(kind, payload, Vec::new());
    }

    /// Sends a chunk compressed in sections ending at `section_ends` (none: whole).
    fn send_sections(&self, kind: ChunkKind, payload: Vec<u8>, section_ends: Vec<usize>) {
        // The writer only goes away after every sender is done; an error means it failed,
        // which the writer reports itself.
        let _ = self.out.send((kind, payload, section_ends));
    }

    fn tick(&self) -> u64 {
        self.clock.tick()
    }

    /// Writes the memory map if it changed since the last one written for this stream.
    fn write_maps(&self, stream: u32, pid: u32) -> Option<Vec<Mapping>> {
        let mappings = procfs::read_maps(pid, &mut self.build_ids.lock().unwrap())?;
        let mut procs = self.procs.lock().unwrap();
        let st = procs.streams.get_mut(stream as usize)?;
        if st.last_maps != mappings {
            st.last_maps = mappings.clone();
            drop(procs);
            self.send(
                ChunkKind::Maps,
                Maps {
                    stream,
                    tick: self.tick(),
                    mappings: mappings.clone(),
                }
                .encode(),
            );
        }
        Some(mappings)
    }

    /// The residency of `pid`'s mappings that can hold heap objects, written as a chunk of
    /// `kind`: a snapshot's (`Pagemap`), or a forked child's as it starts, before it has
    /// written much (`ForkResidency`): the pages it inherited from its parent, against which
    /// its snapshots tell the pages it copied since from those it made.
    fn write_residency(
        &self,
        kind: ChunkKind,
        stream: u32,
        pid: u32,
        mappings: &[Mapping],
        tick: u64,
        reason: SnapshotReason,
    ) {
        let heap: Vec<&Mapping> = mappings
            .iter()
            .filter(|m| procfs::may_hold_heap(m))
            .collect();
        if let Some(ranges) = procfs::read_residency(pid, &heap, self.page_size) {
            let residency = Pagemap {
                stream,
                tick,
                reason,
                page_size: self.page_size as u32,
                ranges,
            };
            self.send(kind, residency.encode());
        }
    }

    /// A page-residency snapshot of `pid` (smaps_rollup, memory map, residency, RSS) and
    /// a CPython process's pymalloc census; with `census`, a GHC block census is asked of
    /// the census thread too (see [`census_worker`]).
    fn snapshot(
        &self,
        stream: u32,
        pid: u32,
        reason: SnapshotReason,
        census: Option<&SyncSender<CensusRequest>>,
    ) {
        let tick = self.tick();
        if let Some(fields) = procfs::read_rollup(pid) {
            self.send(
                ChunkKind::Rollup,
                Rollup {
                    stream,
                    tick,
                    fields,
                }
                .encode(),
            );
        }
        // Before the residency: a pymalloc census is split by the residency read next,
        // and the model meets the census first.
        if let Some(census) = self.censuses.take_pymalloc(stream, pid, tick, reason) {
            self.send(ChunkKind::PymallocCensus, census.encode());
        }
        if let Some(census) = self.censuses.take_sbcl(stream, pid, tick, reason) {
            self.send(ChunkKind::SbclCensus, census.encode());
        }
        let Some(mappings) = self.write_maps(stream, pid) else {
            return;
        };
        self.write_residency(ChunkKind::Pagemap, stream, pid, &mappings, tick, reason);
        if let Some(census) = census {
            // Dropped when the census thread is still busy with the one before: the
            // next snapshot asks again.
            let _ = census.try_send(CensusRequest {
                stream,
                pid,
                reason,
            });
        }
        if let Some(rss) = procfs::read_rss(pid, tick) {
            let mut procs = self.procs.lock().unwrap();
            if let Some(st) = procs.streams.get_mut(stream as usize) {
                st.rss.push(rss);
                st.peak_rss_at_snapshot = st.peak_rss_at_snapshot.max(rss.vm_rss_kib);
                st.last_snapshot = Some(Instant::now());
            }
        }
    }

    fn flush_rss(&self, stream: u32, st: &mut ProcState) {
        if !st.rss.is_empty() {
            let samples = std::mem::take(&mut st.rss);
            self.send(ChunkKind::Rss, RssBatch { stream, samples }.encode());
        }
    }

    /// Ends a stream once: the process left, exec'd, or vanished.
    fn end_stream(&self, stream: u32) {
        let mut procs = self.procs.lock().unwrap();
        let Some(st) = procs.streams.get_mut(stream as usize) else {
            return;
        };
        if st.ended {
            return;
        }
        st.ended = true;
        self.flush_rss(stream, st);
        let (how, status) = st.end.unwrap_or((EndHow::Vanished, 0));
        drop(procs);
        self.send(
            ChunkKind::ProcessEnd,
            ProcessEnd {
                stream,
                tick: self.tick(),
                how,
                status,
            }
            .encode(),
        );
    }

    /// Waits (a bounded time) until the earlier connections this one must follow are done.
    fn wait_for_earlier_connections(&self, id: u64, pid: u32, ppid: u32) {
        let deadline = Instant::now() + EARLIER_CONNECTION_WAIT;
        loop {
            let blocked = self
                .arrivals
                .lock()
                .unwrap()
                .iter()
                .any(|a| a.id < id && (a.pid == pid || (a.pid == ppid && !a.registered)));
            if !blocked || Instant::now() >= deadline {
                return;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn set_registered(&self, id: u64) {
        if let Some(a) = self
            .arrivals
            .lock()
            .unwrap()
            .iter_mut()
            .find(|a| a.id == id)
        {
            a.registered = true;
        }
    }

    /// A new process image, or a known one reconnecting.
    fn register(&self, hello: &protocol::Hello) -> u32 {
        let mut procs = self.procs.lock().unwrap();
        let open_with =
            |pid: u32, procs: &Procs| procs.streams.iter().rposition(|s| s.pid == pid && !s.ended);
        if hello.flags & HELLO_RESUMED != 0 {
            if let Some(i) = open_with(hello.pid, &procs) {
                procs.streams[i].connections += 1;
                return i as u32;
            }
        }
        let (origin, parent) = if hello.flags & HELLO_FORKED != 0 {
            (Origin::Forked, open_with(hello.ppid, &procs))
        } else if hello.flags & HELLO_ATTACHED != 0 {
            (Origin::Attached, None)
        } else {
            // An image whose pid we saw before was exec'd from it.
            (
                Origin::Started,
                procs.streams.iter().rposition(|s| s.pid == hello.pid),
            )
        };
        let stream = procs.streams.len() as u32;
        let label = format!("{} (pid {})", hello.argv.join(" "), hello.pid);
        procs.streams.push(ProcState {
            pid: hello.pid,
            connections: 1,
            ended: false,
            end: None,
            rss: Vec::new(),
            last_maps: Vec::new(),
            peak_rss_at_snapshot: 0,
            last_snapshot: None,
            event_bytes: 0,
            label,
            exe: hello.exe.clone(),
            packer: Arc::default(),
            packing: self.pack != PackMode::Never,
            resume_after: FIRST_RESUME_AFTER,
            quiet_raw: 0,
            packed_run: 0,
        });
        drop(procs);
        let process = Process {
            stream,
            pid: hello.pid,
            ppid: hello.ppid,
            origin,
            parent_stream: parent.map(|p| p as u32),
            start_tick: hello.tick,
            argv: hello.argv.clone(),
            exe: hello.exe.clone(),
            fork_mark: (origin == Origin::Forked && hello.fork_mark != 0)
                .then_some(hello.fork_mark),
        };
        self.send(ChunkKind::Process, process.encode());
        stream
    }
}

fn ack(conn: &mut UnixStream) {
    let _ = conn.write_all(&[1]);
}

/// Sends `fd` over `conn` with a one-byte message (SCM_RIGHTS).
fn send_descriptor(conn: &UnixStream, fd: std::os::fd::BorrowedFd<'_>) {
    let byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one header and one int.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd.as_raw_fd());
        libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
    }
}

/// Where a connecting process stands to the recorded program.
#[derive(Debug, PartialEq, Eq)]
enum Kinship {
    /// The recorder or one of its descendants: the program and whatever it started
    /// (orphans are re-parented to the recorder, their subreaper).
    InTree,
    /// Its ancestry leads elsewhere.
    Outsider,
    /// It is gone already: its HELLO's token decides.
    Unknown,
}

/// `attached`: the process `record -p` attached to, whose descendants are the program's.
fn kinship(pid: u32, attached: Option<u32>) -> Kinship {
    let me = std::process::id();
    for _attempt in 0..3 {
        let mut p = pid;
        let mut chain_broke = false;
        for _depth in 0..4096 {
            if p == me || Some(p) == attached {
                return Kinship::InTree;
            }
            if p <= 1 {
                return Kinship::Outsider;
            }
            match procfs::parent_pid(p) {
                Some(parent) => p = parent,
                None if p == pid => return Kinship::Unknown,
                None => {
                    chain_broke = true;
                    break;
                }
            }
        }
        if !chain_broke {
            return Kinship::Outsider;
        }
        // An ancestor exited while we walked: its children are being re-parented.
        thread::sleep(Duration::from_millis(1));
    }
    Kinship::Unknown
}

/// A random secret for this recording (hex), handed to the program in its environment.
fn recording_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: getrandom writes at most the given length into the buffer.
        let n = unsafe { libc::getrandom(bytes[got..].as_mut_ptr().cast(), bytes.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("reading random bytes for the recording's token");
        }
        got += n as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The pid and uid of the process at the other end of a Unix socket (pid 0 if unknown).
fn peer_credentials(conn: &UnixStream) -> (u32, u32) {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        (cred.pid as u32, cred.uid)
    } else {
        (0, u32::MAX)
    }
}

/// Serves connection `id` until it closes, then forgets it.
fn serve_arrival(shared: Arc<Shared>, conn: UnixStream, id: u64) {
    serve_connection(&shared, conn, id);
    shared.arrivals.lock().unwrap().retain(|a| a.id != id);
}

/// Stores one connection's event buffers (packed while its stream is packing).
struct EventStore<'a> {
    shared: &'a Arc<Shared>,
    packed: PackedBuffer,
    pack_failed: bool,
    /// Packed buffers in a row after which the connection had a backlog.
    behind: u32,
}

impl EventStore<'_> {
    /// Stores one buffer (`has_usable`: it defines usable sizes); says whether it was
    /// packed.
    fn events(&mut self, h: EventsHeader, payload: &[u8], has_usable: bool) -> bool {
        let shared = self.shared;
        shared
            .event_bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let (packer, packing, pid) = {
            let mut procs = shared.procs.lock().unwrap();
            match procs.streams.get_mut(h.stream as usize) {
                Some(st) => {
                    st.event_bytes += payload.len() as u64;
                    (Some(st.packer.clone()), st.packing, st.pid)
                }
                None => (None, false, 0),
            }
        };
        match packer {
            Some(packer) if packing => {
                let mut p = packer.lock().unwrap();
                if let Err(e) = p.pack(h.tid, h.first_tick, payload, &mut self.packed) {
                    // Our own interposer wrote it: say so once, keep what decoded.
                    if !self.pack_failed {
                        eprintln!("fragscope: a buffer of pid {pid} ends early: {e}");
                        self.pack_failed = true;
                    }
                }
                let h = EventsHeader {
                    packed: true,
                    tables_reset: self.packed.tables_reset,
                    ..h
                };
                let payload = h.encode_with(&self.packed.bytes);
                // The header joins the first section (the planes' directory).
                let header_len = payload.len() - self.packed.bytes.len();
                let ends = self.packed.section_ends.iter().map(|e| e + header_len);
                shared.send_sections(ChunkKind::PackedEvents, payload, ends.collect());
                true
            }
            packer => {
                // Held while the buffer is sent, as a packed one is: a packed buffer that
                // relies on the sizes this one defines must not reach the file first.
                let learner = packer.filter(|_| has_usable && shared.pack == PackMode::Auto);
                let _learnt = learner.as_ref().map(|packer| {
                    let mut p = packer.lock().unwrap();
                    p.learn_usable(h.tid, h.first_tick, payload);
                    p
                });
                shared.send(ChunkKind::Events, h.encode_with(payload));
                false
            }
        }
    }

    /// Auto packing: `backlog` bytes waited on the connection once a buffer of `stream`
    /// was stored (`packed` or not). A stream that stays behind is stored raw until it
    /// has kept up for a while.
    fn stored_with_backlog(&mut self, stream: u32, packed: bool, backlog: usize) {
        let resume = {
            let mut procs = self.shared.procs.lock().unwrap();
            let Some(st) = procs.streams.get_mut(stream as usize) else {
                return;
            };
            if packed {
                st.packed_run = st.packed_run.saturating_add(1);
                self.behind = if backlog >= BEHIND_BYTES {
                    self.behind + 1
                } else {
                    0
                };
                if self.behind >= BEHIND_STREAK && st.packing {
                    st.packing = false;
                    st.quiet_raw = 0;
                    self.behind = 0;
                    if st.packed_run >= KEPT_UP_BUFFERS {
                        st.resume_after = FIRST_RESUME_AFTER;
                    }
                }
                return;
            }
            st.quiet_raw = if backlog == 0 { st.quiet_raw + 1 } else { 0 };
            if st.packing || st.quiet_raw < st.resume_after {
                return;
            }
            st.resume_after = (st.resume_after * 2).min(MOST_RESUME_AFTER);
            st.packed_run = 0;
            st.packer.clone()
        };
        // Tables emptied before any buffer is packed again.
        resume.lock().unwrap().resume();
        if let Some(st) = self
            .shared
            .procs
            .lock()
            .unwrap()
            .streams
            .get_mut(stream as usize)
        {
            st.packing = true;
        }
    }
}

/// Bytes received on `conn` and not read yet.
fn unread_bytes(conn: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(conn.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

/// A connection's reading side: reads messages off the socket as they arrive, so that the
/// program does not wait while its handler packs a buffer. Payloads come back through
/// `spare` to be reused (a fresh 128 KiB buffer each time would be mapped and faulted in).
fn read_messages(
    conn: UnixStream,
    tx: SyncSender<(MsgHeader, Vec<u8>)>,
    spare: Receiver<Vec<u8>>,
    queued: Arc<AtomicUsize>,
) {
    let mut reader = std::io::BufReader::with_capacity(256 << 10, conn);
    while let Ok(Some(header)) = protocol::read_header(&mut reader) {
        if header.len > protocol::MAX_PAYLOAD {
            break; // not our interposer speaking
        }
        let mut payload = spare.try_recv().unwrap_or_default();
        payload.resize(header.len as usize, 0);
        if reader.read_exact(&mut payload).is_err() {
            break;
        }
        queued.fetch_add(payload.len(), Ordering::Relaxed);
        if tx.send((header, payload)).is_err() {
            break;
        }
    }
}

/// Serves one interposer connection until it closes: a thread of its own reads the
/// messages (`read_messages`), this one handles them in the order they came.
fn serve_connection(shared: &Arc<Shared>, mut conn: UnixStream, id: u64) {
    let mut stream: Option<u32> = None;
    let mut pid = 0u32;
    let mut marks_idle = false;
    let mut store = EventStore {
        shared,
        packed: PackedBuffer::default(),
        pack_failed: false,
        behind: 0,
    };
    // Copies of other threads' buffers sent at exit, by thread, until superseded.
    let mut copies: HashMap<u32, (EventsHeader, Vec<u8>)> = HashMap::new();
    // Their seq by thread once stored (at the exit, before its snapshot).
    let mut stored_copies: HashMap<u32, u32> = HashMap::new();
    let (tx, messages) = sync_channel(QUEUED_MESSAGES);
    let (spare_tx, spare) = channel();
    // Payload bytes read and not handled yet.
    let queued = Arc::new(AtomicUsize::new(0));
    let reader = match conn.try_clone().and_then(|c| {
        let queued = queued.clone();
        thread::Builder::new()
            .name("fragscope-read".into())
            .spawn(move || read_messages(c, tx, spare, queued))
    }) {
        Ok(handle) => handle,
        Err(_) => return,
    };
    for (header, payload) in messages {
        queued.fetch_sub(payload.len(), Ordering::Relaxed);
        match header.kind {
            MsgType::Hello => {
                let hello =
                    protocol::parse_hello(&payload).filter(|h| h.token == shared.token.as_bytes());
                let Some(mut hello) = hello else {
                    // Not one of the recording's processes: it adds nothing to the trace.
                    shared.refused_connections.fetch_add(1, Ordering::Relaxed);
                    let _ = conn.shutdown(std::net::Shutdown::Both);
                    break;
                };
                let wants_clock = hello.flags & HELLO_WANTS_CLOCK != 0;
                if wants_clock {
                    // It had no clock to read its start from.
                    hello.tick = shared.tick();
                }
                shared.wait_for_earlier_connections(id, hello.pid, hello.ppid);
                let s = shared.register(&hello);
                shared.set_registered(id);
                if wants_clock {
                    send_descriptor(&conn, shared.clock.descriptor());
                }
                if hello.flags & HELLO_RESUMED == 0 {
                    let maps = shared.write_maps(s, hello.pid);
                    if let (Some(maps), true) = (maps, hello.flags & HELLO_FORKED != 0) {
                        let (kind, tick) = (ChunkKind::ForkResidency, shared.tick());
                        let reason = SnapshotReason::Periodic;
                        shared.write_residency(kind, s, hello.pid, &maps, tick, reason);
                    }
                }
                stream = Some(s);
                pid = hello.pid;
                marks_idle = hello.flags & HELLO_MARKS_IDLE != 0;
            }
            MsgType::Events => {
                let Some(s) = stream else { continue };
                // The interposer marks a thread's last buffer in the high bit of seq, a
                // copy of another thread's buffer taken at exit (which that thread may
                // still extend and send itself, under the same seq) in the next one, an
                // empty buffer sent for an idle thread in the one after, and a buffer
                // that defines usable sizes in the fourth.
                let h = EventsHeader {
                    stream: s,
                    tid: header.tid,
                    seq: header.seq & 0x0fff_ffff,
                    first_tick: header.first_tick,
                    last_tick: header.last_tick,
                    thread_exited: header.seq & 0x8000_0000 != 0,
                    thread_idle: header.seq & 0x2000_0000 != 0,
                    process_marks_idle: marks_idle,
                    packed: false,
                    tables_reset: false,
                };
                if header.seq & 0x4000_0000 != 0 {
                    copies.insert(h.tid, (h, payload));
                    continue;
                }
                if copies.get(&h.tid).is_some_and(|(c, _)| c.seq == h.seq) {
                    copies.remove(&h.tid); // superseded by the thread's own, longer buffer
                }
                if stored_copies.get(&h.tid).is_some_and(|&seq| h.seq >= seq) {
                    // The copy is stored: what the thread did after the exit is lost, as at
                    // any exit (storing the same buffer again would record calls twice,
                    // and a later one without it, frees of blocks it holds as missing).
                    continue;
                }
                let packed = store.events(h, &payload, header.seq & 0x1000_0000 != 0);
                if shared.pack == PackMode::Auto {
                    let backlog = queued.load(Ordering::Relaxed) + unread_bytes(&conn);
                    store.stored_with_backlog(s, packed, backlog);
                }
            }
            MsgType::MapsChanged => {
                if let Some(s) = stream {
                    shared.write_maps(s, pid);
                }
                ack(&mut conn);
            }
            MsgType::Exit => {
                if let (Some(s), Some((status, how))) = (stream, protocol::parse_exit(&payload)) {
                    let how = match how {
                        0 => EndHow::Exit,
                        1 => EndHow::QuickExit,
                        3 => EndHow::Detached,
                        _ => EndHow::ExitUnknownStatus,
                    };
                    shared.procs.lock().unwrap().streams[s as usize].end = Some((how, status));
                    for (tid, (h, copy)) in copies.drain() {
                        stored_copies.insert(tid, h.seq);
                        store.events(h, &copy, true);
                    }
                    shared.snapshot(s, pid, SnapshotReason::Exit, None);
                }
                ack(&mut conn);
            }
            MsgType::Exec => {
                if let Some(s) = stream {
                    let target = protocol::parse_exec(&payload);
                    // A vfork child's exec (it shares this connection) does not end us.
                    if target.as_ref().is_none_or(|t| t.pid == pid) {
                        shared.procs.lock().unwrap().streams[s as usize].end =
                            Some((EndHow::Exec, 0));
                    }
                    if let Some(target) = target {
                        shared
                            .announced_images
                            .lock()
                            .unwrap()
                            .push(AnnouncedImage {
                                target,
                                tick: shared.tick(),
                                parent_stream: s,
                            });
                    }
                }
            }
            MsgType::ExecFailed => {
                if let (Some(s), Some(failed)) = (stream, protocol::parse_exec_failed(&payload)) {
                    let mut announced = shared.announced_images.lock().unwrap();
                    if let Some(i) = announced
                        .iter()
                        .rposition(|a| a.parent_stream == s && a.target.pid == failed)
                    {
                        announced.remove(i);
                    }
                    drop(announced);
                    if failed == pid {
                        let st = &mut shared.procs.lock().unwrap().streams[s as usize];
                        if matches!(st.end, Some((EndHow::Exec, _))) {
                            st.end = None;
                        }
                    }
                }
            }
            MsgType::Python | MsgType::Lisp => {
                if let Some(s) = stream {
                    // The interposer's header carries the sampling mean (CPython) or the
                    // region size (SBCL) in seq.
                    let samples = RuntimeSamples {
                        stream: s,
                        mean_bytes: header.seq.into(),
                        first_tick: header.first_tick,
                        records: payload.clone(),
                    };
                    let kind = if header.kind == MsgType::Lisp {
                        ChunkKind::LispSamples
                    } else {
                        ChunkKind::PythonSamples
                    };
                    shared.send(kind, samples.encode());
                }
            }
            MsgType::Unknown(_) => {}
        }
        let _ = spare_tx.send(payload);
    }
    let _ = reader.join();
    for (_, (h, copy)) in copies.drain() {
        store.events(h, &copy, true);
    }
    let Some(s) = stream else { return };
    let mut procs = shared.procs.lock().unwrap();
    let st = &mut procs.streams[s as usize];
    st.connections = st.connections.saturating_sub(1);
    let said_goodbye = st.end.is_some();
    let gone = !process_alive(st.pid);
    drop(procs);
    // A process that lost its connection without a goodbye but still runs may reconnect
    // (it closed our descriptor behind our back); the sampler ends it when it is gone.
    if said_goodbye || gone {
        shared.end_stream(s);
    }
}

/// Tells the ticker and the sampler to stop, and wakes them at once: they would otherwise
/// finish their sleep first, and every recording would end that much later.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    fn stop(&self) {
        *self.stopped.lock().unwrap() = true;
        self.wake.notify_all();
    }

    /// Sleeps for `d` unless stopped meanwhile; true once stopped.
    fn sleep(&self, d: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap();
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, d, |stopped| !*stopped)
            .unwrap();
        *stopped
    }
}

fn process_alive(pid: u32) -> bool {
    procfs::read_rss(pid, 0).is_some()
}

/// A GHC block census to take, asked by a snapshot.
struct CensusRequest {
    stream: u32,
    pid: u32,
    reason: SnapshotReason,
}

/// Takes the censuses the sampler asks for, one at a time, on its own thread: a census
/// with its reference scan can read hundreds of MiB, and the sampler must go on taking
/// RSS every 10 ms meanwhile (else the timeline has a hole of that length, a phase of
/// its own hidden in it). The census's time is when it stops the program.
fn census_worker(shared: &Shared, requests: Receiver<CensusRequest>) {
    for r in requests {
        if let Some(census) = shared
            .censuses
            .take(r.stream, r.pid, || shared.tick(), r.reason)
        {
            shared.send(ChunkKind::GhcCensus, census.encode());
        }
    }
}

/// The sampler: RSS of every live stream every 10 ms, smaps_rollup every 100 ms,
/// page-residency snapshots every `snapshot_ms` and near RSS peaks.
fn sample(shared: Arc<Shared>, snapshot_every: Duration, stop: Arc<Stop>) {
    let (census, requests) = sync_channel::<CensusRequest>(1);
    let worker = {
        let shared = shared.clone();
        thread::Builder::new()
            .name("fragscope-census".into())
            .spawn(move || census_worker(&shared, requests))
    };
    sample_until_stopped(&shared, snapshot_every, &stop, &census);
    drop(census);
    if let Ok(w) = worker {
        let _ = w.join();
    }
}

fn sample_until_stopped(
    shared: &Shared,
    snapshot_every: Duration,
    stop: &Stop,
    census: &SyncSender<CensusRequest>,
) {
    let mut round = 0u32;
    let mut last_periodic = Instant::now();
    while !stop.sleep(RSS_INTERVAL) {
        round = round.wrapping_add(1);
        let tick = shared.tick();
        let live: Vec<(u32, u32)> = {
            let procs = shared.procs.lock().unwrap();
            procs
                .streams
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.ended)
                .map(|(i, s)| (i as u32, s.pid))
                .collect()
        };
        let periodic = last_periodic.elapsed() >= snapshot_every;
        if periodic {
            last_periodic = Instant::now();
            shared.clock.request_stats_and_flush();
        }
        for (stream, pid) in live {
            let Some(rss) = procfs::read_rss(pid, tick) else {
                let disconnected =
                    shared.procs.lock().unwrap().streams[stream as usize].connections == 0;
                if disconnected {
                    shared.end_stream(stream);
                }
                continue;
            };
            let near_peak = {
                let mut procs = shared.procs.lock().unwrap();
                let st = &mut procs.streams[stream as usize];
                st.rss.push(rss);
                if st.rss.len() >= 100 {
                    shared.flush_rss(stream, st);
                }
                rss.vm_rss_kib as f64 > st.peak_rss_at_snapshot as f64 * NEAR_PEAK_GROWTH
                    && st
                        .last_snapshot
                        .is_none_or(|t| t.elapsed() >= NEAR_PEAK_MIN_GAP)
            };
            if periodic || near_peak {
                let reason = if periodic {
                    SnapshotReason::Periodic
                } else {
                    // The allocator's view near the peak too (answered at the threads'
                    // next calls, within a few ms).
                    shared.clock.request_stats_and_flush();
                    SnapshotReason::NearPeak
                };
                shared.snapshot(stream, pid, reason, Some(census));
            } else if round.is_multiple_of(ROLLUP_EVERY) {
                if let Some(fields) = procfs::read_rollup(pid) {
                    shared.send(
                        ChunkKind::Rollup,
                        Rollup {
                            stream,
                            tick,
                            fields,
                        }
                        .encode(),
                    );
                }
            }
        }
    }
}

/// The writer: chunks in arrival order, compressed; flushed to disk whenever idle, and at
/// least every `WRITER_FLUSH` while busy (a program that never pauses would otherwise keep
/// up to the buffer's megabyte, and the file's header, in memory), so a killed recording
/// loses as little as possible.
fn write_chunks(
    w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: Receiver<Chunk>,
    path: &Path,
) -> Result<u64> {
    write_all_chunks(w, &rx).map_err(|e| {
        // Said at once: the program runs on, and its calls from here are not recorded.
        let on_disk = std::fs::metadata(path).map_or(0, |m| m.len());
        let message = format!(
            "writing the trace to {} failed after {on_disk} bytes: {e}. The trace up to \
             there is intact and readable (fragscope info and report read it to its last \
             whole chunk); what the program did after that point is not recorded",
            path.display()
        );
        eprintln!("fragscope: error: {message}");
        anyhow!(
            "the trace {} ends where writing failed ({e}); it is readable up to there",
            path.display()
        )
    })
}

fn write_all_chunks(
    mut w: ChunkWriter<BufWriter<std::fs::File>>,
    rx: &Receiver<Chunk>,
) -> std::io::Result<u64> {
    const WRITER_FLUSH: Duration = Duration::from_millis(100);
    let mut last_flush = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((kind, payload, section_ends)) => {
                if section_ends.is_empty() {
                    w.write_chunk(kind, &payload)?;
                } else {
                    w.write_sections(kind, &payload, &section_ends)?;
                }
                if last_flush.elapsed() >= WRITER_FLUSH {
                    w.flush()?;
                    last_flush = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                w.flush()?;
                last_flush = Instant::now();
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    w.flush()?;
    Ok(w.bytes_written())
}

static CHILD_PID: AtomicU64 = AtomicU64::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD_PID.load(Ordering::Relaxed);
    if pid != 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

/// The directory of the recorder's socket and clock page: in /dev/shm where there is one,
/// as its files live in memory. Under a disk's journal, removing the directory at the end
/// waited for the commit of the trace's writes (12 ms after a 37 MiB trace on ext4).
/// Every user may pass through it (mode 0711), since the program's processes may become
/// any user: who is served is decided per connection (`kinship`, the token).
fn rendezvous_dir() -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let shm = Path::new("/dev/shm");
    sweep_stale_rendezvous(shm);
    sweep_stale_rendezvous(&std::env::temp_dir());
    let mut builder = tempfile::Builder::new();
    builder.prefix("fragscope-");
    let dir = builder
        .tempdir_in(shm)
        .or_else(|_| builder.tempdir())
        .context("creating a temporary directory")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("opening {} to the program's users", dir.path().display()))?;
    Ok(dir)
}

/// Removes the rendezvous directories in `parent` that a recorder left when it was killed:
/// ours (same uid), whose socket no process has bound any more (it is not among the bound
/// Unix sockets in /proc/net/unix), or, without a socket, older than a minute (one that
/// was just made is about to get its socket). The list of bound sockets is read for each
/// socket file, after it was seen and once it is 200 ms old: a list read once before the
/// loop would miss the sockets of recorders that started meanwhile (which then hung,
/// their directory gone, in parallel tests).
fn sweep_stale_rendezvous(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let is_bound = |sock: &Path| -> Option<bool> {
        let list = std::fs::read_to_string("/proc/net/unix").ok()?;
        let sock = sock.to_string_lossy();
        Some(
            list.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(7) == Some(sock.as_ref())),
        )
    };
    let older_than = |p: &Path, age: Duration| {
        std::fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > age))
    };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let dir = entry.path();
        let ours = entry
            .file_name()
            .to_string_lossy()
            .starts_with("fragscope-")
            && entry.metadata().is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.is_dir() && m.uid() == uid
            });
        if !ours {
            continue;
        }
        let sock = dir.join("sock");
        let stale = if sock.exists() {
            // Without the list, a live recorder cannot be told apart: keep it.
            older_than(&sock, Duration::from_millis(200)) && is_bound(&sock) == Some(false)
        } else {
            older_than(&dir, Duration::from_secs(60))
        };
        if stale {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Records `opts.command` into `opts.output`.
pub fn record(opts: &RecordOptions) -> Result<RecordOutcome> {
    let attach_pid = opts.attach.as_ref().map(|a| a.pid);
    let command = match attach_pid {
        Some(pid) => attach_command(pid)?,
        None => opts.command.clone(),
    };
    let program = command
        .first()
        .ok_or_else(|| anyhow!("no program to record"))?;
    let program_path = match attach_pid {
        Some(pid) => std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(|e| crate::access::access_error(pid, &e))?,
        None => crate::launch::check_traceable(program)?,
    };
    // Said before the program runs: what the trace will miss.
    if let Some(l) = fragscope_census::allocators::linked_allocator(&program_path) {
        eprintln!(
            "fragscope: warning: {}. The report will show RSS over time, its phases and \
             where the process's memory lies, not that allocator's objects.",
            l.consequence()
        );
    }
    // A file size limit (ulimit -f) then fails the trace's write with EFBIG, which is
    // reported, instead of killing the recorder mid-recording.
    // SAFETY: ignoring a signal.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    // The GHC program: the one recorded, or the one a wrapper (a shell, a script, stack
    // exec) runs, whose RTS reads the same GHCRTS from the environment it inherits.
    // A running GHC program keeps the RTS flags it started with: no eventlog can be asked
    // for, but its block census is taken all the same.
    let ghc_program = match std::fs::read(&program_path)
        .ok()
        .filter(|_| attach_pid.is_none())
        .and_then(|data| crate::ghc::inspect(&data))
    {
        Some(binary) => Some((program_path.clone(), binary, false)),
        None if attach_pid.is_none() => crate::ghc::wrapped_program(&program_path, &command[1..])
            .map(|(path, binary)| (path, binary, true)),
        None => None,
    };
    let ghc = ghc_program.as_ref().map(|(path, binary, wrapped)| {
        let mut setup = crate::ghc::prepare(
            path,
            *binary,
            &opts.output,
            opts.ghc_heap_profile,
            &command[1..],
        );
        if *wrapped {
            let said = format!(
                "{} runs the GHC program {}{}",
                program_path.display(),
                path.display(),
                if setup.ghcrts.is_some() {
                    ": its RTS is asked for an eventlog through GHCRTS, which it inherits"
                } else {
                    ""
                }
            );
            setup.advice = Some(match setup.advice {
                Some(a) => format!("{said}. {a}"),
                None => said,
            });
        }
        setup
    });
    let censuses = crate::census::Censuses::new(opts.ghc_census);
    if let Some((path, ..)) = &ghc_program {
        censuses.learn(path);
    }
    if attach_pid.is_some() {
        censuses.learn(&program_path);
    }
    let preload = crate::preload::preload_library()?;
    let started = Instant::now();
    let dir = rendezvous_dir()?;
    let sock_path = dir.path().join("sock");
    let clock_path = dir.path().join("clock");
    let listener = UnixListener::bind(&sock_path)
        .with_context(|| format!("listening on {}", sock_path.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Connecting needs write permission on the socket, whatever user a process became.
        std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("opening {} to the program's users", sock_path.display()))?;
    }
    let clock = ClockPage::create(&clock_path)?;
    let token = recording_token()?;

    let file = create_output(&opts.output, opts.force)?;
    let mut writer = match opts.compression_level {
        Some(level) => ChunkWriter::new(BufWriter::with_capacity(1 << 20, file), level)?,
        None => ChunkWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            DEFAULT_COMPRESSION_LEVEL,
        )?
        .with_events_level(EVENTS_COMPRESSION_LEVEL),
    };
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let meta = Meta {
        ghc_eventlog: ghc.as_ref().and_then(|g| g.eventlog.as_ref()).map(|e| {
            // Relative to the trace's directory, so the two can move together.
            e.file_name()
                .map_or_else(|| e.clone(), PathBuf::from)
                .to_string_lossy()
                .into_owned()
        }),
        ..meta_now(
            page_size,
            opts.stacks,
            opts.sample_bytes,
            opts.snapshot_ms,
            command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        )
    };
    writer.write_chunk(ChunkKind::Meta, &meta.encode())?;
    // Room for 256 chunks (up to 32 MiB of event buffers) between the connections and
    // the writer; a writer further behind holds the program back rather than our memory
    // growing. (The channel's slots are written out when it is made.)
    let (tx, rx) = sync_channel::<Chunk>(256);
    let output = opts.output.clone();
    let writer_thread = thread::Builder::new()
        .name("fragscope-writer".into())
        .spawn(move || write_chunks(writer, rx, &output))?;
    let shared = Arc::new(Shared {
        out: tx,
        clock,
        procs: Mutex::new(Procs::default()),
        build_ids: Mutex::new(HashMap::new()),
        page_size,
        event_bytes: AtomicU64::new(0),
        arrivals: Mutex::new(Vec::new()),
        pack: opts.pack,
        censuses,
        token: token.clone(),
        refused_connections: AtomicU64::new(0),
        announced_images: Mutex::new(Vec::new()),
    });

    let stop = Arc::new(Stop::default());
    let ticker = {
        let shared = shared.clone();
        let stop = stop.clone();
        let t0 = Instant::now();
        thread::Builder::new()
            .name("fragscope-ticker".into())
            .spawn(move || loop {
                shared.clock.advance_tick(t0.elapsed().as_millis() as u64);
                if stop.sleep(Duration::from_millis(1)) {
                    break;
                }
            })?
    };
    let stop_accepting = Arc::new(AtomicBool::new(false));
    let open_connections: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
    // SAFETY: geteuid cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    let listener_fd = {
        use std::os::fd::AsRawFd;
        listener.as_raw_fd()
    };
    let acceptor = {
        let shared = shared.clone();
        let stop_accepting = stop_accepting.clone();
        let open_connections = open_connections.clone();
        thread::Builder::new()
            .name("fragscope-accept".into())
            .spawn(move || {
                let mut servers = Vec::new();
                for conn in listener.incoming() {
                    if stop_accepting.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (pid, uid) = peer_credentials(&conn);
                    let refuse = match kinship(pid, attach_pid) {
                        Kinship::InTree => false,
                        Kinship::Outsider => true,
                        // Gone before we could tell: another user's connection is refused
                        // (its ancestry can no longer be checked), our own user's is left
                        // to the token.
                        Kinship::Unknown => uid != own_uid,
                    };
                    if refuse {
                        // Refused before it costs a thread: no one outside the program
                        // can add to the trace or load the recorder.
                        shared.refused_connections.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if let Ok(c) = conn.try_clone() {
                        open_connections.lock().unwrap().push(c);
                    }
                    let id = servers.len() as u64;
                    shared.arrivals.lock().unwrap().push(Arrival {
                        id,
                        pid,
                        registered: false,
                    });
                    let shared = shared.clone();
                    servers.push(thread::spawn(move || serve_arrival(shared, conn, id)));
                }
                servers
            })?
    };
    let sampler = {
        let shared = shared.clone();
        let stop = stop.clone();
        let every = Duration::from_millis(opts.snapshot_ms.max(10).into());
        thread::Builder::new()
            .name("fragscope-sampler".into())
            .spawn(move || sample(shared, every, stop))?
    };

    let (exit_code, child_pid) = match &opts.attach {
        Some(a) => {
            let attached =
                run_attached(&shared, a, &preload, &sock_path, &clock_path, opts, &token);
            if attached.is_err() {
                // Nothing was recorded: no trace is left behind.
                let _ = std::fs::remove_file(&opts.output);
            }
            (Some(attached?), a.pid)
        }
        None => {
            // Orphaned descendants are re-parented to us, so their exit status is ours to read.
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
            let existing_preload = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty());
            let mut preload_value = preload.as_os_str().to_owned();
            if let Some(theirs) = existing_preload {
                preload_value.push(":");
                preload_value.push(theirs);
            }
            let mut cmd = Command::new(program);
            cmd.args(&command[1..])
                .env("LD_PRELOAD", preload_value)
                .env("FRAGSCOPE_SOCK", &sock_path)
                .env("FRAGSCOPE_CLOCK", &clock_path)
                .env("FRAGSCOPE_STACKS", opts.stacks.name())
                .env("FRAGSCOPE_SAMPLE_BYTES", opts.sample_bytes.to_string())
                .env("FRAGSCOPE_FLUSH_MS", opts.flush_ms.to_string())
                .env("FRAGSCOPE_TOKEN", &token);
            if let Some(ghcrts) = ghc.as_ref().and_then(|g| g.ghcrts.as_ref()) {
                cmd.env("GHCRTS", ghcrts);
            }
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::signal(libc::SIGINT, libc::SIG_DFL);
                    libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                    libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("starting {}", program.to_string_lossy()))?;
            let child_pid = child.id();
            CHILD_PID.store(u64::from(child_pid), Ordering::Relaxed);
            // The terminal's ^C reaches the program directly (same process group); we stay to
            // finish the trace. SIGTERM and SIGHUP sent to us are passed on.
            // SAFETY: installing handlers that only call kill.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::signal(libc::SIGQUIT, libc::SIG_IGN);
                libc::signal(
                    libc::SIGTERM,
                    forward_signal as *const () as libc::sighandler_t,
                );
                libc::signal(
                    libc::SIGHUP,
                    forward_signal as *const () as libc::sighandler_t,
                );
            }
            // Reaped below with waitpid, with every orphan.
            std::mem::forget(child);

            // Polled, the program's pidfd wakes us the moment it exits (Linux 5.3+; without one,
            // waitpid is polled every few milliseconds).
            // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
            let raw_pidfd =
                unsafe { libc::syscall(libc::SYS_pidfd_open, child_pid as libc::c_int, 0) } as i32;
            // SAFETY: a descriptor we just opened and nothing else owns.
            let child_pidfd = (raw_pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw_pidfd) });

            let mut exit_code = None;
            let mut grace_until: Option<Instant> = None;
            loop {
                let mut status = 0;
                // SAFETY: waitpid with a valid out pointer.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid > 0 {
                    let st = std::process::ExitStatus::from_raw(status);
                    let ws = WaitStatus {
                        pid: pid as u32,
                        tick: shared.tick(),
                        exit_code: st.code(),
                        signal: st.signal(),
                    };
                    shared.send(ChunkKind::WaitStatus, ws.encode());
                    if pid as u32 == child_pid {
                        exit_code =
                            Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
                        grace_until = Some(Instant::now() + DESCENDANT_GRACE);
                    }
                    continue;
                }
                if let Some(until) = grace_until {
                    let all_ended = shared
                        .procs
                        .lock()
                        .unwrap()
                        .streams
                        .iter()
                        .all(|s| s.ended || s.connections == 0);
                    if all_ended || Instant::now() >= until {
                        break;
                    }
                }
                if let Some(pidfd) = child_pidfd.as_ref().filter(|_| exit_code.is_none()) {
                    let mut pfd = libc::pollfd {
                        fd: pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 5) };
                } else {
                    let nap = if exit_code.is_some() { 1 } else { 5 };
                    thread::sleep(Duration::from_millis(nap));
                }
            }
            CHILD_PID.store(0, Ordering::Relaxed);
            drop(child_pidfd);
            (exit_code, child_pid)
        }
    };

    // Wind down: stop sampling, close the listener, let connections drain.
    stop.stop();
    let _ = sampler.join();
    stop_accepting.store(true, Ordering::Release);
    // The acceptor sees the flag at its next connection: this one. When the socket's
    // name is gone (the program cleaned the temporary directory up), shutting the
    // listener down wakes it instead: until it has seen the flag it holds the listener
    // open, so the descriptor is still ours.
    if UnixStream::connect(&sock_path).is_err() {
        // SAFETY: shutdown has no memory effects on a descriptor we own.
        unsafe { libc::shutdown(listener_fd, libc::SHUT_RDWR) };
    }
    let servers = acceptor.join().unwrap_or_default();
    // Descendants still running past the grace period are no longer traced.
    for c in open_connections.lock().unwrap().iter() {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
    for s in servers {
        let _ = s.join();
    }
    let _ = ticker.join();
    let (stream_count, silent) = {
        let procs = shared.procs.lock().unwrap();
        let silent = procs
            .streams
            .iter()
            // A child that exec'd before its first call (as fork+exec usually does) is
            // not a program without malloc.
            .enumerate()
            .filter(|(_, s)| s.event_bytes == 0 && !matches!(s.end, Some((EndHow::Exec, _))))
            .map(|(i, s)| SilentProcess {
                label: s.label.clone(),
                go: crate::launch::is_go_program(Path::new(&s.exe)),
                main: i == 0,
                peak_rss_kib: s.peak_rss_at_snapshot,
            })
            .collect();
        (procs.streams.len() as u32, silent)
    };
    for s in 0..stream_count {
        shared.end_stream(s);
    }
    for chunk in linked_allocators_of_streams(&shared) {
        shared.send(ChunkKind::LinkedAllocator, chunk.encode());
    }
    let untraced = if attach_pid.is_some() {
        Vec::new()
    } else {
        untraced_images(&shared, child_pid, &program_path, &command, &preload)
    };
    for u in &untraced {
        shared.send(ChunkKind::Untraced, u.encode());
    }
    let refused_connections = shared.refused_connections.load(Ordering::Relaxed);
    let event_bytes = shared.event_bytes.load(Ordering::Relaxed);
    shared.send(
        ChunkKind::End,
        fragscope_trace::End {
            tick: shared.tick(),
            event_bytes,
        }
        .encode(),
    );
    drop(shared);
    let file_bytes = writer_thread
        .join()
        .map_err(|_| anyhow!("the trace writer panicked"))??;
    Ok(RecordOutcome {
        exit_code: exit_code.unwrap_or(1),
        file_bytes,
        event_bytes,
        processes: stream_count,
        duration: started.elapsed(),
        silent_processes: silent,
        ghc_eventlog: ghc.as_ref().and_then(|g| g.eventlog.clone()),
        ghc_advice: ghc.and_then(|g| g.advice),
        untraced,
        refused_connections,
    })
}

/// The allocators linked into the programs the streams ran (each file read once).
fn linked_allocators_of_streams(
    shared: &Shared,
) -> Vec<fragscope_trace::heap_census::LinkedAllocator> {
    let procs = shared.procs.lock().unwrap();
    let mut by_exe = HashMap::new();
    let mut found = Vec::new();
    for (stream, s) in procs.streams.iter().enumerate() {
        let linked = by_exe
            .entry(s.exe.clone())
            .or_insert_with(|| fragscope_census::allocators::linked_allocator(Path::new(&s.exe)));
        if let Some(l) = linked {
            found.push(fragscope_trace::heap_census::LinkedAllocator {
                stream: stream as u32,
                allocator: l.allocator.into(),
                image: l.image.clone(),
                evidence: l.evidence.clone(),
                serves_malloc: l.serves_malloc,
            });
        }
    }
    found
}

/// The images the program ran that never connected: the program itself, or what a traced
/// image exec'd (an image that loads the interposer connects before its first call).
fn untraced_images(
    shared: &Shared,
    child_pid: u32,
    program_path: &Path,
    command: &[OsString],
    preload: &Path,
) -> Vec<fragscope_trace::Untraced> {
    let procs = shared.procs.lock().unwrap();
    let streams = &procs.streams;
    let mut untraced = Vec::new();
    if !streams.iter().any(|s| s.pid == child_pid) {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        untraced.push(fragscope_trace::Untraced {
            pid: child_pid,
            parent_stream: None,
            tick: 0,
            path: program_path.display().to_string(),
            argv: command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            reason: crate::launch::why_untraced(program_path.as_os_str(), uid, gid, preload),
        });
    }
    for a in shared.announced_images.lock().unwrap().iter() {
        let connected = streams
            .get(a.parent_stream as usize + 1..)
            .is_some_and(|after| after.iter().any(|t| t.pid == a.target.pid));
        if !connected {
            untraced.push(fragscope_trace::Untraced {
                pid: a.target.pid,
                parent_stream: Some(a.parent_stream),
                tick: a.tick,
                path: a.target.path.clone(),
                argv: a.target.argv.clone(),
                reason: crate::launch::why_untraced(
                    a.target.path.as_ref(),
                    a.target.uid,
                    a.target.gid,
                    preload,
                ),
            });
        }
    }
    untraced
}

/// The command line of the process `record -p` attaches to (its name in brackets when it
/// has none, as a kernel thread's).
fn attach_command(pid: u32) -> Result<Vec<OsString>> {
    if pid == std::process::id() {
        bail!("fragscope cannot record itself");
    }
    if crate::access::gone(pid) {
        bail!("no process {pid} (it does not exist or has exited)");
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map_err(|e| crate::access::access_error(pid, &e))?;
    let args: Vec<OsString> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
        .collect();
    if args.is_empty() {
        bail!("process {pid} has no command line (a kernel thread?): nothing to record");
    }
    Ok(args)
}

/// Set by Ctrl-C, SIGTERM or SIGHUP during `record -p`: detach and finish the trace.
static STOP_ATTACHED: AtomicBool = AtomicBool::new(false);

extern "C" fn stop_attached(_sig: libc::c_int) {
    STOP_ATTACHED.store(true, Ordering::Relaxed);
}

/// How long a detached process's connection may take to close (its last snapshot).
const DETACH_WAIT: Duration = Duration::from_secs(10);

/// What `record -p` loads into the process: a link to the interposer, beside the settings
/// a preloaded one would read from its environment (preload/attach.h reads them there),
/// in a directory of its own; both go when the recording ends.
struct AttachFiles {
    _dir: tempfile::TempDir,
    library: PathBuf,
}

impl AttachFiles {
    fn write(preload: &Path, pid: u32, settings: &[(&str, &OsStr)]) -> Result<Self> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // Beside the interposer's own copy: a place every user can read and map code from.
        let parent = preload.parent().unwrap_or(Path::new("/tmp"));
        let dir = tempfile::Builder::new()
            .prefix("attach-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a directory in {}", parent.display()))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let library = dir.path().join("libfragscope_preload.so");
        if std::fs::hard_link(preload, &library).is_err() {
            std::fs::copy(preload, &library)
                .with_context(|| format!("copying {}", preload.display()))?;
            std::fs::set_permissions(&library, std::fs::Permissions::from_mode(0o644))?;
        }
        let conf = dir.path().join("attach.conf");
        let mut text = Vec::new();
        for (name, value) in settings {
            text.extend_from_slice(name.as_bytes());
            text.push(b'=');
            text.extend_from_slice(value.as_bytes());
            text.push(b'\n');
        }
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&conf)
                .with_context(|| format!("writing {}", conf.display()))?;
            f.write_all(&text)?;
        }
        // It holds the recording's token: readable by the process's user alone.
        let target = std::fs::metadata(format!("/proc/{pid}"))
            .map_err(|e| crate::access::access_error(pid, &e))?;
        // SAFETY: geteuid cannot fail.
        if target.uid() != unsafe { libc::geteuid() } {
            std::os::unix::fs::chown(&conf, Some(target.uid()), Some(target.gid())).with_context(
                || {
                    format!(
                        "handing {} to process {pid}'s user (uid {})",
                        conf.display(),
                        target.uid()
                    )
                },
            )?;
        }
        Ok(Self { _dir: dir, library })
    }
}

/// `record -p`: loads the interposer into the running process, lets it record until the
/// duration is up, Ctrl-C / SIGTERM / SIGHUP, or the process ends, then detaches from it
/// (its calls go back to its allocator) after a last snapshot. Returns the exit code of
/// the recording (0), or Err when the process could not be attached to.
fn run_attached(
    shared: &Arc<Shared>,
    a: &AttachOptions,
    preload: &Path,
    sock_path: &Path,
    clock_path: &Path,
    opts: &RecordOptions,
    token: &str,
) -> Result<i32> {
    let pid = a.pid;
    let sample_bytes = opts.sample_bytes.to_string();
    let flush_ms = opts.flush_ms.to_string();
    let files = AttachFiles::write(
        preload,
        pid,
        &[
            ("FRAGSCOPE_SOCK", sock_path.as_os_str()),
            ("FRAGSCOPE_CLOCK", clock_path.as_os_str()),
            ("FRAGSCOPE_STACKS", OsStr::new(opts.stacks.name())),
            ("FRAGSCOPE_SAMPLE_BYTES", OsStr::new(&sample_bytes)),
            ("FRAGSCOPE_FLUSH_MS", OsStr::new(&flush_ms)),
            ("FRAGSCOPE_TOKEN", OsStr::new(token)),
        ],
    )?;
    // The process is not ours to signal: these end the recording instead.
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(sig, stop_attached as *const () as libc::sighandler_t);
        }
    }
    crate::attach::load_library(pid, &files.library)?;
    // Its HELLO came during the dlopen: its stream, before any of its calls.
    let until = Instant::now() + DETACH_WAIT;
    let stream = loop {
        let found = shared
            .procs
            .lock()
            .unwrap()
            .streams
            .iter()
            .rposition(|s| s.pid == pid && !s.ended);
        match found {
            Some(s) => break s as u32,
            None if Instant::now() < until => thread::sleep(Duration::from_millis(2)),
            None => bail!("process {pid} loaded the interposer but never connected to fragscope"),
        }
    };
    // The heap as it is, read with the process stopped, and its calls rebound before it
    // runs again: the merge starts from these blocks, so their frees are known and the
    // report's live data holds them.
    // (Written while it is stopped: no chunk of its calls can come before this one.)
    let (heap, slots, held) = crate::attach::rebind_library(pid, &files.library, || {
        crate::attach::glibc_live_blocks(pid).map(|blocks| {
            let heap = fragscope_trace::heap_census::StartingHeap {
                stream,
                tick: shared.tick(),
                blocks,
            };
            shared.send(ChunkKind::StartingHeap, heap.encode());
        })
    })?;
    if let Err(why) = heap {
        eprintln!(
            "fragscope: note: the heap process {pid} holds was not read ({why}); frees of \
             its blocks will be counted apart, and its live data will count only blocks \
             allocated from now on"
        );
    }
    eprintln!(
        "fragscope: recording process {pid}{} (held {:.1} ms while its heap was read and \
         {slots} call slots rebound); Ctrl-C stops the recording and leaves the process \
         running",
        a.duration
            .map(|d| format!(" for {:.0} s", d.as_secs_f64()))
            .unwrap_or_default(),
        held.as_secs_f64() * 1000.0
    );
    let registered = || {
        let procs = shared.procs.lock().unwrap();
        let mine: Vec<_> = procs.streams.iter().filter(|s| s.pid == pid).collect();
        (
            !mine.is_empty(),
            mine.iter().all(|s| s.ended || s.connections == 0),
        )
    };
    let deadline = a.duration.map(|d| Instant::now() + d);
    loop {
        let (connected, all_ended) = registered();
        if crate::access::gone(pid) || (connected && all_ended) {
            // It exited or exec'd: its connection said so.
            return Ok(0);
        }
        if STOP_ATTACHED.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let detached = crate::attach::detach_library(pid, &files.library);
    let until = Instant::now() + DETACH_WAIT;
    while Instant::now() < until && !crate::access::gone(pid) {
        let (connected, all_ended) = registered();
        if !connected || all_ended {
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    detached.map(|_| 0).with_context(|| {
        format!(
            "process {pid} still runs with fragscope's interposer recording into a closed \
             connection (its calls pass through it)"
        )
    })
}
