//! `Mutate`: the registered [`ClientHook`]s applied to the object vCluster hands over (pure;
//! unit-tested).
//!
//! As vCluster's Go plugin SDK answers it (`vcluster-sdk`, `plugin/server.go`): the hooks of
//! the request's `apiVersion` / `kind` that implement its `type` run in registration order; the
//! response carries the object and `mutated: true` only when the result differs from what was
//! sent, and is empty otherwise (vCluster then keeps its own object). A type or point no hook
//! implements (vCluster only calls what [`PluginConfig`](super::config::PluginConfig)
//! declared) gets the empty response too.
//!
//! vCluster hands over typed objects read through controller-runtime's cache, whose JSON has
//! no `apiVersion` / `kind`; hooks are promised both ([`ClientHook`]), so they are filled in
//! from the request for the hooks and taken out again afterwards (unless a hook changed them).

use std::sync::Arc;

use serde_json::Value;

use super::config::parse_hook_type;
use super::proto::{MutateRequest, MutateResponse};
use crate::hooks::HookError;
use crate::hooks::{ClientHook, Hooks};

/// Why a `Mutate` request failed (sent back to vCluster as a gRPC error, which stops its
/// write).
#[derive(Debug, thiserror::Error)]
pub enum MutateError {
    /// The object is not JSON.
    #[error("the {kind} object to mutate is not JSON: {source}")]
    InvalidObject {
        /// Kind of the object.
        kind: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A hook refused or failed on the object.
    #[error("{point} hooks of {api_version} {kind}: {source}")]
    Hook {
        /// `group/version` of the object.
        api_version: String,
        /// Kind of the object.
        kind: String,
        /// The hook type (`CreatePhysical`, …).
        point: String,
        /// The hook's error.
        source: Box<HookError>,
    },
}

/// Applies the `hooks` that match `request` (see the module documentation).
///
/// # Errors
/// [`MutateError::InvalidObject`] when hooks apply and the object is not JSON;
/// [`MutateError::Hook`] when a hook fails (no partial result is returned).
pub fn mutate(
    hooks: &[Arc<dyn ClientHook>],
    request: &MutateRequest,
) -> Result<MutateResponse, MutateError> {
    let Some(point) = parse_hook_type(&request.r#type) else {
        return Ok(MutateResponse::default());
    };
    let hooks = Hooks::for_type(hooks, &request.api_version, &request.kind);
    if !hooks.handles(point) {
        return Ok(MutateResponse::default());
    }
    let original: Value =
        serde_json::from_str(&request.object).map_err(|source| MutateError::InvalidObject {
            kind: request.kind.clone(),
            source,
        })?;
    let mut typed = original.clone();
    let mut filled = Vec::new();
    if let Some(fields) = typed.as_object_mut() {
        for (key, value) in [
            ("apiVersion", &request.api_version),
            ("kind", &request.kind),
        ] {
            if !fields.contains_key(key) {
                fields.insert(key.into(), Value::String(value.clone()));
                filled.push((key, Value::String(value.clone())));
            }
        }
    }
    let mut mutated = hooks
        .apply(point, typed)
        .map_err(|source| MutateError::Hook {
            api_version: request.api_version.clone(),
            kind: request.kind.clone(),
            point: request.r#type.clone(),
            source: Box::new(source),
        })?;
    if let Some(fields) = mutated.as_object_mut() {
        for (key, value) in filled {
            if fields.get(key) == Some(&value) {
                fields.remove(key);
            }
        }
    }
    if mutated == original {
        return Ok(MutateResponse::default());
    }
    Ok(MutateResponse {
        object: mutated.to_string(),
        mutated: true,
    })
}

#[cfg(test)]
mod tests;
