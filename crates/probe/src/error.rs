//! Typed errors of probing.

/// What stops a probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The model cannot be read or split.
    #[error("{path}: {message}")]
    Model {
        /// The model file.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// The device's own compute failed.
    #[error("device at cut {cut}: {source}")]
    Device {
        /// The cut being timed.
        cut: usize,
        /// The failure.
        source: edgefreeze_device::DeviceError,
    },
    /// An edge server refused or failed.
    #[error("edge server {address}: {message}")]
    Edge {
        /// The server.
        address: String,
        /// What happened.
        message: String,
    },
    /// The measurements are unusable (a bug, or a clock gone backwards).
    #[error(transparent)]
    Plan(#[from] edgefreeze_plan::PlanError),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, ProbeError>;
