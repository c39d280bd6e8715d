//! A plugin asking for more than its namespace or the nodes allow is refused before the
//! install, with the workload untouched (`operator/src/judge/resources.rs`).
//!
//! The outside attack: a plugin asking for 100Ti of memory was installed; the vCluster's
//! new pod could not be scheduled, and another author's plugin went down with it, while the
//! plugin said `Ready`. The operator's dry runs did not see it: a StatefulSet's dry run creates
//! no pod, and the pod dry run answers a LimitRange's or quota's 403, which judges nothing. On
//! a real API server, with the operator in-process under its ClusterRole
//! (`config/rbac/role.yaml`, which now lets it list LimitRanges, ResourceQuotas and Nodes):
//! - a node that can hold 4 CPUs and 8Gi is registered; beside another author's plugin, the
//!   100Ti plugin gets `Ready=False, reason=ResourcesExceeded` naming the node, the
//!   StatefulSet keeps its generation over a reconcile that looked at the plugin again, and the
//!   other plugin stays `Ready`;
//! - under a LimitRange of 128Mi per container, an embedded plugin (its runtime's default
//!   limit is 256Mi) is refused naming the LimitRange, and one asking for 128Mi is installed;
//! - under a ResourceQuota of 64Mi of `requests.memory` that also tracks `limits.memory`, the
//!   runtime's 96Mi request is refused, an image plugin setting no memory limit is refused
//!   (every container must set what a quota tracks), and one asking for 32Mi is installed.
//!
//! One test, so this binary's control plane (and its one registered node) is its own.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use vcp_tests::plugins::{poke_plugin, poll_ready, start_shared_operator};

const RUNTIME: &str = "vcp-test/runtime:e2e";
const TIMEOUT: Duration = Duration::from_secs(60);
const NODE_NS: &str = "res-node";
const LIMITS_NS: &str = "res-limits";
const QUOTA_NS: &str = "res-quota";

/// A v1 image plugin asking for `resources`.
fn image(name: &str, resources: serde_json::Value) -> serde_json::Value {
    json!({"vcluster": {"name": "my-vcluster"}, "image": format!("example.com/{name}:1"),
           "version": "v1", "resources": resources})
}

/// An embedded-runtime plugin asking for `resources` (none: the runtime's defaults).
fn embedded(resources: Option<serde_json::Value>) -> serde_json::Value {
    let mut spec = json!({"vcluster": {"name": "my-vcluster"}});
    if let Some(r) = resources {
        spec["resources"] = r;
    }
    spec
}

/// The StatefulSet's generation and container names.
async fn workload(admin: &kube::Client, ns: &str) -> (i64, Vec<String>) {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .expect("the vCluster's StatefulSet");
    let names = sts
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default();
    (sts.metadata.generation.unwrap_or_default(), names)
}

/// Waits for `Ready=False, ResourcesExceeded` on `ns/name` and returns its message.
async fn refused(admin: &kube::Client, ns: &str, name: &str) -> String {
    let p = poll_ready(admin, ns, name, "False", Some("ResourcesExceeded"), TIMEOUT)
        .await
        .unwrap_or_else(|| panic!("{ns}/{name}: Ready=False ResourcesExceeded within {TIMEOUT:?}"));
    let message = vcp_tests::condition(&p, "Ready").unwrap().message.clone();
    println!("{ns}/{name}: {message}");
    message
}

async fn installed(admin: &kube::Client, ns: &str, name: &str) {
    poll_ready(admin, ns, name, "True", Some("Installed"), TIMEOUT)
        .await
        .unwrap_or_else(|| panic!("{ns}/{name}: Ready=True within {TIMEOUT:?}"));
    assert!(workload(admin, ns).await.1.contains(&name.to_string()));
}

#[tokio::test]
async fn resources_beyond_the_namespace_or_the_nodes_are_refused_before_the_install() {
    let admin = start_shared_operator(RUNTIME).await;
    for ns in [NODE_NS, LIMITS_NS, QUOTA_NS] {
        vcp_tests::create_namespace(&admin, ns).await;
        vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(ns), Some(ns))
            .await
            .expect("the vCluster as its chart renders it");
    }
    // A node that can hold 4 CPUs and 8Gi (its status as a kubelet reports it).
    let nodes = Api::<Node>::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "vcp-res-node"}}))
            .unwrap(),
        )
        .await
        .expect("register the node");
    let capacity = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
    nodes
        .patch_status(
            "vcp-res-node",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": capacity, "allocatable": capacity}})),
        )
        .await
        .expect("the node's allocatable");

    // Another author's plugin, then the 100Ti one.
    vcp_tests::create_plugin(&admin, NODE_NS, "other", image("other", json!({}))).await;
    installed(&admin, NODE_NS, "other").await;
    let before = workload(&admin, NODE_NS).await;
    vcp_tests::create_plugin(
        &admin,
        NODE_NS,
        "big",
        image("big", json!({"requests": {"memory": "100Ti"}})),
    )
    .await;
    let message = refused(&admin, NODE_NS, "big").await;
    assert!(
        message.contains("no node can hold the vCluster's pod")
            && message.contains("node vcp-res-node with cpu 4, memory 8Gi"),
        "{message}"
    );
    // The operator looks at it again: nothing is written to the workload.
    poke_plugin(&admin, NODE_NS, "big", TIMEOUT).await;
    assert_eq!(
        workload(&admin, NODE_NS).await,
        before,
        "the StatefulSet is untouched"
    );
    installed(&admin, NODE_NS, "other").await;

    // A LimitRange of 128Mi per container.
    vcp_tests::apply_yaml(
        &admin,
        r#"
apiVersion: v1
kind: LimitRange
metadata: { name: small-containers }
spec:
  limits:
    - type: Container
      max: { memory: 128Mi }
"#,
        Some(LIMITS_NS),
    )
    .await
    .expect("the LimitRange");
    vcp_tests::create_plugin(&admin, LIMITS_NS, "runtime-default", embedded(None)).await;
    let message = refused(&admin, LIMITS_NS, "runtime-default").await;
    assert!(
        message.contains(
            "LimitRange small-containers allows at most 128Mi of memory per container, and container runtime-default asks for a memory limit of 256Mi"
        ),
        "{message}"
    );
    vcp_tests::create_plugin(
        &admin,
        LIMITS_NS,
        "runtime-small",
        embedded(Some(json!({"limits": {"memory": "128Mi"}}))),
    )
    .await;
    installed(&admin, LIMITS_NS, "runtime-small").await;
    assert!(
        !workload(&admin, LIMITS_NS)
            .await
            .1
            .contains(&"runtime-default".to_string())
    );

    // A ResourceQuota of 64Mi of memory requests, tracking memory limits too.
    vcp_tests::apply_yaml(
        &admin,
        r#"
apiVersion: v1
kind: ResourceQuota
metadata: { name: compute }
spec:
  hard: { requests.memory: 64Mi, limits.memory: 8Gi }
"#,
        Some(QUOTA_NS),
    )
    .await
    .expect("the ResourceQuota");
    vcp_tests::create_plugin(&admin, QUOTA_NS, "runtime-q", embedded(None)).await;
    let message = refused(&admin, QUOTA_NS, "runtime-q").await;
    assert!(
        message.contains("ResourceQuota compute allows 64Mi of requests.memory in the namespace")
            && message.contains("would ask for"),
        "{message}"
    );
    vcp_tests::create_plugin(
        &admin,
        QUOTA_NS,
        "bare-q",
        image("bare-q", json!({"requests": {"memory": "16Mi"}})),
    )
    .await;
    let message = refused(&admin, QUOTA_NS, "bare-q").await;
    assert!(
        message.contains(
            "ResourceQuota compute tracks limits.memory, so every container must set it, and container bare-q does not"
        ),
        "{message}"
    );
    vcp_tests::create_plugin(
        &admin,
        QUOTA_NS,
        "fits-q",
        image(
            "fits-q",
            json!({"requests": {"memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
        ),
    )
    .await;
    installed(&admin, QUOTA_NS, "fits-q").await;
}
