//! Chunk 25: a Go program's heap as its runtime's span table describes it, read from
//! outside the process (fragscope-census's `golang`) at a snapshot. The body of a
//! [`Census`]; the model splits it by the snapshot's residency.

use crate::format::records::{Census, CensusBody};
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

pub type GoCensus = Census<GoHeap>;

/// What a span of Go's heap holds (`mspan.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoSpanKind {
    /// Heap objects of one size class, or one large object (`mSpanInUse`).
    Objects = 1,
    /// Goroutine stacks (`mSpanManual`: the stack allocator's spans).
    Stacks = 2,
}

/// A span in use: `pages` runtime pages from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoSpan {
    pub start: u64,
    pub pages: u64,
    pub kind: GoSpanKind,
    /// The size class (`spanclass >> 1`; 0 for a large object's span and for stacks).
    pub class: u8,
    /// Objects without pointers (`spanclass & 1`).
    pub noscan: bool,
    /// Object slots (`nelems`) and how many are allocated (`allocCount`): since the
    /// span's last sweep, survivors plus what was allocated into it.
    pub slots: u32,
    pub in_use: u32,
    /// Bytes of a slot (`elemsize`): the size class's, or the large object's pages.
    pub slot_bytes: u64,
    /// Not swept since the last collection (`sweepgen` behind the heap's): `in_use` still
    /// counts the objects that collection found dead.
    pub unswept: bool,
}

impl GoSpan {
    pub fn bytes(&self, page_size: u64) -> u64 {
        self.pages * page_size
    }

    /// Bytes of the objects allocated in it, at their slots' size.
    pub fn in_use_bytes(&self) -> u64 {
        u64::from(self.in_use) * self.slot_bytes
    }
}

/// One stack of the runtime's heap profile (a `memProfile` bucket): the sampled
/// allocations made there and those of them freed since, as `runtime.MemProfile` would
/// return them (unscaled).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GoBucket {
    /// Return addresses, innermost first (inlined calls already expanded by the runtime).
    pub stack: Vec<u64>,
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
    pub free_bytes: u64,
}

impl GoBucket {
    /// The bucket's sampled objects still live and their bytes, scaled to estimates of
    /// every object as `go tool pprof` scales them (`scaleHeapSample`).
    pub fn in_use_estimate(&self, rate: u64) -> (f64, f64) {
        scale_heap_sample(
            self.allocs.saturating_sub(self.frees),
            self.alloc_bytes.saturating_sub(self.free_bytes),
            rate,
        )
    }

    /// Every sampled allocation and its bytes, scaled the same way.
    pub fn allocated_estimate(&self, rate: u64) -> (f64, f64) {
        scale_heap_sample(self.allocs, self.alloc_bytes, rate)
    }
}

/// runtime/pprof's scaleHeapSample: a sample of `count` objects of `size` bytes in all,
/// taken one per `rate` bytes on average, stands for count and size divided by the chance
/// that an object of their mean size was sampled.
pub fn scale_heap_sample(count: u64, size: u64, rate: u64) -> (f64, f64) {
    if count == 0 || size == 0 {
        return (0.0, 0.0);
    }
    if rate <= 1 {
        return (count as f64, size as f64);
    }
    let mean = size as f64 / count as f64;
    let scale = 1.0 / (1.0 - (-mean / rate as f64).exp());
    (count as f64 * scale, size as f64 * scale)
}

/// The runtime's heap profile at a census: its buckets, and where each sampled object
/// still live lies (its span's profile special).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GoProfile {
    /// `runtime.MemProfileRate`: one sample per this many bytes allocated, on average.
    pub rate: u64,
    pub buckets: Vec<GoBucket>,
    /// (address, index into `buckets`) of every sampled object still live, in address
    /// order.
    pub objects: Vec<(u64, u32)>,
}

/// The census: the heap's address ranges and every span in use or holding stacks, in
/// address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoHeap {
    /// The runtime's version, as "go1.26.8".
    pub go: String,
    /// The runtime's page (8 KiB on every release).
    pub page_size: u32,
    /// The address ranges the page allocator manages (`mheap_.pages.inUse`): the heap's
    /// spans, its free pages and its released ones, all within them.
    pub ranges: Vec<(u64, u64)>,
    pub spans: Vec<GoSpan>,
    /// The runtime's own count of pages in object spans (`mheap_.pagesInUse`): the census
    /// checks its spans against it.
    pub pages_in_use: u64,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
    /// The runtime's heap profile, when the program keeps one; else why not.
    pub profile: Result<GoProfile, String>,
}

impl Default for GoHeap {
    fn default() -> Self {
        Self {
            go: String::new(),
            page_size: 8192,
            ranges: Vec::new(),
            spans: Vec::new(),
            pages_in_use: 0,
            pause_us: 0,
            profile: Err("not read".into()),
        }
    }
}

impl GoHeap {
    /// Bytes the ranges span (what the runtime has mapped for its heap and stacks).
    pub fn range_bytes(&self) -> u64 {
        self.ranges.iter().map(|(lo, hi)| hi - lo).sum()
    }
}

impl CensusBody for GoHeap {
    const WHAT: &'static str = "a Go heap census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.go)
            .varint(self.page_size.into())
            .varint(self.pages_in_use)
            .varint(self.pause_us)
            .varint(self.ranges.len() as u64);
        for &(lo, hi) in &self.ranges {
            w.varint(lo).varint(hi.wrapping_sub(lo));
        }
        w.varint(self.spans.len() as u64);
        // Starts as steps in pages from the span before: mostly its length.
        let page = u64::from(self.page_size.max(1));
        let mut prev = 0u64;
        for s in &self.spans {
            let flags = (s.kind as u8) | (u8::from(s.noscan) << 2) | (u8::from(s.unswept) << 3);
            w.varint(s.start.wrapping_sub(prev) / page)
                .varint(s.pages)
                .u8(flags)
                .u8(s.class)
                .varint(s.slots.into())
                .varint(s.in_use.into())
                .varint(s.slot_bytes);
            prev = s.start;
        }
        match &self.profile {
            Err(why) => {
                w.u8(0).str(why);
            }
            Ok(p) => {
                w.u8(1).varint(p.rate).varint(p.buckets.len() as u64);
                for b in &p.buckets {
                    w.varint(b.allocs)
                        .varint(b.frees)
                        .varint(b.alloc_bytes)
                        .varint(b.free_bytes)
                        .varint(b.stack.len() as u64);
                    for &pc in &b.stack {
                        w.varint(pc);
                    }
                }
                w.varint(p.objects.len() as u64);
                let mut prev = 0u64;
                for &(address, bucket) in &p.objects {
                    w.varint(address.wrapping_sub(prev)).varint(bucket.into());
                    prev = address;
                }
            }
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let go = r.string()?;
        let page_size = r.varint()? as u32;
        if page_size == 0 || !page_size.is_power_of_two() {
            return Err(TraceError::Malformed(format!(
                "a Go heap census with a page of {page_size} bytes"
            )));
        }
        let pages_in_use = r.varint()?;
        let pause_us = r.varint()?;
        let n = r.count(2)?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            let lo = r.varint()?;
            ranges.push((lo, lo.wrapping_add(r.varint()?)));
        }
        let n = r.count(7)?;
        let mut spans = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            let start = prev.wrapping_add(r.varint()?.wrapping_mul(u64::from(page_size)));
            let pages = r.varint()?;
            let flags = r.u8()?;
            let kind = match flags & 3 {
                1 => GoSpanKind::Objects,
                2 => GoSpanKind::Stacks,
                k => {
                    return Err(TraceError::Malformed(format!(
                        "a Go span of unknown kind {k}"
                    )))
                }
            };
            spans.push(GoSpan {
                start,
                pages,
                kind,
                noscan: flags & 4 != 0,
                unswept: flags & 8 != 0,
                class: r.u8()?,
                slots: r.varint()? as u32,
                in_use: r.varint()? as u32,
                slot_bytes: r.varint()?,
            });
            prev = start;
        }
        let profile = match r.u8()? {
            0 => Err(r.string()?),
            1 => {
                let rate = r.varint()?;
                let n = r.count(5)?;
                let mut buckets = Vec::with_capacity(n);
                for _ in 0..n {
                    let (allocs, frees, alloc_bytes, free_bytes) =
                        (r.varint()?, r.varint()?, r.varint()?, r.varint()?);
                    let depth = r.count(1)?;
                    let stack = (0..depth).map(|_| r.varint()).collect::<Result<_, _>>()?;
                    buckets.push(GoBucket {
                        stack,
                        allocs,
                        frees,
                        alloc_bytes,
                        free_bytes,
                    });
                }
                let n = r.count(2)?;
                let mut objects = Vec::with_capacity(n);
                let mut prev = 0u64;
                for _ in 0..n {
                    let address = prev.wrapping_add(r.varint()?);
                    let bucket = r.varint()?;
                    if bucket >= buckets.len() as u64 {
                        return Err(TraceError::Malformed(format!(
                            "a sampled Go object of bucket {bucket}, of {} buckets",
                            buckets.len()
                        )));
                    }
                    objects.push((address, bucket as u32));
                    prev = address;
                }
                Ok(GoProfile {
                    rate,
                    buckets,
                    objects,
                })
            }
            k => {
                return Err(TraceError::Malformed(format!(
                    "a Go heap profile of unknown outcome {k}"
                )))
            }
        };
        Ok(GoHeap {
            go,
            page_size,
            ranges,
            spans,
            pages_in_use,
            pause_us,
            profile,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SnapshotReason;

    #[test]
    fn go_censuses_round_trip_and_refuse_cut_bodies() {
        let span = |start, pages, kind, class, slots, in_use, slot_bytes| GoSpan {
            start,
            pages,
            kind,
            class,
            noscan: class % 2 == 0,
            slots,
            in_use,
            slot_bytes,
            unswept: in_use == 3,
        };
        let taken = GoCensus {
            stream: 0,
            tick: 77,
            reason: SnapshotReason::Periodic,
            result: Ok(GoHeap {
                go: "go1.26.8".into(),
                page_size: 8192,
                ranges: vec![(0xc000000000, 0xc000400000)],
                spans: vec![
                    span(0xc000000000, 1, GoSpanKind::Objects, 5, 128, 13, 64),
                    span(0xc000002000, 4, GoSpanKind::Stacks, 0, 0, 0, 0),
                    span(0xc000010000, 40, GoSpanKind::Objects, 0, 1, 1, 40 * 8192),
                    span(0xc000100000, 1, GoSpanKind::Objects, 12, 64, 3, 128),
                ],
                pages_in_use: 42,
                pause_us: 900,
                profile: Ok(GoProfile {
                    rate: 512 * 1024,
                    buckets: vec![
                        GoBucket {
                            stack: vec![0x401234, 0x402000],
                            allocs: 10,
                            frees: 3,
                            alloc_bytes: 640,
                            free_bytes: 192,
                        },
                        GoBucket::default(),
                    ],
                    objects: vec![(0xc000000040, 0), (0xc000100000, 1)],
                }),
            }),
        };
        let bytes = taken.encode();
        assert_eq!(GoCensus::decode(&bytes).unwrap(), taken);
        for cut in 1..bytes.len() {
            assert!(GoCensus::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let refused = GoCensus {
            result: Err("no DWARF".into()),
            ..taken.clone()
        };
        assert_eq!(GoCensus::decode(&refused.encode()).unwrap(), refused);
        let mut unprofiled = taken.clone();
        if let Ok(h) = unprofiled.result.as_mut() {
            h.profile = Err("linked without the heap profiler".into());
        }
        assert_eq!(GoCensus::decode(&unprofiled.encode()).unwrap(), unprofiled);
    }

    #[test]
    fn heap_samples_are_scaled_as_pprof_scales_them() {
        // One sample of a 512 KiB object at the default rate: 1 / (1 - e^-1).
        let (n, b) = scale_heap_sample(1, 512 << 10, 512 << 10);
        assert!((n - 1.582).abs() < 0.001, "{n}");
        assert!((b - 1.582 * 524288.0).abs() < 600.0, "{b}");
        assert_eq!(scale_heap_sample(0, 10, 512), (0.0, 0.0));
        assert_eq!(scale_heap_sample(3, 30, 1), (3.0, 30.0));
    }
}
