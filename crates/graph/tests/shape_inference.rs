//! Shape inference and constant folding on hand-built graphs, one op family at a time.

mod common;

use common::*;
use edgefreeze_graph::ir::{Attribute, Node};
use edgefreeze_graph::prepare;

#[test]
fn conv_handles_strides_groups_dilations_and_same_padding() {
    let mut m = model(
        17,
        vec![input("x", "batch 8 15 15")],
        vec![
            Node::new("grouped", "Conv", &["x", "w1"], &["a"])
                .with_attr("group", Attribute::Int(4))
                .with_attr("strides", ints_attr(&[2, 2]))
                .with_attr("pads", ints_attr(&[1, 1, 1, 1])),
            Node::new("same", "Conv", &["a", "w2", "b2"], &["b"])
                .with_attr("auto_pad", Attribute::String(b"SAME_UPPER".to_vec()))
                .with_attr("strides", ints_attr(&[2, 2])),
            Node::new("dilated", "Conv", &["b", "w3"], &["c"]).with_attr("dilations", ints_attr(&[2, 2])),
        ],
        &["c"],
    );
    weight(&mut m, "w1", &[16, 2, 3, 3]);
    weight(&mut m, "w2", &[16, 1, 3, 3]);
    weight(&mut m, "b2", &[16]);
    m.graph.nodes[1].attributes.insert("group".into(), Attribute::Int(16));
    weight(&mut m, "w3", &[4, 16, 2, 2]);
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "a"), "batch×16×8×8");
    assert_eq!(shape_of(&m, "b"), "batch×16×4×4");
    assert_eq!(shape_of(&m, "c"), "batch×4×2×2");
}

#[test]
fn conv_channel_mismatch_names_the_node() {
    let mut m =
        model(17, vec![input("x", "batch 3 8 8")], vec![Node::new("stem", "Conv", &["x", "w"], &["y"])], &["y"]);
    weight(&mut m, "w", &[8, 4, 3, 3]);
    let err = prepare(m).unwrap_err().to_string();
    assert!(err.contains("\"stem\"") && err.contains("3 channels"), "{err}");
}

#[test]
fn pooling_with_ceil_mode_and_global_pooling() {
    let m = model(
        17,
        vec![input("x", "batch 2 7 7")],
        vec![
            Node::new("pool", "MaxPool", &["x"], &["p"])
                .with_attr("kernel_shape", ints_attr(&[2, 2]))
                .with_attr("strides", ints_attr(&[2, 2]))
                .with_attr("ceil_mode", Attribute::Int(1)),
            Node::new("avg", "AveragePool", &["p"], &["q"]).with_attr("kernel_shape", ints_attr(&[3, 3])),
            Node::new("gap", "GlobalAveragePool", &["q"], &["r"]),
        ],
        &["r"],
    );
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "p"), "batch×2×4×4");
    assert_eq!(shape_of(&m, "q"), "batch×2×2×2");
    assert_eq!(shape_of(&m, "r"), "batch×2×1×1");
}

#[test]
fn gemm_and_batched_broadcast_matmul() {
    let mut m = model(
        17,
        vec![input("x", "batch 5"), input("s", "batch 4 6 5")],
        vec![
            Node::new("fc", "Gemm", &["x", "w", "b"], &["y"]).with_attr("transB", Attribute::Int(1)),
            Node::new("mm", "MatMul", &["s", "k"], &["z"]),
            Node::new("vec", "MatMul", &["z", "v"], &["u"]),
        ],
        &["y", "u"],
    );
    weight(&mut m, "w", &[7, 5]);
    weight(&mut m, "b", &[7]);
    weight(&mut m, "k", &[5, 3]);
    weight(&mut m, "v", &[3]);
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "y"), "batch×7");
    assert_eq!(shape_of(&m, "z"), "batch×4×6×3");
    assert_eq!(shape_of(&m, "u"), "batch×4×6");
}

#[test]
fn exporter_shape_chain_folds_and_reshape_keeps_the_symbolic_batch() {
    // What PyTorch emits for x.view(x.size(0), -1) and for a static size lookup.
    let m = model(
        17,
        vec![input("x", "batch 3 4 4")],
        vec![
            Node::new("shape", "Shape", &["x"], &["s"]),
            scalar("zero", 0),
            scalar("one", 1),
            Node::new("batch", "Gather", &["s", "zero"], &["n"]),
            Node::new("channels", "Gather", &["s", "one"], &["c"]),
            ints("axes", &[0]),
            Node::new("n1", "Unsqueeze", &["n", "axes"], &["n_1d"]),
            Node::new("c1", "Unsqueeze", &["c", "axes"], &["c_1d"]),
            ints("minus_one", &[-1]),
            Node::new("target", "Concat", &["n_1d", "minus_one"], &["t"]).with_attr("axis", Attribute::Int(0)),
            Node::new("flat", "Reshape", &["x", "t"], &["y"]),
            Node::new("static", "Concat", &["c_1d", "minus_one"], &["t2"]).with_attr("axis", Attribute::Int(0)),
            Node::new("per_channel", "Reshape", &["x", "t2"], &["z"]),
        ],
        &["y", "z"],
    );
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "y"), "batch×48");
    assert_eq!(shape_of(&m, "z"), "3×?");
    // The static chain became one constant; the batch chain stays (its value is only known at run time).
    let t2 = m.graph.constant("t2").expect("Shape→Gather→Unsqueeze→Concat folded");
    assert_eq!(t2.to_i64_vec().unwrap(), vec![3, -1]);
    assert!(m.graph.nodes.iter().all(|n| n.name != "channels"), "folded nodes are removed");
    assert!(m.graph.constant("t").is_none());
}

#[test]
fn layout_ops_follow_the_onnx_rules() {
    let m = model(
        13,
        vec![input("x", "batch 6 10")],
        vec![
            ints("starts", &[-1, 1]),
            ints("ends", &[i64::MIN, 9]),
            ints("axes", &[2, 1]),
            ints("steps", &[-2, 3]),
            Node::new("slice", "Slice", &["x", "starts", "ends", "axes", "steps"], &["s"]),
            ints("sizes", &[2, 4]),
            Node::new("split", "Split", &["x", "sizes"], &["a", "b"]).with_attr("axis", Attribute::Int(1)),
            ints("unsq", &[0, -1]),
            Node::new("unsqueeze", "Unsqueeze", &["b", "unsq"], &["u"]),
            Node::new("transpose", "Transpose", &["u"], &["t"]).with_attr("perm", ints_attr(&[1, 4, 0, 3, 2])),
            Node::new("flatten", "Flatten", &["t"], &["f"]).with_attr("axis", Attribute::Int(2)),
            ints("red", &[1]),
            Node::new("sum", "ReduceSum", &["x", "red"], &["r"]).with_attr("keepdims", Attribute::Int(0)),
            Node::new("mean", "ReduceMean", &["x"], &["rm"]).with_attr("axes", ints_attr(&[-1])),
        ],
        &["s", "a", "f", "r", "rm"],
    );
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "s"), "batch×2×5");
    assert_eq!(shape_of(&m, "a"), "batch×2×10");
    assert_eq!(shape_of(&m, "u"), "1×batch×4×10×1");
    assert_eq!(shape_of(&m, "t"), "batch×1×1×10×4");
    assert_eq!(shape_of(&m, "f"), "batch×40");
    assert_eq!(shape_of(&m, "r"), "batch×10");
    assert_eq!(shape_of(&m, "rm"), "batch×6×1");
}

#[test]
fn reduce_mean_takes_axes_as_an_input_from_opset_18() {
    let m = model(
        18,
        vec![input("x", "batch 6 10")],
        vec![ints("axes", &[1]), Node::new("mean", "ReduceMean", &["x", "axes"], &["y"])],
        &["y"],
    );
    assert_eq!(shape_of(&prepare(m).unwrap(), "y"), "batch×1×10");
}

#[test]
fn normalisation_and_embedding_shapes() {
    let mut m = model(
        17,
        vec![
            input("x", "batch 4 5 5"),
            edgefreeze_graph::ValueInfo::new(
                "ids",
                edgefreeze_graph::DataType::Int64,
                vec![edgefreeze_graph::Dim::Symbol("batch".into()), edgefreeze_graph::Dim::Fixed(7)],
            ),
        ],
        vec![
            Node::new("bn", "BatchNormalization", &["x", "g", "b", "mean", "var"], &["y"]),
            Node::new("emb", "Gather", &["table", "ids"], &["e"]),
            Node::new("ln", "LayerNormalization", &["e", "lg", "lb"], &["l"]),
            Node::new("sm", "Softmax", &["l"], &["p"]),
        ],
        &["y", "p"],
    );
    for name in ["g", "b", "mean", "var"] {
        weight(&mut m, name, &[4]);
    }
    weight(&mut m, "table", &[50, 8]);
    weight(&mut m, "lg", &[8]);
    weight(&mut m, "lb", &[8]);
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "y"), "batch×4×5×5");
    assert_eq!(shape_of(&m, "e"), "batch×7×8");
    assert_eq!(shape_of(&m, "p"), "batch×7×8");
}

/// Opsets 9 to 13 give a training-mode BatchNormalization five outputs (TorchScript's
/// opset-13 training export writes them all); from opset 14 on, five are an error that
/// names the node.
#[test]
fn batch_normalization_with_five_outputs_before_opset_14_only() {
    let bn = |opset| {
        let mut m = model(
            opset,
            vec![input("x", "batch 4 5 5")],
            vec![Node::new("bn", "BatchNormalization", &["x", "g", "b", "mean", "var"], &["y", "m", "v", "sm", "sv"])],
            &["y"],
        );
        for name in ["g", "b", "mean", "var"] {
            weight(&mut m, name, &[4]);
        }
        prepare(m)
    };
    let m = bn(13).unwrap();
    assert_eq!(shape_of(&m, "y"), "batch×4×5×5");
    for name in ["m", "v", "sm", "sv"] {
        assert_eq!(shape_of(&m, name), "4");
    }
    let err = bn(17).unwrap_err().to_string();
    assert!(err.contains("\"bn\"") && err.contains("opset 14") && err.contains("5 outputs"), "{err}");
}

#[test]
fn unsorted_graph_is_sorted_on_import() {
    let m = model(
        17,
        vec![input("x", "batch 3")],
        vec![Node::new("second", "Sigmoid", &["h"], &["y"]), Node::new("first", "Relu", &["x"], &["h"])],
        &["y"],
    );
    let m = prepare(m).unwrap();
    let names: Vec<&str> = m.graph.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
}

#[test]
fn exporter_tied_initializers_are_untied_on_import() {
    // TorchScript writes a second zero-valued parameter as Identity(first one).
    let mut m = model(
        17,
        vec![input("x", "batch 2 3 3")],
        vec![
            Node::new("tie", "Identity", &["bn.bias"], &["bn.running_mean"]),
            Node::new(
                "bn",
                "BatchNormalization",
                &["x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                &["y"],
            ),
        ],
        &["y"],
    );
    for name in ["bn.weight", "bn.bias", "bn.running_var"] {
        weight(&mut m, name, &[2]);
    }
    let m = prepare(m).unwrap();
    assert!(m.graph.nodes.iter().all(|n| n.op_type != "Identity"));
    assert_eq!(m.graph.initializers["bn.running_mean"], m.graph.initializers["bn.bias"]);
    let params = edgefreeze_graph::analysis::parameter_names(&m.graph);
    assert_eq!(params, ["bn.weight", "bn.bias"]);
}

#[test]
fn einsum_shapes_flops_and_errors_naming_the_node() {
    let attention = |eq: &str| Attribute::String(eq.as_bytes().to_vec());
    let m = model(
        17,
        vec![input("q", "batch 4 2 3 8"), input("k", "batch 4 2 5 8")],
        vec![
            Node::new("scores", "Einsum", &["q", "k"], &["s"])
                .with_attr("equation", attention("B G H I D, B G H J D -> B G H I J")),
            Node::new("mix", "Einsum", &["s", "k"], &["o"]).with_attr("equation", attention("bghij,bghjd")),
        ],
        &["o"],
    );
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "s"), "batch×4×2×3×5");
    // Implicit output: the letters used once, in alphabetical order (d, i): b, g, h and j
    // appear twice, so they are summed.
    assert_eq!(shape_of(&m, "o"), "8×3");
    let inference = edgefreeze_graph::infer::infer(&m.graph, 17).unwrap();
    // Per sample: a multiply-add at each point of the 4·2·3·5·8 index space.
    let flops = edgefreeze_graph::analysis::node_flops(&m.graph.nodes[0], &inference).unwrap();
    assert_eq!(flops, 2 * 4 * 2 * 3 * 5 * 8);
    let bad = model(
        17,
        vec![input("q", "batch 4 2 3 8"), input("k", "batch 4 2 5 7")],
        vec![Node::new("scores", "Einsum", &["q", "k"], &["s"]).with_attr("equation", attention("bghid,bghjd->bghij"))],
        &["s"],
    );
    let err = prepare(bad).unwrap_err().to_string();
    assert!(err.contains("\"scores\"") && err.contains("subscript d"), "{err}");
}
