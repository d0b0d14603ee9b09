//! Training metrics as JSON Lines: one record per logged step and one per epoch.

use crate::error::{Result, io};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Record {
    /// A training step (every `log_every` updates).
    Step {
        /// Epoch (1-based).
        epoch: usize,
        /// Updates done, this one included.
        step: u64,
        /// Mean loss of the batch.
        loss: f64,
        /// Accuracy on the batch.
        accuracy: f64,
        /// Learning rate used.
        lr: f64,
        /// Training throughput since the start of the epoch.
        samples_per_s: f64,
    },
    /// The end of an epoch, with its evaluation.
    Epoch {
        /// Epoch (1-based).
        epoch: usize,
        /// Updates done.
        step: u64,
        /// Mean training loss over the epoch.
        train_loss: f64,
        /// Training accuracy over the epoch.
        train_accuracy: f64,
        /// Mean loss on the test split.
        test_loss: f64,
        /// Accuracy on the test split.
        test_accuracy: f64,
        /// Seconds spent training (not evaluating) in the epoch.
        train_seconds: f64,
        /// Training throughput.
        samples_per_s: f64,
    },
}

impl Record {
    /// The epoch the record belongs to.
    pub fn epoch(&self) -> usize {
        match self {
            Record::Step { epoch, .. } | Record::Epoch { epoch, .. } => *epoch,
        }
    }
}

/// An append-only metrics file, flushed after every line so that a crash loses nothing.
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    records: Vec<Record>,
}

impl MetricsLog {
    /// Opens the log for a run that has completed `epochs_done` epochs: records of later
    /// epochs (left by an interrupted run) are dropped, atomically, before appending.
    pub fn open(path: &Path, epochs_done: usize) -> Result<MetricsLog> {
        let mut records = read_records(path)?;
        let before = records.len();
        records.retain(|r| r.epoch() <= epochs_done);
        if records.len() != before || !path.exists() {
            let mut text = String::new();
            for r in &records {
                text.push_str(&serde_json::to_string(r).expect("records serialise"));
                text.push('\n');
            }
            edgefreeze_graph::save::write_atomically(path, text.as_bytes())?;
        }
        let file = std::fs::OpenOptions::new().append(true).open(path).map_err(io("open", path))?;
        Ok(MetricsLog { path: path.into(), file, records })
    }

    /// Appends a record.
    pub fn push(&mut self, record: Record) -> Result<()> {
        let mut line = serde_json::to_string(&record).expect("records serialise");
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io("write", &self.path))?;
        self.file.flush().map_err(io("write", &self.path))?;
        self.records.push(record);
        Ok(())
    }

    /// Every record so far, this run's and the resumed run's.
    pub fn records(&self) -> &[Record] {
        &self.records
    }
}

/// Reads a metrics file; a missing file is empty. A damaged line is an error naming it.
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", path)(e)),
    };
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        records.push(serde_json::from_str(line).map_err(|e| crate::TrainError::Checkpoint {
            path: path.into(),
            message: format!("line {}: {e}", i + 1),
        })?);
    }
    Ok(records)
}
