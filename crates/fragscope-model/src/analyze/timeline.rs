//! RSS and live bytes over time, and the phases found in them.

use super::stream::Stream;
use super::TIMELINE_POINTS;
use crate::phases;
use crate::report::*;

/// Live and usable bytes at a tick, from the 10 ms live timeline.
fn live_at(s: &Stream, tick: u64) -> (u64, u64) {
    let i = s.live_timeline.partition_point(|p| p.0 <= tick / 10);
    i.checked_sub(1)
        .map_or((0, 0), |i| (s.live_timeline[i].1, s.live_timeline[i].2))
}

/// (t_ms, rss, live) at every RSS sample, and a timeline thinned to a few hundred points
/// (keeping each group's highest RSS, so peaks survive).
pub(super) fn timeline(s: &Stream, tick_ms: f64) -> (Vec<(f64, u64, u64)>, Vec<TimelinePoint>) {
    let full: Vec<(f64, u64, u64)> = s
        .rss
        .iter()
        .map(|r| {
            (
                r.tick as f64 * tick_ms,
                r.vm_rss_kib * 1024,
                live_at(s, r.tick).0,
            )
        })
        .collect();
    let group = s.rss.len().div_ceil(TIMELINE_POINTS).max(1);
    let thin = s
        .rss
        .chunks(group)
        .filter_map(|g| g.iter().max_by_key(|r| r.vm_rss_kib))
        .map(|r| {
            let (live, usable) = live_at(s, r.tick);
            TimelinePoint {
                t_ms: r.tick as f64 * tick_ms,
                rss: r.vm_rss_kib * 1024,
                rss_anon: r.rss_anon_kib * 1024,
                rss_file: (r.rss_file_kib + r.rss_shmem_kib) * 1024,
                live,
                usable,
            }
        })
        .collect();
    (full, thin)
}

pub(super) fn phases_of(full: &[(f64, u64, u64)], snapshots: &[Snapshot]) -> Vec<Phase> {
    phases::detect(full)
        .into_iter()
        .map(|p| {
            let inside = full.iter().filter(|x| x.0 >= p.start_ms && x.0 <= p.end_ms);
            let (mut rss_max, mut live_max, mut live_end) = (0, 0, 0);
            for x in inside {
                rss_max = rss_max.max(x.1);
                live_max = live_max.max(x.2);
                live_end = x.2;
            }
            // The last snapshot inside, unless it is the exit one and another exists:
            // a program's teardown is not the state of its phase; and one that knows
            // every heap (has the runtime's census) before one that does not.
            let inside: Vec<&Snapshot> = snapshots
                .iter()
                .filter(|s| s.t_ms >= p.start_ms && s.t_ms <= p.end_ms)
                .collect();
            let snap = inside
                .iter()
                .rev()
                .find(|s| s.reason != "exit" && s.missing_census.is_empty())
                .or_else(|| inside.iter().rev().find(|s| s.reason != "exit"))
                .or(inside.last())
                .copied();
            Phase {
                start_ms: p.start_ms,
                end_ms: p.end_ms,
                kind: p.kind,
                rss_max,
                live_max,
                live_end,
                snapshot_t_ms: snap.map(|s| s.t_ms),
                decomposition: snap.map(|s| s.parts.clone()),
            }
        })
        .collect()
}
