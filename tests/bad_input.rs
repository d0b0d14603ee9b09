//! Bad input gives a clear error that names the file and the node, never a panic.

use edgefreeze_graph::ir::{Dim, Node, ValueInfo};
use edgefreeze_graph::{DataType, GraphError, Model, import, prepare, save_model};
use edgefreeze_tests::models_dir;
use std::path::Path;

fn import_error(path: &Path) -> String {
    let err = import(path).expect_err("import must fail");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "the error names the file: {text}");
    text
}

#[test]
fn truncated_model_is_a_decoding_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(models_dir().join("lenet5.onnx")).unwrap();
    for cut in [bytes.len() / 2, 100, 7] {
        let path = dir.path().join(format!("truncated_{cut}.onnx"));
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let text = import_error(&path);
        assert!(text.contains("truncated or not ONNX") || text.contains("invalid model"), "{text}");
    }
}

#[test]
fn non_onnx_file_is_rejected_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.onnx");
    std::fs::write(&path, "this is a text file, not a protobuf\n").unwrap();
    import_error(&path);
    let empty = dir.path().join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    assert!(import_error(&empty).contains("no graph"));
}

#[test]
fn missing_file_says_it_cannot_be_read() {
    let text = import(Path::new("/nonexistent/model.onnx")).unwrap_err().to_string();
    assert!(text.contains("cannot read /nonexistent/model.onnx"), "{text}");
}

#[test]
fn missing_external_data_names_the_data_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp_external.onnx");
    std::fs::copy(models_dir().join("mlp_external.onnx"), &path).unwrap();
    let text = import_error(&path);
    assert!(text.contains("mlp_external.onnx.data") && text.contains("tensor"), "{text}");
    // A data file too short for its tensors is reported too.
    std::fs::write(dir.path().join("mlp_external.onnx.data"), [0u8; 100]).unwrap();
    let text = import_error(&path);
    assert!(text.contains("the file has 100"), "{text}");
}

fn tiny(nodes: Vec<Node>, input_shape: Option<Vec<Dim>>) -> Model {
    Model {
        ir_version: 8,
        opset_imports: vec![(String::new(), 17)],
        graph: edgefreeze_graph::Graph {
            nodes,
            inputs: vec![ValueInfo {
                name: "x".into(),
                dtype: Some(DataType::Float32),
                shape: input_shape,
                doc_string: String::new(),
            }],
            outputs: vec![ValueInfo { name: "y".into(), dtype: None, shape: None, doc_string: String::new() }],
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn every_unsupported_op_is_listed_at_once_with_its_nodes() {
    let mut custom = Node::new("fused", "FusedConv", &["b"], &["c"]);
    custom.domain = "com.microsoft".into();
    let model = tiny(
        vec![
            Node::new("loop_a", "Loop", &["x"], &["a"]),
            Node::new("ok", "Relu", &["a"], &["b"]),
            custom,
            Node::new("loop_b", "Loop", &["c"], &["y"]),
        ],
        Some(vec![Dim::Fixed(2)]),
    );
    let err = prepare(model).unwrap_err();
    let GraphError::UnsupportedOps(ops) = &err else { panic!("{err}") };
    assert_eq!(ops.len(), 2);
    let text = err.to_string();
    for expected in ["Loop (nodes: loop_a, loop_b)", "com.microsoft::FusedConv (nodes: fused)"] {
        assert!(text.contains(expected), "{text}");
    }
}

#[test]
fn unsupported_op_in_a_file_names_file_and_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.onnx");
    let model = tiny(vec![Node::new("mystery", "NonMaxSuppression", &["x"], &["y"])], Some(vec![Dim::Fixed(2)]));
    save_model(&model, &path, &Default::default()).unwrap();
    let text = import_error(&path);
    assert!(text.contains("NonMaxSuppression (nodes: mystery)"), "{text}");
}

#[test]
fn graph_input_without_a_shape_names_the_node_that_needs_it() {
    let mut model = tiny(vec![Node::new("stem", "Conv", &["x", "w"], &["y"])], None);
    model.graph.initializers.insert("w".into(), edgefreeze_graph::Tensor::from_f32(vec![1, 1, 1, 1], &[1.0]).unwrap());
    let text = prepare(model).unwrap_err().to_string();
    assert!(text.contains("\"stem\"") && text.contains("no known shape") && text.contains("\"x\""), "{text}");
}

#[test]
fn unsupported_opset_is_rejected() {
    let mut model = tiny(vec![Node::new("r", "Relu", &["x"], &["y"])], Some(vec![Dim::Fixed(2)]));
    model.opset_imports = vec![(String::new(), 8)];
    let text = prepare(model).unwrap_err().to_string();
    assert!(text.contains("version 8") && text.contains("9 to 21"), "{text}");
}

#[test]
fn wrong_input_count_names_the_node() {
    let model = tiny(vec![Node::new("two_in", "Relu", &["x", "x"], &["y"])], Some(vec![Dim::Fixed(2)]));
    let text = prepare(model).unwrap_err().to_string();
    assert!(text.contains("\"two_in\"") && text.contains("takes 1 inputs, got 2"), "{text}");
}

#[test]
fn external_data_outside_the_model_folder_is_refused() {
    use prost::Message;
    use tract_onnx::pb;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("escape.onnx");
    let bytes = std::fs::read(models_dir().join("mlp_external.onnx")).unwrap();
    let mut proto = pb::ModelProto::decode(bytes.as_slice()).unwrap();
    for t in &mut proto.graph.as_mut().unwrap().initializer {
        for e in &mut t.external_data {
            if e.key == "location" {
                e.value = "../../etc/passwd".into();
            }
        }
    }
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let text = import_error(&path);
    assert!(text.contains("relative path inside the model's folder"), "{text}");
}
