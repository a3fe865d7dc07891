//! fragscope's recorder: starts a program with the interposer preloaded, receives its
//! event buffers over a Unix socket, samples /proc, and writes the trace.
//!
//! Threads of a recording:
//! - one per traced process connection ([`session`]): turns messages into chunks;
//! - the ticker: advances the shared clock page every millisecond;
//! - the sampler: RSS every 10 ms, smaps_rollup every 100 ms, page-residency snapshots;
//! - the writer: compresses chunks and appends them to the trace file;
//! - the caller's thread: waits for the program and its descendants.

pub mod attach;
mod census;
mod clock;
pub mod ghc;
mod launch;
pub mod preload;
pub mod procfs;
mod protocol;
mod session;
mod snapshot;

pub use launch::{check_traceable, NotTraceable};
pub use session::{record, AttachOptions, PackMode, RecordOptions, RecordOutcome, SilentProcess};
pub use snapshot::{snapshot, ForkCopy, SnapshotOptions, SnapshotOutcome, FORK_COPY_FROM};
