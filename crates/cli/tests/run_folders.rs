//! Run folders as a user meets them: a failed start leaves nothing that blocks the
//! corrected command, a run that never wrote a checkpoint is not protected, runs without
//! `--out` get numbered folders, and `--resume` finds the latest.

mod common;

use common::{edgefreeze, edgefreeze_in, model, text, write_cifar10, write_idx};
use std::path::Path;

/// A short recipe: one epoch on a small subset, one thread, no progress output.
const SHORT: &[&str] = &[
    "--epochs",
    "1",
    "--batch",
    "16",
    "--lr",
    "0.05",
    "--limit",
    "32",
    "--test-limit",
    "16",
    "--threads",
    "1",
    "--quiet",
];

/// `train --model M --data D` with the short recipe and `extra` flags.
fn train_args(model: &str, data: &str, extra: &[&str]) -> Vec<String> {
    let head = ["train", "--model", model, "--data", data];
    head.iter().chain(SHORT).chain(extra).map(|a| a.to_string()).collect()
}

fn run(dir: &Path, args: &[String]) -> std::process::Output {
    edgefreeze_in(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn assert_trained(dir: &Path, out: &std::process::Output) {
    assert!(out.status.success(), "{}", text(out));
    assert!(dir.join("checkpoints/epoch-0001.safetensors").is_file(), "{}", text(out));
}

#[test]
fn a_failed_start_writes_nothing_and_the_corrected_command_succeeds() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("digits");
    write_idx(&images, 64, 32);
    let cifar = tmp.path().join("cifar");
    write_cifar10(&cifar, 4);
    let good = format!("idx:{}", images.display());
    let mlp = model("mlp.onnx");
    let mlp = mlp.to_str().unwrap();

    // (what is wrong, the flags that get it wrong, what the error says: one of these)
    let cifar_data = format!("cifar10:{}", cifar.display());
    let cases: [(&str, Vec<&str>, &[&str]); 3] = [
        ("missing dataset", vec!["--data", "cifar10:/nonexistent"], &["dataset cifar10:/nonexistent not found"]),
        (
            "shape mismatch",
            vec!["--data", &cifar_data],
            &["gives samples of shape 3×32×32 but the model's input \"input\" takes 1×28×28"],
        ),
        // With the CPU wheel (or no ONNX Runtime at all), CUDA cannot be had.
        (
            "unavailable provider",
            vec!["--data", &good, "--engine", "ort:cuda"],
            &["execution provider CUDA is not available", "ONNX Runtime library"],
        ),
    ];
    for (case, wrong, expected) in cases {
        let out_dir = tmp.path().join(case.replace(' ', "-"));
        let out_s = out_dir.to_str().unwrap();
        let args: Vec<&str> =
            ["train", "--model", mlp].iter().chain(SHORT).chain(&["--out", out_s]).chain(&wrong).copied().collect();
        let failed = edgefreeze(&args);
        assert!(!failed.status.success(), "{case}: {}", text(&failed));
        let err = String::from_utf8_lossy(&failed.stderr);
        assert!(err.starts_with(&format!("error: nothing written to {out_s}: ")), "{case}: {err}");
        assert!(expected.iter().any(|e| err.contains(e)), "{case}: {err}");
        assert!(!out_dir.exists(), "{case}: the failed start left {}", out_dir.display());

        // The corrected command, into the same folder.
        let fixed = run(tmp.path(), &train_args(mlp, &good, &["--out", out_s, "--engine", "tract"]));
        assert_trained(&out_dir, &fixed);
    }
}

#[test]
fn a_run_without_a_checkpoint_is_replaced_and_one_with_a_checkpoint_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let images = tmp.path().join("digits");
    write_idx(&images, 64, 32);
    let data = format!("idx:{}", images.display());
    let mlp = model("mlp.onnx");
    let mlp = mlp.to_str().unwrap();
    let run_dir = tmp.path().join("run");
    let run_s = run_dir.to_str().unwrap();
    assert_trained(&run_dir, &run(tmp.path(), &train_args(mlp, &data, &["--out", run_s])));

    // A started run is kept: the same command is refused and says how to continue.
    let again = run(tmp.path(), &train_args(mlp, &data, &["--out", run_s]));
    common::fails_with(
        &again,
        &format!("{run_s} already holds a run: continue it with --resume {run_s}, or choose another --out"),
    );

    // What an earlier failed start left behind: the recipe and graphs, no checkpoint.
    let unstarted = tmp.path().join("unstarted");
    std::fs::create_dir_all(unstarted.join("graphs")).unwrap();
    std::fs::copy(run_dir.join("run.json"), unstarted.join("run.json")).unwrap();
    for file in std::fs::read_dir(run_dir.join("graphs")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, unstarted.join("graphs").join(file.file_name().unwrap())).unwrap();
    }
    let unstarted_s = unstarted.to_str().unwrap();
    let mut args = train_args(mlp, &data, &["--out", unstarted_s]);
    args.retain(|a| a != "--quiet");
    let replaced = run(tmp.path(), &args);
    assert_trained(&unstarted, &replaced);
    assert!(
        text(&replaced).contains(&format!(
            "{unstarted_s} holds a run that never wrote a checkpoint (its start failed): a new run replaces it"
        )),
        "{}",
        text(&replaced)
    );
}

#[test]
fn runs_without_out_get_numbered_folders_and_resume_takes_the_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let images = cwd.join("digits");
    write_idx(&images, 64, 32);
    let data = format!("idx:{}", images.display());
    let (mlp, lenet) = (model("mlp.onnx"), model("lenet5.onnx"));
    let (mlp, lenet) = (mlp.to_str().unwrap(), lenet.to_str().unwrap());
    let loud = |model: &str| {
        let mut args = train_args(model, &data, &[]);
        args.retain(|a| a != "--quiet");
        args
    };

    // The same command twice: two runs, each in its own numbered folder, named at the start.
    for n in ["0001", "0002"] {
        let out = run(cwd, &loud(mlp));
        let folder = format!("runs/mlp-idx-digits/{n}");
        assert_trained(&cwd.join(&folder), &out);
        let first_line = String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or_default().to_string();
        assert_eq!(first_line, format!("new run in {folder}: converting {mlp}"));
    }

    // The parent folder resumes its latest run; a finished run has nothing to do.
    let resumed = edgefreeze_in(cwd, &["train", "--resume", "runs/mlp-idx-digits", "--quiet"]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(
        String::from_utf8_lossy(&resumed.stdout),
        "nothing to do: the run in runs/mlp-idx-digits/0002 has done its 1 epochs\n"
    );

    // --resume without a folder: the run created last, whatever its model.
    let out = run(cwd, &loud(lenet));
    assert_trained(&cwd.join("runs/lenet5-idx-digits/0001"), &out);
    let latest = edgefreeze_in(cwd, &["train", "--resume", "--quiet"]);
    assert!(latest.status.success(), "{}", text(&latest));
    assert_eq!(
        String::from_utf8_lossy(&latest.stdout),
        "nothing to do: the run in runs/lenet5-idx-digits/0001 has done its 1 epochs\n"
    );
    // A run folder itself still resumes that run.
    let exact = edgefreeze_in(cwd, &["train", "--resume", "runs/mlp-idx-digits/0001", "--quiet"]);
    assert!(String::from_utf8_lossy(&exact.stdout).contains("runs/mlp-idx-digits/0001 has done"), "{}", text(&exact));

    // Nothing to resume.
    let empty = tempfile::tempdir().unwrap();
    common::fails_with(
        &edgefreeze_in(empty.path(), &["train", "--resume"]),
        "no run to resume in runs: start one with --model and --data, or give --resume RUN_DIR",
    );
}
