//! The controller that drives a [`Syncer`]: watches, work queue, workers, and the lifecycle
//! table of `shared/DESIGN.md` for virtual-to-host (`ToHost`) types.
//!
//! Both sides are watched into caches (compact ones: each object kept as its JSON, parsed when
//! its key is reconciled): the virtual cluster in all namespaces (filtered by
//! [`Syncer::selector`]), the host only in the vCluster's namespace (a Role suffices). Every event maps to the key `namespace/name` of a virtual object (host
//! objects through their [`NAME_ANNOTATION`](crate::translate::NAME_ANNOTATION) /
//! [`NAMESPACE_ANNOTATION`](crate::translate::NAMESPACE_ANNOTATION), or through the host name
//! of a known virtual object for host objects this vCluster does not manage); several workers
//! reconcile keys concurrently, one key never on two workers at once:
//!
//! | virtual | host | action |
//! | --- | --- | --- |
//! | exists | missing | [`Syncer::sync_to_host`] (create, `CreatePhysical` hooks first) |
//! | exists | exists, ours | [`Syncer::sync`] (patch only what differs, `UpdatePhysical` hooks) |
//! | missing / terminating | exists, ours | [`Syncer::sync_to_virtual`] (delete host) |
//! | exists | exists, ours, other `object-uid` | delete host, then [`Syncer::sync_to_host`] |
//! | any | exists, not ours | never touched; counted as a conflict, reported once |
//!
//! A failed reconcile is retried with per-key exponential backoff (200 ms … 30 s); 409
//! conflicts (a stale cache) are retried the same way without a warning. After both caches
//! are listed, and after every re-list (an API server restart, a watch that expired), every
//! key is reconciled, so changes made while the runtime was down or disconnected converge.
//!
//! The caches hold each object without its `managedFields`
//! ([`slim_for_cache`](crate::translate::slim_for_cache)): a syncer sees the objects it is handed
//! without them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::cache::Cache;
use crate::error::Error;
use crate::queue::{WorkQueue, WorkReceiver, work_queue};
use crate::sdk::{HookPoint, RegisterContext, SyncContext, SyncObject, Syncer};
use crate::stats::Outcome;
use crate::translate::{UID_ANNOTATION, slim_for_cache};

/// How long to wait before looking again at an object whose host copy is being deleted.
const PENDING_DELAY: Duration = Duration::from_secs(1);

/// Identity of a virtual object: its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Virtual namespace.
    pub namespace: String,
    /// Virtual name.
    pub name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Called once when an object enters the conflict state, with a one-line description.
pub type ConflictReporter = Arc<dyn Fn(String) + Send + Sync>;

/// How a controller runs.
#[derive(Clone)]
pub struct Options {
    /// Concurrent workers (at least 1).
    pub workers: usize,
    /// Every key of both caches is reconciled again this often.
    pub resync_period: Duration,
    /// Told about host objects of a translated name that this vCluster does not manage.
    pub on_conflict: Option<ConflictReporter>,
}

impl From<&RegisterContext> for Options {
    fn from(ctx: &RegisterContext) -> Self {
        Self {
            workers: ctx.workers.max(1),
            resync_period: ctx.resync_period,
            on_conflict: None,
        }
    }
}

struct Controller<S: Syncer> {
    syncer: S,
    ctx: SyncContext<S::Object>,
    options: Options,
    virtual_store: Cache<S::Object>,
    host_store: Cache<S::Object>,
    /// Host name → virtual key of every known virtual object, to find the virtual object of a
    /// host object this vCluster does not manage (conflicts).
    host_index: Mutex<HashMap<String, ObjectKey>>,
}

/// Runs `syncer` until the future is dropped: watches both sides and reconciles every object.
/// Watch failures (RBAC, connectivity) are retried with backoff and recorded in the type's
/// statistics; failures of single objects are retried with per-object backoff.
///
/// # Errors
/// None at present: the future only ends when dropped; the `Result` leaves room for fatal
/// errors.
pub async fn run<S: Syncer>(
    syncer: S,
    ctx: SyncContext<S::Object>,
    options: Options,
) -> Result<(), Error> {
    let dt = syncer.dynamic_type();
    let mut virtual_config = watcher::Config::default();
    if let Some(selector) = syncer.selector() {
        virtual_config = virtual_config.labels_from(&selector);
    }
    let virtual_api = Api::<S::Object>::all_with(ctx.virtual_client().clone(), &dt);
    let host_api = ctx.host_api();
    let controller = Arc::new(Controller {
        virtual_store: Cache::new(),
        host_store: Cache::new(),
        host_index: Mutex::new(HashMap::new()),
        syncer,
        ctx,
        options,
    });
    let virtual_events = watcher(virtual_api, virtual_config)
        .default_backoff()
        .modify(|obj| slim_for_cache(obj.meta_mut()));
    let host_events = watcher(host_api, watcher::Config::default())
        .default_backoff()
        .modify(|obj| slim_for_cache(obj.meta_mut()));
    let (queue, receiver) = work_queue::<ObjectKey>();
    let receiver = Arc::new(receiver);

    let watch_virtual = {
        let controller = controller.clone();
        let queue = queue.clone();
        async move {
            let mut events = std::pin::pin!(virtual_events);
            while let Some(event) = events.next().await {
                controller.on_virtual_event(event, &queue);
            }
        }
    };
    let watch_host = {
        let controller = controller.clone();
        let queue = queue.clone();
        async move {
            let mut events = std::pin::pin!(host_events);
            while let Some(event) = events.next().await {
                controller.on_host_event(event, &queue);
            }
        }
    };
    let resync = {
        let controller = controller.clone();
        let queue = queue.clone();
        async move {
            let mut interval = tokio::time::interval(controller.options.resync_period);
            interval.tick().await;
            loop {
                interval.tick().await;
                controller.push_all(&queue);
            }
        }
    };
    let workers = {
        let controller = controller.clone();
        async move {
            controller.virtual_store.wait_until_ready().await;
            controller.host_store.wait_until_ready().await;
            controller.ctx.stats().set_ready();
            info!(
                kind = %controller.ctx.translator().kind(),
                virtual_objects = controller.virtual_store.len(),
                host_objects = controller.host_store.len(),
                workers = controller.options.workers,
                "caches ready, syncing"
            );
            let workers = (0..controller.options.workers.max(1)).map(|_| {
                let controller = controller.clone();
                let queue = queue.clone();
                let receiver = receiver.clone();
                async move { controller.work(&queue, &receiver).await }
            });
            futures::future::join_all(workers).await;
        }
    };
    tokio::select! {
        () = watch_virtual => {}
        () = watch_host => {}
        () = resync => {}
        () = workers => {}
    }
    Ok(())
}

impl<S: Syncer> Controller<S> {
    fn on_virtual_event(
        &self,
        event: Result<watcher::Event<S::Object>, watcher::Error>,
        queue: &WorkQueue<ObjectKey>,
    ) {
        if let Ok(event) = &event {
            self.virtual_store.apply(event);
        }
        match event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                self.ctx.stats().set_type_error(None);
                let key = virtual_key(&obj);
                self.index(&key);
                queue.push(key);
            }
            Ok(watcher::Event::Delete(obj)) => {
                let key = virtual_key(&obj);
                self.unindex(&key);
                queue.push(key);
            }
            Ok(watcher::Event::InitDone) => {
                self.ctx.stats().set_type_error(None);
                self.push_all(queue);
            }
            Ok(watcher::Event::Init) => {}
            Err(error) => self.watch_failed("virtual", &error),
        }
    }

    fn on_host_event(
        &self,
        event: Result<watcher::Event<S::Object>, watcher::Error>,
        queue: &WorkQueue<ObjectKey>,
    ) {
        if let Ok(event) = &event {
            self.host_store.apply(event);
        }
        match event {
            Ok(
                watcher::Event::Apply(obj)
                | watcher::Event::InitApply(obj)
                | watcher::Event::Delete(obj),
            ) => {
                if let Some(key) = self.key_of_host(&obj) {
                    queue.push(key);
                }
            }
            Ok(watcher::Event::InitDone) => self.push_all(queue),
            Ok(watcher::Event::Init) => {}
            Err(error) => self.watch_failed("host", &error),
        }
    }

    fn watch_failed(&self, cluster: &str, error: &watcher::Error) {
        let message = format!(
            "watching {} {} on the {cluster} API server failed: {error}",
            self.ctx.translator().api_version(),
            self.ctx.translator().kind()
        );
        warn!(%message, "watch failed, retrying with backoff");
        self.ctx.stats().set_type_error(Some(message));
    }

    fn index(&self, key: &ObjectKey) {
        let host_name = self.ctx.translator().host_name(&key.name, &key.namespace);
        if let Ok(mut index) = self.host_index.lock() {
            index.insert(host_name, key.clone());
        }
    }

    fn unindex(&self, key: &ObjectKey) {
        let host_name = self.ctx.translator().host_name(&key.name, &key.namespace);
        if let Ok(mut index) = self.host_index.lock() {
            index.remove(&host_name);
        }
    }

    fn key_of_host(&self, obj: &S::Object) -> Option<ObjectKey> {
        if let Some((namespace, name)) = self.ctx.translator().virtual_key(obj.meta()) {
            return Some(ObjectKey { namespace, name });
        }
        let index = self.host_index.lock().ok()?;
        index.get(&obj.name_any()).cloned()
    }

    fn push_all(&self, queue: &WorkQueue<ObjectKey>) {
        for (namespace, name) in self.virtual_store.keys() {
            queue.push(ObjectKey { namespace, name });
        }
        for obj in self.host_store.objects() {
            if let Some(key) = self.key_of_host(&obj) {
                queue.push(key);
            }
        }
    }

    async fn work(&self, queue: &WorkQueue<ObjectKey>, receiver: &WorkReceiver<ObjectKey>) {
        while let Some(key) = receiver.next().await {
            self.process(&key, queue).await;
            receiver.done(&key);
        }
    }

    async fn process(&self, key: &ObjectKey, queue: &WorkQueue<ObjectKey>) {
        let stats = self.ctx.stats();
        let id = key.to_string();
        match self.reconcile(key).await {
            Ok(outcome) => {
                queue.forget(key);
                if outcome == Some(Outcome::Conflict)
                    && stats.outcome(&id) != Some(Outcome::Conflict)
                {
                    let message = format!(
                        "host {} {}/{} (for virtual {key}) exists and is not managed by vCluster {}; it is left untouched",
                        self.ctx.translator().kind(),
                        self.ctx.host_namespace(),
                        self.ctx.translator().host_name(&key.name, &key.namespace),
                        self.ctx.translator().vcluster(),
                    );
                    warn!(%message, "conflict");
                    if let Some(report) = &self.options.on_conflict {
                        report(message);
                    }
                }
                if outcome == Some(Outcome::Pending) {
                    queue.push_after(key.clone(), PENDING_DELAY);
                }
                stats.record(&id, outcome);
            }
            Err(error) => {
                if error.is_conflict() {
                    debug!(object = %key, %error, "stale cache, retrying");
                } else {
                    warn!(kind = %self.ctx.translator().kind(), object = %key, %error, "sync failed, retrying with backoff");
                }
                stats.record(&id, Some(Outcome::Failed(error.to_string())));
                queue.retry(key.clone());
            }
        }
    }

    /// One step of the lifecycle table for `key`. `Ok(None)`: nothing exists any more.
    async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
        let translator = self.ctx.translator();
        let host_name = translator.host_name(&key.name, &key.namespace);
        let virtual_obj = self
            .virtual_store
            .get(&key.namespace, &key.name)
            .filter(|obj| obj.meta().deletion_timestamp.is_none())
            .map(Arc::new);
        let host_obj = self
            .host_store
            .get(self.ctx.host_namespace(), &host_name)
            .map(Arc::new);
        let ours = host_obj
            .as_ref()
            .is_some_and(|h| translator.is_host_copy_of(h.meta(), &key.name, &key.namespace));
        let hooks = self.ctx.hooks();

        match (virtual_obj, host_obj) {
            (None, Some(host)) if ours => {
                if host.meta().deletion_timestamp.is_none() {
                    let host = hooked(hooks, HookPoint::GetPhysical, host)?;
                    self.syncer.sync_to_virtual(&self.ctx, &host).await?;
                }
                Ok(None)
            }
            (None, _) => Ok(None),
            (Some(_), Some(_)) if !ours => Ok(Some(Outcome::Conflict)),
            (Some(_), Some(host)) if host.meta().deletion_timestamp.is_some() => {
                Ok(Some(Outcome::Pending))
            }
            (Some(virtual_obj), Some(host)) => {
                let virtual_obj = hooked(hooks, HookPoint::GetVirtual, virtual_obj)?;
                let host_uid = host.annotations().get(UID_ANNOTATION).cloned();
                if host_uid != virtual_obj.meta().uid {
                    info!(object = %key, host = %host_name, "host copy belongs to an earlier object of the same name, replacing it");
                    self.ctx.delete_host(&host).await?;
                    self.syncer.sync_to_host(&self.ctx, &virtual_obj).await?;
                    return Ok(Some(Outcome::InSync));
                }
                let host = hooked(hooks, HookPoint::GetPhysical, host)?;
                self.syncer.sync(&self.ctx, &host, &virtual_obj).await?;
                Ok(Some(Outcome::InSync))
            }
            (Some(virtual_obj), None) => {
                let virtual_obj = hooked(hooks, HookPoint::GetVirtual, virtual_obj)?;
                self.syncer.sync_to_host(&self.ctx, &virtual_obj).await?;
                Ok(Some(Outcome::InSync))
            }
        }
    }
}

fn virtual_key<K: Resource>(obj: &K) -> ObjectKey {
    ObjectKey {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

/// `obj` after the hooks of `point`; the same `Arc` (no copy) when no hook implements it.
fn hooked<K: SyncObject>(
    hooks: &crate::sdk::Hooks,
    point: HookPoint,
    obj: Arc<K>,
) -> Result<Arc<K>, Error> {
    if !hooks.handles(point) {
        return Ok(obj);
    }
    Ok(Arc::new(hooks.apply_typed(point, (*obj).clone())?))
}
