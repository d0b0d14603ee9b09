//! Small hand-built models for the graph crate's tests.

// Each test file uses a different part of these helpers.
#![allow(dead_code)]

use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor};

/// A model with the given default-domain opset, inputs, nodes and outputs.
pub fn model(opset: i64, inputs: Vec<ValueInfo>, nodes: Vec<Node>, outputs: &[&str]) -> Model {
    Model {
        ir_version: 8,
        opset_imports: vec![(String::new(), opset)],
        producer_name: "edgefreeze-tests".into(),
        graph: Graph {
            name: "test".into(),
            nodes,
            inputs,
            outputs: outputs
                .iter()
                .map(|n| ValueInfo { name: n.to_string(), dtype: None, shape: None, doc_string: String::new() })
                .collect(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// An f32 input with a shape written as `"batch 3 4"`.
pub fn input(name: &str, dims: &str) -> ValueInfo {
    let shape = dims
        .split_whitespace()
        .map(|d| match d.parse::<usize>() {
            Ok(n) => Dim::Fixed(n),
            Err(_) => Dim::Symbol(d.to_string()),
        })
        .collect();
    ValueInfo::new(name, DataType::Float32, shape)
}

/// A Constant node holding an i64 vector.
pub fn ints(name: &str, values: &[i64]) -> Node {
    Node::new(name, "Constant", &[], &[name])
        .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![values.len()], values).unwrap()))
}

/// A Constant node holding an i64 scalar.
pub fn scalar(name: &str, value: i64) -> Node {
    Node::new(name, "Constant", &[], &[name])
        .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![], &[value]).unwrap()))
}

/// Adds an f32 initializer filled with a ramp.
pub fn weight(model: &mut Model, name: &str, dims: &[usize]) {
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
    model.graph.initializers.insert(name.into(), Tensor::from_f32(dims.to_vec(), &values).unwrap());
}

/// Integer-list attribute.
pub fn ints_attr(values: &[i64]) -> Attribute {
    Attribute::Ints(values.to_vec())
}

/// The inferred shape of a value as text (`batch×16×14×14`).
pub fn shape_of(model: &Model, name: &str) -> String {
    let info = model.graph.value_type(name).unwrap_or_else(|| panic!("no type for {name}"));
    edgefreeze_graph::ir::format_shape(info.shape.as_ref().unwrap())
}
