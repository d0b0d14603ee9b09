//! `edgefreeze edge shape`: an emulated link in front of an edge server, for benchmarks
//! (the delay netem would add, and the mobility case's degrading link): the in-process
//! shaper of `edgefreeze-shaper` on 127.0.0.1, with a rate and half the round trip's
//! delay each way, and a schedule of rate changes.

use anyhow::{Context, Result, bail};
use clap::Args;
use edgefreeze_shaper::{Shape, Shaper};
use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// `edgefreeze edge shape`.
#[derive(Debug, Args)]
pub struct ShapeArgs {
    /// The edge server's address (HOST:PORT); the proxy listens on 127.0.0.1 at a free
    /// port, printed on start.
    #[arg(long)]
    pub to: String,
    /// Uplink rate (towards the server), Mbit/s (10^6 bits); default no limit.
    #[arg(long)]
    pub up_mbit: Option<f64>,
    /// Downlink rate, Mbit/s; default no limit.
    #[arg(long)]
    pub down_mbit: Option<f64>,
    /// Round-trip time to add, milliseconds (half of it each way).
    #[arg(long, default_value_t = 0.0)]
    pub rtt_ms: f64,
    /// Rate changes while it runs, SECONDS:UP_MBIT:DOWN_MBIT (seconds after the start),
    /// comma-separated, e.g. 40:1:1 (the mobility case: the device moves away).
    #[arg(long = "change", value_delimiter = ',')]
    pub changes: Vec<String>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 3600.0)]
    pub for_s: f64,
}

/// One scheduled rate change.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Change {
    after: Duration,
    up_mbit: f64,
    down_mbit: f64,
}

fn rate(what: &str, mbit: f64) -> Result<f64> {
    if !(mbit.is_finite() && mbit > 0.0) {
        bail!("{what} must be a positive number of Mbit/s, not {mbit}");
    }
    Ok(mbit)
}

fn parse_change(text: &str) -> Result<Change> {
    let parts: Vec<&str> = text.split(':').collect();
    let [after, up, down] = parts.as_slice() else {
        bail!("--change {text:?}: expected SECONDS:UP_MBIT:DOWN_MBIT");
    };
    let number = |s: &str, what: &str| -> Result<f64> {
        s.trim().parse::<f64>().with_context(|| format!("--change {text:?}: {what} {s:?} is not a number"))
    };
    let after = number(after, "seconds")?;
    if !(after.is_finite() && after >= 0.0) {
        bail!("--change {text:?}: the seconds must be 0 or more");
    }
    Ok(Change {
        after: Duration::from_secs_f64(after),
        up_mbit: rate(&format!("--change {text:?}: the uplink rate"), number(up, "uplink rate")?)?,
        down_mbit: rate(&format!("--change {text:?}: the downlink rate"), number(down, "downlink rate")?)?,
    })
}

/// Runs `edge shape` until `--for` is over.
pub fn run(args: &ShapeArgs) -> Result<()> {
    let target: SocketAddr = args
        .to
        .to_socket_addrs()
        .with_context(|| format!("--to {}", args.to))?
        .next()
        .with_context(|| format!("--to {}: no address", args.to))?;
    if !(args.rtt_ms.is_finite() && args.rtt_ms >= 0.0) {
        bail!("--rtt-ms must be 0 or more");
    }
    if !(args.for_s.is_finite() && args.for_s > 0.0) {
        bail!("--for-s must be a positive number of seconds");
    }
    let delay = Duration::from_secs_f64(args.rtt_ms / 2e3);
    let shape = |mbit: Option<f64>, what: &str| -> Result<Shape> {
        Ok(match mbit {
            Some(m) => Shape::mbit(rate(what, m)?, delay),
            None => Shape { rate_bytes_per_s: None, delay },
        })
    };
    let (up, down) = (shape(args.up_mbit, "--up-mbit")?, shape(args.down_mbit, "--down-mbit")?);
    let mut changes: Vec<Change> = args.changes.iter().map(|c| parse_change(c)).collect::<Result<_>>()?;
    changes.sort_by_key(|c| c.after);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(async {
        let shaper = Shaper::start(target, up, down).await.context("starting the shaper")?;
        let started = tokio::time::Instant::now();
        println!("shaping {} -> {target}", shaper.local_addr());
        std::io::stdout().flush()?;
        let end = started + Duration::from_secs_f64(args.for_s);
        for c in changes {
            let at = started + c.after;
            if at >= end {
                break;
            }
            tokio::time::sleep_until(at).await;
            shaper.set_up(Shape::mbit(c.up_mbit, delay))?;
            shaper.set_down(Shape::mbit(c.down_mbit, delay))?;
            eprintln!("{:.1} s: up {} Mbit/s, down {} Mbit/s", c.after.as_secs_f64(), c.up_mbit, c.down_mbit);
        }
        tokio::time::sleep_until(end).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reads_seconds_and_both_rates() {
        let c = parse_change("40:1:2.5").unwrap();
        assert_eq!(c, Change { after: Duration::from_secs(40), up_mbit: 1.0, down_mbit: 2.5 });
    }

    #[test]
    fn a_bad_change_names_what_is_wrong() {
        let e = format!("{:#}", parse_change("40:1").unwrap_err());
        assert!(e.contains("SECONDS:UP_MBIT:DOWN_MBIT"), "{e}");
        let e = format!("{:#}", parse_change("x:1:1").unwrap_err());
        assert!(e.contains("seconds \"x\""), "{e}");
        let e = format!("{:#}", parse_change("1:0:1").unwrap_err());
        assert!(e.contains("uplink rate must be a positive"), "{e}");
    }
}
