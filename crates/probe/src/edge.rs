//! One edge server's step time at one cut: a session of its own (the split the device
//! would train, under a throwaway run id), real micro-batches (the device forward's
//! activations at that cut) sent one at a time, the edge's own timestamps read from each
//! reply, and the session closed without an update.

use crate::error::{ProbeError, Result};
use edgefreeze_device::link::EdgeSession;
use edgefreeze_device::pipeline::{Link, Tag, Upload, check_reply, now_us};
use edgefreeze_device::split::{SplitSettings, split_request};
use edgefreeze_engine::Value;
use edgefreeze_plan::{Affine, EdgeCutTimes};
use edgefreeze_wire::auth::Credentials;
use edgefreeze_wire::pb;

/// What a probe session sends.
pub struct EdgeProbe<'a> {
    /// The server.
    pub address: &'a str,
    /// The device's credentials.
    pub credentials: &'a Credentials,
    /// The inference model's bytes.
    pub model: &'a [u8],
    /// Loss and optimizer, as `edgefreeze train` spells them.
    pub loss: &'a str,
    /// The optimizer.
    pub optimizer: &'a str,
    /// The run id of the probe's session (unique: an edge that keeps checkpoints refuses
    /// a new run under a name it holds).
    pub run_id: String,
    /// Seconds of edge update per byte of session state (the probe does not update).
    pub apply_s_per_byte: f64,
    /// A server that does not answer a call or a micro-batch within this long is lost.
    pub timeout: std::time::Duration,
}

/// What the edge said at one cut.
#[derive(Debug, Clone, Copy)]
pub struct EdgeCut {
    /// The times.
    pub times: EdgeCutTimes,
    /// Bytes of state the session holds.
    pub state_bytes: u64,
}

/// Times the edge step at `cut` on `batches` (activation and labels per size), `reps`
/// times each size after one untimed micro-batch.
pub fn time_cut(
    probe: &EdgeProbe,
    cut: usize,
    frozen: bool,
    batches: &[(usize, Value, Value)],
    reps: usize,
) -> Result<EdgeCut> {
    let fail = |e: edgefreeze_device::DeviceError| ProbeError::Edge {
        address: probe.address.to_string(),
        message: format!("probing cut {cut}: {e}"),
    };
    let reps = reps.max(1);
    let count = 1 + reps * batches.len();
    let split = SplitSettings { cut, micro_batches: count, sequential: true, recompute: false, freeze_device: frozen };
    let request = pb::OpenSessionRequest {
        header: Some(pb::Header::default()),
        run_id: probe.run_id.clone(),
        split: Some(split_request(probe.model.to_vec(), &split, probe.loss, probe.optimizer).map_err(fail)?),
        resume_step: None,
    };
    let session = EdgeSession::open(probe.address, probe.credentials.clone(), request, probe.timeout).map_err(fail)?;
    let header = session.header();
    let state_bytes = session.opened.state_bytes;
    let result = (|| -> edgefreeze_device::Result<Vec<Vec<f64>>> {
        let mut link = session.stream();
        let mut times = vec![Vec::new(); batches.len()];
        // Micro-batch 0 warms the edge's graphs up; then each size in turn.
        let order = std::iter::once(0).chain((0..reps).flat_map(|_| 0..batches.len()));
        for (i, which) in order.enumerate() {
            let (_, activation, labels) = &batches[which];
            let tag = Tag {
                session: header.session_id.clone(),
                step: header.step,
                micro_batch: i as u32,
                version: header.model_version,
            };
            link.send(Upload {
                tag: tag.clone(),
                activation: activation.clone(),
                labels: labels.clone(),
                dropout_seed: Some(i as i64),
                sent_us: now_us(),
            })?;
            let reply = link.recv()?;
            check_reply(&tag, &reply.tag)?;
            if i > 0 {
                // One micro-batch in flight, so no queueing: from its arrival to its reply.
                times[which].push((reply.edge.sent_us - reply.edge.received_us).max(0) as f64 * 1e-6);
            }
        }
        Ok(times)
    })();
    // Close whatever happened: a probe leaves no session behind.
    let closed = session.close(&header);
    let times = result.map_err(fail)?;
    closed.map_err(fail)?;
    let points: Vec<(f64, f64)> = batches
        .iter()
        .zip(times)
        .map(|((n, _, _), mut t)| {
            t.sort_by(f64::total_cmp);
            (*n as f64, t[t.len() / 2])
        })
        .collect();
    let step = Affine::fit(&points).ok_or_else(|| ProbeError::Edge {
        address: probe.address.to_string(),
        message: format!("cut {cut}: no usable edge times in {points:?}"),
    })?;
    Ok(EdgeCut { times: EdgeCutTimes { cut, step, apply_s: state_bytes as f64 * probe.apply_s_per_byte }, state_bytes })
}
