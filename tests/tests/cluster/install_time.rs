//! The figure users ask about: the time from installing a plugin to the vCluster pod Ready with
//! the plugin running, the operator's way (`kubectl apply` of a VClusterPlugin) against
//! vCluster's own way (`helm upgrade` of the same release with the same plugin in the chart's
//! `plugins:` values), on the same node and vCluster, one after the other. The plugin is the
//! same in both: the Go v2 pod hook image of [`crate::v2_image`], which the chart's init
//! container and the operator's copy the same way (`sh -c 'cp -r /plugin /plugins/<name>'`).
//! "Running" is vCluster's syncer in the new pod logging `Successfully loaded plugin` for it.
//!
//! `VCP_NODE_BENCH_RUNS` rounds (default 1; `scripts/bench node` runs 3) of: apply, wait,
//! delete (rolled back to the chart's template), helm upgrade with the plugin, wait, helm
//! upgrade without it; the medians are printed.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::operator::installed_operator;
use crate::v2_image::{IMAGE, build_plugin_image};
use crate::vcluster::{helm_chart, installed_vcluster, pod_ready, scenario_lock};

/// The host namespace of this test's vCluster.
const NAMESPACE: &str = "vc-bench";
const RELEASE: &str = "my-vcluster";
/// The plugin's name, the same under both ways (the init container's and the folder's name).
const PLUGIN: &str = "go-hook";

/// Waits (up to 300 s) for the vCluster pod to be a pod other than `old_uid`, Ready, and (when
/// `loaded`) its syncer's log to show the plugin loaded from `/plugins/<PLUGIN>/plugin`; returns
/// the new pod's uid.
async fn rolled(pods: &Api<Pod>, old_uid: &str, loaded: bool) -> String {
    let node = Node::shared();
    let name = format!("{RELEASE}-0");
    let path = format!("/plugins/{PLUGIN}/plugin");
    let uid = poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let name = name.clone();
        let path = path.clone();
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            let uid = pod.metadata.uid.clone()?;
            if uid == old_uid || !pod_ready(&pod) {
                return None;
            }
            if loaded {
                let log = node
                    .kubectl(&["-n", NAMESPACE, "logs", &name, "-c", "syncer"])
                    .ok()?;
                log.lines()
                    .any(|l| l.contains("Successfully loaded plugin") && l.contains(&path))
                    .then_some(uid)
            } else {
                Some(uid)
            }
        }
    })
    .await;
    uid.unwrap_or_else(|| {
        panic!(
            "{NAMESPACE}/{name} not rolled and Ready (plugin loaded: {loaded}) within 300 s:\n{}",
            node.kubectl(&["-n", NAMESPACE, "describe", "pod", &name])
                .unwrap_or_else(|e| e.to_string())
        )
    })
}

/// The middle value of `times` (sorted), in seconds.
fn median(times: &[f64]) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The init container named [`PLUGIN`] of the StatefulSet's template: (image, command + args).
async fn plugin_init(sts: &Api<StatefulSet>) -> Option<(String, Vec<String>)> {
    let template = sts.get(RELEASE).await.ok()?.spec?.template.spec?;
    let init = template
        .init_containers?
        .into_iter()
        .find(|c| c.name == PLUGIN)?;
    let mut line = init.command.unwrap_or_default();
    line.extend(init.args.unwrap_or_default());
    Some((init.image?, line))
}

#[tokio::test]
async fn plugin_install_time_by_the_operator_and_by_helm_upgrade() {
    let _scenario = scenario_lock().lock().await;
    let runs: usize = std::env::var("VCP_NODE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let node = Node::shared();
    installed_operator().await;
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    build_plugin_image(node);
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let sts: Api<StatefulSet> = Api::namespaced(client, NAMESPACE);
    let plugin = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  image: {IMAGE}\n  \
         version: v2\n  imagePullPolicy: Never\n"
    );
    // The chart prefixes `controlPlane.advanced.defaultImageRegistry` (localhost) to the image.
    let values = node.dir().join("bench-plugin-values.yaml");
    std::fs::write(
        &values,
        format!(
            "plugins:\n  {PLUGIN}:\n    image: {}\n    imagePullPolicy: Never\n",
            IMAGE.trim_start_matches("localhost/")
        ),
    )
    .unwrap();

    let mut uid = vcluster.pod_uid(&pods).await;
    let (mut by_operator, mut by_helm) = (Vec::new(), Vec::new());
    for round in 1..=runs {
        // The operator's way.
        let started = Instant::now();
        let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&plugin));
        assert!(applied.status.success(), "apply the plugin: {applied:?}");
        uid = rolled(&pods, &uid, true).await;
        by_operator.push(started.elapsed().as_secs_f64());
        let operator_init = plugin_init(&sts)
            .await
            .expect("the operator's init container");
        node.kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "vclusterplugin",
            PLUGIN,
            "--timeout=120s",
        ])
        .unwrap();
        uid = rolled(&pods, &uid, false).await;
        let template =
            serde_json::to_value(sts.get(RELEASE).await.unwrap().spec.unwrap().template).unwrap();
        assert_eq!(
            template, vcluster.chart_template,
            "round {round}: the template after the plugin's removal is not the chart's"
        );

        // vCluster's way: the same release upgraded with the plugin in its values.
        let started = Instant::now();
        helm_chart("upgrade", NAMESPACE, RELEASE, Some(&values)).expect("helm upgrade");
        uid = rolled(&pods, &uid, true).await;
        by_helm.push(started.elapsed().as_secs_f64());
        let chart_init = plugin_init(&sts).await.expect("the chart's init container");
        assert_eq!(
            operator_init, chart_init,
            "the operator's and the chart's init container for the same plugin differ"
        );
        helm_chart("upgrade", NAMESPACE, RELEASE, None).expect("helm upgrade without it");
        uid = rolled(&pods, &uid, false).await;
        eprintln!(
            "install-time: round {round}: kubectl apply {:.1} s, helm upgrade {:.1} s",
            by_operator[round - 1],
            by_helm[round - 1]
        );
    }
    eprintln!(
        "install-time: plugin install -> vCluster pod Ready with the plugin loaded, median of \
         {runs}: kubectl apply (operator) {:.1} s {by_operator:.1?}, helm upgrade {:.1} s \
         {by_helm:.1?}",
        median(&by_operator),
        median(&by_helm)
    );
}
