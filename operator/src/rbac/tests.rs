use std::collections::BTreeMap;
use vcp_crds::Reason;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, Subject};
use kube::ResourceExt;
use serde_json::Value;
use vcp_crds::{
    Hook, HookEvent, PLUGIN_NAME_LABEL, PLUGIN_NAMESPACE_LABEL, PluginRbac, RoleRules,
    SyncDirection, SyncedType, VClusterPlugin, VClusterPluginSpec, VClusterRef,
};

use super::objects::RBAC_GROUP;
use super::rules::{HOOK_VERBS, READ_VERBS, WRITE_VERBS, rule};
use super::*;

fn plugin(image: Option<&str>) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        "car-syncer",
        VClusterPluginSpec {
            vcluster: VClusterRef {
                name: "my-vcluster".into(),
            },
            image: image.map(String::from),
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("team-a".into());
    p.metadata.uid = Some("uid-1".into());
    p
}

fn cars() -> SyncedType {
    SyncedType {
        api_version: "example.loft.sh/v1".into(),
        kind: "Car".into(),
        ..Default::default()
    }
}

fn plurals() -> Plurals {
    Plurals::from([
        (
            ("example.loft.sh/v1".into(), "Car".into()),
            Served::namespaced("cars"),
        ),
        (("v1".into(), "Pod".into()), Served::namespaced("pods")),
    ])
}

/// The vCluster chart's default service account of release `my-vcluster`.
const SA: &str = "vc-my-vcluster";

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn names() {
    assert_eq!(service_account_name("my-vcluster"), "vc-my-vcluster");
    assert_eq!(role_name("car-syncer"), "vcp-plugin-car-syncer");
    assert_eq!(
        cluster_role_name("team-a", "car-syncer"),
        "vcp:team-a:car-syncer"
    );
    assert_eq!(group_of("v1"), "");
    assert_eq!(group_of("example.loft.sh/v1"), "example.loft.sh");
}

#[test]
fn synced_type_gets_write_verbs_on_host_and_nothing_cluster_wide() {
    let mut p = plugin(Some("img"));
    p.spec.synced_types = vec![cars()];
    let d = desired(&p, &plurals(), SA).unwrap();
    let role = d.role.unwrap();
    assert_eq!(
        role.rules.unwrap(),
        vec![PolicyRule {
            api_groups: Some(strs(&["example.loft.sh"])),
            resources: Some(strs(&["cars"])),
            verbs: strs(&WRITE_VERBS),
            ..Default::default()
        }]
    );
    assert_eq!(role.metadata.owner_references.unwrap()[0].uid, "uid-1");
    // The CRD is read in the virtual cluster only: no ClusterRole, which a tenant
    // could not create.
    assert!(d.cluster_role.is_none() && d.cluster_role_binding.is_none());
    assert!(cluster_rules(&p).is_empty());
}

#[test]
fn cluster_extra_rules_get_a_labelled_cluster_role() {
    let mut p = plugin(Some("img"));
    p.spec.rbac = Some(PluginRbac {
        cluster_role: Some(RoleRules {
            extra_rules: vec![rule(
                "apiextensions.k8s.io",
                &["customresourcedefinitions"],
                &READ_VERBS,
                None,
            )],
        }),
        ..Default::default()
    });
    let d = desired(&p, &plurals(), SA).unwrap();
    assert!(d.role.is_none(), "no namespaced rules: no Role");
    let cr = d.cluster_role.unwrap();
    assert_eq!(cr.metadata.name.as_deref(), Some("vcp:team-a:car-syncer"));
    assert_eq!(
        cr.rules.unwrap()[0].resources,
        Some(strs(&["customresourcedefinitions"]))
    );
    assert!(
        cr.metadata.owner_references.is_none(),
        "cluster-scoped: labels only"
    );
    assert_eq!(
        cr.metadata.labels.unwrap()[PLUGIN_NAMESPACE_LABEL],
        "team-a"
    );
    assert!(d.cluster_role_binding.is_some());
}

/// The requester admission policy decides from the spec alone which RBAC objects the operator
/// writes (`vcp_crds::admission::written_rbac`, the CEL of `vcp-plugin-requester-objects`); the
/// operator's derivation must agree for every shape of plugin, or an author could get an object
/// admission did not ask them about.
#[test]
fn admission_knows_which_rbac_objects_the_operator_writes() {
    let hook = |events: Vec<HookEvent>| Hook {
        name: "h".into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
        events,
        ..Default::default()
    };
    let extra = || RoleRules {
        extra_rules: vec![rule("", &["configmaps"], &["get"], None)],
    };
    let mut cases = Vec::new();
    for image in [None, Some("img")] {
        for version in [
            None,
            Some(vcp_crds::PluginVersion::V1),
            Some(vcp_crds::PluginVersion::V2),
        ] {
            for synced in [vec![], vec![cars()]] {
                for hooks in [
                    vec![],
                    vec![hook(vec![HookEvent::CreateVirtual])],
                    vec![hook(vec![HookEvent::UpdatePhysical])],
                ] {
                    for mode in [
                        vcp_crds::RbacMode::Dedicated,
                        vcp_crds::RbacMode::PatchVClusterRoles,
                    ] {
                        for (role, cluster) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            let mut p = plugin(image);
                            p.spec.version = version;
                            p.spec.synced_types = synced.clone();
                            p.spec.hooks = hooks.clone();
                            p.spec.rbac = Some(PluginRbac {
                                mode,
                                role: role.then(extra),
                                cluster_role: cluster.then(extra),
                            });
                            cases.push(p);
                        }
                    }
                }
            }
        }
    }
    for p in &cases {
        let d = desired(p, &plurals(), SA).unwrap();
        let namespaced = namespaced_rules(p, &plurals()).unwrap();
        let operator = vcp_crds::admission::WrittenRbac {
            role_and_binding: d.role.is_some() && d.role_binding.is_some(),
            patched_role: patches_vcluster_roles(p) && !namespaced.is_empty(),
            cluster_role_and_binding: d.cluster_role.is_some() && d.cluster_role_binding.is_some(),
        };
        assert_eq!(
            vcp_crds::admission::written_rbac(&p.spec),
            operator,
            "{:?}",
            p.spec
        );
        assert!(d.role.is_some() == d.role_binding.is_some());
    }
    assert_eq!(cases.len(), 288);
}

#[test]
fn from_host_is_read_only_and_explicit_resource_works_without_discovery() {
    let mut p = plugin(Some("img"));
    p.spec.synced_types = vec![SyncedType {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        resource: Some("configmaps".into()),
        direction: SyncDirection::FromHost,
        ..Default::default()
    }];
    // Discovered all the same (for its scope), but not needed when not served.
    assert_eq!(
        types_to_resolve(&p),
        vec![("v1".into(), "ConfigMap".into())]
    );
    let rules = namespaced_rules(&p, &Plurals::new()).unwrap();
    assert_eq!(rules[0].api_groups, Some(strs(&[""])));
    assert_eq!(rules[0].verbs, strs(&READ_VERBS));
    assert!(
        cluster_rules(&p).is_empty(),
        "core types need no CRD access"
    );
}

#[test]
fn cluster_scoped_types_are_refused_from_discoverys_scope() {
    // Kubernetes serves Namespace and Node cluster-scoped, Secret namespaced.
    let served = Plurals::from([
        (
            ("v1".into(), "Namespace".into()),
            Served::cluster_scoped("namespaces"),
        ),
        (
            ("v1".into(), "Node".into()),
            Served::cluster_scoped("nodes"),
        ),
        (
            ("v1".into(), "Secret".into()),
            Served::namespaced("secrets"),
        ),
    ]);
    let synced = |kind: &str, resource: Option<&str>| SyncedType {
        api_version: "v1".into(),
        kind: kind.into(),
        resource: resource.map(String::from),
        ..Default::default()
    };
    let mut p = plugin(Some("img"));
    p.spec.synced_types = vec![synced("Secret", None), synced("Namespace", None)];
    let err = desired(&p, &served, SA).unwrap_err();
    assert_eq!(err.reason, Reason::ClusterScopedType);
    assert!(
        err.message
            .starts_with("spec.syncedTypes[1] (v1 Namespace)"),
        "{}",
        err.message
    );
    // An explicit resource does not hide the scope.
    p.spec.synced_types = vec![synced("Namespace", Some("namespaces"))];
    assert_eq!(
        namespaced_rules(&p, &served).unwrap_err().reason,
        Reason::ClusterScopedType
    );
    // Nor does a hook.
    let mut p = plugin(Some("img"));
    p.spec.hooks = vec![Hook {
        name: "nodes".into(),
        api_version: "v1".into(),
        kind: "Node".into(),
        events: vec![HookEvent::UpdatePhysical],
        ..Default::default()
    }];
    let err = namespaced_rules(&p, &served).unwrap_err();
    assert_eq!(err.reason, Reason::ClusterScopedType);
    assert!(
        err.message.starts_with("spec.hooks[0] (v1 Node)"),
        "{}",
        err.message
    );
}

#[test]
fn the_bindings_subject_is_the_pod_templates_service_account() {
    let mut p = plugin(None);
    p.spec.synced_types = vec![cars()];
    p.spec.rbac = Some(PluginRbac {
        cluster_role: Some(RoleRules {
            extra_rules: vec![rule("", &["nodes"], &READ_VERBS, None)],
        }),
        ..Default::default()
    });
    let d = desired(&p, &plurals(), "custom-sa").unwrap();
    let custom = Subject {
        kind: "ServiceAccount".into(),
        name: "custom-sa".into(),
        namespace: Some("team-a".into()),
        api_group: None,
    };
    assert_eq!(
        d.role_binding.unwrap().subjects.unwrap(),
        vec![custom.clone()]
    );
    assert_eq!(
        d.cluster_role_binding.unwrap().subjects.unwrap(),
        vec![custom]
    );
}

#[test]
fn unknown_type_is_refused() {
    let mut p = plugin(Some("img"));
    p.spec.synced_types = vec![cars()];
    assert_eq!(
        types_to_resolve(&p),
        vec![("example.loft.sh/v1".into(), "Car".into())]
    );
    let err = desired(&p, &Plurals::new(), SA).unwrap_err();
    assert_eq!(err.reason, Reason::UnknownType);
    assert!(err.message.contains("Car"));
}

#[test]
fn physical_hooks_need_patch_on_the_hooked_resource() {
    let mut p = plugin(Some("img"));
    p.spec.hooks = vec![
        Hook {
            name: "label-pods".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            events: vec![HookEvent::CreatePhysical],
            ..Default::default()
        },
        Hook {
            name: "virtual-only".into(),
            api_version: "v1".into(),
            kind: "Secret".into(),
            events: vec![HookEvent::CreateVirtual],
            ..Default::default()
        },
    ];
    assert_eq!(types_to_resolve(&p), vec![("v1".into(), "Pod".into())]);
    let rules = namespaced_rules(&p, &plurals()).unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources, Some(strs(&["pods"])));
    assert_eq!(rules[0].verbs, strs(&HOOK_VERBS));
}

#[test]
fn embedded_runtime_may_read_plugins_and_patch_only_its_own_status() {
    let d = desired(&plugin(None), &Plurals::new(), SA).unwrap();
    let rules = d.role.unwrap().rules.unwrap();
    let status = rules
        .iter()
        .find(|r| r.resources == Some(strs(&["vclusterplugins/status"])))
        .unwrap();
    assert_eq!(status.resource_names, Some(strs(&["car-syncer"])));
    assert!(
        rules.iter().any(
            |r| r.resources == Some(strs(&["vclusterplugins"])) && r.verbs == strs(&READ_VERBS)
        )
    );
    let rb = d.role_binding.unwrap();
    assert_eq!(rb.role_ref.name, "vcp-plugin-car-syncer");
    assert_eq!(
        rb.subjects.unwrap(),
        vec![Subject {
            kind: "ServiceAccount".into(),
            name: "vc-my-vcluster".into(),
            namespace: Some("team-a".into()),
            api_group: None,
        }]
    );
    assert!(d.cluster_role.is_none() && d.cluster_role_binding.is_none());
}

#[test]
fn embedded_runtime_with_to_host_types_may_get_the_vcluster_service_only() {
    let services = |p: &VClusterPlugin| {
        desired(p, &plurals(), SA)
            .unwrap()
            .role
            .unwrap()
            .rules
            .unwrap()
            .into_iter()
            .filter(|r| r.resources == Some(strs(&["services"])))
            .collect::<Vec<_>>()
    };
    let mut p = plugin(None);
    assert!(services(&p).is_empty(), "nothing synced: no owner to read");
    p.spec.synced_types = vec![cars()];
    assert_eq!(
        services(&p),
        vec![PolicyRule {
            api_groups: Some(strs(&[""])),
            resources: Some(strs(&["services"])),
            verbs: strs(&["get"]),
            resource_names: Some(strs(&["my-vcluster"])),
            non_resource_urls: None,
        }]
    );
    let mut image = plugin(Some("img"));
    image.spec.synced_types = vec![cars()];
    assert!(
        services(&image).is_empty(),
        "an image plugin brings its own"
    );
}

#[test]
fn image_plugin_without_rules_gets_no_role() {
    assert_eq!(
        desired(&plugin(Some("img")), &Plurals::new(), SA).unwrap(),
        DesiredRbac::default()
    );
}

#[test]
fn extra_rules_are_appended_normalized_and_deduplicated() {
    let mut p = plugin(Some("img"));
    let secrets = PolicyRule {
        api_groups: Some(strs(&[""])),
        resources: Some(strs(&["secrets"])),
        verbs: strs(&["get"]),
        resource_names: Some(vec![]),
        non_resource_urls: None,
    };
    p.spec.rbac = Some(PluginRbac {
        role: Some(RoleRules {
            extra_rules: vec![secrets.clone(), secrets.clone()],
        }),
        cluster_role: Some(RoleRules {
            extra_rules: vec![PolicyRule {
                api_groups: Some(strs(&[""])),
                resources: Some(strs(&["nodes"])),
                verbs: strs(&["get"]),
                ..Default::default()
            }],
        }),
        ..Default::default()
    });
    let d = desired(&p, &Plurals::new(), SA).unwrap();
    let rules = d.role.unwrap().rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resource_names, None);
    assert_eq!(
        d.cluster_role.unwrap().rules.unwrap()[0].resources,
        Some(strs(&["nodes"]))
    );
    assert_eq!(d.cluster_role_binding.unwrap().role_ref.kind, "ClusterRole");
}

#[test]
fn matching_ignores_server_additions_and_catches_edits() {
    let mut p = plugin(None);
    p.spec.synced_types = vec![cars()];
    let want = desired(&p, &plurals(), SA).unwrap().role.unwrap();
    let mut live = want.clone();
    live.metadata.resource_version = Some("42".into());
    live.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("extra".into(), "x".into());
    assert!(role_matches(&live, &want));

    let mut edited = live.clone();
    edited.rules.as_mut().unwrap().pop();
    assert!(!role_matches(&edited, &want));

    let mut unlabelled = live.clone();
    unlabelled.metadata.labels = None;
    assert!(!role_matches(&unlabelled, &want));

    let mut orphan = live;
    orphan.metadata.owner_references = None;
    assert!(!role_matches(&orphan, &want));
}

fn chart_role() -> Role {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "vc-my-vcluster", "namespace": "team-a", "resourceVersion": "7",
                      "annotations": { "meta.helm.sh/release-name": "my-vcluster" } },
        "rules": [
            { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"] },
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"] },
        ],
    }))
    .unwrap()
}

/// Applies a merge patch as the API server does, checking the resourceVersion precondition.
fn apply_patch(role: &Role, patch: &Value) -> Role {
    fn merge(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }
    let mut doc = serde_json::to_value(role).unwrap();
    assert_eq!(
        patch["metadata"]["resourceVersion"], doc["metadata"]["resourceVersion"],
        "precondition"
    );
    merge(&mut doc, patch);
    serde_json::from_value(doc).unwrap()
}

/// `role` with `patch_role(role, plugin, others, rules)`'s patch applied; panics when there is
/// nothing to patch.
fn with_patch(role: &Role, plugin: &str, others: &[String], rules: Option<&[PolicyRule]>) -> Role {
    apply_patch(role, &patch_role(role, plugin, others, rules).unwrap())
}

/// `role` with `restore_role(role, plugin, others)`'s patch applied; panics when there is
/// nothing to restore.
fn with_restore(role: &Role, plugin: &str, others: &[String]) -> Role {
    apply_patch(role, &restore_role(role, plugin, others).unwrap())
}

/// The two Roles serialize to the same bytes (the chart's Role back byte for byte).
fn assert_same_bytes(got: &Role, want: &Role) {
    assert_eq!(
        serde_json::to_string(got).unwrap(),
        serde_json::to_string(want).unwrap()
    );
}

/// The annotation value of a [`Record`] (`added`, `present`), as the operator writes it.
fn record_json(added: &[PolicyRule], present: &[PolicyRule]) -> String {
    serde_json::json!({ "added": added, "present": present }).to_string()
}

#[test]
fn patch_mode_appends_records_and_restores_exactly() {
    let original = chart_role();
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let patch = patch_role(
        &original,
        "car-syncer",
        &[],
        Some(std::slice::from_ref(&cars)),
    )
    .unwrap();
    assert_eq!(patch["metadata"]["resourceVersion"], "7");
    let installed = apply_patch(&original, &patch);
    let rules = installed.rules.clone().unwrap();
    assert_eq!(rules.len(), 3);
    assert_eq!(rules[..2], original.rules.clone().unwrap()[..]);
    assert_eq!(rules[2], cars);
    assert_eq!(
        installed.annotations()["vcp.dev/added-rules.car-syncer"],
        record_json(std::slice::from_ref(&cars), &[])
    );
    assert_eq!(
        patch_role(
            &installed,
            "car-syncer",
            &[],
            Some(std::slice::from_ref(&cars))
        ),
        None,
        "converged"
    );

    // A second plugin needing the same rule (it records it as present, appending nothing),
    // then the first one leaving: the second one appends it again.
    let both = with_patch(&installed, "other", &[], Some(std::slice::from_ref(&cars)));
    assert_eq!(both.rules, installed.rules);
    let first_gone = with_restore(&both, "car-syncer", &[]);
    assert_eq!(first_gone.rules, original.rules);
    let first_gone = with_patch(&first_gone, "other", &[], Some(std::slice::from_ref(&cars)));
    assert_eq!(first_gone.rules.as_ref().unwrap().len(), 3);
    let all_gone = with_restore(&first_gone, "other", &[]);
    assert_eq!(
        serde_json::to_value(&all_gone).unwrap(),
        serde_json::to_value(&original).unwrap()
    );
    assert_eq!(
        restore_role(&original, "car-syncer", &[]),
        None,
        "nothing to restore"
    );
}

#[test]
fn patch_mode_changed_rules_replace_the_recorded_ones_and_keep_foreign_edits() {
    let mut role = chart_role();
    role.metadata.annotations = None;
    let a = rule("", &["services"], &READ_VERBS, None);
    let b = rule("", &["endpoints"], &READ_VERBS, None);
    let v1 = with_patch(&role, "p", &[], Some(std::slice::from_ref(&a)));
    // Someone (Helm) appends a rule afterwards.
    let mut edited = v1.clone();
    let helm = rule("", &["secrets"], &["get"], None);
    edited.rules.as_mut().unwrap().push(helm.clone());
    let v2 = with_patch(&edited, "p", &[], Some(std::slice::from_ref(&b)));
    let rules = v2.rules.clone().unwrap();
    assert_eq!(rules[2..], [helm.clone(), b]);
    let restored = with_restore(&v2, "p", &[]);
    let mut expected = role.rules.clone().unwrap();
    expected.push(helm);
    assert_eq!(restored.rules.unwrap(), expected);
    assert_eq!(
        restored.metadata.annotations.unwrap_or_default(),
        BTreeMap::new()
    );
}

#[test]
fn target_role_prefers_the_charts_role_bound_to_the_service_account() {
    let binding = |name: &str, role: &str, sa: &str, labelled: bool| -> RoleBinding {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": if labelled { serde_json::json!({ PLUGIN_NAME_LABEL: "x" }) } else { serde_json::json!({}) } },
            "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": role },
            "subjects": [{ "kind": "ServiceAccount", "name": sa, "namespace": "team-a" }],
        }))
        .unwrap()
    };
    let bs = vec![
        binding("a", "aaa-extra", "vc-my-vcluster", false),
        binding("b", "vc-my-vcluster", "vc-my-vcluster", false),
        binding("c", "zzz", "someone-else", false),
        binding("d", "vcp-plugin-x", "vc-my-vcluster", true),
    ];
    assert_eq!(
        target_role(&bs, "team-a", "my-vcluster", SA).as_deref(),
        Some("vc-my-vcluster")
    );
    assert_eq!(
        target_role(&bs[..1], "team-a", "my-vcluster", SA).as_deref(),
        Some("aaa-extra")
    );
    assert_eq!(
        target_role(&bs[2..], "team-a", "my-vcluster", SA),
        None,
        "dedicated roles never"
    );
    assert_eq!(
        target_role(&bs, "team-b", "my-vcluster", SA),
        None,
        "other namespace's SA"
    );
}

#[test]
fn a_role_bound_to_anyone_else_is_shared() {
    let binding = |role: &str, subjects: Value| -> RoleBinding {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("b-{role}") },
            "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": role },
            "subjects": subjects,
        }))
        .unwrap()
    };
    let only_sa = binding(
        "vc-my-vcluster",
        serde_json::json!([{ "kind": "ServiceAccount", "name": SA, "namespace": "team-a" }]),
    );
    // The chart's own binding: nobody else.
    assert!(
        other_subjects(
            std::slice::from_ref(&only_sa),
            "team-a",
            "vc-my-vcluster",
            SA
        )
        .is_empty()
    );
    // RBAC: a ServiceAccount subject without namespace is in the binding's namespace.
    let implicit_ns = binding(
        "vc-my-vcluster",
        serde_json::json!([{ "kind": "ServiceAccount", "name": SA }]),
    );
    assert!(other_subjects(&[implicit_ns], "team-a", "vc-my-vcluster", SA).is_empty());
    let shared = vec![
        only_sa,
        binding(
            "vc-my-vcluster",
            serde_json::json!([
                { "kind": "User", "apiGroup": RBAC_GROUP, "name": "jane" },
                { "kind": "ServiceAccount", "name": SA, "namespace": "team-b" },
            ]),
        ),
        binding(
            "vc-my-vcluster",
            serde_json::json!([{ "kind": "Group", "apiGroup": RBAC_GROUP, "name": "system:serviceaccounts:team-a" }]),
        ),
        // Bindings of other Roles, or of a ClusterRole of the same name, do not count.
        binding(
            "other",
            serde_json::json!([{ "kind": "User", "apiGroup": RBAC_GROUP, "name": "joe" }]),
        ),
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "cluster-role-of-same-name" },
            "roleRef": { "apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "vc-my-vcluster" },
            "subjects": [{ "kind": "User", "apiGroup": RBAC_GROUP, "name": "joe" }],
        }))
        .unwrap(),
    ];
    assert_eq!(
        other_subjects(&shared, "team-a", "vc-my-vcluster", SA),
        [
            "Group system:serviceaccounts:team-a",
            "ServiceAccount team-b/vc-my-vcluster",
            "User jane"
        ]
    );
}

#[test]
fn target_role_follows_a_custom_service_account() {
    let b: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "custom" },
        "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": "custom-role" },
        "subjects": [{ "kind": "ServiceAccount", "name": "custom-sa", "namespace": "team-a" }],
    }))
    .unwrap();
    let bs = [b];
    assert_eq!(
        target_role(&bs, "team-a", "my-vcluster", "custom-sa").as_deref(),
        Some("custom-role")
    );
    assert_eq!(target_role(&bs, "team-a", "my-vcluster", SA), None);
}

#[test]
fn patch_mode_has_no_dedicated_role_and_long_names_fit_the_annotation() {
    let mut p = plugin(None);
    p.spec.rbac = Some(PluginRbac {
        mode: vcp_crds::RbacMode::PatchVClusterRoles,
        ..Default::default()
    });
    let d = desired(&p, &Plurals::new(), SA).unwrap();
    assert!(d.role.is_none() && d.role_binding.is_none());
    assert!(!namespaced_rules(&p, &Plurals::new()).unwrap().is_empty());
    assert_eq!(
        added_rules_annotation("car-syncer"),
        "vcp.dev/added-rules.car-syncer"
    );
}

/// Whether `key` is a valid annotation key: a DNS-subdomain prefix, `/`, and a name of at most
/// 63 characters, alphanumeric at both ends with `-`, `_`, `.` inside (Kubernetes'
/// `IsQualifiedName`).
fn valid_annotation_key(key: &str) -> bool {
    let Some((prefix, name)) = key.split_once('/') else {
        return false;
    };
    let alnum = |c: char| c.is_ascii_alphanumeric();
    prefix.len() <= 253
        && prefix.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
        && !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || "-_.".contains(c))
}

/// Every DNS-1123 label of the CRD's lengths (1 to 63) gets a valid key, no two the same.
#[test]
fn record_keys_are_valid_and_injective_for_every_name_length() {
    let mut seen = BTreeMap::new();
    for len in 1..=63 {
        for fill in ['a', 'z', '0', '9'] {
            for tail in ["", "-x", "-0"] {
                let mut name: String = std::iter::repeat_n(fill, len).collect();
                if len > tail.len() {
                    name.truncate(len - tail.len());
                    name.push_str(tail);
                }
                let key = added_rules_annotation(&name);
                assert!(valid_annotation_key(&key), "{key} (name {name})");
                if let Some(other) = seen.insert(key.clone(), name.clone()) {
                    assert_eq!(other, name, "{key} is the key of both");
                }
            }
        }
    }
}

/// Under the earlier scheme a name of 52 to 63 characters was cut to 40
/// characters plus `-` and 10 hex digits of FNV-1a, which is itself a valid 51-character name
/// whose key was the same. The collision is computed here from the earlier scheme
/// ([`legacy_added_rules_annotation`]), not claimed.
#[test]
fn names_built_to_collide_under_the_earlier_scheme_get_their_own_records() {
    let long = format!("{}-syncer", "cars-and-trucks-and-buses".repeat(2)); // 57 characters
    assert!(long.len() > ADDED_RULES_MAX_NAME && long.len() <= 63);
    let legacy = legacy_added_rules_annotation(&long).unwrap();
    let colliding = legacy.strip_prefix(ADDED_RULES_PREFIX).unwrap().to_string();
    assert_eq!(colliding.len(), 51);
    assert!(
        colliding
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "a DNS-1123 label, so a valid plugin name: {colliding}"
    );
    // The earlier scheme gave both names one key; this one does not.
    assert_eq!(format!("{ADDED_RULES_PREFIX}{colliding}"), legacy);
    assert_ne!(
        added_rules_annotation(&long),
        added_rules_annotation(&colliding)
    );
    assert!(!record_keys(&colliding, &[]).contains(&added_rules_annotation(&long)));
    // The long name's earlier key is the 51-character plugin's current one: while that plugin
    // exists, the long one does not take (migrate) the record under it.
    let beside_colliding = [colliding.clone()];
    let beside_long = [long.clone()];
    assert_eq!(
        record_keys(&long, &beside_colliding),
        [added_rules_annotation(&long)]
    );
    assert_eq!(
        record_keys(&long, &[]),
        [added_rules_annotation(&long), legacy]
    );

    // Both append to one Role: each removal takes out exactly its own rule.
    let original = chart_role();
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let trucks = rule("example.loft.sh", &["trucks"], &READ_VERBS, None);
    let one = with_patch(
        &original,
        &long,
        &beside_colliding,
        Some(std::slice::from_ref(&cars)),
    );
    let both = with_patch(
        &one,
        &colliding,
        &beside_long,
        Some(std::slice::from_ref(&trucks)),
    );
    assert_eq!(
        recorded_rules(&both, &colliding, &beside_long).added,
        vec![trucks.clone()]
    );
    assert_eq!(
        recorded_rules(&both, &long, &beside_colliding).added,
        vec![cars.clone()]
    );
    for _ in 0..2 {
        assert_eq!(
            patch_role(
                &both,
                &long,
                &beside_colliding,
                Some(std::slice::from_ref(&cars))
            ),
            None,
            "converged: the long name's record is its own, and it leaves the other's alone"
        );
        assert_eq!(
            patch_role(
                &both,
                &colliding,
                &beside_long,
                Some(std::slice::from_ref(&trucks))
            ),
            None
        );
    }
    let long_gone = with_restore(&both, &long, &beside_colliding);
    let mut want = original.rules.clone().unwrap();
    want.push(trucks.clone());
    assert_eq!(long_gone.rules.clone().unwrap(), want);
    let all_gone = with_restore(&long_gone, &colliding, &[]);
    assert_eq!(
        serde_json::to_value(&all_gone).unwrap(),
        serde_json::to_value(&original).unwrap()
    );
}

/// A record an older operator wrote under the earlier key of a long name is moved to the new
/// key by the next patch, and taken out by a restore.
#[test]
fn records_under_the_earlier_key_are_migrated_and_removed() {
    let long = "a".repeat(60);
    let legacy = legacy_added_rules_annotation(&long).unwrap();
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let mut old = chart_role();
    old.rules.as_mut().unwrap().push(cars.clone());
    old.annotations_mut().insert(
        legacy.clone(),
        serde_json::to_string(&vec![cars.clone()]).unwrap(),
    );
    assert_eq!(recorded_rules(&old, &long, &[]).added, vec![cars.clone()]);

    let migrated = with_patch(&old, &long, &[], Some(std::slice::from_ref(&cars)));
    assert!(!migrated.annotations().contains_key(&legacy));
    assert_eq!(
        migrated.annotations().get(&added_rules_annotation(&long)),
        Some(&record_json(std::slice::from_ref(&cars), &[]))
    );
    assert_eq!(migrated.rules, old.rules, "the same rules, recorded once");

    let restored = with_restore(&old, &long, &[]);
    assert_eq!(
        serde_json::to_value(&restored).unwrap(),
        serde_json::to_value(chart_role()).unwrap()
    );
}

/// A kind brought back (`produced`) is read in the host namespace, never written;
/// a `reference` patch derives nothing (it translates a name; the runtime never reads the
/// object it names). Expected rule: the read verbs of a FromHost type (get, list, watch), on
/// the plural discovery returned.
#[test]
fn produced_kinds_are_read_and_references_derive_nothing() {
    let mut p = plugin(Some("img"));
    let mut certs = cars();
    certs.patches = vec![vcp_crds::TranslatePatch {
        path: "spec.secretName".into(),
        reference: Some(vcp_crds::TranslatePatchReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    certs.produced = vec![vcp_crds::ProducedObject {
        api_version: "v1".into(),
        kind: "Secret".into(),
        name_path: "spec.secretName".into(),
    }];
    p.spec.synced_types = vec![certs.clone()];
    let mut served = plurals();
    served.insert(
        ("v1".into(), "Secret".into()),
        Served::namespaced("secrets"),
    );
    served.insert(
        ("v1".into(), "ConfigMap".into()),
        Served::namespaced("configmaps"),
    );
    assert_eq!(
        namespaced_rules(&p, &served).unwrap(),
        vec![
            rule("example.loft.sh", &["cars"], &WRITE_VERBS, None),
            rule("", &["secrets"], &READ_VERBS, None),
        ]
    );
    assert!(types_to_resolve(&p).contains(&("v1".into(), "Secret".into())));
    assert!(!types_to_resolve(&p).contains(&("v1".into(), "ConfigMap".into())));

    // a produced kind the host does not serve, or serves cluster-wide, is refused
    let refused = namespaced_rules(&p, &plurals()).unwrap_err();
    assert_eq!(refused.reason, Reason::UnknownType);
    served.insert(
        ("v1".into(), "Secret".into()),
        Served::cluster_scoped("secrets"),
    );
    let refused = namespaced_rules(&p, &served).unwrap_err();
    assert_eq!(refused.reason, Reason::ClusterScopedType);
    assert!(
        refused
            .message
            .starts_with("spec.syncedTypes[0].produced[0] (v1 Secret) is cluster-scoped"),
        "{}",
        refused.message
    );

    // a FromHost type brings nothing back (the CRD refuses produced on one)
    let mut from_host = certs;
    from_host.direction = SyncDirection::FromHost;
    p.spec.synced_types = vec![from_host];
    assert!(types_to_resolve(&p).iter().all(|(_, k)| k != "Secret"));
}

/// `records_held` tells a Role the operator left as it leaves it from one someone took a
/// recorded rule out of, with the same counting as `patch_role`'s "converged" (the repair it
/// triggers is a patch that `patch_role` then computes).
#[test]
fn records_held_sees_a_recorded_rule_taken_out() {
    let original = chart_role();
    assert_eq!(records_held(&original), None, "no record: nothing to hold");
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let one = std::slice::from_ref(&cars);
    let installed = with_patch(&original, "car-syncer", &[], Some(one));
    assert_eq!(records_held(&installed), Some(true));
    // A second plugin needing the same rule records it as present: no second entry.
    let both = with_patch(&installed, "other", &[], Some(one));
    assert_eq!(both.rules, installed.rules);
    assert_eq!(records_held(&both), Some(true));

    // `kubectl edit` taking the rule out (the record stays): not held, and the repair is due.
    let mut edited = installed.clone();
    edited.rules.as_mut().unwrap().pop();
    assert_eq!(records_held(&edited), Some(false));
    assert!(patch_role(&edited, "car-syncer", &[], Some(one)).is_some());
    // Two plugins that both appended the rule (two entries; an older operator did so, and
    // its records then read as `added`), one of the entries taken out: the rule is still
    // granted, and neither plugin's reconcile would write (held, as `patch_role` judges it).
    let mut twice = installed.clone();
    twice.rules.as_mut().unwrap().push(cars.clone());
    twice
        .annotations_mut()
        .insert("vcp.dev/added-rules.other".into(), record_json(one, &[]));
    assert_eq!(records_held(&twice), Some(true));
    let mut one_copy = twice.clone();
    one_copy.rules.as_mut().unwrap().pop();
    assert_eq!(records_held(&one_copy), Some(true));
    assert_eq!(
        patch_role(&one_copy, "car-syncer", &["other".into()], Some(one)),
        None
    );
    assert_eq!(
        patch_role(&one_copy, "other", &["car-syncer".into()], Some(one)),
        None
    );
    // Every appended entry gone (an apply of the chart's own rules by another manager).
    let mut reapplied = both.clone();
    reapplied.rules = original.rules.clone();
    assert_eq!(records_held(&reapplied), Some(false));
    assert!(patch_role(&reapplied, "other", &["car-syncer".into()], Some(one)).is_some());
    // The rules reordered, nothing taken out: still held.
    let mut reordered = both.clone();
    reordered.rules.as_mut().unwrap().reverse();
    assert_eq!(records_held(&reordered), Some(true));
    // A record that is not a list of rules: not held (the reconcile judges it).
    let mut garbled = installed.clone();
    garbled
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("vcp.dev/added-rules.car-syncer".into(), "{".into());
    assert_eq!(records_held(&garbled), Some(false));
}

/// Security review, finding 4: the chart's Role already grants a rule the plugin needs. The
/// plugin appends nothing and records the rule as `present`; Helm re-applying the chart leaves
/// the record held; the plugin's removal leaves the chart's rule in place, the Role byte for
/// byte as the chart made it. (Before, the rule was appended a second time and recorded as
/// added; after the re-apply one copy was left, the record still looked held, and the removal
/// took out the chart's own rule.)
#[test]
fn a_rule_the_role_already_grants_is_recorded_present_and_never_removed() {
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let trucks = rule("example.loft.sh", &["trucks"], &READ_VERBS, None);
    let mut chart = chart_role();
    chart.rules.as_mut().unwrap().push(cars.clone());
    let chart_rules = chart.rules.clone();

    let patch = patch_role(&chart, "car-syncer", &[], Some(std::slice::from_ref(&cars))).unwrap();
    let installed = apply_patch(&chart, &patch);
    assert_eq!(installed.rules, chart_rules, "nothing appended");
    assert_eq!(
        installed.annotations()["vcp.dev/added-rules.car-syncer"],
        record_json(&[], std::slice::from_ref(&cars))
    );
    assert_eq!(
        recorded_rules(&installed, "car-syncer", &[]),
        Record {
            added: vec![],
            present: vec![cars.clone()],
        }
    );
    assert_eq!(records_held(&installed), Some(true));
    assert_eq!(
        patch_role(
            &installed,
            "car-syncer",
            &[],
            Some(std::slice::from_ref(&cars))
        ),
        None,
        "converged"
    );

    // Helm re-applies the chart: `rules` back to the chart's list, which is what they are.
    let mut reapplied = installed.clone();
    reapplied.rules = chart_rules.clone();
    assert_eq!(records_held(&reapplied), Some(true));
    assert_eq!(
        patch_role(
            &reapplied,
            "car-syncer",
            &[],
            Some(std::slice::from_ref(&cars))
        ),
        None
    );

    // The plugin goes: the chart's rule stays, the Role is the chart's byte for byte.
    let restored = with_restore(&reapplied, "car-syncer", &[]);
    assert_same_bytes(&restored, &chart);

    // With a rule the chart lacks beside it: only that one is appended, and only that one
    // taken out again.
    let both = [cars.clone(), trucks.clone()];
    let installed = with_patch(&chart, "car-syncer", &[], Some(&both));
    let mut want = chart_rules.clone().unwrap();
    want.push(trucks.clone());
    assert_eq!(installed.rules.clone().unwrap(), want);
    assert_eq!(
        installed.annotations()["vcp.dev/added-rules.car-syncer"],
        record_json(std::slice::from_ref(&trucks), std::slice::from_ref(&cars))
    );
    assert_eq!(patch_role(&installed, "car-syncer", &[], Some(&both)), None);
    let restored = with_restore(&installed, "car-syncer", &[]);
    assert_same_bytes(&restored, &chart);
}

/// A record an older operator wrote is a JSON list of the rules it appended: it reads as
/// `added`, and the next patch writes it in the object form. One that appended a copy of a rule
/// the chart holds too (finding 4's state: the chart's entry and the plugin's) converges to the
/// chart's entry alone with the rule recorded as `present`: the duplicate goes, the permission
/// stays, and the removal then leaves the chart's rule.
#[test]
fn records_written_as_a_list_are_read_and_migrated() {
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let one = std::slice::from_ref(&cars);
    let list = serde_json::to_string(&vec![cars.clone()]).unwrap();
    assert_eq!(
        Record::parse(&list),
        Some(Record {
            added: vec![cars.clone()],
            present: vec![],
        })
    );
    assert_eq!(Record::parse("{"), None);
    assert_eq!(Record::parse(r#"{"added": [], "gone": []}"#), None);

    // A rule the chart lacks: the same rules, the record in the object form.
    let mut old = chart_role();
    old.rules.as_mut().unwrap().push(cars.clone());
    old.annotations_mut()
        .insert("vcp.dev/added-rules.car-syncer".into(), list.clone());
    assert_eq!(records_held(&old), Some(true));
    assert_eq!(recorded_rules(&old, "car-syncer", &[]).added, one);
    let migrated = with_patch(&old, "car-syncer", &[], Some(one));
    assert_eq!(migrated.rules, old.rules);
    assert_eq!(
        migrated.annotations()["vcp.dev/added-rules.car-syncer"],
        record_json(one, &[])
    );
    assert_eq!(patch_role(&migrated, "car-syncer", &[], Some(one)), None);
    let restored = with_restore(&old, "car-syncer", &[]);
    assert_same_bytes(&restored, &chart_role());

    // The chart's copy and the plugin's: one entry left, recorded as present.
    let mut chart = chart_role();
    chart.rules.as_mut().unwrap().push(cars.clone());
    let mut doubled = chart.clone();
    doubled.rules.as_mut().unwrap().push(cars.clone());
    doubled
        .annotations_mut()
        .insert("vcp.dev/added-rules.car-syncer".into(), list);
    assert_eq!(records_held(&doubled), Some(true));
    let converged = with_patch(&doubled, "car-syncer", &[], Some(one));
    assert_eq!(converged.rules, chart.rules);
    assert_eq!(
        converged.annotations()["vcp.dev/added-rules.car-syncer"],
        record_json(&[], one)
    );
    assert_eq!(records_held(&converged), Some(true));
    assert_eq!(patch_role(&converged, "car-syncer", &[], Some(one)), None);
    let restored = with_restore(&converged, "car-syncer", &[]);
    assert_same_bytes(&restored, &chart);
}

/// Two plugins needing the same rule: the first appends it, the second records it as present.
/// Both are converged, also with a third plugin appending after them. When the first goes its
/// restore takes the rule out, the second's record is no longer held (the Role watch's
/// trigger, `crate::patched_roles`), and the second's reconcile appends the rule again.
#[test]
fn a_rule_two_plugins_need_is_appended_again_when_its_appender_goes() {
    let original = chart_role();
    let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
    let trucks = rule("example.loft.sh", &["trucks"], &READ_VERBS, None);
    let one = std::slice::from_ref(&cars);
    let first = with_patch(&original, "p1", &[], Some(one));
    let second = with_patch(&first, "p2", &[], Some(one));
    assert_eq!(second.rules, first.rules, "nothing appended twice");
    assert_eq!(
        second.annotations()["vcp.dev/added-rules.p1"],
        record_json(one, &[])
    );
    assert_eq!(
        second.annotations()["vcp.dev/added-rules.p2"],
        record_json(&[], one)
    );
    assert_eq!(records_held(&second), Some(true));
    let third = with_patch(&second, "p3", &[], Some(std::slice::from_ref(&trucks)));
    for (name, rules) in [
        ("p1", one),
        ("p2", one),
        ("p3", std::slice::from_ref(&trucks)),
    ] {
        assert_eq!(
            patch_role(&third, name, &[], Some(rules)),
            None,
            "{name} converged"
        );
    }

    let first_gone = with_restore(&third, "p1", &[]);
    let mut want = original.rules.clone().unwrap();
    want.push(trucks.clone());
    assert_eq!(first_gone.rules.clone().unwrap(), want);
    assert_eq!(records_held(&first_gone), Some(false), "p2's rule is gone");
    let repaired = with_patch(&first_gone, "p2", &[], Some(one));
    want.push(cars.clone());
    assert_eq!(repaired.rules.clone().unwrap(), want);
    assert_eq!(
        repaired.annotations()["vcp.dev/added-rules.p2"],
        record_json(one, &[])
    );
    assert_eq!(records_held(&repaired), Some(true));
    assert_eq!(patch_role(&repaired, "p2", &[], Some(one)), None);

    let all_gone = [("p2"), ("p3")]
        .iter()
        .fold(repaired, |role, name| with_restore(&role, name, &[]));
    assert_same_bytes(&all_gone, &original);
}
