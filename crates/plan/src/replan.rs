//! The re-planning rule, as a pure function of what the device knows: the prediction it
//! trains under, the step time it measures, and (after a re-probe) a fresh plan.
//!
//! - **Move** when some candidate of the fresh plan is predicted to save more over the
//!   remaining steps than moving to it costs (`gain > gain_factor · cost`); of those,
//!   the one with the largest net saving. Both sides of the comparison are predictions
//!   of the same fresh measurements, so a bias of the model cancels out.
//! - Otherwise **re-probe** when the measured step time has drifted from the
//!   prediction by more than `drift` (relative): the measurements are stale (the link
//!   changed, the server got busy).
//! - Otherwise **stay**.

use crate::cost::Candidate;
use crate::error::{Result, non_negative};
use crate::measure::LinkTimes;
use crate::planner::Plan;
use serde::{Deserialize, Serialize};

/// The constants of the rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplanPolicy {
    /// Relative drift of the measured step time from the predicted one that calls for a
    /// re-probe.
    pub drift: f64,
    /// A move must save more than this many times its cost.
    pub gain_factor: f64,
}

impl Default for ReplanPolicy {
    /// Re-probe beyond 25% drift (the planner aims at 15%); move when the saving beats
    /// the cost.
    fn default() -> ReplanPolicy {
        ReplanPolicy { drift: 0.25, gain_factor: 1.0 }
    }
}

/// What the device trains under now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Current {
    /// The candidate it runs.
    pub candidate: Candidate,
    /// The step time predicted for it (by the plan it was chosen by, or the last re-probe).
    pub predicted_s: f64,
    /// The step time it measures (e.g. the median of the last few steps).
    pub measured_s: f64,
    /// Steps left in the run.
    pub remaining_steps: u64,
}

/// The rule's answer, with what it is based on (for the log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "decision")]
pub enum Decision {
    /// Keep going.
    Stay,
    /// Measure again: the prediction no longer holds.
    Reprobe {
        /// Measured step seconds.
        measured_s: f64,
        /// Predicted step seconds.
        predicted_s: f64,
        /// (measured − predicted) / predicted.
        drift: f64,
    },
    /// Move to another server, cut or M.
    Move {
        /// Where to.
        to: Candidate,
        /// The current candidate's step, as the fresh plan predicts it (the measured one
        /// when the fresh plan has no prediction for it).
        current_s: f64,
        /// The new candidate's predicted step.
        candidate_s: f64,
        /// Predicted seconds saved over the remaining steps.
        gain_s: f64,
        /// Seconds the move costs.
        cost_s: f64,
    },
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decision::Stay => write!(f, "stay"),
            Decision::Reprobe { measured_s, predicted_s, drift } => write!(
                f,
                "re-probe: measured step {:.1} ms is {:+.0}% off the predicted {:.1} ms",
                measured_s * 1e3,
                drift * 100.0,
                predicted_s * 1e3
            ),
            Decision::Move { to, current_s, candidate_s, gain_s, cost_s } => write!(
                f,
                "move to server {} cut {} M={}: predicted step {:.1} ms instead of {:.1} ms saves {:.2} s over \
                 the remaining steps, moving costs {:.2} s",
                to.server,
                to.cut,
                to.micro_batches,
                candidate_s * 1e3,
                current_s * 1e3,
                gain_s,
                cost_s
            ),
        }
    }
}

/// The decision for `current`, given the fresh plan of a re-probe (if one was made) and
/// the cost of moving to each candidate (0 for the current one).
pub fn decide(
    policy: &ReplanPolicy,
    current: &Current,
    fresh: Option<&Plan>,
    move_cost_s: impl Fn(&Candidate) -> f64,
) -> Result<Decision> {
    non_negative(|| "the re-planning drift".into(), policy.drift)?;
    non_negative(|| "the re-planning gain factor".into(), policy.gain_factor)?;
    non_negative(|| "the measured step seconds".into(), current.measured_s)?;
    let predicted_s = crate::error::positive(|| "the predicted step seconds".into(), current.predicted_s)?;
    if let Some(plan) = fresh {
        let current_s =
            plan.candidates.iter().find(|p| p.candidate == current.candidate).map_or(current.measured_s, |p| p.step_s);
        let remaining = current.remaining_steps as f64;
        let mut best: Option<(f64, Decision)> = None;
        for p in plan.candidates.iter().filter(|p| p.candidate != current.candidate) {
            let gain_s = (current_s - p.step_s) * remaining;
            let cost_s =
                non_negative(|| format!("the cost of moving to {:?}", p.candidate), move_cost_s(&p.candidate))?;
            let net = gain_s - cost_s;
            if gain_s > 0.0 && gain_s > policy.gain_factor * cost_s && best.as_ref().is_none_or(|(b, _)| net > *b) {
                best =
                    Some((net, Decision::Move { to: p.candidate, current_s, candidate_s: p.step_s, gain_s, cost_s }));
            }
        }
        if let Some((_, decision)) = best {
            return Ok(decision);
        }
    }
    let drift = (current.measured_s - predicted_s) / predicted_s;
    if drift.abs() > policy.drift {
        return Ok(Decision::Reprobe { measured_s: current.measured_s, predicted_s, drift });
    }
    Ok(Decision::Stay)
}

/// Seconds to migrate `state_bytes` of edge state from one server to another through
/// the device (fetched over `from`'s downlink, put over `to`'s uplink, one round trip
/// each) plus `setup_s` (opening the session: building the edge side).
pub fn migration_s(state_bytes: u64, from: &LinkTimes, to: &LinkTimes, setup_s: f64) -> f64 {
    let b = state_bytes as f64;
    from.rtt_s + b / from.down_bytes_per_s + to.rtt_s + b / to.up_bytes_per_s + setup_s
}

/// Seconds to move the cut on one server: the state of the layers that change sides
/// (`moved_bytes`) crosses the link once, in the direction they move, plus `setup_s`.
pub fn recut_s(moved_bytes: u64, towards_edge: bool, link: &LinkTimes, setup_s: f64) -> f64 {
    let rate = if towards_edge { link.up_bytes_per_s } else { link.down_bytes_per_s };
    link.rtt_s + moved_bytes as f64 / rate + setup_s
}
