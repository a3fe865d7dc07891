//! What /proc said of a process's memory: its mappings, RSS samples, smaps_rollup
//! readings and page-residency snapshots.

use crate::format::wire::{Reader, Writer};
use crate::format::TraceError;

/// One line of /proc/PID/maps, with the file's GNU build-id when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// r, w, x, p/s as in /proc/PID/maps.
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
    pub build_id: Vec<u8>,
}

/// Chunk 4: the memory map of a process at a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Maps {
    pub stream: u32,
    pub tick: u64,
    pub mappings: Vec<Mapping>,
}

impl Maps {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .varint(self.mappings.len() as u64);
        for m in &self.mappings {
            w.varint(m.start)
                .varint(m.end - m.start)
                .str(&m.perms)
                .varint(m.offset)
                .varint(m.inode);
            w.str(&m.path).bytes(&m.build_id);
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let n = r.count(7)?;
        let mut mappings = Vec::with_capacity(n);
        for _ in 0..n {
            let start = r.varint()?;
            let len = r.varint()?;
            mappings.push(Mapping {
                start,
                end: start.saturating_add(len),
                perms: r.string()?,
                offset: r.varint()?,
                inode: r.varint()?,
                path: r.string()?,
                build_id: r.bytes()?.to_vec(),
            });
        }
        Ok(Self {
            stream,
            tick,
            mappings,
        })
    }
}

/// One reading of /proc/PID/status, in KiB as the kernel reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RssSample {
    pub tick: u64,
    pub vm_rss_kib: u64,
    pub rss_anon_kib: u64,
    pub rss_file_kib: u64,
    pub rss_shmem_kib: u64,
}

/// Chunk 5: a batch of RSS samples of one process, in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct RssBatch {
    pub stream: u32,
    pub samples: Vec<RssSample>,
}

impl RssBatch {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.samples.len() as u64);
        let mut prev = 0;
        for s in &self.samples {
            w.varint(s.tick.saturating_sub(prev))
                .varint(s.vm_rss_kib)
                .varint(s.rss_anon_kib);
            w.varint(s.rss_file_kib).varint(s.rss_shmem_kib);
            prev = s.tick;
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let n = r.count(5)?;
        let mut samples = Vec::with_capacity(n);
        let mut tick = 0u64;
        for _ in 0..n {
            tick = tick.saturating_add(r.varint()?);
            samples.push(RssSample {
                tick,
                vm_rss_kib: r.varint()?,
                rss_anon_kib: r.varint()?,
                rss_file_kib: r.varint()?,
                rss_shmem_kib: r.varint()?,
            });
        }
        Ok(Self { stream, samples })
    }
}

/// Chunk 6: /proc/PID/smaps_rollup at a tick: (field, KiB) as the kernel names them
/// (Rss, Pss, Anonymous, LazyFree, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    pub stream: u32,
    pub tick: u64,
    pub fields: Vec<(String, u64)>,
}

impl Rollup {
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .varint(self.fields.len() as u64);
        for (name, kib) in &self.fields {
            w.str(name).varint(*kib);
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let n = r.count(2)?;
        let fields = (0..n)
            .map(|_| Ok((r.string()?, r.varint()?)))
            .collect::<Result<_, TraceError>>()?;
        Ok(Self {
            stream,
            tick,
            fields,
        })
    }
}

/// Why a page-residency snapshot was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotReason {
    Periodic = 0,
    NearPeak = 1,
    Exit = 2,
}

/// A range of pages and which of them were resident (bit i of byte i/8: page i).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResidentRange {
    pub start: u64,
    pub pages: u64,
    pub resident: Vec<u8>,
    /// Which resident pages were mapped by another process too (pagemap's "exclusively
    /// mapped" bit clear: a copy-on-write page still shared with a parent or a sibling
    /// after fork), in the same layout; empty when not read (traces before it).
    pub shared: Vec<u8>,
}

impl ResidentRange {
    pub fn is_resident(&self, page: u64) -> bool {
        page < self.pages
            && self
                .resident
                .get((page / 8) as usize)
                .is_some_and(|b| b >> (page % 8) & 1 == 1)
    }
    pub fn resident_pages(&self) -> u64 {
        self.resident
            .iter()
            .map(|b| u64::from(b.count_ones()))
            .sum()
    }
    /// Whether resident page `page` was mapped by another process too; None when the
    /// trace did not record it.
    pub fn is_shared(&self, page: u64) -> Option<bool> {
        if self.shared.is_empty() {
            return None;
        }
        Some(
            self.is_resident(page)
                && self
                    .shared
                    .get((page / 8) as usize)
                    .is_some_and(|b| b >> (page % 8) & 1 == 1),
        )
    }
    /// Resident pages mapped by another process too (0 when not recorded).
    pub fn shared_pages(&self) -> u64 {
        self.shared
            .iter()
            .zip(&self.resident)
            .map(|(s, r)| u64::from((s & r).count_ones()))
            .sum()
    }
}

/// The tag of a Pagemap's tail of shared-page bitmaps.
const PAGEMAP_SHARED: u8 = 1;

/// Chunk 7: page residency (/proc/PID/pagemap) of the mappings that can hold heap objects.
#[derive(Debug, Clone, PartialEq)]
pub struct Pagemap {
    pub stream: u32,
    pub tick: u64,
    pub reason: SnapshotReason,
    pub page_size: u32,
    pub ranges: Vec<ResidentRange>,
}

impl Pagemap {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.varint(self.stream.into())
            .varint(self.tick)
            .u8(self.reason as u8);
        w.varint(self.page_size.into())
            .varint(self.ranges.len() as u64);
        for r in &self.ranges {
            w.varint(r.start).varint(r.pages).bytes(&r.resident);
        }
        // Added later, as a tail older readers ignore: the shared bitmaps, when read.
        if self.ranges.iter().any(|r| !r.shared.is_empty()) {
            w.u8(PAGEMAP_SHARED);
            for r in &self.ranges {
                w.bytes(&r.shared);
            }
        }
        w.bytes
    }
    pub fn decode(data: &[u8]) -> Result<Self, TraceError> {
        let mut r = Reader::new(data);
        let stream = r.varint()? as u32;
        let tick = r.varint()?;
        let reason = match r.u8()? {
            1 => SnapshotReason::NearPeak,
            2 => SnapshotReason::Exit,
            _ => SnapshotReason::Periodic,
        };
        let page_size = r.varint()? as u32;
        let n = r.count(3)?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            let start = r.varint()?;
            let pages = r.varint()?;
            let resident = r.bytes()?.to_vec();
            if (resident.len() as u64) < pages.div_ceil(8) {
                return Err(TraceError::Malformed(
                    "a residency bitmap is shorter than its range".into(),
                ));
            }
            ranges.push(ResidentRange {
                start,
                pages,
                resident,
                shared: Vec::new(),
            });
        }
        if !r.is_empty() && r.u8()? == PAGEMAP_SHARED {
            for range in &mut ranges {
                let shared = r.bytes()?;
                if !shared.is_empty() && (shared.len() as u64) < range.pages.div_ceil(8) {
                    return Err(TraceError::Malformed(
                        "a shared-page bitmap is shorter than its range".into(),
                    ));
                }
                range.shared = shared.to_vec();
            }
        }
        Ok(Self {
            stream,
            tick,
            reason,
            page_size,
            ranges,
        })
    }
}
