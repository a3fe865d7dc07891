//! Typed chunks from a trace file.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::format::chunk::{ChunkKind, ChunkReader, Damage};
use crate::format::records::*;
use crate::format::TraceError;

/// One chunk, decoded (event records stay raw: see [`crate::format::event::ChunkDecoder`]).
#[derive(Debug, Clone)]
pub enum Chunk {
    Meta(Meta),
    Process(Process),
    Events(EventsHeader, Vec<u8>),
    Maps(Maps),
    Rss(RssBatch),
    Rollup(Rollup),
    Pagemap(Pagemap),
    /// A forked process's residency as it started (see `ChunkKind::ForkResidency`).
    ForkResidency(Pagemap),
    ProcessEnd(ProcessEnd),
    WaitStatus(WaitStatus),
    Untraced(Untraced),
    End(End),
    GhcCensus(GhcCensus),
    PymallocCensus(PymallocCensus),
    HeapCensus(crate::format::heap_census::HeapCensus),
    PythonSamples(crate::format::runtime_samples::RuntimeSamples),
    LispSamples(crate::format::runtime_samples::RuntimeSamples),
    SbclCensus(crate::format::sbcl_heap::SbclCensus),
    GoCensus(crate::format::go_heap::GoCensus),
    JvmCensus(crate::format::jvm_heap::JvmCensus),
    V8Census(crate::format::v8_heap::V8Census),
    StartingHeap(crate::format::heap_census::StartingHeap),
    LinkedAllocator(crate::format::heap_census::LinkedAllocator),
}

/// Reads a trace chunk by chunk. Damage (a cut or corrupt file) ends the iteration; what
/// came before is intact and `damage()` says where reading stopped. An intact chunk that
/// stands alone ([`ChunkKind::stands_alone`]) but does not decode is passed over instead,
/// and counted in `skipped()`.
pub struct TraceReader<R: Read = BufReader<File>> {
    chunks: ChunkReader<R>,
    raw: Vec<u8>,
    file_bytes: u64,
    damage: Option<Damage>,
    skipped: Skipped,
}

/// Chunks passed over because they did not decode: how many, and the first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    pub count: u64,
    pub first: Option<Damage>,
}

impl Skipped {
    fn add(&mut self, d: Damage) {
        self.count += 1;
        self.first.get_or_insert(d);
    }

    /// What a report says of them, if any were skipped.
    pub fn note(&self) -> Option<String> {
        let first = self.first.as_ref()?;
        let others = match self.count {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        Some(format!(
            "skipped the chunk at byte {}{others}: {} (what it held is missing; the rest \
             of the trace was read)",
            first.offset, first.reason
        ))
    }
}

impl TraceReader {
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path)?;
        let file_bytes = file.metadata()?.len();
        Self::from_reader(BufReader::with_capacity(1 << 20, file), file_bytes)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads a trace from any byte source (`file_bytes`: its length, for progress).
    pub fn from_reader(input: R, file_bytes: u64) -> Result<Self, TraceError> {
        let chunks = ChunkReader::new(input)?;
        Ok(Self {
            chunks,
            raw: Vec::new(),
            file_bytes,
            damage: None,
            skipped: Skipped::default(),
        })
    }

    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.chunks.offset()
    }

    /// Where reading stopped early, if it did.
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref().or(self.chunks.damage())
    }

    /// The chunks passed over so far because they did not decode.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// The next chunk, or `None` at the end or at damage.
    pub fn next_chunk(&mut self) -> Option<Chunk> {
        loop {
            if self.damage.is_some() {
                return None;
            }
            let offset = self.chunks.offset();
            let kind = self.chunks.next_chunk_into(&mut self.raw)?;
            match decode_chunk(kind, &self.raw) {
                Ok(c) => return Some(c),
                Err(e) => {
                    let d = Damage {
                        offset,
                        reason: format!("a {kind:?} chunk does not decode: {e}"),
                    };
                    if kind.stands_alone() {
                        self.skipped.add(d);
                    } else {
                        self.damage = Some(d);
                    }
                }
            }
        }
    }
}

/// A chunk's payload `data`, decoded as `kind`.
pub(crate) fn decode_chunk(kind: ChunkKind, data: &[u8]) -> Result<Chunk, TraceError> {
    match kind {
        ChunkKind::Meta => Meta::decode(data).map(Chunk::Meta),
        ChunkKind::Process => Process::decode(data).map(Chunk::Process),
        ChunkKind::Events | ChunkKind::PackedEvents => {
            EventsHeader::decode(data).map(|(mut h, rest)| {
                h.packed = kind == ChunkKind::PackedEvents;
                Chunk::Events(h, rest.to_vec())
            })
        }
        ChunkKind::Maps => Maps::decode(data).map(Chunk::Maps),
        ChunkKind::Rss => RssBatch::decode(data).map(Chunk::Rss),
        ChunkKind::Rollup => Rollup::decode(data).map(Chunk::Rollup),
        ChunkKind::Pagemap => Pagemap::decode(data).map(Chunk::Pagemap),
        ChunkKind::ForkResidency => Pagemap::decode(data).map(Chunk::ForkResidency),
        ChunkKind::ProcessEnd => ProcessEnd::decode(data).map(Chunk::ProcessEnd),
        ChunkKind::WaitStatus => WaitStatus::decode(data).map(Chunk::WaitStatus),
        ChunkKind::Untraced => Untraced::decode(data).map(Chunk::Untraced),
        ChunkKind::End => End::decode(data).map(Chunk::End),
        ChunkKind::GhcCensus => GhcCensus::decode(data).map(Chunk::GhcCensus),
        ChunkKind::PymallocCensus => PymallocCensus::decode(data).map(Chunk::PymallocCensus),
        ChunkKind::PythonSamples => {
            crate::format::runtime_samples::RuntimeSamples::decode(data).map(Chunk::PythonSamples)
        }
        ChunkKind::LispSamples => {
            crate::format::runtime_samples::RuntimeSamples::decode(data).map(Chunk::LispSamples)
        }
        ChunkKind::SbclCensus => {
            crate::format::sbcl_heap::SbclCensus::decode(data).map(Chunk::SbclCensus)
        }
        ChunkKind::GoCensus => crate::format::go_heap::GoCensus::decode(data).map(Chunk::GoCensus),
        ChunkKind::JvmCensus => {
            crate::format::jvm_heap::JvmCensus::decode(data).map(Chunk::JvmCensus)
        }
        ChunkKind::V8Census => crate::format::v8_heap::V8Census::decode(data).map(Chunk::V8Census),
        ChunkKind::HeapCensus => {
            crate::format::heap_census::HeapCensus::decode(data).map(Chunk::HeapCensus)
        }
        ChunkKind::LinkedAllocator => {
            crate::format::heap_census::LinkedAllocator::decode(data).map(Chunk::LinkedAllocator)
        }
        ChunkKind::StartingHeap => {
            crate::format::heap_census::StartingHeap::decode(data).map(Chunk::StartingHeap)
        }
        ChunkKind::PackedEventsV1 | ChunkKind::PackedEventsV2 => Err(TraceError::Malformed(
            "events packed in the form of an earlier fragscope, which this one no longer \
                 reads: record the program again"
                .into(),
        )),
    }
}
