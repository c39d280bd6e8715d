//! No per-object state outlives its object (issue 24, item 3): 10,000 objects go through
//! create and delete, and the resident set of the runtime and of the operator, each a real
//! process of its release-less test build, comes back within 10 % of where it was before.
//!
//! - the runtime (`vcluster-plugin-syncer`, a process) syncs Cars of one virtual namespace to
//!   its host namespace: each Car is created, its host copy awaited, then deleted, and its host
//!   copy's deletion awaited;
//! - the operator (`vcluster-plugin-operator`, a process, as `vcp-operator` under the admission
//!   policies) reconciles VClusterPlugins naming vClusters that do not exist: each plugin is
//!   created, its `Pending` status awaited (the operator looked at it and wrote), then
//!   deleted, and its disappearance awaited.
//!
//! Both churn at once, in chunks of 1,000. The level before is taken after a warm-up churn of
//! 1,000 objects of each kind (the allocators' pools and the watch caches reach their working
//! size there); the check is that 10,000 more objects, ten times the warm-up, leave nothing
//! behind that grows with the objects ever seen. Each level is the median of 5 readings of
//! `VmRSS` (`/proc/<pid>/status`) 500 ms apart, taken once both processes have caught up (no
//! copy, no plugin left).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vcp_crds::{Phase, VClusterPlugin};
use vcp_tests::runtime::{cars_resource, syncer_is_cluster_admin};
use vcp_tests::{
    Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess, TEST_FIELD_MANAGER,
    create_namespace, install_crds, poll_for, prepare_operator_host, workspace_binary,
};

/// Objects of each kind churned after the warm-up.
const CHURN: usize = 10_000;
/// Objects of each kind churned before the level is taken.
const WARMUP: usize = 1_000;
/// Objects created (then deleted) at a time.
const CHUNK: usize = 1_000;
/// Requests in flight per kind.
const CONCURRENCY: usize = 16;
/// The longest wait for a chunk to be synced or gone.
const TIMEOUT: Duration = Duration::from_secs(300);
/// The host namespace of the runtime's plugin and of the churned plugins.
const HOST_NS: &str = "churn";
/// The virtual namespace of the churned Cars.
const VIRTUAL_NS: &str = "churn-cars";
/// The vCluster of the runtime's plugin (only its name matters to the runtime).
const VCLUSTER: &str = "churn-vc";

/// The runtime as a process, killed on drop.
struct RuntimeProcess(Child);

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` of process `pid` in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("process {pid} is gone: {e}"));
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib / 1024.0
}

/// The median of 5 readings of each process's `VmRSS`, 500 ms apart: `(runtime, operator)`.
async fn levels(runtime: u32, operator: u32) -> (f64, f64) {
    let mut readings = (Vec::new(), Vec::new());
    for _ in 0..5 {
        readings.0.push(rss_mib(runtime));
        readings.1.push(rss_mib(operator));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(readings.0), median(readings.1))
}

/// Waits until `count` (a list) gives `want`.
async fn wait_count<F, Fut>(what: String, want: usize, count: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let last = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let reached = poll_for(TIMEOUT, || {
        let n = count();
        let last = &last;
        async move {
            let n = n.await;
            last.store(n, std::sync::atomic::Ordering::Relaxed);
            (n == want).then_some(())
        }
    })
    .await;
    assert!(
        reached.is_some(),
        "{what}: {} after {TIMEOUT:?}, {want} expected",
        last.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// Objects of `api` carrying label `churn=<chunk>`.
async fn count_labelled<K>(api: &Api<K>, chunk: &str) -> usize
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list_metadata(&ListParams::default().labels(&format!("churn={chunk}")))
        .await
        .map(|l| l.items.len())
        .unwrap_or(usize::MAX)
}

/// Plugins of chunk `chunk` whose status the operator has written (`phase: Pending`).
async fn count_pending(api: &Api<VClusterPlugin>, chunk: &str) -> usize {
    api.list(&ListParams::default().labels(&format!("churn={chunk}")))
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.phase.as_ref())
                        .is_some_and(|phase| *phase == Phase::Pending)
                })
                .count()
        })
        .unwrap_or(usize::MAX)
}

/// vClusters the churned plugins name (none exists): spread over as many as the operator's
/// concurrency could use at once, as plugins spread over vClusters (the operator serializes the
/// reconciles of one vCluster's plugins under its workload lock).
const ABSENT_VCLUSTERS: usize = 64;

/// The vCluster plugin `name` names: `absent-<n>`, `n` from the name's number.
fn absent_vcluster(name: &str) -> String {
    let n: usize = name
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_default();
    format!("absent-{}", n % ABSENT_VCLUSTERS)
}

/// One chunk through create and delete, Cars and plugins at once: `n` of each, labelled
/// `churn=<chunk>`.
async fn churn_chunk(
    cars: &Api<DynamicObject>,
    host_cars: &Api<DynamicObject>,
    plugins: &Api<VClusterPlugin>,
    chunk: &str,
    n: usize,
) {
    let names: Vec<String> = (0..n).map(|i| format!("{chunk}-{i:05}")).collect();
    let create_cars = futures::stream::iter(names.iter().map(|name| async move {
        let car: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": name, "labels": {"churn": chunk}},
            "spec": {"type": "Audi", "seats": 4}
        }))
        .expect("car");
        cars.create(&PostParams::default(), &car)
            .await
            .expect("create a Car");
    }))
    .buffer_unordered(CONCURRENCY)
    .collect::<Vec<()>>();
    let create_plugins = futures::stream::iter(names.iter().map(|name| async move {
        let plugin: VClusterPlugin = serde_json::from_value(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": {"name": name, "labels": {"churn": chunk}},
            "spec": {"vcluster": {"name": absent_vcluster(name)},
                     "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}]}
        }))
        .expect("plugin");
        plugins
            .create(&PostParams::default(), &plugin)
            .await
            .expect("create a plugin");
    }))
    .buffer_unordered(CONCURRENCY)
    .collect::<Vec<()>>();
    tokio::join!(create_cars, create_plugins);
    // The host copies carry the virtual labels (vCluster copies labels as they are).
    tokio::join!(
        wait_count(format!("host copies of chunk {chunk}"), n, || {
            count_labelled(host_cars, chunk)
        }),
        wait_count(format!("Pending plugins of chunk {chunk}"), n, || {
            count_pending(plugins, chunk)
        }),
    );
    let selector = ListParams::default().labels(&format!("churn={chunk}"));
    cars.delete_collection(&DeleteParams::default(), &selector)
        .await
        .expect("delete the chunk's Cars");
    plugins
        .delete_collection(&DeleteParams::default(), &selector)
        .await
        .expect("delete the chunk's plugins");
    tokio::join!(
        wait_count(format!("host copies of chunk {chunk} left"), 0, || {
            count_labelled(host_cars, chunk)
        }),
        wait_count(format!("plugins of chunk {chunk} left"), 0, || {
            count_labelled(plugins, chunk)
        }),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_objects_through_create_and_delete_leave_no_memory_behind() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    prepare_operator_host(cp, &host).await;
    install_crds(&virtual_).await;
    syncer_is_cluster_admin(&host).await;
    syncer_is_cluster_admin(&virtual_).await;
    create_namespace(&host, HOST_NS).await;
    create_namespace(&virtual_, VIRTUAL_NS).await;

    // The runtime's plugin (the operator reconciles it too: its vCluster does not exist).
    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), HOST_NS);
    let own: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "cars", "namespace": HOST_NS},
        "spec": {"vcluster": {"name": VCLUSTER},
                 "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}]}
    }))
    .expect("plugin");
    plugins
        .patch(
            "cars",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&own),
        )
        .await
        .expect("the runtime's plugin");

    let runtime = RuntimeProcess(
        Command::new(workspace_binary(
            "vcp-syncer-runtime",
            "vcluster-plugin-syncer",
        ))
        .arg("--host-kubeconfig")
        .arg(cp.kubeconfig(Cluster::Host, Identity::Syncer))
        .arg("--virtual-kubeconfig")
        .arg(cp.kubeconfig(Cluster::Virtual, Identity::Syncer))
        .args(["--namespace", HOST_NS, "--plugin", "cars"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vcluster-plugin-syncer"),
    );
    let operator = OperatorProcess::start(
        "churn",
        cp.dir(),
        &OperatorOptions {
            kubeconfig: cp.kubeconfig(Cluster::Host, Identity::Operator),
            runtime_image: "vcp-test/runtime:churn".into(),
            abort_after_writes: None,
            stop_after_writes: None,
            leader_election: None,
            concurrency: None,
        },
    );
    let (runtime_pid, operator_pid) = (runtime.0.id(), operator.pid());

    let cars =
        Api::<DynamicObject>::namespaced_with(virtual_.clone(), VIRTUAL_NS, &cars_resource());
    let host_cars = Api::<DynamicObject>::namespaced_with(host.clone(), HOST_NS, &cars_resource());
    let began = Instant::now();
    churn_chunk(&cars, &host_cars, &plugins, "warmup", WARMUP).await;
    let before = levels(runtime_pid, operator_pid).await;
    eprintln!(
        "after the warm-up ({WARMUP} Cars, {WARMUP} plugins, {:?}): runtime {:.1} MiB, operator {:.1} MiB",
        began.elapsed(),
        before.0,
        before.1
    );

    let began = Instant::now();
    let mut peak = before;
    for chunk in 0..CHURN / CHUNK {
        churn_chunk(&cars, &host_cars, &plugins, &format!("c{chunk}"), CHUNK).await;
        peak.0 = peak.0.max(rss_mib(runtime_pid));
        peak.1 = peak.1.max(rss_mib(operator_pid));
    }
    let after = levels(runtime_pid, operator_pid).await;
    eprintln!(
        "after {CHURN} more of each ({:?}): runtime {:.1} MiB (highest reading between chunks \
         {:.1}), operator {:.1} MiB (highest {:.1})",
        began.elapsed(),
        after.0,
        peak.0,
        after.1,
        peak.1
    );
    for (who, before, after) in [
        ("the runtime", before.0, after.0),
        ("the operator", before.1, after.1),
    ] {
        assert!(
            after <= before * 1.10,
            "{who}'s resident set grew from {before:.1} MiB to {after:.1} MiB (more than 10 %) \
             over {CHURN} objects that came and went: per-object state outlives its object"
        );
    }
}
