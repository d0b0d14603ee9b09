//! Models exported at batch 1 without a dynamic batch axis, as both PyTorch exporters
//! write them by default (`tools/export_defaults.py`, `tests/fixtures/exported/`): the
//! import makes the batch variable, and the gradient graph at batch 4 is the one of the
//! same model exported with a dynamic batch, on ONNX Runtime and on tract.

use edgefreeze_autodiff::training::{LOSS, grad_name};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::{Model, import};
use edgefreeze_tests::repo_root;
use ndarray::{ArrayD, IxDyn};
use std::collections::HashMap;

const BATCH: usize = 4;

fn fixture(name: &str) -> Model {
    let path = repo_root().join("tests/fixtures/exported").join(name);
    import(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Loss and gradients (by parameter name) of `model`'s gradient graph on a fixed batch.
fn gradients(model: &Model, kind: &EngineKind) -> HashMap<String, Vec<f32>> {
    let graph = gradient_graph(model, &Loss::cross_entropy(), &[]).unwrap();
    let input: Vec<f32> = (0..BATCH * 28 * 28).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
    let mut feeds: HashMap<String, Value> = HashMap::new();
    feeds.insert(
        model.graph.inputs[0].name.clone(),
        Value::F32(ArrayD::from_shape_vec(IxDyn(&[BATCH, 1, 28, 28]), input).unwrap()),
    );
    feeds.insert("labels".into(), Value::I64(ArrayD::from_shape_vec(IxDyn(&[BATCH]), vec![3, 1, 4, 1]).unwrap()));
    feeds.insert(DROPOUT_SEED.into(), Value::scalar_i64(7));
    for (name, t) in &model.graph.initializers {
        if t.dtype().is_float() {
            feeds.insert(
                name.clone(),
                Value::F32(ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_f32_vec().unwrap()).unwrap()),
            );
        }
    }
    let bytes = edgefreeze_graph::save::encode_model(&graph);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
    let names = session.input_names().to_vec();
    let inputs: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), &feeds[n])).collect();
    let out = session.run(&inputs).unwrap_or_else(|e| panic!("{kind}: {e}"));
    let out: HashMap<&String, &Value> = session.output_names().iter().zip(&out).collect();
    let mut got = HashMap::new();
    for (name, t) in &model.graph.initializers {
        if let Some(v) = t.dtype().is_float().then(|| out.get(&grad_name(name))).flatten() {
            got.insert(name.clone(), v.as_f32().unwrap().iter().copied().collect());
        }
    }
    got.insert(LOSS.into(), out[&LOSS.to_string()].as_f32().unwrap().iter().copied().collect());
    got
}

fn check(name: &str, kind: &EngineKind) {
    let fixed = fixture(name);
    assert_eq!(edgefreeze_graph::batch::exported_batch(&fixed), Some(1), "{name}: the file fixes the batch");
    assert_eq!(edgefreeze_graph::batch::batch_fixed_by(&fixed), None, "{name}");
    let reference = gradients(&fixture("cnn.dynamic.onnx"), kind);
    let ours = gradients(&fixed, kind);
    // The model's parameters (and the loss): every one the reference has, under the same
    // name in both exports.
    let wanted = ["loss", "c1.weight", "c1.bias", "b1.weight", "b1.bias", "c2.weight", "c2.bias", "b2.weight"];
    for key in wanted.iter().copied().chain(["b2.bias", "fc.weight", "fc.bias"]) {
        let (a, b) = (&ours[key], &reference[key]);
        assert_eq!(a.len(), b.len(), "{name} on {kind}: {key}");
        // The same ops on the same numbers, but each export writes them its own way
        // (dynamo a Reshape and a Gemm where TorchScript has Flatten): a few float32
        // roundings apart, measured against the tensor's largest element.
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst <= 16.0 * f32::EPSILON * scale, "{name} on {kind}: {key} off by {worst:e} (largest {scale:e})");
    }
}

#[test]
fn torchscript_at_batch_one_trains_at_any_batch_on_ort() {
    check("cnn.ts_b1.onnx", &EngineKind::Ort(Provider::Cpu));
}

#[test]
fn torchscript_at_batch_one_trains_at_any_batch_on_tract() {
    check("cnn.ts_b1.onnx", &EngineKind::Tract);
}

#[test]
fn dynamo_at_batch_one_trains_at_any_batch_on_ort() {
    check("cnn.dynamo_b1.onnx", &EngineKind::Ort(Provider::Cpu));
}

#[test]
fn dynamo_at_batch_one_trains_at_any_batch_on_tract() {
    check("cnn.dynamo_b1.onnx", &EngineKind::Tract);
}

#[test]
fn the_exporters_defaults_fold_batch_norm_and_the_import_says_so() {
    for (name, exporter) in [("cnn.ts_default.onnx", "TorchScript"), ("cnn.dynamo_default.onnx", "dynamo")] {
        let m = fixture(name);
        assert_eq!(edgefreeze_graph::exported::folded_batch_norms(&m), Some((2, exporter)), "{name}");
        assert!(m.graph.nodes.iter().all(|n| n.op_type != "BatchNormalization"), "{name}");
        // Its batch is made variable all the same.
        assert_eq!(edgefreeze_graph::batch::batch_fixed_by(&m), None, "{name}");
    }
    // The training-mode exports keep their BatchNorms and say nothing of folding.
    for name in ["cnn.ts_b1.onnx", "cnn.dynamo_b1.onnx", "cnn.dynamic.onnx"] {
        assert_eq!(edgefreeze_graph::exported::folded_batch_norms(&fixture(name)), None, "{name}");
    }
}

/// A Hugging Face-style text classifier as optimum exports it: token ids, an attention
/// mask, token types and positions in, each read through its own embedding table (the
/// mask as a multiplier).
fn four_input_classifier() -> Model {
    use edgefreeze_graph::ir::{Attribute, Dim, Graph, Node, ValueInfo};
    use edgefreeze_graph::{DataType, Tensor};
    let tokens = |name: &str| ValueInfo::new(name, DataType::Int64, vec![Dim::Symbol("batch".into()), Dim::Fixed(6)]);
    let mut graph = Graph {
        name: "optimum_like".into(),
        nodes: vec![
            Node::new("embed", "Gather", &["table", "input_ids"], &["e"]),
            Node::new("types", "Gather", &["type_table", "token_type_ids"], &["t"]),
            Node::new("positions", "Gather", &["position_table", "position_ids"], &["p"]),
            Node::new("sum1", "Add", &["e", "t"], &["et"]),
            Node::new("sum2", "Add", &["et", "p"], &["etp"]),
            Node::new("mask_f", "Cast", &["attention_mask"], &["m"]).with_attr("to", Attribute::Int(1)),
            Node::new("axis", "Constant", &[], &["axis"])
                .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[2]).unwrap())),
            Node::new("mask_u", "Unsqueeze", &["m", "axis"], &["mu"]),
            Node::new("masked", "Mul", &["etp", "mu"], &["em"]),
            Node::new("pool", "ReduceMean", &["em"], &["pooled"])
                .with_attr("axes", Attribute::Ints(vec![1]))
                .with_attr("keepdims", Attribute::Int(0)),
            Node::new("head", "Gemm", &["pooled", "w"], &["logits"]),
        ],
        inputs: vec![tokens("input_ids"), tokens("attention_mask"), tokens("token_type_ids"), tokens("position_ids")],
        outputs: vec![ValueInfo::new("logits", DataType::Float32, vec![Dim::Symbol("batch".into()), Dim::Fixed(2)])],
        ..Default::default()
    };
    let table = |rows: usize, scale: f32| {
        let values: Vec<f32> = (0..rows * 4).map(|i| ((i * 37 % 23) as f32 - 11.0) * scale).collect();
        Tensor::from_f32(vec![rows, 4], &values).unwrap()
    };
    graph.initializers.insert("table".into(), table(20, 0.05));
    graph.initializers.insert("type_table".into(), table(2, 0.3));
    graph.initializers.insert("position_table".into(), table(6, 0.1));
    graph.initializers.insert("w".into(), table(2, 0.2).reshaped(vec![4, 2]).unwrap());
    edgefreeze_graph::prepare(Model {
        ir_version: 8,
        opset_imports: vec![(String::new(), 17)],
        graph,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn hugging_face_inputs_beside_the_token_ids_are_computed_from_the_padding() {
    use edgefreeze_graph::text_inputs::derive_from_token_ids;
    let model = four_input_classifier();
    let (derived, notes) = derive_from_token_ids(&model, 0).unwrap().expect("three inputs to derive");
    let inputs: Vec<&str> = derived.graph.inputs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(inputs, ["input_ids"]);
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[0].contains("attention_mask") && notes[0].contains("padding (id 0)"), "{notes:?}");
    assert_eq!(edgefreeze_graph::exported::notes(&derived), notes, "inspect, convert and train say it too");
    // Texts padded at the end with 0, one of them empty.
    let ids: Vec<i64> = vec![5, 3, 9, 0, 0, 0, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0];
    let (rows, len) = (3, 6);
    let mask: Vec<i64> = ids.iter().map(|&t| i64::from(t != 0)).collect();
    let positions: Vec<i64> = (0..rows * len).map(|i| (i % len) as i64).collect();
    let tensor = |v: Vec<i64>| Value::I64(ArrayD::from_shape_vec(IxDyn(&[rows, len]), v).unwrap());
    let given = [
        ("input_ids", tensor(ids.clone())),
        ("attention_mask", tensor(mask)),
        ("token_type_ids", tensor(vec![0; rows * len])),
        ("position_ids", tensor(positions)),
    ];
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let run = |m: &Model, feeds: &[(&str, Value)]| {
            let bytes = edgefreeze_graph::save::encode_model(m);
            let mut session = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
            let names = session.input_names().to_vec();
            let inputs: Vec<(&str, &Value)> =
                names.iter().map(|n| (n.as_str(), &feeds.iter().find(|(f, _)| f == n).unwrap().1)).collect();
            session.run(&inputs).unwrap()[0].as_f32().unwrap().clone()
        };
        let explicit = run(&model, &given);
        let computed = run(&derived, &given[..1]);
        assert_eq!(explicit, computed, "{kind}");
        // The empty text pools nothing.
        assert!(computed.index_axis(ndarray::Axis(0), 2).iter().all(|&x| x == 0.0), "{kind}: {computed:?}");
    }
    // Inputs that cannot be computed from the ids are errors naming them.
    let mut wrong = model.clone();
    wrong.graph.inputs[1].shape = Some(vec![edgefreeze_graph::ir::Dim::Symbol("batch".into())]);
    let err = derive_from_token_ids(&wrong, 0).unwrap_err().to_string();
    assert!(err.contains("attention_mask"), "{err}");
    let mut flat = model.clone();
    flat.graph.inputs[0].shape = Some(vec![edgefreeze_graph::ir::Dim::Symbol("batch".into())]);
    let err = derive_from_token_ids(&flat, 0).unwrap_err().to_string();
    assert!(err.contains("not [batch, sequence]"), "{err}");
    let mut plain = model.clone();
    plain.graph.inputs.truncate(1);
    assert!(derive_from_token_ids(&plain, 0).unwrap().is_none(), "nothing to derive");
}
