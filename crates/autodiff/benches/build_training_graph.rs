//! Time to build the training-step graph of each bundled model, and of ResNet-50 when
//! `target/bench/resnet50.onnx` exists (`python3 tools/export_resnet50.py target/bench/resnet50.onnx`).
//! Node counts of the forward and training graphs are printed beside the timings.

use criterion::{Criterion, criterion_group, criterion_main};
use edgefreeze_autodiff::{Loss, Optimizer, TrainingSpec, training_step_graph};
use std::path::PathBuf;

fn models() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut paths: Vec<PathBuf> = ["lenet5", "resnet20_32", "mobilenetv2_05", "transformer_text"]
        .iter()
        .map(|m| root.join("models").join(format!("{m}.onnx")))
        .collect();
    let resnet50 = root.join("target/bench/resnet50.onnx");
    if resnet50.is_file() {
        paths.push(resnet50);
    } else {
        eprintln!("(no {}: run tools/export_resnet50.py to include ResNet-50)", resnet50.display());
    }
    paths
}

fn bench(c: &mut Criterion) {
    let spec = TrainingSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::Sgd { momentum: 0.9, nesterov: false, weight_decay: 5e-4 },
        frozen: vec![],
    };
    let mut group = c.benchmark_group("training_step_graph");
    group.sample_size(10);
    for path in models() {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let model = edgefreeze_graph::import(&path).unwrap();
        let graph = training_step_graph(&model, &spec).unwrap();
        eprintln!("{name}: forward {} nodes, training step {} nodes", model.graph.nodes.len(), graph.graph.nodes.len());
        group.bench_function(&name, |b| b.iter(|| training_step_graph(&model, &spec).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
