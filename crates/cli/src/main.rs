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
