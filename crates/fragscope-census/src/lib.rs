//! The census room: reads a running process's heap metadata from outside it, through
//! /proc/PID/maps and /proc/PID/mem, while the process is held stopped. The program is
//! not changed and links nothing of ours; the figures are the runtime's own bookkeeping.
//!
//! [`ProcessMemory`] reads another process's memory, [`Pause`] holds it stopped for a
//! consistent view, [`Symbols`] finds a runtime's variables in its executable (load bias
//! included). A runtime's census is built on those three: `ghc` (the GHC RTS's block
//! descriptors), `pymalloc` (CPython's pool headers), `glibc` (malloc's arenas),
//! `sbcl` (SBCL's gencgc page table and heap objects), `golang` (the Go runtime's
//! spans, its layouts from the program's DWARF or a table per release) and `jvm` (a HotSpot JVM's regions or
//! spaces, its layouts from the tables libjvm.so exports for debuggers); `tcmalloc` and `jemalloc` read those
//! allocators' metadata, found by its shape in their library's data; `mimalloc` reads
//! mimalloc's pages (2.x: in segments found through its arenas and segment map; 3.x: found
//! through its heaps' maps of their pages in its arenas). `allocators` names
//! the allocator a process really uses, a copy linked into the program included.

pub mod allocators;
pub mod ghc;
pub mod glibc;
pub mod golang;
pub mod image;
pub mod jemalloc;
pub mod jvm;
pub mod jvm_attach;
mod library;
mod maps;
mod memory;
pub mod mimalloc;
mod pause;
pub mod pymalloc;
mod residency;
pub mod sbcl;
mod symbols;
pub mod tcmalloc;
pub mod v8_inspector;

pub use memory::ProcessMemory;
pub use pause::Pause;
pub use symbols::Symbols;
