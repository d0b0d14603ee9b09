//! `edgefreeze export`: an inference model with a checkpoint's trained weights.

use anyhow::{Context, Result};
use edgefreeze_train::checkpoint::list_checkpoints;
use std::path::PathBuf;

/// Arguments of `edgefreeze export`.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// A checkpoint (`<run>/checkpoints/epoch-NNNN.safetensors`), or a run folder for its latest.
    pub checkpoint: PathBuf,
    /// The ONNX model to write.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    let checkpoint = if args.checkpoint.is_dir() {
        let found = list_checkpoints(&args.checkpoint)?;
        found
            .last()
            .map(|(_, p)| p.clone())
            .with_context(|| format!("{} has no checkpoints", args.checkpoint.display()))?
    } else {
        args.checkpoint.clone()
    };
    let summary = edgefreeze_train::export::export(&checkpoint, &args.out)
        .with_context(|| format!("exporting {}", checkpoint.display()))?;
    println!(
        "wrote {} from {} (epoch {}): {} trained tensors",
        summary.path.display(),
        checkpoint.display(),
        summary.epoch,
        summary.replaced
    );
    Ok(())
}
