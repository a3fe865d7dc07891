//! fragscope's trace format, shared by the recorder (writer) and every analysis (reader).
//!
//! A trace is a file header and a sequence of checksummed, zstd-compressed chunks
//! ([`chunk`]). Chunks carry process starts and ends, memory maps, RSS samples,
//! smaps_rollup readings, page-residency snapshots ([`records`]) and the event records
//! of each thread ([`event`]). [`reader::TraceReader`] turns a file back into typed
//! chunks; [`merge`] orders one process's threads into a single event sequence.
//! The byte-level description is docs/trace-format.md.
//!
//! Two layers, each a directory; an arrow means "uses", and `order/` uses `format/`, never
//! the reverse:
//!
//! ```text
//!   order/    ahead ──> merge ──> stream_decoder, spill ──> call
//!                         └─────> live
//!   ─────────────────────────────────────────────────────────────────────────────
//!   format/   summary ──> reader ──> chunk, records, heap_census, runtime_samples,
//!                                    sbcl_heap, go_heap, jvm_heap, v8_heap ──> wire
//!             pack ──> event ──> event/tables ──> hash;   event ──> columns ──> wire
//! ```
//!
//! Their modules are re-exported here under their own names (`fragscope_trace::merge`,
//! `fragscope_trace::records`, ...): the layers are a rule of the source, not of the
//! paths users write.

mod format;
mod order;

pub use format::{
    chunk, contents, event, go_heap, hash, heap_census, jvm_heap, pack, reader, records,
    runtime_samples, sbcl_heap, summary, v8_heap, wire, TraceError,
};
pub use order::{aggregate, ahead, call, live, merge, stream_decoder};

pub use chunk::{ChunkKind, ChunkReader, ChunkWriter, Damage};
pub use contents::{StreamContents, TraceContents};
pub use event::{ChunkDecoder, Func, Record, StatsSource, StreamTables};
pub use pack::{PackedBuffer, Packer};
pub use reader::{Chunk, Skipped, TraceReader};
pub use records::*;

/// The tests' pseudo-random numbers (xorshift64): the next value of `x`, which must not
/// be 0.
#[cfg(test)]
pub(crate) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
