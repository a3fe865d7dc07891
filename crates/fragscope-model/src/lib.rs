//! fragscope's model: from a trace to where every resident byte goes.
//!
//! [`analyze`] reads a trace once, merges each process's calls, evaluates the heap at
//! every page-residency snapshot ([`heap`]), finds phases ([`phases`]), symbolizes the
//! allocation sites that matter ([`symbols`]) and returns a [`report::Report`]: plain
//! data, with no knowledge of terminals or HTML. A GHC program's eventlog has its own
//! model, [`ghc`], on the same parts.

pub mod analyze;
pub mod calls;
pub mod census;
pub mod compare;
pub mod forks;
pub mod ghc;
pub mod ghc_blocks;
pub mod golang;
pub mod heap;
pub mod heap_pages;
pub mod heaps;
pub mod jvm;
pub mod linked_allocator;
pub mod lisp_sites;
pub mod phases;
pub mod pymalloc;
pub mod python_sites;
pub mod replay;
pub mod report;
pub mod sbcl;
pub mod sharing;
pub mod symbols;
pub mod v8;

pub use analyze::{analyze, AnalysisError, At, Options};
pub use report::Report;

/// Bytes in MiB for a sentence of the model ("138 MiB", "4.2 MiB").
pub(crate) fn mib(bytes: u64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    if m >= 10.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}
