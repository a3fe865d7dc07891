//! What a trace holds, read once and without decoding a call: its metadata, its
//! processes, and per process which chunks it has (censuses of which runtimes, snapshots,
//! calls). `report`, `compare`, `export` and `replay` decide what to do from this.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::format::chunk::{ChunkKind, ChunkReader, Damage};
use crate::format::reader::{decode_chunk, Chunk};
use crate::format::records::{EventsHeader, Meta, Process};
use crate::format::wire::Reader;
use crate::format::TraceError;

/// Enough of any chunk that leads with its stream for that stream, and of an events
/// chunk for its whole header (six varints).
const HEAD_BYTES: usize = 64;

/// A trace's table of contents.
#[derive(Debug, Clone, Default)]
pub struct TraceContents {
    pub meta: Option<Meta>,
    /// Every process image, in the order the trace introduces them.
    pub processes: Vec<Process>,
    /// Per stream (process image): what it has.
    pub streams: BTreeMap<u32, StreamContents>,
    /// Where the walk stopped before the end, if it did (the readers say it again).
    pub damage: Option<Damage>,
}

/// What one process image's chunks are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamContents {
    /// Chunks by kind, counted.
    pub chunks: BTreeMap<ChunkKind, u64>,
    /// Bytes of its calls' records (the events chunks' payloads after their headers).
    pub event_bytes: u64,
}

impl StreamContents {
    pub fn has(&self, kind: ChunkKind) -> bool {
        self.chunks.contains_key(&kind)
    }
}

impl TraceContents {
    /// Walks `path`'s chunks, decompressing only their first bytes (Meta and Process
    /// chunks whole).
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path)?;
        Self::from_reader(BufReader::with_capacity(1 << 20, file))
    }

    pub fn from_reader(input: impl Read) -> Result<Self, TraceError> {
        let mut chunks = ChunkReader::new(input)?;
        let mut contents = Self::default();
        let mut raw = Vec::new();
        let whole_or_head = |kind| match kind {
            ChunkKind::Meta | ChunkKind::Process => usize::MAX,
            _ => HEAD_BYTES,
        };
        while let Some((kind, len)) = chunks.next_chunk_prefix(&mut raw, whole_or_head) {
            contents.take(kind, &raw, len);
        }
        contents.damage = chunks.damage().cloned();
        Ok(contents)
    }

    /// Takes in a chunk of `kind`, `len` bytes long, of which `head` is the start.
    fn take(&mut self, kind: ChunkKind, head: &[u8], len: usize) {
        match kind {
            ChunkKind::Meta => {
                if let Ok(Chunk::Meta(m)) = decode_chunk(kind, head) {
                    self.meta.get_or_insert(m);
                }
            }
            ChunkKind::Process => {
                if let Ok(Chunk::Process(p)) = decode_chunk(kind, head) {
                    self.streams.entry(p.stream).or_default();
                    self.processes.push(p);
                }
            }
            _ => {
                let Some(stream) = leading_stream(kind, head) else {
                    return;
                };
                let s = self.streams.entry(stream).or_default();
                *s.chunks.entry(kind).or_default() += 1;
                if matches!(kind, ChunkKind::Events | ChunkKind::PackedEvents) {
                    s.event_bytes += events_bytes(head, len);
                }
            }
        }
    }

    /// The first process image's stream: the program `record` started or attached to.
    pub fn first_stream(&self) -> Option<u32> {
        self.processes.first().map(|p| p.stream)
    }

    /// Whether the first process image has chunks of `kind`.
    pub fn first_process_has(&self, kind: ChunkKind) -> bool {
        let first = self.first_stream().and_then(|s| self.streams.get(&s));
        first.is_some_and(|s| s.has(kind))
    }

    /// The GHC eventlog the recording wrote beside the trace at `trace`, if it did.
    pub fn ghc_eventlog(&self, trace: &Path) -> Option<PathBuf> {
        let name = self.meta.as_ref()?.ghc_eventlog.as_ref()?;
        Some(trace.parent().unwrap_or(Path::new("")).join(name))
    }
}

/// The stream a chunk of `kind` belongs to, for the kinds whose payload leads with it.
fn leading_stream(kind: ChunkKind, head: &[u8]) -> Option<u32> {
    use ChunkKind::*;
    match kind {
        // These lead with something else (a pid, a tick), or belong to no stream.
        Meta | Process | End | WaitStatus | Untraced | PackedEventsV1 | PackedEventsV2 => None,
        Events | PackedEvents | Maps | Rss | Rollup | Pagemap | ForkResidency | ProcessEnd
        | GhcCensus | HeapCensus | PymallocCensus | PythonSamples | SbclCensus | StartingHeap
        | LispSamples | LinkedAllocator | GoCensus | JvmCensus | V8Census => Reader::new(head)
            .varint()
            .ok()
            .and_then(|s| u32::try_from(s).ok()),
    }
}

/// The bytes of an events chunk's records: its length `len` less its header's, which
/// `head` (the payload's first bytes) holds.
fn events_bytes(head: &[u8], len: usize) -> u64 {
    EventsHeader::decode(head).map_or(0, |(_, after)| (len - (head.len() - after.len())) as u64)
}
