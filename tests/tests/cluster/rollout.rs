//! A plugin whose image cannot start, on the node, as the rollout issue found it: a v2 image
//! plugin with `imagePullPolicy: Never` and an image the node does not have leaves the
//! vCluster's pod in `Init:ErrImageNeverPull`. The plugin must not say `Ready`: within 30 s of
//! the kubelet reporting the pull error, it is `Ready=False`, reason `RolloutFailed`, phase
//! `Degraded`, its message and a `Warning` Event quoting the kubelet (the pod, the init
//! container, `ErrImageNeverPull`), while `WorkloadPatched` stays `True` (the write was made).
//!
//! After the plugin is deleted the vCluster's template is the chart's again, but the StatefulSet
//! does not replace a pod stuck on a broken template by itself (Kubernetes' "forced rollback"):
//! the test deletes that pod, as the troubleshooting page tells a person to, and the vCluster
//! serves again.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use vcp_crds::VClusterPlugin;
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::operator::installed_operator;
use crate::v2_image::rolled_pod;
use crate::vcluster::{installed_vcluster, pod_ready, scenario_lock};

/// The vCluster of [`crate::v2_image`]'s Go plugin: this test leaves it serving again.
const NAMESPACE: &str = "vc-v2";
const RELEASE: &str = "my-vcluster";
/// The plugin, and so its init container.
const PLUGIN: &str = "broken-image";
/// An image no one built: with `imagePullPolicy: Never` the kubelet refuses to start it.
const IMAGE: &str = "localhost/vcp/does-not-exist:0.1.0";

/// The kubelet's reason for the init container `container` of `pod`, when it waits.
fn waiting_reason(pod: &Pod, container: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == container)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

/// The condition `type_` of the plugin: (status, reason, message).
fn condition(plugin: &VClusterPlugin, type_: &str) -> Option<(String, String, String)> {
    plugin
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_plugin_whose_image_cannot_start_is_degraded_with_the_kubelets_reason() {
    let _scenario = scenario_lock().lock().await;
    installed_operator().await;
    let node = Node::shared();
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod_name = vcluster.pod_name();

    // The checks run to their end or their first failure; the vCluster is brought back either
    // way, then the failure (if any) is reported: the next test of this binary finds it serving.
    let checked = std::panic::AssertUnwindSafe(checks(&client, &pod_name));
    let outcome = futures::FutureExt::catch_unwind(checked).await;
    bring_back(vcluster, &client, &pods, &pod_name).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The module's checks, from the apply of the broken plugin to its Warning Event.
async fn checks(client: &kube::Client, pod_name: &str) {
    let node = Node::shared();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let plugins: Api<VClusterPlugin> = Api::namespaced(client.clone(), NAMESPACE);
    let pod_name = pod_name.to_string();
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  image: {IMAGE}\n  \
         version: v2\n  imagePullPolicy: Never\n"
    );
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "apply the plugin: {applied:?}");

    // Both sides watched in one loop: when the kubelet first reports the pull error on the
    // vCluster's pod, and when the plugin first says so.
    let began = Instant::now();
    // (when the kubelet first reported it, the plugin's last Ready and phase)
    let seen = std::sync::Arc::new(std::sync::Mutex::new((None::<Instant>, String::new())));
    let degraded = poll_for(Duration::from_secs(240), || {
        let (pods, plugins, pod_name) = (pods.clone(), plugins.clone(), pod_name.clone());
        let seen = seen.clone();
        async move {
            if seen.lock().unwrap().0.is_none()
                && let Ok(Some(pod)) = pods.get_opt(&pod_name).await
                && waiting_reason(&pod, PLUGIN).as_deref() == Some("ErrImageNeverPull")
            {
                seen.lock().unwrap().0 = Some(Instant::now());
            }
            let plugin = plugins.get(PLUGIN).await.ok()?;
            let ready = condition(&plugin, "Ready")?;
            seen.lock().unwrap().1 =
                format!("{ready:?}, phase {:?}", plugin.status.as_ref()?.phase);
            (ready.1 == "RolloutFailed").then_some((plugin, Instant::now()))
        }
    })
    .await;
    let (kubelet_at, last) = seen.lock().unwrap().clone();
    let (plugin, said_at) = degraded.unwrap_or_else(|| {
        panic!(
            "{PLUGIN} not RolloutFailed within 240 s (last: {last}); the kubelet reported at {:?}:\n{}",
            kubelet_at.map(|t| t - began),
            node.kubectl(&["-n", NAMESPACE, "describe", "pod", &pod_name])
                .unwrap_or_default()
        )
    });
    // Both seen in the same poll: no lag measured beyond the poll itself.
    let kubelet_at = kubelet_at.unwrap_or(said_at);
    let lag = said_at.saturating_duration_since(kubelet_at);
    println!(
        "rollout: the kubelet reported ErrImageNeverPull {:.1} s after the apply; the plugin said \
         RolloutFailed {:.1} s later",
        (kubelet_at - began).as_secs_f64(),
        lag.as_secs_f64()
    );
    assert!(lag < Duration::from_secs(30), "{lag:?} after the kubelet");

    let (status, _, message) = condition(&plugin, "Ready").unwrap();
    assert_eq!(status, "False");
    assert!(
        message.starts_with(&format!(
            "pod {pod_name}: init container {PLUGIN}: ErrImageNeverPull: "
        )) && message.contains(IMAGE),
        "the message quotes the kubelet: {message}"
    );
    assert_eq!(
        plugin.status.as_ref().and_then(|s| s.phase),
        Some(vcp_crds::Phase::Degraded)
    );
    assert_eq!(
        condition(&plugin, "WorkloadPatched").map(|c| (c.0, c.1)),
        Some(("True".into(), "Installed".into()))
    );
    // The Warning Event, with the same words.
    let event = vcp_tests::poll_event(
        client,
        NAMESPACE,
        PLUGIN,
        "RolloutFailed",
        Duration::from_secs(30),
    )
    .await
    .expect("a RolloutFailed Event about the plugin");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("ErrImageNeverPull"),
        "{event:?}"
    );
}

/// Deletes the plugin (its init container leaves the template), waits for the StatefulSet to
/// have seen that template (`status.observedGeneration`), then deletes the pod stuck on the
/// broken one, as a person must today, and waits for the vCluster's pod to be a new one,
/// Running and Ready, without the plugin.
async fn bring_back(
    vcluster: &crate::vcluster::VCluster,
    client: &kube::Client,
    pods: &Api<Pod>,
    pod_name: &str,
) {
    let node = Node::shared();
    let deleted = node.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "vclusterplugin",
        PLUGIN,
        "--ignore-not-found",
        "--wait",
    ]);
    assert!(deleted.is_ok(), "delete the plugin: {deleted:?}");
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let observed = poll_for(Duration::from_secs(60), || {
        let statefulsets = statefulsets.clone();
        async move {
            let sts = statefulsets.get(RELEASE).await.ok()?;
            let without = sts
                .spec
                .as_ref()?
                .template
                .spec
                .as_ref()?
                .init_containers
                .iter()
                .flatten()
                .all(|c| c.name != PLUGIN);
            (without && sts.status?.observed_generation >= sts.metadata.generation).then_some(())
        }
    })
    .await;
    assert!(
        observed.is_some(),
        "the StatefulSet did not see the template without {PLUGIN} within 60 s"
    );
    let pod = pods.get(pod_name).await.expect("the vCluster's pod");
    let carries = |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.name == PLUGIN)
    };
    if pod_ready(&pod) && !carries(&pod) {
        // Never rolled onto the broken template (a check failed before): nothing to bring back.
        return;
    }
    let stuck_uid = pod.metadata.uid.clone().unwrap_or_default();
    pods.delete(pod_name, &DeleteParams::default())
        .await
        .expect("delete the stuck pod");
    let back = rolled_pod(vcluster, pods, &stuck_uid).await;
    let init: Vec<String> = back
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    assert!(
        !init.contains(&PLUGIN.to_string()),
        "init containers: {init:?}"
    );
}
