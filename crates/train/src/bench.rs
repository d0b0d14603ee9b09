//! Training throughput: samples per second of whole training steps (forward, backward,
//! optimizer update) on synthetic data, with the state kept in the engine as in training.

use crate::error::{Result, TrainError};
use crate::tensors::value_from_tensor;
use edgefreeze_autodiff::artifacts::convert;
use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
use edgefreeze_autodiff::training::{LOSS, UPDATED_PREFIX};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec};
use edgefreeze_engine::{EngineKind, EngineOptions, StateUpdates, Value};
use edgefreeze_graph::{DataType, Dim};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Untimed steps first.
    pub warmup: usize,
    /// At least this many timed steps.
    pub min_steps: usize,
    /// And at least this long.
    pub min_time: Duration,
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchResult {
    /// Model name (file stem).
    pub model: String,
    /// Engine.
    pub engine: String,
    /// Batch size.
    pub batch: usize,
    /// Threads.
    pub threads: usize,
    /// Timed steps.
    pub steps: usize,
    /// Median step time.
    pub step_ms_median: f64,
    /// `batch / median step time`.
    pub samples_per_s: f64,
    /// Peak resident memory while stepping above the resident memory once the graph and
    /// its state were loaded, in MiB (see [`StepMemory`]); `None` where the operating
    /// system does not report it (only Linux does).
    #[serde(default)]
    pub step_peak_mib: Option<f64>,
    /// Forward FLOPs per sample of the model, as `inspect` counts them (a multiply-add is
    /// two).
    #[serde(default)]
    pub forward_flops_per_sample: u64,
    /// The step's arithmetic rate in GFLOP/s ([`step_gflop_per_s`]).
    #[serde(default)]
    pub step_gflop_per_s: f64,
}

/// The arithmetic rate of a training step, in GFLOP/s: three times the forward's FLOPs
/// per sample (the backward of a convolution or a matrix product is two products of the
/// forward's size: the input's gradient and the weight's), at `samples_per_s`. It counts
/// the model's arithmetic, not the graph's, so that engines whose graphs spell the
/// backward differently (and PyTorch, whose graph is not ours) are rated on the same
/// work; element-wise passes and the update are left out, as in every such figure.
pub fn step_gflop_per_s(forward_flops_per_sample: u64, samples_per_s: f64) -> f64 {
    3.0 * forward_flops_per_sample as f64 * samples_per_s / 1e9
}

/// The process's resident-memory high-water mark, reset at a point and read later: what
/// a stretch of work (the training steps) added at its peak to what was resident when it
/// began. Linux only, through `/proc/self/clear_refs` (writing 5 resets the mark to the
/// current resident size) and `VmHWM`/`VmRSS` in `/proc/self/status`. The same
/// measurement runs in `tools/bench_pytorch.py`, so the two are comparable.
pub struct StepMemory {
    start_kib: u64,
}

impl StepMemory {
    /// Resets the high-water mark; `None` where it cannot be. Memory an earlier case
    /// freed is handed back to the system first: left resident, the steps would reuse
    /// it and the peak would not rise above the start.
    pub fn start() -> Option<StepMemory> {
        release_freed_memory();
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        Some(StepMemory { start_kib: status_kib("VmRSS")? })
    }

    /// MiB the peak rose above the start.
    pub fn peak_mib(&self) -> Option<f64> {
        let peak = status_kib("VmHWM")?;
        Some(peak.saturating_sub(self.start_kib) as f64 / 1024.0)
    }
}

/// Returns the allocator's free pages to the system (glibc's `malloc_trim`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_freed_memory() {
    // SAFETY: malloc_trim only releases memory the allocator holds free; it reads and
    // writes nothing of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators: nothing to do (only Linux reports the peak anyway).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_freed_memory() {}

/// A `kB` field of `/proc/self/status`.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Deterministic pseudo-random numbers for synthetic batches.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn uniform(&mut self) -> f32 {
        (self.next() as f64 / (1u64 << 31) as f64) as f32 * 2.0 - 1.0
    }
}

/// Measures training steps of an inference model converted with cross-entropy and SGD
/// (momentum 0.9, weight decay 5e-4, the recipe of `tools/bench_pytorch.py`).
pub fn bench_training(
    model_path: &Path,
    engine: &EngineKind,
    engine_options: &EngineOptions,
    batch: usize,
    options: &BenchOptions,
) -> Result<BenchResult> {
    let mut prepared = prepare(model_path, engine, engine_options, batch)?;
    let memory = StepMemory::start();
    let (steps, median) = prepared.time(options)?;
    let step_peak_mib = memory.and_then(|m| m.peak_mib());
    let samples_per_s = batch as f64 / median;
    Ok(BenchResult {
        model: prepared.model_name,
        engine: engine.to_string(),
        batch,
        threads: engine_options.threads.unwrap_or_else(edgefreeze_engine::default_threads),
        steps,
        step_ms_median: median * 1e3,
        samples_per_s,
        step_peak_mib,
        forward_flops_per_sample: prepared.forward_flops_per_sample,
        step_gflop_per_s: step_gflop_per_s(prepared.forward_flops_per_sample, samples_per_s),
    })
}

/// Where the time of a training step goes, by op type.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProfileResult {
    /// Model name (file stem).
    pub model: String,
    /// Engine.
    pub engine: String,
    /// Batch size.
    pub batch: usize,
    /// Threads.
    pub threads: usize,
    /// Profiled steps (after the warm-up ones, which are left out).
    pub steps: usize,
    /// Median step time while profiling (a little above an unprofiled step's).
    pub step_ms_median: f64,
    /// The node times summed, per step: the step less what lies between nodes.
    pub node_ms_per_step: f64,
    /// Op types by decreasing time.
    pub ops: Vec<edgefreeze_engine::OpTypeTime>,
}

/// [`bench_training`]'s steps with the engine's profiler on: the time per op type of the
/// steps after the warm-up.
pub fn profile_training(
    model_path: &Path,
    engine: &EngineKind,
    engine_options: &EngineOptions,
    batch: usize,
    options: &BenchOptions,
) -> Result<ProfileResult> {
    let engine_options = EngineOptions { profile: true, ..engine_options.clone() };
    let mut prepared = prepare(model_path, engine, &engine_options, batch)?;
    let (steps, median) = prepared.time(options)?;
    let profile = prepared.ws.take_profile(prepared.graph)?;
    // Every run so far was a step: the warm-up ones first.
    let skip = profile.runs.len().saturating_sub(steps);
    Ok(ProfileResult {
        model: prepared.model_name,
        engine: engine.to_string(),
        batch,
        threads: engine_options.threads.unwrap_or_else(edgefreeze_engine::default_threads),
        steps: profile.runs.len() - skip,
        step_ms_median: median * 1e3,
        node_ms_per_step: profile.node_ms_per_run(skip),
        ops: profile.by_op_type(skip),
    })
}

/// A training-step graph loaded with its state, and a synthetic batch for it.
struct Prepared {
    model_name: String,
    forward_flops_per_sample: u64,
    ws: Box<dyn edgefreeze_engine::Workspace>,
    graph: edgefreeze_engine::GraphId,
    input_name: String,
    input: Value,
    labels: Value,
}

impl Prepared {
    fn time(&mut self, options: &BenchOptions) -> Result<(usize, f64)> {
        let feeds = [(self.input_name.as_str(), &self.input), ("labels", &self.labels)];
        time_steps(self.ws.as_mut(), self.graph, &feeds, options)
    }
}

/// Converts an inference model with the benchmark's recipe and loads its training step.
fn prepare(model_path: &Path, engine: &EngineKind, engine_options: &EngineOptions, batch: usize) -> Result<Prepared> {
    let model = edgefreeze_graph::import(model_path)?;
    let spec = TrainingSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 },
        frozen: Vec::new(),
    };
    let source = model_path.display().to_string();
    let artifacts = convert(&model, &source, &spec, 0, ("cross-entropy", "sgd", 0.01))?;
    let mut ws = edgefreeze_engine::workspace(engine, engine_options)?;
    let outputs: Vec<String> = artifacts.train_step.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let updates =
        StateUpdates::where_output_exists(UPDATED_PREFIX, artifacts.state.iter().map(|(n, _)| n.as_str()), &outputs);
    let graph = ws.load_graph(&edgefreeze_graph::save::encode_model(&artifacts.train_step), updates)?;
    for (name, tensor) in &artifacts.state {
        ws.set_state(name, value_from_tensor(name, tensor)?)?;
    }
    let (input, labels) = synthetic_batch(&model, batch)?;
    let forward_flops_per_sample = edgefreeze_graph::analysis::analyse(&model)?.total_flops;
    Ok(Prepared {
        forward_flops_per_sample,
        model_name: model_path.file_stem().map_or(source.clone(), |s| s.to_string_lossy().into_owned()),
        ws,
        graph,
        input_name: model.graph.inputs[0].name.clone(),
        input,
        labels,
    })
}

/// Times training steps of a loaded graph: `feeds` (the batch), a learning rate of
/// 0.01, and the step counter and dropout seed where the graph takes them → (timed
/// steps, median seconds). Each run must return a loss.
pub fn time_steps(
    ws: &mut dyn edgefreeze_engine::Workspace,
    graph: edgefreeze_engine::GraphId,
    feeds: &[(&str, &Value)],
    options: &BenchOptions,
) -> Result<(usize, f64)> {
    let lr = Value::scalar_f32(0.01);
    let takes = |name: &str| ws.inputs(graph).iter().any(|i| i == name);
    let (takes_step, takes_seed) = (takes(STEP), takes(DROPOUT_SEED));
    let mut times = Vec::new();
    let started = Instant::now();
    let mut step = 0i64;
    while step < options.warmup as i64 || times.len() < options.min_steps.max(1) || started.elapsed() < options.min_time
    {
        step += 1;
        let (s, seed) = (Value::scalar_i64(step), Value::scalar_i64(step * 7919));
        let mut inputs: Vec<(&str, &Value)> = feeds.to_vec();
        inputs.push((LEARNING_RATE, &lr));
        if takes_step {
            inputs.push((STEP, &s));
        }
        if takes_seed {
            inputs.push((DROPOUT_SEED, &seed));
        }
        let t = Instant::now();
        let out = ws.run(graph, &inputs)?;
        let elapsed = t.elapsed();
        if !out.iter().any(|(n, _)| n == LOSS) {
            return Err(TrainError::Config("the training-step graph returned no loss".into()));
        }
        if step > options.warmup as i64 {
            times.push(elapsed.as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times.len(), times[times.len() / 2]))
}

/// Random inputs of the model's input type (token ids below the embedding size for
/// integer inputs) and random labels below the number of classes, deterministic (for
/// benchmarks and probes, whose times do not depend on the values).
pub fn synthetic_batch(model: &edgefreeze_graph::Model, batch: usize) -> Result<(Value, Value)> {
    let input = &model.graph.inputs[0];
    let shape =
        input.shape.as_ref().ok_or_else(|| TrainError::Config(format!("input {:?} has no shape", input.name)))?;
    let mut dims = vec![batch];
    for d in &shape[1..] {
        dims.push(d.fixed().ok_or_else(|| {
            TrainError::Config(format!("input {:?}: only the first (batch) dimension may be symbolic", input.name))
        })?);
    }
    let n: usize = dims.iter().product();
    let mut rng = Lcg(0x5eed);
    let value = match input.dtype {
        Some(DataType::Int64) => {
            let vocab = crate::run::embedding_rows(model, &input.name).unwrap_or(2) as u64;
            Value::I64(
                ArrayD::from_shape_vec(IxDyn(&dims), (0..n).map(|_| (rng.next() % vocab) as i64).collect()).unwrap(),
            )
        }
        _ => Value::F32(ArrayD::from_shape_vec(IxDyn(&dims), (0..n).map(|_| rng.uniform()).collect()).unwrap()),
    };
    // Classes on axis 1; a label per sample, or per element of the axes behind them (a
    // segmentation model's class map per pixel), as the cross-entropy takes them.
    let no_classes = || TrainError::Config("the model's output has no fixed class dimension".into());
    let output = model.graph.outputs[0].shape.as_ref().ok_or_else(no_classes)?;
    let classes = output.get(1).and_then(Dim::fixed).ok_or_else(no_classes)? as u64;
    let mut label_dims = vec![batch];
    for d in output.iter().skip(2) {
        label_dims.push(
            d.fixed().ok_or_else(|| {
                TrainError::Config("the model's output has a symbolic size behind its classes".into())
            })?,
        );
    }
    let count = label_dims.iter().product();
    let labels = Value::I64(
        ArrayD::from_shape_vec(IxDyn(&label_dims), (0..count).map(|_| (rng.next() % classes) as i64).collect())
            .unwrap(),
    );
    Ok((value, labels))
}
