//! The small HTTP/1 server both binaries serve their `/metrics` and probes on (cargo feature
//! `http`): the operator's `--metrics-bind-address` (`operator/src/http.rs`: `/metrics`,
//! `/healthz`, `/readyz`) and the runtime's (`syncer-runtime/src/metrics.rs`: `/metrics`,
//! `/healthz`). Each binary says what a path answers ([`Answer`]); this module binds, accepts and
//! serves until told to stop.
//!
//! Only `GET`-style answers by path: the method, headers and body of a request are not read.
//!
//! # Bounds
//!
//! Any pod that can reach the port can talk to this server, so nothing a client sends may make
//! it grow or stop answering the kubelet's probes ([`Limits`], defaults in [`Limits::operator`]
//! and [`Limits::runtime`]). The bounds follow the Kubernetes API server's and Go's
//! `http.Server` (`ReadHeaderTimeout`, `MaxHeaderBytes`) and controller-runtime's metrics server:
//! - **A request head of at most [`Limits::max_head_bytes`]** (8 KiB): a longer one is answered
//!   `431` and the connection closed. hyper reads into a buffer of at most that size, so a
//!   connection holds a few KiB whatever it sends (an unfinished 400 KB head used to be kept
//!   whole, per connection).
//! - **The whole head within [`Limits::header_read_timeout`]** (5 s) of the connection's start,
//!   else the connection is closed. A client that sends nothing is closed the same way: this is
//!   the idle timeout too.
//! - **One request per connection** (no keep-alive, so no pipelining and no idle connection
//!   between requests): the kubelet's probes open a connection per probe, and a scrape needs one
//!   request.
//! - **At most [`Limits::max_connections`] open connections.** A connection accepted over the
//!   cap closes one that has not sent its whole head yet: the oldest such connection of the
//!   address that holds the most of them ([`slots`]). A legitimate client (a probe, Prometheus)
//!   sends its head at once and is served within milliseconds, while a flood of slow or idle
//!   connections from one pod only pushes out its own. When every
//!   open connection is being served, the new one is closed instead. The accept loop never
//!   spins: a failed accept (out of file descriptors) waits, from 10 ms doubling to 1 s.
//! - **`/metrics` is rendered at most once per [`Limits::metrics_interval`]** (100 ms), and every
//!   request waiting for the next render shares it ([`pacing`]). An answer is always rendered
//!   after its request arrived (never a stale copy); at most [`Limits::metrics_waiters`] requests
//!   wait at once, and one more is answered `429` at once, so waiting scrapes cannot take the
//!   slots the probes need.
//!
//! What the server does under load is counted ([`Stats`], registered by each binary with its
//! prefix: `vcp_operator_http_*`, `vcp_runtime_http_*`).
//!
//! These bound what a client can cost; they do not say who may read. The NetworkPolicy of
//! `config/network-policy` restricts who can reach the operator's port, and `docs/security.md`
//! shows one for the runtime's.

mod pacing;
mod slots;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::server::conn::http1;
use hyper::service::service_fn;

pub use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use pacing::Paced;
use slots::{Admission, Slots};

/// `Content-Type` of a Prometheus text exposition made by `prometheus-client`.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path whose answers are rendered at most once per [`Limits::metrics_interval`].
pub const METRICS_PATH: &str = "/metrics";

/// The answer to `/metrics`: `registry` in the Prometheus text exposition format.
pub fn metrics(registry: &Registry) -> Answer {
    Answer::ok(OPENMETRICS_TEXT, encode(registry))
}

/// `registry` in the Prometheus text exposition format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The answer to one request: status, `Content-Type`, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code.
    pub status: StatusCode,
    /// Value of the `Content-Type` header.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Answer {
    /// `200` with `body` of `content_type`.
    pub fn ok(content_type: &'static str, body: impl Into<String>) -> Self {
        Answer {
            status: StatusCode::OK,
            content_type,
            body: body.into(),
        }
    }

    /// `200 ok` in plain text (a probe that holds).
    pub fn healthy() -> Self {
        Answer::ok("text/plain", "ok\n")
    }

    /// `404 not found` in plain text (a path nothing serves).
    pub fn not_found() -> Self {
        Answer {
            status: StatusCode::NOT_FOUND,
            content_type: "text/plain",
            body: "not found\n".into(),
        }
    }

    /// `429` in plain text: too many `/metrics` requests wait for a render already.
    pub fn too_many_requests() -> Self {
        Answer {
            status: StatusCode::TOO_MANY_REQUESTS,
            content_type: "text/plain",
            body: "too many requests wait for /metrics; retry later\n".into(),
        }
    }
}

/// What one client may cost the server (module docs, "Bounds").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The time a connection has to send its whole request head, from its accept. Also the
    /// longest a connection that sends nothing stays open.
    pub header_read_timeout: Duration,
    /// The largest request head (request line and headers) read, in bytes; at least 8,192
    /// (hyper's smallest read buffer). A longer head is answered `431`.
    pub max_head_bytes: usize,
    /// The most header lines a request may have.
    pub max_headers: usize,
    /// The most connections open at once.
    pub max_connections: usize,
    /// The shortest time between two renders of `/metrics`.
    pub metrics_interval: Duration,
    /// The most `/metrics` requests waiting for a render at once; one more is answered `429`.
    pub metrics_waiters: usize,
}

impl Limits {
    /// The operator's `:8080` (`/metrics`, `/healthz`, `/readyz`): 128 connections.
    pub const fn operator() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_head_bytes: 8 * 1024,
            max_headers: 64,
            max_connections: 128,
            metrics_interval: Duration::from_millis(100),
            metrics_waiters: 8,
        }
    }

    /// A runtime's `:9460+` (`/metrics`, `/healthz`), inside a tenant's vCluster pod: 32
    /// connections, so that a flood holds at most a few hundred KiB of the sidecar's memory.
    pub const fn runtime() -> Self {
        Limits {
            max_connections: 32,
            metrics_waiters: 4,
            ..Limits::operator()
        }
    }
}

/// What the server did under load, for `/metrics` ([`Stats::register`]). Cheap to clone: every
/// field is a shared atomic.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Connections open now.
    pub open: Gauge,
    /// Connections accepted.
    pub accepted: Counter,
    /// Connections closed before their head was complete to make room for a new one.
    pub evicted: Counter,
    /// Connections closed at once because every open connection was being served.
    pub refused: Counter,
    /// Failed accepts (such as out of file descriptors), each followed by a wait.
    pub accept_errors: Counter,
    /// Connections that ended in an error: a head too long or too slow, a reset.
    pub connection_errors: Counter,
    /// Renders of `/metrics`.
    pub renders: Counter,
    /// `/metrics` requests answered `429` because [`Limits::metrics_waiters`] waited already.
    pub throttled: Counter,
}

impl Stats {
    /// Registers the counters in `registry` as `<prefix>_http_*` (such as
    /// `vcp_operator_http_connections`).
    pub fn register(&self, registry: &mut Registry, prefix: &str) {
        let name = |s: &str| format!("{prefix}_http_{s}");
        registry.register(
            name("connections"),
            "Connections open to the HTTP server now",
            self.open.clone(),
        );
        registry.register(
            name("connections_accepted"),
            "Connections the HTTP server accepted",
            self.accepted.clone(),
        );
        registry.register(
            name("connections_evicted"),
            "Connections closed before their request head was complete, to make room under the connection cap",
            self.evicted.clone(),
        );
        registry.register(
            name("connections_refused"),
            "Connections closed at once because every open connection was being served",
            self.refused.clone(),
        );
        registry.register(
            name("accept_errors"),
            "Failed accepts of the HTTP server (such as out of file descriptors), each followed by a wait",
            self.accept_errors.clone(),
        );
        registry.register(
            name("connection_errors"),
            "HTTP connections that ended in an error (a request head too long or too slow, a reset)",
            self.connection_errors.clone(),
        );
        registry.register(
            name("metrics_renders"),
            "Renders of /metrics (at most one per 100 ms, shared by the requests that waited for it)",
            self.renders.clone(),
        );
        registry.register(
            name("metrics_throttled"),
            "/metrics requests answered 429 because too many waited for a render",
            self.throttled.clone(),
        );
    }
}

/// The listening socket could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source} (choose another --metrics-bind-address)")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// The OS error (such as "Address already in use").
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` for [`serve`] (`127.0.0.1:0` picks a free port: see `local_addr`).
///
/// # Errors
/// [`BindError`] when the address is in use or not local.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// What [`serve`] serves: `paths` names it in the start-up log line; `limits` bound every
/// client; `stats` counts what happened.
#[derive(Clone, Debug)]
pub struct Site {
    /// The paths served, for the start-up log line (such as `"/metrics and /healthz"`).
    pub paths: &'static str,
    /// The bounds of every client.
    pub limits: Limits,
    /// The counters of this server.
    pub stats: Stats,
}

/// The first wait after a failed accept; it doubles up to [`ACCEPT_BACKOFF_MAX`].
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait after failed accepts in a row.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The wait after a failed accept that followed `previous` (none: the first of a row).
pub fn accept_backoff(previous: Option<Duration>) -> Duration {
    previous.map_or(ACCEPT_BACKOFF_MIN, |d| (d * 2).min(ACCEPT_BACKOFF_MAX))
}

/// Serves `listener` until `shutdown` completes, within `site.limits` (module docs): each
/// request's path is answered by `answer`, `/metrics` through the render pacing. A failed
/// connection is logged at debug and counted.
pub async fn serve<A>(
    listener: TcpListener,
    site: Site,
    answer: A,
    shutdown: impl Future<Output = ()>,
) where
    A: Fn(&str) -> Answer + Clone + Send + Sync + 'static,
{
    let Site {
        paths,
        limits,
        stats,
    } = site;
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, paths, max_connections = limits.max_connections, "serving HTTP");
    }
    let slots = Slots::new(limits.max_connections, stats.clone());
    let paced = Arc::new(Paced::new(
        limits.metrics_interval,
        limits.metrics_waiters,
        stats.clone(),
    ));
    tokio::pin!(shutdown);
    let mut backoff = None;
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff = None;
                    a
                }
                Err(e) => {
                    stats.accept_errors.inc();
                    let wait = accept_backoff(backoff);
                    backoff = Some(wait);
                    if wait == ACCEPT_BACKOFF_MAX {
                        warn!(error = %e, wait_ms = wait.as_millis() as u64, "accept keeps failing");
                    } else {
                        debug!(error = %e, wait_ms = wait.as_millis() as u64, "accept failed");
                    }
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        stats.accepted.inc();
        let Admission::Admitted(slot) = slots.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let answer = answer.clone();
        let paced = paced.clone();
        let stats = stats.clone();
        tokio::spawn(async move {
            let evicted = slot.evicted();
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                slot.serving();
                let answer = answer.clone();
                let paced = paced.clone();
                async move {
                    let path = req.uri().path();
                    let a = if path == METRICS_PATH {
                        paced.render(|| answer(METRICS_PATH)).await
                    } else {
                        answer(path)
                    };
                    Ok::<_, std::convert::Infallible>(response(a))
                }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_head_bytes.max(8192))
                .max_header_size(limits.max_head_bytes)
                .max_headers(limits.max_headers)
                .keep_alive(false);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                served = connection => if let Err(e) = served {
                    stats.connection_errors.inc();
                    debug!(error = %e, "HTTP connection failed");
                },
                () = evicted => debug!("HTTP connection closed to make room under the cap"),
            }
        });
    }
}

/// `answer` as a hyper response.
fn response(answer: Answer) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(answer.body)));
    *response.status_mut() = answer.status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(answer.content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

#[cfg(test)]
mod tests;
