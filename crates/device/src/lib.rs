//! The device side of edgefreeze's device–edge split training (EdgeMove).
//!
//! A phone keeps its training data and trains the front of a model; an edge server
//! trains the rest. [`pipeline`] is the micro-batch pipeline of one step as pure logic
//! over the device's compute and the stream to the edge; [`split`] builds the device's
//! graphs of a split with the rewrite crate and [`compute`] runs them on an engine;
//! [`timeline`] turns the timestamps both sides record into a schedule chart; [`link`]
//! is the gRPC stream to an edge server and [`trainer`] the run behind
//! `edgefreeze device train`.

pub mod compute;
pub mod error;
pub mod link;
pub mod local;
pub mod pipeline;
pub mod split;
pub mod stages;
pub mod timeline;
pub mod trainer;

pub use error::{DeviceError, Result};
