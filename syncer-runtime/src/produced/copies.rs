//! The copies: the marks that tell a copy this runtime made, what a copy holds
//! ([`produced_copy`]), and its create, update and delete through the one write path.

use kube::ResourceExt;
use kube::api::{Api, DynamicObject};

use crate::driver::ObjectKey;
use crate::error::Error;
use crate::hooks::HookPoint;
use crate::patch::to_json;
use crate::translate::{
    HOST_NAME_ANNOTATION, HOST_NAMESPACE_ANNOTATION, PRODUCED_FOR_ANNOTATION,
    PRODUCED_PATH_ANNOTATION, copy_content,
};
use crate::write::{Cluster, Part, Target};

use super::entry::Produced;
use super::names::produced_for;

impl Produced {
    /// The synced object's name a virtual object of the produced kind is marked as a copy for,
    /// when it is a copy this runtime made for this `namePath` from the vCluster's host
    /// namespace.
    pub(super) fn copy_source(&self, obj: &DynamicObject) -> Option<String> {
        let annotations = obj.metadata.annotations.as_ref()?;
        if annotations.get(PRODUCED_PATH_ANNOTATION) != Some(&self.opts.name_path)
            || annotations
                .get(HOST_NAMESPACE_ANNOTATION)
                .map(String::as_str)
                != Some(self.opts.translator.host_namespace())
        {
            return None;
        }
        annotations
            .get(PRODUCED_FOR_ANNOTATION)?
            .strip_prefix(&self.for_prefix)
            .map(str::to_string)
    }

    pub(super) fn is_copy_for(&self, obj: &DynamicObject, key: &ObjectKey) -> bool {
        obj.namespace().as_deref() == Some(key.namespace.as_str())
            && self.copy_source(obj).as_deref() == Some(key.name.as_str())
    }

    /// Deletes the copies made for `key` but the one named `keep`.
    pub(super) async fn delete_copies(
        &self,
        key: &ObjectKey,
        keep: Option<&str>,
    ) -> Result<(), Error> {
        let known: Vec<String> = self
            .index
            .lock()
            .map(|i| {
                i.copies
                    .get(key)
                    .map(|c| c.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for name in known {
            if Some(name.as_str()) == keep {
                continue;
            }
            if let Some(copy) = self.virtual_produced.get(&key.namespace, &name)
                && self.is_copy_for(&copy, key)
                && copy.metadata.deletion_timestamp.is_none()
            {
                self.writer
                    .delete(
                        &self.target(&key.namespace),
                        HookPoint::DeleteVirtual,
                        &copy,
                    )
                    .await?;
            }
        }
        Ok(())
    }

    pub(super) fn target(&self, namespace: &str) -> Target<DynamicObject> {
        Target {
            api: Api::namespaced_with(self.opts.virtual_.clone(), namespace, &self.opts.produced),
            cluster: Cluster::Virtual,
            namespace: namespace.to_string(),
        }
    }

    /// The copy of `host` as `key.namespace/name` for the synced object `key`, on top of the
    /// existing virtual object `base` (see the module docs).
    pub(super) fn copy_of(
        &self,
        key: &ObjectKey,
        name: &str,
        host: &DynamicObject,
        base: Option<&DynamicObject>,
    ) -> DynamicObject {
        produced_copy(
            host,
            (&key.namespace, name),
            &produced_for(
                &self.opts.source.api_version,
                &self.opts.source.kind,
                &key.name,
            ),
            &self.opts.name_path,
            base,
        )
    }

    pub(super) async fn update(
        &self,
        key: &ObjectKey,
        name: &str,
        host: &DynamicObject,
        current: &DynamicObject,
    ) -> Result<(), Error> {
        let desired = self.copy_of(key, name, host, Some(current));
        let mut current = current.clone();
        current.types.clone_from(&desired.types);
        let rv = current.resource_version();
        let current = to_json(&current, name)?;
        let desired = to_json(&desired, name)?;
        self.writer
            .patch(
                &self.target(&key.namespace),
                name,
                Part::Object,
                &[HookPoint::UpdateVirtual],
                &current,
                desired,
                rv,
            )
            .await?;
        Ok(())
    }
}

/// The virtual copy of the produced host object `host` at `target` (`(namespace, name)`) for the
/// synced object `produced_for` ([`produced_for`]) through `name_path`, on top of the existing
/// virtual object `base` (none for a create): `host`'s labels and annotations except
/// `vcluster.loft.sh/` keys, plus [`PRODUCED_FOR_ANNOTATION`], [`PRODUCED_PATH_ANNOTATION`],
/// [`HOST_NAME_ANNOTATION`] and [`HOST_NAMESPACE_ANNOTATION`]; every top-level field of `host`
/// but `metadata` and `status`; `base`'s other metadata (`uid`, `resourceVersion`, ...) and
/// `status` kept.
pub fn produced_copy(
    host: &DynamicObject,
    target: (&str, &str),
    produced_for: &str,
    name_path: &str,
    base: Option<&DynamicObject>,
) -> DynamicObject {
    let ours = |key: &String| !key.starts_with("vcluster.loft.sh/");
    let mut metadata = base.map(|b| b.metadata.clone()).unwrap_or_default();
    metadata.name = Some(target.1.to_string());
    metadata.namespace = Some(target.0.to_string());
    metadata.labels = Some(
        host.labels()
            .iter()
            .filter(|(k, _)| ours(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    let mut annotations: std::collections::BTreeMap<String, String> = host
        .annotations()
        .iter()
        .filter(|(k, _)| ours(k) && !k.starts_with("vcp.dev/produced-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(PRODUCED_FOR_ANNOTATION.into(), produced_for.to_string());
    annotations.insert(PRODUCED_PATH_ANNOTATION.into(), name_path.to_string());
    annotations.insert(HOST_NAME_ANNOTATION.into(), host.name_any());
    annotations.insert(
        HOST_NAMESPACE_ANNOTATION.into(),
        host.namespace().unwrap_or_default(),
    );
    metadata.annotations = Some(annotations);
    DynamicObject {
        types: host.types.clone(),
        metadata,
        data: copy_content(&host.data, base.and_then(|b| b.data.get("status"))),
    }
}
