//! `edgefreeze inspect`: the layer and cut table of a model, or the graphs of a folder
//! that `convert` wrote.

use anyhow::{Context, Result};
use edgefreeze_autodiff::{AutodiffError, BlockedOp};
use edgefreeze_graph::ir::format_shape;
use edgefreeze_graph::{Analysis, Model, analyse, import};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `edgefreeze inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The ONNX model to inspect, or a folder written by `convert` (lists its graphs).
    pub model: PathBuf,
    /// Print JSON for programs instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `inspect`.
pub fn run(args: &InspectArgs) -> Result<()> {
    if args.model.is_dir() {
        return list_graphs(args);
    }
    let model = import(&args.model)?;
    let analysis = analyse(&model).with_context(|| format!("analysing {}", args.model.display()))?;
    let training = training_check(&model);
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = Report {
            model: args.model.display().to_string(),
            opset: model.opset(),
            source_opset: edgefreeze_graph::upgrade::source_opset(&model),
            export_notes: edgefreeze_graph::exported::notes(&model),
            trainable: training.error.is_none(),
            training_blocked_by: training.error.clone(),
            training_blocked_by_ops: training.blocked_ops.clone(),
            analysis: &analysis,
        };
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write_table(&mut out, &args.model, &model, &analysis, &training)?;
    }
    Ok(())
}

/// Whether `convert` can build the model's gradient graph with its default loss (softmax
/// cross-entropy on the first output), and if not, why, before anyone runs `convert`.
struct TrainingCheck {
    /// Ops on the path to the loss that the gradient table cannot differentiate.
    blocked_ops: Vec<BlockedOp>,
    /// Why the gradient graph cannot be built, if it cannot.
    error: Option<String>,
}

fn training_check(model: &Model) -> TrainingCheck {
    // `train` feeds batches of every size (an epoch's last one is short): a batch the file
    // keeps fixed stops it before any graph is built.
    if let Some(why) = edgefreeze_graph::batch::batch_fixed_by(model) {
        let error = Some(format!(
            "the file fixes the batch at 1 and it stays fixed ({why}); re-export with a dynamic batch axis"
        ));
        return TrainingCheck { blocked_ops: Vec::new(), error };
    }
    // The gradient table first: it names every op that blocks training, with its reason.
    match edgefreeze_autodiff::training::training_blockers(model, &[]) {
        Ok(blocked) if !blocked.is_empty() => {
            let error = Some(AutodiffError::NoRule(blocked.clone()).to_string());
            TrainingCheck { blocked_ops: blocked, error }
        }
        // Then what else stops `convert` (a shape a rule needs, a loss that does not fit).
        Ok(_) => {
            let loss = edgefreeze_autodiff::Loss::cross_entropy();
            let error = edgefreeze_autodiff::gradient_graph(model, &loss, &[]).err().map(|e| e.to_string());
            TrainingCheck { blocked_ops: Vec::new(), error }
        }
        Err(e) => TrainingCheck { blocked_ops: Vec::new(), error: Some(e.to_string()) },
    }
}

#[derive(serde::Serialize)]
struct Report<'a> {
    model: String,
    opset: i64,
    /// The opset the file was exported at, where the import brought it to `opset`.
    source_opset: Option<i64>,
    /// What the exporter did that bears on training (folded BatchNorms, a fixed batch).
    export_notes: Vec<String>,
    /// Whether `convert` builds a gradient graph (cross-entropy loss).
    trainable: bool,
    /// Why not, when it does not.
    training_blocked_by: Option<String>,
    /// The ops without a gradient rule on the path to the loss, with their nodes and why.
    training_blocked_by_ops: Vec<BlockedOp>,
    #[serde(flatten)]
    analysis: &'a Analysis,
}

fn write_table(
    out: &mut impl Write,
    path: &std::path::Path,
    model: &Model,
    a: &Analysis,
    training: &TrainingCheck,
) -> Result<()> {
    let graph = &model.graph;
    writeln!(
        out,
        "{}: opset {}{}, {} nodes, {} layers, {} cuts",
        path.display(),
        model.opset(),
        edgefreeze_graph::upgrade::source_opset(model).map_or(String::new(), |v| format!(" (upgraded from {v})")),
        graph.nodes.len(),
        a.layers.len(),
        a.cuts.len()
    )?;
    for note in edgefreeze_graph::exported::notes(model) {
        writeln!(out, "note: {note}")?;
    }
    for input in &graph.inputs {
        let shape = input.shape.as_deref().map(format_shape).unwrap_or_else(|| "?".into());
        let dtype = input.dtype.map(|d| d.to_string()).unwrap_or_else(|| "?".into());
        writeln!(out, "input  {} {dtype} {shape}", input.name)?;
    }
    match &training.error {
        // A class map per pixel or position (more axes than batch×classes) trains against
        // a label per pixel: say so, it decides the dataset.
        None if a.layers.last().is_some_and(|l| l.output_shape.len() > 2) => writeln!(
            out,
            "training: yes (convert builds the gradient graph with a cross-entropy loss per pixel: the output is a \
             class map along axis 1, trained against a label per pixel)"
        )?,
        None => writeln!(out, "training: yes (convert builds the gradient graph with a cross-entropy loss)")?,
        Some(reason) => writeln!(out, "training: no: {reason}")?,
    }
    writeln!(out)?;
    let rows: Vec<[String; 7]> = a
        .layers
        .iter()
        .map(|l| {
            let cut = a
                .cuts
                .iter()
                .find(|c| c.after_layer == l.index)
                .map(|c| {
                    // The part behind it reads model inputs too (recomputed there, fed by the trainer).
                    let side = if c.side_inputs.is_empty() {
                        String::new()
                    } else {
                        format!(" + {}", c.side_inputs.join(", "))
                    };
                    format!("✂ {}{side}", human_bytes(c.bytes_per_sample))
                })
                .unwrap_or_default();
            [
                l.index.to_string(),
                l.name.clone(),
                l.op_types.join(","),
                group_digits(l.parameters as u64),
                human_count(l.flops),
                format_shape(&l.output_shape),
                cut,
            ]
        })
        .collect();
    let header = ["#", "layer", "ops", "params", "FLOPs", "output", "cut after (bytes/sample)"];
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // Long op lists are cut so the table stays readable; --json has them all.
    widths[2] = widths[2].min(40);
    let line = |out: &mut dyn Write, cells: &[String]| -> std::io::Result<()> {
        let mut text = String::new();
        for (k, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let cell = truncate(cell, *w);
            let pad = w - cell.chars().count();
            if matches!(k, 0 | 3 | 4) {
                text.push_str(&" ".repeat(pad));
                text.push_str(&cell);
            } else {
                text.push_str(&cell);
                text.push_str(&" ".repeat(pad));
            }
            text.push_str("  ");
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(out, &header.map(String::from))?;
    line(out, &widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>())?;
    for row in &rows {
        line(out, row)?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "total: {} parameters ({} buffer elements), {} FLOPs per sample, {} layers, {} valid cuts",
        group_digits(a.total_parameters as u64),
        group_digits(a.total_buffers as u64),
        human_count(a.total_flops),
        a.layers.len(),
        a.cuts.len()
    )?;
    if a.cuts.iter().any(|c| !c.side_inputs.is_empty()) {
        writeln!(
            out,
            "a cut marked \"+ input\": the layers behind it read that model input as well (recomputing what they \
             derive from it); freezing and caching take it, the device/edge split does not (the edge would need the samples)"
        )?;
    }
    Ok(())
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}G", n as f64 / 1e9),
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// One graph of a converted folder.
#[derive(serde::Serialize)]
struct GraphSummary {
    file: String,
    nodes: usize,
    inputs: Vec<String>,
    outputs: Vec<String>,
    /// Training graphs (those with a loss): the forward values the backward pass keeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    kept_for_backward: Option<KeptForBackward>,
}

/// What a training graph keeps alive from its forward pass for its backward pass: the
/// step's activation memory ([`edgefreeze_autodiff::saved`]).
#[derive(serde::Serialize)]
struct KeptForBackward {
    /// How many forward values the backward reads.
    values: usize,
    /// Their bytes per sample: the product of the dimensions static shapes fix (the
    /// batch is symbolic in converted graphs). Values of unknown type or shape count 0.
    bytes_per_sample: u64,
    /// Of those, the values whose shape is not fully known apart from the batch.
    not_sized: usize,
}

fn kept_for_backward(model: &Model) -> Option<KeptForBackward> {
    // Graphs with a backward pass give gradients or updated state (an eval graph has a
    // loss but nothing after it but the prediction count).
    let outputs = &model.graph.outputs;
    if !outputs.iter().any(|o| o.name.starts_with("updated.") || o.name.starts_with("grad.")) {
        return None;
    }
    let saved = edgefreeze_autodiff::saved::saved_for_backward(&model.graph)?;
    let types = edgefreeze_graph::infer::infer(&model.graph, model.opset()).ok();
    let (mut bytes, mut not_sized) = (0u64, 0);
    for s in &saved {
        let info = types.as_ref().and_then(|t| t.types.get(&s.value));
        let (dtype, shape) = match info.and_then(|i| Some((i.dtype?, i.shape.clone()?))) {
            Some(known) => known,
            None => {
                not_sized += 1;
                continue;
            }
        };
        if shape.iter().filter(|d| d.fixed().is_none()).count() > 1 {
            not_sized += 1;
            continue;
        }
        let fixed: u64 = shape.iter().filter_map(|d| d.fixed()).map(|d| d as u64).product();
        bytes += fixed * dtype.size() as u64;
    }
    Some(KeptForBackward { values: saved.len(), bytes_per_sample: bytes, not_sized })
}

/// Lists every `.onnx` file of a converted folder with its interface.
fn list_graphs(args: &InspectArgs) -> Result<()> {
    let dir = &args.model;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
    files.sort();
    if files.is_empty() {
        anyhow::bail!("{} holds no .onnx graphs", dir.display());
    }
    let mut graphs = Vec::new();
    for path in &files {
        let model = edgefreeze_graph::load_model(path)?;
        let names = |v: &[edgefreeze_graph::ValueInfo]| v.iter().map(|v| v.name.clone()).collect::<Vec<_>>();
        graphs.push(GraphSummary {
            file: path.file_name().unwrap_or_default().to_string_lossy().into_owned(),
            nodes: model.graph.nodes.len(),
            inputs: names(&model.graph.inputs),
            outputs: names(&model.graph.outputs),
            kept_for_backward: kept_for_backward(&model),
        });
    }
    // The state tensors the folder's manifests list, to tell them from the other inputs.
    let mut state = std::collections::HashSet::new();
    for manifest in [edgefreeze_autodiff::artifacts::files::MANIFEST, edgefreeze_rewrite::split::files::MANIFEST] {
        let path = dir.join(manifest);
        if let Ok(bytes) = std::fs::read(&path) {
            let json: serde_json::Value =
                serde_json::from_slice(&bytes).with_context(|| format!("reading {}", path.display()))?;
            for entry in json["state"].as_array().into_iter().flatten() {
                state.extend(entry["name"].as_str().map(String::from));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &graphs)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{}: {} graphs", dir.display(), graphs.len())?;
    for g in &graphs {
        // State makes input lists long: name the other inputs, count the state.
        let (state, other): (Vec<&String>, Vec<&String>) = g.inputs.iter().partition(|i| state.contains(*i));
        let other: Vec<&str> = other.iter().map(|s| s.as_str()).collect();
        let (updated, results): (Vec<&String>, Vec<&String>) =
            g.outputs.iter().partition(|o| o.starts_with("updated.") || o.starts_with("grad."));
        let results: Vec<&str> = results.iter().map(|s| s.as_str()).collect();
        writeln!(
            out,
            "{:<22} {:>6} nodes  in: {} + {} state  out: {} + {} updated/gradients",
            g.file,
            g.nodes,
            other.join(", "),
            state.len(),
            results.join(", "),
            updated.len()
        )?;
        if let Some(k) = &g.kept_for_backward {
            let unsized_note =
                if k.not_sized > 0 { format!(" ({} of unknown size not counted)", k.not_sized) } else { String::new() };
            writeln!(
                out,
                "{:<22} keeps {} forward values for the backward, {} per sample{unsized_note}",
                "",
                k.values,
                human_bytes(k.bytes_per_sample)
            )?;
        }
    }
    Ok(())
}
