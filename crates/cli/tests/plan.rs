//! `edgefreeze plan` against a real `edgefreeze edge serve` process on loopback.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const TOKEN: &str = "plan-test-token-0123456789abcdef";

/// An edge server process on 127.0.0.1:0; its address is the first line it prints.
struct Edge {
    child: Child,
    address: String,
}

impl Edge {
    fn start(dir: &std::path::Path) -> Edge {
        let tokens = dir.join("tokens.txt");
        std::fs::write(&tokens, format!("phone-1 {TOKEN}\n")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
            .args(["edge", "serve", "--listen", "127.0.0.1:0", "--threads", "1", "--tokens"])
            .arg(&tokens)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let address = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(line.starts_with("edge server listening on 127.0.0.1:"), "{line:?}");
        Edge { child, address }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn plan(edge: &str, token: &str, json: bool) -> std::process::Output {
    let model = model("mlp.onnx");
    let mut args = vec![
        "plan",
        "--model",
        model.to_str().unwrap(),
        "--edge",
        edge,
        "--device-id",
        "phone-1",
        "--token",
        token,
        "--batch",
        "8",
        "--micro-batches",
        "1,2",
        "--reps",
        "1",
        "--link-reps",
        "1",
        "--threads",
        "1",
    ];
    if json {
        args.push("--json");
    }
    edgefreeze(&args)
}

#[test]
fn plan_prints_every_server_cut_and_micro_batch_count_and_the_choice() {
    let dir = tempfile::tempdir().unwrap();
    let edge = Edge::start(dir.path());
    let out = plan(&edge.address, TOKEN, true);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let candidates = json["plan"]["candidates"].as_array().unwrap();
    // The MLP has cuts after layers 0 and 1; one server; M = 1 and 2.
    let mut keys: Vec<(u64, u64)> = candidates
        .iter()
        .map(|c| (c["candidate"]["cut"].as_u64().unwrap(), c["candidate"]["micro_batches"].as_u64().unwrap()))
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, [(0, 1), (0, 2), (1, 1), (1, 2)]);
    assert!(candidates.iter().all(|c| c["server"] == edge.address.as_str()));
    let steps: Vec<f64> = candidates.iter().map(|c| c["step_s"].as_f64().unwrap()).collect();
    assert!(steps.iter().all(|&s| s > 0.0 && s.is_finite()), "{steps:?}");
    let choice = json["plan"]["choice"].as_u64().unwrap() as usize;
    assert!(steps.iter().all(|&s| steps[choice] <= s), "the choice is the fastest: {steps:?}, {choice}");
    assert_eq!(json["choice"], candidates[choice]);
    assert!(json["probe"]["elapsed_s"].as_f64().unwrap() > 0.0);
    assert_eq!(json["probe"]["measurements"]["servers"][0]["cuts"].as_array().unwrap().len(), 2);
    // The concurrent probe ran at both cuts, and every prediction says which overlap
    // factors it used and what the stages were apart.
    let concurrent = json["probe"]["concurrent"].as_array().unwrap();
    assert_eq!(concurrent.iter().map(|c| c["cut"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
    for c in candidates {
        let k = |side: &str| c["overlap"][side].as_f64().unwrap();
        assert!(k("device") >= 1.0 && k("edge") >= 1.0, "{c}");
        assert!(c["apart"]["edge_s"].as_f64().unwrap() > 0.0, "{c}");
    }

    let out = plan(&edge.address, TOKEN, false);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("probed 1 server(s) at 2 cut(s), micro-batches of [4, 8] samples, in "), "{table}");
    assert!(table.contains(&format!("link to {}: round trip ", edge.address)), "{table}");
    for cut in [0, 1] {
        assert!(table.contains(&format!("concurrent probe, {} at cut {cut} (", edge.address)), "{table}");
    }
    assert_eq!(table.matches("<- choice").count(), 1, "{table}");
    assert_eq!(table.lines().filter(|l| l.starts_with(&edge.address)).count(), 4, "{table}");
    assert!(table.lines().last().unwrap().starts_with(&format!("choice: server {}, cut ", edge.address)), "{table}");
}

#[test]
fn plan_without_a_reachable_server_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let edge = Edge::start(dir.path());
    let out = plan(&edge.address, "wrong-token-0123456789abcdef", true);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no edge server could be probed at any cut"), "{stderr}");
    assert!(stderr.contains("Unauthenticated"), "{stderr}");
    // Nothing listens on port 1.
    let out = plan("127.0.0.1:1", TOKEN, false);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no edge server could be probed at any cut: 127.0.0.1:1: "), "{stderr}");
}

#[test]
fn cuts_whose_back_reads_the_samples_are_not_planned() {
    // GPT-2 reads its token ids at its end: every cut has them as a side input, and the
    // edge would need the samples themselves. Refused before any server is probed.
    let zoo = |stem: &str| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/zoo")
            .join(format!("{stem}.onnx"))
    };
    let run = |model: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--model",
            model.to_str().unwrap(),
            "--edge",
            "127.0.0.1:1",
            "--device-id",
            "phone-1",
            "--token",
            TOKEN,
        ];
        args.extend(extra);
        edgefreeze(&args)
    };
    let out = run(&zoo("hf_gpt2.dynamo"), &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no cut of the model can be split") && stderr.contains("beside the activation"),
        "{stderr}"
    );
    // RoBERTa's first cuts read the ids (its position ids); asked for, one is refused
    // naming the input and the cuts that split.
    let out = run(&zoo("hf_roberta.dynamo"), &["--cuts", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cut 0 cannot be split: the part behind it reads the model's input")
            && stderr.contains("valid are [2,"),
        "{stderr}"
    );
}

/// Two servers: the plan covers every (server, cut, M) of both and chooses the fastest;
/// a device run given the plan (`device train --plan`) logs the planner's predicted
/// stages beside the measured ones at every logged step.
#[test]
fn a_plan_of_two_servers_predicts_what_the_device_run_then_measures() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let start = |name: &str| {
        let at = dir.path().join(name);
        std::fs::create_dir_all(&at).unwrap();
        Edge::start(&at)
    };
    let (a, b) = (start("a"), start("b"));
    let both = format!("{},{}", a.address, b.address);
    let out = plan(&both, TOKEN, true);
    assert!(out.status.success(), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let candidates = json["plan"]["candidates"].as_array().unwrap();
    for server in [&a.address, &b.address] {
        let of = candidates.iter().filter(|c| c["server"] == server.as_str()).count();
        assert_eq!(of, 4, "{server}: 2 cuts × M = 1, 2");
    }
    let steps: Vec<f64> = candidates.iter().map(|c| c["step_s"].as_f64().unwrap()).collect();
    let choice = json["plan"]["choice"].as_u64().unwrap() as usize;
    assert!(steps.iter().all(|&s| steps[choice] <= s), "the choice is the fastest: {steps:?}, {choice}");
    let plan_file = dir.path().join("plan.json");
    std::fs::write(&plan_file, &out.stdout).unwrap();

    // Train on server B at cut 1, M = 2, with the plan's prediction for that candidate.
    let run = dir.path().join("run");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
        .env("EDGEFREEZE_TOKEN", TOKEN)
        .args(["device", "train", "--edge", &b.address, "--device-id", "phone-1", "--data", "fashion-mnist"])
        .args(["--model", model("mlp.onnx").to_str().unwrap(), "--cut", "1", "--micro-batches", "2"])
        .args(["--epochs", "1", "--batch", "8", "--limit", "48", "--test-limit", "16", "--threads", "1", "--quiet"])
        .args(["--log-every", "1", "--plan", plan_file.to_str().unwrap(), "--out", run.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r.get("stages").is_some())
        .collect();
    assert_eq!(steps.len(), 6, "every update is logged with its stages: {metrics}");
    let predicted = &steps[0]["stages"]["predicted"];
    for s in &steps {
        let stages = &s["stages"];
        assert_eq!(&stages["predicted"], predicted, "one prediction for the run: {s}");
        assert!(stages["measured"]["step_s"].as_f64().unwrap() > 0.0, "{s}");
    }
    // The prediction is the plan's for (server B, cut 1, M = 2), pipelined.
    let candidate = candidates
        .iter()
        .find(|c| {
            c["server"] == b.address.as_str() && c["candidate"]["cut"] == 1 && c["candidate"]["micro_batches"] == 2
        })
        .unwrap();
    let (got, want) = (predicted["step_s"].as_f64().unwrap(), candidate["step_s"].as_f64().unwrap());
    assert!((got - want).abs() <= 1e-9 * want, "predicted {got} s, the plan's {want} s");
}
