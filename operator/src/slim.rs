//! Memory bounded per tenant: a refused plugin does not stay in the
//! operator's plugins cache in full. [`slim`] drops its free-form parts from the operator's
//! in-memory copy once they are judged, and keeps what judging and reporting still need.
//!
//! Why: a tenant could create plugins of about 1.2 MB each, with a wide `spec.config`. Each was
//! refused as `TooLarge` but stayed in the watch cache in full, parsed into a JSON tree several
//! times larger than its text. With 64 of them the operator grew from 28 MB to 290 MB, above
//! the 256 Mi limit of `config/manager/manager.yaml`. It was OOM-killed, then crash-looped,
//! because every re-list brought them all back.
//!
//! **What is dropped:** `spec.config`, which becomes env `PLUGIN_CONFIG` of a v1 sidecar, and
//! the `value` of every `spec.hooks[*].jsonPatch[*]`. Both are free-form JSON of any width. The
//! rest of the spec stays: names, image, env, syncedTypes, hooks' kinds and paths, RBAC. Those
//! are bounded by the CRD, and the steps that refuse a plugin before the dry runs read them.
//!
//! **Where:** in the plugins' watch stream, before the reflector stores an object
//! (`.modify(...)` in [`crate::controller`]). Every copy in the cache is slimmed this way,
//! including the pages of a re-list buffered until the list is complete. A refused plugin's
//! full text therefore never piles up. Nothing is written to the API server. The user's object
//! keeps its spec, and the copy is changed in the operator's memory only.
//!
//! **When** ([`Why`]): a plugin with at least [`MIN_DROPPED`] bytes to drop is slimmed when
//! - its own status says the operator refused it for its current spec
//!   ([`Why::Refused`]: `WorkloadPatched=False` with `observedGeneration` equal to
//!   `metadata.generation`). The operator writes that status after it judged the full spec, and
//!   the watch event of that write is where the copy is slimmed. Or:
//! - the size rule refuses it for certain ([`Why::TooLarge`]): the bytes `spec.config` alone
//!   adds to the plugin's part of the workload exceed
//!   [`PART_BUDGET`](crate::workload::budget::PART_BUDGET). This is the budget's own per-plugin
//!   rule, applied to a lower bound of the part. Such a plugin is refused in any vCluster, so it
//!   is slimmed at first sight, before any reconcile. Its refusal is `TooLarge`, or an earlier
//!   reason such as `PolicyDenied`.
//!
//! A spec changed since the refusal (a new `metadata.generation`, such as a smaller config)
//! arrives in full. It is not slimmed until the operator refused it again, so it is judged on
//! its full new spec.
//!
//! **How a slimmed copy is still judged and reported:** the copy carries an in-memory marker,
//! the annotation [`MARKER`] ([`Dropped`]). The marker holds:
//! - the bytes the dropped parts added to the plugin's part of its workload ([`Dropped::part_bytes`]).
//!   [`crate::workload::budget::part_size`] adds them back, so a slimmed copy has the same
//!   size, the same `TooLarge` verdict and the same message as the full one;
//! - the bytes and a SHA-256 of the dropped JSON, so a change of config is still a change of
//!   the cached copy.
//!
//! The steps before the dry runs (policy, cluster facts, size budgets) read nothing that was
//! dropped. So a slimmed copy gets the same verdict as the full one, and the status needs no
//! config. A slimmed copy is never installed and never dry-run. When a plugin of a vCluster is
//! let through to the dry runs while only its slimmed copy is cached (a conflict or a
//! neighbour's size refusal lifted), [`crate::vcluster::observe::vcluster`] reads it in full
//! from the API server ([`is_slimmed`]) and judges that copy.
//!
//! The marker's key is not a valid annotation key (`:` in its name part), so the API server
//! never returns one and never accepts one. A user cannot forge the marker, and a write of a
//! slimmed copy back to the API server would fail instead of dropping the user's config.
//! [`slim`] leaves a copy that already carries it as it is (the cache's own copies pass through
//! it again as the answers of the finalizer patches, [`crate::vcluster`]).

use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use vcp_crds::VClusterPlugin;

use crate::status::WORKLOAD_PATCHED;
use crate::workload::budget::{PART_BUDGET, part_size};
use crate::workload::{SYNCER_CONTAINER, Workload};

pub mod marker;
pub use marker::{Dropped, MARKER, Why, dropped, is_slimmed};

/// The least number of free-form bytes worth dropping (16 KiB of JSON). A smaller config
/// costs less than its marker and its judging.
pub const MIN_DROPPED: usize = 16 * 1024;

/// Slims `plugin`, a copy entering the operator's plugins cache (module docs). A copy already
/// slimmed is left as it is. Otherwise, when the plugin is refused ([`Why`]) and has at least [`MIN_DROPPED`]
/// bytes of free-form JSON, it drops `spec.config` and the hooks' `jsonPatch` values and marks
/// the copy with a [`Dropped`]. Returns what it dropped.
///
/// `runtime_image` is the operator's `--runtime-image`; the part sizes are measured with it, as
/// the budget measures them.
pub fn slim(plugin: &mut VClusterPlugin, runtime_image: &str) -> Option<Dropped> {
    // already slimmed (a copy from the cache): it stays as it is, marker included
    if is_slimmed(plugin) {
        return None;
    }
    let parts = free_form(plugin);
    let bytes = parts.to_string().len();
    if bytes < MIN_DROPPED {
        return None;
    }
    let refused = refused_now(plugin);
    // the lean copy without a clone of the free-form parts (the point is not to hold them twice)
    let config = plugin.spec.config.take();
    let mut lean = plugin.clone();
    plugin.spec.config = config;
    drop_free_form(&mut lean);
    let part_bytes = dropped_part_bytes(plugin, &lean, runtime_image)?;
    let why = if refused {
        Why::Refused
    } else if part_bytes > PART_BUDGET {
        Why::TooLarge
    } else {
        return None;
    };
    let dropped = Dropped {
        part_bytes,
        bytes,
        sha256: hex(&Sha256::digest(parts.to_string().as_bytes())),
        why,
    };
    lean.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            MARKER.into(),
            serde_json::to_string(&dropped).unwrap_or_default(),
        );
    *plugin = lean;
    Some(dropped)
}

/// Whether the plugin's status says the operator refused its current spec: the condition
/// `WorkloadPatched` is `False`, observed at `metadata.generation`, as is the whole status. The
/// operator writes this after judging the full spec, with any refusal reason, `VClusterNotFound`
/// included. A copy slimmed on a forged status is still read in full before it is installed
/// ([`is_slimmed`]).
pub fn refused_now(plugin: &VClusterPlugin) -> bool {
    let generation = plugin.metadata.generation;
    plugin.status.as_ref().is_some_and(|s| {
        s.observed_generation == generation
            && s.conditions.iter().any(|c| {
                c.type_ == WORKLOAD_PATCHED
                    && c.status == "False"
                    && c.observed_generation == generation
            })
    })
}

/// The free-form parts [`slim`] drops, as one JSON value: `[config, [hook values...]]`.
fn free_form(plugin: &VClusterPlugin) -> serde_json::Value {
    let values: Vec<&serde_json::Value> = plugin
        .spec
        .hooks
        .iter()
        .flat_map(|h| h.json_patch.iter())
        .filter_map(|op| op.value.as_ref())
        .collect();
    serde_json::json!([plugin.spec.config, values])
}

/// Drops `spec.config` and every hook's `jsonPatch[*].value`.
fn drop_free_form(plugin: &mut VClusterPlugin) {
    plugin.spec.config = None;
    for op in plugin
        .spec
        .hooks
        .iter_mut()
        .flat_map(|h| h.json_patch.iter_mut())
    {
        op.value = None;
    }
}

/// Bytes the dropped parts add to the plugin's part of a workload: its part in a minimal
/// vCluster ([`probe_workload`]), full and lean. The difference is the same in every
/// workload, because the dropped entry sits inside the plugin's own container (unit-tested).
/// `None` when the probe's plan refuses the plugin (such as a plugin named `syncer`), which is
/// then not slimmed.
fn dropped_part_bytes(full: &VClusterPlugin, lean: &VClusterPlugin, image: &str) -> Option<usize> {
    let wl = probe_workload(full);
    let (full_part, lean_part) = (part_size(&wl, full, image), part_size(&wl, lean, image));
    (full_part > 0).then(|| full_part.saturating_sub(lean_part))
}

/// A minimal vCluster in the plugin's namespace, named after its `spec.vcluster`: the
/// vCluster's labels, its service account and the `syncer` container.
fn probe_workload(plugin: &VClusterPlugin) -> Workload {
    let name = plugin.spec.vcluster.name.clone();
    let labels = BTreeMap::from([
        ("app".to_string(), "vcluster".to_string()),
        ("release".to_string(), name.clone()),
    ]);
    Workload {
        namespace: plugin.namespace().unwrap_or_default(),
        labels: labels.clone(),
        template_labels: labels,
        pod_spec: PodSpec {
            service_account_name: Some(format!("vc-{name}")),
            containers: vec![Container {
                name: SYNCER_CONTAINER.into(),
                image: Some("syncer".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
        name,
        ..Default::default()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[path = "slim/tests.rs"]
mod tests;
