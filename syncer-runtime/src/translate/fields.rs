//! What of an object the runtime keeps and copies: the slim `managedFields` of a cached object
//! (only the labels the runtime's field manager owns), those labels read back, and the content
//! (every top-level field but metadata and `status`) copied between virtual and host.
//!
//! The rules: labels removed in the virtual cluster are removed on the
//! host while keys added on the host are kept; the host's `status` belongs to the host, copied
//! up only with `syncStatus`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use vcp_crds::RUNTIME_FIELD_MANAGER;

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

/// Top-level fields of an object other than `metadata`, `apiVersion`, `kind` and `status`,
/// with `status` set to `status` when given.
pub fn copy_content(
    data: &serde_json::Value,
    status: Option<&serde_json::Value>,
) -> serde_json::Value {
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
