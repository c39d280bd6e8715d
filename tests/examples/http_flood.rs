//! A hostile HTTP client, run from a pod on the real node by `tests/tests/cluster/attack_http.rs`
//! (built into an image there): what any pod that can reach a port may send it.
//!
//! ```text
//! http_flood <host:port> heads   <connections> <head-bytes> <seconds>   # unfinished request heads, in rounds
//! http_flood <host:port> idle    <connections> <seconds>                # connections that send nothing
//! http_flood <host:port> metrics <connections> <seconds>                # pipelined GET /metrics, as fast as answered
//! ```
//!
//! Stops by itself after `<seconds>`. Prints one line `FLOOD mode=.. opened=.. failed=..
//! closed_by_server=.. answers=..` (connections opened, connects that failed, connections the
//! server closed, answers read) and exits 0; exits 2 on bad arguments.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Default)]
struct Tally {
    opened: AtomicU64,
    failed: AtomicU64,
    closed_by_server: AtomicU64,
    answers: AtomicU64,
}

fn usage() -> ! {
    eprintln!(
        "usage: http_flood <host:port> heads <connections> <head-bytes> <seconds>\n       \
         http_flood <host:port> idle <connections> <seconds>\n       \
         http_flood <host:port> metrics <connections> <seconds>"
    );
    std::process::exit(2)
}

fn number(arg: Option<&String>) -> u64 {
    arg.and_then(|a| a.parse().ok()).unwrap_or_else(|| usage())
}

/// As many open files as the hard limit allows (an idle flood needs tens of thousands).
fn raise_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Waits until the server closes `stream` or `until`; counts a close.
async fn hold(mut stream: TcpStream, until: Instant, tally: &Tally) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout_at(until.into(), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    if closed.is_ok() {
        tally.closed_by_server.fetch_add(1, Ordering::Relaxed);
    }
}

/// One connection that sends `bytes` of a request head that never ends, then holds it.
async fn unfinished_head(addr: SocketAddr, bytes: usize, until: Instant, tally: Arc<Tally>) {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        tally.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    tally.opened.fetch_add(1, Ordering::Relaxed);
    let mut sent = 0;
    let start = b"GET /metrics HTTP/1.1\r\nHost: flood\r\nX-Fill: ";
    if s.write_all(start).await.is_err() {
        tally.closed_by_server.fetch_add(1, Ordering::Relaxed);
        return;
    }
    sent += start.len();
    let chunk = vec![b'a'; 16 * 1024];
    while sent < bytes {
        let n = chunk.len().min(bytes - sent);
        if s.write_all(&chunk[..n]).await.is_err() {
            tally.closed_by_server.fetch_add(1, Ordering::Relaxed);
            return;
        }
        sent += n;
    }
    hold(s, until, &tally).await;
}

/// One connection that sends nothing and holds it.
async fn idle(addr: SocketAddr, until: Instant, tally: Arc<Tally>) {
    match TcpStream::connect(addr).await {
        Ok(s) => {
            tally.opened.fetch_add(1, Ordering::Relaxed);
            hold(s, until, &tally).await;
        }
        Err(_) => {
            tally.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One connection that sends 16 pipelined `GET /metrics` at a time and reads what comes back,
/// reconnecting when the server closes, until `until`.
async fn pipelined_metrics(addr: SocketAddr, until: Instant, tally: Arc<Tally>) {
    let requests = "GET /metrics HTTP/1.1\r\nHost: flood\r\n\r\n".repeat(16);
    let mut buf = vec![0u8; 64 * 1024];
    while Instant::now() < until {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tally.opened.fetch_add(1, Ordering::Relaxed);
        loop {
            if Instant::now() >= until || s.write_all(requests.as_bytes()).await.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    tally.closed_by_server.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Ok(Ok(n)) => {
                    let answers = buf[..n].windows(9).filter(|w| w == b"HTTP/1.1 ").count();
                    tally.answers.fetch_add(answers as u64, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr: SocketAddr = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage());
    let mode = args.get(1).map(String::as_str).unwrap_or_else(|| usage());
    raise_open_files();
    let tally = Arc::new(Tally::default());
    let mut tasks = tokio::task::JoinSet::new();
    match mode {
        "heads" => {
            let connections = number(args.get(2));
            let bytes = usize::try_from(number(args.get(3))).unwrap_or(usize::MAX);
            let end = Instant::now() + Duration::from_secs(number(args.get(4)));
            // rounds of `connections`, each held 3 s, as the attack repeated itself
            while Instant::now() < end {
                let until = (Instant::now() + Duration::from_secs(3)).min(end);
                for _ in 0..connections {
                    tasks.spawn(unfinished_head(addr, bytes, until, tally.clone()));
                }
                while tasks.join_next().await.is_some() {}
            }
        }
        "idle" => {
            let connections = number(args.get(2));
            let until = Instant::now() + Duration::from_secs(number(args.get(3)));
            for _ in 0..connections {
                tasks.spawn(idle(addr, until, tally.clone()));
            }
            while tasks.join_next().await.is_some() {}
        }
        "metrics" => {
            let connections = number(args.get(2));
            let until = Instant::now() + Duration::from_secs(number(args.get(3)));
            for _ in 0..connections {
                tasks.spawn(pipelined_metrics(addr, until, tally.clone()));
            }
            while tasks.join_next().await.is_some() {}
        }
        _ => usage(),
    }
    println!(
        "FLOOD mode={mode} opened={} failed={} closed_by_server={} answers={}",
        tally.opened.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.closed_by_server.load(Ordering::Relaxed),
        tally.answers.load(Ordering::Relaxed),
    );
}
