//! Every graph the rewrites emit, for every bundled model and zoo fixture, is standard ONNX: the default
//! `ai.onnx` domain only, and `onnx.checker` with `full_check` passes; and lean (no
//! dead nodes, common subexpressions merged).

use edgefreeze_autodiff::{Loss, Optimizer};
use edgefreeze_graph::{Model, analyse, import, save_model};
use edgefreeze_rewrite::{SplitOptions, StepSpec, cached_pair, frozen_prefix_step, split};
use edgefreeze_tests::{bundled_and_zoo_files, python_onnx, run_python};
use std::path::{Path, PathBuf};

#[test]
fn every_rewritten_graph_is_standard_onnx_and_passes_the_checker() {
    let spec = StepSpec {
        loss: Loss::cross_entropy(),
        optimizer: Optimizer::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 },
    };
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = Vec::new();
    for path in bundled_and_zoo_files() {
        let model = import(&path).unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let analysis = analyse(&model).unwrap();
        let probes: Vec<usize> = (0..analysis.layers.len()).collect();
        let cut = analysis.cuts[analysis.cuts.len() / 2].after_layer;
        let mut graphs: Vec<(String, Model)> =
            vec![("frozen".into(), frozen_prefix_step(&model, &spec, cut + 1, &probes).unwrap())];
        let pair = cached_pair(&model, cut, &spec).unwrap();
        graphs.push(("prefix".into(), pair.prefix));
        graphs.push(("suffix".into(), pair.suffix_step));
        // The split takes cuts without side inputs (GPT-2 and Llama of the zoo have none).
        let splittable: Vec<usize> =
            analysis.cuts.iter().filter(|c| c.side_inputs.is_empty()).map(|c| c.after_layer).collect();
        let Some(&cut) = splittable.get(splittable.len() / 2) else {
            save_all(&stem, graphs, dir.path(), &mut files);
            continue;
        };
        for (tag, options) in [
            ("stash", SplitOptions { frozen_device_layers: false, recompute: false }),
            ("recompute", SplitOptions { frozen_device_layers: false, recompute: true }),
            ("frozen", SplitOptions { frozen_device_layers: true, recompute: false }),
        ] {
            let set = split(&model, cut, &spec, options).unwrap();
            for (role, m) in set.graphs() {
                graphs.push((format!("{tag}_{role:?}"), m.clone()));
            }
        }
        save_all(&stem, graphs, dir.path(), &mut files);
    }
    if python_onnx() {
        let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        let out = run_python("check_model.py", &refs);
        assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), files.len(), "{out}");
    }
}

/// Checks each graph is lean and in the default domain, and saves it into `dir` for the
/// checker.
fn save_all(stem: &str, graphs: Vec<(String, Model)>, dir: &Path, files: &mut Vec<PathBuf>) {
    for (kind, m) in graphs {
        // Lean: no dead nodes, no shared subexpression left unmerged.
        let mut copy = m.graph.clone();
        assert_eq!(copy.remove_dead_nodes(), 0, "{stem} {kind}: dead nodes");
        assert_eq!(edgefreeze_graph::optimize::merge_common_subexpressions(&mut copy), 0, "{stem} {kind}: unmerged");
        assert!(
            m.graph.nodes.iter().all(|n| n.domain.is_empty()) && m.opset_imports.iter().all(|(d, _)| d.is_empty()),
            "{stem} {kind}: only the default ai.onnx domain"
        );
        let path = dir.join(format!("{stem}_{kind}.onnx"));
        save_model(&m, &path, &Default::default()).unwrap();
        files.push(path);
    }
}
