//! The device side of edgefreeze's device–edge split training (EdgeMove).
//!
//! A phone keeps its training data and trains the front of a model; an edge server
//! trains the rest. [`pipeline`] is the micro-batch pipeline of one step as pure logic
//! over the device's compute and the stream to the edge; [`compute`] runs the device's
//! graphs of the split on an engine; [`timeline`] turns the timestamps both sides record
//! into a schedule chart.

pub mod compute;
pub mod error;
pub mod pipeline;
pub mod timeline;

pub use error::{DeviceError, Result};
