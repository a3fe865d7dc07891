//! Payloads of the chunks other than events (docs/trace-format.md, "Chunk payloads").
//! Each type encodes and decodes itself field by field, in the documented order.

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

/// One line of /proc/PID/maps, with the file's GNU build-id when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// r, w, x, p/s as in /proc/PID/maps.
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
    pub build_id: Vec<u8>,
}

/// Chunk 4: the memory map of a process at a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Maps {
    pub stream: u32,
    pub tick: u64,
    pub mappings: Vec<Mapping>,
}

impl Maps {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .varint(self.mappings.len() as u64);
        for m in &self.mappings {
            w.varint(m.start)
                .varint(m.end - m.start)
                .str(&m.perms)
                .varint(m.offset)
                .varint(m.inode);
            w.str(&m.path).bytes(&m.build_id);
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let n = r.count(7)?;
        let mut mappings = Vec::with_capacity(n);
        for _ in 0..n {
            let start = r.varint()?;
            let len = r.varint()?;
            mappings.push(Mapping {
                start,
                end: start.saturating_add(len),
                perms: r.string()?,
                offset: r.varint()?,
                inode: r.varint()?,
                path: r.string()?,
                build_id: r.bytes()?.to_vec(),
            });
        }
        Ok(Self {
            stream,
            tick,
            mappings,
        })
    }
}

/// One reading of /proc/PID/status, in KiB as the kernel reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RssSample {
    pub tick: u64,
    pub vm_rss_kib: u64,
    pub rss_anon_kib: u64,
    pub rss_file_kib: u64,
    pub rss_shmem_kib: u64,
}

/// Chunk 5: a batch of RSS samples of one process, in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct RssBatch {
    pub stream: u32,
    pub samples: Vec<RssSample>,
}

impl RssBatch {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.samples.len() as u64);
        let mut prev = 0;
        for s in &self.samples {
            w.varint(s.tick.saturating_sub(prev))
                .varint(s.vm_rss_kib)
                .varint(s.rss_anon_kib);
            w.varint(s.rss_file_kib).varint(s.rss_shmem_kib);
            prev = s.tick;
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let n = r.count(5)?;
        let mut samples = Vec::with_capacity(n);
        let mut tick = 0u64;
        for _ in 0..n {
            tick = tick.saturating_add(r.varint()?);
            samples.push(RssSample {
                tick,
                vm_rss_kib: r.varint()?,
                rss_anon_kib: r.varint()?,
                rss_file_kib: r.varint()?,
                rss_shmem_kib: r.varint()?,
            });
        }
        Ok(Self { stream, samples })
    }
}

/// Chunk 6: /proc/PID/smaps_rollup at a tick: (field, KiB) as the kernel names them
/// (Rss, Pss, Anonymous, LazyFree, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    pub stream: u32,
    pub tick: u64,
    pub fields: Vec<(String, u64)>,
}

impl Rollup {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .varint(self.fields.len() as u64);
        for (name, kib) in &self.fields {
            w.str(name).varint(*kib);
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let n = r.count(2)?;
        let fields = (0..n)
            .map(|_| Ok((r.string()?, r.varint()?)))
            .collect::<Result<_, TraceError>>()?;
        Ok(Self {
            stream,
            tick,
            fields,
        })
    }
}

/// Why a page-residency snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotReason {
    Periodic = 0,
    NearPeak = 1,
    Exit = 2,
}

/// A range of pages and which of them were resident (bit i of byte i/8: page i).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResidentRange {
    pub start: u64,
    pub pages: u64,
    pub resident: Vec<u8>,
    /// Which resident pages were mapped by another process too (pagemap's "exclusively
    /// mapped" bit clear: a copy-on-write page still shared with a parent or a sibling
    /// after fork), in the same layout; empty when not read (traces before it).
    pub shared: Vec<u8>,
}

impl ResidentRange {
    pub fn is_resident(&self, page: u64) -> bool {
        page < self.pages
            && self
                .resident
                .get((page / 8) as usize)
                .is_some_and(|b| b >> (page % 8) & 1 == 1)
    }
    pub fn resident_pages(&self) -> u64 {
        self.resident
            .iter()
            .map(|b| u64::from(b.count_ones()))
            .sum()
    }
    /// Whether resident page `page` was mapped by another process too; None when the
    /// trace did not record it.
    pub fn is_shared(&self, page: u64) -> Option<bool> {
        if self.shared.is_empty() {
            return None;
        }
        Some(
            self.is_resident(page)
                && self
                    .shared
                    .get((page / 8) as usize)
                    .is_some_and(|b| b >> (page % 8) & 1 == 1),
        )
    }
    /// Resident pages mapped by another process too (0 when not recorded).
    pub fn shared_pages(&self) -> u64 {
        self.shared
            .iter()
            .zip(&self.resident)
            .map(|(s, r)| u64::from((s & r).count_ones()))
            .sum()
    }
}

/// The tag of a Pagemap's tail of shared-page bitmaps.
const PAGEMAP_SHARED: u8 = 1;

/// Chunk 7: page residency (/proc/PID/pagemap) of the mappings that can hold heap objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Pagemap {
    pub stream: u32,
    pub tick: u64,
    pub reason: SnapshotReason,
    pub page_size: u32,
    pub ranges: Vec<ResidentRange>,
}

impl Pagemap {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .u8(self.reason as u8);
        w.varint(self.page_size.into())
            .varint(self.ranges.len() as u64);
        for r in &self.ranges {
            w.varint(r.start).varint(r.pages).bytes(&r.resident);
        }
        // Added later, as a tail older readers ignore: the shared bitmaps, when read.
        if self.ranges.iter().any(|r| !r.shared.is_empty()) {
            w.u8(PAGEMAP_SHARED);
            for r in &self.ranges {
                w.bytes(&r.shared);
            }
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let reason = match r.u8()? {
            1 => SnapshotReason::NearPeak,
            2 => SnapshotReason::Exit,
            _ => SnapshotReason::Periodic,
        };
        let page_size = r.varint()? as u32;
        let n = r.count(3)?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            let start = r.varint()?;
            let pages = r.varint()?;
            let resident = r.bytes()?.to_vec();
            if (resident.len() as u64) < pages.div_ceil(8) {
                return Err(TraceError::Malformed(
                    "a residency bitmap is shorter than its range".into(),
                ));
            }
            ranges.push(ResidentRange {
                start,
                pages,
                resident,
                shared: Vec::new(),
            });
        }
        if !r.is_empty() && r.u8()? == PAGEMAP_SHARED {
            for range in &mut ranges {
                let shared = r.bytes()?;
                if !shared.is_empty() && (shared.len() as u64) < range.pages.div_ceil(8) {
                    return Err(TraceError::Malformed(
                        "a shared-page bitmap is shorter than its range".into(),
                    ));
                }
                range.shared = shared.to_vec();
            }
        }
        Ok(Self {
            stream,
            tick,
            reason,
            page_size,
            ranges,
        })
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

/// The kinds of in-use block groups a GHC block census counts, in the order their
/// figures are stored. A reader takes the kinds it knows from the front of a stored list,
/// so kinds may only be appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GhcBlockKind {
    /// The allocation area, where new objects go (the RTS's nursery lists).
    Nursery = 0,
    /// Generation 0 blocks outside the nursery.
    Gen0 = 1,
    /// Blocks of the older generations (copied survivors).
    OldGenerations = 2,
    /// Pinned byte arrays: blocks of small ones, and large ones (a group each).
    Pinned = 3,
    /// Large unpinned objects, one per block group.
    Large = 4,
    /// Compact regions.
    Compact = 5,
    /// The nonmoving collector's segments (`-xn`).
    Nonmoving = 6,
    /// Blocks with no generation: the RTS's own lists (mutable lists, arenas, ...).
    Other = 7,
}

impl GhcBlockKind {
    pub const ALL: [GhcBlockKind; 8] = [
        GhcBlockKind::Nursery,
        GhcBlockKind::Gen0,
        GhcBlockKind::OldGenerations,
        GhcBlockKind::Pinned,
        GhcBlockKind::Large,
        GhcBlockKind::Compact,
        GhcBlockKind::Nonmoving,
        GhcBlockKind::Other,
    ];
    pub fn name(self) -> &'static str {
        match self {
            GhcBlockKind::Nursery => "nursery",
            GhcBlockKind::Gen0 => "generation 0",
            GhcBlockKind::OldGenerations => "old generations",
            GhcBlockKind::Pinned => "pinned",
            GhcBlockKind::Large => "large objects",
            GhcBlockKind::Compact => "compact regions",
            GhcBlockKind::Nonmoving => "nonmoving segments",
            GhcBlockKind::Other => "RTS lists",
        }
    }
}

/// One kind's block groups in a census.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GhcKindFigures {
    pub groups: u64,
    pub blocks: u64,
    /// Bytes from each group's start to its free pointer: what was allocated into it.
    pub used_bytes: u64,
}

/// Upper bounds (inclusive) of the megablock-fill buckets: megablocks counted by how many
/// of their 252 blocks are in use. The last bucket is the full megablock (and every
/// megablock of a large group spanning several).
pub const MEGABLOCK_FILL_BOUNDS: [u32; 6] = [1, 5, 25, 126, 251, 252];

/// A megablock with at most this many blocks in use (10% of 252) is *sparse*: a few
/// survivors keep the rest of it from being returned.
pub const SPARSE_MEGABLOCK_BLOCKS: u32 = 25;

/// What the pinned blocks' objects hold, found by a scan of the heap for references into
/// them. A reference from a dead object not yet collected counts too, so live bytes are
/// an upper bound and the waste a lower bound.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GhcPinnedLiveness {
    pub objects: u64,
    pub live_objects: u64,
    pub live_bytes: u64,
    /// Pinned groups by live bytes / bytes held: 0-10%, 10-20%, ..., 90-100%.
    pub occupancy: [u64; 10],
    /// The live bytes of the pinned blocks inside sparse megablocks.
    pub sparse_live_bytes: u64,
    /// Bytes of heap read for references.
    pub scanned_bytes: u64,
}

/// The block census itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GhcBlocks {
    /// Megablocks (1 MiB) the RTS holds.
    pub megablocks: u64,
    /// In-use block groups by kind, in [`GhcBlockKind::ALL`] order.
    pub kinds: Vec<GhcKindFigures>,
    /// Free blocks inside the megablocks held (block-level fragmentation).
    pub free_blocks: u64,
    /// Megablocks by blocks in use: [0] none, then one bucket per bound of
    /// [`MEGABLOCK_FILL_BOUNDS`] (1, 2-5, 6-25, 26-126, 127-251, 252).
    pub megablock_fill: Vec<u64>,
    /// Sparse megablocks (at most [`SPARSE_MEGABLOCK_BLOCKS`] blocks in use) and the
    /// in-use blocks inside them by kind, in [`GhcBlockKind::ALL`] order.
    pub sparse_megablocks: u64,
    pub sparse_blocks: Vec<u64>,
    /// `None` when the scan was not made (too large a heap, or no pinned blocks).
    pub pinned_liveness: Option<GhcPinnedLiveness>,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
    /// Read without the RTS's symbols (a stripped executable): the heap found from
    /// /proc/PID/maps and checked against its own descriptors, not the RTS's counters;
    /// the nursery is counted in generation 0, and empty megablocks are not counted in
    /// `megablocks` (the RTS's own and those it returned to the OS look alike): they are
    /// `empty_megablocks_uncounted`. A tail of the record: older traces read false, 0.
    pub without_symbols: bool,
    pub empty_megablocks_uncounted: u64,
}

impl GhcBlocks {
    pub fn kind(&self, kind: GhcBlockKind) -> GhcKindFigures {
        self.kinds.get(kind as usize).copied().unwrap_or_default()
    }
    pub fn sparse_blocks_of(&self, kind: GhcBlockKind) -> u64 {
        self.sparse_blocks.get(kind as usize).copied().unwrap_or(0)
    }
    pub fn blocks_in_use(&self) -> u64 {
        self.kinds.iter().map(|k| k.blocks).sum()
    }
}

/// A census of a runtime's heap taken with a snapshot, or why none could be taken: the
/// framing chunks 14 (GHC) and 17 (pymalloc) share, `stream tick reason outcome`, then the
/// note (outcome 0) or the census itself (outcome 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census<T> {
    pub stream: u32,
    pub tick: u64,
    pub reason: SnapshotReason,
    pub result: Result<T, String>,
}

/// What a [`Census`] holds when one was taken.
pub trait CensusBody: Sized {
    /// Names it in errors: "a GHC census".
    const WHAT: &'static str;
    fn encode_body(&self, w: &mut Writer);
    fn decode_body(r: &mut Reader) -> Result<Self, TraceError>;
}

fn encode_reason(r: SnapshotReason) -> u8 {
    r as u8
}

fn decode_reason(b: u8) -> SnapshotReason {
    match b {
        1 => SnapshotReason::NearPeak,
        2 => SnapshotReason::Exit,
        _ => SnapshotReason::Periodic,
    }
}

impl<T: CensusBody> Census<T> {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .u8(encode_reason(self.reason));
        match &self.result {
            Err(note) => {
                w.u8(0).str(note);
            }
            Ok(body) => {
                w.u8(1);
                body.encode_body(&mut w);
            }
        }
        w.bytes
    }

    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let reason = decode_reason(r.u8()?);
        let result = match r.u8()? {
            0 => Err(r.string()?),
            1 => Ok(T::decode_body(&mut r)?),
            other => {
                return Err(TraceError::Malformed(format!(
                    "{} with an unknown outcome tag {other}",
                    T::WHAT
                )))
            }
        };
        Ok(Self {
            stream,
            tick,
            reason,
            result,
        })
    }
}

/// Chunk 14: a block census of a GHC program's heap, read from its RTS's own block
/// descriptors at a snapshot; or why none could be taken.
pub type GhcCensus = Census<GhcBlocks>;

impl CensusBody for GhcBlocks {
    const WHAT: &'static str = "a GHC census";

    fn encode_body(&self, w: &mut Writer) {
        w.varint(self.megablocks).varint(self.free_blocks);
        w.varint(self.kinds.len() as u64);
        for k in &self.kinds {
            w.varint(k.groups).varint(k.blocks).varint(k.used_bytes);
        }
        w.varint(self.megablock_fill.len() as u64);
        for &n in &self.megablock_fill {
            w.varint(n);
        }
        w.varint(self.sparse_megablocks)
            .varint(self.sparse_blocks.len() as u64);
        for &n in &self.sparse_blocks {
            w.varint(n);
        }
        match &self.pinned_liveness {
            None => {
                w.u8(0);
            }
            Some(p) => {
                w.u8(1)
                    .varint(p.objects)
                    .varint(p.live_objects)
                    .varint(p.live_bytes);
                for &n in &p.occupancy {
                    w.varint(n);
                }
                w.varint(p.sparse_live_bytes).varint(p.scanned_bytes);
            }
        }
        w.varint(self.pause_us);
        w.u8(u8::from(self.without_symbols))
            .varint(self.empty_megablocks_uncounted);
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let megablocks = r.varint()?;
        let free_blocks = r.varint()?;
        let n = r.count(3)?;
        let mut kinds = Vec::with_capacity(n);
        for _ in 0..n {
            kinds.push(GhcKindFigures {
                groups: r.varint()?,
                blocks: r.varint()?,
                used_bytes: r.varint()?,
            });
        }
        let n = r.count(1)?;
        let megablock_fill = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        let sparse_megablocks = r.varint()?;
        let n = r.count(1)?;
        let sparse_blocks = (0..n).map(|_| r.varint()).collect::<Result<_, _>>()?;
        let pinned_liveness = match r.u8()? {
            0 => None,
            _ => {
                let objects = r.varint()?;
                let live_objects = r.varint()?;
                let live_bytes = r.varint()?;
                let mut occupancy = [0u64; 10];
                for o in &mut occupancy {
                    *o = r.varint()?;
                }
                Some(GhcPinnedLiveness {
                    objects,
                    live_objects,
                    live_bytes,
                    occupancy,
                    sparse_live_bytes: r.varint()?,
                    scanned_bytes: r.varint()?,
                })
            }
        };
        let pause_us = r.varint()?;
        let (without_symbols, empty_megablocks_uncounted) = if r.is_empty() {
            (false, 0)
        } else {
            (r.u8()? != 0, r.varint()?)
        };
        Ok(GhcBlocks {
            megablocks,
            kinds,
            free_blocks,
            megablock_fill,
            sparse_megablocks,
            sparse_blocks,
            pinned_liveness,
            pause_us,
            without_symbols,
            empty_megablocks_uncounted,
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

/// A pymalloc pool (CPython's small-object allocator), as its header said at a census.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PymallocPool {
    /// Address of the pool (and of its header).
    pub address: u64,
    /// Index of its arena in the interpreter's arena table: the pools of one arena
    /// share it.
    pub arena: u32,
    /// Block size of the pool's size class, in bytes (for an empty pool: of its last class).
    pub block_size: u32,
    /// Blocks in use (0: an empty pool, free for any class).
    pub blocks_in_use: u32,
    /// Blocks ever carved out of the pool (the rest lie untouched above them).
    pub blocks_carved: u32,
}

/// The census itself: every pool found, in address order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PymallocPools {
    /// The interpreter's version, as "3.11".
    pub python: String,
    pub pool_size: u32,
    pub arena_size: u32,
    /// Bytes of each pool taken by its header.
    pub pool_header: u32,
    pub pools: Vec<PymallocPool>,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
}

/// Chunk 17: a census of a CPython process's pymalloc pools, read from their headers at a
/// snapshot; or why none could be taken.
pub type PymallocCensus = Census<PymallocPools>;

impl CensusBody for PymallocPools {
    const WHAT: &'static str = "a pymalloc census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.python)
            .varint(self.pool_size.into())
            .varint(self.arena_size.into())
            .varint(self.pool_header.into())
            .varint(self.pause_us)
            .varint(self.pools.len() as u64);
        // Addresses as steps in pools from the one before: mostly 1.
        let mut prev = 0u64;
        for pool in &self.pools {
            w.varint(pool.address.wrapping_sub(prev) / u64::from(self.pool_size.max(1)))
                .varint(pool.arena.into())
                .varint(pool.block_size.into())
                .varint(pool.blocks_in_use.into())
                .varint(pool.blocks_carved.into());
            prev = pool.address;
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let python = r.string()?;
        let pool_size = r.varint()? as u32;
        let arena_size = r.varint()? as u32;
        let pool_header = r.varint()? as u32;
        let pause_us = r.varint()?;
        if pool_size == 0 || !pool_size.is_power_of_two() {
            return Err(TraceError::Malformed(format!(
                "a pymalloc census with a pool size of {pool_size} bytes"
            )));
        }
        let n = r.count(5)?;
        let mut pools = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            let address = prev.wrapping_add(r.varint()?.wrapping_mul(u64::from(pool_size)));
            let pool = PymallocPool {
                address,
                arena: r.varint()? as u32,
                block_size: r.varint()? as u32,
                blocks_in_use: r.varint()? as u32,
                blocks_carved: r.varint()? as u32,
            };
            prev = address;
            pools.push(pool);
        }
        Ok(PymallocPools {
            python,
            pool_size,
            arena_size,
            pool_header,
            pools,
            pause_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pymalloc_censuses_round_trip() {
        let pool = |address, arena, block_size, blocks_in_use| PymallocPool {
            address,
            arena,
            block_size,
            blocks_in_use,
            blocks_carved: blocks_in_use + 3,
        };
        let taken = PymallocCensus {
            stream: 2,
            tick: 4000,
            reason: SnapshotReason::NearPeak,
            result: Ok(PymallocPools {
                python: "3.11".into(),
                pool_size: 16384,
                arena_size: 1 << 20,
                pool_header: 48,
                pools: vec![
                    pool(0x7f00_0000_4000, 0, 32, 500),
                    pool(0x7f00_0000_8000, 0, 32, 0),
                    pool(0x7f10_0000_0000, 7, 512, 31),
                ],
                pause_us: 812,
            }),
        };
        assert_eq!(PymallocCensus::decode(&taken.encode()).unwrap(), taken);
        let none = PymallocCensus {
            result: Err("not read".into()),
            ..taken.clone()
        };
        assert_eq!(PymallocCensus::decode(&none.encode()).unwrap(), none);
        let mut bad = taken.encode();
        bad.truncate(bad.len() - 2);
        assert!(PymallocCensus::decode(&bad).is_err());
    }

    #[test]
    fn ghc_censuses_round_trip() {
        let taken = GhcCensus {
            stream: 2,
            tick: 1234,
            reason: SnapshotReason::NearPeak,
            result: Ok(GhcBlocks {
                megablocks: 143,
                kinds: GhcBlockKind::ALL
                    .iter()
                    .enumerate()
                    .map(|(i, _)| GhcKindFigures {
                        groups: i as u64,
                        blocks: 10 * i as u64,
                        used_bytes: 4096 * i as u64,
                    })
                    .collect(),
                free_blocks: 35_000,
                megablock_fill: vec![100, 3, 2, 1, 0, 37],
                sparse_megablocks: 105,
                sparse_blocks: vec![0, 0, 1, 210, 0, 0, 0, 0],
                pinned_liveness: Some(GhcPinnedLiveness {
                    objects: 50_000,
                    live_objects: 210,
                    live_bytes: 210 * 40,
                    occupancy: [210, 0, 0, 0, 0, 0, 0, 0, 1, 5],
                    sparse_live_bytes: 8400,
                    scanned_bytes: 1 << 20,
                }),
                pause_us: 850,
                without_symbols: true,
                empty_megablocks_uncounted: 12,
            }),
        };
        assert_eq!(GhcCensus::decode(&taken.encode()).unwrap(), taken);
        // A census written before the tail reads as one taken with symbols.
        let mut bytes = taken.encode();
        bytes.truncate(bytes.len() - 2);
        let old = GhcCensus::decode(&bytes).unwrap();
        let old = old.result.unwrap();
        assert!(!old.without_symbols && old.empty_megablocks_uncounted == 0);
        assert_eq!(old.pause_us, 850);
        let mut none = taken.clone();
        none.result =
            Err("the RTS is GHC 9.8.1, whose block layout fragscope does not know".into());
        assert_eq!(GhcCensus::decode(&none.encode()).unwrap(), none);
        let mut no_scan = taken;
        if let Ok(b) = &mut no_scan.result {
            b.pinned_liveness = None;
        }
        assert_eq!(GhcCensus::decode(&no_scan.encode()).unwrap(), no_scan);
        assert!(GhcCensus::decode(&[2, 1, 0, 7]).is_err());
    }

    #[test]
    fn every_payload_round_trips() {
        let meta = Meta {
            fragscope_version: "0.1.0".into(),
            start_unix_ns: 1_700_000_000_000_000_000,
            tick_ns: 1_000_000,
            page_size: 4096,
            stacks: StackMode::All,
            sample_bytes: 524288,
            snapshot_ms: 1000,
            argv: vec!["./a".into(), "b c".into()],
            hostname: "h".into(),
            ghc_eventlog: None,
        };
        assert_eq!(Meta::decode(&meta.encode()).unwrap(), meta);
        let untraced = Untraced {
            pid: 42,
            parent_stream: Some(3),
            tick: 17,
            path: "/usr/bin/passwd".into(),
            argv: vec!["passwd".into(), "-S".into()],
            reason: "it is set-user-ID".into(),
        };
        assert_eq!(Untraced::decode(&untraced.encode()).unwrap(), untraced);
        let ghc = Meta {
            ghc_eventlog: Some("run.eventlog".into()),
            ..meta.clone()
        };
        assert_eq!(Meta::decode(&ghc.encode()).unwrap(), ghc);
        // A Meta written before the field existed ends at the hostname.
        let mut old = meta.encode();
        old.pop();
        assert_eq!(Meta::decode(&old).unwrap(), meta);
        let p = Process {
            stream: 3,
            pid: 42,
            ppid: 1,
            origin: Origin::Forked,
            parent_stream: Some(0),
            start_tick: 9,
            argv: vec!["x".into()],
            exe: "/bin/x".into(),
            fork_mark: Some(7),
        };
        assert_eq!(Process::decode(&p.encode()).unwrap(), p);
        // A Process written before the fork mark existed ends at the exe.
        let mut old = p.encode();
        old.pop();
        let unmarked = Process {
            fork_mark: None,
            ..p.clone()
        };
        assert_eq!(Process::decode(&old).unwrap(), unmarked);
        assert_eq!(Process::decode(&unmarked.encode()).unwrap(), unmarked);
        let maps = Maps {
            stream: 1,
            tick: 5,
            mappings: vec![Mapping {
                start: 0x1000,
                end: 0x3000,
                perms: "r-xp".into(),
                offset: 0,
                inode: 77,
                path: "/lib/x.so".into(),
                build_id: vec![1, 2, 3],
            }],
        };
        assert_eq!(Maps::decode(&maps.encode()).unwrap(), maps);
        let rss = RssBatch {
            stream: 0,
            samples: vec![
                RssSample {
                    tick: 10,
                    vm_rss_kib: 100,
                    rss_anon_kib: 50,
                    rss_file_kib: 50,
                    rss_shmem_kib: 0,
                },
                RssSample {
                    tick: 20,
                    vm_rss_kib: 200,
                    rss_anon_kib: 150,
                    rss_file_kib: 50,
                    rss_shmem_kib: 0,
                },
            ],
        };
        assert_eq!(RssBatch::decode(&rss.encode()).unwrap(), rss);
        let pm = Pagemap {
            stream: 0,
            tick: 3,
            reason: SnapshotReason::Exit,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start: 0x10000,
                pages: 10,
                resident: vec![0b101, 0b10],
                shared: Vec::new(),
            }],
        };
        let back = Pagemap::decode(&pm.encode()).unwrap();
        assert_eq!(back, pm);
        assert_eq!(back.ranges[0].is_shared(0), None);
        // With the shared pages: page 2 shared; page 1's bit is ignored (not resident).
        let mut with_shared = pm.clone();
        with_shared.ranges[0].shared = vec![0b110, 0];
        let back_shared = Pagemap::decode(&with_shared.encode()).unwrap();
        assert_eq!(back_shared, with_shared);
        assert_eq!(back_shared.ranges[0].is_shared(2), Some(true));
        assert_eq!(back_shared.ranges[0].is_shared(1), Some(false));
        assert_eq!(back_shared.ranges[0].is_shared(0), Some(false));
        assert_eq!(back_shared.ranges[0].shared_pages(), 1);
        // A reader that stops before the tail (an older one) reads the ranges alone.
        let bytes = with_shared.encode();
        assert_eq!(bytes[..pm.encode().len()], pm.encode()[..]);
        assert!(
            back.ranges[0].is_resident(0)
                && !back.ranges[0].is_resident(1)
                && back.ranges[0].is_resident(9)
        );
        assert_eq!(back.ranges[0].resident_pages(), 3);
        let end = ProcessEnd {
            stream: 2,
            tick: 4,
            how: EndHow::QuickExit,
            status: -3,
        };
        assert_eq!(ProcessEnd::decode(&end.encode()).unwrap(), end);
        let ws = WaitStatus {
            pid: 5,
            tick: 6,
            exit_code: None,
            signal: Some(9),
        };
        assert_eq!(WaitStatus::decode(&ws.encode()).unwrap(), ws);
    }

    #[test]
    fn truncated_payloads_are_errors_not_panics() {
        let p = Process {
            stream: 3,
            pid: 42,
            ppid: 1,
            origin: Origin::Started,
            parent_stream: None,
            start_tick: 9,
            argv: vec!["abc".into()],
            exe: "/bin/x".into(),
            fork_mark: None,
        };
        let bytes = p.encode();
        // Cut at the last byte, it reads as a Process from before the fork mark.
        for cut in 0..bytes.len() - 1 {
            assert!(Process::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
