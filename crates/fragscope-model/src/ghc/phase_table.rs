//! The phases of a GHC program: found in its RSS and live data, each shown at one
//! moment with its decomposition, heap profile and block census.

use std::collections::BTreeMap;

use fragscope_ghc::HeapProfile;

use crate::ghc_blocks::{self, BlockCensus};
use crate::phases::{self, PhaseKind};

use super::decomposition::decompose;
use super::series::{point, HeapSeries};
use super::{ClosureType, GhcPhase, GhcPoint, RssPoint, CLOSURE_TYPES_PER_PHASE};

/// What the phases of a run are drawn from.
pub(super) struct PhaseSources<'a> {
    pub(super) full: &'a [GhcPoint],
    pub(super) rss: Option<&'a [RssPoint]>,
    pub(super) series: &'a HeapSeries,
    pub(super) profile: &'a HeapProfile,
    pub(super) block_censuses: &'a [BlockCensus],
    pub(super) offset_ms: f64,
}

impl PhaseSources<'_> {
    /// The phases of `curve`, the RSS and live data of `full`.
    pub(super) fn phases(&self, curve: &[(f64, u64, u64)]) -> Vec<GhcPhase> {
        let mut spans = phases::detect(curve);
        snap_to_steps(&mut spans, curve);
        let last_end = spans.last().map_or(0.0, |s| s.end_ms);
        spans
            .into_iter()
            .map(|span| self.phase(span, last_end))
            .collect()
    }

    /// One phase, shown at its middle (see below).
    fn phase(&self, span: phases::PhaseSpan, last_end: f64) -> GhcPhase {
        let (full, rss, offset_ms) = (self.full, self.rss, self.offset_ms);
        let heap_at = |t_ms: f64| self.series.at(t_ms);
        // A phase holds the points from its start up to the next phase's start: the
        // point where the next one begins is that one's (the heap's figures are steps,
        // each holding until the next event).
        let inside_at: Vec<usize> = (0..full.len())
            .filter(|&i| {
                full[i].t_ms >= span.start_ms
                    && (full[i].t_ms < span.end_ms
                        || (span.end_ms == last_end && full[i].t_ms <= span.end_ms))
            })
            .collect();
        let inside: Vec<&GhcPoint> = inside_at.iter().map(|&i| &full[i]).collect();
        // The phase is shown at its middle, or at the sample nearest it whose LazyFree
        // was read with it: a staler reading may predate the RTS's release of memory
        // and leave the released pages outside every part but `outside_live`.
        let middle = inside_at.len() / 2;
        let shown = rss
            .and_then(|rss| {
                (0..inside_at.len())
                    .filter(|&k| rss[inside_at[k]].lazy_free_fresh)
                    .min_by_key(|&k| k.abs_diff(middle))
            })
            .unwrap_or(middle);
        // Without RSS the points are the heap's changes, bunched where it grows: the
        // middle moment of the phase, not its middle point.
        let middle_ms = (span.start_ms + span.end_ms) / 2.0;
        let mid = match rss {
            Some(_) => inside.get(shown).copied().cloned(),
            None => Some(point(middle_ms, &heap_at(middle_ms), None)),
        }
        .unwrap_or_else(|| point(span.start_ms, &heap_at(span.start_ms), None));
        let (census_t_ms, closure_types) = census_near(
            self.profile,
            (span.start_ms - offset_ms, span.end_ms - offset_ms),
            mid.t_ms - offset_ms,
            offset_ms,
        );
        let block_census = (self.block_censuses)
            .iter()
            .filter(|c| c.t_ms >= span.start_ms && c.t_ms <= span.end_ms)
            .min_by(|a, b| {
                (a.t_ms - mid.t_ms)
                    .abs()
                    .total_cmp(&(b.t_ms - mid.t_ms).abs())
            })
            .cloned();
        // Without the eventlog's heap figures, the block census gives the heap (its
        // megablocks and blocks in use), beside the RSS sample nearest it.
        let shown_point = match (&block_census, mid.heap_size) {
            (Some(c), None) => {
                let at = inside
                    .iter()
                    .filter(|p| p.rss.is_some())
                    .min_by(|a, b| (a.t_ms - c.t_ms).abs().total_cmp(&(b.t_ms - c.t_ms).abs()))
                    .map_or_else(|| mid.clone(), |p| (*p).clone());
                GhcPoint {
                    heap_size: Some(c.heap_size),
                    blocks_size: Some(c.blocks_in_use),
                    ..at
                }
            }
            _ => mid.clone(),
        };
        GhcPhase {
            start_ms: span.start_ms,
            end_ms: span.end_ms,
            kind: span.kind,
            live_max: inside.iter().filter_map(|p| p.live).max().or(mid.live),
            live_end: inside.last().map_or(mid.live, |p| p.live),
            rss_max: inside.iter().filter_map(|p| p.rss).max(),
            heap_size_max: inside
                .iter()
                .filter_map(|p| p.heap_size)
                .max()
                .or(mid.heap_size),
            snapshot_t_ms: shown_point.t_ms,
            decomposition: decompose(&shown_point),
            census_t_ms,
            closure_types,
            pinned_note: None,
            block_census,
        }
    }
}

/// Moves each boundary between phases to the step it stands for: phase detection cuts
/// on a grid (up to 1000 cells over the run), so a boundary can fall a cell before the
/// collection that changed the heap, and the phase after it would then begin with the
/// figures before the change (an eventlog alone has a point only where the heap
/// changes). The boundary goes to the largest change of RSS (heap size without it) or
/// live data within two cells of it, among the points between its neighbours.
fn snap_to_steps(spans: &mut [phases::PhaseSpan], curve: &[(f64, u64, u64)]) {
    let (Some(first), Some(last)) = (curve.first(), curve.last()) else {
        return;
    };
    let cells = curve.len().clamp(2, 1000) - 1;
    let window = 2.0 * (last.0 - first.0) / cells as f64;
    let peak_rss = curve.iter().map(|p| p.1).max().unwrap_or(0).max(1) as f64;
    let peak_live = curve.iter().map(|p| p.2).max().unwrap_or(0).max(1) as f64;
    let change = |a: &(f64, u64, u64), b: &(f64, u64, u64)| {
        ((b.1 as f64 - a.1 as f64).abs() / peak_rss)
            .max((b.2 as f64 - a.2 as f64).abs() / peak_live)
    };
    for k in 1..spans.len() {
        let at = spans[k].start_ms;
        let (lo, hi) = (
            spans[k - 1].start_ms.max(at - window),
            spans[k].end_ms.min(at + window),
        );
        let best = (1..curve.len())
            .filter(|&i| curve[i].0 > lo && curve[i].0 < hi)
            .map(|i| (i, change(&curve[i - 1], &curve[i])))
            .filter(|&(_, c)| c > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((best, _)) = best {
            // A collection posts its figures in a few events a moment apart: the step
            // begins at the first of them.
            let mut i = best;
            while i > 1
                && curve[i - 1].0 > lo
                && curve[best].0 - curve[i - 1].0 < 1.0
                && change(&curve[i - 2], &curve[i - 1]) > 0.0
            {
                i -= 1;
            }
            spans[k - 1].end_ms = curve[i].0;
            spans[k].start_ms = curve[i].0;
        }
    }
}

/// The census within `span` (on the RTS clock) nearest `t_rts_ms`, largest labels first.
fn census_near(
    profile: &HeapProfile,
    span: (f64, f64),
    t_rts_ms: f64,
    offset_ms: f64,
) -> (Option<f64>, Vec<ClosureType>) {
    let within = |t_ns: u64| {
        let t = t_ns as f64 / 1e6;
        t >= span.0 && t <= span.1
    };
    let Some(sample) = profile
        .samples
        .iter()
        .filter(|s| within(s.time_ns))
        .min_by(|a, b| {
            let da = (a.time_ns as f64 / 1e6 - t_rts_ms).abs();
            let db = (b.time_ns as f64 / 1e6 - t_rts_ms).abs();
            da.total_cmp(&db)
        })
    else {
        return (None, Vec::new());
    };
    let mut by_label: BTreeMap<&str, u64> = BTreeMap::new();
    for e in &sample.entries {
        *by_label.entry(profile.label(e.label)).or_default() += e.residency_bytes;
    }
    let mut rows: Vec<ClosureType> = by_label
        .into_iter()
        .map(|(label, bytes)| ClosureType {
            label: label.to_owned(),
            bytes,
        })
        .collect();
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    if rows.len() > CLOSURE_TYPES_PER_PHASE {
        let rest: u64 = rows[CLOSURE_TYPES_PER_PHASE..]
            .iter()
            .map(|r| r.bytes)
            .sum();
        rows.truncate(CLOSURE_TYPES_PER_PHASE);
        rows.push(ClosureType {
            label: "other".into(),
            bytes: rest,
        });
    }
    (Some(sample.time_ns as f64 / 1e6 + offset_ms), rows)
}

/// Seed 000: after a fall of live data, a plateau whose block census shows megablocks or
/// pinned blocks kept by a few survivors, or (without a census) where ARR_WORDS
/// dominates the -hT profile, points at pinned blocks kept whole by the few objects
/// still alive in them.
pub(super) fn add_pinned_notes(phases: &mut [GhcPhase]) {
    const FALL: f64 = 0.7;
    const DOMINANT: f64 = 0.5;
    let mut earlier_live_max = 0u64;
    for phase in phases.iter_mut() {
        let total: u64 = phase.closure_types.iter().map(|c| c.bytes).sum();
        let arr_words = phase
            .closure_types
            .iter()
            .find(|c| c.label == "ARR_WORDS")
            .map_or(0, |c| c.bytes);
        // Without live data nothing is known to have fallen.
        let live = phase.decomposition.live;
        let fell = live.is_some_and(|l| (l as f64) < FALL * earlier_live_max as f64);
        if let Some(note) = phase
            .block_census
            .as_ref()
            .filter(|_| phase.kind == PhaseKind::Plateau && fell)
            .and_then(ghc_blocks::phase_note)
        {
            phase.pinned_note = Some(note);
        } else if phase.kind == PhaseKind::Plateau
            && total > 0
            && arr_words as f64 >= DOMINANT * total as f64
            && fell
        {
            phase.pinned_note = Some(format!(
                "ARR_WORDS is {:.0}% of the heap profile on this plateau, after live data fell \
                 from {} to {}: pinned blocks are the likely cause. Byte arrays of \
                 ByteString, Text and storable vectors are pinned; the RTS never moves pinned \
                 data and keeps a whole pinned block (and its megablock) while any object in it \
                 lives, and the heap profile counts such a block as live. Copy what you keep \
                 (Data.ByteString.copy) so the survivors share few blocks.",
                100.0 * arr_words as f64 / total as f64,
                mib(earlier_live_max),
                mib(live.unwrap_or(0))
            ));
        }
        earlier_live_max = earlier_live_max.max(phase.live_max.unwrap_or(0));
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}
