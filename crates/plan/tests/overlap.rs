//! The cost model with overlap factors, on synthetic measurements whose schedule is
//! worked out by hand (milliseconds, in the comments): a device and an edge that share one
//! core (factor 2 each: while both compute, each goes at half speed) against separate
//! hardware (factor 1). The overlap model is processor sharing, so on one shared core the
//! pipelined step can be no shorter than the sum of both sides' work.

use edgefreeze_plan::{
    Affine, Candidate, CostModel, CutBytes, DeviceTimes, EdgeCutTimes, LayerTimes, LinkTimes, Measurements, Mode,
    Overlap, OverlapFactors, PlanError, ServerTimes, Space, Workload, plan,
};

const MS: f64 = 1e-3;

/// The schedule is a fixed point reached by halving steps: well within a nanosecond.
fn assert_ms(got_s: f64, expected_ms: f64, what: &str) {
    assert!((got_s - expected_ms * MS).abs() < 1e-12, "{what}: predicted {} ms, expected {expected_ms} ms", got_s / MS);
}

/// Two layers, cut 0 with a frozen device side (a forward only), nothing on the links
/// (no bytes, no latency): per sample the device's forward takes 1 ms and the edge step
/// 1 ms, plus 0.25 ms per edge call.
fn measurements(overlap: Overlap) -> Measurements {
    Measurements {
        device: DeviceTimes {
            layers: vec![LayerTimes { forward_s: MS, backward_s: 0.0, apply_s: 0.0, ..LayerTimes::default() }; 2],
            ..DeviceTimes::default()
        },
        cuts: vec![CutBytes { cut: 0, activation: 0, label: 0 }],
        servers: vec![ServerTimes {
            name: "edge-a".into(),
            link: LinkTimes { rtt_s: 0.0, up_bytes_per_s: 1e9, down_bytes_per_s: 1e9 },
            cuts: vec![EdgeCutTimes {
                cut: 0,
                step: Affine { fixed_s: 0.25 * MS, per_sample_s: MS },
                apply_s: 0.0,
                overlap,
            }],
        }],
    }
}

fn model(device: f64, edge: f64) -> CostModel {
    CostModel {
        message_bytes: 0,
        overlap: OverlapFactors { device, edge, device_link: 1.0, link: 1.0 },
        ..CostModel::default()
    }
}

/// A batch of 4, the device's one layer frozen; M ∈ {1, 2, 4}.
fn space() -> (Workload, Space) {
    (Workload { batch: 4, frozen_layers: 1 }, Space { micro_batches: vec![1, 2, 4], max_in_flight: None })
}

#[test]
fn separate_hardware_pipelines_and_a_shared_core_takes_one_big_micro_batch() {
    let (workload, space) = space();
    // Separate hardware (factor 1): a micro-batch of n samples is f = n on the device
    // and e = 0.25 + n on the edge.
    //   M = 1: 4 + 4.25                                = 8.25
    //   M = 2: the edge is the bottleneck, 2 + 2·2.25 = 6.5
    //   M = 4: 1 + 4·1.25                              = 6      <- the optimum
    let separate = plan(&model(1.0, 1.0), &measurements(Overlap::default()), &workload, &space).unwrap();
    for (p, ms) in separate.candidates.iter().zip([8.25, 6.5, 6.0]) {
        assert_ms(p.step_s, ms, &format!("separate, M = {}", p.candidate.micro_batches));
    }
    assert_eq!(separate.chosen().candidate.micro_batches, 4);
    // One shared core (factor 2 on both sides): while both compute each goes at half
    // speed.
    //   M = 1: nothing overlaps                        = 8.25
    //   M = 2: fwd0 [0, 2] alone; fwd1 and edge0 share from 2: fwd1 (2 of work) ends at 6,
    //          edge0 has done 2 of 2.25 and ends alone at 6.25; edge1 alone to 8.5.
    //   M = 4: fwd0 [0, 1]; fwd1 | edge0 from 1: fwd1 ends 3 (edge0 1 of 1.25 done);
    //          fwd2 | edge0 from 3: edge0 ends 3.5 (fwd2 0.25 done); fwd2 | edge1 from
    //          3.5: fwd2 ends 5 (edge1 0.75 done); fwd3 | edge1 from 5: edge1 ends 6
    //          (fwd3 0.5 done); fwd3 | edge2 from 6: fwd3 ends 7 (edge2 0.5 done); edge2
    //          alone to 7.75, edge3 alone to 9 = 4 + 4·1.25, the sum of all the work.
    // Pipelining buys nothing on one core, and more calls cost more: M = 1 is the optimum.
    let shared = plan(&model(2.0, 2.0), &measurements(Overlap::default()), &workload, &space).unwrap();
    for (p, ms) in shared.candidates.iter().zip([8.25, 8.5, 9.0]) {
        assert_ms(p.step_s, ms, &format!("shared, M = {}", p.candidate.micro_batches));
    }
    assert_eq!(shared.chosen().candidate.micro_batches, 1);
    // M = 4's stages as the step runs them: forwards of 1, 2, 2, 2 and edge steps of 2.5,
    // 2.5, 1.75, 1.25; apart they are 1 and 1.25.
    let m4 = &shared.candidates[2];
    assert_ms(m4.stages.device_forward_s, 1.75, "M = 4, mean forward");
    assert_ms(m4.stages.edge_s, 2.0, "M = 4, mean edge step");
    assert_ms(m4.apart.device_forward_s, 1.0, "M = 4, forward alone");
    assert_ms(m4.apart.edge_s, 1.25, "M = 4, edge step alone");
    assert_eq!(m4.overlap, OverlapFactors { device: 2.0, edge: 2.0, device_link: 1.0, link: 1.0 });
    // The factors the probe measured win over the model's defaults.
    let measured = Overlap { device: Some(2.0), edge: Some(2.0), device_link: None, link: None };
    let probed = plan(&model(1.0, 1.0), &measurements(measured), &workload, &space).unwrap();
    assert_eq!(probed.candidates, shared.candidates);
}

#[test]
fn sequential_split_learning_and_one_micro_batch_keep_the_apart_times() {
    let (workload, _) = space();
    let m = measurements(Overlap::default());
    let at = |model: &CostModel, micro_batches, mode| {
        model.predict(&m, &workload, &Candidate { server: 0, cut: 0, micro_batches, mode }).unwrap()
    };
    for k in [1.0, 2.0, 5.0] {
        let model = model(k, k);
        // One micro-batch in flight: the device waits for each reply, 4·(1 + 1.25) = 9.
        let sequential = at(&model, 4, Mode::Sequential);
        assert_ms(sequential.step_s, 9.0, &format!("sequential, factor {k}"));
        assert_eq!(sequential.stages, sequential.apart);
        let one = at(&model, 1, Mode::Pipelined(None));
        assert_ms(one.step_s, 8.25, &format!("M = 1, factor {k}"));
    }
    // Only the device slowed (factor 3), M = 2: fwd0 [0, 2]; edge0 from 2 (2.25 alone)
    // covers fwd1 entirely, which stretches to 2 / (1 − 2/3) = 6 if edge0 lasted that long;
    // it does not: edge0 ends at 4.25 (the edge is not slowed), fwd1 then has done
    // 2.25/3 = 0.75 and ends alone at 4.25 + 1.25 = 5.5; edge1 from 5.5 to 7.75.
    let p = at(&model(3.0, 1.0), 2, Mode::Pipelined(None));
    assert_ms(p.step_s, 7.75, "device factor 3, M = 2");
    assert_ms(p.stages.device_forward_s, 0.5 * (2.0 + 3.5), "device factor 3, M = 2: mean forward");
    assert_ms(p.stages.edge_s, 2.25, "device factor 3, M = 2: the edge unchanged");
}

#[test]
fn overlap_factors_below_one_are_refused_with_their_field() {
    let (workload, space) = space();
    let e = plan(&model(0.5, 1.0), &measurements(Overlap::default()), &workload, &space).unwrap_err();
    assert!(matches!(e, PlanError::Value { .. }) && e.to_string().contains("default device overlap factor"), "{e}");
    let bad = Overlap { device: None, edge: Some(f64::NAN), device_link: None, link: None };
    let e = plan(&model(1.0, 1.0), &measurements(bad), &workload, &space).unwrap_err();
    assert!(e.to_string().contains("server 0 (edge-a): edge overlap factor at cut 0"), "{e}");
}

/// Cut 0 with a frozen device side, an edge that takes no time and a link of 1 MB/s up
/// and no latency: per sample the device's forward takes 1 ms and its activation (1,000
/// bytes) 1 ms to go up.
fn uploading(overlap: Overlap) -> Measurements {
    let mut m = measurements(overlap);
    m.cuts[0].activation = 1000;
    m.servers[0].link.up_bytes_per_s = 1e6;
    m.servers[0].cuts[0].step = Affine::default();
    m
}

#[test]
fn the_device_computes_slower_while_its_link_carries_a_micro_batch() {
    let (workload, _) = space();
    let link_model = |k: f64| CostModel {
        message_bytes: 0,
        overlap: OverlapFactors { device: 1.0, edge: 1.0, device_link: k, link: 1.0 },
        ..CostModel::default()
    };
    let at = |model: &CostModel, m: &Measurements, micro_batches, mode| {
        model.predict(m, &workload, &Candidate { server: 0, cut: 0, micro_batches, mode }).unwrap()
    };
    let m = uploading(Overlap::default());
    // M = 2 (2 samples each: forward 2, upload 2). Factor 1: fwd0 [0, 2], up0 [2, 4],
    // fwd1 [2, 4], up1 [4, 6]: 6. Factor 2: fwd1 runs at half speed while up0 is in
    // flight, 1 of its 2 done by 4, alone to 5; up1 [5, 7]: 7.
    assert_ms(at(&link_model(1.0), &m, 2, Mode::Pipelined(None)).step_s, 6.0, "M = 2, link factor 1");
    let slowed = at(&link_model(2.0), &m, 2, Mode::Pipelined(None));
    assert_ms(slowed.step_s, 7.0, "M = 2, link factor 2");
    assert_ms(slowed.stages.device_forward_s, 2.5, "M = 2, link factor 2: mean forward (2 and 3)");
    assert_ms(slowed.stages.up_s, 2.0, "the link itself is not slowed");
    // The device waits for each reply (sequential), or sends one micro-batch: no transfer
    // overlaps its compute, 2·(2 + 2) and 4 + 4.
    assert_ms(at(&link_model(2.0), &m, 2, Mode::Sequential).step_s, 8.0, "sequential, link factor 2");
    assert_ms(at(&link_model(2.0), &m, 1, Mode::Pipelined(None)).step_s, 8.0, "M = 1, link factor 2");
    // The factor the probe measured wins over the default, as the other two do.
    let measured = uploading(Overlap { device_link: Some(2.0), ..Overlap::default() });
    assert_eq!(at(&link_model(1.0), &measured, 2, Mode::Pipelined(None)), slowed);
    // Below 1 it is refused, naming it.
    let e = plan(&link_model(0.5), &m, &workload, &space().1).unwrap_err();
    assert!(
        matches!(e, PlanError::Value { .. }) && e.to_string().contains("default device link overlap factor"),
        "{e}"
    );
}

#[test]
fn the_devices_transfers_are_slower_while_it_computes() {
    let (workload, _) = space();
    let link_model = |k: f64| CostModel {
        message_bytes: 0,
        overlap: OverlapFactors { link: k, ..OverlapFactors::default() },
        ..CostModel::default()
    };
    let at = |model: &CostModel, m: &Measurements, micro_batches, mode| {
        model.predict(m, &workload, &Candidate { server: 0, cut: 0, micro_batches, mode }).unwrap()
    };
    let m = uploading(Overlap::default());
    // M = 2 (2 samples each: forward 2, upload 2). Factor 2: up0 runs at half speed while
    // fwd1 computes [2, 4], 1 of its 2 done by 4, alone to 5; up1 [5, 7] with the device
    // idle: 7, and the mean upload (3 + 2) / 2.
    assert_ms(at(&link_model(1.0), &m, 2, Mode::Pipelined(None)).step_s, 6.0, "M = 2, factor 1");
    let slowed = at(&link_model(2.0), &m, 2, Mode::Pipelined(None));
    assert_ms(slowed.step_s, 7.0, "M = 2, factor 2");
    assert_ms(slowed.stages.up_s, 2.5, "M = 2, factor 2: mean upload");
    assert_ms(slowed.apart.up_s, 2.0, "the upload at the link's rate");
    assert_ms(slowed.stages.device_forward_s, 2.0, "the compute itself is not slowed");
    // Sequential, or one micro-batch: the device computes while nothing is in flight.
    assert_ms(at(&link_model(2.0), &m, 2, Mode::Sequential).step_s, 8.0, "sequential, factor 2");
    assert_ms(at(&link_model(2.0), &m, 1, Mode::Pipelined(None)).step_s, 8.0, "M = 1, factor 2");
    // M = 4 (1 sample each): fwd k over [k, k + 1]; up0 from 1 at half speed (the device
    // computes until 4): its 1 ms of work done at 3; up1 from 3, half speed until 4 (0.5
    // done), alone to 4.5; up2 [4.5, 5.5] and up3 [5.5, 6.5] with the device idle.
    let m4 = at(&link_model(2.0), &m, 4, Mode::Pipelined(None));
    assert_ms(m4.step_s, 6.5, "M = 4, factor 2");
    // The factor the probe measured wins over the default.
    let measured = uploading(Overlap { link: Some(2.0), ..Overlap::default() });
    assert_eq!(at(&link_model(1.0), &measured, 2, Mode::Pipelined(None)), slowed);
    // Below 1 it is refused, naming it; so is a measured one.
    let e = plan(&link_model(0.5), &m, &workload, &space().1).unwrap_err();
    assert!(matches!(e, PlanError::Value { .. }) && e.to_string().contains("default link overlap factor"), "{e}");
    let bad = uploading(Overlap { link: Some(0.5), ..Overlap::default() });
    let e = plan(&link_model(1.0), &bad, &workload, &space().1).unwrap_err();
    assert!(e.to_string().contains("link overlap factor at cut 0"), "{e}");
}
