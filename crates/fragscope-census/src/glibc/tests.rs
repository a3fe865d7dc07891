//! The census's own checks: releases, banners, thread cache tables read through
//! /proc/self/mem.

use super::releases::Tcache;
use super::*;

#[test]
fn the_release_comes_from_glibcs_banner() {
    let banner = b"xx GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\n";
    assert_eq!(release_of(banner).as_deref(), Some("2.36"));
    assert_eq!(release_of(b"no banner here"), None);
    // Our own libc, whatever it is, names one.
    let own = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap_or_default();
    if !own.is_empty() {
        assert!(release_of(&own).is_some_and(|v| v.starts_with("2.")));
    }
}

#[test]
fn size_classes_are_exact_to_1_kib_then_quarter_powers_of_two() {
    assert_eq!(class_of(48), 48);
    assert_eq!(class_of(1024), 1024);
    assert_eq!(class_of(1040), 1280);
    assert_eq!(class_of(1280), 1280);
    assert_eq!(class_of(1296), 1536);
    assert_eq!(class_of(5000), 5120);
}

#[test]
fn each_verified_release_is_picked_by_its_name_and_another_is_refused() {
    for name in ["2.36", "2.41", "2.43"] {
        let banner =
            format!("GNU C Library (Debian GLIBC {name}-1) stable release version {name}.");
        let version = release_of(banner.as_bytes()).unwrap();
        assert_eq!(release_named(&version).unwrap().name, name);
    }
    let note = release_named("2.42").unwrap_err();
    assert!(note.contains("glibc 2.42,"), "{note}");
    assert!(note.contains("it reads glibc 2.36, 2.41, 2.43"), "{note}");
}

/// The offsets of each release, taken from its debug information, against what its
/// structures' field order makes of them: a slip in copying one shows.
#[test]
fn each_releases_offsets_hold_together() {
    let padded = |request: u64| (request + SIZE_SZ).next_multiple_of(ALIGN);
    for r in &RELEASES {
        // malloc_state: ... top, last_remainder, bins[254], binmap[4], next, next_free,
        // attached_threads, system_mem, max_system_mem.
        if let Some(f) = r.fastbins {
            assert_eq!(f + 8 * NFASTBINS, r.top, "{}", r.name);
        }
        assert_eq!(r.top + 16, r.bins, "{}", r.name);
        assert_eq!(r.bins + 8 * 2 * NBINS_PAIRS, r.binmap, "{}", r.name);
        assert_eq!(r.binmap + 16, r.next, "{}", r.name);
        assert_eq!(r.next + 16, r.attached_threads, "{}", r.name);
        assert_eq!(r.attached_threads + 8, r.system_mem, "{}", r.name);
        assert_eq!(r.system_mem + 16, r.state_size, "{}", r.name);
        // malloc_par: n_mmaps and three more ints, mmapped_mem, max_mmapped_mem,
        // sbrk_base, tcache's bins, max bytes, count, unsorted limit.
        assert_eq!(
            (r.n_mmaps + 16).next_multiple_of(8),
            r.mmapped_mem,
            "{}",
            r.name
        );
        assert_eq!(r.mmapped_mem + 16, r.sbrk_base, "{}", r.name);
        assert_eq!(r.sbrk_base + 24, r.tcache_count, "{}", r.name);
        assert_eq!(r.tcache_count + 16, r.par_size, "{}", r.name);
        // tcache_perthread_struct: a uint16_t per bin, then a pointer per bin; its
        // chunk is the request padded (twice, where _int_malloc is asked for it
        // padded already).
        let t = &r.tcache;
        assert_eq!((2 * t.bins).next_multiple_of(8), t.entries, "{}", r.name);
        assert_eq!(t.entries + 8 * t.bins, t.table, "{}", r.name);
        assert!(t.chunks.contains(&padded(t.table as u64)), "{}", r.name);
        assert_eq!(
            t.chunks.contains(&padded(padded(t.table as u64))),
            t.counts == TcacheCounts::FreeSlots,
            "{}",
            r.name
        );
    }
}

#[test]
fn tcache_bins_are_one_size_each_then_powers_of_two() {
    let old = &release_named("2.36").unwrap().tcache;
    let new = &release_named("2.43").unwrap().tcache;
    for t in [old, new] {
        assert_eq!(t.bin_of(32), Some(0));
        assert_eq!(t.bin_of(48), Some(1));
        assert_eq!(t.bin_of(1040), Some(63));
        assert_eq!(t.bin_of(40), None);
        assert_eq!(t.bin_of(16), None);
    }
    assert_eq!(old.bin_of(1056), None);
    assert_eq!(new.bin_of(1056), Some(64));
    assert_eq!(new.bin_of(2032), Some(64));
    assert_eq!(new.bin_of(2048), Some(65));
    assert_eq!(new.bin_of((4 << 20) - 16), Some(75));
    assert_eq!(new.bin_of(4 << 20), None);
}

/// Two chunks of 48 bytes in bin 1 of a thread cache table made in our own memory, as
/// glibc lays them out: each chunk's size field, its safe-linked next pointer and
/// the key; the table counts them as each release does.
#[test]
fn a_thread_caches_lists_are_read_and_checked_against_its_counts() {
    #[repr(align(16))]
    struct Chunks([u64; 16]);
    const KEY: u64 = 0x5a5a_1234_8765_a5a5;
    let mut chunks = Box::new(Chunks([0; 16]));
    let base = chunks.0.as_ptr() as u64;
    let (a, b) = (base, base + 48);
    let (a_mem, b_mem) = (a + 16, b + 16);
    chunks.0[1] = 48 | PREV_INUSE;
    chunks.0[2] = (a_mem >> 12) ^ b_mem;
    chunks.0[3] = KEY;
    chunks.0[7] = 48 | PREV_INUSE;
    chunks.0[8] = b_mem >> 12;
    chunks.0[9] = KEY;
    let mut mem = ProcessMemory::open(std::process::id()).unwrap();
    let table = |t: &Tcache, count: u16| {
        let mut bytes = vec![0u8; t.table];
        if t.counts == TcacheCounts::FreeSlots {
            for i in 0..t.bins {
                bytes[2 * i..2 * i + 2].copy_from_slice(&16u16.to_le_bytes());
            }
        }
        bytes[2..4].copy_from_slice(&count.to_le_bytes());
        bytes[t.entries + 8..t.entries + 16].copy_from_slice(&a_mem.to_le_bytes());
        bytes
    };
    let both = Some(vec![(a, 48), (b, 48)]);

    let new = &release_named("2.43").unwrap().tcache;
    // 16 slots in each bin: 14 left in bin 1, which holds two.
    let t = table(new, 14);
    assert_eq!(new.chunks_in(&mut mem, &t, Some(KEY), Some(16)), both);
    assert_eq!(new.chunks_in(&mut mem, &t, None, None), both);
    assert_eq!(new.chunks_in(&mut mem, &t, Some(KEY ^ 1), Some(16)), None);
    assert_eq!(new.chunks_in(&mut mem, &t, None, Some(7)), None);
    assert_eq!(new.chunks_in(&mut mem, &table(new, 15), None, None), None);
    // A zeroed block is no table; one whose every bin takes 16 more is an empty one.
    let zeroed = vec![0u8; new.table];
    assert_eq!(new.chunks_in(&mut mem, &zeroed, None, None), None);
    let mut empty = table(new, 16);
    empty[new.entries + 8..new.entries + 16].fill(0);
    assert_eq!(new.chunks_in(&mut mem, &empty, None, None), Some(vec![]));

    let old = &release_named("2.41").unwrap().tcache;
    let t = table(old, 2);
    assert_eq!(old.chunks_in(&mut mem, &t, Some(KEY), Some(7)), both);
    assert_eq!(old.chunks_in(&mut mem, &t, None, None), both);
    assert_eq!(old.chunks_in(&mut mem, &table(old, 3), None, None), None);
    assert_eq!(old.chunks_in(&mut mem, &table(old, 1), None, None), None);
    let zeroed = vec![0u8; old.table];
    assert_eq!(old.chunks_in(&mut mem, &zeroed, None, None), Some(vec![]));

    // A chunk of another size in the list: not a table.
    chunks.0[7] = 64 | PREV_INUSE;
    assert_eq!(new.chunks_in(&mut mem, &table(new, 14), None, None), None);
    assert_eq!(old.chunks_in(&mut mem, &table(old, 2), None, None), None);
}

#[test]
fn safe_linked_pointers_are_revealed_by_their_address() {
    let pos = 0x5555_5555_9000u64;
    let target = 0x5555_5555_a2c0u64;
    assert_eq!(reveal(pos, (pos >> 12) ^ target), target);
}
