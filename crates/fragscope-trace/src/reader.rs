//! Typed chunks from a trace file.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::chunk::{ChunkKind, ChunkReader, Damage};
use crate::records::*;
use crate::TraceError;

/// One chunk, decoded (event records stay raw: see [`crate::event::ChunkDecoder`]).
#[derive(Debug, Clone)]
pub enum Chunk {
    Meta(Meta),
    Process(Process),
    Events(EventsHeader, Vec<u8>),
    Maps(Maps),
    Rss(RssBatch),
    Rollup(Rollup),
    Pagemap(Pagemap),
    ProcessEnd(ProcessEnd),
    WaitStatus(WaitStatus),
    Untraced(Untraced),
    End(End),
    GhcCensus(GhcCensus),
    PymallocCensus(PymallocCensus),
    HeapCensus(crate::heap_census::HeapCensus),
    PythonSamples(crate::runtime_samples::RuntimeSamples),
    LispSamples(crate::runtime_samples::RuntimeSamples),
    SbclCensus(crate::sbcl_heap::SbclCensus),
    StartingHeap(crate::heap_census::StartingHeap),
}

/// Reads a trace chunk by chunk. Damage (a cut or corrupt file) ends the iteration; what
/// came before is intact and `damage()` says where reading stopped.
pub struct TraceReader<R: Read = BufReader<File>> {
    chunks: ChunkReader<R>,
    raw: Vec<u8>,
    file_bytes: u64,
    damage: Option<Damage>,
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

    /// The next chunk, or `None` at the end or at damage.
    pub fn next_chunk(&mut self) -> Option<Chunk> {
        if self.damage.is_some() {
            return None;
        }
        let offset = self.chunks.offset();
        let kind = self.chunks.next_chunk_into(&mut self.raw)?;
        let data = &self.raw[..];
        let decoded = match kind {
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
            ChunkKind::ProcessEnd => ProcessEnd::decode(data).map(Chunk::ProcessEnd),
            ChunkKind::WaitStatus => WaitStatus::decode(data).map(Chunk::WaitStatus),
            ChunkKind::Untraced => Untraced::decode(data).map(Chunk::Untraced),
            ChunkKind::End => End::decode(data).map(Chunk::End),
            ChunkKind::GhcCensus => GhcCensus::decode(data).map(Chunk::GhcCensus),
            ChunkKind::PymallocCensus => PymallocCensus::decode(data).map(Chunk::PymallocCensus),
            ChunkKind::PythonSamples => {
                crate::runtime_samples::RuntimeSamples::decode(data).map(Chunk::PythonSamples)
            }
            ChunkKind::LispSamples => {
                crate::runtime_samples::RuntimeSamples::decode(data).map(Chunk::LispSamples)
            }
            ChunkKind::SbclCensus => {
                crate::sbcl_heap::SbclCensus::decode(data).map(Chunk::SbclCensus)
            }
            ChunkKind::HeapCensus => {
                crate::heap_census::HeapCensus::decode(data).map(Chunk::HeapCensus)
            }
            ChunkKind::StartingHeap => {
                crate::heap_census::StartingHeap::decode(data).map(Chunk::StartingHeap)
            }
            ChunkKind::PackedEventsV1 | ChunkKind::PackedEventsV2 => Err(TraceError::Malformed(
                "events packed in the form of an earlier fragscope, which this one no longer \
                 reads: record the program again"
                    .into(),
            )),
        };
        match decoded {
            Ok(c) => Some(c),
            Err(e) => {
                self.damage = Some(Damage {
                    offset,
                    reason: format!("a {kind:?} chunk does not decode: {e}"),
                });
                None
            }
        }
    }
}

/// Reads every chunk of an in-memory trace and decodes every event record, merging each
/// process's threads: the whole reading path, for fuzzing. Never panics; returns the
/// number of calls merged.
pub fn read_all_from_bytes(data: &[u8]) -> u64 {
    let Ok(mut r) = TraceReader::<&[u8]>::from_reader(data, data.len() as u64) else {
        return 0;
    };
    let mut mergers: std::collections::HashMap<u32, crate::merge::Merger> = Default::default();
    let mut calls = 0;
    while let Some(chunk) = r.next_chunk() {
        if let Chunk::Events(h, records) = chunk {
            let m = mergers.entry(h.stream).or_default();
            let _ = m.push_chunk(&h, &records);
            while m.pop().is_some() {
                calls += 1;
            }
        }
    }
    for m in mergers.values_mut() {
        m.finish();
        while m.pop().is_some() {
            calls += 1;
        }
    }
    calls
}
