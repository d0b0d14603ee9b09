//! Gradient rules of softmax-like ops and reductions, and the training-mode
//! normalisations' backward. (BatchNormalization and LayerNormalization are spelled out
//! in primitive ops for training, see [`crate::training_mode`]; their gradients come from
//! [`batch_norm_training`] and [`layer_norm_training`], which the reverse pass runs for
//! the whole group.)

use super::{InputGrads, RuleCx};
use crate::emit::Emitter;
use crate::error::Result;
use crate::grad::{BatchNormSaved, LayerNormSaved};
use edgefreeze_graph::ir::Attribute;

/// The gradients of a training-mode BatchNormalization's (x, scale, bias) from dY, in the
/// textbook two-reduction form: with x̂ the normalised input, σ = √(var + eps) and m the
/// element count per channel (batch × spatial, known only at run time),
///
/// dβ = Σ dY, dγ = Σ dY·x̂ and dx = (γ/σ)·(dY − dβ/m − x̂·dγ/m),
///
/// the batch statistics' gradients folded into the two sums. dx is four element-wise
/// passes (dY·k, x̂·c₂, and two subtractions, with k = γ/σ, c₂ = k·dγ/m, c₃ = k·dβ/m per
/// channel) where the chain of the spelled-out forward's rules takes about a dozen.
pub fn batch_norm_training(e: &mut Emitter, bn: &BatchNormSaved, dy: &str, needs: [bool; 3]) -> [Option<String>; 3] {
    let [need_x, need_scale, need_bias] = needs;
    let sum_dy = (need_x || need_bias).then(|| e.reduce_sum(dy, &bn.axes, true));
    let sum_dyx = (need_x || need_scale).then(|| {
        let dyx = e.mul(dy, &bn.normalized);
        e.reduce_sum(&dyx, &bn.axes, true)
    });
    let mut g = [None, None, None];
    if let (true, Some(s)) = (need_scale, &sum_dyx) {
        g[1] = Some(e.reshape(s, &[-1]));
    }
    if let (true, Some(s)) = (need_bias, &sum_dy) {
        g[2] = Some(e.reshape(s, &[-1]));
    }
    if let (true, Some(sum_dy), Some(sum_dyx)) = (need_x, &sum_dy, &sum_dyx) {
        let k = e.div(&bn.scale_b, &bn.std);
        // m = |x| / C, as a float scalar of the run-time batch. The count is read off x̂,
        // which the backward keeps anyway: a `Size` of x itself would keep the layer's
        // input alive through the forward pass for its shape only.
        let (total, channels) = (e.numel(&bn.normalized), e.numel(sum_dy));
        let m = e.div(&total, &channels);
        let k_m = e.div(&k, &m);
        let c2 = e.mul(sum_dyx, &k_m);
        let c3 = e.mul(sum_dy, &k_m);
        let scaled = e.mul(dy, &k);
        let correction = e.mul(&bn.normalized, &c2);
        let centered = e.sub(&scaled, &correction);
        g[0] = Some(e.sub(&centered, &c3));
    }
    g
}

/// The gradients of a LayerNormalization's (x, scale[, bias]) from dY, the same two
/// reductions as [`batch_norm_training`] but over the normalised (last) axes, where the
/// scale varies: with g = dY·γ, x̂ and σ from the forward and m the elements per group,
///
/// dx = (g − Σg/m − x̂·Σ(g·x̂)/m) / σ, dγ = Σ_leading dY·x̂, dβ = Σ_leading dY.
///
/// It reads x̂ and σ only; the chain of the spelled-out forward's rules (Sub, Div, the
/// variance's Mul and ReduceMean) also kept x − mean alive until the backward.
pub fn layer_norm_training(e: &mut Emitter, ln: &LayerNormSaved, dy: &str, needs: &[bool]) -> Vec<Option<String>> {
    let need = |i: usize| needs.get(i).copied().unwrap_or(false);
    let mut g = vec![None; needs.len()];
    if need(1) {
        let dyx = e.mul(dy, &ln.normalized);
        g[1] = Some(e.reduce_sum(&dyx, &ln.leading, false));
    }
    if need(2) {
        g[2] = Some(e.reduce_sum(dy, &ln.leading, false));
    }
    if need(0) {
        let scaled = e.mul(dy, &ln.scale);
        let sum = e.reduce_sum(&scaled, &ln.axes, true);
        let along = e.mul(&scaled, &ln.normalized);
        let sum_along = e.reduce_sum(&along, &ln.axes, true);
        // m = |x̂| / |σ|, at run time: the batch is symbolic.
        let (total, groups) = (e.numel(&ln.normalized), e.numel(&ln.std));
        let m = e.div(&total, &groups);
        let mean = e.div(&sum, &m);
        let mean_along = e.div(&sum_along, &m);
        let centered = e.sub(&scaled, &mean);
        let correction = e.mul(&ln.normalized, &mean_along);
        let numerator = e.sub(&centered, &correction);
        g[0] = Some(e.div(&numerator, &ln.std));
    }
    g
}

pub(super) fn softmax(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let y = cx.y(0).to_string();
    let mut g = cx.none();
    let axis = cx.node.attr_int("axis", -1)?;
    let prod = cx.e.mul(&dy, &y);
    let axes = cx.e.ints(&[axis]);
    let sum = cx.e.op("ReduceSum", &[&prod, &axes], vec![("keepdims", Attribute::Int(1))]);
    let centered = cx.e.sub(&dy, &sum);
    g[0] = Some(cx.e.mul(&y, &centered));
    Ok(g)
}

pub(super) fn log_softmax(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let y = cx.y(0).to_string();
    let mut g = cx.none();
    let axis = cx.node.attr_int("axis", -1)?;
    let axes = cx.e.ints(&[axis]);
    let sum = cx.e.op("ReduceSum", &[&dy, &axes], vec![("keepdims", Attribute::Int(1))]);
    let probs = cx.e.op("Exp", &[&y], vec![]);
    let t = cx.e.mul(&probs, &sum);
    g[0] = Some(cx.e.sub(&dy, &t));
    Ok(g)
}

/// `ReduceSum` takes its axes as an input from opset 13.
pub(super) fn reduce_sum(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    reduce(cx, 13, Reduction::Sum)
}

/// `ReduceMean` takes its axes as an input from opset 18.
pub(super) fn reduce_mean(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    reduce(cx, 18, Reduction::Mean)
}

/// `ReduceL2` (`F.normalize`'s norm, from opset 18 with its axes as an input).
pub(super) fn reduce_l2(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    reduce(cx, 18, Reduction::L2)
}

/// What a reduction computes, for its gradient.
#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    Sum,
    Mean,
    /// √Σx²: dX = X · dY / Y, and 0 where Y = 0 (where X is all zeros), as PyTorch's norm.
    L2,
}

fn reduce(cx: &mut RuleCx<'_>, since: i64, kind: Reduction) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let (x, y) = (cx.x(0).to_string(), cx.y(0).to_string());
    let mut g = cx.none();
    let rank = cx.shape(&x)?.len();
    let given: Option<Vec<i64>> = if cx.e.opset >= since {
        match cx.node.input(1) {
            Some(name) => Some(
                cx.types
                    .constants
                    .get(name)
                    .and_then(|t| t.to_i64_vec())
                    .ok_or_else(|| cx.err("the axes must be a constant"))?,
            ),
            None => None,
        }
    } else {
        cx.node.attr_ints("axes")?.map(|a| a.to_vec())
    };
    let axes: Vec<i64> = match given {
        Some(a) if !a.is_empty() => {
            let mut a: Vec<i64> = a.iter().map(|&v| if v < 0 { v + rank as i64 } else { v }).collect();
            a.sort_unstable();
            a
        }
        _ if cx.node.attr_int("noop_with_empty_axes", 0)? != 0 => {
            g[0] = Some(dy);
            return Ok(g);
        }
        _ => (0..rank as i64).collect(),
    };
    let keep = cx.node.attr_int("keepdims", 1)? != 0;
    let restored = if keep || axes.len() == rank { dy.clone() } else { cx.e.unsqueeze(&dy, &axes) };
    if kind == Reduction::L2 {
        let y_kept = if keep || axes.len() == rank { y.clone() } else { cx.e.unsqueeze(&y, &axes) };
        let ratio = cx.e.div(&restored, &y_kept);
        let zero = cx.e.scalar(0.0);
        let at_zero = cx.e.op("Equal", &[&y_kept, &zero], vec![]);
        let ratio = cx.e.op("Where", &[&at_zero, &zero, &ratio], vec![]);
        g[0] = Some(cx.e.mul(&x, &ratio));
        return Ok(g);
    }
    let scaled = if kind == Reduction::Mean {
        let shape = cx.shape(&x)?;
        let count: Option<usize> = axes.iter().map(|&a| shape[a as usize].fixed()).product();
        match count {
            Some(n) => cx.e.divide(&restored, n as f64),
            None => {
                let total = cx.e.numel(&x);
                let kept = cx.e.numel(&y);
                let n = cx.e.div(&total, &kept);
                cx.e.div(&restored, &n)
            }
        }
    } else {
        restored
    };
    g[0] = Some(cx.expand_over(&scaled, &x, &axes)?);
    Ok(g)
}
