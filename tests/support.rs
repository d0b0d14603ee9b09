//! Shared helpers of the workspace-level tests: where the bundled models are, their
//! PyTorch sidecars, and the optional independent Python validators.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the repository").to_path_buf()
}

/// The folder of bundled models.
pub fn models_dir() -> PathBuf {
    repo_root().join("models")
}

/// One bundled model with the facts PyTorch recorded about it.
pub struct Sidecar {
    /// The model file.
    pub path: PathBuf,
    /// The parsed sidecar JSON.
    pub json: Value,
}

/// Every bundled model that has a sidecar.
pub fn sidecars() -> Vec<Sidecar> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(models_dir()).expect("models/ exists") {
        let path = entry.expect("readable models/ entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            let file = json["file"].as_str().expect("sidecar names its file");
            out.push(Sidecar { path: models_dir().join(file), json });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    assert!(out.len() >= 8, "expected the bundled models, found {}", out.len());
    out
}

/// Whether tests that need Python's `onnx` package must run (CI sets this) rather than skip.
fn python_required() -> bool {
    std::env::var("EDGEFREEZE_REQUIRE_PYTHON_ONNX").is_ok_and(|v| v == "1")
}

/// Whether `python3` with the `onnx` package is available. When it is not, tests that use
/// it print why they skip, unless `EDGEFREEZE_REQUIRE_PYTHON_ONNX=1`, which makes it a failure.
pub fn python_onnx() -> bool {
    let ok =
        Command::new("python3").args(["-c", "import onnx, onnx.reference"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(!python_required(), "EDGEFREEZE_REQUIRE_PYTHON_ONNX=1 but python3 cannot import onnx");
        eprintln!("skipping the Python onnx check: python3 cannot import onnx (pip install onnx)");
    }
    ok
}

/// Runs `tests/python/<script>` with arguments; panics with its output when it fails.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let out = Command::new("python3")
        .arg(repo_root().join("tests/python").join(script))
        .args(args)
        .output()
        .expect("python3 runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed:\n{text}");
    text
}
