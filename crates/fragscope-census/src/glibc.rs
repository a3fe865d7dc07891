//! glibc malloc's heap, read from outside a running process.
//!
//! glibc keeps its heap in *arenas* (`struct malloc_state`): the main arena, a variable
//! of libc, grows the brk heap; each thread arena lives at the start of its first 64 MiB
//! *heap* (`heap_info`, then the arena), and takes more heaps as it grows, each linked to
//! the one before. Every heap is a run of *chunks*, each headed by its size, whose low
//! bits say whether the chunk before it is in use (PREV_INUSE), whether it was mmapped on
//! its own (IS_MMAPPED) and whether it belongs to a thread arena. A freed chunk goes to a
//! thread's cache (tcache: up to 7 per size, per thread; 16 from 2.43) or, before 2.43, a
//! fastbin, where it stays marked in use, or to the arena's bins, merged with its free
//! neighbours. Blocks above the mmap threshold are chunks mmapped alone, outside every
//! arena.
//!
//! The census walks every arena's heaps chunk by chunk, follows the fastbin lists and
//! each thread's cache (found in the walk: the table a thread allocates in its arena, 640
//! bytes the first time it calls malloc up to 2.42; 760 bytes in 2.43, at its first free
//! or the first malloc that fills its cache), and finds the mmapped chunks in the maps.
//! Each figure is checked against glibc's own: the walk must end exactly at the arena's
//! top chunk, the heaps' sizes add up to the arena's `system_mem`, the mmapped chunks
//! found are `mp_.n_mmaps` and `mp_.mmapped_mem`; a census that does not hold together
//! is refused, never patched.
//!
//! A main arena whose brk heap could not grow (another mapping at the break, as a Node or
//! JVM process's many mappings can put there) grows by mmap instead, for good: glibc marks
//! it non-contiguous, ends each segment with two fenceposts, and keeps no list of the
//! segments. The census finds them by the chunk each begins with, in the anonymous
//! mappings' resident pages, and checks their sizes against the arena's `system_mem`.
//!
//! The layouts read are those of the releases in `RELEASES`, x86-64, each checked
//! with the debug information of Debian's build of it: 2.36 (`malloc_state` 2200 bytes,
//! `malloc_par` 136, `tcache_perthread_struct` 640), 2.41 (the same) and 2.43
//! (`malloc_state` 2112 bytes without fastbins, `malloc_par` 144,
//! `tcache_perthread_struct` 760: 76 bins counted by their free slots; chunks mmapped
//! alone laid out as arena chunks, 16 bytes shorter than their mapping); `heap_info` is
//! 48 bytes in each. The release is the one glibc's banner names; another is refused with
//! a note. The arena is found by name in libc's separate debug file (libc6-dbg,
//! /usr/lib/debug/.build-id/xx/yyyy.debug, matched by build-id); without one, by scanning
//! libc's writable data for the one structure that is a main arena in the release's
//! layout: its 127 bins each either empty (pointing at itself) or holding chunk addresses
//! and marked in its binmap, its `next` list coming back to it, its top chunk inside the
//! brk heap; exactly one must match. Without the debug file, `mp_` and `tcache_key` are
//! unknown: the mmapped chunks are not checked against glibc's count, and a thread cache
//! is recognised by its lists alone (and, in 2.43, by its bins' free slots and chunks
//! adding up to one fill count).

use std::collections::{BTreeMap, HashSet};

use fragscope_trace::heap_census::{GlibcArena, GlibcClass, GlibcHeap, OCCUPANCY_BUCKETS};
use fragscope_trace::{Mapping, ResidentRange};

use crate::ghc::CensusError;
use crate::residency::Residency;
use crate::{ProcessMemory, Symbols};

mod found_by_header;
use found_by_header::anonymous;

mod releases;
use releases::{Release, TcacheCounts, RELEASES};

/// `malloc_state.flags`, at the same offset in every release.
const MS_FLAGS: usize = 4;
/// In `flags`: the main arena grew by mmap once its brk heap could not (sysmalloc's
/// "non-contiguous" main arena).
const NONCONTIGUOUS_BIT: u64 = 2;
const NFASTBINS: usize = 10;
/// The bins' 254 pointers, two per bin (bin 0 unused).
const NBINS_PAIRS: usize = 127;

// heap_info.
const HEAP_INFO_SIZE: u64 = 48;
const HI_AR_PTR: usize = 0;
const HI_PREV: usize = 8;
const HI_SIZE: usize = 16;
/// HEAP_MAX_SIZE: 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; heaps are aligned to it.
const HEAP_MAX: u64 = 64 << 20;

// Chunks.
const SIZE_SZ: u64 = 8;
const ALIGN: u64 = 16;
const MINSIZE: u64 = 32;
const PREV_INUSE: u64 = 1;
const IS_MMAPPED: u64 = 2;
const NON_MAIN_ARENA: u64 = 4;
/// A fencepost's header: sysmalloc ends a segment of a non-contiguous main arena with two
/// (the first one's PREV_INUSE as the chunk before it).
const FENCEPOST: u64 = (2 * SIZE_SZ) | PREV_INUSE;
/// Pages whose first bytes are read at once when looking for the next mmapped chunk.
const MMAPPED_SCAN_BATCH: u64 = 1024;
const SIZE_BITS: u64 = 7;
/// sizeof(struct malloc_chunk): malloc_trim keeps this much of a free chunk's start.
const MALLOC_CHUNK: u64 = 48;

/// The largest chunk a fastbin holds (MAX_FAST_SIZE 160 bytes requested, 64-bit), in the
/// releases that have them.
const MAX_FAST_CHUNK: u64 = 0xb0;

/// Bytes read at a time in the chunk walk.
const WINDOW: u64 = 1 << 20;
const MAX_ARENAS: usize = 4096;
const MAX_LIST: u64 = 1 << 24;

/// Where a process's glibc keeps its malloc state.
#[derive(Debug, Clone)]
pub struct GlibcLayout {
    release: &'static Release,
    /// How the arena was found, for the report.
    pub source: String,
    main_arena: u64,
    /// The addresses of `mp_` and `tcache_key`: known from debug symbols only.
    mp: Option<u64>,
    tcache_key: Option<u64>,
}

/// Finds glibc's malloc state in process `pid` (its memory map `maps`). Err: why the
/// census cannot be taken (another glibc release, a libc not found), a sentence for the
/// report.
pub fn locate(pid: u32, maps: &[Mapping], mem: &mut ProcessMemory) -> Result<GlibcLayout, String> {
    let libc = maps
        .iter()
        .find(|m| crate::allocators::is_libc(m.path.rsplit('/').next().unwrap_or("")))
        .ok_or("the process maps no glibc (libc.so.6): it is statically linked or runs on another C library")?;
    // The file as the process sees it (it may live in another mount namespace).
    let path = format!("/proc/{pid}/root{}", libc.path);
    let bytes = std::fs::read(&path)
        .or_else(|_| std::fs::read(&libc.path))
        .map_err(|e| format!("cannot read the process's libc {}: {e}", libc.path))?;
    let version = release_of(&bytes)
        .ok_or_else(|| format!("{} does not name its glibc release", libc.path))?;
    let release = release_named(&version)?;
    let base = maps
        .iter()
        .filter(|m| m.path == libc.path && m.offset == 0)
        .map(|m| m.start)
        .min()
        .ok_or_else(|| format!("/proc/{pid}/maps does not map {} from offset 0", libc.path))?;
    let build_id = {
        use object::Object;
        object::File::parse(&*bytes)
            .ok()
            .and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec))
    };
    if let Some(id) = build_id.filter(|id| id.len() > 1) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        // Where debuggers look (gdb's debug-file-directory), or FRAGSCOPE_DEBUG_DIR.
        let dir = std::env::var("FRAGSCOPE_DEBUG_DIR").unwrap_or_else(|_| "/usr/lib/debug".into());
        let debug = format!("{dir}/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        if let Ok(elf) = std::fs::read(&debug) {
            let names = ["main_arena", "mp_", "tcache_key"];
            let symbols = Symbols::resolve_at(&elf, &names, base)?;
            if let (Some(main_arena), Some(mp)) = (symbols.get("main_arena"), symbols.get("mp_")) {
                return Ok(GlibcLayout {
                    release,
                    source: format!("libc's debug symbols ({debug})"),
                    main_arena,
                    mp: Some(mp),
                    tcache_key: symbols.get("tcache_key"),
                });
            }
        }
    }
    let main_arena = scan_for_main_arena(release, maps, &libc.path, mem)?;
    Ok(GlibcLayout {
        release,
        source: "a scan of libc's data for the main arena (no debug symbols: libc6-dbg \
                 would let fragscope also check the mmapped chunks against glibc's count)"
            .into(),
        main_arena,
        mp: None,
        tcache_key: None,
    })
}

/// The verified release named `version`; Err: the note that refuses another.
fn release_named(version: &str) -> Result<&'static Release, String> {
    RELEASES.iter().find(|r| r.name == version).ok_or_else(|| {
        let read: Vec<&str> = RELEASES.iter().map(|r| r.name).collect();
        format!(
            "the process runs glibc {version}, whose malloc layout fragscope has not verified \
             (it reads glibc {}); its heap is shown at the page level only",
            read.join(", ")
        )
    })
}

/// "2.36" from the banner glibc carries ("... release version 2.36.").
fn release_of(libc: &[u8]) -> Option<String> {
    let key = b"release version ";
    let at = libc.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = &libc[at..(at + 16).min(libc.len())];
    let v: String = rest
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .map(|&b| b as char)
        .collect();
    let v = v.trim_end_matches('.').to_string();
    (!v.is_empty()).then_some(v)
}

/// The main arena, found in libc's writable data (and the anonymous .bss right after it)
/// by its shape: see the module's documentation and [`looks_like_main_arena`].
fn scan_for_main_arena(
    release: &Release,
    maps: &[Mapping],
    libc_path: &str,
    mem: &mut ProcessMemory,
) -> Result<u64, String> {
    let heap = maps.iter().find(|m| m.path == "[heap]");
    let mut regions = Vec::new();
    for (i, m) in maps.iter().enumerate() {
        if m.path == libc_path && m.perms.starts_with("rw") {
            regions.push((m.start, m.end));
            if let Some(next) = maps.get(i + 1) {
                if next.path.is_empty() && next.start == m.end && next.perms.starts_with("rw") {
                    regions.push((next.start, next.end));
                }
            }
        }
    }
    let mut found = Vec::new();
    for (start, end) in regions {
        let mut data = vec![0u8; (end - start) as usize];
        mem.read(start, &mut data).map_err(|e| e.to_string())?;
        let mut off = 0usize;
        while off + release.state_size <= data.len() {
            let addr = start + off as u64;
            let state = &data[off..off + release.state_size];
            if looks_like_main_arena(release, state, addr, heap, maps)
                && list_comes_back(release, mem, addr)
            {
                found.push(addr);
            }
            off += 8;
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => Err(
            "glibc's main arena was not found in libc's data (malloc not used yet, or a \
                   build whose layout differs); install libc6-dbg so fragscope can find it by \
                   name"
                .into(),
        ),
        _ => Err(format!(
            "{} structures in libc's data look like glibc's main arena; fragscope does not \
             guess: install libc6-dbg so it can find it by name",
            found.len()
        )),
    }
}

/// Whether `b`, read at `addr`, is a main arena: each bin empty (pointing at itself) or
/// holding 16-byte aligned chunks and marked in the binmap (glibc marks a bin there when
/// it puts a chunk in it), the top chunk in the brk heap (or, once the arena grew by mmap,
/// in an anonymous mapping of `anonymous_maps`).
fn looks_like_main_arena(
    release: &Release,
    b: &[u8],
    addr: u64,
    heap: Option<&Mapping>,
    anonymous_maps: &[Mapping],
) -> bool {
    let next = le(b, release.next);
    let top = le(b, release.top);
    let in_heap = |h: &Mapping| h.start <= top && top < h.end;
    // The top of a main arena that grew by mmap may be in one of its mappings.
    let top_placed = heap.is_some_and(in_heap)
        || (le(b, MS_FLAGS) & NONCONTIGUOUS_BIT != 0
            && anonymous_maps.iter().any(|m| anonymous(m) && in_heap(m)));
    if next == 0 || top == 0 || !next.is_multiple_of(8) || !top_placed {
        return false;
    }
    let marked = |bin: usize| {
        let word = u32::from_le_bytes(
            b[release.binmap + 4 * (bin / 32)..][..4]
                .try_into()
                .unwrap(),
        );
        word >> (bin % 32) & 1 == 1
    };
    (0..NBINS_PAIRS).all(|k| {
        let fd = le(b, release.bins + 16 * k);
        let bk = le(b, release.bins + 16 * k + 8);
        // bin_at(k+1): the address that makes fd and bk the fields of a chunk header.
        let own = addr + (release.bins + 16 * k) as u64 - 2 * SIZE_SZ;
        (fd == own && bk == own)
            || (fd.is_multiple_of(ALIGN)
                && bk.is_multiple_of(ALIGN)
                && fd != 0
                && bk != 0
                && (k == 0 || marked(k + 1)))
    })
}

/// Whether the arenas' `next` list from `addr` comes back to it.
fn list_comes_back(release: &Release, mem: &mut ProcessMemory, addr: u64) -> bool {
    let mut at = addr;
    for _ in 0..MAX_ARENAS {
        match mem.read_u64(at + release.next as u64) {
            Ok(next) if next == addr => return true,
            Ok(next) if next != 0 => at = next,
            _ => return false,
        }
    }
    false
}

fn le(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// A run of memory whose pages are counted: a heap of an arena, or mmapped chunks.
///
/// A chunk in use at `p` of `csize` bytes lends the program [p+16, p+csize+8): its user
/// memory runs into the next chunk's `prev_size` field, which glibc uses only while the
/// chunk before is free. Its own first 8 bytes belong to the chunk before it, so the
/// chunks' marks never overlap; [p+8, p+16), its size field, is the allocator's.
struct Region {
    start: u64,
    arena: Option<usize>,
    /// Bytes in use on each page: the program's (usable) and the allocator's own.
    in_use: Vec<u32>,
    /// Of those, the allocator's own: chunk headers, heap and arena headers, thread cache
    /// tables, fenceposts.
    own: Vec<u32>,
}

impl Region {
    fn new(start: u64, end: u64, arena: Option<usize>, page: u64) -> Self {
        let start = start / page * page;
        let pages = (end.next_multiple_of(page) - start).div_ceil(page) as usize;
        Self {
            start,
            arena,
            in_use: vec![0; pages],
            own: vec![0; pages],
        }
    }
    /// Adds (`sign` 1) or takes away (-1) [lo, hi) in use, as the allocator's own bytes
    /// (`own`) or the program's.
    fn add(&mut self, lo: u64, hi: u64, page: u64, sign: i64, own: bool) {
        let hi = hi.min(self.start + self.in_use.len() as u64 * page);
        let mut at = lo.max(self.start);
        let bump =
            |slot: &mut u32, n: u64| *slot = (i64::from(*slot) + sign * n as i64).max(0) as u32;
        while at < hi {
            let p = (at - self.start) / page;
            let page_end = self.start + (p + 1) * page;
            let n = hi.min(page_end) - at;
            bump(&mut self.in_use[p as usize], n);
            if own {
                bump(&mut self.own[p as usize], n);
            }
            at += n;
        }
    }
    /// Marks chunk `p` of `csize` bytes in use by the program (`sign` 1) or no longer
    /// (-1): its size field as the allocator's, its user memory as the program's.
    fn chunk(&mut self, p: u64, csize: u64, page: u64, sign: i64) {
        self.add(p + SIZE_SZ, p + 2 * SIZE_SZ, page, sign, true);
        self.add(p + 2 * SIZE_SZ, p + csize + SIZE_SZ, page, sign, false);
    }
}

/// The size class a chunk is counted in.
fn class_of(size: u64) -> u64 {
    if size <= 1024 {
        return size;
    }
    let step = 1u64 << (63 - size.leading_zeros()).saturating_sub(2);
    size.next_multiple_of(step)
}

/// Chunks by size class, with the last page counted for each: an array for the exact
/// sizes up to 1 KiB (most chunks, so the walk pays no lookup), a map above.
struct Classes {
    small: Vec<(GlibcClass, u64)>,
    by_size: BTreeMap<u64, (GlibcClass, u64)>,
}

impl Default for Classes {
    fn default() -> Self {
        Self {
            small: vec![Default::default(); (1024 / ALIGN + 1) as usize],
            by_size: BTreeMap::new(),
        }
    }
}

impl Classes {
    fn slot(&mut self, size: u64) -> &mut (GlibcClass, u64) {
        if size <= 1024 {
            &mut self.small[(size / ALIGN) as usize]
        } else {
            self.by_size.entry(class_of(size)).or_default()
        }
    }

    fn into_classes(self) -> Vec<GlibcClass> {
        self.small
            .into_iter()
            .chain(self.by_size.into_values())
            .map(|c| c.0)
            .filter(|c| c.in_use + c.free > 0)
            .collect()
    }

    fn in_use(&mut self, addr: u64, size: u64, page: u64, sign: i64) {
        let (c, last_page) = self.slot(size);
        c.chunk_size = class_of(size);
        if sign > 0 {
            c.in_use += 1;
            c.in_use_bytes += size;
            let (first, last) = (addr / page, (addr + size - 1) / page);
            let first = if first == *last_page && c.pages > 0 {
                first + 1
            } else {
                first
            };
            c.pages += (last + 1).saturating_sub(first);
            *last_page = last;
        } else {
            c.in_use -= 1;
            c.in_use_bytes -= size;
        }
    }
    fn free(&mut self, size: u64) {
        let (c, _) = self.slot(size);
        c.chunk_size = class_of(size);
        c.free += 1;
        c.free_bytes += size;
    }
}

/// The census's working state.
struct Walk<'a> {
    release: &'static Release,
    mem: &'a mut ProcessMemory,
    page: u64,
    residency: Residency<'a>,
    arenas: Vec<GlibcArena>,
    regions: Vec<Region>,
    classes: Classes,
    /// Fastbin chunks (addresses), found from the arenas' lists before the walk.
    fastbin: HashSet<u64>,
    /// In-use chunks the size of a thread's cache table: (address, size, region, first
    /// chunk of its heap).
    tcache_candidates: Vec<(u64, u64, usize, bool)>,
    window: Vec<u8>,
    window_at: u64,
    tcache_found: u64,
    /// The blocks in use, when asked for (`live_blocks`): (chunk, its size field, mmapped).
    blocks: Option<Vec<(u64, u64, bool)>>,
    /// Chunks found in use that a thread cache holds, or that are a cache's table.
    cached: HashSet<u64>,
}

/// Reads the heap of process `pid` (which the caller holds stopped, or not: then the
/// figures may not hold together). `maps`: its memory map; `residency`: pagemap of its
/// heap-holding mappings.
pub fn census(
    mem: &mut ProcessMemory,
    layout: &GlibcLayout,
    maps: &[Mapping],
    residency: &[ResidentRange],
    page: u64,
) -> Result<GlibcHeap, CensusError> {
    census_walk(mem, layout, maps, residency, page, false).map(|(h, _)| h)
}

/// The blocks the program holds, as malloc_usable_size gives them: (address, usable
/// bytes), in address order. The same walk and checks as [`census`]; the caller holds the
/// process stopped.
pub fn live_blocks(
    mem: &mut ProcessMemory,
    layout: &GlibcLayout,
    maps: &[Mapping],
    residency: &[ResidentRange],
    page: u64,
) -> Result<Vec<(u64, u64)>, CensusError> {
    let (_, blocks) = census_walk(mem, layout, maps, residency, page, true)?;
    Ok(blocks)
}

fn census_walk(
    mem: &mut ProcessMemory,
    layout: &GlibcLayout,
    maps: &[Mapping],
    residency: &[ResidentRange],
    page: u64,
    want_blocks: bool,
) -> Result<(GlibcHeap, Vec<(u64, u64)>), CensusError> {
    let release = layout.release;
    let mp = match layout.mp {
        Some(a) => {
            let mut b = vec![0u8; release.par_size];
            mem.read(a, &mut b)?;
            Some(b)
        }
        None => None,
    };
    let started_read = mem.bytes_read();
    let mut w = Walk {
        release,
        mem,
        page,
        residency: Residency::new(residency, page),
        arenas: Vec::new(),
        regions: Vec::new(),
        classes: Classes::default(),
        fastbin: HashSet::new(),
        tcache_candidates: Vec::new(),
        window: Vec::new(),
        window_at: 0,
        tcache_found: 0,
        blocks: want_blocks.then(Vec::new),
        cached: HashSet::new(),
    };
    let states = arena_states(w.mem, layout)?;
    let main_top = le(&states[0].1, release.top);
    if main_top == layout.main_arena + release.top as u64 - 2 * SIZE_SZ || main_top == 0 {
        // The initial top is the unsorted bin: malloc never ran.
        return Err(CensusError::NoHeap);
    }
    w.fastbins(&states)?;
    for (i, (addr, b)) in states.iter().enumerate() {
        let top = le(b, release.top);
        let top_size = w.mem.read_u64(top + SIZE_SZ)? & !SIZE_BITS;
        let mut arena = GlibcArena {
            main: i == 0,
            system_mem: le(b, release.system_mem),
            threads: le(b, release.attached_threads),
            top_bytes: top_size,
            ..Default::default()
        };
        w.arenas.push(GlibcArena::default());
        if i == 0 {
            let grew_by_mmap = le(b, MS_FLAGS) & NONCONTIGUOUS_BIT != 0;
            w.main_heap(
                &mut arena,
                mp.as_deref(),
                maps,
                grew_by_mmap,
                (top, top_size),
            )?;
        } else {
            w.arena_heaps(&mut arena, i, *addr, top, top_size)?;
        }
        w.arenas[i] = arena;
    }
    let key = match layout.tcache_key {
        Some(a) => Some(w.mem.read_u64(a)?),
        None => None,
    };
    w.tcaches(key, mp.as_ref().map(|m| le(m, release.tcache_count)))?;
    // Where glibc counts no chunk mmapped alone, none is looked for: memory the program
    // or a runtime maps itself can begin as such a chunk does (a cgo server's snapshot
    // found a "chunk" of 7.5 MiB in its Go heap, and the census was refused).
    let counted = mp.as_deref().map(|mp| mmapped_counts(release, mp));
    let (mmapped_chunks, mmapped_bytes) = match counted {
        Some((0, 0)) => (0, 0),
        _ => w.mmapped(maps)?,
    };
    if let Some((n, counted)) = counted {
        if (n, counted) != (mmapped_chunks, mmapped_bytes) {
            return Err(CensusError::Inconsistent(format!(
                "{mmapped_chunks} mmapped chunks of {mmapped_bytes} bytes found, glibc \
                 counts {n} of {counted}"
            )));
        }
    }
    let blocks = w.live_blocks();
    Ok((
        w.finish(layout, mmapped_chunks, mmapped_bytes, started_read),
        blocks,
    ))
}

/// The arenas' `malloc_state`s (address, bytes), from the main one round its `next` list.
fn arena_states(
    mem: &mut ProcessMemory,
    layout: &GlibcLayout,
) -> Result<Vec<(u64, Vec<u8>)>, CensusError> {
    let mut states = Vec::new();
    let mut at = layout.main_arena;
    loop {
        let mut b = vec![0u8; layout.release.state_size];
        mem.read(at, &mut b)?;
        let next = le(&b, layout.release.next);
        states.push((at, b));
        if next == layout.main_arena {
            break;
        }
        if states.len() >= MAX_ARENAS || next == 0 {
            return Err(CensusError::Inconsistent(
                "glibc's list of arenas does not come back to the main arena".into(),
            ));
        }
        at = next;
    }
    Ok(states)
}

/// glibc's own count of its chunks mmapped alone and of their bytes (`mp_`).
fn mmapped_counts(release: &Release, mp: &[u8]) -> (u64, u64) {
    let n = u64::from(u32::from_le_bytes(
        mp[release.n_mmaps..release.n_mmaps + 4].try_into().unwrap(),
    ));
    (n, le(mp, release.mmapped_mem))
}

impl Walk<'_> {
    /// Every arena's fastbin chunks, each list checked (none in a release without them).
    fn fastbins(&mut self, states: &[(u64, Vec<u8>)]) -> Result<(), CensusError> {
        let Some(fastbins) = self.release.fastbins else {
            return Ok(());
        };
        for (_, b) in states {
            for i in 0..NFASTBINS {
                let mut p = le(b, fastbins + 8 * i);
                let mut n = 0u64;
                while p != 0 {
                    if !p.is_multiple_of(ALIGN) || n > MAX_LIST || !self.fastbin.insert(p) {
                        return Err(CensusError::Inconsistent(format!(
                            "a fastbin list does not hold together (at {p:#x})"
                        )));
                    }
                    n += 1;
                    let stored = self.mem.read_u64(p + 2 * SIZE_SZ)?;
                    p = reveal(p + 2 * SIZE_SZ, stored);
                }
            }
        }
        Ok(())
    }

    /// The main arena's brk heap, from its start to the end of its top chunk; or, for an
    /// arena that grew by mmap once the brk heap could not (`grew_by_mmap`), each of its
    /// segments (see [`Walk::main_arena_segments`]). `top`: its top chunk and size.
    fn main_heap(
        &mut self,
        arena: &mut GlibcArena,
        mp: Option<&[u8]>,
        maps: &[Mapping],
        grew_by_mmap: bool,
        (top, top_size): (u64, u64),
    ) -> Result<(), CensusError> {
        let (i, page, top_end) = (0, self.page, top + top_size);
        let brk_start = match mp {
            Some(mp) => Some(le(mp, self.release.sbrk_base)).filter(|&a| a != 0),
            None => maps.iter().find(|m| m.path == "[heap]").map(|m| m.start),
        };
        let segments = if grew_by_mmap {
            self.main_arena_segments(maps, brk_start, top, top_end)?
        } else {
            let start = brk_start.ok_or_else(|| {
                CensusError::Inconsistent("the main arena's top is not in [heap]".into())
            })?;
            vec![(start, top_end)]
        };
        let span: u64 = segments.iter().map(|&(lo, hi)| hi - lo).sum();
        let (start, end) = *segments.last().expect("the top's segment");
        if top < start.next_multiple_of(ALIGN)
            || end != top_end
            || span.abs_diff(arena.system_mem) > ALIGN * segments.len() as u64
        {
            return Err(CensusError::Inconsistent(format!(
                "the main arena's top chunk ({top:#x}, {top_size} bytes) is not the end of its \
                 heap from {start:#x}, or its {} segments of {span} bytes are not the {} bytes \
                 it counts: the heap is not contiguous, and its other segments were not all \
                 found",
                segments.len(),
                arena.system_mem
            )));
        }
        arena.heaps = segments.len() as u64;
        for &(lo, hi) in &segments {
            let first = lo.next_multiple_of(ALIGN);
            self.regions.push(Region::new(lo, hi, Some(i), page));
            let r = self.regions.len() - 1;
            // The alignment before the first chunk and its unused prev_size field.
            self.regions[r].add(lo, first + SIZE_SZ, page, 1, true);
            self.walk(r, arena, first, top, hi, hi == top_end)?;
        }
        Ok(())
    }

    /// A thread arena's heaps: the one holding its top, then each one before it.
    fn arena_heaps(
        &mut self,
        arena: &mut GlibcArena,
        i: usize,
        addr: u64,
        top: u64,
        top_size: u64,
    ) -> Result<(), CensusError> {
        let (page, top_end) = (self.page, top + top_size);
        let mut h = top & !(HEAP_MAX - 1);
        let mut heaps = Vec::new();
        loop {
            let mut hi = [0u8; HEAP_INFO_SIZE as usize];
            self.mem.read(h, &mut hi)?;
            if le(&hi, HI_AR_PTR) != addr || heaps.len() > 1 << 16 {
                return Err(CensusError::Inconsistent(format!(
                    "the heap at {h:#x} does not name its arena {addr:#x}"
                )));
            }
            heaps.push((h, le(&hi, HI_SIZE)));
            match le(&hi, HI_PREV) {
                0 => break,
                prev => h = prev,
            }
        }
        let total: u64 = heaps.iter().map(|h| h.1).sum();
        if total != arena.system_mem {
            return Err(CensusError::Inconsistent(format!(
                "an arena's heaps hold {total} bytes, the arena counts {}",
                arena.system_mem
            )));
        }
        arena.heaps = heaps.len() as u64;
        for (k, &(h, size)) in heaps.iter().enumerate() {
            let first_heap = k == heaps.len() - 1;
            let header = if first_heap {
                // heap_info, then the arena, then the first chunk, aligned so that
                // its user memory is.
                let mut c = h + HEAP_INFO_SIZE + self.release.state_size as u64;
                let mis = (c + 2 * SIZE_SZ) % ALIGN;
                if mis != 0 {
                    c += ALIGN - mis;
                }
                c - h
            } else {
                HEAP_INFO_SIZE
            };
            arena.overhead_bytes += header;
            self.regions.push(Region::new(h, h + size, Some(i), page));
            let r = self.regions.len() - 1;
            // With the first chunk's prev_size field, which no chunk before it uses.
            self.regions[r].add(h, h + header + SIZE_SZ, page, 1, true);
            let is_top_heap = k == 0;
            let end = if is_top_heap { top_end } else { h + size };
            if is_top_heap && top_end != h + size {
                return Err(CensusError::Inconsistent(format!(
                    "an arena's top chunk ends at {top_end:#x}, its heap at {:#x}",
                    h + size
                )));
            }
            self.walk(r, arena, h + header, top, end, is_top_heap)?;
        }
        Ok(())
    }

    /// The blocks the program holds (when asked for), as malloc_usable_size gives them,
    /// in address order; those in threads' caches left out.
    fn live_blocks(&mut self) -> Vec<(u64, u64)> {
        let mmapped_layout = self.release.mmapped;
        let mut blocks: Vec<(u64, u64)> = self
            .blocks
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(c, ..)| !self.cached.contains(c))
            // User memory starts after the chunk header; an arena chunk lends its last 8
            // bytes to the next chunk's header, an mmapped one as its release lays it out.
            .map(|(c, csize, mmapped)| {
                let usable = if mmapped {
                    mmapped_layout.usable(csize)
                } else {
                    csize - SIZE_SZ
                };
                (c + 2 * SIZE_SZ, usable)
            })
            .collect();
        blocks.sort_unstable();
        blocks
    }
}

/// glibc's safe-linking (2.32 and later): a list pointer stored at `pos` is the pointer
/// xored with `pos >> 12`.
fn reveal(pos: u64, stored: u64) -> u64 {
    (pos >> 12) ^ stored
}

impl Walk<'_> {
    /// The header word (size and bits) of the chunk at `p`, read through the window.
    fn size_at(&mut self, p: u64, end: u64) -> Result<u64, CensusError> {
        let at = p + SIZE_SZ;
        if at < self.window_at || at + 8 > self.window_at + self.window.len() as u64 {
            let hi = (at + WINDOW).min(end.max(at + 8));
            self.window_at = at;
            self.mem
                .read_ranges(&[(at, (hi - at) as usize)], &mut self.window)?;
        }
        let o = (at - self.window_at) as usize;
        Ok(le(&self.window, o))
    }

    /// Walks the chunks of one heap from `first` to `end`; `top`: the arena's top chunk,
    /// which ends the walk of the heap that holds it (`has_top`).
    fn walk(
        &mut self,
        r: usize,
        arena: &mut GlibcArena,
        first: u64,
        top: u64,
        end: u64,
        has_top: bool,
    ) -> Result<(), CensusError> {
        let page = self.page;
        let mut p = first;
        let mut size = self.size_at(p, end)?;
        // A run of free chunks (bins and fastbins), which malloc_trim would consolidate.
        let mut run: Option<u64> = None;
        let mut first_chunk = true;
        loop {
            if has_top && p == top {
                // The top chunk: free; a run just before it merges into it.
                let from = run.take().unwrap_or(top);
                if arena.main {
                    arena.trimmable_bytes += self.trim_top(from, end);
                }
                return Ok(());
            }
            let csize = size & !SIZE_BITS;
            if csize == 0 && !has_top {
                // The fencepost that ends an old heap (its first 8 bytes are the chunk
                // before it's).
                arena.overhead_bytes += end - p;
                self.regions[r].add(p + SIZE_SZ, end, page, 1, true);
                return self.end_run(arena, &mut run, p);
            }
            let next = p + csize;
            if csize < 2 * SIZE_SZ || !csize.is_multiple_of(ALIGN) || next > end {
                return Err(CensusError::Inconsistent(format!(
                    "a chunk at {p:#x} has size {csize:#x}, past its heap's end {end:#x}"
                )));
            }
            let next_size = if next + 2 * SIZE_SZ <= end {
                self.size_at(next, end)?
            } else {
                PREV_INUSE
            };
            if csize < MINSIZE {
                // A fencepost (the end of an old heap).
                arena.overhead_bytes += csize;
                self.regions[r].add(p + SIZE_SZ, next + SIZE_SZ, page, 1, true);
                self.end_run(arena, &mut run, p)?;
            } else if next_size & PREV_INUSE == 0 {
                arena.free_chunks += 1;
                arena.free_bytes += csize;
                self.classes.free(csize);
                run.get_or_insert(p);
            } else if csize <= MAX_FAST_CHUNK && self.fastbin.contains(&p) {
                arena.fastbin_chunks += 1;
                arena.fastbin_bytes += csize;
                self.classes.free(csize);
                run.get_or_insert(p);
            } else {
                self.end_run(arena, &mut run, p)?;
                arena.in_use_chunks += 1;
                arena.in_use_bytes += csize;
                self.regions[r].chunk(p, csize, page, 1);
                self.classes.in_use(p, csize, page, 1);
                if let Some(b) = &mut self.blocks {
                    b.push((p, csize, false));
                }
                if self.release.tcache.chunks.contains(&csize) {
                    self.tcache_candidates.push((p, csize, r, first_chunk));
                }
            }
            first_chunk = false;
            p = next;
            size = next_size;
            if p >= end {
                return self.end_run(arena, &mut run, p);
            }
        }
    }

    /// Ends a run of free chunks at `at`: what malloc_trim would give back from it (it
    /// keeps each free chunk's first 48 bytes and returns the whole pages after them).
    fn end_run(
        &mut self,
        arena: &mut GlibcArena,
        run: &mut Option<u64>,
        at: u64,
    ) -> Result<(), CensusError> {
        if let Some(start) = run.take() {
            arena.trimmable_bytes += self.residency.resident_bytes(start + MALLOC_CHUNK, at);
        }
        Ok(())
    }

    /// systrim with no pad: the main arena's top gives back its whole pages but the last
    /// MINSIZE bytes' page.
    fn trim_top(&self, from: u64, end: u64) -> u64 {
        let size = end - from;
        if size <= MINSIZE + 1 {
            return 0;
        }
        let extra = (size - MINSIZE - 1) / self.page * self.page;
        self.residency.resident_bytes(end - extra, end)
    }

    /// Checks each candidate thread cache and moves its chunks from in use to free.
    /// `key`: the value of glibc's `tcache_key`, which every cached chunk carries; `fill`:
    /// `mp_.tcache_count`, the most chunks a bin holds (both known from debug symbols only).
    fn tcaches(&mut self, key: Option<u64>, fill: Option<u64>) -> Result<(), CensusError> {
        let tcache = &self.release.tcache;
        let candidates = std::mem::take(&mut self.tcache_candidates);
        let ranges: Vec<(u64, usize)> = candidates
            .iter()
            .map(|&(p, ..)| (p + 2 * SIZE_SZ, tcache.table))
            .collect();
        let mut tables = Vec::new();
        self.mem.read_ranges(&ranges, &mut tables)?;
        for (k, &(p, csize, r, first_chunk)) in candidates.iter().enumerate() {
            let t = &tables[k * tcache.table..(k + 1) * tcache.table];
            let Some(chunks) = tcache.chunks_in(self.mem, t, key, fill) else {
                continue;
            };
            if chunks.is_empty() && tcache.counts == TcacheCounts::Held && !first_chunk {
                // An empty table (all zero) that is not where a thread's first malloc puts
                // it: as likely a zeroed block of the program's. An empty table that counts
                // free slots has each at the fill count, which no zeroed block has.
                continue;
            }
            self.tcache_found += 1;
            self.cached.insert(p);
            let page = self.page;
            let arena = self.regions[r].arena.unwrap_or(0);
            let a = &mut self.arenas[arena];
            a.in_use_chunks -= 1;
            a.in_use_bytes -= csize;
            a.overhead_bytes += csize;
            // Its user memory is the allocator's table, not the program's.
            let table = (p + 2 * SIZE_SZ, p + csize + SIZE_SZ);
            self.regions[r].add(table.0, table.1, page, -1, false);
            self.regions[r].add(table.0, table.1, page, 1, true);
            self.classes.in_use(p, csize, page, -1);
            for (c, size) in chunks {
                // A chunk mmapped alone, which a large bin may hold when glibc's tunables
                // let it cache chunks that big, is in no arena's heap: it stays counted
                // with the mmapped chunks (as mallinfo2's hblkhd counts it).
                let Some(cr) = self
                    .regions
                    .iter()
                    .position(|g| g.start <= c && c < g.start + g.in_use.len() as u64 * page)
                else {
                    continue;
                };
                self.cached.insert(c);
                let owner = self.regions[cr].arena.unwrap_or(0);
                let a = &mut self.arenas[owner];
                a.in_use_chunks -= 1;
                a.in_use_bytes -= size;
                a.tcache_chunks += 1;
                a.tcache_bytes += size;
                self.regions[cr].chunk(c, size, page, -1);
                self.classes.in_use(c, size, page, -1);
                self.classes.free(size);
            }
        }
        Ok(())
    }

    fn finish(
        self,
        layout: &GlibcLayout,
        mmapped_chunks: u64,
        mmapped_bytes: u64,
        started_read: u64,
    ) -> GlibcHeap {
        let page = self.page;
        let mut arenas = self.arenas;
        let mut occupancy_pages = vec![0u64; OCCUPANCY_BUCKETS];
        let mut occupancy_in_use = vec![0u64; OCCUPANCY_BUCKETS];
        let mut occupancy_overhead = vec![0u64; OCCUPANCY_BUCKETS];
        let mut mmapped_resident = 0;
        for r in &self.regions {
            for (i, (&used, &own)) in r.in_use.iter().zip(&r.own).enumerate() {
                let addr = r.start + i as u64 * page;
                if !self.residency.resident(addr) {
                    continue;
                }
                let used = u64::from(used).min(page);
                let bucket = if used == 0 {
                    0
                } else {
                    1 + ((used * 10 / page) as usize).min(9)
                };
                occupancy_pages[bucket] += 1;
                occupancy_in_use[bucket] += used;
                occupancy_overhead[bucket] += u64::from(own).min(used);
                match r.arena {
                    Some(a) => {
                        let a = &mut arenas[a];
                        a.resident_bytes += page;
                        if used == 0 {
                            a.free_pages_bytes += page;
                        } else {
                            a.free_in_used_pages += page - used;
                        }
                    }
                    None => mmapped_resident += page,
                }
            }
        }
        let classes = self.classes.into_classes();
        GlibcHeap {
            version: layout.release.name.to_string(),
            layout_source: layout.source.clone(),
            page_size: page,
            tcaches: self.tcache_found,
            arenas,
            mmapped_chunks,
            mmapped_bytes,
            mmapped_trailer: layout.release.mmapped.trailer(),
            mmapped_resident,
            occupancy_pages,
            occupancy_in_use,
            occupancy_overhead,
            classes,
            bytes_read: self.mem.bytes_read() - started_read,
        }
    }
}

/// Process-wide figures that agree with mallinfo2: (in use = uordblks + hblkhd, free =
/// fordblks).
pub fn mallinfo_view(h: &GlibcHeap) -> (u64, u64) {
    let in_use = h.sum(GlibcArena::allocator_in_use) + h.mmapped_bytes;
    let free = h.sum(GlibcArena::allocator_free);
    (in_use, free)
}

#[cfg(test)]
mod tests;
