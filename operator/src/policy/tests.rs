use super::*;
use crate::rbac::Served;
use vcp_crds::{
    Hook, HookEvent, PluginRbac, RoleRules, SyncDirection, SyncedType, VClusterPluginSpec,
    VClusterRef,
};

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

fn plugin(role: Vec<PolicyRule>, cluster: Vec<PolicyRule>) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        "p",
        VClusterPluginSpec {
            vcluster: VClusterRef { name: "vc".into() },
            rbac: Some(PluginRbac {
                role: Some(RoleRules { extra_rules: role }),
                cluster_role: Some(RoleRules {
                    extra_rules: cluster,
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("ns".into());
    p
}

/// What discovery returns for the types these tests name (Kubernetes' built-in plurals, the
/// tutorial CRD's `cars`).
fn served() -> Plurals {
    Plurals::from([
        (
            ("example.loft.sh/v1".into(), "Car".into()),
            Served::namespaced("cars"),
        ),
        (("v1".into(), "Pod".into()), Served::namespaced("pods")),
        (
            ("v1".into(), "Secret".into()),
            Served::namespaced("secrets"),
        ),
        (
            ("v1".into(), "ConfigMap".into()),
            Served::namespaced("configmaps"),
        ),
        (
            ("networking.k8s.io/v1".into(), "Ingress".into()),
            Served::namespaced("ingresses"),
        ),
        (
            ("networking.k8s.io/v1".into(), "NetworkPolicy".into()),
            Served::namespaced("networkpolicies"),
        ),
        (
            ("v1".into(), "Endpoints".into()),
            Served::namespaced("endpoints"),
        ),
        // A CRD declaring an irregular plural.
        (
            ("example.com/v1".into(), "Person".into()),
            Served::namespaced("people"),
        ),
    ])
}

fn synced(api_version: &str, kind: &str, resource: Option<&str>) -> SyncedType {
    SyncedType {
        api_version: api_version.into(),
        kind: kind.into(),
        resource: resource.map(String::from),
        ..Default::default()
    }
}

fn denied(p: &VClusterPlugin) -> Denial {
    evaluate(&Policy::default(), p, &served()).expect_err("should be denied")
}

fn ns(r: PolicyRule) -> Option<String> {
    check_rule(&Policy::default(), Scope::Namespaced, &r)
}

fn cl(r: PolicyRule) -> Option<String> {
    check_rule(&Policy::default(), Scope::Cluster, &r)
}

#[test]
fn wildcards_are_refused_in_every_field() {
    assert!(
        ns(rule(&["*"], &["pods"], &["get"]))
            .unwrap()
            .contains("apiGroups")
    );
    assert!(
        ns(rule(&[""], &["*"], &["get"]))
            .unwrap()
            .contains("resources")
    );
    assert!(
        ns(rule(&[""], &["pods/*"], &["get"]))
            .unwrap()
            .contains("\"pods/*\"")
    );
    assert!(
        ns(rule(&[""], &["pods"], &["*"]))
            .unwrap()
            .contains("verbs")
    );
    let urls = PolicyRule {
        non_resource_urls: Some(strings(&["/metrics*"])),
        verbs: strings(&["get"]),
        ..Default::default()
    };
    assert!(cl(urls).unwrap().contains("nonResourceURLs"));
}

#[test]
fn privilege_verbs_are_refused_anywhere() {
    for v in ["escalate", "bind", "impersonate", "Bind"] {
        let reason = ns(rule(&["rbac.authorization.k8s.io"], &["roles"], &[v])).unwrap();
        assert!(reason.contains("forbiddenVerbs"), "{v}: {reason}");
    }
    assert!(ns(rule(&[""], &["users"], &["impersonate"])).is_some());
}

#[test]
fn namespaced_writes_and_secrets_are_allowed() {
    assert_eq!(
        ns(rule(
            &[""],
            &["secrets", "configmaps"],
            &["get", "create", "delete"]
        )),
        None
    );
    assert_eq!(
        ns(rule(&["apps"], &["deployments/scale"], &["patch"])),
        None
    );
}

#[test]
fn cluster_scoped_rules_are_read_only() {
    assert_eq!(
        cl(rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get", "list", "watch"]
        )),
        None,
        "the tutorial's CRD read"
    );
    let reason = cl(rule(&[""], &["nodes"], &["get", "patch"])).unwrap();
    assert!(reason.contains("\"patch\""), "{reason}");
    assert!(reason.contains("clusterScoped.allowedVerbs"), "{reason}");
}

#[test]
fn cluster_wide_secrets_are_refused_even_read_only_and_as_subresource() {
    for r in ["secrets", "secrets/status"] {
        let reason = cl(rule(&[""], &[r], &["get"])).unwrap();
        assert!(
            reason.contains("clusterScoped.forbiddenResources"),
            "{reason}"
        );
    }
    assert_eq!(cl(rule(&[""], &["secretstores"], &["get"])), None);
}

#[test]
fn evaluate_names_the_offending_extra_rule() {
    let p = plugin(
        vec![rule(&[""], &["pods"], &["get"])],
        vec![
            rule(&[""], &["nodes"], &["get"]),
            rule(&[""], &["secrets"], &["list"]),
        ],
    );
    let d = denied(&p);
    assert_eq!(d.source, "spec.rbac.clusterRole.extraRules[1]");
    assert_eq!(
        d.message(),
        "spec.rbac.clusterRole.extraRules[1] {apiGroups: [\"\"], resources: [\"secrets\"], verbs: [\"list\"]} is refused by the operator policy: cluster-wide access to \"secrets\" (policy clusterScoped.forbiddenResources: secrets)"
    );
    let p = plugin(vec![rule(&[""], &["pods"], &["*"])], vec![]);
    assert_eq!(denied(&p).source, "spec.rbac.role.extraRules[0]");
}

#[test]
fn the_tutorial_plugin_is_allowed() {
    let mut p = plugin(
        vec![rule(
            &["example.loft.sh"],
            &["cars"],
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        )],
        vec![rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &["get", "list", "watch"],
        )],
    );
    p.spec.synced_types = vec![SyncedType {
        api_version: "example.loft.sh/v1".into(),
        kind: "Car".into(),
        ..Default::default()
    }];
    p.spec.hooks = vec![Hook {
        name: "pods".into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
        events: vec![HookEvent::CreatePhysical, HookEvent::UpdatePhysical],
        ..Default::default()
    }];
    assert_eq!(evaluate(&Policy::default(), &p, &served()), Ok(()));
}

#[test]
fn derived_rules_are_checked_too() {
    let mut p = plugin(vec![], vec![]);
    p.spec.synced_types = vec![SyncedType {
        api_version: "v1".into(),
        kind: "Secret".into(),
        resource: Some("*".into()),
        direction: SyncDirection::FromHost,
        ..Default::default()
    }];
    let d = denied(&p);
    assert!(d.source.contains("derived"), "{d:?}");
    assert!(d.reason.contains("wildcard"), "{d:?}");

    // A narrowing policy can refuse the derived write verbs.
    let mut p = plugin(vec![], vec![]);
    p.spec.synced_types = vec![SyncedType {
        api_version: "example.loft.sh/v1".into(),
        kind: "Car".into(),
        ..Default::default()
    }];
    let strict = Policy::from_yaml("forbiddenVerbs: [delete]").unwrap();
    assert!(
        evaluate(&strict, &p, &served())
            .unwrap_err()
            .reason
            .contains("\"delete\"")
    );
    assert_eq!(evaluate(&Policy::default(), &p, &served()), Ok(()));
}

#[test]
fn a_narrowing_policy_judges_derived_rules_on_the_discovered_plural() {
    // The Role of `syncedTypes: [{apiVersion: v1, kind: Secret}]` grants `secrets`.
    let narrow = Policy::from_yaml("forbiddenResources: [secrets]").unwrap();
    let mut p = plugin(vec![], vec![]);
    p.spec.synced_types = vec![synced("v1", "Secret", None)];
    let d = evaluate(&narrow, &p, &served()).unwrap_err();
    assert_eq!(
        d.source,
        "a rule derived from spec.syncedTypes / spec.hooks"
    );
    assert_eq!(
        d.reason,
        "resource \"secrets\" (policy forbiddenResources: secrets)"
    );
    // A hook on physical Secrets too.
    let mut p = plugin(vec![], vec![]);
    p.spec.hooks = vec![Hook {
        name: "s".into(),
        api_version: "v1".into(),
        kind: "Secret".into(),
        events: vec![HookEvent::UpdatePhysical],
        ..Default::default()
    }];
    assert!(evaluate(&narrow, &p, &served()).is_err());
    // Not served: nothing to grant, nothing judged here (refused as UnknownType).
    assert_eq!(evaluate(&narrow, &p, &Plurals::new()), Ok(()));
}

#[test]
fn the_resource_admission_checked_must_be_discoverys_plural() {
    let check = |types: Vec<SyncedType>| {
        let mut p = plugin(vec![], vec![]);
        p.spec.synced_types = types;
        evaluate(&Policy::default(), &p, &served())
    };
    // Plurals Kubernetes guesses right.
    assert_eq!(
        check(vec![
            synced("v1", "Secret", None),
            synced("v1", "ConfigMap", None),
            synced("v1", "Endpoints", None),
            synced("example.loft.sh/v1", "Car", None),
            synced("networking.k8s.io/v1", "Ingress", None),
            synced("networking.k8s.io/v1", "NetworkPolicy", None),
        ]),
        Ok(())
    );
    // A CRD's `people`: admission checked `persons`.
    let d = check(vec![
        synced("v1", "Secret", None),
        synced("example.com/v1", "Person", None),
    ])
    .unwrap_err();
    assert_eq!(d.source, "spec.syncedTypes[1]");
    let m = d.message();
    assert!(m.contains("\"people\""), "{m}");
    assert!(m.contains("\"persons\""), "{m}");
    assert!(
        m.contains("set spec.syncedTypes[1].resource: people"),
        "{m}"
    );
    // With the right resource, admission checked that one.
    assert_eq!(
        check(vec![synced("example.com/v1", "Person", Some("people"))]),
        Ok(())
    );
    // A resource that is not the kind's: admission checked `configmaps` for Secrets.
    let d = check(vec![synced("v1", "Secret", Some("configmaps"))]).unwrap_err();
    assert!(
        d.message().contains("its resource field"),
        "{}",
        d.message()
    );
    // Not served: judged as UnknownType elsewhere, or granted as the explicit resource.
    assert_eq!(
        check(vec![synced("example.com/v1", "Widget", None)]),
        Ok(())
    );
    // A hook on physical People has no resource field to fix it.
    let mut p = plugin(vec![], vec![]);
    p.spec.hooks = vec![Hook {
        name: "people".into(),
        api_version: "example.com/v1".into(),
        kind: "Person".into(),
        events: vec![HookEvent::CreatePhysical],
        ..Default::default()
    }];
    let d = evaluate(&Policy::default(), &p, &served()).unwrap_err();
    assert_eq!(d.source, "spec.hooks[0]");
    // On virtual events only, nothing is granted on the host.
    p.spec.hooks[0].events = vec![HookEvent::CreateVirtual];
    assert_eq!(evaluate(&Policy::default(), &p, &served()), Ok(()));
}

#[test]
fn policy_file_widens_and_narrows() {
    let wide = Policy::from_yaml(
        "allowWildcards: true\nclusterScoped:\n  allowedVerbs: [get, list, watch, create]\n  forbiddenResources: []\n",
    )
    .unwrap();
    assert_eq!(
        wide.forbidden_verbs,
        Policy::default().forbidden_verbs,
        "default kept"
    );
    assert_eq!(
        check_rule(
            &wide,
            Scope::Cluster,
            &rule(&["*"], &["secrets"], &["create"])
        ),
        None
    );
    assert!(check_rule(&wide, Scope::Cluster, &rule(&[""], &["nodes"], &["delete"])).is_some());

    let narrow = Policy::from_yaml("forbiddenResources: [pods/exec, secrets]").unwrap();
    assert!(
        check_rule(
            &narrow,
            Scope::Namespaced,
            &rule(&[""], &["pods/exec"], &["create"])
        )
        .is_some()
    );
    assert!(
        check_rule(
            &narrow,
            Scope::Namespaced,
            &rule(&[""], &["secrets"], &["get"])
        )
        .is_some()
    );
    assert_eq!(
        check_rule(
            &narrow,
            Scope::Namespaced,
            &rule(&[""], &["pods"], &["create"])
        ),
        None
    );
}

#[test]
fn empty_file_is_the_default_and_typos_are_errors() {
    assert_eq!(Policy::from_yaml("").unwrap(), Policy::default());
    assert_eq!(Policy::from_yaml("{}\n").unwrap(), Policy::default());
    let err = Policy::from_yaml("allowWildcard: true")
        .unwrap_err()
        .to_string();
    assert!(err.contains("allowWildcard"), "{err}");
    assert!(err.contains("fields: allowWildcards"), "{err}");
    let err = Policy::from_yaml("forbiddenVerbs: bind").unwrap_err();
    assert!(matches!(err, PolicyError::Parse { .. }));
}

#[test]
fn from_file_reports_the_path() {
    let dir = std::env::temp_dir().join(format!("vcp-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(
        &good,
        "clusterScoped:\n  forbiddenResources: [secrets, configmaps]\n",
    )
    .unwrap();
    let p = Policy::from_file(&good).unwrap();
    assert_eq!(
        p.cluster_scoped.allowed_verbs,
        strings(&["get", "list", "watch"])
    );
    assert_eq!(p.cluster_scoped.forbidden_resources.len(), 2);
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "nope: 1").unwrap();
    assert!(
        Policy::from_file(&bad)
            .unwrap_err()
            .to_string()
            .contains("bad.yaml")
    );
    let missing = Policy::from_file(&dir.join("missing.yaml")).unwrap_err();
    assert!(matches!(missing, PolicyError::Read { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}
