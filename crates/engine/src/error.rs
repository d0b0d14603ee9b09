//! Typed errors of the engine crate.

/// What can go wrong when loading or running a graph.
///
/// Every variant carries its cause as text in its message and returns no `source()`, so
/// `{:#}` prints each cause once. `Clone`, because a failure to load the ONNX Runtime
/// library is kept and given again to every later caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// Bad settings (an unknown engine name, a missing input...).
    #[error("{0}")]
    Config(String),
    /// The ONNX Runtime library cannot be found or loaded.
    #[error("ONNX Runtime library: {0}")]
    OrtLibrary(String),
    /// The loaded ONNX Runtime library lacks the requested execution provider.
    #[error("ONNX Runtime execution provider {provider} is not available in {library}: {hint}")]
    ProviderUnavailable {
        /// The provider asked for.
        provider: String,
        /// The library that was loaded.
        library: String,
        /// How to get a library that has it.
        hint: String,
    },
    /// An error reported by ONNX Runtime.
    #[error("ONNX Runtime: {0}")]
    Ort(String),
    /// An error reported by tract.
    #[error("tract: {0}")]
    Tract(String),
    /// An input or output does not have the expected type or shape.
    #[error("value {name:?}: {message}")]
    Value {
        /// The input or output name.
        name: String,
        /// What is wrong.
        message: String,
    },
}
