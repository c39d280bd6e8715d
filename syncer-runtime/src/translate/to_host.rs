//! `direction: ToHost`: a virtual object → its host copy, as vCluster's own syncer would make
//! it ([`NamespacedTranslator`]).
//!
//! The rules: labels and annotations translated and merged with what the
//! host added (vCluster's `HostLabels` / `HostAnnotations` / `applyMaps`), server-owned
//! metadata stripped, one ownerReference to the vCluster's Service (`setOwner`); the rules in
//! detail are in the [`translate`](super) module's documentation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DynamicObject, TypeMeta};

use super::fields::{copy_content, runtime_owned_labels};
use super::names::{
    CONTROLLED_BY_LABEL, HOST_NAME_ANNOTATION, HOST_NAMESPACE_ANNOTATION, KIND_ANNOTATION,
    MANAGED_ANNOTATIONS_ANNOTATION, MANAGED_BY_LABEL, MANAGED_LABELS_ANNOTATION, NAME_ANNOTATION,
    NAMESPACE_ANNOTATION, NAMESPACE_LABEL, TRANSLATED_LABELS, UID_ANNOTATION, host_label,
    host_name, is_managed_by, object_kind, safe_concat_name,
};

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

/// Whether `ownerReferences` name a controller (Kubernetes' `metav1.GetControllerOf`).
fn has_controller(owners: Option<&Vec<OwnerReference>>) -> bool {
    owners
        .into_iter()
        .flatten()
        .any(|owner| owner.controller == Some(true))
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
        let annotation = |key: &str| {
            host_meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .map(String::as_str)
        };
        is_managed_by(host_meta, &self.vcluster)
            && annotation(NAME_ANNOTATION) == Some(name)
            && annotation(NAMESPACE_ANNOTATION) == Some(namespace)
            && host_meta.name.as_deref() == Some(self.host_name(name, namespace).as_str())
            && annotation(KIND_ANNOTATION)
                .is_none_or(|kind| kind == object_kind(&self.api_version, &self.kind))
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
