//! mimalloc 3.x's heap, read from outside a running process.
//!
//! mimalloc 3 has no segments. It reserves *arenas* (1 GiB at first, larger as it grows)
//! of 64 KiB *slices*; an arena's first slices (its info slices) hold its header, its
//! bitmaps (free, committed, dirty and purgeable slices; the pages of the main heap) and
//! one page descriptor (`mi_page_t`) per slice, kept apart from the blocks. A *page* is a
//! run of slices serving one block size (64 KiB for small blocks, 512 KiB medium, 4 MiB
//! large, or a singleton holding one larger block). Each thread allocates through its
//! *theap*, its thread-local part of a heap (the main heap, or one made with
//! `mi_heap_new`); a thread that ends leaves its pages abandoned (thread id 0, or 4 once
//! its arena lists them so) until another thread reclaims them. A block freed by another
//! thread goes on the page's `xthread_free` list (its low bit: the page is owned) and
//! stays counted in `used` until the owner collects it; there is no delayed-free list.
//!
//! Pages are found as mimalloc's own visitor (`mi_heap_visit_blocks`) finds them: every
//! heap of the sub-process (`subproc_main`'s list), in every arena, that heap's bitmap of
//! its pages there (a bit at each page's first slice), each page's descriptor from the
//! arena's table; then the abandoned pages taken from the OS outside arenas (a heap's
//! `os_abandoned_pages`). The pages a thread owns outside arenas (blocks of 2 GiB or more,
//! alignments over 64 KiB) are in its theap's queues only: those are walked when a theap
//! counts more pages than the arenas gave it. `subproc_main` is file-local: it is found by
//! name in an image that keeps its symbol table (as Rust release builds do); a stripped
//! image is refused with a note.
//!
//! Checked, as mimalloc's debug build asserts: the sub-process initialised, its main heap
//! the image's `heap_main` and its heaps as many as it counts; each arena's index,
//! sub-process and slices; each theap's heap; each page's descriptor naming its arena,
//! first slice and heap, its slices inside the arena and none of them free nor another
//! page's, `used <= capacity <= reserved`, its blocks inside its slices, its `free` and
//! `local_free` heads on carved blocks, every block of its thread-free list on one; an
//! owned page's theap one of its heap's, of the thread the page names; and each theap's
//! page count met by the pages found as its.

use object::Object;

use super::*;

pub(super) mod read;
pub(super) use read::census;

/// A verified 3.x release: its version (`mi_version`), its name, the sizes of the statics
/// that tell its build apart when the image does not keep `mi_version`, and its layout.
struct Release {
    version: u32,
    name: &'static str,
    statics: [(&'static str, u64); 4],
    layout: &'static Layout,
}

/// The verified releases, newest first: one line and one layout each.
const RELEASES: [Release; 1] = [Release {
    version: 30302,
    name: "mimalloc 3.3.2",
    statics: [
        ("subproc_main", 5840),
        ("heap_main", 6440),
        ("theap_main", 8096),
        ("tld_main", 112),
    ],
    layout: &V3_3_2,
}];

/// Byte offsets (x86-64) of what the census reads in mimalloc 3's structures, and the
/// sizes it relies on, for one release.
#[derive(Debug)]
pub(super) struct Layout {
    // mi_subproc_t: bytes read, then fields
    subproc_read: usize,
    subproc_arena_count: usize,
    subproc_arenas: usize,
    subproc_heap_main: usize,
    subproc_heaps: usize,
    subproc_heap_count: usize,
    subproc_memkind: usize,
    max_arenas: u64,
    // mi_memkind_t: static, OS (first and last kind of OS memory), arena
    kind_static: u32,
    kind_os: (u32, u32),
    kind_arena: u32,
    // mi_heap_t
    heap_read: usize,
    heap_subproc: usize,
    heap_next: usize,
    heap_theaps: usize,
    heap_os_abandoned: usize,
    heap_arena_pages: usize,
    // mi_theap_t; mi_tld_t's thread id
    theap_tld: usize,
    theap_heap: usize,
    theap_page_count: usize,
    theap_hnext: usize,
    theap_queues: usize,
    queue_size: usize,
    bins: usize,
    tld_thread_id: usize,
    // mi_page_t
    page_size: usize,
    page_thread_id: usize,
    page_free: usize,
    page_used: usize,
    page_capacity: usize,
    page_reserved: usize,
    page_local_free: usize,
    page_thread_free: usize,
    page_block_size: usize,
    page_start: usize,
    page_theap: usize,
    page_heap: usize,
    page_next: usize,
    // the page's mi_memid_t: an arena and slices, or an OS base and size, then its kind
    page_memid_arena: usize,
    page_memid_slice: usize,
    page_memid_slices: usize,
    page_memid_os_base: usize,
    page_memid_os_size: usize,
    page_memid_kind: usize,
    // mi_arena_t
    arena_read: usize,
    arena_subproc: usize,
    arena_index: usize,
    arena_slices: usize,
    arena_info_slices: usize,
    arena_free: usize,
    arena_committed: usize,
    arena_pages_meta: usize,
    // mi_arena_pages_t: its bitmap of pages
    arena_pages_bitmap: usize,
    // mi_bitmap_t's and mi_bbitmap_t's chunks (512 bits each), after their headers
    bitmap_chunks: u64,
    bbitmap_chunks: u64,
}

/// mimalloc 3.3.2 as libmimalloc-sys 0.1.49 builds it by default (`MI_DEBUG` 0, no
/// padding, free lists not encoded, page descriptors apart, 2-level page map), taken with
/// `offsetof` from that source so configured.
const V3_3_2: Layout = Layout {
    subproc_read: 1472,
    subproc_arena_count: 24,
    subproc_arenas: 32,
    subproc_heap_main: 1360,
    subproc_heaps: 1368,
    subproc_heap_count: 1432,
    subproc_memkind: 1448 + 16,
    max_arenas: 160,
    kind_static: 2,
    kind_os: (4, 6),
    kind_arena: 7,
    heap_read: 752 + 160 * 8,
    heap_subproc: 0,
    heap_next: 16,
    heap_theaps: 56,
    heap_os_abandoned: 704,
    heap_arena_pages: 752,
    theap_tld: 0,
    theap_heap: 8,
    theap_page_count: 176,
    theap_hnext: 240,
    theap_queues: 1304,
    queue_size: 32,
    bins: 75,
    tld_thread_id: 0,
    page_size: 120,
    page_thread_id: 0,
    page_free: 8,
    page_used: 16,
    page_capacity: 18,
    page_reserved: 20,
    page_local_free: 24,
    page_thread_free: 32,
    page_block_size: 40,
    page_start: 48,
    page_theap: 56,
    page_heap: 64,
    page_next: 72,
    page_memid_arena: 96,
    page_memid_slice: 104,
    page_memid_slices: 108,
    page_memid_os_base: 96,
    page_memid_os_size: 104,
    page_memid_kind: 112,
    arena_read: 144,
    arena_subproc: 24,
    arena_index: 32,
    arena_slices: 40,
    arena_info_slices: 48,
    arena_free: 104,
    arena_committed: 112,
    arena_pages_meta: 136,
    arena_pages_bitmap: 0,
    bitmap_chunks: 128,
    bbitmap_chunks: 448,
};

/// Where a process's mimalloc 3 keeps the statics the census starts from.
#[derive(Debug, Clone)]
pub(super) struct Statics {
    subproc: u64,
    heap_main: u64,
    layout: &'static Layout,
}

/// Whether the mimalloc in `file` is of the 3.x family: its `mi_version` says so, or, when
/// the linker dropped it, it has 3.x's statics (`subproc_main`, the thread-local
/// `__mi_theap_main`: not a definition to `object`) and not 2.x's `_mi_heap_main`.
pub(super) fn is_v3(file: &object::File) -> bool {
    if let Some(v) = version_of(file) {
        return version_major(v) == 3;
    }
    let has = |name: &str| {
        file.symbols()
            .chain(file.dynamic_symbols())
            .any(|s| s.name() == Ok(name) && !s.is_undefined())
    };
    !has("_mi_heap_main") && (has("__mi_theap_main") || has("subproc_main"))
}

/// The 3.x releases read, by name.
pub(super) fn verified_releases() -> Vec<&'static str> {
    RELEASES.iter().map(|r| r.name).collect()
}

/// The release of the mimalloc 3.x in `file` (the image at `path`, mapped at `base`) and its
/// statics, once they are those of a verified build; Err: why not.
pub(super) fn locate(
    file: &object::File,
    elf: &[u8],
    path: &str,
    base: u64,
) -> Result<(&'static str, Statics), String> {
    let verified: Vec<&str> = RELEASES.iter().map(|r| r.name).collect();
    let not_verified = |which: String| {
        format!(
            "the process runs on {which} ({path}), whose layout fragscope has not verified \
             (it reads {} as the mimalloc crate builds it by default, mimalloc 2.3.2, its \
             `v2` feature, and {} as Debian 13 builds it)",
            verified.join(", "),
            super::v3_0::RELEASE.1
        )
    };
    let version = version_of(file);
    let candidates: Vec<&Release> = match version {
        Some(v) => {
            let known: Vec<&Release> = RELEASES.iter().filter(|r| r.version == v).collect();
            if known.is_empty() {
                return Err(not_verified(format!("mimalloc {}", version_name(v))));
            }
            known
        }
        None => RELEASES.iter().collect(),
    };
    let (first, _) = RELEASES[0].statics[0];
    if size_of(file, first).is_none() {
        return Err(format!(
            "{path} keeps no symbol for mimalloc's {first} (stripped to its exported names): \
             its arenas and pages cannot be found"
        ));
    }
    let Some(release) = candidates.into_iter().find(|r| {
        r.statics
            .iter()
            .all(|(name, size)| size_of(file, name) == Some(*size))
    }) else {
        let sizes: Vec<String> = RELEASES[0]
            .statics
            .iter()
            .map(|(name, _)| match size_of(file, name) {
                Some(s) => format!("{name} {s} bytes"),
                None => format!("no {name}"),
            })
            .collect();
        let which = match version {
            Some(v) => format!("mimalloc {}", version_name(v)),
            None => "a mimalloc 3.x".into(),
        };
        return Err(format!(
            "{} (its statics: {}; another release, or a `secure` or `debug` build)",
            not_verified(which),
            sizes.join(", ")
        ));
    };
    let symbols = Symbols::resolve_at(elf, &["subproc_main", "heap_main"], base)?;
    Ok((
        release.name,
        Statics {
            subproc: symbols.need("subproc_main")?,
            heap_main: symbols.need("heap_main")?,
            layout: release.layout,
        },
    ))
}

#[cfg(test)]
mod tests;
