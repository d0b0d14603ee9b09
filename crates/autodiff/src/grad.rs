//! The reverse pass: walks the forward nodes backwards, asks each op's rule for the
//! gradients of its inputs, and sums the contributions a value receives.

use crate::emit::Emitter;
use crate::error::{AutodiffError, Result};
use crate::rules::{self, RuleCx};
use edgefreeze_graph::Node;
use edgefreeze_graph::infer::Inference;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Ops whose outputs carry no gradient (integer, boolean or shape results).
const NOT_DIFFERENTIABLE: &[&str] = &[
    "Shape",
    "Size",
    "ArgMax",
    "Equal",
    "Less",
    "Greater",
    "Not",
    "And",
    "Or",
    "Range",
    "ConstantOfShape",
    "Constant",
];

/// Which values depend on the values in `wrt` through differentiable floating-point paths.
pub fn requiring_grad(forward: &[Node], types: &Inference, wrt: &HashSet<String>) -> HashSet<String> {
    let mut requires: HashSet<String> = wrt.clone();
    for node in forward {
        if NOT_DIFFERENTIABLE.contains(&node.op_type.as_str()) {
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
    let wrt_set: HashSet<String> = wrt.iter().cloned().collect();
    let requires = requiring_grad(forward, types, &wrt_set);
    // Nodes on a path from a required value to a seed, found backwards.
    let mut needed: HashSet<String> = seeds.iter().map(|(v, _)| v.clone()).collect();
    let mut active = vec![false; forward.len()];
    for (i, node) in forward.iter().enumerate().rev() {
        if node.outputs.iter().any(|o| needed.contains(o)) && node.inputs.iter().any(|v| requires.contains(v)) {
            active[i] = true;
            for v in node.inputs.iter().filter(|v| requires.contains(*v)) {
                needed.insert(v.clone());
            }
        }
    }
    let missing: BTreeMap<String, Vec<String>> = forward
        .iter()
        .zip(&active)
        .filter(|(n, a)| **a && !rules::has_rule(n))
        .fold(BTreeMap::new(), |mut m, (n, _)| {
            m.entry(n.op_type.clone()).or_insert_with(Vec::new).push(n.name.clone());
            m
        });
    if !missing.is_empty() {
        return Err(AutodiffError::NoRule(missing.into_iter().collect()));
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
