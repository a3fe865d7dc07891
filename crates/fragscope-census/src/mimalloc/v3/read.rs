//! The 3.x census itself: the heaps and their theaps, then every arena's slices (its info,
//! its free slices, each heap's pages), the pages outside arenas, each checked as it is
//! read.

use std::collections::BTreeSet;

use super::*;
use crate::memory::RecordReader;

pub(in crate::mimalloc) const SLICE: u64 = 64 << 10;
/// Bits of a bitmap chunk: an arena's slices are a multiple of it.
pub(in crate::mimalloc) const CHUNK_BITS: u64 = 512;
/// Slices of an arena at most (16 GiB: 512 chunks of 512).
pub(in crate::mimalloc) const MAX_ARENA_SLICES: u64 = CHUNK_BITS * CHUNK_BITS;
/// Heaps, and theaps of a heap, read at most: more is not a list mimalloc made.
const MAX_HEAPS: u64 = 1 << 12;
const MAX_THEAPS: usize = 1 << 16;
/// A page descriptor's bytes at most, whatever the release.
const MAX_PAGE_STRUCT: usize = 256;

/// A theap as its heap lists it: its thread, the pages it counts in its queues, and the
/// pages the census found as its.
struct TheapSeen {
    at: u64,
    thread: u64,
    page_count: u64,
    found: u64,
}

/// A heap of the sub-process: its map of pages per arena, its abandoned pages outside
/// arenas, its theaps.
struct HeapSeen {
    at: u64,
    arena_pages: Vec<u64>,
    os_abandoned: u64,
    theaps: Vec<TheapSeen>,
}

/// One census under way.
struct Census<'a> {
    mem: &'a mut ProcessMemory,
    residency: &'a Residency<'a>,
    layout: &'static Layout,
    statics: &'a Statics,
    /// Page descriptors: side by side in each arena's table, read a window at a time.
    reader: RecordReader,
    heaps: Vec<HeapSeen>,
    /// Pages outside arenas already counted.
    os_pages: BTreeSet<u64>,
    tally: Tally,
}

/// Reads a 3.x heap (see [`super::super::census`]).
pub(in crate::mimalloc) fn census(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    statics: &Statics,
    residency: &[ResidentRange],
) -> Result<MimallocHeap, String> {
    let l = statics.layout;
    let residency = &Residency::new(residency, PAGE);
    let start_read = mem.bytes_read();
    let mut sub = vec![0u8; l.subproc_read];
    mem.read(statics.subproc, &mut sub)
        .map_err(|e| format!("mimalloc's sub-process could not be read ({e})"))?;
    if le_u32(&sub, l.subproc_memkind) != l.kind_static {
        return Err("mimalloc has not been initialised yet in this process".into());
    }
    if le_u64(&sub, l.subproc_heap_main) != statics.heap_main {
        return Err(format!(
            "mimalloc's sub-process names its main heap at {:#x}, not the image's heap_main \
             at {:#x}",
            le_u64(&sub, l.subproc_heap_main),
            statics.heap_main
        ));
    }
    let mut c = Census {
        heaps: heaps(mem, statics, &sub)?,
        mem,
        residency,
        layout: l,
        statics,
        reader: RecordReader::default(),
        os_pages: BTreeSet::new(),
        tally: Tally::new(layout),
    };
    let count = le_u64(&sub, l.subproc_arena_count);
    if count > l.max_arenas {
        return Err(format!(
            "mimalloc counts {count} arenas, more than it can have"
        ));
    }
    for i in 0..count {
        let at = le_u64(&sub, l.subproc_arenas + 8 * i as usize);
        // 0: being added by another thread as the process stopped, or freed.
        if at != 0 {
            c.arena(i, at)?;
        }
    }
    c.pages_outside_arenas()?;
    c.tally.heap.thread_heaps = c.heaps.iter().map(|h| h.theaps.len() as u64).sum();
    let read = c.mem.bytes_read() - start_read;
    c.tally.finish(read)
}

/// The sub-process's heaps (its list from `sub`, its bytes), each with its theaps.
fn heaps(mem: &mut ProcessMemory, statics: &Statics, sub: &[u8]) -> Result<Vec<HeapSeen>, String> {
    let l = statics.layout;
    let count = le_u64(sub, l.subproc_heap_count);
    if count == 0 || count > MAX_HEAPS {
        return Err(format!("mimalloc counts {count} heaps"));
    }
    let mut heaps: Vec<HeapSeen> = Vec::new();
    let mut at = le_u64(sub, l.subproc_heaps);
    while at != 0 {
        if heaps.len() as u64 >= count {
            return Err(format!(
                "mimalloc's list of heaps holds more than the {count} it counts, or loops"
            ));
        }
        let mut h = vec![0u8; l.heap_read];
        mem.read(at, &mut h)
            .map_err(|e| format!("mimalloc's heap at {at:#x} could not be read ({e})"))?;
        if le_u64(&h, l.heap_subproc) != statics.subproc {
            return Err(format!(
                "mimalloc's heap at {at:#x} belongs to another sub-process"
            ));
        }
        heaps.push(HeapSeen {
            at,
            arena_pages: (0..l.max_arenas as usize)
                .map(|i| le_u64(&h, l.heap_arena_pages + 8 * i))
                .collect(),
            os_abandoned: le_u64(&h, l.heap_os_abandoned),
            theaps: theaps(mem, l, at, le_u64(&h, l.heap_theaps))?,
        });
        at = le_u64(&h, l.heap_next);
    }
    if heaps.len() as u64 != count {
        return Err(format!(
            "mimalloc counts {count} heaps and lists {}",
            heaps.len()
        ));
    }
    if !heaps.iter().any(|h| h.at == statics.heap_main) {
        return Err("mimalloc's list of heaps lacks its main heap".into());
    }
    Ok(heaps)
}

/// The theaps of the heap at `heap`, its list from `first`: each its thread's, through
/// its thread data.
fn theaps(
    mem: &mut ProcessMemory,
    l: &Layout,
    heap: u64,
    first: u64,
) -> Result<Vec<TheapSeen>, String> {
    let mut theaps = Vec::new();
    let mut at = first;
    while at != 0 {
        if theaps.len() >= MAX_THEAPS {
            return Err(format!("the theaps of the heap at {heap:#x} loop"));
        }
        let mut t = vec![0u8; l.theap_hnext + 8];
        mem.read(at, &mut t)
            .map_err(|e| format!("a theap at {at:#x} could not be read ({e})"))?;
        let tld = le_u64(&t, l.theap_tld);
        let thread = if tld == 0 {
            0
        } else {
            mem.read_u64(tld + l.tld_thread_id as u64).map_err(|e| {
                format!("the thread data of the theap at {at:#x} could not be read ({e})")
            })?
        };
        // Thread ids keep their low two bits clear (page flags); 0 and 4 mark abandoned
        // pages.
        if le_u64(&t, l.theap_heap) != heap || thread <= 4 || thread & 3 != 0 {
            return Err(format!(
                "the theap at {at:#x} is not one of the heap at {heap:#x} (its heap {:#x}, \
                 its thread {thread:#x})",
                le_u64(&t, l.theap_heap)
            ));
        }
        theaps.push(TheapSeen {
            at,
            thread,
            page_count: le_u64(&t, l.theap_page_count),
            found: 0,
        });
        at = le_u64(&t, l.theap_hnext);
    }
    Ok(theaps)
}

/// A bitmap of `bits` bits (an arena's slices) at `at`, as 64-bit words: its chunks follow
/// its header (`chunks_at` bytes), as many as the bits need.
pub(in crate::mimalloc) fn bitmap(
    mem: &mut ProcessMemory,
    at: u64,
    chunks_at: u64,
    bits: u64,
    what: &str,
) -> Result<Vec<u64>, String> {
    let chunks = bits / CHUNK_BITS;
    let unread = |e: std::io::Error| format!("mimalloc's {what} bitmap could not be read ({e})");
    let count = mem.read_u64(at).map_err(unread)?;
    if count != chunks {
        return Err(format!(
            "mimalloc's {what} bitmap at {at:#x} has {count} chunks, not the {chunks} of its \
             arena"
        ));
    }
    let mut bytes = vec![0u8; (chunks * CHUNK_BITS / 8) as usize];
    mem.read(at + chunks_at, &mut bytes).map_err(unread)?;
    Ok(bytes.chunks_exact(8).map(|w| le_u64(w, 0)).collect())
}

/// The runs of set bits of `words`: (first bit, bits).
/// Counts arena `i` at `at` as its bitmaps give it (its bytes, the committed ones, its own
/// `info` slices and its free ones resident), the same in every 3.x release; returns the
/// slices taken so far (its own and the free ones) and the resident bytes counted.
pub(in crate::mimalloc) fn arena_slices(
    tally: &mut Tally,
    residency: &Residency<'_>,
    (i, at): (u64, u64),
    slices: u64,
    info: u64,
    free: &[u64],
    committed: &[u64],
) -> Result<(Vec<u64>, u64), String> {
    let heap = &mut tally.heap;
    heap.arenas += 1;
    heap.arena_bytes += slices * SLICE;
    heap.committed_bytes += committed
        .iter()
        .map(|w| u64::from(w.count_ones()))
        .sum::<u64>()
        * SLICE;
    let mut taken = vec![0u64; (slices / 64) as usize];
    take(&mut taken, 0, info);
    let own = residency.resident_bytes(at, at + info * SLICE);
    heap.metadata_resident += own;
    let mut counted = own;
    for (first, n) in runs(free) {
        if !take(&mut taken, first, n) {
            return Err(format!(
                "mimalloc's arena {i} at {at:#x} has its own slices marked free"
            ));
        }
        let r = residency.resident_bytes(at + first * SLICE, at + (first + n) * SLICE);
        heap.arena_free_resident += r;
        counted += r;
    }
    Ok((taken, counted))
}

pub(in crate::mimalloc) fn runs(words: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, &w) in words.iter().enumerate() {
        let mut w = w;
        while w != 0 {
            let bit = i as u64 * 64 + u64::from(w.trailing_zeros());
            w &= w - 1;
            match runs.last_mut() {
                Some((first, n)) if *first + *n == bit => *n += 1,
                _ => runs.push((bit, 1)),
            }
        }
    }
    runs
}

/// Marks `n` slices from `first` as accounted for; false when one already was (or they
/// pass the arena's end).
pub(in crate::mimalloc) fn take(taken: &mut [u64], first: u64, n: u64) -> bool {
    if first + n > taken.len() as u64 * 64 {
        return false;
    }
    for b in first..first + n {
        let (w, m) = ((b / 64) as usize, 1u64 << (b % 64));
        if taken[w] & m != 0 {
            return false;
        }
        taken[w] |= m;
    }
    true
}

impl Census<'_> {
    /// Arena `i` at `at`: its info slices (metadata), its free slices, each heap's pages,
    /// and the rest of its slices (metadata mimalloc carves from arenas: theaps, threads'
    /// data).
    fn arena(&mut self, i: u64, at: u64) -> Result<(), String> {
        let l = self.layout;
        let mut h = vec![0u8; l.arena_read];
        self.mem
            .read(at, &mut h)
            .map_err(|e| format!("mimalloc's arena {i} could not be read ({e})"))?;
        let (slices, info) = (le_u64(&h, l.arena_slices), le_u64(&h, l.arena_info_slices));
        let meta = le_u64(&h, l.arena_pages_meta);
        let sound = at.is_multiple_of(SLICE)
            && le_u64(&h, l.arena_index) == i
            && le_u64(&h, l.arena_subproc) == self.statics.subproc
            && slices > 0
            && slices <= MAX_ARENA_SLICES
            && slices.is_multiple_of(CHUNK_BITS)
            && info > 0
            && info < slices.min(CHUNK_BITS)
            && at.checked_add(slices * SLICE).is_some()
            && meta >= at
            && meta.saturating_add(slices * l.page_size as u64) <= at + info * SLICE;
        if !sound {
            return Err(format!(
                "mimalloc's arena {i} at {at:#x} does not look like one (index {}, {slices} \
                 slices, {info} of them its own, page table at {meta:#x})",
                le_u64(&h, l.arena_index)
            ));
        }
        let end = at + slices * SLICE;
        let free = bitmap(
            self.mem,
            le_u64(&h, l.arena_free),
            l.bbitmap_chunks,
            slices,
            "free-slice",
        )?;
        let committed = bitmap(
            self.mem,
            le_u64(&h, l.arena_committed),
            l.bitmap_chunks,
            slices,
            "committed-slice",
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
        for h in 0..self.heaps.len() {
            let pages = self.heaps[h].arena_pages[i as usize];
            if pages == 0 {
                continue;
            }
            let bits_at = self
                .mem
                .read_u64(pages + l.arena_pages_bitmap as u64)
                .map_err(|e| format!("a heap's pages in arena {i} could not be read ({e})"))?;
            let bits = bitmap(self.mem, bits_at, l.bitmap_chunks, slices, "page")?;
            for (first, n) in runs(&bits) {
                for slice in first..first + n {
                    counted += self
                        .arena_page(h, at, slices, meta, slice, &mut taken)
                        .map_err(|why| format!("the page at {:#x} {why}", at + slice * SLICE))?;
                }
            }
        }
        let all = self.residency.resident_bytes(at, end);
        self.tally.heap.metadata_resident += all.saturating_sub(counted);
        Ok(())
    }

    /// The page whose first slice is `slice` of the arena at `arena` (of `slices`, its
    /// descriptors in the table at `meta`), in heap `h`'s map: its resident bytes.
    fn arena_page(
        &mut self,
        h: usize,
        arena: u64,
        slices: u64,
        meta: u64,
        slice: u64,
        taken: &mut [u64],
    ) -> Result<u64, String> {
        let l = self.layout;
        let mut buf = [0u8; MAX_PAGE_STRUCT];
        let p = &mut buf[..l.page_size];
        self.reader.read_into(
            self.mem,
            meta + slice * l.page_size as u64,
            p,
            "a page descriptor",
        )?;
        let n = u64::from(le_u32(p, l.page_memid_slices));
        if le_u32(p, l.page_memid_kind) != l.kind_arena
            || le_u64(p, l.page_memid_arena) != arena
            || u64::from(le_u32(p, l.page_memid_slice)) != slice
            || n == 0
            || slice + n > slices
        {
            return Err(format!(
                "has a descriptor that places it elsewhere (kind {}, arena {:#x}, slice {} \
                 and {n} slices)",
                le_u32(p, l.page_memid_kind),
                le_u64(p, l.page_memid_arena),
                le_u32(p, l.page_memid_slice)
            ));
        }
        if !take(taken, slice, n) {
            return Err(
                "shares its slices with a free slice, its arena's own or another page".into(),
            );
        }
        let lo = arena + slice * SLICE;
        self.page(p, h, (lo, lo + n * SLICE))
    }

    /// A page (its descriptor `p`, its memory `lo..hi`) of heap `h`, checked and tallied:
    /// its resident bytes.
    fn page(&mut self, p: &[u8], h: usize, (lo, hi): (u64, u64)) -> Result<u64, String> {
        let l = self.layout;
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([p[o], p[o + 1]]));
        let (used, capacity, reserved) = (
            u16_at(l.page_used),
            u16_at(l.page_capacity),
            u16_at(l.page_reserved),
        );
        let (block_size, start) = (le_u64(p, l.page_block_size), le_u64(p, l.page_start));
        // NULL names the main heap.
        let heap = match le_u64(p, l.page_heap) {
            0 => self.statics.heap_main,
            other => other,
        };
        if heap != self.heaps[h].at {
            return Err(format!(
                "names another heap ({:#x}) than the one whose map holds it",
                le_u64(p, l.page_heap)
            ));
        }
        if block_size == 0 || reserved == 0 || used > capacity || capacity > reserved {
            return Err(format!(
                "has {used} blocks used, {capacity} carved and {reserved} reserved of {block_size} bytes"
            ));
        }
        if start < lo || start.saturating_add(reserved.saturating_mul(block_size)) > hi {
            return Err(format!(
                "places {reserved} blocks of {block_size} bytes from {start:#x}, outside its slices"
            ));
        }
        let thread = le_u64(p, l.page_thread_id) & !3;
        let abandoned = thread == 0 || thread == 4;
        if !abandoned {
            let theap = le_u64(p, l.page_theap);
            let Some(t) = self.heaps[h]
                .theaps
                .iter_mut()
                .find(|t| t.at == theap && t.thread == thread)
            else {
                return Err(format!(
                    "is owned by thread {thread:#x} through a theap ({theap:#x}) that is not \
                     its heap's for that thread"
                ));
            };
            t.found += 1;
        }
        let mut seen = PageSeen::new(start, block_size, capacity, used, thread);
        seen.check_list_heads(p, l.page_free, l.page_local_free)?;
        // The low bit: the page is owned.
        let head = le_u64(p, l.page_thread_free) & !1;
        seen.thread_freed = super::super::read::thread_freed(self.mem, &seen, head)?;
        let resident = self.residency.resident_bytes(lo, hi);
        self.tally
            .add_page(seen, reserved, hi - lo, resident, abandoned);
        Ok(resident)
    }

    /// The pages taken from the OS outside arenas: each heap's abandoned ones, and those a
    /// theap owns when it counts more pages than were found as its; then every theap's
    /// count met.
    fn pages_outside_arenas(&mut self) -> Result<(), String> {
        for h in 0..self.heaps.len() {
            let mut at = self.heaps[h].os_abandoned;
            let mut seen = 0u64;
            while at != 0 {
                seen += 1;
                if seen > MAX_THEAPS as u64 {
                    return Err("mimalloc's abandoned pages outside arenas loop".into());
                }
                at = self.os_page(h, at)?;
            }
            for t in 0..self.heaps[h].theaps.len() {
                let theap = &self.heaps[h].theaps[t];
                if theap.found < theap.page_count {
                    self.queued_os_pages(h, t)?;
                }
                let theap = &self.heaps[h].theaps[t];
                if theap.found != theap.page_count {
                    return Err(format!(
                        "mimalloc's theap at {:#x} counts {} pages, and {} were found as its",
                        theap.at, theap.page_count, theap.found
                    ));
                }
            }
        }
        Ok(())
    }

    /// The pages outside arenas in the queues of theap `t` of heap `h`.
    fn queued_os_pages(&mut self, h: usize, t: usize) -> Result<(), String> {
        let l = self.layout;
        let (theap, count) = (
            self.heaps[h].theaps[t].at,
            self.heaps[h].theaps[t].page_count,
        );
        let mut queues = vec![0u8; l.bins * l.queue_size];
        self.mem
            .read(theap + l.theap_queues as u64, &mut queues)
            .map_err(|e| {
                format!("the queues of the theap at {theap:#x} could not be read ({e})")
            })?;
        let mut walked = 0u64;
        for q in 0..l.bins {
            let mut page = le_u64(&queues, q * l.queue_size);
            while page != 0 {
                walked += 1;
                if walked > count {
                    return Err(format!(
                        "the queues of the theap at {theap:#x} hold more than its {count} pages"
                    ));
                }
                let mut buf = [0u8; MAX_PAGE_STRUCT];
                let p = &mut buf[..l.page_size];
                self.reader
                    .read_into(self.mem, page, p, "a queued page's descriptor")?;
                let kind = le_u32(p, l.page_memid_kind);
                let next = le_u64(p, l.page_next);
                if (l.kind_os.0..=l.kind_os.1).contains(&kind) && !self.os_pages.contains(&page) {
                    self.os_page(h, page)?;
                }
                page = next;
            }
        }
        Ok(())
    }

    /// The page taken from the OS at `at` (its descriptor at its start) of heap `h`: the
    /// next page of its list.
    fn os_page(&mut self, h: usize, at: u64) -> Result<u64, String> {
        let l = self.layout;
        let mut buf = [0u8; MAX_PAGE_STRUCT];
        let p = &mut buf[..l.page_size];
        self.mem
            .read(at, p)
            .map_err(|e| format!("a page at {at:#x} outside arenas could not be read ({e})"))?;
        let kind = le_u32(p, l.page_memid_kind);
        let (base, size) = (
            le_u64(p, l.page_memid_os_base),
            le_u64(p, l.page_memid_os_size),
        );
        if !(l.kind_os.0..=l.kind_os.1).contains(&kind)
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
        self.page(p, h, (at, hi))
            .map_err(|why| format!("the page at {at:#x} outside arenas {why}"))?;
        Ok(le_u64(p, l.page_next))
    }
}
