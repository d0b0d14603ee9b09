//! `edgefreeze inspect` as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models").join(name)
}

fn edgefreeze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgefreeze")).args(args).output().expect("the binary runs")
}

#[test]
fn table_lists_layers_cuts_and_totals() {
    let path = model("resnet20_28.onnx");
    let out = edgefreeze(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("12 layers, 11 cuts"), "{text}");
    assert!(text.contains("training: yes"), "{text}");
    assert!(text.contains("layer2.0") && text.contains("batch×32×14×14"), "{text}");
    assert!(text.contains("✂ 24.5 KiB"), "the cut after a 32×14×14 f32 block: {text}");
    assert!(text.lines().last().unwrap().starts_with("total: 272,186 parameters (1,568 buffer elements)"), "{text}");
}

#[test]
fn json_output_is_machine_readable() {
    let path = model("transformer_text.onnx");
    let out = edgefreeze(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["total_parameters"], 333_442);
    assert_eq!(json["trainable"], true);
    assert_eq!(json["layers"].as_array().unwrap().len(), 8);
    assert_eq!(json["cuts"].as_array().unwrap().len(), 7);
    assert_eq!(json["layers"][0]["name"], "tok_emb");
    assert_eq!(json["cuts"][0]["shape"], serde_json::json!(["batch", 64, 64]));
    assert_eq!(json["cuts"][0]["bytes_per_sample"], 64 * 64 * 4);
}

#[test]
fn bad_file_fails_with_a_message_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.onnx");
    std::fs::write(&path, b"\x0a\xff\xff\xff").unwrap();
    let out = edgefreeze(&["inspect", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("broken.onnx") && !err.contains("panicked"), "{err}");
}

#[test]
fn inspect_says_which_ops_block_training() {
    // Floor has a shape rule but no gradient: the model loads, and inspect says why
    // convert would fail before anyone runs it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floor.onnx");
    let mut m = edgefreeze_graph::import(model("mlp.onnx")).unwrap();
    let first = m.graph.nodes.iter().position(|n| n.op_type == "Gemm").unwrap();
    let input = m.graph.nodes[first].inputs[0].clone();
    m.graph.nodes.insert(first, edgefreeze_graph::Node::new("floor", "Floor", &[&input], &["floored"]));
    m.graph.nodes[first + 1].inputs[0] = "floored".into();
    let w = m.graph.nodes[first + 1].inputs[1].clone();
    m.graph.nodes.insert(first + 1, edgefreeze_graph::Node::new("floor_w", "Floor", &[&w], &["floored_w"]));
    m.graph.nodes[first + 2].inputs[1] = "floored_w".into();
    edgefreeze_graph::save_model(&m, &path, &Default::default()).unwrap();
    let out = edgefreeze(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("training: no") && text.contains("Floor") && text.contains("floor_w"), "{text}");
}

#[test]
fn json_lists_the_ops_that_block_training_with_the_tables_reason() {
    // A Floor (no gradient rule) on a weight's path to the loss: listed with its node and
    // the gradient table's reason.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("floor.onnx");
    let mut m = edgefreeze_graph::import(model("mlp.onnx")).unwrap();
    let first = m.graph.nodes.iter().position(|n| n.op_type == "Gemm").unwrap();
    let w = m.graph.nodes[first].inputs[1].clone();
    m.graph.nodes.insert(first, edgefreeze_graph::Node::new("floor_w", "Floor", &[&w], &["floored_w"]));
    m.graph.nodes[first + 1].inputs[1] = "floored_w".into();
    edgefreeze_graph::save_model(&m, &path, &Default::default()).unwrap();
    let out = edgefreeze(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["trainable"], false);
    let blocked = json["training_blocked_by_ops"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0]["op_type"], "Floor");
    assert_eq!(blocked[0]["nodes"], serde_json::json!(["floor_w"]));
    assert!(blocked[0]["reason"].as_str().unwrap().contains("step function"), "{blocked:?}");
}
