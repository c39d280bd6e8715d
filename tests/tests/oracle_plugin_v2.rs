//! Rust plugins loaded by vCluster's own v2 plugin loader.
//!
//! The driver `tests/vcluster-go/cmd/plugin-loader` (built by `scripts/oracles` from
//! `github.com/loft-sh/vcluster` at each version of [`vcp_tests::VCLUSTER_VERSIONS`]: v0.30.0
//! and v0.36.1; every test runs at both, one after the other) runs `pkg/plugin/v2`'s `Manager` — the code the
//! vCluster syncer uses to find `<folder>/<name>/plugin`, start it with go-plugin, send it
//! `Initialize`, read its `GetPluginConfig`, call `SetLeader` and `MutateObject` — against this
//! binary's control plane. The plugins are this workspace's binaries: the tutorial's Car syncer
//! and pod hook (`syncer-runtime/examples/car_syncer.rs`, unchanged) and the declarative runtime
//! `vcluster-plugin-syncer`, installed into its folder by its own `install-plugin` command (the
//! operator's init container).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use vcp_crds::{Car, VClusterPlugin};
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, string_map, wait_for};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The tutorial's Car syncer example and the runtime binary, built by cargo with this test's
/// profile and target folder (nothing is rebuilt when `cargo test --workspace` already built
/// them): `(car_syncer, vcluster-plugin-syncer)`.
fn plugin_binaries() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        (
            vcp_tests::workspace_example("vcp-syncer-runtime", "car_syncer"),
            vcp_tests::workspace_binary("vcp-syncer-runtime", "vcluster-plugin-syncer"),
        )
    })
}

/// A fresh plugins folder (vCluster's `/plugins`).
fn plugins_folder(test: &str) -> PathBuf {
    let dir = ControlPlane::shared().dir().join(format!("plugins-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plugins folder");
    dir
}

/// Copies `binary` to `<folder>/<name>/plugin`, as a v2 plugin image's `cp -r /plugin` does.
fn install_copy(folder: &Path, name: &str, binary: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let dir = folder.join(name);
    std::fs::create_dir_all(&dir).expect("plugin folder");
    let target = dir.join("plugin");
    std::fs::copy(binary, &target).expect("copy plugin");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// The Go driver running vCluster's loader, with its event stream.
struct Loader {
    child: Child,
    stdin: Option<ChildStdin>,
    events: mpsc::UnboundedReceiver<Value>,
    stderr: PathBuf,
}

impl Loader {
    /// Starts vCluster `version`'s loader (`PLUGIN_LOADER` of that version) on `folder` for
    /// vCluster `vcluster` in host namespace `namespace`, with the kubeconfigs of `identity`,
    /// and waits for its `started` event.
    async fn start(
        version: &str,
        folder: &Path,
        namespace: &str,
        vcluster: &str,
        identity: Identity,
    ) -> (Self, Value) {
        let cp = ControlPlane::shared();
        let stderr = folder.join("loader.log");
        let log = std::fs::File::create(&stderr).expect("loader log");
        let mut child = Command::new(vcp_tests::oracle_path_at("PLUGIN_LOADER", version))
            .arg("--plugins")
            .arg(folder)
            .arg("--host-kubeconfig")
            .arg(cp.kubeconfig(Cluster::Host, identity))
            .arg("--virtual-kubeconfig")
            .arg(cp.kubeconfig(Cluster::Virtual, identity))
            .args(["--namespace", namespace, "--name", vcluster])
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start plugin-loader");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let event = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("loader event {line:?}: {e}"));
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut loader = Self {
            child,
            stdin,
            events,
            stderr,
        };
        let started = loader.next("started").await;
        (loader, started)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The next event, which must be `kind`.
    async fn next(&mut self, kind: &str) -> Value {
        let event = tokio::time::timeout(TIMEOUT, self.events.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind} event within {TIMEOUT:?}; log:\n{}", self.log()))
            .unwrap_or_else(|| panic!("the loader exited before {kind}; log:\n{}", self.log()));
        assert_eq!(event["event"], kind, "{event}; log:\n{}", self.log());
        event
    }

    async fn send(&mut self, command: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write command");
        stdin.flush().await.expect("flush command");
    }

    async fn set_leader(&mut self) {
        self.send(json!({"op": "setLeader"})).await;
        self.next("leader").await;
    }

    /// `Manager.MutateObject(obj, hook_type)`: the object as the loader returns it.
    async fn mutate(&mut self, hook_type: &str, object: &Value) -> Value {
        self.send(json!({"op": "mutate", "type": hook_type, "object": object}))
            .await;
        self.next("mutated").await["object"].clone()
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("loader running")
    }
}

/// The pids of the plugins the loader started.
fn plugin_pids(started: &Value) -> Vec<u32> {
    started["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| p["pid"].as_u64().expect("pid") as u32)
        .collect()
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

async fn setup(host_namespace: &str) -> (Client, Client) {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, host_namespace).await;
    vcp_tests::create_namespace(&virtual_, "team-a").await;
    (host, virtual_)
}

async fn apply_car(client: &Client, car: Value) -> Car {
    let car: Car = serde_json::from_value(car).expect("car");
    let name = car.name_any();
    Api::<Car>::namespaced(client.clone(), "team-a")
        .patch(
            &name,
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&car),
        )
        .await
        .unwrap_or_else(|e| panic!("apply car {name}: {e}"))
}

/// A host pod as vCluster's pod syncer is about to create it (translated name and labels), to
/// hand to `MutateObject` with `CreatePhysical`.
fn host_pod(name: &str, vcluster: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("{name}-x-team-a-x-{vcluster}"),
            "labels": {"app": "web", "vcluster.loft.sh/managed-by": vcluster, "vcluster.loft.sh/namespace": "team-a"},
            "annotations": {"vcluster.loft.sh/object-name": name, "vcluster.loft.sh/object-namespace": "team-a"}
        },
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
    })
}

/// Creates `pod` (the loader's answer) on the host, as the syncer does right after
/// `MutateObject`, and returns what the API server stored from that one write.
async fn create_host_pod(host: &Client, namespace: &str, pod: &Value) -> Pod {
    let pod: Pod = serde_json::from_value(pod.clone()).expect("pod from the loader");
    Api::<Pod>::namespaced(host.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create host pod")
}

/// Checks in both audit logs (once they have caught up) that the plugin (user `vcp-syncer`)
/// listed and watched Cars on both clusters and wrote the host copy, and that it did each of
/// these only at or after `leader_sent` (when the test sent SetLeader).
async fn plugin_looked_only_after(since: SystemTime, leader_sent: SystemTime, host_ns: &str) {
    let cp = ControlPlane::shared();
    let user = Identity::Syncer.user();
    for cluster in [Cluster::Virtual, Cluster::Host] {
        vcp_tests::audit_caught_up(cp, cluster).await;
        let reads: Vec<_> = vcp_tests::audited_read_events(cp, cluster, user)
            .expect("audit log")
            .into_iter()
            .filter(|r| r.uri.contains("/cars") && r.received_at >= since)
            .collect();
        let verbs: Vec<&str> = reads.iter().map(|r| r.verb.as_str()).collect();
        assert!(
            verbs.contains(&"list") && verbs.contains(&"watch"),
            "the plugin listed and watched the {} Cars: {reads:?}",
            cluster.as_str()
        );
        let early: Vec<_> = reads
            .iter()
            .filter(|r| r.received_at < leader_sent)
            .collect();
        assert!(
            early.is_empty(),
            "the plugin looked at the {} Cars before SetLeader: {early:?}",
            cluster.as_str()
        );
        let early_writes: Vec<_> = vcp_tests::Audit::writes()
            .on(cluster)
            .by(Identity::Syncer)
            .attempts()
            .into_iter()
            .filter(|w| w.received_at >= since && w.received_at < leader_sent)
            .collect();
        assert!(
            early_writes.is_empty(),
            "the plugin wrote on the {} cluster before SetLeader: {early_writes:?}",
            cluster.as_str()
        );
    }
    let copies = vcp_tests::Audit::writes()
        .by(Identity::Syncer)
        .in_namespace(host_ns)
        .resource("cars")
        .verb("create")
        .succeeded();
    assert!(
        !copies.is_empty() && copies.iter().all(|w| w.received_at >= leader_sent),
        "the plugin created the host copy after SetLeader: {copies:?}"
    );
}

/// Stops the loader with SIGTERM (as a container runtime stops the syncer) and checks that it
/// stopped its plugins through go-plugin (`Client.Kill`: the plugin's `GRPCController.Shutdown`
/// and a clean exit, not the forced kill after 2 s).
async fn stop_gracefully(mut loader: Loader, started: &Value) {
    let pids = plugin_pids(started);
    assert!(
        pids.iter().all(|p| vcp_tests::process_runs(*p)),
        "plugins run before the stop"
    );
    signal(loader.pid(), "-TERM");
    let stopped = loader.next("stopped").await;
    assert_eq!(
        stopped["exited"],
        json!(vec![true; pids.len()]),
        "{stopped}"
    );
    let status = tokio::time::timeout(TIMEOUT, loader.child.wait())
        .await
        .expect("loader exits")
        .expect("loader status");
    assert!(status.success(), "{status}; log:\n{}", loader.log());
    for pid in pids {
        assert!(
            !vcp_tests::process_runs(pid),
            "plugin {pid} still runs after the loader stopped"
        );
    }
    // go-plugin's client logs `plugin process exited` at INFO for exit code 0 (ERROR with the
    // code otherwise), and `plugin failed to exit gracefully` when it had to kill the process.
    let log = loader.log();
    assert!(
        log.contains("[INFO]  plugin: plugin process exited"),
        "the plugin exited with code 0; log:\n{log}"
    );
    assert!(
        !log.contains("plugin failed to exit gracefully"),
        "the plugin exited by itself; log:\n{log}"
    );
}

/// At every vCluster version of the matrix ([`vcp_tests::VCLUSTER_VERSIONS`]), one after the
/// other (each its own host namespace and plugins folder).
#[tokio::test]
async fn car_syncer_and_pod_hook_through_vclusters_loader() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        car_syncer_and_pod_hook(version).await;
    }
}

async fn car_syncer_and_pod_hook(version: &str) {
    const VCLUSTER: &str = "car-vc";
    let tag = version.replace('.', "");
    let ns = format!("vc-v2-car-{tag}");
    let ns = ns.as_str();
    let (host, virtual_) = setup(ns).await;
    let (car_syncer, _) = plugin_binaries();
    let folder = plugins_folder(&format!("car-{tag}"));
    install_copy(&folder, "car-sync", car_syncer);

    // The loader, and so the plugin (vCluster hands it the syncer's kubeconfigs), runs as
    // `vcp-syncer`, an identity no other test of this binary uses: the audit logs tell its
    // requests apart (its lists and watches of Cars are logged too).
    vcp_tests::runtime::syncer_is_cluster_admin(&host).await;
    vcp_tests::runtime::syncer_is_cluster_admin(&virtual_).await;
    let since = SystemTime::now();
    let (mut loader, started) =
        Loader::start(version, &folder, ns, VCLUSTER, Identity::Syncer).await;
    assert_eq!(
        started["plugins"][0]["path"],
        json!(folder.join("car-sync/plugin"))
    );
    // vCluster registered the tutorial pod hook's points from GetPluginConfig
    // (podHook implements MutateCreatePhysical and MutateUpdatePhysical).
    assert_eq!(
        started["clientHooks"],
        json!([
            {"apiVersion": "v1", "kind": "Pod", "type": "CreatePhysical", "plugins": 1},
            {"apiVersion": "v1", "kind": "Pod", "type": "UpdatePhysical", "plugins": 1},
        ])
    );

    // Before SetLeader the plugin answers (a Mutate goes through) but syncs nothing: it does
    // not even look. The tutorial's plugin starts its syncers (their lists and watches of
    // Cars) only when SetLeader arrives, so the evidence is the order in the audit logs, read
    // once it has synced: every list, watch and write of Cars the plugin made came after
    // SetLeader was sent, although it was initialised and serving (the Mutate above) and the
    // Car existed before. A plugin that synced from Initialize would have listed Cars right
    // after its handshake, before the loader even reported it started.
    let audi = apply_car(
        &virtual_,
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "audi", "labels": {"color": "red"}},
            "spec": {"type": "Audi", "seats": 4}
        }),
    )
    .await;
    let early = loader
        .mutate("CreatePhysical", &host_pod("early", VCLUSTER))
        .await;
    assert_eq!(early["metadata"]["labels"]["created-by-plugin"], "pod-hook");
    let host_cars: Api<Car> = Api::namespaced(host.clone(), ns);
    let host_name = "audi-x-team-a-x-car-vc";
    assert!(
        host_cars.get_opt(host_name).await.unwrap().is_none(),
        "no sync before SetLeader"
    );

    // SetLeader: the Car syncer starts and makes the host copy with vCluster's exact name.
    let leader_sent = SystemTime::now();
    loader.set_leader().await;
    let host_audi = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt(host_name).await.ok().flatten() }
    })
    .await;
    plugin_looked_only_after(since, leader_sent, ns).await;
    assert_eq!(
        host_audi.labels(),
        &string_map([
            ("color", "red"),
            ("vcluster.loft.sh/managed-by", VCLUSTER),
            ("vcluster.loft.sh/namespace", "team-a"),
        ])
    );
    assert_eq!(
        host_audi.annotations()["vcluster.loft.sh/object-uid"],
        audi.uid().unwrap()
    );
    assert_eq!(
        host_audi.annotations()["vcluster.loft.sh/object-host-name"],
        host_name
    );
    assert_eq!(host_audi.spec.type_, "Audi");

    // The pod hook, called by vCluster's MutateObject before it creates a host pod: the label
    // is in the pod's first write.
    let pod = loader
        .mutate("CreatePhysical", &host_pod("web", VCLUSTER))
        .await;
    let created = create_host_pod(&host, ns, &pod).await;
    assert_eq!(
        created.labels(),
        &string_map([
            ("app", "web"),
            ("created-by-plugin", "pod-hook"),
            ("vcluster.loft.sh/managed-by", VCLUSTER),
            ("vcluster.loft.sh/namespace", "team-a"),
        ])
    );
    // A point the hook does not implement leaves the object as it was.
    let deleted = loader
        .mutate("DeletePhysical", &host_pod("web", VCLUSTER))
        .await;
    assert!(
        deleted["metadata"]["labels"]
            .get("created-by-plugin")
            .is_none()
    );

    stop_gracefully(loader, &started).await;
}

/// At every vCluster version of the matrix.
#[tokio::test]
async fn the_plugin_exits_when_its_loader_dies() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        plugin_exits_with_its_loader(version).await;
    }
}

async fn plugin_exits_with_its_loader(version: &str) {
    let tag = version.replace('.', "");
    let ns = format!("vc-v2-kill-{tag}");
    setup(&ns).await;
    let (car_syncer, _) = plugin_binaries();
    let folder = plugins_folder(&format!("kill-{tag}"));
    install_copy(&folder, "car-sync", car_syncer);
    let (mut loader, started) =
        Loader::start(version, &folder, &ns, "kill-vc", Identity::Admin).await;
    let pids = plugin_pids(&started);
    assert!(pids.iter().all(|p| vcp_tests::process_runs(*p)));
    // SIGKILL: the loader cannot stop its plugins; they notice their parent is gone.
    signal(loader.pid(), "-KILL");
    loader.child.wait().await.expect("loader killed");
    wait_for(Duration::from_secs(10), || async {
        pids.iter()
            .all(|p| !vcp_tests::process_runs(*p))
            .then_some(())
    })
    .await;
}

/// The embedded runtime's v2 plugin `plugin` of vCluster `vcluster` in host namespace `ns`,
/// as the operator leaves it: the VClusterPlugin applied (syncing Cars, one `CreatePhysical`
/// pod hook labelling `created-by-plugin: pod-hook`) and accepted by a stand-in for the
/// operator, and the runtime copied into its plugin folder by its own `install-plugin` (the
/// operator's init container). Returns the clients (host, virtual) and the plugin folder.
async fn embedded_plugin_installed(
    ns: &str,
    vcluster: &str,
    plugin_name: &str,
    folder: &str,
) -> (Client, Client, PathBuf) {
    let (host, virtual_) = setup(ns).await;
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": plugin_name, "namespace": ns},
        "spec": {
            "vcluster": {"name": vcluster},
            "version": "v2",
            "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}],
            "hooks": [{"name": "pod-hook", "apiVersion": "v1", "kind": "Pod",
                       "events": ["CreatePhysical"], "labels": {"created-by-plugin": "pod-hook"}}]
        }
    }))
    .expect("plugin");
    Api::<VClusterPlugin>::namespaced(host.clone(), ns)
        .patch(
            plugin_name,
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&plugin),
        )
        .await
        .expect("apply VClusterPlugin");
    // no operator runs here: its verdict is stood in for, so `Mutate` applies the hooks
    vcp_tests::accept_as_operator(&host, ns, plugin_name).await;
    let (_, runtime) = plugin_binaries();
    let folder = plugins_folder(folder);
    let install = std::process::Command::new(runtime)
        .arg("install-plugin")
        .arg(folder.join(plugin_name))
        .output()
        .expect("run install-plugin");
    assert!(
        install.status.success(),
        "{}",
        String::from_utf8_lossy(&install.stderr)
    );
    (host, virtual_, folder)
}

/// At every vCluster version of the matrix.
#[tokio::test]
async fn embedded_runtime_as_a_v2_plugin() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        embedded_runtime(version).await;
    }
}

async fn embedded_runtime(version: &str) {
    const VCLUSTER: &str = "emb-vc";
    const PLUGIN: &str = "cars-and-pods";
    let tag = version.replace('.', "");
    let ns = format!("vc-v2-embedded-{tag}");
    let ns = ns.as_str();
    // The operator's init container: the runtime copies itself into /plugins/<name>.
    let (host, virtual_, folder) =
        embedded_plugin_installed(ns, VCLUSTER, PLUGIN, &format!("embedded-{tag}")).await;
    let (_, runtime) = plugin_binaries();
    assert_eq!(
        std::fs::read(folder.join(PLUGIN).join("plugin")).unwrap(),
        std::fs::read(runtime).unwrap()
    );

    let (mut loader, started) =
        Loader::start(version, &folder, ns, VCLUSTER, Identity::Admin).await;
    // The declared hooks of the spec are registered with vCluster.
    assert_eq!(
        started["clientHooks"],
        json!([{"apiVersion": "v1", "kind": "Pod", "type": "CreatePhysical", "plugins": 1}])
    );
    loader.set_leader().await;
    apply_car(
        &virtual_,
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "tesla"}, "spec": {"type": "Tesla"}
        }),
    )
    .await;
    let host_cars: Api<Car> = Api::namespaced(host.clone(), ns);
    let synced = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt("tesla-x-team-a-x-emb-vc").await.ok().flatten() }
    })
    .await;
    assert_eq!(synced.spec.type_, "Tesla");

    let pod = loader
        .mutate("CreatePhysical", &host_pod("api", VCLUSTER))
        .await;
    let created = create_host_pod(&host, ns, &pod).await;
    assert_eq!(created.labels()["created-by-plugin"], "pod-hook");

    // The runtime reports into its VClusterPlugin, as the sidecar does (the other tests of
    // this binary add Cars to the same virtual namespace: at least this one is counted).
    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get(PLUGIN).await.ok()?.status?;
            let healthy = status
                .conditions
                .iter()
                .any(|c| c.type_ == "RuntimeHealthy" && c.status == "True");
            (healthy && status.synced_total >= Some(1)).then_some(())
        }
    })
    .await;

    stop_gracefully(loader, &started).await;
    let _ = std::io::stderr().flush();
}

/// A status the API server accepted but the runtime's types cannot read (a condition's
/// `lastTransitionTime` of `2024-01-01T10:00:00Zt`, which the CRD's `date-time` check lets
/// through and anyone who may patch the status can write) does not keep the runtime from
/// starting as a v2 plugin: vCluster's loader gets its plugin config and the Cars sync. The
/// runtime reads the plugin without its status then; the hooks, whose acceptance is in the
/// status, stay held (declared, and `Mutate` refused with the reason).
#[tokio::test]
async fn embedded_runtime_starts_beside_an_unreadable_status() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        starts_beside_an_unreadable_status(version).await;
    }
}

async fn starts_beside_an_unreadable_status(version: &str) {
    const VCLUSTER: &str = "poisoned-vc";
    const PLUGIN: &str = "poisoned-status";
    const BAD_TIME: &str = "2024-01-01T10:00:00Zt";
    let tag = version.replace('.', "");
    let ns = format!("vc-v2-poisoned-{tag}");
    let ns = ns.as_str();
    let (host, virtual_, folder) =
        embedded_plugin_installed(ns, VCLUSTER, PLUGIN, &format!("poisoned-{tag}")).await;
    // the poison, by a JSON patch of the untyped object (a typed answer would not decode)
    let resource = kube::api::ApiResource::erase::<VClusterPlugin>(&());
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(host.clone(), ns, &resource);
    let poison = serde_json::from_value(json!([{
        "op": "add", "path": "/status/conditions/-", "value": {
            "type": "Evil", "status": "True", "reason": "X", "message": "x",
            "lastTransitionTime": BAD_TIME,
        }
    }]))
    .expect("JSON patch");
    raw.patch_status(PLUGIN, &PatchParams::default(), &Patch::Json::<()>(poison))
        .await
        .expect("write the unreadable condition");
    let typed = Api::<VClusterPlugin>::namespaced(host.clone(), ns)
        .get(PLUGIN)
        .await;
    assert!(
        matches!(&typed, Err(kube::Error::SerdeError(_))),
        "the poisoned plugin no longer decodes as VClusterPlugin: {typed:?}"
    );

    let (mut loader, started) =
        Loader::start(version, &folder, ns, VCLUSTER, Identity::Admin).await;
    assert_eq!(
        started["clientHooks"],
        json!([{"apiVersion": "v1", "kind": "Pod", "type": "CreatePhysical", "plugins": 1}]),
        "the runtime started and declared its hooks; loader log:\n{}",
        loader.log()
    );
    loader.set_leader().await;
    apply_car(
        &virtual_,
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "beetle"}, "spec": {"type": "Beetle"}
        }),
    )
    .await;
    let host_cars: Api<Car> = Api::namespaced(host.clone(), ns);
    let synced = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move {
            api.get_opt(&format!("beetle-x-team-a-x-{VCLUSTER}"))
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(synced.spec.type_, "Beetle");
    // held, not applied: the acceptance is in the status the runtime cannot read, so a pod
    // that would take the hook is refused (vCluster's syncer retries it) rather than created
    // with hooks nobody judged
    loader
        .send(
            json!({"op": "mutate", "type": "CreatePhysical", "object": host_pod("api", VCLUSTER)}),
        )
        .await;
    let refused = loader.next("error").await;
    let message = refused["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("are not accepted by the operator yet"),
        "Mutate refused for want of an accepted generation: {refused}"
    );
    stop_gracefully(loader, &started).await;
}
