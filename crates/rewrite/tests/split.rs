//! The device/edge split against unsplit training: device forward → edge step → device
//! backward → the two apply graphs, in sequence, give the parameters, optimizer state,
//! running statistics and loss of the unsplit step, for every bundled model at two cuts,
//! with one micro-batch and with two accumulated, on ONNX Runtime and tract; and the
//! same for every zoo fixture (models as users export them) at two or more middle cuts.

mod common;

use common::{batch_of, bundled, distance, engines, floats, model, run, state_of, zoo, zoo_fixtures};
use edgefreeze_autodiff::artifacts::{Role, Side};
use edgefreeze_autodiff::{Loss, Objective, Optimizer, StepOptions, step_graph, update_graph};
use edgefreeze_engine::{EngineKind, Value};
use edgefreeze_graph::{Model, analyse};
use edgefreeze_rewrite::{
    ACTIVATION, GraphRole, RewriteError, STASH_PREFIX, SplitGraphs, SplitOptions, StepSpec, frozen_prefix_step,
    grad_activation_name, split,
};
use ndarray::{ArrayD, IxDyn};
use std::collections::{HashMap, HashSet};

/// Relative agreement of the split and the unsplit step. Both run the same f32 operations
/// on the same values; they differ where a sum is taken in another order: an engine
/// ordering a reduction differently in another graph, and accumulated micro-batch
/// gradients summed in f64 here instead of inside one f32 reduction over the batch.
/// Each moves a result by about 2⁻²⁴ ≈ 6·10⁻⁸ times the square root of the reduction
/// length (≤ 6272: batch 8 at 28×28; the zoo's longest is 4096, batch 4 at the 32×32 of
/// a stride-2 stem on 64×64): ≈ 5·10⁻⁶; the bound allows a factor of 4 over that.
const SAME_OPS: f64 = 2e-5;

fn spec() -> StepSpec {
    StepSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: true, weight_decay: 5e-4 },
    }
}

fn names(m: &Model, inputs: bool) -> Vec<String> {
    let ports = if inputs { &m.graph.inputs } else { &m.graph.outputs };
    ports.iter().map(|v| v.name.clone()).collect()
}

fn f32s(shape: &[usize], values: &[f64]) -> Value {
    Value::F32(ArrayD::from_shape_vec(IxDyn(shape), values.iter().map(|&v| v as f32).collect()).unwrap())
}

/// Adds `outputs` named `grad.<p>` into `sums`.
fn accumulate(sums: &mut HashMap<String, (Vec<usize>, Vec<f64>)>, outputs: &HashMap<String, Value>) {
    for (name, v) in outputs.iter().filter(|(n, _)| n.starts_with("grad.") && **n != grad_activation_name()) {
        let entry =
            sums.entry(name.clone()).or_insert_with(|| (v.shape().to_vec(), vec![0.0; v.shape().iter().product()]));
        for (s, x) in entry.1.iter_mut().zip(floats(v)) {
            *s += x;
        }
    }
}

/// Moves every `updated.<s>` output into the state as `s`.
fn absorb(state: &mut HashMap<String, Value>, outputs: &HashMap<String, Value>) {
    for (name, v) in outputs {
        if let Some(s) = name.strip_prefix("updated.") {
            state.insert(s.to_string(), v.clone());
        }
    }
}

fn with_grads(
    state: &HashMap<String, Value>,
    sums: &HashMap<String, (Vec<usize>, Vec<f64>)>,
    m: usize,
) -> HashMap<String, Value> {
    let mut given = state.clone();
    for (name, (shape, values)) in sums {
        given.insert(name.clone(), f32s(shape, values));
    }
    given.insert("grad_scale".into(), Value::scalar_f32(1.0 / m as f32));
    given
}

/// One pipelined step of the split set over `m` micro-batches of `b` samples: returns the
/// new state and the micro-batch losses.
fn split_step(
    kind: &EngineKind,
    set: &SplitGraphs,
    model: &Model,
    state: &HashMap<String, Value>,
    m: usize,
    b: usize,
) -> (HashMap<String, Value>, Vec<f64>) {
    let mut state = state.clone();
    let mut sums = HashMap::new();
    let mut losses = Vec::new();
    for i in 0..m {
        let batch = batch_of(model, i * b, b);
        let mut given = state.clone();
        given.extend(batch.clone());
        let forward = run(kind, &set.device_forward, &given);
        absorb(&mut state, &forward);
        let mut given = state.clone();
        given.insert(ACTIVATION.into(), forward[ACTIVATION].clone());
        given.insert("labels".into(), batch["labels"].clone());
        let edge = run(kind, &set.edge_step, &given);
        absorb(&mut state, &edge);
        accumulate(&mut sums, &edge);
        losses.push(floats(&edge["loss"])[0]);
        if let Some(backward) = &set.device_backward {
            let mut given = state.clone();
            given.extend(batch);
            given.extend(
                forward.iter().filter(|(n, _)| n.starts_with(STASH_PREFIX)).map(|(n, v)| (n.clone(), v.clone())),
            );
            given.insert(grad_activation_name(), edge[&grad_activation_name()].clone());
            accumulate(&mut sums, &run(kind, backward, &given));
        } else {
            assert!(!edge.contains_key(&grad_activation_name()), "a frozen device gets no gradient");
        }
    }
    let given = with_grads(&state, &sums, m);
    let mut updates = run(kind, &set.edge_apply, &given);
    if let Some(apply) = &set.device_apply {
        updates.extend(run(kind, apply, &given));
    }
    absorb(&mut state, &updates);
    (state, losses)
}

/// Local training on the same micro-batches: the unsplit model's gradients (and running
/// statistics) per micro-batch, summed, then the unsplit optimizer.
fn local_step(
    kind: &EngineKind,
    model: &Model,
    state: &HashMap<String, Value>,
    m: usize,
    b: usize,
) -> (HashMap<String, Value>, Vec<f64>) {
    let options = StepOptions {
        objective: Objective::Loss(spec().loss),
        optimizer: None,
        frozen: vec![],
        frozen_as_inputs: true,
        inference_nodes: HashSet::new(),
        input_gradients: vec![],
        extra_outputs: vec![],
    };
    let grads = step_graph(model, "local_gradients", &options).unwrap();
    let params = edgefreeze_autodiff::training::split_parameters(model, &[]).unwrap().trainable;
    let apply = update_graph(model, &spec().optimizer, &params).unwrap();
    let mut state = state.clone();
    let mut sums = HashMap::new();
    let mut losses = Vec::new();
    for i in 0..m {
        let mut given = state.clone();
        given.extend(batch_of(model, i * b, b));
        let out = run(kind, &grads, &given);
        absorb(&mut state, &out);
        accumulate(&mut sums, &out);
        losses.push(floats(&out["loss"])[0]);
    }
    let out = run(kind, &apply, &with_grads(&state, &sums, m));
    absorb(&mut state, &out);
    (state, losses)
}

/// Checks every named state tensor; returns the largest relative difference seen.
///
/// A gradient that vanishes in exact arithmetic (the bias of a layer whose output a
/// training-mode BatchNorm reads after a linear op: the norm removes any constant shift)
/// is the rounding left from sums that cancel, whose terms are as large as the other
/// gradients: it is held to `SAME_OPS` times the largest norm of its kind (momentum
/// buffers, which hold gradients, or the rest), not its own.
fn compare(what: &str, got: &HashMap<String, Value>, expected: &HashMap<String, Value>, names: &[String]) -> f64 {
    let kind = |name: &str| name.starts_with("momentum.");
    let norms: Vec<(bool, f64)> =
        names.iter().map(|n| (kind(n), distance(&floats(&expected[n]), &floats(&expected[n])).1)).collect();
    let largest = |k: bool| norms.iter().filter(|(kk, _)| *kk == k).map(|(_, n)| *n).fold(0.0, f64::max);
    let mut worst: f64 = 0.0;
    for name in names {
        let (diff, norm) = distance(&floats(&got[name]), &floats(&expected[name]));
        let floor = SAME_OPS * largest(kind(name));
        assert!(diff <= SAME_OPS * norm + floor, "{what}: {name} differs by {diff:.3e} (norm {norm:.3e})");
        if norm > 0.0 {
            worst = worst.max(diff / norm);
        }
    }
    worst
}

/// Whether micro-batching changes the step: BatchNorm normalises per micro-batch, and a
/// Dropout mask is drawn from the element's index within its micro-batch.
fn depends_on_micro_batching(m: &Model) -> bool {
    m.graph.nodes.iter().any(|n| n.op_type == "BatchNormalization" || n.op_type == "Dropout")
}

/// The first and a middle valid cut.
fn two_cuts(m: &Model) -> Vec<usize> {
    let cuts: Vec<usize> = analyse(m).unwrap().cuts.iter().map(|c| c.after_layer).collect();
    assert!(cuts.len() >= 2, "needs two cuts, has {cuts:?}");
    vec![cuts[0], cuts[cuts.len() / 2]]
}

fn check_model(file: &str) {
    let m = model(file);
    check(file, &m, &two_cuts(&m));
}

fn check(file: &str, m: &Model, cuts: &[usize]) {
    let m = m.clone();
    let state = state_of(&m);
    let state_names: Vec<String> = {
        let unsplit = frozen_prefix_step(&m, &spec(), 0, &[]).unwrap();
        names(&unsplit, false).iter().filter_map(|o| o.strip_prefix("updated.").map(String::from)).collect()
    };
    let unsplit = frozen_prefix_step(&m, &spec(), 0, &[]).unwrap();
    // The references do not depend on the cut: one unsplit step on a batch of 4, and
    // local training on two micro-batches of 2, per engine.
    let references: Vec<_> = engines()
        .into_iter()
        .map(|(engine, kind)| {
            let mut given = state.clone();
            given.extend(batch_of(&m, 0, 4));
            let expected = run(&kind, &unsplit, &given);
            let mut whole = state.clone();
            absorb(&mut whole, &expected);
            let loss = floats(&expected["loss"]);
            let local = local_step(&kind, &m, &state, 2, 2);
            (engine, kind, whole, loss, local)
        })
        .collect();
    let mut worst: f64 = 0.0;
    for &cut in cuts {
        for recompute in [false, true] {
            let set = split(&m, cut, &spec(), SplitOptions { frozen_device_layers: false, recompute }).unwrap();
            let stash: Vec<String> =
                names(&set.device_forward, false).into_iter().filter(|n| n.starts_with(STASH_PREFIX)).collect();
            assert_eq!(stash.is_empty(), recompute, "{file} cut {cut}: stash {stash:?}");
            for (engine, kind, whole, whole_loss, (local, local_losses)) in &references {
                let what = format!("{file} cut {cut} recompute {recompute} on {engine}");
                // One micro-batch: the unsplit training step.
                let (got, losses) = split_step(kind, &set, &m, &state, 1, 4);
                let (diff, norm) = distance(&losses, whole_loss);
                assert!(diff <= SAME_OPS * norm, "{what}: loss {losses:?} vs {whole_loss:?}");
                worst = worst.max(compare(&format!("{what}, M=1"), &got, whole, &state_names));
                // Two micro-batches of 2, accumulated.
                let (got, losses) = split_step(kind, &set, &m, &state, 2, 2);
                let (diff, norm) = distance(&losses, local_losses);
                assert!(diff <= SAME_OPS * norm, "{what}: losses {losses:?} vs {local_losses:?}");
                worst =
                    worst.max(compare(&format!("{what}, M=2 against local micro-batches"), &got, local, &state_names));
                if !depends_on_micro_batching(&m) {
                    // Without BatchNorm or Dropout, micro-batching changes nothing: the
                    // unsplit step on the whole batch of 4.
                    worst =
                        worst.max(compare(&format!("{what}, M=2 against the whole batch"), &got, whole, &state_names));
                    let mean = losses.iter().sum::<f64>() / 2.0;
                    assert!(
                        (mean - whole_loss[0]).abs() <= SAME_OPS * whole_loss[0].abs(),
                        "{what}: {mean} vs {whole_loss:?}"
                    );
                }
            }
        }
    }
    eprintln!("{file}: largest relative difference {worst:.2e} (bound {SAME_OPS:.0e})");
}

macro_rules! split_tests {
    ($($name:ident => $file:expr),* $(,)?) => {
        $(#[test] fn $name() { check_model($file); })*

        #[test]
        fn every_bundled_model_has_a_split_test() {
            let tested: Vec<&str> = vec![$($file),*];
            for file in bundled() {
                assert!(tested.contains(&file.as_str()), "{file} has no split test");
            }
        }
    };
}

split_tests! {
    split_fcn_28 => "fcn_28.onnx",
    split_kws_m5 => "kws_m5.onnx",
    split_lenet5 => "lenet5.onnx",
    split_lenet5_dynamo => "lenet5_dynamo.onnx",
    split_mlp => "mlp.onnx",
    split_mlp_external => "mlp_external.onnx",
    split_mobilenetv2_05 => "mobilenetv2_05.onnx",
    split_mobilenetv2_05_28 => "mobilenetv2_05_28.onnx",
    split_resnet20_28 => "resnet20_28.onnx",
    split_resnet20_28_dynamo => "resnet20_28_dynamo.onnx",
    split_resnet20_32 => "resnet20_32.onnx",
    split_transformer_text => "transformer_text.onnx",
    split_transformer_text_dynamo => "transformer_text_dynamo.onnx",
}

#[test]
fn the_freeze_aware_split_is_the_frozen_prefix_step() {
    for file in ["resnet20_28.onnx", "transformer_text.onnx"] {
        let m = model(file);
        check_frozen(file, &m, &two_cuts(&m));
    }
}

/// The freeze-aware split at each cut: no device backward, no gradient sent back, and
/// the parameters, statistics and loss of the frozen-prefix step that freezes the
/// device's layers.
fn check_frozen(file: &str, m: &Model, cuts: &[usize]) {
    let state = state_of(m);
    for &cut in cuts {
        let set = split(m, cut, &spec(), SplitOptions { frozen_device_layers: true, recompute: false }).unwrap();
        assert!(set.device_backward.is_none() && set.device_apply.is_none());
        assert!(!names(&set.edge_step, false).contains(&grad_activation_name()));
        assert_eq!(set.manifest.bytes_per_sample_down, 0);
        assert!(set.manifest.state.iter().filter(|e| e.side == Some(Side::Device)).all(|e| e.role != Role::Parameter));
        let frozen = frozen_prefix_step(m, &spec(), cut + 1, &[]).unwrap();
        for (engine, kind) in engines() {
            let mut given = state.clone();
            given.extend(batch_of(m, 0, 4));
            let mut reference = state.clone();
            let expected = run(&kind, &frozen, &given);
            absorb(&mut reference, &expected);
            let (got, losses) = split_step(&kind, &set, m, &state, 1, 4);
            let what = format!("{file} cut {cut} frozen on {engine}");
            let (diff, norm) = distance(&losses, &floats(&expected["loss"]));
            assert!(diff <= SAME_OPS * norm, "{what}: loss");
            let updated: Vec<String> =
                names(&frozen, false).iter().filter_map(|o| o.strip_prefix("updated.").map(String::from)).collect();
            compare(&what, &got, &reference, &updated);
            // The device's state is untouched.
            for e in set.manifest.state.iter().filter(|e| e.side == Some(Side::Device)) {
                assert_eq!(floats(&got[&e.name]), floats(&state[&e.name]), "{what}: {}", e.name);
            }
        }
    }
}

#[test]
fn the_manifest_places_every_state_tensor_and_counts_the_bytes_that_cross() {
    let m = model("resnet20_28.onnx");
    let analysis = analyse(&m).unwrap();
    let cut = 3;
    let set = split(&m, cut, &spec(), SplitOptions::default()).unwrap();
    let manifest = &set.manifest;
    let c = analysis.cuts.iter().find(|c| c.after_layer == cut).unwrap();
    assert_eq!(manifest.bytes_per_sample_up, c.bytes_per_sample + 8, "activation plus an int64 label");
    assert_eq!(manifest.bytes_per_sample_down, c.bytes_per_sample);
    let roles: Vec<GraphRole> = manifest.graphs.iter().map(|g| g.role).collect();
    assert_eq!(
        roles,
        [
            GraphRole::DeviceForward,
            GraphRole::EdgeStep,
            GraphRole::DeviceBackward,
            GraphRole::EdgeApply,
            GraphRole::DeviceApply
        ]
    );
    for e in &manifest.state {
        let layer = e.layer.unwrap_or_else(|| panic!("{} has no layer", e.name));
        let side = if layer <= cut { Side::Device } else { Side::Edge };
        assert_eq!(e.side, Some(side), "{}", e.name);
    }
    // Every graph input that is state is in the manifest, on the graph's side.
    for (role, graph) in set.graphs() {
        for input in names(graph, true) {
            if let Some(e) = manifest.state.iter().find(|e| e.name == input) {
                assert_eq!(e.side, Some(role.side()), "{input} read by {role:?}");
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    set.write(dir.path()).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("split.json")).unwrap()).unwrap();
    assert_eq!(json["cut"], cut);
    assert_eq!(json["graphs"][0]["role"], "device_forward");
    assert_eq!(json["state"][0]["side"], "device");
    for g in json["graphs"].as_array().unwrap() {
        assert!(dir.path().join(g["file"].as_str().unwrap()).is_file());
    }
    let state = std::fs::read(dir.path().join("split_state.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&state).unwrap();
    assert_eq!(tensors.len(), manifest.state.len());
}

/// x → MatMul → Dropout → Relu → MatMul → Dropout → Relu → MatMul → logits: Dropout on
/// both sides of either cut.
fn with_dropout() -> Model {
    use edgefreeze_graph::ir::{Dim, Graph, Node, ValueInfo};
    use edgefreeze_graph::{DataType, Tensor};
    let mut graph = Graph {
        name: "dropout_mlp".into(),
        nodes: vec![
            Node::new("fc1", "MatMul", &["x", "w1"], &["a1"]),
            Node::new("drop1", "Dropout", &["a1"], &["d1"]),
            Node::new("relu1", "Relu", &["d1"], &["h1"]),
            Node::new("fc2", "MatMul", &["h1", "w2"], &["a2"]),
            Node::new("drop2", "Dropout", &["a2"], &["d2"]),
            Node::new("relu2", "Relu", &["d2"], &["h2"]),
            Node::new("fc3", "MatMul", &["h2", "w3"], &["logits"]),
        ],
        inputs: vec![ValueInfo::new("x", DataType::Float32, vec![Dim::Symbol("N".into()), Dim::Fixed(6)])],
        outputs: vec![ValueInfo { name: "logits".into(), dtype: None, shape: None, doc_string: String::new() }],
        ..Default::default()
    };
    for (name, rows, cols) in [("w1", 6, 8), ("w2", 8, 8), ("w3", 8, 3)] {
        let mut d = common::Draw::new(name);
        let w: Vec<f32> = (0..rows * cols).map(|_| (d.next() - 0.5) as f32).collect();
        graph.initializers.insert(name.into(), Tensor::from_f32(vec![rows, cols], &w).unwrap());
    }
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() };
    edgefreeze_graph::prepare(model).unwrap()
}

#[test]
fn split_with_dropout_on_both_sides_draws_the_masks_of_the_whole_graph() {
    let m = with_dropout();
    let unsplit = frozen_prefix_step(&m, &spec(), 0, &[]).unwrap();
    assert!(names(&unsplit, true).iter().any(|n| n == "dropout_seed"), "training-mode Dropout reads the seed");
    for cut in two_cuts(&m) {
        let set = split(&m, cut, &spec(), SplitOptions { frozen_device_layers: false, recompute: true }).unwrap();
        // Cut 0 leaves drop2 to the edge; cut 1 keeps both on the device.
        let edge_has_dropout = cut == 0;
        for (graph, reads) in [
            (&set.device_forward, true),
            (set.device_backward.as_ref().unwrap(), true),
            (&set.edge_step, edge_has_dropout),
        ] {
            let has = names(graph, true).iter().any(|n| n == "dropout_seed");
            assert_eq!(has, reads, "cut {cut}: {}", graph.graph.name);
        }
    }
    check("dropout_mlp", &m, &two_cuts(&m));
}

/// Models we did not write: every zoo fixture at two or more middle cuts, including every
/// cut where the part behind reads the shape of a front value that symbolic inference
/// cannot name (attention heads as `B·heads`, windows as `B·windows`, an activation whose
/// batch inference lost), which the split rebuilds from the activation's batch.
/// Fixtures whose every cut has side inputs (`unsplittable`: the part behind reads the
/// token ids as well, which the split does not send) are checked to be refused at each,
/// naming the input, so that a cut without side inputs found later gets its test.
macro_rules! zoo_split_tests {
    (unsplittable: [$($unsplittable:literal),*]; $($name:ident => $stem:expr, $cuts:expr;)*) => {
        $(#[test] fn $name() {
            let m = zoo($stem);
            let analysis = analyse(&m).unwrap();
            for cut in $cuts {
                let c = analysis.cuts.iter().find(|c| c.after_layer == cut).unwrap();
                assert!(c.side_inputs.is_empty(), "{} cut {cut} has side inputs {:?}", $stem, c.side_inputs);
            }
            check($stem, &m, &$cuts);
        })*

        #[test]
        fn every_zoo_fixture_has_a_split_test() {
            let tested: Vec<&str> = vec![$($stem),*];
            let unsplittable: Vec<&str> = vec![$($unsplittable),*];
            for stem in zoo_fixtures() {
                assert!(
                    tested.contains(&stem.as_str()) || unsplittable.contains(&stem.as_str()),
                    "{stem} has no split test"
                );
            }
            for stem in unsplittable {
                let m = zoo(stem);
                let analysis = analyse(&m).unwrap();
                assert!(!analysis.cuts.is_empty(), "{stem}");
                for c in &analysis.cuts {
                    assert!(!c.side_inputs.is_empty(), "{stem}: cut {} can be split now: give it a split test", c.after_layer);
                    let err = split(&m, c.after_layer, &spec(), SplitOptions::default()).unwrap_err();
                    let text = err.to_string();
                    assert!(
                        matches!(&err, RewriteError::SideInputs { splittable, .. } if splittable.is_empty())
                            && text.contains(&c.side_inputs[0])
                            && text.contains("this model has none"),
                        "{stem} cut {}: {text}",
                        c.after_layer
                    );
                }
            }
        }
    };
}

zoo_split_tests! {
    // GPT-2 and Llama classify from the last token that is not padding: the part behind
    // every cut reads the token ids too (as in frozen.rs).
    unsplittable: ["hf_gpt2.dynamo", "hf_gpt2.ts", "hf_llama.dynamo"];
    split_zoo_convnext_mini_dynamo => "convnext_mini.dynamo", [3, 5];
    split_zoo_efficientnet_b0_ts => "efficientnet_b0_025.ts", [13, 27];
    split_zoo_mobilenet_v3_small_dynamo => "mobilenet_v3_small_025.dynamo", [11, 22];
    split_zoo_mobilenet_v3_small_ts => "mobilenet_v3_small_025.ts", [11, 22];
    split_zoo_shufflenet_v2_mini_dynamo => "shufflenet_v2_mini.dynamo", [2, 4];
    split_zoo_squeezenet_mini_ts => "squeezenet_mini.ts", [2, 4];
    split_zoo_swin_mini_dynamo => "swin_mini.dynamo", [4, 8];
    split_zoo_swin_mini_ts => "swin_mini.ts", [2, 6];
    split_zoo_tfenc_bf_pre_gelu_ts => "tfenc_bf_pre_gelu.ts", [1, 2, 3];
    // The padding mask is read up to the second encoder layer's attention: the cuts in
    // front of it have the tokens as a side input.
    split_zoo_tfenc_bf_pre_gelu_mask_dynamo => "tfenc_bf_pre_gelu_mask.dynamo", [3, 4];
    split_zoo_tfenc_sf_post_relu_mask_ts => "tfenc_sf_post_relu_mask.ts", [6, 7];
    split_zoo_keras_cnn_tf2onnx => "keras_cnn.tf2onnx", [0, 1];
    split_zoo_ops_mini_ts => "ops_mini.ts", [0, 1];
    split_zoo_ops_mini_dynamo => "ops_mini.dynamo", [0, 1];
    split_zoo_resize_mini_ts => "resize_mini.ts", [0, 1];
    split_zoo_resize_mini_dynamo => "resize_mini.dynamo", [0, 1];
    split_zoo_seg_mini_ts => "seg_mini.ts", [1, 3];
    split_zoo_seg_mini_dynamo => "seg_mini.dynamo", [1, 3];
    split_zoo_hf_bert_ts => "hf_bert.ts", [3, 7];
    split_zoo_hf_roberta_dynamo => "hf_roberta.dynamo", [3, 7];
}

#[test]
fn a_cut_with_side_inputs_is_refused_naming_the_input_and_the_cuts_that_split() {
    // RoBERTa computes its position ids from the token ids, which the position embedding,
    // behind cut 0, reads.
    let m = zoo("hf_roberta.dynamo");
    let analysis = analyse(&m).unwrap();
    let ids = m.graph.inputs[0].name.clone();
    assert_eq!(analysis.cuts[0].side_inputs, std::slice::from_ref(&ids));
    let err = split(&m, 0, &spec(), SplitOptions::default()).unwrap_err();
    let RewriteError::SideInputs { cut, inputs, splittable } = &err else { panic!("{err}") };
    assert_eq!((*cut, inputs.as_slice()), (0, [ids].as_slice()));
    let expected: Vec<usize> =
        analysis.cuts.iter().filter(|c| c.side_inputs.is_empty()).map(|c| c.after_layer).collect();
    assert_eq!(splittable, &expected);
    assert!(err.to_string().contains(&format!("valid: {}", expected[0])), "{err}");
}

#[test]
fn the_freeze_aware_split_of_zoo_models_is_the_frozen_prefix_step() {
    for (stem, cuts) in [("tfenc_bf_pre_gelu.ts", [2, 3]), ("convnext_mini.dynamo", [3, 5])] {
        check_frozen(stem, &zoo(stem), &cuts);
    }
}

/// Every cut `analyse` (so `edgefreeze inspect`) lists without side inputs splits, on
/// every zoo fixture: a user never meets a cut that inspect offers for the split and the
/// split refuses; a cut with side inputs (marked so by inspect) is refused as such.
#[test]
fn every_listed_cut_of_every_zoo_fixture_splits() {
    let mut failures = Vec::new();
    for stem in zoo_fixtures() {
        let m = zoo(&stem);
        for c in analyse(&m).unwrap().cuts {
            match split(&m, c.after_layer, &spec(), SplitOptions::default()) {
                Err(RewriteError::SideInputs { .. }) if !c.side_inputs.is_empty() => {}
                Err(e) => failures.push(format!("{stem} cut {}: {e}", c.after_layer)),
                Ok(_) if !c.side_inputs.is_empty() => {
                    failures.push(format!("{stem} cut {}: split with side inputs", c.after_layer))
                }
                Ok(_) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
