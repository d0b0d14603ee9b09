//! The cross-entropy loss stays finite however far apart the logits are, on every engine:
//! tract's LogSoftmax is −∞ where a probability underflows in float32, and the loss once
//! multiplied that by the zero target of every other class (NaN).

use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

#[test]
fn cross_entropy_of_logits_far_apart_is_finite_and_exact() {
    let mut graph = Graph { name: "logits".into(), ..Default::default() };
    graph.inputs.push(ValueInfo::new("x", DataType::Float32, vec![Dim::Symbol("batch".into()), Dim::Fixed(3)]));
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![3], &[1.0; 3]).unwrap());
    graph.nodes.push(Node::new("scale", "Mul", &["x", "w"], &["logits"]));
    graph.outputs.push(ValueInfo { name: "logits".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
        .unwrap();
    let grad = gradient_graph(&model, &Loss::CrossEntropy { label_smoothing: 0.0 }, &[]).unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    // exp(-227) and exp(-150) are 0 in float32 (and float64 keeps them): the first row's
    // label is its largest logit, the second's is 227 below it.
    let logits = [[0.0f32, -150.0, 77.0], [0.0, 77.0, -150.0], [1.0, 2.0, 3.0]];
    let labels = [2i64, 2, 0];
    let expected: f64 = logits
        .iter()
        .zip(labels)
        .map(|(row, label)| {
            let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            lse - row[label as usize] as f64
        })
        .sum::<f64>()
        / 3.0;
    let x = Value::F32(ArrayD::from_shape_vec(IxDyn(&[3, 3]), logits.concat()).unwrap());
    let y = Value::I64(ArrayD::from_shape_vec(IxDyn(&[3]), labels.to_vec()).unwrap());
    let w = Value::F32(ArrayD::from_elem(IxDyn(&[3]), 1.0));
    for kind in [EngineKind::Ort(Provider::Cpu), EngineKind::Tract] {
        let mut session = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
        let names = session.input_names().to_vec();
        let feeds: Vec<(&str, &Value)> = names
            .iter()
            .map(|n| {
                (
                    n.as_str(),
                    match n.as_str() {
                        "x" => &x,
                        "w" => &w,
                        _ => &y,
                    },
                )
            })
            .collect();
        let out = session.run(&feeds).unwrap();
        let at = |name: &str| session.output_names().iter().position(|o| o == name).unwrap();
        let loss = out[at("loss")].as_f32().unwrap().iter().copied().next().unwrap() as f64;
        assert!((loss - expected).abs() <= 1e-6 * expected, "{kind}: loss {loss}, float64 {expected}");
        let g: Vec<f32> = out[at("grad.w")].as_f32().unwrap().iter().copied().collect();
        assert!(g.iter().all(|v| v.is_finite()), "{kind}: {g:?}");
    }
}
