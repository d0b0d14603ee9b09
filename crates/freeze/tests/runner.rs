//! The reference runner on its own thread: it builds the int8 model from the live
//! parameters it is sent, answers probes with SP losses, never makes the caller wait
//! unless asked to, and reports failures as replies.

use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_freeze::reference::{probe_model, probe_name};
use edgefreeze_freeze::{ReferenceRunner, Reply, Request};
use edgefreeze_graph::analyse;
use edgefreeze_graph::save::encode_model;
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

#[test]
fn the_runner_rebuilds_and_measures_off_the_calling_thread() {
    let m = edgefreeze_graph::import(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet5.onnx")).unwrap();
    let analysis = analyse(&m).unwrap();
    let one = EngineOptions { threads: Some(1), ..Default::default() };
    let mut runner = ReferenceRunner::spawn(EngineKind::Tract, one.clone(), analysis.clone(), vec![0, 1], 2).unwrap();
    let batch: Vec<f32> = (0..8 * 28 * 28).map(|i| ((i * 7919) % 255) as f32 / 255.0 - 0.5).collect();
    let input = Value::F32(ArrayD::from_shape_vec(IxDyn(&[8, 1, 28, 28]), batch).unwrap());

    // A probe before any reference model is a failure reply, not a panic or a hang.
    runner.send(Request::Probe { step: 1, layer: 0, input: input.clone(), train: vec![0.0; 8] }).unwrap();
    assert!(matches!(runner.wait().unwrap(), Reply::Failed { step: 1, .. }));
    assert!(runner.poll().unwrap().is_empty(), "nothing else is pending");

    runner.send(Request::Rebuild { step: 2, model: Box::new(m.clone()), calibration: input.clone() }).unwrap();
    // The float model's own activation: the int8 copy must be close to it.
    let mut float =
        edgefreeze_engine::load(&EngineKind::Tract, &encode_model(&probe_model(&m, &analysis, &[1]).unwrap()), &one)
            .unwrap();
    let outs = float.run(&[("input", &input)]).unwrap();
    let i = float.output_names().iter().position(|n| *n == probe_name(1)).unwrap();
    let train: Vec<f32> = outs[i].as_f32().unwrap().iter().copied().collect();
    runner.send(Request::Probe { step: 3, layer: 1, input: input.clone(), train }).unwrap();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        replies.push(runner.wait().unwrap());
    }
    assert!(matches!(replies[0], Reply::Rebuilt { step: 2, nodes, .. } if nodes > m.graph.nodes.len()));
    match replies[1] {
        Reply::Plasticity { step: 3, ref values, seconds } => {
            let [(1, sp)] = values[..] else { panic!("one value, of layer 1: {values:?}") };
            assert!(sp < 1e-4, "SP {sp}");
            assert!(seconds > 0.0);
        }
        ref other => panic!("expected a plasticity value, got {other:?}"),
    }
    assert!(runner.busy_seconds() > 0.0);
    // A layer the reference does not expose is an error reply naming it.
    runner.send(Request::Probe { step: 4, layer: 3, input, train: vec![0.0; 8 * 84] }).unwrap();
    match runner.wait().unwrap() {
        Reply::Failed { step: 4, message } => assert!(message.contains("layer 3"), "{message}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn measurements_run_the_float_model_at_the_given_parameters_on_the_fixed_batch() {
    let (m, mut runner, input) = runner_on("lenet5.onnx", vec![0, 1]);
    // The parameters (the trainer sends the state's: parameters and statistics).
    let own = values_of(&m, |n, _| n.ends_with(".weight") || n.ends_with(".bias"));

    // Before any reference model there is no probe batch: a failure reply.
    runner.send(Request::Measure { step: 1, layers: vec![0], parameters: own.clone() }).unwrap();
    assert!(matches!(runner.wait().unwrap(), Reply::Failed { step: 1, .. }));

    runner.send(Request::Rebuild { step: 2, model: Box::new(m.clone()), calibration: input }).unwrap();
    assert!(matches!(runner.wait().unwrap(), Reply::Rebuilt { step: 2, .. }));
    let mut measure = |step: u64, layer: usize, parameters: Vec<(String, Value)>| {
        runner.send(Request::Measure { step, layers: vec![layer], parameters }).unwrap();
        match runner.wait().unwrap() {
            Reply::Plasticity { step: s, values, .. } if s == step && values.len() == 1 && values[0].0 == layer => {
                values[0].1
            }
            other => panic!("expected a plasticity value, got {other:?}"),
        }
    };
    // At the reference's own parameters only the int8 rounding separates them (the
    // bound of tests/reference.rs), and the same parameters give the same value, to
    // the bit: the batch is fixed.
    let at_own = measure(3, 1, own.clone());
    assert!(at_own < 6e-4, "SP {at_own}");
    assert_eq!(measure(4, 1, own.clone()).to_bits(), at_own.to_bits());
    // Parameters moved away from the reference's (conv2's weights reversed) are
    // measured as such: far more than the rounding.
    let moved: Vec<(String, Value)> = own
        .iter()
        .map(|(n, v)| match (n.as_str(), v) {
            ("conv2.weight", Value::F32(a)) => {
                let shape = a.shape().to_vec();
                let mut values: Vec<f32> = a.iter().copied().collect();
                values.reverse();
                (n.clone(), Value::F32(ArrayD::from_shape_vec(IxDyn(&shape), values).unwrap()))
            }
            _ => (n.clone(), v.clone()),
        })
        .collect();
    let at_moved = measure(5, 1, moved.clone());
    assert!(at_moved > 10.0 * at_own.max(1e-9), "SP {at_moved} moved, {at_own} at the reference's parameters");
    // Layer 0 comes before conv2: moving conv2 does not change it.
    assert_eq!(measure(6, 0, moved.clone()).to_bits(), measure(7, 0, own.clone()).to_bits());

    // Both layers in one request: one forward pass, the same values as one at a time.
    let (l0, l1) = (measure(8, 0, moved.clone()), measure(9, 1, moved.clone()));
    runner.send(Request::Measure { step: 10, layers: vec![0, 1], parameters: moved }).unwrap();
    match runner.wait().unwrap() {
        Reply::Plasticity { step: 10, values, .. } => {
            assert_eq!(
                values.iter().map(|v| (v.0, v.1.to_bits())).collect::<Vec<_>>(),
                [(0, l0.to_bits()), (1, l1.to_bits())]
            )
        }
        other => panic!("expected plasticity values, got {other:?}"),
    }
    // A layer the reference model does not expose fails the request, naming it.
    runner.send(Request::Measure { step: 11, layers: vec![0, 7], parameters: own }).unwrap();
    match runner.wait().unwrap() {
        Reply::Failed { step: 11, message } => assert!(message.contains("layer 7"), "{message}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn batch_norm_models_are_measured_on_tract() {
    // tract runs a BatchNormalization only when its parameters and statistics are
    // constants; the live model takes them as inputs, and `--freeze auto` on any
    // BatchNorm model with the default engine stopped at its first probe ("Params are not
    // const") until the live model spelled them out.
    let (m, mut runner, input) = runner_on("resnet20_28.onnx", vec![1, 5]);
    // What the trainer sends: every float state tensor, running statistics included.
    let own = values_of(&m, |_, t| t.dtype().is_float());
    assert!(own.iter().any(|(n, _)| n.ends_with("running_var")));
    runner.send(Request::Rebuild { step: 1, model: Box::new(m.clone()), calibration: input }).unwrap();
    assert!(matches!(runner.wait().unwrap(), Reply::Rebuilt { step: 1, .. }));
    runner.send(Request::Measure { step: 2, layers: vec![1, 5], parameters: own }).unwrap();
    match runner.wait().unwrap() {
        // At the reference's own parameters only the int8 rounding separates them.
        Reply::Plasticity { step: 2, values, .. } => {
            assert_eq!(values.iter().map(|v| v.0).collect::<Vec<_>>(), [1, 5]);
            assert!(values.iter().all(|&(_, sp)| sp < 6e-4), "{values:?}");
        }
        other => panic!("expected plasticity values, got {other:?}"),
    }
}

/// A bundled 28×28 model, a tract reference runner probing `probes` of it (one thread,
/// probe batch of 4), and a fixed batch of 8 to calibrate with.
fn runner_on(file: &str, probes: Vec<usize>) -> (edgefreeze_graph::Model, ReferenceRunner, Value) {
    let m = edgefreeze_graph::import(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file)).unwrap();
    let analysis = analyse(&m).unwrap();
    let one = EngineOptions { threads: Some(1), ..Default::default() };
    let runner = ReferenceRunner::spawn(EngineKind::Tract, one, analysis, probes, 4).unwrap();
    let batch: Vec<f32> = (0..8 * 28 * 28).map(|i| ((i * 7919) % 255) as f32 / 255.0 - 0.5).collect();
    (m, runner, Value::F32(ArrayD::from_shape_vec(IxDyn(&[8, 1, 28, 28]), batch).unwrap()))
}

/// The model's initializers that `keep` selects, as engine values.
fn values_of(
    m: &edgefreeze_graph::Model,
    keep: impl Fn(&str, &edgefreeze_graph::Tensor) -> bool,
) -> Vec<(String, Value)> {
    m.graph
        .initializers
        .iter()
        .filter(|(n, t)| keep(n, t))
        .map(|(n, t)| (n.clone(), edgefreeze_train::tensors::value_from_tensor(n, t).unwrap()))
        .collect()
}
