//! Shared pieces of the edge server tests: servers on loopback (port 0), devices as
//! tonic clients, deterministic data, and a local reference computation.
#![allow(dead_code)]

use edgefreeze_edge::{EdgeConfig, EdgeServer, Log, SideBuilder};
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_wire::auth::{Credentials, TokenTable};
use edgefreeze_wire::pb::{
    self, Header, MicroBatchDown, MicroBatchUp, OpenSessionRequest, OpenSessionResponse, SplitRequest,
};
use edgefreeze_wire::{EdgeClient, Limits, tensor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEVICES: usize = 8;

/// Token of test device `i` (`phone-i`).
pub fn token(i: usize) -> String {
    format!("test-token-{i:02}-0123456789abcdef")
}

pub fn tokens() -> TokenTable {
    let text: String = (0..DEVICES).map(|i| format!("phone-{i} {}\n", token(i))).collect();
    TokenTable::parse(&text, "test tokens").unwrap()
}

pub fn credentials(i: usize) -> Credentials {
    Credentials::new(&format!("phone-{i}"), &token(i)).unwrap()
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model_bytes(name: &str) -> Vec<u8> {
    std::fs::read(repo().join("models").join(format!("{name}.onnx"))).unwrap()
}

/// Log lines a server wrote.
#[derive(Clone, Default)]
pub struct Lines(pub Arc<Mutex<Vec<String>>>);

impl Lines {
    pub fn log(&self) -> Log {
        let lines = self.0.clone();
        Log::to(move |l| lines.lock().unwrap().push(l.to_string()))
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.0.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    pub fn dump(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

pub fn config(builder: SideBuilder, lines: &Lines) -> EdgeConfig {
    let mut config = EdgeConfig::new(builder);
    config.engine = EngineKind::Tract;
    config.engine_options = EngineOptions { threads: Some(1), ..Default::default() };
    config.log = lines.log();
    config
}

pub async fn start(config: EdgeConfig) -> EdgeServer {
    EdgeServer::start(config, tokens(), "127.0.0.1:0").await.unwrap()
}

pub async fn client(server: &EdgeServer, device: usize) -> EdgeClient {
    edgefreeze_wire::connect(&server.local_addr().to_string(), credentials(device), &Limits::default()).await.unwrap()
}

/// SGD without momentum or decay, cross-entropy, M micro-batches.
pub fn split_request(
    model: &str,
    cut_after_layer: u32,
    micro_batches: u32,
    frozen_device_layers: bool,
) -> SplitRequest {
    SplitRequest {
        model: model_bytes(model),
        cut_after_layer,
        loss: Some(pb::Loss {
            kind: Some(pb::loss::Kind::CrossEntropy(pb::CrossEntropy { label_smoothing: 0.0, ignore_index: None })),
        }),
        optimizer: Some(pb::Optimizer {
            kind: Some(pb::optimizer::Kind::Sgd(pb::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 })),
        }),
        micro_batches,
        frozen_device_layers,
    }
}

pub fn open_request(run_id: &str, split: SplitRequest, resume_step: Option<u64>) -> OpenSessionRequest {
    OpenSessionRequest { header: Some(Header::default()), run_id: run_id.into(), split: Some(split), resume_step }
}

/// Deterministic values in [-1, 1) from a seed (a 64-bit LCG).
pub fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn labels(seed: u64, n: usize, classes: i64) -> Vec<i64> {
    noise(seed ^ 0x5555, n).iter().map(|v| (((v + 1.0) * 0.5 * classes as f32) as i64).min(classes - 1)).collect()
}

/// A micro-batch message for an activation of shape `[n, rest...]`.
pub fn up(
    open: &OpenSessionResponse,
    step: u64,
    micro_batch: u32,
    activation: &[f32],
    shape: &[usize],
    labels: &[i64],
) -> MicroBatchUp {
    let h = open.header.as_ref().unwrap();
    MicroBatchUp {
        header: Some(Header::new(&h.session_id, step, micro_batch, h.model_version)),
        activation: Some(tensor::encode(shape, activation).unwrap()),
        labels: Some(tensor::encode(&[labels.len()], labels).unwrap()),
        dropout_seed: None,
        sent_unix_nanos: edgefreeze_wire::unix_nanos_now(),
    }
}

/// Sends micro-batches on one stream and collects the replies (or the status it ended with).
pub async fn stream(client: &mut EdgeClient, ups: Vec<MicroBatchUp>) -> (Vec<MicroBatchDown>, Option<tonic::Status>) {
    let response = client.train(tokio_stream::iter(ups)).await;
    let mut inbound = match response {
        Ok(r) => r.into_inner(),
        Err(status) => return (Vec::new(), Some(status)),
    };
    let mut downs = Vec::new();
    loop {
        match inbound.message().await {
            Ok(Some(d)) => downs.push(d),
            Ok(None) => return (downs, None),
            Err(status) => return (downs, Some(status)),
        }
    }
}

pub fn header_of(open: &OpenSessionResponse, step: u64) -> Header {
    let h = open.header.as_ref().unwrap();
    Header::new(&h.session_id, step, 0, h.model_version)
}

/// The edge state as engine values, by name.
pub async fn fetch(client: &mut EdgeClient, open: &OpenSessionResponse, step: u64) -> Vec<(String, Value)> {
    let state =
        client.fetch_state(pb::FetchStateRequest { header: Some(header_of(open, step)) }).await.unwrap().into_inner();
    state
        .tensors
        .iter()
        .map(|t| (t.name.clone(), tensor::to_value(&t.name, t.tensor.as_ref().unwrap(), &Limits::default()).unwrap()))
        .collect()
}

pub fn f32s(v: &Value) -> Vec<f32> {
    v.as_f32().unwrap().iter().copied().collect()
}

/// Relative L2 error of `a` against reference `b`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

pub const SHORT: Duration = Duration::from_millis(200);

/// A degenerate edge side for server tests that do not need a real cut: the whole
/// model's gradient graph (its input renamed `activation`, so the "device" sends the
/// model input and gets no gradient back) and an SGD apply graph `p - lr·grad.p`. It
/// exercises every session mechanism; the real split is tested in `split_sessions.rs`.
pub fn whole_model_builder() -> SideBuilder {
    use edgefreeze_edge::{EdgeSide, SideError};
    use edgefreeze_graph::{DataType, Node, ValueInfo};
    Arc::new(|spec: &edgefreeze_edge::SplitSpec| {
        let fail = |e: &dyn std::fmt::Display| SideError::Internal(e.to_string());
        let mut model = spec.model.clone();
        let input = model.graph.inputs[0].name.clone();
        model.graph.inputs[0].name = "activation".into();
        for node in &mut model.graph.nodes {
            for i in &mut node.inputs {
                if *i == input {
                    *i = "activation".into();
                }
            }
        }
        let step = edgefreeze_autodiff::gradient_graph(&model, &spec.loss, &[]).map_err(|e| fail(&e))?;
        let parameters = edgefreeze_graph::analysis::parameter_names(&spec.model.graph);
        let mut apply = edgefreeze_graph::Model { graph: Default::default(), ..spec.model.clone() };
        apply.graph.name = "sgd_apply".into();
        apply.graph.inputs.push(ValueInfo::new("lr", DataType::Float32, vec![]));
        let mut state = Vec::new();
        for p in &parameters {
            let t = &spec.model.graph.initializers[p];
            let shape = edgefreeze_graph::ir::fixed_shape(t.dims());
            apply.graph.inputs.push(ValueInfo::new(p.clone(), DataType::Float32, shape.clone()));
            apply.graph.inputs.push(ValueInfo::new(format!("grad.{p}"), DataType::Float32, shape.clone()));
            let scaled = format!("scaled.{p}");
            apply.graph.nodes.push(Node::new(format!("mul.{p}"), "Mul", &[&format!("grad.{p}"), "lr"], &[&scaled]));
            apply.graph.nodes.push(Node::new(format!("sub.{p}"), "Sub", &[p, &scaled], &[&format!("updated.{p}")]));
            apply.graph.outputs.push(ValueInfo::new(format!("updated.{p}"), DataType::Float32, shape));
            state.push((p.clone(), edgefreeze_train::tensors::value_from_tensor(p, t).map_err(|e| fail(&e))?));
        }
        let dims: Vec<i64> = match &spec.model.graph.inputs[0].shape {
            Some(shape) => shape.iter().map(|d| d.fixed().map(|v| v as i64).unwrap_or(-1)).collect(),
            None => return Err(SideError::Internal("model input has no shape".into())),
        };
        Ok(EdgeSide {
            step,
            apply,
            activation: pb::PortSpec { name: "activation".into(), dtype: pb::Dtype::F32 as i32, dims },
            labels: pb::PortSpec { name: "labels".into(), dtype: pb::Dtype::I64 as i32, dims: vec![-1] },
            parameters,
            state,
        })
    })
}

/// What the whole-model side computes locally: the gradient graph on the whole batch.
pub fn local_gradients(model: &str, input: &[f32], shape: &[usize], labels: &[i64]) -> Vec<(String, Vec<f32>)> {
    let imported = edgefreeze_graph::import(repo().join("models").join(format!("{model}.onnx"))).unwrap();
    let loss = edgefreeze_autodiff::Loss::cross_entropy();
    let grad = edgefreeze_autodiff::gradient_graph(&imported, &loss, &[]).unwrap();
    let parameters = edgefreeze_graph::analysis::parameter_names(&imported.graph);
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let mut session =
        edgefreeze_engine::load(&EngineKind::Tract, &bytes, &EngineOptions { threads: Some(1), ..Default::default() })
            .unwrap();
    let x = Value::F32(ndarray::ArrayD::from_shape_vec(shape.to_vec(), input.to_vec()).unwrap());
    let y = Value::I64(ndarray::ArrayD::from_shape_vec(vec![labels.len()], labels.to_vec()).unwrap());
    let values: Vec<(String, Value)> = parameters
        .iter()
        .map(|p| (p.clone(), edgefreeze_train::tensors::value_from_tensor(p, &imported.graph.initializers[p]).unwrap()))
        .collect();
    let input_name = imported.graph.inputs[0].name.clone();
    let mut feeds: Vec<(&str, &Value)> = vec![(input_name.as_str(), &x), ("labels", &y)];
    feeds.extend(values.iter().map(|(n, v)| (n.as_str(), v)));
    let outputs = session.run(&feeds).unwrap();
    let names = session.output_names().to_vec();
    parameters
        .iter()
        .map(|p| {
            let i = names.iter().position(|n| *n == format!("grad.{p}")).unwrap();
            (p.clone(), f32s(&outputs[i]))
        })
        .collect()
}

/// The initial parameters of a bundled model.
pub fn initial_parameters(model: &str) -> Vec<(String, Vec<f32>)> {
    let imported = edgefreeze_graph::import(repo().join("models").join(format!("{model}.onnx"))).unwrap();
    edgefreeze_graph::analysis::parameter_names(&imported.graph)
        .into_iter()
        .map(|p| {
            let v = imported.graph.initializers[&p].to_f32_vec().unwrap();
            (p, v)
        })
        .collect()
}
