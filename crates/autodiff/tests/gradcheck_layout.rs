//! Finite-difference checks of the layout, reduction and softmax gradient rules.

mod common;

use common::*;
use edgefreeze_graph::ir::{Attribute, Node};
use edgefreeze_graph::{DataType, Tensor};

fn op(op: &str) -> Node {
    Node::new(op, op, &[], &["out0"])
}

#[test]
fn reshapes_flatten_squeeze_unsqueeze_transpose() {
    let mut rng = Rng::new(11);
    check(op("Reshape"), vec![param(&mut rng, &[2, 3, 4]), ints(&[4, -1])], 17);
    check(op("Flatten").with_attr("axis", Attribute::Int(2)), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("Squeeze"), vec![param(&mut rng, &[2, 1, 4]), ints(&[1])], 17);
    check(op("Unsqueeze"), vec![param(&mut rng, &[2, 4]), ints(&[0, -1])], 17);
    check(op("Transpose").with_attr("perm", Attribute::Ints(vec![2, 0, 1])), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("Transpose"), vec![param(&mut rng, &[2, 3, 4])], 17);
}

#[test]
fn concat_split_and_slice() {
    let mut rng = Rng::new(12);
    check(
        op("Concat").with_attr("axis", Attribute::Int(-1)),
        vec![param(&mut rng, &[2, 3]), param(&mut rng, &[2, 1]), param(&mut rng, &[2, 4])],
        17,
    );
    let split = Node::new("Split", "Split", &[], &["out0", "out1", "out2"]).with_attr("axis", Attribute::Int(1));
    check(split, vec![param(&mut rng, &[2, 6]), ints(&[1, 2, 3])], 17);
    check(op("Slice"), vec![param(&mut rng, &[4, 5]), ints(&[1, -3]), ints(&[3, 100]), ints(&[0, 1])], 17);
    // Strided and reversed slices, as x[:, 1::2] and x[::-2] write them.
    check(op("Slice"), vec![param(&mut rng, &[3, 7]), ints(&[1]), ints(&[100]), ints(&[1]), ints(&[2])], 17);
    check(op("Slice"), vec![param(&mut rng, &[6, 3]), ints(&[-1]), ints(&[i64::MIN]), ints(&[0]), ints(&[-2])], 17);
    check(
        op("Slice"),
        vec![param(&mut rng, &[2, 8, 5]), ints(&[0, 4]), ints(&[7, 0]), ints(&[1, 2]), ints(&[3, -3])],
        17,
    );
}

#[test]
fn split_with_an_unused_output() {
    let mut rng = Rng::new(13);
    // Both outputs feed the projection loss; the harness weights them independently.
    check(
        Node::new("Split", "Split", &[], &["out0", "out1"]).with_attr("axis", Attribute::Int(0)),
        vec![param(&mut rng, &[4, 3]), ints(&[1, 3])],
        17,
    );
}

#[test]
fn embedding_gather_with_repeated_and_negative_indices() {
    let mut rng = Rng::new(14);
    let indices = || Input::Const(Tensor::from_i64(vec![2, 3], &[0, 4, 4, -1, 2, 0]).unwrap());
    check(op("Gather"), vec![param(&mut rng, &[5, 3]), indices()], 17);
    // Before opset 16 the gradient is a one-hot product instead of an adding ScatterND.
    check(op("Gather"), vec![param(&mut rng, &[5, 3]), indices()], 13);
    let scalar_rows = Input::Const(Tensor::from_i64_as(DataType::Int32, vec![3], &[1, 1, 0]).unwrap());
    check(op("Gather"), vec![param(&mut rng, &[3, 2, 2]), scalar_rows], 17);
}

#[test]
fn gather_along_inner_axes_with_index_tensors_and_scalars() {
    let mut rng = Rng::new(15);
    let pairs = || Input::Const(Tensor::from_i64(vec![2, 2], &[3, 0, -1, 1]).unwrap());
    let axis = |a: i64| op("Gather").with_attr("axis", Attribute::Int(a));
    // An adding ScatterND from opset 16, one-hot products with the axis brought to the
    // front before (TorchScript's ViT at opset 14 picks its class token along axis 1).
    for opset in [17, 13] {
        check(axis(1), vec![param(&mut rng, &[3, 4, 2]), pairs()], opset);
        // `x[:, :, 2]` as dynamo exports a select: a scalar index on the last axis.
        let select = Input::Const(Tensor::from_i64(vec![], &[2]).unwrap());
        check(axis(-1), vec![param(&mut rng, &[2, 3, 4]), select], opset);
        let repeated = Input::Const(Tensor::from_i64_as(DataType::Int32, vec![3], &[1, 1, 0]).unwrap());
        check(axis(2), vec![param(&mut rng, &[2, 2, 3, 2]), repeated], opset);
    }
}

#[test]
fn gather_nd_scatters_back_with_repeated_tuples() {
    let mut rng = Rng::new(16);
    let tuples = Input::Const(Tensor::from_i64(vec![3, 2], &[0, 1, 2, 3, 0, 1]).unwrap());
    check(op("GatherND"), vec![param(&mut rng, &[3, 4, 2]), tuples], 17);
    // Depth 1 picks whole rows, as Swin's relative-position lookup does.
    let rows = Input::Const(Tensor::from_i64(vec![2, 2, 1], &[2, 0, 2, 1]).unwrap());
    check(op("GatherND"), vec![param(&mut rng, &[3, 4]), rows], 17);
}

#[test]
fn gather_elements_scatters_back_with_repeated_and_negative_indices() {
    let mut rng = Rng::new(18);
    let gather = |axis: i64| op("GatherElements").with_attr("axis", Attribute::Int(axis));
    // Indices smaller than the data on the other axis too, a position picked twice, and one
    // counted from the end.
    let rows = Input::Const(Tensor::from_i64(vec![2, 2], &[0, 2, 0, -1]).unwrap());
    check(gather(0), vec![param(&mut rng, &[3, 3]), rows], 17);
    let along_last = Input::Const(Tensor::from_i64(vec![2, 3, 2], &[1, 1, 0, 3, 2, 0, 3, 3, 1, 0, 2, 2]).unwrap());
    check(gather(-1), vec![param(&mut rng, &[2, 3, 4]), along_last], 18);
}

#[test]
fn cumulative_sums_in_every_direction() {
    let mut rng = Rng::new(19);
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let node = op("CumSum")
            .with_attr("exclusive", Attribute::Int(exclusive))
            .with_attr("reverse", Attribute::Int(reverse));
        check(node.clone(), vec![param(&mut rng, &[3, 4]), ints(&[1])], 17);
        // A scalar axis, counted from the end, as RoBERTa's position ids give it.
        let axis = Input::Const(Tensor::from_i64(vec![], &[-2]).unwrap());
        check(node, vec![param(&mut rng, &[3, 4, 2]), axis], 17);
    }
}

#[test]
fn triangles_upper_and_lower_with_offsets() {
    let mut rng = Rng::new(20);
    for upper in [0, 1] {
        let node = op("Trilu").with_attr("upper", Attribute::Int(upper));
        check(node.clone(), vec![param(&mut rng, &[2, 3, 4])], 17);
        let k = |v: i64| Input::Const(Tensor::from_i64(vec![], &[v]).unwrap());
        check(node.clone(), vec![param(&mut rng, &[4, 3]), k(1)], 17);
        check(node, vec![param(&mut rng, &[4, 3]), k(-1)], 17);
    }
}

#[test]
fn constant_pad_with_axes_and_negative_pads() {
    let mut rng = Rng::new(17);
    check(op("Pad"), vec![param(&mut rng, &[2, 3, 4]), ints(&[0, 1, 2, 0, 0, 1])], 17);
    // Swin's window padding: only some axes, given as input 3 (opset 18).
    // (The constant value, input 2, is omitted: the harness leaves an empty name empty.)
    let with_axes = Node::new("Pad", "Pad", &["x", "pads", "", "axes"], &["out0"]);
    check(with_axes, vec![param(&mut rng, &[2, 3, 4]), ints(&[1, 0, 2, 3]), ints(&[0]), ints(&[1, -1])], 18);
    // A negative pad crops.
    check(op("Pad"), vec![param(&mut rng, &[3, 5]), ints(&[-1, 2, 1, -2])], 17);
}

#[test]
fn expand_broadcasts_back() {
    let mut rng = Rng::new(15);
    check(op("Expand"), vec![param(&mut rng, &[3, 1]), ints(&[2, 3, 4])], 17);
}

#[test]
fn reductions_over_axes_and_opsets() {
    let mut rng = Rng::new(16);
    check(
        op("ReduceSum").with_attr("keepdims", Attribute::Int(0)),
        vec![param(&mut rng, &[2, 3, 4]), ints(&[0, 2])],
        17,
    );
    check(op("ReduceSum"), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("ReduceMean").with_attr("axes", Attribute::Ints(vec![-1])), vec![param(&mut rng, &[2, 3, 4])], 17);
    check(op("ReduceMean").with_attr("keepdims", Attribute::Int(0)), vec![param(&mut rng, &[2, 3, 4]), ints(&[1])], 18);
}

#[test]
fn softmax_and_log_softmax() {
    let mut rng = Rng::new(17);
    for axis in [-1, 0, 1] {
        check(op("Softmax").with_attr("axis", Attribute::Int(axis)), vec![param(&mut rng, &[3, 4, 2])], 17);
        check(op("LogSoftmax").with_attr("axis", Attribute::Int(axis)), vec![param(&mut rng, &[3, 4, 2])], 17);
    }
}

#[test]
fn batch_and_layer_normalization_train_from_batch_statistics() {
    let mut rng = Rng::new(18);
    let bn = op("BatchNormalization").with_attr("epsilon", Attribute::Float(1e-3));
    check(
        bn,
        vec![
            param(&mut rng, &[4, 3, 2, 2]),
            param(&mut rng, &[3]),
            param(&mut rng, &[3]),
            Input::Const(Tensor::from_f64_as(DataType::Float64, vec![3], &[0.0; 3]).unwrap()),
            Input::Const(Tensor::from_f64_as(DataType::Float64, vec![3], &[1.0; 3]).unwrap()),
        ],
        17,
    );
    check(
        op("BatchNormalization"),
        {
            let mut v = vec![param(&mut rng, &[5, 2]), param(&mut rng, &[2]), param(&mut rng, &[2])];
            v.push(Input::Const(Tensor::from_f64_as(DataType::Float64, vec![2], &[0.0; 2]).unwrap()));
            v.push(Input::Const(Tensor::from_f64_as(DataType::Float64, vec![2], &[1.0; 2]).unwrap()));
            v
        },
        17,
    );
    check(
        op("LayerNormalization"),
        vec![param(&mut rng, &[2, 3, 4]), param(&mut rng, &[4]), param(&mut rng, &[4])],
        17,
    );
    check(
        op("LayerNormalization").with_attr("axis", Attribute::Int(1)),
        vec![param(&mut rng, &[2, 3, 2]), param(&mut rng, &[3, 2])],
        17,
    );
}

/// Concat where sizes along the axis are symbolic: ViT's class token `Expand`ed to the batch
/// (through a shape the loader cannot follow: `Where(Equal(shape, -1), …)` as TorchScript
/// exports `expand(n, -1, -1)`) beside the patch tokens; a concatenation along the batch axis
/// itself; and a symbolic size between known ones. Checked on tract and ONNX Runtime with
/// batch 3 against central differences (the loss is quadratic in every parameter, so a
/// central difference is exact whatever the step).
#[test]
fn concat_with_symbolic_sizes_along_the_axis() {
    use edgefreeze_graph::ir::{Dim, Graph, ValueInfo};
    let mut rng = Rng::new(18);
    let f64s = f64_tensor;
    let int_const = |name: &str, v: &[i64]| int_constant(name, vec![v.len()], v);
    let mut graph = Graph { name: "concat".into(), ..Default::default() };
    let batch = Dim::Symbol("batch".into());
    graph.inputs.push(ValueInfo::new("x", DataType::Float64, vec![batch, Dim::Fixed(2), Dim::Fixed(3)]));
    for (name, dims) in [("w", &[3, 4][..]), ("cls", &[1, 1, 4]), ("q", &[2, 1, 4]), ("p", &[2, 3, 4])] {
        graph.initializers.insert(name.into(), f64s(&mut rng, dims));
    }
    let r = f64s(&mut rng, &[4]);
    graph.nodes = vec![
        // Patch tokens: [batch, 2, 4].
        Node::new("proj", "MatMul", &["x", "w"], &["h"]),
        // The class token expanded to [batch, 1, 4] by a shape whose entries the loader does
        // not know: [batch, -1, -1] with each -1 replaced by 1 at run time.
        Node::new("shape", "Shape", &["h"], &["hs"]),
        int_const("first", &[0]),
        Node::new("n", "Gather", &["hs", "first"], &["n"]).with_attr("axis", Attribute::Int(0)),
        int_const("minus", &[-1, -1]),
        Node::new("want", "Concat", &["n", "minus"], &["want"]).with_attr("axis", Attribute::Int(0)),
        int_const("neg", &[-1]),
        Node::new("is_neg", "Equal", &["want", "neg"], &["is_neg"]),
        int_const("one", &[1]),
        Node::new("fixed", "Where", &["is_neg", "one", "want"], &["target"]),
        Node::new("expand", "Expand", &["cls", "target"], &["tok"]),
        // [batch, 3, 4]: the class token's size along axis 1 is not known to the loader.
        Node::new("cat1", "Concat", &["tok", "h"], &["t"]).with_attr("axis", Attribute::Int(1)),
        // Along the batch axis itself: [2·batch, 3, 4].
        Node::new("cat0", "Concat", &["t", "t"], &["tt"]).with_attr("axis", Attribute::Int(0)),
        // A symbolic size between known ones: h as [2, batch, 4] between q and p.
        Node::new("swap", "Transpose", &["h"], &["ht"]).with_attr("perm", Attribute::Ints(vec![1, 0, 2])),
        Node::new("cat2", "Concat", &["q", "ht", "p"], &["u"]).with_attr("axis", Attribute::Int(1)),
        Node::new("r", "Constant", &[], &["r"]).with_attr("value", Attribute::Tensor(r)),
        Node::new("sq0", "Mul", &["tt", "tt"], &["tt2"]),
        Node::new("w0", "Mul", &["tt2", "r"], &["tt3"]),
        Node::new("s0", "ReduceSum", &["tt3"], &["l0"]).with_attr("keepdims", Attribute::Int(0)),
        Node::new("sq2", "Mul", &["u", "u"], &["u2"]),
        Node::new("w2", "Mul", &["u2", "r"], &["u3"]),
        Node::new("s2", "ReduceSum", &["u3"], &["l2"]).with_attr("keepdims", Attribute::Int(0)),
        Node::new("total", "Add", &["l0", "l2"], &["objective"]),
    ];
    // The class token's size along the axis must be unknown to the loader.
    let x: Feed = ("x".into(), vec![3, 2, 3], rng.values(18, -1.0, 1.0));
    check_with_an_unknown_size("Concat", graph, 17, ("tok", 1), x);
}

/// A float64 tensor of uniform values in [-1, 1].
fn f64_tensor(rng: &mut Rng, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_f64_as(DataType::Float64, dims.to_vec(), &rng.values(n, -1.0, 1.0)).unwrap()
}

/// A Constant node named as its int64 value.
fn int_constant(name: &str, dims: Vec<usize>, values: &[i64]) -> Node {
    Node::new(name, "Constant", &[], &[name])
        .with_attr("value", Attribute::Tensor(Tensor::from_i64(dims, values).unwrap()))
}

/// Imports a hand-built graph whose loss is `objective`, asserts that the loader cannot
/// size axis `unknown.1` of value `unknown.0` (what the test is about), and checks the
/// gradients on tract and ONNX Runtime against central differences (the losses are
/// quadratic, so a central difference is exact whatever the step).
fn check_with_an_unknown_size(
    what: &str,
    mut graph: edgefreeze_graph::ir::Graph,
    opset: i64,
    unknown: (&str, usize),
    x: Feed,
) {
    use edgefreeze_graph::ir::{Dim, Model, ValueInfo};
    graph.outputs.push(ValueInfo { name: "objective".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), opset)], graph, ..Default::default() };
    let model = edgefreeze_graph::prepare(model).expect("the model is valid");
    let shape = model.graph.value_type(unknown.0).and_then(|v| v.shape).expect("a shape");
    assert_eq!(shape[unknown.1], Dim::Unknown, "{what}: {} must have an axis the loader cannot size", unknown.0);
    check_on_engines(what, &model, &[x], Tolerance { h: 1e-2, abs: 1e-8, rel: 1e-7 });
}

/// Before opset 16, Gather's gradient is a one-hot product, which once needed every
/// dimension of the data. Swin exported by TorchScript before opset 17 picks q, k and v
/// (axis 0) out of a tensor whose next axis is the batch times the windows, a product
/// the loader cannot name: the gradient reads that size at run time. Checked on tract and
/// ONNX Runtime with batch 3 against central differences (the loss is quadratic).
#[test]
fn gather_before_opset_16_with_an_unknown_trailing_size() {
    use edgefreeze_graph::ir::{Dim, Graph, ValueInfo};
    let mut rng = Rng::new(19);
    let (f64s, int_const) = (f64_tensor, int_constant);
    let mut graph = Graph { name: "gather13".into(), ..Default::default() };
    graph.inputs.push(ValueInfo::new("x", DataType::Float64, vec![Dim::Symbol("batch".into()), Dim::Fixed(6)]));
    graph.initializers.insert("w".into(), f64s(&mut rng, &[6]));
    let r = f64s(&mut rng, &[2]);
    graph.nodes = vec![
        Node::new("scale", "Mul", &["x", "w"], &["h"]),
        // [3, 2·batch]: the second size is unknown to the loader.
        int_const("rows", vec![2], &[3, -1]),
        Node::new("split", "Reshape", &["h", "rows"], &["stack"]),
        // The middle row, as a vector, and rows 2 and 0 as a [2, 2·batch] matrix.
        int_const("one", vec![], &[1]),
        Node::new("pick", "Gather", &["stack", "one"], &["k"]).with_attr("axis", Attribute::Int(0)),
        int_const("two", vec![2], &[2, 0]),
        Node::new("pick2", "Gather", &["stack", "two"], &["qv"]).with_attr("axis", Attribute::Int(0)),
        Node::new("sq", "Mul", &["k", "k"], &["k2"]),
        Node::new("s1", "ReduceSum", &["k2"], &["l1"]).with_attr("keepdims", Attribute::Int(0)),
        int_const("cols", vec![2], &[-1, 2]),
        Node::new("pairs", "Reshape", &["qv", "cols"], &["qv2"]),
        Node::new("sq2", "Mul", &["qv2", "qv2"], &["qv3"]),
        Node::new("r", "Constant", &[], &["r"]).with_attr("value", Attribute::Tensor(r)),
        Node::new("wr", "Mul", &["qv3", "r"], &["qv4"]),
        Node::new("s2", "ReduceSum", &["qv4"], &["l2"]).with_attr("keepdims", Attribute::Int(0)),
        // Along axis 1 of [2·batch, 3]: the class-token pattern with an unknown first axis.
        Node::new("to_columns", "Transpose", &["stack"], &["stack_t"]).with_attr("perm", Attribute::Ints(vec![1, 0])),
        int_const("col", vec![], &[2]),
        Node::new("pick3", "Gather", &["stack_t", "col"], &["c"]).with_attr("axis", Attribute::Int(1)),
        Node::new("sq3", "Mul", &["c", "c"], &["c2"]),
        Node::new("s3", "ReduceSum", &["c2"], &["l3"]).with_attr("keepdims", Attribute::Int(0)),
        Node::new("sum12", "Add", &["l1", "l2"], &["l12"]),
        Node::new("total", "Add", &["l12", "l3"], &["objective"]),
    ];
    let x: Feed = ("x".into(), vec![3, 6], rng.values(18, -1.0, 1.0));
    check_with_an_unknown_size("Gather", graph, 13, ("stack", 1), x);
}

#[test]
fn batch_normalization_of_a_weight_with_statistics_computed_in_the_graph() {
    // timm's weight standardisation (NF-ResNets): F.batch_norm(w.reshape(1, out, -1), None,
    // None, training=True), which TorchScript exports as a training-mode
    // BatchNormalization whose "running" statistics are values computed in the graph, not
    // initializers. Its gradient is the batch statistics' one, and the training step has
    // no statistic to update (it had panicked looking for one among the initializers).
    let mut rng = Rng::new(22);
    let bn = Node::new("BatchNormalization", "BatchNormalization", &["w", "gain", "shift", "mean", "var"], &["out0"])
        .with_attr("training_mode", Attribute::Int(1))
        .with_attr("momentum", Attribute::Float(1.0));
    let stats = |v: f64| Input::Const(Tensor::from_f64_as(DataType::Float64, vec![4], &[v; 4]).unwrap());
    let inputs =
        |rng: &mut Rng| vec![param(rng, &[1, 4, 3]), param(rng, &[4]), param(rng, &[4]), stats(0.0), stats(1.0)];
    check(bn.clone(), inputs(&mut rng), 17);
    let (model, _) = projected_model(bn, inputs(&mut rng), 17, &mut Rng::new(5));
    let spec = edgefreeze_autodiff::TrainingSpec {
        loss: edgefreeze_autodiff::Loss::Output,
        optimizer: edgefreeze_autodiff::Optimizer::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 },
        frozen: vec![],
    };
    let step = edgefreeze_autodiff::training_step_graph(&model, &spec).unwrap();
    let names: Vec<&str> = step.graph.inputs.iter().map(|v| v.name.as_str()).collect();
    assert!(names.iter().all(|n| !n.starts_with("in3") && !n.starts_with("in4")), "{names:?}");
}

#[test]
fn instance_normalization_as_group_norm_exports_it() {
    // GroupNorm, as both PyTorch exporters write it: InstanceNormalization of the input
    // reshaped to [N, groups, -1] (here 2 groups of a 3×2×2 sample), scale and bias per
    // group; and a plain one over two spatial axes.
    let mut rng = Rng::new(23);
    let node = || op("InstanceNormalization").with_attr("epsilon", Attribute::Float(1e-5));
    check(node(), vec![param(&mut rng, &[2, 2, 6]), param(&mut rng, &[2]), param(&mut rng, &[2])], 17);
    check(node(), vec![param(&mut rng, &[2, 3, 2, 2]), param(&mut rng, &[3]), param(&mut rng, &[3])], 17);
}

#[test]
fn l2_norms_over_axes_with_a_zero_row() {
    // F.normalize's norm: over the last axis, kept (x / max(‖x‖, ε)); the gradient of a
    // norm that is 0 is 0, as PyTorch's, not 0 · ∞.
    let mut rng = Rng::new(24);
    let l2 = || op("ReduceL2");
    check(l2(), vec![param_away_from_zero(&mut rng, &[3, 4]), ints(&[-1])], 18);
    check(
        l2().with_attr("keepdims", Attribute::Int(0)),
        vec![param_away_from_zero(&mut rng, &[2, 3, 2]), ints(&[0, 2])],
        18,
    );
    check(l2().with_attr("axes", Attribute::Ints(vec![1])), vec![param_away_from_zero(&mut rng, &[2, 5])], 17);
    let zero_row = Input::Param(vec![2, 3], vec![0.0, 0.0, 0.0, 0.3, -0.4, 1.2]);
    let model = projected_model(l2().with_attr("axes", Attribute::Ints(vec![1])), vec![zero_row], 17, &mut rng).0;
    let grad = edgefreeze_autodiff::gradient_graph(&model, &edgefreeze_autodiff::Loss::Output, &[]).unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let mut s = edgefreeze_engine::load(
        &edgefreeze_engine::EngineKind::Ort(edgefreeze_engine::Provider::Cpu),
        &bytes,
        &Default::default(),
    )
    .unwrap();
    let x = edgefreeze_engine::Value::F64(
        ndarray::ArrayD::from_shape_vec(vec![2, 3], vec![0.0, 0.0, 0.0, 0.3, -0.4, 1.2]).unwrap(),
    );
    let out = s.run(&[("in0", &x)]).unwrap();
    let names = s.output_names().to_vec();
    let g = out[names.iter().position(|n| n == "grad.in0").unwrap()].as_f64().unwrap().clone();
    assert!(g.iter().all(|v| v.is_finite()), "{g:?}");
    assert!(g.iter().take(3).all(|&v| v == 0.0), "{g:?}");
}

#[test]
fn tiles_summed_back_over_their_copies() {
    // XCiT's positional encoding repeats a [1, C, H, W] map over the batch.
    let mut rng = Rng::new(25);
    check(op("Tile"), vec![param(&mut rng, &[2, 3]), ints(&[3, 2])], 17);
    check(op("Tile"), vec![param(&mut rng, &[1, 2, 2, 3]), ints(&[4, 1, 2, 1])], 17);
    check(op("Tile"), vec![param(&mut rng, &[2, 3]), ints(&[1, 1])], 17);
}

#[test]
fn slices_of_an_axis_of_unknown_size_scatter_back_at_run_time() {
    // An axis shape inference cannot size (here a reshape to another input's run-time
    // shape; XCiT's class-attention tokens, MobileViT's patches): the gradient of
    // ½·Σ slice(w)² is w inside the window and 0 outside, for bounds from either end.
    use edgefreeze_graph::ir::{Dim, Graph, Model, ValueInfo};
    let w: Vec<f64> = (0..10).map(|i| i as f64 * 0.5 - 2.0).collect();
    for (start, end) in [(1, i64::MAX), (0, 2), (-2, i64::MAX), (-3, -1), (2, 100), (4, 2)] {
        let mut graph = Graph { name: "slice_unknown".into(), ..Default::default() };
        graph.initializers.insert("w".into(), Tensor::from_f64_as(DataType::Float64, vec![2, 5], &w).unwrap());
        graph.inputs.push(ValueInfo::new("like", DataType::Float64, vec![Dim::Fixed(2), Dim::Symbol("n".into())]));
        let bound = |name: &str, v: i64| {
            Node::new(name, "Constant", &[], &[name])
                .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[v]).unwrap()))
        };
        graph.nodes = vec![
            Node::new("shape", "Shape", &["like"], &["target"]),
            Node::new("reshape", "Reshape", &["w", "target"], &["r"]),
            bound("starts", start),
            bound("ends", end),
            bound("axes", 1),
            Node::new("slice", "Slice", &["r", "starts", "ends", "axes"], &["s"]),
            Node::new("square", "Mul", &["s", "s"], &["sq"]),
            Node::new("sum", "ReduceSum", &["sq"], &["total"]).with_attr("keepdims", Attribute::Int(0)),
            Node::new("half", "Constant", &[], &["half"])
                .with_attr("value", Attribute::Tensor(Tensor::from_f64_as(DataType::Float64, vec![], &[0.5]).unwrap())),
            Node::new("loss", "Mul", &["total", "half"], &["out"]),
        ];
        graph.outputs.push(ValueInfo { name: "out".into(), dtype: None, shape: None, doc_string: String::new() });
        let model = edgefreeze_graph::prepare(Model {
            ir_version: 8,
            opset_imports: vec![(String::new(), 17)],
            graph,
            ..Default::default()
        })
        .unwrap();
        let g = gradient_of_w(&model, "like", &[2, 5], &[2, 5], &w);
        let clamp = |b: i64| if b < 0 { (b + 5).max(0) } else { b.min(5) };
        let (lo, hi) = (clamp(start), clamp(end));
        let expected: Vec<f64> =
            (0..10).map(|i| if (lo..hi).contains(&((i % 5) as i64)) { w[i] } else { 0.0 }).collect();
        assert_eq!(g.iter().copied().collect::<Vec<_>>(), expected, "[{start}:{end}]");
    }
}

#[test]
fn a_tile_over_the_batch_sums_its_copies_back() {
    // XCiT's positional map, `pos.repeat(B, 1)`: the count is the run-time batch, and the
    // gradient of ½·Σ tile(w)² is B·w.
    use edgefreeze_graph::ir::{Dim, Graph, Model, ValueInfo};
    let w = [0.5, -1.0, 2.0];
    let mut graph = Graph { name: "tile_batch".into(), ..Default::default() };
    graph.initializers.insert("w".into(), Tensor::from_f64_as(DataType::Float64, vec![1, 3], &w).unwrap());
    graph.inputs.push(ValueInfo::new("x", DataType::Float64, vec![Dim::Symbol("batch".into()), Dim::Fixed(3)]));
    let ints = |name: &str, v: &[i64]| {
        Node::new(name, "Constant", &[], &[name])
            .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![v.len()], v).unwrap()))
    };
    graph.nodes = vec![
        Node::new("shape", "Shape", &["x"], &["xs"]).with_attr("end", Attribute::Int(1)),
        ints("one", &[1]),
        Node::new("counts", "Concat", &["xs", "one"], &["repeats"]).with_attr("axis", Attribute::Int(0)),
        Node::new("tile", "Tile", &["w", "repeats"], &["t"]),
        Node::new("square", "Mul", &["t", "t"], &["sq"]),
        Node::new("sum", "ReduceSum", &["sq"], &["total"]).with_attr("keepdims", Attribute::Int(0)),
        Node::new("half", "Constant", &[], &["half"])
            .with_attr("value", Attribute::Tensor(Tensor::from_f64_as(DataType::Float64, vec![], &[0.5]).unwrap())),
        Node::new("loss", "Mul", &["total", "half"], &["out"]),
    ];
    graph.outputs.push(ValueInfo { name: "out".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() };
    let model = edgefreeze_graph::prepare(model).unwrap();
    let g = gradient_of_w(&model, "x", &[4, 3], &[1, 3], &w);
    assert_eq!(g.iter().copied().collect::<Vec<_>>(), vec![2.0, -4.0, 8.0]);
}

/// `grad.w` of `model`'s gradient graph on ONNX Runtime in float64, with parameter `w` at
/// `w_dims` and the data input `input`, zeros at `input_dims` (it sets run-time sizes only).
fn gradient_of_w(
    model: &edgefreeze_graph::ir::Model,
    input: &str,
    input_dims: &[usize],
    w_dims: &[usize],
    w: &[f64],
) -> ndarray::ArrayD<f64> {
    use edgefreeze_engine::{EngineKind, Provider, Value};
    let grad = edgefreeze_autodiff::gradient_graph(model, &edgefreeze_autodiff::Loss::Output, &[]).unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let mut s = edgefreeze_engine::load(&EngineKind::Ort(Provider::Cpu), &bytes, &Default::default()).unwrap();
    let data = Value::F64(ndarray::ArrayD::zeros(input_dims.to_vec()));
    let wv = Value::F64(ndarray::ArrayD::from_shape_vec(w_dims.to_vec(), w.to_vec()).unwrap());
    let names: Vec<String> = s.input_names().to_vec();
    let feeds: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), if n == input { &data } else { &wv })).collect();
    let out = s.run(&feeds).unwrap();
    let outputs = s.output_names().to_vec();
    out[outputs.iter().position(|n| n == "grad.w").unwrap()].as_f64().unwrap().clone()
}

#[test]
fn nearest_upsampling_sums_each_block_back() {
    // `F.interpolate(x, scale_factor=2)` / `nn.Upsample` (HRNet's fusion): nearest,
    // asymmetric coordinates, floor rounding; scales given (TorchScript, dynamo) or sizes.
    let mut rng = Rng::new(26);
    let nearest = || {
        Node::new("Resize", "Resize", &["x", "", "scales"], &["out0"])
            .with_attr("mode", Attribute::String(b"nearest".to_vec()))
            .with_attr("coordinate_transformation_mode", Attribute::String(b"asymmetric".to_vec()))
            .with_attr("nearest_mode", Attribute::String(b"floor".to_vec()))
    };
    let floats = |v: &[f64]| Input::Const(Tensor::from_f64_as(DataType::Float32, vec![v.len()], v).unwrap());
    check(
        nearest(),
        vec![
            param(&mut rng, &[1, 2, 2, 3]),
            Input::Const(Tensor::from_f32(vec![0], &[]).unwrap()),
            floats(&[1.0, 1.0, 2.0, 2.0]),
        ],
        17,
    );
    check(
        nearest(),
        vec![
            param(&mut rng, &[2, 1, 3, 2]),
            Input::Const(Tensor::from_f32(vec![0], &[]).unwrap()),
            floats(&[1.0, 1.0, 3.0, 1.0]),
        ],
        17,
    );
    let by_size = Node::new("Resize", "Resize", &["x", "", "", "sizes"], &["out0"])
        .with_attr("mode", Attribute::String(b"nearest".to_vec()))
        .with_attr("coordinate_transformation_mode", Attribute::String(b"asymmetric".to_vec()))
        .with_attr("nearest_mode", Attribute::String(b"floor".to_vec()));
    let empty = || Input::Const(Tensor::from_f32(vec![0], &[]).unwrap());
    check(by_size, vec![param(&mut rng, &[1, 2, 2, 2]), empty(), empty(), ints(&[1, 2, 4, 6])], 17);
}

/// A `Resize` node of the given mode attributes (scales as input 2, sizes as input 3).
fn resize_node(attributes: &[(&str, &str)], by_sizes: bool) -> Node {
    let inputs: &[&str] = if by_sizes { &["x", "", "", "sizes"] } else { &["x", "", "scales"] };
    let mut node = Node::new("Resize", "Resize", inputs, &["out0"]);
    for (name, value) in attributes {
        node = match *name {
            "cubic_coeff_a" => node.with_attr(name, Attribute::Float(value.parse().unwrap())),
            "exclude_outside" => node.with_attr(name, Attribute::Int(value.parse().unwrap())),
            _ => node.with_attr(name, Attribute::String(value.as_bytes().to_vec())),
        };
    }
    node
}

/// How a `Resize` gives its output size.
#[derive(Debug, Clone)]
enum Target {
    Scales(Vec<f64>),
    Sizes(Vec<i64>),
}
use Target::{Scales, Sizes};

/// A resize: its attributes, the input's dims and the output's scales or sizes.
type ResizeCase = (Vec<(&'static str, &'static str)>, Vec<usize>, Target);

/// The resizes PyTorch and other exporters write beyond whole-number nearest upsampling.
fn resize_cases() -> Vec<ResizeCase> {
    let linear = |c: &'static str| vec![("mode", "linear"), ("coordinate_transformation_mode", c)];
    vec![
        // F.interpolate(mode="bilinear", align_corners=False), both exporters' spellings.
        (linear("half_pixel"), vec![1, 2, 3, 4], Scales(vec![1.0, 1.0, 2.0, 2.0])),
        (linear("pytorch_half_pixel"), vec![2, 1, 3, 3], Sizes(vec![2, 1, 5, 7])),
        // align_corners=True; a downsampling.
        (linear("align_corners"), vec![1, 2, 4, 3], Sizes(vec![1, 2, 7, 2])),
        (linear("half_pixel"), vec![1, 1, 6, 4], Scales(vec![1.0, 1.0, 0.5, 0.5])),
        // bicubic (A = -0.75, as PyTorch), and ONNX's default A with exclude_outside.
        (
            vec![
                ("mode", "cubic"),
                ("coordinate_transformation_mode", "pytorch_half_pixel"),
                ("cubic_coeff_a", "-0.75"),
            ],
            vec![1, 2, 4, 4],
            Scales(vec![1.0, 1.0, 2.0, 2.0]),
        ),
        (
            vec![
                ("mode", "cubic"),
                ("coordinate_transformation_mode", "asymmetric"),
                ("cubic_coeff_a", "-0.5"),
                ("exclude_outside", "1"),
            ],
            vec![1, 1, 5, 3],
            Sizes(vec![1, 1, 8, 4]),
        ),
        // Nearest by a fraction, each rounding.
        (
            vec![
                ("mode", "nearest"),
                ("coordinate_transformation_mode", "half_pixel"),
                ("nearest_mode", "round_prefer_floor"),
            ],
            vec![1, 2, 4, 4],
            Scales(vec![1.0, 1.0, 1.5, 1.5]),
        ),
        (
            vec![("mode", "nearest"), ("coordinate_transformation_mode", "asymmetric"), ("nearest_mode", "ceil")],
            vec![1, 1, 5, 4],
            Sizes(vec![1, 1, 3, 6]),
        ),
        // 1-D (a sequence), and 3-D (a video) where a resized axis is neither of the last two.
        (linear("half_pixel"), vec![2, 3, 5], Scales(vec![1.0, 1.0, 2.0])),
        (linear("align_corners"), vec![1, 1, 2, 3, 2], Sizes(vec![1, 1, 4, 3, 3])),
    ]
}

/// Resizes whose float32 arithmetic (the engines', and ours) and float64 arithmetic (ONNX's
/// reference evaluator's) disagree: 6 → 4 (source 2 / 0.6666667 = 3 in float32, 2.9999999
/// in float64) and 10 · 0.7 = 7 output elements in float32 (6.9999999 in float64).
fn float32_resize_cases() -> Vec<ResizeCase> {
    vec![(
        vec![("mode", "nearest"), ("coordinate_transformation_mode", "asymmetric"), ("nearest_mode", "floor")],
        vec![1, 1, 6, 10],
        Scales(vec![1.0, 1.0, f64::from(4.0f32 / 6.0), f64::from(0.7f32)]),
    )]
}

#[test]
fn every_resize_mode_is_a_linear_map_whose_transpose_is_the_gradient() {
    let mut rng = Rng::new(27);
    for (attributes, dims, how) in resize_cases() {
        let empty = || Input::Const(Tensor::from_f32(vec![0], &[]).unwrap());
        let mut inputs = vec![param(&mut rng, &dims), empty()];
        match &how {
            Scales(scales) => {
                inputs.push(Input::Const(Tensor::from_f64_as(DataType::Float32, vec![scales.len()], scales).unwrap()))
            }
            Sizes(sizes) => {
                inputs.push(empty());
                inputs.push(ints(sizes));
            }
        }
        check(resize_node(&attributes, matches!(how, Sizes(_))), inputs, 19);
    }
}

#[test]
fn the_engines_resize_as_the_gradient_assumes() {
    // The gradient is the transpose of the matrices `resize_axes` builds; the forward is
    // the engine's own Resize. Both engines must compute those matrices' products.
    use edgefreeze_engine::{EngineKind, Provider, Value};
    use edgefreeze_graph::ir::{Dim, Graph, Model, ValueInfo};
    let mut failures = Vec::new();
    for (attributes, dims, how) in resize_cases().into_iter().chain(float32_resize_cases()) {
        let node = resize_node(&attributes, matches!(how, Sizes(_)));
        let mut graph = Graph { name: "resize".into(), ..Default::default() };
        graph.inputs.push(ValueInfo::new("x", DataType::Float32, dims.iter().map(|&d| Dim::Fixed(d)).collect()));
        let (scales, sizes) = match &how {
            Scales(s) => (Some(s.clone()), None),
            Sizes(s) => (None, Some(s.iter().map(|&n| Some(n)).collect())),
        };
        // Constants, as the exporters write them (a float initializer would be a parameter).
        let (name, value) = match &how {
            Scales(s) => ("scales", Tensor::from_f64_as(DataType::Float32, vec![s.len()], s).unwrap()),
            Sizes(s) => ("sizes", Tensor::from_i64(vec![s.len()], s).unwrap()),
        };
        graph.nodes.push(Node::new(name, "Constant", &[], &[name]).with_attr("value", Attribute::Tensor(value)));
        graph.nodes.push(node.clone());
        graph.outputs.push(ValueInfo { name: "out0".into(), dtype: None, shape: None, doc_string: String::new() });
        let model = edgefreeze_graph::prepare(Model {
            ir_version: 9,
            opset_imports: vec![(String::new(), 19)],
            graph,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{attributes:?}: {e}"));
        let shape: Vec<Dim> = dims.iter().map(|&d| Dim::Fixed(d)).collect();
        let axes = edgefreeze_graph::infer::resize_axes(&node, &shape, scales, sizes).unwrap();
        // The expected output: each axis's matrix applied in turn (in f64).
        let n: usize = dims.iter().product();
        let x: Vec<f64> = (0..n).map(|i| ((i * 37 % 29) as f64 - 14.0) / 7.0).collect();
        let mut expected = ndarray::ArrayD::from_shape_vec(dims.clone(), x.clone()).unwrap();
        for (a, axis) in axes.iter().enumerate() {
            let (output, input, w) = axis.matrix(dims[a]).unwrap();
            let mut out_dims = expected.shape().to_vec();
            out_dims[a] = output;
            let mut next = ndarray::ArrayD::<f64>::zeros(out_dims);
            for (index, v) in next.indexed_iter_mut() {
                let mut from = index.clone();
                *v = (0..input)
                    .map(|i| {
                        from[a] = i;
                        w[index[a] * input + i] * expected[&from]
                    })
                    .sum();
            }
            expected = next;
        }
        let value =
            Value::F32(ndarray::ArrayD::from_shape_vec(dims.clone(), x.iter().map(|&v| v as f32).collect()).unwrap());
        let bytes = edgefreeze_graph::save::encode_model(&model);
        for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
            let got =
                edgefreeze_engine::load(&kind, &bytes, &Default::default()).and_then(|mut s| s.run(&[("x", &value)]));
            match got {
                Ok(out) => {
                    let got = out[0].as_f32().unwrap();
                    let worst =
                        got.iter().zip(expected.iter()).map(|(g, e)| (f64::from(*g) - e).abs()).fold(0.0, f64::max);
                    if got.shape() != expected.shape() || worst > 1e-5 {
                        failures.push(format!("{kind} {attributes:?} {dims:?}: {:?} off by {worst:.2e}", got.shape()));
                    }
                }
                Err(e) => failures.push(format!("{kind} {attributes:?} {dims:?}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn resizes_the_table_does_not_take_are_refused_naming_the_mode() {
    let crop = Node::new("up", "Resize", &["x", "", "scales"], &["y"])
        .with_attr("mode", Attribute::String(b"linear".to_vec()))
        .with_attr("coordinate_transformation_mode", Attribute::String(b"tf_crop_and_resize".to_vec()));
    let mut graph = edgefreeze_graph::ir::Graph { name: "crop".into(), ..Default::default() };
    graph.inputs.push(edgefreeze_graph::ir::ValueInfo::new(
        "x",
        DataType::Float32,
        vec![
            edgefreeze_graph::ir::Dim::Fixed(1),
            edgefreeze_graph::ir::Dim::Fixed(1),
            edgefreeze_graph::ir::Dim::Fixed(2),
            edgefreeze_graph::ir::Dim::Fixed(2),
        ],
    ));
    graph.initializers.insert("scales".into(), Tensor::from_f32(vec![4], &[1.0, 1.0, 2.0, 2.0]).unwrap());
    graph.nodes.push(crop);
    graph.outputs.push(edgefreeze_graph::ir::ValueInfo {
        name: "y".into(),
        dtype: None,
        shape: None,
        doc_string: String::new(),
    });
    let model = edgefreeze_graph::ir::Model {
        ir_version: 8,
        opset_imports: vec![(String::new(), 17)],
        graph,
        ..Default::default()
    };
    let err = edgefreeze_graph::prepare(model).unwrap_err().to_string();
    assert!(err.contains("\"up\"") && err.contains("\"tf_crop_and_resize\""), "{err}");
}

#[test]
fn a_resize_gradient_behind_a_mean_is_the_same_on_both_engines() {
    // A mean right after the resize makes dY a broadcast: along one resized axis (a mean
    // over the width), or both. tract's optimiser rewrites a product of a broadcast; the
    // gradient must come out as ONNX Runtime's either way.
    use edgefreeze_engine::{EngineKind, Provider, Value};
    use edgefreeze_graph::ir::{Dim, Graph, Model, ValueInfo};
    for axes in [vec![3i64], vec![2, 3], vec![2]] {
        let mut graph = Graph { name: "resize_mean".into(), ..Default::default() };
        graph.inputs.push(ValueInfo::new(
            "x",
            DataType::Float32,
            vec![Dim::Symbol("batch".into()), Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(4)],
        ));
        let p: Vec<f32> = (0..24).map(|i| 0.5 + i as f32 / 24.0).collect();
        graph.initializers.insert("p".into(), Tensor::from_f32(vec![1, 2, 3, 4], &p).unwrap());
        let scales = Tensor::from_f32(vec![4], &[1.0, 1.0, 2.0, 1.5]).unwrap();
        graph
            .nodes
            .push(Node::new("scales", "Constant", &[], &["scales"]).with_attr("value", Attribute::Tensor(scales)));
        graph.nodes.push(Node::new("scale", "Mul", &["x", "p"], &["xp"]));
        graph.nodes.push(
            Node::new("up", "Resize", &["xp", "", "scales"], &["up"])
                .with_attr("mode", Attribute::String(b"linear".to_vec()))
                .with_attr("coordinate_transformation_mode", Attribute::String(b"half_pixel".to_vec())),
        );
        graph.nodes.push(
            Node::new("mean", "ReduceMean", &["up"], &["m"])
                .with_attr("axes", Attribute::Ints(axes.clone()))
                .with_attr("keepdims", Attribute::Int(1)),
        );
        // A weighting that differs along every kept position, so that a wrong row shows.
        graph.nodes.push(Node::new("square", "Mul", &["m", "m"], &["m2"]));
        graph.nodes.push(Node::new("sum", "ReduceSum", &["m2"], &["y"]).with_attr("keepdims", Attribute::Int(0)));
        graph.outputs.push(ValueInfo { name: "y".into(), dtype: None, shape: None, doc_string: String::new() });
        let model = edgefreeze_graph::prepare(Model {
            ir_version: 8,
            opset_imports: vec![(String::new(), 17)],
            graph,
            ..Default::default()
        })
        .unwrap();
        let grad = edgefreeze_autodiff::gradient_graph(&model, &edgefreeze_autodiff::Loss::Output, &[]).unwrap();
        let bytes = edgefreeze_graph::save::encode_model(&grad);
        let x: Vec<f32> = (0..48).map(|i| ((i * 13 % 17) as f32 - 8.0) / 4.0).collect();
        let x = Value::F32(ndarray::ArrayD::from_shape_vec(vec![2, 2, 3, 4], x).unwrap());
        let pv = Value::F32(ndarray::ArrayD::from_shape_vec(vec![1, 2, 3, 4], p).unwrap());
        let mut results = Vec::new();
        for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
            let mut s = edgefreeze_engine::load(&kind, &bytes, &Default::default()).unwrap();
            let names = s.input_names().to_vec();
            let feeds: Vec<(&str, &Value)> =
                names.iter().map(|n| (n.as_str(), if n == "x" { &x } else { &pv })).collect();
            let out = s.run(&feeds).unwrap_or_else(|e| panic!("{kind}: {e}"));
            let at = s.output_names().iter().position(|n| n == "grad.p").unwrap();
            results.push(out[at].as_f32().unwrap().iter().copied().collect::<Vec<f32>>());
        }
        let worst = results[0].iter().zip(&results[1]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        let norm = results[0].iter().map(|a| a.abs()).fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5 * norm.max(1.0),
            "mean over {axes:?}: ONNX Runtime {:?}, tract {:?}",
            results[0],
            results[1]
        );
    }
}
