//! The shaper on loopback: bytes pass unchanged, a rate is a lower bound on a transfer's
//! time (sleeps never end early, so the bounds hold on any machine), and a change of rate
//! applies to the bytes after it. Every wait is bounded by a timeout.

use edgefreeze_shaper::{Shape, Shaper};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

const BOUND: Duration = Duration::from_secs(60);

/// A server that echoes what it reads.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    address
}

/// A server that reads everything and reports its running count of bytes, then the total.
async fn sink() -> (SocketAddr, mpsc::UnboundedReceiver<(Instant, usize)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0;
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
            let _ = tx.send((Instant::now(), total));
        }
    });
    (address, rx)
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pass_unchanged_both_ways_on_concurrent_connections() {
    let shaper =
        Shaper::start(echo().await, Shape::mbit(200.0, Duration::from_millis(1)), Shape::mbit(100.0, Duration::ZERO))
            .await
            .unwrap();
    let address = shaper.local_addr();
    let mut clients = Vec::new();
    for seed in 0..3u64 {
        clients.push(tokio::spawn(async move {
            let data = pattern(300_000 + seed as usize * 7919, seed);
            let stream = TcpStream::connect(address).await.unwrap();
            let (mut r, mut w) = stream.into_split();
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                w.write_all(&sent).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut back = Vec::new();
            r.read_to_end(&mut back).await.unwrap();
            writer.await.unwrap();
            assert!(back == data, "connection {seed}: {} bytes back of {}, or changed", back.len(), data.len());
            data.len() as u64
        }));
    }
    let mut total = 0;
    for c in clients {
        total += timeout(BOUND, c).await.unwrap().unwrap();
    }
    assert_eq!(shaper.bytes(), (total, total));
}

/// Sends `n` bytes through a shaper to a sink; returns when the send started and when the
/// sink had the last byte.
async fn transfer(n: usize, up: Shape) -> (Instant, Instant) {
    let (target, mut counts) = sink().await;
    let shaper = Shaper::start(target, up, Shape::UNLIMITED).await.unwrap();
    let start = Instant::now();
    let mut s = TcpStream::connect(shaper.local_addr()).await.unwrap();
    s.write_all(&pattern(n, 1)).await.unwrap();
    s.shutdown().await.unwrap();
    let mut last = start;
    while let Some((at, total)) = timeout(BOUND, counts.recv()).await.unwrap() {
        last = at;
        if total == n {
            break;
        }
    }
    (start, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_at_rate_r_takes_at_least_size_over_r_plus_the_delay() {
    // 200 kB at 400 kB/s with 30 ms of delay: at least 0.53 s.
    let (start, end) = transfer(200_000, Shape::new(400_000.0, Duration::from_millis(30))).await;
    let bound = Duration::from_secs_f64(200_000.0 / 400_000.0) + Duration::from_millis(30);
    assert!(end - start >= bound, "{:?} < {bound:?}", end - start);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delay_applies_to_each_direction_of_a_round_trip() {
    let delay = Duration::from_millis(40);
    let shaper = Shaper::start(echo().await, Shape::new(1e9, delay), Shape::new(1e9, delay)).await.unwrap();
    let mut s = TcpStream::connect(shaper.local_addr()).await.unwrap();
    for _ in 0..3 {
        let start = Instant::now();
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        timeout(BOUND, s.read_exact(&mut back)).await.unwrap().unwrap();
        assert_eq!(&back, b"ping");
        assert!(start.elapsed() >= 2 * delay, "a round trip took {:?}", start.elapsed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_applies_to_the_bytes_after_it() {
    // 256 KiB at 256 KiB/s; once the sink has an eighth, the rate drops to 128 KiB/s: the
    // bytes not yet scheduled take at least (their count)/(128 KiB/s) after the change.
    let n = 256 << 10;
    let (target, mut counts) = sink().await;
    let shaper =
        Shaper::start(target, Shape::new(f64::from(256 << 10), Duration::ZERO), Shape::UNLIMITED).await.unwrap();
    let mut s = TcpStream::connect(shaper.local_addr()).await.unwrap();
    let writer = tokio::spawn(async move {
        s.write_all(&pattern(n, 2)).await.unwrap();
        s.shutdown().await.unwrap();
    });
    loop {
        let (_, total) = timeout(BOUND, counts.recv()).await.unwrap().unwrap();
        if total >= n / 8 {
            break;
        }
    }
    let slow = f64::from(128 << 10);
    let changed = Instant::now();
    let scheduled = shaper.set_up(Shape::new(slow, Duration::ZERO)).unwrap() as usize;
    // The change came mid-transfer (at full rate the rest would take 0.875 s).
    assert!(scheduled < n * 3 / 4, "{scheduled} of {n} bytes had gone before the change");
    let last = loop {
        let (at, total) = timeout(BOUND, counts.recv()).await.unwrap().unwrap();
        if total == n {
            break at;
        }
    };
    writer.await.unwrap();
    let bound = Duration::from_secs_f64((n - scheduled) as f64 / slow);
    assert!(last - changed >= bound, "{:?} after the change < {bound:?}", last - changed);

    // Raising the rate applies too: 1 MB that would take 1000 s at 1 kB/s goes through
    // (bounded by the test's timeout) once the limit is lifted.
    let (target, mut counts) = sink().await;
    let shaper = Shaper::start(target, Shape::new(1000.0, Duration::ZERO), Shape::UNLIMITED).await.unwrap();
    let mut s = TcpStream::connect(shaper.local_addr()).await.unwrap();
    let writer = tokio::spawn(async move {
        s.write_all(&pattern(1_000_000, 3)).await.unwrap();
        s.shutdown().await.unwrap();
    });
    let (_, first) = timeout(BOUND, counts.recv()).await.unwrap().unwrap();
    assert!(first <= 1500, "the first chunk at 1 kB/s is at most 1500 bytes, got {first}");
    shaper.set_up(Shape::UNLIMITED).unwrap();
    loop {
        let (_, total) = timeout(BOUND, counts.recv()).await.unwrap().unwrap();
        if total == 1_000_000 {
            break;
        }
    }
    timeout(BOUND, writer).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_rate_of_zero_is_refused() {
    let address: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let err = Shaper::start(address, Shape::new(0.0, Duration::ZERO), Shape::UNLIMITED).await.err().unwrap();
    assert!(err.to_string().contains("positive number of bytes per second"), "{err}");
}
