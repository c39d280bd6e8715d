//! `direction: FromHost`: a host object → its copy in the virtual cluster, under the virtual
//! namespace and name its mapping gives ([`FromHostTranslator`]; the mapping is
//! [`FromHostMapping`](super::FromHostMapping)).
//!
//! `syncedTypes[].direction: FromHost`, as vCluster's `sync.fromHost.customResources`
//! with its `mappings.byName` and its `VirtualMetadata` marks on imported objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{DynamicObject, TypeMeta};

use super::fields::copy_content;
use super::names::{HOST_NAME_ANNOTATION, HOST_NAMESPACE_ANNOTATION, PRODUCED_FOR_ANNOTATION};

/// How host objects of one namespaced type are copied into the virtual cluster (`direction:
/// FromHost`): objects of `api_version` / `kind` in host namespace `host_namespace` are copied
/// to the virtual namespace and name their mapping gives (vCluster's
/// `sync.fromHost.customResources` with `mappings.byName`; by default the identity mapping
/// `"<host namespace>/*": "<host namespace>/*"`).
///
/// The virtual copy carries the host object's labels and annotations, plus
/// [`HOST_NAME_ANNOTATION`] / [`HOST_NAMESPACE_ANNOTATION`] naming the host object (vCluster's
/// `VirtualMetadata` marks imported objects the same way), and every top-level field of the host
/// object but `status` (the virtual copy's own `status` is kept; `syncStatus` copies it
/// separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FromHostTranslator {
    host_namespace: String,
    api_version: String,
    kind: String,
}

impl FromHostTranslator {
    /// A translator for objects of `api_version` / `kind` copied from host namespace
    /// `host_namespace`.
    pub fn new(
        host_namespace: impl Into<String>,
        api_version: impl Into<String>,
        kind: impl Into<String>,
    ) -> Self {
        Self {
            host_namespace: host_namespace.into(),
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The host namespace the objects are copied from.
    pub fn host_namespace(&self) -> &str {
        &self.host_namespace
    }

    /// The virtual copy of `host` named `target` (`(virtual namespace, virtual name)`, from the
    /// mapping) on top of the existing virtual object `base` (none for a create): the host's
    /// labels, the host's annotations plus [`HOST_NAME_ANNOTATION`] /
    /// [`HOST_NAMESPACE_ANNOTATION`], every top-level field of the host but `status`, and
    /// `base`'s `status` and other metadata (`uid`, `resourceVersion`, ...) kept.
    pub fn virtual_object(
        &self,
        host: &DynamicObject,
        target: (&str, &str),
        base: Option<&DynamicObject>,
    ) -> DynamicObject {
        let mut metadata = base.map(|b| b.metadata.clone()).unwrap_or_default();
        metadata.name = Some(target.1.to_string());
        metadata.namespace = Some(target.0.to_string());
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
    /// [`HOST_NAME_ANNOTATION`] / [`HOST_NAMESPACE_ANNOTATION`] name that object, and it is not
    /// an object brought back for a synced object ([`PRODUCED_FOR_ANNOTATION`]). Only such
    /// virtual objects are ever updated or deleted.
    pub fn is_virtual_copy_of(&self, virtual_meta: &ObjectMeta, name: &str) -> bool {
        self.host_source(virtual_meta).as_deref() == Some(name)
    }

    /// The host name `virtual_meta` is a copy of, when it is a copy this translator made (see
    /// [`Self::is_virtual_copy_of`]).
    pub fn host_source(&self, virtual_meta: &ObjectMeta) -> Option<String> {
        let annotations = virtual_meta.annotations.as_ref()?;
        if annotations.contains_key(PRODUCED_FOR_ANNOTATION)
            || annotations.get(HOST_NAMESPACE_ANNOTATION) != Some(&self.host_namespace)
        {
            return None;
        }
        annotations.get(HOST_NAME_ANNOTATION).cloned()
    }
}
