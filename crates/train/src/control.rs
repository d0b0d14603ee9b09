//! Controllers: what may change a run's graphs between updates (Egeria's freezing
//! controller, a fixed freezing schedule, a device–edge planner). The loop calls one
//! after every update and applies its [`Outcome`]; it never branches on which
//! controller runs. A controller's state is saved with every checkpoint and restored on
//! resume, so a resumed run continues exactly.

use crate::error::Result;
use crate::metrics::Decision;
use crate::step::GraphSet;
use edgefreeze_engine::Value;
use std::path::Path;

/// Read access to the training state kept in the engine.
pub trait StateView {
    /// Copies a state tensor out of the engine.
    fn state(&self, name: &str) -> Result<Value>;
}

impl StateView for crate::step::StepRunner {
    fn state(&self, name: &str) -> Result<Value> {
        crate::step::StepRunner::state(self, name)
    }
}

/// What a controller saves with a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    /// Its state (stored in the checkpoint's metadata).
    pub json: serde_json::Value,
    /// Tensors it needs (stored in the checkpoint as `controller/<name>`).
    pub tensors: Vec<(String, Value)>,
}

/// Prefix of the checkpoint tensors a controller saved.
pub const SAVED_TENSOR_PREFIX: &str = "controller/";

/// What the controller sees when the trainer opens a run.
pub struct Opening<'a> {
    /// The run folder.
    pub run_dir: &'a Path,
    /// Updates done so far.
    pub step: u64,
    /// Epochs done so far.
    pub epoch: usize,
    /// What it saved with the checkpoint the run continues from (None: a fresh run, or
    /// a checkpoint written without this controller).
    pub saved: Option<Saved>,
    /// The training samples the run uses (indices into the training split).
    pub train_indices: &'a [usize],
    /// The run's seed.
    pub seed: u64,
    /// Loads training samples (indices into the training split) as one batch of the
    /// data input, unaugmented: for a controller that measures on fixed samples.
    pub samples: &'a dyn Fn(&[usize]) -> Result<Value>,
}

/// One update, as a controller sees it.
pub struct StepReport<'a> {
    /// Epoch (1-based).
    pub epoch: usize,
    /// Updates done, this one included.
    pub step: u64,
    /// The learning rate of this update.
    pub lr: f64,
    /// The learning rates of the previous update and of the one before it (None before
    /// the first updates), so a controller can tell a step decay from a smooth one.
    pub previous_lrs: [Option<f64>; 2],
    /// The batch loss.
    pub loss: f64,
    /// The batch's data input.
    pub input: &'a Value,
    /// The batch's sample indices.
    pub indices: &'a [usize],
    /// Outputs of the step beyond loss and accuracy (probes).
    pub outputs: &'a [(String, Value)],
}

/// What the loop does after a controller's turn.
#[derive(Default)]
pub struct Outcome {
    /// Switch to these graphs before the next update.
    pub switch: Option<GraphSet>,
    /// Decisions to log.
    pub decisions: Vec<Decision>,
}

/// A controller of a run.
pub trait Controller: Send {
    /// Called once when the trainer opens the run, after the state is restored.
    fn open(&mut self, opening: Opening<'_>, state: &dyn StateView) -> Result<Outcome>;
    /// Whether update `step` (from 1) must run the observing graph.
    fn observes(&self, step: u64) -> bool;
    /// Called after every update.
    fn after_step(&mut self, report: &StepReport<'_>, state: &dyn StateView) -> Result<Outcome>;
    /// The state to save with a checkpoint (waits for work in flight, so the state is complete).
    fn save(&mut self) -> Result<Option<Saved>>;
    /// A short status for the progress line ("frozen 3/11").
    fn status(&self) -> Option<String>;
    /// A summary for the end of training (overheads, cache sizes).
    fn summary(&self) -> Option<String>;
}

/// The controller of a run that never changes its graphs.
#[derive(Debug, Default)]
pub struct Fixed;

impl Controller for Fixed {
    fn open(&mut self, _: Opening<'_>, _: &dyn StateView) -> Result<Outcome> {
        Ok(Outcome::default())
    }
    fn observes(&self, _: u64) -> bool {
        false
    }
    fn after_step(&mut self, _: &StepReport<'_>, _: &dyn StateView) -> Result<Outcome> {
        Ok(Outcome::default())
    }
    fn save(&mut self) -> Result<Option<Saved>> {
        Ok(None)
    }
    fn status(&self) -> Option<String> {
        None
    }
    fn summary(&self) -> Option<String> {
        None
    }
}
