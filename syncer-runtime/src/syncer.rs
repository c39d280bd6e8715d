//! The declarative syncer: one `syncedTypes[]` entry of a `VClusterPlugin` (any namespaced
//! type, as [`DynamicObject`]) as a [`Syncer`], driven by [`crate::controller`] like any
//! plugin-author syncer.
//!
//! - [`Syncer::sync_to_host`]: the host copy is [`NamespacedTranslator::host_object`] (vCluster's
//!   translated metadata, every top-level field but `status` copied);
//! - [`Syncer::sync`]: [`NamespacedTranslator::host_object_update`] (spec replaced, labels and
//!   annotations merged with vCluster's managed-keys bookkeeping, host status kept), written only
//!   when something differs; then, with `syncStatus`, the host `.status` copied up;
//! - [`Syncer::sync_to_virtual`]: the default, delete the host copy.
//!
//! With `spec_updates: false` (pods in `--pod-sync=full`) only labels and annotations are
//! updated after creation, as the rest of a pod's spec is immutable.

use kube::api::{ApiResource, DynamicObject};
use kube::core::Selector;

use crate::error::Error;
use crate::sdk::{SyncContext, Syncer};
use crate::translate::NamespacedTranslator;

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

    async fn sync_to_host(
        &self,
        ctx: &SyncContext<DynamicObject>,
        virtual_obj: &DynamicObject,
    ) -> Result<(), Error> {
        ctx.sync_to_host_create(virtual_obj, self.translator.host_object(virtual_obj))
            .await
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
            self.translator.host_object_update(virtual_obj, &current)
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
            ctx.sync_status_to_virtual(virtual_obj, host_obj, self.status_subresource)
                .await?;
        }
        Ok(())
    }
}
