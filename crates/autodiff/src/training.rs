//! Assembles the three graphs edgefreeze trains with: the gradient graph, the
//! training-step graph and the eval graph.

use crate::emit::Emitter;
use crate::error::{AutodiffError, Result};
use crate::grad::backward;
use crate::loss::{LABELS, Loss, emit_loss};
use crate::optim::{LEARNING_RATE, Optimizer, STEP, emit_update};
use crate::training_mode::{DROPOUT_SEED, batch_norm_inference, rewrite_for_training};
use edgefreeze_graph::analysis::{buffer_names, parameter_names};
use edgefreeze_graph::infer::{Inference, infer};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo, fixed_shape};
use edgefreeze_graph::{DataType, optimize, record_types};
use std::collections::{HashMap, HashSet};

/// What to train and how.
#[derive(Debug, Clone)]
pub struct TrainingSpec {
    /// The objective.
    pub loss: Loss,
    /// The optimizer of the training-step graph.
    pub optimizer: Optimizer,
    /// Parameters that get no gradient and no update.
    pub frozen: Vec<String>,
}

/// Name of the loss output.
pub const LOSS: &str = "loss";
/// Name of the correct-prediction count output.
pub const CORRECT: &str = "correct";

/// Name of the gradient output of parameter `p`.
pub fn grad_name(p: &str) -> String {
    format!("grad.{p}")
}

/// Prefix of the outputs holding new values of inputs (parameters, state, buffers).
pub const UPDATED_PREFIX: &str = "updated.";

/// Name of the output holding the new value of input `name` (parameter, state, buffer).
pub fn updated_name(name: &str) -> String {
    format!("{UPDATED_PREFIX}{name}")
}

/// Name of optimizer state `prefix` of parameter `p`.
pub fn state_name(prefix: &str, p: &str) -> String {
    format!("{prefix}.{p}")
}

/// The parameters of a model split by whether they train.
#[derive(Debug, Clone)]
pub struct ParameterSplit {
    /// Parameters that get gradients and updates, in initializer order.
    pub trainable: Vec<String>,
    /// Frozen parameters.
    pub frozen: Vec<String>,
    /// BatchNorm running statistics.
    pub buffers: Vec<String>,
}

/// Splits a model's parameters; fails on frozen names that are not float parameters.
pub fn split_parameters(model: &Model, frozen: &[String]) -> Result<ParameterSplit> {
    let graph = &model.graph;
    let params = parameter_names(graph);
    for name in frozen {
        match graph.initializers.get(name) {
            None => {
                return Err(AutodiffError::Parameter {
                    name: name.clone(),
                    message: "no initializer has this name".into(),
                });
            }
            Some(t) if !t.dtype().is_float() => {
                return Err(AutodiffError::Parameter {
                    name: name.clone(),
                    message: format!("is a {} tensor, not a trainable parameter", t.dtype()),
                });
            }
            Some(_) if !params.contains(name) => {
                return Err(AutodiffError::Parameter {
                    name: name.clone(),
                    message: "is a BatchNorm running statistic".into(),
                });
            }
            _ => {}
        }
    }
    let frozen_set: HashSet<&String> = frozen.iter().collect();
    let buffers = buffer_names(graph);
    Ok(ParameterSplit {
        trainable: params.iter().filter(|p| !frozen_set.contains(p)).cloned().collect(),
        frozen: params.iter().filter(|p| frozen_set.contains(p)).cloned().collect(),
        buffers: graph.initializers.keys().filter(|k| buffers.contains(k.as_str())).cloned().collect(),
    })
}

/// Checks that explicitly named trainable parameters are floating-point initializers.
pub fn check_trainable(model: &Model, names: &[String]) -> Result<()> {
    for name in names {
        match model.graph.initializers.get(name) {
            Some(t) if t.dtype().is_float() => {}
            Some(t) => {
                return Err(AutodiffError::Parameter {
                    name: name.clone(),
                    message: format!("has integer type {} and cannot be trained", t.dtype()),
                });
            }
            None => {
                return Err(AutodiffError::Parameter {
                    name: name.clone(),
                    message: "no initializer has this name".into(),
                });
            }
        }
    }
    Ok(())
}

/// An emitter whose fresh names avoid every name of the model and of the graphs' interface.
fn emitter_for(model: &Model, trainable: &[String]) -> Emitter {
    let graph = &model.graph;
    let taken: HashSet<String> = graph
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter().chain(std::iter::once(&n.name)))
        .chain(graph.initializers.keys())
        .chain(graph.inputs.iter().map(|v| &v.name))
        .cloned()
        .collect();
    let mut e = Emitter::new(taken, float_type(model, trainable), model.opset());
    for reserved in [LOSS, CORRECT, LABELS, LEARNING_RATE, STEP, DROPOUT_SEED] {
        e.reserve(reserved);
    }
    e
}

fn float_type(model: &Model, trainable: &[String]) -> DataType {
    trainable.first().and_then(|p| model.graph.initializers.get(p)).map_or(DataType::Float32, |t| t.dtype())
}

fn batch_dim(inference: &Inference, output: &str) -> Dim {
    inference.typed(output).and_then(|(_, s)| s.first().cloned()).unwrap_or(Dim::Unknown)
}

fn labels_info(loss: &Loss, model: &Model, inference: &Inference) -> Result<Option<ValueInfo>> {
    let out = &model.graph.outputs.first().ok_or_else(|| AutodiffError::Loss("the model has no output".into()))?.name;
    let (dtype, shape) = inference
        .typed(out)
        .map(|(d, s)| (d, s.clone()))
        .ok_or_else(|| AutodiffError::Loss(format!("output {out:?} has no known type")))?;
    if !dtype.is_float() {
        return Err(AutodiffError::Loss(format!(
            "output {out:?} is {dtype}, but the loss needs floating-point values"
        )));
    }
    Ok(match loss {
        Loss::CrossEntropy { label_smoothing } => {
            if shape.len() != 2 {
                return Err(AutodiffError::Loss(format!(
                    "cross-entropy needs logits of shape batch×classes, but output {out:?} has shape {}",
                    edgefreeze_graph::ir::format_shape(&shape)
                )));
            }
            if !(0.0..1.0).contains(label_smoothing) {
                return Err(AutodiffError::Loss(format!("label smoothing {label_smoothing} is not in [0, 1)")));
            }
            Some(ValueInfo::new(LABELS, DataType::Int64, vec![batch_dim(inference, out)]))
        }
        Loss::MeanSquaredError => Some(ValueInfo::new(LABELS, dtype, shape)),
        Loss::Output => {
            if !shape.is_empty() {
                return Err(AutodiffError::Loss(format!("output {out:?} must be a scalar loss")));
            }
            None
        }
    })
}

/// The forward pass in training mode, the loss and the backward pass, shared by the
/// gradient and training-step graphs.
struct Differentiated {
    nodes: Vec<Node>,
    grads: Vec<String>,
    loss: String,
    correct: Option<String>,
    running_updates: Vec<(String, String)>,
    extra_inputs: Vec<ValueInfo>,
    emitter: Emitter,
}

fn differentiate(model: &Model, loss: &Loss, trainable: &[String]) -> Result<Differentiated> {
    let graph = &model.graph;
    let inference = infer(graph, model.opset())?;
    let labels = labels_info(loss, model, &inference)?;
    let mut e = emitter_for(model, trainable);
    let forward = rewrite_for_training(&graph.nodes, &inference, &mut e)?;
    let output = graph.outputs[0].name.clone();
    let values = emit_loss(loss, &output, &mut e);
    let mut nodes = forward.nodes;
    nodes.append(&mut e.nodes);

    let mut extra_inputs: Vec<ValueInfo> = labels.into_iter().collect();
    if forward.uses_dropout_seed {
        extra_inputs.push(ValueInfo::new(DROPOUT_SEED, DataType::Int64, vec![]));
    }
    // Types of the training forward pass, for the backward rules.
    let mut typed = graph.clone();
    typed.nodes = nodes.clone();
    typed.inputs.extend(extra_inputs.iter().cloned());
    let types = infer(&typed, model.opset())?;
    let grads = backward(&nodes, &types, std::slice::from_ref(&values.seed), trainable, &mut e)?;
    nodes.append(&mut e.nodes);
    Ok(Differentiated {
        nodes,
        grads,
        loss: values.loss,
        correct: values.correct,
        running_updates: forward.running_updates,
        extra_inputs,
        emitter: e,
    })
}

fn param_info(model: &Model, name: &str) -> ValueInfo {
    let t = &model.graph.initializers[name];
    ValueInfo::new(name, t.dtype(), fixed_shape(t.dims()))
}

/// Builds a graph from nodes and an interface, renaming values to their output names,
/// then merges common subexpressions, removes dead nodes and records types.
fn assemble(
    model: &Model,
    name: &str,
    mut nodes: Vec<Node>,
    inputs: Vec<ValueInfo>,
    bindings: Vec<(String, String)>,
    moved_to_inputs: &HashSet<String>,
) -> Result<Model> {
    let input_names: HashSet<String> = inputs.iter().map(|v| v.name.clone()).collect();
    let mut rename: HashMap<String, String> = HashMap::new();
    let mut extra = Vec::new();
    let mut bound: HashSet<String> = HashSet::new();
    let producers: HashSet<String> = nodes.iter().flat_map(|n| n.outputs.iter().cloned()).collect();
    for (value, output) in &bindings {
        if value == output {
            bound.insert(value.clone());
            continue;
        }
        if producers.contains(value)
            && !input_names.contains(value)
            && bound.insert(value.clone())
            && !rename.contains_key(value)
        {
            rename.insert(value.clone(), output.clone());
        } else {
            let source = rename.get(value).cloned().unwrap_or_else(|| value.clone());
            extra.push(Node::new(format!("output/{output}"), "Identity", &[&source], &[output]));
        }
    }
    for node in &mut nodes {
        for v in node.inputs.iter_mut().chain(node.outputs.iter_mut()) {
            if let Some(r) = rename.get(v) {
                *v = r.clone();
            }
        }
    }
    nodes.extend(extra);
    let mut graph = Graph {
        name: name.to_string(),
        nodes,
        inputs,
        outputs: bindings
            .iter()
            .map(|(_, o)| ValueInfo { name: o.clone(), dtype: None, shape: None, doc_string: String::new() })
            .collect(),
        initializers: model
            .graph
            .initializers
            .iter()
            .filter(|(k, _)| !moved_to_inputs.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    };
    optimize::merge_common_subexpressions(&mut graph);
    graph.remove_dead_nodes();
    let mut out = Model {
        ir_version: model.ir_version.max(8),
        opset_imports: model.opset_imports.iter().filter(|(d, _)| d.is_empty() || d == "ai.onnx").cloned().collect(),
        producer_name: "edgefreeze".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph,
        ..Default::default()
    };
    edgefreeze_graph::sort::sort_topologically(&mut out.graph)?;
    edgefreeze_graph::ops::check_supported(&out.graph)?;
    record_types(&mut out)?;
    Ok(out)
}

/// (inputs, labels, trainable parameters) → (loss, gradient of every trainable parameter).
pub fn gradient_graph(model: &Model, loss: &Loss, frozen: &[String]) -> Result<Model> {
    let split = split_parameters(model, frozen)?;
    let d = differentiate(model, loss, &split.trainable)?;
    let mut inputs = model.graph.inputs.clone();
    inputs.extend(d.extra_inputs.iter().cloned());
    inputs.extend(split.trainable.iter().map(|p| param_info(model, p)));
    let mut bindings = vec![(d.loss.clone(), LOSS.to_string())];
    bindings.extend(split.trainable.iter().zip(&d.grads).map(|(p, g)| (g.clone(), grad_name(p))));
    let moved: HashSet<String> = split.trainable.iter().cloned().collect();
    assemble(model, "gradient", d.nodes, inputs, bindings, &moved)
}

/// (inputs, labels, learning rate, step, parameters, optimizer state, running statistics)
/// → (loss, correct predictions, updated parameters, updated state, updated statistics).
pub fn training_step_graph(model: &Model, spec: &TrainingSpec) -> Result<Model> {
    let split = split_parameters(model, &spec.frozen)?;
    let mut d = differentiate(model, &spec.loss, &split.trainable)?;
    let float = d.emitter.float;
    let mut inputs = model.graph.inputs.clone();
    inputs.extend(d.extra_inputs.iter().cloned());
    inputs.push(ValueInfo::new(LEARNING_RATE, float, vec![]));
    if spec.optimizer.uses_step() {
        inputs.push(ValueInfo::new(STEP, DataType::Int64, vec![]));
    }
    let mut bindings = vec![(d.loss.clone(), LOSS.to_string())];
    if let Some(c) = &d.correct {
        bindings.push((c.clone(), CORRECT.to_string()));
    }
    let mut moved: HashSet<String> = HashSet::new();
    let mut state_inputs = Vec::new();
    let mut update_bindings = Vec::new();
    let mut state_bindings = Vec::new();
    for (p, g) in split.trainable.iter().zip(&d.grads) {
        let info = param_info(model, p);
        inputs.push(info.clone());
        moved.insert(p.clone());
        let states: Vec<String> = spec.optimizer.state_prefixes().iter().map(|prefix| state_name(prefix, p)).collect();
        for s in &states {
            d.emitter.reserve(s);
            state_inputs.push(ValueInfo { name: s.clone(), ..info.clone() });
        }
        let (new_param, new_states) = emit_update(&spec.optimizer, p, g, &states, &mut d.emitter);
        update_bindings.push((new_param, updated_name(p)));
        for (s, v) in states.iter().zip(new_states) {
            state_bindings.push((v, updated_name(s)));
        }
    }
    inputs.extend(state_inputs);
    for (buffer, updated) in &d.running_updates {
        inputs.push(param_info(model, buffer));
        moved.insert(buffer.clone());
        state_bindings.push((updated.clone(), updated_name(buffer)));
    }
    bindings.extend(update_bindings);
    bindings.extend(state_bindings);
    let mut nodes = d.nodes;
    nodes.append(&mut d.emitter.nodes);
    assemble(model, "train_step", nodes, inputs, bindings, &moved)
}

/// (inputs, labels, parameters, running statistics) → (loss, correct predictions, the
/// model's output), with BatchNorm in inference mode (spelled out in primitive ops, since
/// its statistics are inputs) and Dropout off.
pub fn eval_graph(model: &Model, loss: &Loss) -> Result<Model> {
    let graph = &model.graph;
    let inference = infer(graph, model.opset())?;
    let labels = labels_info(loss, model, &inference)?;
    let split = split_parameters(model, &[])?;
    let mut e = emitter_for(model, &split.trainable);
    let output = graph.outputs[0].name.clone();
    let mut nodes: Vec<Node> = Vec::with_capacity(graph.nodes.len());
    for n in &graph.nodes {
        match n.op_type.as_str() {
            "Dropout" => nodes.push(Node::new(n.name.clone(), "Identity", &[&n.inputs[0]], &[&n.outputs[0]])),
            "BatchNormalization" => {
                e.set_prefix(&n.name);
                batch_norm_inference(n, &inference, &mut e)?;
                e.set_prefix("");
                nodes.append(&mut e.nodes);
            }
            _ => nodes.push(n.clone()),
        }
    }
    let values = emit_loss(loss, &output, &mut e);
    nodes.append(&mut e.nodes);
    let mut inputs = graph.inputs.clone();
    inputs.extend(labels);
    let mut moved = HashSet::new();
    for p in split.trainable.iter().chain(&split.buffers) {
        inputs.push(param_info(model, p));
        moved.insert(p.clone());
    }
    let mut bindings = vec![(values.loss, LOSS.to_string())];
    if let Some(c) = values.correct {
        bindings.push((c, CORRECT.to_string()));
    }
    bindings.push((output.clone(), output));
    assemble(model, "eval", nodes, inputs, bindings, &moved)
}
