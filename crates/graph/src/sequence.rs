//! Tensor sequences as exporters emit them for `torch.chunk` and `torch.split`: a
//! `SplitToSequence` whose sequence is only read by `SequenceAt` at constant positions.
//! The import rewrites that pattern to one `Split` (and `Squeeze`s where `keepdims` is 0)
//! with `Identity` nodes in place of the `SequenceAt`s, so everything after the import
//! (shape inference, analysis, gradients, engines) sees tensors only.

use crate::error::{GraphError, Result};
use crate::infer::infer_prefix;
use crate::ir::{Attribute, Graph, Model, Node, fresh_name};
use crate::ops::spec;
use crate::sort::sort_topologically;
use crate::tensor::Tensor;
use std::collections::HashSet;

fn is_default(node: &Node, op: &str) -> bool {
    node.op_type == op && crate::ops::is_default_domain(&node.domain)
}

/// Rewrites every `SplitToSequence` whose sequence is read only by `SequenceAt` nodes at
/// constant positions. Returns how many were rewritten.
///
/// A sequence used any other way is left as it is (the op check then reports it); a
/// `SequenceAt` at a position not known at load time, or a split axis of unknown size, is
/// an error naming the node.
pub fn rewrite_sequences(model: &mut Model) -> Result<usize> {
    let opset = model.opset();
    let mut rewritten = 0;
    let mut skipped: HashSet<String> = HashSet::new();
    loop {
        let graph = &model.graph;
        let Some(at) = graph.nodes.iter().position(|n| is_default(n, "SplitToSequence") && !skipped.contains(&n.name))
        else {
            break;
        };
        let node = graph.nodes[at].clone();
        let Some(seq) = node.output(0).map(str::to_string) else {
            skipped.insert(node.name.clone());
            continue;
        };
        let readers: Vec<usize> = (0..graph.nodes.len()).filter(|&i| graph.nodes[i].inputs.contains(&seq)).collect();
        let only_sequence_at = readers.iter().all(|&i| is_default(&graph.nodes[i], "SequenceAt"));
        let is_output = graph.outputs.iter().any(|v| v.name == seq);
        // Shapes are needed: if an unsupported op comes first, let the op check list it.
        let prefix_supported = graph.nodes[..at].iter().all(|n| spec(&n.domain, &n.op_type).is_some());
        if !only_sequence_at || is_output || !prefix_supported {
            skipped.insert(node.name.clone());
            continue;
        }
        let inference = infer_prefix(graph, at, opset)?;
        let x = node.input(0).ok_or_else(|| GraphError::node(&node, "input 0 is missing"))?.to_string();
        let shape = inference
            .types
            .get(&x)
            .and_then(|t| t.shape.clone())
            .ok_or_else(|| GraphError::node(&node, format!("input {x:?} has no known shape")))?;
        let rank = shape.len() as i64;
        let axis = node.attr_int("axis", 0)?;
        if rank == 0 || axis < -rank || axis >= rank {
            return Err(GraphError::node(&node, format!("axis {axis} is out of range for rank {rank}")));
        }
        let axis = if axis < 0 { axis + rank } else { axis };
        // The axis's size is needed to count equal chunks; a list of sizes gives them.
        let known = shape[axis as usize].fixed().map(|n| n as i64);
        let size = || {
            known.ok_or_else(|| {
                GraphError::node(&node, format!("the split axis {axis} of {x:?} must have a size known at load time"))
            })
        };
        let keepdims = node.attr_int("keepdims", 1)? != 0;
        let (sizes, squeeze) = match node.input(1) {
            None => (vec![1; size()? as usize], !keepdims),
            Some(name) => {
                let split = constant_ints(graph, &inference.constants, name).ok_or_else(|| {
                    GraphError::node(&node, format!("split {name:?} must be a constant known at load time"))
                })?;
                let scalar = constant_rank(graph, &inference.constants, name) == Some(0);
                match split.as_slice() {
                    [chunk] if scalar => {
                        if *chunk <= 0 {
                            return Err(GraphError::node(&node, format!("split size {chunk} is not positive")));
                        }
                        let size = size()?;
                        let mut sizes = vec![*chunk; (size / chunk) as usize];
                        if size % chunk != 0 {
                            sizes.push(size % chunk);
                        }
                        (sizes, false)
                    }
                    sizes => {
                        let adds_up = known.is_none_or(|size| sizes.iter().sum::<i64>() == size);
                        if sizes.iter().any(|&s| s < 0) || !adds_up {
                            return Err(GraphError::node(
                                &node,
                                format!(
                                    "split sizes {sizes:?} do not add up to axis {axis}'s size {}",
                                    known.unwrap_or_default()
                                ),
                            ));
                        }
                        (sizes.to_vec(), false)
                    }
                }
            }
        };
        let mut taken = graph.value_names();
        let mut fresh = |hint: String| fresh_name(&mut taken, &hint);
        let parts: Vec<String> = (0..sizes.len()).map(|k| fresh(format!("{seq}.{k}"))).collect();
        let sizes_name = fresh(format!("{seq}.sizes"));
        let mut new_nodes = vec![
            Node::new(format!("{}.sizes", node.name), "Constant", &[], &[&sizes_name])
                .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![sizes.len()], &sizes)?)),
        ];
        let part_refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        new_nodes.push(
            Node::new(node.name.clone(), "Split", &[&x, &sizes_name], &part_refs)
                .with_attr("axis", Attribute::Int(axis)),
        );
        let mut items = parts.clone();
        if squeeze {
            let axes = fresh(format!("{seq}.axes"));
            new_nodes.push(
                Node::new(format!("{}.axes", node.name), "Constant", &[], &[&axes])
                    .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[axis])?)),
            );
            items = parts
                .iter()
                .enumerate()
                .map(|(k, part)| {
                    let out = fresh(format!("{seq}.{k}.squeezed"));
                    new_nodes.push(Node::new(format!("{}.squeeze{k}", node.name), "Squeeze", &[part, &axes], &[&out]));
                    out
                })
                .collect();
        }
        let count = items.len() as i64;
        let mut replaced = Vec::new();
        for &i in &readers {
            let reader = &graph.nodes[i];
            let position = reader
                .input(1)
                .and_then(|p| constant_ints(graph, &inference.constants, p))
                .and_then(|v| v.first().copied())
                .ok_or_else(|| GraphError::node(reader, "the position must be a constant known at load time"))?;
            let k = if position < 0 { position + count } else { position };
            if !(0..count).contains(&k) {
                return Err(GraphError::node(reader, format!("position {position} is outside the {count} items")));
            }
            let out = reader.output(0).ok_or_else(|| GraphError::node(reader, "output 0 is missing"))?;
            replaced.push((i, Node::new(reader.name.clone(), "Identity", &[&items[k as usize]], &[out])));
        }
        let graph = &mut model.graph;
        for (i, identity) in replaced {
            graph.nodes[i] = identity;
        }
        graph.nodes.splice(at..=at, new_nodes);
        rewritten += 1;
    }
    if rewritten > 0 {
        sort_topologically(&mut model.graph)?;
    }
    Ok(rewritten)
}

/// A constant's integers: an initializer, a `Constant` node (anywhere in the graph) or a
/// value inference computed.
fn constant_ints(graph: &Graph, known: &std::collections::HashMap<String, Tensor>, name: &str) -> Option<Vec<i64>> {
    graph.constant(name).or_else(|| known.get(name)).and_then(Tensor::to_i64_vec)
}

fn constant_rank(graph: &Graph, known: &std::collections::HashMap<String, Tensor>, name: &str) -> Option<usize> {
    graph.constant(name).or_else(|| known.get(name)).map(|t| t.dims().len())
}
