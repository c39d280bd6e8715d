//! What [`run`](super::run) is given: [`Config`], and how host pods are handled
//! ([`PodSync`]).

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::context::{DEFAULT_RESYNC_PERIOD, DEFAULT_WORKERS};
use crate::stats::TypeStats;

/// How host pods are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSync {
    /// Beside a real vCluster (whose syncer syncs pods): apply the plugin's physical `Pod`
    /// hooks to the host pods labelled `vcluster.loft.sh/managed-by=<vcluster>`.
    #[default]
    Hooks,
    /// Standalone (no vCluster syncer present): the runtime syncs pods itself, virtual to host
    /// with the translated metadata (the spec is copied at creation; afterwards only labels
    /// and annotations follow, the rest of a pod's spec being immutable), status host to
    /// virtual, and the `Pod` hooks applied before each host write.
    Full,
    /// A v2 plugin started by vCluster's syncer ([`crate::v2`]): vCluster calls the plugin's
    /// `Pod` hooks through `Mutate` before it writes a host pod, so the runtime neither syncs
    /// nor patches host pods.
    Mutate,
}

/// Configuration of [`run`](super::run).
#[derive(Clone)]
pub struct Config {
    /// Client of the host cluster (where the `VClusterPlugin` and the host copies live).
    pub host: Client,
    /// Client of the virtual cluster (the vCluster's own API server).
    pub virtual_: Client,
    /// Host namespace of the vCluster (and of its `VClusterPlugin`); the only host namespace
    /// watched or written.
    pub namespace: String,
    /// Name of the `VClusterPlugin` to run.
    pub plugin: String,
    /// vCluster name used in host names and labels; `None`: the plugin's `spec.vcluster.name`.
    pub vcluster: Option<String>,
    /// How host pods are handled (default [`PodSync::Hooks`]).
    pub pod_sync: PodSync,
    /// Every synced object is reconciled again this often (default 5 minutes).
    pub resync_period: Duration,
    /// The status is recomputed this often and written when it changed (default 2 seconds).
    pub status_interval: Duration,
    /// Concurrent workers per synced type (default 4).
    pub workers: usize,
    /// The longest delay between two attempts of a failing watch or of a synced type that is
    /// not served (default 30 s; [`crate::retry`]).
    pub retry_max: Duration,
    /// The expression evaluations of every synced type and every spec generation of this
    /// runtime ([`crate::patches::running`]): once
    /// [`MAX_OVERRUNNING`](crate::patches::running::MAX_OVERRUNNING) run past twice their time
    /// bound, no new one starts until they end (those already started may still overrun: at
    /// most the types' workers in all), and each that does is reported (`RuntimeHealthy=False`, `PatchFailed`,
    /// and a `Warning` Event). Default: fresh; a caller (a test) may keep a clone to count them.
    pub evaluations: Arc<crate::patches::running::Evaluations>,
    /// A v2 plugin's hooks ([`PodSync::Mutate`]): set to the declared hooks whenever the
    /// syncers start from a spec, emptied while the `VClusterPlugin` is gone, so that
    /// vCluster's `Mutate` calls apply the current spec.
    pub hook_table: Option<Arc<crate::v2::HookTable>>,
    /// Counts every finished reconcile per object, across spec changes (default: fresh); the
    /// caller may keep a clone to read it. Test machinery: only with the cargo feature
    /// `reconcile-log`.
    #[cfg(feature = "reconcile-log")]
    pub reconciles: Arc<crate::stats::ReconcileLog>,
    /// Where [`run`](super::run) serves `/metrics` and `/healthz` ([`crate::metrics`]) while it
    /// runs; `None` (the default): no listener.
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// The counters of `/metrics`, over every spec generation of this runtime (default: fresh;
    /// a caller may keep a clone to read them).
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Config {
    /// A configuration with the defaults: vCluster name from the plugin, [`PodSync::Hooks`],
    /// resync every 5 minutes, status every 2 seconds.
    pub fn new(
        host: Client,
        virtual_: Client,
        namespace: impl Into<String>,
        plugin: impl Into<String>,
    ) -> Self {
        Self {
            host,
            virtual_,
            namespace: namespace.into(),
            plugin: plugin.into(),
            vcluster: None,
            pod_sync: PodSync::Hooks,
            resync_period: DEFAULT_RESYNC_PERIOD,
            status_interval: Duration::from_secs(2),
            workers: DEFAULT_WORKERS,
            retry_max: crate::retry::DEFAULT_RETRY_MAX,
            evaluations: Arc::default(),
            hook_table: None,
            #[cfg(feature = "reconcile-log")]
            reconciles: Arc::default(),
            metrics_bind_address: None,
            metrics: Arc::default(),
        }
    }

    /// `stats`, counting into [`Config::metrics`], and its reconciles in
    /// [`Config::reconciles`] with the test feature `reconcile-log`.
    pub(super) fn logged(&self, stats: TypeStats) -> TypeStats {
        let stats = stats.with_metrics(self.metrics.clone());
        #[cfg(feature = "reconcile-log")]
        return stats.with_log(self.reconciles.clone());
        #[cfg(not(feature = "reconcile-log"))]
        stats
    }
}
