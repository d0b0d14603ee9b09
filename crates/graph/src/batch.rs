//! Models exported with a batch of one fixed in the file.
//!
//! Both PyTorch exporters write the example input's shape into the model unless told
//! otherwise (`dynamic_axes` for TorchScript, `dynamic_shapes` for dynamo), and users
//! export with one sample. Such a model runs only at batch 1, and training needs any
//! batch: tract stops with "Clashing resolution for expression. 1=1 != 64".
//!
//! Where every data input starts with a fixed size of 1, the import makes that axis the
//! symbol [`BATCH_SYMBOL`] and walks the graph node by node. A `Reshape` whose target
//! is a constant starting with that 1 (dynamo writes `torch.flatten` and `view` so) gets a
//! copy of the target that starts with -1 (the rest resolved to sizes), but only where
//! the rest of the target holds exactly the rest of the input, so the first axis is the
//! batch and nothing else. If afterwards no node has taken the batch in and put out floats
//! without it, and every output that started with the 1 starts with the batch, the
//! rewrite is kept. Otherwise some node fixes the batch in a way this pass
//! does not prove safe to change (an `Expand` to a constant shape, a `Reshape` that
//! merges the batch into another axis): the model stays as exported, runs at batch 1
//! only, and the metadata names the node, which the trainer's error and `inspect` show.

use crate::error::Result;
use crate::infer::{self, Inference};
use crate::ir::{Dim, Graph, Model, Node};
use crate::ops::is_default_domain;
use crate::tensor::Tensor;

/// The symbol a fixed batch becomes.
pub const BATCH_SYMBOL: &str = "batch";

/// Metadata key: the batch size the file fixed (set whether or not it was made variable).
pub const EXPORTED_BATCH_KEY: &str = "edgefreeze.exported_batch";

/// Metadata key: why the batch stays fixed (the node that fixes it), when it does.
pub const BATCH_FIXED_BY_KEY: &str = "edgefreeze.batch_fixed_by";

/// The batch size the ONNX file fixed, if it fixed one of 1.
pub fn exported_batch(model: &Model) -> Option<usize> {
    metadata(model, EXPORTED_BATCH_KEY).and_then(|v| v.parse().ok())
}

/// Why the batch is still fixed after import, if it is.
pub fn batch_fixed_by(model: &Model) -> Option<&str> {
    metadata(model, BATCH_FIXED_BY_KEY)
}

fn metadata<'a>(model: &'a Model, key: &str) -> Option<&'a str> {
    model.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Makes a batch of 1 fixed in the file a symbolic axis where that is provably safe (see
/// the module documentation); otherwise records the node that prevents it. A model whose
/// inputs do not all start with a fixed 1 is left untouched.
pub fn relax_fixed_batch(model: &mut Model) -> Result<()> {
    let graph = &model.graph;
    let starts_with_one = |shape: &Option<Vec<Dim>>| matches!(shape.as_deref(), Some([Dim::Fixed(1), ..]));
    if graph.inputs.is_empty() || !graph.inputs.iter().all(|v| starts_with_one(&v.shape)) {
        return Ok(());
    }
    let batch = Dim::Symbol(BATCH_SYMBOL.into());
    let mut relaxed = graph.clone();
    for v in &mut relaxed.inputs {
        if let Some(shape) = v.shape.as_mut() {
            shape[0] = batch.clone();
        }
    }
    let mut batched_outputs = Vec::new();
    for v in &mut relaxed.outputs {
        if starts_with_one(&v.shape) {
            v.shape.as_mut().expect("checked")[0] = batch.clone();
            batched_outputs.push(v.name.clone());
        }
    }
    // The file's intermediate shapes say 1; they are inferred again after import.
    relaxed.value_info.clear();
    model.metadata.push((EXPORTED_BATCH_KEY.into(), "1".into()));
    match walk(&mut relaxed, model.opset(), &batch, &batched_outputs)? {
        None => model.graph = relaxed,
        Some(reason) => model.metadata.push((BATCH_FIXED_BY_KEY.into(), reason)),
    }
    Ok(())
}

/// Infers `graph` node by node with the batch symbolic, rewriting the `Reshape` targets
/// that pin it; `None` when no node lets go of the batch and every output in `batched`
/// ends up starting with it, else the reason.
fn walk(graph: &mut Graph, opset: i64, batch: &Dim, batched: &[String]) -> Result<Option<String>> {
    let carries = |shape: Option<&Vec<Dim>>| shape.is_some_and(|s| s.contains(batch));
    let mut inf = infer::seeded(graph);
    // The first node that takes the batch in and puts none out: where it was lost.
    let mut lost_at: Option<usize> = None;
    for i in 0..graph.nodes.len() {
        if let Some(target) = reshape_target(&graph.nodes[i], &inf, batch)? {
            let name = fresh_name(graph, &format!("{}_batch", graph.nodes[i].inputs[1]));
            inf.constants.insert(name.clone(), target.clone());
            graph.initializers.insert(name.clone(), target);
            graph.nodes[i].inputs[1] = name;
        }
        let node = &graph.nodes[i];
        if let Err(e) = infer::infer_node(node, &mut inf, opset) {
            return Ok(Some(format!("node {:?} ({}): {e}", node.name, node.op_type)));
        }
        let takes = node.inputs.iter().any(|n| carries(inf.types.get(n).and_then(|v| v.shape.as_ref())));
        let float_outputs: Vec<_> = node
            .outputs
            .iter()
            .filter_map(|o| inf.types.get(o))
            .filter(|v| v.dtype.is_some_and(|d| d.is_float()) && v.shape.as_ref().is_some_and(|s| !s.is_empty()))
            .collect();
        if lost_at.is_none()
            && takes
            && !float_outputs.is_empty()
            && !float_outputs.iter().any(|v| carries(v.shape.as_ref()))
        {
            lost_at = Some(i);
        }
    }
    // Kept only if no node let go of the batch and every output that had the 1 has it.
    let kept = lost_at.is_none()
        && batched
            .iter()
            .all(|o| inf.types.get(o).and_then(|v| v.shape.as_ref()).is_some_and(|s| s.first() == Some(batch)));
    if kept {
        return Ok(None);
    }
    Ok(Some(match lost_at {
        Some(i) => {
            let node = &graph.nodes[i];
            format!(
                "node {:?} ({}) fixes the batch: its output has a constant size where its input has the batch",
                node.name, node.op_type
            )
        }
        None => "an output does not follow the batch".into(),
    }))
}

/// A `Reshape`'s constant target with its leading 1 made -1 (and any other -1 resolved),
/// when its input starts with the batch and the rest of the target holds exactly
/// the rest of the input, so that the two first axes are one and the same.
fn reshape_target(node: &Node, inf: &Inference, batch: &Dim) -> Result<Option<Tensor>> {
    if node.op_type != "Reshape" || !is_default_domain(&node.domain) {
        return Ok(None);
    }
    let Some(shape) = node.input(0).and_then(|n| inf.types.get(n)).and_then(|v| v.shape.as_ref()) else {
        return Ok(None);
    };
    let Some(target) = node.input(1).and_then(|n| inf.constants.get(n)) else { return Ok(None) };
    let Some(values) = target.to_i64_vec() else { return Ok(None) };
    if shape.first() != Some(batch) || values.first() != Some(&1) || target.dims().len() != 1 {
        return Ok(None);
    }
    let rest: Option<Vec<usize>> = shape[1..].iter().map(Dim::fixed).collect();
    let Some(rest) = rest else { return Ok(None) };
    let held: usize = rest.iter().product();
    let tail = &values[1..];
    // The rest of the target, every -1 resolved: it must hold exactly the rest of the
    // input, so that the first axes match.
    let known: i64 = tail.iter().filter(|&&v| v != -1).product();
    let resolved: Option<Vec<i64>> = match tail.iter().filter(|&&v| v == -1).count() {
        _ if tail.iter().any(|&v| v == 0 || v < -1) || known <= 0 => None,
        0 => (known == held as i64).then(|| tail.to_vec()),
        1 => (held as i64 % known == 0)
            .then(|| tail.iter().map(|&v| if v == -1 { held as i64 / known } else { v }).collect()),
        _ => None,
    };
    let Some(resolved) = resolved else { return Ok(None) };
    // -1 first: the batch, whatever `allowzero` says (dynamo writes 1, where a 0 would be
    // a size of zero).
    let values: Vec<i64> = std::iter::once(-1).chain(resolved).collect();
    Ok(Some(Tensor::from_i64_as(target.dtype(), target.dims().to_vec(), &values)?))
}

/// `base`, or `base` with a number, not yet a value name of `graph`.
fn fresh_name(graph: &Graph, base: &str) -> String {
    let taken = |n: &str| {
        graph.initializers.contains_key(n)
            || graph.inputs.iter().any(|v| v.name == n)
            || graph.nodes.iter().any(|node| node.outputs.iter().any(|o| o == n))
    };
    (0..).map(|i| if i == 0 { base.to_string() } else { format!("{base}_{i}") }).find(|n| !taken(n)).expect("unbounded")
}
