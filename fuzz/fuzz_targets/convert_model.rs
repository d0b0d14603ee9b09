//! Fuzzes `convert` (gradient, training-step and eval graph building) on models the
//! loader accepts. Any panic is a bug: a model that loads must convert or fail with an
//! error, and what convert builds must be a well-formed graph.
//!
//! Input: one byte of settings (bits 0–1 the loss, 2–3 the optimizer, 4–7 the layers to
//! freeze), then an ONNX model. Float initializers stored without data are filled with
//! small numbers before loading: the seeds (`seeds_convert/`, written by
//! `tools/fuzz_seeds.py`) are the bundled models stripped of their weights, which keeps
//! them small and points the mutations at the graph's structure, the only thing that
//! steers graph building.
#![no_main]

use edgefreeze_autodiff::artifacts::convert;
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tract_onnx::pb;

/// Weights filled in per model, at most (a mutated dimension must not exhaust memory).
const MAX_FILLED: usize = 1 << 22;
const FLOAT: i32 = 1;

fuzz_target!(|data: &[u8]| {
    let Some((&settings, bytes)) = data.split_first() else { return };
    let Ok(mut proto) = pb::ModelProto::decode(bytes) else { return };
    let Some(graph) = proto.graph.as_mut() else { return };
    let mut budget = MAX_FILLED;
    for t in &mut graph.initializer {
        fill(t, &mut budget);
    }
    let Ok(model) = edgefreeze_graph::load::model_from_proto(proto, None) else { return };
    let Ok(model) = edgefreeze_graph::prepare(model) else { return };

    let loss = match settings & 3 {
        0 | 3 => Loss::CrossEntropy { label_smoothing: 0.0 },
        1 => Loss::CrossEntropy { label_smoothing: 0.1 },
        _ => Loss::MeanSquaredError,
    };
    let optimizer = match (settings >> 2) & 3 {
        0 => Optimizer::Sgd { momentum: 0.0, nesterov: false, weight_decay: 0.0 },
        1 => Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 },
        2 => Optimizer::Sgd { momentum: 0.9, nesterov: true, weight_decay: 0.0 },
        _ => Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
    };
    let freeze = usize::from(settings >> 4);
    let spec = TrainingSpec { loss, optimizer, frozen: Vec::new() };
    let Ok(artifacts) = convert(&model, "fuzz", &spec, freeze, ("fuzz", "fuzz", 0.1)) else { return };

    // What convert builds must read back as a graph whose every input is produced.
    for (name, built) in [("train step", &artifacts.train_step), ("eval", &artifacts.eval), ("gradient", &artifacts.gradient)]
    {
        let bytes = edgefreeze_graph::save::encode_model(built);
        let mut back = edgefreeze_graph::parse_model(&bytes, None)
            .unwrap_or_else(|e| panic!("the {name} graph does not load back: {e}"));
        edgefreeze_graph::sort::sort_topologically(&mut back.graph)
            .unwrap_or_else(|e| panic!("the {name} graph is not well formed: {e}"));
    }
    let _ = edgefreeze_autodiff::artifacts::state_to_safetensors(&artifacts.state);
});

/// Gives a float tensor stored without data (and not outside the file) small values.
fn fill(t: &mut pb::TensorProto, budget: &mut usize) {
    let empty = t.raw_data.is_empty() && t.float_data.is_empty() && t.external_data.is_empty();
    if t.data_type != FLOAT || !empty {
        return;
    }
    let Some(n) = t.dims.iter().try_fold(1usize, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)))
    else {
        return;
    };
    if n > *budget {
        return;
    }
    *budget -= n;
    t.raw_data = (0..n as u32)
        .flat_map(|i| ((i.wrapping_mul(2_654_435_761) >> 16) as f32 / 65536.0 - 0.5).to_le_bytes())
        .collect();
}
