//! The runtime's `/metrics` and `/healthz` listener, kept by [`crate::runtime::run`]: a port it
//! cannot listen on does not stop the runtime.
//!
//! The containers of the vCluster's pod share one network namespace. The operator gives each
//! runtime sidecar a port from 9460 that no other container of the pod template declares, but a
//! process that listens on a port its container does not declare (a v1 plugin's image, say)
//! cannot be seen from the template. Before, the runtime then exited at start (`Error::Bind`),
//! and the kubelet restarted it for ever (a crash loop beside vCluster's own containers). Now
//! it syncs on without the listener: [`Listener::failure`] is reported in the plugin's
//! `RuntimeHealthy` (`MetricsUnavailable`, [`crate::status::with_metrics_failure`]) and once as
//! a Warning Event, and the address is tried again on each status tick
//! ([`Listener::retry`]), so the listener comes up as soon as the port is free.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::{info, warn};

use crate::metrics::Metrics;

/// The listener of `/metrics` and `/healthz` on one address, or why there is none.
pub struct Listener {
    addr: Option<SocketAddr>,
    /// Held while serving; dropping it stops the server.
    guard: Option<tokio::sync::oneshot::Sender<()>>,
    /// Why the address cannot be listened on, while it cannot.
    failure: Option<String>,
}

impl Listener {
    /// Listens on `addr` (nothing when `None`) for `metrics`; a failure is kept, not returned.
    pub async fn start(addr: Option<SocketAddr>, metrics: &Arc<Metrics>) -> Self {
        let mut listener = Listener {
            addr,
            guard: None,
            failure: None,
        };
        listener.bind(metrics).await;
        listener
    }

    async fn bind(&mut self, metrics: &Arc<Metrics>) {
        match crate::metrics::serve_while_held(self.addr, metrics).await {
            Ok(guard) => {
                if self.failure.take().is_some() {
                    info!(addr = ?self.addr, "listening on the metrics address again");
                }
                self.guard = guard;
            }
            Err(error) => {
                let failure = format!(
                    "{error}; the runtime syncs on without /metrics and /healthz and tries the \
                     address again every few seconds. Another container of the vCluster's pod \
                     listens on that port: declare it in that container's ports so that \
                     vcluster-plugin-operator gives this runtime another"
                );
                if self.failure.as_ref() != Some(&failure) {
                    warn!(%error, "cannot listen on the metrics address; syncing on without it");
                }
                self.failure = Some(failure);
            }
        }
    }

    /// Tries the address again when it could not be listened on.
    pub async fn retry(&mut self, metrics: &Arc<Metrics>) {
        if self.failure.is_some() {
            self.bind(metrics).await;
        }
    }

    /// Why the address cannot be listened on, while it cannot.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Whether `/metrics` is being served.
    pub fn serving(&self) -> bool {
        self.guard.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_a_failure_kept_and_tried_again() {
        let metrics = Arc::new(Metrics::default());
        let none = Listener::start(None, &metrics).await;
        assert!(none.failure().is_none() && !none.serving());
        // another process holds the port
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let mut l = Listener::start(Some(addr), &metrics).await;
        assert!(!l.serving());
        let failure = l.failure().expect("the failure is kept").to_string();
        assert!(failure.contains(&addr.to_string()), "{failure}");
        // still taken: still failing
        l.retry(&metrics).await;
        assert!(!l.serving() && l.failure().is_some());
        // freed: the next try listens
        drop(holder);
        l.retry(&metrics).await;
        assert!(l.serving(), "{:?}", l.failure());
        assert!(l.failure().is_none());
        assert!(
            std::net::TcpStream::connect(addr).is_ok(),
            "the runtime listens on the freed port"
        );
    }
}
