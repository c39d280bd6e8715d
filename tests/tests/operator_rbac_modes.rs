//! `rbac.mode: PatchVClusterRoles` end to end on the real host API server, the operator
//! in-process under the `vcp-operator` identity: the plugin's rules are appended to the Role the
//! vCluster chart binds to `vc-<vcluster>`, recorded in an annotation, and removing the plugin
//! restores that Role's rules, labels and annotations exactly. Refusals decided by the
//! operator from cluster state (no Role bound to the vCluster) and by policy write nothing for
//! the plugin, and take back what an earlier generation of it was given.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_tests::{apply_yaml, delete_plugin, vcluster_workload, wait_event, wait_for, wait_ready};

const NS: &str = "rbac-patch-mode";
const TIMEOUT: Duration = Duration::from_secs(30);

/// CRDs, the operator's RBAC, and one operator for this test binary on its own runtime.
async fn setup() -> Client {
    vcp_tests::start_shared_operator("vcp-test/runtime:rbac-modes").await
}

/// The chart's Role (as Helm labels it) and its RoleBinding, after [`vcluster_workload`].
const CHART_RBAC: &str = r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: vc-my-vcluster
  labels: { app.kubernetes.io/managed-by: Helm }
  annotations: { meta.helm.sh/release-name: my-vcluster }
rules:
  - apiGroups: [""]
    resources: [pods, services]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [apps]
    resources: [statefulsets]
    verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vc-my-vcluster }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }
subjects:
  - { kind: ServiceAccount, name: vc-my-vcluster, namespace: rbac-patch-mode }
"#;

/// Write requests of the operator (audit log) in namespace `ns` whose URI contains `part`,
/// once the audit log holds every request answered before the call.
async fn operator_writes_to(ns: &str, part: &str) -> Vec<(String, String)> {
    vcp_tests::Audit::writes()
        .by(vcp_tests::Identity::Operator)
        .in_namespace(ns)
        .uri_contains(part)
        .caught_up()
        .await
        .requests()
}

/// The parts of the Role that must come back exactly: rules, labels, annotations.
fn restorable(r: &Role) -> Value {
    json!({
        "rules": r.rules,
        "labels": r.metadata.labels,
        "annotations": r.metadata.annotations,
    })
}

#[tokio::test]
async fn patch_mode_appends_to_the_vcluster_role_and_removal_restores_it_exactly() {
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(
        &admin,
        &format!("{}{CHART_RBAC}", vcluster_workload(NS)),
        Some(NS),
    )
    .await
    .expect("vCluster");
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let original = roles.get("vc-my-vcluster").await.unwrap();

    apply_yaml(
        &admin,
        r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: car-syncer }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
  rbac:
    mode: PatchVClusterRoles
    role:
      extraRules:
        - { apiGroups: [""], resources: [configmaps], verbs: [get] }
"#,
        Some(NS),
    )
    .await
    .expect("plugin");
    wait_ready(&admin, NS, "car-syncer", "True", None, TIMEOUT).await;

    // The chart's Role carries the original rules first, then the plugin's, recorded.
    let patched = roles.get("vc-my-vcluster").await.unwrap();
    let rules = patched.rules.clone().unwrap();
    let original_rules = original.rules.clone().unwrap();
    assert_eq!(rules[..original_rules.len()], original_rules[..]);
    let added = &rules[original_rules.len()..];
    assert!(
        added
            .iter()
            .any(|r| r.resources == Some(vec!["cars".into()])
                && r.verbs.contains(&"delete".to_string())),
        "{added:?}"
    );
    assert!(
        added
            .iter()
            .any(|r| r.resources == Some(vec!["configmaps".into()]))
    );
    let recorded: Value = serde_json::from_str(
        &patched.metadata.annotations.as_ref().unwrap()["vcp.dev/added-rules.car-syncer"],
    )
    .unwrap();
    assert_eq!(recorded, json!({ "added": added, "present": [] }));
    assert!(
        roles
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none(),
        "no dedicated Role in PatchVClusterRoles mode"
    );

    // Converged: another reconcile does not touch the Role. Evidence first: the operator
    // finished a reconcile of the poked plugin; then neither the Role's resourceVersion nor the
    // audit log (a no-op patch keeps the resourceVersion, but is a write) shows a write.
    let role_writes_before = operator_writes_to(NS, "/roles/vc-my-vcluster").await;
    let reconciles = vcp_tests::poke_plugin(&admin, NS, "car-syncer", TIMEOUT).await;
    let role_writes_after = operator_writes_to(NS, "/roles/vc-my-vcluster").await;
    println!(
        "PatchVClusterRoles converged: poked the plugin, the operator finished reconcile \
         #{reconciles} of it; operator writes to Role vc-my-vcluster: {} before, {} after",
        role_writes_before.len(),
        role_writes_after.len()
    );
    assert_eq!(
        role_writes_after, role_writes_before,
        "a converged plugin's reconcile wrote the vCluster's Role"
    );
    assert_eq!(
        roles
            .get("vc-my-vcluster")
            .await
            .unwrap()
            .metadata
            .resource_version,
        patched.metadata.resource_version
    );

    delete_plugin(&admin, NS, "car-syncer", TIMEOUT).await;
    let restored = roles.get("vc-my-vcluster").await.unwrap();
    assert_eq!(restorable(&restored), restorable(&original));
    assert_eq!(
        serde_json::to_string(&restored.rules).unwrap(),
        serde_json::to_string(&original.rules).unwrap(),
        "byte for byte"
    );
}

/// Security review, finding 4: the chart's Role already grants the rule a plugin needs. The
/// plugin appends nothing (its record shows the rule as `present`, the Role's rules are
/// unchanged); an apply of the chart's rules as Helm makes it (a merge patch of the whole atomic
/// list by another field manager) and a reconcile leave it so; deleting the plugin leaves the
/// Role's rules byte for byte as the chart made them, its rule included. (Before, the rule was
/// appended again and recorded as added; after the chart's apply one copy was left, and the
/// delete took out the chart's own rule.)
#[tokio::test]
async fn patch_mode_never_takes_out_a_rule_the_charts_role_already_had() {
    const NS: &str = "rbac-patch-present";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    let chart_role = format!(
        r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: vc-my-vcluster
  labels: {{ app.kubernetes.io/managed-by: Helm }}
  annotations: {{ meta.helm.sh/release-name: my-vcluster }}
rules:
  - {{ apiGroups: [""], resources: [pods], verbs: [get, list, watch] }}
  - {{ apiGroups: [""], resources: [configmaps], verbs: [get] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: vc-my-vcluster }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }}
subjects:
  - {{ kind: ServiceAccount, name: vc-my-vcluster, namespace: {NS} }}
"#
    );
    apply_yaml(
        &admin,
        &format!("{}{chart_role}", vcluster_workload(NS)),
        Some(NS),
    )
    .await
    .expect("vCluster");
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let original = roles.get("vc-my-vcluster").await.unwrap();
    let chart_rule = json!({ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] });

    // A v1 image plugin whose only rule is the chart's second one.
    apply_yaml(
        &admin,
        r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: cm-reader }
spec:
  vcluster: { name: my-vcluster }
  image: registry.example.com/plugins/cm-reader:1.0
  version: v1
  rbac:
    mode: PatchVClusterRoles
    role:
      extraRules:
        - { apiGroups: [""], resources: [configmaps], verbs: [get] }
"#,
        Some(NS),
    )
    .await
    .expect("plugin");
    wait_ready(&admin, NS, "cm-reader", "True", None, TIMEOUT).await;
    let record = "vcp.dev/added-rules.cm-reader";
    let installed = wait_for(TIMEOUT, || {
        let roles = roles.clone();
        async move {
            let r = roles.get("vc-my-vcluster").await.ok()?;
            r.annotations().contains_key(record).then_some(r)
        }
    })
    .await;
    let recorded: Value = serde_json::from_str(&installed.annotations()[record]).unwrap();
    println!(
        "the chart's Role already holds the plugin's rule: record {recorded}, rules {}",
        serde_json::to_string(&installed.rules).unwrap()
    );
    assert_eq!(recorded, json!({ "added": [], "present": [chart_rule] }));
    assert_eq!(
        serde_json::to_string(&installed.rules).unwrap(),
        serde_json::to_string(&original.rules).unwrap(),
        "nothing appended"
    );

    // Helm applies the chart again: `rules` set to the chart's list, whole.
    roles
        .patch(
            "vc-my-vcluster",
            &kube::api::PatchParams {
                field_manager: Some("helm".into()),
                ..Default::default()
            },
            &kube::api::Patch::Merge(json!({ "rules": original.rules })),
        )
        .await
        .expect("the chart's apply");
    vcp_tests::poke_plugin(&admin, NS, "cm-reader", TIMEOUT).await;

    delete_plugin(&admin, NS, "cm-reader", TIMEOUT).await;
    let restored = roles.get("vc-my-vcluster").await.unwrap();
    println!(
        "plugin deleted: rules {}",
        serde_json::to_string(&restored.rules).unwrap()
    );
    assert_eq!(
        serde_json::to_string(&restored.rules).unwrap(),
        serde_json::to_string(&original.rules).unwrap(),
        "byte for byte, the chart's configmaps rule included"
    );
    assert_eq!(restorable(&restored), restorable(&original));
}

/// A vCluster-shaped namespace `ns`: ServiceAccount and StatefulSet; with `chart_role`, the
/// chart's Role `vc-my-vcluster` and the RoleBinding to the ServiceAccount, else only a Role
/// `unrelated` that nothing binds.
fn vcluster_in(ns: &str, chart_role: bool) -> String {
    let roles = if chart_role {
        format!(
            r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: vc-my-vcluster }}
rules:
  - {{ apiGroups: [""], resources: [pods], verbs: [get] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: vc-my-vcluster }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }}
subjects:
  - {{ kind: ServiceAccount, name: vc-my-vcluster, namespace: {ns} }}
"#
        )
    } else {
        r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: unrelated }
rules:
  - { apiGroups: [""], resources: [pods], verbs: [get] }
"#
        .to_string()
    };
    format!("{}{roles}", vcluster_workload(ns))
}

/// Names of the containers of the StatefulSet `my-vcluster` in `ns`.
async fn containers(admin: &Client, ns: &str) -> Vec<String> {
    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect()
}

#[tokio::test]
async fn patch_mode_without_a_bound_role_is_refused_before_anything_is_written() {
    const NS: &str = "rbac-no-vcluster-role";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, &vcluster_in(NS, false), Some(NS))
        .await
        .expect("vCluster");
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS);
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let sts_before = sts.get("my-vcluster").await.unwrap().resource_version();
    let role_before = roles.get("unrelated").await.unwrap().resource_version();

    apply_yaml(
        &admin,
        r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: no-role }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
  rbac: { mode: PatchVClusterRoles }
"#,
        Some(NS),
    )
    .await
    .expect("plugin");
    wait_ready(
        &admin,
        NS,
        "no-role",
        "False",
        Some("VClusterRoleNotFound"),
        TIMEOUT,
    )
    .await;
    wait_event(&admin, NS, "no-role", "VClusterRoleNotFound", TIMEOUT).await;
    // Evidence that the operator looked again after its refusal (status and Event written):
    // a reconcile of the poked plugin finished; then nothing of the vCluster was written.
    let reconciles = vcp_tests::poke_plugin(&admin, NS, "no-role", TIMEOUT).await;
    let writes = operator_writes_to(NS, "").await;
    let workload_or_rbac: Vec<_> = writes
        .iter()
        .filter(|(_, uri)| !uri.contains("/vclusterplugins/") && !uri.contains("/events"))
        .collect();
    println!(
        "refused plugin (VClusterRoleNotFound): {reconciles} reconciles finished; operator \
         writes in {NS}: {} in all, {} to the workload or RBAC",
        writes.len(),
        workload_or_rbac.len()
    );
    assert!(workload_or_rbac.is_empty(), "{workload_or_rbac:?}");
    assert_eq!(
        sts.get("my-vcluster").await.unwrap().resource_version(),
        sts_before,
        "the StatefulSet was written for a refused plugin: {:?}",
        containers(&admin, NS).await
    );
    assert_eq!(
        roles.get("unrelated").await.unwrap().resource_version(),
        role_before
    );
    let names: Vec<String> = roles
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    assert_eq!(names, ["unrelated"]);
}

#[tokio::test]
async fn an_installed_plugin_edited_into_a_denied_one_loses_its_container_and_rbac() {
    const NS: &str = "rbac-refused-later";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, &vcluster_in(NS, true), Some(NS))
        .await
        .expect("vCluster");
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), NS);
    let chart_role_before = roles.get("vc-my-vcluster").await.unwrap();
    let plugin = |extra: &str| {
        format!(
            r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: {{ name: later-denied }}
spec:
  vcluster: {{ name: my-vcluster }}
  syncedTypes:
    - {{ apiVersion: example.loft.sh/v1, kind: Car }}
  rbac:
    role:
      extraRules:
        - {{ apiGroups: [""], resources: [configmaps], verbs: [get] }}
{extra}
"#
        )
    };
    apply_yaml(&admin, &plugin(""), Some(NS))
        .await
        .expect("plugin");
    wait_ready(&admin, NS, "later-denied", "True", None, TIMEOUT).await;
    assert!(
        containers(&admin, NS)
            .await
            .contains(&"later-denied".to_string())
    );
    assert!(
        roles
            .get_opt("vcp-plugin-later-denied")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        bindings
            .get_opt("vcp-plugin-later-denied")
            .await
            .unwrap()
            .is_some()
    );

    apply_yaml(
        &admin,
        &plugin(
            "        - { apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [escalate] }",
        ),
        Some(NS),
    )
    .await
    .expect("edit");
    wait_ready(
        &admin,
        NS,
        "later-denied",
        "False",
        Some("PolicyDenied"),
        TIMEOUT,
    )
    .await;
    wait_for(TIMEOUT, || {
        let (admin, roles, bindings) = (admin.clone(), roles.clone(), bindings.clone());
        async move {
            let gone = !containers(&admin, NS)
                .await
                .contains(&"later-denied".to_string())
                && roles
                    .get_opt("vcp-plugin-later-denied")
                    .await
                    .ok()?
                    .is_none()
                && bindings
                    .get_opt("vcp-plugin-later-denied")
                    .await
                    .ok()?
                    .is_none();
            gone.then_some(())
        }
    })
    .await;
    // The plugin can still be deleted, and the chart's Role was never touched (a Dedicated
    // plugin has its own Role): the operator's last act, removing the finalizer, is over once
    // the plugin is gone, and neither the Role nor the audit log shows a write of it.
    delete_plugin(&admin, NS, "later-denied", TIMEOUT).await;
    assert_eq!(containers(&admin, NS).await, ["syncer"]);
    let chart_role_after = roles.get("vc-my-vcluster").await.unwrap();
    let chart_role_writes = operator_writes_to(NS, "/roles/vc-my-vcluster").await;
    println!(
        "Dedicated plugin installed, denied, deleted: operator writes to the chart's Role \
         vc-my-vcluster: {}; its resourceVersion {:?} -> {:?}",
        chart_role_writes.len(),
        chart_role_before.resource_version(),
        chart_role_after.resource_version()
    );
    assert_eq!(chart_role_writes, Vec::<(String, String)>::new());
    assert_eq!(
        restorable(&chart_role_after),
        restorable(&chart_role_before)
    );
    assert_eq!(
        chart_role_after.resource_version(),
        chart_role_before.resource_version()
    );
}
