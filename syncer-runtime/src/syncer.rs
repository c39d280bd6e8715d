//! A generic virtual-to-host (`ToHost`) syncer over [`DynamicObject`].
//!
//! Both sides are watched into caches (kube-runtime reflectors): the virtual cluster in all
//! namespaces, the host only in the vCluster's namespace (a Role suffices). Every event maps to
//! the key `namespace/name` of a virtual object (host objects through their
//! [`NAME_ANNOTATION`](crate::translate::NAME_ANNOTATION) /
//! [`NAMESPACE_ANNOTATION`](crate::translate::NAMESPACE_ANNOTATION)); a worker reconciles each
//! key with the lifecycle table of `shared/DESIGN.md`:
//!
//! | virtual | host | action |
//! | --- | --- | --- |
//! | exists | missing | create on host (`CreatePhysical` hooks applied before the write) |
//! | exists | exists | patch host only when something differs (`UpdatePhysical` hooks); copy status up when `syncStatus` |
//! | missing / terminating | exists, ours | delete host |
//! | exists | exists, ours, other `object-uid` | delete host, then create |
//! | any | exists, not ours | never touched; counted as a conflict |
//!
//! Writes use field manager [`RUNTIME_FIELD_MANAGER`]; updates are merge patches of exactly the
//! changed fields carrying the cached `resourceVersion`, so a stale cache produces a 409
//! conflict that is retried with backoff.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::Selector;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info, warn};
use vcp_crds::{Hook, HookEvent, RUNTIME_FIELD_MANAGER};

use crate::error::Error;
use crate::hooks::{apply_hooks, hooks_for};
use crate::patch::guarded_merge_patch;
use crate::queue::{WorkQueue, work_queue};
use crate::stats::{Outcome, TypeStats};
use crate::translate::NamespacedTranslator;

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

/// Everything one [`ToHostSyncer`] needs.
#[derive(Clone)]
pub struct ToHostOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster.
    pub virtual_: Client,
    /// The type synced (the same in both clusters).
    pub resource: ApiResource,
    /// Names, labels and annotations of host objects (carries the vCluster name and host
    /// namespace).
    pub translator: NamespacedTranslator,
    /// Copy the host object's `.status` up to the virtual object.
    pub sync_status: bool,
    /// Whether the virtual type has a status subresource (status is then written through it).
    pub status_subresource: bool,
    /// Only virtual objects matching this label selector are synced; host copies of objects
    /// that stop matching are deleted.
    pub selector: Option<Selector>,
    /// The plugin's hooks; those of this type with `CreatePhysical` / `UpdatePhysical` run
    /// before host writes.
    pub hooks: Vec<Hook>,
    /// Statistics shared with the status reporter.
    pub stats: Arc<TypeStats>,
    /// Every key of both caches is reconciled again this often (drift on the host is also
    /// caught by the host watch right away).
    pub resync_period: Duration,
}

/// Syncs one namespaced type from the virtual cluster to the host namespace.
pub struct ToHostSyncer {
    opts: ToHostOptions,
    virtual_store: Store<DynamicObject>,
    host_store: Store<DynamicObject>,
    /// Host name → virtual key, for host objects this vCluster does not manage (conflicts).
    host_index: Mutex<HashMap<String, ObjectKey>>,
    create_hooks: Vec<Hook>,
    update_hooks: Vec<Hook>,
}

impl ToHostSyncer {
    /// Runs the syncer until the future is dropped: watches both sides and reconciles every
    /// object. Watch failures (RBAC, connectivity) are retried with backoff and recorded in
    /// [`TypeStats`]; failures of single objects are retried with per-object backoff.
    ///
    /// # Errors
    /// None at present: the future only ends when dropped; the `Result` leaves room for fatal
    /// errors.
    pub async fn run(opts: ToHostOptions) -> Result<(), Error> {
        let ar = opts.resource.clone();
        let virtual_writer = Writer::new(ar.clone());
        let host_writer = Writer::new(ar.clone());
        let create_hooks = select_hooks(&opts, HookEvent::CreatePhysical);
        let update_hooks = select_hooks(&opts, HookEvent::UpdatePhysical);
        let syncer = Arc::new(ToHostSyncer {
            virtual_store: virtual_writer.as_reader(),
            host_store: host_writer.as_reader(),
            host_index: Mutex::new(HashMap::new()),
            create_hooks,
            update_hooks,
            opts,
        });
        let opts = &syncer.opts;

        let mut virtual_config = watcher::Config::default();
        if let Some(selector) = &opts.selector {
            virtual_config = virtual_config.labels_from(selector);
        }
        let virtual_api = Api::<DynamicObject>::all_with(opts.virtual_.clone(), &ar);
        let host_api = Api::<DynamicObject>::namespaced_with(
            opts.host.clone(),
            opts.translator.host_namespace(),
            &ar,
        );
        let virtual_events = watcher(virtual_api, virtual_config)
            .default_backoff()
            .reflect(virtual_writer);
        let host_events = watcher(host_api, watcher::Config::default())
            .default_backoff()
            .reflect(host_writer);
        let (queue, mut receiver) = work_queue::<ObjectKey>();

        let watch_virtual = {
            let syncer = syncer.clone();
            let queue = queue.clone();
            async move {
                let mut events = std::pin::pin!(virtual_events);
                while let Some(event) = events.next().await {
                    syncer.on_virtual_event(event, &queue);
                }
            }
        };
        let watch_host = {
            let syncer = syncer.clone();
            let queue = queue.clone();
            async move {
                let mut events = std::pin::pin!(host_events);
                while let Some(event) = events.next().await {
                    syncer.on_host_event(event, &queue);
                }
            }
        };
        let resync = {
            let syncer = syncer.clone();
            let queue = queue.clone();
            async move {
                let mut interval = tokio::time::interval(syncer.opts.resync_period);
                interval.tick().await;
                loop {
                    interval.tick().await;
                    syncer.push_all(&queue);
                }
            }
        };
        let worker = {
            let syncer = syncer.clone();
            let queue = queue.clone();
            async move {
                let _ = syncer.virtual_store.wait_until_ready().await;
                let _ = syncer.host_store.wait_until_ready().await;
                syncer.opts.stats.set_ready();
                info!(
                    kind = %syncer.opts.translator.kind(),
                    virtual_objects = syncer.virtual_store.len(),
                    host_objects = syncer.host_store.len(),
                    "caches ready, syncing"
                );
                while let Some(key) = receiver.next().await {
                    syncer.process(&key, &queue).await;
                }
            }
        };
        tokio::select! {
            () = watch_virtual => {}
            () = watch_host => {}
            () = resync => {}
            () = worker => {}
        }
        Ok(())
    }

    fn on_virtual_event(
        &self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
        queue: &WorkQueue<ObjectKey>,
    ) {
        match event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                self.opts.stats.set_type_error(None);
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
                self.opts.stats.set_type_error(None);
                self.push_all(queue);
            }
            Ok(watcher::Event::Init) => {}
            Err(error) => self.watch_failed("virtual", &error),
        }
    }

    fn on_host_event(
        &self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
        queue: &WorkQueue<ObjectKey>,
    ) {
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
            self.opts.translator.api_version(),
            self.opts.translator.kind()
        );
        warn!(%message, "watch failed, retrying with backoff");
        self.opts.stats.set_type_error(Some(message));
    }

    /// Remembers the host name of a virtual object, to find it again from a host object this
    /// vCluster does not manage.
    fn index(&self, key: &ObjectKey) {
        let host_name = self.opts.translator.host_name(&key.name, &key.namespace);
        if let Ok(mut index) = self.host_index.lock() {
            index.insert(host_name, key.clone());
        }
    }

    fn unindex(&self, key: &ObjectKey) {
        let host_name = self.opts.translator.host_name(&key.name, &key.namespace);
        if let Ok(mut index) = self.host_index.lock() {
            index.remove(&host_name);
        }
    }

    fn key_of_host(&self, obj: &DynamicObject) -> Option<ObjectKey> {
        if let Some((namespace, name)) = self.opts.translator.virtual_key(&obj.metadata) {
            return Some(ObjectKey { namespace, name });
        }
        let index = self.host_index.lock().ok()?;
        index.get(&obj.name_any()).cloned()
    }

    fn push_all(&self, queue: &WorkQueue<ObjectKey>) {
        for obj in self.virtual_store.state() {
            queue.push(virtual_key(&obj));
        }
        for obj in self.host_store.state() {
            if let Some(key) = self.key_of_host(&obj) {
                queue.push(key);
            }
        }
    }

    async fn process(&self, key: &ObjectKey, queue: &WorkQueue<ObjectKey>) {
        let stats = &self.opts.stats;
        match self.reconcile(key).await {
            Ok(outcome) => {
                queue.forget(key);
                if outcome == Some(Outcome::Conflict)
                    && stats.outcome(&key.to_string()) != Some(Outcome::Conflict)
                {
                    warn!(
                        kind = %self.opts.translator.kind(),
                        object = %key,
                        host_name = %self.opts.translator.host_name(&key.name, &key.namespace),
                        "a host object of the translated name exists and is not managed by this vCluster; leaving it untouched"
                    );
                }
                if outcome == Some(Outcome::Pending) {
                    queue.push_after(key.clone(), PENDING_DELAY);
                }
                stats.record(&key.to_string(), outcome);
            }
            Err(error) => {
                if error.is_conflict() {
                    debug!(object = %key, %error, "stale cache, retrying");
                } else {
                    warn!(kind = %self.opts.translator.kind(), object = %key, %error, "sync failed, retrying with backoff");
                }
                stats.record(&key.to_string(), Some(Outcome::Failed(error.to_string())));
                queue.retry(key.clone());
            }
        }
    }

    /// One step of the lifecycle table for `key`. `Ok(None)`: nothing exists any more.
    async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
        let ar = &self.opts.resource;
        let translator = &self.opts.translator;
        let host_name = translator.host_name(&key.name, &key.namespace);
        let virtual_obj = self
            .virtual_store
            .get(&ObjectRef::new_with(&key.name, ar.clone()).within(&key.namespace))
            .filter(|obj| obj.metadata.deletion_timestamp.is_none());
        let host_obj = self
            .host_store
            .get(&ObjectRef::new_with(&host_name, ar.clone()).within(translator.host_namespace()));
        let ours = host_obj
            .as_ref()
            .is_some_and(|h| translator.is_host_copy_of(&h.metadata, &key.name, &key.namespace));

        match (virtual_obj, host_obj) {
            (None, Some(host)) if ours => {
                if host.metadata.deletion_timestamp.is_none() {
                    self.delete_host(&host).await?;
                }
                Ok(None)
            }
            (None, _) => Ok(None),
            (Some(_), Some(_)) if !ours => Ok(Some(Outcome::Conflict)),
            (Some(_), Some(host)) if host.metadata.deletion_timestamp.is_some() => {
                Ok(Some(Outcome::Pending))
            }
            (Some(virtual_obj), Some(host)) => {
                let host_uid = host
                    .annotations()
                    .get(crate::translate::UID_ANNOTATION)
                    .cloned();
                if host_uid != virtual_obj.metadata.uid {
                    info!(object = %key, host = %host_name, "host copy belongs to an earlier object of the same name, replacing it");
                    self.delete_host(&host).await?;
                    self.create_host(&virtual_obj).await?;
                    return Ok(Some(Outcome::InSync));
                }
                self.update_host(&virtual_obj, &host).await?;
                self.sync_status(&virtual_obj, &host).await?;
                Ok(Some(Outcome::InSync))
            }
            (Some(virtual_obj), None) => {
                self.create_host(&virtual_obj).await?;
                Ok(Some(Outcome::InSync))
            }
        }
    }

    fn host_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.opts.host.clone(),
            self.opts.translator.host_namespace(),
            &self.opts.resource,
        )
    }

    fn describe(&self, verb: &str, side: &str, namespace: &str, name: &str) -> String {
        format!(
            "{verb} {side} {} {} {namespace}/{name}",
            self.opts.translator.api_version(),
            self.opts.translator.kind()
        )
    }

    async fn create_host(&self, virtual_obj: &DynamicObject) -> Result<(), Error> {
        let host = self.opts.translator.host_object(virtual_obj);
        let host_name = host.name_any();
        let mut value = to_json(&host, &host_name)?;
        apply_hooks(&mut value, &self.create_hooks)?;
        let host: DynamicObject = serde_json::from_value(value).map_err(|source| Error::Json {
            what: format!("hooked host object {host_name}"),
            source,
        })?;
        let params = PostParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        self.opts.stats.count_write();
        self.host_api().create(&params, &host).await.map_err(|e| {
            Error::kube(
                self.describe(
                    "create",
                    "host",
                    self.opts.translator.host_namespace(),
                    &host_name,
                ),
                e,
            )
        })?;
        info!(kind = %self.opts.translator.kind(), host = %host_name, virtual_namespace = %virtual_obj.namespace().unwrap_or_default(), virtual_name = %virtual_obj.name_any(), "created host object");
        Ok(())
    }

    async fn update_host(
        &self,
        virtual_obj: &DynamicObject,
        host: &DynamicObject,
    ) -> Result<(), Error> {
        let host_name = host.name_any();
        let mut current = host.clone();
        current.types = Some(self.opts.translator.type_meta());
        let desired = self
            .opts
            .translator
            .host_object_update(virtual_obj, &current);
        let current = to_json(&current, &host_name)?;
        let mut desired = to_json(&desired, &host_name)?;
        apply_hooks(&mut desired, &self.update_hooks)?;
        let Some(patch) = guarded_merge_patch(&current, &desired, host.resource_version()) else {
            return Ok(());
        };
        self.opts.stats.count_write();
        self.host_api()
            .patch(
                &host_name,
                &PatchParams {
                    field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| {
                Error::kube(
                    self.describe(
                        "patch",
                        "host",
                        self.opts.translator.host_namespace(),
                        &host_name,
                    ),
                    e,
                )
            })?;
        info!(kind = %self.opts.translator.kind(), host = %host_name, "updated host object");
        Ok(())
    }

    async fn delete_host(&self, host: &DynamicObject) -> Result<(), Error> {
        let host_name = host.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: host.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.opts.stats.count_write();
        match self.host_api().delete(&host_name, &params).await {
            Ok(_) => {
                info!(kind = %self.opts.translator.kind(), host = %host_name, "deleted host object");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(
                self.describe(
                    "delete",
                    "host",
                    self.opts.translator.host_namespace(),
                    &host_name,
                ),
                e,
            )),
        }
    }

    /// Copies the host's `.status` to the virtual object when `syncStatus` is set and they
    /// differ (a merge patch that also removes keys the host dropped).
    async fn sync_status(
        &self,
        virtual_obj: &DynamicObject,
        host: &DynamicObject,
    ) -> Result<(), Error> {
        if !self.opts.sync_status {
            return Ok(());
        }
        let Some(host_status) = host.data.get("status") else {
            return Ok(());
        };
        if virtual_obj.data.get("status") == Some(host_status) {
            return Ok(());
        }
        let namespace = virtual_obj.namespace().unwrap_or_default();
        let name = virtual_obj.name_any();
        let current = json!({"status": virtual_obj.data.get("status")});
        let desired = json!({"status": host_status});
        let Some(patch) = guarded_merge_patch(&current, &desired, virtual_obj.resource_version())
        else {
            return Ok(());
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.opts.virtual_.clone(), &namespace, &self.opts.resource);
        let params = PatchParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        self.opts.stats.count_write();
        let result = if self.opts.status_subresource {
            api.patch_status(&name, &params, &Patch::Merge(&patch))
                .await
        } else {
            api.patch(&name, &params, &Patch::Merge(&patch)).await
        };
        result.map_err(|e| {
            Error::kube(
                self.describe("patch status of", "virtual", &namespace, &name),
                e,
            )
        })?;
        debug!(object = %format!("{namespace}/{name}"), "copied host status to the virtual object");
        Ok(())
    }
}

/// The hooks of the syncer's type for `event`, cloned.
fn select_hooks(opts: &ToHostOptions, event: HookEvent) -> Vec<Hook> {
    hooks_for(
        &opts.hooks,
        opts.translator.api_version(),
        opts.translator.kind(),
        event,
    )
    .into_iter()
    .cloned()
    .collect()
}

fn virtual_key(obj: &DynamicObject) -> ObjectKey {
    ObjectKey {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

/// `obj` as JSON.
pub(crate) fn to_json(obj: &DynamicObject, name: &str) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|source| Error::Json {
        what: format!("object {name}"),
        source,
    })
}
