//! Typed errors of the autodiff crate.

use edgefreeze_graph::GraphError;

/// What can go wrong while building gradient, training-step or eval graphs.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// The forward graph itself is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Ops on the path from trainable parameters to the loss with no gradient rule, all at once.
    #[error("no gradient rule for: {}", format_ops(.0))]
    NoRule(Vec<BlockedOp>),
    /// A node cannot be differentiated as it is.
    #[error("node {node:?} ({op_type}): {message}")]
    Node {
        /// The node's name.
        node: String,
        /// Its op type.
        op_type: String,
        /// What is wrong.
        message: String,
    },
    /// The model's output does not fit the loss.
    #[error("loss: {0}")]
    Loss(String),
    /// A parameter cannot be trained as asked.
    #[error("parameter {name:?}: {message}")]
    Parameter {
        /// The parameter's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Bad settings (optimizer, loss or freezing options).
    #[error("{0}")]
    Config(String),
}

/// An op whose nodes lie on a path from a trainable parameter to the loss but which the
/// gradient table cannot differentiate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockedOp {
    /// The op type.
    pub op_type: String,
    /// Its nodes on the path.
    pub nodes: Vec<String>,
    /// Why, from the gradient table.
    pub reason: String,
}

fn format_ops(ops: &[BlockedOp]) -> String {
    ops.iter()
        .map(|b| format!("{} (nodes: {}): {}", b.op_type, b.nodes.join(", "), b.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

impl AutodiffError {
    /// A node-level error.
    pub fn node(node: &edgefreeze_graph::Node, message: impl Into<String>) -> AutodiffError {
        AutodiffError::Node { node: node.name.clone(), op_type: node.op_type.clone(), message: message.into() }
    }
}

/// Result alias of the autodiff crate.
pub type Result<T, E = AutodiffError> = std::result::Result<T, E>;
