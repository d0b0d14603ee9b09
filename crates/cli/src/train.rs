//! `edgefreeze train`: train a model on a dataset, with checkpoints, metrics and plots.

use anyhow::{Context, Result, bail};
use edgefreeze_engine::{EngineKind, EngineOptions};
use edgefreeze_train::{ModelSource, Recipe, Schedule, TrainOptions, Trainer, create_run};
use std::path::{Path, PathBuf};

/// Arguments of `edgefreeze train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// An inference ONNX model, or a folder written by `edgefreeze convert`.
    #[arg(long, required_unless_present = "resume")]
    pub model: Option<PathBuf>,
    /// Dataset: fashion-mnist, mnist, spam-assassin, cifar10:<dir> or idx:<dir>.
    #[arg(long, required_unless_present = "resume")]
    pub data: Option<String>,
    /// Continue the run in this folder from its last checkpoint, with its own recipe.
    #[arg(long, conflicts_with_all = ["model", "data"])]
    pub resume: Option<PathBuf>,
    /// Run folder (default: runs/<model>-<data>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The recipe.
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// Freeze the first N layers.
    #[arg(long, default_value_t = 0)]
    pub freeze: usize,
    /// The engine.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Draw loss and accuracy curves to this PNG after every epoch.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress bar or per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
}

/// What decides the numbers of a run (shared by `train` and `device train`).
#[derive(Debug, clap::Args)]
pub struct RecipeArgs {
    /// Epochs.
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Batch size.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Base learning rate (default: the optimizer's `lr=`, else 0.1 for SGD).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Learning-rate schedule: constant, cosine or step:every=E,gamma=G.
    #[arg(long, default_value = "cosine")]
    pub schedule: String,
    /// Updates of linear learning-rate warm-up before the schedule.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Optimizer: `sgd:momentum=0.9,wd=5e-4[,nesterov]` or `adamw:beta1=0.9,beta2=0.999,wd=0.01`.
    #[arg(long, default_value = "sgd:momentum=0.9,wd=5e-4")]
    pub optimizer: String,
    /// Loss: `cross-entropy[:smoothing=S]` or `mse`.
    #[arg(long, default_value = "cross-entropy")]
    pub loss: String,
    /// Seed of the data order, augmentation and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Image augmentation: `crop:P`, `flip`, or both comma-separated.
    #[arg(long)]
    pub augment: Option<String>,
    /// Train on N training samples only (a fixed random subset drawn from the seed).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Evaluate on N test samples only (a fixed random subset drawn from the seed).
    #[arg(long)]
    pub test_limit: Option<usize>,
    /// Write a step record to metrics.jsonl every N updates.
    #[arg(long, default_value_t = 20)]
    pub log_every: u64,
}

impl RecipeArgs {
    /// The recipe, with the learning rate `default_lr` where `--lr` is not given.
    pub fn recipe(&self, default_lr: f64) -> Result<Recipe> {
        let lr = self.lr.unwrap_or(default_lr);
        let recipe = Recipe {
            epochs: self.epochs,
            batch: self.batch,
            schedule: Schedule::parse(&self.schedule, lr, self.warmup).context("--schedule")?,
            seed: self.seed,
            augment: self.augment.clone(),
            train_limit: self.limit,
            test_limit: self.test_limit,
            log_every: self.log_every,
        };
        recipe.augmentation().context("--augment")?;
        if self.batch == 0 || self.epochs == 0 {
            bail!("--batch and --epochs must be at least 1");
        }
        Ok(recipe)
    }
}

/// Which engine runs the graphs (shared by the commands that train).
#[derive(Debug, clap::Args)]
pub struct EngineArgs {
    /// Engine: tract (pure Rust), ort:cpu, ort:cuda or ort:xnnpack.
    #[arg(long, default_value = "tract")]
    pub engine: String,
    /// Threads (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The ONNX Runtime library (default: ORT_DYLIB_PATH, then the onnxruntime Python package).
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
}

impl EngineArgs {
    /// The engine and its settings.
    pub fn settings(&self) -> Result<(EngineKind, EngineOptions)> {
        engine_settings(&self.engine, self.threads, self.ort_lib.clone())
    }
}

/// Engine settings from the shared flags.
pub fn engine_settings(
    engine: &str,
    threads: Option<usize>,
    ort_lib: Option<PathBuf>,
) -> Result<(EngineKind, EngineOptions)> {
    let kind: EngineKind = engine.parse().context("--engine")?;
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    Ok((kind, EngineOptions { threads, ort_library: ort_lib }))
}

pub fn default_out(model: &Path, data: &str) -> PathBuf {
    let stem = model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
    let data: String = data.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    PathBuf::from("runs").join(format!("{stem}-{data}"))
}

/// Runs `train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    let (engine, engine_options) = args.engine.settings()?;
    let dir = match (&args.resume, &args.model, &args.data) {
        (Some(dir), _, _) => dir.clone(),
        (None, Some(model), Some(data)) => {
            let source = ModelSource::from_path(model, &args.recipe.loss, &args.recipe.optimizer, args.freeze);
            let recipe = args.recipe.recipe(source.default_learning_rate()?)?;
            let dir = args.out.clone().unwrap_or_else(|| default_out(model, data));
            if !args.quiet {
                eprintln!("converting {} into {}", model.display(), dir.display());
            }
            create_run(&dir, &source, data, &recipe)
                .with_context(|| format!("creating the run in {}", dir.display()))?;
            dir
        }
        _ => bail!("give --model and --data, or --resume RUN_DIR"),
    };
    let options = TrainOptions {
        engine: engine.clone(),
        engine_options,
        plot: args.plot.clone(),
        progress: !args.quiet,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::open(&dir, options).with_context(|| format!("opening the run in {}", dir.display()))?;
    let spec = trainer.spec().clone();
    if !args.quiet {
        eprintln!(
            "training {} on {} ({} train / {} test samples) with {engine}: {} epochs of batch {}, {} updates; \
             run folder {}",
            spec.model,
            spec.data,
            trainer.data().train.len(),
            trainer.data().test.len(),
            spec.recipe.epochs,
            spec.recipe.batch,
            trainer.total_steps(),
            dir.display()
        );
        if trainer.epochs_done() > 0 {
            eprintln!("resuming after epoch {}", trainer.epochs_done());
        }
    }
    if trainer.epochs_done() >= spec.recipe.epochs {
        println!("nothing to do: the run in {} has done its {} epochs", dir.display(), spec.recipe.epochs);
        return Ok(());
    }
    let summary = trainer.run()?;
    match summary.test_accuracy {
        Some(acc) => println!(
            "trained {} epochs ({} updates): test accuracy {:.2}%; checkpoint {}",
            summary.epochs,
            summary.steps,
            100.0 * acc,
            summary.checkpoint.display()
        ),
        None => println!("nothing to do: {} epochs already done", summary.epochs),
    }
    Ok(())
}
