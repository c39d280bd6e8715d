//! The small HTTP/1 server both binaries serve their `/metrics` and probes on (cargo feature
//! `http`): the operator's `--metrics-bind-address` (`operator/src/http.rs`: `/metrics`,
//! `/healthz`, `/readyz`) and the runtime's (`syncer-runtime/src/metrics.rs`: `/metrics`,
//! `/healthz`). Each binary says what a path answers ([`Answer`]); this module binds, accepts and
//! serves until told to stop.
//!
//! Only `GET`-style answers by path: the method, headers and body of a request are not read.

use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::server::conn::http1;
use hyper::service::service_fn;

pub use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info};

/// `Content-Type` of a Prometheus text exposition made by `prometheus-client`.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The answer to `/metrics`: `registry` in the Prometheus text exposition format.
pub fn metrics(registry: &prometheus_client::registry::Registry) -> Answer {
    Answer::ok(OPENMETRICS_TEXT, encode(registry))
}

/// `registry` in the Prometheus text exposition format.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
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

/// Serves `listener` until `shutdown` completes: each request's path is answered by `answer`
/// (one HTTP/1 connection per task; a failed accept or connection is only logged at debug).
/// `paths` names what is served, for the start-up log line.
pub async fn serve<A>(
    listener: TcpListener,
    paths: &'static str,
    answer: A,
    shutdown: impl Future<Output = ()>,
) where
    A: Fn(&str) -> Answer + Clone + Send + Sync + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, paths, "serving HTTP");
    }
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let answer = answer.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let a = answer(req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(response(a)) }
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
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        raw
    }

    #[tokio::test]
    async fn answers_each_path_and_stops_on_shutdown() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            "/x",
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
        assert!(x.ends_with("x 1\n"), "{x}");
        assert!(get(addr, "/y").await.starts_with("HTTP/1.1 404"));
        drop(stop);
        server.await.unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the listener is closed once served"
        );
        let taken = bind(addr).await;
        assert!(taken.is_ok(), "the port is free again: {taken:?}");
    }
}
