//! The edgefreeze edge server (EdgeMove split training, the edge half).
//!
//! A device trains the front of a model on its private data and streams the activation
//! at the cut, with the labels, to this server; the server trains the rest of the model
//! and streams back the loss, the activation gradient and its compute timestamps
//! (protocol: the `edgefreeze-wire` crate).
//!
//! - **Sessions**: `OpenSession` sends the inference model, the cut, the loss, the
//!   optimizer and the micro-batch count; the server builds the edge side (a
//!   [`SideBuilder`], by default the rewrite crate's split) on a new thread that owns the
//!   session's engine workspace (tract or ONNX Runtime), so engine work never blocks the
//!   async runtime and sessions share no state.
//! - **Steps**: each micro-batch's parameter gradients are summed (weighted by its
//!   samples); `ApplyUpdate` needs all of the step's micro-batches and applies the
//!   optimizer once to the batch's mean gradient, so a pipelined step makes the update
//!   an unpipelined one would (BatchNorm aside: its batch statistics are per micro-batch).
//! - **Authentication and isolation**: every call carries a device id and token, checked
//!   against the tokens file (`Unauthenticated` otherwise); a session id only works for
//!   the device that opened it (`PermissionDenied`).
//! - **Limits**: at most `max_sessions` sessions (`ResourceExhausted` beyond), at most
//!   `max_session_bytes` of state per session (reported at open and after each update),
//!   messages of at most `limits.max_message_bytes`, and sessions idle for
//!   `idle_timeout` are freed.
//! - **Bad input**: a malformed tensor, a shape or dtype other than the session's, a
//!   stale model version, a wrong step or an out-of-order micro-batch is refused with
//!   `InvalidArgument` or `FailedPrecondition` and a log line, before anything runs: the
//!   session stays as it was and other sessions never notice.
//! - **Probe**: a call without a session that takes a payload up and answers with as
//!   many bytes as asked (at most the message limit less 1 KiB) and its two timestamps,
//!   for the device to measure the link before it plans (`edgefreeze plan`); the same
//!   authentication as every call.
//! - **Checkpoints**: with a state folder, each run's edge state is written at open and
//!   whenever `ApplyUpdate` asks, so a device resuming at step s continues the edge at
//!   step s too (a step without a checkpoint, or another split, is refused).

mod checkpoint;
mod error;
mod log;
mod registry;
mod service;
mod session;
pub mod side;

pub use error::EdgeError;
pub use log::Log;
pub use registry::SessionReport;
pub use side::{EdgeSide, SideBuilder, SideError, SplitSpec};

use edgefreeze_engine::{EngineKind, EngineOptions};
use edgefreeze_wire::Limits;
use edgefreeze_wire::auth::TokenTable;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How an edge server runs.
#[derive(Clone)]
pub struct EdgeConfig {
    /// The engine each session's workspace runs on.
    pub engine: EngineKind,
    /// Engine settings of each session (threads per session, ONNX Runtime library).
    pub engine_options: EngineOptions,
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Most bytes of state (state tensors and gradient sums) one session may hold.
    pub max_session_bytes: u64,
    /// A session without calls for this long is freed.
    pub idle_timeout: Duration,
    /// Where runs' edge checkpoints are kept; `None` keeps none (no resume).
    pub state_dir: Option<PathBuf>,
    /// Message and tensor limits.
    pub limits: Limits,
    /// Builds the edge side of a split request.
    pub builder: SideBuilder,
    /// Where log lines go.
    pub log: Log,
}

/// Default session limit.
pub const DEFAULT_MAX_SESSIONS: usize = 16;
/// Default state limit per session: 1 GiB.
pub const DEFAULT_MAX_SESSION_BYTES: u64 = 1 << 30;
/// Default idle timeout.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

impl EdgeConfig {
    /// Defaults (tract, 16 sessions, 1 GiB each, 5 minutes idle timeout, no state folder,
    /// 64 MiB messages, log to standard error) with the given edge-side builder.
    pub fn new(builder: SideBuilder) -> EdgeConfig {
        EdgeConfig {
            engine: EngineKind::Tract,
            engine_options: EngineOptions::default(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            state_dir: None,
            limits: Limits::default(),
            builder,
            log: Log::stderr(),
        }
    }
}

impl std::fmt::Debug for EdgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeConfig")
            .field("engine", &self.engine)
            .field("max_sessions", &self.max_sessions)
            .field("max_session_bytes", &self.max_session_bytes)
            .field("idle_timeout", &self.idle_timeout)
            .field("state_dir", &self.state_dir)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A running edge server.
pub struct EdgeServer {
    address: SocketAddr,
    core: Arc<service::Core>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), EdgeError>>,
}

impl EdgeServer {
    /// Binds `listen` (`HOST:PORT`; port 0 picks a free one) and serves on the current
    /// tokio runtime until [`EdgeServer::shutdown`].
    pub async fn start(config: EdgeConfig, tokens: TokenTable, listen: &str) -> Result<EdgeServer, EdgeError> {
        if config.max_sessions == 0 {
            return Err(EdgeError::Config("--max-sessions must be at least 1".into()));
        }
        if config.idle_timeout.is_zero() {
            return Err(EdgeError::Config("the idle timeout must be positive".into()));
        }
        if let Some(dir) = &config.state_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| EdgeError::StateDir { path: dir.clone(), message: e.to_string() })?;
        }
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| EdgeError::Bind { address: listen.to_string(), source })?;
        let address =
            listener.local_addr().map_err(|source| EdgeError::Bind { address: listen.to_string(), source })?;
        let limits = config.limits;
        let idle_timeout = config.idle_timeout;
        let core = Arc::new(service::Core::new(config, tokens));
        let service = edgefreeze_wire::pb::edge_server::EdgeServer::new(service::EdgeService { core: core.clone() })
            .max_decoding_message_size(limits.max_message_bytes)
            .max_encoding_message_size(limits.max_message_bytes);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();

        // Frees idle sessions; checks a few times per timeout so none lives much past it.
        let reaper_core = Arc::downgrade(&core);
        tokio::spawn(async move {
            let period = (idle_timeout / 4).max(Duration::from_millis(10));
            loop {
                tokio::time::sleep(period).await;
                let Some(core) = reaper_core.upgrade() else { break };
                for entry in core.registry.reap(idle_timeout) {
                    core.log.line(format!(
                        "session {} of device {}: freed after {:.1} s without a call",
                        entry.info.id,
                        entry.info.device_id,
                        idle_timeout.as_secs_f64()
                    ));
                }
            }
        });

        // Without TCP_NODELAY a small reply (a loss, a probe answer) waits for the ACK
        // of the previous segment, which the device delays by up to 40 ms.
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let log = core.log.clone();
        log.line(format!("listening on {address}"));
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(service, incoming, async {
                    let _ = stopped.await;
                })
                .await
                .map_err(|e| EdgeError::Serve(e.to_string()))
        });
        Ok(EdgeServer { address, core, stop: Some(stop), task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// The open sessions, sorted by device and run.
    pub fn sessions(&self) -> Vec<SessionReport> {
        self.core.registry.reports()
    }

    /// Stops accepting calls, finishes those in flight, and returns.
    pub async fn shutdown(mut self) -> Result<(), EdgeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.finish().await
    }

    /// Serves until the server fails or `signal` completes (e.g. Ctrl-C).
    pub async fn serve_until(mut self, signal: impl std::future::Future<Output = ()>) -> Result<(), EdgeError> {
        tokio::select! {
            result = &mut self.task => return result.map_err(|e| EdgeError::Serve(e.to_string()))?,
            () = signal => {}
        }
        self.shutdown().await
    }

    async fn finish(self) -> Result<(), EdgeError> {
        self.task.await.map_err(|e| EdgeError::Serve(e.to_string()))?
    }
}
