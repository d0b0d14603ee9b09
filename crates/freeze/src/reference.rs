//! The int8 reference model: a quantized copy of the model being trained, in standard
//! ONNX (`ai.onnx` QuantizeLinear / DequantizeLinear), that exposes the activations at
//! the layer boundaries.
//!
//! - **Weights** of Conv, Gemm and MatMul are int8 initializers with one symmetric scale
//!   per output channel (zero point 0), dequantized in the graph. They use 7 bits
//!   ([`WEIGHT_QMAX`]): see there for why.
//! - **Activations** entering and leaving those ops are quantized per tensor,
//!   symmetric int8, with scales calibrated on a batch by the float model (one run of
//!   [`calibration_model`]), so every matrix product reads and writes int8-rounded
//!   values — the pattern ONNX Runtime fuses into int8 kernels.
//! - **Biases** are int32 with scale `activation scale × weight scale`, as ONNX's QDQ
//!   convention wants.
//! - BatchNormalization runs in inference mode with the running statistics of the copy
//!   (it is the inference model's own op), Dropout is off: [`inference_form`], which
//!   the float models compared with the reference ([`probe_model`],
//!   [`live_probe_model`]) and the calibration model share.

use crate::error::{FreezeError, Result};
use edgefreeze_graph::analysis::Analysis;
use edgefreeze_graph::ir::{Attribute, Model, Node, ValueInfo, fixed_shape};
use edgefreeze_graph::{DataType, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Name of the output exposing the activation after layer `layer` (the same name the
/// training graph's probes use).
pub fn probe_name(layer: usize) -> String {
    format!("probe.{layer}")
}

/// The largest int8 magnitude of an activation: symmetric quantization keeps −128 unused.
const QMAX: f32 = 127.0;

/// The largest int8 magnitude of a weight: 7 bits, not 8. ONNX Runtime runs int8
/// products on x86 without VNNI (AVX2, AVX-512 without VNNI) as unsigned activations
/// (the signed ones shifted by 128) times signed weights, with an instruction that adds
/// each pair of products into an int16 with saturation: 2 × 255 × 127 overflows it,
/// 2 × 255 × 63 = 32130 does not. With 8-bit weights the saturated sums made LeNet-5's
/// first convolution wrong on such a machine (SP against the float model 8e-4, half
/// that of a model with shuffled weights; 1e-7 with 7 bits); machines with VNNI do not
/// saturate, so 7 bits give the same answer on every CPU. ONNX Runtime's own quantizer
/// calls this `reduce_range`.
const WEIGHT_QMAX: f32 = 63.0;

/// The largest int32 bias magnitude the weight scales leave room for: 2³⁰, a factor 2
/// below the type's limit, so that rounding the scales cannot push a bias over it.
const BIAS_QMAX: f32 = 1_073_741_824.0;

/// A matrix product whose weight is an initializer: what gets quantized.
struct Quantizable {
    node: usize,
    /// The weight initializer and its output-channel axis.
    weight: String,
    axis: usize,
    /// The op reads the weight through a Transpose (of this output): a Linear layer as
    /// TorchScript and dynamo export it for 3-D inputs, `MatMul(x, Transpose(W))`.
    transposed: Option<String>,
    /// A 1-D bias with one value per output channel, if any.
    bias: Option<String>,
}

/// The model as inference runs it. TorchScript's training-mode export (the usual way to
/// get a model whose BatchNorm can be trained) writes each BatchNormalization with
/// `training_mode = 1` and the updated running statistics as two more outputs, and each
/// Dropout with `training_mode` true: run as they are, they normalise with the batch's
/// statistics and drop at random, and tract refuses the three-output BatchNormalization
/// outright. Here a BatchNormalization keeps its first output and its running statistics,
/// and a Dropout becomes an Identity, node for node (indices and names unchanged), so the
/// reference, the float models it is compared with and the calibration all compute the
/// same deterministic function. A node whose extra outputs something reads is an error:
/// nothing in an inference model should.
pub fn inference_form(model: &Model) -> Result<Model> {
    let read: HashSet<&str> = model
        .graph
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().map(String::as_str))
        .chain(model.graph.outputs.iter().map(|o| o.name.as_str()))
        .collect();
    let mut out = model.clone();
    for node in out.graph.nodes.iter_mut() {
        let kept = match node.op_type.as_str() {
            "BatchNormalization" | "Dropout" => 1,
            _ => continue,
        };
        if let Some(used) = node.outputs.iter().skip(kept).find(|o| !o.is_empty() && read.contains(o.as_str())) {
            return Err(FreezeError::Reference(format!(
                "node {:?} ({}): its output {used:?} is read, which an inference model cannot give",
                node.name, node.op_type
            )));
        }
        node.outputs.truncate(kept);
        if node.op_type == "Dropout" {
            node.op_type = "Identity".into();
            node.inputs.truncate(1);
            node.attributes.clear();
        } else {
            node.attributes.shift_remove("training_mode");
        }
    }
    Ok(out)
}

fn quantizable(model: &Model) -> Result<Vec<Quantizable>> {
    let graph = &model.graph;
    let producers = graph.producers();
    let mut found = Vec::new();
    for (i, n) in graph.nodes.iter().enumerate() {
        let Some(b) = n.input(1) else { continue };
        // The weight: an initializer, or a 2-D initializer transposed by a Transpose node.
        let (weight, transposed) = if graph.initializers.contains_key(b) {
            (b, None)
        } else {
            let Some(t) = producers.get(b).map(|&p| &graph.nodes[p]).filter(|t| t.op_type == "Transpose") else {
                continue;
            };
            let Some(w) = t.input(0).filter(|w| graph.initializers.get(*w).is_some_and(|w| w.dims().len() == 2)) else {
                continue;
            };
            // A 2-D Transpose swaps the axes, with or without its `perm`.
            if t.attr_ints("perm").map_err(FreezeError::Graph)?.is_some_and(|p| p != [1, 0]) {
                continue;
            }
            (w, Some(b.to_string()))
        };
        let Some(x) = n.input(0) else { continue };
        if graph.initializers.contains_key(x) {
            continue;
        }
        let w = &graph.initializers[weight];
        if w.dtype() != DataType::Float32 {
            continue;
        }
        let b_axis = match n.op_type.as_str() {
            "Conv" => 0,
            // B is K×N, or N×K when transposed: the output channel is N.
            "Gemm" => {
                if n.attr_int("transB", 0).map_err(FreezeError::Graph)? != 0 {
                    0
                } else {
                    1
                }
            }
            "MatMul" if w.dims().len() == 2 => 1,
            _ => continue,
        };
        // The output channel's axis in the initializer itself.
        let axis = if transposed.is_some() { 1 - b_axis } else { b_axis };
        let channels = w.dims()[axis];
        let bias_input = match n.op_type.as_str() {
            "Conv" | "Gemm" => n.input(2),
            _ => None,
        };
        let bias = bias_input
            .filter(|b| graph.initializers.get(*b).is_some_and(|t| t.dims() == [channels] && t.dtype() == w.dtype()))
            .map(String::from);
        found.push(Quantizable { node: i, weight: weight.to_string(), axis, transposed, bias });
    }
    Ok(found)
}

/// Name of the output through which [`calibration_model`] exposes tensor `name` (through
/// an Identity: tract cannot give a graph input back as an output).
pub fn calibration_output(name: &str) -> String {
    format!("calibrate/{name}")
}

/// The float model with the input and output of every quantized op exposed as outputs
/// ([`calibration_output`]), so one run gives the ranges the activation scales are
/// calibrated from. Returns the model and the names of the exposed tensors.
pub fn calibration_model(model: &Model) -> Result<(Model, Vec<String>)> {
    let model = &inference_form(model)?;
    let mut names: Vec<String> = Vec::new();
    for q in quantizable(model)? {
        let n = &model.graph.nodes[q.node];
        for name in [&n.inputs[0], &n.outputs[0]] {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    let mut out = model.clone();
    for name in &names {
        let exposed = calibration_output(name);
        out.graph.nodes.push(Node::new(format!("{exposed}/expose"), "Identity", &[name], &[&exposed]));
        let mut info = float_output(model, name);
        info.name = exposed;
        out.graph.outputs.push(info);
    }
    Ok((out, names))
}

fn float_output(model: &Model, name: &str) -> ValueInfo {
    model.graph.value_type(name).unwrap_or(ValueInfo {
        name: name.into(),
        dtype: Some(DataType::Float32),
        shape: None,
        doc_string: String::new(),
    })
}

/// Symmetric scale mapping values whose largest magnitude is `max_abs` onto ±`qmax` (1
/// for all zeros, since a scale must be positive).
fn scale_of(max_abs: f32, qmax: f32) -> f32 {
    if max_abs > 0.0 && max_abs.is_finite() { max_abs / qmax } else { 1.0 }
}

/// The largest magnitude of each calibrated tensor.
pub fn ranges(names: &[String], values: &[&[f32]]) -> BTreeMap<String, f32> {
    names.iter().zip(values).map(|(n, v)| (n.clone(), v.iter().fold(0.0f32, |m, x| m.max(x.abs())))).collect()
}

/// Replaces initializers by live values (parameters and running statistics); each must
/// exist with the same shape.
pub fn with_parameters(model: &Model, values: &[(String, Tensor)]) -> Result<Model> {
    let mut out = model.clone();
    for (name, t) in values {
        let slot = out
            .graph
            .initializers
            .get_mut(name)
            .ok_or_else(|| FreezeError::Reference(format!("the model has no initializer {name:?}")))?;
        if slot.dims() != t.dims() || slot.dtype() != t.dtype() {
            return Err(FreezeError::Reference(format!(
                "{name:?} is {} {:?} in the model but {} {:?} in the live state",
                slot.dtype(),
                slot.dims(),
                t.dtype(),
                t.dims()
            )));
        }
        *slot = t.clone();
    }
    Ok(out)
}

/// Per-channel symmetric 7-bit quantization of a weight along `axis`, stored as int8:
/// (int8 values, scales). Each channel's scale is at least its entry of `least` (empty:
/// no bound).
fn quantize_per_channel(w: &Tensor, axis: usize, least: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let values = w.to_f32_vec().unwrap_or_default();
    let dims = w.dims();
    let channels = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let channel_of = |i: usize| (i / inner) % channels;
    let mut max = vec![0.0f32; channels];
    for (i, v) in values.iter().enumerate() {
        let c = channel_of(i);
        max[c] = max[c].max(v.abs());
    }
    let scales: Vec<f32> = max
        .iter()
        .enumerate()
        .map(|(c, &m)| scale_of(m, WEIGHT_QMAX).max(least.get(c).copied().unwrap_or(0.0)))
        .collect();
    let q = values
        .iter()
        .enumerate()
        .map(|(i, v)| (v / scales[channel_of(i)]).round_ties_even().clamp(-WEIGHT_QMAX, WEIGHT_QMAX) as i8)
        .collect();
    (q, scales)
}

/// Builds the int8 reference model from a float model carrying the live parameters,
/// activation ranges from [`calibration_model`] and [`ranges`], and the layers whose
/// output to expose (as [`probe_name`]).
pub fn reference_model(
    model: &Model,
    analysis: &Analysis,
    ranges: &BTreeMap<String, f32>,
    probes: &[usize],
) -> Result<Model> {
    let model = &inference_form(model)?;
    let targets = quantizable(model)?;
    let by_node: HashMap<usize, &Quantizable> = targets.iter().map(|q| (q.node, q)).collect();
    let src = &model.graph;
    let mut out = model.clone();
    out.graph.nodes.clear();
    out.graph.value_info.clear();
    let range = |name: &str| {
        ranges.get(name).copied().ok_or_else(|| {
            FreezeError::Reference(format!("no calibrated range for {name:?}: calibrate with calibration_model"))
        })
    };
    let mut quantized_activations: HashMap<String, (String, f32)> = HashMap::new();
    let mut dequantized_weights: HashMap<String, (String, Vec<f32>)> = HashMap::new();
    let mut transposed_weights: HashSet<String> = HashSet::new();
    let mut bypassed: HashSet<String> = HashSet::new();
    let inits = &mut out.graph.initializers;
    let nodes = &mut out.graph.nodes;
    for (i, node) in src.nodes.iter().enumerate() {
        let Some(q) = by_node.get(&i) else {
            nodes.push(node.clone());
            continue;
        };
        let mut node = node.clone();
        // Input activation: per-tensor int8.
        let x = node.inputs[0].clone();
        if !quantized_activations.contains_key(&x) {
            let scale = scale_of(range(&x)?, QMAX);
            let dq = qdq(nodes, inits, &x, &format!("{x}.int8"), scale)?;
            quantized_activations.insert(x.clone(), (dq, scale));
        }
        let (x_dq, x_scale) = quantized_activations[&x].clone();
        node.inputs[0] = x_dq;
        // Weight: per-channel int8.
        if !dequantized_weights.contains_key(&q.weight) {
            let w = &src.initializers[&q.weight];
            // The bias is stored as int32 at scale x_scale · w_scale: a channel whose
            // weights are almost zero (one that weight decay has all but switched off)
            // and whose bias is not would need more than 32 bits, and the cast would
            // clamp it silently (a bias of 0.5 came out 0.085). Its weight scale is
            // raised until the bias fits, as ONNX Runtime's quantizer does; its weights
            // then round to fewer levels, which is all such a channel has.
            let least: Vec<f32> = q
                .bias
                .as_ref()
                .map(|b| {
                    let values = src.initializers[b].to_f32_vec().unwrap_or_default();
                    values.iter().map(|v| v.abs() / (x_scale * BIAS_QMAX)).collect()
                })
                .unwrap_or_default();
            let (values, scales) = quantize_per_channel(w, q.axis, &least);
            let base = format!("{}.int8", q.weight);
            let (qname, sname, zname, dname) =
                (format!("{base}.q"), format!("{base}.scale"), format!("{base}.zero"), format!("{base}.dq"));
            let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
            inits.insert(qname.clone(), Tensor::from_raw(DataType::Int8, w.dims().to_vec(), bytes)?);
            inits.insert(sname.clone(), Tensor::from_f32(vec![scales.len()], &scales)?);
            inits.insert(zname.clone(), Tensor::from_raw(DataType::Int8, vec![scales.len()], vec![0; scales.len()])?);
            nodes.push(
                Node::new(format!("{base}/dequantize"), "DequantizeLinear", &[&qname, &sname, &zname], &[&dname])
                    .with_attr("axis", Attribute::Int(q.axis as i64)),
            );
            dequantized_weights.insert(q.weight.clone(), (dname, scales));
        }
        let (mut w_dq, w_scales) = dequantized_weights[&q.weight].clone();
        if let Some(t) = &q.transposed {
            // The op reads the dequantized weight transposed, as it read the float one;
            // the float Transpose it bypasses is removed below if nothing else reads it.
            let tname = format!("{}.int8.dqt", q.weight);
            if !transposed_weights.contains(&tname) {
                nodes.push(Node::new(format!("{}.int8/transpose", q.weight), "Transpose", &[&w_dq], &[&tname]));
                transposed_weights.insert(tname.clone());
            }
            bypassed.insert(t.clone());
            w_dq = tname;
        }
        node.inputs[1] = w_dq;
        // Bias: int32 at the product's scale.
        if let Some(b) = &q.bias {
            let values = src.initializers[b].to_f32_vec().unwrap_or_default();
            let scales: Vec<f32> = w_scales.iter().map(|s| s * x_scale).collect();
            let mut q32: Vec<u8> = Vec::with_capacity(4 * values.len());
            for (c, (v, s)) in values.iter().zip(&scales).enumerate() {
                let q = (f64::from(*v) / f64::from(*s)).round();
                // Only a weight shared by ops whose inputs have other scales can get
                // here (the scales leave room for the bias of the op quantized first).
                if q.abs() > f64::from(i32::MAX) {
                    return Err(FreezeError::Reference(format!(
                        "node {:?}: bias {b:?} channel {c} ({v}) does not fit int32 at scale {s:e}",
                        node.name
                    )));
                }
                q32.extend_from_slice(&(q as i32).to_le_bytes());
            }
            let base = format!("{b}.int32.{i}");
            let (qname, sname, zname, dname) =
                (format!("{base}.q"), format!("{base}.scale"), format!("{base}.zero"), format!("{base}.dq"));
            inits.insert(qname.clone(), Tensor::from_raw(DataType::Int32, vec![values.len()], q32)?);
            inits.insert(sname.clone(), Tensor::from_f32(vec![scales.len()], &scales)?);
            inits.insert(
                zname.clone(),
                Tensor::from_raw(DataType::Int32, vec![scales.len()], vec![0; 4 * scales.len()])?,
            );
            nodes.push(
                Node::new(format!("{base}/dequantize"), "DequantizeLinear", &[&qname, &sname, &zname], &[&dname])
                    .with_attr("axis", Attribute::Int(0)),
            );
            node.inputs[2] = dname;
        }
        // Output activation: per-tensor int8, under the original name.
        let y = node.outputs[0].clone();
        let y_float = format!("{y}.float");
        node.outputs[0] = y_float.clone();
        nodes.push(node);
        let scale = scale_of(range(&y)?, QMAX);
        let dq = qdq(nodes, inits, &y_float, &format!("{y}.int8"), scale)?;
        nodes.push(Node::new(format!("{y}.int8/restore"), "Identity", &[&dq], &[&y]));
        // A quantized op that reads this output directly (a ConvNeXt's Linear after
        // Linear, a 1×1 Conv after a Conv) reads the same int8 values: quantizing them
        // a second time would emit a second `{y}.int8` node, which is invalid ONNX.
        quantized_activations.insert(y, (dq, scale));
    }
    // The float Transposes of weights the ops now read quantized, then every float
    // weight nothing reads any more: a reference is encoded and loaded at every rebuild,
    // and VGG-11's would carry 515 of its 644 MB unread. An initializer the export also
    // lists as a graph input (`keep_initializers_as_inputs`) leaves that list with it, or
    // the engine would wait for a value nobody gives.
    let graph_outputs: HashSet<String> = out.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let read_now = |nodes: &[Node]| -> HashSet<String> {
        nodes.iter().flat_map(|n| n.inputs.iter().cloned()).chain(graph_outputs.iter().cloned()).collect()
    };
    let read = read_now(&out.graph.nodes);
    out.graph
        .nodes
        .retain(|n| !(n.op_type == "Transpose" && n.outputs.iter().all(|o| bypassed.contains(o) && !read.contains(o))));
    let read = read_now(&out.graph.nodes);
    out.graph.initializers.retain(|name, _| read.contains(name));
    out.graph.initializer_inputs.retain(|v| read.contains(&v.name));
    expose_layers(&mut out, model, analysis, probes)?;
    out.producer_name = "edgefreeze-reference".into();
    Ok(out)
}

/// The float model with the output of each layer in `probes` exposed as [`probe_name`]:
/// what the reference model is compared with in tests, and a float reference.
pub fn probe_model(model: &Model, analysis: &Analysis, probes: &[usize]) -> Result<Model> {
    let mut out = inference_form(model)?;
    expose_layers(&mut out, model, analysis, probes)?;
    Ok(out)
}

/// The float model with the initializers named in `parameters` turned into graph inputs
/// (after the data input, in the given order) and the output of each layer in `probes`
/// exposed: one loaded session measures the training model's activations at any
/// parameters, without reloading the graph each time. Each name must be an initializer.
pub fn live_probe_model(model: &Model, analysis: &Analysis, parameters: &[String], probes: &[usize]) -> Result<Model> {
    let mut out = probe_model(model, analysis, probes)?;
    spell_out_batch_norms(&mut out, parameters)?;
    for name in parameters {
        let t = out.graph.initializers.shift_remove(name).ok_or_else(|| {
            FreezeError::Reference(format!("the model has no initializer {name:?} to take as an input"))
        })?;
        out.graph.inputs.push(ValueInfo::new(name.clone(), t.dtype(), fixed_shape(t.dims())));
    }
    Ok(out)
}

/// tract runs a BatchNormalization only when its scale, shift and statistics are
/// constants ("Params are not const"): in the live model they are inputs, so every
/// BatchNormalization reading one is spelled out in primitive ops, in inference mode, as
/// the eval graph writes it (`batch_norm_inference`).
fn spell_out_batch_norms(model: &mut Model, parameters: &[String]) -> Result<()> {
    let inputs: HashSet<&str> = parameters.iter().map(String::as_str).collect();
    let reads_input =
        |n: &Node| n.op_type == "BatchNormalization" && n.inputs.iter().skip(1).any(|i| inputs.contains(i.as_str()));
    if !model.graph.nodes.iter().any(reads_input) {
        return Ok(());
    }
    let types = edgefreeze_graph::infer::infer(&model.graph, model.opset())?;
    let mut emitter = edgefreeze_autodiff::training::emitter_for(model, &[]);
    let mut nodes = Vec::with_capacity(model.graph.nodes.len());
    for node in std::mem::take(&mut model.graph.nodes) {
        if !reads_input(&node) {
            nodes.push(node);
            continue;
        }
        emitter.float =
            node.input(0).and_then(|x| types.types.get(x)).and_then(|t| t.dtype).unwrap_or(DataType::Float32);
        emitter.set_prefix(&node.name);
        edgefreeze_autodiff::training_mode::batch_norm_inference(&node, &types, &mut emitter)
            .map_err(|e| FreezeError::Reference(e.to_string()))?;
        nodes.append(&mut emitter.nodes);
    }
    model.graph.nodes = nodes;
    Ok(())
}

fn expose_layers(out: &mut Model, source: &Model, analysis: &Analysis, probes: &[usize]) -> Result<()> {
    let existing: HashSet<String> = out.graph.outputs.iter().map(|v| v.name.clone()).collect();
    for &l in probes {
        let layer = analysis.layers.get(l).ok_or_else(|| {
            FreezeError::Reference(format!("no layer {l} to probe: the model has {}", analysis.layers.len()))
        })?;
        let name = probe_name(l);
        if existing.contains(&name) {
            return Err(FreezeError::Reference(format!("the model already has an output named {name:?}")));
        }
        out.graph.nodes.push(Node::new(format!("{name}/expose"), "Identity", &[&layer.output], &[&name]));
        let mut info = float_output(source, &layer.output);
        info.name = name;
        out.graph.outputs.push(info);
    }
    Ok(())
}

/// Emits QuantizeLinear → DequantizeLinear of `x` with a per-tensor scale; returns the
/// dequantized value's name.
fn qdq(
    nodes: &mut Vec<Node>,
    inits: &mut indexmap::IndexMap<String, Tensor>,
    x: &str,
    base: &str,
    scale: f32,
) -> Result<String> {
    let (sname, zname, qname, dname) =
        (format!("{base}.scale"), format!("{base}.zero"), format!("{base}.q"), format!("{base}.dq"));
    inits.insert(sname.clone(), Tensor::from_f32(vec![], &[scale])?);
    inits.insert(zname.clone(), Tensor::from_raw(DataType::Int8, vec![], vec![0])?);
    nodes.push(Node::new(format!("{base}/quantize"), "QuantizeLinear", &[x, &sname, &zname], &[&qname]));
    nodes.push(Node::new(format!("{base}/dequantize"), "DequantizeLinear", &[&qname, &sname, &zname], &[&dname]));
    Ok(dname)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(op: &str, inputs: &[&str], outputs: &[&str], attrs: &[(&str, i64)]) -> Node {
        let mut n = Node::new(format!("{op}_0"), op, inputs, outputs);
        for (k, v) in attrs {
            n.attributes.insert((*k).into(), Attribute::Int(*v));
        }
        n
    }

    fn model_of(nodes: Vec<Node>, outputs: &[&str]) -> Model {
        let mut m = Model::default();
        m.graph.nodes = nodes;
        m.graph.outputs = outputs
            .iter()
            .map(|o| ValueInfo { name: (*o).into(), dtype: None, shape: None, doc_string: String::new() })
            .collect();
        m
    }

    #[test]
    fn training_mode_exports_run_as_inference() {
        // TorchScript's training-mode export: BatchNormalization with the running
        // statistics as outputs, Dropout with its ratio and training_mode as inputs.
        let bn =
            node_with("BatchNormalization", &["x", "s", "b", "m", "v"], &["y", "m2", "v2"], &[("training_mode", 1)]);
        let drop = node_with("Dropout", &["y", "ratio", "train"], &["z", "mask"], &[("seed", 3)]);
        let m = model_of(vec![bn, drop], &["z"]);
        let out = inference_form(&m).unwrap();
        let (bn, drop) = (&out.graph.nodes[0], &out.graph.nodes[1]);
        assert_eq!((bn.op_type.as_str(), bn.outputs.as_slice()), ("BatchNormalization", &["y".to_string()][..]));
        assert!(!bn.attributes.contains_key("training_mode"));
        assert_eq!(bn.inputs.len(), 5, "the running statistics stay inputs");
        assert_eq!((drop.op_type.as_str(), drop.name.as_str()), ("Identity", "Dropout_0"));
        assert_eq!((drop.inputs.as_slice(), drop.outputs.as_slice()), (&["y".to_string()][..], &["z".to_string()][..]));
        assert!(drop.attributes.is_empty());
    }

    #[test]
    fn an_extra_output_that_is_read_is_an_error_naming_the_node() {
        let bn =
            node_with("BatchNormalization", &["x", "s", "b", "m", "v"], &["y", "m2", "v2"], &[("training_mode", 1)]);
        let reader = Node::new("reads_mean", "Identity", &["m2"], &["w"]);
        let err = inference_form(&model_of(vec![bn.clone(), reader], &["y", "w"])).unwrap_err().to_string();
        assert!(err.contains("BatchNormalization_0") && err.contains("m2"), "{err}");
        // A graph output counts as read.
        assert!(inference_form(&model_of(vec![bn], &["y", "v2"])).is_err());
    }

    #[test]
    fn per_channel_scales_follow_the_axis() {
        // 2 output channels × 3: channel 0 reaches 0.63, channel 1 reaches 0.126.
        let w = Tensor::from_f32(vec![2, 3], &[0.63, -0.25, 0.0, 0.05, -0.126, 0.1]).unwrap();
        let (q, s) = quantize_per_channel(&w, 0, &[]);
        assert!((s[0] - 0.01).abs() < 1e-9 && (s[1] - 0.002).abs() < 1e-9, "{s:?}");
        assert_eq!(q, vec![63, -25, 0, 25, -63, 50]);
        // Along axis 1 (3 channels of 2 values each).
        let (q, s) = quantize_per_channel(&w, 1, &[]);
        assert_eq!(s.len(), 3);
        // Channel 0 is {0.63, 0.05}, channel 1 {-0.25, -0.126}, channel 2 {0, 0.1}.
        assert_eq!((q[0], q[3]), (63, 5));
        assert_eq!(q[1], -63);
        assert_eq!((q[2], q[5]), (0, 63));
    }

    #[test]
    fn a_bias_fits_int32_however_small_its_channels_weights() {
        // A 1×1 Conv with two channels: channel 1's weights all but zero, its bias 0.5.
        let mut m = Model { opset_imports: vec![(String::new(), 17)], ..Default::default() };
        m.graph.inputs = vec![ValueInfo::new("x", DataType::Float32, fixed_shape(&[1, 2, 1, 1]))];
        m.graph.outputs = vec![ValueInfo::new("y", DataType::Float32, fixed_shape(&[1, 2, 1, 1]))];
        let w = [0.8, -0.4, 3e-7, -2e-7];
        m.graph.initializers.insert("w".into(), Tensor::from_f32(vec![2, 2, 1, 1], &w).unwrap());
        m.graph.initializers.insert("b".into(), Tensor::from_f32(vec![2], &[0.1, 0.5]).unwrap());
        m.graph.nodes = vec![Node::new("conv", "Conv", &["x", "w", "b"], &["y"])];
        let analysis = edgefreeze_graph::analyse(&m).unwrap();
        let ranges: BTreeMap<String, f32> = [("x".to_string(), 1.0), ("y".to_string(), 1.5)].into();
        let r = reference_model(&m, &analysis, &ranges, &[]).unwrap();
        let q = &r.graph.initializers["b.int32.0.q"];
        let scales = r.graph.initializers["b.int32.0.scale"].to_f32_vec().unwrap();
        let ints: Vec<i32> = q.raw_bytes().chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        // The dequantized bias is the bias, to its scale's rounding.
        for (c, want) in [0.1f32, 0.5].iter().enumerate() {
            let got = ints[c] as f32 * scales[c];
            assert!((got - want).abs() <= scales[c], "channel {c}: {got} for {want}");
        }
        assert!(ints.iter().all(|v| v.unsigned_abs() <= BIAS_QMAX as u32), "{ints:?}");
    }

    #[test]
    fn zero_ranges_get_a_positive_scale() {
        assert_eq!(scale_of(0.0, QMAX), 1.0);
        assert_eq!(scale_of(f32::NAN, WEIGHT_QMAX), 1.0);
        assert!((scale_of(12.7, QMAX) - 0.1).abs() < 1e-8);
    }

    #[test]
    fn weights_leave_room_for_an_int16_pair_of_products() {
        // The largest weight of any channel, times the largest shifted activation, twice,
        // fits in an int16 (see WEIGHT_QMAX).
        let w = Tensor::from_f32(vec![1, 4], &[-3.0, 1.0, 2.9, 3.0]).unwrap();
        let (q, _) = quantize_per_channel(&w, 0, &[]);
        let widest = q.iter().map(|v| i32::from(*v).abs()).max().unwrap();
        assert_eq!(widest, WEIGHT_QMAX as i32);
        assert!(2 * 255 * widest <= i32::from(i16::MAX));
    }
}
