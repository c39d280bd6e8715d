//! The in-memory marker of a copy slimmed in the operator's plugins cache ([`super::slim`]):
//! the annotation [`MARKER`], whose value is a [`Dropped`] as JSON.
//!
//! [`super::slim`] writes it. The size budget reads it
//! ([`crate::workload::budget::part_size`] adds [`Dropped::part_bytes`] back, so a slimmed copy
//! has the full one's size and verdict), and the observe step reads it ([`is_slimmed`]: such a
//! copy is read in full before it is installed or dry-run). It stands in its own module so that
//! the budget reads it without depending on the slimming, which itself applies the budget.

use serde::{Deserialize, Serialize};
use vcp_crds::VClusterPlugin;

/// The in-memory annotation of a slimmed copy. Its value is a [`Dropped`] as JSON. It is not a
/// valid annotation key, so the API server never holds it ([`crate::slim`]).
pub const MARKER: &str = "vcp.dev/dropped:in-memory-only";

/// What [`slim`](super::slim) dropped from a copy, kept in its [`MARKER`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dropped {
    /// Bytes of JSON the dropped parts added to the plugin's part of its workload: the
    /// `PLUGIN_CONFIG` env entry and its field set ([`crate::workload::budget`]). 0 when the
    /// plugin's containers do not carry its config (not a v1 sidecar).
    pub part_bytes: usize,
    /// Bytes of JSON of the dropped parts.
    pub bytes: usize,
    /// SHA-256 of the dropped parts' JSON, hex.
    pub sha256: String,
    /// Why it was dropped.
    pub why: Why,
}

/// Why [`slim`](super::slim) dropped a copy's free-form parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Why {
    /// The plugin's status says the operator refused its current spec.
    Refused,
    /// Its config alone makes its part larger than the per-plugin budget: refused for certain.
    TooLarge,
}

/// What [`slim`](super::slim) dropped from `plugin`: `None` for a full copy.
pub fn dropped(plugin: &VClusterPlugin) -> Option<Dropped> {
    let value = plugin.metadata.annotations.as_ref()?.get(MARKER)?;
    serde_json::from_str(value).ok()
}

/// Whether `plugin` is a slimmed copy ([`slim`](super::slim)). It must then not be installed or
/// dry-run: read it in full first.
pub fn is_slimmed(plugin: &VClusterPlugin) -> bool {
    plugin
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MARKER))
}
