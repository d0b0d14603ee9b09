//! `export`: an inference model carrying a checkpoint's trained weights.

use crate::checkpoint::Checkpoint;
use crate::error::{Result, TrainError};
use crate::run::GRAPHS_DIR;
use crate::tensors::tensor_from_value;
use edgefreeze_autodiff::artifacts::{Role, files};
use std::path::{Path, PathBuf};

/// What `export` wrote.
#[derive(Debug, Clone)]
pub struct ExportSummary {
    /// The model written.
    pub path: PathBuf,
    /// Initializers replaced by trained values.
    pub replaced: usize,
    /// The epoch of the checkpoint.
    pub epoch: usize,
}

/// The run directory a checkpoint belongs to (`<run>/checkpoints/<file>`).
pub fn run_dir_of(checkpoint: &Path) -> Result<PathBuf> {
    let run = checkpoint.parent().and_then(Path::parent).ok_or_else(|| {
        TrainError::Config(format!("{} is not inside a run's checkpoints folder", checkpoint.display()))
    })?;
    Ok(if run.as_os_str().is_empty() { PathBuf::from(".") } else { run.to_path_buf() })
}

/// Writes the run's inference model with every parameter and statistic the checkpoint
/// holds (atomically). Each initializer of the model that the training state covers must
/// be in the checkpoint with the same shape.
pub fn export(checkpoint_path: &Path, out: &Path) -> Result<ExportSummary> {
    let checkpoint = Checkpoint::read(checkpoint_path)?;
    let graphs = run_dir_of(checkpoint_path)?.join(GRAPHS_DIR);
    let manifest = crate::run::read_manifest(&graphs)?;
    let mut model = edgefreeze_graph::load_model(graphs.join(files::FORWARD))?;
    let mut replaced = 0;
    for entry in manifest.state.iter().filter(|e| e.role != Role::Optimizer) {
        let value = checkpoint.get(&entry.name).ok_or_else(|| TrainError::Checkpoint {
            path: checkpoint_path.into(),
            message: format!("has no tensor {:?} ({}), which the model needs", entry.name, entry.role),
        })?;
        let slot = model.graph.initializers.get_mut(&entry.name).ok_or_else(|| TrainError::Checkpoint {
            path: graphs.join(files::FORWARD),
            message: format!("has no initializer {:?} for the checkpoint's {}", entry.name, entry.role),
        })?;
        if slot.dims() != value.shape() {
            return Err(TrainError::Checkpoint {
                path: checkpoint_path.into(),
                message: format!(
                    "tensor {:?} has shape {:?} but the model's initializer has {:?}",
                    entry.name,
                    value.shape(),
                    slot.dims()
                ),
            });
        }
        *slot = tensor_from_value(&entry.name, value)?;
        replaced += 1;
    }
    edgefreeze_graph::save_model(&model, out, &edgefreeze_graph::SaveOptions::default())?;
    Ok(ExportSummary { path: out.into(), replaced, epoch: checkpoint.info.epoch })
}
