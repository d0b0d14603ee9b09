//! Training metrics as JSON Lines: one record per logged step, one per epoch, and one
//! per controller decision (`"event": "decision"`: freezing, unfreezing, reference
//! rebuilds, cache changes).

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
        /// Device–edge training: the step's stages as measured, beside the cost model's
        /// prediction for them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stages: Option<StepStages>,
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
        /// CPU seconds (user + system, all of the process's threads: loader, reference
        /// model) spent over those seconds: on a loaded machine, the cost that wall time
        /// hides. None where the platform does not tell.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_seconds: Option<f64>,
        /// Training throughput.
        samples_per_s: f64,
    },
}

/// CPU seconds (user + system) the process has used so far, all threads together.
#[cfg(unix)]
pub fn process_cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given and touches
    // nothing else; it is read only when the call reports success.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// CPU seconds the process has used so far (not known on this platform).
#[cfg(not(unix))]
pub fn process_cpu_seconds() -> Option<f64> {
    None
}

/// The stages of one device–edge training step, in seconds. The per-micro-batch stages
/// are means over the step's micro-batches; a link's or the edge's time is its service
/// time: from when the micro-batch could be served (it had arrived and the one before it
/// was done) to when it was done, so queueing behind another micro-batch is not counted
/// and the latency of a crossing is.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct StageTimes {
    /// The whole step.
    pub step_s: f64,
    /// Device forward of one micro-batch.
    pub device_forward_s: f64,
    /// Uplink: one micro-batch's activation, device → edge (occupancy and latency).
    pub uplink_s: f64,
    /// Edge: from a micro-batch's arrival to its reply (decoding, the edge step,
    /// encoding).
    pub edge_s: f64,
    /// Downlink: one micro-batch's reply, edge → device (occupancy and latency).
    pub downlink_s: f64,
    /// Device backward of one micro-batch (0 with a frozen device side).
    pub device_backward_s: f64,
    /// The device's update.
    pub device_update_s: f64,
    /// The edge's update as the device waits for it (a round trip and the update).
    pub edge_update_s: f64,
}

/// A step's stages: measured, and predicted when the run has a prediction.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepStages {
    /// What the step's timestamps say.
    pub measured: StageTimes,
    /// What the cost model predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<StageTimes>,
}

impl Record {
    /// The epoch the record belongs to.
    pub fn epoch(&self) -> usize {
        match self {
            Record::Step { epoch, .. } | Record::Epoch { epoch, .. } => *epoch,
        }
    }
}

/// What a controller decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionKind {
    /// A layer was frozen.
    Freeze,
    /// Layers were unfrozen.
    Unfreeze,
    /// The reference model was rebuilt.
    RebuildReference,
    /// Cached activations are used from now on.
    CacheOn,
    /// Cached activations are no longer used (or cannot be).
    CacheOff,
    /// A plasticity value was taken into a layer's history (`history` holds it).
    Plasticity,
    /// Device–edge training: the edge server was lost and the run continues on another
    /// (or the same, restarted) server from its last consistent step.
    Failover,
    /// Device–edge training: the edge side moved to another server between steps.
    Migrate,
}

/// A controller's decision, as logged.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    /// Epoch (1-based).
    pub epoch: usize,
    /// The update after which it was taken.
    pub step: u64,
    /// What.
    pub kind: DecisionKind,
    /// The layer concerned, if one.
    pub layer: Option<usize>,
    /// Frozen layers after the decision.
    pub depth: usize,
    /// The measurements it rests on (plasticity values, oldest first).
    pub history: Vec<f64>,
    /// Why, in words.
    pub reason: String,
}

const DECISION_EVENT: &str = "decision";

fn decision_line(d: &Decision) -> String {
    let mut v = serde_json::to_value(d).expect("decisions serialise");
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("event".into(), DECISION_EVENT.into());
    }
    v.to_string()
}

/// An append-only metrics file, flushed after every line so that a crash loses nothing.
pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    records: Vec<Record>,
    decisions: Vec<Decision>,
}

impl MetricsLog {
    /// Opens the log for a run that has completed `epochs_done` epochs: records of later
    /// epochs (left by an interrupted run) are dropped, atomically, before appending.
    pub fn open(path: &Path, epochs_done: usize) -> Result<MetricsLog> {
        let lines = read_lines(path)?;
        let before = lines.len();
        let lines: Vec<Line> = lines.into_iter().filter(|l| l.epoch() <= epochs_done).collect();
        if lines.len() != before || !path.exists() {
            let mut text = String::new();
            for l in &lines {
                text.push_str(&match l {
                    Line::Record(r) => serde_json::to_string(r).expect("records serialise"),
                    Line::Decision(d) => decision_line(d),
                });
                text.push('\n');
            }
            edgefreeze_graph::save::write_atomically(path, text.as_bytes())?;
        }
        let file = std::fs::OpenOptions::new().append(true).open(path).map_err(io("open", path))?;
        let (mut records, mut decisions) = (Vec::new(), Vec::new());
        for l in lines {
            match l {
                Line::Record(r) => records.push(r),
                Line::Decision(d) => decisions.push(d),
            }
        }
        Ok(MetricsLog { path: path.into(), file, records, decisions })
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

    /// Appends a decision.
    pub fn push_decision(&mut self, decision: Decision) -> Result<()> {
        let mut line = decision_line(&decision);
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io("write", &self.path))?;
        self.file.flush().map_err(io("write", &self.path))?;
        self.decisions.push(decision);
        Ok(())
    }

    /// Every record so far, this run's and the resumed run's.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Every decision so far.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }
}

/// One line of the file.
enum Line {
    Record(Record),
    Decision(Decision),
}

impl Line {
    fn epoch(&self) -> usize {
        match self {
            Line::Record(r) => r.epoch(),
            Line::Decision(d) => d.epoch,
        }
    }
}

fn read_lines(path: &Path) -> Result<Vec<Line>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", path)(e)),
    };
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |e: serde_json::Error| crate::TrainError::Checkpoint {
            path: path.into(),
            message: format!("line {}: {e}", i + 1),
        };
        let value: serde_json::Value = serde_json::from_str(line).map_err(bad)?;
        lines.push(if value.get("event").and_then(|e| e.as_str()) == Some(DECISION_EVENT) {
            Line::Decision(serde_json::from_value(value).map_err(bad)?)
        } else {
            Line::Record(serde_json::from_value(value).map_err(bad)?)
        });
    }
    Ok(lines)
}

/// Reads the decisions of a metrics file; a missing file has none.
pub fn read_decisions(path: &Path) -> Result<Vec<Decision>> {
    Ok(read_lines(path)?
        .into_iter()
        .filter_map(|l| match l {
            Line::Decision(d) => Some(d),
            Line::Record(_) => None,
        })
        .collect())
}

/// Reads the step and epoch records of a metrics file (decisions are skipped: see
/// [`read_decisions`]); a missing file is empty. A damaged line is an error naming it.
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    Ok(read_lines(path)?
        .into_iter()
        .filter_map(|l| match l {
            Line::Record(r) => Some(r),
            Line::Decision(_) => None,
        })
        .collect())
}
