//! A Node.js process's V8 heap at a snapshot, as V8 counts it (chunk 27: each isolate's
//! `v8.getHeapSpaceStatistics()` summed): the physical pages of its spaces split into
//! objects and free space, space by space, with the headline in V8's and Node's terms.
//! V8 maps its heap's pages itself, never through malloc: without this census they are
//! "other anonymous". Its figures are V8's, not read from the pages: `physical` is what
//! V8 has committed and touched, which the kernel counts as resident.

use fragscope_trace::v8_heap::V8Heap;
use serde::Serialize;

/// One space of the heap.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct V8SpaceView {
    pub space: String,
    pub size: u64,
    pub used: u64,
    pub available: u64,
    pub physical: u64,
}

/// The split of a V8 heap at one snapshot: `objects + free == physical`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct V8Parts {
    /// Node's release ("v20.20.2"), and the isolates summed (main thread and workers).
    pub node: String,
    pub isolates: u32,
    /// How old the figures were when the snapshot took them, in ms.
    pub age_ms: u64,
    /// Committed bytes of the spaces (`space_size`), and their physical pages.
    pub committed: u64,
    pub physical: u64,
    /// Bytes of objects, at most the physical bytes of their space.
    pub objects: u64,
    /// Physical bytes of the spaces that no object holds.
    pub free: u64,
    /// The largest free space of the heap, by space.
    pub spaces: Vec<V8SpaceView>,
    /// `v8.getHeapStatistics()`: the old generation's limit (--max-old-space-size),
    /// memory held outside the heap by objects in it (ArrayBuffers' backing stores: malloc's,
    /// within the traced heap), and V8's own malloc'd memory.
    pub heap_size_limit: u64,
    pub external_memory: u64,
    pub malloced_memory: u64,
}

impl V8Parts {
    pub fn waste(&self) -> u64 {
        self.free
    }
}

/// `heap` as the report shows it.
pub fn split(heap: &V8Heap) -> V8Parts {
    let mut p = V8Parts {
        node: heap.node.clone(),
        isolates: heap.isolates,
        age_ms: heap.age_ms,
        committed: 0,
        physical: 0,
        objects: 0,
        free: 0,
        spaces: Vec::new(),
        heap_size_limit: heap.figure("heap_size_limit"),
        external_memory: heap.figure("external_memory"),
        malloced_memory: heap.figure("malloced_memory"),
    };
    for s in &heap.spaces {
        let objects = s.used.min(s.physical);
        p.committed += s.size;
        p.physical += s.physical;
        p.objects += objects;
        p.free += s.physical - objects;
        p.spaces.push(V8SpaceView {
            space: s.name.clone(),
            size: s.size,
            used: s.used,
            available: s.available,
            physical: s.physical,
        });
    }
    p.spaces
        .sort_by_key(|s| std::cmp::Reverse(s.physical - s.used.min(s.physical)));
    p
}

/// What the census with the most waste says, when it is worth a headline (at least
/// 4 MiB and a quarter of the heap's physical bytes), in V8's and Node's terms.
pub fn headline(p: &V8Parts) -> Option<(&'static str, String)> {
    if p.free < 4 << 20 || p.free * 4 < p.physical {
        return None;
    }
    let top = p.spaces.first()?;
    let top_free = top.physical - top.used.min(top.physical);
    let held = format!(
        "{} of V8 heap (Node {}) hold {} of objects ({}%)",
        crate::mib(p.physical),
        p.node,
        crate::mib(p.objects),
        100 * p.objects / p.physical.max(1)
    );
    let (part, advice) = match top.space.as_str() {
        "new_space" | "new_large_object_space" => (
            "v8_new_space_free",
            "the young generation's semi-spaces, sized for allocation speed and kept at \
             their size between scavenges: --max-semi-space-size (MiB) bounds them"
                .to_string(),
        ),
        _ => (
            "v8_old_space_free",
            format!(
                "pages V8 keeps after its collections freed their objects: it gives pages back \
                 when a mark-compact finds them empty and compacts only the most fragmented \
                 ones, so a few survivors per page keep them; --max-old-space-size \
                 (now {}) makes it collect sooner, and a heap that grew for a burst \
                 shrinks only as later collections find its pages empty",
                crate::mib(p.heap_size_limit)
            ),
        ),
    };
    Some((
        part,
        format!(
            "{held}: {} is free space in its spaces, {} of it in {}: {advice}.",
            crate::mib(p.free),
            crate::mib(top_free),
            top.space
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::v8_heap::V8Space;

    #[test]
    fn spaces_split_into_objects_and_free_space() {
        let mib = 1u64 << 20;
        let space = |name: &str, size, used, physical| V8Space {
            name: name.into(),
            size,
            used,
            available: size - used,
            physical,
        };
        let heap = V8Heap {
            node: "v20.20.2".into(),
            isolates: 1,
            age_ms: 12,
            spaces: vec![
                space("new_space", 16 * mib, 2 * mib, 16 * mib),
                space("old_space", 120 * mib, 30 * mib, 118 * mib),
                // More used than physical: V8 counts a large object's whole size.
                space("large_object_space", 4 * mib, 4 * mib, 3 * mib),
            ],
            figures: vec![("heap_size_limit".into(), 4096 * mib)],
        };
        let p = split(&heap);
        assert_eq!(p.physical, 137 * mib);
        assert_eq!(p.objects, 35 * mib);
        assert_eq!(p.objects + p.free, p.physical);
        assert_eq!(p.spaces[0].space, "old_space");
        let (part, sentence) = headline(&p).unwrap();
        assert_eq!(part, "v8_old_space_free");
        assert!(sentence.contains("88 MiB of it in old_space"), "{sentence}");
    }
}
