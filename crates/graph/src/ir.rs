//! The in-memory graph: nodes, values, initializers and the model around them.

use crate::dtype::DataType;
use crate::error::{GraphError, Result};
use crate::tensor::Tensor;
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// One dimension of a tensor shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A known size.
    Fixed(usize),
    /// A named symbolic size, such as the batch.
    Symbol(String),
    /// Nothing is known.
    Unknown,
}

impl Dim {
    /// The size if it is known.
    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            _ => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Symbol(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A tensor shape whose dimensions may be symbolic.
pub type Shape = Vec<Dim>;

/// Formats a shape as `batch×16×28×28`.
pub fn format_shape(shape: &[Dim]) -> String {
    if shape.is_empty() {
        return "scalar".into();
    }
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("×")
}

/// A shape with only fixed dimensions.
pub fn fixed_shape(dims: &[usize]) -> Shape {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// Type information of a value: its element type and shape, either of which may be unknown.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    /// The value's name.
    pub name: String,
    /// Element type, if known.
    pub dtype: Option<DataType>,
    /// Shape, if known (the rank, with possibly unknown dimensions).
    pub shape: Option<Shape>,
    /// Documentation string carried from the model.
    pub doc_string: String,
}

impl ValueInfo {
    /// A value with a known type and shape.
    pub fn new(name: impl Into<String>, dtype: DataType, shape: Shape) -> ValueInfo {
        ValueInfo { name: name.into(), dtype: Some(dtype), shape: Some(shape), doc_string: String::new() }
    }
}

/// A node attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// A float.
    Float(f32),
    /// An integer.
    Int(i64),
    /// A byte string.
    String(Vec<u8>),
    /// A tensor.
    Tensor(Tensor),
    /// A list of floats.
    Floats(Vec<f32>),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of byte strings.
    Strings(Vec<Vec<u8>>),
    /// Anything else (graphs, sparse tensors, type protos, references), kept verbatim.
    Other(Box<tract_onnx::pb::AttributeProto>),
}

/// A node: one op applied to named inputs, producing named outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Unique name (the loader names unnamed nodes).
    pub name: String,
    /// Op type, such as `Conv`.
    pub op_type: String,
    /// Operator-set domain; empty for the default ONNX domain.
    pub domain: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    /// Output value names; an empty name is an omitted optional output.
    pub outputs: Vec<String>,
    /// Attributes by name, in model order.
    pub attributes: IndexMap<String, Attribute>,
    /// Documentation string carried from the model.
    pub doc_string: String,
}

impl Node {
    /// A node in the default domain with no attributes.
    pub fn new(name: impl Into<String>, op_type: impl Into<String>, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            name: name.into(),
            op_type: op_type.into(),
            domain: String::new(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attributes: IndexMap::new(),
            doc_string: String::new(),
        }
    }

    /// Adds an attribute (builder style).
    pub fn with_attr(mut self, name: &str, value: Attribute) -> Node {
        self.attributes.insert(name.to_string(), value);
        self
    }

    /// The `i`-th input if present and not omitted.
    pub fn input(&self, i: usize) -> Option<&str> {
        self.inputs.get(i).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// The `i`-th output if present and not omitted.
    pub fn output(&self, i: usize) -> Option<&str> {
        self.outputs.get(i).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// An integer attribute, or `default` when absent.
    pub fn attr_int(&self, name: &str, default: i64) -> Result<i64> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(Attribute::Int(v)) => Ok(*v),
            Some(_) => Err(GraphError::node(self, format!("attribute {name:?} must be an integer"))),
        }
    }

    /// A float attribute, or `default` when absent.
    pub fn attr_float(&self, name: &str, default: f32) -> Result<f32> {
        match self.attributes.get(name) {
            None => Ok(default),
            Some(Attribute::Float(v)) => Ok(*v),
            Some(_) => Err(GraphError::node(self, format!("attribute {name:?} must be a float"))),
        }
    }

    /// An integer-list attribute, if present.
    pub fn attr_ints(&self, name: &str) -> Result<Option<&[i64]>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(Attribute::Ints(v)) => Ok(Some(v)),
            Some(_) => Err(GraphError::node(self, format!("attribute {name:?} must be a list of integers"))),
        }
    }

    /// A string attribute, or `default` when absent.
    pub fn attr_string(&self, name: &str, default: &str) -> Result<String> {
        match self.attributes.get(name) {
            None => Ok(default.to_string()),
            Some(Attribute::String(v)) => Ok(String::from_utf8_lossy(v).into_owned()),
            Some(_) => Err(GraphError::node(self, format!("attribute {name:?} must be a string"))),
        }
    }

    /// A tensor attribute, if present.
    pub fn attr_tensor(&self, name: &str) -> Result<Option<&Tensor>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(Attribute::Tensor(t)) => Ok(Some(t)),
            Some(_) => Err(GraphError::node(self, format!("attribute {name:?} must be a tensor"))),
        }
    }
}

/// A computation graph in topological order (after [`crate::sort::sort_topologically`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    /// Graph name.
    pub name: String,
    /// Documentation string.
    pub doc_string: String,
    /// Nodes; the loader sorts them topologically.
    pub nodes: Vec<Node>,
    /// Graph inputs that are not initializers (the data the caller feeds).
    pub inputs: Vec<ValueInfo>,
    /// Graph outputs.
    pub outputs: Vec<ValueInfo>,
    /// Initializers (weights, buffers and constant tensors) by name, in model order.
    pub initializers: IndexMap<String, Tensor>,
    /// Graph inputs that also have an initializer (overridable defaults), in model order.
    pub initializer_inputs: Vec<ValueInfo>,
    /// Known types of intermediate values, by name.
    pub value_info: IndexMap<String, ValueInfo>,
    /// Fields kept verbatim for lossless saving (quantization annotations, sparse initializers).
    pub extra: GraphExtra,
}

/// Parts of a `GraphProto` edgefreeze does not interpret but keeps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GraphExtra {
    /// `GraphProto.sparse_initializer`.
    pub sparse_initializers: Vec<tract_onnx::pb::SparseTensorProto>,
    /// `GraphProto.quantization_annotation`.
    pub quantization_annotations: Vec<tract_onnx::pb::TensorAnnotation>,
}

impl Graph {
    /// Every value name the graph defines: initializers, inputs and node outputs (what a
    /// rewrite's new names must avoid, with [`fresh_name`]).
    pub fn value_names(&self) -> HashSet<String> {
        let mut names: HashSet<String> = self.initializers.keys().cloned().collect();
        names.extend(self.inputs.iter().map(|v| v.name.clone()));
        for node in &self.nodes {
            names.extend(node.outputs.iter().cloned());
        }
        names
    }

    /// The type information of a value, from graph inputs, outputs, value_info or initializers.
    pub fn value_type(&self, name: &str) -> Option<ValueInfo> {
        if let Some(t) = self.initializers.get(name) {
            return Some(ValueInfo::new(name, t.dtype(), fixed_shape(t.dims())));
        }
        self.inputs.iter().chain(self.value_info.values()).chain(self.outputs.iter()).find(|v| v.name == name).cloned()
    }

    /// Map from value name to the index of the node that produces it.
    pub fn producers(&self) -> HashMap<&str, usize> {
        let mut map = HashMap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for out in node.outputs.iter().filter(|o| !o.is_empty()) {
                map.insert(out.as_str(), i);
            }
        }
        map
    }

    /// Map from value name to the indices of the nodes that read it.
    pub fn consumers(&self) -> HashMap<&str, Vec<usize>> {
        let mut map: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for input in node.inputs.iter().filter(|o| !o.is_empty()) {
                let users = map.entry(input.as_str()).or_default();
                if users.last() != Some(&i) {
                    users.push(i);
                }
            }
        }
        map
    }

    /// The value of a constant: an initializer or the output of a `Constant` node.
    pub fn constant(&self, name: &str) -> Option<&Tensor> {
        if let Some(t) = self.initializers.get(name) {
            return Some(t);
        }
        self.nodes
            .iter()
            .find(|n| {
                n.op_type == "Constant" && n.domain.is_empty() && n.outputs.first().map(String::as_str) == Some(name)
            })
            .and_then(|n| match n.attributes.get("value") {
                Some(Attribute::Tensor(t)) => Some(t),
                _ => None,
            })
    }

    /// Names of all the graph-level inputs, initializer-backed ones included.
    pub fn input_names(&self) -> HashSet<&str> {
        self.inputs.iter().chain(self.initializer_inputs.iter()).map(|v| v.name.as_str()).collect()
    }

    /// Removes nodes whose outputs nothing reads and that produce no graph output,
    /// then initializers nothing reads. Returns how many nodes were removed.
    pub fn remove_dead_nodes(&mut self) -> usize {
        let mut live: HashSet<String> = self.outputs.iter().map(|v| v.name.clone()).collect();
        let mut keep = vec![false; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate().rev() {
            if node.outputs.iter().any(|o| live.contains(o)) {
                keep[i] = true;
                live.extend(node.inputs.iter().filter(|s| !s.is_empty()).cloned());
            }
        }
        let before = self.nodes.len();
        let mut index = 0;
        self.nodes.retain(|_| {
            index += 1;
            keep[index - 1]
        });
        let overridable: HashSet<String> = self.initializer_inputs.iter().map(|v| v.name.clone()).collect();
        self.initializers.retain(|name, _| live.contains(name) || overridable.contains(name));
        self.value_info.retain(|name, _| live.contains(name));
        before - self.nodes.len()
    }
}

/// A whole ONNX model: the graph plus its opset imports and metadata.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Model {
    /// ONNX IR version.
    pub ir_version: i64,
    /// Opset imports: (domain, version); "" is the default domain.
    pub opset_imports: Vec<(String, i64)>,
    /// Producer name (e.g. "pytorch").
    pub producer_name: String,
    /// Producer version.
    pub producer_version: String,
    /// Model domain.
    pub domain: String,
    /// Model version.
    pub model_version: i64,
    /// Documentation string.
    pub doc_string: String,
    /// Metadata properties (key, value).
    pub metadata: Vec<(String, String)>,
    /// The main graph.
    pub graph: Graph,
    /// Model-local functions, kept verbatim.
    pub functions: Vec<tract_onnx::pb::FunctionProto>,
    /// Training information, kept verbatim.
    pub training_info: Vec<tract_onnx::pb::TrainingInfoProto>,
}

/// `hint`, or `hint_<k>` for the first `k` that makes it new, recorded in `taken`.
pub fn fresh_name(taken: &mut HashSet<String>, hint: &str) -> String {
    let mut name = hint.to_string();
    let mut k = 1;
    while taken.contains(&name) {
        name = format!("{hint}_{k}");
        k += 1;
    }
    taken.insert(name.clone());
    name
}

impl Model {
    /// The value of a metadata property, if the model has it.
    pub fn metadata_value(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The default-domain (`ai.onnx`) opset version.
    pub fn opset(&self) -> i64 {
        self.opset_imports.iter().find(|(d, _)| d.is_empty() || d == "ai.onnx").map(|(_, v)| *v).unwrap_or(0)
    }
}
