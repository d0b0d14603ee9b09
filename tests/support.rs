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

/// Every zoo fixture (`tests/fixtures/zoo`): models a user brings, exported from
/// torchvision and PyTorch modules by TorchScript and by dynamo.
pub fn zoo_files() -> Vec<PathBuf> {
    let zoo = repo_root().join("tests/fixtures/zoo");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&zoo)
        .expect("tests/fixtures/zoo exists")
        .map(|e| e.expect("readable zoo entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "expected the zoo fixtures in {}, found {}", zoo.display(), files.len());
    files
}

/// The bundled models with a sidecar, then every zoo fixture.
pub fn bundled_and_zoo_files() -> Vec<PathBuf> {
    sidecars().into_iter().map(|s| s.path).chain(zoo_files()).collect()
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

/// A fixture's tensors by name: dimensions, values as f64, and whether they are integers
/// (labels, token ids); float32 and int64 are the only element types fixtures hold.
pub type FixtureTensors = std::collections::HashMap<String, (Vec<usize>, Vec<f64>, bool)>;

/// Reads fixture `<dir>/<name>.json` and `<dir>/<name>.safetensors` (the PyTorch golden
/// and zoo fixtures share this layout).
pub fn read_fixture(dir: &Path, name: &str) -> (serde_json::Value, FixtureTensors) {
    let json = serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = FixtureTensors::new();
    for (key, view) in st.tensors() {
        let data = view.data();
        let (values, int) = match view.dtype() {
            safetensors::Dtype::F32 => {
                (data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(), false)
            }
            safetensors::Dtype::I64 => {
                (data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(), true)
            }
            other => panic!("{name}: unexpected dtype {other:?} for {key}"),
        };
        tensors.insert(key, (view.shape().to_vec(), values, int));
    }
    (json, tensors)
}

/// The tolerance rule of the PyTorch comparisons (see `tests/pytorch_golden.rs` and
/// docs/training-graphs.md, Proof): a tensor of ours passes when its L2 error against the
/// float64 reference is within [`tolerance::TORCH_MULTIPLE`] times PyTorch's own float32
/// error on it, or when every element is within [`tolerance::FLOOR_ULPS`] float32 ulps of
/// the scale its round-off is relative to (the model's largest gradient element for a
/// gradient, the tensor's own largest element for a stored value such as a loss).
pub mod tolerance {
    /// Machine epsilon of float32 (2⁻²³): one ulp of 1.0.
    pub const EPS32: f64 = f32::EPSILON as f64;

    /// C: how many times PyTorch's own float32 error (per tensor, L2) ours may be.
    ///
    /// Ours and PyTorch's are two float32 evaluations of the same function; neither is
    /// exact and the float64 run is the truth. Their errors are the round-off each injects,
    /// propagated by the same Jacobians, so the conditioning of the model and the batch —
    /// which makes the error of a deep ResNet 100× that of an MLP — cancels out of the ratio;
    /// what is left is how much round-off each implementation injects per op. That differs
    /// by (a) the order of the long reductions: a convolution weight gradient sums
    /// N·H·W = 16384 products (ResNet-20, batch 16); a sequential sum's typical round-off
    /// grows like √K, a blocked one like √(block), a factor up to ~√(16384/256) = 8 between
    /// two such kernels; and (b) fused against composed ops: PyTorch's BatchNorm,
    /// log-softmax, cross-entropy and AdamW are single kernels computing in float64 where
    /// it matters (AdamW's bias corrections), ours are several standard ONNX ops in float32,
    /// each rounding its intermediate: a factor of about 2. 16 = 8 × 2. Measured worst
    /// ratios (printed by each test, recorded in tests/fixtures/golden/README.md) are
    /// 1.0–5.1 per model. (They were up to 10.7 while ours computed AdamW's bias correction
    /// `1 − β₂ᵗ` from float32 β₂ = 0.99900001, a systematic error of 6.5·10⁻⁶ per step on top
    /// of round-off; it now computes the corrections in float64, as PyTorch does.) A real bug is not a factor of a few on round-off: the regression checks
    /// below show a 10⁻³ change of one gradient is rejected.
    pub const TORCH_MULTIPLE: f64 = 16.0;

    /// K: the absolute floor, in float32 ulps of the tensor's scale (see [`verdict`]).
    ///
    /// Where PyTorch's own error is no guide — a gradient that is zero in exact arithmetic
    /// (a bias before a training-mode BatchNorm) or cancels far below its terms, where
    /// PyTorch's round-off may by chance be much smaller than ours, or a scalar, whose
    /// error is one sample — any float32 result is round-off of the terms summed into it.
    /// For a gradient those terms are of the size of the model's gradients, not of the
    /// tensor's own (≈ 0) value, so the scale is the largest gradient element of the model;
    /// for a stored value (a loss, running statistic or parameter) it is the tensor's own
    /// largest element. 16 ulps of it per element is what a handful of roundings of
    /// partial sums of that size add up to; an error above it is not round-off.
    pub const FLOOR_ULPS: f64 = 16.0;

    /// The comparison of one tensor of ours with the float64 reference.
    #[derive(Debug, Clone, Copy)]
    pub struct Verdict {
        /// ‖ours − reference‖₂.
        pub l2: f64,
        /// max |ours − reference|.
        pub max_abs: f64,
        /// ‖PyTorch float32 − reference‖₂.
        pub torch: f64,
        /// FLOOR_ULPS · ε · scale: the per-element absolute floor.
        pub floor: f64,
        /// ‖reference‖₂, for messages.
        pub norm: f64,
    }

    impl Verdict {
        /// The rule: ours is within C × PyTorch's float32 error (L2 over the tensor), or every
        /// element is within the absolute floor.
        pub fn passes(&self) -> bool {
            self.l2 <= TORCH_MULTIPLE * self.torch || self.max_abs <= self.floor
        }

        /// Whether the floor rather than PyTorch's error admitted it.
        pub fn by_floor(&self) -> bool {
            self.l2 > TORCH_MULTIPLE * self.torch && self.max_abs <= self.floor
        }

        pub fn ratio(&self) -> f64 {
            if self.l2 == 0.0 { 0.0 } else { self.l2 / self.torch }
        }

        pub fn explain(&self, what: &str) -> String {
            format!(
                "{what}: ‖ours − float64‖₂ = {:.3e} (relative {:.3e}) is {:.1}× PyTorch's own float32 error {:.3e} \
                 (allowed {TORCH_MULTIPLE}×), and max |ours − float64| = {:.3e} is above the floor {:.3e} \
                 ({FLOOR_ULPS} float32 ulps of the tensor's scale)",
                self.l2,
                self.l2 / self.norm.max(f64::MIN_POSITIVE),
                self.ratio(),
                self.torch,
                self.max_abs,
                self.floor,
            )
        }
    }

    /// Compares `ours` with the float64 `expected` given PyTorch's own float32 error
    /// `torch` on the same tensor and the `scale` of the values it is made of (the largest
    /// reference element of the tensor for stored values — losses, running statistics,
    /// parameters; the largest gradient element of the model for a gradient).
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
