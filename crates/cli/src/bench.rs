//! `edgefreeze bench`: training throughput of the engines, side by side with PyTorch
//! eager (measured by `tools/bench_pytorch.py` in the same run).

use crate::train::engine_settings;
use anyhow::{Context, Result, bail};
use edgefreeze_train::bench::{BenchOptions, BenchResult, ProfileResult, bench_training, profile_training};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `edgefreeze bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Models (file stems in --models-dir).
    #[arg(long, value_delimiter = ',', default_value = "lenet5,resnet20_28,mobilenetv2_05,transformer_text")]
    pub models: Vec<String>,
    /// Folder of the models.
    #[arg(long, default_value = "models")]
    pub models_dir: PathBuf,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    pub batches: Vec<usize>,
    /// Engines.
    #[arg(long, value_delimiter = ',', default_value = "ort:cpu,tract")]
    pub engines: Vec<String>,
    /// Threads for every engine and PyTorch (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Untimed steps.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// At least this many timed steps.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// And at least this many seconds of timed steps.
    #[arg(long, default_value_t = 2.0)]
    pub min_seconds: f64,
    /// Also measure PyTorch eager with this script (same models, batches, threads).
    #[arg(long)]
    pub pytorch: Option<PathBuf>,
    /// The Python interpreter for --pytorch.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The ONNX Runtime library.
    #[arg(long)]
    pub ort_lib: Option<PathBuf>,
    /// Instead of throughput: the training step at each of these frozen depths (and
    /// the cached suffix step where the depth ends at a cut) next to the FLOP model's
    /// prediction, e.g. `0,2,5,8,11`.
    #[arg(long, value_delimiter = ',')]
    pub freeze_depths: Option<Vec<usize>>,
    /// Instead of throughput: where the step's time goes, by op type, from the engine's
    /// own per-node times (ONNX Runtime's profiler; tract's per-node timing, counted
    /// under the ONNX op type each tract node came from).
    #[arg(long, conflicts_with_all = ["freeze_depths", "pytorch"])]
    pub profile: bool,
    /// With --profile: the op types listed per table (the rest are summed in one row).
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Results file (JSON); a Markdown table is written next to it (`.md`).
    #[arg(long, default_value = "bench-results.json")]
    pub out: PathBuf,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PytorchResults {
    torch: Option<String>,
    threads: usize,
    results: Vec<PytorchResult>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PytorchResult {
    model: String,
    batch: usize,
    samples_per_s: f64,
    step_ms_median: f64,
    steps: usize,
    /// Peak resident memory while stepping above the start, as [`BenchResult`]'s.
    #[serde(default)]
    step_peak_mib: Option<f64>,
}

/// Runs `bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let threads = args.threads.unwrap_or_else(edgefreeze_engine::default_threads);
    let options = BenchOptions {
        warmup: args.warmup,
        min_steps: args.steps,
        min_time: Duration::from_secs_f64(args.min_seconds),
    };
    if let Some(depths) = &args.freeze_depths {
        return run_depths(args, depths, threads, &options);
    }
    if args.profile {
        return run_profile(args, threads, &options);
    }
    let mut ours: Vec<BenchResult> = Vec::new();
    for model in &args.models {
        let path = args.models_dir.join(format!("{model}.onnx"));
        for engine in &args.engines {
            let (kind, engine_options) = engine_settings(engine, Some(threads), args.ort_lib.clone())?;
            for &batch in &args.batches {
                let r = bench_training(&path, &kind, &engine_options, batch, &options)
                    .with_context(|| format!("benchmarking {} on {engine} at batch {batch}", path.display()))?;
                eprintln!("{model:>18} {engine:>8} batch {batch:>4}: {:>9.1} samples/s", r.samples_per_s);
                ours.push(r);
            }
        }
    }
    let pytorch = match &args.pytorch {
        Some(script) => Some(run_pytorch(args, script, threads)?),
        None => None,
    };
    let table = markdown(&ours, pytorch.as_ref(), &args.engines);
    println!("{table}");
    let json = serde_json::json!({
        "threads": threads,
        "machine_cores": edgefreeze_engine::default_threads(),
        "edgefreeze": ours,
        "pytorch": pytorch,
    });
    edgefreeze_graph::save::write_atomically(&args.out, serde_json::to_string_pretty(&json)?.as_bytes())?;
    edgefreeze_graph::save::write_atomically(&args.out.with_extension("md"), table.as_bytes())?;
    eprintln!("wrote {} and {}", args.out.display(), args.out.with_extension("md").display());
    Ok(())
}

/// `bench --profile`: the time per op type of each model, engine and batch.
fn run_profile(args: &BenchArgs, threads: usize, options: &BenchOptions) -> Result<()> {
    let mut profiles: Vec<ProfileResult> = Vec::new();
    let mut text = String::new();
    for model in &args.models {
        let path = args.models_dir.join(format!("{model}.onnx"));
        for engine in &args.engines {
            let (kind, engine_options) = engine_settings(engine, Some(threads), args.ort_lib.clone())?;
            for &batch in &args.batches {
                let p = profile_training(&path, &kind, &engine_options, batch, options)
                    .with_context(|| format!("profiling {} on {engine} at batch {batch}", path.display()))?;
                let table = profile_table(&p, args.top);
                println!("{table}");
                text.push_str(&table);
                text.push('\n');
                profiles.push(p);
            }
        }
    }
    let json = serde_json::json!({ "threads": threads, "profiles": profiles });
    edgefreeze_graph::save::write_atomically(&args.out, serde_json::to_string_pretty(&json)?.as_bytes())?;
    edgefreeze_graph::save::write_atomically(&args.out.with_extension("md"), text.as_bytes())?;
    eprintln!("wrote {} and {}", args.out.display(), args.out.with_extension("md").display());
    Ok(())
}

/// One profile as a Markdown table: the `top` op types by time, then the rest in one row.
fn profile_table(p: &ProfileResult, top: usize) -> String {
    let mut lines = vec![
        format!(
            "{} on {}, batch {}, {} threads: step {:.2} ms (median of {} profiled), node time {:.2} ms",
            p.model, p.engine, p.batch, p.threads, p.step_ms_median, p.steps, p.node_ms_per_step
        ),
        String::new(),
        "| op type | ms per step | share | engine nodes |".to_string(),
        "|---|---:|---:|---:|".to_string(),
    ];
    for op in p.ops.iter().take(top) {
        lines.push(format!("| {} | {:.3} | {:.1}% | {} |", op.op_type, op.ms_per_run, op.share * 100.0, op.nodes));
    }
    let rest = &p.ops[top.min(p.ops.len())..];
    if !rest.is_empty() {
        let ms: f64 = rest.iter().map(|o| o.ms_per_run).sum();
        let share: f64 = rest.iter().map(|o| o.share).sum();
        let nodes: usize = rest.iter().map(|o| o.nodes).sum();
        lines.push(format!("| {} other op types | {ms:.3} | {:.1}% | {nodes} |", rest.len(), share * 100.0));
    }
    lines.join("\n") + "\n"
}

/// `bench --freeze-depths`: step times per frozen depth against the FLOP model.
fn run_depths(args: &BenchArgs, depths: &[usize], threads: usize, options: &BenchOptions) -> Result<()> {
    let mut rows = vec![
        "| model | engine | batch | frozen layers | forward FLOPs/sample behind them | frozen-prefix step ms | FLOP model ms | cached suffix step ms | FLOP model ms |".to_string(),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|".to_string(),
    ];
    let mut all = Vec::new();
    for model in &args.models {
        let path = args.models_dir.join(format!("{model}.onnx"));
        let imported = edgefreeze_graph::import(&path)?;
        for engine in &args.engines {
            let (kind, engine_options) = engine_settings(engine, Some(threads), args.ort_lib.clone())?;
            for &batch in &args.batches {
                let times =
                    edgefreeze_freeze::depths::step_times(&imported, &kind, &engine_options, batch, depths, options)
                        .with_context(|| {
                            format!("timing {} by frozen depth on {engine} at batch {batch}", path.display())
                        })?;
                for t in &times {
                    let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2}"));
                    let row = format!(
                        "| {model} | {engine} | {batch} | {} | {} | {:.2} | {:.2} | {} | {} |",
                        t.depth,
                        t.flops_after,
                        t.frozen_ms,
                        t.frozen_predicted_ms,
                        opt(t.cached_ms),
                        opt(t.cached_predicted_ms)
                    );
                    eprintln!("{row}");
                    rows.push(row);
                }
                all.push(serde_json::json!({ "model": model, "engine": engine, "batch": batch, "threads": threads, "depths": times }));
            }
        }
    }
    let table = rows.join("\n") + "\n";
    println!("{table}");
    edgefreeze_graph::save::write_atomically(&args.out, serde_json::to_string_pretty(&all)?.as_bytes())?;
    edgefreeze_graph::save::write_atomically(&args.out.with_extension("md"), table.as_bytes())?;
    eprintln!("wrote {} and {}", args.out.display(), args.out.with_extension("md").display());
    Ok(())
}

fn run_pytorch(args: &BenchArgs, script: &PathBuf, threads: usize) -> Result<PytorchResults> {
    let out = tempfile_path(&args.out);
    let batches: Vec<String> = args.batches.iter().map(|b| b.to_string()).collect();
    eprintln!("measuring PyTorch eager with {}", script.display());
    let status = std::process::Command::new(&args.python)
        .arg(script)
        .args(["--models", &args.models.join(","), "--batches", &batches.join(",")])
        .args(["--threads", &threads.to_string(), "--warmup", &args.warmup.to_string()])
        .args(["--steps", &args.steps.to_string(), "--min-seconds", &args.min_seconds.to_string()])
        .arg("--out")
        .arg(&out)
        .status()
        .with_context(|| format!("running {} {}", args.python, script.display()))?;
    if !status.success() {
        bail!("{} {} failed ({status})", args.python, script.display());
    }
    let text = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).with_context(|| format!("parsing the PyTorch results of {}", script.display()))
}

fn tempfile_path(out: &std::path::Path) -> PathBuf {
    out.with_extension(format!("pytorch.{}.json", std::process::id()))
}

fn markdown(ours: &[BenchResult], pytorch: Option<&PytorchResults>, engines: &[String]) -> String {
    let mut header = String::from("| model | batch |");
    let mut rule = String::from("|---|---:|");
    for e in engines {
        header.push_str(&format!(" {e} samples/s |"));
        rule.push_str("---:|");
    }
    if pytorch.is_some() {
        header.push_str(" PyTorch eager samples/s |");
        rule.push_str("---:|");
        for e in engines {
            header.push_str(&format!(" {e} / PyTorch |"));
            rule.push_str("---:|");
        }
    }
    // Peak resident memory of the steps above the loaded model (see StepMemory).
    for e in engines {
        header.push_str(&format!(" {e} step MiB |"));
        rule.push_str("---:|");
    }
    if pytorch.is_some() {
        header.push_str(" PyTorch step MiB |");
        rule.push_str("---:|");
    }
    let mut rows = vec![header, rule];
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in ours {
        if !keys.contains(&(r.model.clone(), r.batch)) {
            keys.push((r.model.clone(), r.batch));
        }
    }
    for (model, batch) in keys {
        let mut row = format!("| {model} | {batch} |");
        let rate = |e: &str| {
            ours.iter().find(|r| r.model == model && r.batch == batch && r.engine == e).map(|r| r.samples_per_s)
        };
        for e in engines {
            row.push_str(&rate(e).map_or(" – |".into(), |v| format!(" {v:.1} |")));
        }
        let pytorch_row = pytorch.and_then(|p| p.results.iter().find(|r| r.model == model && r.batch == batch));
        if pytorch.is_some() {
            let base = pytorch_row.map(|r| r.samples_per_s);
            row.push_str(&base.map_or(" – |".into(), |v| format!(" {v:.1} |")));
            for e in engines {
                let ratio = rate(e).zip(base).map(|(a, b)| a / b);
                row.push_str(&ratio.map_or(" – |".into(), |v| format!(" {v:.2}× |")));
            }
        }
        let mib = |v: Option<f64>| v.map_or(" – |".into(), |v| format!(" {v:.0} |"));
        for e in engines {
            let peak = ours.iter().find(|r| r.model == model && r.batch == batch && r.engine == *e);
            row.push_str(&mib(peak.and_then(|r| r.step_peak_mib)));
        }
        if pytorch.is_some() {
            row.push_str(&mib(pytorch_row.and_then(|r| r.step_peak_mib)));
        }
        rows.push(row);
    }
    rows.join("\n") + "\n"
}
