//! The device's connection to an edge server over gRPC: a session opened with the
//! device's credentials, and the training stream as a [`Link`].
//!
//! The engines are not async, so the device's compute runs on the calling thread and a
//! small tokio runtime drives the network: a sender task streams the activations the
//! compute thread queues (tonic pulls them from a channel), and a receiver task reads the
//! replies off the response stream into a channel the compute thread waits on. So while
//! the device computes, its last activation goes up and earlier gradients come down.

use crate::error::{DeviceError, Result};
use crate::pipeline::{Download, EdgeTimes, Link, Tag, Upload};
use edgefreeze_engine::Value;
use edgefreeze_wire::pb::{self, Header};
use edgefreeze_wire::{EdgeClient, Limits, auth::Credentials, tensor};
use std::sync::mpsc;
use std::time::Duration;

/// How many micro-batches may wait in the sender's queue before `send` blocks.
const UPLINK_QUEUE: usize = 64;

/// A status from the edge: a lost server (the connection broke, the call timed out, the
/// server is shutting down) or a refusal that a retry would get again.
fn classify(address: &str, what: &str, s: &tonic::Status) -> DeviceError {
    use tonic::Code;
    match s.code() {
        // tonic reports a broken connection as Unavailable or Unknown (a transport error
        // with no status from the server), and a call cut off as Cancelled.
        Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted | Code::Unknown => {
            DeviceError::EdgeLost {
                address: address.into(),
                message: format!("{what}: {:?}: {}", s.code(), s.message()),
            }
        }
        _ => DeviceError::Link(format!("refused {what}: {:?}: {}", s.code(), s.message())),
    }
}

fn lost(address: &str, message: String) -> DeviceError {
    DeviceError::EdgeLost { address: address.into(), message }
}

fn wire(e: edgefreeze_wire::WireError) -> DeviceError {
    DeviceError::Link(e.to_string())
}

/// Runs a call on the runtime, giving up after `timeout` (a server that stopped
/// answering is lost, the same as one whose connection broke).
fn call<T>(
    runtime: &tokio::runtime::Handle,
    address: &str,
    timeout: Duration,
    what: &str,
    future: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    runtime.block_on(answered(address, timeout, what, future))
}

/// A call's answer, or why there is none (see [`call`]).
async fn answered<T>(
    address: &str,
    timeout: Duration,
    what: &str,
    future: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, future).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(classify(address, what, &s)),
        Err(_) => Err(lost(address, format!("{what}: no answer in {:.1} s", timeout.as_secs_f64()))),
    }
}

fn nanos_to_us(ns: u64) -> i64 {
    (ns / 1000) as i64
}

/// The pipeline's tag of a header.
pub fn tag_of(h: &Header) -> Tag {
    Tag { session: h.session_id.clone(), step: h.step, micro_batch: h.micro_batch, version: h.model_version }
}

/// The header of a pipeline tag.
pub fn header_of(t: &Tag) -> Header {
    Header::new(&t.session, t.step, t.micro_batch, t.version)
}

/// A session on an edge server.
pub struct EdgeSession {
    runtime: tokio::runtime::Runtime,
    client: EdgeClient,
    limits: Limits,
    address: String,
    timeout: Duration,
    /// The edge's answer to OpenSession (session id, step, version, ports, limits).
    pub opened: pb::OpenSessionResponse,
}

impl EdgeSession {
    /// Connects to `address` and opens a session (a new run, or a resumed one). A server
    /// that does not answer within `timeout` (connection, each call, each reply) is lost.
    pub fn open(
        address: &str,
        credentials: Credentials,
        request: pb::OpenSessionRequest,
        timeout: Duration,
    ) -> Result<EdgeSession> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("edgefreeze-device-net")
            .enable_all()
            .build()
            .map_err(|e| DeviceError::Link(format!("cannot start the network runtime: {e}")))?;
        let mut limits = Limits::default();
        let connect =
            async { tokio::time::timeout(timeout, edgefreeze_wire::connect(address, credentials, &limits)).await };
        let mut client = match runtime.block_on(connect) {
            Ok(Ok(c)) => c,
            // Nothing listens there (yet): as lost as a server that vanished.
            Ok(Err(e)) => return Err(lost(address, e.to_string())),
            Err(_) => return Err(lost(address, format!("no connection in {:.1} s", timeout.as_secs_f64()))),
        };
        let opened = call(runtime.handle(), address, timeout, "the session", client.open_session(request))?;
        if opened.header.is_none() {
            return Err(DeviceError::Link("the edge's OpenSession answer has no header".into()));
        }
        if opened.max_message_bytes > 0 {
            limits.max_message_bytes = limits.max_message_bytes.min(opened.max_message_bytes as usize);
        }
        Ok(EdgeSession { runtime, client, limits, address: address.into(), timeout, opened })
    }

    /// The header the edge opened the session with (its step is where the edge stands).
    pub fn header(&self) -> Header {
        self.opened.header.clone().unwrap_or_default()
    }

    /// Opens the training stream.
    pub fn stream(&self) -> GrpcLink {
        let (up, queue) = tokio::sync::mpsc::channel::<pb::MicroBatchUp>(UPLINK_QUEUE);
        let (deliver, down) = mpsc::channel::<Result<Download>>();
        let mut client = self.client.clone();
        let limits = self.limits;
        let address = self.address.clone();
        self.runtime.spawn(async move {
            let requests = tokio_stream::wrappers::ReceiverStream::new(queue);
            let mut replies = match client.train(requests).await {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    let _ = deliver.send(Err(classify(&address, "the training stream", &s)));
                    return;
                }
            };
            loop {
                let item = match replies.message().await {
                    Ok(Some(m)) => download(m, &limits, crate::pipeline::now_us()),
                    Ok(None) => Err(lost(&address, "the edge closed the training stream".into())),
                    Err(s) => Err(classify(&address, "a micro-batch", &s)),
                };
                let last = item.is_err();
                if deliver.send(item).is_err() || last {
                    return;
                }
            }
        });
        GrpcLink {
            runtime: self.runtime.handle().clone(),
            client: self.client.clone(),
            up: Some(up),
            down,
            sends_dropout_seed: self.opened.needs_dropout_seed,
            edge_checkpoint_missed: false,
            update: None,
            address: self.address.clone(),
            timeout: self.timeout,
        }
    }

    /// Copies the edge's state of the session out (between steps).
    pub fn fetch_state(&self, header: &Header) -> Result<Vec<(String, Value)>> {
        let mut client = self.client.clone();
        let request = pb::FetchStateRequest { header: Some(header.clone()) };
        let state = call(self.runtime.handle(), &self.address, self.timeout, "the state", client.fetch_state(request))?;
        state
            .tensors
            .iter()
            .map(|t| {
                let value = t
                    .tensor
                    .as_ref()
                    .ok_or_else(|| DeviceError::Link(format!("edge state tensor {:?} has no data", t.name)))
                    .and_then(|v| tensor::to_value(&t.name, v, &self.limits).map_err(wire))?;
                Ok((t.name.clone(), value))
            })
            .collect()
    }

    /// Replaces the session's whole state and moves it to `header.step` (between steps):
    /// how the edge side of a run moves to another server. Returns the edge's header.
    pub fn put_state(&self, header: &Header, state: &[(String, Value)]) -> Result<Header> {
        let mut client = self.client.clone();
        let tensors = state
            .iter()
            .map(|(name, value)| pb::NamedTensor { name: name.clone(), tensor: Some(tensor::from_value(value)) })
            .collect();
        let request = pb::PutStateRequest { header: Some(header.clone()), tensors };
        let answer = call(self.runtime.handle(), &self.address, self.timeout, "the state", client.put_state(request))?;
        answer.header.ok_or_else(|| DeviceError::Link("the edge's PutState answer has no header".into()))
    }

    /// Frees the session on the edge.
    pub fn close(&self, header: &Header) -> Result<()> {
        let mut client = self.client.clone();
        let request = pb::CloseSessionRequest { header: Some(header.clone()) };
        call(self.runtime.handle(), &self.address, self.timeout, "closing the session", client.close_session(request))?;
        Ok(())
    }
}

fn download(m: pb::MicroBatchDown, limits: &Limits, arrived_us: i64) -> Result<Download> {
    let header = m.header.as_ref().ok_or_else(|| DeviceError::Link("a reply has no header".into()))?;
    let grad_activation = match &m.activation_grad {
        Some(t) => Some(tensor::to_value("activation_grad", t, limits).map_err(wire)?),
        None => None,
    };
    let times = m.times.unwrap_or_default();
    Ok(Download {
        tag: tag_of(header),
        loss: f64::from(m.loss),
        correct: m.correct_samples.unwrap_or(m.correct.unwrap_or(0) as f64),
        grad_activation,
        edge: EdgeTimes {
            received_us: nanos_to_us(times.received_unix_nanos),
            start_us: nanos_to_us(times.compute_start_unix_nanos),
            end_us: nanos_to_us(times.compute_end_unix_nanos),
            sent_us: nanos_to_us(times.sent_unix_nanos),
        },
        arrived_us: Some(arrived_us),
    })
}

/// The training stream of a session.
pub struct GrpcLink {
    runtime: tokio::runtime::Handle,
    client: EdgeClient,
    up: Option<tokio::sync::mpsc::Sender<pb::MicroBatchUp>>,
    down: mpsc::Receiver<Result<Download>>,
    /// The edge side has Dropout and takes a seed with every micro-batch.
    sends_dropout_seed: bool,
    /// An update asked the edge for a checkpoint and it wrote none (it keeps none).
    edge_checkpoint_missed: bool,
    /// The update call in flight, and whether it asked for a checkpoint.
    update: Option<(tokio::task::JoinHandle<Result<pb::ApplyUpdateResponse>>, bool)>,
    address: String,
    timeout: Duration,
}

impl GrpcLink {
    /// Whether the edge declined a checkpoint this stream asked for (a server started
    /// without a state folder keeps none: the run cannot be resumed there).
    pub fn edge_checkpoint_missed(&self) -> bool {
        self.edge_checkpoint_missed
    }
}

impl Link for GrpcLink {
    fn send(&mut self, upload: Upload) -> Result<()> {
        let message = pb::MicroBatchUp {
            header: Some(header_of(&upload.tag)),
            activation: Some(tensor::from_value(&upload.activation)),
            labels: Some(tensor::from_value(&upload.labels)),
            dropout_seed: if self.sends_dropout_seed { upload.dropout_seed } else { None },
            sent_unix_nanos: (upload.sent_us.max(0) as u64) * 1000,
        };
        let up = self.up.as_ref().ok_or_else(|| DeviceError::Link("the training stream is closed".into()))?;
        if up.blocking_send(message).is_err() {
            // The stream ended; the receiver has the reason.
            return Err(match self.down.recv_timeout(self.timeout) {
                Ok(Err(e)) => e,
                _ => lost(&self.address, "the training stream ended".into()),
            });
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<Download> {
        match self.down.recv_timeout(self.timeout) {
            Ok(reply) => reply,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(lost(&self.address, format!("no reply to a micro-batch in {:.1} s", self.timeout.as_secs_f64())))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(lost(&self.address, "the training stream ended".into())),
        }
    }

    fn request_update(&mut self, tag: &Tag, lr: f64, checkpoint: bool) -> Result<()> {
        let mut client = self.client.clone();
        // The edge holds it until the step's last micro-batch has run (it may well arrive
        // first: it is small and the last activation is still going up).
        let request =
            pb::ApplyUpdateRequest { header: Some(header_of(tag)), lr, checkpoint, after_last_micro_batch: true };
        let (address, timeout) = (self.address.clone(), self.timeout);
        let task = self
            .runtime
            .spawn(async move { answered(&address, timeout, "the update", client.apply_update(request)).await });
        // A call left from a step that failed is abandoned (its answer is not wanted).
        if let Some((old, _)) = self.update.replace((task, checkpoint)) {
            old.abort();
        }
        Ok(())
    }

    fn update_answer(&mut self) -> Result<Tag> {
        let (task, checkpoint) =
            self.update.take().ok_or_else(|| DeviceError::Link("no update was requested".into()))?;
        let answer = self
            .runtime
            .block_on(task)
            .map_err(|e| DeviceError::Link(format!("the update call did not finish: {e}")))??;
        self.answered_update(answer, checkpoint).map(|(tag, _)| tag)
    }
}

impl GrpcLink {
    /// Asks for an update after every micro-batch of its step has been answered and
    /// waits for it → the edge's header and the seconds the edge says it computed the
    /// update for (its answer's compute interval: no link, no queueing on either side).
    pub fn timed_update(&mut self, tag: &Tag, lr: f64, checkpoint: bool) -> Result<(Tag, f64)> {
        let mut client = self.client.clone();
        let request =
            pb::ApplyUpdateRequest { header: Some(header_of(tag)), lr, checkpoint, after_last_micro_batch: false };
        let answer = call(&self.runtime, &self.address, self.timeout, "the update", client.apply_update(request))?;
        self.answered_update(answer, checkpoint)
    }

    fn answered_update(&mut self, answer: pb::ApplyUpdateResponse, checkpoint: bool) -> Result<(Tag, f64)> {
        if checkpoint && !answer.checkpointed {
            self.edge_checkpoint_missed = true;
        }
        let header = answer.header.ok_or_else(|| DeviceError::Link("the update's answer has no header".into()))?;
        let compute_ns = answer.compute_end_unix_nanos.saturating_sub(answer.compute_start_unix_nanos);
        Ok((tag_of(&header), compute_ns as f64 * 1e-9))
    }
}

impl Drop for GrpcLink {
    fn drop(&mut self) {
        // Closing the queue ends the request stream, which lets the edge end the call.
        self.up.take();
    }
}
