//! The figures `fragscope compare` puts side by side, one set per run or trace, and the
//! median over repeated runs of one configuration.

use serde::Serialize;

use crate::report::Report;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunFigures {
    /// None when no RSS sample was taken.
    pub peak_rss: Option<u64>,
    /// The last RSS sample before the program exited.
    pub end_rss: u64,
    pub peak_live: u64,
    /// At the report's focus snapshot (the most heap waste while live data was held).
    pub focus_t_ms: Option<f64>,
    pub heap_resident: u64,
    pub live: u64,
    pub rounding: u64,
    pub free_in_used_pages: u64,
    pub free_resident_pages: u64,
    pub lazy_free: u64,
    pub other_anon: u64,
    pub fragmentation_ratio: Option<f64>,
    /// Of the recorded run (recording included), when fragscope ran it.
    pub wall_ms: Option<f64>,
    pub cpu_ms: Option<f64>,
}

impl RunFigures {
    pub fn of(report: &Report) -> Self {
        let mut f = Self {
            peak_rss: report.headline.peak_rss,
            end_rss: report.timeline.last().map_or(0, |p| p.rss),
            peak_live: report.headline.peak_live,
            fragmentation_ratio: report.headline.fragmentation_ratio,
            ..Default::default()
        };
        if let Some(i) = report.focus_snapshot {
            let s = &report.snapshots[i];
            let d = &s.parts;
            f.focus_t_ms = Some(s.t_ms);
            f.heap_resident = d.live + d.heap_waste();
            f.live = d.live;
            f.rounding = d.rounding;
            f.free_in_used_pages = d.free_in_used_pages;
            f.free_resident_pages = d.free_resident_pages;
            f.lazy_free = d.lazy_free;
            f.other_anon = d.other_anon;
        }
        f
    }

    /// Field by field medians (the lower middle for an even count).
    pub fn median(runs: &[RunFigures]) -> RunFigures {
        fn med<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            v.get(v.len().saturating_sub(1) / 2).copied()
        }
        let m = |f: fn(&RunFigures) -> u64| med(runs.iter().map(f).collect()).unwrap_or(0);
        let mo = |f: fn(&RunFigures) -> Option<f64>| med(runs.iter().filter_map(f).collect());
        RunFigures {
            peak_rss: med(runs.iter().filter_map(|r| r.peak_rss).collect()),
            end_rss: m(|r| r.end_rss),
            peak_live: m(|r| r.peak_live),
            focus_t_ms: mo(|r| r.focus_t_ms),
            heap_resident: m(|r| r.heap_resident),
            live: m(|r| r.live),
            rounding: m(|r| r.rounding),
            free_in_used_pages: m(|r| r.free_in_used_pages),
            free_resident_pages: m(|r| r.free_resident_pages),
            lazy_free: m(|r| r.lazy_free),
            other_anon: m(|r| r.other_anon),
            fragmentation_ratio: mo(|r| r.fragmentation_ratio),
            wall_ms: mo(|r| r.wall_ms),
            cpu_ms: mo(|r| r.cpu_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_are_per_field() {
        let runs: Vec<RunFigures> = [(10, Some(1.0)), (30, None), (20, Some(3.0))]
            .into_iter()
            .map(|(rss, w)| RunFigures {
                peak_rss: Some(rss),
                wall_ms: w,
                ..Default::default()
            })
            .collect();
        let m = RunFigures::median(&runs);
        assert_eq!(m.peak_rss, Some(20));
        assert_eq!(m.wall_ms, Some(1.0));
        assert_eq!(RunFigures::median(&runs[..2]).peak_rss, Some(10));
    }
}
