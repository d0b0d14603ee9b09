//! Frozen-prefix steps, probes and the cached-activation pair, each against the graph it
//! replaces, on ONNX Runtime and tract; the cached pair also on every zoo fixture.

mod common;

use common::{batch_of, distance, engines, floats, model, run, state_of, zoo, zoo_fixtures};
use edgefreeze_autodiff::artifacts::{Role, convert};
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec, training_step_graph};
use edgefreeze_engine::Value;
use edgefreeze_graph::analyse;
use edgefreeze_rewrite::{
    ACTIVATION, RewriteError, StepSpec, frozen_prefix_step, prefix_graph, probe_name, suffix_step,
    suffix_step_with_probes,
};
use std::collections::HashMap;

/// Relative agreement of two graphs that compute the same f32 operations on the same
/// values: they differ only where an engine orders a reduction differently in one graph
/// than in the other, which moves a result by a few units in the last place of f32
/// (2⁻²⁴ ≈ 6·10⁻⁸) times the square root of the reduction length (≤ 3136 here, the
/// weight gradient of the first convolution over a batch of 4 at 28×28): ≈ 4·10⁻⁶; the
/// bound allows a factor of 5 over that.
const SAME_OPS: f64 = 2e-5;

fn spec() -> StepSpec {
    StepSpec { loss: Loss::cross_entropy(), optimizer: sgd() }
}

fn sgd() -> Optimizer {
    Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 }
}

fn inputs(m: &edgefreeze_graph::Model) -> Vec<String> {
    m.graph.inputs.iter().map(|v| v.name.clone()).collect()
}

fn outputs(m: &edgefreeze_graph::Model) -> Vec<String> {
    m.graph.outputs.iter().map(|v| v.name.clone()).collect()
}

fn count(m: &edgefreeze_graph::Model, op: &str) -> usize {
    m.graph.nodes.iter().filter(|n| n.op_type == op).count()
}

/// Asserts agreement; returns the relative difference.
fn assert_close(what: &str, a: &Value, b: &Value, tolerance: f64) -> f64 {
    let (diff, norm) = distance(&floats(a), &floats(b));
    assert!(diff <= tolerance * norm + 1e-7, "{what}: differs by {diff:.3e} (norm {norm:.3e})");
    if norm > 0.0 { diff / norm } else { 0.0 }
}

#[test]
fn no_frozen_layers_is_the_ordinary_training_step() {
    let m = model("resnet20_28.onnx");
    let step = frozen_prefix_step(&m, &spec(), 0, &[]).unwrap();
    let plain = training_step_graph(&m, &TrainingSpec { loss: spec().loss, optimizer: sgd(), frozen: vec![] }).unwrap();
    assert_eq!(step.graph.nodes.len(), plain.graph.nodes.len());
    assert_eq!(inputs(&step), inputs(&plain));
    assert_eq!(outputs(&step), outputs(&plain));
}

#[test]
fn convert_and_train_freeze_build_the_frozen_prefix_step() {
    let m = model("resnet20_28.onnx");
    let training = TrainingSpec { loss: spec().loss, optimizer: sgd(), frozen: vec![] };
    let artifacts = convert(&m, "test", &training, 3, ("ce", "sgd", 0.1)).unwrap();
    let step = frozen_prefix_step(&m, &spec(), 3, &[]).unwrap();
    assert_eq!(artifacts.train_step.graph.nodes.len(), step.graph.nodes.len());
    assert_eq!(inputs(&artifacts.train_step), inputs(&step));
    assert_eq!(outputs(&artifacts.train_step), outputs(&step));
    // Every input the step reads from the state is in the manifest's state.
    let state: Vec<&str> = artifacts.manifest.state.iter().map(|e| e.name.as_str()).collect();
    for input in inputs(&step).iter().filter(|i| m.graph.initializers.contains_key(*i)) {
        assert!(state.contains(&input.as_str()), "{input} is not in the state");
    }
}

#[test]
fn frozen_layers_have_no_backward_no_update_and_read_their_parameters_as_inputs() {
    let m = model("resnet20_28.onnx");
    let analysis = analyse(&m).unwrap();
    let full = frozen_prefix_step(&m, &spec(), 0, &[]).unwrap();
    let mut previous = full.graph.nodes.len();
    for k in [1, 4, analysis.layers.len() - 1] {
        let step = frozen_prefix_step(&m, &spec(), k, &[]).unwrap();
        assert!(
            step.graph.nodes.len() < previous,
            "K={k}: {} nodes, not fewer than {previous}",
            step.graph.nodes.len()
        );
        previous = step.graph.nodes.len();
        let ins = inputs(&step);
        let outs = outputs(&step);
        for layer in &analysis.layers[..k] {
            for p in layer.parameter_names.iter().chain(&layer.buffer_names) {
                assert!(ins.contains(p), "K={k}: {p} is not an input");
                assert!(!outs.contains(&format!("updated.{p}")), "K={k}: {p} is updated");
                assert!(!ins.contains(&format!("momentum.{p}")), "K={k}: {p} has optimizer state");
            }
            // Nothing differentiates a frozen node.
            for &i in &layer.nodes {
                let prefix = format!("grad/{}/", m.graph.nodes[i].name);
                assert!(step.graph.nodes.iter().all(|n| !n.name.starts_with(&prefix)), "K={k}: {prefix}");
            }
        }
        for layer in &analysis.layers[k..] {
            for p in layer.parameter_names.iter().chain(&layer.buffer_names) {
                assert!(outs.contains(&format!("updated.{p}")), "K={k}: {p} is not updated");
            }
        }
        assert!(step.graph.initializers.keys().all(|k| !m.graph.initializers.contains_key(k)
            || m.graph.initializers[k].dtype() == edgefreeze_graph::DataType::Int64));
    }
    // The first layer's input gradient is never built; with K = 4 the first four
    // convolutions' weight and input gradients are gone (an input gradient is a
    // ConvTranspose, or a Conv with the flipped kernel; the forward's Convs are the same).
    let four = frozen_prefix_step(&m, &spec(), 4, &[]).unwrap();
    let convolutions = |g: &edgefreeze_graph::Model| count(g, "Conv") + count(g, "ConvTranspose");
    assert!(convolutions(&four) < convolutions(&full));
    assert!(count(&four, "BatchNormalization") == 0 && count(&full, "BatchNormalization") == 0);
}

#[test]
fn frozen_batchnorm_runs_on_running_statistics_so_a_sample_does_not_depend_on_its_batch() {
    let m = model("resnet20_28.onnx");
    let step = frozen_prefix_step(&m, &spec(), 2, &[0, 1, 2]).unwrap();
    assert!(outputs(&step).ends_with(&[probe_name(0), probe_name(1), probe_name(2)]));
    let state = state_of(&m);
    for (engine, kind) in engines() {
        let run_on = |first, batch| {
            let mut given = state.clone();
            given.extend(batch_of(&m, first, batch));
            run(&kind, &step, &given)
        };
        let four = run_on(0, 4);
        let two = run_on(0, 2);
        for l in [0, 1] {
            // Frozen: the first two samples' activations are the same in a batch of 2 and of 4.
            let a = floats(&four[&probe_name(l)]);
            let b = floats(&two[&probe_name(l)]);
            let (diff, norm) = distance(&a[..b.len()], &b);
            assert!(diff <= SAME_OPS * norm, "{engine}: probe {l} depends on the batch ({diff:.2e} of {norm:.2e})");
        }
        // Trained in training mode: layer 2's BatchNorm normalises over the batch.
        let a = floats(&four[&probe_name(2)]);
        let b = floats(&two[&probe_name(2)]);
        let (diff, norm) = distance(&a[..b.len()], &b);
        assert!(diff > 1e-3 * norm, "{engine}: layer 2 should see batch statistics");
    }
}

#[test]
fn probes_are_the_activations_of_the_training_forward() {
    let m = model("lenet5.onnx");
    let analysis = analyse(&m).unwrap();
    let probes: Vec<usize> = (0..analysis.layers.len()).collect();
    let step = frozen_prefix_step(&m, &spec(), 1, &probes).unwrap();
    let plain = frozen_prefix_step(&m, &spec(), 1, &[]).unwrap();
    // Probes add outputs, not computation.
    let computing = |m: &edgefreeze_graph::Model| m.graph.nodes.iter().filter(|n| n.op_type != "Identity").count();
    assert_eq!(computing(&step), computing(&plain));
    let mut given = state_of(&m);
    given.extend(batch_of(&m, 0, 3));
    for (engine, kind) in engines() {
        let out = run(&kind, &step, &given);
        let base = run(&kind, &plain, &given);
        assert_eq!(floats(&out["loss"]), floats(&base["loss"]), "{engine}");
        for (l, layer) in analysis.layers.iter().enumerate() {
            let probe = &out[&probe_name(l)];
            let dims: Vec<usize> = layer.output_shape.iter().skip(1).map(|d| d.fixed().unwrap()).collect();
            assert_eq!(&probe.shape()[1..], &dims[..], "{engine}: probe {l}");
        }
    }
    let err = frozen_prefix_step(&m, &spec(), 0, &[analysis.layers.len()]).unwrap_err();
    assert!(matches!(err, RewriteError::Probe { .. }), "{err}");
}

/// Prefix then suffix against the frozen step with K = cut + 1, on every output (a
/// bundled model).
fn check_cached_pair(file: &str, cuts: &[usize], batch: usize) {
    check_cached_pair_of(file, &model(file), cuts, batch);
}

/// Prefix then suffix against the frozen step with K = cut + 1, on every output.
fn check_cached_pair_of(file: &str, m: &edgefreeze_graph::Model, cuts: &[usize], batch: usize) {
    let state = state_of(m);
    let mut worst: f64 = 0.0;
    for &cut in cuts {
        // Probes of the layers behind the cut: the same values from both.
        let behind: Vec<usize> = (cut + 1..analyse(m).unwrap().layers.len()).collect();
        let frozen = frozen_prefix_step(m, &spec(), cut + 1, &behind).unwrap();
        let prefix = prefix_graph(m, cut).unwrap();
        let suffix = suffix_step_with_probes(m, cut, &spec(), &behind).unwrap();
        assert_eq!(outputs(&suffix_step(m, cut, &spec()).unwrap()).len() + behind.len(), outputs(&suffix).len());
        let err = suffix_step_with_probes(m, cut, &spec(), &[cut]).unwrap_err();
        assert!(matches!(err, RewriteError::Probe { .. }), "a probe in front of the cut: {err}");
        assert_eq!(outputs(&prefix), [ACTIVATION]);
        assert!(inputs(&suffix).contains(&ACTIVATION.to_string()));
        for (engine, kind) in engines() {
            let mut given = state.clone();
            given.extend(batch_of(m, 0, batch));
            let expected = run(&kind, &frozen, &given);
            let activation = run(&kind, &prefix, &given).remove(ACTIVATION).unwrap();
            given.insert(ACTIVATION.into(), activation);
            let got = run(&kind, &suffix, &given);
            for name in outputs(&suffix) {
                let what = format!("{file} cut {cut} on {engine}: {name}");
                worst = worst.max(assert_close(&what, &got[&name], &expected[&name], SAME_OPS));
            }
            // The suffix updates exactly what the frozen step updates.
            let mut a = outputs(&suffix);
            let mut b = outputs(&frozen);
            a.sort();
            b.sort();
            assert_eq!(a, b, "{file} cut {cut}");
        }
    }
    eprintln!("{file}: largest relative difference {worst:.2e} (bound {SAME_OPS:.0e})");
}

#[test]
fn prefix_then_suffix_is_the_frozen_step_resnet20() {
    check_cached_pair("resnet20_28.onnx", &[0, 3, 9], 4);
}

#[test]
fn prefix_then_suffix_is_the_frozen_step_transformer() {
    let m = model("transformer_text.onnx");
    let cuts: Vec<usize> = analyse(&m).unwrap().cuts.iter().map(|c| c.after_layer).collect();
    check_cached_pair("transformer_text.onnx", &[cuts[0], cuts[cuts.len() / 2]], 3);
}

#[test]
fn prefix_then_suffix_is_the_frozen_step_when_the_back_reads_the_batch_size() {
    // Exported by dynamo: the flatten before the classifier reads Shape(input).
    let m = model("lenet5_dynamo.onnx");
    let last = analyse(&m).unwrap().cuts.last().unwrap().after_layer;
    check_cached_pair("lenet5_dynamo.onnx", &[0, last], 3);
}

#[test]
fn invalid_cuts_and_depths_are_errors_that_say_what_is_valid() {
    let m = model("lenet5.onnx");
    let analysis = analyse(&m).unwrap();
    let layers = analysis.layers.len();
    let err = prefix_graph(&m, layers + 3).unwrap_err();
    let valid: Vec<usize> = analysis.cuts.iter().map(|c| c.after_layer).collect();
    assert!(matches!(&err, RewriteError::Cut { valid: v, .. } if *v == valid), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("{}", layers + 3)) && text.contains(&format!("{}", valid[0])), "{text}");
    assert!(suffix_step(&m, layers - 1, &spec()).is_err(), "the last layer has no cut after it");
    let err = frozen_prefix_step(&m, &spec(), layers + 1, &[]).unwrap_err();
    assert_eq!(err.to_string(), format!("cannot freeze {} layers: the model has {layers}", layers + 1));
    // K = all layers is valid: nothing trains.
    let all = frozen_prefix_step(&m, &spec(), layers, &[]).unwrap();
    assert!(outputs(&all).iter().all(|o| !o.starts_with("updated.")));
}

#[test]
fn every_state_tensor_has_a_layer_and_roles_keep_their_json_names() {
    let m = model("resnet20_28.onnx");
    let spec = TrainingSpec { loss: Loss::cross_entropy(), optimizer: sgd(), frozen: vec![] };
    let artifacts = convert(&m, "test", &spec, 2, ("ce", "sgd", 0.1)).unwrap();
    let analysis = analyse(&m).unwrap();
    let mut roles = HashMap::new();
    for entry in &artifacts.manifest.state {
        let layer = entry.layer.unwrap_or_else(|| panic!("{} has no layer", entry.name));
        if entry.role == Role::Buffer {
            assert!(analysis.layers[layer].buffer_names.contains(&entry.name));
        }
        *roles.entry(entry.role).or_insert(0) += 1;
    }
    assert_eq!(roles.len(), 4, "{roles:?}");
    let json = serde_json::to_value(&artifacts.manifest).unwrap();
    let names: Vec<&str> = json["state"].as_array().unwrap().iter().map(|s| s["role"].as_str().unwrap()).collect();
    for role in ["parameter", "frozen", "optimizer", "buffer"] {
        assert!(names.contains(&role), "{role}");
    }
    assert!(json["state"][0].get("side").is_none(), "no side outside split manifests");
}

/// Models we did not write (tests/fixtures/zoo, both exporters): prefix then suffix is
/// the frozen step at the first cut and a middle one, on both engines. Where a cut has
/// side inputs (GPT-2, Llama, the padding masks) the suffix reads the token ids too.
macro_rules! zoo_cached_pair_tests {
    ($($name:ident => $stem:literal;)*) => {
        $(#[test] fn $name() {
            let m = zoo($stem);
            let cuts: Vec<usize> = analyse(&m).unwrap().cuts.iter().map(|c| c.after_layer).collect();
            check_cached_pair_of($stem, &m, &[cuts[0], cuts[cuts.len() / 2]], 3);
        })*

        #[test]
        fn every_zoo_fixture_has_a_cached_pair_test() {
            let tested = [$($stem),*];
            for stem in zoo_fixtures() {
                assert!(tested.contains(&stem.as_str()), "{stem} has no cached-pair test");
            }
        }
    };
}

zoo_cached_pair_tests! {
    cached_pair_zoo_convnext_mini_dynamo => "convnext_mini.dynamo";
    cached_pair_zoo_efficientnet_b0_ts => "efficientnet_b0_025.ts";
    cached_pair_zoo_mobilenet_v3_small_dynamo => "mobilenet_v3_small_025.dynamo";
    cached_pair_zoo_mobilenet_v3_small_ts => "mobilenet_v3_small_025.ts";
    cached_pair_zoo_shufflenet_v2_mini_dynamo => "shufflenet_v2_mini.dynamo";
    cached_pair_zoo_squeezenet_mini_ts => "squeezenet_mini.ts";
    cached_pair_zoo_swin_mini_dynamo => "swin_mini.dynamo";
    cached_pair_zoo_swin_mini_ts => "swin_mini.ts";
    cached_pair_zoo_tfenc_bf_pre_gelu_ts => "tfenc_bf_pre_gelu.ts";
    cached_pair_zoo_tfenc_bf_pre_gelu_mask_dynamo => "tfenc_bf_pre_gelu_mask.dynamo";
    cached_pair_zoo_tfenc_sf_post_relu_mask_ts => "tfenc_sf_post_relu_mask.ts";
    cached_pair_zoo_keras_cnn_tf2onnx => "keras_cnn.tf2onnx";
    cached_pair_zoo_ops_mini_ts => "ops_mini.ts";
    cached_pair_zoo_ops_mini_dynamo => "ops_mini.dynamo";
    cached_pair_zoo_resize_mini_ts => "resize_mini.ts";
    cached_pair_zoo_resize_mini_dynamo => "resize_mini.dynamo";
    cached_pair_zoo_seg_mini_ts => "seg_mini.ts";
    cached_pair_zoo_seg_mini_dynamo => "seg_mini.dynamo";
    cached_pair_zoo_hf_bert_ts => "hf_bert.ts";
    cached_pair_zoo_hf_roberta_dynamo => "hf_roberta.dynamo";
    cached_pair_zoo_hf_gpt2_dynamo => "hf_gpt2.dynamo";
    cached_pair_zoo_hf_gpt2_ts => "hf_gpt2.ts";
    cached_pair_zoo_hf_llama_dynamo => "hf_llama.dynamo";
}

#[test]
fn a_suffix_behind_a_cut_with_side_inputs_takes_them_and_the_manifest_says_so() {
    // GPT-2 reads the token ids at its very end (the last real token's logits).
    let m = zoo("hf_gpt2.dynamo");
    let analysis = analyse(&m).unwrap();
    let ids = m.graph.inputs[0].name.clone();
    let cut = &analysis.cuts[0];
    assert_eq!(cut.side_inputs, std::slice::from_ref(&ids));
    let pair = edgefreeze_rewrite::cached_pair(&m, cut.after_layer, &spec()).unwrap();
    let suffix_inputs = inputs(&pair.suffix_step);
    assert!(suffix_inputs.contains(&ids) && suffix_inputs.contains(&ACTIVATION.to_string()));
    let side: Vec<&str> = pair.manifest.side_inputs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(side, [ids.as_str()]);
    assert_eq!(pair.manifest.side_inputs[0].dtype, "i64");
    // A cut without side inputs reads the activation alone.
    let bert = zoo("hf_bert.ts");
    let pair = edgefreeze_rewrite::cached_pair(&bert, analyse(&bert).unwrap().cuts[0].after_layer, &spec()).unwrap();
    assert!(pair.manifest.side_inputs.is_empty());
    assert!(!inputs(&pair.suffix_step).iter().any(|i| bert.graph.inputs.iter().any(|v| &v.name == i)));
}
