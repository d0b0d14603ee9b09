//! Shape rules of layout ops (reshape, transpose, gather...) and constant producers, and
//! the symbolic evaluation of shape computations.

use super::{Cx, Outputs, SymInt, broadcast_shapes, dims_product};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{Attribute, Dim, Shape, fixed_shape, format_shape};

pub(crate) fn constant(cx: &Cx<'_>) -> Result<Outputs> {
    let t = constant_value(cx)?;
    Ok(vec![(t.dtype(), fixed_shape(t.dims()))])
}

pub(crate) fn size(cx: &Cx<'_>) -> Result<Outputs> {
    cx.rank(0)?;
    Ok(vec![(DataType::Int64, vec![])])
}

/// `ScatterND` and `ScatterElements`: the data's type and shape.
pub(crate) fn scatter(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, data) = cx.input(0)?;
    Ok(vec![(dtype, data.clone())])
}

pub(crate) fn pad(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    // Pads computed at run time (a slice's gradient along an axis of unknown size) are
    // known element by element where they are constants.
    let pads: Vec<Option<i64>> = match cx.symbolic(1) {
        Some(p) => p.iter().map(|v| if let SymInt::Known(n) = v { Some(*n) } else { None }).collect(),
        None => {
            let (_, s) = cx.input(1)?;
            match s.as_slice() {
                [Dim::Fixed(n)] => vec![None; *n],
                _ => return Err(cx.err("the pads must have a known length")),
            }
        }
    };
    let axes = match cx.const_ints(3)? {
        Some(a) => a.iter().map(|&v| cx.axis(v, x.len())).collect::<Result<Vec<_>>>()?,
        None => (0..x.len()).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!("{} pads do not fit {} axes", pads.len(), axes.len())));
    }
    let mut out = x.clone();
    for (k, &axis) in axes.iter().enumerate() {
        out[axis] = match (x[axis].fixed(), pads[k], pads[k + axes.len()]) {
            (_, Some(0), Some(0)) => x[axis].clone(),
            (Some(n), Some(begin), Some(end)) => {
                let size = n as i64 + begin + end;
                if size < 0 {
                    return Err(cx.err(format!("pads {begin}, {end} remove more than axis {axis} has")));
                }
                Dim::Fixed(size as usize)
            }
            _ => Dim::Unknown,
        };
    }
    Ok(vec![(dtype, out)])
}

pub(crate) fn shape(cx: &Cx<'_>) -> Result<Outputs> {
    let rank = cx.rank(0)?;
    let (start, end) = shape_range(cx, rank)?;
    Ok(vec![(DataType::Int64, vec![Dim::Fixed(end.saturating_sub(start))])])
}

pub(crate) fn constant_of_shape(cx: &Cx<'_>) -> Result<Outputs> {
    let dtype = match cx.node.attr_tensor("value")? {
        Some(t) => t.dtype(),
        None => DataType::Float32,
    };
    Ok(vec![(dtype, shape_from_input(cx, 0)?)])
}

pub(crate) fn range(cx: &Cx<'_>) -> Result<Outputs> {
    let dtype = cx.input(0)?.0;
    let len = match (cx.constant(0), cx.constant(1), cx.constant(2)) {
        (Some(s), Some(l), Some(d)) => {
            let (s, l, d) = (first(s), first(l), first(d));
            if d == 0.0 {
                return Err(cx.err("delta is zero"));
            }
            Dim::Fixed(((l - s) / d).ceil().max(0.0) as usize)
        }
        _ => Dim::Unknown,
    };
    Ok(vec![(dtype, vec![len])])
}

pub(crate) fn flatten(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let axis = cx.node.attr_int("axis", 1)?;
    let axis = if axis < 0 { axis + x.len() as i64 } else { axis };
    if axis < 0 || axis > x.len() as i64 {
        return Err(cx.err(format!("axis {axis} is out of range for rank {}", x.len())));
    }
    let (a, b) = x.split_at(axis as usize);
    Ok(vec![(dtype, vec![dims_product(a), dims_product(b)])])
}

pub(crate) fn reshape(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    Ok(vec![(dtype, reshaped(cx, &x)?)])
}

pub(crate) fn transpose(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let perm: Vec<usize> = match cx.node.attr_ints("perm")? {
        Some(p) => p.iter().map(|&a| cx.axis(a, x.len())).collect::<Result<_>>()?,
        None => (0..x.len()).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..x.len()).collect::<Vec<_>>() {
        return Err(cx.err(format!("perm {perm:?} is not a permutation of rank {}", x.len())));
    }
    Ok(vec![(dtype, perm.iter().map(|&a| x[a].clone()).collect())])
}

pub(crate) fn concat(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, first) = cx.input(0)?;
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, first.len())?;
    let mut out = first.clone();
    let mut total = first[axis].fixed();
    for i in 1..cx.node.inputs.len() {
        if !cx.has_input(i) {
            continue;
        }
        let (_, s) = cx.input(i)?;
        if s.len() != first.len() {
            return Err(cx.err(format!("inputs have ranks {} and {}", first.len(), s.len())));
        }
        total = total.zip(s[axis].fixed()).and_then(|(a, b)| a.checked_add(b));
        for (k, d) in s.iter().enumerate() {
            if k == axis {
                continue;
            }
            if let (Some(a), Some(b)) = (out[k].fixed(), d.fixed())
                && a != b
            {
                return Err(cx.err(format!("inputs differ in axis {k} ({a} vs {b})")));
            }
            if out[k] == Dim::Unknown {
                out[k] = d.clone();
            }
        }
    }
    out[axis] = total.map_or(Dim::Unknown, Dim::Fixed);
    Ok(vec![(dtype, out)])
}

pub(crate) fn gather(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, data) = cx.input(0)?;
    let (index_type, indices) = cx.input(1)?;
    if !matches!(index_type, DataType::Int32 | DataType::Int64) {
        return Err(cx.err(format!("indices must be int32 or int64, got {index_type}")));
    }
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, data.len())?;
    let mut out = data[..axis].to_vec();
    out.extend(indices);
    out.extend_from_slice(&data[axis + 1..]);
    Ok(vec![(dtype, out)])
}

/// `GatherElements`: data's element type in the indices' shape, of the data's rank.
pub(crate) fn gather_elements(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, data) = cx.input(0)?;
    let (index_type, indices) = cx.input(1)?;
    if !matches!(index_type, DataType::Int32 | DataType::Int64) {
        return Err(cx.err(format!("indices must be int32 or int64, got {index_type}")));
    }
    if indices.len() != data.len() {
        return Err(cx.err(format!(
            "indices {} and data {} must have the same rank",
            format_shape(&indices),
            format_shape(&data)
        )));
    }
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, data.len())?;
    // Off the gathered axis an index tensor may not be larger than the data (engines
    // refuse it at run time): a known size must fit, and a symbolic one (the batch) cannot
    // be known to fit a fixed size.
    for (a, (i, d)) in indices.iter().zip(&data).enumerate() {
        let fits = match (i, d) {
            (_, Dim::Unknown) | (Dim::Unknown, _) => true,
            (Dim::Fixed(i), Dim::Fixed(d)) => i <= d,
            (Dim::Symbol(_), Dim::Fixed(_)) => false,
            (Dim::Fixed(_), Dim::Symbol(_)) => true,
            (Dim::Symbol(i), Dim::Symbol(d)) => i == d,
        };
        if a != axis && !fits {
            return Err(cx.err(format!(
                "indices {} do not fit data {} on axis {a}",
                format_shape(&indices),
                format_shape(&data)
            )));
        }
    }
    Ok(vec![(dtype, indices)])
}

/// `CumSum`: the input's type and shape, along a valid axis (input 1, a scalar).
pub(crate) fn cum_sum(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    if let Some(axis) = cx.const_ints(1)? {
        match axis.as_slice() {
            [a] => {
                cx.axis(*a, x.len())?;
            }
            _ => return Err(cx.err(format!("the axis must be one integer, got {axis:?}"))),
        }
    }
    Ok(vec![(dtype, x)])
}

/// `Trilu`: the input's type and shape, of rank 2 or more (input 1, `k`, a scalar).
pub(crate) fn trilu(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    if x.len() < 2 {
        return Err(cx.err(format!("Trilu takes a matrix or a stack of them, got {}", format_shape(&x))));
    }
    Ok(vec![(dtype, x)])
}

pub(crate) fn gather_nd(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, data) = cx.input(0)?;
    let (index_type, indices) = cx.input(1)?;
    if index_type != DataType::Int64 {
        return Err(cx.err(format!("indices must be int64, got {index_type}")));
    }
    let batch = cx.node.attr_int("batch_dims", 0)?;
    let depth = indices
        .last()
        .and_then(Dim::fixed)
        .ok_or_else(|| cx.err("the last axis of the indices (the index depth) must have a known size"))?;
    if batch < 0 || indices.is_empty() || batch as usize + depth > data.len() || batch as usize >= indices.len() {
        return Err(cx.err(format!(
            "indices {} with batch_dims {batch} do not fit data {}",
            format_shape(&indices),
            format_shape(&data)
        )));
    }
    let mut out = indices[..indices.len() - 1].to_vec();
    out.extend_from_slice(&data[batch as usize + depth..]);
    Ok(vec![(dtype, out)])
}

pub(crate) fn unsqueeze(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let axes = cx.axes(1, 13)?.ok_or_else(|| cx.err("axes are required"))?;
    let rank = x.len() + axes.len();
    let mut axes = axes.iter().map(|&a| cx.axis(a, rank)).collect::<Result<Vec<_>>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err(cx.err(format!("axes {axes:?} repeat an axis")));
    }
    let mut out = x.clone();
    for a in axes {
        out.insert(a, Dim::Fixed(1));
    }
    Ok(vec![(dtype, out)])
}

pub(crate) fn squeeze(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let out = match cx.axes(1, 13)? {
        Some(axes) => {
            let axes = axes.iter().map(|&a| cx.axis(a, x.len())).collect::<Result<Vec<_>>>()?;
            for &a in &axes {
                if matches!(x[a], Dim::Fixed(n) if n != 1) {
                    return Err(cx.err(format!("cannot squeeze axis {a} of size {}", x[a])));
                }
            }
            x.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect()
        }
        None => x.into_iter().filter(|d| *d != Dim::Fixed(1)).collect(),
    };
    Ok(vec![(dtype, out)])
}

pub(crate) fn expand(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let target = shape_from_input(cx, 1)?;
    let out = broadcast_shapes(&[&x, &target])
        .ok_or_else(|| cx.err(format!("cannot expand {} to {}", format_shape(&x), format_shape(&target))))?;
    Ok(vec![(dtype, out)])
}

/// `Resize` (see [`super::resize::resize_axes`]): each axis as its mode maps it.
pub(crate) fn resize(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let axes = super::resize::resize_axes_of(cx.node, &x, cx.inf).map_err(|e| cx.err(e))?;
    let out = x.iter().zip(&axes).map(|(d, a)| a.output_dim(d)).collect();
    Ok(vec![(dtype, out)])
}

/// `Tile`: each axis times its repeat count (input 1; a count may be symbolic, as
/// `x.repeat(batch, 1, 1, 1)` of a one-sample map writes it).
pub(crate) fn tile(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    let repeats = shape_from_input(cx, 1)?;
    if repeats.len() != x.len() {
        return Err(cx.err(format!("{} repeats do not fit {}", repeats.len(), format_shape(&x))));
    }
    let out = x
        .iter()
        .zip(&repeats)
        .map(|(d, r)| match (d, r) {
            (_, Dim::Fixed(1)) => d.clone(),
            (Dim::Fixed(1), _) => r.clone(),
            (Dim::Fixed(n), Dim::Fixed(r)) => Dim::Fixed(n * r),
            _ => Dim::Unknown,
        })
        .collect();
    Ok(vec![(dtype, out)])
}

pub(crate) fn slice(cx: &Cx<'_>) -> Result<Outputs> {
    let (dtype, x) = cx.input(0)?;
    Ok(vec![(dtype, slice_shape(cx, &x)?)])
}

fn first(t: &crate::tensor::Tensor) -> f64 {
    t.to_f64_vec().and_then(|v| v.first().copied()).unwrap_or(0.0)
}

/// The value of a `Constant` node from whichever attribute holds it.
pub(super) fn constant_value(cx: &Cx<'_>) -> Result<crate::tensor::Tensor> {
    let node = cx.node;
    let (name, attr) = node.attributes.first().ok_or_else(|| cx.err("Constant without a value"))?;
    let t = match (name.as_str(), attr) {
        ("value", Attribute::Tensor(t)) => t.clone(),
        ("value_float", Attribute::Float(v)) => crate::tensor::Tensor::from_f32(vec![], &[*v])?,
        ("value_floats", Attribute::Floats(v)) => crate::tensor::Tensor::from_f32(vec![v.len()], v)?,
        ("value_int", Attribute::Int(v)) => crate::tensor::Tensor::from_i64(vec![], &[*v])?,
        ("value_ints", Attribute::Ints(v)) => crate::tensor::Tensor::from_i64(vec![v.len()], v)?,
        _ => return Err(cx.err(format!("unsupported Constant attribute {name:?}"))),
    };
    Ok(t)
}

fn shape_range(cx: &Cx<'_>, rank: usize) -> Result<(usize, usize)> {
    let clamp = |v: i64| -> usize {
        let v = if v < 0 { v + rank as i64 } else { v };
        v.clamp(0, rank as i64) as usize
    };
    let start = clamp(cx.node.attr_int("start", 0)?);
    let end = clamp(cx.node.attr_int("end", rank as i64)?);
    Ok((start, end.max(start)))
}

/// A shape given as a (possibly symbolic) 1-D integer input.
fn shape_from_input(cx: &Cx<'_>, index: usize) -> Result<Shape> {
    if let Some(values) = cx.symbolic(index) {
        return Ok(values.iter().map(sym_to_dim).collect());
    }
    let (_, s) = cx.input(index)?;
    match s.as_slice() {
        [Dim::Fixed(n)] => Ok(vec![Dim::Unknown; *n]),
        _ => Err(cx.err("the target shape must have a known length")),
    }
}

fn sym_to_dim(v: &SymInt) -> Dim {
    match v {
        SymInt::Known(n) if *n >= 0 => Dim::Fixed(*n as usize),
        SymInt::Symbol(s) => Dim::Symbol(s.clone()),
        _ => Dim::Unknown,
    }
}

fn reshaped(cx: &Cx<'_>, x: &[Dim]) -> Result<Shape> {
    let allow_zero = cx.node.attr_int("allowzero", 0)? != 0;
    let Some(target) = cx.symbolic(1) else {
        return shape_from_input(cx, 1);
    };
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, v) in target.iter().enumerate() {
        out.push(match v {
            SymInt::Known(0) if !allow_zero => {
                x.get(i).cloned().ok_or_else(|| cx.err(format!("shape copies axis {i} the input does not have")))?
            }
            SymInt::Known(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err(cx.err("shape has more than one -1"));
                }
                Dim::Unknown
            }
            SymInt::Known(n) if *n < 0 => return Err(cx.err(format!("invalid shape value {n}"))),
            other => sym_to_dim(other),
        });
    }
    let (fixed_in, mut symbols_in, unknown_in) = factor(x);
    let others: Vec<Dim> =
        out.iter().enumerate().filter(|(i, _)| Some(*i) != infer_at).map(|(_, d)| d.clone()).collect();
    let (fixed_out, symbols_out, unknown_out) = factor(&others);
    if let Some(at) = infer_at {
        if !unknown_in && !unknown_out {
            let mut leftover_out = Vec::new();
            for s in symbols_out {
                match symbols_in.iter().position(|t| *t == s) {
                    Some(p) => {
                        symbols_in.remove(p);
                    }
                    None => leftover_out.push(s),
                }
            }
            if fixed_out == 0 || fixed_in % fixed_out != 0 {
                if fixed_in != 0 {
                    return Err(cx.err(format!("cannot reshape {} to {:?}", format_shape(x), target)));
                }
            } else if leftover_out.is_empty() {
                let ratio = fixed_in / fixed_out;
                out[at] = match symbols_in.as_slice() {
                    [] => Dim::Fixed(ratio),
                    [s] if ratio == 1 => Dim::Symbol(s.clone()),
                    _ => Dim::Unknown,
                };
            }
        }
    } else if !unknown_in && !unknown_out && symbols_in.is_empty() && symbols_out.is_empty() && fixed_in != fixed_out {
        return Err(cx.err(format!(
            "cannot reshape {} ({fixed_in} elements) to {}",
            format_shape(x),
            format_shape(&out)
        )));
    }
    Ok(out)
}

/// Splits dimensions into the product of the fixed ones, the symbols, and whether any is unknown.
fn factor(dims: &[Dim]) -> (usize, Vec<String>, bool) {
    let mut fixed = 1usize;
    let mut symbols = Vec::new();
    let mut unknown = false;
    for d in dims {
        match d {
            Dim::Fixed(n) => match fixed.checked_mul(*n) {
                Some(f) => fixed = f,
                None => unknown = true,
            },
            Dim::Symbol(s) => symbols.push(s.clone()),
            Dim::Unknown => unknown = true,
        }
    }
    (fixed, symbols, unknown)
}

/// Resolved (start, end, step) of a slice along one axis of known size, per ONNX's rules.
pub fn slice_bounds(start: i64, end: i64, step: i64, size: i64) -> (i64, i64, usize) {
    if size <= 0 || step == 0 {
        return (0, 0, 0);
    }
    let norm = |v: i64| if v < 0 { v.saturating_add(size) } else { v };
    // i128 keeps extreme steps (i64::MIN, i64::MAX) from overflowing.
    let (s, e) = if step > 0 {
        (norm(start).clamp(0, size), norm(end).clamp(0, size))
    } else {
        (norm(start).clamp(0, size - 1), norm(end).clamp(-1, size - 1))
    };
    let (span, stride) =
        if step > 0 { (e as i128 - s as i128, step as i128) } else { (s as i128 - e as i128, -(step as i128)) };
    let len = if span > 0 { (span + stride - 1) / stride } else { 0 };
    (s, e, len as usize)
}

/// The slice parameters per axis: (axis, start, end, step).
pub(crate) fn slice_params(cx: &Cx<'_>, rank: usize) -> Result<Vec<(usize, i64, i64, i64)>> {
    let starts = cx.const_ints(1)?.ok_or_else(|| cx.err("starts are required"))?;
    let ends = cx.const_ints(2)?.ok_or_else(|| cx.err("ends are required"))?;
    let axes = match cx.const_ints(3)? {
        Some(a) => a.iter().map(|&v| cx.axis(v, rank)).collect::<Result<Vec<_>>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = cx.const_ints(4)?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.err("starts, ends, axes and steps must have the same length"));
    }
    if steps.contains(&0) {
        return Err(cx.err("a slice step is zero"));
    }
    Ok((0..starts.len()).map(|i| (axes[i], starts[i], ends[i], steps[i])).collect())
}

fn slice_shape(cx: &Cx<'_>, x: &[Dim]) -> Result<Shape> {
    let mut out = x.to_vec();
    if cx.constant(1).is_none() || cx.constant(2).is_none() {
        // Bounds computed at run time (a gradient's slice of a concatenation whose sizes are
        // symbolic): the sliced axes, which must be known, get unknown sizes.
        let (_, starts) = cx.input(1)?;
        let count = match starts.as_slice() {
            [Dim::Fixed(n)] => *n,
            _ => return Err(cx.err("starts computed at run time must be a vector of known length")),
        };
        let axes = match cx.const_ints(3)? {
            Some(a) => a.iter().map(|&v| cx.axis(v, x.len())).collect::<Result<Vec<_>>>()?,
            None => (0..count).collect(),
        };
        if axes.len() != count {
            return Err(cx.err("starts, ends and axes must have the same length"));
        }
        for axis in axes {
            out[axis] = Dim::Unknown;
        }
        return Ok(out);
    }
    for (axis, start, end, step) in slice_params(cx, x.len())? {
        out[axis] = match &x[axis] {
            Dim::Fixed(n) => Dim::Fixed(slice_bounds(start, end, step, *n as i64).2),
            other if start == 0 && step == 1 && end >= i32::MAX as i64 => other.clone(),
            _ => Dim::Unknown,
        };
    }
    Ok(out)
}

pub(crate) fn split(cx: &Cx<'_>) -> Result<Outputs> {
    let node = cx.node;
    let (dtype, x) = cx.input(0)?;
    let axis = cx.axis(node.attr_int("axis", 0)?, x.len())?;
    let count = node.outputs.len();
    let sizes: Vec<Dim> =
        match if cx.opset >= 13 { cx.const_ints(1)? } else { node.attr_ints("split")?.map(|s| s.to_vec()) } {
            Some(split) => {
                if split.len() != count {
                    return Err(cx.err(format!("split has {} sizes for {count} outputs", split.len())));
                }
                if let Some(n) = x[axis].fixed()
                    && (split.iter().any(|&s| s < 0) || split.iter().map(|&s| s as i128).sum::<i128>() != n as i128)
                {
                    return Err(cx.err(format!("split sizes {split:?} do not add up to {n}")));
                }
                split.iter().map(|&s| Dim::Fixed(s.max(0) as usize)).collect()
            }
            None => match x[axis].fixed() {
                Some(n) => {
                    let chunk = n.div_ceil(count.max(1));
                    (0..count).map(|i| Dim::Fixed(chunk.min(n.saturating_sub(i * chunk)))).collect()
                }
                None => vec![Dim::Unknown; count],
            },
        };
    Ok(sizes
        .into_iter()
        .map(|d| {
            let mut s = x.clone();
            s[axis] = d;
            (dtype, s)
        })
        .collect())
}

/// Element-by-element (possibly symbolic) values of rank-0/1 integer outputs of shape
/// computations: `Shape`'s output is its input's dimensions.
pub(crate) fn shape_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    let Ok((_, x)) = cx.input(0) else { return Ok(None) };
    let (start, end) = shape_range(cx, x.len())?;
    Ok(Some(x[start..end].iter().map(SymInt::from_dim).collect()))
}

/// Ops that pass their input's values through unchanged (reshapes, `Identity`).
pub(crate) fn same_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    Ok(cx.symbolic(0))
}

/// A `Cast` to an integer type keeps the values; one to a float type does not stay symbolic.
pub(crate) fn cast_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    if !DataType::from_onnx(cx.node.attr_int("to", 0)? as i32)?.is_integer() {
        return Ok(None);
    }
    Ok(cx.symbolic(0))
}

/// `Gather` along axis 0 with constant indices picks elements.
pub(crate) fn gather_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    if cx.node.attr_int("axis", 0)? != 0 {
        return Ok(None);
    }
    let (Some(data), Some(indices)) = (cx.symbolic(0), cx.constant(1).and_then(|t| t.to_i64_vec())) else {
        return Ok(None);
    };
    let n = data.len() as i64;
    let mut picked = Vec::new();
    for i in indices {
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(cx.err(format!("index {i} is out of range for {n} elements")));
        }
        picked.push(data[j as usize].clone());
    }
    Ok(Some(picked))
}

/// `Concat` of values known element by element.
pub(crate) fn concat_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    let mut all = Vec::new();
    for i in 0..cx.node.inputs.len() {
        match cx.symbolic(i) {
            Some(v) => all.extend(v),
            None => return Ok(None),
        }
    }
    Ok(Some(all))
}

/// `Slice` of a value known element by element, along its only axis.
pub(crate) fn slice_value(cx: &Cx<'_>) -> Result<Option<Vec<SymInt>>> {
    let Some(data) = cx.symbolic(0) else { return Ok(None) };
    let Ok(params) = slice_params(cx, 1) else { return Ok(None) };
    let Some(&(_, start, end, step)) = params.first() else { return Ok(Some(data)) };
    let (s, _, len) = slice_bounds(start, end, step, data.len() as i64);
    Ok(Some((0..len as i64).map(|k| data[(s + k * step) as usize].clone()).collect()))
}
