//! Runs one ONNX graph on one engine with inputs read from a safetensors file and writes
//! every output to another: how `tools/zoo_sweep.py --engine tract` checks gradient graphs
//! on the default engine, which has no Python binding of its own.
//!
//! `cargo run --release -p edgefreeze-engine --example run_graph -- ENGINE GRAPH.onnx FEEDS.safetensors OUT.safetensors`
//! ENGINE: `tract`, `ort:cpu`, ... Feeds are float32, float64, int64 or bool tensors named
//! as the graph's inputs; outputs are written in their own types.
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;

type Error = Box<dyn std::error::Error>;

fn read_feeds(path: &str) -> Result<HashMap<String, Value>, Error> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let mut feeds = HashMap::new();
    for (name, view) in file.tensors() {
        let shape = IxDyn(view.shape());
        let data = view.data();
        let value = match view.dtype() {
            Dtype::F32 => Value::F32(ArrayD::from_shape_vec(
                shape,
                data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            )?),
            Dtype::F64 => Value::F64(ArrayD::from_shape_vec(
                shape,
                data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            )?),
            Dtype::I64 => Value::I64(ArrayD::from_shape_vec(
                shape,
                data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            )?),
            Dtype::BOOL => Value::Bool(ArrayD::from_shape_vec(shape, data.iter().map(|&b| b != 0).collect())?),
            other => return Err(format!("{path}: tensor {name}: type {other:?} not handled").into()),
        };
        feeds.insert(name, value);
    }
    Ok(feeds)
}

/// A tensor as safetensors stores it: little-endian bytes, type, shape.
type Raw = (Vec<u8>, Dtype, Vec<usize>);

/// A value's bytes, type and shape.
fn raw(value: &Value) -> Raw {
    match value {
        Value::F32(a) => (a.iter().flat_map(|v| v.to_le_bytes()).collect(), Dtype::F32, a.shape().to_vec()),
        Value::F64(a) => (a.iter().flat_map(|v| v.to_le_bytes()).collect(), Dtype::F64, a.shape().to_vec()),
        Value::I64(a) => (a.iter().flat_map(|v| v.to_le_bytes()).collect(), Dtype::I64, a.shape().to_vec()),
        Value::Bool(a) => (a.iter().map(|&v| v as u8).collect(), Dtype::BOOL, a.shape().to_vec()),
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [engine, graph, feeds, out] = args.as_slice() else {
        return Err("usage: run_graph ENGINE GRAPH.onnx FEEDS.safetensors OUT.safetensors".into());
    };
    let kind: EngineKind = engine.parse()?;
    let bytes = std::fs::read(graph).map_err(|e| format!("{graph}: {e}"))?;
    let feeds = read_feeds(feeds)?;
    let mut session = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default())?;
    let names = session.input_names().to_vec();
    let missing: Vec<&String> = names.iter().filter(|n| !feeds.contains_key(*n)).collect();
    if !missing.is_empty() {
        return Err(format!("{graph}: no feed for the inputs {missing:?}").into());
    }
    let inputs: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), &feeds[n])).collect();
    let outputs = session.run(&inputs)?;
    let raws: Vec<(String, Raw)> = session.output_names().iter().cloned().zip(outputs.iter().map(raw)).collect();
    let views = raws
        .iter()
        .map(|(name, (data, dtype, shape))| Ok((name.clone(), TensorView::new(*dtype, shape.clone(), data)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, std::path::Path::new(out))?;
    Ok(())
}
