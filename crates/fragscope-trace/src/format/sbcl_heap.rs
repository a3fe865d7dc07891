//! Chunk 19: an SBCL process's dynamic space as its gencgc page table describes it, read
//! from outside the process (fragscope-census's `sbcl`) at a snapshot. The body of a
//! [`Census`]; the model splits it by the snapshot's residency.

use crate::format::records::{Census, CensusBody};
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

pub type SbclCensus = Census<SbclHeap>;

/// Object classes of a heap walk, in this order (`SbclHeap::objects`).
pub const OBJECT_CLASSES: [&str; 7] = [
    "strings",
    "conses",
    "octet vectors",
    "other vectors",
    "instances",
    "code",
    "other",
];

/// One generation's figures: the page table's, and the runtime's `struct generation`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SbclGenerationFigures {
    pub gen: u8,
    pub pages: u64,
    pub bytes_used: u64,
    pub large_pages: u64,
    pub large_bytes: u64,
    /// Collections of this generation since it was last raised (`num_gc`).
    pub collections: u32,
    /// Collections it waits before its survivors are promoted.
    pub collections_before_promotion: u32,
    /// Bytes allocated into it since its last collection that trigger one.
    pub bytes_consed_between_gc: u64,
}

/// A page of the dynamic space in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SbclPageUse {
    pub index: u32,
    /// Bytes of objects, plus the part of an open allocation region on the page.
    pub bytes_used: u32,
    pub gen: u8,
    /// The page type's name index (see `SbclHeap::page_types`).
    pub page_type: u8,
    /// Holds (part of) one large object.
    pub large: bool,
}

/// An SBCL dynamic space at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SbclHeap {
    /// The release, as `sbcl --version` prints it.
    pub version: String,
    pub dynamic_space_start: u64,
    pub dynamic_space_size: u64,
    pub page_bytes: u64,
    /// Pages below this one have been used; the rest never were.
    pub next_free_page: u64,
    /// Collections since the program started.
    pub collections: u64,
    pub pause_us: u64,
    /// Names of the page types, indexed by `SbclPageUse::page_type`.
    pub page_types: Vec<String>,
    pub generations: Vec<SbclGenerationFigures>,
    /// Pages in use, by index.
    pub pages: Vec<SbclPageUse>,
    /// (count, bytes) per [`OBJECT_CLASSES`] when the census walked the objects.
    pub objects: Option<Vec<(u64, u64)>>,
    /// The same by generation (of the page each object starts on), when walked.
    pub objects_by_generation: Vec<Vec<(u64, u64)>>,
    /// When the census marked the objects reachable from the roots: the live (count,
    /// bytes) by generation, then by [`OBJECT_CLASSES`]; what a full collection would
    /// free is `objects_by_generation` less these. Added after the chunk was first
    /// written: a body that ends after the walk has none.
    pub live_by_generation: Option<Vec<Vec<(u64, u64)>>>,
    /// How long the mark held the process, beyond the walk.
    pub mark_us: u64,
    /// Threads the mark found stopped outside a system call (running Lisp code): their
    /// registers are not read, so an object only a register held counts as garbage.
    pub threads_in_lisp: u32,
    /// Why the census asked for a mark and has none (the roots did not hold together, a
    /// release whose roots the mark does not know). Written in the optional tail too.
    pub mark_refused: Option<String>,
}

impl SbclHeap {
    /// Bytes of class `class` (an index into [`OBJECT_CLASSES`]) in generation `gen`
    /// that are garbage a full collection would free, when the census marked.
    pub fn garbage(&self, gen: usize, class: usize) -> Option<u64> {
        let live = self.live_by_generation.as_ref()?.get(gen)?.get(class)?.1;
        let all = self.objects_by_generation.get(gen)?.get(class)?.1;
        Some(all.saturating_sub(live))
    }
}

impl CensusBody for SbclHeap {
    const WHAT: &'static str = "an SBCL census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.version)
            .varint(self.dynamic_space_start)
            .varint(self.dynamic_space_size)
            .varint(self.page_bytes)
            .varint(self.next_free_page)
            .varint(self.collections)
            .varint(self.pause_us)
            .varint(self.page_types.len() as u64);
        for t in &self.page_types {
            w.str(t);
        }
        w.varint(self.generations.len() as u64);
        for g in &self.generations {
            w.u8(g.gen)
                .varint(g.pages)
                .varint(g.bytes_used)
                .varint(g.large_pages)
                .varint(g.large_bytes)
                .varint(g.collections.into())
                .varint(g.collections_before_promotion.into())
                .varint(g.bytes_consed_between_gc);
        }
        // Pages as steps from the one before: mostly 1.
        w.varint(self.pages.len() as u64);
        let mut prev = 0u32;
        for p in &self.pages {
            w.varint(p.index.wrapping_sub(prev).into())
                .varint(p.bytes_used.into())
                .u8(p.gen)
                .u8(p.page_type | if p.large { 0x80 } else { 0 });
            prev = p.index;
        }
        match &self.objects {
            None => {
                w.u8(0);
            }
            Some(classes) => {
                w.u8(1).varint(classes.len() as u64);
                for (count, bytes) in classes {
                    w.varint(*count).varint(*bytes);
                }
                w.varint(self.objects_by_generation.len() as u64);
                for g in &self.objects_by_generation {
                    w.varint(g.len() as u64);
                    for (count, bytes) in g {
                        w.varint(*count).varint(*bytes);
                    }
                }
            }
        }
        // Optional tail: only a census that marked writes it, so that one that did
        // not reads the same as before the field existed.
        if let (None, Some(why)) = (&self.live_by_generation, &self.mark_refused) {
            w.u8(2).str(why);
        }
        if let Some(live) = &self.live_by_generation {
            w.u8(1)
                .varint(self.mark_us)
                .varint(self.threads_in_lisp.into())
                .varint(live.len() as u64);
            for g in live {
                w.varint(g.len() as u64);
                for (count, bytes) in g {
                    w.varint(*count).varint(*bytes);
                }
            }
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let version = r.string()?;
        let dynamic_space_start = r.varint()?;
        let dynamic_space_size = r.varint()?;
        let page_bytes = r.varint()?;
        let next_free_page = r.varint()?;
        let collections = r.varint()?;
        let pause_us = r.varint()?;
        let n = r.count(1)?;
        let page_types = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
        let small = |v: u64, what: &str| {
            u32::try_from(v).map_err(|_| TraceError::Malformed(format!("SBCL census {what} {v}")))
        };
        // A generation's figures take 8 bytes at the least (a byte and 7 varints).
        let n = r.count(8)?;
        let mut generations = Vec::with_capacity(n);
        for _ in 0..n {
            generations.push(SbclGenerationFigures {
                gen: r.u8()?,
                pages: r.varint()?,
                bytes_used: r.varint()?,
                large_pages: r.varint()?,
                large_bytes: r.varint()?,
                collections: small(r.varint()?, "collections")?,
                collections_before_promotion: small(r.varint()?, "promotion age")?,
                bytes_consed_between_gc: r.varint()?,
            });
        }
        let n = r.count(4)?;
        let mut pages = Vec::with_capacity(n);
        let mut prev = 0u32;
        for _ in 0..n {
            let index = prev.wrapping_add(small(r.varint()?, "page step")?);
            let bytes_used = small(r.varint()?, "page bytes")?;
            let gen = r.u8()?;
            let t = r.u8()?;
            pages.push(SbclPageUse {
                index,
                bytes_used,
                gen,
                page_type: t & 0x7f,
                large: t & 0x80 != 0,
            });
            prev = index;
        }
        let pairs = |r: &mut Reader| -> Result<Vec<(u64, u64)>, TraceError> {
            let n = r.count(2)?;
            (0..n).map(|_| Ok((r.varint()?, r.varint()?))).collect()
        };
        let (objects, objects_by_generation) = match r.u8()? {
            0 => (None, Vec::new()),
            _ => {
                let classes = pairs(r)?;
                let n = r.count(1)?;
                let by_gen = (0..n).map(|_| pairs(r)).collect::<Result<_, _>>()?;
                (Some(classes), by_gen)
            }
        };
        let mut mark_refused = None;
        let (live_by_generation, mark_us, threads_in_lisp) = if r.is_empty() {
            (None, 0, 0)
        } else {
            match r.u8()? {
                0 => (None, 0, 0),
                2 => {
                    mark_refused = Some(r.string()?);
                    (None, 0, 0)
                }
                _ => {
                    let mark_us = r.varint()?;
                    let threads = small(r.varint()?, "threads")?;
                    let n = r.count(1)?;
                    let live = (0..n).map(|_| pairs(r)).collect::<Result<_, _>>()?;
                    (Some(live), mark_us, threads)
                }
            }
        };
        if page_bytes == 0 {
            return Err(TraceError::Malformed(
                "an SBCL census with pages of 0 bytes".into(),
            ));
        }
        Ok(Self {
            version,
            dynamic_space_start,
            dynamic_space_size,
            page_bytes,
            next_free_page,
            collections,
            pause_us,
            page_types,
            generations,
            pages,
            objects,
            objects_by_generation,
            live_by_generation,
            mark_us,
            threads_in_lisp,
            mark_refused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::records::SnapshotReason;

    #[test]
    fn sbcl_censuses_round_trip_and_cut_ones_are_errors() {
        let heap = SbclHeap {
            version: "2.2.9.debian".into(),
            dynamic_space_start: 0x1000_0000_0000,
            dynamic_space_size: 8 << 30,
            page_bytes: 32 << 10,
            next_free_page: 40,
            collections: 12,
            pause_us: 800,
            page_types: vec!["unboxed".into(), "boxed".into()],
            generations: vec![SbclGenerationFigures {
                gen: 1,
                pages: 2,
                bytes_used: 40_000,
                large_pages: 1,
                large_bytes: 32_768,
                collections: 3,
                collections_before_promotion: 1,
                bytes_consed_between_gc: 53_687_091,
            }],
            pages: vec![
                SbclPageUse {
                    index: 3,
                    bytes_used: 32_768,
                    gen: 1,
                    page_type: 0,
                    large: true,
                },
                SbclPageUse {
                    index: 4,
                    bytes_used: 7_232,
                    gen: 1,
                    page_type: 1,
                    large: false,
                },
            ],
            objects: Some(vec![(5, 80); 7]),
            objects_by_generation: vec![vec![(5, 80); 7], vec![(0, 0); 7]],
            live_by_generation: Some(vec![vec![(2, 32); 7], vec![(0, 0); 7]]),
            mark_us: 1234,
            threads_in_lisp: 1,
            mark_refused: None,
        };
        assert_eq!(heap.garbage(0, 2), Some(48));
        let c = SbclCensus {
            stream: 2,
            tick: 77,
            reason: SnapshotReason::Periodic,
            result: Ok(heap.clone()),
        };
        let bytes = c.encode();
        assert_eq!(SbclCensus::decode(&bytes).unwrap(), c);
        // A census without a mark is written as before the mark existed, and a trace
        // of that time reads back with none.
        let unmarked = SbclCensus {
            result: Ok(SbclHeap {
                live_by_generation: None,
                mark_us: 0,
                threads_in_lisp: 0,
                ..heap
            }),
            ..c.clone()
        };
        let old = unmarked.encode();
        assert!(bytes.starts_with(&old) && bytes.len() > old.len());
        assert_eq!(SbclCensus::decode(&old).unwrap(), unmarked);
        assert_eq!(unmarked.result.as_ref().unwrap().garbage(0, 2), None);
        // A refused mark keeps its sentence.
        let refused = SbclCensus {
            result: Ok(SbclHeap {
                mark_refused: Some("the roots moved".into()),
                ..unmarked.result.clone().unwrap()
            }),
            ..c.clone()
        };
        assert_eq!(SbclCensus::decode(&refused.encode()).unwrap(), refused);
        for cut in 0..bytes.len() {
            // Cut exactly where an unmarked census ends, it reads as one.
            if cut != old.len() {
                assert!(SbclCensus::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    /// The census of a Lisp that has just started (SBCL 2.2.9 reports 8 generations, all
    /// empty, and no page in use) reads back: a generation's figures are then 8 bytes,
    /// which the reader once took for too few (the census, and the rest of the trace
    /// after it, were lost when the recorder's first snapshot came that early).
    #[test]
    fn the_census_of_an_empty_dynamic_space_round_trips() {
        let empty = SbclGenerationFigures {
            gen: 0,
            pages: 0,
            bytes_used: 0,
            large_pages: 0,
            large_bytes: 0,
            collections: 0,
            collections_before_promotion: 1,
            bytes_consed_between_gc: 0,
        };
        let heap = SbclHeap {
            version: "2.2.9.debian".into(),
            dynamic_space_start: 0x1000_0000_0000,
            dynamic_space_size: 8 << 30,
            page_bytes: 32 << 10,
            next_free_page: 0,
            collections: 0,
            pause_us: 0,
            page_types: Vec::new(),
            generations: (0..8)
                .map(|gen| SbclGenerationFigures { gen, ..empty })
                .collect(),
            pages: Vec::new(),
            objects: None,
            objects_by_generation: Vec::new(),
            live_by_generation: None,
            mark_us: 0,
            threads_in_lisp: 0,
            mark_refused: None,
        };
        let c = SbclCensus {
            stream: 0,
            tick: 3,
            reason: SnapshotReason::Periodic,
            result: Ok(heap),
        };
        assert_eq!(SbclCensus::decode(&c.encode()).unwrap(), c);
    }
}
