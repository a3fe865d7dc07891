//! The GC table: per generation and over the run, from the RTS's per-collection events.

use std::collections::BTreeMap;

use fragscope_ghc::EventKind;

use super::series::HeapState;
use super::{GcGeneration, GcTable};

#[derive(Default)]
pub(super) struct GcAccumulator {
    generations: BTreeMap<u16, GcGeneration>,
    gc_start_ns: Option<u64>,
    gc_end_ns: Option<u64>,
    allocated: BTreeMap<Option<u16>, u64>,
    copied: Option<u64>,
    max_residency: Option<u64>,
    memory_in_use: Option<u64>,
    frag_at_peak: Option<u64>,
    max_frag: Option<u64>,
    max_slop: Option<u64>,
    slop_underflowed: bool,
    oldest_generation: u16,
    live_before_stats: Option<u64>,
}

impl GcAccumulator {
    pub(super) fn push(&mut self, e: &fragscope_ghc::Event, state: &HeapState) {
        match &e.kind {
            EventKind::HeapInfo(info) => {
                self.oldest_generation = info.generations.saturating_sub(1)
            }
            // Every capability takes part in a parallel collection: from the first start
            // to the last end.
            EventKind::GcStart => {
                self.gc_start_ns.get_or_insert(e.time_ns);
            }
            EventKind::GcEnd => self.gc_end_ns = Some(e.time_ns),
            EventKind::HeapAllocated { bytes, .. } => {
                self.allocated.insert(e.capability, *bytes);
            }
            EventKind::HeapLive { bytes, .. } => self.live_before_stats = Some(*bytes),
            EventKind::HeapSize { bytes, .. } if Some(*bytes) > self.memory_in_use => {
                self.memory_in_use = Some(*bytes);
                self.frag_at_peak = state.gc_frag;
            }
            EventKind::GcStats(s) => {
                let pause_ms = match (self.gc_start_ns, self.gc_end_ns) {
                    (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e6,
                    _ => 0.0,
                };
                self.gc_start_ns = None;
                self.gc_end_ns = None;
                let g = self
                    .generations
                    .entry(s.generation)
                    .or_insert(GcGeneration {
                        generation: s.generation,
                        collections: 0,
                        copied_bytes: 0,
                        gc_ms: 0.0,
                        max_pause_ms: 0.0,
                    });
                g.collections += 1;
                g.copied_bytes += s.copied_bytes;
                g.gc_ms += pause_ms;
                g.max_pause_ms = g.max_pause_ms.max(pause_ms);
                *self.copied.get_or_insert(0) += s.copied_bytes;
                // `-s` takes the slop of major collections only; a slop beyond the heap
                // is the RTS's count gone below zero, not a size.
                if s.generation >= self.oldest_generation {
                    let heap = state.heap_size.max(self.memory_in_use).unwrap_or(0);
                    if s.slop_bytes > heap {
                        self.slop_underflowed = true;
                    } else {
                        self.max_slop = self.max_slop.max(Some(s.slop_bytes));
                    }
                }
                // The free blocks at the largest heap are paired with its HEAP_SIZE, which
                // the RTS posts after this collection's stats (the heap size known here is
                // the previous collection's).
                self.max_frag = self.max_frag.max(Some(s.frag_bytes));
                // `-s` counts residency after major collections only.
                if s.generation >= self.oldest_generation {
                    if let Some(live) = self.live_before_stats {
                        self.max_residency = self.max_residency.max(Some(live));
                    }
                }
            }
            _ => {}
        }
    }

    /// `elapsed_ms`: the eventlog's time at its last event; `None` without events.
    pub(super) fn finish(self, elapsed_ms: Option<f64>) -> GcTable {
        let gc_ms = (!self.generations.is_empty())
            .then(|| self.generations.values().map(|g| g.gc_ms).sum::<f64>());
        let elapsed_ms = elapsed_ms.map(|e| e.max(0.0));
        GcTable {
            generations: self.generations.into_values().collect(),
            elapsed_ms,
            gc_ms,
            mutator_ms: elapsed_ms.zip(gc_ms).map(|(e, g)| (e - g).max(0.0)),
            allocated_bytes: (!self.allocated.is_empty()).then(|| self.allocated.values().sum()),
            copied_bytes: self.copied,
            max_residency: self.max_residency,
            memory_in_use: self.memory_in_use,
            max_slop: if self.slop_underflowed {
                None
            } else {
                self.max_slop
            },
            slop_underflowed: self.slop_underflowed,
            fragmentation_at_peak: self.frag_at_peak,
            max_fragmentation: self.max_frag,
        }
    }
}
