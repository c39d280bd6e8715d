//! The controller that drives a [`Syncer`]: the lifecycle table (create, update, replace, delete,
//! never touch a foreign object) for virtual-to-host (`ToHost`) types, run by the runtime's one
//! driver (`driver.rs`) (watches, compact caches, work queue, workers, retries, resyncs).
//!
//! Both sides are watched: the virtual cluster in all namespaces (filtered by
//! [`Syncer::selector`]), the host only in the vCluster's namespace (a Role suffices). Every
//! event maps to the key `namespace/name` of a virtual object (host objects through their
//! [`NAME_ANNOTATION`](crate::translate::NAME_ANNOTATION) /
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
//! | exists, no longer matching the selector | exists, ours | as missing: delete host, and say so |
//! | any | exists, not ours | never touched; counted as a conflict, reported once |
//!
//! Except when the virtual type itself vanished (its CRD deleted): then host copies are kept,
//! and adopted by the re-created objects of the same names ([`crate::vanish`]).
//!
//! A virtual object that stops matching [`Syncer::selector`] (relabelled, or the selector
//! narrowed) drops out of the filtered watch like a deleted one, and its host copy is deleted:
//! vCluster v0.30.0 does the same for a synced type with a selector (such as
//! `sync.fromHost.ingressClasses.selector`, `pkg/controllers/resources/ingressclasses/syncer.go`:
//! a copy whose source no longer matches is deleted with the log line "delete ... because ...
//! does not match the selector"). Here the deletion is logged, counted
//! ([`TypeStats::deselected`]) and published as a `Normal` Event `SelectorNoLongerMatches` on
//! the `VClusterPlugin`; relabelled back in, the object is synced again (a new host copy).
//!
//! A failed reconcile is retried with per-key exponential backoff (200 ms … 30 s); 409
//! conflicts (a stale cache) are retried the same way without a warning. After both caches
//! are listed, and after every re-list (an API server restart, a watch that expired), every
//! key is reconciled, so changes made while the runtime was down or disconnected converge.
//!
//! The host watch event of the runtime's own create or patch (its echo) queues nothing when the
//! syncer says the reconcile it would cause writes nothing ([`Syncer::echo_is_a_no_op`]: the
//! declarative syncer) and the type has no hooks: the write's response already said what it
//! brings ([`crate::own_writes`]). Otherwise it is reconciled, as vCluster does (its
//! controllers reconcile after their own writes; an `UpdatePhysical` hook, for one, first
//! applies on that reconcile after a create).
//!
//! The caches hold each object without its `managedFields`
//! ([`slim_for_cache`](crate::translate::slim_for_cache)): a syncer sees the objects it is handed
//! without them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vcp_crds::Reason;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::SelectorExt;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tracing::{debug, info};

use crate::cache::Cache;
use crate::context::{RegisterContext, SyncContext, SyncObject};
use crate::driver::{self, Reconcile, Settings, Side, Watch};
pub use crate::driver::{ConflictReporter, ObjectKey};
use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::stats::{Outcome, TypeStats};
use crate::syncer::Syncer;
use crate::translate::UID_ANNOTATION;
use crate::vanish::TypeGuard;

/// How a controller runs.
#[derive(Clone)]
pub struct Options {
    /// Concurrent workers (at least 1).
    pub workers: usize,
    /// Every key of both caches is reconciled again this often.
    pub resync_period: Duration,
    /// Told about host objects of a translated name that this vCluster does not manage.
    pub on_conflict: Option<ConflictReporter>,
    /// The longest delay between two attempts of a failing watch ([`crate::retry`]).
    pub retry_max: Duration,
}

impl From<&RegisterContext> for Options {
    fn from(ctx: &RegisterContext) -> Self {
        Self {
            workers: ctx.workers.max(1),
            resync_period: ctx.resync_period,
            on_conflict: None,
            retry_max: ctx.retry_max,
        }
    }
}

struct Controller<S: Syncer> {
    syncer: S,
    ctx: SyncContext<S::Object>,
    virtual_store: Cache<S::Object>,
    host_store: Cache<S::Object>,
    /// Host name → virtual key of every known virtual object, to find the virtual object of a
    /// host object this vCluster does not manage (conflicts).
    host_index: Mutex<HashMap<String, ObjectKey>>,
    /// Keeps host copies when the virtual type vanishes ([`crate::vanish`]).
    guard: TypeGuard,
    /// Whether the host watch events of the runtime's own writes are left unreconciled:
    /// [`Syncer::echo_is_a_no_op`] and no hooks for the type ([`crate::own_writes`]).
    skip_echoes: bool,
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
    let watches = vec![
        Watch {
            side: Side::Virtual,
            api: driver::tolerant_api(ctx.virtual_client().clone(), None, &dt),
            config: virtual_config,
        },
        Watch {
            side: Side::Host,
            api: driver::tolerant_api(ctx.host_client().clone(), Some(ctx.host_namespace()), &dt),
            config: watcher::Config::default(),
        },
    ];
    let guard = TypeGuard::new(
        ctx.virtual_client().clone(),
        &S::Object::group(&dt),
        &S::Object::version(&dt),
        &S::Object::plural(&dt),
    );
    let skip_echoes = syncer.echo_is_a_no_op() && ctx.hooks().is_empty();
    let controller = Controller {
        guard,
        skip_echoes,
        virtual_store: Cache::new(),
        host_store: Cache::new(),
        host_index: Mutex::new(HashMap::new()),
        syncer,
        ctx,
    };
    let settings = Settings {
        workers: options.workers,
        resync_period: Some(options.resync_period),
        on_conflict: options.on_conflict,
        retry_max: options.retry_max,
    };
    driver::run(controller, watches, settings).await;
    Ok(())
}

impl<S: Syncer> Reconcile for Controller<S> {
    type Object = S::Object;

    fn stats(&self) -> &TypeStats {
        self.ctx.stats()
    }

    fn cache(&self, side: Side) -> &Cache<S::Object> {
        match side {
            Side::Virtual | Side::VirtualProduced => &self.virtual_store,
            Side::Host | Side::HostProduced => &self.host_store,
        }
    }

    fn key_of(&self, side: Side, obj: &S::Object, deleted: bool) -> Option<ObjectKey> {
        match side {
            Side::Virtual => {
                let key = ObjectKey {
                    namespace: obj.namespace().unwrap_or_default(),
                    name: obj.name_any(),
                };
                let host_name = self.ctx.translator().host_name(&key.name, &key.namespace);
                if let Ok(mut index) = self.host_index.lock() {
                    if deleted {
                        index.remove(&host_name);
                    } else {
                        index.insert(host_name, key.clone());
                    }
                }
                Some(key)
            }
            // the echo of the runtime's own create or patch, or an event while one is in
            // flight (the write's reconcile decides): no reconcile when echoes are no-ops for
            // this type; every host event ends a reconcile's wait for it (crate::own_writes)
            Side::Host => {
                let name = obj.name_any();
                let own_writes = self.ctx.own_writes();
                if deleted {
                    own_writes.forget(&name);
                    return self.key_of_host(obj);
                }
                let echo = own_writes.is_echo(&name, obj.meta().resource_version.as_deref());
                if echo && self.skip_echoes {
                    return None;
                }
                self.key_of_host(obj)
            }
            Side::VirtualProduced | Side::HostProduced => None,
        }
    }

    fn undecodable(&self, key: &ObjectKey) -> Option<String> {
        if let Some(error) = self.virtual_store.undecodable(&key.namespace, &key.name) {
            return Some(format!("virtual {key}: {error}"));
        }
        let host_ns = self.ctx.host_namespace();
        let host_name = self.ctx.translator().host_name(&key.name, &key.namespace);
        self.host_store
            .undecodable(host_ns, &host_name)
            .map(|error| format!("host {host_ns}/{host_name}: {error}"))
    }

    fn keys_of_undecodable(&self, side: Side, meta: &ObjectMeta) -> Vec<ObjectKey> {
        let name = meta.name.clone().unwrap_or_default();
        match side {
            // a host object's key is in its annotations, unread: the known virtual object of
            // its name, if any
            Side::Host => self
                .host_index
                .lock()
                .ok()
                .and_then(|index| index.get(&name).cloned())
                .into_iter()
                .collect(),
            _ => vec![ObjectKey {
                namespace: meta.namespace.clone().unwrap_or_default(),
                name,
            }],
        }
    }

    fn for_each_key(&self, push: &mut dyn FnMut(ObjectKey)) {
        self.virtual_store.for_each_key(|namespace, name| {
            push(ObjectKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        });
        self.host_store.for_each(|obj| {
            if let Some(key) = self.key_of_host(&obj) {
                push(key);
            }
        });
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
        let cached_version = host_obj
            .as_ref()
            .and_then(|host| host.meta().resource_version.as_deref());
        if self.ctx.own_writes().behind(&host_name, cached_version) {
            // the host watch has not delivered this key's last write yet: a write now would be
            // guarded by a stale resourceVersion (a sure 409); its event reconciles the key
            debug!(object = %key, host = %host_name, "host cache behind the runtime's last write, waiting for its event");
            return Ok(Some(Outcome::Pending));
        }
        let ours = host_obj
            .as_ref()
            .is_some_and(|h| translator.is_host_copy_of(h.meta(), &key.name, &key.namespace));
        let hooks = self.ctx.hooks();

        match (virtual_obj, host_obj) {
            (None, Some(host)) if ours => {
                if host.meta().deletion_timestamp.is_none() {
                    // never because the type vanished (crate::vanish)
                    if !self.guard.may_delete(key, self.ctx.stats()).await? {
                        return Ok(None);
                    }
                    let deselected = self.deselected(key).await?;
                    let host = hooked(hooks, HookPoint::GetPhysical, host)?;
                    self.syncer.sync_to_virtual(&self.ctx, &host).await?;
                    if let Some(selector) = deselected {
                        self.report_deselected(key, &host_name, &selector);
                    }
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
                if host_uid != virtual_obj.meta().uid && !self.guard.adopt(key, self.ctx.stats()) {
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
                match self.syncer.sync_to_host(&self.ctx, &virtual_obj).await {
                    Ok(()) => Ok(Some(Outcome::InSync)),
                    Err(error) if error.is_already_exists() => {
                        self.already_exists(key, &host_name, error).await
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }

    fn recheck(&self, key: &ObjectKey) -> bool {
        // only events held while a write was in flight ask for a recheck (when echoes are
        // reconciled too, that event queued the key already: pushing it again is a no-op)
        let host_name = self.ctx.translator().host_name(&key.name, &key.namespace);
        self.ctx.own_writes().take_recheck(&host_name)
    }

    fn conflict_message(&self, key: &ObjectKey) -> String {
        format!(
            "host {} {}/{} (for virtual {key}) exists and is not managed by vCluster {}; it is left untouched",
            self.ctx.translator().kind(),
            self.ctx.host_namespace(),
            self.ctx.translator().host_name(&key.name, &key.namespace),
            self.ctx.translator().vcluster(),
        )
    }
}

impl<S: Syncer> Controller<S> {
    /// The selector (as text) when the virtual object `key` exists, is not being deleted and
    /// no longer matches [`Syncer::selector`] (relabelled, or the selector narrowed): the
    /// watch, filtered by the selector, no longer shows it. Read from the API server (the
    /// cache cannot tell it from a deleted object); `None` when there is no selector or the
    /// object is gone.
    async fn deselected(&self, key: &ObjectKey) -> Result<Option<String>, Error> {
        let Some(selector) = self.syncer.selector() else {
            return Ok(None);
        };
        let current = self
            .ctx
            .virtual_api(&key.namespace)
            .get_opt(&key.name)
            .await
            .map_err(|e| {
                Error::kube(
                    format!("get virtual {} {key}", self.ctx.translator().kind()),
                    e,
                )
            })?;
        Ok(current
            .filter(|obj| {
                obj.meta().deletion_timestamp.is_none() && !selector.matches(obj.labels())
            })
            .map(|_| selector.to_string()))
    }

    /// Says that the host copy `host_name` of the virtual object `key` was deleted because the
    /// object left the selector `selector`: a log line, the type's counter
    /// ([`TypeStats::deselected`]) and an Event `SelectorNoLongerMatches` on the plugin.
    fn report_deselected(&self, key: &ObjectKey, host_name: &str, selector: &str) {
        let stats = self.ctx.stats();
        let count = stats.count_deselected();
        let kind = self.ctx.translator().kind();
        let note = format!(
            "virtual {kind} {key} no longer matches the selector {selector:?}: its host copy {}/{host_name} was deleted, as vCluster deletes the copy of an object that leaves a sync selector; labelled back in, it is synced again ({count} host cop(ies) deleted for the selector since the syncer started)",
            self.ctx.host_namespace(),
        );
        info!(object = %key, host = %host_name, %selector, deselected = count, "{note}");
        stats.notice(Reason::SelectorNoLongerMatches, note);
    }

    /// The create of `key`'s host copy `host_name` found an object of that name the host cache
    /// has not seen yet (`error`, 409 AlreadyExists): the object is read from the host API
    /// server, and when this vCluster does not manage it the outcome is a conflict at once (as
    /// the next reconcile would find once the cache caught up), not a failure; a copy of ours
    /// (or one gone again, or a failed read) returns `error`, retried as a stale cache.
    async fn already_exists(
        &self,
        key: &ObjectKey,
        host_name: &str,
        error: Error,
    ) -> Result<Option<Outcome>, Error> {
        let Ok(Some(live)) = self.ctx.host_api().get_opt(host_name).await else {
            return Err(error);
        };
        let ours = self
            .ctx
            .translator()
            .is_host_copy_of(live.meta(), &key.name, &key.namespace);
        if ours {
            Err(error)
        } else {
            Ok(Some(Outcome::Conflict))
        }
    }

    fn key_of_host(&self, obj: &S::Object) -> Option<ObjectKey> {
        if let Some((namespace, name)) = self.ctx.translator().virtual_key(obj.meta()) {
            return Some(ObjectKey { namespace, name });
        }
        let index = self.host_index.lock().ok()?;
        index.get(&obj.name_any()).cloned()
    }
}

/// `obj` after the hooks of `point`; the same `Arc` (no copy) when no hook implements it.
fn hooked<K: SyncObject>(hooks: &Hooks, point: HookPoint, obj: Arc<K>) -> Result<Arc<K>, Error> {
    if !hooks.handles(point) {
        return Ok(obj);
    }
    Ok(Arc::new(crate::write::apply_typed(
        hooks,
        point,
        (*obj).clone(),
    )?))
}
