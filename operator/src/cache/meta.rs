//! What the operator keeps of every workload labelled `app=vcluster`: its identity and the
//! names of the pod-template entries its own field manager owns, never its pod template
//! ([`WorkloadMeta`]).
//!
//! Why: anyone who may create a StatefulSet can label it `app=vcluster` (the chart's label, the
//! caches' selector, [`crate::workload::VCLUSTER_APP_LABEL`]). Cached whole, each such workload
//! held its pod template in the operator's memory: a tenant with `edit` made StatefulSets of
//! `replicas: 0` with 1 MB pod templates, and the operator, at about 1 MiB more per object, was
//! OOM-killed (256 Mi, `config/manager/manager.yaml`) at about 255 of them, and again at every
//! start while it listed them.
//!
//! **How:** the watch asks the API server for `PartialObjectMetadata` ([`Resource::metadata_api`]:
//! kube's `Api` then sends `Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`
//! for a list and `…;as=PartialObjectMetadata;…` for a watch), so a workload's spec and status
//! never reach the operator. The metadata can be large too (annotations up to 256 KiB, any
//! number of labels, `managedFields` as wide as the object, or written by hand), so it is
//! decoded into [`WorkloadMeta`] field by field: `name`, `namespace`, `uid`,
//! `resourceVersion` and `generation` are kept; of `managedFields`, only the names of the
//! containers and init containers the operator's server-side-apply entry owns, at most
//! [`MAX_OWNED_NAMES`]; everything else is skipped by serde_json as it is read, never stored.
//! What stays is at most about 1.5 KiB per workload, whatever the object's size.
//!
//! The pod template of a workload is read only when a plugin targets it
//! ([`crate::cache::workload`], [`super::copies`]).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use vcp_crds::OPERATOR_FIELD_MANAGER;

use crate::workload::SYNCER_CONTAINER;

/// The most container and init container names kept per workload ([`Owned::names`]). A
/// workload into which more plugins are installed (or whose `managedFields` name more, written
/// by hand) is marked [`Owned::truncated`] instead, and read in full when it matters (the
/// sweep).
pub const MAX_OWNED_NAMES: usize = 16;

/// The longest container name (a DNS label, 63 characters, as the API server validates it). A
/// longer name in the operator's entry cannot be one of its containers' (written by hand): the
/// workload is marked [`Owned::truncated`].
pub const MAX_CONTAINER_NAME: usize = 63;

/// What the operator keeps of a workload of kind `K` (a StatefulSet or a Deployment) labelled
/// `app=vcluster`, whatever its size (module docs).
pub struct WorkloadMeta<K> {
    /// `name`, `namespace`, `uid`, `resourceVersion` and `generation`; every other field is
    /// empty.
    pub metadata: ObjectMeta,
    /// The pod-template entries the operator's own server-side apply owns (the sweep's
    /// question: does this workload hold a deleted plugin's containers?).
    pub owned: Owned,
    kind: PhantomData<fn() -> K>,
}

/// The containers and init containers (one set of names: a plugin's entry is named after it in
/// either list) that the operator's `Apply` entry of `managedFields` owns in the pod template
/// (`f:spec` / `f:template` / `f:spec` / `f:containers` or `f:initContainers`, keys
/// `k:{"name":…}`), as [`crate::workload::owned_entries`] reads them from a whole workload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owned {
    /// The names, at most [`MAX_OWNED_NAMES`], each at most [`MAX_CONTAINER_NAME`] bytes;
    /// `syncer` included (the operator owns a mount in vCluster's own container).
    pub names: BTreeSet<String>,
    /// More names than kept, or a name longer than a container's: the names are not all known.
    pub truncated: bool,
}

impl Owned {
    /// Whether the operator may own an entry named other than `syncer` for which `kept` is
    /// false (a plugin that no longer targets the workload). `true` when the names are not all
    /// known ([`Owned::truncated`]).
    pub fn may_hold_other_than(&self, kept: impl Fn(&str) -> bool) -> bool {
        self.truncated || self.names.iter().any(|n| n != SYNCER_CONTAINER && !kept(n))
    }

    fn add(&mut self, key: &str) {
        #[derive(Deserialize)]
        struct Key {
            name: String,
        }
        let Some(Ok(Key { name })) = key.strip_prefix("k:").map(serde_json::from_str::<Key>) else {
            // not a list item keyed by name (`.`, a field): nothing to count
            return;
        };
        if name.len() > MAX_CONTAINER_NAME
            || (self.names.len() >= MAX_OWNED_NAMES && !self.names.contains(&name))
        {
            self.truncated = true;
        } else {
            self.names.insert(name);
        }
    }
}

impl<K> WorkloadMeta<K> {
    /// The kept fields of `metadata` (module docs) and `owned`.
    pub fn new(metadata: &ObjectMeta, owned: Owned) -> Self {
        WorkloadMeta {
            metadata: ObjectMeta {
                name: metadata.name.clone(),
                namespace: metadata.namespace.clone(),
                uid: metadata.uid.clone(),
                resource_version: metadata.resource_version.clone(),
                generation: metadata.generation,
                ..ObjectMeta::default()
            },
            owned,
            kind: PhantomData,
        }
    }
}

impl<K> Clone for WorkloadMeta<K> {
    fn clone(&self) -> Self {
        WorkloadMeta {
            metadata: self.metadata.clone(),
            owned: self.owned.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> fmt::Debug for WorkloadMeta<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadMeta")
            .field("metadata", &self.metadata)
            .field("owned", &self.owned)
            .finish()
    }
}

impl<K: Resource> Resource for WorkloadMeta<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    /// Lists and watches ask for `PartialObjectMetadata` (module docs).
    fn metadata_api() -> bool {
        true
    }
    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The identity only (the operator never writes a [`WorkloadMeta`]; the tolerant reader
/// serializes an undecodable object's identity, `vcp_crds::tolerant`).
impl<K> Serialize for WorkloadMeta<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Identity<'a> {
            metadata: &'a ObjectMeta,
        }
        Identity {
            metadata: &self.metadata,
        }
        .serialize(serializer)
    }
}

impl<'de, K> Deserialize<'de> for WorkloadMeta<K> {
    /// From a `PartialObjectMetadata` (or a whole object: only `metadata` is read), keeping the
    /// fields of the module docs and skipping the rest as it is read.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: WireMeta,
        }
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct WireMeta {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
            generation: Option<i64>,
            #[serde(default)]
            managed_fields: Option<OwnedOfOperator>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let m = wire.metadata;
        Ok(WorkloadMeta {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                generation: m.generation,
                ..ObjectMeta::default()
            },
            owned: m.managed_fields.map(|o| o.0).unwrap_or_default(),
            kind: PhantomData,
        })
    }
}

/// `managedFields` read as the operator's [`Owned`]: the first entry of the operator's field
/// manager, operation `Apply`, on the object itself (no subresource), as
/// [`crate::workload::owned_entries`] picks it. Each entry's names are read bounded, whatever
/// its manager (the manager may come after `fieldsV1` in the text), and dropped unless it is
/// that entry.
struct OwnedOfOperator(Owned);

impl<'de> Deserialize<'de> for OwnedOfOperator {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Entry {
            manager: Option<String>,
            operation: Option<String>,
            subresource: Option<String>,
            #[serde(rename = "fieldsV1", default)]
            fields_v1: Option<TemplateNames>,
        }
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = OwnedOfOperator;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of managedFields entries")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut found = None;
                while let Some(entry) = seq.next_element::<Entry>()? {
                    let ours = entry.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER)
                        && entry.operation.as_deref() == Some("Apply")
                        && entry.subresource.as_deref().unwrap_or_default().is_empty();
                    if ours && found.is_none() {
                        found = Some(entry.fields_v1.map(|t| t.0).unwrap_or_default());
                    }
                }
                Ok(OwnedOfOperator(found.unwrap_or_default()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(OwnedOfOperator(Owned::default()))
            }
        }
        deserializer.deserialize_any(Entries)
    }
}

/// The names under `f:spec` / `f:template` / `f:spec` / `f:containers` and `f:initContainers`
/// of one `fieldsV1`, bounded ([`Owned`]); every other key is skipped unread.
struct TemplateNames(Owned);

impl<'de> Deserialize<'de> for TemplateNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut owned = Owned::default();
        Descend {
            depth: 0,
            out: &mut owned,
        }
        .deserialize(deserializer)?;
        Ok(TemplateNames(owned))
    }
}

/// One level of a `fieldsV1` on the way to the lists of containers ([`TemplateNames`]).
struct Descend<'a> {
    /// 0 at the root; 4 inside `f:containers` or `f:initContainers`.
    depth: usize,
    out: &'a mut Owned,
}

impl Descend<'_> {
    /// Whether `key` at this depth is on the way.
    fn follows(&self, key: &str) -> bool {
        match self.depth {
            0 | 2 => key == "f:spec",
            1 => key == "f:template",
            3 => key == "f:containers" || key == "f:initContainers",
            _ => false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Descend<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Descend<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a managedFields field set")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if self.depth == 4 {
                self.out.add(&key);
                map.next_value::<IgnoredAny>()?;
            } else if self.follows(&key) {
                map.next_value_seed(Descend {
                    depth: self.depth + 1,
                    out: &mut *self.out,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
    // Anything but a map holds no names: skipped.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}
