//! Errors of the operator. Each message says what failed and on which object, so that a log
//! line or an Event is actionable without reading the code.

use thiserror::Error;

/// Everything that can make a reconcile, or [`crate::run`], fail.
///
/// A failed reconcile is retried by [`crate::controller::error_policy`]; conditions a user can
/// fix in their `VClusterPlugin` (the vCluster does not exist, a name conflict) are *not*
/// errors: they become a `Ready=False` condition instead (see [`crate::status`]).
#[derive(Debug, Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What the operator was doing, such as `apply StatefulSet ns/name`.
        action: String,
        /// The client error (HTTP status and the API server's message).
        #[source]
        source: kube::Error,
    },

    /// Adding or removing the finalizer `vcp.dev/cleanup` failed (a JSON patch whose `test`
    /// operation guards against a concurrent change of `metadata.finalizers`).
    #[error("{action} finalizer vcp.dev/cleanup of VClusterPlugin {object}: {source}")]
    Finalizer {
        /// `add` or `remove`.
        action: &'static str,
        /// `namespace/name` of the plugin.
        object: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },

    /// The finalizer `vcp.dev/cleanup` was added to a VClusterPlugin whose spec had changed
    /// since it was read, and the plugin read again no longer carried it (someone removed it
    /// meanwhile) or was gone ([`crate::finalizer::with_finalizer`]).
    #[error(
        "the finalizer vcp.dev/cleanup added to VClusterPlugin {object} was gone when the \
         plugin was read again; the reconcile is retried"
    )]
    FinalizerLost {
        /// `namespace/name` of the plugin.
        object: String,
    },

    /// The API server's answer to a write of a VClusterPlugin could not be read, not even
    /// without its status ([`vcp_crds::tolerant`]): the write was made, but its result is
    /// unknown to the operator.
    #[error(
        "the answer to {action} of VClusterPlugin {object} cannot be read: {error} (fix or \
         re-create the object; the operator reports it with reason Undecodable)"
    )]
    Undecodable {
        /// What the operator was doing, such as `add finalizer`.
        action: &'static str,
        /// `namespace/name` of the plugin.
        object: String,
        /// The decoding error with its JSON path.
        error: String,
    },

    /// A watch cache of the controller stopped before it was filled (the controller is
    /// shutting down).
    #[error("a watch cache of the operator was closed before it held its initial list")]
    CacheClosed,

    /// An object from the watch cache lacks a field the API server always sets.
    #[error("VClusterPlugin without {0}: the API server always sets it, so this is a bug")]
    MissingField(&'static str),

    /// The leader-election Lease cannot be read, created or renewed.
    #[error(
        "leader election on Lease {lease}: {source} (the operator needs get/create/patch on \
         leases in that namespace: config/rbac/leader_election_role.yaml; or run without \
         --leader-elect)"
    )]
    Lease {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The lease manager's error.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },

    /// `--lease-duration` too short to renew the Lease before it expires.
    #[error("--lease-duration {0}s is too short: use at least 2 seconds (default 15)")]
    LeaseDuration(u64),

    /// A plugin's removal waited for its vCluster's lock ([`crate::vcluster::DELETE_WAIT`])
    /// while other reconciles converged that vCluster; it gives its reconcile slot back and is
    /// retried.
    #[error(
        "the workload of vCluster {vcluster} was being converged by other reconciles for {waited:?}; the removal is retried"
    )]
    WorkloadBusy {
        /// `namespace/name` of the vCluster.
        vcluster: String,
        /// How long the removal waited.
        waited: std::time::Duration,
    },

    /// The HTTP server cannot listen.
    #[error(
        "cannot listen on {addr} for /metrics, /healthz and /readyz: {source} (choose another \
         --metrics-bind-address)"
    )]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps a client error with the action that failed.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }

    /// A short, low-cardinality reason for the `vcp_reconcile_errors_total` metric: the API
    /// server's status reason (such as `Conflict`, `Forbidden`, `NotFound`) when there is one,
    /// else the kind of failure.
    pub fn metric_reason(&self) -> String {
        match self {
            Error::Kube { source, .. } => kube_reason(source),
            Error::Finalizer { source, .. } => kube_reason(source),
            Error::FinalizerLost { .. } => "FinalizerLost".into(),
            Error::Undecodable { .. } => "Undecodable".into(),
            Error::CacheClosed => "CacheClosed".into(),
            Error::MissingField(_) => "MissingField".into(),
            Error::Lease { .. } | Error::LeaseDuration(_) => "Lease".into(),
            Error::Bind { .. } => "Bind".into(),
            Error::WorkloadBusy { .. } => "WorkloadBusy".into(),
        }
    }
}

/// The status reason of an API error, else `Transport`.
fn kube_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.reason.is_empty() => s.reason.clone(),
        kube::Error::Api(s) => format!("HTTP{}", s.code),
        _ => "Transport".into(),
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
