//! Errors of the freezing crate.

use std::path::PathBuf;

/// What can go wrong while freezing layers.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// Two activations that cannot be compared.
    #[error("plasticity: {0}")]
    Shape(String),
    /// A controller setting that makes no sense.
    #[error("freezing controller: {0}")]
    Config(String),
    /// The model cannot be turned into a reference model.
    #[error("reference model: {0}")]
    Reference(String),
    /// A graph-level failure (analysis, encoding).
    #[error(transparent)]
    Graph(#[from] edgefreeze_graph::GraphError),
    /// An engine failure while running the reference model.
    #[error(transparent)]
    Engine(#[from] edgefreeze_engine::EngineError),
    /// The reference runner thread is gone.
    #[error("reference runner: {0}")]
    Runner(String),
    /// A file of the activation cache could not be used.
    #[error("activation cache: cannot {action} {}: {source}", path.display())]
    CacheIo {
        /// What was attempted.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The activation cache was asked for something it cannot do.
    #[error("activation cache: {0}")]
    Cache(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, FreezeError>;

/// An I/O error of the cache, naming the file.
pub(crate) fn cache_io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FreezeError {
    let path = path.into();
    move |source| FreezeError::CacheIo { action, path, source }
}
