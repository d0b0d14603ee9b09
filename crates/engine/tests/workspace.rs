//! Workspaces keep state inside the engine between runs: results must equal running the
//! graph statelessly and feeding the outputs back by hand.

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, StateUpdates, Value, workspace};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, save::encode_model};
use ndarray::{ArrayD, IxDyn, array};

/// `updated.w = MatMul(a, w)`, `updated.v = Transpose(v)`, `updated.count = count + 1`,
/// `norm = ReduceSumSquare(w)`: a transpose cannot be computed in place, so an engine that
/// wrote a run's output into the buffer of the previous run's output (the state it is
/// reading) would get it wrong.
fn stateful_graph() -> Vec<u8> {
    let f = |name: &str, dims: &[usize]| {
        ValueInfo::new(name, DataType::Float32, dims.iter().map(|&d| Dim::Fixed(d)).collect())
    };
    let graph = Graph {
        name: "stateful".into(),
        nodes: vec![
            Node::new("mm", "MatMul", &["a", "w"], &["updated.w"]),
            Node::new("flip", "Transpose", &["v"], &["updated.v"]),
            Node::new("inc", "Add", &["count", "one"], &["updated.count"]),
            Node::new("norm", "ReduceSumSquare", &["w"], &["norm"])
                .with_attr("keepdims", edgefreeze_graph::Attribute::Int(0)),
        ],
        inputs: vec![
            f("a", &[3, 3]),
            f("w", &[3, 2]),
            f("v", &[3, 3]),
            ValueInfo::new("count", DataType::Int64, vec![]),
            ValueInfo::new("one", DataType::Int64, vec![]),
        ],
        outputs: vec![
            f("updated.w", &[3, 2]),
            f("updated.v", &[3, 3]),
            ValueInfo::new("updated.count", DataType::Int64, vec![]),
            f("norm", &[]),
        ],
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

#[test]
fn state_stays_in_the_engine_and_matches_host_arithmetic() {
    let bytes = stateful_graph();
    let a = array![[0.0f32, 1.0, 0.5], [1.0, 0.0, -1.0], [0.25, 2.0, 0.0]].into_dyn();
    let w0 = array![[1.0f32, -2.0], [0.5, 3.0], [-1.0, 0.25]].into_dyn();
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let mut ws = workspace(&kind, &EngineOptions { threads: Some(1), ..Default::default() }).unwrap();
        let g = ws.load_graph(&bytes, StateUpdates::by_prefix("updated.", ["w", "v", "count"])).unwrap();
        ws.set_state("w", Value::F32(w0.clone())).unwrap();
        ws.set_state("count", Value::scalar_i64(0)).unwrap();
        let v0 = ArrayD::from_shape_vec(IxDyn(&[3, 3]), (0..9).map(|i| i as f32).collect()).unwrap();
        ws.set_state("v", Value::F32(v0.clone())).unwrap();
        assert_eq!(ws.state_names(), vec!["count".to_string(), "v".to_string(), "w".to_string()]);
        let one = Value::scalar_i64(1);
        let mut host = w0.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
        let a2 = a.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
        for step in 1..=5 {
            let out = ws.run(g, &[("a", &Value::F32(a.clone())), ("one", &one)]).unwrap();
            // Only the output that updates no state comes back to the host.
            assert_eq!(out.len(), 1, "{kind}");
            assert_eq!(out[0].0, "norm");
            let norm = out[0].1.as_f32().unwrap().iter().next().copied().unwrap();
            assert!((norm - host.iter().map(|x| x * x).sum::<f32>()).abs() < 1e-4, "{kind} step {step}");
            host = a2.dot(&host);
            let w = ws.state("w").unwrap();
            let w = w.as_f32().unwrap();
            for (x, y) in w.iter().zip(host.iter()) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{kind} step {step}: {w:?} vs {host:?}");
            }
            let expected_v = if step % 2 == 1 { v0.t().to_owned() } else { v0.clone() };
            assert_eq!(
                ws.state("v").unwrap(),
                Value::F32(expected_v.as_standard_layout().to_owned()),
                "{kind} step {step}"
            );
            assert_eq!(ws.state("count").unwrap(), Value::I64(ArrayD::from_elem(IxDyn(&[]), step)), "{kind}");
        }
        let missing = ws.run(g, &[("one", &one)]).unwrap_err().to_string();
        assert!(missing.contains("\"a\"") && missing.contains("not given"), "{kind}: {missing}");
        let bad = ws.load_graph(&bytes, StateUpdates::by_prefix("new.", ["w"])).unwrap_err().to_string();
        assert!(bad.contains("new.w") && bad.contains("no such output"), "{kind}: {bad}");
        assert!(ws.state("nope").unwrap_err().to_string().contains("no such state"), "{kind}");
    }
}

#[test]
fn only_states_with_an_updated_output_are_paired() {
    let outputs = vec!["loss".to_string(), "updated.w".to_string(), "updated.momentum.w".to_string()];
    let updates = StateUpdates::where_output_exists("updated.", ["w", "momentum.w", "frozen.b"], &outputs);
    assert_eq!(
        updates.pairs,
        vec![("updated.w".to_string(), "w".to_string()), ("updated.momentum.w".to_string(), "momentum.w".to_string())]
    );
    assert_eq!(updates.state_of("updated.w"), Some("w"));
    assert_eq!(updates.state_of("loss"), None);
}

#[test]
fn an_unloaded_graph_is_freed_and_its_id_refused_while_the_state_stays() {
    let bytes = stateful_graph();
    let a = Value::F32(ArrayD::from_shape_vec(IxDyn(&[3, 3]), (0..9).map(|i| i as f32 * 0.1).collect()).unwrap());
    let one = Value::scalar_i64(1);
    for kind in [EngineKind::Tract, EngineKind::Ort(Provider::Cpu)] {
        let mut ws = workspace(&kind, &EngineOptions { threads: Some(1), ..Default::default() }).unwrap();
        let updates = || StateUpdates::by_prefix("updated.", ["w", "v", "count"]);
        let first = ws.load_graph(&bytes, updates()).unwrap();
        ws.set_state("w", Value::F32(ArrayD::from_elem(IxDyn(&[3, 2]), 0.5))).unwrap();
        ws.set_state("v", Value::F32(ArrayD::from_elem(IxDyn(&[3, 3]), 2.0))).unwrap();
        ws.set_state("count", Value::scalar_i64(0)).unwrap();
        ws.run(first, &[("a", &a), ("one", &one)]).unwrap();
        let second = ws.load_graph(&bytes, updates()).unwrap();
        assert_eq!(ws.loaded_graphs(), 2, "{kind}");
        let state_before = (ws.state("w").unwrap(), ws.state("count").unwrap());

        ws.unload_graph(first).unwrap();
        assert_eq!(ws.loaded_graphs(), 1, "{kind}");
        // The store is untouched by the unload.
        assert_eq!((ws.state("w").unwrap(), ws.state("count").unwrap()), state_before, "{kind}");
        // The freed id is refused, never run as another graph; its names are empty.
        let err = ws.run(first, &[("a", &a), ("one", &one)]).unwrap_err().to_string();
        assert!(err.contains("not loaded"), "{kind}: {err}");
        assert!(ws.unload_graph(first).unwrap_err().to_string().contains("not loaded"), "{kind}");
        assert!(ws.inputs(first).is_empty() && ws.outputs(first).is_empty(), "{kind}");
        // The other graph still runs on the kept state: the counter goes on from 1.
        ws.run(second, &[("a", &a), ("one", &one)]).unwrap();
        assert_eq!(ws.state("count").unwrap(), Value::I64(ArrayD::from_elem(IxDyn(&[]), 2)), "{kind}");
        // A new graph gets a new id.
        let third = ws.load_graph(&bytes, updates()).unwrap();
        assert!(third != first && third != second, "{kind}");
        assert_eq!(ws.loaded_graphs(), 2, "{kind}");
    }
}

/// A slowed workspace (an emulated slower device) computes exactly what the engine does,
/// and each run lasts at least the factor times the engine's own time: the pause is a
/// sleep, which never ends early. Bounds from below only, so no machine's speed can make
/// it fail.
#[test]
fn a_slowed_workspace_gives_the_same_bits_and_lasts_the_factor_times_the_engine() {
    use edgefreeze_engine::Workspace;
    use edgefreeze_engine::slowdown::{Clock, Slowed};
    let bytes = stateful_graph();
    let a = array![[0.0f32, 1.0, 0.5], [1.0, 0.0, -1.0], [0.25, 2.0, 0.0]].into_dyn();
    let w0 = array![[1.0f32, -2.0], [0.5, 3.0], [-1.0, 0.25]].into_dyn();
    let one_thread = EngineOptions { threads: Some(1), ..Default::default() };
    let setup = |ws: &mut dyn Workspace| {
        let g = ws.load_graph(&bytes, StateUpdates::by_prefix("updated.", ["w", "v", "count"])).unwrap();
        ws.set_state("w", Value::F32(w0.clone())).unwrap();
        ws.set_state("count", Value::scalar_i64(0)).unwrap();
        ws.set_state("v", Value::F32(ArrayD::zeros(IxDyn(&[3, 3])))).unwrap();
        g
    };
    let mut plain = workspace(&EngineKind::Tract, &one_thread).unwrap();
    let mut slowed = Slowed::new(
        workspace(&EngineKind::Tract, &one_thread).unwrap(),
        4.0,
        Clock::for_engine(&EngineKind::Tract, Some(1)),
    )
    .unwrap();
    let gp = setup(plain.as_mut());
    let gs = setup(&mut slowed);
    let one = Value::scalar_i64(1);
    let feeds = [("a", &Value::F32(a.clone())), ("one", &one)];
    let before = slowed.ran();
    let mut wall = std::time::Duration::ZERO;
    for _ in 0..3 {
        let p = plain.run(gp, &feeds).unwrap();
        let start = std::time::Instant::now();
        let s = slowed.run(gs, &feeds).unwrap();
        wall += start.elapsed();
        assert_eq!(format!("{p:?}"), format!("{s:?}"));
    }
    assert_eq!(format!("{:?}", plain.state("w").unwrap()), format!("{:?}", slowed.state("w").unwrap()));
    assert_eq!(format!("{:?}", plain.state("count").unwrap()), format!("{:?}", slowed.state("count").unwrap()));
    let ran = slowed.ran() - before;
    assert!(ran > std::time::Duration::ZERO);
    assert!(slowed.paused() >= (slowed.ran() * 3).saturating_sub(std::time::Duration::from_micros(1)));
    // Only the slowed runs are timed: without the pause they would take about `ran`.
    assert!(wall >= ran * 4, "3 runs of {ran:?} in the engine took {wall:?} slowed by 4");

    // Through the options, as the CLI's --slowdown makes it; a bad factor is refused.
    let slow = EngineOptions { slowdown: Some(2.0), ..one_thread.clone() };
    let mut ws = workspace(&EngineKind::Tract, &slow).unwrap();
    let g = setup(ws.as_mut());
    ws.run(g, &feeds).unwrap();
    for bad in [0.5, f64::NAN] {
        let options = EngineOptions { slowdown: Some(bad), ..one_thread.clone() };
        let e = workspace(&EngineKind::Tract, &options).err().expect("a bad slowdown is refused").to_string();
        assert!(e.contains("slowdown"), "{e}");
    }
}
