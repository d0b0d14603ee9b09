//! The pipeline's schedule as a Gantt chart: device compute, uplink, edge compute and
//! downlink per micro-batch, from the timestamps both sides record.
//!
//! The device stamps its own work and when it sent and received each micro-batch; the
//! edge stamps when it received, computed and replied, on its own clock. The two clocks
//! are aligned as NTP does: for each round trip the edge's clock runs ahead by
//! θ = ((t_edge_received − t_sent) + (t_edge_sent − t_received)) / 2 if the two
//! directions take as long, and the median θ over the round trips is used (on loopback
//! both sides read the same clock and θ comes out near zero).

use crate::error::{DeviceError, Result};
use crate::pipeline::{DeviceWork, StepTimes};
use edgefreeze_train::plot::{Canvas, DrawResult, render};
use plotters::prelude::*;
use std::path::Path;

/// A row of the chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// Forwards, backwards and the update on the device.
    Device,
    /// Activations going up.
    Uplink,
    /// Edge steps and the edge's update.
    Edge,
    /// Gradients (or, with frozen device layers, only losses) coming down.
    Downlink,
}

impl Lane {
    const ALL: [Lane; 4] = [Lane::Device, Lane::Uplink, Lane::Edge, Lane::Downlink];

    fn row(self) -> usize {
        match self {
            Lane::Device => 0,
            Lane::Uplink => 1,
            Lane::Edge => 2,
            Lane::Downlink => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lane::Device => "device",
            Lane::Uplink => "uplink",
            Lane::Edge => "edge",
            Lane::Downlink => "downlink",
        }
    }
}

/// What a bar shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activity {
    /// Device forward.
    Forward,
    /// Device backward.
    Backward,
    /// Device update.
    DeviceApply,
    /// Transfer of a micro-batch.
    Transfer,
    /// Edge step on a micro-batch.
    EdgeStep,
    /// Edge update (as the device waited for it).
    EdgeApply,
}

/// One bar of the chart, on the device's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bar {
    /// The row.
    pub lane: Lane,
    /// What it shows.
    pub activity: Activity,
    /// The step.
    pub step: u64,
    /// The micro-batch (none for updates).
    pub micro_batch: Option<u32>,
    /// Start, microseconds since the Unix epoch.
    pub start_us: i64,
    /// End.
    pub end_us: i64,
}

/// How far the edge's clock runs ahead of the device's, in microseconds (the median over
/// the round trips; 0 without any).
pub fn clock_offset(steps: &[StepTimes]) -> i64 {
    let mut offsets: Vec<i64> = steps
        .iter()
        .flat_map(|s| &s.exchanges)
        .map(|e| ((e.edge.received_us - e.sent_us) + (e.edge.sent_us - e.received_us)) / 2)
        .collect();
    offsets.sort_unstable();
    offsets.get(offsets.len() / 2).copied().unwrap_or(0)
}

/// The bars of some steps, on the device's clock.
pub fn bars(steps: &[StepTimes]) -> Vec<Bar> {
    let theta = clock_offset(steps);
    let mut out = Vec::new();
    for s in steps {
        for d in &s.device {
            let (lane, activity) = match d.work {
                DeviceWork::Forward => (Lane::Device, Activity::Forward),
                DeviceWork::Backward => (Lane::Device, Activity::Backward),
                DeviceWork::Apply => (Lane::Device, Activity::DeviceApply),
                DeviceWork::EdgeApply => (Lane::Edge, Activity::EdgeApply),
            };
            out.push(Bar {
                lane,
                activity,
                step: d.step,
                micro_batch: d.micro_batch,
                start_us: d.start_us,
                end_us: d.end_us,
            });
        }
        for e in &s.exchanges {
            let edge = |t: i64| t - theta;
            // Clock alignment is an estimate: never draw a transfer ending before it began.
            let up_end = edge(e.edge.received_us).max(e.sent_us);
            let down_start = edge(e.edge.sent_us).min(e.received_us);
            let mb = Some(e.micro_batch);
            let step = e.step;
            out.push(Bar {
                lane: Lane::Uplink,
                activity: Activity::Transfer,
                step,
                micro_batch: mb,
                start_us: e.sent_us,
                end_us: up_end,
            });
            out.push(Bar {
                lane: Lane::Edge,
                activity: Activity::EdgeStep,
                step,
                micro_batch: mb,
                start_us: edge(e.edge.start_us),
                end_us: edge(e.edge.end_us),
            });
            out.push(Bar {
                lane: Lane::Downlink,
                activity: Activity::Transfer,
                step,
                micro_batch: mb,
                start_us: down_start,
                end_us: e.received_us,
            });
        }
    }
    out
}

/// Draws the schedule of `steps` to a PNG: one row per lane, one bar per activity,
/// coloured by micro-batch and labelled (F forward, B backward, U update, the number of
/// the micro-batch on transfers and edge steps), time in milliseconds from the first bar.
pub fn draw_schedule(steps: &[StepTimes], title: &str, path: &Path) -> Result<()> {
    let fail = |message: String| DeviceError::Plot { path: path.into(), message };
    edgefreeze_train::plot::ensure_font().map_err(fail)?;
    let bars = bars(steps);
    if bars.is_empty() {
        return Err(fail("no timestamps were recorded".into()));
    }
    render(path, (1400, 420), |root| draw(&bars, title, root)).map_err(|e| fail(e.to_string()))
}

/// One update's measured time, and the time predicted for it (by `--adapt`'s planner).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// Updates done.
    pub step: u64,
    /// Measured seconds.
    pub measured_s: f64,
    /// Predicted seconds, if a prediction was made.
    pub predicted_s: Option<f64>,
}

/// Draws the step time over the run, measured and predicted, with the decisions
/// (fail-overs, migrations, moves of the cut) marked at their step and labelled.
pub fn draw_step_times(steps: &[StepTime], decisions: &[(u64, String)], title: &str, path: &Path) -> Result<()> {
    let fail = |message: String| DeviceError::Plot { path: path.into(), message };
    edgefreeze_train::plot::ensure_font().map_err(fail)?;
    if steps.is_empty() {
        return Err(fail("no step was measured".into()));
    }
    render(path, (1100, 480), |root| draw_steps(steps, decisions, title, root)).map_err(|e| fail(e.to_string()))
}

fn draw_steps(steps: &[StepTime], decisions: &[(u64, String)], title: &str, root: Canvas<'_>) -> DrawResult {
    let last = steps.iter().map(|s| s.step).max().unwrap_or(1).max(1) as f64;
    let top = steps.iter().flat_map(|s| [s.measured_s, s.predicted_s.unwrap_or(0.0)]).fold(0.0, f64::max).max(1e-3)
        * 1e3
        * 1.15;
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..last, 0.0..top)?;
    chart.configure_mesh().x_desc("update").y_desc("step time (ms)").draw()?;
    let measured = steps.iter().map(|s| (s.step as f64, s.measured_s * 1e3));
    chart
        .draw_series(LineSeries::new(measured, BLUE.stroke_width(2)))?
        .label("measured")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE.stroke_width(2)));
    let predicted: Vec<(f64, f64)> =
        steps.iter().filter_map(|s| s.predicted_s.map(|p| (s.step as f64, p * 1e3))).collect();
    if !predicted.is_empty() {
        chart
            .draw_series(LineSeries::new(predicted, RED.mix(0.8).stroke_width(2)))?
            .label("predicted")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED.stroke_width(2)));
    }
    for (k, (step, label)) in decisions.iter().enumerate() {
        let x = *step as f64;
        chart.draw_series(std::iter::once(PathElement::new(vec![(x, 0.0), (x, top)], BLACK.mix(0.6))))?;
        // Labels step down the chart so neighbouring decisions stay readable.
        let y = top * (0.95 - 0.07 * (k % 5) as f64);
        chart.draw_series(std::iter::once(Text::new(label.clone(), (x + last * 0.005, y), ("sans-serif", 13))))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

fn draw(bars: &[Bar], title: &str, root: Canvas<'_>) -> DrawResult {
    let t0 = bars.iter().map(|b| b.start_us).min().unwrap_or(0);
    let ms = |t: i64| (t - t0) as f64 / 1000.0;
    let span = bars.iter().map(|b| ms(b.end_us)).fold(0.001, f64::max);
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..span * 1.02, -0.5f64..3.5f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(4)
        .y_label_formatter(&|y| {
            // Lanes run top (device, y = 3) to bottom (downlink, y = 0).
            let row = 3 - y.round() as i64;
            let on_lane = (y - y.round()).abs() < 0.01;
            Lane::ALL.iter().find(|l| on_lane && l.row() as i64 == row).map_or(String::new(), |l| l.name().into())
        })
        .x_desc("time (ms)")
        .draw()?;
    let steps: Vec<u64> = {
        let mut s: Vec<u64> = bars.iter().map(|b| b.step).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    for b in bars {
        // Lanes run top (device) to bottom (downlink).
        let y = 3.0 - b.lane.row() as f64;
        let colour = match b.micro_batch {
            Some(mb) => Palette99::pick(mb as usize).to_rgba(),
            None => RGBColor(90, 90, 90).to_rgba(),
        };
        // Alternate steps are drawn lighter, so step boundaries show.
        let shade = if steps.iter().position(|s| *s == b.step).unwrap_or(0) % 2 == 0 { 1.0 } else { 0.55 };
        let (x0, x1) = (ms(b.start_us), ms(b.end_us).max(ms(b.start_us) + span * 0.0015));
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, y - 0.35), (x1, y + 0.35)],
            colour.mix(shade).filled(),
        )))?;
        chart.draw_series(std::iter::once(Rectangle::new([(x0, y - 0.35), (x1, y + 0.35)], BLACK.mix(0.4))))?;
        let label = match (b.activity, b.micro_batch) {
            (Activity::Forward, Some(mb)) => format!("F{mb}"),
            (Activity::Backward, Some(mb)) => format!("B{mb}"),
            (Activity::DeviceApply | Activity::EdgeApply, _) => "U".to_string(),
            (_, Some(mb)) => mb.to_string(),
            (_, None) => String::new(),
        };
        // A label only where the bar is wide enough to hold it.
        if (x1 - x0) / span > 0.012 * label.len().max(1) as f64 {
            chart.draw_series(std::iter::once(Text::new(
                label,
                (x0 + (x1 - x0) * 0.1, y + 0.12),
                ("sans-serif", 13),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{DeviceSpan, EdgeTimes, Exchange};

    fn exchange(mb: u32, sent: i64, theta: i64) -> Exchange {
        // 2 µs up, 10 µs of edge work, 2 µs down, the edge clock `theta` ahead.
        Exchange {
            step: 1,
            micro_batch: mb,
            sent_us: sent,
            received_us: sent + 14,
            edge: EdgeTimes {
                received_us: sent + 2 + theta,
                start_us: sent + 2 + theta,
                end_us: sent + 12 + theta,
                sent_us: sent + 12 + theta,
            },
        }
    }

    #[test]
    fn edge_clock_offset_is_estimated_and_removed() {
        for theta in [0, 1_000_000, -5_000] {
            let times = StepTimes {
                device: vec![DeviceSpan {
                    work: DeviceWork::Forward,
                    step: 1,
                    micro_batch: Some(0),
                    start_us: 90,
                    end_us: 100,
                }],
                exchanges: vec![exchange(0, 100, theta), exchange(1, 110, theta), exchange(2, 130, theta)],
            };
            assert_eq!(clock_offset(std::slice::from_ref(&times)), theta);
            let bars = bars(&[times]);
            let edge: Vec<&Bar> = bars.iter().filter(|b| b.lane == Lane::Edge).collect();
            assert_eq!((edge[0].start_us, edge[0].end_us), (102, 112));
            let up = bars.iter().find(|b| b.lane == Lane::Uplink && b.micro_batch == Some(1)).unwrap();
            assert_eq!((up.start_us, up.end_us), (110, 112));
            let down = bars.iter().find(|b| b.lane == Lane::Downlink && b.micro_batch == Some(2)).unwrap();
            assert_eq!((down.start_us, down.end_us), (142, 144));
        }
    }

    /// A simulated pipelined step: forwards of 2 ms, 1 ms transfers, edge steps of 3 ms,
    /// backwards of 1.5 ms (in µs from 0), with the edge clock 40 ms ahead.
    fn simulated(steps: u64, m: u32) -> Vec<StepTimes> {
        let theta = 40_000;
        let mut out = Vec::new();
        let mut t = 1_000_000;
        for step in 0..steps {
            let mut times = StepTimes::default();
            let mut edge_free = 0;
            let mut device_free = t;
            let mut replies = Vec::new();
            for mb in 0..m {
                let (f0, f1) = (device_free, device_free + 2000);
                times.device.push(DeviceSpan {
                    work: DeviceWork::Forward,
                    step,
                    micro_batch: Some(mb),
                    start_us: f0,
                    end_us: f1,
                });
                device_free = f1;
                let arrive = f1 + 1000;
                let start = arrive.max(edge_free);
                edge_free = start + 3000;
                replies.push((mb, f1, arrive, start, edge_free));
            }
            for (mb, sent, arrive, start, end) in replies {
                let back = end + 1000;
                let b0 = back.max(device_free);
                device_free = b0 + 1500;
                times.device.push(DeviceSpan {
                    work: DeviceWork::Backward,
                    step,
                    micro_batch: Some(mb),
                    start_us: b0,
                    end_us: device_free,
                });
                times.exchanges.push(Exchange {
                    step,
                    micro_batch: mb,
                    sent_us: sent,
                    received_us: back,
                    edge: EdgeTimes {
                        received_us: arrive + theta,
                        start_us: start + theta,
                        end_us: end + theta,
                        sent_us: end + theta,
                    },
                });
            }
            times.device.push(DeviceSpan {
                work: DeviceWork::Apply,
                step,
                micro_batch: None,
                start_us: device_free,
                end_us: device_free + 500,
            });
            times.device.push(DeviceSpan {
                work: DeviceWork::EdgeApply,
                step,
                micro_batch: None,
                start_us: device_free + 500,
                end_us: device_free + 1500,
            });
            t = device_free + 1500;
            out.push(times);
        }
        out
    }

    #[test]
    fn the_schedule_chart_is_drawn() {
        if let Err(e) = edgefreeze_train::plot::ensure_font() {
            assert!(std::env::var("EDGEFREEZE_REQUIRE_DATA").is_err(), "{e}");
            eprintln!("skipping: {e}");
            return;
        }
        let steps = simulated(3, 4);
        assert_eq!(clock_offset(&steps), 40_000);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schedule.png");
        draw_schedule(&steps, "simulated: 3 steps of 4 micro-batches", &path).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
        if let Ok(keep) = std::env::var("EDGEFREEZE_KEEP_PLOT") {
            std::fs::copy(&path, keep).unwrap();
        }
        assert!(draw_schedule(&[], "empty", &path).unwrap_err().to_string().contains("no timestamps"));
    }

    #[test]
    fn the_step_time_chart_is_drawn_with_its_decisions() {
        if let Err(e) = edgefreeze_train::plot::ensure_font() {
            assert!(std::env::var("EDGEFREEZE_REQUIRE_DATA").is_err(), "{e}");
            eprintln!("skipping: {e}");
            return;
        }
        let steps: Vec<StepTime> = (1..=40)
            .map(|step| StepTime {
                step,
                measured_s: if (10..20).contains(&step) { 0.4 } else { 0.1 },
                predicted_s: Some(if step < 20 { 0.09 } else { 0.11 }),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.png");
        draw_step_times(&steps, &[(20, "migrate to B".into())], "simulated", &path).unwrap();
        let png = std::fs::read(&path).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
        if let Ok(keep) = std::env::var("EDGEFREEZE_KEEP_PLOT") {
            std::fs::copy(&path, keep).unwrap();
        }
        assert!(draw_step_times(&[], &[], "empty", &path).unwrap_err().to_string().contains("no step"));
    }
}
