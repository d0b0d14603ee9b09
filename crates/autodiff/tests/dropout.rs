//! Training-mode Dropout: the mask is a function of the `dropout_seed` input, so a step can
//! be replayed, every engine draws the same mask, and the gradient goes through it.

use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

const N: usize = 4000;
const RATIO: f32 = 0.3;

/// How the model gives the Dropout its ratio.
#[derive(Clone, Copy)]
enum Ratio {
    /// The `ratio` attribute (opset 13 still accepts it as the default).
    Attribute,
    /// `ratio` and `training_mode` inputs fed by `Constant` nodes, as PyTorch's
    /// TorchScript exporter writes a training-mode Dropout.
    ConstantInputs,
}

fn model() -> Model {
    model_with(Ratio::Attribute)
}

fn model_with(ratio: Ratio) -> Model {
    let mut graph = Graph { name: "dropout".into(), ..Default::default() };
    graph.initializers.insert("x".into(), Tensor::from_f32(vec![N], &vec![1.0; N]).unwrap());
    let weights: Vec<f32> = (0..N).map(|i| 1.0 + (i % 7) as f32).collect();
    graph.nodes.push(
        Node::new("w", "Constant", &[], &["w"])
            .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![N], &weights).unwrap())),
    );
    match ratio {
        Ratio::Attribute => {
            graph.nodes.push(Node::new("drop", "Dropout", &["x"], &["y"]).with_attr("ratio", Attribute::Float(RATIO)))
        }
        Ratio::ConstantInputs => {
            graph.nodes.push(
                Node::new("ratio", "Constant", &[], &["ratio"])
                    .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![], &[RATIO]).unwrap())),
            );
            let on = Tensor::from_i64_as(edgefreeze_graph::DataType::Bool, vec![], &[1]).unwrap();
            graph.nodes.push(Node::new("on", "Constant", &[], &["on"]).with_attr("value", Attribute::Tensor(on)));
            graph.nodes.push(Node::new("drop", "Dropout", &["x", "ratio", "on"], &["y", "mask"]));
        }
    }
    graph.nodes.push(Node::new("mul", "Mul", &["y", "w"], &["yw"]));
    graph.nodes.push(Node::new("sum", "ReduceSum", &["yw"], &["loss"]).with_attr("keepdims", Attribute::Int(0)));
    graph.outputs.push(ValueInfo { name: "loss".into(), dtype: None, shape: None, doc_string: String::new() });
    prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 13)], graph, ..Default::default() }).unwrap()
}

fn run(kind: &EngineKind, bytes: &[u8], seed: i64) -> Vec<f32> {
    let mut session = edgefreeze_engine::load(kind, bytes, &EngineOptions::default()).unwrap();
    let x = Value::F32(ArrayD::from_elem(IxDyn(&[N]), 1.0));
    let s = Value::scalar_i64(seed);
    let names = session.input_names().to_vec();
    let inputs: Vec<(&str, &Value)> =
        names.iter().map(|n| (n.as_str(), if n == DROPOUT_SEED { &s } else { &x })).collect();
    let out = session.run(&inputs).unwrap();
    let grad = session.output_names().iter().position(|n| n == "grad.x").unwrap();
    out[grad].as_f32().unwrap().iter().copied().collect()
}

#[test]
fn the_mask_is_replayable_the_same_on_every_engine_and_differentiated() {
    check_mask(Ratio::Attribute);
}

#[test]
fn a_training_mode_export_with_constant_ratio_inputs_trains_with_the_seeded_mask() {
    check_mask(Ratio::ConstantInputs);
}

#[test]
fn a_ratio_computed_at_run_time_is_a_clear_error() {
    let mut m = model_with(Ratio::ConstantInputs);
    // Feed the ratio from a graph input instead of the Constant node.
    m.graph.nodes.retain(|n| n.name != "ratio");
    m.graph.inputs.push(ValueInfo::new("ratio", edgefreeze_graph::DataType::Float32, vec![]));
    let m = prepare(m).unwrap();
    let err = gradient_graph(&m, &Loss::Output, &[]).unwrap_err().to_string();
    assert!(err.contains("drop") && err.contains("ratio") && err.contains("constant"), "{err}");
}

fn check_mask(ratio: Ratio) {
    let graph = gradient_graph(&model_with(ratio), &Loss::Output, &[]).unwrap();
    assert!(graph.graph.inputs.iter().any(|v| v.name == DROPOUT_SEED));
    let bytes = edgefreeze_graph::save::encode_model(&graph);
    let ort = EngineKind::Ort(Provider::Cpu);
    let a = run(&ort, &bytes, 42);
    assert_eq!(a, run(&ort, &bytes, 42), "the same seed replays the same mask");
    assert_eq!(a, run(&EngineKind::Tract, &bytes, 42), "tract draws the same mask");
    let b = run(&ort, &bytes, 43);
    assert_ne!(a, b, "another seed draws another mask");
    // d loss / d x = mask · w / (1 − ratio): zero where dropped, the scaled weight elsewhere.
    let mut dropped = 0;
    for (i, g) in a.iter().enumerate() {
        let w = 1.0 + (i % 7) as f32;
        if *g == 0.0 {
            dropped += 1;
        } else {
            assert!((g - w / (1.0 - RATIO)).abs() < 1e-5, "element {i}: {g}");
        }
    }
    let fraction = dropped as f64 / N as f64;
    assert!((fraction - RATIO as f64).abs() < 0.03, "dropped {fraction:.3} of the elements for a ratio of {RATIO}");
    // Masks of different seeds are nearly independent.
    let both = a.iter().zip(&b).filter(|(x, y)| **x == 0.0 && **y == 0.0).count() as f64 / N as f64;
    assert!((both - (RATIO * RATIO) as f64).abs() < 0.03, "joint drop rate {both:.3}");
}

#[test]
fn the_eval_graph_turns_dropout_off() {
    let mut m = model();
    m.graph.outputs[0].name = "loss".into();
    // The eval graph needs a classifier output; check the rewrite directly instead.
    let eval = edgefreeze_autodiff::eval_graph(&m, &Loss::Output).unwrap();
    assert!(eval.graph.nodes.iter().all(|n| n.op_type != "Dropout"));
    assert!(eval.graph.inputs.iter().all(|v| v.name != DROPOUT_SEED));
}
