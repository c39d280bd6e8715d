use super::*;
use vcp_crds::PluginVersion;
use vcp_crds::{JsonPatchOperation, VClusterPluginSpec, VClusterRef};

const NS: &str = "team-a";
const VC: &str = "my-vcluster";
const SA: &str = "vc-my-vcluster";

fn op(op: JsonPatchOp, path: &str, value: Value) -> JsonPatchOperation {
    JsonPatchOperation {
        op,
        path: path.into(),
        from: None,
        value: (!value.is_null()).then_some(value),
    }
}

fn hook(name: &str, kind: &str, events: Vec<HookEvent>, ops: Vec<JsonPatchOperation>) -> Hook {
    Hook {
        name: name.into(),
        api_version: "v1".into(),
        kind: kind.into(),
        events,
        json_patch: ops,
        ..Hook::default()
    }
}

fn pod_hook(name: &str, ops: Vec<JsonPatchOperation>) -> Hook {
    hook(name, "Pod", vec![HookEvent::CreatePhysical], ops)
}

fn plugin(name: &str, version: Option<PluginVersion>, hooks: Vec<Hook>) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        name,
        VClusterPluginSpec {
            vcluster: VClusterRef { name: VC.into() },
            version,
            hooks,
            ..Default::default()
        },
    );
    p.metadata.namespace = Some(NS.into());
    p
}

fn judged(plugins: &[&VClusterPlugin]) -> Judged {
    judge(&ContainerPolicy::default(), plugins, NS, VC, SA)
}

fn refusal_of(p: &VClusterPlugin) -> String {
    let j = judged(&[p]);
    assert!(j.steps.is_empty(), "a refused plugin's pod is no step");
    j.refused
        .get(&p.name_any())
        .unwrap_or_else(|| panic!("{} not refused", p.name_any()))
        .message
        .clone()
}

#[test]
fn v2_plugins_hook_first_in_folder_order_then_the_sidecars() {
    let (a, b, c, d) = (
        plugin("b-v2", Some(PluginVersion::V2), vec![]),
        plugin("a-sidecar", None, vec![]),
        plugin("a-v2", Some(PluginVersion::V2), vec![]),
        plugin("c-sidecar", Some(PluginVersion::V1), vec![]),
    );
    let order: Vec<String> = hook_order(&[&a, &b, &c, &d])
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(order, ["a-v2", "b-v2", "a-sidecar", "c-sidecar"]);
}

#[test]
fn a_privileged_pod_hook_is_refused_naming_the_hook_and_the_field() {
    let p = plugin(
        "evil",
        None,
        vec![pod_hook(
            "root-everywhere",
            vec![op(
                JsonPatchOp::Add,
                "/spec/containers/0/securityContext",
                json!({"privileged": true}),
            )],
        )],
    );
    let m = refusal_of(&p);
    assert!(
        m.starts_with("spec.hooks[0] (root-everywhere, CreatePhysical on v1 Pod)"),
        "{m}"
    );
    assert!(
        m.contains("spec.containers[0].securityContext.privileged = true"),
        "{m}"
    );
}

#[test]
fn host_path_and_host_network_hooks_are_refused() {
    let p = plugin(
        "evil",
        Some(PluginVersion::V2),
        vec![pod_hook(
            "node-root",
            vec![op(
                JsonPatchOp::Add,
                "/spec/volumes",
                json!([{"name": "root", "hostPath": {"path": "/"}}]),
            )],
        )],
    );
    assert!(refusal_of(&p).contains("spec.volumes[0].hostPath"));
    let p = plugin(
        "evil",
        None,
        vec![pod_hook(
            "net",
            vec![op(JsonPatchOp::Add, "/spec/hostNetwork", json!(true))],
        )],
    );
    assert!(refusal_of(&p).contains("spec.hostNetwork = true"));
}

#[test]
fn field_names_are_judged_as_vclusters_decoder_reads_them() {
    // Go's encoding/json would set hostNetwork from HostNetwork.
    let p = plugin(
        "evil",
        None,
        vec![pod_hook(
            "net",
            vec![op(JsonPatchOp::Add, "/spec/HostNetwork", json!(true))],
        )],
    );
    assert!(
        refusal_of(&p).contains("writes spec.HostNetwork"),
        "{}",
        refusal_of(&p)
    );
    // Identity fields in another spelling, on a pod and on another kind.
    for path in [
        "/metadata/Finalizers",
        "/metadata/OwnerReferences",
        "/metadata/GenerateName",
        "/metadata/finalizer\u{17f}",
    ] {
        for kind in ["Pod", "ConfigMap"] {
            let p = plugin(
                "evil",
                None,
                vec![hook(
                    "h",
                    kind,
                    vec![HookEvent::CreatePhysical],
                    vec![op(JsonPatchOp::Add, path, json!(["example.com/stuck"]))],
                )],
            );
            let m = refusal_of(&p);
            assert!(m.contains("by vCluster's decoder"), "{kind} {path}: {m}");
        }
    }
    let p = plugin(
        "evil",
        None,
        vec![hook(
            "h",
            "ConfigMap",
            vec![HookEvent::CreateVirtual],
            vec![op(
                JsonPatchOp::Add,
                "/metadata/Labels",
                json!({"vcluster.loft.sh/managed-by": "other"}),
            )],
        )],
    );
    assert!(
        refusal_of(&p).contains("metadata.Labels"),
        "{}",
        refusal_of(&p)
    );
    let p = plugin(
        "evil",
        None,
        vec![hook(
            "h",
            "ConfigMap",
            vec![HookEvent::UpdatePhysical],
            vec![op(JsonPatchOp::Add, "/Metadata", json!({"name": "x"}))],
        )],
    );
    assert!(
        refusal_of(&p).contains("is read as metadata"),
        "{}",
        refusal_of(&p)
    );
}

#[test]
fn identity_and_tracking_keys_may_not_change() {
    for (path, value, field) in [
        ("/metadata/name", json!("other"), "metadata.name"),
        (
            "/metadata/ownerReferences/0/uid",
            json!("forged"),
            "metadata.ownerReferences",
        ),
        (
            "/metadata/labels/vcluster.loft.sh~1managed-by",
            json!("other"),
            "metadata.labels[\"vcluster.loft.sh/managed-by\"]",
        ),
    ] {
        let p = plugin(
            "evil",
            None,
            vec![hook(
                "h",
                "ConfigMap",
                vec![HookEvent::CreatePhysical],
                vec![op(JsonPatchOp::Replace, path, value)],
            )],
        );
        let m = refusal_of(&p);
        assert!(m.contains(&format!("changes {field}")), "{path}: {m}");
    }
    // An operation that fails on the representative object is judged by its path.
    let p = plugin(
        "evil",
        None,
        vec![hook(
            "h",
            "ConfigMap",
            vec![HookEvent::CreatePhysical],
            vec![op(
                JsonPatchOp::Add,
                "/metadata/OwnerReferences/7/uid",
                json!("x"),
            )],
        )],
    );
    assert!(refusal_of(&p).contains("writes \"/metadata/OwnerReferences/7/uid\""));
}

/// vCluster translates a virtual object's `release` label (v0.30 `translate.HostLabel`), so no
/// virtual pod reaches the host with one; the chart's Service selects the vCluster's own pods
/// by `app: vcluster` and `release: <name>`. A hook giving the host pods both would make them
/// endpoints of the virtual cluster's API server: refused by either route.
#[test]
fn a_pod_hook_may_not_give_pods_the_release_label() {
    let by_labels = plugin(
        "join-service",
        None,
        vec![Hook {
            name: "h".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            events: vec![HookEvent::CreatePhysical],
            labels: [("app", "vcluster"), ("release", VC)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Hook::default()
        }],
    );
    let by_patch = plugin(
        "join-service-patch",
        None,
        vec![pod_hook(
            "h",
            vec![op(JsonPatchOp::Add, "/metadata/labels/release", json!(VC))],
        )],
    );
    for p in [&by_labels, &by_patch] {
        let m = refusal_of(p);
        assert!(
            m.contains("changes metadata.labels[\"release\"]")
                && m.contains("the vCluster's own Service selects its pods by it"),
            "{m}"
        );
    }
    // `app: vcluster` alone, which a virtual pod may carry too, is no refusal.
    let app_only = plugin(
        "app-only",
        None,
        vec![pod_hook(
            "h",
            vec![op(
                JsonPatchOp::Add,
                "/metadata/labels/app",
                json!("vcluster"),
            )],
        )],
    );
    assert!(judged(&[&app_only]).refused.is_empty());
}

#[test]
fn protected_pointers_match_the_crd_rule() {
    for p in [
        "",
        "/metadata",
        "/Metadata",
        "/metadata/Labels",
        "/metadata/finalizers/0",
        "/metadata/OWNERREFERENCES/0/uid",
        "/metadata/labels/vcluster.loft.sh~1managed-by",
        "/metadata/Annotations/vcluster.loft.sh~1object-name",
        "/metadata/labels/release",
        "/metadata/Labels/Release",
        "/metadata/namespace",
        "/metadata/generate\u{212a}ame"
            .replace('\u{212a}', "N")
            .as_str(),
    ] {
        assert!(protected_pointer(p), "{p:?}");
    }
    for p in [
        "/metadata/labels/team",
        "/metadata/labels/released",
        "/metadata/annotations/release",
        "/metadata/labels/vcluster.loft.sh~01x",
        "/metadata/names",
        "/spec/containers/0/image",
    ] {
        assert!(!protected_pointer(p), "{p:?}");
    }
}

#[test]
fn a_harmless_hook_passes_and_its_pod_is_a_step() {
    let p = plugin(
        "team-label",
        None,
        vec![Hook {
            labels: [("team".to_string(), "a".to_string())].into(),
            ..pod_hook(
                "label",
                vec![
                    op(JsonPatchOp::Test, "/metadata/labels/app", json!("web")),
                    op(
                        JsonPatchOp::Add,
                        "/spec/containers/0/env",
                        json!([{"name": "TEAM", "value": "a"}]),
                    ),
                ],
            )
        }],
    );
    let j = judged(&[&p]);
    assert!(j.refused.is_empty(), "{:?}", j.refused);
    assert_eq!(j.steps.len(), 1);
    let pod = &j.steps[0].1;
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["team"], "a");
    assert_eq!(
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()[0]
            .name,
        "TEAM"
    );
    // A hook on another kind that leaves identity alone passes too.
    let c = plugin(
        "cm",
        None,
        vec![hook(
            "h",
            "ConfigMap",
            vec![HookEvent::CreatePhysical],
            vec![op(JsonPatchOp::Add, "/data", json!({"x": "1"}))],
        )],
    );
    assert!(judged(&[&c]).refused.is_empty());
}

#[test]
fn a_pod_hook_failing_on_the_representative_pod_is_refused() {
    let p = plugin(
        "broken",
        None,
        vec![pod_hook(
            "second-container",
            vec![op(
                JsonPatchOp::Add,
                "/spec/containers/3/securityContext",
                json!({"privileged": true}),
            )],
        )],
    );
    assert!(refusal_of(&p).contains("fails on a representative pod"));
}

#[test]
fn a_refused_plugins_hooks_are_left_out_for_the_others() {
    let bad = plugin(
        "a-bad",
        Some(PluginVersion::V2),
        vec![pod_hook(
            "net",
            vec![op(JsonPatchOp::Add, "/spec/hostNetwork", json!(true))],
        )],
    );
    let good = plugin(
        "b-good",
        Some(PluginVersion::V2),
        vec![pod_hook(
            "env",
            vec![op(
                JsonPatchOp::Add,
                "/spec/containers/0/env",
                json!([{"name": "A", "value": "1"}]),
            )],
        )],
    );
    let j = judged(&[&good, &bad]);
    assert_eq!(j.refused.keys().collect::<Vec<_>>(), ["a-bad"]);
    assert_eq!(j.steps.len(), 1);
    assert_eq!(j.steps[0].0, "b-good");
    assert_ne!(j.steps[0].1.spec.as_ref().unwrap().host_network, Some(true));
}

#[test]
fn the_representative_pod_passes_the_pod_policy() {
    let before = representative_pod(NS, VC);
    let typed: Pod = serde_json::from_value(before.clone()).unwrap();
    pod::check(&ContainerPolicy::default(), &typed, &typed).unwrap();
    let round = serde_json::to_value(&typed).unwrap();
    assert!(lost_keys(&before, &round).is_empty());
    assert_eq!(identity_change(&before, &before), None);
}

/// The security review's finding F4: vCluster enforces its node selector and tolerations on
/// the host pods, and a v2 plugin's hooks run after its translation; a hook replacing them put
/// the tenant's pods on control-plane or other tenants' nodes. Any write of the scheduling
/// fields is refused, `null` and a whole `spec` without them included (the representative pod
/// holds [`UNWRITTEN`] in each).
#[test]
fn a_write_of_a_scheduling_field_is_refused_whatever_the_value() {
    let control_plane = json!({"node-role.kubernetes.io/control-plane": ""});
    let anywhere = json!({"operator": "Exists"});
    let cases = [
        (
            "nodeSelector",
            JsonPatchOp::Replace,
            "/spec/nodeSelector",
            control_plane.clone(),
        ),
        (
            "nodeSelector",
            JsonPatchOp::Replace,
            "/spec/nodeSelector",
            Value::Null,
        ),
        (
            "nodeSelector",
            JsonPatchOp::Add,
            "/spec/nodeSelector/team",
            json!("a"),
        ),
        (
            "tolerations",
            JsonPatchOp::Add,
            "/spec/tolerations/-",
            anywhere.clone(),
        ),
        (
            "tolerations",
            JsonPatchOp::Replace,
            "/spec/tolerations",
            json!([anywhere]),
        ),
        (
            "tolerations",
            JsonPatchOp::Replace,
            "/spec/tolerations",
            Value::Null,
        ),
        (
            "affinity",
            JsonPatchOp::Replace,
            "/spec/affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}]}}}),
        ),
        (
            "affinity",
            JsonPatchOp::Remove,
            "/spec/affinity",
            Value::Null,
        ),
        (
            "topologySpreadConstraints",
            JsonPatchOp::Replace,
            "/spec/topologySpreadConstraints",
            Value::Null,
        ),
        (
            "schedulerName",
            JsonPatchOp::Replace,
            "/spec/schedulerName",
            json!("my-scheduler"),
        ),
        (
            "schedulerName",
            JsonPatchOp::Replace,
            "/spec/schedulerName",
            Value::Null,
        ),
    ];
    for (field, op_, path, value) in cases {
        let mut operation = op(op_, path, Value::Null);
        if op_ != JsonPatchOp::Remove {
            operation.value = Some(value.clone());
        }
        let p = plugin(
            "evil",
            Some(PluginVersion::V2),
            vec![pod_hook("h", vec![operation])],
        );
        let m = refusal_of(&p);
        assert!(
            m.starts_with(&format!(
                "spec.hooks[0] (h, CreatePhysical on v1 Pod) makes the vCluster's pods carry spec.{field} "
            )) && m.contains(&format!("a hook may not write spec.{field}, with any value")),
            "{path} {value}: {m}"
        );
    }
    // A whole `spec` that keeps every other field of the representative pod but leaves the
    // scheduling fields out: nothing the typed view of a pod without them would see.
    let mut spec = representative_pod(NS, VC)["spec"].clone();
    for field in [
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
    ] {
        spec.as_object_mut().unwrap().remove(field);
    }
    let p = plugin(
        "evil",
        Some(PluginVersion::V2),
        vec![pod_hook("h", vec![op(JsonPatchOp::Replace, "/spec", spec)])],
    );
    assert!(
        refusal_of(&p).contains("carry spec.nodeSelector = absent"),
        "{}",
        refusal_of(&p)
    );
}

#[test]
fn the_shipped_hooks_only_sample_passes() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/samples/hooks-only-plugin.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let sample: VClusterPlugin = serde_yaml::from_str(&text).unwrap();
    let j = judged(&[&sample]);
    assert!(j.refused.is_empty(), "{:?}", j.refused);
    let pod = &j.steps[0].1;
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()["cost-center"],
        "platform"
    );
    assert_eq!(pod.spec.as_ref().unwrap().enable_service_links, Some(false));
}

/// An attacker's hooks: with `version: v2` vCluster applies physical
/// hooks to the host object before it creates it, and each of these made one Kubernetes acts
/// on (vCluster v0.30.0's loader returned exactly these objects). Refused whatever they write;
/// a ConfigMap hook, a Pod hook and a virtual-side hook on a Secret pass this rule.
#[test]
fn physical_hooks_on_kinds_kubernetes_acts_on_are_refused() {
    for (kind, path, value) in [
        (
            "Secret",
            "/metadata/annotations/kubernetes.io~1service-account.name",
            json!("vc-my-vcluster"),
        ),
        ("Secret", "/metadata/labels/team", json!("a")),
        ("PersistentVolumeClaim", "/metadata/labels/team", json!("a")),
        ("Service", "/metadata/labels/team", json!("a")),
    ] {
        for event in [HookEvent::CreatePhysical, HookEvent::UpdatePhysical] {
            let p = plugin(
                "evil",
                Some(PluginVersion::V2),
                vec![hook(
                    "h",
                    kind,
                    vec![event],
                    vec![op(JsonPatchOp::Add, path, value.clone())],
                )],
            );
            let m = refusal_of(&p);
            assert!(
                m.starts_with(&format!("spec.hooks[0] (h, {event:?} on v1 {kind}) changes host objects of a kind Kubernetes acts on")),
                "{kind} {path}: {m}"
            );
        }
    }
    let mut apps = hook(
        "h",
        "Deployment",
        vec![HookEvent::CreatePhysical],
        vec![op(JsonPatchOp::Add, "/metadata/labels/a", json!("b"))],
    );
    apps.api_version = "apps/v1".into();
    assert!(refusal_of(&plugin("evil", None, vec![apps])).contains("changes host objects"));
    for ok in [
        hook(
            "h",
            "ConfigMap",
            vec![HookEvent::CreatePhysical],
            vec![op(JsonPatchOp::Add, "/metadata/labels/a", json!("b"))],
        ),
        hook(
            "h",
            "Secret",
            vec![HookEvent::CreateVirtual],
            vec![op(JsonPatchOp::Add, "/metadata/labels/a", json!("b"))],
        ),
    ] {
        let p = plugin("fine", Some(PluginVersion::V2), vec![ok]);
        assert!(judged(&[&p]).refused.is_empty(), "{:?}", p.spec.hooks);
    }
}

fn copy_op(op_: JsonPatchOp, from: &str, path: &str) -> JsonPatchOperation {
    JsonPatchOperation {
        from: Some(from.into()),
        ..op(op_, path, Value::Null)
    }
}

/// The fifth fresh attacker: a `copy` or `move` writes what each real pod holds at `from`,
/// which the representative pod cannot show, so the judge saw a harmless value where real pods
/// get `privileged: true`, a host namespace, an automounted host token or an `Unconfined`
/// seccomp profile (every one of these pods is refused by `pod::check`, whose table names the
/// fields: the expected refusals come from there). A copy or move may only write one label or
/// annotation that is not protected.
#[test]
fn a_copy_or_move_may_write_only_one_label_or_annotation() {
    use JsonPatchOp::{Copy, Move};
    let escalation = "/spec/containers/0/securityContext/allowPrivilegeEscalation";
    for (op_, from, path) in [
        (
            Copy,
            escalation,
            "/spec/containers/0/securityContext/privileged",
        ),
        (Copy, escalation, "/spec/hostNetwork"),
        (Copy, escalation, "/spec/hostPID"),
        (Copy, escalation, "/spec/automountServiceAccountToken"),
        (
            Copy,
            "/metadata/labels/app",
            "/spec/securityContext/seccompProfile/type",
        ),
        (
            Move,
            "/metadata/labels/app",
            "/spec/containers/0/securityContext/procMount",
        ),
        (Copy, "/metadata/labels/app", "/Spec/HostIPC"),
        // seccomp / AppArmor annotations become profiles; in any spelling of the key
        (
            Copy,
            "/metadata/labels/app",
            "/metadata/annotations/seccomp.security.alpha.kubernetes.io~1pod",
        ),
        (
            Copy,
            "/metadata/labels/app",
            "/metadata/annotations/Container.AppArmor.security.beta.kubernetes.io~1c",
        ),
        // protected keys, and the maps as a whole (a map copied from the pod may hold any key)
        (Copy, "/metadata/labels/app", "/metadata/labels/release"),
        (Copy, "/spec/nodeSelector", "/metadata/labels"),
        (Copy, "/spec/nodeSelector", "/metadata/annotations"),
        (
            Copy,
            "/metadata/labels/app",
            "/metadata/labels/vcluster.loft.sh~1namespace",
        ),
        (Copy, "/metadata/labels/app", "/metadata/labels/a/b"),
    ] {
        let p = plugin(
            "copies",
            Some(PluginVersion::V2),
            vec![pod_hook("copy", vec![copy_op(op_, from, path)])],
        );
        let message = refusal_of(&p);
        assert!(
            message.contains(&format!(
                "copies a value of the vCluster's pods into {path:?}"
            )),
            "{path}: {message}"
        );
        assert!(
            message.starts_with("spec.hooks[0] (copy, CreatePhysical on v1 Pod)"),
            "{message}"
        );
    }
    // one plain label or annotation, from anywhere
    for (op_, from, path) in [
        (
            Copy,
            "/spec/containers/0/image",
            "/metadata/annotations/example.com~1image",
        ),
        (Copy, "/metadata/labels/app", "/metadata/labels/app-copy"),
        (Move, "/metadata/labels/app", "/metadata/annotations/app"),
    ] {
        let p = plugin(
            "copies",
            Some(PluginVersion::V2),
            vec![pod_hook("copy", vec![copy_op(op_, from, path)])],
        );
        let j = judged(&[&p]);
        assert!(j.refused.is_empty(), "{path}: {:?}", j.refused);
    }
}

#[test]
fn copy_destinations_follow_the_decoders_spelling() {
    assert!(copy_destination_allowed("/metadata/labels/team"));
    assert!(copy_destination_allowed(
        "/metadata/annotations/example.com~1x"
    ));
    assert!(!copy_destination_allowed("/metadata/Labels/Release"));
    assert!(!copy_destination_allowed(
        "/Metadata/annotations/seccomp.security.alpha.kubernetes.io~1pod"
    ));
    assert!(!copy_destination_allowed("/spec/containers/0/image"));
    assert!(!copy_destination_allowed("/metadata/name"));
    assert!(!copy_destination_allowed(""));
}

/// The security review's finding F2: the representative pod ran as the vCluster's pod
/// template's account, `vc-<vcluster>` (the control plane's), so a hook writing exactly that
/// account changed nothing there and passed, while every real pod (running as another
/// account) moved to the control plane's. The representative pod holds [`UNWRITTEN`] in each of
/// [`UNWRITTEN_FIELDS`] instead: any write of them is a change; and a write of `null`, which
/// the typed view reads as absent, is one too.
#[test]
fn a_write_of_an_identity_field_is_refused_whatever_the_value() {
    for field in [
        "serviceAccountName",
        "serviceAccount",
        "nodeName",
        "runtimeClassName",
        "priorityClassName",
    ] {
        for value in [json!(SA), json!("default"), Value::Null] {
            let p = plugin(
                "evil",
                Some(PluginVersion::V2),
                vec![pod_hook(
                    "h",
                    vec![JsonPatchOperation {
                        value: Some(value.clone()),
                        ..op(JsonPatchOp::Replace, &format!("/spec/{field}"), Value::Null)
                    }],
                )],
            );
            let m = refusal_of(&p);
            assert!(
                m.starts_with(&format!(
                    "spec.hooks[0] (h, CreatePhysical on v1 Pod) makes the vCluster's pods carry spec.{field} "
                )),
                "{field} {value}: {m}"
            );
            assert!(
                m.contains(&format!(
                    "a hook may not write spec.{field}, with any value"
                )) && m.contains("remove the operation that writes it")
                    && !m.contains(UNWRITTEN),
                "{field} {value}: {m}"
            );
        }
    }
    let p = plugin(
        "evil",
        None,
        vec![pod_hook(
            "h",
            vec![op(
                JsonPatchOp::Replace,
                "/spec/serviceAccountName",
                json!(SA),
            )],
        )],
    );
    assert!(
        refusal_of(&p).contains(&format!(
            "spec.serviceAccountName = \"{SA}\" is refused by the operator policy: the pods would run with a host service account of the hook's choosing"
        )),
        "{}",
        refusal_of(&p)
    );
    // `false`, the representative pod's value, is the one harmless write of the token's field.
    let p = plugin(
        "no-token",
        None,
        vec![pod_hook(
            "h",
            vec![op(
                JsonPatchOp::Replace,
                "/spec/automountServiceAccountToken",
                json!(false),
            )],
        )],
    );
    assert!(judged(&[&p]).refused.is_empty());
    for value in [json!(true), Value::Null] {
        let p = plugin(
            "token",
            None,
            vec![pod_hook(
                "h",
                vec![JsonPatchOperation {
                    value: Some(value),
                    ..op(
                        JsonPatchOp::Replace,
                        "/spec/automountServiceAccountToken",
                        Value::Null,
                    )
                }],
            )],
        );
        assert!(
            refusal_of(&p).contains("spec.automountServiceAccountToken"),
            "{}",
            refusal_of(&p)
        );
    }
}

/// The pods [`judge`] hands the API server carry the workload's account and none of
/// [`UNWRITTEN`]: ServiceAccount admission refuses a pod whose account does not exist.
#[test]
fn the_api_server_sees_the_workloads_account_not_the_unwritten_value() {
    let p = plugin(
        "env",
        None,
        vec![pod_hook(
            "h",
            vec![op(
                JsonPatchOp::Add,
                "/spec/containers/0/env",
                json!([{"name": "A", "value": "1"}]),
            )],
        )],
    );
    let j = judged(&[&p]);
    assert!(j.refused.is_empty(), "{:?}", j.refused);
    for pod in [&j.before, &j.steps[0].1] {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some(SA));
        let text = serde_json::to_string(pod).unwrap();
        assert!(!text.contains(UNWRITTEN), "{text}");
    }
}

/// The security review's finding F3: a `replace /spec` whose value holds both
/// `automountServiceAccountToken: false` and `automountſerviceAccountToken: null` was judged by
/// the typed view (`false`), while vCluster's decoder (Go's encoding/json, `ſ` folded to `s`,
/// the later key winning) mounted the host token.
#[test]
fn a_spec_with_two_spellings_of_one_field_is_refused() {
    let mut spec = representative_pod(NS, VC)["spec"].clone();
    spec["automount\u{17f}erviceAccountToken"] = Value::Null;
    assert_eq!(spec["automountServiceAccountToken"], json!(false));
    let p = plugin(
        "evil",
        Some(PluginVersion::V2),
        vec![pod_hook("h", vec![op(JsonPatchOp::Replace, "/spec", spec)])],
    );
    let m = refusal_of(&p);
    assert!(
        m.starts_with(
            "spec.hooks[0] (h, CreatePhysical on v1 Pod) writes both \"automountServiceAccountToken\" and \"automount\u{17f}erviceAccountToken\" in spec, which vCluster's decoder"
        ) && m.contains("write each field once"),
        "{m}"
    );
}
