//! Models exported the way PyTorch's exporters do by default (`tools/export_defaults.py`
//! wrote `tests/fixtures/exported/`): one sample, no dynamic batch axis, and BatchNorm
//! folded into the convolutions. `train` takes them at any batch and says what the export
//! did; a batch a node keeps fixed is an error that says how to export, before anything
//! is written.

mod common;

use common::{edgefreeze, text, write_idx};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/exported").join(name)
}

/// One short epoch at batch 16 on 28×28 digits written on the spot.
fn train(model: &str, data: &str, out: &str) -> std::process::Output {
    let model = fixture(model);
    let args = [
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data,
        "--out",
        out,
        "--epochs",
        "1",
        "--batch",
        "16",
        "--lr",
        "0.05",
        "--limit",
        "40",
        "--test-limit",
        "20",
        "--threads",
        "1",
        "--engine",
        "tract",
    ];
    edgefreeze(&args)
}

#[test]
fn default_exports_train_at_any_batch_and_say_what_the_export_did() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("digits");
    write_idx(&images, 64, 32);
    let data = format!("idx:{}", images.display());
    // (fixture, the exporter its fold note names)
    for (model, exporter) in [("cnn.ts_default.onnx", "TorchScript"), ("cnn.dynamo_default.onnx", "dynamo")] {
        let out_dir = tmp.path().join(model);
        // 40 samples at batch 16: batches of 16, 16 and 8, and 20 test samples (16, 4).
        let out = train(model, &data, out_dir.to_str().unwrap());
        assert!(out.status.success(), "{model}: {}", text(&out));
        assert!(out_dir.join("checkpoints/epoch-0001.safetensors").is_file(), "{model}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("note: 2 convolutions hold a BatchNorm folded into them at export by"), "{model}: {err}");
        assert!(err.contains(exporter), "{model}: {err}");
        assert!(err.contains("the file fixes the batch at 1") && err.contains("made it variable"), "{model}: {err}");
    }
}

#[test]
fn a_batch_a_node_keeps_fixed_is_an_error_that_says_how_to_export_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("digits");
    write_idx(&images, 64, 32);
    let data = format!("idx:{}", images.display());
    let out_dir = tmp.path().join("run");
    let out = train("cls.dynamo_b1.onnx", &data, out_dir.to_str().unwrap());
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("note: the file fixes the batch at 1") && err.contains("\"node_cat\" (Concat)"), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("error: nothing written to {}: ", out_dir.display())), "{err}");
    assert!(last.contains("the model's input \"x\" has a fixed batch size of 1"), "{err}");
    assert!(last.contains("dynamic_shapes=({0: torch.export.Dim(\"batch\")},)"), "{err}");
    assert!(!out_dir.exists(), "the failed start left {}", out_dir.display());
}

#[test]
fn inspect_tells_the_export_notes_and_that_a_fixed_batch_blocks_training() {
    let cls = fixture("cls.dynamo_b1.onnx");
    let out = edgefreeze(&["inspect", cls.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["trainable"], false, "{report}");
    let blocked = report["training_blocked_by"].as_str().unwrap();
    assert!(blocked.contains("the file fixes the batch at 1") && blocked.contains("node_cat"), "{blocked}");
    assert_eq!(report["export_notes"].as_array().unwrap().len(), 1, "{report}");

    let folded = fixture("cnn.ts_default.onnx");
    let out = edgefreeze(&["inspect", folded.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("note: 2 convolutions hold a BatchNorm folded into them"), "{table}");
    assert!(table.contains("input  input.1 f32 batch×1×28×28"), "{table}");
    assert!(table.contains("training: yes"), "{table}");
}

/// The epoch line's losses and accuracies (`train loss … | test loss … acc …%`), without
/// the throughput.
fn epoch_numbers(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("epoch 1/1:")).unwrap_or_else(|| panic!("no epoch line: {err}"));
    line.split(" | ").take(2).collect::<Vec<_>>().join(" | ")
}

#[test]
fn a_channels_last_model_is_fed_channels_last_and_trains_as_its_channels_first_twin() {
    // The same weights taking [N, 28, 28, 1] (a Transpose in front) and [N, 1, 28, 28]:
    // train lays the batches out for each, and the two runs are the same arithmetic (a
    // Transpose is exact), so their losses and accuracies agree to the last digit printed.
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("digits");
    write_idx(&images, 64, 32);
    let data = format!("idx:{}", images.display());
    let first = train("cnn.dynamic.onnx", &data, tmp.path().join("nchw").to_str().unwrap());
    let last = train("cnn_nhwc.dynamic.onnx", &data, tmp.path().join("nhwc").to_str().unwrap());
    assert!(first.status.success() && last.status.success(), "{}\n{}", text(&first), text(&last));
    assert_eq!(epoch_numbers(&first), epoch_numbers(&last));

    // A Keras model converted by tf2onnx (tools/export_keras.py): channels last, its batch
    // axis named unk__<n>, BatchNorm folded by the converter (which marks nothing).
    let keras = train("keras_cnn.tf2onnx.onnx", &data, tmp.path().join("keras").to_str().unwrap());
    assert!(keras.status.success(), "{}", text(&keras));
    assert!(tmp.path().join("keras/checkpoints/epoch-0001.safetensors").is_file(), "{}", text(&keras));
}
