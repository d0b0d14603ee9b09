//! Observers: what watches a run without changing it — the progress bar, metrics.jsonl,
//! the plot and the checkpoints. The loop tells every observer the same events in the
//! same order; the device trainer reuses them.

use crate::checkpoint::{Checkpoint, CheckpointInfo, FORMAT};
use crate::control::{SAVED_TENSOR_PREFIX, Saved};
use crate::error::Result;
use crate::metrics::{Decision, DecisionKind, MetricsLog, Record};
use edgefreeze_engine::Value;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};

/// One update, as observers see it.
pub struct StepEvent<'a> {
    /// The step record (loss, accuracy, learning rate, throughput).
    pub record: &'a Record,
    /// Whether this update is one the metrics keep (every `log_every`).
    pub logged: bool,
    /// Mean loss of the epoch so far.
    pub mean_loss: f64,
    /// Accuracy of the epoch so far.
    pub mean_accuracy: f64,
    /// The controller's status, if it has one.
    pub status: Option<&'a str>,
}

/// The end of an epoch, as observers see it.
pub struct EpochEvent<'a> {
    /// The epoch record (with the evaluation).
    pub record: &'a Record,
    /// Epochs in the run.
    pub epochs: usize,
    /// The whole training state, in manifest order.
    pub state: &'a [(String, Value)],
    /// What the controller saved.
    pub saved: Option<&'a Saved>,
    /// Where the checkpoint of this epoch goes.
    pub checkpoint: &'a Path,
}

/// Watches a run.
pub trait Observer {
    /// An epoch of `batches` updates starts.
    fn on_epoch_start(&mut self, epoch: usize, epochs: usize, batches: u64) -> Result<()>;
    /// An update is done.
    fn on_step(&mut self, event: &StepEvent<'_>) -> Result<()>;
    /// An epoch is done and evaluated.
    fn on_epoch(&mut self, event: &EpochEvent<'_>) -> Result<()>;
    /// A controller decided something.
    fn on_event(&mut self, decision: &Decision) -> Result<()>;
}

/// Writes the checkpoint of every epoch, atomically, with the controller's state.
pub struct Checkpoints;

impl Observer for Checkpoints {
    fn on_epoch_start(&mut self, _: usize, _: usize, _: u64) -> Result<()> {
        Ok(())
    }
    fn on_step(&mut self, _: &StepEvent<'_>) -> Result<()> {
        Ok(())
    }
    fn on_epoch(&mut self, e: &EpochEvent<'_>) -> Result<()> {
        let Record::Epoch { epoch, step, test_accuracy, .. } = e.record else {
            return Err(crate::TrainError::Config("internal: an epoch event without an epoch record".into()));
        };
        let info = CheckpointInfo {
            format: FORMAT.into(),
            epoch: *epoch,
            step: *step,
            test_accuracy: Some(*test_accuracy),
            controller: e.saved.map(|s| s.json.clone()),
        };
        let mut state = e.state.to_vec();
        if let Some(saved) = e.saved {
            state.extend(saved.tensors.iter().map(|(n, v)| (format!("{SAVED_TENSOR_PREFIX}{n}"), v.clone())));
        }
        Checkpoint { info, state }.write(e.checkpoint)
    }
    fn on_event(&mut self, _: &Decision) -> Result<()> {
        Ok(())
    }
}

/// Appends to metrics.jsonl.
pub struct Metrics(pub MetricsLog);

impl Observer for Metrics {
    fn on_epoch_start(&mut self, _: usize, _: usize, _: u64) -> Result<()> {
        Ok(())
    }
    fn on_step(&mut self, e: &StepEvent<'_>) -> Result<()> {
        if e.logged { self.0.push(e.record.clone()) } else { Ok(()) }
    }
    fn on_epoch(&mut self, e: &EpochEvent<'_>) -> Result<()> {
        self.0.push(e.record.clone())
    }
    fn on_event(&mut self, d: &Decision) -> Result<()> {
        self.0.push_decision(d.clone())
    }
}

/// A progress bar per epoch, a line per epoch and per decision, on stderr.
#[derive(Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Observer for Progress {
    fn on_epoch_start(&mut self, epoch: usize, epochs: usize, batches: u64) -> Result<()> {
        self.bar = Some(crate::trainer::progress_bar(true, batches, &format!("epoch {epoch}/{epochs}")));
        Ok(())
    }
    fn on_step(&mut self, e: &StepEvent<'_>) -> Result<()> {
        let (Some(bar), Record::Step { lr, samples_per_s, .. }) = (&self.bar, e.record) else { return Ok(()) };
        bar.inc(1);
        let status = e.status.map(|s| format!(" | {s}")).unwrap_or_default();
        bar.set_message(format!(
            "loss {:.4} acc {:.2}% {samples_per_s:.0} samples/s lr {lr:.4}{status}",
            e.mean_loss,
            100.0 * e.mean_accuracy
        ));
        Ok(())
    }
    fn on_epoch(&mut self, e: &EpochEvent<'_>) -> Result<()> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if let Record::Epoch { epoch, train_loss, train_accuracy, test_loss, test_accuracy, samples_per_s, .. } =
            e.record
        {
            eprintln!(
                "epoch {epoch}/{}: train loss {train_loss:.4} acc {:.2}% | test loss {test_loss:.4} acc {:.2}% | \
                 {samples_per_s:.0} samples/s | {}",
                e.epochs,
                100.0 * train_accuracy,
                100.0 * test_accuracy,
                e.checkpoint.display()
            );
        }
        Ok(())
    }
    fn on_event(&mut self, d: &Decision) -> Result<()> {
        let what = match d.kind {
            // Measurements are for metrics.jsonl; a line each would bury the decisions.
            DecisionKind::Plasticity => return Ok(()),
            DecisionKind::Freeze => format!("froze layer {}", d.layer.map_or("?".into(), |l| l.to_string())),
            DecisionKind::Unfreeze => format!("unfroze to depth {}", d.depth),
            DecisionKind::RebuildReference => "rebuilt the reference model".into(),
            DecisionKind::CacheOn => "caching activations".into(),
            DecisionKind::CacheOff => "not caching activations".into(),
            DecisionKind::Failover => "edge server lost, failed over".into(),
            DecisionKind::Migrate => "edge side migrated".into(),
        };
        let line = format!("update {}: {what} (frozen layers: {}): {}", d.step, d.depth, d.reason);
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
        Ok(())
    }
}

/// Redraws the curves, with the freezing timeline, after every epoch.
pub struct Plot {
    path: PathBuf,
    title: String,
    records: Vec<Record>,
    decisions: Vec<Decision>,
}

impl Plot {
    /// A plot to `path` that starts from what the metrics already hold (a resumed run).
    pub fn new(path: PathBuf, title: String, records: &[Record], decisions: &[Decision]) -> Plot {
        Plot { path, title, records: records.to_vec(), decisions: decisions.to_vec() }
    }
}

impl Observer for Plot {
    fn on_epoch_start(&mut self, _: usize, _: usize, _: u64) -> Result<()> {
        Ok(())
    }
    fn on_step(&mut self, e: &StepEvent<'_>) -> Result<()> {
        if e.logged {
            self.records.push(e.record.clone());
        }
        Ok(())
    }
    fn on_epoch(&mut self, e: &EpochEvent<'_>) -> Result<()> {
        self.records.push(e.record.clone());
        // A plot that cannot be drawn (no font, say) must not stop training.
        if let Err(err) =
            crate::plot::plot_training_with_decisions(&self.records, &self.decisions, &self.title, &self.path)
        {
            eprintln!("warning: {err}");
        }
        Ok(())
    }
    fn on_event(&mut self, d: &Decision) -> Result<()> {
        self.decisions.push(d.clone());
        Ok(())
    }
}
