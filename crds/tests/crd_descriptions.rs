//! Every field of the VClusterPlugin schema has a description, so `kubectl explain` is useful
//! at every level (`kubectl explain vclusterplugin.spec.hooks.jsonPatch`, ...).

use kube::CustomResourceExt;
use serde_json::Value;

/// Paths (`.spec.hooks[].events`, ...) of the schema properties without a description.
fn undocumented(node: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            let described = prop
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                out.push(here.clone());
            }
            undocumented(prop, &here, out);
        }
    }
    if let Some(items) = node.get("items") {
        undocumented(items, &format!("{path}[]"), out);
    }
    if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
        undocumented(values, &format!("{path}{{}}"), out);
    }
}

#[test]
fn every_vclusterplugin_field_has_a_description() {
    let crd = serde_json::to_value(vcp_crds::VClusterPlugin::crd()).expect("CRD as JSON");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for part in ["spec", "status"] {
        assert!(
            schema["properties"][part]["properties"]
                .as_object()
                .is_some_and(|p| !p.is_empty()),
            "the schema has no .{part} properties"
        );
    }
    let mut missing = Vec::new();
    undocumented(schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description (add a doc comment): {missing:#?}"
    );
}

/// Every `description` string of `node`, with its path.
fn descriptions(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("description", Value::String(d)) => out.push((path.to_string(), d.clone())),
                    _ => descriptions(v, &format!("{path}.{k}"), out),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                descriptions(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// A line break inside a paragraph that `kubectl explain` would print mid-sentence: a single
/// `\n` whose next line is neither indented nor a list item (`- `, `* `, `+ `, `1. `).
fn mid_paragraph_break(d: &str) -> Option<&str> {
    let lines: Vec<&str> = d.split('\n').collect();
    lines.windows(2).find_map(|w| {
        let (prev, next) = (w[0], w[1]);
        let digits = next.chars().take_while(char::is_ascii_digit).count();
        let starts_own_line = next.is_empty()
            || prev.is_empty()
            || next.starts_with(char::is_whitespace)
            || ["- ", "* ", "+ "].iter().any(|m| next.starts_with(m))
            || (digits > 0 && next[digits..].starts_with(". "));
        (!starts_own_line).then_some(next)
    })
}

#[test]
fn descriptions_have_no_line_breaks_inside_a_paragraph() {
    for (file, crd) in vcp_crds::crd_files() {
        let crd = serde_json::to_value(crd).expect("CRD as JSON");
        let mut all = Vec::new();
        descriptions(&crd, "", &mut all);
        assert!(all.len() > 5, "{file}: too few descriptions found: {all:?}");
        let broken: Vec<_> = all
            .iter()
            .filter_map(|(path, d)| {
                mid_paragraph_break(d).map(|line| format!("{path}: …\\n{line}"))
            })
            .collect();
        assert!(
            broken.is_empty(),
            "{file}: descriptions with a line break inside a paragraph (the paragraphs transform of crds/src/schema.rs should join them): {broken:#?}"
        );
    }
}

#[test]
fn the_break_detector_catches_a_wrapped_doc_comment() {
    assert_eq!(
        mid_paragraph_break("Events on which the hook runs (before a write to\nthe host)."),
        Some("the host).")
    );
    assert_eq!(mid_paragraph_break("One.\n\nTwo:\n- a\n  b"), None);
}
