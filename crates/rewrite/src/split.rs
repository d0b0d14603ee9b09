//! The device/edge split at a cut (EdgeMove): a device forward, an edge step, a device
//! backward and one optimizer graph per side, for a pipeline that accumulates gradients
//! over micro-batches before it updates.

use crate::cut::{ACTIVATION, Parts, cut_model};
use crate::error::{Result, RewriteError};
use crate::frozen::{StepSpec, inference_forward};
use crate::subgraph::{extract, needed_nodes};
use edgefreeze_autodiff::artifacts::{GraphEntry, Port, Role, Side, StateEntry, graph_entry, initial_state, port};
use edgefreeze_autodiff::training::{grad_name, split_parameters};
use edgefreeze_autodiff::{GRAD_SCALE, Objective, StepOptions, step_graph, update_graph};
use edgefreeze_graph::Tensor;
use edgefreeze_graph::analysis::is_metadata_input;
use edgefreeze_graph::ir::{Model, ValueInfo};
use std::collections::{HashMap, HashSet};

/// Name of the gradient of the activation: the edge step's output, the device backward's input.
pub fn grad_activation_name() -> String {
    grad_name(ACTIVATION)
}

/// Prefix of the tensors the device forward keeps for the device backward.
pub const STASH_PREFIX: &str = "stash.";

/// How to split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitOptions {
    /// The device's layers are frozen (Egeria's prefix, or `--freeze`): the device
    /// forward runs in inference mode, there is no device backward and no device
    /// update, and the edge sends no gradient back.
    pub frozen_device_layers: bool,
    /// The device backward recomputes the device forward from the inputs instead of
    /// reading tensors the forward stashed.
    pub recompute: bool,
}

/// What a graph of the split set does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GraphRole {
    /// Data inputs → activation (+ stash, + updated device statistics).
    DeviceForward,
    /// Activation, labels → loss, correct, activation gradient, edge gradients.
    EdgeStep,
    /// Activation gradient + stash (or inputs) → device gradients.
    DeviceBackward,
    /// The edge optimizer from accumulated gradients.
    EdgeApply,
    /// The device optimizer from accumulated gradients.
    DeviceApply,
}

impl GraphRole {
    /// The file the graph is written to.
    pub fn file(self) -> &'static str {
        match self {
            GraphRole::DeviceForward => "device_forward.onnx",
            GraphRole::EdgeStep => "edge_step.onnx",
            GraphRole::DeviceBackward => "device_backward.onnx",
            GraphRole::EdgeApply => "edge_apply.onnx",
            GraphRole::DeviceApply => "device_apply.onnx",
        }
    }

    /// The machine that runs it.
    pub fn side(self) -> Side {
        match self {
            GraphRole::DeviceForward | GraphRole::DeviceBackward | GraphRole::DeviceApply => Side::Device,
            GraphRole::EdgeStep | GraphRole::EdgeApply => Side::Edge,
        }
    }
}

/// One graph of a split set in its manifest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SplitGraphEntry {
    /// What it does.
    pub role: GraphRole,
    /// Where it runs.
    pub side: Side,
    /// File, ports, node and op counts.
    #[serde(flatten)]
    pub graph: GraphEntry,
}

/// The manifest of a split set (`split.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SplitManifest {
    /// Format identifier.
    pub format: String,
    /// The cut: the boundary after this layer.
    pub cut: usize,
    /// The split options.
    pub options: SplitOptions,
    /// The activation that crosses the cut (name, element type, shape).
    pub activation: Port,
    /// Bytes per sample sent device → edge: the activation and the label.
    pub bytes_per_sample_up: u64,
    /// Bytes per sample sent edge → device: the activation gradient (0 when the device is frozen).
    pub bytes_per_sample_down: u64,
    /// Name of the apply graphs' gradient-scale input (1/M for M accumulated micro-batches).
    pub grad_scale: String,
    /// The tensors the device forward stashes for the device backward, as its outputs name them.
    pub stash: Vec<Port>,
    /// The graphs.
    pub graphs: Vec<SplitGraphEntry>,
    /// Every state tensor with its role, layer and side, in `state.safetensors` order.
    pub state: Vec<StateEntry>,
}

/// The split set, in memory.
#[derive(Debug, Clone)]
pub struct SplitGraphs {
    /// Data inputs and device state → activation, stash, updated device statistics.
    pub device_forward: Model,
    /// Activation, labels and edge state → loss, correct, gradients, updated edge statistics.
    pub edge_step: Model,
    /// Activation gradient, stash (or inputs) and device parameters → device gradients.
    pub device_backward: Option<Model>,
    /// The edge optimizer.
    pub edge_apply: Model,
    /// The device optimizer.
    pub device_apply: Option<Model>,
    /// The manifest.
    pub manifest: SplitManifest,
    /// Initial state tensors, in manifest order.
    pub state: Vec<(String, Tensor)>,
}

/// Splits `model` after layer `cut` into the graphs of device/edge training.
///
/// Each side is its part of the inference model, differentiated on its own: the edge
/// from the loss, with the activation's gradient as an output; the device from that
/// gradient, fed as input [`grad_activation_name`]. BatchNorm normalises with each
/// micro-batch's own statistics and updates the running statistics once per micro-batch
/// (the pipeline runs micro-batches in order), as local training on the same
/// micro-batches would. The edge step and device backward output gradients of their
/// micro-batch's mean loss; the apply graphs multiply the sum of M of them by
/// [`GRAD_SCALE`] (feed 1/M) before the optimizer step.
pub fn split(model: &Model, cut: usize, spec: &StepSpec, options: SplitOptions) -> Result<SplitGraphs> {
    let parts = cut_model(model, cut)?;
    if !parts.cut.side_inputs.is_empty() {
        return Err(RewriteError::SideInputs {
            cut,
            inputs: parts.cut.side_inputs.clone(),
            splittable: parts
                .analysis
                .cuts
                .iter()
                .filter(|c| c.side_inputs.is_empty())
                .map(|c| c.after_layer)
                .collect(),
        });
    }
    check_disjoint(&parts)?;
    let device_params = split_parameters(&parts.front, &[])?;
    let edge_params = split_parameters(&parts.back, &[])?;
    let frozen = options.frozen_device_layers;

    let edge_step = step_graph(
        &parts.back,
        "edge_step",
        &StepOptions {
            objective: Objective::Loss(spec.loss.clone()),
            optimizer: None,
            frozen: Vec::new(),
            frozen_as_inputs: true,
            inference_nodes: HashSet::new(),
            input_gradients: if frozen { Vec::new() } else { vec![ACTIVATION.to_string()] },
            extra_outputs: Vec::new(),
        },
    )?;
    let edge_apply = update_graph(&parts.back, &spec.optimizer, &edge_params.trainable)?;

    let (device_forward, device_backward, device_apply, stash) = if frozen {
        (inference_forward(&parts.front, "device_forward", ACTIVATION)?, None, None, Vec::new())
    } else {
        let (forward, backward, stash) = device_pass(&parts, options.recompute)?;
        let apply = update_graph(&parts.front, &spec.optimizer, &device_params.trainable)?;
        (forward, Some(backward), Some(apply), stash)
    };

    let mut tensors = Vec::new();
    let device_role = if frozen { Role::Frozen } else { Role::Parameter };
    tensors.extend(device_params.trainable.iter().map(|p| (p.clone(), device_role)));
    tensors.extend(device_params.buffers.iter().map(|b| (b.clone(), Role::Buffer)));
    let (mut entries, mut state) =
        initial_state(&parts.front, &parts.analysis, &spec.optimizer, &tensors, Some(Side::Device))?;
    let mut tensors: Vec<(String, Role)> = edge_params.trainable.iter().map(|p| (p.clone(), Role::Parameter)).collect();
    tensors.extend(edge_params.buffers.iter().map(|b| (b.clone(), Role::Buffer)));
    let (edge_entries, edge_state) =
        initial_state(&parts.back, &parts.analysis, &spec.optimizer, &tensors, Some(Side::Edge))?;
    entries.extend(edge_entries);
    state.extend(edge_state);

    let activation = device_forward
        .graph
        .outputs
        .iter()
        .find(|v| v.name == ACTIVATION)
        .map(port)
        .ok_or_else(|| RewriteError::NoValue(ACTIVATION.into()))?;
    let label_bytes =
        edge_step.graph.inputs.iter().find(|v| v.name == edgefreeze_autodiff::loss::LABELS).map_or(0, per_sample_bytes);
    let up = parts.cut.bytes_per_sample + label_bytes;
    let down = if frozen { 0 } else { parts.cut.bytes_per_sample };
    let manifest = SplitManifest {
        format: "edgefreeze-split/1".into(),
        cut,
        options,
        activation,
        bytes_per_sample_up: up,
        bytes_per_sample_down: down,
        grad_scale: GRAD_SCALE.into(),
        stash: stash.iter().map(port).collect(),
        graphs: Vec::new(),
        state: entries,
    };
    let mut set = SplitGraphs { device_forward, edge_step, device_backward, edge_apply, device_apply, manifest, state };
    set.manifest.graphs = set
        .graphs()
        .iter()
        .map(|(role, m)| SplitGraphEntry { role: *role, side: role.side(), graph: graph_entry(role.file(), m) })
        .collect();
    Ok(set)
}

fn per_sample_bytes(v: &ValueInfo) -> u64 {
    let elements = v
        .shape
        .as_ref()
        .map_or(1, |s| s.iter().skip(1).fold(1u64, |a, d| a.saturating_mul(d.fixed().unwrap_or(1) as u64)));
    elements * v.dtype.map_or(4, |d| d.size()) as u64
}

/// A trainable tensor read on both sides would be trained twice, by two optimizers.
fn check_disjoint(parts: &Parts) -> Result<()> {
    let front: HashSet<String> = split_parameters(&parts.front, &[])?.trainable.into_iter().collect();
    let back = split_parameters(&parts.back, &[])?;
    if let Some(shared) = back.trainable.iter().find(|p| front.contains(*p)) {
        return Err(RewriteError::SharedParameter { cut: parts.cut.after_layer, name: shared.clone() });
    }
    Ok(())
}

/// The device's forward and backward graphs and the stash between them.
///
/// One graph differentiates the front from the activation's gradient; its nodes that
/// the activation and the statistics need are the forward, the rest the backward. The
/// data-dependent values the backward reads from the forward are stashed (outputs
/// `stash.<value>` of the forward, inputs of the backward); values computed from
/// parameters alone are recomputed. With `recompute` nothing is stashed: the backward
/// takes the data inputs and runs the forward again.
fn device_pass(parts: &Parts, recompute: bool) -> Result<(Model, Model, Vec<ValueInfo>)> {
    let gradient = grad_activation_name();
    let joint = step_graph(
        &parts.front,
        "device",
        &StepOptions {
            objective: Objective::Seed { value: ACTIVATION.to_string(), gradient: gradient.clone() },
            optimizer: None,
            frozen: Vec::new(),
            frozen_as_inputs: true,
            inference_nodes: HashSet::new(),
            input_gradients: Vec::new(),
            extra_outputs: vec![(ACTIVATION.to_string(), ACTIVATION.to_string())],
        },
    )?;
    let outputs: Vec<String> = joint.graph.outputs.iter().map(|v| v.name.clone()).collect();
    let (grads, forward_outputs): (Vec<String>, Vec<String>) =
        outputs.into_iter().partition(|o| o.starts_with(edgefreeze_autodiff::training::GRAD_PREFIX));
    let pairs = |names: &[String]| names.iter().map(|n| (n.clone(), n.clone())).collect::<Vec<_>>();
    let forward_nodes = nodes_for(&joint, &forward_outputs);
    let stash: Vec<String> = if recompute {
        Vec::new()
    } else {
        let backward_nodes = nodes_for(&joint, &grads);
        // What varies per micro-batch: the data and the dropout seed; not the parameters.
        let mut per_batch: Vec<String> = parts.front.graph.inputs.iter().map(|v| v.name.clone()).collect();
        per_batch.push(edgefreeze_autodiff::training_mode::DROPOUT_SEED.to_string());
        let data = data_dependent(&joint, &per_batch, false);
        // Values computed from the data's shape only are not stashed: tract needs the
        // shapes a reshape reads at load time, so the backward computes them again from
        // the shapes of the stashed tensors they are taken of.
        let shaped = data_dependent(&joint, &per_batch, true);
        let producers = joint.graph.producers();
        let produced_forward: HashSet<&str> = forward_nodes
            .iter()
            .flat_map(|&i| joint.graph.nodes[i].outputs.iter().map(String::as_str))
            .chain(joint.graph.inputs.iter().map(|v| v.name.as_str()))
            .collect();
        let mut stash = Vec::new();
        for &i in backward_nodes.iter().filter(|i| !forward_nodes.contains(i)) {
            for v in &joint.graph.nodes[i].inputs {
                if !produced_forward.contains(v.as_str()) || *v == gradient {
                    continue;
                }
                let needed = if data.contains(v) {
                    vec![v.clone()]
                } else if shaped.contains(v) {
                    metadata_sources(&joint, &producers, v, &data)
                } else {
                    Vec::new()
                };
                for x in needed {
                    if !stash.contains(&x) {
                        stash.push(x);
                    }
                }
            }
        }
        stash
    };
    let stash_names: Vec<(String, String)> = stash.iter().map(|v| (v.clone(), format!("{STASH_PREFIX}{v}"))).collect();
    let mut forward_bindings = pairs(&forward_outputs);
    forward_bindings.extend(stash_names.iter().cloned());
    let forward = extract(&joint, "device_forward", &[], &forward_bindings)?;
    let mut backward = extract(&joint, "device_backward", &stash_names, &pairs(&grads))?;
    // The gradient is typed like the activation, whose dimensions the cut named where
    // inference lost them (engines need every input's shape).
    let activation = parts.front.graph.outputs.iter().find(|v| v.name == ACTIVATION);
    for input in backward.graph.inputs.iter_mut().filter(|v| v.name == gradient) {
        if let Some(a) = activation {
            input.shape.clone_from(&a.shape);
        }
    }
    let stash_ports = forward.graph.outputs.iter().filter(|v| v.name.starts_with(STASH_PREFIX)).cloned().collect();
    Ok((forward, backward, stash_ports))
}

/// Indices of the nodes the named outputs depend on.
fn nodes_for(model: &Model, outputs: &[String]) -> HashSet<usize> {
    let (keep, _) = needed_nodes(&model.graph, outputs.iter().map(String::as_str), &HashSet::new());
    keep.into_iter().enumerate().filter_map(|(i, k)| k.then_some(i)).collect()
}

/// Values that depend on the given data inputs: on their values, or with
/// `through_metadata` also on their shapes and element types.
fn data_dependent(model: &Model, inputs: &[String], through_metadata: bool) -> HashSet<String> {
    let mut data: HashSet<String> = inputs.iter().cloned().collect();
    for node in &model.graph.nodes {
        let reads = node
            .inputs
            .iter()
            .enumerate()
            .any(|(k, v)| data.contains(v) && (through_metadata || !is_metadata_input(node, k)));
        if reads {
            data.extend(node.outputs.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    data
}

/// The data values whose shape or type `value` (computed from the data's shapes only)
/// is computed from.
fn metadata_sources(
    model: &Model,
    producers: &HashMap<&str, usize>,
    value: &str,
    data: &HashSet<String>,
) -> Vec<String> {
    let mut sources = Vec::new();
    let mut todo = vec![value.to_string()];
    let mut seen: HashSet<String> = HashSet::new();
    while let Some(v) = todo.pop() {
        if !seen.insert(v.clone()) {
            continue;
        }
        let Some(&p) = producers.get(v.as_str()) else { continue };
        let node = &model.graph.nodes[p];
        for (k, input) in node.inputs.iter().enumerate().filter(|(_, i)| !i.is_empty()) {
            if data.contains(input) && is_metadata_input(node, k) {
                if !sources.contains(input) {
                    sources.push(input.clone());
                }
            } else {
                todo.push(input.clone());
            }
        }
    }
    sources
}

/// File names of a split set besides its graphs.
pub mod files {
    /// The initial state of both sides.
    pub const STATE: &str = "split_state.safetensors";
    /// The manifest.
    pub const MANIFEST: &str = "split.json";
}

impl SplitGraphs {
    /// The graphs with their roles, in manifest order.
    pub fn graphs(&self) -> Vec<(GraphRole, &Model)> {
        let mut graphs = vec![(GraphRole::DeviceForward, &self.device_forward), (GraphRole::EdgeStep, &self.edge_step)];
        if let Some(b) = &self.device_backward {
            graphs.push((GraphRole::DeviceBackward, b));
        }
        graphs.push((GraphRole::EdgeApply, &self.edge_apply));
        if let Some(a) = &self.device_apply {
            graphs.push((GraphRole::DeviceApply, a));
        }
        graphs
    }

    /// Writes every graph, the initial state and the manifest into `dir` (created if
    /// missing), each file atomically.
    pub fn write(&self, dir: &std::path::Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| RewriteError::Write(format!("cannot create {}: {e}", dir.display())))?;
        for (role, m) in self.graphs() {
            edgefreeze_graph::save_model(m, dir.join(role.file()), &Default::default())?;
        }
        let state = edgefreeze_autodiff::artifacts::state_to_safetensors(&self.state)?;
        edgefreeze_graph::save::write_atomically(&dir.join(files::STATE), &state)?;
        let json = serde_json::to_vec_pretty(&self.manifest).map_err(|e| RewriteError::Write(e.to_string()))?;
        edgefreeze_graph::save::write_atomically(&dir.join(files::MANIFEST), &json)?;
        Ok(())
    }
}
