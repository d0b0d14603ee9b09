//! Finite-difference gradient checking in f64 on tract.
//!
//! A check builds a one-op model whose differentiable inputs are f64 parameters, appends a
//! projection loss `Σ yᵢ·rᵢ` with fixed random `r` for every float output, builds the
//! gradient graph, and compares each analytic gradient element with the central
//! difference of the loss.

#![allow(dead_code)]

use edgefreeze_autodiff::{Loss, gradient_graph};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::ir::{Attribute, Graph, Model, Node, ValueInfo};
use edgefreeze_graph::{DataType, Tensor, prepare};
use ndarray::{ArrayD, IxDyn};

/// A tiny deterministic generator (xorshift) for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// `n` values uniform in [lo, hi).
    pub fn values(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.range(lo, hi)).collect()
    }
}

/// One input of the op under test.
pub enum Input {
    /// A differentiable f64 tensor.
    Param(Vec<usize>, Vec<f64>),
    /// A constant (integer axes, shapes...), not differentiated.
    Const(Tensor),
}

/// A random differentiable input.
pub fn param(rng: &mut Rng, dims: &[usize]) -> Input {
    let n = dims.iter().product();
    Input::Param(dims.to_vec(), rng.values(n, -1.0, 1.0))
}

/// A differentiable input away from the kinks of piecewise ops (|x| ≥ 0.1).
pub fn param_away_from_zero(rng: &mut Rng, dims: &[usize]) -> Input {
    let n = dims.iter().product();
    let v = (0..n).map(|_| {
        let m = rng.range(0.1, 1.0);
        if rng.uniform() < 0.5 { -m } else { m }
    });
    Input::Param(dims.to_vec(), v.collect())
}

/// A constant i64 vector input.
pub fn ints(values: &[i64]) -> Input {
    Input::Const(Tensor::from_i64(vec![values.len()], values).unwrap())
}

/// Checks the gradients of `node` (whose inputs are named `in0`, `in1`... and outputs
/// `out0`...; empty names keep an input omitted) at the given inputs.
pub fn check(node: Node, inputs: Vec<Input>, opset: i64) {
    check_with(node, inputs, opset, &mut Rng::new(99))
}

/// Step and tolerance of a finite-difference comparison.
#[derive(Clone, Copy)]
pub struct Tolerance {
    /// Central-difference step.
    pub h: f64,
    /// Absolute tolerance.
    pub abs: f64,
    /// Relative tolerance.
    pub rel: f64,
}

/// The default: f64 evaluation throughout.
pub const F64: Tolerance = Tolerance { h: 1e-6, abs: 1e-6, rel: 1e-5 };

/// For ops whose reference kernel rounds to f32 internally (onnx.reference's Erf): a larger
/// step keeps the rounding noise small against the difference.
pub const F32_KERNEL: Tolerance = Tolerance { h: 1e-3, abs: 2e-4, rel: 2e-3 };

/// [`check`] with a caller's generator for the projection weights.
pub fn check_with(node: Node, inputs: Vec<Input>, opset: i64, rng: &mut Rng) {
    check_tolerance(node, inputs, opset, rng, F64)
}

/// The one-op model of a check: `node` on the inputs (f64 parameters as initializers,
/// constants as `Constant` nodes) and the projection loss of its float outputs; with the
/// parameters.
pub fn projected_model(mut node: Node, inputs: Vec<Input>, opset: i64, rng: &mut Rng) -> (Model, ParamSet) {
    let op = node.op_type.clone();
    let mut graph = Graph { name: format!("check_{op}"), ..Default::default() };
    let mut params = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let name = format!("in{i}");
        match input {
            Input::Param(dims, v) => {
                graph
                    .initializers
                    .insert(name.clone(), Tensor::from_f64_as(DataType::Float64, dims.clone(), v).unwrap());
                params.push((name.clone(), dims.clone(), v.clone()));
            }
            Input::Const(t) => {
                graph.nodes.push(
                    Node::new(format!("const{i}"), "Constant", &[], &[&name])
                        .with_attr("value", edgefreeze_graph::ir::Attribute::Tensor(t.clone())),
                );
            }
        }
        if node.inputs.len() <= i {
            node.inputs.push(name);
        } else if !node.inputs[i].is_empty() {
            node.inputs[i] = name;
        }
    }
    let outputs = node.outputs.len().max(1);
    node.outputs = (0..outputs).map(|k| format!("out{k}")).collect();
    graph.nodes.push(node);
    let mut model = Model { ir_version: 8, opset_imports: vec![(String::new(), opset)], graph, ..Default::default() };
    // Types of the op's outputs, to make the projection weights.
    model.graph.outputs = (0..outputs)
        .map(|k| ValueInfo { name: format!("out{k}"), dtype: None, shape: None, doc_string: String::new() })
        .collect();
    let typed = prepare(model.clone()).unwrap_or_else(|e| panic!("{op}: the forward model is invalid: {e}"));
    let mut terms = Vec::new();
    for k in 0..outputs {
        let info = typed.graph.value_type(&format!("out{k}")).unwrap();
        if info.dtype != Some(DataType::Float64) {
            continue;
        }
        let dims: Vec<usize> = info.shape.unwrap().iter().map(|d| d.fixed().expect("fixed output shape")).collect();
        let n: usize = dims.iter().product();
        let weights = Tensor::from_f64_as(DataType::Float64, dims, &rng.values(n, -1.0, 1.0)).unwrap();
        let w = format!("proj{k}");
        model.graph.nodes.push(
            Node::new(format!("proj_const{k}"), "Constant", &[], &[&w])
                .with_attr("value", edgefreeze_graph::ir::Attribute::Tensor(weights)),
        );
        model.graph.nodes.push(Node::new(
            format!("proj_mul{k}"),
            "Mul",
            &[&format!("out{k}"), &w],
            &[&format!("prod{k}")],
        ));
        model.graph.nodes.push(
            Node::new(format!("proj_sum{k}"), "ReduceSum", &[&format!("prod{k}")], &[&format!("term{k}")])
                .with_attr("keepdims", edgefreeze_graph::ir::Attribute::Int(0)),
        );
        terms.push(format!("term{k}"));
    }
    let mut total = terms[0].clone();
    for (k, t) in terms.iter().enumerate().skip(1) {
        let next = format!("total{k}");
        model.graph.nodes.push(Node::new(format!("sum{k}"), "Add", &[&total, t], &[&next]));
        total = next;
    }
    model.graph.outputs = vec![ValueInfo { name: total, dtype: None, shape: None, doc_string: String::new() }];
    (prepare(model).unwrap(), params)
}

/// [`check`] with a caller's generator and tolerance.
pub fn check_tolerance(node: Node, inputs: Vec<Input>, opset: i64, rng: &mut Rng, tol: Tolerance) {
    let op = node.op_type.clone();
    let (model, params) = projected_model(node, inputs, opset, rng);
    check_params(&op, &model, params, tol);
}

/// The check of a whole model whose one output is the loss, its f64 initializers the
/// parameters, on the engine [`check_tolerance`] picks.
pub fn check_model(what: &str, model: &Model, tol: Tolerance) {
    check_params(what, model, params_of(model), tol);
}

/// A model's f64 initializers, by name: the parameters of a whole-model check.
fn params_of(model: &Model) -> ParamSet {
    let mut params: ParamSet = model
        .graph
        .initializers
        .iter()
        .filter(|(_, t)| t.dtype() == DataType::Float64)
        .map(|(n, t)| (n.clone(), t.dims().to_vec(), t.to_f64_vec().unwrap()))
        .collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    params
}

fn check_params(op: &str, model: &Model, params: ParamSet, tol: Tolerance) {
    let grad = gradient_graph(model, &Loss::Output, &[]).unwrap_or_else(|e| panic!("{op}: {e}"));
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let run = |session: &mut Box<dyn edgefreeze_engine::Session>, values: &[(String, Vec<usize>, Vec<f64>)]| {
        let arrays: Vec<(String, Value)> = values
            .iter()
            .map(|(n, d, v)| (n.clone(), Value::F64(ArrayD::from_shape_vec(IxDyn(d), v.clone()).unwrap())))
            .collect();
        let refs: Vec<(&str, &Value)> = arrays.iter().map(|(n, v)| (n.as_str(), v)).collect();
        session.run(&refs)
    };
    // Exact f64 evaluation is needed: ONNX Runtime's CPU kernels are exact but lack f64
    // convolutions and Erf; the ONNX reference evaluator (numpy) has everything in f64 but
    // runs in Python; tract has f64 kernels but computes some ops (Sqrt, reductions) with
    // about 1e-10 relative error, too coarse for central differences, so it comes last.
    let mut failures = Vec::new();
    let mut attempt = |kind: EngineKind| match edgefreeze_engine::load(&kind, &bytes, &EngineOptions::default()) {
        Ok(mut s) => match run(&mut s, &params) {
            Ok(out) => Some((s, out)),
            Err(e) => {
                failures.push(format!("{kind}: {e}"));
                None
            }
        },
        Err(e) => {
            failures.push(format!("{kind}: {e}"));
            None
        }
    };
    let mut chosen = attempt(EngineKind::Ort(edgefreeze_engine::Provider::Cpu));
    if chosen.is_none() && python_reference_available() {
        return check_on_reference(op, &grad, &params, tol);
    }
    if chosen.is_none() {
        chosen = attempt(EngineKind::Tract);
    }
    let Some((mut session, base)) = chosen else { panic!("{op}: no engine runs the f64 gradient graph: {failures:?}") };
    let names: Vec<String> = session.output_names().to_vec();
    let output = |out: &[Value], name: &str| -> Vec<f64> {
        let i = names.iter().position(|n| n == name).unwrap_or_else(|| panic!("{op}: no output {name}"));
        out[i].as_f64().unwrap().iter().copied().collect()
    };
    let (sets, probes) = probe_sets(&params, tol.h);
    let losses: Vec<f64> = sets
        .iter()
        .map(|set| output(&run(&mut session, set).unwrap_or_else(|e| panic!("{op}: run failed: {e}")), "loss")[0])
        .collect();
    compare(op, &params, tol, &probes, &losses, |name| output(&base, &format!("grad.{name}")), "");
}

/// Whether `python3` can import onnx's reference evaluator.
pub fn python_reference_available() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import onnx.reference"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Parameters by name, with their dimensions and values.
pub type ParamSet = Vec<(String, Vec<usize>, Vec<f64>)>;

/// Runs the graph on many parameter sets with the ONNX reference evaluator; returns each
/// set's outputs by name.
pub fn reference_outputs(model: &Model, sets: &[ParamSet]) -> Vec<std::collections::HashMap<String, Vec<f64>>> {
    let dir = tempfile_dir();
    let model_path = dir.join("model.onnx");
    edgefreeze_graph::save_model(model, &model_path, &Default::default()).unwrap();
    let mut bundle = Graph::default();
    for (k, set) in sets.iter().enumerate() {
        for (name, dims, values) in set {
            bundle
                .initializers
                .insert(format!("{k}:{name}"), Tensor::from_f64_as(DataType::Float64, dims.clone(), values).unwrap());
        }
    }
    let inputs = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph: bundle, ..Default::default() };
    let inputs_path = dir.join("inputs.onnx");
    let outputs_path = dir.join("outputs.onnx");
    edgefreeze_graph::save_model(&inputs, &inputs_path, &Default::default()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/evaluate.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&model_path)
        .arg(&inputs_path)
        .arg(&outputs_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "reference evaluator failed: {}", String::from_utf8_lossy(&out.stderr));
    let results = edgefreeze_graph::load_model(&outputs_path).unwrap();
    let mut per_set = vec![std::collections::HashMap::new(); sets.len()];
    for (key, t) in &results.graph.initializers {
        let (k, name) = key.split_once(':').unwrap();
        per_set[k.parse::<usize>().unwrap()].insert(name.to_string(), t.to_f64_vec().unwrap());
    }
    let _ = std::fs::remove_dir_all(&dir);
    per_set
}

fn tempfile_dir() -> std::path::PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("edgefreeze-gradcheck-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The parameter sets of a central-difference check: the unperturbed set first, then a
/// +h and a −h set for each probed element (every element of small tensors, a spread of
/// them for larger ones). Probes are (parameter, element, index of its +h set).
fn probe_sets(params: &ParamSet, h: f64) -> (Vec<ParamSet>, Vec<(usize, usize, usize)>) {
    let mut sets = vec![params.clone()];
    let mut probes = Vec::new();
    for (p, (_, _, values)) in params.iter().enumerate() {
        let step = (values.len() / 24).max(1);
        for k in (0..values.len()).step_by(step) {
            let mut plus = params.clone();
            plus[p].2[k] += h;
            let mut minus = params.clone();
            minus[p].2[k] -= h;
            probes.push((p, k, sets.len()));
            sets.push(plus);
            sets.push(minus);
        }
    }
    (sets, probes)
}

/// Compares each probed analytic gradient element with the central difference of the
/// losses of its ±h sets.
fn compare(
    op: &str,
    params: &ParamSet,
    tol: Tolerance,
    probes: &[(usize, usize, usize)],
    losses: &[f64],
    analytic_of: impl Fn(&str) -> Vec<f64>,
    engine: &str,
) {
    let analytic: Vec<Vec<f64>> = params.iter().map(|(name, _, _)| analytic_of(name)).collect();
    for ((name, _, values), a) in params.iter().zip(&analytic) {
        assert_eq!(a.len(), values.len(), "{op}: gradient of {name} has the wrong size");
    }
    for &(p, k, at) in probes {
        let name = &params[p].0;
        let analytic = analytic[p][k];
        let numeric = (losses[at] - losses[at + 1]) / (2.0 * tol.h);
        let tolerance = tol.abs + tol.rel * numeric.abs().max(analytic.abs());
        assert!(
            (numeric - analytic).abs() <= tolerance,
            "{op}: d loss / d {name}[{k}]: analytic {analytic} vs finite difference {numeric}{engine}"
        );
    }
}

/// The finite-difference comparison, with every evaluation done by the reference evaluator in one call.
fn check_on_reference(op: &str, grad: &Model, params: &ParamSet, tol: Tolerance) {
    let (sets, probes) = probe_sets(params, tol.h);
    let outputs = reference_outputs(grad, &sets);
    let losses: Vec<f64> = outputs.iter().map(|o| o["loss"][0]).collect();
    compare(
        op,
        params,
        tol,
        &probes,
        &losses,
        |name| outputs[0][&format!("grad.{name}")].clone(),
        " (reference evaluator)",
    );
}

/// A data input of a [`check_on_engines`] model: its name, concrete dimensions for the run
/// (the model declares some of them symbolic) and values.
pub type Feed = (String, Vec<usize>, Vec<f64>);

/// Finite-difference check of a whole model's gradient graph on both tract and ONNX Runtime:
/// the model's f64 initializers are the parameters, `feeds` its (possibly symbolic-shaped)
/// data inputs given at concrete sizes. Each engine's analytic gradients are compared with
/// the central differences of that engine's own losses.
pub fn check_on_engines(what: &str, model: &Model, feeds: &[Feed], tol: Tolerance) {
    check_on(&[EngineKind::Tract, EngineKind::Ort(edgefreeze_engine::Provider::Cpu)], what, model, feeds, tol)
}

/// [`check_on_engines`] on the given engines only.
pub fn check_on(kinds: &[EngineKind], what: &str, model: &Model, feeds: &[Feed], tol: Tolerance) {
    let grad = gradient_graph(model, &Loss::Output, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
    let bytes = edgefreeze_graph::save::encode_model(&grad);
    let params = params_of(model);
    let (sets, probes) = probe_sets(&params, tol.h);
    for kind in kinds {
        let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default())
            .unwrap_or_else(|e| panic!("{what}: {kind} cannot load the gradient graph: {e}"));
        let names: Vec<String> = session.output_names().to_vec();
        let mut run = |set: &ParamSet| -> Vec<Value> {
            let arrays: Vec<(String, Value)> = set
                .iter()
                .chain(feeds)
                .map(|(n, d, v)| (n.clone(), Value::F64(ArrayD::from_shape_vec(IxDyn(d), v.clone()).unwrap())))
                .collect();
            let refs: Vec<(&str, &Value)> = arrays.iter().map(|(n, v)| (n.as_str(), v)).collect();
            session.run(&refs).unwrap_or_else(|e| panic!("{what}: {kind} cannot run the gradient graph: {e}"))
        };
        let output = |out: &[Value], name: &str| -> Vec<f64> {
            let i = names.iter().position(|n| n == name).unwrap_or_else(|| panic!("{what}: no output {name}"));
            out[i].as_f64().unwrap().iter().copied().collect()
        };
        let base = run(&params);
        let losses: Vec<f64> = sets.iter().map(|set| output(&run(set), "loss")[0]).collect();
        let engine = format!(" ({kind})");
        compare(what, &params, tol, &probes, &losses, |name| output(&base, &format!("grad.{name}")), &engine);
    }
}

/// [`projected_model`] of one node, checked by [`check_on_engines`] on tract and ONNX Runtime.
pub fn check_on_both(node: Node, inputs: Vec<Input>, opset: i64, rng: &mut Rng, tol: Tolerance) {
    let what = node.op_type.clone();
    let (model, _) = projected_model(node, inputs, opset, rng);
    check_on_engines(&what, &model, &[], tol);
}

/// The gradient of Σ wᵢ·yᵢ (wᵢ = 1, 2, 3, … over `y_dims`) with respect to the float32
/// initializer `x` (`x_dims`, `x_values`), where `nodes` compute `y` from `x` and from the
/// float32 scalar graph inputs `extra` (fed the given values): on ONNX Runtime and on
/// tract, in that order. For exact values where finite differences cannot check a rule
/// (kinks, ties).
pub fn weighted_output_gradient(
    x_dims: &[usize],
    x_values: &[f32],
    nodes: Vec<Node>,
    y_dims: &[usize],
    extra: &[(&str, f32)],
) -> Vec<Vec<f32>> {
    let mut graph = Graph { name: "weighted".into(), ..Default::default() };
    graph.initializers.insert("x".into(), Tensor::from_f32(x_dims.to_vec(), x_values).unwrap());
    for (name, _) in extra {
        graph.inputs.push(ValueInfo::new(*name, DataType::Float32, vec![]));
    }
    let weights: Vec<f32> = (1..=y_dims.iter().product()).map(|i| i as f32).collect();
    graph.nodes.push(
        Node::new("w", "Constant", &[], &["w"])
            .with_attr("value", Attribute::Tensor(Tensor::from_f32(y_dims.to_vec(), &weights).unwrap())),
    );
    graph.nodes.extend(nodes);
    graph.nodes.push(Node::new("mul", "Mul", &["y", "w"], &["yw"]));
    graph.nodes.push(Node::new("sum", "ReduceSum", &["yw"], &["loss"]).with_attr("keepdims", Attribute::Int(0)));
    graph.outputs.push(ValueInfo { name: "loss".into(), dtype: None, shape: None, doc_string: String::new() });
    let model = prepare(Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() })
        .unwrap();
    let bytes = edgefreeze_graph::save::encode_model(&gradient_graph(&model, &Loss::Output, &[]).unwrap());
    let x = Value::F32(ArrayD::from_shape_vec(IxDyn(x_dims), x_values.to_vec()).unwrap());
    let extra: Vec<(&str, Value)> =
        extra.iter().map(|(name, v)| (*name, Value::F32(ndarray::arr0(*v).into_dyn()))).collect();
    [EngineKind::Ort(Provider::Cpu), EngineKind::Tract]
        .iter()
        .map(|kind| {
            let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
            let mut feeds: Vec<(&str, &Value)> = vec![("x", &x)];
            feeds.extend(extra.iter().map(|(name, v)| (*name, v)));
            let out = session.run(&feeds).unwrap();
            let at = session.output_names().iter().position(|n| n == "grad.x").unwrap();
            out[at].as_f32().unwrap().iter().copied().collect()
        })
        .collect()
}
