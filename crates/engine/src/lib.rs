//! Execution engines for edgefreeze graphs.
//!
//! One [`Session`] trait (bind inputs, run, read outputs) with two backends:
//! [`tract`](tract_backend) — pure Rust, the default, needs no native library — and
//! [ONNX Runtime](ort_backend), loaded dynamically from the library of the PyPI wheel,
//! with execution providers chosen by name. Asking for a provider the loaded library
//! lacks is an error, never a silent fall back to CPU.

mod error;
pub mod ort_backend;
pub mod profile;
pub mod slowdown;
pub mod tract_backend;
pub mod tract_lower;
mod value;
pub mod workspace;

pub use error::EngineError;
pub use profile::{NodeTime, OpTypeTime, Profile};
pub use value::Value;
pub use workspace::{GraphId, StateUpdates, Workspace, workspace};

use std::path::PathBuf;

/// Which engine runs a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineKind {
    /// tract, pure Rust.
    Tract,
    /// ONNX Runtime with one execution provider.
    Ort(Provider),
}

/// ONNX Runtime execution providers edgefreeze can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The default CPU provider.
    Cpu,
    /// NVIDIA CUDA (the `onnxruntime-gpu` library; cargo feature `cuda`).
    Cuda,
    /// XNNPACK, for phone-class CPUs (cargo feature `xnnpack`).
    Xnnpack,
}

impl std::str::FromStr for EngineKind {
    type Err = EngineError;

    /// Parses `tract`, `ort` (= `ort:cpu`), `ort:cpu`, `ort:cuda` or `ort:xnnpack`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "tract" => EngineKind::Tract,
            "ort" | "ort:cpu" => EngineKind::Ort(Provider::Cpu),
            "ort:cuda" => EngineKind::Ort(Provider::Cuda),
            "ort:xnnpack" => EngineKind::Ort(Provider::Xnnpack),
            other => {
                return Err(EngineError::Config(format!(
                    "unknown engine {other:?}: use tract, ort:cpu, ort:cuda or ort:xnnpack"
                )));
            }
        })
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineKind::Tract => f.write_str("tract"),
            EngineKind::Ort(Provider::Cpu) => f.write_str("ort:cpu"),
            EngineKind::Ort(Provider::Cuda) => f.write_str("ort:cuda"),
            EngineKind::Ort(Provider::Xnnpack) => f.write_str("ort:xnnpack"),
        }
    }
}

/// Settings shared by the engines.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Threads for one run; `None` is the machine's cores.
    pub threads: Option<usize>,
    /// The ONNX Runtime library; `None` uses `ORT_DYLIB_PATH`, then the Python wheel.
    pub ort_library: Option<PathBuf>,
    /// Record the time of every node of every run, for [`Workspace::take_profile`]
    /// (ONNX Runtime's profiler; tract times each node it evaluates). Off by default: it
    /// costs time and, on ONNX Runtime, a trace file until the profile is taken.
    pub profile: bool,
    /// tract only: always run the generic plan, compiled once with the batch symbolic,
    /// instead of a fully optimised plan per batch size. For comparing the two, and a
    /// way around a tract optimisation that misbehaves on some graph.
    pub tract_generic_plan: bool,
    /// Make every graph run take at least this many times as long (at least 1): the engine sleeps
    /// after each run for the rest ([`slowdown`]). Emulates a slower device, such as a
    /// phone beside its edge server, on this machine. `None` is full speed.
    pub slowdown: Option<f64>,
}

/// A loaded graph, ready to run.
pub trait Session: Send {
    /// Names of the graph inputs, in order.
    fn input_names(&self) -> &[String];
    /// Names of the graph outputs, in order.
    fn output_names(&self) -> &[String];
    /// Runs the graph on named inputs (every graph input must be given) and returns the
    /// outputs in the order of [`Session::output_names`].
    fn run(&mut self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>, EngineError>;
}

/// Loads an ONNX model (protobuf bytes) into the chosen engine.
pub fn load(kind: &EngineKind, model: &[u8], options: &EngineOptions) -> Result<Box<dyn Session>, EngineError> {
    let slowdown = options.slowdown.map(slowdown::check_slowdown).transpose()?;
    let session: Box<dyn Session> = match kind {
        EngineKind::Tract => Box::new(tract_backend::TractSession::load(model, options)?),
        EngineKind::Ort(provider) => Box::new(ort_backend::OrtSession::load(model, *provider, options)?),
    };
    match slowdown {
        Some(factor) => {
            Ok(Box::new(slowdown::Slowed::new(session, factor, slowdown::Clock::for_engine(kind, options.threads))?))
        }
        None => Ok(session),
    }
}

/// Checks, without loading a graph, that an engine can run here: tract always can; ONNX
/// Runtime needs its library to load and to have the provider. Cheap enough for a
/// pre-flight check before anything is written.
pub fn check_available(kind: &EngineKind, options: &EngineOptions) -> Result<(), EngineError> {
    match kind {
        EngineKind::Tract => Ok(()),
        EngineKind::Ort(provider) => ort_backend::check_provider(*provider, options),
    }
}

/// The machine's cores (the default thread count).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
