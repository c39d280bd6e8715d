//! Host-to-virtual (`direction: FromHost`) syncing of one namespaced type, as [`DynamicObject`].
//!
//! Reproduces vCluster's `sync.fromHost.customResources` for a namespaced type with the mapping
//! `"<host namespace>/*": "<virtual namespace>/*"` (vCluster's `mappings.byName`): the objects in
//! the vCluster's host namespace (the only host namespace the runtime may watch) are copied into
//! one virtual namespace **under the same name**. The plugin API has no mapping field, so the
//! runtime uses the identity mapping: the virtual namespace has the host namespace's name
//! (created when missing). The choices this module makes:
//!
//! - source objects: host objects matching the synced type's `selector`, except those labelled
//!   `vcluster.loft.sh/managed-by` (host copies some vCluster made from a virtual object are
//!   never imported back);
//! - the virtual copy: the host object's labels, annotations and every top-level field but
//!   `status` (with `syncStatus`, `status` too, through the status subresource), plus
//!   annotations naming the host object ([`FromHostTranslator`]); `CreateVirtual` /
//!   `UpdateVirtual` hooks run before each write;
//! - lifecycle: host changes are copied (changes made in the virtual cluster are reverted), a
//!   deleted host object deletes its virtual copy, a virtual object of the same name without
//!   those annotations is never touched (reported as a conflict).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::Selector;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};
use vcp_crds::RUNTIME_FIELD_MANAGER;

use crate::controller::ConflictReporter;
use crate::error::Error;
use crate::patch::guarded_merge_patch;
use crate::queue::{WorkQueue, work_queue};
use crate::sdk::{HookPoint, Hooks, to_json};
use crate::stats::{Outcome, TypeStats};
use crate::translate::{FromHostTranslator, MANAGED_BY_LABEL, slim_for_cache};

/// Everything [`run`] needs.
#[derive(Clone)]
pub struct FromHostOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster.
    pub virtual_: Client,
    /// The vCluster's host namespace (source).
    pub host_namespace: String,
    /// The virtual namespace the objects are copied into.
    pub virtual_namespace: String,
    /// The type (the same in both clusters).
    pub resource: ApiResource,
    /// Only host objects matching this label selector are copied.
    pub selector: Option<Selector>,
    /// Copy `.status` too (through the status subresource when `status_subresource`).
    pub sync_status: bool,
    /// Whether the virtual type has a status subresource.
    pub status_subresource: bool,
    /// The type's hooks (`CreateVirtual`, `UpdateVirtual`, `DeleteVirtual` are used).
    pub hooks: Hooks,
    /// Statistics shared with the status reporter.
    pub stats: Arc<TypeStats>,
    /// Every object is reconciled again this often.
    pub resync_period: Duration,
    /// Told once about each virtual object of a copied name that the runtime did not make.
    pub on_conflict: Option<ConflictReporter>,
}

struct FromHost {
    opts: FromHostOptions,
    translator: FromHostTranslator,
    host_store: Store<DynamicObject>,
    virtual_store: Store<DynamicObject>,
}

/// Runs the host-to-virtual sync of one type until the future is dropped (see the module
/// docs).
///
/// # Errors
/// None at present: failures are retried with backoff and recorded in the statistics.
pub async fn run(opts: FromHostOptions) -> Result<(), Error> {
    let ar = opts.resource.clone();
    let host_writer = Writer::new(ar.clone());
    let virtual_writer = Writer::new(ar.clone());
    let mut host_config = watcher::Config::default();
    if let Some(selector) = &opts.selector {
        host_config = host_config.labels_from(selector);
    }
    let host_store = host_writer.as_reader();
    let virtual_store = virtual_writer.as_reader();
    let host_events = watcher(
        Api::<DynamicObject>::namespaced_with(opts.host.clone(), &opts.host_namespace, &ar),
        host_config,
    )
    .default_backoff()
    .modify(|obj| slim_for_cache(&mut obj.metadata))
    .reflect(host_writer);
    let virtual_events = watcher(
        Api::<DynamicObject>::namespaced_with(opts.virtual_.clone(), &opts.virtual_namespace, &ar),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|obj| slim_for_cache(&mut obj.metadata))
    .reflect(virtual_writer);
    let this = Arc::new(FromHost {
        translator: FromHostTranslator::new(
            &opts.host_namespace,
            &opts.virtual_namespace,
            &opts.resource.api_version,
            &opts.resource.kind,
        ),
        host_store,
        virtual_store,
        opts,
    });
    let (queue, receiver) = work_queue::<String>();

    let watch = |events: futures::stream::BoxStream<
        'static,
        Result<watcher::Event<DynamicObject>, watcher::Error>,
    >,
                 side: &'static str| {
        let this = this.clone();
        let queue = queue.clone();
        async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(obj)
                        | watcher::Event::InitApply(obj)
                        | watcher::Event::Delete(obj),
                    ) => {
                        this.opts.stats.set_type_error(None);
                        queue.push(obj.name_any());
                    }
                    Ok(watcher::Event::InitDone) => this.push_all(&queue),
                    Ok(watcher::Event::Init) => {}
                    Err(error) => {
                        let message = format!(
                            "watching {} {} on the {side} API server failed: {error}",
                            this.opts.resource.api_version, this.opts.resource.kind
                        );
                        warn!(%message, "watch failed, retrying with backoff");
                        this.opts.stats.set_type_error(Some(message));
                    }
                }
            }
        }
    };
    let watch_host = watch(host_events.boxed(), "host");
    let watch_virtual = watch(virtual_events.boxed(), "virtual");
    let resync = {
        let this = this.clone();
        let queue = queue.clone();
        async move {
            let mut interval = tokio::time::interval(this.opts.resync_period);
            interval.tick().await;
            loop {
                interval.tick().await;
                this.push_all(&queue);
            }
        }
    };
    let worker = {
        let this = this.clone();
        let queue = queue.clone();
        async move {
            let _ = this.host_store.wait_until_ready().await;
            let _ = this.virtual_store.wait_until_ready().await;
            this.opts.stats.set_ready();
            while let Some(name) = receiver.next().await {
                this.process(&name, &queue).await;
                receiver.done(&name);
            }
        }
    };
    tokio::select! {
        () = watch_host => {}
        () = watch_virtual => {}
        () = resync => {}
        () = worker => {}
    }
    Ok(())
}

impl FromHost {
    fn push_all(&self, queue: &WorkQueue<String>) {
        for obj in self.host_store.state() {
            queue.push(obj.name_any());
        }
        for obj in self.virtual_store.state() {
            queue.push(obj.name_any());
        }
    }

    fn virtual_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.opts.virtual_.clone(),
            &self.opts.virtual_namespace,
            &self.opts.resource,
        )
    }

    fn describe(&self, verb: &str, name: &str) -> String {
        format!(
            "{verb} virtual {} {} {}/{name}",
            self.opts.resource.api_version, self.opts.resource.kind, self.opts.virtual_namespace
        )
    }

    /// Whether `obj` is a copy this runtime made of host object `name`.
    fn is_ours(&self, obj: &DynamicObject, name: &str) -> bool {
        self.translator.is_virtual_copy_of(&obj.metadata, name)
    }

    async fn process(&self, name: &str, queue: &WorkQueue<String>) {
        let stats = &self.opts.stats;
        let key = format!("{}/{name}", self.opts.host_namespace);
        match self.reconcile(name).await {
            Ok(outcome) => {
                queue.forget(&name.to_string());
                if outcome == Some(Outcome::Conflict)
                    && stats.outcome(&key) != Some(Outcome::Conflict)
                {
                    let message = format!(
                        "virtual {} {}/{name} exists and was not copied from the host by this runtime; it is left untouched",
                        self.opts.resource.kind, self.opts.virtual_namespace
                    );
                    warn!(%message, "conflict");
                    if let Some(report) = &self.opts.on_conflict {
                        report(message);
                    }
                }
                if outcome == Some(Outcome::Pending) {
                    queue.push_after(name.to_string(), Duration::from_secs(1));
                }
                stats.record(&key, outcome);
            }
            Err(error) => {
                if !error.is_conflict() {
                    warn!(kind = %self.opts.resource.kind, object = %key, %error, "sync from host failed, retrying with backoff");
                }
                stats.record(&key, Some(Outcome::Failed(error.to_string())));
                queue.retry(name.to_string());
            }
        }
    }

    async fn reconcile(&self, name: &str) -> Result<Option<Outcome>, Error> {
        let ar = &self.opts.resource;
        let host = self
            .host_store
            .get(&ObjectRef::new_with(name, ar.clone()).within(&self.opts.host_namespace))
            .filter(|h| {
                h.metadata.deletion_timestamp.is_none()
                    && !h.labels().contains_key(MANAGED_BY_LABEL)
            });
        let virtual_obj = self
            .virtual_store
            .get(&ObjectRef::new_with(name, ar.clone()).within(&self.opts.virtual_namespace));
        match (host, virtual_obj) {
            (None, Some(v)) if self.is_ours(&v, name) => {
                if v.metadata.deletion_timestamp.is_none() {
                    self.delete_virtual(&v).await?;
                }
                Ok(None)
            }
            (None, _) => Ok(None),
            (Some(_), Some(v)) if !self.is_ours(&v, name) => Ok(Some(Outcome::Conflict)),
            (Some(_), Some(v)) if v.metadata.deletion_timestamp.is_some() => {
                Ok(Some(Outcome::Pending))
            }
            (Some(h), Some(v)) => {
                self.update_virtual(&h, &v).await?;
                Ok(Some(Outcome::InSync))
            }
            (Some(h), None) => {
                self.create_virtual(&h).await?;
                // status (if any) follows on the next reconcile, triggered by the watch
                Ok(Some(Outcome::InSync))
            }
        }
    }

    async fn ensure_namespace(&self) -> Result<(), Error> {
        let namespaces: Api<Namespace> = Api::all(self.opts.virtual_.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": self.opts.virtual_namespace}
        }))
        .map_err(|source| Error::Json {
            what: "namespace".into(),
            source,
        })?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {
                self.opts.stats.count_write();
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 403 => Ok(()),
            Err(e) => Err(Error::kube(
                format!("create virtual namespace {}", self.opts.virtual_namespace),
                e,
            )),
        }
    }

    async fn create_virtual(&self, host: &DynamicObject) -> Result<(), Error> {
        let name = host.name_any();
        let desired = to_json(&self.translator.virtual_object(host, None), &name)?;
        let desired = self.opts.hooks.apply(HookPoint::CreateVirtual, desired)?;
        let obj: DynamicObject = serde_json::from_value(desired).map_err(|source| Error::Json {
            what: format!("hooked virtual object {name}"),
            source,
        })?;
        let params = PostParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        self.opts.stats.count_write();
        let result = self.virtual_api().create(&params, &obj).await;
        let result = match result {
            Err(kube::Error::Api(status)) if status.code == 404 => {
                self.ensure_namespace().await?;
                self.opts.stats.count_write();
                self.virtual_api().create(&params, &obj).await
            }
            other => other,
        };
        result.map_err(|e| Error::kube(self.describe("create", &name), e))?;
        info!(kind = %self.opts.resource.kind, name = %name, namespace = %self.opts.virtual_namespace, "copied host object into the virtual cluster");
        Ok(())
    }

    async fn update_virtual(
        &self,
        host: &DynamicObject,
        virtual_obj: &DynamicObject,
    ) -> Result<(), Error> {
        let name = host.name_any();
        let desired = self.translator.virtual_object(host, Some(virtual_obj));
        let mut current = virtual_obj.clone();
        current.types.clone_from(&desired.types);
        let current = to_json(&current, &name)?;
        let desired = to_json(&desired, &name)?;
        let desired = self.opts.hooks.apply(HookPoint::UpdateVirtual, desired)?;
        let params = PatchParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        if let Some(patch) = guarded_merge_patch(&current, &desired, virtual_obj.resource_version())
        {
            self.opts.stats.count_write();
            self.virtual_api()
                .patch(&name, &params, &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube(self.describe("patch", &name), e))?;
            info!(kind = %self.opts.resource.kind, name = %name, "updated the virtual copy of a host object");
            // the status follows on the next reconcile (the patch moved the resourceVersion)
            return Ok(());
        }
        if !self.opts.sync_status {
            return Ok(());
        }
        let Some(host_status) = host.data.get("status") else {
            return Ok(());
        };
        if virtual_obj.data.get("status") == Some(host_status) {
            return Ok(());
        }
        let mut with_status = desired;
        with_status["status"] = host_status.clone();
        let with_status = self
            .opts
            .hooks
            .apply(HookPoint::UpdateVirtual, with_status)?;
        let Some(patch) = guarded_merge_patch(
            &json!({"status": virtual_obj.data.get("status")}),
            &json!({"status": with_status.get("status")}),
            virtual_obj.resource_version(),
        ) else {
            return Ok(());
        };
        self.opts.stats.count_write();
        let api = self.virtual_api();
        let result = if self.opts.status_subresource {
            api.patch_status(&name, &params, &Patch::Merge(&patch))
                .await
        } else {
            api.patch(&name, &params, &Patch::Merge(&patch)).await
        };
        result.map_err(|e| Error::kube(self.describe("patch status of", &name), e))?;
        Ok(())
    }

    async fn delete_virtual(&self, virtual_obj: &DynamicObject) -> Result<(), Error> {
        let name = virtual_obj.name_any();
        if self.opts.hooks.handles(HookPoint::DeleteVirtual) {
            self.opts
                .hooks
                .apply(HookPoint::DeleteVirtual, to_json(virtual_obj, &name)?)?;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: virtual_obj.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.opts.stats.count_write();
        match self.virtual_api().delete(&name, &params).await {
            Ok(_) => {
                info!(kind = %self.opts.resource.kind, name = %name, "deleted the virtual copy of a deleted host object");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(self.describe("delete", &name), e)),
        }
    }
}
