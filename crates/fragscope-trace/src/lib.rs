//! fragscope's trace format, shared by the recorder (writer) and every analysis (reader).
//!
//! A trace is a file header and a sequence of checksummed, zstd-compressed chunks
//! ([`chunk`]). Chunks carry process starts and ends, memory maps, RSS samples,
//! smaps_rollup readings, page-residency snapshots ([`records`]) and the event records
//! of each thread ([`event`]). [`reader::TraceReader`] turns a file back into typed
//! chunks; [`merge`] orders one process's threads into a single event sequence.
//! The byte-level description is docs/trace-format.md.

pub mod ahead;
pub mod call;
pub mod chunk;
mod columns;
pub mod event;
pub mod hash;
pub mod heap_census;
pub mod live;
pub mod merge;
pub mod pack;
pub mod reader;
pub mod records;
pub mod runtime_samples;
pub mod sbcl_heap;
mod spill;
pub mod stream_decoder;
pub mod summary;
pub mod wire;

/// The tests' pseudo-random numbers (xorshift64): the next value of `x`, which must not
/// be 0.
#[cfg(test)]
pub(crate) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

pub use chunk::{ChunkKind, ChunkReader, ChunkWriter, Damage};
pub use event::{ChunkDecoder, Func, Record, StatsSource, StreamTables};
pub use pack::{PackedBuffer, Packer};
pub use reader::{Chunk, Skipped, TraceReader};
pub use records::*;

/// Why a trace could not be read (or read further).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("not a fragscope trace: {0}")]
    NotATrace(String),
    #[error("malformed record: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
