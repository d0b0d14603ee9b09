//! The edge server with its default builder, the rewrite crate's split: the device half
//! runs here locally (device forward of the same split), the edge half on the server.

mod common;

use common::*;
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_wire::pb::ApplyUpdateRequest;

const LR: f64 = 0.5;

fn run(bytes: &[u8], feeds: &[(&str, &Value)]) -> Vec<(String, Value)> {
    let mut s =
        edgefreeze_engine::load(&EngineKind::Tract, bytes, &EngineOptions { threads: Some(1), ..Default::default() })
            .unwrap();
    let names = s.output_names().to_vec();
    names.into_iter().zip(s.run(feeds).unwrap()).collect()
}

/// MLP cut after layer 0, two micro-batches of 4: the edge parameters after one update
/// equal the unsplit training step's on the whole batch of 8, and every micro-batch's
/// reply carries the activation gradient. Tolerance: both sides compute the same f32
/// products and sums, in other orders (micro-batch sums of 4 + 4 against one of 8, and
/// the engine's blocking of 256-long dot products); a relative L2 error of 1e-4 on the
/// update is above the worst-case bound n·ε ≈ 256 × 6e-8 ≈ 1.5e-5 and far below a
/// missing or doubled micro-batch (~50%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_session_updates_like_the_unsplit_step() {
    let lines = Lines::default();
    let server = start(config(edgefreeze_edge::side::split_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let open = c.open_session(open_request("run", split_request("mlp", 0, 2, false), None)).await.unwrap().into_inner();
    assert!(open.returns_activation_grad);
    assert_eq!(open.activation.as_ref().unwrap().dims, vec![-1, 256]);

    // The device half, locally.
    let model = edgefreeze_graph::import(repo().join("models/mlp.onnx")).unwrap();
    let spec = edgefreeze_rewrite::StepSpec {
        loss: edgefreeze_autodiff::Loss::cross_entropy(),
        optimizer: edgefreeze_autodiff::Optimizer::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 },
    };
    let graphs = edgefreeze_rewrite::split(&model, 0, &spec, edgefreeze_rewrite::SplitOptions::default()).unwrap();
    let state: Vec<(String, Value)> = graphs
        .state
        .iter()
        .map(|(n, t)| (n.clone(), edgefreeze_train::tensors::value_from_tensor(n, t).unwrap()))
        .collect();
    let forward = edgefreeze_graph::save::encode_model(&graphs.device_forward);
    let x = noise(11, 8 * 784);
    let y = labels(11, 8, 10);
    let mut ups = Vec::new();
    for m in 0..2 {
        let xm = Value::F32(
            ndarray::ArrayD::from_shape_vec(vec![4, 1, 28, 28], x[m * 3136..(m + 1) * 3136].to_vec()).unwrap(),
        );
        let mut feeds: Vec<(&str, &Value)> = vec![("input", &xm)];
        for i in &graphs.device_forward.graph.inputs {
            if let Some((n, v)) = state.iter().find(|(n, _)| *n == i.name) {
                feeds.push((n.as_str(), v));
            }
        }
        let out = run(&forward, &feeds);
        let activation = f32s(&out.iter().find(|(n, _)| n == "activation").unwrap().1);
        ups.push(up(&open, 0, m as u32, &activation, &[4, 256], &y[m * 4..(m + 1) * 4]));
    }
    let (downs, status) = stream(&mut c, ups).await;
    assert!(status.is_none(), "{status:?}\n{}", lines.dump());
    for d in &downs {
        let g = d.activation_grad.as_ref().unwrap();
        assert_eq!(g.shape, vec![4, 256]);
    }
    c.apply_update(ApplyUpdateRequest {
        header: Some(header_of(&open, 0)),
        lr: LR,
        checkpoint: false,
        after_last_micro_batch: false,
    })
    .await
    .unwrap();
    let after = fetch(&mut c, &open, 1).await;

    // The unsplit step on the whole batch.
    let train = edgefreeze_autodiff::training_step_graph(
        &model,
        &edgefreeze_autodiff::TrainingSpec {
            loss: spec.loss.clone(),
            optimizer: spec.optimizer.clone(),
            frozen: vec![],
        },
    )
    .unwrap();
    let xv = Value::F32(ndarray::ArrayD::from_shape_vec(vec![8, 1, 28, 28], x.clone()).unwrap());
    let yv = Value::I64(ndarray::ArrayD::from_shape_vec(vec![8], y.clone()).unwrap());
    let lr = Value::scalar_f32(LR as f32);
    let mut feeds: Vec<(&str, &Value)> = vec![("input", &xv), ("labels", &yv), ("lr", &lr)];
    for i in &train.graph.inputs {
        if let Some((n, v)) = state.iter().find(|(n, _)| *n == i.name) {
            feeds.push((n.as_str(), v));
        }
    }
    let reference = run(&edgefreeze_graph::save::encode_model(&train), &feeds);
    assert!(!after.is_empty());
    for (name, value) in &after {
        let p0 = f32s(&state.iter().find(|(n, _)| n == name).unwrap().1);
        let p1 = f32s(value);
        let expected = f32s(&reference.iter().find(|(n, _)| *n == format!("updated.{name}")).unwrap().1);
        let edge_update: Vec<f32> = p1.iter().zip(&p0).map(|(a, b)| a - b).collect();
        let local_update: Vec<f32> = expected.iter().zip(&p0).map(|(a, b)| a - b).collect();
        let err = rel_l2(&edge_update, &local_update);
        assert!(err < 1e-4, "{name}: relative L2 error {err:e} of the update");
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cut_is_refused_with_the_valid_ones() {
    let lines = Lines::default();
    let server = start(config(edgefreeze_edge::side::split_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let status = c.open_session(open_request("run", split_request("mlp", 7, 1, false), None)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("not a valid cut"), "{status:?}");
    assert!(lines.contains("not a valid cut"));
    assert!(server.sessions().is_empty());
    server.shutdown().await.unwrap();
}
