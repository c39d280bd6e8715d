//! A workload cache no tenant can inflate, end to end: the operator binary as a process of its
//! own (its resident set, and its `/state`, test feature `reconcile-log`), on a real API
//! server and etcd.
//!
//! The attack (found on the real node): a tenant with the built-in `edit` role alone
//! (`tenant-norbac`) creates StatefulSets labelled `app=vcluster`, the chart's label the
//! operator's workload caches select on, with `replicas: 0` and a pod template of 1 MB (one
//! large `env` value). Before the fix the operator cached each in full, about +0.97 MiB per
//! object, and was OOM-killed (256 Mi, `config/manager/manager.yaml`) at about 255 of them, and
//! again at every start while it listed them; no other tenant's plugin was reconciled.
//!
//! Now the workload caches hold metadata only (`operator/src/cache/meta.rs`), and a workload's
//! pod template is read only for a plugin that targets it (`operator/src/cache/copies.rs`).
//! With [`BIG`] such StatefulSets (more than the old limit needed):
//! - the operator's cache holds every one of them (`vcp_operator_cached_objects`: it looked);
//! - its live heap grows by less than [`MAX_HEAP_GROWTH`], and its peak resident set stays
//!   under [`MAX_PEAK_MIB`], during the flood and during a restart that lists them all;
//! - it keeps running, and the other tenant's plugins become `Ready` during the flood and after
//!   the restart;
//! - `/state` shows one full copy (the other tenant's vCluster) until a plugin targets one of
//!   the big StatefulSets: that one is then read in full (refused `NotAVCluster`, its copy
//!   counted with its 1 MB).
//!
//! Every figure is printed before the assertions, so a failure gives all of them.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use vcp_tests::{Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess, wait_for};

/// Big StatefulSets of the attack: above the ~255 that OOM-killed the operator before.
const BIG: usize = 300;
/// Bytes of the one `env` value of each big StatefulSet's pod template.
const TEMPLATE_BYTES: usize = 1_000_000;
/// The bound on the growth of the operator's live heap over the flood, in bytes: 8 MiB, for
/// 300 MB of pod templates (before the fix: about 1 MiB per StatefulSet).
const MAX_HEAP_GROWTH: i64 = 8 << 20;
/// The bound on the operator's peak resident set during the flood and during the restart, in
/// MiB: the 1,000-vCluster bench's bound (docs/BENCHMARKS.md), well under the 256 Mi limit.
const MAX_PEAK_MIB: f64 = 96.0;
const TENANT: &str = "wl-attacker";
const OTHER: &str = "wl-other";
const TIMEOUT: Duration = Duration::from_secs(300);
const CACHED_STATEFULSETS: &str = "vcp_operator_cached_objects{kind=\"StatefulSet\"}";

/// A StatefulSet `big-<i>` labelled like a vCluster, with no replicas and a pod template of
/// [`TEMPLATE_BYTES`] in one `env` value (not a vCluster: no `syncer` container).
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
                    "name": "main", "image": "busybox",
                    "env": [{ "name": "FILLER", "value": value }],
                }] },
            },
        },
    }))
    .expect("StatefulSet")
}

/// Creates the [`BIG`] StatefulSets in [`TENANT`] as `tenant`, 8 at a time.
async fn flood(tenant: &Client) {
    let api = Api::<StatefulSet>::namespaced(tenant.clone(), TENANT);
    let value = "x".repeat(TEMPLATE_BYTES);
    stream::iter(0..BIG)
        .map(|i| {
            let (api, sts) = (api.clone(), big(i, &value));
            async move { api.create(&PostParams::default(), &sts).await.map(|_| ()) }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .unwrap_or_else(|e| panic!("the tenant creates its StatefulSets: {e}"));
}

/// The figure `name` of the operator's `/state`.
async fn state(operator: &OperatorProcess, name: &str) -> Option<i64> {
    let (_, body) = operator.get("/state").await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The operator's resident set (`VmRSS`) in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .expect("VmRSS")
        / 1024.0
}

/// Waits until the operator trimmed its heap after its last finished reconcile
/// (`operator/src/trim.rs`), so that the resident set holds what the program keeps.
async fn trimmed_after_burst(operator: &OperatorProcess) {
    wait_for(Duration::from_secs(120), || async move {
        let reconciles = operator.reconciles().await?;
        let trimmed = operator
            .metric("vcp_operator_heap_trimmed_at_reconciles")
            .await?;
        (trimmed as u64 == reconciles).then_some(())
    })
    .await;
}

/// Waits until the operator's StatefulSet cache holds `n` objects.
async fn cached(operator: &OperatorProcess, n: usize) {
    wait_for(TIMEOUT, || async move {
        let cached = operator.metric(CACHED_STATEFULSETS).await?;
        (cached as usize == n).then_some(())
    })
    .await;
}

fn start(cp: &ControlPlane, name: &str) -> OperatorProcess {
    OperatorProcess::start(
        name,
        cp.dir(),
        &OperatorOptions {
            kubeconfig: cp.kubeconfig(Cluster::Host, Identity::Operator),
            runtime_image: "vcp-test/runtime:workloads".into(),
            abort_after_writes: None,
            stop_after_writes: None,
            leader_election: None,
            concurrency: None,
        },
    )
}

/// Creates the plugin `name` of the other tenant's vCluster and waits until it is `Ready`;
/// returns how long that took.
async fn other_plugin_ready(admin: &Client, name: &str) -> Duration {
    let started = Instant::now();
    vcp_tests::create_plugin(
        admin,
        OTHER,
        name,
        json!({"vcluster": {"name": "my-vcluster"}}),
    )
    .await;
    vcp_tests::wait_ready(admin, OTHER, name, "True", None, TIMEOUT).await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_big_workloads_do_not_hold_the_operators_memory() {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&admin).await;
    vcp_tests::install_operator_role(&admin).await;
    vcp_tests::workload::create_vcluster(&admin, OTHER, vcp_tests::workload::Kind::StatefulSet)
        .await;
    vcp_tests::create_namespace(&admin, TENANT).await;
    vcp_tests::bind_tenant_rights(&admin, TENANT).await;
    // the built-in `edit` alone (and VClusterPlugins): no RBAC of its own
    let tenant = cp.client(Cluster::Host, Identity::TenantNoRbac).await;

    let mut operator = start(cp, "workloads");
    let pid = operator.pid();
    other_plugin_ready(&admin, "before").await;
    cached(&operator, 1).await;
    trimmed_after_burst(&operator).await;
    let heap_start = state(&operator, "heap_live_bytes")
        .await
        .expect("heap_live_bytes");
    let rss_start = rss_mib(pid);
    operator.reset_peak_rss();

    // The flood, and the other tenant's plugin meanwhile.
    let started = Instant::now();
    let (_, during) = tokio::join!(flood(&tenant), other_plugin_ready(&admin, "during"));
    let flooded = started.elapsed();
    cached(&operator, BIG + 1).await;
    trimmed_after_burst(&operator).await;
    let heap_end = state(&operator, "heap_live_bytes")
        .await
        .expect("heap_live_bytes");
    let rss_end = rss_mib(pid);
    let peak_flood = operator.peak_rss_bytes().expect("VmHWM") as f64 / 1_048_576.0;
    let copies_flood = state(&operator, "workload_copies").await;
    let running = operator.wait_exit(Duration::ZERO).is_none();

    // A plugin aimed at one of them: that one is read in full (and refused, not a vCluster).
    vcp_tests::create_plugin(
        &tenant,
        TENANT,
        "aimed",
        json!({"vcluster": {"name": "big-7"}}),
    )
    .await;
    vcp_tests::wait_ready(
        &admin,
        TENANT,
        "aimed",
        "False",
        Some("NotAVCluster"),
        TIMEOUT,
    )
    .await;
    let copies_aimed = state(&operator, "workload_copies").await;
    let copies_bytes = state(&operator, "workload_copies_bytes").await;

    // A restart lists them all again.
    let _ = operator.kill();
    let mut restarted = start(cp, "workloads-restarted");
    let after = other_plugin_ready(&admin, "after").await;
    cached(&restarted, BIG + 1).await;
    let peak_restart = restarted.peak_rss_bytes().expect("VmHWM") as f64 / 1_048_576.0;
    let restarted_running = restarted.wait_exit(Duration::ZERO).is_none();

    let mib = |b: i64| b as f64 / 1_048_576.0;
    eprintln!(
        "workload memory: {BIG} StatefulSets of {TEMPLATE_BYTES} bytes of pod template created in {:.1} s; \
         start: resident set {rss_start:.1} MiB, live heap {:.1} MiB; after the flood: {rss_end:.1} MiB, \
         live heap {:.1} MiB ({:+.1} MiB); peak resident set {peak_flood:.1} MiB during the flood, \
         {peak_restart:.1} MiB through the restart; the other tenant's plugin Ready {:.1} s into the \
         flood, {:.1} s after the restart; /state workload_copies {copies_flood:?} after the flood, \
         {copies_aimed:?} ({copies_bytes:?} bytes) once a plugin aims at one; running {running}, \
         {restarted_running} after the restart",
        flooded.as_secs_f64(),
        mib(heap_start),
        mib(heap_end),
        mib(heap_end - heap_start),
        during.as_secs_f64(),
        after.as_secs_f64(),
    );

    assert!(running, "the operator exited during the flood");
    assert!(restarted_running, "the restarted operator exited");
    assert!(
        heap_end - heap_start < MAX_HEAP_GROWTH,
        "the operator's live heap grew by {:.1} MiB for {BIG} StatefulSets no plugin targets, above {:.0} MiB",
        mib(heap_end - heap_start),
        mib(MAX_HEAP_GROWTH)
    );
    assert!(
        peak_flood < MAX_PEAK_MIB,
        "the operator's peak resident set was {peak_flood:.1} MiB during the flood, above {MAX_PEAK_MIB} MiB"
    );
    assert!(
        peak_restart < MAX_PEAK_MIB,
        "the restarted operator's peak resident set was {peak_restart:.1} MiB, above {MAX_PEAK_MIB} MiB"
    );
    // The other tenant's vCluster alone is held in full, until a plugin aims at a big one.
    assert_eq!(copies_flood, Some(1));
    assert_eq!(copies_aimed, Some(2));
    assert!(
        copies_bytes.is_some_and(|b| b > TEMPLATE_BYTES as i64),
        "the aimed StatefulSet's copy holds its template: {copies_bytes:?} bytes"
    );
}
