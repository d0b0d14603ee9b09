//! Graph surgery for edgefreeze: training graphs for a model cut at a layer boundary.
//!
//! - [`frozen_prefix_step`]: the training step with the first K layers frozen (no
//!   backward, no update, inference-mode BatchNorm), every parameter and statistic a
//!   graph input, and optional probe outputs ([`probe_name`]) at layer boundaries.
//! - [`prefix_graph`] and [`suffix_step`]: the cached-activation pair at a valid cut
//!   ([`suffix_step_with_probes`] adds probes of the layers behind the cut).
//! - [`split`]: the device/edge set at a valid cut (device forward, edge step, device
//!   backward, one optimizer graph per side) and its [`SplitManifest`].
//!
//! Every graph is built by differentiating a part of the *inference* model
//! ([`subgraph::extract`], [`cut::cut_model`]) with the autodiff crate, never by slicing
//! an assembled training step.
//!
//! # API notes for the crates built on this one
//! - Cuts are given as the layer index `c` they follow ([`edgefreeze_graph::Cut::after_layer`]);
//!   the valid ones are `analyse(model)?.cuts`. An invalid cut is [`RewriteError::Cut`],
//!   which lists the valid ones; more frozen layers than the model has is
//!   [`RewriteError::FreezeDepth`], a probe beyond the last layer [`RewriteError::Probe`].
//! - [`StepSpec`] is a loss and an optimizer (autodiff's `TrainingSpec` minus its list
//!   of frozen parameters, which the rewrites derive from layers).
//! - Frozen layers run BatchNorm from running statistics and do not update them; Dropout
//!   is off there. `edgefreeze_autodiff::artifacts::convert` (so `convert --freeze` and
//!   `train --freeze`) builds the same frozen-prefix step.
//! - State names are those of the unsplit training step (`<param>`, `momentum.<param>`,
//!   `adam_m.<param>`, `adam_v.<param>`, BatchNorm statistic names); every graph outputs
//!   a state tensor's new value as `updated.<name>`, so a trainer switching graphs keeps
//!   every tensor whose name survives (`StateUpdates::where_output_exists`).
//! - Interface names: [`ACTIVATION`] (`"activation"`), [`probe_name`] (`"probe.<l>"`),
//!   [`grad_activation_name`] (`"grad.activation"`), `grad.<p>`, [`STASH_PREFIX`]
//!   (`"stash."`), `grad_scale` (`edgefreeze_autodiff::GRAD_SCALE`), `lr`, `step`,
//!   `labels`, `dropout_seed` (only when the model has Dropout).
//! - Split graphs: feed the edge step's `grad.activation` and the device forward's
//!   `stash.*` outputs (same names) to the device backward; sum `grad.<p>` over M
//!   micro-batches and feed `grad_scale = 1/M` to the apply graphs. With `recompute`
//!   the device backward takes the data inputs instead of a stash. BatchNorm statistics
//!   are updated by the device forward and the edge step of each micro-batch, in order.
//! - [`SplitGraphs::write`] writes `device_forward.onnx`, `edge_step.onnx`,
//!   `device_backward.onnx`, `edge_apply.onnx`, `device_apply.onnx` (the last two
//!   device ones only when the device trains), `split_state.safetensors` and `split.json`
//!   ([`SplitManifest`]: cut, activation port, bytes per sample up/down, stash ports,
//!   graphs with role, side and ports, state with role, layer and side).
//! - [`CachedPair::write`] writes `prefix.onnx`, `suffix_step.onnx` and `cache.json`.
//! - A parameter read on both sides of a cut (tied weights) is frozen in the suffix step
//!   (as the frozen-prefix step freezes it with its first layer) and refused by
//!   [`split`] ([`RewriteError::SharedParameter`]).

mod batch;
pub mod cut;
pub mod error;
pub mod frozen;
pub mod split;
pub mod subgraph;

pub use cut::{ACTIVATION, Parts, activation_name, cut_model, find_cut};
pub use error::{CrossingRead, Result, RewriteError};
pub use frozen::{
    CacheManifest, CachedPair, StepSpec, cache_files, cached_pair, frozen_prefix_step, prefix_graph, probe_name,
    suffix_step, suffix_step_with_probes,
};
pub use split::{
    GraphRole, STASH_PREFIX, SplitGraphEntry, SplitGraphs, SplitManifest, SplitOptions, grad_activation_name, split,
};
