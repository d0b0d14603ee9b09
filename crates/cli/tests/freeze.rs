//! `edgefreeze train --freeze auto|schedule:...` as a user runs it: decisions in
//! metrics.jsonl, and bad freezing input refused before a run folder is made, or a
//! foreign cache discarded with the reason logged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lenet5() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet5.onnx").display().to_string()
}

fn edgefreeze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgefreeze")).args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn fashion_mnist_available() -> bool {
    if Path::new("/usr/share/datasets/fashion-mnist").is_dir() {
        return true;
    }
    assert!(
        !std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0"),
        "EDGEFREEZE_REQUIRE_DATA is set but Fashion-MNIST is missing"
    );
    eprintln!("skipping: apt-get install -y dataset-fashion-mnist");
    false
}

fn train(out: &Path, extra: &[&str]) -> Output {
    let (model, out) = (lenet5(), out.display().to_string());
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
        (vec!["--freeze", "auto", "--cache-memory", "lots"], "--cache-memory"),
        (vec!["--freeze", "auto", "--cache-dir", &cache], "cannot create the cache folder"),
    ] {
        let run = dir.path().join("run");
        let out = train(&run, &flags);
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
    let out = train(&first, &["--freeze", "schedule:4=1", "--cache-dir", &cache, "--seed", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("freezing: frozen 1/4"), "{}", text(&out));
    let metrics = std::fs::read_to_string(first.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains(r#""kind":"freeze""#) && metrics.contains(r#""kind":"cache-on""#), "{metrics}");
    // Another seed trains other weights before freezing: the cache on disk is not theirs.
    let second = dir.path().join("second");
    let out = train(&second, &["--freeze", "schedule:4=1", "--cache-dir", &cache, "--seed", "2"]);
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
