//! End to end inside vCluster itself: vCluster's own syncer process (`cmd/vcluster start`, the
//! pinned `github.com/loft-sh/vcluster`, run by [`VClusterSyncer`]) with the embedded runtime
//! loaded as a v2 plugin, then with a Go v1 (legacy sidecar) plugin.
//!
//! The operator installs a `VClusterPlugin` (no image, `version: v2`) into the chart-rendered
//! StatefulSet; the test then does what the pod would do: it runs the init container the
//! operator added (its command, with the runtime image's binary being this workspace's
//! `vcluster-plugin-syncer` and its `/plugins` mount being the plugins folder), and starts the
//! real syncer with that folder. Every assertion reads vCluster's own log, the processes, the
//! API servers or their audit logs.
//!
//! vCluster's legacy plugin server binds `localhost:10099`, so one syncer runs at a time: this
//! binary has a single test that drives the steps in order, for each vCluster version of the
//! matrix (v0.30.0, the pinned one, and v0.36.1).
//!
//! A hook's host label comes back up. vCluster applies the plugin's `CreatePhysical` hook in
//! its host client (`pkg/util/pluginhookclient`, `plugin.DefaultManager.MutateObject`) before the
//! pod syncer's create, so the host pod is created with the label. On its next sync of that
//! pod, vCluster's pod syncer (`pkg/controllers/resources/pods/translate/diff.go`,
//! `translate.LabelsBidirectionalUpdateFunction`) sees a host label the virtual pod lacks and
//! copies it up to the virtual pod, then records the virtual pod's labels in the host pod's
//! annotation `vcluster.loft.sh/labels` (one update of the host pod, which leaves the label
//! alone). Both steps read only the host object, so a Go plugin's hook label is copied up the
//! same way: the test loads a Go v2 plugin (`tests/vcluster-go/cmd/go-pod-hook`, vCluster's own
//! protocol definitions, as the vcluster-sdk serves them) beside the runtime, and asserts the
//! copy-up of both hooks' labels and the single annotation update.
//!
//! A v1 sidecar plugin works inside vCluster too, when vCluster's configuration lists it (see
//! [`v1_sidecar`]): the operator installs an image plugin with `version: v1`, the test runs the
//! sidecar container the operator added (`tests/vcluster-go/cmd/go-pod-hook-v1`, vCluster's own
//! `pkg/plugin/v1/remote` definitions, with the container's env and args), and vCluster's pod
//! syncer creates the host pod with that hook's label, its value from `PLUGIN_CONFIG`. Unlisted,
//! in a vCluster without other plugins, the plugin registers but its hook is never called.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{Car, VClusterPlugin};
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, VCLUSTER_RELEASE, VClusterSyncer,
    wait_for,
};

const RUNTIME_IMAGE: &str = "vcp-test/runtime:inside";
/// The runtime image's binary, as the operator's init container names it.
const IMAGE_BINARY: &str = "/usr/local/bin/vcluster-plugin-syncer";
const PLUGIN: &str = "cars-and-pods";
/// The folder of the Go plugin (`GO_POD_HOOK`, at each version) in the plugins folder.
const GO_PLUGIN: &str = "go-pod-hook";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The v1 sidecar plugin (`GO_POD_HOOK_V1`): its `VClusterPlugin`, its image as the operator
/// writes it into the StatefulSet, and the key of its hook's label (its `-label` argument).
const V1_PLUGIN: &str = "go-hook-v1";
const V1_IMAGE: &str = "vcp-test/go-pod-hook-v1:inside";
const V1_LABEL: &str = "created-by-v1-plugin";
/// What vCluster logs once its controllers run (`pkg/setup/controllers.go`).
const SYNCER_STARTED: &str = "Successfully started vCluster controllers";

/// One vCluster version under test: its own host namespace and virtual namespace (the virtual
/// API server is shared, and a syncer syncs every virtual namespace), its chart and its syncer.
struct Target {
    /// The version, as `scripts/oracles` names it.
    version: &'static str,
    /// The vCluster's host namespace.
    ns: String,
    /// The virtual namespace of this version's objects.
    vns: String,
    /// vCluster's chart at that version.
    chart: PathBuf,
    /// vCluster's syncer at that version (`scripts/oracles`).
    syncer: PathBuf,
}

impl Target {
    /// Every version of the matrix ([`vcp_tests::VCLUSTER_VERSIONS`]), with its syncer and
    /// chart from `scripts/oracles build` (`VCLUSTER_SYNCER`, `VCLUSTER_CHART` and their
    /// `_V0_36` twins).
    fn all() -> Vec<Target> {
        let paths = vcp_tests::oracle_paths();
        vcp_tests::VCLUSTER_VERSIONS
            .into_iter()
            .map(|(version, suffix)| {
                let tag = version.replace('.', "");
                Target {
                    version,
                    ns: format!("vc-inside-{tag}"),
                    vns: format!("team-{tag}"),
                    chart: paths[&format!("VCLUSTER_CHART{suffix}")].clone(),
                    syncer: paths[&format!("VCLUSTER_SYNCER{suffix}")].clone(),
                }
            })
            .collect()
    }

    /// vCluster's user on the host: the pod template's service account, as the chart names it.
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:vc-{VCLUSTER_RELEASE}", self.ns)
    }
}

/// The runtime binary, built by cargo with this test's profile and target folder (nothing is
/// rebuilt when `cargo test --workspace` already built it).
fn runtime_binary() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| vcp_tests::workspace_binary("vcp-syncer-runtime", "vcluster-plugin-syncer"))
}

/// Runs the init containers of the StatefulSet's pod template that mount the `plugins` volume,
/// in order, as the kubelet would for a new pod: the command line as the template gives it,
/// with the runtime image's binary ([`IMAGE_BINARY`]) being this build's, and the `plugins`
/// mount path being `folder`. Returns the names of the init containers run.
fn run_plugin_init_containers(sts: &StatefulSet, folder: &Path) -> Vec<String> {
    let spec = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod template");
    let mut ran = Vec::new();
    for init in spec.init_containers.iter().flatten() {
        let Some(mount) = init
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "plugins")
        else {
            continue;
        };
        assert_eq!(
            init.image.as_deref(),
            Some(RUNTIME_IMAGE),
            "only the runtime image's init containers can run here: {init:?}"
        );
        let mut argv: Vec<String> = init
            .command
            .iter()
            .flatten()
            .chain(init.args.iter().flatten())
            .cloned()
            .collect();
        assert_eq!(argv.first().map(String::as_str), Some(IMAGE_BINARY));
        argv[0] = runtime_binary().display().to_string();
        for arg in &mut argv[1..] {
            if let Some(rest) = arg.strip_prefix(&mount.mount_path) {
                *arg = format!("{}{rest}", folder.display());
            }
        }
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .expect("run the init container's command");
        assert!(
            out.status.success(),
            "init container {}: {argv:?} failed:\n{}",
            init.name,
            String::from_utf8_lossy(&out.stderr)
        );
        ran.push(init.name.clone());
    }
    ran
}

/// Whether process `pid` is running (a zombie has exited).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// The runtime's own parent watch (`watch_parent`, `syncer-runtime/src/v2/server.rs`): vCluster's
/// syncer process alone is killed (SIGKILL to its pid, not to its process group: it stops none
/// of its plugins, as when vCluster's process dies), and the runtime `runtime`, whose parent it
/// was, stops by itself within 15 s. It stops in order: its gRPC socket is gone (the session's
/// shutdown removes it; a killed or aborted process leaves it). Its own log line ("the host
/// process is gone: stopping") cannot be read: a v2 plugin's output reaches vCluster's log only
/// through vCluster's `StreamStdio` call (go-plugin), which died with vCluster.
async fn runtime_exits_without_its_parent(syncer: &VClusterSyncer, runtime: u32) {
    let parent = std::fs::read_to_string(format!("/proc/{runtime}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        });
    assert_eq!(
        parent,
        syncer.pid(),
        "the runtime {runtime} is vCluster's child"
    );
    let socket = format!("/plugin{runtime}-");
    let socket = std::fs::read_to_string("/proc/net/unix")
        .expect("/proc/net/unix")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .find(|path| path.contains(&socket))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("the runtime {runtime} listens on a socket {socket}<n>"));
    syncer
        .kill_syncer_only()
        .expect("kill vCluster's syncer process");
    let killed = std::time::Instant::now();
    while running(runtime) {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "the runtime {runtime} still runs 15 s after its parent, vCluster's syncer, was killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "the runtime {runtime} exited {:?} after its parent was killed",
        killed.elapsed()
    );
    assert!(
        !socket.exists(),
        "the runtime stopped in order: its socket {} is removed",
        socket.display()
    );
}

/// A fresh plugins folder, as a new pod's emptyDir `plugins`.
fn fresh_plugins_folder(cp: &ControlPlane, n: &str) -> PathBuf {
    let dir = cp.dir().join(format!("inside-plugins-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plugins folder");
    dir
}

async fn statefulset(admin: &Client, t: &Target) -> StatefulSet {
    Api::<StatefulSet>::namespaced(admin.clone(), &t.ns)
        .get(VCLUSTER_RELEASE)
        .await
        .expect("the vCluster's StatefulSet")
}

async fn create_virtual_pod(virtual_: &Client, t: &Target, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": t.vns, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(virtual_.clone(), &t.vns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create virtual pod {name}: {e}"))
}

async fn host_pod(host: &Client, t: &Target, virtual_name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(host.clone(), &t.ns);
    let name = format!("{virtual_name}-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        let name = name.clone();
        async move { pods.get_opt(&name).await.ok().flatten() }
    })
    .await
}

/// Creates virtual Pod `name` and asserts that its host copy carries the hook accepted in step
/// 4 (label `created-by-plugin=pod-hook-v2`) and no `hostNetwork`: a hook the operator has not
/// accepted (`syncer-runtime/src/acceptance.rs`) never reaches a pod. `context` says what was
/// refused or is pending, for the log line and the failure message.
async fn assert_accepted_hook_in_force(
    host: &Client,
    virtual_: &Client,
    t: &Target,
    name: &str,
    context: &str,
) {
    create_virtual_pod(virtual_, t, name).await;
    let pod = host_pod(host, t, name).await;
    let label = pod.labels().get("created-by-plugin").map(String::as_str);
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network);
    eprintln!("{context}: new host pod labels {label:?}, hostNetwork {host_network:?}");
    assert_eq!(
        label,
        Some("pod-hook-v2"),
        "{context}: the accepted hooks stay in force"
    );
    assert_eq!(host_network, None, "{context}: hostNetwork");
}

async fn apply_car(virtual_: &Client, t: &Target, name: &str, type_: &str) {
    let car: Car = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": name, "namespace": t.vns},
        "spec": {"type": type_}
    }))
    .expect("car");
    Api::<Car>::namespaced(virtual_.clone(), &t.vns)
        .patch(
            name,
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&car),
        )
        .await
        .unwrap_or_else(|e| panic!("apply car {name}: {e}"));
}

/// The writes vCluster's identity made to host pod `name` since `t`, once the audit log holds
/// every request answered before the call.
async fn pod_writes(t: &Target, name: &str, since: SystemTime) -> Vec<(String, String)> {
    Audit::writes()
        .by_user(&t.user())
        .in_namespace(&t.ns)
        .resource("pods")
        .since(since)
        .caught_up()
        .await
        .attempts()
        .into_iter()
        .filter(|w| w.object_name == name)
        .map(|w| (w.verb, w.uri))
        .collect()
}

/// The first event of `watch` (a watch of the host pod `host_name`) that `pick` takes, within
/// [`TIMEOUT`]; panics naming `what` when the watch ends or errs first, or the time passes.
async fn next_event(
    watch: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin),
    host_name: &str,
    what: &str,
    pick: impl Fn(WatchEvent<Pod>) -> Option<Pod>,
) -> Pod {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            match watch.next().await {
                Some(Ok(event)) => {
                    if let Some(pod) = pick(event) {
                        break pod;
                    }
                }
                other => panic!("watch of {host_name} ended before {what}: {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: no such event of {host_name} within {TIMEOUT:?}"))
}

/// A virtual Pod `name` synced by vCluster's own pod syncer while plugins with `CreatePhysical`
/// pod hooks run: the host pod carries each hook's label (`hooked`: key, value) in the object its
/// create stored (the watch's ADDED event), so vCluster applied the hooks before its create
/// (vCluster's log names its pod syncer as the creator). vCluster then copies the labels up to
/// the virtual pod and records them in the host pod's annotation `vcluster.loft.sh/labels`: its
/// one update of the host pod (the audit log), which leaves the labels as created.
async fn assert_hooked_create(
    host: &Client,
    virtual_: &Client,
    t: &Target,
    syncer: &VClusterSyncer,
    name: &str,
    hooked: &[(&str, &str)],
) {
    let has_hooks = |labels: &std::collections::BTreeMap<String, String>| {
        hooked
            .iter()
            .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
    };
    let since = SystemTime::now();
    let host_name = format!("{name}-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), &t.ns);
    let mut watch = host_pods
        .watch(
            &WatchParams::default().fields(&format!("metadata.name={host_name}")),
            "0",
        )
        .await
        .expect("watch the host pod")
        .boxed();
    create_virtual_pod(virtual_, t, name).await;
    let added = next_event(
        &mut watch,
        &host_name,
        "the host pod's create",
        |e| match e {
            WatchEvent::Added(pod) => Some(pod),
            _ => None,
        },
    )
    .await;
    assert!(
        has_hooks(added.labels()),
        "the created host pod carries every hook's label {hooked:?}: {:?}",
        added.labels()
    );
    // vCluster's own log: its pod syncer (controller "pod") created that host object, and that
    // very line names it.
    let create = format!(
        "Create host object\t{{\"component\": \"vcluster\", \"controller\": \"pod\", \"namespace\": \"{}\", \"name\": \"{name}\"",
        t.vns
    );
    let log = syncer.wait_log(&create, 1, TIMEOUT).await;
    let line = log
        .lines()
        .find(|l| l.contains(&create))
        .unwrap_or_default();
    assert!(
        line.contains(&format!("\"object\": \"{}/{host_name}\"", t.ns)),
        "vCluster's create of {host_name} names it: {line}"
    );
    // vCluster then copies the hook's host label up to the virtual pod (its pod syncer syncs
    // labels both ways: pkg/controllers/resources/pods/translate/diff.go), and records the
    // virtual pod's labels in the host pod's annotation `vcluster.loft.sh/labels`: its one
    // update of the host pod, which does not touch the label.
    let virtual_pods: Api<Pod> = Api::namespaced(virtual_.clone(), &t.vns);
    wait_for(TIMEOUT, || {
        let api = virtual_pods.clone();
        async move { has_hooks(api.get(name).await.ok()?.labels()).then_some(()) }
    })
    .await;
    let records = |annotations: &std::collections::BTreeMap<String, String>| {
        annotations
            .get("vcluster.loft.sh/labels")
            .is_some_and(|l| hooked.iter().all(|(k, _)| l.contains(k)))
    };
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        let name = host_name.clone();
        async move { records(api.get(&name).await.ok()?.annotations()).then_some(()) }
    })
    .await;
    // Evidence that the syncer kept working after those writes: a second pod is synced later.
    create_virtual_pod(virtual_, t, &format!("{name}-next")).await;
    host_pod(host, t, &format!("{name}-next")).await;
    let writes = pod_writes(t, &host_name, since).await;
    assert_eq!(
        writes.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        ["create", "update"],
        "vCluster created host pod {host_name} with the hooks' labels, then recorded the copied-up labels: {writes:?}"
    );
    // That update, as the watch saw it: the labels are those of the create.
    let modified = next_event(
        &mut watch,
        &host_name,
        "vCluster's update of the host pod",
        |e| match e {
            WatchEvent::Modified(pod) => Some(pod),
            _ => None,
        },
    )
    .await;
    assert_eq!(modified.labels(), added.labels());
    assert!(
        records(modified.annotations()),
        "{:?}",
        modified.annotations()
    );
    // v0.30.0 logs each patch it applies (pkg/patcher/apply.go, at info level); v0.36.1 logs
    // them only at verbosity 1, so there the watch above is the only record.
    if t.version == "v0.30.0" {
        let host_patch = syncer
            .log()
            .lines()
            .find(|l| {
                l.contains("Apply host patch")
                    && l.contains(&format!("\"object\": \"{}/{host_name}\"", t.ns))
            })
            .expect("vCluster logs its patch of the host pod")
            .to_string();
        assert!(
            host_patch.contains("vcluster.loft.sh/labels")
                && !host_patch.contains(r#"\"labels\":{"#),
            "vCluster's update of the host pod only records the virtual labels: {host_patch}"
        );
    }
}

fn plugin_spec(label_value: &str) -> Value {
    json!({
        "vcluster": {"name": VCLUSTER_RELEASE},
        "version": "v2",
        "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}],
        "hooks": [{"name": "pod-hook", "apiVersion": "v1", "kind": "Pod",
                   "events": ["CreatePhysical"], "labels": {"created-by-plugin": label_value}}]
    })
}

/// The matrix: each version in turn (one syncer at a time), each in its own namespaces.
#[tokio::test]
async fn the_embedded_runtime_inside_vclusters_own_syncer() {
    for target in Target::all() {
        eprintln!("vCluster {}: {}", target.version, target.syncer.display());
        inside(&target).await;
    }
}

async fn inside(t: &Target) {
    let cp = ControlPlane::shared();
    let admin = vcp_tests::start_shared_operator(RUNTIME_IMAGE).await;
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, &t.ns).await;
    vcp_tests::install_vcluster_chart_from(&host, &t.chart, &t.ns, "")
        .await
        .expect("install vCluster's chart");
    vcp_tests::create_namespace(&virtual_, &t.vns).await;
    // What kube-controller-manager's serviceaccount controller would make (the virtual control
    // plane runs none); vCluster's pod syncer reads a pod's service account.
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": t.vns}
    }))
    .expect("service account");
    Api::<ServiceAccount>::namespaced(virtual_.clone(), &t.vns)
        .patch(
            "default",
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&sa),
        )
        .await
        .expect("default service account");

    // The operator installs the embedded runtime as a v2 plugin into the chart's StatefulSet.
    vcp_tests::create_plugin(&admin, &t.ns, PLUGIN, plugin_spec("pod-hook")).await;
    vcp_tests::wait_ready(&admin, &t.ns, PLUGIN, "True", None, TIMEOUT).await;
    let sts = statefulset(&admin, t).await;

    // The pod: its init containers fill the plugins folder, then vCluster's syncer starts.
    let folder = fresh_plugins_folder(cp, &format!("{}-1", t.ns));
    assert_eq!(run_plugin_init_containers(&sts, &folder), [PLUGIN]);
    let plugin_path = folder.join(PLUGIN).join("plugin");
    assert_eq!(
        std::fs::read(&plugin_path).expect("installed plugin"),
        std::fs::read(runtime_binary()).expect("runtime binary")
    );
    // Beside it, a v2 plugin written in Go (tests/vcluster-go/cmd/go-pod-hook, a pod hook adding
    // `created-by-go-plugin`), built against the same vCluster version's SDK, copied in as a v2
    // image's init container does (`cp -r /plugin /plugins/<name>`).
    let go_plugin = folder.join(GO_PLUGIN);
    std::fs::create_dir_all(&go_plugin).expect("Go plugin folder");
    std::fs::copy(
        vcp_tests::oracle_path_at("GO_POD_HOOK", t.version),
        go_plugin.join("plugin"),
    )
    .expect("copy the Go plugin");
    let mut syncer =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("start vCluster's syncer");
    // The syncer is this target's vCluster: the version it reports at start.
    assert_eq!(
        syncer.reported_version().as_deref(),
        Some(t.version),
        "the version vCluster's syncer {} reports (its log's `vCluster version` line)",
        t.syncer.display()
    );

    // 1. vCluster loaded the plugin, registered its declared pod hook, and runs it.
    let log = syncer
        .wait_log("Successfully loaded plugin", 2, TIMEOUT)
        .await;
    for plugin in [&plugin_path, &go_plugin.join("plugin")] {
        assert!(
            log.contains(&format!("\"plugin\": \"{}\"", plugin.display())),
            "vCluster loaded {}; log:\n{log}",
            plugin.display()
        );
    }
    assert!(
        log.contains(&format!(
            "Register client hook for v1 Pod in plugin {}",
            plugin_path.display()
        )),
        "vCluster registered the CreatePhysical pod hook; log:\n{log}"
    );
    let plugin_pids: Vec<u32> = syncer
        .children()
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .as_deref()
                == Some(&plugin_path)
        })
        .collect();
    assert_eq!(
        plugin_pids.len(),
        1,
        "one runtime process, started by vCluster from {}",
        plugin_path.display()
    );

    // 2. A Car created in the virtual cluster reaches the host through the runtime inside
    //    vCluster: the host copy is written by vCluster's own identity (the plugin runs with the
    //    host config vCluster hands its plugins).
    let started = SystemTime::now();
    apply_car(&virtual_, t, "tesla", "Tesla").await;
    let host_cars: Api<Car> = Api::namespaced(host.clone(), &t.ns);
    let host_car_name = format!("tesla-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    let host_tesla = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        let name = host_car_name.clone();
        async move { api.get_opt(&name).await.ok().flatten() }
    })
    .await;
    assert_eq!(host_tesla.spec.type_, "Tesla");
    assert_eq!(
        host_tesla
            .labels()
            .get("vcluster.loft.sh/managed-by")
            .map(String::as_str),
        Some(VCLUSTER_RELEASE)
    );
    let car_creates: Vec<_> = Audit::writes()
        .in_namespace(&t.ns)
        .resource("cars")
        .verb("create")
        .since(started)
        .succeeded();
    assert!(
        car_creates
            .iter()
            .any(|w| w.user == t.user() && w.object_name == host_car_name),
        "the host Car was created by vCluster's identity: {car_creates:?}"
    );

    // 3. A virtual Pod synced by vCluster's own pod syncer, with both plugins' CreatePhysical
    //    hooks in its host create.
    assert_hooked_create(
        &host,
        &virtual_,
        t,
        &syncer,
        "web",
        &[
            ("created-by-plugin", "pod-hook"),
            ("created-by-go-plugin", "go-hook"),
        ],
    )
    .await;

    // 4. A change to the VClusterPlugin takes effect in the running plugin.
    let plugins: Api<VClusterPlugin> = Api::namespaced(admin.clone(), &t.ns);
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": plugin_spec("pod-hook-v2")})),
        )
        .await
        .expect("change the plugin");
    // The runtime reads its VClusterPlugin: each new pod is created with the hook of the spec
    // in force, so wait for one with the new value.
    let mut n = 0;
    let changed = loop {
        n += 1;
        let name = format!("after-{n}");
        create_virtual_pod(&virtual_, t, &name).await;
        let pod = host_pod(&host, t, &name).await;
        if pod.labels().get("created-by-plugin").map(String::as_str) == Some("pod-hook-v2") {
            break pod;
        }
        assert!(n < 20, "the changed hook never took effect");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(changed.labels()["created-by-plugin"], "pod-hook-v2");

    // 4b. An edit the operator refuses never runs, though the runtime sees it first (the
    // runtime applies only hooks the operator accepted: `acceptance`). The edited hook would
    // put vCluster's host pods on the node's network.
    let edited = plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hooks": [{
                "name": "pod-hook", "apiVersion": "v1", "kind": "Pod", "events": ["CreatePhysical"],
                "labels": {"created-by-plugin": "refused"},
                "jsonPatch": [{"op": "add", "path": "/spec/hostNetwork", "value": true}]
            }]}})),
        )
        .await
        .expect("edit the hooks");
    let edited_version = edited.resource_version().unwrap_or_default();
    vcp_tests::wait_ready(
        &admin,
        &t.ns,
        PLUGIN,
        "False",
        Some("PolicyDenied"),
        TIMEOUT,
    )
    .await;
    // the runtime has read the edit: it restarted its syncers on that very version of the
    // plugin (its log, relayed by vCluster's syncer)
    let restart = wait_for(TIMEOUT, || {
        let log = syncer.log();
        let version = format!("\"resource_version\":\"{edited_version}\"");
        async move {
            log.lines()
                .find(|l| {
                    l.contains(vcp_syncer_runtime::runtime::RESTARTED) && l.contains(&version)
                })
                .map(str::to_string)
        }
    })
    .await;
    eprintln!("the runtime restarted on the refused edit: {restart}");
    assert_accepted_hook_in_force(
        &host,
        &virtual_,
        t,
        "after-refused",
        &format!("refused edit read by the runtime at resourceVersion {edited_version}"),
    )
    .await;

    // 4c. Deleting the plugin accepts nothing: the operator's Terminating status says
    // WorkloadPatched=True for the deleting generation without judging it (the seventh
    // security review). A finalizer of the author's holds the plugin in deletion.
    let live = plugins.get(PLUGIN).await.expect("read the plugin");
    let mut finalizers = live.finalizers().to_vec();
    finalizers.push("example.com/hold".into());
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": finalizers, "resourceVersion": live.resource_version()
            }})),
        )
        .await
        .expect("add the author's finalizer");
    plugins
        .delete(PLUGIN, &kube::api::DeleteParams::default())
        .await
        .expect("delete the plugin");
    let terminating =
        vcp_tests::wait_ready(&admin, &t.ns, PLUGIN, "False", Some("Terminating"), TIMEOUT).await;
    let version = terminating.resource_version().unwrap_or_default();
    // the runtime has read that very version of the plugin (its log, relayed by vCluster)
    let deleting_seen = wait_for(TIMEOUT, || {
        let log = syncer.log();
        let version = version.clone();
        async move {
            log.lines()
                .any(|l| {
                    l.contains(vcp_syncer_runtime::runtime::DELETING)
                        && l.contains(&format!("\"resource_version\":\"{version}\""))
                })
                .then_some(())
        }
    })
    .await;
    assert_accepted_hook_in_force(
        &host,
        &virtual_,
        t,
        "while-deleting",
        &format!("plugin being deleted (read by the runtime at resourceVersion {version}: {deleting_seen:?})"),
    )
    .await;
    // the operator finishes its cleanup (its finalizer goes), then the author lets go
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let p = plugins.get(PLUGIN).await.ok()?;
            (p.finalizers() == ["example.com/hold"]).then_some(())
        }
    })
    .await;
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the author's finalizer");

    // 5. The plugin deleted (4c), and the syncer restarted: a healthy vCluster without plugin.
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move { plugins.get_opt(PLUGIN).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let sts = statefulset(&admin, t).await;
    // The runtime notices its parent is gone and exits.
    runtime_exits_without_its_parent(&syncer, plugin_pids[0]).await;
    syncer
        .stop()
        .expect("stop what is left of vCluster's syncer");
    let folder = fresh_plugins_folder(cp, &format!("{}-2", t.ns));
    assert!(
        run_plugin_init_containers(&sts, &folder).is_empty(),
        "the operator removed the plugin's init container"
    );
    let before = syncer.log().len();
    let syncer2 =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("restart vCluster's syncer");
    let log = syncer2.log()[before..].to_string();
    assert!(log.contains(SYNCER_STARTED), "{log}");
    assert!(!log.contains("Successfully loaded plugin"), "{log}");
    assert!(syncer2.children().is_empty(), "no plugin process");
    let since = SystemTime::now();
    create_virtual_pod(&virtual_, t, "plain").await;
    let plain = host_pod(&host, t, "plain").await;
    assert!(plain.labels().get("created-by-plugin").is_none());
    assert_eq!(
        pod_writes(t, &plain.name_any(), since)
            .await
            .iter()
            .map(|(v, _)| v.as_str())
            .collect::<Vec<_>>(),
        ["create"]
    );
    drop(syncer);

    // 6. A v1 (legacy sidecar) plugin in Go, installed by the operator.
    v1_sidecar(cp, &admin, &host, &virtual_, t, syncer2).await;

    // The virtual API server is shared: the next version's syncer would sync these too.
    let dp = kube::api::DeleteParams::default();
    let lp = kube::api::ListParams::default();
    Api::<Pod>::namespaced(virtual_.clone(), &t.vns)
        .delete_collection(&dp, &lp)
        .await
        .expect("delete the virtual pods");
    Api::<Car>::namespaced(virtual_.clone(), &t.vns)
        .delete_collection(&dp, &lp)
        .await
        .expect("delete the virtual Cars");
}

/// A v1 sidecar plugin inside vCluster: the operator installs `VClusterPlugin` [`V1_PLUGIN`]
/// (`image`, `version: v1`, `args`, `config`), and the test runs what the pod would run, the
/// sidecar container the operator added (the Go v1 plugin at `t`'s version, with the container's
/// env and args: [`start_v1_sidecar`]) beside vCluster's syncer, after stopping `running` (a
/// changed pod template is a new pod).
///
/// vCluster's legacy plugin server (`pkg/plugin/v1/plugin.go`, the same at v0.30.0 and v0.36.1
/// but for its error handling) always listens on `localhost:10099` and accepts a plugin's
/// `RegisterPlugin` (name, address, client hooks) at any time. Two things depend on the
/// syncer's configuration listing the plugin under `plugin:` with no `version` (its
/// `LegacyOptions`, `pkg/config/config.go`: an entry with a `version` is not waited for unless
/// `optional`):
/// - only a listed plugin is waited for (`waitForPlugins`) before the controllers start;
/// - vCluster's clients run hooks only when, as they are made, some plugin is known
///   (`pluginhookclient.NewPluginClient`: `DefaultManager.HasPlugins()`, which for legacy plugins
///   is "the list is not empty", `Manager.Start`). So in a vCluster with no v2 plugin, an
///   unlisted v1 sidecar registers and its hook is never called: step 6a shows it. The
///   operator writes only the workload, never the vCluster's configuration, so such a plugin
///   needs the vCluster's values to list it (then the chart renders its own sidecar as well).
///
/// With the plugin listed (6b), vCluster waits for it, and its pod syncer creates the host pod
/// with the v1 hook's label, whose value came from `PLUGIN_CONFIG`, in the create.
async fn v1_sidecar(
    cp: &'static ControlPlane,
    admin: &Client,
    host: &Client,
    virtual_: &Client,
    t: &Target,
    mut running: VClusterSyncer,
) {
    let value = format!("from-config-{}", t.version.replace('.', ""));
    vcp_tests::create_plugin(
        admin,
        &t.ns,
        V1_PLUGIN,
        json!({
            "vcluster": {"name": VCLUSTER_RELEASE},
            "image": V1_IMAGE, "version": "v1",
            "args": ["-label", V1_LABEL],
            "config": {"label": value},
        }),
    )
    .await;
    vcp_tests::wait_ready(admin, &t.ns, V1_PLUGIN, "True", None, TIMEOUT).await;
    let sts = statefulset(admin, t).await;
    running.stop().expect("stop vCluster's syncer");
    let registered_hook = format!("Register client hook for v1 Pod in plugin {V1_PLUGIN}");

    // 6a. Not listed under `plugin:` (the chart's configuration as it is): vCluster starts its
    //     controllers without the plugin running, accepts its registration afterwards, and
    //     never calls its hook, since no plugin was known when its clients were made.
    let folder = fresh_plugins_folder(cp, &format!("{}-3", t.ns));
    let syncer =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("start vCluster's syncer");
    let plugin_log = cp.dir().join(format!("{V1_PLUGIN}-{}-a.log", t.ns));
    let mut sidecar = start_v1_sidecar(&sts, t, &plugin_log);
    let log = syncer.wait_log(&registered_hook, 1, TIMEOUT).await;
    assert!(
        log.contains(&format!("Registering plugin {V1_PLUGIN}")),
        "{log}"
    );
    assert!(
        !log.contains(&format!("Waiting for plugin {V1_PLUGIN}")),
        "{log}"
    );
    let since = SystemTime::now();
    create_virtual_pod(virtual_, t, "unlisted").await;
    let unlisted = host_pod(host, t, "unlisted").await;
    assert_eq!(
        unlisted.labels().get(V1_LABEL),
        None,
        "vCluster does not call an unlisted v1 plugin's hook when it has no other plugin"
    );
    assert_eq!(
        pod_writes(t, &unlisted.name_any(), since)
            .await
            .iter()
            .map(|(v, _)| v.as_str())
            .collect::<Vec<_>>(),
        ["create"]
    );
    let plugin_said = wait_for(TIMEOUT, || async {
        let said = std::fs::read_to_string(&plugin_log).ok()?;
        said.contains(&format!("Registered plugin {V1_PLUGIN}"))
            .then_some(said)
    })
    .await;
    assert!(
        !plugin_said.contains("Mutate CreatePhysical"),
        "the plugin registered and was never called:\n{plugin_said}"
    );
    sidecar.kill().await.expect("stop the plugin");
    drop(syncer);

    // 6b. Listed under `plugin:` with no version, as the chart's config Secret `vc-config-<name>`
    //     (`chart/templates/config-secret.yaml`: the release's values as `config.yaml`) holds it
    //     when the vCluster's values list the plugin there; the operator writes only the
    //     StatefulSet, so the test adds that entry (`start --set`). vCluster waits for the plugin
    //     before it starts its controllers; the sidecar starts while it waits.
    let folder = fresh_plugins_folder(cp, &format!("{}-4", t.ns));
    let before = VClusterSyncer::log_of(cp, &t.ns, VCLUSTER_RELEASE).len();
    let starting = {
        let (ns, binary) = (t.ns.clone(), t.syncer.clone());
        let sets = vec![format!("plugin.{V1_PLUGIN}.image={V1_IMAGE}")];
        tokio::task::spawn_blocking(move || {
            VClusterSyncer::start_with(cp, &ns, VCLUSTER_RELEASE, &folder, Some(&binary), &sets)
        })
    };
    let waiting = format!("Waiting for plugin {V1_PLUGIN} to register...");
    let log = wait_for(TIMEOUT, || async {
        let log = VClusterSyncer::log_of(cp, &t.ns, VCLUSTER_RELEASE);
        log.get(before..)
            .filter(|l| l.contains(&waiting))
            .map(str::to_string)
    })
    .await;
    assert!(!log.contains(SYNCER_STARTED), "{log}");
    let plugin_log = cp.dir().join(format!("{V1_PLUGIN}-{}-b.log", t.ns));
    let mut sidecar = start_v1_sidecar(&sts, t, &plugin_log);
    let syncer = starting
        .await
        .expect("the syncer's start")
        .expect("start vCluster's syncer with the plugin listed");
    let log = syncer.log()[before..].to_string();
    let order = [
        waiting.clone(),
        format!("Registering plugin {V1_PLUGIN}"),
        format!("Plugin {V1_PLUGIN} has successfully registered"),
        SYNCER_STARTED.to_string(),
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|n| {
            log.find(n.as_str())
                .unwrap_or_else(|| panic!("vCluster's log holds {n:?}:\n{log}"))
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "vCluster waited for the plugin before it started its controllers: {order:?} at {at:?}:\n{log}"
    );
    assert!(log.contains(&registered_hook), "{log}");
    assert_hooked_create(
        host,
        virtual_,
        t,
        &syncer,
        "web-v1",
        &[(V1_LABEL, value.as_str())],
    )
    .await;
    let plugin_said = std::fs::read_to_string(&plugin_log).unwrap_or_default();
    assert!(
        plugin_said.contains(&format!(
            "Mutate CreatePhysical v1 Pod {}/web-v1-x-{}-x-{VCLUSTER_RELEASE}",
            t.ns, t.vns
        )),
        "vCluster called the plugin's Mutate with the host pod:\n{plugin_said}"
    );
    drop(syncer);
    sidecar.kill().await.expect("stop the plugin");
    vcp_tests::delete_plugin(admin, &t.ns, V1_PLUGIN, TIMEOUT).await;
}

/// Starts the v1 sidecar container [`V1_PLUGIN`] of the StatefulSet's pod template as the
/// kubelet would beside the syncer container: its image ([`V1_IMAGE`], no `command`: the image's
/// entrypoint) is the Go v1 plugin at `t`'s version (`GO_POD_HOOK_V1`), run with the container's
/// `args` and with exactly the container's environment (nothing of the test's own). Its output
/// goes to `log`; it is killed when dropped.
fn start_v1_sidecar(sts: &StatefulSet, t: &Target, log: &Path) -> tokio::process::Child {
    let container = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == V1_PLUGIN))
        .expect("the operator's v1 sidecar container");
    assert_eq!(container.image.as_deref(), Some(V1_IMAGE));
    assert_eq!(container.command, None, "the image's entrypoint runs");
    assert_eq!(container.env_from, None);
    let env: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .map(|e| {
            assert!(e.value_from.is_none(), "{e:?}");
            (e.name.clone(), e.value.clone().unwrap_or_default())
        })
        .collect();
    tokio::process::Command::new(vcp_tests::oracle_path_at("GO_POD_HOOK_V1", t.version))
        .args(container.args.iter().flatten())
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("plugin log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start the Go v1 plugin")
}
