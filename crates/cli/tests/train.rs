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
    // The cache's size in memory and on disk is reported with its hits.
    let said = text(&out);
    let report = said.lines().find(|l| l.contains("freezing: frozen 1/4 | cache ")).unwrap_or_else(|| panic!("{said}"));
    assert!(
        report.contains(" in memory, ") && report.contains(" on disk, ") && report.contains(" corrupt"),
        "{report}"
    );
    assert!(!report.contains("cache 0 B in memory"), "records were cached: {report}");
    let metrics = std::fs::read_to_string(first.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains(r#""kind":"freeze""#) && metrics.contains(r#""kind":"cache-on""#), "{metrics}");
    // With augmentation every epoch's input differs: the run freezes but caches nothing,
    // and says why.
    let augmented = dir.path().join("augmented");
    let out = train_lenet5(&augmented, &["--freeze", "schedule:4=1", "--augment", "flip", "--seed", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(augmented.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains(r#""kind":"freeze""#) && !metrics.contains(r#""kind":"cache-on""#), "{metrics}");
    assert!(
        metrics.contains("changes every epoch's input") || text(&out).contains("changes every epoch's input"),
        "{metrics}\n{}",
        text(&out)
    );
    assert!(!augmented.join("cache/activations.bin").exists(), "nothing cached");
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

/// A segmentation model (models/fcn_28.onnx: a class map per pixel, bilinear upsampling)
/// trains on Fashion-MNIST as a segmentation task with a label per pixel and the faint
/// pixels unlabelled (ignored by the loss): the test accuracy over the labelled pixels
/// beats predicting the most common label everywhere, with augmented batches whose labels
/// move with their pixels. Without the ignored label, with a classification dataset, or
/// with a classifier, the run is refused before its folder is made.
#[test]
fn a_segmentation_model_trains_with_a_label_per_pixel() {
    if !fashion_mnist_available() {
        return;
    }
    // `inspect` says what the model trains against; the decoder with its skip is one layer.
    let inspect = edgefreeze(&["inspect", model("fcn_28.onnx").to_str().unwrap()]);
    let said = text(&inspect);
    assert!(inspect.status.success() && said.contains("cross-entropy loss per pixel"), "{said}");
    assert!(said.contains("5 layers, 4 cuts") && said.contains(" decoder "), "{said}");
    let dir = tempfile::tempdir().unwrap();
    let train = |model_file: &str, data: &str, run: &Path, loss: &str| {
        let (model_path, run) = (model(model_file).display().to_string(), run.display().to_string());
        edgefreeze(&[
            "train",
            "--model",
            &model_path,
            "--data",
            data,
            "--loss",
            loss,
            "--epochs",
            "2",
            "--batch",
            "32",
            "--lr",
            "0.05",
            // 120 updates: the first 256 test images' labelled pixels are 52.6% background,
            // and 40 updates reached 62.8% (within 0.2 points of the bound below), 120
            // reach 70.9% (release build, AVX2), a margin no CPU's rounding moves.
            "--limit",
            "1920",
            "--test-limit",
            "256",
            "--augment",
            "crop:2,flip",
            "--engine",
            "tract",
            "--quiet",
            "--out",
            &run,
        ])
    };
    let run = dir.path().join("seg");
    let out = train("fcn_28.onnx", "fashion-mnist-seg", &run, "cross-entropy");
    assert!(!out.status.success() && text(&out).contains("--loss cross-entropy:ignore=255"), "{}", text(&out));
    assert!(!run.exists(), "a refused run made its folder");

    let out = train("fcn_28.onnx", "fashion-mnist-seg", &run, "cross-entropy:ignore=255");
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let epochs: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r.get("test_accuracy").is_some())
        .collect();
    assert_eq!(epochs.len(), 2, "{metrics}");
    // The most common label of the first 256 test images' labelled pixels (background).
    let splits = edgefreeze_data::named::open("fashion-mnist-seg").unwrap();
    let batch = splits.test.batch(&(0..256).collect::<Vec<_>>(), None, 0, 0).unwrap();
    assert_eq!(batch.label_dims, [28, 28]);
    let mut counts = [0usize; 11];
    batch.labels.iter().filter(|&&l| l != 255).for_each(|&l| counts[l as usize] += 1);
    let majority = *counts.iter().max().unwrap() as f64 / counts.iter().sum::<usize>() as f64;
    let last = &epochs[1];
    let accuracy = last["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > majority + 0.1, "test accuracy per pixel {accuracy}, the majority label alone {majority}");
    assert!(accuracy <= 1.0 && last["train_loss"].as_f64().unwrap() < epochs[0]["train_loss"].as_f64().unwrap());

    // Labels that do not fit the model are refused, naming both sides.
    let wrong = dir.path().join("wrong");
    let out = train("fcn_28.onnx", "fashion-mnist", &wrong, "cross-entropy:ignore=255");
    assert!(!out.status.success() && text(&out).contains("one label per sample"), "{}", text(&out));
    assert!(text(&out).contains("28×28") && text(&out).contains("fashion-mnist-seg"), "{}", text(&out));
    let out = train("lenet5.onnx", "fashion-mnist-seg", &wrong, "cross-entropy:ignore=255");
    assert!(!out.status.success() && text(&out).contains("labels of shape 28×28 per sample"), "{}", text(&out));
    assert!(!wrong.exists());
}

/// A damaged record in an activation cache on disk is detected by its checksum and
/// recomputed, never served: a second run with the same seed reuses the first run's
/// cache (the same model, cut and frozen parameters) after one record's values were
/// altered on disk, counts it corrupt, and ends with the first run's numbers and
/// weights, bit for bit.
#[test]
fn a_corrupted_cache_record_is_recomputed_and_the_run_is_unchanged() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.display().to_string();
    let first = dir.path().join("first");
    let out = train_lenet5(&first, &["--freeze", "schedule:4=1", "--cache-dir", &cache_s, "--seed", "5"]);
    assert!(out.status.success(), "{}", text(&out));

    // Alter one value of the first record: records follow `EFCACHE1`, the header's length
    // (u32) and the header; a record is sample (u64), augmentation key (u64), element
    // count (u32), the f32 values, checksum (u64).
    let file = cache.join("activations.bin");
    let mut bytes = std::fs::read(&file).unwrap();
    assert_eq!(&bytes[..8], b"EFCACHE1");
    let header = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let value = 12 + header + 20 + 4 * 7;
    assert!(bytes.len() > value + 4, "the first run left records on disk");
    bytes[value] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();

    let second = dir.path().join("second");
    let out = train_lenet5(&second, &["--freeze", "schedule:4=1", "--cache-dir", &cache_s, "--seed", "5"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    let report = said.lines().find(|l| l.contains("freezing: frozen 1/4 | cache ")).unwrap_or_else(|| panic!("{said}"));
    assert!(
        report.contains(", 1 corrupt") && !report.contains(" 0 hits"),
        "one damaged record, the rest reused: {report}"
    );
    let epochs = |run: &Path| {
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r.get("test_accuracy").is_some())
            .map(|r| (r["train_loss"].as_f64().unwrap(), r["test_loss"].as_f64().unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(epochs(&first), epochs(&second));
    let weights = |run: &Path| std::fs::read(run.join("checkpoints/epoch-0001.safetensors")).unwrap();
    assert!(weights(&first) == weights(&second), "the checkpoints differ");
}
