//! `edgefreeze train` (with freezing: `--freeze auto|schedule:...`), `export` and `bench`
//! as a user runs them.

mod common;

use common::{edgefreeze, fashion_mnist_available, model, text};
use std::path::{Path, PathBuf};
use std::process::Output;

#[test]
fn train_resume_and_export_from_the_command_line() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let mlp = model("mlp.onnx");
    let args = [
        "train",
        "--model",
        mlp.to_str().unwrap(),
        "--data",
        "fashion-mnist",
        "--epochs",
        "2",
        "--batch",
        "64",
        "--lr",
        "0.05",
        "--limit",
        "512",
        "--test-limit",
        "256",
        "--out",
        run_s,
        "--engine",
        "tract",
    ];
    let first = edgefreeze(&args);
    assert!(first.status.success(), "{}", text(&first));
    let out = text(&first);
    assert!(out.contains("epoch 1/2") && out.contains("epoch 2/2") && out.contains("test accuracy"), "{out}");
    assert!(run.join("checkpoints/epoch-0002.safetensors").is_file());

    // The same command again must not overwrite the run.
    let again = edgefreeze(&args);
    assert!(!again.status.success());
    assert!(text(&again).contains("already holds a run"), "{}", text(&again));

    // Resuming a finished run has nothing to do; --resume excludes --model.
    let resumed = edgefreeze(&["train", "--resume", run_s, "--quiet"]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(text(&resumed).contains("nothing to do"), "{}", text(&resumed));
    let both = edgefreeze(&["train", "--resume", run_s, "--model", mlp.to_str().unwrap()]);
    assert!(!both.status.success());

    let exported = dir.path().join("mlp-trained.onnx");
    let export = edgefreeze(&["export", run_s, "--out", exported.to_str().unwrap()]);
    assert!(export.status.success(), "{}", text(&export));
    assert!(text(&export).contains("epoch 2"), "{}", text(&export));
    let inspect = edgefreeze(&["inspect", exported.to_str().unwrap()]);
    assert!(inspect.status.success(), "{}", text(&inspect));

    let missing = edgefreeze(&["export", dir.path().join("nope.safetensors").to_str().unwrap(), "--out", "x.onnx"]);
    assert!(!missing.status.success());
    assert!(text(&missing).contains("nope.safetensors"), "{}", text(&missing));
}

#[test]
fn bad_recipes_are_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mlp = model("mlp.onnx");
    for (flag, value, expected) in
        [("--schedule", "linear", "--schedule"), ("--engine", "gpu", "--engine"), ("--augment", "rotate", "--augment")]
    {
        let result = edgefreeze(&[
            "train",
            "--model",
            mlp.to_str().unwrap(),
            "--data",
            "fashion-mnist",
            "--out",
            out.to_str().unwrap(),
            flag,
            value,
        ]);
        assert!(!result.status.success(), "{flag} {value}");
        assert!(text(&result).contains(expected), "{flag} {value}: {}", text(&result));
    }
    let unknown =
        edgefreeze(&["train", "--model", mlp.to_str().unwrap(), "--data", "imagenet", "--out", out.to_str().unwrap()]);
    assert!(!unknown.status.success());
    assert!(text(&unknown).contains("imagenet"), "{}", text(&unknown));
}

#[test]
fn bench_writes_results_for_every_model_engine_and_batch() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("bench.json");
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let out = edgefreeze(&[
        "bench",
        "--models",
        "mlp,lenet5",
        "--models-dir",
        models.to_str().unwrap(),
        "--batches",
        "4,8",
        "--engines",
        "tract",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--min-seconds",
        "0",
        "--threads",
        "1",
        "--out",
        results.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    let rows = json["edgefreeze"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        let samples_per_s = row["samples_per_s"].as_f64().unwrap();
        assert!(samples_per_s > 0.0, "{row}");
        assert_eq!(row["steps"].as_u64(), Some(2));
        // The step's rate is three forwards' FLOPs (inspect's count) a sample.
        let model = edgefreeze_graph::import(models.join(format!("{}.onnx", row["model"].as_str().unwrap()))).unwrap();
        let flops = edgefreeze_graph::analyse(&model).unwrap().total_flops;
        assert!(flops > 0);
        assert_eq!(row["forward_flops_per_sample"].as_u64(), Some(flops), "{row}");
        let rate = row["step_gflop_per_s"].as_f64().unwrap();
        let expected = 3.0 * flops as f64 * samples_per_s / 1e9;
        assert!((rate - expected).abs() <= 1e-9 * expected, "{rate} against {expected}: {row}");
    }
    let table = std::fs::read_to_string(results.with_extension("md")).unwrap();
    assert!(table.contains("| lenet5 | 8 |"), "{table}");
    assert!(table.contains("tract GFLOP/s"), "{table}");
}

/// `bench --profile` on LeNet-5, both engines: the op types its training step is made of
/// are where the time goes, every node's time counted once.
#[test]
fn bench_profile_breaks_the_lenet5_step_down_by_op_type() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("profile.json");
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let out = edgefreeze(&[
        "bench",
        "--profile",
        "--models",
        "lenet5",
        "--models-dir",
        models.to_str().unwrap(),
        "--batches",
        "8",
        "--engines",
        "tract,ort:cpu",
        "--warmup",
        "1",
        "--steps",
        "3",
        "--min-seconds",
        "0",
        "--threads",
        "1",
        "--top",
        "4",
        "--out",
        results.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    let profiles = json["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2);
    for p in profiles {
        // The warm-up step is left out.
        assert_eq!(p["steps"].as_u64(), Some(3), "{p}");
        let ops = p["ops"].as_array().unwrap();
        let share: f64 = ops.iter().map(|o| o["share"].as_f64().unwrap()).sum();
        assert!((share - 1.0).abs() < 1e-9, "shares sum to {share}: {p}");
        let ms: f64 = ops.iter().map(|o| o["ms_per_run"].as_f64().unwrap()).sum();
        let node_ms = p["node_ms_per_step"].as_f64().unwrap();
        assert!(node_ms > 0.0 && (ms - node_ms).abs() <= 1e-9 * node_ms.max(1.0), "{p}");
        // (No comparison of node time with step time: a mean and a median of three timed
        // steps are apart by whatever else the machine runs, so such a bound would
        // depend on the machine.)
        assert!(p["step_ms_median"].as_f64().unwrap() > 0.0, "{p}");
        let types: Vec<&str> = ops.iter().map(|o| o["op_type"].as_str().unwrap()).collect();
        assert!(types.iter().any(|t| t.contains("Conv")), "no convolution among {types:?}");
        assert!(types.contains(&"MaxPool") || types.contains(&"ScatterElements"), "{types:?}");
    }
    let table = std::fs::read_to_string(results.with_extension("md")).unwrap();
    assert!(table.contains("lenet5 on tract, batch 8") && table.contains("lenet5 on ort:cpu, batch 8"), "{table}");
    assert!(table.contains("other op types |"), "the rest beyond --top 4 is summed: {table}");
}

fn train_lenet5(out: &Path, extra: &[&str]) -> Output {
    let (model, out) = (model("lenet5.onnx").display().to_string(), out.display().to_string());
    let mut args = vec![
        "train",
        "--model",
        &model,
        "--data",
        "fashion-mnist",
        "--epochs",
        "1",
        "--batch",
        "32",
        "--limit",
        "320",
        "--test-limit",
        "64",
        "--engine",
        "tract",
        "--out",
        &out,
        "--quiet",
    ];
    args.extend_from_slice(extra);
    edgefreeze(&args)
}

#[test]
fn bad_freezing_flags_are_refused_before_the_run_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let cache = blocker.join("cache").display().to_string();
    for (flags, expected) in [
        (vec!["--freeze", "schedule:5=9"], "cannot freeze 9 layers of a model with 5"),
        (vec!["--freeze", "schedule:9=1,5=2"], "updates must increase"),
        (vec!["--freeze", "schedule:"], "empty freezing schedule"),
        (vec!["--freeze", "sometimes"], "--freeze \"sometimes\""),
        (vec!["--freeze", "auto", "--freeze-window", "1"], "at least 2 values"),
        (vec!["--freeze", "auto", "--freeze-fall", "1.5"], "fall fraction 1.5"),
        (vec!["--freeze", "auto", "--freeze-fall", "0.5", "--freeze-fixed-reference"], "needs the lagged reference"),
        (vec!["--freeze", "auto", "--cache-memory", "lots"], "--cache-memory"),
        (vec!["--freeze", "auto", "--cache-dir", &cache], "cannot create the cache folder"),
    ] {
        let run = dir.path().join("run");
        let out = train_lenet5(&run, &flags);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(text(&out).contains(expected), "{flags:?}: {}", text(&out));
        assert!(!run.join("run.json").exists(), "{flags:?} left a run folder behind");
    }
}

#[test]
fn a_schedule_logs_its_decisions_and_a_foreign_cache_is_recomputed() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("shared-cache").display().to_string();
    let first = dir.path().join("first");
    let out = train_lenet5(&first, &["--freeze", "schedule:4=1", "--cache-dir", &cache, "--seed", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("freezing: frozen 1/4"), "{}", text(&out));
    let metrics = std::fs::read_to_string(first.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains(r#""kind":"freeze""#) && metrics.contains(r#""kind":"cache-on""#), "{metrics}");
    // Another seed trains other weights before freezing: the cache on disk is not theirs.
    let second = dir.path().join("second");
    let out = train_lenet5(&second, &["--freeze", "schedule:4=1", "--cache-dir", &cache, "--seed", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(second.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.contains("discarded and is recomputed") && metrics.contains("other frozen parameters"),
        "{metrics}"
    );
    // Resuming keeps the run's own freezing; another --freeze is refused.
    let again = edgefreeze(&["train", "--resume", second.to_str().unwrap(), "--freeze", "auto"]);
    assert!(text(&again).contains("a resumed run keeps its own"), "{}", text(&again));
}

#[test]
fn a_cache_past_its_disk_budget_stops_with_a_logged_decision_and_the_run_goes_on() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Nothing fits in memory and 8 KiB on disk: the header and one 4.6 KiB record of
    // LeNet-5's first cut.
    let out = train_lenet5(&run, &["--freeze", "schedule:4=1", "--cache-memory", "0", "--cache-disk", "8K"]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains(r#""kind":"cache-off""#) && metrics.contains("disk budget of 8192 bytes"), "{metrics}");
    assert!(std::fs::metadata(run.join("cache/activations.bin")).unwrap().len() <= 8192);
    assert!(text(&out).contains("not cached"), "{}", text(&out));
    let bad = train_lenet5(&dir.path().join("bad"), &["--freeze", "schedule:4=1", "--cache-disk", "lots"]);
    assert!(!bad.status.success() && text(&bad).contains("--cache-disk \"lots\""), "{}", text(&bad));
    assert!(!dir.path().join("bad").exists(), "a bad flag made the run folder");
}
