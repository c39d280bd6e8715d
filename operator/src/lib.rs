#![warn(missing_docs)]
//! vcluster-plugin-operator: the controller for `VClusterPlugin` (`vcp.dev/v1alpha1`).
//!
//! It installs each plugin into its vCluster's workload and RBAC, reports status, and removes
//! it cleanly on delete (the README says what it does, ARCHITECTURE.md where each rule lives);
//! each rule lives in one module:
//!
//! | rule | module |
//! | --- | --- |
//! | containers / init containers / volumes applied to the workload, conflicts, zero-write convergence | [`workload`] |
//! | Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules derived from `syncedTypes` | [`rbac`] |
//! | `observedGeneration`, `phase`, conditions, `lastTransitionTime` | [`status`] |
//! | the condition and Event reasons, shared with the runtime and serialized as the API's strings | [`vcp_crds::Reason`] |
//! | converging one vCluster, the unit of a reconcile (install and delete alike): the finalizer added, then *observe* the workload, its plugins, the cluster facts and the dry-run verdicts; *act* on the plan (workload under its lock, RBAC); *report* the status | [`vcluster`] |
//! | *decide*, pure: every refusal before any write, in order (`NotAVCluster`, `PolicyDenied`, `UnknownType`, `ClusterScopedType`, `VClusterRoleNotFound`, `SharedVClusterRole`, `PolicyDenied` for a synced kind Kubernetes serves itself, `TooLarge`, `ResourcesExceeded`, `InvalidWorkload`, `Conflict`; `VClusterNotFound`), the workload body, every plugin's verdict, the status, the requeue (`RESYNC`, `RECHECK`) | [`vcluster::decide`] |
//! | *observe*: the plugins of a vCluster, the cluster facts (identity, discovery, Roles and RoleBindings), the hooks' and dry runs' verdicts | [`vcluster::observe`] |
//! | *act*: the workload apply, the plugin's RBAC objects and vCluster Role entries, removal on delete (exactly what was added, a missing workload does not block it), the status | [`vcluster::act`] |
//! | adding and removing the finalizer `vcp.dev/cleanup` | [`finalizer`] |
//! | what plugins deleted without that removal left behind (finalizer removed by hand, operator stopped): swept at start, after each delete, periodically | [`sweep`] |
//! | server-side apply under one field manager, zero writes once converged, deletes only of the plugin's own objects, Events, the dry-run requests | [`writes`] |
//! | which RBAC rules a plugin may grant, what its container may ask for (`PolicyDenied`) | [`policy`] |
//! | which synced types the runtime may sync: custom resources and `ConfigMap` (`PolicyDenied`) | [`vcp_crds::built_in`] |
//! | each plugin's part judged by server-side dry runs before the apply, the namespace's Pod Security level (`InvalidWorkload`, `PolicyDenied`); what the vCluster's pods would ask for against the namespace's LimitRanges and ResourceQuotas and the nodes' allocatable (`ResourcesExceeded`) | [`judge`], [`judge::resources`] |
//! | Kubernetes quantities (`100m`, `256Mi`) read exactly, for comparing and adding requests and limits | [`quantity`] |
//! | watches, mappers, reconcile, retries | [`controller`] |
//! | tolerant reading: an object the operator's types cannot read skips only itself (logged, counted); an unreadable plugin gets `Ready=False` (`Undecodable`) and an Event | [`tolerant`] |
//! | the watches of the vCluster Roles `PatchVClusterRoles` plugins append to (an edit taking a plugin's rule out triggers its repair) | [`patched_roles`] |
//! | the delay before a failed reconcile is retried: per plugin, exponential with jitter, reset by a success | [`retry`] |
//! | the fields of the tracing spans (a reconcile's plugin and vCluster, a write's kind and object) | [`trace`] |
//! | how to run the operator, its defaults (concurrency, debounce, the sweep's retry delay) | [`Config`] |
//! | state shared by reconciles, one lock per workload | [`context`] |
//! | the reads of workloads: watch caches (install), direct reads (delete, sweep), discovery cache | [`cache`] |
//! | `vcluster-plugin-operator import`: Helm values (`plugin:` / `plugins:`) and a `vcluster.yaml`'s `sync.*.customResources` to VClusterPlugins | [`import`] |
//! | leader election on a Lease | [`leader`] |
//! | metrics, health and readiness | [`telemetry`], served by [`http`] |
//! | giving freed heap pages back to the kernel after a burst of reconciles | [`trim`] |
//! | test-only: the sizes of the per-object state and the live heap bytes, served on `/state` (feature `reconcile-log` only) | [`telemetry`], `vcp_crds::heap` |
//! | test-only fault point: abort after the n-th write (`VCP_FAULT_ABORT_AFTER_WRITES`; feature `test-faults` only) | `fault` |
//!
//! Tests and the binary start the operator with [`run`] (or [`run_until`]) and a [`Config`].

pub mod answer;
pub mod cache;
mod config;
pub mod context;
pub mod controller;
pub mod error;
pub mod finalizer;
pub mod http;
pub mod import;
pub mod judge;
pub mod leader;
pub mod operations;
pub mod patched_roles;
pub mod policy;
pub mod quantity;
pub mod rbac;
pub mod retry;
pub mod rollout;
pub mod slim;
pub mod status;
pub mod sweep;
pub mod telemetry;
pub mod tolerant;
pub mod trace;
pub mod trim;
pub mod vcluster;
pub mod workload;
pub mod writes;

/// The test-only fault point of the binary's client (shared with the runtime's binary); with
/// the `test-faults` feature only, which release builds leave out.
#[cfg(feature = "test-faults")]
pub use vcp_crds::fault;

use std::future::Future;

pub use config::{
    Config, DEBOUNCE, DEBOUNCE_MS, DEFAULT_CONCURRENCY, RETRY, default_runtime_image,
};
pub use error::Error;
pub use leader::LeaderElection;
pub use telemetry::Telemetry;

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
