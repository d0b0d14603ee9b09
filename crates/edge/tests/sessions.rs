//! The edge server on loopback with the whole-model edge side: authentication,
//! accumulation over micro-batches, bad input, isolation of 8 devices, limits, idle
//! timeout, checkpoints and resume, state fetch and put.

mod common;

use common::*;
use edgefreeze_wire::pb::{self, ApplyUpdateRequest, CloseSessionRequest, PutStateRequest};
use edgefreeze_wire::tensor;
use tonic::Code;

const SHAPE: [usize; 4] = [4, 1, 28, 28];
const N: usize = 4 * 784;
const LR: f64 = 0.5;

fn apply(open: &pb::OpenSessionResponse, step: u64, checkpoint: bool) -> ApplyUpdateRequest {
    ApplyUpdateRequest { header: Some(header_of(open, step)), lr: LR, checkpoint, after_last_micro_batch: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_and_unknown_device_are_unauthenticated() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let address = server.local_addr().to_string();
    let limits = edgefreeze_wire::Limits::default();
    for creds in [
        edgefreeze_wire::auth::Credentials::new("phone-0", &token(1)).unwrap(),
        edgefreeze_wire::auth::Credentials::new("phone-99", &token(0)).unwrap(),
    ] {
        let mut c = edgefreeze_wire::connect(&address, creds, &limits).await.unwrap();
        let status = c.open_session(open_request("run", split_request("mlp", 0, 1, true), None)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        let (_, status) = stream(&mut c, vec![]).await;
        assert_eq!(status.unwrap().code(), Code::Unauthenticated);
    }
    assert!(lines.contains("wrong token for device \"phone-0\""), "{}", lines.dump());
    assert!(lines.contains("unknown device \"phone-99\""), "{}", lines.dump());
    assert!(server.sessions().is_empty());
    server.shutdown().await.unwrap();
}

/// Two micro-batches of 4 summed on the edge and applied once give the update of the
/// whole batch of 8. Tolerance: the two sides sum the 8 samples' gradients in different
/// orders in f32 (relative error ~1e-7 per element, a few ulp over 8 terms); 1e-5 on
/// the relative L2 of the update is ten times what that allows and far below a real bug
/// (a missing micro-batch is an error of ~50%).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn micro_batches_accumulate_into_one_update() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let open = c.open_session(open_request("run", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
    assert!(!open.returns_activation_grad);
    assert_eq!(open.activation.as_ref().unwrap().dims, vec![-1, 1, 28, 28]);
    let x = noise(1, 2 * N);
    let y = labels(1, 8, 10);
    let ups = vec![up(&open, 0, 0, &x[..N], &SHAPE, &y[..4]), up(&open, 0, 1, &x[N..], &SHAPE, &y[4..])];
    let (downs, status) = stream(&mut c, ups).await;
    assert!(status.is_none(), "{status:?}\n{}", lines.dump());
    assert_eq!(downs.len(), 2);
    for (i, d) in downs.iter().enumerate() {
        let h = d.header.as_ref().unwrap();
        assert_eq!((h.step, h.micro_batch), (0, i as u32));
        assert!(d.loss.is_finite() && d.loss > 0.0);
        assert!(d.activation_grad.is_none());
        let t = d.times.unwrap();
        assert!(t.received_unix_nanos <= t.compute_start_unix_nanos);
        assert!(t.compute_start_unix_nanos < t.compute_end_unix_nanos);
        assert!(t.compute_end_unix_nanos <= t.sent_unix_nanos);
    }
    let applied = c.apply_update(apply(&open, 0, false)).await.unwrap().into_inner();
    assert_eq!(applied.header.as_ref().unwrap().step, 1);
    assert_eq!(applied.state_bytes, open.state_bytes);

    let before = initial_parameters("mlp");
    let local = local_gradients("mlp", &x, &[8, 1, 28, 28], &y);
    let after = fetch(&mut c, &open, 1).await;
    for ((name, p0), (_, g)) in before.iter().zip(&local) {
        let p1 = f32s(&after.iter().find(|(n, _)| n == name).unwrap().1);
        let edge_update: Vec<f32> = p1.iter().zip(p0).map(|(a, b)| a - b).collect();
        let local_update: Vec<f32> = g.iter().map(|g| -(LR as f32) * g).collect();
        let err = rel_l2(&edge_update, &local_update);
        assert!(err < 1e-5, "{name}: relative L2 error {err:e} of the update");
    }
    let report = server.sessions();
    assert_eq!(report.len(), 1);
    assert_eq!((report[0].device_id.as_str(), report[0].step), ("phone-0", 1));
    // 235,146 f32 parameters plus their f64 gradient sums.
    assert_eq!(report[0].state_bytes, 235_146 * 12);
    server.shutdown().await.unwrap();
}

/// Every kind of bad message is refused with its status and a log line, and leaves the
/// session as it was: the same micro-batch, sent correctly afterwards, is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_refused_and_change_nothing() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let open = c.open_session(open_request("run", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
    let x = noise(2, N);
    let y = labels(2, 4, 10);
    let good = || up(&open, 0, 0, &x, &SHAPE, &y);

    let mut cases: Vec<(&str, pb::MicroBatchUp, Code, &str)> = Vec::new();
    let mut m = good();
    m.activation.as_mut().unwrap().data.pop();
    cases.push(("short data", m, Code::InvalidArgument, "needs 12544"));
    let mut m = good();
    m.activation = Some(tensor::encode(&[4, 784], &x).unwrap());
    cases.push(("wrong shape", m, Code::InvalidArgument, "where the session expects batch×1×28×28"));
    let mut m = good();
    m.labels = Some(tensor::encode(&[4], &[0f32; 4]).unwrap());
    cases.push(("wrong dtype", m, Code::InvalidArgument, "dtype DTYPE_F32 where the session expects DTYPE_I64"));
    let mut m = good();
    m.labels = Some(tensor::encode(&[3], &y[..3]).unwrap());
    cases.push(("label count", m, Code::InvalidArgument, "3 labels for an activation of 4 samples"));
    let mut m = good();
    m.activation.as_mut().unwrap().dtype = 42;
    cases.push(("unknown dtype", m, Code::InvalidArgument, "unknown dtype 42"));
    let mut m = good();
    m.header.as_mut().unwrap().model_version += 7;
    cases.push(("stale version", m, Code::FailedPrecondition, "stale model version"));
    let mut m = good();
    m.header.as_mut().unwrap().micro_batch = 1;
    cases.push(("out of order", m, Code::FailedPrecondition, "expects micro-batch 0 of step 0, got micro-batch 1"));
    let mut m = good();
    m.header.as_mut().unwrap().micro_batch = 5;
    cases.push(("no such micro-batch", m, Code::InvalidArgument, "has 2 micro-batches per step"));
    let mut m = good();
    m.header.as_mut().unwrap().step = 3;
    cases.push(("wrong step", m, Code::FailedPrecondition, "for step 3 but session"));
    let mut m = good();
    m.header = None;
    cases.push(("no header", m, Code::InvalidArgument, "has no header"));
    let mut m = good();
    m.dropout_seed = Some(1);
    cases.push(("unexpected seed", m, Code::InvalidArgument, "no Dropout"));

    for (what, message, code, text) in cases {
        let (downs, status) = stream(&mut c, vec![message]).await;
        let status = status.unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(downs.is_empty(), "{what}");
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(status.message().contains(text), "{what}: {:?}", status.message());
        assert!(lines.contains(text), "{what}: no log line\n{}", lines.dump());
    }
    // Applying before the step's micro-batches arrived is refused too.
    let status = c.apply_update(apply(&open, 0, false)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("0 of 2 micro-batches received"), "{status:?}");

    // A bad message behind a good one on the same stream: the good one is answered,
    // the stream then ends with the bad one's status, and the session moved by one.
    let mut bad = up(&open, 0, 1, &x, &SHAPE, &y);
    bad.activation.as_mut().unwrap().shape = vec![4, 1, 28];
    let (downs, status) = stream(&mut c, vec![good(), bad]).await;
    assert_eq!(downs.len(), 1);
    assert_eq!(status.unwrap().code(), Code::InvalidArgument);
    let (downs, status) = stream(&mut c, vec![up(&open, 0, 1, &x, &SHAPE, &y)]).await;
    assert!(status.is_none() && downs.len() == 1, "{status:?}");
    c.apply_update(apply(&open, 0, false)).await.unwrap();
    server.shutdown().await.unwrap();
}

/// An update asked for before its step's micro-batches (`after_last_micro_batch`, as the
/// device sends it with its last activation) is held, applied right after the last
/// micro-batch's reply has left, and gives the same parameters bit for bit as one asked
/// for afterwards. A held update is answered unapplied when a micro-batch of its step
/// fails or another call comes first, and the session stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_asked_for_early_is_applied_after_the_last_micro_batch() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let x = noise(3, 2 * N);
    let y = labels(3, 8, 10);
    let ups = |open: &pb::OpenSessionResponse, step: u64| {
        vec![up(open, step, 0, &x[..N], &SHAPE, &y[..4]), up(open, step, 1, &x[N..], &SHAPE, &y[4..])]
    };
    let spare = c.clone();
    let early = |open: &pb::OpenSessionResponse, step: u64, lr: f64| {
        let mut c = spare.clone();
        let request = ApplyUpdateRequest { lr, after_last_micro_batch: true, ..apply(open, step, false) };
        tokio::spawn(async move { c.apply_update(request).await })
    };
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(200));

    // The reference: the update asked for after both replies.
    let late = c.open_session(open_request("late", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
    let (_, status) = stream(&mut c, ups(&late, 0)).await;
    assert!(status.is_none(), "{status:?}");
    c.apply_update(apply(&late, 0, false)).await.unwrap();
    let reference = fetch(&mut c, &late, 1).await;

    let open =
        c.open_session(open_request("early", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
    let held = early(&open, 0, LR);
    settle().await;
    assert!(!held.is_finished(), "an update asked for before any micro-batch must wait for them");
    let (downs, status) = stream(&mut c, ups(&open, 0)).await;
    assert!(status.is_none() && downs.len() == 2, "{status:?}\n{}", lines.dump());
    let applied = held.await.unwrap().unwrap().into_inner();
    assert_eq!(applied.header.as_ref().unwrap().step, 1);
    assert!(applied.compute_start_unix_nanos >= downs[1].times.unwrap().sent_unix_nanos);
    let after = fetch(&mut c, &open, 1).await;
    for ((name, a), (_, b)) in after.iter().zip(&reference) {
        assert_eq!(f32s(a), f32s(b), "{name}");
    }

    // A bad learning rate is refused at once, not held.
    let status = early(&open, 1, f64::NAN).await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // A micro-batch of the step fails: the held update is answered unapplied.
    let held = early(&open, 1, LR);
    settle().await;
    let mut bad = ups(&open, 1);
    bad[1].activation.as_mut().unwrap().shape = vec![4, 1, 28];
    let (downs, status) = stream(&mut c, bad).await;
    assert_eq!((downs.len(), status.unwrap().code()), (1, Code::InvalidArgument));
    let status = held.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("not applied: a micro-batch of its step failed"), "{status:?}");
    assert_eq!(server.sessions().iter().find(|s| s.id == open.header.as_ref().unwrap().session_id).unwrap().step, 1);
    // The step goes on from its one good micro-batch; the update asked for late.
    let (_, status) = stream(&mut c, vec![ups(&open, 1).remove(1)]).await;
    assert!(status.is_none(), "{status:?}");
    c.apply_update(apply(&open, 1, false)).await.unwrap();

    // Another call before the step's micro-batches: the held update is answered unapplied.
    let held = early(&open, 2, LR);
    settle().await;
    fetch(&mut c, &open, 2).await;
    let status = held.await.unwrap().unwrap_err();
    assert!(status.message().contains("a state fetch came before the step's last micro-batch"), "{status:?}");
    assert!(lines.contains("update of step 2 not applied"), "{}", lines.dump());
    server.shutdown().await.unwrap();
}

/// Eight devices train at once on one server, each with its own data and session; each
/// ends with the parameters of its own local computation, and none can use another's
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_devices_train_in_isolation() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut tasks = Vec::new();
    for d in 0..DEVICES {
        let mut c = client(&server, d).await;
        tasks.push(tokio::spawn(async move {
            let open =
                c.open_session(open_request("run", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
            let x = noise(100 + d as u64, 2 * N);
            let y = labels(100 + d as u64, 8, 10);
            let ups = vec![up(&open, 0, 0, &x[..N], &SHAPE, &y[..4]), up(&open, 0, 1, &x[N..], &SHAPE, &y[4..])];
            let (downs, status) = stream(&mut c, ups).await;
            assert!(status.is_none(), "device {d}: {status:?}");
            assert_eq!(downs.len(), 2);
            c.apply_update(apply(&open, 0, false)).await.unwrap();
            let after = fetch(&mut c, &open, 1).await;
            (open, x, y, after)
        }));
    }
    let mut opened = Vec::new();
    for t in tasks {
        opened.push(t.await.unwrap());
    }
    assert_eq!(server.sessions().len(), DEVICES);
    let before = initial_parameters("mlp");
    for (d, (_, x, y, after)) in opened.iter().enumerate() {
        let local = local_gradients("mlp", x, &[8, 1, 28, 28], y);
        for ((name, p0), (_, g)) in before.iter().zip(&local) {
            let p1 = f32s(&after.iter().find(|(n, _)| n == name).unwrap().1);
            let update: Vec<f32> = p1.iter().zip(p0).map(|(a, b)| a - b).collect();
            let expected: Vec<f32> = g.iter().map(|g| -(LR as f32) * g).collect();
            let err = rel_l2(&update, &expected);
            assert!(err < 1e-5, "device {d} {name}: relative L2 error {err:e}");
        }
    }
    // Device 1 cannot read, change, feed or close device 0's session.
    let victim = &opened[0].0;
    let mut thief = client(&server, 1).await;
    let h = Some(header_of(victim, 1));
    let denied = |s: tonic::Status| assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    denied(thief.fetch_state(pb::FetchStateRequest { header: h.clone() }).await.unwrap_err());
    denied(thief.apply_update(apply(victim, 1, false)).await.unwrap_err());
    denied(thief.put_state(PutStateRequest { header: h.clone(), tensors: vec![] }).await.unwrap_err());
    denied(thief.close_session(CloseSessionRequest { header: h.clone() }).await.unwrap_err());
    let x = noise(7, N);
    let (_, status) = stream(&mut thief, vec![up(victim, 1, 0, &x, &SHAPE, &labels(7, 4, 10))]).await;
    denied(status.unwrap());
    assert!(lines.contains("belongs to another device"));
    assert_eq!(server.sessions().iter().find(|s| s.device_id == "phone-0").unwrap().step, 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_refuses_new_sessions() {
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    cfg.max_sessions = 2;
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    let a = c.open_session(open_request("a", split_request("mlp", 0, 1, true), None)).await.unwrap().into_inner();
    c.open_session(open_request("b", split_request("mlp", 0, 1, true), None)).await.unwrap();
    let status = c.open_session(open_request("c", split_request("mlp", 0, 1, true), None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("2 sessions of at most 2 (--max-sessions)"), "{status:?}");
    // Closing one makes room.
    c.close_session(CloseSessionRequest { header: Some(header_of(&a, 0)) }).await.unwrap();
    c.open_session(open_request("c", split_request("mlp", 0, 1, true), None)).await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bigger_than_the_limit_is_refused() {
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    cfg.max_session_bytes = 1 << 20;
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    let status = c.open_session(open_request("a", split_request("mlp", 0, 1, true), None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("needs 2821752 bytes of state, over this server's limit of 1048576"),
        "{status:?}"
    );
    assert!(server.sessions().is_empty());
    server.shutdown().await.unwrap();
}

/// A device that goes away mid-step: its session is freed after the idle timeout (here
/// 200 ms), and a late message finds it gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_session_is_freed_after_the_idle_timeout() {
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    cfg.idle_timeout = SHORT;
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    let open = c.open_session(open_request("run", split_request("mlp", 0, 2, true), None)).await.unwrap().into_inner();
    let x = noise(3, N);
    let (downs, _) = stream(&mut c, vec![up(&open, 0, 0, &x, &SHAPE, &labels(3, 4, 10))]).await;
    assert_eq!(downs.len(), 1);
    let mut waited = 0;
    while !server.sessions().is_empty() {
        assert!(waited < 100, "session not freed after {waited} × 100 ms");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        waited += 1;
    }
    assert!(lines.contains("freed after 0.2 s without a call"), "{}", lines.dump());
    let (_, status) = stream(&mut c, vec![up(&open, 0, 1, &x, &SHAPE, &labels(3, 4, 10))]).await;
    assert_eq!(status.unwrap().code(), Code::NotFound);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused() {
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    let server_limits = edgefreeze_wire::Limits { max_message_bytes: 4 << 20, ..Default::default() };
    cfg.limits = server_limits;
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    let open = c.open_session(open_request("run", split_request("mlp", 0, 1, true), None)).await.unwrap().into_inner();
    assert_eq!(open.max_message_bytes, 4 << 20);
    let big = 2048;
    let x = noise(4, big * 784);
    let (_, status) = stream(&mut c, vec![up(&open, 0, 0, &x, &[big, 1, 28, 28], &labels(4, big, 10))]).await;
    let status = status.unwrap();
    assert!(matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted), "{status:?}");
    // The session is untouched: a normal micro-batch still goes through.
    let x = noise(4, N);
    let (downs, status) = stream(&mut c, vec![up(&open, 0, 0, &x, &SHAPE, &labels(4, 4, 10))]).await;
    assert!(status.is_none() && downs.len() == 1, "{status:?}");
    server.shutdown().await.unwrap();
}

/// A server without a state folder applies an update that asks for a checkpoint and
/// answers that it wrote none (the device warns that its run cannot be resumed), and
/// refuses to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_state_folder_updates_apply_but_write_no_checkpoint() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let split = split_request("mlp", 0, 1, true);
    let open = c.open_session(open_request("run-1", split.clone(), None)).await.unwrap().into_inner();
    let (_, status) = stream(&mut c, vec![up(&open, 0, 0, &noise(5, N), &SHAPE, &labels(5, 4, 10))]).await;
    assert!(status.is_none(), "{status:?}");
    let applied = c.apply_update(apply(&open, 0, true)).await.unwrap().into_inner();
    assert!(!applied.checkpointed);
    assert_eq!(applied.header.unwrap().step, 1, "the update was applied");
    let status = c.open_session(open_request("run-1", split, Some(1))).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("keeps no checkpoints"), "{status:?}");
    server.shutdown().await.unwrap();
}

/// With a state folder, a run's edge state after an update with `checkpoint` is on disk;
/// reopening the run at that step restores it exactly, a step without a checkpoint or
/// another split is refused, and a new run with a taken name is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumes_from_its_edge_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    cfg.state_dir = Some(dir.path().to_path_buf());
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    let split = split_request("mlp", 0, 1, true);
    let open = c.open_session(open_request("run-1", split.clone(), None)).await.unwrap().into_inner();
    let x = noise(5, N);
    let y = labels(5, 4, 10);
    for step in 0..2 {
        let (_, status) = stream(&mut c, vec![up(&open, step, 0, &x, &SHAPE, &y)]).await;
        assert!(status.is_none(), "{status:?}");
        let applied = c.apply_update(apply(&open, step, step == 1)).await.unwrap().into_inner();
        assert_eq!(applied.checkpointed, step == 1);
    }
    let trained = fetch(&mut c, &open, 2).await;
    assert!(dir.path().join("phone-0/run-1/step-0000000002.safetensors").exists());
    assert!(dir.path().join("phone-0/run-1/step-0000000000.safetensors").exists());

    let status = c.open_session(open_request("run-1", split.clone(), None)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("already holds run \"run-1\""), "{status:?}");
    let status = c.open_session(open_request("run-1", split.clone(), Some(1))).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("checkpoints of the run are at steps [0, 2]"), "{status:?}");
    let status = c.open_session(open_request("run-1", split_request("mlp", 0, 2, true), Some(2))).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("started with another split request"), "{status:?}");
    let status = c.open_session(open_request("other", split.clone(), Some(2))).await.unwrap_err();
    assert!(status.message().contains("holds no run \"other\""), "{status:?}");
    // Another device cannot resume this device's run: its runs live under its own id.
    let mut other = client(&server, 1).await;
    let status = other.open_session(open_request("run-1", split.clone(), Some(2))).await.unwrap_err();
    assert!(status.message().contains("holds no run \"run-1\" of device \"phone-1\""), "{status:?}");

    // The device restarts: resuming the run replaces its old session.
    let resumed = c.open_session(open_request("run-1", split.clone(), Some(2))).await.unwrap().into_inner();
    assert_eq!(resumed.header.as_ref().unwrap().step, 2);
    assert_ne!(resumed.header.as_ref().unwrap().session_id, open.header.as_ref().unwrap().session_id);
    assert_eq!(server.sessions().len(), 1);
    assert!(lines.contains("replaced by a new session of run \"run-1\""));
    assert_eq!(fetch(&mut c, &resumed, 2).await, trained);
    let (_, status) = stream(&mut c, vec![up(&resumed, 2, 0, &x, &SHAPE, &y)]).await;
    assert!(status.is_none(), "{status:?}");
    server.shutdown().await.unwrap();
}

/// State moves between sessions (migration): fetched from one, put into another of the
/// same split; a state that does not fit is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_moves_between_sessions() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let mut c = client(&server, 0).await;
    let a = c.open_session(open_request("a", split_request("mlp", 0, 1, true), None)).await.unwrap().into_inner();
    let x = noise(6, N);
    stream(&mut c, vec![up(&a, 0, 0, &x, &SHAPE, &labels(6, 4, 10))]).await;
    c.apply_update(apply(&a, 0, false)).await.unwrap();
    let state = c.fetch_state(pb::FetchStateRequest { header: Some(header_of(&a, 1)) }).await.unwrap().into_inner();

    let b = c.open_session(open_request("b", split_request("mlp", 0, 1, true), None)).await.unwrap().into_inner();
    let mut partial = state.tensors.clone();
    partial.pop();
    let status = c.put_state(PutStateRequest { header: Some(header_of(&b, 1)), tensors: partial }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("missing"), "{status:?}");
    let put =
        c.put_state(PutStateRequest { header: Some(header_of(&b, 1)), tensors: state.tensors.clone() }).await.unwrap();
    assert_eq!(put.into_inner().header.unwrap().step, 1);
    assert_eq!(fetch(&mut c, &b, 1).await, fetch(&mut c, &a, 1).await);
    server.shutdown().await.unwrap();
}
