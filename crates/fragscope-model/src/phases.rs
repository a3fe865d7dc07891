//! Phases: the plateaus and ramps of a run, found in its RSS and live-bytes curves.
//!
//! Both curves are normalised by their own peak (so a fall of live bytes under a flat RSS
//! — the signature of fragmentation — is as visible as RSS itself), fitted top-down with
//! straight segments until every point is within a tolerance, and neighbouring segments
//! of the same kind and level are joined.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseKind {
    Growth,
    Plateau,
    Decline,
    /// Rises and falls with no level held long enough to be a plateau.
    Churn,
}

impl PhaseKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Growth => "growth",
            Self::Plateau => "plateau",
            Self::Decline => "decline",
            Self::Churn => "churn",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseSpan {
    pub start_ms: f64,
    pub end_ms: f64,
    pub kind: PhaseKind,
}

/// Deviation (fraction of a curve's peak) a straight segment may leave unexplained.
const TOLERANCE: f64 = 0.08;
/// Points the curves are resampled to.
const GRID: usize = 1000;

/// Finds phases in `points`: (t_ms, rss, live), in time order.
pub fn detect(points: &[(f64, u64, u64)]) -> Vec<PhaseSpan> {
    if points.len() < 2 {
        return Vec::new();
    }
    let t0 = points[0].0;
    let t1 = points[points.len() - 1].0;
    if t1 <= t0 {
        return Vec::new();
    }
    let peak_rss = points.iter().map(|p| p.1).max().unwrap_or(0).max(1) as f64;
    let peak_live = points.iter().map(|p| p.2).max().unwrap_or(0).max(1) as f64;
    // Resample onto a uniform grid (last value at or before each grid time).
    let n = GRID.min(points.len());
    let mut t = Vec::with_capacity(n);
    let mut rss = Vec::with_capacity(n);
    let mut live = Vec::with_capacity(n);
    let mut j = 0;
    for i in 0..n {
        let ti = t0 + (t1 - t0) * i as f64 / (n - 1) as f64;
        while j + 1 < points.len() && points[j + 1].0 <= ti {
            j += 1;
        }
        t.push(ti);
        rss.push(points[j].1 as f64 / peak_rss);
        live.push(points[j].2 as f64 / peak_live);
    }
    let mut cuts = vec![0, n - 1];
    split(&rss, &live, 0, n - 1, &mut cuts);
    cuts.sort_unstable();
    cuts.dedup();

    let level = |a: usize, b: usize| {
        let len = (b - a + 1) as f64;
        (
            rss[a..=b].iter().sum::<f64>() / len,
            live[a..=b].iter().sum::<f64>() / len,
        )
    };
    let kind_of = |a: usize, b: usize| {
        let dr = rss[b] - rss[a];
        let dl = live[b] - live[a];
        let main = if dr.abs() >= dl.abs() { dr } else { dl };
        if main.abs() < TOLERANCE {
            PhaseKind::Plateau
        } else if main > 0.0 {
            PhaseKind::Growth
        } else {
            PhaseKind::Decline
        }
    };
    // Segments as grid index ranges, joined when kind (and, for plateaus, level) agree.
    let mut segs: Vec<(usize, usize, PhaseKind)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let k = kind_of(a, b);
        if let Some(last) = segs.last_mut() {
            let same = last.2 == k
                && (k != PhaseKind::Plateau || {
                    let (r1, l1) = level(last.0, last.1);
                    let (r2, l2) = level(a, b);
                    (r1 - r2).abs() < TOLERANCE && (l1 - l2).abs() < TOLERANCE
                });
            if same {
                last.1 = b;
                continue;
            }
        }
        segs.push((a, b, k));
    }
    // A plateau must last (5% of the run) to be one. Other stretches are named by RSS
    // when RSS moved, else by live bytes; three or more alternating live-byte ramps under
    // a held RSS are one churn phase: a phase is something a reader can point at.
    let min_plateau = (n / 20).max(1);
    let mut classed: Vec<(usize, usize, PhaseKind, bool)> = Vec::new(); // (.., by live)
    for (a, b, k) in segs {
        let rss_moved = (rss[b] - rss[a]).abs() >= TOLERANCE;
        let (kind, by_live) = if k == PhaseKind::Plateau {
            if b - a >= min_plateau {
                (PhaseKind::Plateau, false)
            } else {
                (ramp_kind(&rss, &live, a, b), !rss_moved)
            }
        } else if rss_moved {
            (
                if rss[b] > rss[a] {
                    PhaseKind::Growth
                } else {
                    PhaseKind::Decline
                },
                false,
            )
        } else {
            (k, true)
        };
        match classed.last_mut() {
            Some(last) if last.2 == kind && last.3 == by_live => last.1 = b,
            _ => classed.push((a, b, kind, by_live)),
        }
    }
    let mut phases: Vec<(usize, usize, PhaseKind)> = Vec::new();
    let mut i = 0;
    while i < classed.len() {
        let mut j = i;
        while j + 1 < classed.len() && classed[j + 1].3 && classed[i].3 {
            j += 1;
        }
        let (a, b) = (classed[i].0, classed[j].1);
        let kind = if j >= i + 2 {
            PhaseKind::Churn
        } else if j == i {
            classed[i].2
        } else {
            ramp_kind(&rss, &live, a, b)
        };
        match phases.last_mut() {
            Some(last) if last.2 == kind && kind != PhaseKind::Plateau => last.1 = b,
            _ => phases.push((a, b, kind)),
        }
        i = j + 1;
    }
    // A ramp too short to read (under 2% of the run) joins its longer neighbour.
    let min_len = (n / 50).max(1);
    let mut i = 0;
    while phases.len() > 1 && i < phases.len() {
        let (a, b, _) = phases[i];
        if b - a >= min_len {
            i += 1;
            continue;
        }
        if i + 1 < phases.len()
            && (i == 0 || phases[i + 1].1 - phases[i + 1].0 >= phases[i - 1].1 - phases[i - 1].0)
        {
            phases[i + 1].0 = a;
        } else {
            phases[i - 1].1 = b;
        }
        phases.remove(i);
    }
    let segs = phases;
    segs.into_iter()
        .map(|(a, b, kind)| PhaseSpan {
            start_ms: t[a],
            end_ms: t[b],
            kind,
        })
        .collect()
}

/// The kind of a stretch that is not a plateau: growth or decline by its net change, churn
/// when it went up and down by more than it moved overall.
fn ramp_kind(rss: &[f64], live: &[f64], a: usize, b: usize) -> PhaseKind {
    let mut best = (0.0f64, 0.0f64);
    for s in [rss, live] {
        let net = s[b] - s[a];
        let (lo, hi) = s[a..=b]
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if net.abs() > best.0.abs() {
            best.0 = net;
        }
        best.1 = best.1.max(hi - lo);
    }
    let (net, range) = best;
    if range > 2.0 * net.abs() + TOLERANCE {
        PhaseKind::Churn
    } else if net >= 0.0 {
        PhaseKind::Growth
    } else {
        PhaseKind::Decline
    }
}

/// Splits [a, b] at the point farthest from the straight line through its ends, while
/// that distance (in either curve) exceeds the tolerance.
fn split(rss: &[f64], live: &[f64], a: usize, b: usize, cuts: &mut Vec<usize>) {
    if b <= a + 1 {
        return;
    }
    let mut worst = (0.0, a);
    for k in a + 1..b {
        let f = (k - a) as f64 / (b - a) as f64;
        for s in [rss, live] {
            let d = (s[k] - (s[a] + (s[b] - s[a]) * f)).abs();
            if d > worst.0 {
                worst = (d, k);
            }
        }
    }
    if worst.0 > TOLERANCE {
        cuts.push(worst.1);
        split(rss, live, a, worst.1, cuts);
        split(rss, live, worst.1, b, cuts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(parts: &[(usize, f64, f64, f64, f64)]) -> Vec<(f64, u64, u64)> {
        // (samples, rss from, rss to, live from, live to), 10 ms apart
        let mut out = Vec::new();
        for &(n, r0, r1, l0, l1) in parts {
            for i in 0..n {
                let f = i as f64 / n as f64;
                let t = out.len() as f64 * 10.0;
                out.push((t, (r0 + (r1 - r0) * f) as u64, (l0 + (l1 - l0) * f) as u64));
            }
        }
        out
    }

    #[test]
    fn two_plateaus_at_different_levels_are_two_phases() {
        let pts = curve(&[
            (50, 0.0, 100e6, 0.0, 90e6),
            (200, 100e6, 100e6, 90e6, 90e6),
            (20, 100e6, 100e6, 90e6, 10e6),
            (200, 100e6, 100e6, 10e6, 10e6),
        ]);
        let ph = detect(&pts);
        let kinds: Vec<_> = ph.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                PhaseKind::Growth,
                PhaseKind::Plateau,
                PhaseKind::Decline,
                PhaseKind::Plateau
            ],
            "{ph:?}"
        );
        // the second plateau starts after the fall of live bytes
        assert!(
            ph[3].start_ms >= 2650.0 && ph[3].start_ms <= 2750.0,
            "{ph:?}"
        );
    }

    #[test]
    fn a_sawtooth_without_plateaus_is_one_churn_phase() {
        let mut parts = vec![(40, 0.0, 100e6, 0.0, 100e6)];
        for _ in 0..6 {
            parts.push((20, 100e6, 100e6, 100e6, 10e6));
            parts.push((20, 100e6, 100e6, 10e6, 100e6));
        }
        let ph = detect(&curve(&parts));
        let kinds: Vec<_> = ph.iter().map(|p| p.kind).collect();
        assert!(kinds.len() <= 2, "{ph:?}");
        assert_eq!(*kinds.last().unwrap(), PhaseKind::Churn, "{ph:?}");
    }

    #[test]
    fn a_flat_run_is_one_plateau() {
        let pts = curve(&[(300, 50e6, 50e6, 20e6, 20e6)]);
        let ph = detect(&pts);
        assert_eq!(ph.len(), 1);
        assert_eq!(ph[0].kind, PhaseKind::Plateau);
    }
}
