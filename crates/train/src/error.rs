//! Typed errors of the training driver.

use std::path::PathBuf;

/// What can go wrong while training, checkpointing, exporting or benchmarking.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad settings (a schedule that does not parse, a dataset that does not fit the model...).
    #[error("{0}")]
    Config(String),
    /// A file cannot be read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// A checkpoint or run file is damaged or does not belong to this run.
    #[error("{}: {message}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The loss stopped being finite.
    #[error(
        "training diverged: the loss is {loss} at step {step} (epoch {epoch}); {}",
        match checkpoint {
            Some(p) => format!("the last good checkpoint is {}", p.display()),
            None => "there is no checkpoint yet".to_string(),
        }
    )]
    Diverged {
        /// The global step (1 for the first update) whose loss was not finite.
        step: u64,
        /// The epoch it was in (1-based).
        epoch: usize,
        /// The loss value.
        loss: f64,
        /// The last checkpoint written, kept unchanged.
        checkpoint: Option<PathBuf>,
    },
    /// Drawing a plot failed.
    #[error("cannot draw {}: {message}", path.display())]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// From the engine.
    #[error(transparent)]
    Engine(#[from] edgefreeze_engine::EngineError),
    /// From graph loading or saving.
    #[error(transparent)]
    Graph(#[from] edgefreeze_graph::GraphError),
    /// From building the training graphs.
    #[error(transparent)]
    Autodiff(#[from] edgefreeze_autodiff::AutodiffError),
    /// From reading data.
    #[error(transparent)]
    Data(#[from] edgefreeze_data::DataError),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// An I/O error naming its file.
pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.into();
    move |source| TrainError::Io { action, path, source }
}
