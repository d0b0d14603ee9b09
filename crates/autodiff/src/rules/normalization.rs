//! Gradient rules of softmax-like ops and reductions. (BatchNormalization and
//! LayerNormalization are spelled out in primitive ops for training, see
//! [`crate::training_mode`], so their gradients come from these rules and the
//! element-wise ones.)

use super::{InputGrads, RuleCx};
use crate::error::Result;
use edgefreeze_graph::ir::Attribute;

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
    reduce(cx, 13, false)
}

/// `ReduceMean` takes its axes as an input from opset 18.
pub(super) fn reduce_mean(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    reduce(cx, 18, true)
}

fn reduce(cx: &mut RuleCx<'_>, since: i64, mean: bool) -> Result<InputGrads> {
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
    let scaled = if mean {
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
    g[0] = Some(cx.e.expand_like(&scaled, &x));
    Ok(g)
}
