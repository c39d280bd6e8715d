//! The grants, proved: a plugin is installed by the operator
//! (in-process as `vcp-operator`, under the admission policies of `config/admission`); the
//! embedded runtime then runs with a token of the service account the operator bound (minted
//! with the TokenRequest API of the host API server), does its job with it, and access reviews
//! made with that same token show it can do exactly what the plugin declares and nothing more:
//! a table of allowed and denied `SelfSubjectAccessReview`s, each asserted, and the complete
//! `SelfSubjectRulesReview` of its namespace compared with the rules the plugin declares.
//!
//! Expected rules are written here from the plugin's spec and the rules of `rbac` (the README,
//! "Security model"):
//! `ToHost` types get get/list/watch/create/update/patch/delete on the host resource,
//! `FromHost` ones get/list/watch, hooks on physical events get/list/watch/update/patch on the
//! hooked resource, nothing cluster-wide is derived (the runtime reads a custom resource's CRD
//! in the virtual cluster only; so it syncs Cars here without reading CRDs on the
//! host), the embedded runtime reads the namespace's VClusterPlugins, patches its own status, writes
//! Events and (for a `ToHost` type) reads the vCluster's Service, the owner vCluster sets on
//! host copies; the extra rules are granted as written.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, apply_yaml, wait_for};

const NS: &str = "grants";
const TIMEOUT: Duration = Duration::from_secs(30);

/// The plugin: a custom resource to the host, ConfigMaps from the host, a hook on Pods, one
/// extra rule in the namespace and one cluster-wide.
const PLUGIN: &str = r#"
---
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: grants }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
    - { apiVersion: v1, kind: ConfigMap, direction: FromHost }
  hooks:
    - { name: tag-pods, apiVersion: v1, kind: Pod, events: [CreatePhysical], labels: { tagged: "yes" } }
  rbac:
    role:
      extraRules:
        - { apiGroups: [""], resources: [persistentvolumeclaims], verbs: [get] }
    clusterRole:
      extraRules:
        - { apiGroups: [""], resources: [nodes], verbs: [get] }
"#;

/// One access review: (verb, group, resource, subresource, namespace, name).
type Check = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

/// What the plugin declares, as access reviews that must be allowed.
const ALLOWED: &[Check] = &[
    // syncedTypes[0]: Car, ToHost.
    ("get", "example.loft.sh", "cars", "", NS, ""),
    ("list", "example.loft.sh", "cars", "", NS, ""),
    ("watch", "example.loft.sh", "cars", "", NS, ""),
    ("create", "example.loft.sh", "cars", "", NS, ""),
    ("update", "example.loft.sh", "cars", "", NS, ""),
    ("patch", "example.loft.sh", "cars", "", NS, ""),
    ("delete", "example.loft.sh", "cars", "", NS, ""),
    // syncedTypes[1]: ConfigMap, FromHost: read only.
    ("get", "", "configmaps", "", NS, ""),
    ("list", "", "configmaps", "", NS, ""),
    ("watch", "", "configmaps", "", NS, ""),
    // hooks[0]: Pods on CreatePhysical.
    ("get", "", "pods", "", NS, ""),
    ("list", "", "pods", "", NS, ""),
    ("watch", "", "pods", "", NS, ""),
    ("update", "", "pods", "", NS, ""),
    ("patch", "", "pods", "", NS, ""),
    // rbac.role.extraRules / rbac.clusterRole.extraRules, as written.
    ("get", "", "persistentvolumeclaims", "", NS, ""),
    ("get", "", "nodes", "", "", "worker-1"),
    // The embedded runtime itself.
    ("list", "vcp.dev", "vclusterplugins", "", NS, ""),
    (
        "patch",
        "vcp.dev",
        "vclusterplugins",
        "status",
        NS,
        "grants",
    ),
    ("create", "events.k8s.io", "events", "", NS, ""),
    // ... and, for a ToHost type, the vCluster's Service (the owner of the host copies).
    ("get", "", "services", "", NS, "my-vcluster"),
];

/// Neighbours of what it declares, and the usual ways up: all must be denied.
const DENIED: &[Check] = &[
    // The same verbs elsewhere: another namespace, cluster-wide.
    ("create", "example.loft.sh", "cars", "", "default", ""),
    ("list", "example.loft.sh", "cars", "", "", ""),
    ("list", "", "configmaps", "", "", ""),
    // More verbs than declared.
    ("create", "", "configmaps", "", NS, ""),
    ("delete", "", "configmaps", "", NS, ""),
    ("create", "", "pods", "", NS, ""),
    ("delete", "", "pods", "", NS, ""),
    ("list", "", "persistentvolumeclaims", "", NS, ""),
    ("update", "", "persistentvolumeclaims", "", NS, ""),
    ("get", "", "services", "", NS, "another-service"),
    ("update", "", "services", "", NS, "my-vcluster"),
    ("list", "", "nodes", "", "", ""),
    ("update", "", "nodes", "", "", "worker-1"),
    // A custom resource's CRD on the host: read in the virtual cluster only.
    (
        "get",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "",
        "",
        "cars.example.loft.sh",
    ),
    (
        "list",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "",
        "",
        "",
    ),
    (
        "create",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "",
        "",
        "",
    ),
    ("update", "vcp.dev", "vclusterplugins", "", NS, "grants"),
    (
        "patch",
        "vcp.dev",
        "vclusterplugins",
        "status",
        NS,
        "another-plugin",
    ),
    // Subresources and impersonation-equivalents.
    ("create", "", "pods", "exec", NS, ""),
    (
        "create",
        "",
        "serviceaccounts",
        "token",
        NS,
        "vc-my-vcluster",
    ),
    ("impersonate", "", "serviceaccounts", "", NS, ""),
    ("get", "", "secrets", "", NS, "vc-my-vcluster"),
    ("list", "", "secrets", "", NS, ""),
    // Its own workload and RBAC.
    ("patch", "apps", "statefulsets", "", NS, "my-vcluster"),
    ("create", "rbac.authorization.k8s.io", "roles", "", NS, ""),
    ("escalate", "rbac.authorization.k8s.io", "roles", "", NS, ""),
    (
        "create",
        "rbac.authorization.k8s.io",
        "rolebindings",
        "",
        NS,
        "",
    ),
    (
        "bind",
        "rbac.authorization.k8s.io",
        "clusterroles",
        "",
        "",
        "cluster-admin",
    ),
];

async fn review(client: &Client, check: &Check) -> bool {
    let (verb, group, resource, subresource, namespace, name) = *check;
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let ssar = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource: opt(subresource),
                namespace: opt(namespace),
                name: opt(name),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &ssar)
        .await
        .expect("SelfSubjectAccessReview")
        .status
        .expect("review status")
        .allowed
}

fn describe(check: &Check) -> String {
    let (verb, group, resource, subresource, namespace, name) = *check;
    let mut r = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{group}/{resource}")
    };
    if !subresource.is_empty() {
        r = format!("{r}/{subresource}");
    }
    if !name.is_empty() {
        r = format!("{r} {name}");
    }
    let scope = if namespace.is_empty() {
        "cluster-wide".to_string()
    } else {
        format!("in {namespace}")
    };
    format!("{verb} {r} {scope}")
}

/// A rule of a rules review, sorted for comparison: (groups, resources, names, verbs).
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

fn rule(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Rule {
    let sorted = |v: &[&str]| {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    };
    (
        sorted(groups),
        sorted(resources),
        sorted(names),
        sorted(verbs),
    )
}

#[tokio::test]
async fn the_bound_account_can_do_what_the_plugin_declares_and_nothing_more() {
    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:grants").await;
    let cp = ControlPlane::shared();
    vcp_tests::create_namespace(&admin, NS).await;
    // vCluster's own chart, whose RBAC objects are left out: the service account holds only
    // what the operator grants.
    let workload = vcp_tests::vcluster_workload(NS);
    apply_yaml(&admin, &format!("{workload}{PLUGIN}"), Some(NS))
        .await
        .expect("fixtures");
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    vcp_tests::wait_ready(&admin, NS, "grants", "True", None, TIMEOUT).await;

    // The account the operator bound: the subject of the plugin's RoleBinding.
    let binding = Api::<RoleBinding>::namespaced(admin.clone(), NS)
        .get("vcp-plugin-grants")
        .await
        .expect("the plugin's RoleBinding");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    let account = subjects[0].name.clone();
    assert_eq!(
        account, "vc-my-vcluster",
        "the pod template's service account"
    );
    let as_account = cp
        .service_account_client(Cluster::Host, NS, &account)
        .await
        .expect("a token of the bound account");

    // The runtime does its job with that token: a virtual Car reaches the host, the status is
    // written.
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&virtual_, "team").await;
    let runtime =
        vcp_tests::start_runtime(as_account.clone(), virtual_.clone(), NS, "grants", |c| {
            c.status_interval = Duration::from_millis(300);
        })
        .task;
    let cars = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    );
    let car: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": { "name": "beetle", "namespace": "team" },
        "spec": { "type": "Audi", "seats": 4 },
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(virtual_.clone(), "team", &cars)
        .patch(
            "beetle",
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&car),
        )
        .await
        .expect("virtual Car");
    let host_cars = Api::<DynamicObject>::namespaced_with(admin.clone(), NS, &cars);
    let host_car = wait_for(TIMEOUT, || {
        let host_cars = host_cars.clone();
        async move {
            host_cars
                .get_opt("beetle-x-team-x-my-vcluster")
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    println!(
        "the runtime, as {NS}/{account}, synced Car team/beetle to {NS}/{}",
        host_car.name_any()
    );
    let synced = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("grants").await.ok()?.status?;
            let healthy = status
                .conditions
                .iter()
                .any(|c| c.type_ == "RuntimeHealthy" && c.status == "True");
            let cars = status
                .synced_objects
                .iter()
                .find(|s| s.kind == "Car")
                .map(|s| s.count)?;
            (healthy && cars >= 1).then_some(cars)
        }
    })
    .await;
    println!("the runtime reported RuntimeHealthy=True and {synced} Car(s) in sync");
    runtime.abort();

    // Access reviews with the same token.
    let mut failures = Vec::new();
    println!("{:<70} {:>8} {:>8}", "access review", "expected", "answer");
    for (checks, expected) in [(ALLOWED, true), (DENIED, false)] {
        for check in checks {
            let allowed = review(&as_account, check).await;
            let word = |b: bool| if b { "allowed" } else { "denied" };
            println!(
                "{:<70} {:>8} {:>8}",
                describe(check),
                word(expected),
                word(allowed)
            );
            if allowed != expected {
                failures.push(format!("{}: {}", describe(check), word(allowed)));
            }
        }
    }

    // Everything it holds in its namespace, beside what every authenticated user holds
    // (self-reviews), is exactly what the plugin declares.
    let rules_review = Api::<SelfSubjectRulesReview>::all(as_account.clone())
        .create(
            &PostParams::default(),
            &SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some(NS.into()),
                },
                ..Default::default()
            },
        )
        .await
        .expect("SelfSubjectRulesReview")
        .status
        .expect("rules review status");
    assert!(!rules_review.incomplete, "{rules_review:?}");
    let held: BTreeSet<Rule> = rules_review
        .resource_rules
        .iter()
        .map(|r| {
            let v = |x: &Option<Vec<String>>| x.clone().unwrap_or_default();
            let mut g = v(&r.api_groups);
            let mut res = v(&r.resources);
            let mut n = v(&r.resource_names);
            let mut verbs = r.verbs.clone();
            g.sort();
            res.sort();
            n.sort();
            verbs.sort();
            (g, res, n, verbs)
        })
        .filter(|(g, res, _, _)| {
            !(res.iter().all(|r| r.starts_with("selfsubject"))
                && g.iter()
                    .all(|g| g == "authorization.k8s.io" || g == "authentication.k8s.io"))
        })
        .collect();
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    let declared: BTreeSet<Rule> = [
        rule(&["example.loft.sh"], &["cars"], &[], &all),
        rule(&[""], &["configmaps"], &[], &["get", "list", "watch"]),
        rule(
            &[""],
            &["pods"],
            &[],
            &["get", "list", "watch", "update", "patch"],
        ),
        rule(&[""], &["persistentvolumeclaims"], &[], &["get"]),
        rule(&[""], &["services"], &["my-vcluster"], &["get"]),
        rule(&[""], &["nodes"], &[], &["get"]),
        rule(
            &["vcp.dev"],
            &["vclusterplugins"],
            &[],
            &["get", "list", "watch"],
        ),
        rule(
            &["vcp.dev"],
            &["vclusterplugins/status"],
            &["grants"],
            &["get", "patch", "update"],
        ),
        rule(&["events.k8s.io"], &["events"], &[], &["create", "patch"]),
        rule(&[""], &["events"], &[], &["create", "patch"]),
    ]
    .into_iter()
    .collect();
    let extra: Vec<&Rule> = held.difference(&declared).collect();
    let missing: Vec<&Rule> = declared.difference(&held).collect();
    println!(
        "rules review of {NS}: {} rules held beside self-reviews, {} declared",
        held.len(),
        declared.len()
    );
    if !extra.is_empty() {
        failures.push(format!("held but not declared: {extra:?}"));
    }
    if !missing.is_empty() {
        failures.push(format!("declared but not held: {missing:?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
