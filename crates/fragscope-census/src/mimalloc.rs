//! mimalloc's heap, read from outside a running process: one reader per release family
//! (2.x here and in `read`, 3.x in `v3`, Debian 13's 3.0.1, whose 3.0 keeps no list of
//! heaps, in `v3_0`), each with the layouts of the releases it has verified.
//!
//! mimalloc 2.x takes memory from the OS in *segments* of 32 MiB (aligned to their size; a
//! *huge* segment holds one block too large for a normal one), usually carved from
//! *arenas* it reserves (1 GiB at a time). A segment is 512 *slices* of 64 KiB: the first
//! ones hold the segment's header (its info slices), the rest form *pages*, each serving
//! one block size, and *free spans*. A page carves its blocks lazily: `reserved` blocks
//! fit in it, `capacity` have been carved, `used` are handed out; the rest of the capacity
//! waits on its `free` and `local_free` lists. A block freed by another thread goes on
//! the page's `xthread_free` list, or, when the page is full, on its heap's
//! `thread_delayed_free` list, and stays counted in `used` until the owning thread
//! collects it. A segment whose thread ended is *abandoned* (`thread_id` 0) until another
//! thread reclaims it.
//!
//! Segments are found without the threads' heaps (thread-local, out of reach): every
//! arena's bitmap of blocks in use (`mi_arenas[]`, `mi_arena_count`) and the segment map
//! (`mi_segment_map[]`: one bit per 32 MiB of address space, for segments taken from the
//! OS outside arenas). Those statics are file-local: they are found by name in an image
//! that keeps its symbol table (a Rust program on the mimalloc crate keeps it, as release
//! builds do); a stripped image (Debian's libmimalloc.so.2) is refused with a note.
//!
//! The layouts are those of mimalloc 2.3.2 as libmimalloc-sys 0.1.49 builds it with its
//! `v2` feature (`MI_DEBUG` 0, no padding, free lists not encoded; x86-64), taken with
//! `offsetof` from that source so configured. The build is told by its statics' sizes
//! (their symbols'), and by `mi_version`'s code (`mov eax, 20302; ret`) when the image keeps
//! it (a program that never calls it has it dropped by the linker); any other build is
//! refused with a note naming it when it can be named. Checked: every segment's cookie (its address xor the
//! main heap's cookie), kind and slice counts; its slices walked as mimalloc's own
//! validity check walks them (each span's first slice, counts adding up to the segment,
//! pages as many as the segment counts); each page's `used <= capacity <= reserved`, its
//! blocks inside its span, its list heads inside its blocks; every block of the
//! thread-free and delayed-free lists inside a page of the heap and on a block boundary.

use std::collections::{BTreeMap, BTreeSet};

use object::{Object, ObjectSection, ObjectSymbol};

use fragscope_trace::heap_census::{MimallocClass, MimallocHeap, OCCUPANCY_BUCKETS};
use fragscope_trace::ResidentRange;

use crate::allocators::LinkedAllocator;
use crate::library::MappedLibrary;
use crate::memory::{le_u32, le_u64};
use crate::residency::Residency;
use crate::{ProcessMemory, Symbols};

/// The 2.x release whose layout is verified, as `mi_version` gives it.
const RELEASE: (u32, &str) = (20302, "mimalloc 2.3.2");

/// The statics read, with their sizes in the verified build (`sizeof(mi_heap_t)`,
/// `MI_MAX_ARENAS` pointers, a count, `MI_SEGMENT_MAP_MAX_PARTS` pointers).
const STATICS: [(&str, u64); 4] = [
    ("_mi_heap_main", 3088),
    ("mi_arenas", 132 * 8),
    ("mi_arena_count", 8),
    ("mi_segment_map", MAP_PARTS as u64 * 8),
];

/// Statics not read whose sizes tell the build apart too: `mi_stats_t` (its layout
/// changes between releases) and `mi_subproc_t`.
const ALSO_SIZED: [(&str, u64); 2] = [("_mi_stats_main", 4168), ("mi_subproc_default", 136)];

const PAGE: u64 = 4096;
const SEGMENT_SIZE: u64 = 32 << 20;
const SLICE_SIZE: u64 = 64 << 10;
const SLICES_PER_SEGMENT: u64 = 512;
const MAX_ARENAS: u64 = 132;
/// Blocks of an arena at most (32 TiB): more is not an arena.
const MAX_ARENA_BLOCKS: u64 = 1 << 20;

// mi_heap_t
const HEAP_TLD: usize = 0;
const HEAP_DELAYED_FREE: usize = 8;
const HEAP_THREAD_ID: usize = 16;
const HEAP_COOKIE: usize = 32;

// mi_arena_t (its in-use bitmap in place at its end)
const ARENA_HEADER: usize = 184;
const ARENA_ID: usize = 0;
const ARENA_START: usize = 32;
const ARENA_BLOCKS: usize = 40;
const ARENA_FIELDS: usize = 48;

// mi_segmap_part_t: a memid, then the bits
const MAP_PARTS: usize = 25;
const MAP_PART_BITS_AT: usize = 24;
const MAP_PART_WORDS: usize = 1008;
const MAP_PART_SPAN: u64 = (MAP_PART_WORDS as u64 * 64) * SEGMENT_SIZE;

// mi_segment_t
const SEGMENT_STRUCT: usize = 49536;
const SEG_SIZE: usize = 32;
const SEG_COMMIT_MASK: usize = 120;
const SEG_ABANDONED: usize = 200;
const SEG_USED: usize = 216;
const SEG_COOKIE: usize = 224;
const SEG_SLICES: usize = 248;
const SEG_INFO_SLICES: usize = 256;
const SEG_KIND: usize = 264;
const SEG_SLICE_ENTRIES: usize = 272;
const SEG_THREAD_ID: usize = 280;
const SEG_SLICE_ARRAY: usize = 288;

// mi_page_t (a slice)
const SLICE_STRUCT: usize = 96;
const PAGE_SLICE_COUNT: usize = 0;
const PAGE_SLICE_OFFSET: usize = 4;
const PAGE_CAPACITY: usize = 10;
const PAGE_RESERVED: usize = 12;
const PAGE_FREE: usize = 16;
const PAGE_LOCAL_FREE: usize = 24;
const PAGE_USED: usize = 32;
const PAGE_BLOCK_SIZE: usize = 40;
const PAGE_START: usize = 48;
const PAGE_THREAD_FREE: usize = 56;
const PAGE_HEAP: usize = 64;

/// Blocks of a thread-free list read one by one before the page's carved blocks are read
/// at once.
const SHORT_LIST: u64 = 16;

/// A page's carved blocks read at once for its thread-free list at most (a small page's
/// are 64 KiB, a medium one's 512 KiB); a larger page's list is read block by block.
const MAX_CARVED_READ: u64 = 1 << 20;

/// Heaps whose delayed-free lists are read at most: more is not a heap mimalloc made.
const MAX_HEAPS: usize = 1 << 16;

mod read;
mod v3;
mod v3_0;

/// Where a process's mimalloc keeps the statics the census starts from.
#[derive(Debug, Clone)]
pub struct MimallocLayout {
    /// The image it is in (the program, or libmimalloc), and its release.
    pub library: String,
    pub release: &'static str,
    statics: Statics,
}

/// The statics of each release family, placed in the process.
#[derive(Debug, Clone)]
enum Statics {
    V2 {
        heap_main: u64,
        arenas: u64,
        arena_count: u64,
        segment_map: u64,
    },
    V3(v3::Statics),
    /// 3.0.1: found by their shape at each census.
    V3_0(v3_0::Statics),
}

/// Reads the heap. The caller holds the process stopped; `residency`: its pagemap, read
/// meanwhile, which says what of the heap is resident.
pub fn census(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    residency: &[ResidentRange],
) -> Result<MimallocHeap, String> {
    match &layout.statics {
        Statics::V2 { .. } => read::census(mem, layout, residency),
        Statics::V3(statics) => v3::census(mem, layout, statics, residency),
        Statics::V3_0(statics) => v3_0::census(mem, layout, statics, residency),
    }
}

/// Finds the mimalloc `pid` runs on: the copy `linked` names, else a mapped libmimalloc.
/// Err: why it cannot be read (another release, a stripped image, ...).
pub fn locate(pid: u32, linked: Option<&LinkedAllocator>) -> Result<MimallocLayout, String> {
    let lib = match linked {
        Some(l) => MappedLibrary::find_path(pid, &l.image)?
            .ok_or_else(|| format!("{} is not mapped (the process exited?)", l.image))?,
        None => MappedLibrary::find(pid, "libmimalloc")?
            .ok_or_else(|| "no mimalloc library is mapped".to_string())?,
    };
    let elf = lib.elf(pid)?;
    let file =
        object::File::parse(&*elf).map_err(|e| format!("{} is not an ELF file ({e})", lib.path))?;
    // Debian 13's 3.0.1, stripped: its statics are found in its data at each census.
    if version_of(&file) == Some(v3_0::RELEASE.0) {
        let (release, statics) = v3_0::locate(&file, &lib.path, lib.data)?;
        return Ok(MimallocLayout {
            library: lib.path,
            release,
            statics: Statics::V3_0(statics),
        });
    }
    if v3::is_v3(&file) {
        let (release, statics) = v3::locate(&file, &elf, &lib.path, lib.base)?;
        return Ok(MimallocLayout {
            library: lib.path,
            release,
            statics: Statics::V3(statics),
        });
    }
    let release = statics_of(&file, &lib.path)?;
    let names: Vec<&str> = STATICS.iter().map(|(n, _)| *n).collect();
    let symbols = Symbols::resolve_at(&elf, &names, lib.base)?;
    Ok(MimallocLayout {
        library: lib.path,
        release,
        statics: Statics::V2 {
            heap_main: symbols.need("_mi_heap_main")?,
            arenas: symbols.need("mi_arenas")?,
            arena_count: symbols.need("mi_arena_count")?,
            segment_map: symbols.need("mi_segment_map")?,
        },
    })
}

/// The release of the mimalloc 2.x in `file` (at `path`), once its statics' sizes are those
/// of the verified build, and its version too when the image keeps `mi_version` (a program
/// that never calls it has it dropped by the linker: its statics then tell the build).
fn statics_of(file: &object::File, path: &str) -> Result<&'static str, String> {
    let (known, release) = RELEASE;
    let not_verified = |which: String| {
        format!(
            "the process runs on {which} ({path}), whose layout fragscope has not verified \
             (it reads {release}, as the mimalloc crate's `v2` feature builds it, {} as it \
             builds it by default, and {} as Debian 13 builds it)",
            v3::verified_releases().join(", "),
            v3_0::RELEASE.1
        )
    };
    match version_of(file) {
        Some(v) if v != known => return Err(not_verified(format!("mimalloc {}", version_name(v)))),
        _ => {}
    }
    for (name, size) in STATICS.iter().chain(&ALSO_SIZED) {
        match size_of(file, name) {
            None => {
                return Err(format!(
                    "{path} keeps no symbol for mimalloc's {name} (stripped to its exported \
                     names): its arenas and segments cannot be found"
                ))
            }
            Some(s) if s != *size => {
                return Err(format!(
                    "{path}'s mimalloc is not {release} as fragscope knows it: its {name} is \
                     {s} bytes, not {size} (another release, or a `secure` or `debug` build)"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(release)
}

/// The size of the static `name` defines in `file`, if it keeps its symbol.
fn size_of(file: &object::File, name: &str) -> Option<u64> {
    file.symbols()
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .map(|s| s.size())
}

/// `MI_MALLOC_VERSION` as a release: major, two digits of minor and two of patch since
/// 2.1 (20302 is 2.3.2), one digit each before (209 is Debian 12's 2.0.9).
fn version_name(v: u32) -> String {
    if v >= 1000 {
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 100, v / 10 % 10, v % 10)
    }
}

/// The major release of a `mi_version()` value, in either of its encodings (301 for 3.0.1
/// up to 3.0, 30302 for 3.3.2).
fn version_major(v: u32) -> u32 {
    if v >= 1000 {
        v / 10000
    } else {
        v / 100
    }
}

/// `mi_version()`'s value, read from its code: `mov eax, imm32; ret`, after an `endbr64`
/// when the image was built for control-flow protection.
fn version_of(file: &object::File) -> Option<u32> {
    let sym = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok("mi_version") && s.is_definition())?;
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let code = section.data_range(sym.address(), 16).ok()??;
    let code = code.strip_prefix(&[0xf3, 0x0f, 0x1e, 0xfa]).unwrap_or(code);
    match code {
        [0xb8, a, b, c, d, 0xc3, ..] => Some(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => None,
    }
}

/// One page as the census found it, for the delayed-free lists to be placed on.
#[derive(Debug, Clone, Copy)]
struct PageSeen {
    /// Its blocks: from `start`, `reserved` of `block_size` bytes; `capacity` carved.
    start: u64,
    block_size: u64,
    capacity: u64,
    used: u64,
    /// Blocks on its thread-free list, and on its heap's delayed-free list.
    thread_freed: u64,
    delayed: u64,
    /// Its segment's owner (0: abandoned), which its heap must be.
    thread: u64,
}

impl PageSeen {
    /// A page of `capacity` carved blocks of `block_size` from `start`, `used` in use,
    /// owned by `thread`; its free lists not read yet.
    fn new(start: u64, block_size: u64, capacity: u64, used: u64, thread: u64) -> Self {
        PageSeen {
            start,
            block_size,
            capacity,
            used,
            thread_freed: 0,
            delayed: 0,
            thread,
        }
    }

    /// Checks that the free and local-free lists of its descriptor `p` (their heads at
    /// `free` and `local_free`) start on one of its carved blocks.
    fn check_list_heads(&self, p: &[u8], free: usize, local_free: usize) -> Result<(), String> {
        for (list, what) in [(free, "free"), (local_free, "local free")] {
            let head = le_u64(p, list);
            if head != 0 && !self.holds_block(head) {
                return Err(format!(
                    "has its {what} list start at {head:#x}, not one of its blocks"
                ));
            }
        }
        Ok(())
    }

    /// Whether `block` is the start of one of its carved blocks.
    fn holds_block(&self, block: u64) -> bool {
        block >= self.start
            && block - self.start < self.capacity.saturating_mul(self.block_size)
            && (block - self.start).is_multiple_of(self.block_size)
    }
}

/// What one census gathers, over every segment.
#[derive(Default)]
struct Tally {
    heap: MimallocHeap,
    classes: BTreeMap<u64, MimallocClass>,
    pages: Vec<PageSeen>,
    /// The heaps the pages name (`xheap`), whose delayed-free lists are read.
    heaps: BTreeSet<u64>,
}

impl Tally {
    fn new(layout: &MimallocLayout) -> Self {
        Self {
            heap: MimallocHeap {
                release: layout.release.into(),
                library: layout.library.clone(),
                occupancy_pages: vec![0; OCCUPANCY_BUCKETS],
                occupancy_in_use: vec![0; OCCUPANCY_BUCKETS],
                ..MimallocHeap::default()
            },
            ..Tally::default()
        }
    }

    /// One page into its class: `reserved` blocks fit in it, its slices span `span` bytes
    /// of which `resident` are resident; `abandoned`: no thread owns it.
    fn add_page(
        &mut self,
        seen: PageSeen,
        reserved: u64,
        span: u64,
        resident: u64,
        abandoned: bool,
    ) {
        let class = self
            .classes
            .entry(seen.block_size)
            .or_insert_with(|| MimallocClass {
                block_size: seen.block_size,
                ..MimallocClass::default()
            });
        class.pages += 1;
        class.abandoned_pages += u64::from(abandoned);
        class.span_bytes += span;
        class.blocks_reserved += reserved;
        class.blocks_capacity += seen.capacity;
        class.blocks_in_use += seen.used;
        class.blocks_free += seen.capacity - seen.used;
        if seen.used == 0 {
            class.empty_pages += 1;
            class.empty_resident_bytes += resident;
        } else {
            class.resident_bytes += resident;
        }
        // Placed by the blocks the program holds once the lists are read: the thread-free
        // blocks are known now, the delayed ones (2.x) later; occupancy takes the first (a
        // block on a heap's delayed list is rare and brief).
        let held = seen.used - seen.thread_freed;
        let b = bucket(held, reserved);
        self.heap.occupancy_pages[b] += resident / PAGE;
        self.heap.occupancy_in_use[b] += held * seen.block_size;
        self.pages.push(seen);
    }

    /// The heap, once every page is in: the blocks other threads freed taken out of those
    /// in use (mimalloc counts them in `used` until the owner collects them).
    fn finish(self, bytes_read: u64) -> Result<MimallocHeap, String> {
        let mut tally = self;
        for p in &tally.pages {
            if p.thread_freed + p.delayed > p.used {
                return Err(format!(
                    "a page at {:#x} counts {} blocks in use, fewer than the {} other threads \
                     freed on its lists",
                    p.start,
                    p.used,
                    p.thread_freed + p.delayed
                ));
            }
            let class = tally
                .classes
                .get_mut(&p.block_size)
                .expect("tallied with its page");
            class.blocks_in_use -= p.thread_freed + p.delayed;
            class.blocks_thread_freed += p.thread_freed;
            class.blocks_delayed += p.delayed;
        }
        let mut heap = tally.heap;
        heap.classes = tally.classes.into_values().collect();
        heap.bytes_read = bytes_read;
        Ok(heap)
    }
}

/// The occupancy bucket of a page with `in_use` of `blocks`: none, then tenths.
fn bucket(in_use: u64, blocks: u64) -> usize {
    if in_use == 0 {
        0
    } else {
        1 + ((in_use * 10 / blocks.max(1)) as usize).min(OCCUPANCY_BUCKETS - 2)
    }
}

#[cfg(test)]
mod tests;
