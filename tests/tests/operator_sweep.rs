//! Nothing is left behind, end to end on the real host API server with the
//! operator binary as a process.
//!
//! Two plugins of one vCluster are installed: `cars` in `rbac.mode: Dedicated` (a Role and
//! RoleBinding, a ClusterRole and ClusterRoleBinding, a sidecar) and `patcher` in
//! `rbac.mode: PatchVClusterRoles` (its rules appended to the chart's Role and recorded in a
//! `vcp.dev/added-rules.*` annotation, a sidecar). Then:
//! - (a) with the operator running, the tenant removes the finalizer with a JSON patch
//!   (`kubectl patch --type=json`, as the attack did) and deletes each plugin; the delete is
//!   made with the resourceVersion of the patched object as a precondition, so it deletes a
//!   plugin without the finalizer (when the operator put it back first, the tenant tries
//!   again). A third plugin, `stays`, must keep everything it has;
//! - (b) the operator is stopped, the tenant deletes the plugins and removes their finalizers
//!   meanwhile, and the operator is started again.
//!
//! Each time, every object the operator made for the deleted plugins must go (the
//! ClusterRole, ClusterRoleBinding, Role, RoleBinding, the rules and annotation in the chart's
//! Role, the containers in the workload), the chart's Role must be what it was byte for byte in
//! its rules, labels and annotations, and the audit log must show the operator's own deletes
//! (no garbage collector runs on this control plane). In (b) the pod template must be the
//! chart's again.
//!
//! One test, so this binary's operator processes are the only ones reconciling.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcluster_plugin_operator::rbac::added_rules_annotation;
use vcp_crds::{FINALIZER, VClusterPlugin};
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess, wait_for, wait_ready,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The chart's Role and RoleBinding for the vCluster's service account, as Helm labels them.
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
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vc-my-vcluster }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }
subjects:
  - { kind: ServiceAccount, name: vc-my-vcluster, namespace: NAMESPACE }
"#;

/// Starts the operator binary as replica `name`.
fn start(name: &str) -> OperatorProcess {
    let options = OperatorOptions {
        kubeconfig: ControlPlane::shared().kubeconfig(Cluster::Host, Identity::Operator),
        runtime_image: "vcp-test/runtime:sweep".into(),
        abort_after_writes: None,
        stop_after_writes: None,
        leader_election: None,
        concurrency: None,
    };
    OperatorProcess::start(name, ControlPlane::shared().dir(), &options)
}

/// SIGTERM once `op` is ready, as a rolling update would.
async fn stop(op: OperatorProcess) {
    wait_for(TIMEOUT, || async {
        (op.get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    tokio::task::spawn_blocking(move || op.terminate(TIMEOUT))
        .await
        .expect("terminate");
}

/// CRDs, the operator's RBAC and the admission policies bounding it.
async fn setup(admin: &Client) {
    vcp_tests::prepare_operator_host(ControlPlane::shared(), admin).await;
}

/// The namespace `ns` with a vCluster's workload and Role as its chart renders them, and the
/// tenants' rights.
async fn prepare(admin: &Client, ns: &str) {
    vcp_tests::create_namespace(admin, ns).await;
    let yaml = format!(
        "{}{}",
        vcp_tests::vcluster_workload(ns),
        CHART_RBAC.replace("NAMESPACE", ns)
    );
    vcp_tests::apply_yaml(admin, &yaml, Some(ns))
        .await
        .expect("the vCluster's workload and Role");
    vcp_tests::bind_tenant_rights(admin, ns).await;
}

/// Creates the plugins `cars` (Dedicated, syncing Cars, with a cluster rule of its own, since
/// nothing cluster-wide is derived from a synced type: Role, RoleBinding, ClusterRole,
/// ClusterRoleBinding) and `patcher` (PatchVClusterRoles), and `extra` ones without synced
/// types, and waits until all are Ready.
async fn install(admin: &Client, ns: &str, extra: &[&str]) {
    let mut plugins = vec![
        (
            "cars",
            json!({
                "vcluster": { "name": "my-vcluster" },
                "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }],
                "rbac": { "clusterRole": { "extraRules": [{
                    "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                    "verbs": ["get", "list", "watch"],
                }] } },
            }),
        ),
        (
            "patcher",
            json!({
                "vcluster": { "name": "my-vcluster" },
                "rbac": {
                    "mode": "PatchVClusterRoles",
                    "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }] },
                },
            }),
        ),
    ];
    for name in extra {
        plugins.push((name, json!({ "vcluster": { "name": "my-vcluster" } })));
    }
    for (name, spec) in &plugins {
        vcp_tests::create_plugin(admin, ns, name, spec.clone()).await;
    }
    for (name, _) in &plugins {
        wait_ready(admin, ns, name, "True", None, TIMEOUT).await;
    }
}

/// The parts of the chart's Role that must come back exactly.
fn restorable(r: &Role) -> Value {
    json!({
        "rules": r.rules,
        "labels": r.metadata.labels,
        "annotations": r.metadata.annotations,
    })
}

/// What the operator made for the plugins `names` of `ns` that is still there, one line each;
/// with `chart_role`, also the chart's Role when it differs from that.
async fn leftovers(
    admin: &Client,
    ns: &str,
    names: &[&str],
    chart_role: Option<&Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        let cluster = format!("vcp:{ns}:{name}");
        let role = format!("vcp-plugin-{name}");
        if Api::<ClusterRole>::all(admin.clone())
            .get_opt(&cluster)
            .await
            .unwrap()
            .is_some()
        {
            out.push(format!("ClusterRole {cluster}"));
        }
        if Api::<ClusterRoleBinding>::all(admin.clone())
            .get_opt(&cluster)
            .await
            .unwrap()
            .is_some()
        {
            out.push(format!("ClusterRoleBinding {cluster}"));
        }
        if Api::<Role>::namespaced(admin.clone(), ns)
            .get_opt(&role)
            .await
            .unwrap()
            .is_some()
        {
            out.push(format!("Role {role}"));
        }
        if Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .get_opt(&role)
            .await
            .unwrap()
            .is_some()
        {
            out.push(format!("RoleBinding {role}"));
        }
    }
    let live = Api::<Role>::namespaced(admin.clone(), ns)
        .get("vc-my-vcluster")
        .await
        .unwrap();
    for name in names {
        if live
            .annotations()
            .contains_key(&added_rules_annotation(name))
        {
            out.push(format!(
                "annotation {} on Role vc-my-vcluster",
                added_rules_annotation(name)
            ));
        }
    }
    if let Some(chart_role) = chart_role
        && &restorable(&live) != chart_role
    {
        out.push(format!(
            "Role vc-my-vcluster is {} (was {chart_role})",
            restorable(&live)
        ));
    }
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .unwrap();
    let pod = sts.spec.unwrap().template.spec.unwrap();
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        if names.contains(&c.name.as_str()) {
            out.push(format!("container {} in StatefulSet my-vcluster", c.name));
        }
    }
    out
}

/// The pod template of the vCluster's StatefulSet in `ns`.
async fn template(admin: &Client, ns: &str) -> Value {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .unwrap();
    serde_json::to_value(sts.spec.unwrap().template).unwrap()
}

/// `kubectl patch --type=json` as `tenant-edit`: removes the plugin's finalizers.
fn remove_finalizer(ns: &str, name: &str) -> bool {
    let cp = ControlPlane::shared();
    std::process::Command::new(cp.kubectl())
        .env(
            "KUBECONFIG",
            cp.kubeconfig(Cluster::Host, Identity::TenantEdit),
        )
        .args([
            "-n",
            ns,
            "patch",
            "vclusterplugin",
            name,
            "--type=json",
            "-p",
        ])
        .arg(r#"[{"op":"remove","path":"/metadata/finalizers"}]"#)
        .output()
        .expect("run kubectl")
        .status
        .success()
}

/// As `tenant-edit`: removes the finalizer of the plugin and deletes it, with the
/// resourceVersion of a copy without finalizers as the delete's precondition (the operator
/// puts the finalizer back on a plugin that is not being deleted; then this tries again). When
/// `deleting`, the plugin is deleted first (it stays, being deleted, while nobody removes the
/// finalizer) and the finalizer removed afterwards.
async fn delete_without_finalizer(tenant: &Client, ns: &str, name: &str, deleting: bool) {
    let api = Api::<VClusterPlugin>::namespaced(tenant.clone(), ns);
    if deleting {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        assert!(
            api.get(name)
                .await
                .unwrap()
                .finalizers()
                .iter()
                .any(|f| f == FINALIZER),
            "{name}: the operator is stopped, so the finalizer holds the plugin"
        );
        assert!(remove_finalizer(ns, name), "{name}: remove the finalizer");
        wait_for(TIMEOUT, || async {
            api.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
        return;
    }
    wait_for(TIMEOUT, || async {
        remove_finalizer(ns, name);
        let live = api.get(name).await.ok()?;
        if !live.finalizers().is_empty() {
            return None;
        }
        let dp = DeleteParams::default().preconditions(Preconditions {
            uid: live.uid(),
            resource_version: live.resource_version(),
        });
        api.delete(name, &dp).await.ok().map(|_| ())
    })
    .await;
    assert!(api.get_opt(name).await.unwrap().is_none(), "{name} is gone");
}

/// The name of the RoleBinding [`plant_forged_binding`] makes: sorted before `vcp-plugin-*`.
const PLANTED: &str = "aaa-plant";

/// As `tenant` (who may write Roles and RoleBindings in `ns`): a Role of its own and the
/// RoleBinding [`PLANTED`] binding it to the vCluster's account, labelled for a plugin `ghost`
/// of `ns` that does not exist, its `managedFields` rewritten so that the operator's field
/// manager seems to own those labels (any client that may update an object may do that).
async fn plant_forged_binding(tenant: &Client, ns: &str) {
    use kube::api::{Patch, PatchParams, PostParams};
    let roles = Api::<Role>::namespaced(tenant.clone(), ns);
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "harmless" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
    }))
    .unwrap();
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("tenant's Role");
    let bindings = Api::<RoleBinding>::namespaced(tenant.clone(), ns);
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": PLANTED, "labels": {
            (vcp_crds::PLUGIN_NAME_LABEL): "ghost", (vcp_crds::PLUGIN_NAMESPACE_LABEL): ns,
        } },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "harmless" },
        "subjects": [{ "kind": "ServiceAccount", "name": "vc-my-vcluster", "namespace": ns }],
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("tenant's RoleBinding");
    let forged = json!([{ "op": "replace", "path": "/metadata/managedFields", "value": [
        { "manager": (vcp_crds::OPERATOR_FIELD_MANAGER), "operation": "Apply",
          "apiVersion": "rbac.authorization.k8s.io/v1", "fieldsType": "FieldsV1",
          "fieldsV1": { "f:metadata": { "f:labels": {
              format!("f:{}", vcp_crds::PLUGIN_NAME_LABEL): {},
              format!("f:{}", vcp_crds::PLUGIN_NAMESPACE_LABEL): {},
          } } } },
        { "manager": "tenant", "operation": "Update",
          "apiVersion": "rbac.authorization.k8s.io/v1", "fieldsType": "FieldsV1",
          "fieldsV1": { "f:roleRef": {}, "f:subjects": {} } },
    ] }]);
    let patched = bindings
        .patch(
            PLANTED,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(forged).unwrap()),
        )
        .await
        .expect("rewrite managedFields");
    assert!(
        vcluster_plugin_operator::sweep::owned_by_operator(
            &patched.metadata,
            "labels",
            vcp_crds::PLUGIN_NAME_LABEL
        ),
        "the forged managedFields were stored: {:?}",
        patched.metadata.managed_fields
    );
}

/// The operator's successful deletes of cluster-scoped objects named `vcp:<ns>:…` and of
/// Roles and RoleBindings in `ns`, received after `since`, as `resource/name`, once the audit
/// log holds every request answered before the call.
async fn operator_deletes(ns: &str, since: SystemTime) -> Vec<String> {
    let mut out: Vec<String> = Audit::writes()
        .by(Identity::Operator)
        .verb("delete")
        .since(since)
        .in_namespace(ns)
        .resource("roles")
        .resource("rolebindings")
        .and_its_cluster_objects()
        .caught_up()
        .await
        .succeeded()
        .into_iter()
        .map(|w| {
            let path = w.uri.split('?').next().unwrap_or_default();
            let resource = path.rsplit('/').nth(1).unwrap_or_default();
            format!("{resource}/{}", w.object_name)
        })
        .collect();
    out.sort();
    out
}

/// Every delete the sweep must have made for `cars` in `ns` (`patcher` has no objects of its
/// own: its rules are in the chart's Role).
fn expected_deletes(ns: &str) -> Vec<String> {
    let mut want = vec![
        format!("clusterrolebindings/vcp:{ns}:cars"),
        format!("clusterroles/vcp:{ns}:cars"),
        "rolebindings/vcp-plugin-cars".to_string(),
        "roles/vcp-plugin-cars".to_string(),
    ];
    want.sort();
    want
}

#[tokio::test]
async fn what_plugins_deleted_without_their_finalizer_left_behind_is_swept() {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    let tenant = cp.client(Cluster::Host, Identity::TenantEdit).await;
    setup(&admin).await;
    let op = start("sweep-a");

    // (a) The operator running: the finalizer removed by hand, the plugins deleted.
    let ns = "sweep-live";
    prepare(&admin, ns).await;
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let chart_role = restorable(&roles.get("vc-my-vcluster").await.unwrap());
    install(&admin, ns, &["stays"]).await;
    let before = leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role)).await;
    for want in [
        format!("ClusterRole vcp:{ns}:cars"),
        format!("ClusterRoleBinding vcp:{ns}:cars"),
        "Role vcp-plugin-cars".into(),
        "RoleBinding vcp-plugin-cars".into(),
        format!(
            "annotation {} on Role vc-my-vcluster",
            added_rules_annotation("patcher")
        ),
        "container cars in StatefulSet my-vcluster".into(),
        "container patcher in StatefulSet my-vcluster".into(),
    ] {
        assert!(
            before.contains(&want),
            "installed: {want} (found {before:?})"
        );
    }
    let stays_before = leftovers(&admin, ns, &["stays"], None).await;
    let since = SystemTime::now();
    for name in ["cars", "patcher"] {
        delete_without_finalizer(&tenant, ns, name, false).await;
    }
    let swept = vcp_tests::poll_for(TIMEOUT, || async {
        leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        swept.is_some(),
        "left behind: {:?}",
        leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role)).await
    );
    assert_eq!(
        operator_deletes(ns, since).await,
        expected_deletes(ns),
        "the operator deleted them"
    );
    // The plugin that stays keeps what it has, and stays Ready.
    assert_eq!(leftovers(&admin, ns, &["stays"], None).await, stays_before);
    wait_ready(&admin, ns, "stays", "True", None, TIMEOUT).await;

    // (b) The operator stopped during the delete, started again afterwards.
    let ns = "sweep-restart";
    prepare(&admin, ns).await;
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let chart_role = restorable(&roles.get("vc-my-vcluster").await.unwrap());
    let original = template(&admin, ns).await;
    install(&admin, ns, &[]).await;
    stop(op).await;
    for name in ["cars", "patcher"] {
        delete_without_finalizer(&tenant, ns, name, true).await;
    }
    let left = leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role)).await;
    assert!(left.len() >= 7, "nobody removed anything yet: {left:?}");
    // The second independent attack: a tenant's own RoleBinding, sorted before the plugin's,
    // labelled for a plugin that does not exist and with `managedFields` rewritten to claim the
    // labels as the operator's. The operator may not delete it (operator-bounds), and the sweep
    // stopped at that refusal, leaving every later leftover of every tenant behind.
    plant_forged_binding(&tenant, ns).await;
    let since = SystemTime::now();
    let op = start("sweep-b");
    let swept = vcp_tests::poll_for(TIMEOUT, || async {
        leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        swept.is_some(),
        "left behind after the restart: {:?}",
        leftovers(&admin, ns, &["cars", "patcher"], Some(&chart_role)).await
    );
    assert_eq!(
        operator_deletes(ns, since).await,
        expected_deletes(ns),
        "the operator deleted them"
    );
    // No plugin left: the operator owns nothing of the pod template, which is the chart's.
    wait_for(TIMEOUT, || async {
        (template(&admin, ns).await == original).then_some(())
    })
    .await;
    // The planted binding is the tenant's: still there, and never a delete attempt of it.
    assert!(
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .get_opt(PLANTED)
            .await
            .unwrap()
            .is_some(),
        "the tenant's {PLANTED} was deleted"
    );
    let attempts = Audit::writes()
        .by(Identity::Operator)
        .verb("delete")
        .since(since)
        .in_namespace(ns)
        .resource("rolebindings")
        .caught_up()
        .await
        .attempts();
    assert!(
        attempts.iter().all(|w| w.object_name != PLANTED),
        "the operator tried to delete the tenant's {PLANTED}: {attempts:?}"
    );

    colliding_names_keep_their_records(&admin).await;
    stop(op).await;
}

/// (c) Hole 8: a 51-character name equal to another plugin's key under the earlier scheme
/// (computed from it, not claimed): both plugins keep their own record in the chart's Role.
/// And an upgrade: a record an older operator wrote under the earlier key of a plugin that is
/// gone is swept, with its rule, after the next delete in the namespace.
async fn colliding_names_keep_their_records(admin: &Client) {
    use vcluster_plugin_operator::rbac::{ADDED_RULES_PREFIX, legacy_added_rules_annotation};
    let ns = "sweep-keys";
    prepare(admin, ns).await;
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let chart_role = roles.get("vc-my-vcluster").await.unwrap();
    let long = format!("{}-syncer", "cars-and-trucks-and-buses".repeat(2));
    let legacy = legacy_added_rules_annotation(&long).unwrap();
    let colliding = legacy.strip_prefix(ADDED_RULES_PREFIX).unwrap().to_string();
    assert_eq!(colliding.len(), 51, "{colliding}");
    let spec = |resource: &str| {
        json!({
            "vcluster": { "name": "my-vcluster" },
            "rbac": {
                "mode": "PatchVClusterRoles",
                "role": { "extraRules": [{ "apiGroups": [""], "resources": [resource], "verbs": ["get"] }] },
            },
        })
    };
    vcp_tests::create_plugin(admin, ns, &long, spec("configmaps")).await;
    vcp_tests::create_plugin(admin, ns, &colliding, spec("endpoints")).await;
    wait_ready(admin, ns, &long, "True", None, TIMEOUT).await;
    wait_ready(admin, ns, &colliding, "True", None, TIMEOUT).await;
    let recorded = |role: &Role, name: &str| -> Vec<String> {
        role.annotations()
            .get(&added_rules_annotation(name))
            .map(|v| {
                serde_json::from_str::<Value>(v).unwrap()["added"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
                    .map(|r| r.as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let live = roles.get("vc-my-vcluster").await.unwrap();
    assert_ne!(
        added_rules_annotation(&long),
        added_rules_annotation(&colliding)
    );
    assert!(
        recorded(&live, &long).contains(&"configmaps".to_string()),
        "{live:?}"
    );
    assert!(
        recorded(&live, &colliding).contains(&"endpoints".to_string()),
        "{live:?}"
    );
    assert!(!recorded(&live, &long).contains(&"endpoints".to_string()));
    let colliding_record = live.annotations()[&added_rules_annotation(&colliding)].clone();

    // An older operator's record for a plugin that is gone, under the earlier key, with its
    // rule (written here with the operator's field manager, as that operator did).
    let gone = "g".repeat(60);
    let old_key = legacy_added_rules_annotation(&gone).unwrap();
    let old_rule =
        json!({ "apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"] });
    let mut rules = serde_json::to_value(&live.rules).unwrap();
    rules.as_array_mut().unwrap().push(old_rule.clone());
    roles
        .patch(
            "vc-my-vcluster",
            &kube::api::PatchParams {
                field_manager: Some(vcp_crds::OPERATOR_FIELD_MANAGER.into()),
                ..Default::default()
            },
            &kube::api::Patch::Merge(json!({
                "metadata": { "annotations": { &old_key: json!([old_rule]).to_string() } },
                "rules": rules,
            })),
        )
        .await
        .expect("an older operator's record");

    // The long-named plugin is deleted: its record goes, the 51-character one's stays, and
    // the sweep after the delete takes the older operator's record and rule out.
    vcp_tests::delete_plugin(admin, ns, &long, TIMEOUT).await;
    let live = wait_for(TIMEOUT, || async {
        let live = roles.get("vc-my-vcluster").await.unwrap();
        (!live.annotations().contains_key(&old_key)).then_some(live)
    })
    .await;
    assert!(
        !live
            .annotations()
            .contains_key(&added_rules_annotation(&long))
    );
    // The 51-character plugin keeps its record: the same rules, each in the Role. (The rules
    // both plugins need are appended by the first to patch the Role and recorded as present by
    // the other; when the long-named one appended them, its restore took them out, and the
    // other's reconcile appends them again, recording them as added: the Role watch's repair.)
    let granted = |record: &str| -> Vec<String> {
        let r = vcluster_plugin_operator::rbac::Record::parse(record).expect("a record");
        let mut rules: Vec<String> = r
            .added
            .iter()
            .chain(&r.present)
            .map(|rule| serde_json::to_string(rule).unwrap())
            .collect();
        rules.sort();
        rules
    };
    let live = wait_for(TIMEOUT, || async {
        let live = roles.get("vc-my-vcluster").await.unwrap();
        (vcluster_plugin_operator::rbac::records_held(&live) == Some(true)).then_some(live)
    })
    .await;
    assert_eq!(
        live.annotations()
            .get(&added_rules_annotation(&colliding))
            .map(|r| granted(r)),
        Some(granted(&colliding_record)),
        "the 51-character plugin keeps its record"
    );
    let rules = serde_json::to_value(&live.rules).unwrap();
    assert!(
        !rules.as_array().unwrap().contains(&old_rule),
        "the older record's rule is gone: {rules}"
    );
    vcp_tests::delete_plugin(admin, ns, &colliding, TIMEOUT).await;
    let restored = roles.get("vc-my-vcluster").await.unwrap();
    assert_eq!(restorable(&restored), restorable(&chart_role));
}
