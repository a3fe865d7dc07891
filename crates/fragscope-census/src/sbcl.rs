//! SBCL's generational collector (gencgc), read from outside the Lisp process.
//!
//! SBCL reserves one *dynamic space* (`DYNAMIC_SPACE_START`, `dynamic_space_size`) and
//! cuts it into 32 KiB pages, each described by an 8-byte entry of `page_table`
//! (src/runtime/gencgc-internal.h, `struct page`):
//!
//! | offset | field | read as |
//! |---|---|---|
//! | 0 | `scan_start_offset_` (u32) | 0: the page starts a contiguous block |
//! | 4 | bit 0 `need_zerofill`, bits 1-15 `words_used_` | bytes used: words × 8 |
//! | 6 | `type` | bits 0-3 page type, 16 single object (large), 32 open region |
//! | 7 | `gen` | the generation: 0-5, 6 pseudo-static (the core), 7 scratch |
//!
//! Pages below `next_free_page` are free or in use; those above were never used. The
//! runtime keeps per generation a `struct generation` (bytes_allocated, gc_trigger,
//! bytes_consed_between_gc, num_gc, number_of_gcs_before_promotion,
//! cum_sum_bytes_allocated, minimum_age_before_gc; 48 bytes, 8 of them in
//! `generations`) and a total, `bytes_allocated`, which is what `(room)` and
//! `sb-kernel:dynamic-usage` report. Both count closed allocation regions only: bytes a
//! thread allocated in its open region (its TLABs, in `struct thread`) are added when
//! the region closes, so the census reads those regions apart.
//!
//! Layouts are x86-64 SBCL 2.2.9's, 2.5.2's and 2.6.4's ([`RELEASES`]; Debian's builds, checked
//! against its debug information and generated headers, and against the running Lisp's
//! own figures). Each census checks itself: the page table's bytes per generation must
//! equal the runtime's counters, and the runtime's own tag and size tables
//! (`widetag_lowtag`, `sizetab`) must be the ones the object walk assumes; another
//! release is refused with a sentence saying so.
//!
//! On request the census also marks the objects reachable from the roots, as a full
//! collection would, and counts what is live and what is garbage ([`SbclMark`]; the
//! `mark` submodule says which roots and how).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fragscope_trace::heap_census::OCCUPANCY_BUCKETS;

use crate::ghc::CensusError;
use crate::memory::le_u64;
use crate::{Pause, ProcessMemory, Symbols};

mod mark;
mod objects;
mod pages;
pub use mark::{MarkRoots, SbclMark};
use objects::*;
pub use objects::{ObjectClass, ObjectFigures, SbclObjects};
use pages::*;
pub use pages::{OpenRegion, PageFigures, PageType, SbclGeneration, SbclPage};

/// GENCGC_PAGE_BYTES of x86-64 SBCL 2.2.x.
pub const PAGE_BYTES: u64 = 32 << 10;
/// 0-5 collected, 6 pseudo-static, 7 scratch (gencgc.c, NUM_GENERATIONS).
pub const GENERATIONS: usize = 8;
pub const PSEUDO_STATIC_GENERATION: u8 = 6;
const GENERATION_SIZE: u64 = 48;

// page type bits (gencgc-internal.h)
const PAGE_TYPE_MASK: u8 = 15;
const SINGLE_OBJECT_FLAG: u8 = 16;
const OPEN_REGION_PAGE_FLAG: u8 = 32;
/// THREAD_PAGE_FLAG (8) is tested but never set by 2.2.9's runtime; a page with it, or
/// with bits above the flags, is not the layout read here.
const KNOWN_TYPE_BITS: u8 = PAGE_TYPE_MASK | SINGLE_OBJECT_FLAG | OPEN_REGION_PAGE_FLAG;

/// What differs between the SBCL releases the census reads, one entry per release. The
/// page-table entry, `struct generation`, `struct alloc_region`, the widetags and the
/// objects' sizes are the same in all of them (their runtimes' debug information,
/// `/usr/lib/sbcl/sbcl.o`, and their `sb-vm` constants), and each census checks the
/// tag and size tables against the process's own (`check_tag_tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The release number `sbcl --version` starts with.
    pub version: &'static str,
    /// Which Debian release ships it (where it was verified).
    pub shipped_by: &'static str,
    /// `struct thread` (genesis/thread.h): its six allocation regions, boxed, cons, mixed,
    /// symbol, system mixed and system cons (`thread-*-tlab-slot` × 8).
    pub thread_tlabs: [u64; 6],
    /// Whether the runtime sizes unboxed numbers with a function of their own
    /// (`size_unboxed`) rather than `size_boxed`.
    size_unboxed: bool,
    /// The runtime's count of collections: `n_gcs_done` until 2.6 counts it only in
    /// builds that time their pauses; `n_lisp_gcs` (2.3 on) counts every one.
    collections_counter: &'static str,
    /// `this` and `next` in `struct thread`.
    pub thread_this: u64,
    thread_next: u64,
    /// `lisp_thread` in `struct thread`, its last field: the thread-local values start
    /// there (`&th->lisp_thread` in gencgc.c), up to `*FREE-TLS-INDEX*`'s value.
    pub(crate) thread_lisp_thread: u64,
    /// Where static space starts: a constant of the build (genesis/constants.h), or
    /// `None` when the runtime chooses it and exports it (`STATIC_SPACE_START`,
    /// `:relocatable-static-space`).
    pub(crate) static_space_start: Option<u64>,
    /// Whether the mark from the roots knows this release's roots (thread-local storage,
    /// static symbols, the runtime's C roots).
    pub mark: bool,
}

const TLAB_NAMES: [&str; 6] = [
    "boxed",
    "cons",
    "mixed",
    "symbol",
    "system mixed",
    "system cons",
];

/// The releases whose layouts fragscope has verified: Debian 12's, 13's and unstable's.
pub const RELEASES: [Release; 3] = [
    Release {
        version: "2.2.9",
        shipped_by: "Debian 12",
        thread_tlabs: [64, 88, 112, 256, 280, 304],
        size_unboxed: false,
        collections_counter: "n_gcs_done",
        thread_this: 192,
        thread_next: 208,
        thread_lisp_thread: 1144,
        static_space_start: Some(0x5000_0000),
        mark: true,
    },
    Release {
        version: "2.5.2",
        shipped_by: "Debian 13",
        thread_tlabs: [64, 88, 112, 272, 296, 320],
        size_unboxed: false,
        collections_counter: "n_lisp_gcs",
        thread_this: 192,
        thread_next: 208,
        thread_lisp_thread: 1168,
        static_space_start: Some(0x5000_0000),
        mark: true,
    },
    Release {
        version: "2.6.4",
        shipped_by: "Debian unstable",
        thread_tlabs: [64, 88, 112, 280, 304, 328],
        size_unboxed: true,
        collections_counter: "n_lisp_gcs",
        thread_this: 192,
        thread_next: 208,
        thread_lisp_thread: 384,
        static_space_start: None,
        mark: true,
    },
];

/// The verified releases, for sentences: "2.2.9 (Debian 12), 2.5.2 (Debian 13) ...".
pub fn verified_releases() -> String {
    RELEASES
        .iter()
        .map(|r| format!("{} ({})", r.version, r.shipped_by))
        .collect::<Vec<_>>()
        .join(", ")
}

/// gc_alloc_region[6]: mixed, small mixed, unboxed, code, boxed, cons.
const GLOBAL_REGIONS: [&str; 6] = ["mixed", "small mixed", "unboxed", "code", "boxed", "cons"];
const MAX_THREADS: u64 = 1 << 16;
/// 4 TiB of dynamic space: more is a misread, not a heap.
const MAX_PAGES: u64 = 1 << 27;

/// A filler's widetag: space inside a used page that holds no object (its size in the
/// header's high 32 bits).
const FILLER_WIDETAG: u8 = 109;
/// A word of all ones starts a two-word pseudo-cons, left where a bignum was shortened;
/// room.lisp skips it without counting it.
const PSEUDO_CONS: u64 = u64::MAX;

const SYMBOLS: [&str; 14] = [
    "DYNAMIC_SPACE_START",
    "dynamic_space_size",
    "page_table",
    "page_table_pages",
    "next_free_page",
    "bytes_allocated",
    "generations",
    "gc_alloc_region",
    "all_threads",
    "gc_active_p",
    "n_gcs_done",
    "n_lisp_gcs",
    "widetag_lowtag",
    "sizetab",
];

/// What the mark from the roots reads beyond the census's variables: the other spaces'
/// bounds and the runtime's own roots (C variables holding Lisp objects).
const MARK_SYMBOLS: [&str; 10] = [
    "FIXEDOBJ_SPACE_START",
    "fixedobj_free_pointer",
    "TEXT_SPACE_START",
    "text_space_highwatermark",
    "static_space_free_pointer",
    "lisp_sig_handlers",
    "lisp_package_vector",
    "lisp_init_function",
    "alloc_profile_data",
    "sb_sprof_enabled",
];

/// What the mark reads when the runtime has it: a C root only 2.2.9 keeps
/// (`gc_object_watcher`), a static space placed at run time (`STATIC_SPACE_START`, with
/// its trailer of static constants, NIL and T among them, 2.6), and the permanent
/// generation's space (`permgen_bounds[2]`, `permgen_space_free_pointer`, 2.5 on; empty
/// unless a core put objects there).
const MARK_OPTIONAL_SYMBOLS: [&str; 5] = [
    "gc_object_watcher",
    "STATIC_SPACE_START",
    "static_space_trailer_start",
    "permgen_bounds",
    "permgen_space_free_pointer",
];

/// An SBCL runtime whose heap the census can read: where its variables are.
#[derive(Debug, Clone)]
pub struct SbclRuntime {
    /// As `sbcl --version` prints it, e.g. `2.2.9.debian`.
    pub version: String,
    /// Its entry of [`RELEASES`].
    pub release: Release,
    dynamic_space_start: u64,
    dynamic_space_size: u64,
    page_table: u64,
    page_table_pages: u64,
    next_free_page: u64,
    bytes_allocated: u64,
    generations: u64,
    gc_alloc_region: u64,
    all_threads: u64,
    gc_active_p: u64,
    collections_counter: u64,
    widetag_lowtag: u64,
    sizetab: u64,
    /// Where [`MARK_SYMBOLS`] are, in that order; Err says which one is missing.
    mark_symbols: Result<Vec<u64>, String>,
    /// Where [`MARK_OPTIONAL_SYMBOLS`] are, in that order, those the runtime has.
    mark_optional: Vec<Option<u64>>,
}

impl SbclRuntime {
    /// The runtime of process `pid`: Err says why there is no census (not an SBCL
    /// process, or a release whose layout fragscope has not verified).
    pub fn of_process(pid: u32) -> Result<Self, String> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(|e| format!("no process {pid} to read ({e})"))?;
        let elf = std::fs::read(&exe).map_err(|e| format!("cannot read {}: {e}", exe.display()))?;
        Self::new(&elf, Some(pid)).map_err(|e| format!("process {pid} ({}): {e}", exe.display()))
    }

    /// `None` when process `pid` is not an SBCL runtime (its executable exports no gencgc
    /// page table); else its runtime, or why its census cannot be read.
    pub fn detect(pid: u32) -> Option<Result<Self, String>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let elf = crate::image::map(&exe).ok()?;
        let exported = Symbols::resolve(&elf, &SYMBOLS, None).ok()?;
        if ["page_table", "next_free_page", "DYNAMIC_SPACE_START"]
            .iter()
            .any(|n| exported.get(n).is_none())
        {
            return None;
        }
        Some(
            Self::new(&elf, Some(pid))
                .map_err(|e| format!("process {pid} ({}): {e}", exe.display())),
        )
    }

    /// Finds the runtime's variables in `elf` (the executable's bytes; `pid` places them
    /// when it is position-independent) and checks its release.
    pub fn new(elf: &[u8], pid: Option<u32>) -> Result<Self, String> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(elf).map_err(|e| format!("not an ELF file ({e})"))?;
        // An SBCL runtime exports these; another program has none of them. Asked before
        // the process's maps are read, so that any other program gets this answer.
        let exported = Symbols::resolve(elf, &SYMBOLS, None)?;
        if ["page_table", "next_free_page", "DYNAMIC_SPACE_START"]
            .iter()
            .any(|n| exported.get(n).is_none())
        {
            return Err(
                "not an SBCL process: its executable exports no gencgc page table \
                        (page_table, next_free_page, DYNAMIC_SPACE_START)"
                    .into(),
            );
        }
        // A runtime built with the mark-region collector (:mark-region-gc) has a page
        // table too, but its pages hold lines, not gencgc's contiguous blocks.
        let collector = Symbols::resolve(elf, &["line_bytemap", "allocation_bitmap"], None)?;
        if collector.get("line_bytemap").is_some() || collector.get("allocation_bitmap").is_some() {
            return Err(
                "an SBCL built with the mark-region collector (:mark-region-gc), not \
                        gencgc: the census reads gencgc's page table only"
                    .into(),
            );
        }
        if !file.is_64()
            || !file.is_little_endian()
            || file.architecture() != object::Architecture::X86_64
        {
            return Err("the SBCL census reads x86-64 runtimes only".into());
        }
        let rodata = file
            .section_by_name(".rodata")
            .and_then(|s| s.data().ok())
            .unwrap_or(&[]);
        let version = release_string(rodata).ok_or(
            "an SBCL runtime whose release cannot be read from its executable; the census \
             reads only layouts fragscope has verified",
        )?;
        let numeric: String = version
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()
            .unwrap_or("")
            .trim_end_matches('.')
            .to_string();
        let release = *RELEASES
            .iter()
            .find(|r| r.version == numeric)
            .ok_or_else(|| {
                format!(
                    "SBCL {version} is not supported: fragscope reads the gencgc layouts of \
                     SBCL {}, and has not verified this release's",
                    verified_releases()
                )
            })?;
        let symbols = Symbols::resolve(elf, &SYMBOLS, pid)?;
        let mark_symbols = Symbols::resolve(elf, &MARK_SYMBOLS, pid).and_then(|m| {
            MARK_SYMBOLS
                .iter()
                .map(|n| m.need(n))
                .collect::<Result<Vec<u64>, String>>()
        });
        let mark_optional = Symbols::resolve(elf, &MARK_OPTIONAL_SYMBOLS, pid)
            .map(|m| MARK_OPTIONAL_SYMBOLS.iter().map(|n| m.get(n)).collect())
            .unwrap_or_else(|_| vec![None; MARK_OPTIONAL_SYMBOLS.len()]);
        let need = |n: &str| {
            symbols
                .need(n)
                .map_err(|e| format!("{e}, which the SBCL {version} census needs"))
        };
        Ok(Self {
            dynamic_space_start: need("DYNAMIC_SPACE_START")?,
            dynamic_space_size: need("dynamic_space_size")?,
            page_table: need("page_table")?,
            page_table_pages: need("page_table_pages")?,
            next_free_page: need("next_free_page")?,
            bytes_allocated: need("bytes_allocated")?,
            generations: need("generations")?,
            gc_alloc_region: need("gc_alloc_region")?,
            all_threads: need("all_threads")?,
            gc_active_p: need("gc_active_p")?,
            collections_counter: need(release.collections_counter)?,
            widetag_lowtag: need("widetag_lowtag")?,
            sizetab: need("sizetab")?,
            mark_symbols,
            mark_optional,
            version,
            release,
        })
    }
}

/// The release string `sbcl --version` prints ("SBCL %s"): the one NUL-terminated string
/// of the read-only data that reads as a release number (`2.2.9`, `2.2.9.debian`).
fn release_string(rodata: &[u8]) -> Option<String> {
    let mut found: Option<String> = None;
    for s in rodata.split(|&b| b == 0) {
        let Ok(s) = std::str::from_utf8(s) else {
            continue;
        };
        let mut parts = s.splitn(4, '.');
        let numbers = (0..3)
            .filter_map(|_| parts.next())
            .filter(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
            .count();
        let rest_ok = parts.next().is_none_or(|r| {
            !r.is_empty()
                && r.len() <= 32
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._+-~".contains(&b))
        });
        if numbers == 3 && rest_ok {
            match &found {
                Some(f) if f != s => return None, // two candidates: cannot tell
                _ => found = Some(s.to_string()),
            }
        }
    }
    found
}

impl SbclCensus {
    /// As the trace keeps it (chunk 19).
    pub fn to_record(&self) -> fragscope_trace::sbcl_heap::SbclHeap {
        use fragscope_trace::sbcl_heap::{SbclGenerationFigures, SbclHeap, SbclPageUse};
        SbclHeap {
            version: self.version.clone(),
            dynamic_space_start: self.dynamic_space_start,
            dynamic_space_size: self.dynamic_space_size,
            page_bytes: self.page_bytes,
            next_free_page: self.next_free_page,
            collections: self.collections,
            pause_us: self.pause_us,
            page_types: PageType::ALL.iter().map(|t| t.name().to_string()).collect(),
            generations: self
                .generations
                .iter()
                .map(|g| SbclGenerationFigures {
                    gen: g.gen,
                    pages: g.pages.pages,
                    bytes_used: g.pages.bytes_used,
                    large_pages: g.pages.large_pages,
                    large_bytes: g.pages.large_bytes,
                    collections: g.num_gc.max(0) as u32,
                    collections_before_promotion: g.number_of_gcs_before_promotion.max(0) as u32,
                    bytes_consed_between_gc: g.bytes_consed_between_gc,
                })
                .collect(),
            pages: self
                .pages
                .iter()
                .map(|p| SbclPageUse {
                    index: p.index,
                    bytes_used: p.bytes_used + p.open_bytes,
                    gen: p.gen,
                    page_type: p.page_type.index() as u8,
                    large: p.large,
                })
                .collect(),
            objects: self.objects.as_ref().map(|o| {
                ObjectClass::ALL
                    .iter()
                    .map(|&c| (o.class(c).count, o.class(c).bytes))
                    .collect()
            }),
            objects_by_generation: self
                .objects
                .as_ref()
                .map(|o| {
                    o.by_generation
                        .iter()
                        .map(|g| g.iter().map(|f| (f.count, f.bytes)).collect())
                        .collect()
                })
                .unwrap_or_default(),
            live_by_generation: self.mark.as_ref().map(|m| {
                m.live_by_generation
                    .iter()
                    .map(|g| g.iter().map(|f| (f.count, f.bytes)).collect())
                    .collect()
            }),
            mark_us: self.mark.as_ref().map_or(0, |m| m.mark_us),
            threads_in_lisp: self
                .mark
                .as_ref()
                .map_or(0, |m| m.roots.threads_outside_syscall),
            mark_refused: self.mark_refused.clone(),
        }
    }
}

/// One census of an SBCL process's dynamic space.
#[derive(Debug, Clone, PartialEq)]
pub struct SbclCensus {
    pub version: String,
    pub dynamic_space_start: u64,
    pub dynamic_space_size: u64,
    pub page_bytes: u64,
    /// Where the page table is in the process, and its entries (one per page).
    pub page_table: u64,
    pub page_table_pages: u64,
    pub next_free_page: u64,
    /// Pages below `next_free_page` in use and free; pages from it on never used since
    /// the last collection moved it.
    pub pages_in_use: u64,
    pub pages_free: u64,
    pub pages_never_used: u64,
    /// The runtime's `bytes_allocated`: `(sb-kernel:dynamic-usage)`.
    pub bytes_allocated: u64,
    /// The page table's bytes in use (equal to `bytes_allocated`, checked).
    pub bytes_used: u64,
    pub open_regions: Vec<OpenRegion>,
    /// Bytes allocated in the open regions, counted nowhere else yet.
    pub open_region_bytes: u64,
    /// Generations 0 to 7.
    pub generations: Vec<SbclGeneration>,
    /// By [`PageType::ALL`].
    pub page_types: Vec<PageFigures>,
    /// Pages in use by bytes used (open regions' bytes included): no byte, then 0-10%
    /// ... 90-100% (`OCCUPANCY_BUCKETS`); and the bytes on the pages of each bucket.
    pub occupancy_pages: Vec<u64>,
    pub occupancy_bytes: Vec<u64>,
    /// Every page in use, in address order.
    pub pages: Vec<SbclPage>,
    /// Collections done (`n_gcs_done` or `n_lisp_gcs`, as the release counts them).
    pub collections: u64,
    /// The object walk, when asked for.
    pub objects: Option<SbclObjects>,
    /// The mark from the roots, when asked for and taken; `mark_refused` says why not
    /// when it was asked for but could not be taken (the rest of the census stands).
    pub mark: Option<SbclMark>,
    pub mark_refused: Option<String>,
    /// How long the process was held stopped, and the bytes read from it.
    pub pause_us: u64,
    pub bytes_read: u64,
}

impl SbclCensus {
    pub fn page_type(&self, t: PageType) -> PageFigures {
        self.page_types[t.index()]
    }

    /// Where page `index` of the dynamic space starts in the process (to join with its
    /// residency from pagemap).
    pub fn page_address(&self, index: u32) -> u64 {
        self.dynamic_space_start + u64::from(index) * self.page_bytes
    }

    /// Where page `index`'s entry of the page table is in the process.
    pub fn page_entry_address(&self, index: u32) -> u64 {
        self.page_table + u64::from(index) * 8
    }

    /// Pages in use that hold part of a large object, by generation.
    pub fn large_pages_by_generation(&self) -> Vec<(u8, u64)> {
        self.generations
            .iter()
            .map(|g| (g.gen, g.pages.large_pages))
            .collect()
    }
}

/// What a census reads beyond the page table.
#[derive(Debug, Clone, Copy, Default)]
pub struct CensusOptions {
    /// Walk every object (reads all used bytes' headers: the pause grows with the
    /// heap, see ARCHITECTURE.md).
    pub objects: bool,
    /// Mark the objects reachable from the roots, as a full collection would (walks
    /// the objects too): live and garbage bytes by generation and class
    /// ([`SbclCensus::mark`]).
    pub mark: bool,
    /// Walk and mark only when the space holds at most this many bytes in use (read as
    /// the process is held): a caller's pause budget at its cost per byte, so a heap
    /// that grew since the last census does not overspend it. None: whatever the size.
    pub walk_only_up_to: Option<u64>,
}

impl CensusOptions {
    /// These options for a space holding `bytes_used`.
    fn for_space_of(self, bytes_used: u64) -> CensusOptions {
        if self.walk_only_up_to.is_some_and(|limit| bytes_used > limit) {
            CensusOptions {
                objects: false,
                mark: false,
                ..self
            }
        } else {
            self
        }
    }
}

/// Takes a census of process `pid`, held stopped meanwhile. A moment inside a
/// collection or an allocation (the counters disagree with the page table) is retried
/// after 4, 8 and 16 ms with the process running in between; still inconsistent: Err.
pub fn census(
    pid: u32,
    rt: &SbclRuntime,
    options: CensusOptions,
) -> Result<SbclCensus, CensusError> {
    let mut mem = ProcessMemory::open(pid)?;
    // The tables are set when the runtime starts and never change: read them once, the
    // process running, and refuse at once (not after retries) when they are not 2.2.9's.
    check_tag_tables(&mut mem, rt)?;
    let mut last = None;
    for wait_ms in [0u64, 4, 8, 16] {
        std::thread::sleep(Duration::from_millis(wait_ms));
        let pause = Pause::stop(pid).map_err(CensusError::Unreadable)?;
        let before = mem.bytes_read();
        match read_census(&mut mem, rt, options) {
            Ok(mut c) => {
                c.pause_us = pause.held().as_micros() as u64;
                c.bytes_read = mem.bytes_read() - before;
                return Ok(c);
            }
            Err(CensusError::Inconsistent(e)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(CensusError::Inconsistent(last.unwrap_or_default()))
}

fn inconsistent(s: String) -> CensusError {
    CensusError::Inconsistent(s)
}

/// One census, the process held: the space's header and counters, its page table, the
/// open regions, then the objects and the mark when asked.
fn read_census(
    mem: &mut ProcessMemory,
    rt: &SbclRuntime,
    options: CensusOptions,
) -> Result<SbclCensus, CensusError> {
    let header = read_header(mem, rt)?;
    let SpaceHeader {
        start,
        size,
        page_table,
        npages,
        next_free,
        collections,
        bytes_allocated,
    } = header;
    let mut gens = vec![0u8; GENERATIONS * GENERATION_SIZE as usize];
    mem.read(rt.generations, &mut gens)?;

    // One entry past next_free_page: the walk looks at the next page's scan start.
    let entries = (next_free + 1).min(npages);
    let mut table = PageTable(vec![0u8; (entries * 8) as usize]);
    mem.read(page_table, &mut table.0)?;

    let regions = open_regions(mem, rt, start, size)?;
    // The runtime moves next_free_page past a region's pages when it opens one.
    let top = start + next_free * PAGE_BYTES;
    if let Some(r) = regions.iter().find(|r| r.free > top) {
        return Err(inconsistent(format!(
            "the {} allocation region reaches {:#x}, beyond next_free_page at {top:#x}",
            r.owner, r.free
        )));
    }
    let open_on_page = open_bytes_by_page(&regions, start);
    let mut generations = generations(&gens);
    let tally = tally_pages(rt, &table, next_free, &open_on_page, &mut generations)?;
    let bytes_used = check_counts(&generations, bytes_allocated, &regions, &table, start)?;
    let options = options.for_space_of(bytes_used);
    let walked = walk_and_mark(mem, rt, options, &header, &table, &regions)?;
    Ok(SbclCensus {
        version: rt.version.clone(),
        dynamic_space_start: start,
        dynamic_space_size: size,
        page_bytes: PAGE_BYTES,
        page_table,
        page_table_pages: npages,
        next_free_page: next_free,
        pages_in_use: tally.pages.len() as u64,
        pages_free: tally.pages_free,
        pages_never_used: npages - next_free,
        bytes_allocated,
        bytes_used,
        open_region_bytes: regions.iter().map(|r| r.free - r.start).sum(),
        open_regions: regions,
        generations,
        page_types: tally.page_types,
        occupancy_pages: tally.occupancy_pages,
        occupancy_bytes: tally.occupancy_bytes,
        pages: tally.pages,
        collections,
        objects: walked.objects,
        mark: walked.mark,
        mark_refused: walked.mark_refused,
        pause_us: 0,
        bytes_read: 0,
    })
}

/// The dynamic space's bounds and the runtime's counters, as a census reads them first.
#[derive(Clone, Copy)]
struct SpaceHeader {
    start: u64,
    size: u64,
    page_table: u64,
    npages: u64,
    next_free: u64,
    collections: u64,
    bytes_allocated: u64,
}

/// Reads the space's header, refusing one that does not hold together or a moment
/// inside a collection.
fn read_header(mem: &mut ProcessMemory, rt: &SbclRuntime) -> Result<SpaceHeader, CensusError> {
    let start = mem.read_u64(rt.dynamic_space_start)?;
    let size = mem.read_u64(rt.dynamic_space_size)?;
    let page_table = mem.read_u64(rt.page_table)?;
    let npages = mem.read_u64(rt.page_table_pages)?;
    if page_table == 0 || npages == 0 {
        return Err(CensusError::NoHeap);
    }
    if start % PAGE_BYTES != 0
        || npages > MAX_PAGES
        || size != npages * PAGE_BYTES
        || start.checked_add(size).is_none()
    {
        return Err(inconsistent(format!(
            "the dynamic space does not hold together (start {start:#x}, size {size}, \
             {npages} pages of {PAGE_BYTES} bytes)"
        )));
    }
    // An int in 2.2.9, a bool since: its first byte says.
    if mem.read_u8(rt.gc_active_p)? != 0 {
        return Err(inconsistent("a collection is running".into()));
    }
    let next_free = mem.read_u64(rt.next_free_page)?;
    if next_free > npages {
        return Err(inconsistent(format!(
            "next_free_page {next_free} is beyond the page table's {npages} pages"
        )));
    }
    Ok(SpaceHeader {
        start,
        size,
        page_table,
        npages,
        next_free,
        collections: u64::from(mem.read_u32(rt.collections_counter)?),
        bytes_allocated: mem.read_u64(rt.bytes_allocated)?,
    })
}

/// The page table's 8-byte entries, as read.
struct PageTable(Vec<u8>);

impl PageTable {
    /// Entry `i`: scan start offset, words used (and the zero-fill bit), type bits,
    /// generation.
    fn entry(&self, i: u64) -> (u32, u16, u8, u8) {
        let e = &self.0[(i * 8) as usize..(i * 8 + 8) as usize];
        (
            u32::from_le_bytes(e[0..4].try_into().unwrap()),
            u16::from_le_bytes(e[4..6].try_into().unwrap()),
            e[6],
            e[7],
        )
    }
}

/// The bytes of the open regions on each page they cover, by page index.
fn open_bytes_by_page(regions: &[OpenRegion], start: u64) -> HashMap<u64, u64> {
    let mut open_on_page = HashMap::<u64, u64>::new();
    for r in regions {
        let mut a = r.start;
        while a < r.free {
            let page = (a - start) / PAGE_BYTES;
            let page_end = start + (page + 1) * PAGE_BYTES;
            let upto = r.free.min(page_end);
            *open_on_page.entry(page).or_default() += upto - a;
            a = upto;
        }
    }
    open_on_page
}

/// The runtime's `struct generation`s, decoded (their pages not counted yet).
fn generations(gens: &[u8]) -> Vec<SbclGeneration> {
    (0..GENERATIONS)
        .map(|g| {
            let b = &gens[g * GENERATION_SIZE as usize..];
            SbclGeneration {
                gen: g as u8,
                bytes_allocated: le_u64(b, 0),
                gc_trigger: le_u64(b, 8),
                bytes_consed_between_gc: le_u64(b, 16),
                num_gc: i32::from_le_bytes(b[24..28].try_into().unwrap()),
                number_of_gcs_before_promotion: i32::from_le_bytes(b[28..32].try_into().unwrap()),
                cum_sum_bytes_allocated: le_u64(b, 32),
                minimum_age_before_gc: f64::from_le_bytes(b[40..48].try_into().unwrap()),
                ..Default::default()
            }
        })
        .collect()
}

/// The pages in use and their figures by page type and by fill.
struct PageTally {
    pages: Vec<SbclPage>,
    page_types: Vec<PageFigures>,
    occupancy_pages: Vec<u64>,
    occupancy_bytes: Vec<u64>,
    pages_free: u64,
}

/// Decodes every page below next_free_page, adding each in use to its generation's
/// figures; a page that does not hold together refuses the census.
fn tally_pages(
    rt: &SbclRuntime,
    table: &PageTable,
    next_free: u64,
    open_on_page: &HashMap<u64, u64>,
    generations: &mut [SbclGeneration],
) -> Result<PageTally, CensusError> {
    let mut pages = Vec::new();
    let mut page_types = vec![PageFigures::default(); PageType::ALL.len()];
    let mut occupancy_pages = vec![0u64; OCCUPANCY_BUCKETS];
    let mut occupancy_bytes = vec![0u64; OCCUPANCY_BUCKETS];
    let mut pages_free = 0;
    for i in 0..next_free {
        let (_, words, bits, gen) = table.entry(i);
        let bytes_used = u64::from(words >> 1) * 8;
        if bits == 0 {
            if bytes_used != 0 {
                return Err(inconsistent(format!(
                    "free page {i} counts {bytes_used} bytes used"
                )));
            }
            pages_free += 1;
            continue;
        }
        let page_type = PageType::of_bits(bits)
            .filter(|_| bits & !KNOWN_TYPE_BITS == 0)
            .ok_or_else(|| {
                inconsistent(format!(
                    "page {i} has type bits {bits:#x}, unknown to SBCL {}",
                    rt.release.version
                ))
            })?;
        if usize::from(gen) >= GENERATIONS || bytes_used > PAGE_BYTES {
            return Err(inconsistent(format!(
                "page {i} is of generation {gen} with {bytes_used} bytes used"
            )));
        }
        let open_bytes = open_on_page.get(&i).copied().unwrap_or(0);
        let p = SbclPage {
            index: i as u32,
            bytes_used: bytes_used as u32,
            open_bytes: open_bytes.min(PAGE_BYTES) as u32,
            gen,
            page_type,
            large: bits & SINGLE_OBJECT_FLAG != 0,
            open: bits & OPEN_REGION_PAGE_FLAG != 0,
        };
        generations[usize::from(gen)].pages.add(&p);
        page_types[page_type.index()].add(&p);
        let filled = (bytes_used + open_bytes).min(PAGE_BYTES);
        let bucket = if filled == 0 {
            0
        } else {
            1 + ((filled * 10 / PAGE_BYTES) as usize).min(OCCUPANCY_BUCKETS - 2)
        };
        occupancy_pages[bucket] += 1;
        occupancy_bytes[bucket] += filled;
        pages.push(p);
    }
    Ok(PageTally {
        pages,
        page_types,
        occupancy_pages,
        occupancy_bytes,
        pages_free,
    })
}

/// Checks the page table against the runtime's counters and the open regions against
/// their pages' flags; the bytes used the page table counts.
fn check_counts(
    generations: &[SbclGeneration],
    bytes_allocated: u64,
    regions: &[OpenRegion],
    table: &PageTable,
    start: u64,
) -> Result<u64, CensusError> {
    for g in generations {
        if g.pages.bytes_used != g.bytes_allocated {
            return Err(inconsistent(format!(
                "generation {}: the page table counts {} bytes, the runtime {}",
                g.gen, g.pages.bytes_used, g.bytes_allocated
            )));
        }
    }
    let bytes_used: u64 = generations.iter().map(|g| g.pages.bytes_used).sum();
    if bytes_used != bytes_allocated {
        return Err(inconsistent(format!(
            "the page table counts {bytes_used} bytes, bytes_allocated {bytes_allocated}"
        )));
    }
    if regions.iter().any(|r| {
        r.free > r.start && {
            let (_, _, bits, _) = table.entry((r.start - start) / PAGE_BYTES);
            bits & OPEN_REGION_PAGE_FLAG == 0
        }
    }) {
        return Err(inconsistent(
            "an open allocation region starts on a page not marked open".into(),
        ));
    }
    Ok(bytes_used)
}

/// What the object walk and the mark found, when asked.
struct Walked {
    objects: Option<SbclObjects>,
    mark: Option<SbclMark>,
    /// Why a mark that was asked for was refused.
    mark_refused: Option<String>,
}

/// Walks the objects (`options.objects`, or for the mark) and marks from the roots
/// (`options.mark`): a refused mark leaves the census standing, with the reason.
fn walk_and_mark(
    mem: &mut ProcessMemory,
    rt: &SbclRuntime,
    options: CensusOptions,
    header: &SpaceHeader,
    table: &PageTable,
    regions: &[OpenRegion],
) -> Result<Walked, CensusError> {
    let SpaceHeader {
        start, next_free, ..
    } = *header;
    let entry = |i: u64| table.entry(i);
    let mut starts = if options.mark {
        Some(vec![
            0u64;
            ((next_free * PAGE_BYTES / 16) as usize).div_ceil(64)
        ])
    } else {
        None
    };
    let objects = if options.objects || options.mark {
        let t = Instant::now();
        let mut o = walk_objects(
            mem,
            start,
            next_free,
            &entry,
            regions,
            starts.as_deref_mut(),
        )?;
        o.walk_us = t.elapsed().as_micros() as u64;
        Some(o)
    } else {
        None
    };
    let (mark, mark_refused) = match starts {
        None => (None, None),
        Some(starts) => {
            let info: Vec<(u8, u8)> = (0..next_free)
                .map(|i| {
                    let (_, _, bits, gen) = entry(i);
                    (gen, bits)
                })
                .collect();
            let space = mark::Space {
                start,
                next_free,
                pages: &info,
                regions,
                starts: &starts,
            };
            match mark::mark(mem, rt, &space) {
                Ok(m) => (Some(m), None),
                Err(CensusError::Inconsistent(e)) => (None, Some(e)),
                Err(e) => return Err(e),
            }
        }
    };
    Ok(Walked {
        objects,
        mark,
        mark_refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_is_the_one_version_string() {
        assert_eq!(
            release_string(b"x\0--version\x002.2.9.debian\0SBCL %s\n\0GLIBC_2.2.5\0").as_deref(),
            Some("2.2.9.debian")
        );
        assert_eq!(release_string(b"2.2.9\0").as_deref(), Some("2.2.9"));
        assert_eq!(release_string(b"2.2.9\x002.3.0\0"), None);
        assert_eq!(release_string(b"no version here\x001.2\0"), None);
    }

    #[test]
    fn every_header_widetag_has_a_size_and_a_lowtag() {
        // The lowtag table of 2.2.9 (genesis/gc-tables.h), rows of 16.
        let rows: [[u8; 16]; 16] = [
            [7, 0, 7, 7, 7, 0, 7, 7, 7, 7, 7, 7, 7, 0, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 7, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x83, 7, 7, 7, 0x8B, 7, 7],
            [7, 0x8B, 7, 7, 7, 0x8B, 7, 7, 7, 0, 7, 7, 7, 0x8F, 7, 7],
            [7, 7, 7, 7, 7, 0, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x80, 7, 7],
            [7, 0, 7, 7, 7, 0, 7, 7, 7, 0, 7, 7, 7, 0, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7],
            [7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0x8F, 7, 7, 7, 0, 7, 7],
        ];
        for w in 0..=255u8 {
            assert_eq!(
                expected_lowtag(w),
                rows[usize::from(w / 16)][usize::from(w % 16)],
                "widetag {w}"
            );
        }
        assert_eq!(ObjectClass::of_widetag(157), ObjectClass::OctetVectors);
        assert_eq!(ObjectClass::of_widetag(229), ObjectClass::Strings);
        assert_eq!(ObjectClass::of_widetag(137), ObjectClass::OtherVectors);
    }
}
