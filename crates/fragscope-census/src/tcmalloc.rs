//! tcmalloc's heap (gperftools, as Debian's libtcmalloc.so.4 ships it), read from outside
//! a running process.
//!
//! tcmalloc serves small requests (up to 256 KiB) from *size classes*: each class carves
//! *spans* (runs of 8 KiB pages) into objects of its size. A freed object goes to its
//! thread's cache, then in batches to the *transfer cache* of its class, then back to the
//! span it came from, kept by the class's *central free list*; a span returns to the
//! *page heap* only when all of its objects are free. One survivor keeps its span, and
//! the span's free objects wait in the central free list: the fragmentation of seed 002.
//!
//! Where each figure is read (layouts of gperftools 2.10 and 2.16, x86-64, checked against their
//! headers; the library is stripped to its exported symbols, so the hidden statics are
//! found by their shape in its writable data and checked against each other):
//! - `Static::sizemap_`'s `class_to_size_` (int32 per class: 0, 8, 16, 32, 48, ...) by
//!   that sequence; `num_objects_to_move_` just before it, `class_to_pages_` and
//!   `num_size_classes` after.
//! - `Static::central_cache_[]`: one 1216-byte `CentralFreeListPadded` per class whose
//!   `size_class_` is its index, its `empty_` and `nonempty_` span lists each a dummy span
//!   pointing to itself or to spans that point back. Each span (48 bytes: start page,
//!   pages, next, prev, free objects, then refcount:16 sizeclass:8 location:2) gives its
//!   objects handed out (`refcount`); its free objects (carved less handed out) must add
//!   up to the list's `counter_`, and the spans to `num_spans_`.
//! - The transfer cache: `used_slots_` batches of `num_objects_to_move_` objects.
//! - The thread caches: the list from `ThreadCache::thread_heaps_` (exported), each a
//!   `FreeList` per class (`length_`, and `size_`, which must be the class's size).
//! - `Static::pageheap_`'s `free_[128]` (a normal and a returned dummy span per length,
//!   each pointing to itself or to free spans), then its `stats_`: system, free and
//!   unmapped bytes.
//!
//! tcmalloc's own figures follow from these as `MallocExtension` computes them: bytes in
//! use by the application = system - unmapped - page heap free - central - transfer -
//! thread caches. A census whose parts do not hold together is refused.

use fragscope_trace::heap_census::{TcmallocClass, TcmallocHeap, OCCUPANCY_BUCKETS};

use crate::library::{MappedLibrary, StaticData};
use crate::memory::{le_u32, le_u64, RecordReader};
use crate::{ProcessMemory, Symbols};

/// One gperftools release whose layout is checked: its libraries' file names, what
/// `SizeMap` keeps between `class_to_pages_` and `num_size_classes` (2.16:
/// `min_span_size_in_pages_`), and where its `ThreadCache` links the caches (`next_`,
/// `prev_`: 2.16 dropped a field before them). The rest of the layout is the same in both
/// (the constants below), and the statics are found by their shape in either.
struct Release {
    name: &'static str,
    libraries: [&'static str; 2],
    size_map_gap: usize,
    thread_cache_next: usize,
    thread_cache_prev: usize,
}

/// The releases read: 2.10 (Debian 12) and 2.16 (Debian 13), offsets from each one's
/// headers (`offsetof`, x86-64).
const RELEASES: [Release; 2] = [
    Release {
        name: "2.10",
        libraries: ["libtcmalloc.so.4.5.10", "libtcmalloc_minimal.so.4.5.10"],
        size_map_gap: 0,
        thread_cache_next: 4144,
        thread_cache_prev: 4152,
    },
    Release {
        name: "2.16",
        libraries: ["libtcmalloc.so.4.5.18", "libtcmalloc_minimal.so.4.5.18"],
        size_map_gap: 8,
        thread_cache_next: 4128,
        thread_cache_prev: 4136,
    },
];

const PAGE: u64 = 8192;
const MAX_CLASSES: usize = 128;

// struct Span.
const SPAN_SIZE: usize = 48;
const SPAN_START: usize = 0;
const SPAN_LENGTH: usize = 8;
const SPAN_NEXT: usize = 16;
const SPAN_PREV: usize = 24;
const SPAN_BITS: usize = 40;

// CentralFreeListPadded.
const CFL_STRIDE: u64 = 1216;
const CFL_SIZE_CLASS: usize = 8;
const CFL_EMPTY: u64 = 16;
const CFL_NONEMPTY: u64 = 64;
const CFL_NUM_SPANS: usize = 112;
const CFL_COUNTER: usize = 120;
const CFL_USED_SLOTS: usize = 1152;

// ThreadCache.
const TC_FREELIST: u64 = 32;
const TC_FREELIST_LENGTH: usize = 8;
const TC_FREELIST_SIZE: usize = 24;
const TC_SIZE: usize = 4096;
const TC_BYTES: usize = 4160;

// PageHeap: free_[kMaxPages] of {Span normal; Span returned;}, then stats_.
const FREE_LISTS: u64 = 128;
const FREE_LIST_PAIR: u64 = 2 * SPAN_SIZE as u64;

/// Spans walked at most per list: a list longer than the process could hold is corrupt.
const MAX_SPANS: u64 = 1 << 26;

fn i32_at(b: &[u8], at: usize) -> i32 {
    le_u32(b, at) as i32
}

/// Where a process's tcmalloc keeps its state.
pub struct TcmallocLayout {
    /// The library's file and the gperftools release its layout is.
    pub library: String,
    release: &'static Release,
    /// The library's writable data: where it lies and how long it is.
    statics: (u64, usize),
    /// Where the hidden statics are, found by their shape before the process is stopped:
    /// `class_to_size_` (an offset into the data), the central free lists, the page
    /// heap's statistics.
    size_map: usize,
    central_cache: u64,
    pageheap_stats: u64,
    thread_heaps_symbol: u64,
    thread_heap_count_symbol: u64,
}

/// Finds the tcmalloc library in `pid`'s mappings and its exported anchors. Err: why
/// this process's tcmalloc cannot be read (none, another release).
pub fn locate(pid: u32, mem: &mut ProcessMemory) -> Result<TcmallocLayout, String> {
    let Some(lib) = MappedLibrary::find(pid, "libtcmalloc")? else {
        return Err(
            "no tcmalloc library is mapped (a copy linked into the program is not read yet)".into(),
        );
    };
    let name = &lib.name;
    let Some(release) = RELEASES
        .iter()
        .find(|r| r.libraries.contains(&name.as_str()))
    else {
        let read: Vec<String> = RELEASES
            .iter()
            .map(|r| format!("gperftools {}'s {}", r.name, r.libraries[0]))
            .collect();
        return Err(format!(
            "the process runs on {name}, whose layout fragscope has not verified (it reads {})",
            read.join(" and ")
        ));
    };
    let statics = StaticData::read(mem, lib.data, "tcmalloc")?;
    let elf = lib.elf(pid)?;
    let names = [
        "_ZN8tcmalloc11ThreadCache13thread_heaps_E",
        "_ZN8tcmalloc11ThreadCache18thread_heap_count_E",
    ];
    let symbols = Symbols::resolve_at(&elf, &names, lib.base)?;
    let (size_map, map) = find_size_map(&statics, release.size_map_gap)?;
    let central_cache = find_central_cache(&statics, map.sizes.len())?;
    let pageheap_stats = find_page_heap_stats(&statics)?;
    let anchor = |name: &str| -> Result<u64, String> {
        let addr = symbols.need(name)?;
        statics
            .at(addr, 8)
            .map(|_| addr)
            .ok_or_else(|| format!("{name} lies outside tcmalloc's data"))
    };
    Ok(TcmallocLayout {
        library: lib.path,
        release,
        statics: lib.data,
        size_map,
        central_cache,
        pageheap_stats,
        thread_heaps_symbol: anchor(names[0])?,
        thread_heap_count_symbol: anchor(names[1])?,
    })
}

/// The size map: per class, its object size, pages per span and objects per batch.
struct SizeMap {
    sizes: Vec<u64>,
    pages: Vec<u64>,
    batch: Vec<u64>,
}

/// `class_to_size_` begins with these sizes in gperftools' classes.
const FIRST_SIZES: [i32; 6] = [0, 8, 16, 32, 48, 64];

fn find_size_map(s: &StaticData, gap: usize) -> Result<(usize, SizeMap), String> {
    let pattern: Vec<u8> = FIRST_SIZES.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut found = None;
    for at in memchr::memmem::find_iter(&s.bytes, &pattern) {
        if at % 4 != 0 {
            continue;
        }
        if let Some(map) = size_map_at(s, at, gap) {
            if found.replace((at, map)).is_some() {
                return Err("two tables look like tcmalloc's size classes".into());
            }
        }
    }
    found.ok_or_else(|| "tcmalloc's size classes were not found in its data".into())
}

/// The size map whose `class_to_size_` starts at byte `at` of the data, when its fields
/// hold together; `gap`: the release's bytes between the pages per class and the count.
fn size_map_at(s: &StaticData, at: usize, gap: usize) -> Option<SizeMap> {
    let sizes_at = at;
    let batch_at = at.checked_sub(4 * MAX_CLASSES)?;
    let pages_at = (sizes_at + 4 * MAX_CLASSES).next_multiple_of(8);
    let count_at = pages_at + 8 * MAX_CLASSES + gap;
    let b = &s.bytes;
    if count_at + 8 > b.len() {
        return None;
    }
    let n = le_u64(b, count_at) as usize;
    if !(32..=MAX_CLASSES).contains(&n) {
        return None;
    }
    let sizes: Vec<u64> = (0..n).map(|i| i32_at(b, sizes_at + 4 * i) as u64).collect();
    let pages: Vec<u64> = (0..n).map(|i| le_u64(b, pages_at + 8 * i)).collect();
    let batch: Vec<u64> = (0..n).map(|i| i32_at(b, batch_at + 4 * i) as u64).collect();
    let ordered = sizes.windows(2).all(|w| w[0] < w[1]) && sizes[n - 1] <= 256 << 10;
    let spans_hold = (1..n).all(|i| pages[i] >= 1 && pages[i] * PAGE >= sizes[i] && batch[i] >= 1);
    (ordered && spans_hold).then_some(SizeMap {
        sizes,
        pages,
        batch,
    })
}

/// A dummy span at `dummy` heads a list: it points to itself, or to spans that point
/// back to it. Returns the spans in the list (each span's 48 bytes), at most `limit`.
fn span_list(
    mem: &mut ProcessMemory,
    reader: &mut RecordReader,
    s: &StaticData,
    dummy: u64,
    limit: u64,
) -> Result<Vec<[u8; SPAN_SIZE]>, String> {
    let head = s
        .at(dummy, SPAN_SIZE)
        .ok_or("a list head outside tcmalloc's data")?;
    let (mut next, prev) = (le_u64(head, SPAN_NEXT), le_u64(head, SPAN_PREV));
    if (next == dummy) != (prev == dummy) || next == 0 || prev == 0 {
        return Err(format!("the span list at {dummy:#x} is not a list"));
    }
    let mut spans = Vec::new();
    let mut back = dummy;
    while next != dummy {
        if spans.len() as u64 >= limit {
            return Err(format!(
                "the span list at {dummy:#x} is longer than it can be"
            ));
        }
        let span: [u8; SPAN_SIZE] = reader.read(mem, next)?;
        if le_u64(&span, SPAN_PREV) != back {
            return Err(format!(
                "the span at {next:#x} does not point back to its list"
            ));
        }
        back = next;
        next = le_u64(&span, SPAN_NEXT);
        spans.push(span);
    }
    Ok(spans)
}

/// The central free list of each class: its address, by the shape of the array.
fn find_central_cache(s: &StaticData, classes: usize) -> Result<u64, String> {
    let span = |a: u64| {
        s.at(a, SPAN_SIZE)
            .map(|b| (le_u64(b, SPAN_NEXT), le_u64(b, SPAN_PREV)))
    };
    let list_head = |a: u64| {
        span(a).is_some_and(|(n, p)| {
            (n == a && p == a) || (n != a && p != a && n != 0 && !s.contains(n))
        })
    };
    let entry_ok = |base: u64, i: u64| {
        let e = base + i * CFL_STRIDE;
        s.at(e + CFL_SIZE_CLASS as u64, 8)
            .is_some_and(|b| le_u64(b, 0) == i)
            && list_head(e + CFL_EMPTY)
            && list_head(e + CFL_NONEMPTY)
    };
    let mut found = None;
    // Class 1's entry names the array: its `size_class_` is 1, and the next ones follow.
    for off in (CFL_STRIDE as usize + CFL_SIZE_CLASS..s.bytes.len().saturating_sub(8)).step_by(8) {
        if le_u64(&s.bytes, off) != 1 {
            continue;
        }
        let base = s.base + off as u64 - CFL_SIZE_CLASS as u64 - CFL_STRIDE;
        if (1..classes as u64).all(|i| entry_ok(base, i)) && found.replace(base).is_some() {
            return Err("two arrays look like tcmalloc's central free lists".into());
        }
    }
    found.ok_or_else(|| "tcmalloc's central free lists were not found in its data".into())
}

/// The page heap's free lists and, right after them, its statistics: their address.
fn find_page_heap_stats(s: &StaticData) -> Result<u64, String> {
    let dummy = |a: u64| {
        s.at(a, SPAN_SIZE).is_some_and(|b| {
            let (n, p) = (le_u64(b, SPAN_NEXT), le_u64(b, SPAN_PREV));
            (n == a && p == a) || (n != a && p != a && n != 0 && !s.contains(n) && !s.contains(p))
        })
    };
    let self_pointing = |a: u64| {
        s.at(a, SPAN_SIZE)
            .is_some_and(|b| le_u64(b, SPAN_NEXT) == a)
    };
    let lists = FREE_LISTS * 2;
    let mut found = None;
    let mut off = 0u64;
    while off + lists * SPAN_SIZE as u64 + 32 <= s.bytes.len() as u64 {
        let f = s.base + off;
        // Most lengths have no free span: the run starts with a list pointing to itself.
        if self_pointing(f + FREE_LIST_PAIR * (FREE_LISTS - 1))
            && (0..lists).all(|i| dummy(f + i * SPAN_SIZE as u64))
            && !dummy(f - SPAN_SIZE as u64)
        {
            let stats = f + FREE_LISTS * FREE_LIST_PAIR;
            if page_heap_stats(s, stats).is_ok() && found.replace(stats).is_some() {
                return Err("two tables look like tcmalloc's page heap".into());
            }
        }
        off += 8;
    }
    found.ok_or_else(|| "tcmalloc's page heap was not found in its data".into())
}

/// The page heap's statistics at `at`: (system, free, unmapped) bytes, whole pages.
fn page_heap_stats(s: &StaticData, at: u64) -> Result<(u64, u64, u64), String> {
    let st = s
        .at(at, 24)
        .ok_or("the page heap lies outside tcmalloc's data")?;
    let (system, free, unmapped) = (le_u64(st, 0), le_u64(st, 8), le_u64(st, 16));
    let pages = [system, free, unmapped].iter().all(|v| v % PAGE == 0);
    if pages && system > 0 && free + unmapped <= system {
        Ok((system, free, unmapped))
    } else {
        Err("tcmalloc's page heap statistics do not hold together".into())
    }
}

/// Free objects per class in every thread's cache, and the threads' caches counted.
fn thread_caches(
    mem: &mut ProcessMemory,
    s: &StaticData,
    layout: &TcmallocLayout,
    sizes: &[u64],
) -> Result<(Vec<u64>, u64), String> {
    let mut free = vec![0u64; sizes.len()];
    let mut count = 0u64;
    let word = |at: u64| s.at(at, 8).map(|b| le_u64(b, 0)).unwrap_or(0);
    let mut at = word(layout.thread_heaps_symbol);
    let heap_count = word(layout.thread_heap_count_symbol) & 0xffff_ffff;
    let mut prev = 0u64;
    let mut cache = vec![0u8; TC_BYTES];
    while at != 0 {
        if count > heap_count {
            return Err("more thread caches are linked than tcmalloc counts".into());
        }
        mem.read(at, &mut cache)
            .map_err(|e| format!("a thread cache at {at:#x} could not be read ({e})"))?;
        if le_u64(&cache, layout.release.thread_cache_prev) != prev {
            return Err(format!("the thread cache at {at:#x} does not point back"));
        }
        let mut bytes = 0u64;
        for (cl, &size) in sizes.iter().enumerate().skip(1) {
            let list = cl * TC_FREELIST as usize;
            if u64::from(le_u32(&cache, list + TC_FREELIST_SIZE)) != size {
                return Err(format!(
                    "the thread cache at {at:#x} does not hold size class {cl} ({size} bytes)"
                ));
            }
            let length = u64::from(le_u32(&cache, list + TC_FREELIST_LENGTH));
            free[cl] += length;
            bytes += length * size;
        }
        if bytes != u64::from(le_u32(&cache, TC_SIZE)) {
            return Err(format!("the thread cache at {at:#x} does not add up"));
        }
        count += 1;
        prev = at;
        at = le_u64(&cache, layout.release.thread_cache_next);
    }
    if count != heap_count {
        return Err(format!(
            "{count} thread caches are linked, tcmalloc counts {heap_count}"
        ));
    }
    Ok((free, count))
}

/// Reads the heap: every size class's spans, free lists and caches, and the page heap's
/// totals. The caller holds the process stopped.
pub fn census(mem: &mut ProcessMemory, layout: &TcmallocLayout) -> Result<TcmallocHeap, String> {
    let start_read = mem.bytes_read();
    // The data as it is now, the process stopped: where things are was found before.
    let s = &StaticData::read(mem, layout.statics, "tcmalloc")?;
    let map = size_map_at(s, layout.size_map, layout.release.size_map_gap)
        .ok_or("tcmalloc's size classes changed")?;
    let n = map.sizes.len();
    let central = layout.central_cache;
    let (system_bytes, pageheap_free_bytes, unmapped_bytes) =
        page_heap_stats(s, layout.pageheap_stats)?;
    let (in_thread_caches, thread_caches) = thread_caches(mem, s, layout, &map.sizes)?;
    let mut spans = RecordReader::default();
    let mut classes = Vec::new();
    let mut occupancy_pages = vec![0u64; OCCUPANCY_BUCKETS];
    let mut occupancy_in_use = vec![0u64; OCCUPANCY_BUCKETS];
    #[allow(clippy::needless_range_loop)] // cl indexes four tables and the array
    for cl in 1..n {
        let entry = central + cl as u64 * CFL_STRIDE;
        let e = s
            .at(entry, CFL_STRIDE as usize)
            .ok_or("a central free list outside tcmalloc's data")?;
        let (size, counter, num_spans) = (
            map.sizes[cl],
            le_u64(e, CFL_COUNTER),
            le_u64(e, CFL_NUM_SPANS),
        );
        let used_slots = u64::from(le_u32(e, CFL_USED_SLOTS));
        let mut class = TcmallocClass {
            class: cl as u32,
            size,
            pages_per_span: map.pages[cl],
            central_free: counter,
            transfer_free: used_slots * map.batch[cl],
            thread_cache_free: in_thread_caches[cl],
            ..TcmallocClass::default()
        };
        for (list, full) in [(CFL_NONEMPTY, false), (CFL_EMPTY, true)] {
            for span in span_list(mem, &mut spans, s, entry + list, MAX_SPANS)? {
                let bits = le_u32(&span, SPAN_BITS);
                let (refcount, sizeclass) = (u64::from(bits & 0xffff), (bits >> 16) & 0xff);
                let pages = le_u64(&span, SPAN_LENGTH);
                let capacity = pages * PAGE / size.max(1);
                if sizeclass as usize != cl || refcount > capacity || le_u64(&span, SPAN_START) == 0
                {
                    return Err(format!("a span of size class {cl} does not hold together"));
                }
                class.spans += 1;
                class.full_spans += u64::from(full);
                class.pages += pages;
                class.objects += capacity;
                class.handed_out += refcount;
                let bucket = if refcount == 0 {
                    0
                } else {
                    1 + ((refcount * 10 / capacity.max(1)) as usize).min(9)
                };
                occupancy_pages[bucket] += pages;
                occupancy_in_use[bucket] += refcount * size;
            }
        }
        if class.spans != num_spans || class.objects - class.handed_out != counter {
            return Err(format!(
                "size class {cl}'s spans do not add up to its central free list ({} spans for \
                 {num_spans}, {} free objects for {counter}): the heap changed while it was read",
                class.spans,
                class.objects - class.handed_out
            ));
        }
        if class.transfer_free + class.thread_cache_free > class.handed_out {
            return Err(format!(
                "size class {cl} has more objects cached than handed out"
            ));
        }
        if class.spans > 0 || class.thread_cache_free > 0 {
            classes.push(class);
        }
    }
    let heap = TcmallocHeap {
        release: layout.release.name.into(),
        library: layout.library.clone(),
        page_size: PAGE,
        system_bytes,
        pageheap_free_bytes,
        unmapped_bytes,
        thread_caches,
        classes,
        occupancy_pages,
        occupancy_in_use,
        bytes_read: mem.bytes_read() - start_read,
    };
    if heap.cached_bytes() + pageheap_free_bytes + unmapped_bytes > system_bytes {
        return Err("tcmalloc's free bytes exceed what it took from the system".into());
    }
    Ok(heap)
}
