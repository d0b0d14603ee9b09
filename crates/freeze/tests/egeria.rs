//! Freezing in the trainer, end to end on LeNet-5 and real Fashion-MNIST with tract:
//! a fixed schedule freezes exactly what it says and, once the prefix ends at a cut,
//! trains from cached activations to the same numbers as without the cache; `--freeze
//! auto` freezes from plasticity; and a run that froze mid-way resumes bit for bit.

use edgefreeze_engine::{EngineKind, Value};
use edgefreeze_freeze::Knobs;
use edgefreeze_freeze::egeria::{CacheSettings, FreezePlan, FreezeSettings, Freezer};
use edgefreeze_train::checkpoint::{Checkpoint, checkpoint_path};
use edgefreeze_train::metrics::{Decision, DecisionKind, Record, read_decisions, read_records};
use edgefreeze_train::{ModelSource, Recipe, Schedule, TrainOptions, Trainer, create_run};
use std::path::Path;

fn data_available() -> bool {
    if Path::new("/usr/share/datasets/fashion-mnist").is_dir() {
        return true;
    }
    assert!(
        std::env::var("EDGEFREEZE_REQUIRE_DATA").map_or(true, |v| v.is_empty() || v == "0"),
        "EDGEFREEZE_REQUIRE_DATA is set but Fashion-MNIST is missing: apt-get install -y dataset-fashion-mnist"
    );
    eprintln!("skipping: Fashion-MNIST is missing (apt-get install -y dataset-fashion-mnist)");
    false
}

fn recipe(epochs: usize, schedule: &str) -> Recipe {
    Recipe {
        epochs,
        batch: 32,
        schedule: Schedule::parse(schedule, 0.05, 0).unwrap(),
        seed: 11,
        augment: None,
        train_limit: Some(320),
        test_limit: Some(64),
        log_every: 1,
    }
}

fn create(dir: &Path, recipe: &Recipe, settings: &FreezeSettings) {
    let source = ModelSource::Onnx {
        path: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet5.onnx"),
        loss: "cross-entropy".into(),
        optimizer: "sgd:momentum=0.9,wd=5e-4".into(),
        freeze: 0,
    };
    create_run(dir, &source, "fashion-mnist", recipe).unwrap();
    settings.write(dir).unwrap();
}

fn train(dir: &Path) -> Trainer {
    train_on(dir, EngineKind::Tract)
}

fn train_on(dir: &Path, engine: EngineKind) -> Trainer {
    let settings = FreezeSettings::read(dir).unwrap().unwrap();
    let freezer = Freezer::new(dir, settings, engine.clone()).unwrap();
    let options = TrainOptions { engine, ..TrainOptions::default() };
    let mut t = Trainer::open_with(dir, options, Box::new(freezer)).unwrap();
    t.run().unwrap();
    t
}

fn tensor(dir: &Path, epoch: usize, name: &str) -> Value {
    Checkpoint::read(&checkpoint_path(dir, epoch)).unwrap().get(name).unwrap().clone()
}

fn losses(dir: &Path) -> Vec<f64> {
    read_records(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { loss, .. } => Some(loss),
            Record::Epoch { .. } => None,
        })
        .collect()
}

fn schedule(points: Vec<(u64, usize)>, cache: bool, dir: Option<&Path>) -> FreezeSettings {
    FreezeSettings {
        plan: FreezePlan::Schedule { points },
        cache: CacheSettings {
            enabled: cache,
            memory_budget: 64 << 10,
            dir: dir.map(Path::to_path_buf),
            disk_budget: None,
        },
    }
}

#[test]
fn a_schedule_freezes_its_layers_and_the_cache_changes_no_number() {
    if !data_available() {
        return;
    }
    // 10 updates per epoch: layer 0 freezes after update 5, layers 0..2 after update 15.
    let points = vec![(5, 1), (15, 2)];
    let cached = tempfile::tempdir().unwrap();
    create(cached.path(), &recipe(3, "constant"), &schedule(points.clone(), true, None));
    let t = train(cached.path());
    let plain = tempfile::tempdir().unwrap();
    create(plain.path(), &recipe(3, "constant"), &schedule(points, false, None));
    train(plain.path());

    // Frozen parameters do not move; the trained ones do.
    for dir in [cached.path(), plain.path()] {
        assert_eq!(tensor(dir, 1, "conv1.weight"), tensor(dir, 3, "conv1.weight"));
        assert_eq!(tensor(dir, 2, "conv2.weight"), tensor(dir, 3, "conv2.weight"));
        assert_ne!(tensor(dir, 1, "conv2.weight"), tensor(dir, 2, "conv2.weight"));
        assert_ne!(tensor(dir, 2, "fc3.weight"), tensor(dir, 3, "fc3.weight"));
    }
    let d = read_decisions(&cached.path().join("metrics.jsonl")).unwrap();
    let kinds: Vec<(u64, DecisionKind, usize)> = d.iter().map(|d| (d.step, d.kind, d.depth)).collect();
    assert_eq!(
        kinds,
        vec![
            (5, DecisionKind::Freeze, 1),
            (5, DecisionKind::CacheOn, 1),
            (15, DecisionKind::Freeze, 2),
            (15, DecisionKind::CacheOn, 2)
        ]
    );
    // Prefix then suffix is the frozen-prefix step up to f32 rounding: the two runs'
    // losses agree to 1e-4 (relative) over 30 updates.
    let (a, b) = (losses(cached.path()), losses(plain.path()));
    assert_eq!(a.len(), 30);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-4 * y.abs(), "update {}: {x} with the cache, {y} without", i + 1);
    }
    let summary = t.controller_summary().unwrap();
    assert!(summary.contains("frozen 2/"), "{summary}");
    assert!(cached.path().join("cache/activations.bin").is_file());
}

fn auto(knobs: Knobs) -> FreezeSettings {
    FreezeSettings {
        plan: FreezePlan::Auto { knobs, probe_batch: 16, reference_threads: 1 },
        cache: CacheSettings { enabled: true, memory_budget: 32 << 10, dir: None, disk_budget: None },
    }
}

fn quick_knobs() -> Knobs {
    // A tolerance so loose that layers freeze within a few epochs of a tiny run: after a
    // rebuild, the SP of a layer that still learns grows about linearly from 0, a slope
    // near its mean (the decision rule itself is unit-tested in controller.rs; this test
    // is about the mechanics and exact resume). Every active layer is measured (the
    // default), so the values in flight at a checkpoint are of several layers.
    Knobs {
        every: 3,
        warmup: 3,
        window: 3,
        tolerance: 1.5,
        refresh: 12,
        lr_drop: 5.0,
        unfreeze_to: 0,
        confidence: 0.0,
        ahead: true,
        lagged: true,
        fall: None,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn without_timings(records: Vec<Record>) -> Vec<Record> {
    records
        .into_iter()
        .map(|mut r| {
            match &mut r {
                Record::Step { samples_per_s, .. } => *samples_per_s = 0.0,
                Record::Epoch { samples_per_s, train_seconds, cpu_seconds, .. } => {
                    *cpu_seconds = None;
                    *samples_per_s = 0.0;
                    *train_seconds = 0.0;
                }
            }
            r
        })
        .collect()
}

fn decisions(dir: &Path) -> Vec<Decision> {
    read_decisions(&dir.join("metrics.jsonl")).unwrap()
}

#[test]
fn auto_freezing_resumes_bit_for_bit_after_freezing_mid_way() {
    // The published rule: the candidate alone, against one reference per R updates.
    resumes_bit_for_bit(EngineKind::Tract, Knobs { ahead: false, lagged: false, ..quick_knobs() });
}

#[test]
fn auto_freezing_resumes_bit_for_bit_on_onnx_runtime() {
    // The defaults: every active layer, each value against the reference of the probe
    // before (rebuilt at every probe, so one is in flight at the resume point too).
    resumes_bit_for_bit(EngineKind::Ort(edgefreeze_engine::Provider::Cpu), quick_knobs());
}

fn resumes_bit_for_bit(engine: EngineKind, knobs: Knobs) {
    if !data_available() {
        return;
    }
    // A step decay at epoch 3 exercises the unfreezing too.
    let recipe = recipe(4, "step:every=3,gamma=0.1");
    let whole = tempfile::tempdir().unwrap();
    create(whole.path(), &recipe, &auto(knobs));
    let t = train_on(whole.path(), engine.clone());
    let d = decisions(whole.path());
    let freezes: Vec<&Decision> = d.iter().filter(|d| d.kind == DecisionKind::Freeze).collect();
    assert!(!freezes.is_empty(), "nothing froze: {d:#?}");
    assert!(freezes.iter().all(|f| f.history.len() == 3 && f.step >= 3), "{freezes:#?}");
    assert!(d.iter().any(|d| d.kind == DecisionKind::RebuildReference));
    // Updates 1..=30 run at 0.05, update 31 at 0.005.
    assert!(
        d.iter().any(|d| d.kind == DecisionKind::Unfreeze && d.step == 31),
        "the drop at update 31 unfroze: {d:#?}"
    );
    // Front to back: each freeze is of the layer after the previous one.
    let mut depth = 0;
    for x in &d {
        match x.kind {
            DecisionKind::Freeze => {
                assert_eq!(x.layer, Some(depth));
                depth += 1;
            }
            DecisionKind::Unfreeze => depth = x.depth,
            _ => {}
        }
    }
    eprintln!("{}", t.controller_summary().unwrap());
    assert!(freezes.iter().any(|f| f.step <= 20), "nothing froze before the resume point: {freezes:#?}");

    // The same run killed during epoch 3: resume from the epoch-2 checkpoint.
    let resumed = tempfile::tempdir().unwrap();
    copy_dir(whole.path(), resumed.path());
    for e in 3..=4 {
        std::fs::remove_file(checkpoint_path(resumed.path(), e)).unwrap();
    }
    let metrics = resumed.path().join("metrics.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["epoch"].as_u64().unwrap() <= 2 || (v["epoch"] == 3 && v["step"].as_u64().unwrap() < 24)
        })
        .map(String::from)
        .collect();
    std::fs::write(&metrics, kept.join("\n") + "\n").unwrap();
    let r = train_on(resumed.path(), engine);
    assert_eq!(t.state().unwrap(), r.state().unwrap(), "parameters differ after resuming");
    assert_eq!(
        without_timings(read_records(&whole.path().join("metrics.jsonl")).unwrap()),
        without_timings(read_records(&metrics).unwrap())
    );
    assert_eq!(decisions(whole.path()), decisions(resumed.path()));
}

/// Switching in place keeps every state tensor and the data order: a schedule run that
/// freezes layer 0 after update 10 (the end of epoch 1) trains epoch 2 exactly as the
/// frozen-prefix step graph does when loaded by hand with the run's state at that point
/// (momentum of the layers still training, the step counter going on from 11), on the
/// same batches, bit for bit.
#[test]
fn a_switch_to_a_frozen_prefix_continues_from_the_same_state_and_order() {
    use edgefreeze_autodiff::artifacts::{files, parse_loss, parse_optimizer};
    use edgefreeze_autodiff::optim::{LEARNING_RATE, STEP};
    use edgefreeze_autodiff::training::UPDATED_PREFIX;
    use edgefreeze_engine::{EngineOptions, StateUpdates};
    use edgefreeze_rewrite::{StepSpec, frozen_prefix_step};

    if !data_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(2, "constant");
    create(dir.path(), &recipe, &schedule(vec![(10, 1)], false, None));
    let t = train(dir.path());
    let decisions: Vec<(u64, DecisionKind)> = decisions(dir.path()).iter().map(|d| (d.step, d.kind)).collect();
    // Caching is off in these settings, which the run logs at its start and at the cut.
    let freezes: Vec<_> = decisions.iter().filter(|(_, k)| *k != DecisionKind::CacheOff).collect();
    assert_eq!(freezes, [&(10, DecisionKind::Freeze)], "{decisions:?}");

    // The graph the switch loads, built from the run's own files.
    let graphs = dir.path().join("graphs");
    let model = edgefreeze_graph::import(graphs.join(files::FORWARD)).unwrap();
    let manifest: edgefreeze_autodiff::artifacts::Manifest =
        serde_json::from_slice(&std::fs::read(graphs.join(files::MANIFEST)).unwrap()).unwrap();
    let spec = StepSpec {
        loss: parse_loss(&manifest.loss).unwrap(),
        optimizer: parse_optimizer(&manifest.optimizer).unwrap().0,
    };
    let frozen = frozen_prefix_step(&model, &spec, 1, &[]).unwrap();
    let outputs: Vec<String> = frozen.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let start = Checkpoint::read(&checkpoint_path(dir.path(), 1)).unwrap().state;
    let names: Vec<&str> = start.iter().map(|(n, _)| n.as_str()).collect();
    let mut ws = edgefreeze_engine::workspace(&EngineKind::Tract, &EngineOptions::default()).unwrap();
    let updates = StateUpdates::where_output_exists(UPDATED_PREFIX, names.iter().copied(), &outputs);
    let g = ws.load_graph(&edgefreeze_graph::save::encode_model(&frozen), updates).unwrap();
    for (name, value) in &start {
        ws.set_state(name, value.clone()).unwrap();
    }
    // Epoch 2's batches, in the trainer's order.
    let samples = t.train_indices();
    let order: Vec<usize> =
        edgefreeze_data::epoch_order(samples.len(), recipe.seed, 2).into_iter().map(|i| samples[i]).collect();
    let lr = Value::scalar_f32(0.05);
    let input = model.graph.inputs[0].name.clone();
    for (k, chunk) in order.chunks(recipe.batch).enumerate() {
        let batch = t.data().train.batch(chunk, None, recipe.seed, 2).unwrap();
        let (x, y) = edgefreeze_train::batch_values(batch).unwrap();
        let step = Value::scalar_i64(11 + k as i64);
        let mut feeds = vec![(input.as_str(), &x), ("labels", &y), (LEARNING_RATE, &lr)];
        if ws.inputs(g).iter().any(|i| i == STEP) {
            feeds.push((STEP, &step));
        }
        ws.run(g, &feeds).unwrap();
    }
    let end = Checkpoint::read(&checkpoint_path(dir.path(), 2)).unwrap().state;
    let mut trained = 0;
    for (name, want) in &end {
        assert_eq!(&ws.state(name).unwrap(), want, "{name} after epoch 2");
        trained += usize::from(start.iter().any(|(n, v)| n == name && v != want));
    }
    // Everything but layer 0's weight, bias and their momenta moved.
    assert_eq!(trained, end.len() - 4, "state tensors that moved in epoch 2");
}
