//! The server on real loopback sockets: each bound of the module docs, as a client that breaks
//! it would meet it.

use super::*;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A `GET path` on a new connection; the whole raw answer.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    raw
}

/// Reads until the peer closes (`Ok` with what was read) or `within` passes (`Err`).
async fn closed_within(s: &mut TcpStream, within: Duration) -> Result<String, ()> {
    let mut raw = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut raw)).await {
        Ok(_) => Ok(String::from_utf8_lossy(&raw).into_owned()),
        Err(_) => Err(()),
    }
}

/// Waits up to 5 s for the server to have accepted `n` connections in all.
async fn accepted(stats: &Stats, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.accepted.get() < n {
        assert!(
            Instant::now() < deadline,
            "accepted {}",
            stats.accepted.get()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A server on a free loopback port answering `/x`, `/healthz` and `/metrics` (the number of
/// renders so far), stopped when the returned sender is dropped.
async fn start(limits: Limits) -> (SocketAddr, Stats, tokio::sync::oneshot::Sender<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stats = Stats::default();
    let site = Site {
        paths: "/x, /healthz, /metrics",
        limits,
        stats: stats.clone(),
    };
    let renders = stats.renders.clone();
    tokio::spawn(serve(
        listener,
        site,
        move |path: &str| match path {
            "/x" => Answer::ok("text/plain", "x 1\n"),
            "/healthz" => Answer::healthy(),
            "/metrics" => Answer::ok(OPENMETRICS_TEXT, format!("renders {}\n", renders.get())),
            _ => Answer::not_found(),
        },
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stats, stop)
}

#[tokio::test]
async fn answers_each_path_and_stops_on_shutdown() {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let site = Site {
        paths: "/x",
        limits: Limits::runtime(),
        stats: Stats::default(),
    };
    let server = tokio::spawn(serve(
        listener,
        site,
        |path: &str| match path {
            "/x" => Answer::ok("text/plain", "x 1\n"),
            _ => Answer::not_found(),
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let x = get(addr, "/x").await;
    assert!(x.starts_with("HTTP/1.1 200"), "{x}");
    assert!(x.to_lowercase().contains("content-type: text/plain"), "{x}");
    // one request per connection: the server says so and closes
    assert!(x.to_lowercase().contains("connection: close"), "{x}");
    assert!(x.ends_with("x 1\n"), "{x}");
    assert!(get(addr, "/y").await.starts_with("HTTP/1.1 404"));
    drop(stop);
    server.await.unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed once served"
    );
    let taken = bind(addr).await;
    assert!(taken.is_ok(), "the port is free again: {taken:?}");
}

#[tokio::test]
async fn a_head_over_the_limit_is_answered_431_and_closed() {
    let (addr, stats, _stop) = start(Limits::runtime()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // An unfinished head of 400 KB, as in the attack: the server stops reading at 8 KiB.
    let mut head = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Fill: ".to_vec();
    head.resize(400 * 1024, b'a');
    // The server may close while the client still writes: a reset then ends the write.
    let _ = s.write_all(&head).await;
    let answer = closed_within(&mut s, Duration::from_secs(5))
        .await
        .expect("the connection is closed, not left open");
    // RFC 6585 section 5: 431 Request Header Fields Too Large.
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert_eq!(stats.connection_errors.get(), 1);
}

#[tokio::test]
async fn a_head_not_finished_in_time_is_closed_and_so_is_a_silent_client() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::runtime()
    };
    let (addr, stats, _stop) = start(limits).await;
    let began = Instant::now();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /x HTTP/1.1\r\nHost:").await.unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    for s in [&mut slow, &mut silent] {
        let answer = closed_within(s, Duration::from_secs(5))
            .await
            .expect("closed by the header-read timeout");
        // hyper answers a head that timed out with 408 when it had begun, nothing otherwise
        assert!(!answer.contains("200 OK"), "{answer:?}");
    }
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "not before the timeout: {took:?}"
    );
    assert!(
        stats.accepted.get() >= 2,
        "both were accepted first: {:?}",
        stats
    );
    assert_eq!(stats.open.get(), 0, "both slots are free again");
}

#[tokio::test]
async fn a_flood_of_slow_connections_holds_the_cap_and_the_probe_is_answered() {
    let limits = Limits {
        max_connections: 8,
        ..Limits::runtime()
    };
    let (addr, stats, _stop) = start(limits).await;
    // 40 connections that never finish their heads, the oldest first
    let mut flood = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /x HTTP/1.1\r\nX: ").await.unwrap();
        flood.push(s);
    }
    // every connection was accepted (the accept loop runs on), and the server waits for them
    accepted(&stats, 40).await;
    assert!(stats.open.get() <= 8, "open {}", stats.open.get());
    assert_eq!(stats.evicted.get(), 32, "each over the cap evicted one");
    // the probe is answered at once, by evicting the oldest slow connection
    let probe = tokio::time::timeout(Duration::from_secs(2), get(addr, "/healthz"))
        .await
        .expect("the probe is answered while the flood is held");
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
    // the oldest connections were closed, the newest are still open
    let oldest = closed_within(&mut flood[0], Duration::from_secs(2)).await;
    assert!(oldest.is_ok(), "the oldest slow connection was closed");
    assert!(
        closed_within(&mut flood[39], Duration::from_millis(200))
            .await
            .is_err(),
        "the newest slow connection is still open"
    );
    assert!(stats.open.get() <= 8, "open {}", stats.open.get());
}

#[tokio::test]
async fn metrics_floods_share_renders() {
    let (addr, stats, _stop) = start(Limits {
        metrics_waiters: 64,
        ..Limits::operator()
    })
    .await;
    let began = Instant::now();
    let requests: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { get(addr, "/metrics").await }))
        .collect();
    for r in requests {
        let answer = r.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let took = began.elapsed();
    // At most one render per 100 ms since the first: fewer renders than requests, and never
    // more than the interval allows.
    let renders = stats.renders.get();
    let allowed = 1 + (took.as_millis() / 100) as u64;
    assert!(
        renders <= allowed && renders < 50,
        "{renders} renders for 50 requests in {took:?}"
    );
}

#[test]
fn accept_waits_double_up_to_a_second() {
    let mut waits = Vec::new();
    let mut previous = None;
    for _ in 0..9 {
        let w = accept_backoff(previous);
        waits.push(w.as_millis());
        previous = Some(w);
    }
    assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
}

#[tokio::test]
async fn a_probe_from_another_address_outlives_a_flood_while_its_head_is_still_unread() {
    let limits = Limits {
        max_connections: 8,
        ..Limits::runtime()
    };
    let (addr, stats, _stop) = start(limits).await;
    let slow = || async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /x HTTP/1.1\r\nX: ").await.unwrap();
        s
    };
    let mut flood = Vec::new();
    for _ in 0..8 {
        flood.push(slow().await);
    }
    accepted(&stats, 8).await;
    // The probe connects from another loopback address (as the kubelet's come from the node's
    // address, not the flooding pod's) and is accepted before it has sent a byte.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut probe = socket.connect(addr).await.unwrap();
    accepted(&stats, 9).await;
    // 40 more from the flood while the probe's head is still unread: each closes one of the
    // flood's own
    for _ in 0..40 {
        flood.push(slow().await);
    }
    accepted(&stats, 49).await;
    assert_eq!(stats.evicted.get(), 41);
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("the probe's connection is still open");
    let answer = closed_within(&mut probe, Duration::from_secs(2))
        .await
        .expect("the probe is answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}
