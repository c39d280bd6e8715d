//! The outside attack's High 2 on the real node: a tenant with the built-in `edit` role in its
//! namespace (an impersonated user bound to the ClusterRole `edit`, nothing else) creates
//! [`BIG`] StatefulSets labelled `app=vcluster` (the label the operator's workload caches
//! select on) with `replicas: 0` and a pod template of 1 MB (one large `env` value). Before the
//! fix the operator, deployed by `config/default` with its 256 Mi limit, cached each in full
//! and was OOM-killed at about 255 of them, then again at every start while it listed them;
//! every other tenant's plugins stalled.
//!
//! Now, with the operator's pod from its image:
//! - its StatefulSet cache holds them all (`vcp_operator_cached_objects`, read through the API
//!   server's pod proxy: it looked);
//! - the pod is the same, with no new container restart, and the peak memory of its cgroup
//!   stays within its limit;
//! - another tenant's plugin becomes `Ready` during the flood;
//! - the operator's pod deleted, its replacement lists them all, becomes Ready within its
//!   limit, and another plugin of the other tenant becomes `Ready`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::node::Node;
use vcp_tests::{poll_for, wait_ready};

use crate::operator::installed_operator;
use crate::vcluster::scenario_lock;

/// The attacker's namespace and user (bound to the ClusterRole `edit` there, impersonated).
const ATTACKER: &str = "attack-workloads";
const ATTACKER_USER: &str = "attacker-edit";
/// The other tenant's namespace, with a vCluster-shaped StatefulSet of no replicas.
const OTHER: &str = "attack-workloads-other";
const VC: &str = "my-vcluster";
/// StatefulSets of the attack: above the ~255 that OOM-killed the operator before.
const BIG: usize = 300;
/// Bytes of the one `env` value of each one's pod template.
const TEMPLATE_BYTES: usize = 1_000_000;
/// The operator's memory limit in `config/manager/manager.yaml`.
const LIMIT_BYTES: u64 = 256 << 20;
/// The bound on the peak memory of the operator's pod: three quarters of its limit (64 MiB
/// left before an OOM kill).
const MAX_PEAK_BYTES: u64 = LIMIT_BYTES / 4 * 3;
const OPERATOR_NAMESPACE: &str = "vcp-system";
const TIMEOUT: Duration = Duration::from_secs(300);

/// A client of the node's API server as `user` (impersonated by the node's admin).
async fn as_user(node: &Node, user: &str) -> Client {
    let mut config = vcp_tests::config_from(&node.kubeconfig())
        .await
        .expect("the node's kubeconfig");
    config.auth_info.impersonate = Some(user.to_string());
    Client::try_from(config).expect("client")
}

/// A StatefulSet labelled like a vCluster, with no replicas and [`TEMPLATE_BYTES`] of pod
/// template; not a vCluster (no `syncer` container).
fn big(i: usize, value: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": format!("big-{i}"), "labels": { "app": "vcluster" } },
        "spec": {
            "replicas": 0,
            "serviceName": format!("big-{i}"),
            "selector": { "matchLabels": { "app": "vcluster", "big": i.to_string() } },
            "template": {
                "metadata": { "labels": { "app": "vcluster", "big": i.to_string() } },
                "spec": { "containers": [{
                    "name": "main", "image": "localhost/vcp/busybox:1.35",
                    "env": [{ "name": "FILLER", "value": value }],
                }] },
            },
        },
    }))
    .expect("StatefulSet")
}

/// The other tenant's vCluster: a StatefulSet with what the operator requires of one (the
/// chart's labels on it and its pod template, a `syncer` container, a service account), no
/// replicas (nothing starts on the node).
fn other_vcluster() -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": VC, "labels": { "app": "vcluster", "release": VC } },
        "spec": {
            "replicas": 0,
            "serviceName": VC,
            "selector": { "matchLabels": { "app": "vcluster", "release": VC } },
            "template": {
                "metadata": { "labels": { "app": "vcluster", "release": VC } },
                "spec": {
                    "serviceAccountName": format!("vc-{VC}"),
                    "containers": [{ "name": "syncer", "image": "localhost/vcp/busybox:1.35" }],
                },
            },
        },
    }))
    .expect("StatefulSet")
}

/// The operator's pod's container `operator`: its restart count and the reason of its last
/// termination, if any.
fn restarts(pod: &Pod) -> (i32, Option<String>) {
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "operator"))
        .expect("the operator's container status");
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.reason.clone());
    (status.restart_count, last)
}

/// The pod's cgroup folder of the memory controller on the node (`pod<uid>` under the kubelet's
/// `kubepods`: cgroup v1's `memory/kubepods/<qos>/pod<uid>` or v2's
/// `kubepods/<qos>/pod<uid>`).
fn memory_cgroup(uid: &str) -> Option<PathBuf> {
    fn find(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !entry.file_type().ok()?.is_dir() {
                continue;
            }
            if entry.file_name().to_string_lossy() == name
                && (path.join("memory.max_usage_in_bytes").exists()
                    || path.join("memory.peak").exists())
            {
                return Some(path);
            }
            if depth > 0
                && let Some(found) = find(&path, name, depth - 1)
            {
                return Some(found);
            }
        }
        None
    }
    find(Path::new("/sys/fs/cgroup"), &format!("pod{uid}"), 4)
}

/// The memory of the operator's pod `uid` (its containers run as processes of this machine,
/// in the kubelet's cgroups):
/// - the peak of its cgroup since it started, in bytes (cgroup v1's
///   `memory.max_usage_in_bytes`, v2's `memory.peak`): what the limit is enforced on;
/// - the peak resident set (`VmHWM`) of the operator's process in it, in bytes.
fn pod_memory(uid: &str) -> (u64, u64) {
    fn pids(dir: &Path, out: &mut Vec<u32>) {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pids(&entry.path(), out);
            }
        }
    }
    let dir = memory_cgroup(uid).unwrap_or_else(|| panic!("no memory cgroup of pod {uid}"));
    let cgroup = ["memory.max_usage_in_bytes", "memory.peak"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak memory in {}", dir.display()));
    let mut all = Vec::new();
    pids(&dir, &mut all);
    let process = all
        .iter()
        .find_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            // `comm` holds the first 15 bytes of the executable's name
            if !"vcluster-plugin-operator".starts_with(comm.trim()) {
                return None;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()?;
            Some(kib * 1024)
        })
        .unwrap_or_else(|| panic!("no operator process in {} ({all:?})", dir.display()));
    (cgroup, process)
}

/// `vcp_operator_cached_objects{kind="StatefulSet"}` of the operator's pod `pod`, through the
/// API server's pod proxy.
async fn cached_statefulsets(admin: &Client, pod: &str) -> Option<f64> {
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{pod}:8080/proxy/metrics"
    ))
    .body(Vec::new())
    .ok()?;
    let body = admin.request_text(request).await.ok()?;
    vcp_tests::metric(&body, "vcp_operator_cached_objects{kind=\"StatefulSet\"}")
}

/// Waits until the operator's pod `pod` caches at least `n` StatefulSets; `None` when it did
/// not within [`TIMEOUT`].
async fn caches_at_least(admin: &Client, pod: &str, n: usize) -> Option<f64> {
    poll_for(TIMEOUT, || async move {
        cached_statefulsets(admin, pod)
            .await
            .filter(|c| *c as usize >= n)
    })
    .await
}

/// Creates the other tenant's plugin `name` (as the node's admin) and waits until it is
/// `Ready`; returns how long that took.
async fn other_plugin_ready(admin: &Client, name: &str) -> Duration {
    let started = Instant::now();
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": name, "namespace": OTHER },
        "spec": { "vcluster": { "name": VC } },
    }))
    .expect("plugin");
    Api::<VClusterPlugin>::namespaced(admin.clone(), OTHER)
        .create(&PostParams::default(), &plugin)
        .await
        .unwrap_or_else(|e| panic!("create the other tenant's plugin {name}: {e}"));
    wait_ready(admin, OTHER, name, "True", None, TIMEOUT).await;
    started.elapsed()
}

/// The operator's pod once it is Running and Ready and not `old` (its uid).
async fn replaced_operator(admin: &Client, old: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    poll_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                p.metadata.uid.as_deref() != Some(old)
                    && p.metadata.deletion_timestamp.is_none()
                    && crate::vcluster::pod_ready(p)
            })
        }
    })
    .await
    .expect("a new operator pod Ready after the old one was deleted")
}

#[tokio::test]
async fn a_tenant_with_edit_cannot_take_the_operator_down_with_big_workloads() {
    let _scenario = scenario_lock().lock().await;
    let node = Node::shared();
    let pod = installed_operator().await;
    let admin = node.client().await.unwrap();
    for ns in [ATTACKER, OTHER] {
        vcp_tests::create_namespace(&admin, ns).await;
    }
    vcp_tests::apply_yaml(
        &admin,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata: {{ name: {ATTACKER_USER}, namespace: {ATTACKER} }}\n\
             roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit }}\n\
             subjects: [{{ apiGroup: rbac.authorization.k8s.io, kind: User, name: {ATTACKER_USER} }}]\n"
        ),
        None,
    )
    .await
    .expect("bind edit to the attacker");
    let attacker = as_user(node, ATTACKER_USER).await;
    vcp_tests::apply_yaml(
        &admin,
        &format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{ name: vc-{VC}, namespace: {OTHER} }}\n"),
        None,
    )
    .await
    .expect("the other vCluster's service account");
    Api::<StatefulSet>::namespaced(admin.clone(), OTHER)
        .create(&PostParams::default(), &other_vcluster())
        .await
        .expect("the other tenant's vCluster");
    other_plugin_ready(&admin, "before").await;

    let pod_name = pod.name_any();
    let uid = pod.metadata.uid.clone().expect("uid");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), OPERATOR_NAMESPACE);
    let (restarts_before, _) = restarts(&pods.get(&pod_name).await.expect("the operator's pod"));
    let cached_before = caches_at_least(&admin, &pod_name, 1)
        .await
        .expect("the operator caches the other tenant's vCluster");

    // The flood, as the tenant with `edit`, and the other tenant's plugin meanwhile.
    let api = Api::<StatefulSet>::namespaced(attacker.clone(), ATTACKER);
    let value = "x".repeat(TEMPLATE_BYTES);
    let started = Instant::now();
    let flood = stream::iter(0..BIG)
        .map(|i| {
            let (api, sts) = (api.clone(), big(i, &value));
            async move { api.create(&PostParams::default(), &sts).await.map(|_| ()) }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>();
    let (created, during) = tokio::join!(flood, other_plugin_ready(&admin, "during"));
    created.unwrap_or_else(|e| panic!("the tenant with edit creates its StatefulSets: {e}"));
    let flooded = started.elapsed();
    let cached_after = caches_at_least(&admin, &pod_name, BIG + 1).await;
    // `None`: the pod is gone (evicted, or replaced by its Deployment)
    let after_flood = pods
        .get_opt(&pod_name)
        .await
        .expect("read the operator's pod")
        .map(|p| restarts(&p));
    let (cgroup_flood, process_flood) = match after_flood {
        Some(_) => pod_memory(&uid),
        None => (0, 0),
    };
    let mib = |b: u64| b as f64 / 1_048_576.0;
    eprintln!(
        "attack (workload cache): {BIG} StatefulSets of {TEMPLATE_BYTES} bytes created by a tenant with edit in \
         {:.1} s; cached StatefulSets {cached_before} before, {cached_after:?} after; operator pod {pod_name}: \
         restarts {restarts_before} -> {after_flood:?} (count, last termination; None: the pod is gone), peak memory \
         of its cgroup {:.1} MiB, of its process {:.1} MiB (limit {:.0} MiB); the other tenant's plugin Ready \
         {:.1} s into the flood",
        flooded.as_secs_f64(),
        mib(cgroup_flood),
        mib(process_flood),
        mib(LIMIT_BYTES),
        during.as_secs_f64(),
    );
    assert_eq!(
        after_flood,
        Some((restarts_before, None)),
        "the operator's container restarted (or its pod went) during the flood"
    );
    assert!(
        cached_after.is_some(),
        "the operator's pod did not cache the {BIG} StatefulSets"
    );
    for (what, peak) in [("cgroup", cgroup_flood), ("process", process_flood)] {
        assert!(
            peak < MAX_PEAK_BYTES,
            "the operator pod's {what} peaked at {:.1} MiB during the flood, above {:.0} MiB of its {:.0} MiB",
            mib(peak),
            mib(MAX_PEAK_BYTES),
            mib(LIMIT_BYTES)
        );
    }

    // A start that lists them all: the pod deleted, its replacement from the Deployment.
    pods.delete(&pod_name, &DeleteParams::default())
        .await
        .expect("delete the operator's pod");
    let replacement = replaced_operator(&admin, &uid).await;
    let new_uid = replacement.metadata.uid.clone().expect("uid");
    let after_restart = other_plugin_ready(&admin, "after").await;
    let cached_restarted = caches_at_least(&admin, &replacement.name_any(), BIG + 1).await;
    let replacement = pods
        .get(&replacement.name_any())
        .await
        .expect("the new operator pod");
    let (restarts_new, last_new) = restarts(&replacement);
    let (cgroup_restart, process_restart) = pod_memory(&new_uid);
    eprintln!(
        "attack (workload cache): replacement pod: {cached_restarted:?} cached, restarts {restarts_new} \
         ({last_new:?}), peak memory of its cgroup {:.1} MiB, of its process {:.1} MiB; the other tenant's \
         plugin Ready {:.1} s after it",
        mib(cgroup_restart),
        mib(process_restart),
        after_restart.as_secs_f64(),
    );

    for ns in [ATTACKER, OTHER] {
        let _ = node.kubectl(&["delete", "namespace", ns, "--wait=false"]);
    }
    assert_eq!(
        (restarts_new, last_new),
        (0, None),
        "the new operator pod restarted while it listed the StatefulSets"
    );
    assert!(
        cached_restarted.is_some(),
        "the new operator pod did not cache the {BIG} StatefulSets"
    );
    for (what, peak) in [("cgroup", cgroup_restart), ("process", process_restart)] {
        assert!(
            peak < MAX_PEAK_BYTES,
            "the new operator pod's {what} peaked at {:.1} MiB, above {:.0} MiB of its {:.0} MiB",
            mib(peak),
            mib(MAX_PEAK_BYTES),
            mib(LIMIT_BYTES)
        );
    }
}
