//! The glibc releases whose malloc the census reads: one entry each, with where the
//! fields it reads lie and what the release does differently.

use super::{le, reveal, ALIGN, MINSIZE, SIZE_BITS, SIZE_SZ};
use crate::ProcessMemory;

/// One glibc release whose malloc layout is verified, x86-64: where the fields the census
/// reads lie (`ptype /o` of `struct malloc_state`, `struct malloc_par` and
/// `tcache_perthread_struct` against Debian's libc6-dbg of that release), and what the
/// release does differently that the census relies on (read in its malloc.c). `heap_info`
/// (48 bytes), the chunks' header and bits, HEAP_MAX_SIZE and the arena's `flags` are the
/// same in every one (the constants below).
#[derive(Debug)]
pub(super) struct Release {
    /// As glibc's banner names it: "2.36".
    pub(super) name: &'static str,
    /// `struct malloc_state`: its size, then its fields' offsets.
    pub(super) state_size: usize,
    /// `fastbinsY[NFASTBINS]`; None: the release has no fastbins (2.43 removed them).
    pub(super) fastbins: Option<usize>,
    pub(super) top: usize,
    pub(super) bins: usize,
    pub(super) binmap: usize,
    pub(super) next: usize,
    pub(super) attached_threads: usize,
    pub(super) system_mem: usize,
    /// `struct malloc_par` (`mp_`): its size, then its fields' offsets.
    pub(super) par_size: usize,
    pub(super) n_mmaps: usize,
    pub(super) mmapped_mem: usize,
    pub(super) sbrk_base: usize,
    pub(super) tcache_count: usize,
    /// `tcache_perthread_struct`.
    pub(super) tcache: Tcache,
    /// How a chunk mmapped alone is laid out in its mapping.
    pub(super) mmapped: Mmapped,
}

/// A release's thread cache table (`tcache_perthread_struct`: a `uint16_t` per bin, then a
/// list head per bin).
#[derive(Debug)]
pub(super) struct Tcache {
    /// Its bins, and of those the first ones, each of one chunk size (32, 48, ... bytes);
    /// each bin after them (2.43's 12 "large" bins, used only when the tunable
    /// glibc.malloc.tcache_max raises the cache's limit) holds the chunks of one range
    /// from a power of two to the next, in increasing size.
    pub(super) bins: usize,
    pub(super) small_bins: usize,
    /// What the `uint16_t` of a bin counts.
    pub(super) counts: TcacheCounts,
    /// Where the list heads (`entries`) start, after the counts.
    pub(super) entries: usize,
    /// sizeof(tcache_perthread_struct).
    pub(super) table: usize,
    /// The chunk sizes the table can be allocated in.
    pub(super) chunks: &'static [u64],
}

impl Tcache {
    /// The bin a chunk of `size` bytes is cached in, if any (tcache's csize2tidx, then
    /// large_csize2tidx above its small bins).
    pub(super) fn bin_of(&self, size: u64) -> Option<usize> {
        if size < MINSIZE || !size.is_multiple_of(ALIGN) {
            return None;
        }
        // The largest chunk of the small bins (1040 bytes): each large bin starts at a
        // power of two above it.
        let largest_small = MINSIZE + (self.small_bins as u64 - 1) * ALIGN;
        let bin = if size <= largest_small {
            ((size - MINSIZE) / ALIGN) as usize
        } else {
            self.small_bins + (size.ilog2() - largest_small.ilog2()) as usize
        };
        (bin < self.bins).then_some(bin)
    }

    /// The chunks (address, size) in a thread cache table `t`, or None when `t` is not
    /// one: every bin's list must hold chunks of the bin's sizes (a large bin's in
    /// increasing size), each carrying `key` when it is known, as many as the bin's count
    /// says; where the count is of free slots, each bin's slots and chunks must add up to
    /// the fill count (`fill`, or without it the same in every bin, and not 0).
    pub(super) fn chunks_in(
        &self,
        mem: &mut ProcessMemory,
        t: &[u8],
        key: Option<u64>,
        fill: Option<u64>,
    ) -> Option<Vec<(u64, u64)>> {
        let limit = fill.unwrap_or(u64::from(u16::MAX));
        let mut filled_to = fill;
        let mut out = Vec::new();
        for i in 0..self.bins {
            let count = u64::from(u16::from_le_bytes([t[2 * i], t[2 * i + 1]]));
            let mut e = le(t, self.entries + 8 * i);
            if count > limit {
                return None;
            }
            // The most chunks the list may hold.
            let most = match self.counts {
                TcacheCounts::Held if (count == 0) != (e == 0) => return None,
                TcacheCounts::Held => count,
                TcacheCounts::FreeSlots => limit - count,
            };
            let (mut n, mut last) = (0, 0);
            while e != 0 {
                if !e.is_multiple_of(ALIGN) || n >= most {
                    return None;
                }
                let mut entry = [0u8; 16];
                let mut hdr = [0u8; 8];
                if mem.read(e - SIZE_SZ, &mut hdr).is_err() || mem.read(e, &mut entry).is_err() {
                    return None;
                }
                let size = u64::from_le_bytes(hdr) & !SIZE_BITS;
                if self.bin_of(size) != Some(i) || size < last {
                    return None;
                }
                if let Some(key) = key {
                    if le(&entry, 8) != key {
                        return None;
                    }
                }
                out.push((e - 2 * SIZE_SZ, size));
                (n, last) = (n + 1, size);
                e = reveal(e, le(&entry, 0));
            }
            match self.counts {
                TcacheCounts::Held if n != count => return None,
                TcacheCounts::Held => {}
                TcacheCounts::FreeSlots => match filled_to {
                    Some(to) if to != count + n => return None,
                    Some(_) => {}
                    None => filled_to = Some(count + n),
                },
            }
        }
        // glibc makes no table when the fill count is 0.
        if self.counts == TcacheCounts::FreeSlots && filled_to == Some(0) {
            return None;
        }
        Some(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TcacheCounts {
    /// `counts[i]`: the chunks in bin i's list (0 in a new table, which is the first chunk
    /// a thread's first malloc allocates, before the block it asked for).
    Held,
    /// `num_slots[i]`: the chunks bin i may still take, `mp_.tcache_count` less those in
    /// its list (2.43: the table is made at the thread's first free or first cache fill,
    /// anywhere in its arena's heap, every bin starting at the fill count).
    FreeSlots,
}

/// Where a chunk mmapped alone ends, against its mapping (which glibc's `mp_.mmapped_mem`
/// and mallinfo2's `hblkhd` count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mmapped {
    /// Its size is its mapping's; the program has all of it after the 16-byte header.
    Whole,
    /// Laid out as a chunk in an arena (2.43): its size is its mapping's less 16 bytes;
    /// the program has what follows the header up to 8 bytes into those 16, the place of
    /// the next chunk's size field, which is the allocator's.
    AsInArena,
}

impl Mmapped {
    /// The bytes of its mapping after the end its size gives.
    pub(super) fn tail(self) -> u64 {
        match self {
            Mmapped::Whole => 0,
            Mmapped::AsInArena => 2 * SIZE_SZ,
        }
    }
    /// The allocator's bytes at the end of its mapping, after the program's.
    pub(super) fn trailer(self) -> u64 {
        match self {
            Mmapped::Whole => 0,
            Mmapped::AsInArena => SIZE_SZ,
        }
    }
    /// What the program can use of a chunk of `csize` bytes (malloc_usable_size).
    pub(super) fn usable(self, csize: u64) -> u64 {
        match self {
            Mmapped::Whole => csize - 2 * SIZE_SZ,
            Mmapped::AsInArena => csize - SIZE_SZ,
        }
    }
}

/// The releases read, one entry each: 2.36 (Debian 12), 2.41 (Debian 13), 2.43 (Debian
/// unstable, 2.43-7). 2.41 has 2.36's layout; 2.43 has no fastbins (nor
/// `have_fastchunks`), a `thp_mode` in `mp_`, 76 tcache bins counted by free slots, and
/// mmapped chunks laid out as arena chunks. Another release is refused with a note.
pub(super) static RELEASES: [Release; 3] = [
    RELEASE_2_36,
    Release {
        name: "2.41",
        ..RELEASE_2_36
    },
    Release {
        name: "2.43",
        state_size: 2112,
        fastbins: None,
        top: 8,
        bins: 24,
        binmap: 2056,
        next: 2072,
        attached_threads: 2088,
        system_mem: 2096,
        par_size: 144,
        n_mmaps: 68,
        mmapped_mem: 88,
        sbrk_base: 104,
        tcache_count: 128,
        tcache: Tcache {
            bins: 76,
            small_bins: 64,
            counts: TcacheCounts::FreeSlots,
            entries: 152,
            table: 760,
            // tcache_init: 0x300 through __libc_malloc2 (the first free), 0x310 through
            // _int_malloc(av, request2size (760)) when a malloc fills the cache first,
            // the request padded twice.
            chunks: &[0x300, 0x310],
        },
        mmapped: Mmapped::AsInArena,
    },
];

pub(super) const RELEASE_2_36: Release = Release {
    name: "2.36",
    state_size: 2200,
    fastbins: Some(16),
    top: 96,
    bins: 112,
    binmap: 2144,
    next: 2160,
    attached_threads: 2176,
    system_mem: 2184,
    par_size: 136,
    n_mmaps: 60,
    mmapped_mem: 80,
    sbrk_base: 96,
    tcache_count: 120,
    tcache: Tcache {
        bins: 64,
        small_bins: 64,
        counts: TcacheCounts::Held,
        entries: 128,
        table: 640,
        chunks: &[0x290],
    },
    mmapped: Mmapped::Whole,
};
