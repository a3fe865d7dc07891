//! fragscope's recorder: starts a program with the interposer preloaded, receives its
//! event buffers over a Unix socket, samples /proc, and writes the trace.
//!
//! Threads of a recording:
//! - one per traced process connection ([`session`]): turns messages into chunks;
//! - the ticker: advances the shared clock page every millisecond;
//! - the sampler: RSS every 10 ms, smaps_rollup every 100 ms, page-residency snapshots;
//! - the writer: compresses chunks and appends them to the trace file;
//! - the caller's thread: waits for the program and its descendants.

// Each module uses only those below it, never one beside or above it: `session` (record)
// and `snapshot` at the top; `attach` (record -p) and `fork_copy` (snapshot's copy), both
// made of `remote_call`; `launch` above `preload` above `mounts`; `census` above `ghc`;
// `output`, `access`, `procfs`, `clock`, `protocol` at the bottom.
mod access;
pub mod attach;
mod census;
mod clock;
pub mod fork_copy;
pub mod ghc;
mod launch;
mod mounts;
mod output;
pub mod preload;
pub mod procfs;
mod protocol;
mod remote_call;
mod session;
mod snapshot;

pub use launch::{check_traceable, NotTraceable};
pub use output::create_output;
pub use session::{record, AttachOptions, PackMode, RecordOptions, RecordOutcome, SilentProcess};
pub use snapshot::{snapshot, ForkCopy, SnapshotOptions, SnapshotOutcome, FORK_COPY_FROM};
