//! The operator across a restart of the host API server (the watches it reconciles from fail
//! and must resume): a change made after the restart converges within seconds, not at the next
//! periodic resync. One test, so this binary's control plane is its own to restart.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, wait_for};

const NS: &str = "op-restart";
/// How long convergence may take after the API server is back (the operator's periodic
/// resync is 600 s, so a stalled watch cannot pass this).
const CONVERGE: Duration = Duration::from_secs(45);

/// The image of the v2 plugin container in the StatefulSet, if any.
async fn plugin_image(sts: &Api<StatefulSet>) -> Option<String> {
    let live = sts.get("my-vcluster").await.ok()?;
    live.spec?
        .template
        .spec?
        .init_containers?
        .into_iter()
        .find(|c| c.name == "v2")?
        .image
}

#[tokio::test]
async fn changes_after_a_host_api_server_restart_converge() {
    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:restart").await;
    vcp_tests::create_namespace(&admin, NS).await;
    vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(NS), Some(NS))
        .await
        .expect("create the vCluster's workload as its chart renders it");
    let sts_api = Api::<StatefulSet>::namespaced(admin.clone(), NS);
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": "v2", "namespace": NS },
        "spec": {
            "vcluster": { "name": "my-vcluster" },
            "version": "v2",
            "image": "example.com/plugin:1",
        },
    }))
    .unwrap();
    plugins
        .create(&PostParams::default(), &plugin)
        .await
        .expect("create VClusterPlugin");
    wait_for(Duration::from_secs(30), || async {
        (plugin_image(&sts_api).await.as_deref() == Some("example.com/plugin:1")).then_some(())
    })
    .await;

    ControlPlane::shared()
        .restart(Cluster::Host)
        .expect("restart the host API server");
    let back = Instant::now();
    plugins
        .patch(
            "v2",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "image": "example.com/plugin:2" } })),
        )
        .await
        .expect("change the plugin's image");
    wait_for(CONVERGE, || async {
        (plugin_image(&sts_api).await.as_deref() == Some("example.com/plugin:2")).then_some(())
    })
    .await;
    eprintln!(
        "converged {:.1} s after the API server was back",
        back.elapsed().as_secs_f64()
    );
}
