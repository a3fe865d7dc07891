//! The chunks that frame a trace and each process's life in it: the trace's meta and
//! end, a process's start (and what it was forked or exec'd from), the header of its
//! event chunks, its end and wait status, and the images that could not be traced.

use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

/// How stacks were recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackMode {
    None = 0,
    Sampled = 1,
    All = 2,
}

impl StackMode {
    pub fn name(self) -> &'static str {
        match self {
            StackMode::None => "none",
            StackMode::Sampled => "sampled",
            StackMode::All => "all",
        }
    }
}

/// Chunk 1: the recording as a whole. First in every trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub fragscope_version: String,
    pub start_unix_ns: u64,
    /// Length of a tick in nanoseconds (event and sample times are in ticks).
    pub tick_ns: u64,
    pub page_size: u32,
    pub stacks: StackMode,
    pub sample_bytes: u64,
    pub snapshot_ms: u32,
    pub argv: Vec<String>,
    pub hostname: String,
    /// The GHC RTS eventlog written beside the trace, as a path relative to the trace's
    /// directory (or absolute); `None` when the program is not a GHC program that could
    /// write one. Absent in traces from before this field: they read as `None`.
    pub ghc_eventlog: Option<String>,
    /// Recorded with `--aggregate`: the calls allocated and freed between two snapshots
    /// are summed by stack and size instead of written (see
    /// [`crate::order::aggregate`]). Absent in older traces: false.
    pub aggregated: bool,
}

impl Meta {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.str(&self.fragscope_version)
            .varint(self.start_unix_ns)
            .varint(self.tick_ns);
        w.varint(self.page_size.into())
            .u8(self.stacks as u8)
            .varint(self.sample_bytes);
        w.varint(self.snapshot_ms.into())
            .varint(self.argv.len() as u64);
        for a in &self.argv {
            w.str(a);
        }
        w.str(&self.hostname);
        w.str(self.ghc_eventlog.as_deref().unwrap_or(""));
        w.u8(self.aggregated.into());
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let fragscope_version = r.string()?;
        let start_unix_ns = r.varint()?;
        let tick_ns = r.varint()?;
        let page_size = r.varint()? as u32;
        let stacks = match r.u8()? {
            0 => StackMode::None,
            2 => StackMode::All,
            _ => StackMode::Sampled,
        };
        let sample_bytes = r.varint()?;
        let snapshot_ms = r.varint()? as u32;
        let n = r.count(1)?;
        let argv = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
        let hostname = r.string()?;
        let ghc_eventlog = if r.is_empty() {
            None
        } else {
            Some(r.string()?).filter(|p| !p.is_empty())
        };
        let aggregated = !r.is_empty() && r.u8()? != 0;
        Ok(Self {
            fragscope_version,
            start_unix_ns,
            tick_ns,
            page_size,
            stacks,
            sample_bytes,
            snapshot_ms,
            argv,
            hostname,
            ghc_eventlog,
            aggregated,
        })
    }
}

/// How a process stream began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Started by `fragscope record` or by exec: a new program image.
    Started = 0,
    /// A fork of `parent`: it starts with its parent's heap.
    Forked = 1,
    /// Already running when `record -p` attached to it: its heap holds blocks the trace
    /// never saw allocated.
    Attached = 2,
}

/// Chunk 2: a process image began (one stream per image: exec starts a new one).
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub stream: u32,
    pub pid: u32,
    pub ppid: u32,
    pub origin: Origin,
    /// The stream of the process this one was forked from, or the image it exec'd from.
    pub parent_stream: Option<u32>,
    pub start_tick: u64,
    pub argv: Vec<String>,
    pub exe: String,
    /// A forked process: the mark of its fork among its parent's calls (the parent's
    /// [`crate::format::event::Record::Forked`]), where its heap is its parent's. Absent from
    /// older traces, and when the fork could not be marked.
    pub fork_mark: Option<u32>,
}

impl Process {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.pid.into())
            .varint(self.ppid.into());
        w.u8(self.origin as u8)
            .varint(self.parent_stream.map_or(0, |s| u64::from(s) + 1));
        w.varint(self.start_tick).varint(self.argv.len() as u64);
        for a in &self.argv {
            w.str(a);
        }
        w.str(&self.exe);
        w.varint(self.fork_mark.map_or(0, u64::from));
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let pid = r.varint()? as u32;
        let ppid = r.varint()? as u32;
        let origin = match r.u8()? {
            1 => Origin::Forked,
            2 => Origin::Attached,
            _ => Origin::Started,
        };
        let parent_stream = match r.varint()? {
            0 => None,
            s => Some((s - 1) as u32),
        };
        let start_tick = r.varint()?;
        let n = r.count(1)?;
        let argv = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
        let exe = r.string()?;
        // Added after the chunk was first written.
        let fork_mark = if r.is_empty() {
            None
        } else {
            Some(r.varint()? as u32).filter(|&m| m != 0)
        };
        Ok(Self {
            stream,
            pid,
            ppid,
            origin,
            parent_stream,
            start_tick,
            argv,
            exe,
            fork_mark,
        })
    }
}

/// Chunk 3's header: one thread's buffer of event records, in program order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventsHeader {
    pub stream: u32,
    pub tid: u32,
    /// Per thread, counting up from 0: a gap means lost buffers.
    pub seq: u32,
    pub first_tick: u64,
    pub last_tick: u64,
    /// The thread's last buffer: it was exiting.
    pub thread_exited: bool,
    /// Sent for the thread by another while it was outside any call with nothing
    /// buffered: it sends again right after its next call, so the merge need not wait
    /// for it meanwhile.
    pub thread_idle: bool,
    /// The process's threads are flagged idle (above) whenever they make no call for a
    /// while: a thread the merge hears nothing from is inside a call (preempted, waiting
    /// for the recorder), and its calls will come, however late.
    pub process_marks_idle: bool,
    /// The records are in the packed form (the chunk's kind says so; not encoded here).
    pub packed: bool,
    /// Packed form: the stream's tables of live blocks and recently freed ones start
    /// empty at this chunk (packing resumed after buffers stored raw, whose blocks the
    /// writer did not follow). Usable sizes are kept.
    pub tables_reset: bool,
}

impl EventsHeader {
    pub fn encode_with(&self, records: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tid.into())
            .varint(self.seq.into());
        w.varint(self.first_tick).varint(self.last_tick);
        w.varint(
            u64::from(self.thread_exited)
                | u64::from(self.thread_idle) << 1
                | u64::from(self.process_marks_idle) << 2
                | u64::from(self.tables_reset) << 3,
        );
        w.bytes.extend_from_slice(records);
        w.bytes
    }
    /// The header and the event records that follow it.
    pub fn decode(data: &[u8]) -> Result<(Self, &[u8]), TraceError> {
        let mut r = Reader::new(data);
        let (stream, tid, seq) = (r.varint()? as u32, r.varint()? as u32, r.varint()? as u32);
        let (first_tick, last_tick, flags) = (r.varint()?, r.varint()?, r.varint()?);
        let h = Self {
            stream,
            tid,
            seq,
            first_tick,
            last_tick,
            thread_exited: flags & 1 == 1,
            thread_idle: flags & 2 == 2,
            process_marks_idle: flags & 4 == 4,
            packed: false,
            tables_reset: flags & 8 == 8,
        };
        Ok((h, r.remaining()))
    }
}

/// How a process stream ended, as far as the interposer could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndHow {
    /// exit(status), or a return from main (status then from the wait status, if any).
    Exit = 0,
    /// _exit / _Exit.
    QuickExit = 1,
    /// Left through exit without a status we could see (return from main).
    ExitUnknownStatus = 2,
    /// Replaced by exec: the next image is another stream.
    Exec = 3,
    /// The connection closed with no goodbye: killed, or crashed.
    Vanished = 4,
    /// `record -p` ended and left the process running (its calls no longer recorded).
    Detached = 5,
}

/// Chunk 8: a process stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessEnd {
    pub stream: u32,
    pub tick: u64,
    pub how: EndHow,
    pub status: i32,
}

impl ProcessEnd {
    /// "exited 0", "detached", ... (what a wait status does not say better).
    pub fn describe(&self) -> String {
        match self.how {
            EndHow::Exit | EndHow::QuickExit => format!("exited {}", self.status),
            EndHow::ExitUnknownStatus => "exited".into(),
            EndHow::Exec => "exec'd a new image".into(),
            EndHow::Vanished => "vanished (killed or crashed)".into(),
            EndHow::Detached => "left running (fragscope detached)".into(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .u8(self.how as u8)
            .svarint(self.status.into());
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let how = match r.u8()? {
            0 => EndHow::Exit,
            1 => EndHow::QuickExit,
            2 => EndHow::ExitUnknownStatus,
            3 => EndHow::Exec,
            5 => EndHow::Detached,
            _ => EndHow::Vanished,
        };
        let status = r.svarint()? as i32;
        Ok(Self {
            stream,
            tick,
            how,
            status,
        })
    }
}

/// Chunk 9: what waitpid said about a process the recorder could wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitStatus {
    pub pid: u32,
    pub tick: u64,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
}

impl WaitStatus {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.pid.into()).varint(self.tick);
        match (self.exit_code, self.signal) {
            (Some(c), _) => w.u8(0).svarint(c.into()),
            (None, Some(s)) => w.u8(1).svarint(s.into()),
            (None, None) => w.u8(2).svarint(0),
        };
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let pid = r.varint()? as u32;
        let tick = r.varint()?;
        let kind = r.u8()?;
        let v = r.svarint()? as i32;
        let (exit_code, signal) = match kind {
            0 => (Some(v), None),
            1 => (None, Some(v)),
            _ => (None, None),
        };
        Ok(Self {
            pid,
            tick,
            exit_code,
            signal,
        })
    }
}

/// Chunk 10: the recorder finished cleanly. A trace without it was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct End {
    pub tick: u64,
    /// Event records received from all processes.
    pub event_bytes: u64,
}

impl End {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.tick).varint(self.event_bytes);
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        Ok(Self {
            tick: r.varint()?,
            event_bytes: r.varint()?,
        })
    }
}

/// Chunk 15: a process image the program ran that fragscope could not trace (its calls
/// are missing from the trace): the program itself, or an image something exec'd.
#[derive(Debug, Clone, PartialEq)]
pub struct Untraced {
    pub pid: u32,
    /// The stream that exec'd it (None: the program fragscope started).
    pub parent_stream: Option<u32>,
    /// When it was exec'd (or started).
    pub tick: u64,
    /// The file exec'd, as the exec call named it.
    pub path: String,
    pub argv: Vec<String>,
    /// Why it could not be traced, and what to do about it.
    pub reason: String,
}

impl Untraced {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.pid.into())
            .varint(self.parent_stream.map_or(0, |s| u64::from(s) + 1))
            .varint(self.tick);
        w.str(&self.path).varint(self.argv.len() as u64);
        for a in &self.argv {
            w.str(a);
        }
        w.str(&self.reason);
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let pid = r.varint()? as u32;
        let parent_stream = match r.varint()? {
            0 => None,
            s => Some((s - 1) as u32),
        };
        let tick = r.varint()?;
        let path = r.string()?;
        let n = r.count(1)?;
        let argv = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
        let reason = r.string()?;
        Ok(Self {
            pid,
            parent_stream,
            tick,
            path,
            argv,
            reason,
        })
    }

    /// "pid N (argv)", as the views name it.
    pub fn label(&self) -> String {
        let command = if self.argv.is_empty() {
            self.path.clone()
        } else {
            self.argv.join(" ")
        };
        format!("pid {} ({command})", self.pid)
    }
}
