//! The op registry: every op edgefreeze understands, with its input and output counts,
//! checked in one place.

use crate::error::{GraphError, Result, UnsupportedOp};
use crate::ir::{Graph, Node};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Lowest default-domain opset edgefreeze accepts.
pub const MIN_OPSET: i64 = 13;
/// Highest default-domain opset edgefreeze accepts.
pub const MAX_OPSET: i64 = 21;

/// What edgefreeze knows of an op.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Op type in the default domain.
    pub op_type: &'static str,
    /// Allowed number of inputs (omitted trailing optional inputs not counted).
    pub inputs: RangeInclusive<usize>,
    /// Allowed number of outputs.
    pub outputs: RangeInclusive<usize>,
    /// The op family (where its shape rule and, later, its gradient rule live).
    pub family: Family,
}

/// Op families: each has its shape rules in one module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Element-wise unary ops.
    Unary,
    /// Element-wise ops with broadcasting.
    Broadcast,
    /// Convolution and pooling.
    Spatial,
    /// Matrix products.
    Linear,
    /// Normalisation layers.
    Normalization,
    /// Reductions.
    Reduce,
    /// Shape and layout manipulation.
    Layout,
    /// Constants and shape computations.
    Constant,
}

macro_rules! spec {
    ($op:literal, $inputs:expr, $outputs:expr, $family:ident) => {
        OpSpec { op_type: $op, inputs: $inputs, outputs: $outputs, family: Family::$family }
    };
}

/// Every supported op.
pub static OPS: &[OpSpec] = &[
    spec!("Abs", 1..=1, 1..=1, Unary),
    spec!("Cast", 1..=1, 1..=1, Unary),
    spec!("CastLike", 2..=2, 1..=1, Unary),
    spec!("Ceil", 1..=1, 1..=1, Unary),
    spec!("Clip", 1..=3, 1..=1, Unary),
    spec!("Dropout", 1..=3, 1..=2, Unary),
    spec!("Erf", 1..=1, 1..=1, Unary),
    spec!("Exp", 1..=1, 1..=1, Unary),
    spec!("Floor", 1..=1, 1..=1, Unary),
    spec!("Gelu", 1..=1, 1..=1, Unary),
    spec!("HardSigmoid", 1..=1, 1..=1, Unary),
    spec!("HardSwish", 1..=1, 1..=1, Unary),
    spec!("Identity", 1..=1, 1..=1, Unary),
    spec!("LeakyRelu", 1..=1, 1..=1, Unary),
    spec!("Log", 1..=1, 1..=1, Unary),
    spec!("LogSoftmax", 1..=1, 1..=1, Unary),
    spec!("Neg", 1..=1, 1..=1, Unary),
    spec!("Not", 1..=1, 1..=1, Unary),
    spec!("Reciprocal", 1..=1, 1..=1, Unary),
    spec!("Relu", 1..=1, 1..=1, Unary),
    spec!("Sigmoid", 1..=1, 1..=1, Unary),
    spec!("Softmax", 1..=1, 1..=1, Unary),
    spec!("Sign", 1..=1, 1..=1, Unary),
    spec!("Softplus", 1..=1, 1..=1, Unary),
    spec!("Sqrt", 1..=1, 1..=1, Unary),
    spec!("Tanh", 1..=1, 1..=1, Unary),
    spec!("Add", 2..=2, 1..=1, Broadcast),
    spec!("And", 2..=2, 1..=1, Broadcast),
    spec!("Div", 2..=2, 1..=1, Broadcast),
    spec!("Equal", 2..=2, 1..=1, Broadcast),
    spec!("Greater", 2..=2, 1..=1, Broadcast),
    spec!("Less", 2..=2, 1..=1, Broadcast),
    spec!("Max", 1..=usize::MAX, 1..=1, Broadcast),
    spec!("Min", 1..=usize::MAX, 1..=1, Broadcast),
    spec!("Mod", 2..=2, 1..=1, Broadcast),
    spec!("Mul", 2..=2, 1..=1, Broadcast),
    spec!("Or", 2..=2, 1..=1, Broadcast),
    spec!("Pow", 2..=2, 1..=1, Broadcast),
    spec!("Sub", 2..=2, 1..=1, Broadcast),
    spec!("Where", 3..=3, 1..=1, Broadcast),
    spec!("AveragePool", 1..=1, 1..=1, Spatial),
    spec!("Conv", 2..=3, 1..=1, Spatial),
    spec!("ConvTranspose", 2..=3, 1..=1, Spatial),
    spec!("GlobalAveragePool", 1..=1, 1..=1, Spatial),
    spec!("GlobalMaxPool", 1..=1, 1..=1, Spatial),
    spec!("MaxPool", 1..=1, 1..=2, Spatial),
    spec!("Gemm", 2..=3, 1..=1, Linear),
    spec!("MatMul", 2..=2, 1..=1, Linear),
    spec!("BatchNormalization", 5..=5, 1..=3, Normalization),
    spec!("LayerNormalization", 2..=3, 1..=3, Normalization),
    spec!("ArgMax", 1..=1, 1..=1, Reduce),
    spec!("ReduceMax", 1..=2, 1..=1, Reduce),
    spec!("ReduceMean", 1..=2, 1..=1, Reduce),
    spec!("ReduceMin", 1..=2, 1..=1, Reduce),
    spec!("ReduceSum", 1..=2, 1..=1, Reduce),
    spec!("Concat", 1..=usize::MAX, 1..=1, Layout),
    spec!("Expand", 2..=2, 1..=1, Layout),
    spec!("Flatten", 1..=1, 1..=1, Layout),
    spec!("Gather", 2..=2, 1..=1, Layout),
    spec!("GatherND", 2..=2, 1..=1, Layout),
    spec!("Pad", 2..=4, 1..=1, Layout),
    spec!("Reshape", 2..=2, 1..=1, Layout),
    spec!("Slice", 3..=5, 1..=1, Layout),
    spec!("Split", 1..=2, 1..=usize::MAX, Layout),
    spec!("Squeeze", 1..=2, 1..=1, Layout),
    spec!("Transpose", 1..=1, 1..=1, Layout),
    spec!("ScatterND", 3..=3, 1..=1, Layout),
    spec!("Unsqueeze", 1..=2, 1..=1, Layout),
    spec!("Constant", 0..=0, 1..=1, Constant),
    spec!("ConstantOfShape", 1..=1, 1..=1, Constant),
    spec!("Range", 3..=3, 1..=1, Constant),
    spec!("Shape", 1..=1, 1..=1, Constant),
    spec!("Size", 1..=1, 1..=1, Constant),
];

/// The spec of a default-domain op, if edgefreeze supports it.
pub fn spec(domain: &str, op_type: &str) -> Option<&'static OpSpec> {
    if !(domain.is_empty() || domain == "ai.onnx") {
        return None;
    }
    OPS.iter().find(|s| s.op_type == op_type)
}

/// Checks every node against the registry: lists all unsupported ops at once, and then
/// checks input and output counts.
pub fn check_supported(graph: &Graph) -> Result<()> {
    let mut missing: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for node in &graph.nodes {
        if spec(&node.domain, &node.op_type).is_none() {
            missing.entry((node.domain.clone(), node.op_type.clone())).or_default().push(node.name.clone());
        }
    }
    if !missing.is_empty() {
        return Err(GraphError::UnsupportedOps(
            missing.into_iter().map(|((domain, op_type), nodes)| UnsupportedOp { domain, op_type, nodes }).collect(),
        ));
    }
    for node in &graph.nodes {
        check_arity(node)?;
    }
    Ok(())
}

fn check_arity(node: &Node) -> Result<()> {
    let spec = spec(&node.domain, &node.op_type).expect("checked before");
    let inputs = node.inputs.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
    let outputs = node.outputs.iter().rposition(|s| !s.is_empty()).map_or(0, |p| p + 1);
    if !spec.inputs.contains(&inputs) {
        return Err(GraphError::node(node, format!("takes {} inputs, got {inputs}", range_text(&spec.inputs))));
    }
    if !spec.outputs.contains(&outputs) {
        return Err(GraphError::node(node, format!("gives {} outputs, has {outputs}", range_text(&spec.outputs))));
    }
    Ok(())
}

fn range_text(r: &RangeInclusive<usize>) -> String {
    match (*r.start(), *r.end()) {
        (a, b) if a == b => a.to_string(),
        (a, usize::MAX) => format!("at least {a}"),
        (a, b) => format!("{a} to {b}"),
    }
}

/// Checks the model's default-domain opset is one edgefreeze supports, and that no other
/// domain is imported by a node that is used.
pub fn check_opset(opset_imports: &[(String, i64)]) -> Result<()> {
    let default = opset_imports.iter().find(|(d, _)| d.is_empty() || d == "ai.onnx");
    match default {
        Some((_, v)) if (MIN_OPSET..=MAX_OPSET).contains(v) => Ok(()),
        Some((d, v)) => Err(GraphError::Opset { domain: d.clone(), version: *v, min: MIN_OPSET, max: MAX_OPSET }),
        None => Err(GraphError::Invalid("the model imports no default-domain opset".into())),
    }
}
