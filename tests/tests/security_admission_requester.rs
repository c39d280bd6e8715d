//! Requester-bound admission (`config/admission/requester.yaml`, README.md "Security model")
//! on the real host API server, with the static-token users of the local control plane: a
//! tenant may create or change a VClusterPlugin only when they hold every permission it would
//! give the vCluster and may write every object the operator writes for it: `update` or
//! `patch` on the target workload, the verbs the runtime gets on each synced and hooked type,
//! each extra rule (in the namespace, or cluster-wide for `rbac.clusterRole`), `create` on the
//! Role and RoleBinding (or ClusterRole and ClusterRoleBinding) the operator creates, `update`
//! or `patch` on roles when it appends to the vCluster's Role. The operator's own bounds are
//! in `security_admission_operator.rs`.
//!
//! No operator runs in this test binary: every write is made by the test, as the identity named.
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, bind_tenant_rights, create_namespace};

/// The CRDs, the operator's RBAC bound to `vcp-operator`, and both policies.
async fn setup() -> Client {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::prepare_operator_host(cp, &admin).await;
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
        // The workload: `update` or `patch`. tenant-nopatch may update the
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
        // The RBAC objects the operator writes: tenant-norbac holds `edit`,
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
        // The kind a reference patch names and the kind a ToHost type brings back
        // (`produced`): get, list, watch in the namespace.
        (
            Identity::TenantNoSecrets,
            "reference-secret",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "patches": [{ "path": "spec.secretName", "reference": { "apiVersion": "v1", "kind": "Secret" } }] }] }),
            Some(format!(
                "spec.syncedTypes[0].patches[0].reference (v1 Secret) needs get on secrets {ns_words}"
            )),
        ),
        (
            Identity::TenantNoSecrets,
            "produced-secret",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "produced": [{ "apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName" }] }] }),
            Some(format!(
                "spec.syncedTypes[0].produced[0] (v1 Secret) needs get on secrets {ns_words}"
            )),
        ),
        (
            Identity::TenantNoSecrets,
            "produced-configmap",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "patches": [{ "path": "spec.config", "reference": { "apiVersion": "v1", "kind": "ConfigMap" } }],
                "produced": [{ "apiVersion": "v1", "kind": "ConfigMap", "namePath": "spec.config" }] }] }),
            None,
        ),
        (
            Identity::TenantEdit,
            "produced-secret-edit",
            json!({ "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "patches": [{ "path": "spec.secretName", "reference": { "apiVersion": "v1", "kind": "Secret" } }],
                "produced": [{ "apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName" }] }] }),
            None,
        ),
        // FromHost mappings read only the plugin's own namespace (`/name` and `""` mean it).
        (
            Identity::TenantEdit,
            "mapping-kube-system",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "ConfigMap", "direction": "FromHost",
                "mappings": { "byName": { format!("{ns}/*"): "a/*", "kube-system/*": "b/*" } } }] }),
            Some(format!(
                "tenant-edit may not create or change VClusterPlugin mapping-kube-system: spec.syncedTypes[0].mappings.byName key \"kube-system/*\" names a host namespace other than the plugin's ({ns}); a mapping may only copy objects of the vCluster's own host namespace"
            )),
        ),
        (
            Identity::TenantEdit,
            "mapping-own",
            json!({ "syncedTypes": [{ "apiVersion": "v1", "kind": "ConfigMap", "direction": "FromHost",
                "mappings": { "byName": { format!("{ns}/*"): "a/*", format!("{ns}/one"): "b/two", "/cm": "c/cm", "": "d" } } }] }),
            None,
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
        let got = vcp_tests::refusal(
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
    let refused = vcp_tests::refusal(
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
        match (vcp_tests::refusal(result), want) {
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
