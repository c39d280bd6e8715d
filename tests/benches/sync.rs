//! `scripts/bench sync`: the declarative runtime (`vcluster-plugin-syncer`, run as a process)
//! on a control plane of its own (real etcd + two kube-apiservers).
//!
//! (a) 2,000 Cars created in the virtual cluster → time until all are on the host, beside the
//!     floor: the same 2,000 created directly on the host by one client at the same concurrency
//!     (the runtime's worker count); ratio = sync / floor.
//! (b) latency from virtual create (request returned) to host visible (watch event) at a steady
//!     50 objects/s, p50 / p99 over 250 objects.
//! (c) peak RSS (VmHWM) of the runtime process once 10,000 Cars are synced.
//! (d) write requests (audit log, user `vcp-syncer`, Cars) while a restarted runtime resyncs the
//!     10,000 unchanged objects (until its status reports all 10,000 in sync).
//!
//! Last line: `sync_ratio=<x> p50_ms=<x> p99_ms=<x> rss_mib=<x> resync_writes=<n>`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, audited_writes};

const HOST_NS: &str = "vc-bench";
const VCLUSTER: &str = "bench";
const WORKERS: usize = 4;
const BULK: usize = 2_000;
const STEADY: usize = 250;
const TOTAL: usize = 10_000;

fn cars() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    )
}

fn car(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": name, "labels": {"bench": "yes"}},
        "spec": {"type": "BMW", "seats": 4}
    }))
    .expect("car")
}

/// Creates `names` in `api` with `concurrency` requests in flight; returns the elapsed time.
async fn create_all(api: &Api<DynamicObject>, names: &[String], concurrency: usize) -> Duration {
    let start = Instant::now();
    stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                let mut attempt = 0;
                loop {
                    match api.create(&PostParams::default(), &car(&name)).await {
                        Ok(_) => return Ok::<(), kube::Error>(()),
                        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
                        Err(e) if attempt < 5 => {
                            attempt += 1;
                            eprintln!("create {name}: {e}; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .expect("create cars");
    start.elapsed()
}

/// Host name → first time seen on the host, filled by a watch.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

fn watch_host(client: Client) -> Seen {
    let seen: Seen = Arc::default();
    let api = Api::<DynamicObject>::namespaced_with(client, HOST_NS, &cars());
    let out = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = events.next().await {
            if let Ok(obj) = event {
                out.lock()
                    .unwrap()
                    .entry(obj.name_any())
                    .or_insert_with(Instant::now);
            }
        }
    });
    seen
}

async fn wait_count(seen: &Seen, prefix: &str, n: usize) -> Instant {
    loop {
        {
            let seen = seen.lock().unwrap();
            let matching: Vec<&Instant> = seen
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, t)| t)
                .collect();
            if matching.len() >= n {
                return **matching.iter().max().unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn syncer_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("vcluster-plugin-syncer");
    assert!(
        bin.exists(),
        "{} missing: scripts/bench sync builds it first",
        bin.display()
    );
    bin
}

fn start_syncer(cp: &ControlPlane) -> Child {
    Command::new(syncer_binary())
        .arg("--host-kubeconfig")
        .arg(cp.kubeconfig(Cluster::Host, Identity::Syncer))
        .arg("--virtual-kubeconfig")
        .arg(cp.kubeconfig(Cluster::Virtual, Identity::Syncer))
        .args([
            "--namespace",
            HOST_NS,
            "--plugin",
            "bench",
            "--workers",
            &WORKERS.to_string(),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vcluster-plugin-syncer")
}

fn vm_hwm_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

#[tokio::main]
async fn main() {
    let cp = ControlPlane::start().expect("control plane");
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, HOST_NS).await;
    vcp_tests::create_namespace(&host, "floor").await;
    vcp_tests::create_namespace(&virtual_, "bench").await;
    // the syncer identity: cluster-admin in the virtual cluster, admin of its namespace on the host
    for (client, kind) in [(&host, "RoleBinding"), (&virtual_, "ClusterRoleBinding")] {
        let (plural, ns) = if kind == "RoleBinding" {
            ("rolebindings", Some(HOST_NS))
        } else {
            ("clusterrolebindings", None)
        };
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        );
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "bench-syncer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
        })).expect("binding");
        api.patch(
            "bench-syncer",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&obj),
        )
        .await
        .expect("bind");
    }
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "bench", "namespace": HOST_NS},
        "spec": {"vcluster": {"name": VCLUSTER},
                 "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}]}
    }))
    .expect("plugin");
    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), HOST_NS);
    plugins
        .patch(
            "bench",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&plugin),
        )
        .await
        .expect("plugin");

    let virtual_cars = Api::<DynamicObject>::namespaced_with(virtual_.clone(), "bench", &cars());
    let floor_cars = Api::<DynamicObject>::namespaced_with(host.clone(), "floor", &cars());

    // (a) floor first (nothing else running), then the runtime
    let floor_names: Vec<String> = (0..BULK).map(|i| format!("floor-{i}")).collect();
    let floor = create_all(&floor_cars, &floor_names, WORKERS).await;
    eprintln!("floor: {BULK} host creates at concurrency {WORKERS}: {floor:?}");

    let mut syncer = start_syncer(&cp);
    let seen = watch_host(host.clone());
    tokio::time::sleep(Duration::from_secs(3)).await; // the runtime lists and is idle
    let names: Vec<String> = (0..BULK).map(|i| format!("bulk-{i}")).collect();
    let start = Instant::now();
    let created = create_all(&virtual_cars, &names, WORKERS).await;
    let last = wait_count(&seen, "bulk-", BULK).await;
    let synced = last.duration_since(start);
    let ratio = synced.as_secs_f64() / floor.as_secs_f64();
    eprintln!(
        "sync: {BULK} virtual creates took {created:?}, all on the host after {synced:?}; ratio {ratio:.2}"
    );

    // (b) steady 50/s
    let mut sent = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for i in 0..STEADY {
        tick.tick().await;
        let name = format!("steady-{i}");
        virtual_cars
            .create(&PostParams::default(), &car(&name))
            .await
            .expect("create steady");
        sent.insert(format!("{name}-x-bench-x-{VCLUSTER}"), Instant::now());
    }
    wait_count(&seen, "steady-", STEADY).await;
    let mut latencies: Vec<f64> = {
        let seen = seen.lock().unwrap();
        sent.iter()
            .map(|(host_name, t)| {
                seen[host_name].saturating_duration_since(*t).as_secs_f64() * 1000.0
            })
            .collect()
    };
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    eprintln!("steady 50/s: p50 {p50:.1} ms, p99 {p99:.1} ms");

    // (c) 10,000 synced Cars
    let rest: Vec<String> = (0..TOTAL - BULK - STEADY)
        .map(|i| format!("more-{i}"))
        .collect();
    create_all(&virtual_cars, &rest, 16).await;
    wait_count(&seen, "more-", rest.len()).await;
    let rss = vm_hwm_mib(syncer.id());
    eprintln!("runtime peak RSS with {TOTAL} synced Cars: {rss:.1} MiB");

    // (d) restart: a full resync of 10,000 unchanged objects
    let _ = syncer.kill();
    let _ = syncer.wait();
    let before = count_car_writes(&cp);
    plugins
        .patch_status(
            "bench",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"syncedTotal": 0}})),
        )
        .await
        .expect("reset status");
    let mut syncer = start_syncer(&cp);
    let resync_start = Instant::now();
    loop {
        let status = plugins.get("bench").await.ok().and_then(|p| p.status);
        if status.and_then(|s| s.synced_total) == Some(TOTAL as i64) {
            break;
        }
        assert!(
            resync_start.elapsed() < Duration::from_secs(600),
            "resync did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resync_writes = count_car_writes(&cp) - before;
    eprintln!(
        "restart + full resync of {TOTAL} unchanged Cars: {:?}, {resync_writes} writes",
        resync_start.elapsed()
    );
    let _ = syncer.kill();
    let _ = syncer.wait();
    println!(
        "sync_ratio={ratio:.2} p50_ms={p50:.1} p99_ms={p99:.1} rss_mib={rss:.1} resync_writes={resync_writes}"
    );
}

fn count_car_writes(cp: &ControlPlane) -> usize {
    let mut total = 0;
    for cluster in [Cluster::Host, Cluster::Virtual] {
        total += audited_writes(cp, cluster, Identity::Syncer.user())
            .expect("audit log")
            .iter()
            .filter(|(_, uri)| uri.contains("/cars"))
            .count();
    }
    total
}
