//! The RTS's heap over time: its figures after each event that changes them, and the
//! timeline's points, with RSS where the program was recorded.

use fragscope_ghc::{EventKind, Eventlog};

use crate::ghc_blocks::BlockCensus;

use super::gc_table::GcAccumulator;
use super::{CensusInput, GhcPoint, RssPoint};

/// The RTS's state after each event that changes it, in time order (ms on the RTS clock).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HeapState {
    pub(super) t_ms: f64,
    pub(super) live: Option<u64>,
    pub(super) heap_size: Option<u64>,
    pub(super) blocks_size: Option<u64>,
    pub(super) gc_frag: Option<u64>,
    pub(super) gc_slop: Option<u64>,
}

/// The heap's figures of an eventlog, step by step, and its GC table as it was read.
pub(super) struct HeapSeries {
    pub(super) states: Vec<HeapState>,
    pub(super) gc: GcAccumulator,
    /// The time of the last event, on the recording's clock.
    pub(super) end_ms: f64,
}

impl HeapSeries {
    /// Reads `log` (sorted by time), whose time 0 is `offset_ms` on the recording's clock.
    pub(super) fn read(log: &Eventlog, offset_ms: f64) -> Self {
        let mut states: Vec<HeapState> = Vec::new();
        let mut state = HeapState::default();
        let mut gc = GcAccumulator::default();
        for e in &log.events {
            let t_ms = e.time_ns as f64 / 1e6 + offset_ms;
            let before = (
                state.live,
                state.heap_size,
                state.blocks_size,
                state.gc_frag,
            );
            match &e.kind {
                EventKind::HeapLive { bytes, .. } => state.live = Some(*bytes),
                EventKind::HeapSize { bytes, .. } => state.heap_size = Some(*bytes),
                EventKind::BlocksSize { bytes, .. } => state.blocks_size = Some(*bytes),
                EventKind::GcStats(s) => {
                    state.gc_frag = Some(s.frag_bytes);
                    state.gc_slop = Some(s.slop_bytes);
                }
                _ => {}
            }
            gc.push(e, &state);
            if before
                != (
                    state.live,
                    state.heap_size,
                    state.blocks_size,
                    state.gc_frag,
                )
            {
                state.t_ms = t_ms;
                match states.last_mut() {
                    Some(last) if last.t_ms == t_ms => *last = state,
                    _ => states.push(state),
                }
            }
        }
        let end_ms = log
            .events
            .last()
            .map_or(0.0, |e| e.time_ns as f64 / 1e6 + offset_ms);
        Self { states, gc, end_ms }
    }

    /// The heap's figures at `t_ms`.
    pub(super) fn at(&self, t_ms: f64) -> HeapState {
        let i = self.states.partition_point(|s| s.t_ms <= t_ms);
        if i == 0 {
            HeapState::default()
        } else {
            self.states[i - 1]
        }
    }

    /// Whether the eventlog gave the heap's size at all.
    pub(super) fn heap_known(&self) -> bool {
        self.states.iter().any(|s| s.heap_size.is_some())
    }

    /// The timeline: with RSS, a point per sample (every 10 ms); without, a point per
    /// change of the heap.
    pub(super) fn points(
        &self,
        log: &Eventlog,
        rss: Option<&[RssPoint]>,
        offset_ms: f64,
    ) -> Vec<GhcPoint> {
        let full: Vec<GhcPoint> = match rss {
            Some(rss) => rss
                .iter()
                .map(|r| point(r.t_ms, &self.at(r.t_ms), Some(r)))
                .collect(),
            None => self.states.iter().map(|s| point(s.t_ms, s, None)).collect(),
        };
        let mut full = full;
        if rss.is_some() {
            mark_collections(&mut full, &collections(log, offset_ms));
        }
        full
    }

    /// The trace's block censuses, each with the heap's figures at its moment.
    pub(super) fn block_censuses(&self, censuses: &[CensusInput]) -> Vec<BlockCensus> {
        censuses
            .iter()
            .map(|c| {
                let s = self.at(c.t_ms);
                BlockCensus::new(
                    c.t_ms,
                    c.reason,
                    &c.blocks,
                    (s.heap_size, s.gc_frag, s.live),
                )
            })
            .collect()
    }
}

/// (t_ms, RSS, live) of each point, for phase detection.
pub(super) fn curve(full: &[GhcPoint]) -> Vec<(f64, u64, u64)> {
    full.iter()
        // VmRSS, not RSS minus LazyFree: a flat RSS over falling live data is the plateau
        // seed 000 describes, and LazyFree moves as the kernel pleases.
        .map(|p| {
            (
                p.t_ms,
                p.rss.or(p.heap_size).unwrap_or(0),
                p.live.unwrap_or(0),
            )
        })
        .collect()
}

/// A point of the timeline: the heap's figures, with the RSS sample of its moment.
pub(super) fn point(t_ms: f64, s: &HeapState, r: Option<&RssPoint>) -> GhcPoint {
    GhcPoint {
        t_ms,
        live: s.live,
        heap_size: s.heap_size,
        blocks_size: s.blocks_size,
        gc_frag: s.gc_frag,
        gc_slop: s.gc_slop,
        rss: r.map(|r| r.rss),
        rss_anon: r.map(|r| r.rss_anon),
        rss_file: r.map(|r| r.rss_file),
        lazy_free: r.map(|r| r.lazy_free),
        rss_minus_lazy_free: r.map(|r| r.rss.saturating_sub(r.lazy_free)),
        to_space: None,
    }
}

/// The collections of `log` as (start, end) on the recording's clock: from a GC_START
/// to the GC_END that closes the last capability's part in it.
pub(super) fn collections(log: &Eventlog, offset_ms: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut open = 0usize;
    let mut start = 0.0;
    for e in &log.events {
        let t = e.time_ns as f64 / 1e6 + offset_ms;
        match e.kind {
            EventKind::GcStart => {
                if open == 0 {
                    start = t;
                }
                open += 1;
            }
            EventKind::GcEnd if open > 0 => {
                open -= 1;
                if open == 0 {
                    out.push((start, t));
                }
            }
            _ => {}
        }
    }
    out
}

/// Anonymous memory beyond the heap and LazyFree at `p` (signed: megablocks not yet
/// touched are in the heap size but not in RSS).
fn anon_beyond_heap(p: &GhcPoint) -> Option<i64> {
    Some(p.rss_anon? as i64 - p.heap_size? as i64 - p.lazy_free? as i64)
}

/// Sets `to_space` of the points read inside a collection: the copying collector takes
/// megablocks for its to-space as it copies, and HEAP_SIZE counts them only once it
/// ends, so without this they would look like memory outside the heap.
fn mark_collections(points: &mut [GhcPoint], gcs: &[(f64, f64)]) {
    let inside = |t: f64| {
        let i = gcs.partition_point(|g| g.0 <= t);
        i > 0 && t <= gcs[i - 1].1
    };
    let flags: Vec<bool> = points.iter().map(|p| inside(p.t_ms)).collect();
    // What lies outside the heap at the nearest sample outside a collection, before
    // (else after) each point.
    let mut before = vec![None; points.len()];
    let mut last = None;
    for (i, p) in points.iter().enumerate() {
        if !flags[i] {
            last = anon_beyond_heap(p).or(last);
        }
        before[i] = last;
    }
    let mut next = None;
    for i in (0..points.len()).rev() {
        if !flags[i] {
            next = anon_beyond_heap(&points[i]).or(next);
            continue;
        }
        let Some(now) = anon_beyond_heap(&points[i]) else {
            continue;
        };
        let baseline = before[i].or(next).unwrap_or(0).max(0);
        points[i].to_space = Some((now - baseline).max(0) as u64);
    }
}

/// At most `n` points, evenly spaced, keeping the last.
pub(super) fn thin<T: Clone>(v: Vec<T>, n: usize) -> Vec<T> {
    if v.len() <= n || n < 2 {
        return v;
    }
    let step = (v.len() - 1) as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| v[((i as f64 * step).round() as usize).min(v.len() - 1)].clone())
        .collect()
}
