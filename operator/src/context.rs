//! State shared by every reconcile ([`crate::controller`], [`crate::vcluster`],
//! [`crate::sweep`]): the operator's client, the Event recorder, the policy, the watch
//! caches, the dry-run verdicts, and one lock per workload.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use vcp_crds::VClusterPlugin;

use crate::cache::{Caches, CachesReady, Discovery, WrittenWorkloads};
use crate::judge::Verdicts;
use crate::policy::Policy;
use crate::status::WrittenStatuses;

/// State shared by every reconcile.
pub struct Context {
    /// Client with the operator's identity.
    pub client: Client,
    /// Image of the embedded-runtime sidecar (`--runtime-image`).
    pub runtime_image: String,
    /// Publishes Events on VClusterPlugins.
    pub recorder: Recorder,
    /// Which RBAC rules a plugin may grant (`--policy-file`).
    pub policy: Policy,
    /// Every VClusterPlugin, from the controller's watch cache (used to build the workload's
    /// apply body from all plugins of a vCluster).
    pub plugins: Store<VClusterPlugin>,
    /// Reconcile metrics and readiness.
    pub telemetry: Arc<crate::telemetry::Telemetry>,
    /// Watch caches of workloads and RBAC objects (the install path reads these, not the API
    /// server; see [`crate::cache`]).
    pub caches: Caches,
    /// Set once [`Context::caches`] hold their initial lists; reconciles wait for it.
    pub caches_ready: CachesReady,
    /// The workloads this operator applied, until [`Context::caches`] shows them.
    pub written: WrittenWorkloads,
    /// The statuses this operator wrote, until the plugins' watch cache moves past them.
    pub written_statuses: WrittenStatuses,
    /// Plurals found by API discovery.
    pub discovery: Discovery,
    /// The verdicts of the server-side dry runs that judge each plugin's part of a workload
    /// ([`crate::judge`]), remembered so an unchanged body is not judged again.
    pub verdicts: Verdicts,
    /// One lock per workload: reconciles of plugins of the same vCluster compute and send the
    /// workload's apply body one at a time ([`Context::workload_lock`]).
    pub workload_locks: WorkloadLocks,
    /// The delays before failed reconciles are retried, per plugin
    /// ([`crate::controller::error_policy`]).
    pub retries: Arc<crate::retry::Retries>,
}

impl Context {
    /// The lock serializing writes to the workload of `vcluster` in `namespace`.
    pub fn workload_lock(&self, namespace: &str, vcluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.workload_locks.get(namespace, vcluster)
    }
}

/// One async lock per workload, keyed `namespace/vcluster`, created on first use (and kept:
/// one small entry per vCluster the operator has seen).
#[derive(Default)]
pub struct WorkloadLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl WorkloadLocks {
    /// The lock of the workload of `vcluster` in `namespace`.
    pub fn get(&self, namespace: &str, vcluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks
            .entry(format!("{namespace}/{vcluster}"))
            .or_default()
            .clone()
    }
}
