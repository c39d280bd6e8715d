//! Unit tests of [`super::slim`]: which copies are slimmed, what the marker holds, and that a
//! slimmed copy's part size is the full one's in any workload.

use super::*;
use crate::workload::budget::WORKLOAD_BUDGET;
use serde_json::{Value, json};

/// A config of `n` keys of 100 characters each: about `n * 112` bytes of JSON, wide like the
/// attack's.
fn wide_config(n: usize, fill: char) -> Value {
    Value::Object(
        (0..n)
            .map(|i| {
                (
                    format!("k{i:06}"),
                    Value::String(fill.to_string().repeat(100)),
                )
            })
            .collect(),
    )
}

/// A v1 sidecar plugin of vCluster `vc` in `ns`, generation 3, with `config`.
fn plugin(name: &str, config: Option<Value>) -> VClusterPlugin {
    let mut p: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": name, "namespace": "ns", "generation": 3,
                     "finalizers": ["vcp.dev/cleanup"],
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"vcluster": {"name": "vc"}, "image": "registry.example.com/p:1",
                 "version": "v1", "env": [{"name": "A", "value": "b"}]}
    }))
    .expect("plugin");
    p.spec.config = config;
    p
}

/// The status the operator writes for a refusal of generation `generation`.
fn refused_at(p: &mut VClusterPlugin, generation: i64, status: &str) {
    p.status = Some(
        serde_json::from_value(json!({
            "observedGeneration": generation,
            "phase": "Failed",
            "conditions": [
                {"type": "Ready", "status": status, "reason": "PolicyDenied", "message": "m",
                 "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "WorkloadPatched", "status": status, "reason": "PolicyDenied",
                 "message": "m", "observedGeneration": generation,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]
        }))
        .expect("status"),
    );
}

/// A vCluster `vc` in `ns` that already holds `others`' parts (their containers in its pod
/// spec, as the operator's own apply left them) besides `syncer`.
fn workload_with(others: &[&VClusterPlugin]) -> Workload {
    let mut wl = probe_workload(&plugin("x", None));
    let planned = crate::workload::plan(&wl, others, "rt");
    let spec: PodSpec = serde_json::from_value(
        planned
            .patch
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(Value::Null),
    )
    .unwrap_or_default();
    wl.pod_spec.containers.extend(spec.containers);
    wl
}

#[test]
fn a_plugin_refused_for_its_generation_loses_its_config_and_keeps_its_size() {
    let full = plugin("p", Some(wide_config(2_000, 'x')));
    let mut slimmed = full.clone();
    refused_at(&mut slimmed, 3, "False");
    let dropped = slim(&mut slimmed, "rt").expect("slimmed");
    assert_eq!(dropped.why, Why::Refused);
    assert_eq!(slimmed.spec.config, None);
    assert!(is_slimmed(&slimmed));
    assert_eq!(super::dropped(&slimmed), Some(dropped.clone()));
    // the rest of the spec stays
    assert_eq!(slimmed.spec.env, full.spec.env);
    assert_eq!(slimmed.spec.image, full.spec.image);
    assert!(dropped.bytes > 2_000 * 100, "{}", dropped.bytes);
    // The budget measures the slimmed copy as the full one, in the probe and in a workload
    // where other v1 sidecars took ports before it (another port, another JSON length).
    let older = [plugin("a", None), plugin("b", None)];
    for wl in [
        probe_workload(&full),
        workload_with(&[&older[0], &older[1]]),
    ] {
        let size = part_size(&wl, &full, "rt");
        assert!(
            size > dropped.part_bytes && dropped.part_bytes > 200_000,
            "{size}"
        );
        assert_eq!(part_size(&wl, &slimmed, "rt"), size);
    }
}

#[test]
fn the_budget_refuses_the_slimmed_copy_with_the_full_ones_message() {
    // above the per-plugin budget: slimmed at first sight, without any status
    let full = plugin("big", Some(wide_config(9_000, 'x')));
    let mut slimmed = full.clone();
    let dropped = slim(&mut slimmed, "rt").expect("slimmed");
    assert_eq!(dropped.why, Why::TooLarge);
    assert!(dropped.part_bytes > PART_BUDGET);
    let wl = workload_with(&[]);
    let (kept_full, refused_full) = crate::workload::budget::admit(&wl, vec![&full], "rt");
    let (kept_slim, refused_slim) = crate::workload::budget::admit(&wl, vec![&slimmed], "rt");
    assert!(kept_full.is_empty() && kept_slim.is_empty());
    assert_eq!(refused_full, refused_slim);
    assert!(refused_slim["big"].message.contains("per plugin"));
}

#[test]
fn below_the_size_rule_and_not_refused_stays_full() {
    // a config whose part is just below the per-plugin budget, and no refusal in the status
    let mut p = plugin("p", Some(wide_config(7_000, 'x')));
    let part = part_size(&probe_workload(&p), &p, "rt");
    assert!(part < PART_BUDGET && part > WORKLOAD_BUDGET / 2, "{part}");
    assert_eq!(slim(&mut p, "rt"), None);
    assert!(p.spec.config.is_some() && !is_slimmed(&p));
    // installed (WorkloadPatched True): stays full
    refused_at(&mut p, 3, "True");
    assert_eq!(slim(&mut p, "rt"), None);
    assert!(p.spec.config.is_some());
}

#[test]
fn a_spec_changed_since_the_refusal_is_kept_full_to_be_judged() {
    // the status refused generation 2; the spec is at 3 (such as a smaller config)
    let mut p = plugin("p", Some(wide_config(2_000, 'x')));
    refused_at(&mut p, 2, "False");
    assert!(!refused_now(&p));
    assert_eq!(slim(&mut p, "rt"), None);
    assert!(p.spec.config.is_some());
}

#[test]
fn a_small_config_is_not_worth_dropping() {
    let mut p = plugin("p", Some(json!({"greeting": "hi"})));
    refused_at(&mut p, 3, "False");
    assert_eq!(slim(&mut p, "rt"), None);
    assert_eq!(p.spec.config, Some(json!({"greeting": "hi"})));
}

#[test]
fn a_change_of_config_is_a_change_of_the_slimmed_copy() {
    let slimmed = |fill: char| {
        let mut p = plugin("p", Some(wide_config(2_000, fill)));
        refused_at(&mut p, 3, "False");
        slim(&mut p, "rt").expect("slimmed");
        p
    };
    let (x, y) = (slimmed('x'), slimmed('y'));
    let (dx, dy) = (super::dropped(&x).unwrap(), super::dropped(&y).unwrap());
    assert_eq!((dx.bytes, dx.part_bytes), (dy.bytes, dy.part_bytes));
    assert_ne!(dx.sha256, dy.sha256);
    assert_ne!(x.metadata, y.metadata, "the cached copies differ");
}

#[test]
fn hook_values_are_dropped_too() {
    let mut p: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "h", "namespace": "ns", "generation": 1},
        "spec": {"vcluster": {"name": "vc"}, "hooks": [{
            "name": "h", "apiVersion": "v1", "kind": "ConfigMap", "events": ["CreateVirtual"],
            "jsonPatch": [{"op": "add", "path": "/data/x", "value": wide_config(500, 'z')}]
        }]}
    }))
    .expect("plugin");
    refused_at(&mut p, 1, "False");
    let dropped = slim(&mut p, "rt").expect("slimmed");
    assert_eq!(p.spec.hooks[0].json_patch[0].value, None);
    assert_eq!(p.spec.hooks[0].json_patch[0].path, "/data/x");
    // the embedded runtime's part carries no hook value
    assert_eq!(dropped.part_bytes, 0);
}

#[test]
fn a_slimmed_copy_stays_slimmed_when_it_passes_again() {
    // the cache's copy comes back through `slim` (the finalizer step's answer for a plugin
    // that has its finalizer is the cached copy): it keeps its marker, and so is read in full
    // before any install
    let mut p = plugin("p", Some(wide_config(2_000, 'x')));
    refused_at(&mut p, 3, "False");
    let first = slim(&mut p, "rt").expect("slimmed");
    assert_eq!(slim(&mut p, "rt"), None);
    assert!(is_slimmed(&p));
    assert_eq!(super::dropped(&p), Some(first));
}
