//! What the operator tells about itself: Prometheus metrics and the health / readiness state
//! served by [`crate::http`] (`/metrics`, `/healthz`, `/readyz`).
//!
//! Metrics (Prometheus text format):
//! - `vcp_reconcile_total{result="success"|"error"}`: reconciles finished, by result;
//! - `vcp_reconcile_errors_total{reason}`: failed reconciles by reason (the API server's
//!   status reason such as `Conflict` or `Forbidden`, else the error's kind);
//! - `vcp_reconcile_duration_seconds`: histogram of the time one reconcile took;
//! - `vcp_leader`: 1 while this replica holds the Lease (or runs without leader election);
//! - `vcp_operator_cached_objects{kind}`: objects held by each watch cache of the install path
//!   (`kind` is the Kubernetes kind: `StatefulSet`, `Deployment`, `Role`, `RoleBinding`,
//!   `ClusterRole`, `ClusterRoleBinding`; [`crate::cache`] says which objects each holds);
//! - `vcp_operator_undecodable_objects_total{kind, part}`: watch events of objects the
//!   operator's types could not read ([`crate::tolerant`]): `part="object"` for one
//!   skipped (not even its metadata and spec decoded), `part="status"` for one passed on
//!   without its status;
//! - `vcp_operator_reconciles_deferred_total`: reconciles of a plugin that found their
//!   vCluster's workload lock held by another reconcile and were requeued instead of waiting
//!   for it in a `--concurrency` slot (`crate::vcluster::install`).
//!
//! Per plugin, in memory only, and only with the test feature `reconcile-log` (enabled by the
//! test crate, never in release): `Telemetry::reconciled` tells how many reconciles of a
//! `VClusterPlugin` finished and the `metadata.resourceVersion` the last one read, so a test can
//! show that the operator looked at a given version of the object before it asserts that a
//! reconcile wrote nothing. A plugin whose last reconcile finished its deletion leaves the
//! table; its last entry is kept among the `GONE_KEPT` most recently gone plugins.
//! With the same feature, `Telemetry::relists` counts the re-lists of the operator's watches by
//! kind (one entry per kind, so bounded): a watch lists again only when it cannot resume from
//! its last resourceVersion (410 Gone after etcd compacted it), so a fault test can show that
//! the fault reached the operator.
//!
//! Also with `reconcile-log` only: [`Telemetry::state`], the sizes of the operator's
//! per-object state (each map of its [`crate::context::Context`], the plugins' watch cache, the
//! sweeper's backlog), its live tasks and its heap's live bytes (`vcp_crds::heap`), served on
//! `/state` so a test can show that the state of gone objects went with them.
//!
//! Readiness: the replica is ready once it knows its leader state (it joined the election, or
//! runs without one) and, while it leads, once its controller started and the API server
//! answered a list of VClusterPlugins with the operator's identity.

#[cfg(feature = "reconcile-log")]
use std::collections::{HashMap, VecDeque};
#[cfg(feature = "reconcile-log")]
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of `vcp_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Label of `vcp_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// Label of `vcp_operator_cached_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// Labels of `vcp_operator_undecodable_objects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UndecodableLabels {
    kind: String,
    part: &'static str,
}

/// Metrics and health state of one operator replica; share it between the controller
/// ([`crate::Config::telemetry`]) and the HTTP server ([`crate::http::serve`]).
pub struct Telemetry {
    registry: Registry,
    /// The counters of the operator's HTTP server (`vcp_operator_http_*`,
    /// [`crate::http::serve`]).
    pub http: vcp_crds::http::Stats,
    reconciles: Family<ResultLabel, Counter>,
    errors: Family<ReasonLabel, Counter>,
    duration: Histogram,
    leader: Gauge,
    cached: Family<KindLabel, Gauge>,
    undecodable: Family<UndecodableLabels, Counter>,
    trims: Counter,
    trimmed_at: Gauge,
    settles: Counter,
    settled_at: Gauge,
    deferred: Counter,
    election_known: AtomicBool,
    leading: AtomicBool,
    synced: AtomicBool,
    #[cfg(feature = "reconcile-log")]
    per_plugin: Mutex<PerPlugin>,
    #[cfg(feature = "reconcile-log")]
    relists: Mutex<HashMap<String, u64>>,
    #[cfg(feature = "reconcile-log")]
    state_probe: Mutex<Option<StateProbe>>,
    /// Plugins whose reconcile in flight was deferred ([`Telemetry::deferred`]): that
    /// reconcile does not count as having looked at the plugin.
    #[cfg(feature = "reconcile-log")]
    deferred_now: Mutex<std::collections::HashSet<(String, String)>>,
}

/// What [`Telemetry::state`] asks the running controller for: `(name, value)` pairs (test
/// feature `reconcile-log`).
#[cfg(feature = "reconcile-log")]
pub type StateProbe = Box<dyn Fn() -> Vec<(&'static str, i64)> + Send + Sync>;

/// How many gone plugins `Telemetry::reconciled` still answers for (1,024, oldest dropped
/// first).
#[cfg(feature = "reconcile-log")]
pub const GONE_KEPT: usize = 1024;

/// The entries of live plugins, and the last of recently gone ones.
#[cfg(feature = "reconcile-log")]
#[derive(Debug, Default)]
struct PerPlugin {
    live: HashMap<(String, String), Reconciled>,
    gone: VecDeque<((String, String), Reconciled)>,
}

/// What `Telemetry::reconciled` knows of one `VClusterPlugin` (test feature `reconcile-log`).
#[cfg(feature = "reconcile-log")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Reconciles of the plugin that finished (both results) since this replica started.
    pub count: u64,
    /// `metadata.resourceVersion` of the plugin as the last finished reconcile read it (empty
    /// when the object carried none).
    pub resource_version: String,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("leading", &self.is_leading())
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    /// Fresh metrics (all zero), not ready.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ResultLabel, Counter>::default();
        let errors = Family::<ReasonLabel, Counter>::default();
        // 5 ms .. ~20 s.
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 13));
        let leader = Gauge::default();
        registry.register(
            "vcp_reconcile",
            "VClusterPlugin reconciles finished, by result",
            reconciles.clone(),
        );
        registry.register(
            "vcp_reconcile_errors",
            "Failed VClusterPlugin reconciles, by reason",
            errors.clone(),
        );
        registry.register(
            "vcp_reconcile_duration_seconds",
            "Time one VClusterPlugin reconcile took",
            duration.clone(),
        );
        registry.register(
            "vcp_leader",
            "1 while this replica holds the leader Lease (or runs without leader election)",
            leader.clone(),
        );
        let cached = Family::<KindLabel, Gauge>::default();
        registry.register(
            "vcp_operator_cached_objects",
            "Objects held by the operator's watch cache of each kind",
            cached.clone(),
        );
        let undecodable = Family::<UndecodableLabels, Counter>::default();
        registry.register(
            "vcp_operator_undecodable_objects",
            "Watch events of objects the operator could not read, by kind and part (object: skipped; status: passed on without it)",
            undecodable.clone(),
        );
        let trims = Counter::default();
        registry.register(
            "vcp_operator_heap_trims",
            "Times the operator gave its heap's free pages back to the kernel after a burst of reconciles",
            trims.clone(),
        );
        let trimmed_at = Gauge::default();
        registry.register(
            "vcp_operator_heap_trimmed_at_reconciles",
            "The count of finished reconciles when the operator last trimmed its heap",
            trimmed_at.clone(),
        );
        let settles = Counter::default();
        registry.register(
            "vcp_operator_heap_settles",
            "Times the operator trimmed its heap once more, 2 minutes after a burst's trim",
            settles.clone(),
        );
        let settled_at = Gauge::default();
        registry.register(
            "vcp_operator_heap_settled_at_reconciles",
            "The count of finished reconciles when the operator last trimmed its heap 2 minutes after a burst",
            settled_at.clone(),
        );
        let http = vcp_crds::http::Stats::default();
        http.register(&mut registry, "vcp_operator");
        vcp_crds::build_info::register(&mut registry, "vcp_operator");
        let deferred = Counter::default();
        registry.register(
            "vcp_operator_reconciles_deferred",
            "Reconciles requeued because another reconcile held their vCluster's workload lock",
            deferred.clone(),
        );
        Telemetry {
            registry,
            http,
            reconciles,
            errors,
            duration,
            leader,
            cached,
            undecodable,
            trims,
            trimmed_at,
            settles,
            settled_at,
            deferred,
            election_known: AtomicBool::new(false),
            leading: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            #[cfg(feature = "reconcile-log")]
            per_plugin: Mutex::default(),
            #[cfg(feature = "reconcile-log")]
            relists: Mutex::default(),
            #[cfg(feature = "reconcile-log")]
            state_probe: Mutex::default(),
            #[cfg(feature = "reconcile-log")]
            deferred_now: Mutex::default(),
        }
    }

    /// Counts a reconcile of the plugin `namespace/name` that found its vCluster's workload
    /// lock held and was requeued (`vcp_operator_reconciles_deferred_total`). With
    /// `reconcile-log`, that reconcile then does not count in [`Telemetry::reconciled`]: it
    /// looked at nothing.
    pub fn deferred(&self, namespace: &str, name: &str) {
        self.deferred.inc();
        #[cfg(feature = "reconcile-log")]
        if let Ok(mut now) = self.deferred_now.lock() {
            now.insert((namespace.to_string(), name.to_string()));
        }
        #[cfg(not(feature = "reconcile-log"))]
        let _ = (namespace, name);
    }

    /// Reconciles deferred so far ([`Telemetry::deferred`]).
    pub fn deferred_total(&self) -> u64 {
        self.deferred.get()
    }

    /// Records that a reconcile of the plugin `namespace/name`, read at `resource_version`,
    /// finished (whatever its result; [`Telemetry::observe_reconcile`] counts results), unless
    /// it was deferred ([`Telemetry::deferred`]). A
    /// plugin that comes back under a gone name goes on counting from its gone entry.
    #[cfg(feature = "reconcile-log")]
    pub fn observe_reconcile_of(&self, namespace: &str, name: &str, resource_version: &str) {
        let id = (namespace.to_string(), name.to_string());
        if self.deferred_now.lock().is_ok_and(|mut d| d.remove(&id)) {
            return;
        }
        if let Ok(mut table) = self.per_plugin.lock() {
            let before = table
                .gone
                .iter()
                .position(|(gone, _)| *gone == id)
                .and_then(|i| table.gone.remove(i))
                .map(|(_, mark)| mark)
                .unwrap_or_default();
            let mark = table.live.entry(id).or_insert(before);
            mark.count += 1;
            resource_version.clone_into(&mut mark.resource_version);
        }
    }

    /// The plugin `namespace/name` finished its deletion (its last reconcile): its entry
    /// leaves the table for the bounded list of gone plugins.
    #[cfg(feature = "reconcile-log")]
    pub fn plugin_gone(&self, namespace: &str, name: &str) {
        if let Ok(mut table) = self.per_plugin.lock() {
            let id = (namespace.to_string(), name.to_string());
            if let Some(mark) = table.live.remove(&id) {
                if table.gone.len() == GONE_KEPT {
                    table.gone.pop_front();
                }
                table.gone.push_back((id, mark));
            }
        }
    }

    /// Reconciles of the plugin `namespace/name` finished so far and the resourceVersion the
    /// last one read; `None` before the first, and for a plugin gone longer than
    /// [`GONE_KEPT`] gone plugins ago.
    #[cfg(feature = "reconcile-log")]
    pub fn reconciled(&self, namespace: &str, name: &str) -> Option<Reconciled> {
        let table = self.per_plugin.lock().ok()?;
        let id = (namespace.to_string(), name.to_string());
        table.live.get(&id).cloned().or_else(|| {
            table
                .gone
                .iter()
                .rev()
                .find(|(gone, _)| *gone == id)
                .map(|(_, mark)| mark.clone())
        })
    }

    /// Plugins the table holds: live ones, and gone ones still answered for.
    #[cfg(feature = "reconcile-log")]
    pub fn reconciled_len(&self) -> (usize, usize) {
        self.per_plugin
            .lock()
            .map(|t| (t.live.len(), t.gone.len()))
            .unwrap_or_default()
    }

    /// Counts one watch event of an object of `kind` that did not decode: skipped whole
    /// (`status_only` false) or passed on without its status (`status_only` true).
    pub fn count_undecodable(&self, kind: &str, status_only: bool) {
        self.undecodable
            .get_or_create(&UndecodableLabels {
                kind: kind.to_string(),
                part: if status_only { "status" } else { "object" },
            })
            .inc();
    }

    /// The count of [`Telemetry::count_undecodable`] for `kind` and part (`status_only`).
    pub fn undecodable(&self, kind: &str, status_only: bool) -> u64 {
        self.undecodable
            .get(&UndecodableLabels {
                kind: kind.to_string(),
                part: if status_only { "status" } else { "object" },
            })
            .map_or(0, |c| c.get())
    }

    /// Counts one re-list of a watch of `kind` (such as `VClusterPlugin`, `StatefulSet`,
    /// `Role`): a list after that watch's first one, which kube's watcher makes only when it
    /// cannot resume from its last resourceVersion (a 410 Gone: etcd compacted the revision),
    /// never for a plain reconnect.
    #[cfg(feature = "reconcile-log")]
    pub fn relisted(&self, kind: &str) {
        if let Ok(mut relists) = self.relists.lock() {
            *relists.entry(kind.to_string()).or_default() += 1;
        }
    }

    /// Re-lists of the operator's watches of `kind` so far (every watch of the kind together:
    /// the cluster-wide cache and the per-namespace watches of vCluster Roles for `Role`).
    #[cfg(feature = "reconcile-log")]
    pub fn relists(&self, kind: &str) -> u64 {
        self.relists
            .lock()
            .ok()
            .and_then(|r| r.get(kind).copied())
            .unwrap_or(0)
    }

    /// Counts the `Init` events (each the start of a list) of one watch of `kind`, `lists`
    /// being that watch's count so far: every one after the first is a re-list
    /// ([`Telemetry::relisted`]). Without the feature `reconcile-log`, nothing.
    pub fn count_list(&self, kind: &str, lists: &mut u64) {
        *lists += 1;
        #[cfg(feature = "reconcile-log")]
        if *lists > 1 {
            self.relisted(kind);
        }
        #[cfg(not(feature = "reconcile-log"))]
        let _ = kind;
    }

    /// Sets what [`Telemetry::state`] reports of the running controller (replaced by the next
    /// controller a new term of leadership starts).
    #[cfg(feature = "reconcile-log")]
    pub fn set_state_probe(&self, probe: StateProbe) {
        if let Ok(mut p) = self.state_probe.lock() {
            *p = Some(probe);
        }
    }

    /// The test endpoint `/state`: one `name value` line per figure, in this order:
    /// - `heap_live_bytes`: bytes the process holds on its heap ([`vcp_crds::heap::live_bytes`];
    ///   0 when the binary does not install [`vcp_crds::heap::Counting`]);
    /// - `tasks_alive`: tokio tasks alive in the runtime serving the request;
    /// - `reconciled_live`, `reconciled_gone`: entries of [`Telemetry::reconciled`]'s table;
    /// - then the controller's figures (its [`StateProbe`], see
    ///   [`crate::context::Context::state`]), absent while no controller runs.
    #[cfg(feature = "reconcile-log")]
    pub fn state(&self) -> String {
        let (live, gone) = self.reconciled_len();
        let mut figures: Vec<(&'static str, i64)> = vec![
            ("heap_live_bytes", vcp_crds::heap::live_bytes()),
            (
                "tasks_alive",
                tokio::runtime::Handle::try_current()
                    .map(|h| i64::try_from(h.metrics().num_alive_tasks()).unwrap_or(i64::MAX))
                    .unwrap_or(-1),
            ),
            ("reconciled_live", i64::try_from(live).unwrap_or(i64::MAX)),
            ("reconciled_gone", i64::try_from(gone).unwrap_or(i64::MAX)),
        ];
        if let Ok(probe) = self.state_probe.lock()
            && let Some(probe) = probe.as_ref()
        {
            figures.extend(probe());
        }
        figures
            .into_iter()
            .map(|(name, value)| format!("{name} {value}\n"))
            .collect()
    }

    /// Records one finished reconcile: `error` is `None` on success, else its reason label.
    pub fn observe_reconcile(&self, took: Duration, error: Option<String>) {
        self.duration.observe(took.as_secs_f64());
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        if let Some(reason) = error {
            self.errors.get_or_create(&ReasonLabel { reason }).inc();
        }
    }

    /// Sets `vcp_operator_cached_objects{kind}`: the watch cache of `kind` holds `count`
    /// objects.
    pub fn set_cached_objects(&self, kind: &str, count: usize) {
        self.cached
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// The value of `vcp_operator_cached_objects{kind}` (0 before the cache's first event).
    pub fn cached_objects(&self, kind: &str) -> i64 {
        self.cached
            .get_or_create(&KindLabel { kind: kind.into() })
            .get()
    }

    /// Counts one trim of the heap after a burst (`vcp_operator_heap_trims_total`,
    /// [`crate::trim`]), made when `reconciles` reconciles had finished
    /// (`vcp_operator_heap_trimmed_at_reconciles`).
    pub fn trimmed(&self, reconciles: u64) {
        self.trims.inc();
        self.trimmed_at
            .set(i64::try_from(reconciles).unwrap_or(i64::MAX));
    }

    /// Counts one trim of the heap once a burst has settled (`vcp_operator_heap_settles_total`,
    /// [`crate::trim::SETTLE_INTERVALS`]), made when `reconciles` reconciles had finished
    /// (`vcp_operator_heap_settled_at_reconciles`).
    pub fn settled(&self, reconciles: u64) {
        self.settles.inc();
        self.settled_at
            .set(i64::try_from(reconciles).unwrap_or(i64::MAX));
    }

    /// Settle trims so far ([`Telemetry::settled`]).
    pub fn settles(&self) -> u64 {
        self.settles.get()
    }

    /// Trims of the heap so far ([`Telemetry::trimmed`]).
    pub fn trims(&self) -> u64 {
        self.trims.get()
    }

    /// Reconciles finished so far (both results) that did their work: those deferred
    /// ([`Telemetry::deferred`], which looked at nothing) are not counted, so a burst of
    /// deferrals is no burst of work ([`crate::trim`]) and a test reading this count sees the
    /// operator look. (`vcp_reconcile_total` counts every finished reconcile.)
    pub fn reconciles(&self) -> u64 {
        let finished: u64 = ["success", "error"]
            .into_iter()
            .map(|result| self.reconciles.get_or_create(&ResultLabel { result }).get())
            .sum();
        finished.saturating_sub(self.deferred.get())
    }

    /// Sets whether this replica leads (and so reconciles); its leader state is known from now.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
        self.election_known.store(true, Ordering::SeqCst);
        self.leader.set(i64::from(leading));
        if !leading {
            self.synced.store(false, Ordering::SeqCst);
        }
    }

    /// Sets whether the controller started, can list VClusterPlugins and has filled its
    /// watch caches.
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::SeqCst);
    }

    /// Whether this replica leads.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// `/readyz`: the leader state is known and, when leading, the controller is running.
    pub fn is_ready(&self) -> bool {
        self.election_known.load(Ordering::SeqCst)
            && (!self.is_leading() || self.synced.load(Ordering::SeqCst))
    }

    /// The metrics in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        vcp_crds::http::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_carry_the_build_info() {
        let text = Telemetry::new().encode();
        assert!(
            text.lines().any(|l| l
                == format!(
                    "vcp_operator_build_info{{version=\"{}\"}} 1",
                    env!("CARGO_PKG_VERSION")
                )),
            "{text}"
        );
    }

    #[cfg(feature = "reconcile-log")]
    #[test]
    fn a_gone_plugin_leaves_the_table_bounded() {
        let t = Telemetry::new();
        t.observe_reconcile_of("ns", "a", "10");
        t.plugin_gone("ns", "a");
        assert_eq!(t.reconciled_len(), (0, 1));
        assert_eq!(t.reconciled("ns", "a").map(|r| r.count), Some(1));
        t.observe_reconcile_of("ns", "a", "20"); // recreated under the same name
        assert_eq!(t.reconciled("ns", "a").map(|r| r.count), Some(2));
        for n in 0..GONE_KEPT * 3 {
            let name = format!("p{n}");
            t.observe_reconcile_of("churn", &name, "1");
            t.plugin_gone("churn", &name);
        }
        assert_eq!(t.reconciled_len(), (1, GONE_KEPT));
        assert_eq!(
            t.reconciled("churn", "p0"),
            None,
            "the oldest gone entries are dropped"
        );
    }

    #[cfg(feature = "reconcile-log")]
    #[test]
    fn the_lists_after_a_watchs_first_are_counted_as_relists() {
        let t = Telemetry::new();
        let (mut plugins, mut roles, mut other_roles) = (0, 0, 0);
        t.count_list("VClusterPlugin", &mut plugins);
        t.count_list("Role", &mut roles);
        t.count_list("Role", &mut other_roles);
        assert_eq!((t.relists("VClusterPlugin"), t.relists("Role")), (0, 0));
        t.count_list("Role", &mut roles);
        t.count_list("Role", &mut other_roles);
        t.count_list("VClusterPlugin", &mut plugins);
        assert_eq!((t.relists("VClusterPlugin"), t.relists("Role")), (1, 2));
        assert_eq!(t.relists("StatefulSet"), 0);
    }

    #[cfg(feature = "reconcile-log")]
    #[test]
    fn remembers_each_plugins_reconciles_and_the_version_read() {
        let t = Telemetry::new();
        assert_eq!(t.reconciled("ns", "a"), None);
        t.observe_reconcile_of("ns", "a", "10");
        t.observe_reconcile_of("ns", "b", "11");
        t.observe_reconcile_of("ns", "a", "12");
        assert_eq!(
            t.reconciled("ns", "a"),
            Some(Reconciled {
                count: 2,
                resource_version: "12".into()
            })
        );
        assert_eq!(t.reconciled("ns", "b").map(|r| r.count), Some(1));
        assert_eq!(t.reconciled("other", "a"), None);
    }

    #[test]
    fn counts_by_result_and_reason_and_reports_readiness() {
        let t = Telemetry::new();
        assert!(!t.is_ready(), "not ready before the leader state is known");
        t.set_leading(false);
        assert!(
            t.is_ready(),
            "a standby is ready once it joined the election"
        );
        t.set_leading(true);
        assert!(
            !t.is_ready(),
            "a leader is ready only once its controller runs"
        );
        t.set_synced(true);
        assert!(t.is_ready());

        t.set_cached_objects("StatefulSet", 3);
        assert_eq!(t.cached_objects("StatefulSet"), 3);
        t.observe_reconcile(Duration::from_millis(3), None);
        t.observe_reconcile(Duration::from_millis(30), Some("Conflict".into()));
        assert_eq!(t.reconciles(), 2);
        let text = t.encode();
        for line in [
            "vcp_reconcile_total{result=\"success\"} 1",
            "vcp_reconcile_total{result=\"error\"} 1",
            "vcp_reconcile_errors_total{reason=\"Conflict\"} 1",
            "vcp_reconcile_duration_seconds_count 2",
            "vcp_leader 1",
            "vcp_operator_cached_objects{kind=\"StatefulSet\"} 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // A deferred reconcile (its vCluster's lock held) is counted apart, not as work.
        t.deferred("ns", "p");
        t.observe_reconcile(Duration::from_millis(1), None);
        #[cfg(feature = "reconcile-log")]
        {
            t.observe_reconcile_of("ns", "p", "7");
            assert_eq!(t.reconciled("ns", "p"), None, "it looked at nothing");
            t.observe_reconcile_of("ns", "p", "8");
            assert_eq!(t.reconciled("ns", "p").map(|r| r.count), Some(1));
        }
        assert_eq!(t.reconciles(), 2);
        assert_eq!(t.deferred_total(), 1);
        assert!(
            t.encode()
                .lines()
                .any(|l| l == "vcp_operator_reconciles_deferred_total 1"),
            "{}",
            t.encode()
        );
    }
}
