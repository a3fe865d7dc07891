//! The lower layer: the trace format and reading a chunk stream. Framing ([`chunk`]),
//! payloads ([`records`], [`heap_census`], [`runtime_samples`], [`sbcl_heap`], [`go_heap`], [`jvm_heap`], [`v8_heap`]), a
//! thread buffer's event records ([`event`]) and their packed form ([`pack`], on
//! [`columns`]), typed chunks from a file ([`reader`]), what a trace holds without decoding its
//! calls ([`contents`]) and a summary ([`summary`]).
//! Nothing here orders calls or depends on `crate::order`, so the recorder writes
//! and a reader reads traces without the merge.

pub mod chunk;
mod columns;
pub mod contents;
pub mod event;
pub mod go_heap;
pub mod hash;
pub mod heap_census;
pub mod jvm_heap;
pub mod pack;
pub mod reader;
pub mod records;
pub mod runtime_samples;
pub mod sbcl_heap;
pub mod summary;
pub mod v8_heap;
pub mod wire;

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
