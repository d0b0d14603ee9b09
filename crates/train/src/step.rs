//! The step runner: one engine workspace, the graphs one update runs, and the switch
//! between graph sets in the middle of a run.
//!
//! The workspace keeps every state tensor by name (parameters, optimizer state,
//! BatchNorm statistics, frozen parameters). A graph set only decides which of them an
//! update reads and which it rewrites, so [`StepRunner::switch`] keeps every tensor: the
//! optimizer state of layers that stay active, the statistics, and the frozen
//! parameters (which become plain inputs of the new graphs).

use crate::error::{Result, TrainError};
use crate::tensors::scalar;
use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
use edgefreeze_autodiff::training::{CORRECT, LOSS, UPDATED_PREFIX};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_engine::{GraphId, StateUpdates, Value, Workspace};
use ndarray::{ArrayD, Axis, IxDyn};

/// Where cached activations of a frozen prefix are kept (implemented by the freezing
/// crate's activation cache). Keys are training-sample indices: a store is only used
/// when the prefix input is a pure function of the sample.
pub trait ActivationStore: Send {
    /// The cached activation of a sample, if present and intact.
    fn get(&mut self, sample: u64) -> std::result::Result<Option<Vec<f32>>, String>;
    /// Stores the activation of a sample.
    fn insert(&mut self, sample: u64, values: &[f32]) -> std::result::Result<(), String>;
    /// Makes everything stored so far survive the process (called before a checkpoint).
    fn persist(&mut self) -> std::result::Result<(), String>;
    /// The samples of the next update, told before the current one runs, so a store can
    /// read their activations ahead while the step computes. A hint only: `get` must
    /// give the same answers whether or not it was called.
    fn prefetch(&mut self, samples: &[u64]);
    /// Sizes and counters, in words, for logs.
    fn describe(&self) -> String;
}

/// What one update runs.
pub enum StepGraphs {
    /// One training-step graph (ONNX bytes).
    Whole(Vec<u8>),
    /// A prefix graph (inputs → `activation`, inference only) whose outputs are cached
    /// per sample, then a suffix training-step graph that reads `activation`.
    Cached {
        /// The prefix graph.
        prefix: Vec<u8>,
        /// The suffix training step.
        suffix: Vec<u8>,
        /// The name of the prefix output and suffix input.
        activation: String,
        /// The activation's shape per sample (without the batch).
        sample_shape: Vec<usize>,
        /// The cache.
        store: Box<dyn ActivationStore>,
    },
}

/// A set of graphs for the updates to come.
pub struct GraphSet {
    /// In words, for logs ("layers 0..3 frozen", "cached after layer 2").
    pub label: String,
    /// What an ordinary update runs.
    pub step: StepGraphs,
    /// A whole training step, with extra outputs, that updates the controller asks to
    /// observe run instead (None: `step` already gives them).
    pub observing: Option<Vec<u8>>,
}

/// The result of one update.
#[derive(Debug, Clone)]
pub struct StepOutputs {
    /// Mean loss of the batch.
    pub loss: f64,
    /// Correct predictions in the batch.
    pub correct: f64,
    /// Every other output that came back to the host (probes).
    pub extra: Vec<(String, Value)>,
}

/// The scalars an update takes besides the batch.
#[derive(Debug, Clone, Copy)]
pub struct StepScalars {
    /// Learning rate.
    pub lr: f64,
    /// The update's number, from 1.
    pub step: u64,
    /// The dropout seed of this update.
    pub dropout_seed: i64,
}

struct Graph {
    id: GraphId,
    inputs: Vec<String>,
}

enum Loaded {
    Whole(Graph),
    Cached {
        prefix: Graph,
        suffix: Graph,
        activation: String,
        sample_shape: Vec<usize>,
        store: Box<dyn ActivationStore>,
    },
}

/// Owns the workspace and the current graphs.
pub struct StepRunner {
    workspace: Box<dyn Workspace>,
    state_names: Vec<String>,
    input: String,
    label: String,
    step: Loaded,
    observing: Option<Graph>,
    eval: GraphId,
}

impl StepRunner {
    /// A runner on `workspace` whose state tensors are `state_names`, feeding data input
    /// `input`, with a training step and an eval graph (ONNX bytes).
    pub fn new(
        mut workspace: Box<dyn Workspace>,
        state_names: Vec<String>,
        input: String,
        train_step: &[u8],
        eval: &[u8],
    ) -> Result<StepRunner> {
        let eval = workspace.load_graph(eval, StateUpdates::none())?;
        let step = Loaded::Whole(load(workspace.as_mut(), &state_names, train_step)?);
        Ok(StepRunner {
            workspace,
            state_names,
            input,
            label: "converted training step".into(),
            step,
            observing: None,
            eval,
        })
    }

    /// Switches to another graph set; every state tensor stays in the workspace.
    pub fn switch(&mut self, graphs: GraphSet) -> Result<()> {
        let ws = self.workspace.as_mut();
        let step = match graphs.step {
            StepGraphs::Whole(bytes) => Loaded::Whole(load(ws, &self.state_names, &bytes)?),
            StepGraphs::Cached { prefix, suffix, activation, sample_shape, store } => Loaded::Cached {
                prefix: load(ws, &self.state_names, &prefix)?,
                suffix: load(ws, &self.state_names, &suffix)?,
                activation,
                sample_shape,
                store,
            },
        };
        let observing = graphs.observing.map(|b| load(ws, &self.state_names, &b)).transpose()?;
        // The new graphs loaded; the old ones are freed (compiled plans, sessions and
        // their bound buffers), so a run that switches often does not pile them up.
        let old_step = std::mem::replace(&mut self.step, step);
        let old_observing = std::mem::replace(&mut self.observing, observing);
        let old_ids = match &old_step {
            Loaded::Whole(g) => vec![g.id],
            Loaded::Cached { prefix, suffix, .. } => vec![prefix.id, suffix.id],
        };
        for id in old_ids.into_iter().chain(old_observing.map(|g| g.id)) {
            self.workspace.unload_graph(id)?;
        }
        self.label = graphs.label;
        Ok(())
    }

    /// Graphs loaded in the workspace now (the eval graph included).
    pub fn loaded_graphs(&self) -> usize {
        self.workspace.loaded_graphs()
    }

    /// The current graph set, in words.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The activation store in use, if the current set caches.
    pub fn store(&self) -> Option<&dyn ActivationStore> {
        match &self.step {
            Loaded::Cached { store, .. } => Some(store.as_ref()),
            Loaded::Whole(_) => None,
        }
    }

    /// Tells the activation store, if any, which samples the next update takes.
    pub fn prefetch(&mut self, indices: &[usize]) {
        if let Loaded::Cached { store, .. } = &mut self.step {
            store.prefetch(&indices.iter().map(|&i| i as u64).collect::<Vec<_>>());
        }
    }

    /// Persists the activation store, if any.
    pub fn persist_store(&mut self) -> Result<()> {
        if let Loaded::Cached { store, .. } = &mut self.step {
            store.persist().map_err(TrainError::Config)?;
        }
        Ok(())
    }

    /// Runs one update on a batch (`indices` are its samples); `observe` runs the
    /// observing graph when there is one.
    pub fn step(
        &mut self,
        input: &Value,
        labels: &Value,
        indices: &[usize],
        scalars: StepScalars,
        observe: bool,
    ) -> Result<StepOutputs> {
        let lr = Value::scalar_f32(scalars.lr as f32);
        let step = Value::scalar_i64(scalars.step as i64);
        let seed = Value::scalar_i64(scalars.dropout_seed);
        let common = [("labels", labels), (LEARNING_RATE, &lr), (STEP, &step), (DROPOUT_SEED, &seed)];
        let ws = self.workspace.as_mut();
        let outputs = match (&mut self.step, &self.observing) {
            (_, Some(g)) if observe => run(ws, g, (self.input.as_str(), input), &common)?,
            (Loaded::Whole(g), _) => run(ws, g, (self.input.as_str(), input), &common)?,
            (Loaded::Cached { prefix, suffix, activation, sample_shape, store }, _) => {
                let names = (self.input.as_str(), activation.as_str());
                let act = cached_activation(ws, prefix, names, input, sample_shape, indices, store.as_mut())?;
                // A suffix behind a cut with side inputs reads the batch's input too.
                let mut common = common.to_vec();
                common.push((self.input.as_str(), input));
                run(ws, suffix, (activation.as_str(), &act), &common)?
            }
        };
        let find = |name: &str| outputs.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let loss = find(LOSS).ok_or_else(|| TrainError::Config("the graph has no loss output".into()))?;
        let correct = match find(CORRECT) {
            Some(c) => scalar(CORRECT, c)?,
            None => 0.0,
        };
        let loss = scalar(LOSS, loss)?;
        let extra = outputs.into_iter().filter(|(n, _)| n != LOSS && n != CORRECT).collect();
        Ok(StepOutputs { loss, correct, extra })
    }

    /// Runs the eval graph on a batch → (mean loss, correct predictions).
    pub fn evaluate(&mut self, input: &Value, labels: &Value) -> Result<(f64, f64)> {
        let outputs = self.workspace.run(self.eval, &[(self.input.as_str(), input), ("labels", labels)])?;
        let find = |name: &str| outputs.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let loss = scalar(LOSS, find(LOSS).ok_or_else(|| TrainError::Config("the eval graph has no loss".into()))?)?;
        let correct = match find(CORRECT) {
            Some(c) => scalar(CORRECT, c)?,
            None => 0.0,
        };
        Ok((loss, correct))
    }

    /// Copies a state tensor out of the engine.
    pub fn state(&self, name: &str) -> Result<Value> {
        Ok(self.workspace.state(name)?)
    }

    /// Puts a state tensor into the engine.
    pub fn set_state(&mut self, name: &str, value: Value) -> Result<()> {
        Ok(self.workspace.set_state(name, value)?)
    }

    /// Whether the current training step reads `name` (the step counter, the dropout seed...).
    pub fn takes(&self, name: &str) -> bool {
        match &self.step {
            Loaded::Whole(g) => g.inputs.iter().any(|i| i == name),
            Loaded::Cached { suffix, .. } => suffix.inputs.iter().any(|i| i == name),
        }
    }
}

/// Loads a graph whose `updated.<state>` outputs replace their state tensors.
fn load(ws: &mut dyn Workspace, state_names: &[String], bytes: &[u8]) -> Result<Graph> {
    let model = edgefreeze_graph::parse_model(bytes, None)?;
    let outputs: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let updates = StateUpdates::where_output_exists(UPDATED_PREFIX, state_names.iter().map(String::as_str), &outputs);
    let id = ws.load_graph(bytes, updates)?;
    Ok(Graph { id, inputs: ws.inputs(id).to_vec() })
}

/// Runs a graph, feeding the data input and whichever of the common scalars it takes.
fn run(
    ws: &mut dyn Workspace,
    g: &Graph,
    data: (&str, &Value),
    common: &[(&str, &Value)],
) -> Result<Vec<(String, Value)>> {
    let mut feeds = vec![data];
    feeds.extend(common.iter().filter(|(n, _)| g.inputs.iter().any(|i| i == n)).copied());
    Ok(ws.run(g.id, &feeds)?)
}

/// The prefix activation of a batch: cached rows where present and intact, the prefix
/// graph's where not (those are stored).
fn cached_activation(
    ws: &mut dyn Workspace,
    prefix: &Graph,
    (input_name, activation): (&str, &str),
    input: &Value,
    sample_shape: &[usize],
    indices: &[usize],
    store: &mut dyn ActivationStore,
) -> Result<Value> {
    let mut rows: Vec<Option<Vec<f32>>> = Vec::with_capacity(indices.len());
    for &i in indices {
        rows.push(store.get(i as u64).map_err(TrainError::Config)?);
    }
    let fresh = if rows.iter().any(Option::is_none) {
        let out = run(ws, prefix, (input_name, input), &[])?;
        let value = out
            .into_iter()
            .find(|(n, _)| n == activation)
            .map(|(_, v)| v)
            .ok_or_else(|| TrainError::Config(format!("the prefix graph has no output {activation:?}")))?;
        let a = value.as_f32().cloned().ok_or_else(|| TrainError::Config(format!("{activation:?} is not f32")))?;
        if a.shape()[1..] != *sample_shape {
            return Err(TrainError::Config(format!(
                "the prefix graph gives {activation:?} of shape {:?} per sample, the cache holds {sample_shape:?}",
                &a.shape()[1..]
            )));
        }
        Some(a)
    } else {
        None
    };
    let mut data = Vec::with_capacity(indices.len() * sample_shape.iter().product::<usize>());
    for (k, row) in rows.into_iter().enumerate() {
        match row {
            Some(r) => data.extend(r),
            None => {
                let a = fresh.as_ref().expect("computed when a row is missing");
                let r: Vec<f32> = a.index_axis(Axis(0), k).iter().copied().collect();
                store.insert(indices[k] as u64, &r).map_err(TrainError::Config)?;
                data.extend(r);
            }
        }
    }
    let dims = [&[indices.len()][..], sample_shape].concat();
    Ok(Value::F32(ArrayD::from_shape_vec(IxDyn(&dims), data).map_err(|e| TrainError::Config(e.to_string()))?))
}
