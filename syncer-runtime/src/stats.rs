//! In-memory sync statistics per synced type, read by the status reporter.

use k8s_openapi::api::core::v1::ObjectReference;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use vcp_crds::Reason;

/// The last result of syncing one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The host copy matches the virtual object.
    InSync,
    /// A host object of the translated name exists that this vCluster does not manage; it is
    /// never touched.
    Conflict,
    /// Waiting for something (such as a host object being deleted) before the next step.
    Pending,
    /// The last attempt failed with this message; it is retried with backoff.
    Failed(String),
    /// A declared patch failed on the object (`Error::Patch`, with this message): nothing of it
    /// was written; it is retried with backoff.
    PatchFailed(String),
}

/// Counts of one type, as reported in `status.syncedObjects`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeSummary {
    /// `group/version` of the type.
    pub api_version: String,
    /// Kind of the type.
    pub kind: String,
    /// Objects whose host copy matches the virtual object.
    pub in_sync: i64,
    /// Host objects of a translated name that this vCluster does not manage.
    pub conflicts: i64,
    /// Objects whose last sync attempt failed (other than by a patch).
    pub failed: i64,
    /// Objects on which a declared patch failed.
    pub patch_failed: i64,
    /// The message of one of them (the first in key order), for the condition's message.
    pub patch_error: Option<String>,
    /// Objects of the type's watches that cannot be decoded (`vcp_crds::tolerant`):
    /// skipped, never acted on, until they decode again or are deleted.
    pub undecodable: i64,
    /// One of them (`<cluster> <Kind> namespace/name: error`), for the condition's message.
    pub undecodable_example: Option<String>,
    /// A problem of the whole type (discovery or watch failing), if any.
    pub type_error: Option<String>,
    /// Whether both watches have listed their objects once.
    pub ready: bool,
}

/// How many reconciles of each object finished, per kind, over the whole life of a runtime
/// (across spec changes, which restart the syncers): `(kind, namespace/name) → count`. In
/// memory only; [`Config::reconciles`](crate::Config::reconciles) shares it with the caller, so
/// a test can show that the runtime looked at an object after a change before it asserts that
/// nothing was written.
///
/// Test machinery: it exists only with the cargo feature `reconcile-log` (enabled by the test
/// crate, never by a release build). An object gone on both sides leaves the live map; its last
/// count is kept among the [`GONE_KEPT`] most recently gone keys (so a test can still see the
/// reconcile that deleted a copy), and continues from there if the object comes back.
#[cfg(feature = "reconcile-log")]
#[derive(Debug, Default)]
pub struct ReconcileLog {
    counts: Mutex<ReconcileCounts>,
}

/// How many gone keys a [`ReconcileLog`] still answers for (1,024, oldest dropped first).
#[cfg(feature = "reconcile-log")]
pub const GONE_KEPT: usize = 1024;

/// The counts of a [`ReconcileLog`]: the live objects', and the last of recently gone ones.
#[cfg(feature = "reconcile-log")]
#[derive(Debug, Default)]
struct ReconcileCounts {
    live: HashMap<(String, String), u64>,
    gone: std::collections::VecDeque<((String, String), u64)>,
    relists: HashMap<String, u64>,
}

#[cfg(feature = "reconcile-log")]
impl ReconcileLog {
    /// Counts one finished reconcile (whatever its result) of `key` (`namespace/name`: the
    /// virtual object's for synced types, the host pod's for pod hooks) of `kind`.
    pub fn count(&self, kind: &str, key: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            let id = (kind.to_string(), key.to_string());
            let before = counts
                .gone
                .iter()
                .position(|(gone, _)| *gone == id)
                .and_then(|i| counts.gone.remove(i))
                .map_or(0, |(_, n)| n);
            *counts.live.entry(id).or_insert(before) += 1;
        }
    }

    /// `key` of `kind` is gone on both sides: its count leaves the live map for the bounded
    /// list of gone keys.
    pub fn gone(&self, kind: &str, key: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            let id = (kind.to_string(), key.to_string());
            if let Some(n) = counts.live.remove(&id) {
                if counts.gone.len() == GONE_KEPT {
                    counts.gone.pop_front();
                }
                counts.gone.push_back((id, n));
            }
        }
    }

    /// Finished reconciles of `key` of `kind` so far (0 before the first, and for a key gone
    /// longer than [`GONE_KEPT`] gone keys ago).
    pub fn reconciles(&self, kind: &str, key: &str) -> u64 {
        let Ok(counts) = self.counts.lock() else {
            return 0;
        };
        let id = (kind.to_string(), key.to_string());
        counts.live.get(&id).copied().unwrap_or_else(|| {
            counts
                .gone
                .iter()
                .rev()
                .find(|(gone, _)| *gone == id)
                .map_or(0, |(_, n)| *n)
        })
    }

    /// Counts one re-list of a watch of `kind`: a list after the watch's first one, which
    /// kube's watcher makes when it cannot resume from its last resourceVersion (a 410 Gone:
    /// the revision was compacted), never for a plain reconnect.
    pub fn relisted(&self, kind: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.relists.entry(kind.to_string()).or_default() += 1;
        }
    }

    /// Re-lists of the watches of `kind` so far (both sides together).
    pub fn relists(&self, kind: &str) -> u64 {
        self.counts
            .lock()
            .ok()
            .and_then(|c| c.relists.get(kind).copied())
            .unwrap_or(0)
    }

    /// Keys the log holds: live ones, and gone ones still answered for.
    pub fn len(&self) -> (usize, usize) {
        self.counts
            .lock()
            .map(|c| (c.live.len(), c.gone.len()))
            .unwrap_or_default()
    }
}

/// Type of an Event sent to an [`EventSink`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// A `Normal` Event: something done on purpose that a user may want to know.
    Normal,
    /// A `Warning` Event: something that needs a user's attention.
    Warning,
}

/// The most keys a [`WarnedKeys`] set remembers (10,000; see [`TypeStats::warn_once`]).
pub const MAX_WARNED: usize = 10_000;

/// The keys [`TypeStats::warn_once`] has warned about (shared, see [`TypeStats::sharing_warned`]).
pub type WarnedKeys = std::sync::Arc<Mutex<std::collections::HashSet<String>>>;

/// Where [`TypeStats::warn_once`] and [`TypeStats::notice`] send an Event: `(type, reason,
/// note)`; the runtime publishes it on the `VClusterPlugin`.
pub type EventSink =
    std::sync::Arc<dyn Fn(Severity, Reason, String, Option<ObjectReference>) + Send + Sync>;

/// Sync statistics of one type, shared between a syncer and the status reporter.
#[derive(Default)]
pub struct TypeStats {
    api_version: String,
    kind: String,
    #[cfg(feature = "reconcile-log")]
    log: Option<std::sync::Arc<ReconcileLog>>,
    warnings: Option<EventSink>,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// This type's lines of `metrics` (none without).
    counters: Option<crate::metrics::TypeCounters>,
    deselected: AtomicU64,
    warned: WarnedKeys,
    outcomes: Mutex<HashMap<String, Outcome>>,
    type_error: Mutex<Option<String>>,
    /// Per watch (its cluster and side): the count of its undecodable objects and one of them.
    undecodable: Mutex<std::collections::BTreeMap<String, (usize, Option<String>)>>,
    ready: std::sync::atomic::AtomicBool,
    writes: AtomicU64,
}

impl std::fmt::Debug for TypeStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypeStats")
            .field("api_version", &self.api_version)
            .field("kind", &self.kind)
            .field("writes", &self.writes())
            .finish_non_exhaustive()
    }
}

impl TypeStats {
    /// Empty statistics for `api_version` / `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            ..Self::default()
        }
    }

    /// These statistics, also counting each finished reconcile in `log`.
    #[cfg(feature = "reconcile-log")]
    #[must_use]
    pub fn with_log(mut self, log: std::sync::Arc<ReconcileLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// These statistics, also counting reconciles, writes and skipped undecodable objects in
    /// `metrics` (the runtime's `/metrics`, [`crate::metrics`]).
    #[must_use]
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.counters = Some(metrics.of_type(&self.api_version, &self.kind));
        self.metrics = Some(metrics);
        self
    }

    /// Counts one object of this type that `side` (`virtual` or `host`) sent and that cannot
    /// be decoded (`vcp_runtime_undecodable_objects_total`, [`crate::metrics`]); returns that
    /// count so far (0 without metrics).
    pub fn count_undecodable(&self, side: &'static str) -> u64 {
        self.metrics.as_ref().map_or(0, |m| {
            m.count_undecodable(&self.api_version, &self.kind, side)
        })
    }

    /// These statistics, sending [`TypeStats::warn_once`]'s and [`TypeStats::notice`]'s
    /// Events to `sink`.
    #[must_use]
    pub fn with_warnings(mut self, sink: EventSink) -> Self {
        self.warnings = Some(sink);
        self
    }

    /// These statistics, remembering the keys of [`TypeStats::warn_once`] in `warned`, which
    /// may be shared: the runtime shares one set between all types and all generations of a
    /// plugin's spec, so that a spec change, which restarts the syncers with new statistics,
    /// does not repeat a warning already given.
    #[must_use]
    pub fn sharing_warned(mut self, warned: WarnedKeys) -> Self {
        self.warned = warned;
        self
    }

    /// Sends a `Normal` Event `reason` / `note` to the [`EventSink`], if any.
    pub fn notice(&self, reason: Reason, note: String) {
        if let Some(sink) = &self.warnings {
            sink(Severity::Normal, reason, note, None);
        }
    }

    /// Counts one host copy deleted because its virtual object no longer matches the type's
    /// selector; returns the count so far.
    pub fn count_deselected(&self) -> u64 {
        self.deselected.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Host copies deleted so far because their virtual objects no longer match the type's
    /// selector (relabelled, or the selector narrowed).
    pub fn deselected(&self) -> u64 {
        self.deselected.load(Ordering::Relaxed)
    }

    /// Sends the warning `reason` / `note` to the [`EventSink`] the first time `key` is
    /// given (later calls with the same `key` do nothing, so a condition found on every sync is
    /// reported once); returns whether it was the first time. A warning about one object has a
    /// key starting with the object's uid and a space, so that [`TypeStats::forget_warnings_about`]
    /// forgets it when the object goes. The set holds at most [`MAX_WARNED`] keys: when it is
    /// full it starts again empty (a condition still found then is reported once more).
    pub fn warn_once(&self, key: &str, reason: Reason, note: String) -> bool {
        self.warn_once_about(None, key, reason, note)
    }

    /// [`TypeStats::warn_once`] about the object `related`: the Event names it as its
    /// `related` object, so warnings about two objects are two Events (an Event recorder counts
    /// a second Event with the same reason, regarding and related object, whatever its note,
    /// as a repeat of the first).
    pub fn warn_once_about(
        &self,
        related: Option<ObjectReference>,
        key: &str,
        reason: Reason,
        note: String,
    ) -> bool {
        let first = self
            .warned
            .lock()
            .map(|mut warned| {
                if warned.len() >= MAX_WARNED && !warned.contains(key) {
                    warned.clear();
                }
                warned.insert(key.to_string())
            })
            .unwrap_or(false);
        if first && let Some(sink) = &self.warnings {
            sink(Severity::Warning, reason, note, related);
        }
        first
    }

    /// Forgets the warnings given about the object with `uid` (it is gone: a new object of the
    /// same name is warned about again).
    pub fn forget_warnings_about(&self, uid: &str) {
        if let Ok(mut warned) = self.warned.lock() {
            warned.retain(|key| {
                key.strip_prefix(uid)
                    .is_none_or(|rest| !rest.starts_with(' '))
            });
        }
    }

    /// Forgets the one warning `key` (its condition is over: found again, it is reported again).
    pub fn forget_warning(&self, key: &str) {
        if let Ok(mut warned) = self.warned.lock() {
            warned.remove(key);
        }
    }

    /// How many warning keys are remembered (shared with every [`TypeStats`] of the set).
    pub fn warned_len(&self) -> usize {
        self.warned.lock().map(|w| w.len()).unwrap_or(0)
    }

    /// Counts one finished reconcile of `key` in the metrics, if any
    /// (`vcp_runtime_reconciles_total`), and in the `ReconcileLog`, if any (only with the test
    /// feature `reconcile-log`).
    pub fn count_reconcile(&self, key: &str) {
        if let Some(counters) = &self.counters {
            counters.count_reconcile();
        }
        #[cfg(feature = "reconcile-log")]
        if let Some(log) = &self.log {
            log.count(&self.kind, key);
        }
        #[cfg(not(feature = "reconcile-log"))]
        let _ = key;
    }

    /// `group/version` of the type.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Kind of the type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Counts one re-list of one of this type's watches in the `ReconcileLog`, if any (only
    /// with the test feature `reconcile-log`; otherwise nothing).
    pub fn count_relist(&self) {
        #[cfg(feature = "reconcile-log")]
        if let Some(log) = &self.log {
            log.relisted(&self.kind);
        }
    }

    /// Records the outcome of `key` (`namespace/name` of the virtual object); `None` forgets it
    /// (the object is gone on both sides).
    pub fn record(&self, key: &str, outcome: Option<Outcome>) {
        if let Ok(mut outcomes) = self.outcomes.lock() {
            match outcome {
                Some(outcome) => {
                    outcomes.insert(key.to_string(), outcome);
                }
                None => {
                    outcomes.remove(key);
                    #[cfg(feature = "reconcile-log")]
                    if let Some(log) = &self.log {
                        log.gone(&self.kind, key);
                    }
                }
            }
        }
    }

    /// The last recorded outcome of `key`.
    pub fn outcome(&self, key: &str) -> Option<Outcome> {
        self.outcomes.lock().ok()?.get(key).cloned()
    }

    /// Sets or clears a problem of the whole type.
    pub fn set_type_error(&self, error: Option<String>) {
        if let Ok(mut slot) = self.type_error.lock() {
            *slot = error;
        }
    }

    /// Sets what the watch `watch` (a cluster and side, such as `virtual`) holds undecodable:
    /// `count` objects, `example` one of them (`namespace/name: error`).
    pub fn set_undecodable(&self, watch: &str, count: usize, example: Option<String>) {
        if let Ok(mut undecodable) = self.undecodable.lock() {
            if count == 0 {
                undecodable.remove(watch);
            } else {
                let example = example.map(|e| format!("{watch} {} {e}", self.kind));
                undecodable.insert(watch.to_string(), (count, example));
            }
        }
    }

    /// Marks the type's watches as initialised.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Counts one write request (create, patch or delete) sent by the syncer (also in the
    /// metrics, if any: `vcp_runtime_writes_total`).
    pub fn count_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Some(counters) = &self.counters {
            counters.writes.inc();
        }
    }

    /// Write requests sent so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Current counts.
    pub fn summary(&self) -> TypeSummary {
        let mut summary = TypeSummary {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            type_error: self.type_error.lock().ok().and_then(|e| e.clone()),
            ready: self.ready.load(Ordering::Relaxed),
            ..TypeSummary::default()
        };
        if let Ok(undecodable) = self.undecodable.lock() {
            for (count, example) in undecodable.values() {
                summary.undecodable += i64::try_from(*count).unwrap_or(i64::MAX);
                if summary.undecodable_example.is_none() {
                    summary.undecodable_example = example.clone();
                }
            }
        }
        if let Ok(outcomes) = self.outcomes.lock() {
            let mut first_patch_error: Option<(&String, &String)> = None;
            for (key, outcome) in outcomes.iter() {
                match outcome {
                    Outcome::InSync => summary.in_sync += 1,
                    Outcome::Conflict => summary.conflicts += 1,
                    Outcome::Failed(_) => summary.failed += 1,
                    Outcome::PatchFailed(message) => {
                        summary.patch_failed += 1;
                        if first_patch_error.is_none_or(|(first, _)| key < first) {
                            first_patch_error = Some((key, message));
                        }
                    }
                    Outcome::Pending => {}
                }
            }
            summary.patch_error = first_patch_error.map(|(_, message)| message.clone());
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_given_once_per_key_forgotten_with_their_object_and_bounded() {
        let sent = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = sent.clone();
        let stats = TypeStats::new("v1", "Pod").with_warnings(std::sync::Arc::new(
            move |severity, reason, note, related| {
                sink.lock().unwrap().push((severity, reason, note, related));
            },
        ));
        let key = "uid-1 ImmutablePodFields /spec/nodeName";
        assert!(stats.warn_once(key, Reason::ImmutablePodFields, "a".into()));
        assert!(!stats.warn_once(key, Reason::ImmutablePodFields, "a".into()));
        // other skipped fields of the same pod, and a pod whose uid starts alike, are new
        assert!(stats.warn_once(
            "uid-1 ImmutablePodFields /spec/x",
            Reason::ImmutablePodFields,
            "b".into()
        ));
        assert!(stats.warn_once(
            "uid-10 ImmutablePodFields /spec/nodeName",
            Reason::ImmutablePodFields,
            "c".into()
        ));
        assert_eq!(sent.lock().unwrap().len(), 3);
        // the pod went: its warnings are forgotten, the other pod's are kept
        stats.forget_warnings_about("uid-1");
        assert_eq!(stats.warned_len(), 1);
        assert!(stats.warn_once(key, Reason::ImmutablePodFields, "a".into()));
        // never more than MAX_WARNED keys
        for n in 0..MAX_WARNED + 5 {
            stats.warn_once(
                &format!("u{n} ImmutablePodFields f"),
                Reason::ImmutablePodFields,
                String::new(),
            );
        }
        assert!(stats.warned_len() <= MAX_WARNED, "{}", stats.warned_len());
    }

    #[test]
    fn undecodable_objects_are_summed_over_the_watches_with_one_named() {
        let stats = TypeStats::new("e2e.vcp.test/v1", "Blob");
        stats.set_undecodable("virtual", 2, Some("a/deep: too deep".into()));
        stats.set_undecodable("host", 1, Some("vc/x: too deep".into()));
        let summary = stats.summary();
        assert_eq!(summary.undecodable, 3);
        // the first watch in name order: `host`
        assert_eq!(
            summary.undecodable_example.as_deref(),
            Some("host Blob vc/x: too deep")
        );
        stats.set_undecodable("host", 0, None);
        stats.set_undecodable("virtual", 0, None);
        let summary = stats.summary();
        assert_eq!(
            (summary.undecodable, summary.undecodable_example),
            (0, None)
        );
        // without metrics nothing is counted; with them, each skip on its own line
        assert_eq!(stats.count_undecodable("virtual"), 0);
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
        let stats = TypeStats::new("e2e.vcp.test/v1", "Blob").with_metrics(metrics.clone());
        assert_eq!(stats.count_undecodable("virtual"), 1);
        assert_eq!(stats.count_undecodable("virtual"), 2);
        assert_eq!(stats.count_undecodable("host"), 1);
        stats.count_write();
        assert_eq!(metrics.undecodable("e2e.vcp.test/v1", "Blob", "virtual"), 2);
        assert!(
            metrics.encode().contains(
                "vcp_runtime_writes_total{api_version=\"e2e.vcp.test/v1\",kind=\"Blob\"} 1"
            )
        );
    }

    #[test]
    fn patch_failures_are_counted_apart_with_the_first_message_by_key() {
        let stats = TypeStats::new("e2e.vcp.test/v1", "Widget");
        stats.record("b/two", Some(Outcome::PatchFailed("second".into())));
        stats.record("a/one", Some(Outcome::PatchFailed("first".into())));
        stats.record("c/ok", Some(Outcome::InSync));
        stats.record("d/bad", Some(Outcome::Failed("other".into())));
        let summary = stats.summary();
        assert_eq!(
            (summary.patch_failed, summary.failed, summary.in_sync),
            (2, 1, 1)
        );
        assert_eq!(summary.patch_error.as_deref(), Some("first"));
        // recovered: synced again
        stats.record("a/one", Some(Outcome::InSync));
        stats.record("b/two", Some(Outcome::InSync));
        let summary = stats.summary();
        assert_eq!((summary.patch_failed, summary.patch_error), (0, None));
    }

    #[cfg(feature = "reconcile-log")]
    #[test]
    fn reconciles_are_counted_per_kind_and_key_in_the_shared_log() {
        let log = std::sync::Arc::new(ReconcileLog::default());
        let cars = TypeStats::new("example.loft.sh/v1", "Car").with_log(log.clone());
        let pods = TypeStats::new("v1", "Pod").with_log(log.clone());
        cars.count_reconcile("a/audi");
        cars.count_reconcile("a/audi");
        pods.count_reconcile("a/audi");
        TypeStats::new("v1", "Pod").count_reconcile("a/audi"); // no log: not counted
        assert_eq!(log.reconciles("Car", "a/audi"), 2);
        assert_eq!(log.reconciles("Pod", "a/audi"), 1);
        assert_eq!(log.reconciles("Car", "a/bmw"), 0);
    }

    #[cfg(feature = "reconcile-log")]
    #[test]
    fn a_gone_object_leaves_the_log_but_its_last_count_is_kept_for_a_while() {
        let log = std::sync::Arc::new(ReconcileLog::default());
        let cars = TypeStats::new("example.loft.sh/v1", "Car").with_log(log.clone());
        cars.count_reconcile("a/audi");
        cars.count_reconcile("a/audi");
        cars.record("a/audi", None); // gone on both sides
        assert_eq!(log.len(), (0, 1));
        assert_eq!(
            log.reconciles("Car", "a/audi"),
            2,
            "still answered for once gone"
        );
        cars.count_reconcile("a/audi"); // it came back: the count goes on
        assert_eq!(log.reconciles("Car", "a/audi"), 3);
        assert_eq!(log.len(), (1, 0));
        // Churn: far more objects than the gone list keeps come and go.
        for n in 0..GONE_KEPT * 3 {
            let key = format!("b/car-{n}");
            cars.count_reconcile(&key);
            cars.record(&key, None);
        }
        assert_eq!(log.len(), (1, GONE_KEPT), "bounded whatever the churn");
        assert_eq!(
            log.reconciles("Car", "b/car-0"),
            0,
            "the oldest gone keys are dropped"
        );
        assert_eq!(
            log.reconciles("Car", &format!("b/car-{}", GONE_KEPT * 3 - 1)),
            1
        );
    }
}
