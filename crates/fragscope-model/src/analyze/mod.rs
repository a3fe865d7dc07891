//! One pass over a trace: merge each process's threads, follow its live bytes, evaluate
//! the heap at each page-residency snapshot as the merged calls reach that moment, and
//! turn it all into a [`Report`]. Memory is bounded by the live blocks (held once, in the
//! merge) and the /proc samples, never by the number of calls.
//!
//! Each process is followed as a `stream::Stream` while the trace is read (`reading`);
//! the report of the chosen one is put together in `report_assembly`.

mod decomposition;
mod headline;
mod reading;
mod report_assembly;
mod sites;
mod stream;
mod timeline;

use std::path::Path;

use fragscope_trace::TraceError;

use crate::heap_pages::Evaluation;
use crate::report::Report;

#[derive(Debug, Clone)]
pub struct Options {
    /// Analyse this pid (the last image of it, after exec) instead of the largest process.
    pub pid: Option<u32>,
    /// Pages under this live occupancy (percent) count as pinned by their objects.
    pub sparse_pct: u32,
    /// Rows per site table.
    pub top: usize,
    /// Also list every allocation site with its stack (`Report::all_sites`), for flame
    /// graphs and exports.
    pub all_sites: bool,
    /// How snapshots are evaluated from the live blocks: as `FRAGSCOPE_EVALUATION` says
    /// by default ([`Evaluation::asked`]), for the tests that compare the ways.
    pub evaluation: Evaluation,
    /// The snapshot the report describes (headline, sites, size classes, occupancy):
    /// asked for, else the one with the most heap waste.
    pub at: Option<At>,
}

/// A snapshot asked for by the moment it describes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    /// The snapshot nearest this many milliseconds into the recording.
    Ms(f64),
    /// The snapshot nearest the peak of live bytes.
    PeakLive,
    /// The snapshot with the highest RSS.
    PeakRss,
    /// The last snapshot.
    End,
}

impl At {
    /// `peak-live`, `peak-rss`, `end`, or a time into the recording: `930ms`, `1.5s`, or
    /// a number of seconds; else what was wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        match t {
            "peak-live" => return Ok(Self::PeakLive),
            "peak-rss" => return Ok(Self::PeakRss),
            "end" => return Ok(Self::End),
            _ => {}
        }
        let (number, ms_per_unit) = if let Some(n) = t.strip_suffix("ms") {
            (n, 1.0)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1000.0)
        } else {
            (t, 1000.0)
        };
        match number.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(Self::Ms(x * ms_per_unit)),
            _ => Err(format!(
                "`{text}` is not a moment: give peak-live, peak-rss, end, or a time into \
                 the recording such as 930ms, 1.5s or 12 (seconds)"
            )),
        }
    }

    /// How the report names it.
    pub fn describe(&self) -> String {
        match *self {
            Self::Ms(ms) => format!("nearest {:.2} s, as asked", ms / 1000.0),
            Self::PeakLive => "nearest the live peak, as asked".into(),
            Self::PeakRss => "the highest RSS, as asked".into(),
            Self::End => "the last, as asked".into(),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            pid: None,
            sparse_pct: 10,
            top: 10,
            all_sites: false,
            evaluation: Evaluation::asked(),
            at: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("no process with pid {0} in this trace (see `fragscope info`)")]
    NoSuchPid(u32),
    #[error("the trace holds no process (it was cut before the program started)")]
    Empty,
    #[error("no process of this trace could be traced: {0}")]
    NothingTraced(String),
}

/// Sites kept per snapshot (by live bytes and by pinned waste each).
const SITES_PER_SNAPSHOT: usize = 64;
/// Classes kept per snapshot for the history (by usable plus retained bytes).
const CLASSES_PER_SNAPSHOT: usize = 64;
/// Points of the timeline in the report.
const TIMELINE_POINTS: usize = 600;
/// Allocator statistics further than this from a snapshot describe another moment.
const STATS_MAX_DISTANCE_TICKS: u64 = 250;

/// Reads and analyses a whole trace. `progress` is told the bytes read so far.
///
/// The stages: `reading` merges each process's calls into its live blocks and evaluates
/// its snapshots as the calls reach them; the report's process is chosen; then
/// `report_assembly` puts together its `timeline` and phases, its snapshots'
/// `decomposition`, its `sites` and its `headline`.
pub fn analyze(
    path: &Path,
    opts: &Options,
    mut progress: impl FnMut(u64, u64),
) -> Result<Report, AnalysisError> {
    let mut read = reading::read_trace(path, opts, &mut progress)?;
    if read.streams.is_empty() {
        return Err(nothing_traced(&read.untraced));
    }
    let chosen = read.chosen(opts)?;
    // Its snapshots that waited for this choice; the others' are not needed.
    read.streams[chosen].evaluate_deferred(&read.ctx);
    // What is live at the end is all the report needs of the live blocks from here on: a
    // big heap's tables are given back before it names sites and assembles.
    let leaks = sites::leaks(&read.streams[chosen], read.ctx.weighting);
    for s in &mut read.streams {
        s.release_blocks();
    }
    fragscope_trace::live::return_freed_memory();
    Ok(report_assembly::assemble(path, opts, &read, chosen, leaks))
}

/// Why a trace without any process has no report.
fn nothing_traced(untraced: &[fragscope_trace::Untraced]) -> AnalysisError {
    if untraced.is_empty() {
        return AnalysisError::Empty;
    }
    let each: Vec<String> = untraced
        .iter()
        .map(|u| format!("{}: {}", u.label(), u.reason))
        .collect();
    AnalysisError::NothingTraced(each.join("; "))
}

#[cfg(test)]
mod tests {
    use super::At;

    #[test]
    fn a_moment_is_read_as_a_time_or_a_name() {
        assert_eq!(At::parse("930ms"), Ok(At::Ms(930.0)));
        assert_eq!(At::parse("1.5s"), Ok(At::Ms(1500.0)));
        assert_eq!(At::parse(" 12 "), Ok(At::Ms(12000.0)));
        assert_eq!(At::parse("peak-live"), Ok(At::PeakLive));
        assert_eq!(At::parse("peak-rss"), Ok(At::PeakRss));
        assert_eq!(At::parse("end"), Ok(At::End));
        for bad in ["", "soon", "-1s", "nan", "inf", "12 h", "ms"] {
            let err = At::parse(bad).unwrap_err();
            assert!(err.contains("is not a moment"), "{bad}: {err}");
        }
    }
}
