//! Typed events and the decoding of their payloads.

/// Event type numbers, as assigned in GHC's rts/include/rts/EventLogFormat.h.
pub mod tags {
    pub const GC_START: u16 = 9;
    pub const GC_END: u16 = 10;
    pub const REQUEST_SEQ_GC: u16 = 11;
    pub const REQUEST_PAR_GC: u16 = 12;
    pub const LOG_MSG: u16 = 16;
    pub const BLOCK_MARKER: u16 = 18;
    pub const USER_MSG: u16 = 19;
    pub const GC_IDLE: u16 = 20;
    pub const GC_WORK: u16 = 21;
    pub const GC_DONE: u16 = 22;
    pub const CAPSET_CREATE: u16 = 25;
    pub const CAPSET_DELETE: u16 = 26;
    pub const CAPSET_ASSIGN_CAP: u16 = 27;
    pub const CAPSET_REMOVE_CAP: u16 = 28;
    pub const RTS_IDENTIFIER: u16 = 29;
    pub const PROGRAM_ARGS: u16 = 30;
    pub const PROGRAM_ENV: u16 = 31;
    pub const OSPROCESS_PID: u16 = 32;
    pub const OSPROCESS_PPID: u16 = 33;
    pub const WALL_CLOCK_TIME: u16 = 43;
    pub const HEAP_ALLOCATED: u16 = 49;
    pub const HEAP_SIZE: u16 = 50;
    pub const HEAP_LIVE: u16 = 51;
    pub const HEAP_INFO_GHC: u16 = 52;
    pub const GC_STATS_GHC: u16 = 53;
    pub const GC_GLOBAL_SYNC: u16 = 54;
    pub const USER_MARKER: u16 = 58;
    /// Since GHC 9.2.
    pub const MEM_RETURN: u16 = 90;
    /// Since GHC 9.2.
    pub const BLOCKS_SIZE: u16 = 91;
    pub const HEAP_PROF_BEGIN: u16 = 160;
    pub const HEAP_PROF_COST_CENTRE: u16 = 161;
    pub const HEAP_PROF_SAMPLE_BEGIN: u16 = 162;
    pub const HEAP_PROF_SAMPLE_COST_CENTRE: u16 = 163;
    pub const HEAP_PROF_SAMPLE_STRING: u16 = 164;
    pub const HEAP_PROF_SAMPLE_END: u16 = 165;
    pub const HEAP_BIO_PROF_SAMPLE_BEGIN: u16 = 166;
    /// Not an event: the type number that ends the data.
    pub const DATA_END: u16 = 0xffff;
}

/// One event: when it happened, which capability's buffer it came from, and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Nanoseconds since the RTS started.
    pub time_ns: u64,
    /// The capability whose event buffer held the event; `None` for the RTS's global
    /// buffer (start-up information, heap profile samples) and for events outside blocks.
    pub capability: Option<u16>,
    pub kind: EventKind,
}

/// How a heap profile breaks residency down (`+RTS -h<x>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapProfBreakdown {
    CostCentre,
    Module,
    ClosureDescription,
    TypeDescription,
    Retainer,
    Biography,
    /// `-hT`: by closure type (ARR_WORDS, THUNK, ...), available without profiling.
    ClosureType,
    /// Newer breakdowns (e.g. by info table) this reader does not name.
    Other(u32),
}

impl HeapProfBreakdown {
    fn from_code(code: u32) -> Self {
        match code {
            1 => Self::CostCentre,
            2 => Self::Module,
            3 => Self::ClosureDescription,
            4 => Self::TypeDescription,
            5 => Self::Retainer,
            6 => Self::Biography,
            7 => Self::ClosureType,
            other => Self::Other(other),
        }
    }
}

/// Statistics of one collection, posted right after its GC_END.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcStats {
    pub heap_capset: u32,
    /// The oldest generation collected: 0 for a minor collection.
    pub generation: u16,
    pub copied_bytes: u64,
    /// Bytes wasted at the ends of blocks the collection filled.
    pub slop_bytes: u64,
    /// Free memory inside megablocks held by the block allocator: the block-level
    /// fragmentation of the heap.
    pub frag_bytes: u64,
    pub parallel_threads: u32,
    pub parallel_max_copied_bytes: u64,
    pub parallel_total_copied_bytes: u64,
    /// Absent in logs from RTSs before GHC 8.4.
    pub parallel_balanced_copied_bytes: Option<u64>,
}

/// The heap's configuration, posted at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapInfo {
    pub heap_capset: u32,
    pub generations: u16,
    /// `+RTS -M`; 0 when unlimited.
    pub max_heap_bytes: u64,
    pub alloc_area_bytes: u64,
    pub megablock_bytes: u64,
    pub block_bytes: u64,
}

/// A cost centre's definition, referred to by number in cost-centre samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostCentre {
    pub id: u32,
    pub label: String,
    pub module: String,
    pub source_location: String,
    pub is_caf: bool,
}

/// What an event says. Event types this reader does not decode become [`EventKind::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    GcStart,
    GcEnd,
    RequestSeqGc,
    RequestParGc,
    GcIdle,
    GcWork,
    GcDone,
    GcGlobalSync,
    GcStats(Box<GcStats>),
    /// Bytes allocated by the program so far (cumulative).
    HeapAllocated {
        heap_capset: u32,
        bytes: u64,
    },
    /// Memory the heap holds from the OS: megablocks, in bytes.
    HeapSize {
        heap_capset: u32,
        bytes: u64,
    },
    /// Live data after a major collection.
    HeapLive {
        heap_capset: u32,
        bytes: u64,
    },
    /// Bytes in blocks handed out by the block allocator (GHC 9.2+).
    BlocksSize {
        heap_capset: u32,
        bytes: u64,
    },
    HeapInfo(Box<HeapInfo>),
    /// After a major collection: megablocks held, needed, and returned to the OS (9.2+).
    MemReturn {
        heap_capset: u32,
        current_megablocks: u32,
        needed_megablocks: u32,
        returned_megablocks: u32,
    },
    CapsetCreate {
        capset: u32,
        capset_type: u16,
    },
    CapsetDelete {
        capset: u32,
    },
    CapsetAssignCap {
        capset: u32,
        capability: u16,
    },
    CapsetRemoveCap {
        capset: u32,
        capability: u16,
    },
    /// E.g. "GHC-9.0.2 rts_l".
    RtsIdentifier {
        capset: u32,
        identifier: String,
    },
    ProgramArgs {
        capset: u32,
        args: Vec<String>,
    },
    ProgramEnv {
        capset: u32,
        env: Vec<String>,
    },
    OsProcessPid {
        capset: u32,
        pid: u32,
    },
    OsProcessParentPid {
        capset: u32,
        ppid: u32,
    },
    /// The wall-clock time at this event's timestamp.
    WallClockTime {
        capset: u32,
        unix_seconds: u64,
        nanoseconds: u32,
    },
    LogMessage(String),
    UserMessage(String),
    UserMarker(String),
    HeapProfBegin {
        profile: u8,
        sampling_period_ns: u64,
        breakdown: HeapProfBreakdown,
    },
    HeapProfCostCentre(Box<CostCentre>),
    /// Starts a census; the entries follow until the matching end.
    HeapProfSampleBegin {
        era: u64,
    },
    /// Biographical censuses are written at the end of the run, each with its own time.
    HeapBioProfSampleBegin {
        era: u64,
        time_ns: u64,
    },
    /// A census entry for a cost-centre stack, innermost first.
    HeapProfSampleCostCentre {
        profile: u8,
        residency_bytes: u64,
        stack: Vec<u32>,
    },
    /// A census entry for a closure type (-hT), closure or type description, or module.
    HeapProfSampleString {
        profile: u8,
        residency_bytes: u64,
        label: String,
    },
    HeapProfSampleEnd {
        era: u64,
    },
    /// An event type this reader skips (thread scheduling, sparks, ...), or a known type
    /// whose payload is too short for the layout this reader knows.
    Other {
        tag: u16,
    },
}

/// A bounds-checked reader over one event's payload.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A NUL-terminated string; the rest of the payload when the NUL is missing.
    fn string(&mut self) -> String {
        let len = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.bytes.len());
        let text = String::from_utf8_lossy(&self.bytes[..len]).into_owned();
        self.bytes = &self.bytes[(len + 1).min(self.bytes.len())..];
        text
    }

    /// The rest of the payload as text, without trailing NULs.
    fn text(&mut self) -> String {
        let bytes = std::mem::take(&mut self.bytes);
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// The rest of the payload as NUL-separated strings.
    fn strings(&mut self) -> Vec<String> {
        let text = self.text();
        if text.is_empty() {
            return Vec::new();
        }
        text.split('\0').map(str::to_owned).collect()
    }
}

/// Decodes one payload. Fields a newer RTS appends are ignored; a payload shorter than the
/// known layout gives `None`, so the caller can report the event as [`EventKind::Other`].
pub(crate) fn decode(tag: u16, payload: &[u8]) -> Option<EventKind> {
    use tags::*;
    let mut f = Fields { bytes: payload };
    let kind = match tag {
        GC_START => EventKind::GcStart,
        GC_END => EventKind::GcEnd,
        REQUEST_SEQ_GC => EventKind::RequestSeqGc,
        REQUEST_PAR_GC => EventKind::RequestParGc,
        GC_IDLE => EventKind::GcIdle,
        GC_WORK => EventKind::GcWork,
        GC_DONE => EventKind::GcDone,
        GC_GLOBAL_SYNC => EventKind::GcGlobalSync,
        GC_STATS_GHC => EventKind::GcStats(Box::new(GcStats {
            heap_capset: f.u32()?,
            generation: f.u16()?,
            copied_bytes: f.u64()?,
            slop_bytes: f.u64()?,
            frag_bytes: f.u64()?,
            parallel_threads: f.u32()?,
            parallel_max_copied_bytes: f.u64()?,
            parallel_total_copied_bytes: f.u64()?,
            parallel_balanced_copied_bytes: f.u64(),
        })),
        HEAP_ALLOCATED => EventKind::HeapAllocated {
            heap_capset: f.u32()?,
            bytes: f.u64()?,
        },
        HEAP_SIZE => EventKind::HeapSize {
            heap_capset: f.u32()?,
            bytes: f.u64()?,
        },
        HEAP_LIVE => EventKind::HeapLive {
            heap_capset: f.u32()?,
            bytes: f.u64()?,
        },
        BLOCKS_SIZE => EventKind::BlocksSize {
            heap_capset: f.u32()?,
            bytes: f.u64()?,
        },
        HEAP_INFO_GHC => EventKind::HeapInfo(Box::new(HeapInfo {
            heap_capset: f.u32()?,
            generations: f.u16()?,
            max_heap_bytes: f.u64()?,
            alloc_area_bytes: f.u64()?,
            megablock_bytes: f.u64()?,
            block_bytes: f.u64()?,
        })),
        MEM_RETURN => EventKind::MemReturn {
            heap_capset: f.u32()?,
            current_megablocks: f.u32()?,
            needed_megablocks: f.u32()?,
            returned_megablocks: f.u32()?,
        },
        CAPSET_CREATE => EventKind::CapsetCreate {
            capset: f.u32()?,
            capset_type: f.u16()?,
        },
        CAPSET_DELETE => EventKind::CapsetDelete { capset: f.u32()? },
        CAPSET_ASSIGN_CAP => EventKind::CapsetAssignCap {
            capset: f.u32()?,
            capability: f.u16()?,
        },
        CAPSET_REMOVE_CAP => EventKind::CapsetRemoveCap {
            capset: f.u32()?,
            capability: f.u16()?,
        },
        RTS_IDENTIFIER => EventKind::RtsIdentifier {
            capset: f.u32()?,
            identifier: f.text(),
        },
        PROGRAM_ARGS => EventKind::ProgramArgs {
            capset: f.u32()?,
            args: f.strings(),
        },
        PROGRAM_ENV => EventKind::ProgramEnv {
            capset: f.u32()?,
            env: f.strings(),
        },
        OSPROCESS_PID => EventKind::OsProcessPid {
            capset: f.u32()?,
            pid: f.u32()?,
        },
        OSPROCESS_PPID => EventKind::OsProcessParentPid {
            capset: f.u32()?,
            ppid: f.u32()?,
        },
        WALL_CLOCK_TIME => EventKind::WallClockTime {
            capset: f.u32()?,
            unix_seconds: f.u64()?,
            nanoseconds: f.u32()?,
        },
        LOG_MSG => EventKind::LogMessage(f.text()),
        USER_MSG => EventKind::UserMessage(f.text()),
        USER_MARKER => EventKind::UserMarker(f.text()),
        HEAP_PROF_BEGIN => EventKind::HeapProfBegin {
            profile: f.u8()?,
            sampling_period_ns: f.u64()?,
            breakdown: HeapProfBreakdown::from_code(f.u32()?),
        },
        HEAP_PROF_COST_CENTRE => EventKind::HeapProfCostCentre(Box::new(CostCentre {
            id: f.u32()?,
            label: f.string(),
            module: f.string(),
            source_location: f.string(),
            is_caf: f.u8()? & 1 != 0,
        })),
        HEAP_PROF_SAMPLE_BEGIN => EventKind::HeapProfSampleBegin { era: f.u64()? },
        HEAP_BIO_PROF_SAMPLE_BEGIN => EventKind::HeapBioProfSampleBegin {
            era: f.u64()?,
            time_ns: f.u64()?,
        },
        HEAP_PROF_SAMPLE_COST_CENTRE => {
            let profile = f.u8()?;
            let residency_bytes = f.u64()?;
            let depth = f.u8()?;
            let stack = (0..depth).map(|_| f.u32()).collect::<Option<Vec<_>>>()?;
            EventKind::HeapProfSampleCostCentre {
                profile,
                residency_bytes,
                stack,
            }
        }
        HEAP_PROF_SAMPLE_STRING => EventKind::HeapProfSampleString {
            profile: f.u8()?,
            residency_bytes: f.u64()?,
            label: f.string(),
        },
        HEAP_PROF_SAMPLE_END => EventKind::HeapProfSampleEnd { era: f.u64()? },
        _ => EventKind::Other { tag },
    };
    Some(kind)
}
