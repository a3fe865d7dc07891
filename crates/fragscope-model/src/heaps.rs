//! The heaps a snapshot can know, in one list: malloc's (from the merged calls or a
//! census) and the runtime heaps malloc never sees (pymalloc's arenas, SBCL's dynamic
//! space, Go's heap, a JVM's Java heap, Node's V8 heap). The focus snapshot, the headline and the "most waste" line weigh every heap
//! through [`Heap::ALL`]; a heap fragscope learns is one more entry there.

use serde::Serialize;

use crate::report::Snapshot;

/// A heap whose figures a snapshot may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Heap {
    Malloc,
    Pymalloc,
    Sbcl,
    Go,
    Jvm,
    V8,
}

impl Heap {
    pub const ALL: [Heap; 6] = [
        Heap::Malloc,
        Heap::Pymalloc,
        Heap::Sbcl,
        Heap::Go,
        Heap::Jvm,
        Heap::V8,
    ];

    /// How the text names it.
    pub fn name(self) -> &'static str {
        match self {
            Heap::Malloc => "malloc heap",
            Heap::Pymalloc => "pymalloc arenas",
            Heap::Sbcl => "SBCL dynamic space",
            Heap::Go => "Go heap",
            Heap::Jvm => "Java heap",
            Heap::V8 => "V8 heap",
        }
    }

    /// A heap known only from a census taken with the snapshot: a snapshot without that
    /// census does not know it (its pages are then within other anonymous memory).
    /// malloc's is known from the calls (a `fragscope snapshot` reads it by census too,
    /// and marks it unknown when that fails: `Decomposition::malloc_unknown`).
    pub fn needs_census(self) -> bool {
        !matches!(self, Heap::Malloc)
    }

    /// Its figures at a snapshot; `None` when the snapshot has no census of it.
    pub fn figures(self, s: &Snapshot) -> Option<HeapFigures> {
        let (resident, live, waste) = match self {
            Heap::Malloc if s.parts.malloc_unknown => return None,
            Heap::Malloc => {
                let d = &s.parts;
                (d.live + d.heap_waste(), d.live, d.heap_waste())
            }
            Heap::Pymalloc => s
                .pymalloc
                .as_ref()
                .map(|p| (p.resident, p.in_use, p.waste()))?,
            Heap::Sbcl => s.sbcl.as_ref().map(|p| (p.resident, p.in_use, p.waste()))?,
            Heap::Go => s.go.as_ref().map(|p| (p.resident, p.live(), p.waste()))?,
            Heap::Jvm => s.jvm.as_ref().map(|p| (p.resident, p.objects, p.waste()))?,
            Heap::V8 => s.v8.as_ref().map(|p| (p.physical, p.objects, p.waste()))?,
        };
        Some(HeapFigures {
            heap: self,
            resident,
            live,
            waste,
        })
    }
}

/// One heap at one snapshot: `resident` = `live` + `waste`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeapFigures {
    pub heap: Heap,
    pub resident: u64,
    pub live: u64,
    pub waste: u64,
}

/// Every heap a snapshot has figures for (malloc's always, zero for a program that never
/// called it, unless a snapshot's census could not read it).
pub fn at(s: &Snapshot) -> Vec<HeapFigures> {
    Heap::ALL.iter().filter_map(|h| h.figures(s)).collect()
}

/// The runtime heaps some snapshot of the process has a census of: the heaps the
/// process runs. A snapshot lacking one of them is not a full picture of its memory.
pub fn runtimes_seen(snapshots: &[Snapshot]) -> Vec<Heap> {
    Heap::ALL
        .into_iter()
        .filter(|h| h.needs_census())
        .filter(|h| snapshots.iter().any(|s| h.figures(s).is_some()))
        .collect()
}

/// Live bytes of every heap the snapshot knows.
pub fn live(s: &Snapshot) -> u64 {
    s.heaps.iter().map(|h| h.live).sum()
}

/// Waste of every heap the snapshot knows.
pub fn waste(s: &Snapshot) -> u64 {
    s.heaps.iter().map(|h| h.waste).sum()
}

/// Resident bytes of every heap the snapshot knows.
pub fn resident(s: &Snapshot) -> u64 {
    s.heaps.iter().map(|h| h.resident).sum()
}

/// The heap with the most waste at the snapshot (malloc's on a tie).
pub fn most_wasteful(s: &Snapshot) -> Option<&HeapFigures> {
    s.heaps.iter().rev().max_by_key(|h| h.waste)
}
