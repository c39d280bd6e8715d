//! The plugin-author API, mirroring the vcluster-sdk (and its `Car` tutorial) in Rust.
//!
//! - [`Syncer`]: one namespaced type synced from the virtual cluster to the host namespace, with
//!   the tutorial's three methods [`Syncer::sync_to_host`] (virtual object without host copy),
//!   [`Syncer::sync`] (both exist) and [`Syncer::sync_to_virtual`] (host copy without virtual
//!   object). The [`crate::controller`] that drives it owns the lifecycle table of
//!   `shared/DESIGN.md` (object-uid mismatch → host replaced; a host object not managed by this
//!   vCluster → never touched; terminating virtual objects → host copy deleted, never
//!   recreated), so a syncer only says *what* the host copy looks like.
//! - [`NamespacedTranslator`]: `translate_metadata` / `translate_metadata_update`, built by
//!   [`RegisterContext::translator`].
//! - [`SyncContext::sync_to_host_create`] / [`SyncContext::sync_to_host_update`]: the writes,
//!   with the [`ClientHook`]s of the type applied first; `sync_to_host_update(.., None)` and an
//!   update that changes nothing send no request.
//! - [`ClientHook`]: the eight `mutate_{create,update,delete,get}_{virtual,physical}` points.
//! - [`Plugin`]: `Plugin::init()` (or [`Plugin::new`]), [`Plugin::register`],
//!   [`Plugin::register_hook`], [`Plugin::start`].
//!
//! The declarative runtime ([`crate::runtime`]) is built from these same parts: its
//! [`crate::syncer::DeclarativeSyncer`] implements [`Syncer`] and its
//! [`crate::hooks::DeclarativeHook`] implements [`ClientHook`].
//!
//! ```no_run
//! # use vcp_syncer_runtime::sdk::*;
//! # async fn example(car_syncer: impl FnOnce(&RegisterContext) -> vcp_syncer_runtime::syncer::DeclarativeSyncer) -> Result<(), vcp_syncer_runtime::Error> {
//! let mut plugin = Plugin::init().await?;
//! let syncer = car_syncer(plugin.context());
//! plugin.register(syncer);
//! plugin.start().await
//! # }
//! ```
//! A complete example is `syncer-runtime/examples/car_syncer.rs`.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{NamespaceScope, Selector};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::{info, warn};
use vcp_crds::RUNTIME_FIELD_MANAGER;

use crate::error::Error;
use crate::hooks::HookError;
use crate::patch::guarded_merge_patch;
use crate::stats::TypeStats;
pub use crate::translate::{MetadataUpdate, NamespacedTranslator};

/// An object type a [`Syncer`] can sync: any kube [`Resource`] (typed like the tutorial's `Car`
/// or `k8s_openapi`'s `Pod`, or [`kube::api::DynamicObject`]) that serializes to its JSON form.
pub trait SyncObject:
    Resource<DynamicType: Clone + Eq + Hash + Send + Sync + 'static, Scope: NamespaceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> SyncObject for K where
    K: Resource<DynamicType: Clone + Eq + Hash + Send + Sync + 'static, Scope: NamespaceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Where a [`ClientHook`] is called, as in the vcluster-sdk: the write (or read) of an object
/// in the virtual cluster or on the host (`physical`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// Before an object is created in the virtual cluster.
    CreateVirtual,
    /// Before an object is updated in the virtual cluster (including its status).
    UpdateVirtual,
    /// Before an object is deleted in the virtual cluster.
    DeleteVirtual,
    /// After an object of the virtual cluster is read (from the cache), before a syncer sees it.
    GetVirtual,
    /// Before an object is created on the host.
    CreatePhysical,
    /// Before an object is updated on the host.
    UpdatePhysical,
    /// Before an object is deleted on the host.
    DeletePhysical,
    /// After a host object is read (from the cache), before a syncer sees it.
    GetPhysical,
}

/// A hook on the objects of one type (`api_version` / `kind`) on their way between the
/// clusters: the vcluster-sdk's `ClientHook` with its eight `Mutate…` interfaces.
///
/// Every point receives the object as JSON (`apiVersion`, `kind`, `metadata`, …) and returns it,
/// changed or not; the default of every point returns it unchanged. An error stops the write
/// (it is reported and retried with backoff). A hook says which points it implements with
/// [`ClientHook::handles`], so that objects are not converted to JSON for nothing.
pub trait ClientHook: Send + Sync + 'static {
    /// Name, for logs and errors.
    fn name(&self) -> &str;
    /// `group/version` of the objects hooked (`v1` for core types such as `Pod`).
    fn api_version(&self) -> &str;
    /// Kind of the objects hooked.
    fn kind(&self) -> &str;
    /// Whether the hook implements `point` (default: all of them).
    fn handles(&self, point: HookPoint) -> bool {
        let _ = point;
        true
    }
    /// Before `obj` is created in the virtual cluster.
    ///
    /// # Errors
    /// A [`HookError`] stops the write.
    fn mutate_create_virtual(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// Before `obj` is updated in the virtual cluster.
    ///
    /// # Errors
    /// A [`HookError`] stops the write.
    fn mutate_update_virtual(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// Before `obj` is deleted in the virtual cluster (the result is not written; an error
    /// stops the delete).
    ///
    /// # Errors
    /// A [`HookError`] stops the delete.
    fn mutate_delete_virtual(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// After `obj` is read from the virtual cluster, before a syncer sees it.
    ///
    /// # Errors
    /// A [`HookError`] fails this sync of the object.
    fn mutate_get_virtual(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// Before `obj` is created on the host.
    ///
    /// # Errors
    /// A [`HookError`] stops the write.
    fn mutate_create_physical(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// Before `obj` is updated on the host.
    ///
    /// # Errors
    /// A [`HookError`] stops the write.
    fn mutate_update_physical(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// Before `obj` is deleted on the host (the result is not written; an error stops the
    /// delete).
    ///
    /// # Errors
    /// A [`HookError`] stops the delete.
    fn mutate_delete_physical(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
    /// After `obj` is read from the host, before a syncer sees it.
    ///
    /// # Errors
    /// A [`HookError`] fails this sync of the object.
    fn mutate_get_physical(&self, obj: Value) -> Result<Value, HookError> {
        Ok(obj)
    }
}

/// The [`ClientHook`]s of one type, applied in registration order.
#[derive(Clone, Default)]
pub struct Hooks {
    hooks: Vec<Arc<dyn ClientHook>>,
}

impl Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.hooks.iter().map(|h| h.name()))
            .finish()
    }
}

impl Hooks {
    /// The hooks of `all` for objects of `api_version` / `kind`.
    pub fn for_type(all: &[Arc<dyn ClientHook>], api_version: &str, kind: &str) -> Self {
        Self {
            hooks: all
                .iter()
                .filter(|h| h.api_version() == api_version && h.kind() == kind)
                .cloned()
                .collect(),
        }
    }

    /// Whether any hook implements `point`.
    pub fn handles(&self, point: HookPoint) -> bool {
        self.hooks.iter().any(|h| h.handles(point))
    }

    /// Runs the hooks implementing `point` on `obj`, in order.
    ///
    /// # Errors
    /// The first hook's error.
    pub fn apply(&self, point: HookPoint, mut obj: Value) -> Result<Value, HookError> {
        for hook in self.hooks.iter().filter(|h| h.handles(point)) {
            obj = match point {
                HookPoint::CreateVirtual => hook.mutate_create_virtual(obj)?,
                HookPoint::UpdateVirtual => hook.mutate_update_virtual(obj)?,
                HookPoint::DeleteVirtual => hook.mutate_delete_virtual(obj)?,
                HookPoint::GetVirtual => hook.mutate_get_virtual(obj)?,
                HookPoint::CreatePhysical => hook.mutate_create_physical(obj)?,
                HookPoint::UpdatePhysical => hook.mutate_update_physical(obj)?,
                HookPoint::DeletePhysical => hook.mutate_delete_physical(obj)?,
                HookPoint::GetPhysical => hook.mutate_get_physical(obj)?,
            };
        }
        Ok(obj)
    }

    /// [`Self::apply`] on a typed object (converted to JSON and back); `obj` itself when no hook
    /// implements `point`.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Json`] when the hooked JSON no longer fits the type.
    pub fn apply_typed<K: SyncObject>(&self, point: HookPoint, obj: K) -> Result<K, Error> {
        if !self.handles(point) {
            return Ok(obj);
        }
        let name = obj.name_any();
        let value = to_json(&obj, &name)?;
        let value = self.apply(point, value)?;
        serde_json::from_value(value).map_err(|source| Error::Json {
            what: format!("{name} after the {point:?} hooks"),
            source,
        })
    }
}

/// What a plugin knows when it registers its syncers: both clients, the vCluster and its host
/// namespace (vcluster-sdk's `RegisterContext`).
#[derive(Clone)]
pub struct RegisterContext {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster (the vCluster's own API server).
    pub virtual_: Client,
    /// The vCluster's host namespace: the only host namespace watched and written.
    pub host_namespace: String,
    /// The vCluster name (in host names and the `vcluster.loft.sh/managed-by` label).
    pub vcluster: String,
    /// Every object is reconciled again this often (default 5 minutes).
    pub resync_period: Duration,
    /// Concurrent workers per synced type (default 4): different objects sync in parallel, one
    /// object is never synced by two workers at once.
    pub workers: usize,
    /// uid of the vCluster's Service (`<vcluster>` in the host namespace): every host copy the
    /// translators of this context make is owned by it, so deleting the vCluster
    /// garbage-collects them (vCluster's `experimental.syncSettings.setOwner`, on by default).
    /// `None` (the default of [`RegisterContext::new`]): no ownerReference; see
    /// [`RegisterContext::with_vcluster_owner`].
    pub owner_uid: Option<String>,
}

impl RegisterContext {
    /// A context with the default resync period (5 minutes) and 4 workers per type.
    pub fn new(
        host: Client,
        virtual_: Client,
        host_namespace: impl Into<String>,
        vcluster: impl Into<String>,
    ) -> Self {
        Self {
            host,
            virtual_,
            host_namespace: host_namespace.into(),
            vcluster: vcluster.into(),
            resync_period: Duration::from_secs(300),
            workers: 4,
            owner_uid: None,
        }
    }

    /// This context with [`RegisterContext::owner_uid`] read from the host: the uid of the
    /// Service named like the vCluster in the host namespace, as vCluster's syncer reads it at
    /// start-up (`SetGlobalOwner`). Needs `get` on `services` in the host namespace. When the
    /// Service does not exist or cannot be read, a warning is logged and host copies get no
    /// owner (vCluster itself refuses to start then).
    pub async fn with_vcluster_owner(mut self) -> Self {
        self.owner_uid = vcluster_owner_uid(&self.host, &self.host_namespace, &self.vcluster).await;
        self
    }

    /// The [`NamespacedTranslator`] of a typed resource `K` (vcluster-sdk's
    /// `translator.NewNamespacedTranslator(ctx, name, &K{})`).
    pub fn translator<K: Resource<DynamicType = ()>>(&self) -> NamespacedTranslator {
        NamespacedTranslator::new(
            &self.vcluster,
            &self.host_namespace,
            K::api_version(&()),
            K::kind(&()),
        )
        .with_owner_uid(self.owner_uid.clone())
    }

    /// The [`NamespacedTranslator`] of `api_version` / `kind` (for dynamic types).
    pub fn translator_for(&self, api_version: &str, kind: &str) -> NamespacedTranslator {
        NamespacedTranslator::new(&self.vcluster, &self.host_namespace, api_version, kind)
            .with_owner_uid(self.owner_uid.clone())
    }
}

/// The uid of the vCluster's Service `vcluster` in `host_namespace` (the owner vCluster puts on
/// every host copy), or `None`, with a warning, when it is missing or cannot be read.
pub async fn vcluster_owner_uid(
    host: &Client,
    host_namespace: &str,
    vcluster: &str,
) -> Option<String> {
    let services: Api<Service> = Api::namespaced(host.clone(), host_namespace);
    match services.get_opt(vcluster).await {
        Ok(Some(service)) => service.metadata.uid,
        Ok(None) => {
            warn!(namespace = %host_namespace, service = %vcluster, "the vCluster's Service does not exist: host copies get no ownerReference");
            None
        }
        Err(error) => {
            warn!(%error, namespace = %host_namespace, service = %vcluster, "cannot read the vCluster's Service (the syncer needs get on services): host copies get no ownerReference");
            None
        }
    }
}

/// One namespaced type synced from the virtual cluster to the host namespace (vcluster-sdk's
/// `syncer.Syncer`: `SyncToHost`, `Sync`, `SyncToVirtual`).
///
/// The driving controller watches both sides, keys every event by the virtual object's
/// `namespace/name`, and calls exactly one method per reconcile:
///
/// | virtual | host | call |
/// | --- | --- | --- |
/// | exists | missing | [`Syncer::sync_to_host`] |
/// | exists | exists, managed, same `object-uid` | [`Syncer::sync`] |
/// | exists | exists, managed, other `object-uid` | host deleted, then [`Syncer::sync_to_host`] |
/// | missing / terminating | exists, managed | [`Syncer::sync_to_virtual`] (default: delete host) |
/// | any | exists, not managed by this vCluster | nothing; reported as a conflict |
///
/// The methods return futures that must be `Send` (the controller runs them on several
/// workers); writing them as `async fn` in the `impl` is fine.
pub trait Syncer: Send + Sync + 'static {
    /// The synced type.
    type Object: SyncObject;

    /// The type's dynamic type (`()` for typed resources, the `ApiResource` for
    /// [`kube::api::DynamicObject`]).
    fn dynamic_type(&self) -> <Self::Object as Resource>::DynamicType;

    /// The translator of the type (from [`RegisterContext::translator`]).
    fn translator(&self) -> &NamespacedTranslator;

    /// Only virtual objects matching this label selector are synced (host copies of objects
    /// that stop matching are deleted). Default: all.
    fn selector(&self) -> Option<Selector> {
        None
    }

    /// Whether the virtual type has a `status` subresource (used by
    /// [`SyncContext::sync_status_to_virtual`]). Default: `true`.
    fn status_subresource(&self) -> bool {
        true
    }

    /// A virtual object has no host copy: create it, typically with
    /// `ctx.sync_to_host_create(virtual_obj, translated)`.
    fn sync_to_host(
        &self,
        ctx: &SyncContext<Self::Object>,
        virtual_obj: &Self::Object,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Both exist: bring the host copy up to date, typically with
    /// `ctx.sync_to_host_update(host_obj, changed)` (no request for `None`).
    fn sync(
        &self,
        ctx: &SyncContext<Self::Object>,
        host_obj: &Self::Object,
        virtual_obj: &Self::Object,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// A host copy managed by this vCluster whose virtual object is gone or terminating.
    /// Default: delete the host copy (vCluster's behaviour for virtual-to-host types).
    fn sync_to_virtual(
        &self,
        ctx: &SyncContext<Self::Object>,
        host_obj: &Self::Object,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        ctx.delete_host(host_obj)
    }
}

/// What a [`Syncer`] gets on every call: the clients, the type's translator and hooks, and the
/// write helpers (vcluster-sdk's `SyncContext` plus the `NamespacedTranslator` helpers).
pub struct SyncContext<K: SyncObject> {
    register: RegisterContext,
    dynamic_type: K::DynamicType,
    translator: NamespacedTranslator,
    hooks: Hooks,
    stats: Arc<TypeStats>,
}

impl<K: SyncObject> SyncContext<K> {
    /// A context for type `K` (`dynamic_type`) translated by `translator`, with its `hooks`;
    /// writes are counted in `stats`.
    pub fn new(
        register: RegisterContext,
        dynamic_type: K::DynamicType,
        translator: NamespacedTranslator,
        hooks: Hooks,
        stats: Arc<TypeStats>,
    ) -> Self {
        Self {
            register,
            dynamic_type,
            translator,
            hooks,
            stats,
        }
    }

    /// Client of the host cluster.
    pub fn host_client(&self) -> &Client {
        &self.register.host
    }

    /// Client of the virtual cluster.
    pub fn virtual_client(&self) -> &Client {
        &self.register.virtual_
    }

    /// The vCluster's host namespace.
    pub fn host_namespace(&self) -> &str {
        &self.register.host_namespace
    }

    /// The register context this syncer runs in.
    pub fn register_context(&self) -> &RegisterContext {
        &self.register
    }

    /// The type's translator.
    pub fn translator(&self) -> &NamespacedTranslator {
        &self.translator
    }

    /// The type's hooks.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The type's statistics.
    pub fn stats(&self) -> &Arc<TypeStats> {
        &self.stats
    }

    /// The type's dynamic type.
    pub fn dynamic_type(&self) -> &K::DynamicType {
        &self.dynamic_type
    }

    /// The type in the host namespace.
    pub fn host_api(&self) -> Api<K> {
        Api::all_with(self.register.host.clone(), &self.dynamic_type)
            .constrain(&self.register.host_namespace)
    }

    /// The type in virtual namespace `namespace`.
    pub fn virtual_api(&self, namespace: &str) -> Api<K> {
        Api::all_with(self.register.virtual_.clone(), &self.dynamic_type).constrain(namespace)
    }

    fn describe(&self, verb: &str, side: &str, namespace: &str, name: &str) -> String {
        format!(
            "{verb} {side} {} {} {namespace}/{name}",
            self.translator.api_version(),
            self.translator.kind()
        )
    }

    /// Creates `host_obj` (the translated copy of `virtual_obj`) on the host after the
    /// `CreatePhysical` hooks (vcluster-sdk's `SyncToHostCreate`). One request.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`] (409 AlreadyExists when the host object appeared
    /// meanwhile: retried by the controller).
    pub async fn sync_to_host_create(&self, virtual_obj: &K, host_obj: K) -> Result<(), Error> {
        let host_obj = self
            .hooks
            .apply_typed(HookPoint::CreatePhysical, host_obj)?;
        let host_name = host_obj.name_any();
        let params = PostParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        self.stats.count_write();
        self.host_api()
            .create(&params, &host_obj)
            .await
            .map_err(|e| {
                Error::kube(
                    self.describe("create", "host", self.host_namespace(), &host_name),
                    e,
                )
            })?;
        info!(kind = %self.translator.kind(), host = %host_name, virtual_namespace = %virtual_obj.namespace().unwrap_or_default(), virtual_name = %virtual_obj.name_any(), "created host object");
        Ok(())
    }

    /// Brings the host object `host_obj` to `updated` (vcluster-sdk's `SyncToHostUpdate`):
    /// `None` sends no request; otherwise the `UpdatePhysical` hooks run on `updated` and a
    /// merge patch of exactly the fields that then differ from `host_obj` is sent, carrying
    /// `host_obj`'s `resourceVersion` (409 when the object moved on). No request when nothing
    /// differs.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    pub async fn sync_to_host_update(&self, host_obj: &K, updated: Option<K>) -> Result<(), Error> {
        let Some(updated) = updated else {
            return Ok(());
        };
        let host_name = host_obj.name_any();
        let current = to_json(host_obj, &host_name)?;
        let desired = to_json(&updated, &host_name)?;
        let desired = if self.hooks.handles(HookPoint::UpdatePhysical) {
            self.hooks.apply(HookPoint::UpdatePhysical, desired)?
        } else {
            desired
        };
        let Some(patch) = guarded_merge_patch(&current, &desired, host_obj.resource_version())
        else {
            return Ok(());
        };
        self.stats.count_write();
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
                    self.describe("patch", "host", self.host_namespace(), &host_name),
                    e,
                )
            })?;
        info!(kind = %self.translator.kind(), host = %host_name, "updated host object");
        Ok(())
    }

    /// Deletes the host object `host_obj` (precondition: its uid), after the `DeletePhysical`
    /// hooks. A 404 counts as done.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    pub async fn delete_host(&self, host_obj: &K) -> Result<(), Error> {
        let host_name = host_obj.name_any();
        if self.hooks.handles(HookPoint::DeletePhysical) {
            self.hooks
                .apply(HookPoint::DeletePhysical, to_json(host_obj, &host_name)?)?;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: host_obj.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.stats.count_write();
        match self.host_api().delete(&host_name, &params).await {
            Ok(_) => {
                info!(kind = %self.translator.kind(), host = %host_name, "deleted host object");
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(
                self.describe("delete", "host", self.host_namespace(), &host_name),
                e,
            )),
        }
    }

    /// Copies `host_obj`'s `.status` to `virtual_obj` when they differ (vCluster's
    /// `syncStatus`), after the `UpdateVirtual` hooks; through the `status` subresource when
    /// `subresource`. No request when equal or when the host has no status.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    pub async fn sync_status_to_virtual(
        &self,
        virtual_obj: &K,
        host_obj: &K,
        subresource: bool,
    ) -> Result<(), Error> {
        let name = virtual_obj.name_any();
        let namespace = virtual_obj.namespace().unwrap_or_default();
        let host = to_json(host_obj, &name)?;
        let Some(host_status) = host.get("status") else {
            return Ok(());
        };
        let current = to_json(virtual_obj, &name)?;
        if current.get("status") == Some(host_status) {
            return Ok(());
        }
        let mut desired = current.clone();
        desired["status"] = host_status.clone();
        let desired = if self.hooks.handles(HookPoint::UpdateVirtual) {
            self.hooks.apply(HookPoint::UpdateVirtual, desired)?
        } else {
            desired
        };
        let current_status = json!({"status": current.get("status")});
        let desired_status = json!({"status": desired.get("status")});
        let Some(patch) = guarded_merge_patch(
            &current_status,
            &desired_status,
            virtual_obj.resource_version(),
        ) else {
            return Ok(());
        };
        let api = self.virtual_api(&namespace);
        let params = PatchParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        self.stats.count_write();
        let result = if subresource {
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
        Ok(())
    }
}

/// `obj` as JSON.
pub(crate) fn to_json<K: Serialize>(obj: &K, name: &str) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|source| Error::Json {
        what: format!("object {name}"),
        source,
    })
}

type Launch =
    Box<dyn FnOnce(Arc<[Arc<dyn ClientHook>]>) -> BoxFuture<'static, Result<(), Error>> + Send>;

/// A plugin written in Rust: syncers and hooks registered on one [`RegisterContext`], run by
/// [`Plugin::start`] (vcluster-sdk's `plugin.MustInit` / `MustRegister` / `MustStart`).
pub struct Plugin {
    context: RegisterContext,
    syncers: Vec<((String, String), Launch)>,
    hooks: Vec<Arc<dyn ClientHook>>,
    stats: Vec<Arc<TypeStats>>,
    /// Set when vCluster started this process as a v2 plugin ([`crate::v2`]).
    v2: Option<crate::v2::Session>,
}

impl Plugin {
    /// A plugin on `context`.
    pub fn new(context: RegisterContext) -> Self {
        Self {
            context,
            syncers: Vec::new(),
            hooks: Vec::new(),
            stats: Vec::new(),
            v2: None,
        }
    }

    /// A plugin configured the way it was started:
    ///
    /// - by vCluster as a v2 plugin (the magic cookie `VCLUSTER_PLUGIN=vcluster` is set, as
    ///   vCluster's Go SDK detects it): serves the v2 protocol ([`crate::v2`]) and waits for
    ///   vCluster's `Initialize`, whose kubeconfigs, host namespace and vCluster name make the
    ///   context; [`Plugin::start`] then answers vCluster;
    /// - otherwise as a sidecar, from the environment: `HOST_KUBECONFIG` (default:
    ///   in-cluster), `VIRTUAL_KUBECONFIG` (required), `POD_NAMESPACE` (default: the host
    ///   kubeconfig's namespace) and `VCLUSTER_NAME` (required).
    ///
    /// Either way the owner of host copies is read from the host
    /// ([`RegisterContext::with_vcluster_owner`]).
    ///
    /// # Errors
    /// [`Error::Kubeconfig`] when a kubeconfig cannot be loaded or a variable is missing;
    /// [`Error::PluginProtocol`] when the v2 protocol fails (the error is also returned to
    /// vCluster as the answer to `Initialize`).
    pub async fn init() -> Result<Self, Error> {
        if crate::v2::started_by_vcluster() {
            return Self::init_v2().await;
        }
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (host, host_namespace) =
            client_from("host", var("HOST_KUBECONFIG").map(PathBuf::from)).await?;
        let virtual_path = var("VIRTUAL_KUBECONFIG").ok_or_else(|| Error::Kubeconfig {
            cluster: "virtual",
            path: "$VIRTUAL_KUBECONFIG".into(),
            message: "VIRTUAL_KUBECONFIG is not set".into(),
        })?;
        let (virtual_, _) = client_from("virtual", Some(PathBuf::from(virtual_path))).await?;
        let vcluster = var("VCLUSTER_NAME").ok_or_else(|| Error::Kubeconfig {
            cluster: "host",
            path: "$VCLUSTER_NAME".into(),
            message: "VCLUSTER_NAME is not set".into(),
        })?;
        let namespace = var("POD_NAMESPACE").unwrap_or(host_namespace);
        let context = RegisterContext::new(host, virtual_, namespace, vcluster)
            .with_vcluster_owner()
            .await;
        Ok(Self::new(context))
    }

    async fn init_v2() -> Result<Self, Error> {
        let session = crate::v2::Session::serve().await?;
        let init = session.init_config();
        let (host, virtual_) = match crate::v2::clients(init).await {
            Ok(clients) => clients,
            Err(error) => {
                session.fail(&error.to_string());
                return Err(error.into());
            }
        };
        let context = RegisterContext::new(
            host,
            virtual_,
            init.host_namespace.clone(),
            init.vcluster.clone(),
        )
        .with_vcluster_owner()
        .await;
        let mut plugin = Self::new(context);
        plugin.v2 = Some(session);
        Ok(plugin)
    }

    /// The v2 session when vCluster started this process ([`Plugin::init`]): the init config
    /// vCluster sent (its `plugin_config` is the plugin's configuration from the vCluster's
    /// values).
    pub fn v2_session(&self) -> Option<&crate::v2::Session> {
        self.v2.as_ref()
    }

    /// The context to build syncers with.
    pub fn context(&self) -> &RegisterContext {
        &self.context
    }

    /// Registers a syncer; it runs from [`Plugin::start`] with the hooks of its type.
    pub fn register<S: Syncer>(&mut self, syncer: S) -> &mut Self {
        let translator = syncer.translator().clone();
        let stats = Arc::new(TypeStats::new(translator.api_version(), translator.kind()));
        self.stats.push(stats.clone());
        let context = self.context.clone();
        let key = (
            translator.api_version().to_string(),
            translator.kind().to_string(),
        );
        let launch: Launch = Box::new(move |hooks| {
            Box::pin(async move {
                let hooks = Hooks::for_type(&hooks, translator.api_version(), translator.kind());
                let ctx = SyncContext::new(
                    context.clone(),
                    syncer.dynamic_type(),
                    translator,
                    hooks,
                    stats,
                );
                crate::controller::run(syncer, ctx, crate::controller::Options::from(&context))
                    .await
            })
        });
        self.syncers.push((key, launch));
        self
    }

    /// Registers a hook. Hooks of a type with a registered syncer run in its writes; `v1` `Pod`
    /// hooks without a pod syncer run on the host pods vCluster's own syncer made
    /// ([`crate::pods`], `--pod-sync=hooks`). Hooks of other types without a syncer are
    /// logged and ignored.
    pub fn register_hook<H: ClientHook>(&mut self, hook: H) -> &mut Self {
        self.hooks.push(Arc::new(hook));
        self
    }

    /// Statistics of the registered syncers (objects in sync, writes), in registration order.
    pub fn stats(&self) -> &[Arc<TypeStats>] {
        &self.stats
    }

    /// Runs every registered syncer (and the pod hooks) until one of them fails or the future
    /// is dropped.
    ///
    /// Started by vCluster as a v2 plugin: declares the registered hooks to vCluster (which
    /// then calls them through `Mutate` before its own writes, so no host pod is patched
    /// afterwards), starts the syncers once `SetLeader` arrives, and returns `Ok(())` when
    /// vCluster stops the plugin (or exits).
    ///
    /// # Errors
    /// The first error a syncer stops with.
    pub async fn start(mut self) -> Result<(), Error> {
        let Some(session) = self.v2.take() else {
            return self.run(true).await;
        };
        let table = Arc::new(crate::v2::HookTable::new(self.hooks.clone()));
        session.ready(table);
        if !session.leader().await {
            info!("stopped before becoming leader");
            session.shutdown().await;
            return Ok(());
        }
        info!(syncers = self.syncers.len(), "leader: starting the syncers");
        let result = tokio::select! {
            result = self.run(false) => result,
            reason = session.stopped() => {
                info!(?reason, "stopping");
                Ok(())
            }
        };
        session.shutdown().await;
        result
    }

    /// Runs the syncers; `host_pod_hooks`: apply the `v1` `Pod` hooks to the host pods of the
    /// vCluster (a sidecar; a v2 plugin's pod hooks are called by vCluster instead).
    async fn run(self, host_pod_hooks: bool) -> Result<(), Error> {
        let hooks: Arc<[Arc<dyn ClientHook>]> = self.hooks.iter().cloned().collect();
        let mut tasks = tokio::task::JoinSet::new();
        let synced: Vec<(String, String)> = self.syncers.iter().map(|(k, _)| k.clone()).collect();
        for (_, launch) in self.syncers {
            tasks.spawn(launch(hooks.clone()));
        }
        let pod_hooks: Vec<Arc<dyn ClientHook>> = self
            .hooks
            .iter()
            .filter(|h| h.api_version() == "v1" && h.kind() == "Pod")
            .cloned()
            .collect();
        if host_pod_hooks && !pod_hooks.is_empty() && !synced.contains(&("v1".into(), "Pod".into()))
        {
            tasks.spawn(crate::pods::run_pod_hooks(crate::pods::PodHookOptions {
                host: self.context.host.clone(),
                namespace: self.context.host_namespace.clone(),
                vcluster: self.context.vcluster.clone(),
                hooks: Hooks { hooks: pod_hooks },
                stats: Arc::new(TypeStats::new("v1", "Pod")),
            }));
        }
        for hook in &self.hooks {
            let key = (hook.api_version().to_string(), hook.kind().to_string());
            if !synced.contains(&key) && key != ("v1".into(), "Pod".into()) && host_pod_hooks {
                warn!(hook = hook.name(), api_version = %key.0, kind = %key.1, "no syncer of this type is registered; hook ignored");
            }
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(error) => {
                    return Err(Error::Unsupported {
                        what: format!("a syncer task panicked: {error}"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A client and its default namespace from a kubeconfig file, or the in-cluster / default
/// configuration for `None`.
///
/// # Errors
/// [`Error::Kubeconfig`].
pub async fn client_from(
    cluster: &'static str,
    path: Option<PathBuf>,
) -> Result<(Client, String), Error> {
    let failed = |message: String| Error::Kubeconfig {
        cluster,
        path: path
            .as_ref()
            .map_or_else(|| "in-cluster/default".into(), |p| p.display().to_string()),
        message,
    };
    let config = match &path {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| failed(e.to_string()))?,
    };
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| failed(e.to_string()))?;
    Ok((client, namespace))
}
