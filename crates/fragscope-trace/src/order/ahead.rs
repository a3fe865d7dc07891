//! Reading and decoding a trace one step ahead of its analysis, on a thread of its own.
//!
//! Decompressing and decoding a thread buffer's records (the packed form's tables of
//! blocks by slot and of recently freed blocks, varints, zstd) takes about as long as
//! merging the calls and feeding them to the model. Both are sequential, but they only
//! meet at the decoded calls, so [`ReadAhead`] runs the first on another core: it reads
//! chunks in file order, decodes each events chunk with its process's
//! [`StreamDecoder`] (whose tables depend on file order alone, never on the merge), and
//! hands the chunks on through a short queue; [`ReadAhead::push_events`] gives a decoded
//! buffer to its process's [`Merger`], whose [`Merger::push_chunk`] decodes the same
//! way when the bytes come straight from a [`TraceReader`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::format::chunk::Damage;
use crate::format::reader::{Chunk, Skipped, TraceReader};
use crate::format::records::EventsHeader;
use crate::format::TraceError;
use crate::order::merge::Merger;
use crate::order::stream_decoder::{DecodedEvents, StreamDecoder};

/// A chunk as [`ReadAhead`] hands it on: events chunks apart, for
/// [`ReadAhead::push_events`]; the others as read (never [`Chunk::Events`]).
#[derive(Debug)]
pub enum AheadChunk {
    Events(EventsHeader, Events),
    Other(Chunk),
}

/// Whose events chunks a [`ReadAhead`] hands on (the others it leaves out, undecoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsOf {
    All,
    /// These streams' (one process's, with its ancestors' when it was forked).
    Streams(Vec<u32>),
    None,
}

impl EventsOf {
    fn wants(&self, stream: u32) -> bool {
        match self {
            Self::All => true,
            Self::Streams(s) => s.contains(&stream),
            Self::None => false,
        }
    }
}

/// A thread buffer's records: decoded on the reading thread, or still bytes (read inline).
#[derive(Debug)]
pub enum Events {
    Decoded(DecodedEvents),
    Bytes(Vec<u8>),
}

/// Chunks in flight between the reading thread and the analysis. Each decoded buffer
/// holds up to a few MiB (a buffer of frees, as at the exit of a program with a million
/// blocks, decodes into 4 MiB of calls), so a short queue keeps the reader busy without
/// holding much: with 4, a report over a million blocks peaked 8-9 MiB higher, no faster.
const QUEUE: usize = 2;

/// Reads and decodes a trace on a thread of its own, a few chunks ahead of the caller.
/// The interface follows [`TraceReader`]'s: chunks in file order until the end or
/// damage, then [`ReadAhead::damage`]. On a machine with one core it reads in the
/// caller's thread and leaves events chunks to the merge to decode.
pub struct ReadAhead<R: Read + Send + 'static = BufReader<File>> {
    source: Source<R>,
    events_of: EventsOf,
    file_bytes: u64,
    offset: u64,
    damage: Option<Damage>,
    skipped: Skipped,
}

/// How the reading thread's reading ended.
type Ending = (Option<Damage>, Skipped);

enum Source<R: Read> {
    Inline(TraceReader<R>),
    Thread {
        chunks: Option<Receiver<(AheadChunk, u64)>>,
        spent: SyncSender<DecodedEvents>,
        reader: Option<JoinHandle<Ending>>,
    },
}

impl ReadAhead {
    /// Reads `path` ahead on another thread when the machine has a core to spare.
    pub fn open(path: &Path, events_of: EventsOf) -> Result<Self, TraceError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(TraceReader::open(path)?, cores > 1, events_of)
    }
}

impl<R: Read + Send + 'static> ReadAhead<R> {
    /// Reads on another thread (`ahead`) or in the caller's.
    pub fn new(
        reader: TraceReader<R>,
        ahead: bool,
        events_of: EventsOf,
    ) -> Result<Self, TraceError> {
        let file_bytes = reader.file_bytes();
        let source = if ahead {
            Self::spawn(reader, events_of.clone())
        } else {
            Source::Inline(reader)
        };
        Ok(Self {
            source,
            events_of,
            file_bytes,
            offset: 0,
            damage: None,
            skipped: Skipped::default(),
        })
    }

    /// Starts the reading thread; where no thread can be started (a limit on processes),
    /// reads inline.
    fn spawn(reader: TraceReader<R>, events_of: EventsOf) -> Source<R> {
        // The reader goes to the thread once it runs, so a failed start still has it.
        let (give, take) = mpsc::sync_channel::<TraceReader<R>>(1);
        let (send, chunks) = mpsc::sync_channel(QUEUE);
        let (spent, spent_rx) = mpsc::sync_channel::<DecodedEvents>(QUEUE + 2);
        let started = std::thread::Builder::new()
            .name("fragscope-read".into())
            .spawn(move || {
                let Ok(mut reader) = take.recv() else {
                    return (None, Skipped::default());
                };
                let mut streams: HashMap<u32, StreamDecoder> = HashMap::new();
                while let Some(chunk) = reader.next_chunk() {
                    let item = match chunk {
                        Chunk::Events(h, _) if !events_of.wants(h.stream) => continue,
                        Chunk::Events(h, bytes) => {
                            let mut events = spent_rx.try_recv().unwrap_or_default();
                            let s = streams.entry(h.stream).or_default();
                            s.decode(&h, &bytes, &mut events);
                            AheadChunk::Events(h, Events::Decoded(events))
                        }
                        other => AheadChunk::Other(other),
                    };
                    if send.send((item, reader.offset())).is_err() {
                        break; // the analysis stopped early
                    }
                }
                (reader.damage().cloned(), reader.skipped().clone())
            });
        match started {
            Ok(thread) => {
                // The thread holds the other end until it has taken the reader.
                let _ = give.send(reader);
                Source::Thread {
                    chunks: Some(chunks),
                    spent,
                    reader: Some(thread),
                }
            }
            Err(_) => Source::Inline(reader),
        }
    }

    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Bytes read up to the chunk last returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next chunk, or `None` at the end or at damage.
    pub fn next_chunk(&mut self) -> Option<AheadChunk> {
        match &mut self.source {
            Source::Inline(reader) => loop {
                let chunk = reader.next_chunk();
                self.offset = reader.offset();
                return match chunk {
                    None => {
                        self.damage = reader.damage().cloned();
                        self.skipped = reader.skipped().clone();
                        None
                    }
                    Some(Chunk::Events(h, _)) if !self.events_of.wants(h.stream) => continue,
                    Some(Chunk::Events(h, bytes)) => {
                        Some(AheadChunk::Events(h, Events::Bytes(bytes)))
                    }
                    Some(other) => Some(AheadChunk::Other(other)),
                };
            },
            Source::Thread { chunks, .. } => match chunks.as_ref()?.recv() {
                Ok((chunk, offset)) => {
                    self.offset = offset;
                    Some(chunk)
                }
                Err(_) => {
                    self.join();
                    None
                }
            },
        }
    }

    /// Adds a thread buffer to its process's merge (which decodes it when it was read
    /// inline), and gives its arrays back for the next one.
    pub fn push_events(
        &self,
        merger: &mut Merger,
        h: &EventsHeader,
        events: Events,
    ) -> Result<(), TraceError> {
        match events {
            Events::Bytes(bytes) => merger.push_chunk(h, &bytes),
            Events::Decoded(mut decoded) => {
                let result = merger.push_decoded(h, &mut decoded);
                if let Source::Thread { spent, .. } = &self.source {
                    let _ = spent.try_send(decoded);
                }
                result
            }
        }
    }

    /// Where reading stopped early, if it did (known once `next_chunk` returned `None`).
    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// The chunks passed over because they did not decode (known once `next_chunk`
    /// returned `None`).
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// Closes the queue (which stops the reader at its next chunk) and waits for it.
    fn join(&mut self) {
        if let Source::Thread { chunks, reader, .. } = &mut self.source {
            *chunks = None;
            if let Some(thread) = reader.take() {
                (self.damage, self.skipped) = match thread.join() {
                    Ok(ending) => ending,
                    Err(_) => (
                        Some(Damage {
                            offset: self.offset,
                            reason: "the reading thread failed".into(),
                        }),
                        Skipped::default(),
                    ),
                };
            }
        }
    }
}

impl<R: Read + Send + 'static> Drop for ReadAhead<R> {
    fn drop(&mut self) {
        self.join();
    }
}
