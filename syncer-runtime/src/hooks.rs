//! Declarative hooks (`spec.hooks[]` of a `VClusterPlugin`) applied to objects as JSON (the
//! pure application is `vcp_crds::hooks`, re-exported here).
//!
//! A hook mutates an object on its way between the virtual cluster and the host, like the
//! vcluster-sdk's `ClientHook` `Mutate{Create,Update}{Physical,Virtual}` points: it sets
//! `labels` and `annotations`, removes `removeLabels` and `removeAnnotations`, and then applies
//! its RFC 6902 `jsonPatch` operations, in that order.
//!
//! The hook points of the plugin-author API live here too (public as `sdk::...`): [`HookPoint`],
//! the [`ClientHook`] trait with its eight `mutate_*` points, and [`Hooks`], the hooks of one
//! type applied in order. [`DeclarativeHook`] makes one declared hook a [`ClientHook`], so the
//! declarative runtime runs its hooks through the same points as a plugin written in code.

use serde_json::Value;
use std::fmt::Debug;
use std::sync::Arc;
/// The pure application of declared hooks lives in `vcp_crds::hooks`, shared with the operator,
/// which judges what the hooks do to a vCluster's pods before it installs a plugin.
pub use vcp_crds::hooks::{apply_hook, apply_hooks, hooks_for};
use vcp_crds::{Hook, HookEvent};

pub use vcp_crds::hooks::HookError;

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

    /// Whether there is no hook at all.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
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
}

/// One declared hook as a [`ClientHook`]: it implements the points named by its `events`
/// (`CreatePhysical`, `UpdatePhysical`, `CreateVirtual`, `UpdateVirtual`), each applying
/// [`apply_hook`].
#[derive(Clone, Debug)]
pub struct DeclarativeHook(pub Hook);

impl DeclarativeHook {
    fn run(&self, mut obj: Value) -> Result<Value, HookError> {
        apply_hook(&mut obj, &self.0)?;
        Ok(obj)
    }
}

impl ClientHook for DeclarativeHook {
    fn name(&self) -> &str {
        &self.0.name
    }
    fn api_version(&self) -> &str {
        &self.0.api_version
    }
    fn kind(&self) -> &str {
        &self.0.kind
    }
    fn handles(&self, point: HookPoint) -> bool {
        let event = match point {
            HookPoint::CreatePhysical => HookEvent::CreatePhysical,
            HookPoint::UpdatePhysical => HookEvent::UpdatePhysical,
            HookPoint::CreateVirtual => HookEvent::CreateVirtual,
            HookPoint::UpdateVirtual => HookEvent::UpdateVirtual,
            _ => return false,
        };
        self.0.events.contains(&event)
    }
    fn mutate_create_physical(&self, obj: Value) -> Result<Value, HookError> {
        self.run(obj)
    }
    fn mutate_update_physical(&self, obj: Value) -> Result<Value, HookError> {
        self.run(obj)
    }
    fn mutate_create_virtual(&self, obj: Value) -> Result<Value, HookError> {
        self.run(obj)
    }
    fn mutate_update_virtual(&self, obj: Value) -> Result<Value, HookError> {
        self.run(obj)
    }
}

/// The declared `hooks` as [`ClientHook`]s.
pub fn declarative_hooks(hooks: &[Hook]) -> Vec<Arc<dyn ClientHook>> {
    hooks
        .iter()
        .map(|h| Arc::new(DeclarativeHook(h.clone())) as Arc<dyn ClientHook>)
        .collect()
}
