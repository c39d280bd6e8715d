//! End to end on a real node (docs/REAL-NODE.md): the product as users run it. One test binary,
//! one node ([`vcp_tests::node::Node::shared`]: `scripts/node`, kubelet + containerd +
//! kube-proxy in a network namespace), images built locally with buildah and imported, never
//! pulled.
//!
//! - [`operator`]: `kubectl apply -k config/default` runs the operator from its image.
//! - [`attack_workload_cache`]: a tenant with `edit` floods `app=vcluster` StatefulSets of 1 MB;
//!   the operator keeps running within its memory limit.
//! - [`vcluster`]: vCluster's own chart as a pod, and the tutorial's plugin installed into it.
//! - [`fault`]: the vCluster pod killed while a plugin install rolls it; nothing lost.
//! - [`install_time`]: plugin install to Ready, by the operator and by `helm upgrade` (the figure).
//! - [`v2_image`]: a Go v2 plugin image copied into `/plugins` and loaded by vCluster's syncer;
//!   the Rust runtime loaded the same way; an embedded plugin with a create-time pod hook (and
//!   the shipped hooks-only sample) run that way by default, and the hook takes effect.
//! - [`v1_image`]: a Go v1 sidecar image registered with vCluster's syncer; its hook beside a v2
//!   plugin.
//! - [`gitops`]: Argo CD itself syncs the sample Application (the chart and a plugin from Git);
//!   Synced and Healthy, and no fight with the operator over the StatefulSet.
//! - [`gitops_lifecycle`]: after that sync, a plugin changed in Git, one pruned (the chart's
//!   template again), one refused (the Application `Degraded` with its message).
//! - [`gitops_order`]: the CRD and the plugins in one Application on a fresh (nodeless)
//!   cluster sync at the first attempt, with no sync wave.
//! - [`rollout`]: a plugin whose image the node cannot start is `RolloutFailed`, quoting the
//!   kubelet, within 30 s of the kubelet's report.
//! - [`attack_http`]: any pod floods the operator's and a runtime sidecar's HTTP ports; neither
//!   restarts nor outgrows its memory, and plugins go on installing and hooking.

mod attack_http;
mod attack_workload_cache;
mod fault;
mod gitops;
mod gitops_lifecycle;
mod gitops_order;
mod install_time;
mod operator;
mod rollout;
mod v1_image;
mod v2_image;
mod vcluster;

use std::sync::OnceLock;

use vcp_tests::node::{Node, operator_image};

/// The product's image in the shared node's containerd (built once per test binary), and
/// its reference.
fn operator_image_in_node() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        operator_image(Node::shared()).expect("build and import the product's image")
    })
}
