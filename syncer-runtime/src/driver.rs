//! The one loop behind every syncer of the runtime: watches → caches → work queue → workers.
//!
//! A [`Reconcile`] says which caches it reads, which key an event or a resync touches, and how
//! one key is reconciled; [`run`] does the rest, the same way for the `ToHost`
//! [`controller`](crate::controller), the `FromHost` sync ([`crate::from_host`]) and the pod
//! hooks ([`crate::pods`]):
//!
//! - each [`Watch`] feeds its side's compact [`Cache`] (objects kept as JSON, without
//!   `managedFields`: [`slim_for_cache`]) and pushes the keys its events touch; after every
//!   (re-)listing, and every `resync_period`, every key is pushed
//!   ([`Reconcile::for_each_key`]), so changes made while a watch was down converge;
//! - a watch that fails is retried after a capped exponential delay ([`crate::retry`]: 500 ms
//!   doubling up to `retry_max`, reset only by a delivered object or listing, not by the
//!   `Init` the watcher emits before each attempt; each failure is logged with `retry_in_ms`)
//!   and its error is the type's error in the statistics (`RuntimeHealthy=False,
//!   reason=TypeUnavailable`) until that watch delivers an event again;
//! - once every cache is listed, `workers` workers reconcile keys concurrently, one key never
//!   on two workers at once ([`crate::queue`]); a key whose reconcile took
//!   [`SLOW_RECONCILE`] or more (an object whose expressions run into their bound) goes to the
//!   queue's slow lane, served by [`slow_workers`]`(workers)` workers of its own, until a
//!   reconcile of it is fast again, so expensive objects never keep the cheap ones waiting; a
//!   failed reconcile is retried with per-key
//!   exponential backoff (200 ms … 30 s), a 409 (stale cache) without a warning; a key whose
//!   outcome is [`Outcome::Pending`] is looked at again after [`PENDING_DELAY`]; a conflict is
//!   reported once, when it starts; every outcome is recorded in the type's [`TypeStats`];
//! - each watch reads tolerantly (`vcp_crds::tolerant`): an object that cannot be
//!   decoded (a free-form field nested deeper than serde_json's limit of 128) fails alone, never
//!   the list or the watch. It is skipped and named (a warning log line with the kind, cluster,
//!   namespace, name and the error's path; one count of the runtime's
//!   `vcp_runtime_undecodable_objects_total` ([`crate::metrics`]) per event or listed item that
//!   did not decode; a `Warning` Event `Undecodable` on the plugin, once
//!   per object; the type's count in [`TypeStats`], which `RuntimeHealthy` reports), leaves its
//!   side's cache, and its key is kept in that cache's set of undecodable keys
//!   ([`Cache::skip`]). A reconcile that would read such an object does nothing
//!   ([`Reconcile::undecodable`]): an undecodable virtual object is not "missing", so its host
//!   copy is not deleted, and nothing is created or updated for it. When it decodes again or is
//!   deleted it leaves the set and its keys are reconciled: no restart is needed.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info, warn};
use vcp_crds::tolerant::{self, Skipped, StatusPolicy, Tolerant};

use crate::cache::Cache;
use crate::context::SyncObject;
use crate::error::Error;
use crate::patches::ObjectPatchError;
use crate::queue::{SLOW_RECONCILE, WorkQueue, WorkReceiver, work_queue};
use crate::retry::Retry;
use crate::stats::{Outcome, TypeStats};
use crate::translate::slim_for_cache;
use vcp_crds::Reason;

/// How long to wait before looking again at a key whose outcome is [`Outcome::Pending`] (an
/// object being deleted).
pub(crate) const PENDING_DELAY: Duration = Duration::from_secs(1);

/// The key of one unit of work: a namespace and a name (for `ToHost` the virtual object's, for
/// `FromHost` the host object's, for pod hooks the host pod's).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Called once when an object enters the conflict state, with a one-line description.
pub type ConflictReporter = Arc<dyn Fn(String) + Send + Sync>;

/// Which cluster a watch reads, and which of a reconciler's caches it feeds: the synced type
/// on each side, and for the objects brought back for it ([`crate::produced`]) a second type
/// on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Side {
    /// The virtual cluster (the vCluster's own API server).
    Virtual,
    /// The host cluster, in the vCluster's namespace.
    Host,
    /// The produced type in the virtual cluster ([`crate::produced`]).
    VirtualProduced,
    /// The produced type on the host, in the vCluster's namespace ([`crate::produced`]).
    HostProduced,
}

impl Side {
    fn cluster(self) -> &'static str {
        match self {
            Side::Virtual | Side::VirtualProduced => "virtual",
            Side::Host | Side::HostProduced => "host",
        }
    }

    /// The watch in messages and statistics: its cluster, and `produced` for the second type.
    fn label(self) -> &'static str {
        match self {
            Side::Virtual => "virtual",
            Side::Host => "host",
            Side::VirtualProduced => "virtual produced",
            Side::HostProduced => "host produced",
        }
    }
}

/// The tolerant `Api` of a watch ([`Watch::api`]): objects of `dt` with `client`, in
/// `namespace` (`None`: every namespace).
pub(crate) fn tolerant_api<K>(
    client: Client,
    namespace: Option<&str>,
    dt: &K::DynamicType,
) -> Api<Tolerant<K>>
where
    K: Resource,
    K::Scope: kube::core::NamespaceScope,
{
    Api::all_with(client, dt).constrain(namespace.unwrap_or_default())
}

/// One watched side: the objects of `api` matching `config`, into [`Reconcile::cache`]`(side)`.
pub(crate) struct Watch<K: Resource> {
    /// The side, which names the cache and the cluster in messages.
    pub side: Side,
    /// Where to watch, read tolerantly ([`tolerant_api`], module docs).
    pub api: Api<Tolerant<K>>,
    /// Selectors of the watch.
    pub config: watcher::Config,
}

/// How [`run`] runs.
pub(crate) struct Settings {
    /// Concurrent workers (at least 1).
    pub workers: usize,
    /// Every key is pushed again this often; `None`: only on (re-)listings.
    pub resync_period: Option<Duration>,
    /// Told about each new conflict.
    pub on_conflict: Option<ConflictReporter>,
    /// The longest delay between two attempts of a failing watch ([`crate::retry`]).
    pub retry_max: Duration,
}

/// What a syncer tells the driver (see the module docs).
pub(crate) trait Reconcile: Send + Sync + 'static {
    /// The watched type (the same on every side).
    type Object: SyncObject;

    /// Statistics of the type: outcomes, the type's error, readiness.
    fn stats(&self) -> &TypeStats;

    /// The cache of `side`, filled by the driver from that side's [`Watch`].
    fn cache(&self, side: Side) -> &Cache<Self::Object>;

    /// The key an event about `obj` on `side` touches, if any (`deleted`: a delete event; the
    /// object is already gone from the cache).
    fn key_of(&self, side: Side, obj: &Self::Object, deleted: bool) -> Option<ObjectKey>;

    /// Every key an event touches: [`Self::key_of`]'s, unless the reconciler says that an
    /// event can touch several (an object that several synced objects name, [`crate::produced`]).
    fn keys_of(&self, side: Side, obj: &Self::Object, deleted: bool) -> Vec<ObjectKey> {
        self.key_of(side, obj, deleted).into_iter().collect()
    }

    /// Calls `push` with every key to reconcile on a resync or after a (re-)listing (a key may
    /// come more than once: the work queue drops duplicates). Keys go straight to the queue,
    /// with no list of them made first: at 50,000 synced objects such a list held 100,000
    /// keys on top of the queue, the largest part of a restart's peak RSS above the first
    /// run's (`docs/BENCHMARKS.md`, "Sync runtime").
    fn for_each_key(&self, push: &mut dyn FnMut(ObjectKey));

    /// Called once every cache holds its first list, before the first reconcile (nothing by
    /// default; [`crate::produced`] tells its [`crate::produced::Claims`]).
    fn caches_ready(&self) {}

    /// One reconcile of `key` from the caches. `Ok(None)`: nothing to track any more (the
    /// key's outcome is forgotten).
    fn reconcile(
        &self,
        key: &ObjectKey,
    ) -> impl Future<Output = Result<Option<Outcome>, Error>> + Send;

    /// The undecodable object a reconcile of `key` would read (as `<side> namespace/name:
    /// error`), if any: the reconcile is then not run, and `key` is looked at again when that
    /// object decodes or goes (module docs). Each reconciler checks every cache its reconcile
    /// of `key` reads ([`Cache::undecodable`]).
    fn undecodable(&self, key: &ObjectKey) -> Option<String>;

    /// Every key an event about the undecodable object `meta` (only its identity is known) on
    /// `side` touches, besides those its last decoded version touched: by default the object's
    /// own `namespace/name`, the key of the side the reconciler's keys come from; a key of
    /// another side's object names nothing and its reconcile finds nothing to do.
    fn keys_of_undecodable(&self, _side: Side, meta: &ObjectMeta) -> Vec<ObjectKey> {
        vec![ObjectKey {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        }]
    }

    /// Whether `key` must be reconciled again right after the reconcile that just ended
    /// (something changed while it was writing that its watch events did not queue:
    /// [`crate::own_writes`]). Asked once after every reconcile.
    fn recheck(&self, _key: &ObjectKey) -> bool {
        false
    }

    /// The one-line report of a conflict on `key` (when [`Self::reconcile`] says
    /// [`Outcome::Conflict`]).
    fn conflict_message(&self, key: &ObjectKey) -> String {
        let stats = self.stats();
        format!(
            "{} {} {key} is in the way and is left untouched",
            stats.api_version(),
            stats.kind()
        )
    }
}

/// Runs `reconciler` over `watches` until the future is dropped (see the module docs). The
/// watch streams never end, so neither does this.
pub(crate) async fn run<R: Reconcile>(
    reconciler: R,
    watches: Vec<Watch<R::Object>>,
    settings: Settings,
) {
    let (queue, receiver) = work_queue::<ObjectKey>();
    let sides: Vec<Side> = watches.iter().map(|w| w.side).collect();
    let errors = WatchErrors::default();
    let watching = futures::future::join_all(
        watches
            .into_iter()
            .map(|w| watch(&reconciler, w, &queue, &errors, settings.retry_max)),
    );
    let resync = async {
        let Some(period) = settings.resync_period else {
            return std::future::pending().await;
        };
        let mut interval = tokio::time::interval(period);
        interval.tick().await;
        loop {
            interval.tick().await;
            push_all(&reconciler, &queue);
        }
    };
    let workers = async {
        for side in &sides {
            reconciler.cache(*side).wait_until_ready().await;
        }
        let stats = reconciler.stats();
        stats.set_ready();
        reconciler.caches_ready();
        let cached: Vec<String> = sides
            .iter()
            .map(|side| format!("{}: {}", side.cluster(), reconciler.cache(*side).len()))
            .collect();
        info!(
            kind = %stats.kind(),
            cached = %cached.join(", "),
            workers = settings.workers.max(1),
            "caches ready, syncing"
        );
        let workers = (0..settings.workers.max(1)).map(|_| {
            work(
                &reconciler,
                &queue,
                &receiver,
                settings.on_conflict.as_ref(),
                false,
            )
        });
        let slow = (0..slow_workers(settings.workers)).map(|_| {
            work(
                &reconciler,
                &queue,
                &receiver,
                settings.on_conflict.as_ref(),
                true,
            )
        });
        futures::future::join_all(workers.chain(slow)).await;
    };
    tokio::select! {
        _ = watching => {}
        () = resync => {}
        () = workers => {}
    }
}

/// Feeds one side's cache and pushes the keys its events touch.
async fn watch<R: Reconcile>(
    reconciler: &R,
    watch: Watch<R::Object>,
    queue: &WorkQueue<ObjectKey>,
    errors: &WatchErrors,
    retry_max: Duration,
) {
    let side = watch.side;
    let cache = reconciler.cache(side);
    // Objects that did not decode, told by the tolerant watcher before it yields the next
    // event: handled before that event, so that events of one object stay in order.
    let (skipped_tx, mut skipped_rx) = tokio::sync::mpsc::unbounded_channel::<Skipped>();
    // No `default_backoff()`: it resets on the `Init` the watcher emits before every list, so
    // a list that keeps failing was retried every ~0.8 s; the delay is ours (module docs).
    let events = tolerant::watcher(
        watch.api,
        watch.config,
        // a synced object's status is copied or compared: skipped whole when it does not decode
        StatusPolicy::Skip,
        move |skipped: &Skipped| {
            let _ = skipped_tx.send(skipped.clone());
        },
        // the cache drops its version in `Cache::skip`, with no event needed
        |_: &ObjectMeta| None,
    )
    .modify(|obj| slim_for_cache(obj.meta_mut()));
    let mut events = std::pin::pin!(events);
    let mut retry = Retry::new(retry_max);
    // Lists begun: the first, then one per re-list (counted, see `TypeStats::count_relist`).
    let mut lists = 0_u64;
    loop {
        let event = tokio::select! {
            biased;
            Some(skipped) = skipped_rx.recv() => {
                skip(reconciler, side, &skipped, queue);
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        while let Ok(skipped) = skipped_rx.try_recv() {
            skip(reconciler, side, &skipped, queue);
        }
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                let stats = reconciler.stats();
                let detail = format!(
                    "watching {} {} on the {} API server failed: {error}",
                    stats.api_version(),
                    stats.kind(),
                    side.cluster()
                );
                let delay = retry.next_delay();
                warn!(
                    error = %detail,
                    kind = %stats.kind(),
                    cluster = side.cluster(),
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "watch failed, retrying with backoff"
                );
                errors.set(side, Some(detail), stats);
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        if !matches!(event, watcher::Event::Init) {
            retry.reset();
        }
        if cache.apply(&event) {
            healed(reconciler, side, &event);
        }
        let keys = match &event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                reconciler.keys_of(side, obj, false)
            }
            watcher::Event::Delete(obj) => {
                if let Some(uid) = obj.meta().uid.as_deref() {
                    reconciler.stats().forget_warnings_about(uid);
                }
                reconciler.keys_of(side, obj, true)
            }
            watcher::Event::InitDone => {
                push_all(reconciler, queue);
                Vec::new()
            }
            watcher::Event::Init => {
                lists += 1;
                if lists > 1 {
                    reconciler.stats().count_relist();
                }
                continue;
            }
        };
        for key in keys {
            queue.push(key);
        }
        errors.set(side, None, reconciler.stats());
    }
}

/// The once-key of the `Undecodable` Event about the object `uid` on `side`.
fn undecodable_once(uid: &str, side: Side) -> String {
    format!("{uid} Undecodable {}", side.label())
}

/// One object of `side` that did not decode (module docs): named, taken out of the cache into
/// its set of undecodable keys, and the keys it touched queued (their reconciles then do
/// nothing while it stays undecodable).
fn skip<R: Reconcile>(reconciler: &R, side: Side, skipped: &Skipped, queue: &WorkQueue<ObjectKey>) {
    let stats = reconciler.stats();
    let cache = reconciler.cache(side);
    let meta = &skipped.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let object = tolerant::key_of(meta);
    if skipped.deleted {
        info!(kind = %stats.kind(), cluster = side.label(), %namespace, %name, "an object that could not be decoded was deleted");
        if let Some(uid) = meta.uid.as_deref() {
            stats.forget_warnings_about(uid);
        }
    } else {
        let total = stats.count_undecodable(side.cluster());
        warn!(
            kind = %stats.kind(),
            cluster = side.label(),
            %namespace,
            %name,
            error = %skipped.error,
            skipped_total = total,
            "skipped an object that cannot be decoded; nothing is done for it until it decodes again"
        );
        let note = format!(
            "{} {} {object} in the {} cluster cannot be decoded ({}): it is skipped and nothing is done for it (its copy is kept as it is) until it decodes again or is deleted; every other object goes on syncing",
            stats.api_version(),
            stats.kind(),
            side.cluster(),
            skipped.error
        );
        let related = ObjectReference {
            api_version: Some(stats.api_version().to_string()),
            kind: Some(stats.kind().to_string()),
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            ..ObjectReference::default()
        };
        let once = undecodable_once(meta.uid.as_deref().unwrap_or(&object), side);
        stats.warn_once_about(Some(related), &once, Reason::Undecodable, note);
    }
    let previous = cache.skip(skipped);
    let mut keys = reconciler.keys_of_undecodable(side, meta);
    if let Some(previous) = previous {
        keys.extend(reconciler.keys_of(side, &previous, true));
    }
    for key in keys {
        queue.push(key);
    }
    report_undecodable(reconciler, side);
}

/// `event` took an object of `side` out of the cache's undecodable set (it decodes again, or a
/// listing found it gone): its `Undecodable` Event may be given again, and the type's count is
/// updated.
fn healed<R: Reconcile>(reconciler: &R, side: Side, event: &watcher::Event<R::Object>) {
    if let watcher::Event::Apply(obj) | watcher::Event::Delete(obj) = event
        && let Some(uid) = obj.meta().uid.as_deref()
    {
        reconciler
            .stats()
            .forget_warning(&undecodable_once(uid, side));
    }
    if let watcher::Event::Apply(obj) = event {
        info!(kind = %reconciler.stats().kind(), cluster = side.label(), object = %tolerant::key_of(obj.meta()), "an object that could not be decoded decodes again");
    }
    report_undecodable(reconciler, side);
}

/// The type's count of undecodable objects of `side`, from its cache.
fn report_undecodable<R: Reconcile>(reconciler: &R, side: Side) {
    let (count, example) = reconciler.cache(side).undecodable_summary();
    reconciler
        .stats()
        .set_undecodable(side.label(), count, example);
}

fn push_all<R: Reconcile>(reconciler: &R, queue: &WorkQueue<ObjectKey>) {
    reconciler.for_each_key(&mut |key| queue.push(key));
}

/// The workers of the queue's slow lane beside `workers` fast ones: half as many, at least 1.
pub(crate) fn slow_workers(workers: usize) -> usize {
    (workers / 2).max(1)
}

/// One worker: reconciles the keys of its lane (`slow`: the slow lane) one after another.
async fn work<R: Reconcile>(
    reconciler: &R,
    queue: &WorkQueue<ObjectKey>,
    receiver: &WorkReceiver<ObjectKey>,
    on_conflict: Option<&ConflictReporter>,
    slow: bool,
) {
    loop {
        let next = if slow {
            receiver.next_slow().await
        } else {
            receiver.next().await
        };
        let Some(key) = next else { return };
        process(reconciler, &key, queue, on_conflict).await;
        receiver.done(&key);
    }
}

/// The reconcile of one object: its span carries the type and the object (inside the span of
/// the plugin's type task, which carries the plugin and the vCluster), so every log line of the
/// reconcile and of its writes names them.
#[tracing::instrument(name = "reconcile", skip_all, fields(kind = %reconciler.stats().kind(), object = %key))]
async fn process<R: Reconcile>(
    reconciler: &R,
    key: &ObjectKey,
    queue: &WorkQueue<ObjectKey>,
    on_conflict: Option<&ConflictReporter>,
) {
    let stats = reconciler.stats();
    let id = key.to_string();
    if let Some(object) = reconciler.undecodable(key) {
        // nothing is done while an object it reads cannot be decoded (module docs); named
        // when it was skipped, reconciled again when it decodes or goes
        debug!(%object, "an object of this key cannot be decoded, nothing done");
        stats.count_reconcile(&id);
        stats.record(&id, None);
        queue.forget(key);
        return;
    }
    let started = std::time::Instant::now();
    // A panic in one object's reconcile (a bug met by that object's data) fails that object
    // alone, retried with backoff like any error; unwinding out of here would end the worker,
    // and with it the whole type's task (every object of the type stopped syncing).
    let result = match std::panic::AssertUnwindSafe(reconciler.reconcile(key))
        .catch_unwind()
        .await
    {
        Ok(result) => result,
        Err(panic) => Err(Error::Panicked {
            object: id.clone(),
            message: panic_message(panic.as_ref()),
        }),
    };
    queue.set_slow(key, started.elapsed() >= SLOW_RECONCILE);
    stats.count_reconcile(&id);
    if reconciler.recheck(key) {
        queue.push(key.clone()); // queued again once this worker is done with it
    }
    match result {
        Ok(outcome) => {
            queue.forget(key);
            if outcome == Some(Outcome::Conflict) && stats.outcome(&id) != Some(Outcome::Conflict) {
                let conflict = reconciler.conflict_message(key);
                warn!(%conflict, "conflict");
                if let Some(report) = on_conflict {
                    report(conflict);
                }
            }
            if outcome == Some(Outcome::Pending) {
                queue.push_after(key.clone(), PENDING_DELAY);
            }
            stats.record(&id, outcome);
        }
        Err(Error::Patch(failure)) => {
            let ObjectPatchError {
                api_version,
                kind,
                object,
                uid,
                source,
            } = *failure;
            // nothing of the object was written; the others keep syncing (crate::patches)
            warn!(%object, path = %source.path, error = %source, "patch failed, object not written, retrying with backoff");
            let note = format!(
                "{api_version} {kind} {object}: patch {:?} ({}) failed, so the object is not synced (retried with backoff): {}",
                source.path, source.what, source.message
            );
            let related = ObjectReference {
                api_version: Some(api_version.clone()),
                kind: Some(kind.clone()),
                namespace: Some(key.namespace.clone()).filter(|n| !n.is_empty()),
                name: Some(key.name.clone()),
                uid: uid.clone(),
                ..ObjectReference::default()
            };
            // once per object (by uid) and patch path: forgotten when the object goes
            let once = format!(
                "{} PatchFailed {kind} {object} {}",
                uid.as_deref().unwrap_or(&id),
                source.path
            );
            stats.warn_once_about(Some(related), &once, Reason::PatchFailed, note);
            stats.record(&id, Some(Outcome::PatchFailed(source.to_string())));
            queue.retry(key.clone());
        }
        Err(error) => {
            if error.is_conflict() {
                debug!(%error, "stale cache, retrying");
            } else {
                warn!(%error, "sync failed, retrying with backoff");
            }
            stats.record(&id, Some(Outcome::Failed(error.to_string())));
            queue.retry(key.clone());
        }
    }
}

/// The text of a caught panic's payload (`panic!` with a message gives a `&str` or a
/// `String`; anything else is named as such).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The last error of each failing watch; their join is the type's error.
#[derive(Default)]
struct WatchErrors(Mutex<BTreeMap<Side, String>>);

impl WatchErrors {
    /// Records (`Some`) or clears (`None`) the error of `side`, and updates the type's error in
    /// `stats` when that changed anything.
    fn set(&self, side: Side, error: Option<String>, stats: &TypeStats) {
        let Ok(mut errors) = self.0.lock() else {
            return;
        };
        let changed = match error {
            Some(error) => errors.insert(side, error.clone()).as_ref() != Some(&error),
            None => errors.remove(&side).is_some(),
        };
        if changed {
            let joined: Vec<&str> = errors.values().map(String::as_str).collect();
            stats.set_type_error((!joined.is_empty()).then(|| joined.join("; ")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reconciler whose reconcile of `ns/boom` panics, as a bug met by one object's data
    /// would (an attacker's multi-byte name did, and ended the type's task).
    struct PanicsOnBoom {
        stats: TypeStats,
        cache: Cache<k8s_openapi::api::core::v1::ConfigMap>,
    }

    impl Reconcile for PanicsOnBoom {
        type Object = k8s_openapi::api::core::v1::ConfigMap;
        fn stats(&self) -> &TypeStats {
            &self.stats
        }
        fn cache(&self, _side: Side) -> &Cache<Self::Object> {
            &self.cache
        }
        fn key_of(&self, _side: Side, _obj: &Self::Object, _deleted: bool) -> Option<ObjectKey> {
            None
        }
        fn for_each_key(&self, _push: &mut dyn FnMut(ObjectKey)) {}
        async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
            if key.name == "boom" {
                let name = "é-tls";
                let _ = &name[..1]; // byte 1 is inside 'é': panics
            }
            Ok(Some(Outcome::InSync))
        }
        fn undecodable(&self, _key: &ObjectKey) -> Option<String> {
            None
        }
    }

    #[tokio::test]
    async fn a_panicking_reconcile_fails_its_object_alone() {
        let reconciler = PanicsOnBoom {
            stats: TypeStats::new("v1", "ConfigMap"),
            cache: Cache::new(),
        };
        let (queue, _receiver) = work_queue::<ObjectKey>();
        let key = |name: &str| ObjectKey {
            namespace: "ns".into(),
            name: name.into(),
        };
        process(&reconciler, &key("boom"), &queue, None).await;
        match reconciler.stats.outcome("ns/boom") {
            Some(Outcome::Failed(message)) => assert!(
                message.contains("the reconcile of ns/boom panicked")
                    && message.contains("is not a char boundary"),
                "{message}"
            ),
            other => panic!("ns/boom: {other:?}"),
        }
        // the same worker goes on with the next object
        process(&reconciler, &key("fine"), &queue, None).await;
        assert_eq!(reconciler.stats.outcome("ns/fine"), Some(Outcome::InSync));
    }

    #[test]
    fn a_watch_error_lasts_until_that_watch_delivers_again() {
        let stats = TypeStats::new("example.loft.sh/v1", "Car");
        let errors = WatchErrors::default();
        errors.set(Side::Host, Some("host down".into()), &stats);
        assert_eq!(stats.summary().type_error.as_deref(), Some("host down"));
        errors.set(Side::Virtual, Some("virtual down".into()), &stats);
        assert_eq!(
            stats.summary().type_error.as_deref(),
            Some("virtual down; host down")
        );
        // the virtual watch works again: only the host's error is left
        errors.set(Side::Virtual, None, &stats);
        assert_eq!(stats.summary().type_error.as_deref(), Some("host down"));
        // events of a side without an error leave another error in the statistics alone
        stats.set_type_error(Some("discovery failed".into()));
        errors.set(Side::Virtual, None, &stats);
        assert_eq!(
            stats.summary().type_error.as_deref(),
            Some("discovery failed")
        );
        errors.set(Side::Host, None, &stats);
        assert_eq!(stats.summary().type_error, None);
    }
}
