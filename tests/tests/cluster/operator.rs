//! The operator as users install it: `kubectl apply -k config/default` on a real node, its pod
//! started from the product's image (built by buildah from the Dockerfile's final stage),
//! Running and Ready through its real probes, as its ServiceAccount under `config/rbac`, the
//! Lease held, `/metrics` served.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use vcp_tests::node::Node;
use vcp_tests::poll_for;

use crate::operator_image_in_node;

/// Namespace, Deployment, ServiceAccount and Lease name, as `config/manager` and `config/rbac`
/// ship them (and the operator's `DEFAULT_LEASE_NAME`).
const NAMESPACE: &str = "vcp-system";
const NAME: &str = "vcluster-plugin-operator";

/// The operator's pod once it is Running and Ready, after `kubectl apply -k config/default`
/// (applied once per test binary; later callers get the same pod).
pub async fn installed_operator() -> Pod {
    let node = Node::shared();
    let image = operator_image_in_node();
    static APPLIED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    APPLIED.get_or_init(|| {
        node.kubectl(&["apply", "-k", "config/default"])
            .expect("kubectl apply -k config/default")
    });
    let pods: Api<Pod> = Api::namespaced(node.client().await.unwrap(), NAMESPACE);
    let selector =
        "app.kubernetes.io/name=vcluster-plugin-operator,app.kubernetes.io/component=operator";
    let ready = poll_for(Duration::from_secs(180), || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                let status = p.status.as_ref();
                status.and_then(|s| s.phase.as_deref()) == Some("Running")
                    && status
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        }
    })
    .await;
    match ready {
        Some(pod) => {
            let _ = image;
            pod
        }
        None => panic!(
            "the operator's pod was not Running and Ready within 180 s after `kubectl apply -k \
             config/default`:\n{}\n{}\nkubelet:\n{}",
            node.kubectl(&["-n", NAMESPACE, "describe", "pods"])
                .unwrap_or_else(|e| e.to_string()),
            node.health_summary(),
            node.log_tail("kubelet", 30)
        ),
    }
}

#[tokio::test]
async fn config_default_runs_the_operator_from_its_image_on_the_node() {
    let node = Node::shared();
    let image = operator_image_in_node();
    assert!(
        node.images().unwrap().iter().any(|i| i == image),
        "the node's containerd does not hold {image} after the import"
    );
    let pod = installed_operator().await;
    let name = pod.metadata.name.clone().unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let status = pod.status.as_ref().unwrap();

    // Started from the product's image, on the node, as config/manager defines it.
    assert_eq!(spec.node_name.as_deref(), Some("vcp-node"));
    assert_eq!(spec.service_account_name.as_deref(), Some(NAME));
    let container = &status.container_statuses.as_ref().unwrap()[0];
    assert_eq!(container.name, "operator");
    assert_eq!(container.image, image, "the container's image");
    assert!(container.ready, "container not ready: {container:?}");
    assert_eq!(
        container.restart_count, 0,
        "the operator restarted (liveness probe or crash): {container:?}"
    );
    // The kubelet sets Ready only after the readiness probe (GET /readyz on `http`) answered.
    let probe = spec.containers[0].readiness_probe.as_ref().unwrap();
    assert_eq!(
        probe.http_get.as_ref().and_then(|h| h.path.as_deref()),
        Some("/readyz")
    );

    // The Deployment is Available: its one replica is ready (its status follows the pod's).
    let deployments: Api<Deployment> = Api::namespaced(node.client().await.unwrap(), NAMESPACE);
    let available = poll_for(Duration::from_secs(30), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get(NAME).await.ok()?;
            (d.status?.ready_replicas == Some(1)).then_some(())
        }
    })
    .await;
    assert!(
        available.is_some(),
        "Deployment {NAMESPACE}/{NAME} did not report 1 ready replica within 30 s"
    );

    // It holds the Lease: written by the pod with its ServiceAccount's token (the only
    // credentials it has), so config/rbac's leader-election Role is enough.
    let leases: Api<Lease> = Api::namespaced(node.client().await.unwrap(), NAMESPACE);
    let holder = poll_for(Duration::from_secs(60), || {
        let leases = leases.clone();
        let name = name.clone();
        async move {
            let lease = leases.get_opt(NAME).await.ok()??;
            let holder = lease.spec?.holder_identity?;
            (holder == name).then_some(holder)
        }
    })
    .await;
    assert_eq!(
        holder.as_deref(),
        Some(name.as_str()),
        "the Lease {NAMESPACE}/{NAME} is not held by the pod {name}"
    );

    // /metrics on port 8080, through the API server's pod proxy (the pod's own IP on the
    // node's CNI bridge): the leader gauge turns 1 once the replica has confirmed its hold
    // (leader.rs: a read of the Lease after kube-lease-manager took it), and the controller's
    // cache gauge is there.
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{name}:8080/proxy/metrics");
    let mut metrics = String::new();
    let leading = poll_for(Duration::from_secs(60), || {
        metrics = node.kubectl(&["get", "--raw", &path]).unwrap_or_default();
        let done = metrics.lines().any(|l| l == "vcp_leader 1")
            && metrics.contains("vcp_operator_cached_objects");
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        leading.is_some(),
        "within 60 s, the operator's /metrics did not show `vcp_leader 1` and its cache \
         gauge:\n{metrics}\nits log:\n{}",
        node.kubectl(&["-n", NAMESPACE, "logs", &name, "--tail", "40"])
            .unwrap_or_else(|e| e.to_string())
    );

    // The shipped admission policies are in force beside it.
    let policies = node
        .kubectl(&["get", "validatingadmissionpolicybindings", "-o", "name"])
        .unwrap();
    let shipped: Vec<String> = std::fs::read_dir(vcp_tests::repo_root().join("config/admission"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|text| {
            text.split("\n---")
                .filter(|doc| doc.contains("kind: ValidatingAdmissionPolicyBinding"))
                .filter_map(|doc| {
                    doc.lines()
                        .skip_while(|l| !l.starts_with("metadata:"))
                        .find_map(|l| l.trim().strip_prefix("name: "))
                        .map(str::to_string)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // the loop below checks each: every binding document of config/admission gave its name
    let documents: usize = std::fs::read_dir(vcp_tests::repo_root().join("config/admission"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|text| {
            text.matches("kind: ValidatingAdmissionPolicyBinding")
                .count()
        })
        .sum();
    assert!(
        documents > 0 && shipped.len() == documents,
        "{documents} ValidatingAdmissionPolicyBinding documents in config/admission, names read: \
         {shipped:?}"
    );
    for expected in &shipped {
        assert!(
            policies
                .lines()
                .any(|l| l.ends_with(&format!("/{expected}"))),
            "binding {expected} of config/admission is not installed: {policies}"
        );
    }
}
