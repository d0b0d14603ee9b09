//! The reverse pass: walks the forward nodes backwards, asks each op's rule for the
//! gradients of its inputs, and sums the contributions a value receives.

use crate::emit::Emitter;
use crate::error::{AutodiffError, BlockedOp, Result};
use crate::rules::{self, Gradient, RuleCx};
use edgefreeze_graph::Node;
use edgefreeze_graph::infer::Inference;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A group of forward nodes that the reverse pass differentiates as one: it skips the
/// group's inner nodes and, at the node producing `output`, runs the group's own rule,
/// which is cheaper than the chain of its nodes' rules.
#[derive(Debug, Clone)]
pub struct Composite {
    /// The group's one output that carries a gradient.
    pub output: String,
    /// Values produced by the group's other nodes; only the group reads them on a path
    /// to the objective.
    pub inner: HashSet<String>,
    /// How the group's input gradients are computed.
    pub rule: CompositeRule,
}

/// The rule of a [`Composite`].
#[derive(Debug, Clone)]
pub enum CompositeRule {
    /// A training-mode BatchNormalization, differentiated by
    /// [`rules::batch_norm_training`].
    BatchNorm(BatchNormSaved),
    /// A LayerNormalization spelled out for training, differentiated by
    /// [`rules::layer_norm_training`] from x̂ and σ (the chain of its primitive ops' rules
    /// also kept the centred input).
    LayerNorm(LayerNormSaved),
    /// GELU spelled out with `Erf`, x·½·(1 + erf(x/√2)) (as both PyTorch exporters write
    /// it before opset 20), differentiated from x alone by [`rules::gelu_erf`] (the chain
    /// of its ops' rules kept x/√2 and 1 + erf(x/√2) besides x).
    Gelu {
        /// The input.
        x: String,
    },
    /// SiLU (swish) spelled out, x·Sigmoid(x) (as both PyTorch exporters write it),
    /// differentiated from x alone by [`rules::silu`] (the chain of its ops' rules kept
    /// Sigmoid(x) besides x).
    Silu {
        /// The input.
        x: String,
    },
}

/// What a LayerNormalization's backward reads from its forward.
#[derive(Debug, Clone)]
pub struct LayerNormSaved {
    /// Input.
    pub x: String,
    /// Scale, shaped like the normalised axes.
    pub scale: String,
    /// Bias, shaped like the normalised axes, if the node has one.
    pub bias: Option<String>,
    /// x̂ = (x − mean) / σ, shaped like x.
    pub normalized: String,
    /// σ = √(var + eps) with the normalised axes kept.
    pub std: String,
    /// The normalised axes (the last ones).
    pub axes: Vec<i64>,
    /// The axes before them, over which the scale's and the bias's gradients sum.
    pub leading: Vec<i64>,
}

/// What a training-mode BatchNormalization's backward reads from its forward.
#[derive(Debug, Clone)]
pub struct BatchNormSaved {
    /// Input `[N, C, ...]`.
    pub x: String,
    /// Scale `[C]`.
    pub scale: String,
    /// Bias `[C]`.
    pub bias: String,
    /// The scale shaped to broadcast against x (`[C, 1...]`).
    pub scale_b: String,
    /// x̂ = (x − mean) / std, shaped like x.
    pub normalized: String,
    /// √(var + eps) with the reduced axes kept.
    pub std: String,
    /// The reduced axes: the batch and the spatial axes.
    pub axes: Vec<i64>,
}

impl CompositeRule {
    /// The group's inputs whose gradients the rule produces, in the rule's order.
    fn inputs(&self) -> Vec<&str> {
        match self {
            CompositeRule::BatchNorm(bn) => vec![bn.x.as_str(), bn.scale.as_str(), bn.bias.as_str()],
            CompositeRule::LayerNorm(ln) => {
                [ln.x.as_str(), ln.scale.as_str()].into_iter().chain(ln.bias.as_deref()).collect()
            }
            CompositeRule::Gelu { x } | CompositeRule::Silu { x } => vec![x.as_str()],
        }
    }
}

/// Which values depend on the values in `wrt` through differentiable floating-point paths.
pub fn requiring_grad(forward: &[Node], types: &Inference, wrt: &HashSet<String>) -> HashSet<String> {
    let mut requires: HashSet<String> = wrt.clone();
    for node in forward {
        if matches!(rules::gradient_of(node), Some(Gradient::NoGradient { .. })) {
            continue;
        }
        if node.inputs.iter().any(|i| requires.contains(i)) {
            for out in node.outputs.iter().filter(|o| !o.is_empty()) {
                let float = types.types.get(out).and_then(|t| t.dtype).is_some_and(|d| d.is_float());
                if float {
                    requires.insert(out.clone());
                }
            }
        }
    }
    requires
}

/// The values requiring a gradient, the values whose gradient is needed, and for each
/// forward node whether it is on a path from a value in `wrt` to a seed value (found
/// backwards from the seeds).
pub fn active_nodes(
    forward: &[Node],
    types: &Inference,
    seeds: &[String],
    wrt: &[String],
) -> (HashSet<String>, HashSet<String>, Vec<bool>) {
    let wrt_set: HashSet<String> = wrt.iter().cloned().collect();
    let requires = requiring_grad(forward, types, &wrt_set);
    let mut needed: HashSet<String> = seeds.iter().cloned().collect();
    let mut active = vec![false; forward.len()];
    for (i, node) in forward.iter().enumerate().rev() {
        if node.outputs.iter().any(|o| needed.contains(o)) && node.inputs.iter().any(|v| requires.contains(v)) {
            active[i] = true;
            for v in node.inputs.iter().filter(|v| requires.contains(*v)) {
                needed.insert(v.clone());
            }
        }
    }
    (requires, needed, active)
}

/// The ops of active nodes that the gradient table says cannot be differentiated, each
/// with its nodes and the table's reason, in op order.
pub fn blocking_ops(forward: &[Node], active: &[bool]) -> Vec<BlockedOp> {
    let mut by_op: BTreeMap<String, BlockedOp> = BTreeMap::new();
    for (node, _) in forward.iter().zip(active).filter(|(_, a)| **a) {
        if let Some(reason) = rules::blocked(node) {
            by_op
                .entry(node.op_type.clone())
                .or_insert_with(|| BlockedOp {
                    op_type: node.op_type.clone(),
                    nodes: Vec::new(),
                    reason: reason.into(),
                })
                .nodes
                .push(node.name.clone());
        }
    }
    by_op.into_values().collect()
}

/// Emits the backward pass.
///
/// `seeds` gives the gradient of the objective with respect to some forward values (for
/// a scalar loss: the loss and a constant one). Returns the gradient value of each name
/// in `wrt`, in order; a value the objective does not depend on gets zeros. The nodes of
/// each of `composites` are differentiated by its rule instead of theirs.
pub fn backward(
    forward: &[Node],
    types: &Inference,
    seeds: &[(String, String)],
    wrt: &[String],
    composites: &[Composite],
    emitter: &mut Emitter,
) -> Result<Vec<String>> {
    let seed_values: Vec<String> = seeds.iter().map(|(v, _)| v.clone()).collect();
    let (requires, needed, active) = active_nodes(forward, types, &seed_values, wrt);
    let blocked = blocking_ops(forward, &active);
    if !blocked.is_empty() {
        return Err(AutodiffError::NoRule(blocked));
    }

    let mut contributions: HashMap<String, Vec<String>> = HashMap::new();
    for (value, grad) in seeds {
        contributions.entry(value.clone()).or_default().push(grad.clone());
    }
    let by_output: HashMap<&str, &Composite> = composites.iter().map(|c| (c.output.as_str(), c)).collect();
    let inner: HashMap<&str, &Composite> =
        composites.iter().flat_map(|c| c.inner.iter().map(move |v| (v.as_str(), c))).collect();
    let need = |v: &str| !v.is_empty() && requires.contains(v) && needed.contains(v);
    for (i, node) in forward.iter().enumerate().rev() {
        if !active[i] {
            continue;
        }
        emitter.set_prefix(&format!("grad/{}", node.name));
        if let Some(composite) = node.outputs.iter().find_map(|o| inner.get(o.as_str())) {
            // An inner value's gradient can only come from inside its group, whose rule
            // covers it; one from outside would be lost.
            if let Some(o) = node.outputs.iter().find(|o| contributions.contains_key(*o)) {
                return Err(AutodiffError::node(
                    node,
                    format!("value {o:?} inside the group of {:?} has a gradient from outside it", composite.output),
                ));
            }
            continue;
        }
        if let Some(composite) = node.outputs.first().and_then(|o| by_output.get(o.as_str())) {
            let Some(parts) = contributions.remove(&composite.output) else { continue };
            let dy = accumulate(emitter, parts);
            let inputs = composite.rule.inputs();
            let needs: Vec<bool> = inputs.iter().map(|v| need(v)).collect();
            let input_grads: Vec<Option<String>> = match &composite.rule {
                CompositeRule::BatchNorm(bn) => {
                    rules::batch_norm_training(emitter, bn, &dy, [needs[0], needs[1], needs[2]]).to_vec()
                }
                CompositeRule::LayerNorm(ln) => rules::layer_norm_training(emitter, ln, &dy, &needs),
                CompositeRule::Gelu { x } => vec![needs[0].then(|| rules::gelu_erf(emitter, x, &dy))],
                CompositeRule::Silu { x } => vec![needs[0].then(|| rules::silu(emitter, x, &dy))],
            };
            for ((input, grad), need) in inputs.iter().zip(input_grads).zip(needs) {
                if let (Some(g), true) = (grad, need) {
                    contributions.entry(input.to_string()).or_default().push(g);
                }
            }
            continue;
        }
        let grads: Vec<Option<String>> =
            node.outputs.iter().map(|o| contributions.remove(o).map(|parts| accumulate(emitter, parts))).collect();
        if grads.iter().all(Option::is_none) {
            continue;
        }
        let needs: Vec<bool> = node.inputs.iter().map(|v| need(v)).collect();
        let mut cx = RuleCx { node, e: emitter, types, needs: needs.clone(), grads };
        let input_grads = rules::differentiate(&mut cx)?;
        for ((input, grad), need) in node.inputs.iter().zip(input_grads).zip(needs) {
            if let (Some(g), true) = (grad, need) {
                contributions.entry(input.clone()).or_default().push(g);
            }
        }
    }
    emitter.set_prefix("grad");
    let mut out = Vec::with_capacity(wrt.len());
    for name in wrt {
        let g = match contributions.remove(name) {
            Some(parts) => accumulate(emitter, parts),
            None => {
                let zero = emitter.scalar(0.0);
                emitter.mul(name, &zero)
            }
        };
        out.push(g);
    }
    emitter.set_prefix("");
    Ok(out)
}

fn accumulate(emitter: &mut Emitter, mut parts: Vec<String>) -> String {
    let mut total = parts.remove(0);
    for p in parts {
        total = emitter.add(&total, &p);
    }
    total
}
