//! Objects as JSON (`to_json`) and minimal RFC 7386 merge patches computed from two JSON
//! documents (pure).
//!
//! Writes send only what changed. A merge patch that carries `metadata.resourceVersion` is an
//! optimistic-concurrency precondition for the API server (409 Conflict when the object moved
//! on), so a patch computed from a stale cache never overwrites a newer object.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::Error;

/// `obj` as JSON.
pub(crate) fn to_json<K: Serialize>(obj: &K, name: &str) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|source| Error::Json {
        what: format!("object {name}"),
        source,
    })
}

/// The merge patch that turns `current` into `desired`: changed or added object members are
/// set, removed members are set to `null`, and any other changed value (arrays, scalars,
/// a change of type) is replaced whole. `None` when the documents are equal.
///
/// A `null` inside `desired` cannot be expressed by a merge patch (it means "remove"); such
/// members are removed instead, which Kubernetes treats the same way for optional fields.
pub fn merge_diff(current: &Value, desired: &Value) -> Option<Value> {
    if current == desired {
        return None;
    }
    match (current, desired) {
        (Value::Object(current), Value::Object(desired)) => {
            let mut patch = Map::new();
            for (key, want) in desired {
                match current.get(key) {
                    Some(have) => {
                        if let Some(member) = merge_diff(have, want) {
                            patch.insert(key.clone(), member);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), want.clone());
                    }
                }
            }
            for key in current.keys() {
                if !desired.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            Some(Value::Object(patch))
        }
        _ => Some(desired.clone()),
    }
}

/// [`merge_diff`] with `metadata.resourceVersion` set to `resource_version` (when known), so
/// that the API server refuses the patch if the object changed since it was read.
pub fn guarded_merge_patch(
    current: &Value,
    desired: &Value,
    resource_version: Option<String>,
) -> Option<Value> {
    let mut patch = merge_diff(current, desired)?;
    if let (Some(resource_version), Some(root)) = (resource_version, patch.as_object_mut()) {
        let metadata = root
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("resourceVersion".into(), Value::String(resource_version));
        }
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Applies a merge patch the way RFC 7386 says, to check the diff round-trips.
    fn apply(target: &mut Value, patch: &Value) {
        json_patch::merge(target, patch);
    }

    #[test]
    fn equal_documents_need_no_patch() {
        let doc = json!({"a": 1, "b": {"c": [1, 2]}});
        assert_eq!(merge_diff(&doc, &doc), None);
    }

    #[test]
    fn diff_round_trips() {
        let current = json!({
            "metadata": {"labels": {"keep": "1", "drop": "2", "change": "a"}, "name": "n"},
            "spec": {"type": "BMW", "list": [1, 2, 3], "gone": {"x": 1}},
            "status": {"ok": true}
        });
        let desired = json!({
            "metadata": {"labels": {"keep": "1", "change": "b", "new": "3"}, "name": "n"},
            "spec": {"type": "Audi", "list": [1, 2], "seats": 4},
            "status": {"ok": true}
        });
        let patch = merge_diff(&current, &desired).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {"labels": {"drop": null, "change": "b", "new": "3"}},
                "spec": {"type": "Audi", "list": [1, 2], "seats": 4, "gone": null}
            })
        );
        let mut patched = current.clone();
        apply(&mut patched, &patch);
        assert_eq!(patched, desired);
    }

    #[test]
    fn guarded_patch_carries_resource_version() {
        let patch = guarded_merge_patch(
            &json!({"spec": {"a": 1}}),
            &json!({"spec": {"a": 2}}),
            Some("42".into()),
        )
        .unwrap();
        assert_eq!(
            patch,
            json!({"spec": {"a": 2}, "metadata": {"resourceVersion": "42"}})
        );
        assert_eq!(
            guarded_merge_patch(&json!(1), &json!(1), Some("1".into())),
            None
        );
    }
}
