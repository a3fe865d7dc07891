//! The chosen process's snapshots as the report shows them: RSS split into the heap's
//! parts, next to the allocator's own statistics, and the snapshot the report explains.

use std::collections::BTreeMap;

use fragscope_trace::event::StatsSource;
use fragscope_trace::records::SnapshotReason;

use super::stream::{Evaluated, Stream};
use super::{CLASSES_PER_SNAPSHOT, STATS_MAX_DISTANCE_TICKS};
use crate::heap::{self, ClassAtSnapshot};
use crate::heaps::{self, Heap};
use crate::report::*;

/// The chosen process's snapshots, each decomposed, with the runtime heaps each lacks
/// marked.
pub(super) fn snapshots(s: &Stream, tick_ms: f64) -> Vec<Snapshot> {
    let mut snapshots: Vec<Snapshot> = s
        .evaluated
        .iter()
        .map(|e| snapshot(s, e, tick_ms))
        .collect();
    mark_missing_censuses(&mut snapshots);
    snapshots
}

/// The sample closest to `tick`, preferring the one taken at or just after it (the
/// recorder reads /proc right after pagemap, under the same tick).
pub(super) fn nearest<T>(items: &[T], tick: u64, tick_of: impl Fn(&T) -> u64) -> Option<&T> {
    let i = items.partition_point(|x| tick_of(x) < tick);
    let after = items.get(i);
    let before = i.checked_sub(1).and_then(|j| items.get(j));
    match (before, after) {
        (Some(b), Some(a)) => {
            if tick_of(a) - tick <= tick - tick_of(b) + 20 {
                Some(a)
            } else {
                Some(b)
            }
        }
        (b, a) => a.or(b),
    }
}

/// Snapshot `e` as the report shows it: RSS split into parts, beside the allocator's
/// statistics of its moment.
fn snapshot(s: &Stream, e: &Evaluated, tick_ms: f64) -> Snapshot {
    let h = &e.heap;
    let rss = nearest(&s.rss, e.tick, |r| r.tick);
    let rollup = nearest(&s.rollups, e.tick, |r| r.0);
    let lazy_reported = rollup.map_or(0, |r| r.1);
    let (vm_rss, anon, file) = rss.map_or((0, 0, 0), |r| {
        (
            r.vm_rss_kib * 1024,
            r.rss_anon_kib * 1024,
            (r.rss_file_kib + r.rss_shmem_kib) * 1024,
        )
    });
    // Lazily freed pages are resident heap pages with no live object.
    let lazy_free = lazy_reported.min(h.free_resident_pages);
    let own = e.own_memory.min(anon);
    let heap_total =
        h.live + h.rounding + h.allocator_overhead + h.free_in_used_pages + h.free_resident_pages;
    let pymalloc = e.pymalloc.as_ref().map_or(0, |p| p.resident);
    let sbcl = e.sbcl.as_ref().map_or(0, |p| p.resident);
    let go = e.go.as_ref().map_or(0, |p| p.resident);
    let (jvm, jvm_runtime) = e.jvm.as_ref().map_or((0, 0), |p| (p.resident, p.runtime));
    let v8 = e.v8.as_ref().map_or(0, |p| p.physical);
    let runtimes = pymalloc + sbcl + go + jvm + jvm_runtime + v8;
    let other = anon as i64 - heap_total as i64 - own as i64 - runtimes as i64;
    let parts = Decomposition {
        rss: vm_rss,
        live: h.live,
        rounding: h.rounding,
        allocator_overhead: h.allocator_overhead,
        free_in_used_pages: h.free_in_used_pages,
        free_resident_pages: h.free_resident_pages - lazy_free,
        lazy_free,
        pymalloc_arenas: Some(pymalloc),
        sbcl_dynamic_space: Some(sbcl),
        go_heap: Some(go),
        jvm_heap: Some(jvm),
        jvm_runtime: Some(jvm_runtime),
        v8_heap: Some(v8),
        other_anon: other.max(0) as u64,
        file,
        fragscope_own: own,
        unexplained: other.min(0) + (vm_rss as i64 - anon as i64 - file as i64),
        rss_anon: anon,
        heap_resident: h.heap_resident,
        malloc_unknown: e.census_refused,
    };
    // Threads answer a stats request at their next call: close to the snapshot, on
    // either side of it.
    let allocator = nearest(&s.stats, e.tick, |x| x.0)
        .filter(|x| x.0.abs_diff(e.tick) <= STATS_MAX_DISTANCE_TICKS)
        .map(|(t, src, values, in_use)| {
            let values: BTreeMap<String, u64> = values.iter().cloned().collect();
            AllocatorView {
                t_ms: *t as f64 * tick_ms,
                source: src.name().into(),
                comparisons: compare_with_allocator(*src, &values, &parts, *in_use),
                values,
            }
        });
    let mut occupancy = Vec::with_capacity(heap::OCCUPANCY_BUCKETS);
    for b in 0..heap::OCCUPANCY_BUCKETS {
        let (lo, hi) = if b == 0 {
            (0, 0)
        } else {
            ((b as u32 - 1) * 10, b as u32 * 10)
        };
        occupancy.push(OccupancyBucket {
            lo_pct: lo,
            hi_pct: hi,
            pages: h.occupancy_pages[b],
            live_bytes: h.occupancy_live[b],
        });
    }
    let mut snapshot = Snapshot {
        t_ms: e.tick as f64 * tick_ms,
        reason: match e.reason {
            SnapshotReason::Periodic => "periodic",
            SnapshotReason::NearPeak => "near_peak",
            SnapshotReason::Exit => "exit",
        }
        .into(),
        parts,
        rss_measured: rss.is_some(),
        live_not_resident: h.live_not_resident,
        page_size: e.page_size,
        used_pages: h.used_pages,
        empty_pages: h.empty_pages,
        occupancy,
        allocator,
        pymalloc: e.pymalloc.clone(),
        sbcl: e.sbcl.clone(),
        go: e.go.clone(),
        jvm: e.jvm.clone(),
        v8: e.v8.clone(),
        heaps: Vec::new(),
        missing_census: Vec::new(),
        sharing: e.sharing.clone().map(|mut sh| {
            sh.rollup = rollup.and_then(|r| r.2);
            sh
        }),
    };
    snapshot.heaps = crate::heaps::at(&snapshot);
    snapshot
}

/// Marks, at each snapshot, the runtime heaps the process runs whose census it lacks
/// (the exit snapshot, most often): their part of the decomposition is unknown there.
fn mark_missing_censuses(snapshots: &mut [Snapshot]) {
    let runtimes = crate::heaps::runtimes_seen(snapshots);
    for s in snapshots {
        s.missing_census = runtimes
            .iter()
            .copied()
            .filter(|h| h.figures(s).is_none())
            .collect();
        if s.parts.malloc_unknown {
            s.missing_census.insert(0, Heap::Malloc);
        }
        for h in &s.missing_census {
            match h {
                Heap::Pymalloc => s.parts.pymalloc_arenas = None,
                Heap::Sbcl => s.parts.sbcl_dynamic_space = None,
                Heap::Go => s.parts.go_heap = None,
                Heap::Jvm => {
                    s.parts.jvm_heap = None;
                    s.parts.jvm_runtime = None;
                }
                Heap::V8 => s.parts.v8_heap = None,
                Heap::Malloc => {}
            }
        }
    }
}

/// The allocator's statistics next to fragscope's figures for the same quantity. Bytes in
/// use are compared at the very point of the calls where the allocator answered
/// (`in_use`); page figures come from the snapshot, a moment apart.
fn compare_with_allocator(
    source: StatsSource,
    v: &BTreeMap<String, u64>,
    d: &Decomposition,
    in_use: u64,
) -> Vec<Comparison> {
    let get = |k: &str| v.get(k).copied();
    let mut out = Vec::new();
    let mut add = |quantity: &str, theirs: Option<u64>, their_f: &str, ours: u64, our_f: &str| {
        if let Some(theirs) = theirs {
            out.push(Comparison {
                quantity: quantity.into(),
                allocator: theirs,
                allocator_formula: their_f.into(),
                fragscope: ours,
                fragscope_formula: our_f.into(),
                difference: theirs as i64 - ours as i64,
            });
        }
    };
    let free_pages = d.free_resident_pages + d.lazy_free;
    match source {
        StatsSource::Jemalloc => {
            let (alloc, active, resident, meta) = (
                get("stats.allocated"),
                get("stats.active"),
                get("stats.resident"),
                get("stats.metadata").unwrap_or(0),
            );
            add("in use", alloc, "allocated", in_use, "live + rounding");
            add(
                "free inside active pages",
                active.zip(alloc).map(|(a, b)| a.saturating_sub(b)),
                "active - allocated",
                d.free_in_used_pages,
                "free in used pages",
            );
            add(
                "free pages kept resident",
                resident
                    .zip(active)
                    .map(|(r, a)| r.saturating_sub(a + meta)),
                "resident - active - metadata",
                free_pages,
                "free resident pages + lazily freed",
            );
            add(
                "heap resident",
                resident.map(|r| r.saturating_sub(meta)),
                "resident - metadata",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Tcmalloc => {
            let lists = ["central", "transfer", "thread"]
                .iter()
                .map(|c| get(&format!("tcmalloc.{c}_cache_free_bytes")))
                .sum::<Option<u64>>();
            add(
                "in use",
                get("generic.current_allocated_bytes"),
                "current_allocated_bytes",
                in_use,
                "live + rounding",
            );
            add(
                "free in size-class free lists",
                lists,
                "central + transfer + thread cache free bytes",
                d.free_in_used_pages,
                "free in used pages",
            );
            add(
                "free pages kept",
                get("tcmalloc.pageheap_free_bytes"),
                "pageheap_free_bytes",
                free_pages,
                "free resident pages + lazily freed",
            );
            add(
                "heap",
                get("generic.heap_size")
                    .zip(get("tcmalloc.pageheap_unmapped_bytes"))
                    .map(|(h, u)| h.saturating_sub(u)),
                "heap_size - pageheap_unmapped_bytes",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Glibc => {
            // uordblks leaves out the chunks mmap'ed on their own (blocks above the mmap
            // threshold), which hblkhd counts and live + rounding holds.
            add(
                "in use",
                get("uordblks").zip(get("hblkhd")).map(|(u, h)| u + h),
                "uordblks + hblkhd (chunks in use, headers included, mmapped ones too)",
                in_use,
                "live + rounding",
            );
            add(
                "free in the heap",
                get("fordblks"),
                "fordblks",
                d.free_in_used_pages + free_pages,
                "free in used pages + free resident pages + lazily freed",
            );
            add(
                "heap",
                get("arena").zip(get("hblkhd")).map(|(a, h)| a + h),
                "arena + hblkhd (mapped, touched or not)",
                d.heap_resident,
                "heap resident (pagemap)",
            );
        }
        StatsSource::Mimalloc => add(
            "heap",
            get("current_commit"),
            "current_commit",
            d.heap_resident,
            "heap resident (pagemap)",
        ),
        StatsSource::Unknown => {}
    }
    out
}

/// The snapshot the report explains: the most heap waste that lasted, over every heap
/// the process has (malloc's and its runtime's), among snapshots that still hold a
/// meaningful amount of live data (at teardown a program frees everything, and the empty
/// heap left then says nothing about what pinned it while it ran) and that know every
/// heap the process runs (one without the runtime's census, as at exit, would weigh that
/// heap as nothing). A snapshot's waste lasts as far as the next snapshot (any) still
/// shows it: an instant during a ramp is not what a user asks about, and two runs of one
/// program then agree on the moment. Of equals, the latest wins (the settled state).
/// "Meaningful" is against the peak of live data in the calls (`peak_live`), not only at
/// snapshots: a short peak that no snapshot caught must not let a teardown heap qualify.
pub(super) fn focus_of(snapshots: &[Snapshot], peak_live: u64) -> Option<usize> {
    let max_live = snapshots.iter().map(heaps::live).max()?.max(peak_live);
    let complete = |i: usize| snapshots[i].missing_census.is_empty();
    let waste = |i: usize| heaps::waste(&snapshots[i]);
    // Waste that is gone by the next snapshot was passing; but not when the next one is
    // the exit's, taken after the program's own teardown freed what it kept, or one that
    // does not know every heap.
    let lasting = |i: usize| match snapshots.get(i + 1) {
        Some(next) if next.reason != "exit" && complete(i + 1) => waste(i).min(waste(i + 1)),
        _ => waste(i),
    };
    (0..snapshots.len())
        .filter(|&i| complete(i) && heaps::live(&snapshots[i]) * 100 >= max_live)
        .max_by_key(|&i| lasting(i))
}

/// The snapshot nearest `ms` into the recording (`--at`).
pub(super) fn nearest_snapshot(snapshots: &[Snapshot], ms: f64) -> Option<usize> {
    (0..snapshots.len()).min_by(|&a, &b| {
        let d = |i: usize| (snapshots[i].t_ms - ms).abs();
        d(a).total_cmp(&d(b))
    })
}

/// The size classes at the focus snapshot (largest first), and each snapshot's largest.
pub(super) fn size_classes(
    s: &Stream,
    focus: Option<usize>,
    tick_ms: f64,
) -> (Vec<SizeClass>, Vec<ClassHistory>) {
    let Some(f) = focus else {
        return (Vec::new(), Vec::new());
    };
    let first = &s.evaluated[0].classes;
    let mut classes: Vec<SizeClass> = s.evaluated[f]
        .classes
        .iter()
        .map(|c| SizeClass {
            usable: c.usable,
            objects: c.objects,
            live_bytes: c.live_bytes,
            usable_bytes: c.usable_bytes,
            pages: c.pages,
            mean_occupancy: c.mean_occupancy,
            retained_free: c.retained_free,
            retained_free_first: first
                .iter()
                .find(|x| x.usable == c.usable)
                .map_or(0, |x| x.retained_free),
        })
        .collect();
    classes.sort_by_key(|c| std::cmp::Reverse(c.usable_bytes + c.retained_free));
    let history = s
        .evaluated
        .iter()
        .map(|e| {
            let mut cs: Vec<&ClassAtSnapshot> = e.classes.iter().collect();
            cs.sort_by_key(|c| std::cmp::Reverse(c.usable_bytes + c.retained_free));
            ClassHistory {
                t_ms: e.tick as f64 * tick_ms,
                classes: cs
                    .into_iter()
                    .take(CLASSES_PER_SNAPSHOT)
                    .map(|c| ClassPoint {
                        usable: c.usable,
                        live_bytes: c.live_bytes,
                        retained_free: c.retained_free,
                    })
                    .collect(),
            }
        })
        .collect();
    (classes, history)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc's bytes in use are its heap's chunks in use and its mmapped chunks (a process
    /// holding a block above the mmap threshold once showed that block as a difference).
    #[test]
    fn glibcs_bytes_in_use_count_its_mmapped_chunks() {
        let v: BTreeMap<String, u64> = [
            ("arena", 200_000),
            ("uordblks", 150_000),
            ("fordblks", 50_000),
            ("hblkhd", 1_052_672),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        let d = Decomposition::default();
        let cmp = compare_with_allocator(StatsSource::Glibc, &v, &d, 1_200_000);
        let in_use = cmp.iter().find(|c| c.quantity == "in use").unwrap();
        assert_eq!(in_use.allocator, 150_000 + 1_052_672);
        assert_eq!(in_use.difference, 2_672);
    }
}
