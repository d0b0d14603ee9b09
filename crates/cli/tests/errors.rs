//! Error messages as a user reads them: each cause once, outermost first, exactly.

mod common;

use common::{edgefreeze_in, fails_with, model, not_found, write_idx};

#[test]
fn each_cause_is_printed_once_outermost_first() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let os = not_found();

    fails_with(&edgefreeze_in(cwd, &["inspect", "nope.onnx"]), &format!("cannot read nope.onnx: {os}"));
    fails_with(
        &edgefreeze_in(cwd, &["convert", "nope.onnx", "--out", "converted"]),
        &format!("cannot read nope.onnx: {os}"),
    );
    fails_with(
        &edgefreeze_in(cwd, &["train", "--resume", "/nonexistent"]),
        "no run to resume at /nonexistent: no such folder",
    );
    fails_with(
        &edgefreeze_in(cwd, &["export", "nope.safetensors", "--out", "x.onnx"]),
        &format!("exporting nope.safetensors: cannot read nope.safetensors: {os}"),
    );

    // A model that is not ONNX: the file, then what is wrong, then the decoder's words.
    std::fs::write(cwd.join("broken.onnx"), b"\x0a\xff\xff\xff").unwrap();
    let out = edgefreeze_in(cwd, &["inspect", "broken.onnx"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.starts_with("error: broken.onnx: not a valid ONNX model (protobuf decoding failed: "), "{err}");
    assert_eq!(err.matches("decod").count(), 2, "the decoder's cause once: {err}");

    // A new run whose model is missing: where nothing was written, then the cause.
    write_idx(&cwd.join("digits"), 16, 16);
    let mlp = model("mlp.onnx");
    let mlp = mlp.to_str().unwrap();
    fails_with(
        &edgefreeze_in(cwd, &["train", "--model", "nope.onnx", "--data", "idx:digits", "--out", "run", "--quiet"]),
        &format!("nothing written to run: cannot read nope.onnx: {os}"),
    );
    assert!(!cwd.join("run").exists());

    // An ONNX Runtime library that is not there: said once, not once per layer it passed.
    let out = edgefreeze_in(
        cwd,
        &[
            "train",
            "--model",
            mlp,
            "--data",
            "idx:digits",
            "--engine",
            "ort:cpu",
            "--ort-lib",
            "/nope",
            "--out",
            "run",
            "--quiet",
        ],
    );
    fails_with(
        &out,
        &format!(
            "nothing written to run: ONNX Runtime library: /nope (from --ort-lib) is not a file; {}",
            edgefreeze_engine::ort_backend::INSTALL_HINT
        ),
    );

    // A device slowed by less than 1 (or by no number): refused before anything is written.
    for bad in ["0.5", "NaN"] {
        fails_with(
            &edgefreeze_in(
                cwd,
                &["train", "--model", mlp, "--data", "idx:digits", "--slowdown", bad, "--out", "slow", "--quiet"],
            ),
            &format!("slowdown factor {bad}: must be from 1 (full speed) to 100"),
        );
        assert!(!cwd.join("slow").exists());
    }

    // A run folder that is not a run.
    std::fs::create_dir(cwd.join("empty")).unwrap();
    fails_with(
        &edgefreeze_in(cwd, &["train", "--resume", "empty"]),
        "no run to resume in empty: neither it nor a numbered folder in it holds a run.json",
    );
    // A damaged run file.
    std::fs::write(cwd.join("empty/run.json"), b"{").unwrap();
    let out = edgefreeze_in(cwd, &["train", "--resume", "empty"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.starts_with("error: opening the run in empty: empty/run.json: not an edgefreeze run: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // Every cause once in an error from deep inside: an unreadable external data file.
    let external = model("mlp_external.onnx");
    assert!(external.with_extension("onnx.data").is_file());
    let copy = cwd.join("external.onnx");
    std::fs::copy(&external, &copy).unwrap();
    let out = edgefreeze_in(cwd, &["inspect", "external.onnx"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert_eq!(err.matches(&os).count(), 1, "{err}");
}
