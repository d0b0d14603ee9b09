//! Overlap: how much slower each side computes while the other computes too.
//!
//! The probe times the device with the edge idle and the edge with the device idle, but
//! a pipelined step runs both at once. On separate machines that changes nothing; where
//! they share hardware (one machine's cores, memory bandwidth, a loaded host) each runs
//! slower while the other runs: on the benchmark's two shared cores the device's forward
//! and backward took 1.4–1.7x and the edge step 1.5–2x their probed times
//! (docs/results.md). The model of that here, used both to measure the factor (the
//! concurrent probe, [`fit_factor`]) and to predict with it (the cost model's schedule,
//! [`stretched`]): a side's work goes at its own speed while the other side is idle and
//! at 1/k of it while the other side computes, so an operation of `a` seconds alone, a
//! share `f` of whose (longer) time the other side computes, takes
//!
//! d = a / (1 − f·(1 − 1/k)).
//!
//! With f = 1 it takes k·a; with f = 0 (sequential split learning, M = 1, the pipeline's
//! fill and drain) a.
//!
//! The device has a second source of slowdown: its own link. While an activation goes up
//! or a gradient comes down, the device's network stack (the transfer's system calls,
//! interrupts and the kernel's packet processing, on a phone the radio's driver) runs on
//! the device's cores. On a device of a whole fast core that is noise; on the benchmark's
//! quarter of a core it made the device's forward 1.5x longer while a transfer was in
//! flight (docs/results.md, 5 December). Each source takes its share of the device's
//! speed: with a share f_e of an operation overlapped by the edge's compute (factor k_e)
//! and f_l by its link's transfers (factor k_l),
//!
//! d = a / (1 − f_e·(1 − 1/k_e) − f_l·(1 − 1/k_l)),
//!
//! the slowdown capped at 1 − 1/[`MAX_FACTOR`]. [`fit_factors`] finds both factors from
//! the same operations by least squares; the edge's step has the device's compute as
//! its one source (a server's transfers cost its core little).
//!
//! And the converse: the device's compute slows its own transfers. Sending and receiving
//! take the device's CPU too (system calls, the transport's flow control, decoding), and
//! where that CPU is scarce a transfer waits for it behind the device's compute. On the
//! benchmark's device of a tenth of a core (a CPU quota of 1 ms every 10 ms, shared by the
//! compute and the network threads) a frozen device's uploads took 1.6x their time at the
//! link's rate while it computed its next forward, and each wait for the quota is
//! several milliseconds (docs/results.md, 6 December). The same model with the roles
//! swapped: a transfer of `a` seconds at the link's rate, a share `f` of which the
//! device's compute overlaps, takes a / (1 − f·(1 − 1/k_link)), k_link fitted by
//! [`fit_factor`] from the concurrent probe's transfers against the device's compute.

use crate::measure::Overlap;
use serde::{Deserialize, Serialize};

/// Overlap factors of both sides (each at least 1): a side's compute time while the
/// other computes, over its time alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverlapFactors {
    /// The device's forward and backward while the edge computes.
    pub device: f64,
    /// The edge's step while the device computes.
    pub edge: f64,
    /// The device's forward and backward while its link carries a micro-batch (module
    /// docs). Plans written before it was modelled have none: 1.
    #[serde(default = "one")]
    pub device_link: f64,
    /// The device's transfers (its activation going up, its gradient coming down) while
    /// the device computes (module docs). Plans written before it was modelled have
    /// none: 1.
    #[serde(default = "one")]
    pub link: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for OverlapFactors {
    /// 1 each: separate hardware, the other side's work costs nothing.
    fn default() -> OverlapFactors {
        OverlapFactors { device: 1.0, edge: 1.0, device_link: 1.0, link: 1.0 }
    }
}

impl OverlapFactors {
    /// The measured factors where measured, these where not.
    pub fn or_measured(self, measured: &Overlap) -> OverlapFactors {
        OverlapFactors {
            device: measured.device.unwrap_or(self.device),
            edge: measured.edge.unwrap_or(self.edge),
            device_link: measured.device_link.unwrap_or(self.device_link),
            link: measured.link.unwrap_or(self.link),
        }
    }

    /// Whether every factor is 1: nothing is stretched.
    pub fn is_none(&self) -> bool {
        self.device <= 1.0 && self.edge <= 1.0 && self.device_link <= 1.0 && self.link <= 1.0
    }
}

/// The time of an operation of `alone_s` seconds alone when the other side computes
/// during a share `fraction` of it, with overlap factor `factor` (module docs).
pub fn stretched(alone_s: f64, fraction: f64, factor: f64) -> f64 {
    stretched_by(alone_s, &[(fraction, factor)])
}

/// The time of an operation of `alone_s` seconds alone slowed by several sources, each a
/// (share of the operation it overlaps, its factor) pair: the slowdowns add, up to
/// 1 − 1/[`MAX_FACTOR`] (module docs).
pub fn stretched_by(alone_s: f64, sources: &[(f64, f64)]) -> f64 {
    let slowdown: f64 = sources.iter().map(|&(f, k)| f.clamp(0.0, 1.0) * (1.0 - 1.0 / k.max(1.0))).sum();
    alone_s / (1.0 - slowdown.min(MAX_SLOWDOWN))
}

/// The share of `[start, end]` that `busy` (disjoint intervals) covers; 0 for an empty
/// interval.
pub fn covered_fraction(start: f64, end: f64, busy: &[(f64, f64)]) -> f64 {
    if end <= start {
        return 0.0;
    }
    let covered: f64 = busy.iter().map(|&(s, e)| (e.min(end) - s.max(start)).max(0.0)).sum();
    (covered / (end - start)).clamp(0.0, 1.0)
}

/// The union of `intervals` as disjoint intervals in order (what [`covered_fraction`]
/// takes): the uplink's and the downlink's transfers overlap each other.
pub fn union(mut intervals: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    intervals.retain(|&(s, e)| e > s);
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(intervals.len());
    for (s, e) in intervals {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged
}

/// One operation timed under the other side's load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimedOp {
    /// Its time alone (from the probe's apart measurement of the same size).
    pub alone_s: f64,
    /// When it started (seconds, on the clock of `fit_factor`'s busy intervals).
    pub start_s: f64,
    /// When it ended.
    pub end_s: f64,
}

/// What [`fit_factor`] found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverlapFit {
    /// The factor; `None` when too little of the operations overlapped the other side
    /// to say (Σ f² below 1/4: less than one operation half overlapped).
    pub factor: Option<f64>,
    /// Operations used.
    pub ops: usize,
    /// Their mean share overlapped.
    pub mean_fraction: f64,
    /// Their mean time over their time alone (d/a), whatever overlapped them.
    #[serde(default)]
    pub mean_stretch: f64,
}

/// The mean of d/a over operations usable for a fit.
fn mean_stretch(ops: &[TimedOp]) -> f64 {
    let ratios: Vec<f64> = ops.iter().filter(|o| usable(o)).map(|o| (o.end_s - o.start_s) / o.alone_s).collect();
    if ratios.is_empty() { 0.0 } else { ratios.iter().sum::<f64>() / ratios.len() as f64 }
}

/// An operation a fit can use: timed, with a time alone.
fn usable(o: &TimedOp) -> bool {
    o.alone_s > 0.0 && o.end_s > o.start_s && o.alone_s.is_finite() && o.end_s.is_finite()
}

/// The largest factor a fit reports (the slowdown share 1 − 1/k at most 0.95): beyond
/// it a side is starved, not sharing.
pub const MAX_FACTOR: f64 = 20.0;

/// The largest slowdown share, 1 − 1/[`MAX_FACTOR`].
const MAX_SLOWDOWN: f64 = 1.0 - 1.0 / MAX_FACTOR;

/// Σ f² below this for a source: less than one operation half overlapped by it, too
/// little to say.
const MIN_COVERAGE: f64 = 0.25;

/// The overlap factor k that best explains `ops`' times given the other side's `busy`
/// intervals: with c = 1 − 1/k the model says 1 − a/d = f·c for each operation, so c is
/// the least-squares slope Σ f·(1 − a/d) / Σ f². A slope below 0 (ran faster than alone:
/// noise, or a load that went away) gives k = 1; c is at most 0.95 (k = 20).
pub fn fit_factor(ops: &[TimedOp], busy: &[(f64, f64)]) -> OverlapFit {
    // The two-source fit with a second source that overlapped nothing is this one.
    let [fit, _] = fit_factors(ops, busy, &[]);
    fit
}

/// The factors of two sources that best explain `ops`' times together (the device's:
/// the edge's compute in `first`, its link's transfers in `second`; module docs): with
/// c = 1 − 1/k per source the model says 1 − a/d = f₁·c₁ + f₂·c₂, fitted by least
/// squares with both c at least 0 (a negative one is noise: it is put to 0 and the other
/// refitted alone) and at most 0.95. A source that overlapped too little to say
/// (Σ f² below 1/4) gets no factor and the other is fitted alone. Shares so nearly
/// proportional that the two cannot be told apart put the whole slowdown on `first`,
/// as the model with one source did.
pub fn fit_factors(ops: &[TimedOp], first: &[(f64, f64)], second: &[(f64, f64)]) -> [OverlapFit; 2] {
    let usable: Vec<(f64, f64, f64)> = ops
        .iter()
        .filter(|o| usable(o))
        .map(|o| {
            (
                covered_fraction(o.start_s, o.end_s, first),
                covered_fraction(o.start_s, o.end_s, second),
                1.0 - o.alone_s / (o.end_s - o.start_s),
            )
        })
        .collect();
    let sum = |g: &dyn Fn(&(f64, f64, f64)) -> f64| usable.iter().map(g).sum::<f64>();
    let (s11, s22, s12) = (sum(&|p| p.0 * p.0), sum(&|p| p.1 * p.1), sum(&|p| p.0 * p.1));
    let (s1y, s2y) = (sum(&|p| p.0 * p.2), sum(&|p| p.1 * p.2));
    let alone = |sxy: f64, sxx: f64| (sxy / sxx).max(0.0);
    let residual = |c1: f64, c2: f64| sum(&|p| (p.2 - c1 * p.0 - c2 * p.1).powi(2));
    let (known1, known2) = (s11 >= MIN_COVERAGE, s22 >= MIN_COVERAGE);
    let det = s11 * s22 - s12 * s12;
    let (c1, c2) = match (known1, known2) {
        (false, false) => (0.0, 0.0),
        (true, false) => (alone(s1y, s11), 0.0),
        (false, true) => (0.0, alone(s2y, s22)),
        // Correlation of the shares above 0.999: not separable.
        (true, true) if det <= 2e-3 * s11 * s22 => (alone(s1y, s11), 0.0),
        (true, true) => {
            let (c1, c2) = ((s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det);
            if c1 >= 0.0 && c2 >= 0.0 {
                (c1, c2)
            } else {
                let (only1, only2) = ((alone(s1y, s11), 0.0), (0.0, alone(s2y, s22)));
                if residual(only1.0, only1.1) <= residual(only2.0, only2.1) { only1 } else { only2 }
            }
        }
    };
    let known2 = known2 && !(known1 && det <= 2e-3 * s11 * s22);
    let mean = |g: &dyn Fn(&(f64, f64, f64)) -> f64| if usable.is_empty() { 0.0 } else { sum(g) / usable.len() as f64 };
    let fit = |known: bool, c: f64, mean_fraction: f64| OverlapFit {
        factor: known.then(|| 1.0 / (1.0 - c.clamp(0.0, MAX_SLOWDOWN))),
        ops: usable.len(),
        mean_fraction,
        mean_stretch: mean_stretch(ops),
    };
    [fit(known1, c1, mean(&|p| p.0)), fit(known2, c2, mean(&|p| p.1))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_stretches_by_the_share_it_overlaps() {
        assert_eq!(stretched(2.0, 0.0, 3.0), 2.0);
        assert!((stretched(2.0, 1.0, 3.0) - 6.0).abs() < 1e-12);
        // Half of its 2 s shared at k = 2: 1 s alone does 1 s of work, 1 s shared 0.5 s.
        assert!((stretched(1.5, 0.5, 2.0) - 2.0).abs() < 1e-12);
        assert_eq!(covered_fraction(0.0, 4.0, &[(-1.0, 1.0), (3.0, 3.5), (5.0, 6.0)]), 0.375);
        assert_eq!(covered_fraction(1.0, 1.0, &[(0.0, 2.0)]), 0.0);
    }

    #[test]
    fn the_fit_recovers_a_factor_from_partly_overlapped_operations() {
        // Operations of 1 s alone at k = 2.5, overlapped over 0, a half, and all of their
        // time: they took 1, 1/(1 − 0.5·0.6) and 2.5 s.
        let busy = [(10.0, 10.0 + 0.5 / 0.7), (20.0, 30.0)];
        let ops = [
            TimedOp { alone_s: 1.0, start_s: 0.0, end_s: 1.0 },
            TimedOp { alone_s: 1.0, start_s: 10.0, end_s: 10.0 + 1.0 / 0.7 },
            TimedOp { alone_s: 1.0, start_s: 20.0, end_s: 22.5 },
        ];
        let fit = fit_factor(&ops, &busy);
        assert!((fit.factor.unwrap() - 2.5).abs() < 1e-9, "{fit:?}");
        assert_eq!(fit.ops, 3);
        assert!((fit.mean_fraction - 0.5).abs() < 1e-9);
        // Faster than alone is noise: 1. Nothing overlapped: unknown.
        let quick = [TimedOp { alone_s: 1.0, start_s: 20.0, end_s: 20.9 }];
        assert_eq!(fit_factor(&quick, &busy).factor, Some(1.0));
        assert_eq!(fit_factor(&ops[..1], &busy).factor, None);
    }

    type Intervals = Vec<(f64, f64)>;

    /// Operations of 1 s alone, each overlapped by the two sources in the shares given,
    /// timed as the model says they take with c₁ = 0.5 (k₁ = 2) and c₂ = 0.25 (k₂ = 4/3).
    fn two_source_ops(shares: &[(f64, f64)], c1: f64, c2: f64) -> (Vec<TimedOp>, Intervals, Intervals) {
        let (mut ops, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &(f1, f2)) in shares.iter().enumerate() {
            let start = 10.0 * i as f64;
            let d = 1.0 / (1.0 - f1 * c1 - f2 * c2);
            ops.push(TimedOp { alone_s: 1.0, start_s: start, end_s: start + d });
            first.push((start, start + f1 * d));
            second.push((start + d - f2 * d, start + d));
        }
        (ops, first, second)
    }

    #[test]
    fn the_joint_fit_tells_the_edge_from_the_link() {
        let shares = [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.2, 0.9), (0.8, 0.3)];
        let (ops, first, second) = two_source_ops(&shares, 0.5, 0.25);
        let [edge, link] = fit_factors(&ops, &first, &second);
        assert!((edge.factor.unwrap() - 2.0).abs() < 1e-9, "{edge:?}");
        assert!((link.factor.unwrap() - 4.0 / 3.0).abs() < 1e-9, "{link:?}");
        assert_eq!((edge.ops, link.ops), (5, 5));
        assert!((edge.mean_fraction - 0.5).abs() < 1e-9 && (link.mean_fraction - 0.54).abs() < 1e-9);
        // The one-source fit against the edge alone would blame it for the link's share.
        assert!(fit_factor(&ops, &first).factor.unwrap() > 2.1);
        // Only the link slows: the edge's factor is 1, not negative noise.
        let (ops, first, second) = two_source_ops(&shares, 0.0, 0.6);
        let [edge, link] = fit_factors(&ops, &first, &second);
        assert_eq!(edge.factor, Some(1.0));
        assert!((link.factor.unwrap() - 2.5).abs() < 1e-9, "{link:?}");
        // A source that overlapped too little (Σ f² = 0.09) has no factor; the other is
        // fitted alone.
        let (ops, first, second) = two_source_ops(&[(0.3, 1.0), (0.0, 1.0), (0.0, 0.5)], 0.5, 0.25);
        let [edge, link] = fit_factors(&ops, &first, &second);
        assert_eq!(edge.factor, None);
        assert!(link.factor.unwrap() > 1.0, "{link:?}");
        // Always in the same proportion: not separable, the whole slowdown on the first.
        let (ops, first, second) = two_source_ops(&[(1.0, 0.5), (0.8, 0.4), (0.6, 0.3)], 0.5, 0.25);
        let [edge, link] = fit_factors(&ops, &first, &second);
        assert_eq!(link.factor, None);
        assert!(edge.factor.unwrap() > 2.0, "{edge:?}");
    }

    #[test]
    fn slowdowns_add_and_intervals_merge() {
        // Half overlapped by each of two sources of factor 2: 1/(1 − 0.25 − 0.25) = 2.
        assert!((stretched_by(1.0, &[(0.5, 2.0), (0.5, 2.0)]) - 2.0).abs() < 1e-12);
        assert!((stretched_by(1.0, &[(1.0, 20.0), (1.0, 20.0)]) - MAX_FACTOR).abs() < 1e-9, "capped at MAX_FACTOR");
        assert_eq!(stretched(3.0, 0.4, 1.0), 3.0);
        assert_eq!(
            union(vec![(3.0, 4.0), (0.0, 1.0), (0.5, 2.0), (5.0, 5.0), (2.0, 2.5)]),
            vec![(0.0, 2.5), (3.0, 4.0)]
        );
    }
}
