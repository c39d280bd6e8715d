//! `scripts/bench peer` (`BENCH_SYNC_MODE=peer`): vCluster's own syncer as the performance peer
//! of the runtime, on one control plane, on the same work.
//!
//! (a) vCluster: its real syncer process (`VCLUSTER_SYNCER`, v0.30.0, `scripts/control-plane
//!     syncer start`, with vCluster's chart rendered for `sync.toHost.configMaps.all: true`)
//!     for host namespace [`VC_NS`]. Once it is started, its idle CPU rate is measured over
//!     [`IDLE_WINDOW`]; then `BENCH_OBJECTS` (default 2,000) ConfigMaps are created in virtual
//!     namespace [`VNS`] at [`WORKERS`] requests in flight, and the clock stops when the bench's
//!     watch of the host namespace has seen every host copy under vCluster's name. The CPU
//!     window goes on until the process is idle again (a one-second window at no more than its
//!     idle rate plus one tick, at most 30 s), so the tail work is counted. Then the syncer stops
//!     and the virtual ConfigMaps are deleted.
//! (b) ours: the runtime (`vcluster-plugin-syncer`, release build) with a VClusterPlugin that
//!     declares `v1 ConfigMap` as a synced type, for host namespace [`HOST_NS`] and the same
//!     vCluster name, so its host copies carry the same names; the same idle measurement, then
//!     the same ConfigMaps (same names, same virtual namespace, same content) created again.
//!
//! For each: the time until all host copies are there, CPU milliseconds per object beyond the
//! process's idle rate (`(cpu − idle_rate × window) / objects`), and the process's peak RSS
//! (`VmHWM`). vCluster syncs every ConfigMap of the virtual cluster, ours too; the few outside
//! [`VNS`] (each namespace's `kube-root-ca.crt`) are synced before the clock by both.
//!
//! Then the host copies of the two are compared field by field (after removing what the API
//! server sets per object: `uid`, `resourceVersion`, `creationTimestamp`, `managedFields`; and
//! with what differs between the phases by construction replaced by placeholders: the host
//! namespace's name, the uid of the vCluster's Service there, the uid of the virtual ConfigMap
//! of each phase): every path that differs is printed with how many copies differ there and
//! one example of each side.
//!
//! vCluster's host client is rate-limited: 40 requests per second, bursts of 80, unless
//! `VCLUSTER_PHYSICAL_CLIENT_QPS` / `VCLUSTER_PHYSICAL_CLIENT_BURST` say otherwise
//! (`pkg/setup/config/config.go`, `InitClientConfig`). The bench passes both through from its
//! own environment and prints the rate it ran with (`peer_vcluster_qps`); with the default,
//! vCluster's time is bound by its rate limit (2,000 creates at 40 per second take 50 s). The
//! runtime's client has no rate limit.
//!
//! One run (the peer bench has no `BENCH_RUNS` median yet; its record runs are repeated by
//! hand). Last line: `peer_vcluster_time_s=<x> peer_vcluster_cpu_ms_per_object=<x>
//! peer_vcluster_peak_rss_mib=<x> peer_vcluster_idle_cpu_pct=<x> peer_ours_time_s=<x>
//! peer_ours_cpu_ms_per_object=<x> peer_ours_peak_rss_mib=<x> peer_ours_idle_cpu_pct=<x>
//! peer_cpu_ratio=<ours/vCluster's> peer_rss_ratio=<ours/vCluster's>
//! peer_time_ratio=<ours/vCluster's> field_differences=<paths> peer_vcluster_qps=<n> objects=<n>`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::translate::host_name;
use vcp_tests::{
    Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, VCLUSTER_RELEASE, VClusterSyncer, cpu,
};

use super::{HOST_NS, Seen, WORKERS, env_usize, vm_hwm_mib, wait_count};

/// vCluster's host namespace (the chart's release [`VCLUSTER_RELEASE`] is installed there).
const VC_NS: &str = "vc-peer";
/// The virtual namespace of the ConfigMaps, in both phases.
const VNS: &str = "peer";
/// How long each process's idle CPU rate is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// How long a phase may take before the bench says what is missing.
const PHASE_TIMEOUT: Duration = Duration::from_secs(600);

fn configmaps() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps")
}

/// The `i`th ConfigMap: a label, two small keys and a 512-byte one.
fn configmap(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"bench": "peer"},
                     "annotations": {"peer.example.com/owner": "team-a"}},
        "data": {"name": name, "mode": "fast", "blob": "x".repeat(512)}
    }))
    .expect("configmap")
}

/// The bench's watch of the ConfigMaps of host namespace `ns` (name → first seen).
fn watch_host_configmaps(client: Client, ns: &str) -> Seen {
    super::watch_named(Api::namespaced_with(client, ns, &configmaps()))
}

/// One phase's figures.
struct Figures {
    time: Duration,
    cpu_ms_per_object: f64,
    peak_rss_mib: f64,
    idle_pct: f64,
}

/// Measures one syncer process `pid` on the same work: its idle rate, then `n` ConfigMaps
/// created in [`VNS`] until `seen` (the host watch) has them all, then its tail.
async fn measure(what: &str, pid: u32, virtual_: &Client, seen: &Seen, n: usize) -> Figures {
    let idle_per_s = cpu::idle_rate(pid, IDLE_WINDOW).await;
    let names: Vec<String> = (0..n).map(|i| format!("cm-{i}")).collect();
    let api = Api::<DynamicObject>::namespaced_with(virtual_.clone(), VNS, &configmaps());
    let ticks0 = cpu::process_ticks(pid);
    let start = Instant::now();
    super::create_all_of(&api, &names, WORKERS, configmap).await;
    let last = tokio::time::timeout(PHASE_TIMEOUT, wait_count(seen, "cm-", n))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what}: {} of {n} host copies after {PHASE_TIMEOUT:?}",
                seen.lock().unwrap().len()
            )
        });
    let time = last.duration_since(start);
    let end = cpu::until_idle(pid, idle_per_s).await;
    let window = end.duration_since(start).as_secs_f64();
    let ticks = cpu::process_ticks(pid).saturating_sub(ticks0) as f64;
    let beyond_idle = (ticks - idle_per_s * window).max(0.0);
    let figures = Figures {
        time,
        cpu_ms_per_object: beyond_idle * 10.0 / n as f64,
        peak_rss_mib: vm_hwm_mib(pid),
        idle_pct: idle_per_s,
    };
    eprintln!(
        "peer {what}: {n} host copies after {:.2} s; CPU {:.2} s in a {window:.1} s window \
         (idle {:.2} % of a core), {:.3} ms per object beyond idle; peak RSS {:.1} MiB",
        time.as_secs_f64(),
        ticks / 100.0,
        figures.idle_pct,
        figures.cpu_ms_per_object,
        figures.peak_rss_mib
    );
    figures
}

/// The plugin of phase (b): `v1 ConfigMap` as a synced type, for vCluster [`VCLUSTER_RELEASE`].
fn plugin() -> VClusterPlugin {
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "bench", "namespace": HOST_NS},
        "spec": {"vcluster": {"name": VCLUSTER_RELEASE},
                 "syncedTypes": [{"apiVersion": "v1", "kind": "ConfigMap"}]}
    }))
    .expect("plugin")
}

/// What differs between the two phases by construction, replaced by a placeholder before the
/// comparison: the host namespace's name, the uid of the vCluster's Service there (the owner of
/// every host copy), and the uid of the virtual ConfigMap the copy was made from (each phase
/// created its own).
struct Phase {
    host_ns: &'static str,
    service_uid: String,
    virtual_uids: BTreeMap<String, String>,
}

/// A host copy as compared: what the API server sets per object removed, and `phase`'s
/// per-phase values replaced by placeholders wherever they appear.
fn comparable(obj: &DynamicObject, phase: &Phase, virtual_name: &str) -> Value {
    let mut v = serde_json::to_value(obj).expect("json");
    if let Some(meta) = v["metadata"].as_object_mut() {
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
        ] {
            meta.remove(key);
        }
    }
    let mut text = v
        .to_string()
        .replace(phase.host_ns, "<host-namespace>")
        .replace(&phase.service_uid, "<vcluster-service-uid>");
    if let Some(uid) = phase.virtual_uids.get(virtual_name) {
        text = text.replace(uid.as_str(), "<virtual-uid>");
    }
    serde_json::from_str(&text).expect("json")
}

/// `phase`'s per-phase values, read from the API servers while the phase's objects exist.
async fn phase_values(host: &Client, virtual_: &Client, host_ns: &'static str) -> Phase {
    let service = Api::<k8s_openapi::api::core::v1::Service>::namespaced(host.clone(), host_ns)
        .get(VCLUSTER_RELEASE)
        .await
        .expect("the vCluster's Service");
    let virtual_uids = Api::<DynamicObject>::namespaced_with(virtual_.clone(), VNS, &configmaps())
        .list_metadata(&ListParams::default().labels("bench=peer"))
        .await
        .expect("list the virtual ConfigMaps")
        .items
        .into_iter()
        .filter_map(|m| Some((m.metadata.name?, m.metadata.uid?)))
        .collect();
    Phase {
        host_ns,
        service_uid: service.metadata.uid.expect("uid"),
        virtual_uids,
    }
}

/// Every leaf path where `a` and `b` differ, with both values (`null` where one side has none).
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<(String, Value, Value)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a != b => out.push((path.to_string(), a.clone(), b.clone())),
        _ => {}
    }
}

/// Compares the two host copies of every ConfigMap; prints each differing path (count, and one
/// example of each side); returns the number of distinct paths.
async fn compare_host_copies(host: &Client, n: usize, vcluster: &Phase, ours: &Phase) -> usize {
    let vc_api = Api::<DynamicObject>::namespaced_with(host.clone(), VC_NS, &configmaps());
    let ours_api = Api::<DynamicObject>::namespaced_with(host.clone(), HOST_NS, &configmaps());
    let mut by_path: BTreeMap<String, (usize, Value, Value)> = BTreeMap::new();
    for i in 0..n {
        let virtual_name = format!("cm-{i}");
        let name = host_name(&virtual_name, VNS, VCLUSTER_RELEASE);
        let a = vc_api.get(&name).await.expect("vCluster's host copy");
        let b = ours_api.get(&name).await.expect("the runtime's host copy");
        let mut found = Vec::new();
        differences(
            "",
            &comparable(&a, vcluster, &virtual_name),
            &comparable(&b, ours, &virtual_name),
            &mut found,
        );
        for (path, x, y) in found {
            by_path.entry(path).or_insert((0, x, y)).0 += 1;
        }
    }
    for (path, (count, vcluster, runtime)) in &by_path {
        eprintln!(
            "peer difference {path}: {count} of {n} copies; vCluster: {vcluster}; runtime: {runtime}"
        );
    }
    by_path.len()
}

pub async fn run() {
    let n = env_usize("BENCH_OBJECTS", 2_000);
    let cp = ControlPlane::start().expect("control plane");
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::create_namespace(&host, VC_NS).await;
    vcp_tests::create_namespace(&host, HOST_NS).await;
    vcp_tests::create_namespace(&virtual_, VNS).await;
    super::bind_syncer(&host, &virtual_).await;

    // (a) vCluster's own syncer, its ConfigMap syncer on
    vcp_tests::install_vcluster_chart(
        &host,
        VC_NS,
        "sync:\n  toHost:\n    configMaps:\n      all: true\n",
    )
    .await
    .expect("install vCluster's chart");
    let plugins = cp.dir().join("peer-plugins");
    std::fs::create_dir_all(&plugins).expect("plugins folder");
    let vc_seen = watch_host_configmaps(host.clone(), VC_NS);
    // (the script blocks until vCluster's controllers run; the watch keeps running meanwhile)
    let mut syncer = tokio::task::block_in_place(|| {
        VClusterSyncer::start(&cp, VC_NS, VCLUSTER_RELEASE, &plugins)
    })
    .expect("start vCluster's syncer");
    let pid = syncer.pid().expect("vCluster's pid");
    let vcluster = measure("vCluster", pid, &virtual_, &vc_seen, n).await;
    let vcluster_phase = phase_values(&host, &virtual_, VC_NS).await;
    tokio::task::block_in_place(|| syncer.stop()).expect("stop vCluster's syncer");
    let virtual_cms = Api::<DynamicObject>::namespaced_with(virtual_.clone(), VNS, &configmaps());
    virtual_cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("bench=peer"),
        )
        .await
        .expect("delete the virtual ConfigMaps");
    vcp_tests::wait_for(PHASE_TIMEOUT, || {
        let api = virtual_cms.clone();
        async move {
            let left = api
                .list_metadata(&ListParams::default().labels("bench=peer"))
                .await
                .ok()?;
            left.items.is_empty().then_some(())
        }
    })
    .await;

    // (b) the runtime, the same ConfigMaps declared as a synced type; the chart's objects are
    // applied to its host namespace too (nothing runs them), so the vCluster's Service exists
    // there and the runtime sets it as the owner of its host copies, as vCluster does
    vcp_tests::install_vcluster_chart(&host, HOST_NS, "")
        .await
        .expect("install vCluster's chart for the runtime's namespace");
    Api::<VClusterPlugin>::namespaced(host.clone(), HOST_NS)
        .patch(
            "bench",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(plugin()),
        )
        .await
        .expect("plugin");
    let ours_seen = watch_host_configmaps(host.clone(), HOST_NS);
    let runtime = super::start_syncer(&cp);
    vcp_tests::wait_for(PHASE_TIMEOUT, || {
        let ready = runtime.caches_ready.get().is_some();
        async move { ready.then_some(()) }
    })
    .await;
    let ours = measure("runtime", runtime.id(), &virtual_, &ours_seen, n).await;
    let ours_phase = phase_values(&host, &virtual_, HOST_NS).await;
    runtime.stop();

    let paths = compare_host_copies(&host, n, &vcluster_phase, &ours_phase).await;
    // vCluster's default when the variable is unset or not a number (InitClientConfig)
    let qps = std::env::var("VCLUSTER_PHYSICAL_CLIENT_QPS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(40.0);
    let ratio = |a: f64, b: f64| a / b;
    println!(
        "peer_vcluster_time_s={:.2} peer_vcluster_cpu_ms_per_object={:.3} \
         peer_vcluster_peak_rss_mib={:.1} peer_vcluster_idle_cpu_pct={:.2} \
         peer_ours_time_s={:.2} peer_ours_cpu_ms_per_object={:.3} peer_ours_peak_rss_mib={:.1} \
         peer_ours_idle_cpu_pct={:.2} peer_cpu_ratio={:.2} peer_rss_ratio={:.2} \
         peer_time_ratio={:.2} field_differences={paths} peer_vcluster_qps={qps} objects={n}",
        vcluster.time.as_secs_f64(),
        vcluster.cpu_ms_per_object,
        vcluster.peak_rss_mib,
        vcluster.idle_pct,
        ours.time.as_secs_f64(),
        ours.cpu_ms_per_object,
        ours.peak_rss_mib,
        ours.idle_pct,
        ratio(ours.cpu_ms_per_object, vcluster.cpu_ms_per_object),
        ratio(ours.peak_rss_mib, vcluster.peak_rss_mib),
        ratio(ours.time.as_secs_f64(), vcluster.time.as_secs_f64()),
    );
}
