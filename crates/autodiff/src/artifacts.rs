//! What `edgefreeze convert` writes: the three graphs, the initial training state
//! (parameters, optimizer state, BatchNorm statistics) and a manifest that tells a
//! trainer how to drive them.

use crate::error::{AutodiffError, Result};
use crate::loss::{LABELS, Loss};
use crate::optim::Optimizer;
use crate::training::{
    StepOptions, TrainingSpec, eval_graph, gradient_graph, split_parameters, state_name, step_graph,
};
use edgefreeze_graph::analysis::{Analysis, analyse};
use edgefreeze_graph::ir::{Dim, Model, ValueInfo};
use edgefreeze_graph::save::write_atomically;
use edgefreeze_graph::{DataType, SaveOptions, Tensor, save_model};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;

/// File names inside a converted folder.
pub mod files {
    /// The training-step graph.
    pub const TRAIN_STEP: &str = "train_step.onnx";
    /// The eval graph.
    pub const EVAL: &str = "eval.onnx";
    /// The gradient graph.
    pub const GRADIENT: &str = "grad.onnx";
    /// Initial parameters, optimizer state and buffers.
    pub const STATE: &str = "state.safetensors";
    /// The manifest.
    pub const MANIFEST: &str = "manifest.json";
    /// The inference model the graphs were built from (as imported), which `export`
    /// fills with trained weights.
    pub const FORWARD: &str = "model.onnx";
}

/// A graph input or output as the manifest lists it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Port {
    /// Value name.
    pub name: String,
    /// Element type (`f32`, `i64`...).
    pub dtype: String,
    /// Dimensions: numbers, or names for symbolic ones.
    pub shape: Vec<serde_json::Value>,
}

/// One graph of the set.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GraphEntry {
    /// File name in the folder.
    pub file: String,
    /// Inputs in order.
    pub inputs: Vec<Port>,
    /// Outputs in order.
    pub outputs: Vec<Port>,
    /// Number of nodes.
    pub nodes: usize,
    /// Op types used, with counts.
    pub ops: Vec<(String, usize)>,
}

/// What a tensor of the training state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A trainable parameter.
    Parameter,
    /// A parameter of a frozen layer: read, never updated.
    Frozen,
    /// Optimizer state of a trainable parameter (momentum, Adam moments).
    Optimizer,
    /// A BatchNorm running statistic.
    Buffer,
}

impl Role {
    /// The name used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Parameter => "parameter",
            Role::Frozen => "frozen",
            Role::Optimizer => "optimizer",
            Role::Buffer => "buffer",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which machine holds a state tensor in a device/edge split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The device (phone): the layers in front of the cut.
    Device,
    /// The edge server: the layers behind the cut.
    Edge,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Device => "device",
            Side::Edge => "edge",
        })
    }
}

/// A tensor of the training state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StateEntry {
    /// Name (the graph input that takes it; its new value is output `updated.<name>`).
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// What it is.
    pub role: Role,
    /// The layer whose parameter or running statistic it is (or whose parameter's
    /// optimizer state), when known.
    pub layer: Option<usize>,
    /// The machine that holds it, in a split manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<Side>,
}

/// Tensors with their names, in order.
pub type NamedTensors = Vec<(String, Tensor)>;

/// The layer of each parameter and running statistic of an analysis.
pub fn layer_of(analysis: &Analysis, name: &str) -> Option<usize> {
    analysis.layers.iter().position(|l| l.parameter_names.iter().chain(&l.buffer_names).any(|p| p == name))
}

/// The initial state of a set of tensors: each named tensor with its role, followed by
/// the zero optimizer state of each [`Role::Parameter`] (in [`StateEntry`] order:
/// parameters, optimizer state, then the rest as given).
pub fn initial_state(
    model: &Model,
    analysis: &Analysis,
    optimizer: &Optimizer,
    tensors: &[(String, Role)],
    side: Option<Side>,
) -> Result<(Vec<StateEntry>, NamedTensors)> {
    let initial = &model.graph.initializers;
    let mut entries = Vec::new();
    let mut state = Vec::new();
    let mut push = |name: String, t: Tensor, role: Role, layer: Option<usize>| {
        entries.push(StateEntry { name: name.clone(), shape: t.dims().to_vec(), role, layer, side });
        state.push((name, t));
    };
    let get = |name: &str| {
        initial.get(name).cloned().ok_or_else(|| AutodiffError::Parameter {
            name: name.into(),
            message: "no initializer has this name".into(),
        })
    };
    let params: Vec<&String> = tensors.iter().filter(|(_, r)| *r == Role::Parameter).map(|(n, _)| n).collect();
    for p in &params {
        push((*p).clone(), get(p)?, Role::Parameter, layer_of(analysis, p));
    }
    for p in &params {
        for prefix in optimizer.state_prefixes() {
            let t = get(p)?;
            let zeros = Tensor::from_f64_as(t.dtype(), t.dims().to_vec(), &vec![0.0; t.numel()])?;
            push(state_name(prefix, p), zeros, Role::Optimizer, layer_of(analysis, p));
        }
    }
    for (name, role) in tensors.iter().filter(|(_, r)| *r != Role::Parameter) {
        if *role == Role::Optimizer {
            return Err(AutodiffError::Config(format!("optimizer state {name:?} is made from its parameter")));
        }
        push(name.clone(), get(name)?, *role, layer_of(analysis, name));
    }
    Ok((entries, state))
}

/// The manifest of a converted model.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// Format identifier.
    pub format: String,
    /// The model it was converted from.
    pub source: String,
    /// Default-domain opset.
    pub opset: i64,
    /// Loss, as given on the command line.
    pub loss: String,
    /// Optimizer, as given on the command line.
    pub optimizer: String,
    /// Initial learning rate.
    pub learning_rate: f64,
    /// Number of leading layers frozen.
    pub frozen_layers: usize,
    /// Names of the data inputs.
    pub data_inputs: Vec<Port>,
    /// The labels input.
    pub labels: Option<Port>,
    /// The three graphs.
    pub train_step: GraphEntry,
    /// The eval graph.
    pub eval: GraphEntry,
    /// The gradient graph.
    pub gradient: GraphEntry,
    /// Nodes of the inference model, to compare with the training graph.
    pub forward_nodes: usize,
    /// Training state in `state.safetensors`, in order.
    pub state: Vec<StateEntry>,
    /// The layer analysis (layers and cuts).
    pub analysis: serde_json::Value,
}

/// The converted set, in memory.
pub struct Artifacts {
    /// The inference model, as imported.
    pub forward: Model,
    /// Training-step graph.
    pub train_step: Model,
    /// Eval graph.
    pub eval: Model,
    /// Gradient graph.
    pub gradient: Model,
    /// Initial state tensors, in manifest order.
    pub state: Vec<(String, Tensor)>,
    /// The manifest.
    pub manifest: Manifest,
}

/// The manifest entry of a value.
pub fn port(v: &ValueInfo) -> Port {
    Port {
        name: v.name.clone(),
        dtype: v.dtype.map_or("?".into(), |d| d.to_string()),
        shape: v
            .shape
            .as_ref()
            .map(|s| {
                s.iter()
                    .map(|d| match d {
                        Dim::Fixed(n) => serde_json::Value::from(*n),
                        Dim::Symbol(s) => serde_json::Value::from(s.clone()),
                        Dim::Unknown => serde_json::Value::Null,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The manifest entry of a graph written to `file`.
pub fn graph_entry(file: &str, m: &Model) -> GraphEntry {
    let mut ops: std::collections::BTreeMap<String, usize> = Default::default();
    for n in &m.graph.nodes {
        *ops.entry(n.op_type.clone()).or_default() += 1;
    }
    GraphEntry {
        file: file.into(),
        inputs: m.graph.inputs.iter().map(port).collect(),
        outputs: m.graph.outputs.iter().map(port).collect(),
        nodes: m.graph.nodes.len(),
        ops: ops.into_iter().collect(),
    }
}

/// The parameters of the first `layers` layers of an analysis.
pub fn parameters_of_leading_layers(analysis: &Analysis, layers: usize) -> Result<Vec<String>> {
    if layers > analysis.layers.len() {
        return Err(AutodiffError::Config(format!(
            "cannot freeze {layers} layers: the model has {}",
            analysis.layers.len()
        )));
    }
    Ok(analysis.layers[..layers].iter().flat_map(|l| l.parameter_names.iter().cloned()).collect())
}

/// `spec` with the parameters of the first `layers` layers added to its frozen ones.
fn with_leading_layers_frozen(analysis: &Analysis, spec: &TrainingSpec, layers: usize) -> Result<TrainingSpec> {
    let mut spec = spec.clone();
    let mut frozen: BTreeSet<String> = spec.frozen.iter().cloned().collect();
    frozen.extend(parameters_of_leading_layers(analysis, layers)?);
    spec.frozen = frozen.into_iter().collect();
    Ok(spec)
}

/// Names of the nodes of the first `layers` layers (all nodes when `layers` is the count).
pub fn nodes_of_leading_layers(model: &Model, analysis: &Analysis, layers: usize) -> HashSet<String> {
    let layers = layers.min(analysis.layers.len());
    analysis.layers[..layers].iter().flat_map(|l| l.nodes.iter().map(|&i| model.graph.nodes[i].name.clone())).collect()
}

/// The training step with the first `layers` layers frozen (the frozen-prefix step): they
/// get no backward and no update; they run in inference mode (BatchNorm from running
/// statistics, which it leaves as they are; Dropout off), so their output is a function
/// of their input alone; and their parameters and statistics are graph inputs read from
/// the state, so another depth needs no re-encoded weights.
pub fn frozen_prefix_options(
    model: &Model,
    analysis: &Analysis,
    spec: &TrainingSpec,
    layers: usize,
) -> Result<StepOptions> {
    let spec = with_leading_layers_frozen(analysis, spec, layers)?;
    let mut options = StepOptions::training(&spec);
    options.frozen_as_inputs = true;
    options.inference_nodes = nodes_of_leading_layers(model, analysis, layers);
    Ok(options)
}

/// Builds every graph and the initial state. `describe` carries the loss and optimizer
/// as the user wrote them, and the initial learning rate.
pub fn convert(
    model: &Model,
    source: &str,
    spec: &TrainingSpec,
    frozen_layers: usize,
    describe: (&str, &str, f64),
) -> Result<Artifacts> {
    let analysis = analyse(model)?;
    let train_step = step_graph(model, "train_step", &frozen_prefix_options(model, &analysis, spec, frozen_layers)?)?;
    let spec = with_leading_layers_frozen(&analysis, spec, frozen_layers)?;
    let eval = eval_graph(model, &spec.loss)?;
    let gradient = gradient_graph(model, &spec.loss, &spec.frozen)?;
    let split = split_parameters(model, &spec.frozen)?;
    let mut tensors: Vec<(String, Role)> = split.trainable.iter().map(|p| (p.clone(), Role::Parameter)).collect();
    tensors.extend(split.buffers.iter().map(|b| (b.clone(), Role::Buffer)));
    tensors.extend(split.frozen.iter().map(|p| (p.clone(), Role::Frozen)));
    let (entries, state) = initial_state(model, &analysis, &spec.optimizer, &tensors, None)?;
    let (loss, optimizer, learning_rate) = describe;
    let labels = train_step.graph.inputs.iter().find(|v| v.name == LABELS).map(port);
    let manifest = Manifest {
        format: "edgefreeze-training/1".into(),
        source: source.into(),
        opset: model.opset(),
        loss: loss.into(),
        optimizer: optimizer.into(),
        learning_rate,
        frozen_layers,
        data_inputs: model.graph.inputs.iter().map(port).collect(),
        labels,
        train_step: graph_entry(files::TRAIN_STEP, &train_step),
        eval: graph_entry(files::EVAL, &eval),
        gradient: graph_entry(files::GRADIENT, &gradient),
        forward_nodes: model.graph.nodes.len(),
        state: entries,
        analysis: serde_json::to_value(&analysis).map_err(|e| AutodiffError::Config(e.to_string()))?,
    };
    Ok(Artifacts { forward: model.clone(), train_step, eval, gradient, state, manifest })
}

/// Serialises state tensors to safetensors bytes.
pub fn state_to_safetensors(state: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut views = Vec::new();
    for (name, t) in state {
        let dtype = match t.dtype() {
            DataType::Float32 => safetensors::Dtype::F32,
            DataType::Float64 => safetensors::Dtype::F64,
            DataType::Int64 => safetensors::Dtype::I64,
            other => return Err(AutodiffError::Config(format!("state tensor {name:?} has unsupported type {other}"))),
        };
        let view = safetensors::tensor::TensorView::new(dtype, t.dims().to_vec(), t.raw_bytes())
            .map_err(|e| AutodiffError::Config(format!("state tensor {name:?}: {e}")))?;
        views.push((name.clone(), view));
    }
    safetensors::tensor::serialize(views, None)
        .map_err(|e| AutodiffError::Config(format!("cannot write the state: {e}")))
}

impl Artifacts {
    /// Writes every file into `dir` (created if missing), each atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|error| {
            AutodiffError::Graph(edgefreeze_graph::GraphError::Io { action: "create", path: dir.into(), error })
        })?;
        let options = SaveOptions::default();
        save_model(&self.forward, dir.join(files::FORWARD), &options)?;
        save_model(&self.train_step, dir.join(files::TRAIN_STEP), &options)?;
        save_model(&self.eval, dir.join(files::EVAL), &options)?;
        save_model(&self.gradient, dir.join(files::GRADIENT), &options)?;
        write_atomically(&dir.join(files::STATE), &state_to_safetensors(&self.state)?)?;
        let json = serde_json::to_vec_pretty(&self.manifest).map_err(|e| AutodiffError::Config(e.to_string()))?;
        write_atomically(&dir.join(files::MANIFEST), &json)?;
        Ok(())
    }
}

/// Parses `cross-entropy`, `cross-entropy:smoothing=0.1,ignore=255` or `mse`.
pub fn parse_loss(text: &str) -> Result<Loss> {
    let (kind, options) = text.split_once(':').unwrap_or((text, ""));
    let options = parse_options(options)?;
    let loss = match kind {
        "cross-entropy" | "ce" => {
            let label_smoothing = option(&options, &["smoothing", "label_smoothing"], 0.0)?;
            let ignore_index = match options.iter().find(|(k, _)| k == "ignore" || k == "ignore_index") {
                Some((_, v)) if v.fract() == 0.0 && v.abs() < 9.0e15 => Some(*v as i64),
                Some((k, v)) => {
                    return Err(AutodiffError::Config(format!(
                        "loss option {k}={v}: the ignored label must be an integer"
                    )));
                }
                None => None,
            };
            Loss::CrossEntropy { label_smoothing, ignore_index }
        }
        "mse" => Loss::MeanSquaredError,
        other => {
            return Err(AutodiffError::Config(format!(
                "unknown loss {other:?}: use cross-entropy[:smoothing=S,ignore=I] or mse"
            )));
        }
    };
    check_known(&options, &["smoothing", "label_smoothing", "ignore", "ignore_index"], "loss")?;
    Ok(loss)
}

/// Parses `sgd:lr=0.1,momentum=0.9,wd=5e-4[,nesterov=1]` or
/// `adamw:lr=1e-3,beta1=0.9,beta2=0.999,eps=1e-8,wd=0.01`; returns the optimizer and the
/// initial learning rate.
pub fn parse_optimizer(text: &str) -> Result<(Optimizer, f64)> {
    let (kind, options) = text.split_once(':').unwrap_or((text, ""));
    let options = parse_options(options)?;
    let (opt, lr, known): (Optimizer, f64, &[&str]) = match kind {
        "sgd" => (
            Optimizer::Sgd {
                momentum: option(&options, &["momentum"], 0.0)?,
                nesterov: option(&options, &["nesterov"], 0.0)? != 0.0,
                weight_decay: option(&options, &["wd", "weight_decay"], 0.0)?,
            },
            option(&options, &["lr"], 0.1)?,
            &["lr", "momentum", "nesterov", "wd", "weight_decay"],
        ),
        "adamw" => (
            Optimizer::AdamW {
                beta1: option(&options, &["beta1"], 0.9)?,
                beta2: option(&options, &["beta2"], 0.999)?,
                eps: option(&options, &["eps"], 1e-8)?,
                weight_decay: option(&options, &["wd", "weight_decay"], 0.01)?,
            },
            option(&options, &["lr"], 1e-3)?,
            &["lr", "beta1", "beta2", "eps", "wd", "weight_decay"],
        ),
        other => return Err(AutodiffError::Config(format!("unknown optimizer {other:?}: use sgd:... or adamw:..."))),
    };
    check_known(&options, known, "optimizer")?;
    if let Optimizer::Sgd { nesterov: true, momentum, .. } = opt
        && momentum <= 0.0
    {
        return Err(AutodiffError::Config("Nesterov momentum needs momentum > 0".into()));
    }
    Ok((opt, lr))
}

fn parse_options(text: &str) -> Result<Vec<(String, f64)>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, "1"));
            let value = match v.trim() {
                "true" => 1.0,
                "false" => 0.0,
                v => v.parse::<f64>().map_err(|_| AutodiffError::Config(format!("option {k}={v}: not a number")))?,
            };
            Ok((k.trim().to_string(), value))
        })
        .collect()
}

fn option(options: &[(String, f64)], keys: &[&str], default: f64) -> Result<f64> {
    Ok(options.iter().find(|(k, _)| keys.contains(&k.as_str())).map_or(default, |(_, v)| *v))
}

fn check_known(options: &[(String, f64)], known: &[&str], what: &str) -> Result<()> {
    for (k, _) in options {
        if !known.contains(&k.as_str()) {
            return Err(AutodiffError::Config(format!("unknown {what} option {k:?} (known: {})", known.join(", "))));
        }
    }
    Ok(())
}
