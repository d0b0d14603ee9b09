//! The stages of a device–edge step, measured from its timestamps: logged in
//! `metrics.jsonl` beside the cost model's prediction, and summarised at the end of a run.
//!
//! Each micro-batch's stage is its service time: a link or the edge serves one
//! micro-batch at a time, in order, so micro-batch i can be served from when it was
//! handed over and micro-batch i − 1 was done; waiting behind another micro-batch is the
//! pipeline's queueing, which the cost model's schedule adds itself. The edge's
//! timestamps are on its own clock. When they are consistent with the device's (every
//! activation arrives after it was sent and every reply leaves before it arrives: the
//! same machine, or clocks kept in step) they are taken as they are; otherwise the edge's
//! clock is aligned as NTP does, from the round trip with the least delay, which assumes
//! both directions take as long (so only the sum of uplink and downlink is then exact).

use crate::pipeline::{DeviceWork, Exchange, StepTimes};
use edgefreeze_train::metrics::{Record, StageTimes};

/// How far the edge's clock runs ahead of the device's in these exchanges, in µs.
pub fn edge_offset_us(exchanges: &[Exchange]) -> i64 {
    let causal = exchanges.iter().all(|e| e.edge.received_us >= e.sent_us && e.edge.sent_us <= e.received_us);
    if causal {
        return 0;
    }
    exchanges
        .iter()
        .min_by_key(|e| (e.received_us - e.sent_us) - (e.edge.sent_us - e.edge.received_us))
        .map_or(0, |e| ((e.edge.received_us - e.sent_us) + (e.edge.sent_us - e.received_us)) / 2)
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 }
}

const US: f64 = 1e-6;

/// The stages of one step from its timestamps; `step_s` is the step's wall time.
pub fn measured(times: &StepTimes, step_s: f64) -> StageTimes {
    let spans = |work: DeviceWork| -> Vec<f64> {
        times.device.iter().filter(|d| d.work == work).map(|d| (d.end_us - d.start_us) as f64 * US).collect()
    };
    let mut exchanges = times.exchanges.clone();
    exchanges.sort_by_key(|e| (e.step, e.micro_batch));
    let theta = edge_offset_us(&exchanges);
    let (mut up, mut edge, mut down) = (Vec::new(), Vec::new(), Vec::new());
    let mut previous: Option<&Exchange> = None;
    for e in &exchanges {
        let arrived = e.edge.received_us - theta;
        let replied = e.edge.sent_us - theta;
        let (up_free, edge_free, down_free) = previous
            .map_or((i64::MIN, i64::MIN, i64::MIN), |p| (p.edge.received_us - theta, p.edge.sent_us, p.received_us));
        up.push((arrived - e.sent_us.max(up_free)).max(0) as f64 * US);
        edge.push((e.edge.sent_us - e.edge.received_us.max(edge_free)).max(0) as f64 * US);
        down.push((e.received_us - replied.max(down_free)).max(0) as f64 * US);
        previous = Some(e);
    }
    StageTimes {
        step_s,
        device_forward_s: mean(&spans(DeviceWork::Forward)),
        uplink_s: mean(&up),
        edge_s: mean(&edge),
        downlink_s: mean(&down),
        device_backward_s: mean(&spans(DeviceWork::Backward)),
        device_update_s: spans(DeviceWork::Apply).iter().sum(),
        edge_update_s: spans(DeviceWork::EdgeApply).iter().sum(),
    }
}

/// Medians of the measured stages and of the predicted ones over a run's logged steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageSummary {
    /// Steps summarised.
    pub steps: usize,
    /// Median of each measured stage.
    pub measured: StageTimes,
    /// Median of each predicted stage, over the steps that had a prediction.
    pub predicted: Option<StageTimes>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Each field's median over `stages`.
fn medians(stages: &[StageTimes]) -> StageTimes {
    let of = |f: fn(&StageTimes) -> f64| median(stages.iter().map(f).collect());
    StageTimes {
        step_s: of(|s| s.step_s),
        device_forward_s: of(|s| s.device_forward_s),
        uplink_s: of(|s| s.uplink_s),
        edge_s: of(|s| s.edge_s),
        downlink_s: of(|s| s.downlink_s),
        device_backward_s: of(|s| s.device_backward_s),
        device_update_s: of(|s| s.device_update_s),
        edge_update_s: of(|s| s.edge_update_s),
    }
}

/// The summary of the step records that carry stages, leaving out each epoch's first
/// logged step (its graph runs warm the engine up; the loader fills its queue). None
/// when no record has stages.
pub fn summarise(records: &[Record]) -> Option<StageSummary> {
    let mut first_of_epoch = None;
    let mut measured = Vec::new();
    let mut predicted = Vec::new();
    for r in records {
        let Record::Step { epoch, stages: Some(stages), .. } = r else { continue };
        if first_of_epoch != Some(*epoch) {
            first_of_epoch = Some(*epoch);
            continue;
        }
        measured.push(stages.measured);
        predicted.extend(stages.predicted);
    }
    (!measured.is_empty()).then(|| StageSummary {
        steps: measured.len(),
        measured: medians(&measured),
        predicted: (!predicted.is_empty()).then(|| medians(&predicted)),
    })
}

/// Reads one stage of a [`StageTimes`].
type Field = fn(&StageTimes) -> f64;

impl StageSummary {
    /// A table: one row per stage, predicted and measured milliseconds and the error of
    /// the prediction.
    pub fn table(&self) -> String {
        let rows: [(&str, Field); 8] = [
            ("device forward (per micro-batch)", |s| s.device_forward_s),
            ("uplink (per micro-batch)", |s| s.uplink_s),
            ("edge (per micro-batch)", |s| s.edge_s),
            ("downlink (per micro-batch)", |s| s.downlink_s),
            ("device backward (per micro-batch)", |s| s.device_backward_s),
            ("device update", |s| s.device_update_s),
            ("edge update (with its round trip)", |s| s.edge_update_s),
            ("step", |s| s.step_s),
        ];
        let mut out = format!(
            "stages, median over {} steps:\n  {:<34} {:>12} {:>12} {:>8}\n",
            self.steps, "stage", "predicted ms", "measured ms", "error"
        );
        for (name, f) in rows {
            let m = f(&self.measured);
            let (p, error) = match self.predicted.as_ref().map(f) {
                Some(p) if m > 0.0 => (format!("{:.1}", p * 1e3), format!("{:+.0}%", (p / m - 1.0) * 100.0)),
                Some(p) => (format!("{:.1}", p * 1e3), String::new()),
                None => ("-".into(), String::new()),
            };
            out.push_str(&format!("  {name:<34} {p:>12} {:>12.1} {error:>8}\n", m * 1e3));
        }
        out
    }
}
