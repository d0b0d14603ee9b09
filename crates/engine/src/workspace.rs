//! Graphs that share a store of state tensors kept inside the engine.
//!
//! Training runs the same graph thousands of times, and most of what it reads —
//! parameters, optimizer state, BatchNorm statistics — is what it wrote the step before.
//! A [`Workspace`] keeps those tensors in the engine's own form (tract values; ONNX
//! Runtime values, on the provider's device through I/O binding), so a training step
//! copies only the batch in and the loss out: parameters never make a host round trip
//! between steps. Several graphs (the training step and the eval graph) read the same
//! store.

use crate::{EngineError, EngineKind, EngineOptions, Value};

/// A graph loaded into a [`Workspace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub(crate) usize);

/// Which outputs of a graph replace which state tensors after each run.
#[derive(Debug, Clone, Default)]
pub struct StateUpdates {
    /// `(output, state)` pairs: after a run, output `output` becomes state `state`.
    pub pairs: Vec<(String, String)>,
}

impl StateUpdates {
    /// No output updates the state (an eval graph).
    pub fn none() -> StateUpdates {
        StateUpdates::default()
    }

    /// Each output named `{prefix}{state}` updates `state`, for every state name given.
    pub fn by_prefix<'a>(prefix: &str, states: impl IntoIterator<Item = &'a str>) -> StateUpdates {
        StateUpdates { pairs: states.into_iter().map(|s| (format!("{prefix}{s}"), s.to_string())).collect() }
    }

    /// Each state `s` whose output `{prefix}{s}` is among `outputs` is updated by it;
    /// states without such an output (frozen parameters) stay as they are.
    pub fn where_output_exists<'a>(
        prefix: &str,
        states: impl IntoIterator<Item = &'a str>,
        outputs: &[String],
    ) -> StateUpdates {
        let mut updates = StateUpdates::by_prefix(prefix, states);
        updates.pairs.retain(|(output, _)| outputs.contains(output));
        updates
    }

    /// The state an output updates, if any.
    pub fn state_of(&self, output: &str) -> Option<&str> {
        self.pairs.iter().find(|(o, _)| o == output).map(|(_, s)| s.as_str())
    }
}

/// State tensors kept in the engine, and graphs that run against them.
///
/// A graph input whose name is a state tensor is read from the store; every other input
/// is given by the caller at each run. Outputs named in the graph's [`StateUpdates`]
/// replace their state tensors and stay in the engine; the others come back to the host.
pub trait Workspace: Send {
    /// Loads a graph (ONNX protobuf bytes).
    fn load_graph(&mut self, model: &[u8], updates: StateUpdates) -> Result<GraphId, EngineError>;
    /// Inputs of a loaded graph, in order.
    fn inputs(&self, graph: GraphId) -> &[String];
    /// Outputs of a loaded graph, in order.
    fn outputs(&self, graph: GraphId) -> &[String];
    /// Puts a host tensor into the store (one copy, onto the engine's device).
    fn set_state(&mut self, name: &str, value: Value) -> Result<(), EngineError>;
    /// Copies a state tensor back to the host.
    fn state(&self, name: &str) -> Result<Value, EngineError>;
    /// Names of the state tensors, sorted.
    fn state_names(&self) -> Vec<String>;
    /// Runs a graph. `inputs` gives every input that is not in the store; returns the
    /// outputs that do not update the state, in graph order, with their names.
    fn run(&mut self, graph: GraphId, inputs: &[(&str, &Value)]) -> Result<Vec<(String, Value)>, EngineError>;
    /// Frees a loaded graph (its compiled plan or session); the state store is untouched.
    /// Its id is never given out again, so running it, or unloading it twice, is an
    /// error; [`Workspace::inputs`] and [`Workspace::outputs`] of it are empty.
    fn unload_graph(&mut self, graph: GraphId) -> Result<(), EngineError>;
    /// Graphs loaded and not unloaded.
    fn loaded_graphs(&self) -> usize;
    /// The node times of the runs of `graph` so far, where the workspace was made with
    /// [`EngineOptions::profile`](crate::EngineOptions::profile) (an error otherwise).
    /// ONNX Runtime writes its trace only when profiling ends, so on it this ends the
    /// graph's profiling: later runs are not recorded and a second call is an error.
    /// tract goes on recording, and each call returns the runs since the previous one.
    fn take_profile(&mut self, graph: GraphId) -> Result<crate::Profile, EngineError>;
}

/// The loaded graph `id` of a backend's table, or the error naming it.
pub(crate) fn loaded<T>(graphs: &[Option<T>], id: GraphId) -> Result<&T, EngineError> {
    graphs.get(id.0).and_then(Option::as_ref).ok_or_else(|| not_loaded(id))
}

/// [`loaded`], mutably.
pub(crate) fn loaded_mut<T>(graphs: &mut [Option<T>], id: GraphId) -> Result<&mut T, EngineError> {
    graphs.get_mut(id.0).and_then(Option::as_mut).ok_or_else(|| not_loaded(id))
}

/// Takes graph `id` out of a backend's table, leaving its slot empty.
pub(crate) fn unload<T>(graphs: &mut [Option<T>], id: GraphId) -> Result<(), EngineError> {
    graphs.get_mut(id.0).and_then(Option::take).map(drop).ok_or_else(|| not_loaded(id))
}

/// The error for asking a workspace made without profiling for a profile.
pub(crate) fn not_profiled() -> EngineError {
    EngineError::Config("this workspace was made without profiling (EngineOptions::profile)".into())
}

fn not_loaded(id: GraphId) -> EngineError {
    EngineError::Config(format!("graph {} is not loaded in this workspace (never loaded, or unloaded)", id.0))
}

/// Creates an empty workspace on the chosen engine.
pub fn workspace(kind: &EngineKind, options: &EngineOptions) -> Result<Box<dyn Workspace>, EngineError> {
    let slowdown = options.slowdown.map(crate::slowdown::check_slowdown).transpose()?;
    let workspace: Box<dyn Workspace> = match kind {
        EngineKind::Tract => Box::new(crate::tract_backend::TractWorkspace::new(options)),
        EngineKind::Ort(provider) => Box::new(crate::ort_backend::OrtWorkspace::new(*provider, options)?),
    };
    match slowdown {
        Some(factor) => {
            let clock = crate::slowdown::Clock::for_engine(kind, options.threads);
            Ok(Box::new(crate::slowdown::Slowed::new(workspace, factor, clock)?))
        }
        None => Ok(workspace),
    }
}

/// The error for a graph input that is neither in the store nor given.
pub(crate) fn missing_input(name: &str) -> EngineError {
    EngineError::Value { name: name.to_string(), message: "input not given and not in the state store".into() }
}

/// The error for a state tensor that is not in the store.
pub(crate) fn missing_state(name: &str) -> EngineError {
    EngineError::Value { name: name.to_string(), message: "no such state tensor".into() }
}

/// Checks that every update pair names an output of the graph.
pub(crate) fn check_updates(updates: &StateUpdates, outputs: &[String]) -> Result<(), EngineError> {
    for (output, state) in &updates.pairs {
        if !outputs.contains(output) {
            return Err(EngineError::Value {
                name: output.clone(),
                message: format!("is to update state {state:?} but the graph has no such output"),
            });
        }
    }
    Ok(())
}
