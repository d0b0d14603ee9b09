//! The reference runner: the int8 reference model on its own thread with its own engine.
//!
//! The training thread sends requests over a bounded channel and collects replies with
//! `try_recv`, so a training step never waits for the reference model unless the caller
//! asks to ([`ReferenceRunner::wait`]). The runner calibrates and builds the reference
//! model itself ([`Request::Rebuild`]), so the training thread only copies the live
//! parameters out. Each reply carries the seconds the runner spent on it: its overhead.

use crate::error::{FreezeError, Result};
use crate::reference::{calibration_model, calibration_output, probe_name, ranges, reference_model};
use crate::sp::sp_loss;
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
    /// A plasticity value.
    Plasticity {
        /// The update the probe was taken after.
        step: u64,
        /// The layer.
        layer: usize,
        /// The SP loss.
        sp: f64,
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

fn serve(
    engine: EngineKind,
    options: EngineOptions,
    analysis: Analysis,
    probes: Vec<usize>,
    requests: Receiver<Request>,
    replies: SyncSender<Reply>,
) {
    let mut session: Option<(Box<dyn Session>, String)> = None;
    for request in requests {
        let start = Instant::now();
        let reply = match request {
            Request::Rebuild { step, model, calibration } => {
                match rebuild(&engine, &options, &analysis, &probes, &model, &calibration) {
                    Ok((s, nodes)) => {
                        session = Some((s, model.graph.inputs[0].name.clone()));
                        Reply::Rebuilt { step, nodes, seconds: start.elapsed().as_secs_f64() }
                    }
                    Err(e) => Reply::Failed { step, message: e.to_string() },
                }
            }
            Request::Probe { step, layer, input, train } => match session.as_mut() {
                None => Reply::Failed { step, message: "no reference model built yet".into() },
                Some((s, name)) => match probe(s.as_mut(), name, layer, &input, &train) {
                    Ok(sp) => Reply::Plasticity { step, layer, sp, seconds: start.elapsed().as_secs_f64() },
                    Err(e) => Reply::Failed { step, message: e.to_string() },
                },
            },
        };
        if replies.send(reply).is_err() {
            return;
        }
    }
}

fn flatten(name: &str, v: &Value) -> Result<Vec<f32>> {
    v.as_f32()
        .map(|a| a.iter().copied().collect())
        .ok_or_else(|| FreezeError::Reference(format!("output {name:?} is not f32")))
}

fn rebuild(
    engine: &EngineKind,
    options: &EngineOptions,
    analysis: &Analysis,
    probes: &[usize],
    model: &Model,
    calibration: &Value,
) -> Result<(Box<dyn Session>, usize)> {
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
    Ok((edgefreeze_engine::load(engine, &edgefreeze_graph::save::encode_model(&reference), options)?, nodes))
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
