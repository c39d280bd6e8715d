//! vCluster-compatible translation of virtual objects into host objects (pure functions).
//!
//! Host objects must look exactly as if vCluster's own syncer had made them. This module reproduces
//! vCluster v0.30's single-namespace translation (`pkg/util/translate`: `HostMetadata`,
//! `HostLabels`, `HostAnnotations`), and `tests/tests/oracle_translate.rs` proves it against that
//! code on generated cases:
//!
//! - name: [`host_name`] = [`safe_concat_name`] of `<name>`, `x`, `<namespace>`, `x`, `<vcluster>`;
//! - labels: the virtual labels, except that the keys vCluster translates ([`TRANSLATED_LABELS`]:
//!   `release`, `vcluster.loft.sh/namespace`, `vcluster.loft.sh/managed-by`,
//!   `vcluster.loft.sh/controlled-by`) become [`host_label`] keys
//!   (`vcluster.loft.sh/label-<vcluster>-x-<10 hex of sha256(key)>`) and virtual labels that
//!   already look like such a key are dropped; plus [`MANAGED_BY_LABEL`]`=<vcluster>` and
//!   [`NAMESPACE_LABEL`]`=<virtual namespace>`;
//! - annotations: the virtual annotations, plus [`NAME_ANNOTATION`], [`NAMESPACE_ANNOTATION`],
//!   [`UID_ANNOTATION`], [`KIND_ANNOTATION`], [`HOST_NAME_ANNOTATION`],
//!   [`HOST_NAMESPACE_ANNOTATION`], and [`MANAGED_ANNOTATIONS_ANNOTATION`] (the sorted,
//!   newline-joined annotation keys that came from the virtual object), so that an update
//!   removes on the host exactly the annotations removed in the virtual cluster and keeps those
//!   added on the host. Like vCluster's create path, no [`MANAGED_LABELS_ANNOTATION`] is
//!   written: which labels came from the virtual object is read on update from the host
//!   object's `managedFields` (the labels the runtime's field manager wrote; see
//!   [`NamespacedTranslator::translate_metadata_update`]);
//! - owner: with the uid of the vCluster's Service known ([`NamespacedTranslator::with_owner_uid`]),
//!   one ownerReference to it, as vCluster sets with `experimental.syncSettings.setOwner` (its
//!   default), so deleting the vCluster garbage-collects its host copies;
//! - stripped: the server-owned metadata fields listed in [`NamespacedTranslator::translate_metadata`].
//!
//! The other direction (`FromHost`, host objects copied into the virtual cluster under the same
//! name) is [`FromHostTranslator`].
//!
//! Nothing here talks to an API server; the syncers in [`crate::syncer`] and
//! [`crate::from_host`] use these functions.
//!
//! One concern a submodule, all re-exported here: names and marks (`names`), what of an
//! object is kept and copied (`fields`), `ToHost` (`to_host`), `FromHost` (`from_host`).

mod fields;
mod from_host;
mod mappings;
mod names;
mod to_host;

pub use fields::copy_content;
pub use fields::{runtime_owned_labels, slim_for_cache};
pub use from_host::FromHostTranslator;
pub use mappings::{FromHostMapping, MappingError};
pub use names::{
    CONTROLLED_BY_LABEL, HOST_NAME_ANNOTATION, HOST_NAMESPACE_ANNOTATION, KIND_ANNOTATION,
    LABEL_PREFIX, MANAGED_ANNOTATIONS_ANNOTATION, MANAGED_BY_LABEL, MANAGED_LABELS_ANNOTATION,
    MAX_NAME_LENGTH, NAME_ANNOTATION, NAMESPACE_ANNOTATION, NAMESPACE_LABEL,
    PRODUCED_FOR_ANNOTATION, PRODUCED_PATH_ANNOTATION, RELEASE_LABEL, TRANSLATED_LABELS,
    UID_ANNOTATION, host_label, host_name, is_managed_by, object_kind, safe_concat_name,
};
pub use to_host::{MetadataUpdate, NamespacedTranslator};

#[cfg(test)]
mod tests;
