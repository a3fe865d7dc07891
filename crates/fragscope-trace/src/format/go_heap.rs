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

/// The census: the heap's address ranges and every span in use or holding stacks, in
/// address order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
        Ok(GoHeap {
            go,
            page_size,
            ranges,
            spans,
            pages_in_use,
            pause_us,
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
    }
}
