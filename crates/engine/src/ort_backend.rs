//! The ONNX Runtime engine, loaded dynamically from the library of the PyPI wheel.

use crate::{EngineError, EngineOptions, Provider, Session, Value};
use ort::session::builder::GraphOptimizationLevel;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How to get the library, printed whenever it cannot be found.
pub const INSTALL_HINT: &str = "install it with `python3 -m pip install onnxruntime==1.31.1` (or onnxruntime-gpu for CUDA) \
and point ORT_DYLIB_PATH or --ort-lib at site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1";

static LOADED: OnceLock<Result<(PathBuf, ort::environment::Environment), String>> = OnceLock::new();

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
        let path = find_library(explicit).map_err(|e| e.to_string())?;
        let builder =
            ort::init_from(&path).map_err(|e| format!("cannot load {}: {e}; {INSTALL_HINT}", path.display()))?;
        let env = builder.with_name("edgefreeze").build().map_err(|e| format!("cannot start ONNX Runtime: {e}"))?;
        Ok((path, env))
    });
    match result {
        Ok((path, env)) => Ok((path.as_path(), env)),
        Err(e) => Err(EngineError::OrtLibrary(e.clone())),
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
        let (library, env) = init(options.ort_library.as_deref())?;
        let threads = options.threads.unwrap_or_else(crate::default_threads);
        let mut builder = ort::session::Session::builder(env)
            .map_err(ort_err)?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(ort_err)?
            .with_intra_threads(threads)
            .map_err(ort_err)?;
        builder = register_provider(builder, provider, library)?;
        let session = builder.commit_from_memory(model).map_err(ort_err)?;
        let inputs = session.inputs().iter().map(|o| o.name().to_string()).collect();
        let outputs = session.outputs().iter().map(|o| o.name().to_string()).collect();
        Ok(OrtSession { session, inputs, outputs })
    }
}

fn register_provider(
    builder: ort::session::builder::SessionBuilder,
    provider: Provider,
    library: &Path,
) -> Result<ort::session::builder::SessionBuilder, EngineError> {
    let unavailable = |name: &str, hint: &str| EngineError::ProviderUnavailable {
        provider: name.into(),
        library: library.display().to_string(),
        hint: hint.into(),
    };
    match provider {
        Provider::Cpu => Ok(builder),
        #[cfg(feature = "cuda")]
        Provider::Cuda => with_provider(
            builder,
            ort::ep::CUDA::default(),
            unavailable("CUDA", "use the onnxruntime-gpu wheel's library and its nvidia-* CUDA wheels"),
        ),
        #[cfg(feature = "xnnpack")]
        Provider::Xnnpack => with_provider(
            builder,
            ort::ep::XNNPACK::default(),
            unavailable("XNNPACK", "use an ONNX Runtime build with XNNPACK (e.g. the Android/iOS packages)"),
        ),
        #[allow(unreachable_patterns)] // reachable when a provider's cargo feature is off
        other => {
            let (name, feature) = match other {
                Provider::Cuda => ("CUDA", "cuda"),
                _ => ("XNNPACK", "xnnpack"),
            };
            Err(unavailable(
                name,
                &format!(
                    "this edgefreeze was built without the `{feature}` cargo feature; rebuild with --features {feature}"
                ),
            ))
        }
    }
}

/// Registers a provider, failing (never falling back to CPU) when the loaded library lacks it.
#[cfg(any(feature = "cuda", feature = "xnnpack"))]
fn with_provider<E>(
    builder: ort::session::builder::SessionBuilder,
    provider: E,
    unavailable: EngineError,
) -> Result<ort::session::builder::SessionBuilder, EngineError>
where
    E: ort::ep::ExecutionProvider + Into<ort::ep::ExecutionProviderDispatch>,
{
    if !E::is_available().unwrap_or(false) {
        return Err(unavailable);
    }
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
        let mut result = Vec::with_capacity(self.outputs.len());
        for name in &self.outputs {
            let v = &outputs[name.as_str()];
            let bad = |e: ort::Error| EngineError::Value { name: name.clone(), message: e.to_string() };
            let value = if let Ok(a) = v.try_extract_array::<f32>() {
                Value::F32(a.to_owned())
            } else if let Ok(a) = v.try_extract_array::<f64>() {
                Value::F64(a.to_owned())
            } else if let Ok(a) = v.try_extract_array::<i64>() {
                Value::I64(a.to_owned())
            } else {
                Value::Bool(v.try_extract_array::<bool>().map_err(bad)?.to_owned())
            };
            result.push(value);
        }
        Ok(result)
    }
}
