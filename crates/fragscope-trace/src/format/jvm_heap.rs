//! Chunk 26: a HotSpot JVM's Java heap and the runtime areas around it, read from outside
//! the process (fragscope-census's `jvm`) at a snapshot. The body of a [`Census`]; the
//! model splits it by the snapshot's residency.

use crate::format::records::{Census, CensusBody};
use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

pub type JvmCensus = Census<JvmHeap>;

/// One category of the JVM's native memory tracking: name, reserved and committed bytes.
pub type NativeCategory = (String, u64, u64);

/// The collector whose heap the census read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JvmCollector {
    G1 = 1,
    Parallel = 2,
    Serial = 3,
}

impl JvmCollector {
    pub fn name(self) -> &'static str {
        match self {
            JvmCollector::G1 => "G1",
            JvmCollector::Parallel => "Parallel",
            JvmCollector::Serial => "Serial",
        }
    }
}

/// What a space of the Java heap holds: one G1 region, or one space of a generation
/// (eden, the survivor spaces, the old generation's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JvmSpaceKind {
    /// A committed G1 region with nothing in it.
    Free = 0,
    Eden = 1,
    Survivor = 2,
    Old = 3,
    /// The first region of a humongous object (one of at least half a region).
    HumongousStart = 4,
    /// A further region of a humongous object.
    HumongousContinues = 5,
    /// A region of the class data sharing archive's objects.
    Archive = 6,
}

impl JvmSpaceKind {
    pub const ALL: [JvmSpaceKind; 7] = [
        JvmSpaceKind::Eden,
        JvmSpaceKind::Survivor,
        JvmSpaceKind::Old,
        JvmSpaceKind::HumongousStart,
        JvmSpaceKind::HumongousContinues,
        JvmSpaceKind::Archive,
        JvmSpaceKind::Free,
    ];

    pub fn name(self) -> &'static str {
        match self {
            JvmSpaceKind::Free => "free",
            JvmSpaceKind::Eden => "eden",
            JvmSpaceKind::Survivor => "survivor",
            JvmSpaceKind::Old => "old",
            JvmSpaceKind::HumongousStart => "humongous",
            JvmSpaceKind::HumongousContinues => "humongous (continued)",
            JvmSpaceKind::Archive => "archive",
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }
}

/// A space of the Java heap: objects from `bottom` to `top`, room to `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JvmSpace {
    pub kind: JvmSpaceKind,
    pub bottom: u64,
    pub top: u64,
    pub end: u64,
}

impl JvmSpace {
    pub fn used(&self) -> u64 {
        self.top - self.bottom
    }
    pub fn bytes(&self) -> u64 {
        self.end - self.bottom
    }
}

/// A runtime area outside the Java heap that the JVM's own tables locate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JvmAreaKind {
    /// The code cache: compiled methods, stubs, the interpreter (its reserved range).
    CodeCache = 1,
    /// A Java thread's stack.
    ThreadStack = 2,
    /// The collector's card table (one byte per 512 bytes of heap).
    CardTable = 3,
    /// The class data sharing archive: classes mapped from the JDK's classes.jsa, a file
    /// mapping whose pages the JVM writes to become its own copies (anonymous memory the
    /// snapshot's residency, which reads anonymous mappings, does not see:
    /// [`JvmHeap::archive_copied`] counts them).
    ClassDataArchive = 4,
}

impl JvmAreaKind {
    pub const ALL: [JvmAreaKind; 4] = [
        JvmAreaKind::CodeCache,
        JvmAreaKind::ThreadStack,
        JvmAreaKind::CardTable,
        JvmAreaKind::ClassDataArchive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            JvmAreaKind::CodeCache => "code cache",
            JvmAreaKind::ThreadStack => "Java thread stacks",
            JvmAreaKind::CardTable => "card table",
            JvmAreaKind::ClassDataArchive => "class data archive (copied pages)",
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }
}

/// The census: the heap's spaces in address order, the runtime areas, and the figures
/// the JVM keeps itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JvmHeap {
    /// The VM's release, as "17.0.15+6-Debian-1deb12u1".
    pub jvm: String,
    pub collector: JvmCollector,
    /// The address range reserved for the heap (-Xmx of it).
    pub reserved: (u64, u64),
    /// G1's region size (0 for the other collectors).
    pub region_bytes: u64,
    pub spaces: Vec<JvmSpace>,
    pub areas: Vec<(JvmAreaKind, u64, u64)>,
    /// Resident pages of the class data archive that the JVM wrote to (its own copies of
    /// the file's pages), in bytes, read from pagemap with the census.
    pub archive_copied: u64,
    /// The JVM's own account by category (`VM.native_memory summary`: name, reserved and
    /// committed bytes), asked just after the census when native memory tracking is on;
    /// None when it is off, Err why it could not be asked.
    pub native_memory: Option<Result<Vec<NativeCategory>, String>>,
    /// The collector's own figures of the heap: committed and used (as `jcmd GC.heap_info`
    /// and jstat give them).
    pub committed: u64,
    pub used: u64,
    /// -Xmx and -Xms as the JVM took them (`MaxHeapSize`, `InitialHeapSize`), and the
    /// free ratios that decide when the heap grows or shrinks.
    pub max_heap: u64,
    pub initial_heap: u64,
    pub min_free_ratio: u8,
    pub max_free_ratio: u8,
    /// How long the program was stopped for the census, in microseconds.
    pub pause_us: u64,
}

impl CensusBody for JvmHeap {
    const WHAT: &'static str = "a JVM heap census";

    fn encode_body(&self, w: &mut Writer) {
        w.str(&self.jvm)
            .u8(self.collector as u8)
            .varint(self.reserved.0)
            .varint(self.reserved.1.wrapping_sub(self.reserved.0))
            .varint(self.region_bytes)
            .varint(self.committed)
            .varint(self.used)
            .varint(self.max_heap)
            .varint(self.initial_heap)
            .u8(self.min_free_ratio)
            .u8(self.max_free_ratio)
            .varint(self.pause_us)
            .varint(self.spaces.len() as u64);
        // Bottoms as steps from the space before: mostly one region.
        let mut prev = 0u64;
        for s in &self.spaces {
            w.u8(s.kind as u8)
                .varint(s.bottom.wrapping_sub(prev))
                .varint(s.top.wrapping_sub(s.bottom))
                .varint(s.end.wrapping_sub(s.bottom));
            prev = s.bottom;
        }
        w.varint(self.areas.len() as u64);
        for &(kind, lo, hi) in &self.areas {
            w.u8(kind as u8).varint(lo).varint(hi.wrapping_sub(lo));
        }
        w.varint(self.archive_copied);
        match &self.native_memory {
            None => {
                w.u8(0);
            }
            Some(Err(why)) => {
                w.u8(2).str(why);
            }
            Some(Ok(categories)) => {
                w.u8(1).varint(categories.len() as u64);
                for (name, reserved, committed) in categories {
                    w.str(name).varint(*reserved).varint(*committed);
                }
            }
        }
    }

    fn decode_body(r: &mut Reader) -> Result<Self, TraceError> {
        let malformed = |what: String| TraceError::Malformed(what);
        let jvm = r.string()?;
        let collector = match r.u8()? {
            1 => JvmCollector::G1,
            2 => JvmCollector::Parallel,
            3 => JvmCollector::Serial,
            c => return Err(malformed(format!("a JVM heap census of collector {c}"))),
        };
        let lo = r.varint()?;
        let reserved = (lo, lo.wrapping_add(r.varint()?));
        let region_bytes = r.varint()?;
        let (committed, used, max_heap, initial_heap) =
            (r.varint()?, r.varint()?, r.varint()?, r.varint()?);
        let (min_free_ratio, max_free_ratio) = (r.u8()?, r.u8()?);
        let pause_us = r.varint()?;
        let n = r.count(4)?;
        let mut spaces = Vec::with_capacity(n);
        let mut prev = 0u64;
        for _ in 0..n {
            let k = r.u8()?;
            let kind = JvmSpaceKind::from_u8(k)
                .ok_or_else(|| malformed(format!("a JVM heap space of unknown kind {k}")))?;
            let bottom = prev.wrapping_add(r.varint()?);
            let (used, bytes) = (r.varint()?, r.varint()?);
            if used > bytes || bottom.checked_add(bytes).is_none() {
                return Err(malformed(format!(
                    "a JVM heap space at {bottom:#x} using {used} of {bytes} bytes"
                )));
            }
            spaces.push(JvmSpace {
                kind,
                bottom,
                top: bottom + used,
                end: bottom + bytes,
            });
            prev = bottom;
        }
        let n = r.count(3)?;
        let mut areas = Vec::with_capacity(n);
        for _ in 0..n {
            let k = r.u8()?;
            let kind = JvmAreaKind::from_u8(k)
                .ok_or_else(|| malformed(format!("a JVM area of unknown kind {k}")))?;
            let lo = r.varint()?;
            let len = r.varint()?;
            let hi = lo
                .checked_add(len)
                .ok_or_else(|| malformed(format!("a JVM area of {len} bytes at {lo:#x}")))?;
            areas.push((kind, lo, hi));
        }
        let archive_copied = r.varint()?;
        let native_memory = match r.u8()? {
            0 => None,
            1 => {
                let n = r.count(3)?;
                let mut categories = Vec::with_capacity(n);
                for _ in 0..n {
                    categories.push((r.string()?, r.varint()?, r.varint()?));
                }
                Some(Ok(categories))
            }
            2 => Some(Err(r.string()?)),
            k => {
                return Err(malformed(format!(
                    "JVM native memory of unknown outcome {k}"
                )))
            }
        };
        Ok(JvmHeap {
            jvm,
            collector,
            reserved,
            region_bytes,
            spaces,
            areas,
            archive_copied,
            native_memory,
            committed,
            used,
            max_heap,
            initial_heap,
            min_free_ratio,
            max_free_ratio,
            pause_us,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::SnapshotReason;

    #[test]
    fn jvm_censuses_round_trip_and_refuse_cut_bodies() {
        let region = 4u64 << 20;
        let base = 0x6_8740_0000u64;
        let space = |i: u64, kind, used| JvmSpace {
            kind,
            bottom: base + i * region,
            top: base + i * region + used,
            end: base + (i + 1) * region,
        };
        let taken = JvmCensus {
            stream: 3,
            tick: 41,
            reason: SnapshotReason::NearPeak,
            result: Ok(JvmHeap {
                jvm: "17.0.15+6-Debian-1deb12u1".into(),
                collector: JvmCollector::G1,
                reserved: (base, base + (6u64 << 30)),
                region_bytes: region,
                spaces: vec![
                    space(0, JvmSpaceKind::Old, region - 100),
                    space(1, JvmSpaceKind::HumongousStart, region),
                    space(2, JvmSpaceKind::HumongousContinues, 4096),
                    space(3, JvmSpaceKind::Free, 0),
                    space(9, JvmSpaceKind::Eden, 12345),
                ],
                areas: vec![
                    (JvmAreaKind::CodeCache, 0x7f00_0000_0000, 0x7f00_0f00_0000),
                    (JvmAreaKind::ThreadStack, 0x7f10_0000_0000, 0x7f10_0010_0000),
                ],
                archive_copied: 9 << 20,
                native_memory: Some(Ok(vec![("Java Heap".into(), 6 << 30, 160 << 20)])),
                committed: 40 * region,
                used: 3 * region,
                max_heap: 6 << 30,
                initial_heap: 384 << 20,
                min_free_ratio: 40,
                max_free_ratio: 70,
                pause_us: 812,
            }),
        };
        let bytes = taken.encode();
        assert_eq!(JvmCensus::decode(&bytes).unwrap(), taken);
        for cut in 0..bytes.len() {
            assert!(JvmCensus::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let refused = JvmCensus {
            stream: 0,
            tick: 1,
            reason: SnapshotReason::Periodic,
            result: Err("this JVM runs ZGC".into()),
        };
        assert_eq!(JvmCensus::decode(&refused.encode()).unwrap(), refused);
    }
}
