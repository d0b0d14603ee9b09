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

/// The tolerance rule of the PyTorch comparisons (see `tests/pytorch_golden.rs` and
/// docs/training-graphs.md, Proof): a tensor of ours passes when its L2 error against the
/// float64 reference is within [`tolerance::TORCH_MULTIPLE`] times PyTorch's own float32
/// error on it, or when every element is within [`tolerance::FLOOR_ULPS`] float32 ulps of
/// the scale its round-off is relative to (the model's largest gradient element for a
/// gradient, the tensor's own largest element for a stored value such as a loss).
pub mod tolerance {
    /// Machine epsilon of float32 (2⁻²³).
    pub const EPS32: f64 = f32::EPSILON as f64;
    /// How many times PyTorch's own float32 error ours may be (the derivation is beside
    /// the same constant in tests/pytorch_golden.rs).
    pub const TORCH_MULTIPLE: f64 = 16.0;
    /// The absolute floor per element, in float32 ulps of the tensor's scale.
    pub const FLOOR_ULPS: f64 = 16.0;

    /// One tensor of ours against the float64 reference.
    #[derive(Debug, Clone, Copy)]
    pub struct Verdict {
        /// ‖ours − reference‖₂.
        pub l2: f64,
        /// max |ours − reference|.
        pub max_abs: f64,
        /// ‖PyTorch float32 − reference‖₂.
        pub torch: f64,
        /// The per-element absolute floor.
        pub floor: f64,
        /// ‖reference‖₂.
        pub norm: f64,
    }

    impl Verdict {
        /// Within C × PyTorch's error, or every element within the floor.
        pub fn passes(&self) -> bool {
            self.l2 <= TORCH_MULTIPLE * self.torch || self.max_abs <= self.floor
        }

        /// What failed, with the numbers.
        pub fn explain(&self, what: &str) -> String {
            format!(
                "{what}: ‖ours − float64‖₂ = {:.3e} (relative {:.3e}) is {:.1}× PyTorch's own float32 error {:.3e} \
                 (allowed {TORCH_MULTIPLE}×), and max |ours − float64| = {:.3e} is above the floor {:.3e}",
                self.l2,
                self.l2 / self.norm.max(f64::MIN_POSITIVE),
                self.l2 / self.torch.max(f64::MIN_POSITIVE),
                self.torch,
                self.max_abs,
                self.floor,
            )
        }
    }

    /// Compares `ours` with `expected` given PyTorch's float32 L2 error `torch` on the
    /// same tensor and the `scale` of the values its round-off is relative to.
    pub fn verdict(ours: &[f64], expected: &[f64], torch: f64, scale: f64) -> Verdict {
        assert_eq!(ours.len(), expected.len());
        let (mut sq, mut max_abs, mut norm) = (0.0f64, 0.0f64, 0.0f64);
        for (a, b) in ours.iter().zip(expected) {
            let d = a - b;
            sq += d * d;
            max_abs = max_abs.max(d.abs());
            norm += b * b;
        }
        Verdict { l2: sq.sqrt(), max_abs, torch, floor: FLOOR_ULPS * EPS32 * scale, norm: norm.sqrt() }
    }
}
