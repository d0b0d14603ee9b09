//! The stages of a step measured from its timestamps (`edgefreeze_device::stages`), on
//! synthetic timestamps whose stages are known.

use edgefreeze_device::pipeline::{DeviceSpan, DeviceWork, EdgeTimes, Exchange, StepTimes};
use edgefreeze_device::stages::{measured, summarise};
use edgefreeze_train::metrics::{Record, StageTimes, StepStages};

const MS: i64 = 1000;

fn span(work: DeviceWork, micro_batch: Option<u32>, start_ms: i64, end_ms: i64) -> DeviceSpan {
    DeviceSpan { work, step: 0, micro_batch, start_us: start_ms * MS, end_us: end_ms * MS }
}

/// An exchange whose edge clock runs `skew_ms` ahead of the device's.
fn exchange(mb: u32, sent: i64, edge: [i64; 4], received: i64, skew_ms: i64) -> Exchange {
    let e = |t: i64| (t + skew_ms) * MS;
    Exchange {
        step: 0,
        micro_batch: mb,
        sent_us: sent * MS,
        received_us: received * MS,
        edge: EdgeTimes { received_us: e(edge[0]), start_us: e(edge[1]), end_us: e(edge[2]), sent_us: e(edge[3]) },
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// One micro-batch: forward 0–10 ms, up 10–40 (30 ms), edge 40–60 (20 ms, of which
/// decoding 40–42), down 60–85 (25 ms), backward 85–100, device update 100–103, edge
/// update 103–133.
fn sequential(skew_ms: i64) -> StepTimes {
    StepTimes {
        device: vec![
            span(DeviceWork::Forward, Some(0), 0, 10),
            span(DeviceWork::Backward, Some(0), 85, 100),
            span(DeviceWork::Apply, None, 100, 103),
            span(DeviceWork::EdgeApply, None, 103, 133),
        ],
        exchanges: vec![exchange(0, 10, [40, 42, 58, 60], 85, skew_ms)],
    }
}

#[test]
fn a_sequential_step_gives_each_stage_its_own_time() {
    let s = measured(&sequential(0), 0.133);
    let want = StageTimes {
        step_s: 0.133,
        device_forward_s: 0.010,
        uplink_s: 0.030,
        edge_s: 0.020,
        downlink_s: 0.025,
        device_backward_s: 0.015,
        device_update_s: 0.003,
        edge_update_s: 0.030,
    };
    for (got, want, name) in [
        (s.device_forward_s, want.device_forward_s, "forward"),
        (s.uplink_s, want.uplink_s, "uplink"),
        (s.edge_s, want.edge_s, "edge"),
        (s.downlink_s, want.downlink_s, "downlink"),
        (s.device_backward_s, want.device_backward_s, "backward"),
        (s.device_update_s, want.device_update_s, "device update"),
        (s.edge_update_s, want.edge_update_s, "edge update"),
        (s.step_s, want.step_s, "step"),
    ] {
        assert!(close(got, want), "{name}: {got} != {want}");
    }
}

#[test]
fn an_edge_clock_ahead_is_aligned_when_the_directions_take_as_long() {
    // 1 s ahead: the edge's stamps are not causal on the device's clock. With up and
    // down both 25 ms the alignment is exact.
    let mut t = sequential(1000);
    t.exchanges = vec![exchange(0, 10, [35, 37, 58, 60], 85, 1000)];
    let s = measured(&t, 0.133);
    assert!(close(s.uplink_s, 0.025), "{}", s.uplink_s);
    assert!(close(s.downlink_s, 0.025), "{}", s.downlink_s);
    assert!(close(s.edge_s, 0.025), "{}", s.edge_s);
}

#[test]
fn queueing_behind_the_micro_batch_ahead_is_not_counted() {
    // Two micro-batches sent 10 ms apart on a link that takes 30 ms each: the second
    // waits 20 ms behind the first and arrives 30 ms after it. The edge takes 20 ms
    // each, the second waiting for the first; the downlink takes 10 ms each.
    let t = StepTimes {
        device: vec![
            span(DeviceWork::Forward, Some(0), 0, 10),
            span(DeviceWork::Forward, Some(1), 10, 20),
            span(DeviceWork::Backward, Some(0), 70, 80),
            span(DeviceWork::Backward, Some(1), 100, 110),
        ],
        exchanges: vec![exchange(0, 10, [40, 40, 60, 60], 70, 0), exchange(1, 20, [70, 70, 90, 90], 100, 0)],
    };
    let s = measured(&t, 0.11);
    assert!(close(s.uplink_s, 0.030), "{}", s.uplink_s);
    assert!(close(s.edge_s, 0.020), "{}", s.edge_s);
    assert!(close(s.downlink_s, 0.010), "{}", s.downlink_s);
    assert!(close(s.device_forward_s, 0.010) && close(s.device_backward_s, 0.010));
    // No update spans: none counted.
    assert_eq!(s.device_update_s, 0.0);
}

fn step(epoch: usize, step: u64, measured_step_s: f64, predicted_step_s: Option<f64>) -> Record {
    let at = |s: f64| StageTimes { step_s: s, edge_s: s / 2.0, ..StageTimes::default() };
    Record::Step {
        epoch,
        step,
        loss: 1.0,
        accuracy: 0.5,
        lr: 0.1,
        samples_per_s: 1.0,
        stages: Some(StepStages { measured: at(measured_step_s), predicted: predicted_step_s.map(at) }),
    }
}

#[test]
fn the_summary_leaves_out_each_epochs_first_step_and_takes_medians() {
    let records = vec![
        step(1, 1, 9.0, Some(1.0)),
        step(1, 2, 1.0, Some(1.0)),
        step(1, 3, 3.0, Some(1.0)),
        step(1, 4, 2.0, Some(1.0)),
        step(2, 5, 7.0, Some(1.0)),
        step(2, 6, 4.0, Some(3.0)),
    ];
    let s = summarise(&records).unwrap();
    assert_eq!(s.steps, 4);
    // Measured 1, 3, 2, 4 → 2.5; predicted 1, 1, 1, 3 → 1.
    assert!(close(s.measured.step_s, 2.5) && close(s.measured.edge_s, 1.25), "{s:?}");
    assert!(close(s.predicted.unwrap().step_s, 1.0), "{s:?}");
    let table = s.table();
    assert!(table.contains("median over 4 steps") && table.contains("-60%"), "{table}");
    // Without stages there is nothing to summarise.
    let plain = Record::Step { epoch: 1, step: 1, loss: 1.0, accuracy: 0.5, lr: 0.1, samples_per_s: 1.0, stages: None };
    assert!(summarise(&[plain]).is_none());
}
