//! A Go program's heap at a snapshot: its runtime's spans (fragscope-census's `golang`,
//! chunk 25) split by the snapshot's residency into objects, free slots of spans in use,
//! free pages kept and stacks; with the runtime's own figures as runtime.MemStats names
//! them, spans by fill, the size classes, and the headline in Go's terms.

use std::collections::HashMap;

use fragscope_trace::go_heap::{GoHeap, GoProfile, GoSpan, GoSpanKind};
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

/// `heap` split by the residency of its snapshot.
pub fn split(heap: &GoHeap, pm: &Pagemap) -> GoParts {
    let go_page = u64::from(heap.page_size);
    let mut res = Residency::new(pm);
    let resident: u64 = (heap.ranges.iter())
        .map(|&(lo, hi)| res.resident_bytes(lo, hi))
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
        let span_resident = res.resident_bytes(s.start, s.start + bytes);
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

/// Sites kept: the stacks holding the most live bytes (the text and the page show the
/// first ten; exports take them all).
const SITES_LISTED: usize = 200;

/// Where the objects of a Go heap were allocated, from the runtime's own heap profile (a
/// sample per `rate` bytes allocated, scaled as `go tool pprof` scales them), joined with
/// the spans its sampled objects lie in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoSites {
    pub rate: u64,
    /// The census's time, in ms.
    pub t_ms: f64,
    /// Sampled objects still live that the census found in spans (their profile
    /// specials), and those of them in spans at most a quarter full.
    pub sampled_live: u64,
    pub sampled_in_sparse_spans: u64,
    pub sites: Vec<GoSite>,
}

/// One allocation stack of the heap profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GoSite {
    /// The function that allocated (the stack's innermost frame), then its callers.
    pub stack: Vec<String>,
    pub in_use_bytes: u64,
    pub in_use_objects: u64,
    pub allocated_bytes: u64,
    pub allocated_objects: u64,
    /// Its sampled objects in spans at most a quarter full, and its share of those spans'
    /// free bytes (the share of the sampled objects in them that are its own).
    pub sampled_in_sparse_spans: u64,
    pub pinned_free_bytes: u64,
}

/// A return address's innermost frame: its function's name (None: unknown) and its label.
pub type GoFrame = (Option<String>, String);

/// The heap profile of `heap` by stack, its frames named by `symbolize`; None when the
/// program keeps no profile. As runtime/pprof writes a heap profile, the runtime's own
/// frames at the top of a stack (mallocgc, newobject, makeslice ...) are left out unless
/// nothing else is left, and the buckets of one stack are merged (they differ by size).
pub fn sites(
    heap: &GoHeap,
    t_ms: f64,
    mut symbolize: impl FnMut(u64) -> GoFrame,
) -> Option<GoSites> {
    let profile = heap.profile.as_ref().ok()?;
    let stacks: Vec<Vec<String>> = (profile.buckets.iter())
        .map(|b| shown_stack(&b.stack, &mut symbolize))
        .collect();
    let mut by_stack: HashMap<&[String], GoSite> = HashMap::new();
    for (b, stack) in profile.buckets.iter().zip(&stacks) {
        let (in_use_objects, in_use_bytes) = b.in_use_estimate(profile.rate);
        let (allocated_objects, allocated_bytes) = b.allocated_estimate(profile.rate);
        let site = by_stack.entry(stack).or_insert_with(|| GoSite {
            stack: stack.iter().take(STACK_SHOWN).cloned().collect(),
            in_use_bytes: 0,
            in_use_objects: 0,
            allocated_bytes: 0,
            allocated_objects: 0,
            sampled_in_sparse_spans: 0,
            pinned_free_bytes: 0,
        });
        site.in_use_bytes += in_use_bytes as u64;
        site.in_use_objects += in_use_objects as u64;
        site.allocated_bytes += allocated_bytes as u64;
        site.allocated_objects += allocated_objects as u64;
    }
    let (sampled_live, sampled_in_sparse) = pin_sparse_spans(heap, profile, &stacks, &mut by_stack);
    let mut sites: Vec<(&[String], GoSite)> = (by_stack.into_iter())
        .filter(|(_, s)| s.in_use_bytes > 0 || s.allocated_bytes > 0)
        .collect();
    sites.sort_by(|a, b| {
        (b.1.in_use_bytes, b.1.allocated_bytes, a.0).cmp(&(
            a.1.in_use_bytes,
            a.1.allocated_bytes,
            b.0,
        ))
    });
    Some(GoSites {
        rate: profile.rate,
        t_ms,
        sampled_live,
        sampled_in_sparse_spans: sampled_in_sparse,
        sites: sites
            .into_iter()
            .take(SITES_LISTED)
            .map(|(_, s)| s)
            .collect(),
    })
}

/// Charges the sparse spans' free bytes to the stacks whose sampled objects lie in them;
/// returns the sampled objects found in spans, and those in sparse ones.
fn pin_sparse_spans(
    heap: &GoHeap,
    profile: &GoProfile,
    stacks: &[Vec<String>],
    by_stack: &mut HashMap<&[String], GoSite>,
) -> (u64, u64) {
    let mut spans: Vec<&GoSpan> = (heap.spans.iter())
        .filter(|s| s.kind == GoSpanKind::Objects)
        .collect();
    spans.sort_by_key(|s| s.start);
    let page = u64::from(heap.page_size);
    let span_of = |address: u64| {
        let i = spans
            .partition_point(|s| s.start <= address)
            .checked_sub(1)?;
        (address < spans[i].start + spans[i].bytes(page)).then_some(i)
    };
    let located: Vec<(usize, u32)> = (profile.objects.iter())
        .filter_map(|&(address, bucket)| span_of(address).map(|i| (i, bucket)))
        .collect();
    let sparse =
        |s: &GoSpan| s.class != 0 && u64::from(s.in_use) * 100 <= u64::from(s.slots) * SPARSE_PCT;
    // The sparse spans' free bytes, shared among the stacks in proportion to their
    // sampled objects in sparse spans: each sample stands for the objects allocated with
    // it, most of which lie in spans no sample fell in.
    let sparse_free: u64 = (spans.iter())
        .filter(|s| sparse(s))
        .map(|s| s.bytes(page) - s.in_use_bytes())
        .sum();
    let in_sparse: Vec<u32> = (located.iter())
        .filter(|(i, _)| sparse(spans[*i]))
        .map(|&(_, bucket)| bucket)
        .collect();
    for &bucket in &in_sparse {
        if let Some(site) = by_stack.get_mut(stacks[bucket as usize].as_slice()) {
            site.sampled_in_sparse_spans += 1;
        }
    }
    for site in by_stack.values_mut() {
        site.pinned_free_bytes =
            sparse_free * site.sampled_in_sparse_spans / (in_sparse.len() as u64).max(1);
    }
    (located.len() as u64, in_sparse.len() as u64)
}

/// Frames of a site's stack shown.
const STACK_SHOWN: usize = 6;

/// A bucket's stack as labels, without the runtime's frames at its top (unless it has no
/// other).
fn shown_stack(stack: &[u64], symbolize: &mut impl FnMut(u64) -> GoFrame) -> Vec<String> {
    let frames: Vec<GoFrame> = stack.iter().map(|&pc| symbolize(pc)).collect();
    let runtime = |f: &GoFrame| {
        f.0.as_deref()
            .is_some_and(|n| n.starts_with("runtime.") || n.starts_with("internal/runtime/"))
    };
    let first = frames.iter().position(|f| !runtime(f)).unwrap_or(0);
    frames[first..].iter().map(|f| f.1.clone()).collect()
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
            profile: Err("not kept".into()),
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

    #[test]
    fn sites_leave_the_runtimes_frames_out_and_charge_sparse_spans_to_their_objects() {
        use fragscope_trace::go_heap::{GoBucket, GoProfile};
        let base = 0xc000000000u64;
        let bucket = |stack: Vec<u64>, allocs| GoBucket {
            stack,
            allocs,
            frees: 0,
            alloc_bytes: allocs * 64,
            free_bytes: 0,
        };
        let heap = GoHeap {
            go: "go1.26.8".into(),
            page_size: 8192,
            ranges: vec![(base, base + 4 * 8192)],
            // A span a tenth full, and a full one.
            spans: vec![
                span(base, 1, GoSpanKind::Objects, 13),
                span(base + 8192, 1, GoSpanKind::Objects, 128),
            ],
            pages_in_use: 2,
            pause_us: 0,
            profile: Ok(GoProfile {
                rate: 1,
                buckets: vec![bucket(vec![1, 2, 4], 2), bucket(vec![3, 4], 1)],
                // Two of the sparse span's objects are the first stack's.
                objects: vec![(base + 64, 0), (base + 640, 0), (base + 8192 + 64, 1)],
            }),
        };
        let names = |pc: u64| {
            let f = [
                "?",
                "runtime.mallocgc",
                "main.keep",
                "main.other",
                "main.main",
            ][pc as usize];
            (Some(f.to_string()), format!("{f} (x.go:{pc})"))
        };
        let g = sites(&heap, 5.0, names).unwrap();
        assert_eq!(g.sampled_live, 3);
        assert_eq!(g.sampled_in_sparse_spans, 2);
        let keep = &g.sites[0];
        assert_eq!(keep.stack, ["main.keep (x.go:2)", "main.main (x.go:4)"]);
        assert_eq!(keep.in_use_bytes, 128);
        assert_eq!(keep.sampled_in_sparse_spans, 2);
        assert_eq!(keep.pinned_free_bytes, 8192 - 13 * 64);
        assert_eq!(g.sites[1].pinned_free_bytes, 0);
        // Only the runtime's frames: they are shown rather than nothing.
        let mut only_runtime = heap.clone();
        if let Ok(p) = only_runtime.profile.as_mut() {
            p.buckets[0].stack = vec![1];
        }
        let g = sites(&only_runtime, 5.0, names).unwrap();
        assert!(g
            .sites
            .iter()
            .any(|s| s.stack == ["runtime.mallocgc (x.go:1)"]));
    }
}
