//! The `Edge` gRPC service: authentication on every call, then routing to the session's
//! thread.

use crate::EdgeConfig;
use crate::log::Log;
use crate::registry::{Entry, Registry};
use crate::session::{self, Command, Ready, StreamState};
use edgefreeze_wire::auth::{self, Credentials, TokenTable};
use edgefreeze_wire::pb::edge_server::Edge;
use edgefreeze_wire::pb::{
    ApplyUpdateRequest, ApplyUpdateResponse, CloseSessionRequest, CloseSessionResponse, EdgeState, FetchStateRequest,
    Header, MicroBatchDown, MicroBatchUp, OpenSessionRequest, OpenSessionResponse, ProbeRequest, ProbeResponse,
    PutStateRequest, PutStateResponse,
};
use edgefreeze_wire::{header, unix_nanos_now};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// Commands a session may have queued: a full pipeline of micro-batches and then some.
const QUEUE: usize = 64;

/// Room a probe answer needs besides its payload (header, timestamps, framing).
pub(crate) const PROBE_ANSWER_OVERHEAD: u64 = 1 << 10;

/// What every call of one server shares.
pub(crate) struct Core {
    pub config: EdgeConfig,
    pub tokens: TokenTable,
    pub registry: Registry,
    pub log: Log,
    versions: AtomicU64,
}

impl Core {
    pub fn new(config: EdgeConfig, tokens: TokenTable) -> Core {
        let log = config.log.clone();
        let registry = Registry::new(config.max_sessions);
        // Model versions start from the clock (µs since the Unix epoch), so a server
        // restarted at the same address never hands out a version of its previous life:
        // a device's stale message from before the restart is refused by its version.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
        Core { config, tokens, registry, log, versions: AtomicU64::new(start) }
    }

    /// The authenticated device of a call, or `Unauthenticated` (logged).
    fn authenticate(&self, metadata: &tonic::metadata::MetadataMap, call: &str) -> Result<String, Status> {
        let result = Credentials::from_metadata(metadata).and_then(|c| self.tokens.check(&c).map(str::to_string));
        result.map_err(|e| {
            self.log.line(format!("{call}: refused: {e}"));
            Status::from(e)
        })
    }

    fn session(&self, h: Option<&Header>, device: &str, call: &str) -> Result<Arc<Entry>, Status> {
        let h = header::required(h, call)?;
        self.registry.get(&h.session_id, device).inspect_err(|status| {
            self.log.line(format!("{call} of device {device}: {:?}: {}", status.code(), status.message()));
        })
    }
}

pub(crate) struct EdgeService {
    pub core: Arc<Core>,
}

fn gone(id: &str) -> Status {
    Status::not_found(format!("session {id:?} was freed while the call waited"))
}

/// Sends a command to a session's thread and waits for its answer.
async fn ask<T>(
    entry: &Entry,
    make: impl FnOnce(oneshot::Sender<Result<T, Status>>) -> Command,
) -> Result<Response<T>, Status> {
    let (reply, answer) = oneshot::channel();
    entry.commands.send(make(reply)).await.map_err(|_| gone(&entry.info.id))?;
    let result = answer.await.map_err(|_| gone(&entry.info.id))?;
    entry.shared.touch();
    result.map(Response::new)
}

type TrainStream = Pin<Box<dyn Stream<Item = Result<MicroBatchDown, Status>> + Send>>;

#[tonic::async_trait]
impl Edge for EdgeService {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let core = &self.core;
        let device = core.authenticate(request.metadata(), "open session")?;
        let request = request.into_inner();
        header::required(request.header.as_ref(), "OpenSessionRequest")?;
        auth::check_identifier("run id", &request.run_id)?;
        if let Some(old) = core.registry.remove_run(&device, &request.run_id) {
            core.log.line(format!(
                "session {} of device {device}: replaced by a new session of run {:?}",
                old.info.id, request.run_id
            ));
        }
        let slot = core.registry.reserve().inspect_err(|status| {
            core.log.line(format!("open session of device {device}: refused: {}", status.message()));
        })?;
        let id = auth::hex(&auth::random_bytes::<16>()?);
        let model_version = core.versions.fetch_add(1, Ordering::Relaxed) + 1;
        let run_id = request.run_id.clone();
        let resume = request.resume_step;
        let spawn = session::Spawn {
            id: id.clone(),
            device_id: device.clone(),
            run_id: run_id.clone(),
            model_version,
            request,
            builder: core.config.builder.clone(),
            engine: core.config.engine.clone(),
            engine_options: core.config.engine_options.clone(),
            limits: core.config.limits,
            max_state_bytes: core.config.max_session_bytes,
            state_dir: core.config.state_dir.clone(),
            log: core.log.clone(),
        };
        let (commands, receiver) = mpsc::channel(QUEUE);
        let (ready, built) = oneshot::channel();
        session::spawn(spawn, receiver, ready)
            .map_err(|e| Status::internal(format!("cannot start a session thread: {e}")))?;
        let Ready { info, shared, step } =
            built.await.map_err(|_| Status::internal("the session thread ended while building"))??;
        let response = OpenSessionResponse {
            header: Some(Header::new(&id, step, 0, model_version)),
            activation: Some(info.activation.clone()),
            labels: Some(info.labels.clone()),
            returns_activation_grad: info.returns_activation_grad,
            needs_dropout_seed: info.needs_dropout_seed,
            state_bytes: shared.state_bytes.load(Ordering::Relaxed),
            max_message_bytes: core.config.limits.max_message_bytes as u64,
            idle_timeout_ms: u64::try_from(core.config.idle_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        core.log.line(format!(
            "session {id} of device {device}: opened run {run_id:?} at step {step}{} ({} bytes of state)",
            if resume.is_some() { " (resumed)" } else { "" },
            response.state_bytes
        ));
        core.registry.insert(slot, Arc::new(Entry { info, commands, shared }));
        Ok(Response::new(response))
    }

    type TrainStream = TrainStream;

    async fn train(&self, request: Request<Streaming<MicroBatchUp>>) -> Result<Response<TrainStream>, Status> {
        let core = self.core.clone();
        let device = core.authenticate(request.metadata(), "train stream")?;
        let mut inbound = request.into_inner();
        let (out, results) = mpsc::channel(QUEUE);
        tokio::spawn(async move {
            let stream = Arc::new(StreamState { out: out.clone(), failed: AtomicBool::new(false) });
            // The stream serves one session, fixed by its first message; held weakly so an
            // open but silent stream does not keep a freed session alive.
            let mut bound: Option<(String, Weak<Entry>)> = None;
            loop {
                let message = tokio::select! {
                    m = inbound.message() => m,
                    _ = out.closed() => break,
                };
                let up = match message {
                    Ok(Some(up)) => up,
                    Ok(None) => break,
                    Err(status) => {
                        // Malformed or oversized frames, or the device went away mid-stream.
                        core.log.line(format!(
                            "train stream of device {device}: ended: {:?}: {}",
                            status.code(),
                            status.message()
                        ));
                        let _ = out.send(Err(status)).await;
                        break;
                    }
                };
                let received = unix_nanos_now();
                if stream.failed.load(Ordering::Acquire) {
                    break;
                }
                let entry = match route(&core, &device, up.header.as_ref(), &mut bound) {
                    Ok(entry) => entry,
                    Err(status) => {
                        core.log.line(format!(
                            "train stream of device {device}: {:?}: {}",
                            status.code(),
                            status.message()
                        ));
                        let _ = out.send(Err(status)).await;
                        break;
                    }
                };
                let command = Command::MicroBatch { up: Box::new(up), received, stream: stream.clone() };
                if entry.commands.send(command).await.is_err() {
                    let _ = out.send(Err(gone(&entry.info.id))).await;
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(results))))
    }

    async fn apply_update(
        &self,
        request: Request<ApplyUpdateRequest>,
    ) -> Result<Response<ApplyUpdateResponse>, Status> {
        let device = self.core.authenticate(request.metadata(), "apply update")?;
        let request = request.into_inner();
        let entry = self.core.session(request.header.as_ref(), &device, "apply update")?;
        ask(&entry, |reply| Command::Apply { request, reply }).await
    }

    async fn fetch_state(&self, request: Request<FetchStateRequest>) -> Result<Response<EdgeState>, Status> {
        let device = self.core.authenticate(request.metadata(), "fetch state")?;
        let request = request.into_inner();
        let entry = self.core.session(request.header.as_ref(), &device, "fetch state")?;
        let header = request.header.unwrap_or_default();
        ask(&entry, |reply| Command::Fetch { header, reply }).await
    }

    async fn put_state(&self, request: Request<PutStateRequest>) -> Result<Response<PutStateResponse>, Status> {
        let device = self.core.authenticate(request.metadata(), "put state")?;
        let request = request.into_inner();
        let entry = self.core.session(request.header.as_ref(), &device, "put state")?;
        ask(&entry, |reply| Command::Put { request, reply }).await
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let device = self.core.authenticate(request.metadata(), "close session")?;
        let request = request.into_inner();
        let entry = self.core.session(request.header.as_ref(), &device, "close session")?;
        self.core.registry.remove(&entry.info.id);
        let step = entry.shared.step.load(Ordering::Relaxed);
        self.core.log.line(format!("session {} of device {device}: closed at step {step}", entry.info.id));
        Ok(Response::new(CloseSessionResponse {
            header: Some(Header::new(&entry.info.id, step, 0, entry.info.model_version)),
        }))
    }

    async fn probe(&self, request: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let received = unix_nanos_now();
        let device = self.core.authenticate(request.metadata(), "probe")?;
        let request = request.into_inner();
        let header = header::required(request.header.as_ref(), "ProbeRequest")?.clone();
        // The request's own size is bounded by the server's decoding limit already.
        let limit = (self.core.config.limits.max_message_bytes as u64).saturating_sub(PROBE_ANSWER_OVERHEAD);
        if request.reply_bytes > limit {
            self.core.log.line(format!(
                "probe of device {device}: refused a reply of {} bytes (limit {limit})",
                request.reply_bytes
            ));
            return Err(Status::out_of_range(format!(
                "ProbeRequest.reply_bytes is {}: this server answers with at most {limit} bytes \
                 (its message limit less {PROBE_ANSWER_OVERHEAD} bytes)",
                request.reply_bytes
            )));
        }
        Ok(Response::new(ProbeResponse {
            header: Some(header),
            payload: vec![0; request.reply_bytes as usize],
            received_unix_nanos: received,
            sent_unix_nanos: unix_nanos_now(),
        }))
    }
}

/// The session a stream message is for: the stream's own (bound by its first message),
/// owned by the stream's device, still alive.
fn route(
    core: &Core,
    device: &str,
    h: Option<&Header>,
    bound: &mut Option<(String, Weak<Entry>)>,
) -> Result<Arc<Entry>, Status> {
    let h = header::required(h, "MicroBatchUp")?;
    match bound {
        None => {
            let entry = core.registry.get(&h.session_id, device)?;
            *bound = Some((h.session_id.clone(), Arc::downgrade(&entry)));
            Ok(entry)
        }
        Some((id, _)) if *id != h.session_id => Err(Status::invalid_argument(format!(
            "this stream serves session {id:?}; a message for session {:?} needs its own stream",
            h.session_id
        ))),
        Some((id, weak)) => {
            let entry = weak.upgrade().ok_or_else(|| {
                Status::not_found(format!("session {id:?} was freed (closed, or idle past the timeout)"))
            })?;
            entry.shared.touch();
            Ok(entry)
        }
    }
}
