//! Gradient rules of matrix products.

use super::{InputGrads, RuleCx};
use crate::error::Result;
use edgefreeze_graph::einsum::{Equation, Label, term_text};
use edgefreeze_graph::ir::{Attribute, Dim, Shape};

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

/// Y = einsum(X_0, …, X_{n−1}). The gradient of operand i is the Einsum of the other operands
/// and dY with operand i's subscripts as its output: each element of X_i multiplies the
/// product of the others at every point of the index space where it appears. Subscripts of
/// X_i that appear nowhere else were summed over X_i alone, so dY does not depend on them:
/// the gradient is constant along those axes (Unsqueeze, Expand). Where X_i's ellipsis
/// covers fewer or size-1 dimensions than the broadcast ellipsis, the gradient is summed
/// back to X_i's shape. A repeated subscript within X_i (a diagonal) is not supported.
pub(super) fn einsum(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let equation = Equation::of_node(cx.node)?;
    let dy = cx.dy()?;
    let n = cx.node.inputs.len();
    let names: Vec<String> = (0..n).map(|i| cx.x(i).to_string()).collect();
    let shapes = names.iter().map(|x| cx.shape(x)).collect::<Result<Vec<Shape>>>()?;
    let refs: Vec<&[Dim]> = shapes.iter().map(Vec::as_slice).collect();
    let bound = equation.bind(&refs).map_err(|e| cx.err(format!("equation {equation}: {e}")))?;
    let mut g = cx.none();
    let needed: Vec<usize> = (0..n).filter(|&i| cx.need(i)).collect();
    for i in needed {
        let term = &equation.inputs[i];
        if let Some(l) = term.iter().enumerate().find_map(|(k, l)| term[..k].contains(l).then_some(*l)) {
            return Err(cx.err(format!(
                "the gradient of Einsum is not implemented for a repeated subscript within one operand \
                 (a diagonal): {} in input {i}'s term {}",
                term_text(&[l]),
                term_text(term)
            )));
        }
        let elsewhere = |l: &Label| {
            equation.output.contains(l) || equation.inputs.iter().enumerate().any(|(j, t)| j != i && t.contains(l))
        };
        let kept: Vec<Label> = term.iter().copied().filter(elsewhere).collect();
        let mut terms: Vec<String> = Vec::with_capacity(n);
        let mut operands: Vec<&str> = Vec::with_capacity(n);
        for (j, t) in equation.inputs.iter().enumerate().filter(|(j, _)| *j != i) {
            terms.push(term_text(t));
            operands.push(&names[j]);
        }
        terms.push(term_text(&equation.output));
        operands.push(&dy);
        // An operand without an ellipsis where the others have one: its gradient sums over the
        // ellipsis's dimensions, which an Einsum output cannot leave out (ONNX requires an
        // ellipsis of the inputs in the output), so they are kept in front and summed after.
        let width = bound.ellipsis.len();
        let summed_ellipsis = equation.has_ellipsis() && !term.contains(&Label::Ellipsis);
        let out: Vec<Label> =
            summed_ellipsis.then_some(Label::Ellipsis).into_iter().chain(kept.iter().copied()).collect();
        let text = format!("{}->{}", terms.join(","), term_text(&out));
        let mut grad = cx.e.op("Einsum", &operands, vec![("equation", Attribute::String(text.into_bytes()))]);
        if summed_ellipsis {
            grad = cx.e.reduce_sum(&grad, &(0..width as i64).collect::<Vec<_>>(), false);
        }
        // The gradient's layout: X_i's term with the ellipsis at its broadcast width.
        let full = Equation::dims_of(term, &bound);
        let mut position = Vec::with_capacity(term.len());
        let mut at = 0;
        for l in term {
            position.push(at);
            at += if *l == Label::Ellipsis { width } else { 1 };
        }
        if kept.len() < term.len() {
            let dropped: Vec<usize> = (0..term.len()).filter(|&k| !elsewhere(&term[k])).collect();
            let axes: Vec<i64> = dropped.iter().map(|&k| position[k] as i64).collect();
            grad = cx.e.unsqueeze(&grad, &axes);
            let mut target: Vec<Option<i64>> = vec![Some(1); full.len()];
            for &k in &dropped {
                target[position[k]] = full[position[k]].fixed().map(|d| d as i64);
            }
            let size = if target.iter().all(Option::is_some) {
                cx.e.ints(&target.iter().map(|d| d.expect("checked")).collect::<Vec<_>>())
            } else {
                // A symbolic size of a summed-away subscript: from X_i's run-time shape.
                let x_shape = cx.e.shape_of(&names[i]);
                let x_width = shapes[i].len() + 1 - term.len();
                let mut parts = Vec::with_capacity(full.len());
                for (p, d) in target.iter().enumerate() {
                    parts.push(match d {
                        Some(v) => cx.e.ints(&[*v]),
                        None => {
                            let k = position.iter().position(|&q| q == p).expect("a dropped letter's axis");
                            let x_axis = term[..k]
                                .iter()
                                .map(|l| if *l == Label::Ellipsis { x_width } else { 1 })
                                .sum::<usize>();
                            let index = cx.e.ints(&[x_axis as i64]);
                            cx.e.op("Gather", &[&x_shape, &index], vec![("axis", Attribute::Int(0))])
                        }
                    });
                }
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                cx.e.op("Concat", &refs, vec![("axis", Attribute::Int(0))])
            };
            grad = cx.e.op("Expand", &[&grad, &size], vec![]);
        }
        if let Some(k) = term.iter().position(|l| *l == Label::Ellipsis) {
            grad = sum_to_own_ellipsis(cx, &grad, position[k], &bound.ellipsis, &shapes[i], term.len() - 1)?;
        }
        g[i] = Some(grad);
    }
    Ok(g)
}

/// Sums an Einsum operand's gradient, laid out with the broadcast ellipsis dimensions
/// `wide` from axis `start`, down to the operand's own (right-aligned, possibly fewer or
/// size-1) ellipsis dimensions; `letters` is how many axes the operand's letters name.
fn sum_to_own_ellipsis(
    cx: &mut RuleCx<'_>,
    grad: &str,
    start: usize,
    wide: &[Dim],
    own_shape: &[Dim],
    letters: usize,
) -> Result<String> {
    let own = &own_shape[start..start + own_shape.len() - letters];
    let extra = wide.len() - own.len();
    let inner: Vec<i64> = (0..own.len())
        .filter(|&k| own[k] == Dim::Fixed(1) && wide[extra + k] != Dim::Fixed(1))
        .map(|k| (start + extra + k) as i64)
        .collect();
    let leading: Vec<i64> = (start..start + extra).map(|a| a as i64).collect();
    let g = cx.e.reduce_sum(grad, &inner, true);
    Ok(cx.e.reduce_sum(&g, &leading, false))
}
