//! Run folders end to end on real Fashion-MNIST with tract: exact resume, stopping on a
//! non-finite loss with the last good checkpoint kept, export, metrics and plots.

mod common;

use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_train::checkpoint::{Checkpoint, checkpoint_path, list_checkpoints};
use edgefreeze_train::metrics::{Record, read_records};
use edgefreeze_train::{Schedule, TrainError, TrainOptions, Trainer};
use std::path::Path;

fn options() -> TrainOptions {
    TrainOptions { engine: EngineKind::Tract, ..TrainOptions::default() }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Records with their wall-clock fields zeroed: everything else must replay exactly.
fn without_timings(records: Vec<Record>) -> Vec<Record> {
    records
        .into_iter()
        .map(|mut r| {
            match &mut r {
                Record::Step { samples_per_s, .. } => *samples_per_s = 0.0,
                Record::Epoch { samples_per_s, train_seconds, cpu_seconds, .. } => {
                    *cpu_seconds = None;
                    *samples_per_s = 0.0;
                    *train_seconds = 0.0;
                }
            }
            r
        })
        .collect()
}

#[test]
fn an_interrupted_run_resumes_exactly() {
    if !common::fashion_mnist_available() {
        return;
    }
    let whole = tempfile::tempdir().unwrap();
    let mut recipe = common::recipe(3, 64, 0.05, 640, 200);
    recipe.augment = Some("crop:2,flip".into());
    common::create(whole.path(), "lenet5", &recipe);
    Trainer::open(whole.path(), options()).unwrap().run().unwrap();

    // The same run, killed during epoch 3: its epoch-3 checkpoint never got written and
    // metrics.jsonl holds some of epoch 3's step records.
    let interrupted = tempfile::tempdir().unwrap();
    copy_dir(whole.path(), interrupted.path());
    std::fs::remove_file(checkpoint_path(interrupted.path(), 3)).unwrap();
    let metrics = interrupted.path().join("metrics.jsonl");
    let records = read_records(&metrics).unwrap();
    let partial: String = records
        .iter()
        .filter(|r| r.epoch() < 3)
        .chain(records.iter().filter(|r| r.epoch() == 3).take(3))
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&metrics, partial).unwrap();

    let mut resumed = Trainer::open(interrupted.path(), options()).unwrap();
    assert_eq!(resumed.epochs_done(), 2);
    let summary = resumed.run().unwrap();
    assert_eq!(summary.epochs, 3);

    let a = Checkpoint::read(&checkpoint_path(whole.path(), 3)).unwrap();
    let b = Checkpoint::read(&checkpoint_path(interrupted.path(), 3)).unwrap();
    assert_eq!(a.info, b.info);
    assert_eq!(a.state.len(), b.state.len());
    for ((name, x), (_, y)) in a.state.iter().zip(&b.state) {
        assert_eq!(x, y, "{name} differs after resuming");
    }
    assert_eq!(
        without_timings(read_records(&metrics).unwrap()),
        without_timings(read_records(&whole.path().join("metrics.jsonl")).unwrap())
    );
}

#[test]
fn a_diverging_run_stops_and_keeps_its_last_good_checkpoint() {
    if !common::fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut recipe = common::recipe(3, 64, 0.01, 512, 128);
    // The rate grows a millionfold each epoch: epoch 1 trains, epoch 2 blows up.
    recipe.schedule = Schedule::parse("step:every=1,gamma=1e6", 0.01, 0).unwrap();
    common::create(dir.path(), "mlp", &recipe);
    let err = Trainer::open(dir.path(), options()).unwrap().run().unwrap_err();
    let good = checkpoint_path(dir.path(), 1);
    match &err {
        TrainError::Diverged { step, epoch, loss, checkpoint } => {
            assert_eq!(*epoch, 2, "{err}");
            assert!(*step > 8 && *step <= 16, "{err}");
            assert!(!loss.is_finite());
            assert_eq!(checkpoint.as_deref(), Some(good.as_path()));
        }
        other => panic!("expected divergence, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains("at step") && message.contains("epoch-0001.safetensors"), "{message}");
    let epochs: Vec<usize> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(e, _)| e).collect();
    assert_eq!(epochs, vec![0, 1]);
    let kept = Checkpoint::read(&good).unwrap();
    for (name, v) in &kept.state {
        if let Value::F32(a) = v {
            assert!(a.iter().all(|x| x.is_finite()), "{name} is not finite in the kept checkpoint");
        }
    }
}

/// Accuracy of an inference model on the test images a run with `test_limit` n and seed 7
/// evaluates, computed here.
fn accuracy_of(model: &Path, engine: &EngineKind, n: usize) -> f64 {
    let splits = edgefreeze_data::named::open("fashion-mnist").unwrap();
    let indices = edgefreeze_train::subset(splits.test.len(), Some(n), 7);
    let batch = splits.test.batch(&indices, None, 0, 0).unwrap();
    let input = Value::F32(
        ndarray::ArrayD::from_shape_vec(batch.shape.clone(), batch.inputs.as_f32().unwrap().to_vec()).unwrap(),
    );
    let bytes = std::fs::read(model).unwrap();
    let mut session = edgefreeze_engine::load(engine, &bytes, &EngineOptions::default()).unwrap();
    let logits = session.run(&[("input", &input)]).unwrap().remove(0);
    let logits = logits.as_f32().unwrap();
    let correct = (0..n)
        .filter(|&i| {
            let row = logits.index_axis(ndarray::Axis(0), i);
            let best = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
            best as i64 == batch.labels[i]
        })
        .count();
    correct as f64 / n as f64
}

#[test]
fn an_exported_model_scores_the_eval_accuracy_and_curves_are_plotted() {
    if !common::fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let test_samples = 500;
    common::create(dir.path(), "lenet5", &common::recipe(2, 64, 0.05, 2048, test_samples));
    let plot = dir.path().join("curves.png");
    let mut trainer = Trainer::open(dir.path(), TrainOptions { plot: Some(plot.clone()), ..options() }).unwrap();
    let summary = trainer.run().unwrap();
    let eval_accuracy = summary.test_accuracy.unwrap();
    assert!(eval_accuracy > 0.6, "2 short epochs should reach 60%, got {eval_accuracy}");

    let exported = dir.path().join("trained.onnx");
    let written = edgefreeze_train::export::export(&summary.checkpoint, &exported).unwrap();
    assert_eq!(written.epoch, 2);
    for engine in [EngineKind::Tract, EngineKind::Ort(edgefreeze_engine::Provider::Cpu)] {
        let accuracy = accuracy_of(&exported, &engine, test_samples);
        assert!(
            (accuracy - eval_accuracy).abs() < 0.5 / test_samples as f64,
            "{engine}: {accuracy} vs eval {eval_accuracy}"
        );
    }
    // The `onnx` package's full checker accepts it (when Python has onnx; CI requires it).
    let check = std::process::Command::new("python3")
        .args(["-c", "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)"])
        .arg(&exported)
        .output();
    match check {
        Ok(out) if out.status.success() => {}
        Ok(out) if String::from_utf8_lossy(&out.stderr).contains("No module named 'onnx'") => {
            assert!(std::env::var("EDGEFREEZE_REQUIRE_PYTHON_ONNX").as_deref() != Ok("1"), "python3 has no onnx");
            eprintln!("skipping the onnx checker: python3 has no onnx");
        }
        Ok(out) => panic!("onnx.checker rejects the exported model: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => assert!(std::env::var("EDGEFREEZE_REQUIRE_PYTHON_ONNX").as_deref() != Ok("1"), "no python3: {e}"),
    }
    // The exported weights are the trained ones, not the initial ones.
    let initial = accuracy_of(&dir.path().join("graphs/model.onnx"), &EngineKind::Tract, test_samples);
    assert!(initial < 0.3, "the untrained model scores {initial}");

    let records = read_records(&dir.path().join("metrics.jsonl")).unwrap();
    let epochs: Vec<&Record> = records.iter().filter(|r| matches!(r, Record::Epoch { .. })).collect();
    assert_eq!(epochs.len(), 2);
    assert_eq!(records.len(), 2 + 2 * 2048 / 64);
    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "a plot with curves and text is more than {} bytes", png.len());
}

#[test]
fn a_finished_run_refuses_to_be_overwritten_and_bad_checkpoints_are_named() {
    if !common::fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = common::recipe(1, 64, 0.05, 128, 64);
    common::create(dir.path(), "mlp", &recipe);
    let source = edgefreeze_train::ModelSource::Onnx {
        path: common::model("mlp"),
        loss: "cross-entropy".into(),
        optimizer: "sgd".into(),
        freeze: 0,
    };
    // Before its first checkpoint a run is not protected: it failed to start.
    edgefreeze_train::create_run(dir.path(), &source, "fashion-mnist", &recipe).unwrap();
    Trainer::open(dir.path(), options()).unwrap().run().unwrap();
    let err = edgefreeze_train::create_run(dir.path(), &source, "fashion-mnist", &recipe).unwrap_err().to_string();
    assert!(err.contains("already holds a run") && err.contains("--resume"), "{err}");

    let damaged = checkpoint_path(dir.path(), 1);
    std::fs::write(&damaged, b"not a checkpoint").unwrap();
    let err = Trainer::open(dir.path(), options()).err().unwrap().to_string();
    assert!(err.contains("epoch-0001.safetensors"), "{err}");
}

#[test]
fn the_transformer_trains_on_spam_assassin_emails() {
    let splits = match edgefreeze_data::named::open("spam-assassin") {
        Ok(s) => s,
        Err(e) => {
            assert!(
                !std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0"),
                "EDGEFREEZE_REQUIRE_DATA is set: {e}"
            );
            eprintln!("skipping: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let source = edgefreeze_train::ModelSource::Onnx {
        path: common::model("transformer_text"),
        loss: "cross-entropy".into(),
        optimizer: "sgd:momentum=0.9,wd=5e-4".into(),
        freeze: 0,
    };
    let recipe = common::recipe(2, 32, 0.05, 1024, 400);
    edgefreeze_train::create_run(dir.path(), &source, "spam-assassin", &recipe).unwrap();
    let mut trainer = Trainer::open(dir.path(), options()).unwrap();
    // Sequence length and vocabulary come from the model: 64 tokens, 4096 words.
    assert_eq!(splits.train.sample_shape(), vec![64]);
    assert_eq!(trainer.data().vocabulary.as_ref().unwrap().len(), 4096);
    let summary = trainer.run().unwrap();
    let records = read_records(&dir.path().join("metrics.jsonl")).unwrap();
    let losses: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Epoch { train_loss, .. } => Some(*train_loss),
            _ => None,
        })
        .collect();
    assert!(losses[1] < losses[0], "the training loss did not fall: {losses:?}");
    // Better than always answering "ham" (about 69% of the held-out emails).
    assert!(summary.test_accuracy.unwrap() > 0.72, "{:?}", summary.test_accuracy);
}
