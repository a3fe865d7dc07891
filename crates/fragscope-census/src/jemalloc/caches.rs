//! Threads' caches: those an arena lists (a build with statistics), and those on
//! jemalloc's list of threads' data (a build without them keeps no other list).

use super::*;

// tcache_t's bins, after its pointer to its slow part; tcache_slow_t's arena.
const TCACHE_BINS: u64 = 8;
const TCACHE_SLOW_ARENA: u64 = 40;
/// `tsd_state_nominal_max`: a thread's data on the nominal list is in a state up to it.
const TSD_NOMINAL_MAX: u8 = 2;

/// The threads' caches read from the threads' data into `tally` and `arenas` (their
/// counts of caches) when the build keeps no statistics and its symbols name that list
/// (true: read); with statistics and `always` (the test that compares them), read there
/// too and checked against what the arenas list (`tally` as they left it).
/// `(table, listed)`: `arenas[]` and the arenas read, in the order of `arenas`.
pub(super) fn from_threads_data(
    mem: &mut ProcessMemory,
    tally: &mut Tally,
    layout: &JemallocLayout,
    (table, listed): (&[u8], &[(usize, Vec<u8>)]),
    arenas: &mut [JemallocArena],
    always: bool,
) -> Result<bool, String> {
    // A build without statistics lists its threads' caches on its threads' data only; a
    // build with them is checked against that list on request (the map's knob).
    Ok(match layout.tsds {
        Some(list) if tally.uncounted => {
            threads_data_caches(
                mem,
                tally,
                list,
                table,
                listed,
                arenas,
                (layout.build, &layout.build.tsd),
            )?;
            true
        }
        Some(list) if always => {
            let listed_by_arenas = cached(tally);
            for b in &mut tally.bins {
                b.tcache_regions = 0;
            }
            for l in &mut tally.large {
                l.tcache_extents = 0;
            }
            let mut scratch = arenas.to_vec();
            threads_data_caches(
                mem,
                tally,
                list,
                table,
                listed,
                &mut scratch,
                (layout.build, &layout.build.tsd_with_stats),
            )?;
            if cached(tally) != listed_by_arenas {
                return Err(
                    "the threads' caches read from their threads' data are not those their \
                     arenas list"
                        .into(),
                );
            }
            false
        }
        _ => false,
    })
}

/// The threads' caches of a build without statistics, from the list of threads' data in a
/// nominal state (its head at `list`): each cache's bins counted into `tally`, and into
/// its arena's count (`table`: `arenas[]`; `listed`: the arenas read, as `arenas`).
fn threads_data_caches(
    mem: &mut ProcessMemory,
    tally: &mut Tally,
    list: u64,
    table: &[u8],
    listed: &[(usize, Vec<u8>)],
    arenas: &mut [JemallocArena],
    (build, tsd): (&Release, &TsdLayout),
) -> Result<(), String> {
    let unread = |e: std::io::Error| format!("a thread's data could not be read ({e})");
    let first = mem.read_u64(list).map_err(unread)?;
    let mut bins = vec![0u8; build.tcache_bins * CACHE_BIN_SIZE];
    let (mut at, mut prev, mut walked) = (first, 0u64, 0u64);
    while at != 0 {
        walked += 1;
        if walked > MAX_WALK {
            return Err("jemalloc's list of threads' data does not end".into());
        }
        let mut link = [0u8; 16];
        mem.read(at + tsd.link as u64, &mut link).map_err(unread)?;
        let mut state = [0u8; 1];
        mem.read(at + tsd.state as u64, &mut state)
            .map_err(unread)?;
        // A ring: each element's previous is the one walked before it (the first's, the
        // last).
        let (next, back) = (le_u64(&link, 0), le_u64(&link, 8));
        if state[0] > TSD_NOMINAL_MAX || (prev != 0 && back != prev) {
            return Err(format!(
                "jemalloc's list of threads' data holds one at {at:#x} that is not on it \
                 (state {}, previous {back:#x})",
                state[0]
            ));
        }
        let tcache = at + tsd.tcache as u64;
        mem.read(tcache + TCACHE_BINS, &mut bins).map_err(unread)?;
        count_cache_bins(tally, &bins, build, "a thread's data")?;
        let slow = mem
            .read_u64(at + tsd.tcache_slow as u64 + TCACHE_SLOW_ARENA)
            .map_err(unread)?;
        if let Some(pos) = listed
            .iter()
            .position(|(i, _)| slow != 0 && le_u64(table, 8 * i) == slow)
        {
            arenas[pos].thread_caches += 1;
        }
        prev = at;
        at = next;
        if at == first {
            break;
        }
    }
    Ok(())
}

/// What the threads' caches hold per class: regions of each small one, extents of each
/// large one.
fn cached(tally: &Tally) -> Vec<u64> {
    let small = tally.bins.iter().map(|b| b.tcache_regions);
    small
        .chain(tally.large.iter().map(|l| l.tcache_extents))
        .collect()
}

/// Counts the regions and extents a thread's cache holds (its bins' bytes `bins`) into
/// `tally`; `whose`: the cache, named in a refusal.
fn count_cache_bins(
    tally: &mut Tally,
    bins: &[u8],
    build: &Release,
    whose: &str,
) -> Result<(), String> {
    for i in 0..build.tcache_bins {
        let c = i * CACHE_BIN_SIZE;
        let head = le_u64(bins, c) as u16;
        let full = le_u32(bins, c + CACHE_BIN_LOW_BITS_FULL) as u16;
        let empty = le_u32(bins, c + CACHE_BIN_LOW_BITS_EMPTY) as u16;
        // Its stack of pointers grows down from `empty` to `full`.
        let cached = u64::from(empty.wrapping_sub(head)) / 8;
        let capacity = u64::from(empty.wrapping_sub(full)) / 8;
        if cached > capacity {
            return Err(format!("{whose} holds more than its cache's bin {i} can"));
        }
        if i < BINS {
            tally.bins[i].tcache_regions += cached;
        } else {
            tally.large[i - BINS].tcache_extents += cached;
        }
    }
    Ok(())
}

/// The threads' caches bound to an arena (a ring of their bin arrays' descriptors from
/// `first`): their cached regions added to `tally`'s bins and large classes. Returns the
/// caches counted.
pub(super) fn thread_caches(
    mem: &mut ProcessMemory,
    tally: &mut Tally,
    first: u64,
    index: usize,
    build: &Release,
) -> Result<u64, String> {
    let mut count = 0u64;
    let mut at = first;
    let mut bins = vec![0u8; build.tcache_bins * CACHE_BIN_SIZE];
    while at != 0 {
        if count >= MAX_WALK {
            return Err(format!(
                "arena {index}'s list of thread caches does not end"
            ));
        }
        let mut descriptor = [0u8; 24];
        mem.read(at, &mut descriptor)
            .map_err(|e| format!("a thread cache at {at:#x} could not be read ({e})"))?;
        mem.read(le_u64(&descriptor, DESCRIPTOR_BINS), &mut bins)
            .map_err(|e| format!("a thread cache's bins could not be read ({e})"))?;
        count_cache_bins(
            tally,
            &bins,
            build,
            &format!("a thread cache of arena {index}"),
        )?;
        count += 1;
        at = le_u64(&descriptor, 0);
        if at == first {
            break;
        }
    }
    Ok(count)
}
