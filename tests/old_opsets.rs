//! Models at opsets 9 to 12 are brought to opset 13 on import (`edgefreeze_graph::upgrade`):
//! every op whose definition changed on the way, in its old form, computes on ONNX Runtime
//! (which runs the old opset itself) what the upgraded model computes on ONNX Runtime and
//! tract.

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::save::{SaveOptions, save_model};
use edgefreeze_graph::{DataType, Tensor, prepare};
use edgefreeze_tests::{python_onnx, run_python};
use ndarray::{ArrayD, IxDyn};

fn ints(v: &[i64]) -> Attribute {
    Attribute::Ints(v.to_vec())
}

/// x [2, 3, 4, 5] through Slice, Pad, Clip, Unsqueeze, Squeeze, Split, ReduceSum, Softmax
/// (over a middle axis: every axis from it on, before opset 13) and LogSoftmax (over the
/// last), each written as `opset` defines it.
fn model(opset: i64) -> Model {
    let mut nodes = Vec::new();
    let constant = |nodes: &mut Vec<Node>, name: &str, t: Tensor| {
        nodes.push(Node::new(name, "Constant", &[], &[name]).with_attr("value", Attribute::Tensor(t)));
        name.to_string()
    };
    let i64s = |v: &[i64]| Tensor::from_i64(vec![v.len()], v).unwrap();
    // Slice: columns 1..4 of the last axis.
    if opset < 10 {
        nodes.push(
            Node::new("slice", "Slice", &["x"], &["sl"])
                .with_attr("starts", ints(&[1]))
                .with_attr("ends", ints(&[4]))
                .with_attr("axes", ints(&[3])),
        );
    } else {
        let s = constant(&mut nodes, "starts", i64s(&[1]));
        let e = constant(&mut nodes, "ends", i64s(&[4]));
        let a = constant(&mut nodes, "slice_axes", i64s(&[3]));
        nodes.push(Node::new("slice", "Slice", &["x", &s, &e, &a], &["sl"]));
    }
    // Pad: one column of 0.5 on each side of the last axis; Clip to [-0.5, 0.8].
    let pads = [0, 0, 0, 1, 0, 0, 0, 1];
    if opset < 11 {
        nodes.push(
            Node::new("pad", "Pad", &["sl"], &["pd"])
                .with_attr("pads", ints(&pads))
                .with_attr("value", Attribute::Float(0.5)),
        );
        nodes.push(
            Node::new("clip", "Clip", &["pd"], &["cl"])
                .with_attr("min", Attribute::Float(-0.5))
                .with_attr("max", Attribute::Float(0.8)),
        );
    } else {
        let p = constant(&mut nodes, "pads", i64s(&pads));
        let v = constant(&mut nodes, "pad_value", Tensor::from_f32(vec![], &[0.5]).unwrap());
        nodes.push(Node::new("pad", "Pad", &["sl", &p, &v], &["pd"]));
        let lo = constant(&mut nodes, "lo", Tensor::from_f32(vec![], &[-0.5]).unwrap());
        let hi = constant(&mut nodes, "hi", Tensor::from_f32(vec![], &[0.8]).unwrap());
        nodes.push(Node::new("clip", "Clip", &["pd", &lo, &hi], &["cl"]));
    }
    // Dropout (the identity in inference), its ratio an attribute before opset 12.
    if opset < 12 {
        nodes.push(Node::new("drop", "Dropout", &["cl"], &["dr"]).with_attr("ratio", Attribute::Float(0.3)));
    } else {
        let r = constant(&mut nodes, "ratio", Tensor::from_f32(vec![], &[0.3]).unwrap());
        nodes.push(Node::new("drop", "Dropout", &["cl", &r], &["dr"]));
    }
    // Unsqueeze to [1, 2, 3, 4, 5], Squeeze back, Split the channels 1 + 2, sum the two.
    nodes.push(Node::new("unsq", "Unsqueeze", &["dr"], &["u"]).with_attr("axes", ints(&[0])));
    nodes.push(Node::new("sq", "Squeeze", &["u"], &["q"]).with_attr("axes", ints(&[0])));
    nodes.push(
        Node::new("split", "Split", &["q"], &["a", "b"])
            .with_attr("axis", Attribute::Int(1))
            .with_attr("split", ints(&[1, 2])),
    );
    nodes.push(
        Node::new("sum", "ReduceSum", &["b"], &["rs"])
            .with_attr("axes", ints(&[1]))
            .with_attr("keepdims", Attribute::Int(1)),
    );
    nodes.push(Node::new("add", "Add", &["a", "rs"], &["c"]));
    // [2, 1, 4, 5]: Softmax at axis 2 normalises over 4 × 5 values before opset 13.
    nodes.push(Node::new("softmax", "Softmax", &["c"], &["s1"]).with_attr("axis", Attribute::Int(2)));
    nodes.push(Node::new("logsoftmax", "LogSoftmax", &["c"], &["s2"]).with_attr("axis", Attribute::Int(3)));
    let out =
        |n: &str| ValueInfo { name: n.into(), dtype: Some(DataType::Float32), shape: None, doc_string: String::new() };
    Model {
        ir_version: 7,
        opset_imports: vec![(String::new(), opset)],
        graph: Graph {
            name: format!("opset{opset}"),
            nodes,
            inputs: vec![ValueInfo::new(
                "x",
                DataType::Float32,
                vec![Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(4), Dim::Fixed(5)],
            )],
            outputs: vec![out("s1"), out("s2")],
            ..Default::default()
        },
        ..Default::default()
    }
}

fn run(kind: &EngineKind, model: &Model) -> Vec<Vec<f32>> {
    let bytes = edgefreeze_graph::save::encode_model(model);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default())
        .unwrap_or_else(|e| panic!("{kind} loading {}: {e}", model.graph.name));
    let x: Vec<f32> = (0..120).map(|i| ((i as f32) * 0.37).sin()).collect();
    let x = Value::F32(ArrayD::from_shape_vec(IxDyn(&[2, 3, 4, 5]), x).unwrap());
    let out = session.run(&[("x", &x)]).unwrap_or_else(|e| panic!("{kind} running {}: {e}", model.graph.name));
    out.iter().map(|v| v.as_f32().unwrap().iter().copied().collect()).collect()
}

#[test]
fn old_opset_forms_compute_what_their_upgrade_computes() {
    for opset in 9..=12 {
        let original = model(opset);
        let expected = run(&EngineKind::Ort(Provider::Cpu), &original);
        let upgraded = prepare(original).unwrap_or_else(|e| panic!("opset {opset}: {e}"));
        assert_eq!(upgraded.opset(), 13);
        assert_eq!(edgefreeze_graph::upgrade::source_opset(&upgraded), Some(opset));
        // Nothing is left in an attribute that opset 13 takes as an input.
        for node in &upgraded.graph.nodes {
            for attr in ["axes", "split", "pads", "starts", "ends", "min", "max", "value", "ratio"] {
                let allowed = node.op_type == "Constant" && attr == "value";
                assert!(allowed || !node.attributes.contains_key(attr), "opset {opset}: {} keeps {attr}", node.name);
            }
        }
        // The middle-axis Softmax became Flatten, Softmax over the last axis, Reshape.
        assert!(upgraded.graph.nodes.iter().any(|n| n.op_type == "Flatten"), "opset {opset}");
        for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
            let got = run(&kind, &upgraded);
            for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g.len(), e.len());
                let worst = g.iter().zip(e).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst < 1e-6, "opset {opset}, {kind}, output {k}: off by {worst}");
            }
        }
        // The old Softmax normalised over 20 values per row: each sums to 1 over axes 2, 3.
        let s1 = &expected[0];
        for row in s1.chunks(20) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn upgraded_models_pass_the_onnx_checker() {
    // Nothing of the old forms is left that opset 13 does not define (a Dropout's `ratio`
    // attribute was, before it became an input).
    if !python_onnx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<std::path::PathBuf> = (9..=12)
        .map(|opset| {
            let path = dir.path().join(format!("opset{opset}.onnx"));
            save_model(&prepare(model(opset)).unwrap(), &path, &SaveOptions::default()).unwrap();
            path
        })
        .collect();
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    let out = run_python("check_model.py", &refs);
    assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), paths.len(), "{out}");
}

#[test]
fn opsets_before_9_are_refused_naming_the_range() {
    let mut m = model(9);
    m.opset_imports = vec![(String::new(), 8)];
    let text = prepare(m).unwrap_err().to_string();
    assert!(text.contains("version 8") && text.contains("9 to 21"), "{text}");
}
