//! The split a device run trains: where the model is cut, how a step is pipelined, and
//! the device's graphs built from it by the rewrite crate (the edge builds its side from
//! the same model bytes and settings).

use crate::compute::DeviceGraphs;
use crate::error::{DeviceError, Result};
use edgefreeze_autodiff::artifacts::{Side, parse_loss, parse_optimizer};
use edgefreeze_rewrite::{SplitOptions, StepSpec};
use edgefreeze_train::tensors::value_from_tensor;
use edgefreeze_wire::pb;
use std::path::Path;

/// How the model is split and a step pipelined.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitSettings {
    /// The cut: after this layer (`edgefreeze inspect` lists the valid ones).
    pub cut: usize,
    /// Micro-batches per step (M).
    pub micro_batches: usize,
    /// Sequential split learning: one micro-batch in flight.
    pub sequential: bool,
    /// The device backward recomputes its forward from the inputs instead of reading
    /// stashed activations.
    pub recompute: bool,
    /// The device's layers are frozen (no device backward, no gradient download).
    pub freeze_device: bool,
}

/// The edge's split request for these settings.
pub fn split_request(model: Vec<u8>, split: &SplitSettings, loss: &str, optimizer: &str) -> Result<pb::SplitRequest> {
    let bad = |e: edgefreeze_autodiff::AutodiffError| DeviceError::Config(e.to_string());
    let loss = parse_loss(loss).map_err(bad)?;
    let (optimizer, _) = parse_optimizer(optimizer).map_err(bad)?;
    let too_large = |what: &str| DeviceError::Config(format!("{what} is too large"));
    Ok(pb::SplitRequest {
        model,
        cut_after_layer: u32::try_from(split.cut).map_err(|_| too_large("--cut"))?,
        loss: Some(edgefreeze_wire::convert::loss_to_wire(&loss).map_err(|e| DeviceError::Config(e.to_string()))?),
        optimizer: Some(edgefreeze_wire::convert::optimizer_to_wire(&optimizer)),
        micro_batches: u32::try_from(split.micro_batches).map_err(|_| too_large("--micro-batches"))?,
        frozen_device_layers: split.freeze_device,
    })
}

/// The device's graphs and initial state for a model file and split settings: the
/// rewrite crate's split of the model, of which the device keeps its side (the edge
/// builds the same split from the same bytes and keeps the other).
pub fn device_graphs(model: &Path, split: &SplitSettings, loss: &str, optimizer: &str) -> Result<DeviceGraphs> {
    let bad = |e: edgefreeze_autodiff::AutodiffError| DeviceError::Config(e.to_string());
    let loss = parse_loss(loss).map_err(bad)?;
    let (optimizer, _) = parse_optimizer(optimizer).map_err(bad)?;
    let imported =
        edgefreeze_graph::import(model).map_err(|e| DeviceError::Run { path: model.into(), message: e.to_string() })?;
    let options = SplitOptions { frozen_device_layers: split.freeze_device, recompute: split.recompute };
    let graphs = edgefreeze_rewrite::split(&imported, split.cut, &StepSpec { loss, optimizer }, options)
        .map_err(|e| DeviceError::Config(format!("--cut {}: {e}", split.cut)))?;
    let mut state = Vec::new();
    for entry in graphs.manifest.state.iter().filter(|e| e.side == Some(Side::Device)) {
        let tensor = graphs.state.iter().find(|(n, _)| *n == entry.name).map(|(_, t)| t).ok_or_else(|| {
            DeviceError::Config(format!("the split has no initial value of device state {:?}", entry.name))
        })?;
        state.push((entry.name.clone(), value_from_tensor(&entry.name, tensor)?));
    }
    Ok(DeviceGraphs {
        forward: graphs.device_forward,
        backward: graphs.device_backward,
        apply: graphs.device_apply,
        state,
    })
}
