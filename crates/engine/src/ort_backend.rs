//! The ONNX Runtime engine, loaded dynamically from the library of the PyPI wheel.

use crate::workspace::{
    GraphId, StateUpdates, Workspace, check_updates, loaded, loaded_mut, missing_input, missing_state, not_profiled,
    unload,
};
use crate::{EngineError, EngineOptions, Provider, Session, Value};
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::IoBinding;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{DynTensorValueType, DynValue, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How to get the library, printed whenever it cannot be found.
pub const INSTALL_HINT: &str = "install it with `python3 -m pip install onnxruntime==1.31.1` (or onnxruntime-gpu for CUDA) \
and point ORT_DYLIB_PATH or --ort-lib at site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1";

static LOADED: OnceLock<Result<(PathBuf, ort::environment::Environment), EngineError>> = OnceLock::new();

/// Finds the ONNX Runtime library: an explicit path, else `ORT_DYLIB_PATH`, else the
/// `onnxruntime` (or `onnxruntime-gpu`) Python package's copy.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, EngineError> {
    if let Some(p) = explicit {
        return existing(p.to_path_buf(), "--ort-lib");
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return existing(PathBuf::from(p), "ORT_DYLIB_PATH");
    }
    let probe = std::process::Command::new("python3")
        .args([
            "-c",
            "import glob, os, onnxruntime; d = os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'); \
             print(sorted(glob.glob(os.path.join(d, 'libonnxruntime.so*')) + glob.glob(os.path.join(d, 'onnxruntime.dll')) + glob.glob(os.path.join(d, 'libonnxruntime*.dylib')))[-1])",
        ])
        .output();
    match probe {
        Ok(out) if out.status.success() => {
            existing(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()), "python3")
        }
        _ => Err(EngineError::OrtLibrary(format!(
            "not found: ORT_DYLIB_PATH is not set and python3 has no onnxruntime; {INSTALL_HINT}"
        ))),
    }
}

fn existing(path: PathBuf, source: &str) -> Result<PathBuf, EngineError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(EngineError::OrtLibrary(format!("{} (from {source}) is not a file; {INSTALL_HINT}", path.display())))
    }
}

/// Loads the library once per process; later calls return the library already loaded
/// and its environment.
pub fn init(explicit: Option<&Path>) -> Result<(&'static Path, &'static ort::environment::Environment), EngineError> {
    let result = LOADED.get_or_init(|| {
        let path = find_library(explicit)?;
        let builder = ort::init_from(&path)
            .map_err(|e| EngineError::OrtLibrary(format!("cannot load {}: {e}; {INSTALL_HINT}", path.display())))?;
        let env = builder
            .with_name("edgefreeze")
            .build()
            .map_err(|e| EngineError::OrtLibrary(format!("cannot start ONNX Runtime: {e}")))?;
        Ok((path, env))
    });
    match result {
        Ok((path, env)) => Ok((path.as_path(), env)),
        Err(e) => Err(e.clone()),
    }
}

fn ort_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Ort(e.to_string())
}

/// A graph loaded into an ONNX Runtime session.
pub struct OrtSession {
    session: ort::session::Session,
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl OrtSession {
    /// Creates a session with the chosen execution provider; fails, naming the library,
    /// when the provider is not in it.
    pub fn load(model: &[u8], provider: Provider, options: &EngineOptions) -> Result<OrtSession, EngineError> {
        let (session, inputs, outputs) = build_session(model, provider, options)?;
        Ok(OrtSession { session, inputs, outputs })
    }
}

type Built = (ort::session::Session, Vec<String>, Vec<String>);

fn build_session(model: &[u8], provider: Provider, options: &EngineOptions) -> Result<Built, EngineError> {
    let (library, env) = init(options.ort_library.as_deref())?;
    let threads = options.threads.unwrap_or_else(crate::default_threads);
    let mut builder = ort::session::Session::builder(env)
        .map_err(ort_err)?
        .with_optimization_level(GraphOptimizationLevel::Level3)
        .map_err(ort_err)?
        .with_intra_threads(threads)
        .map_err(ort_err)?;
    if provider == Provider::Cpu {
        // No memory pattern on the CPU arena. With one, the first run allocates each
        // tensor from the arena, the second run takes one block the size of the whole
        // recorded pattern beside those chunks, and the arena keeps both: a training
        // step resident at twice its working set (ResNet-20 at batch 64: 98 MiB after
        // loading, 186 after the first step, 272 from the second on; without the pattern
        // 186 from the first on). The arena alone reuses its chunks from step to step at
        // the same speed (docs/results.md, "the memory pattern").
        builder = builder.with_memory_pattern(false).map_err(ort_err)?;
    }
    builder = register_provider(builder, provider, library)?;
    if options.profile {
        builder = builder.with_profiling(profile_prefix()).map_err(ort_err)?;
    }
    let session = builder.commit_from_memory(model).map_err(ort_err)?;
    let inputs = session.inputs().iter().map(|o| o.name().to_string()).collect();
    let outputs = session.outputs().iter().map(|o| o.name().to_string()).collect();
    Ok((session, inputs, outputs))
}

/// A fresh path prefix for one session's profiler trace (ONNX Runtime appends the time
/// and `.json`); the trace is read and removed when the profile is taken.
fn profile_prefix() -> PathBuf {
    static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("edgefreeze-ort-profile-{}-{n}", std::process::id()))
}

fn register_provider(
    builder: ort::session::builder::SessionBuilder,
    provider: Provider,
    library: &Path,
) -> Result<ort::session::builder::SessionBuilder, EngineError> {
    if let Some(missing) = unavailable(provider, library) {
        return Err(missing);
    }
    match provider {
        Provider::Cpu => Ok(builder),
        #[cfg(feature = "cuda")]
        Provider::Cuda => with_provider(builder, ort::ep::CUDA::default()),
        #[cfg(feature = "xnnpack")]
        Provider::Xnnpack => with_provider(builder, ort::ep::XNNPACK::default()),
        #[allow(unreachable_patterns)] // reachable when a provider's cargo feature is off
        other => Err(without_feature(other, library)),
    }
}

/// Checks, without building a session, that the ONNX Runtime library loads and has
/// `provider`: what [`OrtWorkspace::new`] and a trainer's pre-flight checks ask.
pub fn check_provider(provider: Provider, options: &EngineOptions) -> Result<(), EngineError> {
    let (library, _) = init(options.ort_library.as_deref())?;
    unavailable(provider, library).map_or(Ok(()), Err)
}

/// Why the loaded library cannot run `provider`, if it cannot (never a fall back to CPU).
fn unavailable(provider: Provider, library: &Path) -> Option<EngineError> {
    match provider {
        Provider::Cpu => None,
        #[cfg(feature = "cuda")]
        Provider::Cuda => (!is_available::<ort::ep::CUDA>()).then(|| {
            missing(provider, library, "use the onnxruntime-gpu wheel's library and its nvidia-* CUDA wheels")
        }),
        #[cfg(feature = "xnnpack")]
        Provider::Xnnpack => (!is_available::<ort::ep::XNNPACK>()).then(|| {
            missing(provider, library, "use an ONNX Runtime build with XNNPACK (e.g. the Android/iOS packages)")
        }),
        #[allow(unreachable_patterns)] // reachable when a provider's cargo feature is off
        other => Some(without_feature(other, library)),
    }
}

fn missing(provider: Provider, library: &Path, hint: &str) -> EngineError {
    let name = match provider {
        Provider::Cpu => "CPU",
        Provider::Cuda => "CUDA",
        Provider::Xnnpack => "XNNPACK",
    };
    EngineError::ProviderUnavailable {
        provider: name.into(),
        library: library.display().to_string(),
        hint: hint.into(),
    }
}

/// The error for a provider whose cargo feature this build lacks.
fn without_feature(provider: Provider, library: &Path) -> EngineError {
    let feature = match provider {
        Provider::Cpu => "", // always built in; never asked for here
        Provider::Cuda => "cuda",
        Provider::Xnnpack => "xnnpack",
    };
    missing(
        provider,
        library,
        &format!("this edgefreeze was built without the `{feature}` cargo feature; rebuild with --features {feature}"),
    )
}

#[cfg(any(feature = "cuda", feature = "xnnpack"))]
fn is_available<E: ort::ep::ExecutionProvider>() -> bool {
    E::is_available().unwrap_or(false)
}

/// Registers a provider that [`unavailable`] found in the library; a failure to register
/// it is an error, never a silent fall back to CPU.
#[cfg(any(feature = "cuda", feature = "xnnpack"))]
fn with_provider<E>(
    builder: ort::session::builder::SessionBuilder,
    provider: E,
) -> Result<ort::session::builder::SessionBuilder, EngineError>
where
    E: ort::ep::ExecutionProvider + Into<ort::ep::ExecutionProviderDispatch>,
{
    let dispatch: ort::ep::ExecutionProviderDispatch = provider.into();
    builder.with_execution_providers([dispatch.error_on_failure()]).map_err(ort_err)
}

impl Session for OrtSession {
    fn input_names(&self) -> &[String] {
        &self.inputs
    }

    fn output_names(&self) -> &[String] {
        &self.outputs
    }

    fn run(&mut self, inputs: &[(&str, &Value)]) -> Result<Vec<Value>, EngineError> {
        let mut bound: Vec<(std::borrow::Cow<'_, str>, ort::session::SessionInputValue<'_>)> = Vec::new();
        for name in &self.inputs {
            let (_, v) = inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| EngineError::Value { name: name.clone(), message: "input not given".into() })?;
            let value: ort::session::SessionInputValue<'_> = match v {
                Value::F32(a) => ort::value::TensorRef::from_array_view(a.view()).map_err(ort_err)?.into(),
                Value::F64(a) => ort::value::TensorRef::from_array_view(a.view()).map_err(ort_err)?.into(),
                Value::I64(a) => ort::value::TensorRef::from_array_view(a.view()).map_err(ort_err)?.into(),
                Value::Bool(a) => ort::value::TensorRef::from_array_view(a.view()).map_err(ort_err)?.into(),
            };
            bound.push((name.as_str().into(), value));
        }
        let outputs = self.session.run(bound).map_err(ort_err)?;
        self.outputs.iter().map(|name| to_host(name, &outputs[name.as_str()])).collect()
    }
}

/// Copies an ONNX Runtime value in host memory into a host tensor.
fn to_host(name: &str, v: &DynValue) -> Result<Value, EngineError> {
    let bad = |e: ort::Error| EngineError::Value { name: name.to_string(), message: e.to_string() };
    Ok(if let Ok(a) = v.try_extract_array::<f32>() {
        Value::F32(a.to_owned())
    } else if let Ok(a) = v.try_extract_array::<f64>() {
        Value::F64(a.to_owned())
    } else if let Ok(a) = v.try_extract_array::<i64>() {
        Value::I64(a.to_owned())
    } else {
        Value::Bool(v.try_extract_array::<bool>().map_err(bad)?.to_owned())
    })
}

/// A host tensor as an owned ONNX Runtime value, taking its buffer.
fn to_ort(name: &str, v: Value) -> Result<DynValue, EngineError> {
    let bad = |e: ort::Error| EngineError::Value { name: name.to_string(), message: e.to_string() };
    Ok(match v {
        Value::F32(a) => Tensor::from_array(a).map_err(bad)?.into_dyn(),
        Value::F64(a) => Tensor::from_array(a).map_err(bad)?.into_dyn(),
        Value::I64(a) => Tensor::from_array(a).map_err(bad)?.into_dyn(),
        Value::Bool(a) => Tensor::from_array(a).map_err(bad)?.into_dyn(),
    })
}

/// Where a provider keeps tensors.
fn device_of(provider: Provider) -> AllocationDevice<'static> {
    match provider {
        Provider::Cuda => AllocationDevice::CUDA,
        Provider::Cpu | Provider::Xnnpack => AllocationDevice::CPU,
    }
}

struct BoundGraph {
    session: ort::session::Session,
    binding: IoBinding,
    inputs: Vec<String>,
    outputs: Vec<String>,
    /// Where each output is to be allocated.
    memory: Vec<MemoryInfo<'static>>,
    updates: StateUpdates,
    /// Whether the session is profiling (until its profile is taken).
    profiling: bool,
}

/// A [`Workspace`] on ONNX Runtime: state tensors are ONNX Runtime values on the
/// provider's device, bound to each run with I/O binding; state outputs are bound to
/// that device too, so parameters never come back to the host between steps.
pub struct OrtWorkspace {
    provider: Provider,
    options: EngineOptions,
    /// Indexed by [`GraphId`]; an unloaded graph leaves an empty slot.
    graphs: Vec<Option<BoundGraph>>,
    store: HashMap<String, DynValue>,
}

impl OrtWorkspace {
    /// An empty workspace on one provider; checks the library and the provider now.
    pub fn new(provider: Provider, options: &EngineOptions) -> Result<OrtWorkspace, EngineError> {
        check_provider(provider, options)?;
        Ok(OrtWorkspace { provider, options: options.clone(), graphs: Vec::new(), store: HashMap::new() })
    }

    fn memory(&self, on_device: bool) -> Result<MemoryInfo<'static>, EngineError> {
        let device = if on_device { device_of(self.provider) } else { AllocationDevice::CPU };
        MemoryInfo::new(device, 0, AllocatorType::Device, MemoryType::Default).map_err(ort_err)
    }
}

impl Workspace for OrtWorkspace {
    fn load_graph(&mut self, model: &[u8], updates: StateUpdates) -> Result<GraphId, EngineError> {
        let (session, inputs, outputs) = build_session(model, self.provider, &self.options)?;
        check_updates(&updates, &outputs)?;
        let binding = session.create_binding().map_err(ort_err)?;
        let mut memory = Vec::new();
        for name in &outputs {
            memory.push(self.memory(updates.state_of(name).is_some())?);
        }
        let profiling = self.options.profile;
        self.graphs.push(Some(BoundGraph { session, binding, inputs, outputs, memory, updates, profiling }));
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn inputs(&self, graph: GraphId) -> &[String] {
        loaded(&self.graphs, graph).map_or(&[], |g| &g.inputs)
    }

    fn outputs(&self, graph: GraphId) -> &[String] {
        loaded(&self.graphs, graph).map_or(&[], |g| &g.outputs)
    }

    fn unload_graph(&mut self, graph: GraphId) -> Result<(), EngineError> {
        // The session, its I/O binding and the output buffers bound to it go together;
        // the store's values are the workspace's and stay.
        unload(&mut self.graphs, graph)
    }

    fn loaded_graphs(&self) -> usize {
        self.graphs.iter().flatten().count()
    }

    fn take_profile(&mut self, graph: GraphId) -> Result<crate::Profile, EngineError> {
        let g = loaded_mut(&mut self.graphs, graph)?;
        if !self.options.profile {
            return Err(not_profiled());
        }
        if !g.profiling {
            return Err(EngineError::Config(
                "this graph's ONNX Runtime profile was already taken (taking it ends profiling)".into(),
            ));
        }
        g.profiling = false;
        let path = g.session.end_profiling().map_err(ort_err)?;
        let trace = std::fs::read_to_string(&path)
            .map_err(|e| EngineError::Ort(format!("cannot read ONNX Runtime's profile {path}: {e}")));
        let _ = std::fs::remove_file(&path); // a leftover temporary file is harmless
        crate::profile::parse_ort_trace(&trace?)
    }

    fn set_state(&mut self, name: &str, value: Value) -> Result<(), EngineError> {
        let mut v = to_ort(name, value)?;
        let device = device_of(self.provider);
        if device != AllocationDevice::CPU {
            let tensor = v.downcast::<DynTensorValueType>().map_err(ort_err)?;
            v = tensor.to(device, 0).map_err(ort_err)?.into_dyn();
        }
        self.store.insert(name.to_string(), v);
        Ok(())
    }

    fn state(&self, name: &str) -> Result<Value, EngineError> {
        let v = self.store.get(name).ok_or_else(|| missing_state(name))?;
        if device_of(self.provider) == AllocationDevice::CPU {
            return to_host(name, v);
        }
        let tensor = v.view().downcast::<DynTensorValueType>().map_err(ort_err)?;
        to_host(name, &tensor.to(AllocationDevice::CPU, 0).map_err(ort_err)?.into_dyn())
    }

    fn state_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.store.keys().cloned().collect();
        names.sort();
        names
    }

    fn run(&mut self, graph: GraphId, inputs: &[(&str, &Value)]) -> Result<Vec<(String, Value)>, EngineError> {
        let g = loaded_mut(&mut self.graphs, graph)?;
        for name in &g.inputs {
            match self.store.get(name) {
                Some(v) => g.binding.bind_input(name.as_str(), v).map_err(ort_err)?,
                None => {
                    let (_, v) = inputs.iter().find(|(n, _)| n == name).ok_or_else(|| missing_input(name))?;
                    let owned = to_ort(name, (*v).clone())?;
                    g.binding.bind_input(name.as_str(), &owned).map_err(ort_err)?;
                }
            }
        }
        // Outputs are bound afresh for every run: a binding reuses the buffers of its
        // previous outputs, and those are now state tensors this run reads.
        g.binding.clear_outputs();
        for (name, memory) in g.outputs.iter().zip(&g.memory) {
            g.binding.bind_output_to_device(name.as_str(), memory).map_err(ort_err)?;
        }
        let mut outputs = g.session.run_binding(&g.binding).map_err(ort_err)?;
        let mut host = Vec::new();
        for name in &g.outputs {
            let value = outputs.remove(name.as_str()).ok_or_else(|| EngineError::Value {
                name: name.clone(),
                message: "ONNX Runtime returned no value for this output".into(),
            })?;
            match g.updates.state_of(name) {
                Some(state) => {
                    self.store.insert(state.to_string(), value);
                }
                None => host.push((name.clone(), to_host(name, &value)?)),
            }
        }
        Ok(host)
    }
}
