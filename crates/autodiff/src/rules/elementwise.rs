//! Gradient rules of element-wise ops (with broadcasting).

use super::{InputGrads, RuleCx};
use crate::error::Result;

pub(super) fn add(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    add_sub(cx, false)
}

pub(super) fn sub(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    add_sub(cx, true)
}

fn add_sub(cx: &mut RuleCx<'_>, negate_second: bool) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    if cx.need(0) {
        g[0] = Some(cx.unbroadcast(&dy, 0)?);
    }
    if cx.need(1) {
        let d = if negate_second { cx.e.neg(&dy) } else { dy.clone() };
        g[1] = Some(cx.unbroadcast(&d, 1)?);
    }
    Ok(g)
}

pub(super) fn mul(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let b = cx.x(1).to_string();
    if cx.need(0) {
        let d = cx.e.mul(&dy, &b);
        g[0] = Some(cx.unbroadcast(&d, 0)?);
    }
    if cx.need(1) {
        let d = cx.e.mul(&dy, &x);
        g[1] = Some(cx.unbroadcast(&d, 1)?);
    }
    Ok(g)
}

pub(super) fn div(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let b = cx.x(1).to_string();
    let q = cx.e.div(&dy, &b);
    if cx.need(0) {
        g[0] = Some(cx.unbroadcast(&q, 0)?);
    }
    if cx.need(1) {
        // d(a/b)/db = -(a/b)/b: reuse the forward quotient.
        let t = cx.e.mul(&q, &y);
        let d = cx.e.neg(&t);
        g[1] = Some(cx.unbroadcast(&d, 1)?);
    }
    Ok(g)
}

pub(super) fn pow(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let y = cx.y(0).to_string();
    let b = cx.x(1).to_string();
    if cx.need(0) {
        let one = cx.e.scalar(1.0);
        let bm1 = cx.e.sub(&b, &one);
        let p = cx.e.op("Pow", &[&x, &bm1], vec![]);
        let t = cx.e.mul(&p, &b);
        let d = cx.e.mul(&dy, &t);
        g[0] = Some(cx.unbroadcast(&d, 0)?);
    }
    if cx.need(1) {
        let ln = cx.e.op("Log", &[&x], vec![]);
        let t = cx.e.mul(&y, &ln);
        let d = cx.e.mul(&dy, &t);
        g[1] = Some(cx.unbroadcast(&d, 1)?);
    }
    Ok(g)
}

pub(super) fn sqrt(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let t = cx.e.div(&dy, &y);
    g[0] = Some(cx.e.scale(&t, 0.5));
    Ok(g)
}

/// dX = dY where the output is positive. The mask is read off the output, not the
/// input (y > 0 exactly where x > 0): the output is usually kept anyway, as the next
/// layer's input, while the input (a BatchNorm's or a convolution's output) then need
/// not outlive the forward pass.
pub(super) fn relu(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let zero = cx.e.scalar(0.0);
    let inside = cx.e.op("Greater", &[&y, &zero], vec![]);
    g[0] = Some(pass_where(cx, &dy, &inside));
    Ok(g)
}

/// dY where `mask` holds, 0 elsewhere, as dY · Cast(mask): ONNX Runtime runs the
/// comparison, the cast and the product in 0.7 of the time of a `Where` with a broadcast
/// zero (its `Where` is the slow one; a `Sign` of the output, exact for ReLU too, takes
/// 1.6x), and tract fuses the whole mask into one pass (`edgefreeze_engine::tract_lower`).
/// They differ from `Where` only where dY is infinite or NaN at a masked position
/// (0·∞ is NaN): a step that diverged either way.
fn pass_where(cx: &mut RuleCx<'_>, dy: &str, mask: &str) -> String {
    let float = cx.e.float;
    let mask = cx.e.cast(mask, float);
    cx.e.mul(dy, &mask)
}

pub(super) fn leaky_relu(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let alpha = cx.node.attr_float("alpha", 0.01)? as f64;
    // With a positive slope y > 0 exactly where x > 0, so the mask reads the output
    // (kept anyway as the next layer's input, see `relu`); otherwise the input.
    let masked = if alpha > 0.0 { cx.y(0) } else { cx.x(0) }.to_string();
    let zero = cx.e.scalar(0.0);
    let pos = cx.e.op("Greater", &[&masked, &zero], vec![]);
    let scaled = cx.e.scale(&dy, alpha);
    g[0] = Some(cx.e.op("Where", &[&pos, &dy, &scaled], vec![]));
    Ok(g)
}

pub(super) fn sigmoid(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let one = cx.e.scalar(1.0);
    let omy = cx.e.sub(&one, &y);
    let t = cx.e.mul(&y, &omy);
    g[0] = Some(cx.e.mul(&dy, &t));
    Ok(g)
}

pub(super) fn tanh(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let one = cx.e.scalar(1.0);
    let y2 = cx.e.mul(&y, &y);
    let t = cx.e.sub(&one, &y2);
    g[0] = Some(cx.e.mul(&dy, &t));
    Ok(g)
}

pub(super) fn erf(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let x2 = cx.e.mul(&x, &x);
    let nx2 = cx.e.neg(&x2);
    let ex = cx.e.op("Exp", &[&nx2], vec![]);
    let t = cx.e.scale(&ex, 2.0 / std::f64::consts::PI.sqrt());
    g[0] = Some(cx.e.mul(&dy, &t));
    Ok(g)
}

pub(super) fn exp(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    g[0] = Some(cx.e.mul(&dy, &y));
    Ok(g)
}

/// d sin(x) = cos(x) dx (rotary position embeddings: Llama and its kin).
pub(super) fn sin(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let cos = cx.e.op("Cos", &[&x], vec![]);
    g[0] = Some(cx.e.mul(&dy, &cos));
    Ok(g)
}

/// d cos(x) = −sin(x) dx.
pub(super) fn cos(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let sin = cx.e.op("Sin", &[&x], vec![]);
    let t = cx.e.mul(&dy, &sin);
    g[0] = Some(cx.e.neg(&t));
    Ok(g)
}

pub(super) fn log(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    g[0] = Some(cx.e.div(&dy, &x));
    Ok(g)
}

pub(super) fn neg(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    g[0] = Some(cx.e.neg(&dy));
    Ok(g)
}

pub(super) fn reciprocal(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    let y2 = cx.e.mul(&y, &y);
    let t = cx.e.mul(&dy, &y2);
    g[0] = Some(cx.e.neg(&t));
    Ok(g)
}

pub(super) fn abs(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let s = cx.e.op("Sign", &[&x], vec![]);
    g[0] = Some(cx.e.mul(&dy, &s));
    Ok(g)
}

pub(super) fn pass_through(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    g[0] = Some(dy);
    Ok(g)
}

pub(super) fn cast(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let from = cx.types.types.get(&x).and_then(|t| t.dtype).ok_or_else(|| cx.err("input type unknown"))?;
    g[0] = Some(cx.e.cast(&dy, from));
    Ok(g)
}

pub(super) fn clip(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    // Like PyTorch's hardtanh: the gradient passes strictly inside (min, max). The
    // output is strictly inside exactly where the input is, so the mask reads the output
    // (ReLU6's is kept anyway as the next layer's input, see `relu`).
    let y = cx.y(0).to_string();
    let mut mask: Option<String> = None;
    for (i, op) in [(1, "Greater"), (2, "Less")] {
        if let Some(bound) = cx.node.input(i) {
            let m = cx.e.op(op, &[&y, bound], vec![]);
            mask = Some(match mask {
                Some(prev) => cx.e.op("And", &[&prev, &m], vec![]),
                None => m,
            });
        }
    }
    g[0] = Some(match mask {
        Some(m) => pass_where(cx, &dy, &m),
        None => dy,
    });
    Ok(g)
}

pub(super) fn gelu(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let approximate = cx.node.attr_string("approximate", "none")?;
    g[0] = Some(if approximate == "tanh" { gelu_tanh_grad(cx, &x, &dy) } else { gelu_erf(cx.e, &x, &dy) });
    Ok(g)
}

pub(super) fn hard_sigmoid(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    // y = clip(αx + β, 0, 1): the slope α strictly inside, as PyTorch's hardsigmoid.
    let alpha = cx.node.attr_float("alpha", 0.2)? as f64;
    let (zero, one) = (cx.e.scalar(0.0), cx.e.scalar(1.0));
    let above = cx.e.op("Greater", &[&y, &zero], vec![]);
    let below = cx.e.op("Less", &[&y, &one], vec![]);
    let inside = cx.e.op("And", &[&above, &below], vec![]);
    let scaled = cx.e.scale(&dy, alpha);
    g[0] = Some(cx.e.op("Where", &[&inside, &scaled, &zero], vec![]));
    Ok(g)
}

pub(super) fn hard_swish(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    // y = x·clip(x/6 + 1/2, 0, 1); PyTorch's hardswish_backward: 0 below −3, x/3 + 1/2
    // on [−3, 3], 1 above.
    let (zero, one) = (cx.e.scalar(0.0), cx.e.scalar(1.0));
    let (low, high) = (cx.e.scalar(-3.0), cx.e.scalar(3.0));
    let third = cx.e.scale(&x, 1.0 / 3.0);
    let half = cx.e.scalar(0.5);
    let slope = cx.e.add(&third, &half);
    let above = cx.e.op("Greater", &[&x, &high], vec![]);
    let upper = cx.e.op("Where", &[&above, &one, &slope], vec![]);
    let under = cx.e.op("Less", &[&x, &low], vec![]);
    let d = cx.e.op("Where", &[&under, &zero, &upper], vec![]);
    g[0] = Some(cx.e.mul(&dy, &d));
    Ok(g)
}

pub(super) fn softplus(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let x = cx.x(0).to_string();
    let s = cx.e.op("Sigmoid", &[&x], vec![]);
    g[0] = Some(cx.e.mul(&dy, &s));
    Ok(g)
}

pub(super) fn where_(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let c = cx.x(0).to_string();
    let zero = cx.e.scalar(0.0);
    if cx.need(1) {
        let d = cx.e.op("Where", &[&c, &dy, &zero], vec![]);
        g[1] = Some(cx.unbroadcast(&d, 1)?);
    }
    if cx.need(2) {
        let d = cx.e.op("Where", &[&c, &zero, &dy], vec![]);
        g[2] = Some(cx.unbroadcast(&d, 2)?);
    }
    Ok(g)
}

pub(super) fn max_min(cx: &mut RuleCx<'_>) -> Result<InputGrads> {
    let dy = cx.dy()?;
    let mut g = cx.none();
    let y = cx.y(0).to_string();
    // The gradient goes to the first input that attains the result.
    let zero = cx.e.scalar(0.0);
    let mut taken: Option<String> = None;
    for (i, grad) in g.iter_mut().enumerate() {
        let xi = cx.x(i).to_string();
        let hit = cx.e.op("Equal", &[&xi, &y], vec![]);
        let first = match &taken {
            Some(t) => {
                let free = cx.e.op("Not", &[t], vec![]);
                cx.e.op("And", &[&hit, &free], vec![])
            }
            None => hit.clone(),
        };
        if cx.need(i) {
            let d = cx.e.op("Where", &[&first, &dy, &zero], vec![]);
            *grad = Some(cx.unbroadcast(&d, i)?);
        }
        taken = Some(match taken {
            Some(t) => cx.e.op("Or", &[&t, &hit], vec![]),
            None => hit,
        });
    }
    Ok(g)
}

/// dY·d/dx of x·Φ(x) = dY·(Φ(x) + x·φ(x)), from x alone: the rule of the `Gelu` op and
/// of the spelled-out GELU group ([`crate::grad::CompositeRule::Gelu`]).
pub fn gelu_erf(e: &mut crate::emit::Emitter, x: &str, dy: &str) -> String {
    let xs = e.scale(x, std::f64::consts::FRAC_1_SQRT_2);
    let erf = e.op("Erf", &[&xs], vec![]);
    let one = e.scalar(1.0);
    let p = e.add(&erf, &one);
    let cdf = e.scale(&p, 0.5);
    let x2 = e.mul(x, x);
    let h = e.scale(&x2, -0.5);
    let ex = e.op("Exp", &[&h], vec![]);
    let pdf = e.scale(&ex, 1.0 / (2.0 * std::f64::consts::PI).sqrt());
    let xpdf = e.mul(x, &pdf);
    let d = e.add(&cdf, &xpdf);
    e.mul(dy, &d)
}

/// dY·d/dx of x·σ(x) = dY·σ(x)·(1 + x·(1 − σ(x))), from x alone: the rule of the
/// spelled-out SiLU group ([`crate::grad::CompositeRule::Silu`]). It reads q = σ(−x) =
/// 1 − σ(x) rather than σ(x): a `Sigmoid(x)` here would be the forward's own, merged
/// with it by common-subexpression elimination (ours, and ONNX Runtime's), and the
/// forward's σ(x) would be kept for the backward again. 1 − q loses σ(x)'s relative
/// precision where σ(x) is below float32's epsilon, as PyTorch's own `silu_backward`
/// (which forms 1 − σ(x)) does at the other end; the error stays below an ulp of 1
/// times |1 + x·q|.
pub fn silu(e: &mut crate::emit::Emitter, x: &str, dy: &str) -> String {
    let minus = e.neg(x);
    let q = e.op("Sigmoid", &[&minus], vec![]);
    let one = e.scalar(1.0);
    let s = e.sub(&one, &q);
    let xq = e.mul(x, &q);
    let t = e.add(&one, &xq);
    let d = e.mul(&s, &t);
    e.mul(dy, &d)
}

/// Gradient of the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
fn gelu_tanh_grad(cx: &mut RuleCx<'_>, x: &str, dy: &str) -> String {
    let e = &mut *cx.e;
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let x2 = e.mul(x, x);
    let x3 = e.mul(&x2, x);
    let c = e.scale(&x3, 0.044715);
    let inner0 = e.add(x, &c);
    let inner = e.scale(&inner0, k);
    let t = e.op("Tanh", &[&inner], vec![]);
    let one = e.scalar(1.0);
    let onept = e.add(&one, &t);
    let left = e.scale(&onept, 0.5);
    let t2 = e.mul(&t, &t);
    let sech2 = e.sub(&one, &t2);
    let c3 = e.scale(&x2, 3.0 * 0.044715);
    let dinner0 = e.add(&one, &c3);
    let dinner = e.scale(&dinner0, k);
    let r0 = e.mul(&sech2, &dinner);
    let r1 = e.mul(x, &r0);
    let right = e.scale(&r1, 0.5);
    let d = e.add(&left, &right);
    e.mul(dy, &d)
}
