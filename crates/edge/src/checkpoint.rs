//! Per-run edge checkpoints on disk, so a device's `--resume` continues both sides at the
//! same step.
//!
//! A run's folder is `STATE_DIR/<device id>/<run id>/` (both identifiers are checked to be
//! safe folder names, and the device id is the authenticated one, so a device can only
//! reach its own runs). It holds `split.json` — a fingerprint of the split request the
//! run started with, so a resume with other graphs is refused — and one
//! `step-NNNNNNNNNN.safetensors` per checkpoint, written atomically in the trainer's
//! checkpoint format (the edge does not know epochs; its files record the step).

use edgefreeze_engine::Value;
use edgefreeze_train::checkpoint::{Checkpoint, CheckpointInfo, FORMAT};
use std::path::{Path, PathBuf};
use tonic::Status;

const SPLIT_FILE: &str = "split.json";
const SPLIT_FORMAT: &str = "edgefreeze-edge-run/1";

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct RunFile {
    format: String,
    /// FNV-1a of the encoded split request (model bytes, cut, loss, optimizer, micro-batches).
    split_fingerprint: String,
    cut_after_layer: u32,
    micro_batches: u32,
}

/// One run's checkpoint folder.
#[derive(Debug, Clone)]
pub(crate) struct RunStore {
    dir: PathBuf,
}

impl RunStore {
    /// Opens a run's folder: a new run must not exist yet; a resumed run must exist and
    /// have started with the same split request.
    pub fn open(
        state_dir: &Path,
        device_id: &str,
        run_id: &str,
        split: &edgefreeze_wire::pb::SplitRequest,
        resume: bool,
    ) -> Result<RunStore, Status> {
        let dir = state_dir.join(device_id).join(run_id);
        let store = RunStore { dir };
        let expected = RunFile {
            format: SPLIT_FORMAT.into(),
            split_fingerprint: format!("{:016x}", edgefreeze_wire::fingerprint(&prost::Message::encode_to_vec(split))),
            cut_after_layer: split.cut_after_layer,
            micro_batches: split.micro_batches,
        };
        let file = store.dir.join(SPLIT_FILE);
        let existing = match std::fs::read(&file) {
            Ok(bytes) => Some(
                serde_json::from_slice::<RunFile>(&bytes)
                    .map_err(|e| Status::internal(format!("{}: damaged: {e}", file.display())))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Status::internal(format!("{}: {e}", file.display()))),
        };
        match (existing, resume) {
            (Some(_), false) => Err(Status::failed_precondition(format!(
                "this edge already holds run {run_id:?} of device {device_id:?} (checkpoints at steps {:?}): resume \
                 it or choose another run id",
                store.steps()?
            ))),
            (None, true) => {
                Err(Status::failed_precondition(format!("this edge holds no run {run_id:?} of device {device_id:?}")))
            }
            (Some(found), true) if found != expected => Err(Status::failed_precondition(format!(
                "run {run_id:?} started with another split request (cut after layer {}, {} micro-batches, split \
                 fingerprint {}; now cut after layer {}, {} micro-batches, fingerprint {}): resume with the same model, \
                 cut, loss, optimizer and micro-batches",
                found.cut_after_layer,
                found.micro_batches,
                found.split_fingerprint,
                expected.cut_after_layer,
                expected.micro_batches,
                expected.split_fingerprint
            ))),
            (Some(_), true) => Ok(store),
            (None, false) => {
                std::fs::create_dir_all(&store.dir)
                    .map_err(|e| Status::internal(format!("{}: {e}", store.dir.display())))?;
                let json = serde_json::to_vec_pretty(&expected).map_err(|e| Status::internal(e.to_string()))?;
                edgefreeze_graph::save::write_atomically(&file, &json)
                    .map_err(|e| Status::internal(format!("{}: {e}", file.display())))?;
                Ok(store)
            }
        }
    }

    fn path(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:010}.safetensors"))
    }

    /// Steps with a checkpoint, ascending.
    pub fn steps(&self) -> Result<Vec<u64>, Status> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Status::internal(format!("{}: {e}", self.dir.display()))),
        };
        let mut steps: Vec<u64> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("step-")?.strip_suffix(".safetensors")?.parse().ok()
            })
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// Writes the state after `step` updates.
    pub fn write(&self, step: u64, state: &[(String, Value)]) -> Result<(), Status> {
        let checkpoint = Checkpoint {
            info: CheckpointInfo { format: FORMAT.into(), epoch: 0, step, test_accuracy: None, controller: None },
            state: state.to_vec(),
        };
        checkpoint.write(&self.path(step)).map_err(|e| Status::internal(format!("edge checkpoint: {e}")))
    }

    /// Reads the state after `step` updates.
    pub fn read(&self, step: u64) -> Result<Vec<(String, Value)>, Status> {
        let path = self.path(step);
        if !path.exists() {
            return Err(Status::failed_precondition(format!(
                "the device asked to resume at step {step}, but this edge's checkpoints of the run are at steps {:?}",
                self.steps()?
            )));
        }
        let checkpoint = Checkpoint::read(&path).map_err(|e| Status::internal(format!("edge checkpoint: {e}")))?;
        if checkpoint.info.step != step {
            return Err(Status::internal(format!(
                "{} records step {}, not {step}",
                path.display(),
                checkpoint.info.step
            )));
        }
        Ok(checkpoint.state)
    }
}
