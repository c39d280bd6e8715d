//! Host-to-virtual (`direction: FromHost`) syncing of one namespaced type, as [`DynamicObject`].
//!
//! Reproduces vCluster's `sync.fromHost.customResources` for a namespaced type with its
//! `mappings.byName` ([`FromHostMapping`]): the objects in the vCluster's host namespace (the only
//! host namespace the runtime may watch; a mapping naming another is refused before anything
//! is watched) are copied into the virtual namespaces and under the names the mapping gives.
//! Without `mappings`, the identity mapping: the virtual namespace has the host namespace's name,
//! the objects keep theirs. A virtual namespace that does not exist is created. The choices this
//! module makes:
//!
//! - source objects: host objects matching the synced type's `selector`, except those labelled
//!   `vcluster.loft.sh/managed-by` (host copies some vCluster made from a virtual object are
//!   never imported back);
//! - the virtual copy: the host object's labels, annotations and every top-level field but
//!   `status` (with `syncStatus`, `status` too, through the status subresource), plus
//!   annotations naming the host object ([`FromHostTranslator`]); `CreateVirtual` /
//!   `UpdateVirtual` hooks run before each write;
//! - lifecycle: host changes are copied (changes made in the virtual cluster are reverted), a
//!   deleted host object deletes its virtual copy, and so does a mapping that no longer maps it
//!   there (the copies are found by their annotations, in every virtual namespace the mapping
//!   names); a virtual object of the target name without those annotations is never touched
//!   (reported as a conflict).
//!
//! The type's `patches` ([`crate::patches`]) apply host to virtual: to the copy and to the
//! status copied up; a patch that fails fails that object before any write.
//!
//! Both sides are watched, cached and worked through by the runtime's one
//! driver (`driver.rs`), on one worker: the host in the vCluster's host namespace, the virtual
//! cluster in all namespaces (a copy a former mapping put elsewhere is found wherever it is);
//! the translation is [`FromHostTranslator`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::Selector;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cache::Cache;
use crate::driver::{self, ConflictReporter, ObjectKey, Reconcile, Settings, Side, Watch};
use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::patch::to_json;
use crate::patches::{ObjectPatchError, PatchError, Patches};
use crate::stats::{Outcome, TypeStats};
use crate::translate::{FromHostMapping, FromHostTranslator, MANAGED_BY_LABEL};
use crate::write::{Cluster, Part, Patched, Target, Writer};

/// Everything [`run`] needs.
#[derive(Clone)]
pub struct FromHostOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster.
    pub virtual_: Client,
    /// Which host objects (of the vCluster's host namespace, the source) go where in the virtual
    /// cluster.
    pub mapping: FromHostMapping,
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
    /// The longest delay between two attempts of a failing watch ([`crate::retry`]).
    pub retry_max: Duration,
    /// The type's `patches`, applied host to virtual ([`Patches::from_host`]) to the copy and
    /// to the status copied up.
    pub patches: Arc<Patches>,
}

/// The keys are the host objects' `(host namespace, name)`; the virtual copy is where the
/// mapping says.
struct FromHost {
    opts: FromHostOptions,
    translator: FromHostTranslator,
    host_store: Cache<DynamicObject>,
    virtual_store: Cache<DynamicObject>,
    /// Host name → the virtual objects (`(namespace, name)`) marked as its copies, from the
    /// virtual watch: where stale copies are (a mapping changed).
    copies: Mutex<HashMap<String, BTreeSet<(String, String)>>>,
    writer: Writer,
}

/// Runs the host-to-virtual sync of one type until the future is dropped (see the module
/// docs), on one worker.
///
/// # Errors
/// None at present: failures are retried with backoff and recorded in the statistics.
pub async fn run(opts: FromHostOptions) -> Result<(), Error> {
    let ar = &opts.resource;
    let mut host_config = watcher::Config::default();
    if let Some(selector) = &opts.selector {
        host_config = host_config.labels_from(selector);
    }
    // the whole virtual cluster: the copies a former mapping put elsewhere are found (and
    // deleted) wherever they are
    let virtual_api = driver::tolerant_api(opts.virtual_.clone(), None, ar);
    let watches = vec![
        Watch {
            side: Side::Host,
            api: driver::tolerant_api(opts.host.clone(), Some(opts.mapping.host_namespace()), ar),
            config: host_config,
        },
        Watch {
            side: Side::Virtual,
            api: virtual_api,
            config: watcher::Config::default(),
        },
    ];
    let settings = Settings {
        workers: 1,
        resync_period: Some(opts.resync_period),
        on_conflict: opts.on_conflict.clone(),
        retry_max: opts.retry_max,
    };
    let from_host = FromHost {
        translator: FromHostTranslator::new(
            opts.mapping.host_namespace(),
            &ar.api_version,
            &ar.kind,
        ),
        host_store: Cache::new(),
        virtual_store: Cache::new(),
        copies: Mutex::new(HashMap::new()),
        writer: Writer::new(
            &ar.api_version,
            &ar.kind,
            opts.hooks.clone(),
            opts.stats.clone(),
        ),
        opts,
    };
    driver::run(from_host, watches, settings).await;
    Ok(())
}

impl Reconcile for FromHost {
    type Object = DynamicObject;

    fn stats(&self) -> &TypeStats {
        &self.opts.stats
    }

    fn cache(&self, side: Side) -> &Cache<DynamicObject> {
        match side {
            Side::Host | Side::HostProduced => &self.host_store,
            Side::Virtual | Side::VirtualProduced => &self.virtual_store,
        }
    }

    fn key_of(&self, side: Side, obj: &DynamicObject, deleted: bool) -> Option<ObjectKey> {
        match side {
            Side::Host => Some(self.key(obj.name_any())),
            Side::Virtual => {
                let at = (obj.namespace().unwrap_or_default(), obj.name_any());
                if let Some(host) = self.translator.host_source(&obj.metadata) {
                    if let Ok(mut copies) = self.copies.lock() {
                        let entry = copies.entry(host.clone()).or_default();
                        if deleted {
                            entry.remove(&at);
                        } else {
                            entry.insert(at);
                        }
                        if entry.is_empty() {
                            copies.remove(&host);
                        }
                    }
                    return Some(self.key(host));
                }
                // a virtual object in the way of a copy: its host object is looked at again
                self.opts
                    .mapping
                    .host_source(&at.0, &at.1)
                    .map(|host| self.key(host))
            }
            _ => None,
        }
    }

    fn undecodable(&self, key: &ObjectKey) -> Option<String> {
        if let Some(error) = self.host_store.undecodable(&key.namespace, &key.name) {
            return Some(format!("host {key}: {error}"));
        }
        let (ns, name) = self.opts.mapping.virtual_target(&key.name)?;
        self.virtual_store
            .undecodable(&ns, &name)
            .map(|error| format!("virtual {ns}/{name}: {error}"))
    }

    fn for_each_key(&self, push: &mut dyn FnMut(ObjectKey)) {
        self.host_store
            .for_each_key(|_, name| push(self.key(name.to_string())));
        let copies: Vec<String> = self
            .copies
            .lock()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        copies.into_iter().for_each(|name| push(self.key(name)));
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
        let name = key.name.as_str();
        let host = self
            .host_store
            .get(self.opts.mapping.host_namespace(), name)
            .filter(|h| {
                h.metadata.deletion_timestamp.is_none()
                    && !h.labels().contains_key(MANAGED_BY_LABEL)
            });
        let target = host
            .as_ref()
            .and_then(|_| self.opts.mapping.virtual_target(name));
        // copies elsewhere than the target (the host object went, or the mapping changed)
        let known: Vec<(String, String)> = self
            .copies
            .lock()
            .map(|c| {
                c.get(name)
                    .map(|s| s.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for (ns, copy) in known {
            if target.as_ref() == Some(&(ns.clone(), copy.clone())) {
                continue;
            }
            if let Some(v) = self.virtual_store.get(&ns, &copy)
                && self.is_ours(&v, name)
                && v.metadata.deletion_timestamp.is_none()
            {
                self.delete_virtual(&v).await?;
            }
        }
        let (Some(host), Some((ns, vname))) = (host, target) else {
            return Ok(None);
        };
        match self.virtual_store.get(&ns, &vname) {
            Some(v) if !self.is_ours(&v, name) => Ok(Some(Outcome::Conflict)),
            Some(v) if v.metadata.deletion_timestamp.is_some() => Ok(Some(Outcome::Pending)),
            Some(v) => {
                self.update_virtual(&host, (&ns, &vname), &v).await?;
                Ok(Some(Outcome::InSync))
            }
            None => {
                self.create_virtual(&host, (&ns, &vname)).await?;
                // status (if any) follows on the next reconcile, triggered by the watch
                Ok(Some(Outcome::InSync))
            }
        }
    }

    fn conflict_message(&self, key: &ObjectKey) -> String {
        let (ns, name) = self
            .opts
            .mapping
            .virtual_target(&key.name)
            .unwrap_or_default();
        format!(
            "virtual {} {ns}/{name} exists and was not copied from the host (host object {key}) by this runtime; it is left untouched",
            self.opts.resource.kind
        )
    }
}

impl FromHost {
    /// The key of the host object `name`.
    fn key(&self, name: String) -> ObjectKey {
        ObjectKey {
            namespace: self.opts.mapping.host_namespace().to_string(),
            name,
        }
    }

    /// Whether `obj` is a copy this runtime made of host object `name`.
    fn is_ours(&self, obj: &DynamicObject, name: &str) -> bool {
        self.translator.is_virtual_copy_of(&obj.metadata, name)
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), Error> {
        let namespaces: Api<Namespace> = Api::all(self.opts.virtual_.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace}
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
                format!("create virtual namespace {namespace}"),
                e,
            )),
        }
    }

    fn target(&self, namespace: &str) -> Target<DynamicObject> {
        Target {
            api: Api::namespaced_with(self.opts.virtual_.clone(), namespace, &self.opts.resource),
            cluster: Cluster::Virtual,
            namespace: namespace.to_string(),
        }
    }

    async fn create_virtual(&self, host: &DynamicObject, at: (&str, &str)) -> Result<(), Error> {
        let obj = self.patched_virtual(host, at, None).await?;
        let to = self.target(at.0);
        match self
            .writer
            .create(&to, HookPoint::CreateVirtual, obj.clone())
            .await
        {
            Err(e) if e.is_not_found() => {
                self.ensure_namespace(at.0).await?;
                self.writer.create(&to, HookPoint::CreateVirtual, obj).await
            }
            other => other,
        }
    }

    async fn update_virtual(
        &self,
        host: &DynamicObject,
        at: (&str, &str),
        virtual_obj: &DynamicObject,
    ) -> Result<(), Error> {
        let name = at.1.to_string();
        let desired = self.patched_virtual(host, at, Some(virtual_obj)).await?;
        let mut current = virtual_obj.clone();
        current.types.clone_from(&desired.types);
        let current = to_json(&current, &name)?;
        let desired = to_json(&desired, &name)?;
        let to = self.target(at.0);
        let rv = virtual_obj.resource_version();
        let desired = match self
            .writer
            .patch(
                &to,
                &name,
                Part::Object,
                &[HookPoint::UpdateVirtual],
                &current,
                desired,
                rv.clone(),
            )
            .await?
        {
            // the status follows on the next reconcile (the patch moved the resourceVersion)
            Patched::Sent => return Ok(()),
            Patched::Unchanged(desired) => desired,
        };
        if !self.opts.sync_status {
            return Ok(());
        }
        let Some(host_status) = self.patched_status(host).await? else {
            return Ok(());
        };
        if virtual_obj.data.get("status") == Some(&host_status) {
            return Ok(());
        }
        let mut with_status = desired;
        with_status["status"] = host_status;
        self.writer
            .patch(
                &to,
                &name,
                Part::Status {
                    subresource: self.opts.status_subresource,
                },
                &[HookPoint::UpdateVirtual],
                &current,
                with_status,
                rv,
            )
            .await?;
        Ok(())
    }

    /// The virtual copy of `host` at `at` (`(virtual namespace, name)`, from the mapping;
    /// [`FromHostTranslator::virtual_object`]) with the type's patches applied host to virtual.
    async fn patched_virtual(
        &self,
        host: &DynamicObject,
        at: (&str, &str),
        existing: Option<&DynamicObject>,
    ) -> Result<DynamicObject, Error> {
        let obj = self.translator.virtual_object(host, at, existing);
        if self.opts.patches.is_empty() {
            return Ok(obj);
        }
        let name = host.name_any();
        let host_json = to_json(host, &name)?;
        let view = to_json(&obj, &name)?;
        let view = self
            .opts
            .patches
            .from_host_in_pool(host_json, view)
            .await
            .map_err(|source| self.patch_error(host, source))?;
        serde_json::from_value(view).map_err(|source| Error::Json {
            what: format!("the patched virtual copy of {name}"),
            source,
        })
    }

    /// The host object's status as it is copied up: with the type's patches applied host to
    /// virtual (`None` when the host object has no status).
    async fn patched_status(
        &self,
        host: &DynamicObject,
    ) -> Result<Option<serde_json::Value>, Error> {
        let Some(status) = host.data.get("status") else {
            return Ok(None);
        };
        if self.opts.patches.is_empty() {
            return Ok(Some(status.clone()));
        }
        let name = host.name_any();
        let host_json = to_json(host, &name)?;
        let view = host_json.clone();
        let view = self
            .opts
            .patches
            .from_host_in_pool(host_json, view)
            .await
            .map_err(|source| self.patch_error(host, source))?;
        Ok(view.get("status").cloned())
    }

    fn patch_error(&self, host: &DynamicObject, source: PatchError) -> Error {
        Error::Patch(Box::new(ObjectPatchError {
            api_version: self.opts.resource.api_version.clone(),
            kind: self.opts.resource.kind.clone(),
            object: format!("{}/{}", self.opts.mapping.host_namespace(), host.name_any()),
            uid: host.metadata.uid.clone(),
            source,
        }))
    }

    async fn delete_virtual(&self, virtual_obj: &DynamicObject) -> Result<(), Error> {
        let to = self.target(&virtual_obj.namespace().unwrap_or_default());
        self.writer
            .delete(&to, HookPoint::DeleteVirtual, virtual_obj)
            .await?;
        Ok(())
    }
}
