//! Frozen-prefix training steps with probe outputs, and the cached-activation pair
//! (prefix graph, suffix step) at a cut.

use crate::cut::{ACTIVATION, Parts, cut_model};
use crate::error::{Result, RewriteError};
use edgefreeze_autodiff::artifacts::{GraphEntry, Port, frozen_prefix_options, graph_entry, port};
use edgefreeze_autodiff::training::{assemble, emitter_for, param_info, split_parameters};
use edgefreeze_autodiff::training_mode::rewrite_for_training;
use edgefreeze_autodiff::{Loss, Objective, Optimizer, StepOptions, TrainingSpec, step_graph};
use edgefreeze_graph::analysis::analyse;
use edgefreeze_graph::infer::infer;
use edgefreeze_graph::ir::Model;
use std::collections::{BTreeSet, HashSet};

/// What a training step optimizes and how.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    /// The objective.
    pub loss: Loss,
    /// The optimizer.
    pub optimizer: Optimizer,
}

/// Name of the probe output of layer `layer`: the activation at the boundary after it.
pub fn probe_name(layer: usize) -> String {
    format!("probe.{layer}")
}

/// The training step in which layers `0..frozen_layers` get no backward pass and no
/// update.
///
/// Every parameter and running statistic is a graph input (frozen ones too), so moving the
/// frozen depth only swaps graphs, never re-encodes weights. Frozen layers run in
/// inference mode: BatchNorm normalizes with its running statistics and leaves them
/// unchanged (no `updated.*` output), Dropout is off. The front's output is then a pure
/// function of the input and the frozen parameters, which is what makes caching it
/// exact ([`prefix_graph`]). Each layer `l` in `probes` adds the output
/// [`probe_name`]`(l)`: the activation after layer `l` in this very forward pass.
pub fn frozen_prefix_step(model: &Model, spec: &StepSpec, frozen_layers: usize, probes: &[usize]) -> Result<Model> {
    let analysis = analyse(model)?;
    let layers = analysis.layers.len();
    if frozen_layers > layers {
        return Err(RewriteError::FreezeDepth { asked: frozen_layers, layers });
    }
    let training = TrainingSpec { loss: spec.loss.clone(), optimizer: spec.optimizer.clone(), frozen: Vec::new() };
    let mut options = frozen_prefix_options(model, &analysis, &training, frozen_layers)?;
    options.extra_outputs = probe_outputs(model, &analysis, probes, 0)?;
    Ok(step_graph(model, "train_step", &options)?)
}

/// The (layer output, [`probe_name`]) pairs of `probes`, each a layer from `first` on.
fn probe_outputs(
    model: &Model,
    analysis: &edgefreeze_graph::Analysis,
    probes: &[usize],
    first: usize,
) -> Result<Vec<(String, String)>> {
    let layers = analysis.layers.len();
    let probes: BTreeSet<usize> = probes.iter().copied().collect();
    if let Some(&layer) = probes.iter().find(|&&l| l >= layers || l < first) {
        return Err(RewriteError::Probe { layer, first, layers });
    }
    let existing = crate::subgraph::value_names(&model.graph);
    let mut outputs = Vec::new();
    for l in probes {
        let name = probe_name(l);
        if existing.contains(name.as_str()) {
            return Err(RewriteError::NameTaken(name));
        }
        outputs.push((analysis.layers[l].output.clone(), name));
    }
    Ok(outputs)
}

/// The front of a model in inference mode, as frozen layers run it: (data inputs,
/// parameters, running statistics) → `output`.
pub(crate) fn inference_forward(front: &Model, name: &str, output: &str) -> Result<Model> {
    let split = split_parameters(front, &[])?;
    let types = infer(&front.graph, front.opset())?;
    let mut e = emitter_for(front, &split.trainable);
    let every: HashSet<String> = front.graph.nodes.iter().map(|n| n.name.clone()).collect();
    let forward = rewrite_for_training(&front.graph.nodes, &types, &mut e, &every)?;
    let mut inputs = front.graph.inputs.clone();
    let mut moved = HashSet::new();
    for p in split.trainable.iter().chain(&split.buffers) {
        inputs.push(param_info(front, p));
        moved.insert(p.clone());
    }
    let bindings = vec![(output.to_string(), output.to_string())];
    Ok(assemble(front, name, forward.nodes, inputs, bindings, &moved)?)
}

/// The prefix graph of the cached-activation pair at cut `cut` (after layer `cut`):
/// (data inputs, front parameters and running statistics) → [`ACTIVATION`], inference
/// only, with BatchNorm in the mode of frozen layers (running statistics).
pub fn prefix_graph(model: &Model, cut: usize) -> Result<Model> {
    let parts = cut_model(model, cut)?;
    inference_forward(&parts.front, "prefix", ACTIVATION)
}

/// The suffix training step of the pair at cut `cut`: ([`ACTIVATION`], the cut's side
/// inputs, labels, learning rate, (step), back parameters, their optimizer state, back running statistics) →
/// (loss, correct, `updated.*` of the back's parameters, state and statistics). Run after
/// [`prefix_graph`] it makes the same step as [`frozen_prefix_step`] with
/// `frozen_layers = cut + 1`.
pub fn suffix_step(model: &Model, cut: usize, spec: &StepSpec) -> Result<Model> {
    suffix_step_of(&cut_model(model, cut)?, spec, &[])
}

/// [`suffix_step`] with probe outputs [`probe_name`]`(l)` for layers `l` behind the cut
/// (`cut < l < layers`), the same values the frozen-prefix step's probes give.
pub fn suffix_step_with_probes(model: &Model, cut: usize, spec: &StepSpec, probes: &[usize]) -> Result<Model> {
    suffix_step_of(&cut_model(model, cut)?, spec, probes)
}

/// A parameter the back shares with the front (tied weights) is frozen, as the
/// frozen-prefix step freezes it with the layer that first uses it.
fn suffix_step_of(parts: &Parts, spec: &StepSpec, probes: &[usize]) -> Result<Model> {
    let front: HashSet<String> = split_parameters(&parts.front, &[])?.trainable.into_iter().collect();
    let shared = split_parameters(&parts.back, &[])?.trainable.into_iter().filter(|p| front.contains(p)).collect();
    let back = &parts.back;
    let options = StepOptions {
        objective: Objective::Loss(spec.loss.clone()),
        optimizer: Some(spec.optimizer.clone()),
        frozen: shared,
        frozen_as_inputs: true,
        inference_nodes: HashSet::new(),
        input_gradients: Vec::new(),
        extra_outputs: probe_outputs(back, &parts.analysis, probes, parts.cut.after_layer + 1)?,
    };
    Ok(step_graph(back, "suffix_step", &options)?)
}

/// The cached-activation pair at a cut, as `edgefreeze convert --cache-at` writes it.
#[derive(Debug, Clone)]
pub struct CachedPair {
    /// [`prefix_graph`].
    pub prefix: Model,
    /// [`suffix_step`].
    pub suffix_step: Model,
    /// What `cache.json` holds.
    pub manifest: CacheManifest,
}

/// The manifest of a cached-activation pair (`cache.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CacheManifest {
    /// Format identifier.
    pub format: String,
    /// The cut: the boundary after this layer; the pair replaces the frozen-prefix step
    /// with `cut + 1` frozen layers.
    pub cut: usize,
    /// The activation at the cut.
    pub activation: Port,
    /// Bytes per sample of one cached activation.
    pub bytes_per_sample: u64,
    /// The model inputs the suffix step reads beside the activation (the cut's side
    /// inputs): fed from the batch, never cached.
    #[serde(default)]
    pub side_inputs: Vec<Port>,
    /// The prefix graph.
    pub prefix: GraphEntry,
    /// The suffix step.
    pub suffix_step: GraphEntry,
}

/// File names of a cached pair.
pub mod cache_files {
    /// The prefix graph.
    pub const PREFIX: &str = "prefix.onnx";
    /// The suffix step.
    pub const SUFFIX_STEP: &str = "suffix_step.onnx";
    /// The manifest.
    pub const MANIFEST: &str = "cache.json";
}

/// Builds the cached-activation pair at `cut`.
pub fn cached_pair(model: &Model, cut: usize, spec: &StepSpec) -> Result<CachedPair> {
    let parts = cut_model(model, cut)?;
    let prefix = inference_forward(&parts.front, "prefix", ACTIVATION)?;
    let suffix_step = suffix_step_of(&parts, spec, &[])?;
    let activation = prefix.graph.outputs.iter().find(|v| v.name == ACTIVATION).map(port);
    let manifest = CacheManifest {
        format: "edgefreeze-cache/1".into(),
        cut,
        activation: activation.ok_or_else(|| RewriteError::NoValue(ACTIVATION.into()))?,
        bytes_per_sample: parts.cut.bytes_per_sample,
        side_inputs: suffix_step
            .graph
            .inputs
            .iter()
            .filter(|v| parts.cut.side_inputs.contains(&v.name))
            .map(port)
            .collect(),
        prefix: graph_entry(cache_files::PREFIX, &prefix),
        suffix_step: graph_entry(cache_files::SUFFIX_STEP, &suffix_step),
    };
    Ok(CachedPair { prefix, suffix_step, manifest })
}

impl CachedPair {
    /// Writes both graphs and `cache.json` into `dir` (created if missing).
    pub fn write(&self, dir: &std::path::Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| RewriteError::Write(format!("cannot create {}: {e}", dir.display())))?;
        edgefreeze_graph::save_model(&self.prefix, dir.join(cache_files::PREFIX), &Default::default())?;
        edgefreeze_graph::save_model(&self.suffix_step, dir.join(cache_files::SUFFIX_STEP), &Default::default())?;
        let json = serde_json::to_vec_pretty(&self.manifest).map_err(|e| RewriteError::Write(e.to_string()))?;
        edgefreeze_graph::save::write_atomically(&dir.join(cache_files::MANIFEST), &json)?;
        Ok(())
    }
}
