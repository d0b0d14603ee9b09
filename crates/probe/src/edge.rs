//! One edge server's step time at one cut: a session of its own (the split the device
//! would train, under a throwaway run id), real micro-batches (the device forward's
//! activations at that cut) sent one at a time, the edge's own timestamps read from each
//! reply, one update (learning rate 0: the session is thrown away) whose compute time
//! the edge's answer gives, and the session closed.
//!
//! Then, in the same session, the **concurrent probe**: the device runs its own forward
//! and backward at that cut over and over on a thread of its own while more micro-batches
//! go to the edge, two in flight (so the edge has the next one while it replies), which is
//! what a pipelined step does. From the edge's timestamps (its compute start and end,
//! aligned to the device's clock as `edgefreeze_device::stages` does) and the device's,
//! each side's operations are set against the other side's busy intervals, and
//! [`edgefreeze_plan::fit_factor`] finds the overlap factor that explains their times.
//! On separate machines it comes out near 1; on shared cores it is the slowdown the
//! pipeline will see. The device's operations are also set against the times its link
//! carried a micro-batch (each activation's upload, at the probed uplink rate, from when
//! it was sent or the one before it had gone; each reply's arrival, at the downlink rate,
//! until it was in), and [`edgefreeze_plan::fit_factors`] fits both of its factors at
//! once: its network stack shares its cores.

use crate::device::{DeviceLoad, small_like};
use crate::error::{ProbeError, Result};
use edgefreeze_device::DeviceError;
use edgefreeze_device::link::{EdgeSession, tag_of};
use edgefreeze_device::pipeline::{DeviceSide, EdgeTimes, Exchange, Link, Tag, Upload, check_reply, now_us};
use edgefreeze_device::split::{SplitSettings, split_request};
use edgefreeze_engine::Value;
use edgefreeze_plan::overlap::union;
use edgefreeze_plan::{Affine, EdgeCutTimes, LinkTimes, Overlap, OverlapFit, TimedOp, fit_factor, fit_factors};
use edgefreeze_wire::auth::Credentials;
use edgefreeze_wire::pb;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Seconds of edge update per byte of session state, when given; `None`: the edge's
    /// compute time of one update of the probe's session (learning rate 0, no checkpoint).
    pub apply_s_per_byte: Option<f64>,
    /// A server that does not answer a call or a micro-batch within this long is lost.
    pub timeout: std::time::Duration,
    /// The link to the server as probed: the concurrent probe's transfer times.
    pub link: LinkTimes,
}

/// What the edge said at one cut.
#[derive(Debug, Clone, Copy)]
pub struct EdgeCut {
    /// The times.
    pub times: EdgeCutTimes,
    /// Bytes of state the session holds.
    pub state_bytes: u64,
    /// The concurrent probe's fits, when it ran.
    pub concurrent: Option<Concurrent>,
}

/// What the concurrent probe found at one cut.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Concurrent {
    /// Samples per micro-batch on both sides.
    pub samples: usize,
    /// The device's forwards and backwards against the edge's compute.
    pub device: OverlapFit,
    /// The device's forwards and backwards against its link's transfers (fitted with
    /// `device`).
    pub device_link: OverlapFit,
    /// The edge's steps against the device's compute.
    pub edge: OverlapFit,
    /// Seconds it took.
    pub seconds: f64,
}

/// Micro-batches the concurrent probe sends per timed repetition.
const CONCURRENT_PER_REP: usize = 2;

/// Times the edge step at `cut` on `batches` (activation and labels per size), `reps`
/// times each size after one untimed micro-batch; then, given the device's `load` at
/// this cut, the concurrent probe (module docs) on the batch of its size.
pub fn time_cut(
    probe: &EdgeProbe,
    cut: usize,
    frozen: bool,
    batches: &[(usize, Value, Value)],
    reps: usize,
    load: Option<&mut DeviceLoad>,
) -> Result<EdgeCut> {
    let fail = |e: edgefreeze_device::DeviceError| ProbeError::Edge {
        address: probe.address.to_string(),
        message: format!("probing cut {cut}: {e}"),
    };
    let reps = reps.max(1);
    let concurrent_which = match &load {
        Some(l) => Some(batches.iter().position(|(n, _, _)| *n == l.samples).ok_or_else(|| {
            ProbeError::Config(format!(
                "cut {cut}: the device's load has {} samples, which no edge batch has",
                l.samples
            ))
        })?),
        None => None,
    };
    let concurrent_count = if load.is_some() { CONCURRENT_PER_REP * reps } else { 0 };
    let count = 1 + reps * batches.len() + concurrent_count;
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
    let result = (|| -> edgefreeze_device::Result<(Vec<Vec<f64>>, Option<Concurrent>, f64)> {
        let mut link = session.stream();
        let mut times = vec![Vec::new(); batches.len()];
        // The edge's compute alone (its step's start to end) at each size, for the
        // concurrent probe's comparison.
        let mut compute = vec![Vec::new(); batches.len()];
        // Micro-batch 0 warms the edge's graphs up; then each size in turn.
        let order = std::iter::once(0).chain((0..reps).flat_map(|_| 0..batches.len()));
        for (i, which) in order.enumerate() {
            let (_, activation, labels) = &batches[which];
            let tag = Tag { micro_batch: i as u32, ..tag_of(&header) };
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
                compute[which].push((reply.edge.end_us - reply.edge.start_us).max(0) as f64 * 1e-6);
            }
        }
        let concurrent = match (load, concurrent_which) {
            (Some(load), Some(which)) => {
                let (_, activation, labels) = &batches[which];
                let edge_alone_s = crate::device::median(std::mem::take(&mut compute[which]));
                let first = 1 + reps * batches.len();
                let upload = |i: usize| Upload {
                    tag: Tag { micro_batch: i as u32, ..tag_of(&header) },
                    activation: activation.clone(),
                    labels: labels.clone(),
                    dropout_seed: Some(i as i64),
                    sent_us: now_us(),
                };
                // What one micro-batch's transfers take each way at the probed rates
                // (a frozen device gets no gradient down).
                let activation_bytes = crate::device::value_bytes(activation) as f64;
                let up_bytes = activation_bytes + crate::device::value_bytes(labels) as f64;
                let down_bytes = if frozen { 0.0 } else { activation_bytes };
                let transfers = (up_bytes / probe.link.up_bytes_per_s, down_bytes / probe.link.down_bytes_per_s);
                let uploads = (first..first + concurrent_count).map(upload);
                Some(concurrent(&mut link, load, edge_alone_s, transfers, uploads)?)
            }
            _ => None,
        };
        // The step's every micro-batch is in: one update, and the seconds the edge says
        // it computed it for. The cost model adds the link's round trip itself
        // (`edgefreeze_plan::cost`), as for `--apply-rate`; the wall time seen from the
        // device would count that round trip twice, and the device's own load besides.
        let apply_s = match probe.apply_s_per_byte {
            Some(per_byte) => state_bytes as f64 * per_byte,
            None => link.timed_update(&Tag { micro_batch: 0, ..tag_of(&header) }, 0.0, false)?.1,
        };
        Ok((times, concurrent, apply_s))
    })();
    // Close whatever happened: a probe leaves no session behind.
    let closed = session.close(&header);
    let (times, concurrent, apply_s) = result.map_err(fail)?;
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
    let overlap = concurrent.map_or(Overlap::default(), |c| Overlap {
        device: c.device.factor,
        edge: c.edge.factor,
        device_link: c.device_link.factor,
    });
    Ok(EdgeCut { times: EdgeCutTimes { cut, step, apply_s, overlap }, state_bytes, concurrent })
}

/// Micro-batches in flight in the concurrent probe: the edge has the next one while it
/// replies to this one.
const CONCURRENT_WINDOW: usize = 2;

/// The concurrent probe (module docs): `uploads` to the edge, [`CONCURRENT_WINDOW`] in
/// flight, while `load` computes on a thread of its own from before the first is sent
/// until the last reply is in; `edge_alone_s` is the edge's compute for this micro-batch
/// size alone, `transfers` the seconds of one upload and one download.
fn concurrent(
    link: &mut impl Link,
    load: &mut DeviceLoad,
    edge_alone_s: f64,
    transfers: (f64, f64),
    uploads: impl Iterator<Item = Upload>,
) -> edgefreeze_device::Result<Concurrent> {
    let started = std::time::Instant::now();
    let stop = AtomicBool::new(false);
    let (device_ops, exchanges) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| device_loop(load, &stop));
        let exchanged = exchange(link, uploads);
        stop.store(true, Ordering::Relaxed);
        let ops =
            worker.join().map_err(|_| DeviceError::Config("the concurrent probe's device thread panicked".into()));
        Ok::<_, DeviceError>((ops??, exchanged?))
    })?;
    // Everything on the device's clock, in seconds from the first operation.
    let theta = edgefreeze_device::stages::edge_offset_us(&exchanges);
    let origin = device_ops.first().map_or(0, |o| o.1);
    let secs = |us: i64| (us - origin) as f64 * 1e-6;
    let edge_busy: Vec<(f64, f64)> =
        exchanges.iter().map(|e| (secs(e.edge.start_us - theta), secs(e.edge.end_us - theta))).collect();
    let device_busy: Vec<(f64, f64)> = device_ops.iter().map(|&(_, s, e)| (secs(s), secs(e))).collect();
    let link_busy = link_intervals(&exchanges, transfers).into_iter().map(|(s, e)| (secs(s), secs(e))).collect();
    let link_busy = union(link_busy);
    let device: Vec<TimedOp> =
        device_ops.iter().map(|&(alone_s, s, e)| TimedOp { alone_s, start_s: secs(s), end_s: secs(e) }).collect();
    let edge: Vec<TimedOp> =
        edge_busy.iter().map(|&(start_s, end_s)| TimedOp { alone_s: edge_alone_s, start_s, end_s }).collect();
    let [device_fit, device_link] = fit_factors(&device, &edge_busy, &link_busy);
    Ok(Concurrent {
        samples: load.samples,
        device: device_fit,
        device_link,
        edge: fit_factor(&edge, &device_busy),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// When the device's link carried each exchange's micro-batch (µs on the device's clock):
/// the upload from when it was sent, or the upload before it had gone (the link carries
/// one at a time), for `transfers.0` seconds; the reply for the `transfers.1` seconds
/// before it arrived.
fn link_intervals(exchanges: &[Exchange], transfers: (f64, f64)) -> Vec<(i64, i64)> {
    let (up_us, down_us) = ((transfers.0 * 1e6).round() as i64, (transfers.1 * 1e6).round() as i64);
    let mut up_free = i64::MIN;
    let mut intervals = Vec::with_capacity(2 * exchanges.len());
    for e in exchanges {
        let start = e.sent_us.max(up_free);
        up_free = start + up_us;
        intervals.push((start, up_free));
        intervals.push((e.received_us - down_us, e.received_us));
    }
    intervals
}

/// The device's forward and backward of `load`'s micro-batch over and over until `stop`:
/// each operation's time alone, start and end (µs on the device's clock).
fn device_loop(load: &mut DeviceLoad, stop: &AtomicBool) -> edgefreeze_device::Result<Vec<(f64, i64, i64)>> {
    let mut ops = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let start = now_us();
        let (activation, stash) = load.device.forward(&load.batch)?;
        ops.push((load.forward_s, start, now_us()));
        if !load.frozen {
            let grad = small_like(&activation);
            let start = now_us();
            load.device.backward(stash, grad, 1.0)?;
            ops.push((load.backward_s, start, now_us()));
        }
    }
    Ok(ops)
}

/// Sends `uploads` with [`CONCURRENT_WINDOW`] in flight and collects each reply's times.
fn exchange(link: &mut impl Link, uploads: impl Iterator<Item = Upload>) -> edgefreeze_device::Result<Vec<Exchange>> {
    let mut uploads = uploads.peekable();
    let mut in_flight = std::collections::VecDeque::new();
    let mut exchanges = Vec::new();
    while uploads.peek().is_some() || !in_flight.is_empty() {
        if in_flight.len() < CONCURRENT_WINDOW
            && let Some(mut upload) = uploads.next()
        {
            upload.sent_us = now_us();
            in_flight.push_back((upload.tag.clone(), upload.sent_us));
            link.send(upload)?;
            continue;
        }
        let Some((tag, sent_us)) = in_flight.pop_front() else { break };
        let reply = link.recv()?;
        let received_us = reply.arrived_us.unwrap_or_else(now_us);
        check_reply(&tag, &reply.tag)?;
        let edge: EdgeTimes = reply.edge;
        exchanges.push(Exchange { step: tag.step, micro_batch: tag.micro_batch, sent_us, received_us, edge });
    }
    Ok(exchanges)
}
