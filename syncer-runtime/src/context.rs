//! What a [`Syncer`](crate::sdk::Syncer) works with: the objects it can sync ([`SyncObject`]),
//! the plugin's [`RegisterContext`] (clients, vCluster, host namespace) and the per-type
//! [`SyncContext`] with the write helpers of the vcluster-sdk (`sync_to_host_create`,
//! `sync_to_host_update`, the host delete and the status copy), each applying the type's
//! [`ClientHook`](crate::sdk::ClientHook)s before it writes. Public through [`crate::sdk`].

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::core::NamespaceScope;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::own_writes::OwnWrites;
use crate::patch::to_json;
use crate::stats::TypeStats;
use crate::translate::NamespacedTranslator;
use crate::write::{Cluster, Part, Target, UpdateFilter, Writer};

/// How often every synced object is reconciled again by default (5 minutes), in a plugin's
/// [`RegisterContext`] and in the declarative runtime's configuration alike.
pub const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(300);

/// Concurrent workers per synced type by default (4), in a plugin's [`RegisterContext`] and in
/// the declarative runtime's configuration alike.
pub const DEFAULT_WORKERS: usize = 4;

/// An object type a [`Syncer`](crate::sdk::Syncer) can sync: any kube [`Resource`] (typed like the tutorial's `Car`
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
    /// The longest delay between two attempts of a failing watch (default 30 s; see
    /// [`crate::retry`]).
    pub retry_max: Duration,
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
            resync_period: DEFAULT_RESYNC_PERIOD,
            workers: DEFAULT_WORKERS,
            owner_uid: None,
            retry_max: crate::retry::DEFAULT_RETRY_MAX,
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

/// What a [`Syncer`](crate::sdk::Syncer) gets on every call: the clients, the type's translator and hooks, and the
/// write helpers (vcluster-sdk's `SyncContext` plus the `NamespacedTranslator` helpers). Every
/// write goes through the runtime's one write path ([`crate::write`]); host creates and patches
/// are tracked as own writes ([`crate::own_writes`]).
pub struct SyncContext<K: SyncObject> {
    register: RegisterContext,
    dynamic_type: K::DynamicType,
    translator: NamespacedTranslator,
    writer: Writer,
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
        let writer = Writer::new(translator.api_version(), translator.kind(), hooks, stats)
            .tracking_own_writes();
        Self {
            register,
            dynamic_type,
            translator,
            writer,
        }
    }

    /// This context, passing every host update through `filter` after the hooks (the pod
    /// syncers supply [`crate::pods::existing_pod_update`]: what an existing pod accepts).
    #[must_use]
    pub(crate) fn with_update_filter(mut self, filter: Option<UpdateFilter>) -> Self {
        self.writer = self.writer.with_update_filter(filter);
        self
    }

    /// The runtime's own host writes not yet seen on the host watch ([`crate::own_writes`]).
    pub(crate) fn own_writes(&self) -> &OwnWrites {
        self.writer
            .own_writes()
            .expect("a SyncContext's writer tracks its own writes")
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
        self.writer.hooks()
    }

    /// The type's statistics.
    pub fn stats(&self) -> &Arc<TypeStats> {
        self.writer.stats()
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

    fn host_target(&self) -> Target<K> {
        Target {
            api: self.host_api(),
            cluster: Cluster::Host,
            namespace: self.register.host_namespace.clone(),
        }
    }

    /// Creates `host_obj` (the translated copy of `virtual_obj`) on the host after the
    /// `CreatePhysical` hooks (vcluster-sdk's `SyncToHostCreate`). One request.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`] (409 AlreadyExists when the host object appeared
    /// meanwhile: retried by the controller).
    pub async fn sync_to_host_create(&self, virtual_obj: &K, host_obj: K) -> Result<(), Error> {
        let _ = virtual_obj;
        self.writer
            .create(&self.host_target(), HookPoint::CreatePhysical, host_obj)
            .await
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
        self.writer
            .patch(
                &self.host_target(),
                &host_name,
                Part::Object,
                &[HookPoint::UpdatePhysical],
                &current,
                desired,
                host_obj.resource_version(),
            )
            .await?;
        Ok(())
    }

    /// Deletes the host object `host_obj` (precondition: its uid), after the `DeletePhysical`
    /// hooks. A 404 counts as done.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    pub async fn delete_host(&self, host_obj: &K) -> Result<(), Error> {
        self.writer
            .delete(&self.host_target(), HookPoint::DeletePhysical, host_obj)
            .await?;
        Ok(())
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
        let to = Target {
            api: self.virtual_api(&namespace),
            cluster: Cluster::Virtual,
            namespace,
        };
        self.writer
            .patch(
                &to,
                &name,
                Part::Status { subresource },
                &[HookPoint::UpdateVirtual],
                &current,
                desired,
                virtual_obj.resource_version(),
            )
            .await?;
        Ok(())
    }
}
