//! A v1 (legacy sidecar) image plugin on the node: the Go v1 pod hook built against vCluster's
//! own module (`scripts/oracles build`'s `go-pod-hook-v1`, vCluster's `pkg/plugin/v1/remote`
//! protocol) in an image built here by buildah, installed by a VClusterPlugin with `image`,
//! `version: v1`, `args` and `config`. The operator adds it to the vCluster's pod as a sidecar
//! container (env `VCLUSTER_PLUGIN_ADDRESS=localhost:14000`, `VCLUSTER_PLUGIN_NAME`,
//! `PLUGIN_CONFIG`: as the chart's `vcluster.legacyPlugins.containers`); the sidecar
//! runs from its image's entrypoint and registers with vCluster's legacy plugin server
//! (`localhost:10099` inside the pod, `pkg/plugin/v1/plugin.go`).
//!
//! What vCluster then does with its hook depends on vCluster, not on the operator, and the
//! test shows both cases on the node, as `e2e_inside_vcluster`'s `v1_sidecar` does with local
//! processes:
//! - alone, it registers and its hook is never called: vCluster's clients call hooks only when
//!   some plugin was known as they were made (`pluginhookclient.NewPluginClient`:
//!   `HasPlugins()`, for legacy plugins the list in the vCluster's config, which the operator
//!   does not write);
//! - beside a v2 plugin (the embedded runtime as v2, also installed by a VClusterPlugin), the
//!   hook of the registered v1 plugin is called for every host pod vCluster creates
//!   (`manager.MutateObject` runs the legacy manager's hooks, then the v2 plugins'): a virtual
//!   pod reaches the node with both labels, the v1 one holding the value from `PLUGIN_CONFIG`.
//!
//! Deleting both plugins rolls the vCluster back to the chart's template.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::operator::installed_operator;
use crate::operator_image_in_node;
use crate::v2_image::{
    assert_v2_plugin_loaded, label, latest_revision_pod, rolled_pod, running_host_pod,
    syncer_log_with, team_a_ready,
};
use crate::vcluster::{
    assert_plugin_ready, installed_vcluster, log_tail, ready_containers, scenario_lock, tool_values,
};

/// The host namespace of this test's vCluster (the release keeps the samples' name).
const NAMESPACE: &str = "vc-v1";
const RELEASE: &str = "my-vcluster";
/// The v1 plugin's name: its sidecar container's and the name it registers with vCluster.
const PLUGIN: &str = "go-hook-v1";
/// The v1 test plugin image's reference.
pub const IMAGE: &str = "localhost/vcp/go-pod-hook-v1:v0.30.0";
/// The label key the v1 hook sets (its `-label` argument, from the VClusterPlugin's `args`).
const KEY: &str = "created-by-v1-plugin";
/// The label value, which reaches the hook only as `label` in `PLUGIN_CONFIG` (the
/// VClusterPlugin's `config`).
const VALUE: &str = "from-plugin-config";
/// The v2 plugin installed beside it: the embedded runtime with a pod hook.
const V2_PLUGIN: &str = "rust-hook";

/// The final stage's base of the product's Dockerfile, as `operator_image` stands it in under
/// its real name (Debian's glibc and libgcc, distroless's users): the Go v1 plugin is built
/// with cgo (it links glibc), so its image needs a C library, as a vcluster-sdk image built
/// `FROM` a distroless or Debian base has.
const BASE: &str = "gcr.io/distroless/cc-debian12:nonroot";

/// Builds the v1 test plugin image in the node's buildah storage and imports it: [`BASE`] plus
/// the Go v1 plugin at `/plugin`, its entrypoint (a v1 sidecar runs its image's entrypoint:
/// the operator sets no `command`). Needs [`operator_image_in_node`] first, which makes the
/// base.
fn build_v1_image(node: &Node) {
    node.build_binary_image(
        BASE,
        &tool_values()["GO_POD_HOOK_V1"],
        "/plugin",
        Some(r#"["/plugin"]"#),
        IMAGE,
    )
    .expect("build and import the Go v1 plugin image");
}

/// The log of the v1 sidecar container of pod `pod`, polled up to 60 s until it holds `wanted`;
/// panics with its tail otherwise.
async fn sidecar_log_with(node: &Node, pod: &str, wanted: &str) -> String {
    let mut log = String::new();
    let found = poll_for(Duration::from_secs(60), || {
        log = node
            .kubectl(&["-n", NAMESPACE, "logs", pod, "-c", PLUGIN])
            .unwrap_or_default();
        let found = log.contains(wanted).then(|| log.clone());
        async move { found }
    })
    .await;
    found.unwrap_or_else(|| panic!("the v1 sidecar's log never held {wanted:?}:\n{log}"))
}

#[tokio::test]
async fn a_go_v1_sidecar_image_registers_with_vclusters_syncer_and_hooks_beside_a_v2_plugin() {
    let _scenario = scenario_lock().lock().await;
    installed_operator().await;
    let node = Node::shared();
    let runtime_image = operator_image_in_node();
    build_v1_image(node);
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client, NAMESPACE);
    let vcluster_pod = vcluster.pod_name();
    team_a_ready(vcluster).await;

    // 1. The v1 plugin alone: a sidecar from its image, registered with vCluster's syncer.
    let uid0 = pods.get(&vcluster_pod).await.unwrap().metadata.uid.unwrap();
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  image: {IMAGE}\n  \
         version: v1\n  imagePullPolicy: Never\n  args: [-label, {KEY}]\n  config: \
         {{label: {VALUE}}}\n"
    );
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "apply the v1 plugin: {applied:?}");
    assert_plugin_ready(node, NAMESPACE, PLUGIN, 180, "");
    let rolled = rolled_pod(vcluster, &pods, &uid0).await;
    assert_eq!(ready_containers(&rolled), [PLUGIN, "syncer"]);
    let sidecar = rolled
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.iter().find(|s| s.name == PLUGIN))
        .expect("the sidecar's status");
    assert_eq!(sidecar.image, IMAGE);
    assert_eq!(sidecar.restart_count, 0, "{sidecar:?}");
    // The plugin read its name, address and config from the env the operator set, and
    // vCluster's legacy plugin server in the pod took its registration and its client hook.
    sidecar_log_with(
        node,
        &vcluster_pod,
        &format!(
            "Registered plugin {PLUGIN} (serving Mutate on localhost:14000, hook CreatePhysical \
             v1 Pod: label {KEY}={VALUE})"
        ),
    )
    .await;
    let hook_line = format!("Register client hook for v1 Pod in plugin {PLUGIN}");
    let log = syncer_log_with(vcluster, &vcluster_pod, |l| l.contains(&hook_line)).await;
    assert!(
        log.is_ok(),
        "vCluster's syncer did not log {hook_line:?}:\n{}",
        log.unwrap_err()
    );
    // Alone, its hook is registered and never called (no plugin was known when vCluster's
    // clients were made): the host pod has no v1 label and the plugin logged no Mutate.
    let alone = running_host_pod(vcluster, &pods, "v1-alone").await;
    assert_eq!(
        label(&alone, KEY),
        None,
        "vCluster called an unlisted v1 plugin's hook with no other plugin known"
    );
    let said = sidecar_log_with(node, &vcluster_pod, "Registered plugin").await;
    assert!(!said.contains("Mutate CreatePhysical"), "{said}");

    // 2. Beside a v2 plugin (the embedded runtime with a pod hook): both hooks on the node.
    let uid1 = rolled.metadata.uid.clone().unwrap();
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {V2_PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  version: v2\n  \
         hooks:\n  - name: pod-hook\n    apiVersion: v1\n    kind: Pod\n    events: \
         [CreatePhysical]\n    labels:\n      created-by-plugin: {V2_PLUGIN}\n"
    );
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "apply the v2 plugin: {applied:?}");
    assert_plugin_ready(node, NAMESPACE, V2_PLUGIN, 180, "");
    let rolled = rolled_pod(vcluster, &pods, &uid1).await;
    assert_eq!(ready_containers(&rolled), [PLUGIN, "syncer"]);
    assert_v2_plugin_loaded(vcluster, &rolled, V2_PLUGIN, runtime_image).await;
    let log = syncer_log_with(vcluster, &vcluster_pod, |l| l.contains(&hook_line)).await;
    assert!(
        log.is_ok(),
        "vCluster's syncer did not log {hook_line:?} after the roll:\n{}",
        log.unwrap_err()
    );
    let both = running_host_pod(vcluster, &pods, "v1-and-v2").await;
    assert_eq!(
        (label(&both, KEY), label(&both, "created-by-plugin")),
        (Some(VALUE), Some(V2_PLUGIN)),
        "labels of the host pod: {:?}\nthe v1 sidecar:\n{}",
        both.metadata.labels,
        log_tail(node, NAMESPACE, &vcluster_pod, PLUGIN)
    );
    sidecar_log_with(
        node,
        &vcluster_pod,
        &format!("Mutate CreatePhysical v1 Pod {NAMESPACE}/v1-and-v2-x-team-a-x-{RELEASE}"),
    )
    .await;

    // 3. Deleting both plugins: the chart's template again, and a pod of vCluster's syncer
    //    alone.
    let uid2 = rolled.metadata.uid.clone().unwrap();
    for plugin in [PLUGIN, V2_PLUGIN] {
        node.kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "vclusterplugin",
            plugin,
            "--timeout=120s",
        ])
        .unwrap();
    }
    let sts = statefulsets.get(RELEASE).await.unwrap();
    assert_eq!(
        serde_json::to_value(&sts.spec.as_ref().unwrap().template).unwrap(),
        vcluster.chart_template,
        "the StatefulSet's pod template after both plugins' removal differs from the chart's"
    );
    // Two removals may roll twice: wait for the pod of the StatefulSet's latest revision.
    let back = latest_revision_pod(&pods, &statefulsets, RELEASE, &uid2).await;
    assert_eq!(ready_containers(&back), ["syncer"]);
}
