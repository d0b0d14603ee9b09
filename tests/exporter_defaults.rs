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
    let graph = gradient_graph(model, &Loss::CrossEntropy { label_smoothing: 0.0 }, &[]).unwrap();
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
