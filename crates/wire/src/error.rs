//! Typed errors of the wire crate, and the gRPC status each one becomes.

/// What can be wrong with a message, a credential or a tokens file.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A tensor that cannot be decoded, or does not match what was announced.
    #[error("tensor {name}: {message}")]
    Tensor {
        /// Which tensor (a message field or a state name).
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A malformed message (a missing field, an unknown enum value...).
    #[error("{message}")]
    Message {
        /// What is wrong.
        message: String,
    },
    /// A reply or request that does not belong where it arrived (another session,
    /// step, micro-batch or model version).
    #[error("{message}")]
    Mismatch {
        /// What differs.
        message: String,
    },
    /// Missing or malformed credentials, an unknown device or a wrong token.
    #[error("authentication failed: {0}")]
    Unauthenticated(String),
    /// An identifier (device id, run id, session id) with forbidden characters or length.
    #[error("{what} {value:?}: {message}")]
    Identifier {
        /// Which kind of identifier.
        what: &'static str,
        /// The value as given.
        value: String,
        /// The rule it breaks.
        message: String,
    },
    /// A tokens file that cannot be read or has a bad line.
    #[error("tokens file {path}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    TokensFile {
        /// The file.
        path: String,
        /// The 1-based line, where one is at fault.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The operating system's random source failed.
    #[error("random source: {0}")]
    Random(String),
    /// The edge server cannot be reached.
    #[error("edge server {address}: {message}")]
    Connect {
        /// The address given.
        address: String,
        /// What failed.
        message: String,
    },
}

impl WireError {
    pub(crate) fn tensor(name: &str, message: impl Into<String>) -> WireError {
        WireError::Tensor { name: name.to_string(), message: message.into() }
    }

    pub(crate) fn message(message: impl Into<String>) -> WireError {
        WireError::Message { message: message.into() }
    }
}

impl From<WireError> for tonic::Status {
    /// Bad credentials are `Unauthenticated`; a message that does not fit its session's
    /// state (step, micro-batch, version) is `FailedPrecondition`; anything malformed is
    /// `InvalidArgument`.
    fn from(e: WireError) -> tonic::Status {
        let text = e.to_string();
        match e {
            WireError::Unauthenticated(_) => tonic::Status::unauthenticated(text),
            WireError::Mismatch { .. } => tonic::Status::failed_precondition(text),
            WireError::Tensor { .. } | WireError::Message { .. } | WireError::Identifier { .. } => {
                tonic::Status::invalid_argument(text)
            }
            WireError::TokensFile { .. } | WireError::Random(_) | WireError::Connect { .. } => {
                tonic::Status::internal(text)
            }
        }
    }
}
