//! The link to one edge server, measured with `Probe` calls: the round trip of an empty
//! call, and payloads of the sizes training will send, up and down.
//!
//! Each call's time is the device's round trip less the server's own time between
//! receiving the request and answering (its two timestamps, on one clock). Of the
//! repetitions of a size the fastest counts: queueing and scheduling only ever add time,
//! so the minimum is the best estimate of what the link itself takes. Then
//! RTT = the empty call's time, and 1/bandwidth is the least-squares slope through the
//! origin of (bytes, time − RTT) over the sizes of each direction (the large payloads
//! weigh the most, where the rate dominates the noise).

use crate::error::{ProbeError, Result};
use edgefreeze_plan::LinkTimes;
use edgefreeze_wire::EdgeClient;
use edgefreeze_wire::pb::{Header, ProbeRequest};
use std::time::{Duration, Instant};
use tonic::Code;

/// The bandwidth reported when a direction is too fast to measure (every payload took
/// no longer than the empty call): 1 TB/s.
pub const UNMEASURABLY_FAST: f64 = 1e12;

/// One timed call.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkSample {
    /// Payload bytes sent up.
    pub up_bytes: u64,
    /// Payload bytes that came down.
    pub down_bytes: u64,
    /// The fastest repetition's time, less the server's.
    pub seconds: f64,
}

/// A size's repetitions stop once it has taken this long (after one timed call): a
/// 3 MB payload at 5 Mbit/s takes 5 s a call.
pub const TIME_PER_SIZE: Duration = Duration::from_secs(2);

/// What a link probe measured.
#[derive(Debug, Clone)]
pub struct LinkProbe {
    /// The link.
    pub times: LinkTimes,
    /// The fastest call of each size.
    pub samples: Vec<LinkSample>,
    /// Sizes the server refused as too large for its message limit.
    pub refused: Vec<(u64, u64)>,
}

/// Times up to `reps` calls of each size (an empty one, each up size, each down size,
/// after one untimed empty call: the connection's first use pays for its setup) and
/// derives the link. Stops early at `deadline` (after the empty call and one size each
/// way); a size the server's message limit refuses is left out and listed; a call not
/// answered within `timeout` fails the probe of this link.
pub async fn probe_link(
    client: &mut EdgeClient,
    address: &str,
    up_sizes: &[u64],
    down_sizes: &[u64],
    reps: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<LinkProbe> {
    let fail = |message: String| ProbeError::Edge { address: address.to_string(), message };
    let mut calls = 0u32;
    // One call: its time less the server's, or `None` when the size is over the limit.
    let mut call = async |up: u64, down: u64| -> Result<Option<f64>> {
        calls += 1;
        let request = ProbeRequest {
            header: Some(Header::new("", 0, calls, 0)),
            payload: vec![0; up as usize],
            reply_bytes: down,
        };
        let start = Instant::now();
        let answer = match tokio::time::timeout(timeout, client.probe(request)).await {
            Err(_) => {
                let t = timeout.as_secs_f64();
                return Err(fail(format!("no answer to a probe of {up} bytes up, {down} down in {t:.1} s")));
            }
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(s)) if (up, down) != (0, 0) && matches!(s.code(), Code::OutOfRange | Code::ResourceExhausted) => {
                return Ok(None);
            }
            Ok(Err(s)) => {
                return Err(fail(format!("probe of {up} bytes up, {down} down: {:?}: {}", s.code(), s.message())));
            }
        };
        let elapsed = start.elapsed().as_secs_f64();
        if answer.payload.len() as u64 != down || answer.header.as_ref().map(|h| h.micro_batch) != Some(calls) {
            return Err(fail(format!(
                "probe {calls}: the answer has {} bytes (asked for {down}) or another probe's header",
                answer.payload.len()
            )));
        }
        let server = answer.sent_unix_nanos.saturating_sub(answer.received_unix_nanos) as f64 * 1e-9;
        Ok(Some((elapsed - server).max(0.0)))
    };
    call(0, 0).await?;
    let mut plan: Vec<(u64, u64)> = vec![(0, 0)];
    plan.extend(up_sizes.iter().map(|&s| (s, 0)));
    plan.extend(down_sizes.iter().map(|&s| (0, s)));
    let (mut samples, mut refused) = (Vec::new(), Vec::new());
    for (i, &(up, down)) in plan.iter().enumerate() {
        let first_each_way = i == 0 || i == 1 || i == 1 + up_sizes.len();
        if Instant::now() >= deadline && !first_each_way {
            continue;
        }
        let started = Instant::now();
        let mut best = f64::INFINITY;
        for rep in 0..reps.max(1) {
            if rep > 0 && started.elapsed() >= TIME_PER_SIZE {
                break;
            }
            match call(up, down).await? {
                Some(t) => best = best.min(t),
                None => break,
            }
        }
        if best.is_finite() {
            samples.push(LinkSample { up_bytes: up, down_bytes: down, seconds: best });
        } else {
            refused.push((up, down));
        }
    }
    Ok(LinkProbe { times: derive(&samples), samples, refused })
}

/// The link from timed calls (see the module's doc).
pub fn derive(samples: &[LinkSample]) -> LinkTimes {
    let rtt_s = samples
        .iter()
        .filter(|s| s.up_bytes == 0 && s.down_bytes == 0)
        .map(|s| s.seconds)
        .fold(f64::INFINITY, f64::min);
    let rtt_s = if rtt_s.is_finite() { rtt_s } else { 0.0 };
    let rate = |bytes: fn(&LinkSample) -> u64| {
        let (mut xy, mut xx) = (0.0, 0.0);
        for s in samples.iter().filter(|s| bytes(s) > 0) {
            let b = bytes(s) as f64;
            xy += b * (s.seconds - rtt_s);
            xx += b * b;
        }
        if xy > 0.0 { (xx / xy).min(UNMEASURABLY_FAST) } else { UNMEASURABLY_FAST }
    };
    LinkTimes { rtt_s, up_bytes_per_s: rate(|s| s.up_bytes), down_bytes_per_s: rate(|s| s.down_bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_is_derived_from_the_fastest_calls() {
        // RTT 10 ms; up at 1e6 B/s, down at 2e6 B/s (exact points).
        let s = |up, down, seconds| LinkSample { up_bytes: up, down_bytes: down, seconds };
        let link = derive(&[
            s(0, 0, 0.010),
            s(100_000, 0, 0.110),
            s(400_000, 0, 0.410),
            s(0, 200_000, 0.110),
            s(0, 1_000_000, 0.510),
        ]);
        assert!((link.rtt_s - 0.010).abs() < 1e-15);
        assert!((link.up_bytes_per_s - 1e6).abs() < 1e-3, "{link:?}");
        assert!((link.down_bytes_per_s - 2e6).abs() < 1e-3, "{link:?}");
        // Payloads no slower than the empty call: too fast to tell.
        let fast = derive(&[s(0, 0, 0.001), s(1000, 0, 0.0009), s(0, 1000, 0.001)]);
        assert_eq!((fast.up_bytes_per_s, fast.down_bytes_per_s), (UNMEASURABLY_FAST, UNMEASURABLY_FAST));
    }
}
