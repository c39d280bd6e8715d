//! The keys of a hooked pod as Go's decoder reads them: keys the typed view loses
//! ([`lost_keys`]) and keys that fold to one field ([`folded_duplicate_keys`]), judged against
//! the typed view's schema of a Pod.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use vcp_crds::fold::go_fold;

/// The JSON Schema of a Pod as k8s-openapi's typed view reads it (its `schemars` schema; the
/// definitions it refers to under `$defs`): which JSON objects of a pod are structs, with which
/// fields, and which are maps (`additionalProperties`: labels, annotations, `nodeSelector`,
/// resource lists, ...).
fn pod_schema() -> &'static Value {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let schema =
            k8s_openapi::schemars::SchemaGenerator::default().into_root_schema_for::<Pod>();
        serde_json::to_value(schema).unwrap_or_default()
    })
}

/// `schema` (a part of [`pod_schema`]), or the definition its `$ref` names.
fn resolved(schema: &Value) -> &Value {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        Some(pointer) => pod_schema().pointer(pointer).unwrap_or(&Value::Null),
        None => schema,
    }
}

/// The fields of the struct `schema` describes, if it describes one.
fn struct_fields(schema: Option<&Value>) -> Option<&serde_json::Map<String, Value>> {
    schema?.get("properties")?.as_object()
}

/// Whether `schema` describes a map (`additionalProperties`, no fields): Go decodes its keys
/// exactly, as map keys.
fn is_map(schema: Option<&Value>) -> bool {
    schema.is_some_and(|s| s.get("additionalProperties").is_some())
        && struct_fields(schema).is_none()
}

/// The schema of the value under `key` of an object of schema `schema`: the field's (the field
/// Go's decoder reads it as, [`go_fold`]), or a map's values'.
fn child_schema<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    match struct_fields(schema) {
        Some(fields) => fields.get(key).or_else(|| {
            fields
                .iter()
                .find(|(f, _)| go_fold(f) == go_fold(key))
                .map(|(_, s)| s)
        }),
        None => schema?.get("additionalProperties"),
    }
    .map(resolved)
}

fn child_path(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// The keys of `original` (a Pod as JSON) that `typed` (the same value decoded into a typed
/// object and encoded again) lost, as paths such as `spec.HostNetwork`. A key the typed
/// decoder does not know is dropped by it; vCluster's decoder (Go's `encoding/json`) matches
/// keys to fields case-insensitively, so such a key can still set a field there
/// (`HostNetwork` sets `hostNetwork`): a hooked object with a lost key is not judged by its
/// typed view. A `null` under a field of the typed view is no key (both decoders leave the
/// field unset); a `null` under a key that is no field of its struct (the typed view's schema) is lost,
/// since Go's decoder may unset the field it folds to: `automountſerviceAccountToken: null`
/// beside `automountServiceAccountToken: false` (the security review's finding F3).
pub fn lost_keys(original: &Value, typed: &Value) -> Vec<String> {
    fn walk(o: &Value, t: &Value, schema: Option<&Value>, at: &str, out: &mut Vec<String>) {
        match (o, t) {
            (Value::Object(o), Value::Object(t)) => {
                let fields = struct_fields(schema);
                for (k, v) in o {
                    let path = child_path(at, k);
                    if v.is_null() {
                        if fields.is_some_and(|f| !f.contains_key(k)) {
                            out.push(path);
                        }
                        continue;
                    }
                    match t.get(k) {
                        Some(tv) => walk(v, tv, child_schema(schema, k), &path, out),
                        None => out.push(path),
                    }
                }
            }
            (Value::Array(o), Value::Array(t)) => {
                let items = schema.and_then(|s| s.get("items")).map(resolved);
                for (i, v) in o.iter().enumerate() {
                    match t.get(i) {
                        Some(tv) => walk(v, tv, items, &format!("{at}[{i}]"), out),
                        None => out.push(format!("{at}[{i}]")),
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(original, typed, Some(pod_schema()), "", &mut out);
    out
}

/// Two keys of one JSON object of `pod` (a Pod as JSON) that Go's `encoding/json` reads as the
/// same field, as `(object's path, key, other key)`: equal after [`go_fold`], in an object
/// that is a struct in Go (the typed view's schema; an object at a path the schema does not know is
/// taken for one). vCluster decodes a hook's result with it, and each key sets the field in
/// turn, so the last one in the text wins, while the typed view reads the key spelled as the
/// field. The security review's finding F3: a `spec` holding `automountServiceAccountToken:
/// false` and `automountſerviceAccountToken: null` (`ſ`, U+017F, folds to `s`; serde_json
/// writes it after the other) was judged `false`, and vCluster's decoder mounted the token.
/// Map keys (labels, annotations, `nodeSelector`, resource lists, ...) are matched exactly by
/// Go, so two keys of a map that fold alike are two keys.
pub fn folded_duplicate_keys(pod: &Value) -> Option<(String, String, String)> {
    fn walk(v: &Value, schema: Option<&Value>, at: &str) -> Option<(String, String, String)> {
        match v {
            Value::Object(o) => {
                if !is_map(schema) {
                    let mut seen: std::collections::BTreeMap<String, &String> =
                        std::collections::BTreeMap::new();
                    for k in o.keys() {
                        if let Some(first) = seen.insert(go_fold(k), k) {
                            return Some((at.to_string(), first.clone(), k.clone()));
                        }
                    }
                }
                o.iter()
                    .find_map(|(k, v)| walk(v, child_schema(schema, k), &child_path(at, k)))
            }
            Value::Array(a) => {
                let items = schema.and_then(|s| s.get("items")).map(resolved);
                a.iter()
                    .enumerate()
                    .find_map(|(i, v)| walk(v, items, &format!("{at}[{i}]")))
            }
            _ => None,
        }
    }
    walk(pod, Some(pod_schema()), "")
}
