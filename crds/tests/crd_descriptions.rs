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
