//! What the recorded run itself measured, beside the models' predictions, and how far
//! each prediction is from it.
//!
//! A model predicts the heap's resident bytes, so it is compared first with the heap
//! resident bytes the page-residency snapshots measured (pages of heap mappings that
//! held blocks), then, with the memory outside the heap added back, with VmRSS.

use serde::Serialize;

use super::{ModelResult, Replay};
use crate::report::{Report, Snapshot};

/// The recorded process's own figures, from the analysis of the same trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Measured {
    /// The allocator the program ran on, when it answered statistics.
    pub allocator: Option<String>,
    /// None when no RSS sample was taken (as the three below).
    pub peak_rss: Option<u64>,
    pub peak_rss_t_ms: Option<f64>,
    pub end_rss: Option<u64>,
    /// The snapshot with the most heap resident bytes (snapshots are taken every second,
    /// near RSS peaks and at exit).
    pub peak_heap_resident: Option<u64>,
    pub peak_heap_t_ms: Option<f64>,
    /// VmRSS minus the heap's resident bytes at that snapshot: code, libraries, stacks,
    /// allocator metadata, fragscope's buffers.
    pub outside_heap: Option<u64>,
    /// The last snapshot while the program still held its data (at or before
    /// [`Replay::held_t_ms`]): the plateau before teardown.
    pub held_heap_resident: Option<u64>,
    pub held_t_ms: Option<f64>,
    pub snapshots: usize,
}

/// One model's prediction against [`Measured`]; errors are (predicted - measured) /
/// measured, in percent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Accuracy {
    pub label: String,
    /// The model's peak (its heap resident bytes).
    pub predicted_peak_heap: u64,
    pub measured_peak_heap: Option<u64>,
    pub peak_heap_error_pct: Option<f64>,
    /// The model's peak plus the memory outside the heap.
    pub predicted_peak_rss: Option<u64>,
    pub measured_peak_rss: Option<u64>,
    pub peak_rss_error_pct: Option<f64>,
    /// At the plateau before teardown.
    pub predicted_held_heap: u64,
    pub measured_held_heap: Option<u64>,
    pub held_heap_error_pct: Option<f64>,
}

fn pct(predicted: u64, measured: u64) -> Option<f64> {
    (measured > 0).then(|| (predicted as f64 - measured as f64) * 100.0 / measured as f64)
}

impl Measured {
    /// The figures of `report` (an analysis of the replayed process), with the plateau
    /// taken at `held_t_ms` (allowing one sample interval of slack).
    pub fn of(report: &Report, held_t_ms: f64, slack_ms: f64) -> Self {
        let mut m = Measured {
            allocator: report.allocator.clone(),
            peak_rss: report.headline.peak_rss,
            peak_rss_t_ms: report.headline.peak_rss_t_ms,
            end_rss: report.timeline.last().map(|p| p.rss),
            snapshots: report.snapshots.len(),
            ..Default::default()
        };
        let peak = report
            .snapshots
            .iter()
            .filter(|s| s.parts.heap_resident > 0)
            .max_by_key(|s| s.parts.heap_resident);
        if let Some(s) = peak {
            m.peak_heap_resident = Some(s.parts.heap_resident);
            m.peak_heap_t_ms = Some(s.t_ms);
            m.outside_heap = s
                .rss_measured
                .then(|| s.parts.rss.saturating_sub(s.parts.heap_resident));
        }
        let held: Option<&Snapshot> = report
            .snapshots
            .iter()
            .filter(|s| s.t_ms <= held_t_ms + slack_ms && s.parts.heap_resident > 0)
            .max_by(|a, b| a.t_ms.total_cmp(&b.t_ms));
        if let Some(s) = held {
            m.held_heap_resident = Some(s.parts.heap_resident);
            m.held_t_ms = Some(s.t_ms);
        }
        m
    }

    /// How far `model`'s figures are from the measured ones.
    pub fn accuracy(&self, model: &ModelResult) -> Accuracy {
        let predicted_rss = self.outside_heap.map(|o| model.peak_rss + o);
        Accuracy {
            label: model.label.clone(),
            predicted_peak_heap: model.peak_rss,
            measured_peak_heap: self.peak_heap_resident,
            peak_heap_error_pct: self.peak_heap_resident.and_then(|m| pct(model.peak_rss, m)),
            predicted_peak_rss: predicted_rss,
            measured_peak_rss: self.peak_rss,
            peak_rss_error_pct: predicted_rss
                .zip(self.peak_rss)
                .and_then(|(p, m)| pct(p, m)),
            predicted_held_heap: model.held_rss,
            measured_held_heap: self.held_heap_resident,
            held_heap_error_pct: self.held_heap_resident.and_then(|m| pct(model.held_rss, m)),
        }
    }

    /// Every model of `replay`, in order.
    pub fn accuracies(&self, replay: &Replay) -> Vec<Accuracy> {
        replay.models.iter().map(|m| self.accuracy(m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_signed_percentages_of_the_measurement() {
        assert_eq!(pct(110, 100), Some(10.0));
        assert_eq!(pct(50, 100), Some(-50.0));
        assert_eq!(pct(5, 0), None);
        let m = Measured {
            peak_rss: Some(1000),
            peak_heap_resident: Some(800),
            outside_heap: Some(200),
            held_heap_resident: None,
            ..Default::default()
        };
        let model = ModelResult {
            label: "x".into(),
            model: "ideal".into(),
            config: Default::default(),
            peak_rss: 600,
            peak_t_ms: 0.0,
            end_rss: 0,
            held_rss: 100,
            rss: vec![],
            costs: Default::default(),
            seconds: 0.0,
            calls_per_s: 0.0,
        };
        let a = m.accuracy(&model);
        assert_eq!(a.peak_heap_error_pct, Some(-25.0));
        assert_eq!(a.predicted_peak_rss, Some(800));
        assert_eq!(a.peak_rss_error_pct, Some(-20.0));
        assert_eq!(a.held_heap_error_pct, None);
    }
}
