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
    let ports = |kind: &str| -> Vec<String> {
        manifest["train_step"][kind]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (inputs, outputs) = (ports("inputs"), ports("outputs"));
    // Frozen parameters are read from the state (an input), never updated.
    assert!(inputs.iter().any(|i| i == "conv1.weight") && inputs.iter().any(|i| i == "fc1.weight"), "{inputs:?}");
    assert!(!outputs.iter().any(|o| o == "updated.conv1.weight") && outputs.iter().any(|o| o == "updated.fc1.weight"));
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

#[test]
fn cache_and_split_sets_are_written_and_inspect_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("resnet");
    let path = model("resnet20_28.onnx");
    let args =
        [path.to_str().unwrap(), "--freeze", "4", "--cache-at", "3", "--split-at", "3", "--out", out.to_str().unwrap()];
    let result = convert(&args);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(stdout.contains("cache at cut 3") && stdout.contains("split at cut 3"), "{stdout}");
    for file in [
        "prefix.onnx",
        "suffix_step.onnx",
        "cache.json",
        "device_forward.onnx",
        "edge_step.onnx",
        "edge_apply.onnx",
        "split.json",
        "split_state.safetensors",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    // --freeze 4 = the device's layers: the freeze-aware split, with no device backward.
    assert!(!out.join("device_backward.onnx").exists() && !out.join("device_apply.onnx").exists());
    let split: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("split.json")).unwrap()).unwrap();
    assert_eq!(split["options"]["frozen_device_layers"], true);
    assert_eq!(split["bytes_per_sample_down"], 0);
    let inspect =
        Command::new(env!("CARGO_BIN_EXE_edgefreeze")).args(["inspect", out.to_str().unwrap()]).output().unwrap();
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
    let text = String::from_utf8_lossy(&inspect.stdout);
    assert!(text.contains("9 graphs"), "{text}");
    for file in ["train_step.onnx", "prefix.onnx", "suffix_step.onnx", "edge_step.onnx", "device_forward.onnx"] {
        assert!(text.contains(file), "{file}: {text}");
    }
    assert!(text.lines().any(|l| l.starts_with("prefix.onnx") && l.contains("out: activation")), "{text}");
    // Under each training graph: what its backward keeps from the forward pass.
    let lines: Vec<&str> = text.lines().collect();
    let kept = |file: &str| {
        let at = lines.iter().position(|l| l.starts_with(file)).unwrap_or_else(|| panic!("{file}: {text}"));
        lines.get(at + 1).is_some_and(|l| l.contains("forward values for the backward"))
    };
    assert!(kept("train_step.onnx") && kept("suffix_step.onnx"), "{text}");
    assert!(!kept("prefix.onnx") && !kept("device_forward.onnx") && !kept("eval.onnx"), "{text}");
}

#[test]
fn split_with_recompute_writes_the_device_backward() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lenet");
    let path = model("lenet5.onnx");
    let result = convert(&[path.to_str().unwrap(), "--split-at", "1", "--recompute", "--out", out.to_str().unwrap()]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let split: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("split.json")).unwrap()).unwrap();
    assert_eq!(split["options"]["recompute"], true);
    assert_eq!(split["stash"].as_array().unwrap().len(), 0);
    assert!(out.join("device_backward.onnx").is_file() && out.join("device_apply.onnx").is_file());
}

#[test]
fn invalid_cuts_fail_with_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = model("lenet5.onnx");
    let out = dir.path().join("x");
    for flag in ["--cache-at", "--split-at"] {
        let result = convert(&[path.to_str().unwrap(), flag, "17", "--out", out.to_str().unwrap()]);
        assert!(!result.status.success());
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(stderr.contains("17 is not a valid cut: the valid cuts (after layer) are 0, 1, 2, 3"), "{stderr}");
    }
    let result = convert(&[path.to_str().unwrap(), "--split-at", "1", "--freeze", "1", "--out", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success() && stderr.contains("--split-at 1 with --freeze 1"), "{stderr}");
}
