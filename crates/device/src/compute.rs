//! The device's share of the model on an engine: the split's device forward, device
//! backward and device apply-update graphs in one [`Workspace`], whose store holds the
//! device's parameters, optimizer state and BatchNorm statistics.
//!
//! Which tensor goes where is read from the graphs' own inputs and outputs, by name:
//! an input that is a state tensor is read from the store; an output `updated.<s>` of a
//! state tensor replaces it (BatchNorm statistics after each forward, everything the
//! optimizer touches after the apply); the backward's other inputs are the activation's
//! gradient and what the forward stashed for it (outputs it names as inputs), or the
//! micro-batch's inputs when it recomputes the forward.

use crate::error::{DeviceError, Result};
use crate::pipeline::{DeviceSide, GradientSum, MicroBatch};
use edgefreeze_engine::{EngineKind, EngineOptions, GraphId, StateUpdates, Value, Workspace};
use edgefreeze_graph::ir::Model;
use edgefreeze_graph::save::encode_model;
use std::collections::HashSet;

pub use edgefreeze_autodiff::GRAD_SCALE;
pub use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
pub use edgefreeze_autodiff::training::{GRAD_PREFIX, UPDATED_PREFIX};
pub use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
pub use edgefreeze_rewrite::ACTIVATION;

/// The device's graphs and its initial state.
pub struct DeviceGraphs {
    /// Data input(s) → activation, stashed tensors, new BatchNorm statistics.
    pub forward: Model,
    /// Activation gradient + stash (or inputs) → parameter gradients; none when the
    /// device's layers are frozen.
    pub backward: Option<Model>,
    /// Parameters, optimizer state, summed gradients, learning rate → new values; none
    /// when the device's layers are frozen.
    pub apply: Option<Model>,
    /// Every device state tensor with its initial (or checkpointed) value.
    pub state: Vec<(String, Value)>,
}

/// The device side on an engine.
pub struct GraphDevice {
    workspace: Box<dyn Workspace>,
    forward: GraphId,
    backward: Option<GraphId>,
    apply: Option<GraphId>,
    input: String,
    state: Vec<String>,
    /// Non-state inputs of the backward other than the activation gradient.
    backward_feeds: Vec<String>,
    grads: GradientSum,
}

/// What the backward of one micro-batch needs: named tensors from its forward (or its
/// inputs).
pub type Stash = Vec<(String, Value)>;

fn takes(workspace: &dyn Workspace, graph: GraphId, name: &str) -> bool {
    workspace.inputs(graph).iter().any(|i| i == name)
}

impl GraphDevice {
    /// Loads the graphs on `engine` and puts the state into its store. `input` is the
    /// model's data input.
    pub fn new(graphs: DeviceGraphs, input: &str, engine: &EngineKind, options: &EngineOptions) -> Result<GraphDevice> {
        let mut workspace = edgefreeze_engine::workspace(engine, options)?;
        let state: Vec<String> = graphs.state.iter().map(|(n, _)| n.clone()).collect();
        for (name, value) in graphs.state {
            workspace.set_state(&name, value)?;
        }
        let mut load = |model: &Model| -> Result<GraphId> {
            let outputs: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
            let updates = StateUpdates::where_output_exists(UPDATED_PREFIX, state.iter().map(String::as_str), &outputs);
            Ok(workspace.load_graph(&encode_model(model), updates)?)
        };
        let forward = load(&graphs.forward)?;
        let backward = graphs.backward.as_ref().map(&mut load).transpose()?;
        let apply = graphs.apply.as_ref().map(&mut load).transpose()?;
        if !workspace.outputs(forward).iter().any(|o| o == ACTIVATION) {
            return Err(DeviceError::Config(format!("the device forward graph has no output {ACTIVATION:?}")));
        }
        let state_set: HashSet<&str> = state.iter().map(String::as_str).collect();
        let mut backward_feeds = Vec::new();
        let grad_activation = edgefreeze_rewrite::grad_activation_name();
        if let Some(b) = backward {
            let forward_outputs = workspace.outputs(forward);
            for name in workspace.inputs(b) {
                if state_set.contains(name.as_str()) || *name == grad_activation {
                    continue;
                }
                if name != input && name != DROPOUT_SEED && !forward_outputs.contains(name) {
                    return Err(DeviceError::Config(format!(
                        "the device backward graph reads {name:?}, which is neither state, the activation's \
                         gradient, an output of the device forward nor the input {input:?}"
                    )));
                }
                backward_feeds.push(name.clone());
            }
        }
        Ok(GraphDevice {
            workspace,
            forward,
            backward,
            apply,
            input: input.to_string(),
            state,
            backward_feeds,
            grads: GradientSum::default(),
        })
    }

    /// Copies the device's state out of the engine, in the order it was given.
    pub fn state(&self) -> Result<Vec<(String, Value)>> {
        self.state.iter().map(|n| Ok((n.clone(), self.workspace.state(n)?))).collect()
    }

    /// Puts a state copied out by [`GraphDevice::state`] back (a fail-over rolls the device
    /// back to its last consistent step) and drops any half-accumulated gradients.
    pub fn restore(&mut self, state: &[(String, Value)]) -> Result<()> {
        for name in &self.state {
            if !state.iter().any(|(n, _)| n == name) {
                return Err(DeviceError::Config(format!("the state to restore has no tensor {name:?}")));
            }
        }
        for (name, value) in state {
            if !self.state.contains(name) {
                return Err(DeviceError::Config(format!("{name:?} is not device state")));
            }
            self.workspace.set_state(name, value.clone())?;
        }
        self.grads = GradientSum::default();
        Ok(())
    }
}

impl DeviceSide for GraphDevice {
    type Stash = Stash;

    fn forward(&mut self, mb: &MicroBatch) -> Result<(Value, Stash)> {
        let seed = mb.dropout_seed.map(Value::scalar_i64);
        let mut feeds: Vec<(&str, &Value)> = vec![(self.input.as_str(), &mb.input)];
        if let Some(seed) = &seed
            && takes(self.workspace.as_ref(), self.forward, DROPOUT_SEED)
        {
            feeds.push((DROPOUT_SEED, seed));
        }
        let outputs = self.workspace.run(self.forward, &feeds)?;
        let mut activation = None;
        let mut stash = Vec::new();
        for (name, value) in outputs {
            if name == ACTIVATION {
                activation = Some(value);
            } else if self.backward_feeds.contains(&name) {
                stash.push((name, value));
            }
        }
        for name in &self.backward_feeds {
            if *name == self.input {
                stash.push((name.clone(), mb.input.clone()));
            } else if name == DROPOUT_SEED {
                let seed = seed.clone().ok_or_else(|| {
                    DeviceError::Config("the device backward graph takes a dropout seed but none was given".into())
                })?;
                stash.push((name.clone(), seed));
            }
        }
        let activation = activation.ok_or_else(|| DeviceError::Config(format!("no {ACTIVATION:?} output")))?;
        Ok((activation, stash))
    }

    fn backward(&mut self, stash: Stash, grad_activation: Value, weight: f64) -> Result<()> {
        let graph = self.backward.ok_or_else(|| DeviceError::Config("the device has no backward graph".into()))?;
        let name = edgefreeze_rewrite::grad_activation_name();
        let mut feeds: Vec<(&str, &Value)> = vec![(name.as_str(), &grad_activation)];
        feeds.extend(stash.iter().map(|(n, v)| (n.as_str(), v)));
        for (name, grad) in self.workspace.run(graph, &feeds)? {
            if name.starts_with(GRAD_PREFIX) {
                self.grads.add(&name, &grad, weight)?;
            }
        }
        Ok(())
    }

    fn apply(&mut self, lr: f64, update: u64) -> Result<()> {
        let graph = self.apply.ok_or_else(|| DeviceError::Config("the device has no apply-update graph".into()))?;
        let sums = self.grads.take();
        let lr = Value::scalar_f32(lr as f32);
        let step = Value::scalar_i64(update as i64);
        // The sums are already the batch's mean gradient (each micro-batch weighted by its
        // share of the batch), so the apply graph's scale is 1.
        let scale = Value::scalar_f32(1.0);
        let mut feeds: Vec<(&str, &Value)> = sums.iter().map(|(n, v)| (n.as_str(), v)).collect();
        feeds.push((LEARNING_RATE, &lr));
        if takes(self.workspace.as_ref(), graph, STEP) {
            feeds.push((STEP, &step));
        }
        if takes(self.workspace.as_ref(), graph, GRAD_SCALE) {
            feeds.push((GRAD_SCALE, &scale));
        }
        self.workspace.run(graph, &feeds)?;
        Ok(())
    }
}
