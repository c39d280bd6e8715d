//! State shared by every reconcile ([`crate::controller`], [`crate::vcluster`],
//! [`crate::sweep`]): the operator's client, the Events' reporter, the policy, the watch
//! caches, the dry-run verdicts, and one lock per workload.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Client;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::Store;
use vcp_crds::VClusterPlugin;

use crate::cache::{Caches, CachesReady, Discovery, WorkloadCopies};
use crate::judge::Verdicts;
use crate::policy::Policy;
use crate::status::WrittenStatuses;

/// State shared by every reconcile.
pub struct Context {
    /// Client with the operator's identity.
    pub client: Client,
    /// Image of the embedded-runtime sidecar (`--runtime-image`).
    pub runtime_image: String,
    /// Who publishes the Events on VClusterPlugins: each Event is published through a
    /// [`kube::runtime::events::Recorder`] made for it ([`crate::writes::write_status`]), not
    /// one kept here, because a Recorder keeps every Event it published in a map for 6 minutes
    /// and that map never shrinks back.
    pub reporter: Reporter,
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
    /// The full copies of the workloads plugins target: read by a reconcile, or the answers
    /// to this operator's applies ([`crate::cache::copies`]).
    pub copies: WorkloadCopies,
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

    /// The sizes of the per-object state every reconcile shares, for the test endpoint
    /// `/state` ([`crate::telemetry::Telemetry::state`]; feature `reconcile-log` only), as
    /// `(name, count)`:
    /// `plugins_cached` (the plugins' watch cache), `plugins_slimmed` (those of them slimmed,
    /// [`crate::slim`]), `written_statuses`, `workload_copies` and `workload_copies_bytes`
    /// (the full copies of workloads, [`crate::cache::copies`], and their bytes of JSON),
    /// `verdicts_dry_run`, `verdicts_hooks`, `workload_locks`, `retries`, `discovery_types`.
    #[cfg(feature = "reconcile-log")]
    pub fn state(&self) -> Vec<(&'static str, i64)> {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let (dry_run, hooks) = self.verdicts.entries();
        let cached = self.plugins.state();
        let slimmed = cached.iter().filter(|p| crate::slim::is_slimmed(p)).count();
        vec![
            ("plugins_cached", count(cached.len())),
            ("plugins_slimmed", count(slimmed)),
            ("written_statuses", count(self.written_statuses.entries())),
            ("workload_copies", count(self.copies.entries())),
            ("workload_copies_bytes", count(self.copies.bytes())),
            ("verdicts_dry_run", count(dry_run)),
            ("verdicts_hooks", count(hooks)),
            ("workload_locks", count(self.workload_locks.entries())),
            ("retries", count(self.retries.len())),
            ("discovery_types", count(self.discovery.entries())),
        ]
    }
}

/// One async lock per workload, keyed `namespace/vcluster`, created on first use and dropped
/// once idle: a lock nobody holds or waits for (no clone of it outside the map) carries no
/// state, so each [`WorkloadLocks::get`] drops the idle ones, and the map holds only the locks
/// of reconciles in flight (no entry outlives its vCluster).
#[derive(Default)]
pub struct WorkloadLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl WorkloadLocks {
    /// The lock of the workload of `vcluster` in `namespace`: the one held or awaited by
    /// another reconcile of the same workload, else a new one.
    pub fn get(&self, namespace: &str, vcluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.lock();
        // Only the map holds it: nobody holds the lock nor waits for it.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks
            .entry(format!("{namespace}/{vcluster}"))
            .or_default()
            .clone()
    }

    /// Locks in use (held or awaited by a reconcile): the map's size once the idle ones are
    /// dropped, as [`WorkloadLocks::get`] does.
    pub fn entries(&self) -> usize {
        let mut locks = self.lock();
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_workload_lock_serializes_while_used_and_goes_once_idle() {
        let locks = WorkloadLocks::default();
        let a = locks.get("ns", "a");
        let held = a.clone().lock_owned().await;
        // The same workload's lock while another reconcile holds it: the same lock.
        let again = locks.get("ns", "a");
        assert!(Arc::ptr_eq(&a, &again));
        assert!(again.try_lock().is_err(), "held by the first reconcile");
        drop(again);
        // Other vClusters come and go; the held one stays.
        for n in 0..100 {
            drop(locks.get("ns", &format!("gone-{n}")));
        }
        assert_eq!(locks.entries(), 1, "the held lock alone");
        drop(held);
        assert_eq!(locks.entries(), 1, "awaited: `a` still holds a clone");
        drop(a);
        assert_eq!(locks.entries(), 0, "idle locks are dropped");
        let b = locks.get("ns", "b");
        assert_eq!(locks.entries(), 1);
        assert!(b.try_lock().is_ok());
    }
}
