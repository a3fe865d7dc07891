//! The dynamic space's page table, decoded: each page in use with its generation and
//! type, pages and bytes by generation and type, and the allocation regions open at the
//! census (which the page table does not count yet).

use super::*;

/// The page type, the low bits of `struct page`'s `type` (PAGE_TYPE_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageType {
    Unboxed,
    Boxed,
    Mixed,
    /// Objects that do not span GC cards (symbols, fdefns, weak pointers...).
    SmallMixed,
    Cons,
    Code,
}

impl PageType {
    pub const ALL: [PageType; 6] = [
        PageType::Unboxed,
        PageType::Boxed,
        PageType::Mixed,
        PageType::SmallMixed,
        PageType::Cons,
        PageType::Code,
    ];

    pub(super) fn of_bits(bits: u8) -> Option<Self> {
        Some(match bits & PAGE_TYPE_MASK {
            1 => PageType::Unboxed,
            2 => PageType::Boxed,
            3 => PageType::Mixed,
            4 => PageType::SmallMixed,
            5 => PageType::Cons,
            7 => PageType::Code,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            PageType::Unboxed => "unboxed",
            PageType::Boxed => "boxed",
            PageType::Mixed => "mixed",
            PageType::SmallMixed => "small mixed",
            PageType::Cons => "cons",
            PageType::Code => "code",
        }
    }

    pub(super) fn index(self) -> usize {
        PageType::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }
}

/// One page of the dynamic space that is in use (its page-table entry, decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SbclPage {
    pub index: u32,
    /// Bytes the page table counts (`words_used_` × 8): closed allocations only.
    pub bytes_used: u32,
    /// Bytes of an open allocation region on this page, beyond `bytes_used`.
    pub open_bytes: u32,
    pub gen: u8,
    pub page_type: PageType,
    /// Part of one large object (SINGLE_OBJECT_FLAG).
    pub large: bool,
    /// Part of an allocation region a thread holds open (OPEN_REGION_PAGE_FLAG).
    pub open: bool,
}

impl SbclPage {
    /// Where the page starts in the process, for joining with its residency.
    pub fn address(&self, census: &SbclCensus) -> u64 {
        census.page_address(self.index)
    }
}

/// Pages and bytes of one kind (a generation, a page type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PageFigures {
    pub pages: u64,
    /// Bytes the page table counts as used.
    pub bytes_used: u64,
    /// Bytes in open allocation regions on these pages.
    pub open_bytes: u64,
    /// Of `pages`, those holding part of one large object, and its bytes.
    pub large_pages: u64,
    pub large_bytes: u64,
}

impl PageFigures {
    /// What the pages take from the dynamic space.
    pub fn bytes_held(&self) -> u64 {
        self.pages * PAGE_BYTES
    }

    pub(super) fn add(&mut self, p: &SbclPage) {
        self.pages += 1;
        self.bytes_used += u64::from(p.bytes_used);
        self.open_bytes += u64::from(p.open_bytes);
        if p.large {
            self.large_pages += 1;
            self.large_bytes += u64::from(p.bytes_used);
        }
    }
}

/// One generation: its pages, and the runtime's `struct generation`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SbclGeneration {
    pub gen: u8,
    pub pages: PageFigures,
    /// `bytes_allocated`: equals `pages.bytes_used` (checked).
    pub bytes_allocated: u64,
    /// A collection of this generation is due when it holds this many bytes.
    pub gc_trigger: u64,
    pub bytes_consed_between_gc: u64,
    /// Collections since its survivors were last raised to the next generation.
    pub num_gc: i32,
    /// Collections it takes before survivors are raised.
    pub number_of_gcs_before_promotion: i32,
    pub cum_sum_bytes_allocated: u64,
    pub minimum_age_before_gc: f64,
}

/// An allocation region open at the moment of the census: `[start, free)` holds objects
/// the page table and `bytes_allocated` do not count yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRegion {
    /// `thread 0x7f.. mixed`, or `global code` (gc_alloc_region).
    pub owner: String,
    pub start: u64,
    pub free: u64,
    pub end: u64,
}

/// The open allocation regions: every thread's six TLABs (threads found from
/// `all_threads`, each checked by its `this` field) and the runtime's gc_alloc_region.
pub(super) fn open_regions(
    mem: &mut ProcessMemory,
    rt: &SbclRuntime,
    start: u64,
    size: u64,
) -> Result<Vec<OpenRegion>, CensusError> {
    let mut out = Vec::new();
    let mut push = |owner: String, r: &[u8]| -> Result<(), CensusError> {
        let (free, end, begin) = (le_u64(r, 0), le_u64(r, 8), le_u64(r, 16));
        if begin == 0 {
            return Ok(()); // closed
        }
        if !(start <= begin && begin <= free && free <= end && end <= start + size) {
            return Err(inconsistent(format!(
                "the {owner} allocation region does not hold together (start {begin:#x}, \
                 free {free:#x}, end {end:#x})"
            )));
        }
        out.push(OpenRegion {
            owner,
            start: begin,
            free,
            end,
        });
        Ok(())
    };
    let mut global = vec![0u8; 24 * GLOBAL_REGIONS.len()];
    mem.read(rt.gc_alloc_region, &mut global)?;
    for (i, name) in GLOBAL_REGIONS.iter().enumerate() {
        push(format!("global {name}"), &global[i * 24..i * 24 + 24])?;
    }
    let mut thread = mem.read_u64(rt.all_threads)?;
    let mut seen = 0;
    let mut t = vec![0u8; rt.release.thread_tlabs.iter().max().map_or(0, |m| m + 24) as usize];
    while thread != 0 {
        seen += 1;
        if seen > MAX_THREADS {
            return Err(inconsistent(
                "the runtime's thread list does not end".into(),
            ));
        }
        mem.read(thread, &mut t)?;
        if le_u64(&t, rt.release.thread_this as usize) != thread {
            return Err(inconsistent(format!(
                "the thread structure at {thread:#x} does not point to itself: not the \
                 SBCL {} layout",
                rt.release.version
            )));
        }
        for (off, name) in rt.release.thread_tlabs.iter().zip(TLAB_NAMES) {
            let off = *off as usize;
            push(format!("thread {thread:#x} {name}"), &t[off..off + 24])?;
        }
        thread = le_u64(&t, rt.release.thread_next as usize);
    }
    Ok(out)
}
