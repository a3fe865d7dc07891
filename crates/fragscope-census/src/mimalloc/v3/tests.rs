use super::*;

const SLICE: u64 = 64 << 10;
const L: &Layout = &V3_3_2;
const THREAD: u64 = 0x7f00_1000;
/// The arena's slices and its own (info) slices.
const SLICES: u64 = 512;
const INFO: u64 = 2;
/// The page's first slice.
const PAGE_SLICE: u64 = 2;

/// A heap laid out as mimalloc 3.3.2 lays it out, in this process's memory: the
/// sub-process, its main heap with one theap, one arena of 512 slices whose first two are
/// its own (its page table in the second), a page of 64-byte blocks at its third slice,
/// the rest free.
struct FakeHeap {
    /// The mapping the arena is carved from, and the arena in it.
    _mapping: Vec<u8>,
    arena: u64,
    subproc: Vec<u8>,
    heap: Vec<u8>,
    theap: Vec<u8>,
    tld: Vec<u8>,
    /// The arena's bitmaps: free slices, committed slices, the heap's pages; and the
    /// heap's record of its pages in the arena (pointing at the last).
    free: Vec<u8>,
    committed: Vec<u8>,
    pages: Vec<u8>,
    arena_pages: Vec<u8>,
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set_bit(b: &mut [u8], at: usize, bit: u64) {
    b[at + (bit / 8) as usize] |= 1 << (bit % 8);
}

impl FakeHeap {
    fn new() -> Self {
        let mapping = vec![0u8; ((SLICES + 1) * SLICE) as usize];
        let arena = (mapping.as_ptr() as u64).next_multiple_of(SLICE);
        let mut f = Self {
            _mapping: mapping,
            arena,
            subproc: vec![0; 5840],
            heap: vec![0; 6440],
            theap: vec![0; 8096],
            tld: vec![0; 112],
            free: vec![0; L.bbitmap_chunks as usize + 64],
            committed: vec![0; L.bitmap_chunks as usize + 64],
            pages: vec![0; L.bitmap_chunks as usize + 64],
            arena_pages: vec![0; 608],
        };
        let (subproc, heap, theap) = (f.addr(&f.subproc), f.addr(&f.heap), f.addr(&f.theap));
        put_u32(&mut f.subproc, L.subproc_memkind, L.kind_static);
        put(&mut f.subproc, L.subproc_heap_main, heap);
        put(&mut f.subproc, L.subproc_heaps, heap);
        put(&mut f.subproc, L.subproc_heap_count, 1);
        put(&mut f.subproc, L.subproc_arena_count, 1);
        put(&mut f.subproc, L.subproc_arenas, arena);
        put(&mut f.heap, L.heap_subproc, subproc);
        put(&mut f.heap, L.heap_theaps, theap);
        let arena_pages = f.addr(&f.arena_pages);
        put(&mut f.heap, L.heap_arena_pages, arena_pages);
        let tld = f.addr(&f.tld);
        put(&mut f.theap, L.theap_tld, tld);
        put(&mut f.theap, L.theap_heap, heap);
        put(&mut f.theap, L.theap_page_count, 1);
        put(&mut f.tld, L.tld_thread_id, THREAD);
        for b in [&mut f.free, &mut f.committed, &mut f.pages] {
            put(b, 0, 1);
        }
        let free_chunks = L.bbitmap_chunks as usize;
        for s in PAGE_SLICE + 1..SLICES {
            set_bit(&mut f.free, free_chunks, s);
        }
        for s in 0..8 {
            set_bit(&mut f.committed, L.bitmap_chunks as usize, s);
        }
        set_bit(&mut f.pages, L.bitmap_chunks as usize, PAGE_SLICE);
        let pages = f.addr(&f.pages);
        put(&mut f.arena_pages, L.arena_pages_bitmap, pages);
        let (free, committed) = (f.addr(&f.free), f.addr(&f.committed));
        let a = f.arena_bytes();
        put(a, L.arena_subproc, subproc);
        put(a, L.arena_index, 0);
        put(a, L.arena_slices, SLICES);
        put(a, L.arena_info_slices, INFO);
        put(a, L.arena_free, free);
        put(a, L.arena_committed, committed);
        put(a, L.arena_pages_meta, arena + SLICE);
        // The page: 1000 blocks of 64 bytes reserved, 100 carved, 40 used, its free list
        // at its 50th block.
        let start = arena + PAGE_SLICE * SLICE;
        let p = f.page_bytes();
        put(p, L.page_thread_id, THREAD | 1);
        put_u16(p, L.page_used, 40);
        put_u16(p, L.page_capacity, 100);
        put_u16(p, L.page_reserved, 1000);
        put(p, L.page_block_size, 64);
        put(p, L.page_start, start);
        put(p, L.page_free, start + 50 * 64);
        put(p, L.page_theap, theap);
        put(p, L.page_memid_arena, arena);
        put_u32(p, L.page_memid_slice, PAGE_SLICE as u32);
        put_u32(p, L.page_memid_slices, 1);
        put_u32(p, L.page_memid_kind, L.kind_arena);
        f
    }

    fn addr(&self, b: &[u8]) -> u64 {
        b.as_ptr() as u64
    }

    fn arena_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the arena's first slices lie inside `_mapping`, which this value owns.
        unsafe { std::slice::from_raw_parts_mut(self.arena as *mut u8, (INFO * SLICE) as usize) }
    }

    fn page_bytes(&mut self) -> &mut [u8] {
        let at = (SLICE + PAGE_SLICE * L.page_size as u64) as usize;
        &mut self.arena_bytes()[at..at + L.page_size]
    }

    fn census(&self) -> Result<MimallocHeap, String> {
        let statics = Statics {
            subproc: self.addr(&self.subproc),
            heap_main: self.addr(&self.heap),
            layout: L,
        };
        let layout = MimallocLayout {
            library: "/test".into(),
            release: "mimalloc 3.3.2",
            statics: super::super::Statics::V3(statics.clone()),
        };
        let mut mem = ProcessMemory::open(std::process::id()).unwrap();
        census(&mut mem, &layout, &statics, &[])
    }
}

#[test]
fn a_heap_laid_out_as_mimalloc_3_lays_it_out_is_read() {
    let heap = FakeHeap::new().census().unwrap();
    assert_eq!((heap.arenas, heap.arena_bytes), (1, SLICES * SLICE));
    assert_eq!(heap.committed_bytes, 8 * SLICE);
    assert_eq!(heap.thread_heaps, 1);
    assert_eq!(heap.segments, 0);
    assert_eq!(heap.classes.len(), 1);
    let c = &heap.classes[0];
    assert_eq!(
        (c.block_size, c.pages, c.blocks_in_use, c.blocks_free),
        (64, 1, 40, 60)
    );
    assert_eq!((c.blocks_capacity, c.blocks_reserved), (100, 1000));
    assert_eq!((c.span_bytes, c.abandoned_pages), (SLICE, 0));
    assert_eq!(heap.in_use_bytes(), 40 * 64);
}

#[test]
fn an_abandoned_page_needs_no_theap_and_a_null_heap_is_the_main_one() {
    let mut fake = FakeHeap::new();
    put(fake.page_bytes(), L.page_thread_id, 4);
    put(fake.page_bytes(), L.page_theap, 0);
    put(&mut fake.theap, L.theap_page_count, 0);
    let heap = fake.census().unwrap();
    assert_eq!(heap.classes[0].abandoned_pages, 1);
}

#[test]
fn blocks_other_threads_freed_are_not_live() {
    // A short thread-free list (read a block at a time) and one long enough to have the
    // page's blocks read at once; its low bit: the page is owned.
    for freed in [2u64, 30] {
        let mut fake = FakeHeap::new();
        let start = fake.arena + PAGE_SLICE * SLICE;
        let chain: Vec<u64> = (0..freed).map(|i| start + (60 + i) * 64).collect();
        put(fake.page_bytes(), L.page_thread_free, chain[0] | 1);
        for (i, &b) in chain.iter().enumerate() {
            let next = chain.get(i + 1).copied().unwrap_or(0);
            // SAFETY: every block lies in the fake arena's mapping, which `fake` owns.
            unsafe { *(b as *mut u64) = next };
        }
        let heap = fake.census().unwrap();
        let c = &heap.classes[0];
        assert_eq!(
            (c.blocks_in_use, c.blocks_thread_freed),
            (40 - freed, freed)
        );
        unsafe { *(chain[freed as usize - 1] as *mut u64) = chain[0] };
        assert!(fake.census().unwrap_err().contains("thread-free list"));
    }
}

#[test]
fn a_heap_that_does_not_hold_together_is_refused_with_a_note() {
    type Garble = fn(&mut FakeHeap);
    let cases: [(Garble, &str); 9] = [
        (
            |f| put(&mut f.subproc, L.subproc_memkind, 0),
            "not been initialised",
        ),
        (
            |f| put(&mut f.subproc, L.subproc_heap_main, 8),
            "not the image's heap_main",
        ),
        (|f| put(&mut f.subproc, L.subproc_heap_count, 2), "lists 1"),
        (
            |f| put(f.arena_bytes(), L.arena_index, 3),
            "does not look like one",
        ),
        (
            |f| put(&mut f.theap, L.theap_heap, 8),
            "is not one of the heap",
        ),
        (
            |f| put(&mut f.theap, L.theap_page_count, 2),
            "counts 2 pages",
        ),
        (
            |f| put_u32(f.page_bytes(), L.page_memid_slice, 9),
            "places it elsewhere",
        ),
        (|f| put(f.page_bytes(), L.page_free, 1), "free list"),
        (
            |f| {
                let at = L.bbitmap_chunks as usize;
                set_bit(&mut f.free, at, PAGE_SLICE);
            },
            "shares its slices",
        ),
    ];
    for (garble, said) in cases {
        let mut fake = FakeHeap::new();
        garble(&mut fake);
        let why = fake.census().unwrap_err();
        assert!(why.contains(said), "{said}: {why}");
    }
    let mut fake = FakeHeap::new();
    put(fake.page_bytes(), L.page_thread_id, 0x5000);
    assert!(fake
        .census()
        .unwrap_err()
        .contains("owned by thread 0x5000"));
}

#[test]
fn a_garbled_heap_gives_a_figure_or_a_note_never_a_panic() {
    // Every byte of the arena's header and of the page's descriptor, and of the parts of
    // the sub-process, heap and theap read, garbled in turn (the census reads them as
    // they are: any of them may be torn).
    let mut fake = FakeHeap::new();
    let flips = [0x01u8, 0x80, 0xff];
    let header: Vec<u8> = fake.arena_bytes()[..L.arena_read].to_vec();
    for (i, &byte) in header.iter().enumerate() {
        for flip in flips {
            fake.arena_bytes()[i] = byte ^ flip;
            let _ = fake.census();
        }
        fake.arena_bytes()[i] = byte;
    }
    let page: Vec<u8> = fake.page_bytes().to_vec();
    for (i, &byte) in page.iter().enumerate() {
        for flip in flips {
            fake.page_bytes()[i] = byte ^ flip;
            let _ = fake.census();
        }
        fake.page_bytes()[i] = byte;
    }
    type Part = fn(&mut FakeHeap) -> &mut Vec<u8>;
    let parts: [(Part, usize); 6] = [
        (|f| &mut f.subproc, L.subproc_read),
        (|f| &mut f.heap, L.heap_read),
        (|f| &mut f.theap, L.theap_hnext + 8),
        (|f| &mut f.free, L.bbitmap_chunks as usize + 64),
        (|f| &mut f.pages, L.bitmap_chunks as usize + 64),
        (|f| &mut f.arena_pages, 8),
    ];
    for (part, read) in parts {
        for i in 0..read {
            let byte = part(&mut fake)[i];
            part(&mut fake)[i] = byte ^ 0xff;
            let _ = fake.census();
            part(&mut fake)[i] = byte;
        }
    }
    assert!(fake.census().is_ok());
}

#[test]
fn runs_of_set_bits_are_found_across_words() {
    assert_eq!(read::runs(&[0b1110, 1 << 63, 1]), vec![(1, 3), (127, 2)]);
    assert_eq!(read::runs(&[0, 0]), vec![]);
}
