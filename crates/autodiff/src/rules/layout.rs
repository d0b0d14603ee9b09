//! Gradient rules of layout ops: reshapes, transposes, concatenation and splitting,
//! slicing, gathering (embedding lookups) and broadcasting.

use super::{InputGrads, RuleCx};
use crate::error::Result;
use edgefreeze_graph::ir::{Attribute, Dim};
use edgefreeze_graph::{DataType, Tensor};

pub(super) fn reshape(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(cx.e.reshape_like(&dy, &x));
    Ok(g)
}

pub(super) fn transpose(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
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
    Ok(g)
}

/// dX_i is dY's slice of input i's span along the axis. Where every input's size along the
/// axis is known the bounds are constants; where some size is symbolic (a class token
/// `Expand`ed to the batch, a concatenation along the batch itself) the bounds are computed at
/// run time from `Shape` of each input, the known sizes staying constants.
pub(super) fn concat(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
    let dy = cx.dy()?;
    let rank = cx.shape(&x)?.len() as i64;
    let axis = cx.node.attr_int("axis", 0)?;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Err(cx.err(format!("axis {axis} is out of range for rank {rank}")));
    }
    let mut sizes = Vec::with_capacity(g.len());
    for i in 0..g.len() {
        let shape = cx.shape(cx.x(i))?;
        let dim = shape.get(axis as usize).ok_or_else(|| cx.err(format!("input {i} has rank {}", shape.len())))?;
        sizes.push(dim.fixed().map(|n| n as i64));
    }
    // Inputs after the last one that needs a gradient do not move any bound.
    let last = (0..g.len()).rposition(|i| cx.need(i)).map_or(0, |i| i + 1);
    let axes = cx.e.ints(&[axis]);
    if sizes[..last].iter().all(Option::is_some) {
        let mut offset = 0i64;
        for (i, size) in sizes[..last].iter().enumerate() {
            let size = size.expect("checked: every size is known");
            if cx.need(i) {
                let starts = cx.e.ints(&[offset]);
                let ends = cx.e.ints(&[offset + size]);
                g[i] = Some(cx.e.op("Slice", &[&dy, &starts, &ends, &axes], vec![]));
            }
            offset += size;
        }
        return Ok(g);
    }
    // The offset as a known part plus a run-time part (the sum of the symbolic sizes so far).
    let (mut known, mut symbolic): (i64, Option<String>) = (0, None);
    for (i, size) in sizes[..last].iter().enumerate() {
        let start = bound(cx, known, symbolic.as_deref());
        match size {
            Some(n) => known += n,
            None => {
                let xi = cx.x(i).to_string();
                let full = cx.e.shape_of(&xi);
                let n = cx.e.op("Gather", &[&full, &axes], vec![("axis", Attribute::Int(0))]);
                symbolic = Some(match symbolic {
                    Some(s) => cx.e.add(&s, &n),
                    None => n,
                });
            }
        }
        if cx.need(i) {
            let end = bound(cx, known, symbolic.as_deref());
            g[i] = Some(cx.e.op("Slice", &[&dy, &start, &end, &axes], vec![]));
        }
    }
    Ok(g)
}

/// A one-element i64 bound `known + symbolic` (`symbolic` a one-element run-time value).
fn bound(cx: &mut RuleCx<'_>, known: i64, symbolic: Option<&str>) -> String {
    match symbolic {
        None => cx.e.ints(&[known]),
        Some(s) if known == 0 => s.to_string(),
        Some(s) => {
            let k = cx.e.ints(&[known]);
            cx.e.add(s, &k)
        }
    }
}

pub(super) fn split(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
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
    Ok(g)
}

pub(super) fn slice(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(slice_grad(cx, &x, &dy)?);
    Ok(g)
}

pub(super) fn gather(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(gather_grad(cx, &x, &dy)?);
    Ok(g)
}

/// `GatherElements`: dY added into zeros shaped like the data at the gathered positions
/// (`ScatterElements` with `reduction="add"`, opset 16 on, so that a position gathered
/// twice gets both contributions).
pub(super) fn gather_elements(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    if !cx.need(0) {
        return Ok(g);
    }
    if cx.e.opset < 16 {
        return Err(cx.err("the gradient of GatherElements needs opset 16 or later (ScatterElements with reduction)"));
    }
    let dy = cx.dy()?;
    let (data, indices) = (cx.x(0).to_string(), cx.x(1).to_string());
    let rank = cx.shape(&data)?.len();
    let axis = cx.node.attr_int("axis", 0)?;
    // Only the data's own shape says the zeros' size: the indices may be smaller on any axis.
    let zeros = zeros_shaped(cx, &data, &(0..rank).collect::<Vec<_>>(), &dy, &vec![None; rank])?;
    g[0] = Some(cx.e.op(
        "ScatterElements",
        &[&zeros, &indices, &dy],
        vec![("axis", Attribute::Int(axis)), ("reduction", Attribute::String(b"add".to_vec()))],
    ));
    Ok(g)
}

/// `CumSum`: each input element reaches the outputs after it (before it, reversed), so dX is
/// the cumulative sum of dY in the other direction, with the same exclusiveness.
pub(super) fn cum_sum(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    let dy = cx.dy()?;
    let axis = cx.x(1).to_string();
    let reverse = cx.node.attr_int("reverse", 0)? != 0;
    let exclusive = cx.node.attr_int("exclusive", 0)?;
    g[0] = Some(cx.e.op(
        "CumSum",
        &[&dy, &axis],
        vec![("exclusive", Attribute::Int(exclusive)), ("reverse", Attribute::Int(i64::from(!reverse)))],
    ));
    Ok(g)
}

/// `Trilu` keeps a triangle and zeroes the rest: dX is dY's same triangle.
pub(super) fn trilu(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    let dy = cx.dy()?;
    let upper = cx.node.attr_int("upper", 1)?;
    let mut inputs = vec![dy.as_str()];
    let k = cx.x(1).to_string();
    if !k.is_empty() {
        inputs.push(&k);
    }
    g[0] = Some(cx.e.op("Trilu", &inputs, vec![("upper", Attribute::Int(upper))]));
    Ok(g)
}

/// `Resize` (the graph crate's `resize_axes`). Where every axis repeats its elements
/// (nearest neighbour by whole numbers, as `nn.Upsample` exports), dX sums dY over each
/// block of k1·k2·... outputs, dY seen as `[.., d, k, ..]` per scaled axis; no axis size
/// is needed but the scaled ones'. Otherwise each axis is a linear map of known size,
/// output = W · input along it, so dX is Wᵀ applied to dY along each such axis (as a
/// weighted gather of the outputs that read each input element).
pub(super) fn resize(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    use edgefreeze_graph::infer::ResizeAxis;
    let mut g = cx.none();
    let dy = cx.dy()?;
    let x = cx.x(0).to_string();
    let shape = cx.shape(&x)?;
    let axes = edgefreeze_graph::infer::resize_axes_of(cx.node, &shape, cx.types).map_err(|e| cx.err(e))?;
    let factors: Option<Vec<usize>> =
        axes.iter().map(|a| if let ResizeAxis::Repeat(k) = a { Some(*k) } else { None }).collect();
    if let Some(factors) = factors {
        g[0] = Some(sum_blocks(cx, &dy, &shape, &factors, Blocks::Inner, "Resize", |a, _| {
            format!("axis {a} is scaled and its size is not known")
        })?);
        return Ok(g);
    }
    let rank = shape.len();
    let mut grad = dy;
    for (a, axis) in axes.iter().enumerate() {
        if *axis == ResizeAxis::Repeat(1) {
            continue;
        }
        let d = shape[a].fixed().ok_or_else(|| cx.err(format!("axis {a} is resized and its size is not known")))?;
        let (output, input, w) =
            axis.matrix(d).ok_or_else(|| cx.err(format!("axis {a} is resized to more elements than it takes")))?;
        // Input element i collects Σ_o W[o, i] · dY[o] over the few outputs o that read it:
        // their indices and weights as `[in, T]` tables (padded with weight 0), dY gathered
        // along the axis by them, weighted, and summed over T. (Not a product by Wᵀ:
        // tract's optimiser miscomputes a product whose operand is a broadcast along the
        // summed axis, as dY is behind a mean over that axis.)
        let readers: Vec<Vec<(usize, f64)>> = (0..input)
            .map(|i| (0..output).filter(|&o| w[o * input + i] != 0.0).map(|o| (o, w[o * input + i])).collect())
            .collect();
        let taps = readers.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut indices = vec![0i64; input * taps];
        let mut weights = vec![0.0; input * taps];
        for (i, list) in readers.iter().enumerate() {
            for (t, &(o, v)) in list.iter().enumerate() {
                indices[i * taps + t] = o as i64;
                weights[i * taps + t] = v;
            }
        }
        let indices = cx.e.constant(
            "resize_readers",
            Tensor::from_i64(vec![input, taps], &indices).map_err(|e| cx.err(e.to_string()))?,
        );
        let mut weight_dims = vec![input, taps];
        weight_dims.extend(std::iter::repeat_n(1, rank - 1 - a));
        let weights = cx.e.floats(weight_dims, &weights);
        let gathered = cx.e.op("Gather", &[&grad, &indices], vec![("axis", Attribute::Int(a as i64))]);
        let weighted = cx.e.mul(&gathered, &weights);
        grad = cx.e.reduce_sum(&weighted, &[a as i64 + 1], false);
    }
    g[0] = Some(grad);
    Ok(g)
}

/// Where each axis's copies lie in dY: a block of k after each element (`Resize`'s
/// nearest neighbours) or k whole copies of the axis one after another (`Tile`).
#[derive(Clone, Copy, PartialEq)]
enum Blocks {
    Inner,
    Outer,
}

/// dY, which holds `factors[a]` copies of each element of x (of `shape`) along each axis
/// `a` as `layout` says, summed over the copies back to x's shape. An axis with copies
/// needs its size known; at most one without may have an unknown size.
fn sum_blocks(
    cx: &mut RuleCx<'_>,
    dy: &str,
    shape: &[Dim],
    factors: &[usize],
    layout: Blocks,
    op: &str,
    unknown_size: impl Fn(usize, usize) -> String,
) -> Result<String> {
    let mut target = Vec::new();
    let mut blocks = Vec::new();
    let mut unknown = 0;
    for (a, (d, &k)) in shape.iter().zip(factors).enumerate() {
        let size = match (d.fixed(), k) {
            (Some(n), _) => n as i64,
            (None, 1) => {
                unknown += 1;
                -1
            }
            (None, k) => return Err(cx.err(unknown_size(a, k))),
        };
        if k > 1 && layout == Blocks::Outer {
            blocks.push(target.len() as i64);
            target.push(k as i64);
        }
        target.push(size);
        if k > 1 && layout == Blocks::Inner {
            blocks.push(target.len() as i64);
            target.push(k as i64);
        }
    }
    if blocks.is_empty() {
        return Ok(dy.to_string());
    }
    if unknown > 1 {
        return Err(cx.err(format!("the gradient of {op} needs at most one axis of unknown size")));
    }
    let grouped = cx.e.reshape(dy, &target);
    Ok(cx.e.reduce_sum(&grouped, &blocks, false))
}

/// `Tile`: an axis of size 1 repeated any number of times (the batch's count may be
/// symbolic) is a broadcast, summed back; another axis, repeated a known r times, is dY
/// seen as `[r, d]` (the copies outermost) and summed over the copies, which needs its size
/// known. At most one axis kept as it is may have an unknown size.
pub(super) fn tile(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    use edgefreeze_graph::infer::SymInt;
    let mut g = cx.none();
    let dy = cx.dy()?;
    let x = cx.x(0).to_string();
    let shape = cx.shape(&x)?;
    let counts = cx.x(1).to_string();
    let repeats: Vec<Option<i64>> = match cx.types.constants.get(&counts).and_then(|t| t.to_i64_vec()) {
        Some(v) => v.into_iter().map(Some).collect(),
        None => match cx.types.symbolic.get(&counts) {
            Some(v) => v.iter().map(|s| if let SymInt::Known(n) = s { Some(*n) } else { None }).collect(),
            None => vec![None; shape.len()],
        },
    };
    let broadcast: Vec<i64> = (0..shape.len())
        .filter(|&a| shape[a] == Dim::Fixed(1) && repeats.get(a).copied().flatten() != Some(1))
        .map(|a| a as i64)
        .collect();
    let summed = if broadcast.is_empty() { dy } else { cx.e.reduce_sum(&dy, &broadcast, true) };
    let mut factors = Vec::with_capacity(shape.len());
    for a in 0..shape.len() {
        match if broadcast.contains(&(a as i64)) { Some(1) } else { repeats.get(a).copied().flatten() } {
            Some(r) => factors.push(r as usize),
            None => return Err(cx.err(format!("axis {a}'s repeat count is not known at load time"))),
        }
    }
    g[0] = Some(sum_blocks(cx, &summed, &shape, &factors, Blocks::Outer, "Tile", |a, r| {
        format!("axis {a} is repeated {r} times and its size is not known")
    })?);
    Ok(g)
}

pub(super) fn pad(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(pad_grad(cx, &dy)?);
    Ok(g)
}

pub(super) fn gather_nd(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let x = cx.x(0).to_string();
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(gather_nd_grad(cx, &x, &dy)?);
    Ok(g)
}

pub(super) fn expand(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let mut g = cx.none();
    let dy = cx.dy()?;
    g[0] = Some(cx.unbroadcast(&dy, 0)?);
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
        let Some(size) = shape[axis].fixed().map(|n| n as i64) else {
            if steps[k] != 1 {
                return Err(cx.err("a strided slice of an axis of unknown size has no gradient rule"));
            }
            grad = pad_unknown_axis(cx, x, &grad, rank, axis, starts[k], ends[k]);
            current[axis] = shape[axis].clone();
            continue;
        };
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

/// Pads `grad`, the gradient of `x[.., start:end, ..]` (step 1) along `axis`, back to x's
/// size there, which shape inference does not know (XCiT's class-attention tokens,
/// MobileViT's patches behind a computed reshape): the pads are computed at run time from
/// x's size, with the bounds clamped as `Slice` clamps them. A slice from a non-negative
/// start to the end needs no size at all.
fn pad_unknown_axis(
    cx: &mut RuleCx<'_>,
    x: &str,
    grad: &str,
    rank: usize,
    axis: usize,
    start: i64,
    end: i64,
) -> String {
    // `end` at or past this is "to the end" (exporters write i64::MAX or INT_MAX).
    const TO_THE_END: i64 = i32::MAX as i64;
    let pads_with = |cx: &mut RuleCx<'_>, begin: &str, end: &str| -> String {
        let before = cx.e.ints(&vec![0; axis]);
        let between = cx.e.ints(&vec![0; rank - 1]);
        let after = cx.e.ints(&vec![0; rank - 1 - axis]);
        let parts = [before.as_str(), begin, between.as_str(), end, after.as_str()];
        let pads = cx.e.op("Concat", &parts, vec![("axis", Attribute::Int(0))]);
        cx.e.op("Pad", &[grad, &pads], vec![])
    };
    if start >= 0 && end >= TO_THE_END {
        let (begin, end) = (cx.e.ints(&[start]), cx.e.ints(&[0]));
        return pads_with(cx, &begin, &end);
    }
    let shape = cx.e.shape_of(x);
    let at = cx.e.ints(&[axis as i64]);
    let size = cx.e.op("Gather", &[&shape, &at], vec![("axis", Attribute::Int(0))]);
    let zero = cx.e.ints(&[0]);
    // A bound as Slice clamps it: a negative one counts from the end, then into [0, size].
    let clamp = |cx: &mut RuleCx<'_>, bound: i64| -> String {
        let b = cx.e.ints(&[bound.min(TO_THE_END)]);
        let from_end = if bound < 0 { cx.e.op("Add", &[&size, &b], vec![]) } else { b };
        let low = cx.e.op("Max", &[&from_end, &zero], vec![]);
        cx.e.op("Min", &[&low, &size], vec![])
    };
    let begin = clamp(cx, start);
    let stop = clamp(cx, end);
    let span = cx.e.op("Sub", &[&stop, &begin], vec![]);
    let len = cx.e.op("Max", &[&span, &zero], vec![]);
    let rest = cx.e.op("Sub", &[&size, &begin], vec![]);
    let end_pad = cx.e.op("Sub", &[&rest, &len], vec![]);
    pads_with(cx, &begin, &end_pad)
}

/// The gradient of a constant-mode `Pad`: dY with the padding cut off (`Slice`), and
/// zeros where negative pads cropped the input.
fn pad_grad(cx: &mut RuleCx<'_>, dy: &str) -> Result<String> {
    let mode = cx.node.attr_string("mode", "constant")?;
    if mode != "constant" {
        return Err(cx.err(format!("the gradient of Pad is implemented for mode \"constant\", not {mode:?}")));
    }
    let rank = cx.shape(cx.x(0))?.len();
    let pads = const_ints(cx, 1)?.ok_or_else(|| cx.err("pads are required"))?;
    let axes: Vec<i64> = match const_ints(cx, 3)? {
        Some(a) => a.iter().map(|&v| if v < 0 { v + rank as i64 } else { v }).collect(),
        None => (0..rank as i64).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.err(format!("pads {pads:?} do not fit {} axes", axes.len())));
    }
    let k = axes.len();
    let (mut starts, mut ends, mut sliced) = (Vec::new(), Vec::new(), Vec::new());
    let mut crops = vec![0i64; 2 * rank];
    for (j, &axis) in axes.iter().enumerate() {
        let (begin, end) = (pads[j], pads[j + k]);
        if begin > 0 || end > 0 {
            starts.push(begin.max(0));
            ends.push(if end > 0 { -end } else { i64::MAX });
            sliced.push(axis);
        }
        crops[axis as usize] = (-begin).max(0);
        crops[axis as usize + rank] = (-end).max(0);
    }
    let mut grad = dy.to_string();
    if !sliced.is_empty() {
        let (s, e, a) = (cx.e.ints(&starts), cx.e.ints(&ends), cx.e.ints(&sliced));
        grad = cx.e.op("Slice", &[&grad, &s, &e, &a], vec![]);
    }
    if crops.iter().any(|&c| c > 0) {
        let crops = cx.e.ints(&crops);
        grad = cx.e.op("Pad", &[&grad, &crops], vec![]);
    }
    Ok(grad)
}

/// Zeros of `like`'s shape with its axes permuted by `perm`: a constant shape where every
/// dimension is known; otherwise each dimension from the first source that has it — a
/// known size, the same-sized axis of `dy` (`dy_axes[a]`, the gradient's own shape), and
/// only then `Shape(like)`. Reading a symbolic batch off `dy` rather than off `like`
/// keeps the forward value `like` from staying alive until the backward pass for its
/// shape alone.
fn zeros_shaped(
    cx: &mut RuleCx<'_>,
    like: &str,
    perm: &[usize],
    dy: &str,
    dy_axes: &[Option<usize>],
) -> Result<String> {
    let shape = cx.shape(like)?;
    // A symbolic size dY has too (the batch, by name, on any of its axes: dY is shaped like
    // the forward output) is read off dY rather than `like`, which would keep `like` alive
    // until the backward runs for its shape alone.
    let out_shape = cx.shape(cx.y(0)).unwrap_or_default();
    let dy_axes: Vec<Option<usize>> = (0..shape.len())
        .map(|a| {
            dy_axes.get(a).copied().flatten().or_else(|| match &shape[a] {
                d @ Dim::Symbol(_) => out_shape.iter().position(|o| o == d),
                _ => None,
            })
        })
        .collect();
    let size = match shape.iter().map(|d| d.fixed()).collect::<Option<Vec<usize>>>() {
        Some(dims) => cx.e.ints(&perm.iter().map(|&a| dims[a] as i64).collect::<Vec<_>>()),
        None => {
            let (mut of_dy, mut of_like) = (None, None);
            let mut parts = Vec::new();
            for &a in perm {
                let part = match (shape[a].fixed(), dy_axes.get(a).copied().flatten()) {
                    (Some(n), _) => cx.e.ints(&[n as i64]),
                    (None, Some(b)) => {
                        let full = of_dy.get_or_insert_with(|| cx.e.shape_of(dy)).clone();
                        let at = cx.e.ints(&[b as i64]);
                        cx.e.op("Gather", &[&full, &at], vec![("axis", Attribute::Int(0))])
                    }
                    (None, None) => {
                        let full = of_like.get_or_insert_with(|| cx.e.shape_of(like)).clone();
                        let at = cx.e.ints(&[a as i64]);
                        cx.e.op("Gather", &[&full, &at], vec![("axis", Attribute::Int(0))])
                    }
                };
                parts.push(part);
            }
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            cx.e.op("Concat", &refs, vec![("axis", Attribute::Int(0))])
        }
    };
    let zero = edgefreeze_graph::Tensor::from_f64_as(cx.e.float, vec![1], &[0.0])?;
    Ok(cx.e.op("ConstantOfShape", &[&size], vec![("value", Attribute::Tensor(zero))]))
}

/// The gradient of `Gather` along any axis: the slices of dY added into zeros at their
/// indices (`ScatterND` with `reduction="add"`, opset 16 on, so repeated indices add up).
/// ScatterND indexes the leading axis, so the gathered axis is moved to the front of the
/// zeros and the index axes to the front of dY, and moved back after. Only the sizes the
/// graph's shape inference knows are used as constants; a symbolic batch stays symbolic.
/// Before opset 16 ScatterND cannot add: embedding lookups (axis 0, known sizes) use
/// one-hot rows times dY.
fn gather_grad(cx: &mut RuleCx<'_>, data: &str, dy: &str) -> Result<String> {
    let shape = cx.shape(data)?;
    let rank = shape.len();
    let axis = cx.node.attr_int("axis", 0)?;
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    if !(0..rank as i64).contains(&axis) {
        return Err(cx.err(format!("axis {axis} is out of range for rank {rank}")));
    }
    let axis = axis as usize;
    if cx.e.opset < 16 {
        return gather_grad_one_hot(cx, data, dy, axis);
    }
    let indices = cx.x(1).to_string();
    let q = cx.shape(&indices)?.len();
    let index_type = cx.types.types.get(&indices).and_then(|t| t.dtype).unwrap_or(DataType::Int64);
    let idx = if index_type == DataType::Int64 { indices } else { cx.e.cast(&indices, DataType::Int64) };
    // Negative indices count from the end of the axis.
    let n = match shape[axis].fixed() {
        Some(n) => cx.e.int_scalar(n as i64),
        None => {
            let full = cx.e.shape_of(data);
            let at = cx.e.int_scalar(axis as i64);
            cx.e.op("Gather", &[&full, &at], vec![("axis", Attribute::Int(0))])
        }
    };
    let zero = cx.e.int_scalar(0);
    let negative = cx.e.op("Less", &[&idx, &zero], vec![]);
    let wrapped = cx.e.add(&idx, &n);
    let idx = cx.e.op("Where", &[&negative, &wrapped, &idx], vec![]);
    let positions = cx.e.unsqueeze(&idx, &[q as i64]);
    // zeros as [axis, the other axes in order]; dY as [index axes, the other axes].
    let front: Vec<usize> = std::iter::once(axis).chain((0..rank).filter(|&a| a != axis)).collect();
    // dY is [data's axes before `axis`, the index axes, data's axes after it].
    let dy_axes: Vec<Option<usize>> = (0..rank)
        .map(|a| {
            if a < axis {
                Some(a)
            } else if a > axis {
                Some(a - 1 + q)
            } else {
                None
            }
        })
        .collect();
    let zeros = zeros_shaped(cx, data, &front, dy, &dy_axes)?;
    let updates = index_axes_first(cx, dy, axis, q, rank);
    let grad =
        cx.e.op("ScatterND", &[&zeros, &positions, &updates], vec![("reduction", Attribute::String(b"add".to_vec()))]);
    Ok(gathered_axis_back(cx, &grad, axis, rank))
}

/// A Gather's dY, `[data's axes before axis, the q index axes, data's axes after it]`,
/// with the index axes moved to the front.
fn index_axes_first(cx: &mut RuleCx<'_>, dy: &str, axis: usize, q: usize, rank: usize) -> String {
    let front: Vec<i64> = (axis..axis + q).chain(0..axis).chain(axis + q..rank - 1 + q).map(|a| a as i64).collect();
    if front.iter().enumerate().all(|(i, &a)| i as i64 == a) { dy.to_string() } else { cx.e.transpose(dy, &front) }
}

/// A gradient computed with the gathered axis first, with that axis put back at `axis`.
fn gathered_axis_back(cx: &mut RuleCx<'_>, grad: &str, axis: usize, rank: usize) -> String {
    if axis == 0 {
        return grad.to_string();
    }
    let back: Vec<i64> = (0..rank).map(|a| if a < axis { a + 1 } else if a == axis { 0 } else { a } as i64).collect();
    cx.e.transpose(grad, &back)
}

/// Before opset 16 (no adding scatter): the gradient of a lookup as one-hot rows times the
/// output gradient, with the gathered axis brought to the front and back (ViT's class
/// token, `x[:, 0]`, gathers along axis 1). The gathered axis must have a known size, and
/// where another axis is unknown (the batch; Swin's windows times the batch, a product no
/// dimension names) so must the index count: those sizes are then read at run time.
fn gather_grad_one_hot(cx: &mut RuleCx<'_>, data: &str, dy: &str, axis: usize) -> Result<String> {
    let shape = cx.shape(data)?;
    let rank = shape.len();
    let rows =
        shape[axis].fixed().ok_or_else(|| cx.err(format!("the gathered axis of {data:?} needs a known size")))? as i64;
    let indices = cx.x(1).to_string();
    let q = cx.shape(&indices)?.len();
    // The data's other axes, in order: the rows' width.
    let others: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    let trailing: Option<Vec<usize>> = others.iter().map(|&a| shape[a].fixed()).collect();
    // dY is [data's axes before `axis`, the index axes, data's axes after it]: the index
    // axes first, then as [lookups, the rest], the rest's size where it is known (the
    // lookups may count the batch), else the lookups'.
    let dy = index_axes_first(cx, dy, axis, q, rank);
    let rows_of_dy = match &trailing {
        Some(t) => [-1, t.iter().product::<usize>() as i64],
        None => [cx.fixed_shape(&indices)?.iter().product::<usize>() as i64, -1],
    };
    let flat = cx.e.reshape(&indices, &[-1]);
    let index_type = cx.types.types.get(&indices).and_then(|t| t.dtype).unwrap_or(DataType::Int64);
    let flat = if index_type == DataType::Int64 { flat } else { cx.e.cast(&flat, DataType::Int64) };
    // Negative indices count from the end.
    let zero = cx.e.int_scalar(0);
    let n = cx.e.int_scalar(rows);
    let negative = cx.e.op("Less", &[&flat, &zero], vec![]);
    let wrapped = cx.e.add(&flat, &n);
    let flat = cx.e.op("Where", &[&negative, &wrapped, &flat], vec![]);
    let dy2 = cx.e.reshape(&dy, &rows_of_dy);
    let one = cx.e.int_scalar(1);
    let range = cx.e.op("Range", &[&zero, &n, &one], vec![]);
    let column = cx.e.unsqueeze(&flat, &[1]);
    let hit = cx.e.op("Equal", &[&column, &range], vec![]);
    let float = cx.e.float;
    let onehot = cx.e.cast(&hit, float);
    // [rows, the other axes' elements], then [rows, the other axes].
    let grad = cx.e.op("Gemm", &[&onehot, &dy2], vec![("transA", Attribute::Int(1))]);
    let grad = match trailing {
        Some(_) if rank == 2 && axis == 0 => grad,
        Some(trailing) => {
            let target: Vec<i64> = std::iter::once(rows).chain(trailing.iter().map(|&d| d as i64)).collect();
            cx.e.reshape(&grad, &target)
        }
        None => {
            let full = cx.e.shape_of(data);
            let front: Vec<i64> = std::iter::once(axis).chain(others.iter().copied()).map(|a| a as i64).collect();
            let front = cx.e.ints(&front);
            let target = cx.e.op("Gather", &[&full, &front], vec![("axis", Attribute::Int(0))]);
            cx.e.op("Reshape", &[&grad, &target], vec![])
        }
    };
    Ok(gathered_axis_back(cx, &grad, axis, rank))
}

/// The gradient of `GatherND` (`batch_dims` 0): dY added into zeros at the gathered index
/// tuples, which is `ScatterND` with `reduction="add"` on the same indices.
fn gather_nd_grad(cx: &mut RuleCx<'_>, data: &str, dy: &str) -> Result<String> {
    if cx.node.attr_int("batch_dims", 0)? != 0 {
        return Err(cx.err("the gradient of GatherND is implemented for batch_dims = 0"));
    }
    if cx.e.opset < 16 {
        return Err(cx.err("the gradient of GatherND needs opset 16 or later (ScatterND with reduction)"));
    }
    let indices = cx.x(1).to_string();
    if let Some(t) = cx.types.constants.get(&indices)
        && t.to_i64_vec().is_some_and(|v| v.iter().any(|&i| i < 0))
    {
        return Err(cx.err("the gradient of GatherND is implemented for non-negative indices"));
    }
    let rank = cx.shape(data)?.len();
    // dY is [the index axes but the last, data's axes from the tuple length r on].
    let index_shape = cx.shape(&indices)?;
    let dy_axes: Vec<Option<usize>> = match index_shape.last().and_then(|d| d.fixed()) {
        Some(r) => (0..rank).map(|a| (a >= r).then(|| index_shape.len() - 1 + a - r)).collect(),
        None => vec![None; rank],
    };
    let zeros = zeros_shaped(cx, data, &(0..rank).collect::<Vec<_>>(), dy, &dy_axes)?;
    Ok(cx.e.op("ScatterND", &[&zeros, &indices, dy], vec![("reduction", Attribute::String(b"add".to_vec()))]))
}
