//! A process whose program links its own allocator (a Rust service on
//! tikv-jemallocator or the mimalloc crate, a C program linked with a static jemalloc):
//! the allocations that copy serves never reach the interposer, so the memory they hold
//! is "other anonymous" and the traced heap is a small part of the story. The report says
//! so first instead of explaining the small part.

use serde::Serialize;

use fragscope_trace::heap_census::LinkedAllocator;

use crate::report::{Headline, Snapshot};

/// The linked allocator, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkedAllocatorFacts {
    /// "jemalloc", "tcmalloc" or "mimalloc".
    pub allocator: String,
    /// The image that carries it.
    pub image: String,
    /// What gave it away: a symbol, or a message of a stripped image.
    pub evidence: String,
    /// The image defines malloc: every malloc call of the process goes to it.
    pub serves_malloc: bool,
}

pub fn facts(l: &LinkedAllocator) -> LinkedAllocatorFacts {
    LinkedAllocatorFacts {
        allocator: l.allocator.clone(),
        image: l.image.clone(),
        evidence: l.evidence.clone(),
        serves_malloc: l.serves_malloc,
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The headline of a process with a linked allocator. When memory outside the traced
/// heap is most of RSS at the largest snapshot (or no snapshot measured it), the sentence
/// is about the allocator the trace cannot see; else a clause is added to the one found.
pub fn headline(h: &mut Headline, l: &LinkedAllocator, snapshots: &[Snapshot]) {
    let file = file_name(&l.image);
    let largest = snapshots
        .iter()
        .filter(|s| s.rss_measured)
        .max_by_key(|s| s.parts.rss);
    let unseen = largest.map(|s| (s.t_ms, s.parts.other_anon, s.parts.rss));
    let dominated = unseen.is_none_or(|(_, other, rss)| other * 2 >= rss);
    if !dominated {
        let (_, other, _) = unseen.unwrap_or_default();
        h.sentence = format!(
            "{} Beside the traced heap, a {} linked into {file} serves allocations the \
             trace does not hold ({} of other anonymous memory at the largest snapshot).",
            h.sentence,
            l.allocator,
            crate::mib(other)
        );
        return;
    }
    let missed = if l.serves_malloc {
        "it defines malloc, so every malloc call of the process goes to it and the trace \
         holds none"
    } else {
        "the allocations it serves are not calls to the C library's malloc (those are \
         traced, and are few)"
    };
    let share = match unseen {
        Some((t_ms, other, rss)) => format!(
            ": at {:.2} s, {} of its {} of RSS ({}%) is memory the trace cannot split, \
             shown as other anonymous",
            t_ms / 1000.0,
            crate::mib(other),
            crate::mib(rss),
            100 * other / rss.max(1)
        ),
        None => String::new(),
    };
    h.sentence = format!(
        "{file} allocates through a {} linked into it ({}), which fragscope's interposer \
         does not see: {missed}{share}. To see its heap, record a build on the system \
         allocator (without the allocator crate's #[global_allocator], or linked without \
         the static library), and weigh allocators on that build with `fragscope compare \
         --allocators glibc,jemalloc,mimalloc`.",
        l.allocator, l.evidence
    );
    h.heap = None;
    h.dominant = Some("other_anon".into());
}
