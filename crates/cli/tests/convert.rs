//! `edgefreeze convert` as a user runs it.

use std::path::PathBuf;
use std::process::Command;

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)
}

fn convert(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_edgefreeze")).arg("convert").args(args).output().unwrap()
}

#[test]
fn writes_graphs_state_and_manifest_with_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lenet");
    let path = model("lenet5.onnx");
    let result = convert(&[
        path.to_str().unwrap(),
        "--loss",
        "cross-entropy",
        "--optimizer",
        "sgd:lr=0.1,momentum=0.9,wd=5e-4",
        "--freeze",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(stdout.contains("forward: 12 nodes") && stdout.contains("ops in train_step.onnx"), "{stdout}");
    assert!(String::from_utf8_lossy(&result.stderr).contains("[3/3] writing"));
    for file in ["train_step.onnx", "eval.onnx", "grad.onnx", "state.safetensors", "manifest.json"] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["frozen_layers"], 2);
    assert_eq!(manifest["learning_rate"], 0.1);
    let roles: Vec<(&str, &str)> = manifest["state"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["role"].as_str().unwrap()))
        .collect();
    assert!(roles.contains(&("conv1.weight", "frozen")) && roles.contains(&("conv2.bias", "frozen")));
    assert!(roles.contains(&("fc1.weight", "parameter")) && roles.contains(&("momentum.fc1.weight", "optimizer")));
    let inputs: Vec<&str> =
        manifest["train_step"]["inputs"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(!inputs.contains(&"conv1.weight") && inputs.contains(&"fc1.weight") && inputs.contains(&"lr"));
    // The frozen front gets no backward at all: no convolution gradients are built.
    let ops: Vec<&str> =
        manifest["train_step"]["ops"].as_array().unwrap().iter().map(|o| o[0].as_str().unwrap()).collect();
    assert!(!ops.contains(&"ConvTranspose") && !ops.contains(&"Slice"), "{ops:?}");
    let state = std::fs::read(out.join("state.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&state).unwrap();
    assert_eq!(tensors.tensor("fc1.weight").unwrap().shape(), &[120, 400]);
}

#[test]
fn bad_options_fail_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = model("lenet5.onnx");
    let out = dir.path().join("x");
    for (args, expected) in [
        (vec!["--optimizer", "rmsprop"], "unknown optimizer \"rmsprop\""),
        (vec!["--loss", "hinge"], "unknown loss \"hinge\""),
        (vec!["--freeze", "9"], "cannot freeze 9 layers: the model has 5"),
    ] {
        let mut all = vec![path.to_str().unwrap(), "--out", out.to_str().unwrap()];
        all.extend(args);
        let result = convert(&all);
        assert!(!result.status.success());
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(stderr.contains(expected) && !stderr.contains("panicked"), "{stderr}");
    }
}
