//! The emitted training graphs as files: standard ONNX only (the checker with full_check
//! passes), the same outputs on ONNX Runtime, tract and the ONNX reference evaluator, and
//! lean (no dead nodes, shared subexpressions merged).

use edgefreeze_autodiff::artifacts::convert;
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec};
use edgefreeze_engine::{EngineKind, EngineOptions, Provider, Value};
use edgefreeze_graph::{Model, Tensor, import, save_model};
use edgefreeze_tests::{bundled_and_zoo_files, models_dir, python_onnx, run_python, sidecars};
use ndarray::{ArrayD, IxDyn};
use std::collections::HashMap;
use std::path::Path;

fn spec() -> TrainingSpec {
    TrainingSpec {
        loss: Loss::CrossEntropy { label_smoothing: 0.1, ignore_index: None },
        optimizer: Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
        frozen: vec![],
    }
}

#[test]
fn every_emitted_graph_is_standard_onnx_and_passes_the_checker() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for path in bundled_and_zoo_files() {
        let model = import(&path).unwrap();
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "adamw", 1e-3)).unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        for (kind, m) in
            [("train_step", &artifacts.train_step), ("eval", &artifacts.eval), ("grad", &artifacts.gradient)]
        {
            assert!(
                m.graph.nodes.iter().all(|n| n.domain.is_empty()) && m.opset_imports.iter().all(|(d, _)| d.is_empty()),
                "{stem} {kind}: only the default ai.onnx domain"
            );
            let path = dir.path().join(format!("{stem}_{kind}.onnx"));
            save_model(m, &path, &Default::default()).unwrap();
            files.push(path);
        }
    }
    if python_onnx() {
        let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        let out = run_python("check_model.py", &refs);
        assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), files.len(), "{out}");
    }
}

#[test]
fn training_graphs_are_lean() {
    for s in sidecars() {
        let model = import(&s.path).unwrap();
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "adamw", 1e-3)).unwrap();
        for m in [&artifacts.train_step, &artifacts.gradient, &artifacts.eval] {
            // No dead nodes: removing dead nodes changes nothing.
            let mut copy = m.graph.clone();
            assert_eq!(copy.remove_dead_nodes(), 0, "{}: dead nodes", s.path.display());
            // Shared subexpressions merged: merging again finds nothing.
            assert_eq!(edgefreeze_graph::optimize::merge_common_subexpressions(&mut copy), 0, "{}", s.path.display());
        }
        // No forward value is recomputed: every forward node appears once in the training graph.
        for node in &model.graph.nodes {
            let copies = artifacts
                .train_step
                .graph
                .nodes
                .iter()
                .filter(|n| n.op_type == node.op_type && n.inputs == node.inputs && n.attributes == node.attributes)
                .count();
            assert!(copies <= 1, "{}: node {} appears {copies} times", s.path.display(), node.name);
        }
    }
}

fn feeds_for(model: &Model, graph: &Model, batch: usize) -> HashMap<String, Value> {
    let mut feeds = HashMap::new();
    let mut seed = 7u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as f64 / (1u64 << 31) as f64) as f32
    };
    for input in &graph.graph.inputs {
        let dims: Vec<usize> = input.shape.as_ref().unwrap().iter().map(|d| d.fixed().unwrap_or(batch)).collect();
        let n: usize = dims.iter().product();
        let value = if let Some(t) = model.graph.initializers.get(&input.name) {
            tensor_value(t)
        } else {
            match input.name.as_str() {
                "labels" => {
                    Value::I64(ArrayD::from_shape_vec(IxDyn(&dims), (0..n as i64).map(|i| i % 10).collect()).unwrap())
                }
                "lr" => Value::scalar_f32(0.1),
                "step" => Value::scalar_i64(1),
                _ if input.dtype == Some(edgefreeze_graph::DataType::Int64) => Value::I64(
                    ArrayD::from_shape_vec(IxDyn(&dims), (0..n as i64).map(|i| (i * 37) % 4096).collect()).unwrap(),
                ),
                _ if input.name.starts_with("momentum.") => Value::F32(ArrayD::zeros(IxDyn(&dims))),
                _ => Value::F32(
                    ArrayD::from_shape_vec(IxDyn(&dims), (0..n).map(|_| next() * 2.0 - 1.0).collect()).unwrap(),
                ),
            }
        };
        feeds.insert(input.name.clone(), value);
    }
    feeds
}

fn tensor_value(t: &Tensor) -> Value {
    Value::F32(ArrayD::from_shape_vec(IxDyn(t.dims()), t.to_f32_vec().unwrap()).unwrap())
}

fn run(kind: &EngineKind, graph: &Model, feeds: &HashMap<String, Value>) -> HashMap<String, Vec<f64>> {
    let bytes = edgefreeze_graph::save::encode_model(graph);
    let mut session = edgefreeze_engine::load(kind, &bytes, &EngineOptions::default()).unwrap();
    let names = session.input_names().to_vec();
    let inputs: Vec<(&str, &Value)> = names.iter().map(|n| (n.as_str(), &feeds[n])).collect();
    let outputs = session.run(&inputs).unwrap();
    session.output_names().iter().cloned().zip(outputs.iter().map(values)).collect()
}

fn values(v: &Value) -> Vec<f64> {
    match v {
        Value::F32(a) => a.iter().map(|&x| x as f64).collect(),
        Value::F64(a) => a.iter().copied().collect(),
        Value::I64(a) => a.iter().map(|&x| x as f64).collect(),
        Value::Bool(a) => a.iter().map(|&x| x as u8 as f64).collect(),
    }
}

/// (‖a − b‖, ‖b‖).
fn distance(a: &[f64], b: &[f64]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    (diff, b.iter().map(|y| y * y).sum::<f64>().sqrt())
}

/// The reference evaluator's outputs for one input set, through tests/python/evaluate.py.
fn reference(graph: &Model, feeds: &HashMap<String, Value>) -> HashMap<String, Vec<f64>> {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("model.onnx");
    save_model(graph, &model_path, &Default::default()).unwrap();
    let mut bundle = edgefreeze_graph::Graph::default();
    for (name, v) in feeds {
        let t = match v {
            Value::F32(a) => Tensor::from_f32(a.shape().to_vec(), &a.iter().copied().collect::<Vec<_>>()).unwrap(),
            Value::I64(a) => Tensor::from_i64(a.shape().to_vec(), &a.iter().copied().collect::<Vec<_>>()).unwrap(),
            other => panic!("unexpected feed {other:?}"),
        };
        bundle.initializers.insert(format!("0:{name}"), t);
    }
    let inputs = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph: bundle, ..Default::default() };
    let (inputs_path, outputs_path) = (dir.path().join("inputs.onnx"), dir.path().join("outputs.onnx"));
    save_model(&inputs, &inputs_path, &Default::default()).unwrap();
    run_python("evaluate.py", &[&model_path, &inputs_path, &outputs_path]);
    let results = edgefreeze_graph::load_model(&outputs_path).unwrap();
    results
        .graph
        .initializers
        .iter()
        .map(|(k, t)| (k.split_once(':').unwrap().1.to_string(), t.to_f64_vec().unwrap()))
        .collect()
}

#[test]
fn the_same_training_step_file_agrees_on_every_engine() {
    let check_reference = python_onnx();
    for name in ["lenet5.onnx", "resnet20_28.onnx", "transformer_text.onnx", "kws_m5.onnx"] {
        let model = import(models_dir().join(name)).unwrap();
        // SGD: Adam would blow the round-off noise of analytically zero gradients (the
        // attention key bias) up to full-size steps that differ between engines.
        let sgd =
            TrainingSpec { optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: true, weight_decay: 5e-4 }, ..spec() };
        let artifacts = convert(&model, name, &sgd, 0, ("ce", "sgd", 0.1)).unwrap();
        let graph = &artifacts.train_step;
        let feeds = feeds_for(&model, graph, 4);
        let ort = run(&EngineKind::Ort(Provider::Cpu), graph, &feeds);
        let tract = run(&EngineKind::Tract, graph, &feeds);
        let mut engines = vec![("tract", tract)];
        if check_reference {
            engines.push(("onnx.reference", reference(graph, &feeds)));
        }
        // A momentum buffer after one step is the raw gradient; where that cancels to
        // ~0 (a bias before a training-mode BatchNorm: kws_m5's conv biases) its round-off
        // is relative to the model's gradients, not to its own norm. So a momentum
        // buffer also passes with every element within 16 float32 ulps of the largest
        // momentum element, the gradient floor of tests/pytorch_golden.rs.
        let is_momentum = |output: &str| output.starts_with("updated.momentum.");
        let gradient_scale = ort
            .iter()
            .filter(|(output, _)| is_momentum(output))
            .flat_map(|(_, v)| v.iter().map(|x| x.abs()))
            .fold(0.0f64, f64::max);
        let floor = 16.0 * f64::from(f32::EPSILON) * gradient_scale;
        let mut worst = (0.0f64, String::new());
        for (engine, outputs) in &engines {
            for (output, expected) in &ort {
                let (diff, norm) = distance(&outputs[output], expected);
                let max_abs = outputs[output].iter().zip(expected).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                let used = if is_momentum(output) {
                    (diff / (1e-4 * norm)).min(max_abs / floor)
                } else {
                    diff / (1e-4 * norm + 1e-6)
                };
                assert!(
                    used <= 1.0,
                    "{name}: {output} on {engine} differs from ONNX Runtime by {diff:.2e} (norm {norm:.2e}, largest \
                     element difference {max_abs:.2e}, floor {floor:.2e})"
                );
                if used > worst.0 {
                    worst = (used, format!("{output} on {engine}"));
                }
            }
        }
        eprintln!("{name}: worst difference from ONNX Runtime at {:.3} of the tolerance ({})", worst.0, worst.1);
    }
}

/// The models a user brings (tests/fixtures/zoo, both exporters) beside the bundled ones.
fn bundled_and_zoo_models() -> Vec<(String, Model)> {
    bundled_and_zoo_files().into_iter().map(|p| (p.display().to_string(), import(&p).unwrap())).collect()
}

/// A `Shape` or `Size` in the backward pass keeps a whole activation alive from the forward
/// pass until it runs, for a few integers: no rule may read an activation only for that.
/// (An activation here: at least 64 elements per sample by the graph's static shapes.
/// ConvNeXt's flattened per-channel means, [batch·16] of unknown size to shape inference,
/// are read for their length by the gradient of the `Gather` that emulates `as_strided`,
/// whose indices are computed and may be negative. And a value with two or more dimensions
/// unknown to shape inference, such as Swin's attention scores [batch·windows, 16, ?, 4, 4]
/// behind a `Reshape` whose target is computed: no constant target can stand in for
/// its run-time shape there. And the input of any `Reshape`, whose gradient reshapes dY to
/// the input's run-time shape (and `Flatten`'s, `Squeeze`'s and `Unsqueeze`'s, by the same rule): a constant target from the static shapes was tried and
/// broke split graphs of the zoo's Swin and Transformer, whose shape inference cannot
/// follow a batch folded into another axis. Where the input is only a pooled vector, as
/// before a classifier, that costs nothing; in attention it is a known leftover.)
#[test]
fn the_backward_keeps_no_activation_for_its_shape_alone() {
    let mut failures = Vec::new();
    for (path, model) in bundled_and_zoo_models() {
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "adamw", 1e-3)).unwrap();
        let step = &artifacts.train_step.graph;
        let types = edgefreeze_graph::infer::infer(step, artifacts.train_step.opset()).unwrap();
        let shape = |name: &str| types.types.get(name).and_then(|t| t.shape.clone()).unwrap_or_default();
        let per_sample = |name: &str| -> usize { shape(name).iter().filter_map(|d| d.fixed()).product() };
        let unknown = |name: &str| shape(name).iter().filter(|d| d.fixed().is_none()).count();
        let saved = edgefreeze_autodiff::saved::saved_for_backward(step).unwrap();
        assert!(!saved.is_empty(), "{path}: the backward reads no forward value");
        // A Reshape's gradient reshapes dY to the input's run-time shape (see below).
        let reshape_gradient = |reader: &str| {
            let forward = reader.strip_prefix("grad/").and_then(|r| r.strip_suffix("/Shape"));
            step.nodes.iter().any(|n| {
                Some(n.name.as_str()) == forward
                    && ["Reshape", "Flatten", "Squeeze", "Unsqueeze"].contains(&n.op_type.as_str())
            })
        };
        let shape_only: Vec<_> = saved
            .iter()
            .filter(|s| s.shape_only() && per_sample(&s.value) >= 64 && unknown(&s.value) < 2)
            .filter(|s| !s.readers.iter().all(|r| reshape_gradient(&r.node)))
            .collect();
        if !shape_only.is_empty() {
            failures.push(format!("{path}: kept for their shape only: {shape_only:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Convolution → BatchNorm → ReLU keeps what PyTorch keeps and no more: the ReLU's mask is
/// read off its output (the next layer's input, kept anyway), and BatchNorm's backward
/// reads x̂ and σ, so neither the ReLU's input nor the BatchNorm's input outlives the
/// forward pass where nothing else reads them (the backward of the node that computes
/// the value included).
#[test]
fn the_inputs_of_relu_clip_and_batchnorm_are_not_kept() {
    let mut checked = 0;
    for (path, model) in bundled_and_zoo_models() {
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "adamw", 1e-3)).unwrap();
        let step = &artifacts.train_step.graph;
        let saved = edgefreeze_autodiff::saved::saved_for_backward(step).unwrap();
        let produced: std::collections::HashSet<&str> =
            step.nodes.iter().flat_map(|n| n.outputs.iter().map(String::as_str)).collect();
        for node in &model.graph.nodes {
            if !["Relu", "Clip", "BatchNormalization"].contains(&node.op_type.as_str()) {
                continue;
            }
            let x = &node.inputs[0];
            let readers = model.graph.nodes.iter().filter(|n| n.inputs.contains(x)).count();
            // Only where this node is the value's one reader, and the value is an
            // activation the training graph computes.
            if readers != 1 || !produced.contains(x.as_str()) {
                continue;
            }
            checked += 1;
            let kept = saved.iter().find(|s| &s.value == x);
            // The backward of the node that computes the value may read it (a norm's
            // gradient divides by the norm, as F.normalize's clamp reads it): then it is
            // kept whatever this node does.
            let producer = model.graph.nodes.iter().find(|n| n.outputs.contains(x));
            let for_its_producer = |s: &edgefreeze_autodiff::saved::SavedValue| {
                producer.is_some_and(|p| s.readers.iter().any(|r| r.node.starts_with(&format!("grad/{}/", p.name))))
            };
            if kept.is_some_and(for_its_producer) {
                continue;
            }
            assert!(kept.is_none(), "{path}: {} {}'s input is kept: {kept:?}", node.op_type, node.name);
        }
    }
    // ResNet-20 alone has 19 BatchNorm-ReLU pairs: the check must have found them.
    assert!(checked >= 40, "only {checked} inputs checked");
}

/// A SiLU spelled out, x·Sigmoid(x), keeps its input alone, as PyTorch's SiLU does: its
/// Sigmoid's output does not outlive the forward pass (it did when each op's own rule
/// ran). The squeeze-and-excitation gates, x·Sigmoid(z), are not SiLUs and are not
/// checked here.
#[test]
fn silu_keeps_its_input_alone() {
    let mut silus = 0;
    for (path, model) in bundled_and_zoo_models() {
        let nodes = &model.graph.nodes;
        let silu_sigmoids = nodes.iter().filter(|n| n.op_type == "Sigmoid").filter(|sigmoid| {
            let readers: Vec<_> = nodes.iter().filter(|n| n.inputs.contains(&sigmoid.outputs[0])).collect();
            matches!(readers.as_slice(), [m] if m.op_type == "Mul" && m.inputs.contains(&sigmoid.inputs[0]))
        });
        let silu_sigmoids: Vec<_> = silu_sigmoids.collect();
        if silu_sigmoids.is_empty() {
            continue;
        }
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "sgd", 0.1)).unwrap();
        let saved = edgefreeze_autodiff::saved::saved_for_backward(&artifacts.train_step.graph).unwrap();
        for sigmoid in silu_sigmoids {
            let kept = saved.iter().find(|s| s.value == sigmoid.outputs[0]);
            assert!(kept.is_none(), "{path}: the SiLU of {} keeps its sigmoid: {kept:?}", sigmoid.name);
            silus += 1;
        }
    }
    // The zoo's EfficientNet-B0 ×0.25 (TorchScript exporter) has 22 of them.
    assert!(silus >= 22, "only {silus} SiLUs checked");
}

/// A GELU spelled out with `Erf` keeps its input alone, as PyTorch's GELU does, and a
/// LayerNormalization x̂ and σ: neither x/√2 nor 1 + erf(x/√2), nor the centred input of
/// a LayerNormalization, outlives the forward pass (they did when each op's own rule ran).
#[test]
fn gelu_and_layer_norm_keep_what_their_backward_needs() {
    let (mut gelus, mut norms) = (0, 0);
    for (path, model) in bundled_and_zoo_models() {
        let artifacts = convert(&model, "test", &spec(), 0, ("ce", "adamw", 1e-3)).unwrap();
        let step = &artifacts.train_step.graph;
        let saved = edgefreeze_autodiff::saved::saved_for_backward(step).unwrap();
        for erf in model.graph.nodes.iter().filter(|n| n.op_type == "Erf") {
            let plus_one = model.graph.nodes.iter().find(|n| n.inputs.contains(&erf.outputs[0])).unwrap();
            for value in [&erf.inputs[0], &erf.outputs[0], &plus_one.outputs[0]] {
                let kept = saved.iter().find(|s| &s.value == value);
                assert!(kept.is_none(), "{path}: the GELU of {} keeps {value}: {kept:?}", erf.name);
            }
            gelus += 1;
        }
        for ln in model.graph.nodes.iter().filter(|n| n.op_type == "LayerNormalization") {
            // The spelled-out forward's nodes are named after the node; of their values
            // the backward reads x̂ (a Div) and σ (a Sqrt) only, besides the output (the
            // next layer's input, which that layer's gradient reads).
            let group: Vec<&str> = step
                .nodes
                .iter()
                .filter(|n| n.name.starts_with(&format!("{}/", ln.name)))
                .flat_map(|n| n.outputs.iter().map(String::as_str))
                .filter(|v| *v != ln.outputs[0])
                .collect();
            assert!(!group.is_empty(), "{path}: no nodes named after {}", ln.name);
            let kept: Vec<_> = saved.iter().filter(|s| group.contains(&s.value.as_str())).collect();
            let producers: Vec<&str> = kept.iter().map(|s| s.producer.as_str()).collect();
            assert!(
                producers.len() == 2 && producers.contains(&"Div") && producers.contains(&"Sqrt"),
                "{path}: {} keeps {kept:#?}",
                ln.name
            );
            norms += 1;
        }
    }
    // The bundled Transformer has two GELUs and five LayerNormalizations; the zoo's
    // encoders, Swin and ConvNeXt more.
    assert!(gelus >= 4 && norms >= 10, "only {gelus} GELUs and {norms} LayerNormalizations checked");
}
