//! Hash maps and sets keyed by the integers a trace is made of: heap addresses, page
//! numbers, and small keys such as size classes, stack ids and pairs. The event decoder's
//! tables and the merge's both use them, so they sit below both, with the prefetch both
//! ask for a table's memory ahead of a lookup with.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes integer keys for tables indexed by the hash's low bits (hashbrown), keeping
/// key order in those bits (key >> SHIFT). Allocators hand out neighbouring addresses
/// close together in time, so a run of allocations or frees touches neighbouring buckets,
/// which stay in cache, instead of costing one cache miss per call. The top 7 bits, which
/// hashbrown compares as a tag before the key, come from a folded multiply so that tags
/// still tell keys apart.
#[derive(Default, Clone, Copy)]
pub struct LocalityHasher<const SHIFT: u32>(u64);

impl<const SHIFT: u32> Hasher for LocalityHasher<SHIFT> {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        const TAG: u64 = 0x7f << 57;
        self.0 = ((v >> SHIFT) & !TAG) | (fold_multiply(v) & TAG);
    }
}

/// Mixes all 64 bits of a key into all 64 bits of the result.
#[inline]
pub fn fold_multiply(v: u64) -> u64 {
    let p = u128::from(v) * 0x9E37_79B9_7F4A_7C15;
    (p as u64) ^ ((p >> 64) as u64)
}

/// A fast hasher for small keys without locality (size classes, stack ids, pairs).
#[derive(Default, Clone, Copy)]
pub struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        fold_multiply(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = fold_multiply(self.0 ^ v);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v.into());
    }
}

/// Heap addresses: 16-byte aligned from 64-bit allocators (glibc, jemalloc, tcmalloc,
/// mimalloc), so the index drops 4 bits. With 3, every index was even: half the buckets
/// could never hold a key, the other half filled to the brim, and a free's lookup probed
/// long runs (40% of a report's time on 65 536 live blocks).
pub type AddrBuild = BuildHasherDefault<LocalityHasher<4>>;
pub type AddrMap<V> = HashMap<u64, V, AddrBuild>;
pub type AddrSet = HashSet<u64, AddrBuild>;
/// Page numbers.
pub type PageMap<V> = HashMap<u64, V, BuildHasherDefault<LocalityHasher<0>>>;
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FoldHasher>>;
pub type FastSet<K> = HashSet<K, BuildHasherDefault<FoldHasher>>;

/// The hash of a heap address in hashbrown's tables kept by address (see
/// [`LocalityHasher`]).
#[inline(always)]
pub(crate) fn addr_hash(addr: u64) -> u64 {
    let mut h = LocalityHasher::<4>::default();
    h.write_u64(addr);
    h.finish()
}

/// Asks for the cache line at `addr` ahead of its use. Never faults: any address will do.
#[inline(always)]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Up to [`AddressWindows::COUNT`] windows of 4 GiB that a process's heap blocks lie in
/// (a heap is in a few), so that a 16-byte-aligned address in one of them fits 32 bits:
/// the window's index in the top 4, its 16-byte units within the window below. Tables
/// that hold millions of blocks pay for each bit of an address.
#[derive(Clone, Debug, Default)]
pub(crate) struct AddressWindows {
    /// By index: the address's bits above the window's 32.
    bases: Vec<u64>,
}

impl AddressWindows {
    pub const COUNT: usize = 16;
    const UNITS: u32 = 28;

    /// `addr` in 32 bits, if it is 16-byte aligned and in a window already seen.
    #[inline(always)]
    pub fn short(&self, addr: u64) -> Option<u32> {
        let index = self.bases.iter().position(|&b| b == addr >> 32)?;
        Self::code(index, addr)
    }

    /// `addr` in 32 bits, if it is 16-byte aligned and in a window seen or that can be
    /// added.
    #[inline(always)]
    pub fn short_or_add(&mut self, addr: u64) -> Option<u32> {
        let index = match self.bases.iter().position(|&b| b == addr >> 32) {
            Some(index) => index,
            None if self.bases.len() < Self::COUNT && addr & 15 == 0 => {
                self.bases.push(addr >> 32);
                self.bases.len() - 1
            }
            None => return None,
        };
        Self::code(index, addr)
    }

    /// `addr`, in the window of index `index`, in 32 bits, if it is 16-byte aligned.
    #[inline(always)]
    fn code(index: usize, addr: u64) -> Option<u32> {
        (addr & 15 == 0)
            .then_some((index as u32) << Self::UNITS | ((addr & 0xffff_ffff) >> 4) as u32)
    }

    /// The address a code stands for (0 for a window never seen: no block).
    #[inline(always)]
    pub fn addr(&self, code: u32) -> u64 {
        let Some(&base) = self.bases.get((code >> Self::UNITS) as usize) else {
            return 0;
        };
        base << 32 | u64::from(code & ((1 << Self::UNITS) - 1)) << 4
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.bases.len()
    }
}
