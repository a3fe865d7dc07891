//! An SBCL process's dynamic space, split by a snapshot's residency: bytes of objects on
//! pages in use, free space inside those pages, and resident pages no object uses (free
//! pages the collector keeps mapped), with each generation's share and a page
//! occupancy histogram. The census (chunk 19) is gencgc's own page table.

use serde::Serialize;

use fragscope_trace::records::Pagemap;
use fragscope_trace::sbcl_heap::{SbclHeap, OBJECT_CLASSES};

use crate::pymalloc::{add_to, fill_buckets, fill_words, FillBucket};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SbclGeneration {
    pub gen: u8,
    pub pages: u64,
    /// Bytes of objects (the page table's count).
    pub bytes_used: u64,
    /// Resident bytes of its pages.
    pub resident: u64,
    /// Bytes on pages holding one large object each (vectors of more than a few pages).
    pub large_bytes: u64,
    /// Collections of it since it was last raised, and how many it waits before its
    /// survivors are promoted.
    pub collections: u32,
    pub collections_before_promotion: u32,
    /// Its objects by class, when this census walked them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<Vec<SbclObjectClass>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SbclObjectClass {
    pub class: String,
    pub count: u64,
    pub bytes: u64,
    /// Of `bytes`, those a full collection would free (unreachable from the roots),
    /// when the census marked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub garbage: Option<u64>,
}

/// The dynamic space at one census (see the module's comment).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SbclParts {
    pub version: String,
    pub page_bytes: u64,
    pub dynamic_space_size: u64,
    pub pages_in_use: u64,
    /// Bytes of objects on every page in use, resident or not (the page table's count;
    /// pages loaded from the core file are file-backed).
    pub bytes_used: u64,
    /// Resident bytes of the whole dynamic space; they add up to `in_use` +
    /// `free_in_used_pages` + `free_pages`.
    pub resident: u64,
    pub in_use: u64,
    pub free_in_used_pages: u64,
    pub free_pages: u64,
    /// Collections since the program started.
    pub collections: u64,
    /// Generations holding a page, youngest first.
    pub generations: Vec<SbclGeneration>,
    /// Pages in use by bytes used / page size: 0-10%, ..., 90-100%.
    pub page_fill: Vec<FillBucket>,
    /// By object class, when the census walked the objects.
    pub objects: Option<Vec<SbclObjectClass>>,
    /// Bytes of objects in generations 0-5 that a full collection would free, when the
    /// census marked from the roots; and how long the mark held the program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub garbage: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark_ms: Option<f64>,
    /// Threads the mark found running Lisp code (not in a system call): their registers
    /// are not read, so an object only a register held is counted as garbage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_in_lisp: Option<u32>,
    /// Why this census has no mark though it asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark_refused: Option<String>,
    pub pause_ms: f64,
}

impl SbclParts {
    /// Resident bytes of the dynamic space that hold no object.
    pub fn waste(&self) -> u64 {
        self.free_in_used_pages + self.free_pages
    }
}

/// Object classes from (count, bytes) pairs, with each one's garbage when `live` (the
/// mark's pairs) is known.
fn object_classes(classes: &[(u64, u64)], live: Option<&[(u64, u64)]>) -> Vec<SbclObjectClass> {
    classes
        .iter()
        .zip(OBJECT_CLASSES)
        .enumerate()
        .map(|(i, (&(count, bytes), class))| SbclObjectClass {
            class: class.into(),
            count,
            bytes,
            garbage: live.map(|l| bytes.saturating_sub(l.get(i).map_or(0, |x| x.1))),
        })
        .collect()
}

/// The generation (1-5) and class holding the most garbage, when the census marked:
/// objects promoted past the nursery that died there, which only a collection of their
/// generation (or a full one) frees.
pub fn promoted_garbage(p: &SbclParts) -> Option<(u8, &SbclObjectClass, u64)> {
    p.generations
        .iter()
        .filter(|g| (1..=5).contains(&g.gen))
        .filter_map(|g| {
            let c = g
                .objects
                .as_ref()?
                .iter()
                .max_by_key(|c| c.garbage.unwrap_or(0))?;
            Some((g.gen, c, c.garbage?))
        })
        .max_by_key(|(_, _, garbage)| *garbage)
}

/// The headline of a census that marked, when garbage promoted before it died holds at
/// least 4 MiB and a twentieth of the dynamic space in use (seed 004).
pub fn garbage_headline(p: &SbclParts) -> Option<(&'static str, String)> {
    let (gen, class, bytes) = promoted_garbage(p)?;
    let all = p.garbage?;
    if bytes < 4 << 20 || bytes * 20 < p.bytes_used {
        return None;
    }
    Some((
        "sbcl_promoted_garbage",
        format!(
            "{} of {} in generation {gen} are garbage that only a full GC reclaims: they \
             were promoted before dying (SBCL {}: {} of the dynamic space's {} in use is \
             garbage that (gc :full t) would free). Allocate large buffers outside the \
             dynamic space (e.g. static-vectors) or reuse them; or keep young objects in \
             the nursery longer: (setf (sb-ext:generation-number-of-gcs-before-promotion \
             0) 1), a larger (setf (sb-ext:bytes-consed-between-gcs) ...).",
            crate::mib(bytes),
            class.class,
            p.version,
            crate::mib(all),
            crate::mib(p.bytes_used)
        ),
    ))
}

/// The largest class of objects in a generation past the nursery and below the core's
/// (1-5): promoted objects, reclaimed only when their generation is collected.
pub fn promoted_largest(p: &SbclParts) -> Option<(u8, &SbclObjectClass)> {
    p.generations
        .iter()
        .filter(|g| (1..=5).contains(&g.gen))
        .filter_map(|g| {
            let largest = g.objects.as_ref()?.iter().max_by_key(|c| c.bytes)?;
            Some((g.gen, largest))
        })
        .max_by_key(|(_, c)| c.bytes)
}

/// Splits `heap` by the residency `pm` read with it.
pub fn split(heap: &SbclHeap, pm: &Pagemap) -> SbclParts {
    let os_page = u64::from(pm.page_size.max(1));
    let start = heap.dynamic_space_start;
    let end = start.saturating_add(heap.dynamic_space_size);
    // Every resident page of the space, range by range (the space is one mapping of
    // gigabytes, mostly never touched).
    let mut resident = 0;
    for r in &pm.ranges {
        let r_end = r.start.saturating_add(r.pages * os_page);
        if r_end <= start || r.start >= end {
            continue;
        }
        if r.start >= start && r_end <= end {
            resident += r.resident_pages() * os_page;
        } else {
            let (lo, hi) = (r.start.max(start), r_end.min(end));
            let first = (lo - r.start) / os_page;
            let last = (hi - r.start).div_ceil(os_page);
            resident += (first..last).filter(|&p| r.is_resident(p)).count() as u64 * os_page;
        }
    }
    let mut residency = crate::heap::Residency::new(pm);
    let mut parts = SbclParts {
        version: heap.version.clone(),
        page_bytes: heap.page_bytes,
        dynamic_space_size: heap.dynamic_space_size,
        pages_in_use: heap.pages.len() as u64,
        bytes_used: heap.pages.iter().map(|p| u64::from(p.bytes_used)).sum(),
        resident,
        in_use: 0,
        free_in_used_pages: 0,
        free_pages: 0,
        collections: heap.collections,
        generations: Vec::new(),
        page_fill: fill_buckets(),
        objects: heap.objects.as_deref().map(|classes| {
            // Live of all generations, class by class.
            let live = heap.live_by_generation.as_ref().map(|gens| {
                (0..classes.len())
                    .map(|i| {
                        gens.iter().fold((0, 0), |(n, b), g| {
                            let x = g.get(i).copied().unwrap_or_default();
                            (n + x.0, b + x.1)
                        })
                    })
                    .collect::<Vec<(u64, u64)>>()
            });
            object_classes(classes, live.as_deref())
        }),
        garbage: heap.live_by_generation.as_ref().map(|_| {
            (0..6)
                .flat_map(|g| (0..OBJECT_CLASSES.len()).map(move |c| (g, c)))
                .filter_map(|(g, c)| heap.garbage(g, c))
                .sum()
        }),
        mark_ms: heap
            .live_by_generation
            .as_ref()
            .map(|_| heap.mark_us as f64 / 1000.0),
        threads_in_lisp: heap
            .live_by_generation
            .as_ref()
            .map(|_| heap.threads_in_lisp),
        mark_refused: heap.mark_refused.clone(),
        pause_ms: heap.pause_us as f64 / 1000.0,
    };
    let mut gens: Vec<SbclGeneration> = heap
        .generations
        .iter()
        .map(|g| SbclGeneration {
            gen: g.gen,
            pages: g.pages,
            bytes_used: g.bytes_used,
            resident: 0,
            large_bytes: g.large_bytes,
            collections: g.collections,
            collections_before_promotion: g.collections_before_promotion,
            objects: heap
                .objects_by_generation
                .get(usize::from(g.gen))
                .map(|classes| {
                    let live = heap
                        .live_by_generation
                        .as_ref()
                        .and_then(|l| l.get(usize::from(g.gen)));
                    object_classes(classes, live.map(Vec::as_slice))
                }),
        })
        .collect();
    let mut used_resident = 0;
    for p in &heap.pages {
        let page_start = start + u64::from(p.index) * heap.page_bytes;
        let mut bytes = 0;
        for os in page_start / os_page..(page_start + heap.page_bytes).div_ceil(os_page) {
            if residency.is_resident(os).is_some() {
                bytes += os_page;
            }
        }
        let in_use = u64::from(p.bytes_used).min(bytes);
        used_resident += bytes;
        parts.in_use += in_use;
        parts.free_in_used_pages += bytes - in_use;
        add_to(
            &mut parts.page_fill,
            u64::from(p.bytes_used),
            heap.page_bytes,
        );
        if let Some(g) = gens.iter_mut().find(|g| g.gen == p.gen) {
            g.resident += bytes;
        }
    }
    parts.free_pages = resident.saturating_sub(used_resident);
    parts.resident = parts.in_use + parts.free_in_used_pages + parts.free_pages;
    gens.retain(|g| g.pages > 0);
    parts.generations = gens;
    parts
}

/// What the census with the most waste says, when it is worth a headline (at least
/// 4 MiB and a quarter of the resident space): the dominant part and a sentence, naming
/// the promoted objects of the last census that walked them (`walked`).
pub fn headline(p: &SbclParts, walked: Option<&SbclParts>) -> Option<(&'static str, String)> {
    if p.waste() < 4 << 20 || p.waste() * 4 < p.resident {
        return None;
    }
    // Promoted objects of one class holding a twentieth of the space: name them.
    let promoted = walked
        .and_then(|w| promoted_largest(w).filter(|(_, c)| c.bytes * 20 >= w.resident))
        .map(|(gen, c)| {
            format!(
                " {} of {} sit in generation {gen}: promoted, they are reclaimed only when \
                 generation {gen} is collected (or by (gc :full t)); buffers allocated \
                 outside the dynamic space (sb-alien) or reused stay out of it.",
                crate::mib(c.bytes),
                c.class
            )
        })
        .unwrap_or_default();
    let held = format!(
        "{} of SBCL's dynamic space is resident (SBCL {}) for {} of objects",
        crate::mib(p.resident),
        p.version,
        crate::mib(p.in_use)
    );
    Some(if p.free_pages >= p.free_in_used_pages {
        (
            "sbcl_free_pages",
            format!(
                "{held}: {} is pages the collector freed and kept mapped (gencgc does not \
                 give freed pages back; a smaller --dynamic-space-size or fewer bytes \
                 consed between collections keeps the high-water mark lower).{promoted}",
                crate::mib(p.free_pages)
            ),
        )
    } else {
        (
            "sbcl_free_in_used_pages",
            format!(
                "{held}: {} is free space inside pages that still hold an object ({} \
                 pages in use, most {}): survivors scattered over many pages keep them.\
                 {promoted}",
                crate::mib(p.free_in_used_pages),
                p.pages_in_use,
                fill_words(&p.page_fill)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::records::{ResidentRange, SnapshotReason};
    use fragscope_trace::sbcl_heap::{SbclGenerationFigures, SbclPageUse};

    /// A space of 8 pages of 32 KiB: page 0 full (gen 1), page 1 a tenth used (gen 0),
    /// pages 2-3 free but resident, the rest never touched.
    #[test]
    fn the_space_splits_into_objects_free_space_in_used_pages_and_free_pages() {
        let start = 0x1000_0000u64;
        let page = 32 << 10;
        let heap = SbclHeap {
            version: "2.2.9".into(),
            dynamic_space_start: start,
            dynamic_space_size: 8 * page,
            page_bytes: page,
            next_free_page: 4,
            page_types: vec!["boxed".into()],
            generations: vec![
                SbclGenerationFigures {
                    gen: 0,
                    pages: 1,
                    bytes_used: page / 10,
                    ..Default::default()
                },
                SbclGenerationFigures {
                    gen: 1,
                    pages: 1,
                    bytes_used: page,
                    ..Default::default()
                },
            ],
            pages: vec![
                SbclPageUse {
                    index: 0,
                    bytes_used: page as u32,
                    gen: 1,
                    ..Default::default()
                },
                SbclPageUse {
                    index: 1,
                    bytes_used: (page / 10) as u32,
                    gen: 0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        // 4 KiB OS pages: the first 32 (4 SBCL pages) resident.
        let pm = Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![ResidentRange {
                start,
                pages: 64,
                resident: vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
                ..Default::default()
            }],
        };
        let p = split(&heap, &pm);
        assert_eq!(p.resident, 4 * page);
        assert_eq!(p.in_use, page + page / 10);
        assert_eq!(p.free_in_used_pages, page - page / 10);
        assert_eq!(p.free_pages, 2 * page);
        assert_eq!(p.generations.len(), 2);
        assert_eq!(p.generations[1].resident, page);
        assert_eq!(p.page_fill[0].count, 1); // just under 10%: the first bucket
        assert_eq!(p.page_fill[9].count, 1);
    }

    /// A census whose mark was refused carries the sentence into the report's JSON, and
    /// one that marked or never asked has no such field.
    #[test]
    fn a_refused_mark_says_why_in_the_report() {
        let heap = SbclHeap {
            version: "2.5.2.debian".into(),
            page_bytes: 32 << 10,
            mark_refused: Some("static space does not hold the symbol *FREE-TLS-INDEX*".into()),
            ..Default::default()
        };
        let pm = Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: Vec::new(),
        };
        let p = split(&heap, &pm);
        assert_eq!(p.mark_refused, heap.mark_refused);
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(
            json["mark_refused"],
            "static space does not hold the symbol *FREE-TLS-INDEX*"
        );
        let quiet = split(
            &SbclHeap {
                mark_refused: None,
                ..heap
            },
            &pm,
        );
        assert!(serde_json::to_value(&quiet)
            .unwrap()
            .get("mark_refused")
            .is_none());
    }

    /// Seed 004: octet vectors promoted to generation 3 that died there. A census that
    /// marked names them; the same census unmarked says nothing of garbage.
    #[test]
    fn promoted_garbage_makes_the_headline_only_when_the_census_marked() {
        let page = 32u64 << 10;
        let octets = OBJECT_CLASSES
            .iter()
            .position(|&c| c == "octet vectors")
            .unwrap();
        let mut by_gen = vec![vec![(0u64, 0u64); OBJECT_CLASSES.len()]; 8];
        by_gen[3][octets] = (300, 258 << 20);
        by_gen[0][0] = (10, 1 << 20);
        let mut live = vec![vec![(0u64, 0u64); OBJECT_CLASSES.len()]; 8];
        live[3][octets] = (5, 4 << 20);
        live[0][0] = (10, 1 << 20);
        let heap = SbclHeap {
            version: "2.2.9".into(),
            dynamic_space_start: 0x1000_0000,
            dynamic_space_size: 8 << 30,
            page_bytes: page,
            generations: vec![SbclGenerationFigures {
                gen: 3,
                pages: 8300,
                bytes_used: 259 << 20,
                ..Default::default()
            }],
            // 259 MiB of full pages.
            pages: (0..(259u64 << 20) / page)
                .map(|i| SbclPageUse {
                    index: i as u32,
                    bytes_used: page as u32,
                    gen: 3,
                    ..Default::default()
                })
                .collect(),
            objects: Some(vec![(310, 259 << 20); OBJECT_CLASSES.len()]),
            objects_by_generation: by_gen,
            live_by_generation: Some(live),
            mark_us: 900,
            ..Default::default()
        };
        let pm = Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: 4096,
            ranges: vec![],
        };
        let p = split(&heap, &pm);
        assert_eq!(p.garbage, Some(254 << 20));
        let (dominant, sentence) = garbage_headline(&p).expect("a headline");
        assert_eq!(dominant, "sbcl_promoted_garbage");
        assert!(
            sentence.starts_with(
                "254 MiB of octet vectors in generation 3 are garbage that only a full GC \
                 reclaims: they were promoted before dying (SBCL 2.2.9: 254 MiB of the \
                 dynamic space's 259 MiB in use"
            ),
            "{sentence}"
        );
        assert!(sentence.contains("static-vectors"), "{sentence}");
        let unmarked = split(
            &SbclHeap {
                live_by_generation: None,
                ..heap
            },
            &pm,
        );
        assert_eq!(unmarked.garbage, None);
        assert!(garbage_headline(&unmarked).is_none());
        assert!(unmarked.generations[0].objects.as_ref().unwrap()[octets]
            .garbage
            .is_none());
    }
}
