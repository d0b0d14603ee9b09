//! ONNX Runtime's CPU sessions stay resident at their working set from the first run on.
//!
//! With ONNX Runtime's memory pattern on (its default), the second run of a session
//! takes one block the size of the whole recorded pattern beside the arena's chunks of
//! the first run, and the arena keeps both: a training step resident at twice its
//! working set. The engine turns the pattern off (`ort_backend.rs`); this test fails
//! when it is on. Alone in its test binary: it reads the process's resident size, which
//! another test running beside it would move.

#![cfg(target_os = "linux")]

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Dim, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, save::encode_model};

/// 4 Mi floats: every intermediate is 16 MiB, far above the noise of a test process.
const N: usize = 4 << 20;

/// y = (Relu(x) + Neg(x)) · Abs(x) + Exp(x): several 16 MiB values alive at once.
fn graph() -> Vec<u8> {
    let graph = Graph {
        name: "wide".into(),
        nodes: vec![
            Node::new("relu", "Relu", &["x"], &["r"]),
            Node::new("neg", "Neg", &["x"], &["n"]),
            Node::new("abs", "Abs", &["x"], &["a"]),
            Node::new("exp", "Exp", &["x"], &["e"]),
            Node::new("add", "Add", &["r", "n"], &["s"]),
            Node::new("mul", "Mul", &["s", "a"], &["p"]),
            Node::new("out", "Add", &["p", "e"], &["y"]),
        ],
        inputs: vec![ValueInfo::new("x", DataType::Float32, vec![Dim::Fixed(N)])],
        outputs: vec![ValueInfo::new("y", DataType::Float32, vec![Dim::Fixed(N)])],
        ..Default::default()
    };
    encode_model(&Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse::<f64>().unwrap() / 1024.0
}

#[test]
fn a_cpu_session_does_not_grow_after_its_first_run() {
    let options = EngineOptions { threads: Some(1), ..EngineOptions::default() };
    let mut session = edgefreeze_engine::load(&EngineKind::Ort(Provider::Cpu), &graph(), &options).unwrap();
    let x = Value::F32(
        ndarray::ArrayD::from_shape_vec(vec![N], (0..N).map(|i| (i % 97) as f32 / 97.0 - 0.5).collect()).unwrap(),
    );
    let loaded = resident_mib();
    let mut after = Vec::new();
    for _ in 0..4 {
        let out = session.run(&[("x", &x)]).unwrap();
        // The arithmetic ran: the first element by hand, x = -0.5: (0 + 0.5) · 0.5 + e^-0.5.
        let y0 = out[0].as_f32().unwrap().as_slice().unwrap()[0];
        assert!((y0 - (0.25 + (-0.5f32).exp())).abs() < 1e-6, "y[0] = {y0}");
        drop(out);
        after.push(resident_mib());
    }
    let first = after[0] - loaded;
    let later = after[3] - after[0];
    // The first run holds at least two intermediates (32 MiB) in the arena; the pattern's
    // block would add as much again on the second run (measured with it on: 66 MiB after
    // the first run's 50). Without it the process grows by one output's size (16 MiB) on
    // the second run and no more: glibc serves our second copy of the output from its heap
    // once the first copy's mapping was freed (its mmap threshold adapts), and keeps it.
    assert!(first > 30.0, "the first run grew the process by only {first:.1} MiB: nothing measured");
    assert!(
        later < 0.5 * first,
        "runs 2-4 grew the process by {later:.1} MiB after the first run's {first:.1} MiB (resident after each run: {after:?})"
    );
}
