//! The operator's own power bounded by admission (`config/admission/operator-bounds.yaml`,
//! README.md "Security model") on the real host API server: the operator's identity
//! (`vcp-operator` here, through tests/fixtures/admission) may write only the RBAC objects it
//! makes for plugins and its own parts of workloads. Requester-bound admission is in
//! `security_admission_requester.rs`.
//!
//! No operator runs in this test binary: every write is made by the test, as the identity named.
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_tests::{Cluster, ControlPlane, Identity, apply_yaml, create_namespace};

/// The CRDs, the operator's RBAC bound to `vcp-operator`, and both policies.
async fn setup() -> Client {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::prepare_operator_host(cp, &admin).await;
    admin
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

/// The objects the operator makes for plugin `p` in namespace `ns` (the rule of `rbac`:
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
        vcp_tests::refusal(apply(&operator, &json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "vcp-operator-is-admin" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vcp-operator" }],
        })).await),
        "vcluster-plugin-operator may only create the RBAC objects it makes for a plugin",
    );
    refused(
        "a dedicated ClusterRoleBinding to cluster-admin",
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "ClusterRoleBinding", json!({
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
            "subjects": sa,
        }))).await),
        "may only bind the role it made for the same plugin",
    );
    refused(
        "a dedicated RoleBinding of a User",
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "RoleBinding", json!({
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-plugin-p" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vcp-operator" }],
        }))).await),
        "may only bind ServiceAccounts of the plugin namespace",
    );
    refused(
        "a dedicated ClusterRole with a wildcard",
        vcp_tests::refusal(
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
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "rules": [{ "apiGroups": [""], "resources": ["namespaces"], "verbs": ["create"] }],
        }))).await),
        "nor anything but get/list/watch",
    );
    refused(
        "a dedicated ClusterRole reading secrets",
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["list"] }],
        }))).await),
        "never secrets",
    );
    refused(
        "an aggregated dedicated ClusterRole",
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "ClusterRole", json!({
            "aggregationRule": { "clusterRoleSelectors": [{ "matchLabels": { "rbac.authorization.k8s.io/aggregate-to-admin": "true" } }] },
        }))).await),
        "may not make an aggregated ClusterRole",
    );
    refused(
        "a dedicated Role with escalate",
        vcp_tests::refusal(apply(&operator, &dedicated(ns, "Role", json!({
            "rules": [{ "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"] }],
        }))).await),
        "may not grant wildcards, escalate, bind or impersonate",
    );
    refused(
        "a Role named like a dedicated one, labelled for another namespace",
        vcp_tests::refusal(apply(&operator, &json!({
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
        vcp_tests::refusal(roles.delete("foreign", &DeleteParams::default()).await),
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
        vcp_tests::refusal(
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
        vcp_tests::refusal(
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
        vcp_tests::refusal(
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
        vcp_tests::refusal(
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
        vcp_tests::refusal(pods.create(&PostParams::default(), &pod).await),
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
            vcp_tests::refusal(
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
