//! Assembles the three graphs edgefreeze trains with: the gradient graph, the
//! training-step graph and the eval graph.

use crate::emit::Emitter;
use crate::error::{AutodiffError, Result};
use crate::grad::backward;
use crate::loss::{LABELS, Loss, emit_loss};
use crate::optim::{LEARNING_RATE, Optimizer, STEP, emit_update};
use crate::training_mode::{DROPOUT_SEED, rewrite_for_inference, rewrite_for_training};
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

/// Prefix of gradient outputs.
pub const GRAD_PREFIX: &str = "grad.";

/// Name of the gradient output of parameter (or input) `p`.
pub fn grad_name(p: &str) -> String {
    format!("{GRAD_PREFIX}{p}")
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

/// The ops that stop a model from being trained, read from the gradient table without
/// building anything: those on a path from a trainable parameter (all but `frozen`) to the
/// model's first output (where every loss attaches) that have no gradient rule. Empty when
/// the table can differentiate the model; building the graphs can still fail for other
/// reasons (a shape a rule needs, a loss that does not fit).
pub fn training_blockers(model: &Model, frozen: &[String]) -> Result<Vec<crate::BlockedOp>> {
    let split = split_parameters(model, frozen)?;
    let output = model.graph.outputs.first().ok_or_else(|| AutodiffError::Loss("the model has no output".into()))?;
    let types = infer(&model.graph, model.opset())?;
    let (_, _, active) =
        crate::grad::active_nodes(&model.graph.nodes, &types, std::slice::from_ref(&output.name), &split.trainable);
    Ok(crate::grad::blocking_ops(&model.graph.nodes, &active))
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
pub fn emitter_for(model: &Model, trainable: &[String]) -> Emitter {
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

/// The rank of `output` (its type was checked by [`labels_info`]).
fn output_rank(inference: &Inference, output: &str) -> usize {
    inference.typed(output).map_or(0, |(_, s)| s.len())
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
        Loss::CrossEntropy { label_smoothing, .. } => {
            if shape.len() < 2 {
                return Err(AutodiffError::Loss(format!(
                    "cross-entropy needs logits of shape batch×classes (or batch×classes×…, a class map per \
                     pixel or position), but output {out:?} has shape {}",
                    edgefreeze_graph::ir::format_shape(&shape)
                )));
            }
            if !(0.0..1.0).contains(label_smoothing) {
                return Err(AutodiffError::Loss(format!("label smoothing {label_smoothing} is not in [0, 1)")));
            }
            // One label per sample, or per element of the axes behind the classes.
            let mut labels = vec![batch_dim(inference, out)];
            labels.extend(shape.iter().skip(2).cloned());
            Some(ValueInfo::new(LABELS, DataType::Int64, labels))
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

/// What the backward pass differentiates.
#[derive(Debug, Clone, PartialEq)]
pub enum Objective {
    /// A loss of the model's first output against [`LABELS`].
    Loss(Loss),
    /// The gradient of forward value `value` is fed as the graph input `gradient` (typed
    /// like the value): the back part of a model cut in two, whose front part computed it.
    Seed {
        /// The forward value whose gradient is given.
        value: String,
        /// The graph input holding that gradient.
        gradient: String,
    },
}

/// The forward pass in training mode, the objective and the backward pass, from which
/// the gradient, training-step and partitioned graphs are assembled.
pub struct Differentiated {
    /// Forward, loss and backward nodes, in order.
    pub nodes: Vec<Node>,
    /// The gradient value of each name asked for, in order.
    pub grads: Vec<String>,
    /// The loss value (with a [`Objective::Loss`]).
    pub loss: Option<String>,
    /// The correct-prediction count (classification losses).
    pub correct: Option<String>,
    /// (running statistic, its updated value) of every BatchNormalization in training mode.
    pub running_updates: Vec<(String, String)>,
    /// Graph inputs the nodes read besides the model's: labels, dropout seed, seed gradient.
    pub extra_inputs: Vec<ValueInfo>,
    /// The emitter, for further nodes with fresh names.
    pub emitter: Emitter,
}

/// Differentiates `objective` with respect to `wrt` (parameters, or any value of the
/// model such as a graph input). Nodes named in `inference` run in inference mode (see
/// [`rewrite_for_training`]); `reserved` names are never made fresh (names of the
/// caller's graph interface).
pub fn differentiate(
    model: &Model,
    objective: &Objective,
    wrt: &[String],
    inference: &HashSet<String>,
    reserved: &[String],
) -> Result<Differentiated> {
    let graph = &model.graph;
    let inference_types = infer(graph, model.opset())?;
    let mut e = emitter_for(model, wrt);
    for name in reserved {
        e.reserve(name);
    }
    let forward = rewrite_for_training(&graph.nodes, &inference_types, &mut e, inference)?;
    let mut nodes = forward.nodes;
    let mut extra_inputs = Vec::new();
    let (loss, correct, seed) = match objective {
        Objective::Loss(loss) => {
            extra_inputs.extend(labels_info(loss, model, &inference_types)?);
            let output = graph.outputs[0].name.clone();
            let rank = output_rank(&inference_types, &output);
            let values = emit_loss(loss, &output, rank, &mut e);
            nodes.append(&mut e.nodes);
            (Some(values.loss), values.correct, values.seed)
        }
        Objective::Seed { value, gradient } => {
            let (dtype, shape) = inference_types
                .typed(value)
                .map(|(d, s)| (d, s.clone()))
                .ok_or_else(|| AutodiffError::Config(format!("seed value {value:?} has no known type")))?;
            extra_inputs.push(ValueInfo::new(gradient.clone(), dtype, shape));
            e.reserve(gradient);
            (None, None, (value.clone(), gradient.clone()))
        }
    };
    if forward.uses_dropout_seed {
        extra_inputs.push(ValueInfo::new(DROPOUT_SEED, DataType::Int64, vec![]));
    }
    // Types of the training forward pass, for the backward rules.
    let mut typed = graph.clone();
    typed.nodes = nodes.clone();
    typed.inputs.extend(extra_inputs.iter().cloned());
    let types = infer(&typed, model.opset())?;
    let grads = backward(&nodes, &types, std::slice::from_ref(&seed), wrt, &forward.composites, &mut e)?;
    nodes.append(&mut e.nodes);
    Ok(Differentiated {
        nodes,
        grads,
        loss,
        correct,
        // Statistics the model holds as initializers are state the step updates. A
        // BatchNormalization whose statistics are computed in the graph has none: timm's
        // weight standardisation (NF-ResNets) normalises each weight with
        // `F.batch_norm(w, None, None, training=True)`, which TorchScript exports with
        // statistics computed from the weight itself.
        running_updates: forward
            .running_updates
            .into_iter()
            .filter(|(statistic, _)| graph.initializers.contains_key(statistic))
            .collect(),
        extra_inputs,
        emitter: e,
    })
}

/// The graph input that takes initializer `name`, typed like it.
pub fn param_info(model: &Model, name: &str) -> ValueInfo {
    let t = &model.graph.initializers[name];
    ValueInfo::new(name, t.dtype(), fixed_shape(t.dims()))
}

/// Builds a graph from nodes and an interface, renaming values to their output names,
/// then merges common subexpressions, removes dead nodes and records types. Initializers
/// of `model` not in `moved_to_inputs` stay initializers where still used.
pub fn assemble(
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
    let d = differentiate(model, &Objective::Loss(loss.clone()), &split.trainable, &HashSet::new(), &[])?;
    let mut inputs = model.graph.inputs.clone();
    inputs.extend(d.extra_inputs.iter().cloned());
    inputs.extend(split.trainable.iter().map(|p| param_info(model, p)));
    let mut bindings: Vec<(String, String)> = d.loss.iter().map(|l| (l.clone(), LOSS.to_string())).collect();
    bindings.extend(split.trainable.iter().zip(&d.grads).map(|(p, g)| (g.clone(), grad_name(p))));
    let moved: HashSet<String> = split.trainable.iter().cloned().collect();
    assemble(model, "gradient", d.nodes, inputs, bindings, &moved)
}

/// How [`step_graph`] builds a graph from a model.
#[derive(Debug, Clone)]
pub struct StepOptions {
    /// What the backward pass differentiates.
    pub objective: Objective,
    /// With an optimizer the graph updates the trainable parameters (a training step);
    /// without, it outputs `grad.<p>` of each instead (for gradient accumulation).
    pub optimizer: Option<Optimizer>,
    /// Parameters that get no gradient and no update.
    pub frozen: Vec<String>,
    /// Whether frozen parameters and the running statistics read by inference-mode
    /// BatchNorms are graph inputs (taken from the engine state, so changing which layers
    /// are frozen needs no re-encoding of weights) rather than initializers.
    pub frozen_as_inputs: bool,
    /// Nodes run in inference mode (BatchNorm from running statistics, Dropout off).
    pub inference_nodes: HashSet<String>,
    /// Graph inputs whose gradient is an output `grad.<input>` (the activation at a cut).
    pub input_gradients: Vec<String>,
    /// Further outputs: (value of the model, output name), such as probes.
    pub extra_outputs: Vec<(String, String)>,
}

impl StepOptions {
    /// The options of [`training_step_graph`].
    pub fn training(spec: &TrainingSpec) -> StepOptions {
        StepOptions {
            objective: Objective::Loss(spec.loss.clone()),
            optimizer: Some(spec.optimizer.clone()),
            frozen: spec.frozen.clone(),
            frozen_as_inputs: false,
            inference_nodes: HashSet::new(),
            input_gradients: Vec::new(),
            extra_outputs: Vec::new(),
        }
    }
}

/// The optimizer update of each parameter from its gradient value: adds the parameter and
/// its state tensors to `inputs` and their new values to `bindings`.
fn emit_updates(
    model: &Model,
    optimizer: &Optimizer,
    params: &[String],
    grads: &[String],
    e: &mut Emitter,
    inputs: &mut Vec<ValueInfo>,
    bindings: &mut Vec<(String, String)>,
) {
    let mut state_inputs = Vec::new();
    let mut state_bindings = Vec::new();
    for (p, g) in params.iter().zip(grads) {
        let info = param_info(model, p);
        inputs.push(info.clone());
        let states: Vec<String> = optimizer.state_prefixes().iter().map(|prefix| state_name(prefix, p)).collect();
        for s in &states {
            e.reserve(s);
            state_inputs.push(ValueInfo { name: s.clone(), ..info.clone() });
        }
        let (new_param, new_states) = emit_update(optimizer, p, g, &states, e);
        bindings.push((new_param, updated_name(p)));
        for (s, v) in states.iter().zip(new_states) {
            state_bindings.push((v, updated_name(s)));
        }
    }
    inputs.extend(state_inputs);
    bindings.extend(state_bindings);
}

/// Builds a training-step or gradient-accumulation graph (see [`StepOptions`]):
/// (inputs, labels or seed gradient, (learning rate, step), trainable parameters,
/// (optimizer state), running statistics, (frozen parameters and statistics)) →
/// (loss, correct, [`grad.<input>`, `grad.<p>`] or [updated parameters and state],
/// updated statistics, extra outputs).
pub fn step_graph(model: &Model, name: &str, options: &StepOptions) -> Result<Model> {
    let split = split_parameters(model, &options.frozen)?;
    let mut wrt = options.input_gradients.clone();
    wrt.extend(split.trainable.iter().cloned());
    let reserved: Vec<String> = options.extra_outputs.iter().map(|(_, o)| o.clone()).collect();
    let mut d = differentiate(model, &options.objective, &wrt, &options.inference_nodes, &reserved)?;
    let (input_grads, param_grads) = d.grads.split_at(options.input_gradients.len());
    let float = d.emitter.float;
    let mut inputs = model.graph.inputs.clone();
    inputs.extend(d.extra_inputs.iter().cloned());
    let mut bindings: Vec<(String, String)> = d.loss.iter().map(|l| (l.clone(), LOSS.to_string())).collect();
    if let Some(c) = &d.correct {
        bindings.push((c.clone(), CORRECT.to_string()));
    }
    let mut moved: HashSet<String> = split.trainable.iter().cloned().collect();
    match &options.optimizer {
        Some(optimizer) => {
            inputs.push(ValueInfo::new(LEARNING_RATE, float, vec![]));
            if optimizer.uses_step() {
                inputs.push(ValueInfo::new(STEP, DataType::Int64, vec![]));
            }
            emit_updates(model, optimizer, &split.trainable, param_grads, &mut d.emitter, &mut inputs, &mut bindings);
        }
        None => {
            for (input, g) in options.input_gradients.iter().zip(input_grads) {
                bindings.push((g.clone(), grad_name(input)));
            }
            for (p, g) in split.trainable.iter().zip(param_grads) {
                inputs.push(param_info(model, p));
                bindings.push((g.clone(), grad_name(p)));
            }
        }
    }
    for (buffer, updated) in &d.running_updates {
        inputs.push(param_info(model, buffer));
        moved.insert(buffer.clone());
        bindings.push((updated.clone(), updated_name(buffer)));
    }
    if options.frozen_as_inputs {
        let rest = split.frozen.iter().chain(split.buffers.iter().filter(|b| !moved.contains(*b)));
        let rest: Vec<String> = rest.cloned().collect();
        for p in rest {
            inputs.push(param_info(model, &p));
            moved.insert(p);
        }
    }
    bindings.extend(options.extra_outputs.iter().cloned());
    let mut nodes = d.nodes;
    nodes.append(&mut d.emitter.nodes);
    assemble(model, name, nodes, inputs, bindings, &moved)
}

/// (inputs, labels, learning rate, step, parameters, optimizer state, running statistics)
/// → (loss, correct predictions, updated parameters, updated state, updated statistics).
pub fn training_step_graph(model: &Model, spec: &TrainingSpec) -> Result<Model> {
    step_graph(model, "train_step", &StepOptions::training(spec))
}

/// Name of the scalar input of [`update_graph`] that multiplies accumulated gradients.
pub const GRAD_SCALE: &str = "grad_scale";

/// The optimizer alone: (learning rate, (step), `grad_scale`, parameters, optimizer
/// state, `grad.<p>`) → (updated parameters, updated state), for the parameters `params`
/// of `model`. The gradient used is `grad.<p> · grad_scale`: gradients summed over M
/// micro-batches, each the gradient of its micro-batch's mean loss, with a scale of 1/M
/// give the gradient of the whole batch's mean loss.
pub fn update_graph(model: &Model, optimizer: &Optimizer, params: &[String]) -> Result<Model> {
    check_trainable(model, params)?;
    let mut e = emitter_for(model, params);
    let float = e.float;
    e.reserve(GRAD_SCALE);
    let mut inputs = vec![ValueInfo::new(LEARNING_RATE, float, vec![])];
    if optimizer.uses_step() {
        inputs.push(ValueInfo::new(STEP, DataType::Int64, vec![]));
    }
    inputs.push(ValueInfo::new(GRAD_SCALE, float, vec![]));
    let mut grad_inputs = Vec::new();
    let mut scaled = Vec::new();
    for p in params {
        let g = grad_name(p);
        e.reserve(&g);
        grad_inputs.push(ValueInfo { name: g.clone(), ..param_info(model, p) });
        e.set_prefix(&format!("scale/{p}"));
        scaled.push(e.mul(&g, GRAD_SCALE));
    }
    e.set_prefix("");
    let mut bindings = Vec::new();
    emit_updates(model, optimizer, params, &scaled, &mut e, &mut inputs, &mut bindings);
    inputs.extend(grad_inputs);
    let moved: HashSet<String> = params.iter().cloned().collect();
    let mut source = model.clone();
    // Only the optimizer's own constants: no initializer of the model is read.
    source.graph.initializers.retain(|k, _| moved.contains(k));
    assemble(&source, "apply", e.nodes, inputs, bindings, &moved)
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
        e.set_prefix(&n.name);
        if !rewrite_for_inference(n, &inference, &mut e)? {
            nodes.push(n.clone());
        }
        e.set_prefix("");
        nodes.append(&mut e.nodes);
    }
    let values = emit_loss(loss, &output, output_rank(&inference, &output), &mut e);
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
