//! Evaluation of small constant computations at import time (constant folding).

use super::layout::{constant_value, slice_bounds, slice_params};
use super::{Cx, MAX_FOLDED_ELEMENTS, Outputs, broadcast_index_map};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ops::Fold;
use crate::tensor::Tensor;

/// What an evaluation rule knows beyond the node: the output's element type and
/// dimensions, and which inputs are present (all of them constants).
pub(crate) struct Known {
    /// The output's element type.
    pub dtype: DataType,
    /// The output's dimensions, all fixed.
    pub dims: Vec<usize>,
    /// Indices of the inputs given, whose values are all known.
    pub present: Vec<usize>,
}

/// Evaluates a node whose op folds, whose inputs are known constants and whose output is
/// small and of fixed shape. Returns `None` when it cannot or should not be evaluated.
pub(super) fn evaluate(cx: &Cx<'_>, outputs: &Outputs, fold: &Fold) -> Result<Option<Vec<Tensor>>> {
    let (eval, value_inputs) = match fold {
        Fold::Values(eval) => (eval, cx.node.inputs.len()),
        Fold::FirstValues(eval) => (eval, 1),
        Fold::Never(_) => return Ok(None),
    };
    if outputs.len() != 1 {
        return Ok(None);
    }
    let Some(dims) = outputs[0].1.iter().map(|d| d.fixed()).collect::<Option<Vec<usize>>>() else {
        return Ok(None);
    };
    if crate::tensor::checked_numel(&dims).is_none_or(|n| n > MAX_FOLDED_ELEMENTS) || outputs[0].0 == DataType::String {
        return Ok(None);
    }
    let present: Vec<usize> = (0..value_inputs).filter(|&i| cx.has_input(i)).collect();
    if present.iter().any(|&i| cx.constant(i).is_none()) {
        return Ok(None);
    }
    eval(cx, Known { dtype: outputs[0].0, dims, present }).map(|t| Some(vec![t]))
}

pub(crate) fn constant(cx: &Cx<'_>, _known: Known) -> Result<Tensor> {
    constant_value(cx)
}

pub(crate) fn same_values(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    input(0).reshaped(dims)
}

pub(crate) fn cast(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dtype, dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let x = input(0);
    if dtype.is_float() || !x.dtype().is_integer() && x.dtype() != DataType::Bool {
        Tensor::from_f64_as(dtype, dims, &x.to_f64_vec().unwrap_or_default())
    } else {
        Tensor::from_i64_as(dtype, dims, &x.to_i64_vec().unwrap_or_default())
    }
}

pub(crate) fn gather(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let (data, indices) = (input(0), input(1));
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, data.dims().len())?;
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
    gather_elements(data, &picks, dims)
}

pub(crate) fn concat(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dtype, dims, present } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let first = input(present[0]);
    let axis = cx.axis(cx.node.attr_int("axis", 0)?, first.dims().len())?;
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
    from_values(dtype, dims, &out_f, &out_i)
}

pub(crate) fn slice(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
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
        let flat: i64 = (0..rank).map(|a| (starts[a] + index[a] as i64 * steps[a]) * in_strides[a] as i64).sum();
        picks.push(flat as usize);
        increment(&mut index, &dims);
    }
    gather_elements(data, &picks, dims)
}

pub(crate) fn transpose(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let x = input(0);
    let rank = x.dims().len();
    let perm: Vec<usize> = match cx.node.attr_ints("perm")? {
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
    gather_elements(x, &picks, dims)
}

pub(crate) fn expand(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let x = input(0);
    let map = broadcast_index_map(x.dims(), &dims);
    gather_elements(x, &map, dims)
}

pub(crate) fn constant_of_shape(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dtype, dims, .. } = known;
    let value = cx.node.attr_tensor("value")?.cloned().unwrap_or(Tensor::from_f32(vec![1], &[0.0])?);
    let n: usize = dims.iter().product();
    let v = value.to_f64_vec().and_then(|v| v.first().copied()).unwrap_or(0.0);
    let i = value.to_i64_vec().and_then(|v| v.first().copied()).unwrap_or(0);
    from_values(dtype, dims, &vec![v; n], &vec![i; n])
}

pub(crate) fn range(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let Known { dtype, dims, .. } = known;
    let input = |i: usize| cx.constant(i).expect("checked by evaluate");
    let n: usize = dims.iter().product();
    let get = |i: usize| input(i).to_f64_vec().and_then(|v| v.first().copied()).unwrap_or(0.0);
    let (start, delta) = (get(0), get(2));
    let f: Vec<f64> = (0..n).map(|k| start + k as f64 * delta).collect();
    let i: Vec<i64> = f.iter().map(|&v| v as i64).collect();
    from_values(dtype, dims, &f, &i)
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

/// An element-wise rule on one element of each (broadcast) input: exact in `i64` when every
/// input is an integer or boolean (`None`: always in `f64`), else in `f64`.
type IntRule<'a> = Option<&'a dyn Fn(&[i64]) -> std::result::Result<i64, &'static str>>;
type FloatRule<'a> = &'a dyn Fn(&[f64]) -> f64;

fn elementwise(cx: &Cx<'_>, known: Known, int: IntRule<'_>, float: FloatRule<'_>) -> Result<Tensor> {
    let Known { dtype, dims, present } = known;
    let inputs: Vec<&Tensor> = present.iter().map(|&i| cx.constant(i).expect("checked by evaluate")).collect();
    let maps: Vec<Vec<usize>> = inputs.iter().map(|t| broadcast_index_map(t.dims(), &dims)).collect();
    let n: usize = dims.iter().product();
    let integer = inputs.iter().all(|t| t.dtype().is_integer() || t.dtype() == DataType::Bool);
    if let (true, Some(int)) = (integer, int) {
        let values: Vec<Vec<i64>> = inputs.iter().map(|t| t.to_i64_vec().unwrap_or_default()).collect();
        let mut args = vec![0i64; inputs.len()];
        let mut out = Vec::with_capacity(n);
        for e in 0..n {
            for (k, a) in args.iter_mut().enumerate() {
                *a = values[k][maps[k][e]];
            }
            out.push(int(&args).map_err(|m| cx.err(m))?);
        }
        return Tensor::from_i64_as(dtype, dims, &out);
    }
    let values: Vec<Vec<f64>> = inputs.iter().map(|t| t.to_f64_vec().unwrap_or_default()).collect();
    let mut args = vec![0f64; inputs.len()];
    let mut out = Vec::with_capacity(n);
    for e in 0..n {
        for (k, a) in args.iter_mut().enumerate() {
            *a = values[k][maps[k][e]];
        }
        out.push(float(&args));
    }
    Tensor::from_f64_as(dtype, dims, &out)
}

fn flag(b: bool) -> i64 {
    b as i64
}

pub(crate) fn add(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0].wrapping_add(v[1]))), &|v| v[0] + v[1])
}

pub(crate) fn sub(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0].wrapping_sub(v[1]))), &|v| v[0] - v[1])
}

pub(crate) fn mul(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0].wrapping_mul(v[1]))), &|v| v[0] * v[1])
}

pub(crate) fn div(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let int = |v: &[i64]| match v[1] {
        0 => Err("integer division by zero in a constant"),
        d => Ok(v[0].wrapping_div(d)),
    };
    elementwise(cx, known, Some(&int), &|v| v[0] / v[1])
}

/// Mod's sign follows the divisor unless `fmod` asks for C's fmod (the dividend's sign).
pub(crate) fn mod_(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let fmod = cx.node.attr_int("fmod", 0)? != 0;
    let int = |v: &[i64]| {
        let (a, d) = (v[0], v[1]);
        if d == 0 {
            return Err("integer modulo by zero in a constant");
        }
        let r = a.wrapping_rem(d);
        Ok(if !fmod && r != 0 && (r < 0) != (d < 0) { r + d } else { r })
    };
    let float = |v: &[f64]| {
        let (a, d) = (v[0], v[1]);
        let r = a % d;
        if !fmod && r != 0.0 && (r < 0.0) != (d < 0.0) { r + d } else { r }
    };
    elementwise(cx, known, Some(&int), &float)
}

pub(crate) fn neg(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0].wrapping_neg())), &|v| -v[0])
}

pub(crate) fn abs(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0].wrapping_abs())), &|v| v[0].abs())
}

/// An integer is its own floor.
pub(crate) fn floor(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0])), &|v| v[0].floor())
}

/// An integer is its own ceiling.
pub(crate) fn ceil(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(v[0])), &|v| v[0].ceil())
}

/// Always in `f64`, even for integer inputs.
pub(crate) fn sqrt(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, None, &|v| v[0].sqrt())
}

pub(crate) fn equal(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] == v[1]))), &|v| flag(v[0] == v[1]) as f64)
}

pub(crate) fn less(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] < v[1]))), &|v| flag(v[0] < v[1]) as f64)
}

pub(crate) fn greater(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] > v[1]))), &|v| flag(v[0] > v[1]) as f64)
}

pub(crate) fn greater_or_equal(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] >= v[1]))), &|v| flag(v[0] >= v[1]) as f64)
}

pub(crate) fn less_or_equal(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] <= v[1]))), &|v| flag(v[0] <= v[1]) as f64)
}

pub(crate) fn not(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] == 0))), &|v| flag(v[0] == 0.0) as f64)
}

pub(crate) fn and(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] != 0 && v[1] != 0))), &|v| flag(v[0] != 0.0 && v[1] != 0.0) as f64)
}

pub(crate) fn or(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    elementwise(cx, known, Some(&|v| Ok(flag(v[0] != 0 || v[1] != 0))), &|v| flag(v[0] != 0.0 || v[1] != 0.0) as f64)
}

pub(crate) fn where_(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let int = |v: &[i64]| Ok(if v[0] != 0 { v[1] } else { v[2] });
    elementwise(cx, known, Some(&int), &|v| if v[0] != 0.0 { v[1] } else { v[2] })
}

pub(crate) fn max(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let int = |v: &[i64]| Ok(v.iter().copied().max().unwrap_or(0));
    elementwise(cx, known, Some(&int), &|v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

pub(crate) fn min(cx: &Cx<'_>, known: Known) -> Result<Tensor> {
    let int = |v: &[i64]| Ok(v.iter().copied().min().unwrap_or(0));
    elementwise(cx, known, Some(&int), &|v| v.iter().copied().fold(f64::INFINITY, f64::min))
}
