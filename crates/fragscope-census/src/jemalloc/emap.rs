//! jemalloc's extent map (`arena_emap_global`: an `emap_t`, which is one `rtree_t`): the
//! extent descriptor of every page jemalloc owns — slabs, large extents, dirty, muzzy and
//! retained extents. Read whole, it names each extent once (at its first page) whether or
//! not jemalloc keeps its statistics: a build configured with `--disable-stats` counts
//! no slab and no large extent, and keeps its full slabs on no list.
//!
//! Layout, x86-64 with 48 significant address bits (`LG_VADDR`, which jemalloc's configure
//! takes from the building machine; the builds read were configured so): a radix tree of
//! two levels keyed by page number. The root, inside `rtree_t` after its base and its
//! lock, holds 2^18 pointers (address bits 30-47), each to a leaf of 2^18 one-word
//! elements (bits 12-29; `RTREE_LEAF_COMPACT`): the descriptor's address in bits 7-47,
//! the size class from bit 48, the extent's state in bits 2-4 and the slab bit 0. A slab
//! is registered at every page, any other extent at its first and last pages; an element
//! cleared keeps its size class but no address.

use std::collections::{HashMap, HashSet};

use super::{Extent, EDATA_SIZE, PAGE};
use crate::library::StaticData;
use crate::memory::{le_u64, RecordReader};
use crate::residency::Residency;
use crate::ProcessMemory;

/// Key bits each level of the tree tells apart, and so the elements of the root and of
/// each leaf.
const LEVEL_BITS: u32 = 18;
const ELEMENTS: usize = 1 << LEVEL_BITS;
const ADDRESS_BITS: u32 = 48;
/// Extent descriptors lie on 128 bytes (`EDATA_ALIGNMENT`): the element's low bits are
/// its state.
const EDATA_ALIGNMENT: u64 = 128;

// extent_state_t.
const ACTIVE: u64 = 0;
const DIRTY: u64 = 1;
const MUZZY: u64 = 2;
const RETAINED: u64 = 3;

/// The extents of one arena, as the map names them.
#[derive(Default)]
pub(super) struct ArenaExtents {
    /// Each slab by its size class and bin shard.
    pub slabs: HashMap<(u64, u64), Vec<Slab>>,
    /// Active extents that are not slabs: their size class and bytes (jemalloc's offset
    /// page included).
    pub large: Vec<(u64, u64)>,
    pub dirty_pages: u64,
    pub muzzy_pages: u64,
    pub retained_pages: u64,
}

/// A slab: its descriptor's address, its free regions and its bytes.
pub(super) struct Slab {
    pub at: u64,
    pub free: u64,
    pub bytes: u64,
}

/// Every extent the map names, by arena.
#[derive(Default)]
pub(super) struct ExtentMap {
    pub arenas: HashMap<u64, ArenaExtents>,
    /// Every slab's descriptor.
    pub slabs: HashSet<u64>,
}

/// The map's root by its name: the word at `at` (the `rtree_t`) must be the base of
/// arena 0 (`b0`, which the map's nodes are carved from). Returns the root's address.
pub(super) fn by_symbol(
    mem: &mut ProcessMemory,
    at: u64,
    root_offset: usize,
    base0: u64,
) -> Result<u64, String> {
    let base = mem
        .read_u64(at)
        .map_err(|e| format!("jemalloc's extent map could not be read ({e})"))?;
    if base != base0 {
        return Err("jemalloc's extent map does not name the first arena's base".into());
    }
    Ok(at + root_offset as u64)
}

/// The map's root by its shape in the image's data: a word holding arena 0's base, then
/// (past the lock) the root's pointers, each null or a leaf on a cache line outside the
/// data, one at least set. Two such places are refused.
pub(super) fn by_shape(s: &StaticData, root_offset: usize, base0: u64) -> Result<u64, String> {
    let leaf =
        |w: u64| w == 0 || (w.is_multiple_of(64) && w > 0xffff && !s.contains(w) && w < 1 << 47);
    let len = root_offset + ELEMENTS * 8;
    let mut found = None;
    for at in memchr::memmem::find_iter(&s.bytes, &base0.to_le_bytes()) {
        if !at.is_multiple_of(8) || at + len > s.bytes.len() {
            continue;
        }
        let root = |i: usize| le_u64(&s.bytes, at + root_offset + 8 * i);
        if (0..ELEMENTS).all(|i| leaf(root(i))) && (0..ELEMENTS).any(|i| root(i) != 0) {
            let address = s.base + (at + root_offset) as u64;
            if found.replace(address).is_some() {
                return Err("two places look like jemalloc's extent map".into());
            }
        }
    }
    found.ok_or_else(|| "jemalloc's extent map was not found in its data".into())
}

/// Reads every extent the map at `root` names, each checked against its descriptor:
/// every element lies within its extent, its state is the descriptor's, an active one's
/// size class and slab bit too. An extent changing state (jemalloc stopped inside an
/// operation on it) is refused. Only the pages of the tree the snapshot found resident
/// are read (reading a page never touched would make the kernel map one).
pub(super) fn read(
    mem: &mut ProcessMemory,
    records: &mut Descriptors,
    residency: &Residency,
    root: u64,
) -> Result<ExtentMap, String> {
    let mut nodes = vec![0u8; ELEMENTS * 8];
    read_resident(mem, residency, root, &mut nodes)?;
    let mut map = ExtentMap::default();
    let mut leaf = vec![0u8; ELEMENTS * 8];
    // The extent of the element before: a slab's pages follow each other, each naming it.
    let mut last: Option<(u64, u64, u64)> = None;
    for i in 0..ELEMENTS {
        let child = le_u64(&nodes, 8 * i);
        if child == 0 {
            continue;
        }
        if !child.is_multiple_of(64) || child >= 1 << 47 {
            return Err(format!(
                "jemalloc's extent map holds {child:#x} where a leaf belongs"
            ));
        }
        read_resident(mem, residency, child, &mut leaf)?;
        for j in 0..ELEMENTS {
            let bits = le_u64(&leaf, 8 * j);
            let edata = bits & ((1 << ADDRESS_BITS) - 1) & !(EDATA_ALIGNMENT - 1);
            if edata == 0 {
                continue;
            }
            let page = ((i as u64) << (LEVEL_BITS + 12)) | ((j as u64) << 12);
            if let Some((at, first, bytes)) = last {
                if at == edata && page > first && page < first.saturating_add(bytes) {
                    continue;
                }
            }
            let e = Extent::of(&records.read(mem, edata)?);
            let first = e.addr & !(PAGE - 1);
            last = Some((edata, first, e.bytes));
            if page < first || page >= first.saturating_add(e.bytes) {
                return Err(format!(
                    "jemalloc's extent map names the extent at {edata:#x} for page {page:#x}, \
                     outside it: the heap changed while it was read"
                ));
            }
            if page != first {
                continue;
            }
            let (slab, state, class) = (bits & 1 == 1, (bits >> 2) & 7, bits >> ADDRESS_BITS);
            if state != e.state || (state == ACTIVE && (slab != e.slab || class != e.bin)) {
                return Err(format!(
                    "the extent at {edata:#x} is not what jemalloc's extent map says of it: \
                     the heap changed while it was read"
                ));
            }
            let arena = map.arenas.entry(e.arena).or_default();
            match state {
                ACTIVE if e.pai => {
                    return Err(
                        "jemalloc serves pages from its huge-page allocator (hpa), which \
                         fragscope does not read"
                            .into(),
                    )
                }
                ACTIVE if e.slab => {
                    arena.slabs.entry((e.bin, e.shard)).or_default().push(Slab {
                        at: edata,
                        free: e.free,
                        bytes: e.bytes,
                    });
                    map.slabs.insert(edata);
                }
                ACTIVE => arena.large.push((e.bin, e.bytes)),
                DIRTY => arena.dirty_pages += e.bytes / PAGE,
                MUZZY => arena.muzzy_pages += e.bytes / PAGE,
                RETAINED => arena.retained_pages += e.bytes / PAGE,
                _ => {
                    return Err(
                        "an extent was changing state when the process was stopped: the \
                         heap changed while it was read"
                            .into(),
                    )
                }
            }
        }
    }
    Ok(map)
}

/// Extent descriptors read from the process: with the others of their window (64 KiB)
/// when the snapshot found every page of that window resident, alone otherwise (reading
/// a page of jemalloc's metadata never touched would make the kernel map one, which the
/// next snapshot would count as resident).
pub(super) struct Descriptors<'a> {
    records: RecordReader,
    residency: &'a Residency<'a>,
    /// Each window's answer.
    whole: HashMap<u64, bool>,
}

impl<'a> Descriptors<'a> {
    pub fn new(residency: &'a Residency<'a>) -> Self {
        Self {
            records: RecordReader::default(),
            residency,
            whole: HashMap::new(),
        }
    }

    /// The descriptor at `at`.
    pub fn read(&mut self, mem: &mut ProcessMemory, at: u64) -> Result<[u8; EDATA_SIZE], String> {
        let window = at & !(RecordReader::WINDOW - 1);
        let residency = self.residency;
        let resident = *self.whole.entry(window).or_insert_with(|| {
            !residency.covers(window)
                || residency.resident_bytes(window, window + RecordReader::WINDOW)
                    == RecordReader::WINDOW
        });
        if resident {
            return self.records.read(mem, at);
        }
        let mut e = [0u8; EDATA_SIZE];
        mem.read(at, &mut e)
            .map_err(|err| format!("an extent descriptor at {at:#x} could not be read ({err})"))?;
        Ok(e)
    }
}

/// Fills `out` from `at`, the pages the snapshot found not resident left zero (those it
/// did not cover are read).
fn read_resident(
    mem: &mut ProcessMemory,
    residency: &Residency,
    at: u64,
    out: &mut [u8],
) -> Result<(), String> {
    out.fill(0);
    let end = at + out.len() as u64;
    let readable = |p: u64| {
        let page = p & !(PAGE - 1);
        !residency.covers(page) || residency.resident(page)
    };
    let mut p = at;
    while p < end {
        if !readable(p) {
            p = (p & !(PAGE - 1)) + PAGE;
            continue;
        }
        let start = p;
        while p < end && readable(p) {
            p = (p & !(PAGE - 1)) + PAGE;
        }
        let (lo, hi) = ((start - at) as usize, (p.min(end) - at) as usize);
        mem.read(start, &mut out[lo..hi])
            .map_err(|e| format!("jemalloc's extent map could not be read ({e})"))?;
        p = p.min(end);
    }
    Ok(())
}
