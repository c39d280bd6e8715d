//! The operator's watch caches follow the vClusters and the plugins, not the cluster, end to
//! end on the local control plane with the operator in-process under the
//! `vcp-operator` identity:
//! - with 40 StatefulSets, 40 Deployments, 80 Roles and 80 RoleBindings that belong to no
//!   vCluster and no plugin (no `app=vcluster` label) in other namespaces, created before the
//!   operator starts, `vcp_operator_cached_objects{kind}` counts only the vCluster workloads
//!   (one StatefulSet, one Deployment: the fixtures) and the plugins' own Roles and
//!   RoleBindings (one each per installed plugin);
//! - every cluster-wide list and watch the operator sends for those kinds carries a label
//!   selector (the API server's audit log, `requestURI`);
//! - a plugin aimed at a StatefulSet without the chart's `app` label is still refused with
//!   `NotAVCluster` (not `VClusterNotFound`); the workload gaining the label triggers the
//!   plugin (installed, `Ready=True`), losing it triggers it again (`NotAVCluster`), each
//!   within a time far below the operator's resync (600 s).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use vcp_tests::{Cluster, ControlPlane, Identity, create_plugin, poll_for, wait_ready};

const TIMEOUT: Duration = Duration::from_secs(60);
const VC: &str = "my-vcluster";
const UNRELATED_NAMESPACES: usize = 4;
const PER_NAMESPACE_WORKLOADS: usize = 10;
const PER_NAMESPACE_RBAC: usize = 20;

fn car_spec() -> serde_json::Value {
    json!({
        "vcluster": { "name": VC },
        "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }],
    })
}

/// A minimal pod template (no controller runs: nothing starts).
fn template(app: &str) -> serde_json::Value {
    json!({
        "metadata": { "labels": { "app": app } },
        "spec": { "containers": [{ "name": "main", "image": "busybox" }] },
    })
}

/// Objects of no vCluster and no plugin, in `UNRELATED_NAMESPACES` namespaces, created 16 at
/// a time.
async fn create_unrelated(admin: &Client) {
    let mut creates = Vec::new();
    for n in 0..UNRELATED_NAMESPACES {
        let ns = format!("unrelated-{n}");
        vcp_tests::create_namespace(admin, &ns).await;
        for i in 0..PER_NAMESPACE_WORKLOADS {
            let name = format!("app-{i}");
            let sts: StatefulSet = serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "app": "postgres" } },
                "spec": {
                    "serviceName": name,
                    "selector": { "matchLabels": { "app": "postgres" } },
                    "template": template("postgres"),
                },
            }))
            .expect("StatefulSet");
            let deploy: Deployment = serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "app": "web" } },
                "spec": {
                    "selector": { "matchLabels": { "app": "web" } },
                    "template": template("web"),
                },
            }))
            .expect("Deployment");
            let (a, b) = (admin.clone(), ns.clone());
            creates.push(tokio::spawn(async move {
                Api::<StatefulSet>::namespaced(a, &b)
                    .create(&PostParams::default(), &sts)
                    .await
                    .map(|_| ())
            }));
            let (a, b) = (admin.clone(), ns.clone());
            creates.push(tokio::spawn(async move {
                Api::<Deployment>::namespaced(a, &b)
                    .create(&PostParams::default(), &deploy)
                    .await
                    .map(|_| ())
            }));
        }
        for i in 0..PER_NAMESPACE_RBAC {
            let name = format!("reader-{i}");
            let role: Role = serde_json::from_value(json!({
                "metadata": { "name": name },
                "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
            }))
            .expect("Role");
            let binding: RoleBinding = serde_json::from_value(json!({
                "metadata": { "name": name },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": ns }],
            }))
            .expect("RoleBinding");
            let (a, b) = (admin.clone(), ns.clone());
            creates.push(tokio::spawn(async move {
                Api::<Role>::namespaced(a, &b)
                    .create(&PostParams::default(), &role)
                    .await
                    .map(|_| ())
            }));
            let (a, b) = (admin.clone(), ns.clone());
            creates.push(tokio::spawn(async move {
                Api::<RoleBinding>::namespaced(a, &b)
                    .create(&PostParams::default(), &binding)
                    .await
                    .map(|_| ())
            }));
        }
    }
    let results: Vec<_> = futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        r.expect("task").expect("create an unrelated object");
    }
}

/// The value of `vcp_operator_cached_objects{kind="<kind>"}` in the operator's metrics text.
fn cached(kind: &str) -> Option<i64> {
    let line = format!("vcp_operator_cached_objects{{kind=\"{kind}\"}} ");
    vcp_tests::operator_telemetry()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&line)?.trim().parse().ok())
}

/// The cached counts of the kinds of `expected` once they equal it, or as they are after 10 s
/// (the caches see the operator's own writes through their watches, a moment after them).
async fn counts(expected: &[(&'static str, i64)]) -> Vec<(&'static str, i64)> {
    poll_for(Duration::from_secs(10), || async {
        expected
            .iter()
            .all(|(kind, n)| cached(kind) == Some(*n))
            .then_some(())
    })
    .await;
    expected
        .iter()
        .map(|(kind, _)| (*kind, cached(kind).unwrap_or(-1)))
        .collect()
}

/// The vCluster's chart-rendered objects in `ns` (vCluster v0.30.0, [`vcp_tests::vcluster_workload_with`]).
async fn vcluster(admin: &Client, ns: &str, values: &str) {
    vcp_tests::create_namespace(admin, ns).await;
    vcp_tests::apply_yaml(
        admin,
        &vcp_tests::vcluster_workload_with(ns, values),
        Some(ns),
    )
    .await
    .expect("create the vCluster");
}

#[tokio::test]
async fn caches_hold_only_vclusters_and_the_plugins_own_objects() {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&admin).await;
    create_unrelated(&admin).await;
    // Two vClusters, as the chart renders them: a StatefulSet and a Deployment.
    vcluster(&admin, "scope-sts", "").await;
    vcluster(
        &admin,
        "scope-deploy",
        "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: false\n",
    )
    .await;
    // A StatefulSet named like a vCluster, as the chart renders it but without `app: vcluster`.
    let fake = "scope-fake";
    vcp_tests::create_namespace(&admin, fake).await;
    let rendered = vcp_tests::vcluster_workload(fake);
    for doc in rendered.split("---\n") {
        let mut value: serde_yaml::Value = serde_yaml::from_str(doc).expect("yaml");
        if value["kind"] == "StatefulSet" {
            let labels = value["metadata"]["labels"]
                .as_mapping_mut()
                .expect("the chart labels its StatefulSet");
            assert_eq!(
                labels.remove("app"),
                Some(serde_yaml::Value::from("vcluster"))
            );
        }
        let doc = serde_yaml::to_string(&value).expect("yaml");
        vcp_tests::apply_yaml(&admin, &doc, Some(fake))
            .await
            .expect("create the unlabelled StatefulSet");
    }

    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:scope").await;
    for ns in ["scope-sts", "scope-deploy", fake] {
        create_plugin(&admin, ns, "car", car_spec()).await;
    }
    wait_ready(&admin, "scope-sts", "car", "True", None, TIMEOUT).await;
    wait_ready(&admin, "scope-deploy", "car", "True", None, TIMEOUT).await;
    wait_ready(&admin, fake, "car", "False", Some("NotAVCluster"), TIMEOUT).await;

    // From the fixtures: 2 vCluster workloads (one of each kind); the 2 installed plugins'
    // dedicated Role and RoleBinding each; nothing of the refused plugin, of the unlabelled
    // StatefulSet or of the unrelated objects.
    let expected = [
        ("StatefulSet", 1),
        ("Deployment", 1),
        ("Role", 2),
        ("RoleBinding", 2),
    ];
    assert_eq!(counts(&expected).await, expected.to_vec());

    // Every cluster-wide list and watch of these kinds carried a label selector, and the
    // operator did list and watch each of them (the log shows it looked).
    let reads =
        vcp_tests::audited_reads(cp, Cluster::Host, Identity::Operator.user()).expect("audit log");
    for resource in [
        "/apis/apps/v1/statefulsets",
        "/apis/apps/v1/deployments",
        "/apis/rbac.authorization.k8s.io/v1/roles",
        "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    ] {
        let of: Vec<&(String, String)> = reads
            .iter()
            .filter(|(_, uri)| uri.split('?').next() == Some(resource))
            .collect();
        for verb in ["list", "watch"] {
            assert!(
                of.iter().any(|(v, _)| v == verb),
                "no {verb} of {resource} in {reads:#?}"
            );
        }
        for (verb, uri) in &of {
            assert!(
                uri.contains("labelSelector="),
                "{verb} {uri} has no label selector"
            );
        }
    }

    // The unlabelled StatefulSet gains the chart's label: it enters the watch, and its plugin
    // is installed; it loses the label: it leaves the watch, and the plugin is refused again.
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), fake);
    sts.patch(
        VC,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "app": "vcluster" } } })),
    )
    .await
    .expect("label the StatefulSet");
    wait_ready(&admin, fake, "car", "True", None, Duration::from_secs(30)).await;
    let grown = [
        ("StatefulSet", 2),
        ("Deployment", 1),
        ("Role", 3),
        ("RoleBinding", 3),
    ];
    assert_eq!(counts(&grown).await, grown.to_vec());
    sts.patch(
        VC,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "app": null } } })),
    )
    .await
    .expect("unlabel the StatefulSet");
    wait_ready(
        &admin,
        fake,
        "car",
        "False",
        Some("NotAVCluster"),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(counts(&expected).await, expected.to_vec());
}
