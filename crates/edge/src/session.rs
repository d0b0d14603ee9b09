//! One device's session: its own engine workspace on its own thread.
//!
//! Engines are synchronous and a step can take hundreds of milliseconds, so each
//! session's workspace lives on a dedicated OS thread that takes [`Command`]s from a
//! channel; the tokio runtime only moves messages. The thread owns every mutable part of
//! the session (state, step, micro-batch counter, gradient sums), so sessions share
//! nothing and a failure in one cannot touch another.
//!
//! Every message is checked in full (header, version, step, micro-batch order, tensors
//! against the session's ports) *before* anything runs, so a rejected message leaves the
//! session exactly as it was and the device may continue after fixing it. An engine
//! failure while running is different: the session is marked failed and refuses further
//! work (resume it from a checkpoint).

use crate::checkpoint::RunStore;
use crate::log::Log;
use crate::side::{ACTIVATION, SideBuilder, SideError, SplitSpec};
use edgefreeze_autodiff::GRAD_SCALE;
use edgefreeze_autodiff::loss::LABELS;
use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
use edgefreeze_autodiff::training::{CORRECT, LOSS, UPDATED_PREFIX, grad_name};
use edgefreeze_autodiff::training_mode::DROPOUT_SEED;
use edgefreeze_engine::{EngineKind, EngineOptions, GraphId, StateUpdates, Value, Workspace};
use edgefreeze_wire::pb::{
    ApplyUpdateRequest, ApplyUpdateResponse, EdgeState, EdgeTimes, Header, MicroBatchDown, MicroBatchUp, NamedTensor,
    OpenSessionRequest, PortSpec, PutStateRequest, PutStateResponse,
};
use edgefreeze_wire::{Limits, header, tensor, unix_nanos_now};
use ndarray::ArrayD;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// What a session's thread is asked to do.
pub(crate) enum Command {
    /// Run the edge step on one micro-batch; the result goes to the stream's channel.
    MicroBatch { up: Box<MicroBatchUp>, received: u64, stream: Arc<StreamState> },
    /// Apply the step's summed gradients (now, or held until the step's last micro-batch).
    Apply { request: ApplyUpdateRequest, reply: UpdateReply },
    /// Copy the state out.
    Fetch { header: Header, reply: oneshot::Sender<Result<EdgeState, Status>> },
    /// Replace the state.
    Put { request: PutStateRequest, reply: oneshot::Sender<Result<PutStateResponse, Status>> },
}

/// Where the answer to an update goes.
pub(crate) type UpdateReply = oneshot::Sender<Result<ApplyUpdateResponse, Status>>;

/// One training stream: where its results go, and whether it already failed (then the
/// micro-batches queued behind the failing one are dropped, not run).
pub(crate) struct StreamState {
    pub out: mpsc::Sender<Result<MicroBatchDown, Status>>,
    pub failed: AtomicBool,
}

/// Facts about a session fixed when it opens.
#[derive(Debug, Clone)]
pub(crate) struct SessionInfo {
    pub id: String,
    pub device_id: String,
    pub run_id: String,
    pub model_version: u64,
    pub micro_batches: u32,
    pub activation: PortSpec,
    pub labels: PortSpec,
    pub returns_activation_grad: bool,
    pub needs_dropout_seed: bool,
}

/// What the registry and the calls see of a session thread.
pub(crate) struct Shared {
    /// Bytes of state and gradient sums the session holds.
    pub state_bytes: AtomicU64,
    /// The last time a call reached, or the thread finished, a command.
    pub last_seen: Mutex<Instant>,
    /// The step the session is at (for listings; the thread's copy is authoritative).
    pub step: AtomicU64,
}

impl Shared {
    pub fn touch(&self) {
        *self.last_seen.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub fn idle_for(&self) -> std::time::Duration {
        self.last_seen.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }
}

/// Everything a session thread needs to build itself.
pub(crate) struct Spawn {
    pub id: String,
    pub device_id: String,
    pub run_id: String,
    pub model_version: u64,
    pub request: OpenSessionRequest,
    pub builder: SideBuilder,
    pub engine: EngineKind,
    pub engine_options: EngineOptions,
    pub limits: Limits,
    pub max_state_bytes: u64,
    pub state_dir: Option<PathBuf>,
    pub log: Log,
}

/// A session that opened: what the registry keeps and the device is told.
pub(crate) struct Ready {
    pub info: SessionInfo,
    pub shared: Arc<Shared>,
    pub step: u64,
}

/// The session thread's state.
struct Worker {
    info: SessionInfo,
    ws: Box<dyn Workspace>,
    step_graph: GraphId,
    apply_graph: GraphId,
    parameters: Vec<Parameter>,
    /// Updates applied.
    step: u64,
    /// The micro-batch expected next within the step.
    next_micro_batch: u32,
    /// Labels counted in the step's micro-batches so far: each micro-batch's weight
    /// (`edgefreeze_wire::convert::counted_labels`; its samples with a label per sample).
    counted: f64,
    /// The loss: which labels count.
    loss: edgefreeze_autodiff::Loss,
    limits: Limits,
    store: Option<RunStore>,
    failed: Option<String>,
    /// An update that came before its step's last micro-batch
    /// (`after_last_micro_batch`), checked and waiting to be applied after it.
    held: Option<(ApplyUpdateRequest, UpdateReply)>,
    shared: Arc<Shared>,
    log: Log,
}

/// A trainable edge parameter and the sum of its weighted micro-batch gradients.
struct Parameter {
    grad_output: String,
    shape: Vec<usize>,
    /// Σ c_i · g_i over the step's micro-batches (c_i the labels micro-batch i counts, g_i its mean gradient),
    /// in f64 so summing M micro-batches adds no error a single batch would not have.
    sum: Vec<f64>,
}

/// Builds the session on a new thread (splitting the model is CPU work too); answers on
/// `ready`, then serves commands until every sender is dropped.
pub(crate) fn spawn(
    spawn: Spawn,
    commands: mpsc::Receiver<Command>,
    ready: oneshot::Sender<Result<Ready, Status>>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name(format!("edge-session-{}", spawn.id)).spawn(move || {
        let id = spawn.id.clone();
        let log = spawn.log.clone();
        match Worker::build(spawn) {
            Ok(worker) => {
                let ready_info = Ready { info: worker.info.clone(), shared: worker.shared.clone(), step: worker.step };
                if ready.send(Ok(ready_info)).is_ok() {
                    worker.serve(commands);
                }
            }
            Err(status) => {
                log.line(format!("session {id}: not opened: {:?}: {}", status.code(), status.message()));
                let _ = ready.send(Err(status));
            }
        }
    })?;
    Ok(())
}

impl Worker {
    fn build(spawn: Spawn) -> Result<Worker, Status> {
        let Spawn {
            id,
            device_id,
            run_id,
            model_version,
            request,
            builder,
            engine,
            engine_options,
            limits,
            max_state_bytes,
            state_dir,
            log,
        } = spawn;
        let split =
            request.split.as_ref().ok_or_else(|| Status::invalid_argument("OpenSessionRequest has no split"))?;
        let resume_step = request.resume_step;
        let spec = SplitSpec::from_wire(split).map_err(side_status)?;
        let side = builder(&spec).map_err(side_status)?;
        // Only now, so a request that cannot be built leaves no run folder behind.
        let store = match &state_dir {
            Some(dir) => Some(RunStore::open(dir, &device_id, &run_id, split, resume_step.is_some())?),
            None if resume_step.is_some() => {
                return Err(Status::failed_precondition(
                    "this edge server keeps no checkpoints (start it with --state-dir), so it cannot resume",
                ));
            }
            None => None,
        };
        let info = SessionInfo {
            id,
            device_id,
            run_id,
            model_version,
            micro_batches: split.micro_batches,
            activation: side.activation.clone(),
            labels: side.labels.clone(),
            returns_activation_grad: side.step.graph.outputs.iter().any(|o| o.name == grad_name(ACTIVATION)),
            needs_dropout_seed: side.step.graph.inputs.iter().any(|i| i.name == DROPOUT_SEED),
        };
        if info.returns_activation_grad == spec.frozen_device_layers {
            return Err(Status::internal(format!(
                "the edge step {} an activation gradient although the device's layers are {}",
                if info.returns_activation_grad { "computes" } else { "lacks" },
                if spec.frozen_device_layers { "frozen" } else { "trained" }
            )));
        }
        let mut ws = edgefreeze_engine::workspace(&engine, &engine_options)
            .map_err(|e| Status::internal(format!("engine {engine}: {e}")))?;
        let state_names: Vec<String> = side.state.iter().map(|(n, _)| n.clone()).collect();
        let mut initial = side.state;
        if let Some(step) = resume_step
            && let Some(store) = &store
        {
            let saved = store.read(step)?;
            check_same_state(&initial, &saved)?;
            initial = saved;
        }
        for (name, value) in &initial {
            ws.set_state(name, value.clone()).map_err(|e| Status::internal(format!("state {name}: {e}")))?;
        }
        let load = |ws: &mut Box<dyn Workspace>, model: &edgefreeze_graph::Model, what: &str| {
            let bytes = edgefreeze_graph::save::encode_model(model);
            let outputs: Vec<String> = model.graph.outputs.iter().map(|o| o.name.clone()).collect();
            let updates =
                StateUpdates::where_output_exists(UPDATED_PREFIX, state_names.iter().map(String::as_str), &outputs);
            ws.load_graph(&bytes, updates).map_err(|e| Status::internal(format!("edge {what} graph: {e}")))
        };
        let step_graph = load(&mut ws, &side.step, "step")?;
        let apply_graph = load(&mut ws, &side.apply, "apply")?;

        let mut parameters = Vec::new();
        for name in &side.parameters {
            let shape = initial
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.shape().to_vec())
                .ok_or_else(|| Status::internal(format!("edge parameter {name} has no initial value")))?;
            let grad_output = grad_name(name);
            if !ws.outputs(step_graph).contains(&grad_output) {
                return Err(Status::internal(format!("the edge step graph has no output {grad_output}")));
            }
            let elements = shape.iter().product();
            parameters.push(Parameter { grad_output, shape, sum: vec![0.0; elements] });
        }
        let state_bytes = initial.iter().map(|(_, v)| value_bytes(v)).sum::<u64>()
            + parameters.iter().map(|p| (p.sum.len() * 8) as u64).sum::<u64>();
        if state_bytes > max_state_bytes {
            return Err(Status::resource_exhausted(format!(
                "the edge side of this split needs {state_bytes} bytes of state, over this server's limit of \
                 {max_state_bytes} bytes per session (--max-session-bytes)"
            )));
        }
        let step = resume_step.unwrap_or(0);
        let shared = Arc::new(Shared {
            state_bytes: AtomicU64::new(state_bytes),
            last_seen: Mutex::new(Instant::now()),
            step: AtomicU64::new(step),
        });
        let worker = Worker {
            info,
            ws,
            step_graph,
            apply_graph,
            parameters,
            step,
            next_micro_batch: 0,
            counted: 0.0,
            loss: spec.loss.clone(),
            limits,
            store,
            failed: None,
            held: None,
            shared,
            log,
        };
        if resume_step.is_none()
            && let Some(store) = &worker.store
        {
            store.write(0, &worker.state_values()?)?;
        }
        Ok(worker)
    }

    fn serve(mut self, mut commands: mpsc::Receiver<Command>) {
        while let Some(command) = commands.blocking_recv() {
            match command {
                Command::MicroBatch { up, received, stream } => {
                    if stream.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let result = self.micro_batch(&up, received);
                    let failed = result.as_ref().err().map(|status| status.message().to_string());
                    if let Err(status) = &result {
                        stream.failed.store(true, Ordering::Release);
                        self.reject("micro-batch", up.header.as_ref(), status);
                    }
                    // A closed stream means the device went away; its session stays until
                    // it resumes or the idle timeout frees it.
                    let _ = stream.out.blocking_send(result);
                    // The reply is on its way before a held update runs: its download and
                    // the device's backward overlap the update.
                    match failed {
                        Some(why) => self.drop_held(&format!("a micro-batch of its step failed: {why}")),
                        None if self.next_micro_batch == self.info.micro_batches => {
                            if let Some((request, reply)) = self.held.take() {
                                self.answer_update(&request, reply);
                            }
                        }
                        None => {}
                    }
                }
                Command::Apply { request, reply } => {
                    self.drop_held("another update request came before the step's last micro-batch");
                    if request.after_last_micro_batch && self.next_micro_batch < self.info.micro_batches {
                        match self.check_update(&request) {
                            Ok(()) => self.held = Some((request, reply)),
                            Err(status) => {
                                self.reject("apply update", request.header.as_ref(), &status);
                                let _ = reply.send(Err(status));
                            }
                        }
                    } else {
                        self.answer_update(&request, reply);
                    }
                }
                Command::Fetch { header, reply } => {
                    self.drop_held("a state fetch came before the step's last micro-batch");
                    let result = self.fetch(&header);
                    if let Err(status) = &result {
                        self.reject("fetch state", Some(&header), status);
                    }
                    let _ = reply.send(result);
                }
                Command::Put { request, reply } => {
                    self.drop_held("a state put came before the step's last micro-batch");
                    let result = self.put(&request);
                    if let Err(status) = &result {
                        self.reject("put state", request.header.as_ref(), status);
                    }
                    let _ = reply.send(result);
                }
            }
            self.shared.touch();
        }
        self.log
            .line(format!("session {} of device {}: freed at step {}", self.info.id, self.info.device_id, self.step));
    }

    /// Applies an update and answers it.
    fn answer_update(&mut self, request: &ApplyUpdateRequest, reply: UpdateReply) {
        let result = self.apply(request);
        if let Err(status) = &result {
            self.reject("apply update", request.header.as_ref(), status);
        }
        let _ = reply.send(result);
    }

    /// Answers a held update with an error, unapplied (the session stays where it is).
    fn drop_held(&mut self, why: &str) {
        if let Some((request, reply)) = self.held.take() {
            let status = Status::failed_precondition(format!(
                "update of step {} not applied: {why} (session {} is at step {})",
                request.header.as_ref().map_or(self.step, |h| h.step),
                self.info.id,
                self.step
            ));
            self.reject("apply update", request.header.as_ref(), &status);
            let _ = reply.send(Err(status));
        }
    }

    fn reject(&self, what: &str, h: Option<&Header>, status: &Status) {
        let at = h.map(header::describe).unwrap_or_else(|| "no header".into());
        self.log.line(format!(
            "session {} of device {}: {what} rejected ({at}): {:?}: {}",
            self.info.id,
            self.info.device_id,
            status.code(),
            status.message()
        ));
    }

    /// Refuses work after an engine failure, and messages for other graphs.
    fn check_usable(&self, h: &Header) -> Result<(), Status> {
        if let Some(why) = &self.failed {
            return Err(Status::failed_precondition(format!(
                "session {} failed earlier ({why}); open it again with resume_step to continue from a checkpoint",
                self.info.id
            )));
        }
        if h.model_version != self.info.model_version {
            return Err(Status::failed_precondition(format!(
                "stale model version {}: session {} runs model version {}",
                h.model_version, self.info.id, self.info.model_version
            )));
        }
        Ok(())
    }

    fn check_step(&self, what: &str, h: &Header) -> Result<(), Status> {
        if h.step != self.step {
            return Err(Status::failed_precondition(format!(
                "{what} for step {} but session {} is at step {}",
                h.step, self.info.id, self.step
            )));
        }
        Ok(())
    }

    /// Checks that no step is half done (state moves only between steps).
    fn check_between_steps(&self, what: &str) -> Result<(), Status> {
        if self.next_micro_batch != 0 {
            return Err(Status::failed_precondition(format!(
                "{what} in the middle of step {} ({} of {} micro-batches done): apply the update first",
                self.step, self.next_micro_batch, self.info.micro_batches
            )));
        }
        Ok(())
    }

    fn micro_batch(&mut self, up: &MicroBatchUp, received: u64) -> Result<MicroBatchDown, Status> {
        let h = header::required(up.header.as_ref(), "MicroBatchUp")?;
        self.check_usable(h)?;
        self.check_step(&format!("micro-batch {}", h.micro_batch), h)?;
        let m = self.info.micro_batches;
        if h.micro_batch >= m {
            return Err(Status::invalid_argument(format!(
                "micro-batch {} does not exist: session {} has {m} micro-batches per step",
                h.micro_batch, self.info.id
            )));
        }
        if h.micro_batch != self.next_micro_batch {
            return Err(Status::failed_precondition(format!(
                "out of order: session {} expects micro-batch {} of step {}, got micro-batch {}",
                self.info.id, self.next_micro_batch, self.step, h.micro_batch
            )));
        }
        let activation =
            up.activation.as_ref().ok_or_else(|| Status::invalid_argument("MicroBatchUp has no activation"))?;
        let activation = tensor::check(ACTIVATION, activation, &self.limits)?;
        let samples = tensor::check_port(&activation, &self.info.activation)?;
        let labels = up.labels.as_ref().ok_or_else(|| Status::invalid_argument("MicroBatchUp has no labels"))?;
        let labels = tensor::check(LABELS, labels, &self.limits)?;
        let label_samples = tensor::check_port(&labels, &self.info.labels)?;
        if label_samples != samples {
            return Err(Status::invalid_argument(format!(
                "{label_samples} labels for an activation of {samples} samples"
            )));
        }
        let seed = match (up.dropout_seed, self.info.needs_dropout_seed) {
            (Some(seed), true) => Some(Value::scalar_i64(seed)),
            (None, false) => None,
            (None, true) => return Err(Status::invalid_argument("the edge side has Dropout: send dropout_seed")),
            (Some(_), false) => {
                return Err(Status::invalid_argument("dropout_seed sent, but the edge side has no Dropout"));
            }
        };
        let activation = tensor::checked_to_value(ACTIVATION, &activation)?;
        let labels = tensor::checked_to_value(LABELS, &labels)?;
        let mut inputs: Vec<(&str, &Value)> = vec![(ACTIVATION, &activation), (LABELS, &labels)];
        if let Some(seed) = &seed {
            inputs.push((DROPOUT_SEED, seed));
        }

        let compute_start = unix_nanos_now();
        let outputs = self.ws.run(self.step_graph, &inputs);
        let compute_end = unix_nanos_now();
        let outputs = outputs
            .map_err(|e| self.fail(format!("edge step of step {} micro-batch {}: {e}", self.step, h.micro_batch)))?;

        let mut loss = None;
        let (mut correct, mut correct_samples) = (None, None);
        let mut activation_grad = None;
        let mut grads: Vec<Option<ArrayD<f32>>> = vec![None; self.parameters.len()];
        for (name, value) in outputs {
            if name == LOSS {
                loss = Some(scalar_f32(&name, &value).map_err(|m| self.fail(m))?);
            } else if name == CORRECT {
                // A count with a label per sample; in samples, a float, with labels per
                // pixel or ignored ones (`edgefreeze_autodiff::loss::LossValues::correct`).
                match &value {
                    Value::I64(a) if a.len() == 1 => correct = a.iter().copied().next(),
                    Value::F32(a) if a.len() == 1 => correct_samples = a.iter().map(|&x| f64::from(x)).next(),
                    other => {
                        return Err(self.fail(format!(
                            "output correct: expected an int64 or float scalar, got {:?}",
                            other.shape()
                        )));
                    }
                }
            } else if name == grad_name(ACTIVATION) {
                activation_grad = Some(tensor::from_value(&value));
            } else if let Some(i) = self.parameters.iter().position(|p| p.grad_output == name) {
                match value {
                    Value::F32(a) if a.shape() == self.parameters[i].shape.as_slice() => grads[i] = Some(a),
                    other => {
                        let expected = self.parameters[i].shape.clone();
                        return Err(
                            self.fail(format!("output {name}: shape {:?}, expected f32 {expected:?}", other.shape()))
                        );
                    }
                }
            }
        }
        let loss = loss.ok_or_else(|| self.fail("the edge step computed no loss".into()))?;
        if self.info.returns_activation_grad && activation_grad.is_none() {
            return Err(self.fail("the edge step computed no activation gradient".into()));
        }
        let weight = edgefreeze_wire::convert::counted_labels(&self.loss, &labels);
        for (p, g) in self.parameters.iter_mut().zip(grads) {
            let g = g.ok_or_else(|| Status::internal(format!("the edge step computed no {}", p.grad_output)))?;
            for (s, &x) in p.sum.iter_mut().zip(g.iter()) {
                *s += weight * f64::from(x);
            }
        }
        self.counted += weight;
        self.next_micro_batch += 1;
        Ok(MicroBatchDown {
            header: Some(h.clone()),
            loss,
            correct,
            correct_samples,
            activation_grad,
            times: Some(EdgeTimes {
                received_unix_nanos: received,
                compute_start_unix_nanos: compute_start,
                compute_end_unix_nanos: compute_end,
                sent_unix_nanos: unix_nanos_now(),
            }),
        })
    }

    /// What an update request must pass whenever it comes: its header, session, step and
    /// learning rate.
    fn check_update(&self, request: &ApplyUpdateRequest) -> Result<(), Status> {
        let h = header::required(request.header.as_ref(), "ApplyUpdateRequest")?;
        self.check_usable(h)?;
        self.check_step("apply update", h)?;
        if !request.lr.is_finite() || request.lr < 0.0 {
            return Err(Status::invalid_argument(format!("learning rate {} is not a finite number ≥ 0", request.lr)));
        }
        Ok(())
    }

    fn apply(&mut self, request: &ApplyUpdateRequest) -> Result<ApplyUpdateResponse, Status> {
        self.check_update(request)?;
        if self.next_micro_batch != self.info.micro_batches {
            return Err(Status::failed_precondition(format!(
                "apply update of step {}: {} of {} micro-batches received",
                self.step, self.next_micro_batch, self.info.micro_batches
            )));
        }
        // The batch's mean gradient: Σ c_i g_i / Σ c_i (c_i the counted labels of
        // micro-batch i), which is the full batch's gradient when nothing in the edge side
        // couples samples (BatchNorm does, per micro-batch). Nothing counted: all were 0.
        let total = if self.counted > 0.0 { self.counted } else { 1.0 };
        let mut grads = Vec::new();
        for p in &self.parameters {
            let mean: Vec<f32> = p.sum.iter().map(|&s| (s / total) as f32).collect();
            let array = ArrayD::from_shape_vec(p.shape.clone(), mean).map_err(|e| Status::internal(e.to_string()))?;
            grads.push((p.grad_output.clone(), Value::F32(array)));
        }
        let lr = Value::scalar_f32(request.lr as f32);
        // The gradients fed are already the batch's mean, not a sum of M micro-batch means.
        let scale = Value::scalar_f32(1.0);
        let step = Value::scalar_i64(i64::try_from(self.step + 1).unwrap_or(i64::MAX));
        let state = self.ws.state_names();
        let wanted: Vec<String> =
            self.ws.inputs(self.apply_graph).iter().filter(|i| !state.contains(i)).cloned().collect();
        let mut borrowed: Vec<(&str, &Value)> = Vec::new();
        for input in &wanted {
            let value = if input == LEARNING_RATE {
                &lr
            } else if input == STEP {
                &step
            } else if input == GRAD_SCALE {
                &scale
            } else if let Some((_, g)) = grads.iter().find(|(n, _)| n == input) {
                g
            } else {
                return Err(self.fail(format!("the edge apply graph reads {input}, which the session does not have")));
            };
            borrowed.push((input.as_str(), value));
        }
        let compute_start = unix_nanos_now();
        self.ws
            .run(self.apply_graph, &borrowed)
            .map_err(|e| self.fail(format!("edge apply of step {}: {e}", self.step)))?;
        let compute_end = unix_nanos_now();
        self.step += 1;
        self.shared.step.store(self.step, Ordering::Relaxed);
        self.next_micro_batch = 0;
        self.counted = 0.0;
        for p in &mut self.parameters {
            p.sum.iter_mut().for_each(|s| *s = 0.0);
        }
        if request.checkpoint
            && let Some(store) = &self.store
        {
            let state = self.state_values()?;
            store.write(self.step, &state).map_err(|status| {
                Status::internal(format!(
                    "update applied (session {} is at step {}), but the checkpoint was not written: {}",
                    self.info.id,
                    self.step,
                    status.message()
                ))
            })?;
        }
        Ok(ApplyUpdateResponse {
            header: Some(Header::new(&self.info.id, self.step, 0, self.info.model_version)),
            state_bytes: self.shared.state_bytes.load(Ordering::Relaxed),
            // A server without --state-dir keeps no checkpoints: it says so here (the device
            // warns that the run cannot be resumed) rather than failing the update.
            checkpointed: request.checkpoint && self.store.is_some(),
            compute_start_unix_nanos: compute_start,
            compute_end_unix_nanos: compute_end,
        })
    }

    fn fetch(&self, h: &Header) -> Result<EdgeState, Status> {
        self.check_usable(h)?;
        self.check_between_steps("fetch state")?;
        let tensors = self
            .state_values()?
            .iter()
            .map(|(name, value)| NamedTensor { name: name.clone(), tensor: Some(tensor::from_value(value)) })
            .collect();
        Ok(EdgeState { header: Some(Header::new(&self.info.id, self.step, 0, self.info.model_version)), tensors })
    }

    fn put(&mut self, request: &PutStateRequest) -> Result<PutStateResponse, Status> {
        let h = header::required(request.header.as_ref(), "PutStateRequest")?;
        self.check_usable(h)?;
        self.check_between_steps("put state")?;
        let current = self.state_values()?;
        let mut given = Vec::new();
        for t in &request.tensors {
            let tensor =
                t.tensor.as_ref().ok_or_else(|| Status::invalid_argument(format!("state {} has no tensor", t.name)))?;
            given.push((t.name.clone(), edgefreeze_wire::tensor::to_value(&t.name, tensor, &self.limits)?));
        }
        given.sort_by(|a, b| a.0.cmp(&b.0));
        check_same_state(&current, &given)?;
        for (name, value) in given {
            self.ws.set_state(&name, value).map_err(|e| self.fail(format!("state {name}: {e}")))?;
        }
        self.step = h.step;
        self.shared.step.store(self.step, Ordering::Relaxed);
        Ok(PutStateResponse {
            header: Some(Header::new(&self.info.id, self.step, 0, self.info.model_version)),
            state_bytes: self.shared.state_bytes.load(Ordering::Relaxed),
        })
    }

    /// Every state tensor, sorted by name.
    fn state_values(&self) -> Result<Vec<(String, Value)>, Status> {
        let mut out = Vec::new();
        for name in self.ws.state_names() {
            let value = self.ws.state(&name).map_err(|e| Status::internal(format!("state {name}: {e}")))?;
            out.push((name, value));
        }
        Ok(out)
    }

    /// Marks the session failed after an engine error; the state may be half updated.
    fn fail(&mut self, message: String) -> Status {
        self.failed = Some(message.clone());
        Status::internal(message)
    }
}

/// A builder's refusal is the device's fault; its failure is the server's.
fn side_status(e: SideError) -> Status {
    match e {
        SideError::Request(m) => Status::invalid_argument(m),
        SideError::Internal(m) => Status::internal(m),
    }
}

/// Checks that `given` holds exactly the tensors of `expected`, each with its dtype and
/// shape (a checkpoint or a state put by a device must fit the graphs).
fn check_same_state(expected: &[(String, Value)], given: &[(String, Value)]) -> Result<(), Status> {
    let mut problems = Vec::new();
    for (name, value) in expected {
        match given.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{name} missing")),
            Some((_, v)) if tensor::dtype_of(v) != tensor::dtype_of(value) || v.shape() != value.shape() => problems
                .push(format!(
                    "{name} is {} {:?}, expected {} {:?}",
                    tensor::dtype_of(v).as_str_name(),
                    v.shape(),
                    tensor::dtype_of(value).as_str_name(),
                    value.shape()
                )),
            Some(_) => {}
        }
    }
    for (name, _) in given {
        if !expected.iter().any(|(n, _)| n == name) {
            problems.push(format!("{name} is not edge state of this split"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!("edge state does not fit this split: {}", problems.join("; "))))
    }
}

fn value_bytes(v: &Value) -> u64 {
    let size = match v {
        Value::F32(_) => 4,
        Value::F64(_) | Value::I64(_) => 8,
        Value::Bool(_) => 1,
    };
    (v.shape().iter().product::<usize>() * size) as u64
}

fn scalar_f32(name: &str, v: &Value) -> Result<f32, String> {
    match v {
        Value::F32(a) if a.len() == 1 => Ok(a.iter().copied().next().unwrap_or(f32::NAN)),
        other => Err(format!("output {name}: expected an f32 scalar, got shape {:?}", other.shape())),
    }
}
