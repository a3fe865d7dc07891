//! mimalloc 3.0's heap (Debian 13's libmimalloc3, 3.0.1), read from outside a running
//! process.
//!
//! 3.0 lays its arenas out as 3.3 does (64 KiB slices, bitmaps of free and committed
//! slices after the arena's header), but keeps no list of heaps: each thread's heaps hang
//! off its thread-local data, out of reach. Instead every arena keeps a bitmap of all the
//! pages registered in it (`pages`: a bit at each page's first slice, owned or abandoned),
//! and each page's descriptor (`mi_page_t`) is at the start of its first slice, its blocks
//! after it. Pages taken from the OS outside arenas (blocks over 32 MiB, alignments over
//! 64 KiB) are only in their heap's queues: a thread's heaps are reached from the heap its
//! pages in arenas name (the main thread's from the library's statics) and walked for
//! them; a thread none of whose pages is in an arena is not reached, and such blocks of
//! its are left to the decomposition's "other anonymous".
//!
//! Debian's library is stripped to its exported names: its statics are found by their
//! shape in its data. `heap_main` (the main thread's heap) points to `tld_main` (its
//! thread data), which points back to it as its backing heap and to `subproc_main` (the
//! sub-process: its arenas and abandoned pages outside arenas) — a cycle of pointers no
//! other words of the data form; one place only is taken.
//!
//! Layout: mimalloc 3.0.1 built as Debian builds it (cmake's defaults: `MI_DEBUG` 0, as the
//! library's lack of assertion messages shows; not secure, no padding, free lists not
//! encoded, page descriptors at each page's start; x86-64), taken with `offsetof` from that
//! source so configured. Checked: the sub-process initialised; each arena's sub-process,
//! alignment and slices; each page's descriptor naming its arena and first slice, its
//! slices inside the arena and none of them free nor another page's, its blocks starting
//! right after its descriptor (a secure or padded build starts them later), `used <=
//! capacity <= reserved`, its free lists' heads on carved blocks and every block of its
//! thread-free list on one; and each thread's heaps' page counts (the thread reached
//! through its pages' heap, its thread data naming it) met by the pages found as its.

use std::collections::{BTreeMap, BTreeSet};

use super::v3::read::{arena_slices, bitmap, runs, take, CHUNK_BITS, MAX_ARENA_SLICES, SLICE};
use super::*;
use crate::library::StaticData;

/// The release read, as `mi_version()` gives it.
pub(super) const RELEASE: (u32, &str) = (301, "mimalloc 3.0.1");

// mi_subproc_t: its bytes read (to its memid's kind), then fields
const SUBPROC_READ: usize = 2008;
const SUBPROC_ARENA_COUNT: usize = 0;
const SUBPROC_ARENAS: usize = 8;
const SUBPROC_OS_ABANDONED: usize = 1936;
const SUBPROC_MEMKIND: usize = 2000;
const MAX_ARENAS: u64 = 160;
// mi_memkind_t: static, OS (first and last kind of OS memory), arena
const KIND_STATIC: u32 = 2;
const KIND_OS: (u32, u32) = (4, 6);
const KIND_ARENA: u32 = 7;
// mi_tld_t
const TLD_THREAD_ID: usize = 0;
const TLD_SUBPROC: usize = 16;
const TLD_HEAP_BACKING: usize = 24;
const TLD_HEAPS: usize = 32;
// mi_heap_t: its thread data, page count, next heap of its thread, page queues
const HEAP_TLD: usize = 0;
const HEAP_PAGE_COUNT: usize = 160;
const HEAP_NEXT: usize = 192;
const HEAP_QUEUES: usize = 1248;
const QUEUE_SIZE: usize = 24;
const QUEUES: usize = 75;
const HEAP_READ: usize = HEAP_QUEUES + QUEUES * QUEUE_SIZE;
// mi_arena_t
const ARENA_READ: usize = 104;
const ARENA_SUBPROC: usize = 24;
const ARENA_SLICES: usize = 32;
const ARENA_INFO_SLICES: usize = 40;
const ARENA_FREE: usize = 64;
const ARENA_COMMITTED: usize = 72;
const ARENA_PAGES: usize = 96;
// mi_bitmap_t's and mi_bbitmap_t's chunks, after their headers
const BITMAP_CHUNKS: u64 = 128;
const BBITMAP_CHUNKS: u64 = 640;
// mi_page_t: its size, and where its blocks start when their size is not a power of two
// (`mi_page_info_size()`: the descriptor rounded up to 16 bytes)
const PAGE_STRUCT: usize = 120;
const PAGE_INFO: u64 = 128;
const PAGE_THREAD_ID: usize = 0;
const PAGE_FREE: usize = 8;
const PAGE_USED: usize = 16;
const PAGE_CAPACITY: usize = 18;
const PAGE_RESERVED: usize = 20;
const PAGE_LOCAL_FREE: usize = 24;
const PAGE_THREAD_FREE: usize = 32;
const PAGE_BLOCK_SIZE: usize = 40;
const PAGE_START: usize = 48;
const PAGE_HEAP: usize = 64;
const PAGE_NEXT: usize = 72;
// the page's mi_memid_t: an arena and slices, or an OS base and size, then its kind
const PAGE_MEMID_ARENA: usize = 96;
const PAGE_MEMID_SLICE: usize = 104;
const PAGE_MEMID_SLICES: usize = 108;
const PAGE_MEMID_OS_BASE: usize = 96;
const PAGE_MEMID_OS_SIZE: usize = 104;
const PAGE_MEMID_KIND: usize = 112;
/// Page flags in the low bits of a page's thread id; at most 4 (with the flags cleared),
/// the page is abandoned.
const THREAD_FLAGS: u64 = 7;
const ABANDONED_MAPPED: u64 = 4;
/// Heaps of a thread, pages of a list, read at most: more is not a list mimalloc made.
const MAX_LIST: u64 = 1 << 20;

/// Where the library's data lies in the process: its statics are found there at each
/// census.
#[derive(Debug, Clone)]
pub(super) struct Statics {
    data: (u64, usize),
}

/// The statics of a 3.0.1 image (`file`, at `path`, its writable data at `data`); Err when
/// it is another release.
pub(super) fn locate(
    file: &object::File,
    path: &str,
    data: (u64, usize),
) -> Result<(&'static str, Statics), String> {
    match version_of(file) {
        Some(v) if v == RELEASE.0 => Ok((RELEASE.1, Statics { data })),
        other => Err(format!(
            "{path} is not {} (its version: {other:?})",
            RELEASE.1
        )),
    }
}

/// The statics found by their shape: the main thread's heap and data, the sub-process,
/// and the main thread's id.
struct Found {
    heap_main: u64,
    subproc: u64,
    main_thread: u64,
}

/// `heap_main`, `tld_main` and `subproc_main` in the library's data: the only heap whose
/// thread data names it its backing heap.
fn find(data: &StaticData) -> Result<Found, String> {
    let word = |at: u64| data.at(at, 8).map(|b| le_u64(b, 0));
    let mut found = Vec::new();
    for off in (0..data.bytes.len().saturating_sub(8)).step_by(8) {
        let heap = data.base + off as u64;
        let Some(tld) = word(heap + HEAP_TLD as u64).filter(|&t| data.contains(t)) else {
            continue;
        };
        if word(tld + TLD_HEAP_BACKING as u64) != Some(heap) {
            continue;
        }
        let Some(subproc) = word(tld + TLD_SUBPROC as u64) else {
            continue;
        };
        if data.at(subproc, SUBPROC_READ).is_some() {
            found.push(Found {
                heap_main: heap,
                subproc,
                main_thread: word(tld + TLD_THREAD_ID as u64).unwrap_or(0),
            });
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err("mimalloc's main heap was not found in its library's data".into()),
        n => Err(format!(
            "{n} places in mimalloc's library data look like its main heap: none is taken"
        )),
    }
}

/// One census under way.
struct Census<'a> {
    mem: &'a mut ProcessMemory,
    residency: &'a Residency<'a>,
    found: Found,
    /// Per thread that owns a page: the pages found as its (in arenas and outside them),
    /// and a heap of its, which its pages name.
    threads: BTreeMap<u64, (u64, u64)>,
    os_pages: BTreeSet<u64>,
    tally: Tally,
}

/// Reads a 3.0.1 heap (see [`super::census`]).
pub(super) fn census(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    statics: &Statics,
    residency: &[ResidentRange],
) -> Result<MimallocHeap, String> {
    let residency = &Residency::new(residency, PAGE);
    let start_read = mem.bytes_read();
    let data = StaticData::read(mem, statics.data, "mimalloc")?;
    let found = find(&data)?;
    let sub = data
        .at(found.subproc, SUBPROC_READ)
        .expect("found inside the data")
        .to_vec();
    if le_u32(&sub, SUBPROC_MEMKIND) != KIND_STATIC || found.main_thread <= ABANDONED_MAPPED {
        return Err("mimalloc has not been initialised yet in this process".into());
    }
    let count = le_u64(&sub, SUBPROC_ARENA_COUNT);
    if count > MAX_ARENAS {
        return Err(format!(
            "mimalloc counts {count} arenas, more than it can have"
        ));
    }
    let threads = BTreeMap::from([(found.main_thread, (0, found.heap_main))]);
    let mut c = Census {
        mem,
        residency,
        found,
        threads,
        os_pages: BTreeSet::new(),
        tally: Tally::new(layout),
    };
    for i in 0..count {
        let at = le_u64(&sub, SUBPROC_ARENAS + 8 * i as usize);
        // 0: being added by another thread as the process stopped.
        if at != 0 {
            c.arena(i, at)?;
        }
    }
    let mut at = le_u64(&sub, SUBPROC_OS_ABANDONED);
    let mut walked = 0;
    while at != 0 {
        walked += 1;
        if walked > MAX_LIST {
            return Err("mimalloc's abandoned pages outside arenas loop".into());
        }
        at = c.os_page(at)?;
    }
    let owners: Vec<(u64, u64)> = c.threads.iter().map(|(&t, &(_, heap))| (t, heap)).collect();
    for (thread, heap) in owners {
        c.thread_heaps(thread, heap)?;
    }
    let read = c.mem.bytes_read() - start_read;
    c.tally.finish(read)
}

impl Census<'_> {
    /// Arena `i` at `at`: its info slices (metadata), its free slices, its pages, and the
    /// rest of its slices (metadata mimalloc carves from arenas: heaps, threads' data).
    fn arena(&mut self, i: u64, at: u64) -> Result<(), String> {
        let mut h = [0u8; ARENA_READ];
        self.mem
            .read(at, &mut h)
            .map_err(|e| format!("mimalloc's arena {i} could not be read ({e})"))?;
        let (slices, info) = (le_u64(&h, ARENA_SLICES), le_u64(&h, ARENA_INFO_SLICES));
        let sound = at.is_multiple_of(SLICE)
            && le_u64(&h, ARENA_SUBPROC) == self.found.subproc
            && slices > 0
            && slices <= MAX_ARENA_SLICES
            && slices.is_multiple_of(CHUNK_BITS)
            && info > 0
            && info < slices.min(CHUNK_BITS)
            && at.checked_add(slices * SLICE).is_some();
        if !sound {
            return Err(format!(
                "mimalloc's arena {i} at {at:#x} does not look like one ({slices} slices, \
                 {info} of them its own)"
            ));
        }
        let free = bitmap(
            self.mem,
            le_u64(&h, ARENA_FREE),
            BBITMAP_CHUNKS,
            slices,
            "free-slice",
        )?;
        let committed = bitmap(
            self.mem,
            le_u64(&h, ARENA_COMMITTED),
            BITMAP_CHUNKS,
            slices,
            "committed-slice",
        )?;
        let pages = bitmap(
            self.mem,
            le_u64(&h, ARENA_PAGES),
            BITMAP_CHUNKS,
            slices,
            "page",
        )?;
        let (mut taken, mut counted) = arena_slices(
            &mut self.tally,
            self.residency,
            (i, at),
            slices,
            info,
            &free,
            &committed,
        )?;
        for (first, n) in runs(&pages) {
            for slice in first..first + n {
                counted += self
                    .arena_page(at, slices, slice, &mut taken)
                    .map_err(|why| format!("the page at {:#x} {why}", at + slice * SLICE))?;
            }
        }
        let all = self.residency.resident_bytes(at, at + slices * SLICE);
        self.tally.heap.metadata_resident += all.saturating_sub(counted);
        Ok(())
    }

    /// The page whose first slice is `slice` of the arena at `arena` (of `slices`): its
    /// resident bytes.
    fn arena_page(
        &mut self,
        arena: u64,
        slices: u64,
        slice: u64,
        taken: &mut [u64],
    ) -> Result<u64, String> {
        let lo = arena + slice * SLICE;
        let mut p = [0u8; PAGE_STRUCT];
        self.mem
            .read(lo, &mut p)
            .map_err(|e| format!("could not be read ({e})"))?;
        let n = u64::from(le_u32(&p, PAGE_MEMID_SLICES));
        if le_u32(&p, PAGE_MEMID_KIND) != KIND_ARENA
            || le_u64(&p, PAGE_MEMID_ARENA) != arena
            || u64::from(le_u32(&p, PAGE_MEMID_SLICE)) != slice
            || n == 0
            || slice + n > slices
        {
            return Err(format!(
                "has a descriptor that places it elsewhere (kind {}, arena {:#x}, slice {} \
                 and {n} slices)",
                le_u32(&p, PAGE_MEMID_KIND),
                le_u64(&p, PAGE_MEMID_ARENA),
                le_u32(&p, PAGE_MEMID_SLICE)
            ));
        }
        if !take(taken, slice, n) {
            return Err(
                "shares its slices with a free slice, its arena's own or another page".into(),
            );
        }
        self.page(&p, (lo, lo + n * SLICE))
    }

    /// A page (its descriptor `p`, its memory `lo..hi`), checked and tallied: its resident
    /// bytes.
    fn page(&mut self, p: &[u8], (lo, hi): (u64, u64)) -> Result<u64, String> {
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([p[o], p[o + 1]]));
        let (used, capacity, reserved) = (
            u16_at(PAGE_USED),
            u16_at(PAGE_CAPACITY),
            u16_at(PAGE_RESERVED),
        );
        let (block_size, start) = (le_u64(p, PAGE_BLOCK_SIZE), le_u64(p, PAGE_START));
        if block_size == 0 || reserved == 0 || used > capacity || capacity > reserved {
            return Err(format!(
                "has {used} blocks used, {capacity} carved and {reserved} reserved of {block_size} bytes"
            ));
        }
        // Right after the descriptor; a power of two up to 1 KiB aligned to its size; a
        // block aligned over 64 KiB one slice in.
        let after = lo + PAGE_INFO;
        let aligned = block_size.is_power_of_two()
            && block_size <= 1024
            && start == after.next_multiple_of(block_size);
        if !(start == after || aligned || (reserved == 1 && start == lo + SLICE))
            || start.saturating_add(reserved.saturating_mul(block_size)) > hi
        {
            return Err(format!(
                "places {reserved} blocks of {block_size} bytes from {start:#x}, not where \
                 this build puts them"
            ));
        }
        let thread = le_u64(p, PAGE_THREAD_ID) & !THREAD_FLAGS;
        let abandoned = thread <= ABANDONED_MAPPED;
        if !abandoned {
            let entry = self
                .threads
                .entry(thread)
                .or_insert((0, le_u64(p, PAGE_HEAP)));
            entry.0 += 1;
        }
        let mut seen = PageSeen::new(start, block_size, capacity, used, thread);
        seen.check_list_heads(p, PAGE_FREE, PAGE_LOCAL_FREE)?;
        // The low bit: the page is owned.
        let head = le_u64(p, PAGE_THREAD_FREE) & !1;
        seen.thread_freed = super::read::thread_freed(self.mem, &seen, head)?;
        let resident = self.residency.resident_bytes(lo, hi);
        self.tally
            .add_page(seen, reserved, hi - lo, resident, abandoned);
        Ok(resident)
    }

    /// The page taken from the OS at `at` (its descriptor at its start): the next page of
    /// its list.
    fn os_page(&mut self, at: u64) -> Result<u64, String> {
        let mut p = [0u8; PAGE_STRUCT];
        self.mem
            .read(at, &mut p)
            .map_err(|e| format!("a page at {at:#x} outside arenas could not be read ({e})"))?;
        let kind = le_u32(&p, PAGE_MEMID_KIND);
        let (base, size) = (
            le_u64(&p, PAGE_MEMID_OS_BASE),
            le_u64(&p, PAGE_MEMID_OS_SIZE),
        );
        if !(KIND_OS.0..=KIND_OS.1).contains(&kind)
            || base > at
            || at - base >= size
            || !at.is_multiple_of(SLICE)
            || !self.os_pages.insert(at)
        {
            return Err(format!(
                "the page at {at:#x} outside arenas does not hold together (kind {kind}, its \
                 memory {size} bytes from {base:#x})"
            ));
        }
        let hi = base.saturating_add(size);
        self.tally.heap.committed_bytes += hi - at;
        self.page(&p, (at, hi))
            .map_err(|why| format!("the page at {at:#x} outside arenas {why}"))?;
        Ok(le_u64(&p, PAGE_NEXT))
    }

    /// The heaps of `thread` (its thread data's list, reached from its heap `heap`): their
    /// pages outside arenas, from their queues when they count more pages than were found
    /// as the thread's; then their count met. A thread none of whose pages is in an arena
    /// is not reached.
    fn thread_heaps(&mut self, thread: u64, heap: u64) -> Result<(), String> {
        let mut heaps = Vec::new();
        let unread =
            |e: std::io::Error| format!("the heaps of thread {thread:#x} could not be read ({e})");
        let tld = self.mem.read_u64(heap + HEAP_TLD as u64).map_err(unread)?;
        if self
            .mem
            .read_u64(tld + TLD_THREAD_ID as u64)
            .map_err(unread)?
            != thread
        {
            return Err(format!(
                "a page of thread {thread:#x} names a heap ({heap:#x}) of another thread"
            ));
        }
        let mut listed = false;
        let mut at = self.mem.read_u64(tld + TLD_HEAPS as u64).map_err(unread)?;
        while at != 0 {
            if heaps.len() as u64 >= MAX_LIST {
                return Err(format!("the list of heaps of thread {thread:#x} loops"));
            }
            let mut h = vec![0u8; HEAP_READ];
            self.mem.read(at, &mut h).map_err(unread)?;
            if le_u64(&h, HEAP_TLD) != tld {
                return Err(format!(
                    "mimalloc's heap at {at:#x} is on the list of thread {thread:#x}, not of it"
                ));
            }
            listed |= at == heap;
            at = le_u64(&h, HEAP_NEXT);
            heaps.push(h);
        }
        if !listed {
            return Err(format!(
                "the list of heaps of thread {thread:#x} lacks the heap its pages name"
            ));
        }
        let counted: u64 = heaps.iter().map(|h| le_u64(h, HEAP_PAGE_COUNT)).sum();
        let found_of = |c: &Self| c.threads.get(&thread).map_or(0, |t| t.0);
        if found_of(self) < counted {
            for h in &heaps {
                self.queued_os_pages(h, counted)?;
            }
        }
        if found_of(self) != counted {
            return Err(format!(
                "mimalloc's thread {thread:#x} counts {counted} pages in its heaps, and {} \
                 were found as its",
                found_of(self)
            ));
        }
        Ok(())
    }

    /// The pages outside arenas in the queues of a heap (its bytes `h`), `most` pages at
    /// most.
    fn queued_os_pages(&mut self, h: &[u8], most: u64) -> Result<(), String> {
        let mut walked = 0u64;
        for q in 0..QUEUES {
            let mut page = le_u64(h, HEAP_QUEUES + q * QUEUE_SIZE);
            while page != 0 {
                walked += 1;
                if walked > most {
                    return Err("a heap's queues hold more pages than its thread counts".into());
                }
                let mut p = [0u8; PAGE_STRUCT];
                self.mem
                    .read(page, &mut p)
                    .map_err(|e| format!("a queued page at {page:#x} could not be read ({e})"))?;
                let kind = le_u32(&p, PAGE_MEMID_KIND);
                let next = le_u64(&p, PAGE_NEXT);
                if (KIND_OS.0..=KIND_OS.1).contains(&kind) && !self.os_pages.contains(&page) {
                    self.os_page(page)?;
                }
                page = next;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    /// The library's data with `heap_main` at `heap`, `tld_main` at `tld` and the
    /// sub-process at 0x1000 (offsets in the data).
    fn data_with(cycles: &[(u64, u64)]) -> StaticData {
        let mut bytes = vec![0u8; 0x2000];
        let mut put = |at: u64, v: u64| {
            bytes[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
        };
        for &(heap, tld) in cycles {
            put(heap + HEAP_TLD as u64, BASE + tld);
            put(tld + TLD_THREAD_ID as u64, 0x7f00_1000);
            put(tld + TLD_SUBPROC as u64, BASE + 0x1000);
            put(tld + TLD_HEAP_BACKING as u64, BASE + heap);
        }
        StaticData { base: BASE, bytes }
    }

    #[test]
    fn the_main_heap_is_found_by_its_thread_data_pointing_back_at_it() {
        let found = find(&data_with(&[(0x100, 0x600)])).unwrap();
        assert_eq!(found.heap_main, BASE + 0x100);
        assert_eq!(found.subproc, BASE + 0x1000);
        assert_eq!(found.main_thread, 0x7f00_1000);
    }

    #[test]
    fn two_places_of_the_main_heaps_shape_or_none_are_refused() {
        let two = find(&data_with(&[(0x100, 0x600), (0x200, 0x800)]));
        assert!(two.is_err_and(|e| e.contains("2 places")));
        assert!(find(&data_with(&[])).is_err_and(|e| e.contains("not found")));
        // A sub-process that would pass the data's end is not one.
        let mut cut = data_with(&[(0x100, 0x600)]);
        cut.bytes.truncate(0x1000 + SUBPROC_READ - 8);
        assert!(find(&cut).is_err());
    }
}
