#![warn(missing_docs)]
//! vcluster-plugin-operator: the controller for `VClusterPlugin` (`vcp.dev/v1alpha1`).
//!
//! It installs each plugin into its vCluster's workload and RBAC, reports status, and removes
//! it cleanly on delete. The contract is `shared/DESIGN.md` ("API", "Operator contract");
//! each rule lives in one module:
//!
//! | rule | module |
//! | --- | --- |
//! | containers / init containers / volumes applied to the workload, conflicts, zero-write convergence | [`workload`] |
//! | Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules derived from `syncedTypes` | [`rbac`] |
//! | `observedGeneration`, `phase`, conditions, `lastTransitionTime` | [`status`] |
//! | the install path: finalizer added, every refusal judged before any write (`VClusterNotFound`, `UnknownType`, `VClusterRoleNotFound`), workload, RBAC, status, requeue | [`install`] |
//! | adding and removing the finalizer `vcp.dev/cleanup` | [`finalizer`] |
//! | the removal on delete: exactly what was added, a missing workload does not block it | [`cleanup`] |
//! | server-side apply under one field manager, zero writes once converged, deletes only of the plugin's own objects, Events | [`writes`] |
//! | which RBAC rules a plugin may grant, what its container may ask for (`PolicyDenied`) | [`policy`] |
//! | each plugin's part judged by server-side dry runs before the apply, the namespace's Pod Security level (`InvalidWorkload`, `PolicyDenied`) | [`judge`] |
//! | watches, mappers, reconcile, retries | [`controller`] |
//! | state shared by reconciles, one lock per workload | [`context`] |
//! | watch caches the install path reads, discovery cache | [`cache`] |
//! | `vcluster-plugin-operator import`: Helm values (`plugin:` / `plugins:`) to VClusterPlugins | [`import`] |
//! | leader election on a Lease | [`leader`] |
//! | metrics, health and readiness | [`telemetry`], served by [`http`] |
//!
//! Tests and the binary start the operator with [`run`] (or [`run_until`]) and a [`Config`].

pub mod cache;
pub mod cleanup;
pub mod context;
pub mod controller;
pub mod error;
pub mod finalizer;
pub mod http;
pub mod import;
pub mod install;
pub mod judge;
pub mod leader;
pub mod operations;
pub mod policy;
pub mod rbac;
pub mod status;
pub mod telemetry;
pub mod workload;
pub mod writes;

use std::future::Future;
use std::sync::Arc;

pub use error::Error;
pub use leader::LeaderElection;
pub use telemetry::Telemetry;

/// The embedded runtime's image at this crate's version:
/// `ghcr.io/vcp-dev/vcluster-plugin-operator:<version>` (one image holds both binaries).
pub fn default_runtime_image() -> String {
    format!(
        "ghcr.io/vcp-dev/vcluster-plugin-operator:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// How to run the operator.
#[derive(Clone)]
pub struct Config {
    /// Client with the operator's identity (RBAC: `config/rbac/`).
    pub client: kube::Client,
    /// Image of the embedded-runtime sidecar; default [`default_runtime_image`].
    pub runtime_image: String,
    /// Reconciles running at once (0: unbounded); default 4.
    pub concurrency: u16,
    /// `reportingInstance` of the Events (such as the pod name); default: none.
    pub instance: Option<String>,
    /// Which RBAC rules a plugin may grant; default [`policy::Policy::default`] (DESIGN.md).
    pub policy: policy::Policy,
    /// Leader election: only the holder of the Lease reconciles; default: none (this replica
    /// always reconciles).
    pub leader_election: Option<LeaderElection>,
    /// Metrics and readiness, shared with [`http::serve`]; default: fresh.
    pub telemetry: Arc<Telemetry>,
}

impl Config {
    /// The defaults, with `client`.
    pub fn new(client: kube::Client) -> Self {
        Config {
            client,
            runtime_image: default_runtime_image(),
            concurrency: 4,
            instance: None,
            policy: policy::Policy::default(),
            leader_election: None,
            telemetry: Arc::new(Telemetry::new()),
        }
    }
}

/// Runs the operator until the returned future is dropped.
///
/// # Errors
/// See [`run_until`].
pub async fn run(config: Config) -> Result<(), Error> {
    run_until(config, std::future::pending()).await
}

/// Runs the operator until `shutdown` completes; reconciles in flight then finish before this
/// returns. With [`Config::leader_election`], the controller runs only while this replica
/// holds the Lease ([`leader::run_elected`]), and the Lease is released at the end.
///
/// # Errors
/// Leader-election failures ([`Error::Lease`], [`Error::LeaseDuration`]); watch errors are
/// retried and logged.
pub async fn run_until(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    match config.leader_election.clone() {
        Some(election) => leader::run_elected(config, election, shutdown).await,
        None => {
            config.telemetry.set_leading(true);
            controller::run_until(config, shutdown).await
        }
    }
}
