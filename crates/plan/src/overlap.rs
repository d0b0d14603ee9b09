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

use crate::measure::Overlap;
use serde::{Deserialize, Serialize};

/// Overlap factors of both sides (each at least 1): a side's compute time while the
/// other computes, over its time alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverlapFactors {
    /// The device's forward and backward.
    pub device: f64,
    /// The edge's step.
    pub edge: f64,
}

impl Default for OverlapFactors {
    /// 1 each: separate hardware, the other side's work costs nothing.
    fn default() -> OverlapFactors {
        OverlapFactors { device: 1.0, edge: 1.0 }
    }
}

impl OverlapFactors {
    /// The measured factors where measured, these where not.
    pub fn or_measured(self, measured: &Overlap) -> OverlapFactors {
        OverlapFactors { device: measured.device.unwrap_or(self.device), edge: measured.edge.unwrap_or(self.edge) }
    }
}

/// The time of an operation of `alone_s` seconds alone when the other side computes
/// during a share `fraction` of it, with overlap factor `factor` (module docs).
pub fn stretched(alone_s: f64, fraction: f64, factor: f64) -> f64 {
    let slowdown = fraction.clamp(0.0, 1.0) * (1.0 - 1.0 / factor.max(1.0));
    alone_s / (1.0 - slowdown)
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
}

/// The largest factor a fit reports (the slowdown share 1 − 1/k at most 0.95): beyond
/// it a side is starved, not sharing.
pub const MAX_FACTOR: f64 = 20.0;

/// The overlap factor k that best explains `ops`' times given the other side's `busy`
/// intervals: with c = 1 − 1/k the model says 1 − a/d = f·c for each operation, so c is
/// the least-squares slope Σ f·(1 − a/d) / Σ f². A slope below 0 (ran faster than alone:
/// noise, or a load that went away) gives k = 1; c is at most 0.95 (k = 20).
pub fn fit_factor(ops: &[TimedOp], busy: &[(f64, f64)]) -> OverlapFit {
    let usable: Vec<(f64, f64)> = ops
        .iter()
        .filter(|o| o.alone_s > 0.0 && o.end_s > o.start_s && o.alone_s.is_finite() && o.end_s.is_finite())
        .map(|o| (covered_fraction(o.start_s, o.end_s, busy), 1.0 - o.alone_s / (o.end_s - o.start_s)))
        .collect();
    let ff: f64 = usable.iter().map(|(f, _)| f * f).sum();
    let mean_fraction =
        if usable.is_empty() { 0.0 } else { usable.iter().map(|(f, _)| f).sum::<f64>() / usable.len() as f64 };
    let factor = (ff >= 0.25).then(|| {
        let c = usable.iter().map(|(f, y)| f * y).sum::<f64>() / ff;
        1.0 / (1.0 - c.clamp(0.0, 1.0 - 1.0 / MAX_FACTOR))
    });
    OverlapFit { factor, ops: usable.len(), mean_fraction }
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
}
