//! State shared by every reconcile ([`crate::controller`], [`crate::vcluster`],
//! [`crate::sweep`]): the operator's client, the Events' reporter, the policy, the watch
//! caches, the dry-run verdicts, and one lock per workload.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// workload's apply body one at a time ([`Context::workload_lock`]); a reconcile that finds
    /// it held does not wait for it ([`WorkloadLock::try_lock`], `crate::vcluster::install`).
    pub workload_locks: WorkloadLocks,
    /// The delays before failed reconciles are retried, per plugin
    /// ([`crate::controller::error_policy`]).
    pub retries: Arc<crate::retry::Retries>,
}

impl Context {
    /// The lock serializing writes to the workload of `vcluster` in `namespace`.
    pub fn workload_lock(&self, namespace: &str, vcluster: &str) -> Arc<WorkloadLock> {
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

/// The lock of one workload: an async mutex, and since when its holder holds it.
///
/// A reconcile waiting for the lock would hold one of the controller's `--concurrency` slots
/// all the while: one tenant's many plugins of one vCluster, each reconcile waiting for the one
/// before it, held every slot and stalled every other tenant's reconciles. So the install path only tries it ([`WorkloadLock::try_lock_for`]) and,
/// when it is held, is requeued to come back in its turn: the plugins turned away line up, and
/// each comes back after about its place in the line times how long the lock has been held
/// ([`WorkloadLock::retry_after`]), so many waiting plugins cost a few tries a second, not one
/// per plugin. The holder converges the whole vCluster anyway. The delete path and the sweep
/// wait ([`WorkloadLock::lock`]).
#[derive(Debug, Default)]
pub struct WorkloadLock {
    mutex: tokio::sync::Mutex<()>,
    /// When the current (or last) holder took the lock.
    taken: Mutex<Option<Instant>>,
    /// The plugins turned away while it was held, in the order they came.
    waiting: Mutex<VecDeque<String>>,
}

/// The shortest delay before a reconcile that found its workload's lock held tries again, and
/// the least hold time [`WorkloadLock::retry_after`] counts per plugin ahead in the line.
pub const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest delay (before jitter, which adds at most as much again) before a reconcile that
/// found its workload's lock held tries again.
pub const RETRY_MAX: Duration = Duration::from_secs(5);

impl WorkloadLock {
    fn took(&self) {
        *self.taken.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Waits for the lock.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let guard = self.mutex.lock().await;
        self.took();
        guard
    }

    fn line(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock for the reconcile of plugin `who` if nobody holds it (`who` then leaves the
    /// line), else when to try again ([`WorkloadLock::retry_after`] for `who`'s place in the
    /// line, joined now if it was not in it, and the time the lock has been held).
    ///
    /// # Errors
    /// The delay before `who` tries again, when another reconcile holds the lock.
    pub fn try_lock_for(&self, who: &str) -> Result<tokio::sync::MutexGuard<'_, ()>, Duration> {
        match self.mutex.try_lock() {
            Ok(guard) => {
                self.took();
                self.line().retain(|w| w != who);
                Ok(guard)
            }
            Err(_) => {
                let held = self
                    .taken
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .map_or(Duration::ZERO, |t| t.elapsed());
                let mut line = self.line();
                let place = match line.iter().position(|w| w == who) {
                    Some(i) => i + 1,
                    None => {
                        line.push_back(who.to_string());
                        line.len()
                    }
                };
                Err(Self::retry_after(held, place))
            }
        }
    }

    /// Takes `who` out of the line (its plugin is being deleted: it will not come back).
    pub fn leave(&self, who: &str) {
        self.line().retain(|w| w != who);
    }

    /// When a plugin `place`-th in the line (1 for the first) tries again after finding the
    /// lock held for `held`: `place` times the hold so far (at least [`RETRY_MIN`] each), at
    /// most [`RETRY_MAX`], plus a random jitter of as much again at most (so the plugins turned
    /// away together spread out). The first in line comes back about when a hold as long as
    /// this one ends; the later ones after the holds before them.
    pub fn retry_after(held: Duration, place: usize) -> Duration {
        use backon::BackoffBuilder;
        let each = held.max(RETRY_MIN);
        let base = each
            .saturating_mul(u32::try_from(place.max(1)).unwrap_or(u32::MAX))
            .min(RETRY_MAX);
        backon::ConstantBuilder::default()
            .with_delay(base)
            .with_max_times(1)
            .with_jitter()
            .build()
            .next()
            .unwrap_or(base)
    }
}

/// One [`WorkloadLock`] per workload, keyed `namespace/vcluster`, created on first use and
/// dropped once idle: a lock nobody holds or waits for (no clone of it outside the map) carries
/// no state that matters, so each [`WorkloadLocks::get`] drops the idle ones, and the map holds
/// only the locks of reconciles in flight (no entry outlives its vCluster).
#[derive(Default)]
pub struct WorkloadLocks(Mutex<HashMap<String, Arc<WorkloadLock>>>);

impl WorkloadLocks {
    /// The lock of the workload of `vcluster` in `namespace`: the one held or awaited by
    /// another reconcile of the same workload, else a new one.
    pub fn get(&self, namespace: &str, vcluster: &str) -> Arc<WorkloadLock> {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<WorkloadLock>>> {
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
        let held = a.lock().await;
        // The same workload's lock while another reconcile holds it: the same lock.
        let again = locks.get("ns", "a");
        assert!(Arc::ptr_eq(&a, &again));
        assert!(
            again.try_lock_for("p").is_err(),
            "held by the first reconcile"
        );
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
        assert!(b.try_lock_for("p").is_ok());
    }

    /// Plugins turned away line up: each comes back after about its place times the hold so
    /// far, within bounds, never at the same moment as the others; one that gets the lock
    /// leaves the line.
    #[tokio::test]
    async fn turned_away_plugins_line_up_and_come_back_in_turn() {
        let lock = WorkloadLock::default();
        let held = lock.lock().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // held 300 ms: the first in line after 300-600 ms, the second 600-1200 ms
        let first = lock.try_lock_for("a").expect_err("held");
        let second = lock.try_lock_for("b").expect_err("held");
        let again = lock.try_lock_for("a").expect_err("held");
        let ms = Duration::from_millis;
        assert!(first >= ms(300) && first <= ms(1200), "{first:?}");
        assert!(second >= ms(600) && second <= ms(2400), "{second:?}");
        assert!(
            again >= ms(300) && again <= ms(1200),
            "a keeps its place: {again:?}"
        );
        drop(held);
        assert!(lock.try_lock_for("a").is_ok(), "free again");
        assert_eq!(*lock.line(), ["b"], "a left the line");
        for (held, place, low) in [
            (Duration::ZERO, 1, RETRY_MIN),
            (Duration::ZERO, 3, 3 * RETRY_MIN),
            (ms(700), 1, ms(700)),
            (ms(700), 2, ms(1400)),
            (Duration::from_secs(60), 1, RETRY_MAX),
            (ms(200), 150, RETRY_MAX),
        ] {
            let delays: Vec<Duration> = (0..50)
                .map(|_| WorkloadLock::retry_after(held, place))
                .collect();
            assert!(
                delays.iter().all(|d| *d >= low && *d <= 2 * low),
                "{held:?} at {place}: {delays:?}"
            );
            assert!(
                delays.iter().any(|d| *d != delays[0]),
                "jittered: {delays:?}"
            );
        }
    }
}
