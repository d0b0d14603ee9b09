//! Typed errors of the rewrite crate.

use edgefreeze_autodiff::AutodiffError;
use edgefreeze_graph::GraphError;

/// What can go wrong while cutting or rewriting a model.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The model itself is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Building a training graph failed.
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    /// A cut index that is not a valid cut.
    #[error("{cut} is not a valid cut: the valid cuts (after layer) are {}", format_list(.valid))]
    Cut {
        /// The cut asked for.
        cut: usize,
        /// The valid cuts.
        valid: Vec<usize>,
    },
    /// More layers to freeze than the model has.
    #[error("cannot freeze {asked} layers: the model has {layers}")]
    FreezeDepth {
        /// The number asked.
        asked: usize,
        /// The model's layer count.
        layers: usize,
    },
    /// A probe at a layer the graph does not compute.
    #[error("cannot probe layer {layer}: this graph computes layers {first}..{layers}")]
    Probe {
        /// The layer asked.
        layer: usize,
        /// The first layer the graph computes.
        first: usize,
        /// The model's layer count.
        layers: usize,
    },
    /// A name the rewrite needs for its interface is already a value of the model.
    #[error("the model already has a value named {0:?}, which the rewritten graphs need for their interface")]
    NameTaken(String),
    /// The part behind a cut reads more of the front than the one activation.
    #[error(
        "cut {cut}: the part behind the cut reads values of the front part, which cannot cross the cut: {}",
        format_reads(.reads)
    )]
    CrossesCut {
        /// The cut.
        cut: usize,
        /// Every read behind the cut of a front value other than the activation.
        reads: Vec<CrossingRead>,
    },
    /// A trainable tensor read on both sides of a cut.
    #[error("cut {cut}: parameter {name:?} is read on both sides of the cut, which cannot train it as one tensor")]
    SharedParameter {
        /// The cut.
        cut: usize,
        /// The parameter.
        name: String,
    },
    /// A device/edge split at a cut whose back part reads graph inputs beside the
    /// activation: the edge would need the samples themselves, which split training keeps
    /// on the device (the protocol sends activations and labels, never samples).
    #[error(
        "cut {cut}: the part behind it reads the model's input {} as well, so the edge would need the samples \
         themselves, which split training keeps on the device; split at a cut without side inputs ({})",
        .inputs.join(", "),
        if .splittable.is_empty() { "this model has none".to_string() } else { format!("valid: {}", format_list(.splittable)) }
    )]
    SideInputs {
        /// The cut.
        cut: usize,
        /// The graph inputs the back reads.
        inputs: Vec<String>,
        /// The cuts the split can take.
        splittable: Vec<usize>,
    },
    /// A value asked for as an output is not computed by the model.
    #[error("no node computes {0:?}")]
    NoValue(String),
    /// Writing graphs or the manifest failed.
    #[error("{0}")]
    Write(String),
}

/// A node behind a cut that reads a value of the front part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossingRead {
    /// The node behind the cut.
    pub node: String,
    /// The front value it reads.
    pub value: String,
}

fn format_reads(reads: &[CrossingRead]) -> String {
    reads.iter().map(|r| format!("node {:?} reads {:?}", r.node, r.value)).collect::<Vec<_>>().join("; ")
}

fn format_list(values: &[usize]) -> String {
    if values.is_empty() {
        return "none (the model has one layer)".into();
    }
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}

/// Result alias of the rewrite crate.
pub type Result<T, E = RewriteError> = std::result::Result<T, E>;
