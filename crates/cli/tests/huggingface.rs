//! Hugging Face `transformers` classifiers as their users export them (the zoo fixtures:
//! token ids in, logits out, random weights from small configs) train on real emails, and
//! what dynamo declares a buffer is not trained.

mod common;

use common::{edgefreeze, spam_assassin_available, text};
use std::path::{Path, PathBuf};

fn fixture(stem: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo").join(format!("{stem}.onnx"))
}

/// One epoch of 48 emails at batch 16 (the fixtures' 8 tokens and 50 words set the
/// encoding) on tract.
fn train(stem: &str, out: &Path) -> std::process::Output {
    train_with(&fixture(stem), out, &[])
}

fn train_with(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "train",
        "--model",
        model.to_str().unwrap(),
        "--data",
        "spam-assassin",
        "--out",
        out.to_str().unwrap(),
        "--batch",
        "16",
        "--lr",
        "1e-3",
        "--optimizer",
        "adamw",
        "--limit",
        "48",
        "--test-limit",
        "32",
        "--threads",
        "1",
        "--engine",
        "tract",
    ];
    args.extend(extra);
    if !extra.contains(&"--epochs") {
        args.extend(["--epochs", "1"]);
    }
    edgefreeze(&args)
}

#[test]
fn hugging_face_classifiers_train_on_emails_and_buffers_stay_constant() {
    if !spam_assassin_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for stem in ["hf_bert.ts", "hf_roberta.dynamo", "hf_gpt2.dynamo", "hf_llama.dynamo"] {
        let out_dir = tmp.path().join(stem);
        let out = train(stem, &out_dir);
        assert!(out.status.success(), "{stem}: {}", text(&out));
        let checkpoint = out_dir.join("checkpoints/epoch-0001.safetensors");
        let bytes = std::fs::read(&checkpoint).unwrap_or_else(|e| panic!("{stem}: {e}: {}", text(&out)));
        let names: Vec<String> =
            safetensors::SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(String::from).collect();
        // Llama's rotary frequencies are a module buffer, declared so by dynamo: a constant
        // of the graphs, never state, never trained.
        let inv_freq = names.iter().any(|n| n.contains("inv_freq"));
        assert!(!inv_freq, "{stem}: the checkpoint holds the rotary frequencies: {names:?}");
        if stem == "hf_llama.dynamo" {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("module buffer") && err.contains("m.model.rotary_emb.inv_freq"), "{err}");
        }
    }
}

/// Token ids and an attention mask, as Hugging Face exports (optimum) write a classifier:
/// the mean of the masked embeddings, then a linear head.
fn two_input_classifier(path: &Path) {
    use edgefreeze_graph::ir::{Attribute, Dim, Graph, Model, Node, ValueInfo};
    use edgefreeze_graph::{DataType, Tensor};
    let tokens = |name: &str| ValueInfo::new(name, DataType::Int64, vec![Dim::Symbol("batch".into()), Dim::Fixed(8)]);
    let mut graph = Graph {
        name: "two_inputs".into(),
        nodes: vec![
            Node::new("embed", "Gather", &["table", "input_ids"], &["e"]),
            Node::new("mask_f", "Cast", &["attention_mask"], &["m"]).with_attr("to", Attribute::Int(1)),
            Node::new("axis", "Constant", &[], &["axis"])
                .with_attr("value", Attribute::Tensor(Tensor::from_i64(vec![1], &[2]).unwrap())),
            Node::new("mask_u", "Unsqueeze", &["m", "axis"], &["mu"]),
            Node::new("masked", "Mul", &["e", "mu"], &["em"]),
            Node::new("pool", "ReduceMean", &["em"], &["p"])
                .with_attr("axes", Attribute::Ints(vec![1]))
                .with_attr("keepdims", Attribute::Int(0)),
            Node::new("head", "Gemm", &["p", "w"], &["logits"]),
        ],
        inputs: vec![tokens("input_ids"), tokens("attention_mask")],
        outputs: vec![ValueInfo::new("logits", DataType::Float32, vec![Dim::Symbol("batch".into()), Dim::Fixed(2)])],
        ..Default::default()
    };
    graph.initializers.insert("table".into(), Tensor::from_f32(vec![50, 4], &[0.01; 200]).unwrap());
    graph.initializers.insert("w".into(), Tensor::from_f32(vec![4, 2], &[0.1; 8]).unwrap());
    let model = Model { ir_version: 8, opset_imports: vec![(String::new(), 17)], graph, ..Default::default() };
    std::fs::write(path, edgefreeze_graph::save::encode_model(&model)).unwrap();
}

#[test]
fn a_mask_input_beside_the_token_ids_is_computed_from_the_padding() {
    if !spam_assassin_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("two_inputs.onnx");
    two_input_classifier(&model);
    let out_dir = tmp.path().join("run");
    let out = train_with(&model, &out_dir, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            r#"input "attention_mask" is computed from the token ids: 1 where the token is not padding (id 0)"#
        ),
        "{err}"
    );
    // The run's graphs take the token ids alone.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("graphs/manifest.json")).unwrap()).unwrap();
    let inputs: Vec<&str> =
        manifest["data_inputs"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(inputs, ["input_ids"]);
}

#[test]
fn a_converted_folder_with_a_mask_input_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("two_inputs.onnx");
    two_input_classifier(&model);
    let converted = tmp.path().join("converted");
    let out = edgefreeze(&["convert", model.to_str().unwrap(), "--out", converted.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out_dir = tmp.path().join("run");
    let out = edgefreeze(&[
        "train",
        "--model",
        converted.to_str().unwrap(),
        "--data",
        "spam-assassin",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 data inputs (input_ids, attention_mask)") && err.contains("train the .onnx file itself"),
        "{err}"
    );
    assert!(!out_dir.exists(), "nothing is written for a refused run");
}

/// Per-epoch training losses of a run, from metrics.jsonl.
fn epoch_losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "epoch")
        .map(|v| v["train_loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn gpt2_freezes_and_caches_behind_a_cut_that_reads_the_token_ids() {
    // GPT-2 reads the token ids at its end (the last real token), so the part behind
    // every cut takes them beside the cached activation; caching must give the frozen
    // step's losses.
    if !spam_assassin_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("hf_gpt2.dynamo");
    let mut losses = Vec::new();
    for (tag, cache) in [("cached", None), ("uncached", Some("--no-cache"))] {
        let out_dir = tmp.path().join(tag);
        let mut extra = vec!["--freeze", "schedule:2=4", "--epochs", "3"];
        extra.extend(cache);
        let out = train_with(&model, &out_dir, &extra);
        assert!(out.status.success(), "{tag}: {}", text(&out));
        let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
        assert!(metrics.contains(r#""kind":"freeze""#), "{tag}: {metrics}");
        assert_eq!(metrics.contains(r#""kind":"cache-on""#), cache.is_none(), "{tag}: {metrics}");
        losses.push(epoch_losses(&out_dir));
    }
    assert_eq!(losses[0].len(), 3, "{losses:?}");
    // The prefix graph and the frozen step compute the activation in different graphs:
    // equal up to float32 reordering.
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "cached {:?} against frozen {:?}", losses[0], losses[1]);
    }
}
