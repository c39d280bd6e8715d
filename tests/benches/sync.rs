//! `scripts/bench sync`: the declarative runtime (`vcluster-plugin-syncer`, run as a process)
//! on a control plane of its own (real etcd + two kube-apiservers).
//!
//! (a) 2,000 Cars created in the virtual cluster → time until all are on the host, beside the
//!     floor: the same 2,000 created directly on the host by one client at the same concurrency
//!     (the runtime's worker count), nothing else running; ratio = sync / floor
//!     (`sync_ratio`). For reading it, also printed: a second floor, the same host creates
//!     while the virtual API server takes the same 2,000 virtual creates at the same time
//!     (no runtime running: the load the sync run puts on this machine's shared cores, minus
//!     the runtime and its host writes), `sync_ratio_loaded` = sync / that floor; the CPU
//!     seconds of every process (etcd, both API servers, the runtime, the bench, and the
//!     whole machine) in each of these runs; and the runtime's requests per Car in the sync
//!     run (API server request counters and audit log).
//! (b) latency from virtual create (request returned) to host visible (watch event) at a steady
//!     50 objects/s, p50 / p99 over 250 objects.
//! (c) peak RSS (VmHWM) of the runtime process once 10,000 Cars are synced.
//! (d) write requests (audit log, user `vcp-syncer`, Cars) while a restarted runtime resyncs the
//!     10,000 unchanged objects (until its status reports all 10,000 in sync).
//!
//! Last line: `sync_ratio=<x> p50_ms=<x> p99_ms=<x> rss_mib=<x> resync_writes=<n>
//! sync_ratio_loaded=<x>`.

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

/// Clock ticks per second of `/proc/<pid>/stat` and `/proc/stat` (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) of process `pid` so far, in ticks; 0 when it is gone.
fn process_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // fields after "(comm)": state is field 3, utime 14, stime 15
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

/// Busy CPU time of the whole machine so far (all but idle and iowait), in ticks.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    total - fields.get(3).copied().unwrap_or(0) - fields.get(4).copied().unwrap_or(0)
}

/// The processes whose CPU time is reported: the control plane's (from its `pids` file), the
/// runtime (when running) and this bench.
fn processes(cp: &ControlPlane, runtime: Option<u32>) -> Vec<(String, u32)> {
    let pids = std::fs::read_to_string(cp.dir().join("pids")).unwrap_or_default();
    let mut out: Vec<(String, u32)> = pids
        .lines()
        .filter_map(|l| {
            let (pid, name) = l.split_once(' ')?;
            let pid = pid.parse().ok()?;
            (name != "watchdog").then(|| (name.to_string(), pid))
        })
        .collect();
    if let Some(pid) = runtime {
        out.push(("runtime".into(), pid));
    }
    out.push(("bench".into(), std::process::id()));
    out
}

/// CPU ticks of [`processes`] and of the machine, at one moment.
struct CpuSnapshot {
    at: Instant,
    procs: Vec<(String, u64)>,
    machine: u64,
}

fn cpu_snapshot(procs: &[(String, u32)]) -> CpuSnapshot {
    CpuSnapshot {
        at: Instant::now(),
        procs: procs
            .iter()
            .map(|(n, pid)| (n.clone(), process_ticks(*pid)))
            .collect(),
        machine: machine_busy_ticks(),
    }
}

/// Prints the CPU seconds each process used between `a` and `b`.
fn report_cpu(what: &str, a: &CpuSnapshot, b: &CpuSnapshot) {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    let mut line = format!("cpu {what}: wall {wall:.1} s;");
    let mut ours = 0.0;
    for ((name, t0), (_, t1)) in a.procs.iter().zip(&b.procs) {
        let s = (t1.saturating_sub(*t0)) as f64 / USER_HZ;
        ours += s;
        line += &format!(" {name} {s:.1} s;");
    }
    let machine = (b.machine.saturating_sub(a.machine)) as f64 / USER_HZ;
    line += &format!(
        " these together {ours:.1} s; whole machine {machine:.1} s busy of {:.1} s available",
        wall * 2.0
    );
    eprintln!("{line}");
}

/// `apiserver_request_total` of `client`'s API server summed by `(resource, verb)` for Cars and
/// VClusterPlugins.
async fn request_counts(client: &Client) -> HashMap<(String, String), f64> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(req).await.expect("metrics");
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let label = |key: &str| {
            rest.split(&format!("{key}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
        };
        let resource = label("resource").unwrap_or_default();
        if resource != "cars" && resource != "vclusterplugins" {
            continue;
        }
        let sub = label("subresource").unwrap_or_default();
        let verb = label("verb").unwrap_or_default();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let resource = if sub.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{sub}")
        };
        *out.entry((resource, verb.to_string())).or_default() += value;
    }
    out
}

/// Prints the requests counted between `before` and `after` on one API server.
fn report_requests(
    cluster: &str,
    before: &HashMap<(String, String), f64>,
    after: &HashMap<(String, String), f64>,
) {
    let mut keys: Vec<_> = after.keys().collect();
    keys.sort();
    let mut line = format!("requests on the {cluster} API server (all clients):");
    for key in keys {
        let n = after[key] - before.get(key).copied().unwrap_or(0.0);
        if n > 0.0 {
            line += &format!(" {} {} {n};", key.1, key.0);
        }
    }
    eprintln!("{line}");
}

/// The runtime's (user `vcp-syncer`) audited writes `(verb, uri)` on each API server so far.
fn syncer_writes(cp: &ControlPlane) -> Vec<(Cluster, Vec<(String, String)>)> {
    [Cluster::Host, Cluster::Virtual]
        .into_iter()
        .map(|c| {
            (
                c,
                audited_writes(cp, c, Identity::Syncer.user()).expect("audit log"),
            )
        })
        .collect()
}

/// Prints the runtime's writes between `before` and `after` per `(verb, resource)`.
fn report_syncer_writes(
    before: &[(Cluster, Vec<(String, String)>)],
    after: &[(Cluster, Vec<(String, String)>)],
) {
    for ((cluster, b), (_, a)) in before.iter().zip(after) {
        let mut counts: HashMap<(String, String), usize> = HashMap::new();
        for (verb, uri) in &a[b.len()..] {
            let path = uri.split('?').next().unwrap_or_default();
            let resource = if path.contains("/cars") {
                "cars"
            } else if path.ends_with("/status") && path.contains("/vclusterplugins/") {
                "vclusterplugins/status"
            } else if path.contains("/vclusterplugins") {
                "vclusterplugins"
            } else {
                "other"
            };
            *counts.entry((verb.clone(), resource.into())).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort();
        let cluster = match cluster {
            Cluster::Host => "host",
            Cluster::Virtual => "virtual",
        };
        eprintln!("runtime writes on the {cluster} API server (audit log): {counts:?}");
    }
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

    // (a) floor first (nothing else running), then the loaded floor, then the runtime
    let floor_names: Vec<String> = (0..BULK).map(|i| format!("floor-{i}")).collect();
    let cpu0 = cpu_snapshot(&processes(&cp, None));
    let floor = create_all(&floor_cars, &floor_names, WORKERS).await;
    report_cpu("floor", &cpu0, &cpu_snapshot(&processes(&cp, None)));
    eprintln!("floor: {BULK} host creates at concurrency {WORKERS}: {floor:?}");

    // the same host creates while the virtual API server takes the same virtual creates (in a
    // namespace of its own, removed again before the runtime starts)
    vcp_tests::create_namespace(&host, "floor-loaded").await;
    vcp_tests::create_namespace(&virtual_, "floor-load").await;
    let loaded_host = Api::<DynamicObject>::namespaced_with(host.clone(), "floor-loaded", &cars());
    let load_virtual =
        Api::<DynamicObject>::namespaced_with(virtual_.clone(), "floor-load", &cars());
    let cpu0 = cpu_snapshot(&processes(&cp, None));
    let (floor_loaded, load) = tokio::join!(
        create_all(&loaded_host, &floor_names, WORKERS),
        create_all(&load_virtual, &floor_names, WORKERS)
    );
    report_cpu("loaded floor", &cpu0, &cpu_snapshot(&processes(&cp, None)));
    eprintln!(
        "loaded floor: {BULK} host creates at concurrency {WORKERS} took {floor_loaded:?} while {BULK} virtual creates took {load:?}"
    );
    load_virtual
        .delete_collection(&Default::default(), &Default::default())
        .await
        .expect("delete the load");
    vcp_tests::wait_for(Duration::from_secs(120), || {
        let api = load_virtual.clone();
        async move {
            api.list_metadata(&Default::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        }
    })
    .await;

    let mut syncer = start_syncer(&cp);
    let seen = watch_host(host.clone());
    tokio::time::sleep(Duration::from_secs(3)).await; // the runtime lists and is idle
    let names: Vec<String> = (0..BULK).map(|i| format!("bulk-{i}")).collect();
    let procs = processes(&cp, Some(syncer.id()));
    let writes0 = syncer_writes(&cp);
    let (host_req0, virtual_req0) = (request_counts(&host).await, request_counts(&virtual_).await);
    let cpu0 = cpu_snapshot(&procs);
    let start = Instant::now();
    let created = create_all(&virtual_cars, &names, WORKERS).await;
    let last = wait_count(&seen, "bulk-", BULK).await;
    let synced = last.duration_since(start);
    report_cpu("sync", &cpu0, &cpu_snapshot(&procs));
    tokio::time::sleep(Duration::from_secs(3)).await; // the last status write
    report_requests("host", &host_req0, &request_counts(&host).await);
    report_requests("virtual", &virtual_req0, &request_counts(&virtual_).await);
    report_syncer_writes(&writes0, &syncer_writes(&cp));
    let ratio = synced.as_secs_f64() / floor.as_secs_f64();
    let ratio_loaded = synced.as_secs_f64() / floor_loaded.as_secs_f64();
    eprintln!(
        "sync: {BULK} virtual creates took {created:?}, all on the host after {synced:?}; ratio {ratio:.2}, to the loaded floor {ratio_loaded:.2}"
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
        "sync_ratio={ratio:.2} p50_ms={p50:.1} p99_ms={p99:.1} rss_mib={rss:.1} resync_writes={resync_writes} sync_ratio_loaded={ratio_loaded:.2}"
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
