//! LeNet-5 reaches at least 89% test accuracy on Fashion-MNIST in 5 epochs, with the
//! recipe `tools/train_pytorch.py` runs in PyTorch (docs/results.md has both).
//! A few minutes on 2 cores with ONNX Runtime.

mod common;

use edgefreeze_engine::{EngineKind, Provider};
use edgefreeze_train::{Recipe, Schedule, TrainOptions, Trainer};

#[test]
fn lenet5_reaches_89_percent_on_fashion_mnist_in_5_epochs() {
    if !common::fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = Recipe {
        epochs: 5,
        batch: 64,
        schedule: Schedule::parse("cosine", 0.05, 0).unwrap(),
        seed: 0,
        augment: None,
        train_limit: None,
        test_limit: None,
        log_every: 100,
    };
    common::create(dir.path(), "lenet5", &recipe);
    let options = TrainOptions { engine: EngineKind::Ort(Provider::Cpu), ..TrainOptions::default() };
    let summary = Trainer::open(dir.path(), options).unwrap().run().unwrap();
    let accuracy = summary.test_accuracy.unwrap();
    eprintln!("LeNet-5, 5 epochs on Fashion-MNIST: {:.2}% test accuracy", 100.0 * accuracy);
    assert_eq!(summary.epochs, 5);
    assert!(accuracy >= 0.89, "test accuracy {:.2}% is under 89%", 100.0 * accuracy);
}
