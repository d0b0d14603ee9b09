//! The training loop: batches from a prefetching loader, one training-step graph run per
//! batch with the state kept inside the engine, evaluation and an atomic checkpoint after
//! every epoch, metrics to JSON Lines and curves to PNG.

use crate::checkpoint::{Checkpoint, CheckpointInfo, FORMAT, checkpoint_path, list_checkpoints, read_tensors};
use crate::control::{Controller, Fixed, Opening, Outcome, SAVED_TENSOR_PREFIX, Saved, StepReport};
use crate::error::{Result, TrainError};
use crate::metrics::{Decision, MetricsLog, Record};
use crate::observe::{Checkpoints, EpochEvent, Metrics, Observer, Plot, Progress, StepEvent};
use crate::run::{GRAPHS_DIR, METRICS_FILE, RunSpec, open_run, read_manifest};
use crate::step::{StepRunner, StepScalars};
use crate::tensors::scalar;
use edgefreeze_autodiff::artifacts::{Manifest, Port, files};
use edgefreeze_autodiff::loss::LABELS;
use edgefreeze_autodiff::training::{CORRECT, LOSS};
use edgefreeze_data::named::{OpenOptions, Splits, open_with};
use edgefreeze_data::{Batch, Inputs, Loader, LoaderOptions, Samples, batch_count, epoch_order};
use edgefreeze_engine::{EngineKind, EngineOptions, GraphId, Value, Workspace};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::{ArrayD, IxDyn};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// How to run (not what to compute: that is the [`crate::Recipe`]).
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The engine.
    pub engine: EngineKind,
    /// Engine settings (threads, ONNX Runtime library).
    pub engine_options: EngineOptions,
    /// Draw the curves to this PNG after every epoch.
    pub plot: Option<PathBuf>,
    /// Show a progress bar and a line per epoch on stderr.
    pub progress: bool,
    /// Batches the loader thread may prepare ahead.
    pub prefetch: usize,
    /// Where npm datasets are installed (None: `$EDGEFREEZE_DATA_DIR` or `.data/`).
    pub npm_prefix: Option<PathBuf>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            engine: EngineKind::Tract,
            engine_options: EngineOptions::default(),
            plot: None,
            progress: false,
            prefetch: 4,
            npm_prefix: None,
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// Epochs completed.
    pub epochs: usize,
    /// Updates completed.
    pub steps: u64,
    /// The last checkpoint written.
    pub checkpoint: PathBuf,
    /// Test accuracy after the last epoch, if any epoch ran.
    pub test_accuracy: Option<f64>,
    /// Training throughput of the last epoch.
    pub samples_per_s: Option<f64>,
}

/// A run opened for training: its graphs in an engine workspace, its data, and where it
/// stands.
pub struct Trainer {
    dir: PathBuf,
    spec: RunSpec,
    options: TrainOptions,
    manifest: Manifest,
    data: Splits,
    runner: StepRunner,
    controller: Box<dyn Controller>,
    /// Decisions the controller took when the run opened, logged when training starts.
    opening_decisions: Vec<Decision>,
    epochs_done: usize,
    steps_done: u64,
    last_checkpoint: PathBuf,
    last_test_accuracy: Option<f64>,
}

impl Trainer {
    /// Opens a run directory (created by [`crate::create_run`]) and restores its latest
    /// checkpoint; a run without one starts from the converted initial state and writes
    /// it as checkpoint 0.
    pub fn open(dir: &Path, options: TrainOptions) -> Result<Trainer> {
        Trainer::open_inner(dir, options, Box::new(Fixed), None)
    }

    /// Opens a run driven by `controller`, which may switch graphs between updates; its
    /// state is restored from the checkpoint the run continues from.
    pub fn open_with(dir: &Path, options: TrainOptions, controller: Box<dyn Controller>) -> Result<Trainer> {
        Trainer::open_inner(dir, options, controller, None)
    }

    /// Opens a run just written from a [`crate::NewRun`] that passed [`preflight`], driven
    /// by `controller`, with the dataset the check opened (not read a second time).
    pub fn start(
        dir: &Path,
        options: TrainOptions,
        checked: Checked,
        controller: Box<dyn Controller>,
    ) -> Result<Trainer> {
        Trainer::open_inner(dir, options, controller, Some(checked.data))
    }

    fn open_inner(
        dir: &Path,
        options: TrainOptions,
        mut controller: Box<dyn Controller>,
        data: Option<Splits>,
    ) -> Result<Trainer> {
        let spec = open_run(dir)?;
        let graphs = dir.join(GRAPHS_DIR);
        let manifest = read_manifest(&graphs)?;
        let input = data_input(&manifest)?;
        let data = match data {
            // The dataset a pre-flight check opened for this very run.
            Some(data) if data.name == spec.data => data,
            _ => open_data(
                &spec.data,
                || Ok(edgefreeze_graph::load_model(graphs.join(files::FORWARD))?),
                &manifest,
                &options,
            )?,
        };
        check_fit(&data, &manifest)?;

        let workspace = edgefreeze_engine::workspace(&options.engine, &options.engine_options)?;
        let read = |file: &str| {
            let path = graphs.join(file);
            std::fs::read(&path).map_err(crate::error::io("read", path))
        };
        let state_names = manifest.state.iter().map(|s| s.name.clone()).collect();
        let mut runner =
            StepRunner::new(workspace, state_names, input, &read(files::TRAIN_STEP)?, &read(files::EVAL)?)?;

        let checkpoints = list_checkpoints(dir)?;
        let (state, epochs_done, steps_done, last_checkpoint, last_test_accuracy, saved) = match checkpoints.last() {
            Some((_, path)) => {
                let c = Checkpoint::read(path)?;
                if c.info.epoch > spec.recipe.epochs {
                    return Err(TrainError::Checkpoint {
                        path: path.clone(),
                        message: format!(
                            "is after epoch {}, but the run has {} epochs",
                            c.info.epoch, spec.recipe.epochs
                        ),
                    });
                }
                let saved = c.info.controller.clone().map(|json| Saved {
                    json,
                    tensors: c
                        .state
                        .iter()
                        .filter_map(|(n, v)| n.strip_prefix(SAVED_TENSOR_PREFIX).map(|n| (n.to_string(), v.clone())))
                        .collect(),
                });
                (c.state, c.info.epoch, c.info.step, path.clone(), c.info.test_accuracy, saved)
            }
            None => {
                let state = read_tensors(&graphs.join(files::STATE))?;
                let path = checkpoint_path(dir, 0);
                let info =
                    CheckpointInfo { format: FORMAT.into(), epoch: 0, step: 0, test_accuracy: None, controller: None };
                Checkpoint { info, state: state.clone() }.write(&path)?;
                (state, 0, 0, path, None, None)
            }
        };
        for entry in &manifest.state {
            let value = state.iter().find(|(n, _)| *n == entry.name).map(|(_, v)| v.clone()).ok_or_else(|| {
                TrainError::Checkpoint {
                    path: last_checkpoint.clone(),
                    message: format!("has no tensor {:?} ({})", entry.name, entry.role),
                }
            })?;
            runner.set_state(&entry.name, value)?;
        }
        let train_indices = subset(data.train.len(), spec.recipe.train_limit, spec.recipe.seed);
        let samples = |indices: &[usize]| -> Result<Value> {
            let batch = data.train.batch(indices, None, spec.recipe.seed, 0).map_err(TrainError::from)?;
            Ok(batch_values(batch)?.0)
        };
        let opening = Opening {
            run_dir: dir,
            step: steps_done,
            epoch: epochs_done,
            saved,
            train_indices: &train_indices,
            seed: spec.recipe.seed,
            samples: &samples,
        };
        let Outcome { switch, decisions } = controller.open(opening, &runner)?;
        if let Some(graphs) = switch {
            runner.switch(graphs)?;
        }
        Ok(Trainer {
            dir: dir.into(),
            spec,
            options,
            manifest,
            data,
            runner,
            controller,
            opening_decisions: decisions,
            epochs_done,
            steps_done,
            last_checkpoint,
            last_test_accuracy,
        })
    }

    /// The run's recipe and names.
    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// The dataset.
    pub fn data(&self) -> &Splits {
        &self.data
    }

    /// Epochs completed so far.
    pub fn epochs_done(&self) -> usize {
        self.epochs_done
    }

    /// Copies the current training state out of the engine, in manifest order.
    pub fn state(&self) -> Result<Vec<(String, Value)>> {
        self.manifest.state.iter().map(|e| Ok((e.name.clone(), self.runner.state(&e.name)?))).collect()
    }

    fn train_samples(&self) -> usize {
        self.spec.recipe.train_limit.map_or(self.data.train.len(), |l| l.min(self.data.train.len()))
    }

    /// The training samples the run uses: all of them, or a fixed random subset.
    pub fn train_indices(&self) -> Vec<usize> {
        subset(self.data.train.len(), self.spec.recipe.train_limit, self.spec.recipe.seed)
    }

    /// The test samples evaluation uses: all of them, or a fixed random subset.
    pub fn test_indices(&self) -> Vec<usize> {
        subset(self.data.test.len(), self.spec.recipe.test_limit, self.spec.recipe.seed)
    }

    /// Updates in the whole run.
    pub fn total_steps(&self) -> u64 {
        (self.spec.recipe.epochs * batch_count(self.train_samples(), self.spec.recipe.batch)) as u64
    }

    /// The graphs the run uses now, in words.
    pub fn graphs_label(&self) -> &str {
        self.runner.label()
    }

    /// Graphs loaded in the engine now: the eval graph and the current step's (graphs
    /// a controller switched away from are freed).
    pub fn loaded_graphs(&self) -> usize {
        self.runner.loaded_graphs()
    }

    /// The controller's summary (overheads, cache sizes), if it has one.
    pub fn controller_summary(&self) -> Option<String> {
        self.controller.summary()
    }

    /// Trains the remaining epochs. A non-finite loss stops training with
    /// [`TrainError::Diverged`]; checkpoints on disk are left as they were.
    pub fn run(&mut self) -> Result<TrainSummary> {
        let metrics = MetricsLog::open(&self.dir.join(METRICS_FILE), self.epochs_done)?;
        let mut observers: Vec<Box<dyn Observer>> = vec![Box::new(Checkpoints)];
        if let Some(plot) = &self.options.plot {
            let title = format!("{} on {} ({})", model_label(&self.spec.model), self.spec.data, self.options.engine);
            observers.push(Box::new(Plot::new(plot.clone(), title, metrics.records(), metrics.decisions())));
        }
        observers.insert(1, Box::new(Metrics(metrics)));
        if self.options.progress {
            observers.push(Box::new(Progress::default()));
        }
        for d in std::mem::take(&mut self.opening_decisions) {
            observers.iter_mut().try_for_each(|o| o.on_event(&d))?;
        }
        let mut samples_per_s = None;
        while self.epochs_done < self.spec.recipe.epochs {
            let epoch = self.epochs_done + 1;
            let cpu_before = crate::metrics::process_cpu_seconds();
            let (train_loss, train_accuracy, seconds, samples) = self.train_epoch(epoch, &mut observers)?;
            let cpu_seconds =
                crate::metrics::process_cpu_seconds().zip(cpu_before).map(|(after, before)| after - before);
            let (test_loss, test_accuracy) = self.evaluate()?;
            let rate = samples as f64 / seconds.max(1e-9);
            samples_per_s = Some(rate);
            let path = checkpoint_path(&self.dir, epoch);
            // The cache and the controller's work in flight are settled before the state is
            // saved, so a resumed run finds exactly what this one had.
            self.runner.persist_store()?;
            let saved = self.controller.save()?;
            let record = Record::Epoch {
                epoch,
                step: self.steps_done,
                train_loss,
                train_accuracy,
                test_loss,
                test_accuracy,
                train_seconds: seconds,
                cpu_seconds,
                samples_per_s: rate,
            };
            let state = self.state()?;
            let event = EpochEvent {
                record: &record,
                epochs: self.spec.recipe.epochs,
                state: &state,
                saved: saved.as_ref(),
                checkpoint: &path,
            };
            observers.iter_mut().try_for_each(|o| o.on_epoch(&event))?;
            self.epochs_done = epoch;
            self.last_checkpoint = path;
            self.last_test_accuracy = Some(test_accuracy);
        }
        Ok(TrainSummary {
            epochs: self.epochs_done,
            steps: self.steps_done,
            checkpoint: self.last_checkpoint.clone(),
            test_accuracy: self.last_test_accuracy,
            samples_per_s,
        })
    }

    /// One epoch of updates → (mean loss, accuracy, seconds, samples).
    fn train_epoch(&mut self, epoch: usize, observers: &mut [Box<dyn Observer>]) -> Result<(f64, f64, f64, usize)> {
        let recipe = self.spec.recipe.clone();
        let samples = self.train_indices();
        let augmentation = recipe.augmentation()?;
        let images = matches!(*self.data.train, Samples::Images { .. });
        let order: Vec<usize> =
            epoch_order(samples.len(), recipe.seed, epoch as u64).into_iter().map(|i| samples[i]).collect();
        // Batch k of the loader holds order[k·b..(k+1)·b]: the next update's samples are
        // known before it runs, for the activation store to read ahead.
        let mut upcoming = order.chunks(recipe.batch.max(1)).skip(1);
        let loader = Loader::spawn(
            Arc::clone(&self.data.train),
            order.clone(),
            LoaderOptions {
                batch_size: recipe.batch,
                augmentation: (images && !augmentation.is_identity()).then_some(augmentation),
                seed: recipe.seed,
                epoch: epoch as u64,
                depth: self.options.prefetch.max(1),
                start_batch: 0,
            },
        )?;
        let batches = loader.remaining() as u64;
        observers.iter_mut().try_for_each(|o| o.on_epoch_start(epoch, recipe.epochs, batches))?;
        let total = self.total_steps();
        let start = Instant::now();
        let (mut loss_sum, mut correct_sum, mut seen) = (0.0, 0.0, 0usize);
        for batch in loader {
            let lr = recipe.schedule.rate(self.steps_done, total, epoch - 1);
            let rate_back = |back: u64| {
                let t = self.steps_done.checked_sub(back)?;
                Some(recipe.schedule.rate(t, total, epoch_of(t, total, recipe.epochs)))
            };
            let previous_lrs = [rate_back(1), rate_back(2)];
            let len = batch.len();
            let indices = batch.indices.clone();
            let (input, labels) = batch_values(batch)?;
            let step = self.steps_done + 1;
            let scalars = StepScalars { lr, step, dropout_seed: dropout_seed(recipe.seed, self.steps_done) };
            if let Some(next) = upcoming.next() {
                self.runner.prefetch(next);
            }
            let outputs = self.runner.step(&input, &labels, &indices, scalars, self.controller.observes(step))?;
            let (loss, correct) = (outputs.loss, outputs.correct);
            if !loss.is_finite() {
                return Err(TrainError::Diverged { step, epoch, loss, checkpoint: Some(self.last_checkpoint.clone()) });
            }
            self.steps_done = step;
            loss_sum += loss * len as f64;
            correct_sum += correct;
            seen += len;
            let report = StepReport {
                epoch,
                step,
                lr,
                previous_lrs,
                loss,
                input: &input,
                indices: &indices,
                outputs: &outputs.extra,
            };
            let Outcome { switch, decisions } = self.controller.after_step(&report, &self.runner)?;
            if let Some(graphs) = switch {
                self.runner.switch(graphs)?;
            }
            for d in &decisions {
                observers.iter_mut().try_for_each(|o| o.on_event(d))?;
            }
            let rate = seen as f64 / start.elapsed().as_secs_f64().max(1e-9);
            let record = Record::Step {
                epoch,
                step,
                loss,
                accuracy: correct / len as f64,
                lr,
                samples_per_s: rate,
                stages: None,
            };
            let status = self.controller.status();
            let event = StepEvent {
                record: &record,
                logged: step.is_multiple_of(recipe.log_every.max(1)),
                mean_loss: loss_sum / seen as f64,
                mean_accuracy: correct_sum / seen as f64,
                status: status.as_deref(),
            };
            observers.iter_mut().try_for_each(|o| o.on_step(&event))?;
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok((loss_sum / seen.max(1) as f64, correct_sum / seen.max(1) as f64, seconds, seen))
    }

    /// Mean loss and accuracy on the test split (or its first `test_limit` samples).
    pub fn evaluate(&mut self) -> Result<(f64, f64)> {
        let indices = self.test_indices();
        let n = indices.len();
        let options = LoaderOptions {
            batch_size: self.spec.recipe.batch,
            depth: self.options.prefetch.max(1),
            ..LoaderOptions::default()
        };
        let loader = Loader::spawn(Arc::clone(&self.data.test), indices, options)?;
        let (mut loss_sum, mut correct_sum) = (0.0, 0.0);
        for batch in loader {
            let len = batch.len();
            let (input, labels) = batch_values(batch)?;
            let (loss, correct) = self.runner.evaluate(&input, &labels)?;
            loss_sum += loss * len as f64;
            correct_sum += correct;
        }
        Ok((loss_sum / n.max(1) as f64, correct_sum / n.max(1) as f64))
    }
}

/// Mean loss and accuracy of the eval graph `graph` (state from `workspace`, data input
/// `input`) on the samples `indices`, in batches of `batch` built `prefetch` ahead.
pub fn evaluate(
    workspace: &mut dyn Workspace,
    graph: GraphId,
    input: &str,
    samples: &Arc<Samples>,
    indices: Vec<usize>,
    batch: usize,
    prefetch: usize,
) -> Result<(f64, f64)> {
    let n = indices.len();
    let options = LoaderOptions { batch_size: batch, depth: prefetch.max(1), ..LoaderOptions::default() };
    let loader = Loader::spawn(Arc::clone(samples), indices, options)?;
    let (mut loss_sum, mut correct_sum) = (0.0, 0.0);
    for batch in loader {
        let len = batch.len();
        let (input_value, labels) = batch_values(batch)?;
        let outputs = workspace.run(graph, &[(input, &input_value), ("labels", &labels)])?;
        let (loss, correct) = loss_and_correct(&outputs)?;
        loss_sum += loss * len as f64;
        correct_sum += correct;
    }
    Ok((loss_sum / n.max(1) as f64, correct_sum / n.max(1) as f64))
}

/// The progress bar of an epoch (`len` updates), or a hidden one when `show` is false.
pub fn progress_bar(show: bool, len: u64, prefix: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed_precise}<{eta} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(prefix.to_string());
    bar
}

/// The samples of a split a run uses: all `n` in order, or `limit` of them drawn once
/// from the seed (a split stored by class, like SpamAssassin's, has no representative
/// prefix), in increasing order.
pub fn subset(n: usize, limit: Option<usize>, seed: u64) -> Vec<usize> {
    match limit {
        Some(l) if l < n => {
            let mut picked: Vec<usize> = epoch_order(n, seed, u64::MAX).into_iter().take(l).collect();
            picked.sort_unstable();
            picked
        }
        _ => (0..n).collect(),
    }
}

/// A model's name for titles: its file stem.
pub fn model_label(model: &str) -> String {
    Path::new(model).file_stem().map_or(model.to_string(), |s| s.to_string_lossy().into_owned())
}

/// The epoch (0-based) update `t` of `total` falls in, for a run of `epochs` equal epochs.
fn epoch_of(t: u64, total: u64, epochs: usize) -> usize {
    let per_epoch = (total / epochs.max(1) as u64).max(1);
    ((t / per_epoch) as usize).min(epochs.saturating_sub(1))
}

/// A per-update dropout seed: a function of the run's seed and the update index, so a
/// resumed run draws the same masks.
pub fn dropout_seed(seed: u64, step: u64) -> i64 {
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (z >> 33) as i64
}

/// A batch as engine values, taking its buffers.
pub fn batch_values(batch: Batch) -> Result<(Value, Value)> {
    let shape = IxDyn(&batch.shape);
    let bad = |e: ndarray::ShapeError| TrainError::Config(format!("batch of shape {:?}: {e}", batch.shape));
    let len = batch.indices.len();
    let input = match batch.inputs {
        Inputs::F32(v) => Value::F32(ArrayD::from_shape_vec(shape, v).map_err(bad)?),
        Inputs::I64(v) => Value::I64(ArrayD::from_shape_vec(shape, v).map_err(bad)?),
    };
    let mut label_shape = vec![len];
    label_shape.extend(&batch.label_dims);
    let labels = Value::I64(ArrayD::from_shape_vec(IxDyn(&label_shape), batch.labels).map_err(bad)?);
    Ok((input, labels))
}

/// The `loss` and `correct` outputs of a run as numbers (no `correct` output: 0).
pub fn loss_and_correct(outputs: &[(String, Value)]) -> Result<(f64, f64)> {
    let find = |name: &str| outputs.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let loss = find(LOSS).ok_or_else(|| TrainError::Config("the graph has no loss output".into()))?;
    let correct = match find(CORRECT) {
        Some(c) => scalar(CORRECT, c)?,
        None => 0.0,
    };
    Ok((scalar(LOSS, loss)?, correct))
}

/// What [`preflight`] found right about a new run: its dataset, opened.
pub struct Checked {
    data: Splits,
}

/// Checks, before a new run writes anything, what [`Trainer::open`] would find wrong with
/// it: the engine and its provider are available, the model has one data input, and the
/// dataset is there, readable, and fits the model's input shape and classes. A failure
/// here leaves no run folder behind to block the corrected command.
pub fn preflight(run: &crate::NewRun, options: &TrainOptions) -> Result<Checked> {
    edgefreeze_engine::check_available(&options.engine, &options.engine_options)?;
    let manifest = run.manifest();
    data_input(manifest)?;
    let data = open_data(&run.spec().data, || Ok(run.forward()?.into_owned()), manifest, options)?;
    check_fit(&data, manifest)?;
    Ok(Checked { data })
}

/// The model's one data input (edgefreeze train feeds exactly one).
fn data_input(manifest: &Manifest) -> Result<String> {
    match manifest.data_inputs.as_slice() {
        [one] => Ok(one.name.clone()),
        many => Err(TrainError::Config(format!(
            "the model has {} data inputs ({}); edgefreeze train feeds exactly one{}",
            many.len(),
            many.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
            // Hugging Face exports add the mask (and token types) beside the token ids;
            // `prepare_run` computes them from the ids when it imports an .onnx file for a
            // text dataset, so only a converted folder or other inputs get here.
            if many.iter().any(|p| p.name.contains("attention_mask") || p.name.contains("token_type_ids")) {
                ": train the .onnx file itself on a text dataset (edgefreeze then computes attention_mask, \
                 token_type_ids and position_ids from input_ids), or export the model with its token ids alone"
            } else {
                ""
            }
        ))),
    }
}

/// Opens the run's dataset; text datasets take their sequence length from the model's
/// input and their vocabulary size from its embedding table (`forward` gives the model).
pub fn open_data(
    name: &str,
    forward: impl FnOnce() -> Result<edgefreeze_graph::Model>,
    manifest: &Manifest,
    options: &TrainOptions,
) -> Result<Splits> {
    let mut open = OpenOptions { npm_prefix: options.npm_prefix.clone(), ..OpenOptions::default() };
    if let Some(input) = manifest.data_inputs.first()
        && input.dtype == "i64"
    {
        if let Some(len) = input.shape.get(1).and_then(|d| d.as_u64()) {
            open.seq_len = len as usize;
        }
        let model = forward()?;
        if let Some(v) = crate::run::embedding_rows(&model, &input.name) {
            open.vocab_size = v;
        }
    }
    Ok(fit_layout(open_with(name, &open)?, manifest))
}

/// The dataset laid out as the model's data input takes it: images batched channels last
/// where the model takes `[H, W, C]` of the dataset's `[C, H, W]` (Keras and TensorFlow
/// models, converted by tf2onnx, do), as they are otherwise; [`check_fit`] judges the rest.
fn fit_layout(data: Splits, manifest: &Manifest) -> Splits {
    let Some(input) = manifest.data_inputs.first() else { return data };
    let wanted = sample_dims(input);
    let fits = |shape: &[usize]| takes(&wanted, shape);
    let have = data.train.sample_shape();
    let images = matches!(*data.train, Samples::Images { .. });
    if images && have.len() == 3 && !fits(&have) && fits(&[have[1], have[2], have[0]]) {
        data.channels_last()
    } else {
        data
    }
}

/// The sizes of one sample the model's data input takes (`None`: any), batch axis left out.
fn sample_dims(input: &Port) -> Vec<Option<u64>> {
    input.shape.iter().skip(1).map(|d| d.as_u64()).collect()
}

/// Whether a sample of shape `shape` fits the sizes `wanted` ([`sample_dims`]).
fn takes(wanted: &[Option<u64>], shape: &[usize]) -> bool {
    wanted.len() == shape.len() && wanted.iter().zip(shape).all(|(w, h)| w.is_none_or(|w| w as usize == *h))
}

/// Checks that samples have the shape the model's input takes and labels fit its classes.
pub fn check_fit(data: &Splits, manifest: &Manifest) -> Result<()> {
    let input = &manifest.data_inputs[0];
    // Batches of any size reach the graphs (the last one of an epoch or of the test set is
    // short), so a fixed first axis fails on some batch whatever the recipe says: the
    // import made a fixed batch of 1 variable wherever it could prove that safe.
    if let Some(fixed) = input.shape.first().and_then(|d| d.as_u64()) {
        return Err(TrainError::Config(format!(
            "the model's input {:?} has a fixed batch size of {fixed}: the ONNX file was exported without a \
             dynamic batch axis{}. Re-export it with one: torch.onnx.export(..., dynamic_axes={{\"{}\": {{0: \
             \"batch\"}}}}) (TorchScript) or dynamic_shapes=({{0: torch.export.Dim(\"batch\")}},) (dynamo)",
            input.name,
            if fixed == 1 { " and a node keeps it fixed in the graph (`edgefreeze inspect` names it)" } else { "" },
            input.name,
        )));
    }
    let wanted = sample_dims(input);
    let have = data.train.sample_shape();
    let fits = takes(&wanted, &have);
    let shape_text = |dims: &[Option<u64>]| {
        dims.iter().map(|d| d.map_or("?".to_string(), |n| n.to_string())).collect::<Vec<_>>().join("×")
    };
    if !fits {
        return Err(TrainError::Config(format!(
            "dataset {} gives samples of shape {} but the model's input {:?} takes {}",
            data.name,
            have.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("×"),
            input.name,
            shape_text(&wanted)
        )));
    }
    // Class labels: one per sample, or one per pixel of a segmentation dataset, as the
    // loss's labels input takes them (the class axis of the logits is 1 either way).
    let labels = manifest.eval.inputs.iter().find(|p| p.name == LABELS);
    let class_labels = labels.is_some_and(|p| p.dtype == "i64");
    if let Some(labels) = labels.filter(|_| class_labels) {
        let wanted = sample_dims(labels);
        let have = data.train.label_dims();
        if !takes(&wanted, &have) {
            let per = |dims: &[Option<u64>]| match dims {
                [] => "one label per sample".to_string(),
                dims => format!("labels of shape {} per sample", shape_text(dims)),
            };
            let have_dims: Vec<Option<u64>> = have.iter().map(|&d| Some(d as u64)).collect();
            return Err(TrainError::Config(format!(
                "dataset {} gives {} but the model's loss takes {}{}",
                data.name,
                per(&have_dims),
                per(&wanted),
                if have.is_empty() && !wanted.is_empty() {
                    " (a class map per pixel: train it on a segmentation dataset, such as fashion-mnist-seg)"
                } else if wanted.is_empty() {
                    " (one class per sample: a segmentation dataset needs a model that outputs a class map per pixel)"
                } else {
                    ""
                }
            )));
        }
    }
    // A label outside the classes that the loss does not ignore would train every class
    // towards zero there: the dataset's unlabelled pixels need the loss to ignore them.
    if let Some(unlabelled) = data.unlabelled.filter(|_| class_labels) {
        let ignored = match edgefreeze_autodiff::artifacts::parse_loss(&manifest.loss) {
            Ok(edgefreeze_autodiff::Loss::CrossEntropy { ignore_index, .. }) => ignore_index,
            _ => None,
        };
        if ignored != Some(unlabelled) {
            return Err(TrainError::Config(format!(
                "dataset {} labels the pixels it leaves unlabelled {unlabelled}, which the loss {:?} does not ignore: \
                 train with --loss cross-entropy:ignore={unlabelled}",
                data.name, manifest.loss
            )));
        }
    }
    let output = manifest.eval.outputs.last();
    let classes = if class_labels { output.and_then(|o| o.shape.get(1)) } else { output.and_then(|o| o.shape.last()) }
        .and_then(|d| d.as_u64());
    if let Some(classes) = classes
        && (classes as usize) < data.classes
    {
        return Err(TrainError::Config(format!(
            "dataset {} has {} classes but the model predicts {classes}",
            data.name, data.classes
        )));
    }
    Ok(())
}
