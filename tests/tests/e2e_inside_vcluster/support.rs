//! The test's tools: the runtime binary, the plugins folder and its init containers, the
//! processes, the virtual and host pods, Cars, the audit log's pod writes and the host pod's watch.

use super::*;

/// The runtime binary, built by cargo with this test's profile and target folder (nothing is
/// rebuilt when `cargo test --workspace` already built it).
pub(crate) fn runtime_binary() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| vcp_tests::workspace_binary("vcp-syncer-runtime", "vcluster-plugin-syncer"))
}

/// Runs the init containers of the StatefulSet's pod template that mount the `plugins` volume,
/// in order, as the kubelet would for a new pod: the command line as the template gives it,
/// with the runtime image's binary ([`IMAGE_BINARY`]) being this build's, and the `plugins`
/// mount path being `folder`. Returns the names of the init containers run.
pub(crate) fn run_plugin_init_containers(sts: &StatefulSet, folder: &Path) -> Vec<String> {
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

/// The runtime's own parent watch (`watch_parent`, `syncer-runtime/src/v2/server.rs`): vCluster's
/// syncer process alone is killed (SIGKILL to its pid, not to its process group: it stops none
/// of its plugins, as when vCluster's process dies), and the runtime `runtime`, whose parent it
/// was, stops by itself within 15 s. It stops in order: its gRPC socket is gone (the session's
/// shutdown removes it; a killed or aborted process leaves it). Its own log line ("the host
/// process is gone: stopping") cannot be read: a v2 plugin's output reaches vCluster's log only
/// through vCluster's `StreamStdio` call (go-plugin), which died with vCluster.
pub(crate) async fn runtime_exits_without_its_parent(syncer: &VClusterSyncer, runtime: u32) {
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
    while vcp_tests::process_runs(runtime) {
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
pub(crate) fn fresh_plugins_folder(cp: &ControlPlane, n: &str) -> PathBuf {
    let dir = cp.dir().join(format!("inside-plugins-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plugins folder");
    dir
}

pub(crate) async fn statefulset(admin: &Client, t: &Target) -> StatefulSet {
    Api::<StatefulSet>::namespaced(admin.clone(), &t.ns)
        .get(VCLUSTER_RELEASE)
        .await
        .expect("the vCluster's StatefulSet")
}

pub(crate) async fn create_virtual_pod(virtual_: &Client, t: &Target, name: &str) -> Pod {
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

pub(crate) async fn host_pod(host: &Client, t: &Target, virtual_name: &str) -> Pod {
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
pub(crate) async fn assert_accepted_hook_in_force(
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

pub(crate) async fn apply_car(virtual_: &Client, t: &Target, name: &str, type_: &str) {
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
pub(crate) async fn pod_writes(t: &Target, name: &str, since: SystemTime) -> Vec<(String, String)> {
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
pub(crate) async fn next_event(
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
