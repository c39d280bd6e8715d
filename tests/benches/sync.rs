//! `scripts/bench sync`: the declarative runtime (`vcluster-plugin-syncer`, run as a process)
//! on a control plane of its own (real etcd + two kube-apiservers).
//!
//! Every floor carries what the measurement itself costs in the sync run: the bench's own watch
//! on the host namespace it writes to, and a clock that stops when that watch has seen the last
//! object (not when the last create returns).
//!
//! Every figure is the median of `BENCH_RUNS` runs (default 3), each on a fresh control plane
//! (`vcp_tests::bench`); each run prints its own line (stderr), the last line gives every
//! figure as `name=<median>[<min>..<max>]`.
//!
//! (a) `BENCH_BULK` (default 10,000) Cars created in the virtual cluster → time until all are
//!     on the host, beside the floor: the same number created directly on the host by one
//!     client at the same concurrency (the runtime's worker count); ratio = sync / floor
//!     (`sync_ratio`). Also: a second floor, the same host creates while the virtual API server
//!     takes the same number of virtual creates at the same time (of `Bike`, the Car CRD
//!     renamed, which the runtime does not sync: the load the sync run puts on this machine's
//!     shared cores, minus the runtime and its host writes), `sync_ratio_loaded` = sync / that
//!     floor. The runtime runs through all three phases (idle during the floors: none of their
//!     objects is its). Even runs take them in the order floor, loaded floor, sync; odd runs
//!     sync, floor, loaded floor, so that neither kind always runs first on a fresh control
//!     plane; before each, the bench waits until the control plane and the runtime are quiet
//!     (at most 15 ticks of CPU in one second, all together: a phase clocked while the API
//!     servers still publish the CRDs' OpenAPI or delete the last phase's objects measures
//!     that work too). The CPU seconds of every process (etcd, both API servers, the runtime,
//!     the bench, and the whole machine) in each phase; `runtime_cpu_ms_per_object` = the
//!     runtime's CPU from the first create until it is idle again (its tail work — echoes of
//!     its own writes, status writes — counted), less its idle rate over that window, per
//!     object; and the runtime's requests in the sync run (API server request counters and
//!     audit log).
//! (b) latency from virtual create (request returned) to host visible (watch event) at a steady
//!     50 objects/s, p50 / p99 over 250 objects.
//! (b') reaction time on an idle runtime: `BENCH_REACTION_TRIES` (default
//!     100) single virtual creates, one at a time, each timed from the start of its create
//!     request until the bench's host watch sees the host copy; beside each, the floor: the
//!     same single create sent directly to the host, timed until the same watch sees it.
//! (c) memory: Cars created in chunks until `BENCH_OBJECTS` (default 50,000) are synced; the
//!     runtime's resident set (`VmRSS`) after each chunk (and once 1,000 are on the host),
//!     its peak (`VmHWM`) at the end, and the bytes per object beyond the first 1,000
//!     ((RSS at the end − RSS at 1,000) / (objects − 1,000)).
//! (d) restart: the runtime is killed and started again on the unchanged objects: the time
//!     until its caches are listed (its `caches ready, syncing` log line; beside it, one client's
//!     paged list of both sides), the time until its status reports every object in sync (the
//!     status is written at most every 2 s), its write requests on Cars (both audit logs), and
//!     its peak RSS (`restart_rss_mib`: the restart lists everything at once, the first run
//!     grew into it).
//!
//! `BENCH_SYNC_MODE=references` (`scripts/bench sync references`) runs the mode with references
//! and objects that come back instead (cert-manager's Certificates and their Secrets): see
//! `sync/references.rs`, and its own last line. `BENCH_SYNC_MODE=peer` (`scripts/bench peer`)
//! measures vCluster's own syncer and the runtime on the same ConfigMaps: `sync/peer.rs`.
//!
//! `BENCH_PERF=<file>` records the runtime's CPU profile of phase (a) with `perf record`.
//! `BENCH_PPROF=<dir>` records both API servers' CPU profiles (Go pprof,
//! `/debug/pprof/profile`, for [`PPROF_SECONDS`]) from the start of the loaded floor and from
//! the start of the sync, as `<dir>/{loaded,sync}-{host,virtual}.pb.gz`; read them with
//! `go tool pprof -top <file>`.
//!
//! Plots (SVG, written to `docs/bench/`): `sync-rss.svg` (RSS against synced objects) and
//! `sync-latency.svg` (latency percentiles of (b) and (b') and of the reaction floor).
//!
//! Last line (each figure `<median>[<min>..<max>]`): `sync_ratio sync_ratio_loaded
//! runtime_cpu_ms_per_object sync_s floor_s floor_loaded_s p50_ms p99_ms rss_mib
//! restart_rss_mib resync_writes objects bytes_per_object initial_list_s resync_s
//! reaction_p50_ms reaction_p99_ms reaction_floor_p50_ms reaction_floor_p99_ms runs`.

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
use vcp_syncer_runtime::translate::NamespacedTranslator;
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, audited_writes, cpu, plot};

const HOST_NS: &str = "vc-bench";
const VCLUSTER: &str = "bench";
const WORKERS: usize = 4;
const STEADY: usize = 250;

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

/// The host copy the runtime makes of [`car`]`(name)` in the virtual namespace `bench`, for the
/// host namespace `host_ns`: what every floor writes, so that a floor sends the same host
/// writes as the sync (the translated name and vCluster's labels and annotations, which the
/// host API server decodes, tracks in `managedFields`, stores and serves to each watcher: its
/// CPU profile showed those costs growing with the copy's metadata). Made by the runtime's
/// own translator (`NamespacedTranslator::host_object`, checked against vCluster's code by
/// the oracle tests), from a virtual Car with a uid of the API server's form.
fn host_copy(name: &str, host_ns: &str) -> DynamicObject {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut virtual_car = car(name);
    virtual_car.metadata.namespace = Some("bench".into());
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    virtual_car.metadata.uid = Some(format!("5e1f0c2a-7b3d-4e8f-9a6b-{serial:012x}"));
    NamespacedTranslator::new(VCLUSTER, host_ns, "example.loft.sh/v1", "Car")
        .host_object(&virtual_car)
}

/// Creates [`car`]`(name)` for each of `names` in `api` with `concurrency` requests in flight;
/// returns the elapsed time.
async fn create_all(api: &Api<DynamicObject>, names: &[String], concurrency: usize) -> Duration {
    create_all_of(api, names, concurrency, car).await
}

/// Creates `make(name)` for each of `names` in `api` with `concurrency` requests in flight;
/// returns the elapsed time.
async fn create_all_of(
    api: &Api<DynamicObject>,
    names: &[String],
    concurrency: usize,
    make: impl Fn(&str) -> DynamicObject,
) -> Duration {
    let make = &make;
    let start = Instant::now();
    stream::iter(names.iter().cloned())
        .map(|name| {
            let api = api.clone();
            async move {
                let mut attempt = 0;
                loop {
                    match api.create(&PostParams::default(), &make(&name)).await {
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

/// Starts the bench's own watch of the Cars in host namespace `ns`: every floor and every sync
/// run is clocked by one of these, so each carries the same observing watch.
fn watch_host(client: Client, ns: &str) -> Seen {
    watch_named(Api::namespaced_with(client, ns, &cars()))
}

/// The bench's watch of the objects of `api`: name → when the watch first saw it (every mode's
/// clock stops on one of these).
fn watch_named(api: Api<DynamicObject>) -> Seen {
    let seen: Seen = Arc::default();
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

/// Waits (polling every millisecond) until `seen` holds `name`; returns when the watch saw it.
async fn seen_at(seen: &Seen, name: &str) -> Instant {
    loop {
        if let Some(at) = seen.lock().unwrap().get(name) {
            return *at;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
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

/// The runtime process and the moment its caches were listed.
struct Syncer {
    child: Child,
    /// When the runtime logged `caches ready, syncing` (both sides of the Car type listed).
    caches_ready: Arc<std::sync::OnceLock<Instant>>,
}

/// Starts `vcluster-plugin-syncer` for plugin `bench` (warnings, and the driver's
/// `caches ready, syncing` line, which the bench times; every line is passed on to stderr).
fn start_syncer(cp: &ControlPlane) -> Syncer {
    let mut child = Command::new(syncer_binary())
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
        .env("RUST_LOG", "warn,vcp_syncer_runtime::driver=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vcluster-plugin-syncer");
    let caches_ready: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let stderr = child.stderr.take().expect("piped stderr");
    let ready = caches_ready.clone();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("caches ready, syncing") {
                let _ = ready.set(Instant::now());
            }
            eprintln!("{line}");
        }
    });
    Syncer {
        child,
        caches_ready,
    }
}

impl Syncer {
    fn id(&self) -> u32 {
        self.child.id()
    }

    fn stop(self) {
        drop(self);
    }
}

/// The runtime process never outlives the bench, a panicking one included.
impl Drop for Syncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Peak resident set (`VmHWM`) of process `pid`, in MiB.
fn vm_hwm_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmHWM:")
}

/// Current resident set (`VmRSS`) of process `pid`, in MiB.
fn vm_rss_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmRSS:")
}

/// A `kB` field of `/proc/<pid>/status`, in MiB.
fn proc_status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// The processes whose CPU time is reported: the control plane's, the runtime (when running)
/// and this bench.
fn processes(cp: &ControlPlane, runtime: Option<u32>) -> Vec<(String, u32)> {
    let mut out = cpu::control_plane_processes(cp);
    if let Some(pid) = runtime {
        out.push(("runtime".into(), pid));
    }
    out.push(("bench".into(), std::process::id()));
    out
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

/// How long each API server profile of `BENCH_PPROF` lasts: a little longer than the loaded
/// floor and the sync take on the 2-core machine at 10,000 objects (20–30 s), so both profiles
/// cover the whole phase and the same length of time.
const PPROF_SECONDS: u64 = 35;

/// With `BENCH_PPROF=<dir>`: starts a CPU profile of the API server behind `client` (an admin
/// client: `/debug/pprof` is a non-resource URL only `system:masters` may read) that lasts
/// [`PPROF_SECONDS`] and is written to `<dir>/<name>.pb.gz`. Await the handle after the phase.
fn pprof(client: &Client, name: &str) -> Option<tokio::task::JoinHandle<()>> {
    let dir = PathBuf::from(std::env::var_os("BENCH_PPROF")?);
    let client = client.clone();
    let path = dir.join(format!("{name}.pb.gz"));
    Some(tokio::spawn(async move {
        use futures::AsyncReadExt;
        std::fs::create_dir_all(&dir).expect("BENCH_PPROF directory");
        let request = http::Request::get(format!("/debug/pprof/profile?seconds={PPROF_SECONDS}"))
            .body(Vec::new())
            .expect("pprof request");
        let mut body = Vec::new();
        client
            .request_stream(request)
            .await
            .expect("pprof profile")
            .read_to_end(&mut body)
            .await
            .expect("pprof body");
        std::fs::write(&path, body).expect("write the pprof profile");
        eprintln!("pprof: {}", path.display());
    }))
}

/// Waits for the profiles [`pprof`] started.
async fn pprof_done(handles: Vec<Option<tokio::task::JoinHandle<()>>>) {
    for handle in handles.into_iter().flatten() {
        handle.await.expect("pprof task");
    }
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

#[path = "sync/references.rs"]
mod references;

#[path = "sync/peer.rs"]
mod peer;

/// The syncer identity: cluster-admin in the virtual cluster, admin of [`HOST_NS`] on the host.
async fn bind_syncer(host: &Client, virtual_: &Client) {
    for (client, kind) in [(host, "RoleBinding"), (virtual_, "ClusterRoleBinding")] {
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
}

#[tokio::main]
async fn main() {
    match std::env::var("BENCH_SYNC_MODE").as_deref() {
        Ok("references") => return references::run().await,
        Ok("peer") => return peer::run().await,
        Ok("cars") | Err(_) => {}
        Ok(other) => {
            panic!(
                "BENCH_SYNC_MODE must be `cars` (default), `references` or `peer`, not {other:?}"
            )
        }
    }
    let runs = vcp_tests::bench::runs();
    let mut all = Vec::new();
    for run in 0..runs {
        eprintln!("=== run {} of {runs} ===", run + 1);
        let figures = run_cars(run).await;
        eprintln!("run {} of {runs}: {}", run + 1, figures.line());
        all.push(figures);
    }
    println!("{}", vcp_tests::bench::median_line(&all));
}

/// A Car-shaped kind the runtime does not sync (`bikes.example.loft.sh`, the Car CRD renamed):
/// the loaded floor's virtual creates, the same work for the virtual API server as the sync's
/// virtual Car creates, which the runtime (running in every phase) does not see.
fn bikes() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Bike"),
        "bikes",
    )
}

/// Installs [`bikes`] in the cluster of `client`: the Car CRD of `crds/`, renamed.
async fn install_bikes(client: &Client) {
    let text =
        std::fs::read_to_string(vcp_tests::repo_root().join("crds/cars.example.loft.sh.yaml"))
            .expect("the Car CRD");
    let text = text
        .replace("cars.example.loft.sh", "bikes.example.loft.sh")
        .replace("kind: Car", "kind: Bike")
        .replace("listKind: CarList", "listKind: BikeList")
        .replace("plural: cars", "plural: bikes")
        .replace("singular: car", "singular: bike");
    let crd: serde_json::Value = serde_yaml::from_str(&text).expect("the Bike CRD");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let crds = Api::<DynamicObject>::all_with(client.clone(), &ar);
    let crd: DynamicObject = serde_json::from_value(crd).expect("the Bike CRD");
    crds.patch(
        "bikes.example.loft.sh",
        &PatchParams::apply(TEST_FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the Bike CRD");
    let bikes = Api::<DynamicObject>::all_with(client.clone(), &bikes());
    vcp_tests::wait_for(Duration::from_secs(30), || {
        let bikes = bikes.clone();
        async move {
            bikes
                .list_metadata(&Default::default())
                .await
                .ok()
                .map(|_| ())
        }
    })
    .await;
}

/// Ticks (1/100 s) the control plane and the idle runtime may use together in one second
/// before a clocked phase starts (their idle rate is 2–6 ticks; the control plane's start,
/// the CRDs' OpenAPI publication and the previous phase's deletes are well above it).
const QUIET_TICKS: u64 = 15;

/// One run of the Car mode (module docs), on a control plane of its own. Run `run` (from 0)
/// orders its three ratio phases floor, loaded floor, sync when even and sync, floor, loaded
/// floor when odd, so that neither kind always runs first on a fresh control plane.
#[allow(clippy::too_many_lines)]
async fn run_cars(run: usize) -> vcp_tests::bench::Figures {
    let bulk = env_usize("BENCH_BULK", 10_000);
    let cp = ControlPlane::start().expect("control plane");
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    install_bikes(&virtual_).await;
    vcp_tests::create_namespace(&host, HOST_NS).await;
    vcp_tests::create_namespace(&host, "floor").await;
    vcp_tests::create_namespace(&host, "floor-loaded").await;
    vcp_tests::create_namespace(&virtual_, "bench").await;
    vcp_tests::create_namespace(&virtual_, "floor-load").await;
    bind_syncer(&host, &virtual_).await;
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
    let loaded_host = Api::<DynamicObject>::namespaced_with(host.clone(), "floor-loaded", &cars());
    let load_virtual =
        Api::<DynamicObject>::namespaced_with(virtual_.clone(), "floor-load", &bikes());

    // the bench's own watches, started before any clock: the sync namespace, the floors'
    let seen = watch_host(host.clone(), HOST_NS);
    let floor_seen = watch_host(host.clone(), "floor");
    let loaded_seen = watch_host(host.clone(), "floor-loaded");

    // The runtime runs through every phase, the floors included (it watches the virtual Cars
    // and the host Cars of its own namespace: the floors' writes are not its).
    let syncer = start_syncer(&cp);
    let procs = processes(&cp, Some(syncer.id()));
    let control_plane: Vec<(String, u32)> = procs
        .iter()
        .filter(|(n, _)| n != "bench")
        .cloned()
        .collect();
    let floor_names: Vec<String> = (0..bulk).map(|i| format!("floor-{i}")).collect();
    let names: Vec<String> = (0..bulk).map(|i| format!("bulk-{i}")).collect();
    let order: [&str; 3] = if run.is_multiple_of(2) {
        ["floor", "loaded floor", "sync"]
    } else {
        ["sync", "floor", "loaded floor"]
    };
    let (mut floor, mut floor_loaded, mut synced) = (None, None, None);
    let mut runtime_cpu_ms_per_object = f64::NAN;
    let mut rss_at_1000 = None;
    for phase in order {
        let (waited, ticks) =
            cpu::until_quiet(&control_plane, QUIET_TICKS, Duration::from_secs(90)).await;
        eprintln!(
            "{phase}: control plane and runtime quiet after {:.1} s ({ticks} ticks in the last second)",
            waited.as_secs_f64()
        );
        match phase {
            "floor" => {
                let cpu0 = cpu::snapshot(&procs);
                let start = Instant::now();
                create_all_of(&floor_cars, &floor_names, WORKERS, |n| {
                    host_copy(n, "floor")
                })
                .await;
                let took = wait_count(&floor_seen, "floor-", bulk)
                    .await
                    .duration_since(start);
                cpu::report("floor", &cpu0, &cpu::snapshot(&procs));
                eprintln!(
                    "floor: {bulk} host creates at concurrency {WORKERS}, all seen by the watch after {took:?}"
                );
                floor = Some(took);
            }
            "loaded floor" => {
                // the same host creates while the virtual API server takes the same number of
                // virtual creates of a Car-shaped kind the runtime does not sync
                let profiles = vec![
                    pprof(&host, "loaded-host"),
                    pprof(&virtual_, "loaded-virtual"),
                ];
                let cpu0 = cpu::snapshot(&procs);
                let start = Instant::now();
                let (_, load) = tokio::join!(
                    create_all_of(&loaded_host, &floor_names, WORKERS, |n| host_copy(
                        n,
                        "floor-loaded"
                    )),
                    create_all_of(&load_virtual, &floor_names, WORKERS, bike)
                );
                let took = wait_count(&loaded_seen, "floor-", bulk)
                    .await
                    .duration_since(start);
                cpu::report("loaded floor", &cpu0, &cpu::snapshot(&procs));
                pprof_done(profiles).await;
                eprintln!(
                    "loaded floor: {bulk} host creates at concurrency {WORKERS}, all seen after {took:?}, while {bulk} virtual creates took {load:?}"
                );
                floor_loaded = Some(took);
            }
            _ => {
                let writes0 = syncer_writes(&cp);
                let (host_req0, virtual_req0) =
                    (request_counts(&host).await, request_counts(&virtual_).await);
                // the runtime's own idle rate, beside which its CPU of the phase is counted
                let idle_per_s = cpu::idle_rate(syncer.id(), Duration::from_secs(3)).await;
                // `BENCH_PERF=<file>`: the runtime's CPU profile of the bulk phase (`perf
                // record`, software clock at 999 Hz, call graphs), read with
                // `perf report -i <file>`
                let perf = std::env::var_os("BENCH_PERF").map(|out| {
                    Command::new("perf")
                        .args(["record", "-e", "cpu-clock", "-F", "999", "-g", "-p"])
                        .arg(syncer.id().to_string())
                        .arg("-o")
                        .arg(out)
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start perf record (BENCH_PERF)")
                });
                let profiles = vec![pprof(&host, "sync-host"), pprof(&virtual_, "sync-virtual")];
                let cpu0 = cpu::snapshot(&procs);
                let runtime_ticks0 = cpu::process_ticks(syncer.id());
                // the runtime's resident set once 1,000 copies are on the host (the start of
                // the RSS curve)
                rss_at_1000 = Some({
                    let seen = seen.clone();
                    let pid = syncer.id();
                    tokio::spawn(async move {
                        wait_count(&seen, "bulk-", 1_000).await;
                        vm_rss_mib(pid)
                    })
                });
                let start = Instant::now();
                let created = create_all(&virtual_cars, &names, WORKERS).await;
                let last = wait_count(&seen, "bulk-", bulk).await;
                let took = last.duration_since(start);
                // the CPU window goes on until the runtime is idle again: its echoes, status
                // writes and queue drain are its work for these objects too
                let end = cpu::until_idle(syncer.id(), idle_per_s).await;
                let sync_cpu = cpu::report(
                    "sync, until the runtime is idle",
                    &cpu0,
                    &cpu::snapshot(&procs),
                );
                let window = end.duration_since(start).as_secs_f64();
                let ticks = cpu::process_ticks(syncer.id()).saturating_sub(runtime_ticks0) as f64;
                let beyond_idle = (ticks - idle_per_s * window).max(0.0);
                runtime_cpu_ms_per_object = beyond_idle * 1000.0 / cpu::USER_HZ / bulk as f64;
                if let Some(mut perf) = perf {
                    let _ = Command::new("kill")
                        .args(["-INT", &perf.id().to_string()])
                        .status();
                    let _ = perf.wait();
                }
                pprof_done(profiles).await;
                report_requests("host", &host_req0, &request_counts(&host).await);
                report_requests("virtual", &virtual_req0, &request_counts(&virtual_).await);
                report_syncer_writes(&writes0, &syncer_writes(&cp));
                eprintln!(
                    "sync: {bulk} virtual creates took {created:?}, all on the host after {took:?}; the runtime idle again after {window:.1} s: {:.2} s of CPU ({:.2} s beyond its idle rate of {idle_per_s:.1} ticks/s), {runtime_cpu_ms_per_object:.3} ms per object; whole-window CPU by process {sync_cpu:?}",
                    ticks / cpu::USER_HZ,
                    beyond_idle / cpu::USER_HZ
                );
                synced = Some(took);
            }
        }
    }
    let (floor, floor_loaded, synced) = (
        floor.expect("floor ran"),
        floor_loaded.expect("loaded floor ran"),
        synced.expect("sync ran"),
    );
    let ratio = synced.as_secs_f64() / floor.as_secs_f64();
    let ratio_loaded = synced.as_secs_f64() / floor_loaded.as_secs_f64();
    eprintln!(
        "ratios: sync {:.2} s / floor {:.2} s = {ratio:.2}; / loaded floor {:.2} s = {ratio_loaded:.2} (order: {order:?})",
        synced.as_secs_f64(),
        floor.as_secs_f64(),
        floor_loaded.as_secs_f64()
    );
    let mut rss_points = vec![(
        1_000usize,
        rss_at_1000.expect("sync ran").await.expect("rss at 1,000"),
    )];
    rss_points.push((bulk, vm_rss_mib(syncer.id())));
    // the loaded floor's virtual load goes again (a quiet window follows before (b))
    load_virtual
        .delete_collection(&Default::default(), &Default::default())
        .await
        .expect("delete the load");
    cpu::until_quiet(&control_plane, QUIET_TICKS, Duration::from_secs(90)).await;

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

    // (b') reaction time on an idle runtime, one create at a time, each beside its floor
    tokio::time::sleep(Duration::from_secs(3)).await; // the runtime is idle again
    let tries: usize = env_usize("BENCH_REACTION_TRIES", 100);
    let (mut reaction, mut reaction_floor) = (Vec::new(), Vec::new());
    for i in 0..tries {
        let name = format!("react-{i}");
        let start = Instant::now();
        virtual_cars
            .create(&PostParams::default(), &car(&name))
            .await
            .expect("create reaction car");
        let at = seen_at(&seen, &format!("{name}-x-bench-x-{VCLUSTER}")).await;
        reaction.push(at.duration_since(start).as_secs_f64() * 1000.0);
        let name = format!("reactfloor-{i}");
        let start = Instant::now();
        floor_cars
            .create(&PostParams::default(), &host_copy(&name, "floor"))
            .await
            .expect("create reaction floor car");
        let at = seen_at(&floor_seen, &format!("{name}-x-bench-x-{VCLUSTER}")).await;
        reaction_floor.push(at.duration_since(start).as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reaction.sort_by(f64::total_cmp);
    reaction_floor.sort_by(f64::total_cmp);
    let (r50, r99) = (percentile(&reaction, 0.5), percentile(&reaction, 0.99));
    let (f50, f99) = (
        percentile(&reaction_floor, 0.5),
        percentile(&reaction_floor, 0.99),
    );
    eprintln!(
        "reaction ({tries} tries, virtual create to host copy seen): runtime p50 {r50:.1} ms, p99 {r99:.1} ms; floor (the host create alone, to seen) p50 {f50:.1} ms, p99 {f99:.1} ms"
    );

    // (c) memory: chunks of Cars until `objects` are synced
    let synced_so_far = bulk + STEADY + tries;
    let objects = env_usize("BENCH_OBJECTS", 50_000);
    assert!(
        objects > synced_so_far,
        "BENCH_OBJECTS must be above the {synced_so_far} the earlier phases create"
    );
    rss_points.push((synced_so_far, vm_rss_mib(syncer.id())));
    let rest = objects - synced_so_far;
    let chunk = rest.div_ceil(20).max(500);
    let mut done = 0;
    let start = Instant::now();
    while done < rest {
        let n = chunk.min(rest - done);
        let more: Vec<String> = (done..done + n).map(|i| format!("more-{i}")).collect();
        create_all(&virtual_cars, &more, 16).await;
        done += n;
        wait_count(&seen, "more-", done).await;
        rss_points.push((synced_so_far + done, vm_rss_mib(syncer.id())));
    }
    let rss = vm_hwm_mib(syncer.id());
    let (first, last_rss) = (rss_points[0], rss_points[rss_points.len() - 1]);
    let bytes_per_object = (last_rss.1 - first.1) * 1024.0 * 1024.0 / (last_rss.0 - first.0) as f64;
    eprintln!(
        "memory: {objects} synced Cars ({rest} more in {:?}); runtime peak RSS {rss:.1} MiB; RSS {:.1} MiB at {} objects, {:.1} MiB at {objects}: {bytes_per_object:.0} bytes per object beyond the first {}; curve {rss_points:?}",
        start.elapsed(),
        first.1,
        first.0,
        last_rss.1,
        first.0
    );

    // (d) restart: a full resync of the unchanged objects
    syncer.stop();
    let before = count_car_writes(&cp);
    plugins
        .patch_status(
            "bench",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"syncedTotal": 0}})),
        )
        .await
        .expect("reset status");
    // beside the runtime's initial list: one client's paged lists of both sides (500 a page,
    // as kube-runtime's watcher lists)
    let list_start = Instant::now();
    let listed = paged_count(&virtual_cars).await
        + paged_count(&Api::<DynamicObject>::namespaced_with(
            host.clone(),
            HOST_NS,
            &cars(),
        ))
        .await;
    let list_floor = list_start.elapsed();
    let syncer = start_syncer(&cp);
    let resync_start = Instant::now();
    loop {
        let status = plugins.get("bench").await.ok().and_then(|p| p.status);
        if status.and_then(|s| s.synced_total) == Some(objects as i64) {
            break;
        }
        assert!(
            resync_start.elapsed() < Duration::from_secs(1_200),
            "resync did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let resync = resync_start.elapsed();
    let initial_list = syncer
        .caches_ready
        .get()
        .expect("the runtime logged `caches ready, syncing`")
        .duration_since(resync_start);
    let resync_writes = count_car_writes(&cp) - before;
    eprintln!(
        "restart on {objects} unchanged Cars: caches listed after {initial_list:?} (one client's paged lists of the {listed} objects of both sides: {list_floor:?}); all in sync after {resync:?}; {resync_writes} writes"
    );
    let restart_rss = vm_hwm_mib(syncer.id());
    eprintln!("restarted runtime's peak RSS on {objects} objects: {restart_rss:.1} MiB");
    syncer.stop();

    let plots = vcp_tests::repo_root().join("docs/bench");
    std::fs::create_dir_all(&plots).expect("docs/bench");
    plot::rss(&plots.join("sync-rss.svg"), &rss_points, rss);
    plot::latency(
        &plots.join("sync-latency.svg"),
        "latency percentiles: runtime against the direct write",
        &[
            ("steady 50/s: virtual create to host copy", &latencies),
            (
                "reaction, idle runtime: virtual create to host copy",
                &reaction,
            ),
            ("reaction floor: host create to seen", &reaction_floor),
        ],
    );
    eprintln!("plots: {}/sync-rss.svg, sync-latency.svg", plots.display());
    let mut f = vcp_tests::bench::Figures::default();
    f.push("sync_ratio", ratio, 2);
    f.push("sync_ratio_loaded", ratio_loaded, 2);
    f.push("runtime_cpu_ms_per_object", runtime_cpu_ms_per_object, 3);
    f.push("sync_s", synced.as_secs_f64(), 2);
    f.push("floor_s", floor.as_secs_f64(), 2);
    f.push("floor_loaded_s", floor_loaded.as_secs_f64(), 2);
    f.push("p50_ms", p50, 1);
    f.push("p99_ms", p99, 1);
    f.push("rss_mib", rss, 1);
    f.push("restart_rss_mib", restart_rss, 1);
    f.push("resync_writes", resync_writes as f64, 0);
    f.push("objects", objects as f64, 0);
    f.push("bytes_per_object", bytes_per_object, 0);
    f.push("initial_list_s", initial_list.as_secs_f64(), 2);
    f.push("resync_s", resync.as_secs_f64(), 2);
    f.push("reaction_p50_ms", r50, 1);
    f.push("reaction_p99_ms", r99, 1);
    f.push("reaction_floor_p50_ms", f50, 1);
    f.push("reaction_floor_p99_ms", f99, 1);
    f
}

/// The `i`th Bike of the loaded floor's virtual load: [`car`]'s body as a [`bikes`] object.
fn bike(name: &str) -> DynamicObject {
    let mut obj = car(name);
    obj.types = Some(kube::api::TypeMeta {
        api_version: "example.loft.sh/v1".into(),
        kind: "Bike".into(),
    });
    obj
}

/// `name` from the environment as a count, or `default`.
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a count, not {v:?}"))
    })
}

/// Lists every object of `api` in pages of 500; returns how many there were.
async fn paged_count(api: &Api<DynamicObject>) -> usize {
    let mut params = kube::api::ListParams::default().limit(500);
    let mut n = 0;
    loop {
        let page = api.list(&params).await.expect("list cars");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return n,
        }
    }
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
