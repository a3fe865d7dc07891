use super::*;

/// A heap laid out as mimalloc 2.3.2 lays it out, in this process's memory: one arena of
/// one block holding one segment, whose header slice is followed by a page of 64-byte
/// blocks and a free span.
struct FakeHeap {
    /// The mapping the segment is carved from, and the segment in it.
    _mapping: Vec<u8>,
    segment: u64,
    main: Vec<u8>,
    count: Vec<u8>,
    arenas: Vec<u8>,
    arena: Vec<u8>,
    map: Vec<u8>,
}

const COOKIE: u64 = 0x5eed_c0de_1234_5678;

impl FakeHeap {
    fn new() -> Self {
        // Room for one segment aligned to its size (its header alone is written).
        let mapping = vec![0u8; (SEGMENT_SIZE * 2) as usize];
        let segment = (mapping.as_ptr() as u64).next_multiple_of(SEGMENT_SIZE);
        let mut heap = Self {
            _mapping: mapping,
            segment,
            main: vec![0; 3088],
            count: 1u64.to_le_bytes().to_vec(),
            arenas: vec![0; 132 * 8],
            arena: vec![0; ARENA_HEADER + 8],
            map: vec![0; MAP_PARTS * 8],
        };
        put(&mut heap.main, HEAP_COOKIE, COOKIE);
        put(&mut heap.main, HEAP_TLD, 1);
        put(&mut heap.main, HEAP_THREAD_ID, 7);
        let arena = heap.arena.as_ptr() as u64;
        put(&mut heap.arenas, 0, arena);
        heap.arena[ARENA_ID] = 1;
        put(&mut heap.arena, ARENA_START, segment);
        put(&mut heap.arena, ARENA_BLOCKS, 1);
        put(&mut heap.arena, ARENA_FIELDS, 1);
        put(&mut heap.arena, ARENA_HEADER, 1);
        let s = heap.segment_bytes();
        put(s, SEG_SIZE, SEGMENT_SIZE);
        put(s, SEG_COOKIE, segment ^ COOKIE);
        put(s, SEG_SLICES, SLICES_PER_SEGMENT);
        put(s, SEG_INFO_SLICES, 1);
        put(s, SEG_SLICE_ENTRIES, SLICES_PER_SEGMENT);
        put(s, SEG_USED, 1);
        put(s, SEG_THREAD_ID, 7);
        put(s, SEG_COMMIT_MASK, 0b111);
        let slice = |i: usize| SEG_SLICE_ARRAY + i * SLICE_STRUCT;
        s[slice(0) + PAGE_SLICE_COUNT] = 1;
        put(s, slice(0) + PAGE_BLOCK_SIZE, SLICE_SIZE);
        // The page: 1000 blocks of 64 bytes reserved, 100 carved, 40 used, its free list
        // at its 50th block.
        let page = slice(1);
        s[page + PAGE_SLICE_COUNT] = 1;
        s[page + PAGE_CAPACITY..][..2].copy_from_slice(&100u16.to_le_bytes());
        s[page + PAGE_RESERVED..][..2].copy_from_slice(&1000u16.to_le_bytes());
        s[page + PAGE_USED..][..2].copy_from_slice(&40u16.to_le_bytes());
        put(s, page + PAGE_BLOCK_SIZE, 64);
        put(s, page + PAGE_START, segment + SLICE_SIZE);
        put(s, page + PAGE_FREE, segment + SLICE_SIZE + 50 * 64);
        let free = slice(2);
        s[free..][..4].copy_from_slice(&510u32.to_le_bytes());
        heap
    }

    fn segment_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the segment lies inside `_mapping`, which this value owns.
        unsafe { std::slice::from_raw_parts_mut(self.segment as *mut u8, SEGMENT_STRUCT) }
    }

    fn layout(&self) -> MimallocLayout {
        MimallocLayout {
            library: "/test".into(),
            release: "mimalloc 2.3.2",
            statics: Statics::V2 {
                heap_main: self.main.as_ptr() as u64,
                arenas: self.arenas.as_ptr() as u64,
                arena_count: self.count.as_ptr() as u64,
                segment_map: self.map.as_ptr() as u64,
            },
        }
    }

    fn census(&self) -> Result<MimallocHeap, String> {
        let mut mem = ProcessMemory::open(std::process::id()).unwrap();
        census(&mut mem, &self.layout(), &[])
    }
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn a_heap_laid_out_as_mimalloc_lays_it_out_is_read() {
    let heap = FakeHeap::new().census().unwrap();
    assert_eq!(heap.segments, 1);
    assert_eq!(heap.segment_bytes, SEGMENT_SIZE);
    assert_eq!(heap.committed_bytes, 3 * SLICE_SIZE);
    assert_eq!(heap.classes.len(), 1);
    let c = &heap.classes[0];
    assert_eq!(
        (c.block_size, c.pages, c.blocks_in_use, c.blocks_free),
        (64, 1, 40, 60)
    );
    assert_eq!((c.blocks_capacity, c.blocks_reserved), (100, 1000));
    assert_eq!(heap.in_use_bytes(), 40 * 64);
}

#[test]
fn blocks_other_threads_freed_are_not_live() {
    // Lists on the page's thread-free list (its low bits: the delayed-free state): a short
    // one, read a block at a time, and one long enough to have the page's blocks read at
    // once.
    for freed in [2u64, 30] {
        let mut fake = FakeHeap::new();
        let block = |i: u64| fake.segment + SLICE_SIZE + (60 + i) * 64;
        let chain: Vec<u64> = (0..freed).map(block).collect();
        let page = SEG_SLICE_ARRAY + SLICE_STRUCT;
        put(fake.segment_bytes(), page + PAGE_THREAD_FREE, chain[0] | 1);
        for (i, &b) in chain.iter().enumerate() {
            let next = chain.get(i + 1).copied().unwrap_or(0);
            // SAFETY: every block lies in the fake segment's mapping, which `fake` owns.
            unsafe { *(b as *mut u64) = next };
        }
        let heap = fake.census().unwrap();
        let c = &heap.classes[0];
        assert_eq!(
            (c.blocks_in_use, c.blocks_thread_freed),
            (40 - freed, freed)
        );
        // A list that loops is refused, not followed forever.
        unsafe { *(chain[freed as usize - 1] as *mut u64) = chain[0] };
        assert!(fake.census().unwrap_err().contains("thread-free list"));
    }
}

#[test]
fn a_heap_that_does_not_hold_together_is_refused_with_a_note() {
    let cases: [(usize, u64, &str); 5] = [
        (SEG_COOKIE, 1, "cookie"),
        (SEG_USED, 2, "pages"),
        (SEG_SLICES, 511, "hold together"),
        (SEG_SLICE_ARRAY + SLICE_STRUCT + PAGE_FREE, 1, "free list"),
        (
            SEG_SLICE_ARRAY + SLICE_STRUCT + PAGE_START,
            0,
            "outside its span",
        ),
    ];
    for (at, value, said) in cases {
        let mut fake = FakeHeap::new();
        put(fake.segment_bytes(), at, value);
        let why = fake.census().unwrap_err();
        assert!(why.contains(said), "{said}: {why}");
    }
    let mut fake = FakeHeap::new();
    put(&mut fake.main, HEAP_COOKIE, 0);
    assert!(fake.census().unwrap_err().contains("not been initialised"));
}

#[test]
fn a_garbled_heap_gives_a_figure_or_a_note_never_a_panic() {
    // Every byte of the segment's header and first slices, and of the arena, garbled in
    // turn (the census reads them as they are: any of them may be torn).
    let mut fake = FakeHeap::new();
    let original: Vec<u8> = fake.segment_bytes()[..SEG_SLICE_ARRAY + 3 * SLICE_STRUCT].to_vec();
    for (i, &byte) in original.iter().enumerate() {
        for flip in [0x01u8, 0x80, 0xff] {
            fake.segment_bytes()[i] = byte ^ flip;
            let _ = fake.census();
        }
        fake.segment_bytes()[i] = byte;
    }
    let arena = fake.arena.clone();
    for (i, &byte) in arena.iter().enumerate() {
        fake.arena[i] = byte ^ 0xff;
        let _ = fake.census();
        fake.arena[i] = byte;
    }
    assert!(fake.census().is_ok());
}

#[test]
fn occupancy_buckets_are_none_then_tenths() {
    assert_eq!(bucket(0, 100), 0);
    assert_eq!(bucket(1, 100), 1);
    assert_eq!(bucket(55, 100), 6);
    assert_eq!(bucket(100, 100), OCCUPANCY_BUCKETS - 1);
}

#[test]
fn releases_are_named_in_both_numberings() {
    assert_eq!(version_name(20302), "2.3.2");
    assert_eq!(version_name(30302), "3.3.2");
    assert_eq!(version_name(209), "2.0.9");
}

/// `mi_version()` counts 3.0.1 as 301 and 3.3.2 as 30302: both are the 3.x family (Debian
/// 13's libmimalloc 3.0.1 was taken for a 2.x by the second encoding alone).
#[test]
fn both_version_encodings_give_the_major_release() {
    assert_eq!(version_major(301), 3);
    assert_eq!(version_major(30302), 3);
    assert_eq!(version_major(209), 2);
    assert_eq!(version_major(20302), 2);
    assert_eq!(version_name(301), "3.0.1");
}
