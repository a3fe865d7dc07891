//! Serving one interposer connection: its messages read on a thread of their own, and
//! each turned into chunks in the order it came.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread;

use fragscope_trace::runtime_samples::RuntimeSamples;
use fragscope_trace::{ChunkKind, EndHow, EventsHeader, PackedBuffer, SnapshotReason};

use super::events::EventStore;
use super::options::PackMode;
use super::packing::QUEUED_MESSAGES;
use super::shared::{AnnouncedImage, Shared};
use crate::procfs;
use crate::protocol::{
    self, MsgHeader, MsgType, HELLO_FORKED, HELLO_MARKS_IDLE, HELLO_RESUMED, HELLO_WANTS_CLOCK,
};

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

/// Serves connection `id` until it closes, then forgets it.
pub(super) fn serve_arrival(shared: Arc<Shared>, conn: UnixStream, id: u64) {
    serve_connection(&shared, conn, id);
    shared.arrivals.lock().unwrap().retain(|a| a.id != id);
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

fn process_alive(pid: u32) -> bool {
    procfs::read_rss(pid, 0).is_some()
}

/// One connection being served, and what it learnt so far.
struct Connection<'a> {
    shared: &'a Arc<Shared>,
    conn: UnixStream,
    id: u64,
    stream: Option<u32>,
    pid: u32,
    marks_idle: bool,
    store: EventStore<'a>,
    /// Copies of other threads' buffers sent at exit, by thread, until superseded.
    copies: HashMap<u32, (EventsHeader, Vec<u8>)>,
    /// Their seq by thread once stored (at the exit, before its snapshot).
    stored_copies: HashMap<u32, u32>,
    /// Payload bytes read and not handled yet.
    queued: Arc<AtomicUsize>,
}

/// Serves one interposer connection until it closes: a thread of its own reads the
/// messages (`read_messages`), this one handles them in the order they came.
fn serve_connection(shared: &Arc<Shared>, conn: UnixStream, id: u64) {
    let (tx, messages) = sync_channel(QUEUED_MESSAGES);
    let (spare_tx, spare) = channel();
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
    let mut c = Connection {
        shared,
        conn,
        id,
        stream: None,
        pid: 0,
        marks_idle: false,
        store: EventStore {
            shared,
            packed: PackedBuffer::default(),
            pack_failed: false,
            behind: 0,
        },
        copies: HashMap::new(),
        stored_copies: HashMap::new(),
        queued,
    };
    for (header, payload) in messages {
        c.queued.fetch_sub(payload.len(), Ordering::Relaxed);
        // Each handler leaves the payload for reuse, except where a buffer is kept (or
        // dropped) as it is.
        let payload = match header.kind {
            MsgType::Hello => {
                if !c.hello(&payload) {
                    break;
                }
                payload
            }
            MsgType::Events => match c.events(&header, payload) {
                Some(payload) => payload,
                None => continue,
            },
            MsgType::MapsChanged => {
                c.maps_changed();
                payload
            }
            MsgType::Exit => {
                c.exit(&payload);
                payload
            }
            MsgType::Exec => {
                c.exec(&payload);
                payload
            }
            MsgType::ExecFailed => {
                c.exec_failed(&payload);
                payload
            }
            MsgType::Python | MsgType::Lisp => {
                c.runtime_samples(&header, &payload);
                payload
            }
            MsgType::Unknown(_) => payload,
        };
        let _ = spare_tx.send(payload);
    }
    let _ = reader.join();
    c.closed();
}

impl Connection<'_> {
    /// The process's HELLO: registers its stream. False when it is refused (not one of
    /// the recording's processes), and the connection is shut.
    fn hello(&mut self, payload: &[u8]) -> bool {
        let shared = self.shared;
        let hello = protocol::parse_hello(payload).filter(|h| h.token == shared.token.as_bytes());
        let Some(mut hello) = hello else {
            // Not one of the recording's processes: it adds nothing to the trace.
            shared.refused_connections.fetch_add(1, Ordering::Relaxed);
            let _ = self.conn.shutdown(std::net::Shutdown::Both);
            return false;
        };
        let wants_clock = hello.flags & HELLO_WANTS_CLOCK != 0;
        if wants_clock {
            // It had no clock to read its start from.
            hello.tick = shared.tick();
        }
        shared.wait_for_earlier_connections(self.id, hello.pid, hello.ppid);
        let s = shared.register(&hello);
        shared.set_registered(self.id);
        if wants_clock {
            send_descriptor(&self.conn, shared.clock.descriptor());
        }
        if hello.flags & HELLO_RESUMED == 0 {
            let maps = shared.write_maps(s, hello.pid);
            if let (Some(maps), true) = (maps, hello.flags & HELLO_FORKED != 0) {
                let (kind, tick) = (ChunkKind::ForkResidency, shared.tick());
                let reason = SnapshotReason::Periodic;
                shared.write_residency(kind, s, hello.pid, &maps, tick, reason);
            }
        }
        self.stream = Some(s);
        self.pid = hello.pid;
        self.marks_idle = hello.flags & HELLO_MARKS_IDLE != 0;
        true
    }

    /// An event buffer: stored, or kept back when it is a copy taken at another thread's
    /// exit. Gives the payload back for reuse unless it was kept or skipped.
    fn events(&mut self, header: &MsgHeader, payload: Vec<u8>) -> Option<Vec<u8>> {
        let s = self.stream?;
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
            process_marks_idle: self.marks_idle,
            packed: false,
            tables_reset: false,
        };
        if header.seq & 0x4000_0000 != 0 {
            self.copies.insert(h.tid, (h, payload));
            return None;
        }
        if self.copies.get(&h.tid).is_some_and(|(c, _)| c.seq == h.seq) {
            self.copies.remove(&h.tid); // superseded by the thread's own, longer buffer
        }
        if self
            .stored_copies
            .get(&h.tid)
            .is_some_and(|&seq| h.seq >= seq)
        {
            // The copy is stored: what the thread did after the exit is lost, as at
            // any exit (storing the same buffer again would record calls twice,
            // and a later one without it, frees of blocks it holds as missing).
            return None;
        }
        let packed = self
            .store
            .events(h, &payload, header.seq & 0x1000_0000 != 0);
        if self.shared.pack == PackMode::Auto {
            let backlog = self.queued.load(Ordering::Relaxed) + unread_bytes(&self.conn);
            self.store.stored_with_backlog(s, packed, backlog);
        }
        Some(payload)
    }

    fn maps_changed(&mut self) {
        if let Some(s) = self.stream {
            self.shared.write_maps(s, self.pid);
        }
        ack(&mut self.conn);
    }

    /// The process exits: how, the copies of other threads' buffers, a last snapshot.
    fn exit(&mut self, payload: &[u8]) {
        if let (Some(s), Some((status, how))) = (self.stream, protocol::parse_exit(payload)) {
            let how = match how {
                0 => EndHow::Exit,
                1 => EndHow::QuickExit,
                3 => EndHow::Detached,
                _ => EndHow::ExitUnknownStatus,
            };
            self.shared.procs.lock().unwrap().streams[s as usize].end = Some((how, status));
            for (tid, (h, copy)) in self.copies.drain() {
                self.stored_copies.insert(tid, h.seq);
                self.store.events(h, &copy, true);
            }
            // Only `record -p` detaches a process, and it took the last snapshot before
            // (`Shared::last_snapshot_before_detach`).
            if how != EndHow::Detached {
                self.shared
                    .snapshot(s, self.pid, SnapshotReason::Exit, None);
            }
        }
        ack(&mut self.conn);
    }

    /// The process, or a vfork child sharing its connection, execs an image.
    fn exec(&mut self, payload: &[u8]) {
        let shared = self.shared;
        if let Some(s) = self.stream {
            let target = protocol::parse_exec(payload);
            // A vfork child's exec (it shares this connection) does not end us.
            if target.as_ref().is_none_or(|t| t.pid == self.pid) {
                shared.procs.lock().unwrap().streams[s as usize].end = Some((EndHow::Exec, 0));
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

    /// An exec announced before failed: the image never runs.
    fn exec_failed(&mut self, payload: &[u8]) {
        let shared = self.shared;
        if let (Some(s), Some(failed)) = (self.stream, protocol::parse_exec_failed(payload)) {
            let mut announced = shared.announced_images.lock().unwrap();
            if let Some(i) = announced
                .iter()
                .rposition(|a| a.parent_stream == s && a.target.pid == failed)
            {
                announced.remove(i);
            }
            drop(announced);
            if failed == self.pid {
                let st = &mut shared.procs.lock().unwrap().streams[s as usize];
                if matches!(st.end, Some((EndHow::Exec, _))) {
                    st.end = None;
                }
            }
        }
    }

    /// Sampled Python or Lisp stacks.
    fn runtime_samples(&mut self, header: &MsgHeader, payload: &[u8]) {
        if let Some(s) = self.stream {
            // The interposer's header carries the sampling mean (CPython) or the
            // region size (SBCL) in seq.
            let samples = RuntimeSamples {
                stream: s,
                mean_bytes: header.seq.into(),
                first_tick: header.first_tick,
                records: payload.to_vec(),
            };
            let kind = if header.kind == MsgType::Lisp {
                ChunkKind::LispSamples
            } else {
                ChunkKind::PythonSamples
            };
            self.shared.send(kind, samples.encode());
        }
    }

    /// The connection closed: copies still held are stored, and the stream ends unless
    /// the process may reconnect.
    fn closed(mut self) {
        for (_, (h, copy)) in self.copies.drain() {
            self.store.events(h, &copy, true);
        }
        let Some(s) = self.stream else { return };
        let shared = self.shared;
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
}
