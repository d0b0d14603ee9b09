//! Checkpoints: the whole training state (parameters, optimizer state, BatchNorm
//! statistics, frozen parameters) after an epoch, in safetensors, with what the run needs
//! to continue exactly in its metadata. Written atomically (temporary file, fsync,
//! rename); a run keeps every checkpoint it wrote.

use crate::error::{Result, TrainError, io};
use edgefreeze_engine::Value;
use ndarray::{ArrayD, IxDyn};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Format identifier stored in every checkpoint.
pub const FORMAT: &str = "edgefreeze-checkpoint/1";
const METADATA_KEY: &str = "edgefreeze";

/// Where a run keeps its checkpoints.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// The file of the checkpoint after `epoch` (0 is the initial state).
pub fn checkpoint_path(run_dir: &Path, epoch: usize) -> PathBuf {
    checkpoint_dir(run_dir).join(format!("epoch-{epoch:04}.safetensors"))
}

/// What a checkpoint says about where training stood.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointInfo {
    /// [`FORMAT`].
    pub format: String,
    /// Epochs completed.
    pub epoch: usize,
    /// Updates completed.
    pub step: u64,
    /// Test accuracy measured after this epoch, if evaluated.
    pub test_accuracy: Option<f64>,
    /// The state of the run's controller (freezing depth, histories...), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<serde_json::Value>,
}

/// A checkpoint in memory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Where training stood.
    pub info: CheckpointInfo,
    /// State tensors by name.
    pub state: Vec<(String, Value)>,
}

impl Checkpoint {
    /// Looks up a state tensor.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.state.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Writes the checkpoint atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        }
        let mut buffers: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, value) in &self.state {
            let (dtype, bytes) = match value {
                Value::F32(a) => (safetensors::Dtype::F32, a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                Value::F64(a) => (safetensors::Dtype::F64, a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                Value::I64(a) => (safetensors::Dtype::I64, a.iter().flat_map(|x| x.to_le_bytes()).collect()),
                Value::Bool(a) => (safetensors::Dtype::BOOL, a.iter().map(|&b| b as u8).collect()),
            };
            buffers.push((name.clone(), dtype, value.shape().to_vec(), bytes));
        }
        let bad =
            |e: safetensors::SafeTensorError| TrainError::Checkpoint { path: path.into(), message: e.to_string() };
        let mut views = Vec::new();
        for (name, dtype, shape, bytes) in &buffers {
            views.push((
                name.as_str(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).map_err(bad)?,
            ));
        }
        let info = serde_json::to_string(&self.info).expect("checkpoint info serialises");
        let metadata = Some(HashMap::from([(METADATA_KEY.to_string(), info)]));
        let bytes = safetensors::tensor::serialize(views, metadata).map_err(bad)?;
        edgefreeze_graph::save::write_atomically(path, &bytes)?;
        Ok(())
    }

    /// Reads a checkpoint; errors name the file.
    pub fn read(path: &Path) -> Result<Checkpoint> {
        let bytes = std::fs::read(path).map_err(io("read", path))?;
        let bad = |message: String| TrainError::Checkpoint { path: path.into(), message };
        let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors checkpoint: {e}")))?;
        let info_text = metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get(METADATA_KEY))
            .ok_or_else(|| bad("no edgefreeze metadata: not a checkpoint written by edgefreeze train".into()))?;
        let info: CheckpointInfo =
            serde_json::from_str(info_text).map_err(|e| bad(format!("damaged checkpoint metadata: {e}")))?;
        if info.format != FORMAT {
            return Err(bad(format!("format {:?}, expected {FORMAT:?}", info.format)));
        }
        let state = parse_tensors(&bytes, path)?;
        Ok(Checkpoint { info, state })
    }
}

/// Reads every tensor of a safetensors file (a checkpoint or a converted
/// `state.safetensors`), sorted by name.
pub fn read_tensors(path: &Path) -> Result<Vec<(String, Value)>> {
    let bytes = std::fs::read(path).map_err(io("read", path))?;
    parse_tensors(&bytes, path)
}

fn parse_tensors(bytes: &[u8], path: &Path) -> Result<Vec<(String, Value)>> {
    let bad = |message: String| TrainError::Checkpoint { path: path.into(), message };
    let tensors = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut names: Vec<String> = tensors.names().into_iter().map(String::from).collect();
    names.sort();
    let mut state = Vec::new();
    for name in names {
        let view = tensors.tensor(&name).map_err(|e| bad(format!("tensor {name:?}: {e}")))?;
        state.push((name.clone(), value_of(&view).map_err(|m| bad(format!("tensor {name:?}: {m}")))?));
    }
    Ok(state)
}

fn value_of(view: &safetensors::tensor::TensorView<'_>) -> std::result::Result<Value, String> {
    let shape = IxDyn(view.shape());
    let data = view.data();
    fn array<T>(shape: &IxDyn, v: Vec<T>) -> std::result::Result<ArrayD<T>, String> {
        ArrayD::from_shape_vec(shape.clone(), v).map_err(|e| e.to_string())
    }
    Ok(match view.dtype() {
        safetensors::Dtype::F32 => Value::F32(array(
            &shape,
            data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        )?),
        safetensors::Dtype::F64 => Value::F64(array(
            &shape,
            data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        )?),
        safetensors::Dtype::I64 => Value::I64(array(
            &shape,
            data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
        )?),
        safetensors::Dtype::BOOL => Value::Bool(
            ArrayD::from_shape_vec(shape, data.iter().map(|&b| b != 0).collect()).map_err(|e| e.to_string())?,
        ),
        other => return Err(format!("unsupported element type {other:?}")),
    })
}

/// The checkpoints of a run, sorted by epoch.
pub fn list_checkpoints(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let dir = checkpoint_dir(run_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("list", &dir)(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(io("list", &dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some(epoch) = name.strip_prefix("epoch-").and_then(|s| s.strip_suffix(".safetensors"))
            && let Ok(epoch) = epoch.parse::<usize>()
        {
            found.push((epoch, path));
        }
    }
    found.sort();
    Ok(found)
}
