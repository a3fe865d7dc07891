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
pub mod ghc;
pub mod ghc_blocks;
pub mod heap;
pub mod phases;
pub mod replay;
pub mod report;
pub mod symbols;

pub use analyze::{analyze, AnalysisError, Options};
pub use report::Report;
