//! The report's headline: the moment it explains, what wastes most there, and the
//! sentence that says what to do about it.

use super::stream::Stream;
use crate::heaps::{self, Heap};
use crate::linked_allocator;
use crate::lisp_sites::LispSites;
use crate::lisp_sites::{self};
use crate::pymalloc::{self, PymallocParts};
use crate::python_sites::PythonSites;
use crate::python_sites::{self, PythonLog};
use crate::report::*;
use crate::sbcl::{self};
use crate::sharing::{self};

/// The headline and the runtime facts it draws on, as the report holds them.
pub(super) struct Told {
    pub(super) headline: Headline,
    pub(super) python_sites: Option<PythonSites>,
    pub(super) python_sites_note: Option<String>,
    pub(super) pymalloc_snapshot: Option<usize>,
    pub(super) lisp_sites: Option<LispSites>,
    pub(super) lisp_sites_note: Option<String>,
    pub(super) sbcl_snapshot: Option<usize>,
    pub(super) go_snapshot: Option<usize>,
    pub(super) jvm_snapshot: Option<usize>,
    pub(super) v8_snapshot: Option<usize>,
}

/// The headline of process `s` at `focus`, its sentence told by the heap that wastes most
/// there and completed by what its runtime's samples, censuses and sharing say.
pub(super) fn tell(
    s: &Stream,
    python: &PythonLog,
    snapshots: &[Snapshot],
    focus_snapshot: Option<usize>,
    timeline_full: &[(f64, u64, u64)],
    stacks: &str,
    tick_ms: f64,
) -> Told {
    let peak_rss = timeline_full.iter().max_by_key(|p| p.1).map(|p| (p.0, p.1));
    let mut headline = headline(
        peak_rss,
        peak_live(s, snapshots, tick_ms),
        focus_snapshot.map(|i| &snapshots[i]),
    );
    if focus_snapshot.is_none() && !snapshots.is_empty() {
        headline.sentence = no_focus_sentence(snapshots.len());
    }
    let python_sites = (!python.is_empty())
        .then(|| python_sites::sites(python, s.python_census.as_ref(), s.python_copies.as_ref()));
    let pymalloc_snapshot = (0..snapshots.len())
        .filter(|&i| snapshots[i].pymalloc.is_some())
        .max_by_key(|&i| snapshots[i].pymalloc.as_ref().map_or(0, |p| p.waste()));
    let python_sites_note = python_sites::unsampled_note(
        python,
        pymalloc_snapshot.is_some() || s.pymalloc_note.is_some(),
        stacks,
    );
    let focus = focus_snapshot.map(|i| &snapshots[i]);
    let runtime = RuntimeSentence {
        snapshots,
        focus,
        python_sites: python_sites.as_ref(),
        python_sites_note: python_sites_note.as_ref(),
        stacks,
    };
    runtime.tell(&mut headline);
    let cpython = pymalloc_snapshot.is_some() || !python.is_empty();
    if cpython && malloc_dominant(&headline) {
        headline.sentence = cpython_malloc_sentence(&headline.sentence);
    }
    let sbcl_snapshot = sbcl_snapshot(snapshots);
    tell_sbcl_garbage(&mut headline, snapshots, focus_snapshot);
    // What allocates is the lever on an SBCL program's collections, whatever holds its
    // memory.
    let lisp_sites = (!s.lisp.is_empty()).then(|| lisp_sites::sites(&s.lisp));
    let sbcl_version = snapshots
        .iter()
        .find_map(|x| x.sbcl.as_ref().map(|p| p.version.as_str()));
    let lisp_sites_note = lisp_sites::unsampled_note(&s.lisp, sbcl_version, stacks);
    if let Some(clause) = lisp_sites.as_ref().and_then(lisp_sites::headline_clause) {
        headline.sentence = format!("{} Here {clause}.", headline.sentence);
    }
    let census = s.census_shown(focus_snapshot);
    match (census, &s.linked_allocator) {
        // A census of the allocator linked into the program that was refused: the
        // headline says what the trace misses, and why its metadata was not read.
        (Some(c), Some(l)) if c.result.is_err() => {
            linked_allocator::headline(&mut headline, l, snapshots);
            if let Err(why) = &c.result {
                headline.sentence = format!(
                    "{} Its own metadata was not read: {why}.",
                    headline.sentence
                );
            }
        }
        (Some(c), _) => crate::census::headline(&mut headline, c, focus),
        (None, Some(l)) => linked_allocator::headline(&mut headline, l, snapshots),
        (None, None) => {}
    }
    tell_copies(
        &mut headline,
        snapshots,
        focus,
        python_sites.as_ref(),
        cpython,
    );
    Told {
        headline,
        python_sites,
        python_sites_note,
        pymalloc_snapshot,
        lisp_sites,
        lisp_sites_note,
        sbcl_snapshot,
        go_snapshot: (0..snapshots.len())
            .filter(|&i| snapshots[i].go.is_some())
            .max_by_key(|&i| snapshots[i].go.as_ref().map_or(0, |p| p.waste())),
        jvm_snapshot: (0..snapshots.len())
            .filter(|&i| snapshots[i].jvm.is_some())
            .max_by_key(|&i| snapshots[i].jvm.as_ref().map_or(0, |p| p.waste())),
        v8_snapshot: (0..snapshots.len())
            .filter(|&i| snapshots[i].v8.is_some())
            .max_by_key(|&i| snapshots[i].v8.as_ref().map_or(0, |p| p.waste())),
    }
}

/// The peak of live bytes and its time: the merged calls' (None when a snapshot could not
/// read the malloc heap), or, for a process that made no malloc call and has a runtime's
/// heap (a Go program without cgo), the most the censuses found live; for a JVM, the
/// most live over every heap a snapshot knows when that is more than malloc's own peak.
fn peak_live(s: &Stream, snapshots: &[Snapshot], tick_ms: f64) -> Option<(u64, f64)> {
    let runtime_only = s.calls == 0
        && snapshots
            .iter()
            .any(|x| x.heaps.iter().any(|h| h.heap != Heap::Malloc));
    // A JVM's or Node's malloc calls are its native memory; its objects are the Java or
    // V8 heap's.
    let jvm = (snapshots.iter()).any(|x| x.jvm.is_some() || x.v8.is_some());
    if jvm && !s.heap_unread() {
        let censuses = (snapshots.iter())
            .map(|x| (heaps::live(x), x.t_ms))
            .max_by_key(|x| x.0);
        let calls = (s.peak_live.0, s.peak_live.1 as f64 * tick_ms);
        return censuses.filter(|c| c.0 > calls.0).or(Some(calls));
    }
    if runtime_only {
        return snapshots
            .iter()
            .max_by_key(|x| heaps::live(x))
            .map(|x| (heaps::live(x), x.t_ms));
    }
    (!s.heap_unread()).then_some((s.peak_live.0, s.peak_live.1 as f64 * tick_ms))
}

fn no_focus_sentence(snapshots: usize) -> String {
    format!(
        "No page-residency snapshot came while live data was held ({} taken): only \
         RSS and live bytes describe the rest (record for longer, or with a smaller \
         --snapshot-ms).",
        if snapshots == 1 {
            "one was".to_string()
        } else {
            format!("{snapshots} were")
        }
    )
}

/// The sentence of a runtime's heap (pymalloc's arenas, SBCL's dynamic space), when it
/// wastes most at the focus and its waste is worth one.
struct RuntimeSentence<'a> {
    snapshots: &'a [Snapshot],
    focus: Option<&'a Snapshot>,
    python_sites: Option<&'a PythonSites>,
    python_sites_note: Option<&'a String>,
    stacks: &'a str,
}

impl RuntimeSentence<'_> {
    fn tell(&self, headline: &mut Headline) {
        let most_wasteful = self.focus.and_then(heaps::most_wasteful).map(|h| h.heap);
        let walked = (self.snapshots.iter().rev())
            .find_map(|s| s.sbcl.as_ref().filter(|p| p.objects.is_some()));
        let sentence = match (most_wasteful, self.focus) {
            (Some(Heap::Pymalloc), Some(f)) => f.pymalloc.as_ref().and_then(|p| self.pymalloc(p)),
            (Some(Heap::Sbcl), Some(f)) => f.sbcl.as_ref().and_then(|p| sbcl::headline(p, walked)),
            (Some(Heap::Go), Some(f)) => f.go.as_ref().and_then(crate::golang::headline),
            (Some(Heap::Jvm), Some(f)) => f.jvm.as_ref().and_then(crate::jvm::headline),
            (Some(Heap::V8), Some(f)) => f.v8.as_ref().and_then(crate::v8::headline),
            _ => None,
        };
        if let Some((dominant, sentence)) = sentence {
            headline.dominant = Some(dominant.into());
            headline.sentence = sentence;
            headline.heap = most_wasteful;
        }
    }

    fn pymalloc(&self, p: &PymallocParts) -> Option<(&'static str, String)> {
        pymalloc::headline(p).map(|(dominant, sentence)| {
            match self.python_sites.and_then(python_sites::headline_clause) {
                Some(clause) => (dominant, format!("{sentence} Here {clause}.")),
                // Said where the line would be, so its absence is explained
                // (unless the user turned stacks off).
                None => match self.python_sites_note.filter(|_| self.stacks != "none") {
                    Some(note) => (dominant, format!("{sentence} {note}")),
                    None => (dominant, sentence),
                },
            }
        })
    }
}

/// Whether the headline blames malloc's own parts.
fn malloc_dominant(headline: &Headline) -> bool {
    headline.heap == Some(Heap::Malloc)
        && headline.dominant.as_deref().is_some_and(|d| {
            matches!(
                d,
                "free_resident_pages" | "free_in_used_pages" | "lazy_free" | "rounding"
            )
        })
}

/// A CPython process whose malloc heap wastes more than pymalloc's arenas: the waste
/// is in objects over 512 bytes, which pymalloc hands to malloc.
fn cpython_malloc_sentence(sentence: &str) -> String {
    format!(
        "{} In CPython this is malloc's heap, not pymalloc's arenas: objects over 512 \
         bytes (bytes, bytearray, long str, the tables of big lists, dicts and sets) \
         come from malloc, so its trim and its choice matter here (glibc's \
         malloc_trim(0) through ctypes returns free pages, MALLOC_ARENA_MAX=2 bounds a \
         threaded server's arenas, jemalloc or mimalloc by LD_PRELOAD keep fewer free \
         pages); reusing large buffers (a bytearray pool, memoryview slices) avoids the \
         churn.",
        sentence
    )
}

/// The SBCL census the report shows: the one with the most waste; one that walked the
/// objects (and can name them) when it has nine tenths of that.
fn sbcl_snapshot(snapshots: &[Snapshot]) -> Option<usize> {
    let sbcl_waste = |i: usize| snapshots[i].sbcl.as_ref().map_or(0, |p| p.waste());
    let most = (0..snapshots.len())
        .filter(|&i| snapshots[i].sbcl.is_some())
        .max_by_key(|&i| sbcl_waste(i));
    let walked = (0..snapshots.len())
        .filter(|&i| {
            snapshots[i]
                .sbcl
                .as_ref()
                .is_some_and(|p| p.objects.is_some())
        })
        .max_by_key(|&i| sbcl_waste(i));
    match (most, walked) {
        (Some(m), Some(w)) if sbcl_waste(w) * 10 >= sbcl_waste(m) * 9 => Some(w),
        _ => most,
    }
}

/// Garbage waiting for a full collection (the census that marked the most) says more
/// than free pages when it holds more than the malloc heap wastes.
fn tell_sbcl_garbage(headline: &mut Headline, snapshots: &[Snapshot], focus: Option<usize>) {
    let heap_waste = focus.map_or(0, |i| snapshots[i].parts.heap_waste());
    if let Some((dominant, sentence)) = snapshots
        .iter()
        .filter_map(|s| s.sbcl.as_ref())
        .filter(|p| p.garbage.unwrap_or(0) > heap_waste)
        .max_by_key(|p| p.garbage)
        .and_then(sbcl::garbage_headline)
    {
        headline.dominant = Some(dominant.into());
        headline.sentence = sentence;
        headline.heap = Some(Heap::Sbcl);
    }
}

/// A forked worker that copied more of its parent's memory than its heaps waste.
fn tell_copies(
    headline: &mut Headline,
    snapshots: &[Snapshot],
    focus: Option<&Snapshot>,
    python_sites: Option<&PythonSites>,
    cpython: bool,
) {
    let heaps_waste = focus.map_or(0, heaps::waste);
    if let Some((dominant, mut sentence)) = sharing::headline(snapshots, heaps_waste, cpython) {
        if let Some(clause) = python_sites.and_then(python_sites::copied_clause) {
            sentence = format!("{sentence} Here {clause}.");
        }
        headline.dominant = Some(dominant.into());
        headline.sentence = format!("{sentence} {}", headline.sentence);
    }
}

/// The headline from the focus snapshot's decomposition alone.
fn headline(
    peak_rss: Option<(f64, u64)>,
    peak_live: Option<(u64, f64)>,
    focus: Option<&Snapshot>,
) -> Headline {
    let mut h = Headline {
        peak_rss: peak_rss.map(|p| p.1),
        peak_rss_t_ms: peak_rss.map(|p| p.0),
        peak_live: peak_live.map(|p| p.0),
        peak_live_t_ms: peak_live.map(|p| p.1),
        focus_t_ms: None,
        fragmentation_ratio: None,
        heap: None,
        dominant: None,
        sentence: "No page-residency snapshot was taken: only RSS and live bytes are known \
                   (record for longer, or with a smaller --snapshot-ms)."
            .into(),
    };
    let Some(f) = focus else { return h };
    let d = &f.parts;
    h.focus_t_ms = Some(f.t_ms);
    let (all_resident, all_live) = (heaps::resident(f), heaps::live(f));
    if all_live > 0 {
        h.fragmentation_ratio = Some(all_resident as f64 / all_live as f64);
    }
    let candidates = [
        ("free_resident_pages", d.free_resident_pages),
        ("free_in_used_pages", d.free_in_used_pages),
        ("rounding", d.rounding),
        ("lazy_free", d.lazy_free),
    ];
    let (name, biggest) = candidates
        .into_iter()
        .max_by_key(|c| c.1)
        .unwrap_or(("", 0));
    let waste = d.heap_waste();
    let all_waste = heaps::waste(f);
    h.sentence = if d.other_anon > all_resident.max(1) * 2 {
        "Most of RSS is outside the traced heap (thread stacks, allocator metadata, runtimes \
         or mappings that never held a malloc'd object): see other_anon."
            .into()
    } else if all_waste * 10 < all_resident {
        // Dense over every heap the process has: a runtime's dense heap beside a small
        // malloc heap with a few free pages is not a malloc problem.
        h.heap = heaps::most_wasteful(f).map(|x| x.heap);
        if f.heaps.len() > 1 {
            "The heaps are dense: under a tenth of their resident bytes (malloc's and the \
             runtime's) is waste, so only holding less live data lowers RSS."
                .into()
        } else {
            "The heap is dense: under a tenth of its resident bytes is waste, so only holding \
             less live data lowers RSS."
                .into()
        }
    } else if let Some(top) = heaps::most_wasteful(f).filter(|t| t.heap != Heap::Malloc) {
        // A runtime's heap wastes most, too little for its own sentence (which follows
        // when it is worth one): malloc's parts are not the story.
        h.heap = Some(top.heap);
        format!(
            "Most of the waste is in the {}: {} of its {} resident ({}%), too little for \
             its own settings to recover much; holding less live data lowers RSS most.",
            top.heap.name(),
            crate::mib(top.waste),
            crate::mib(top.resident),
            100 * top.waste / top.resident.max(1)
        )
    } else {
        h.heap = Some(Heap::Malloc);
        h.dominant = Some(name.into());
        let pct = 100 * biggest / waste.max(1);
        match name {
            "free_resident_pages" => format!(
                "{pct}% of the waste is whole free pages the allocator keeps: a purge/trim \
                 setting would return them (jemalloc dirty_decay_ms, glibc malloc_trim or \
                 M_TRIM_THRESHOLD, tcmalloc's release rate)."
            ),
            "free_in_used_pages" => format!(
                "{pct}% of the waste is free space inside pages pinned by a few live objects: \
                 no purge returns it; only moving objects or not mixing lifetimes in the same \
                 pages helps (separate arenas for long-lived data, compaction)."
            ),
            "rounding" => format!(
                "{pct}% of the waste is size-class rounding: requested sizes sit just above \
                 class boundaries; resize the objects or choose an allocator with finer classes."
            ),
            _ => format!(
                "{pct}% of the waste is pages freed lazily (MADV_FREE): the kernel reclaims \
                 them under memory pressure, so RSS overstates what the program holds."
            ),
        }
    };
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime's heap that wastes most, though too little for its own sentence, is not
    /// told as malloc's free pages (an SBCL job with 0.4 MiB of malloc waste once got
    /// malloc's purge advice for 7 MiB of its dynamic space's).
    #[test]
    fn the_headline_names_the_heap_that_wastes_most() {
        let figures = |heap, resident: u64, live: u64| heaps::HeapFigures {
            heap,
            resident,
            live,
            waste: resident - live,
        };
        let snapshot = |heaps: Vec<heaps::HeapFigures>| Snapshot {
            t_ms: 266.0,
            reason: "periodic".into(),
            parts: Decomposition {
                free_resident_pages: 370_000,
                ..Default::default()
            },
            rss_measured: true,
            live_not_resident: 0,
            page_size: 4096,
            used_pages: 0,
            empty_pages: 0,
            occupancy: vec![],
            allocator: None,
            pymalloc: None,
            sbcl: None,
            go: None,
            jvm: None,
            v8: None,
            heaps,
            missing_census: vec![],
            sharing: None,
        };
        let sbcl = snapshot(vec![
            figures(Heap::Malloc, 1_105_920, 718_823),
            figures(Heap::Sbcl, 58_593_280, 50_840_000),
        ]);
        let h = headline(None, None, Some(&sbcl));
        assert_eq!(h.heap, Some(Heap::Sbcl));
        assert!(
            h.sentence
                .starts_with("Most of the waste is in the SBCL dynamic space: 7.4 MiB of its 56 MiB resident (13%)"),
            "{}",
            h.sentence
        );
        // Malloc's own waste keeps malloc's words.
        let malloc = snapshot(vec![figures(Heap::Malloc, 4_000_000, 1_000_000)]);
        let h = headline(None, None, Some(&malloc));
        assert_eq!(h.heap, Some(Heap::Malloc));
        assert!(h.sentence.contains("purge/trim"), "{}", h.sentence);
    }
}
