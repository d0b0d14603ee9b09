//! Where freezing saves time: the training step at each frozen depth, measured, next to
//! what the model's FLOP count predicts.
//!
//! With forward FLOPs `F` in all and `F≥k` in layers `k..`, and a backward pass costing
//! about twice its forward (an input and a weight gradient per layer), a whole step
//! costs about `3F`. Freezing layers `0..k` drops their backward pass:
//! `F + 2·F≥k`. Caching their output as well drops their forward pass: `3·F≥k`. So the
//! predictions, relative to the measured step at depth 0, are
//! `(F + 2·F≥k) / 3F` (frozen prefix) and `F≥k / F` (cached suffix). The model ignores
//! what FLOPs do not count — memory traffic, element-wise ops, the optimizer update —
//! which is why it is worth checking against measurements.

use crate::error::{FreezeError, Result};
use edgefreeze_autodiff::artifacts::convert;
use edgefreeze_autodiff::training::UPDATED_PREFIX;
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec};
use edgefreeze_engine::{EngineKind, EngineOptions, StateUpdates, Value, Workspace};
use edgefreeze_graph::analysis::analyse;
use edgefreeze_graph::ir::Model;
use edgefreeze_rewrite::{StepSpec, activation_name, frozen_prefix_step, suffix_step};
use edgefreeze_train::bench::{BenchOptions, synthetic_batch, time_steps};
use ndarray::{ArrayD, IxDyn};

/// The step at one frozen depth.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DepthTime {
    /// Layers `0..depth` frozen.
    pub depth: usize,
    /// Forward FLOPs per sample of layers `depth..`.
    pub flops_after: u64,
    /// Median step time of the frozen-prefix step, ms.
    pub frozen_ms: f64,
    /// Its FLOP-model prediction, ms (from the measured depth-0 step).
    pub frozen_predicted_ms: f64,
    /// Median step time of the suffix step behind the cut after layer `depth − 1`, ms
    /// (None at depth 0, or where that is not a cut).
    pub cached_ms: Option<f64>,
    /// Its FLOP-model prediction, ms.
    pub cached_predicted_ms: Option<f64>,
}

/// Measures the training step of `model` at each of `depths` frozen layers (and the
/// cached suffix step where the depth ends at a cut), on synthetic batches of `batch`,
/// with SGD momentum 0.9 and cross-entropy. Depth 0 is always measured first: the
/// predictions scale from it.
pub fn step_times(
    model: &Model,
    engine: &EngineKind,
    engine_options: &EngineOptions,
    batch: usize,
    depths: &[usize],
    options: &BenchOptions,
) -> Result<Vec<DepthTime>> {
    let analysis = analyse(model)?;
    let layers = analysis.layers.len();
    if let Some(&d) = depths.iter().find(|&&d| d >= layers) {
        return Err(FreezeError::Config(format!(
            "cannot freeze {d} layers of a model with {layers} (at most {})",
            layers - 1
        )));
    }
    let loss = Loss::cross_entropy();
    let optimizer = Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 };
    let training = TrainingSpec { loss: loss.clone(), optimizer: optimizer.clone(), frozen: Vec::new() };
    let artifacts = convert(model, "depths", &training, 0, ("cross-entropy", "sgd", 0.01))
        .map_err(|e| FreezeError::Config(e.to_string()))?;
    let spec = StepSpec { loss, optimizer };
    let mut ws = edgefreeze_engine::workspace(engine, engine_options)?;
    let state_names: Vec<&str> = artifacts.state.iter().map(|(n, _)| n.as_str()).collect();
    let to_err = |e: edgefreeze_train::TrainError| FreezeError::Config(e.to_string());
    let (input, labels) = synthetic_batch(model, batch).map_err(to_err)?;
    let input_name = model.graph.inputs[0].name.clone();
    let total: u64 = analysis.layers.iter().map(|l| l.flops).sum::<u64>().max(1);
    let mut order: Vec<usize> = std::iter::once(0).chain(depths.iter().copied().filter(|&d| d > 0)).collect();
    order.dedup();
    let mut base_ms = None;
    let mut out = Vec::new();
    for depth in order {
        let after: u64 = analysis.layers[depth..].iter().map(|l| l.flops).sum();
        let step = frozen_prefix_step(model, &spec, depth, &[]).map_err(|e| FreezeError::Reference(e.to_string()))?;
        let frozen_ms =
            time_one(ws.as_mut(), &artifacts.state, &state_names, &step, &[(&input_name, &input)], &labels, options)?;
        let base = *base_ms.get_or_insert(frozen_ms);
        let ratio = after as f64 / total as f64;
        let cut = depth.checked_sub(1).and_then(|c| analysis.cuts.iter().find(|k| k.after_layer == c));
        let (cached_ms, cached_predicted_ms) = match cut {
            Some(cut) => {
                let suffix =
                    suffix_step(model, cut.after_layer, &spec).map_err(|e| FreezeError::Reference(e.to_string()))?;
                let mut dims = vec![batch];
                for d in &cut.shape[1..] {
                    dims.push(d.fixed().ok_or_else(|| {
                        FreezeError::Config(format!(
                            "the activation after layer {} has no fixed shape",
                            cut.after_layer
                        ))
                    })?);
                }
                let n: usize = dims.iter().product();
                let act = Value::F32(
                    ArrayD::from_shape_vec(IxDyn(&dims), (0..n).map(|i| ((i * 7919) % 997) as f32 / 997.0).collect())
                        .expect("sized above"),
                );
                // Behind a cut with side inputs the suffix reads the batch's input too.
                let mut data = vec![(activation_name(), &act)];
                if cut.side_inputs.contains(&input_name) {
                    data.push((input_name.as_str(), &input));
                }
                let ms = time_one(ws.as_mut(), &artifacts.state, &state_names, &suffix, &data, &labels, options)?;
                (Some(ms), Some(base * ratio))
            }
            None => (None, None),
        };
        out.push(DepthTime {
            depth,
            flops_after: after,
            frozen_ms,
            frozen_predicted_ms: base * (1.0 + 2.0 * ratio) / 3.0,
            cached_ms,
            cached_predicted_ms,
        });
    }
    Ok(out)
}

/// Loads `graph` with the initial state, times it, and frees it → median ms.
fn time_one(
    ws: &mut dyn Workspace,
    state: &[(String, edgefreeze_graph::Tensor)],
    state_names: &[&str],
    graph: &Model,
    data: &[(&str, &Value)],
    labels: &Value,
    options: &BenchOptions,
) -> Result<f64> {
    for (name, tensor) in state {
        let v = edgefreeze_train::tensors::value_from_tensor(name, tensor)
            .map_err(|e| FreezeError::Config(e.to_string()))?;
        ws.set_state(name, v)?;
    }
    let outputs: Vec<String> = graph.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let updates = StateUpdates::where_output_exists(UPDATED_PREFIX, state_names.iter().copied(), &outputs);
    let id = ws.load_graph(&edgefreeze_graph::save::encode_model(graph), updates)?;
    let mut feeds = data.to_vec();
    feeds.push(("labels", labels));
    let timed = time_steps(ws, id, &feeds, options).map_err(|e| FreezeError::Config(e.to_string()));
    ws.unload_graph(id)?;
    Ok(timed?.1 * 1e3)
}
