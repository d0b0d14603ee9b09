//! The EdgeMove planner of edgefreeze: pure logic, no network.
//!
//! - [`measure`]: what the device measured (its per-layer forward, backward and update
//!   times, each edge server's link and its step time at each candidate cut, the bytes
//!   each cut sends) — filled by probing, or written by hand in tests.
//! - [`cost`]: the cost model ([`CostModel::predict`]): the predicted time of one
//!   pipelined (or sequential) training step of a (server, cut, micro-batch count)
//!   candidate, with a frozen device prefix or without, stage by stage; every constant
//!   is a field of [`CostModel`] with a default.
//! - [`overlap`]: how much slower each side computes while the other computes too (the
//!   factor the concurrent probe measures and the cost model's schedule applies).
//! - [`planner`]: [`plan`] predicts every candidate and chooses the shortest step.
//! - [`replan`]: [`decide`], the re-planning rule (a move that pays for itself, or a
//!   re-probe when the measured step drifts from the prediction), and the costs of
//!   moving.
//!
//! `docs/edge.md` ("Planning") derives the model.

pub mod calibrate;
pub mod cost;
mod error;
pub mod measure;
pub mod overlap;
pub mod planner;
pub mod replan;

pub use calibrate::Calibration;
pub use cost::{Candidate, CostModel, Mode, Prediction, Resource, Stages, Workload};
pub use error::{PlanError, Result};
pub use measure::{
    Affine, CutBytes, DeviceTimes, EdgeCutTimes, LayerTimes, LinkTimes, Measurements, Overlap, ServerTimes,
};
pub use overlap::{OverlapFactors, OverlapFit, TimedOp, fit_factor, fit_factors};
pub use planner::{Plan, Space, plan};
pub use replan::{Current, Decision, ReplanPolicy, decide, migration_s, recut_s};
