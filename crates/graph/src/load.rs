//! Parsing: ONNX protobuf bytes (and external data files) into a [`Model`].

use crate::dtype::DataType;
use crate::error::{GraphError, Result};
use crate::ir::{Attribute, Dim, Graph, GraphExtra, Model, Node, ValueInfo};
use crate::tensor::Tensor;
use indexmap::IndexMap;
use prost::Message;
use std::collections::HashSet;
use std::path::{Component, Path};
use tract_onnx::pb;

/// Reads an ONNX file, resolving external data relative to its folder.
///
/// This only parses: see [`crate::import`] for the whole import (sort, checks, folding,
/// shape inference). Every error names the file.
pub fn load_model(path: impl AsRef<Path>) -> Result<Model> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|error| GraphError::Io { action: "read", path: path.into(), error })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse_model(&bytes, Some(dir)).map_err(|e| e.in_file(path))
}

/// Parses ONNX bytes. External data is read relative to `external_dir`; without one,
/// a model with external data is an error.
pub fn parse_model(bytes: &[u8], external_dir: Option<&Path>) -> Result<Model> {
    let proto = pb::ModelProto::decode(bytes).map_err(GraphError::Decode)?;
    let mut model = model_from_proto(proto, external_dir)?;
    // Node and value metadata are not kept in the IR; what they say about folded
    // BatchNorms and about buffers is. A file written by edgefreeze keeps the records of
    // its own import.
    let marks = crate::exported::exporter_marks(bytes);
    if marks.folds > 0 && model.metadata_value(crate::exported::FOLDED_BATCH_NORMS_KEY).is_none() {
        model.metadata.push((crate::exported::FOLDED_BATCH_NORMS_KEY.into(), marks.folds.to_string()));
    }
    if !marks.buffers.is_empty() {
        model.metadata.retain(|(k, _)| k != crate::exported::EXPORTED_BUFFERS_KEY);
        model.metadata.push((crate::exported::EXPORTED_BUFFERS_KEY.into(), marks.buffers.join("\n")));
    }
    Ok(model)
}

/// Converts a decoded `ModelProto`.
pub fn model_from_proto(proto: pb::ModelProto, external_dir: Option<&Path>) -> Result<Model> {
    let graph = proto.graph.ok_or_else(|| GraphError::Invalid("the model has no graph".into()))?;
    Ok(Model {
        ir_version: proto.ir_version,
        opset_imports: proto.opset_import.into_iter().map(|o| (o.domain, o.version)).collect(),
        producer_name: proto.producer_name,
        producer_version: proto.producer_version,
        domain: proto.domain,
        model_version: proto.model_version,
        doc_string: proto.doc_string,
        metadata: proto.metadata_props.into_iter().map(|p| (p.key, p.value)).collect(),
        graph: graph_from_proto(graph, external_dir)?,
        functions: proto.functions,
        training_info: proto.training_info,
    })
}

fn graph_from_proto(proto: pb::GraphProto, external_dir: Option<&Path>) -> Result<Graph> {
    let mut initializers = IndexMap::new();
    for t in proto.initializer {
        let name = t.name.clone();
        if name.is_empty() {
            return Err(GraphError::Invalid("an initializer has no name".into()));
        }
        let tensor = tensor_from_proto(t, external_dir)?;
        if initializers.insert(name.clone(), tensor).is_some() {
            return Err(GraphError::Tensor { name, message: "two initializers have this name".into() });
        }
    }
    let mut inputs = Vec::new();
    let mut initializer_inputs = Vec::new();
    for v in proto.input {
        let info = value_info_from_proto(v)?;
        if initializers.contains_key(&info.name) {
            initializer_inputs.push(info);
        } else {
            inputs.push(info);
        }
    }
    let outputs = proto.output.into_iter().map(value_info_from_proto).collect::<Result<Vec<_>>>()?;
    let mut value_info = IndexMap::new();
    for v in proto.value_info {
        let info = value_info_from_proto(v)?;
        value_info.insert(info.name.clone(), info);
    }
    let mut nodes = proto.node.into_iter().map(node_from_proto).collect::<Result<Vec<_>>>()?;
    name_nodes_uniquely(&mut nodes);
    Ok(Graph {
        name: proto.name,
        doc_string: proto.doc_string,
        nodes,
        inputs,
        outputs,
        initializers,
        initializer_inputs,
        value_info,
        extra: GraphExtra {
            sparse_initializers: proto.sparse_initializer,
            quantization_annotations: proto.quantization_annotation,
        },
    })
}

/// Gives every unnamed node a name (`{op_type}_{index}`) and makes duplicate names unique,
/// so that every error can name its node.
fn name_nodes_uniquely(nodes: &mut [Node]) {
    let mut taken: HashSet<String> = HashSet::new();
    for (i, node) in nodes.iter_mut().enumerate() {
        let base = if node.name.is_empty() { format!("{}_{i}", node.op_type) } else { node.name.clone() };
        let mut name = base.clone();
        let mut k = 1;
        while taken.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        taken.insert(name.clone());
        node.name = name;
    }
}

fn node_from_proto(proto: pb::NodeProto) -> Result<Node> {
    let mut attributes = IndexMap::new();
    for a in proto.attribute {
        let name = a.name.clone();
        let value = attribute_from_proto(a).map_err(|e| GraphError::Node {
            node: proto.name.clone(),
            op_type: proto.op_type.clone(),
            message: format!("attribute {name:?}: {e}"),
        })?;
        attributes.insert(name, value);
    }
    Ok(Node {
        name: proto.name,
        op_type: proto.op_type,
        domain: if proto.domain == "ai.onnx" { String::new() } else { proto.domain },
        inputs: proto.input,
        outputs: proto.output,
        attributes,
        doc_string: proto.doc_string,
    })
}

fn attribute_from_proto(a: pb::AttributeProto) -> Result<Attribute> {
    use pb::attribute_proto::AttributeType as T;
    if !a.ref_attr_name.is_empty() {
        return Ok(Attribute::Other(Box::new(a)));
    }
    let kind = T::try_from(a.r#type).unwrap_or(T::Undefined);
    Ok(match kind {
        T::Float => Attribute::Float(a.f),
        T::Int => Attribute::Int(a.i),
        T::String => Attribute::String(a.s),
        T::Tensor => match a.t {
            Some(t) => Attribute::Tensor(tensor_from_proto(t, None)?),
            None => return Err(GraphError::Invalid("tensor attribute without a tensor".into())),
        },
        T::Floats => Attribute::Floats(a.floats),
        T::Ints => Attribute::Ints(a.ints),
        T::Strings => Attribute::Strings(a.strings),
        _ => Attribute::Other(Box::new(a)),
    })
}

fn value_info_from_proto(v: pb::ValueInfoProto) -> Result<ValueInfo> {
    let (dtype, shape) = match v.r#type.and_then(|t| t.value) {
        Some(pb::type_proto::Value::TensorType(t)) => {
            let dtype = if t.elem_type == 0 { None } else { Some(DataType::from_onnx(t.elem_type)?) };
            let shape = t.shape.map(|s| {
                s.dim
                    .into_iter()
                    .map(|d| match d.value {
                        Some(pb::tensor_shape_proto::dimension::Value::DimValue(n)) if n >= 0 => Dim::Fixed(n as usize),
                        Some(pb::tensor_shape_proto::dimension::Value::DimParam(s)) if !s.is_empty() => Dim::Symbol(s),
                        _ => Dim::Unknown,
                    })
                    .collect()
            });
            (dtype, shape)
        }
        None => (None, None),
    };
    Ok(ValueInfo { name: v.name, dtype, shape, doc_string: v.doc_string })
}

/// Converts a `TensorProto`, reading external data relative to `external_dir`.
pub fn tensor_from_proto(t: pb::TensorProto, external_dir: Option<&Path>) -> Result<Tensor> {
    let name = t.name.clone();
    let err = |message: String| GraphError::Tensor { name: name.clone(), message };
    if t.segment.is_some() {
        return Err(err("segmented tensors are not supported".into()));
    }
    let dtype = DataType::from_onnx(t.data_type).map_err(|e| err(e.to_string()))?;
    let mut dims = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(err(format!("negative dimension {d} in {:?}", t.dims)));
        }
        dims.push(d as usize);
    }
    let numel =
        dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| err("too many elements".into()))?;
    if t.data_location == Some(pb::tensor_proto::DataLocation::External as i32) {
        let bytes = read_external(&t, dtype, numel, external_dir)?;
        return Tensor::from_raw(dtype, dims, bytes).map_err(|e| err(e.to_string()));
    }
    let result = if dtype == DataType::String {
        Tensor::from_strings(dims, t.string_data)
    } else if !t.raw_data.is_empty() || numel == 0 {
        Tensor::from_raw(dtype, dims, t.raw_data)
    } else {
        typed_fields_to_tensor(&t, dtype, dims)
    };
    result.map_err(|e| err(e.to_string()))
}

fn typed_fields_to_tensor(t: &pb::TensorProto, dtype: DataType, dims: Vec<usize>) -> Result<Tensor> {
    match dtype {
        DataType::Float32 => Tensor::from_f32(dims, &t.float_data),
        DataType::Float64 => Tensor::from_f64_as(dtype, dims, &t.double_data),
        DataType::Int64 => Tensor::from_i64(dims, &t.int64_data),
        DataType::Uint32 | DataType::Uint64 => {
            Tensor::from_i64_as(dtype, dims, &t.uint64_data.iter().map(|&v| v as i64).collect::<Vec<_>>())
        }
        DataType::Float16 | DataType::BFloat16 => {
            let bytes = t.int32_data.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect();
            Tensor::from_raw(dtype, dims, bytes)
        }
        _ => Tensor::from_i64_as(dtype, dims, &t.int32_data.iter().map(|&v| v as i64).collect::<Vec<_>>()),
    }
}

fn read_external(t: &pb::TensorProto, dtype: DataType, numel: usize, dir: Option<&Path>) -> Result<Vec<u8>> {
    let entry = |key: &str| t.external_data.iter().find(|e| e.key == key).map(|e| e.value.as_str());
    let location = entry("location").ok_or_else(|| GraphError::Tensor {
        name: t.name.clone(),
        message: "external data without a \"location\" entry".into(),
    })?;
    let file = Path::new(location).to_path_buf();
    let fail = |message: String| GraphError::ExternalData { tensor: t.name.clone(), file: file.clone(), message };
    if file.is_absolute() || file.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(fail("the location must be a relative path inside the model's folder".into()));
    }
    let dir = dir.ok_or_else(|| fail("the model was not read from a file, so external data cannot be found".into()))?;
    let parse = |key: &str| -> Result<Option<u64>> {
        entry(key).map(|v| v.parse::<u64>().map_err(|_| fail(format!("{key} {v:?} is not a number")))).transpose()
    };
    let offset = parse("offset")?.unwrap_or(0);
    let expected = (numel * dtype.size()) as u64;
    let length = parse("length")?.unwrap_or(expected);
    if length != expected {
        return Err(fail(format!("length {length} does not match the tensor's {expected} bytes")));
    }
    let full = dir.join(&file);
    let fail_at = |message: String| GraphError::ExternalData { tensor: t.name.clone(), file: full.clone(), message };
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&full).map_err(|e| fail_at(format!("cannot open: {e}")))?;
    let size = f.metadata().map_err(|e| fail_at(e.to_string()))?.len();
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(fail_at(format!("needs bytes {offset}..{} but the file has {size}", offset + length)));
    }
    f.seek(SeekFrom::Start(offset)).map_err(|e| fail_at(e.to_string()))?;
    let mut bytes = vec![0u8; length as usize];
    f.read_exact(&mut bytes).map_err(|e| fail_at(e.to_string()))?;
    Ok(bytes)
}
