//! The operator's drift handling and lifecycle, end to end on the real host API server (RBAC
//! on): a removed sidecar and an edited Role come back (the plugin's dedicated Role, and under
//! `rbac.mode: PatchVClusterRoles` the chart's Role it appended to), a deleted vCluster is reported and
//! reinstalled when it returns, a plugin deleted while the operator is down is cleaned up when
//! it returns, plugins of a Deployment vCluster come and go independently. Every operator runs
//! in-process under the `vcp-operator` identity (config/rbac) as a [`vcp_tests::Replica`] on a
//! runtime of its own. Operations and idempotency are in `operator_ops.rs`.
//!
//! Tests that run an operator hold [`LOCK`]: two operators of one control plane would both
//! reconcile every plugin. Each test keeps to its own namespaces.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Mutex;
use vcluster_plugin_operator::policy::Policy;
use vcluster_plugin_operator::vcluster::decide::RESYNC;
use vcp_crds::VClusterPlugin;
use vcp_tests::workload::{
    Kind, VC, container, container_names, containers, create_vcluster, create_workload, template,
};
use vcp_tests::{Replica, condition, create_plugin, delete_plugin, wait_for, wait_ready};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Serializes the tests that run an operator.
static LOCK: Mutex<()> = Mutex::const_new(());

// Drift and lifecycle (item 5)

/// The sidecar removed by someone else — a full update without it (a replace-style upgrade) or
/// a JSON patch — is added back; a foreign server-side apply without it leaves it alone.
#[tokio::test]
async fn removed_sidecar_is_added_back() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-drift-sidecar";
    let original = create_vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("drift-sidecar", None).await;
    create_plugin(
        &admin,
        ns,
        "car-syncer",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let installed = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&installed, "containers"),
        ["syncer", "car-syncer"]
    );

    let api = Api::<StatefulSet>::namespaced(admin.clone(), ns);
    let back = || {
        let admin = admin.clone();
        let installed = installed.clone();
        async move { (template(&admin, ns, Kind::StatefulSet).await == installed).then_some(()) }
    };

    // A replace-style upgrade: the whole object without the sidecar, by another manager.
    let mut live = api.get(VC).await.unwrap();
    live.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers
        .retain(|c| c.name == "syncer");
    live.metadata.managed_fields = None;
    api.replace(
        VC,
        &PostParams {
            field_manager: Some("helm".into()),
            ..Default::default()
        },
        &live,
    )
    .await
    .expect("replace without the sidecar");
    wait_for(TIMEOUT, back).await;

    // A JSON patch removing it.
    api.patch(
        VC,
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([
                { "op": "test", "path": "/spec/template/spec/containers/1/name", "value": "car-syncer" },
                { "op": "remove", "path": "/spec/template/spec/containers/1" },
            ]))
            .unwrap(),
        ),
    )
    .await
    .expect("JSON patch removing the sidecar");
    wait_for(TIMEOUT, back).await;

    // A Helm-like server-side apply of the chart's own fields does not remove what the
    // operator owns: nothing to repair, and the sidecar stays.
    let chart: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": VC, "namespace": ns },
        "spec": { "serviceName": "my-vcluster-headless",
                  "selector": { "matchLabels": { "app": "vcluster", "release": VC } },
                  "template": original },
    }))
    .unwrap();
    api.patch(
        VC,
        &PatchParams::apply("helm").force(),
        &Patch::Apply(&chart),
    )
    .await
    .expect("helm apply");
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, installed);

    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    r.stop().await;
}

/// The dedicated Role edited by someone else is restored; its RoleBinding deleted is created
/// again.
#[tokio::test]
async fn edited_dedicated_role_is_restored() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-drift-role";
    create_vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("drift-role", None).await;
    create_plugin(
        &admin,
        ns,
        "car-syncer",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), ns);
    let role_name = "vcp-plugin-car-syncer";
    let rules = roles.get(role_name).await.expect("Role").rules;
    let subjects = bindings.get(role_name).await.expect("RoleBinding").subjects;

    roles
        .patch(
            role_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": [{
                "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"],
            }] })),
        )
        .await
        .expect("edit Role");
    wait_for(TIMEOUT, || {
        let roles = roles.clone();
        let rules = rules.clone();
        async move { (roles.get(role_name).await.ok()?.rules == rules).then_some(()) }
    })
    .await;

    bindings
        .delete(role_name, &DeleteParams::default())
        .await
        .expect("delete RoleBinding");
    wait_for(TIMEOUT, || {
        let bindings = bindings.clone();
        let subjects = subjects.clone();
        async move { (bindings.get_opt(role_name).await.ok()??.subjects == subjects).then_some(()) }
    })
    .await;
    let p = wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    assert_eq!(condition(&p, "RBACReady").unwrap().status, "True");
    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    r.stop().await;
}

/// The longest a repair of the chart's Role may take: far below the resync of a converged
/// plugin ([`RESYNC`], 600 s), so only a watch of the Role can have triggered it.
const REPAIR: Duration = Duration::from_secs(30);
const _: () = assert!(REPAIR.as_secs() * 10 < RESYNC.as_secs());

/// `rbac.mode: PatchVClusterRoles`: the chart's Role `vc-my-vcluster` (vCluster's own chart,
/// created as Helm does) holds the plugin's rules, recorded in `vcp.dev/added-rules.car-syncer`.
/// Someone's edit that takes them out is repaired within [`REPAIR`] by the operator's patch of
/// that Role (the audit log), three ways:
/// - `kubectl edit`: an update of the whole Role without the plugin's rules (the record stays);
/// - an apply of the chart's Role by another field manager, forced: it then owns `rules`, which
///   hold only the chart's rules (the record, not in its apply, stays);
/// - the chart's manifest replaced as it was: rules and record both gone.
///
/// The operator watches Roles only in the namespaces of such plugins, and only those not
/// labelled as a plugin's own (the cache scope of `operator_cache_scope.rs`: its cluster-wide
/// watches carry a label selector); removing the plugin restores the Role.
#[tokio::test]
async fn patched_vcluster_role_edited_by_someone_else_is_repaired() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-drift-patched-role";
    create_vcluster(&admin, ns, Kind::StatefulSet).await;
    // The chart's Role and RoleBinding (which `create_vcluster` leaves out), as Helm creates them.
    let rendered = vcp_tests::render_vcluster_chart(ns, "").expect("render the chart");
    let mut chart_role = None;
    for doc in rendered.split("---\n") {
        let Ok(value) = serde_yaml::from_str::<serde_json::Value>(doc) else {
            continue;
        };
        if !matches!(value["kind"].as_str(), Some("Role" | "RoleBinding")) {
            continue;
        }
        assert_eq!(value["metadata"]["name"], "vc-my-vcluster", "{doc}");
        vcp_tests::create_yaml(&admin, doc, Some(ns), "helm")
            .await
            .expect("create the chart's RBAC");
        if value["kind"] == "Role" {
            chart_role = Some(value);
        }
    }
    let chart_role = chart_role.expect("the chart renders a Role");
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let role = "vc-my-vcluster";
    let original = roles.get(role).await.expect("the chart's Role");

    let r = Replica::start("drift-patched-role", None).await;
    let mut spec = vcp_tests::workload::embedded_car_spec();
    spec["rbac"] = json!({
        "mode": "PatchVClusterRoles",
        "role": { "extraRules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }] },
    });
    create_plugin(&admin, ns, "car-syncer", spec).await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let installed = roles.get(role).await.expect("Role");
    let record = "vcp.dev/added-rules.car-syncer";
    let installed_rules = installed.rules.clone().unwrap_or_default();
    let original_rules = original.rules.clone().unwrap_or_default();
    assert!(
        installed_rules.len() > original_rules.len()
            && installed_rules[..original_rules.len()] == original_rules[..],
        "the plugin's rules appended: {installed_rules:?}"
    );
    let recorded = installed
        .annotations()
        .get(record)
        .cloned()
        .expect("recorded");
    let appended = &installed_rules[original_rules.len()..];
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&recorded).unwrap(),
        json!({ "added": appended, "present": [] })
    );
    let held = |role: &Role| {
        role.rules.as_ref() == Some(&installed_rules)
            && role.annotations().get(record) == Some(&recorded)
    };

    // Before each edit the operator is done with the plugin: its last finished reconcile read
    // the plugin's current resourceVersion (so no reconcile of a status write is still due to
    // repair the edit by chance). After it, the repair: the Role as the operator left it, by its
    // patch after the edit.
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let settled = || async {
        vcp_tests::wait_for(TIMEOUT, || async {
            let rv = plugins
                .get("car-syncer")
                .await
                .ok()?
                .metadata
                .resource_version?;
            let seen = r.telemetry.reconciled(ns, "car-syncer")?;
            (seen.resource_version == rv).then_some(())
        })
        .await;
    };
    let repaired = |what: &'static str, edited_at: std::time::SystemTime| {
        let roles = roles.clone();
        async move {
            let began = std::time::Instant::now();
            let back = vcp_tests::poll_for(REPAIR, || {
                let roles = roles.clone();
                async move { roles.get(role).await.ok().filter(|r| held(r)).map(|_| ()) }
            })
            .await;
            assert!(
                back.is_some(),
                "{what}: the plugin's rules are not back within {REPAIR:?}: {:?}",
                roles.get(role).await.map(|r| r.rules)
            );
            let took = began.elapsed();
            // The audit log (written a moment after the answer) shows the operator's repair.
            let patches = vcp_tests::wait_for(Duration::from_secs(10), || async {
                let p = vcp_tests::Audit::writes()
                    .by(vcp_tests::Identity::Operator)
                    .in_namespace(ns)
                    .uri_contains(&format!("/roles/{role}"))
                    .verb("patch")
                    .since(edited_at)
                    .succeeded();
                (!p.is_empty()).then_some(p)
            })
            .await;
            println!(
                "{what}: the plugin's rules were back {took:?} after the edit, by {} operator \
                 patch(es) of Role {role}",
                patches.len()
            );
        }
    };

    // `kubectl edit`: the whole Role updated without the plugin's rules.
    settled().await;
    let mut edited = roles.get(role).await.unwrap();
    edited.rules = Some(original_rules.clone());
    edited.metadata.managed_fields = None;
    let at = std::time::SystemTime::now();
    let after = roles
        .replace(
            role,
            &PostParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &edited,
        )
        .await
        .expect("kubectl edit");
    assert!(!held(&after) && after.annotations().get(record) == Some(&recorded));
    repaired("kubectl edit", at).await;

    // Another manager applies the chart's Role, forced: it takes `rules` over.
    settled().await;
    let at = std::time::SystemTime::now();
    let after = roles
        .patch(
            role,
            &PatchParams::apply("argocd-controller").force(),
            &Patch::Apply(&chart_role),
        )
        .await
        .expect("apply the chart's Role");
    assert_eq!(after.rules.as_ref(), Some(&original_rules));
    repaired("a forced apply of the chart's Role", at).await;

    // The chart's manifest put back as it was: rules and record gone.
    settled().await;
    let mut replaced = original.clone();
    replaced.metadata.managed_fields = None;
    replaced.metadata.resource_version = roles.get(role).await.unwrap().metadata.resource_version;
    let at = std::time::SystemTime::now();
    let after = roles
        .replace(
            role,
            &PostParams {
                field_manager: Some("kubectl-replace".into()),
                ..Default::default()
            },
            &replaced,
        )
        .await
        .expect("replace the Role");
    assert_eq!(after.annotations().get(record), None);
    repaired("the chart's manifest replaced", at).await;

    // The Roles the operator watched: cluster-wide only with a label selector (its cache of
    // plugins' own Roles), else in this namespace, leaving the plugins' own Roles out.
    let reads = vcp_tests::audited_reads(
        vcp_tests::ControlPlane::shared(),
        vcp_tests::Cluster::Host,
        vcp_tests::Identity::Operator.user(),
    )
    .expect("audit log");
    let role_watches: Vec<&String> = reads
        .iter()
        .filter(|(verb, uri)| verb == "watch" && uri.contains("/roles?"))
        .map(|(_, uri)| uri)
        .collect();
    let here = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles?");
    assert!(
        role_watches.iter().any(|uri| uri.starts_with(&here)),
        "no watch of the Roles of {ns}: {role_watches:#?}"
    );
    for uri in &role_watches {
        let query = uri.replace("%2F", "/").replace("%21", "!");
        let cluster_wide = uri.starts_with("/apis/rbac.authorization.k8s.io/v1/roles?")
            && query.contains("labelSelector=vcp.dev/plugin-name");
        let vcluster_roles =
            uri.contains("/namespaces/") && query.contains("labelSelector=!vcp.dev/plugin-name");
        assert!(
            cluster_wide || vcluster_roles,
            "a watch of Roles outside the cache scope: {uri}"
        );
    }

    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    let restored = roles.get(role).await.unwrap();
    assert_eq!(restored.rules, original.rules);
    assert_eq!(restored.metadata.annotations, original.metadata.annotations);
    assert_eq!(restored.metadata.labels, original.metadata.labels);
    r.stop().await;
}

/// The vCluster StatefulSet deleted → `Ready=False, VClusterNotFound` (phase Pending);
/// created again → installed again.
#[tokio::test]
async fn deleted_vcluster_is_reported_and_reinstalled_when_it_returns() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-vcluster-gone";
    let original = create_vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("vcluster-gone", None).await;
    create_plugin(
        &admin,
        ns,
        "car-syncer",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;

    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .delete(VC, &DeleteParams::default())
        .await
        .expect("delete StatefulSet");
    let p = wait_ready(
        &admin,
        ns,
        "car-syncer",
        "False",
        Some("VClusterNotFound"),
        TIMEOUT,
    )
    .await;
    assert_eq!(
        p.status.as_ref().unwrap().phase,
        Some(vcp_crds::Phase::Pending)
    );
    assert!(condition(&p, "Ready").unwrap().message.contains(VC));

    let recreated = create_workload(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(recreated, original);
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let live = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&live, "containers"),
        ["syncer", "car-syncer"]
    );
    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    r.stop().await;
}

/// A plugin deleted while the operator is down keeps its finalizer and its sidecar; when the
/// operator returns it removes exactly what it added, then the finalizer.
#[tokio::test]
async fn plugin_deleted_while_the_operator_is_down_is_cleaned_up_when_it_returns() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-down";
    let original = create_vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("down-1", None).await;
    create_plugin(
        &admin,
        ns,
        "car-syncer",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    r.stop().await;

    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    api.delete("car-syncer", &DeleteParams::default())
        .await
        .expect("delete plugin");
    let pending = api.get("car-syncer").await.expect("still there: finalizer");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.finalizers(), [vcp_crds::FINALIZER]);
    let live = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&live, "containers"),
        ["syncer", "car-syncer"]
    );

    let r = Replica::start("down-2", None).await;
    wait_for(TIMEOUT, || {
        let api = api.clone();
        async move {
            api.get_opt("car-syncer")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    assert!(
        Api::<Role>::namespaced(admin.clone(), ns)
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none()
    );
    r.stop().await;
}

/// A vCluster that runs as a Deployment, with an embedded, a v2 and a v1 plugin (the v1 one
/// with every container field): each is added and removed without touching the others'
/// entries; removing the last restores the original template.
#[tokio::test]
async fn deployment_vcluster_with_several_plugins_added_and_removed_independently() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-deploy";
    let original = create_vcluster(&admin, ns, Kind::Deployment).await;
    // `legacy` mounts the vCluster's own volume `data`, which the default container policy
    // refuses: the platform team allows it (README, "Operator policy").
    let policy = Policy::from_yaml("containers:\n  allowedVolumes: [data]\n").unwrap();
    let r = Replica::start_with_policy("deploy", None, policy).await;

    create_plugin(
        &admin,
        ns,
        "embedded",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    let p = wait_ready(&admin, ns, "embedded", "True", None, TIMEOUT).await;
    let w = p.status.unwrap().workload.unwrap();
    assert_eq!((w.kind.as_str(), w.name.as_str()), ("Deployment", VC));
    let with_embedded = template(&admin, ns, Kind::Deployment).await;
    let embedded = container(&with_embedded, "embedded").clone();
    let syncer = container(&with_embedded, "syncer").clone();
    assert_eq!(syncer, original["spec"]["containers"][0]);

    create_plugin(
        &admin,
        ns,
        "legacy",
        json!({
            "vcluster": { "name": VC },
            "image": "ghcr.io/loft-sh/vcluster-example:0.0.1",
            "version": "v1",
            "imagePullPolicy": "Always",
            "command": ["/plugin"],
            "args": ["--verbose"],
            "env": [{ "name": "LOG_LEVEL", "value": "debug" }],
            "envFrom": [{ "configMapRef": { "name": "legacy-env" } }],
            "resources": { "requests": { "cpu": "10m" }, "limits": { "memory": "64Mi" } },
            "securityContext": { "runAsNonRoot": true, "readOnlyRootFilesystem": true },
            "volumeMounts": [{ "name": "data", "mountPath": "/legacy-data", "readOnly": true }],
            "config": { "greeting": "hello", "replicas": 2 },
        }),
    )
    .await;
    wait_ready(&admin, ns, "legacy", "True", None, TIMEOUT).await;
    let with_legacy = template(&admin, ns, Kind::Deployment).await;
    assert_eq!(
        container_names(&with_legacy, "containers"),
        ["syncer", "embedded", "legacy"]
    );
    assert_eq!(container(&with_legacy, "embedded"), &embedded, "untouched");
    assert_eq!(container(&with_legacy, "syncer"), &syncer, "untouched");
    let legacy: Container =
        serde_json::from_value(container(&with_legacy, "legacy").clone()).unwrap();
    assert_eq!(
        legacy.image.as_deref(),
        Some("ghcr.io/loft-sh/vcluster-example:0.0.1")
    );
    assert_eq!(legacy.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(legacy.command, Some(vec!["/plugin".to_string()]));
    assert_eq!(legacy.args, Some(vec!["--verbose".to_string()]));
    let env: Vec<(String, String)> = legacy
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    let config_yaml =
        serde_yaml::to_string(&json!({ "greeting": "hello", "replicas": 2 })).unwrap();
    assert_eq!(
        env,
        // the chart's order (tests/tests/oracle_chart.rs): the plugin address and name first
        [
            (
                "VCLUSTER_PLUGIN_ADDRESS".to_string(),
                "localhost:14000".to_string()
            ),
            ("VCLUSTER_PLUGIN_NAME".into(), "legacy".into()),
            ("LOG_LEVEL".into(), "debug".into()),
            ("PLUGIN_CONFIG".into(), config_yaml),
        ]
    );
    assert_eq!(
        serde_json::to_value(&legacy.env_from).unwrap(),
        json!([{ "configMapRef": { "name": "legacy-env" } }])
    );
    assert_eq!(
        serde_json::to_value(&legacy.resources).unwrap(),
        json!({ "requests": { "cpu": "10m" }, "limits": { "memory": "64Mi" } })
    );
    assert_eq!(
        serde_json::to_value(&legacy.security_context).unwrap(),
        json!({ "runAsNonRoot": true, "readOnlyRootFilesystem": true })
    );
    assert_eq!(
        serde_json::to_value(&legacy.volume_mounts).unwrap(),
        json!([{ "name": "data", "mountPath": "/legacy-data", "readOnly": true }])
    );
    let legacy_json = container(&with_legacy, "legacy").clone();

    create_plugin(
        &admin,
        ns,
        "v2",
        json!({ "vcluster": { "name": VC }, "image": "ghcr.io/example/v2-plugin:1.0" }),
    )
    .await;
    wait_ready(&admin, ns, "v2", "True", None, TIMEOUT).await;
    let with_v2 = template(&admin, ns, Kind::Deployment).await;
    // after the chart's own init container (init-container-order, tests/tests/oracle_chart.rs)
    assert_eq!(
        container_names(&with_v2, "initContainers"),
        ["kubernetes", "v2"]
    );
    assert_eq!(container(&with_v2, "embedded"), &embedded, "untouched");
    assert_eq!(container(&with_v2, "legacy"), &legacy_json, "untouched");

    // Remove them one at a time: what remains is exactly what it was.
    delete_plugin(&admin, ns, "legacy", TIMEOUT).await;
    let without_legacy = template(&admin, ns, Kind::Deployment).await;
    assert_eq!(
        container_names(&without_legacy, "containers"),
        ["syncer", "embedded"]
    );
    assert_eq!(container(&without_legacy, "embedded"), &embedded);
    assert_eq!(
        containers(&without_legacy, "initContainers"),
        containers(&with_v2, "initContainers")
    );
    assert_eq!(
        without_legacy["spec"]["volumes"],
        with_v2["spec"]["volumes"]
    );

    delete_plugin(&admin, ns, "v2", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::Deployment).await, with_embedded);

    delete_plugin(&admin, ns, "embedded", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::Deployment).await, original);
    r.stop().await;
}
