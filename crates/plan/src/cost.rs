//! The cost model: the predicted time of one training step of pipelined device–edge
//! split training, from [`Measurements`].
//!
//! A step of a batch of N samples is M micro-batches of n = N/M samples. For a cut k
//! (device layers 0..=k) and an edge server s, one micro-batch costs
//!
//! | stage | time | resource it occupies |
//! |---|---|---|
//! | device forward | f = c_f + Σ_{i≤k} c_{f,i} + n·Σ_{i≤k} F_i | the device |
//! | uplink | u = (n·(act_k + label) + h)/BW_up | the uplink |
//! | edge step | e = E_{s,k}(n) | the edge |
//! | downlink | d = (n·act_k + h)/BW_down (h alone when the device is frozen) | the downlink |
//! | device backward | b = c_b + Σ_{i≤k} c_{b,i} + n·Σ_{i≤k} B_i (0 when the device is frozen) | the device |
//!
//! plus a latency of `latency_share`·RTT on each of the two crossings, which delays a
//! micro-batch but occupies nothing (the link carries several messages at once).
//! One micro-batch end to end takes the cycle C = f + u + e + d + b + 2·share·RTT, and in
//! steady state one finishes every period P = max(f + b, u, e, d), the busiest resource.
//! The prediction follows the pipeline's own schedule (`schedule` below): the device
//! runs a forward whenever fewer than W micro-batches are in flight (W = M unless
//! limited), and otherwise waits for the oldest reply and runs its backward; the links
//! and the edge serve micro-batches one at a time, in order. That gives the time D until
//! the device's last backward. The device asks for the edge's update together with its
//! last activation, and the edge applies it as soon as it has stepped the last
//! micro-batch (at E_last, once the request has crossed: it was sent when the last
//! forward ended, at F_last), so the update runs while the last gradient comes down and
//! the device runs its last backwards; the step ends when the device has done its own
//! update and has the edge's answer, one crossing later:
//!
//! T = max(D + A_dev, max(E_last, F_last + share·RTT) + A_edge + share·RTT).
//!
//! When the edge or a link is the bottleneck, D = C + (M − 1)·P (PAPERS.md's "their sum
//! plus (M−1) periods"); when the device is, its forwards go first and D is nearer
//! M·(f + b) plus what of the last round trip its backwards cannot hide. Sequential
//! split learning is W = 1, so D = M·C; with M = 1 every mode is the sum of the stages.
//! A frozen device side (every device layer inside the frozen prefix) has no backward,
//! no gradient download (the reply still comes: loss and timestamps, `h` bytes) and no
//! device update.
//!
//! The stages above are each side's compute alone, as the probe times it apart. Where
//! the pipeline runs the device's forward or backward while the edge steps, each runs
//! slower by its overlap factor ([`crate::overlap`]; measured by the concurrent probe,
//! 1 on separate hardware): the schedule stretches each operation by the share of it
//! the other side overlaps, so sequential split learning, M = 1 and the pipeline's fill
//! and drain keep the apart times and the steady state gets the overlapped ones. The
//! device's compute is slowed the same way, by its own factor, where its link carries a
//! micro-batch: an activation being sent up, or a gradient arriving (its network stack
//! runs on the device's cores; on a quarter of a core that made the forward 1.5x longer).
//! And the device's transfers are slowed by its own factor where the device computes
//! during them (their system calls and flow control wait for the device's CPU behind its
//! compute; on a tenth of a core, uploads took 1.6x their time at the link's rate).
//!
//! This refines PAPERS.md's model: the round-trip time is latency, counted per crossing
//! and not in every period; the device's forward and backward share one resource; and
//! the schedule is the device's (forwards first, a window), which the closed form
//! overestimates when the device is the bottleneck and replies are slow to come.

use crate::error::{PlanError, Result, at_least_one, non_negative};
use crate::measure::{Measurements, ServerTimes};
use crate::overlap::{OverlapFactors, covered_fraction, stretched_by, union};
use serde::{Deserialize, Serialize};

/// The constants of the cost model; every one a default the user may change.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// The share of the round-trip time one crossing takes (0.5: a symmetric path).
    pub latency_share: f64,
    /// Bytes each micro-batch message carries besides its tensors, each way (header,
    /// loss, timestamps, gRPC and HTTP/2 framing).
    pub message_bytes: u64,
    /// The overlap factors where the probe did not measure them ([`crate::overlap`]).
    #[serde(default)]
    pub overlap: OverlapFactors,
}

impl Default for CostModel {
    fn default() -> CostModel {
        CostModel { latency_share: 0.5, message_bytes: 128, overlap: OverlapFactors::default() }
    }
}

/// How many micro-batches may be in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "mode", content = "max_in_flight")]
pub enum Mode {
    /// Pipelined, with at most this many micro-batches in flight (`None`: all of them).
    Pipelined(Option<usize>),
    /// Sequential split learning: one in flight.
    Sequential,
}

impl Mode {
    /// The window W for M micro-batches.
    pub fn window(self, micro_batches: usize) -> usize {
        match self {
            Mode::Pipelined(None) => micro_batches,
            Mode::Pipelined(Some(w)) => w.clamp(1, micro_batches.max(1)),
            Mode::Sequential => 1,
        }
    }
}

/// The training a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Samples per step.
    pub batch: usize,
    /// Layers [0, frozen_layers) are frozen. A cut inside the prefix (every device
    /// layer frozen) makes a frozen device side; a cut behind it trains the whole
    /// device side (the split freezes all of the device's layers or none).
    pub frozen_layers: usize,
}

/// One (server, cut, M, mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Candidate {
    /// Index into [`Measurements::servers`].
    pub server: usize,
    /// The cut: after this layer.
    pub cut: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Pipelined or sequential.
    pub mode: Mode,
}

/// A resource of the pipeline (what sets the period).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// The device's compute (forward and backward).
    Device,
    /// Device → edge.
    Uplink,
    /// The edge's compute.
    Edge,
    /// Edge → device.
    Downlink,
    /// The in-flight window: at most W micro-batches per cycle.
    Window,
}

impl Resource {
    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Device => "device",
            Resource::Uplink => "uplink",
            Resource::Edge => "edge",
            Resource::Downlink => "downlink",
            Resource::Window => "window",
        }
    }
}

/// Seconds of each stage of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Stages {
    /// Device forward.
    pub device_forward_s: f64,
    /// Uplink occupancy.
    pub up_s: f64,
    /// Edge step.
    pub edge_s: f64,
    /// Downlink occupancy.
    pub down_s: f64,
    /// Device backward.
    pub device_backward_s: f64,
    /// Latency of one crossing.
    pub latency_s: f64,
}

impl Stages {
    /// The cycle: one micro-batch end to end.
    pub fn cycle_s(&self) -> f64 {
        self.device_forward_s + self.up_s + self.edge_s + self.down_s + self.device_backward_s + 2.0 * self.latency_s
    }
}

/// The predicted time of one step of a candidate, with its parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// What it predicts.
    pub candidate: Candidate,
    /// The server's name.
    pub server: String,
    /// Whether every device layer is frozen at this cut.
    pub frozen_device: bool,
    /// Samples per micro-batch (N/M).
    pub samples_per_micro_batch: f64,
    /// Bytes up per micro-batch.
    pub up_bytes: f64,
    /// Bytes down per micro-batch.
    pub down_bytes: f64,
    /// The stages of one micro-batch as the step runs them: the mean over the step's
    /// micro-batches, each stretched where the overlap model says ([`crate::overlap`]).
    pub stages: Stages,
    /// The stages of one micro-batch with each side computing alone (the probe's times).
    #[serde(default)]
    pub apart: Stages,
    /// The overlap factors the prediction used.
    #[serde(default)]
    pub overlap: OverlapFactors,
    /// One micro-batch end to end.
    pub cycle_s: f64,
    /// The steady-state period: the busiest resource's time per micro-batch.
    pub period_s: f64,
    /// What sets the step's pace: the busiest resource, or the window.
    pub bottleneck: Resource,
    /// The device's update.
    pub device_apply_s: f64,
    /// What of the edge's update (its compute and its answer's crossing) the device waits
    /// for after its own update: the rest runs under the last download and backwards.
    pub edge_apply_s: f64,
    /// The step.
    pub step_s: f64,
}

impl CostModel {
    /// Checks the constants.
    pub fn validate(&self) -> Result<()> {
        non_negative(|| "the latency share of a crossing".into(), self.latency_share)?;
        at_least_one(|| "the default device overlap factor".into(), self.overlap.device)?;
        at_least_one(|| "the default edge overlap factor".into(), self.overlap.edge)?;
        at_least_one(|| "the default device link overlap factor".into(), self.overlap.device_link)?;
        at_least_one(|| "the default link overlap factor".into(), self.overlap.link)?;
        Ok(())
    }

    /// The predicted step of `candidate` on `workload`.
    pub fn predict(&self, m: &Measurements, workload: &Workload, candidate: &Candidate) -> Result<Prediction> {
        let Candidate { server, cut, micro_batches, mode } = *candidate;
        if workload.batch == 0 {
            return Err(PlanError::Inconsistent("the batch must have at least one sample".into()));
        }
        if micro_batches == 0 || micro_batches > workload.batch {
            return Err(PlanError::Inconsistent(format!(
                "{micro_batches} micro-batches: a batch of {} samples takes 1 to {} of them",
                workload.batch, workload.batch
            )));
        }
        let s: &ServerTimes = m.servers.get(server).ok_or_else(|| PlanError::Unmeasured(format!("server {server}")))?;
        let bytes = m.cut(cut).ok_or_else(|| PlanError::Unmeasured(format!("cut {cut} (its bytes)")))?;
        let edge = s.at(cut).ok_or_else(|| PlanError::Unmeasured(format!("cut {cut} on server {}", s.name)))?;
        let layers = m.device.layers.get(..=cut).ok_or_else(|| {
            PlanError::Inconsistent(format!("cut {cut}: the device times cover {} layers", m.device.layers.len()))
        })?;
        let frozen_device = cut < workload.frozen_layers;
        let n = workload.batch as f64 / micro_batches as f64;
        let h = self.message_bytes as f64;
        let up_bytes = n * (bytes.activation + bytes.label) as f64 + h;
        let down_bytes = if frozen_device { h } else { n * bytes.activation as f64 + h };
        let forward: f64 = layers.iter().map(|l| l.forward_s).sum();
        let backward: f64 = layers.iter().map(|l| l.backward_s).sum();
        let forward_call: f64 = m.device.forward_call_s + layers.iter().map(|l| l.forward_call_s).sum::<f64>();
        let backward_call: f64 = m.device.backward_call_s + layers.iter().map(|l| l.backward_call_s).sum::<f64>();
        let apply: f64 = layers.iter().map(|l| l.apply_s).sum();
        let apart = Stages {
            device_forward_s: forward_call + n * forward,
            up_s: up_bytes / s.link.up_bytes_per_s,
            edge_s: edge.step.at(n),
            down_s: down_bytes / s.link.down_bytes_per_s,
            device_backward_s: if frozen_device { 0.0 } else { backward_call + n * backward },
            latency_s: self.latency_share * s.link.rtt_s,
        };
        let overlap = self.overlap.or_measured(&edge.overlap);
        let window = mode.window(micro_batches);
        let timeline = schedule(&apart, micro_batches, window, overlap);
        let stages = timeline.mean_stages(&apart);
        let cycle_s = stages.cycle_s();
        // The period and the bottleneck: the busiest resource (its mean time as the step
        // runs it), or the window when it makes the step longer than an unlimited one
        // would be.
        let (mut bottleneck, period_s) = [
            (Resource::Device, stages.device_forward_s + stages.device_backward_s),
            (Resource::Uplink, stages.up_s),
            (Resource::Edge, stages.edge_s),
            (Resource::Downlink, stages.down_s),
        ]
        .into_iter()
        .fold((Resource::Device, f64::NEG_INFINITY), |best, r| if r.1 > best.1 { r } else { best });
        let micro_s = timeline.device_end_s;
        if window < micro_batches
            && micro_s > schedule(&apart, micro_batches, micro_batches, overlap).device_end_s * (1.0 + 1e-12)
        {
            bottleneck = Resource::Window;
        }
        let device_apply_s = if frozen_device { 0.0 } else { m.device.apply_call_s + apply };
        let device_done_s = micro_s + device_apply_s;
        let edge_answer_s = timeline.last_edge_end_s.max(timeline.last_forward_end_s + apart.latency_s)
            + edge.apply_s
            + apart.latency_s;
        let edge_apply_s = (edge_answer_s - device_done_s).max(0.0);
        let step_s = device_done_s + edge_apply_s;
        Ok(Prediction {
            candidate: *candidate,
            server: s.name.clone(),
            frozen_device,
            samples_per_micro_batch: n,
            up_bytes,
            down_bytes,
            stages,
            apart,
            overlap,
            cycle_s,
            period_s,
            bottleneck,
            device_apply_s,
            edge_apply_s,
            step_s,
        })
    }
}

/// One step, micro-batch by micro-batch, as [`schedule`] ran it.
struct Timeline {
    /// When the device is done with the last micro-batch.
    device_end_s: f64,
    /// When the device's last forward ends (it sends the update request then).
    last_forward_end_s: f64,
    /// When the edge's last micro-batch step ends.
    last_edge_end_s: f64,
    /// Each micro-batch's operations, stretched where the other side computed at the
    /// same time (the device's also where its link carried a micro-batch, its transfers
    /// where it computed).
    times: Times,
}

/// Each micro-batch's operation times, in seconds: what [`schedule`] settles.
struct Times {
    forward: Vec<f64>,
    up: Vec<f64>,
    edge: Vec<f64>,
    down: Vec<f64>,
    backward: Vec<f64>,
}

impl Times {
    /// Every micro-batch's operations as `apart` says.
    fn apart(apart: &Stages, m: usize) -> Times {
        Times {
            forward: vec![apart.device_forward_s; m],
            up: vec![apart.up_s; m],
            edge: vec![apart.edge_s; m],
            down: vec![apart.down_s; m],
            backward: vec![apart.device_backward_s; m],
        }
    }
}

impl Timeline {
    /// The mean stages of a micro-batch: `apart`'s latency, everything else as run.
    fn mean_stages(&self, apart: &Stages) -> Stages {
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        let t = &self.times;
        Stages {
            device_forward_s: mean(&t.forward),
            up_s: mean(&t.up),
            edge_s: mean(&t.edge),
            down_s: mean(&t.down),
            device_backward_s: mean(&t.backward),
            ..*apart
        }
    }
}

/// Fixed-point iterations of [`schedule`] at most; each halves the distance to the
/// fixed point where the stretch is smooth, so 60 reach a float64's precision.
const OVERLAP_ITERATIONS: usize = 60;

/// How `edgefreeze-device`'s pipeline runs `m` micro-batches with at most `w` in flight,
/// each side's compute stretched by the overlap model ([`crate::overlap`]): an operation
/// is as long as `apart` says where the other side is idle and longer by the factor where
/// it computes too. The share of each operation the other side overlaps depends on the
/// stretched times, so the schedule is a fixed point: start from the apart times, run the
/// schedule, stretch each operation by the share of it the other side's operations
/// covered (for the device's, also the share its link's transfers covered; for the
/// device's transfers, the share its compute covered), and repeat (moving half-way each
/// time: a full step can jump between two schedules) until nothing changes. With factors
/// of 1, or one micro-batch in flight (the device waits for each reply, the edge for each
/// activation), it is the apart schedule.
fn schedule(apart: &Stages, m: usize, w: usize, overlap: OverlapFactors) -> Timeline {
    let mut t = Times::apart(apart, m);
    for _ in 0..OVERLAP_ITERATIONS {
        let run = run_schedule(apart, w, &t);
        if overlap.is_none() {
            return run.timeline(t);
        }
        let device_busy: Vec<(f64, f64)> = run.forward.iter().chain(&run.backward).copied().collect();
        let link_busy = union(run.uplink.iter().chain(&run.downlink).copied().collect());
        let mut change = 0.0f64;
        let mut settle = |current: &mut [f64], alone: f64, spans: &[(f64, f64)], sources: &[(&[(f64, f64)], f64)]| {
            for (t, &(start, end)) in current.iter_mut().zip(spans) {
                let shares: Vec<(f64, f64)> =
                    sources.iter().map(|&(busy, k)| (covered_fraction(start, end, busy), k)).collect();
                let target = stretched_by(alone, &shares);
                let next = 0.5 * (*t + target);
                change = change.max((next - *t).abs());
                *t = next;
            }
        };
        let device_sources = [(run.edge.as_slice(), overlap.device), (link_busy.as_slice(), overlap.device_link)];
        let device_compute = [(device_busy.as_slice(), overlap.link)];
        settle(&mut t.forward, apart.device_forward_s, &run.forward, &device_sources);
        settle(&mut t.backward, apart.device_backward_s, &run.backward, &device_sources);
        settle(&mut t.edge, apart.edge_s, &run.edge, &[(device_busy.as_slice(), overlap.edge)]);
        settle(&mut t.up, apart.up_s, &run.uplink, &device_compute);
        settle(&mut t.down, apart.down_s, &run.downlink, &device_compute);
        if change <= 1e-15 * run.device_end_s.max(1e-9) {
            break;
        }
    }
    run_schedule(apart, w, &t).timeline(t)
}

/// When each operation of one run of the schedule ran.
struct Run {
    device_end_s: f64,
    /// (start, end) of each micro-batch's forward, edge step and backward.
    forward: Vec<(f64, f64)>,
    edge: Vec<(f64, f64)>,
    backward: Vec<(f64, f64)>,
    /// When the device's link carried each micro-batch, on the device's side: its
    /// activation leaving, its gradient arriving (a crossing's latency later than the
    /// edge sent it).
    uplink: Vec<(f64, f64)>,
    downlink: Vec<(f64, f64)>,
}

impl Run {
    /// The timeline of this run, with the operation times it ran.
    fn timeline(&self, times: Times) -> Timeline {
        let end = |spans: &[(f64, f64)]| spans.last().map_or(0.0, |&(_, end)| end);
        Timeline {
            device_end_s: self.device_end_s,
            last_forward_end_s: end(&self.forward),
            last_edge_end_s: end(&self.edge),
            times,
        }
    }
}

/// The pipeline's schedule with these per-micro-batch operation times (`st` gives the
/// latency): the device runs a forward whenever fewer than `w` micro-batches are in
/// flight, else it waits for the oldest one's reply and runs its backward; the uplink,
/// the edge and the downlink each serve one micro-batch at a time, in order, and each
/// crossing adds its latency. Replies come back in order, so a micro-batch's arrival is
/// known once it is sent.
fn run_schedule(st: &Stages, w: usize, t: &Times) -> Run {
    let (forward_s, up_s, edge_s, down_s, backward_s) = (&t.forward, &t.up, &t.edge, &t.down, &t.backward);
    let m = forward_s.len();
    let w = w.max(1);
    let (mut device, mut up, mut edge, mut down) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut replies = std::collections::VecDeque::with_capacity(w);
    let mut run = Run {
        device_end_s: 0.0,
        forward: Vec::with_capacity(m),
        edge: Vec::with_capacity(m),
        backward: Vec::with_capacity(m),
        uplink: Vec::with_capacity(m),
        downlink: Vec::with_capacity(m),
    };
    let (mut sent, mut done) = (0, 0);
    while done < m {
        if sent < m && replies.len() < w {
            run.forward.push((device, device + forward_s[sent]));
            device += forward_s[sent];
            up = up.max(device) + up_s[sent];
            run.uplink.push((up - up_s[sent], up));
            let start = edge.max(up + st.latency_s);
            edge = start + edge_s[sent];
            run.edge.push((start, edge));
            down = down.max(edge) + down_s[sent];
            run.downlink.push((down - down_s[sent] + st.latency_s, down + st.latency_s));
            replies.push_back(down + st.latency_s);
            sent += 1;
        } else if let Some(reply) = replies.pop_front() {
            let start = device.max(reply);
            device = start + backward_s[done];
            run.backward.push((start, device));
            done += 1;
        }
    }
    run.device_end_s = device;
    run
}
