//! Typed errors of the graph crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading, checking, rewriting or saving a graph.
///
/// Every variant names what it is about: the file, the node, the tensor or the field.
///
/// Each message is complete: it ends with the underlying cause (an operating-system or
/// protobuf error, or the wrapped error of [`GraphError::InFile`]), which is therefore
/// never also returned by `source()`; `anyhow`'s `{:#}` prints every message of the
/// `source()` chain, and would print such a cause twice.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// An error that happened while working on a file; `error` says what went wrong in it.
    #[error("{}: {error}", path.display())]
    InFile {
        /// The model file.
        path: PathBuf,
        /// What went wrong.
        error: Box<GraphError>,
    },
    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// What was being done ("read", "write", "rename"...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating-system error (in the message, so not a `source()`).
        error: std::io::Error,
    },
    /// The bytes are not an ONNX `ModelProto`.
    #[error("not a valid ONNX model (protobuf decoding failed: {0}); is the file truncated or not ONNX?")]
    Decode(prost::DecodeError),
    /// The model is structurally invalid.
    #[error("invalid model: {0}")]
    Invalid(String),
    /// An opset import the toolchain does not support.
    #[error(
        "unsupported opset: domain {domain:?} version {version} (edgefreeze supports the default domain at opsets {min} to {max})"
    )]
    Opset {
        /// The operator-set domain ("" for the default domain).
        domain: String,
        /// The imported version.
        version: i64,
        /// Lowest supported default-domain opset.
        min: i64,
        /// Highest supported default-domain opset.
        max: i64,
    },
    /// A tensor (initializer or attribute) cannot be read.
    #[error("tensor {name:?}: {message}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// An external data file is missing or too short.
    #[error("tensor {tensor:?}: external data {}: {message}", file.display())]
    ExternalData {
        /// The tensor whose data lives outside the model file.
        tensor: String,
        /// The external file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Ops that no rule in edgefreeze covers, all listed at once.
    #[error("unsupported ops: {}", format_unsupported(.0))]
    UnsupportedOps(Vec<UnsupportedOp>),
    /// The graph has a cycle through these nodes.
    #[error("the graph has a cycle through nodes {0:?}")]
    Cycle(Vec<String>),
    /// A node reads a value nothing produces.
    #[error("node {node:?} ({op_type}): input {value:?} is produced by no node, initializer or graph input")]
    MissingValue {
        /// The consuming node.
        node: String,
        /// Its op type.
        op_type: String,
        /// The missing value's name.
        value: String,
    },
    /// A node is malformed or its inputs do not fit the op.
    #[error("node {node:?} ({op_type}): {message}")]
    Node {
        /// The node's name.
        node: String,
        /// Its op type.
        op_type: String,
        /// What is wrong.
        message: String,
    },
}

/// One op type without support, with every node that uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// Operator-set domain ("" is the default ONNX domain).
    pub domain: String,
    /// The op type.
    pub op_type: String,
    /// Names of the nodes that use it.
    pub nodes: Vec<String>,
}

fn format_unsupported(ops: &[UnsupportedOp]) -> String {
    ops.iter()
        .map(|op| {
            let domain = if op.domain.is_empty() { String::new() } else { format!("{}::", op.domain) };
            format!("{domain}{} (nodes: {})", op.op_type, op.nodes.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl GraphError {
    /// Wraps this error with the file it happened in (unless it already names one).
    pub fn in_file(self, path: impl Into<PathBuf>) -> GraphError {
        match self {
            GraphError::InFile { .. } | GraphError::Io { .. } => self,
            other => GraphError::InFile { path: path.into(), error: Box::new(other) },
        }
    }

    /// A node-level error.
    pub fn node(node: &crate::Node, message: impl Into<String>) -> GraphError {
        GraphError::Node { node: node.name.clone(), op_type: node.op_type.clone(), message: message.into() }
    }
}

/// Result alias of the graph crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;
