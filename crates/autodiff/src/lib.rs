//! Reverse-mode automatic differentiation on ONNX graphs, written in standard ONNX ops.
//!
//! From an inference model, a loss and an optimizer, [`training`] builds a gradient
//! graph, a training-step graph (forward, backward and optimizer update) and an eval
//! graph, all in the default `ai.onnx` domain, so one file runs on ONNX Runtime, tract
//! and the ONNX reference evaluator. The reverse pass is in [`grad`]; each op's gradient
//! rule is in [`rules`], one module per op family.

pub mod artifacts;
pub mod emit;
pub mod error;
pub mod grad;
pub mod loss;
pub mod optim;
pub mod rules;
pub mod saved;
pub mod training;
pub mod training_mode;

pub use error::{AutodiffError, BlockedOp, Result};
pub use loss::Loss;
pub use optim::Optimizer;
pub use training::{
    GRAD_SCALE, Objective, StepOptions, TrainingSpec, eval_graph, gradient_graph, step_graph, training_step_graph,
    update_graph,
};
