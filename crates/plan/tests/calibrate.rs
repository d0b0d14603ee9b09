//! Calibration of the probed compute from a run's measured stages, on synthetic
//! measurements: a run whose device and edge compute 1.5x and 2x slower than probed is
//! predicted exactly once calibrated from one step's stages.

use edgefreeze_plan::{
    Affine, Calibration, Candidate, CostModel, CutBytes, DeviceTimes, EdgeCutTimes, LayerTimes, LinkTimes,
    Measurements, Mode, Overlap, PlanError, ServerTimes, Stages, Workload,
};

const MS: f64 = 1e-3;

/// Three layers; the device 1/2/0.1 ms per sample and layer (forward/backward/update),
/// 0.5 ms fixed per graph run; the edge 3 ms fixed and 0.4 ms per sample per layer it
/// trains; 20 Mbit/s links with a 20 ms round trip.
fn probed() -> Measurements {
    Measurements {
        device: DeviceTimes {
            layers: vec![
                LayerTimes {
                    forward_s: 1.0 * MS,
                    backward_s: 2.0 * MS,
                    apply_s: 0.1 * MS,
                    ..LayerTimes::default()
                };
                3
            ],
            forward_call_s: 0.5 * MS,
            backward_call_s: 0.5 * MS,
            apply_call_s: 0.5 * MS,
        },
        cuts: (0..2).map(|k| CutBytes { cut: k, activation: 4000, label: 8 }).collect(),
        servers: vec![ServerTimes {
            name: "edge-a".into(),
            link: LinkTimes { rtt_s: 20.0 * MS, up_bytes_per_s: 2.5e6, down_bytes_per_s: 2.5e6 },
            cuts: (0..2)
                .map(|k| EdgeCutTimes {
                    cut: k,
                    step: Affine { fixed_s: 3.0 * MS, per_sample_s: (2 - k) as f64 * 0.4 * MS },
                    apply_s: 1.0 * MS,
                    overlap: Overlap::default(),
                })
                .collect(),
        }],
    }
}

/// `m` with every device time scaled by `device` and every edge time by `edge`, written
/// out independently of `Calibration::apply`.
fn slower(device: f64, edge: f64) -> Measurements {
    let mut m = probed();
    m.device.layers = vec![
        LayerTimes {
            forward_s: device * MS,
            backward_s: 2.0 * device * MS,
            apply_s: 0.1 * device * MS,
            ..LayerTimes::default()
        };
        3
    ];
    m.device.forward_call_s = 0.5 * device * MS;
    m.device.backward_call_s = 0.5 * device * MS;
    m.device.apply_call_s = 0.5 * device * MS;
    for (k, c) in m.servers[0].cuts.iter_mut().enumerate() {
        c.step = Affine { fixed_s: 3.0 * edge * MS, per_sample_s: (2 - k) as f64 * 0.4 * edge * MS };
        c.apply_s = edge * MS;
    }
    m
}

fn candidate(cut: usize, micro_batches: usize) -> Candidate {
    Candidate { server: 0, cut, micro_batches, mode: Mode::Pipelined(None) }
}

#[test]
fn one_steps_stages_calibrate_the_compute_and_the_step_is_then_predicted_exactly() {
    let model = CostModel::default();
    let workload = Workload { batch: 32, frozen_layers: 0 };
    let truth = slower(1.5, 2.0);
    for (cut, m) in [(0, 4), (1, 4), (1, 8), (0, 1)] {
        let c = candidate(cut, m);
        let before = model.predict(&probed(), &workload, &c).unwrap();
        let measured = model.predict(&truth, &workload, &c).unwrap();
        // The probed prediction is off: the compute is slower than probed.
        assert!(measured.step_s > before.step_s * 1.05, "cut {cut}, M {m}");
        let calibration = Calibration::from_stages(&before.stages, &measured.stages).unwrap();
        assert!((calibration.device - 1.5).abs() < 1e-12 && (calibration.edge - 2.0).abs() < 1e-12, "{calibration:?}");
        let after = model.predict(&calibration.apply(&probed(), 0).unwrap(), &workload, &c).unwrap();
        assert!(
            (after.step_s - measured.step_s).abs() < 1e-12,
            "cut {cut}, M {m}: {} ms calibrated, {} ms true",
            after.step_s / MS,
            measured.step_s / MS
        );
        // The links are left as probed.
        assert_eq!(after.stages.up_s, before.stages.up_s);
        assert_eq!(after.stages.down_s, before.stages.down_s);
    }
}

#[test]
fn a_frozen_device_side_calibrates_from_its_forward_alone() {
    let model = CostModel::default();
    // Every device layer frozen at cut 0: no backward predicted or measured.
    let workload = Workload { batch: 32, frozen_layers: 1 };
    let c = candidate(0, 4);
    let before = model.predict(&probed(), &workload, &c).unwrap();
    let measured = model.predict(&slower(3.0, 1.0), &workload, &c).unwrap();
    assert_eq!(before.stages.device_backward_s, 0.0);
    let calibration = Calibration::from_stages(&before.stages, &measured.stages).unwrap();
    assert!((calibration.device - 3.0).abs() < 1e-12 && (calibration.edge - 1.0).abs() < 1e-12, "{calibration:?}");
}

#[test]
fn a_stage_never_measured_leaves_its_factor_at_one_and_bad_numbers_are_errors() {
    let predicted = Stages { device_forward_s: 0.01, edge_s: 0.02, ..Stages::default() };
    let nothing = Stages::default();
    assert_eq!(Calibration::from_stages(&predicted, &nothing).unwrap(), Calibration::NONE);
    let bad = Stages { edge_s: f64::NAN, ..predicted };
    let e = Calibration::from_stages(&predicted, &bad).unwrap_err();
    assert!(matches!(&e, PlanError::Inconsistent(m) if m.contains("the edge")), "{e}");
    let e = Calibration::NONE.apply(&probed(), 3).unwrap_err();
    assert!(matches!(&e, PlanError::Unmeasured(m) if m.contains("server 3")), "{e}");
}
