//! The edge side of a split: the graphs and initial state an edge session trains.
//!
//! A session gets its [`EdgeSide`] from a [`SideBuilder`]; the server's default
//! builder runs the rewrite crate's `split` on the model the device sent and keeps the
//! edge half. The builder is a seam so a server can be given other graphs (tests use it
//! to inject failures).

use edgefreeze_autodiff::artifacts::{Role, Side};
use edgefreeze_autodiff::loss::LABELS;
use edgefreeze_engine::Value;
use edgefreeze_graph::{DataType, Model};
use edgefreeze_wire::pb::{self, Dtype, PortSpec};
use std::sync::Arc;

/// Name of the activation input of the edge step (the tensor crossing the cut).
pub use edgefreeze_rewrite::ACTIVATION;

/// What an edge session runs.
#[derive(Debug, Clone)]
pub struct EdgeSide {
    /// Edge step: [`ACTIVATION`], `labels` (+ `dropout_seed`) and the edge state →
    /// `loss`, `correct` (classification), `grad.activation` (unless the device's layers
    /// are frozen), `grad.<p>` for every edge parameter and `updated.<s>` for the BatchNorm
    /// statistics it updates. No optimizer: gradients are summed over micro-batches.
    pub step: Model,
    /// Edge apply: the edge state, `grad.<p>`, `grad_scale` (the session feeds the batch's
    /// mean gradient and a scale of 1), `lr` (+ `step`) → `updated.<s>` of parameters and
    /// optimizer state.
    pub apply: Model,
    /// The activation the device sends (batch dimension negative).
    pub activation: PortSpec,
    /// The labels the device sends.
    pub labels: PortSpec,
    /// Trainable edge parameters (each has a `grad.<p>` output of the step).
    pub parameters: Vec<String>,
    /// The initial edge state (parameters, optimizer state, BatchNorm statistics).
    pub state: Vec<(String, Value)>,
}

/// A decoded split request.
#[derive(Debug, Clone)]
pub struct SplitSpec {
    /// The inference model, imported (sorted, folded, typed).
    pub model: Model,
    /// The cut lies after this layer.
    pub cut_after_layer: usize,
    /// The loss.
    pub loss: edgefreeze_autodiff::Loss,
    /// The optimizer.
    pub optimizer: edgefreeze_autodiff::Optimizer,
    /// Whether the device's layers are frozen (no activation gradient goes back).
    pub frozen_device_layers: bool,
}

/// Why an edge side cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum SideError {
    /// The device asked for something impossible (an invalid model or cut): its fault.
    #[error("{0}")]
    Request(String),
    /// The server failed.
    #[error("{0}")]
    Internal(String),
}

/// Builds the edge side of a split request.
pub type SideBuilder = Arc<dyn Fn(&SplitSpec) -> Result<EdgeSide, SideError> + Send + Sync>;

/// Most micro-batches a step may have.
pub const MAX_MICRO_BATCHES: u32 = 4096;

impl SplitSpec {
    /// Decodes and checks a split request (the model is imported as `edgefreeze inspect`
    /// would: sorted, folded, typed).
    pub fn from_wire(request: &pb::SplitRequest) -> Result<SplitSpec, SideError> {
        let model = edgefreeze_graph::parse_model(&request.model, None)
            .and_then(edgefreeze_graph::prepare)
            .map_err(|e| SideError::Request(format!("split request: model: {e}")))?;
        let loss = edgefreeze_wire::convert::loss_from_wire(request.loss.as_ref())
            .map_err(|e| SideError::Request(format!("split request: {e}")))?;
        let optimizer = edgefreeze_wire::convert::optimizer_from_wire(request.optimizer.as_ref())
            .map_err(|e| SideError::Request(format!("split request: {e}")))?;
        if request.micro_batches == 0 || request.micro_batches > MAX_MICRO_BATCHES {
            return Err(SideError::Request(format!(
                "split request: {} micro-batches; use 1 to {MAX_MICRO_BATCHES}",
                request.micro_batches
            )));
        }
        Ok(SplitSpec {
            model,
            cut_after_layer: request.cut_after_layer as usize,
            loss,
            optimizer,
            frozen_device_layers: request.frozen_device_layers,
        })
    }
}

/// The server's builder: the rewrite crate's [`split`](edgefreeze_rewrite::split) of the
/// model the device sent, of which the session keeps the edge half (the edge step, the
/// edge apply graph and the edge side's initial state).
pub fn split_builder() -> SideBuilder {
    Arc::new(|spec: &SplitSpec| {
        let step_spec = edgefreeze_rewrite::StepSpec { loss: spec.loss.clone(), optimizer: spec.optimizer.clone() };
        let options =
            edgefreeze_rewrite::SplitOptions { frozen_device_layers: spec.frozen_device_layers, recompute: false };
        // Whatever the rewrite refuses (an invalid cut, an op without a gradient rule) is
        // the request's fault.
        let graphs = edgefreeze_rewrite::split(&spec.model, spec.cut_after_layer, &step_spec, options)
            .map_err(|e| SideError::Request(format!("split request: {e}")))?;
        let mut parameters = Vec::new();
        let mut state = Vec::new();
        for entry in graphs.manifest.state.iter().filter(|e| e.side == Some(Side::Edge)) {
            let tensor =
                graphs.state.iter().find(|(n, _)| *n == entry.name).map(|(_, t)| t).ok_or_else(|| {
                    SideError::Internal(format!("split: no initial value of edge state {}", entry.name))
                })?;
            let value = edgefreeze_train::tensors::value_from_tensor(&entry.name, tensor)
                .map_err(|e| SideError::Internal(format!("split: {e}")))?;
            if entry.role == Role::Parameter {
                parameters.push(entry.name.clone());
            }
            state.push((entry.name.clone(), value));
        }
        let activation = port(&graphs.edge_step, ACTIVATION)?;
        let labels = port(&graphs.edge_step, LABELS)?;
        Ok(EdgeSide { step: graphs.edge_step, apply: graphs.edge_apply, activation, labels, parameters, state })
    })
}

/// The port of a graph input: its element type and dimensions, symbolic ones (the
/// batch) as −1.
pub fn port(model: &Model, name: &str) -> Result<PortSpec, SideError> {
    let input = model
        .graph
        .inputs
        .iter()
        .find(|i| i.name == name)
        .ok_or_else(|| SideError::Internal(format!("the edge step has no input {name}")))?;
    let dtype = match input.dtype {
        Some(DataType::Float32) => Dtype::F32,
        Some(DataType::Float64) => Dtype::F64,
        Some(DataType::Int64) => Dtype::I64,
        Some(DataType::Bool) => Dtype::Bool,
        other => {
            return Err(SideError::Request(format!("input {name} has element type {other:?}, which cannot be sent")));
        }
    };
    let shape = input.shape.as_ref().ok_or_else(|| SideError::Request(format!("input {name} has no known shape")))?;
    let dims = shape.iter().map(|d| d.fixed().map_or(-1, |v| v as i64)).collect();
    Ok(PortSpec { name: name.to_string(), dtype: dtype as i32, dims })
}
