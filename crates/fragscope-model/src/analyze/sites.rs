//! Allocation sites: the stacks of the chosen process grouped by the place in the code
//! that allocates, ranked by what they hold, pin, allocate and leak.

use std::collections::HashMap;

use fragscope_trace::records::EndHow;

use super::stream::Stream;
use super::Options;
use crate::heap::{SiteAtSnapshot, SiteWeighting};
use crate::report::*;
use crate::symbols::{Frame, Symbolizer};

/// Wrappers whose frame says nothing about who allocated: the allocator's functions and
/// the shims that only pass an allocation on to it.
fn is_allocator_frame(f: &Frame) -> bool {
    let Some(name) = &f.function else {
        return false;
    };
    const WRAPPERS: [&str; 17] = [
        "operator new",
        "operator delete",
        "malloc",
        "calloc",
        "realloc",
        "__libc_",
        "xmalloc",
        "__rust_alloc",
        "__rust_realloc",
        "__rdl_alloc",
        "__rustc::__rdl_",
        "__rustc::__rust_",
        "<std::alloc::System as ",
        "std::sys::alloc::",
        // Crates whose functions only pass an allocation on: hashbrown's (every HashMap's
        // table) and allocator-api2's.
        "hashbrown::raw::alloc::",
        "allocator_api2::",
        "<allocator_api2::",
    ];
    WRAPPERS.iter().any(|w| name.starts_with(w))
}

/// A frame of the language's own library on the way to the allocator: Rust's `std`,
/// `core` and `alloc` (whose growth of a `Vec` or `String`, or iterator adapters, every
/// allocation of a Rust program goes through), C++'s containers and allocators in its
/// library's headers. Told by the source file when there are line tables, else by the
/// function's name.
fn in_language_library(f: &Frame) -> bool {
    const RUST_LIBRARY: [&str; 6] = [
        "std::", "<std::", "core::", "<core::", "alloc::", "<alloc::",
    ];
    match &f.file {
        Some(file) => {
            file.starts_with("/rustc/") && file.contains("/library/")
                || file.starts_with("/rust/deps/")
                || file.contains("/include/c++/")
        }
        None => {
            (f.function.as_deref()).is_some_and(|n| RUST_LIBRARY.iter().any(|p| n.starts_with(p)))
        }
    }
}

/// What is live at the end: leaked, if the process ended (by site, weighted). Blocks
/// inherited at the fork and kept are the parent's data, not leaks of this process.
pub(super) fn leaks(s: &Stream, weighting: SiteWeighting) -> (SiteSums, LeakFacts) {
    let mut site_leaks: SiteSums = HashMap::new();
    let (mut inherited_live_blocks, mut inherited_live_bytes) = (0u64, 0u64);
    for b in s.merger.live_blocks().values() {
        if b.inherited {
            inherited_live_blocks += 1;
            inherited_live_bytes += b.size;
        } else if b.stack != 0 {
            let w = weighting.weight(b.size);
            let l = site_leaks.entry(b.stack).or_default();
            l.0 += w;
            l.1 += w * b.size as f64;
        }
    }
    let leaks = LeakFacts {
        // Blocks live when a detach ended the recording are the running program's, not leaks.
        at_exit: s
            .end
            .as_ref()
            .is_some_and(|e| !matches!(e.how, EndHow::Vanished | EndHow::Detached)),
        leaked_bytes: s.live_bytes.saturating_sub(inherited_live_bytes),
        leaked_blocks: s.merger.live_blocks().len() as u64 - inherited_live_blocks,
        inherited_live_blocks,
        inherited_live_bytes,
        temporary_allocations: s.temporaries.0,
        temporary_bytes: s.temporaries.1,
        allocations: s.allocations,
    };
    (site_leaks, leaks)
}

/// Weighted (blocks, bytes) by stack id.
pub(super) type SiteSums = HashMap<u32, (f64, f64)>;

/// The site tables, and every site (sorted by stack id) when `opts.all_sites`.
pub(super) fn sites(
    s: &Stream,
    leaks: &SiteSums,
    focus: Option<usize>,
    opts: &Options,
    stacks: &str,
    tick_ms: f64,
) -> (Sites, Vec<Site>) {
    let empty = |t_ms| Sites {
        stacks: stacks.into(),
        t_ms,
        sparse_pct: opts.sparse_pct,
        by_live_bytes: Vec::new(),
        by_pinned_waste: Vec::new(),
        by_allocated_bytes: Vec::new(),
        by_allocations: Vec::new(),
        by_leaked_bytes: Vec::new(),
        by_temporary_allocations: Vec::new(),
    };
    if stacks == "none" {
        return (empty(None), Vec::new());
    }
    let figures = SiteFigures {
        s,
        leaks,
        at: focus
            .map(|f| s.evaluated[f].sites.iter().map(|x| (x.stack, x)).collect())
            .unwrap_or_default(),
    };
    let mut ids: Vec<u32> = figures.at.keys().copied().collect();
    for id in s.site_allocs.keys().chain(leaks.keys().copied()) {
        if !figures.at.contains_key(&id) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let mut frames = StackFrames {
        s,
        symbolizer: Symbolizer::new(s.code_maps.clone()),
    };
    let groups = group_by_label(&ids, &mut frames);
    let top = opts.top;
    let mut pick = |key: &dyn Fn(&u32) -> f64| -> Vec<Site> {
        let mut v: Vec<(f64, usize)> = groups
            .iter()
            .enumerate()
            .map(|(g, (_, group))| (group.iter().map(key).sum(), g))
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        v.into_iter()
            .filter(|(k, _)| *k > 0.0)
            .take(top)
            .map(|(_, g)| {
                let (label, group) = &groups[g];
                let mut group = group.clone();
                // The heaviest stack first: its frames stand for the row.
                group.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
                figures.site(label.clone(), frames.of(group[0]), &group)
            })
            .collect()
    };
    let at = &figures.at;
    let by_live_bytes = pick(&|id| at.get(id).map_or(0.0, |x| x.live_bytes));
    let by_pinned_waste = pick(&|id| at.get(id).map_or(0.0, |x| x.pinned_waste));
    let by_allocated_bytes = pick(&|id| s.site_allocs.get(id).map_or(0.0, |x| x.1));
    let by_allocations = pick(&|id| s.site_allocs.get(id).map_or(0.0, |x| x.0));
    let by_leaked_bytes = pick(&|id| leaks.get(id).map_or(0.0, |x| x.1));
    let by_temporary_allocations = pick(&|id| s.site_temporaries.get(id).map_or(0.0, |x| x.0));
    let mut all = Vec::new();
    if opts.all_sites {
        all = ids
            .iter()
            .map(|&id| {
                let frames = frames.of(id);
                figures.site(label_of(&frames), frames, &[id])
            })
            .collect();
    }
    let tables = Sites {
        by_live_bytes,
        by_pinned_waste,
        by_allocated_bytes,
        by_allocations,
        by_leaked_bytes,
        by_temporary_allocations,
        ..empty(focus.map(|f| s.evaluated[f].tick as f64 * tick_ms))
    };
    (tables, all)
}

/// The symbolized frames of the process's stacks.
struct StackFrames<'a> {
    s: &'a Stream,
    symbolizer: Symbolizer,
}

impl StackFrames<'_> {
    fn of(&mut self, id: u32) -> Vec<Frame> {
        let symbolizer = &mut self.symbolizer;
        self.s
            .merger
            .stack(id)
            .iter()
            .flat_map(|&a| symbolizer.frames(a))
            // fragscope's own wrapper of main is not the program's code
            .filter(|f| !f.module.starts_with("libfragscope_preload"))
            .collect()
    }
}

/// The label of a stack: its first frame outside the allocator and the language's own
/// library, so that a site is the program's own code that asked for the memory (a stack
/// all in the library, such as its own buffers, is labelled by its first frame outside the
/// allocator).
fn label_of(frames: &[Frame]) -> String {
    let own = |f: &&Frame| !is_allocator_frame(f) && !in_language_library(f);
    (frames.iter().find(own))
        .or_else(|| frames.iter().find(|f| !is_allocator_frame(f)))
        .or(frames.first())
        .map_or_else(|| "(no stack)".to_string(), Frame::label)
}

/// The tables list places in the code, not stacks: the stacks whose first frame outside
/// the allocator has the same label (function and line; the function alone without line
/// tables) are one row, shown with the stack that weighs most. `ids` are sorted.
fn group_by_label(ids: &[u32], frames: &mut StackFrames) -> Vec<(String, Vec<u32>)> {
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for &id in ids {
        let label = label_of(&frames.of(id));
        let i = *index.entry(label.clone()).or_insert_with(|| {
            groups.push((label, Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(id);
    }
    groups
}

/// Each stack's figures: at the focus snapshot, over the calls, and leaked at the end.
struct SiteFigures<'a> {
    s: &'a Stream,
    leaks: &'a SiteSums,
    at: HashMap<u32, &'a SiteAtSnapshot>,
}

impl SiteFigures<'_> {
    /// The figures of a set of stacks, summed; frames and stack id of the first.
    fn site(&self, label: String, frames: Vec<Frame>, group: &[u32]) -> Site {
        let mut site = Site {
            stack: group[0],
            label,
            frames,
            stacks: group.len(),
            live_objects: 0,
            live_bytes: 0,
            pinning_objects: 0,
            pinned_pages: 0.0,
            pinned_waste: 0,
            allocations: 0,
            allocated_bytes: 0,
            leaked_objects: 0,
            leaked_bytes: 0,
            temporary_allocations: 0,
        };
        let (mut objects, mut live, mut pinning, mut waste) = (0.0, 0.0, 0.0, 0.0);
        let (mut allocations, mut allocated) = (0.0, 0.0);
        let (mut leaked_objects, mut leaked, mut temporary) = (0.0, 0.0, 0.0);
        for id in group {
            if let Some(l) = self.leaks.get(id) {
                leaked_objects += l.0;
                leaked += l.1;
            }
            if let Some(t) = self.s.site_temporaries.get(id) {
                temporary += t.0;
            }
            if let Some(x) = self.at.get(id) {
                objects += x.live_objects;
                live += x.live_bytes;
                pinning += x.pinning_objects;
                site.pinned_pages += x.pinned_pages;
                waste += x.pinned_waste;
            }
            let a = self.s.site_allocs.get(id).unwrap_or_default();
            allocations += a.0;
            allocated += a.1;
        }
        site.live_objects = objects.round() as u64;
        site.live_bytes = live.round() as u64;
        site.pinning_objects = pinning.round() as u64;
        site.pinned_waste = waste.round() as u64;
        site.allocations = allocations.round() as u64;
        site.allocated_bytes = allocated.round() as u64;
        site.leaked_objects = leaked_objects.round() as u64;
        site.leaked_bytes = leaked.round() as u64;
        site.temporary_allocations = temporary.round() as u64;
        site
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str) -> Frame {
        Frame {
            addr: 0x5000,
            function: Some(function.to_string()),
            file: Some(file.to_string()),
            line: Some(1),
            module: "prog".to_string(),
            offset: 0x1000,
            inlined: true,
        }
    }

    /// A Rust program's stack as this program's own recording symbolised it: its site is
    /// the function that pushed, not the standard library's allocator.
    #[test]
    fn a_rust_site_is_the_code_that_grew_the_vec() {
        let std = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let frames = [
            frame(
                "<std::alloc::System as core::alloc::global::GlobalAlloc>::realloc",
                &format!("{std}/std/src/sys/alloc/unix.rs"),
            ),
            frame("__rustc::__rdl_realloc", &format!("{std}/std/src/alloc.rs")),
            frame(
                "alloc::alloc::realloc",
                &format!("{std}/alloc/src/alloc.rs"),
            ),
            frame(
                "<alloc::alloc::Global>::grow_impl_runtime",
                &format!("{std}/alloc/src/alloc.rs"),
            ),
            frame(
                "alloc::raw_vec::RawVecInner<A>::finish_grow",
                &format!("{std}/alloc/src/raw_vec/mod.rs"),
            ),
            frame(
                "alloc::vec::Vec<T,A>::push",
                &format!("{std}/alloc/src/vec/mod.rs"),
            ),
            frame("prog::read_records", "/src/prog/src/main.rs"),
        ];
        assert_eq!(label_of(&frames), "prog::read_records (main.rs:1)");
        // A frame without a file is told by its name.
        let mut bare: Vec<Frame> = frames.to_vec();
        bare[..6].iter_mut().for_each(|f| f.file = None);
        assert_eq!(label_of(&bare), "prog::read_records (main.rs:1)");
    }

    #[test]
    fn a_cpp_site_is_the_code_that_grew_the_vector() {
        let frames = [
            frame(
                "operator new(unsigned long)",
                "../../../../src/libstdc++-v3/libsupc++/new_op.cc",
            ),
            frame(
                "std::__new_allocator<int>::allocate(unsigned long, void const*)",
                "/usr/include/c++/12/bits/new_allocator.h",
            ),
            frame(
                "void std::vector<int>::_M_realloc_insert<int const&>(int const&)",
                "/usr/include/c++/12/bits/vector.tcc",
            ),
            frame("fill(std::vector<int>&)", "/src/fill.cc"),
        ];
        assert_eq!(label_of(&frames), "fill(std::vector<int>&) (fill.cc:1)");
    }

    /// A Rust program without line tables (a release build), as recorded: the iterator
    /// adapter from `core` is passed over by its name.
    #[test]
    fn a_rust_site_without_line_tables_is_named_by_function() {
        let mut frames = [
            frame("__rustc::__rdl_alloc", ""),
            frame(
                "<core::iter::adapters::map::Map<I,F> as core::iter::traits::iterator::Iterator>::fold",
                "",
            ),
            frame("linked_alloc::main", ""),
        ];
        frames
            .iter_mut()
            .for_each(|f| (f.file, f.line) = (None, None));
        assert_eq!(label_of(&frames), "linked_alloc::main (prog)");
    }

    /// A stack all inside the allocator and the library is labelled by its first frame
    /// outside the allocator, or its first frame, never left blank.
    #[test]
    fn a_stack_all_in_the_library_keeps_a_frame_of_it() {
        let std = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let frames = [
            frame("malloc", "malloc.c"),
            frame(
                "std::io::stdio::stdin",
                &format!("{std}/std/src/io/stdio.rs"),
            ),
        ];
        assert_eq!(label_of(&frames), "std::io::stdio::stdin (stdio.rs:1)");
        assert_eq!(label_of(&frames[..1]), "malloc (malloc.c:1)");
    }
}
