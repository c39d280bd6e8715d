//! End to end inside vCluster itself: vCluster's own syncer process (`cmd/vcluster start`, the
//! pinned `github.com/loft-sh/vcluster`, run by [`VClusterSyncer`]) with the embedded runtime
//! loaded as a v2 plugin.
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

/// The writes vCluster's identity made to host pod `name` since `t`.
fn pod_writes(t: &Target, name: &str, since: SystemTime) -> Vec<(String, String)> {
    Audit::writes()
        .by_user(&t.user())
        .in_namespace(&t.ns)
        .resource("pods")
        .since(since)
        .attempts()
        .into_iter()
        .filter(|w| w.object_name == name)
        .map(|w| (w.verb, w.uri))
        .collect()
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

    // 3. A virtual Pod synced by vCluster's own pod syncer: the host pod carries the label of
    //    the plugin's CreatePhysical hook in the object its create stored (the watch's ADDED
    //    event), so vCluster applied the hook before its create.
    let since = SystemTime::now();
    let web_name = format!("web-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), &t.ns);
    let mut watch = host_pods
        .watch(
            &WatchParams::default().fields(&format!("metadata.name={web_name}")),
            "0",
        )
        .await
        .expect("watch the host pod")
        .boxed();
    create_virtual_pod(&virtual_, t, "web").await;
    let added = tokio::time::timeout(TIMEOUT, async {
        loop {
            match watch.next().await {
                Some(Ok(WatchEvent::Added(pod))) => break pod,
                Some(Ok(_)) => {}
                other => panic!("watch of {web_name} ended: {other:?}"),
            }
        }
    })
    .await
    .expect("the host pod is created");
    assert_eq!(
        added.labels().get("created-by-plugin").map(String::as_str),
        Some("pod-hook"),
        "the created host pod: {:?}",
        added.labels()
    );
    assert_eq!(
        added
            .labels()
            .get("created-by-go-plugin")
            .map(String::as_str),
        Some("go-hook"),
        "the Go plugin's hook is in the create too: {:?}",
        added.labels()
    );
    // vCluster's own log: its pod syncer (controller "pod") created that host object.
    let log = syncer
        .wait_log(
            &format!("Create host object\t{{\"component\": \"vcluster\", \"controller\": \"pod\", \"namespace\": \"{}\", \"name\": \"web\"", t.vns),
            1,
            TIMEOUT,
        )
        .await;
    assert!(
        log.contains(&format!("\"object\": \"{}/{web_name}\"", t.ns)),
        "{log}"
    );
    // vCluster then copies the hook's host label up to the virtual pod (its pod syncer syncs
    // labels both ways: pkg/controllers/resources/pods/translate/diff.go), and records the
    // virtual pod's labels in the host pod's annotation `vcluster.loft.sh/labels`: its one
    // update of the host pod, which does not touch the label.
    let virtual_pods: Api<Pod> = Api::namespaced(virtual_.clone(), &t.vns);
    wait_for(TIMEOUT, || {
        let api = virtual_pods.clone();
        async move {
            let pod = api.get("web").await.ok()?;
            let labels = pod.labels();
            (labels.get("created-by-plugin").map(String::as_str) == Some("pod-hook")
                && labels.get("created-by-go-plugin").map(String::as_str) == Some("go-hook"))
            .then_some(())
        }
    })
    .await;
    let web = wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        let name = web_name.clone();
        async move {
            let pod = api.get(&name).await.ok()?;
            pod.annotations()
                .get("vcluster.loft.sh/labels")
                .is_some_and(|l| {
                    l.contains("created-by-plugin") && l.contains("created-by-go-plugin")
                })
                .then_some(pod)
        }
    })
    .await;
    assert_eq!(web.labels()["created-by-plugin"], "pod-hook");
    // Evidence that the syncer kept working after those writes: a second pod is synced later.
    create_virtual_pod(&virtual_, t, "web2").await;
    host_pod(&host, t, "web2").await;
    let writes = pod_writes(t, &web_name, since);
    assert_eq!(
        writes.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        ["create", "update"],
        "vCluster created host pod {web_name} with the hook's label, then recorded the copied-up label: {writes:?}"
    );
    // That update, as the watch saw it: the labels are those of the create.
    let modified = tokio::time::timeout(TIMEOUT, async {
        loop {
            match watch.next().await {
                Some(Ok(WatchEvent::Modified(pod))) => break pod,
                Some(Ok(_)) => {}
                other => panic!("watch of {web_name} ended: {other:?}"),
            }
        }
    })
    .await
    .expect("vCluster's update of the host pod");
    assert_eq!(modified.labels(), added.labels());
    assert!(
        modified.annotations()["vcluster.loft.sh/labels"].contains("created-by-plugin")
            && modified.annotations()["vcluster.loft.sh/labels"].contains("created-by-go-plugin"),
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
                    && l.contains(&format!("\"object\": \"{}/{web_name}\"", t.ns))
            })
            .expect("vCluster logs its patch of the host pod")
            .to_string();
        assert!(
            host_patch.contains("vcluster.loft.sh/labels")
                && !host_patch.contains(r#"\"labels\":{"#),
            "vCluster's update of the host pod only records the virtual labels: {host_patch}"
        );
    }

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

    // 5. Deleting the plugin and restarting the syncer: a healthy vCluster without plugin.
    vcp_tests::delete_plugin(&admin, &t.ns, PLUGIN, TIMEOUT).await;
    let sts = statefulset(&admin, t).await;
    syncer.stop().expect("stop vCluster's syncer");
    // The runtime notices its parent is gone and exits.
    wait_for(Duration::from_secs(15), || async {
        plugin_pids.iter().all(|pid| !running(*pid)).then_some(())
    })
    .await;
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
    assert!(
        log.contains("Successfully started vCluster controllers"),
        "{log}"
    );
    assert!(!log.contains("Successfully loaded plugin"), "{log}");
    assert!(syncer2.children().is_empty(), "no plugin process");
    let since = SystemTime::now();
    create_virtual_pod(&virtual_, t, "plain").await;
    let plain = host_pod(&host, t, "plain").await;
    assert!(plain.labels().get("created-by-plugin").is_none());
    assert_eq!(
        pod_writes(t, &plain.name_any(), since)
            .iter()
            .map(|(v, _)| v.as_str())
            .collect::<Vec<_>>(),
        ["create"]
    );
    drop(syncer);
    drop(syncer2);
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
