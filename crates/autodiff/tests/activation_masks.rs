//! The masks of ReLU's and Clip's gradients at and next to their kinks. Finite
//! differences cannot check a kink; PyTorch's rules give these values exactly: the
//! gradient passes where ReLU's output is positive, and strictly inside Clip's bounds
//! (hardtanh's backward). On ONNX Runtime these run as comparisons, a cast and a product;
//! tract fuses them into one pass (`edgefreeze_engine::tract_lower`): the points one ulp
//! inside and outside each bound, signed zeros and the smallest subnormal check both.

mod common;

use common::weighted_output_gradient;
use edgefreeze_graph::Tensor;
use edgefreeze_graph::ir::{Attribute, Node};

/// Points at, beside and between the bounds 0 and 6.
const X: [f32; 9] = [-1.0, -0.0, 0.0, 1e-45, 3.0, 5.999_999_5, 6.0, 6.000_000_5, 7.0];

/// d/dx of Σ wᵢ·f(x)ᵢ with wᵢ = i + 1, on ONNX Runtime and tract: the mask times w.
/// `nodes` compute `y` from `x`; `extra` are further graph inputs with their values.
fn masked_gradient(nodes: Vec<Node>, extra: &[(&str, f32)]) -> Vec<Vec<f32>> {
    weighted_output_gradient(&[X.len()], &X, nodes, &[X.len()], extra)
}

/// The weights where `inside` holds, zeros elsewhere.
fn expected(inside: impl Fn(f32) -> bool) -> Vec<f32> {
    X.iter().enumerate().map(|(i, &x)| if inside(x) { (i + 1) as f32 } else { 0.0 }).collect()
}

fn constant(name: &str, value: f32) -> Node {
    Node::new(name, "Constant", &[], &[name])
        .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![], &[value]).unwrap()))
}

#[test]
fn relu_passes_the_gradient_where_its_output_is_positive() {
    for grad in masked_gradient(vec![Node::new("relu", "Relu", &["x"], &["y"])], &[]) {
        assert_eq!(grad, expected(|x| x > 0.0));
    }
}

#[test]
fn relu6_passes_the_gradient_strictly_inside_its_bounds() {
    // ReLU6 as both exporters write it: Clip with constant bounds.
    let nodes = vec![constant("lo", 0.0), constant("hi", 6.0), Node::new("clip", "Clip", &["x", "lo", "hi"], &["y"])];
    for grad in masked_gradient(nodes, &[]) {
        assert_eq!(grad, expected(|x| x > 0.0 && x < 6.0));
    }
    // One bound only, and a lower bound that is not zero.
    let nodes = vec![constant("hi", 6.0), Node::new("clip", "Clip", &["x", "", "hi"], &["y"])];
    for grad in masked_gradient(nodes, &[]) {
        assert_eq!(grad, expected(|x| x < 6.0));
    }
    let nodes = vec![constant("lo", 3.0), Node::new("clip", "Clip", &["x", "lo"], &["y"])];
    for grad in masked_gradient(nodes, &[]) {
        assert_eq!(grad, expected(|x| x > 3.0));
    }
}

#[test]
fn clip_with_bounds_known_only_at_run_time_masks_the_same() {
    let nodes = vec![Node::new("clip", "Clip", &["x", "lo", "hi"], &["y"])];
    for grad in masked_gradient(nodes, &[("lo", 0.0), ("hi", 6.0)]) {
        assert_eq!(grad, expected(|x| x > 0.0 && x < 6.0));
    }
}
