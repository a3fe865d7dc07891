//! A JVM's Java heap at a snapshot: its collector's regions or spaces (fragscope-census's
//! `jvm`, chunk 26) split by the snapshot's residency into objects, free space of the
//! young generation, free space beside old objects, and committed regions with nothing in
//! them; the runtime areas the JVM's tables locate (code cache, Java thread stacks, card
//! table) beside; with the headline in the JVM's terms.

use fragscope_trace::jvm_heap::{JvmAreaKind, JvmCollector, JvmHeap, JvmSpaceKind};
use fragscope_trace::records::Pagemap;
use serde::Serialize;

use crate::heap::Residency;
use crate::pymalloc::{add_to, fill_buckets, fill_words, FillBucket};

/// The spaces of one kind (G1: regions of one type).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JvmSpaces {
    pub kind: &'static str,
    pub spaces: u64,
    pub bytes: u64,
    /// Bytes from the spaces' bottoms to their tops: objects, live or not yet collected.
    pub used: u64,
    pub resident: u64,
}

/// A runtime area of the JVM outside its heap.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JvmArea {
    pub area: &'static str,
    pub count: u64,
    /// Bytes of its address ranges (reserved: the code cache's is mostly never touched).
    pub bytes: u64,
    pub resident: u64,
}

/// One category of the JVM's native memory tracking: what it reserved and committed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NativeMemory {
    pub category: String,
    pub reserved: u64,
    pub committed: u64,
}

/// The split of a Java heap's resident bytes at one snapshot: `objects + young_free +
/// old_free + free_regions == resident`. `committed` and `used` are the census's;
/// `*_reported` the collector's own counters of the same (jstat's).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JvmParts {
    /// The VM's release, as "17.0.15+6-Debian-1deb12u1".
    pub jvm: String,
    pub collector: &'static str,
    /// G1's region size (0 for the other collectors).
    pub region_bytes: u64,
    /// -Xmx and -Xms as the JVM took them, and its free ratios.
    pub max_heap: u64,
    pub initial_heap: u64,
    pub min_free_ratio: u8,
    pub max_free_ratio: u8,
    pub reserved: u64,
    pub committed: u64,
    pub used: u64,
    pub committed_reported: u64,
    pub used_reported: u64,
    /// Resident bytes of the heap's committed spaces.
    pub resident: u64,
    /// Resident bytes from the spaces' bottoms to their tops: objects (live, or dead and
    /// not collected yet).
    pub objects: u64,
    /// Resident free bytes of eden and the survivor spaces: room the young generation
    /// allocates into before its next collection.
    pub young_free: u64,
    /// Resident free bytes of spaces that hold old objects (old, humongous, archive):
    /// tails of regions, the old generation's room.
    pub old_free: u64,
    /// Resident bytes of committed G1 regions with nothing in them.
    pub free_regions: u64,
    /// Humongous objects (each in regions of its own: committed heap that counts against
    /// -Xmx), their regions, and the resident bytes of those regions. The rest of an
    /// object's last region holds a filler object the JVM writes only the header of: its
    /// pages stay untouched, committed but not resident.
    pub humongous_objects: u64,
    pub humongous_regions: u64,
    pub humongous_resident: u64,
    /// Resident bytes of humongous regions beyond their tops (none under G1's fillers).
    pub humongous_free: u64,
    /// Old regions (G1) by the share of their bytes used: 0-10%, ..., 90-100%.
    pub region_fill: Vec<FillBucket>,
    pub spaces: Vec<JvmSpaces>,
    pub areas: Vec<JvmArea>,
    /// Resident bytes of the runtime areas.
    pub runtime: u64,
    /// The JVM's own account by category when native memory tracking is on
    /// (`VM.native_memory summary`), and why it is missing when it could not be asked.
    pub native_memory: Vec<NativeMemory>,
    pub native_memory_note: Option<String>,
    pub pause_ms: f64,
}

impl JvmParts {
    /// Resident bytes of the heap that hold no object.
    pub fn waste(&self) -> u64 {
        self.young_free + self.old_free + self.free_regions
    }
}

/// `heap` split by the residency of its snapshot.
pub fn split(heap: &JvmHeap, pm: &Pagemap) -> JvmParts {
    let mut res = Residency::new(pm);
    let mut p = JvmParts {
        jvm: heap.jvm.clone(),
        collector: heap.collector.name(),
        region_bytes: heap.region_bytes,
        max_heap: heap.max_heap,
        initial_heap: heap.initial_heap,
        min_free_ratio: heap.min_free_ratio,
        max_free_ratio: heap.max_free_ratio,
        reserved: heap.reserved.1 - heap.reserved.0,
        committed: 0,
        used: 0,
        committed_reported: heap.committed,
        used_reported: heap.used,
        resident: 0,
        objects: 0,
        young_free: 0,
        old_free: 0,
        free_regions: 0,
        humongous_objects: 0,
        humongous_regions: 0,
        humongous_resident: 0,
        humongous_free: 0,
        region_fill: fill_buckets(),
        spaces: Vec::new(),
        areas: Vec::new(),
        runtime: 0,
        native_memory: Vec::new(),
        native_memory_note: None,
        pause_ms: heap.pause_us as f64 / 1000.0,
    };
    match &heap.native_memory {
        Some(Ok(categories)) => {
            p.native_memory = (categories.iter())
                .map(|(category, reserved, committed)| NativeMemory {
                    category: category.clone(),
                    reserved: *reserved,
                    committed: *committed,
                })
                .collect();
        }
        Some(Err(why)) => p.native_memory_note = Some(why.clone()),
        None => {}
    }
    for kind in JvmSpaceKind::ALL {
        let mut k = JvmSpaces {
            kind: kind.name(),
            spaces: 0,
            bytes: 0,
            used: 0,
            resident: 0,
        };
        for s in heap.spaces.iter().filter(|s| s.kind == kind) {
            let resident = res.resident_bytes(s.bottom, s.end);
            let objects = s.used().min(resident);
            k.spaces += 1;
            k.bytes += s.bytes();
            k.used += s.used();
            k.resident += resident;
            p.objects += objects;
            let free = resident - objects;
            match kind {
                JvmSpaceKind::Free => p.free_regions += resident,
                JvmSpaceKind::Eden | JvmSpaceKind::Survivor => p.young_free += free,
                JvmSpaceKind::Old | JvmSpaceKind::Archive => p.old_free += free,
                JvmSpaceKind::HumongousStart | JvmSpaceKind::HumongousContinues => {
                    p.old_free += free;
                    p.humongous_free += free;
                    p.humongous_regions += 1;
                    p.humongous_resident += resident;
                    p.humongous_objects += u64::from(kind == JvmSpaceKind::HumongousStart);
                }
            }
            if kind == JvmSpaceKind::Old && heap.collector == JvmCollector::G1 {
                add_to(&mut p.region_fill, s.used(), s.bytes());
            }
        }
        p.committed += k.bytes;
        p.used += k.used;
        p.resident += k.resident;
        if k.spaces > 0 {
            p.spaces.push(k);
        }
    }
    for kind in JvmAreaKind::ALL {
        let mut a = JvmArea {
            area: kind.name(),
            count: 0,
            bytes: 0,
            resident: 0,
        };
        for &(_, lo, hi) in heap.areas.iter().filter(|a| a.0 == kind) {
            a.count += 1;
            a.bytes += hi - lo;
            a.resident += match kind {
                // A file mapping: its copied pages were counted by the census.
                JvmAreaKind::ClassDataArchive => 0,
                _ => res.resident_bytes(lo, hi),
            };
        }
        if kind == JvmAreaKind::ClassDataArchive {
            a.resident = heap.archive_copied;
        }
        p.runtime += a.resident;
        if a.count > 0 {
            p.areas.push(a);
        }
    }
    p
}

/// What the census with the most waste says, when it is worth a headline (at least
/// 4 MiB and a quarter of the heap's resident bytes): the dominant part and a sentence
/// with what helps, in the JVM's terms. Never malloc's advice: none of this is malloc's.
pub fn headline(p: &JvmParts) -> Option<(&'static str, String)> {
    if p.waste() < 4 << 20 || p.waste() * 4 < p.resident {
        return None;
    }
    let held = format!(
        "{} of Java heap ({}, JDK {}) hold {} of objects ({}%)",
        crate::mib(p.resident),
        p.collector,
        p.jvm,
        crate::mib(p.objects),
        100 * p.objects / p.resident.max(1)
    );
    let sizing = format!(
        "-Xmx is {}, -Xms {}",
        crate::mib(p.max_heap),
        crate::mib(p.initial_heap)
    );
    let largest = [p.free_regions, p.old_free, p.young_free]
        .into_iter()
        .max()
        .unwrap_or(0);
    if largest == p.free_regions {
        return Some((
            "jvm_free_regions",
            format!(
                "{held}: {} is committed regions with nothing in them, which the JVM \
                 keeps. G1 gives regions back to the kernel only after a full collection \
                 or a concurrent cycle's remark finds more than MaxHeapFreeRatio ({}%) of \
                 the heap free, and an idle JVM may never run one: \
                 -XX:G1PeriodicGCInterval=<ms> (JDK 12 and later) starts such a cycle \
                 when the JVM is idle; a lower -Xmx caps the heap, and the heap never \
                 shrinks below -Xms ({sizing}).",
                crate::mib(p.free_regions),
                p.max_free_ratio
            ),
        ));
    }
    if largest == p.old_free {
        let fill = if p.collector == "G1" {
            format!(" (old regions most {})", fill_words(&p.region_fill))
        } else {
            String::new()
        };
        return Some((
            "jvm_old_free",
            format!(
                "{held}: {} is free space among old objects{fill}, resident since it last \
                 held some. The {} collector shrinks the old generation only after a full \
                 collection leaves more than MaxHeapFreeRatio ({}%) of it free; a lower \
                 -Xmx, or -XX:MaxHeapFreeRatio, makes it give memory back sooner \
                 ({sizing}).",
                crate::mib(p.old_free),
                p.collector,
                p.max_free_ratio
            ),
        ));
    }
    Some((
        "jvm_young_free",
        format!(
            "{held}: {} is eden and survivor space not allocated into since the last young \
             collection: the young generation's room, sized by the collector and touched \
             again before each collection. -Xmn or -XX:MaxNewSize caps it, at the cost of \
             more frequent young collections ({sizing}).",
            crate::mib(p.young_free)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fragscope_trace::jvm_heap::JvmSpace;
    use fragscope_trace::records::{ResidentRange, SnapshotReason};

    /// A G1 heap of four 4 MiB regions (old 10% used, humongous start full, humongous
    /// continued a quarter used, free) and a 4 MiB thread stack, every page resident but
    /// the free region's second half.
    #[test]
    fn regions_split_into_objects_free_space_and_free_regions() {
        let mib = 4u64 << 20;
        let base = 0x4000_0000u64;
        let space = |i: u64, kind, used| JvmSpace {
            kind,
            bottom: base + i * mib,
            top: base + i * mib + used,
            end: base + (i + 1) * mib,
        };
        let heap = JvmHeap {
            jvm: "17".into(),
            collector: JvmCollector::G1,
            reserved: (base, base + 64 * mib),
            region_bytes: mib,
            spaces: vec![
                space(0, JvmSpaceKind::Old, mib / 10),
                space(1, JvmSpaceKind::HumongousStart, mib),
                space(2, JvmSpaceKind::HumongousContinues, mib / 4),
                space(3, JvmSpaceKind::Free, 0),
            ],
            areas: vec![(JvmAreaKind::ThreadStack, 0x7000_0000, 0x7000_0000 + mib)],
            archive_copied: 0,
            native_memory: None,
            committed: 4 * mib,
            used: mib + mib / 4 + mib / 10,
            max_heap: 64 * mib,
            initial_heap: 4 * mib,
            min_free_ratio: 40,
            max_free_ratio: 70,
            pause_us: 300,
        };
        let page = 4096u64;
        let bits = |pages: u64| {
            let mut v = vec![0u8; pages.div_ceil(8) as usize];
            for p in 0..pages {
                v[(p / 8) as usize] |= 1 << (p % 8);
            }
            v
        };
        let pm = Pagemap {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            page_size: page as u32,
            ranges: vec![
                ResidentRange {
                    start: base,
                    pages: (3 * mib + mib / 2) / page,
                    resident: bits((3 * mib + mib / 2) / page),
                    shared: Vec::new(),
                },
                ResidentRange {
                    start: 0x7000_0000,
                    pages: mib / page,
                    resident: bits(mib / page),
                    shared: Vec::new(),
                },
            ],
        };
        let p = split(&heap, &pm);
        assert_eq!(p.resident, 3 * mib + mib / 2);
        assert_eq!(p.objects, mib / 10 + mib + mib / 4);
        assert_eq!(p.free_regions, mib / 2);
        assert_eq!(p.humongous_objects, 1);
        assert_eq!(p.humongous_free, mib - mib / 4);
        assert_eq!((p.humongous_regions, p.humongous_resident), (2, 2 * mib));
        assert_eq!(p.old_free, mib - mib / 10 + mib - mib / 4);
        assert_eq!(
            p.objects + p.young_free + p.old_free + p.free_regions,
            p.resident
        );
        assert_eq!(p.runtime, mib);
        assert_eq!(
            p.region_fill[0].count, 1,
            "the old region is just under 10% used"
        );
        let (part, _) = headline(&p).unwrap();
        assert_eq!(part, "jvm_old_free");
    }
}
