//! vCluster-compatible translation of virtual objects into host objects (pure functions).
//!
//! Host objects must look exactly as if vCluster's own syncer had made them (`shared/DESIGN.md`,
//! "Runtime contract"). This module reproduces vCluster v0.30's single-namespace translation
//! (`pkg/util/translate`: `HostMetadata`, `HostLabels`, `HostAnnotations`), and
//! `tests/tests/translate_oracle.rs` proves it against that code on generated cases:
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

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference,
};
use kube::ResourceExt;
use kube::api::{DynamicObject, TypeMeta};
use sha2::{Digest, Sha256};
use vcp_crds::RUNTIME_FIELD_MANAGER;

/// Label with the name of the vCluster that manages a host object (vCluster's `MarkerLabel`).
pub const MANAGED_BY_LABEL: &str = "vcluster.loft.sh/managed-by";
/// Label with the virtual namespace of the object a host object was made from.
pub const NAMESPACE_LABEL: &str = "vcluster.loft.sh/namespace";
/// Label vCluster copies from an existing host object onto its update (vCluster's
/// `ControllerLabel`); a virtual label of this key is translated ([`host_label`]).
pub const CONTROLLED_BY_LABEL: &str = "vcluster.loft.sh/controlled-by";
/// The Helm release label; a virtual label of this key is translated ([`host_label`]) so that a
/// tenant's `release` never collides with the host's own Helm release label.
pub const RELEASE_LABEL: &str = "release";
/// Prefix of the host keys of translated labels (vCluster's `LabelPrefix`).
pub const LABEL_PREFIX: &str = "vcluster.loft.sh/label";
/// The virtual label keys vCluster never copies as they are: each becomes [`host_label`] on the
/// host (the single-namespace translator's `LabelsToTranslate`).
pub const TRANSLATED_LABELS: [&str; 4] = [
    RELEASE_LABEL,
    NAMESPACE_LABEL,
    MANAGED_BY_LABEL,
    CONTROLLED_BY_LABEL,
];
/// Annotation with the virtual object's name.
pub const NAME_ANNOTATION: &str = "vcluster.loft.sh/object-name";
/// Annotation with the virtual object's namespace (absent for cluster-scoped objects).
pub const NAMESPACE_ANNOTATION: &str = "vcluster.loft.sh/object-namespace";
/// Annotation with the virtual object's `metadata.uid`.
pub const UID_ANNOTATION: &str = "vcluster.loft.sh/object-uid";
/// Annotation with the virtual object's kind, formatted by [`object_kind`].
pub const KIND_ANNOTATION: &str = "vcluster.loft.sh/object-kind";
/// Annotation with the host object's own name.
pub const HOST_NAME_ANNOTATION: &str = "vcluster.loft.sh/object-host-name";
/// Annotation with the host object's own namespace.
pub const HOST_NAMESPACE_ANNOTATION: &str = "vcluster.loft.sh/object-host-namespace";
/// Annotation listing label keys copied from the virtual object (sorted, `\n`-joined). vCluster
/// writes it only for nodes, and neither does the runtime: it is never computed here, only
/// passed through like vCluster's `HostAnnotations` does (from the virtual object on create,
/// from the host object on update), and, on host copies an older runtime made, read as the
/// labels that came from the virtual object.
pub const MANAGED_LABELS_ANNOTATION: &str = "vcluster.loft.sh/managed-labels";
/// Annotation listing the annotation keys copied from the virtual object (sorted, `\n`-joined).
pub const MANAGED_ANNOTATIONS_ANNOTATION: &str = "vcluster.loft.sh/managed-annotations";

/// Maximum length of a Kubernetes object name that is also a DNS label (RFC 1123).
pub const MAX_NAME_LENGTH: usize = 63;

/// Characters of the joined name kept before the hash when a name is too long.
const TRUNCATED_PREFIX: usize = 52;

/// Hex characters of the sha256 digest appended to a truncated name.
const HASH_HEX_CHARS: usize = 10;

/// Annotations vCluster's `HostAnnotations` excludes from the managed keys: never taken from the
/// virtual object's side of the merge, kept from the object merged into, and (except the two
/// bookkeeping keys) always recomputed.
const RESERVED_ANNOTATIONS: [&str; 8] = [
    NAME_ANNOTATION,
    NAMESPACE_ANNOTATION,
    UID_ANNOTATION,
    KIND_ANNOTATION,
    HOST_NAME_ANNOTATION,
    HOST_NAMESPACE_ANNOTATION,
    MANAGED_LABELS_ANNOTATION,
    MANAGED_ANNOTATIONS_ANNOTATION,
];

/// Drops from `meta` what no sync decision reads, before an object is kept in a watch cache:
/// `managedFields` (the API server's field-ownership bookkeeping: on a host copy, one entry
/// per field manager listing every label, annotation and spec field, often larger than the
/// rest of the object), except the one fact an update needs from it: which label keys the
/// runtime's field manager ([`RUNTIME_FIELD_MANAGER`]) wrote. Those are kept as a single
/// entry of that manager holding only `f:metadata.f:labels` ([`runtime_owned_labels`] reads it
/// back the same way as from the full list); no entry is kept when it owns no label.
///
/// Everything else is kept: labels and annotations (translated, and the managed-keys
/// bookkeeping), `uid` / `resourceVersion` (delete preconditions, optimistic concurrency),
/// `deletionTimestamp` (lifecycle) and the whole body (drift detection, `syncStatus`).
pub fn slim_for_cache(meta: &mut ObjectMeta) {
    let owned = runtime_owned_labels(meta);
    meta.managed_fields = (!owned.is_empty()).then(|| {
        let labels: serde_json::Map<String, serde_json::Value> = owned
            .into_iter()
            .map(|key| (format!("f:{key}"), serde_json::json!({})))
            .collect();
        vec![ManagedFieldsEntry {
            manager: Some(RUNTIME_FIELD_MANAGER.into()),
            operation: Some("Update".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(
                serde_json::json!({"f:metadata": {"f:labels": labels}}),
            )),
            ..ManagedFieldsEntry::default()
        }]
    });
}

/// The label keys that the runtime's field manager ([`RUNTIME_FIELD_MANAGER`]) set on the
/// object and still owns, read from `managedFields` (any operation, the main resource only):
/// the labels it copied from a virtual object. A label someone else added on the host is
/// owned by that client's manager instead; a label the runtime removed is owned by nobody.
pub fn runtime_owned_labels(meta: &ObjectMeta) -> Vec<String> {
    let mut keys = Vec::new();
    for entry in meta.managed_fields.iter().flatten() {
        if entry.manager.as_deref() != Some(RUNTIME_FIELD_MANAGER)
            || entry.subresource.as_deref().is_some_and(|s| !s.is_empty())
        {
            continue;
        }
        let labels = entry
            .fields_v1
            .as_ref()
            .and_then(|fields| fields.0.get("f:metadata"))
            .and_then(|metadata| metadata.get("f:labels"))
            .and_then(serde_json::Value::as_object);
        for field in labels.into_iter().flat_map(|labels| labels.keys()) {
            if let Some(key) = field.strip_prefix("f:")
                && !keys.iter().any(|k| k == key)
            {
                keys.push(key.to_string());
            }
        }
    }
    keys
}

/// Joins `parts` with `-`; a result longer than 63 bytes becomes its first 52 bytes, `-`, and
/// the first 10 hex characters of the sha256 of the full joined string, and then every `.-` in
/// it becomes `-` (a cut right after a dot would otherwise leave an invalid name).
///
/// Reproduces vCluster's `translate.SafeConcatName`, including that the `.-` replacement only
/// happens on the truncated branch (a valid DNS-1123 name never contains `.-`, so a short
/// joined name of valid parts never needs it). Lengths are in bytes, as in Go; Kubernetes names
/// are ASCII.
pub fn safe_concat_name(parts: &[&str]) -> String {
    let full = parts.join("-");
    if full.len() <= MAX_NAME_LENGTH {
        return full;
    }
    let digest = hex(&Sha256::digest(full.as_bytes()));
    let prefix = full.get(..TRUNCATED_PREFIX).unwrap_or(&full);
    format!("{prefix}-{}", &digest[..HASH_HEX_CHARS]).replace(".-", "-")
}

/// The host name of the virtual object `name` in virtual namespace `namespace` of vCluster
/// `vcluster`: `<name>-x-<namespace>-x-<vcluster>`, shortened by [`safe_concat_name`].
///
/// Reproduces vCluster's single-namespace `PhysicalName` / `HostName`. An empty `name` maps to
/// an empty string, as in vCluster.
pub fn host_name(name: &str, namespace: &str, vcluster: &str) -> String {
    if name.is_empty() {
        return String::new();
    }
    safe_concat_name(&[name, "x", namespace, "x", vcluster])
}

/// The host key of the virtual label `key` in vCluster `vcluster` (vCluster's `HostLabel`): the
/// keys of [`TRANSLATED_LABELS`] become [`safe_concat_name`] of [`LABEL_PREFIX`], `vcluster`,
/// `x` and the first 10 hex characters of sha256(`key`) — `release` in vCluster `vc` becomes
/// `vcluster.loft.sh/label-vc-x-a4d451ec23`; every other key is kept as it is.
pub fn host_label(key: &str, vcluster: &str) -> String {
    if TRANSLATED_LABELS.contains(&key) {
        let digest = hex(&Sha256::digest(key.as_bytes()));
        safe_concat_name(&[LABEL_PREFIX, vcluster, "x", &digest[..HASH_HEX_CHARS]])
    } else {
        key.to_string()
    }
}

/// Whether `ownerReferences` name a controller (Kubernetes' `metav1.GetControllerOf`).
fn has_controller(owners: Option<&Vec<OwnerReference>>) -> bool {
    owners
        .into_iter()
        .flatten()
        .any(|owner| owner.controller == Some(true))
}

/// The value of [`KIND_ANNOTATION`] for `api_version` (`group/version`, or `version` for the
/// core group) and `kind`: Go's `schema.GroupVersionKind.String()`, i.e.
/// `<group>/<version>, Kind=<Kind>` — `example.loft.sh/v1, Kind=Car`, and `/v1, Kind=Pod` for
/// the core group (the group is empty, the slash stays).
pub fn object_kind(api_version: &str, kind: &str) -> String {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    format!("{group}/{version}, Kind={kind}")
}

/// Whether `host` carries [`MANAGED_BY_LABEL`]`=<vcluster>`, i.e. claims to be made by the
/// vCluster `vcluster` (of any kind and from any virtual object).
pub fn is_managed_by(host: &ObjectMeta, vcluster: &str) -> bool {
    host.labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL))
        .is_some_and(|value| value == vcluster)
}

/// Lower-case hex encoding.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// New labels or annotations for an existing host object, returned by
/// [`NamespacedTranslator::translate_metadata_update`] when they differ from the host's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataUpdate {
    /// The complete new `metadata.labels` of the host object.
    pub labels: BTreeMap<String, String>,
    /// The complete new `metadata.annotations` of the host object.
    pub annotations: BTreeMap<String, String>,
}

/// Where virtual objects of one namespaced type go on the host: vCluster `vcluster` syncing
/// into host namespace `host_namespace`, objects of `api_version` / `kind`.
///
/// Mirrors the vcluster-sdk's `NamespacedTranslator` (`TranslateMetadata`,
/// `TranslateMetadataUpdate`) for the single-namespace mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespacedTranslator {
    vcluster: String,
    host_namespace: String,
    api_version: String,
    kind: String,
    /// The [`host_label`] keys of [`TRANSLATED_LABELS`] in this vCluster (computed once).
    translated_keys: Vec<String>,
    /// uid of the vCluster's Service (`<vcluster>` in the host namespace), the owner of every
    /// host copy; `None`: no ownerReference is set.
    owner_uid: Option<String>,
}

impl NamespacedTranslator {
    /// A translator for objects of `api_version` (`group/version`, `v1` for the core group) and
    /// `kind`, synced by vCluster `vcluster` into host namespace `host_namespace`.
    pub fn new(
        vcluster: impl Into<String>,
        host_namespace: impl Into<String>,
        api_version: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        let vcluster = vcluster.into();
        let translated_keys = TRANSLATED_LABELS
            .iter()
            .map(|key| host_label(key, &vcluster))
            .collect();
        Self {
            vcluster,
            host_namespace: host_namespace.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            translated_keys,
            owner_uid: None,
        }
    }

    /// This translator with the vCluster's Service (named like the vCluster, in the host
    /// namespace) of uid `uid` as the owner of every host copy it makes: vCluster's
    /// `translate.Owner`, set at start-up when `experimental.syncSettings.setOwner` is on (its
    /// default). `None` (or an empty uid): no ownerReference, as in vCluster without an owner.
    pub fn with_owner_uid(mut self, uid: Option<String>) -> Self {
        self.owner_uid = uid.filter(|uid| !uid.is_empty());
        self
    }

    /// uid of the owner Service set by [`Self::with_owner_uid`].
    pub fn owner_uid(&self) -> Option<&str> {
        self.owner_uid.as_deref()
    }

    /// The ownerReferences of a new host copy of an object whose own ownerReferences are
    /// `virtual_owners` (vCluster's `GetOwnerReference`): one reference to the vCluster's
    /// Service — `apiVersion: v1`, `kind: Service`, its name and uid, `controller` true exactly
    /// when the virtual object has a controller, no `blockOwnerDeletion` — or `None` without an
    /// owner uid.
    pub fn owner_references(
        &self,
        virtual_owners: Option<&Vec<OwnerReference>>,
    ) -> Option<Vec<OwnerReference>> {
        let uid = self.owner_uid.clone()?;
        Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name: self.vcluster.clone(),
            uid,
            controller: Some(has_controller(virtual_owners)),
            block_owner_deletion: None,
        }])
    }

    /// The vCluster name (value of [`MANAGED_BY_LABEL`]).
    pub fn vcluster(&self) -> &str {
        &self.vcluster
    }

    /// The host namespace all objects are synced into.
    pub fn host_namespace(&self) -> &str {
        &self.host_namespace
    }

    /// `group/version` of the translated type.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Kind of the translated type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// [`host_name`] of a virtual object of this translator's vCluster.
    pub fn host_name(&self, name: &str, namespace: &str) -> String {
        host_name(name, namespace, &self.vcluster)
    }

    /// Host metadata for a new host copy of `virtual_meta` (vCluster's `HostMetadata` /
    /// `TranslateMetadata`): name and namespace translated; labels and annotations as described
    /// in the module docs; `generateName`, `selfLink`, `uid`, `resourceVersion`, `generation`,
    /// `creationTimestamp`, `deletionTimestamp`, `deletionGracePeriodSeconds`, `finalizers` and
    /// `managedFields` stripped; `ownerReferences` replaced by [`Self::owner_references`].
    pub fn translate_metadata(&self, virtual_meta: &ObjectMeta) -> ObjectMeta {
        let name = self.host_name(
            virtual_meta.name.as_deref().unwrap_or_default(),
            virtual_meta.namespace.as_deref().unwrap_or_default(),
        );
        let labels = self.host_labels(virtual_meta, None);
        let virtual_annotations = virtual_meta.annotations.clone().unwrap_or_default();
        let annotations = self.host_annotations(virtual_meta, &name, &virtual_annotations);
        let owner_references = self.owner_references(virtual_meta.owner_references.as_ref());
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.host_namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            generate_name: None,
            self_link: None,
            uid: None,
            resource_version: None,
            generation: None,
            creation_timestamp: None,
            deletion_timestamp: None,
            deletion_grace_period_seconds: None,
            owner_references,
            finalizers: None,
            managed_fields: None,
        }
    }

    /// The labels and annotations the existing host object `host_meta` must have for the
    /// virtual object `virtual_meta`, or `None` when it already has exactly those (no write is
    /// needed).
    ///
    /// Annotations: vCluster's `HostAnnotations(vObj, pObj)` — the virtual annotations, the
    /// host's annotations that are not listed in its [`MANAGED_ANNOTATIONS_ANNOTATION`] (added
    /// on the host, kept), the bookkeeping keys passed through from the host, and the
    /// translation's own annotations recomputed. Labels: the labels of a new copy
    /// ([`Self::translate_metadata`]), [`CONTROLLED_BY_LABEL`] kept from the host (as vCluster's
    /// `HostLabels(vObj, pObj)` does), and every other host label kept unless the runtime
    /// wrote it ([`runtime_owned_labels`], or listed in a [`MANAGED_LABELS_ANNOTATION`] of an
    /// older runtime) and the virtual object no longer has it — so a label removed in the
    /// virtual cluster is removed on the host and a label added on the host stays (vCluster
    /// keeps it too, by syncing labels both ways).
    pub fn translate_metadata_update(
        &self,
        virtual_meta: &ObjectMeta,
        host_meta: &ObjectMeta,
    ) -> Option<MetadataUpdate> {
        let host_name = host_meta.name.as_deref().unwrap_or_default();
        let empty = BTreeMap::new();
        let host_annotations = host_meta.annotations.as_ref().unwrap_or(&empty);
        let annotations = self.host_annotations(virtual_meta, host_name, host_annotations);
        let labels = self.host_labels(virtual_meta, Some(host_meta));
        let unchanged = host_meta.labels.as_ref().unwrap_or(&empty) == &labels
            && host_annotations == &annotations;
        (!unchanged).then_some(MetadataUpdate {
            labels,
            annotations,
        })
    }

    /// A new host object for `virtual_obj`: [`Self::translate_metadata`], this translator's
    /// `apiVersion` / `kind`, and every other top-level field of the virtual object (`spec`,
    /// `data`, ...) copied, except `status` (the host's controllers own it).
    pub fn host_object(&self, virtual_obj: &DynamicObject) -> DynamicObject {
        DynamicObject {
            types: Some(self.type_meta()),
            metadata: self.translate_metadata(&virtual_obj.metadata),
            data: copy_content(&virtual_obj.data, None),
        }
    }

    /// The host object `host_obj` as it must be for `virtual_obj`: labels and annotations
    /// updated as by [`Self::translate_metadata_update`], every top-level field other than
    /// `metadata` and `status` replaced by the virtual object's (fields the virtual object no
    /// longer has are removed), the host's `status` and all other host metadata kept.
    /// Equal to `host_obj` (apart from `apiVersion` / `kind`, which are filled in) when no
    /// write is needed.
    pub fn host_object_update(
        &self,
        virtual_obj: &DynamicObject,
        host_obj: &DynamicObject,
    ) -> DynamicObject {
        let mut metadata = host_obj.metadata.clone();
        if let Some(update) = self.translate_metadata_update(&virtual_obj.metadata, &metadata) {
            metadata.labels = Some(update.labels);
            metadata.annotations = Some(update.annotations);
        }
        DynamicObject {
            types: Some(self.type_meta()),
            metadata,
            data: copy_content(&virtual_obj.data, host_obj.data.get("status")),
        }
    }

    /// Whether `host_meta` is the host copy, made by this translator's vCluster, of the virtual
    /// object `name` in `namespace`: it carries [`MANAGED_BY_LABEL`]`=<vcluster>`, its
    /// [`NAME_ANNOTATION`] / [`NAMESPACE_ANNOTATION`] name that object, its name is that
    /// object's [`host_name`], and its [`KIND_ANNOTATION`] (when present) is this type's.
    /// Mirrors vCluster's `IsManaged` / `ShouldDeleteHostObject` checks: only such objects are
    /// ever updated or deleted.
    pub fn is_host_copy_of(&self, host_meta: &ObjectMeta, name: &str, namespace: &str) -> bool {
        let annotations = host_meta.annotations.clone().unwrap_or_default();
        is_managed_by(host_meta, &self.vcluster)
            && annotations.get(NAME_ANNOTATION).map(String::as_str) == Some(name)
            && annotations.get(NAMESPACE_ANNOTATION).map(String::as_str) == Some(namespace)
            && host_meta.name.as_deref() == Some(self.host_name(name, namespace).as_str())
            && annotations
                .get(KIND_ANNOTATION)
                .is_none_or(|kind| *kind == object_kind(&self.api_version, &self.kind))
    }

    /// The virtual `(namespace, name)` a host object was made from, read from its
    /// [`NAMESPACE_ANNOTATION`] / [`NAME_ANNOTATION`], when it is managed by this vCluster.
    pub fn virtual_key(&self, host_meta: &ObjectMeta) -> Option<(String, String)> {
        if !is_managed_by(host_meta, &self.vcluster) {
            return None;
        }
        let annotations = host_meta.annotations.as_ref()?;
        let name = annotations.get(NAME_ANNOTATION)?;
        let namespace = annotations.get(NAMESPACE_ANNOTATION)?;
        Some((namespace.clone(), name.clone()))
    }

    /// `apiVersion` / `kind` of this translator's type.
    pub fn type_meta(&self) -> TypeMeta {
        TypeMeta {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
        }
    }

    /// Labels of the host copy of `virtual_meta` (vCluster's `HostLabelsMap`): every virtual
    /// label under its [`host_label`] key, except virtual labels that already look like a
    /// translated key (dropped, as vCluster's `IsTranslatedLabel` does); then
    /// [`MANAGED_BY_LABEL`]`=<vcluster>` and [`NAMESPACE_LABEL`]`=<virtual namespace>` (for a
    /// virtual object without namespace: [`MANAGED_BY_LABEL`]` = ` [`safe_concat_name`] of the
    /// host namespace, `x`, the vCluster, as vCluster marks cluster-scoped copies). With the
    /// existing host object `host`: its [`CONTROLLED_BY_LABEL`], and its other labels that the
    /// runtime did not write (see [`Self::translate_metadata_update`]).
    fn host_labels(
        &self,
        virtual_meta: &ObjectMeta,
        host: Option<&ObjectMeta>,
    ) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        for (key, value) in virtual_meta.labels.iter().flatten() {
            if self.translated_keys.contains(key) {
                continue;
            }
            let key = if TRANSLATED_LABELS.contains(&key.as_str()) {
                host_label(key, &self.vcluster)
            } else {
                key.clone()
            };
            labels.insert(key, value.clone());
        }
        let virtual_namespace = virtual_meta.namespace.as_deref().unwrap_or_default();
        if virtual_namespace.is_empty() {
            labels.insert(
                MANAGED_BY_LABEL.into(),
                safe_concat_name(&[&self.host_namespace, "x", &self.vcluster]),
            );
        } else {
            labels.insert(MANAGED_BY_LABEL.into(), self.vcluster.clone());
            labels.insert(NAMESPACE_LABEL.into(), virtual_namespace.into());
        }
        let Some(host) = host else {
            return labels;
        };
        let host_labels = host.labels.as_ref();
        if let Some(controller) = host_labels
            .and_then(|l| l.get(CONTROLLED_BY_LABEL))
            .filter(|c| !c.is_empty())
        {
            labels.insert(CONTROLLED_BY_LABEL.into(), controller.clone());
        }
        let mut ours = runtime_owned_labels(host);
        if let Some(legacy) = host
            .annotations
            .as_ref()
            .and_then(|a| a.get(MANAGED_LABELS_ANNOTATION))
        {
            ours.extend(legacy.split('\n').map(str::to_string));
        }
        for (key, value) in host_labels.into_iter().flatten() {
            let reserved = matches!(
                key.as_str(),
                MANAGED_BY_LABEL | NAMESPACE_LABEL | CONTROLLED_BY_LABEL
            );
            if !reserved && !labels.contains_key(key) && !ours.contains(key) {
                labels.insert(key.clone(), value.clone());
            }
        }
        labels
    }

    /// Annotations of the host object named `host_name` for `virtual_meta`, merged into
    /// `existing` (vCluster's `HostAnnotations`: `applyAnnotations`, then `addHostAnnotations`).
    /// For a new copy, `existing` is the virtual object's own annotations, as in vCluster's
    /// `HostMetadata` (which merges into a copy of the virtual object).
    fn host_annotations(
        &self,
        virtual_meta: &ObjectMeta,
        host_name: &str,
        existing: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let empty = BTreeMap::new();
        let virtual_annotations = virtual_meta.annotations.as_ref().unwrap_or(&empty);
        let (mut annotations, managed) = merge_managed(
            virtual_annotations,
            existing,
            existing.get(MANAGED_ANNOTATIONS_ANNOTATION),
            &RESERVED_ANNOTATIONS,
        );
        set_or_remove(&mut annotations, MANAGED_ANNOTATIONS_ANNOTATION, managed);
        let name = virtual_meta.name.clone().unwrap_or_default();
        let uid = virtual_meta.uid.clone().unwrap_or_default();
        annotations.insert(NAME_ANNOTATION.into(), name);
        annotations.insert(UID_ANNOTATION.into(), uid);
        annotations.insert(HOST_NAME_ANNOTATION.into(), host_name.into());
        if !self.host_namespace.is_empty() {
            annotations.insert(
                HOST_NAMESPACE_ANNOTATION.into(),
                self.host_namespace.clone(),
            );
        }
        let virtual_namespace = virtual_meta.namespace.as_deref().unwrap_or_default();
        set_or_remove(
            &mut annotations,
            NAMESPACE_ANNOTATION,
            virtual_namespace.to_string(),
        );
        annotations.insert(
            KIND_ANNOTATION.into(),
            object_kind(&self.api_version, &self.kind),
        );
        annotations
    }
}

/// Where host objects of one namespaced type go in the virtual cluster (`direction: FromHost`):
/// objects of `api_version` / `kind` in host namespace `host_namespace` are copied into virtual
/// namespace `virtual_namespace` under the same name (vCluster's
/// `sync.fromHost.customResources` with the mapping `"<host namespace>/*": "<virtual
/// namespace>/*"`).
///
/// The virtual copy carries the host object's labels and annotations, plus
/// [`HOST_NAME_ANNOTATION`] / [`HOST_NAMESPACE_ANNOTATION`] naming the host object (vCluster's
/// `VirtualMetadata` marks imported objects the same way), and every top-level field of the host
/// object but `status` (the virtual copy's own `status` is kept; `syncStatus` copies it
/// separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FromHostTranslator {
    host_namespace: String,
    virtual_namespace: String,
    api_version: String,
    kind: String,
}

impl FromHostTranslator {
    /// A translator for objects of `api_version` / `kind` copied from host namespace
    /// `host_namespace` into virtual namespace `virtual_namespace`.
    pub fn new(
        host_namespace: impl Into<String>,
        virtual_namespace: impl Into<String>,
        api_version: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        Self {
            host_namespace: host_namespace.into(),
            virtual_namespace: virtual_namespace.into(),
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The host namespace the objects are copied from.
    pub fn host_namespace(&self) -> &str {
        &self.host_namespace
    }

    /// The virtual namespace the objects are copied into.
    pub fn virtual_namespace(&self) -> &str {
        &self.virtual_namespace
    }

    /// The virtual copy of `host` on top of the existing virtual object `base` (none for a
    /// create): name of the host object, the virtual namespace, the host's labels, the host's
    /// annotations plus [`HOST_NAME_ANNOTATION`] / [`HOST_NAMESPACE_ANNOTATION`], every
    /// top-level field of the host but `status`, and `base`'s `status` and other metadata
    /// (`uid`, `resourceVersion`, ...) kept.
    pub fn virtual_object(
        &self,
        host: &DynamicObject,
        base: Option<&DynamicObject>,
    ) -> DynamicObject {
        let mut metadata = base.map(|b| b.metadata.clone()).unwrap_or_default();
        metadata.name = Some(host.name_any());
        metadata.namespace = Some(self.virtual_namespace.clone());
        metadata.labels = Some(host.labels().clone());
        let mut annotations = host.annotations().clone();
        annotations.insert(HOST_NAME_ANNOTATION.into(), host.name_any());
        annotations.insert(
            HOST_NAMESPACE_ANNOTATION.into(),
            self.host_namespace.clone(),
        );
        metadata.annotations = Some(annotations);
        DynamicObject {
            types: Some(TypeMeta {
                api_version: self.api_version.clone(),
                kind: self.kind.clone(),
            }),
            metadata,
            data: copy_content(&host.data, base.and_then(|b| b.data.get("status"))),
        }
    }

    /// Whether `virtual_meta` is the copy this translator made of the host object `name`: its
    /// [`HOST_NAME_ANNOTATION`] / [`HOST_NAMESPACE_ANNOTATION`] name that object. Only such
    /// virtual objects are ever updated or deleted.
    pub fn is_virtual_copy_of(&self, virtual_meta: &ObjectMeta, name: &str) -> bool {
        let Some(annotations) = virtual_meta.annotations.as_ref() else {
            return false;
        };
        annotations.get(HOST_NAME_ANNOTATION).map(String::as_str) == Some(name)
            && annotations.get(HOST_NAMESPACE_ANNOTATION) == Some(&self.host_namespace)
    }
}

/// vCluster's `applyMaps`: the keys of `from` (except `reserved`) are copied and become the
/// managed keys; a key of `to` is kept when it is reserved, or when it is neither copied now
/// nor was managed before (`previously_managed`, a `\n`-joined list) — so keys removed from
/// `from` disappear and keys someone added to `to` stay. Returns the merged map and the sorted,
/// `\n`-joined managed keys.
fn merge_managed(
    from: &BTreeMap<String, String>,
    to: &BTreeMap<String, String>,
    previously_managed: Option<&String>,
    reserved: &[&str],
) -> (BTreeMap<String, String>, String) {
    let previously_managed: Vec<&str> = previously_managed
        .map(|list| list.split('\n').collect())
        .unwrap_or_default();
    let mut merged = BTreeMap::new();
    let mut managed = Vec::new();
    for (key, value) in from {
        if reserved.contains(&key.as_str()) {
            continue;
        }
        merged.insert(key.clone(), value.clone());
        managed.push(key.as_str());
    }
    for (key, value) in to {
        let reserved_key = reserved.contains(&key.as_str());
        let ours = from.contains_key(key) || previously_managed.contains(&key.as_str());
        if reserved_key || !ours {
            merged.insert(key.clone(), value.clone());
        }
    }
    managed.sort_unstable();
    (merged, managed.join("\n"))
}

/// Sets `key` to `value`, or removes it when `value` is empty.
fn set_or_remove(map: &mut BTreeMap<String, String>, key: &str, value: String) {
    if value.is_empty() {
        map.remove(key);
    } else {
        map.insert(key.to_string(), value);
    }
}

/// Top-level fields of an object other than `metadata`, `apiVersion`, `kind` and `status`,
/// with `status` set to `status` when given.
fn copy_content(data: &serde_json::Value, status: Option<&serde_json::Value>) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    if let Some(fields) = data.as_object() {
        for (key, value) in fields {
            if !matches!(key.as_str(), "metadata" | "apiVersion" | "kind" | "status") {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(status) = status {
        out.insert("status".into(), status.clone());
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests;
