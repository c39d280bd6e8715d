//! vCluster from its own chart, as a pod on the node, and the tutorial's plugin installed into
//! it by the operator running from its image: the StatefulSet rolls, the runtime sidecar runs
//! beside vCluster's syncer, a Car of the virtual cluster reaches the host, a virtual pod is
//! synced by vCluster's own pod syncer and runs on the node with the pod hook's label, and
//! deleting the plugin rolls the vCluster back to the chart's template.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use vcp_tests::node::{NETNS, Node};
use vcp_tests::{poll_for, repo_root};

use crate::operator::installed_operator;

/// The sample's vCluster: release and host namespace of `config/samples/car-plugin.yaml`.
const RELEASE: &str = "my-vcluster";
const NAMESPACE: &str = "my-vcluster";

/// `NAME=VALUE` lines of a script's output, as a map.
pub fn values(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Runs a repository script with `args` for the shared node (`VCP_NODE_DIR`, the node started
/// first) and returns its stdout; panics with its output when it fails.
pub fn script(name: &str, args: &[&str]) -> String {
    run_script(name, args, Some(Node::shared().dir()))
}

/// [`script`] for a test that needs no node (a build that only prints cached paths): the node
/// is not started.
pub fn script_without_node(name: &str, args: &[&str]) -> String {
    run_script(name, args, None)
}

fn run_script(name: &str, args: &[&str], node_dir: Option<&std::path::Path>) -> String {
    let mut cmd = Command::new(repo_root().join("scripts").join(name));
    cmd.args(args);
    if let Some(dir) = node_dir {
        cmd.env("VCP_NODE_DIR", dir);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    assert!(
        out.status.success(),
        "scripts/{name} {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command run inside the node's network namespace, where Service ClusterIPs answer.
fn in_netns(program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{NETNS}"))
        .arg("--")
        .arg(program);
    cmd
}

/// Runs `cmd`, returning its stdout, or its stderr as the error.
fn run(mut cmd: Command, stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write as _;
    use std::process::Stdio;
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(input.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{:?} failed ({}): {}{}",
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// One vCluster of this test binary, installed by [`installed_vcluster`] in a host namespace
/// of its own.
pub struct VCluster {
    /// The host namespace it runs in.
    pub namespace: String,
    /// The helm release, also the StatefulSet's name and the vCluster's name.
    pub release: String,
    /// kubectl of the machine (as `scripts/control-plane build` printed it).
    kubectl: PathBuf,
    /// The virtual cluster's kubeconfig, its server the vCluster Service's ClusterIP (reached
    /// from inside the node's network namespace).
    virtual_kubeconfig: PathBuf,
    /// The StatefulSet's pod template as the chart rendered it, before any plugin.
    pub chart_template: serde_json::Value,
}

impl VCluster {
    /// Creates the virtual pod `namespace/name`: the node's busybox, never pulled, sleeping an
    /// hour (`kubectl run`), for a test that watches its host copy.
    pub fn run_sleeping_pod(&self, namespace: &str, name: &str) -> Result<String, String> {
        self.virtual_kubectl(
            &[
                "-n",
                namespace,
                "run",
                name,
                "--image=localhost/vcp/busybox:1.35",
                "--image-pull-policy=Never",
                "--restart=Never",
                "--",
                "sleep",
                "3600",
            ],
            None,
        )
    }

    /// kubectl against the virtual cluster, from inside the node's network namespace.
    pub fn virtual_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let mut cmd = in_netns(&self.kubectl.to_string_lossy());
        cmd.arg("--kubeconfig")
            .arg(&self.virtual_kubeconfig)
            .args(args);
        run(cmd, stdin)
    }

    /// The name of the vCluster's only pod (`<release>-0`).
    pub fn pod_name(&self) -> String {
        format!("{}-0", self.release)
    }

    /// The uid of the vCluster's pod now (read through `pods`, of its namespace), to tell a
    /// rolled pod from it.
    pub async fn pod_uid(&self, pods: &Api<Pod>) -> String {
        let name = self.pod_name();
        pods.get(&name)
            .await
            .unwrap_or_else(|e| panic!("get pod {name}: {e}"))
            .metadata
            .uid
            .unwrap_or_else(|| panic!("pod {name} has no uid"))
    }
}

/// Serializes the heavy scenarios of this binary (each rolls a vCluster's StatefulSet and
/// starts pods): on a 2-core machine, parallel rolls make each other's timeouts flaky. A test
/// holds it for its whole run.
pub fn scenario_lock() -> &'static tokio::sync::Mutex<()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    &LOCK
}

/// What `scripts/images import`, `scripts/oracles build` and `scripts/control-plane build`
/// printed, merged (`NAME=VALUE`); the imports run once per test binary.
pub fn tool_values() -> &'static BTreeMap<String, String> {
    static VALUES: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    VALUES.get_or_init(|| {
        let dir = Node::shared().dir().to_string_lossy().into_owned();
        let mut all = values(&script("oracles", &["build"]));
        all.extend(values(&script("control-plane", &["build"])));
        // last, so its chart and values (VCLUSTER_CHART, VCLUSTER_VALUES) are the ones used
        all.extend(values(&script("images", &["import", "--dir", &dir])));
        all
    })
}

/// vCluster v0.30.0's own chart installed by helm on the node as release `release` in host
/// namespace `namespace` (`scripts/images` builds and imports its images; values: the local
/// registry, the syncer's OSS image and tag, the distro tag, telemetry off; a static volume for
/// its claim), its pod Ready and its virtual API server answering through its Service. Once per
/// namespace and test binary; later calls get the same vCluster.
pub async fn installed_vcluster(namespace: &str, release: &str) -> &'static VCluster {
    static INSTALLED: std::sync::Mutex<BTreeMap<String, &'static VCluster>> =
        std::sync::Mutex::new(BTreeMap::new());
    static INSTALLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let key = format!("{namespace}/{release}");
    let _installing = INSTALLING.lock().await;
    if let Some(v) = INSTALLED.lock().unwrap().get(&key) {
        return v;
    }
    let vcluster: &'static VCluster = Box::leak(Box::new(install(namespace, release).await));
    INSTALLED.lock().unwrap().insert(key, vcluster);
    vcluster
}

/// `helm <verb> <release> <chart> -n <namespace> -f <values> [-f <extra>]` (verb `install` or
/// `upgrade`) of vCluster v0.30.0's chart with the node's values (`scripts/images`), as the
/// node's admin, from inside the node's network namespace; `extra_values` is a values file
/// layered on top. Returns helm's stdout, or the error with its output.
pub fn helm_chart(
    verb: &str,
    namespace: &str,
    release: &str,
    extra_values: Option<&std::path::Path>,
) -> Result<String, String> {
    let node = Node::shared();
    let tools = tool_values();
    let helm_home = node.dir().join("run/helm");
    let mut cmd = in_netns(&tools["HELM"]);
    cmd.arg("--kubeconfig")
        .arg(node.kubeconfig())
        .args([verb, release])
        .arg(&tools["VCLUSTER_CHART"])
        .args(["-n", namespace, "-f", &tools["VCLUSTER_VALUES"]])
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_DATA_HOME", helm_home.join("data"));
    if let Some(extra) = extra_values {
        cmd.arg("-f").arg(extra);
    }
    run(cmd, None)
}

/// `helm install` of the chart and the waits of [`installed_vcluster`].
async fn install(namespace: &str, release: &str) -> VCluster {
    let node = Node::shared();
    let tools = tool_values();

    node.kubectl(&["create", "namespace", namespace]).unwrap();
    let data = node.dir().join(format!("run/pv/{namespace}-{release}"));
    let pv = std::fs::read_to_string(&tools["VCLUSTER_PV"])
        .unwrap()
        .replace("@NAME@", &format!("{namespace}-{release}-data"))
        .replace("@NAMESPACE@", namespace)
        .replace("@CLAIM@", &format!("data-{release}-0"))
        .replace("@PATH@", &data.to_string_lossy());
    let out = node.kubectl_output(&["apply", "-f", "-"], Some(&pv));
    assert!(out.status.success(), "apply the static volume: {out:?}");

    let started = Instant::now();
    helm_chart("install", namespace, release, None).expect("helm install vCluster's chart");

    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod_name = format!("{release}-0");
    if poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let pod_name = pod_name.clone();
        async move { pod_ready(&pods.get_opt(&pod_name).await.ok()??).then_some(()) }
    })
    .await
    .is_none()
    {
        panic!(
            "{namespace}/{pod_name} not Ready within 300 s of helm install:\n{}\n{}\n{}",
            node.kubectl(&["-n", namespace, "describe", "pod", &pod_name])
                .unwrap_or_else(|e| e.to_string()),
            node.health_summary(),
            log_tail(node, namespace, &pod_name, "syncer")
        );
    }
    eprintln!(
        "vcluster: helm install -> {namespace}/{pod_name} Ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let sts: Api<StatefulSet> = Api::namespaced(client, namespace);
    let chart_template =
        serde_json::to_value(sts.get(release).await.unwrap().spec.unwrap().template).unwrap();
    attach(namespace, release, chart_template).await
}

/// The running vCluster `namespace/release` (its pod Ready) as a [`VCluster`] of this test
/// binary, `chart_template` its StatefulSet's pod template as the chart made it: its virtual
/// kubeconfig written, and its virtual API server answering through its Service (waited up to
/// 120 s).
pub async fn attach(namespace: &str, release: &str, chart_template: serde_json::Value) -> VCluster {
    let node = Node::shared();
    let kubectl = PathBuf::from(&tool_values()["KUBECTL"]);
    let client = node.client().await.unwrap();
    // The virtual cluster's kubeconfig: Secret vc-<release> (server https://localhost:8443),
    // its server replaced by the Service's ClusterIP, which the syncer's certificate names.
    let ip = node
        .kubectl(&[
            "-n",
            namespace,
            "get",
            "svc",
            release,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let config = poll_for(Duration::from_secs(60), || {
        let secrets = secrets.clone();
        async move {
            let secret = secrets.get_opt(&format!("vc-{release}")).await.ok()??;
            let bytes = secret.data?.remove("config")?;
            String::from_utf8(bytes.0).ok()
        }
    })
    .await
    .expect("the vCluster's kubeconfig Secret vc-<release>, key config");
    let config: String = config
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server: ") {
                format!("    server: https://{ip}:443")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let virtual_kubeconfig = node
        .dir()
        .join(format!("vcluster-{namespace}-{release}.kubeconfig"));
    std::fs::write(&virtual_kubeconfig, config).unwrap();

    let vcluster = VCluster {
        namespace: namespace.to_string(),
        release: release.to_string(),
        kubectl,
        virtual_kubeconfig,
        chart_template,
    };
    let answered = poll_for(Duration::from_secs(120), || {
        let ok = vcluster
            .virtual_kubectl(&["get", "serviceaccount", "default"], None)
            .is_ok();
        async move { ok.then_some(()) }
    })
    .await;
    assert!(
        answered.is_some(),
        "the virtual API server did not answer through https://{ip}:443 within 120 s"
    );
    vcluster
}

/// Waits (`kubectl wait`, up to `timeout_s` seconds) until the VClusterPlugin
/// `namespace/plugin` is `Ready=True`; panics with the plugin's YAML and `context` otherwise.
pub fn assert_plugin_ready(
    node: &Node,
    namespace: &str,
    plugin: &str,
    timeout_s: u32,
    context: &str,
) {
    let ready = node.kubectl(&[
        "-n",
        namespace,
        "wait",
        "--for=condition=Ready=True",
        &format!("vclusterplugin/{plugin}"),
        &format!("--timeout={timeout_s}s"),
    ]);
    assert!(
        ready.is_ok(),
        "{plugin} not Ready{context}: {ready:?}\n{}",
        node.kubectl(&["-n", namespace, "get", "vcp", plugin, "-o", "yaml"])
            .unwrap_or_default()
    );
}

/// The last 30 lines of container `container` of the host pod `namespace/pod`, or the error,
/// for a failure message.
pub fn log_tail(node: &Node, namespace: &str, pod: &str, container: &str) -> String {
    node.kubectl(&[
        "-n", namespace, "logs", pod, "-c", container, "--tail", "30",
    ])
    .unwrap_or_else(|e| e.to_string())
}

/// Whether the pod is Running with its `Ready` condition `True`.
pub fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The names of the pod's containers, as its status reports them running and ready.
pub fn ready_containers(pod: &Pod) -> Vec<String> {
    let mut names: Vec<String> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| {
            c.iter()
                .filter(|c| c.ready)
                .map(|c| c.name.clone())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn the_tutorial_plugin_runs_in_a_vcluster_of_the_chart_and_its_pod_runs_on_the_node() {
    let _scenario = scenario_lock().lock().await;
    let node = Node::shared();
    installed_operator().await;
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let vcluster_pod = format!("{RELEASE}-0");
    let before = pods.get(&vcluster_pod).await.unwrap();
    assert_eq!(ready_containers(&before), ["syncer"], "the chart's pod");
    let before_uid = before.metadata.uid.clone().unwrap();

    // The Car CRD on both sides: the host namespace receives the synced Cars, the virtual
    // cluster is where users make them (the tutorial's order).
    node.kubectl(&["apply", "-f", "crds/cars.example.loft.sh.yaml"])
        .unwrap();
    let crd = std::fs::read_to_string(repo_root().join("crds/cars.example.loft.sh.yaml")).unwrap();
    vcluster
        .virtual_kubectl(&["apply", "-f", "-"], Some(&crd))
        .unwrap();

    // The plugin, as the README's tutorial applies it.
    let started = Instant::now();
    node.kubectl(&["apply", "-f", "config/samples/car-plugin.yaml"])
        .unwrap();
    assert_plugin_ready(node, NAMESPACE, "car-sync", 120, "");

    // The StatefulSet rolls: a new pod (another uid) Running and Ready with vCluster's syncer
    // and the runtime sidecar.
    let rolled = poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let name = vcluster_pod.clone();
        let before_uid = before_uid.clone();
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            (pod.metadata.uid.as_deref() != Some(&before_uid)
                && pod_ready(&pod)
                && ready_containers(&pod).len() == 2)
                .then_some(pod)
        }
    })
    .await;
    let Some(rolled) = rolled else {
        panic!(
            "{vcluster_pod} did not come back Running and Ready with the plugin's sidecar \
             within 300 s:\n{}",
            node.kubectl(&["-n", NAMESPACE, "describe", "pod", &vcluster_pod])
                .unwrap_or_else(|e| e.to_string())
        );
    };
    eprintln!(
        "vcluster: kubectl apply of the plugin -> vCluster pod Ready with the runtime: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let containers = ready_containers(&rolled);
    assert!(
        containers.contains(&"syncer".to_string()) && containers.contains(&"car-sync".to_string()),
        "containers of the rolled pod: {containers:?}"
    );

    // A Car created in the virtual cluster appears in the host namespace, named as vCluster
    // names synced objects (<name>-x-<namespace>-x-<vcluster>).
    let wait_virtual = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        vcluster.virtual_kubectl(&args, None)
    };
    let created = poll_for(Duration::from_secs(120), || {
        let ok = wait_virtual(vec!["create".into(), "namespace".into(), "team-a".into()]).is_ok()
            || wait_virtual(vec!["get".into(), "namespace".into(), "team-a".into()]).is_ok();
        async move { ok.then_some(()) }
    })
    .await;
    assert!(created.is_some(), "namespace team-a in the virtual cluster");
    vcluster
        .virtual_kubectl(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: example.loft.sh/v1\nkind: Car\nmetadata: {name: my-bmw, namespace: team-a}\nspec: {type: BMW, seats: 4}\n",
            ),
        )
        .unwrap();
    let host_car = "my-bmw-x-team-a-x-my-vcluster";
    let synced = poll_for(Duration::from_secs(120), || {
        let got = node.kubectl(&["-n", NAMESPACE, "get", "car", host_car, "-o", "name"]);
        async move { got.ok() }
    })
    .await;
    assert!(
        synced.is_some(),
        "the virtual Car team-a/my-bmw did not reach the host as {NAMESPACE}/{host_car} within \
         120 s; the runtime's log:\n{}",
        log_tail(node, NAMESPACE, &vcluster_pod, "car-sync")
    );

    // A pod of the virtual cluster, synced by vCluster's own pod syncer, runs on the node with
    // the hook's label. (Its ServiceAccount `default` comes from the virtual cluster's
    // kube-controller-manager, moments after the namespace.)
    let account = poll_for(Duration::from_secs(60), || {
        let ok = vcluster
            .virtual_kubectl(&["-n", "team-a", "get", "serviceaccount", "default"], None)
            .is_ok();
        async move { ok.then_some(()) }
    })
    .await;
    assert!(
        account.is_some(),
        "no ServiceAccount team-a/default in the virtual cluster"
    );
    vcluster.run_sleeping_pod("team-a", "nginx").unwrap();
    let host_pod = "nginx-x-team-a-x-my-vcluster";
    let running = poll_for(Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get_opt(host_pod).await.ok()??;
            let labelled = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("created-by-plugin"))
                .map(String::as_str)
                == Some("pod-hook");
            (pod.status.as_ref()?.phase.as_deref() == Some("Running") && labelled).then_some(pod)
        }
    })
    .await;
    let Some(running) = running else {
        panic!(
            "the host pod {host_pod} was not Running with created-by-plugin=pod-hook within \
             120 s:\n{}",
            node.kubectl(&[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "--show-labels",
                "-o",
                "wide"
            ])
            .unwrap_or_else(|e| e.to_string())
        );
    };
    assert_eq!(
        running.spec.as_ref().unwrap().node_name.as_deref(),
        Some("vcp-node")
    );

    // Deleting the plugin rolls the vCluster back to the chart's template, leaving nothing.
    // What the leftover check below looks for is there before the delete: the plugin's Role and
    // RoleBinding, found by the label it lists them by.
    let ours = |kind: &str| {
        node.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            kind,
            "-l",
            "vcp.dev/plugin-name=car-sync",
            "-o",
            "name",
        ])
        .unwrap()
    };
    let (roles, bindings) = (ours("roles"), ours("rolebindings"));
    assert!(
        roles.lines().count() >= 1 && bindings.lines().count() >= 1,
        "the plugin's Role and RoleBinding before its delete: {roles:?} {bindings:?}"
    );
    let rolled_uid = rolled.metadata.uid.clone().unwrap();
    node.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "vclusterplugin",
        "car-sync",
        "--timeout=120s",
    ])
    .unwrap();
    let template =
        serde_json::to_value(sts.get(RELEASE).await.unwrap().spec.unwrap().template).unwrap();
    assert_eq!(
        template, vcluster.chart_template,
        "the StatefulSet's pod template after the plugin's removal differs from the chart's"
    );
    let back = poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let name = vcluster_pod.clone();
        let rolled_uid = rolled_uid.clone();
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            (pod.metadata.uid.as_deref() != Some(&rolled_uid) && pod_ready(&pod)).then_some(pod)
        }
    })
    .await
    .expect("the vCluster pod back Running and Ready on the chart's template");
    assert_eq!(ready_containers(&back), ["syncer"]);
    let leftovers = ours("roles,rolebindings");
    assert_eq!(
        leftovers.trim(),
        "",
        "the plugin's Role and RoleBinding remain"
    );
}
