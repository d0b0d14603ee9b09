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
use edgefreeze_autodiff::artifacts::{Artifacts, Manifest, convert, files, parse_loss, parse_optimizer};
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
/// initializer by it, or by the tokens reshaped or cast first, as GPT-2's
/// `input_ids.view(-1, length)` does): the vocabulary size the model was built for.
pub(crate) fn embedding_rows(model: &edgefreeze_graph::Model, input: &str) -> Option<usize> {
    const SAME_TOKENS: [&str; 6] = ["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast"];
    let nodes = &model.graph.nodes;
    let mut tokens: Vec<&str> = vec![input];
    let mut k = 0;
    while k < tokens.len() {
        let value = tokens[k];
        for n in nodes.iter().filter(|n| n.inputs.first().is_some_and(|i| i == value)) {
            if SAME_TOKENS.contains(&n.op_type.as_str()) && !tokens.contains(&n.outputs[0].as_str()) {
                tokens.push(&n.outputs[0]);
            }
        }
        k += 1;
    }
    nodes
        .iter()
        .filter(|n| n.op_type == "Gather" && n.inputs.get(1).is_some_and(|i| tokens.contains(&i.as_str())))
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

/// A new run built in memory and not yet written: its recipe and its graphs, so that
/// everything that can go wrong is found ([`crate::preflight`]) before a file exists.
pub struct NewRun {
    spec: RunSpec,
    graphs: Graphs,
}

/// The graphs of a [`NewRun`].
enum Graphs {
    /// Converted from an inference model.
    Converted(Box<Artifacts>),
    /// The files of a converted folder, read into memory, with that folder (which holds
    /// any external data of `model.onnx`).
    Copied { from: PathBuf, manifest: Box<Manifest>, files: Vec<(&'static str, Vec<u8>)> },
}

/// The files a converted folder holds, all copied into a run's `graphs/`.
const CONVERTED_FILES: [&str; 6] =
    [files::FORWARD, files::TRAIN_STEP, files::EVAL, files::GRADIENT, files::STATE, files::MANIFEST];

/// Builds a new run in memory: converts the model (or reads a converted folder). Writes
/// nothing.
pub fn prepare_run(source: &ModelSource, data: &str, recipe: &Recipe) -> Result<NewRun> {
    let (model, graphs) = match source {
        ModelSource::Onnx { path, loss, optimizer, freeze } => {
            let loss_fn = parse_loss(loss)?;
            let (opt, lr) = parse_optimizer(optimizer)?;
            let mut imported = edgefreeze_graph::import(path)?;
            // A text model's mask (and token types, positions) beside its token ids is a
            // function of the ids and the dataset's padding: computed in the graph, so
            // the model takes the ids alone, as `train` feeds them.
            if let Some(pad) = edgefreeze_data::named::padding_id(data)
                && let Some((derived, _)) =
                    edgefreeze_graph::text_inputs::derive_from_token_ids(&imported, pad).map_err(|e| e.in_file(path))?
            {
                imported = derived;
            }
            let spec = TrainingSpec { loss: loss_fn, optimizer: opt, frozen: Vec::new() };
            let source = path.display().to_string();
            let artifacts = convert(&imported, &source, &spec, *freeze, (loss, optimizer, lr))?;
            (source, Graphs::Converted(Box::new(artifacts)))
        }
        ModelSource::Converted(from) => {
            let manifest = Box::new(read_manifest(from)?);
            let mut copied = Vec::new();
            for file in CONVERTED_FILES {
                let src = from.join(file);
                copied.push((file, std::fs::read(&src).map_err(io("read", &src))?));
            }
            (from.display().to_string(), Graphs::Copied { from: from.clone(), manifest, files: copied })
        }
    };
    let spec = RunSpec { format: RUN_FORMAT.into(), model, data: data.into(), recipe: recipe.clone() };
    Ok(NewRun { spec, graphs })
}

impl NewRun {
    /// The run file it will write.
    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// The manifest of its graphs.
    pub fn manifest(&self) -> &Manifest {
        match &self.graphs {
            Graphs::Converted(a) => &a.manifest,
            Graphs::Copied { manifest, .. } => manifest,
        }
    }

    /// The inference model its graphs were built from.
    pub fn forward(&self) -> Result<std::borrow::Cow<'_, edgefreeze_graph::Model>> {
        match &self.graphs {
            Graphs::Converted(a) => Ok(std::borrow::Cow::Borrowed(&a.forward)),
            Graphs::Copied { from, files, .. } => {
                let path = from.join(files::FORWARD);
                let (_, bytes) = files
                    .iter()
                    .find(|(f, _)| *f == files::FORWARD)
                    .ok_or_else(|| TrainError::Checkpoint { path: path.clone(), message: "was not read".into() })?;
                let model = edgefreeze_graph::parse_model(bytes, Some(from)).map_err(|e| e.in_file(path))?;
                Ok(std::borrow::Cow::Owned(model))
            }
        }
    }

    /// Writes the graphs and `run.json` into `dir` (created if missing). Refuses a folder
    /// that holds a started run (one with a checkpoint: use `--resume`); a run that never
    /// wrote its first checkpoint is replaced. Returns what the folder held before.
    pub fn write(&self, dir: &Path) -> Result<RunFolder> {
        let before = free_run_folder(dir)?;
        let graphs = dir.join(GRAPHS_DIR);
        std::fs::create_dir_all(&graphs).map_err(io("create", &graphs))?;
        match &self.graphs {
            Graphs::Converted(artifacts) => artifacts.write(&graphs)?,
            Graphs::Copied { files, .. } => {
                for (file, bytes) in files {
                    edgefreeze_graph::save::write_atomically(&graphs.join(file), bytes)?;
                }
            }
        }
        write_json(&dir.join(RUN_FILE), &self.spec)?;
        Ok(before)
    }
}

/// What a folder holds, for starting a new run in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunFolder {
    /// Nothing of a run: missing, empty, or other files only.
    Free,
    /// A run that never wrote a checkpoint (it failed before its first one): nothing to
    /// protect, a new run may replace it.
    Unstarted,
    /// A run with at least one checkpoint: only `--resume` continues it.
    Started,
}

/// What `dir` holds, refusing a started run (it says how to continue it).
pub fn free_run_folder(dir: &Path) -> Result<RunFolder> {
    match run_folder(dir)? {
        RunFolder::Started => Err(TrainError::Config(format!(
            "{} already holds a run: continue it with --resume {}, or choose another --out",
            dir.display(),
            dir.display()
        ))),
        other => Ok(other),
    }
}

/// What `dir` holds.
pub fn run_folder(dir: &Path) -> Result<RunFolder> {
    if !crate::checkpoint::list_checkpoints(dir)?.is_empty() {
        Ok(RunFolder::Started)
    } else if dir.join(RUN_FILE).exists() {
        Ok(RunFolder::Unstarted)
    } else {
        Ok(RunFolder::Free)
    }
}

/// Creates a run directory: refuses one that already holds a started run (use
/// `--resume`), and writes the converted graphs and `run.json`. This checks neither the
/// data nor the engine: [`crate::preflight`] does, before anything is written.
pub fn create_run(dir: &Path, source: &ModelSource, data: &str, recipe: &Recipe) -> Result<RunSpec> {
    let run = prepare_run(source, data, recipe)?;
    run.write(dir)?;
    Ok(run.spec)
}

/// Checks that `dir` can be created (if missing) and written, leaving nothing behind: a
/// probe file is made and removed in `dir`, or in its nearest existing ancestor.
pub fn check_writable(dir: &Path) -> Result<()> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p,
            _ => {
                existing = Path::new(".");
                break;
            }
        }
    }
    if !existing.is_dir() {
        return Err(TrainError::Config(format!(
            "cannot make the run folder {}: {} is not a folder",
            dir.display(),
            existing.display()
        )));
    }
    let probe = existing.join(format!(".edgefreeze-write-test-{}", std::process::id()));
    std::fs::OpenOptions::new().write(true).create_new(true).open(&probe).map_err(io("write in", existing))?;
    std::fs::remove_file(&probe).map_err(io("remove", &probe))?;
    Ok(())
}

/// The folder that holds the default run folders of `model` on `data`:
/// `<root>/<model file stem>-<data>`, where a dataset in a folder (`cifar10:<dir>`) is
/// named by its kind and the folder's last component (`cifar10-<name>`), and characters
/// other than letters, digits and `-` become `_`.
pub fn runs_parent(root: &Path, model: &Path, data: &str) -> PathBuf {
    let stem = model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
    let data = match data.split_once(':') {
        Some((kind, dir)) => match Path::new(dir).file_name() {
            Some(name) => format!("{kind}-{}", name.to_string_lossy()),
            None => kind.to_string(),
        },
        None => data.to_string(),
    };
    let data: String = data.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    root.join(format!("{stem}-{data}"))
}

/// The numbered folders (`0001`, `0002`...) in `parent`, by number; none when `parent` is missing.
pub fn numbered_folders(parent: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = match std::fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list", parent)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(io("list", parent))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_digit())
            && path.is_dir()
            && let Ok(n) = name.parse::<u64>()
        {
            found.push((n, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The next numbered run folder in `parent` (one past the highest number there), not
/// created yet.
pub fn next_numbered(parent: &Path) -> Result<PathBuf> {
    let next = numbered_folders(parent)?.last().map_or(1, |(n, _)| n + 1);
    Ok(numbered(parent, next))
}

fn numbered(parent: &Path, n: u64) -> PathBuf {
    parent.join(format!("{n:04}"))
}

/// Creates the numbered folder `wanted` (from [`next_numbered`]), or, when another run
/// took it meanwhile, the next free number: two runs started at once never share one.
pub fn claim_numbered(wanted: &Path) -> Result<PathBuf> {
    let parent = wanted.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
    let first = wanted.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<u64>().ok()).unwrap_or(1);
    // Runs started at the same moment take the next numbers; a thousand at once is not a
    // race but a loop gone wrong.
    for n in first..first + 1000 {
        let dir = numbered(parent, n);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("create", &dir)(e)),
        }
    }
    Err(TrainError::Config(format!("no free numbered run folder in {} from {first:04} on", parent.display())))
}

/// The run `--resume PATH` means: `PATH` itself when it holds a run, else the latest
/// (highest-numbered) run among its numbered folders, as in `runs/<model>-<data>`.
pub fn resolve_run(path: &Path) -> Result<PathBuf> {
    if path.join(RUN_FILE).is_file() {
        return Ok(path.into());
    }
    if !path.is_dir() {
        return Err(TrainError::Config(format!("no run to resume at {}: no such folder", path.display())));
    }
    numbered_folders(path)?.into_iter().rev().map(|(_, dir)| dir).find(|dir| dir.join(RUN_FILE).is_file()).ok_or_else(
        || {
            TrainError::Config(format!(
                "no run to resume in {}: neither it nor a numbered folder in it holds a {RUN_FILE}",
                path.display()
            ))
        },
    )
}

/// The run `--resume` without a folder means: the one created last (newest `run.json`)
/// among the runs in `root` (`runs/`): its default run folders `<model>-<data>/NNNN`, and
/// runs directly in it.
pub fn latest_run(root: &Path) -> Result<PathBuf> {
    let mut runs = Vec::new();
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e.collect::<std::io::Result<Vec<_>>>().map_err(io("list", root))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io("list", root)(e)),
    };
    for entry in entries {
        let dir = entry.path();
        if dir.join(RUN_FILE).is_file() {
            runs.push(dir.clone());
        }
        if dir.is_dir() {
            runs.extend(numbered_folders(&dir)?.into_iter().map(|(_, d)| d).filter(|d| d.join(RUN_FILE).is_file()));
        }
    }
    let created = |dir: &PathBuf| std::fs::metadata(dir.join(RUN_FILE)).and_then(|m| m.modified()).ok();
    runs.into_iter().max_by_key(|d| (created(d), d.clone())).ok_or_else(|| {
        TrainError::Config(format!(
            "no run to resume in {}: start one with --model and --data, or give --resume RUN_DIR",
            root.display()
        ))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_run_folders_are_named_by_model_and_dataset() {
        let root = Path::new("runs");
        assert_eq!(
            runs_parent(root, Path::new("models/lenet5.onnx"), "fashion-mnist"),
            root.join("lenet5-fashion-mnist")
        );
        assert_eq!(
            runs_parent(root, Path::new("m.onnx"), "cifar10:/data/cifar-10 bin/"),
            root.join("m-cifar10-cifar-10_bin")
        );
        assert_eq!(runs_parent(root, Path::new("m.onnx"), "idx:/"), root.join("m-idx"));
    }

    #[test]
    fn numbered_folders_are_claimed_in_turn_and_the_latest_run_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("mlp-mnist");
        assert_eq!(next_numbered(&parent).unwrap(), parent.join("0001"));
        let first = claim_numbered(&parent.join("0001")).unwrap();
        // Another run took 0002 between the announcement and the claim: 0003 is used.
        std::fs::create_dir(parent.join("0002")).unwrap();
        assert_eq!(claim_numbered(&parent.join("0002")).unwrap(), parent.join("0003"));
        std::fs::create_dir(parent.join("notes")).unwrap();
        let numbers: Vec<u64> = numbered_folders(&parent).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(next_numbered(&parent).unwrap(), parent.join("0004"));

        // Only folders holding a run count; the highest-numbered one is the latest.
        assert!(resolve_run(&parent).unwrap_err().to_string().contains("neither it nor a numbered folder"));
        std::fs::write(first.join(RUN_FILE), "{}").unwrap();
        std::fs::write(parent.join("0002").join(RUN_FILE), "{}").unwrap();
        assert_eq!(resolve_run(&parent).unwrap(), parent.join("0002"));
        assert_eq!(resolve_run(&first).unwrap(), first);
        assert_eq!(latest_run(tmp.path()).unwrap(), parent.join("0002"));
        assert!(resolve_run(&tmp.path().join("nope")).unwrap_err().to_string().contains("no such folder"));
    }

    #[test]
    fn only_a_run_with_a_checkpoint_is_protected() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        assert_eq!(run_folder(&dir).unwrap(), RunFolder::Free);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(RUN_FILE), "{}").unwrap();
        assert_eq!(free_run_folder(&dir).unwrap(), RunFolder::Unstarted);
        let checkpoint = crate::checkpoint::checkpoint_path(&dir, 0);
        std::fs::create_dir_all(checkpoint.parent().unwrap()).unwrap();
        std::fs::write(&checkpoint, b"").unwrap();
        assert_eq!(run_folder(&dir).unwrap(), RunFolder::Started);
        assert!(free_run_folder(&dir).unwrap_err().to_string().contains("already holds a run"));
    }

    #[test]
    fn writability_is_checked_without_leaving_anything() {
        let tmp = tempfile::tempdir().unwrap();
        check_writable(&tmp.path().join("a/b/run")).unwrap();
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let err = check_writable(&file.join("run")).unwrap_err().to_string();
        assert!(err.contains("is not a folder"), "{err}");
    }
}
