//! The planner: every (server, cut, M) the measurements cover, predicted, and the one
//! with the shortest predicted step.

use crate::cost::{Candidate, CostModel, Mode, Prediction, Workload};
use crate::error::{PlanError, Result};
use crate::measure::Measurements;
use serde::{Deserialize, Serialize};

/// What the planner may choose from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Space {
    /// Micro-batch counts to consider (each at most the batch).
    pub micro_batches: Vec<usize>,
    /// How many micro-batches may be in flight (`None`: all of a step's).
    pub max_in_flight: Option<usize>,
}

impl Default for Space {
    /// M ∈ {1, 2, 4, 8, 16}, every micro-batch in flight.
    fn default() -> Space {
        Space { micro_batches: vec![1, 2, 4, 8, 16], max_in_flight: None }
    }
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Every candidate's prediction, by server, then cut, then M.
    pub candidates: Vec<Prediction>,
    /// Index of the choice in `candidates`.
    pub choice: usize,
}

impl Plan {
    /// The chosen candidate's prediction.
    pub fn chosen(&self) -> &Prediction {
        &self.candidates[self.choice]
    }

    /// The shortest predicted step among the candidates `keep` accepts.
    pub fn best_where(&self, keep: impl Fn(&Prediction) -> bool) -> Option<&Prediction> {
        self.candidates.iter().filter(|p| keep(p)).fold(None, |best, p| match best {
            Some(b) if b.step_s <= p.step_s => Some(b),
            _ => Some(p),
        })
    }
}

/// Predicts every pipelined (server, cut, M) of `space` that `measurements` cover (a
/// server not probed at a cut has no candidate there) and chooses the shortest step.
/// Ties go to the earlier candidate: the earlier server, cut and smaller M.
pub fn plan(model: &CostModel, measurements: &Measurements, workload: &Workload, space: &Space) -> Result<Plan> {
    model.validate()?;
    measurements.validate()?;
    if let Some(&m) = space.micro_batches.iter().find(|&&m| m == 0 || m > workload.batch) {
        return Err(PlanError::Inconsistent(format!(
            "{m} micro-batches: a batch of {} samples takes 1 to {} of them",
            workload.batch, workload.batch
        )));
    }
    let mut micro_batches = space.micro_batches.clone();
    micro_batches.sort_unstable();
    micro_batches.dedup();
    let mut candidates = Vec::new();
    for (server, s) in measurements.servers.iter().enumerate() {
        for cut in measurements.cuts.iter().map(|c| c.cut).filter(|&c| s.at(c).is_some()) {
            for &m in &micro_batches {
                let candidate = Candidate { server, cut, micro_batches: m, mode: Mode::Pipelined(space.max_in_flight) };
                candidates.push(model.predict(measurements, workload, &candidate)?);
            }
        }
    }
    let choice = candidates
        .iter()
        .enumerate()
        .fold(None::<(usize, f64)>, |best, (i, p)| match best {
            Some((_, t)) if t <= p.step_s => best,
            _ => Some((i, p.step_s)),
        })
        .map(|(i, _)| i)
        .ok_or_else(|| {
            PlanError::NoCandidate(format!(
                "{} servers, {} cuts and micro-batch counts {:?} leave no (server, cut, M) measured",
                measurements.servers.len(),
                measurements.cuts.len(),
                space.micro_batches
            ))
        })?;
    Ok(Plan { candidates, choice })
}
