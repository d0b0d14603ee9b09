//! `edgefreeze plan`: probe the device and the given edge servers, predict the step time
//! of every (server, cut, micro-batch count) and print them with the choice.

use anyhow::{Context, Result, bail};
use clap::Args;
use edgefreeze_plan::{CostModel, OverlapFactors, Plan, Space, Workload};
use edgefreeze_probe::{ProbeReport, ProbeSettings, Target};
use edgefreeze_wire::auth::Credentials;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `edgefreeze plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// An inference ONNX model.
    #[arg(long)]
    pub model: PathBuf,
    /// The candidate edge servers: HOST:PORT (or http://HOST:PORT), comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub edge: Vec<String>,
    /// This device's id, as the edge servers' tokens files list it.
    #[arg(long, default_value = "device")]
    pub device_id: String,
    /// This device's token (default: the EDGEFREEZE_TOKEN environment variable, which
    /// keeps it out of the process list).
    #[arg(long)]
    pub token: Option<String>,
    /// Samples per training step.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Micro-batch counts to consider, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub micro_batches: Vec<usize>,
    /// Cuts to consider, comma-separated (default: every valid cut; `edgefreeze inspect`
    /// lists them).
    #[arg(long, value_delimiter = ',')]
    pub cuts: Option<Vec<usize>>,
    /// Layers 0..F are frozen: a cut inside them has a frozen device side (no device
    /// backward, no gradient download).
    #[arg(long, default_value_t = 0)]
    pub frozen_layers: usize,
    /// Micro-batches in flight at most (default: all of a step's).
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// Loss: cross-entropy[:smoothing] or mse.
    #[arg(long, default_value = "cross-entropy")]
    pub loss: String,
    /// Optimizer, as `edgefreeze train --optimizer` takes it.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    /// The device's engine.
    #[command(flatten)]
    pub engine: crate::train::EngineArgs,
    /// Timed repetitions of each device and edge measurement.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Timed repetitions of each link measurement.
    #[arg(long, default_value_t = 5)]
    pub link_reps: usize,
    /// Seconds after which the probe measures nothing new.
    #[arg(long, default_value_t = 120.0)]
    pub budget: f64,
    /// Seconds an edge server may take to answer a call before it is skipped.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Cost model: the share of the round trip one crossing takes.
    #[arg(long, default_value_t = CostModel::default().latency_share)]
    pub latency_share: f64,
    /// Cost model: bytes per micro-batch message besides its tensors, each way.
    #[arg(long, default_value_t = CostModel::default().message_bytes)]
    pub message_bytes: u64,
    /// Cost model: the device's overlap factor where the concurrent probe did not measure
    /// it (its compute time while the edge computes, over its time alone; 1: separate
    /// hardware).
    #[arg(long, default_value_t = CostModel::default().overlap.device)]
    pub overlap_device: f64,
    /// Cost model: the edge's overlap factor where the concurrent probe did not measure it.
    #[arg(long, default_value_t = CostModel::default().overlap.edge)]
    pub overlap_edge: f64,
    /// Cost model: the device's overlap factor with its own link where the concurrent
    /// probe did not measure it (its compute time while an activation goes up or a
    /// gradient comes down, over its time alone).
    #[arg(long, default_value_t = CostModel::default().overlap.device_link)]
    pub overlap_device_link: f64,
    /// Cost model: the overlap factor of the device's transfers with its own compute
    /// where the concurrent probe did not measure it (a transfer's time while the device
    /// computes, over its time at the link's rate).
    #[arg(long, default_value_t = CostModel::default().overlap.link)]
    pub overlap_link: f64,
    /// Skip the concurrent probe (the device computing while the edge steps): the
    /// overlap factors are then --overlap-device, --overlap-edge,
    /// --overlap-device-link and --overlap-link.
    #[arg(long)]
    pub no_concurrent_probe: bool,
    /// The device operations the concurrent probe wants at each (server, cut): where
    /// its micro-batches went by in fewer, a second session sends more (a deep cut, a
    /// long device forward).
    #[arg(long, default_value_t = edgefreeze_probe::edge::MIN_DEVICE_OPS)]
    pub concurrent_min_ops: usize,
    /// The edge's update speed in bytes of state per second (default: one update timed on
    /// each edge at each cut).
    #[arg(long)]
    pub apply_rate: Option<f64>,
    /// Print JSON (the probe's measurements, every prediction and the choice) instead of
    /// a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `plan`.
pub fn run(args: &PlanArgs) -> Result<()> {
    let token = match &args.token {
        Some(t) => t.clone(),
        None => std::env::var("EDGEFREEZE_TOKEN").context("give --token or set EDGEFREEZE_TOKEN")?,
    };
    let credentials = Credentials::new(&args.device_id, &token).context("--device-id / --token")?;
    let (engine, engine_options) = args.engine.settings()?;
    if !(args.budget.is_finite() && args.budget > 0.0) {
        bail!("--budget must be a positive number of seconds");
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    if args.max_in_flight == Some(0) {
        bail!("--max-in-flight must be at least 1");
    }
    if args.apply_rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--apply-rate must be a positive number of bytes per second");
    }
    let settings = ProbeSettings {
        micro_batches: args.micro_batches.clone(),
        cuts: args.cuts.clone(),
        frozen_layers: args.frozen_layers,
        loss: args.loss.clone(),
        optimizer: args.optimizer.clone(),
        engine,
        engine_options,
        reps: args.reps,
        link_reps: args.link_reps,
        budget: Duration::from_secs_f64(args.budget),
        timeout: Duration::from_secs_f64(args.timeout),
        apply_bytes_per_s: args.apply_rate,
        concurrent: !args.no_concurrent_probe,
        min_device_ops: args.concurrent_min_ops,
        ..ProbeSettings::new(args.batch)
    };
    let targets: Vec<Target> =
        args.edge.iter().map(|a| Target { address: a.clone(), credentials: credentials.clone() }).collect();
    if !args.json {
        eprintln!(
            "probing {} edge server(s) for {} (batch {}, micro-batches {:?}), at most {:.0} s",
            targets.len(),
            args.model.display(),
            args.batch,
            args.micro_batches,
            args.budget
        );
    }
    let report = edgefreeze_probe::probe(&args.model, &targets, &settings)
        .with_context(|| format!("probing for {}", args.model.display()))?;
    let model = CostModel {
        latency_share: args.latency_share,
        message_bytes: args.message_bytes,
        overlap: OverlapFactors {
            device: args.overlap_device,
            edge: args.overlap_edge,
            device_link: args.overlap_device_link,
            link: args.overlap_link,
        },
    };
    let workload = Workload { batch: args.batch, frozen_layers: args.frozen_layers };
    let space = Space { micro_batches: args.micro_batches.clone(), max_in_flight: args.max_in_flight };
    let plan = edgefreeze_plan::plan(&model, &report.measurements, &workload, &space).context("planning")?;
    if args.json {
        let out = serde_json::json!({
            "probe": report,
            "cost_model": model,
            "workload": workload,
            "space": space,
            "plan": plan,
            "choice": plan.chosen(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", table(&report, &plan));
    }
    Ok(())
}

fn table(report: &ProbeReport, plan: &Plan) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let m = &report.measurements;
    let _ = writeln!(
        out,
        "probed {} server(s) at {} cut(s), micro-batches of {:?} samples, in {:.1} s (device {:.1} s, links {:.1} s, \
         edges {:.1} s)",
        m.servers.len(),
        m.cuts.len(),
        report.sizes,
        report.elapsed_s,
        report.device_s,
        report.links_s,
        report.edges_s
    );
    for s in &m.servers {
        let _ = writeln!(
            out,
            "link to {}: round trip {:.2} ms, up {:.1} Mbit/s, down {:.1} Mbit/s",
            s.name,
            s.link.rtt_s * 1e3,
            s.link.up_bytes_per_s * 8e-6,
            s.link.down_bytes_per_s * 8e-6
        );
    }
    let factor = |f: &edgefreeze_plan::OverlapFit| {
        f.factor.map_or("not measured".to_string(), |k| format!("{k:.2}x"))
            + &format!(
                " ({} ops, {:.0}% overlapped, {:.2}x their time alone)",
                f.ops,
                f.mean_fraction * 100.0,
                f.mean_stretch
            )
    };
    for c in &report.concurrent {
        let _ = writeln!(
            out,
            "concurrent probe, {} at cut {} ({} samples, {:.1} s, {} session{}): device {} (beside the edge), {} \
             (beside its link), edge {}, the device's link {} (beside its compute)",
            c.server,
            c.cut,
            c.found.samples,
            c.found.seconds,
            c.found.sessions,
            if c.found.sessions == 1 { "" } else { "s" },
            factor(&c.found.device),
            factor(&c.found.device_link),
            factor(&c.found.edge),
            factor(&c.found.link)
        );
    }
    for s in &report.skipped {
        let _ = writeln!(out, "skipped: {s}");
    }
    let _ = writeln!(
        out,
        "stage times are per micro-batch, as the step runs them (compute stretched by the overlap factors \
         where device and edge compute at once, the device's where its link carries a micro-batch, the device's \
         transfers where it computes; overlap: device beside the edge / device beside its link / edge / the \
         device's link beside its compute); step times per step of the whole batch"
    );
    let width = plan.candidates.iter().map(|p| p.server.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        out,
        "{:<width$}  {:>4}  {:>3}  {:>6}  {:>19}  {:>10}  {:>8}  {:>8}  {:>8}  {:>10}  {:>9}  {:<10}  {:>9}",
        "server",
        "cut",
        "M",
        "frozen",
        "overlap",
        "fwd ms",
        "up ms",
        "edge ms",
        "down ms",
        "bwd ms",
        "period ms",
        "bottleneck",
        "step ms"
    );
    for (i, p) in plan.candidates.iter().enumerate() {
        let s = &p.stages;
        let _ = writeln!(
            out,
            "{:<width$}  {:>4}  {:>3}  {:>6}  {:>19}  {:>10.2}  {:>8.2}  {:>8.2}  {:>8.2}  {:>10.2}  {:>9.2}  {:<10}  {:>9.2}{}",
            p.server,
            p.candidate.cut,
            p.candidate.micro_batches,
            if p.frozen_device { "yes" } else { "no" },
            format!("{:.2}/{:.2}/{:.2}/{:.2}", p.overlap.device, p.overlap.device_link, p.overlap.edge, p.overlap.link),
            s.device_forward_s * 1e3,
            s.up_s * 1e3,
            s.edge_s * 1e3,
            s.down_s * 1e3,
            s.device_backward_s * 1e3,
            p.period_s * 1e3,
            p.bottleneck.name(),
            p.step_s * 1e3,
            if i == plan.choice { "  <- choice" } else { "" }
        );
    }
    let c = plan.chosen();
    let _ = writeln!(
        out,
        "choice: server {}, cut {}, M = {}: predicted step {:.2} ms (bottleneck: {})",
        c.server,
        c.candidate.cut,
        c.candidate.micro_batches,
        c.step_s * 1e3,
        c.bottleneck.name()
    );
    out
}

/// The re-planner of `device train --adapt`: the device and `edges` probed for the run's
/// model and recipe, the plan, and the candidate the run starts on.
pub fn replanner(
    trainer: &edgefreeze_device::trainer::DeviceTrainer,
    dir: &std::path::Path,
    edges: &[edgefreeze_device::trainer::EdgeAddress],
    args: &crate::device::DeviceTrainArgs,
    engine: &edgefreeze_engine::EngineKind,
    engine_options: &edgefreeze_engine::EngineOptions,
) -> Result<edgefreeze_probe::adapt::Replanner> {
    use edgefreeze_plan::{Candidate, Mode};
    use edgefreeze_probe::adapt::{AdaptSettings, Replanner};
    let spec = trainer.spec();
    let split = &trainer.device_run().split;
    let batch = spec.recipe.batch;
    let smallest = trainer.smallest_batch();
    let manifest = edgefreeze_train::run::read_manifest(&dir.join("graphs"))?;
    let model_path = dir.join("graphs").join(edgefreeze_autodiff::artifacts::files::FORWARD);
    let mut micro_batches: Vec<usize> = [1, 2, 4, 8, 16].into_iter().filter(|&m| m <= smallest).collect();
    if !micro_batches.contains(&split.micro_batches) {
        micro_batches.push(split.micro_batches);
        micro_batches.sort_unstable();
    }
    let cuts = args.adapt_cuts.as_ref().map(|cuts| {
        let mut cuts = cuts.clone();
        cuts.push(split.cut);
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    });
    let settings = ProbeSettings {
        micro_batches: micro_batches.clone(),
        cuts,
        frozen_layers: if split.freeze_device { split.cut + 1 } else { 0 },
        loss: manifest.loss.clone(),
        optimizer: manifest.optimizer.clone(),
        engine: engine.clone(),
        engine_options: engine_options.clone(),
        budget: Duration::from_secs_f64(args.adapt_budget.max(1.0)),
        timeout: Duration::from_secs_f64(args.edge_timeout.max(1.0)),
        ..ProbeSettings::new(batch)
    };
    let targets: Vec<Target> =
        edges.iter().map(|e| Target { address: e.address.clone(), credentials: e.credentials.clone() }).collect();
    if !args.quiet {
        eprintln!(
            "--adapt: probing the device and {} edge server(s), at most {:.0} s",
            targets.len(),
            args.adapt_budget
        );
    }
    let report = edgefreeze_probe::probe(&model_path, &targets, &settings).context("--adapt: probing")?;
    let model = CostModel::default();
    let workload = Workload { batch, frozen_layers: settings.frozen_layers };
    let space = Space { micro_batches, max_in_flight: args.max_in_flight };
    let plan = edgefreeze_plan::plan(&model, &report.measurements, &workload, &space).context("--adapt: planning")?;
    let mode = if split.sequential { Mode::Sequential } else { Mode::Pipelined(args.max_in_flight) };
    let current = Candidate {
        server: trainer.server_index().unwrap_or(0),
        cut: split.cut,
        micro_batches: split.micro_batches,
        mode,
    };
    if !args.quiet {
        let now = plan.candidates.iter().find(|p| p.candidate == current);
        let best = plan.chosen();
        eprintln!(
            "--adapt: probed in {:.1} s; this run's step is predicted at {}; the planner's choice is {} at cut {} with \
             M={} ({:.1} ms)",
            report.elapsed_s,
            now.map_or("(not measured)".into(), |p| format!("{:.1} ms", p.step_s * 1e3)),
            best.server,
            best.candidate.cut,
            best.candidate.micro_batches,
            best.step_s * 1e3
        );
    }
    // Bytes of state each side holds at a cut: parameters with their optimizer slots, and
    // statistics, in f32.
    let analysis = edgefreeze_graph::analyse(&edgefreeze_graph::import(&model_path)?)?;
    let slots = if manifest.optimizer.starts_with("adamw") { 2 } else { 1 };
    let per_layer: Vec<u64> =
        analysis.layers.iter().map(|l| 4 * ((1 + slots) * l.parameters + l.buffers) as u64).collect();
    let state_bytes = Box::new(move |cut: usize| {
        let device: u64 = per_layer.iter().take(cut + 1).sum();
        let total: u64 = per_layer.iter().sum();
        (total - device, device)
    });
    let adapt = AdaptSettings {
        policy: edgefreeze_plan::ReplanPolicy { drift: args.adapt_drift, ..Default::default() },
        check_every: args.adapt_every.max(1),
        reprobe_every: args.adapt_reprobe_every,
        ..AdaptSettings::default()
    };
    Ok(Replanner::new(
        adapt,
        settings,
        targets,
        model,
        report.measurements,
        workload,
        space,
        &plan,
        current,
        state_bytes,
    ))
}
