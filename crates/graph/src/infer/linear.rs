//! Shape rules of matrix products, normalisation layers and reductions.

use super::{Cx, Outputs, broadcast_shapes};
use crate::dtype::DataType;
use crate::einsum::Equation;
use crate::error::Result;
use crate::ir::{Dim, format_shape};

pub(crate) fn gemm(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, a) = cx.input(0)?;
    let (_, b) = cx.input(1)?;
    if a.len() != 2 || b.len() != 2 {
        return Err(cx.err(format!("Gemm needs matrices, got {} and {}", format_shape(&a), format_shape(&b))));
    }
    let (m, ka) = if cx.node.attr_int("transA", 0)? != 0 { (&a[1], &a[0]) } else { (&a[0], &a[1]) };
    let (kb, n) = if cx.node.attr_int("transB", 0)? != 0 { (&b[1], &b[0]) } else { (&b[0], &b[1]) };
    check_same(cx, ka, kb, &a, &b)?;
    Ok(vec![(dtype, vec![m.clone(), n.clone()])])
}

pub(crate) fn mat_mul(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, a) = cx.input(0)?;
    let (_, b) = cx.input(1)?;
    if a.is_empty() || b.is_empty() {
        return Err(cx.err("MatMul inputs must have rank at least 1"));
    }
    let a2 = if a.len() == 1 { vec![Dim::Fixed(1), a[0].clone()] } else { a.clone() };
    let b2 = if b.len() == 1 { vec![b[0].clone(), Dim::Fixed(1)] } else { b.clone() };
    check_same(cx, &a2[a2.len() - 1], &b2[b2.len() - 2], &a, &b)?;
    let batch = broadcast_shapes(&[&a2[..a2.len() - 2], &b2[..b2.len() - 2]]).ok_or_else(|| {
        cx.err(format!("batch dimensions of {} and {} do not broadcast", format_shape(&a), format_shape(&b)))
    })?;
    let mut out = batch;
    if a.len() > 1 {
        out.push(a2[a2.len() - 2].clone());
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1].clone());
    }
    Ok(vec![(dtype, out)])
}

/// `Einsum`: the output shape from the equation's subscripts (see [`crate::einsum`]).
pub(crate) fn einsum(cx: &Cx<'_>) -> Result<Outputs> {
    let equation = Equation::of_node(cx.node)?;
    let mut shapes = Vec::with_capacity(cx.node.inputs.len());
    let (dtype, _) = cx.input(0)?;
    for i in 0..cx.node.inputs.len() {
        let (t, shape) = cx.input(i)?;
        if t != dtype {
            return Err(cx.err(format!("input {i} is {t:?}, input 0 {dtype:?}")));
        }
        shapes.push(shape);
    }
    let refs: Vec<&[Dim]> = shapes.iter().map(Vec::as_slice).collect();
    let out = equation.output_shape(&refs).map_err(|e| cx.err(format!("equation {equation}: {e}")))?;
    Ok(vec![(dtype, out)])
}

pub(crate) fn batch_normalization(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    if x.len() < 2 {
        return Err(cx.err("input must be N×C×..."));
    }
    for i in 1..5 {
        let (_, p) = cx.input(i)?;
        if p.len() != 1 || (p[0].fixed().is_some() && x[1].fixed().is_some() && p[0] != x[1]) {
            return Err(cx.err(format!("input {i} must be a vector of {} channel values", x[1])));
        }
    }
    // Opsets 9 to 13 give a training-mode BatchNormalization two more outputs, the batch's
    // mean and variance as the backward would save them (TorchScript's opset-13 training
    // export writes all five); opset 14 dropped them.
    let outputs = cx.node.outputs.len();
    if outputs > 3 && cx.opset >= 14 {
        return Err(cx.err(format!(
            "has {outputs} outputs: from opset 14 on it gives at most 3 (y, running mean, running variance)"
        )));
    }
    let channels = vec![x[1].clone()];
    let mut types = vec![(dtype, x)];
    types.extend(std::iter::repeat_n((dtype, channels), outputs.max(3) - 1));
    Ok(types)
}

pub(crate) fn layer_normalization(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let axis = cx.axis(cx.node.attr_int("axis", -1)?, x.len())?;
    let mut stats = x.clone();
    for d in stats.iter_mut().skip(axis) {
        *d = Dim::Fixed(1);
    }
    let stash = DataType::from_onnx(cx.node.attr_int("stash_type", 1)? as i32).unwrap_or(DataType::Float32);
    Ok(vec![(dtype, x), (stash, stats.clone()), (stash, stats)])
}

/// `InstanceNormalization` (how both PyTorch exporters write `GroupNorm`, on the input
/// reshaped to `[N, groups, -1]`): x's type and shape, `N×C×...`, with a scale and a bias
/// of `C` each.
pub(crate) fn instance_normalization(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    if x.len() < 3 {
        return Err(cx.err(format!("the input must be N×C×D1×..., got {}", format_shape(&x))));
    }
    for i in [1, 2] {
        let (_, p) = cx.input(i)?;
        let fits = matches!(p.as_slice(), [c] if c.fixed().is_none() || x[1].fixed().is_none() || *c == x[1]);
        if !fits {
            return Err(cx.err(format!(
                "input {i} must have one value per channel ({}), got {}",
                format_shape(&x[1..2]),
                format_shape(&p)
            )));
        }
    }
    Ok(vec![(dtype, x)])
}

pub(crate) fn arg_max(cx: &Cx<'_>) -> Result<Outputs> {
    let (_, x) = cx.input(0)?;
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, x.len())?;
    Ok(vec![(DataType::Int64, reduce_shape(&x, &[axis], cx.node.attr_int("keepdims", 1)? != 0))])
}

/// `ReduceSum`, whose axes are an input from opset 13.
pub(crate) fn reduce_sum(cx: &Cx<'_>) -> Result<Outputs> {
    reduce(cx, 13)
}

/// `ReduceMax`, `ReduceMean`, `ReduceMin`, whose axes are an input from opset 18.
pub(crate) fn reduce_since_18(cx: &Cx<'_>) -> Result<Outputs> {
    reduce(cx, 18)
}

fn reduce(cx: &Cx<'_>, since: i64) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let keep = cx.node.attr_int("keepdims", 1)? != 0;
    let axes = match cx.axes(1, since)? {
        Some(a) if !a.is_empty() => a.iter().map(|&v| cx.axis(v, x.len())).collect::<Result<Vec<_>>>()?,
        _ if cx.node.attr_int("noop_with_empty_axes", 0)? != 0 => return Ok(vec![(dtype, x)]),
        _ => (0..x.len()).collect(),
    };
    Ok(vec![(dtype, reduce_shape(&x, &axes, keep))])
}

fn reduce_shape(x: &[Dim], axes: &[usize], keep: bool) -> Vec<Dim> {
    x.iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keep) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect()
}

fn check_same(cx: &Cx<'_>, ka: &Dim, kb: &Dim, a: &[Dim], b: &[Dim]) -> Result<()> {
    if let (Some(x), Some(y)) = (ka.fixed(), kb.fixed())
        && x != y
    {
        return Err(cx.err(format!(
            "inner dimensions differ: {} and {} ({x} vs {y})",
            format_shape(a),
            format_shape(b)
        )));
    }
    Ok(())
}
