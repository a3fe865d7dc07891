//! A reader for GHC's binary RTS eventlog (`+RTS -l`), for the memory side of a Haskell
//! program: heap size, live data, blocks in use, per-collection GC statistics and heap
//! profile censuses (`-hT` closure types and the other breakdowns), with their timestamps.
//!
//! The format is big-endian: a header declaring each event type with its payload size
//! (fixed, or variable with a u16 length per event), then events (u16 type, u64
//! nanoseconds, payload), grouped in per-capability blocks, and a 0xffff terminator.
//! Unknown event types are skipped by their declared size, and fields a newer RTS appends
//! to a known event are ignored, so logs from GHC 8.x to 9.x read alike; BLOCKS_SIZE and
//! MEM_RETURN appear from GHC 9.2 on.
//!
//! [`Eventlog::parse`] reads a whole log; [`EventReader`] streams events from any
//! `Read`. A log cut short (a killed program) reads up to its last whole event and says
//! it was truncated; bytes that contradict the format give an [`Error`] with the offset.
//!
//! ```no_run
//! use fragscope_ghc::{Eventlog, EventKind};
//! let bytes = std::fs::read("prog.eventlog")?;
//! let log = Eventlog::parse(&bytes)?;
//! for event in &log.events {
//!     if let EventKind::HeapLive { bytes, .. } = event.kind {
//!         println!("{} ns: {bytes} bytes live", event.time_ns);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod event;
mod eventlog;
mod header;
mod heap_profile;
mod reader;
mod source;

pub use error::Error;
pub use event::{tags, CostCentre, Event, EventKind, GcStats, HeapInfo, HeapProfBreakdown};
pub use eventlog::Eventlog;
pub use header::{EventType, Header, PayloadSize};
pub use heap_profile::{HeapProfile, HeapSample, HeapSampleEntry, LabelId};
pub use reader::{End, EventReader};
