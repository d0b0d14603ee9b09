//! Gradient rules of matrix products.

use super::{InputGrads, RuleCx};
use crate::error::Result;
use edgefreeze_graph::ir::{Attribute, Dim};

fn gemm_node(cx: &mut RuleCx<'_>, a: &str, b: &str, trans_a: bool, trans_b: bool, alpha: f32) -> String {
    let mut attrs = vec![("transA", Attribute::Int(trans_a as i64)), ("transB", Attribute::Int(trans_b as i64))];
    if alpha != 1.0 {
        attrs.push(("alpha", Attribute::Float(alpha)));
    }
    cx.e.op("Gemm", &[a, b], attrs)
}

/// Y = α·A'·B' + β·C with A' = Aᵀ if transA, B' = Bᵀ if transB.
pub(super) fn gemm(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let n = cx.node;
    let (ta, tb) = (n.attr_int("transA", 0)? != 0, n.attr_int("transB", 0)? != 0);
    let (alpha, beta) = (n.attr_float("alpha", 1.0)?, n.attr_float("beta", 1.0)?);
    let (a, b) = (cx.x(0).to_string(), cx.x(1).to_string());
    let mut g = cx.none();
    if cx.need(0) {
        // dA' = α·dY·B'ᵀ; dA = dA' or its transpose.
        g[0] =
            Some(if ta { gemm_node(cx, &b, &dy, tb, true, alpha) } else { gemm_node(cx, &dy, &b, false, !tb, alpha) });
    }
    if cx.need(1) {
        // dB' = α·A'ᵀ·dY; dB = dB' or its transpose.
        g[1] =
            Some(if tb { gemm_node(cx, &dy, &a, true, ta, alpha) } else { gemm_node(cx, &a, &dy, !ta, false, alpha) });
    }
    if cx.need(2) {
        let scaled = if beta != 1.0 { cx.e.scale(&dy, beta as f64) } else { dy.clone() };
        g[2] = Some(cx.unbroadcast(&scaled, 2)?);
    }
    Ok(g)
}

fn swap_last_two(cx: &mut RuleCx<'_>, x: &str, rank: usize) -> String {
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    perm.swap(rank - 2, rank - 1);
    cx.e.transpose(x, &perm)
}

/// Batched, broadcasting Y = A·B over the last two axes.
pub(super) fn matmul(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let (a, b) = (cx.x(0).to_string(), cx.x(1).to_string());
    let (sa, sb, sy) = (cx.shape(&a)?, cx.shape(&b)?, cx.shape(cx.y(0))?);
    if sa.len() < 2 || sb.len() < 2 {
        return Err(cx.err("the gradient of MatMul needs inputs of rank 2 or more"));
    }
    let mut g = cx.none();
    if cx.need(0) {
        let bt = swap_last_two(cx, &b, sb.len());
        let d = cx.e.op("MatMul", &[&dy, &bt], vec![]);
        let mut from = sy[..sy.len() - 2].to_vec();
        from.extend_from_slice(&sa[sa.len() - 2..]);
        g[0] = Some(cx.unbroadcast_to(&d, &from, &sa)?);
    }
    if cx.need(1) {
        if sb.len() == 2 && sa.len() > 2 {
            // A weight shared across the batch: one GEMM over all rows instead of a batched product and a sum.
            // The weight's shape gives both where inference lost A's or Y's last size.
            let k = sa[sa.len() - 1]
                .fixed()
                .or(sb[0].fixed())
                .ok_or_else(|| cx.err("the inner dimension must be known"))?;
            let nn =
                sy[sy.len() - 1].fixed().or(sb[1].fixed()).ok_or_else(|| cx.err("the output width must be known"))?;
            let a2 = cx.e.reshape(&a, &[-1, k as i64]);
            let d2 = cx.e.reshape(&dy, &[-1, nn as i64]);
            g[1] = Some(gemm_node(cx, &a2, &d2, true, false, 1.0));
        } else {
            let at = swap_last_two(cx, &a, sa.len());
            let d = cx.e.op("MatMul", &[&at, &dy], vec![]);
            let mut from: Vec<Dim> = sy[..sy.len() - 2].to_vec();
            from.extend_from_slice(&sb[sb.len() - 2..]);
            g[1] = Some(cx.unbroadcast_to(&d, &from, &sb)?);
        }
    }
    Ok(g)
}
