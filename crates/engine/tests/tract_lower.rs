//! tract's lowering passes (`edgefreeze_engine::tract_lower`) change how values are
//! computed, never what they are: a graph of the patterns they rewrite gives the same
//! bits on tract's optimised plan (lowered) and its generic plan (not lowered), and
//! where the arithmetic is exact (masks, broadcasts) those of ONNX Runtime too, at the
//! values where masks and broadcasts go wrong if anything does.

use edgefreeze_engine::tract_lower::{
    fold_transposes_into_products, fuse_comparison_masks, pad_convolutions_explicitly, scatter_by_rows,
    widen_per_channel_operands,
};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, save::encode_model};
use ndarray::{ArrayD, IxDyn};
use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::change_axes::AxisOp;

const SHAPE: [usize; 4] = [2, 3, 2, 4];

/// Input channels of the convolution: 36 × 9 taps is more than `lay_batch_along_width`
/// takes, so the convolution keeps tract's im2col and its bits.
const CONV_CHANNELS: usize = 36;

fn scalar(name: &str, v: f32) -> Node {
    Node::new(name, "Constant", &[], &[name])
        .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![], &[v]).unwrap()))
}

/// The ReLU and ReLU6 gradient masks as the rules write them, a mask with the constant on
/// the left, and per-channel BatchNorm-style arithmetic on both sides of an op.
fn patterns() -> Vec<u8> {
    let batch = || -> Vec<Dim> {
        std::iter::once(Dim::Symbol("batch".into())).chain(SHAPE[1..].iter().map(|&d| Dim::Fixed(d))).collect()
    };
    let cast =
        |name: &str, from: &str, to: &str| Node::new(name, "Cast", &[from], &[to]).with_attr("to", Attribute::Int(1));
    let nodes = vec![
        scalar("zero", 0.0),
        scalar("six", 6.0),
        // ReLU: dy · Cast(y > 0)
        Node::new("gt", "Greater", &["y", "zero"], &["pos"]),
        cast("c1", "pos", "posf"),
        Node::new("relu_grad", "Mul", &["dy", "posf"], &["relu_grad"]),
        // ReLU6: dy · Cast(y > 0 and y < 6), the mask on the left of the product
        Node::new("lt", "Less", &["y", "six"], &["below"]),
        Node::new("and", "And", &["pos", "below"], &["inside"]),
        cast("c2", "inside", "insidef"),
        Node::new("relu6_grad", "Mul", &["insidef", "dy"], &["relu6_grad"]),
        // 6 > y: the constant on the left
        Node::new("gt6", "Greater", &["six", "y"], &["under"]),
        cast("c3", "under", "underf"),
        Node::new("under_grad", "Mul", &["dy", "underf"], &["under_grad"]),
        // per-channel operands [1, C, 1, 1], either side
        Node::new("centre", "Sub", &["y", "mean"], &["centred"]),
        Node::new("scale", "Mul", &["gamma", "centred"], &["scaled"]),
        // a padded convolution (uneven pads), of finite values, with too many input
        // channels × taps to be laid along the width (tract_wide_conv.rs)
        Node::new("conv", "Conv", &["cx", "w"], &["conv"]).with_attr("pads", Attribute::Ints(vec![1, 2, 0, 1])),
        // scatters: adding along the last axis, indices repeated and negative; writing
        // along the channels
        Node::new("scatter_add", "ScatterElements", &["dy_finite", "idx_add", "upd_add"], &["scatter_add"])
            .with_attr("axis", Attribute::Int(3))
            .with_attr("reduction", Attribute::String("add".into())),
        Node::new("scatter_set", "ScatterElements", &["dy_finite", "idx_set", "upd_set"], &["scatter_set"])
            .with_attr("axis", Attribute::Int(1)),
        // products of transposed operands: a weight gradient's dY [N, M, P] times an
        // input's positions transposed [N, P, C], its reshapes around the transpose (which
        // tract's decluttering leaves, and the pass folds); and [N, P, M] · [N, M, P],
        // which tract's decluttering folds itself
        Node::new("flat_shape_c", "Constant", &[], &["flat_c"])
            .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![3], &[0, CONV_CHANNELS as i64, -1]).unwrap())),
        Node::new("flat_shape_m", "Constant", &[], &["flat_m"])
            .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![3], &[0, SHAPE[1] as i64, -1]).unwrap())),
        Node::new("flat_x", "Reshape", &["cx", "flat_c"], &["x_flat"]),
        Node::new("flat_dy", "Reshape", &["dy_finite", "flat_m"], &["dy_flat"]),
        Node::new("xt", "Transpose", &["x_flat"], &["x_t"]).with_attr("perm", Attribute::Ints(vec![0, 2, 1])),
        Node::new("wgrad", "MatMul", &["dy_flat", "x_t"], &["wgrad"]),
        Node::new("dyt", "Transpose", &["dy_flat"], &["dy_t"]).with_attr("perm", Attribute::Ints(vec![0, 2, 1])),
        Node::new("gram", "MatMul", &["dy_t", "dy_flat"], &["gram"]),
    ];
    let channel = || vec![Dim::Fixed(1), Dim::Fixed(SHAPE[1]), Dim::Fixed(1), Dim::Fixed(1)];
    // The input's shape, but `k` along `axis`.
    let along = |axis: usize, k: usize| -> Vec<Dim> {
        let mut dims = batch();
        dims[axis] = Dim::Fixed(k);
        dims
    };
    let graph = Graph {
        name: "lowering".into(),
        nodes,
        inputs: vec![
            ValueInfo::new("y", DataType::Float32, batch()),
            ValueInfo::new("dy", DataType::Float32, batch()),
            ValueInfo::new("mean", DataType::Float32, channel()),
            ValueInfo::new("gamma", DataType::Float32, channel()),
            ValueInfo::new("dy_finite", DataType::Float32, batch()),
            ValueInfo::new("cx", DataType::Float32, along(1, CONV_CHANNELS)),
            ValueInfo::new("w", DataType::Float32, [2, CONV_CHANNELS, 3, 3].map(Dim::Fixed).to_vec()),
            ValueInfo::new("idx_add", DataType::Int64, along(3, 3)),
            ValueInfo::new("upd_add", DataType::Float32, along(3, 3)),
            ValueInfo::new("idx_set", DataType::Int64, along(1, 2)),
            ValueInfo::new("upd_set", DataType::Float32, along(1, 2)),
        ],
        outputs: [
            "relu_grad",
            "relu6_grad",
            "under_grad",
            "scaled",
            "conv",
            "scatter_add",
            "scatter_set",
            "wgrad",
            "gram",
        ]
        .iter()
        .map(|n| ValueInfo {
            name: n.to_string(),
            dtype: Some(DataType::Float32),
            shape: None,
            doc_string: String::new(),
        })
        .collect(),
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

/// y at, beside and between the bounds 0 and 6 (and NaN, ±∞); dy with infinities and a NaN
/// at masked and unmasked positions.
fn inputs() -> Vec<(&'static str, Value)> {
    let n: usize = SHAPE.iter().product();
    let special =
        [-1.0, -0.0, 0.0, 1e-45, 3.0, 5.999_999_5, 6.0, 6.000_000_5, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 7.0];
    let y: Vec<f32> = (0..n).map(|i| special[i % special.len()]).collect();
    let dy: Vec<f32> = (0..n)
        .map(|i| match i % 17 {
            0 => f32::INFINITY,
            5 => f32::NAN,
            k => k as f32 - 8.25,
        })
        .collect();
    let array = |dims: &[usize], v: Vec<f32>| Value::F32(ArrayD::from_shape_vec(IxDyn(dims), v).unwrap());
    let along = |axis: usize, k: usize| {
        let mut dims = SHAPE;
        dims[axis] = k;
        dims
    };
    let indices = |dims: &[usize], f: fn(usize) -> i64| {
        let n: usize = dims.iter().product();
        Value::I64(ArrayD::from_shape_vec(IxDyn(dims), (0..n).map(f).collect()).unwrap())
    };
    let finite: Vec<f32> = (0..n).map(|i| ((i * 7) % 11) as f32 * 0.37 - 1.5).collect();
    let w: Vec<f32> = (0..2 * CONV_CHANNELS * 9).map(|i| ((i * 5) % 13) as f32 * 0.11 - 0.6).collect();
    let cx: Vec<f32> = (0..n / SHAPE[1] * CONV_CHANNELS).map(|i| ((i * 7) % 11) as f32 * 0.37 - 1.5).collect();
    vec![
        ("y", array(&SHAPE, y)),
        ("dy", array(&SHAPE, dy)),
        ("dy_finite", array(&SHAPE, finite)),
        ("cx", array(&along(1, CONV_CHANNELS), cx)),
        ("w", array(&[2, CONV_CHANNELS, 3, 3], w)),
        ("mean", array(&[1, SHAPE[1], 1, 1], vec![0.5, -0.0, 3.0])),
        ("gamma", array(&[1, SHAPE[1], 1, 1], vec![2.0, -1.5, 0.0])),
        // along the last axis (4): indices 3, -1 (also 3) and 0, so that two updates add
        // at one place, in an order the bits show
        ("idx_add", indices(&along(3, 3), |i| [3, -1, 0][i % 3])),
        ("upd_add", array(&along(3, 3), (0..n / 4 * 3).map(|i| (i as f32 * 0.731).sin() * 1e3 + 0.1).collect())),
        // along the channels (3): each (n, h, w) writes two channels, one by a negative index
        ("idx_set", indices(&along(1, 2), |i| if (i / 8) % 2 == 0 { 2 } else { -3 + (i % 2) as i64 })),
        ("upd_set", array(&along(1, 2), (0..n / 3 * 2).map(|i| i as f32 - 7.5).collect())),
    ]
}

fn run(kind: EngineKind, options: EngineOptions) -> Vec<Vec<u32>> {
    let mut session = edgefreeze_engine::load(&kind, &patterns(), &options).unwrap();
    let feeds = inputs();
    let feeds: Vec<(&str, &Value)> = feeds.iter().map(|(n, v)| (*n, v)).collect();
    // NaNs compare by being NaN: their payloads are not the arithmetic's business.
    let bits = |x: &f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
    session.run(&feeds).unwrap().iter().map(|v| v.as_f32().unwrap().iter().map(bits).collect()).collect()
}

#[test]
fn lowered_plans_give_the_bits_of_the_unlowered_ones() {
    let one_thread = EngineOptions { threads: Some(1), ..Default::default() };
    let lowered = run(EngineKind::Tract, one_thread.clone());
    let generic = run(EngineKind::Tract, EngineOptions { tract_generic_plan: true, ..one_thread.clone() });
    let ort = run(EngineKind::Ort(Provider::Cpu), one_thread);
    assert_eq!(lowered, generic);
    // The convolution and the products sum in each engine's own order: the other outputs
    // are exact, the scatter's additions at one index included (both take the updates in
    // order).
    assert_eq!(lowered[..4], ort[..4]);
    assert_eq!(lowered[5..7], ort[5..7]);
}

#[test]
fn the_passes_find_the_patterns() {
    let onnx = tract_onnx::onnx();
    let mut model = onnx.model_for_read(&mut &*patterns()).unwrap().into_typed().unwrap();
    let batch = model.symbols.sym("batch");
    model = model.set_symbols(&std::collections::HashMap::from([(batch, TDim::from(SHAPE[0] as i64))])).unwrap();
    model.declutter().unwrap();
    assert_eq!(fuse_comparison_masks(&mut model).unwrap(), 3);
    assert_eq!(widen_per_channel_operands(&mut model).unwrap(), 2);
    assert_eq!(pad_convolutions_explicitly(&mut model).unwrap(), 1);
    assert_eq!(scatter_by_rows(&mut model).unwrap(), 2);
    assert_eq!(fold_transposes_into_products(&mut model).unwrap(), 1);
    model.optimize().unwrap();
    let names: Vec<String> = model.nodes.iter().map(|n| n.op.name().to_string()).collect();
    assert_eq!(names.iter().filter(|n| *n == "PassInside").count(), 3, "{names:?}");
    assert!(!names.iter().any(|n| ["GT", "LT", "And", "Cast"].contains(&n.as_str())), "{names:?}");
    assert_eq!(names.iter().filter(|n| *n == "ScatterRows").count(), 2, "{names:?}");
    // No axis is moved: both products read their operands in place.
    let moves = model.nodes.iter().filter(|n| matches!(n.op_as::<AxisOp>(), Some(AxisOp::Move(..))));
    let live = model.eval_order().unwrap();
    assert_eq!(moves.filter(|n| live.contains(&n.id)).count(), 0, "{names:?}");
}
