//! Finite-difference checks of the element-wise and matrix-product gradient rules.

mod common;

use common::*;
use edgefreeze_graph::ir::{Attribute, Node};

fn op(op: &str) -> Node {
    Node::new(op, op, &[], &["out0"])
}

#[test]
fn broadcasting_arithmetic() {
    let mut rng = Rng::new(1);
    for name in ["Add", "Sub", "Mul", "Div"] {
        check(op(name), vec![param(&mut rng, &[2, 3, 4]), param_away_from_zero(&mut rng, &[3, 1])], 17);
        check(op(name), vec![param_away_from_zero(&mut rng, &[1, 4]), param_away_from_zero(&mut rng, &[2, 3, 1])], 17);
    }
}

#[test]
fn powers_and_roots() {
    let mut rng = Rng::new(2);
    let positive =
        |rng: &mut Rng, dims: &[usize]| Input::Param(dims.to_vec(), rng.values(dims.iter().product(), 0.5, 2.0));
    check(op("Pow"), vec![positive(&mut rng, &[3, 4]), param(&mut rng, &[4])], 17);
    check(op("Sqrt"), vec![positive(&mut rng, &[3, 4])], 17);
    check(op("Log"), vec![positive(&mut rng, &[5])], 17);
    check(op("Reciprocal"), vec![positive(&mut rng, &[5])], 17);
}

#[test]
fn activations() {
    let mut rng = Rng::new(3);
    for name in ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Identity", "Softplus"] {
        check(op(name), vec![param_away_from_zero(&mut rng, &[2, 5])], 17);
    }
    // No native engine has an f64 Erf, and onnx.reference rounds Erf to f32.
    check_tolerance(op("Erf"), vec![param(&mut rng, &[2, 5])], 17, &mut Rng::new(8), F32_KERNEL);
    check(op("LeakyRelu").with_attr("alpha", Attribute::Float(0.2)), vec![param_away_from_zero(&mut rng, &[2, 5])], 17);
    check_tolerance(op("Gelu"), vec![param(&mut rng, &[2, 5])], 20, &mut Rng::new(9), F32_KERNEL);
    check(op("Gelu").with_attr("approximate", Attribute::String(b"tanh".to_vec())), vec![param(&mut rng, &[2, 5])], 20);
}

#[test]
fn hard_sigmoid_and_hard_swish_on_every_piece() {
    // Points in each linear piece, away from the kinks at ±3 (HardSwish) and where
    // αx + β leaves [0, 1] (HardSigmoid).
    let x = || Input::Param(vec![8], vec![-4.5, -3.5, -2.2, -1.0, 0.3, 2.0, 3.4, 5.0]);
    check(op("HardSwish"), vec![x()], 17);
    check(op("HardSigmoid"), vec![x()], 17);
    // PyTorch's export: α = 1/6, β = 1/2.
    let torch =
        op("HardSigmoid").with_attr("alpha", Attribute::Float(1.0 / 6.0)).with_attr("beta", Attribute::Float(0.5));
    check(torch, vec![x()], 17);
}

#[test]
fn clip_passes_the_gradient_strictly_inside_its_bounds() {
    let mut rng = Rng::new(4);
    let bounds = |lo: f64, hi: f64| {
        [lo, hi].map(|v| {
            Input::Const(
                edgefreeze_graph::Tensor::from_f64_as(edgefreeze_graph::DataType::Float64, vec![], &[v]).unwrap(),
            )
        })
    };
    let [lo, hi] = bounds(-0.5, 0.5);
    let x = Input::Param(vec![8], vec![-0.9, -0.7, -0.3, -0.1, 0.2, 0.4, 0.6, 0.95]);
    check(op("Clip"), vec![x, lo, hi], 17);
    let _ = &mut rng;
}

#[test]
fn where_max_and_min() {
    let mut rng = Rng::new(5);
    let mask = Input::Const(
        edgefreeze_graph::Tensor::from_i64_as(edgefreeze_graph::DataType::Bool, vec![3, 1], &[1, 0, 1]).unwrap(),
    );
    check(op("Where"), vec![mask, param(&mut rng, &[3, 4]), param(&mut rng, &[4])], 17);
    check(op("Max"), vec![param(&mut rng, &[3, 4]), param(&mut rng, &[3, 4])], 17);
    check(op("Min"), vec![param(&mut rng, &[3, 4]), param(&mut rng, &[4])], 17);
}

#[test]
fn gemm_in_every_transposition() {
    let mut rng = Rng::new(6);
    for (ta, tb) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let a = if ta == 1 { [4, 3] } else { [3, 4] };
        let b = if tb == 1 { [5, 4] } else { [4, 5] };
        let node = op("Gemm")
            .with_attr("transA", Attribute::Int(ta))
            .with_attr("transB", Attribute::Int(tb))
            .with_attr("alpha", Attribute::Float(0.7))
            .with_attr("beta", Attribute::Float(1.3));
        check(node, vec![param(&mut rng, &a), param(&mut rng, &b), param(&mut rng, &[5])], 17);
    }
}

#[test]
fn matmul_batched_and_broadcast() {
    let mut rng = Rng::new(7);
    check(op("MatMul"), vec![param(&mut rng, &[2, 3, 4]), param(&mut rng, &[4, 5])], 17);
    check(op("MatMul"), vec![param(&mut rng, &[2, 1, 3, 4]), param(&mut rng, &[3, 4, 2])], 17);
    check(op("MatMul"), vec![param(&mut rng, &[3, 4]), param(&mut rng, &[2, 4, 2])], 17);
}
