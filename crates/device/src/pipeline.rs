//! The micro-batch pipeline of one training step, as pure logic over two traits: the
//! device's compute ([`DeviceSide`]) and the stream to the edge ([`Link`]).
//!
//! A batch of N samples is split into M micro-batches (sizes differing by at most one).
//! The device runs the forward pass of micro-batch i and hands its activation to the
//! link; while the activation of i is uploaded, computed on by the edge and its gradient
//! downloaded, the device already runs the forward of i+1, and the backward of i−1 when
//! its gradient is back. At most `max_in_flight` micro-batches are between their forward
//! and their backward (that bounds the stashed activations the device holds);
//! [`Mode::Sequential`] is the same loop with one in flight, which is plain sequential
//! split learning. Forwards go first whenever the window allows, because the edge is
//! usually the critical resource and a forward is what feeds it.
//!
//! Every gradient is accumulated weighted by its micro-batch's share of the batch's
//! labels (c_i / C, the labels its mean loss averages over: n_i / N with a label per
//! sample and none ignored; [`edgefreeze_wire::convert::counted_labels`]): the mean loss
//! over the batch is Σ (c_i/C)·(mean loss of micro-batch i), so the accumulated gradient
//! is the full batch's gradient and one apply-update per side per step makes the
//! pipelined step compute the same update as the unpipelined one.
//! BatchNorm is the exception: it normalises with each micro-batch's own statistics and
//! updates its running statistics once per micro-batch, as PyTorch does under gradient
//! accumulation, so a BatchNorm model trained with M micro-batches matches local training
//! with the same micro-batching, not a full-batch step.
//!
//! Replies come back in the order micro-batches were sent (one stream, processed in order
//! by the edge). Each carries its session, step, micro-batch and model version, and the
//! device checks all four against the oldest micro-batch in flight before it touches a
//! gradient: a reply for anything else stops the step with [`DeviceError::Mismatch`].
//! With the device's layers frozen ([`DeviceSide`] never asked for a backward) the edge
//! sends no gradient, and a reply that carries one is refused.

use crate::error::{DeviceError, Result};
use edgefreeze_engine::Value;
use edgefreeze_wire::convert::counted_labels;
use ndarray::{ArrayD, Axis, Slice};
use std::collections::VecDeque;

/// What every message between device and edge carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// The session the edge opened for this device.
    pub session: String,
    /// Updates applied before this step (0 for the first step).
    pub step: u64,
    /// The micro-batch within the step (0-based).
    pub micro_batch: u32,
    /// The version of the session's graphs, fixed by the edge when it opened the session.
    pub version: u64,
}

/// How many micro-batches may be in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Up to `max_in_flight` micro-batches between their forward and their backward.
    Pipelined {
        /// The bound (at least 1; 1 is [`Mode::Sequential`]).
        max_in_flight: usize,
    },
    /// Sequential split learning: one micro-batch in flight, the device waits for its
    /// reply before the next forward.
    Sequential,
}

impl Mode {
    fn window(self) -> usize {
        match self {
            Mode::Pipelined { max_in_flight } => max_in_flight.max(1),
            Mode::Sequential => 1,
        }
    }
}

/// The samples of one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    /// The input tensor (its first axis is the sample axis).
    pub input: Value,
    /// One label per sample.
    pub labels: Value,
    /// The seed of Dropout masks on both sides, when the model has Dropout.
    pub dropout_seed: Option<i64>,
}

impl MicroBatch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.shape().first().copied().unwrap_or(0)
    }

    /// Whether it has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Splits a batch along its first axis into `m` micro-batches whose sizes differ by at
/// most one (the first ones take the remainder); a batch smaller than `m` makes one
/// micro-batch per sample.
pub fn split_batch(input: &Value, labels: &Value, m: usize) -> Result<Vec<MicroBatch>> {
    let n = labels.shape().first().copied().unwrap_or(0);
    if input.shape().first() != Some(&n) {
        return Err(DeviceError::Config(format!(
            "a batch of {n} labels has inputs of shape {:?}: the first axis must be the samples",
            input.shape()
        )));
    }
    if m == 0 {
        return Err(DeviceError::Config("the number of micro-batches must be at least 1".into()));
    }
    let parts = m.min(n.max(1));
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 0..parts {
        let len = n / parts + usize::from(i < n % parts);
        out.push(MicroBatch { input: rows(input, start, len), labels: rows(labels, start, len), dropout_seed: None });
        start += len;
    }
    Ok(out)
}

fn rows(v: &Value, start: usize, len: usize) -> Value {
    fn take<T: Clone>(a: &ArrayD<T>, start: usize, len: usize) -> ArrayD<T> {
        a.slice_axis(Axis(0), Slice::from(start..start + len)).to_owned()
    }
    match v {
        Value::F32(a) => Value::F32(take(a, start, len)),
        Value::F64(a) => Value::F64(take(a, start, len)),
        Value::I64(a) => Value::I64(take(a, start, len)),
        Value::Bool(a) => Value::Bool(take(a, start, len)),
    }
}

/// An activation going up: what the edge needs for one micro-batch. Never the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// Where it belongs.
    pub tag: Tag,
    /// The activation at the cut.
    pub activation: Value,
    /// The labels (the edge computes the loss).
    pub labels: Value,
    /// The seed of the edge side's Dropout masks.
    pub dropout_seed: Option<i64>,
    /// When the device handed it to the stream (its clock, µs since the Unix epoch).
    pub sent_us: i64,
}

/// When the edge received, computed on and sent back one micro-batch, on the edge's clock
/// (microseconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct EdgeTimes {
    /// The activation arrived.
    pub received_us: i64,
    /// The edge step started.
    pub start_us: i64,
    /// The edge step ended.
    pub end_us: i64,
    /// The reply was handed to the stream.
    pub sent_us: i64,
}

/// A reply coming down.
#[derive(Debug, Clone, PartialEq)]
pub struct Download {
    /// What it answers.
    pub tag: Tag,
    /// Mean loss of the micro-batch.
    pub loss: f64,
    /// Correct predictions in the micro-batch.
    pub correct: f64,
    /// The gradient of the loss with respect to the activation (none when the device's
    /// layers are frozen).
    pub grad_activation: Option<Value>,
    /// The edge's timestamps.
    pub edge: EdgeTimes,
    /// When the reply reached the device (its clock, µs since the Unix epoch), where the
    /// link knows it; otherwise the pipeline takes the moment it read the reply, which is
    /// later when the device was busy with another micro-batch.
    pub arrived_us: Option<i64>,
}

/// The stream to the edge and its control calls.
pub trait Link {
    /// Hands an activation to the stream (returns once it is queued, not delivered).
    fn send(&mut self, upload: Upload) -> Result<()>;
    /// Waits for the next reply.
    fn recv(&mut self) -> Result<Download>;
    /// Asks the edge to apply its accumulated gradients of step `tag.step` with learning
    /// rate `lr` once the step's last micro-batch (already handed to [`Link::send`]) has
    /// run, and to checkpoint its side afterwards if `checkpoint`; returns without
    /// waiting for the answer.
    fn request_update(&mut self, tag: &Tag, lr: f64, checkpoint: bool) -> Result<()>;
    /// Waits for the answer to the update requested last → the header of the edge's
    /// answer, whose step must be `tag.step + 1`.
    fn update_answer(&mut self) -> Result<Tag>;
}

/// The device's share of the model.
pub trait DeviceSide {
    /// What the backward of a micro-batch needs from its forward (stashed tensors, or the
    /// inputs when the backward recomputes the forward).
    type Stash;
    /// Runs the forward of a micro-batch → the activation at the cut and the stash.
    fn forward(&mut self, micro_batch: &MicroBatch) -> Result<(Value, Self::Stash)>;
    /// Runs the backward of a micro-batch from the activation's gradient and adds
    /// `weight` × its parameter gradients to the accumulated ones.
    fn backward(&mut self, stash: Self::Stash, grad_activation: Value, weight: f64) -> Result<()>;
    /// Applies the accumulated gradients with learning rate `lr` as update `update`
    /// (1 for the first; AdamW's bias correction reads it) and clears them.
    fn apply(&mut self, lr: f64, update: u64) -> Result<()>;
}

/// What the device did when, on its own clock (microseconds since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceWork {
    /// A micro-batch's forward.
    Forward,
    /// A micro-batch's backward.
    Backward,
    /// The device's apply-update.
    Apply,
    /// The edge's apply-update, as the device waited for its answer after its own
    /// update (the part of it the device's last backward and update did not hide).
    EdgeApply,
}

/// One stretch of device work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSpan {
    /// What.
    pub work: DeviceWork,
    /// The step.
    pub step: u64,
    /// The micro-batch (none for the updates).
    pub micro_batch: Option<u32>,
    /// Start.
    pub start_us: i64,
    /// End.
    pub end_us: i64,
}

/// One micro-batch's round trip: device clock at both ends, edge clock in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exchange {
    /// The step.
    pub step: u64,
    /// The micro-batch.
    pub micro_batch: u32,
    /// The device handed the activation to the stream.
    pub sent_us: i64,
    /// The device had the reply.
    pub received_us: i64,
    /// The edge's times.
    pub edge: EdgeTimes,
}

/// Timestamps of a step, for the schedule chart.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepTimes {
    /// Device work.
    pub device: Vec<DeviceSpan>,
    /// Round trips.
    pub exchanges: Vec<Exchange>,
}

/// What a step reports.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Mean loss over the batch's samples.
    pub loss: f64,
    /// Correct predictions in the batch.
    pub correct: f64,
    /// Samples in the batch.
    pub samples: usize,
    /// Micro-batches it was split into.
    pub micro_batches: usize,
    /// Timestamps.
    pub times: StepTimes,
}

/// Microseconds since the Unix epoch (the clock both sides stamp with).
pub fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// The settings of one training step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSettings {
    /// The session.
    pub session: String,
    /// Updates applied before this step.
    pub step: u64,
    /// The version of the session's graphs.
    pub version: u64,
    /// The learning rate of this update.
    pub lr: f64,
    /// Pipelined or sequential.
    pub mode: Mode,
    /// The device's layers are frozen: no backward, no gradient download, no device update.
    pub frozen_device: bool,
    /// Ask the edge to checkpoint its side after this step's update.
    pub checkpoint: bool,
    /// The loss: which labels each micro-batch's mean counts (its weight in the step).
    pub loss: edgefreeze_autodiff::Loss,
}

struct InFlight<S> {
    tag: Tag,
    samples: usize,
    activation_shape: Vec<usize>,
    stash: Option<S>,
    sent_us: i64,
}

fn check<T: PartialEq + std::fmt::Display>(field: &'static str, expected: T, got: T) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(DeviceError::Mismatch { field, expected: expected.to_string(), got: got.to_string() })
    }
}

/// Checks that a reply answers the micro-batch `expected`.
pub fn check_reply(expected: &Tag, got: &Tag) -> Result<()> {
    check("session", &expected.session, &got.session)?;
    check("step", expected.step, got.step)?;
    check("micro-batch", expected.micro_batch, got.micro_batch)?;
    check("model version", expected.version, got.version)
}

/// Runs one training step over `micro_batches`: forwards, uploads, replies, backwards,
/// then one apply-update on each side. Returns the batch's loss and accuracy and the
/// step's timestamps.
pub fn run_step<D: DeviceSide, L: Link>(
    device: &mut D,
    link: &mut L,
    micro_batches: &[MicroBatch],
    settings: &StepSettings,
) -> Result<StepReport> {
    let m = micro_batches.len();
    let n: usize = micro_batches.iter().map(MicroBatch::len).sum();
    if m == 0 || n == 0 {
        return Err(DeviceError::Config(format!("step {} has no samples", settings.step)));
    }
    // Each micro-batch's weight: its counted labels over the batch's (none counted: the
    // loss is 0 everywhere and so is every weight).
    let counted: Vec<f64> = micro_batches.iter().map(|mb| counted_labels(&settings.loss, &mb.labels)).collect();
    let total: f64 = counted.iter().sum();
    let share = |i: usize| if total > 0.0 { counted[i] / total } else { 0.0 };
    let window = settings.mode.window();
    let tag = |micro_batch: usize| Tag {
        session: settings.session.clone(),
        step: settings.step,
        micro_batch: micro_batch as u32,
        version: settings.version,
    };
    let mut times = StepTimes::default();
    let mut in_flight: VecDeque<InFlight<D::Stash>> = VecDeque::new();
    let (mut next, mut done) = (0usize, 0usize);
    // Σ (mean loss of i)·c_i/C, and the counted labels predicted right.
    let (mut loss_sum, mut hits) = (0.0f64, 0.0f64);
    while done < m {
        if next < m && in_flight.len() < window {
            let mb = &micro_batches[next];
            let start_us = now_us();
            let (activation, stash) = device.forward(mb)?;
            let end_us = now_us();
            times.device.push(DeviceSpan {
                work: DeviceWork::Forward,
                step: settings.step,
                micro_batch: Some(next as u32),
                start_us,
                end_us,
            });
            let activation_shape = activation.shape().to_vec();
            let sent_us = now_us();
            link.send(Upload {
                tag: tag(next),
                activation,
                labels: mb.labels.clone(),
                dropout_seed: mb.dropout_seed,
                sent_us,
            })?;
            if next + 1 == m {
                // The edge applies its update right after the last micro-batch, while its
                // gradient comes down and the device runs the last backwards: asked for
                // now, not a round trip after them. The step counts as done only when
                // both sides have answered, so a failure before that is a step not done
                // (the trainer goes back to its last consistent copy of both sides).
                link.request_update(&tag(0), settings.lr, settings.checkpoint)?;
            }
            in_flight.push_back(InFlight {
                tag: tag(next),
                samples: mb.len(),
                activation_shape,
                stash: (!settings.frozen_device).then_some(stash),
                sent_us,
            });
            next += 1;
            continue;
        }
        let reply = link.recv()?;
        let received_us = reply.arrived_us.unwrap_or_else(now_us);
        let Some(mut waiting) = in_flight.pop_front() else {
            return Err(DeviceError::Reply {
                step: reply.tag.step,
                micro_batch: reply.tag.micro_batch,
                message: "nothing is in flight".into(),
            });
        };
        check_reply(&waiting.tag, &reply.tag)?;
        let micro_batch = waiting.tag.micro_batch;
        let bad = |message: String| DeviceError::Reply { step: settings.step, micro_batch, message };
        times.exchanges.push(Exchange {
            step: settings.step,
            micro_batch: waiting.tag.micro_batch,
            sent_us: waiting.sent_us,
            received_us,
            edge: reply.edge,
        });
        let i = micro_batch as usize;
        loss_sum += reply.loss * share(i);
        // `correct` is in samples (`edgefreeze_autodiff::loss::LossValues::correct`): the
        // micro-batch's share of its c_i counted labels predicted right, times n_i. With a
        // label per sample c_i = n_i and this is the count itself, exactly.
        hits += reply.correct * counted[i] / waiting.samples.max(1) as f64;
        match (waiting.stash.take(), reply.grad_activation) {
            (Some(stash), Some(grad)) => {
                if grad.shape() != waiting.activation_shape.as_slice() {
                    return Err(bad(format!(
                        "the activation gradient has shape {:?}, the activation {:?}",
                        grad.shape(),
                        waiting.activation_shape
                    )));
                }
                let start_us = now_us();
                device.backward(stash, grad, share(i))?;
                times.device.push(DeviceSpan {
                    work: DeviceWork::Backward,
                    step: settings.step,
                    micro_batch: Some(waiting.tag.micro_batch),
                    start_us,
                    end_us: now_us(),
                });
            }
            (Some(_), None) => return Err(bad("no activation gradient came back".into())),
            (None, Some(_)) => {
                return Err(bad("an activation gradient came back, but the device's layers are frozen".into()));
            }
            (None, None) => {}
        }
        done += 1;
    }
    if !settings.frozen_device {
        let start_us = now_us();
        device.apply(settings.lr, settings.step + 1)?;
        times.device.push(DeviceSpan {
            work: DeviceWork::Apply,
            step: settings.step,
            micro_batch: None,
            start_us,
            end_us: now_us(),
        });
    }
    let start_us = now_us();
    let answer = link.update_answer()?;
    times.device.push(DeviceSpan {
        work: DeviceWork::EdgeApply,
        step: settings.step,
        micro_batch: None,
        start_us,
        end_us: now_us(),
    });
    check_reply(&Tag { step: settings.step + 1, ..tag(0) }, &Tag { micro_batch: 0, ..answer })?;
    // The batch's accuracy over its counted labels, in samples (the count with a label per
    // sample, where C = N).
    let correct = if total > 0.0 { hits * n as f64 / total } else { 0.0 };
    Ok(StepReport { loss: loss_sum, correct, samples: n, micro_batches: m, times })
}

/// Gradients summed over micro-batches, by parameter name, in f32 or f64.
#[derive(Debug, Clone, Default)]
pub struct GradientSum {
    sums: Vec<(String, Value)>,
}

impl GradientSum {
    /// Adds `weight` × `grad` to the sum of `name`.
    pub fn add(&mut self, name: &str, grad: &Value, weight: f64) -> Result<()> {
        let mismatch = |have: &Value| {
            DeviceError::Config(format!(
                "gradient {name:?}: shape {:?} or type differs from the accumulated {:?}",
                grad.shape(),
                have.shape()
            ))
        };
        let Some((_, sum)) = self.sums.iter_mut().find(|(n, _)| n == name) else {
            let scaled = match grad {
                Value::F32(g) => Value::F32(g.mapv(|x| x * weight as f32)),
                Value::F64(g) => Value::F64(g.mapv(|x| x * weight)),
                Value::I64(_) | Value::Bool(_) => {
                    return Err(DeviceError::Config(format!("gradient {name:?} is not floating-point")));
                }
            };
            self.sums.push((name.to_string(), scaled));
            return Ok(());
        };
        if sum.shape() != grad.shape() {
            return Err(mismatch(sum));
        }
        match (sum, grad) {
            (Value::F32(s), Value::F32(g)) => s.scaled_add(weight as f32, g),
            (Value::F64(s), Value::F64(g)) => s.scaled_add(weight, g),
            (s, _) => return Err(mismatch(s)),
        }
        Ok(())
    }

    /// The sums, in the order names were first added, leaving the accumulator empty.
    pub fn take(&mut self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.sums)
    }

    /// Whether nothing has been added since the last [`GradientSum::take`].
    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }
}

#[cfg(test)]
mod tests {
    //! A toy split model in f64 with hand-written gradients, so the scheduler is checked
    //! exactly and without an engine or a network: the device computes a = W1·x, the edge
    //! the loss mean_s ½(w2·a_s − y_s)². Full-batch gradient descent on it, written out
    //! directly, is the reference.
    use super::*;
    use ndarray::{Array1, Array2, Ix1, Ix2};
    use std::sync::mpsc::{Receiver, Sender, channel};

    const D: usize = 3;
    const K: usize = 2;

    fn f64s(v: &Value) -> ArrayD<f64> {
        v.as_f64().unwrap().clone()
    }

    struct ToyDevice {
        w1: Array2<f64>,
        grads: GradientSum,
        backwards: Vec<f64>,
    }

    impl DeviceSide for ToyDevice {
        type Stash = Array2<f64>;
        fn forward(&mut self, mb: &MicroBatch) -> Result<(Value, Array2<f64>)> {
            let x = f64s(&mb.input).into_dimensionality::<Ix2>().unwrap();
            Ok((Value::F64(x.dot(&self.w1.t()).into_dyn()), x))
        }
        fn backward(&mut self, x: Array2<f64>, grad: Value, weight: f64) -> Result<()> {
            let g = f64s(&grad).into_dimensionality::<Ix2>().unwrap();
            self.backwards.push(weight);
            self.grads.add("w1", &Value::F64(g.t().dot(&x).into_dyn()), weight)
        }
        fn apply(&mut self, lr: f64, _step: u64) -> Result<()> {
            for (_, g) in self.grads.take() {
                self.w1.scaled_add(-lr, &f64s(&g).into_dimensionality::<Ix2>().unwrap());
            }
            Ok(())
        }
    }

    enum ToEdge {
        Up(Box<Upload>),
        Apply(Tag, f64),
    }

    const VERSION: u64 = 7;

    /// The edge on its own thread, answering in order; with `hold`, it answers
    /// micro-batch 0 of a step only once micro-batch 1 has arrived, which only a device
    /// that overlaps its next forward with the round trip gets past.
    fn spawn_edge(
        w2: Array1<f64>,
        frozen: bool,
        hold: bool,
    ) -> (Sender<ToEdge>, Receiver<Download>, Receiver<Array1<f64>>) {
        let (up, from_device) = channel::<ToEdge>();
        let (to_device, down) = channel();
        let (params_out, params) = channel();
        std::thread::spawn(move || {
            let mut w2 = w2;
            // Σ n_i · (gradient of micro-batch i's mean loss), and Σ n_i.
            let mut acc = (Array1::<f64>::zeros(K), 0.0);
            let mut held: Option<Upload> = None;
            let mut step = 0u64;
            let answer = |u: Upload, w2: &Array1<f64>, acc: &mut (Array1<f64>, f64)| {
                let a = f64s(&u.activation).into_dimensionality::<Ix2>().unwrap();
                let y = f64s(&u.labels).into_dimensionality::<Ix1>().unwrap();
                let n = y.len() as f64;
                let r = a.dot(w2) - &y;
                let loss = 0.5 * r.mapv(|v| v * v).sum() / n;
                acc.0.scaled_add(1.0, &a.t().dot(&r));
                acc.1 += n;
                let g = Array2::from_shape_fn(a.raw_dim(), |(s, j)| r[s] * w2[j] / n);
                Download {
                    tag: u.tag,
                    loss,
                    correct: 0.0,
                    grad_activation: (!frozen).then(|| Value::F64(g.into_dyn())),
                    edge: EdgeTimes::default(),
                    arrived_us: None,
                }
            };
            for msg in from_device {
                match msg {
                    ToEdge::Up(u) => {
                        let u = *u;
                        if hold && u.tag.micro_batch == 0 {
                            held = Some(u);
                            continue;
                        }
                        if let Some(h) = held.take() {
                            to_device.send(answer(h, &w2, &mut acc)).unwrap();
                        }
                        to_device.send(answer(u, &w2, &mut acc)).unwrap();
                    }
                    ToEdge::Apply(tag, lr) => {
                        assert_eq!((tag.step, tag.version), (step, VERSION));
                        w2.scaled_add(-lr / acc.1, &acc.0);
                        acc = (Array1::zeros(K), 0.0);
                        step += 1;
                        params_out.send(w2.clone()).unwrap();
                        to_device
                            .send(Download {
                                tag: Tag { step, ..tag },
                                loss: 0.0,
                                correct: 0.0,
                                grad_activation: None,
                                edge: EdgeTimes::default(),
                                arrived_us: None,
                            })
                            .unwrap();
                    }
                }
            }
        });
        (up, down, params)
    }

    struct ToyLink {
        up: Sender<ToEdge>,
        down: Receiver<Download>,
        in_flight: usize,
        most_in_flight: usize,
        tamper: Option<fn(&mut Download)>,
        /// Replies read so far.
        replies: usize,
        /// How many replies had been read when each update was requested.
        update_requests: Vec<usize>,
    }

    impl Link for ToyLink {
        fn send(&mut self, upload: Upload) -> Result<()> {
            self.in_flight += 1;
            self.most_in_flight = self.most_in_flight.max(self.in_flight);
            self.up.send(ToEdge::Up(Box::new(upload))).map_err(|e| DeviceError::Link(e.to_string()))
        }
        fn recv(&mut self) -> Result<Download> {
            let mut d = self.down.recv().map_err(|e| DeviceError::Link(e.to_string()))?;
            self.in_flight -= 1;
            self.replies += 1;
            if let Some(t) = self.tamper {
                t(&mut d);
            }
            Ok(d)
        }
        fn request_update(&mut self, tag: &Tag, lr: f64, _checkpoint: bool) -> Result<()> {
            self.update_requests.push(self.replies);
            self.up.send(ToEdge::Apply(tag.clone(), lr)).map_err(|e| DeviceError::Link(e.to_string()))
        }
        fn update_answer(&mut self) -> Result<Tag> {
            let ack = self.down.recv().map_err(|e| DeviceError::Link(e.to_string()))?;
            Ok(ack.tag)
        }
    }

    fn data(n: usize, step: u64) -> (Value, Value) {
        let x = Array2::from_shape_fn((n, D), |(s, j)| ((s * 7 + j * 3 + step as usize) % 11) as f64 / 5.0 - 1.0);
        let y = Array1::from_shape_fn(n, |s| ((s * 5 + step as usize) % 7) as f64 / 3.0 - 1.0);
        (Value::F64(x.into_dyn()), Value::F64(y.into_dyn()))
    }

    fn initial() -> (Array2<f64>, Array1<f64>) {
        (Array2::from_shape_fn((K, D), |(i, j)| 0.3 * i as f64 - 0.2 * j as f64 + 0.1), Array1::from(vec![0.5, -0.4]))
    }

    /// Full-batch gradient descent, directly.
    fn reference(n: usize, steps: u64, lr: f64, frozen: bool) -> (Array2<f64>, Array1<f64>, Vec<f64>) {
        let (mut w1, mut w2) = initial();
        let mut losses = Vec::new();
        for step in 1..=steps {
            let (x, y) = data(n, step);
            let x = f64s(&x).into_dimensionality::<Ix2>().unwrap();
            let y = f64s(&y).into_dimensionality::<Ix1>().unwrap();
            let a = x.dot(&w1.t());
            let r = a.dot(&w2) - &y;
            losses.push(0.5 * r.mapv(|v| v * v).sum() / n as f64);
            let g2 = a.t().dot(&r) / n as f64;
            let ga = Array2::from_shape_fn(a.raw_dim(), |(s, j)| r[s] * w2[j] / n as f64);
            if !frozen {
                w1.scaled_add(-lr, &ga.t().dot(&x));
            }
            w2.scaled_add(-lr, &g2);
        }
        (w1, w2, losses)
    }

    struct Run {
        w1: Array2<f64>,
        w2: Array1<f64>,
        losses: Vec<f64>,
        most_in_flight: usize,
        reports: Vec<StepReport>,
        update_requests: Vec<usize>,
    }

    fn train(n: usize, m: usize, steps: u64, lr: f64, mode: Mode, frozen: bool, hold: bool) -> Result<Run> {
        let (w1, w2) = initial();
        let (up, down, params) = spawn_edge(w2, frozen, hold);
        let mut device = ToyDevice { w1, grads: GradientSum::default(), backwards: Vec::new() };
        let mut link = ToyLink {
            up,
            down,
            in_flight: 0,
            most_in_flight: 0,
            tamper: None,
            replies: 0,
            update_requests: Vec::new(),
        };
        let mut reports = Vec::new();
        let mut w2 = Array1::zeros(K);
        for step in 1..=steps {
            let (x, y) = data(n, step);
            let mbs = split_batch(&x, &y, m)?;
            let settings = StepSettings {
                session: "s9".into(),
                step: step - 1,
                version: VERSION,
                lr,
                mode,
                frozen_device: frozen,
                checkpoint: false,
                loss: edgefreeze_autodiff::Loss::MeanSquaredError,
            };
            reports.push(run_step(&mut device, &mut link, &mbs, &settings)?);
            w2 = params.recv().unwrap();
        }
        let losses = reports.iter().map(|r| r.loss).collect();
        Ok(Run {
            w1: device.w1,
            w2,
            losses,
            most_in_flight: link.most_in_flight,
            reports,
            update_requests: link.update_requests,
        })
    }

    fn close(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> bool {
        // f64 sums in a different order: a few ulps of the magnitudes involved (all O(1)).
        a.into_iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-13)
    }

    #[test]
    fn pipelined_and_sequential_steps_equal_full_batch_gradient_descent() {
        for (n, m) in [(8, 1), (8, 2), (8, 4), (7, 4), (3, 4)] {
            let (w1, w2, losses) = reference(n, 3, 0.1, false);
            for mode in [Mode::Pipelined { max_in_flight: 4 }, Mode::Pipelined { max_in_flight: 2 }, Mode::Sequential] {
                let run = train(n, m, 3, 0.1, mode, false, false).unwrap();
                assert!(close(run.w1.iter().copied(), w1.iter().copied()), "n={n} m={m} {mode:?}: {} vs {w1}", run.w1);
                assert!(close(run.w2.iter().copied(), w2.iter().copied()), "n={n} m={m} {mode:?}: {} vs {w2}", run.w2);
                assert!(close(run.losses.clone(), losses.clone()), "n={n} m={m} {mode:?}");
                assert_eq!(run.reports[0].micro_batches, m.min(n));
                let bound = match mode {
                    Mode::Sequential => 1,
                    Mode::Pipelined { max_in_flight } => max_in_flight.min(m.min(n)),
                };
                assert_eq!(run.most_in_flight, bound, "n={n} m={m} {mode:?}");
                // Each step's update is asked for before its last reply is read (so
                // before the device's last backward), once per step.
                let per_step = m.min(n);
                assert_eq!(run.update_requests.len(), 3);
                for (k, &replies) in run.update_requests.iter().enumerate() {
                    assert!(replies < (k + 1) * per_step, "n={n} m={m} {mode:?}: step {k} at reply {replies}");
                    assert!(replies >= k * per_step);
                }
            }
        }
    }

    #[test]
    fn the_next_forward_runs_while_a_micro_batch_is_in_flight() {
        // The edge holds micro-batch 0 until micro-batch 1 arrives: a device that waited
        // for the reply before its next forward would never finish.
        let run = train(8, 4, 2, 0.1, Mode::Pipelined { max_in_flight: 4 }, false, true).unwrap();
        let (w1, _, _) = reference(8, 2, 0.1, false);
        assert!(close(run.w1.iter().copied(), w1.iter().copied()));
        let times = &run.reports[0].times;
        let forward_1 =
            times.device.iter().find(|s| s.work == DeviceWork::Forward && s.micro_batch == Some(1)).unwrap();
        let reply_0 = times.exchanges.iter().find(|e| e.micro_batch == 0).unwrap();
        assert!(forward_1.start_us <= reply_0.received_us);
    }

    #[test]
    fn frozen_device_layers_get_no_backward_and_no_update() {
        let (w1, w2, _) = reference(8, 3, 0.1, true);
        let run = train(8, 2, 3, 0.1, Mode::Pipelined { max_in_flight: 2 }, true, false).unwrap();
        assert_eq!(run.w1, initial().0);
        assert!(close(run.w1.iter().copied(), w1.iter().copied()) && close(run.w2.iter().copied(), w2.iter().copied()));
        assert!(run.reports.iter().all(|r| r.times.device.iter().all(|s| s.work != DeviceWork::Backward)));
        let sequential = train(8, 2, 3, 0.1, Mode::Sequential, true, false).unwrap();
        assert!(close(sequential.w2.iter().copied(), w2.iter().copied()));
    }

    fn tampered(t: fn(&mut Download), frozen_device: bool) -> String {
        let (w1, w2) = initial();
        let (up, down, _params) = spawn_edge(w2, false, false);
        let mut device = ToyDevice { w1, grads: GradientSum::default(), backwards: Vec::new() };
        let mut link = ToyLink {
            up,
            down,
            in_flight: 0,
            most_in_flight: 0,
            tamper: Some(t),
            replies: 0,
            update_requests: Vec::new(),
        };
        let (x, y) = data(8, 1);
        let settings = StepSettings {
            session: "s9".into(),
            step: 0,
            version: VERSION,
            lr: 0.1,
            mode: Mode::Pipelined { max_in_flight: 2 },
            frozen_device,
            checkpoint: false,
            loss: edgefreeze_autodiff::Loss::MeanSquaredError,
        };
        let err = run_step(&mut device, &mut link, &split_batch(&x, &y, 2).unwrap(), &settings).unwrap_err();
        assert!(device.backwards.is_empty(), "no gradient may be applied from a bad reply");
        err.to_string()
    }

    #[test]
    fn replies_for_another_session_step_micro_batch_or_version_are_refused() {
        type Tamper = fn(&mut Download);
        let cases: [(Tamper, &str); 6] = [
            (|d| d.tag.session = "s8".into(), "expected session s9, got s8"),
            (|d| d.tag.step = 2, "expected step 0, got 2"),
            (|d| d.tag.micro_batch += 1, "expected micro-batch 0, got 1"),
            (|d| d.tag.version = 3, "expected model version 7, got 3"),
            (|d| d.grad_activation = None, "no activation gradient"),
            (|d| d.grad_activation = Some(Value::F64(ArrayD::zeros(ndarray::IxDyn(&[1, 1])))), "has shape [1, 1]"),
        ];
        for (t, expected) in cases {
            let message = tampered(t, false);
            assert!(message.contains(expected), "{message}");
        }
        // The honest edge sends gradients; a device whose layers are frozen refuses them.
        assert!(tampered(|_| {}, true).contains("frozen"));
    }

    #[test]
    fn batches_split_evenly_along_the_sample_axis() {
        let (x, y) = data(7, 0);
        let parts = split_batch(&x, &y, 3).unwrap();
        assert_eq!(parts.iter().map(MicroBatch::len).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!(parts[1].input.as_f64().unwrap().index_axis(Axis(0), 0), x.as_f64().unwrap().index_axis(Axis(0), 3));
        assert_eq!(split_batch(&x, &y, 10).unwrap().len(), 7);
        assert!(split_batch(&x, &y, 0).is_err());
        let (x3, _) = data(3, 0);
        assert!(split_batch(&x3, &y, 2).unwrap_err().to_string().contains("first axis"));
    }

    #[test]
    fn gradient_sums_weight_and_check_shapes() {
        let mut sum = GradientSum::default();
        let g = Value::F32(ArrayD::from_elem(ndarray::IxDyn(&[2]), 2.0));
        sum.add("w", &g, 0.25).unwrap();
        sum.add("w", &g, 0.75).unwrap();
        assert!(sum.add("w", &Value::F32(ArrayD::zeros(ndarray::IxDyn(&[3]))), 1.0).is_err());
        assert!(sum.add("w", &Value::F64(ArrayD::zeros(ndarray::IxDyn(&[2]))), 1.0).is_err());
        let taken = sum.take();
        assert_eq!(taken, vec![("w".to_string(), Value::F32(ArrayD::from_elem(ndarray::IxDyn(&[2]), 2.0)))]);
        assert!(sum.is_empty());
    }
}
