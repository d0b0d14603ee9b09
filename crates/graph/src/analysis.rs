//! Layer and cut analysis: the units that freezing and device/edge partitioning act on.
//!
//! A **layer** is a parameterised op (Conv, Gemm, MatMul with a weight,
//! BatchNormalization, LayerNormalization, an embedding Gather) with the parameter-free
//! ops that follow it up to the next parameterised op. A **cut** is a position in the
//! analysis order where exactly one activation crosses from the front part to the back
//! part; parameters, constants and values computed only from them and from tensor shapes
//! do not count, since either side can hold or recompute them. Nor do the graph's inputs
//! and values computed from them alone ("input-only": a padding mask `Equal(tokens, 0)`,
//! the position of the last real token): the back part recomputes those from the inputs
//! it is given beside the activation, the cut's [`Cut::side_inputs`]. Layer boundaries
//! that are not cuts are dropped, so a residual block whose branches rejoin becomes one
//! layer.
//!
//! FLOPs are per sample (symbolic dimensions such as the batch count as 1); a
//! multiply-add counts as two, other element-wise work as one per output element.

use crate::dtype::DataType;
use crate::error::{GraphError, Result};
use crate::infer::{Inference, infer};
use crate::ir::{Dim, Graph, Model, Node, Shape};
use crate::ops::{Flops, spec};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A group of nodes that is frozen, trained or placed as one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Layer {
    /// Position of the layer, from 0.
    pub index: usize,
    /// A readable name: the common prefix of its parameters' names, else its first node's name.
    pub name: String,
    /// Indices into `graph.nodes`, in analysis order.
    pub nodes: Vec<usize>,
    /// Distinct op types, in order of first appearance.
    pub op_types: Vec<String>,
    /// Trainable parameter tensors first used in this layer.
    pub parameter_names: Vec<String>,
    /// Elements of those parameters.
    pub parameters: usize,
    /// Non-trainable buffers (BatchNorm running statistics) first used in this layer.
    pub buffer_names: Vec<String>,
    /// Elements of those buffers.
    pub buffers: usize,
    /// Forward FLOPs per sample.
    pub flops: u64,
    /// The layer's output tensor: the one crossing the cut after it, or the graph output.
    pub output: String,
    /// Shape of the output (with symbolic dimensions).
    #[serde(serialize_with = "serialize_shape")]
    pub output_shape: Shape,
    /// Element type of the output.
    pub output_dtype: Option<DataType>,
}

/// A valid cut after a layer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cut {
    /// The cut lies between layer `after_layer` and the next one.
    pub after_layer: usize,
    /// Number of nodes (in analysis order) in front of the cut.
    pub position: usize,
    /// The one activation tensor that crosses.
    pub tensor: String,
    /// The graph inputs the part behind the cut reads as well (their values, not just
    /// their shapes), directly or through values computed from them alone, which it
    /// recomputes: empty for most models; the token ids for a classifier that reads the
    /// last real token, or builds its attention mask from the padding. Whoever runs the
    /// back part feeds them beside the activation.
    pub side_inputs: Vec<String>,
    /// Its shape.
    #[serde(serialize_with = "serialize_shape")]
    pub shape: Shape,
    /// Its size in bytes per sample.
    pub bytes_per_sample: u64,
    /// Forward FLOPs per sample in front of the cut.
    pub flops_before: u64,
    /// Forward FLOPs per sample behind the cut.
    pub flops_after: u64,
}

/// The result of analysing a model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Analysis {
    /// Layers in order.
    pub layers: Vec<Layer>,
    /// The cut after each layer but the last.
    pub cuts: Vec<Cut>,
    /// Node indices in analysis order: topological, data nodes in model order, and nodes
    /// that only compute from parameters, constants and shapes placed just before their first use.
    pub order: Vec<usize>,
    /// All trainable parameter elements.
    pub total_parameters: usize,
    /// All buffer elements.
    pub total_buffers: usize,
    /// Forward FLOPs per sample of the whole model.
    pub total_flops: u64,
}

fn serialize_shape<S: serde::Serializer>(shape: &Shape, s: S) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(shape.len()))?;
    for d in shape {
        match d {
            Dim::Fixed(n) => seq.serialize_element(n)?,
            Dim::Symbol(name) => seq.serialize_element(name)?,
            Dim::Unknown => seq.serialize_element(&Option::<usize>::None)?,
        }
    }
    seq.end()
}

/// Op types that start a layer when they read a parameter.
const ANCHORS: &[&str] = &["Conv", "Gemm", "MatMul", "BatchNormalization", "LayerNormalization", "Gather"];

/// Names of trainable parameters: floating-point initializers other than BatchNorm running statistics.
pub fn parameter_names(graph: &Graph) -> Vec<String> {
    let buffers = buffer_names(graph);
    graph
        .initializers
        .iter()
        .filter(|(name, t)| t.dtype().is_float() && !buffers.contains(name.as_str()))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Names of BatchNorm running statistics (inputs 3 and 4 of BatchNormalization) held as initializers.
pub fn buffer_names(graph: &Graph) -> HashSet<&str> {
    graph
        .nodes
        .iter()
        .filter(|n| n.op_type == "BatchNormalization")
        .flat_map(|n| [n.input(3), n.input(4)])
        .flatten()
        .filter(|name| graph.initializers.contains_key(*name))
        .collect()
}

/// Analyses an imported (sorted, typed) model into layers and cuts.
pub fn analyse(model: &Model) -> Result<Analysis> {
    let graph = &model.graph;
    if graph.nodes.is_empty() {
        return Err(crate::error::GraphError::Invalid("the graph has no nodes to analyse".into()));
    }
    let inference = infer(graph, model.opset())?;
    let classes = classify(graph);
    let (order, starts) = order_nodes(graph, &classes);
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(p, &i)| (i, p)).collect();
    let crossing = crossing_values(graph, &order, &position, &classes);
    let last_reads = last_value_reads(graph, &order, &classes);

    // Preliminary layers start at anchors; a boundary survives only where one tensor crosses.
    // Where more than one crosses in front of an anchor, the layer may still start earlier,
    // after the previous anchor, where its input alone crosses: a LayerNormalization spelled
    // out in primitive ops (TorchScript before opset 17: ReduceMean, Sub, Pow, ..., then Mul
    // and Add of its weight and bias) reads the residual stream ahead of the attention's
    // MatMul, the first anchor, where the stream and the normalised value both cross. Such
    // an earlier start follows a data node: the parameter-only nodes placed in front of an
    // anchor (a zero bias expanded to the weight's shape) stay with it.
    let mut bounds: Vec<usize> = Vec::new();
    let mut previous = 0;
    for p in starts {
        let after_data = |q: usize| q == p || classes.data[order[q - 1]];
        if let Some(q) = (previous + 1..=p).rev().find(|&q| crossing[q].len() == 1 && after_data(q)) {
            bounds.push(q);
        }
        previous = p;
    }
    bounds.dedup();
    let mut ranges = Vec::new();
    let mut begin = 0;
    for &b in &bounds {
        ranges.push(begin..b);
        begin = b;
    }
    ranges.push(begin..order.len());

    let params: HashSet<String> = parameter_names(graph).into_iter().collect();
    let buffers = buffer_names(graph);
    let mut seen: HashSet<&str> = HashSet::new();
    let mut layers = Vec::new();
    for (index, range) in ranges.iter().enumerate() {
        let nodes: Vec<usize> = order[range.clone()].to_vec();
        let mut op_types: Vec<String> = Vec::new();
        let mut parameter_names = Vec::new();
        let mut layer_buffers = Vec::new();
        let (mut parameters, mut buffer_elems, mut flops) = (0, 0, 0);
        for &i in &nodes {
            let node = &graph.nodes[i];
            if !op_types.contains(&node.op_type) {
                op_types.push(node.op_type.clone());
            }
            for input in node.inputs.iter().filter(|s| !s.is_empty()) {
                if !seen.insert(input.as_str()) {
                    continue;
                }
                let Some(t) = graph.initializers.get(input) else { continue };
                if params.contains(input) {
                    parameters += t.numel();
                    parameter_names.push(input.clone());
                } else if buffers.contains(input.as_str()) {
                    buffer_elems += t.numel();
                    layer_buffers.push(input.clone());
                }
            }
            if classes.data[i] {
                flops += node_flops(node, &inference)?;
            }
        }
        let output = if index + 1 < ranges.len() {
            crossing[range.end][0].clone()
        } else {
            graph.outputs.first().map(|v| v.name.clone()).unwrap_or_default()
        };
        let (output_dtype, output_shape) = match inference.types.get(&output) {
            Some(v) => (v.dtype, v.shape.clone().unwrap_or_default()),
            None => (None, Vec::new()),
        };
        layers.push(Layer {
            index,
            name: layer_name(&parameter_names, &graph.nodes[nodes[0]]),
            nodes,
            op_types,
            parameter_names,
            parameters,
            buffer_names: layer_buffers,
            buffers: buffer_elems,
            flops,
            output,
            output_shape,
            output_dtype,
        });
    }
    let total_flops = layers.iter().fold(0u64, |acc, l| acc.saturating_add(l.flops));
    let mut cuts = Vec::new();
    let mut before = 0u64;
    for (k, layer) in layers.iter().enumerate().take(layers.len().saturating_sub(1)) {
        before = before.saturating_add(layer.flops);
        let size = layer.output_dtype.map_or(4, |d| d.size()) as u64;
        cuts.push(Cut {
            after_layer: k,
            position: ranges[k].end,
            tensor: layer.output.clone(),
            // In the graph's input order, for a stable listing.
            side_inputs: graph
                .inputs
                .iter()
                .filter(|v| last_reads.get(v.name.as_str()).is_some_and(|&l| l >= ranges[k].end))
                .map(|v| v.name.clone())
                .collect(),
            shape: layer.output_shape.clone(),
            bytes_per_sample: per_sample_elements(&layer.output_shape) * size,
            flops_before: before,
            flops_after: total_flops - before,
        });
    }
    Ok(Analysis {
        total_parameters: layers.iter().map(|l| l.parameters).sum(),
        total_buffers: layers.iter().map(|l| l.buffers).sum(),
        total_flops,
        layers,
        cuts,
        order,
    })
}

/// Per node: whether it depends on the data fed to the graph (`data`), and whether it is
/// derived from a parameter without touching data (`param_derived`); per data value
/// computed from the graph inputs alone, the inputs it comes from (`input_only`).
struct Classes {
    data: Vec<bool>,
    data_values: HashSet<String>,
    param_derived_values: HashSet<String>,
    input_only: HashMap<String, BTreeSet<String>>,
}

/// Ops whose output is not a function of their inputs alone: a value they compute, or
/// one computed from it, cannot be recomputed behind a cut (it would be another draw).
const RANDOM: &[&str] =
    &["Dropout", "RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform", "Bernoulli", "Multinomial"];

fn classify(graph: &Graph) -> Classes {
    let mut data_values: HashSet<String> = graph.inputs.iter().map(|v| v.name.clone()).collect();
    let mut param_derived_values: HashSet<String> = parameter_names(graph).into_iter().collect();
    let mut input_only: HashMap<String, BTreeSet<String>> =
        graph.inputs.iter().map(|v| (v.name.clone(), BTreeSet::from([v.name.clone()]))).collect();
    let mut data = vec![false; graph.nodes.len()];
    let mut drawn: HashSet<String> = HashSet::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let value_reads =
            || node.inputs.iter().enumerate().filter(|(k, v)| !v.is_empty() && !is_metadata_input(node, *k));
        let reads_data = value_reads().any(|(_, v)| data_values.contains(v));
        data[i] = reads_data;
        let derived = !reads_data && node.inputs.iter().any(|v| param_derived_values.contains(v));
        let random = RANDOM.contains(&node.op_type.as_str()) || value_reads().any(|(_, v)| drawn.contains(v));
        if random {
            drawn.extend(node.outputs.iter().filter(|o| !o.is_empty()).cloned());
        }
        // Computed from the inputs alone: every data value it reads is, and it reads no
        // parameter (nor anything computed from one) and nothing drawn at random.
        let from_inputs = reads_data
            && !random
            && !node.inputs.iter().any(|v| param_derived_values.contains(v))
            && value_reads().all(|(_, v)| !data_values.contains(v) || input_only.contains_key(v));
        let roots: Option<BTreeSet<String>> =
            from_inputs.then(|| value_reads().filter_map(|(_, v)| input_only.get(v)).flatten().cloned().collect());
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            if reads_data {
                data_values.insert(out.clone());
                if let Some(roots) = &roots {
                    input_only.insert(out.clone(), roots.clone());
                }
            } else if derived {
                param_derived_values.insert(out.clone());
            }
        }
    }
    Classes { data, data_values, param_derived_values, input_only }
}

/// The data values of a graph computed from its inputs alone (no parameter, nothing
/// computed from one, no random draw), each with the graph inputs it comes from; the
/// inputs themselves are among them. Behind a cut they are recomputed from the cut's
/// side inputs.
pub fn input_only_values(graph: &Graph) -> HashMap<String, BTreeSet<String>> {
    classify(graph).input_only
}

/// Inputs of which an op reads only the shape or element type, not the values.
pub fn is_metadata_input(node: &Node, input: usize) -> bool {
    matches!((node.op_type.as_str(), input), ("Shape", 0) | ("CastLike", 1))
}

fn is_anchor(node: &Node, classes: &Classes) -> bool {
    if !ANCHORS.contains(&node.op_type.as_str()) {
        return false;
    }
    if node.op_type == "Gather" {
        return node.input(0).is_some_and(|v| classes.param_derived_values.contains(v));
    }
    node.inputs.iter().any(|v| classes.param_derived_values.contains(v))
}

/// The analysis order and the positions where preliminary layers start.
fn order_nodes(graph: &Graph, classes: &Classes) -> (Vec<usize>, Vec<usize>) {
    let mut placer = Placer {
        graph,
        producers: graph.producers(),
        classes,
        placed: vec![false; graph.nodes.len()],
        order: Vec::with_capacity(graph.nodes.len()),
        starts: Vec::new(),
    };
    struct Placer<'a> {
        graph: &'a Graph,
        producers: HashMap<&'a str, usize>,
        classes: &'a Classes,
        placed: Vec<bool>,
        order: Vec<usize>,
        starts: Vec<usize>,
    }
    impl Placer<'_> {
        /// Places the not yet placed parameter/constant-only nodes that node `i` reads.
        fn place_static_inputs(&mut self, i: usize) {
            for input in &self.graph.nodes[i].inputs {
                if let Some(&p) = self.producers.get(input.as_str())
                    && !self.placed[p]
                    && !self.classes.data[p]
                {
                    self.placed[p] = true;
                    self.place_static_inputs(p);
                    // A parameter-only anchor (a positional embedding lookup) still starts a layer.
                    if is_anchor(&self.graph.nodes[p], self.classes) {
                        self.starts.push(self.order.len());
                    }
                    self.order.push(p);
                }
            }
        }
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if !classes.data[i] || placer.placed[i] {
            continue;
        }
        if is_anchor(node, classes) {
            placer.starts.push(placer.order.len());
        }
        placer.place_static_inputs(i);
        placer.placed[i] = true;
        placer.order.push(i);
    }
    for i in 0..graph.nodes.len() {
        if !placer.placed[i] {
            placer.placed[i] = true;
            placer.order.push(i);
        }
    }
    // Nodes in front of the first anchor belong to the first layer.
    let mut starts = placer.starts;
    starts.sort_unstable();
    starts.dedup();
    if !starts.is_empty() {
        starts.remove(0);
    }
    (placer.order, starts)
}

/// For each position 0..=n in the order, the data tensors crossing it.
fn crossing_values(
    graph: &Graph,
    order: &[usize],
    position: &HashMap<usize, usize>,
    classes: &Classes,
) -> Vec<Vec<String>> {
    let n = order.len();
    let mut last_use: HashMap<&str, usize> = HashMap::new();
    for (p, &i) in order.iter().enumerate() {
        for input in graph.nodes[i].inputs.iter().filter(|s| !s.is_empty()) {
            last_use.insert(input.as_str(), p);
        }
    }
    for out in &graph.outputs {
        last_use.insert(out.name.as_str(), n);
    }
    let mut crossing = vec![Vec::new(); n + 1];
    // Graph inputs and values computed from them alone do not cross: the back part is
    // given the inputs it reads (`side_inputs`) and recomputes the rest.
    for &i in order {
        let produced_at = position[&i];
        let crosses = |o: &&String| classes.data_values.contains(*o) && !classes.input_only.contains_key(*o);
        for out in graph.nodes[i].outputs.iter().filter(crosses) {
            if let Some(&last) = last_use.get(out.as_str()) {
                for slot in crossing.iter_mut().take(last + 1).skip(produced_at + 1) {
                    slot.push(out.clone());
                }
            }
        }
    }
    crossing
}

/// For each graph input read for its values, directly or through input-only values, the
/// last position in the order where that happens (a read of a shape alone does not count:
/// either side recomputes a shape from its own activation). A cut at position p has as side
/// inputs those read at p or later.
fn last_value_reads<'g>(graph: &'g Graph, order: &[usize], classes: &'g Classes) -> HashMap<&'g str, usize> {
    let n = order.len();
    // Only nodes the model's first output needs: the part behind a cut computes that one
    // (`cut_model`), so another output made from the inputs alone needs nothing there.
    let mut wanted: HashSet<&str> = graph.outputs.first().map(|o| o.name.as_str()).into_iter().collect();
    let mut needed = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|o| wanted.contains(o.as_str())) {
            needed[i] = true;
            wanted.extend(node.inputs.iter().map(String::as_str));
        }
    }
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (p, &i) in order.iter().enumerate().filter(|&(_, &i)| needed[i]) {
        let node = &graph.nodes[i];
        for (k, v) in node.inputs.iter().enumerate() {
            if is_metadata_input(node, k) {
                continue;
            }
            for root in classes.input_only.get(v).into_iter().flatten() {
                last.insert(root.as_str(), p);
            }
        }
    }
    if let Some(out) = graph.outputs.first() {
        for root in classes.input_only.get(&out.name).into_iter().flatten() {
            last.insert(root.as_str(), n);
        }
    }
    last
}

fn layer_name(parameter_names: &[String], first: &Node) -> String {
    let trimmed: Vec<&str> = parameter_names
        .iter()
        .map(|n| n.strip_suffix(".weight").or_else(|| n.strip_suffix(".bias")).unwrap_or(n))
        .collect();
    let Some(first_name) = trimmed.first() else { return first.name.clone() };
    let mut prefix: Vec<&str> = first_name.split('.').collect();
    for name in &trimmed[1..] {
        let parts: Vec<&str> = name.split('.').collect();
        let common = prefix.iter().zip(&parts).take_while(|(a, b)| a == b).count();
        prefix.truncate(common);
    }
    if prefix.is_empty() { first.name.clone() } else { prefix.join(".") }
}

fn per_sample_elements(shape: &[Dim]) -> u64 {
    shape.iter().fold(1u64, |acc, d| acc.saturating_mul(d.fixed().unwrap_or(1) as u64))
}

fn elements(inference: &Inference, name: Option<&str>) -> u64 {
    name.and_then(|n| inference.types.get(n)).and_then(|v| v.shape.as_ref()).map_or(0, |s| per_sample_elements(s))
}

/// Forward FLOPs per sample of one node, as its op's entry in [`crate::ops::OPS`] counts
/// them; an op without an entry is an error naming the node.
pub fn node_flops(node: &Node, inference: &Inference) -> Result<u64> {
    let spec = spec(&node.domain, &node.op_type)
        .ok_or_else(|| GraphError::node(node, "no FLOP count for this op (unsupported)"))?;
    Ok(match spec.flops {
        Flops::Zero => 0,
        Flops::PerOutput(n) => elements(inference, node.output(0)).saturating_mul(n),
        Flops::PerInput => elements(inference, node.input(0)),
        Flops::Rule(rule) => rule(node, inference),
    })
}

fn input_shape(node: &Node, inference: &Inference, i: usize) -> Shape {
    node.input(i).and_then(|n| inference.types.get(n)).and_then(|v| v.shape.clone()).unwrap_or_default()
}

fn fixed_dim(s: &Shape, i: usize) -> u64 {
    s.get(i).and_then(Dim::fixed).unwrap_or(1) as u64
}

/// One output element per bias value, where there is a bias (input 2).
fn bias_flops(node: &Node, out: u64) -> u64 {
    if node.input(2).is_some() { out } else { 0 }
}

/// A multiply-add per weight of an output channel's kernel, per output element.
pub(crate) fn conv_flops(node: &Node, inference: &Inference) -> u64 {
    let out = elements(inference, node.output(0));
    let w = input_shape(node, inference, 1);
    let per_output = per_sample_elements(&w[1.min(w.len())..]);
    2u64.saturating_mul(out).saturating_mul(per_output).saturating_add(bias_flops(node, out))
}

/// Each input element is multiplied by the `C_out/group × kernel` weights it spreads over.
pub(crate) fn conv_transpose_flops(node: &Node, inference: &Inference) -> u64 {
    let input = elements(inference, node.input(0));
    let out = elements(inference, node.output(0));
    let w = input_shape(node, inference, 1);
    let per_input = per_sample_elements(&w[1.min(w.len())..]);
    2u64.saturating_mul(input).saturating_mul(per_input).saturating_add(bias_flops(node, out))
}

pub(crate) fn gemm_flops(node: &Node, inference: &Inference) -> u64 {
    let out = elements(inference, node.output(0));
    let a = input_shape(node, inference, 0);
    let k = if node.attr_int("transA", 0).unwrap_or(0) != 0 { fixed_dim(&a, 0) } else { fixed_dim(&a, 1) };
    2u64.saturating_mul(out).saturating_mul(k).saturating_add(bias_flops(node, out))
}

/// A multiply-add per point of the full index space (every subscript's size, the
/// ellipsis's dimensions) per extra operand; one operand only sums (or moves) its elements.
pub(crate) fn einsum_flops(node: &Node, inference: &Inference) -> u64 {
    let Ok(equation) = crate::einsum::Equation::of_node(node) else { return 0 };
    let shapes: Vec<Shape> = (0..node.inputs.len()).map(|i| input_shape(node, inference, i)).collect();
    let refs: Vec<&[Dim]> = shapes.iter().map(Vec::as_slice).collect();
    let Ok(bound) = equation.bind(&refs) else { return 0 };
    let space = per_sample_elements(&bound.ellipsis)
        .saturating_mul(per_sample_elements(&bound.letters.values().cloned().collect::<Vec<_>>()));
    match node.inputs.len() {
        0 | 1 => space,
        n => space.saturating_mul(2 * (n as u64 - 1)),
    }
}

pub(crate) fn matmul_flops(node: &Node, inference: &Inference) -> u64 {
    let out = elements(inference, node.output(0));
    let a = input_shape(node, inference, 0);
    2u64.saturating_mul(out).saturating_mul(fixed_dim(&a, a.len().saturating_sub(1)))
}

/// A multiply-add per neighbour read, per output element: 2 neighbours along each axis
/// the resize changes in linear mode, 4 in cubic; nearest neighbour only copies.
pub(crate) fn resize_flops(node: &Node, inference: &Inference) -> u64 {
    let taps_per_axis: u64 = match node.attr_string("mode", "nearest").as_deref() {
        Ok("linear") => 2,
        Ok("cubic") => 4,
        _ => return 0,
    };
    let (x, y) = (input_shape(node, inference, 0), elements(inference, node.output(0)));
    let out = node.output(0).and_then(|n| inference.types.get(n)).and_then(|v| v.shape.clone()).unwrap_or_default();
    let resized = x.iter().zip(&out).filter(|(a, b)| a != b).count() as u32;
    2u64.saturating_mul(y).saturating_mul(taps_per_axis.saturating_pow(resized))
}

/// One per window element per output element (pooling).
pub(crate) fn window_flops(node: &Node, inference: &Inference) -> u64 {
    let out = elements(inference, node.output(0));
    let k = node
        .attr_ints("kernel_shape")
        .ok()
        .flatten()
        .map_or(1, |k| k.iter().fold(1u64, |acc, &v| acc.saturating_mul(v.max(1) as u64)));
    out.saturating_mul(k)
}
