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
fn sine_and_cosine() {
    // Rotary position embeddings (Llama and its kin) take both of the same angles.
    let mut rng = Rng::new(21);
    let angles = |rng: &mut Rng| Input::Param(vec![2, 5], rng.values(10, -4.0, 4.0));
    check(op("Sin"), vec![angles(&mut rng)], 17);
    check(op("Cos"), vec![angles(&mut rng)], 17);
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

/// GELU spelled out with `Erf` as the PyTorch exporters write it before opset 20 —
/// TorchScript's `Mul(Mul(x, 1 + erf(x/√2)), ½)`, dynamo's `Mul(x, Mul(½, 1 + erf(x/√2)))`,
/// and x/√2 written as a product — is differentiated as one group from x alone
/// (`CompositeRule::Gelu`): its gradient against central differences, and the group's rule
/// is the one that ran (the backward keeps neither x/√2 nor 1 + erf). A chain whose
/// 1 + erf is also read elsewhere is not grouped. (With x/√2 as a product, the rule's own
/// `Mul(x, 1/√2)`, `Erf` and `+ 1` are the forward's nodes, and the graph's shared
/// subexpressions are merged: that backward reads the forward's 1 + erf(x/√2) instead of
/// computing it again, two values kept where the ops' rules kept three.)
/// The loss Σ w·y of a group's output y (w a constant "w" of y's shape), or of y + `leak`
/// where a value inside the group is also read outside it.
fn to_loss(mut g: edgefreeze_graph::ir::Graph, leak: Option<&str>) -> edgefreeze_graph::ir::Model {
    use edgefreeze_graph::ir::{Model, ValueInfo};
    let mut projected = "y".to_string();
    if let Some(inner) = leak {
        g.nodes.push(Node::new("leak", "Add", &["y", inner], &["yl"]));
        projected = "yl".into();
    }
    g.nodes.push(Node::new("proj", "Mul", &[&projected, "w"], &["p"]));
    g.nodes.push(Node::new("sum", "ReduceSum", &["p"], &["loss"]).with_attr("keepdims", Attribute::Int(0)));
    g.outputs = vec![ValueInfo { name: "loss".into(), dtype: None, shape: None, doc_string: String::new() }];
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph: g, ..Default::default() };
    edgefreeze_graph::prepare(model).unwrap()
}

#[test]
fn silu_spelled_out_is_one_group_that_keeps_only_its_input() {
    use edgefreeze_autodiff::{Loss, gradient_graph};
    use edgefreeze_graph::ir::{Graph, Model};
    use edgefreeze_graph::{DataType, Tensor};
    let model = |sigmoid_first: bool, leak: bool| -> Model {
        let mut rng = Rng::new(11);
        let mut g = Graph { name: "silu".into(), ..Default::default() };
        // Past ±17 σ(x) is below float32's epsilon or rounds to 1: the ends of the rule.
        let mut x = rng.values(10, -6.0, 6.0);
        x[0] = -20.0;
        x[1] = 20.0;
        g.initializers.insert("x".into(), Tensor::from_f64_as(DataType::Float64, vec![2, 5], &x).unwrap());
        g.nodes.push(Node::new("c_w", "Constant", &[], &["w"]).with_attr(
            "value",
            Attribute::Tensor(Tensor::from_f64_as(DataType::Float64, vec![2, 5], &rng.values(10, -1.0, 1.0)).unwrap()),
        ));
        g.nodes.push(Node::new("sigmoid", "Sigmoid", &["x"], &["s"]));
        let operands: [&str; 2] = if sigmoid_first { ["s", "x"] } else { ["x", "s"] };
        g.nodes.push(Node::new("times", "Mul", &operands, &["y"]));
        // σ(x) also read outside the product: its gradient then comes from outside too.
        to_loss(g, leak.then_some("s"))
    };
    for (what, sigmoid_first, leak, grouped) in [
        ("x·σ(x) (both exporters)", false, false, true),
        ("σ(x)·x", true, false, true),
        ("σ(x) read outside", false, true, false),
    ] {
        let m = model(sigmoid_first, leak);
        let grad = gradient_graph(&m, &Loss::Output, &[]).unwrap();
        let saved = edgefreeze_autodiff::saved::saved_for_backward(&grad.graph).unwrap();
        let kept = |v: &str| saved.iter().any(|s| s.value == v);
        // Grouped, the backward reads x and not σ(x), not even through a Sigmoid(x) of its
        // own merged with the forward's; the ops' own rules keep σ(x).
        assert_eq!(kept("s"), !grouped, "{what}: {saved:#?}");
        check_model(what, &m, F32_KERNEL);
    }
}

#[test]
fn gelu_spelled_out_with_erf_is_one_group_in_every_exporters_order() {
    use edgefreeze_autodiff::{Loss, gradient_graph};
    use edgefreeze_graph::ir::{Graph, Model};
    use edgefreeze_graph::{DataType, Tensor};
    let model = |dynamo: bool, product: bool, leak: bool| -> Model {
        let mut rng = Rng::new(10);
        let mut g = Graph { name: "gelu".into(), ..Default::default() };
        g.initializers.insert(
            "x".into(),
            Tensor::from_f64_as(DataType::Float64, vec![2, 5], &rng.values(10, -3.0, 3.0)).unwrap(),
        );
        let constant = |name: &str, dims: Vec<usize>, v: &[f64]| {
            Node::new(format!("c_{name}"), "Constant", &[], &[name])
                .with_attr("value", Attribute::Tensor(Tensor::from_f64_as(DataType::Float64, dims, v).unwrap()))
        };
        let root = if product { std::f64::consts::FRAC_1_SQRT_2 } else { std::f64::consts::SQRT_2 };
        g.nodes.push(constant("root", vec![], &[root]));
        g.nodes.push(constant("one", vec![], &[1.0]));
        g.nodes.push(constant("half", vec![], &[0.5]));
        g.nodes.push(constant("w", vec![2, 5], &rng.values(10, -1.0, 1.0)));
        g.nodes.push(Node::new("scale", if product { "Mul" } else { "Div" }, &["x", "root"], &["u"]));
        g.nodes.push(Node::new("erf", "Erf", &["u"], &["e"]));
        g.nodes.push(Node::new("plus", "Add", &["e", "one"], &["t"]));
        if dynamo {
            g.nodes.push(Node::new("halve", "Mul", &["half", "t"], &["m"]));
            g.nodes.push(Node::new("times", "Mul", &["x", "m"], &["y"]));
        } else {
            g.nodes.push(Node::new("times", "Mul", &["x", "t"], &["m"]));
            g.nodes.push(Node::new("halve", "Mul", &["m", "half"], &["y"]));
        }
        // 1 + erf also read outside the chain: its gradient then comes from outside too.
        to_loss(g, leak.then_some("t"))
    };
    for (what, dynamo, product, leak, grouped) in [
        ("torchscript", false, false, false, true),
        ("dynamo", true, false, false, true),
        ("x/√2 as a product", false, true, false, true),
        ("1 + erf read outside", false, false, true, false),
    ] {
        let m = model(dynamo, product, leak);
        let grad = gradient_graph(&m, &Loss::Output, &[]).unwrap();
        let saved = edgefreeze_autodiff::saved::saved_for_backward(&grad.graph).unwrap();
        let kept = |v: &str| saved.iter().any(|s| s.value == v);
        // Grouped, x/√2 is not kept, nor 1 + erf except where the forward's is the rule's
        // own (the product form, below); the ops' own rules keep both.
        let expected = if grouped { (false, product) } else { (true, true) };
        assert_eq!((kept("u"), kept("t")), expected, "{what}: {saved:#?}");
        check_model(what, &m, F32_KERNEL);
    }
}
