//! Models as users bring them: small torchvision models and `nn.TransformerEncoder`
//! classifiers exported in training mode by both PyTorch exporters
//! (`tools/zoo_sweep.py --fixtures tests/fixtures/zoo`), whose loss and every parameter
//! gradient must match PyTorch's float64 ones on ONNX Runtime and on tract; and a Keras
//! model converted by tf2onnx, against TensorFlow's float64 ones
//! (`tools/keras_gradients.py`; "PyTorch" below stands for TensorFlow there).
//!
//! The rule is the one of the bundled models' PyTorch comparison
//! ([`edgefreeze_tests::tolerance`]): per tensor, within 16 times PyTorch's own float32
//! error (stored in the fixture), or every element within 16 float32 ulps of the model's
//! largest gradient element (gradients that are zero, or nearly cancel, in exact
//! arithmetic, such as a convolution bias before a training-mode BatchNorm).

use edgefreeze_autodiff::training::{LOSS, grad_name};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::{Model, import};
use edgefreeze_tests::tolerance::verdict;
use edgefreeze_tests::{read_fixture, repo_root};
use ndarray::{ArrayD, IxDyn};
use serde_json::Value as Json;
use std::collections::HashMap;

struct Fixture {
    stem: String,
    model: Model,
    json: Json,
    tensors: edgefreeze_tests::FixtureTensors,
}

fn fixture(stem: &str) -> Fixture {
    let dir = repo_root().join("tests/fixtures/zoo");
    let (json, tensors) = read_fixture(&dir, stem);
    let model = import(dir.join(json["file"].as_str().unwrap())).unwrap_or_else(|e| panic!("{stem}: {e}"));
    Fixture { stem: stem.to_string(), model, json, tensors }
}

impl Fixture {
    fn value(&self, key: &str) -> Value {
        let (dims, v, int) = self.tensors.get(key).unwrap_or_else(|| panic!("{}: no tensor {key}", self.stem));
        if *int {
            Value::I64(ArrayD::from_shape_vec(IxDyn(dims), v.iter().map(|&x| x as i64).collect()).unwrap())
        } else {
            Value::F32(ArrayD::from_shape_vec(IxDyn(dims), v.iter().map(|&x| x as f32).collect()).unwrap())
        }
    }

    fn parameters(&self) -> Vec<String> {
        self.json["parameters"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    }

    /// The loss PyTorch differentiated: `loss_function` in the json (the segmentation
    /// fixture's per-pixel cross-entropy with an ignored label), else plain cross-entropy.
    fn loss(&self) -> Loss {
        match self.json.get("loss_function") {
            None => Loss::cross_entropy(),
            Some(l) => {
                assert_eq!(l["kind"], "cross-entropy", "{}: loss {l}", self.stem);
                Loss::CrossEntropy { label_smoothing: 0.0, ignore_index: l["ignore_index"].as_i64() }
            }
        }
    }

    fn number(&self, path: &[&str]) -> f64 {
        let mut v = &self.json;
        for key in path {
            v = &v[*key];
        }
        v.as_f64().unwrap_or_else(|| panic!("{}: no number at {path:?}", self.stem))
    }
}

fn check(stem: &str, kind: &EngineKind) {
    let f = fixture(stem);
    let graph = gradient_graph(&f.model, &f.loss(), &[]).unwrap_or_else(|e| panic!("{stem}: {e}"));
    let mut feeds: HashMap<String, Value> = HashMap::new();
    feeds.insert(f.model.graph.inputs[0].name.clone(), f.value("input"));
    feeds.insert("labels".into(), f.value("labels"));
    feeds.insert(DROPOUT_SEED.into(), Value::scalar_i64(7));
    for (name, t) in &f.model.graph.initializers {
        if t.dtype().is_float() {
            feeds.insert(
                name.clone(),
                Value::F32(ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_f32_vec().unwrap()).unwrap()),
            );
        }
    }
    let bytes = edgefreeze_graph::save::encode_model(&graph);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default())
        .unwrap_or_else(|e| panic!("{stem} on {kind}: {e}"));
    let names = session.input_names().to_vec();
    let inputs: Vec<(&str, &Value)> =
        names.iter().map(|n| (n.as_str(), feeds.get(n).unwrap_or_else(|| panic!("{stem}: no feed for {n}")))).collect();
    let out = session.run(&inputs).unwrap_or_else(|e| panic!("{stem} on {kind}: {e}"));
    let out: HashMap<String, Value> = session.output_names().iter().cloned().zip(out).collect();
    let floats = |name: &str| -> Vec<f64> { out[name].as_f32().unwrap().iter().map(|&x| x as f64).collect() };

    let loss = floats(LOSS)[0];
    let expected = f.number(&["loss"]);
    // PyTorch's loss error is one number, which can be near zero by chance; the error of
    // its logits (a whole tensor) is a steadier measure of its forward pass's noise.
    let torch_loss = f.number(&["loss_float32_error"]).max(f.number(&["logits_float32_error"])) * expected.abs();
    let v = verdict(&[loss], &[expected], torch_loss, expected.abs());
    assert!(v.passes(), "{}", v.explain(&format!("{stem} on {kind}: loss")));

    let params = f.parameters();
    let reference = |p: &str| &f.tensors[&format!("grad/{p}")].1;
    // The scale of every gradient's round-off: the model's largest gradient element.
    let scale = params.iter().flat_map(|p| reference(p).iter()).fold(0.0f64, |m, v| m.max(v.abs()));
    let mut failures = Vec::new();
    let mut rejections = 0;
    for p in &params {
        let ours = floats(&grad_name(p));
        assert_eq!(ours.len(), reference(p).len(), "{stem}: gradient of {p} has the wrong size");
        let torch = f.number(&["float32_error_per_tensor", p]) * f.number(&["gradient_norms", p]);
        let v = verdict(&ours, reference(p), torch, scale);
        if !v.passes() {
            failures.push(v.explain(p));
        }
        // The rule must still catch a real bug: the same gradient 0.1% off is rejected
        // (unless the tensor is below the floor, where 0.1% of it is round-off).
        let wrong: Vec<f64> = ours.iter().map(|x| x * 1.001).collect();
        let w = verdict(&wrong, reference(p), torch, scale);
        if w.max_abs > 2.0 * w.floor && 0.001 * v.norm > 2.0 * 16.0 * torch + v.l2 {
            assert!(!w.passes(), "{stem}: a 0.1% error of {p} would pass: {w:?}");
            rejections += 1;
        }
    }
    assert!(rejections > 0, "{stem}: no gradient large enough to check that a 0.1% error is rejected");
    assert!(
        failures.is_empty(),
        "{stem} on {kind}: {} of {} gradients off:\n{}",
        failures.len(),
        params.len(),
        failures.join("\n")
    );
}

macro_rules! zoo_tests {
    ($($test:ident: $stem:literal,)*) => {
        mod ort {
            use super::*;
            $(#[test] fn $test() { check($stem, &EngineKind::Ort(Provider::Cpu)); })*
        }
        mod tract {
            use super::*;
            $(#[test] fn $test() { check($stem, &EngineKind::Tract); })*
        }
    };
}

zoo_tests! {
    squeezenet_mini_torchscript: "squeezenet_mini.ts",
    shufflenet_v2_mini_dynamo: "shufflenet_v2_mini.dynamo",
    mobilenet_v3_small_torchscript: "mobilenet_v3_small_025.ts",
    mobilenet_v3_small_dynamo: "mobilenet_v3_small_025.dynamo",
    efficientnet_b0_torchscript: "efficientnet_b0_025.ts",
    swin_torchscript: "swin_mini.ts",
    swin_dynamo: "swin_mini.dynamo",
    convnext_dynamo: "convnext_mini.dynamo",
    transformer_encoder_torchscript: "tfenc_bf_pre_gelu.ts",
    transformer_encoder_masked_dynamo: "tfenc_bf_pre_gelu_mask.dynamo",
    transformer_encoder_seq_first_masked_torchscript: "tfenc_sf_post_relu_mask.ts",
    keras_through_tf2onnx: "keras_cnn.tf2onnx",
    timm_ops_torchscript: "ops_mini.ts",
    timm_ops_dynamo: "ops_mini.dynamo",
    resize_modes_torchscript: "resize_mini.ts",
    resize_modes_dynamo: "resize_mini.dynamo",
    segmentation_ignored_pixels_torchscript: "seg_mini.ts",
    segmentation_ignored_pixels_dynamo: "seg_mini.dynamo",
    huggingface_bert_torchscript: "hf_bert.ts",
    huggingface_roberta_dynamo: "hf_roberta.dynamo",
    huggingface_gpt2_torchscript: "hf_gpt2.ts",
    huggingface_gpt2_dynamo: "hf_gpt2.dynamo",
    huggingface_llama_dynamo: "hf_llama.dynamo",
}
