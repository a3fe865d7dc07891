//! A Go program's heap at a snapshot: its runtime's spans (fragscope-census's `golang`,
//! chunk 25) split by the snapshot's residency into objects, free slots of spans in use,
//! free pages kept and stacks; with the runtime's own figures as runtime.MemStats names
//! them, spans by fill, the size classes, and the headline in Go's terms.

use fragscope_trace::go_heap::{GoHeap, GoSpanKind};
use fragscope_trace::records::Pagemap;
use serde::Serialize;

use crate::heap::Residency;
use crate::pymalloc::{add_to, fill_buckets, fill_words, FillBucket};

/// A span at most this full (in slots) is sparse: a few survivors keep it from the heap.
const SPARSE_PCT: u64 = 25;

/// One size class of Go's heap (class 0: large objects, a span each).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoClass {
    pub class: u8,
    /// Bytes of a slot (for large objects: of the largest).
    pub slot_bytes: u64,
    pub spans: u64,
    pub span_bytes: u64,
    pub slots: u64,
    pub in_use: u64,
    pub in_use_bytes: u64,
}

impl GoClass {
    /// Bytes of its spans that no object holds.
    pub fn free_bytes(&self) -> u64 {
        self.span_bytes - self.in_use_bytes
    }
}

/// The split of a Go heap's resident bytes at one snapshot: `objects + free_slots +
/// idle_kept + stacks == resident`. The `heap_*` and `stack_in_use` figures are the
/// runtime's own (runtime.MemStats' HeapAlloc, HeapInuse, HeapIdle, StackInuse), resident
/// or not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoParts {
    /// The runtime, as "go1.26.8".
    pub go: String,
    pub heap_alloc: u64,
    pub heap_in_use: u64,
    pub heap_idle: u64,
    pub stack_in_use: u64,
    /// Resident bytes of the heap's address ranges.
    pub resident: u64,
    /// Resident bytes of allocated slots: the objects, at their size class's size.
    pub objects: u64,
    /// Resident bytes of spans in use that no object holds: freed slots, slots never
    /// handed out, and each span's tail.
    pub free_slots: u64,
    /// Resident free pages: kept by the runtime, not yet released by the scavenger.
    pub idle_kept: u64,
    /// Free pages released to the kernel (not resident: not in RSS).
    pub released: u64,
    /// Resident bytes of goroutine stacks' spans.
    pub stacks: u64,
    pub spans_in_use: u64,
    /// Spans of small objects at most a quarter full, and the bytes of their pages and of
    /// their objects.
    pub sparse_spans: u64,
    pub sparse_span_bytes: u64,
    pub sparse_objects: u64,
    /// Spans not swept since the last collection: their allocated slots still count the
    /// objects that collection found dead (as HeapAlloc does).
    pub unswept_spans: u64,
    /// Spans of small objects by the share of their slots in use: 0-10%, ..., 90-100%.
    pub span_fill: Vec<FillBucket>,
    /// Size classes by bytes free in their spans, most first.
    pub classes: Vec<GoClass>,
    pub pause_ms: f64,
}

impl GoParts {
    /// Resident bytes of the heap that hold no object.
    pub fn waste(&self) -> u64 {
        self.free_slots + self.idle_kept
    }

    /// Bytes in use: the objects and the goroutine stacks.
    pub fn live(&self) -> u64 {
        self.objects + self.stacks
    }
}

/// Resident bytes of [lo, hi) as `res` shows them.
fn resident_bytes(res: &mut Residency, os_page: u64, lo: u64, hi: u64) -> u64 {
    (lo / os_page..hi.div_ceil(os_page))
        .filter(|&p| res.is_resident(p).is_some())
        .count() as u64
        * os_page
}

/// `heap` split by the residency of its snapshot.
pub fn split(heap: &GoHeap, pm: &Pagemap) -> GoParts {
    let os_page = u64::from(pm.page_size.max(1));
    let go_page = u64::from(heap.page_size);
    let mut res = Residency::new(pm);
    let resident: u64 = (heap.ranges.iter())
        .map(|&(lo, hi)| resident_bytes(&mut res, os_page, lo, hi))
        .sum();
    let mut p = GoParts {
        go: heap.go.clone(),
        heap_alloc: 0,
        heap_in_use: 0,
        heap_idle: 0,
        stack_in_use: 0,
        resident,
        objects: 0,
        free_slots: 0,
        idle_kept: 0,
        released: 0,
        stacks: 0,
        spans_in_use: 0,
        sparse_spans: 0,
        sparse_span_bytes: 0,
        sparse_objects: 0,
        unswept_spans: 0,
        span_fill: fill_buckets(),
        classes: Vec::new(),
        pause_ms: heap.pause_us as f64 / 1000.0,
    };
    let mut classes: std::collections::BTreeMap<u8, GoClass> = Default::default();
    let mut in_spans = 0;
    for s in &heap.spans {
        let bytes = s.bytes(go_page);
        let span_resident = resident_bytes(&mut res, os_page, s.start, s.start + bytes);
        in_spans += span_resident;
        match s.kind {
            GoSpanKind::Stacks => {
                p.stack_in_use += bytes;
                p.stacks += span_resident;
            }
            GoSpanKind::Objects => {
                let in_use = s.in_use_bytes();
                p.heap_alloc += in_use;
                p.heap_in_use += bytes;
                p.spans_in_use += 1;
                p.unswept_spans += u64::from(s.unswept);
                let objects = in_use.min(span_resident);
                p.objects += objects;
                p.free_slots += span_resident - objects;
                let c = classes.entry(s.class).or_insert(GoClass {
                    class: s.class,
                    slot_bytes: 0,
                    spans: 0,
                    span_bytes: 0,
                    slots: 0,
                    in_use: 0,
                    in_use_bytes: 0,
                });
                c.slot_bytes = c.slot_bytes.max(s.slot_bytes);
                c.spans += 1;
                c.span_bytes += bytes;
                c.slots += u64::from(s.slots);
                c.in_use += u64::from(s.in_use);
                c.in_use_bytes += in_use;
                if s.class != 0 {
                    let capacity = u64::from(s.slots) * s.slot_bytes;
                    add_to(&mut p.span_fill, in_use, capacity);
                    if u64::from(s.in_use) * 100 <= u64::from(s.slots) * SPARSE_PCT {
                        p.sparse_spans += 1;
                        p.sparse_span_bytes += span_resident;
                        p.sparse_objects += objects;
                    }
                }
            }
        }
    }
    p.heap_idle = heap.range_bytes() - p.heap_in_use - p.stack_in_use;
    p.idle_kept = resident.saturating_sub(in_spans);
    p.released = p.heap_idle.saturating_sub(p.idle_kept);
    p.resident = p.objects + p.free_slots + p.idle_kept + p.stacks;
    let mut classes: Vec<GoClass> = classes.into_values().collect();
    classes.sort_by_key(|c| std::cmp::Reverse(c.free_bytes()));
    p.classes = classes;
    p
}

/// What the census with the most waste says, when it is worth a headline (at least
/// 4 MiB and a quarter of the heap's resident bytes): the dominant part and a sentence
/// with what helps, in Go's terms.
pub fn headline(p: &GoParts) -> Option<(&'static str, String)> {
    if p.waste() < 4 << 20 || p.waste() * 4 < p.resident {
        return None;
    }
    let held = format!(
        "{} of Go heap ({}) hold {} of objects ({}%)",
        crate::mib(p.resident),
        p.go,
        crate::mib(p.objects),
        100 * p.objects / p.resident.max(1)
    );
    if p.free_slots >= p.idle_kept {
        let sparse = if p.sparse_spans > 0 {
            format!(
                "; {} spans at most {SPARSE_PCT}% full take {} for {} of objects",
                p.sparse_spans,
                crate::mib(p.sparse_span_bytes),
                crate::mib(p.sparse_objects)
            )
        } else {
            String::new()
        };
        Some((
            "go_free_slots",
            format!(
                "{held}: {} is free slots in spans that still hold a live object ({} spans \
                 in use, most {}{sparse}). Go's collector does not move objects: a span \
                 goes back to the heap only when all its objects are dead, so the few that \
                 survive among many short-lived ones of their size class pin it. Keep \
                 long-lived data apart from the garbage made with it (build what you keep \
                 in one pass, or copy the survivors into a fresh slice or map), or hold \
                 many small records in fewer objects (a slice of values rather than of \
                 pointers). GOGC and GOMEMLIMIT change when the heap is collected, not \
                 this.",
                crate::mib(p.free_slots),
                p.spans_in_use,
                fill_words(&p.span_fill),
            ),
        ))
    } else {
        Some((
            "go_idle_kept",
            format!(
                "{held}: {} is free pages the runtime keeps resident ({} more were \
                 released). The background scavenger returns free pages to the kernel \
                 gradually, keeping about what the next collection's goal (GOGC) needs; \
                 a GOMEMLIMIT near the memory you can spare makes it return them sooner, \
                 and debug.FreeOSMemory() returns them at once.",
                crate::mib(p.idle_kept),
                crate::mib(p.released)
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::go_heap::GoSpan;
    use fragscope_trace::records::{ResidentRange, SnapshotReason};

    fn span(start: u64, pages: u64, kind: GoSpanKind, in_use: u32) -> GoSpan {
        GoSpan {
            start,
            pages,
            kind,
            class: if kind == GoSpanKind::Objects { 5 } else { 0 },
            noscan: false,
            slots: if kind == GoSpanKind::Objects { 128 } else { 0 },
            in_use,
            slot_bytes: if kind == GoSpanKind::Objects { 64 } else { 0 },
            unswept: false,
        }
    }

    #[test]
    fn resident_pages_split_into_objects_free_slots_idle_and_stacks() {
        let base = 0xc000000000u64;
        let heap = GoHeap {
            go: "go1.26.8".into(),
            page_size: 8192,
            ranges: vec![(base, base + 64 * 8192)],
            spans: vec![
                span(base, 1, GoSpanKind::Objects, 13),
                span(base + 8192, 1, GoSpanKind::Objects, 128),
                span(base + 2 * 8192, 4, GoSpanKind::Stacks, 0),
            ],
            pages_in_use: 2,
            pause_us: 1500,
        };
        // The first 16 runtime pages resident (32 OS pages), the rest released.
        let pm = Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start: base,
                pages: 128,
                resident: (0..16).map(|b| if b < 4 { 0xff } else { 0 }).collect(),
                shared: Vec::new(),
            }],
        };
        let p = split(&heap, &pm);
        assert_eq!(p.heap_alloc, (13 + 128) * 64);
        assert_eq!(p.heap_in_use, 2 * 8192);
        assert_eq!(p.stack_in_use, 4 * 8192);
        assert_eq!(p.objects, (13 + 128) * 64);
        assert_eq!(p.free_slots, 2 * 8192 - (13 + 128) * 64);
        assert_eq!(p.stacks, 4 * 8192);
        assert_eq!(p.idle_kept, 10 * 8192);
        assert_eq!(p.released, 48 * 8192);
        assert_eq!(p.resident, 16 * 8192);
        assert_eq!(p.sparse_spans, 1);
        assert_eq!(p.span_fill[1].count, 1);
        assert_eq!(p.span_fill[9].count, 1);
        assert_eq!(p.classes.len(), 1);
        assert_eq!(p.classes[0].free_bytes(), 2 * 8192 - 141 * 64);
    }
}
