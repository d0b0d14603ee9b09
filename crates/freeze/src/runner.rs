//! The reference runner: the int8 reference model on its own thread with its own engine.
//!
//! The training thread sends requests over a bounded channel and collects replies with
//! `try_recv`, so a training step never waits for the reference model unless the caller
//! asks to ([`ReferenceRunner::wait`]). The runner calibrates and builds the reference
//! model itself ([`Request::Rebuild`]), so the training thread only copies the live
//! parameters out. Each reply carries the seconds the runner spent on it: its overhead.

use crate::error::{FreezeError, Result};
use crate::reference::{calibration_model, calibration_output, live_probe_model, probe_name, ranges, reference_model};
use crate::sp::{Gram, sp_loss};
use edgefreeze_engine::{EngineKind, EngineOptions, Session, Value};
use edgefreeze_graph::analysis::Analysis;
use edgefreeze_graph::ir::Model;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::Instant;

/// A request to the runner.
pub enum Request {
    /// Build the reference model from `model` (the inference model carrying the live
    /// parameters), calibrating activation scales on `calibration` (a batch of inputs).
    Rebuild {
        /// The update after which the parameters were taken.
        step: u64,
        /// The float model with the live parameters.
        model: Box<Model>,
        /// A batch to calibrate on.
        calibration: Value,
    },
    /// Measure the plasticity of `layers` on the fixed probe batch (the calibration
    /// batch of the last rebuild): the runner runs the float model at `parameters` (the
    /// live values, copied after update `step`) once and compares its activation after
    /// each layer with the reference model's on the same samples, by the SP loss. The
    /// same samples at every measurement: the values differ only because the model moved.
    Measure {
        /// The update after which the parameters were copied.
        step: u64,
        /// The layers whose outputs are compared.
        layers: Vec<usize>,
        /// The live parameters and statistics the float model runs with (the same
        /// names at every measurement).
        parameters: Vec<(String, Value)>,
    },
    /// Measure the plasticity of `layer` on a batch: the SP loss between the training
    /// model's activation and the reference model's.
    Probe {
        /// The update after which the probe was taken.
        step: u64,
        /// The layer whose output is compared.
        layer: usize,
        /// The batch of inputs.
        input: Value,
        /// The training model's activation after `layer` on that batch, flattened.
        train: Vec<f32>,
    },
}

/// A reply from the runner.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The reference model was rebuilt.
    Rebuilt {
        /// The update the parameters came from.
        step: u64,
        /// Nodes of the int8 model.
        nodes: usize,
        /// Seconds spent calibrating, building and loading it.
        seconds: f64,
    },
    /// Plasticity values.
    Plasticity {
        /// The update the probe was taken after.
        step: u64,
        /// (layer, SP loss), in the order asked for.
        values: Vec<(usize, f64)>,
        /// Seconds the reference forward pass and the SP loss took.
        seconds: f64,
    },
    /// A request failed.
    Failed {
        /// The update of the request.
        step: u64,
        /// Why.
        message: String,
    },
}

impl Reply {
    /// The update the reply belongs to.
    pub fn step(&self) -> u64 {
        match self {
            Reply::Rebuilt { step, .. } | Reply::Plasticity { step, .. } | Reply::Failed { step, .. } => *step,
        }
    }

    /// Seconds the runner spent on it.
    pub fn seconds(&self) -> f64 {
        match self {
            Reply::Rebuilt { seconds, .. } | Reply::Plasticity { seconds, .. } => *seconds,
            Reply::Failed { .. } => 0.0,
        }
    }
}

/// The runner's thread and its channels.
pub struct ReferenceRunner {
    requests: Option<SyncSender<Request>>,
    replies: Receiver<Reply>,
    thread: Option<JoinHandle<()>>,
    busy_seconds: f64,
}

impl ReferenceRunner {
    /// Starts the runner on `engine` (its own instance, `options.threads` threads) for a
    /// model analysed as `analysis`, exposing `probes`; at most `queue` requests wait.
    pub fn spawn(
        engine: EngineKind,
        options: EngineOptions,
        analysis: Analysis,
        probes: Vec<usize>,
        queue: usize,
    ) -> Result<ReferenceRunner> {
        let (request_tx, request_rx) = sync_channel::<Request>(queue.max(1));
        let (reply_tx, reply_rx) = sync_channel::<Reply>(queue.max(1) + 2);
        let thread = std::thread::Builder::new()
            .name("edgefreeze-reference".into())
            .spawn(move || serve(engine, options, analysis, probes, request_rx, reply_tx))
            .map_err(|e| FreezeError::Runner(format!("cannot start its thread: {e}")))?;
        Ok(ReferenceRunner { requests: Some(request_tx), replies: reply_rx, thread: Some(thread), busy_seconds: 0.0 })
    }

    /// Queues a request without waiting; a full queue gives the request back.
    pub fn submit(&self, request: Request) -> std::result::Result<(), Box<Request>> {
        let tx = self.requests.as_ref().expect("open until dropped");
        match tx.try_send(request) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(r)) | Err(TrySendError::Disconnected(r)) => Err(Box::new(r)),
        }
    }

    /// Queues a request, waiting for room in the queue.
    pub fn send(&self, request: Request) -> Result<()> {
        let tx = self.requests.as_ref().expect("open until dropped");
        tx.send(request).map_err(|_| FreezeError::Runner("its thread has stopped".into()))
    }

    /// Replies ready now, without waiting.
    pub fn poll(&mut self) -> Result<Vec<Reply>> {
        let mut out = Vec::new();
        loop {
            match self.replies.try_recv() {
                Ok(r) => {
                    self.busy_seconds += r.seconds();
                    out.push(r)
                }
                Err(TryRecvError::Empty) => return Ok(out),
                Err(TryRecvError::Disconnected) => {
                    return if out.is_empty() {
                        Err(FreezeError::Runner("its thread has stopped".into()))
                    } else {
                        Ok(out)
                    };
                }
            }
        }
    }

    /// Waits for the next reply.
    pub fn wait(&mut self) -> Result<Reply> {
        let r = self.replies.recv().map_err(|_| FreezeError::Runner("its thread has stopped".into()))?;
        self.busy_seconds += r.seconds();
        Ok(r)
    }

    /// Seconds the runner has spent on the replies collected so far.
    pub fn busy_seconds(&self) -> f64 {
        self.busy_seconds
    }
}

impl Drop for ReferenceRunner {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the runner holds between requests.
#[derive(Default)]
struct Held {
    /// The reference model's session and its data input's name.
    reference: Option<(Box<dyn Session>, String)>,
    /// The float model of the last rebuild (its parameters are replaced per measurement).
    float: Option<Model>,
    /// The probe batch (the last calibration batch) and the Gram matrices of the
    /// reference's activations on it, per probed layer: computed once per rebuild, since
    /// neither changes until then.
    batch: Option<Value>,
    reference_grams: Vec<(usize, Gram)>,
    /// The float model with its parameters as inputs, and those inputs' names.
    live: Option<(Box<dyn Session>, Vec<String>)>,
}

fn serve(
    engine: EngineKind,
    options: EngineOptions,
    analysis: Analysis,
    probes: Vec<usize>,
    requests: Receiver<Request>,
    replies: SyncSender<Reply>,
) {
    let mut held = Held::default();
    for request in requests {
        let start = Instant::now();
        let reply = match request {
            Request::Rebuild { step, model, calibration } => {
                match rebuild(&engine, &options, &analysis, &probes, &model, &calibration) {
                    Ok((s, nodes, outputs)) => {
                        held.reference = Some((s, model.graph.inputs[0].name.clone()));
                        held.float = Some(*model);
                        held.batch = Some(calibration);
                        held.reference_grams = outputs;
                        Reply::Rebuilt { step, nodes, seconds: start.elapsed().as_secs_f64() }
                    }
                    Err(e) => {
                        held = Held::default();
                        Reply::Failed { step, message: e.to_string() }
                    }
                }
            }
            Request::Measure { step, layers, parameters } => {
                match measure(&engine, &options, &analysis, &probes, &mut held, &layers, &parameters) {
                    Ok(values) => Reply::Plasticity { step, values, seconds: start.elapsed().as_secs_f64() },
                    Err(e) => Reply::Failed { step, message: e.to_string() },
                }
            }
            Request::Probe { step, layer, input, train } => match held.reference.as_mut() {
                None => Reply::Failed { step, message: "no reference model built yet".into() },
                Some((s, name)) => match probe(s.as_mut(), name, layer, &input, &train) {
                    Ok(sp) => {
                        Reply::Plasticity { step, values: vec![(layer, sp)], seconds: start.elapsed().as_secs_f64() }
                    }
                    Err(e) => Reply::Failed { step, message: e.to_string() },
                },
            },
        };
        if replies.send(reply).is_err() {
            return;
        }
    }
}

/// SP of `layer` between the float model at `parameters` and the reference, both on
/// the probe batch.
fn measure(
    engine: &EngineKind,
    options: &EngineOptions,
    analysis: &Analysis,
    probes: &[usize],
    held: &mut Held,
    layers: &[usize],
    parameters: &[(String, Value)],
) -> Result<Vec<(usize, f64)>> {
    let (Some(model), Some(batch)) = (&held.float, &held.batch) else {
        return Err(FreezeError::Reference("no reference model built yet".into()));
    };
    let mut references = Vec::with_capacity(layers.len());
    for &layer in layers {
        let reference = held
            .reference_grams
            .iter()
            .find(|(l, _)| *l == layer)
            .map(|(_, v)| v)
            .ok_or_else(|| FreezeError::Reference(format!("the reference model does not expose layer {layer}")))?;
        references.push((layer, reference));
    }
    let names: Vec<String> = parameters.iter().map(|(n, _)| n.clone()).collect();
    if held.live.as_ref().is_none_or(|(_, n)| *n != names) {
        let live = live_probe_model(model, analysis, &names, probes)?;
        let session = edgefreeze_engine::load(engine, &edgefreeze_graph::save::encode_model(&live), options)?;
        held.live = Some((session, names));
    }
    let (session, _) = held.live.as_mut().expect("loaded above");
    let input = model.graph.inputs.first().ok_or_else(|| FreezeError::Reference("the model has no input".into()))?;
    let mut feeds: Vec<(&str, &Value)> = vec![(input.name.as_str(), batch)];
    feeds.extend(parameters.iter().map(|(n, v)| (n.as_str(), v)));
    // One forward pass gives every probed layer's activation.
    let outputs = session.run(&feeds)?;
    let samples = batch.shape().first().copied().unwrap_or(0);
    let mut values = Vec::with_capacity(references.len());
    for (layer, reference) in references {
        let name = probe_name(layer);
        let i = session.output_names().iter().position(|o| *o == name).expect("every probed layer is exposed");
        values.push((layer, Gram::of(&flatten(&name, &outputs[i])?, samples, "training")?.sp(reference)?));
    }
    Ok(values)
}

fn flatten(name: &str, v: &Value) -> Result<Vec<f32>> {
    v.as_f32()
        .map(|a| a.iter().copied().collect())
        .ok_or_else(|| FreezeError::Reference(format!("output {name:?} is not f32")))
}

/// A rebuilt reference: its session, its node count, and the Gram matrices of its
/// activations on the calibration batch per probed layer.
type Rebuilt = (Box<dyn Session>, usize, Vec<(usize, Gram)>);

fn rebuild(
    engine: &EngineKind,
    options: &EngineOptions,
    analysis: &Analysis,
    probes: &[usize],
    model: &Model,
    calibration: &Value,
) -> Result<Rebuilt> {
    let input =
        &model.graph.inputs.first().ok_or_else(|| FreezeError::Reference("the model has no input".into()))?.name;
    let (calibrate, names) = calibration_model(model)?;
    let mut s = edgefreeze_engine::load(engine, &edgefreeze_graph::save::encode_model(&calibrate), options)?;
    let outputs = s.run(&[(input.as_str(), calibration)])?;
    let mut values = Vec::new();
    for name in &names {
        let exposed = calibration_output(name);
        let i = s.output_names().iter().position(|o| *o == exposed).expect("calibration outputs are exposed");
        values.push(flatten(name, &outputs[i])?);
    }
    let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    let reference = reference_model(model, analysis, &ranges(&names, &slices), probes)?;
    let nodes = reference.graph.nodes.len();
    let mut session = edgefreeze_engine::load(engine, &edgefreeze_graph::save::encode_model(&reference), options)?;
    // Its activations on the calibration batch, which is also the probe batch.
    let outputs = session.run(&[(input.as_str(), calibration)])?;
    let samples = calibration.shape().first().copied().unwrap_or(0);
    let mut on_batch = Vec::new();
    for &l in probes {
        let name = probe_name(l);
        let i = session.output_names().iter().position(|o| *o == name).expect("every probed layer is exposed");
        on_batch.push((l, Gram::of(&flatten(&name, &outputs[i])?, samples, "reference")?));
    }
    Ok((session, nodes, on_batch))
}

fn probe(s: &mut dyn Session, input: &str, layer: usize, batch: &Value, train: &[f32]) -> Result<f64> {
    let name = probe_name(layer);
    let i = s
        .output_names()
        .iter()
        .position(|o| *o == name)
        .ok_or_else(|| FreezeError::Reference(format!("the reference model does not expose layer {layer}")))?;
    let outputs = s.run(&[(input, batch)])?;
    let reference = flatten(&name, &outputs[i])?;
    let b = batch.shape().first().copied().unwrap_or(0);
    sp_loss(train, &reference, b)
}
