//! Hand-written schema fragments where a derived schema would not be structural.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `config`: any YAML object, kept as given (`x-kubernetes-preserve-unknown-fields`).
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A JSON Patch `value`: any JSON value (`x-kubernetes-preserve-unknown-fields` with
/// `x-kubernetes-int-or-string` is not enough, so no type is given; the API server accepts an
/// untyped schema only with preserve-unknown-fields).
pub fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// `[registry[:port]/]repository[:tag][@sha256:digest]`, lowercase repository components as in
/// the distribution reference grammar (schema `pattern` of `spec.image`).
pub const IMAGE_PATTERN: &str = r"^(([a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)(\.[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$";

/// A label or annotation key: optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, alphanumeric at both ends).
pub const KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A label value: empty, or at most 63 characters, alphanumeric at both ends.
pub const LABEL_VALUE_PATTERN: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";

/// The verbs a rule may name: the API server's resource verbs, the RBAC and certificate verbs,
/// and `*` (which the operator policy refuses unless widened). A custom verb is refused: a typo
/// such as `Get` or `gett` would otherwise grant nothing without a word.
pub const KNOWN_VERBS: [&str; 17] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "proxy",
    "use",
    "bind",
    "escalate",
    "impersonate",
    "approve",
    "sign",
    "attest",
    "*",
];

/// Most labels / annotations / keys a hook may set or remove (bounds CEL cost).
pub const MAX_KEYS: u32 = 32;

/// Labels to set: keys as [`KEY_PATTERN`], values as [`LABEL_VALUE_PATTERN`].
pub fn labels_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_KEYS,
        "additionalProperties": { "type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN },
        "x-kubernetes-validations": [{
            "rule": format!("self.all(k, size(k) <= 317 && k.matches('{}'))", KEY_PATTERN.replace('\\', "\\\\")),
            "message": "every key must be a label key: an optional DNS subdomain prefix and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends",
        }],
    })
}

/// Annotations to set: keys as [`KEY_PATTERN`], any string values.
pub fn annotations_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_KEYS,
        "additionalProperties": { "type": "string", "maxLength": 65536 },
        "x-kubernetes-validations": [{
            "rule": format!("self.all(k, size(k) <= 317 && k.matches('{}'))", KEY_PATTERN.replace('\\', "\\\\")),
            "message": "every key must be an annotation key: an optional DNS subdomain prefix and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends",
        }],
    })
}

/// Most values of one `matchExpressions` entry of a selector (bounds CEL cost).
pub const MAX_SELECTOR_VALUES: u32 = 64;

/// A label selector (`syncedTypes[].selector`), checked as Kubernetes checks one
/// (`ValidateLabelSelector` in `k8s.io/apimachinery/pkg/apis/meta/v1/validation`): `matchLabels`
/// keys are label keys ([`KEY_PATTERN`]) and values label values ([`LABEL_VALUE_PATTERN`]);
/// a `matchExpressions` entry has a label key, an operator among `In`, `NotIn`, `Exists`,
/// `DoesNotExist`, at least one value for `In` / `NotIn` and none for `Exists` /
/// `DoesNotExist`, each value a label value. So `kubectl apply` refuses a selector the
/// runtime could not use.
pub fn label_selector(_: &mut SchemaGenerator) -> Schema {
    let value =
        serde_json::json!({ "type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN });
    json_schema!({
        "type": "object",
        "description": "Only source objects matching this label selector are synced (a standard label selector: matchLabels and matchExpressions, ANDed). Objects that stop matching (relabelled, or the selector narrowed) are treated as vCluster treats an object that leaves a sync selector: the copy is deleted, with a log line and an Event.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels the object must carry with these values.",
                "maxProperties": MAX_KEYS,
                "additionalProperties": value,
                "x-kubernetes-validations": [{
                    "rule": format!("self.all(k, size(k) <= 317 && k.matches('{}'))", KEY_PATTERN.replace('\\', "\\\\")),
                    "message": "every matchLabels key must be a label key: an optional DNS subdomain prefix and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends",
                }],
            },
            "matchExpressions": {
                "type": "array",
                "description": "Requirements on the object's labels.",
                "maxItems": MAX_KEYS,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": { "type": "string", "maxLength": 317, "pattern": KEY_PATTERN, "description": "The label key." },
                        "operator": { "type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"], "description": "In, NotIn, Exists or DoesNotExist." },
                        "values": { "type": "array", "maxItems": MAX_SELECTOR_VALUES, "items": value, "description": "At least one for In and NotIn; none for Exists and DoesNotExist." },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                        "message": "operators In and NotIn need at least one value; Exists and DoesNotExist take no values",
                    }],
                },
            },
        },
    })
}

/// Label / annotation keys to remove: each as [`KEY_PATTERN`], no duplicates.
pub fn key_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_KEYS,
        "x-kubernetes-list-type": "set",
        "items": { "type": "string", "maxLength": 317, "pattern": KEY_PATTERN },
    })
}

/// Most rules in one `extraRules` list.
pub const MAX_RULES: u32 = 64;

fn string_list(description: &str, max: u32) -> serde_json::Value {
    serde_json::json!({
        "type": "array",
        "description": description,
        "maxItems": max,
        "items": { "type": "string", "maxLength": 253 },
    })
}

/// `extraRules` of `rbac.role` and `rbac.clusterRole`: PolicyRules with known verbs
/// ([`KNOWN_VERBS`]) and bounded lists (CEL cost); a rule names resources or nonResourceURLs,
/// never both. (`nonResourceURLs` in `rbac.role` is refused by a root rule.)
pub fn policy_rules(_: &mut SchemaGenerator) -> Schema {
    let rule_checks = serde_json::json!([
        {
            "rule": "has(self.resources) != has(self.nonResourceURLs)",
            "message": "a rule names either resources (with apiGroups) or nonResourceURLs",
        },
        {
            "rule": "!has(self.nonResourceURLs) || (!has(self.apiGroups) && !has(self.resourceNames))",
            "message": "a nonResourceURLs rule names no apiGroups or resourceNames",
        },
    ]);
    let verbs = serde_json::json!({
        "type": "array",
        "description": "Verbs the rule grants: get, list, watch, create, update, patch, delete, deletecollection, proxy, use, bind, escalate, impersonate, approve, sign, attest, or `*`.",
        "minItems": 1,
        "maxItems": 17,
        "items": { "type": "string", "enum": KNOWN_VERBS },
    });
    json_schema!({
        "type": "array",
        "maxItems": MAX_RULES,
        "items": {
            "type": "object",
            "description": "A Kubernetes RBAC PolicyRule.",
            "required": ["verbs"],
            "properties": {
                "apiGroups": string_list("API groups of the resources (`\"\"` is the core group).", 32),
                "nonResourceURLs": string_list("Non-resource URLs such as `/healthz` (cluster rules only).", 32),
                "resourceNames": string_list("Names the rule is restricted to; empty means all.", 64),
                "resources": string_list("Resources (plural names, `resource/subresource` for a subresource).", 32),
                "verbs": verbs,
            },
            "x-kubernetes-validations": rule_checks,
        },
    })
}

/// `group/version` or `version` (core group), such as `example.loft.sh/v1` or `v1beta2`.
pub const API_VERSION_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$";

/// A kind: CamelCase, such as `Car`.
pub const KIND_PATTERN: &str = r"^[A-Z][A-Za-z0-9]*$";

/// An RFC 6901 JSON Pointer: empty, or `/`-separated tokens with `~` only as `~0` / `~1`.
pub const JSON_POINTER_PATTERN: &str = r"^(/([^~/]|~[01])*)*$";

/// Container transform (`#[schemars(transform = crate::schema::paragraphs)]`) that makes every
/// `description` below the type read well in `kubectl explain`: doc comments are wrapped at
/// ~100 columns, and `kubectl explain` would print those hard line breaks mid-sentence. See
/// [`join_wrapped_lines`] for what is kept.
pub fn paragraphs(schema: &mut Schema) {
    if let Some(serde_json::Value::String(d)) = schema.get_mut("description") {
        *d = join_wrapped_lines(d);
    }
    schemars::transform::transform_subschemas(&mut paragraphs, schema);
}

/// Joins the wrapped lines of each paragraph of `text` with a space. Kept as they are: blank
/// lines between paragraphs (collapsed to one), and the line break before a line that is
/// indented or starts a list item (`- `, `* `, `+ `, `1. `), as in the Kubernetes API's own
/// descriptions ("Valid options are:\n  Localhost - ...").
pub fn join_wrapped_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_pending = false;
    for line in text.trim().lines() {
        if line.trim().is_empty() {
            blank_pending = true;
            continue;
        }
        if out.is_empty() {
            out.push_str(line.trim_end());
        } else if blank_pending {
            out.push_str("\n\n");
            out.push_str(line.trim_end());
        } else if keeps_its_line(line) {
            out.push('\n');
            out.push_str(line.trim_end());
        } else {
            out.push(' ');
            out.push_str(line.trim());
        }
        blank_pending = false;
    }
    out
}

/// A line that starts a line of its own: indented, or a list item.
pub fn keeps_its_line(line: &str) -> bool {
    if line.starts_with(char::is_whitespace) {
        return true;
    }
    if ["- ", "* ", "+ "].iter().any(|m| line.starts_with(m)) {
        return true;
    }
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && line[digits..].starts_with(". ")
}

#[cfg(test)]
mod tests {
    use super::join_wrapped_lines;

    #[test]
    fn wrapped_lines_become_one_paragraph() {
        assert_eq!(
            join_wrapped_lines(
                "Events on which the hook runs: `A` (before a write to\nthe host), `B`."
            ),
            "Events on which the hook runs: `A` (before a write to the host), `B`."
        );
    }

    #[test]
    fn paragraphs_lists_and_indented_lines_are_kept() {
        assert_eq!(
            join_wrapped_lines(
                "First\nparagraph.\n\n\nSecond:\n- one\n- two\nwrapped\n  Indented\n1. item"
            ),
            "First paragraph.\n\nSecond:\n- one\n- two wrapped\n  Indented\n1. item"
        );
        assert_eq!(join_wrapped_lines("  one line  \n"), "one line");
        assert_eq!(join_wrapped_lines(""), "");
    }
}
