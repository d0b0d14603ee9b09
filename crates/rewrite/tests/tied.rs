//! A weight read on both sides of a cut (tied weights): the cached pair freezes it with
//! the front, as the frozen-prefix step does; the split refuses it, since two machines
//! cannot update one tensor.

mod common;

use common::{distance, engines, floats, run};
use edgefreeze_autodiff::{Loss, Optimizer};
use edgefreeze_engine::Value;
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, analyse, prepare};
use edgefreeze_rewrite::{
    ACTIVATION, RewriteError, SplitOptions, StepSpec, frozen_prefix_step, prefix_graph, split, suffix_step,
};
use ndarray::{ArrayD, IxDyn};
use std::collections::HashMap;

/// logits = relu(x·W)·W, with one W of 4×4.
fn tied() -> Model {
    let w: Vec<f32> = (0..16).map(|i| ((i * 7 % 11) as f32 - 5.0) / 10.0).collect();
    let mut graph = Graph {
        name: "tied".into(),
        nodes: vec![
            Node::new("first", "MatMul", &["x", "w"], &["a"]),
            Node::new("relu", "Relu", &["a"], &["b"]),
            Node::new("second", "MatMul", &["b", "w"], &["logits"]),
        ],
        inputs: vec![ValueInfo::new("x", DataType::Float32, vec![Dim::Symbol("N".into()), Dim::Fixed(4)])],
        outputs: vec![ValueInfo { name: "logits".into(), dtype: None, shape: None, doc_string: String::new() }],
        ..Default::default()
    };
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![4, 4], &w).unwrap());
    prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() }).unwrap()
}

fn spec() -> StepSpec {
    StepSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 },
    }
}

#[test]
fn a_tied_weight_is_frozen_in_the_suffix_and_refused_by_the_split() {
    let m = tied();
    let analysis = analyse(&m).unwrap();
    assert_eq!(analysis.cuts.iter().map(|c| c.after_layer).collect::<Vec<_>>(), [0]);
    let err = split(&m, 0, &spec(), SplitOptions::default()).unwrap_err();
    assert!(matches!(&err, RewriteError::SharedParameter { name, .. } if name == "w"), "{err}");
    let suffix = suffix_step(&m, 0, &spec()).unwrap();
    assert!(suffix.graph.outputs.iter().all(|o| o.name != "updated.w"), "the frozen front's weight is not trained");
    let frozen = frozen_prefix_step(&m, &spec(), 1, &[]).unwrap();
    let prefix = prefix_graph(&m, 0).unwrap();
    let x: Vec<f32> = (0..12).map(|i| (i as f32 - 6.0) / 4.0).collect();
    let mut given: HashMap<String, Value> = HashMap::new();
    given.insert("x".into(), Value::F32(ArrayD::from_shape_vec(IxDyn(&[3, 4]), x).unwrap()));
    given.insert("labels".into(), Value::I64(ArrayD::from_shape_vec(IxDyn(&[3]), vec![0, 2, 3]).unwrap()));
    given.insert(
        "w".into(),
        Value::F32(ArrayD::from_shape_vec(IxDyn(&[4, 4]), m.graph.initializers["w"].to_f32_vec().unwrap()).unwrap()),
    );
    for (engine, kind) in engines() {
        let expected = run(&kind, &frozen, &given);
        let mut with_activation = given.clone();
        with_activation.insert(ACTIVATION.into(), run(&kind, &prefix, &given).remove(ACTIVATION).unwrap());
        let got = run(&kind, &suffix, &with_activation);
        let (diff, norm) = distance(&floats(&got["loss"]), &floats(&expected["loss"]));
        assert!(diff <= 1e-6 * norm, "{engine}: loss");
        assert_eq!(got.len(), expected.len(), "{engine}: the same outputs");
    }
}
