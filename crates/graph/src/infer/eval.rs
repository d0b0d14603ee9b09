//! Evaluation of small constant computations at import time (constant folding).

use super::layout::{constant_value, slice_bounds, slice_params};
use super::{Cx, MAX_FOLDED_ELEMENTS, Outputs, broadcast_index_map};
use crate::dtype::DataType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Ops evaluated when all their inputs are known.
const FOLDABLE: &[&str] = &[
    "Constant",
    "Shape",
    "Identity",
    "Cast",
    "CastLike",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Gather",
    "Concat",
    "Slice",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Neg",
    "Mod",
    "Abs",
    "Floor",
    "Ceil",
    "Sqrt",
    "Equal",
    "Less",
    "Greater",
    "Not",
    "And",
    "Or",
    "Where",
    "Max",
    "Min",
    "ConstantOfShape",
    "Range",
    "Expand",
    "Transpose",
];

/// Evaluates a node whose inputs are all known constants and whose outputs are small and
/// of fixed shape. Returns `None` when it cannot or should not be evaluated.
pub(super) fn evaluate(cx: &Cx<'_>, outputs: &Outputs) -> Result<Option<Vec<Tensor>>> {
    let node = cx.node;
    if !FOLDABLE.contains(&node.op_type.as_str()) || outputs.len() != 1 {
        return Ok(None);
    }
    let Some(dims) = outputs[0].1.iter().map(|d| d.fixed()).collect::<Option<Vec<usize>>>() else {
        return Ok(None);
    };
    if crate::tensor::checked_numel(&dims).is_none_or(|n| n > MAX_FOLDED_ELEMENTS) || outputs[0].0 == DataType::String {
        return Ok(None);
    }
    if node.op_type == "Shape" {
        // Known when the input's shape is fully known, whatever its values.
        return Ok(None);
    }
    // CastLike reads only the element type of its second input.
    let value_inputs = if node.op_type == "CastLike" { 1 } else { node.inputs.len() };
    let present: Vec<usize> = (0..value_inputs).filter(|&i| cx.has_input(i)).collect();
    if present.iter().any(|&i| cx.constant(i).is_none()) {
        return Ok(None);
    }
    let dtype = outputs[0].0;
    let input = |i: usize| cx.constant(i).expect("checked above");
    let t = match node.op_type.as_str() {
        "Constant" => constant_value(cx)?,
        "Identity" | "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" => input(0).reshaped(dims)?,
        "Cast" | "CastLike" => {
            let x = input(0);
            if dtype.is_float() || !x.dtype().is_integer() && x.dtype() != DataType::Bool {
                Tensor::from_f64_as(dtype, dims, &x.to_f64_vec().unwrap_or_default())?
            } else {
                Tensor::from_i64_as(dtype, dims, &x.to_i64_vec().unwrap_or_default())?
            }
        }
        "Gather" => {
            let (data, indices) = (input(0), input(1));
            let axis = cx.axis(node.attr_int("axis", 0)?, data.dims().len())?;
            let n = data.dims()[axis] as i64;
            let outer: usize = data.dims()[..axis].iter().product();
            let inner: usize = data.dims()[axis + 1..].iter().product();
            let idx = indices.to_i64_vec().unwrap_or_default();
            let mut picks = Vec::with_capacity(outer * idx.len() * inner);
            for o in 0..outer {
                for &i in &idx {
                    let j = if i < 0 { i + n } else { i };
                    if !(0..n).contains(&j) {
                        return Err(cx.err(format!("index {i} is out of range for axis of size {n}")));
                    }
                    for k in 0..inner {
                        picks.push((o * n as usize + j as usize) * inner + k);
                    }
                }
            }
            gather_elements(data, &picks, dims)?
        }
        "Concat" => {
            let first = input(present[0]);
            let axis = cx.axis(node.attr_int("axis", 0)?, first.dims().len())?;
            let outer: usize = first.dims()[..axis].iter().product();
            let parts: Vec<&Tensor> = present.iter().map(|&i| input(i)).collect();
            let values: Vec<Vec<f64>> = parts.iter().map(|t| t.to_f64_vec().unwrap_or_default()).collect();
            let ints: Vec<Option<Vec<i64>>> = parts.iter().map(|t| t.to_i64_vec()).collect();
            let mut out_f = Vec::new();
            let mut out_i = Vec::new();
            for o in 0..outer {
                for (p, t) in parts.iter().enumerate() {
                    let chunk: usize = t.dims()[axis..].iter().product();
                    out_f.extend_from_slice(&values[p][o * chunk..(o + 1) * chunk]);
                    if let Some(v) = &ints[p] {
                        out_i.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
                    }
                }
            }
            from_values(dtype, dims, &out_f, &out_i)?
        }
        "Slice" => {
            let data = input(0);
            let rank = data.dims().len();
            let mut starts = vec![0i64; rank];
            let mut steps = vec![1i64; rank];
            for (axis, start, end, step) in slice_params(cx, rank)? {
                let (s, _, _) = slice_bounds(start, end, step, data.dims()[axis] as i64);
                (starts[axis], steps[axis]) = (s, step);
            }
            let in_strides = strides(data.dims());
            let total: usize = dims.iter().product();
            let mut picks = Vec::with_capacity(total);
            let mut index = vec![0usize; rank];
            for _ in 0..total {
                let flat: i64 =
                    (0..rank).map(|a| (starts[a] + index[a] as i64 * steps[a]) * in_strides[a] as i64).sum();
                picks.push(flat as usize);
                increment(&mut index, &dims);
            }
            gather_elements(data, &picks, dims)?
        }
        "Transpose" => {
            let x = input(0);
            let rank = x.dims().len();
            let perm: Vec<usize> = match node.attr_ints("perm")? {
                Some(p) => p.iter().map(|&a| cx.axis(a, rank)).collect::<Result<_>>()?,
                None => (0..rank).rev().collect(),
            };
            let in_strides = strides(x.dims());
            let total: usize = dims.iter().product();
            let mut picks = Vec::with_capacity(total);
            let mut index = vec![0usize; rank];
            for _ in 0..total {
                picks.push((0..rank).map(|a| index[a] * in_strides[perm[a]]).sum());
                increment(&mut index, &dims);
            }
            gather_elements(x, &picks, dims)?
        }
        "Expand" => {
            let x = input(0);
            let map = broadcast_index_map(x.dims(), &dims);
            gather_elements(x, &map, dims)?
        }
        "ConstantOfShape" => {
            let value = node.attr_tensor("value")?.cloned().unwrap_or(Tensor::from_f32(vec![1], &[0.0])?);
            let n: usize = dims.iter().product();
            let v = value.to_f64_vec().and_then(|v| v.first().copied()).unwrap_or(0.0);
            let i = value.to_i64_vec().and_then(|v| v.first().copied()).unwrap_or(0);
            from_values(dtype, dims, &vec![v; n], &vec![i; n])?
        }
        "Range" => {
            let n: usize = dims.iter().product();
            let get = |i: usize| input(i).to_f64_vec().and_then(|v| v.first().copied()).unwrap_or(0.0);
            let (start, delta) = (get(0), get(2));
            let f: Vec<f64> = (0..n).map(|k| start + k as f64 * delta).collect();
            let i: Vec<i64> = f.iter().map(|&v| v as i64).collect();
            from_values(dtype, dims, &f, &i)?
        }
        _ => elementwise(cx, &present, dtype, dims)?,
    };
    Ok(Some(vec![t]))
}

fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * dims[a + 1];
    }
    s
}

fn increment(index: &mut [usize], dims: &[usize]) {
    for a in (0..dims.len()).rev() {
        index[a] += 1;
        if index[a] < dims[a] {
            return;
        }
        index[a] = 0;
    }
}

fn gather_elements(data: &Tensor, picks: &[usize], dims: Vec<usize>) -> Result<Tensor> {
    let size = data.dtype().size();
    let bytes = data.raw_bytes();
    let mut out = Vec::with_capacity(picks.len() * size);
    for &p in picks {
        out.extend_from_slice(&bytes[p * size..(p + 1) * size]);
    }
    Tensor::from_raw(data.dtype(), dims, out)
}

fn from_values(dtype: DataType, dims: Vec<usize>, f: &[f64], i: &[i64]) -> Result<Tensor> {
    if dtype.is_float() || i.len() != f.len() {
        Tensor::from_f64_as(dtype, dims, f)
    } else {
        Tensor::from_i64_as(dtype, dims, i)
    }
}

fn elementwise(cx: &Cx<'_>, present: &[usize], dtype: DataType, dims: Vec<usize>) -> Result<Tensor> {
    let op = cx.node.op_type.as_str();
    let inputs: Vec<&Tensor> = present.iter().map(|&i| cx.constant(i).expect("checked")).collect();
    let maps: Vec<Vec<usize>> = inputs.iter().map(|t| broadcast_index_map(t.dims(), &dims)).collect();
    let n: usize = dims.iter().product();
    // Integer arithmetic stays exact in i64; everything else goes through f64.
    let integer = inputs.iter().all(|t| t.dtype().is_integer() || t.dtype() == DataType::Bool);
    // Mod's sign follows the divisor unless `fmod` asks for C's fmod (the dividend's sign).
    let fmod = op == "Mod" && cx.node.attr_int("fmod", 0)? != 0;
    if integer && op != "Sqrt" {
        let values: Vec<Vec<i64>> = inputs.iter().map(|t| t.to_i64_vec().unwrap_or_default()).collect();
        let at = |k: usize, e: usize| values[k][maps[k][e]];
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            out.push(match op {
                "Add" => at(0, e).wrapping_add(at(1, e)),
                "Sub" => at(0, e).wrapping_sub(at(1, e)),
                "Mul" => at(0, e).wrapping_mul(at(1, e)),
                "Div" => {
                    let d = at(1, e);
                    if d == 0 {
                        return Err(cx.err("integer division by zero in a constant"));
                    }
                    at(0, e).wrapping_div(d)
                }
                "Mod" => {
                    let (a, d) = (at(0, e), at(1, e));
                    if d == 0 {
                        return Err(cx.err("integer modulo by zero in a constant"));
                    }
                    let r = a.wrapping_rem(d);
                    if !fmod && r != 0 && (r < 0) != (d < 0) { r + d } else { r }
                }
                "Neg" => at(0, e).wrapping_neg(),
                "Abs" => at(0, e).wrapping_abs(),
                "Floor" | "Ceil" => at(0, e),
                "Equal" => (at(0, e) == at(1, e)) as i64,
                "Less" => (at(0, e) < at(1, e)) as i64,
                "Greater" => (at(0, e) > at(1, e)) as i64,
                "Not" => (at(0, e) == 0) as i64,
                "And" => (at(0, e) != 0 && at(1, e) != 0) as i64,
                "Or" => (at(0, e) != 0 || at(1, e) != 0) as i64,
                "Where" => {
                    if at(0, e) != 0 {
                        at(1, e)
                    } else {
                        at(2, e)
                    }
                }
                "Max" => (0..inputs.len()).map(|k| at(k, e)).max().unwrap_or(0),
                "Min" => (0..inputs.len()).map(|k| at(k, e)).min().unwrap_or(0),
                other => return Err(cx.err(format!("cannot evaluate {other}"))),
            });
        }
        return Tensor::from_i64_as(dtype, dims, &out);
    }
    let values: Vec<Vec<f64>> = inputs.iter().map(|t| t.to_f64_vec().unwrap_or_default()).collect();
    let at = |k: usize, e: usize| values[k][maps[k][e]];
    let mut out = Vec::with_capacity(n);
    for e in 0..n {
        out.push(match op {
            "Add" => at(0, e) + at(1, e),
            "Sub" => at(0, e) - at(1, e),
            "Mul" => at(0, e) * at(1, e),
            "Div" => at(0, e) / at(1, e),
            "Mod" => {
                let (a, d) = (at(0, e), at(1, e));
                let r = a % d;
                if !fmod && r != 0.0 && (r < 0.0) != (d < 0.0) { r + d } else { r }
            }
            "Neg" => -at(0, e),
            "Abs" => at(0, e).abs(),
            "Floor" => at(0, e).floor(),
            "Ceil" => at(0, e).ceil(),
            "Sqrt" => at(0, e).sqrt(),
            "Equal" => (at(0, e) == at(1, e)) as i64 as f64,
            "Less" => (at(0, e) < at(1, e)) as i64 as f64,
            "Greater" => (at(0, e) > at(1, e)) as i64 as f64,
            "Not" => (at(0, e) == 0.0) as i64 as f64,
            "And" => (at(0, e) != 0.0 && at(1, e) != 0.0) as i64 as f64,
            "Or" => (at(0, e) != 0.0 || at(1, e) != 0.0) as i64 as f64,
            "Where" => {
                if at(0, e) != 0.0 {
                    at(1, e)
                } else {
                    at(2, e)
                }
            }
            "Max" => (0..inputs.len()).map(|k| at(k, e)).fold(f64::NEG_INFINITY, f64::max),
            "Min" => (0..inputs.len()).map(|k| at(k, e)).fold(f64::INFINITY, f64::min),
            other => return Err(cx.err(format!("cannot evaluate {other}"))),
        });
    }
    Tensor::from_f64_as(dtype, dims, &out)
}
