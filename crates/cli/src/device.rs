//! `edgefreeze device train`: train the front of a model on this device's data, with an
//! edge server training the rest.

use crate::train::{EngineArgs, RUNS_ROOT, RecipeArgs};
use anyhow::{Context, Result, bail};
use edgefreeze_device::split::SplitSettings;
use edgefreeze_device::trainer::{
    DeviceOptions, DeviceTrainer, EdgeAddress, create_device_run, schedule_plot_path, steps_plot_path,
};
use edgefreeze_train::run::{check_writable, claim_numbered, free_run_folder, next_numbered, resolve_run, runs_parent};
use edgefreeze_train::{ModelSource, TrainOptions};
use edgefreeze_wire::auth::Credentials;
use std::path::{Path, PathBuf};

/// Arguments of `edgefreeze device`.
#[derive(Debug, clap::Args)]
pub struct DeviceArgs {
    #[command(subcommand)]
    command: DeviceCommand,
}

#[derive(Debug, clap::Subcommand)]
enum DeviceCommand {
    /// Train the device's layers of a split model with an edge server training the rest.
    Train(DeviceTrainArgs),
}

/// Arguments of `edgefreeze device train`.
#[derive(Debug, clap::Args)]
pub struct DeviceTrainArgs {
    /// The edge servers, in order of preference: HOST:PORT or http://HOST:PORT, comma
    /// separated. The run opens on the first that answers; the others take over when it
    /// is lost.
    #[arg(long, value_delimiter = ',', required = true)]
    pub edge: Vec<String>,
    /// Seconds without an answer (to a call or a micro-batch) after which a server is lost.
    #[arg(long, default_value_t = 30.0)]
    pub edge_timeout: f64,
    /// Seconds to keep trying the servers after one is lost (the lost one too: it may
    /// restart at its address) before the run stops.
    #[arg(long, default_value_t = 30.0)]
    pub failover_wait: f64,
    /// Updates between consistent copies of both sides (the edge's state fetched), from
    /// which a fail-over continues (0: at the start of each epoch only).
    #[arg(long, default_value_t = 20)]
    pub sync_every: u64,
    /// When no edge server takes a lost run over within --failover-wait, train the edge's
    /// layers on this device too instead of stopping (the checkpoints then hold both sides).
    #[arg(long)]
    pub alone_if_no_edge: bool,
    /// Re-plan while training: probe the device and the edge servers first, then, when
    /// the measured step drifts from its prediction, re-probe the links and move to
    /// another server, cut or micro-batch count when that saves more than it costs.
    #[arg(long)]
    pub adapt: bool,
    /// --adapt: seconds the first probe may take.
    #[arg(long, default_value_t = 60.0)]
    pub adapt_budget: f64,
    /// --adapt: the cuts to probe and re-plan among, comma-separated (default: every
    /// valid cut; the run's own cut is always among them). Probing every cut of a deep
    /// model on several servers does not fit a short --adapt-budget.
    #[arg(long, value_delimiter = ',')]
    pub adapt_cuts: Option<Vec<usize>>,
    /// --adapt: updates between checks of the measured step against its prediction.
    #[arg(long, default_value_t = 10)]
    pub adapt_every: u64,
    /// --adapt: relative drift of the measured step from its prediction that calls for a
    /// re-probe.
    #[arg(long, default_value_t = 0.25)]
    pub adapt_drift: f64,
    /// --adapt: also re-probe the links every N updates, drift or not (a server whose link
    /// got better shows in no measured step; off by default: each re-probe takes time).
    #[arg(long)]
    pub adapt_reprobe_every: Option<u64>,
    /// This device's id, as the edge's tokens file lists it.
    #[arg(long, default_value = "device")]
    pub device_id: String,
    /// This device's token (default: the EDGEFREEZE_TOKEN environment variable, which
    /// keeps it out of the process list).
    #[arg(long)]
    pub token: Option<String>,
    /// An inference ONNX model.
    #[arg(long, required_unless_present = "resume")]
    pub model: Option<PathBuf>,
    /// Dataset: fashion-mnist, mnist, fashion-mnist-seg, mnist-seg (a label per pixel),
    /// spam-assassin, cifar10:<dir> or idx:<dir>.
    #[arg(long, required_unless_present = "resume")]
    pub data: Option<String>,
    /// Continue the device run in this folder (or the latest numbered run in it) from its
    /// last checkpoint; the edge resumes its side at the same step.
    #[arg(long, conflicts_with_all = ["model", "data", "out"])]
    pub resume: Option<PathBuf>,
    /// Run folder (default: a new numbered folder runs/<model>-<data>-device/NNNN).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Cut the model after this layer (`edgefreeze inspect` lists the valid cuts).
    #[arg(long, required_unless_present = "resume")]
    pub cut: Option<usize>,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 4)]
    pub micro_batches: usize,
    /// Sequential split learning: one micro-batch in flight (the baseline).
    #[arg(long)]
    pub sequential: bool,
    /// The device backward recomputes its forward instead of keeping activations.
    #[arg(long)]
    pub recompute: bool,
    /// Freeze the device's layers: no device backward and no gradient download.
    #[arg(long)]
    pub freeze_device: bool,
    /// Micro-batches in flight at most (default: all of a step's).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// The recipe.
    #[command(flatten)]
    pub recipe: RecipeArgs,
    /// The engine.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Draw loss and accuracy curves to this PNG after every epoch, and the pipeline's
    /// schedule (Gantt chart of the first steps) to FILE-schedule.png.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress bar or per-epoch lines.
    #[arg(long)]
    pub quiet: bool,
    /// The output of `edgefreeze plan --json` for this model and link: the run's
    /// (server, cut, M, mode) is predicted from its measurements and the prediction of
    /// each stage is logged beside the measured one (without --adapt, which predicts).
    #[arg(long, conflicts_with = "adapt")]
    pub plan: Option<PathBuf>,
}

/// Runs `device ...`.
pub fn run(args: &DeviceArgs) -> Result<()> {
    match &args.command {
        DeviceCommand::Train(args) => train(args),
    }
}

fn train(args: &DeviceTrainArgs) -> Result<()> {
    let (engine, engine_options) = args.engine.settings()?;
    if args.adapt && !(args.adapt_drift.is_finite() && args.adapt_drift > 0.0) {
        bail!("--adapt-drift must be a positive fraction");
    }
    let token = match &args.token {
        Some(t) => t.clone(),
        None => std::env::var("EDGEFREEZE_TOKEN").context("give --token or set EDGEFREEZE_TOKEN")?,
    };
    let credentials = Credentials::new(&args.device_id, &token).context("--device-id / --token")?;
    if args.max_in_flight == Some(0) {
        bail!("--max-in-flight must be at least 1");
    }
    let (dir, made) = match (&args.resume, &args.model, &args.data, args.cut) {
        (Some(dir), _, _, _) => (resolve_run(dir)?, None),
        (None, Some(model), Some(data), Some(cut)) => {
            let split = SplitSettings {
                cut,
                micro_batches: args.micro_batches,
                sequential: args.sequential,
                recompute: args.recompute,
                freeze_device: args.freeze_device,
            };
            let (dir, made) = new_run_folder(args, model, data)?;
            if !args.quiet {
                eprintln!("new device run in {}: converting {}", dir.display(), model.display());
            }
            let created = (|| -> Result<()> {
                let source = ModelSource::from_path(model, &args.recipe.loss, &args.recipe.optimizer, 0);
                let recipe = args.recipe.recipe(source.default_learning_rate()?)?;
                create_device_run(&dir, model, &args.recipe.loss, &args.recipe.optimizer, data, &recipe, split)?;
                Ok(())
            })();
            if let Err(e) = created {
                made.undo(&dir);
                return Err(e).with_context(|| format!("creating the device run in {}", dir.display()));
            }
            (dir, Some(made))
        }
        _ => bail!("give --model, --data and --cut, or --resume RUN_DIR"),
    };
    let options = DeviceOptions {
        train: TrainOptions {
            engine: engine.clone(),
            engine_options: engine_options.clone(),
            plot: args.plot.clone(),
            progress: !args.quiet,
            ..TrainOptions::default()
        },
        max_in_flight: args.max_in_flight,
        edge_timeout: seconds("--edge-timeout", args.edge_timeout)?,
        failover_wait: seconds("--failover-wait", args.failover_wait)?,
        sync_every: args.sync_every,
        alone_if_no_edge: args.alone_if_no_edge,
        ..DeviceOptions::default()
    };
    let edges: Vec<EdgeAddress> =
        args.edge.iter().map(|a| EdgeAddress { address: a.clone(), credentials: credentials.clone() }).collect();
    let mut trainer = match DeviceTrainer::open(&dir, &edges, options) {
        Ok(t) => t,
        Err(e) => {
            // A run that could not start (the edge unreachable, a wrong token) leaves no
            // folder this command made: the retry starts clean.
            if let Some(made) = made {
                made.undo(&dir);
            }
            return Err(e).with_context(|| {
                format!("opening the device run in {} with the edge at {}", dir.display(), args.edge.join(","))
            });
        }
    };
    if args.adapt {
        let adapter = crate::plan::replanner(&trainer, &dir, &edges, args, &engine, &engine_options)?;
        trainer.set_adapter(Box::new(adapter));
    }
    if let Some(path) = &args.plan {
        let prediction = predict_from_plan(path, &trainer, args.max_in_flight)
            .with_context(|| format!("--plan {}", path.display()))?;
        if !args.quiet {
            eprintln!("predicted step (from {}): {:.1} ms", path.display(), prediction.step_s * 1e3);
        }
        trainer.set_prediction(edgefreeze_probe::adapt::stage_times(&prediction));
    }
    let spec = trainer.spec().clone();
    let split = trainer.device_run().split.clone();
    if !args.quiet {
        let opened = trainer.session();
        eprintln!(
            "training {} on {} split after layer {} with the edge at {} ({}, {} micro-batches{}{}; edge state {} \
             bytes): {} epochs of batch {}, {} updates on {engine}; run folder {}",
            spec.model,
            spec.data,
            split.cut,
            trainer.edge_place().address,
            if split.sequential { "sequential" } else { "pipelined" },
            split.micro_batches,
            if split.recompute { ", recompute" } else { "" },
            if split.freeze_device { ", device layers frozen" } else { "" },
            opened.map_or(0, |o| o.state_bytes),
            spec.recipe.epochs,
            spec.recipe.batch,
            trainer.total_steps(),
            dir.display()
        );
        if trainer.epochs_done() > 0 {
            eprintln!("resuming after epoch {} (step {}) on both sides", trainer.epochs_done(), trainer.steps_done());
        }
    }
    if trainer.epochs_done() >= spec.recipe.epochs {
        println!("nothing to do: the run in {} has done its {} epochs", dir.display(), spec.recipe.epochs);
        return trainer.close().context("closing the session");
    }
    let summary = trainer.run()?;
    trainer.close().context("closing the session")?;
    let records = edgefreeze_train::metrics::read_records(&dir.join(edgefreeze_train::run::METRICS_FILE))?;
    if let Some(stages) = edgefreeze_device::stages::summarise(&records) {
        eprint!("{}", stages.table());
    }
    if let Some(acc) = summary.test_accuracy {
        println!(
            "trained {} epochs ({} updates): test accuracy {:.2}%; device checkpoint {}",
            summary.epochs,
            summary.steps,
            100.0 * acc,
            summary.checkpoint.display()
        );
    }
    if let Some(plot) = &args.plot {
        println!(
            "plots: {}, {} and {}",
            plot.display(),
            schedule_plot_path(plot).display(),
            steps_plot_path(plot).display()
        );
    }
    Ok(())
}

/// The cost model's prediction for the run `trainer` trains, from the measurements in a
/// plan file (`edgefreeze plan --json`).
fn predict_from_plan(
    path: &std::path::Path,
    trainer: &DeviceTrainer,
    max_in_flight: Option<usize>,
) -> Result<edgefreeze_plan::Prediction> {
    use edgefreeze_plan::{Candidate, CostModel, Measurements, Mode, Workload};
    #[derive(serde::Deserialize)]
    struct Probe {
        measurements: Measurements,
    }
    #[derive(serde::Deserialize)]
    struct PlanFile {
        probe: Probe,
        cost_model: CostModel,
        workload: Workload,
    }
    let text = std::fs::read_to_string(path).context("reading the plan")?;
    let file: PlanFile = serde_json::from_str(&text).context("not the output of `edgefreeze plan --json`")?;
    let split = &trainer.device_run().split;
    let address = &trainer.edge_place().address;
    let servers = &file.probe.measurements.servers;
    let server = servers
        .iter()
        .position(|s| &s.name == address)
        .or((servers.len() == 1).then_some(0))
        .with_context(|| format!("the plan measured no server at {address}"))?;
    let candidate = Candidate {
        server,
        cut: split.cut,
        micro_batches: split.micro_batches,
        mode: if split.sequential { Mode::Sequential } else { Mode::Pipelined(max_in_flight) },
    };
    // The run's own batch and frozen prefix: a frozen device side freezes every layer
    // up to its cut.
    let workload = Workload {
        batch: trainer.spec().recipe.batch,
        frozen_layers: if split.freeze_device { split.cut + 1 } else { file.workload.frozen_layers.min(split.cut) },
    };
    Ok(file.cost_model.predict(&file.probe.measurements, &workload, &candidate)?)
}

/// Whether this command made a run folder (to remove it again when the start fails).
enum Made {
    /// A numbered folder, or an `--out` folder that did not exist.
    Folder,
    /// An `--out` folder that existed (empty, or holding a run that never started).
    Existing,
}

impl Made {
    fn undo(&self, dir: &Path) {
        match self {
            Made::Folder => {
                let _ = std::fs::remove_dir_all(dir);
            }
            // Not ours to delete; what the failed start wrote is an unstarted run, which
            // the next start replaces.
            Made::Existing => {}
        }
    }
}

/// The folder of a new device run: `--out`, checked free and writable, or the next
/// numbered folder under runs/<model>-<data>-device (claimed, so two runs never share it).
fn new_run_folder(args: &DeviceTrainArgs, model: &Path, data: &str) -> Result<(PathBuf, Made)> {
    match &args.out {
        Some(out) => {
            check_writable(out).with_context(|| format!("nothing written to {}", out.display()))?;
            free_run_folder(out)?;
            let made = if out.exists() { Made::Existing } else { Made::Folder };
            if matches!(made, Made::Existing) && !args.quiet {
                eprintln!("{} holds no started run: a new run replaces what is there", out.display());
            }
            Ok((out.clone(), made))
        }
        None => {
            let mut parent = runs_parent(Path::new(RUNS_ROOT), model, data).into_os_string();
            parent.push("-device");
            let wanted = next_numbered(Path::new(&parent))?;
            Ok((claim_numbered(&wanted)?, Made::Folder))
        }
    }
}

/// A positive number of seconds.
fn seconds(flag: &str, value: f64) -> Result<std::time::Duration> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{flag} must be a positive number of seconds, not {value}");
    }
    Ok(std::time::Duration::from_secs_f64(value))
}
