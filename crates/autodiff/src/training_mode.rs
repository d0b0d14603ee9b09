//! The forward pass as training runs it: BatchNormalization from batch statistics (with
//! its running statistics as new values), LayerNormalization spelled out so its
//! statistics are available to the backward pass, and Dropout with a mask computed from a
//! seed input, so a step can be replayed.

use crate::emit::Emitter;
use crate::error::{AutodiffError, Result};
use crate::grad::{BatchNormSaved, Composite, CompositeRule, LayerNormSaved};
use crate::rules;
use edgefreeze_graph::infer::Inference;
use edgefreeze_graph::ir::{Attribute, Node};
use std::collections::{HashMap, HashSet};

/// Name of the scalar int64 input that seeds dropout masks.
pub const DROPOUT_SEED: &str = "dropout_seed";

/// The training-mode forward nodes and what they add to the graph's interface.
pub struct TrainingForward {
    /// Forward nodes in topological order.
    pub nodes: Vec<Node>,
    /// (running-statistic initializer, its updated value) for every BatchNormalization.
    pub running_updates: Vec<(String, String)>,
    /// Whether the nodes read [`DROPOUT_SEED`].
    pub uses_dropout_seed: bool,
    /// Groups of these nodes the reverse pass differentiates as one (training-mode
    /// BatchNormalizations and LayerNormalizations, GELUs spelled out with `Erf`).
    pub composites: Vec<Composite>,
}

/// Rewrites forward nodes for training. `emitter` provides fresh names. Nodes named in
/// `inference` (frozen layers) run as in inference instead: BatchNormalization from its
/// running statistics, which it does not update, and Dropout as the identity, so their
/// outputs are a pure function of their inputs.
pub fn rewrite_for_training(
    nodes: &[Node],
    types: &Inference,
    emitter: &mut Emitter,
    inference: &HashSet<String>,
) -> Result<TrainingForward> {
    let mut out = Vec::with_capacity(nodes.len());
    let mut running_updates = Vec::new();
    let mut uses_dropout_seed = false;
    let mut composites = gelu_groups(nodes, types);
    composites.extend(silu_groups(nodes));
    let read: HashSet<&str> = nodes.iter().flat_map(|n| n.inputs.iter().map(String::as_str)).collect();
    for node in nodes {
        emitter.set_prefix(&node.name);
        if inference.contains(&node.name) && rewrite_for_inference(node, types, emitter)? {
            out.append(&mut emitter.nodes);
            continue;
        }
        match node.op_type.as_str() {
            "BatchNormalization" => {
                // Outputs 1 and 2 (the updated running statistics) become state updates, and
                // 3 and 4 (opsets 9 to 13: the batch's saved statistics) are not computed.
                if let Some(out) = node.outputs.iter().skip(1).find(|o| !o.is_empty() && read.contains(o.as_str())) {
                    return Err(AutodiffError::node(
                        node,
                        format!("its output {out:?} is read by another node; training computes only output 0"),
                    ));
                }
                composites.push(batch_norm(node, types, emitter, &mut running_updates)?);
            }
            "LayerNormalization" => composites.extend(layer_norm(node, types, emitter)?),
            "InstanceNormalization" => instance_norm(node, types, emitter)?,
            "Dropout" => {
                uses_dropout_seed |= dropout(node, types, emitter)?;
            }
            // The gradient reads the pool's argmax (see rules::max_pool_scatters): the
            // forward computes it once, instead of the backward pooling again.
            "MaxPool" if node.outputs.len() == 1 && rules::max_pool_scatters(node, emitter.opset)? => {
                let mut pool = node.clone();
                pool.outputs.push(emitter.fresh("indices"));
                emitter.set_prefix("");
                out.push(pool);
                continue;
            }
            _ => {
                emitter.set_prefix("");
                out.append(&mut emitter.nodes);
                out.push(node.clone());
                continue;
            }
        }
        out.append(&mut emitter.nodes);
    }
    emitter.set_prefix("");
    Ok(TrainingForward { nodes: out, running_updates, uses_dropout_seed, composites })
}

fn rank_of(node: &Node, types: &Inference, name: &str) -> Result<usize> {
    types
        .types
        .get(name)
        .and_then(|t| t.shape.as_ref())
        .map(|s| s.len())
        .ok_or_else(|| AutodiffError::node(node, format!("value {name:?} has no known shape")))
}

/// Normalises `x` over `axes` with `eps`: returns (x̂, mean, biased variance, standard
/// deviation √(var + eps)), the statistics kept with their reduced axes.
fn normalize(e: &mut Emitter, x: &str, axes: &[i64], eps: f64) -> (String, String, String, String) {
    let mean = e.reduce_mean(x, axes, true);
    let centered = e.sub(x, &mean);
    let squared = e.mul(&centered, &centered);
    let var = e.reduce_mean(&squared, axes, true);
    let epsilon = e.scalar(eps);
    let shifted = e.add(&var, &epsilon);
    let std = e.op("Sqrt", &[&shifted], vec![]);
    (e.div(&centered, &std), mean, var, std)
}

/// The five inputs of a BatchNormalization (x, scale, bias, mean, variance) and the rank of x.
fn batch_norm_inputs(node: &Node, types: &Inference) -> Result<([String; 5], usize)> {
    let inputs = [0, 1, 2, 3, 4].map(|i| node.input(i).map(String::from).unwrap_or_default());
    if inputs.iter().any(|s| s.is_empty()) {
        return Err(AutodiffError::node(node, "BatchNormalization needs all five inputs"));
    }
    let rank = rank_of(node, types, &inputs[0])?;
    if rank < 2 {
        return Err(AutodiffError::node(node, "BatchNormalization input must be N×C×..."));
    }
    Ok((inputs, rank))
}

/// Emits the training-mode forward of a BatchNormalization and returns the composite
/// through which the reverse pass differentiates it (the textbook backward, see
/// [`crate::rules::batch_norm_training`], instead of the element-wise ops' rules).
fn batch_norm(
    node: &Node,
    types: &Inference,
    e: &mut Emitter,
    updates: &mut Vec<(String, String)>,
) -> Result<Composite> {
    let ([x, scale, bias, running_mean, running_var], rank) = batch_norm_inputs(node, types)?;
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let momentum = node.attr_float("momentum", 0.9)? as f64;
    let axes: Vec<i64> = std::iter::once(0).chain(2..rank as i64).collect();
    let first = e.nodes.len();
    let (normalized, mean, var, std) = normalize(e, &x, &axes, eps);
    let spatial: Vec<i64> = (1..rank as i64 - 1).collect();
    let scale_b = if spatial.is_empty() { scale.clone() } else { e.unsqueeze(&scale, &spatial) };
    let bias_b = if spatial.is_empty() { bias.clone() } else { e.unsqueeze(&bias, &spatial) };
    let scaled = e.mul(&normalized, &scale_b);
    let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?;
    e.op_into("Add", &[&scaled, &bias_b], &[y], vec![]);
    let inner: HashSet<String> =
        e.nodes[first..].iter().flat_map(|n| n.outputs.iter().cloned()).filter(|o| o != y).collect();
    let composite = Composite {
        output: y.to_string(),
        inner,
        rule: CompositeRule::BatchNorm(BatchNormSaved {
            x: x.clone(),
            scale: scale.clone(),
            bias: bias.clone(),
            scale_b,
            normalized: normalized.clone(),
            std,
            axes: axes.clone(),
        }),
    };
    // Running statistics, as PyTorch keeps them: the variance is the unbiased one.
    let mean_c = e.reshape(&mean, &[-1]);
    let var_c = e.reshape(&var, &[-1]);
    // The count is read off x̂, not x: the statistics' update runs after the forward pass,
    // and a `Size` of x there would keep the layer's input alive until then; x̂ is kept
    // for the backward anyway.
    let count = e.numel(&normalized);
    let channels = e.numel(&mean_c);
    let n = e.div(&count, &channels);
    let one = e.scalar(1.0);
    let n1 = e.sub(&n, &one);
    let correction = e.div(&n, &n1);
    let unbiased = e.mul(&var_c, &correction);
    for (running, batch) in [(&running_mean, &mean_c), (&running_var, &unbiased)] {
        let kept = e.scale(running, momentum);
        let fresh = e.scale(batch, 1.0 - momentum);
        let updated = e.op("Add", &[&kept, &fresh], vec![]);
        updates.push((running.clone(), updated));
    }
    Ok(composite)
}

/// Emits the inference form of a node whose training and inference behaviour differ
/// (BatchNormalization, Dropout) and returns true; returns false for every other node,
/// which is the same in both modes.
pub fn rewrite_for_inference(node: &Node, types: &Inference, e: &mut Emitter) -> Result<bool> {
    match node.op_type.as_str() {
        "Dropout" => {
            let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?;
            let x = node.input(0).ok_or_else(|| AutodiffError::node(node, "input 0 is missing"))?;
            // The mask output, like the eval graphs always had it, is not produced.
            e.op_into("Identity", &[x], &[y], vec![]);
            Ok(true)
        }
        "BatchNormalization" => {
            batch_norm_inference(node, types, e)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// BatchNormalization in inference mode, spelled out in primitive ops:
/// `(x - mean) / sqrt(var + eps) * scale + bias` with the running statistics. The eval
/// graph takes the statistics as inputs, and engines such as tract only run a fused
/// BatchNormalization whose statistics are constants.
pub fn batch_norm_inference(node: &Node, types: &Inference, e: &mut Emitter) -> Result<()> {
    let ([x, scale, bias, mean, var], rank) = batch_norm_inputs(node, types)?;
    let eps = node.attr_float("epsilon", 1e-5)? as f64;
    let spatial: Vec<i64> = (1..rank as i64 - 1).collect();
    let [scale, bias, mean, var] =
        [scale, bias, mean, var].map(|v| if spatial.is_empty() { v } else { e.unsqueeze(&v, &spatial) });
    let epsilon = e.scalar(eps);
    let shifted = e.add(&var, &epsilon);
    let std = e.op("Sqrt", &[&shifted], vec![]);
    let centered = e.sub(&x, &mean);
    let normalized = e.div(&centered, &std);
    let scaled = e.mul(&normalized, &scale);
    let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?;
    e.op_into("Add", &[&scaled, &bias], &[y], vec![]);
    Ok(())
}

/// Emits a LayerNormalization spelled out for training, and the composite through which
/// the reverse pass differentiates it where the scale and bias have the normalised axes'
/// known shape (as the operator requires); otherwise (`None`) its ops' own rules do.
fn layer_norm(node: &Node, types: &Inference, e: &mut Emitter) -> Result<Option<Composite>> {
    let x = node.input(0).unwrap_or_default().to_string();
    let rank = rank_of(node, types, &x)?;
    let axis = node.attr_int("axis", -1)?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    if !(0..rank as i64).contains(&axis) {
        return Err(AutodiffError::node(node, format!("axis {axis} is out of range")));
    }
    if node.outputs.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(AutodiffError::node(node, "the Mean and InvStdDev outputs are not supported in training"));
    }
    let axes: Vec<i64> = (axis..rank as i64).collect();
    let first = e.nodes.len();
    let (normalized, _, _, std) = normalize(e, &x, &axes, node.attr_float("epsilon", 1e-5)? as f64);
    let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?;
    let scale = node.input(1).unwrap_or_default().to_string();
    let bias = node.input(2).map(String::from);
    let scaled = e.mul(&normalized, &scale);
    match &bias {
        Some(bias) => e.op_into("Add", &[&scaled, bias], &[y], vec![]),
        None => e.op_into("Identity", &[&scaled], &[y], vec![]),
    }
    // Known sizes of `name`'s axes from `from` on (x's leading axes hold the batch).
    let fixed = |name: &str, from: usize| -> Option<Vec<usize>> {
        types.types.get(name)?.shape.as_ref()?.get(from..)?.iter().map(|d| d.fixed()).collect()
    };
    let normalised_shape = fixed(&x, axis as usize);
    let shaped = |name: &str| normalised_shape.is_some() && fixed(name, 0) == normalised_shape;
    if !(shaped(&scale) && bias.as_deref().is_none_or(shaped)) {
        return Ok(None);
    }
    let inner: HashSet<String> =
        e.nodes[first..].iter().flat_map(|n| n.outputs.iter().cloned()).filter(|o| o != y).collect();
    Ok(Some(Composite {
        output: y.to_string(),
        inner,
        rule: CompositeRule::LayerNorm(LayerNormSaved {
            x,
            scale,
            bias,
            normalized,
            std,
            axes,
            leading: (0..axis).collect(),
        }),
    }))
}

/// Emits an InstanceNormalization in primitive ops: each sample's channel normalised over
/// its spatial axes, then scaled and shifted per channel. The same in training and
/// inference (no running statistics); its backward is the primitive ops' rules.
fn instance_norm(node: &Node, types: &Inference, e: &mut Emitter) -> Result<()> {
    let x = node.input(0).unwrap_or_default().to_string();
    let rank = rank_of(node, types, &x)?;
    if rank < 3 {
        return Err(AutodiffError::node(node, "InstanceNormalization input must be N×C×D1×..."));
    }
    let axes: Vec<i64> = (2..rank as i64).collect();
    let (normalized, _, _, _) = normalize(e, &x, &axes, node.attr_float("epsilon", 1e-5)? as f64);
    let scale = e.unsqueeze(node.input(1).unwrap_or_default(), &axes.iter().map(|a| a - 1).collect::<Vec<_>>());
    let bias = e.unsqueeze(node.input(2).unwrap_or_default(), &axes.iter().map(|a| a - 1).collect::<Vec<_>>());
    let scaled = e.mul(&normalized, &scale);
    let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?;
    e.op_into("Add", &[&scaled, &bias], &[y], vec![]);
    Ok(())
}

/// GELUs spelled out with `Erf`, x·½·(1 + erf(x/√2)), as the reverse pass's composites
/// ([`CompositeRule::Gelu`]). Both PyTorch exporters write it so before opset 20, in two
/// orders: `Mul(Mul(x, 1 + erf), ½)` (TorchScript) and `Mul(x, Mul(½, 1 + erf))` (dynamo),
/// x/√2 as `Div(x, √2)` or `Mul(x, 1/√2)`, operands either way round. A group is taken
/// only where each of its inner values has exactly one reader, the next node of the
/// chain, so that no gradient reaches it from outside.
fn gelu_groups(nodes: &[Node], types: &Inference) -> Vec<Composite> {
    let mut producer: HashMap<&str, &Node> = HashMap::new();
    let mut readers: HashMap<&str, Vec<&Node>> = HashMap::new();
    for n in nodes {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            producer.insert(o, n);
        }
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            readers.entry(i).or_default().push(n);
        }
    }
    let is = |name: &str, want: f64| {
        types
            .constants
            .get(name)
            .and_then(|t| t.to_f64_vec())
            .is_some_and(|v| v.len() == 1 && (v[0] - want).abs() <= 1e-6 * want.abs())
    };
    // The one reader of `value`, if it is of `op_type` with two inputs.
    let only_reader = |value: &str, op_type: &str| -> Option<&Node> {
        match readers.get(value).map(Vec::as_slice) {
            Some([n]) if n.op_type == op_type && n.inputs.len() == 2 => Some(*n),
            _ => None,
        }
    };
    // The operand of a two-input node that is not `value`.
    let other = |n: &Node, value: &str| -> Option<String> {
        match (n.inputs[0].as_str(), n.inputs[1].as_str()) {
            (a, b) if a == value => Some(b.to_string()),
            (a, b) if b == value => Some(a.to_string()),
            _ => None,
        }
    };
    let mut groups = Vec::new();
    for erf in nodes.iter().filter(|n| n.op_type == "Erf" && n.inputs.len() == 1 && n.outputs.len() == 1) {
        let found = (|| -> Option<Composite> {
            let u = erf.inputs[0].as_str();
            let scaled_by = producer.get(u)?;
            let x = match (scaled_by.op_type.as_str(), scaled_by.inputs.as_slice()) {
                ("Div", [x, c]) if is(c.as_str(), std::f64::consts::SQRT_2) => x.clone(),
                ("Mul", [a, b]) if is(b.as_str(), std::f64::consts::FRAC_1_SQRT_2) => a.clone(),
                ("Mul", [a, b]) if is(a.as_str(), std::f64::consts::FRAC_1_SQRT_2) => b.clone(),
                _ => return None,
            };
            let erf_out = erf.outputs[0].as_str();
            let plus_one = only_reader(erf_out, "Add")?;
            if !is(other(plus_one, erf_out)?.as_str(), 1.0) {
                return None;
            }
            let t = plus_one.outputs.first()?.as_str();
            let next = only_reader(t, "Mul")?;
            let partner = other(next, t)?;
            let mid = next.outputs.first()?.as_str();
            let last = only_reader(mid, "Mul")?;
            let rest = other(last, mid)?;
            // x·t then ·½, or ½·t then ·x.
            let halves = (partner == x && is(rest.as_str(), 0.5)) || (is(partner.as_str(), 0.5) && rest == x);
            if !halves || readers.get(u).map_or(0, Vec::len) != 1 {
                return None;
            }
            let output = last.outputs.first()?.clone();
            let inner = [u, erf_out, t, mid].into_iter().map(String::from).collect();
            Some(Composite { output, inner, rule: CompositeRule::Gelu { x } })
        })();
        groups.extend(found);
    }
    groups
}

/// SiLU spelled out, `Mul(x, Sigmoid(x))` in either order, where the Sigmoid's output
/// has no other reader: one group differentiated from x alone ([`CompositeRule::Silu`]).
/// Both PyTorch exporters write `torch.nn.SiLU` so (EfficientNet's 49 activations); the
/// squeeze-and-excitation gates, x·Sigmoid(z) with z another value, are not this.
fn silu_groups(nodes: &[Node]) -> Vec<Composite> {
    let mut readers: HashMap<&str, Vec<&Node>> = HashMap::new();
    for n in nodes {
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            readers.entry(i).or_default().push(n);
        }
    }
    let mut groups = Vec::new();
    for sigmoid in nodes.iter().filter(|n| n.op_type == "Sigmoid" && n.inputs.len() == 1 && n.outputs.len() == 1) {
        let (x, s) = (sigmoid.inputs[0].as_str(), sigmoid.outputs[0].as_str());
        let Some([product]) = readers.get(s).map(Vec::as_slice) else { continue };
        let silu = product.op_type == "Mul"
            && product.outputs.len() == 1
            && matches!(product.inputs.as_slice(), [a, b] if (a == x && b == s) || (a == s && b == x));
        if silu {
            groups.push(Composite {
                output: product.outputs[0].clone(),
                inner: [s.to_string()].into_iter().collect(),
                rule: CompositeRule::Silu { x: x.to_string() },
            });
        }
    }
    groups
}

/// The ratio of a Dropout and whether it is in training mode. Opset 12 on takes both as
/// inputs; a training-mode export feeds them from `Constant` nodes, so they are known at
/// load time. A value computed at run time cannot be: the graph's structure depends on it.
fn dropout_settings(node: &Node, types: &Inference) -> Result<(f64, bool)> {
    let constant = |i: usize, what: &str| -> Result<Option<f64>> {
        let Some(name) = node.input(i) else { return Ok(None) };
        let value = types.constants.get(name).and_then(|t| t.to_f64_vec()).ok_or_else(|| {
            AutodiffError::node(
                node,
                format!("the Dropout {what} ({name:?}) must be a constant known when the model is loaded"),
            )
        })?;
        match value.as_slice() {
            [v] => Ok(Some(*v)),
            _ => Err(AutodiffError::node(node, format!("the Dropout {what} ({name:?}) must be a scalar"))),
        }
    };
    let ratio = match constant(1, "ratio")? {
        Some(r) => r,
        None => node.attr_float("ratio", 0.5)? as f64,
    };
    // Without the input, a Dropout in a training graph trains (the model's own flag is
    // for inference engines, which ignore it).
    let training = constant(2, "training_mode")?.is_none_or(|t| t != 0.0);
    Ok((ratio, training))
}

/// A dropout mask from a counter-based integer hash of (seed, node name, element index),
/// in exact int64 arithmetic so every engine draws the same mask. Keyed by the node's
/// name, not its position, so a graph cut into parts draws the masks the whole graph
/// does. Returns whether the seed is read.
fn dropout(node: &Node, types: &Inference, e: &mut Emitter) -> Result<bool> {
    let x = node.input(0).unwrap_or_default().to_string();
    let y = node.output(0).ok_or_else(|| AutodiffError::node(node, "output 0 is missing"))?.to_string();
    let (ratio, training) = dropout_settings(node, types)?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(AutodiffError::node(node, format!("a Dropout ratio of {ratio} is outside [0, 1]")));
    }
    if !training || ratio == 0.0 {
        e.op_into("Identity", &[&x], &[&y], vec![]);
        if let Some(mask_out) = node.output(1) {
            // Nothing is dropped: the mask is all true.
            let shape = e.shape_of(&x);
            let one = edgefreeze_graph::Tensor::from_i64_as(edgefreeze_graph::DataType::Bool, vec![1], &[1])?;
            e.op_into("ConstantOfShape", &[&shape], &[mask_out], vec![("value", Attribute::Tensor(one))]);
        }
        return Ok(false);
    }
    if ratio >= 1.0 {
        return Err(AutodiffError::node(node, "a Dropout ratio of 1 drops everything"));
    }
    // A quadratic (x² + c mod p) hash over the prime p = 2³¹ − 1: every intermediate stays
    // below 2⁶³, so int64 arithmetic is exact on every engine, and squaring mixes well.
    const PRIME: i64 = (1 << 31) - 1;
    let size = e.op("Size", &[&x], vec![]);
    let zero = e.int_scalar(0);
    let one = e.int_scalar(1);
    let flat = e.op("Range", &[&zero, &size, &one], vec![]);
    let shape = e.shape_of(&x);
    let index_t = e.op("Reshape", &[&flat, &shape], vec![]);
    let prime = e.int_scalar(PRIME);
    let spread = e.int_scalar(2_654_435_761);
    let scattered = e.mul(&index_t, &spread);
    let index_h = e.op("Mod", &[&scattered, &prime], vec![]);
    let seed = e.op("Mod", &[DROPOUT_SEED, &prime], vec![]);
    let seed_k = e.int_scalar(40_503);
    let seed_mixed = e.mul(&seed, &seed_k);
    let salt = e.int_scalar(name_hash(&node.name) % PRIME);
    let keyed = e.add(&seed_mixed, &salt);
    let mut h = e.add(&index_h, &keyed);
    for c in [12_345i64, 1_013_904_223, 362_436_069, 521_288_629] {
        let reduced = e.op("Mod", &[&h, &prime], vec![]);
        // h·(h + p) ≡ h² (mod p); written with two operands so no engine turns it into an
        // integer Square it may lack.
        let shifted = e.add(&reduced, &prime);
        let squared = e.mul(&reduced, &shifted);
        let k = e.int_scalar(c);
        h = e.add(&squared, &k);
    }
    let h = e.op("Mod", &[&h, &prime], vec![]);
    let float = e.float;
    let u = e.cast(&h, float);
    let threshold = e.scalar(ratio * PRIME as f64);
    let dropped = e.op("Less", &[&u, &threshold], vec![]);
    let kept = e.op("Not", &[&dropped], vec![]);
    let mask = e.cast(&kept, float);
    let scaled = e.divide(&mask, 1.0 - ratio);
    e.op_into("Mul", &[&x, &scaled], &[&y], vec![]);
    if let Some(mask_out) = node.output(1) {
        e.op_into("Identity", &[&kept], &[mask_out], vec![]);
    }
    Ok(true)
}

/// FNV-1a of a name, folded to a non-negative i64.
fn name_hash(name: &str) -> i64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    (hash >> 1) as i64
}
