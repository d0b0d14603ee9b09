//! `edgefreeze`: the command-line front end.

mod convert;
mod inspect;

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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Convert(args) => convert::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
