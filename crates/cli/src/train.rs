//! `edgefreeze train`: train a model on a dataset, with checkpoints, metrics and plots.

use anyhow::{Context, Result, bail};
use edgefreeze_engine::{EngineKind, EngineOptions};
use edgefreeze_freeze::Knobs;
use edgefreeze_freeze::egeria::{
    CacheSettings, FreezePlan, FreezeSettings, Freezer, check_writable as check_cache_writable, parse_schedule,
};
use edgefreeze_train::control::Fixed;
use edgefreeze_train::run::{
    check_writable, claim_numbered, free_run_folder, latest_run, next_numbered, resolve_run, runs_parent,
};
use edgefreeze_train::{
    Controller, ModelSource, Recipe, RunFolder, Schedule, TrainOptions, Trainer, preflight, prepare_run,
};
use std::path::{Path, PathBuf};

/// Where new runs go without `--out`, and where `--resume` without a folder looks.
pub(crate) const RUNS_ROOT: &str = "runs";

/// Arguments of `edgefreeze train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// An inference ONNX model, or a folder written by `edgefreeze convert`.
    #[arg(long, required_unless_present = "resume")]
    pub model: Option<PathBuf>,
    /// Dataset: fashion-mnist, mnist, fashion-mnist-seg, mnist-seg (a label per pixel),
    /// spam-assassin, cifar10:<dir> or idx:<dir>.
    #[arg(long, required_unless_present = "resume")]
    pub data: Option<String>,
    /// Continue a run from its last checkpoint, with its own recipe: this folder, the
    /// latest run in it (runs/<model>-<data>), or without a folder the latest run in runs/.
    #[arg(long, value_name = "RUN", num_args = 0..=1, conflicts_with_all = ["model", "data", "out"])]
    pub resume: Option<Option<PathBuf>>,
    /// Run folder (default: a new numbered folder runs/<model>-<data>/NNNN).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The recipe.
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// Freezing: N (the first N layers, for the whole run), `auto` (Egeria: layers freeze
    /// front to back when their plasticity against an int8 reference model is stable;
    /// unfrozen on a learning-rate drop), or `schedule:<update>=<layers>,...` (a fixed
    /// schedule, e.g. `schedule:200=2,600=4`).
    #[arg(long, default_value = "0")]
    pub freeze: String,
    /// --freeze auto: measure plasticity every E updates.
    #[arg(long, default_value_t = Knobs::default().every)]
    pub freeze_every: u64,
    /// --freeze auto: no measurement during the first B updates.
    #[arg(long, default_value_t = Knobs::default().warmup)]
    pub freeze_warmup: u64,
    /// --freeze auto: plasticity values the slope is fitted to.
    #[arg(long, default_value_t = Knobs::default().window)]
    pub freeze_window: usize,
    /// --freeze auto: a layer is stable when |slope| < TOL × mean over the window.
    #[arg(long, default_value_t = Knobs::default().tolerance)]
    pub freeze_tol: f64,
    /// --freeze auto, with --freeze-fixed-reference: rebuild the reference model when it
    /// is R updates old.
    #[arg(long, default_value_t = Knobs::default().refresh)]
    pub freeze_refresh: u64,
    /// --freeze auto: a learning-rate drop by at least this factor unfreezes.
    #[arg(long, default_value_t = Knobs::default().lr_drop)]
    pub freeze_lr_drop: f64,
    /// --freeze auto: depth to unfreeze back to on such a drop.
    #[arg(long, default_value_t = Knobs::default().unfreeze_to)]
    pub freeze_unfreeze_to: usize,
    /// --freeze auto: also require |slope| + Z × its standard error < TOL × mean (0: the
    /// slope alone, as published).
    #[arg(long, default_value_t = Knobs::default().confidence)]
    pub freeze_confidence: f64,
    /// --freeze auto: measure only the candidate layer at each probe, as published (by
    /// default every active layer is measured, so layers whose plasticity is already
    /// stable when the one before them freezes follow it at once).
    #[arg(long)]
    pub freeze_candidate_only: bool,
    /// --freeze auto: measure against one reference per --freeze-refresh updates, each
    /// layer's history restarting at its rebuild (by default every value is measured
    /// against a reference built at the probe before, E updates earlier).
    #[arg(long)]
    pub freeze_fixed_reference: bool,
    /// --freeze auto: judge a layer by how far its plasticity has fallen, not by its
    /// slope: it is stable when the mean of its last W values is below FALL (0 to 1) ×
    /// the highest mean of W consecutive values it had since the last clear.
    #[arg(long, value_name = "FALL")]
    pub freeze_fall: Option<f64>,
    /// --freeze auto: samples of the fixed probe batch (drawn once from the seed) that
    /// plasticity is measured on.
    #[arg(long, default_value_t = 32)]
    pub freeze_probe_batch: usize,
    /// --freeze auto: threads of the reference model's engine.
    #[arg(long, default_value_t = 1)]
    pub freeze_reference_threads: usize,
    /// Do not cache the frozen prefix's outputs.
    #[arg(long)]
    pub no_cache: bool,
    /// Bytes of cached activations kept in memory (the rest spills to disk), e.g. 512M.
    #[arg(long, default_value = "512M")]
    pub cache_memory: String,
    /// Bytes the activation cache may use on disk, e.g. 2G (default: no limit). Past it
    /// (or on a full disk) caching stops, the log says so, and the run goes on.
    #[arg(long)]
    pub cache_disk: Option<String>,
    /// Folder of the activation cache (default: <run>/cache).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
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

/// The recipe flags, shared by `train` and `device train`.
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
    /// Loss: `cross-entropy[:smoothing=S,ignore=I]` (logits batch×classes, or batch×classes×H×W
    /// against a label per pixel) or `mse`.
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
    /// The recipe these flags give, with `default_lr` where `--lr` is not given.
    pub fn recipe(&self, default_lr: f64) -> Result<Recipe> {
        if self.batch == 0 || self.epochs == 0 {
            bail!("--batch and --epochs must be at least 1");
        }
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
        Ok(recipe)
    }
}

/// The engine flags, shared by `train` and `device train`.
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
    /// Make every graph run take at least F times as long (1 to 100): the engine pauses after each
    /// run for the rest. Emulates a device F times slower than this machine, e.g. a phone
    /// beside its edge server, without slowing the process's network threads.
    #[arg(long, value_name = "F")]
    pub slowdown: Option<f64>,
}

impl EngineArgs {
    /// The engine and its options.
    pub fn settings(&self) -> Result<(EngineKind, EngineOptions)> {
        let (kind, mut options) = engine_settings(&self.engine, self.threads, self.ort_lib.clone())?;
        if let Some(factor) = self.slowdown {
            // The engine's message names the flag's factor; it is checked here, before anything
            // is written, not when the first workspace is made.
            options.slowdown = Some(edgefreeze_engine::slowdown::check_slowdown(factor)?);
        }
        Ok((kind, options))
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
    Ok((kind, EngineOptions { threads, ort_library: ort_lib, ..Default::default() }))
}

/// What `--freeze` asks for.
enum FreezeArg {
    /// The first N layers for the whole run (converted that way).
    Fixed(usize),
    /// Auto or schedule: a controller (the schedule text is checked once the model's
    /// layers are known).
    Controlled(Option<String>),
}

fn parse_freeze(text: &str) -> Result<FreezeArg> {
    if text == "auto" {
        return Ok(FreezeArg::Controlled(None));
    }
    if let Some(points) = text.strip_prefix("schedule:") {
        return Ok(FreezeArg::Controlled(Some(points.to_string())));
    }
    text.parse().map(FreezeArg::Fixed).map_err(|_| {
        anyhow::anyhow!("--freeze {text:?}: use a number of layers, auto, or schedule:<update>=<layers>,...")
    })
}

/// Parses a byte count: a number with an optional K, M or G suffix (powers of 1024).
fn parse_bytes(text: &str, flag: &str) -> Result<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let scale: u64 = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => bail!("{flag} {text:?}: use a byte count such as 512M or 2G"),
    };
    let n: u64 = digits.parse().map_err(|_| anyhow::anyhow!("{flag} {text:?}: use a byte count such as 512M"))?;
    n.checked_mul(scale).ok_or_else(|| anyhow::anyhow!("{flag} {text:?} is too large"))
}

/// The number of layers of a model file or converted folder.
fn layers_of(model: &Path) -> Result<usize> {
    if model.join(edgefreeze_autodiff::artifacts::files::MANIFEST).is_file() {
        return Ok(edgefreeze_train::run::layer_count_of_graphs(model)?);
    }
    let imported = edgefreeze_graph::import(model)?;
    Ok(edgefreeze_graph::analyse(&imported)?.layers.len())
}

/// The freezing settings the flags ask for, for a model of `layers` layers.
fn freeze_settings(args: &TrainArgs, schedule: Option<&str>, layers: usize) -> Result<FreezeSettings> {
    let plan = match schedule {
        None => FreezePlan::Auto {
            knobs: Knobs {
                every: args.freeze_every,
                warmup: args.freeze_warmup,
                window: args.freeze_window,
                tolerance: args.freeze_tol,
                refresh: args.freeze_refresh,
                lr_drop: args.freeze_lr_drop,
                unfreeze_to: args.freeze_unfreeze_to,
                confidence: args.freeze_confidence,
                ahead: !args.freeze_candidate_only,
                lagged: !args.freeze_fixed_reference,
                fall: args.freeze_fall,
            },
            probe_batch: args.freeze_probe_batch,
            reference_threads: args.freeze_reference_threads,
        },
        Some(points) => FreezePlan::Schedule { points: parse_schedule(points, layers).context("--freeze schedule")? },
    };
    if let FreezePlan::Auto { knobs, .. } = &plan {
        knobs.check().context("--freeze auto")?;
    }
    let cache = CacheSettings {
        enabled: !args.no_cache,
        memory_budget: parse_bytes(&args.cache_memory, "--cache-memory")?,
        dir: args.cache_dir.clone(),
        disk_budget: args.cache_disk.as_deref().map(|t| parse_bytes(t, "--cache-disk")).transpose()?,
    };
    Ok(FreezeSettings { plan, cache })
}

/// Runs `train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    let (engine, engine_options) = args.engine.settings()?;
    let options = TrainOptions {
        engine: engine.clone(),
        engine_options,
        plot: args.plot.clone(),
        progress: !args.quiet,
        ..TrainOptions::default()
    };
    let (dir, mut trainer) = match (&args.resume, &args.model, &args.data) {
        (Some(resume), _, _) => {
            let dir = match resume {
                Some(path) => resolve_run(path)?,
                None => latest_run(Path::new(RUNS_ROOT))?,
            };
            let controller: Box<dyn Controller> = match FreezeSettings::read(&dir)? {
                Some(settings) => {
                    if args.freeze != "0" {
                        bail!("--freeze is part of the run's recipe: a resumed run keeps its own");
                    }
                    Box::new(Freezer::new(&dir, settings, engine.clone())?)
                }
                None => Box::new(Fixed),
            };
            let trainer = Trainer::open_with(&dir, options, controller)
                .with_context(|| format!("opening the run in {}", dir.display()))?;
            (dir, trainer)
        }
        (None, Some(model), Some(data)) => start(args, model, data, options)?,
        _ => bail!("give --model and --data, or --resume [RUN_DIR]"),
    };
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
    if let Some(text) = trainer.controller_summary() {
        eprintln!("freezing: {text}");
    }
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

/// Starts a new run: checks everything that can be checked (folder free and writable,
/// model converts, engine and provider available, data there and fitting the model)
/// before writing anything, so a failed start leaves nothing that blocks the retry.
fn start(args: &TrainArgs, model: &Path, data: &str, options: TrainOptions) -> Result<(PathBuf, Trainer)> {
    let freeze = parse_freeze(&args.freeze)?;
    let fixed = match freeze {
        FreezeArg::Fixed(n) => n,
        FreezeArg::Controlled(_) => 0,
    };
    let source = ModelSource::from_path(model, &args.recipe.loss, &args.recipe.optimizer, fixed);
    let default_lr = match args.recipe.lr {
        Some(lr) => lr,
        None => source.default_learning_rate()?,
    };
    let recipe = args.recipe.recipe(default_lr)?;
    // Freezing settings are checked before anything is written, so a refused flag
    // leaves nothing behind.
    let settings = match &freeze {
        FreezeArg::Fixed(_) => None,
        FreezeArg::Controlled(schedule) => Some(freeze_settings(args, schedule.as_deref(), layers_of(model)?)?),
    };
    let numbered = args.out.is_none();
    let dir = match &args.out {
        Some(out) => out.clone(),
        None => next_numbered(&runs_parent(Path::new(RUNS_ROOT), model, data))?,
    };
    let nothing_written = || format!("nothing written to {}", dir.display());
    check_writable(&dir).with_context(nothing_written)?;
    if free_run_folder(&dir)? == RunFolder::Unstarted && !args.quiet {
        eprintln!(
            "{} holds a run that never wrote a checkpoint (its start failed): a new run replaces it",
            dir.display()
        );
    }
    if !args.quiet {
        eprintln!("new run in {}: converting {}", dir.display(), model.display());
    }
    // The engine first: cheap, and no reason to wait for the conversion (preflight
    // checks it again, for library callers).
    edgefreeze_engine::check_available(&options.engine, &options.engine_options).with_context(nothing_written)?;
    let new_run = prepare_run(&source, data, &recipe).with_context(nothing_written)?;
    if !args.quiet && model.is_file() {
        for note in edgefreeze_graph::exported::notes(&*new_run.forward().with_context(nothing_written)?) {
            eprintln!("note: {note}");
        }
    }
    let checked = preflight(&new_run, &options).with_context(nothing_written)?;
    let existed = dir.exists();
    let dir = if numbered {
        let claimed = claim_numbered(&dir)?;
        if claimed != dir && !args.quiet {
            eprintln!("{} was taken by another run meanwhile: this run is in {}", dir.display(), claimed.display());
        }
        claimed
    } else {
        dir
    };
    new_run.write(&dir).with_context(|| format!("writing the run into {}", dir.display()))?;
    let started = (|| -> Result<Trainer> {
        let controller: Box<dyn Controller> = match settings {
            Some(settings) => {
                if settings.cache.enabled && args.recipe.augment.is_none() {
                    check_cache_writable(&settings.cache.dir.clone().unwrap_or_else(|| dir.join("cache")))
                        .context("--cache-dir")?;
                }
                settings.write(&dir)?;
                Box::new(Freezer::new(&dir, settings, options.engine.clone())?)
            }
            None => Box::new(Fixed),
        };
        Ok(Trainer::start(&dir, options, checked, controller)?)
    })();
    match started {
        Ok(trainer) => Ok((dir, trainer)),
        Err(e) => {
            // What the checks could not foresee (an engine refusing a graph) must not
            // leave a folder this command made either.
            if !existed || numbered {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Err(e).with_context(|| format!("starting the run in {}", dir.display()))
        }
    }
}
