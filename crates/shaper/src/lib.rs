//! A link shaper for tests and benchmarks: an in-process TCP proxy on loopback that
//! limits the rate and adds a delay in each direction, and whose settings can change
//! while it runs (a device moving away from its edge server).
//!
//! [`Shaper::start`] listens on `127.0.0.1:0` and forwards every connection to a target
//! address. Each direction (up: client → target, down: target → client) is one link
//! shared by all connections, modelled as
//!
//! - **rate**: the link sends one chunk at a time; a chunk of n bytes occupies it for
//!   n / rate seconds, and the shaper reads the next chunk from the sender only when the
//!   link is free, so at most one chunk waits ahead of the wire and the sender is slowed
//!   by TCP's own back-pressure (no hidden queue that would add latency);
//! - **delay**: a chunk is delivered `delay` after it has left the link (propagation), so
//!   several chunks can be in flight at once.
//!
//! So a transfer of N bytes at rate R cannot finish in less than N/R + delay, and a new
//! rate applies from the next chunk on (chunks are at most 5 ms of the link's time, at
//! least 1500 bytes and at most 16 KiB). Without a rate the chunks go as fast as they
//! come. Bytes pass unchanged and in order.
//!
//! It is for tests: traffic stays on loopback, and the delay line holds at most
//! [`DELAY_LINE`] chunks per connection and direction (more than a delay of 1 s at
//! 100 Mbit/s).

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Chunks in flight (in the delay line) per connection and direction.
pub const DELAY_LINE: usize = 1024;
const MAX_CHUNK: usize = 16 << 10;
const MIN_CHUNK: usize = 1500;
/// The longest a chunk may occupy the link: a rate change waits at most this long.
const CHUNK_TIME: f64 = 0.005;

/// One direction's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Bytes per second; `None` is no limit.
    pub rate_bytes_per_s: Option<f64>,
    /// Added one-way delay.
    pub delay: Duration,
}

impl Shape {
    /// No limit and no delay.
    pub const UNLIMITED: Shape = Shape { rate_bytes_per_s: None, delay: Duration::ZERO };

    /// A rate in bytes per second and a one-way delay.
    pub fn new(rate_bytes_per_s: f64, delay: Duration) -> Shape {
        Shape { rate_bytes_per_s: Some(rate_bytes_per_s), delay }
    }

    /// A rate in megabits per second (10^6 bits) and a one-way delay.
    pub fn mbit(mbit_per_s: f64, delay: Duration) -> Shape {
        Shape::new(mbit_per_s * 1e6 / 8.0, delay)
    }

    fn check(&self) -> io::Result<()> {
        match self.rate_bytes_per_s {
            Some(r) if !(r.is_finite() && r > 0.0) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a link rate must be a positive number of bytes per second, not {r}"),
            )),
            _ => Ok(()),
        }
    }

    fn chunk(&self) -> usize {
        self.rate_bytes_per_s.map_or(MAX_CHUNK, |r| ((r * CHUNK_TIME) as usize).clamp(MIN_CHUNK, MAX_CHUNK))
    }
}

#[derive(Debug)]
struct State {
    shape: Shape,
    /// When the link has sent everything scheduled so far.
    free_at: Instant,
    /// Bytes scheduled so far.
    bytes: u64,
}

/// One direction: a link shared by every connection.
#[derive(Debug)]
struct Link(Mutex<State>);

impl Link {
    fn new(shape: Shape) -> Link {
        Link(Mutex::new(State { shape, free_at: Instant::now(), bytes: 0 }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain numbers behind: still usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the link is free, and the size of the next chunk.
    fn next(&self) -> (Instant, usize) {
        let s = self.lock();
        (s.free_at, s.shape.chunk())
    }

    /// Puts `n` bytes read now on the link; returns when they arrive.
    fn schedule(&self, n: usize) -> Instant {
        let mut s = self.lock();
        let start = s.free_at.max(Instant::now());
        s.free_at = match s.shape.rate_bytes_per_s {
            Some(rate) => start + Duration::from_secs_f64(n as f64 / rate),
            None => start,
        };
        s.bytes += n as u64;
        s.free_at + s.shape.delay
    }

    fn set(&self, shape: Shape) -> u64 {
        let mut s = self.lock();
        s.shape = shape;
        s.bytes
    }
}

/// A running shaper.
pub struct Shaper {
    address: SocketAddr,
    up: Arc<Link>,
    down: Arc<Link>,
    accept: tokio::task::JoinHandle<()>,
}

impl Shaper {
    /// Listens on `127.0.0.1:0` and forwards each connection to `target`, shaping `up`
    /// (towards the target) and `down` (back). Runs on the current tokio runtime.
    pub async fn start(target: SocketAddr, up: Shape, down: Shape) -> io::Result<Shaper> {
        up.check()?;
        down.check()?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (up, down) = (Arc::new(Link::new(up)), Arc::new(Link::new(down)));
        let (u, d) = (up.clone(), down.clone());
        let accept = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else {
                            // Out of descriptors, say: back off instead of spinning.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        };
                        connections.spawn(forward(client, target, u.clone(), d.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Shaper { address, up, down, accept })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Changes the up direction from its next chunk on; returns the bytes it had
    /// scheduled up to the change.
    pub fn set_up(&self, shape: Shape) -> io::Result<u64> {
        shape.check()?;
        Ok(self.up.set(shape))
    }

    /// Changes the down direction from its next chunk on; returns the bytes it had
    /// scheduled up to the change.
    pub fn set_down(&self, shape: Shape) -> io::Result<u64> {
        shape.check()?;
        Ok(self.down.set(shape))
    }

    /// Bytes passed (scheduled) so far: up and down.
    pub fn bytes(&self) -> (u64, u64) {
        (self.up.lock().bytes, self.down.lock().bytes)
    }
}

impl Drop for Shaper {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(client: TcpStream, target: SocketAddr, up: Arc<Link>, down: Arc<Link>) {
    let Ok(server) = TcpStream::connect(target).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Each direction ends on its own (a half-close passes through); the connection ends
    // when both have.
    let _ = tokio::join!(pump(client_read, server_write, up), pump(server_read, client_write, down));
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Arc<Link>,
) -> io::Result<()> {
    let (line, mut delivered) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(DELAY_LINE);
    let reader = async move {
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            // Read only once the link is free: the sender waits in TCP, not in a queue here.
            let (free_at, chunk) = link.next();
            tokio::time::sleep_until(free_at).await;
            let n = from.read(&mut buf[..chunk]).await?;
            if n == 0 {
                return Ok(());
            }
            let arrival = link.schedule(n);
            if line.send((arrival, buf[..n].to_vec())).await.is_err() {
                return Ok(());
            }
        }
    };
    let writer = async move {
        while let Some((arrival, chunk)) = delivered.recv().await {
            tokio::time::sleep_until(arrival).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    let (read, write): (io::Result<()>, io::Result<()>) = tokio::join!(reader, writer);
    read.and(write)
}
