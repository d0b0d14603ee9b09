//! `edgefreeze device train`: a run folder, data, the device's graphs and a session on
//! an edge server, trained epoch by epoch with the micro-batch pipeline.
//!
//! The run folder is a training run of `edgefreeze-train` (`run.json`, `graphs/`,
//! `checkpoints/`, `metrics.jsonl`) plus `device.json` (the split and the run's name on
//! the edge) and `schedule.json` (the timestamps of the first steps). The device's
//! checkpoints hold its side only (its parameters, optimizer state and statistics); the
//! edge checkpoints its side of the session when the device asks, at the last update of
//! every epoch, before the device writes its own. `--resume` opens the session at the
//! step of the device's last checkpoint, and the edge must stand at that same step.
//!
//! Evaluation after an epoch runs the whole model's eval graph on the device, with the
//! edge's parameters fetched for it (FetchState): test samples never leave the device
//! either.

use crate::compute::{DeviceGraphs, GraphDevice};
use crate::error::{DeviceError, Result};
use crate::link::{EdgeSession, GrpcLink};
use crate::local::LocalEdge;
use crate::pipeline::{Download, Link, Tag, Upload};
use crate::pipeline::{Mode, StepSettings, StepTimes, run_step, split_batch};
use crate::split::{SplitSettings, device_graphs, split_graphs, split_request};
use edgefreeze_data::named::Splits;
use edgefreeze_data::{Loader, LoaderOptions, Samples, batch_count, epoch_order};
use edgefreeze_engine::{StateUpdates, Value};
use edgefreeze_train::checkpoint::{Checkpoint, CheckpointInfo, FORMAT, checkpoint_path, list_checkpoints};
use edgefreeze_train::metrics::{Decision, DecisionKind, MetricsLog, Record, StageTimes, StepStages};
use edgefreeze_train::run::{GRAPHS_DIR, METRICS_FILE, read_manifest};
use edgefreeze_train::{
    ModelSource, Recipe, RunSpec, TrainOptions, TrainSummary, batch_values, check_fit, create_run, dropout_seed,
    evaluate, model_label, open_data, open_run, progress_bar, subset,
};
use edgefreeze_wire::auth::Credentials;
use edgefreeze_wire::pb;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device settings file of a run folder.
pub const DEVICE_FILE: &str = "device.json";
/// Format identifier of [`DEVICE_FILE`].
pub const DEVICE_FORMAT: &str = "edgefreeze-device-run/1";
/// The timestamps of the first steps.
pub const SCHEDULE_FILE: &str = "schedule.json";

/// What `device.json` holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceRun {
    /// [`DEVICE_FORMAT`].
    pub format: String,
    /// The run's name on the edge (its checkpoints are kept under it).
    pub run_id: String,
    /// The split.
    pub split: SplitSettings,
}

/// Where the edge is and who the device is.
#[derive(Clone)]
pub struct EdgeAddress {
    /// `HOST:PORT` or `http://HOST:PORT`.
    pub address: String,
    /// The device id and token.
    pub credentials: Credentials,
}

/// How to run (not what to compute).
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Engine, threads, plot, progress bar, prefetch depth, npm data folder.
    pub train: TrainOptions,
    /// Steps whose schedule is recorded and drawn.
    pub schedule_steps: usize,
    /// Micro-batches in flight at most in pipelined mode (default: all of a step's).
    pub max_in_flight: Option<usize>,
    /// Train at most this many epochs in this call (the run's recipe still says how many
    /// it has); None trains them all.
    pub epochs_now: Option<usize>,
    /// A server that does not answer a call or a micro-batch in this long is lost.
    pub edge_timeout: Duration,
    /// Fail-over: how long to keep trying the servers (the lost one too: it may come back
    /// at its address) before the run stops.
    pub failover_wait: Duration,
    /// Updates between consistent copies of both sides (the device's state and the edge's,
    /// fetched), from which a fail-over continues; 0: only at the start of each epoch.
    pub sync_every: u64,
    /// When no edge server takes a lost run over within `failover_wait`, train the edge
    /// side on the device itself instead of stopping.
    pub alone_if_no_edge: bool,
    /// Called after every update with the number of updates done (an observer: progress
    /// displays, tests that act at a given step).
    pub after_update: Option<AfterUpdate>,
    /// The cost model's prediction of the run's stages, logged beside the measured ones
    /// in every step record when there is no adapter to ask (`device train --plan`).
    pub prediction: Option<StageTimes>,
}

/// A callback run after every update with the number of updates done.
#[derive(Clone)]
pub struct AfterUpdate(pub Arc<dyn Fn(u64) + Send + Sync>);

impl std::fmt::Debug for AfterUpdate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AfterUpdate(..)")
    }
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            train: TrainOptions::default(),
            schedule_steps: 3,
            max_in_flight: None,
            epochs_now: None,
            edge_timeout: Duration::from_secs(30),
            failover_wait: Duration::from_secs(30),
            sync_every: 20,
            alone_if_no_edge: false,
            after_update: None,
            prediction: None,
        }
    }
}

/// Where the edge side of a run lives, recorded in every device checkpoint (a run that
/// failed over or migrated resumes on the server that holds its edge checkpoint).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EdgePlace {
    /// The server's address.
    pub address: String,
    /// The run's name there.
    pub run_id: String,
    /// The cut of the split there, when it moved from the one `device.json` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<usize>,
    /// Micro-batches per step there, when they changed from those `device.json` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batches: Option<usize>,
}

impl EdgePlace {
    const KEY: &'static str = "edge";

    fn to_controller(&self) -> serde_json::Value {
        serde_json::json!({ Self::KEY: self })
    }

    fn from_controller(value: Option<&serde_json::Value>) -> Option<EdgePlace> {
        serde_json::from_value(value?.get(Self::KEY)?.clone()).ok()
    }
}

/// A change of where and how the run trains, made between two updates.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The edge server, by its place in the run's list.
    pub server: usize,
    /// The cut.
    pub cut: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Why, for the log.
    pub reason: String,
}

/// What an adapter sees after each update.
#[derive(Debug, Clone, Copy)]
pub struct StepSeen<'a> {
    /// Updates done.
    pub step: u64,
    /// Updates in the whole run.
    pub total_steps: u64,
    /// Seconds the update took on the device's clock (the whole pipelined step).
    pub seconds: f64,
    /// Its timestamps.
    pub times: &'a StepTimes,
    /// The server it ran on, by its place in the run's list (`None`: on the device).
    pub server: Option<usize>,
    /// The cut.
    pub cut: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
}

/// Decides from what training measures whether the run should move (EdgeMove's
/// adaptation: re-probe when the step drifts from its prediction, move when a better
/// server, cut or micro-batch count saves more than moving costs).
pub trait Adapter: Send {
    /// Called after every update; a move is made before the next one.
    fn after_step(&mut self, seen: &StepSeen) -> Option<Move>;
    /// The step time it predicts for the run as it trains now, if it has a prediction.
    fn predicted_s(&self) -> Option<f64> {
        None
    }
    /// The stages it predicts for the run as it trains now, if it has a prediction.
    fn predicted_stages(&self) -> Option<StageTimes> {
        None
    }
    /// What it measured and decided since last asked, for the log (lines of text).
    fn notes(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// Where the edge side runs.
enum EdgeConn {
    /// On an edge server.
    Remote(Box<EdgeSession>),
    /// On the device itself, once no server is left (`--alone-if-no-edge`); `None` while
    /// an epoch holds it as its link.
    Local(Option<Box<LocalEdge>>),
}

/// The link an epoch trains over.
enum EpochLink {
    Remote(Box<GrpcLink>),
    Local(Box<LocalEdge>),
}

impl Link for EpochLink {
    fn send(&mut self, upload: Upload) -> Result<()> {
        match self {
            EpochLink::Remote(l) => l.send(upload),
            EpochLink::Local(l) => l.send(upload),
        }
    }
    fn recv(&mut self) -> Result<Download> {
        match self {
            EpochLink::Remote(l) => l.recv(),
            EpochLink::Local(l) => l.recv(),
        }
    }
    fn request_update(&mut self, tag: &Tag, lr: f64, checkpoint: bool) -> Result<()> {
        match self {
            EpochLink::Remote(l) => l.request_update(tag, lr, checkpoint),
            EpochLink::Local(l) => l.request_update(tag, lr, checkpoint),
        }
    }
    fn update_answer(&mut self) -> Result<Tag> {
        match self {
            EpochLink::Remote(l) => l.update_answer(),
            EpochLink::Local(l) => l.update_answer(),
        }
    }
}

/// What one update reported.
struct BatchResult {
    loss: f64,
    correct: f64,
    samples: usize,
}

/// The place of a run's edge side when it runs on the device itself.
pub const ALONE: &str = "device";

/// The header of a run whose edge side runs on the device (the local edge echoes it).
fn alone_header(step: u64) -> pb::Header {
    pb::Header { session_id: ALONE.into(), step, micro_batch: 0, model_version: 1 }
}

/// Both sides' state at one step: what a fail-over continues from.
struct Consistent {
    step: u64,
    device: Vec<(String, Value)>,
    edge: Vec<(String, Value)>,
}

/// A run name the edge accepts: the folder's name, cleaned, and a time stamp.
fn run_id_for(dir: &Path) -> String {
    let name: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' { c } else { '_' })
        // Short enough that fail-over suffixes stay within the edge's 64 characters.
        .take(32)
        .collect();
    format!("{}-{:x}", if name.is_empty() { "run" } else { &name }, crate::pipeline::now_us())
}

/// Creates a device run folder: refuses one that already holds a run, converts the model
/// (the eval graph and the initial state come from there) and writes `device.json`.
pub fn create_device_run(
    dir: &Path,
    model: &Path,
    loss: &str,
    optimizer: &str,
    data: &str,
    recipe: &Recipe,
    split: SplitSettings,
) -> Result<DeviceRun> {
    if split.micro_batches == 0 {
        return Err(DeviceError::Config("--micro-batches must be at least 1".into()));
    }
    let source = ModelSource::Onnx { path: model.into(), loss: loss.into(), optimizer: optimizer.into(), freeze: 0 };
    create_run(dir, &source, data, recipe)?;
    let run = DeviceRun { format: DEVICE_FORMAT.into(), run_id: run_id_for(dir), split };
    write_json(&dir.join(DEVICE_FILE), &run)?;
    Ok(run)
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).expect("run files serialise");
    edgefreeze_graph::save::write_atomically(path, &bytes)
        .map_err(|e| DeviceError::Run { path: path.into(), message: e.to_string() })
}

fn read_device_run(dir: &Path) -> Result<DeviceRun> {
    let path = dir.join(DEVICE_FILE);
    let bad = |message: String| DeviceError::Run { path: path.clone(), message };
    let text =
        std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read: {e} (not a device run folder?)")))?;
    let run: DeviceRun = serde_json::from_str(&text).map_err(|e| bad(format!("not a device run: {e}")))?;
    if run.format != DEVICE_FORMAT {
        return Err(bad(format!("format {:?}, expected {DEVICE_FORMAT:?}", run.format)));
    }
    Ok(run)
}

/// A device run, its data, its graphs and its session on the edge.
pub struct DeviceTrainer {
    dir: PathBuf,
    spec: RunSpec,
    run: DeviceRun,
    options: DeviceOptions,
    data: Splits,
    input: String,
    device: GraphDevice,
    session: EdgeConn,
    header: pb::Header,
    /// The servers this run may use, in order of preference.
    edges: Vec<EdgeAddress>,
    /// Where the edge side lives now.
    place: EdgePlace,
    /// What OpenSession sends (kept for fail-over and migration).
    split_request: pb::SplitRequest,
    /// Sessions opened so far by fail-over or migration (names the run on a new server).
    moves: u32,
    /// The last consistent copy of both sides.
    consistent: Option<Consistent>,
    /// Decisions taken between steps, for the metrics log.
    pending: Vec<Decision>,
    /// Asked after every update whether to move.
    adapter: Option<Box<dyn Adapter>>,
    /// Every update's measured (and predicted) time, for the step-time chart.
    step_times: Vec<crate::timeline::StepTime>,
    epochs_done: usize,
    steps_done: u64,
    last_checkpoint: PathBuf,
    last_test_accuracy: Option<f64>,
    takes_dropout_seed: bool,
    /// The run's loss: which labels weigh in each micro-batch.
    loss: edgefreeze_autodiff::Loss,
    schedule: Vec<StepTimes>,
    warned_no_edge_checkpoint: bool,
}

impl DeviceTrainer {
    /// Opens a device run: builds the device's graphs, restores its last checkpoint (a
    /// new run writes the initial state as checkpoint 0) and opens the session on the
    /// edge, new or resumed at the checkpoint's step.
    ///
    /// `edges` are the servers the run may use, in order of preference: a new run opens on
    /// the first that answers; a resumed run on the server its last checkpoint names (the
    /// edge holds its side's checkpoint there). The others are fail-over targets.
    pub fn open(dir: &Path, edges: &[EdgeAddress], options: DeviceOptions) -> Result<DeviceTrainer> {
        let Some(first_edge) = edges.first() else {
            return Err(DeviceError::Config("give at least one edge server".into()));
        };
        let spec = open_run(dir)?;
        let mut run = read_device_run(dir)?;
        let checkpoints = list_checkpoints(dir)?;
        let last = checkpoints.last().map(|(_, path)| Checkpoint::read(path)).transpose()?;
        // A run whose cut moved resumes at the cut its last checkpoint was taken at.
        if let Some(place) = last.as_ref().and_then(|c| EdgePlace::from_controller(c.info.controller.as_ref())) {
            run.split.cut = place.cut.unwrap_or(run.split.cut);
            run.split.micro_batches = place.micro_batches.unwrap_or(run.split.micro_batches);
        }
        let graphs_dir = dir.join(GRAPHS_DIR);
        let manifest = read_manifest(&graphs_dir)?;
        let input = match manifest.data_inputs.as_slice() {
            [one] => one.name.clone(),
            many => {
                return Err(DeviceError::Config(format!(
                    "the model has {} data inputs; edgefreeze device train feeds exactly one",
                    many.len()
                )));
            }
        };
        let forward = graphs_dir.join(edgefreeze_autodiff::artifacts::files::FORWARD);
        let data = open_data(
            &spec.data,
            || edgefreeze_graph::load_model(&forward).map_err(edgefreeze_train::TrainError::from),
            &manifest,
            &options.train,
        )?;
        check_fit(&data, &manifest)?;
        check_micro_batches(&spec.recipe, data.train.len(), run.split.micro_batches)?;
        let model_path = graphs_dir.join(edgefreeze_autodiff::artifacts::files::FORWARD);
        let model_bytes = std::fs::read(&model_path)
            .map_err(|e| DeviceError::Run { path: model_path.clone(), message: format!("cannot read: {e}") })?;
        let DeviceGraphs { forward, backward, apply, state: initial } =
            device_graphs(&model_path, &run.split, &manifest.loss, &manifest.optimizer)?;
        let takes_dropout_seed = forward.graph.inputs.iter().any(|i| i.name == crate::compute::DROPOUT_SEED);
        let loss = edgefreeze_autodiff::artifacts::parse_loss(&manifest.loss)
            .map_err(|e| DeviceError::Config(format!("the run's loss {:?}: {e}", manifest.loss)))?;

        let mut recorded_place = None;
        let mut checkpoint_state = Vec::new();
        let (state, epochs_done, steps_done, last_checkpoint, last_test_accuracy) = match checkpoints.last() {
            Some((_, path)) => {
                let c = last.expect("read above");
                let mut state = Vec::new();
                for (name, _) in &initial {
                    let value = c.get(name).cloned().ok_or_else(|| DeviceError::Run {
                        path: path.clone(),
                        message: format!("has no device state tensor {name:?}"),
                    })?;
                    state.push((name.clone(), value));
                }
                recorded_place = EdgePlace::from_controller(c.info.controller.as_ref());
                checkpoint_state = c.state.clone();
                (state, c.info.epoch, c.info.step, path.clone(), c.info.test_accuracy)
            }
            // Checkpoint 0 is written once the edge has opened the session: a start that
            // fails (edge unreachable, token refused) leaves an unstarted run.
            None => (initial, 0, 0, checkpoint_path(dir, 0), None),
        };
        if epochs_done > spec.recipe.epochs {
            return Err(DeviceError::Run {
                path: last_checkpoint,
                message: format!("is after epoch {epochs_done}, but the run has {} epochs", spec.recipe.epochs),
            });
        }
        let device = GraphDevice::new(
            DeviceGraphs { forward, backward, apply, state },
            &input,
            &options.train.engine,
            &options.train.engine_options,
        )?;
        let split_request = split_request(model_bytes, &run.split, &manifest.loss, &manifest.optimizer)?;
        let resume_step = (epochs_done > 0).then_some(steps_done);
        // Where to open: a resumed run where its edge checkpoint is (a run from before
        // places were recorded: the first server, under the run's own name); a new run on
        // the first server that answers.
        let everywhere = |run_id: &str| -> Vec<EdgePlace> {
            edges
                .iter()
                .map(|e| EdgePlace {
                    address: e.address.clone(),
                    run_id: run_id.to_string(),
                    cut: None,
                    micro_batches: None,
                })
                .collect()
        };
        let candidates: Vec<EdgePlace> = match (resume_step, recorded_place) {
            // The device itself, when the run went on alone.
            (Some(_), Some(place)) if place.address == ALONE => vec![place],
            // The server the checkpoint names, when it is one of those given.
            (Some(_), Some(place)) if edges.iter().any(|e| e.address == place.address) => vec![place],
            // Otherwise the run's edge checkpoints moved with their server: ask those given.
            (Some(_), Some(place)) => everywhere(&place.run_id),
            (Some(_), None) => everywhere(&run.run_id),
            // No epoch done: both sides start from the initial state again, under a new
            // name on the edge if an earlier start already used the run's own.
            (None, _) if checkpoints.is_empty() => everywhere(&run.run_id),
            (None, _) => everywhere(&format!("{}.r{:x}", run.run_id, crate::pipeline::now_us() / 1_000_000)),
        };
        // A run that went on alone on the device keeps its edge side in its checkpoints.
        let alone = candidates.first().filter(|p| resume_step.is_some() && p.address == ALONE).cloned();
        let mut opened = None;
        let (mut lost, mut refused) = (Vec::new(), Vec::new());
        for place in candidates.into_iter().filter(|_| alone.is_none()) {
            let credentials =
                edges.iter().find(|e| e.address == place.address).unwrap_or(first_edge).credentials.clone();
            let request = pb::OpenSessionRequest {
                // The protocol wants a header on every message; an empty one asks for a
                // new session id.
                header: Some(pb::Header::default()),
                run_id: place.run_id.clone(),
                split: Some(split_request.clone()),
                resume_step,
            };
            match EdgeSession::open(&place.address, credentials, request, options.edge_timeout) {
                Ok(session) => {
                    opened = Some((session, place));
                    break;
                }
                Err(e @ DeviceError::EdgeLost { .. }) => lost.push(e.to_string()),
                // A server that refuses to resume (it holds no checkpoint of the run at
                // this step) may not be the one that does.
                Err(DeviceError::Link(m)) if resume_step.is_some() => refused.push(format!("{}: {m}", place.address)),
                Err(e) => return Err(e),
            }
        }
        let (session, header, place) = match (opened, alone) {
            (_, Some(place)) => {
                let graphs = split_graphs(&model_path, &run.split, &manifest.loss, &manifest.optimizer)?;
                let local = LocalEdge::new(
                    &graphs,
                    &checkpoint_state,
                    &options.train.engine,
                    &options.train.engine_options,
                    &loss,
                )?;
                let header = alone_header(steps_done);
                (EdgeConn::Local(Some(Box::new(local))), header, place)
            }
            (Some((session, place)), None) => {
                let header = session.header();
                (EdgeConn::Remote(Box::new(session)), header, place)
            }
            (None, None) => {
                if !refused.is_empty() {
                    refused.extend(lost);
                    return Err(DeviceError::Link(format!(
                        "cannot resume run {:?} at step {steps_done}, the step of {}: an edge server must hold its \
                     checkpoint of that step ({})",
                        run.run_id,
                        last_checkpoint.display(),
                        refused.join("; ")
                    )));
                }
                return Err(DeviceError::EdgeLost { address: "every edge server".into(), message: lost.join("; ") });
            }
        };
        if header.step != steps_done {
            return Err(DeviceError::Mismatch {
                field: "step",
                expected: format!("{steps_done} (the device's checkpoint {})", last_checkpoint.display()),
                got: format!("{} (where the edge's checkpoint of run {:?} stands)", header.step, place.run_id),
            });
        }
        if checkpoints.is_empty() {
            let info = CheckpointInfo {
                format: FORMAT.into(),
                epoch: 0,
                step: 0,
                test_accuracy: None,
                controller: Some(place.to_controller()),
            };
            Checkpoint { info, state: device.state()? }.write(&last_checkpoint)?;
        }
        Ok(DeviceTrainer {
            dir: dir.into(),
            spec,
            run,
            options,
            data,
            input,
            device,
            session,
            header,
            edges: edges.to_vec(),
            place,
            split_request,
            moves: 0,
            consistent: None,
            pending: Vec::new(),
            adapter: None,
            step_times: Vec::new(),
            epochs_done,
            steps_done,
            last_checkpoint,
            last_test_accuracy,
            takes_dropout_seed,
            loss,
            schedule: Vec::new(),
            warned_no_edge_checkpoint: false,
        })
    }

    /// The run's recipe and names.
    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// The split settings and the run's name on the edge.
    pub fn device_run(&self) -> &DeviceRun {
        &self.run
    }

    /// The dataset.
    pub fn data(&self) -> &Splits {
        &self.data
    }

    /// Epochs completed.
    pub fn epochs_done(&self) -> usize {
        self.epochs_done
    }

    /// Updates completed.
    pub fn steps_done(&self) -> u64 {
        self.steps_done
    }

    /// The edge's answer when the session opened (ports, state bytes, limits); none once
    /// the run fell back to training alone on the device.
    pub fn session(&self) -> Option<&pb::OpenSessionResponse> {
        match &self.session {
            EdgeConn::Remote(s) => Some(&s.opened),
            EdgeConn::Local(_) => None,
        }
    }

    /// Whether the edge side runs on the device itself (no edge server was left).
    pub fn alone(&self) -> bool {
        matches!(self.session, EdgeConn::Local(_))
    }

    /// The device's state, copied out of the engine.
    pub fn device_state(&self) -> Result<Vec<(String, Value)>> {
        self.device.state()
    }

    /// The edge's state of this session, fetched from the edge.
    pub fn edge_state(&self) -> Result<Vec<(String, Value)>> {
        self.edge_state_with(None)
    }

    /// The edge's state: from the local edge side (in `lent` while an epoch holds it), or
    /// fetched from the server.
    fn edge_state_with(&self, lent: Option<&EpochLink>) -> Result<Vec<(String, Value)>> {
        match (&self.session, lent) {
            (_, Some(EpochLink::Local(local))) | (EdgeConn::Local(Some(local)), _) => local.state(),
            (EdgeConn::Remote(session), _) => session.fetch_state(&Self::between_steps(&self.header, self.steps_done)),
            (EdgeConn::Local(None), _) => Err(DeviceError::Config("the local edge side is in use".into())),
        }
    }

    /// The timestamps of the first steps recorded.
    pub fn schedule(&self) -> &[StepTimes] {
        &self.schedule
    }

    fn between_steps(header: &pb::Header, step: u64) -> pb::Header {
        pb::Header { step, micro_batch: 0, ..header.clone() }
    }

    fn train_samples(&self) -> usize {
        self.spec.recipe.train_limit.map_or(self.data.train.len(), |l| l.min(self.data.train.len()))
    }

    /// Updates in the whole run.
    pub fn total_steps(&self) -> u64 {
        (self.spec.recipe.epochs * batch_count(self.train_samples(), self.spec.recipe.batch)) as u64
    }

    fn mode(&self) -> Mode {
        if self.run.split.sequential {
            Mode::Sequential
        } else {
            Mode::Pipelined { max_in_flight: self.options.max_in_flight.unwrap_or(self.run.split.micro_batches) }
        }
    }

    /// Trains the remaining epochs (or `epochs_now` of them).
    pub fn run(&mut self) -> Result<TrainSummary> {
        let mut metrics = MetricsLog::open(&self.dir.join(METRICS_FILE), self.epochs_done)?;
        let mut samples_per_s = None;
        let last = self
            .options
            .epochs_now
            .map_or(self.spec.recipe.epochs, |n| (self.epochs_done + n).min(self.spec.recipe.epochs));
        while self.epochs_done < last {
            let epoch = self.epochs_done + 1;
            let cpu_before = edgefreeze_train::metrics::process_cpu_seconds();
            let (train_loss, train_accuracy, seconds, samples) = self.train_epoch(epoch, &mut metrics)?;
            // The device process's CPU time (its network threads too), not the edge's.
            let cpu_seconds =
                edgefreeze_train::metrics::process_cpu_seconds().zip(cpu_before).map(|(after, before)| after - before);
            let (test_loss, test_accuracy) = self.evaluate()?;
            let rate = samples as f64 / seconds.max(1e-9);
            samples_per_s = Some(rate);
            let path = checkpoint_path(&self.dir, epoch);
            let info = CheckpointInfo {
                format: FORMAT.into(),
                epoch,
                step: self.steps_done,
                test_accuracy: Some(test_accuracy),
                controller: Some(self.place.to_controller()),
            };
            let mut state = self.device.state()?;
            if self.alone() {
                state.extend(self.edge_state()?);
            }
            Checkpoint { info, state }.write(&path)?;
            self.epochs_done = epoch;
            self.last_checkpoint = path;
            self.last_test_accuracy = Some(test_accuracy);
            metrics.push(Record::Epoch {
                epoch,
                step: self.steps_done,
                train_loss,
                train_accuracy,
                test_loss,
                test_accuracy,
                train_seconds: seconds,
                samples_per_s: rate,
                cpu_seconds,
            })?;
            if self.options.train.progress {
                eprintln!(
                    "epoch {epoch}/{}: train loss {train_loss:.4} acc {:.2}% | test loss {test_loss:.4} acc {:.2}% | \
                     {rate:.0} samples/s | {}",
                    self.spec.recipe.epochs,
                    100.0 * train_accuracy,
                    100.0 * test_accuracy,
                    self.last_checkpoint.display()
                );
            }
            self.plot(metrics.records(), metrics.decisions());
        }
        Ok(TrainSummary {
            epochs: self.epochs_done,
            steps: self.steps_done,
            checkpoint: self.last_checkpoint.clone(),
            test_accuracy: self.last_test_accuracy,
            samples_per_s,
        })
    }

    fn plot(&self, records: &[Record], decisions: &[Decision]) {
        let Some(plot) = &self.options.train.plot else { return };
        let split = &self.run.split;
        let title = format!(
            "{} on {}, split after layer {} ({}, {} micro-batches)",
            model_label(&self.spec.model),
            self.spec.data,
            split.cut,
            if split.sequential { "sequential" } else { "pipelined" },
            split.micro_batches
        );
        // A plot that cannot be drawn (no font, say) must not stop training.
        if let Err(e) = edgefreeze_train::plot::plot_training(records, &title, plot) {
            eprintln!("warning: {e}");
        }
        if !self.schedule.is_empty()
            && let Err(e) = crate::timeline::draw_schedule(&self.schedule, &title, &schedule_plot_path(plot))
        {
            eprintln!("warning: {e}");
        }
        let marked: Vec<(u64, String)> = decisions
            .iter()
            .filter(|d| matches!(d.kind, DecisionKind::Failover | DecisionKind::Migrate))
            .map(|d| {
                let what = if d.kind == DecisionKind::Failover { "fail-over" } else { "move" };
                (d.step, format!("{what} (cut {})", d.layer.unwrap_or(split.cut)))
            })
            .collect();
        if !self.step_times.is_empty()
            && let Err(e) = crate::timeline::draw_step_times(&self.step_times, &marked, &title, &steps_plot_path(plot))
        {
            eprintln!("warning: {e}");
        }
    }

    /// One epoch of updates → (mean loss, accuracy, seconds, samples). A lost edge server
    /// is failed over from the last consistent copy of both sides: the updates since then
    /// are done again, with the same batches, learning rates and seeds, so none is lost
    /// and none applied twice.
    fn train_epoch(&mut self, epoch: usize, metrics: &mut MetricsLog) -> Result<(f64, f64, f64, usize)> {
        for decision in std::mem::take(&mut self.pending) {
            metrics.push_decision(decision)?;
        }
        let first_step = self.steps_done;
        if self.consistent.as_ref().is_none_or(|c| c.step != first_step) {
            self.sync()?;
        }
        let batches = batch_count(self.train_samples(), self.spec.recipe.batch);
        let bar = progress_bar(
            self.options.train.progress,
            batches as u64,
            &format!("epoch {epoch}/{}", self.spec.recipe.epochs),
        );
        let start = Instant::now();
        let mut done: Vec<BatchResult> = Vec::new();
        loop {
            match self.epoch_from(epoch, first_step, batches, &mut done, metrics, &bar, start) {
                Ok(None) => break,
                Ok(Some(to)) => {
                    self.make_move(&to)?;
                    for decision in std::mem::take(&mut self.pending) {
                        metrics.push_decision(decision)?;
                    }
                }
                Err(DeviceError::EdgeLost { address, message }) => {
                    let redo_from = self.fail_over(epoch, &address, &message, metrics)?;
                    done.truncate((redo_from - first_step) as usize);
                    bar.set_position(done.len() as u64);
                }
                Err(e) => {
                    bar.abandon();
                    return Err(e);
                }
            }
        }
        bar.finish_and_clear();
        let seconds = start.elapsed().as_secs_f64();
        let seen: usize = done.iter().map(|b| b.samples).sum();
        let loss: f64 = done.iter().map(|b| b.loss * b.samples as f64).sum();
        let correct: f64 = done.iter().map(|b| b.correct).sum();
        Ok((loss / seen.max(1) as f64, correct / seen.max(1) as f64, seconds, seen))
    }

    /// The epoch's updates from `self.steps_done` on, then a consistent copy of both sides
    /// at its end.
    #[allow(clippy::too_many_arguments)]
    fn epoch_from(
        &mut self,
        epoch: usize,
        first_step: u64,
        batches: usize,
        done: &mut Vec<BatchResult>,
        metrics: &mut MetricsLog,
        bar: &indicatif::ProgressBar,
        start: Instant,
    ) -> Result<Option<Move>> {
        let mut link = match &mut self.session {
            EdgeConn::Remote(session) => EpochLink::Remote(Box::new(session.stream())),
            EdgeConn::Local(local) => EpochLink::Local(
                local.take().ok_or_else(|| DeviceError::Config("the local edge side is in use".into()))?,
            ),
        };
        let result = self.epoch_steps(&mut link, epoch, first_step, batches, done, metrics, bar, start);
        if let EpochLink::Local(local) = link {
            self.session = EdgeConn::Local(Some(local));
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn epoch_steps(
        &mut self,
        link: &mut EpochLink,
        epoch: usize,
        first_step: u64,
        batches: usize,
        done: &mut Vec<BatchResult>,
        metrics: &mut MetricsLog,
        bar: &indicatif::ProgressBar,
        start: Instant,
    ) -> Result<Option<Move>> {
        let recipe = self.spec.recipe.clone();
        let samples = subset(self.data.train.len(), recipe.train_limit, recipe.seed);
        let augmentation = recipe.augmentation()?;
        let images = matches!(*self.data.train, Samples::Images { .. });
        let start_batch = (self.steps_done - first_step) as usize;
        let loader = Loader::spawn(
            Arc::clone(&self.data.train),
            epoch_order(samples.len(), recipe.seed, epoch as u64).into_iter().map(|i| samples[i]).collect(),
            LoaderOptions {
                batch_size: recipe.batch,
                augmentation: (images && !augmentation.is_identity()).then_some(augmentation),
                seed: recipe.seed,
                epoch: epoch as u64,
                depth: self.options.train.prefetch.max(1),
                start_batch,
            },
        )
        .map_err(edgefreeze_train::TrainError::from)?;
        let total = self.total_steps();
        let mode = self.mode();
        let needs_seed = match &self.session {
            EdgeConn::Remote(session) => session.opened.needs_dropout_seed,
            EdgeConn::Local(_) => false,
        } || matches!(link, EpochLink::Local(l) if l.takes_dropout_seed());
        for (k, batch) in loader.enumerate() {
            let index = start_batch + k;
            let lr = recipe.schedule.rate(self.steps_done, total, epoch - 1);
            let (input, labels) = batch_values(batch)?;
            let mut micro_batches = split_batch(&input, &labels, self.run.split.micro_batches)?;
            if self.takes_dropout_seed || needs_seed {
                let m = micro_batches.len() as u64;
                for (i, mb) in micro_batches.iter_mut().enumerate() {
                    mb.dropout_seed = Some(dropout_seed(recipe.seed, self.steps_done * m + i as u64));
                }
            }
            let settings = StepSettings {
                session: self.header.session_id.clone(),
                step: self.steps_done,
                version: self.header.model_version,
                lr,
                mode,
                frozen_device: self.run.split.freeze_device,
                checkpoint: index + 1 == batches,
                loss: self.loss.clone(),
            };
            let step_started = Instant::now();
            let report = run_step(&mut self.device, link, &micro_batches, &settings)?;
            let step_seconds = step_started.elapsed().as_secs_f64();
            if !report.loss.is_finite() {
                return Err(DeviceError::Diverged { step: self.steps_done + 1, epoch, loss: report.loss });
            }
            self.steps_done += 1;
            if self.schedule.len() < self.options.schedule_steps {
                self.schedule.push(report.times.clone());
                write_json(&self.dir.join(SCHEDULE_FILE), &self.schedule)?;
            }
            done.push(BatchResult { loss: report.loss, correct: report.correct, samples: report.samples });
            let seen: usize = done.iter().map(|b| b.samples).sum();
            let rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
            if self.steps_done.is_multiple_of(recipe.log_every.max(1)) {
                let predicted = self.adapter.as_ref().and_then(|a| a.predicted_stages()).or(self.options.prediction);
                let measured = crate::stages::measured(&report.times, step_seconds);
                metrics.push(Record::Step {
                    epoch,
                    step: self.steps_done,
                    loss: report.loss,
                    accuracy: report.correct / report.samples as f64,
                    lr,
                    samples_per_s: rate,
                    stages: Some(StepStages { measured, predicted }),
                })?;
            }
            bar.inc(1);
            let loss: f64 = done.iter().map(|b| b.loss * b.samples as f64).sum();
            let correct: f64 = done.iter().map(|b| b.correct).sum();
            bar.set_message(format!(
                "loss {:.4} acc {:.2}% {rate:.0} samples/s lr {lr:.4}",
                loss / seen as f64,
                100.0 * correct / seen as f64
            ));
            if let Some(hook) = &self.options.after_update {
                (hook.0)(self.steps_done);
            }
            let server = self.server_index();
            // A fail-over did the updates after its consistent copy again: keep the last.
            while self.step_times.last().is_some_and(|t| t.step >= self.steps_done) {
                self.step_times.pop();
            }
            self.step_times.push(crate::timeline::StepTime {
                step: self.steps_done,
                measured_s: step_seconds,
                predicted_s: self.adapter.as_ref().and_then(|a| a.predicted_s()),
            });
            if let Some(adapter) = &mut self.adapter {
                let seen = StepSeen {
                    step: self.steps_done,
                    total_steps: total,
                    seconds: step_seconds,
                    times: &report.times,
                    server,
                    cut: self.run.split.cut,
                    micro_batches: self.run.split.micro_batches,
                };
                let wanted = adapter.after_step(&seen);
                for note in adapter.notes() {
                    bar.println(note);
                }
                // A move waits for the next epoch when this was its last update (the
                // epoch's end syncs both sides and checkpoints first).
                if let Some(to) = wanted.filter(|_| index + 1 < batches) {
                    return Ok(Some(to));
                }
            }
            let every = self.options.sync_every;
            if every > 0 && self.steps_done.is_multiple_of(every) && index + 1 < batches {
                self.sync_with(Some(link))?;
            }
        }
        if matches!(link, EpochLink::Remote(l) if l.edge_checkpoint_missed()) && !self.warned_no_edge_checkpoint {
            self.warned_no_edge_checkpoint = true;
            let line = "warning: the edge server keeps no checkpoints (it was started without --state-dir): this run \
                        trains on, but --resume cannot continue it there";
            bar.println(line);
        }
        self.sync_with(Some(link))?;
        Ok(None)
    }

    /// Takes a consistent copy of both sides at the current step (between steps): the
    /// device's state, and the edge's, fetched.
    fn sync(&mut self) -> Result<()> {
        self.sync_with(None)
    }

    fn sync_with(&mut self, lent: Option<&EpochLink>) -> Result<()> {
        let edge = self.edge_state_with(lent)?;
        self.consistent = Some(Consistent { step: self.steps_done, device: self.device.state()?, edge });
        Ok(())
    }

    /// Opens a session for this run on `edge` under a new name and moves the edge side
    /// there at `step` with `state` → (session, header, place).
    fn open_elsewhere(
        &mut self,
        edge: &EdgeAddress,
        split: &pb::SplitRequest,
        step: u64,
        state: &[(String, Value)],
    ) -> Result<(EdgeSession, pb::Header, EdgePlace)> {
        self.moves += 1;
        let place = EdgePlace {
            address: edge.address.clone(),
            run_id: format!("{}.{}", self.run.run_id, self.moves),
            cut: Some(split.cut_after_layer as usize),
            micro_batches: Some(split.micro_batches as usize),
        };
        let request = pb::OpenSessionRequest {
            header: Some(pb::Header::default()),
            run_id: place.run_id.clone(),
            split: Some(split.clone()),
            resume_step: None,
        };
        let session = EdgeSession::open(&edge.address, edge.credentials.clone(), request, self.options.edge_timeout)?;
        let opened = session.header();
        let header = session.put_state(&Self::between_steps(&opened, step), state)?;
        if header.step != step {
            return Err(DeviceError::Mismatch {
                field: "step",
                expected: step.to_string(),
                got: format!("{} (after moving the edge state to {})", header.step, edge.address),
            });
        }
        Ok((session, header, place))
    }

    /// Continues the run on another server (or the lost one, back at its address) from
    /// the last consistent copy of both sides → the step training continues from.
    fn fail_over(&mut self, epoch: usize, address: &str, message: &str, metrics: &mut MetricsLog) -> Result<u64> {
        let Some(consistent) = self.consistent.take() else {
            return Err(DeviceError::EdgeLost { address: address.into(), message: message.into() });
        };
        let lost_step = self.steps_done;
        // The others first: a server that vanished is usually gone; the lost one last, in
        // case it is restarting at the same address.
        let mut order: Vec<EdgeAddress> = self.edges.iter().filter(|e| e.address != address).cloned().collect();
        order.extend(self.edges.iter().filter(|e| e.address == address).cloned());
        let deadline = Instant::now() + self.options.failover_wait;
        let mut refusals = Vec::new();
        let moved = 'search: loop {
            for edge in &order {
                let split = self.split_request.clone();
                match self.open_elsewhere(edge, &split, consistent.step, &consistent.edge) {
                    Ok(moved) => break 'search moved,
                    Err(e @ DeviceError::EdgeLost { .. }) => refusals.push(e.to_string()),
                    Err(e) => {
                        self.consistent = Some(consistent);
                        return Err(e);
                    }
                }
            }
            if Instant::now() >= deadline && self.options.alone_if_no_edge {
                return self.go_alone(epoch, address, message, consistent, lost_step, metrics);
            }
            if Instant::now() >= deadline {
                refusals.dedup();
                return Err(DeviceError::EdgeLost {
                    address: address.into(),
                    message: format!(
                        "{message}; no edge server took the run over in {:.0} s ({}); the device's last checkpoint \
                         is {}",
                        self.options.failover_wait.as_secs_f64(),
                        refusals.join("; "),
                        self.last_checkpoint.display()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        let (session, header, place) = moved;
        let reason = format!(
            "the edge at {address} was lost at update {lost_step} ({message}); continuing on {} as run {:?} from \
             update {}, the last consistent copy of both sides ({} updates done again)",
            place.address,
            place.run_id,
            consistent.step,
            lost_step - consistent.step
        );
        self.continue_from(consistent, EdgeConn::Remote(Box::new(session)), header, place, epoch, reason, metrics)
    }

    /// Both sides back at `consistent`, the edge side now at `place` over `session`, and
    /// the fail-over logged → the step training continues from.
    #[allow(clippy::too_many_arguments)]
    fn continue_from(
        &mut self,
        consistent: Consistent,
        session: EdgeConn,
        header: pb::Header,
        place: EdgePlace,
        epoch: usize,
        reason: String,
        metrics: &mut MetricsLog,
    ) -> Result<u64> {
        self.device.restore(&consistent.device)?;
        self.steps_done = consistent.step;
        if self.options.train.progress {
            eprintln!("{reason}");
        }
        metrics.push_decision(self.split_decision(
            epoch,
            consistent.step,
            DecisionKind::Failover,
            self.run.split.cut,
            reason,
        ))?;
        self.session = session;
        self.header = header;
        self.place = place;
        self.consistent = Some(consistent);
        Ok(self.steps_done)
    }

    /// No server is left: the edge side goes on on the device from the last consistent
    /// copy → the step training continues from.
    fn go_alone(
        &mut self,
        epoch: usize,
        address: &str,
        message: &str,
        consistent: Consistent,
        lost_step: u64,
        metrics: &mut MetricsLog,
    ) -> Result<u64> {
        let graphs_dir = self.dir.join(GRAPHS_DIR);
        let manifest = read_manifest(&graphs_dir)?;
        let model = graphs_dir.join(edgefreeze_autodiff::artifacts::files::FORWARD);
        let graphs = split_graphs(&model, &self.run.split, &manifest.loss, &manifest.optimizer)?;
        let engine = &self.options.train;
        let local = LocalEdge::new(&graphs, &consistent.edge, &engine.engine, &engine.engine_options, &self.loss)?;
        let reason = format!(
            "the edge at {address} was lost at update {lost_step} ({message}) and no edge server took the run over \
             in {:.0} s: training alone on the device from update {}, the last consistent copy of both sides ({} \
             updates done again)",
            self.options.failover_wait.as_secs_f64(),
            consistent.step,
            lost_step - consistent.step
        );
        let header = alone_header(consistent.step);
        let place = EdgePlace {
            address: ALONE.into(),
            run_id: self.run.run_id.clone(),
            cut: Some(self.run.split.cut),
            micro_batches: Some(self.run.split.micro_batches),
        };
        self.continue_from(consistent, EdgeConn::Local(Some(Box::new(local))), header, place, epoch, reason, metrics)
    }

    /// A fail-over or move, as logged: the cut it leaves the run at (and the frozen
    /// device layers, when the device side is frozen).
    fn split_decision(&self, epoch: usize, step: u64, kind: DecisionKind, cut: usize, reason: String) -> Decision {
        let depth = if self.run.split.freeze_device { cut + 1 } else { 0 };
        Decision { epoch, step, kind, layer: Some(cut), depth, history: Vec::new(), reason }
    }

    /// Makes an adapter's move: another server, cut or micro-batch count.
    fn make_move(&mut self, to: &Move) -> Result<()> {
        let recipe = &self.spec.recipe;
        check_micro_batches(recipe, self.train_samples(), to.micro_batches)?;
        let cut = (to.cut != self.run.split.cut).then_some(to.cut);
        let m = (to.micro_batches != self.run.split.micro_batches).then_some(to.micro_batches);
        self.move_edge_with(to.server, cut, m, &to.reason)
    }

    /// Moves the edge side to `edges[to]` between steps (the old server is alive: its
    /// state is fetched, put on the new one, and its session closed), logging `reason`.
    pub fn migrate(&mut self, to: usize, reason: &str) -> Result<()> {
        self.move_edge(to, None, reason)
    }

    /// Moves the cut to after layer `cut` between steps, with the edge side on `edges[to]`:
    /// both sides get the graphs of the new split, and the state of the layers that change
    /// sides goes with them (the device's to the edge, or the edge's, fetched, to the
    /// device). Training goes on from the same step with the same batches.
    pub fn recut(&mut self, cut: usize, to: usize, reason: &str) -> Result<()> {
        self.move_edge(to, Some(cut), reason)
    }

    fn move_edge(&mut self, to: usize, cut: Option<usize>, reason: &str) -> Result<()> {
        self.move_edge_with(to, cut, None, reason)
    }

    fn move_edge_with(&mut self, to: usize, cut: Option<usize>, m: Option<usize>, reason: &str) -> Result<()> {
        let edge = self
            .edges
            .get(to)
            .cloned()
            .ok_or_else(|| DeviceError::Config(format!("no edge server {to}: the run has {}", self.edges.len())))?;
        self.sync()?;
        let consistent = self.consistent.take().expect("sync made a consistent copy");
        let step = consistent.step;
        let old_cut = self.run.split.cut;
        let new_cut = cut.unwrap_or(old_cut);
        // The whole model's state, by name: each side takes its own from it.
        let whole: Vec<(String, Value)> = consistent.device.iter().chain(&consistent.edge).cloned().collect();
        let mut split = self.split_request.clone();
        if let Some(m) = m {
            split.micro_batches = u32::try_from(m).map_err(|_| DeviceError::Config("too many micro-batches".into()))?;
        }
        let mut device = None;
        let edge_state = if new_cut == old_cut {
            consistent.edge.clone()
        } else {
            split.cut_after_layer = u32::try_from(new_cut).map_err(|_| DeviceError::Config("cut too large".into()))?;
            let settings = SplitSettings {
                cut: new_cut,
                micro_batches: m.unwrap_or(self.run.split.micro_batches),
                ..self.run.split.clone()
            };
            let graphs = self.device_graphs_at(&settings, &whole)?;
            let on_device: Vec<String> = graphs.state.iter().map(|(n, _)| n.clone()).collect();
            device = Some((settings, graphs));
            whole.iter().filter(|(n, _)| !on_device.contains(n)).cloned().collect()
        };
        let moved = self.open_elsewhere(&edge, &split, step, &edge_state);
        self.consistent = Some(consistent);
        let (session, header, place) = moved?;
        if let Some(m) = m {
            self.run.split.micro_batches = m;
            self.split_request.micro_batches = split.micro_batches;
        }
        if let Some((settings, graphs)) = device {
            self.device =
                GraphDevice::new(graphs, &self.input, &self.options.train.engine, &self.options.train.engine_options)?;
            self.run.split = settings;
            self.split_request = split;
            // The copy was of the old split; the next sync takes one of the new.
            self.consistent = None;
        }
        let old = std::mem::replace(&mut self.session, EdgeConn::Remote(Box::new(session)));
        // The old server keeps nothing of the run's future; its checkpoints stay.
        if let EdgeConn::Remote(old) = old {
            let _ = old.close(&Self::between_steps(&self.header, step));
        }
        let what = if new_cut == old_cut {
            format!("migrated the edge side from {} to {}", self.place.address, place.address)
        } else {
            format!(
                "moved the cut from after layer {old_cut} to after layer {new_cut}, the edge side from {} to {}",
                self.place.address, place.address
            )
        };
        let line = format!("{what} at update {step}: {reason}");
        self.header = header;
        self.place = place;
        self.pending.push(self.split_decision(
            self.epochs_done + 1,
            step,
            DecisionKind::Migrate,
            new_cut,
            line.clone(),
        ));
        if self.options.train.progress {
            eprintln!("{line}");
        }
        Ok(())
    }

    /// The device's graphs for `settings`, with the state taken from `whole` by name.
    fn device_graphs_at(&self, settings: &SplitSettings, whole: &[(String, Value)]) -> Result<DeviceGraphs> {
        let graphs_dir = self.dir.join(GRAPHS_DIR);
        let manifest = read_manifest(&graphs_dir)?;
        let model = graphs_dir.join(edgefreeze_autodiff::artifacts::files::FORWARD);
        let mut graphs = device_graphs(&model, settings, &manifest.loss, &manifest.optimizer)?;
        for (name, value) in &mut graphs.state {
            *value = whole.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).ok_or_else(|| {
                DeviceError::Config(format!("the run's state has no tensor {name:?} for the new cut"))
            })?;
        }
        Ok(graphs)
    }

    /// Samples in the epoch's smallest batch (a step is split into at most that many
    /// micro-batches).
    pub fn smallest_batch(&self) -> usize {
        let (n, batch) = (self.train_samples(), self.spec.recipe.batch);
        match n % batch {
            0 => batch.min(n),
            r => r,
        }
    }

    /// Asks `adapter` after every update whether the run should move.
    pub fn set_adapter(&mut self, adapter: Box<dyn Adapter>) {
        self.adapter = Some(adapter);
    }

    /// Sets the prediction of the run's stages logged beside the measured ones when no
    /// adapter gives one.
    pub fn set_prediction(&mut self, prediction: StageTimes) {
        self.options.prediction = Some(prediction);
    }

    /// The current server's place in the run's list (`None` when training alone).
    pub fn server_index(&self) -> Option<usize> {
        self.edges.iter().position(|e| e.address == self.place.address)
    }

    /// Where the edge side lives now.
    pub fn edge_place(&self) -> &EdgePlace {
        &self.place
    }

    /// Mean loss and accuracy on the test split with the whole model: the device's state
    /// and the edge's, fetched, in an eval workspace.
    pub fn evaluate(&mut self) -> Result<(f64, f64)> {
        let graphs = self.dir.join(GRAPHS_DIR);
        let eval_path = graphs.join(edgefreeze_autodiff::artifacts::files::EVAL);
        let eval = std::fs::read(&eval_path)
            .map_err(|e| DeviceError::Run { path: eval_path.clone(), message: format!("cannot read: {e}") })?;
        let mut workspace =
            edgefreeze_engine::workspace(&self.options.train.engine, &self.options.train.engine_options)?;
        let graph = workspace.load_graph(&eval, StateUpdates::none())?;
        // The copy taken at the epoch's end: the edge's state at the device's step.
        let edge = match &self.consistent {
            Some(c) if c.step == self.steps_done => c.edge.clone(),
            _ => self.edge_state()?,
        };
        for (name, value) in self.device.state()?.into_iter().chain(edge) {
            workspace.set_state(&name, value)?;
        }
        let recipe = &self.spec.recipe;
        let indices = subset(self.data.test.len(), recipe.test_limit, recipe.seed);
        Ok(evaluate(
            workspace.as_mut(),
            graph,
            &self.input,
            &self.data.test,
            indices,
            recipe.batch,
            self.options.train.prefetch,
        )?)
    }

    /// Frees the session on the edge (its checkpoints stay, for a later resume).
    pub fn close(self) -> Result<()> {
        match &self.session {
            EdgeConn::Remote(session) => session.close(&Self::between_steps(&self.header, self.steps_done)),
            EdgeConn::Local(_) => Ok(()),
        }
    }
}

/// The edge needs every step split into exactly M micro-batches, so every batch of an
/// epoch, the last (partial) one included, must hold at least M samples.
fn check_micro_batches(recipe: &Recipe, train_len: usize, m: usize) -> Result<()> {
    let n = recipe.train_limit.map_or(train_len, |l| l.min(train_len));
    let last = match n % recipe.batch {
        0 => recipe.batch.min(n),
        r => r,
    };
    if last < m {
        return Err(DeviceError::Config(format!(
            "{m} micro-batches per step need at least {m} samples in every batch, but {n} training samples in \
             batches of {} make a batch of {last} (change --micro-batches, --batch or --limit)",
            recipe.batch
        )));
    }
    Ok(())
}

/// Where `--plot FILE.png` puts the step-time chart: `FILE-steps.png`.
pub fn steps_plot_path(plot: &Path) -> PathBuf {
    let stem = plot.file_stem().map_or("plot".into(), |s| s.to_string_lossy().into_owned());
    plot.with_file_name(format!("{stem}-steps.png"))
}

/// Where `--plot FILE.png` puts the schedule chart: `FILE-schedule.png`.
pub fn schedule_plot_path(plot: &Path) -> PathBuf {
    let stem = plot.file_stem().map_or("plot".into(), |s| s.to_string_lossy().into_owned());
    plot.with_file_name(format!("{stem}-schedule.png"))
}
