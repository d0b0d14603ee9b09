//! Patterns PyTorch's exporters write in training-mode exports, which the import must
//! turn into what the rest of the toolchain understands.

mod common;

use common::*;
use edgefreeze_graph::ir::{Attribute, Node};
use edgefreeze_graph::prepare;

#[test]
fn integer_shape_arithmetic_folds_to_constants() {
    // TorchScript's TransformerEncoderLayer: Slice ends = Reshape(Mod(Add(C, C), C)).
    let nodes = vec![
        scalar("a", 5),
        scalar("b", 9),
        scalar("m", 4),
        Node::new("add", "Add", &["a", "b"], &["sum"]),
        Node::new("mod", "Mod", &["sum", "m"], &["rem"]),
        ints("shape", &[1]),
        Node::new("reshape", "Reshape", &["rem", "shape"], &["end"]),
        ints("start", &[0]),
        ints("axes", &[1]),
        Node::new("slice", "Slice", &["x", "start", "end", "axes"], &["y"]),
    ];
    let model = prepare(model(17, vec![input("x", "batch 6 3")], nodes, &["y"])).unwrap();
    // (5 + 9) mod 4 = 2 elements of axis 1.
    assert_eq!(shape_of(&model, "y"), "batch×2×3");
    assert!(model.graph.nodes.iter().all(|n| n.op_type != "Mod"), "the Mod was folded");
}

#[test]
fn greater_or_equal_and_less_or_equal_fold_in_shape_arithmetic() {
    // Dynamo writes `x >= y` on shape values (VGG's adaptive pooling) as GreaterOrEqual.
    let nodes = vec![
        scalar("three", 3),
        scalar("four", 4),
        scalar("five", 5),
        scalar("two", 2),
        scalar("one", 1),
        scalar("ten", 10),
        Node::new("ge", "GreaterOrEqual", &["three", "three"], &["ge_true"]),
        Node::new("pick_ge", "Where", &["ge_true", "two", "five"], &["from_ge"]),
        Node::new("le", "LessOrEqual", &["five", "four"], &["le_false"]),
        Node::new("pick_le", "Where", &["le_false", "ten", "one"], &["from_le"]),
        Node::new("add", "Add", &["from_ge", "from_le"], &["sum"]),
        ints("shape", &[1]),
        Node::new("reshape", "Reshape", &["sum", "shape"], &["end"]),
        ints("start", &[0]),
        ints("axes", &[1]),
        Node::new("slice", "Slice", &["x", "start", "end", "axes"], &["y"]),
    ];
    let model = prepare(model(17, vec![input("x", "batch 6")], nodes, &["y"])).unwrap();
    // (3 >= 3 ? 2 : 5) + (5 <= 4 ? 10 : 1) = 3 elements of axis 1.
    assert_eq!(shape_of(&model, "y"), "batch×3");
    assert!(model.graph.nodes.iter().all(|n| !n.op_type.ends_with("OrEqual")), "both were folded");
}

#[test]
fn mod_follows_the_divisor_sign_unless_fmod() {
    let nodes = |fmod: i64| {
        vec![
            scalar("a", -7),
            scalar("m", 3),
            Node::new("mod", "Mod", &["a", "m"], &["rem"]).with_attr("fmod", Attribute::Int(fmod)),
            // -7 mod 3 is 2 (Python's %), C's fmod gives -1: a Slice from the end shows which.
            ints("shape", &[1]),
            Node::new("reshape", "Reshape", &["rem", "shape"], &["end"]),
            ints("start", &[0]),
            ints("axes", &[1]),
            Node::new("slice", "Slice", &["x", "start", "end", "axes"], &["y"]),
        ]
    };
    let python = prepare(model(17, vec![input("x", "batch 6")], nodes(0), &["y"])).unwrap();
    assert_eq!(shape_of(&python, "y"), "batch×2");
    let c = prepare(model(17, vec![input("x", "batch 6")], nodes(1), &["y"])).unwrap();
    assert_eq!(shape_of(&c, "y"), "batch×5");
}

#[test]
fn pads_computed_through_a_transposed_constant_fold() {
    // Swin's TorchScript export: pads = Cast(Reshape(Transpose(Slice(Reshape(...))))).
    let nodes = vec![
        ints("p", &[0, 0, 1, 2]),
        ints("pair", &[-1, 2]),
        Node::new("r", "Reshape", &["p", "pair"], &["p2"]),
        Node::new("t", "Transpose", &["p2"], &["pt"]).with_attr("perm", Attribute::Ints(vec![1, 0])),
        ints("flat", &[-1]),
        Node::new("r2", "Reshape", &["pt", "flat"], &["pads64"]),
        Node::new("cast", "Cast", &["pads64"], &["pads"]).with_attr("to", Attribute::Int(7)),
        Node::new("pad", "Pad", &["x", "pads"], &["y"]),
    ];
    let model = prepare(model(17, vec![input("x", "batch 3")], nodes, &["y"])).unwrap();
    // pads [[0, 0], [1, 2]]ᵀ = [0, 1, 0, 2]: axis 1 grows by 1 + 2.
    assert_eq!(shape_of(&model, "y"), "batch×6");
}

fn chunked(split: Option<Node>, keepdims: i64, positions: &[i64]) -> edgefreeze_graph::Model {
    let mut nodes = Vec::new();
    let mut inputs = vec!["x"];
    if let Some(s) = split {
        nodes.push(s);
        inputs.push("split");
    }
    nodes.push(
        Node::new("chunk", "SplitToSequence", &inputs, &["seq"])
            .with_attr("axis", Attribute::Int(1))
            .with_attr("keepdims", Attribute::Int(keepdims)),
    );
    let mut outputs = Vec::new();
    for (k, &p) in positions.iter().enumerate() {
        nodes.push(scalar(&format!("pos{k}"), p));
        nodes.push(Node::new(format!("at{k}"), "SequenceAt", &["seq", &format!("pos{k}")], &[&format!("item{k}")]));
        outputs.push(format!("item{k}"));
    }
    let refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    prepare(model(17, vec![input("x", "batch 5 3")], nodes, &refs)).unwrap()
}

#[test]
fn torch_chunk_sequences_become_a_split() {
    // torch.chunk/split as dynamo exports them: a scalar chunk size, positions as constants.
    let model = chunked(Some(scalar("split", 2)), 1, &[0, -1]);
    assert!(model.graph.nodes.iter().all(|n| !n.op_type.starts_with("Sequence") && n.op_type != "SplitToSequence"));
    assert_eq!(shape_of(&model, "item0"), "batch×2×3");
    assert_eq!(shape_of(&model, "item1"), "batch×1×3", "the last chunk holds the remainder");
    // Explicit sizes.
    let model = chunked(Some(ints("split", &[1, 4])), 1, &[1]);
    assert_eq!(shape_of(&model, "item0"), "batch×4×3");
    // No split: size-1 pieces, squeezed when keepdims is 0.
    let model = chunked(None, 0, &[3]);
    assert_eq!(shape_of(&model, "item0"), "batch×3");
}

#[test]
fn a_split_into_listed_sizes_needs_no_known_axis_size() {
    // TinyViT's `torch.split(x, [a, b], dim)` from dynamo, on an axis shape inference
    // cannot size: the listed sizes are the pieces; equal chunks would need the size.
    let sequence_of = |split: Node| {
        let nodes = vec![
            split,
            Node::new("chunk", "SplitToSequence", &["x", "split"], &["seq"]).with_attr("axis", Attribute::Int(1)),
            scalar("first", 0),
            Node::new("at", "SequenceAt", &["seq", "first"], &["item"]),
        ];
        prepare(model(17, vec![input("x", "batch n 3")], nodes, &["item"]))
    };
    let m = sequence_of(ints("split", &[2, 3])).unwrap();
    assert_eq!(shape_of(&m, "item"), "batch×2×3");
    let err = sequence_of(scalar("split", 2)).unwrap_err().to_string();
    assert!(err.contains("\"chunk\"") && err.contains("size known at load time"), "{err}");
}

#[test]
fn a_sequence_position_not_known_at_load_time_is_an_error_naming_the_node() {
    let nodes = vec![
        Node::new("chunk", "SplitToSequence", &["x"], &["seq"]).with_attr("axis", Attribute::Int(1)),
        Node::new("at", "SequenceAt", &["seq", "where"], &["item"]),
    ];
    let mut inputs = vec![input("x", "batch 5 3")];
    inputs.push(edgefreeze_graph::ValueInfo::new("where", edgefreeze_graph::DataType::Int64, vec![]));
    let err = prepare(model(17, inputs, nodes, &["item"])).unwrap_err().to_string();
    assert!(err.contains("\"at\"") && err.contains("position"), "{err}");
}

/// An embedding (a MatMul), then two pre-norm residual blocks, `x + MatMul(LN(x), W)`, with LayerNormalization spelled
/// out as TorchScript writes it before opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add,
/// Sqrt, Div, then Mul and Add of its weight and bias) or as the one op.
fn pre_norm_blocks(opset: i64) -> edgefreeze_graph::Model {
    let float = |name: &str, v: f32| {
        Node::new(name, "Constant", &[], &[name])
            .with_attr("value", Attribute::Tensor(edgefreeze_graph::Tensor::from_f32(vec![], &[v]).unwrap()))
    };
    let mut nodes = vec![Node::new("embed", "MatMul", &["x", "we"], &["e"])];
    for (k, x) in ["e", "r0"].iter().enumerate() {
        let n = |s: &str| format!("{s}{k}");
        if opset >= 17 {
            nodes.push(
                Node::new(n("ln"), "LayerNormalization", &[x, &n("g"), &n("b")], &[&n("o")])
                    .with_attr("axis", Attribute::Int(-1)),
            );
        } else {
            let mean = |name: &str, input: &str, out: &str| {
                Node::new(name, "ReduceMean", &[input], &[out]).with_attr("axes", ints_attr(&[-1]))
            };
            nodes.extend([
                mean(&n("mean"), x, &n("mu")),
                Node::new(n("sub"), "Sub", &[x, &n("mu")], &[&n("d")]),
                float(&n("two"), 2.0),
                Node::new(n("pow"), "Pow", &[&n("d"), &n("two")], &[&n("d2")]),
                mean(&n("var"), &n("d2"), &n("v")),
                float(&n("eps"), 1e-5),
                Node::new(n("addeps"), "Add", &[&n("v"), &n("eps")], &[&n("ve")]),
                Node::new(n("sqrt"), "Sqrt", &[&n("ve")], &[&n("s")]),
                Node::new(n("div"), "Div", &[&n("d"), &n("s")], &[&n("nrm")]),
                Node::new(n("mul"), "Mul", &[&n("nrm"), &n("g")], &[&n("m")]),
                Node::new(n("addb"), "Add", &[&n("m"), &n("b")], &[&n("o")]),
            ]);
        }
        nodes.push(Node::new(n("proj"), "MatMul", &[&n("o"), &n("w")], &[&n("h")]));
        nodes.push(Node::new(n("res"), "Add", &[x, &n("h")], &[&n("r")]));
    }
    let mut m = model(opset, vec![input("x", "batch 4 8")], nodes, &["r1"]);
    weight(&mut m, "we", &[8, 8]);
    for k in 0..2 {
        weight(&mut m, &format!("g{k}"), &[8]);
        weight(&mut m, &format!("b{k}"), &[8]);
        weight(&mut m, &format!("w{k}"), &[8, 8]);
    }
    prepare(m).unwrap()
}

#[test]
fn a_spelled_out_layer_normalization_starts_its_layer() {
    // The block's first anchor is its MatMul, where the stream and the normalised value
    // both cross; the layer starts where the stream alone does, before the ReduceMean, as
    // it starts at the LayerNormalization op.
    for opset in [13, 17] {
        let m = pre_norm_blocks(opset);
        let a = edgefreeze_graph::analyse(&m).unwrap();
        let names: Vec<&str> = a.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(a.layers.len(), 3, "opset {opset}: {names:?}");
        assert_eq!((a.cuts[0].tensor.as_str(), a.cuts[1].tensor.as_str()), ("e", "r0"), "opset {opset}");
        let params = |k: usize| {
            let mut p = a.layers[k].parameter_names.clone();
            p.sort();
            p
        };
        assert_eq!(params(0), ["we"], "opset {opset}");
        assert_eq!(params(1), ["b0", "g0", "w0"], "opset {opset}");
        assert_eq!(params(2), ["b1", "g1", "w1"], "opset {opset}");
    }
}

#[test]
fn a_graph_input_read_behind_a_cut_is_its_side_input() {
    // A padding mask made from the input, read behind the boundary between the two
    // MatMuls: the cut is kept, and the part behind it is given the input beside the
    // activation (`side_inputs`) and recomputes the mask, wherever the mask was computed.
    // Reading only the input's shape (the batch size of a late Reshape) needs no input. A
    // value drawn at random from the input (Dropout) cannot be recomputed: it crosses, and
    // the embedding's output is no cut.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Late {
        MaskBehind,
        MaskInFront,
        Shape,
        Dropout,
    }
    let nodes = |late: Late| {
        let zero = Node::new("zero", "Constant", &[], &["zero"])
            .with_attr("value", Attribute::Tensor(edgefreeze_graph::Tensor::from_f32(vec![], &[0.0]).unwrap()));
        let mask = [
            zero,
            Node::new("keep", "Greater", &["x", "zero"], &["k"]),
            Node::new("kf", "Cast", &["k"], &["kf"]).with_attr("to", Attribute::Int(1)),
        ];
        let embed = Node::new("embed", "MatMul", &["x", "we"], &["e"]);
        let proj = Node::new("proj", "MatMul", &["e", "w1"], &["h"]);
        let masked = Node::new("masked", "Mul", &["h", "kf"], &["y"]);
        match late {
            Late::MaskBehind => [vec![embed, proj], mask.to_vec(), vec![masked]].concat(),
            Late::MaskInFront => [mask.to_vec(), vec![embed, proj, masked]].concat(),
            Late::Shape => vec![
                embed,
                proj,
                Node::new("shape", "Shape", &["x"], &["s"]),
                ints("first", &[0]),
                Node::new("batch", "Gather", &["s", "first"], &["n"]).with_attr("axis", Attribute::Int(0)),
                ints("rest", &[-1]),
                Node::new("target", "Concat", &["n", "rest"], &["t"]).with_attr("axis", Attribute::Int(0)),
                Node::new("flat", "Reshape", &["h", "t"], &["y"]),
            ],
            Late::Dropout => vec![Node::new("drop", "Dropout", &["x"], &["kf"]), embed, proj, masked],
        }
    };
    for (late, side) in [
        (Late::MaskBehind, Some(vec!["x"])),
        (Late::MaskInFront, Some(vec!["x"])),
        (Late::Shape, Some(vec![])),
        (Late::Dropout, None),
    ] {
        let mut m = model(17, vec![input("x", "batch 8")], nodes(late), &["y"]);
        weight(&mut m, "we", &[8, 8]);
        weight(&mut m, "w1", &[8, 8]);
        let a = edgefreeze_graph::analyse(&prepare(m).unwrap()).unwrap();
        let at_e = a.cuts.iter().find(|c| c.tensor == "e");
        assert_eq!(
            at_e.map(|c| c.side_inputs.clone()),
            side.map(|s| s.iter().map(|v| v.to_string()).collect()),
            "{late:?}"
        );
    }
}

/// A model whose input and output fix the batch at 1, as both PyTorch exporters write
/// them without a dynamic batch axis.
fn fixed_batch_model(nodes: Vec<Node>, out_dims: &str) -> edgefreeze_graph::Model {
    let mut m = model(18, vec![input("x", "1 4 3 3")], nodes, &["y"]);
    m.graph.outputs[0] = input("y", out_dims);
    m
}

#[test]
fn a_fixed_batch_of_one_becomes_the_batch() {
    // Dynamo's `torch.flatten(x, 1)` at batch 1: Reshape to the constant [1, 36] with
    // allowzero = 1, where a 0 would mean a size of zero.
    for target in [[1, 36], [1, -1]] {
        let nodes = vec![
            Node::new("relu", "Relu", &["x"], &["r"]),
            ints("shape", &target),
            Node::new("view", "Reshape", &["r", "shape"], &["flat"]).with_attr("allowzero", Attribute::Int(1)),
            Node::new("fc", "MatMul", &["flat", "w"], &["y"]),
        ];
        let mut m = fixed_batch_model(nodes, "1 10");
        weight(&mut m, "w", &[36, 10]);
        let m = prepare(m).unwrap();
        assert_eq!(shape_of(&m, "x"), "batch×4×3×3", "target {target:?}");
        assert_eq!(shape_of(&m, "flat"), "batch×36", "target {target:?}");
        assert_eq!(shape_of(&m, "y"), "batch×10", "target {target:?}");
        assert_eq!(edgefreeze_graph::batch::exported_batch(&m), Some(1));
        assert_eq!(edgefreeze_graph::batch::batch_fixed_by(&m), None);
        let notes = edgefreeze_graph::exported::notes(&m);
        assert!(notes.iter().any(|n| n.contains("made it variable")), "{notes:?}");
    }
}

#[test]
fn a_batch_a_node_pins_stays_fixed_and_the_node_is_named() {
    // A class token expanded to a constant [1, 1, 36] and concatenated with the flattened
    // input: the Concat's output keeps a size of 1 whatever the batch, so the batch stays
    // fixed (the model keeps running at batch 1) and the reason names the node.
    let nodes = vec![
        ints("shape", &[1, 1, 36]),
        Node::new("view", "Reshape", &["x", "shape"], &["flat"]),
        Node::new("expand", "Expand", &["cls", "shape"], &["token"]),
        Node::new("cat", "Concat", &["token", "flat"], &["both"]).with_attr("axis", Attribute::Int(1)),
        Node::new("fc", "MatMul", &["both", "w"], &["y"]),
    ];
    let mut m = fixed_batch_model(nodes, "1 2 10");
    weight(&mut m, "w", &[36, 10]);
    weight(&mut m, "cls", &[1, 1, 36]);
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "x"), "1×4×3×3");
    assert_eq!(shape_of(&m, "y"), "1×2×10");
    let why = edgefreeze_graph::batch::batch_fixed_by(&m).expect("a reason");
    assert!(why.contains("\"cat\""), "{why}");
    let notes = edgefreeze_graph::exported::notes(&m);
    assert!(notes.iter().any(|n| n.contains("stays fixed") && n.contains("dynamic_shapes")), "{notes:?}");
}

#[test]
fn a_batch_moved_by_a_transpose_is_followed_and_a_merged_one_is_not() {
    // Sequence first at batch 1 (S = 4, E = 9): [1, 4, 9] -> Transpose -> [S, 1, E], then a
    // Reshape that keeps the batch's axis ([S, 1, 3, 3]: heads split off the features)
    // is followed; one that merges the batch with the heads ([S, 1·3, 3]) is not, since at
    // batch 1 it cannot be told from [S·1, ...]-style merges the other way.
    let head = |last: Node, last_target: Node| {
        vec![
            ints("s1", &[1, 4, 9]),
            Node::new("tokens", "Reshape", &["x", "s1"], &["a"]),
            Node::new("seq_first", "Transpose", &["a"], &["b"]).with_attr("perm", ints_attr(&[1, 0, 2])),
            last_target,
            last,
        ]
    };
    let split = head(Node::new("heads", "Reshape", &["b", "s2"], &["y"]), ints("s2", &[4, 1, 3, 3]));
    let m = prepare(fixed_batch_model(split, "4 1 3 3")).unwrap();
    assert_eq!(edgefreeze_graph::batch::batch_fixed_by(&m), None);
    assert_eq!(shape_of(&m, "y"), "4×batch×3×3");

    let merged = head(Node::new("heads", "Reshape", &["b", "s2"], &["y"]), ints("s2", &[4, 3, 3]));
    let m = prepare(fixed_batch_model(merged, "4 3 3")).unwrap();
    assert_eq!(shape_of(&m, "x"), "1×4×3×3");
    let why = edgefreeze_graph::batch::batch_fixed_by(&m).expect("a reason");
    assert!(why.contains("\"heads\""), "{why}");
}

#[test]
fn an_ambiguous_regrouping_keeps_the_batch_fixed() {
    // [4, N, 9] (a Transpose of [N, 4, 9]) to the constant [2, 2, 1, 1, 9]: the batch may
    // be axis 2 or 3 (both have 4 elements before them and 9 after), and neither is where
    // it was: no rewrite, and the batch is lost at the Reshape.
    let nodes = vec![
        ints("s1", &[1, 4, 9]),
        Node::new("v1", "Reshape", &["x", "s1"], &["a"]),
        Node::new("t", "Transpose", &["a"], &["b"]).with_attr("perm", ints_attr(&[1, 0, 2])),
        ints("s2", &[2, 2, 1, 1, 9]),
        Node::new("v2", "Reshape", &["b", "s2"], &["y"]),
    ];
    let m = prepare(fixed_batch_model(nodes, "2 2 1 1 9")).unwrap();
    assert_eq!(shape_of(&m, "x"), "1×4×3×3");
    let why = edgefreeze_graph::batch::batch_fixed_by(&m).expect("a reason");
    assert!(why.contains("\"v2\""), "{why}");
}

#[test]
fn inputs_without_a_fixed_one_are_left_alone() {
    let nodes = vec![Node::new("relu", "Relu", &["x"], &["y"])];
    let mut m = model(18, vec![input("x", "2 4")], nodes, &["y"]);
    m.graph.outputs[0] = input("y", "2 4");
    // A file written from a relaxed model carries the import's record of the batch; it
    // describes that earlier file, not this one.
    m.metadata.push((edgefreeze_graph::batch::EXPORTED_BATCH_KEY.into(), "1".into()));
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "x"), "2×4");
    assert_eq!(edgefreeze_graph::batch::exported_batch(&m), None);
    assert!(edgefreeze_graph::exported::notes(&m).is_empty());
}

#[test]
fn torchscript_folded_batch_norms_are_told() {
    // TorchScript's eval-mode constant folding writes a Conv followed by a BatchNorm as
    // one Conv with new weights, named onnx::Conv_<n>.
    let nodes = vec![Node::new("conv", "Conv", &["x", "onnx::Conv_7", "onnx::Conv_8"], &["y"])];
    let mut m = model(17, vec![input("x", "batch 4 3 3")], nodes, &["y"]);
    weight(&mut m, "onnx::Conv_7", &[2, 4, 1, 1]);
    weight(&mut m, "onnx::Conv_8", &[2]);
    m.producer_name = "pytorch".into();
    let m = prepare(m).unwrap();
    assert_eq!(edgefreeze_graph::exported::folded_batch_norms(&m), Some((1, "TorchScript")));
    let notes = edgefreeze_graph::exported::notes(&m);
    assert!(notes[0].contains("do_constant_folding=False"), "{notes:?}");
    // The same graph from another producer says nothing: the names are PyTorch's.
    let mut other = m.clone();
    other.producer_name = "other".into();
    assert_eq!(edgefreeze_graph::exported::folded_batch_norms(&other), None);
}

#[test]
fn buffers_dynamo_declares_are_constants_but_batch_norm_statistics() {
    // Llama's rotary frequencies: a float initializer that dynamo marks as a module buffer
    // (value metadata); PyTorch never trains it, and neither may the import's parameters.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo/hf_llama.dynamo.onnx");
    let m = edgefreeze_graph::import(&path).unwrap();
    let name = "m.model.rotary_emb.inv_freq";
    assert_eq!(edgefreeze_graph::exported::exported_buffers(&m), vec![name]);
    assert!(!m.graph.initializers.contains_key(name));
    // (A constant now, which the import's folding may carry into what reads it.)
    assert!(m.graph.initializer_inputs.iter().all(|v| v.name != name));
    let params = edgefreeze_graph::analysis::parameter_names(&m.graph);
    assert_eq!(params.len(), 21, "PyTorch's named_parameters: {params:?}");
    let notes = edgefreeze_graph::exported::notes(&m);
    assert!(notes.iter().any(|n| n.contains(name) && n.contains("not trained")), "{notes:?}");

    // Declared buffers that are BatchNorm running statistics stay the state it updates.
    let nodes = vec![Node::new("bn", "BatchNormalization", &["x", "scale", "shift", "mean", "var"], &["y"])];
    let mut bn = model(17, vec![input("x", "batch 2 3 3")], nodes, &["y"]);
    for w in ["scale", "shift", "mean", "var"] {
        weight(&mut bn, w, &[2]);
    }
    bn.metadata.push((edgefreeze_graph::exported::EXPORTED_BUFFERS_KEY.into(), "mean\nvar\nshift".into()));
    let bn = prepare(bn).unwrap();
    assert!(bn.graph.initializers.contains_key("mean") && bn.graph.initializers.contains_key("var"));
    assert!(!bn.graph.initializers.contains_key("shift"), "a buffer that is not a statistic is a constant");
    assert_eq!(edgefreeze_graph::analysis::parameter_names(&bn.graph), vec!["scale".to_string()]);
}

#[test]
fn a_gather_of_batch_indices_from_batchless_data_keeps_the_batch_fixed() {
    // RoBERTa through TorchScript at batch 1: the token-type buffer, expanded to the
    // constant [1, 4], gathered at indices that carry the batch. Off the gathered axis the
    // indices may not outgrow the data, so the batch stays 1, naming the node.
    let nodes = vec![
        Node::new("idx", "Cast", &["x"], &["i"]).with_attr("to", Attribute::Int(7)),
        ints("four", &[1, 4]),
        Node::new("types", "Expand", &["buffer", "four"], &["t"]),
        Node::new("pick", "GatherElements", &["t", "i"], &["y"]).with_attr("axis", Attribute::Int(1)),
    ];
    let mut m = model(18, vec![input("x", "1 4")], nodes, &["y"]);
    m.graph.outputs[0] = input("y", "1 4");
    weight(&mut m, "buffer", &[1, 4]);
    let m = prepare(m).unwrap();
    assert_eq!(shape_of(&m, "x"), "1×4");
    let why = edgefreeze_graph::batch::batch_fixed_by(&m).expect("a reason");
    assert!(why.contains("\"pick\"") && why.contains("do not fit"), "{why}");
    assert_eq!(why.matches("\"pick\"").count(), 1, "the node is named once: {why}");
}

#[test]
fn resize_sizes_computed_from_the_batch_become_constant_scales() {
    // `F.interpolate(x, size=(7, 9), mode="bilinear")` with a dynamic batch, as
    // TorchScript writes it: sizes = Concat(Shape(x)[:2], [7, 9]).
    let nodes = vec![
        Node::new("shape", "Shape", &["x"], &["s"]),
        ints("start", &[0]),
        ints("end", &[2]),
        Node::new("head", "Slice", &["s", "start", "end"], &["nc"]),
        ints("hw", &[7, 9]),
        Node::new("sizes", "Concat", &["nc", "hw"], &["sizes"]).with_attr("axis", Attribute::Int(0)),
        Node::new("up", "Resize", &["x", "", "", "sizes"], &["y"])
            .with_attr("mode", Attribute::String(b"linear".to_vec()))
            .with_attr("coordinate_transformation_mode", Attribute::String(b"half_pixel".to_vec())),
    ];
    let m = prepare(model(17, vec![input("x", "batch 2 4 6")], nodes, &["y"])).unwrap();
    assert_eq!(shape_of(&m, "y"), "batch×2×7×9");
    let up = m.graph.nodes.iter().find(|n| n.op_type == "Resize").unwrap();
    assert_eq!(up.inputs.len(), 3, "scales, not sizes: {:?}", up.inputs);
    let scales = m
        .graph
        .nodes
        .iter()
        .find(|n| n.outputs[0] == up.inputs[2])
        .and_then(|n| match n.attributes.get("value") {
            Some(Attribute::Tensor(t)) => t.to_f64_vec(),
            _ => None,
        })
        .expect("a constant");
    assert_eq!(&scales[..2], &[1.0, 1.0]);
    // float32 ratios whose products give the sizes back in float32.
    for (s, (d, n)) in scales[2..].iter().zip([(4.0f32, 7.0f32), (6.0, 9.0)]) {
        assert_eq!((d * *s as f32).floor(), n, "{s}");
        assert!((*s - f64::from(n / d)).abs() < 1e-6, "{s}");
    }
    assert!(m.graph.nodes.iter().all(|n| n.op_type != "Shape"), "the sizes' computation is gone");
}

#[test]
fn an_input_only_second_output_adds_no_side_input() {
    // A model returning (logits, Equal(tokens, 0)): the part behind a cut computes the
    // first output only, so the second one does not make the tokens a side input.
    let nodes = vec![
        Node::new("embed", "MatMul", &["x", "we"], &["e"]),
        Node::new("proj", "MatMul", &["e", "w1"], &["y"]),
        Node::new("zero", "Constant", &[], &["zero"])
            .with_attr("value", Attribute::Tensor(edgefreeze_graph::Tensor::from_f32(vec![], &[0.0]).unwrap())),
        Node::new("pad", "Equal", &["x", "zero"], &["pad"]),
    ];
    let mut m = model(17, vec![input("x", "batch 8")], nodes, &["y", "pad"]);
    weight(&mut m, "we", &[8, 8]);
    weight(&mut m, "w1", &[8, 8]);
    let a = edgefreeze_graph::analyse(&prepare(m).unwrap()).unwrap();
    let cut = a.cuts.iter().find(|c| c.tensor == "e").expect("a cut at the embedding's output");
    assert!(cut.side_inputs.is_empty(), "{:?}", cut.side_inputs);
}
