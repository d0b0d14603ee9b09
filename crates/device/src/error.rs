//! Typed errors of the device side.

use std::path::PathBuf;

/// What can go wrong on the device: a reply that does not belong where it arrived, the
/// link to the edge, the engine, the run folder.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A reply from the edge does not match the message it should answer (another
    /// session, step, micro-batch or model version): the pipeline stops rather than
    /// apply a gradient to the wrong micro-batch.
    #[error("reply from the edge does not match: expected {field} {expected}, got {got}")]
    Mismatch {
        /// `session`, `step`, `micro-batch` or `model version`.
        field: &'static str,
        /// What the device expected.
        expected: String,
        /// What the reply carried.
        got: String,
    },
    /// A reply is malformed (a gradient missing, a tensor of the wrong shape...).
    #[error("reply from the edge for micro-batch {micro_batch} of step {step}: {message}")]
    Reply {
        /// The step.
        step: u64,
        /// The micro-batch.
        micro_batch: u32,
        /// What is wrong.
        message: String,
    },
    /// The edge refused something (a status from the server that a retry would get
    /// again: a wrong token, a bad request).
    #[error("edge {0}")]
    Link(String),
    /// The edge server is gone: the connection broke, or it did not answer in time. The
    /// trainer can fail over to another server from its last consistent state.
    #[error("the edge at {address} is lost: {message}")]
    EdgeLost {
        /// The server.
        address: String,
        /// What happened.
        message: String,
    },
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// The loss stopped being finite.
    #[error("training diverged: the loss is {loss} at step {step} (epoch {epoch})")]
    Diverged {
        /// The step (1 for the first update).
        step: u64,
        /// The epoch (1-based).
        epoch: usize,
        /// The loss.
        loss: f64,
    },
    /// A run or checkpoint file is damaged or does not fit.
    #[error("{}: {message}", path.display())]
    Run {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Drawing the schedule chart failed.
    #[error("cannot draw {}: {message}", path.display())]
    Plot {
        /// The image.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// From the engine.
    #[error(transparent)]
    Engine(#[from] edgefreeze_engine::EngineError),
    /// From the training driver (data, checkpoints, metrics).
    #[error(transparent)]
    Train(#[from] edgefreeze_train::TrainError),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, DeviceError>;
