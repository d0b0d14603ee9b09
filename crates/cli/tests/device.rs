//! Device–edge split training on loopback: an `edgefreeze edge serve` process and the
//! device trainer (in this process, or as a second `edgefreeze device train` process).
//!
//! - exactness: parameters of both sides after pipelined split training equal local
//!   training (`edgefreeze train`'s trainer) on the same batches, for M = 1, 2, 4;
//! - separate processes, end to end, with the schedule chart;
//! - privacy: a TCP proxy between device and edge records every byte the device sends;
//!   no training sample's f32 bytes are in it, its labels are;
//! - a wrong token or an unknown device is refused;
//! - resume of both sides, and a clear error when the edge cannot resume at the device's step.

mod common;

use common::{fashion_mnist_available, model, text};
use edgefreeze_device::split::SplitSettings;
use edgefreeze_device::trainer::{DeviceOptions, DeviceTrainer, EdgeAddress, create_device_run};
use edgefreeze_engine::{EngineOptions, Value};
use edgefreeze_train::{ModelSource, Recipe, Schedule, TrainOptions, Trainer, create_run};
use edgefreeze_wire::auth::Credentials;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "tok-0123456789abcdef";

/// An `edgefreeze edge serve` process on an ephemeral loopback port, killed on drop.
struct Edge {
    child: Child,
    address: String,
    /// Started again at the address of one that was killed.
    restarted: bool,
    _dir: tempfile::TempDir,
}

impl Edge {
    fn spawn(state_dir: Option<&Path>) -> Edge {
        Edge::spawn_at("127.0.0.1:0", state_dir)
    }

    /// A server listening on `listen` (a fixed port, to restart one at its address).
    fn spawn_at(listen: &str, state_dir: Option<&Path>) -> Edge {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, format!("phone-1 {TOKEN}\nphone-2 {TOKEN}x\n")).unwrap();
        let state = state_dir.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
        let mut child = Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
            .args(["edge", "serve", "--listen", listen, "--threads", "1", "--tokens"])
            .arg(&tokens)
            .arg("--state-dir")
            .arg(&state)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // The server prints the address it listens on once it does.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let address = loop {
            let line = lines.next().expect("the edge server exited before listening").unwrap();
            if let Some(at) = line.find("127.0.0.1:") {
                break line[at..].split_whitespace().next().unwrap().to_string();
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Edge { child, address, restarted: false, _dir: dir }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn recipe(epochs: usize, batch: usize, limit: usize) -> Recipe {
    Recipe {
        epochs,
        batch,
        schedule: Schedule::parse("constant", 0.05, 0).unwrap(),
        seed: 3,
        augment: None,
        train_limit: Some(limit),
        test_limit: Some(64),
        log_every: 1,
    }
}

const OPTIMIZER: &str = "sgd:momentum=0.9,wd=5e-4";

fn single_thread() -> TrainOptions {
    TrainOptions { engine_options: EngineOptions { threads: Some(1), ..Default::default() }, ..TrainOptions::default() }
}

fn device_options() -> DeviceOptions {
    DeviceOptions { train: single_thread(), ..DeviceOptions::default() }
}

fn edge_at(address: &str, device: &str, token: &str) -> EdgeAddress {
    EdgeAddress { address: address.into(), credentials: Credentials::new(device, token).unwrap() }
}

/// Trains a device run in this process → (device state, edge state).
#[allow(clippy::type_complexity)]
fn device_run(
    dir: &Path,
    edge: &EdgeAddress,
    onnx: &str,
    split: SplitSettings,
    recipe: &Recipe,
) -> (Vec<(String, Value)>, Vec<(String, Value)>) {
    create_device_run(dir, &model(onnx), "cross-entropy", OPTIMIZER, "fashion-mnist", recipe, split).unwrap();
    let mut trainer = DeviceTrainer::open(dir, std::slice::from_ref(edge), device_options()).unwrap();
    trainer.run().unwrap();
    let state = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());
    trainer.close().unwrap();
    state
}

fn f32s(v: &Value) -> Vec<f64> {
    v.as_f32().unwrap().iter().map(|&x| f64::from(x)).collect()
}

/// Relative L2 distance of two tensors.
fn relative(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    diff / norm.max(1e-30)
}

/// Local training of the MLP with `recipe` (its first `freeze` layers frozen) in `dir`
/// → (the final state, the initial state).
#[allow(clippy::type_complexity)]
fn local_training(dir: &Path, freeze: usize, recipe: &Recipe) -> (Vec<(String, Value)>, Vec<(String, Value)>) {
    let source = ModelSource::from_path(&model("mlp.onnx"), "cross-entropy", OPTIMIZER, freeze);
    create_run(dir, &source, "fashion-mnist", recipe).unwrap();
    let mut local = Trainer::open(dir, single_thread()).unwrap();
    local.run().unwrap();
    let initial = edgefreeze_train::checkpoint::Checkpoint::read(&dir.join("checkpoints/epoch-0000.safetensors"));
    (local.state().unwrap(), initial.unwrap().state)
}

/// A split run's tensor against local training's: f32 rounding of sums in another order
/// makes gradients agree to a few 1e-7 relative, and a few updates move the parameters by
/// a small fraction of that; the updates themselves (from the initial value `name` has in
/// `initial`) agree to 1e-4.
fn assert_like_local(got: &Value, want: &Value, initial: &[(String, Value)], name: &str, what: &str) {
    let (_, start) = initial.iter().find(|(n, _)| n == name).unwrap();
    let (got, want, start) = (f32s(got), f32s(want), f32s(start));
    let update: Vec<f64> = want.iter().zip(&start).map(|(w, s)| w - s).collect();
    let moved: Vec<f64> = got.iter().zip(&start).map(|(g, s)| g - s).collect();
    let (err, update_err) = (relative(&got, &want), relative(&moved, &update));
    assert!(err < 1e-6 && update_err < 1e-4, "{what}: {err:e} (update {update_err:e})");
}

#[test]
fn pipelined_split_training_equals_local_training() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    // 4 updates of 32 samples; the MLP has no BatchNorm and no Dropout, so the
    // micro-batched gradient is the full batch's gradient up to f32 rounding.
    let recipe = recipe(1, 32, 128);
    let (local_state, initial) = local_training(&dir.path().join("local"), 0, &recipe);
    for (cut, m, sequential) in [(0, 1, true), (0, 2, false), (1, 4, false)] {
        let split = SplitSettings { cut, micro_batches: m, sequential, recompute: false, freeze_device: false };
        let (device, edge_state) =
            device_run(&dir.path().join(format!("split-{cut}-{m}")), &at, "mlp.onnx", split, &recipe);
        let mut seen = 0;
        for (name, value) in device.iter().chain(&edge_state) {
            let Some((_, want)) = local_state.iter().find(|(n, _)| n == name) else { continue };
            assert_like_local(value, want, &initial, name, &format!("cut {cut} M={m} {name}"));
            seen += 1;
        }
        // fc1..fc3 weights and biases, with momentum buffers, on one side or the other.
        assert_eq!(seen, 12, "cut {cut} M={m}: every parameter and momentum compared");
    }
}

#[test]
fn a_frozen_device_side_equals_local_training_with_that_prefix_frozen() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 32, 128);
    // Cut after layer 0: layer 0 (fc1) on the device, frozen; locally, `--freeze 1`.
    let (local_state, initial) = local_training(&dir.path().join("local"), 1, &recipe);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: true };
    let (device, edge_state) = device_run(&dir.path().join("split"), &at, "mlp.onnx", split, &recipe);
    let mut trained = 0;
    for (name, value) in &device {
        // The device's parameters never move (and it has no optimizer state to move).
        let (_, start) = initial.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(value, start, "device tensor {name} changed");
    }
    for (name, value) in &edge_state {
        let (_, want) = local_state.iter().find(|(n, _)| n == name).unwrap();
        // The same f32 rounding argument as the unfrozen test: sums in another order.
        let err = relative(&f32s(value), &f32s(want));
        assert!(err < 1e-6, "edge {name}: {err:e}");
        trained += 1;
    }
    // fc2 and fc3, weights and biases, each with a momentum buffer.
    assert_eq!(trained, 8, "{edge_state:?}");
    assert!(!device.is_empty());
}

/// Local training with the same micro-batching, for a BatchNorm model: the whole
/// model's gradient graph on each micro-batch (BatchNorm with that micro-batch's
/// statistics), gradients summed weighted by micro-batch share, then SGD with momentum
/// and weight decay as `torch.optim.SGD` does it, in the f32 operations the device
/// trainer and the apply graphs perform, in their order: the f32 sum
/// `s + weight × g` of `GradientSum::add`, then the apply graph's `g + x × wd`,
/// `v × momentum + g`, `x − v × lr` (`optim::emit_update`), each rounded to f32.
fn micro_batched_local_training(
    run: &Path,
    recipe: &Recipe,
    m: usize,
    momentum: f64,
    weight_decay: f64,
) -> Vec<(String, Vec<f64>)> {
    use edgefreeze_engine::StateUpdates;
    let graphs = run.join("graphs");
    let mut workspace =
        edgefreeze_engine::workspace(&edgefreeze_engine::EngineKind::Tract, &single_thread().engine_options).unwrap();
    let grad = workspace.load_graph(&std::fs::read(graphs.join("grad.onnx")).unwrap(), StateUpdates::none()).unwrap();
    let initial = edgefreeze_train::checkpoint::read_tensors(&graphs.join("state.safetensors")).unwrap();
    let parameters: Vec<String> =
        workspace.outputs(grad).iter().filter_map(|o| o.strip_prefix("grad.").map(String::from)).collect();
    let f32s_of = |v: &Value| v.as_f32().unwrap().iter().copied().collect::<Vec<f32>>();
    let mut params: Vec<(String, Vec<f32>)> =
        parameters.iter().map(|p| (p.clone(), f32s_of(&initial.iter().find(|(n, _)| n == p).unwrap().1))).collect();
    let mut velocity: Vec<Vec<f32>> = params.iter().map(|(_, v)| vec![0.0; v.len()]).collect();
    let (momentum, weight_decay) = (momentum as f32, weight_decay as f32);
    for (name, value) in &initial {
        workspace.set_state(name, value.clone()).unwrap();
    }
    let data = edgefreeze_data::named::open("fashion-mnist").unwrap();
    let indices = edgefreeze_train::subset(data.train.len(), recipe.train_limit, recipe.seed);
    for epoch in 1..=recipe.epochs as u64 {
        let order: Vec<usize> =
            edgefreeze_data::epoch_order(indices.len(), recipe.seed, epoch).into_iter().map(|i| indices[i]).collect();
        for (step, chunk) in order.chunks(recipe.batch).enumerate() {
            let lr = recipe.schedule.rate(step as u64, 0, epoch as usize - 1);
            let batch = data.train.batch(chunk, None, recipe.seed, epoch).unwrap();
            let (input, labels) = edgefreeze_train::batch_values(batch).unwrap();
            let parts = edgefreeze_device::pipeline::split_batch(&input, &labels, m).unwrap();
            let mut sums: Vec<Vec<f32>> = params.iter().map(|(_, v)| vec![0.0; v.len()]).collect();
            for part in &parts {
                let weight = (part.len() as f64 / chunk.len() as f64) as f32;
                let out = workspace.run(grad, &[("input", &part.input), ("labels", &part.labels)]).unwrap();
                for (k, p) in parameters.iter().enumerate() {
                    let (_, g) = out.iter().find(|(n, _)| *n == format!("grad.{p}")).unwrap();
                    for (s, g) in sums[k].iter_mut().zip(f32s_of(g)) {
                        *s += weight * g;
                    }
                }
            }
            // The device and edge feed the apply graphs a gradient scale of 1 (the sums
            // are already the batch's mean): the multiplication by it is exact.
            let lr = lr as f32;
            for (k, (name, p)) in params.iter_mut().enumerate() {
                for ((x, v), g) in p.iter_mut().zip(velocity[k].iter_mut()).zip(&sums[k]) {
                    let g = g + *x * weight_decay;
                    *v = *v * momentum + g;
                    *x -= *v * lr;
                }
                let shape = initial.iter().find(|(n, _)| n == name).unwrap().1.shape().to_vec();
                let array = ndarray::ArrayD::from_shape_vec(shape, p.clone()).unwrap();
                workspace.set_state(name, Value::F32(array)).unwrap();
            }
        }
    }
    params.into_iter().map(|(n, p)| (n, p.into_iter().map(f64::from).collect())).collect()
}

#[test]
fn batchnorm_split_training_equals_local_training_with_the_same_micro_batches() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 8, 16);
    let local_dir = dir.path().join("local");
    let source = ModelSource::from_path(&model("resnet20_28.onnx"), "cross-entropy", OPTIMIZER, 0);
    create_run(&local_dir, &source, "fashion-mnist", &recipe).unwrap();
    let want = micro_batched_local_training(&local_dir, &recipe, 2, 0.9, 5e-4);
    // Cut after layer 1 (conv1 and bn1 on the device, both with BatchNorm statistics).
    let split = SplitSettings { cut: 1, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let (device, edge_state) = device_run(&dir.path().join("split"), &at, "resnet20_28.onnx", split, &recipe);
    let mut seen = 0;
    for (name, value) in device.iter().chain(&edge_state) {
        let Some((_, want)) = want.iter().find(|(n, _)| n == name) else { continue };
        // The split graphs compute, operation for operation, what the whole model's
        // gradient graph computes (the same tract kernels on the same f32 tensors), and
        // the reference sums and updates in the same f32 operations: the same bits. No
        // tolerance is meaningful here: one update's f32 rounding (a few 1e-9 relative,
        // e.g. updating in f64 instead) moves a ReLU input of about -1e-6 (within the
        // f32 rounding of the values before it) across 0 in the second step, which
        // changes layer2.2's BatchNorm gradients by 3e-3 relative and conv1.weight after
        // two updates by 3e-5 (docs/results.md, "BatchNorm split test").
        let err = relative(&f32s(value), want);
        assert!(err == 0.0, "{name}: {err:e}");
        seen += 1;
    }
    assert_eq!(seen, want.len(), "every parameter compared");
}

/// The bytes one proxied connection's client sent.
type Record = Arc<Mutex<Vec<u8>>>;

/// A loopback TCP proxy that records every byte each connection sends from the client
/// to the server.
struct Proxy {
    address: String,
    connections: Arc<Mutex<Vec<Record>>>,
}

impl Proxy {
    fn spawn(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connections: Arc<Mutex<Vec<Record>>> = Arc::default();
        let all = Arc::clone(&connections);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = TcpStream::connect(&target).unwrap();
                let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let record: Record = Arc::default();
                all.lock().unwrap().push(Arc::clone(&record));
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = c_read.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if s_write.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || std::io::copy(&mut s_read, &mut c_write));
            }
        });
        Proxy { address, connections }
    }

    /// What the client sent, as the joined HTTP/2 DATA payloads of each stream.
    fn sent(&self) -> Vec<u8> {
        let connections = self.connections.lock().unwrap();
        connections.iter().flat_map(|c| http2_data(&c.lock().unwrap())).flatten().collect()
    }
}

/// The payloads of the HTTP/2 DATA frames of one connection's client bytes, joined per
/// stream: gRPC messages, whose protobuf `bytes` fields (tensor data) are contiguous
/// there, while on the wire a frame header may cut through them.
fn http2_data(bytes: &[u8]) -> Vec<Vec<u8>> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    assert!(bytes.starts_with(PREFACE), "not an HTTP/2 connection");
    let mut streams: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
    let mut at = PREFACE.len();
    while at + 9 <= bytes.len() {
        let len = (usize::from(bytes[at]) << 16) | (usize::from(bytes[at + 1]) << 8) | usize::from(bytes[at + 2]);
        let (kind, flags) = (bytes[at + 3], bytes[at + 4]);
        let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
        let payload = &bytes[at + 9..(at + 9 + len).min(bytes.len())];
        if kind == 0 {
            let data = if flags & 0x8 != 0 {
                let pad = usize::from(payload[0]);
                &payload[1..payload.len() - pad]
            } else {
                payload
            };
            streams.entry(stream).or_default().extend_from_slice(data);
        }
        at += 9 + len;
    }
    streams.into_values().collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn no_training_sample_leaves_the_device_but_labels_do() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let proxy = Proxy::spawn(edge.address.clone());
    let at = edge_at(&proxy.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 16, 32);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let run = dir.path().join("run");
    device_run(&run, &at, "mlp.onnx", split, &recipe);

    // The samples the run trained on, as the device's forward saw them.
    let data = edgefreeze_data::named::open("fashion-mnist").unwrap();
    let indices = edgefreeze_train::subset(data.train.len(), recipe.train_limit, recipe.seed);
    let order: Vec<usize> =
        edgefreeze_data::epoch_order(indices.len(), recipe.seed, 1).into_iter().map(|i| indices[i]).collect();
    let batch = data.train.batch(&order, None, recipe.seed, 1).unwrap();
    let pixels = batch.inputs.as_f32().unwrap();

    let sent = proxy.sent();
    assert!(sent.len() > 16 * 256 * 4, "the activations went through the proxy ({} bytes)", sent.len());
    for (k, sample) in pixels.chunks(28 * 28).enumerate() {
        // Rows 10 to 17: the middle of the image, where every item has ink.
        let window: Vec<u8> = sample[280..504].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(!contains(&sent, &window), "sample {k} (index {}) went to the edge", order[k]);
    }
    // The labels of the first micro-batch went up, as i64 little-endian.
    let labels: Vec<u8> = batch.labels[..8].iter().flat_map(|l| l.to_le_bytes()).collect();
    assert!(contains(&sent, &labels), "the first micro-batch's labels are in what the device sent");
}

#[test]
fn a_wrong_token_or_an_unknown_device_is_refused() {
    let edge = Edge::spawn(None);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 16, 32);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    for (k, (device, token)) in [("phone-1", "wrong-token-0123456789"), ("tablet-9", TOKEN)].into_iter().enumerate() {
        let run = dir.path().join(format!("run-{k}"));
        create_device_run(
            &run,
            &model("mlp.onnx"),
            "cross-entropy",
            OPTIMIZER,
            "fashion-mnist",
            &recipe,
            split.clone(),
        )
        .unwrap();
        let err = DeviceTrainer::open(&run, &[edge_at(&edge.address, device, token)], device_options())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("Unauthenticated"), "{device}: {err}");
        assert!(!err.contains(token), "the error must not echo the token: {err}");
    }
}

#[test]
fn resume_continues_both_sides_at_the_same_step() {
    if !fashion_mnist_available() {
        return;
    }
    let state_dir = tempfile::tempdir().unwrap();
    let edge = Edge::spawn(Some(state_dir.path()));
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 64);
    let split = SplitSettings { cut: 1, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let whole = device_run(&dir.path().join("whole"), &at, "mlp.onnx", split.clone(), &recipe);

    let run = dir.path().join("resumed");
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    let mut first =
        DeviceTrainer::open(&run, std::slice::from_ref(&at), DeviceOptions { epochs_now: Some(1), ..device_options() })
            .unwrap();
    assert_eq!(first.run().unwrap().epochs, 1);
    first.close().unwrap();

    // Another edge server, without this run's checkpoints, cannot resume it.
    let empty = Edge::spawn(None);
    let err = DeviceTrainer::open(&run, &[edge_at(&empty.address, "phone-1", TOKEN)], device_options())
        .err()
        .expect("an edge without the run's checkpoint refuses to resume it")
        .to_string();
    assert!(err.contains("step 2") || err.contains("checkpoint"), "{err}");

    let mut second = DeviceTrainer::open(&run, std::slice::from_ref(&at), device_options()).unwrap();
    assert_eq!((second.epochs_done(), second.steps_done()), (1, 2));
    assert_eq!(second.run().unwrap().steps, 4);
    let resumed = (second.device_state().unwrap(), second.edge_state().unwrap());
    second.close().unwrap();
    // One thread on both sides and the same batches: the resumed run is the same run.
    assert_eq!(resumed.0, whole.0, "device state");
    assert_eq!(resumed.1, whole.1, "edge state");
}

#[test]
fn device_and_edge_as_separate_processes_with_the_schedule_chart() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let plot = dir.path().join("curves.png");
    let out = Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
        .env("EDGEFREEZE_TOKEN", TOKEN)
        .args(["device", "train", "--edge", &edge.address, "--device-id", "phone-1", "--data", "fashion-mnist"])
        .args(["--model", model("lenet5.onnx").to_str().unwrap(), "--cut", "1", "--micro-batches", "4"])
        .args(["--epochs", "1", "--batch", "32", "--lr", "0.05", "--limit", "128", "--test-limit", "64"])
        .args(["--threads", "1", "--out", run.to_str().unwrap(), "--plot", plot.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("epoch 1/1") && said.contains("test accuracy"), "{said}");
    assert!(run.join("checkpoints/epoch-0001.safetensors").is_file());
    assert!(run.join("metrics.jsonl").is_file() && run.join("schedule.json").is_file());
    assert!(plot.is_file() && dir.path().join("curves-schedule.png").is_file());
    let schedule: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("schedule.json")).unwrap()).unwrap();
    let first = &schedule[0];
    assert_eq!(first["exchanges"].as_array().unwrap().len(), 4, "{first}");
    assert!(first["exchanges"][0]["edge"]["start_us"].as_i64().unwrap() > 0, "the edge stamped its work");

    // The same run resumed has nothing to do; both sides agree it is finished.
    let again = Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
        .env("EDGEFREEZE_TOKEN", TOKEN)
        .args(["device", "train", "--edge", &edge.address, "--device-id", "phone-1", "--quiet", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(again.status.success(), "{}", text(&again));
    assert!(text(&again).contains("nothing to do"), "{}", text(&again));
}

/// The uninterrupted reference of the fault tests: the MLP split after layer 0, 2 epochs
/// of 8 updates of 32 samples, M = 2, one engine thread on both sides → (device state,
/// edge state).
#[allow(clippy::type_complexity)]
fn reference_run(dir: &Path, recipe: &Recipe, split: &SplitSettings) -> (Vec<(String, Value)>, Vec<(String, Value)>) {
    let edge = Edge::spawn(None);
    device_run(dir, &edge_at(&edge.address, "phone-1", TOKEN), "mlp.onnx", split.clone(), recipe)
}

/// Options for the fault tests: a consistent copy every 3 updates, a short fail-over wait,
/// and `hook` after every update.
fn fault_options(hook: impl Fn(u64) + Send + Sync + 'static) -> DeviceOptions {
    DeviceOptions {
        sync_every: 3,
        edge_timeout: std::time::Duration::from_secs(10),
        failover_wait: std::time::Duration::from_secs(20),
        after_update: Some(edgefreeze_device::trainer::AfterUpdate(Arc::new(hook))),
        ..device_options()
    }
}

fn decisions(run: &Path, kind: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "decision" && v["kind"] == kind)
        .collect()
}

#[test]
fn a_killed_edge_server_is_failed_over_without_losing_or_repeating_an_update() {
    fail_over_case(Fault::Kill);
}

#[test]
fn an_edge_server_that_stops_answering_is_failed_over_after_the_timeout() {
    fail_over_case(Fault::Stop);
}

/// How the first server fails.
#[derive(Clone, Copy)]
enum Fault {
    /// kill -9: the connection breaks at once.
    Kill,
    /// kill -STOP: the process hangs and the connection stays open; only the device's
    /// timeout finds it out.
    Stop,
}

fn fail_over_case(fault: Fault) {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 256);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let want = reference_run(&dir.path().join("reference"), &recipe, &split);

    let first = Arc::new(Mutex::new(Some(Edge::spawn(None))));
    let second = Edge::spawn(None);
    let first_address = first.lock().unwrap().as_ref().unwrap().address.clone();
    let edges = [edge_at(&first_address, "phone-1", TOKEN), edge_at(&second.address, "phone-1", TOKEN)];
    let run = dir.path().join("run");
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    // kill -9 of the first server after update 5: the last consistent copy is at 3.
    let killer = Arc::clone(&first);
    let mut options = fault_options(move |step| {
        if step != 5 {
            return;
        }
        match fault {
            Fault::Kill => {
                if let Some(mut edge) = killer.lock().unwrap().take() {
                    edge.child.kill().unwrap();
                    edge.child.wait().unwrap();
                }
            }
            Fault::Stop => {
                if let Some(edge) = killer.lock().unwrap().as_ref() {
                    let pid = edge.child.id().to_string();
                    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
                }
            }
        }
    });
    if matches!(fault, Fault::Stop) {
        options.edge_timeout = std::time::Duration::from_secs(2);
    }
    let mut trainer = DeviceTrainer::open(&run, &edges, options).unwrap();
    assert_eq!(trainer.edge_place().address, first_address);
    let summary = trainer.run().unwrap();
    assert_eq!(summary.steps, 16, "every update done once");
    assert_eq!(trainer.edge_place().address, second.address, "the run moved to the second server");
    let got = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());
    trainer.close().unwrap();
    // The updates after the last consistent copy were done again from it, with the same
    // batches: the run is the uninterrupted run, bit for bit.
    assert_eq!(got.0, want.0, "device state");
    assert_eq!(got.1, want.1, "edge state");
    let failovers = decisions(&run, "failover");
    assert_eq!(failovers.len(), 1, "{failovers:?}");
    assert_eq!(failovers[0]["step"], 3, "{failovers:?}");
    let reason = failovers[0]["reason"].as_str().unwrap();
    assert!(reason.contains(&first_address) && reason.contains(&second.address), "{reason}");
    // metrics.jsonl has every update, those done again included, in order of time.
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] == "step")
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], "{text}");
}

#[test]
fn a_restarted_edge_server_takes_the_run_back_and_refuses_messages_from_before() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 256);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let want = reference_run(&dir.path().join("reference"), &recipe, &split);

    let edge = Arc::new(Mutex::new(Edge::spawn(None)));
    let address = edge.lock().unwrap().address.clone();
    let run = dir.path().join("run");
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    // After update 10 the only server dies and a new one starts at its address.
    let restarter = Arc::clone(&edge);
    let listen = address.clone();
    let options = fault_options(move |step| {
        let mut edge = restarter.lock().unwrap();
        if step == 10 && edge.address == listen && !edge.restarted {
            edge.child.kill().unwrap();
            edge.child.wait().unwrap();
            let mut again = Edge::spawn_at(&listen, None);
            again.restarted = true;
            *edge = again;
        }
    });
    let mut trainer = DeviceTrainer::open(&run, &[edge_at(&address, "phone-1", TOKEN)], options).unwrap();
    let before = trainer.session().unwrap().header.clone().unwrap();
    let summary = trainer.run().unwrap();
    assert_eq!(summary.steps, 16);
    let after = trainer.session().unwrap().header.clone().unwrap();
    assert_ne!(after.session_id, before.session_id);
    assert_ne!(after.model_version, before.model_version, "a restarted server hands out new model versions");
    let got = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());

    // Messages from before the restart are refused by the new server: one of the old
    // session, and one that names the new session with the old model version (a message
    // in flight when the server went down, retried against the session that took over).
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (unknown, stale) = runtime.block_on(async {
        let credentials = Credentials::new("phone-1", TOKEN).unwrap();
        let limits = edgefreeze_wire::Limits::default();
        let mut client = edgefreeze_wire::connect(&address, credentials, &limits).await.unwrap();
        let old_session = edgefreeze_wire::pb::FetchStateRequest {
            header: Some(edgefreeze_wire::pb::Header::new(&before.session_id, 9, 0, before.model_version)),
        };
        let old_version = edgefreeze_wire::pb::FetchStateRequest {
            header: Some(edgefreeze_wire::pb::Header::new(&after.session_id, 16, 0, before.model_version)),
        };
        (client.fetch_state(old_session).await.unwrap_err(), client.fetch_state(old_version).await.unwrap_err())
    });
    assert_eq!(unknown.code(), tonic::Code::NotFound, "the old session is gone: {unknown:?}");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains(&format!("stale model version {}", before.model_version)), "{stale:?}");

    // The session goes on after refusing them.
    assert_eq!(trainer.edge_state().unwrap(), got.1);
    trainer.close().unwrap();
    assert_eq!(got.0, want.0, "device state");
    assert_eq!(got.1, want.1, "edge state");
    assert_eq!(decisions(&run, "failover").len(), 1);
}

#[test]
fn the_edge_side_migrates_between_steps_and_training_goes_on_unchanged() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 256);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let want = reference_run(&dir.path().join("reference"), &recipe, &split);
    let (first, second) = (Edge::spawn(None), Edge::spawn(None));
    let edges = [edge_at(&first.address, "phone-1", TOKEN), edge_at(&second.address, "phone-1", TOKEN)];
    let run = dir.path().join("run");
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    let mut trainer =
        DeviceTrainer::open(&run, &edges, DeviceOptions { epochs_now: Some(1), ..device_options() }).unwrap();
    trainer.run().unwrap();
    trainer.migrate(1, "the test moves it").unwrap();
    assert_eq!(trainer.edge_place().address, second.address);
    let summary = trainer.run().unwrap();
    assert_eq!(summary.steps, 16);
    let got = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());
    trainer.close().unwrap();
    assert_eq!(got.0, want.0, "device state");
    assert_eq!(got.1, want.1, "edge state");
    let moves = decisions(&run, "migrate");
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0]["step"], 8);
}

#[test]
fn the_cut_moves_mid_run_with_the_state_of_the_layers_that_change_sides() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 256);
    // Local training is the reference: a split run at any cut equals it up to f32
    // rounding (see pipelined_split_training_equals_local_training).
    let (want, initial) = local_training(&dir.path().join("local"), 0, &recipe);

    let (first, second) = (Edge::spawn(None), Edge::spawn(None));
    let edges = [edge_at(&first.address, "phone-1", TOKEN), edge_at(&second.address, "phone-1", TOKEN)];
    let run = dir.path().join("run");
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    let mut trainer =
        DeviceTrainer::open(&run, &edges, DeviceOptions { epochs_now: Some(1), ..device_options() }).unwrap();
    trainer.run().unwrap();
    let before: Vec<String> = trainer.device_state().unwrap().into_iter().map(|(n, _)| n).collect();
    // fc2 (and its momentum) moves from the edge to the device, on the other server.
    trainer.recut(1, 1, "the test moves it").unwrap();
    let after: Vec<String> = trainer.device_state().unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(after.len() > before.len() && before.iter().all(|n| after.contains(n)), "{before:?} → {after:?}");
    assert_eq!(trainer.edge_place().cut, Some(1));
    trainer.run().unwrap();
    let (device, edge_state) = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());
    trainer.close().unwrap();
    let mut seen = 0;
    for (name, value) in device.iter().chain(&edge_state) {
        let (_, w) = want.iter().find(|(n, _)| n == name).unwrap();
        assert_like_local(value, w, &initial, name, name);
        seen += 1;
    }
    assert_eq!(seen, 12, "every parameter and momentum, on one side or the other");
    let moves = decisions(&run, "migrate");
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert!(moves[0]["reason"].as_str().unwrap().contains("after layer 0 to after layer 1"), "{moves:?}");

    // Resumed, the run is at the new cut (its last checkpoint says so).
    let again = DeviceTrainer::open(&run, &edges, device_options());
    let again = again.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.device_run().split.cut, 1);
    assert_eq!(again.epochs_done(), 2);
}

#[test]
fn with_no_edge_server_left_the_run_goes_on_alone_on_the_device_and_resumes_there() {
    if !fashion_mnist_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, 32, 256);
    let split = SplitSettings { cut: 0, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    let want = reference_run(&dir.path().join("reference"), &recipe, &split);
    let only = Arc::new(Mutex::new(Some(Edge::spawn(None))));
    let address = only.lock().unwrap().as_ref().unwrap().address.clone();
    let run = dir.path().join("run");
    create_device_run(&run, &model("mlp.onnx"), "cross-entropy", OPTIMIZER, "fashion-mnist", &recipe, split).unwrap();
    let killer = Arc::clone(&only);
    let options = || {
        let killer = Arc::clone(&killer);
        let mut options = fault_options(move |step| {
            if step == 5
                && let Some(mut edge) = killer.lock().unwrap().take()
            {
                edge.child.kill().unwrap();
                edge.child.wait().unwrap();
            }
        });
        options.failover_wait = std::time::Duration::from_secs(1);
        options.alone_if_no_edge = true;
        options
    };
    let edges = [edge_at(&address, "phone-1", TOKEN)];
    let mut first = DeviceTrainer::open(&run, &edges, DeviceOptions { epochs_now: Some(1), ..options() }).unwrap();
    first.run().unwrap();
    assert!(first.alone(), "the run went on on the device");
    drop(first);
    // Resumed with its only server still gone: its checkpoint holds both sides.
    let mut second = DeviceTrainer::open(&run, &edges, options()).unwrap();
    assert!(second.alone() && second.steps_done() == 8);
    assert_eq!(second.run().unwrap().steps, 16);
    let got = (second.device_state().unwrap(), second.edge_state().unwrap());
    // The local edge side computes what the server computes, in the same arithmetic.
    assert_eq!(got.0, want.0, "device state");
    assert_eq!(got.1, want.1, "edge state");
    let failovers = decisions(&run, "failover");
    assert_eq!(failovers.len(), 1, "{failovers:?}");
    assert!(failovers[0]["reason"].as_str().unwrap().contains("alone on the device"), "{failovers:?}");
}

/// Two edge servers behind in-process shapers (`near` first in `--edge`, then `other`),
/// and an adaptive MLP device run of 30 updates across them (`device train --adapt`).
struct AdaptiveRun {
    near: edgefreeze_shaper::Shaper,
    other: edgefreeze_shaper::Shaper,
    near_at: String,
    other_at: String,
    run: std::path::PathBuf,
    child: Option<Child>,
    // Dropped last: the shapers run on this runtime, and the servers behind them.
    _servers: (Edge, Edge, tokio::runtime::Runtime, tempfile::TempDir),
}

impl AdaptiveRun {
    /// Starts the run with the links shaped `near` and `other` and `extra` flags, and
    /// waits until it has made `steps` updates.
    fn start(near: edgefreeze_shaper::Shape, other: edgefreeze_shaper::Shape, extra: &[&str], steps: usize) -> Self {
        use edgefreeze_shaper::Shaper;
        let (first, second) = (Edge::spawn(None), Edge::spawn(None));
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (near, other) = runtime.block_on(async {
            let a = Shaper::start(first.address.parse().unwrap(), near, near).await.unwrap();
            let b = Shaper::start(second.address.parse().unwrap(), other, other).await.unwrap();
            (a, b)
        });
        let (near_at, other_at) = (near.local_addr().to_string(), other.local_addr().to_string());
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut child = Command::new(env!("CARGO_BIN_EXE_edgefreeze"))
            .env("EDGEFREEZE_TOKEN", TOKEN)
            .args(["device", "train", "--edge", &format!("{near_at},{other_at}"), "--device-id", "phone-1"])
            .args(["--model", model("mlp.onnx").to_str().unwrap(), "--data", "fashion-mnist", "--cut", "0"])
            .args(["--micro-batches", "2", "--epochs", "1", "--batch", "32", "--limit", "960", "--test-limit", "64"])
            .args(["--log-every", "1", "--threads", "1", "--adapt", "--adapt-every", "3", "--adapt-budget", "20"])
            .args(extra)
            .args(["--out", run.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let done = || {
            std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default().matches("\"event\":\"step\"").count()
        };
        while done() < steps {
            assert!(started.elapsed().as_secs() < 180, "training did not start");
            assert!(child.try_wait().unwrap().is_none(), "the device stopped early");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let child = Some(child);
        AdaptiveRun { near, other, near_at, other_at, run, child, _servers: (first, second, runtime, dir) }
    }

    /// Waits for the run to end → its first migration's reason, and every migration.
    fn first_move(&mut self) -> (String, Vec<serde_json::Value>) {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let moves = decisions(&self.run, "migrate");
        assert!(!moves.is_empty(), "{}", text(&out));
        (moves[0]["reason"].as_str().unwrap().to_string(), moves)
    }
}

impl Drop for AdaptiveRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn adapt_migrates_when_the_link_to_its_server_degrades() {
    if !fashion_mnist_available() {
        return;
    }
    use edgefreeze_shaper::Shape;
    let fast = Shape::mbit(100.0, std::time::Duration::from_millis(1));
    let plot = tempfile::tempdir().unwrap();
    let curves = plot.path().join("curves.png");
    // Once training runs, the device moves away from its server: 100 → 1 Mbit/s.
    let mut run = AdaptiveRun::start(fast, fast, &["--plot", curves.to_str().unwrap()], 5);
    let slow = Shape::mbit(1.0, std::time::Duration::from_millis(20));
    run.near.set_up(slow).unwrap();
    run.near.set_down(slow).unwrap();
    // The first move leaves the slow link for the other server (later re-plans may move
    // the cut or M there, as the fresh measurements say).
    let (reason, moves) = run.first_move();
    let (near_at, other_at) = (&run.near_at, &run.other_at);
    assert!(reason.contains(&format!("from {near_at} to {other_at}")) && reason.contains("drifted"), "{reason}");
    assert!(moves.iter().all(|m| !m["reason"].as_str().unwrap().contains(&format!("to {near_at}"))), "{moves:?}");
    assert!(run.run.join("checkpoints/epoch-0001.safetensors").is_file());
    assert!(plot.path().join("curves-steps.png").is_file(), "the step-time chart with its decisions");
}

/// `--adapt-reprobe-every`: the link to another server gets better while the run's own
/// step holds its prediction (no drift, which is switched off here), so only a periodic
/// re-probe can see it; the device migrates there and says why.
#[test]
fn a_periodic_reprobe_finds_a_server_whose_link_got_better() {
    if !fashion_mnist_available() {
        return;
    }
    use edgefreeze_shaper::Shape;
    let moderate = Shape::mbit(2.0, std::time::Duration::from_millis(5));
    let poor = Shape::mbit(0.5, std::time::Duration::from_millis(20));
    let periodic = ["--adapt-drift", "1000", "--adapt-reprobe-every", "6", "--adapt-cuts", "0"];
    // Once training runs on the near server, the other one's link becomes fast.
    let mut run = AdaptiveRun::start(moderate, poor, &periodic, 3);
    let fast = Shape::mbit(100.0, std::time::Duration::from_millis(1));
    run.other.set_up(fast).unwrap();
    run.other.set_down(fast).unwrap();
    let (reason, _) = run.first_move();
    let (near_at, other_at) = (&run.near_at, &run.other_at);
    assert!(
        reason.contains(&format!("from {near_at} to {other_at}")) && reason.contains("periodic re-probe"),
        "{reason}"
    );
    assert!(!reason.contains("drifted"), "{reason}");
}

/// A model we did not write: the zoo's TorchScript Transformer encoder, cut after its first
/// encoder layer's attention block, where the edge side reshapes by the shapes of the
/// device side's attention heads (`B·heads`), trained over a real `edge serve` for two
/// pipelined steps of two micro-batches: both sides' parameters and momenta equal local
/// training's. Spam-assassin's emails give the 8-token input.
#[test]
fn a_zoo_transformer_trains_split_over_an_edge_server_like_locally() {
    if !common::spam_assassin_available() {
        return;
    }
    let zoo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/zoo/tfenc_bf_pre_gelu.ts.onnx");
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 8, 16);
    let local_dir = dir.path().join("local");
    let source = ModelSource::from_path(&zoo, "cross-entropy", OPTIMIZER, 0);
    create_run(&local_dir, &source, "spam-assassin", &recipe).unwrap();
    let mut local = Trainer::open(&local_dir, single_thread()).unwrap();
    local.run().unwrap();
    let want = local.state().unwrap();
    let initial =
        edgefreeze_train::checkpoint::Checkpoint::read(&local_dir.join("checkpoints/epoch-0000.safetensors")).unwrap();

    let edge = Edge::spawn(None);
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let split_dir = dir.path().join("split");
    let split = SplitSettings { cut: 2, micro_batches: 2, sequential: false, recompute: false, freeze_device: false };
    create_device_run(&split_dir, &zoo, "cross-entropy", OPTIMIZER, "spam-assassin", &recipe, split).unwrap();
    let mut trainer = DeviceTrainer::open(&split_dir, std::slice::from_ref(&at), device_options()).unwrap();
    trainer.run().unwrap();
    let got: Vec<(String, Value)> =
        trainer.device_state().unwrap().into_iter().chain(trainer.edge_state().unwrap()).collect();
    trainer.close().unwrap();
    let mut seen = 0;
    for (name, want) in want.iter().filter(|(_, v)| v.as_f32().is_some()) {
        let (_, value) = got.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} is on neither side"));
        assert_like_local(value, want, &initial.state, name, &format!("tfenc_bf_pre_gelu cut 2 M=2 {name}"));
        seen += 1;
    }
    assert!(seen > 0, "no tensor compared");
}

/// A segmentation model split between device and edge: the labels per pixel go up with
/// each micro-batch, the edge's loss ignores the unlabelled ones, and its accuracy per
/// pixel comes back as a float (`correct_samples`). With one micro-batch (BatchNorm sees
/// the whole batch on both sides) the run equals local training: parameters, losses and
/// accuracies.
#[test]
fn a_segmentation_model_split_equals_local_training_with_labels_per_pixel() {
    if !fashion_mnist_available() {
        return;
    }
    let edge = Edge::spawn(None);
    let at = edge_at(&edge.address, "phone-1", TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(1, 16, 48);
    let loss = "cross-entropy:ignore=255";
    let local_dir = dir.path().join("local");
    let source = ModelSource::from_path(&model("fcn_28.onnx"), loss, OPTIMIZER, 0);
    create_run(&local_dir, &source, "fashion-mnist-seg", &recipe).unwrap();
    let mut local = Trainer::open(&local_dir, single_thread()).unwrap();
    local.run().unwrap();
    let local_state = local.state().unwrap();
    let initial = edgefreeze_train::checkpoint::Checkpoint::read(&local_dir.join("checkpoints/epoch-0000.safetensors"));
    let initial = initial.unwrap().state;
    drop(local);

    let split_dir = dir.path().join("split");
    // Cut after layer 1: the first convolution and its BatchNorm on the device.
    let split = SplitSettings { cut: 1, micro_batches: 1, sequential: false, recompute: false, freeze_device: false };
    create_device_run(&split_dir, &model("fcn_28.onnx"), loss, OPTIMIZER, "fashion-mnist-seg", &recipe, split).unwrap();
    let mut trainer = DeviceTrainer::open(&split_dir, std::slice::from_ref(&at), device_options()).unwrap();
    trainer.run().unwrap();
    let (device, edge_state) = (trainer.device_state().unwrap(), trainer.edge_state().unwrap());
    trainer.close().unwrap();
    let mut seen = 0;
    for (name, value) in device.iter().chain(&edge_state) {
        let Some((_, want)) = local_state.iter().find(|(n, _)| n == name) else { continue };
        if name.starts_with("momentum.") || !matches!(value, Value::F32(_)) {
            continue;
        }
        if initial.iter().any(|(n, _)| n == name) {
            assert_like_local(value, want, &initial, name, &format!("fcn_28 cut 1 {name}"));
            seen += 1;
        }
    }
    assert!(seen >= 10, "parameters compared: {seen}");
    // The accuracies per labelled pixel, as the edge reported them and as local training
    // computed them.
    let epoch = |run: &Path| {
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        metrics
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r.get("test_accuracy").is_some())
            .unwrap()
    };
    let (want, got) = (epoch(&local_dir), epoch(&split_dir));
    for key in ["train_accuracy", "test_accuracy", "train_loss"] {
        let (w, g) = (want[key].as_f64().unwrap(), got[key].as_f64().unwrap());
        assert!(w > 0.0 && (w - g).abs() <= 1e-5 * w.abs().max(1.0), "{key}: split {g}, local {w}");
    }
}
