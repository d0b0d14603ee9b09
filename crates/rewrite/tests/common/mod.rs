//! Shared helpers of the rewrite tests: bundled models, deterministic feeds keyed by
//! name (so the same tensor gets the same value in every graph), and engine runs.
#![allow(dead_code)]

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::{DataType, Model, Tensor, import};
use ndarray::{ArrayD, IxDyn};
use std::collections::HashMap;
use std::path::PathBuf;

/// The two engines every rewrite is checked on.
pub fn engines() -> [(&'static str, EngineKind); 2] {
    [("ort", EngineKind::Ort(Provider::Cpu)), ("tract", EngineKind::Tract)]
}

/// A bundled model, imported.
pub fn model(file: &str) -> Model {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(file);
    import(&path).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// A zoo fixture's model (`tests/fixtures/zoo/<stem>.onnx`), imported.
pub fn zoo(stem: &str) -> Model {
    let path = zoo_dir().join(format!("{stem}.onnx"));
    import(&path).unwrap_or_else(|e| panic!("{stem}: {e}"))
}

/// Stems of every zoo fixture model.
pub fn zoo_fixtures() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(zoo_dir())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_string_lossy().strip_suffix(".onnx").map(String::from))
        .collect();
    stems.sort();
    stems
}

fn zoo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo")
}

/// Every bundled model file.
pub fn bundled() -> Vec<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".onnx"))
        .collect();
    files.sort();
    files
}

/// A small deterministic generator (an LCG) seeded from a name.
pub struct Draw(u64);

impl Draw {
    pub fn new(key: &str) -> Draw {
        Draw(key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)))
    }
    /// Uniform in [0, 1).
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn f32_value(dims: &[usize], values: Vec<f32>) -> Value {
    Value::F32(ArrayD::from_shape_vec(IxDyn(dims), values).unwrap())
}

pub fn tensor_value(t: &Tensor) -> Value {
    match t.dtype() {
        DataType::Int64 => Value::I64(ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_i64_vec().unwrap()).unwrap()),
        _ => f32_value(t.dims(), t.to_f32_vec().unwrap()),
    }
}

/// The training state of a model: its initializers, with BatchNorm running statistics
/// drawn away from their (0, 1) initial values so inference-mode BatchNorm is not the
/// identity, and zero optimizer state made on demand.
pub fn state_of(model: &Model) -> HashMap<String, Value> {
    let mut state: HashMap<String, Value> =
        model.graph.initializers.iter().map(|(k, t)| (k.clone(), tensor_value(t))).collect();
    for node in model.graph.nodes.iter().filter(|n| n.op_type == "BatchNormalization") {
        for (i, (low, high)) in [(3, (-0.3, 0.3)), (4, (0.5, 1.5))] {
            let name = node.input(i).unwrap().to_string();
            let t = &model.graph.initializers[&name];
            let mut d = Draw::new(&name);
            let v = (0..t.numel()).map(|_| (low + (high - low) * d.next()) as f32).collect();
            state.insert(name, f32_value(t.dims(), v));
        }
    }
    state
}

/// Data inputs and labels of a batch: `batch` samples starting at sample `first`, each
/// sample drawn from its index, so a sub-batch has the same samples as the batch.
pub fn batch_of(model: &Model, first: usize, batch: usize) -> HashMap<String, Value> {
    let mut feeds = HashMap::new();
    let classes = model.graph.outputs[0].shape.as_ref().unwrap()[1].fixed().unwrap();
    let vocab = model
        .graph
        .nodes
        .iter()
        .filter(|n| n.op_type == "Gather")
        .filter_map(|n| model.graph.initializers.get(n.input(0).unwrap()))
        .map(|t| t.dims()[0])
        .min()
        .unwrap_or(1);
    for input in &model.graph.inputs {
        let dims: Vec<usize> = input
            .shape
            .as_ref()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, d)| if i == 0 { batch } else { d.fixed().unwrap() })
            .collect();
        let per: usize = dims[1..].iter().product();
        let is_int = input.dtype == Some(DataType::Int64);
        let mut ints = Vec::new();
        let mut floats = Vec::new();
        for s in first..first + batch {
            let mut d = Draw::new(&format!("{}#{s}", input.name));
            for _ in 0..per {
                if is_int {
                    ints.push((d.next() * vocab as f64) as i64);
                } else {
                    floats.push((d.next() * 2.0 - 1.0) as f32);
                }
            }
        }
        let v = if is_int {
            Value::I64(ArrayD::from_shape_vec(IxDyn(&dims), ints).unwrap())
        } else {
            f32_value(&dims, floats)
        };
        feeds.insert(input.name.clone(), v);
    }
    // A label per sample, or per pixel (the axes behind the classes) of a class map.
    let per_sample: Vec<usize> =
        model.graph.outputs[0].shape.as_ref().unwrap()[2..].iter().map(|d| d.fixed().unwrap()).collect();
    let per: usize = per_sample.iter().product();
    let labels =
        (first..first + batch).flat_map(|s| (0..per).map(move |p| ((s * 7 + p * 3) % classes) as i64)).collect();
    let dims: Vec<usize> = std::iter::once(batch).chain(per_sample).collect();
    feeds.insert("labels".into(), Value::I64(ArrayD::from_shape_vec(IxDyn(&dims), labels).unwrap()));
    feeds
}

/// Feeds for every input of `graph`: from `given` by name, else zero optimizer state
/// shaped like its parameter, else the scalars lr = 0.05, step = 1, grad_scale = 1,
/// dropout_seed = 11.
pub fn feeds(graph: &Model, given: &HashMap<String, Value>) -> HashMap<String, Value> {
    let mut out = HashMap::new();
    for input in &graph.graph.inputs {
        let name = &input.name;
        let v = if let Some(v) = given.get(name) {
            v.clone()
        } else if ["momentum.", "adam_m.", "adam_v."].iter().any(|p| name.starts_with(p)) {
            let dims: Vec<usize> = input.shape.as_ref().unwrap().iter().map(|d| d.fixed().unwrap()).collect();
            Value::F32(ArrayD::zeros(IxDyn(&dims)))
        } else {
            match name.as_str() {
                "lr" => Value::scalar_f32(0.05),
                "step" => Value::scalar_i64(1),
                "grad_scale" => Value::scalar_f32(1.0),
                "dropout_seed" => Value::scalar_i64(11),
                other => panic!("{}: no feed for input {other:?}", graph.graph.name),
            }
        };
        out.insert(name.clone(), v);
    }
    out
}

/// Runs a graph; returns its outputs by name.
pub fn run(kind: &EngineKind, graph: &Model, given: &HashMap<String, Value>) -> HashMap<String, Value> {
    let bytes = edgefreeze_graph::save::encode_model(graph);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions { threads: Some(1), ..Default::default() })
        .unwrap_or_else(|e| panic!("{kind} loading {}: {e}", graph.graph.name));
    let feeds = feeds(graph, given);
    let names = session.input_names().to_vec();
    let inputs: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), &feeds[n])).collect();
    let outputs = session.run(&inputs).unwrap_or_else(|e| panic!("{kind} running {}: {e}", graph.graph.name));
    session.output_names().iter().cloned().zip(outputs).collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    match v {
        Value::F32(a) => a.iter().map(|&x| x as f64).collect(),
        Value::F64(a) => a.iter().copied().collect(),
        Value::I64(a) => a.iter().map(|&x| x as f64).collect(),
        Value::Bool(a) => a.iter().map(|&x| x as u8 as f64).collect(),
    }
}

/// (‖a − b‖, ‖b‖).
pub fn distance(a: &[f64], b: &[f64]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    (diff, b.iter().map(|y| y * y).sum::<f64>().sqrt())
}
