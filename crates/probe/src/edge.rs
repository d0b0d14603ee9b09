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
//! once: its network stack shares its cores. The converse too: each upload (from when it
//! was sent to when the edge had it, less a crossing's latency) and each download are
//! set against the device's compute, and [`edgefreeze_plan::fit_factor`] finds how much
//! longer than the link's rate says they take while the device computes.

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
    /// The device operations the concurrent probe wants at least (see [`MORE`]).
    pub min_device_ops: usize,
    /// The probe's budget ends here: no second concurrent session is started that is
    /// expected to run past it.
    pub deadline: std::time::Instant,
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
    /// The device's transfers (each activation's upload, each gradient's download)
    /// against the device's compute.
    pub link: OverlapFit,
    /// Seconds it took.
    pub seconds: f64,
    /// The sessions it ran (2 where the first gave too few device operations).
    pub sessions: usize,
}

/// Micro-batches the concurrent probe sends per timed repetition.
const CONCURRENT_PER_REP: usize = 2;

/// A second concurrent session's micro-batches, at most.
///
/// The concurrent probe's first run sends its micro-batches and stops, however few
/// device operations ran beside them. At a deep cut (the edge's step short, a small
/// activation on a fast link) and a long device forward, that was a handful: ResNet-20's
/// frozen device at cut 8 and 100 Mbit/s gave six, from which the device's two factors
/// came out at 2.17 and 2.84 and the step was predicted 27% long (docs/results.md, 6
/// December). Where the first run gave fewer than [`EdgeProbe::min_device_ops`], a
/// second session sends as many more micro-batches as the first run's pace says will
/// give the rest, up to this many and only if it is expected to end inside the probe's
/// budget; the fits take both runs' operations.
pub const MORE: usize = 96;

/// The device operations wanted by default (`ProbeSettings::min_device_ops`). A choice
/// from one case, not a derived bound: the six operations of the miss above gave
/// factors that put the step 27% off, and 16 to 22 (with the second session) put it 3%
/// and 6% off in two runs.
pub const MIN_DEVICE_OPS: usize = 16;

/// Times the edge step at `cut` on `batches` (activation and labels per size), `reps`
/// times each size after one untimed micro-batch; then, given the device's `load` at
/// this cut, the concurrent probe (module docs) on the batch of its size.
pub fn time_cut(
    probe: &EdgeProbe,
    cut: usize,
    frozen: bool,
    batches: &[(usize, Value, Value)],
    reps: usize,
    mut load: Option<&mut DeviceLoad>,
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
    let session = open(probe, cut, frozen, count, "").map_err(fail)?;
    let header = session.header();
    let state_bytes = session.opened.state_bytes;
    let result = (|| -> edgefreeze_device::Result<FirstSession> {
        let mut link = session.stream();
        let mut times = vec![Vec::new(); batches.len()];
        // The edge's compute alone (its step's start to end) at each size, for the
        // concurrent probe's comparison.
        let mut compute = vec![Vec::new(); batches.len()];
        // Micro-batch 0 warms the edge's graphs up; then each size in turn.
        let order = std::iter::once(0).chain((0..reps).flat_map(|_| 0..batches.len()));
        for (i, which) in order.enumerate() {
            let (_, activation, labels) = &batches[which];
            let reply = one_micro_batch(&mut link, &header, i, activation, labels)?;
            if i > 0 {
                // One micro-batch in flight, so no queueing: from its arrival to its reply.
                times[which].push((reply.sent_us - reply.received_us).max(0) as f64 * 1e-6);
                compute[which].push((reply.end_us - reply.start_us).max(0) as f64 * 1e-6);
            }
        }
        let concurrent = match (load.as_deref_mut(), concurrent_which) {
            (Some(load), Some(which)) => {
                let started = std::time::Instant::now();
                let (_, activation, labels) = &batches[which];
                let edge_alone_s = crate::device::median(std::mem::take(&mut compute[which]));
                let first = 1 + reps * batches.len();
                let uploads = (first..first + concurrent_count).map(|i| upload(&header, i, activation, labels));
                Some(FirstRun { phase: run_phase(&mut link, load, uploads)?, edge_alone_s, started })
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
        Ok(FirstSession { times, concurrent, apply_s })
    })();
    // Close whatever happened: a probe leaves no session behind.
    let closed = session.close(&header);
    let FirstSession { times, concurrent: first_phase, apply_s } = result.map_err(fail)?;
    closed.map_err(fail)?;
    let concurrent = match (first_phase, load, concurrent_which) {
        (Some(FirstRun { phase, edge_alone_s, started }), Some(load), Some(which)) => {
            let (_, activation, labels) = &batches[which];
            // What one micro-batch's transfers take each way at the probed rates (a
            // frozen device gets no gradient down).
            let activation_bytes = crate::device::value_bytes(activation) as f64;
            let up_bytes = activation_bytes + crate::device::value_bytes(labels) as f64;
            let down_bytes = if frozen { 0.0 } else { activation_bytes };
            let transfers = (up_bytes / probe.link.up_bytes_per_s, down_bytes / probe.link.down_bytes_per_s);
            let mut phases = vec![phase];
            if let Some(more) = more_uploads(&phases[0], probe.min_device_ops, probe.deadline) {
                let session = open(probe, cut, frozen, 1 + more, "-more").map_err(fail)?;
                let header = session.header();
                let second = (|| {
                    let mut link = session.stream();
                    one_micro_batch(&mut link, &header, 0, activation, labels)?;
                    let uploads = (1..=more).map(|i| upload(&header, i, activation, labels));
                    run_phase(&mut link, load, uploads)
                })();
                // Closed with micro-batches of its step still to come: nothing is applied.
                let closed = session.close(&header);
                phases.push(second.map_err(fail)?);
                closed.map_err(fail)?;
            }
            let seconds = started.elapsed().as_secs_f64();
            Some(fit_phases(&phases, load.samples, edge_alone_s, transfers, probe.link.rtt_s / 2.0, seconds))
        }
        _ => None,
    };
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
        link: c.link.factor,
    });
    Ok(EdgeCut { times: EdgeCutTimes { cut, step, apply_s, overlap }, state_bytes, concurrent })
}

/// What the first session at a cut measured.
struct FirstSession {
    /// The edge's times at each size.
    times: Vec<Vec<f64>>,
    /// The concurrent probe's run, if it ran.
    concurrent: Option<FirstRun>,
    /// The edge's update.
    apply_s: f64,
}

/// The concurrent probe's run in the first session.
struct FirstRun {
    phase: Phase,
    /// The edge's compute alone at the run's micro-batch size.
    edge_alone_s: f64,
    /// When the run began (the probe reports how long it took, a second session included).
    started: std::time::Instant,
}

/// A probe session of the split at `cut` that takes `count` micro-batches per step, under
/// the probe's run id with `suffix` (each session its own: an edge that keeps
/// checkpoints refuses a run id it holds).
fn open(
    probe: &EdgeProbe,
    cut: usize,
    frozen: bool,
    count: usize,
    suffix: &str,
) -> edgefreeze_device::Result<EdgeSession> {
    let split = SplitSettings { cut, micro_batches: count, sequential: true, recompute: false, freeze_device: frozen };
    let request = pb::OpenSessionRequest {
        header: Some(pb::Header::default()),
        run_id: format!("{}{suffix}", probe.run_id),
        split: Some(split_request(probe.model.to_vec(), &split, probe.loss, probe.optimizer)?),
        resume_step: None,
    };
    EdgeSession::open(probe.address, probe.credentials.clone(), request, probe.timeout)
}

/// Micro-batch `i` of the probe's step.
fn upload(header: &pb::Header, i: usize, activation: &Value, labels: &Value) -> Upload {
    Upload {
        tag: Tag { micro_batch: i as u32, ..tag_of(header) },
        activation: activation.clone(),
        labels: labels.clone(),
        dropout_seed: Some(i as i64),
        sent_us: now_us(),
    }
}

/// Sends micro-batch `i` and waits for its reply: the edge's times of it.
fn one_micro_batch(
    link: &mut impl Link,
    header: &pb::Header,
    i: usize,
    activation: &Value,
    labels: &Value,
) -> edgefreeze_device::Result<EdgeTimes> {
    let up = upload(header, i, activation, labels);
    let tag = up.tag.clone();
    link.send(up)?;
    let reply = link.recv()?;
    check_reply(&tag, &reply.tag)?;
    Ok(reply.edge)
}

/// Micro-batches in flight in the concurrent probe: the edge has the next one while it
/// replies to this one.
const CONCURRENT_WINDOW: usize = 2;

/// One run of the concurrent probe, on the device's clock (µs).
struct Phase {
    /// The device's timed operations: time alone, start, end.
    device_ops: Vec<(f64, i64, i64)>,
    /// When the device computed at all, its untimed first operations included.
    device_busy: Vec<(i64, i64)>,
    /// The micro-batches' round trips.
    exchanges: Vec<Exchange>,
}

/// How many micro-batches a second concurrent session should send so that, at the first
/// run's pace, the device's operations reach `wanted`; `None` when the first gave
/// enough, or a second is not expected to end before `deadline` ([`MORE`]).
fn more_uploads(first: &Phase, wanted: usize, deadline: std::time::Instant) -> Option<usize> {
    let have = first.device_ops.len();
    if have >= wanted || first.exchanges.is_empty() {
        return None;
    }
    let span = |a: i64, b: i64| (b - a).max(1) as f64 * 1e-6;
    let (start, end) = (first.exchanges[0].sent_us, first.exchanges.iter().map(|e| e.received_us).max()?);
    let per_upload = span(start, end) / first.exchanges.len() as f64;
    // A device operation's length, its untimed first ones included; one at least, as
    // long as the whole run, where none was timed.
    let per_op = match have {
        0 => span(start, end),
        _ => first.device_ops.iter().map(|&(_, s, e)| span(s, e)).sum::<f64>() / have as f64,
    };
    let more = ((wanted - have) as f64 * per_op / per_upload).ceil() as usize + CONCURRENT_WINDOW + 1;
    let more = more.min(MORE);
    let expected = std::time::Duration::from_secs_f64(more as f64 * per_upload + 1.0);
    (std::time::Instant::now() + expected <= deadline).then_some(more)
}

/// The fits over every run of the concurrent probe (module docs): `edge_alone_s` is the
/// edge's compute for this micro-batch size alone, `transfers` the seconds of one upload
/// and one download at the link's rates, `crossing_s` a crossing's latency. Each run is
/// on its own clock offset (the edge's timestamps aligned by that run's exchanges) and
/// laid after the one before, well apart, so that no operation of one run overlaps
/// anything of another.
fn fit_phases(
    phases: &[Phase],
    samples: usize,
    edge_alone_s: f64,
    transfers: (f64, f64),
    crossing_s: f64,
    seconds: f64,
) -> Concurrent {
    let (mut device, mut edge, mut moved) = (Vec::new(), Vec::new(), Vec::new());
    let (mut edge_busy, mut device_busy, mut link_busy) = (Vec::new(), Vec::new(), Vec::new());
    let mut shift = 0.0;
    for phase in phases {
        let theta = edgefreeze_device::stages::edge_offset_us(&phase.exchanges);
        let origin = phase.device_busy.first().map_or(0, |o| o.0);
        let secs = |us: i64| shift + (us - origin) as f64 * 1e-6;
        let run_edge: Vec<(f64, f64)> =
            phase.exchanges.iter().map(|e| (secs(e.edge.start_us - theta), secs(e.edge.end_us - theta))).collect();
        edge.extend(run_edge.iter().map(|&(start_s, end_s)| TimedOp { alone_s: edge_alone_s, start_s, end_s }));
        edge_busy.extend(run_edge);
        device_busy.extend(phase.device_busy.iter().map(|&(s, e)| (secs(s), secs(e))));
        device.extend(phase.device_ops.iter().map(|&(alone_s, s, e)| TimedOp {
            alone_s,
            start_s: secs(s),
            end_s: secs(e),
        }));
        link_busy.extend(link_intervals(&phase.exchanges, transfers).into_iter().map(|(s, e)| (secs(s), secs(e))));
        moved.extend(
            transfers_as_run(&phase.exchanges, theta, transfers, crossing_s)
                .into_iter()
                .map(|(alone_s, s, e)| TimedOp { alone_s, start_s: secs(s), end_s: secs(e) }),
        );
        let last =
            [&edge_busy, &device_busy, &link_busy].iter().flat_map(|b| b.iter().map(|i| i.1)).fold(shift, f64::max);
        shift = last + RUNS_APART_S;
    }
    let link_busy = union(link_busy);
    let [device_fit, device_link] = fit_factors(&device, &edge_busy, &link_busy);
    Concurrent {
        samples,
        device: device_fit,
        device_link,
        edge: fit_factor(&edge, &device_busy),
        link: fit_factor(&moved, &device_busy),
        seconds,
        sessions: phases.len(),
    }
}

/// Seconds between two concurrent runs laid on one time axis: more than any operation.
const RUNS_APART_S: f64 = 1e6;

/// One concurrent run: `uploads` to the edge, [`CONCURRENT_WINDOW`] in flight, while
/// `load` computes on a thread of its own from before the first is sent until the last
/// reply is in.
fn run_phase(
    link: &mut impl Link,
    load: &mut DeviceLoad,
    uploads: impl Iterator<Item = Upload>,
) -> edgefreeze_device::Result<Phase> {
    let stop = AtomicBool::new(false);
    let (DeviceRun { ops: device_ops, busy: device_busy }, exchanges) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| device_loop(load, &stop));
        let exchanged = exchange(link, uploads);
        stop.store(true, Ordering::Relaxed);
        let ops =
            worker.join().map_err(|_| DeviceError::Config("the concurrent probe's device thread panicked".into()));
        Ok::<_, DeviceError>((ops??, exchanged?))
    })?;
    Ok(Phase { device_ops, device_busy, exchanges })
}

/// Each exchange's transfers as they ran (µs on the device's clock), with their seconds at
/// the link's rates (`transfers`): the upload from when it was sent, or the one before
/// it had arrived (the link carries one at a time), until the edge had it, less a
/// crossing's latency (`crossing_s`); the download from a crossing's latency after the
/// edge sent it, or the one before it had arrived, until the device had it. A frozen
/// device's replies carry no gradient (no download is timed).
fn transfers_as_run(
    exchanges: &[Exchange],
    theta: i64,
    transfers: (f64, f64),
    crossing_s: f64,
) -> Vec<(f64, i64, i64)> {
    let crossing = (crossing_s * 1e6).round() as i64;
    let (mut up_free, mut down_free) = (i64::MIN, i64::MIN);
    let mut ops = Vec::with_capacity(2 * exchanges.len());
    for e in exchanges {
        let start = e.sent_us.max(up_free);
        let end = e.edge.received_us - theta - crossing;
        ops.push((transfers.0, start, end));
        up_free = end.max(start);
        if transfers.1 > 0.0 {
            let start = (e.edge.sent_us - theta + crossing).max(down_free);
            ops.push((transfers.1, start, e.received_us));
            down_free = e.received_us.max(start);
        }
    }
    ops
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

/// The device's operations in a concurrent run (µs on the device's clock).
struct DeviceRun {
    /// The timed ones: time alone, start, end.
    ops: Vec<(f64, i64, i64)>,
    /// Every one's interval.
    busy: Vec<(i64, i64)>,
}

/// The device's forward and backward of `load`'s micro-batch over and over until `stop`.
/// The first forward and backward are not timed: they run on a thread just started and
/// pay for what a fresh thread sets up first (the engine's thread-local scratch, cold
/// caches), which the pipeline's long-lived device thread does not; they still count as
/// the device computing.
fn device_loop(load: &mut DeviceLoad, stop: &AtomicBool) -> edgefreeze_device::Result<DeviceRun> {
    let (mut ops, mut busy) = (Vec::new(), Vec::new());
    let mut timed = false;
    while !stop.load(Ordering::Relaxed) {
        let start = now_us();
        let (activation, stash) = load.device.forward(&load.batch)?;
        let mut done = vec![(load.forward_s, start, now_us())];
        if !load.frozen {
            let grad = small_like(&activation);
            let start = now_us();
            load.device.backward(stash, grad, 1.0)?;
            done.push((load.backward_s, start, now_us()));
        }
        busy.extend(done.iter().map(|&(_, s, e)| (s, e)));
        if timed {
            ops.extend(done);
        }
        timed = true;
    }
    Ok(DeviceRun { ops, busy })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(sent_us: i64, edge: [i64; 4], received_us: i64) -> Exchange {
        let [received, start, end, sent] = edge;
        Exchange {
            step: 0,
            micro_batch: 0,
            sent_us,
            received_us,
            edge: EdgeTimes { received_us: received, start_us: start, end_us: end, sent_us: sent },
        }
    }

    #[test]
    fn transfers_run_from_their_send_or_the_one_before_to_their_arrival_less_the_latency() {
        // The edge's clock 1 000 µs ahead; a crossing takes 100 µs. Micro-batch 0 sent at
        // 0, at the edge (its clock) at 1 600: its upload [0, 500]. Micro-batch 1 sent at
        // 100 but behind 0 until 500, at the edge at 2 400: [500, 1 300]. Replies: 0 sent
        // by the edge at 2 000 (its clock), in at 1 400: [1 100, 1 400]; 1 sent at 2 500,
        // in at 1 900, after 0's arrival: [1 600, 1 900].
        let exchanges =
            [exchange(0, [1_600, 1_700, 1_900, 2_000], 1_400), exchange(100, [2_400, 2_400, 2_450, 2_500], 1_900)];
        let ops = transfers_as_run(&exchanges, 1_000, (0.0004, 0.0002), 100e-6);
        assert_eq!(ops, vec![(0.0004, 0, 500), (0.0002, 1_100, 1_400), (0.0004, 500, 1_300), (0.0002, 1_600, 1_900)]);
        // A frozen device's replies carry no gradient: uploads only. And a download that
        // arrives before the one ahead of it is through starts when that one is in.
        let ops = transfers_as_run(&exchanges, 1_000, (0.0004, 0.0), 100e-6);
        assert_eq!(ops, vec![(0.0004, 0, 500), (0.0004, 500, 1_300)]);
        let queued =
            [exchange(0, [1_600, 1_700, 1_900, 2_000], 1_400), exchange(100, [2_400, 2_400, 2_450, 2_050], 1_500)];
        assert_eq!(transfers_as_run(&queued, 1_000, (0.0004, 0.0002), 100e-6)[3], (0.0002, 1_400, 1_500));
    }
}
