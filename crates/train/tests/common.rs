//! Shared by the training tests: run folders on the bundled models and real data.

#![allow(dead_code)]

use edgefreeze_engine::Value;
use edgefreeze_train::{ModelSource, Recipe, Schedule, create_run};
use std::path::{Path, PathBuf};

/// A bundled model.
pub fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(format!("{name}.onnx"))
}

/// Whether Fashion-MNIST is installed; when it is not, the test skips with a message
/// unless EDGEFREEZE_REQUIRE_DATA is set, which makes it fail.
pub fn fashion_mnist_available() -> bool {
    if Path::new("/usr/share/datasets/fashion-mnist").is_dir() {
        return true;
    }
    let required = std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "EDGEFREEZE_REQUIRE_DATA is set but Fashion-MNIST is missing: apt-get install -y dataset-fashion-mnist"
    );
    eprintln!("skipping: Fashion-MNIST is missing (apt-get install -y dataset-fashion-mnist)");
    false
}

/// A recipe: SGD-momentum with a cosine schedule, no augmentation, a step record per update.
pub fn recipe(epochs: usize, batch: usize, lr: f64, train_limit: usize, test_limit: usize) -> Recipe {
    Recipe {
        epochs,
        batch,
        schedule: Schedule::parse("cosine", lr, 0).unwrap(),
        seed: 7,
        augment: None,
        train_limit: Some(train_limit),
        test_limit: Some(test_limit),
        log_every: 1,
    }
}

/// Creates a run of a bundled model on Fashion-MNIST in `dir`.
pub fn create(dir: &Path, model_name: &str, recipe: &Recipe) {
    let source = ModelSource::Onnx {
        path: model(model_name),
        loss: "cross-entropy".into(),
        optimizer: "sgd:momentum=0.9,wd=5e-4".into(),
        freeze: 0,
    };
    create_run(dir, &source, "fashion-mnist", recipe).unwrap();
}

/// The relative L2 distance of `a` from `b` (float32), or 0/1 for equal/unequal int64
/// tensors.
pub fn relative_l2(a: &Value, b: &Value) -> f64 {
    match (a, b) {
        (Value::F32(a), Value::F32(b)) => {
            let diff: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
            let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
            (diff / norm.max(1e-30)).sqrt()
        }
        (Value::I64(a), Value::I64(b)) => f64::from(u8::from(a != b)),
        _ => panic!("type mismatch"),
    }
}
