//! The int8 reference model on the bundled LeNet-5 and ResNet-20, on tract and ONNX
//! Runtime: its layer-boundary activations arrange a batch as the float model does (SP
//! loss small), unlike those of a model with shuffled weights; it uses only `ai.onnx`
//! ops and passes onnx.checker.

use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_freeze::reference::{
    calibration_model, calibration_output, probe_model, probe_name, ranges, reference_model,
};
use edgefreeze_freeze::sp_loss;
use edgefreeze_graph::ir::Model;
use edgefreeze_graph::save::encode_model;
use edgefreeze_graph::{Tensor, analyse};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

const BATCH: usize = 16;

fn model(name: &str) -> Model {
    edgefreeze_graph::import(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models").join(format!("{name}.onnx")))
        .unwrap()
}

/// A batch of smooth images with a sample-dependent pattern (so that samples differ in
/// structure, not only in noise).
fn batch() -> Value {
    let mut v = Vec::with_capacity(BATCH * 28 * 28);
    for s in 0..BATCH {
        for y in 0..28 {
            for x in 0..28 {
                let (fx, fy) = (x as f32 / 28.0, y as f32 / 28.0);
                let k = 1.0 + (s % 5) as f32;
                v.push((k * 3.0 * fx).sin() * (fy * (s as f32 + 1.0)).cos() + 0.1 * (s as f32 / BATCH as f32));
            }
        }
    }
    Value::F32(ArrayD::from_shape_vec(IxDyn(&[BATCH, 1, 28, 28]), v).unwrap())
}

fn run(engine: &EngineKind, m: &Model, input: &Value) -> Vec<(String, Vec<f32>)> {
    let mut s =
        edgefreeze_engine::load(engine, &encode_model(m), &EngineOptions { threads: Some(1), ..Default::default() })
            .unwrap();
    let name = m.graph.inputs[0].name.clone();
    let out = s.run(&[(name.as_str(), input)]).unwrap();
    s.output_names().iter().cloned().zip(out.iter().map(|v| v.as_f32().unwrap().iter().copied().collect())).collect()
}

fn find<'a>(outs: &'a [(String, Vec<f32>)], name: &str) -> &'a [f32] {
    &outs.iter().find(|(n, _)| n == name).unwrap().1
}

/// The int8 reference of `m` calibrated on `input`, run on `engine`.
fn reference_outputs(
    engine: &EngineKind,
    m: &Model,
    probes: &[usize],
    input: &Value,
) -> (Model, Vec<(String, Vec<f32>)>) {
    let analysis = analyse(m).unwrap();
    let (calibrate, names) = calibration_model(m).unwrap();
    let outs = run(engine, &calibrate, input);
    let values: Vec<&[f32]> = names.iter().map(|n| find(&outs, &calibration_output(n))).collect();
    let reference = reference_model(m, &analysis, &ranges(&names, &values), probes).unwrap();
    let outs = run(engine, &reference, input);
    (reference, outs)
}

/// Every float parameter's values permuted: same distribution, other function.
fn shuffled(m: &Model) -> Model {
    let mut out = m.clone();
    for (_, t) in out.graph.initializers.iter_mut() {
        if t.dtype() != edgefreeze_graph::DataType::Float32 || t.numel() < 2 {
            continue;
        }
        let v = t.to_f32_vec().unwrap();
        let n = v.len();
        // A fixed permutation: i → (i·p + 3) mod n with p coprime to n.
        let p = (1..n).rev().find(|p| gcd(*p, n) == 1 && *p > n / 3).unwrap_or(1);
        let permuted: Vec<f32> = (0..n).map(|i| v[(i * p + 3) % n]).collect();
        *t = Tensor::from_f32(t.dims().to_vec(), &permuted).unwrap();
    }
    out
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn check(name: &str, engine: EngineKind) {
    let m = model(name);
    let analysis = analyse(&m).unwrap();
    let probes: Vec<usize> = (0..analysis.layers.len() - 1).collect();
    let input = batch();
    let float = run(&engine, &probe_model(&m, &analysis, &probes).unwrap(), &input);
    let (reference, quantized) = reference_outputs(&engine, &m, &probes, &input);
    let (_, random) = reference_outputs(&engine, &shuffled(&m), &probes, &input);
    assert!(reference.graph.nodes.iter().all(|n| n.domain.is_empty()), "ai.onnx only");
    assert!(reference.graph.nodes.iter().any(|n| n.op_type == "QuantizeLinear"));
    for &l in &probes {
        let p = probe_name(l);
        let sp_q = sp_loss(find(&float, &p), find(&quantized, &p), BATCH).unwrap();
        let sp_r = sp_loss(find(&float, &p), find(&random, &p), BATCH).unwrap();
        eprintln!("{name} {engine} layer {l}: SP(float, int8) = {sp_q:.3e}, SP(float, shuffled int8) = {sp_r:.3e}");
        // int8 rounding perturbs each activation by about 1% of its range per quantized
        // tensor; a perturbation ε of the Gram rows gives SP ≈ ε²/b (rows have unit
        // norm). 10 quantized tensors deep, ε ≲ 10%: SP < 0.01/16 ≈ 6e-4.
        assert!(sp_q < 6e-4, "{name} layer {l}: SP(float, int8) = {sp_q}");
        assert!(
            sp_r > 10.0 * sp_q,
            "{name} layer {l}: a shuffled model is as close ({sp_r}) as the int8 copy ({sp_q})"
        );
    }
}

#[test]
fn int8_reference_of_lenet5_tracks_the_float_model_on_tract() {
    check("lenet5", EngineKind::Tract);
}

#[test]
fn int8_reference_of_lenet5_tracks_the_float_model_on_onnx_runtime() {
    check("lenet5", EngineKind::Ort(Provider::Cpu));
}

#[test]
fn int8_reference_of_resnet20_tracks_the_float_model_on_both_engines() {
    check("resnet20_28", EngineKind::Tract);
    check("resnet20_28", EngineKind::Ort(Provider::Cpu));
}

#[test]
fn the_reference_model_passes_the_onnx_checker() {
    let ok =
        std::process::Command::new("python3").args(["-c", "import onnx"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("EDGEFREEZE_REQUIRE_PYTHON_ONNX").as_deref() != Ok("1"),
            "EDGEFREEZE_REQUIRE_PYTHON_ONNX=1 but python3 cannot import onnx"
        );
        eprintln!("skipping: python3 cannot import onnx");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for name in ["lenet5", "resnet20_28"] {
        let m = model(name);
        let (reference, _) = reference_outputs(&EngineKind::Tract, &m, &[0, 1], &batch());
        let path = dir.path().join(format!("{name}.onnx"));
        edgefreeze_graph::save_model(&reference, &path, &Default::default()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/check_model.py");
        let out = std::process::Command::new("python3").arg(script).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
