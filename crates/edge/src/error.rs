//! Typed errors of the edge crate (what the server's owner sees; devices see gRPC
//! statuses).

use std::path::PathBuf;

/// What can go wrong starting or running an edge server.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// The listen address cannot be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address given.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC transport failed.
    #[error("gRPC server: {0}")]
    Serve(String),
    /// The tokens file or another wire-level input is bad.
    #[error(transparent)]
    Wire(#[from] edgefreeze_wire::WireError),
    /// The state folder cannot be used.
    #[error("state folder {path}: {message}")]
    StateDir {
        /// The folder.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}
