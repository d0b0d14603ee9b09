//! Every bundled model, exported by PyTorch, against what PyTorch recorded about it:
//! parameter counts exactly, the layer units a person expects (a residual block is one
//! unit, cuts fall between blocks), output shapes, and lossless save/load round trips.

use edgefreeze_graph::ir::Dim;
use edgefreeze_graph::{Model, SaveOptions, analyse, import, load_model, save_model};
use edgefreeze_tests::{python_onnx, run_python, sidecars};
use serde_json::Value;

fn per_sample(shape: &[Dim]) -> Vec<Value> {
    // Drop the batch dimension (symbolic, or a fixed 1 for batch-free constants).
    let rest = match shape.first() {
        Some(Dim::Symbol(_)) | Some(Dim::Fixed(1)) => &shape[1..],
        _ => shape,
    };
    rest.iter().map(|d| d.fixed().map_or(Value::Null, |n| Value::from(n as u64))).collect()
}

#[test]
fn parameter_counts_match_pytorch_exactly() {
    for s in sidecars() {
        let model = import(&s.path).unwrap();
        let a = analyse(&model).unwrap();
        assert_eq!(a.total_parameters as u64, s.json["parameters"].as_u64().unwrap(), "{}", s.path.display());
        assert_eq!(a.total_buffers as u64, s.json["buffers"].as_u64().unwrap(), "{}", s.path.display());
    }
}

#[test]
fn layers_are_the_units_a_person_expects() {
    for s in sidecars() {
        let name = s.path.display().to_string();
        let model = import(&s.path).unwrap();
        let a = analyse(&model).unwrap();
        let units = s.json["units"].as_array().unwrap();
        let ours: Vec<&str> = a.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(a.layers.len(), units.len(), "{name}: layers {ours:?}");
        let inference = edgefreeze_graph::infer::infer(&model.graph, model.opset()).unwrap();
        for (layer, unit) in a.layers.iter().zip(units) {
            let unit_name = unit["name"].as_str().unwrap();
            assert!(layer.name.starts_with(unit_name), "{name}: layer {} is not unit {unit_name}", layer.name);
            assert_eq!(layer.parameters as u64, unit["parameters"].as_u64().unwrap(), "{name}: {unit_name}");
            // The unit's own output is a value of the layer (parameter-free ops may follow it).
            let produced: Vec<Vec<Value>> = layer
                .nodes
                .iter()
                .flat_map(|&i| model.graph.nodes[i].outputs.iter())
                .filter_map(|o| inference.types.get(o).and_then(|v| v.shape.clone()))
                .map(|s| per_sample(&s))
                .collect();
            let expected = unit["output_shape"].as_array().unwrap();
            assert!(produced.iter().any(|p| p == expected), "{name}: {unit_name} never produces {expected:?}");
        }
        // The last layer ends at the graph output, with the shape PyTorch saw.
        let out: Vec<Value> = s.json["output"]["shape"].as_array().unwrap()[1..].to_vec();
        assert_eq!(per_sample(&a.layers.last().unwrap().output_shape), out, "{name}");
    }
}

#[test]
fn residual_networks_cut_between_blocks_not_inside() {
    for s in sidecars() {
        let model = import(&s.path).unwrap();
        let a = analyse(&model).unwrap();
        let units = s.json["units"].as_array().unwrap();
        for cut in &a.cuts {
            // A cut lies between two whole units, so never inside a residual block.
            assert!(cut.after_layer + 1 < units.len());
            assert!(cut.bytes_per_sample > 0 && cut.bytes_per_sample % 4 == 0, "{}: f32 activations", s.path.display());
            assert_eq!(cut.flops_before + cut.flops_after, a.total_flops);
        }
        assert_eq!(a.cuts.len(), a.layers.len() - 1);
    }
    // ResNet-20: stem conv, stem BN, nine blocks, classifier.
    let resnet = import(edgefreeze_tests::models_dir().join("resnet20_32.onnx")).unwrap();
    let a = analyse(&resnet).unwrap();
    let names: Vec<&str> = a.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "conv1", "bn1", "layer1.0", "layer1.1", "layer1.2", "layer2.0", "layer2.1", "layer2.2", "layer3.0",
            "layer3.1", "layer3.2", "fc"
        ]
    );
    let block_cut = &a.cuts[5];
    assert_eq!(block_cut.bytes_per_sample, 32 * 16 * 16 * 4, "after layer2.0: 32×16×16 f32");
}

fn round_trip(model: &Model, options: &SaveOptions) -> Model {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    save_model(model, &path, options).unwrap();
    load_model(&path).unwrap()
}

#[test]
fn load_save_load_is_lossless() {
    for s in sidecars() {
        let model = import(&s.path).unwrap();
        assert_eq!(round_trip(&model, &SaveOptions::default()), model, "{}", s.path.display());
        let external = SaveOptions { external_data_threshold: Some(1024) };
        assert_eq!(round_trip(&model, &external), model, "{} via external data", s.path.display());
    }
}

#[test]
fn external_data_models_load_like_inline_ones() {
    let dir = edgefreeze_tests::models_dir();
    let inline = import(dir.join("mlp.onnx")).unwrap();
    let external = import(dir.join("mlp_external.onnx")).unwrap();
    assert_eq!(inline.graph.initializers, external.graph.initializers);
}

#[test]
fn saved_models_pass_the_onnx_checker() {
    if !python_onnx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    // With the zoo: dynamo writes Constants whose `value_int` is 0, which the protobuf
    // encoding drops unless they are saved as tensors.
    for file in edgefreeze_tests::bundled_and_zoo_files() {
        let model = import(&file).unwrap();
        let path = dir.path().join(file.file_name().unwrap());
        save_model(&model, &path, &SaveOptions::default()).unwrap();
        paths.push(path);
    }
    let refs: Vec<&std::path::Path> = paths.iter().map(|p| p.as_path()).collect();
    let out = run_python("check_model.py", &refs);
    assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), paths.len(), "{out}");
}
