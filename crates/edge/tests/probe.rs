//! The Probe call: payloads up and down for the device to time its link, with the same
//! authentication and message limits as every other call.

mod common;

use common::*;
use edgefreeze_wire::pb::{Header, ProbeRequest};
use tonic::Code;

fn probe(n: u32, payload: usize, reply_bytes: u64) -> ProbeRequest {
    ProbeRequest { header: Some(Header::new("", 0, n, 0)), payload: vec![7; payload], reply_bytes }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_carry_payloads_both_ways_within_the_limits() {
    let lines = Lines::default();
    let mut cfg = config(whole_model_builder(), &lines);
    cfg.limits = edgefreeze_wire::Limits { max_message_bytes: 1 << 20, ..Default::default() };
    let server = start(cfg).await;
    let mut c = client(&server, 0).await;
    for (n, up, down) in [(0, 0, 0), (1, 300_000, 0), (2, 0, 300_000), (3, 1000, (1 << 20) - 1024)] {
        let before = edgefreeze_wire::unix_nanos_now();
        let answer = c.probe(probe(n, up, down)).await.unwrap().into_inner();
        assert_eq!(answer.header.unwrap().micro_batch, n, "the answer echoes the probe's header");
        assert_eq!(answer.payload.len() as u64, down);
        assert!(answer.payload.iter().all(|&b| b == 0));
        assert!(before <= answer.received_unix_nanos && answer.received_unix_nanos <= answer.sent_unix_nanos);
    }
    // An answer bigger than the limit allows is refused before it is built, naming the field.
    let status = c.probe(probe(4, 0, (1 << 20) - 1023)).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("reply_bytes"), "{status:?}");
    assert!(lines.contains("probe of device phone-0: refused a reply"), "{}", lines.dump());
    // So is a request bigger than the server's message limit.
    let status = c.probe(probe(5, 2 << 20, 0)).await.unwrap_err();
    assert!(matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted), "{status:?}");
    // And one without a header.
    let status = c.probe(ProbeRequest { header: None, payload: vec![], reply_bytes: 0 }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_need_a_device_token() {
    let lines = Lines::default();
    let server = start(config(whole_model_builder(), &lines)).await;
    let creds = edgefreeze_wire::auth::Credentials::new("phone-0", &token(1)).unwrap();
    let mut c = edgefreeze_wire::connect(&server.local_addr().to_string(), creds, &Default::default()).await.unwrap();
    let status = c.probe(probe(0, 10, 10)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        lines.contains("probe: refused: authentication failed: wrong token for device \"phone-0\""),
        "{}",
        lines.dump()
    );
    server.shutdown().await.unwrap();
}
