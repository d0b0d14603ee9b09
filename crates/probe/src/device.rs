//! The device's own compute at each candidate cut: its forward, backward and update
//! graphs of the split (the graphs `edgefreeze device train` runs) on this device's
//! engine, timed on synthetic micro-batches of each size; and the per-layer times the
//! cost model reads, derived from the per-cut ones.

use crate::error::{ProbeError, Result};
use edgefreeze_device::compute::GraphDevice;
use edgefreeze_device::pipeline::{DeviceSide, MicroBatch};
use edgefreeze_device::split::{SplitSettings, device_graphs};
use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_plan::{Affine, LayerTimes};
use std::path::Path;
use std::time::Instant;

/// The device at one cut.
#[derive(Debug, Clone)]
pub struct DeviceCut {
    /// The cut.
    pub cut: usize,
    /// Whether its device side was frozen (no backward, no update).
    pub frozen: bool,
    /// The forward of one micro-batch.
    pub forward: Affine,
    /// The backward of one micro-batch (none when frozen).
    pub backward: Option<Affine>,
    /// The update (none when frozen).
    pub apply_s: Option<f64>,
    /// Bytes of the device's state at this cut (parameters, optimizer state, statistics).
    pub state_bytes: u64,
    /// The activation of one synthetic micro-batch of each size, for probing the edge.
    pub activations: Vec<(usize, Value)>,
    /// Its labels.
    pub labels: Vec<(usize, Value)>,
}

/// The device's graphs at one cut and a micro-batch for them, kept from timing the cut
/// so that the concurrent probe can run the device's compute beside the edge's.
pub struct DeviceLoad {
    /// The graphs (a copy of the weights of the probe's own: nothing is applied).
    pub device: GraphDevice,
    /// A synthetic micro-batch of the smallest size timed.
    pub batch: MicroBatch,
    /// Its samples.
    pub samples: usize,
    /// Whether the device side is frozen (a forward only).
    pub frozen: bool,
    /// Its forward's seconds alone (the fitted time at that size).
    pub forward_s: f64,
    /// Its backward's seconds alone (0 when frozen).
    pub backward_s: f64,
}

/// What timing the device needs.
pub struct DeviceSetup<'a> {
    /// The inference model file.
    pub model_path: &'a Path,
    /// The imported model.
    pub model: &'a edgefreeze_graph::Model,
    /// Loss and optimizer, as `edgefreeze train` spells them.
    pub loss: &'a str,
    /// The optimizer.
    pub optimizer: &'a str,
    /// The device's engine.
    pub engine: &'a EngineKind,
    /// Its settings.
    pub engine_options: &'a EngineOptions,
}

/// The upper median (of an even count, the larger middle value).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times the device side of the split at `cut` on micro-batches of each of `sizes`,
/// `reps` times each after one untimed round (median of the repetitions); with the
/// graphs kept for the concurrent probe.
pub fn time_cut(
    setup: &DeviceSetup,
    cut: usize,
    frozen: bool,
    sizes: &[usize],
    reps: usize,
) -> Result<(DeviceCut, DeviceLoad)> {
    let device_error = |source| ProbeError::Device { cut, source };
    let split = SplitSettings { cut, micro_batches: 1, sequential: false, recompute: false, freeze_device: frozen };
    let graphs = device_graphs(setup.model_path, &split, setup.loss, setup.optimizer).map_err(device_error)?;
    let state_bytes = graphs.state.iter().map(|(_, v)| value_bytes(v)).sum();
    let input =
        setup.model.graph.inputs.first().map(|v| v.name.clone()).ok_or_else(|| ProbeError::Model {
            path: setup.model_path.into(),
            message: "the model has no input".into(),
        })?;
    let mut device = GraphDevice::new(graphs, &input, setup.engine, setup.engine_options).map_err(device_error)?;
    let mut batches = Vec::new();
    for &n in sizes {
        let (input, labels) = edgefreeze_train::bench::synthetic_batch(setup.model, n)
            .map_err(|e| ProbeError::Model { path: setup.model_path.into(), message: e.to_string() })?;
        batches.push(MicroBatch { input, labels, dropout_seed: Some(n as i64) });
    }
    let (mut forward, mut backward) = (vec![Vec::new(); sizes.len()], vec![Vec::new(); sizes.len()]);
    let (mut apply, mut activations) = (Vec::new(), Vec::new());
    for rep in 0..=reps.max(1) {
        for (i, mb) in batches.iter().enumerate() {
            let t = Instant::now();
            let (activation, stash) = device.forward(mb).map_err(device_error)?;
            let f = t.elapsed().as_secs_f64();
            if !frozen {
                let grad = small_like(&activation);
                let t = Instant::now();
                device.backward(stash, grad, 1.0).map_err(device_error)?;
                if rep > 0 {
                    backward[i].push(t.elapsed().as_secs_f64());
                }
            }
            if rep > 0 {
                forward[i].push(f);
            } else {
                activations.push((sizes[i], activation));
            }
        }
        if !frozen {
            // A learning rate of 0: the probe's copy of the weights stays as it was.
            let t = Instant::now();
            device.apply(0.0, rep as u64 + 1).map_err(device_error)?;
            if rep > 0 {
                apply.push(t.elapsed().as_secs_f64());
            }
        }
    }
    let fit = |times: Vec<Vec<f64>>| {
        let points: Vec<(f64, f64)> = sizes.iter().zip(times).map(|(&n, t)| (n as f64, median(t))).collect();
        Affine::fit(&points).ok_or_else(|| ProbeError::Config(format!("cut {cut}: no usable device times")))
    };
    let labels = sizes.iter().zip(&batches).map(|(&n, mb)| (n, mb.labels.clone())).collect();
    let forward = fit(forward)?;
    let backward = if frozen { None } else { Some(fit(backward)?) };
    let smallest =
        (0..sizes.len()).min_by_key(|&i| sizes[i]).ok_or_else(|| ProbeError::Config("no size to time".into()))?;
    let samples = sizes[smallest];
    let load = DeviceLoad {
        device,
        batch: batches.swap_remove(smallest),
        samples,
        frozen,
        forward_s: forward.at(samples as f64),
        backward_s: backward.map_or(0.0, |b| b.at(samples as f64)),
    };
    let cut_times = DeviceCut {
        cut,
        frozen,
        forward,
        backward,
        apply_s: (!frozen).then(|| median(apply)),
        state_bytes,
        activations,
        labels,
    };
    Ok((cut_times, load))
}

/// Bytes of a value's elements.
pub fn value_bytes(v: &Value) -> u64 {
    let size = match v {
        Value::F32(_) => 4,
        Value::F64(_) | Value::I64(_) => 8,
        Value::Bool(_) => 1,
    };
    v.shape().iter().product::<usize>() as u64 * size
}

/// A gradient for the backward: the activation's shape, every element 1e-3 (the time
/// does not depend on the values; small ones keep every number finite).
pub(crate) fn small_like(v: &Value) -> Value {
    match v {
        Value::F64(a) => Value::F64(a.mapv(|_| 1e-3)),
        other => Value::F32(ndarray::ArrayD::from_elem(other.shape(), 1e-3)),
    }
}

/// Per-layer values from cumulative ones: `at[j] = (cut, total over layers 0..=cut)`.
/// Each span between two measured cuts gets the increase of the total (never negative:
/// a total below an earlier one is noise, held at the earlier one), shared among its
/// layers in proportion to their FLOPs (evenly when they have none). Layers behind the
/// last measured cut get 0: no candidate puts them on the device.
pub fn spread(at: &[(usize, f64)], flops: &[u64]) -> Vec<f64> {
    let mut per_layer = vec![0.0; flops.len()];
    let mut sorted: Vec<(usize, f64)> = at.to_vec();
    sorted.sort_by_key(|&(c, _)| c);
    let (mut first, mut before) = (0usize, 0.0f64);
    for (cut, total) in sorted {
        let total = total.max(before);
        let span = first..(cut + 1).min(flops.len());
        let weight: u64 = flops[span.clone()].iter().sum();
        let count = span.len().max(1) as f64;
        for i in span {
            per_layer[i] =
                if weight > 0 { (total - before) * flops[i] as f64 / weight as f64 } else { (total - before) / count };
        }
        first = cut + 1;
        before = total;
    }
    per_layer
}

/// The cost model's per-layer device times from the cuts' times.
pub fn layer_times(cuts: &[DeviceCut], flops: &[u64]) -> (Vec<LayerTimes>, [f64; 3]) {
    let forward = spread(&cuts.iter().map(|c| (c.cut, c.forward.per_sample_s)).collect::<Vec<_>>(), flops);
    let trained: Vec<&DeviceCut> = cuts.iter().filter(|c| !c.frozen).collect();
    let backward =
        spread(&trained.iter().filter_map(|c| c.backward.map(|b| (c.cut, b.per_sample_s))).collect::<Vec<_>>(), flops);
    let apply = spread(&trained.iter().filter_map(|c| c.apply_s.map(|a| (c.cut, a))).collect::<Vec<_>>(), flops);
    // A run's fixed cost grows with the nodes it runs: what every cut pays is the call's,
    // what a deeper cut pays more is spread over the layers in front of it, evenly (a
    // layer's nodes, not its FLOPs, cost per run), so that each probed cut gets its own.
    let forward_fixed: Vec<(usize, f64)> = cuts.iter().map(|c| (c.cut, c.forward.fixed_s)).collect();
    let backward_fixed: Vec<(usize, f64)> =
        trained.iter().filter_map(|c| c.backward.map(|b| (c.cut, b.fixed_s))).collect();
    let least = |v: &[(usize, f64)]| v.iter().map(|&(_, t)| t).reduce(f64::min).unwrap_or(0.0);
    let (forward_base, backward_base) = (least(&forward_fixed), least(&backward_fixed));
    let evenly = vec![1u64; flops.len()];
    let above = |v: &[(usize, f64)], base: f64| v.iter().map(|&(c, t)| (c, t - base)).collect::<Vec<_>>();
    let forward_calls = spread(&above(&forward_fixed, forward_base), &evenly);
    let backward_calls = spread(&above(&backward_fixed, backward_base), &evenly);
    let call_s = [forward_base, backward_base, 0.0];
    let layers = (0..flops.len())
        .map(|i| LayerTimes {
            forward_s: forward[i],
            backward_s: backward[i],
            apply_s: apply[i],
            forward_call_s: forward_calls[i],
            backward_call_s: backward_calls[i],
        })
        .collect();
    (layers, call_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cumulative_times_spread_over_layers_by_flops() {
        // Cuts after layers 1 and 4 of 6; totals 3 and 7 (then 6: noise, held at 7).
        let per_layer = spread(&[(4, 7.0), (1, 3.0), (5, 6.0)], &[1, 2, 0, 3, 1, 4]);
        assert_eq!(per_layer, vec![1.0, 2.0, 0.0, 3.0, 1.0, 0.0]);
        // No FLOPs in a span: shared evenly; nothing measured: zeros.
        assert_eq!(spread(&[(1, 4.0)], &[0, 0, 5]), vec![2.0, 2.0, 0.0]);
        assert_eq!(spread(&[], &[1, 1]), vec![0.0, 0.0]);
    }

    fn cut(cut: usize, forward: (f64, f64), backward: (f64, f64)) -> DeviceCut {
        DeviceCut {
            cut,
            frozen: false,
            forward: Affine { fixed_s: forward.0, per_sample_s: forward.1 },
            backward: Some(Affine { fixed_s: backward.0, per_sample_s: backward.1 }),
            apply_s: Some(0.0),
            state_bytes: 0,
            activations: Vec::new(),
            labels: Vec::new(),
        }
    }

    #[test]
    fn every_probed_cut_keeps_its_own_fixed_cost_per_run() {
        // Cuts after layers 0, 2 and 3 of 5: a forward run costs 2, 5 and 6 ms whatever
        // its size, a backward 3, 4 and 9.
        let cuts = [cut(0, (2.0, 1.0), (3.0, 1.0)), cut(2, (5.0, 3.0), (4.0, 2.0)), cut(3, (6.0, 4.0), (9.0, 5.0))];
        let (layers, [forward_call, backward_call, _]) = layer_times(&cuts, &[1, 1, 1, 1, 1]);
        assert_eq!((forward_call, backward_call), (2.0, 3.0), "what every cut pays");
        for c in &cuts {
            let front = &layers[..=c.cut];
            let fixed = forward_call + front.iter().map(|l| l.forward_call_s).sum::<f64>();
            let per_sample: f64 = front.iter().map(|l| l.forward_s).sum();
            assert_eq!((fixed, per_sample), (c.forward.fixed_s, c.forward.per_sample_s), "forward at cut {}", c.cut);
            let fixed = backward_call + front.iter().map(|l| l.backward_call_s).sum::<f64>();
            assert_eq!(fixed, c.backward.unwrap().fixed_s, "backward at cut {}", c.cut);
        }
        // Between probed cuts the excess is spread evenly over the layers (1.5 each for
        // layers 1 and 2), and nothing past the last probed cut.
        assert_eq!(layers.iter().map(|l| l.forward_call_s).collect::<Vec<_>>(), vec![0.0, 1.5, 1.5, 1.0, 0.0]);
    }
}
