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

fn model() -> Model {
    let mut graph = Graph { name: "dropout".into(), ..Default::default() };
    graph.initializers.insert("x".into(), Tensor::from_f32(vec![N], &vec![1.0; N]).unwrap());
    let weights: Vec<f32> = (0..N).map(|i| 1.0 + (i % 7) as f32).collect();
    graph.nodes.push(
        Node::new("w", "Constant", &[], &["w"])
            .with_attr("value", Attribute::Tensor(Tensor::from_f32(vec![N], &weights).unwrap())),
    );
    graph.nodes.push(Node::new("drop", "Dropout", &["x"], &["y"]).with_attr("ratio", Attribute::Float(RATIO)));
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
    let graph = gradient_graph(&model(), &Loss::Output, &[]).unwrap();
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
