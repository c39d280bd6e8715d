//! The [`Syncer`] trait (vcluster-sdk's `syncer.Syncer`, public as `sdk::Syncer`) and the
//! declarative syncer: one `syncedTypes[]` entry of a `VClusterPlugin` (any namespaced type, as
//! [`DynamicObject`]) as a [`Syncer`], driven by [`crate::controller`] like any plugin-author
//! syncer.
//!
//! - [`Syncer::sync_to_host`]: the host copy is [`NamespacedTranslator::host_object`] (vCluster's
//!   translated metadata, every top-level field but `status` copied);
//! - [`Syncer::sync`]: [`NamespacedTranslator::host_object_update`] (spec replaced, labels and
//!   annotations merged with vCluster's managed-keys bookkeeping, host status kept), written only
//!   when something differs; then, with `syncStatus`, the host `.status` copied up;
//! - [`Syncer::sync_to_virtual`]: the default, delete the host copy.
//!
//! The type's `patches` ([`crate::patches`]) are applied to the host copy after vCluster's
//! translation, on create and on update alike, and reversed on the host status copied up; a
//! patch that fails fails the object ([`Error::Patch`]) before any write.
//!
//! With `spec_updates: false` (pods in `--pod-sync=full`) only labels and annotations are
//! updated after creation, as the rest of a pod's spec is immutable.

use std::future::Future;
use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use kube::core::Selector;
use kube::{Resource, ResourceExt};

use crate::context::{SyncContext, SyncObject};
use crate::error::Error;
use crate::patches::{ObjectPatchError, PatchError, Patches};
use crate::translate::NamespacedTranslator;

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

    /// The translator of the type (from [`RegisterContext::translator`](crate::sdk::RegisterContext::translator)).
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

    /// Whether a reconcile caused by the host watch event of this syncer's own create or
    /// patch (its echo) is known to write nothing when the type has no hooks: then the
    /// controller does not reconcile such events ([`crate::own_writes`]). Default: `false`,
    /// every event is reconciled, as vCluster's controllers reconcile again after their own
    /// writes (a syncer whose `sync` does more than undo differences relies on that).
    fn echo_is_a_no_op(&self) -> bool {
        false
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

/// A declared synced type (see the module docs).
#[derive(Clone, Debug)]
pub struct DeclarativeSyncer {
    /// Translator of the type (vCluster name, host namespace, `apiVersion` / `kind`).
    pub translator: NamespacedTranslator,
    /// The type's resource (discovered on the virtual API server).
    pub resource: ApiResource,
    /// Only virtual objects matching this selector are synced.
    pub selector: Option<Selector>,
    /// Copy the host `.status` up to the virtual object (`syncStatus`).
    pub sync_status: bool,
    /// Whether the virtual type has a `status` subresource.
    pub status_subresource: bool,
    /// Whether fields other than labels and annotations are updated after creation.
    pub spec_updates: bool,
    /// The type's `patches` ([`crate::patches`]): applied to the host copy after vCluster's
    /// translation (on create and on every update, so the desired copy is the same each time),
    /// and reversed on the host status that `syncStatus` copies up.
    pub patches: Arc<Patches>,
}

impl DeclarativeSyncer {
    /// `host` (a host copy of `virtual_obj` as translated) with the type's patches applied,
    /// their expressions on the blocking pool ([`Patches::to_host_in_pool`]): the controller's
    /// other workers and its watches go on meanwhile.
    ///
    /// # Errors
    /// [`Error::Patch`] naming the object when a patch fails: the copy must not be written.
    pub async fn patched_host(
        &self,
        virtual_obj: &DynamicObject,
        host: DynamicObject,
    ) -> Result<DynamicObject, Error> {
        if self.patches.is_empty() {
            return Ok(host);
        }
        let virtual_json = json_of(virtual_obj)?;
        let host_json = json_of(&host)?;
        let host_json = self
            .patches
            .to_host_in_pool(virtual_json, host_json)
            .await
            .map_err(|source| self.patch_error(virtual_obj, source))?;
        object_of(host_json)
    }

    /// The host object `host` as it reads in the virtual cluster (the way back of the type's
    /// patches), for copying its status up; expressions on the blocking pool, as
    /// [`Self::patched_host`].
    ///
    /// # Errors
    /// [`Error::Patch`] naming the object when a patch's way back fails.
    pub async fn unpatched_host(
        &self,
        virtual_obj: &DynamicObject,
        host: &DynamicObject,
    ) -> Result<DynamicObject, Error> {
        let virtual_json = json_of(virtual_obj)?;
        let host_json = json_of(host)?;
        let host_json = self
            .patches
            .to_virtual_in_pool(virtual_json, host_json)
            .await
            .map_err(|source| self.patch_error(virtual_obj, source))?;
        object_of(host_json)
    }

    fn patch_error(&self, virtual_obj: &DynamicObject, source: PatchError) -> Error {
        Error::Patch(Box::new(ObjectPatchError {
            api_version: self.translator.api_version().to_string(),
            kind: self.translator.kind().to_string(),
            object: format!(
                "{}/{}",
                virtual_obj.namespace().unwrap_or_default(),
                virtual_obj.name_any()
            ),
            uid: virtual_obj.metadata.uid.clone(),
            source,
        }))
    }
}

/// `obj` as JSON.
fn json_of(obj: &DynamicObject) -> Result<serde_json::Value, Error> {
    serde_json::to_value(obj).map_err(|source| Error::Json {
        what: format!("{} to JSON", obj.name_any()),
        source,
    })
}

/// A `DynamicObject` from JSON.
fn object_of(value: serde_json::Value) -> Result<DynamicObject, Error> {
    serde_json::from_value(value).map_err(|source| Error::Json {
        what: "a patched object".into(),
        source,
    })
}

impl Syncer for DeclarativeSyncer {
    type Object = DynamicObject;

    fn dynamic_type(&self) -> ApiResource {
        self.resource.clone()
    }

    fn translator(&self) -> &NamespacedTranslator {
        &self.translator
    }

    fn selector(&self) -> Option<Selector> {
        self.selector.clone()
    }

    fn status_subresource(&self) -> bool {
        self.status_subresource
    }

    /// `true`: after its own create the host copy is `host_object`, which `sync` leaves as it
    /// is (no request: nothing differs, and a new copy has no status to copy up); after its own
    /// patch the copy is what `sync` wanted. Only hooks could make the next `sync` differ, and
    /// the controller reconciles every event of a type with hooks.
    fn echo_is_a_no_op(&self) -> bool {
        true
    }

    async fn sync_to_host(
        &self,
        ctx: &SyncContext<DynamicObject>,
        virtual_obj: &DynamicObject,
    ) -> Result<(), Error> {
        let host = self
            .patched_host(virtual_obj, self.translator.host_object(virtual_obj))
            .await?;
        ctx.sync_to_host_create(virtual_obj, host).await
    }

    async fn sync(
        &self,
        ctx: &SyncContext<DynamicObject>,
        host_obj: &DynamicObject,
        virtual_obj: &DynamicObject,
    ) -> Result<(), Error> {
        let mut current = host_obj.clone();
        current.types = Some(self.translator.type_meta());
        let desired = if self.spec_updates {
            self.patched_host(
                virtual_obj,
                self.translator.host_object_update(virtual_obj, &current),
            )
            .await?
        } else {
            let mut desired = current.clone();
            if let Some(update) = self
                .translator
                .translate_metadata_update(&virtual_obj.metadata, &current.metadata)
            {
                desired.metadata.labels = Some(update.labels);
                desired.metadata.annotations = Some(update.annotations);
            }
            desired
        };
        // Always handed over (not `None` when equal): UpdatePhysical hooks may still differ.
        ctx.sync_to_host_update(&current, Some(desired)).await?;
        if self.sync_status {
            let host_obj = if self.patches.is_empty() {
                host_obj.clone()
            } else {
                self.unpatched_host(virtual_obj, host_obj).await?
            };
            ctx.sync_status_to_virtual(virtual_obj, &host_obj, self.status_subresource)
                .await?;
        }
        Ok(())
    }
}
