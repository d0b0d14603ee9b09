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

pub use elementwise::{gelu_erf, silu};
pub use normalization::{batch_norm_training, layer_norm_training};
pub use spatial::max_pool_scatters;

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

    /// Broadcasts `v`, shaped like forward value `like` but with size 1 on `axes`, to
    /// `like`'s shape. Where those axes' sizes are known the target is a constant (the
    /// other axes come from `v` itself, as `Expand` broadcasts), so that `like` is not
    /// kept alive for its shape; otherwise `like`'s run-time shape.
    pub fn expand_over(&mut self, v: &str, like: &str, axes: &[i64]) -> Result<String> {
        let shape = self.shape(like)?;
        let target: Option<Vec<i64>> = (0..shape.len())
            .map(|a| if axes.contains(&(a as i64)) { shape[a].fixed().map(|n| n as i64) } else { Some(1) })
            .collect();
        Ok(match target {
            Some(target) => {
                let target = self.e.ints(&target);
                self.e.op("Expand", &[v, &target], vec![])
            }
            None => self.e.expand_like(v, like),
        })
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

/// A gradient rule: emits the gradients of a node's inputs, in input order.
pub type RuleFn = fn(&mut RuleCx<'_>) -> Result<InputGrads>;

/// What the reverse pass does with an op: one entry per op in [`GRADIENTS`].
#[derive(Debug, Clone, Copy)]
pub enum Gradient {
    /// Its rule.
    Rule(RuleFn),
    /// Its outputs carry no gradient by nature (integer, boolean or shape values, or
    /// constants): the reverse pass stops at it, and it never blocks training.
    NoGradient {
        /// Why.
        reason: &'static str,
    },
    /// No rule. Where its inputs are integers (shape arithmetic) no gradient reaches it; on
    /// a floating-point path from a trainable parameter to the loss it blocks training.
    NotDifferentiable {
        /// Why there is no rule.
        reason: &'static str,
    },
    /// Rewritten before the reverse pass into primitive ops whose rules apply
    /// ([`crate::training_mode`]: BatchNormalization, LayerNormalization,
    /// InstanceNormalization).
    Expanded,
}

/// One op's entry in [`GRADIENTS`].
#[derive(Debug, Clone, Copy)]
pub struct GradSpec {
    /// Op type in the default domain.
    pub op_type: &'static str,
    /// Its gradient.
    pub gradient: Gradient,
}

use Gradient::{Expanded, Rule};
use {elementwise as ew, layout as ly, linear as li, normalization as nm, spatial as sp};

const fn rule(op_type: &'static str, rule: RuleFn) -> GradSpec {
    GradSpec { op_type, gradient: Rule(rule) }
}

const fn no_gradient(op_type: &'static str, reason: &'static str) -> GradSpec {
    GradSpec { op_type, gradient: Gradient::NoGradient { reason } }
}

const fn not_differentiable(op_type: &'static str, reason: &'static str) -> GradSpec {
    GradSpec { op_type, gradient: Gradient::NotDifferentiable { reason } }
}

const INTEGER: &str = "integer or boolean output";
const SHAPE: &str = "its output is a shape computation, not a function of the input's values";
const CONSTANT: &str = "a constant";
const STEP: &str = "a step function (zero derivative almost everywhere); exporters use it on integer shape values";
const NOT_YET: &str = "no gradient rule yet";

/// The gradient of every op the graph crate accepts (its [`edgefreeze_graph::ops::OPS`]),
/// grouped as that table is. Adding an op: an entry here beside its entry there; the test
/// `every_accepted_op_has_a_gradient_entry` fails until both exist.
pub static GRADIENTS: &[GradSpec] = &[
    // Element-wise, one input.
    rule("Abs", ew::abs),
    rule("Cast", ew::cast),
    rule("CastLike", ew::cast),
    not_differentiable("Ceil", STEP),
    rule("Clip", ew::clip),
    rule("Cos", ew::cos),
    rule("Dropout", ew::pass_through),
    rule("Erf", ew::erf),
    rule("Exp", ew::exp),
    not_differentiable("Floor", STEP),
    rule("Gelu", ew::gelu),
    rule("HardSigmoid", ew::hard_sigmoid),
    rule("HardSwish", ew::hard_swish),
    rule("Identity", ew::pass_through),
    no_gradient("IsNaN", INTEGER),
    rule("LeakyRelu", ew::leaky_relu),
    rule("Log", ew::log),
    rule("LogSoftmax", nm::log_softmax),
    rule("Neg", ew::neg),
    no_gradient("Not", INTEGER),
    rule("Reciprocal", ew::reciprocal),
    rule("Relu", ew::relu),
    rule("Sigmoid", ew::sigmoid),
    rule("Sin", ew::sin),
    rule("Softmax", nm::softmax),
    not_differentiable("Sign", STEP),
    rule("Softplus", ew::softplus),
    rule("Sqrt", ew::sqrt),
    rule("Tanh", ew::tanh),
    // Element-wise with broadcasting.
    rule("Add", ew::add),
    no_gradient("And", INTEGER),
    rule("Div", ew::div),
    no_gradient("Equal", INTEGER),
    no_gradient("Greater", INTEGER),
    no_gradient("GreaterOrEqual", INTEGER),
    no_gradient("Less", INTEGER),
    no_gradient("LessOrEqual", INTEGER),
    rule("Max", ew::max_min),
    rule("Min", ew::max_min),
    not_differentiable("Mod", "integer shape arithmetic in exported models; no rule for a float Mod"),
    rule("Mul", ew::mul),
    no_gradient("Or", INTEGER),
    rule("Pow", ew::pow),
    rule("Sub", ew::sub),
    rule("Where", ew::where_),
    // Convolution and pooling.
    rule("AveragePool", sp::average_pool),
    rule("Conv", sp::conv),
    not_differentiable("ConvTranspose", NOT_YET),
    rule("GlobalAveragePool", sp::global_average_pool),
    rule("GlobalMaxPool", sp::global_max_pool),
    rule("MaxPool", sp::max_pool),
    // Matrix products.
    rule("Einsum", li::einsum),
    rule("Gemm", li::gemm),
    rule("MatMul", li::matmul),
    // Normalisation layers: spelled out in primitive ops for training.
    GradSpec { op_type: "BatchNormalization", gradient: Expanded },
    GradSpec { op_type: "LayerNormalization", gradient: Expanded },
    GradSpec { op_type: "InstanceNormalization", gradient: Expanded },
    // Reductions.
    no_gradient("ArgMax", INTEGER),
    rule("CumSum", ly::cum_sum),
    rule("ReduceL2", nm::reduce_l2),
    not_differentiable("ReduceMax", NOT_YET),
    rule("ReduceMean", nm::reduce_mean),
    not_differentiable("ReduceMin", NOT_YET),
    rule("ReduceSum", nm::reduce_sum),
    // Shape and layout.
    rule("Concat", ly::concat),
    rule("Expand", ly::expand),
    rule("Flatten", ly::reshape),
    rule("Gather", ly::gather),
    rule("GatherElements", ly::gather_elements),
    rule("GatherND", ly::gather_nd),
    rule("Pad", ly::pad),
    rule("Resize", ly::resize),
    rule("Reshape", ly::reshape),
    rule("Slice", ly::slice),
    rule("Split", ly::split),
    rule("Squeeze", ly::reshape),
    rule("Transpose", ly::transpose),
    not_differentiable("ScatterElements", NOT_YET),
    not_differentiable("ScatterND", NOT_YET),
    rule("Tile", ly::tile),
    rule("Trilu", ly::trilu),
    rule("Unsqueeze", ly::reshape),
    // Constants and shape computations.
    no_gradient("Constant", CONSTANT),
    no_gradient("ConstantOfShape", SHAPE),
    no_gradient("Range", INTEGER),
    no_gradient("Shape", SHAPE),
    no_gradient("Size", SHAPE),
];

/// The gradient entry of a node's op, or `None` for an op with no entry (not accepted by
/// the loader either; callers report it naming the node).
pub fn gradient_of(node: &Node) -> Option<&'static Gradient> {
    if !(node.domain.is_empty() || node.domain == "ai.onnx") {
        return None;
    }
    GRADIENTS.iter().find(|s| s.op_type == node.op_type).map(|s| &s.gradient)
}

/// Why a node on a path from a trainable parameter to the loss cannot be differentiated,
/// or `None` when its entry gives a rule, it carries no gradient, or it is expanded into
/// ops that have rules.
pub fn blocked(node: &Node) -> Option<&'static str> {
    match gradient_of(node) {
        None => Some("no gradient entry for this op"),
        Some(Gradient::Rule(_) | Gradient::NoGradient { .. } | Gradient::Expanded) => None,
        Some(Gradient::NotDifferentiable { reason }) => Some(reason),
    }
}

/// Emits the gradients of a node's inputs with its op's rule.
pub fn differentiate(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let grads = match gradient_of(cx.node) {
        Some(Gradient::Rule(rule)) => rule(cx)?,
        Some(Gradient::Expanded) => {
            return Err(cx.err("must be expanded into primitive ops (training_mode) before the reverse pass"));
        }
        Some(Gradient::NoGradient { reason }) => return Err(cx.err(format!("its outputs carry no gradient: {reason}"))),
        Some(Gradient::NotDifferentiable { reason }) => return Err(cx.err(*reason)),
        None => return Err(cx.err("no gradient entry for this op")),
    };
    debug_assert_eq!(grads.len(), cx.node.inputs.len());
    Ok(grads)
}

/// An op missing from one of the two tables, or in the gradient table only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoverageGap {
    /// The loader accepts the op but the gradient table has no entry for it.
    NoGradientEntry(&'static str),
    /// The gradient table has an entry for an op the loader does not accept.
    NotAccepted(&'static str),
    /// The gradient table has two entries for the op.
    Duplicate(&'static str),
}

/// Checks the gradient table against the ops the loader accepts: every accepted op has an
/// entry (a rule or an explicit reason why not), and every entry is for an accepted op.
/// (Every accepted op has a shape rule by construction: the loader accepts exactly the ops
/// of the graph crate's table, whose entries cannot be built without one.)
pub fn coverage(accepted: &[&'static str], gradients: &[GradSpec]) -> Vec<CoverageGap> {
    let mut gaps = Vec::new();
    for &op in accepted {
        if !gradients.iter().any(|g| g.op_type == op) {
            gaps.push(CoverageGap::NoGradientEntry(op));
        }
    }
    for (i, g) in gradients.iter().enumerate() {
        if !accepted.contains(&g.op_type) {
            gaps.push(CoverageGap::NotAccepted(g.op_type));
        }
        if gradients[..i].iter().any(|h| h.op_type == g.op_type) {
            gaps.push(CoverageGap::Duplicate(g.op_type));
        }
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted() -> Vec<&'static str> {
        edgefreeze_graph::ops::OPS.iter().map(|s| s.op_type).collect()
    }

    #[test]
    fn every_accepted_op_has_a_gradient_entry() {
        assert_eq!(coverage(&accepted(), GRADIENTS), vec![]);
    }

    #[test]
    fn a_missing_gradient_entry_is_reported() {
        let without_relu: Vec<GradSpec> = GRADIENTS.iter().filter(|g| g.op_type != "Relu").copied().collect();
        assert_eq!(coverage(&accepted(), &without_relu), vec![CoverageGap::NoGradientEntry("Relu")]);
    }

    #[test]
    fn an_entry_for_an_op_the_loader_rejects_is_reported() {
        let mut extra = GRADIENTS.to_vec();
        extra.push(not_differentiable("NoSuchOp", NOT_YET));
        extra.push(rule("Relu", ew::relu));
        assert_eq!(
            coverage(&accepted(), &extra),
            vec![CoverageGap::NotAccepted("NoSuchOp"), CoverageGap::Duplicate("Relu")]
        );
    }

    #[test]
    fn an_op_the_loader_accepts_without_an_entry_is_reported() {
        let mut more = accepted();
        more.push("NewOp");
        assert_eq!(coverage(&more, GRADIENTS), vec![CoverageGap::NoGradientEntry("NewOp")]);
    }
}
