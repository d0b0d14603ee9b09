//! Egeria in the trainer: a [`edgefreeze_train::Controller`] that freezes the front of
//! the network while it trains — automatically from plasticity ([`FreezePlan::Auto`]),
//! or on a fixed schedule ([`FreezePlan::Schedule`], the FreezeOut-style baseline) —
//! switches to the frozen-prefix graphs of the `rewrite` crate in place, and, once the
//! frozen prefix ends at a cut, to the cached prefix/suffix pair.
//!
//! Determinism, for exact resume: a plasticity value measured after update `s` is
//! applied after update `s + max(E − 1, 1)`, whatever the time it arrives; the runner has
//! E − 1 updates to answer and the training thread waits for it only if it is later
//! than that (the wait is measured and reported). Everything that decides the numbers —
//! the depth, the histories, values in flight, the parameters and calibration batch the
//! reference model was built from — is saved with each checkpoint.

use crate::cache::{ActivationCache, CacheIdentity, CacheKey, Reopened};
use crate::controller::{Action, Controller as Logic, ControllerState, Knobs};
use crate::error::{FreezeError, Result};
use crate::hash::{Fnv64, fnv64};
use crate::reference::with_parameters;
use crate::runner::{ReferenceRunner, Reply, Request};
use edgefreeze_autodiff::artifacts::{files, parse_loss, parse_optimizer};
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_graph::analysis::{Analysis, analyse};
use edgefreeze_graph::ir::Model;
use edgefreeze_graph::save::encode_model;
use edgefreeze_rewrite::{StepSpec, activation_name, frozen_prefix_step, prefix_graph, suffix_step};
use edgefreeze_train::control::{Opening, Saved, StateView, StepReport};
use edgefreeze_train::metrics::{Decision, DecisionKind};
use edgefreeze_train::step::{ActivationStore, GraphSet, StepGraphs};
use edgefreeze_train::{Outcome, TrainError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The settings file a run with freezing keeps in its folder.
pub const FREEZE_FILE: &str = "freeze.json";

/// How layers get frozen.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum FreezePlan {
    /// Egeria: from plasticity against an int8 reference model.
    Auto {
        /// The controller's settings.
        knobs: Knobs,
        /// Samples of the batch the reference model sees at each measurement.
        probe_batch: usize,
        /// Threads of the reference model's engine.
        reference_threads: usize,
    },
    /// A fixed schedule: after update `step`, `depth` layers are frozen.
    Schedule {
        /// (update, depth) pairs in increasing update order.
        points: Vec<(u64, usize)>,
    },
}

/// Where and how much to cache.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheSettings {
    /// Cache frozen-prefix outputs at all.
    pub enabled: bool,
    /// Bytes of activations held in memory before records spill to disk.
    pub memory_budget: u64,
    /// The cache folder (None: `<run>/cache`).
    pub dir: Option<PathBuf>,
    /// Bytes the cache file may grow to (None: no limit); past it, caching stops with
    /// a logged decision and the run goes on.
    #[serde(default)]
    pub disk_budget: Option<u64>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        CacheSettings { enabled: true, memory_budget: 512 << 20, dir: None, disk_budget: None }
    }
}

/// Everything `freeze.json` holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FreezeSettings {
    /// How layers get frozen.
    pub plan: FreezePlan,
    /// The activation cache.
    pub cache: CacheSettings,
}

impl FreezeSettings {
    /// Writes `freeze.json` into a run folder.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("settings serialise");
        edgefreeze_graph::save::write_atomically(&run_dir.join(FREEZE_FILE), &bytes)?;
        Ok(())
    }

    /// Reads `freeze.json` of a run folder; None when the run does not freeze.
    pub fn read(run_dir: &Path) -> Result<Option<FreezeSettings>> {
        let path = run_dir.join(FREEZE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| FreezeError::Config(format!("{}: not a freezing settings file: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(crate::error::cache_io("read", path)(e)),
        }
    }
}

/// Parses `schedule:<update>=<layers>,...` (the part after `schedule:`), checking each
/// depth against the model's `layers`.
pub fn parse_schedule(text: &str, layers: usize) -> Result<Vec<(u64, usize)>> {
    let mut points: Vec<(u64, usize)> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || FreezeError::Config(format!("schedule point {part:?}: expected <update>=<layers>, e.g. 200=3"));
        let (step, depth) = part.split_once('=').ok_or_else(bad)?;
        let (step, depth): (u64, usize) =
            (step.trim().parse().map_err(|_| bad())?, depth.trim().parse().map_err(|_| bad())?);
        if depth >= layers {
            return Err(FreezeError::Config(format!(
                "schedule point {part:?}: cannot freeze {depth} layers of a model with {layers} (at most {})",
                layers - 1
            )));
        }
        if points.last().is_some_and(|&(s, _)| s >= step) {
            return Err(FreezeError::Config(format!("schedule point {part:?}: updates must increase")));
        }
        points.push((step, depth));
    }
    if points.is_empty() {
        return Err(FreezeError::Config("an empty freezing schedule: give schedule:<update>=<layers>,...".into()));
    }
    Ok(points)
}

/// A probe whose values are applied after update `apply_at`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "PendingForm")]
struct Pending {
    step: u64,
    /// The layers measured, the candidate first.
    layers: Vec<usize>,
    apply_at: u64,
    /// (layer, SP) once the runner has answered.
    values: Option<Vec<(usize, f64)>>,
}

/// A pending probe as checkpoints hold it: this version's, or one layer's, as
/// checkpoints written before every active layer was measured.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum PendingForm {
    Layers { step: u64, layers: Vec<usize>, apply_at: u64, values: Option<Vec<(usize, f64)>> },
    Candidate { step: u64, layer: usize, apply_at: u64, sp: Option<f64> },
}

impl From<PendingForm> for Pending {
    fn from(form: PendingForm) -> Pending {
        match form {
            PendingForm::Layers { step, layers, apply_at, values } => Pending { step, layers, apply_at, values },
            PendingForm::Candidate { step, layer, apply_at, sp } => {
                Pending { step, layers: vec![layer], apply_at, values: sp.map(|sp| vec![(layer, sp)]) }
            }
        }
    }
}

/// What a checkpoint holds of the freezer.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct SavedState {
    depth: usize,
    controller: Option<ControllerState>,
    pending: Vec<Pending>,
    /// The update the saved reference parameters come from.
    reference_step: Option<u64>,
    /// Names of the saved reference tensors, in order.
    reference_names: Vec<String>,
    /// The training samples of the fixed probe batch (none in checkpoints written
    /// before the probe batch was fixed).
    #[serde(default)]
    probe_samples: Vec<usize>,
}

const REFERENCE_PREFIX: &str = "reference/";
const CALIBRATION: &str = "reference.calibration";

/// The live parameters and the calibration batch a reference model was built from.
struct Snapshot {
    step: u64,
    values: Vec<(String, Value)>,
    calibration: Value,
}

struct Auto {
    logic: Logic,
    runner: ReferenceRunner,
    pending: Vec<Pending>,
    snapshot: Option<Snapshot>,
    probe_batch: usize,
    /// The fixed probe batch: its training samples, drawn once from the seed, and their
    /// inputs. Every measurement runs these same samples.
    probe_samples: Vec<usize>,
    probe_input: Option<Value>,
    waited: f64,
    probes: u64,
    rebuilds: u64,
}

enum Policy {
    Auto(Box<Auto>),
    Schedule(Vec<(u64, usize)>),
}

/// The cache shared between the freezer (which invalidates it) and the step runner
/// (which reads and fills it).
#[derive(Clone)]
struct SharedCache(Arc<Mutex<ActivationCache>>);

impl ActivationStore for SharedCache {
    fn get(&mut self, sample: u64) -> std::result::Result<Option<Vec<f32>>, String> {
        let mut c = self.0.lock().map_err(|_| "the activation cache is poisoned".to_string())?;
        c.get(CacheKey { sample, augmentation: 0 }).map_err(|e| e.to_string())
    }
    fn insert(&mut self, sample: u64, values: &[f32]) -> std::result::Result<(), String> {
        let mut c = self.0.lock().map_err(|_| "the activation cache is poisoned".to_string())?;
        c.insert(CacheKey { sample, augmentation: 0 }, values).map_err(|e| e.to_string())
    }
    fn persist(&mut self) -> std::result::Result<(), String> {
        let mut c = self.0.lock().map_err(|_| "the activation cache is poisoned".to_string())?;
        c.persist().map_err(|e| e.to_string())
    }
    fn prefetch(&mut self, _: &[u64]) {
        // Read-ahead is the prefetcher's ([`Prefetching`]); this handle is the freezer's.
    }
    fn describe(&self) -> String {
        self.0.lock().map_or("poisoned".into(), |c| describe(&c))
    }
}

/// The step runner's handle on the cache: lookups as [`SharedCache`], plus a thread that
/// reads the next update's records from the spill file while the current step runs
/// ([`ActivationCache::warm`]). It holds the cache's lock only while it reads, when the
/// training thread is computing; a read error there is left for `get` to meet and report.
struct Prefetching {
    cache: SharedCache,
    ahead: Option<std::sync::mpsc::SyncSender<Vec<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefetching {
    fn spawn(cache: SharedCache) -> Result<Prefetching> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u64>>(1);
        let shared = cache.clone();
        let thread = std::thread::Builder::new()
            .name("edgefreeze-cache-prefetch".into())
            .spawn(move || {
                for samples in rx {
                    let keys: Vec<CacheKey> =
                        samples.iter().map(|&sample| CacheKey { sample, augmentation: 0 }).collect();
                    let Ok(mut c) = shared.0.lock() else { return };
                    // An error reading ahead is met again, and reported, by the lookup.
                    let _ = c.warm(&keys);
                }
            })
            .map_err(|e| FreezeError::Cache(format!("cannot start the prefetch thread: {e}")))?;
        Ok(Prefetching { cache, ahead: Some(tx), thread: Some(thread) })
    }
}

impl Drop for Prefetching {
    fn drop(&mut self) {
        self.ahead = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl ActivationStore for Prefetching {
    fn get(&mut self, sample: u64) -> std::result::Result<Option<Vec<f32>>, String> {
        self.cache.get(sample)
    }
    fn insert(&mut self, sample: u64, values: &[f32]) -> std::result::Result<(), String> {
        self.cache.insert(sample, values)
    }
    fn persist(&mut self) -> std::result::Result<(), String> {
        self.cache.persist()
    }
    fn prefetch(&mut self, samples: &[u64]) {
        // The thread still reading the last batch: skip this one rather than wait.
        if let Some(tx) = &self.ahead {
            let _ = tx.try_send(samples.to_vec());
        }
    }
    fn describe(&self) -> String {
        self.cache.describe()
    }
}

fn describe(c: &ActivationCache) -> String {
    let s = c.stats();
    format!(
        "cache {} in memory, {} on disk, {} hits, {} corrupt{}",
        bytes(s.memory_bytes),
        bytes(s.disk_bytes),
        s.hits,
        s.corrupt,
        if s.refused > 0 { format!(", {} not cached (disk budget or full)", s.refused) } else { String::new() }
    )
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// Egeria's controller of a run.
pub struct Freezer {
    settings: FreezeSettings,
    model: Model,
    model_hash: u64,
    analysis: Analysis,
    spec: StepSpec,
    cache_dir: PathBuf,
    state_names: HashSet<String>,
    /// Why caching is off for the whole run, if it is.
    no_cache: Option<String>,
    policy: Policy,
    depth: usize,
    cache: Option<SharedCache>,
    epoch: usize,
    switch_seconds: f64,
    /// Whether the cache's refusal to take more records was logged.
    stop_logged: bool,
}

fn train_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Config(e.to_string())
}

impl Freezer {
    /// A freezer for the run in `run_dir` (whose graphs, recipe and manifest it reads),
    /// whose reference model runs on `engine`.
    pub fn new(run_dir: &Path, settings: FreezeSettings, engine: EngineKind) -> Result<Freezer> {
        let graphs = run_dir.join(edgefreeze_train::run::GRAPHS_DIR);
        let spec_of_run = edgefreeze_train::open_run(run_dir).map_err(|e| FreezeError::Config(e.to_string()))?;
        let manifest = edgefreeze_train::run::read_manifest(&graphs).map_err(|e| FreezeError::Config(e.to_string()))?;
        let model_path = graphs.join(files::FORWARD);
        let model_bytes = std::fs::read(&model_path).map_err(crate::error::cache_io("read", &model_path))?;
        let model = edgefreeze_graph::prepare(edgefreeze_graph::parse_model(&model_bytes, Some(&graphs))?)?;
        let analysis = analyse(&model)?;
        let layers = analysis.layers.len();
        if manifest.frozen_layers > 0 {
            return Err(FreezeError::Config(format!(
                "the run was converted with {} layers frozen for good; --freeze auto and schedules start from none",
                manifest.frozen_layers
            )));
        }
        let loss = parse_loss(&manifest.loss).map_err(|e| FreezeError::Config(e.to_string()))?;
        let (optimizer, _) = parse_optimizer(&manifest.optimizer).map_err(|e| FreezeError::Config(e.to_string()))?;
        let augmented =
            !spec_of_run.recipe.augmentation().map_err(|e| FreezeError::Config(e.to_string()))?.is_identity();
        let no_cache = if !settings.cache.enabled {
            Some("caching is turned off".to_string())
        } else if augmented {
            Some(format!(
                "augmentation {:?} changes every epoch's input, so a cached activation would be wrong; caching off",
                spec_of_run.recipe.augment.clone().unwrap_or_default()
            ))
        } else {
            None
        };
        let policy = match &settings.plan {
            FreezePlan::Auto { knobs, probe_batch, reference_threads } => {
                if *probe_batch < 2 {
                    return Err(FreezeError::Config(format!(
                        "a probe batch of {probe_batch} sample(s) has no Gram structure: use at least 2"
                    )));
                }
                let logic = Logic::new(knobs.clone(), layers)?;
                let probes: Vec<usize> = (0..logic.max_depth()).collect();
                let options = EngineOptions { threads: Some((*reference_threads).max(1)), ..EngineOptions::default() };
                let runner = ReferenceRunner::spawn(engine, options, analysis.clone(), probes, 4)?;
                Policy::Auto(Box::new(Auto {
                    logic,
                    runner,
                    pending: Vec::new(),
                    snapshot: None,
                    probe_batch: *probe_batch,
                    probe_samples: Vec::new(),
                    probe_input: None,
                    waited: 0.0,
                    probes: 0,
                    rebuilds: 0,
                }))
            }
            FreezePlan::Schedule { points } => {
                if let Some(&(step, depth)) = points.iter().find(|p| p.1 >= layers) {
                    return Err(FreezeError::Config(format!(
                        "schedule point {step}={depth}: the model has {layers} layers, at most {} can be frozen",
                        layers - 1
                    )));
                }
                Policy::Schedule(points.clone())
            }
        };
        let cache_dir = settings.cache.dir.clone().unwrap_or_else(|| run_dir.join("cache"));
        if no_cache.is_none() {
            // Found out now, not when the first layer freezes an hour into the run.
            check_writable(&cache_dir)?;
        }
        Ok(Freezer {
            settings,
            model,
            model_hash: fnv64(&model_bytes),
            analysis,
            spec: StepSpec { loss, optimizer },
            cache_dir,
            state_names: manifest.state.iter().map(|e| e.name.clone()).collect(),
            no_cache,
            policy,
            depth: 0,
            cache: None,
            epoch: 1,
            switch_seconds: 0.0,
            stop_logged: false,
        })
    }

    fn decision(
        &self,
        step: u64,
        kind: DecisionKind,
        layer: Option<usize>,
        history: Vec<f64>,
        reason: String,
    ) -> Decision {
        Decision { epoch: self.epoch, step, kind, layer, depth: self.depth, history, reason }
    }

    /// The graphs for the current depth, opening or invalidating the cache as needed.
    fn graphs(&mut self, step: u64, state: &dyn StateView) -> Result<(GraphSet, Vec<Decision>)> {
        let start = Instant::now();
        let depth = self.depth;
        let cut = depth.checked_sub(1).filter(|c| self.analysis.cuts.iter().any(|k| k.after_layer == *c));
        let mut decisions = Vec::new();
        let set = match (cut, &self.no_cache) {
            (Some(c), None) => {
                let prefix = prefix_graph(&self.model, c).map_err(|e| FreezeError::Reference(e.to_string()))?;
                let suffix =
                    suffix_step(&self.model, c, &self.spec).map_err(|e| FreezeError::Reference(e.to_string()))?;
                let cut_info = self.analysis.cuts.iter().find(|k| k.after_layer == c).expect("checked");
                let sample_shape: Vec<usize> = cut_info.shape[1..].iter().map(|d| d.fixed().unwrap_or(0)).collect();
                if sample_shape.contains(&0) {
                    return Err(FreezeError::Cache(format!(
                        "the activation after layer {c} has no fixed shape per sample"
                    )));
                }
                let data = &self.model.graph.inputs[0].name;
                let mut h = Fnv64::default();
                for input in prefix.graph.inputs.iter().filter(|i| &i.name != data) {
                    h.write(input.name.as_bytes());
                    let v = state.state(&input.name).map_err(|e| FreezeError::Config(e.to_string()))?;
                    let a = v.as_f32().ok_or_else(|| FreezeError::Cache(format!("{:?} is not f32", input.name)))?;
                    for x in a.iter() {
                        h.write(&x.to_le_bytes());
                    }
                }
                let identity = CacheIdentity {
                    model: self.model_hash,
                    cut: c,
                    parameters: h.finish(),
                    elements: sample_shape.iter().product(),
                };
                let reason = match &self.cache {
                    Some(shared) => {
                        let mut cache = shared.0.lock().map_err(|_| FreezeError::Cache("poisoned".into()))?;
                        if *cache.identity() != identity {
                            cache.invalidate(identity)?;
                            format!("the frozen prefix now ends at the cut after layer {c}: cache emptied")
                        } else {
                            format!("the frozen prefix still ends at the cut after layer {c}")
                        }
                    }
                    None => {
                        let (cache, how) =
                            ActivationCache::open(&self.cache_dir, identity, self.settings.cache.memory_budget)?;
                        let cache = cache.with_disk_budget(self.settings.cache.disk_budget);
                        let how = match how {
                            Reopened::Fresh => "new cache".to_string(),
                            Reopened::Reused(n) => format!("{n} records reused"),
                            Reopened::Discarded(why) => {
                                format!("the cache on disk was discarded and is recomputed: {why}")
                            }
                        };
                        let text = format!(
                            "the frozen prefix ends at the cut after layer {c}: caching its output ({} bytes per sample) in {}; {how}",
                            4 * cache.identity().elements,
                            cache.path().display()
                        );
                        self.cache = Some(SharedCache(Arc::new(Mutex::new(cache))));
                        text
                    }
                };
                decisions.push(self.decision(step, DecisionKind::CacheOn, Some(c), Vec::new(), reason));
                GraphSet {
                    label: format!("layers 0..{depth} frozen, cached after layer {c}"),
                    step: StepGraphs::Cached {
                        prefix: encode(Ok(prefix))?,
                        suffix: encode(Ok(suffix))?,
                        activation: activation_name().to_string(),
                        sample_shape,
                        store: Box::new(Prefetching::spawn(self.cache.clone().expect("opened above"))?),
                    },
                    observing: None,
                }
            }
            (cut, no_cache) => {
                let valid: Vec<String> = self.analysis.cuts.iter().map(|c| (c.after_layer + 1).to_string()).collect();
                // This arm is reached with a cut only when caching is off for the run.
                let why = match (depth, cut.and(no_cache.as_ref())) {
                    (0, _) => "no layer is frozen".to_string(),
                    (_, Some(why)) => why.clone(),
                    (_, None) => {
                        format!("{depth} frozen layers do not end at a cut (depths that do: {})", valid.join(", "))
                    }
                };
                if let Some(shared) = self.cache.take() {
                    let mut cache = shared.0.lock().map_err(|_| FreezeError::Cache("poisoned".into()))?;
                    let identity = CacheIdentity { cut: usize::MAX, ..cache.identity().clone() };
                    cache.invalidate(identity)?;
                    let reason = format!("{why}: cache emptied");
                    decisions.push(self.decision(step, DecisionKind::CacheOff, None, Vec::new(), reason));
                } else if depth > 0 {
                    decisions.push(self.decision(step, DecisionKind::CacheOff, None, Vec::new(), why));
                }
                GraphSet {
                    label: format!("layers 0..{depth} frozen"),
                    step: StepGraphs::Whole(encode(frozen_prefix_step(&self.model, &self.spec, depth, &[]))?),
                    observing: None,
                }
            }
        };
        self.switch_seconds += start.elapsed().as_secs_f64();
        Ok((set, decisions))
    }

    fn status_text(&self) -> String {
        let max = self.analysis.layers.len() - 1;
        let cache = self.cache.as_ref().map(|c| format!(" | {}", c.describe())).unwrap_or_default();
        format!("frozen {}/{max}{cache}", self.depth)
    }
}

fn encode(model: std::result::Result<Model, edgefreeze_rewrite::RewriteError>) -> Result<Vec<u8>> {
    Ok(encode_model(&model.map_err(|e| FreezeError::Reference(e.to_string()))?))
}

/// Checks that the cache folder can be created and written, with an error naming it.
pub fn check_writable(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(crate::error::cache_io("create the cache folder", dir))?;
    let probe = dir.join(".writable");
    std::fs::write(&probe, b"").map_err(crate::error::cache_io("write into the cache folder", dir))?;
    std::fs::remove_file(&probe).map_err(crate::error::cache_io("write into the cache folder", dir))
}

impl edgefreeze_train::Controller for Freezer {
    fn open(&mut self, opening: Opening<'_>, state: &dyn StateView) -> edgefreeze_train::Result<Outcome> {
        self.epoch = opening.epoch + 1;
        let mut decisions = Vec::new();
        match opening.saved {
            Some(saved) => {
                let s: SavedState = serde_json::from_value(saved.json)
                    .map_err(|e| train_err(format!("the checkpoint's freezing state is damaged: {e}")))?;
                self.depth = s.depth;
                if let Policy::Auto(a) = &mut self.policy {
                    let logic = Logic::restore(
                        a.logic.knobs().clone(),
                        self.analysis.layers.len(),
                        s.controller.unwrap_or_default(),
                    )
                    .map_err(train_err)?;
                    a.logic = logic;
                    a.pending = s.pending;
                    a.probe_samples = s.probe_samples;
                    if let Some(step) = s.reference_step {
                        let find = |n: &str| saved.tensors.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
                        let mut values = Vec::new();
                        for name in &s.reference_names {
                            let v = find(&format!("{REFERENCE_PREFIX}{name}"))
                                .ok_or_else(|| train_err(format!("the checkpoint lacks reference tensor {name:?}")))?;
                            values.push((name.clone(), v));
                        }
                        let calibration = find(CALIBRATION)
                            .ok_or_else(|| train_err("the checkpoint lacks the reference calibration batch"))?;
                        a.snapshot = Some(Snapshot { step, values, calibration });
                    }
                }
                if let Policy::Auto(a) = &self.policy
                    && let Some(snap) = &a.snapshot
                {
                    a.runner.send(rebuild_request(&self.model, snap).map_err(train_err)?).map_err(train_err)?;
                }
            }
            None => {
                if let Policy::Schedule(points) = &self.policy {
                    self.depth = points.iter().take_while(|p| p.0 <= opening.step).last().map_or(0, |p| p.1);
                }
                if let Some(why) = &self.no_cache {
                    decisions.push(self.decision(opening.step, DecisionKind::CacheOff, None, Vec::new(), why.clone()));
                }
            }
        }
        if let Policy::Auto(a) = &mut self.policy {
            if a.probe_samples.is_empty() {
                a.probe_samples = probe_samples(opening.train_indices, a.probe_batch, opening.seed);
            }
            a.probe_input = Some((opening.samples)(&a.probe_samples)?);
        }
        let (set, more) = self.graphs(opening.step, state).map_err(train_err)?;
        // A resumed run already logged the cache decision of its depth.
        if opening.step == 0 {
            decisions.extend(more.into_iter().filter(|d| d.kind != DecisionKind::CacheOff));
        }
        Ok(Outcome { switch: Some(set), decisions })
    }

    fn observes(&self, _: u64) -> bool {
        // Plasticity is measured on the fixed probe batch by the reference runner, not
        // on the training batch: no update needs the probe outputs.
        false
    }

    fn after_step(&mut self, report: &StepReport<'_>, state: &dyn StateView) -> edgefreeze_train::Result<Outcome> {
        self.epoch = report.epoch;
        let step = report.step;
        let mut decisions = Vec::new();
        let before = self.depth;
        match &mut self.policy {
            Policy::Schedule(points) => {
                if let Some(&(_, depth)) = points.iter().find(|p| p.0 == step) {
                    self.depth = depth;
                }
            }
            Policy::Auto(_) => {
                let d = self.auto_step(report, state).map_err(train_err)?;
                decisions.extend(d);
            }
        }
        if let Some(shared) = &self.cache {
            let stopped =
                shared.0.lock().map_err(|_| train_err("the activation cache is poisoned"))?.stopped().map(String::from);
            match stopped {
                Some(why) if !self.stop_logged => {
                    self.stop_logged = true;
                    decisions.push(self.decision(step, DecisionKind::CacheOff, None, Vec::new(), why));
                }
                Some(_) => {}
                None => self.stop_logged = false,
            }
        }
        let mut switch = None;
        if self.depth != before {
            let (kind, layer) = if self.depth > before {
                (DecisionKind::Freeze, Some(self.depth - 1))
            } else {
                (DecisionKind::Unfreeze, None)
            };
            if matches!(self.policy, Policy::Schedule(_)) {
                decisions.push(self.decision(
                    step,
                    kind,
                    layer,
                    Vec::new(),
                    format!("schedule: {} layers frozen after update {step}", self.depth),
                ));
            }
            let (set, more) = self.graphs(step, state).map_err(train_err)?;
            decisions.extend(more);
            switch = Some(set);
        }
        Ok(Outcome { switch, decisions })
    }

    fn save(&mut self) -> edgefreeze_train::Result<Option<Saved>> {
        let depth = self.depth;
        let Policy::Auto(a) = &mut self.policy else {
            let json = serde_json::to_value(SavedState { depth, ..SavedState::default() }).expect("serialises");
            return Ok(Some(Saved { json, tensors: Vec::new() }));
        };
        // Settle every value in flight, so the saved state is complete.
        while a.pending.iter().any(|p| p.values.is_none()) {
            let start = Instant::now();
            let reply = a.runner.wait().map_err(train_err)?;
            a.waited += start.elapsed().as_secs_f64();
            take_reply(a, reply).map_err(train_err)?;
        }
        let mut tensors = Vec::new();
        let (mut reference_step, mut reference_names) = (None, Vec::new());
        if let Some(s) = &a.snapshot {
            reference_step = Some(s.step);
            for (n, v) in &s.values {
                reference_names.push(n.clone());
                tensors.push((format!("{REFERENCE_PREFIX}{n}"), v.clone()));
            }
            tensors.push((CALIBRATION.to_string(), s.calibration.clone()));
        }
        let state = SavedState {
            depth,
            controller: Some(a.logic.state().clone()),
            pending: a.pending.clone(),
            reference_step,
            reference_names,
            probe_samples: a.probe_samples.clone(),
        };
        Ok(Some(Saved { json: serde_json::to_value(state).expect("serialises"), tensors }))
    }

    fn status(&self) -> Option<String> {
        Some(self.status_text())
    }

    fn summary(&self) -> Option<String> {
        let mut text = format!("{}; graph building {:.1} s", self.status_text(), self.switch_seconds);
        if let Policy::Auto(a) = &self.policy {
            text.push_str(&format!(
                "; reference model: {} rebuilds, {} probes, {:.2} s of its thread's time, {:.2} s waited for by training",
                a.rebuilds,
                a.probes,
                a.runner.busy_seconds(),
                a.waited
            ));
        }
        Some(text)
    }
}

impl Auto {
    /// Sends the runner the reference model of `values` (the live parameters after
    /// `step`), calibrated on the probe batch, and keeps them for the checkpoints.
    fn rebuild(&mut self, model: &Model, step: u64, values: Vec<(String, Value)>, probe: &Value) -> Result<()> {
        let snap = Snapshot { step, values, calibration: probe.clone() };
        self.runner.send(rebuild_request(model, &snap)?)?;
        self.snapshot = Some(snap);
        self.logic.reference_rebuilt(step);
        self.rebuilds += 1;
        Ok(())
    }
}

/// Stores a runner reply in the pending value it answers.
fn take_reply(a: &mut Auto, reply: Reply) -> Result<()> {
    match reply {
        Reply::Rebuilt { .. } => Ok(()),
        Reply::Plasticity { step, values, .. } => {
            if let Some(p) = a.pending.iter_mut().find(|p| p.step == step && p.values.is_none()) {
                p.values = Some(values);
            }
            Ok(())
        }
        Reply::Failed { step, message } => Err(FreezeError::Runner(format!("after update {step}: {message}"))),
    }
}

impl Freezer {
    /// One update of the automatic policy: collect replies, react to a learning-rate
    /// drop, apply the values due, take a new measurement if one is due.
    fn auto_step(&mut self, report: &StepReport<'_>, state: &dyn StateView) -> Result<Vec<Decision>> {
        let step = report.step;
        let Policy::Auto(a) = &mut self.policy else { return Ok(Vec::new()) };
        for reply in a.runner.poll()? {
            take_reply(a, reply)?;
        }
        let mut actions = Vec::new();
        // Only a step counts: the rate was constant over the two updates before. A cosine
        // schedule's last updates fall by large factors too, smoothly, and do not.
        if let [Some(previous), Some(before)] = report.previous_lrs
            && previous == before
        {
            let drop = a.logic.on_lr_change(previous, report.lr);
            if !drop.is_empty() {
                // Values measured before the drop describe the old regime.
                a.pending.clear();
                a.snapshot = None;
            }
            actions.extend(drop);
        }
        let lag = a.logic.knobs().every.saturating_sub(1).max(1);
        let mut measured = Vec::new();
        while let Some(i) = a.pending.iter().position(|p| p.apply_at <= step) {
            while a.pending[i].values.is_none() {
                let start = Instant::now();
                let reply = a.runner.wait()?;
                a.waited += start.elapsed().as_secs_f64();
                take_reply(a, reply)?;
            }
            let p = a.pending.remove(i);
            let values = p.values.expect("waited for above");
            // The values of layers still active: what the controller takes.
            let active: Vec<(usize, f64)> = values.iter().copied().filter(|&(l, _)| l >= a.logic.depth()).collect();
            if !active.is_empty() {
                measured.push((p.step, active));
            }
            actions.extend(a.logic.observe(p.step, &values));
        }
        if let Some(layers) = a.logic.probe_due(step) {
            let layers: Vec<usize> = layers.collect();
            let input = a.probe_input.clone().ok_or_else(|| FreezeError::Reference("no probe batch".into()))?;
            let start = Instant::now();
            let lagged = a.logic.knobs().lagged;
            let measure = a.logic.measures_at(step);
            let mut rebuild = match a.logic.reference_due(step) {
                Some(Action::RebuildReference { reason }) => Some(reason),
                _ => None,
            };
            // A lagged run rebuilds at every probe: only the first reference (of the run,
            // or after a learning-rate drop) is worth a line in the log.
            let routine = lagged && a.logic.state().reference_step.is_some();
            // Copied once, for the measurement and the rebuild alike.
            let parameters = live_values(&self.model, &self.state_names, state)?;
            // The runner answers in order: lagged, the measurement goes first and meets
            // the reference of the probe before; otherwise a due rebuild goes first.
            if !lagged && let Some(reason) = rebuild.take() {
                a.rebuild(&self.model, step, parameters.clone(), &input)?;
                actions.push(Action::RebuildReference { reason });
            }
            if measure {
                a.runner.send(Request::Measure { step, layers: layers.clone(), parameters: parameters.clone() })?;
                a.pending.push(Pending { step, layers, apply_at: step + lag, values: None });
                a.probes += 1;
            }
            if let Some(reason) = rebuild {
                a.rebuild(&self.model, step, parameters, &input)?;
                if !routine {
                    actions.push(Action::RebuildReference { reason });
                }
            }
            a.waited += start.elapsed().as_secs_f64();
        }
        let mut decisions: Vec<Decision> = measured
            .into_iter()
            .map(|(at, values)| {
                let (first, last) = (values[0].0, values[values.len() - 1].0);
                let layers = if first == last { format!("layer {first}") } else { format!("layers {first}..={last}") };
                Decision {
                    epoch: self.epoch,
                    step,
                    kind: DecisionKind::Plasticity,
                    layer: Some(first),
                    depth: self.depth,
                    history: values.iter().map(|v| v.1).collect(),
                    reason: format!("SP of {layers} (in that order) against the reference, measured after update {at}"),
                }
            })
            .collect();
        for action in actions {
            let (kind, layer, reason) = match action {
                Action::Freeze { layer, reason } => {
                    self.depth = layer + 1;
                    (DecisionKind::Freeze, Some(layer), reason)
                }
                Action::Unfreeze { to, reason } => {
                    self.depth = to;
                    (DecisionKind::Unfreeze, None, reason)
                }
                Action::RebuildReference { reason } => (DecisionKind::RebuildReference, None, reason),
            };
            decisions.push(Decision {
                epoch: self.epoch,
                step,
                kind,
                layer,
                depth: self.depth,
                history: reason.history,
                reason: reason.text,
            });
        }
        Ok(decisions)
    }
}

/// Copies the live parameters and statistics the inference model holds, in its
/// initializers' order.
fn live_values(model: &Model, state_names: &HashSet<String>, state: &dyn StateView) -> Result<Vec<(String, Value)>> {
    let mut values = Vec::new();
    for name in model.graph.initializers.keys().filter(|n| state_names.contains(*n)) {
        values.push((name.clone(), state.state(name).map_err(|e| FreezeError::Reference(e.to_string()))?));
    }
    Ok(values)
}

/// The fixed probe batch: `n` of the run's training samples, drawn once from the seed
/// (a draw of its own, not the first batch of an epoch), in increasing order.
pub fn probe_samples(train: &[usize], n: usize, seed: u64) -> Vec<usize> {
    // The subset of a limited run is drawn with the tag u64::MAX; this one differs.
    const TAG: u64 = u64::MAX - 1;
    let mut picked: Vec<usize> =
        edgefreeze_data::epoch_order(train.len(), seed, TAG).into_iter().take(n).map(|i| train[i]).collect();
    picked.sort_unstable();
    picked
}

/// The request that builds the reference model of a snapshot.
fn rebuild_request(model: &Model, snapshot: &Snapshot) -> Result<Request> {
    let mut tensors = Vec::new();
    for (name, v) in &snapshot.values {
        let t =
            edgefreeze_train::tensors::tensor_from_value(name, v).map_err(|e| FreezeError::Reference(e.to_string()))?;
        tensors.push((name.clone(), t));
    }
    Ok(Request::Rebuild {
        step: snapshot.step,
        model: Box::new(with_parameters(model, &tensors)?),
        calibration: snapshot.calibration.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_probes_read_from_checkpoints_of_either_form() {
        let now = Pending { step: 40, layers: vec![2, 3], apply_at: 49, values: Some(vec![(2, 0.5), (3, 0.25)]) };
        let text = serde_json::to_string(&now).unwrap();
        assert_eq!(serde_json::from_str::<Pending>(&text).unwrap(), now);
        // A checkpoint written when only the candidate was measured.
        let old: Pending = serde_json::from_str(r#"{"step":40,"layer":2,"apply_at":49,"sp":0.5}"#).unwrap();
        assert_eq!(old, Pending { step: 40, layers: vec![2], apply_at: 49, values: Some(vec![(2, 0.5)]) });
        let unanswered: Pending = serde_json::from_str(r#"{"step":40,"layer":2,"apply_at":49,"sp":null}"#).unwrap();
        assert_eq!(unanswered.values, None);
    }

    #[test]
    fn the_probe_batch_is_drawn_once_from_the_seed_out_of_the_runs_samples() {
        // A limited run's training samples: every third index of the split.
        let train: Vec<usize> = (0..300).map(|i| 3 * i).collect();
        let a = probe_samples(&train, 32, 7);
        assert_eq!(a.len(), 32);
        assert!(a.iter().all(|i| train.contains(i)), "{a:?}");
        assert!(a.windows(2).all(|w| w[0] < w[1]), "sorted and distinct: {a:?}");
        assert_eq!(a, probe_samples(&train, 32, 7), "the same seed draws the same samples");
        assert_ne!(a, probe_samples(&train, 32, 8));
        // Not the first batch of an epoch, nor the subset's own draw.
        let mut first: Vec<usize> =
            edgefreeze_data::epoch_order(train.len(), 7, 1).into_iter().take(32).map(|i| train[i]).collect();
        first.sort_unstable();
        assert_ne!(a, first);
        // A probe batch larger than the run takes every sample.
        assert_eq!(probe_samples(&train[..5], 32, 7), train[..5].to_vec());
    }
}
