//! Asking ONNX Runtime for a provider it cannot give is an error, never a CPU fallback.

use edgefreeze_engine::{EngineError, EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, save::encode_model};

fn relu() -> Vec<u8> {
    let graph = Graph {
        name: "relu".into(),
        nodes: vec![Node::new("relu", "Relu", &["x"], &["y"])],
        inputs: vec![ValueInfo::new("x", DataType::Float32, vec![Dim::Fixed(3)])],
        outputs: vec![ValueInfo::new("y", DataType::Float32, vec![Dim::Fixed(3)])],
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

#[test]
fn engine_names_parse_and_unknown_ones_are_refused() {
    assert_eq!("tract".parse::<EngineKind>().unwrap(), EngineKind::Tract);
    assert_eq!("ort:cuda".parse::<EngineKind>().unwrap(), EngineKind::Ort(Provider::Cuda));
    assert!("ort:tpu".parse::<EngineKind>().unwrap_err().to_string().contains("unknown engine \"ort:tpu\""));
}

#[test]
fn cpu_runs_and_missing_providers_are_errors() {
    let bytes = relu();
    let x = Value::F32(ndarray::ArrayD::from_shape_vec(vec![3], vec![-1.0, 0.5, 2.0]).unwrap());
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let mut s = edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()).unwrap();
        let out = s.run(&[("x", &x)]).unwrap();
        assert_eq!(out[0].as_f32().unwrap().as_slice().unwrap(), &[0.0, 0.5, 2.0], "{kind}");
    }
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        edgefreeze_engine::check_available(&kind, &EngineOptions::default()).unwrap();
        edgefreeze_engine::workspace(&kind, &EngineOptions::default()).unwrap();
    }
    // The CPU-only onnxruntime wheel has neither CUDA nor XNNPACK: the pre-flight check and
    // a new workspace say so before any graph is loaded.
    for (provider, name) in [(Provider::Cuda, "CUDA"), (Provider::Xnnpack, "XNNPACK")] {
        let kind = EngineKind::Ort(provider);
        let checked = edgefreeze_engine::check_available(&kind, &EngineOptions::default());
        assert!(matches!(checked, Err(EngineError::ProviderUnavailable { .. })), "{name}: {checked:?}");
        let workspace = edgefreeze_engine::workspace(&kind, &EngineOptions::default());
        assert!(matches!(workspace, Err(EngineError::ProviderUnavailable { .. })), "{name}: not refused");
        match edgefreeze_engine::load(&EngineKind::Ort(provider), &bytes, &EngineOptions::default()) {
            Err(e @ EngineError::ProviderUnavailable { .. }) => {
                assert!(e.to_string().contains(name), "{e}");
            }
            Err(other) => panic!("{name}: unexpected error {other}"),
            Ok(_) => panic!("{name}: a session was created without the provider"),
        }
    }
}
