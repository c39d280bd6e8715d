//! Answers to the operator's writes to VClusterPlugins read as metadata only (the answers were
//! the peak of the operator's memory during a tenant's flood).
//!
//! The API server answers a write with the whole object, and a plugin's whole object is its
//! spec, up to the request limit (1.5 MiB by default), parsed into a JSON tree several times
//! larger than its text. The operator writes each plugin's finalizer and status, and the
//! answers are not the copies it judges (those are the watch cache's, slimmed,
//! [`crate::slim`]). So its writes to VClusterPlugins ask for `PartialObjectMetadata` instead
//! (`Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`, which the API server
//! honours for every verb and subresource), and decode [`Metadata`] from it: a few fields, the
//! rest (`managedFields` included, which lists every key of a wide config) skipped by
//! serde_json without being stored.

use serde::Deserialize;
use serde::de::IgnoredAny;
use vcp_crds::{FINALIZER, VClusterPlugin};

/// The `Accept` header of a metadata-only answer (kube-core's own, which it keeps private).
pub const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// `request` (a write built by [`kube::core::Request`]) asking for a metadata-only answer.
pub fn metadata_only(mut request: ::http::Request<Vec<u8>>) -> ::http::Request<Vec<u8>> {
    request.headers_mut().insert(
        ::http::header::ACCEPT,
        ::http::HeaderValue::from_static(METADATA_ONLY),
    );
    request
}

/// What the operator reads of a write's answer: the object's identity, version and finalizers.
/// Every other field of the answer is skipped while it is parsed.
#[derive(Debug, Default, Deserialize)]
pub struct Metadata {
    /// The answer's `metadata`.
    #[serde(default)]
    pub metadata: Fields,
}

/// The fields of [`Metadata::metadata`] that are read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fields {
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
    /// `metadata.generation`: the spec's version.
    pub generation: Option<i64>,
    /// `metadata.finalizers`.
    pub finalizers: Option<Vec<String>>,
    /// `metadata.deletionTimestamp`, present or not (its value is not read).
    pub deletion_timestamp: Option<IgnoredAny>,
}

impl Metadata {
    /// `plugin` (a copy read before the write) with this answer's `finalizers` and
    /// `resourceVersion`, when the answer shows the same object (`uid`) at the same
    /// `generation` (so the same spec), not being deleted, and carrying [`FINALIZER`]; `None`
    /// otherwise (the caller then reads the plugin in full).
    ///
    /// The copy's status is `plugin`'s: only the reconciles of a plugin write its status, and
    /// they add its finalizer first, so a plugin that lacked it had no status write of the
    /// operator's between `plugin`'s read and the patch.
    pub fn applied_to(&self, plugin: &VClusterPlugin) -> Option<VClusterPlugin> {
        let m = &self.metadata;
        let carries = m.finalizers.iter().flatten().any(|f| f == FINALIZER);
        let same = m.uid.is_some()
            && m.uid == plugin.metadata.uid
            && m.generation == plugin.metadata.generation
            && m.deletion_timestamp.is_none()
            && plugin.metadata.deletion_timestamp.is_none();
        (carries && same).then(|| {
            let mut copy = plugin.clone();
            copy.metadata.finalizers.clone_from(&m.finalizers);
            copy.metadata
                .resource_version
                .clone_from(&m.resource_version);
            copy
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plugin(uid: &str, generation: i64) -> VClusterPlugin {
        serde_json::from_value(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": uid, "generation": generation,
                "resourceVersion": "10",
            },
            "spec": { "vcluster": { "name": "v" }, "image": "i:1", "version": "v1",
                      "config": { "k": "v" } },
        }))
        .expect("plugin")
    }

    /// A metadata-only answer as the API server sends it: `managedFields` and `annotations`
    /// are skipped, the read fields kept.
    fn answer(uid: &str, generation: i64, deleting: bool) -> Metadata {
        let mut text = json!({
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": uid, "generation": generation,
                "resourceVersion": "11", "finalizers": ["other", FINALIZER],
                "annotations": { "a": "b" },
                "managedFields": [{ "manager": "m", "fieldsV1": { "f:spec": { "f:config": {} } } }],
            },
        });
        if deleting {
            text["metadata"]["deletionTimestamp"] = json!("2026-12-06T07:00:00Z");
        }
        serde_json::from_str(&text.to_string()).expect("answer")
    }

    #[test]
    fn an_answer_for_the_same_spec_updates_the_copy_read() {
        let read = plugin("u1", 3);
        let copy = answer("u1", 3, false).applied_to(&read).expect("same spec");
        assert_eq!(
            copy.metadata.finalizers,
            Some(vec!["other".to_string(), FINALIZER.to_string()])
        );
        assert_eq!(copy.metadata.resource_version.as_deref(), Some("11"));
        assert_eq!(copy.spec.config, read.spec.config);
        assert_eq!(copy.metadata.annotations, read.metadata.annotations);
    }

    #[test]
    fn an_answer_for_another_spec_object_or_a_deletion_is_not_applied() {
        let read = plugin("u1", 3);
        assert!(
            answer("u1", 4, false).applied_to(&read).is_none(),
            "new spec"
        );
        assert!(
            answer("u2", 3, false).applied_to(&read).is_none(),
            "recreated"
        );
        assert!(
            answer("u1", 3, true).applied_to(&read).is_none(),
            "deleting"
        );
        let mut without = answer("u1", 3, false);
        without.metadata.finalizers = Some(vec!["other".into()]);
        assert!(without.applied_to(&read).is_none(), "no finalizer");
    }
}
