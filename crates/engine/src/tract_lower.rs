//! Rewrites of a tract model, made once its dimensions are numbers and its decluttering
//! is done, that steer tract's code generation onto its fast kernels. They change how a
//! value is computed, never what it is: every rewrite here gives the same bits.
//!
//! **Per-channel operands.** tract code-generates an element-wise `Add`, `Sub`, `Mul`,
//! `Min` or `Max` into a vectorised kernel only where the smaller operand lines up with
//! the larger one in one of two ways: equal leading dimensions and then ones ("by
//! scalar": one value per block of the larger operand), or leading ones and then equal
//! dimensions ("unicast"). A per-channel operand of an NCHW tensor, `[1, C, 1, 1]`
//! against `[N, C, H, W]`, is neither, and falls to the generic broadcasting loop, which
//! runs 10–20x slower per element. Training graphs are full of these: every
//! BatchNormalization's statistics, scale and shift, forward and backward (docs/results.md:
//! a third of MobileNetV2 x0.5's step). Broadcasting such an operand over the leading
//! dimensions first (`[N, C, 1, 1]`, N·C values) makes it a by-scalar operand.

use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::array::MultiBroadcastTo;
use tract_onnx::tract_core::ops::binary::TypedBinOp;

/// The binary ops tract has vectorised by-scalar and unicast kernels for.
const VECTORISED: [&str; 5] = ["Add", "Sub", "Mul", "Min", "Max"];

/// Broadcasts the per-channel operand of every element-wise op that would fall to tract's
/// generic loop over the other operand's leading dimensions (module doc). Returns how
/// many operands it widened.
pub fn widen_per_channel_operands(model: &mut TypedModel) -> TractResult<usize> {
    let mut widened = 0;
    for id in model.eval_order()? {
        let Some(op) = model.node(id).op_as::<TypedBinOp>() else { continue };
        if !VECTORISED.contains(&op.0.name()) {
            continue;
        }
        let facts = model.node_input_facts(id)?;
        let (Some(a), Some(b)) = (facts[0].shape.as_concrete(), facts[1].shape.as_concrete()) else { continue };
        let Some((small, target)) = by_scalar_target(a, b) else { continue };
        drop(facts);
        let node = model.node(id);
        let (name, op) = (node.name.clone(), node.op.clone());
        let mut patch = TypedModelPatch::default();
        let mut inputs = patch.taps(model, &node.inputs)?;
        let shape: TVec<TDim> = target.iter().map(|&d| d.into()).collect();
        inputs[small] = patch.wire_node(
            format!("{name}.per_channel"),
            MultiBroadcastTo { shape: shape.into() },
            &[inputs[small]],
        )?[0];
        let out = patch.wire_node(&name, op, &inputs)?[0];
        patch.shunt_outside(model, id.into(), out)?;
        patch.apply(model)?;
        widened += 1;
    }
    Ok(widened)
}

/// For operands of shapes `a` and `b` (same rank), where one (the "small" one) broadcasts
/// into the other with a one somewhere before its last dimension that is not one, and
/// ones after it: the small operand's index and the shape to broadcast it to first, the
/// large operand's dimensions up to that last one and the small one's (ones) after it.
/// `None` where tract's kernels take the operands as they are, or where the small one
/// does not broadcast into the other.
fn by_scalar_target(a: &[usize], b: &[usize]) -> Option<(usize, TVec<usize>)> {
    if a.len() != b.len() {
        return None;
    }
    let volume = |s: &[usize]| s.iter().product::<usize>();
    let (small, large, index) = if volume(b) <= volume(a) { (b, a, 1) } else { (a, b, 0) };
    if small.iter().zip(large).any(|(&s, &l)| s != 1 && s != l) {
        return None;
    }
    // The last dimension that is not one: trailing ones after it, a one before it.
    let last = small.iter().rposition(|&d| d != 1)?;
    if last + 1 == small.len() || small[..last].iter().zip(large).all(|(&s, &l)| s == l) {
        return None;
    }
    let mut target: TVec<usize> = large[..=last].into();
    target.extend(small[last + 1..].iter().copied());
    Some((index, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_operands_get_the_leading_dimensions() {
        // BatchNormalization's statistics against an NCHW activation, either side.
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[1, 48, 1, 1]), Some((1, [32, 48, 1, 1].into())));
        assert_eq!(by_scalar_target(&[1, 48, 1, 1], &[32, 48, 7, 7]), Some((0, [32, 48, 1, 1].into())));
        // 1×1 spatial: the widened operand is as large as the other, which makes the op
        // unicast (equal shapes) instead of generic.
        assert_eq!(by_scalar_target(&[32, 480, 1, 1], &[1, 480, 1, 1]), Some((1, [32, 480, 1, 1].into())));
        // Channels-last per-channel operands and the leading-ones form are unicast already.
        assert_eq!(by_scalar_target(&[32, 7, 7, 48], &[1, 1, 1, 48]), None);
        // By scalar already (one value per (n, c)), same shapes, a scalar.
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[32, 48, 1, 1]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[32, 48, 7, 7]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[1, 1, 1, 1]), None);
        // Not a broadcast of one into the other, or of different ranks.
        assert_eq!(by_scalar_target(&[32, 48, 7, 1], &[1, 1, 1, 5]), None);
        assert_eq!(by_scalar_target(&[32, 48, 7, 7], &[48, 1, 1]), None);
    }
}
