//! The op registry: every op edgefreeze understands, with everything the graph layer knows
//! of it (input and output counts, shape rule, FLOPs, constant folding), in one table.

use crate::error::{GraphError, Result, UnsupportedOp};
use crate::infer::eval::Known;
use crate::infer::{Cx, Inference, Outputs, SymInt};
use crate::ir::{Graph, Node};
use crate::tensor::Tensor;
use crate::{analysis, infer};
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Lowest default-domain opset edgefreeze accepts.
pub const MIN_OPSET: i64 = 13;
/// Highest default-domain opset edgefreeze accepts.
pub const MAX_OPSET: i64 = 21;

/// Everything edgefreeze knows of an op, in one entry of [`OPS`]: what the loader accepts
/// (input and output counts), its shape rule, its FLOP count, and whether and how import
/// evaluates it when its inputs are constants. An op with no entry is rejected by the loader,
/// so every accepted op has all of these; there is no default for an op left out.
///
/// Adding an op: one entry here (rules in `infer/<family>.rs`, evaluation in
/// `infer/eval.rs`, a FLOP rule in `analysis.rs` where the count is not a plain multiple of
/// the elements), and one entry in the autodiff crate's gradient table.
#[derive(Debug, Clone)]
pub struct OpSpec {
    /// Op type in the default domain.
    pub op_type: &'static str,
    /// Allowed number of inputs (omitted trailing optional inputs not counted).
    pub inputs: RangeInclusive<usize>,
    /// Allowed number of outputs.
    pub outputs: RangeInclusive<usize>,
    /// Forward FLOPs per sample.
    pub flops: Flops,
    /// Output types and shapes from the inputs'.
    pub(crate) shape: ShapeRule,
    /// Evaluation at import time (constant folding), or why the op is never evaluated.
    pub(crate) fold: Fold,
    /// Element-by-element (possibly symbolic) values of a rank-0/1 integer output, for ops
    /// that carry shape computations (`Shape → Gather → Concat → Reshape`); `None` for the rest.
    pub(crate) value: Option<ValueRule>,
}

/// A shape rule: the (element type, shape) of each output.
pub(crate) type ShapeRule = fn(&Cx<'_>) -> Result<Outputs>;
/// An evaluation rule: the output's value from constant inputs.
pub(crate) type EvalRule = fn(&Cx<'_>, Known) -> Result<Tensor>;
/// A symbolic-value rule (`Ok(None)` where the value is not known element by element).
pub(crate) type ValueRule = fn(&Cx<'_>) -> Result<Option<Vec<SymInt>>>;

/// How an op counts its forward FLOPs per sample (symbolic dimensions count as 1; a
/// multiply-add counts as two).
#[derive(Debug, Clone, Copy)]
pub enum Flops {
    /// Moves, reinterprets or creates data: none.
    Zero,
    /// This many per element of output 0.
    PerOutput(u64),
    /// One per element of input 0 (reductions, global pooling).
    PerInput,
    /// Its own count from the node and the inferred shapes (convolutions, products, windows).
    Rule(fn(&Node, &Inference) -> u64),
}

/// Whether import evaluates an op whose inputs are known.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fold {
    /// Evaluated when every input's value is known (and the result is small).
    Values(EvalRule),
    /// Evaluated when input 0's value is known; the others give only their types (`CastLike`).
    FirstValues(EvalRule),
    /// Never evaluated, and why.
    Never(NoFold),
}

/// Why an op is never evaluated at import time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoFold {
    /// Real compute on tensors (convolution, products, normalisation, reductions): the
    /// engine's job, and never part of a shape computation.
    Compute,
    /// Float math no exporter's shape computation uses (activations, `Pow`).
    FloatMath,
    /// Random in training (`Dropout`).
    Random,
    /// Its value follows from its input's shape, not its values: known through its symbolic
    /// value when the shape is fixed (`Shape`).
    FromShape,
    /// Several outputs: folding replaces single-output nodes (`Split`).
    SeveralOutputs,
    /// Data movement no exporter's shape computation has needed yet (`Pad`, `GatherND`...).
    NotNeeded,
}

use Flops::{PerInput, PerOutput, Rule, Zero};
use Fold::{FirstValues, Never, Values};
use NoFold::{Compute, FloatMath, FromShape, NotNeeded, Random, SeveralOutputs};
use analysis as fl;
use infer::{elementwise as el, eval as ev, layout as ly, linear as li, spatial as sp};

#[allow(clippy::too_many_arguments)]
impl OpSpec {
    /// Why import never evaluates this op, or `None` when it evaluates the op once its
    /// inputs are known.
    pub fn never_folds(&self) -> Option<NoFold> {
        match self.fold {
            Fold::Values(_) | Fold::FirstValues(_) => None,
            Fold::Never(reason) => Some(reason),
        }
    }
}

const fn op(
    op_type: &'static str,
    inputs: RangeInclusive<usize>,
    outputs: RangeInclusive<usize>,
    shape: ShapeRule,
    flops: Flops,
    fold: Fold,
    value: Option<ValueRule>,
) -> OpSpec {
    OpSpec { op_type, inputs, outputs, flops, shape, fold, value }
}

const ANY: usize = usize::MAX;

/// Every supported op, grouped by family: (op, inputs, outputs, shape rule, FLOPs, folding,
/// symbolic value).
pub static OPS: &[OpSpec] = &[
    // Element-wise, one input.
    op("Abs", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Values(ev::abs), None),
    op("Cast", 1..=1, 1..=1, el::cast, Zero, Values(ev::cast), Some(ly::cast_value)),
    op("CastLike", 2..=2, 1..=1, el::cast_like, Zero, FirstValues(ev::cast), None),
    op("Ceil", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Values(ev::ceil), None),
    op("Clip", 1..=3, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Cos", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Dropout", 1..=3, 1..=2, el::dropout, Zero, Never(Random), None),
    op("Erf", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Exp", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Floor", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Values(ev::floor), None),
    op("Gelu", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("HardSigmoid", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("HardSwish", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Identity", 1..=1, 1..=1, el::same_as_input, Zero, Values(ev::same_values), Some(ly::same_value)),
    op("IsNaN", 1..=1, 1..=1, el::is_nan, PerOutput(1), Never(FloatMath), None),
    op("LeakyRelu", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Log", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("LogSoftmax", 1..=1, 1..=1, el::softmax, PerOutput(3), Never(FloatMath), None),
    op("Neg", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Values(ev::neg), None),
    op("Not", 1..=1, 1..=1, el::not, PerOutput(1), Values(ev::not), None),
    op("Reciprocal", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Relu", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Sigmoid", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Sin", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Softmax", 1..=1, 1..=1, el::softmax, PerOutput(3), Never(FloatMath), None),
    op("Sign", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(NotNeeded), None),
    op("Softplus", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    op("Sqrt", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Values(ev::sqrt), None),
    op("Tanh", 1..=1, 1..=1, el::same_as_input, PerOutput(1), Never(FloatMath), None),
    // Element-wise with broadcasting.
    op("Add", 2..=2, 1..=1, el::arithmetic, PerOutput(1), Values(ev::add), None),
    op("And", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::and), None),
    op("Div", 2..=2, 1..=1, el::arithmetic, PerOutput(1), Values(ev::div), None),
    op("Equal", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::equal), None),
    op("Greater", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::greater), None),
    op("GreaterOrEqual", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::greater_or_equal), None),
    op("Less", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::less), None),
    op("LessOrEqual", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::less_or_equal), None),
    op("Max", 1..=ANY, 1..=1, el::arithmetic, PerOutput(1), Values(ev::max), None),
    op("Min", 1..=ANY, 1..=1, el::arithmetic, PerOutput(1), Values(ev::min), None),
    op("Mod", 2..=2, 1..=1, el::arithmetic, PerOutput(1), Values(ev::mod_), None),
    op("Mul", 2..=2, 1..=1, el::arithmetic, PerOutput(1), Values(ev::mul), None),
    op("Or", 2..=2, 1..=1, el::comparison, PerOutput(1), Values(ev::or), None),
    op("Pow", 2..=2, 1..=1, el::pow, PerOutput(1), Never(FloatMath), None),
    op("Sub", 2..=2, 1..=1, el::arithmetic, PerOutput(1), Values(ev::sub), None),
    op("Where", 3..=3, 1..=1, el::where_, PerOutput(1), Values(ev::where_), None),
    // Convolution and pooling.
    op("AveragePool", 1..=1, 1..=1, sp::pool, Rule(fl::window_flops), Never(Compute), None),
    op("Conv", 2..=3, 1..=1, sp::conv, Rule(fl::conv_flops), Never(Compute), None),
    op("ConvTranspose", 2..=3, 1..=1, sp::conv_transpose, Rule(fl::conv_transpose_flops), Never(Compute), None),
    op("GlobalAveragePool", 1..=1, 1..=1, sp::global_pool, PerInput, Never(Compute), None),
    op("GlobalMaxPool", 1..=1, 1..=1, sp::global_pool, PerInput, Never(Compute), None),
    op("MaxPool", 1..=1, 1..=2, sp::pool, Rule(fl::window_flops), Never(Compute), None),
    // Matrix products.
    op("Einsum", 1..=ANY, 1..=1, li::einsum, Rule(fl::einsum_flops), Never(Compute), None),
    op("Gemm", 2..=3, 1..=1, li::gemm, Rule(fl::gemm_flops), Never(Compute), None),
    op("MatMul", 2..=2, 1..=1, li::mat_mul, Rule(fl::matmul_flops), Never(Compute), None),
    // Normalisation layers.
    op("BatchNormalization", 5..=5, 1..=5, li::batch_normalization, PerOutput(2), Never(Compute), None),
    op("InstanceNormalization", 3..=3, 1..=1, li::instance_normalization, PerOutput(8), Never(Compute), None),
    op("LayerNormalization", 2..=3, 1..=3, li::layer_normalization, PerOutput(8), Never(Compute), None),
    // Reductions.
    op("ArgMax", 1..=1, 1..=1, li::arg_max, PerInput, Never(Compute), None),
    op("CumSum", 2..=2, 1..=1, ly::cum_sum, PerOutput(1), Never(Compute), None),
    op("ReduceL2", 1..=2, 1..=1, li::reduce_since_18, PerInput, Never(Compute), None),
    op("ReduceMax", 1..=2, 1..=1, li::reduce_since_18, PerInput, Never(Compute), None),
    op("ReduceMean", 1..=2, 1..=1, li::reduce_since_18, PerInput, Never(Compute), None),
    op("ReduceMin", 1..=2, 1..=1, li::reduce_since_18, PerInput, Never(Compute), None),
    op("ReduceSum", 1..=2, 1..=1, li::reduce_sum, PerInput, Never(Compute), None),
    // Shape and layout.
    op("Concat", 1..=ANY, 1..=1, ly::concat, Zero, Values(ev::concat), Some(ly::concat_value)),
    op("Expand", 2..=2, 1..=1, ly::expand, Zero, Values(ev::expand), None),
    op("Flatten", 1..=1, 1..=1, ly::flatten, Zero, Values(ev::same_values), None),
    op("Gather", 2..=2, 1..=1, ly::gather, Zero, Values(ev::gather), Some(ly::gather_value)),
    op("GatherElements", 2..=2, 1..=1, ly::gather_elements, Zero, Never(NotNeeded), None),
    op("GatherND", 2..=2, 1..=1, ly::gather_nd, Zero, Never(NotNeeded), None),
    op("Pad", 2..=4, 1..=1, ly::pad, Zero, Never(NotNeeded), None),
    op("Resize", 1..=4, 1..=1, ly::resize, Rule(fl::resize_flops), Never(NotNeeded), None),
    op("Reshape", 2..=2, 1..=1, ly::reshape, Zero, Values(ev::same_values), Some(ly::same_value)),
    op("Slice", 3..=5, 1..=1, ly::slice, Zero, Values(ev::slice), Some(ly::slice_value)),
    op("Split", 1..=2, 1..=ANY, ly::split, Zero, Never(SeveralOutputs), None),
    op("Squeeze", 1..=2, 1..=1, ly::squeeze, Zero, Values(ev::same_values), Some(ly::same_value)),
    op("Transpose", 1..=1, 1..=1, ly::transpose, Zero, Values(ev::transpose), None),
    op("ScatterElements", 3..=3, 1..=1, ly::scatter, Zero, Never(NotNeeded), None),
    op("ScatterND", 3..=3, 1..=1, ly::scatter, Zero, Never(NotNeeded), None),
    op("Tile", 2..=2, 1..=1, ly::tile, Zero, Never(NotNeeded), None),
    op("Trilu", 1..=2, 1..=1, ly::trilu, Zero, Never(NotNeeded), None),
    op("Unsqueeze", 1..=2, 1..=1, ly::unsqueeze, Zero, Values(ev::same_values), Some(ly::same_value)),
    // Constants and shape computations.
    op("Constant", 0..=0, 1..=1, ly::constant, Zero, Values(ev::constant), None),
    op("ConstantOfShape", 1..=1, 1..=1, ly::constant_of_shape, Zero, Values(ev::constant_of_shape), None),
    op("Range", 3..=3, 1..=1, ly::range, Zero, Values(ev::range), None),
    op("Shape", 1..=1, 1..=1, ly::shape, Zero, Never(FromShape), Some(ly::shape_value)),
    op("Size", 1..=1, 1..=1, ly::size, Zero, Never(NotNeeded), None),
];

/// The spec of a default-domain op, if edgefreeze supports it.
pub fn spec(domain: &str, op_type: &str) -> Option<&'static OpSpec> {
    if !is_default_domain(domain) {
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

/// Whether a domain is ONNX's default one (written empty or `ai.onnx`).
pub fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// Checks the model's default-domain opset is one edgefreeze supports, and that no other
/// domain is imported by a node that is used.
pub fn check_opset(opset_imports: &[(String, i64)]) -> Result<()> {
    let default = opset_imports.iter().find(|(d, _)| is_default_domain(d));
    match default {
        Some((_, v)) if (MIN_OPSET..=MAX_OPSET).contains(v) => Ok(()),
        // Opsets 9 to 12 were brought to 13 on import (crate::upgrade): the range the user
        // can bring is wider than the one the toolchain reads.
        Some((d, v)) => {
            Err(GraphError::Opset { domain: d.clone(), version: *v, min: crate::upgrade::OLDEST_OPSET, max: MAX_OPSET })
        }
        None => Err(GraphError::Invalid("the model imports no default-domain opset".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_one_entry() {
        for (i, s) in OPS.iter().enumerate() {
            assert!(OPS[..i].iter().all(|t| t.op_type != s.op_type), "{} has two entries", s.op_type);
            assert!(std::ptr::eq(spec("", s.op_type).unwrap(), s));
        }
    }

    #[test]
    fn folding_decisions_agree_with_the_rest_of_each_entry() {
        for s in OPS {
            match s.never_folds() {
                // Folding replaces a node by one Constant: only single-output ops evaluate.
                None => assert_eq!(s.outputs, 1..=1, "{}", s.op_type),
                Some(NoFold::SeveralOutputs) => assert!(*s.outputs.end() > 1, "{}", s.op_type),
                // Its value comes from its input's shape: it needs a symbolic-value rule.
                Some(NoFold::FromShape) => assert!(s.value.is_some(), "{}", s.op_type),
                Some(_) => {}
            }
        }
    }
}
