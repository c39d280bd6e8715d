//! GitOps after the first sync, in the Application of [`crate::gitops`] (Argo CD
//! v3.6.2 against the real node, `config/argocd/application.yaml` with `prune` and `selfHeal`):
//!
//! - a plugin changed in Git (a new hook) reaches the vCluster: Argo CD syncs the new spec, the
//!   runtime reports the new generation, and a virtual pod created then reaches the node with
//!   the new hook's label;
//! - a plugin removed from Git is pruned by Argo CD: the operator's finalizer cleanup runs, the
//!   StatefulSet's pod template is the chart's again (the chart archive Argo CD renders, rendered
//!   by helm with the Application's values, its StatefulSet's template as the API server stores
//!   it: defaulted by a server-side dry-run create), the operator's field manager holds nothing
//!   of it, and the pod of that template runs `syncer` alone; committed again, the plugin
//!   installs again;
//! - a plugin the operator refuses (`PolicyDenied`: a Secret reference, which
//!   `tests/fixtures/invalid/container-env-from-secret.yaml` expects refused) makes the
//!   Application `Degraded`, Argo CD's health of it carrying the plugin's reason and message
//!   through the shipped Lua, the StatefulSet untouched; removed from Git, the Application is
//!   `Healthy` again.
//!
//! Each test leaves the Application as it found it: the one plugin in Git, Synced and Healthy.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde::Deserialize as _;
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::argocd_local::{ArgoCd, CHART_VERSION};
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::gitops::{
    NAMESPACE, PLUGIN, RELEASE, app_state, argocd, live_application, plugin_manifest, plugin_path,
    request_hard_refresh, resource_health, statefulset_containers, synced_application,
};
use crate::v2_image::{label, latest_revision_pod, running_host_pod, team_a_ready};
use crate::vcluster::{assert_plugin_ready, attach, ready_containers, scenario_lock, tool_values};

/// The field manager of the operator's server-side applies.
const OPERATOR_MANAGER: &str = "vcluster-plugin-operator";

/// The hook the change in Git adds to the plugin (after the tutorial's `pod-hook`).
const NEW_HOOK: &str = "  - name: changed-in-git\n    apiVersion: v1\n    kind: Pod\n    events: \
                        [CreatePhysical, UpdatePhysical]\n    labels:\n      changed-in-git: \
                        \"yes\"\n";

/// The refused plugin's name, and its manifest: `container-env-from-secret.yaml` of the invalid
/// corpus (an `image` plugin whose `envFrom` names a Secret, which the CRD admits and the
/// operator's default container policy refuses), in the Application's namespace.
const REFUSED: &str = "refused";
fn refused_manifest() -> String {
    format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata:\n  name: {REFUSED}\n  \
         namespace: {NAMESPACE}\nspec:\n  vcluster:\n    name: {RELEASE}\n  image: \
         ghcr.io/example/plugin:1\n  version: v1\n  envFrom:\n    - secretRef: {{ name: \
         vc-{RELEASE} }}\n"
    )
}

/// A file in the plugins' folder that Argo CD does not read (a directory source reads
/// `*.yaml`, `*.yml` and `*.json`), so that the folder exists with no plugin in it.
fn keep_path() -> String {
    plugin_path("x").replace("x.yaml", ".gitkeep")
}

/// Asks Argo CD for a hard refresh of the Application (it compares with Git at once rather
/// than at its next periodic reconcile), then waits up to `timeout` for it to be `Synced` at
/// the chart's version and `commit`, with health `health`; returns it, or panics with its
/// status and the controller's log.
async fn synced_at(argocd: &ArgoCd, commit: &str, health: &str, timeout: Duration) -> Value {
    request_hard_refresh(argocd);
    let want = json!([CHART_VERSION, commit]);
    let found = poll_for(timeout, || {
        let app = live_application(argocd);
        let want = want.clone();
        async move {
            let (sync, now, _) = app_state(&app);
            (sync == "Synced" && now == health && app["status"]["sync"]["revisions"] == want)
                .then_some(app)
        }
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "the Application was not Synced and {health} at {commit} within {timeout:?}:\n{}\n\
             controller:\n{}",
            serde_json::to_string_pretty(&live_application(argocd)["status"]).unwrap(),
            argocd.log_tail("application-controller", 30)
        )
    })
}

/// The chart's own pod template for the Application's values: the StatefulSet `RELEASE` of
/// `helm template` on the chart archive Argo CD renders ([`ArgoCd::chart_archive`]), created
/// under another name by a server-side dry run, so that it carries the API server's defaults as
/// the live one does.
async fn chart_own_template(argocd: &ArgoCd, statefulsets: &Api<StatefulSet>) -> Value {
    let values = std::fs::read_to_string(&tool_values()["VCLUSTER_VALUES"]).unwrap();
    let rendered =
        vcp_tests::render_vcluster_chart_from(&argocd.chart_archive(), NAMESPACE, &values)
            .expect("helm template of the chart Argo CD serves");
    let mut statefulset: StatefulSet = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|doc| serde_yaml::Value::deserialize(doc).ok())
        .filter(|doc| doc["kind"] == "StatefulSet" && doc["metadata"]["name"] == RELEASE)
        .map(|doc| serde_yaml::from_value(doc).expect("the chart's StatefulSet"))
        .next()
        .expect("the chart renders the StatefulSet");
    statefulset.metadata.name = Some(format!("{RELEASE}-chart-render"));
    statefulset.metadata.namespace = Some(NAMESPACE.to_string());
    let defaulted = statefulsets
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &statefulset,
        )
        .await
        .expect("a server-side dry-run create of the chart's StatefulSet");
    serde_json::to_value(defaulted.spec.unwrap().template).unwrap()
}

/// The live StatefulSet's pod template, and what the operator's field manager holds of it
/// (`fieldsV1` under `f:spec.f:template`; `Value::Null` when it holds nothing).
async fn template_and_operator_fields(statefulsets: &Api<StatefulSet>) -> (Value, Value) {
    let live = statefulsets.get(RELEASE).await.unwrap();
    let fields = live
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(OPERATOR_MANAGER))
        .filter_map(|m| m.fields_v1.as_ref())
        .map(|f| f.0["f:spec"]["f:template"].clone())
        .find(|f| !f.is_null())
        .unwrap_or(Value::Null);
    (
        serde_json::to_value(&live.spec.unwrap().template).unwrap(),
        fields,
    )
}

/// Waits up to 120 s until the VClusterPlugin `name` is gone (its finalizer's cleanup done).
async fn gone(plugins: &Api<VClusterPlugin>, name: &str) {
    let gone = poll_for(Duration::from_secs(120), || {
        let plugins = plugins.clone();
        async move { plugins.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(
        gone.is_some(),
        "the VClusterPlugin {name} still exists after 120 s"
    );
}

#[tokio::test]
async fn gitops_a_plugin_changed_in_git_reaches_the_vcluster_and_one_removed_is_pruned() {
    let _scenario = scenario_lock().lock().await;
    synced_application().await;
    let node = Node::shared();
    let argocd = argocd();
    let client = node.client().await.unwrap();
    let plugins: Api<VClusterPlugin> = Api::namespaced(client.clone(), NAMESPACE);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    // 1. A new hook, committed to Git, reaches the vCluster.
    let generation = plugins
        .get(PLUGIN)
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    let changed = argocd
        .commit(
            &[(
                &plugin_path(PLUGIN),
                &format!("{}{NEW_HOOK}", plugin_manifest()),
            )],
            "a second hook",
        )
        .unwrap();
    synced_at(argocd, &changed, "Healthy", Duration::from_secs(180)).await;
    let live = plugins.get(PLUGIN).await.unwrap();
    let hooks: Vec<&str> = live.spec.hooks.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        hooks,
        ["pod-hook", "changed-in-git"],
        "the plugin as synced"
    );
    let now = live.metadata.generation.unwrap();
    assert!(now > generation, "generation {generation} -> {now}");
    // The runtime reports the new generation (it restarts its hooks on a spec change), and the
    // operator's Ready follows it.
    let reported = poll_for(Duration::from_secs(120), || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get(PLUGIN).await.ok()?.status?;
            let current = |t: &str| {
                status.conditions.iter().any(|c| {
                    c.type_ == t && c.status == "True" && c.observed_generation == Some(now)
                })
            };
            (status.observed_generation == Some(now)
                && current("Ready")
                && current("RuntimeHealthy"))
            .then_some(())
        }
    })
    .await;
    assert!(
        reported.is_some(),
        "the plugin's Ready and RuntimeHealthy for generation {now} within 120 s:\n{}",
        node.kubectl(&["-n", NAMESPACE, "get", "vcp", PLUGIN, "-o", "yaml"])
            .unwrap_or_default()
    );
    let (chart_template, _) = template_and_operator_fields(&statefulsets).await;
    let vcluster = attach(NAMESPACE, RELEASE, chart_template).await;
    team_a_ready(&vcluster).await;
    let host = running_host_pod(&vcluster, &pods, "changed").await;
    assert_eq!(
        (
            label(&host, "created-by-plugin"),
            label(&host, "changed-in-git")
        ),
        (Some("pod-hook"), Some("yes")),
        "labels of the host pod: {:?}",
        host.metadata.labels
    );
    let _ = vcluster.virtual_kubectl(
        &["-n", "team-a", "delete", "pod", "changed", "--wait=false"],
        None,
    );

    // 2. Removed from Git: pruned, the finalizer's cleanup runs, the chart's template again.
    let (template, operator_fields) = template_and_operator_fields(&statefulsets).await;
    assert!(
        !operator_fields.is_null(),
        "the operator's field manager holds nothing of the pod template before the prune"
    );
    let expected = chart_own_template(argocd, &statefulsets).await;
    assert_ne!(
        expected, template,
        "the plugin's parts are in the live template before the prune"
    );
    let uid = pods
        .get(&format!("{RELEASE}-0"))
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    // The folder must stay in Git: Argo CD fails a source whose path does not exist
    // (`ComparisonError: ... app path does not exist`, seen with the folder's last file
    // removed), and git keeps no empty folder. A file Argo CD does not read keeps it.
    argocd
        .commit(&[(&keep_path(), "")], "keep the plugins' folder")
        .unwrap();
    let removed = argocd
        .remove(&[&plugin_path(PLUGIN)], "the pod hook plugin removed")
        .unwrap();
    synced_at(argocd, &removed, "Healthy", Duration::from_secs(300)).await;
    gone(&plugins, PLUGIN).await;
    let (after, left) = template_and_operator_fields(&statefulsets).await;
    assert_eq!(
        after, expected,
        "the pod template after the prune is not the chart's own render"
    );
    assert!(
        left.is_null(),
        "the operator's field manager still holds parts of the pod template: {left}"
    );
    let back = latest_revision_pod(&pods, &statefulsets, RELEASE, &uid).await;
    assert_eq!(ready_containers(&back), ["syncer"]);
    eprintln!("gitops: pruned, the pod template is the chart's and the pod runs syncer alone");

    // 3. Committed again: installed again (the state the other tests expect).
    let again = argocd
        .commit(
            &[(&plugin_path(PLUGIN), &plugin_manifest())],
            "the pod hook plugin again",
        )
        .unwrap();
    synced_at(argocd, &again, "Healthy", Duration::from_secs(300)).await;
    assert_plugin_ready(node, NAMESPACE, PLUGIN, 180, " (committed again)");
    let uid = back.metadata.uid.unwrap();
    let rolled = latest_revision_pod(&pods, &statefulsets, RELEASE, &uid).await;
    assert_eq!(ready_containers(&rolled), [PLUGIN, "syncer"]);
    assert_eq!(statefulset_containers(node).await, [PLUGIN, "syncer"]);
}

#[tokio::test]
async fn gitops_a_refused_plugin_makes_the_application_degraded_with_its_message() {
    let _scenario = scenario_lock().lock().await;
    synced_application().await;
    let node = Node::shared();
    let argocd = argocd();
    let client = node.client().await.unwrap();
    let plugins: Api<VClusterPlugin> = Api::namespaced(client.clone(), NAMESPACE);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client, NAMESPACE);
    let (template, _) = template_and_operator_fields(&statefulsets).await;

    let commit = argocd
        .commit(
            &[(&plugin_path(REFUSED), &refused_manifest())],
            "a plugin the policy refuses",
        )
        .unwrap();
    let app = synced_at(argocd, &commit, "Degraded", Duration::from_secs(180)).await;
    let plugin = plugins.get(REFUSED).await.unwrap();
    let ready = plugin
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("a Ready condition");
    // The corpus file's expectation: Ready=False, PolicyDenied, naming spec.envFrom[0].secretRef.
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "PolicyDenied")
    );
    assert!(
        ready.message.contains("spec.envFrom[0].secretRef"),
        "{}",
        ready.message
    );
    // Argo CD's health of it, from the shipped Lua: Degraded, `reason: message`.
    assert_eq!(
        resource_health(&app, "VClusterPlugin", Some(REFUSED)),
        Some((
            "Degraded".to_string(),
            format!("PolicyDenied: {}", ready.message)
        )),
        "Argo CD's health of the refused plugin"
    );
    assert_eq!(
        resource_health(&app, "VClusterPlugin", Some(PLUGIN)).map(|(status, _)| status),
        Some("Healthy".to_string()),
        "the other plugin stays Healthy"
    );
    eprintln!(
        "gitops: refused plugin: Application {:?}, its health {:?}",
        app_state(&app),
        resource_health(&app, "VClusterPlugin", Some(REFUSED))
    );
    // The refusal changed nothing in the StatefulSet: the operator judged this generation (its
    // Ready above is for it), and for a window after that the template and the StatefulSet's
    // generation stay as they were before the commit (a late write would show in either).
    assert_eq!(
        ready.observed_generation, plugin.metadata.generation,
        "the operator's Ready is for the refused plugin's generation"
    );
    let generation_before = statefulsets.get(RELEASE).await.unwrap().metadata.generation;
    let window = std::time::Instant::now();
    let mut looks = 0;
    while window.elapsed() < Duration::from_secs(20) {
        let (now, _) = template_and_operator_fields(&statefulsets).await;
        assert_eq!(
            now,
            template,
            "the pod template {:.0} s after the refused plugin was Degraded",
            window.elapsed().as_secs_f64()
        );
        let generation = statefulsets.get(RELEASE).await.unwrap().metadata.generation;
        assert_eq!(
            generation, generation_before,
            "the StatefulSet's generation"
        );
        looks += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(looks >= 10, "the window looked {looks} times");

    // Removed from Git: pruned, Healthy again.
    let removed = argocd
        .remove(&[&plugin_path(REFUSED)], "the refused plugin removed")
        .unwrap();
    synced_at(argocd, &removed, "Healthy", Duration::from_secs(180)).await;
    gone(&plugins, REFUSED).await;
    assert_eq!(statefulset_containers(node).await, [PLUGIN, "syncer"]);
}
