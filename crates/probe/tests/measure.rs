//! Probing a real edge server (in process, on loopback) through the link shaper, with
//! the MLP (cuts after layers 0 and 1). Timing assertions are bounds that follow from the
//! shaper (a delay and a rate are lower bounds on a transfer's time, on any machine).

use edgefreeze_edge::{EdgeConfig, EdgeServer};
use edgefreeze_engine::EngineOptions;
use edgefreeze_plan::{CostModel, Overlap, OverlapFactors, Space, Workload, plan};
use edgefreeze_probe::{ProbeError, ProbeSettings, Target, edge, probe};
use edgefreeze_shaper::{Shape, Shaper};
use edgefreeze_wire::auth::{Credentials, TokenTable};
use std::path::PathBuf;
use std::time::Duration;

const TOKEN: &str = "probe-test-token-0123456789abcdef";

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/mlp.onnx")
}

fn target(address: String) -> Target {
    Target { address, credentials: Credentials::new("phone", TOKEN).unwrap() }
}

fn settings() -> ProbeSettings {
    ProbeSettings {
        micro_batches: vec![1, 4],
        reps: 3,
        link_reps: 3,
        engine_options: EngineOptions { threads: Some(1), ..Default::default() },
        ..ProbeSettings::new(64)
    }
}

/// An edge server on its own runtime thread (the probe blocks on its own runtimes).
fn edge_server() -> (String, tokio::runtime::Runtime, EdgeServer) {
    edge_server_with(edgefreeze_wire::Limits::default())
}

fn edge_server_with(limits: edgefreeze_wire::Limits) -> (String, tokio::runtime::Runtime, EdgeServer) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut config = EdgeConfig::new(edgefreeze_edge::side::split_builder());
    config.limits = limits;
    config.engine_options = EngineOptions { threads: Some(1), ..Default::default() };
    config.log = edgefreeze_edge::Log::to(|_| {});
    let tokens = TokenTable::parse(&format!("phone {TOKEN}\n"), "test tokens").unwrap();
    let server = runtime.block_on(EdgeServer::start(config, tokens, "127.0.0.1:0")).unwrap();
    (server.local_addr().to_string(), runtime, server)
}

#[test]
fn a_shaped_link_and_the_edge_at_every_cut_are_measured() {
    let (address, runtime, server) = edge_server();
    let delay = Duration::from_millis(15);
    let (up, down) = (2e6, 4e6);
    let shaper = runtime
        .block_on(Shaper::start(address.parse().unwrap(), Shape::new(up, delay), Shape::new(down, delay)))
        .unwrap();
    let report = probe(&model(), &[target(shaper.local_addr().to_string())], &settings()).unwrap();
    let m = &report.measurements;
    assert_eq!(report.sizes, vec![16, 64], "the largest micro-batch of M = 4 and of M = 1");
    assert_eq!(m.cuts.iter().map(|c| c.cut).collect::<Vec<_>>(), vec![0, 1]);
    // 256 and 128 f32 activations per sample, one int64 label.
    assert_eq!((m.cuts[0].activation, m.cuts[0].label, m.cuts[1].activation), (1024, 8, 512));
    assert_eq!(m.device.layers.len(), 3);
    // The device ran (its times are not asserted: on a loaded machine a median of three
    // can make a layer look free, which the model then counts as 0); fc3 never runs on
    // the device.
    let l = &m.device.layers;
    let device_at = |k: usize| l[..=k].iter().map(|t| t.forward_s + t.backward_s).sum::<f64>();
    assert!(m.device.forward_call_s + device_at(1) > 0.0, "{l:?}");
    assert_eq!((l[2].forward_s, l[2].backward_s, l[2].apply_s), (0.0, 0.0, 0.0));
    let link = m.servers[0].link;
    // Every call crosses the delay twice; no payload goes faster than the shaper's rate
    // (the payloads of 16 and 64 samples take 8 to 33 ms at these rates; a quarter of
    // slack for the noise of the empty call they are measured against).
    assert!(link.rtt_s >= 2.0 * delay.as_secs_f64(), "{link:?}");
    assert!(link.up_bytes_per_s <= 1.25 * up && link.down_bytes_per_s <= 1.25 * down, "{link:?}");
    assert_eq!(m.servers[0].cuts.iter().map(|c| c.cut).collect::<Vec<_>>(), vec![0, 1]);
    assert!(m.servers[0].cuts.iter().all(|c| c.step.at(64.0) > 0.0));
    // The edge's update is its own compute time of one update, without the shaped link's
    // round trip (the cost model adds that once: counted in here too, it was twice). This
    // model's update is a few hundred parameters, microseconds against the 30 ms round trip.
    let round_trip = 2.0 * delay.as_secs_f64();
    assert!(m.servers[0].cuts.iter().all(|c| c.apply_s > 0.0 && c.apply_s < round_trip), "{:?}", m.servers[0].cuts);
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert!(report.elapsed_s >= report.device_s + report.links_s + report.edges_s - 1e-9);
    // The probe sessions are gone.
    assert!(server.sessions().is_empty(), "{:?}", server.sessions().len());
    let p = plan(
        &CostModel::default(),
        m,
        &Workload { batch: 64, frozen_layers: 0 },
        &Space { micro_batches: vec![1, 4], max_in_flight: None },
    )
    .unwrap();
    assert_eq!(p.candidates.len(), 4);
    drop(shaper);
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn the_concurrent_probe_runs_the_device_beside_the_edge_at_every_cut() {
    let (address, runtime, server) = edge_server();
    let report = probe(&model(), &[target(address.clone())], &settings()).unwrap();
    let m = &report.measurements;
    assert_eq!(report.concurrent.iter().map(|c| c.cut).collect::<Vec<_>>(), vec![0, 1]);
    for c in &report.concurrent {
        let f = &c.found;
        assert_eq!((c.server.as_str(), f.samples), (address.as_str(), 16), "the micro-batch of M = 4");
        // Six micro-batches (two per repetition) went to the edge, and the device computed
        // from before the first was sent until the last reply was in: the edge's steps ran
        // beside the device's compute for most of their time (the rest is the device
        // thread between two operations, or not yet started). Where the device's timed
        // operations were fewer than wanted, a second session sent more.
        match f.sessions {
            1 => assert!(f.edge.ops == 6 && f.device.ops >= edge::MIN_DEVICE_OPS, "{f:?}"),
            2 => assert!(f.edge.ops > 6, "{f:?}"),
            _ => panic!("{f:?}"),
        }
        assert!(f.edge.mean_fraction > 0.5, "{f:?}");
        assert!(f.device.ops >= 2 && f.device.mean_fraction > 0.0, "{f:?}");
        assert_eq!(f.device_link.ops, f.device.ops, "fitted together");
        for k in [f.device.factor, f.edge.factor, f.device_link.factor, f.link.factor].into_iter().flatten() {
            assert!((1.0..=edgefreeze_plan::overlap::MAX_FACTOR).contains(&k), "{f:?}");
        }
        // What the planner reads is what the probe found.
        let times = m.servers[0].at(c.cut).unwrap();
        assert_eq!(
            (times.overlap.device, times.overlap.edge, times.overlap.device_link, times.overlap.link),
            (f.device.factor, f.edge.factor, f.device_link.factor, f.link.factor)
        );
    }
    // The probe sessions are gone.
    assert!(server.sessions().is_empty(), "{:?}", server.sessions().len());
    // Without it nothing is measured, and the cost model's defaults apply.
    let apart = probe(&model(), &[target(address)], &ProbeSettings { concurrent: false, ..settings() }).unwrap();
    assert!(apart.concurrent.is_empty());
    assert!(apart.measurements.servers[0].cuts.iter().all(|c| c.overlap == Overlap::default()));
    let model = CostModel {
        overlap: OverlapFactors { device: 1.5, edge: 2.0, device_link: 1.25, link: 1.5 },
        ..CostModel::default()
    };
    let p = plan(&model, &apart.measurements, &Workload { batch: 64, frozen_layers: 0 }, &Space::default()).unwrap();
    assert!(p.candidates.iter().all(|c| c.overlap == model.overlap));
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn too_few_device_operations_get_a_second_concurrent_session() {
    let (address, runtime, server) = edge_server();
    // Far more device operations wanted than six micro-batches give: a second session
    // sends more, at most `edge::MORE`, and both runs' operations are fitted.
    let s = ProbeSettings { cuts: Some(vec![1]), min_device_ops: 10_000, ..settings() };
    let report = probe(&model(), &[target(address.clone())], &s).unwrap();
    let [c] = &report.concurrent[..] else { panic!("{:?}", report.concurrent) };
    let f = &c.found;
    assert_eq!(f.sessions, 2, "{f:?}");
    assert!(f.edge.ops > 6 && f.edge.ops <= 6 + edge::MORE, "{f:?}");
    assert!(f.edge.mean_fraction > 0.5, "{f:?}");
    let first_run_only = probe(&model(), &[target(address)], &ProbeSettings { min_device_ops: 0, ..s }).unwrap();
    let g = &first_run_only.concurrent[0].found;
    assert_eq!((g.sessions, g.edge.ops), (1, 6), "{g:?}");
    assert!(f.device.ops > g.device.ops, "{f:?} against {g:?}");
    // Both sessions are gone, the second closed with its step unfinished.
    assert!(server.sessions().is_empty(), "{:?}", server.sessions().len());
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn a_frozen_prefix_is_probed_frozen_and_a_dead_server_is_skipped() {
    let (address, runtime, server) = edge_server();
    // A port nothing listens on: bind one, then free it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let s = ProbeSettings { frozen_layers: 1, ..settings() };
    let report = probe(&model(), &[target(dead.clone()), target(address.clone())], &s).unwrap();
    assert!(report.skipped.iter().any(|s| s.starts_with(&dead)), "{:?}", report.skipped);
    let m = &report.measurements;
    assert_eq!(m.servers.len(), 1);
    assert_eq!(m.servers[0].name, address);
    // Cut 0 lies inside the frozen prefix: its device side was timed without a backward,
    // so the backward of layer 0 is known only as part of cut 1's.
    let p = plan(&CostModel::default(), m, &Workload { batch: 64, frozen_layers: 1 }, &Space::default()).unwrap();
    let frozen = p.candidates.iter().find(|c| c.candidate.cut == 0).unwrap();
    assert!(frozen.frozen_device && frozen.stages.device_backward_s == 0.0);
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn a_spent_budget_measures_nothing_and_says_so() {
    let (address, runtime, server) = edge_server();
    let s = ProbeSettings { budget: Duration::ZERO, ..settings() };
    let err = probe(&model(), &[target(address)], &s).unwrap_err();
    assert!(matches!(err, ProbeError::Config(_)) && err.to_string().contains("budget"), "{err}");
    let err = probe(&model(), &[], &settings()).unwrap_err();
    assert!(err.to_string().contains("no edge server"), "{err}");
    let bad = ProbeSettings { cuts: Some(vec![2]), ..settings() };
    let err = probe(&model(), &[target("127.0.0.1:1".into())], &bad).unwrap_err();
    assert!(err.to_string().contains("cut 2 is not a valid cut of the model: valid are [0, 1]"), "{err}");
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn payloads_over_the_servers_message_limit_are_left_out_and_listed() {
    // 1 MiB messages: the model (0.9 MB) fits, and so do the micro-batches of 256 samples,
    // but one of 1024 at cut 0 (1.06 MB up, 1 MiB of gradient down) does not.
    let (address, runtime, server) =
        edge_server_with(edgefreeze_wire::Limits { max_message_bytes: 1 << 20, ..Default::default() });
    let report = probe(&model(), &[target(address.clone())], &ProbeSettings { batch: 1024, ..settings() }).unwrap();
    assert!(
        report.skipped.iter().any(|s| s.contains("1056768 bytes up and 0 down is over its message limit")),
        "{:?}",
        report.skipped
    );
    let measured = &report.link_samples[0].1;
    assert!(measured.iter().all(|s| s.up_bytes < 1 << 20 && s.down_bytes < 1 << 20), "{measured:?}");
    assert!(measured.iter().any(|s| s.up_bytes > 0) && measured.iter().any(|s| s.down_bytes > 0));
    // Cut 1's micro-batches (520 bytes a sample) fit: the edge is measured there.
    assert!(report.measurements.servers[0].at(1).is_some(), "{:?}", report.skipped);
    runtime.block_on(server.shutdown()).unwrap();
}

#[test]
fn a_server_that_never_answers_is_skipped_after_the_timeout() {
    let (address, runtime, server) = edge_server();
    // Accepts connections and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_address = silent.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || silent.incoming().take(4).filter_map(Result::ok).collect::<Vec<_>>());
    let s = ProbeSettings { timeout: Duration::from_millis(500), ..settings() };
    let report = probe(&model(), &[target(silent_address.clone()), target(address.clone())], &s).unwrap();
    assert!(
        report.skipped.iter().any(|s| s.starts_with(&silent_address) && s.contains("no answer")),
        "{:?}",
        report.skipped
    );
    assert_eq!(report.measurements.servers.len(), 1);
    assert_eq!(report.measurements.servers[0].name, address);
    drop(held);
    runtime.block_on(server.shutdown()).unwrap();
}
