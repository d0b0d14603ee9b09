//! A training-mode BatchNormalization as opsets 9 to 13 write it (TorchScript's opset-13
//! training export): five outputs, the running statistics and the batch's saved ones, no
//! `training_mode` attribute. It trains as the one-output form does, bit for bit.

use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec, training_step_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

const BATCH: usize = 6;
const CLASSES: usize = 4;

/// x (batch × 3) → Gemm → BatchNormalization → logits (batch × 4), at opset 13, with the
/// BatchNormalization's outputs as given.
fn model(bn_outputs: &[&str]) -> Model {
    prepare(raw_model(bn_outputs)).unwrap()
}

/// [`model`] before the import.
fn raw_model(bn_outputs: &[&str]) -> Model {
    let mut graph = Graph { name: "bn13".into(), ..Default::default() };
    let values = |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32 * 0.37 + k).sin()) * 0.8).collect() };
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![CLASSES, 3], &values(12, 0.1)).unwrap());
    graph.initializers.insert("b".into(), Tensor::from_f32(vec![CLASSES], &values(4, 0.5)).unwrap());
    graph.initializers.insert("bn.weight".into(), Tensor::from_f32(vec![CLASSES], &[1.1, 0.9, 1.3, 0.7]).unwrap());
    graph.initializers.insert("bn.bias".into(), Tensor::from_f32(vec![CLASSES], &[0.1, -0.2, 0.0, 0.3]).unwrap());
    graph.initializers.insert("bn.running_mean".into(), Tensor::from_f32(vec![CLASSES], &[0.1; 4]).unwrap());
    graph.initializers.insert("bn.running_var".into(), Tensor::from_f32(vec![CLASSES], &[1.2; 4]).unwrap());
    graph.inputs.push(ValueInfo::new("x", DataType::Float32, vec![Dim::Symbol("batch".into()), Dim::Fixed(3)]));
    graph.nodes.push(
        Node::new("fc", "Gemm", &["x", "w", "b"], &["h"]).with_attr("transB", edgefreeze_graph::ir::Attribute::Int(1)),
    );
    graph.nodes.push(Node::new(
        "bn",
        "BatchNormalization",
        &["h", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
        bn_outputs,
    ));
    graph.outputs.push(ValueInfo { name: "logits".into(), dtype: None, shape: None, doc_string: String::new() });
    Model { ir_version: 7, opset_imports: vec![(String::new(), 13)], graph, ..Default::default() }
}

/// Every output of the model's SGD training step on `kind`, by name.
fn step(model: &Model, kind: &EngineKind) -> Vec<(String, Vec<f32>)> {
    let spec = TrainingSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        frozen: vec![],
    };
    let step = training_step_graph(model, &spec).unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&step);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
    let feeds: Vec<Value> = step
        .graph
        .inputs
        .iter()
        .map(|input| {
            let dims: Vec<usize> = input.shape.as_ref().unwrap().iter().map(|d| d.fixed().unwrap_or(BATCH)).collect();
            let n: usize = dims.iter().product();
            if let Some(t) = model.graph.initializers.get(&input.name) {
                return Value::F32(ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_f32_vec().unwrap()).unwrap());
            }
            match input.dtype {
                Some(DataType::Int64) => {
                    Value::I64(ArrayD::from_shape_vec(IxDyn(&dims), (0..n as i64).map(|i| i % 4).collect()).unwrap())
                }
                _ => Value::F32(
                    ArrayD::from_shape_vec(IxDyn(&dims), (0..n).map(|i| (i as f32 * 0.61).cos()).collect()).unwrap(),
                ),
            }
        })
        .collect();
    let names: Vec<String> = step.graph.inputs.iter().map(|i| i.name.clone()).collect();
    let inputs: Vec<(&str, &Value)> = names.iter().map(String::as_str).zip(feeds.iter()).collect();
    let out = session.run(&inputs).unwrap();
    let mut named: Vec<(String, Vec<f32>)> = session
        .output_names()
        .iter()
        .cloned()
        .zip(out.iter().map(|v| v.as_f32().map(|a| a.iter().copied().collect()).unwrap_or_default()))
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

#[test]
fn five_output_batch_normalization_trains_as_the_one_output_form() {
    let five = model(&["logits", "running_mean_out", "running_var_out", "saved_mean", "saved_var"]);
    let one = model(&["logits"]);
    for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
        let (a, b) = (step(&five, &kind), step(&one, &kind));
        assert_eq!(a.iter().map(|o| &o.0).collect::<Vec<_>>(), b.iter().map(|o| &o.0).collect::<Vec<_>>());
        // The step moves the parameters and the running statistics.
        assert!(a.len() >= 6, "{kind}: {:?}", a.iter().map(|o| &o.0).collect::<Vec<_>>());
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert_eq!(x, y, "{kind}: {name}");
        }
    }
}

#[test]
fn a_read_saved_statistic_is_an_error_naming_the_node() {
    let mut m = raw_model(&["y", "running_mean_out", "running_var_out", "saved_mean", "saved_var"]);
    m.graph.nodes.push(Node::new("reads_saved", "Add", &["y", "saved_mean"], &["logits"]));
    let m = prepare(m).unwrap();
    let spec = TrainingSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 0.0 },
        frozen: vec![],
    };
    let err = training_step_graph(&m, &spec).unwrap_err().to_string();
    assert!(err.contains("\"bn\"") && err.contains("saved_mean"), "{err}");
}
