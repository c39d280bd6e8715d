//! The two admission policies of the trust model (`config/admission`, README.md "Security
//! model") on the real host API server, with the static-token users of the local control plane:
//!
//! - requester-bound admission (`requester.yaml`): a tenant may create or change a
//!   VClusterPlugin only when they hold every permission it would give the vCluster and may
//!   write every object the operator writes for it: `update` or `patch` on the target workload,
//!   the verbs the runtime gets on each synced and hooked type, each extra rule (in the
//!   namespace, or cluster-wide for `rbac.clusterRole`), `create` on the Role and RoleBinding
//!   (or ClusterRole and ClusterRoleBinding) the operator creates, `update` or `patch` on roles
//!   when it appends to the vCluster's Role;
//! - the operator's own power bounded (`operator-bounds.yaml`): the operator's identity
//!   (`vcp-operator` here, through tests/fixtures/admission) may write only the RBAC objects it
//!   makes for plugins and its own parts of workloads.
//!
//! No operator runs in this test binary: every write is made by the test, as the identity named.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{
    Cluster, ControlPlane, Identity, apply_yaml, apply_yaml_file, bind_tenant_rights,
    create_namespace, install_admission_policies, install_crds,
};

/// The CRDs, the operator's RBAC bound to `vcp-operator`, and both policies.
async fn setup() -> Client {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    install_crds(&admin).await;
    for file in [
        "config/rbac/role.yaml",
        "config/rbac/test-user-binding.yaml",
    ] {
        apply_yaml_file(&admin, file, None)
            .await
            .unwrap_or_else(|e| panic!("apply {file}: {e:#}"));
    }
    install_admission_policies(cp, &admin).await;
    admin
}

/// A VClusterPlugin named `name` for vCluster `my-vcluster` with `spec` merged in.
fn plugin(name: &str, spec: Value) -> VClusterPlugin {
    let mut full = json!({ "vcluster": { "name": "my-vcluster" } });
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().cloned().unwrap_or_default());
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": name }, "spec": full,
    }))
    .expect("plugin")
}

/// The API server's message when `result` is a refusal, `None` when it succeeded.
fn refusal<T>(result: Result<T, kube::Error>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(format!("{} ({})", e.message, e.code)),
        Err(e) => panic!("not an API answer: {e}"),
    }
}

#[tokio::test]
async fn a_tenant_may_only_create_plugins_that_grant_what_they_hold() {
    let admin = setup().await;
    let ns = "adm-tenants";
    create_namespace(&admin, ns).await;
    bind_tenant_rights(&admin, ns).await;
    let cp = ControlPlane::shared();

    // (identity, plugin name, spec, None = admitted | Some(fragment of the refusal))
    let ns_words = format!("in namespace {ns}");
    let cases: Vec<(Identity, &str, Value, Option<String>)> = vec![
        // The tutorial's plugin: patch on the workload, the 7 ToHost verbs on cars.
        (
            Identity::TenantEdit,
            "cars-edit",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }] }),
            None,
        ),
        (
            Identity::TenantNoSecrets,
            "cars-nosecrets",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }] }),
            None,
        ),
        // The workload: `update` or `patch` (issue 21 hole 9). tenant-nopatch may update the
        // StatefulSet my-vcluster but patch none: admitted; it may do neither to lookalike.
        (
            Identity::TenantNoPatch,
            "cars-nopatch",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }] }),
            None,
        ),
        (
            Identity::TenantNoPatch,
            "lookalike-nopatch",
            json!({ "vcluster": { "name": "lookalike" }, "image": "example.com/p:1" }),
            Some(format!(
                "tenant-nopatch may not create or change VClusterPlugin lookalike-nopatch: the operator would change what they may not change themselves: spec.vcluster.name needs update or patch on apps/statefulsets named lookalike {ns_words}"
            )),
        ),
        // The RBAC objects the operator writes (issue 21 hole 6): tenant-norbac holds `edit`,
        // so everything the plugin grants, but may not create Roles or RoleBindings.
        (
            Identity::TenantNoRbac,
            "cars-norbac",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }] }),
            Some(format!(
                "tenant-norbac may not create or change VClusterPlugin cars-norbac: it would grant what they do not hold themselves: its Role vcp-plugin-cars-norbac (rbac.mode Dedicated) needs create on rbac.authorization.k8s.io/roles {ns_words}"
            )),
        ),
        // ... which a plugin image without rules does not get.
        (
            Identity::TenantNoRbac,
            "image-norbac",
            json!({ "image": "example.com/p:1" }),
            None,
        ),
        (
            Identity::TenantNoRbac,
            "patch-mode-norbac",
            json!({ "image": "example.com/p:1", "rbac": { "mode": "PatchVClusterRoles", "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }] } } }),
            Some(format!(
                "the vCluster Role it appends to (rbac.mode PatchVClusterRoles) needs update or patch on rbac.authorization.k8s.io/roles {ns_words}"
            )),
        ),
        (
            Identity::TenantEdit,
            "patch-mode-edit",
            json!({ "image": "example.com/p:1", "rbac": { "mode": "PatchVClusterRoles", "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }] } } }),
            None,
        ),
        // Cluster rules make a ClusterRole and its binding: even a rule every user holds
        // (`get /version`, `system:public-info-viewer`) needs `create` on both.
        (
            Identity::TenantEdit,
            "cluster-public-edit",
            json!({ "image": "example.com/p:1", "rbac": { "clusterRole": { "extraRules": [{ "nonResourceURLs": ["/version"], "verbs": ["get"] }] } } }),
            Some(format!(
                "its ClusterRole vcp:{ns}:cluster-public-edit (spec.rbac.clusterRole) needs create on rbac.authorization.k8s.io/clusterroles cluster-wide"
            )),
        ),
        (
            Identity::Admin,
            "cluster-public-admin",
            json!({ "image": "example.com/p:1", "rbac": { "clusterRole": { "extraRules": [{ "nonResourceURLs": ["/version"], "verbs": ["get"] }] } } }),
            None,
        ),
        // Derived rules of a synced type: the kind's plural, every verb the runtime gets.
        (
            Identity::TenantNoSecrets,
            "secrets-nosecrets",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "Secret" }] }),
            Some(format!(
                "spec.syncedTypes[0] (v1 Secret) needs get on secrets {ns_words}"
            )),
        ),
        (
            Identity::TenantEdit,
            "secrets-edit",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "Secret" }] }),
            None,
        ),
        (
            Identity::TenantNoSecrets,
            "configmaps-from-host",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "ConfigMap", "direction": "FromHost" }] }),
            None,
        ),
        // ToHost needs the write verbs: tenant-nosecrets only reads serviceaccounts.
        (
            Identity::TenantNoSecrets,
            "serviceaccounts-to-host",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "ServiceAccount" }] }),
            Some(format!(
                "spec.syncedTypes[0] (v1 ServiceAccount) needs create on serviceaccounts {ns_words}"
            )),
        ),
        (
            Identity::TenantNoSecrets,
            "serviceaccounts-from-host",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "ServiceAccount", "direction": "FromHost" }] }),
            None,
        ),
        // Kubernetes' plural guess: NetworkPolicy -> networkpolicies (held by `edit`).
        (
            Identity::TenantEdit,
            "networkpolicies",
            json!({ "syncedTypes": [{ "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy" }] }),
            None,
        ),
        (
            Identity::TenantNoSecrets,
            "networkpolicies-nosecrets",
            json!({ "syncedTypes": [{ "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "direction": "FromHost" }] }),
            Some(format!(
                "spec.syncedTypes[0] (networking.k8s.io/v1 NetworkPolicy) needs get on networking.k8s.io/networkpolicies {ns_words}"
            )),
        ),
        // Hooks: physical events need get/list/watch/update/patch; virtual ones nothing on the host.
        (
            Identity::TenantNoSecrets,
            "hook-physical",
            json!({ "hooks": [{ "name": "tag", "apiVersion": "v1", "kind": "Secret", "events": ["UpdatePhysical"], "labels": { "a": "b" } }] }),
            Some(format!(
                "spec.hooks[0] (tag) needs get on secrets {ns_words}"
            )),
        ),
        (
            Identity::TenantNoSecrets,
            "hook-virtual",
            json!({ "hooks": [{ "name": "tag", "apiVersion": "v1", "kind": "Secret", "events": ["CreateVirtual"], "labels": { "a": "b" } }] }),
            None,
        ),
        // Extra rules, namespaced: every apiGroup x resource x verb (x resourceName).
        (
            Identity::TenantNoSecrets,
            "extra-secrets",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"] }] } } }),
            Some(format!(
                "spec.rbac.role.extraRules[0] needs get on secrets {ns_words}"
            )),
        ),
        (
            Identity::TenantEdit,
            "extra-named-secret",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["db"], "verbs": ["get"] }] } } }),
            None,
        ),
        (
            Identity::TenantNoSecrets,
            "extra-named-secret-nosecrets",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["db"], "verbs": ["get"] }] } } }),
            Some(format!("needs get on secrets named db {ns_words}")),
        ),
        (
            Identity::TenantNoSecrets,
            "extra-exec",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"] }] } } }),
            Some(format!("needs create on pods/exec {ns_words}")),
        ),
        (
            Identity::TenantEdit,
            "extra-escalate",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"] }] } } }),
            Some(format!(
                "needs escalate on rbac.authorization.k8s.io/roles {ns_words}"
            )),
        ),
        // Extra rules, cluster-scoped: checked cluster-wide, so a namespace's rights do not count.
        (
            Identity::TenantEdit,
            "cluster-pods",
            json!({ "image": "example.com/p:1", "rbac": { "clusterRole": { "extraRules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] }] } } }),
            Some("spec.rbac.clusterRole.extraRules[0] needs list on pods cluster-wide".to_string()),
        ),
        (
            Identity::Admin,
            "cluster-pods-admin",
            json!({ "image": "example.com/p:1", "rbac": { "clusterRole": { "extraRules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] }] } } }),
            None,
        ),
        (
            Identity::TenantEdit,
            "cluster-metrics",
            json!({ "image": "example.com/p:1", "rbac": { "clusterRole": { "extraRules": [{ "nonResourceURLs": ["/metrics"], "verbs": ["get"] }] } } }),
            Some(
                "spec.rbac.clusterRole.extraRules[0] needs get on nonResourceURL /metrics"
                    .to_string(),
            ),
        ),
        // A value that would shift the checks' fields is refused as such.
        (
            Identity::Admin,
            "pipe-in-name",
            json!({ "image": "example.com/p:1", "rbac": { "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["a|b"], "verbs": ["get"] }] } } }),
            Some("must not contain '|' or a line break".to_string()),
        ),
    ];
    let mut failures = Vec::new();
    for (identity, name, spec, expected) in &cases {
        let client = cp.client(Cluster::Host, *identity).await;
        let api = Api::<VClusterPlugin>::namespaced(client, ns);
        let got = refusal(
            api.create(&PostParams::default(), &plugin(name, spec.clone()))
                .await,
        );
        match (expected, &got) {
            (None, None) => {}
            (Some(fragment), Some(message)) if message.contains(fragment.as_str()) => {
                println!("{name} by {}: refused: {message}", identity.user());
            }
            _ => failures.push(format!(
                "{name} by {}: expected {expected:?}, got {got:?}",
                identity.user()
            )),
        }
        let stored = Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
            .get_opt(name)
            .await
            .unwrap()
            .is_some();
        if stored != expected.is_none() {
            failures.push(format!("{name}: stored = {stored}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_change_is_judged_when_the_spec_changes_and_only_then() {
    let admin = setup().await;
    let ns = "adm-updates";
    create_namespace(&admin, ns).await;
    bind_tenant_rights(&admin, ns).await;
    let cp = ControlPlane::shared();
    let as_edit =
        Api::<VClusterPlugin>::namespaced(cp.client(Cluster::Host, Identity::TenantEdit).await, ns);
    let as_nosecrets = Api::<VClusterPlugin>::namespaced(
        cp.client(Cluster::Host, Identity::TenantNoSecrets).await,
        ns,
    );
    let as_admin = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let configmaps = json!({ "apiVersion": "v1", "kind": "ConfigMap", "direction": "FromHost" });
    let secrets = json!({ "apiVersion": "v1", "kind": "Secret", "direction": "FromHost" });
    as_edit
        .create(
            &PostParams::default(),
            &plugin("shared", json!({ "syncedTypes": [configmaps] })),
        )
        .await
        .expect("tenant-edit creates the plugin");

    // tenant-nosecrets may not add a type it cannot read.
    let add_secrets = json!({ "spec": { "syncedTypes": [configmaps, secrets] } });
    let refused = refusal(
        as_nosecrets
            .patch(
                "shared",
                &PatchParams::default(),
                &Patch::Merge(&add_secrets),
            )
            .await,
    )
    .expect("tenant-nosecrets adds secrets: refused");
    assert!(
        refused.contains("tenant-nosecrets may not create or change VClusterPlugin shared")
            && refused.contains("spec.syncedTypes[1] (v1 Secret) needs get on secrets"),
        "{refused}"
    );
    let stored = as_admin.get("shared").await.unwrap();
    assert_eq!(stored.spec.synced_types.len(), 1, "nothing changed");

    // Who may, may.
    as_edit
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&add_secrets),
        )
        .await
        .expect("tenant-edit adds secrets");

    // A change that leaves spec alone is not judged (labels; the operator's finalizer patch is
    // such a change too): tenant-nosecrets may label the plugin that now syncs Secrets.
    let label = json!({ "metadata": { "labels": { "team": "a" } } });
    let labelled = as_nosecrets
        .patch("shared", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("a label change is not judged");
    assert_eq!(labelled.labels().get("team").map(String::as_str), Some("a"));
    // ... and may delete it (deleting takes power away).
    as_nosecrets
        .delete("shared", &DeleteParams::default())
        .await
        .expect("deletion is not judged");
}

/// The namespace of [`the_operator_identity_is_bounded`] beside vCluster's own chart
/// ([`vcp_tests::vcluster_workload`]): an unrelated Deployment, a foreign Role and the chart's
/// Role.
const OPERATOR_FIXTURES: &str = r#"
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: web }
spec:
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      containers: [{ name: web, image: "nginx:1.27" }]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: foreign }
rules:
  - { apiGroups: [""], resources: [configmaps], verbs: [get] }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: vc-my-vcluster, labels: { app.kubernetes.io/managed-by: Helm } }
rules:
  - { apiGroups: [""], resources: [pods], verbs: [get, list] }
"#;

/// The objects the operator makes for plugin `p` in namespace `ns` (DESIGN.md, `rbac`:
/// `vcp-plugin-<name>` and `vcp:<namespace>:<name>`, labelled with the plugin's name and
/// namespace, bound to the vCluster's service account).
fn dedicated(ns: &str, kind: &str, rules_or_ref: Value) -> Value {
    let labels = json!({ "vcp.dev/plugin-name": "p", "vcp.dev/plugin-namespace": ns });
    let namespaced = kind == "Role" || kind == "RoleBinding";
    let name = if namespaced {
        "vcp-plugin-p".to_string()
    } else {
        format!("vcp:{ns}:p")
    };
    let mut obj = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": { "name": name, "labels": labels },
    });
    if namespaced {
        obj["metadata"]["namespace"] = json!(ns);
    }
    obj.as_object_mut()
        .unwrap()
        .extend(rules_or_ref.as_object().cloned().unwrap());
    obj
}

/// Server-side apply of `obj` as `client` (the operator's field manager).
async fn apply(client: &Client, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    let kind = obj.types.as_ref().unwrap().kind.clone();
    let (plural, namespaced) = match kind.as_str() {
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        other => panic!("{other}"),
    };
    let ar = kube::discovery::ApiResource {
        group: "rbac.authorization.k8s.io".into(),
        version: "v1".into(),
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: kind.clone(),
        plural: plural.into(),
    };
    let api: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(client.clone(), &obj.namespace().unwrap(), &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    };
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(vcp_crds::OPERATOR_FIELD_MANAGER),
        &Patch::Apply(&obj),
    )
    .await
}

#[tokio::test]
async fn the_operator_identity_is_bounded() {
    let admin = setup().await;
    let ns = "adm-operator";
    create_namespace(&admin, ns).await;
    apply_yaml(
        &admin,
        &format!("{}{OPERATOR_FIXTURES}", vcp_tests::vcluster_workload(ns)),
        Some(ns),
    )
    .await
    .expect("fixtures");
    let operator = ControlPlane::shared()
        .client(Cluster::Host, Identity::Operator)
        .await;
    let sa = json!([{ "kind": "ServiceAccount", "name": "vc-my-vcluster", "namespace": ns }]);
    let mut failures: Vec<String> = Vec::new();
    let mut refused = |what: &str, message: Option<String>, fragment: &str| match message {
        Some(m) if m.contains(fragment) && m.contains("vcluster-plugin-operator-bounds") => {
            println!("{what}: refused: {m}");
        }
        other => failures.push(format!(
            "{what}: expected refused by the operator's policy with {fragment:?}, got {other:?}"
        )),
    };

    // Binding cluster-admin, directly or under a dedicated name.
    refused(
        "ClusterRoleBinding to cluster-admin",
        refusal(apply(&operator, &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "vcp-operator-is-admin" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vcp-operator" }],
        })).await),
        "vcluster-plugin-operator may only create the RBAC objects it makes for a plugin",
    );
    refused(
        "a dedicated ClusterRoleBinding to cluster-admin",
        refusal(apply(&operator, &dedicated(ns, "ClusterRoleBinding", json!({
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
            "subjects": sa,
        }))).await),
        "may only bind the role it made for the same plugin",
    );
    refused(
        "a dedicated RoleBinding of a User",
        refusal(apply(&operator, &dedicated(ns, "RoleBinding", json!({
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-plugin-p" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vcp-operator" }],
        }))).await),
        "may only bind ServiceAccounts of the plugin namespace",
    );
    refused(
        "a dedicated ClusterRole with a wildcard",
        refusal(
            apply(
                &operator,
                &dedicated(
                    ns,
                    "ClusterRole",
                    json!({
                        "rules": [{ "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"] }],
                    }),
                ),
            )
            .await,
        ),
        "may not grant wildcards",
    );
    refused(
        "a dedicated ClusterRole that writes",
        refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "rules": [{ "apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"] }],
        }))).await),
        "nor anything but get/list/watch",
    );
    refused(
        "a dedicated ClusterRole reading secrets",
        refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["list"] }],
        }))).await),
        "never secrets",
    );
    refused(
        "an aggregated dedicated ClusterRole",
        refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "aggregationRule": { "clusterRoleSelectors": [{ "matchLabels": { "rbac.authorization.k8s.io/aggregate-to-admin": "true" } }] },
        }))).await),
        "may not make an aggregated ClusterRole",
    );
    refused(
        "a dedicated Role with escalate",
        refusal(apply(&operator, &dedicated(ns, "Role", json!({
            "rules": [{ "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"] }],
        }))).await),
        "may not grant wildcards, escalate, bind or impersonate",
    );
    refused(
        "a Role named like a dedicated one, labelled for another namespace",
        refusal(apply(&operator, &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "vcp-plugin-p", "namespace": ns, "labels": { "vcp.dev/plugin-name": "p", "vcp.dev/plugin-namespace": "elsewhere" } },
            "rules": [],
        })).await),
        "is not one",
    );

    // Deleting a foreign Role.
    let roles = Api::<Role>::namespaced(operator.clone(), ns);
    refused(
        "delete the foreign Role",
        refusal(roles.delete("foreign", &DeleteParams::default()).await),
        "may only delete the RBAC objects it makes",
    );
    assert!(
        Api::<Role>::namespaced(admin.clone(), ns)
            .get_opt("foreign")
            .await
            .unwrap()
            .is_some(),
        "the foreign Role is gone"
    );

    // Patching an unrelated Deployment (a container of its own, as the operator adds them).
    let deployments = Api::<Deployment>::namespaced(operator.clone(), ns);
    let before = Api::<Deployment>::namespaced(admin.clone(), ns)
        .get("web")
        .await
        .unwrap();
    let sidecar = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "web", "namespace": ns },
        "spec": { "template": { "spec": { "containers": [{ "name": "web", "image": "evil:1" }] } } },
    });
    refused(
        "patch the Deployment web",
        refusal(
            deployments
                .patch(
                    "web",
                    &PatchParams::apply(vcp_crds::OPERATOR_FIELD_MANAGER).force(),
                    &Patch::Apply(&sidecar),
                )
                .await,
        ),
        "may not change the containers it did not add to deployments/web: web",
    );
    let scale = json!({ "spec": { "replicas": 5 } });
    refused(
        "scale the Deployment web",
        refusal(
            deployments
                .patch("web", &PatchParams::default(), &Patch::Merge(&scale))
                .await,
        ),
        "only in the pod template's containers, initContainers and volumes",
    );
    let after = Api::<Deployment>::namespaced(admin.clone(), ns)
        .get("web")
        .await
        .unwrap();
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "web was written"
    );

    // The vCluster's StatefulSet: its own parts yes, the rest no.
    let statefulsets = Api::<StatefulSet>::namespaced(operator.clone(), ns);
    let pp = PatchParams::apply(vcp_crds::OPERATOR_FIELD_MANAGER);
    let own = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "my-vcluster", "namespace": ns },
        "spec": { "template": { "spec": {
            "containers": [
                { "name": "syncer", "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }] },
                { "name": "p", "image": "runtime:1", "volumeMounts": [{ "name": "vcp-vcluster-kubeconfig", "mountPath": "/var/run/vcp/vcluster", "readOnly": true }] },
            ],
            "initContainers": [{ "name": "q", "image": "plugin:1", "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }] }],
            "volumes": [
                { "name": "vcp-vcluster-kubeconfig", "secret": { "secretName": "vc-my-vcluster" } },
                { "name": "plugins", "emptyDir": {} },
            ],
        } } },
    });
    statefulsets
        .patch("my-vcluster", &pp, &Patch::Apply(&own))
        .await
        .expect("the operator adds its containers, init container, volumes and the /plugins mount");
    let mut updated = own.clone();
    updated["spec"]["template"]["spec"]["containers"][1]["image"] = json!("runtime:2");
    statefulsets
        .patch("my-vcluster", &pp, &Patch::Apply(&updated))
        .await
        .expect("the operator changes its own container");
    let mut hijack = updated.clone();
    hijack["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1");
    refused(
        "change the syncer's image",
        refusal(
            statefulsets
                .patch("my-vcluster", &pp.clone().force(), &Patch::Apply(&hijack))
                .await,
        ),
        "may not change the containers it did not add to statefulsets/my-vcluster: syncer",
    );
    let mut host_path = updated.clone();
    host_path["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "name": "root", "hostPath": { "path": "/" } }));
    refused(
        "add a hostPath volume",
        refusal(
            statefulsets
                .patch("my-vcluster", &pp, &Patch::Apply(&host_path))
                .await,
        ),
        "may only add the volumes plugins (emptyDir) and vcp-vcluster-kubeconfig",
    );
    let remove_all = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": { "name": "my-vcluster", "namespace": ns },
    });
    let restored = statefulsets
        .patch("my-vcluster", &pp, &Patch::Apply(&remove_all))
        .await
        .expect("the operator removes everything it added");
    let pod = restored.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["syncer"]
    );

    // Pods: only the dry run of the Pod Security check.
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": { "name": "vcluster-pod", "namespace": ns },
        "spec": { "serviceAccountName": "vc-my-vcluster", "containers": [{ "name": "syncer", "image": "evil:1" }] },
    }))
    .unwrap();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(operator.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        field_manager: None,
    };
    pods.create(&dry, &pod)
        .await
        .expect("the operator's Pod Security check: a dry run");
    refused(
        "create a real Pod",
        refusal(pods.create(&PostParams::default(), &pod).await),
        "may create pods only as a server-side dry run",
    );

    // What it makes for a plugin passes: dedicated objects, created, changed and deleted.
    for obj in [
        dedicated(
            ns,
            "Role",
            json!({ "rules": [{ "apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"] }] }),
        ),
        dedicated(
            ns,
            "RoleBinding",
            json!({ "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-plugin-p" }, "subjects": sa }),
        ),
        dedicated(
            ns,
            "ClusterRole",
            json!({ "rules": [{ "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"] }] }),
        ),
        dedicated(
            ns,
            "ClusterRoleBinding",
            json!({ "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("vcp:{ns}:p") }, "subjects": sa }),
        ),
    ] {
        apply(&operator, &obj)
            .await
            .unwrap_or_else(|e| panic!("the operator's own {}: {e}", obj["kind"]));
    }
    Api::<RoleBinding>::namespaced(operator.clone(), ns)
        .delete("vcp-plugin-p", &DeleteParams::default())
        .await
        .expect("delete its RoleBinding");
    roles
        .delete("vcp-plugin-p", &DeleteParams::default())
        .await
        .expect("delete its Role");
    Api::<ClusterRoleBinding>::all(operator.clone())
        .delete(&format!("vcp:{ns}:p"), &DeleteParams::default())
        .await
        .expect("delete its ClusterRoleBinding");
    Api::<ClusterRole>::all(operator.clone())
        .delete(&format!("vcp:{ns}:p"), &DeleteParams::default())
        .await
        .expect("delete its ClusterRole");

    // rbac.mode PatchVClusterRoles: the chart's Role may get rules it records, nothing else.
    let chart = Api::<Role>::namespaced(operator.clone(), ns);
    let live = chart.get("vc-my-vcluster").await.unwrap();
    let cars = json!({ "apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get", "list"] });
    let helm_rule = json!({ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"] });
    let record = |rules: &Value| serde_json::to_string(rules).unwrap();
    let recorded = json!({
        "metadata": { "resourceVersion": live.resource_version(), "annotations": { "vcp.dev/added-rules.p": record(&json!([cars])) } },
        "rules": [helm_rule, cars],
    });
    let patched = chart
        .patch(
            "vc-my-vcluster",
            &PatchParams::default(),
            &Patch::Merge(&recorded),
        )
        .await
        .expect("append recorded rules to the chart's Role");
    for (what, patch, fragment) in [
        (
            "append an unrecorded rule",
            json!({ "rules": [helm_rule, cars, { "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"] }] }),
            "only the rules its vcp.dev/added-rules.* annotations record",
        ),
        (
            "remove Helm's rule",
            json!({ "rules": [cars] }),
            "only the rules its vcp.dev/added-rules.* annotations record",
        ),
        (
            "relabel the chart's Role",
            json!({ "metadata": { "labels": { "app.kubernetes.io/managed-by": "vcp" } } }),
            "only in its rules and its vcp.dev/added-rules.* annotations",
        ),
        (
            "append a recorded wildcard",
            json!({
                "metadata": { "annotations": { "vcp.dev/added-rules.p": record(&json!([cars, { "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"] }])) } },
                "rules": [helm_rule, cars, { "apiGroups": ["*"], "resources": ["*"], "verbs": ["*"] }],
            }),
            "may not grant wildcards",
        ),
    ] {
        refused(
            what,
            refusal(
                chart
                    .patch(
                        "vc-my-vcluster",
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await,
            ),
            fragment,
        );
    }
    let restore = json!({
        "metadata": { "resourceVersion": patched.resource_version(), "annotations": { "vcp.dev/added-rules.p": null } },
        "rules": [helm_rule],
    });
    let restored = chart
        .patch(
            "vc-my-vcluster",
            &PatchParams::default(),
            &Patch::Merge(&restore),
        )
        .await
        .expect("take the recorded rules out again");
    assert_eq!(
        serde_json::to_value(&restored.rules).unwrap(),
        json!([helm_rule])
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `value` wrapped in `levels` objects (`{"a": ...}`) or lists (`[...]`).
fn nested(levels: usize, in_lists: bool, mut value: Value) -> Value {
    for _ in 0..levels {
        value = if in_lists {
            json!([value])
        } else {
            json!({ "a": value })
        };
    }
    value
}

/// The nesting bound of the free-form fields (`free-form-depth.yaml`): a `config` or a hook's
/// `jsonPatch[].value` nests at most 32 levels of objects and lists, counted by construction
/// here (a leaf `1` wrapped in n levels); one level more is refused naming the field and the
/// limit, for objects and for lists alike, and a deep-ish legitimate config (10 levels) is
/// stored.
#[tokio::test]
async fn free_form_values_nest_at_most_32_levels() {
    let admin = setup().await;
    let ns = "adm-depth";
    create_namespace(&admin, ns).await;
    bind_tenant_rights(&admin, ns).await;
    let tenant = ControlPlane::shared()
        .client(Cluster::Host, Identity::TenantEdit)
        .await;
    let api = Api::<VClusterPlugin>::namespaced(tenant, ns);
    assert_eq!(vcp_crds::free_form::MAX_FREE_FORM_DEPTH, 32);
    let config = |levels: usize, in_lists: bool| {
        // `config` is an object itself: one level, then the rest inside its key `c`.
        json!({ "image": "example.com/p:1", "version": "v1",
                "config": { "c": nested(levels - 1, in_lists, json!(1)) } })
    };
    let hook = |levels: usize, in_lists: bool| {
        json!({ "image": "example.com/p:1", "hooks": [{
            "name": "h", "apiVersion": "v1", "kind": "ConfigMap", "events": ["CreateVirtual"],
            "jsonPatch": [
                { "op": "add", "path": "/data/x", "value": "plain" },
                { "op": "add", "path": "/data/y", "value": nested(levels, in_lists, json!(1)) },
            ],
        }] })
    };
    let config_refusal = "spec.config is nested deeper than 32 levels of objects and lists";
    let hook_refusal = "spec.hooks[].jsonPatch[].value is nested deeper than 32 levels";
    let mut cases: Vec<(String, Value, Option<&str>)> = Vec::new();
    for in_lists in [false, true] {
        let shape = if in_lists { "lists" } else { "maps" };
        for (levels, refused) in [(10, false), (32, false), (33, true), (200, true)] {
            let spec = config(levels, in_lists);
            assert_eq!(
                vcp_crds::free_form::depth(&spec["config"]),
                levels,
                "the test's own nesting"
            );
            cases.push((
                format!("config-{shape}-{levels}"),
                spec,
                refused.then_some(config_refusal),
            ));
            cases.push((
                format!("hook-{shape}-{levels}"),
                hook(levels, in_lists),
                refused.then_some(hook_refusal),
            ));
        }
    }
    let mut failures = Vec::new();
    for (name, spec, want) in &cases {
        let result = api
            .create(&PostParams::default(), &plugin(name, spec.clone()))
            .await;
        match (refusal(result), want) {
            (None, None) => {
                api.delete(name, &DeleteParams::default())
                    .await
                    .expect("delete an admitted plugin");
            }
            (Some(message), Some(fragment))
                if message.contains(fragment) && message.contains("vcp-plugin-free-form-depth") => {
            }
            (got, want) => failures.push(format!("{name}: got {got:?}, want {want:?}")),
        }
        assert!(
            want.is_none() || api.get_opt(name).await.expect("get").is_none(),
            "{name}: refused, yet stored"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
