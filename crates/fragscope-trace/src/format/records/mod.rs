//! Payloads of the chunks other than events (docs/trace-format.md, "Chunk payloads").
//! Each type encodes and decodes itself field by field, in the documented order.
//! By what they describe: the trace and each process's life ([`process`]), what /proc
//! said of its memory ([`memory`]), and runtimes' heap censuses ([`census`]); all are
//! named from here.

mod census;
mod memory;
mod process;

pub use census::*;
pub use memory::*;
pub use process::*;

#[cfg(test)]
mod tests;
