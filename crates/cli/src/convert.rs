//! `edgefreeze convert`: an inference model into training graphs and initial state.

use anyhow::{Context, Result};
use edgefreeze_autodiff::TrainingSpec;
use edgefreeze_autodiff::artifacts::{convert, files, parse_loss, parse_optimizer};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `edgefreeze convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The inference ONNX model.
    pub model: PathBuf,
    /// Loss: `cross-entropy[:smoothing=S]` or `mse`.
    #[arg(long, default_value = "cross-entropy")]
    pub loss: String,
    /// Optimizer: `sgd:lr=0.1,momentum=0.9,wd=5e-4[,nesterov]` or
    /// `adamw:lr=1e-3,beta1=0.9,beta2=0.999,eps=1e-8,wd=0.01`.
    #[arg(long, default_value = "sgd:lr=0.1,momentum=0.9,wd=5e-4")]
    pub optimizer: String,
    /// Freeze the first N layers (no gradient, no update).
    #[arg(long, default_value_t = 0)]
    pub freeze: usize,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs `convert`.
pub fn run(args: &ConvertArgs) -> Result<()> {
    let loss = parse_loss(&args.loss).context("--loss")?;
    let (optimizer, lr) = parse_optimizer(&args.optimizer).context("--optimizer")?;
    let start = Instant::now();
    eprintln!("[1/3] loading {}", args.model.display());
    let model = edgefreeze_graph::import(&args.model)?;
    eprintln!("[2/3] building the training-step, eval and gradient graphs");
    let spec = TrainingSpec { loss, optimizer, frozen: Vec::new() };
    let source = args.model.display().to_string();
    let artifacts = convert(&model, &source, &spec, args.freeze, (&args.loss, &args.optimizer, lr))
        .with_context(|| format!("converting {source}"))?;
    eprintln!("[3/3] writing {}", args.out.display());
    artifacts.write(&args.out)?;
    let m = &artifacts.manifest;
    let trainable = m.state.iter().filter(|s| s.role == "parameter").count();
    let frozen = m.state.iter().filter(|s| s.role == "frozen").count();
    println!("converted {source} in {:.2} s", start.elapsed().as_secs_f64());
    println!(
        "  forward: {} nodes; train step: {} nodes (+{}); eval: {}; gradient: {}",
        m.forward_nodes,
        m.train_step.nodes,
        m.train_step.nodes as i64 - m.forward_nodes as i64,
        m.eval.nodes,
        m.gradient.nodes
    );
    println!("  parameters: {trainable} trainable, {frozen} frozen ({} layers frozen)", m.frozen_layers);
    let ops: Vec<String> = m.train_step.ops.iter().map(|(op, n)| format!("{op}×{n}")).collect();
    println!("  ops in {}: {}", files::TRAIN_STEP, ops.join(" "));
    println!(
        "  wrote {}, {}, {}, {}, {}, {}",
        files::FORWARD,
        files::TRAIN_STEP,
        files::EVAL,
        files::GRADIENT,
        files::STATE,
        files::MANIFEST
    );
    Ok(())
}
