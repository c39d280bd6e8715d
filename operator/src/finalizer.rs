//! The finalizer `vcp.dev/cleanup` ([`vcp_crds::FINALIZER`]; DESIGN.md, "Operator contract":
//! on delete, remove exactly what was added, then the finalizer).
//!
//! Both changes are JSON patches (RFC 6902) whose `test` operation fails when
//! `metadata.finalizers` changed since the plugin was read, so a concurrent change is never
//! overwritten and the finalizer is never added twice (the API server does not deduplicate).
//!
//! kube-runtime's `finalizer` helper is not used: it ends the reconcile that adds the finalizer
//! (`Action::await_change()`, installing only in the next one) and adds it only to the object
//! being reconciled, while [`crate::vcluster::install`] adds it and installs in the same reconcile, and
//! adds it to the sibling plugins of the vCluster too, so that the workload is applied once
//! with all of them (an apply body holds only plugins carrying the finalizer,
//! [`crate::workload::contributes`]); and where the helper fails the reconcile when its `test`
//! finds a stale copy, [`with_finalizer`] reads the plugin again. The patches themselves are
//! the helper's (`test` + `add`, `test` + `remove` at the finalizer's index).
//!
//! Answers are read tolerantly ([`crate::tolerant::decoded`]): a plugin whose status the
//! operator's types cannot read (issue 38) still gains and loses its finalizer, so its cleanup
//! runs.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;
use vcp_crds::tolerant::Tolerant;
use vcp_crds::{FINALIZER, VClusterPlugin};

use crate::context::Context;
use crate::error::{Error, Result};

/// `plugin` carrying [`FINALIZER`]: as it is when it does, else the answer to
/// [`add_finalizer`]. When that patch fails (its `test` found other finalizers than the copy
/// read: the copy was stale, or someone else changed them), the plugin is read again and
/// returned when it carries the finalizer by now.
///
/// # Errors
/// [`Error::Finalizer`] when the patch failed and the plugin still lacks the finalizer.
pub async fn with_finalizer(ctx: &Context, plugin: &VClusterPlugin) -> Result<VClusterPlugin> {
    if plugin.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(plugin.clone());
    }
    let namespace = plugin.namespace().unwrap_or_default();
    let api: Api<Tolerant<VClusterPlugin>> = Api::namespaced(ctx.client.clone(), &namespace);
    match add_finalizer(&api, plugin).await {
        Ok(p) => Ok(p),
        Err(e @ Error::Finalizer { .. }) => {
            let fresh = api.get_opt(&plugin.name_any()).await.map_err(|g| {
                Error::kube(
                    format!("get VClusterPlugin {namespace}/{}", plugin.name_any()),
                    g,
                )
            })?;
            let fresh = fresh
                .map(|f| crate::tolerant::decoded(f, "get"))
                .transpose()?;
            match fresh {
                Some(f) if f.finalizers().iter().any(|x| x == FINALIZER) => Ok(f),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Adds [`FINALIZER`] to `plugin` with a JSON patch whose `test` operation fails when
/// `metadata.finalizers` changed since `plugin` was read (finalizers are not deduplicated by
/// the API server). Returns the patched object.
///
/// # Errors
/// [`Error::Finalizer`]: the API server's answer (such as 422 when the test failed; the
/// reconcile is then retried from the watch event of that change).
pub async fn add_finalizer(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
) -> Result<VClusterPlugin> {
    let finalizers = plugin.finalizers();
    let ops = if finalizers.is_empty() {
        serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] },
        ])
    } else {
        serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": finalizers },
            { "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER },
        ])
    };
    finalizer_patch(api, plugin, "add", ops).await
}

/// Removes [`FINALIZER`] (at `index` of `metadata.finalizers`) from `plugin`; the `test`
/// operation makes the patch fail instead of removing another finalizer that moved there.
///
/// # Errors
/// [`Error::Finalizer`]: the API server's answer (404 is success: the object is gone).
pub async fn remove_finalizer(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
    index: usize,
) -> Result<()> {
    let path = format!("/metadata/finalizers/{index}");
    let ops = serde_json::json!([
        { "op": "test", "path": path, "value": FINALIZER },
        { "op": "remove", "path": path },
    ]);
    match finalizer_patch(api, plugin, "remove", ops).await {
        Err(Error::Finalizer {
            source: kube::Error::Api(s),
            ..
        }) if s.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Sends the JSON patch `ops` (RFC 6902) to `plugin`'s `metadata.finalizers`, in a span
/// with the write's `kind`, `object` and `action` ([`crate::trace`]).
#[tracing::instrument(skip_all, fields(kind = "VClusterPlugin", object = %crate::trace::Key::of(plugin), action))]
async fn finalizer_patch(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
    action: &'static str,
    ops: Value,
) -> Result<VClusterPlugin> {
    let name = plugin.name_any();
    let object = format!("{}/{name}", plugin.namespace().unwrap_or_default());
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| Error::Finalizer {
        action,
        object: object.clone(),
        source: kube::Error::SerdeError(e),
    })?;
    let answer = api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| Error::Finalizer {
            action,
            object,
            source,
        })?;
    crate::tolerant::decoded(
        answer,
        if action == "add" {
            "add finalizer"
        } else {
            "remove finalizer"
        },
    )
}
