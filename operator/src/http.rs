//! The operator's small HTTP server (`--metrics-bind-address`, default `0.0.0.0:8080`, the
//! Deployment's port `http`), served by the server both binaries share ([`vcp_crds::http`]):
//!
//! | path | answer |
//! | --- | --- |
//! | `/metrics` | [`Telemetry::encode`], Prometheus text format |
//! | `/healthz` | `200 ok` while the process serves requests (liveness) |
//! | `/readyz` | `200 ok` when [`Telemetry::is_ready`], else `503` |
//! | `/state` | test feature `reconcile-log` only: `Telemetry::state`, the sizes of the per-object state, one `name value` line each |
//!
//! Anything else is `404`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use vcp_crds::http::{Answer, Limits, OPENMETRICS_TEXT, Site, StatusCode};

use crate::error::{Error, Result};
use crate::telemetry::Telemetry;

/// Binds `addr` for [`serve`] (`127.0.0.1:0` picks a free port: see `local_addr`).
///
/// # Errors
/// [`Error::Bind`] when the address is in use or not local.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    vcp_crds::http::bind(addr).await.map_err(|e| Error::Bind {
        addr: e.addr,
        source: e.source,
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` completes, within
/// [`Limits::operator`] (8 KiB heads, 5 s to send one, 128 connections, one render of
/// `/metrics` per 100 ms; counted as `vcp_operator_http_*`).
///
/// # Errors
/// None today: a failed connection is only logged. The `Result` leaves room for TLS set-up.
pub async fn serve(
    listener: TcpListener,
    telemetry: Arc<Telemetry>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let site = Site {
        paths: "/metrics, /healthz and /readyz",
        limits: Limits::operator(),
        stats: telemetry.http.clone(),
    };
    vcp_crds::http::serve(
        listener,
        site,
        move |path: &str| answer(path, &telemetry),
        shutdown,
    )
    .await;
    Ok(())
}

/// The answer to a request of `path`.
fn answer(path: &str, telemetry: &Telemetry) -> Answer {
    match path {
        "/metrics" => Answer::ok(OPENMETRICS_TEXT, telemetry.encode()),
        "/healthz" => Answer::healthy(),
        #[cfg(feature = "reconcile-log")]
        "/state" => Answer::ok("text/plain", telemetry.state()),
        "/readyz" if telemetry.is_ready() => Answer::healthy(),
        "/readyz" => Answer {
            status: StatusCode::SERVICE_UNAVAILABLE,
            content_type: "text/plain",
            body: "not ready: leader state unknown or controller not started\n".into(),
        },
        _ => Answer::not_found(),
    }
}
