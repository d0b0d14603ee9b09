//! Models exported at opsets 9 to 12 (PyTorch 1.x's defaults, and many published models),
//! brought to opset 13, the oldest the rest of the toolchain reads. Only the ops in the
//! op table whose definition changed on the way are rewritten:
//!
//! - `ReduceSum`, `Squeeze`, `Unsqueeze` (`axes`) and `Split` (`split`) take at opset 13
//!   as an input what they took as an attribute;
//! - `Pad` (`pads`, `value`) and `Clip` (`min`, `max`) did so at opset 11, `Slice`
//!   (`starts`, `ends`, `axes`) at opset 10;
//! - `Softmax` and `LogSoftmax` before opset 13 flatten their input to a matrix at `axis`
//!   (by default 1) and normalise its rows: over every axis from `axis` on, not over
//!   `axis` alone. Where `axis` is the last axis the two agree; elsewhere the node becomes
//!   `Flatten`, the op over the last axis, and a `Reshape` back;
//! - `Dropout` took its `ratio` as an attribute before opset 12.
//!
//! Everything else in the op table means the same from opset 9 to 13 (types aside). An op
//! not in the table is reported by the op check as usual.

use crate::error::{GraphError, Result};
use crate::infer::infer;
use crate::ir::{Attribute, Model, Node};
use crate::ops::is_default_domain;
use crate::tensor::Tensor;

/// The oldest opset [`upgrade_opset`] brings forward.
pub const OLDEST_OPSET: i64 = 9;

/// The opset it brings a model to.
pub const TARGET_OPSET: i64 = 13;

/// The metadata key under which an upgraded model keeps the opset it was exported at
/// (`inspect` shows it; graphs written from the model carry it).
pub const SOURCE_OPSET_KEY: &str = "edgefreeze.source_opset";

/// The opset a model was exported at, if the import upgraded it.
pub fn source_opset(model: &Model) -> Option<i64> {
    model.metadata_value(SOURCE_OPSET_KEY).and_then(|v| v.parse().ok())
}

/// Rewrites the nodes of a model whose default-domain opset is 9 to 12 into their opset-13
/// forms and sets its opset to 13; returns the names of the `Softmax` and `LogSoftmax`
/// nodes whose axis must be checked against their input's rank once shapes are known
/// ([`coerced_softmax`]). Any other opset is left as it is.
pub fn upgrade_opset(model: &mut Model) -> Result<Vec<String>> {
    let opset = model.opset();
    if !(OLDEST_OPSET..TARGET_OPSET).contains(&opset) {
        return Ok(Vec::new());
    }
    let mut softmax = Vec::new();
    let mut nodes = Vec::with_capacity(model.graph.nodes.len());
    for mut node in std::mem::take(&mut model.graph.nodes) {
        if !is_default_domain(&node.domain) {
            nodes.push(node);
            continue;
        }
        let mut constants = Vec::new();
        match node.op_type.as_str() {
            "ReduceSum" | "Squeeze" | "Unsqueeze" => {
                if let Some(axes) = take_ints(&mut node, "axes")? {
                    constants.push((1, Tensor::from_i64(vec![axes.len()], &axes)));
                }
            }
            "Split" => {
                if let Some(split) = take_ints(&mut node, "split")? {
                    constants.push((1, Tensor::from_i64(vec![split.len()], &split)));
                }
            }
            "Pad" if opset < 11 => {
                let pads = take_ints(&mut node, "pads")?.ok_or_else(|| GraphError::node(&node, "has no pads"))?;
                constants.push((1, Tensor::from_i64(vec![pads.len()], &pads)));
                if let Some(value) = take_float(&mut node, "value")?
                    && value != 0.0
                {
                    constants.push((2, Tensor::from_f32(vec![], &[value])));
                }
            }
            "Clip" if opset < 11 => {
                // Absent bounds are infinite, as an absent input is.
                for (slot, name) in [(1, "min"), (2, "max")] {
                    if let Some(v) = take_float(&mut node, name)? {
                        constants.push((slot, Tensor::from_f32(vec![], &[v])));
                    }
                }
            }
            "Dropout" if opset < 12 => {
                // Without a `training_mode` input it stays what it was: the trainer's
                // Dropout in training, the identity in inference.
                if let Some(ratio) = take_float(&mut node, "ratio")? {
                    constants.push((1, Tensor::from_f32(vec![], &[ratio])));
                }
            }
            "Slice" if opset < 10 => {
                let starts = take_ints(&mut node, "starts")?.ok_or_else(|| GraphError::node(&node, "has no starts"))?;
                let ends = take_ints(&mut node, "ends")?.ok_or_else(|| GraphError::node(&node, "has no ends"))?;
                constants.push((1, Tensor::from_i64(vec![starts.len()], &starts)));
                constants.push((2, Tensor::from_i64(vec![ends.len()], &ends)));
                if let Some(axes) = take_ints(&mut node, "axes")? {
                    constants.push((3, Tensor::from_i64(vec![axes.len()], &axes)));
                }
            }
            "Softmax" | "LogSoftmax" => {
                // The old default, written out: the check after shape inference reads it.
                let axis = node.attr_int("axis", 1)?;
                node.attributes.insert("axis".into(), Attribute::Int(axis));
                softmax.push(node.name.clone());
            }
            _ => {}
        }
        for (slot, tensor) in constants {
            let tensor = tensor.map_err(|e| GraphError::node(&node, e.to_string()))?;
            let value = format!("{}/opset13_input{slot}", node.name);
            nodes.push(
                Node::new(format!("{value}/constant"), "Constant", &[], &[&value])
                    .with_attr("value", Attribute::Tensor(tensor)),
            );
            if node.inputs.len() <= slot {
                node.inputs.resize(slot + 1, String::new());
            }
            node.inputs[slot] = value;
        }
        nodes.push(node);
    }
    model.graph.nodes = nodes;
    model.metadata.push((SOURCE_OPSET_KEY.into(), opset.to_string()));
    for (domain, version) in &mut model.opset_imports {
        if is_default_domain(domain) {
            *version = TARGET_OPSET;
        }
    }
    Ok(softmax)
}

/// Removes an integer-list attribute and returns it.
fn take_ints(node: &mut Node, name: &str) -> Result<Option<Vec<i64>>> {
    let value = node.attr_ints(name)?.map(<[i64]>::to_vec);
    node.attributes.shift_remove(name);
    Ok(value)
}

/// Removes a float attribute and returns it.
fn take_float(node: &mut Node, name: &str) -> Result<Option<f32>> {
    if !node.attributes.contains_key(name) {
        return Ok(None);
    }
    let value = node.attr_float(name, 0.0)?;
    node.attributes.shift_remove(name);
    Ok(Some(value))
}

/// The second half of [`upgrade_opset`], on a sorted graph whose ops are all supported:
/// each named `Softmax` or `LogSoftmax` whose axis is not its input's last becomes
/// `Flatten` at that axis, the op over the last axis, and a `Reshape` to the input's
/// shape, which is what it computed before opset 13. Returns how many were rewritten.
pub fn coerced_softmax(model: &mut Model, names: &[String]) -> Result<usize> {
    if names.is_empty() {
        return Ok(0);
    }
    let inference = infer(&model.graph, model.opset())?;
    let mut rewritten = 0;
    let mut nodes = Vec::with_capacity(model.graph.nodes.len());
    for mut node in std::mem::take(&mut model.graph.nodes) {
        // By op type as well: a model built in memory may repeat a name (a loaded one never
        // does).
        let coerced = matches!(node.op_type.as_str(), "Softmax" | "LogSoftmax") && is_default_domain(&node.domain);
        if !coerced || !names.contains(&node.name) {
            nodes.push(node);
            continue;
        }
        let x = node.input(0).ok_or_else(|| GraphError::node(&node, "input 0 is missing"))?.to_string();
        let rank = inference
            .types
            .get(&x)
            .and_then(|t| t.shape.as_ref())
            .map(|s| s.len() as i64)
            .ok_or_else(|| GraphError::node(&node, format!("input {x:?} has no known rank")))?;
        let axis = node.attr_int("axis", 1)?;
        let axis = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&axis) {
            return Err(GraphError::node(&node, format!("axis {axis} is out of range for rank {rank}")));
        }
        node.attributes.insert("axis".into(), Attribute::Int(-1));
        if axis == rank - 1 {
            nodes.push(node);
            continue;
        }
        let y = node.output(0).ok_or_else(|| GraphError::node(&node, "output 0 is missing"))?.to_string();
        let base = format!("{}/opset13", node.name);
        let (flat, normalised, shape) = (format!("{base}/flat"), format!("{base}/rows"), format!("{base}/shape"));
        nodes.push(
            Node::new(format!("{base}/Flatten"), "Flatten", &[&x], &[&flat]).with_attr("axis", Attribute::Int(axis)),
        );
        node.inputs[0] = flat;
        node.outputs[0] = normalised.clone();
        nodes.push(node.clone());
        nodes.push(Node::new(format!("{base}/Shape"), "Shape", &[&x], &[&shape]));
        nodes.push(Node::new(format!("{base}/Reshape"), "Reshape", &[&normalised, &shape], &[&y]));
        rewritten += 1;
    }
    model.graph.nodes = nodes;
    Ok(rewritten)
}
