//! Declarative hooks (`spec.hooks[]` of a `VClusterPlugin`) applied to objects as JSON: pure,
//! shared by the embedded runtime (which runs them, `vcp_syncer_runtime::hooks`) and the
//! operator (which applies them to a representative object of the vCluster to judge their
//! effect before it installs the plugin).
//!
//! A hook sets `labels` and `annotations`, removes `removeLabels` and `removeAnnotations`, and
//! then applies its RFC 6902 `jsonPatch` operations atomically, in that order.
//!
//! The operator does not depend on the runtime crate (a gRPC server, its allocator, its own
//! Kubernetes version feature): this crate holds the [`Hook`] type already, and the function
//! over it lives beside it.

use serde_json::Value;

use crate::{Hook, HookEvent};

/// A hook that could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The object is not a JSON object, so it has no `metadata` to set labels on.
    #[error("hook {hook:?}: the object is not a JSON object")]
    NotAnObject {
        /// Name of the hook.
        hook: String,
    },
    /// `metadata`, `metadata.labels` or `metadata.annotations` exists but is not an object.
    #[error("hook {hook:?}: {field} of the object is not a JSON object")]
    NotAMap {
        /// Name of the hook.
        hook: String,
        /// The offending field, such as `metadata.labels`.
        field: &'static str,
    },
    /// A `jsonPatch` operation could not be converted or failed (for example `remove` or
    /// `test` on a path that does not exist); no operation of the hook was applied.
    #[error("hook {hook:?}: jsonPatch failed: {message}")]
    JsonPatch {
        /// Name of the hook.
        hook: String,
        /// What went wrong, from the json-patch crate.
        message: String,
    },
    /// A hook written in code refused the object.
    #[error("hook {hook:?}: {message}")]
    Custom {
        /// Name of the hook.
        hook: String,
        /// Why.
        message: String,
    },
}

/// The hooks of `hooks` that apply to objects of `api_version` / `kind` on `event`, in order.
pub fn hooks_for<'a>(
    hooks: &'a [Hook],
    api_version: &str,
    kind: &str,
    event: HookEvent,
) -> Vec<&'a Hook> {
    hooks
        .iter()
        .filter(|hook| {
            hook.api_version == api_version && hook.kind == kind && hook.events.contains(&event)
        })
        .collect()
}

/// Applies one hook to `obj` (a Kubernetes object as JSON): sets its labels and annotations,
/// removes its `removeLabels` / `removeAnnotations` keys (a map that becomes empty is kept
/// empty, a missing map is not created for a removal), then applies its `jsonPatch`
/// atomically.
///
/// # Errors
/// [`HookError`] when `obj` does not have the shape of a Kubernetes object or a patch
/// operation fails; `obj` may then carry the label and annotation actions but none of the
/// patch operations.
pub fn apply_hook(obj: &mut Value, hook: &Hook) -> Result<(), HookError> {
    let root = obj.as_object_mut().ok_or_else(|| HookError::NotAnObject {
        hook: hook.name.clone(),
    })?;
    let needs_metadata = !hook.labels.is_empty() || !hook.annotations.is_empty();
    if needs_metadata || root.contains_key("metadata") {
        let metadata = root
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()))
            .as_object_mut()
            .ok_or_else(|| HookError::NotAMap {
                hook: hook.name.clone(),
                field: "metadata",
            })?;
        for (field, set, remove) in [
            ("labels", &hook.labels, &hook.remove_labels),
            ("annotations", &hook.annotations, &hook.remove_annotations),
        ] {
            let error_field = if field == "labels" {
                "metadata.labels"
            } else {
                "metadata.annotations"
            };
            if !set.is_empty() {
                let map = metadata
                    .entry(field)
                    .or_insert_with(|| Value::Object(Default::default()));
                if map.is_null() {
                    *map = Value::Object(Default::default());
                }
                let map = map.as_object_mut().ok_or_else(|| HookError::NotAMap {
                    hook: hook.name.clone(),
                    field: error_field,
                })?;
                for (key, value) in set {
                    map.insert(key.clone(), Value::String(value.clone()));
                }
            }
            if let Some(map) = metadata.get_mut(field).and_then(Value::as_object_mut) {
                for key in remove {
                    map.remove(key);
                }
            }
        }
    }
    if !hook.json_patch.is_empty() {
        let patch: json_patch::Patch = serde_json::to_value(&hook.json_patch)
            .and_then(serde_json::from_value)
            .map_err(|e| HookError::JsonPatch {
                hook: hook.name.clone(),
                message: e.to_string(),
            })?;
        json_patch::patch(obj, &patch).map_err(|e| HookError::JsonPatch {
            hook: hook.name.clone(),
            message: e.to_string(),
        })?;
    }
    Ok(())
}

/// Applies `hooks` to `obj` in order, stopping at the first failure.
///
/// # Errors
/// The first [`HookError`] of [`apply_hook`].
pub fn apply_hooks<'a>(
    obj: &mut Value,
    hooks: impl IntoIterator<Item = &'a Hook>,
) -> Result<(), HookError> {
    hooks.into_iter().try_for_each(|hook| apply_hook(obj, hook))
}

#[cfg(test)]
mod tests;
