//! The reverse pass: walks the forward nodes backwards, asks each op's rule for the
//! gradients of its inputs, and sums the contributions a value receives.

use crate::emit::Emitter;
use crate::error::{AutodiffError, BlockedOp, Result};
use crate::rules::{self, Gradient, RuleCx};
use edgefreeze_graph::Node;
use edgefreeze_graph::infer::Inference;
use std::collections::{BTreeMap, HashMap, HashSet};

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
/// in `wrt`, in order; a value the objective does not depend on gets zeros.
pub fn backward(
    forward: &[Node],
    types: &Inference,
    seeds: &[(String, String)],
    wrt: &[String],
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
    for (i, node) in forward.iter().enumerate().rev() {
        if !active[i] {
            continue;
        }
        emitter.set_prefix(&format!("grad/{}", node.name));
        let grads: Vec<Option<String>> =
            node.outputs.iter().map(|o| contributions.remove(o).map(|parts| accumulate(emitter, parts))).collect();
        if grads.iter().all(Option::is_none) {
            continue;
        }
        let needs: Vec<bool> =
            node.inputs.iter().map(|v| !v.is_empty() && requires.contains(v) && needed.contains(v)).collect();
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
