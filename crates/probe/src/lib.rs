//! Probing for the EdgeMove planner: what the cost model of `edgefreeze-plan` needs,
//! measured for real before training.
//!
//! - **The device** ([`device`]): at each candidate cut, the device's graphs of the
//!   split (forward; backward and update unless its side is frozen) on its engine,
//!   timed on synthetic micro-batches of each candidate size; per-layer times follow
//!   from the per-cut ones ([`device::spread`]).
//! - **Each link** ([`link`]): `Probe` calls with payloads of the sizes training sends
//!   (the activation and labels of a micro-batch at each cut up, its gradient down): the
//!   round-trip time and the bandwidth each way.
//! - **Each edge server at each cut** ([`edge`]): a session of the split, a few real
//!   micro-batches (the device forward's activations) one at a time, the edge's own
//!   timestamps from each reply; then the concurrent probe (the device computing on its
//!   own thread while the edge steps, each side's time under overlap measured: the cost
//!   model's overlap factors); then the session is closed without an update.
//!
//! The probe is bounded: past its budget it measures nothing new and says what it
//! skipped (a cut not measured on the device is no candidate; a server not measured at a
//! cut has no candidate there), and its report says how long each part took. A server
//! that cannot be reached is skipped with its error; if none is left, probing fails.

pub mod adapt;
pub mod device;
pub mod edge;
mod error;
pub mod link;

pub use error::{ProbeError, Result};

use edgefreeze_engine::{EngineKind, EngineOptions, Value};
use edgefreeze_plan::{CutBytes, DeviceTimes, Measurements, ServerTimes};
use edgefreeze_wire::auth::Credentials;
use std::path::Path;
use std::time::{Duration, Instant};

/// An edge server to probe.
#[derive(Debug, Clone)]
pub struct Target {
    /// `HOST:PORT` or `http://HOST:PORT`.
    pub address: String,
    /// The device's credentials there.
    pub credentials: Credentials,
}

/// How to probe.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// Samples per training step.
    pub batch: usize,
    /// The micro-batch counts the planner will consider: the probe times the smallest
    /// and the largest micro-batch they make.
    pub micro_batches: Vec<usize>,
    /// The cuts to consider (`None`: every valid cut).
    pub cuts: Option<Vec<usize>>,
    /// Layers [0, frozen_layers) are frozen: cuts inside the prefix are probed with a
    /// frozen device side.
    pub frozen_layers: usize,
    /// The loss, as `edgefreeze train --loss` spells it.
    pub loss: String,
    /// The optimizer, as `edgefreeze train --optimizer` spells it.
    pub optimizer: String,
    /// The device's engine.
    pub engine: EngineKind,
    /// Its settings.
    pub engine_options: EngineOptions,
    /// Timed repetitions of each device and edge measurement (after one untimed).
    pub reps: usize,
    /// Timed repetitions of each link measurement.
    pub link_reps: usize,
    /// Time after which nothing new is measured.
    pub budget: Duration,
    /// Link payloads are capped at this many bytes.
    pub max_payload_bytes: u64,
    /// A server that does not answer a call or a micro-batch within this long is skipped.
    pub timeout: Duration,
    /// Edge update speed, bytes of session state per second; `None`: one update timed on
    /// each edge at each cut (`edge::time_cut`).
    pub apply_bytes_per_s: Option<f64>,
    /// Whether to run the concurrent probe at each (server, cut) (without it, the cost
    /// model's default overlap factors apply).
    pub concurrent: bool,
    /// The device operations the concurrent probe wants at least at each (server, cut):
    /// where its run gave fewer, a second session runs more micro-batches
    /// ([`edge::MORE`]).
    pub min_device_ops: usize,
}

impl ProbeSettings {
    /// Defaults: M ∈ {1, 2, 4, 8, 16} (those the batch allows), every cut, nothing frozen,
    /// cross-entropy and SGD, tract, 3 repetitions (5 for links), 120 s, 16 MiB payloads,
    /// 30 s per call.
    pub fn new(batch: usize) -> ProbeSettings {
        ProbeSettings {
            batch,
            micro_batches: [1, 2, 4, 8, 16].into_iter().filter(|&m| m <= batch.max(1)).collect(),
            cuts: None,
            frozen_layers: 0,
            loss: "cross-entropy".into(),
            optimizer: "sgd".into(),
            engine: EngineKind::Tract,
            engine_options: EngineOptions::default(),
            reps: 3,
            link_reps: 5,
            budget: Duration::from_secs(120),
            max_payload_bytes: 16 << 20,
            timeout: Duration::from_secs(30),
            apply_bytes_per_s: None,
            concurrent: true,
            min_device_ops: edge::MIN_DEVICE_OPS,
        }
    }

    /// Samples per micro-batch to time: of the fewest and of the most micro-batches (the
    /// largest micro-batch of a split, which sets its stages).
    pub fn sizes(&self) -> Result<Vec<usize>> {
        let bad = |m: &str| ProbeError::Config(m.to_string());
        if self.batch == 0 {
            return Err(bad("the batch must have at least one sample"));
        }
        let fewest = self.micro_batches.iter().min().ok_or_else(|| bad("no micro-batch count to plan for"))?;
        let most = self.micro_batches.iter().max().copied().unwrap_or(1);
        if *fewest == 0 || most > self.batch {
            return Err(ProbeError::Config(format!(
                "micro-batch counts {:?}: a batch of {} samples takes 1 to {} micro-batches",
                self.micro_batches, self.batch, self.batch
            )));
        }
        let mut sizes = vec![self.batch.div_ceil(most), self.batch.div_ceil(*fewest)];
        sizes.dedup();
        Ok(sizes)
    }
}

/// What a probe measured, and how long it took.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReport {
    /// For the planner.
    pub measurements: Measurements,
    /// The micro-batch sizes timed.
    pub sizes: Vec<usize>,
    /// Seconds of the whole probe.
    pub elapsed_s: f64,
    /// Seconds timing the device.
    pub device_s: f64,
    /// Seconds timing the links.
    pub links_s: f64,
    /// Seconds timing the edge servers.
    pub edges_s: f64,
    /// What was not measured, and why.
    pub skipped: Vec<String>,
    /// Every link call's time, by server.
    pub link_samples: Vec<(String, Vec<link::LinkSample>)>,
    /// The concurrent probe at each (server, cut) it ran at.
    pub concurrent: Vec<ConcurrentAt>,
}

/// The concurrent probe at one (server, cut).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConcurrentAt {
    /// The server.
    pub server: String,
    /// The cut.
    pub cut: usize,
    /// What it found.
    pub found: edge::Concurrent,
}

/// Probes the device, and each target's link and edge at each candidate cut, for
/// `model_path` (an inference ONNX model).
pub fn probe(model_path: &Path, targets: &[Target], settings: &ProbeSettings) -> Result<ProbeReport> {
    let started = Instant::now();
    let deadline = started + settings.budget;
    let model_error = |e: &dyn std::fmt::Display| ProbeError::Model { path: model_path.into(), message: e.to_string() };
    if targets.is_empty() {
        return Err(ProbeError::Config("no edge server to probe".into()));
    }
    let sizes = settings.sizes()?;
    let model = edgefreeze_graph::import(model_path).map_err(|e| model_error(&e))?;
    let model_bytes = std::fs::read(model_path).map_err(|e| model_error(&e))?;
    let analysis = edgefreeze_graph::analysis::analyse(&model).map_err(|e| model_error(&e))?;
    // A cut whose back part reads model inputs beside the activation cannot be split:
    // the edge would need the samples themselves, which stay on the device.
    let valid: Vec<usize> = analysis.cuts.iter().filter(|c| c.side_inputs.is_empty()).map(|c| c.after_layer).collect();
    let cuts = match &settings.cuts {
        None => valid.clone(),
        Some(cuts) => {
            if let Some(bad) = cuts.iter().find(|c| !valid.contains(c)) {
                let why = match analysis.cuts.iter().find(|c| c.after_layer == *bad) {
                    Some(c) => format!(
                        "cut {bad} cannot be split: the part behind it reads the model's input {} as well",
                        c.side_inputs.join(", ")
                    ),
                    None => format!("cut {bad} is not a valid cut of the model"),
                };
                return Err(ProbeError::Config(format!("{why}: valid are {valid:?}")));
            }
            cuts.clone()
        }
    };
    if cuts.is_empty() {
        let why = if analysis.cuts.is_empty() || settings.cuts.is_some() {
            "the model has no valid cut".to_string()
        } else {
            format!(
                "no cut of the model can be split: behind each the model reads its input {} beside the activation",
                analysis.cuts[0].side_inputs.join(", ")
            )
        };
        return Err(model_error(&why));
    }
    let flops: Vec<u64> = analysis.layers.iter().map(|l| l.flops).collect();
    let mut skipped = Vec::new();

    // The device, cut by cut.
    let setup = device::DeviceSetup {
        model_path,
        model: &model,
        loss: &settings.loss,
        optimizer: &settings.optimizer,
        engine: &settings.engine,
        engine_options: &settings.engine_options,
    };
    let mut device_cuts = Vec::new();
    let mut loads = Vec::new();
    for &cut in &cuts {
        if Instant::now() >= deadline {
            skipped.push(format!("cut {cut}: the probe's budget was spent before the device was timed there"));
            continue;
        }
        let (times, load) = device::time_cut(&setup, cut, cut < settings.frozen_layers, &sizes, settings.reps)?;
        device_cuts.push(times);
        loads.push(load);
    }
    if device_cuts.is_empty() {
        return Err(ProbeError::Config(format!(
            "the probe's budget of {:.1} s was spent before any cut was measured",
            settings.budget.as_secs_f64()
        )));
    }
    let device_s = started.elapsed().as_secs_f64();
    let (layers, [forward_call_s, backward_call_s, apply_call_s]) = device::layer_times(&device_cuts, &flops);
    let cut_bytes: Vec<CutBytes> = device_cuts
        .iter()
        .map(|c| {
            let per_sample = |v: &[(usize, Value)]| v.first().map_or(0, |(n, v)| device::value_bytes(v) / *n as u64);
            CutBytes { cut: c.cut, activation: per_sample(&c.activations), label: per_sample(&c.labels) }
        })
        .collect();
    let apply_s_per_byte = settings.apply_bytes_per_s.map(|rate| 1.0 / rate);

    // The links.
    let links_started = Instant::now();
    let mut up_sizes = Vec::new();
    let mut down_sizes = Vec::new();
    for c in &cut_bytes {
        for &n in &sizes {
            up_sizes.push((n as u64 * (c.activation + c.label)).min(settings.max_payload_bytes));
            if c.cut >= settings.frozen_layers {
                down_sizes.push((n as u64 * c.activation).min(settings.max_payload_bytes));
            }
        }
    }
    if down_sizes.is_empty() {
        // A frozen device gets replies but no gradients: time one small payload down.
        down_sizes.push(1 << 10);
    }
    let (up_sizes, down_sizes) = (distinct(up_sizes), distinct(down_sizes));
    let mut links = Vec::new();
    let mut link_samples = Vec::new();
    for (t, measured) in targets.iter().zip(probe_links(targets, &up_sizes, &down_sizes, settings, deadline)?) {
        match measured {
            Ok(probe) => {
                for (up, down) in &probe.refused {
                    skipped.push(format!(
                        "{}: a probe of {up} bytes up and {down} down is over its message limit",
                        t.address
                    ));
                }
                links.push(Some(probe.times));
                link_samples.push((t.address.clone(), probe.samples));
            }
            Err(e) => {
                skipped.push(format!("{}: {e}", t.address));
                links.push(None);
            }
        }
    }
    let links_s = links_started.elapsed().as_secs_f64();

    // Each edge at each cut.
    let edges_started = Instant::now();
    let mut servers = Vec::new();
    let mut concurrent = Vec::new();
    let stamp = edgefreeze_wire::unix_nanos_now();
    for (t, link) in targets.iter().zip(links) {
        let Some(link) = link else { continue };
        let mut server = ServerTimes { name: t.address.clone(), link, cuts: Vec::new() };
        for (c, load) in device_cuts.iter().zip(&mut loads) {
            if Instant::now() >= deadline {
                skipped.push(format!("{} at cut {}: the probe's budget was spent", t.address, c.cut));
                continue;
            }
            let probe = edge::EdgeProbe {
                address: &t.address,
                credentials: &t.credentials,
                model: &model_bytes,
                loss: &settings.loss,
                optimizer: &settings.optimizer,
                run_id: format!("probe-{stamp:x}-{}", c.cut),
                apply_s_per_byte,
                timeout: settings.timeout,
                link: server.link,
                min_device_ops: settings.min_device_ops,
                deadline,
            };
            let batches: Vec<(usize, Value, Value)> = c
                .activations
                .iter()
                .zip(&c.labels)
                .map(|((n, activation), (_, labels))| (*n, activation.clone(), labels.clone()))
                .collect();
            let load = settings.concurrent.then_some(load);
            match edge::time_cut(&probe, c.cut, c.frozen, &batches, settings.reps, load) {
                Ok(e) => {
                    server.cuts.push(e.times);
                    if let Some(found) = e.concurrent {
                        concurrent.push(ConcurrentAt { server: t.address.clone(), cut: c.cut, found });
                    }
                }
                Err(e) => skipped.push(e.to_string()),
            }
        }
        servers.push(server);
    }
    let edges_s = edges_started.elapsed().as_secs_f64();
    if servers.iter().all(|s| s.cuts.is_empty()) {
        return Err(ProbeError::Config(format!("no edge server could be probed at any cut: {}", skipped.join("; "))));
    }
    let measurements = Measurements {
        device: DeviceTimes { layers, forward_call_s, backward_call_s, apply_call_s },
        cuts: cut_bytes,
        servers,
    };
    measurements.validate()?;
    Ok(ProbeReport {
        measurements,
        sizes,
        elapsed_s: started.elapsed().as_secs_f64(),
        device_s,
        links_s,
        edges_s,
        skipped,
        link_samples,
        concurrent,
    })
}

/// Sizes without repeats or near-repeats (within 10% of a kept one), ascending.
fn distinct(mut sizes: Vec<u64>) -> Vec<u64> {
    sizes.sort_unstable();
    let mut kept: Vec<u64> = Vec::new();
    for s in sizes {
        if kept.last().is_none_or(|&k| s as f64 > k as f64 * 1.1) {
            kept.push(s);
        }
    }
    kept
}

/// Times each target's link with these payload sizes (see [`link::probe_link`]).
pub fn probe_links(
    targets: &[Target],
    up_sizes: &[u64],
    down_sizes: &[u64],
    settings: &ProbeSettings,
    deadline: Instant,
) -> Result<Vec<Result<link::LinkProbe>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ProbeError::Config(format!("cannot start the network runtime: {e}")))?;
    Ok(targets
        .iter()
        .map(|t| {
            runtime.block_on(async {
                let limits = edgefreeze_wire::Limits::default();
                let lost = |message: String| ProbeError::Edge { address: t.address.clone(), message };
                let late = |what: &str| lost(format!("no answer to {what} in {:.1} s", settings.timeout.as_secs_f64()));
                let connect = edgefreeze_wire::connect(&t.address, t.credentials.clone(), &limits);
                let mut client = tokio::time::timeout(settings.timeout, connect)
                    .await
                    .map_err(|_| late("the connection"))?
                    .map_err(|e| lost(e.to_string()))?;
                link::probe_link(
                    &mut client,
                    &t.address,
                    up_sizes,
                    down_sizes,
                    settings.link_reps,
                    deadline,
                    settings.timeout,
                )
                .await
            })
        })
        .collect())
}
