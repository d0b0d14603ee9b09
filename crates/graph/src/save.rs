//! Writing a [`Model`] back to ONNX protobuf, optionally with external data, atomically.

use crate::error::{GraphError, Result};
use crate::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
use crate::tensor::Tensor;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};
use tract_onnx::pb;

/// How to save a model.
#[derive(Debug, Clone, Default)]
pub struct SaveOptions {
    /// When set, initializers of at least this many bytes go to one external data file
    /// named `<model file name>.data` beside the model.
    pub external_data_threshold: Option<usize>,
}

/// Saves a model atomically (temporary file, fsync, rename), so an existing file is never
/// left half-written.
pub fn save_model(model: &Model, path: impl AsRef<Path>, options: &SaveOptions) -> Result<()> {
    let path = path.as_ref();
    let mut external = Vec::new();
    let proto = match options.external_data_threshold {
        None => model_to_proto(model, None),
        Some(threshold) => {
            let file_name = format!(
                "{}.data",
                path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model.onnx".into())
            );
            model_to_proto(model, Some(ExternalSink { file_name, threshold, bytes: &mut external }))
        }
    };
    if options.external_data_threshold.is_some() {
        let data_path = PathBuf::from(format!("{}.data", path.display()));
        write_atomically(&data_path, &external)?;
    }
    write_atomically(path, &proto.encode_to_vec())
}

/// Encodes a model (all tensor data inline) to protobuf bytes.
pub fn encode_model(model: &Model) -> Vec<u8> {
    model_to_proto(model, None).encode_to_vec()
}

/// Writes bytes to `path` through a temporary file in the same folder, fsync and rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let io = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |error| GraphError::Io { action, path: p, error }
    };
    let mut tmp = tempfile_in(dir).map_err(io("create a temporary file in", dir))?;
    tmp.1.write_all(bytes).map_err(io("write", &tmp.0))?;
    tmp.1.sync_all().map_err(io("sync", &tmp.0))?;
    drop(tmp.1);
    std::fs::rename(&tmp.0, path).map_err(|error| {
        let _ = std::fs::remove_file(&tmp.0);
        GraphError::Io { action: "rename into", path: path.into(), error }
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let pid = std::process::id();
    for attempt in 0..1000u32 {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let candidate = dir.join(format!(".edgefreeze-tmp-{pid}-{nanos}-{attempt}"));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&candidate) {
            Ok(f) => return Ok((candidate, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("could not create a unique temporary file"))
}

struct ExternalSink<'a> {
    file_name: String,
    threshold: usize,
    bytes: &'a mut Vec<u8>,
}

fn model_to_proto(model: &Model, mut sink: Option<ExternalSink<'_>>) -> pb::ModelProto {
    pb::ModelProto {
        ir_version: model.ir_version,
        opset_import: model
            .opset_imports
            .iter()
            .map(|(domain, version)| pb::OperatorSetIdProto { domain: domain.clone(), version: *version })
            .collect(),
        producer_name: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        domain: model.domain.clone(),
        model_version: model.model_version,
        doc_string: model.doc_string.clone(),
        graph: Some(graph_to_proto(&model.graph, &mut sink)),
        metadata_props: model
            .metadata
            .iter()
            .map(|(key, value)| pb::StringStringEntryProto { key: key.clone(), value: value.clone() })
            .collect(),
        training_info: model.training_info.clone(),
        functions: model.functions.clone(),
    }
}

fn graph_to_proto(graph: &Graph, sink: &mut Option<ExternalSink<'_>>) -> pb::GraphProto {
    let initializer = graph
        .initializers
        .iter()
        .map(|(name, t)| match sink {
            Some(s) if t.raw_bytes().len() >= s.threshold && !t.raw_bytes().is_empty() => {
                // Align each tensor to 64 bytes, as ONNX's own writer does for mmap-friendliness.
                while s.bytes.len() % 64 != 0 {
                    s.bytes.push(0);
                }
                let offset = s.bytes.len();
                s.bytes.extend_from_slice(t.raw_bytes());
                let mut proto = tensor_header_proto(name, t);
                proto.data_location = Some(pb::tensor_proto::DataLocation::External as i32);
                proto.external_data = [
                    ("location", s.file_name.clone()),
                    ("offset", offset.to_string()),
                    ("length", t.raw_bytes().len().to_string()),
                ]
                .into_iter()
                .map(|(k, v)| pb::StringStringEntryProto { key: k.into(), value: v })
                .collect();
                proto
            }
            _ => tensor_to_proto(name, t),
        })
        .collect();
    pb::GraphProto {
        node: graph.nodes.iter().map(node_to_proto).collect(),
        name: graph.name.clone(),
        initializer,
        sparse_initializer: graph.extra.sparse_initializers.clone(),
        doc_string: graph.doc_string.clone(),
        input: graph.inputs.iter().chain(graph.initializer_inputs.iter()).map(value_info_to_proto).collect(),
        output: graph.outputs.iter().map(value_info_to_proto).collect(),
        value_info: graph.value_info.values().map(value_info_to_proto).collect(),
        quantization_annotation: graph.extra.quantization_annotations.clone(),
    }
}

fn node_to_proto(node: &Node) -> pb::NodeProto {
    pb::NodeProto {
        input: node.inputs.clone(),
        output: node.outputs.clone(),
        name: node.name.clone(),
        op_type: node.op_type.clone(),
        domain: node.domain.clone(),
        attribute: node
            .attributes
            .iter()
            .map(|(name, a)| match zero_constant_value(node, name, a) {
                Some(t) => attribute_to_proto("value", &Attribute::Tensor(t)),
                None => attribute_to_proto(name, a),
            })
            .collect(),
        doc_string: node.doc_string.clone(),
    }
}

/// A Constant whose `value_int` or `value_float` is zero, as the tensor it stands for.
/// The protobuf types encode a scalar field at its default (0) as absent, and ONNX's
/// shape inference refuses a Constant whose `value_int` has no value: dynamo writes such
/// Constants (ConvNeXt's), and a graph carrying one would fail `onnx.checker`. Engines
/// read the tensor form the same; other attributes at 0 read as absent mean their
/// default or are checked no further, so they stay as they are.
fn zero_constant_value(node: &Node, name: &str, a: &Attribute) -> Option<Tensor> {
    if node.op_type != "Constant" || !node.domain.is_empty() {
        return None;
    }
    match (name, a) {
        ("value_int", Attribute::Int(0)) => Tensor::from_i64(vec![], &[0]).ok(),
        ("value_float", Attribute::Float(v)) if *v == 0.0 => Tensor::from_f32(vec![], &[*v]).ok(),
        _ => None,
    }
}

fn attribute_to_proto(name: &str, a: &Attribute) -> pb::AttributeProto {
    use pb::attribute_proto::AttributeType as T;
    let mut p = pb::AttributeProto { name: name.to_string(), ..Default::default() };
    match a {
        Attribute::Float(v) => (p.r#type, p.f) = (T::Float as i32, *v),
        Attribute::Int(v) => (p.r#type, p.i) = (T::Int as i32, *v),
        Attribute::String(v) => (p.r#type, p.s) = (T::String as i32, v.clone()),
        Attribute::Tensor(t) => (p.r#type, p.t) = (T::Tensor as i32, Some(tensor_to_proto("", t))),
        Attribute::Floats(v) => (p.r#type, p.floats) = (T::Floats as i32, v.clone()),
        Attribute::Ints(v) => (p.r#type, p.ints) = (T::Ints as i32, v.clone()),
        Attribute::Strings(v) => (p.r#type, p.strings) = (T::Strings as i32, v.clone()),
        Attribute::Other(proto) => {
            p = (**proto).clone();
            p.name = name.to_string();
        }
    }
    p
}

/// Converts a tensor to a `TensorProto` with its data in `raw_data` (strings in `string_data`).
pub fn tensor_to_proto(name: &str, t: &Tensor) -> pb::TensorProto {
    pb::TensorProto {
        raw_data: t.raw_bytes().to_vec(),
        string_data: t.strings().map(|s| s.to_vec()).unwrap_or_default(),
        ..tensor_header_proto(name, t)
    }
}

/// A `TensorProto` with the tensor's name, type and dims but no data.
fn tensor_header_proto(name: &str, t: &Tensor) -> pb::TensorProto {
    pb::TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: t.dtype().to_onnx(),
        name: name.to_string(),
        ..Default::default()
    }
}

fn value_info_to_proto(v: &ValueInfo) -> pb::ValueInfoProto {
    let tensor_type = pb::type_proto::Tensor {
        elem_type: v.dtype.map(|d| d.to_onnx()).unwrap_or(0),
        shape: v.shape.as_ref().map(|s| pb::TensorShapeProto {
            dim: s
                .iter()
                .map(|d| pb::tensor_shape_proto::Dimension {
                    denotation: String::new(),
                    value: match d {
                        Dim::Fixed(n) => Some(pb::tensor_shape_proto::dimension::Value::DimValue(*n as i64)),
                        Dim::Symbol(s) => Some(pb::tensor_shape_proto::dimension::Value::DimParam(s.clone())),
                        Dim::Unknown => None,
                    },
                })
                .collect(),
        }),
    };
    pb::ValueInfoProto {
        name: v.name.clone(),
        r#type: Some(pb::TypeProto {
            denotation: String::new(),
            value: Some(pb::type_proto::Value::TensorType(tensor_type)),
        }),
        doc_string: v.doc_string.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constant(attr: &str, value: Attribute) -> pb::NodeProto {
        let mut node = Node::new("c", "Constant", &[], &["k"]);
        node.attributes.insert(attr.into(), value);
        // Through the bytes, as a file would carry it.
        pb::NodeProto::decode(node_to_proto(&node).encode_to_vec().as_slice()).unwrap()
    }

    #[test]
    fn a_zero_constant_is_saved_as_the_tensor_it_stands_for() {
        let p = constant("value_int", Attribute::Int(0));
        assert_eq!(p.attribute.len(), 1);
        assert_eq!(p.attribute[0].name, "value");
        let t = p.attribute[0].t.as_ref().unwrap();
        assert!(
            t.dims.is_empty() && t.data_type == crate::DataType::Int64.to_onnx() && t.raw_data == 0i64.to_le_bytes()
        );
        // The sign of a zero float survives too.
        let p = constant("value_float", Attribute::Float(-0.0));
        let t = p.attribute[0].t.as_ref().unwrap();
        assert_eq!(t.raw_data, (-0.0f32).to_le_bytes());
        // Other values, and zero attributes of other ops, keep their form.
        let p = constant("value_int", Attribute::Int(3));
        assert_eq!((p.attribute[0].name.as_str(), p.attribute[0].i), ("value_int", 3));
        let mut concat = Node::new("cat", "Concat", &["a", "b"], &["c"]);
        concat.attributes.insert("axis".into(), Attribute::Int(0));
        assert_eq!(node_to_proto(&concat).attribute[0].name, "axis");
    }
}
