//! The operator's drift handling and lifecycle, end to end on the real host API server (RBAC
//! on): a removed sidecar and an edited Role come back, a deleted vCluster is reported and
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
