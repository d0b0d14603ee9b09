//! The edge side of a split, run on the device itself: the fall-back when no edge server
//! is left (`device train --alone-if-no-edge`), and the in-process edge of the exactness
//! tests.
//!
//! It computes what `edgefreeze edge serve` computes for a session, in the same
//! arithmetic: each micro-batch's parameter gradients are summed weighted by its counted
//! labels in f64, and the update feeds their mean over the step's counted labels, as f32, with a
//! gradient scale of 1. So a run that falls back to it goes on as it would have on a
//! server with the same engine.

use crate::error::{DeviceError, Result};
use crate::pipeline::{Download, EdgeTimes, Link, Tag, Upload};
use edgefreeze_autodiff::artifacts::Side;
use edgefreeze_autodiff::loss::LABELS;
use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
use edgefreeze_autodiff::training::{CORRECT, LOSS, UPDATED_PREFIX, grad_name};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_autodiff::{GRAD_SCALE, Loss};
use edgefreeze_engine::{EngineKind, EngineOptions, GraphId, StateUpdates, Value, Workspace};
use edgefreeze_graph::Model;
use edgefreeze_graph::save::encode_model;
use edgefreeze_rewrite::{ACTIVATION, SplitGraphs};
use edgefreeze_wire::convert::counted_labels;
use std::collections::VecDeque;

/// One parameter's gradient sum over the micro-batches of a step.
struct Sum {
    /// The edge step's output with the parameter's gradient.
    output: String,
    shape: Vec<usize>,
    sum: Vec<f64>,
}

/// The edge side of a split in a workspace of the device's engine.
pub struct LocalEdge {
    workspace: Box<dyn Workspace>,
    step: GraphId,
    apply: GraphId,
    state: Vec<String>,
    sums: Vec<Sum>,
    /// The step's counted labels so far (`edgefreeze_wire::convert::counted_labels`).
    counted: f64,
    /// The run's loss: which labels count (every one, unless it ignores some).
    loss: Loss,
    takes_dropout_seed: bool,
    replies: VecDeque<Download>,
    /// The answer to the update requested last, until it is read.
    update: Option<Result<Tag>>,
}

impl LocalEdge {
    /// The edge side of `graphs` with its state taken by name from `state` (the whole
    /// model's state, or the edge's), weighting micro-batches by the labels `loss` counts.
    pub fn new(
        graphs: &SplitGraphs,
        state: &[(String, Value)],
        engine: &EngineKind,
        options: &EngineOptions,
        loss: &Loss,
    ) -> Result<LocalEdge> {
        let mut workspace = edgefreeze_engine::workspace(engine, options)?;
        let names: Vec<String> =
            graphs.manifest.state.iter().filter(|e| e.side == Some(Side::Edge)).map(|e| e.name.clone()).collect();
        for name in &names {
            let value = state.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).ok_or_else(|| {
                DeviceError::Config(format!("no value of edge state {name:?} to run the edge side with"))
            })?;
            workspace.set_state(name, value)?;
        }
        let mut load = |model: &Model| -> Result<GraphId> {
            let outputs: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
            let updates = StateUpdates::where_output_exists(UPDATED_PREFIX, names.iter().map(String::as_str), &outputs);
            Ok(workspace.load_graph(&encode_model(model), updates)?)
        };
        let step = load(&graphs.edge_step)?;
        let apply = load(&graphs.edge_apply)?;
        let mut sums = Vec::new();
        for name in &names {
            let output = grad_name(name);
            if workspace.outputs(step).contains(&output) {
                let shape = workspace.state(name)?.shape().to_vec();
                let len = shape.iter().product();
                sums.push(Sum { output, shape, sum: vec![0.0; len] });
            }
        }
        let takes_dropout_seed = workspace.inputs(step).iter().any(|i| i == DROPOUT_SEED);
        Ok(LocalEdge {
            workspace,
            step,
            apply,
            state: names,
            sums,
            counted: 0.0,
            loss: loss.clone(),
            takes_dropout_seed,
            replies: VecDeque::new(),
            update: None,
        })
    }

    /// Whether the edge side has Dropout (each micro-batch needs a seed).
    pub fn takes_dropout_seed(&self) -> bool {
        self.takes_dropout_seed
    }

    /// The edge side's state, copied out, sorted by name as the edge server's FetchState
    /// answers it.
    pub fn state(&self) -> Result<Vec<(String, Value)>> {
        let mut state: Vec<(String, Value)> =
            self.state.iter().map(|n| Ok((n.clone(), self.workspace.state(n)?))).collect::<Result<_>>()?;
        state.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(state)
    }
}

fn scalar(name: &str, value: &Value) -> Result<f64> {
    match value {
        Value::F32(a) if a.len() == 1 => Ok(f64::from(a.iter().copied().next().unwrap_or(f32::NAN))),
        other => {
            Err(DeviceError::Config(format!("edge output {name}: expected an f32 scalar, got {:?}", other.shape())))
        }
    }
}

impl Link for LocalEdge {
    fn send(&mut self, up: Upload) -> Result<()> {
        let weight = counted_labels(&self.loss, &up.labels);
        let seed = up.dropout_seed.map(Value::scalar_i64);
        let mut inputs: Vec<(&str, &Value)> = vec![(ACTIVATION, &up.activation), (LABELS, &up.labels)];
        match (&seed, self.takes_dropout_seed) {
            (Some(seed), true) => inputs.push((DROPOUT_SEED, seed)),
            (None, true) => return Err(DeviceError::Config("the edge side has Dropout: a seed is needed".into())),
            _ => {}
        }
        let outputs = self.workspace.run(self.step, &inputs)?;
        let (mut loss, mut correct, mut grad_activation) = (None, None, None);
        for (name, value) in outputs {
            if name == LOSS {
                loss = Some(scalar(&name, &value)?);
            } else if name == CORRECT {
                // A count, or (labels per pixel) a float in samples.
                correct = Some(edgefreeze_train::tensors::scalar(&name, &value)?);
            } else if name == grad_name(ACTIVATION) {
                grad_activation = Some(value);
            } else if let Some(sum) = self.sums.iter_mut().find(|s| s.output == name) {
                let grad = value.as_f32().filter(|g| g.shape() == sum.shape.as_slice()).ok_or_else(|| {
                    DeviceError::Config(format!(
                        "edge output {name}: shape {:?}, expected {:?}",
                        value.shape(),
                        sum.shape
                    ))
                })?;
                for (s, &g) in sum.sum.iter_mut().zip(grad.iter()) {
                    *s += weight * f64::from(g);
                }
            }
        }
        self.counted += weight;
        self.replies.push_back(Download {
            tag: up.tag,
            loss: loss.ok_or_else(|| DeviceError::Config("the edge step computed no loss".into()))?,
            correct: correct.unwrap_or(0.0),
            grad_activation,
            edge: EdgeTimes::default(),
            arrived_us: None,
        });
        Ok(())
    }

    fn recv(&mut self) -> Result<Download> {
        self.replies.pop_front().ok_or_else(|| DeviceError::Config("no micro-batch is waiting for its reply".into()))
    }

    fn request_update(&mut self, tag: &Tag, lr: f64, _checkpoint: bool) -> Result<()> {
        // Every micro-batch ran in `send`: the update can run now.
        let answer = self.apply_update(tag, lr);
        self.update = Some(answer);
        Ok(())
    }

    fn update_answer(&mut self) -> Result<Tag> {
        self.update.take().unwrap_or_else(|| Err(DeviceError::Config("no update was requested".into())))
    }
}

impl LocalEdge {
    /// Applies the summed gradients of the step `tag.step` → the tag of the next step.
    fn apply_update(&mut self, tag: &Tag, lr: f64) -> Result<Tag> {
        // Nothing counted: every micro-batch's loss and gradient were 0.
        let total = if self.counted > 0.0 { self.counted } else { 1.0 };
        let mut grads = Vec::with_capacity(self.sums.len());
        for s in &mut self.sums {
            let mean: Vec<f32> = s.sum.iter().map(|&x| (x / total) as f32).collect();
            s.sum.iter_mut().for_each(|x| *x = 0.0);
            let array = ndarray::ArrayD::from_shape_vec(s.shape.clone(), mean)
                .map_err(|e| DeviceError::Config(format!("gradient {}: {e}", s.output)))?;
            grads.push((s.output.clone(), Value::F32(array)));
        }
        self.counted = 0.0;
        let (lr, scale) = (Value::scalar_f32(lr as f32), Value::scalar_f32(1.0));
        let step = Value::scalar_i64(i64::try_from(tag.step + 1).unwrap_or(i64::MAX));
        // The input names are copied so the feeds can borrow them while the workspace runs.
        let inputs: Vec<String> = self.workspace.inputs(self.apply).to_vec();
        let mut feeds: Vec<(&str, &Value)> = Vec::new();
        for input in &inputs {
            if self.state.contains(input) {
                continue;
            }
            let value = match input.as_str() {
                LEARNING_RATE => &lr,
                GRAD_SCALE => &scale,
                STEP => &step,
                other => grads.iter().find(|(n, _)| n == other).map(|(_, v)| v).ok_or_else(|| {
                    DeviceError::Config(format!("the edge apply graph reads {other}, which the edge side lacks"))
                })?,
            };
            feeds.push((input.as_str(), value));
        }
        self.workspace.run(self.apply, &feeds)?;
        Ok(Tag { step: tag.step + 1, ..tag.clone() })
    }
}
