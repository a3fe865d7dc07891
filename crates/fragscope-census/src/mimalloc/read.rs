//! The census itself: mimalloc's segments found through its arenas and segment map, each
//! segment's slices walked into pages and free spans, and the lists of blocks other
//! threads freed, every one checked as it is read.

use super::*;

/// Reads a 2.x heap (see [`super::census`]).
pub(super) fn census(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    residency: &[ResidentRange],
) -> Result<MimallocHeap, String> {
    let residency = &Residency::new(residency, PAGE);
    let start_read = mem.bytes_read();
    let Statics::V2 { heap_main, .. } = layout.statics else {
        return Err("not a mimalloc 2.x layout".into());
    };
    let mut main = [0u8; 40];
    mem.read(heap_main, &mut main)
        .map_err(|e| format!("mimalloc's main heap could not be read ({e})"))?;
    let cookie = le_u64(&main, HEAP_COOKIE);
    if cookie == 0 {
        return Err("mimalloc has not been initialised yet in this process".into());
    }
    let mut tally = Tally::new(layout);
    let mut segments = BTreeSet::new();
    arena_segments(mem, layout, residency, &mut segments, &mut tally.heap)?;
    map_segments(mem, layout, &mut segments)?;
    for &at in &segments {
        segment(mem, residency, cookie, at, &mut tally)?;
    }
    delayed_frees(mem, &mut tally)?;
    let read = mem.bytes_read() - start_read;
    tally.finish(read)
}

/// The segments of every arena: at each run of blocks in use, a segment (a huge one
/// spans several blocks). Arena blocks in use by no segment, and free ones, have their
/// resident bytes counted as free pages the arena keeps.
fn arena_segments(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    residency: &Residency,
    segments: &mut BTreeSet<u64>,
    heap: &mut MimallocHeap,
) -> Result<(), String> {
    let Statics::V2 {
        arenas,
        arena_count,
        ..
    } = layout.statics
    else {
        return Ok(());
    };
    let unread =
        |what: &str, e: std::io::Error| format!("mimalloc's {what} could not be read ({e})");
    let count = mem
        .read_u64(arena_count)
        .map_err(|e| unread("arena count", e))?;
    if count > MAX_ARENAS {
        return Err(format!(
            "mimalloc counts {count} arenas, more than it can have"
        ));
    }
    let mut table = vec![0u8; count as usize * 8];
    mem.read(arenas, &mut table)
        .map_err(|e| unread("arenas", e))?;
    for i in 0..count as usize {
        let at = le_u64(&table, 8 * i);
        if at == 0 {
            // Being added by another thread as the process stopped.
            continue;
        }
        let mut head = [0u8; ARENA_HEADER];
        mem.read(at, &mut head).map_err(|e| unread("arena", e))?;
        let (start, blocks, fields) = (
            le_u64(&head, ARENA_START),
            le_u64(&head, ARENA_BLOCKS),
            le_u64(&head, ARENA_FIELDS),
        );
        if le_u32(&head, ARENA_ID) as usize != i + 1
            || !start.is_multiple_of(SEGMENT_SIZE)
            || blocks > MAX_ARENA_BLOCKS
            || fields * 64 < blocks
            || fields > blocks / 64 + 1
            || start.checked_add(blocks * SEGMENT_SIZE).is_none()
        {
            return Err(format!(
                "mimalloc's arena {i} at {at:#x} does not look like one (id {}, start \
                 {start:#x}, {blocks} blocks, {fields} bitmap words)",
                le_u32(&head, ARENA_ID)
            ));
        }
        let mut bits = vec![0u8; fields as usize * 8];
        mem.read(at + ARENA_HEADER as u64, &mut bits)
            .map_err(|e| unread("arena bitmap", e))?;
        let in_use = |b: u64| bits[(b / 8) as usize] & (1 << (b % 8)) != 0;
        let mut b = 0;
        while b < blocks {
            let lo = start + b * SEGMENT_SIZE;
            if !in_use(b) {
                heap.arena_free_resident += residency.resident_bytes(lo, lo + SEGMENT_SIZE);
                b += 1;
                continue;
            }
            let size = mem
                .read_u64(lo + SEG_SIZE as u64)
                .map_err(|e| unread("segment", e))?;
            let span = size.div_ceil(SEGMENT_SIZE).max(1);
            if span > blocks - b || (b..b + span).any(|x| !in_use(x)) {
                return Err(format!(
                    "the segment at {lo:#x} ({size} bytes) is not inside arena {i}'s blocks in use"
                ));
            }
            // A huge segment's last block beyond its size: free room the arena keeps.
            let end = lo + span * SEGMENT_SIZE;
            heap.arena_free_resident += residency.resident_bytes(lo + size, end);
            segments.insert(lo);
            b += span;
        }
    }
    Ok(())
}

/// The segments mimalloc took from the OS outside its arenas, from its segment map.
fn map_segments(
    mem: &mut ProcessMemory,
    layout: &MimallocLayout,
    segments: &mut BTreeSet<u64>,
) -> Result<(), String> {
    let Statics::V2 { segment_map, .. } = layout.statics else {
        return Ok(());
    };
    let mut parts = vec![0u8; MAP_PARTS * 8];
    mem.read(segment_map, &mut parts)
        .map_err(|e| format!("mimalloc's segment map could not be read ({e})"))?;
    for p in 0..MAP_PARTS {
        let at = le_u64(&parts, 8 * p);
        if at == 0 {
            continue;
        }
        let mut words = vec![0u8; MAP_PART_WORDS * 8];
        mem.read(at + MAP_PART_BITS_AT as u64, &mut words)
            .map_err(|e| format!("a part of mimalloc's segment map could not be read ({e})"))?;
        for w in 0..MAP_PART_WORDS {
            let mut word = le_u64(&words, 8 * w);
            while word != 0 {
                let bit = u64::from(word.trailing_zeros());
                word &= word - 1;
                let seg = p as u64 * MAP_PART_SPAN + (w as u64 * 64 + bit) * SEGMENT_SIZE;
                segments.insert(seg);
            }
        }
    }
    Ok(())
}

/// One segment: its header checked, its slices walked into its pages and free spans.
fn segment(
    mem: &mut ProcessMemory,
    residency: &Residency,
    cookie: u64,
    at: u64,
    tally: &mut Tally,
) -> Result<(), String> {
    let mut s = vec![0u8; SEGMENT_STRUCT];
    mem.read(at, &mut s)
        .map_err(|e| format!("the segment at {at:#x} could not be read ({e})"))?;
    let field = |o: usize| le_u64(&s, o);
    let bad = |why: String| Err(format!("the segment at {at:#x} {why}"));
    if field(SEG_COOKIE) != at ^ cookie {
        return bad("does not carry its cookie (not a segment, or not mimalloc's)".into());
    }
    let (size, slices, info, entries) = (
        field(SEG_SIZE),
        field(SEG_SLICES),
        field(SEG_INFO_SLICES),
        field(SEG_SLICE_ENTRIES),
    );
    let kind = le_u32(&s, SEG_KIND);
    let huge = kind == 1;
    if kind > 1
        || entries > SLICES_PER_SEGMENT
        || entries == 0
        || info == 0
        || info >= slices
        || Some(size) != slices.checked_mul(SLICE_SIZE)
        || at.checked_add(size).is_none()
        || (!huge && slices != SLICES_PER_SEGMENT)
        || field(SEG_ABANDONED) > field(SEG_USED)
    {
        return bad(format!(
            "does not hold together (kind {kind}, {size} bytes, {slices} slices, {info} of \
             them its header, {entries} entries)"
        ));
    }
    let thread = field(SEG_THREAD_ID);
    let heap = &mut tally.heap;
    heap.segments += 1;
    heap.huge_segments += u64::from(huge);
    heap.abandoned_segments += u64::from(thread == 0);
    heap.segment_bytes += size;
    let committed: u64 = (0..8)
        .map(|w| u64::from(field(SEG_COMMIT_MASK + 8 * w).count_ones()))
        .sum();
    heap.committed_bytes += if huge { size } else { committed * SLICE_SIZE };
    let end = at + size;
    let (mut index, mut counted, mut pages) = (0u64, 0u64, 0u64);
    while index < entries {
        let slice = &s[SEG_SLICE_ARRAY + index as usize * SLICE_STRUCT..][..SLICE_STRUCT];
        let count = u64::from(le_u32(slice, PAGE_SLICE_COUNT));
        if count == 0 || le_u32(slice, PAGE_SLICE_OFFSET) != 0 {
            return bad(format!("has no span starting at its slice {index}"));
        }
        let lo = at + index * SLICE_SIZE;
        let hi = (lo + count * SLICE_SIZE).min(end);
        if index == 0 {
            if count != info {
                return bad(format!(
                    "heads {count} slices, not its {info} header slices"
                ));
            }
            tally.heap.metadata_resident += residency.resident_bytes(lo, hi);
        } else if le_u64(slice, PAGE_BLOCK_SIZE) > 0 {
            pages += 1;
            page(mem, residency, slice, (lo, hi), thread, tally)
                .map_err(|why| format!("the page at {lo:#x} {why}"))?;
        } else {
            tally.heap.free_span_resident += residency.resident_bytes(lo, hi);
        }
        counted += count;
        index = (index + count).min(entries);
    }
    if counted != slices || pages != field(SEG_USED) {
        return bad(format!(
            "spans {counted} slices in {pages} pages and free spans, against its {slices} \
             slices and {} pages",
            field(SEG_USED)
        ));
    }
    Ok(())
}

/// One page of a segment (its slice `p`, its span `lo..hi`), tallied in its class.
fn page(
    mem: &mut ProcessMemory,
    residency: &Residency,
    p: &[u8],
    (lo, hi): (u64, u64),
    thread: u64,
    tally: &mut Tally,
) -> Result<(), String> {
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([p[o], p[o + 1]]));
    let (capacity, reserved, used) = (
        u16_at(PAGE_CAPACITY),
        u16_at(PAGE_RESERVED),
        u16_at(PAGE_USED),
    );
    let (block_size, start) = (le_u64(p, PAGE_BLOCK_SIZE), le_u64(p, PAGE_START));
    if used > capacity || capacity > reserved {
        return Err(format!(
            "has {used} blocks used, {capacity} carved and {reserved} reserved"
        ));
    }
    if start < lo || start.saturating_add(reserved.saturating_mul(block_size)) > hi {
        return Err(format!(
            "places {reserved} blocks of {block_size} bytes from {start:#x}, outside its span"
        ));
    }
    let mut seen = PageSeen::new(start, block_size, capacity, used, thread);
    seen.check_list_heads(p, PAGE_FREE, PAGE_LOCAL_FREE)?;
    seen.thread_freed = thread_freed(mem, &seen, le_u64(p, PAGE_THREAD_FREE) & !3)?;
    let heap_at = le_u64(p, PAGE_HEAP);
    if heap_at != 0 {
        tally.heaps.insert(heap_at);
    }
    let resident = residency.resident_bytes(lo, hi);
    tally.add_page(seen, reserved, hi - lo, resident, thread == 0);
    Ok(())
}

/// The blocks on a page's thread-free list (from `head`): freed by other threads, still
/// counted in `used`. Most lists are short (the owner collects them as it allocates), read
/// a block at a time; a long one (its owner ended, its pages abandoned, and another thread
/// freeing their blocks: thousands) has the page's carved blocks read at once, never
/// beyond them, whose pages may never have been touched (reading them would map them).
/// At such a moment (40-120 MB on those lists) the census held the program 1.5-2.4 ms per
/// MB of them so, 2.1-3.0 ms one read a block (BENCHMARKS.md).
pub(super) fn thread_freed(
    mem: &mut ProcessMemory,
    page: &PageSeen,
    head: u64,
) -> Result<u64, String> {
    let carved = page.capacity * page.block_size;
    let mut blocks: Vec<u8> = Vec::new();
    let (mut block, mut count) = (head, 0u64);
    while block != 0 {
        if !page.holds_block(block) || count >= page.used {
            return Err(format!(
                "has a thread-free list that leaves its blocks or loops (at {block:#x})"
            ));
        }
        count += 1;
        if count == SHORT_LIST && carved <= MAX_CARVED_READ {
            blocks = vec![0u8; carved as usize];
            mem.read(page.start, &mut blocks)
                .map_err(|e| format!("has blocks that could not be read ({e})"))?;
        }
        block = match blocks.get((block - page.start) as usize..) {
            Some(next) if next.len() >= 8 => le_u64(next, 0),
            _ => mem
                .read_u64(block)
                .map_err(|e| format!("has a thread-free block that could not be read ({e})"))?,
        };
    }
    Ok(count)
}

/// Every heap's delayed-free list: blocks other threads freed into a full page, waiting
/// for the heap's thread; each placed on its page (which must belong to that heap's
/// thread).
fn delayed_frees(mem: &mut ProcessMemory, tally: &mut Tally) -> Result<(), String> {
    if tally.heaps.len() > MAX_HEAPS {
        return Err(format!("mimalloc's pages name {} heaps", tally.heaps.len()));
    }
    tally.pages.sort_by_key(|p| p.start);
    let budget: u64 = tally.pages.iter().map(|p| p.used).sum();
    let mut walked = 0u64;
    for &heap in &tally.heaps {
        let mut h = [0u8; 24];
        mem.read(heap, &mut h)
            .map_err(|e| format!("a heap at {heap:#x} its pages name could not be read ({e})"))?;
        if le_u64(&h, HEAP_TLD) == 0 || le_u64(&h, HEAP_THREAD_ID) == 0 {
            return Err(format!("the heap at {heap:#x} its pages name is not one"));
        }
        let thread = le_u64(&h, HEAP_THREAD_ID);
        let mut block = le_u64(&h, HEAP_DELAYED_FREE);
        while block != 0 {
            let i = tally.pages.partition_point(|p| p.start <= block);
            let page = i
                .checked_sub(1)
                .map(|i| &mut tally.pages[i])
                .filter(|p| p.holds_block(block) && p.thread == thread);
            let Some(page) = page else {
                return Err(format!(
                    "the heap at {heap:#x} has a delayed-free block at {block:#x} in none of \
                     its pages"
                ));
            };
            walked += 1;
            if walked > budget {
                return Err("the delayed-free lists hold more blocks than are in use".into());
            }
            page.delayed += 1;
            block = mem
                .read_u64(block)
                .map_err(|e| format!("a delayed-free block could not be read ({e})"))?;
        }
    }
    Ok(())
}
