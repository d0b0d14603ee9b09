//! Egeria's knowledge-guided layer freezing for edgefreeze.
//!
//! While a network trains, its front layers settle long before its back layers. This
//! crate decides when a front layer has settled and makes freezing it cheap:
//!
//! - [`sp`]: the similarity-preserving loss between a layer's activations in the
//!   training model and in a reference model — the layer's *plasticity*;
//! - [`controller`]: when to measure, when a layer is stable (a flat least-squares
//!   trend over a window), front-to-back freezing, unfreezing on a learning-rate drop;
//!   pure logic with serialisable state;
//! - [`reference`]: the int8 reference model (QuantizeLinear/DequantizeLinear, standard
//!   ONNX) built from the live parameters;
//! - [`runner`]: that model on its own thread and engine, fed through a bounded queue;
//! - [`cache`]: the frozen prefix's output per sample, in memory and spilled to a
//!   checksummed file;
//! - [`depths`]: the training step at each frozen depth against the FLOP model's
//!   prediction (`edgefreeze bench --freeze-depths`);
//! - [`egeria`]: all of it as a controller of the trainer (`--freeze auto`, and the
//!   fixed-schedule baseline), switching to the `rewrite` crate's frozen-prefix and
//!   cached prefix/suffix graphs in place.

pub mod cache;
pub mod controller;
pub mod depths;
pub mod egeria;
mod error;
pub mod hash;
pub mod reference;
pub mod runner;
pub mod sp;

pub use cache::{ActivationCache, CacheIdentity, CacheKey, CacheStats, Reopened};
pub use controller::{Action, Controller, ControllerState, Knobs, Reason};
pub use error::{FreezeError, Result};
pub use runner::{ReferenceRunner, Reply, Request};
pub use sp::{Gram, sp_loss};
