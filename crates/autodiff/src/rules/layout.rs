//! Gradient rules of layout ops: reshapes, transposes, concatenation and splitting,
//! slicing, gathering (embedding lookups) and broadcasting.

use super::{InputGrads, RuleCx};
use crate::error::Result;
use edgefreeze_graph::DataType;
use edgefreeze_graph::ir::Attribute;

pub(super) const OPS: &[&str] =
    &["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather", "Expand"];

pub(super) fn differentiate(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    match cx.node.op_type.as_str() {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let dy = cx.dy()?;
            g[0] = Some(cx.e.reshape_like(&dy, &x));
        }
        "Transpose" => {
            let dy = cx.dy()?;
            let rank = cx.shape(&x)?.len();
            let perm: Vec<i64> = match cx.node.attr_ints("perm")? {
                Some(p) => p.iter().map(|&a| if a < 0 { a + rank as i64 } else { a }).collect(),
                None => (0..rank as i64).rev().collect(),
            };
            let mut inverse = vec![0i64; rank];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p as usize] = i as i64;
            }
            g[0] = Some(cx.e.transpose(&dy, &inverse));
        }
        "Concat" => {
            let dy = cx.dy()?;
            let rank = cx.shape(&x)?.len() as i64;
            let axis = cx.node.attr_int("axis", 0)?;
            let axis = if axis < 0 { axis + rank } else { axis };
            let mut offset = 0i64;
            for (i, grad) in g.iter_mut().enumerate() {
                let size = cx.shape(cx.x(i))?[axis as usize]
                    .fixed()
                    .ok_or_else(|| cx.err("concatenated sizes must be known"))? as i64;
                if cx.need(i) {
                    let starts = cx.e.ints(&[offset]);
                    let ends = cx.e.ints(&[offset + size]);
                    let axes = cx.e.ints(&[axis]);
                    *grad = Some(cx.e.op("Slice", &[&dy, &starts, &ends, &axes], vec![]));
                }
                offset += size;
            }
        }
        "Split" => {
            let axis = cx.node.attr_int("axis", 0)?;
            let mut parts = Vec::new();
            for k in 0..cx.node.outputs.len() {
                let part = match cx.grads[k].clone() {
                    Some(d) => d,
                    None => {
                        // An output without a gradient contributes zeros of its shape.
                        let out = cx.y(k).to_string();
                        let shape = cx.e.shape_of(&out);
                        let zero = edgefreeze_graph::Tensor::from_f64_as(cx.e.float, vec![1], &[0.0])?;
                        cx.e.op("ConstantOfShape", &[&shape], vec![("value", Attribute::Tensor(zero))])
                    }
                };
                parts.push(part);
            }
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            g[0] = Some(cx.e.op("Concat", &refs, vec![("axis", Attribute::Int(axis))]));
        }
        "Slice" => {
            let dy = cx.dy()?;
            g[0] = Some(slice_grad(cx, &x, &dy)?);
        }
        "Gather" => {
            let dy = cx.dy()?;
            g[0] = Some(gather_grad(cx, &x, &dy)?);
        }
        "Expand" => {
            let dy = cx.dy()?;
            g[0] = Some(cx.unbroadcast(&dy, 0)?);
        }
        other => return Err(cx.err(format!("no layout rule for {other}"))),
    }
    Ok(g)
}

fn const_ints(cx: &RuleCx<'_>, i: usize) -> Result<Option<Vec<i64>>> {
    match cx.node.input(i) {
        None => Ok(None),
        Some(name) => cx
            .types
            .constants
            .get(name)
            .and_then(|t| t.to_i64_vec())
            .map(Some)
            .ok_or_else(|| cx.err(format!("input {name:?} must be a constant"))),
    }
}

/// Scatters the gradient of a slice back to the input's shape, one sliced axis at a
/// time: strided positions are made by interleaving zeros (Unsqueeze, Pad, Reshape),
/// negative steps by reversing first, and the offset by padding.
fn slice_grad(cx: &mut RuleCx<'_>, x: &str, dy: &str) -> Result<String> {
    let shape = cx.shape(x)?;
    let rank = shape.len();
    let starts = const_ints(cx, 1)?.unwrap_or_default();
    let ends = const_ints(cx, 2)?.unwrap_or_default();
    let axes = const_ints(cx, 3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = const_ints(cx, 4)?.unwrap_or_else(|| vec![1; starts.len()]);
    let mut grad = dy.to_string();
    // The gradient's current shape: the slice's output shape, widened axis by axis.
    let mut current = cx.shape(cx.y(0))?;
    for k in 0..starts.len() {
        let axis = if axes[k] < 0 { axes[k] + rank as i64 } else { axes[k] } as usize;
        let size = shape[axis].fixed().ok_or_else(|| cx.err("sliced axes must have a known size"))? as i64;
        let (first, _, len) = edgefreeze_graph::infer::slice_bounds(starts[k], ends[k], steps[k], size);
        let len = len as i64;
        let pad_axis = |cx: &mut RuleCx<'_>, g: &str, rank: usize, axis: usize, begin: i64, end: i64| -> String {
            let mut pads = vec![0i64; 2 * rank];
            pads[axis] = begin;
            pads[axis + rank] = end;
            let pads = cx.e.ints(&pads);
            cx.e.op("Pad", &[g, &pads], vec![])
        };
        if len == 0 {
            // Nothing was selected: the gradient is zeros of the input's size on this axis.
            let scaled = cx.e.scale(&grad, 0.0);
            grad = pad_axis(cx, &scaled, rank, axis, 0, size);
            current[axis] = edgefreeze_graph::ir::Dim::Fixed(size as usize);
            continue;
        }
        let (lowest, stride) = if steps[k] > 0 {
            (first, steps[k])
        } else {
            // Reverse so positions ascend, then scatter with the positive stride.
            let (s, e, st, a) = (cx.e.ints(&[-1]), cx.e.ints(&[i64::MIN]), cx.e.ints(&[-1]), cx.e.ints(&[axis as i64]));
            grad = cx.e.op("Slice", &[&grad, &s, &e, &a, &st], vec![]);
            (first + (len - 1) * steps[k], -steps[k])
        };
        let mut span = len;
        if stride > 1 {
            let widened = cx.e.unsqueeze(&grad, &[axis as i64 + 1]);
            let interleaved = pad_axis(cx, &widened, rank + 1, axis + 1, 0, stride - 1);
            let mut target: Vec<i64> = Vec::with_capacity(rank);
            for (j, d) in current.iter().enumerate() {
                target.push(match j {
                    j if j == axis => len * stride,
                    j if j < axis => 0,
                    _ => d.fixed().ok_or_else(|| cx.err("axes after a strided slice must have known sizes"))? as i64,
                });
            }
            grad = cx.e.reshape(&interleaved, &target);
            span = len * stride;
        }
        let end_pad = size - lowest - span;
        grad = pad_axis(cx, &grad, rank, axis, lowest, end_pad.max(0));
        if end_pad < 0 {
            // The last stride's trailing zeros run past the input: cut them.
            let (s, e, a) = (cx.e.ints(&[0]), cx.e.ints(&[size]), cx.e.ints(&[axis as i64]));
            grad = cx.e.op("Slice", &[&grad, &s, &e, &a], vec![]);
        }
        current[axis] = edgefreeze_graph::ir::Dim::Fixed(size as usize);
    }
    Ok(grad)
}

/// The gradient of an embedding lookup along axis 0: the rows of the output gradient added
/// into zeros at their indices (`ScatterND` with `reduction="add"`, opset 16 on), or
/// before opset 16 one-hot rows times the output gradient.
fn gather_grad(cx: &mut RuleCx<'_>, data: &str, dy: &str) -> Result<String> {
    let axis = cx.node.attr_int("axis", 0)?;
    let shape = cx.fixed_shape(data)?;
    if axis != 0 || shape.is_empty() {
        return Err(cx.err("the gradient of Gather is implemented for axis 0 (embedding lookups)"));
    }
    let rows = shape[0] as i64;
    let width: i64 = shape[1..].iter().product::<usize>() as i64;
    let indices = cx.x(1).to_string();
    let flat = cx.e.reshape(&indices, &[-1]);
    let index_type = cx.types.types.get(&indices).and_then(|t| t.dtype).unwrap_or(DataType::Int64);
    let flat = if index_type == DataType::Int64 { flat } else { cx.e.cast(&flat, DataType::Int64) };
    // Negative indices count from the end.
    let zero = cx.e.int_scalar(0);
    let n = cx.e.int_scalar(rows);
    let negative = cx.e.op("Less", &[&flat, &zero], vec![]);
    let wrapped = cx.e.add(&flat, &n);
    let flat = cx.e.op("Where", &[&negative, &wrapped, &flat], vec![]);
    let dy2 = cx.e.reshape(dy, &[-1, width]);
    let target: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    if cx.e.opset >= 16 {
        // Rows of dY added into zeros at their indices (repeated indices add up).
        let size = cx.e.ints(&[rows, width]);
        let zero = edgefreeze_graph::Tensor::from_f64_as(cx.e.float, vec![1], &[0.0])?;
        let zeros = cx.e.op("ConstantOfShape", &[&size], vec![("value", Attribute::Tensor(zero))]);
        let positions = cx.e.unsqueeze(&flat, &[1]);
        let grad =
            cx.e.op("ScatterND", &[&zeros, &positions, &dy2], vec![("reduction", Attribute::String(b"add".to_vec()))]);
        return Ok(if shape.len() == 2 { grad } else { cx.e.reshape(&grad, &target) });
    }
    // Before opset 16 ScatterND cannot add: a one-hot matrix times dY.
    let one = cx.e.int_scalar(1);
    let range = cx.e.op("Range", &[&zero, &n, &one], vec![]);
    let column = cx.e.unsqueeze(&flat, &[1]);
    let hit = cx.e.op("Equal", &[&column, &range], vec![]);
    let float = cx.e.float;
    let onehot = cx.e.cast(&hit, float);
    let grad = cx.e.op("Gemm", &[&onehot, &dy2], vec![("transA", Attribute::Int(1))]);
    Ok(if shape.len() == 2 { grad } else { cx.e.reshape(&grad, &target) })
}
