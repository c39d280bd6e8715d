//! Convergence: does the live workload already hold exactly what [`plan`](super::plan) would
//! apply?
//!
//! The rule: a reconcile of an unchanged, converged object performs zero
//! writes. The operator's part is read from its `Apply` entry in `managedFields` (the field
//! set the API server records for a server-side apply), so a stale entry left to remove is
//! seen as well as a value someone changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Map, Value, json};
use vcp_crds::OPERATOR_FIELD_MANAGER;

use super::identity::Workload;

/// Lists of the pod spec that are maps keyed by a field (`+listType=map`) among those the
/// operator writes; every other list is atomic. Used to turn an apply body into the field set
/// the API server records in `managedFields`.
const KEYED_LISTS: [(&str, &str); 5] = [
    ("containers", "name"),
    ("initContainers", "name"),
    ("volumes", "name"),
    ("env", "name"),
    ("volumeMounts", "mountPath"),
];

pub(super) fn list_key(field: &str) -> Option<&'static str> {
    KEYED_LISTS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, k)| *k)
}

/// `k:{"name":"x"}`, the managedFields key of a map-list item.
pub(super) fn item_key(key: &str, value: &str) -> String {
    format!("k:{}", json!({ key: value }))
}

/// The operator's owned field set of the pod spec (`f:spec`/`f:template`/`f:spec` of its
/// `Apply` entry in `managedFields`), or `{}` when it owns nothing.
pub fn owned_entries(managed_fields: &[ManagedFieldsEntry]) -> Value {
    managed_fields
        .iter()
        .find(|e| {
            e.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
                && e.subresource.as_deref().unwrap_or_default().is_empty()
        })
        .and_then(|e| e.fields_v1.as_ref())
        .and_then(|f| f.0.pointer("/f:spec/f:template/f:spec"))
        .cloned()
        .unwrap_or_else(|| json!({}))
}

/// The field set (managedFields `FieldsV1` notation) an apply of `value` would own.
pub fn field_set(value: &Value) -> Value {
    fn walk(value: &Value, field: &str) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (format!("f:{k}"), walk(v, k)))
                    .collect(),
            ),
            Value::Array(items) => match list_key(field) {
                Some(key) => {
                    let mut out = Map::new();
                    for item in items {
                        let id = item.get(key).and_then(Value::as_str).unwrap_or_default();
                        let mut fields = match walk(item, "") {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        fields.insert(".".into(), json!({}));
                        out.insert(item_key(key, id), Value::Object(fields));
                    }
                    Value::Object(out)
                }
                None => json!({}),
            },
            _ => json!({}),
        }
    }
    walk(value, "")
}

/// Whether every value in `desired` is present and equal in `live`: objects key by key,
/// keyed lists item by item (matched by key; other items in `live` are someone else's),
/// atomic lists element by element with the same length.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    fn walk(desired: &Value, live: &Value, field: &str) -> bool {
        match (desired, live) {
            (Value::Object(d), Value::Object(l)) => d
                .iter()
                .all(|(k, dv)| l.get(k).is_some_and(|lv| walk(dv, lv, k))),
            (Value::Array(d), Value::Array(l)) => match list_key(field) {
                Some(key) => d.iter().all(|di| {
                    let id = di.get(key);
                    l.iter()
                        .find(|li| li.get(key) == id)
                        .is_some_and(|li| walk(di, li, ""))
                }),
                None => d.len() == l.len() && d.iter().zip(l).all(|(di, li)| walk(di, li, "")),
            },
            (d, l) => d == l,
        }
    }
    walk(desired, live, "")
}

/// Whether applying `patch` (from [`plan`](super::plan)) to `workload` would change nothing: the operator
/// already owns exactly the fields of `patch` (so no stale entry is left to remove) and the
/// live values equal the desired ones.
///
/// Known gap: quantities the API server canonicalizes (`1000m` is stored as `1`) compare
/// unequal, which costs a no-op apply on every reconcile of such a plugin.
pub fn is_converged(workload: &Workload, patch: &Value) -> bool {
    let desired = patch
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let live = to_value(&workload.pod_spec);
    field_set(&desired) == owned_entries(&workload.managed_fields) && is_subset(&desired, &live)
}

pub(super) fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // Serializing k8s-openapi types to a JSON value cannot fail (no non-string map keys).
    serde_json::to_value(v).unwrap_or(Value::Null)
}
