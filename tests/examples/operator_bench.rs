//! `scripts/bench operator`: the operator at scale on its own real control plane.
//!
//! 200 vClusters (one StatefulSet and its ServiceAccount `vc-<name>` per namespace) with two
//! plugins each: `car`, the embedded runtime syncing the tutorial's `Car`, and `v2`, a
//! `version: v2` image plugin (different container names, different synced types: no
//! Conflict). It measures, in one run:
//!
//! 0. **a busy cluster**: before anything else, objects that belong to no vCluster and no
//!    plugin (no `app=vcluster` label) in 50 other namespaces: 1,000 StatefulSets, 1,000
//!    Deployments, 2,500 Roles and 2,500 RoleBindings, created 32 at a time
//!    (`BENCH_UNRELATED=0` leaves them out);
//! 1. **operator**: the time from the moment all 400 VClusterPlugins are applied until all are
//!    `Ready=True` for their generation, as a watch of the bench's sees them (the operator
//!    binary, as a process of its own under the `vcp-operator` identity with `config/rbac`, is
//!    started right after the apply), its write requests (audit log, user `vcp-operator`), and
//!    its peak resident set size (`VmHWM` of `/proc/<pid>/status`, read before it is stopped);
//! 2. **no-op resync**: the operator restarted on the converged state, until it has reconciled
//!    every plugin (its reconcile counter), then quiet for a while: its write requests (must be 0);
//! 3. **floor**: the same final writes — finalizer, one StatefulSet apply per vCluster with both
//!    plugins, the Role/RoleBinding/ClusterRole/ClusterRoleBinding, the status apply and the
//!    `Ready` Event of each plugin, computed with the operator's own pure functions
//!    (`workload::plan`, `rbac::desired`, `status::desired`) — sent directly by one client with
//!    the operator's identity, `c` vClusters at a time, against a fresh equivalent set of
//!    vClusters and plugins `floor<c>` for each `c` of `BENCH_FLOOR_CONCURRENCIES` (default
//!    4, 8 and 16); the floor's reads happen before its clock starts, which stops when the
//!    same kind of watch has seen all of them `Ready=True`. The fastest of them is the floor
//!    (a floor run at the operator's concurrency only was slowed by it, 16 being
//!    slower than 8 on 2 cores), and the last line names its concurrency.
//!
//! Even runs take the operator's phases (1, 2) first and the floors after; odd runs the
//! floors first, so that neither always runs on the fresher control plane. After the last
//! floor, in both orders, the bench removes what of the floor sets the operator watches (their
//! VClusterPlugins, finalizer taken off first, their StatefulSets and their plugins' Roles,
//! RoleBindings, ClusterRoles and ClusterRoleBindings; the namespaces, ServiceAccounts and
//! Events stay, held by no cache of the operator's), checks that none is left and waits for a
//! quiet control plane: every operator a run starts sees set `op` only. Until then an odd run's
//! operator also reconciled the floors' converged vClusters, a larger job (at 1,000 vClusters
//! 10,120 reconciles against about 4,150, 47.7 CPU-s against 11.4, a peak RSS of 290 MiB
//! against about 96), which biased the medians, and the reaction phase's idle operator, in
//! both orders, started on all the sets (`op` and one per floor). Before each clocked phase
//! the bench waits until the control plane is quiet (etcd and both API servers at most 15
//! ticks of CPU in one second together).
//!
//! The CPU seconds of each process (etcd, both API servers, the operator, the bench) and of the
//! whole machine during phases 1 and 3 are printed (`cpu …` lines, stderr), to tell where the
//! time goes.
//!
//! 4. **reaction time** (`BENCH_REACTION_TRIES`, default 100, 0 leaves it
//!    out): on fresh vClusters `bench-react-NNN`, one `kubectl apply -f -` (admin) of the `car`
//!    plugin at a time, timed from the start of `kubectl` until a GET (every 5 ms) reads it
//!    `Ready=True` for its generation, with an idle operator running (started on the converged
//!    set `op`, the floor sets removed, and left until it has reconciled each of its plugins
//!    and its reconcile counter stood still for 2 s); its floor is the same
//!    single apply with no operator running, timed until the GET reads the object. The
//!    operator's trigger debounce (`--debounce-ms`, default 0: none, `vcluster_plugin_operator::DEBOUNCE`)
//!    counts against it: `VCP_DEBOUNCE_MS=<ms>` in the bench's environment reaches every
//!    operator process it starts (they inherit it), to weigh the debounce against the bulk
//!    phase's reconciles and time; the last line names the value the operator logged at start. The percentiles of both
//!    are plotted to `docs/bench/operator-latency.svg`.
//!
//! Every figure is the median of `BENCH_RUNS` runs (default 3), each on a fresh control plane
//! (`vcp_tests::bench`); each run prints its own line. Last line, each figure
//! `<median>[<min>..<max>]`: `operator_ready_ratio` (operator time / the fastest floor's)
//! `floor_concurrency operator_s floor_s floor_c<c>_s`… `noop_writes operator_peak_rss_mib`
//! (the larger peak of the two operator processes, MiB), with the reaction phase
//! `reaction_p50_ms reaction_p99_ms reaction_floor_p50_ms reaction_floor_p99_ms`
//! (nearest-rank percentiles), then `debounce_ms` (read from the operator's start-up log line:
//! the value it ran with) `vclusters runs`.
//! `BENCH_VCLUSTERS` (default 200), `BENCH_UNRELATED` (default 1) and `BENCH_CONCURRENCY`
//! (default: the operator's default) change the scale. The operator binary, built without the
//! test features by `scripts/bench operator` (`VCP_BENCH_OPERATOR_BINARY`), is built with the
//! profile of this example (`scripts/bench`: release, or `BENCH_PROFILE=dev`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vcp_crds::Reason;

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use vcluster_plugin_operator::status::{self, Check, Outcome};
use vcluster_plugin_operator::{Config, controller, rbac, workload};
use vcp_crds::{
    FINALIZER, OPERATOR_FIELD_MANAGER, PLUGIN_NAMESPACE_LABEL, VClusterPlugin, WorkloadRef,
};
use vcp_tests::{
    AuditedWrite, Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess, cpu, plot,
};

const RUNTIME_IMAGE: &str = "vcp-bench/runtime:bench";
const VC: &str = "vc";
const SET_LABEL: &str = "vcp-bench/set";
/// Concurrency of the bench's own set-up requests (namespaces, workloads, plugins).
const SETUP_CONCURRENCY: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(900);
/// Namespaces of the unrelated objects.
const UNRELATED_NAMESPACES: usize = 50;
/// Unrelated StatefulSets and Deployments, each, per namespace (1,000 of each in all).
const UNRELATED_WORKLOADS: usize = 20;
/// Unrelated Roles and RoleBindings, each, per namespace (2,500 of each in all).
const UNRELATED_RBAC: usize = 50;
/// Concurrency of the unrelated objects' creates.
const UNRELATED_CONCURRENCY: usize = 32;

fn progress(start: Instant, msg: impl AsRef<str>) {
    println!("[{:7.1}s] {}", start.elapsed().as_secs_f64(), msg.as_ref());
}

fn namespace(set: &str, i: usize) -> String {
    format!("bench-{set}-{i:03}")
}

/// Namespace, ServiceAccount `vc-vc` and the vCluster-chart-shaped StatefulSet `vc` (field
/// manager `helm`) of vCluster `i` of `set`.
async fn create_vcluster(admin: &Client, set: &str, i: usize) -> anyhow::Result<()> {
    let ns = namespace(set, i);
    vcp_tests::create_namespace(admin, &ns).await;
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": rbac::service_account_name(VC), "namespace": ns },
    }))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await?;
    let labels = json!({ "app": "vcluster", "release": VC });
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": VC, "namespace": ns, "labels": labels },
        "spec": {
            "serviceName": "vc-headless",
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "serviceAccountName": rbac::service_account_name(VC),
                    "containers": [{
                        "name": "syncer",
                        "image": "ghcr.io/loft-sh/vcluster-pro:0.26.0",
                        "args": ["--name=vc"],
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                    }],
                    "volumes": [{ "name": "data", "emptyDir": {} }],
                },
            },
        },
    }))?;
    Api::<StatefulSet>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams {
                field_manager: Some("helm".into()),
                ..Default::default()
            },
            &sts,
        )
        .await?;
    Ok(())
}

/// One unrelated object to create.
enum Unrelated {
    StatefulSet(String, Box<StatefulSet>),
    Deployment(String, Box<k8s_openapi::api::apps::v1::Deployment>),
    Role(String, Box<Role>),
    RoleBinding(String, Box<RoleBinding>),
}

/// A pod template the size of a small real application's (labels, env, probes, resources).
fn app_template(app: &str, i: usize) -> Value {
    json!({
        "metadata": { "labels": { "app": app, "tier": "backend", "instance": format!("{app}-{i}") } },
        "spec": { "containers": [{
            "name": app, "image": format!("registry.example.com/{app}:1.{i}"),
            "args": ["--port=8080", "--log-level=info", "--config=/etc/app/config.yaml"],
            "env": (0..8).map(|k| json!({ "name": format!("SETTING_{k}"), "value": format!("value-{k}-{i}") })).collect::<Vec<_>>(),
            "ports": [{ "name": "http", "containerPort": 8080 }],
            "readinessProbe": { "httpGet": { "path": "/ready", "port": 8080 } },
            "resources": { "requests": { "cpu": "100m", "memory": "128Mi" } },
        }] },
    })
}

/// The unrelated objects of namespace `n`.
fn unrelated(n: usize) -> anyhow::Result<Vec<Unrelated>> {
    let ns = format!("other-{n:02}");
    let mut out = Vec::new();
    for i in 0..UNRELATED_WORKLOADS {
        let name = format!("db-{i}");
        out.push(Unrelated::StatefulSet(
            ns.clone(),
            Box::new(serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "app": "postgres" } },
                "spec": {
                    "serviceName": name,
                    "selector": { "matchLabels": { "app": "postgres", "instance": format!("postgres-{i}") } },
                    "template": app_template("postgres", i),
                },
            }))?),
        ));
        let name = format!("web-{i}");
        out.push(Unrelated::Deployment(
            ns.clone(),
            Box::new(serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "app": "web" } },
                "spec": {
                    "selector": { "matchLabels": { "app": "web", "instance": format!("web-{i}") } },
                    "template": app_template("web", i),
                },
            }))?),
        ));
    }
    for i in 0..UNRELATED_RBAC {
        let name = format!("reader-{i}");
        out.push(Unrelated::Role(
            ns.clone(),
            Box::new(serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "team": "apps" } },
                "rules": [
                    { "apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["get", "list", "watch"] },
                    { "apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"] },
                ],
            }))?),
        ));
        out.push(Unrelated::RoleBinding(
            ns.clone(),
            Box::new(serde_json::from_value(json!({
                "metadata": { "name": name, "labels": { "team": "apps" } },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                "subjects": [{ "kind": "ServiceAccount", "name": format!("app-{i}"), "namespace": ns }],
            }))?),
        ));
    }
    Ok(out)
}

/// Creates the unrelated objects (phase 0), `UNRELATED_CONCURRENCY` at a time.
async fn create_unrelated(admin: &Client, start: Instant) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for n in 0..UNRELATED_NAMESPACES {
        vcp_tests::create_namespace(admin, &format!("other-{n:02}")).await;
        all.extend(unrelated(n)?);
    }
    let count = all.len();
    let pp = PostParams::default();
    let results: Vec<anyhow::Result<()>> = stream::iter(all)
        .map(|o| {
            let pp = pp.clone();
            async move {
                match o {
                    Unrelated::StatefulSet(ns, x) => Api::namespaced(admin.clone(), &ns)
                        .create(&pp, &*x)
                        .await
                        .map(|_| ())?,
                    Unrelated::Deployment(ns, x) => Api::namespaced(admin.clone(), &ns)
                        .create(&pp, &*x)
                        .await
                        .map(|_| ())?,
                    Unrelated::Role(ns, x) => Api::namespaced(admin.clone(), &ns)
                        .create(&pp, &*x)
                        .await
                        .map(|_| ())?,
                    Unrelated::RoleBinding(ns, x) => Api::namespaced(admin.clone(), &ns)
                        .create(&pp, &*x)
                        .await
                        .map(|_| ())?,
                }
                Ok(())
            }
        })
        .buffer_unordered(UNRELATED_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    progress(
        start,
        format!("{count} unrelated objects created in {UNRELATED_NAMESPACES} namespaces"),
    );
    Ok(())
}

/// The two plugins of a vCluster: the embedded runtime syncing `Car`, and a v2 image plugin.
fn plugins(set: &str, ns: &str) -> [VClusterPlugin; 2] {
    let meta = |name: &str| json!({ "name": name, "namespace": ns, "labels": { SET_LABEL: set } });
    [
        json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin", "metadata": meta("car"),
            "spec": { "vcluster": { "name": VC },
                      "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }] },
        }),
        json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin", "metadata": meta("v2"),
            "spec": { "vcluster": { "name": VC }, "image": "ghcr.io/example/v2-plugin:1" },
        }),
    ]
    .map(|v| serde_json::from_value(v).expect("plugin"))
}

/// Creates `n` vClusters of `set` and their plugins.
async fn create_set(admin: &Client, set: &str, n: usize, start: Instant) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = stream::iter(0..n)
        .map(|i| create_vcluster(admin, set, i))
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    progress(start, format!("{set}: {n} vClusters created"));
    let results: Vec<anyhow::Result<()>> = stream::iter(0..n)
        .flat_map(|i| stream::iter(plugins(set, &namespace(set, i))))
        .map(|p| async move {
            Api::<VClusterPlugin>::namespaced(admin.clone(), &p.namespace().unwrap_or_default())
                .create(&PostParams::default(), &p)
                .await?;
            Ok(())
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    progress(start, format!("{set}: {} VClusterPlugins applied", 2 * n));
    Ok(())
}

/// The plugins of `set`, with how many are `Ready=True` for their generation.
async fn ready_count(admin: &Client, set: &str) -> anyhow::Result<(usize, Vec<VClusterPlugin>)> {
    let list = Api::<VClusterPlugin>::all(admin.clone())
        .list(&ListParams::default().labels(&format!("{SET_LABEL}={set}")))
        .await?
        .items;
    let ready = list.iter().filter(|p| is_ready(p)).count();
    Ok((ready, list))
}

/// `Ready=True` for the plugin's current generation.
fn is_ready(p: &VClusterPlugin) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.observed_generation == p.metadata.generation
            && s.conditions
                .iter()
                .any(|c| c.type_ == status::READY && c.status == "True")
    })
}

/// The bench's watch of the plugins of one set (label `vcp-bench/set`): when each was first
/// seen `Ready=True` for its generation. The operator's clock and the floor's both stop on
/// such a watch, so each run carries the same observer (once, the operator's clock
/// listed all plugins every 100 ms: at 1,000 vClusters that list cost the host API server more
/// CPU than the floor's 11,000 writes, and the floor carried no observer at all).
struct ReadyWatch {
    ready_at: Arc<Mutex<HashMap<String, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    fn start(admin: &Client, set: &str) -> ReadyWatch {
        let ready_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let api = Api::<VClusterPlugin>::all(admin.clone());
        let config = watcher::Config::default().labels(&format!("{SET_LABEL}={set}"));
        let out = ready_at.clone();
        let task = tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(event) = events.next().await {
                let Ok(plugin) = event else { continue };
                let key = format!(
                    "{}/{}",
                    plugin.namespace().unwrap_or_default(),
                    plugin.name_any()
                );
                let mut ready_at = out.lock().expect("ready map");
                if is_ready(&plugin) {
                    ready_at.entry(key).or_insert_with(Instant::now);
                } else {
                    ready_at.remove(&key);
                }
            }
        });
        ReadyWatch { ready_at, task }
    }

    /// Waits until the watch has seen all `total` plugins Ready; returns when it saw the last.
    async fn wait_all(&self, set: &str, total: usize, start: Instant) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + TIMEOUT;
        let mut last_report = Instant::now();
        loop {
            let (ready, last) = {
                let ready_at = self.ready_at.lock().expect("ready map");
                (ready_at.len(), ready_at.values().max().copied())
            };
            if ready == total {
                return Ok(last.unwrap_or_else(Instant::now));
            }
            if last_report.elapsed() > Duration::from_secs(5) {
                progress(start, format!("{set}: {ready}/{total} Ready"));
                last_report = Instant::now();
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{set}: only {ready}/{total} Ready"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The operator binary as a process of its own under the `vcp-operator` identity.
struct Operator(OperatorProcess);

impl Operator {
    /// Starts the operator binary `scripts/bench operator` built without the test features
    /// (`VCP_BENCH_OPERATOR_BINARY`, its path), as the product ships (the bench once ran the
    /// test-featured build); checked at start from its start-up line.
    fn start(cp: &ControlPlane, name: &str, concurrency: u16) -> Operator {
        let binary = std::env::var_os("VCP_BENCH_OPERATOR_BINARY").expect(
            "VCP_BENCH_OPERATOR_BINARY: the operator binary without test features (scripts/bench operator builds it)",
        );
        let operator = Operator(OperatorProcess::start_binary(
            std::path::Path::new(&binary),
            name,
            cp.dir(),
            &OperatorOptions {
                kubeconfig: cp.kubeconfig(Cluster::Host, Identity::Operator),
                runtime_image: RUNTIME_IMAGE.into(),
                abort_after_writes: None,
                stop_after_writes: None,
                leader_election: None,
                concurrency: Some(concurrency),
            },
        ));
        let deadline = Instant::now() + Duration::from_secs(30);
        let machinery = loop {
            if let Some(v) = operator.0.started_with("test_machinery") {
                break v;
            }
            assert!(
                Instant::now() < deadline,
                "no start-up line from the operator"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            machinery,
            serde_json::json!(false),
            "the benchmark runs the operator without its test features"
        );
        operator
    }

    /// Finished reconciles (`/metrics`; 0 while it does not answer yet).
    async fn reconciles(&self) -> u64 {
        self.0.reconciles().await.unwrap_or(0)
    }

    /// SIGTERM, after reading its peak RSS (bytes).
    fn stop(self) -> anyhow::Result<u64> {
        let peak = self
            .0
            .peak_rss_bytes()
            .ok_or_else(|| anyhow::anyhow!("no VmHWM of the operator"))?;
        let status = self.0.terminate(Duration::from_secs(30));
        anyhow::ensure!(status.success(), "operator exited with {status}");
        Ok(peak)
    }
}

/// The `car` plugin of vCluster `vc` in `ns`, as YAML for `kubectl apply`.
fn car_yaml(ns: &str) -> String {
    format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata:\n  name: car\n  namespace: {ns}\nspec:\n  vcluster:\n    name: {VC}\n  syncedTypes:\n  - apiVersion: example.loft.sh/v1\n    kind: Car\n"
    )
}

/// Runs `kubectl apply -f -` as admin with `yaml` on stdin.
async fn kubectl_apply(cp: &ControlPlane, yaml: &str) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(cp.kubectl())
        .arg("--kubeconfig")
        .arg(cp.kubeconfig(Cluster::Host, Identity::Admin))
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(yaml.as_bytes()).await?;
    drop(stdin);
    let out = child.wait_with_output().await?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// One try: applies the `car` plugin into `ns` with kubectl and returns the time until a GET
/// reads it, `Ready=True` for its generation when `ready`.
async fn react_once(
    cp: &ControlPlane,
    admin: &Client,
    ns: &str,
    ready: bool,
) -> anyhow::Result<Duration> {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let yaml = car_yaml(ns);
    let t0 = Instant::now();
    kubectl_apply(cp, &yaml).await?;
    let deadline = t0 + Duration::from_secs(60);
    loop {
        if let Some(p) = api.get_opt("car").await? {
            let done = !ready
                || p.status.as_ref().is_some_and(|s| {
                    s.observed_generation == p.metadata.generation
                        && s.conditions
                            .iter()
                            .any(|c| c.type_ == status::READY && c.status == "True")
                });
            if done {
                return Ok(t0.elapsed());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{ns}/car not Ready within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Nearest-rank percentile `q` (0–100) of `sorted`, in milliseconds.
fn percentile_ms(sorted: &[Duration], q: usize) -> f64 {
    let rank = (q * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1].as_secs_f64() * 1000.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Write requests of user `vcp-operator` on objects of `set` (its namespaces, its
/// cluster-scoped `vcp:bench-<set>-...` objects).
fn operator_writes(cp: &ControlPlane, set: &str) -> anyhow::Result<Vec<AuditedWrite>> {
    let ns = format!("bench-{set}-");
    Ok(vcp_tests::audited_write_events(cp, Cluster::Host)?
        .into_iter()
        .filter(|w| w.user == Identity::Operator.user())
        .filter(|w| matches!(w.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .filter(|w| {
            w.uri.contains(&format!("/namespaces/{ns}")) || w.uri.contains(&format!("vcp:{ns}"))
        })
        .collect())
}

/// `verb resource[/subresource]` → count, for the report.
fn breakdown(writes: &[AuditedWrite]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for w in writes {
        let path = w.uri.split('?').next().unwrap_or_default();
        let parts: Vec<&str> = path.split('/').collect();
        // .../namespaces/<ns>/<resource>/<name>[/<sub>] or .../<resource>/<name>
        let (resource, sub) = match parts.iter().position(|p| *p == "namespaces") {
            Some(i) if parts.len() > i + 2 => (parts[i + 2], parts.get(i + 4).copied()),
            _ => (
                parts
                    .get(parts.len().saturating_sub(2))
                    .copied()
                    .unwrap_or(""),
                None,
            ),
        };
        let key = match sub {
            Some(s) => format!("{} {resource}/{s}", w.verb),
            None => format!("{} {resource}", w.verb),
        };
        *out.entry(key).or_default() += 1;
    }
    out
}

/// One floor write, as the operator sends it.
enum Write {
    /// The merge patch adding the finalizer.
    Finalizer(String, String),
    /// The StatefulSet's server-side apply body.
    Workload(String, Value),
    Role(String, Box<Role>),
    RoleBinding(String, Box<RoleBinding>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    /// The status apply body of a plugin.
    Status(String, String, Value),
    /// The `Ready` Event of a plugin.
    Event(String, Box<Event>),
}

async fn apply<K>(api: Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: Resource + Serialize + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

impl Write {
    async fn send(self, client: &Client) -> anyhow::Result<()> {
        let pp = PatchParams::apply(OPERATOR_FIELD_MANAGER).force();
        match self {
            Write::Finalizer(ns, name) => {
                Api::<VClusterPlugin>::namespaced(client.clone(), &ns)
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({ "metadata": { "finalizers": [FINALIZER] } })),
                    )
                    .await?;
            }
            Write::Workload(ns, body) => {
                Api::<StatefulSet>::namespaced(client.clone(), &ns)
                    .patch(VC, &pp, &Patch::Apply(&body))
                    .await?;
            }
            Write::Role(ns, r) => apply(Api::namespaced(client.clone(), &ns), &*r).await?,
            Write::RoleBinding(ns, r) => apply(Api::namespaced(client.clone(), &ns), &*r).await?,
            Write::ClusterRole(r) => apply(Api::all(client.clone()), &*r).await?,
            Write::ClusterRoleBinding(r) => apply(Api::all(client.clone()), &*r).await?,
            Write::Status(ns, name, body) => {
                Api::<VClusterPlugin>::namespaced(client.clone(), &ns)
                    .patch_status(&name, &pp, &Patch::Apply(&body))
                    .await?;
            }
            Write::Event(ns, e) => {
                Api::<Event>::namespaced(client.clone(), &ns)
                    .create(&PostParams::default(), &*e)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The writes of one plugin in the order the operator makes them; `workload` (the
/// StatefulSet's apply body with both plugins) goes with the first plugin of each vCluster.
async fn plugin_writes(
    client: &Client,
    plugin: &VClusterPlugin,
    workload: Option<Value>,
) -> anyhow::Result<Vec<Write>> {
    let ns = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let mut out = vec![Write::Finalizer(ns.clone(), name.clone())];
    if let Some(body) = workload {
        out.push(Write::Workload(ns.clone(), body));
    }
    // A fresh discovery cache: one discovery request per type, as the operator's first reconcile.
    let plurals = vcluster_plugin_operator::cache::Discovery::default()
        .plurals_of(client, &[plugin])
        .await?;
    let desired = rbac::desired(plugin, &plurals, &rbac::service_account_name(VC))
        .map_err(|r| anyhow::anyhow!("{}: {}", r.reason, r.message))?;
    if let Some(r) = desired.role {
        out.push(Write::Role(ns.clone(), Box::new(r)));
    }
    if let Some(r) = desired.role_binding {
        out.push(Write::RoleBinding(ns.clone(), Box::new(r)));
    }
    if let Some(r) = desired.cluster_role {
        out.push(Write::ClusterRole(Box::new(r)));
    }
    if let Some(r) = desired.cluster_role_binding {
        out.push(Write::ClusterRoleBinding(Box::new(r)));
    }
    let outcome = Outcome {
        workload: Some(WorkloadRef {
            kind: "StatefulSet".into(),
            name: VC.into(),
        }),
        workload_patched: Check::Ok,
        rbac: Check::Ok,
        terminating: false,
        rollout: None,
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired_status = status::desired(plugin, &outcome, &now);
    out.push(Write::Status(
        ns.clone(),
        name.clone(),
        status::apply_body(plugin, &desired_status),
    ));
    let event: Event = serde_json::from_value(json!({
        "metadata": { "name": format!("{name}.{:x}", now.0.as_nanosecond()), "namespace": ns },
        "eventTime": MicroTime(now.0),
        "reportingController": controller::CONTROLLER_NAME,
        "reportingInstance": controller::CONTROLLER_NAME,
        "action": "Reconcile",
        "reason": Reason::Installed,
        "type": "Normal",
        "note": "installed into \"StatefulSet vc\"",
        "regarding": {
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "name": name, "namespace": ns, "uid": plugin.uid(),
        },
    }))?;
    out.push(Write::Event(ns, Box::new(event)));
    Ok(out)
}

/// Computes the floor's writes for `set` (reads, before the clock starts).
async fn floor_writes(
    client: &Client,
    admin: &Client,
    set: &str,
    n: usize,
) -> anyhow::Result<Vec<Vec<Write>>> {
    let mut all = Vec::new();
    for i in 0..n {
        let ns = namespace(set, i);
        let sts = Api::<StatefulSet>::namespaced(admin.clone(), &ns)
            .get(VC)
            .await?;
        let wl = workload::Workload::from_statefulset(&sts);
        let mut ps = Api::<VClusterPlugin>::namespaced(admin.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items;
        ps.sort_by_key(|p| p.name_any());
        let refs: Vec<&VClusterPlugin> = ps.iter().collect();
        let plan = workload::plan(&wl, &refs, RUNTIME_IMAGE);
        anyhow::ensure!(plan.refused.is_empty(), "refused: {:?}", plan.refused);
        for (k, p) in ps.iter().enumerate() {
            let body = (k == 0).then(|| plan.patch.clone());
            all.push(plugin_writes(client, p, body).await?);
        }
    }
    Ok(all)
}

/// The bench's settings, from the environment (module docs).
struct Settings {
    /// vClusters per set (`BENCH_VCLUSTERS`, default 200).
    n: usize,
    /// The operator's `--concurrency` (`BENCH_CONCURRENCY`, default its own default).
    concurrency: u16,
    /// The concurrencies the floor runs at (`BENCH_FLOOR_CONCURRENCIES`, default `4,8,16`);
    /// the fastest is the floor.
    floor_concurrencies: Vec<usize>,
    /// The busy cluster (`BENCH_UNRELATED`, default 1).
    with_unrelated: bool,
    /// Reaction tries (`BENCH_REACTION_TRIES`, default 100; 0 leaves the phase out).
    tries: usize,
}

fn env_parse<T: std::str::FromStr>(name: &str) -> anyhow::Result<Option<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse::<T>()
                .map_err(|e| anyhow::anyhow!("{name}={v:?}: {e}"))
        })
        .transpose()
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let default_concurrency = Config::new(Client::try_from(kube::Config::new(
            "http://127.0.0.1:1".parse()?,
        ))?)
        .concurrency;
        let floor_concurrencies = std::env::var("BENCH_FLOOR_CONCURRENCIES")
            .unwrap_or_else(|_| "4,8,16".into())
            .split(',')
            .map(|c| c.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("BENCH_FLOOR_CONCURRENCIES: {e}"))?;
        anyhow::ensure!(
            !floor_concurrencies.is_empty() && !floor_concurrencies.contains(&0),
            "BENCH_FLOOR_CONCURRENCIES must list positive concurrencies"
        );
        Ok(Settings {
            n: env_parse("BENCH_VCLUSTERS")?.unwrap_or(200),
            concurrency: env_parse("BENCH_CONCURRENCY")?.unwrap_or(default_concurrency),
            floor_concurrencies,
            with_unrelated: std::env::var("BENCH_UNRELATED").map_or(true, |v| v != "0"),
            tries: env_parse("BENCH_REACTION_TRIES")?.unwrap_or(100),
        })
    }
}

/// Ticks (1/100 s) the control plane (etcd, both API servers) may use together in one second
/// before a clocked phase starts: its idle rate is 2–6 ticks; the set-up's creates, their
/// garbage and the last phase's tail are above it.
const QUIET_TICKS: u64 = 15;

/// Waits until the control plane is quiet before a clocked phase (`QUIET_TICKS`), and says
/// how long that took.
async fn quiet(cp: &ControlPlane, start: Instant, phase: &str) {
    let (waited, ticks) = cpu::until_quiet(
        &cpu::control_plane_processes(cp),
        QUIET_TICKS,
        Duration::from_secs(120),
    )
    .await;
    progress(
        start,
        format!(
            "{phase}: control plane quiet after {:.1} s ({ticks} ticks in the last second)",
            waited.as_secs_f64()
        ),
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let start = Instant::now();
    let settings = Settings::from_env()?;
    // Built before any clock starts (the profile of this example).
    vcp_tests::workspace_binary("vcluster-plugin-operator", "vcluster-plugin-operator");
    let runs = vcp_tests::bench::runs();
    let mut all = Vec::new();
    for run in 0..runs {
        progress(start, format!("=== run {} of {runs} ===", run + 1));
        let figures = run_once(run, &settings, start).await?;
        progress(
            start,
            format!("run {} of {runs}: {}", run + 1, figures.line()),
        );
        all.push(figures);
    }
    println!("{}", vcp_tests::bench::median_line(&all));
    Ok(())
}

/// What the operator phases measured.
struct OperatorPhases {
    secs: f64,
    writes: usize,
    noop_writes: usize,
    peak_rss: u64,
    debounce_ms: u64,
}

/// Phases 1 and 2: the operator installs set `op`, then a restarted operator resyncs it.
async fn operator_phases(
    cp: &ControlPlane,
    admin: &Client,
    settings: &Settings,
    start: Instant,
) -> anyhow::Result<OperatorPhases> {
    let (n, concurrency) = (settings.n, settings.concurrency);
    let total = 2 * n;
    create_set(admin, "op", n, start).await?;
    let watch = ReadyWatch::start(admin, "op");
    quiet(cp, start, "operator").await; // and the watch has listed
    let t0 = Instant::now();
    let operator = Operator::start(cp, "bench", concurrency);
    let mut procs = cpu::control_plane_processes(cp);
    procs.push(("operator".into(), operator.0.pid()));
    procs.push(("bench".into(), std::process::id()));
    let cpu0 = cpu::snapshot(&procs);
    let t1 = watch.wait_all("op", total, start).await?;
    drop(watch);
    cpu::report("operator install", &cpu0, &cpu::snapshot(&procs));
    let secs = (t1 - t0).as_secs_f64();
    progress(
        start,
        format!("op: all {total} Ready {secs:.2}s after the apply"),
    );
    // The value the operator ran with, from its own start-up line.
    let debounce_ms = operator
        .0
        .started_with("debounce_ms")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| anyhow::anyhow!("the operator's start-up line gave no debounce_ms"))?;
    // Reconciles the last writes triggered (watch events of its own writes) finish quietly.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reconciles = operator.reconciles().await;
    let peak_install = operator.stop()?;
    let op_writes = operator_writes(cp, "op")?;
    progress(
        start,
        format!(
            "op: {} write requests, {reconciles} reconciles, peak RSS {:.1} MiB, debounce {debounce_ms} ms: {:?}",
            op_writes.len(),
            mib(peak_install),
            breakdown(&op_writes)
        ),
    );

    // 2. No-op resync: a restarted operator on the converged state.
    let before = op_writes.len();
    let operator = Operator::start(cp, "bench-resync", concurrency);
    let deadline = Instant::now() + TIMEOUT;
    while operator.reconciles().await < total as u64 {
        anyhow::ensure!(Instant::now() < deadline, "resync did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resync_reconciles = operator.reconciles().await;
    let peak_resync = operator.stop()?;
    let after = operator_writes(cp, "op")?;
    let noop_writes = after.len() - before;
    progress(
        start,
        format!(
            "resync: {resync_reconciles} reconciles, {noop_writes} write requests, peak RSS {:.1} MiB {:?}",
            mib(peak_resync),
            breakdown(&after[before..])
        ),
    );
    Ok(OperatorPhases {
        secs,
        writes: op_writes.len(),
        noop_writes,
        peak_rss: peak_install.max(peak_resync),
        debounce_ms,
    })
}

/// Phase 3 at one concurrency: the same final writes for a fresh set `floor<concurrency>`,
/// sent directly `concurrency` vClusters at a time; returns the seconds until all are Ready.
async fn floor_phase(
    cp: &ControlPlane,
    admin: &Client,
    n: usize,
    concurrency: usize,
    start: Instant,
) -> anyhow::Result<f64> {
    let total = 2 * n;
    let set = format!("floor{concurrency}");
    create_set(admin, &set, n, start).await?;
    let client = Client::try_from(cp.config(Cluster::Host, Identity::Operator).await?)?;
    let writes = floor_writes(&client, admin, &set, n).await?;
    let planned: usize = writes.iter().map(Vec::len).sum();
    progress(start, format!("{set}: {planned} writes computed"));
    let watch = ReadyWatch::start(admin, &set);
    quiet(cp, start, &set).await; // and the watch has listed
    let mut procs = cpu::control_plane_processes(cp);
    procs.push(("bench".into(), std::process::id()));
    let cpu0 = cpu::snapshot(&procs);
    let t0 = Instant::now();
    let results: Vec<anyhow::Result<()>> = stream::iter(writes)
        .map(|ws| {
            let client = client.clone();
            async move {
                for w in ws {
                    w.send(&client).await?;
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    let secs = (watch.wait_all(&set, total, start).await? - t0).as_secs_f64();
    drop(watch);
    cpu::report(&set, &cpu0, &cpu::snapshot(&procs));
    let (ready, _) = ready_count(admin, &set).await?;
    anyhow::ensure!(ready == total, "{set}: only {ready}/{total} Ready");
    let audited = operator_writes(cp, &set)?;
    progress(
        start,
        format!(
            "{set}: {} write requests at concurrency {concurrency} in {secs:.2}s, all {total} Ready: {:?}",
            audited.len(),
            breakdown(&audited)
        ),
    );
    Ok(secs)
}

/// Concurrency of the removal of the floor sets.
const REMOVE_CONCURRENCY: usize = 32;

/// Deletes each `(api, name)`, `REMOVE_CONCURRENCY` at a time, with background propagation
/// (an orphaning delete would wait on a garbage collector, which this control plane does not
/// run).
async fn delete_each<K>(targets: Vec<(Api<K>, String)>) -> anyhow::Result<usize>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let count = targets.len();
    let results: Vec<anyhow::Result<()>> = stream::iter(targets)
        .map(|(api, name)| async move {
            api.delete(&name, &DeleteParams::background()).await?;
            Ok(())
        })
        .buffer_unordered(REMOVE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    Ok(count)
}

/// The objects of kind `K` labelled `vcp.dev/plugin-namespace` (the plugin RBAC the operator
/// caches, `vcluster_plugin_operator::cache`) for a plugin in a namespace of `sets`, with the
/// API to delete each with.
async fn labelled_of<K>(
    admin: &Client,
    sets: &[String],
    api: impl Fn(&K) -> Api<K>,
) -> anyhow::Result<Vec<(Api<K>, String)>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let prefixes: Vec<String> = sets.iter().map(|s| format!("bench-{s}-")).collect();
    Ok(Api::<K>::all(admin.clone())
        .list(&ListParams::default().labels(PLUGIN_NAMESPACE_LABEL))
        .await?
        .items
        .into_iter()
        .filter(|o| {
            o.labels()
                .get(PLUGIN_NAMESPACE_LABEL)
                .is_some_and(|ns| prefixes.iter().any(|p| ns.starts_with(p)))
        })
        .map(|o| (api(&o), o.name_any()))
        .collect())
}

/// After the floors: removes every object of the floor sets the operator watches (its caches:
/// all VClusterPlugins, the `app=vcluster` workloads, the plugin-labelled Roles, RoleBindings,
/// ClusterRoles and ClusterRoleBindings), so that no operator this run starts later sees them,
/// whichever order the run takes: the plugins (their finalizer, written by the floor with no
/// operator running, taken off first: nothing would remove it), the StatefulSets `vc` and the
/// plugins' RBAC. Their namespaces, ServiceAccounts and Events stay (no operator cache holds
/// them; without a namespace controller a namespace delete would never finish). Checks that
/// nothing of them is left, then waits until the control plane is quiet.
async fn remove_floor_sets(
    cp: &ControlPlane,
    admin: &Client,
    n: usize,
    sets: &[String],
    start: Instant,
) -> anyhow::Result<()> {
    let mut plugins = Vec::new();
    for set in sets {
        plugins.extend(ready_count(admin, set).await?.1);
    }
    let unfinalize: Vec<anyhow::Result<()>> = stream::iter(&plugins)
        .map(|p| async move {
            Api::<VClusterPlugin>::namespaced(admin.clone(), &p.namespace().unwrap_or_default())
                .patch(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
                )
                .await?;
            Ok(())
        })
        .buffer_unordered(REMOVE_CONCURRENCY)
        .collect()
        .await;
    unfinalize.into_iter().collect::<anyhow::Result<()>>()?;
    let mut deleted = delete_each(
        plugins
            .iter()
            .map(|p| {
                let ns = p.namespace().unwrap_or_default();
                (
                    Api::<VClusterPlugin>::namespaced(admin.clone(), &ns),
                    p.name_any(),
                )
            })
            .collect(),
    )
    .await?;
    deleted += delete_each(
        sets.iter()
            .flat_map(|set| (0..n).map(move |i| namespace(set, i)))
            .map(|ns| {
                (
                    Api::<StatefulSet>::namespaced(admin.clone(), &ns),
                    VC.into(),
                )
            })
            .collect(),
    )
    .await?;
    deleted += delete_each(
        labelled_of::<Role>(admin, sets, |o| {
            Api::namespaced(admin.clone(), &o.namespace().unwrap_or_default())
        })
        .await?,
    )
    .await?;
    deleted += delete_each(
        labelled_of::<RoleBinding>(admin, sets, |o| {
            Api::namespaced(admin.clone(), &o.namespace().unwrap_or_default())
        })
        .await?,
    )
    .await?;
    deleted +=
        delete_each(labelled_of::<ClusterRole>(admin, sets, |_| Api::all(admin.clone())).await?)
            .await?;
    deleted += delete_each(
        labelled_of::<ClusterRoleBinding>(admin, sets, |_| Api::all(admin.clone())).await?,
    )
    .await?;
    // Really gone: none of the deletes waits on a finalizer, so none is left.
    let mut left = 0;
    for set in sets {
        left += ready_count(admin, set).await?.1.len();
    }
    let prefixes: Vec<String> = sets.iter().map(|s| format!("bench-{s}-")).collect();
    left += Api::<StatefulSet>::all(admin.clone())
        .list(&ListParams::default().labels("app=vcluster"))
        .await?
        .items
        .iter()
        .filter(|s| {
            let ns = s.namespace().unwrap_or_default();
            prefixes.iter().any(|p| ns.starts_with(p))
        })
        .count();
    left += labelled_of::<Role>(admin, sets, |_| Api::all(admin.clone()))
        .await?
        .len();
    left += labelled_of::<RoleBinding>(admin, sets, |_| Api::all(admin.clone()))
        .await?
        .len();
    left += labelled_of::<ClusterRole>(admin, sets, |_| Api::all(admin.clone()))
        .await?
        .len();
    left += labelled_of::<ClusterRoleBinding>(admin, sets, |_| Api::all(admin.clone()))
        .await?
        .len();
    anyhow::ensure!(
        left == 0,
        "{left} objects of the floor sets left after their removal"
    );
    progress(
        start,
        format!("floor sets {sets:?} removed: {deleted} objects deleted"),
    );
    quiet(cp, start, "floor sets removed").await;
    Ok(())
}

/// One run on a control plane of its own: even runs take the operator's phases first, odd
/// runs the floors first, so that neither always runs on the fresher control plane; the floor
/// sets are removed after the last floor, so that the operator's job is the same in both.
#[allow(clippy::too_many_lines)]
async fn run_once(
    run: usize,
    settings: &Settings,
    start: Instant,
) -> anyhow::Result<vcp_tests::bench::Figures> {
    let (n, concurrency, tries) = (settings.n, settings.concurrency, settings.tries);
    progress(
        start,
        format!(
            "operator bench: {n} vClusters x 2 plugins, operator concurrency {concurrency}, floors at {:?}",
            settings.floor_concurrencies
        ),
    );
    let cp = ControlPlane::start()?;
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&admin).await;
    for file in [
        "config/rbac/role.yaml",
        "config/rbac/test-user-binding.yaml",
    ] {
        vcp_tests::apply_yaml_file(&admin, file, None).await?;
    }
    progress(start, format!("control plane up in {}", cp.dir().display()));

    // 0. A busy cluster.
    if settings.with_unrelated {
        create_unrelated(&admin, start).await?;
    }

    // 1–3, in this run's order.
    let operator_first = run.is_multiple_of(2);
    let mut op = None;
    if operator_first {
        op = Some(operator_phases(&cp, &admin, settings, start).await?);
    }
    let mut floors = Vec::new();
    for &c in &settings.floor_concurrencies {
        floors.push((c, floor_phase(&cp, &admin, n, c, start).await?));
    }
    // Gone before any later operator starts, in both orders: an odd run's operator phases, and
    // both orders' reaction phase, see the same sets (`op` only).
    let floor_sets: Vec<String> = floors.iter().map(|(c, _)| format!("floor{c}")).collect();
    remove_floor_sets(&cp, &admin, n, &floor_sets, start).await?;
    if !operator_first {
        op = Some(operator_phases(&cp, &admin, settings, start).await?);
    }
    let op = op.expect("the operator phases ran");
    let &(floor_concurrency, floor_secs) = floors
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a floor ran");
    // 4. Reaction time: the floor first (no operator running), then with an idle operator.
    let mut reaction = None;
    if tries > 0 {
        let results: Vec<anyhow::Result<()>> = stream::iter(0..tries)
            .map(|i| create_vcluster(&admin, "react", i))
            .buffer_unordered(SETUP_CONCURRENCY)
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<()>>()?;
        let mut floor = Vec::new();
        for i in 0..tries {
            let ns = namespace("react-floor", i);
            vcp_tests::create_namespace(&admin, &ns).await;
            floor.push(react_once(&cp, &admin, &ns, false).await?);
            // No finalizer (no operator ran): deleted at once, never seen by the operator.
            Api::<VClusterPlugin>::namespaced(admin.clone(), &ns)
                .delete("car", &Default::default())
                .await?;
        }
        let operator = Operator::start(&cp, "bench-react", concurrency);
        // every plugin of the converged set `op` (the floor sets are gone), reconciled once
        let settled = (2 * n) as u64;
        let deadline = Instant::now() + TIMEOUT;
        let mut last = (0, Instant::now());
        loop {
            let r = operator.reconciles().await;
            if r != last.0 {
                last = (r, Instant::now());
            } else if r >= settled && last.1.elapsed() > Duration::from_secs(2) {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "the operator did not settle");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        progress(
            start,
            format!("react: operator idle after {} reconciles", last.0),
        );
        let mut op = Vec::new();
        for i in 0..tries {
            op.push(react_once(&cp, &admin, &namespace("react", i), true).await?);
        }
        operator.stop()?;
        floor.sort();
        op.sort();
        let r = [
            percentile_ms(&op, 50),
            percentile_ms(&op, 99),
            percentile_ms(&floor, 50),
            percentile_ms(&floor, 99),
        ];
        let ms =
            |v: &[Duration]| -> Vec<f64> { v.iter().map(|d| d.as_secs_f64() * 1000.0).collect() };
        let plots = vcp_tests::repo_root().join("docs/bench");
        std::fs::create_dir_all(&plots)?;
        plot::latency(
            &plots.join("operator-latency.svg"),
            "reaction time: kubectl apply to Ready=True, against the apply alone",
            &[
                ("operator (idle): apply to Ready=True", &ms(&op)),
                ("floor: the apply alone, to read back", &ms(&floor)),
            ],
        );
        println!(
            "reaction ({tries} tries, kubectl apply to Ready=True): operator p50 {:.0} ms, p99 {:.0} ms; floor (the apply alone) p50 {:.0} ms, p99 {:.0} ms",
            r[0], r[1], r[2], r[3]
        );
        reaction = Some(r);
    }

    let ratio = op.secs / floor_secs;
    let own = floors
        .iter()
        .find(|(c, _)| *c == usize::from(concurrency))
        .map(|(_, s)| op.secs / s);
    println!(
        "operator: {:.2}s, {} writes; floors: {}; the fastest at concurrency {floor_concurrency}: ratio {ratio:.2}{}; no-op resync: {} writes",
        op.secs,
        op.writes,
        floors
            .iter()
            .map(|(c, s)| format!("{s:.2}s at {c}"))
            .collect::<Vec<_>>()
            .join(", "),
        own.map_or(String::new(), |r| format!(
            " (against the floor at the operator's concurrency {concurrency}: {r:.2})"
        )),
        op.noop_writes
    );
    drop(cp);
    let mut f = vcp_tests::bench::Figures::default();
    f.push("operator_ready_ratio", ratio, 2);
    f.push("floor_concurrency", floor_concurrency as f64, 0);
    f.push("operator_s", op.secs, 2);
    f.push("floor_s", floor_secs, 2);
    for (c, s) in &floors {
        f.push(&format!("floor_c{c}_s"), *s, 2);
    }
    f.push("noop_writes", op.noop_writes as f64, 0);
    f.push("operator_peak_rss_mib", mib(op.peak_rss), 1);
    if let Some(r) = reaction {
        f.push("reaction_p50_ms", r[0], 0);
        f.push("reaction_p99_ms", r[1], 0);
        f.push("reaction_floor_p50_ms", r[2], 0);
        f.push("reaction_floor_p99_ms", r[3], 0);
    }
    f.push("debounce_ms", op.debounce_ms as f64, 0);
    f.push("vclusters", n as f64, 0);
    Ok(f)
}
