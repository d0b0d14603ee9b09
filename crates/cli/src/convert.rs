//! `edgefreeze convert`: an inference model into training graphs and initial state.

use anyhow::{Context, Result};
use edgefreeze_autodiff::TrainingSpec;
use edgefreeze_autodiff::artifacts::{Role, convert, files, parse_loss, parse_optimizer};
use edgefreeze_rewrite::{SplitOptions, StepSpec, cached_pair, split};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `edgefreeze convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The inference ONNX model.
    pub model: PathBuf,
    /// Loss: `cross-entropy[:smoothing=S,ignore=I]` (logits batch×classes, or batch×classes×H×W
    /// against a label per pixel) or `mse`.
    #[arg(long, default_value = "cross-entropy")]
    pub loss: String,
    /// Optimizer: `sgd:lr=0.1,momentum=0.9,wd=5e-4[,nesterov]` or
    /// `adamw:lr=1e-3,beta1=0.9,beta2=0.999,eps=1e-8,wd=0.01`.
    #[arg(long, default_value = "sgd:lr=0.1,momentum=0.9,wd=5e-4")]
    pub optimizer: String,
    /// Freeze the first N layers: no gradient and no update; their BatchNorms run on
    /// running statistics. Their parameters stay graph inputs read from the state.
    #[arg(long, default_value_t = 0)]
    pub freeze: usize,
    /// Also write the cached-activation pair at this cut (after layer CUT):
    /// prefix.onnx, suffix_step.onnx and cache.json.
    #[arg(long, value_name = "CUT")]
    pub cache_at: Option<usize>,
    /// Also write the device/edge split set at this cut (after layer CUT). With
    /// --freeze CUT+1 the device side is frozen (no device backward).
    #[arg(long, value_name = "CUT")]
    pub split_at: Option<usize>,
    /// With --split-at: the device backward recomputes the device forward from the
    /// inputs instead of reading stashed activations.
    #[arg(long, requires = "split_at")]
    pub recompute: bool,
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
    for note in edgefreeze_graph::exported::notes(&model) {
        eprintln!("note: {note}");
    }
    eprintln!("[2/3] building the training-step, eval and gradient graphs");
    let step_spec = StepSpec { loss: loss.clone(), optimizer: optimizer.clone() };
    let source = args.model.display().to_string();
    // With --freeze, the training step is the frozen-prefix step (edgefreeze_rewrite::frozen_prefix_step).
    let spec = TrainingSpec { loss, optimizer, frozen: Vec::new() };
    let artifacts = convert(&model, &source, &spec, args.freeze, (&args.loss, &args.optimizer, lr))
        .with_context(|| format!("converting {source}"))?;
    let cached = match args.cache_at {
        Some(cut) => Some(cached_pair(&model, cut, &step_spec).with_context(|| format!("--cache-at {cut}"))?),
        None => None,
    };
    let split_set = match args.split_at {
        Some(cut) => {
            let frozen_device_layers = match args.freeze {
                0 => false,
                k if k == cut + 1 => true,
                k => anyhow::bail!(
                    "--split-at {cut} with --freeze {k}: freeze either nothing or exactly the device's {} layers",
                    cut + 1
                ),
            };
            let options = SplitOptions { frozen_device_layers, recompute: args.recompute };
            Some(split(&model, cut, &step_spec, options).with_context(|| format!("--split-at {cut}"))?)
        }
        None => None,
    };
    eprintln!("[3/3] writing {}", args.out.display());
    artifacts.write(&args.out)?;
    if let Some(pair) = &cached {
        pair.write(&args.out)?;
    }
    if let Some(set) = &split_set {
        set.write(&args.out)?;
    }
    let m = &artifacts.manifest;
    let trainable = m.state.iter().filter(|s| s.role == Role::Parameter).count();
    let frozen = m.state.iter().filter(|s| s.role == Role::Frozen).count();
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
    if let Some(pair) = &cached {
        let m = &pair.manifest;
        println!(
            "  cache at cut {}: {} ({} nodes), {} ({} nodes), {}; {} bytes per sample cached",
            m.cut,
            m.prefix.file,
            m.prefix.nodes,
            m.suffix_step.file,
            m.suffix_step.nodes,
            edgefreeze_rewrite::cache_files::MANIFEST,
            m.bytes_per_sample
        );
    }
    if let Some(set) = &split_set {
        let m = &set.manifest;
        let graphs: Vec<String> =
            m.graphs.iter().map(|g| format!("{} ({} nodes)", g.graph.file, g.graph.nodes)).collect();
        println!(
            "  split at cut {}: {}; {} bytes per sample up, {} down; {} stashed tensors",
            m.cut,
            graphs.join(", "),
            m.bytes_per_sample_up,
            m.bytes_per_sample_down,
            m.stash.len()
        );
    }
    Ok(())
}
