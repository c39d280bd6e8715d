//! The operator's small HTTP server (`--metrics-bind-address`, default `0.0.0.0:8080`, the
//! Deployment's port `http`):
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

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::telemetry::Telemetry;

/// Binds `addr` for [`serve`] (`127.0.0.1:0` picks a free port: see `local_addr`).
///
/// # Errors
/// [`Error::Bind`] when the address is in use or not local.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` completes.
///
/// # Errors
/// None today: a failed connection is only logged. The `Result` leaves room for TLS set-up.
pub async fn serve(
    listener: TcpListener,
    telemetry: Arc<Telemetry>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let telemetry = telemetry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let telemetry = telemetry.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&req, &telemetry)) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(error = %e, "HTTP connection failed");
            }
        });
    }
}

/// The answer to one request.
fn answer(req: &Request<Incoming>, telemetry: &Telemetry) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            telemetry.encode(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        #[cfg(feature = "reconcile-log")]
        "/state" => (StatusCode::OK, "text/plain", telemetry.state()),
        "/readyz" if telemetry.is_ready() => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: leader state unknown or controller not started\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}
