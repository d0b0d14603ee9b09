//! `edgefreeze`: the command-line front end.

mod bench;
mod convert;
mod device;
mod edge;
mod export;
mod inspect;
mod plan;
mod shape;
mod train;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// edgefreeze: cheaper neural-network training on ONNX graphs, with layer freezing and
/// device/edge partitioning.
#[derive(Debug, Parser)]
#[command(name = "edgefreeze", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a model's layers, parameters, FLOPs and valid cut points.
    Inspect(inspect::InspectArgs),
    /// Turn an inference model into training-step, eval and gradient graphs.
    Convert(convert::ConvertArgs),
    /// Train a model on a dataset, with checkpoints, metrics and plots.
    Train(Box<train::TrainArgs>),
    /// Write an inference model with a checkpoint's trained weights.
    Export(export::ExportArgs),
    /// Run an edge server for device–edge split training (or make a device token).
    Edge(edge::EdgeArgs),
    /// Train a split model's device side on this device's data, with an edge server
    /// training the rest.
    Device(Box<device::DeviceArgs>),
    /// Probe the device and edge servers and plan a split: predicted step time of every
    /// (server, cut, micro-batch count), and the choice.
    Plan(Box<plan::PlanArgs>),
    /// Measure training throughput of the engines (and PyTorch eager) and write a results file.
    Bench(bench::BenchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Edge(_)) {
        one_malloc_arena();
    }
    let result: Result<()> = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Edge(args) => edge::run(&args),
        Command::Device(args) => device::run(&args),
        Command::Plan(args) => plan::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One run's training step allocates from one thread and computes on others (tract runs
/// a multi-threaded step on a thread of its pool; the loader and the reference model have
/// threads of their own): with glibc's arena per thread, memory one thread frees is not
/// reused by another, and tract's 2-thread step peaked 10–30% above its 1-thread one
/// (ResNet-20 at batch 128: 442 against 409 MiB; MobileNetV2 ×0.5 182–199 against 150),
/// at the same speed. One arena for the process. The edge server keeps glibc's default:
/// its sessions run on threads of their own, concurrently.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it runs before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
