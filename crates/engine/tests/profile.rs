//! Per-node profiles from both engines: every run recorded, nodes named after the ONNX
//! nodes they came from, outputs unchanged by profiling, and clear errors for a profile
//! that was not asked for or was already taken.

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, StateUpdates, Value, workspace};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, save::encode_model};
use ndarray::{ArrayD, IxDyn};

const OP_TYPES: [&str; 4] = ["Conv", "Relu", "Flatten", "MatMul"];

/// `x [N,2,12,12]` → Conv 3×3 (8 channels) → Relu → Flatten → MatMul → `y [N,4]`, the
/// weights as state.
fn graph() -> Vec<u8> {
    let f = |name: &str, dims: Vec<Dim>| ValueInfo::new(name, DataType::Float32, dims);
    let n = || Dim::Symbol("N".into());
    let graph = Graph {
        name: "profiled".into(),
        nodes: vec![
            Node::new("conv", "Conv", &["x", "w"], &["c"]),
            Node::new("relu", "Relu", &["c"], &["r"]),
            Node::new("flat", "Flatten", &["r"], &["f"]),
            Node::new("fc", "MatMul", &["f", "v"], &["y"]),
        ],
        inputs: vec![
            f("x", vec![n(), Dim::Fixed(2), Dim::Fixed(12), Dim::Fixed(12)]),
            f("w", [8, 2, 3, 3].map(Dim::Fixed).to_vec()),
            f("v", [800, 4].map(Dim::Fixed).to_vec()),
        ],
        outputs: vec![f("y", vec![n(), Dim::Fixed(4)])],
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

fn filled(dims: &[usize], scale: f32) -> Value {
    let n: usize = dims.iter().product();
    Value::F32(
        ArrayD::from_shape_vec(IxDyn(dims), (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * scale).collect()).unwrap(),
    )
}

/// Runs the graph three times in a workspace with these options → the outputs of each run.
fn run_three(
    kind: &EngineKind,
    options: &EngineOptions,
) -> (Box<dyn edgefreeze_engine::Workspace>, edgefreeze_engine::GraphId, Vec<Value>) {
    let mut ws = workspace(kind, options).unwrap();
    let g = ws.load_graph(&graph(), StateUpdates::none()).unwrap();
    ws.set_state("w", filled(&[8, 2, 3, 3], 0.01)).unwrap();
    ws.set_state("v", filled(&[800, 4], 0.001)).unwrap();
    let mut ys = Vec::new();
    for batch in [3, 3, 5] {
        let x = filled(&[batch, 2, 12, 12], 0.02);
        let out = ws.run(g, &[("x", &x)]).unwrap();
        ys.push(out.into_iter().next().unwrap().1);
    }
    (ws, g, ys)
}

#[test]
fn both_engines_profile_every_run_by_onnx_op_type() {
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let plain = EngineOptions { threads: Some(1), ..Default::default() };
        let (mut unprofiled, g0, expected) = run_three(&kind, &plain);
        let err = unprofiled.take_profile(g0).unwrap_err().to_string();
        assert!(err.contains("without profiling"), "{kind}: {err}");

        let options = EngineOptions { profile: true, ..plain };
        let (mut ws, g, ys) = run_three(&kind, &options);
        assert_eq!(ys, expected, "{kind}: profiling changed the outputs");
        let profile = ws.take_profile(g).unwrap();
        assert_eq!(profile.runs.len(), 3, "{kind}: {profile:?}");
        for (i, run) in profile.runs.iter().enumerate() {
            assert!(!run.is_empty(), "{kind}: run {i} recorded no node");
            for node in run {
                assert!(node.micros >= 0.0, "{kind}: {node:?}");
                // ONNX Runtime may fuse Conv and Relu; tract's own nodes say so.
                let known = OP_TYPES.contains(&node.op_type.as_str())
                    || node.op_type == "FusedConv"
                    || node.op_type.starts_with("tract:");
                assert!(known, "{kind}: {node:?}");
            }
        }
        let ops = profile.by_op_type(1);
        // Present, not timed: ONNX Runtime counts whole microseconds, and this small
        // convolution may take less than one on a fast CPU.
        assert!(ops.iter().any(|o| o.op_type.contains("Conv")), "{kind}: {ops:?}");
        assert!(ops.iter().any(|o| o.op_type == "MatMul"), "{kind}: {ops:?}");
        let share: f64 = ops.iter().map(|o| o.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "{kind}: {ops:?}");
        match kind {
            // tract goes on recording: a later take holds the runs since this one.
            EngineKind::Tract => {
                assert!(ws.take_profile(g).unwrap().runs.is_empty());
                ws.run(g, &[("x", &filled(&[2, 2, 12, 12], 0.02))]).unwrap();
                assert_eq!(ws.take_profile(g).unwrap().runs.len(), 1);
            }
            // ONNX Runtime ends profiling when its trace is taken.
            EngineKind::Ort(_) => {
                let again = ws.take_profile(g).unwrap_err().to_string();
                assert!(again.contains("already taken"), "{again}");
            }
        }
    }
}
