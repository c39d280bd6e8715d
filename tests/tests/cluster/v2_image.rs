//! A v2 image plugin on the node: the Go pod hook built against vCluster's own module
//! (`scripts/oracles build`'s `go-pod-hook`, speaking vCluster's v2 plugin protocol) in an image
//! built here by buildah, installed by a VClusterPlugin with `image` and `version: v2`. Its init
//! container's copy (`sh -c 'cp -r /plugin /plugins/<name>'`, the operator's
//! `v2_init_container`) lands where vCluster's syncer looks (`/plugins/<name>/plugin`), the
//! syncer loads it (its log), and its hook is applied: a virtual pod created after the install
//! reaches the node with the hook's label, one created before it has none.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::operator::installed_operator;
use crate::operator_image_in_node;
use crate::vcluster::{
    VCluster, assert_plugin_ready, installed_vcluster, pod_ready, ready_containers, scenario_lock,
    tool_values,
};

/// The host namespace of this test's vCluster (the release keeps the samples' name).
const NAMESPACE: &str = "vc-v2";
const RELEASE: &str = "my-vcluster";
/// The plugin's name (its init container's and its folder's under `/plugins`).
const PLUGIN: &str = "go-hook";
/// The test plugin image's reference.
pub const IMAGE: &str = "localhost/vcp/go-pod-hook:v0.30.0";

/// Builds the test plugin image in the node's buildah storage and imports it: the node's
/// busybox image (Debian's busybox-static: the `sh` and `cp` the operator's init container
/// runs) plus the Go plugin at `/plugin/plugin`, where a vcluster-sdk image keeps it. The
/// binary is the oracle as built (cgo on, so it links glibc): it runs inside vCluster's syncer
/// container, whose local image carries the host's glibc (`scripts/images`).
pub fn build_plugin_image(node: &Node) {
    node.build_binary_image(
        "localhost/vcp/busybox:1.35",
        &tool_values()["GO_POD_HOOK"],
        "/plugin/plugin",
        None,
        IMAGE,
    )
    .expect("build and import the Go v2 plugin image");
}

/// Creates virtual pod `team-a/<name>` (busybox, sleeping) and returns its host copy once it is
/// Running on the node.
pub async fn running_host_pod(vcluster: &VCluster, pods: &Api<Pod>, name: &str) -> Pod {
    // Retried: right after a roll the Service's ClusterIP may still lead to the old pod for a
    // moment (endpoints and kube-proxy catching up: "connection refused").
    let mut error = String::new();
    let created = poll_for(Duration::from_secs(60), || {
        let done = match vcluster.run_sleeping_pod("team-a", name) {
            Ok(_) => true,
            Err(e) => {
                error = e;
                vcluster
                    .virtual_kubectl(&["-n", "team-a", "get", "pod", name], None)
                    .is_ok()
            }
        };
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        created.is_some(),
        "virtual pod team-a/{name} not created within 60 s: {error}"
    );
    let host = format!("{name}-x-team-a-x-{RELEASE}");
    poll_for(Duration::from_secs(120), || {
        let pods = pods.clone();
        let host = host.clone();
        async move {
            let pod = pods.get_opt(&host).await.ok()??;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the host pod {host} not Running within 120 s"))
}

/// The value of label `key` of the pod.
pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Installs the v2 plugin `plugin` (its VClusterPlugin in `manifest`) into a vCluster of its
/// own in host namespace `namespace`, and checks what the module's header says: a virtual pod
/// created before reaches the node without label `key`; after the install the rolled pod's init
/// container `plugin` (from `init_image`) exited 0, vCluster's syncer logs `Successfully loaded
/// plugin` for `/plugins/<plugin>/plugin`, and a virtual pod created then reaches the node
/// labelled `key=value` by the plugin's hook.
async fn v2_plugin_is_loaded(
    namespace: &str,
    plugin: &str,
    manifest: &str,
    init_image: &str,
    (key, value): (&str, &str),
) {
    let node = Node::shared();
    let vcluster = installed_vcluster(namespace, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &vcluster.namespace);

    // Before the plugin: a virtual pod reaches the node without the hook's label.
    team_a_ready(vcluster).await;
    let before = running_host_pod(vcluster, &pods, "before").await;
    assert_eq!(label(&before, key), None);

    let uid0 = vcluster.pod_uid(&pods).await;
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(manifest));
    assert!(applied.status.success(), "apply the plugin: {applied:?}");
    assert_plugin_ready(node, namespace, plugin, 180, "");

    // The rolled pod: Ready, its init container from the plugin's image exited 0, vCluster's
    // syncer its only container.
    let rolled = rolled_pod(vcluster, &pods, &uid0).await;
    assert_eq!(ready_containers(&rolled), ["syncer"]);
    assert_v2_plugin_loaded(vcluster, &rolled, plugin, init_image).await;

    // Its hook: a virtual pod created now reaches the node labelled at create.
    let after = running_host_pod(vcluster, &pods, "after").await;
    assert_eq!(
        label(&after, key),
        Some(value),
        "labels of the host pod: {:?}",
        after.metadata.labels
    );
    assert_eq!(
        after.spec.as_ref().unwrap().node_name.as_deref(),
        Some("vcp-node")
    );
}

/// Creates the virtual namespace `team-a` (if missing) and waits up to 60 s for its
/// ServiceAccount `default` (made by the virtual cluster's kube-controller-manager moments
/// later), without which no pod can be created there.
pub async fn team_a_ready(vcluster: &VCluster) {
    let ready_ns = poll_for(Duration::from_secs(60), || {
        let _ = vcluster.virtual_kubectl(&["create", "namespace", "team-a"], None);
        let sa = vcluster
            .virtual_kubectl(&["get", "serviceaccount", "-n", "team-a", "default"], None)
            .is_ok();
        async move { sa.then_some(()) }
    })
    .await;
    assert!(
        ready_ns.is_some(),
        "virtual namespace team-a and its ServiceAccount"
    );
}

/// Waits up to 300 s for the vCluster's pod to be a new one (its uid not `old_uid`: the
/// StatefulSet rolled) that is Running and Ready, and returns it; panics with `kubectl describe`
/// of the pod otherwise.
pub async fn rolled_pod(vcluster: &VCluster, pods: &Api<Pod>, old_uid: &str) -> Pod {
    let name = vcluster.pod_name();
    let rolled = poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            (pod.metadata.uid.as_deref() != Some(old_uid) && pod_ready(&pod)).then_some(pod)
        }
    })
    .await;
    rolled.unwrap_or_else(|| {
        panic!(
            "{name} not rolled and Ready within 300 s:\n{}",
            Node::shared()
                .kubectl(&["-n", &vcluster.namespace, "describe", "pod", &name])
                .unwrap_or_else(|e| e.to_string())
        )
    })
}

/// Waits up to 300 s for the pod `<release>-0` of the StatefulSet `release`'s latest revision
/// (its `controller-revision-hash` the StatefulSet's `status.updateRevision`), a new one (its
/// uid not `old_uid`), Running and Ready, and returns it: after changes that may roll twice.
pub async fn latest_revision_pod(
    pods: &Api<Pod>,
    statefulsets: &Api<StatefulSet>,
    release: &str,
    old_uid: &str,
) -> Pod {
    let name = format!("{release}-0");
    poll_for(Duration::from_secs(300), || {
        let (pods, statefulsets, name) = (pods.clone(), statefulsets.clone(), name.clone());
        async move {
            let sts = statefulsets.get(release).await.ok()?;
            let revision = sts.status?.update_revision?;
            let pod = pods.get_opt(&name).await.ok()??;
            let current = pod
                .metadata
                .labels
                .as_ref()?
                .get("controller-revision-hash")
                == Some(&revision);
            (pod.metadata.uid.as_deref() != Some(old_uid) && current && pod_ready(&pod))
                .then_some(pod)
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the pod {name} of the StatefulSet's latest revision not Running and Ready within 300 s"
        )
    })
}

/// Asserts that v2 plugin `plugin` is in the vCluster's pod `pod`: its init container ran
/// `init_image` and exited 0 (the operator's copy into `/plugins/<plugin>`), and vCluster's
/// syncer logged `Successfully loaded plugin` for `/plugins/<plugin>/plugin` (waited up to 60 s).
pub async fn assert_v2_plugin_loaded(
    vcluster: &VCluster,
    pod: &Pod,
    plugin: &str,
    init_image: &str,
) {
    let init = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.iter().find(|s| s.name == plugin))
        .unwrap_or_else(|| panic!("no init container {plugin} in {:?}", pod.status));
    assert_eq!(init.image, init_image);
    let exit = init
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(exit, Some(0), "the init container's copy: {init:?}");
    let path = format!("/plugins/{plugin}/plugin");
    let log = syncer_log_with(vcluster, &pod.name_any(), |l| {
        l.contains("Successfully loaded plugin") && l.contains(&path)
    })
    .await;
    assert!(
        log.is_ok(),
        "vCluster's syncer did not log `Successfully loaded plugin` for {path}:\n{}",
        log.unwrap_err()
    );
}

/// Polls (up to 60 s) the log of container `syncer` of the vCluster's pod `pod` until a line
/// satisfies `wanted`; returns the whole log, or its last 40 lines as the error.
pub async fn syncer_log_with(
    vcluster: &VCluster,
    pod: &str,
    wanted: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let mut log = String::new();
    let found = poll_for(Duration::from_secs(60), || {
        log = Node::shared()
            .kubectl(&["-n", &vcluster.namespace, "logs", pod, "-c", "syncer"])
            .unwrap_or_default();
        let found = log.lines().any(&wanted).then(|| log.clone());
        async move { found }
    })
    .await;
    found.ok_or_else(|| log.lines().rev().take(40).collect::<Vec<_>>().join("\n"))
}

#[tokio::test]
async fn a_go_v2_plugin_image_is_copied_to_plugins_and_loaded_by_vclusters_syncer() {
    let _scenario = scenario_lock().lock().await;
    installed_operator().await;
    build_plugin_image(Node::shared());
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  image: {IMAGE}\n  \
         version: v2\n  imagePullPolicy: Never\n"
    );
    v2_plugin_is_loaded(
        NAMESPACE,
        PLUGIN,
        &manifest,
        IMAGE,
        ("created-by-go-plugin", "go-hook"),
    )
    .await;
}

/// The embedded Rust runtime as a v2 plugin (no `image`, `version: v2`, a pod hook): the
/// operator's init container from the product's image runs `vcluster-plugin-syncer
/// install-plugin /plugins/<name>`, and vCluster's syncer loads the runtime like a Go plugin.
#[tokio::test]
async fn the_rust_runtime_as_a_v2_plugin_is_loaded_by_vclusters_syncer() {
    let _scenario = scenario_lock().lock().await;
    installed_operator().await;
    let namespace = "vc-v2-rust";
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: rust-hook, \
         namespace: {namespace}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  version: v2\n  \
         hooks:\n  - name: pod-hook\n    apiVersion: v1\n    kind: Pod\n    events: \
         [CreatePhysical]\n    labels:\n      created-by-plugin: rust-hook\n"
    );
    v2_plugin_is_loaded(
        namespace,
        "rust-hook",
        &manifest,
        operator_image_in_node(),
        ("created-by-plugin", "rust-hook"),
    )
    .await;
}

/// Issue 48's own case: an embedded plugin that names no `version`, whose `CreatePhysical` hook
/// adds an env var by `jsonPatch` on `/spec/containers/0/env`, which an existing pod cannot
/// change. As a sidecar (the default before) the runtime could only warn `ImmutablePodFields`
/// and the pod ran without the variable; now the operator runs it the v2 way, vCluster's syncer
/// loads it and calls the hook before it creates each host pod, and the variable is there. It
/// is applied together with the shipped `config/samples/hooks-only-plugin.yaml` as it is (only
/// its namespace moved here), whose labels and annotation reach the same pod.
#[tokio::test]
async fn a_create_time_pod_hook_takes_effect_by_default_and_the_hooks_only_sample_works() {
    let _scenario = scenario_lock().lock().await;
    installed_operator().await;
    let node = Node::shared();
    let namespace = "vc-v2-rust";
    let vcluster = installed_vcluster(namespace, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client, namespace);
    let sample = std::fs::read_to_string(
        vcp_tests::control_plane::repo_root().join("config/samples/hooks-only-plugin.yaml"),
    )
    .expect("the sample");
    assert!(sample.contains("namespace: my-vcluster") && !sample.contains("version:"));
    let env_plugin = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: env-hook, \
         namespace: {namespace}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  hooks:\n  - name: \
         add-env\n    apiVersion: v1\n    kind: Pod\n    events: [CreatePhysical]\n    \
         jsonPatch:\n    - op: add\n      path: /spec/containers/0/env\n      value: [{{name: \
         ADDED_BY_HOOK, value: at-create}}]\n"
    );
    let manifest = format!(
        "{}\n---\n{env_plugin}",
        sample.replace("namespace: my-vcluster", &format!("namespace: {namespace}"))
    );
    let uid0 = vcluster.pod_uid(&pods).await;
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "apply the plugins: {applied:?}");
    assert_plugin_ready(node, namespace, "pod-policy", 180, "");
    assert_plugin_ready(node, namespace, "env-hook", 180, "");

    // Both run the v2 way: init containers from the product's image, loaded by the syncer,
    // and no sidecar.
    let rolled = latest_revision_pod(&pods, &statefulsets, RELEASE, &uid0).await;
    let ready = ready_containers(&rolled);
    assert!(
        !ready.iter().any(|c| c == "pod-policy" || c == "env-hook"),
        "a plugin runs as a sidecar: {ready:?}"
    );
    assert_v2_plugin_loaded(vcluster, &rolled, "pod-policy", operator_image_in_node()).await;
    assert_v2_plugin_loaded(vcluster, &rolled, "env-hook", operator_image_in_node()).await;

    team_a_ready(vcluster).await;
    let hooked = running_host_pod(vcluster, &pods, "hooked-at-create").await;
    let env = hooked.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "ADDED_BY_HOOK" && e.value.as_deref() == Some("at-create")),
        "the host pod's first container lacks the hook's variable: {env:?}"
    );
    assert_eq!(label(&hooked, "cost-center"), Some("platform"));
    assert_eq!(label(&hooked, "vcp.dev/hooked"), Some("true"));
    assert_eq!(
        hooked
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("cluster-autoscaler.kubernetes.io/safe-to-evict"))
            .map(String::as_str),
        Some("true")
    );

    for plugin in ["pod-policy", "env-hook"] {
        node.kubectl(&[
            "-n",
            namespace,
            "delete",
            "vclusterplugin",
            plugin,
            "--timeout=120s",
        ])
        .unwrap_or_else(|e| panic!("delete {plugin}: {e}"));
    }
}
