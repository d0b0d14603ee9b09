//! The cost model and the planner on synthetic measurements whose optimum is computed by
//! hand (in milliseconds, in the comments), and the re-planning rule.

use edgefreeze_plan::{
    Affine, Candidate, CostModel, Current, CutBytes, Decision, DeviceTimes, EdgeCutTimes, LayerTimes, LinkTimes,
    Measurements, Mode, Overlap, PlanError, ReplanPolicy, Resource, ServerTimes, Space, Workload, decide, migration_s,
    plan,
};

const MS: f64 = 1e-3;

/// The model's arithmetic is a handful of float64 operations on millisecond-sized
/// numbers: a few ulps of 1 s.
fn assert_ms(got_s: f64, expected_ms: f64, what: &str) {
    assert!((got_s - expected_ms * MS).abs() < 1e-12, "{what}: predicted {} ms, expected {expected_ms} ms", got_s / MS);
}

/// No per-message bytes, so the hand computations stay short.
fn bare() -> CostModel {
    CostModel { message_bytes: 0, ..CostModel::default() }
}

fn link(rtt_ms: f64, up: f64, down: f64) -> LinkTimes {
    LinkTimes { rtt_s: rtt_ms * MS, up_bytes_per_s: up, down_bytes_per_s: down }
}

/// A model of `layers` layers; on the device each costs `forward_ms` / `backward_ms` per
/// sample; the edge costs `edge_ms` per sample per layer it trains; cut k sends
/// `activation[k]` bytes per sample.
fn four_layers(forward_ms: f64, backward_ms: f64, edge_ms: f64, activation: [u64; 3], link: LinkTimes) -> Measurements {
    let layers = 4;
    Measurements {
        device: DeviceTimes {
            layers: vec![
                LayerTimes {
                    forward_s: forward_ms * MS,
                    backward_s: backward_ms * MS,
                    apply_s: 0.0,
                    ..LayerTimes::default()
                };
                layers
            ],
            ..DeviceTimes::default()
        },
        cuts: (0..3).map(|k| CutBytes { cut: k, activation: activation[k], label: 0 }).collect(),
        servers: vec![ServerTimes {
            name: "edge-a".into(),
            link,
            cuts: (0..3)
                .map(|k| EdgeCutTimes {
                    cut: k,
                    step: Affine { fixed_s: 0.0, per_sample_s: (layers - 1 - k) as f64 * edge_ms * MS },
                    apply_s: 0.0,
                    overlap: Overlap::default(),
                })
                .collect(),
        }],
    }
}

fn one_step(batch: usize) -> (Workload, Space) {
    (Workload { batch, frozen_layers: 0 }, Space { micro_batches: vec![1], max_in_flight: None })
}

#[test]
fn a_slow_uplink_pushes_the_cut_to_the_layer_with_the_small_activation() {
    // Batch 8, M = 1, no latency: T = f + u + e + d + b. Per sample the device spends
    // 1 ms forward and 2 ms backward per layer, the edge 0.3 ms per layer it trains.
    let (workload, space) = one_step(8);
    let activation = [1000, 100, 500];
    // A fast link (1e9 B/s): the compute decides.
    //   cut 0: 8 + 16 + 7.2 + (8000 + 8000)/1e6 = 31.216
    //   cut 1: 16 + 32 + 4.8 + 1.6e-3           = 52.8016
    //   cut 2: 24 + 48 + 2.4 + 8e-3             = 74.408
    let fast = four_layers(1.0, 2.0, 0.3, activation, link(0.0, 1e9, 1e9));
    let p = plan(&bare(), &fast, &workload, &space).unwrap();
    assert_eq!(p.chosen().candidate.cut, 0);
    for (k, ms) in [31.216, 52.8016, 74.408].into_iter().enumerate() {
        assert_ms(p.candidates[k].step_s, ms, &format!("fast link, cut {k}"));
    }
    // A 100 kB/s uplink: 8 samples × 1000 bytes take 80 ms at cut 0, 8 ms at cut 1.
    //   cut 0: 31.2 + 80 + 0.008 = 111.208
    //   cut 1: 52.8 + 8 + 0.0008 = 60.8008
    //   cut 2: 74.4 + 40 + 0.004 = 114.404
    let slow = four_layers(1.0, 2.0, 0.3, activation, link(0.0, 1e5, 1e9));
    let p = plan(&bare(), &slow, &workload, &space).unwrap();
    assert_eq!(p.chosen().candidate.cut, 1);
    for (k, ms) in [111.208, 60.8008, 114.404].into_iter().enumerate() {
        assert_ms(p.candidates[k].step_s, ms, &format!("slow uplink, cut {k}"));
    }
    assert_eq!(p.candidates[0].bottleneck, Resource::Uplink);
}

#[test]
fn a_frozen_device_side_moves_the_cut_deeper() {
    // Device: 1 ms forward, 4 ms backward per sample per layer; edge 0.5 ms per sample per
    // layer; 100 kB/s both ways; batch 8, M = 1.
    let m = four_layers(1.0, 4.0, 0.5, [400, 300, 50], link(0.0, 1e5, 1e5));
    let (mut workload, space) = one_step(8);
    // Training the device side: T = f + u + e + d + b
    //   cut 0: 8 + 32 + 12 + 32 + 32 = 116
    //   cut 1: 16 + 24 + 8 + 24 + 64 = 136
    //   cut 2: 24 + 4 + 4 + 4 + 96   = 132
    let trained = plan(&bare(), &m, &workload, &space).unwrap();
    assert_eq!(trained.chosen().candidate.cut, 0);
    for (k, ms) in [116.0, 136.0, 132.0].into_iter().enumerate() {
        assert_ms(trained.candidates[k].step_s, ms, &format!("trained device, cut {k}"));
    }
    // Layers 0..3 frozen: no backward and no gradient coming down, T = f + u + e
    //   cut 0: 8 + 32 + 12 = 52
    //   cut 1: 16 + 24 + 8 = 48
    //   cut 2: 24 + 4 + 4  = 32
    workload.frozen_layers = 3;
    let frozen = plan(&bare(), &m, &workload, &space).unwrap();
    assert_eq!(frozen.chosen().candidate.cut, 2);
    for (k, ms) in [52.0, 48.0, 32.0].into_iter().enumerate() {
        assert_ms(frozen.candidates[k].step_s, ms, &format!("frozen device, cut {k}"));
        let p = &frozen.candidates[k];
        assert!(p.frozen_device && p.stages.device_backward_s == 0.0 && p.stages.down_s == 0.0);
    }
    // A prefix of 1 layer freezes the device side at cut 0 only; cuts 1 and 2 train it
    // whole, as the split does.
    workload.frozen_layers = 1;
    let partial = plan(&bare(), &m, &workload, &space).unwrap();
    assert_ms(partial.candidates[0].step_s, 52.0, "frozen at cut 0");
    assert_ms(partial.candidates[1].step_s, 136.0, "trained at cut 1");
    assert_eq!(partial.chosen().candidate.cut, 0);
}

/// One cut, fixed costs per call: device forward and backward 1 ms each, edge 2 ms,
/// 1000 message bytes on a 1e6 B/s link (1 ms); per sample the device's layers cost
/// 0.5 ms forward and 0.5 ms backward, the edge 1 ms, the 1000-byte activation 1 ms
/// each way.
fn overheads() -> (CostModel, Measurements) {
    let model = CostModel { message_bytes: 1000, ..CostModel::default() };
    let m = Measurements {
        device: DeviceTimes {
            layers: vec![
                LayerTimes { forward_s: 0.25 * MS, backward_s: 0.25 * MS, apply_s: 0.0, ..LayerTimes::default() },
                LayerTimes { forward_s: 0.25 * MS, backward_s: 0.25 * MS, apply_s: 0.0, ..LayerTimes::default() },
                LayerTimes::default(),
            ],
            forward_call_s: 1.0 * MS,
            backward_call_s: 1.0 * MS,
            apply_call_s: 0.0,
        },
        cuts: vec![CutBytes { cut: 1, activation: 1000, label: 0 }],
        servers: vec![ServerTimes {
            name: "edge-a".into(),
            link: link(0.0, 1e6, 1e6),
            cuts: vec![EdgeCutTimes {
                cut: 1,
                step: Affine { fixed_s: 2.0 * MS, per_sample_s: 1.0 * MS },
                apply_s: 0.0,
                overlap: Overlap::default(),
            }],
        }],
    };
    (model, m)
}

#[test]
fn more_micro_batches_help_until_the_per_message_overhead_dominates() {
    let (model, m) = overheads();
    // n = 64/M samples per micro-batch: f = b = 1 + n/2, u = d = 1 + n, e = 2 + n, so
    // C = 6 + 4n and P = 2 + n (device and edge), T = C + (M−1)·P = 68 + 2M + 192/M.
    let workload = Workload { batch: 64, frozen_layers: 0 };
    let space = Space { micro_batches: vec![1, 2, 4, 8, 16, 32, 64], max_in_flight: None };
    let p = plan(&model, &m, &workload, &space).unwrap();
    let expected = [262.0, 168.0, 124.0, 108.0, 112.0, 138.0, 199.0];
    for (prediction, ms) in p.candidates.iter().zip(expected) {
        assert_ms(prediction.step_s, ms, &format!("M = {}", prediction.candidate.micro_batches));
    }
    assert_eq!(p.chosen().candidate.micro_batches, 8);
    // Device and edge both take 10 ms (up to rounding) at M = 8.
    assert!(matches!(p.candidates[3].bottleneck, Resource::Device | Resource::Edge));
}

#[test]
fn sequential_split_learning_is_the_sum_of_the_stages() {
    let (model, mut m) = overheads();
    m.servers[0].link.rtt_s = 4.0 * MS;
    m.servers[0].cuts[0].apply_s = 3.0 * MS;
    m.device.layers[0].apply_s = 0.5 * MS;
    m.device.apply_call_s = 0.5 * MS;
    let workload = Workload { batch: 64, frozen_layers: 0 };
    let at = |micro_batches, mode| {
        model.predict(&m, &workload, &Candidate { server: 0, cut: 1, micro_batches, mode }).unwrap()
    };
    // M = 1, n = 64: f = 33, u = 65, e = 66, d = 65, b = 33, two crossings of 2 ms and
    // the device update 1 ms. The edge's update was asked for with the activation: it
    // runs 166–169 and its answer is back at 171, long before the device is done (267).
    let sum = 33.0 + 65.0 + 66.0 + 65.0 + 33.0 + 2.0 * 2.0 + 1.0;
    assert_ms(at(1, Mode::Sequential).step_s, sum, "sequential M = 1");
    assert_ms(at(1, Mode::Pipelined(None)).step_s, sum, "pipelined M = 1");
    // Sequential with M = 4 (n = 16): four cycles of 9 + 17 + 18 + 17 + 9 + 4 = 74.
    let sequential = at(4, Mode::Sequential);
    assert_ms(sequential.step_s, 4.0 * 74.0 + 1.0, "sequential M = 4");
    assert_eq!(sequential.bottleneck, Resource::Window);
    // Pipelined: 74 + 3 periods of 18 (the edge, and the device's 9 + 9).
    let pipelined = at(4, Mode::Pipelined(None));
    assert_ms(pipelined.step_s, 74.0 + 3.0 * 18.0 + 1.0, "pipelined M = 4");
    assert_ms(pipelined.edge_apply_s, 0.0, "the edge update's wait, pipelined M = 4");
    // Two in flight: forwards 0 and 1 (0–9, 9–18); micro-batch 0's reply at 65, its
    // backward 65–74, forward 2 74–83; reply 1 at 83, backward 83–92, forward 3 92–101;
    // micro-batch 2 crosses at 100 + 2, is computed 102–120, comes down at 137 + 2,
    // backward 139–148; micro-batch 3: uplink 101–118, edge 120–138, down 155 + 2,
    // backward 157–166. Then the device's update (1); the edge's ran 138–141.
    let windowed = at(4, Mode::Pipelined(Some(2)));
    assert_ms(windowed.step_s, 166.0 + 1.0, "pipelined M = 4, two in flight");
    assert_eq!(windowed.bottleneck, Resource::Window);
}

#[test]
fn a_busy_device_runs_its_forwards_first_and_hides_the_round_trips() {
    // Batch 4, M = 4 (one sample each): the device takes 10 ms forward and 10 ms
    // backward, each link and the edge 1 ms, and the round trip is 100 ms.
    let m = Measurements {
        device: DeviceTimes {
            layers: vec![
                LayerTimes { forward_s: 10.0 * MS, backward_s: 10.0 * MS, apply_s: 0.0, ..LayerTimes::default() },
                LayerTimes::default(),
            ],
            ..DeviceTimes::default()
        },
        cuts: vec![CutBytes { cut: 0, activation: 1000, label: 0 }],
        servers: vec![ServerTimes {
            name: "far".into(),
            link: link(100.0, 1e6, 1e6),
            cuts: vec![EdgeCutTimes {
                cut: 0,
                step: Affine { fixed_s: 0.0, per_sample_s: 1.0 * MS },
                apply_s: 0.0,
                overlap: Overlap::default(),
            }],
        }],
    };
    let workload = Workload { batch: 4, frozen_layers: 0 };
    let at = |m: &Measurements, mode| {
        bare().predict(m, &workload, &Candidate { server: 0, cut: 0, micro_batches: 4, mode }).unwrap()
    };
    // Forwards end at 10, 20, 30, 40; replies come at 10i + 10 + 1 + 50 + 1 + 1 + 50 = 113,
    // 123, 133, 143; the backwards run 113–153. The closed form C + 3·P = 123 + 3·20
    // would say 183. The edge's update (0 ms), asked for with the last activation, runs
    // after its last step (ends at 40 + 1 + 50 + 1 = 92) and its answer is back at 142.
    let pipelined = at(&m, Mode::Pipelined(None));
    assert_ms(pipelined.step_s, 153.0, "pipelined");
    assert_eq!(pipelined.bottleneck, Resource::Device);
    // Sequential: four cycles of 10 + 1 + 50 + 1 + 1 + 50 + 10 = 123; the last edge step
    // ends at 369 + 62 = 431, the update's answer is back at 481.
    assert_ms(at(&m, Mode::Sequential).step_s, 4.0 * 123.0, "sequential");
    // An edge update of 30 ms is no longer hidden: its answer comes at 92 + 30 + 50 = 172
    // (pipelined) and 431 + 30 + 50 = 511 (sequential), and the device waits for it.
    let mut slow_update = m.clone();
    slow_update.servers[0].cuts[0].apply_s = 30.0 * MS;
    let pipelined = at(&slow_update, Mode::Pipelined(None));
    assert_ms(pipelined.step_s, 172.0, "pipelined, 30 ms edge update");
    assert_ms(pipelined.edge_apply_s, 19.0, "the edge update's wait, pipelined");
    assert_ms(at(&slow_update, Mode::Sequential).step_s, 511.0, "sequential, 30 ms edge update");
}

#[test]
fn bad_measurements_are_refused_naming_the_field() {
    let (model, m) = overheads();
    let workload = Workload { batch: 64, frozen_layers: 0 };
    let space = Space::default();
    let mut bad = m.clone();
    bad.servers[0].link.up_bytes_per_s = 0.0;
    let err = plan(&model, &bad, &workload, &space).unwrap_err();
    assert!(err.to_string().contains("server 0 (edge-a): uplink bytes per second is 0"), "{err}");
    let mut bad = m.clone();
    bad.device.layers[1].backward_s = f64::NAN;
    let err = plan(&model, &bad, &workload, &space).unwrap_err();
    assert!(err.to_string().contains("device layer 1: backward seconds per sample"), "{err}");
    let mut bad = m.clone();
    bad.cuts[0].cut = 2;
    assert!(matches!(plan(&model, &bad, &workload, &space), Err(PlanError::Inconsistent(_))));
    let too_many = Space { micro_batches: vec![128], max_in_flight: None };
    assert!(plan(&model, &m, &workload, &too_many).unwrap_err().to_string().contains("1 to 64"));
    let mut unprobed = m.clone();
    unprobed.servers[0].cuts.clear();
    assert!(matches!(plan(&model, &unprobed, &workload, &space), Err(PlanError::NoCandidate(_))));
    let candidate = Candidate { server: 3, cut: 1, micro_batches: 1, mode: Mode::Sequential };
    assert!(matches!(model.predict(&m, &workload, &candidate), Err(PlanError::Unmeasured(_))));
}

/// Two servers on the `overheads` model: server 0's uplink degraded to a fifth.
fn mobility() -> (CostModel, Measurements, Workload, Space) {
    let (model, mut m) = overheads();
    let mut second = m.servers[0].clone();
    second.name = "edge-b".into();
    m.servers[0].link.up_bytes_per_s = 2e5;
    m.servers.push(second);
    (model, m, Workload { batch: 64, frozen_layers: 0 }, Space { micro_batches: vec![8], max_in_flight: None })
}

#[test]
fn replanning_moves_when_the_saving_beats_the_cost_of_moving() {
    let (model, m, workload, space) = mobility();
    let fresh = plan(&model, &m, &workload, &space).unwrap();
    // Server 0 at M = 8 (n = 8): f = b = 5, u = 9000 B / 2e5 B/s = 45 (the period), e = 10,
    // d = 9, so C = 74 and T = 74 + 7·45 = 389 ms; server 1 is the 108 ms of the M = 8
    // case above.
    assert_ms(fresh.candidates[0].step_s, 389.0, "degraded server");
    assert_ms(fresh.candidates[1].step_s, 108.0, "other server");
    assert_eq!(fresh.chosen().server, "edge-b");
    let running = fresh.candidates[0].candidate;
    let current = Current { candidate: running, predicted_s: 108.0 * MS, measured_s: 390.0 * MS, remaining_steps: 100 };
    let policy = ReplanPolicy::default();
    // 100 steps × 281 ms = 28.1 s saved; a 10 MB edge state fetched over server 0's
    // downlink (1e6 B/s) and put over server 1's uplink (1e6 B/s) takes 20 s.
    let cost = migration_s(10_000_000, &m.servers[0].link, &m.servers[1].link, 0.0);
    assert!((cost - 20.0).abs() < 1e-9, "{cost}");
    let decision = decide(&policy, &current, Some(&fresh), |c| if c.server == 1 { cost } else { 0.0 }).unwrap();
    match &decision {
        Decision::Move { to, gain_s, cost_s, .. } => {
            assert_eq!(to.server, 1);
            assert!((gain_s - 28.1).abs() < 1e-9 && (cost_s - 20.0).abs() < 1e-9, "{decision:?}");
        }
        other => panic!("expected a move, got {other:?}"),
    }
    assert!(decision.to_string().contains("saves 28.10 s"), "{decision}");
    // With 50 steps left the saving (14.05 s) no longer pays for the move: the measured
    // 390 ms is far off the 108 ms predicted, so it re-probes instead.
    let late = Current { remaining_steps: 50, ..current };
    let decision = decide(&policy, &late, Some(&fresh), |c| if c.server == 1 { cost } else { 0.0 }).unwrap();
    assert!(matches!(decision, Decision::Reprobe { .. }), "{decision:?}");
}

#[test]
fn replanning_picks_the_largest_net_saving_and_otherwise_watches_drift() {
    let (model, m, workload, _) = mobility();
    let space = Space { micro_batches: vec![4, 8], max_in_flight: None };
    let fresh = plan(&model, &m, &workload, &space).unwrap();
    // Server 1: M = 4 takes 124 ms, M = 8 108 ms. Running server 1 at M = 4 for 100 steps,
    // moving to M = 8 (1.6 s saved) is free; a move to server 0 saves nothing.
    let running = Candidate { server: 1, cut: 1, micro_batches: 4, mode: Mode::Pipelined(None) };
    let current = Current { candidate: running, predicted_s: 124.0 * MS, measured_s: 124.0 * MS, remaining_steps: 100 };
    let policy = ReplanPolicy::default();
    let decision = decide(&policy, &current, Some(&fresh), |_| 0.0).unwrap();
    let Decision::Move { to, gain_s, .. } = decision else { panic!("{decision:?}") };
    assert_eq!((to.server, to.micro_batches), (1, 8));
    assert!((gain_s - 1.6).abs() < 1e-9);
    // If the change costs more than it saves, stay.
    assert_eq!(decide(&policy, &current, Some(&fresh), |_| 2.0).unwrap(), Decision::Stay);
    // No fresh plan: drift alone decides, against the threshold in both directions.
    let within = Current { measured_s: 124.0 * MS * 1.2, ..current };
    assert_eq!(decide(&policy, &within, None, |_| 0.0).unwrap(), Decision::Stay);
    let slower = Current { measured_s: 124.0 * MS * 1.3, ..current };
    let Decision::Reprobe { drift, .. } = decide(&policy, &slower, None, |_| 0.0).unwrap() else { panic!() };
    assert!((drift - 0.3).abs() < 1e-12);
    let faster = Current { measured_s: 124.0 * MS * 0.7, ..current };
    assert!(matches!(decide(&policy, &faster, None, |_| 0.0).unwrap(), Decision::Reprobe { .. }));
    // Bad numbers are errors, not decisions.
    let broken = Current { predicted_s: 0.0, ..current };
    assert!(decide(&policy, &broken, None, |_| 0.0).unwrap_err().to_string().contains("predicted step seconds"));
    assert!(decide(&policy, &current, Some(&fresh), |_| -1.0).is_err());
}
