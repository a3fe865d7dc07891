//! The state every thread of a recording shares: its streams (one per process image),
//! the chunks it sends to the writer, and what a snapshot of a process writes.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fragscope_trace::{
    ChunkKind, EndHow, Mapping, Maps, Origin, Packer, Pagemap, Process, ProcessEnd, Rollup,
    RssBatch, RssSample, SnapshotReason,
};

use super::options::PackMode;
use super::packing::FIRST_RESUME_AFTER;
use super::writer::Message;
use crate::clock::ClockPage;
use crate::procfs;
use crate::protocol::{self, ExecTarget, HELLO_ATTACHED, HELLO_FORKED, HELLO_RESUMED};

/// How long a connection waits for the same process's earlier one (see `Arrival`).
pub(super) const EARLIER_CONNECTION_WAIT: Duration = Duration::from_secs(2);

pub(super) struct ProcState {
    pub(super) pid: u32,
    pub(super) connections: u32,
    pub(super) ended: bool,
    pub(super) end: Option<(EndHow, i32)>,
    pub(super) rss: Vec<RssSample>,
    pub(super) last_maps: Vec<Mapping>,
    pub(super) peak_rss_at_snapshot: u64,
    pub(super) last_snapshot: Option<Instant>,
    pub(super) event_bytes: u64,
    pub(super) label: String,
    /// The executable, as the process's interposer saw it.
    pub(super) exe: String,
    /// The image the process ran when its stream began: after an exec, the process's pid
    /// runs another image while this stream has not yet ended (its connection is read to
    /// its end first), and what is read of it then is not this stream's.
    pub(super) image: procfs::ImageMark,
    /// Packs this stream's buffers; shared by the stream's connections, which may follow
    /// one another, and held while a packed buffer is sent, so that buffers are stored in
    /// the order they were packed.
    pub(super) packer: Arc<Mutex<Packer>>,
    /// Its buffers are packed. Off while the recorder is behind; back on (from empty
    /// tables of blocks, `Packer::resume`) after `resume_after` raw buffers in a row with
    /// nothing waiting behind them.
    pub(super) packing: bool,
    pub(super) resume_after: u32,
    /// Raw buffers in a row stored with nothing waiting behind them.
    pub(super) quiet_raw: u32,
    /// Buffers packed since packing last started.
    pub(super) packed_run: u32,
}

impl ProcState {
    /// Whether the stream's process is still read from /proc: not once the stream ended,
    /// nor once it announced an exec (its pid runs the next image, or is about to).
    pub(super) fn sampled(&self) -> bool {
        !self.ended && !matches!(self.end, Some((EndHow::Exec, _)))
    }
}

pub(super) struct Shared {
    pub(super) out: SyncSender<Message>,
    /// Held while a snapshot takes its time and says so to the writer, and while a
    /// thread buffer is sent: a buffer with a call after a snapshot's time then reaches
    /// the writer after the snapshot's start, which holds it until the snapshot is
    /// written (see `writer::Message`).
    pub(super) snapshot_order: Mutex<()>,
    pub(super) clock: ClockPage,
    pub(super) procs: Mutex<Procs>,
    pub(super) build_ids: Mutex<HashMap<String, Vec<u8>>>,
    pub(super) page_size: u64,
    pub(super) event_bytes: AtomicU64,
    pub(super) arrivals: Mutex<Vec<Arrival>>,
    /// When to store event buffers in the packed form.
    pub(super) pack: PackMode,
    pub(super) censuses: crate::census::Censuses,
    /// The recording's secret: a connection whose HELLO lacks it is refused.
    pub(super) token: String,
    pub(super) refused_connections: AtomicU64,
    /// Images announced by an exec (EXEC messages): each should connect as a process.
    pub(super) announced_images: Mutex<Vec<AnnouncedImage>>,
}

/// An exec announced by a traced process (or a vfork child of one).
pub(super) struct AnnouncedImage {
    pub(super) target: ExecTarget,
    pub(super) tick: u64,
    /// The stream whose connection announced it: the image, if it connected, is a later
    /// stream (it may connect before the announcement is read, when a vfork child
    /// exec'd it).
    pub(super) parent_stream: u32,
}

/// A connection being served. Each is read by its own thread, so nothing but this keeps
/// one process's connections in the order it made them: after an exec, or after the
/// program closed our descriptor and the interposer reconnected, the new connection
/// must not be registered before the old one has been read to its end (else the new
/// image has no parent, or a resumed stream becomes a process of its own and its buffers
/// arrive out of order); nor a forked child's before its parent's is registered.
pub(super) struct Arrival {
    pub(super) id: u64,
    /// The connecting process, from SO_PEERCRED.
    pub(super) pid: u32,
    pub(super) registered: bool,
}

#[derive(Default)]
pub(super) struct Procs {
    pub(super) streams: Vec<ProcState>,
}

impl Shared {
    pub(super) fn send(&self, kind: ChunkKind, payload: Vec<u8>) {
        self.send_sections(kind, payload, Vec::new());
    }

    /// Sends a chunk compressed in sections ending at `section_ends` (none: whole).
    pub(super) fn send_sections(
        &self,
        kind: ChunkKind,
        payload: Vec<u8>,
        section_ends: Vec<usize>,
    ) {
        // The writer only goes away after every sender is done; an error means it failed,
        // which the writer reports itself.
        let message = Message::Chunk((kind, payload, section_ends));
        if matches!(kind, ChunkKind::Events | ChunkKind::PackedEvents) {
            let _order = self.snapshot_order.lock().unwrap();
            let _ = self.out.send(message);
        } else {
            let _ = self.out.send(message);
        }
    }

    pub(super) fn tick(&self) -> u64 {
        self.clock.tick()
    }

    /// Writes the memory map if it changed since the last one written for this stream.
    pub(super) fn write_maps(&self, stream: u32, pid: u32) -> Option<Vec<Mapping>> {
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
    pub(super) fn write_residency(
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
    /// the censuses of the runtime heaps it runs (`Censuses::take_runtimes`); with
    /// `census`, a GHC block census is asked of the census thread too (see
    /// [`census_worker`]). An exit snapshot is of a process that is ending.
    pub(super) fn snapshot(
        &self,
        stream: u32,
        pid: u32,
        reason: SnapshotReason,
        census: Option<&SyncSender<CensusRequest>>,
    ) {
        self.snapshot_of(stream, pid, reason, census, reason == SnapshotReason::Exit);
    }

    /// The last snapshot of a process `record -p` is about to leave running: taken while
    /// it runs, with its calls up to now and its runtimes' censuses (at the detach its
    /// threads are held, so a runtime that answers from a thread of its own, V8's
    /// inspector, could not), it stands for the recording's end: the exit message of
    /// the detach takes none after it.
    pub(super) fn last_snapshot_before_detach(&self, stream: u32, pid: u32) {
        // The allocator's view too, as at a periodic snapshot.
        self.clock.request_stats_and_flush();
        self.snapshot_of(stream, pid, SnapshotReason::Exit, None, false);
    }

    fn snapshot_of(
        &self,
        stream: u32,
        pid: u32,
        reason: SnapshotReason,
        census: Option<&SyncSender<CensusRequest>>,
        ending: bool,
    ) {
        if !self.runs_its_image(stream, pid) {
            return;
        }
        let tick = {
            let _order = self.snapshot_order.lock().unwrap();
            let tick = self.tick();
            let _ = self.out.send(Message::SnapshotStarts { stream, tick });
            tick
        };
        self.snapshot_at(stream, pid, tick, reason, census, ending);
        let _ = self.out.send(Message::SnapshotEnds { stream, tick });
    }

    /// Whether process `pid` still runs stream `stream`'s image: not when the stream
    /// ended, or announced an exec, or the process shows another image (an exec the
    /// recorder has not read of yet).
    pub(super) fn runs_its_image(&self, stream: u32, pid: u32) -> bool {
        let image = {
            let procs = self.procs.lock().unwrap();
            match procs.streams.get(stream as usize) {
                Some(st) if st.sampled() => st.image.clone(),
                _ => return false,
            }
        };
        image.may_be(&procfs::image_mark(pid))
    }

    /// The chunks of a snapshot of `pid` at `tick`.
    fn snapshot_at(
        &self,
        stream: u32,
        pid: u32,
        tick: u64,
        reason: SnapshotReason,
        census: Option<&SyncSender<CensusRequest>>,
        ending: bool,
    ) {
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
        let at = crate::census::At {
            stream,
            tick,
            reason,
            ending,
        };
        self.censuses
            .take_runtimes(at, pid, |kind, body| self.send(kind, body));
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

    pub(super) fn flush_rss(&self, stream: u32, st: &mut ProcState) {
        if !st.rss.is_empty() {
            let samples = std::mem::take(&mut st.rss);
            self.send(ChunkKind::Rss, RssBatch { stream, samples }.encode());
        }
    }

    /// Ends a stream once: the process left, exec'd, or vanished.
    pub(super) fn end_stream(&self, stream: u32) {
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
    pub(super) fn wait_for_earlier_connections(&self, id: u64, pid: u32, ppid: u32) {
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

    pub(super) fn set_registered(&self, id: u64) {
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

    /// A process that will never connect (the program itself, when it is a Go program
    /// without cgo): a stream of its own, sampled and censused like any other, which ends
    /// when the process is gone.
    pub(super) fn open_unconnected_stream(&self, pid: u32, argv: Vec<String>, exe: String) {
        let image = procfs::image_mark(pid);
        let mut procs = self.procs.lock().unwrap();
        let stream = procs.streams.len() as u32;
        procs
            .streams
            .push(self.new_stream(pid, 0, &argv, &exe, image));
        drop(procs);
        let process = Process {
            stream,
            pid,
            ppid: std::process::id(),
            origin: Origin::Started,
            parent_stream: None,
            start_tick: self.tick(),
            argv,
            exe,
            fork_mark: None,
        };
        self.send(ChunkKind::Process, process.encode());
    }

    /// A stream's state as it begins; `image` read before the streams are locked (two
    /// reads of /proc the sampler and other connections need not wait for).
    fn new_stream(
        &self,
        pid: u32,
        connections: u32,
        argv: &[String],
        exe: &str,
        image: procfs::ImageMark,
    ) -> ProcState {
        ProcState {
            pid,
            connections,
            ended: false,
            end: None,
            rss: Vec::new(),
            last_maps: Vec::new(),
            peak_rss_at_snapshot: 0,
            last_snapshot: None,
            event_bytes: 0,
            label: format!("{} (pid {pid})", argv.join(" ")),
            exe: exe.to_string(),
            image,
            packer: Arc::default(),
            packing: self.pack != PackMode::Never,
            resume_after: FIRST_RESUME_AFTER,
            quiet_raw: 0,
            packed_run: 0,
        }
    }

    /// A new process image, or a known one reconnecting.
    pub(super) fn register(&self, hello: &protocol::Hello) -> u32 {
        let image = procfs::image_mark(hello.pid);
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
        let state = self.new_stream(hello.pid, 1, &hello.argv, &hello.exe, image);
        procs.streams.push(state);
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

/// A GHC block census to take, asked by a snapshot.
pub(super) struct CensusRequest {
    pub(super) stream: u32,
    pub(super) pid: u32,
    pub(super) reason: SnapshotReason,
}
