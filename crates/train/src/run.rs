//! A run directory: what a training run needs to continue, export and be compared.
//!
//! ```text
//! <run>/run.json                 the recipe (RunSpec)
//! <run>/graphs/                  the converted graphs, initial state and manifest
//! <run>/checkpoints/epoch-NNNN.safetensors   state after each epoch (0: initial)
//! <run>/metrics.jsonl            step and epoch records
//! ```

use crate::error::{Result, TrainError, io};
use crate::schedule::Schedule;
use edgefreeze_autodiff::TrainingSpec;
use edgefreeze_autodiff::artifacts::{Manifest, convert, files, parse_loss, parse_optimizer};
use edgefreeze_data::Augmentation;
use std::path::{Path, PathBuf};

/// Format identifier of `run.json`.
pub const RUN_FORMAT: &str = "edgefreeze-run/1";
/// The recipe file.
pub const RUN_FILE: &str = "run.json";
/// The folder of converted graphs.
pub const GRAPHS_DIR: &str = "graphs";
/// The metrics file.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// How to train: everything that decides the numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recipe {
    /// Epochs to train.
    pub epochs: usize,
    /// Training batch size (the last batch of an epoch may be smaller).
    pub batch: usize,
    /// Learning-rate schedule.
    pub schedule: Schedule,
    /// Seed of the data order, augmentation and dropout.
    pub seed: u64,
    /// Augmentation of training images: `crop:P`, `flip`, comma-separated; `None` for none.
    pub augment: Option<String>,
    /// Use only N training samples (a fixed random subset drawn from the seed).
    pub train_limit: Option<usize>,
    /// Evaluate on only N test samples (a fixed random subset drawn from the seed).
    pub test_limit: Option<usize>,
    /// Write a step record every N updates.
    pub log_every: u64,
}

impl Recipe {
    /// The augmentation the recipe names.
    pub fn augmentation(&self) -> Result<Augmentation> {
        parse_augmentation(self.augment.as_deref().unwrap_or(""))
    }
}

/// Parses `crop:P`, `flip` or both, comma-separated (empty or `none`: no augmentation).
pub fn parse_augmentation(text: &str) -> Result<Augmentation> {
    let mut aug = Augmentation::default();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "none") {
        match part.split_once(':') {
            Some(("crop", p)) => {
                aug.crop_padding = p
                    .parse()
                    .map_err(|_| TrainError::Config(format!("augmentation {part:?}: padding must be a number")))?
            }
            None if part == "flip" => aug.horizontal_flip = true,
            _ => return Err(TrainError::Config(format!("unknown augmentation {part:?}: use crop:P and/or flip"))),
        }
    }
    Ok(aug)
}

/// The run file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSpec {
    /// [`RUN_FORMAT`].
    pub format: String,
    /// The model as given (an ONNX file or a converted folder).
    pub model: String,
    /// The dataset name.
    pub data: String,
    /// The recipe.
    pub recipe: Recipe,
}

/// Where the model comes from.
#[derive(Debug, Clone)]
pub enum ModelSource {
    /// An inference ONNX model, converted into the run's `graphs/`.
    Onnx {
        /// The model file.
        path: PathBuf,
        /// Loss, as `parse_loss` reads it.
        loss: String,
        /// Optimizer, as `parse_optimizer` reads it (its lr is the schedule's base).
        optimizer: String,
        /// Leading layers to freeze.
        freeze: usize,
    },
    /// A folder written by `edgefreeze convert`, copied into the run's `graphs/`.
    Converted(PathBuf),
}

impl ModelSource {
    /// A path that is a folder with a manifest is a converted set; anything else a model.
    pub fn from_path(path: &Path, loss: &str, optimizer: &str, freeze: usize) -> ModelSource {
        if path.join(files::MANIFEST).is_file() {
            ModelSource::Converted(path.into())
        } else {
            ModelSource::Onnx { path: path.into(), loss: loss.into(), optimizer: optimizer.into(), freeze }
        }
    }

    /// The learning rate the optimizer text or manifest gives, used when none is set.
    pub fn default_learning_rate(&self) -> Result<f64> {
        match self {
            ModelSource::Onnx { optimizer, .. } => Ok(parse_optimizer(optimizer)?.1),
            ModelSource::Converted(dir) => Ok(read_manifest(dir)?.learning_rate),
        }
    }
}

/// The rows of the embedding table that token input `input` indexes (a `Gather` of an
/// initializer by it): the vocabulary size the model was built for.
pub(crate) fn embedding_rows(model: &edgefreeze_graph::Model, input: &str) -> Option<usize> {
    model
        .graph
        .nodes
        .iter()
        .filter(|n| n.op_type == "Gather" && n.inputs.get(1).is_some_and(|i| i == input))
        .find_map(|n| model.graph.initializers.get(&n.inputs[0]).and_then(|t| t.dims().first().copied()))
}

/// The number of layers of a converted folder's model, from its manifest's analysis.
pub fn layer_count_of_graphs(graphs: &Path) -> Result<usize> {
    let manifest = read_manifest(graphs)?;
    manifest.analysis.get("layers").and_then(|l| l.as_array()).map(Vec::len).ok_or_else(|| TrainError::Checkpoint {
        path: graphs.join(files::MANIFEST),
        message: "has no layer analysis".into(),
    })
}

/// Reads `manifest.json` of a converted folder.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(files::MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
    serde_json::from_str(&text)
        .map_err(|e| TrainError::Checkpoint { path, message: format!("not an edgefreeze manifest: {e}") })
}

/// Creates a run directory: refuses one that already holds a run (use `--resume`), and
/// writes the converted graphs and `run.json`.
pub fn create_run(dir: &Path, source: &ModelSource, data: &str, recipe: &Recipe) -> Result<RunSpec> {
    let run_file = dir.join(RUN_FILE);
    if run_file.exists() {
        return Err(TrainError::Config(format!(
            "{} already holds a run: continue it with --resume {}, or choose another --out",
            dir.display(),
            dir.display()
        )));
    }
    let graphs = dir.join(GRAPHS_DIR);
    std::fs::create_dir_all(&graphs).map_err(io("create", &graphs))?;
    let model = match source {
        ModelSource::Onnx { path, loss, optimizer, freeze } => {
            let loss_fn = parse_loss(loss)?;
            let (opt, lr) = parse_optimizer(optimizer)?;
            let imported = edgefreeze_graph::import(path)?;
            let spec = TrainingSpec { loss: loss_fn, optimizer: opt, frozen: Vec::new() };
            let source = path.display().to_string();
            convert(&imported, &source, &spec, *freeze, (loss, optimizer, lr))?.write(&graphs)?;
            source
        }
        ModelSource::Converted(from) => {
            read_manifest(from)?;
            for file in [files::FORWARD, files::TRAIN_STEP, files::EVAL, files::GRADIENT, files::STATE, files::MANIFEST]
            {
                let src = from.join(file);
                let bytes = std::fs::read(&src).map_err(io("read", &src))?;
                edgefreeze_graph::save::write_atomically(&graphs.join(file), &bytes)?;
            }
            from.display().to_string()
        }
    };
    let spec = RunSpec { format: RUN_FORMAT.into(), model, data: data.into(), recipe: recipe.clone() };
    write_json(&run_file, &spec)?;
    Ok(spec)
}

/// Reads `run.json` of a run directory.
pub fn open_run(dir: &Path) -> Result<RunSpec> {
    let path = dir.join(RUN_FILE);
    let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
    let spec: RunSpec = serde_json::from_str(&text)
        .map_err(|e| TrainError::Checkpoint { path: path.clone(), message: format!("not an edgefreeze run: {e}") })?;
    if spec.format != RUN_FORMAT {
        return Err(TrainError::Checkpoint {
            path,
            message: format!("format {:?}, expected {RUN_FORMAT:?}", spec.format),
        });
    }
    Ok(spec)
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).expect("run files serialise");
    edgefreeze_graph::save::write_atomically(path, &bytes)?;
    Ok(())
}
