//! **Test-only fault point** of both binaries (`vcluster-plugin-operator`,
//! `vcluster-plugin-syncer`): the process dies (or freezes) right after its n-th write.
//!
//! When the environment variable [`ABORT_AFTER_WRITES_ENV`] (`VCP_FAULT_ABORT_AFTER_WRITES`)
//! holds a positive integer `n` at start-up, the binary's clients ([`AbortAfterWrites`], a tower
//! layer on every request the process sends, one count for all its clients) call [`std::process::abort`] as soon as the
//! API server has answered the n-th *write* with a 2xx status, before the operator sees the
//! answer. `abort` raises `SIGABRT`: like `SIGKILL`, no destructor, no graceful shutdown and no
//! Lease release runs, so the process dies exactly between two writes, which is what
//! `tests/tests/faults_operator_kill.rs` needs to show that every write boundary is safe to die at.
//! With [`STOP_AFTER_WRITES_ENV`] (`VCP_FAULT_STOP_AFTER_WRITES`) instead, the process stops
//! itself with `SIGSTOP` at that point, so that a test can send it a real `SIGKILL` at exactly
//! that boundary (or `SIGCONT`).
//!
//! A write is a `POST`, `PUT`, `PATCH` or `DELETE` that is not a dry run (`dryRun=` in the
//! query) and not to a `coordination.k8s.io` Lease (Lease renewals depend on time, not on the
//! work done). Events count: they are writes too.
//!
//! With [`WRITES_MATCHING_ENV`] (`VCP_FAULT_WRITES_MATCHING=<text>`) only writes whose request
//! path contains `<text>` count (such as `/apis/example.loft.sh/`: the runtime dies right after its first host
//! Car create, before any status report that could count it).
//!
//! Unset, the layer does nothing but pass requests through. An unparsable value is an error at
//! start-up, never silently ignored.
//!
//! The module exists only with the crate's `test-faults` feature, which only the test crate
//! enables (through the operator's and the runtime's features of the same name): release
//! builds have no fault layer and no `VCP_FAULT_*` variable at all (tests/tests/packaging_dockerfile.rs
//! searches the image replay's binaries for the text).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use ::http::{Method, Request, Response};

/// The environment variable read once at start-up: abort after this many writes.
pub const ABORT_AFTER_WRITES_ENV: &str = "VCP_FAULT_ABORT_AFTER_WRITES";
/// The environment variable read once at start-up: stop (`SIGSTOP`) after this many writes.
pub const STOP_AFTER_WRITES_ENV: &str = "VCP_FAULT_STOP_AFTER_WRITES";

/// The environment variable read once at start-up: only writes whose path contains it count.
pub const WRITES_MATCHING_ENV: &str = "VCP_FAULT_WRITES_MATCHING";

/// What happens at the fault point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// [`std::process::abort`]: `SIGABRT`, nothing runs after it.
    Abort,
    /// `SIGSTOP` to itself: frozen until a signal from outside (`SIGKILL`, `SIGCONT`).
    Stop,
}

/// A tower layer that aborts the process right after the n-th successful write (see the
/// module documentation); inert when made with `None`.
#[derive(Clone, Debug)]
pub struct AbortAfterWrites {
    /// Writes left before the abort; `None`: never abort.
    left: Option<Arc<AtomicU64>>,
    action: FaultAction,
    /// Only writes whose path contains this count; `None`: all.
    matching: Option<Arc<str>>,
}

impl AbortAfterWrites {
    /// Takes `action` after `n` writes; `None` (or 0) never does.
    pub fn new(n: Option<u64>, action: FaultAction) -> Self {
        AbortAfterWrites {
            left: n.filter(|n| *n > 0).map(|n| Arc::new(AtomicU64::new(n))),
            action,
            matching: None,
        }
    }

    /// Counts only the writes whose request path contains `text`.
    pub fn matching(mut self, text: Option<String>) -> Self {
        self.matching = text.filter(|t| !t.is_empty()).map(Arc::from);
        self
    }

    /// The layer [`ABORT_AFTER_WRITES_ENV`] or [`STOP_AFTER_WRITES_ENV`] asks for: inert when
    /// both are unset or empty.
    ///
    /// # Errors
    /// A value that is not a non-negative integer, or both variables set.
    pub fn from_env() -> Result<Self, String> {
        let read = |name: &str| match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a number of writes")),
            _ => Ok(None),
        };
        let layer = match (read(ABORT_AFTER_WRITES_ENV)?, read(STOP_AFTER_WRITES_ENV)?) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "set {ABORT_AFTER_WRITES_ENV} or {STOP_AFTER_WRITES_ENV}, not both"
                ));
            }
            (Some(n), None) => AbortAfterWrites::new(Some(n), FaultAction::Abort),
            (None, n) => AbortAfterWrites::new(n, FaultAction::Stop),
        };
        Ok(layer.matching(std::env::var(WRITES_MATCHING_ENV).ok()))
    }
}

/// Whether a request with `method` to `uri` counts as a write (see the module documentation).
pub fn is_write(method: &Method, uri: &::http::Uri) -> bool {
    let mutating = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let dry_run = uri.query().is_some_and(|q| q.contains("dryRun="));
    let lease = uri.path().starts_with("/apis/coordination.k8s.io/");
    mutating && !dry_run && !lease
}

impl<S> tower::Layer<S> for AbortAfterWrites {
    type Service = AbortAfterWritesService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AbortAfterWritesService {
            inner,
            left: self.left.clone(),
            action: self.action,
            matching: self.matching.clone(),
        }
    }
}

/// The service of [`AbortAfterWrites`].
#[derive(Clone, Debug)]
pub struct AbortAfterWritesService<S> {
    inner: S,
    left: Option<Arc<AtomicU64>>,
    action: FaultAction,
    matching: Option<Arc<str>>,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for AbortAfterWritesService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let counted = self
            .left
            .clone()
            .filter(|_| is_write(req.method(), req.uri()))
            .filter(|_| {
                self.matching
                    .as_deref()
                    .is_none_or(|m| req.uri().path().contains(m))
            });
        let answer = self.inner.call(req);
        let action = self.action;
        Box::pin(async move {
            let res = answer.await;
            if let (Some(left), Ok(response)) = (counted, &res)
                && response.status().is_success()
                && left.fetch_sub(1, Ordering::SeqCst) == 1
            {
                eprintln!("fault point: {action:?} after the last counted write");
                match action {
                    FaultAction::Abort => std::process::abort(),
                    // SAFETY: raise(3) has no memory-safety preconditions; SIGSTOP cannot be
                    // caught, so no handler runs.
                    FaultAction::Stop => unsafe {
                        libc::raise(libc::SIGSTOP);
                    },
                }
            }
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_mutating_requests_other_than_dry_runs_and_leases() {
        let uri = |s: &str| s.parse::<::http::Uri>().unwrap();
        let sts = "/apis/apps/v1/namespaces/a/statefulsets/vc?fieldManager=x&force=true";
        assert!(is_write(&Method::PATCH, &uri(sts)));
        assert!(is_write(
            &Method::POST,
            &uri("/apis/events.k8s.io/v1/namespaces/a/events")
        ));
        assert!(is_write(
            &Method::DELETE,
            &uri("/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles/r")
        ));
        assert!(!is_write(&Method::GET, &uri(sts)));
        assert!(!is_write(
            &Method::PATCH,
            &uri("/apis/apps/v1/namespaces/a/statefulsets/vc?dryRun=All&fieldManager=x")
        ));
        assert!(!is_write(
            &Method::PATCH,
            &uri("/apis/coordination.k8s.io/v1/namespaces/vcp-system/leases/l")
        ));
    }

    #[test]
    fn unset_or_zero_never_aborts() {
        assert!(
            AbortAfterWrites::new(None, FaultAction::Abort)
                .left
                .is_none()
        );
        assert!(
            AbortAfterWrites::new(Some(0), FaultAction::Abort)
                .left
                .is_none()
        );
        assert!(
            AbortAfterWrites::new(Some(3), FaultAction::Stop)
                .left
                .is_some()
        );
    }
}
