//! Any pod against the HTTP ports of the operator and of a runtime sidecar, on the real node:
//! the attacks of a pod that can reach `vcp-system` or a vCluster pod's IP (this node has no
//! NetworkPolicy enforcement, as many clusters have none: the servers' own bounds must hold).
//!
//! A hostile client (`tests/examples/http_flood.rs`) runs in pods of a tenant namespace of its
//! own, from an image built here:
//! 1. **The operator's `:8080`:** 650 connections at a time, each sending 400 KB of a request
//!    head that never ends, in rounds, beside 20,000 connections that send nothing. Before the
//!    server was bounded, the first got the operator OOM-killed within a second and the second
//!    took its open files and its probes. Meanwhile a tenant's plugin is installed and must
//!    become Ready; after it, the operator has not restarted, its peak resident set stayed far
//!    under its limit, and its server counted what it refused.
//! 2. **A runtime sidecar's `:9460`:** unfinished 400 KB heads and pipelined `GET /metrics`
//!    from 50 connections. Meanwhile the plugin's hook goes on working (a virtual pod reaches the
//!    node labelled by it) and the sidecar's `/healthz` answers; after it, the sidecar has not
//!    restarted and its peak resident set stayed within its memory limit.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vcp_tests::node::Node;
use vcp_tests::poll_for;
use vcp_tests::process::{metric, workspace_example};

use crate::operator::installed_operator;
use crate::operator_image_in_node;
use crate::v2_image::{label, running_host_pod, team_a_ready};
use crate::vcluster::{assert_plugin_ready, installed_vcluster, log_tail, scenario_lock};

/// The vCluster attacked through its runtime sidecar, and the tenant whose plugin must become
/// Ready while the operator is flooded.
const NAMESPACE: &str = "vc-attack";
const RELEASE: &str = "my-vcluster";
/// The host namespace of the attacker's pods: any tenant's.
const ATTACKER: &str = "attacker";
/// The plugin installed during the flood: the embedded runtime as a sidecar with a pod hook.
const PLUGIN: &str = "hook-under-fire";
/// The flood image's reference.
const IMAGE: &str = "localhost/vcp/http-flood:test";
/// The base the flood binary runs on (glibc), made by [`operator_image_in_node`].
const BASE: &str = "gcr.io/distroless/cc-debian12:nonroot";
/// The operator's memory limit (`config/manager/manager.yaml`).
const OPERATOR_LIMIT: u64 = 256 * 1024 * 1024;

/// Builds the flood image in the node's buildah storage and imports it, once.
fn flood_image(node: &Node) {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        operator_image_in_node();
        let binary = workspace_example("vcp-tests", "http_flood");
        node.build_binary_image(
            BASE,
            &binary.to_string_lossy(),
            "/flood",
            Some(r#"["/flood"]"#),
            IMAGE,
        )
        .expect("build and import the flood image");
    });
}

/// Starts the flood pod `ATTACKER/name` with `args` (`http_flood`'s).
fn start_flood(node: &Node, name: &str, args: &[&str]) {
    let args = args
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ATTACKER}}}\nspec:\n  \
         restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: flood\n    \
         image: {IMAGE}\n    imagePullPolicy: Never\n    args: [{args}]\n    resources:\n      \
         limits: {{memory: 1Gi}}\n"
    );
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "start flood {name}: {applied:?}");
}

/// Waits for the flood pod `name` to finish (it stops by itself) and returns its `FLOOD` line.
async fn flood_result(node: &Node, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(node.client().await.unwrap(), ATTACKER);
    let finished = poll_for(Duration::from_secs(180), || {
        let pods = pods.clone();
        async move {
            let p = pods.get_opt(name).await.ok()??;
            let phase = p.status?.phase?;
            (phase == "Succeeded" || phase == "Failed").then_some(phase)
        }
    })
    .await;
    let log = node
        .kubectl(&["-n", ATTACKER, "logs", name])
        .unwrap_or_else(|e| e.to_string());
    assert_eq!(
        finished.as_deref(),
        Some("Succeeded"),
        "flood pod {name} did not succeed: {log}\n{}",
        node.kubectl(&["-n", ATTACKER, "describe", "pod", name])
            .unwrap_or_default()
    );
    let line = log
        .lines()
        .find(|l| l.starts_with("FLOOD "))
        .unwrap_or_else(|| panic!("no FLOOD line from {name}: {log}"))
        .to_string();
    eprintln!("attack_http: {name}: {line}");
    line
}

/// The number after `key=` in a `FLOOD` line.
fn tally(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// The host PID of the process of pod `pod_uid` whose command starts with `binary` (its cgroup
/// path names the pod's uid, with dashes or underscores as the cgroup driver writes it).
fn container_pid(pod_uid: &str, binary: &str) -> u32 {
    let underscored = pod_uid.replace('-', "_");
    let found = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (cgroup.contains(pod_uid) || cgroup.contains(&underscored))
                && cmdline.starts_with(binary.as_bytes())
        });
    found.unwrap_or_else(|| panic!("no process {binary} of pod {pod_uid} on the node"))
}

/// Resets the peak resident set of `pid` (`/proc/<pid>/clear_refs`, "5").
fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("reset the peak resident set of {pid}: {e}"));
}

/// The peak resident set of `pid` in bytes since [`reset_peak`] (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e} (the process restarted?)"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// Restarts of container `container` of pod `namespace/pod`.
async fn restarts(node: &Node, namespace: &str, pod: &str, container: &str) -> i32 {
    let pods: Api<Pod> = Api::namespaced(node.client().await.unwrap(), namespace);
    let pod = pods.get(pod).await.unwrap();
    pod.status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == container)
        .unwrap_or_else(|| panic!("no container {container} in {namespace}/pod"))
        .restart_count
}

/// `path` of pod `namespace/pod` on `port`, through the API server's pod proxy.
fn proxied(node: &Node, namespace: &str, pod: &str, port: u16, path: &str) -> String {
    node.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"),
    ])
    .unwrap_or_else(|e| panic!("GET {path} of {namespace}/{pod}:{port}: {e}"))
}

#[tokio::test]
async fn no_pod_stops_the_operator_or_a_runtime_through_their_http_ports() {
    let _scenario = scenario_lock().lock().await;
    let node = Node::shared();
    let operator = installed_operator().await;
    flood_image(node);
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    let _ = node.kubectl(&["create", "namespace", ATTACKER]);

    // 1. The operator's port, while a tenant's plugin is installed.
    let operator_pod = operator.metadata.name.clone().unwrap();
    let operator_ip = operator.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let operator_uid = operator.metadata.uid.clone().unwrap();
    let operator_restarts = restarts(node, "vcp-system", &operator_pod, "operator").await;
    let operator_pid = container_pid(&operator_uid, "/usr/local/bin/vcluster-plugin-operator");
    reset_peak(operator_pid);
    let target = format!("{operator_ip}:8080");
    start_flood(
        node,
        "heads-operator",
        &[&target, "heads", "650", "409600", "45"],
    );
    start_flood(node, "idle-operator", &[&target, "idle", "20000", "45"]);
    let pods: Api<Pod> = Api::namespaced(node.client().await.unwrap(), ATTACKER);
    let flooding = poll_for(Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&Default::default()).await.ok()?;
            let running = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == 2).then_some(())
        }
    })
    .await;
    assert!(flooding.is_some(), "the flood pods did not start");
    let began = Instant::now();
    team_a_ready(vcluster).await;
    let manifest = format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{name: {PLUGIN}, \
         namespace: {NAMESPACE}}}\nspec:\n  vcluster: {{name: {RELEASE}}}\n  hooks:\n  - name: \
         pod-hook\n    apiVersion: v1\n    kind: Pod\n    events: [CreatePhysical]\n    labels:\n      \
         created-by-plugin: {PLUGIN}\n"
    );
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&manifest));
    assert!(applied.status.success(), "apply the plugin: {applied:?}");
    assert_plugin_ready(
        node,
        NAMESPACE,
        PLUGIN,
        120,
        " while the operator was flooded",
    );
    let ready_after = began.elapsed();
    let heads = flood_result(node, "heads-operator").await;
    let idle = flood_result(node, "idle-operator").await;
    // the attack reached the server: connections were opened and the server closed them
    assert!(tally(&heads, "opened") >= 650, "{heads}");
    assert!(tally(&heads, "closed_by_server") >= 650, "{heads}");
    assert!(tally(&idle, "opened") >= 1000, "{idle}");
    let peak = peak_rss(operator_pid);
    let metrics = proxied(node, "vcp-system", &operator_pod, 8080, "/metrics");
    let evicted = metric(&metrics, "vcp_operator_http_connections_evicted_total").unwrap_or(0.0);
    let errors = metric(&metrics, "vcp_operator_http_connection_errors_total").unwrap_or(0.0);
    eprintln!(
        "attack_http: operator: plugin Ready {:.1} s into the flood; peak resident set {:.1} MiB \
         (limit {} MiB); evicted {evicted}, connection errors {errors}",
        ready_after.as_secs_f64(),
        peak as f64 / 1048576.0,
        OPERATOR_LIMIT / 1048576
    );
    assert_eq!(
        restarts(node, "vcp-system", &operator_pod, "operator").await,
        operator_restarts,
        "the operator restarted under the flood:\n{}",
        node.kubectl(&["-n", "vcp-system", "describe", "pod", &operator_pod])
            .unwrap_or_default()
    );
    assert_eq!(
        container_pid(&operator_uid, "/usr/local/bin/vcluster-plugin-operator"),
        operator_pid,
        "the operator's process was replaced"
    );
    assert!(
        peak < OPERATOR_LIMIT / 2,
        "the operator's peak resident set {peak} B under the flood"
    );
    assert!(
        evicted > 0.0 && errors > 0.0,
        "the operator's server counted no eviction ({evicted}) or failed head ({errors})"
    );

    // 2. The runtime sidecar's port, while its hook works.
    let vcluster_pods: Api<Pod> = Api::namespaced(node.client().await.unwrap(), NAMESPACE);
    let rolled = poll_for(Duration::from_secs(180), || {
        let pods = vcluster_pods.clone();
        let name = vcluster.pod_name();
        async move {
            let p = pods.get_opt(&name).await.ok()??;
            let ready = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .any(|c| c.name == PLUGIN && c.ready);
            ready.then_some(p)
        }
    })
    .await
    .expect("the vCluster pod with the runtime sidecar, Ready");
    let pod_name = rolled.metadata.name.clone().unwrap();
    let pod_ip = rolled.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let pod_uid = rolled.metadata.uid.clone().unwrap();
    let sidecar = rolled
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == PLUGIN)
        .unwrap()
        .clone();
    let memory_limit = sidecar
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .map(|q| parse_bytes(&q.0))
        .unwrap_or_else(|| panic!("the runtime sidecar has no memory limit: {sidecar:?}"));
    let sidecar_restarts = restarts(node, NAMESPACE, &pod_name, PLUGIN).await;
    let runtime_pid = container_pid(&pod_uid, "/usr/local/bin/vcluster-plugin-syncer");
    reset_peak(runtime_pid);
    let target = format!("{pod_ip}:9460");
    start_flood(
        node,
        "heads-runtime",
        &[&target, "heads", "2000", "409600", "40"],
    );
    start_flood(node, "metrics-runtime", &[&target, "metrics", "50", "40"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // the hook goes on: a virtual pod made now reaches the node labelled by the plugin
    let hooked = running_host_pod(vcluster, &vcluster_pods, "under-fire").await;
    assert_eq!(label(&hooked, "created-by-plugin"), Some(PLUGIN));
    // the sidecar's /healthz answers within 2 s each time while the flood lasts
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let asked = Instant::now();
        let answer = proxied(node, NAMESPACE, &pod_name, 9460, "/healthz");
        slowest = slowest.max(asked.elapsed());
        assert_eq!(answer.trim(), "ok");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let heads = flood_result(node, "heads-runtime").await;
    let pipelined = flood_result(node, "metrics-runtime").await;
    assert!(tally(&heads, "opened") >= 2000, "{heads}");
    assert!(tally(&pipelined, "opened") >= 50, "{pipelined}");
    let peak = peak_rss(runtime_pid);
    let metrics = proxied(node, NAMESPACE, &pod_name, 9460, "/metrics");
    let renders = metric(&metrics, "vcp_runtime_http_metrics_renders_total").unwrap_or(0.0);
    let errors = metric(&metrics, "vcp_runtime_http_connection_errors_total").unwrap_or(0.0);
    eprintln!(
        "attack_http: runtime: /healthz slowest {slowest:?}; peak resident set {:.1} MiB (limit \
         {:.0} MiB); {} answers to {} pipelined connections from {renders} renders; connection \
         errors {errors}",
        peak as f64 / 1048576.0,
        memory_limit as f64 / 1048576.0,
        tally(&pipelined, "answers"),
        tally(&pipelined, "opened"),
    );
    assert_eq!(
        restarts(node, NAMESPACE, &pod_name, PLUGIN).await,
        sidecar_restarts,
        "the runtime sidecar restarted under the flood:\n{}",
        log_tail(node, NAMESPACE, &pod_name, PLUGIN)
    );
    assert!(
        peak < memory_limit,
        "the runtime's peak resident set {peak} B over its limit {memory_limit} B"
    );
    assert!(
        errors > 0.0 && renders > 0.0,
        "the runtime's server counted no failed head ({errors}) or render ({renders})"
    );
    // at most one render per 100 ms over the 40 s of the flood (and what came before)
    assert!(renders < 40.0 * 10.0 + 100.0, "{renders} renders");

    let _ = node.kubectl(&["delete", "namespace", ATTACKER, "--wait=false"]);
    node.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "vclusterplugin",
        PLUGIN,
        "--timeout=120s",
    ])
    .expect("delete the plugin");
}

/// A Kubernetes memory quantity (`64Mi`, `1Gi`, `500M`, `1048576`) in bytes.
fn parse_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().expect("quantity") * factor;
        }
    }
    q.parse().expect("quantity")
}
