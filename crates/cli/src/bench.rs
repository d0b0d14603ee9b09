//! `edgefreeze bench`: training throughput of the engines, side by side with PyTorch
//! eager (measured by `tools/bench_pytorch.py` in the same run).

use crate::train::engine_settings;
use anyhow::{Context, Result, bail};
use edgefreeze_train::bench::{
    BenchOptions, BenchResult, ProfileResult, bench_training, profile_training, step_gflop_per_s,
};
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
    /// The machine's peak float32 rate in GFLOP/s (e.g. cores × FMA units × lanes × 2 ×
    /// clock): with it, the table rates each engine's and PyTorch's step against it.
    #[arg(long)]
    pub peak_gflops: Option<f64>,
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
    if let Some(peak) = args.peak_gflops
        && !(peak.is_finite() && peak > 0.0)
    {
        bail!("--peak-gflops must be a positive number of GFLOP/s, not {peak}");
    }
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
    let table = markdown(&ours, pytorch.as_ref(), &args.engines, args.peak_gflops);
    println!("{table}");
    let json = serde_json::json!({
        "threads": threads,
        "peak_gflops": args.peak_gflops,
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

/// The results as one Markdown table: samples/s per engine (and PyTorch's, with the
/// ratios), each step's arithmetic rate in GFLOP/s ([`step_gflop_per_s`], PyTorch's from
/// the same model's FLOPs) and, given the machine's peak, its share of it; then the step
/// memory.
fn markdown(ours: &[BenchResult], pytorch: Option<&PytorchResults>, engines: &[String], peak: Option<f64>) -> String {
    let mut columns: Vec<String> = engines.iter().map(|e| format!("{e} samples/s")).collect();
    // The rated runs: every engine, then PyTorch.
    let mut rated: Vec<String> = engines.to_vec();
    if pytorch.is_some() {
        columns.push("PyTorch eager samples/s".into());
        columns.extend(engines.iter().map(|e| format!("{e} / PyTorch")));
        rated.push("PyTorch".into());
    }
    columns.extend(rated.iter().map(|e| format!("{e} GFLOP/s")));
    if peak.is_some() {
        columns.extend(rated.iter().map(|e| format!("{e} % of peak")));
    }
    // Peak resident memory of the steps above the loaded model (see StepMemory).
    columns.extend(rated.iter().map(|e| format!("{e} step MiB")));
    let header = format!("| model | batch | {} |", columns.join(" | "));
    let rule = format!("|---|---:|{}", "---:|".repeat(columns.len()));
    let mut rows = vec![header, rule];
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in ours {
        if !keys.contains(&(r.model.clone(), r.batch)) {
            keys.push((r.model.clone(), r.batch));
        }
    }
    let cell =
        |v: Option<f64>, decimals: usize, suffix: &str| v.map_or("–".into(), |v| format!("{v:.decimals$}{suffix}"));
    for (model, batch) in keys {
        let ours_of = |e: &str| ours.iter().find(|r| r.model == model && r.batch == batch && r.engine == e);
        let pytorch_row = pytorch.and_then(|p| p.results.iter().find(|r| r.model == model && r.batch == batch));
        let flops = ours.iter().find(|r| r.model == model).map(|r| r.forward_flops_per_sample);
        let base = pytorch_row.map(|r| r.samples_per_s);
        let mut cells: Vec<String> = engines.iter().map(|e| cell(ours_of(e).map(|r| r.samples_per_s), 1, "")).collect();
        let mut rates: Vec<Option<f64>> = engines.iter().map(|e| ours_of(e).map(|r| r.step_gflop_per_s)).collect();
        let mut memory: Vec<Option<f64>> = engines.iter().map(|e| ours_of(e).and_then(|r| r.step_peak_mib)).collect();
        if pytorch.is_some() {
            cells.push(cell(base, 1, ""));
            for e in engines {
                cells.push(cell(ours_of(e).map(|r| r.samples_per_s).zip(base).map(|(a, b)| a / b), 2, "×"));
            }
            rates.push(flops.zip(base).map(|(f, b)| step_gflop_per_s(f, b)));
            memory.push(pytorch_row.and_then(|r| r.step_peak_mib));
        }
        cells.extend(rates.iter().map(|&r| cell(r, 1, "")));
        if let Some(peak) = peak {
            cells.extend(rates.iter().map(|&r| cell(r.map(|r| 100.0 * r / peak), 0, "%")));
        }
        cells.extend(memory.iter().map(|&m| cell(m, 0, "")));
        rows.push(format!("| {model} | {batch} | {} |", cells.join(" | ")));
    }
    rows.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(engine: &str, samples_per_s: f64) -> BenchResult {
        BenchResult {
            model: "m".into(),
            engine: engine.into(),
            batch: 64,
            threads: 2,
            steps: 10,
            step_ms_median: 64e3 / samples_per_s,
            samples_per_s,
            step_peak_mib: Some(12.0),
            forward_flops_per_sample: 2_000_000,
            step_gflop_per_s: step_gflop_per_s(2_000_000, samples_per_s),
        }
    }

    /// Each engine's and PyTorch's step rated on the model's FLOPs: 3 × 2 MFLOP a sample at
    /// 1,000 samples/s is 6 GFLOP/s, 4% of a 150 GFLOP/s peak; PyTorch at 2,000 samples/s
    /// 12 GFLOP/s and 8%, from the same FLOP count.
    #[test]
    fn the_table_rates_every_step_on_the_models_flops_against_the_peak() {
        let rows = [ours("ort:cpu", 1000.0), ours("tract", 500.0)];
        let pytorch = PytorchResults {
            torch: Some("2.15.0".into()),
            threads: 2,
            results: vec![PytorchResult {
                model: "m".into(),
                batch: 64,
                samples_per_s: 2000.0,
                step_ms_median: 32.0,
                steps: 10,
                step_peak_mib: Some(20.0),
            }],
        };
        let engines = ["ort:cpu".to_string(), "tract".to_string()];
        let table = markdown(&rows, Some(&pytorch), &engines, Some(150.0));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        let header: Vec<&str> = lines[0].split('|').map(str::trim).collect();
        let row: Vec<&str> = lines[2].split('|').map(str::trim).collect();
        assert_eq!(header.len(), row.len(), "{table}");
        let at =
            |column: &str| row[header.iter().position(|h| *h == column).unwrap_or_else(|| panic!("{column}: {table}"))];
        assert_eq!(at("ort:cpu GFLOP/s"), "6.0");
        assert_eq!(at("tract GFLOP/s"), "3.0");
        assert_eq!(at("PyTorch GFLOP/s"), "12.0");
        assert_eq!(at("ort:cpu % of peak"), "4%");
        assert_eq!(at("PyTorch % of peak"), "8%");
        assert_eq!(at("ort:cpu / PyTorch"), "0.50×");
        assert_eq!(at("PyTorch step MiB"), "20");
        // Without a peak, no share of it.
        assert!(!markdown(&rows, None, &engines, None).contains("% of peak"));
    }
}
