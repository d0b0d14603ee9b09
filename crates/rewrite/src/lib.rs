//! Graph surgery for edgefreeze: training graphs for a model cut at a layer boundary.
//!
//! - [`frozen_prefix_step`]: the training step with the first K layers frozen (no
//!   backward, no update, inference-mode BatchNorm), every parameter and statistic a
//!   graph input, and optional probe outputs ([`probe_name`]) at layer boundaries.
//! - [`prefix_graph`] and [`suffix_step`]: the cached-activation pair at a valid cut.
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
//!   which lists the valid ones.
//! - [`StepSpec`] is a loss and an optimizer (autodiff's `TrainingSpec` minus its list
//!   of frozen parameters, which the rewrites derive from layers).
//! - Frozen layers run BatchNorm from running statistics and do not update them; Dropout
//!   is off there.
//! - State names are those of the unsplit training step (`<param>`, `momentum.<param>`,
//!   `adam_m.<param>`, BatchNorm statistic names), so a trainer switching graphs keeps
//!   every tensor whose name survives.

pub mod cut;
pub mod error;
pub mod frozen;
pub mod split;
pub mod subgraph;

pub use cut::{ACTIVATION, Parts, activation_name, cut_model, find_cut};
pub use error::{Result, RewriteError};
pub use frozen::{
    CacheManifest, CachedPair, StepSpec, cache_files, cached_pair, frozen_prefix_step, prefix_graph, probe_name,
    suffix_step,
};
pub use split::{
    GraphRole, STASH_PREFIX, SplitGraphEntry, SplitGraphs, SplitManifest, SplitOptions, grad_activation_name, split,
};
