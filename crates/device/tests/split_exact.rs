//! The pipeline with the rewrite crate's real split graphs on an engine, against local
//! training with the unsplit training-step graph, on the same batches: parameters and
//! optimizer state after N steps agree within f32 rounding for M = 1, 2 and 4
//! micro-batches, pipelined and sequential, for models without BatchNorm (MLP, LeNet-5).
//!
//! The edge here is in-process ([`LocalEdge`]): the split's edge step and edge apply
//! graphs in their own workspace behind the pipeline's `Link` trait, in the edge server's
//! arithmetic (n_i-weighted gradient sums, their mean applied with `grad_scale` = 1). No network: the
//! gRPC edge is tested end to end in the CLI's tests.

use edgefreeze_autodiff::training::{TrainingSpec, UPDATED_PREFIX, training_step_graph};
use edgefreeze_autodiff::{Loss, Optimizer};
use edgefreeze_device::compute::{DeviceGraphs, GraphDevice, LEARNING_RATE};
use edgefreeze_device::local::LocalEdge;
use edgefreeze_device::pipeline::{Mode, StepSettings, run_step, split_batch};
use edgefreeze_engine::{EngineKind, EngineOptions, StateUpdates, Value};
use edgefreeze_graph::save::encode_model;
use edgefreeze_rewrite::{SplitOptions, StepSpec, split};
use edgefreeze_train::tensors::value_from_tensor;
use ndarray::{ArrayD, IxDyn};
use std::path::PathBuf;

fn model(name: &str) -> edgefreeze_graph::Model {
    edgefreeze_graph::import(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)).unwrap()
}

fn options() -> EngineOptions {
    EngineOptions { threads: Some(1), ..EngineOptions::default() }
}

const OPTIMIZER: Optimizer = Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 };

fn loss() -> Loss {
    Loss::cross_entropy()
}

fn outputs_updating(model: &edgefreeze_graph::Model, state: &[String]) -> StateUpdates {
    let outputs: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
    StateUpdates::where_output_exists(UPDATED_PREFIX, state.iter().map(String::as_str), &outputs)
}

fn batch(step: u64, n: usize, sample: &[usize]) -> (Value, Value) {
    // Deterministic pseudo-random inputs in [-1, 1) and labels in 0..10.
    let len: usize = sample.iter().product();
    let mut x = Vec::with_capacity(n * len);
    let mut z = 0x2545_f491_4f6c_dd1d_u64 ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..n * len {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        x.push((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0);
    }
    let mut shape = vec![n];
    shape.extend_from_slice(sample);
    let labels: Vec<i64> = (0..n).map(|i| ((i as u64 * 7 + step * 3) % 10) as i64).collect();
    (
        Value::F32(ArrayD::from_shape_vec(IxDyn(&shape), x).unwrap()),
        Value::I64(ArrayD::from_shape_vec(IxDyn(&[n]), labels).unwrap()),
    )
}

fn relative(a: &Value, b: &Value) -> f64 {
    let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
    let diff: f64 = a.iter().zip(b.iter()).map(|(x, y)| f64::from(x - y).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
    diff / norm.max(1e-30)
}

const STEPS: u64 = 3;
const BATCH: usize = 8;
const LR: f64 = 0.05;

/// Local training with the unsplit training step → the state after `STEPS` steps.
fn local(
    m: &edgefreeze_graph::Model,
    sample: &[usize],
    names: &[String],
    initial: &[(String, Value)],
    loss: &Loss,
) -> Vec<(String, Value)> {
    let spec = TrainingSpec { loss: loss.clone(), optimizer: OPTIMIZER, frozen: Vec::new() };
    let graph = training_step_graph(m, &spec).unwrap();
    let mut ws = edgefreeze_engine::workspace(&EngineKind::Tract, &options()).unwrap();
    for (n, v) in initial {
        ws.set_state(n, v.clone()).unwrap();
    }
    let id = ws.load_graph(&encode_model(&graph), outputs_updating(&graph, names)).unwrap();
    let lr = Value::scalar_f32(LR as f32);
    for step in 0..STEPS {
        let (x, y) = batch(step, BATCH, sample);
        ws.run(id, &[("input", &x), ("labels", &y), (LEARNING_RATE, &lr)]).unwrap();
    }
    names.iter().map(|n| (n.clone(), ws.state(n).unwrap())).collect()
}

fn split_training(onnx: &str, sample: &[usize], cuts: &[usize], loss: &Loss) {
    let m = model(onnx);
    let spec = StepSpec { loss: loss.clone(), optimizer: OPTIMIZER };
    for &cut in cuts {
        let graphs = split(&m, cut, &spec, SplitOptions::default()).unwrap();
        let initial: Vec<(String, Value)> =
            graphs.state.iter().map(|(n, t)| (n.clone(), value_from_tensor(n, t).unwrap())).collect();
        let names: Vec<String> = initial.iter().map(|(n, _)| n.clone()).collect();
        let want = local(&m, sample, &names, &initial, loss);
        let side = |s| graphs.manifest.state.iter().filter(move |e| e.side == Some(s)).map(|e| e.name.clone());
        let device_names: Vec<String> = side(edgefreeze_autodiff::artifacts::Side::Device).collect();
        let edge_names: Vec<String> = side(edgefreeze_autodiff::artifacts::Side::Edge).collect();
        assert_eq!(device_names.len() + edge_names.len(), names.len());
        for (mb, mode) in [
            (1, Mode::Sequential),
            (2, Mode::Pipelined { max_in_flight: 2 }),
            (4, Mode::Pipelined { max_in_flight: 4 }),
        ] {
            let pick =
                |which: &[String]| initial.iter().filter(|(n, _)| which.contains(n)).cloned().collect::<Vec<_>>();
            let mut device = GraphDevice::new(
                DeviceGraphs {
                    forward: graphs.device_forward.clone(),
                    backward: graphs.device_backward.clone(),
                    apply: graphs.device_apply.clone(),
                    state: pick(&device_names),
                },
                "input",
                &EngineKind::Tract,
                &options(),
            )
            .unwrap();
            let mut edge = LocalEdge::new(&graphs, &initial, &EngineKind::Tract, &options(), loss).unwrap();
            for s in 0..STEPS {
                let (x, y) = batch(s, BATCH, sample);
                let settings = StepSettings {
                    session: "local".into(),
                    step: s,
                    version: 1,
                    lr: LR,
                    mode,
                    frozen_device: false,
                    checkpoint: false,
                    loss: loss.clone(),
                };
                let report = run_step(&mut device, &mut edge, &split_batch(&x, &y, mb).unwrap(), &settings).unwrap();
                assert_eq!(report.micro_batches, mb);
                assert!(report.loss.is_finite());
            }
            let mut worst: f64 = 0.0;
            let mut got = device.state().unwrap();
            got.extend(edge.state().unwrap());
            for (name, want) in &want {
                let (_, value) = got.iter().find(|(n, _)| n == name).unwrap();
                // Both run in f32; the gradient is summed in another order (and, for
                // M > 1, as weighted micro-batch means), a few ulps per gradient, which
                // three small updates carry into the parameters at about 1e-7.
                let err = relative(value, want);
                assert!(err < 1e-5, "{onnx} cut {cut} M={mb}: {name} differs by {err:e}");
                worst = worst.max(err);
            }
            eprintln!("{onnx} cut {cut} M={mb} {mode:?}: largest relative L2 difference {worst:.2e}");
        }
    }
}

#[test]
fn mlp_split_training_equals_local_training() {
    split_training("mlp.onnx", &[1, 28, 28], &[0, 1], &loss());
}

/// With an ignored label the micro-batches count different numbers of labels (label 7
/// is ignored: one in step 0's first half of 4 samples, none in its second), so each
/// weighs by the labels it counts, not by its samples, on both sides; the step is then
/// the whole batch's mean over its counted labels, as local training's.
#[test]
fn mlp_split_training_with_an_ignored_label_equals_local_training() {
    let (_, labels) = batch(0, BATCH, &[1, 28, 28]);
    let first_half: Vec<i64> = labels.as_i64().unwrap().iter().take(BATCH / 2).copied().collect();
    assert!(first_half.contains(&7) && !labels.as_i64().unwrap().iter().skip(BATCH / 2).any(|&l| l == 7));
    let ignoring = Loss::CrossEntropy { label_smoothing: 0.0, ignore_index: Some(7) };
    split_training("mlp.onnx", &[1, 28, 28], &[0, 1], &ignoring);
}

#[test]
fn lenet5_split_training_equals_local_training() {
    split_training("lenet5.onnx", &[1, 28, 28], &[1], &loss());
}
