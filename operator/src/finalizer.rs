//! The finalizer `vcp.dev/cleanup` ([`vcp_crds::FINALIZER`]; the rule: on delete, remove
//! exactly what was added, then the finalizer).
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
//! **Answers are metadata only** (they were the peak of the operator's memory). The
//! patches ask for `PartialObjectMetadata` ([`crate::answer`]), and only `uid`,
//! `resourceVersion`, `generation`, `finalizers` and whether a deletion started are decoded
//! from it. A plugin's full answer was its whole spec, up to the API server's 1.5 MiB request
//! limit, parsed into a JSON tree several times larger; a reconcile finalizing the 64 siblings
//! of a tenant's flood held 64 of them at once (a peak of about 800 MiB for a flood of 1.2 MB
//! plugins, against the manifest's 256 Mi limit). The copy [`with_finalizer`] returns is the
//! one it was given (the watch cache's, slimmed, [`crate::slim`]) carrying the answer's
//! finalizers and `resourceVersion`, when the answer shows the same object at the same
//! `generation` (the same spec); otherwise the plugin is read again in full, as when the
//! patch's `test` fails.
//!
//! Full reads are tolerant ([`crate::tolerant::decoded`]): a plugin whose status the
//! operator's types cannot read still gains and loses its finalizer, so its cleanup
//! runs.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use crate::answer::Metadata;
use vcp_crds::tolerant::Tolerant;
use vcp_crds::{FINALIZER, VClusterPlugin};

use crate::context::Context;
use crate::error::{Error, Result};

/// `plugin` carrying [`FINALIZER`]: as it is when it does, else `plugin` with the finalizers
/// and `resourceVersion` of the answer to [`add_finalizer`] (module docs: the answer is
/// metadata only), when that answer shows the same object (`uid`) at the same `generation`,
/// not being deleted. When the patch failed (its `test` found other finalizers than the copy
/// read: the copy was stale, or someone else changed them), the plugin's metadata are read
/// again, and `plugin` is returned with them in the same case. Otherwise the plugin is read
/// again in full and returned when it carries the finalizer by now.
///
/// # Errors
/// [`Error::Finalizer`] when the patch failed and the plugin still lacks the finalizer;
/// [`Error::FinalizerLost`] when the patch succeeded but the plugin read again lacks it (or is
/// gone); [`Error::Kube`] when that read fails.
pub async fn with_finalizer(ctx: &Context, plugin: &VClusterPlugin) -> Result<VClusterPlugin> {
    if plugin.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(plugin.clone());
    }
    let namespace = plugin.namespace().unwrap_or_default();
    let api: Api<Tolerant<VClusterPlugin>> = Api::namespaced(ctx.client.clone(), &namespace);
    let failed = match add_finalizer(&api, plugin).await {
        Ok(answer) => match answer.applied_to(plugin) {
            Some(copy) => return Ok(copy),
            None => None,
        },
        Err(e @ Error::Finalizer { .. }) => {
            // Most often the copy was stale because the watch cache had not yet shown the
            // finalizer another reconcile added: the metadata tell, without the spec.
            let read = get_metadata(&api, plugin).await?;
            if let Some(copy) = read.as_ref().and_then(|m| m.applied_to(plugin)) {
                return Ok(copy);
            }
            Some(e)
        }
        Err(e) => return Err(e),
    };
    let get_error = |g| {
        Error::kube(
            format!("get VClusterPlugin {namespace}/{}", plugin.name_any()),
            g,
        )
    };
    let fresh = api.get_opt(&plugin.name_any()).await.map_err(get_error)?;
    let fresh = fresh
        .map(|f| crate::tolerant::decoded(f, "get"))
        .transpose()?;
    match (fresh, failed) {
        (Some(f), _) if f.finalizers().iter().any(|x| x == FINALIZER) => Ok(f),
        (_, Some(e)) => Err(e),
        (_, None) => Err(Error::FinalizerLost {
            object: format!("{namespace}/{}", plugin.name_any()),
        }),
    }
}

/// The metadata of `plugin` as the API server has it now ([`Metadata`], read without its
/// spec); `None` when it is gone.
///
/// # Errors
/// [`Error::Kube`]: the API server's answer, other than 404.
async fn get_metadata(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
) -> Result<Option<Metadata>> {
    let name = plugin.name_any();
    let error = |e| {
        Error::kube(
            format!(
                "get the metadata of VClusterPlugin {}/{name}",
                plugin.namespace().unwrap_or_default()
            ),
            e,
        )
    };
    let request = kube::core::Request::new(api.resource_url())
        .get_metadata(&name, &kube::api::GetParams::default())
        .map_err(|e| error(kube::Error::BuildRequest(e)))?;
    match api.clone().into_client().request::<Metadata>(request).await {
        Ok(m) => Ok(Some(m)),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(None),
        Err(e) => Err(error(e)),
    }
}

/// Adds [`FINALIZER`] to `plugin` with a JSON patch whose `test` operation fails when
/// `metadata.finalizers` changed since `plugin` was read (finalizers are not deduplicated by
/// the API server). Returns the patched object's metadata ([`Metadata`]).
///
/// # Errors
/// [`Error::Finalizer`]: the API server's answer (such as 422 when the test failed; the
/// reconcile is then retried from the watch event of that change).
pub async fn add_finalizer(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
) -> Result<Metadata> {
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

/// Sends the JSON patch `ops` (RFC 6902) to `plugin`'s `metadata.finalizers`, asking for the
/// answer's metadata only ([`crate::answer`]), in a span with the write's `kind`, `object` and
/// `action` ([`crate::trace`]).
#[tracing::instrument(skip_all, fields(kind = "VClusterPlugin", object = %crate::trace::Key::of(plugin), action))]
async fn finalizer_patch(
    api: &Api<Tolerant<VClusterPlugin>>,
    plugin: &VClusterPlugin,
    action: &'static str,
    ops: Value,
) -> Result<Metadata> {
    let name = plugin.name_any();
    let object = format!("{}/{name}", plugin.namespace().unwrap_or_default());
    let error = |source| Error::Finalizer {
        action,
        object: object.clone(),
        source,
    };
    let patch: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| error(kube::Error::SerdeError(e)))?;
    let request = kube::core::Request::new(api.resource_url())
        .patch_metadata(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .map_err(|e| error(kube::Error::BuildRequest(e)))?;
    api.clone()
        .into_client()
        .request::<Metadata>(request)
        .await
        .map_err(error)
}
