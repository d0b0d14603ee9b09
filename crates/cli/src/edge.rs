//! `edgefreeze edge serve` (the edge server of device–edge split training) and
//! `edgefreeze edge token`.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use edgefreeze_edge::{EdgeConfig, EdgeServer};
use edgefreeze_wire::Limits;
use edgefreeze_wire::auth::TokenTable;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// `edgefreeze edge ...`.
#[derive(Debug, Args)]
pub struct EdgeArgs {
    #[command(subcommand)]
    command: EdgeCommand,
}

#[derive(Debug, Subcommand)]
enum EdgeCommand {
    /// Serve devices: train the edge side of their split models.
    Serve(ServeArgs),
    /// Print a new random device token (for a tokens-file line `device_id token`).
    Token,
    /// Emulate a link in front of an edge server: a proxy on 127.0.0.1 with a rate and
    /// a delay each way, whose rate can change while it runs (benchmarks).
    Shape(crate::shape::ShapeArgs),
}

/// `edgefreeze edge serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (HOST:PORT; port 0 picks a free one, printed on start).
    #[arg(long)]
    pub listen: String,
    /// The devices it accepts: one `device_id token` line each.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Engine of every session: tract (pure Rust), ort:cpu, ort:cuda or ort:xnnpack.
    #[arg(long, default_value = "tract")]
    pub engine: String,
    /// Threads per session (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The ONNX Runtime library (default: ORT_DYLIB_PATH, then the onnxruntime Python package).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// Most sessions at once.
    #[arg(long, default_value_t = edgefreeze_edge::DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Most bytes of edge state (state tensors and gradient sums) per session.
    #[arg(long, default_value_t = edgefreeze_edge::DEFAULT_MAX_SESSION_BYTES)]
    pub max_session_bytes: u64,
    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, default_value_t = edgefreeze_wire::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Free a session after this many seconds without a call.
    #[arg(long, default_value_t = edgefreeze_edge::DEFAULT_IDLE_TIMEOUT.as_secs_f64())]
    pub idle_timeout: f64,
    /// Keep each run's edge checkpoints here (needed for device --resume).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

pub fn run(args: &EdgeArgs) -> Result<()> {
    match &args.command {
        EdgeCommand::Serve(serve) => run_serve(serve),
        EdgeCommand::Shape(shape) => crate::shape::run(shape),
        EdgeCommand::Token => {
            println!("{}", edgefreeze_wire::auth::generate_token()?);
            Ok(())
        }
    }
}

fn run_serve(args: &ServeArgs) -> Result<()> {
    let tokens = TokenTable::load(&args.tokens)?;
    let (engine, engine_options) = crate::train::engine_settings(&args.engine, args.threads, args.ort_lib.clone())?;
    if !(args.idle_timeout.is_finite() && args.idle_timeout > 0.0) {
        bail!("--idle-timeout must be a positive number of seconds");
    }
    let mut config = EdgeConfig::new(edgefreeze_edge::side::split_builder());
    config.engine = engine;
    config.engine_options = engine_options;
    config.max_sessions = args.max_sessions;
    config.max_session_bytes = args.max_session_bytes;
    config.idle_timeout = Duration::from_secs_f64(args.idle_timeout);
    config.state_dir = args.state_dir.clone();
    config.limits = Limits { max_message_bytes: args.max_message_bytes, ..Limits::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    runtime.block_on(async {
        let server = EdgeServer::start(config, tokens, &args.listen).await?;
        // The first line of standard output is the address, for scripts that listen on port 0.
        println!("edge server listening on {}", server.local_addr());
        std::io::stdout().flush()?;
        server
            .serve_until(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}
