//! Gradient rules, one module per op family, beside the shape rules' families.
//!
//! A rule receives the forward node, the gradients of its outputs and which inputs need
//! a gradient, and emits standard ONNX ops computing those inputs' gradients. Rules read
//! forward values by name; they never recompute what the forward pass already has.

mod elementwise;
mod layout;
mod linear;
mod normalization;
mod spatial;

use crate::emit::Emitter;
use crate::error::{AutodiffError, Result};
use edgefreeze_graph::Node;
use edgefreeze_graph::infer::Inference;
use edgefreeze_graph::ir::{Dim, Shape};

/// What a gradient rule sees and emits into.
pub struct RuleCx<'a> {
    /// The forward node.
    pub node: &'a Node,
    /// Where the backward nodes go.
    pub e: &'a mut Emitter,
    /// Types and shapes of the forward values.
    pub types: &'a Inference,
    /// For each input: whether its gradient is wanted.
    pub needs: Vec<bool>,
    /// For each output: its gradient, if it has one.
    pub grads: Vec<Option<String>>,
}

/// Gradients of a node's inputs (`None` where not needed), in input order.
pub type InputGrads = Vec<Option<String>>;

impl RuleCx<'_> {
    /// Input `i`'s name.
    pub fn x(&self, i: usize) -> &str {
        self.node.inputs.get(i).map(String::as_str).unwrap_or("")
    }

    /// Output `i`'s name.
    pub fn y(&self, i: usize) -> &str {
        self.node.outputs.get(i).map(String::as_str).unwrap_or("")
    }

    /// The gradient of output 0.
    pub fn dy(&self) -> Result<String> {
        self.grads.first().cloned().flatten().ok_or_else(|| self.err("output 0 has no gradient"))
    }

    /// Whether input `i` needs a gradient.
    pub fn need(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// A node-level error.
    pub fn err(&self, message: impl Into<String>) -> AutodiffError {
        AutodiffError::node(self.node, message)
    }

    /// The forward shape of a value.
    pub fn shape(&self, name: &str) -> Result<Shape> {
        self.types
            .types
            .get(name)
            .and_then(|t| t.shape.clone())
            .ok_or_else(|| self.err(format!("value {name:?} has no known shape")))
    }

    /// The forward shape of a value with every dimension known.
    pub fn fixed_shape(&self, name: &str) -> Result<Vec<usize>> {
        self.shape(name)?
            .iter()
            .map(|d| d.fixed().ok_or_else(|| self.err(format!("value {name:?} needs known dimensions here"))))
            .collect()
    }

    /// The gradient list with nothing in it.
    pub fn none(&self) -> InputGrads {
        vec![None; self.node.inputs.len()]
    }

    /// Sums `grad` (of shape `from`) down to shape `to` as broadcasting expanded it.
    pub fn unbroadcast_to(&mut self, grad: &str, from: &[Dim], to: &[Dim]) -> Result<String> {
        if from.len() < to.len() {
            return Err(self.err("a gradient has lower rank than the value it belongs to"));
        }
        let offset = from.len() - to.len();
        let leading: Vec<i64> = (0..offset as i64).collect();
        let inner: Vec<i64> = to
            .iter()
            .enumerate()
            .filter(|(k, d)| **d == Dim::Fixed(1) && from[k + offset] != Dim::Fixed(1))
            .map(|(k, _)| (k + offset) as i64)
            .collect();
        let g = self.e.reduce_sum(grad, &inner, true);
        Ok(self.e.reduce_sum(&g, &leading, false))
    }

    /// Sums the gradient of output 0 (shaped like the output) down to input `i`'s shape.
    pub fn unbroadcast(&mut self, grad: &str, i: usize) -> Result<String> {
        let from = self.shape(self.y(0))?;
        let to = self.shape(self.x(i))?;
        self.unbroadcast_to(grad, &from, &to)
    }
}

/// Whether an op has a gradient rule.
pub fn has_rule(node: &Node) -> bool {
    (node.domain.is_empty() || node.domain == "ai.onnx")
        && (elementwise::OPS.contains(&node.op_type.as_str())
            || linear::OPS.contains(&node.op_type.as_str())
            || normalization::OPS.contains(&node.op_type.as_str())
            || layout::OPS.contains(&node.op_type.as_str())
            || spatial::OPS.contains(&node.op_type.as_str()))
}

/// Emits the gradients of a node's inputs.
pub fn differentiate(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let op = cx.node.op_type.as_str();
    let grads = if elementwise::OPS.contains(&op) {
        elementwise::differentiate(cx)?
    } else if linear::OPS.contains(&op) {
        linear::differentiate(cx)?
    } else if normalization::OPS.contains(&op) {
        normalization::differentiate(cx)?
    } else if layout::OPS.contains(&op) {
        layout::differentiate(cx)?
    } else if spatial::OPS.contains(&op) {
        spatial::differentiate(cx)?
    } else {
        return Err(cx.err("no gradient rule"));
    };
    debug_assert_eq!(grads.len(), cx.node.inputs.len());
    Ok(grads)
}
