//! Models exported with a batch of one fixed in the file.
//!
//! Both PyTorch exporters write the example input's shape into the model unless told
//! otherwise (`dynamic_axes` for TorchScript, `dynamic_shapes` for dynamo), and users
//! export with one sample. Such a model runs only at batch 1, and training needs any
//! batch: tract stops with "Clashing resolution for expression. 1=1 != 64".
//!
//! Where every data input starts with a fixed size of 1, the import makes that axis the
//! symbol [`BATCH_SYMBOL`] and walks the graph node by node. A `Reshape` to a constant
//! that keeps the batch's size-1 axis as an axis of its own (dynamo writes `torch.flatten`
//! and `view` so: `[1, C·H·W]`, `[1, S, H, D]`, also after a Transpose moved the batch)
//! gets a copy of the target with -1 there and every other size resolved. If afterwards
//! no node has taken the batch in and put out floats without it, and every output that
//! started with the 1 starts with the batch, the rewrite is kept. Otherwise some node
//! fixes the batch in a way this pass does not prove safe to change (an `Expand` to a
//! constant shape; a `Reshape` that merges the batch with another axis, which at batch 1
//! cannot be told from a merge with the axis on its other side): the model stays as
//! exported, runs at batch 1 only, and the metadata names the node, which `inspect`,
//! `convert` and `train` show, and `train` refuses it.

use crate::error::Result;
use crate::infer::{self, Inference};
use crate::ir::{Dim, Graph, Model, Node, fresh_name};
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
    model.metadata_value(EXPORTED_BATCH_KEY).and_then(|v| v.parse().ok())
}

/// Why the batch is still fixed after import, if it is.
pub fn batch_fixed_by(model: &Model) -> Option<&str> {
    model.metadata_value(BATCH_FIXED_BY_KEY)
}

/// Makes a batch of 1 fixed in the file a symbolic axis where that is provably safe (see
/// the module documentation); otherwise records the node that prevents it. A model whose
/// inputs do not all start with a fixed 1 is left untouched.
pub fn relax_fixed_batch(model: &mut Model) -> Result<()> {
    // What an earlier import recorded describes the file it read, not this one (a model
    // `edgefreeze export` wrote from a relaxed one has the batch symbolic).
    model.metadata.retain(|(k, _)| k != EXPORTED_BATCH_KEY && k != BATCH_FIXED_BY_KEY);
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
    let mut taken = graph.value_names();
    for i in 0..graph.nodes.len() {
        if let Some(target) = reshape_target(&graph.nodes[i], &inf, batch)? {
            let name = fresh_name(&mut taken, &format!("{}_batch", graph.nodes[i].inputs[1]));
            inf.constants.insert(name.clone(), target.clone());
            graph.initializers.insert(name.clone(), target);
            graph.nodes[i].inputs[1] = name;
        }
        let node = &graph.nodes[i];
        if let Err(e) = infer::infer_node(node, &mut inf, opset) {
            // Shape rules name their node already.
            let named = format!("node {:?} ({})", node.name, node.op_type);
            let text = e.to_string();
            return Ok(Some(if text.contains(&named) { text } else { format!("{named}: {text}") }));
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
        // Declared output shapes that the batch now runs through (one that started with
        // the 1 already says so; another may hold it on an axis a Transpose moved).
        for out in &mut graph.outputs {
            if let Some(shape) = inf.types.get(&out.name).and_then(|v| v.shape.as_ref())
                && carries(Some(shape))
            {
                out.shape = Some(shape.clone());
            }
        }
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

/// A `Reshape`'s constant target rewritten to follow the batch.
///
/// Its input must have the batch on one axis `b` and fixed sizes elsewhere. The exported
/// target (at batch 1) is kept where it regroups the axes before `b` among themselves and
/// those after `b` among themselves, with an axis `j` of size 1 between them: that axis
/// is the batch's, and written -1 (every other size fixed) it takes the batch at any
/// size. Where several axes qualify (sizes of 1 next to it), the one at `b` is taken,
/// else none is. A target that merges the batch with a neighbour (attention's `[S, 1·H,
/// D]`, `[S·1, E]`) is left alone: at batch 1 a merge to the left and one to the right
/// look the same, and guessing wrong would mix samples. The batch is then lost there,
/// and the walk reports the node.
fn reshape_target(node: &Node, inf: &Inference, batch: &Dim) -> Result<Option<Tensor>> {
    if node.op_type != "Reshape" || !is_default_domain(&node.domain) {
        return Ok(None);
    }
    let Some(shape) = node.input(0).and_then(|n| inf.types.get(n)).and_then(|v| v.shape.as_ref()) else {
        return Ok(None);
    };
    let Some(target) = node.input(1).and_then(|n| inf.constants.get(n)) else { return Ok(None) };
    let Some(values) = target.to_i64_vec() else { return Ok(None) };
    if target.dims().len() != 1 {
        return Ok(None);
    }
    let Some(b) = shape.iter().position(|d| d == batch) else { return Ok(None) };
    let fixed: Option<Vec<usize>> =
        shape.iter().enumerate().map(|(i, d)| if i == b { Some(1) } else { d.fixed() }).collect();
    let Some(fixed) = fixed else { return Ok(None) };
    let before: usize = fixed[..b].iter().product();
    let after: usize = fixed[b + 1..].iter().product();
    // The target at batch 1, its -1 resolved (a 0 copies an input axis: left to the shape
    // rule, which follows the batch through it).
    if values.iter().any(|&v| v == 0 || v < -1) || values.iter().filter(|&&v| v == -1).count() > 1 {
        return Ok(None);
    }
    let total = before * after;
    let known: usize = values.iter().filter(|&&v| v > 0).map(|&v| v as usize).product();
    if known == 0 || !total.is_multiple_of(known) {
        return Ok(None);
    }
    let sizes: Vec<usize> = values.iter().map(|&v| if v == -1 { total / known } else { v as usize }).collect();
    let candidates: Vec<usize> = (0..sizes.len())
        .filter(|&j| {
            sizes[j] == 1
                && sizes[..j].iter().product::<usize>() == before
                && sizes[j + 1..].iter().product::<usize>() == after
        })
        .collect();
    let j = match candidates[..] {
        [one] => one,
        _ if candidates.contains(&b) => b,
        _ => return Ok(None),
    };
    let mut rewritten: Vec<i64> = sizes.iter().map(|&v| v as i64).collect();
    rewritten[j] = -1;
    Ok(Some(Tensor::from_i64_as(target.dtype(), target.dims().to_vec(), &rewritten)?))
}
