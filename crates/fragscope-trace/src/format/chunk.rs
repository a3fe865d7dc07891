//! Chunk framing: the file is a header followed by self-checking chunks, so a file cut
//! anywhere (SIGKILL, a full disk) reads back up to its last whole chunk.
//!
//! ```text
//! file   := "FRAGSCOP" version:u32le flags:u32le chunk*
//! chunk  := magic:u32le("FSCK") kind:u8 codec:u8 reserved:u16le
//!           raw_len:u32le stored_len:u32le crc:u32le stored[stored_len]
//! crc    := CRC-32 (IEEE) of kind, codec, reserved, raw_len, stored_len and stored
//! codec  := 0 stored as is | 1 zstd frame | 2 sections
//! sections := (raw_len:varint stored_len:varint stored)*: the raw payload is the
//!           sections' concatenation; a section is as is when its two lengths are equal,
//!           else one zstd frame (each compressed alone: columns of unlike bytes)
//! ```

use std::io::{self, Read, Write};

use crate::format::TraceError;

pub const FILE_MAGIC: &[u8; 8] = b"FRAGSCOP";
pub const FORMAT_VERSION: u32 = 1;
pub const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"FSCK");
pub const FILE_HEADER_BYTES: u64 = 16;
pub const CHUNK_HEADER_BYTES: u64 = 20;
/// No chunk is larger than this, raw or stored; a larger length means corruption.
pub const MAX_CHUNK_BYTES: u32 = 64 << 20;

/// What a chunk holds; the payload layouts are in docs/trace-format.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ChunkKind {
    Meta = 1,
    Process = 2,
    Events = 3,
    Maps = 4,
    Rss = 5,
    Rollup = 6,
    Pagemap = 7,
    ProcessEnd = 8,
    WaitStatus = 9,
    End = 10,
    /// Events in the first packed form, since replaced: no longer read.
    PackedEventsV1 = 11,
    /// Events in the second packed form (rows), since replaced: no longer read.
    PackedEventsV2 = 12,
    /// Events in the packed form (see [`crate::format::pack`]).
    PackedEvents = 13,
    /// A GHC program's block census (see [`crate::format::records::GhcCensus`]).
    GhcCensus = 14,
    /// A process image that could not be traced.
    Untraced = 15,
    /// A malloc heap read from outside the process (see [`crate::format::heap_census`]).
    HeapCensus = 16,
    /// A CPython process's pymalloc census (see [`crate::format::records::PymallocCensus`]).
    PymallocCensus = 17,
    /// A CPython process's sampled objects with Python stacks (see
    /// [`crate::format::runtime_samples`]).
    PythonSamples = 18,
    /// An SBCL process's dynamic space (see [`crate::format::sbcl_heap`]).
    SbclCensus = 19,
    /// The blocks a running process held when `record -p` attached to it
    /// (`heap_census::StartingHeap`).
    StartingHeap = 21,
    /// An SBCL process's sampled allocation regions with Lisp stacks (chunk 18's
    /// encoding, see [`crate::format::runtime_samples`]).
    LispSamples = 22,
    /// A forked process's page residency as it started (chunk 7's encoding): the pages it
    /// inherited, against which its later snapshots tell copied pages from new ones.
    ForkResidency = 23,
    /// An allocator linked into a process's program, whose calls are not traced
    /// (`heap_census::LinkedAllocator`).
    LinkedAllocator = 24,
    /// A Go program's heap: its spans (see [`crate::format::go_heap`]).
    GoCensus = 25,
    /// A HotSpot JVM's Java heap and runtime areas (see [`crate::format::jvm_heap`]).
    JvmCensus = 26,
    /// A Node.js process's V8 heap as V8 counts it (see [`crate::format::v8_heap`]).
    V8Census = 27,
}

impl ChunkKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        use ChunkKind::*;
        Some(match v {
            1 => Meta,
            2 => Process,
            3 => Events,
            4 => Maps,
            5 => Rss,
            6 => Rollup,
            7 => Pagemap,
            8 => ProcessEnd,
            9 => WaitStatus,
            10 => End,
            11 => PackedEventsV1,
            12 => PackedEventsV2,
            13 => PackedEvents,
            14 => GhcCensus,
            15 => Untraced,
            16 => HeapCensus,
            17 => PymallocCensus,
            18 => PythonSamples,
            19 => SbclCensus,
            21 => StartingHeap,
            22 => LispSamples,
            23 => ForkResidency,
            24 => LinkedAllocator,
            25 => GoCensus,
            26 => JvmCensus,
            27 => V8Census,
            _ => return None,
        })
    }

    /// An observation the rest of the trace does not build on (a census, RSS samples, a
    /// memory map ...): one that does not decode can be passed over and the chunks after
    /// it still read. Metadata, processes, event buffers (whose packed form carries tables
    /// from chunk to chunk) and the end marker cannot.
    pub fn stands_alone(self) -> bool {
        use ChunkKind::*;
        match self {
            Maps | Rss | Rollup | Pagemap | ProcessEnd | WaitStatus | Untraced | GhcCensus
            | HeapCensus | PymallocCensus | PythonSamples | SbclCensus | StartingHeap
            | LispSamples | ForkResidency | LinkedAllocator | GoCensus | JvmCensus | V8Census => {
                true
            }
            Meta | Process | Events | PackedEventsV1 | PackedEventsV2 | PackedEvents | End => false,
        }
    }
}

fn chunk_crc(header: &[u8], stored: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    h.update(stored);
    h.finalize()
}

/// Writes chunks; zstd-compresses payloads worth compressing.
pub struct ChunkWriter<W: Write> {
    out: W,
    level: i32,
    /// The level of event buffers (`ChunkKind::Events` and `PackedEvents`), if not
    /// `level`.
    events_level: Option<i32>,
    /// The level the compressor is set to.
    compressor_level: i32,
    compressor: zstd::bulk::Compressor<'static>,
    /// Compressed bytes, and a sectioned chunk's stored bytes, reused from chunk to chunk
    /// (a fresh buffer per chunk costs page faults at the recorder's rate of chunks).
    scratch: Vec<u8>,
    sections: Vec<u8>,
    bytes_written: u64,
}

impl<W: Write> ChunkWriter<W> {
    pub fn new(mut out: W, level: i32) -> io::Result<Self> {
        out.write_all(FILE_MAGIC)?;
        out.write_all(&FORMAT_VERSION.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        Ok(Self {
            out,
            level,
            events_level: None,
            compressor_level: level,
            compressor: zstd::bulk::Compressor::new(level)?,
            scratch: Vec::new(),
            sections: Vec::new(),
            bytes_written: FILE_HEADER_BYTES,
        })
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Compresses event buffers, raw and packed, at `level` instead: they are a
    /// recorder's bulk. Raw ones (addresses, mostly) gain about 4% from zstd's level 3
    /// over its level 1 (a larson-style trace: 1.24 vs 1.20 times smaller) for three
    /// times the CPU; the packed form's planes, which zstd mostly entropy-codes, 0-2%.
    pub fn with_events_level(mut self, level: i32) -> Self {
        self.events_level = Some(level);
        self
    }

    /// Sets the compressor to the level of chunks of `kind`.
    fn set_level_for(&mut self, kind: ChunkKind) -> io::Result<()> {
        let level = match (kind, self.events_level) {
            (ChunkKind::Events | ChunkKind::PackedEvents, Some(l)) => l,
            _ => self.level,
        };
        if level != self.compressor_level && level > 0 {
            self.compressor.set_compression_level(level)?;
            self.compressor_level = level;
        }
        Ok(())
    }

    /// Writes `raw` whole, or in sections ending at `section_ends` when there are some
    /// (see [`ChunkWriter::write_sections`]).
    pub fn write(&mut self, kind: ChunkKind, raw: &[u8], section_ends: &[usize]) -> io::Result<()> {
        if section_ends.is_empty() {
            self.write_chunk(kind, raw)
        } else {
            self.write_sections(kind, raw, section_ends)
        }
    }

    pub fn write_chunk(&mut self, kind: ChunkKind, raw: &[u8]) -> io::Result<()> {
        check_chunk_len(raw.len())?;
        self.set_level_for(kind)?;
        let mut compressed = std::mem::take(&mut self.scratch);
        let result = if self.compress(raw, &mut compressed)? {
            self.put_chunk(kind, 1, raw.len(), &compressed)
        } else {
            self.put_chunk(kind, 0, raw.len(), raw)
        };
        self.scratch = compressed;
        result
    }

    /// Compresses `raw` into `out` (emptied first) if that is worth it: true if `out`
    /// is now smaller than `raw`.
    fn compress(&mut self, raw: &[u8], out: &mut Vec<u8>) -> io::Result<bool> {
        out.clear();
        if raw.len() < 64 || self.level <= 0 {
            return Ok(false);
        }
        out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
        self.compressor.compress_to_buffer(raw, out)?;
        Ok(out.len() < raw.len())
    }

    /// Writes `raw` as sections ending at `ends` (increasing offsets, the last one
    /// `raw.len()`), each compressed on its own (codec 2).
    pub fn write_sections(
        &mut self,
        kind: ChunkKind,
        raw: &[u8],
        ends: &[usize],
    ) -> io::Result<()> {
        check_chunk_len(raw.len())?;
        if ends.last() != Some(&raw.len()) || ends.windows(2).any(|w| w[0] > w[1]) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "sections must be in order and cover the chunk",
            ));
        }
        self.set_level_for(kind)?;
        let mut compressed = std::mem::take(&mut self.scratch);
        let mut stored = crate::format::wire::Writer {
            bytes: std::mem::take(&mut self.sections),
        };
        stored.bytes.clear();
        let mut start = 0;
        for &end in ends {
            let section = &raw[start..end];
            start = end;
            let body = if self.compress(section, &mut compressed)? {
                &compressed[..]
            } else {
                section
            };
            stored
                .varint(section.len() as u64)
                .varint(body.len() as u64);
            stored.bytes.extend_from_slice(body);
        }
        self.scratch = compressed;
        let result = check_chunk_len(stored.bytes.len())
            .and_then(|()| self.put_chunk(kind, 2, raw.len(), &stored.bytes));
        self.sections = stored.bytes;
        result
    }

    fn put_chunk(
        &mut self,
        kind: ChunkKind,
        codec: u8,
        raw_len: usize,
        stored: &[u8],
    ) -> io::Result<()> {
        let mut header = [0u8; 12];
        header[0] = kind as u8;
        header[1] = codec;
        header[4..8].copy_from_slice(&(raw_len as u32).to_le_bytes());
        header[8..12].copy_from_slice(&(stored.len() as u32).to_le_bytes());
        let crc = chunk_crc(&header, stored);
        self.out.write_all(&CHUNK_MAGIC.to_le_bytes())?;
        self.out.write_all(&header)?;
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.write_all(stored)?;
        self.bytes_written += CHUNK_HEADER_BYTES + stored.len() as u64;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

fn check_chunk_len(len: usize) -> io::Result<()> {
    if len as u64 > u64::from(MAX_CHUNK_BYTES) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "chunk larger than the format allows",
        ));
    }
    Ok(())
}

/// Decompresses a codec 2 payload (sections) into `raw`; false if it is malformed or
/// does not come to `raw_len` bytes.
fn join_sections(
    decompressor: &mut zstd::bulk::Decompressor<'static>,
    stored: &[u8],
    raw_len: usize,
    raw: &mut Vec<u8>,
) -> bool {
    let mut r = crate::format::wire::Reader::new(stored);
    raw.reserve(raw_len);
    while !r.is_empty() {
        let Some((len, body)) = next_section(&mut r).filter(|s| s.0 <= raw_len - raw.len()) else {
            return false;
        };
        if len == body.len() {
            raw.extend_from_slice(body);
            continue;
        }
        let at = raw.len();
        raw.resize(at + len, 0);
        match decompressor.decompress_to_buffer(body, &mut raw[at..]) {
            Ok(n) if n == len => {}
            _ => return false,
        }
    }
    raw.len() == raw_len
}

/// The next section of a chunk stored as sections: its raw length and its stored bytes
/// (the raw bytes themselves when the two lengths are equal); `None` if it is cut.
fn next_section<'a>(r: &mut crate::format::wire::Reader<'a>) -> Option<(usize, &'a [u8])> {
    let (len, stored_len) = (r.varint().ok()?, r.varint().ok()?);
    let body = r.take(usize::try_from(stored_len).ok()?).ok()?;
    Some((usize::try_from(len).ok()?, body))
}

/// Where and why reading stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub offset: u64,
    pub reason: String,
}

/// Reads chunks in file order. A damaged or cut chunk ends the iteration; `damage()`
/// then says where and why, and everything before it was returned intact.
pub struct ChunkReader<R: Read> {
    input: R,
    offset: u64,
    damage: Option<Damage>,
    done: bool,
    decompressor: zstd::bulk::Decompressor<'static>,
    stored: Vec<u8>,
}

impl<R: Read> ChunkReader<R> {
    /// Checks the file header; an error here means the input is not a fragscope trace.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut header = [0u8; 16];
        if read_full(&mut input, &mut header).map_err(TraceError::Io)? < header.len() {
            return Err(TraceError::NotATrace(
                "the file is shorter than a trace header".into(),
            ));
        }
        if &header[..8] != FILE_MAGIC {
            return Err(TraceError::NotATrace(
                "it does not start with the fragscope trace magic".into(),
            ));
        }
        let version = u32::from_le_bytes(header[8..12].try_into().unwrap());
        if version != FORMAT_VERSION {
            return Err(TraceError::NotATrace(format!(
                "trace format version {version}; this fragscope reads version {FORMAT_VERSION}"
            )));
        }
        Ok(Self {
            input,
            offset: FILE_HEADER_BYTES,
            damage: None,
            done: false,
            decompressor: zstd::bulk::Decompressor::new().map_err(TraceError::Io)?,
            stored: Vec::new(),
        })
    }

    pub fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// Bytes consumed so far (for progress reporting).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Ends the reading at damage: `None`, as whatever reads the next chunk returns then.
    fn stop<T>(&mut self, reason: impl Into<String>) -> Option<T> {
        self.damage = Some(Damage {
            offset: self.offset,
            reason: reason.into(),
        });
        self.done = true;
        None
    }

    /// The next chunk's kind and raw payload; `None` at the end or at damage.
    pub fn next_chunk(&mut self) -> Option<(ChunkKind, Vec<u8>)> {
        let mut raw = Vec::new();
        let kind = self.next_chunk_into(&mut raw)?;
        Some((kind, raw))
    }

    /// As `next_chunk`, reusing the caller's buffer. Chunks of kinds this reader does not
    /// know are skipped.
    pub fn next_chunk_into(&mut self, raw: &mut Vec<u8>) -> Option<ChunkKind> {
        let (kind, codec, raw_len) = self.next_stored()?;
        self.unpack(kind, codec, raw_len, raw)
    }

    /// As `next_chunk_into`, but only the first `prefix(kind)` bytes of each payload are
    /// decompressed (all of it for `usize::MAX`, fewer when the payload is shorter): what
    /// a reader that only wants to know what a trace holds needs, without decoding its
    /// calls. Also gives the payload's whole length. Chunks are still checksummed, so
    /// damage ends the walk where it ends a read.
    pub fn next_chunk_prefix(
        &mut self,
        raw: &mut Vec<u8>,
        prefix: impl Fn(ChunkKind) -> usize,
    ) -> Option<(ChunkKind, usize)> {
        let (kind, codec, raw_len) = self.next_stored()?;
        let want = prefix(kind).min(raw_len as usize);
        if want == raw_len as usize {
            return Some((self.unpack(kind, codec, raw_len, raw)?, want));
        }
        raw.clear();
        let whole = match codec {
            0 => {
                raw.extend_from_slice(&self.stored[..want]);
                true
            }
            1 => frame_prefix(&self.stored, want, raw),
            2 => sections_prefix(&self.stored, want, raw),
            other => return self.stop(format!("unknown chunk codec {other}")),
        };
        if !whole {
            return self.stop("a chunk does not decompress to its stated size");
        }
        Some((self.passed(kind), raw_len as usize))
    }

    /// Moves past the chunk in `stored`, read whole.
    fn passed(&mut self, kind: ChunkKind) -> ChunkKind {
        self.offset += CHUNK_HEADER_BYTES + self.stored.len() as u64;
        kind
    }

    /// Reads the next chunk of a known kind into `stored`, checksummed: its kind, codec
    /// and raw length. `None` at the end or at damage.
    fn next_stored(&mut self) -> Option<(ChunkKind, u8, u32)> {
        loop {
            if self.done {
                return None;
            }
            let mut header = [0u8; 20];
            match read_full(&mut self.input, &mut header) {
                Ok(20) => {}
                Ok(0) => {
                    self.done = true;
                    return None;
                }
                Ok(_) => return self.stop("the file ends inside a chunk header"),
                Err(e) => return self.stop(format!("read error: {e}")),
            }
            if u32::from_le_bytes(header[0..4].try_into().unwrap()) != CHUNK_MAGIC {
                return self.stop("no chunk starts here (bad chunk magic)");
            }
            let fields = &header[4..16];
            let kind_byte = fields[0];
            let codec = fields[1];
            let raw_len = u32::from_le_bytes(fields[4..8].try_into().unwrap());
            let stored_len = u32::from_le_bytes(fields[8..12].try_into().unwrap());
            let crc = u32::from_le_bytes(header[16..20].try_into().unwrap());
            if raw_len > MAX_CHUNK_BYTES || stored_len > MAX_CHUNK_BYTES {
                return self.stop("a chunk length is beyond the format's limit");
            }
            self.stored.resize(stored_len as usize, 0);
            match read_full(&mut self.input, &mut self.stored) {
                Ok(n) if n == self.stored.len() => {}
                Ok(_) => return self.stop("the file ends inside a chunk"),
                Err(e) => return self.stop(format!("read error: {e}")),
            }
            if chunk_crc(fields, &self.stored) != crc {
                return self.stop("a chunk's checksum does not match (corrupt data)");
            }
            // A kind from a later fragscope: whole and checksummed, so it can be stepped
            // over and what this reader knows still read.
            match ChunkKind::from_u8(kind_byte) {
                Some(kind) => return Some((kind, codec, raw_len)),
                None => self.offset += CHUNK_HEADER_BYTES + u64::from(stored_len),
            }
        }
    }

    /// The payload of the chunk in `stored`, whole, into `raw`.
    fn unpack(
        &mut self,
        kind: ChunkKind,
        codec: u8,
        raw_len: u32,
        raw: &mut Vec<u8>,
    ) -> Option<ChunkKind> {
        raw.clear();
        match codec {
            0 => raw.extend_from_slice(&self.stored),
            1 => {
                raw.reserve(raw_len as usize);
                match self.decompressor.decompress_to_buffer(&self.stored, raw) {
                    Ok(n) if n == raw_len as usize => {}
                    _ => return self.stop("a chunk does not decompress to its stated size"),
                }
            }
            2 => {
                if !join_sections(&mut self.decompressor, &self.stored, raw_len as usize, raw) {
                    return self.stop("a chunk's sections do not decompress to its stated size");
                }
            }
            other => return self.stop(format!("unknown chunk codec {other}")),
        }
        Some(self.passed(kind))
    }
}

/// The first `want` bytes of one zstd frame, appended to `raw`; false if it has fewer.
/// Streaming, so only the frame's first blocks are decompressed.
fn frame_prefix(frame: &[u8], want: usize, raw: &mut Vec<u8>) -> bool {
    let Ok(decoder) = zstd::stream::read::Decoder::with_buffer(frame) else {
        return false;
    };
    let at = raw.len();
    matches!(decoder.take(want as u64).read_to_end(raw), Ok(n) if n == want && raw.len() == at + want)
}

/// The first `want` bytes of a chunk stored as sections (codec 2) into `raw`.
fn sections_prefix(stored: &[u8], want: usize, raw: &mut Vec<u8>) -> bool {
    let mut r = crate::format::wire::Reader::new(stored);
    while raw.len() < want {
        let Some((len, body)) = next_section(&mut r) else {
            return false;
        };
        let take = len.min(want - raw.len());
        if len == body.len() {
            raw.extend_from_slice(&body[..take]);
        } else if !frame_prefix(body, take, raw) {
            return false;
        }
    }
    true
}

/// Fills `buf` as far as the input goes; returns the bytes read.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => return Ok(got),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_of_a_kind_from_a_later_version_is_skipped() {
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        w.write_chunk(ChunkKind::Meta, b"hello").unwrap();
        let unknown_at = w.into_inner().len();
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        w.write_chunk(ChunkKind::Meta, b"hello").unwrap();
        w.write_chunk(ChunkKind::Rss, b"a later kind").unwrap();
        w.write_chunk(ChunkKind::End, b"").unwrap();
        let mut file = w.into_inner();
        // Make the middle chunk one of kind 200, with its checksum to match.
        let header = unknown_at;
        file[header + 4] = 200;
        let stored_len = u32::from_le_bytes(file[header + 12..header + 16].try_into().unwrap());
        let stored = &file[header + 20..header + 20 + stored_len as usize];
        let crc = chunk_crc(&file[header + 4..header + 16], stored);
        file[header + 16..header + 20].copy_from_slice(&crc.to_le_bytes());
        let mut r = ChunkReader::new(&file[..]).unwrap();
        let kinds: Vec<ChunkKind> = std::iter::from_fn(|| r.next_chunk().map(|c| c.0)).collect();
        assert_eq!(kinds, [ChunkKind::Meta, ChunkKind::End]);
        assert!(r.damage().is_none());
        assert_eq!(r.offset(), file.len() as u64);
    }

    fn sample_file() -> Vec<u8> {
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        w.write_chunk(ChunkKind::Meta, b"hello").unwrap();
        w.write_chunk(ChunkKind::Events, &vec![7u8; 10_000])
            .unwrap();
        w.write_chunk(ChunkKind::End, b"").unwrap();
        w.into_inner()
    }

    #[test]
    fn sections_round_trip_compressed_or_not() {
        let mut raw = vec![1u8, 2, 3];
        raw.extend(std::iter::repeat_n(9u8, 5000));
        raw.extend((0..3000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
        let ends = [3, 3, 5003, raw.len()];
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        w.write_sections(ChunkKind::PackedEvents, &raw, &ends)
            .unwrap();
        assert!(w
            .write_sections(ChunkKind::PackedEvents, &raw, &[3, 2, raw.len()])
            .is_err());
        assert!(w
            .write_sections(ChunkKind::PackedEvents, &raw, &[3])
            .is_err());
        let file = w.into_inner();
        assert!(file.len() < 3000 + 200, "the run of 9s was compressed");
        let mut r = ChunkReader::new(&file[..]).unwrap();
        assert_eq!(r.next_chunk(), Some((ChunkKind::PackedEvents, raw)));
        assert_eq!(r.next_chunk(), None);
        assert!(r.damage().is_none());
    }

    /// Payloads' first bytes, from one zstd frame (codec 1) and from sections (codec 2),
    /// chunk after chunk: each prefix is the payload's own first bytes.
    #[test]
    fn prefixes_come_from_their_own_chunk_chunk_after_chunk() {
        let payload = |seed: u32, len: u32| -> Vec<u8> {
            (0..len)
                .map(|i| ((i ^ seed).wrapping_mul(2654435761) >> (13 + i % 7)) as u8)
                .collect()
        };
        let payloads: Vec<Vec<u8>> = (0..6).map(|k| payload(k, 20_000 + 7_000 * k)).collect();
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        for (k, p) in payloads.iter().enumerate() {
            if k % 2 == 0 {
                w.write_chunk(ChunkKind::Events, p).unwrap();
            } else {
                let half = p.len() / 2;
                w.write_sections(ChunkKind::PackedEvents, p, &[100, half, p.len()])
                    .unwrap();
            }
        }
        let file = w.into_inner();
        for want in [1, 99, 101, 5_000, 30_000, usize::MAX] {
            let mut r = ChunkReader::new(&file[..]).unwrap();
            let mut raw = Vec::new();
            for (k, p) in payloads.iter().enumerate() {
                let (_, whole_len) = r.next_chunk_prefix(&mut raw, |_| want).unwrap();
                assert_eq!(whole_len, p.len(), "chunk {k}");
                assert_eq!(raw, p[..want.min(p.len())], "chunk {k}, {want} bytes");
            }
            assert!(r.next_chunk_prefix(&mut raw, |_| want).is_none());
            assert!(r.damage().is_none(), "{want} bytes");
        }
    }

    /// A frame that stops short of the prefix asked for is damage, as when read whole.
    #[test]
    fn a_frame_short_of_its_prefix_is_damage() {
        let frame = zstd::bulk::compress(&[5u8; 3000], 3).unwrap();
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        // The chunk claims 4000 raw bytes; its frame holds 3000.
        w.put_chunk(ChunkKind::Events, 1, 4000, &frame).unwrap();
        let file = w.into_inner();
        let mut r = ChunkReader::new(&file[..]).unwrap();
        assert!(r.next_chunk_prefix(&mut Vec::new(), |_| 3500).is_none());
        assert!(r.damage().unwrap().reason.contains("decompress"));
    }

    #[test]
    fn sections_that_do_not_add_up_are_damage() {
        // A valid chunk whose sections claim one byte more than the chunk's raw length.
        let mut stored = crate::format::wire::Writer::new();
        stored.varint(4).varint(4);
        stored.bytes.extend_from_slice(b"abcd");
        let mut w = ChunkWriter::new(Vec::new(), 3).unwrap();
        w.put_chunk(ChunkKind::PackedEvents, 2, 3, &stored.bytes)
            .unwrap();
        let file = w.into_inner();
        let mut r = ChunkReader::new(&file[..]).unwrap();
        assert_eq!(r.next_chunk(), None);
        assert!(r.damage().unwrap().reason.contains("sections"));
    }

    #[test]
    fn event_buffers_take_their_own_level_and_the_rest_keep_theirs() {
        // Text-like bytes: zstd's level 19 finds more in them than its level 1.
        let raw: Vec<u8> = (0..60_000u32)
            .map(|i| {
                b"malloc free realloc calloc "[(i.wrapping_mul(7) % 23) as usize] ^ (i % 5) as u8
            })
            .collect();
        let stored = |w: ChunkWriter<Vec<u8>>, kinds: &[ChunkKind]| {
            let mut w = w;
            for &k in kinds {
                w.write_chunk(k, &raw).unwrap();
            }
            w.into_inner()
        };
        let events = ChunkKind::Events;
        let meta = ChunkKind::Meta;
        let all_19 = stored(ChunkWriter::new(Vec::new(), 19).unwrap(), &[events, meta]);
        let events_1 = stored(
            ChunkWriter::new(Vec::new(), 19)
                .unwrap()
                .with_events_level(1),
            &[events, meta],
        );
        let only_events_1 = stored(ChunkWriter::new(Vec::new(), 1).unwrap(), &[events]);
        let only_meta_19 = stored(ChunkWriter::new(Vec::new(), 19).unwrap(), &[meta]);
        // The events chunk at level 1, the meta chunk after it back at 19.
        assert_eq!(
            events_1.len(),
            only_events_1.len() + only_meta_19.len() - FILE_HEADER_BYTES as usize
        );
        assert!(events_1.len() > all_19.len());
        let mut r = ChunkReader::new(&events_1[..]).unwrap();
        assert_eq!(r.next_chunk(), Some((events, raw.clone())));
        assert_eq!(r.next_chunk(), Some((meta, raw.clone())));
        assert!(r.damage().is_none());
        // Packed event buffers (in sections) take the events' level too.
        let sections = |w: ChunkWriter<Vec<u8>>| {
            let mut w = w;
            let ends = [raw.len() / 3, raw.len()];
            w.write_sections(ChunkKind::PackedEvents, &raw, &ends)
                .unwrap();
            w.into_inner()
        };
        let packed_1 = sections(
            ChunkWriter::new(Vec::new(), 19)
                .unwrap()
                .with_events_level(1),
        );
        assert_eq!(
            packed_1.len(),
            sections(ChunkWriter::new(Vec::new(), 1).unwrap()).len()
        );
        assert!(packed_1.len() > sections(ChunkWriter::new(Vec::new(), 19).unwrap()).len());
    }

    #[test]
    fn chunks_round_trip_with_and_without_compression() {
        let file = sample_file();
        let mut r = ChunkReader::new(&file[..]).unwrap();
        assert_eq!(r.next_chunk(), Some((ChunkKind::Meta, b"hello".to_vec())));
        assert_eq!(r.next_chunk(), Some((ChunkKind::Events, vec![7u8; 10_000])));
        assert_eq!(r.next_chunk(), Some((ChunkKind::End, vec![])));
        assert_eq!(r.next_chunk(), None);
        assert!(r.damage().is_none());
        assert!(file.len() < 1000, "the repetitive chunk was compressed");
    }

    #[test]
    fn a_file_cut_anywhere_reads_up_to_its_last_whole_chunk() {
        let file = sample_file();
        let boundaries = [16usize, 16 + 20 + 5, file.len() - 20];
        for cut in 16..file.len() {
            let mut r = ChunkReader::new(&file[..cut]).unwrap();
            let mut n = 0;
            while r.next_chunk().is_some() {
                n += 1;
            }
            let whole = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
            assert_eq!(n, whole, "cut at {cut}");
            // A cut between chunks looks like a clean end; the missing End chunk tells.
            assert_eq!(
                r.damage().is_some(),
                !boundaries.contains(&cut),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_flipped_bit_is_reported_not_returned() {
        let mut file = sample_file();
        let at = file.len() - 30;
        file[at] ^= 0x10;
        let mut r = ChunkReader::new(&file[..]).unwrap();
        assert!(r.next_chunk().is_some());
        assert!(r.next_chunk().is_none());
        assert!(r.damage().unwrap().reason.contains("checksum"));
    }

    #[test]
    fn other_files_are_refused_with_a_reason() {
        assert!(matches!(
            ChunkReader::new(&b"short"[..]),
            Err(TraceError::NotATrace(_))
        ));
        assert!(matches!(
            ChunkReader::new(&b"PK\x03\x04 not a trace at all"[..]),
            Err(TraceError::NotATrace(_))
        ));
    }
}
