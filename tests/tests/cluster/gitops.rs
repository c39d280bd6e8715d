//! GitOps with Argo CD itself (docs/GITOPS.md), on the real node: Argo CD v3.6.2's application
//! controller and repo server as local processes ([`vcp_tests::argocd_local`]), their
//! destination `https://kubernetes.default.svc` being the node (`ARGOCD_FAKE_IN_CLUSTER` with
//! the node's admin kubeconfig). The Application is `config/argocd/application.yaml` as
//! shipped, with only what points at this machine replaced: the chart's repository (a local
//! Helm repository serving vCluster v0.30.0's chart as `vcluster` 0.30.0), the Git remote (a
//! `git daemon` on loopback), the destination namespace; the chart gets the node's values
//! (`scripts/images`: local images, telemetry off). `argocd-cm` is
//! `config/argocd/argocd-cm.yaml` as shipped.
//!
//! - install: the chart's vCluster and a plugin from Git, Synced and Healthy; the operator's
//!   container in the live StatefulSet, and Argo CD's health of the plugin from the shipped Lua.
//! - no fight: across three reconciles and a hard refresh, with `selfHeal`, the sample's
//!   `ignoreDifferences` and `RespectIgnoreDifferences`, Argo CD writes nothing to the
//!   StatefulSet (the node API server's audit log).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};
use vcp_tests::argocd_local::{self, ArgoCd, ArgoCdTools, CHART_VERSION};
use vcp_tests::node::Node;
use vcp_tests::{poll_for, repo_root};

use crate::operator::installed_operator;
use crate::vcluster::{
    assert_plugin_ready, pod_ready, ready_containers, scenario_lock, script, tool_values, values,
};

/// The vCluster's host namespace (the Application's destination namespace; the sample's
/// `my-vcluster` is the tutorial test's).
pub const NAMESPACE: &str = "gitops-vc";
/// The sample's Application name and chart release (also the StatefulSet's name).
pub const RELEASE: &str = "my-vcluster";
/// The plugin committed to Git: the tutorial's pod hook (config/samples/car-plugin.yaml's
/// `hooks`), alone, so that it is Ready without the Car CRD in the virtual cluster.
pub const PLUGIN: &str = "pod-hook";
/// The field manager of Argo CD's application controller's writes (client-side apply) and the
/// prefix of its user agent.
const ARGOCD_FIELD_MANAGER: &str = "argocd-controller";
pub const ARGOCD_USER_AGENT: &str = "argocd-application-controller";

/// Argo CD of this test binary, started once against the node, its folder `<node>/argocd`.
pub fn argocd() -> &'static ArgoCd {
    static ARGOCD: OnceLock<ArgoCd> = OnceLock::new();
    ARGOCD.get_or_init(|| {
        let node = Node::shared();
        let mut all: BTreeMap<String, String> = tool_values().clone();
        all.extend(values(&script("argocd", &["build"])));
        let tools = ArgoCdTools::from_values(&all).expect("the tools Argo CD needs");
        let started = Instant::now();
        let argocd = ArgoCd::start(
            &node.dir().join("argocd"),
            &node.kubeconfig(),
            tools,
            &argocd_local::shipped_argocd_cm().unwrap(),
            std::process::id(),
        )
        .expect("start Argo CD (redis, git daemon, Helm repository, repo server, controller)");
        eprintln!(
            "gitops: Argo CD running in {:.1} s (logs in {})",
            started.elapsed().as_secs_f64(),
            argocd.dir().display()
        );
        argocd
    })
}

/// The plugin's manifest as committed to Git, in the chart's sync wave (no
/// `argocd.argoproj.io/sync-wave`): Argo CD applies it with the chart's StatefulSet, so the
/// operator patches that StatefulSet before vCluster's first start has written the kubeconfig
/// Secret `vc-<release>` its runtime container mounts. The volume is optional and the runtime
/// waits for the file; before it was, the pod stayed in `Init:0/1` with `FailedMount ...
/// secret "vc-my-vcluster" not found` (seen on the node), and a sync wave was needed.
pub fn plugin_manifest() -> String {
    format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata:\n  name: {PLUGIN}\n  \
         namespace: {NAMESPACE}\nspec:\n  vcluster:\n    name: {RELEASE}\n  hooks:\n  - name: \
         pod-hook\n    apiVersion: v1\n    kind: Pod\n    events: [CreatePhysical, \
         UpdatePhysical]\n    labels:\n      created-by-plugin: pod-hook\n"
    )
}

/// Where plugin `name`'s manifest is in Git: under the sample Application's path
/// `vclusters/<release>/plugins`.
pub fn plugin_path(name: &str) -> String {
    format!("vclusters/{RELEASE}/plugins/{name}.yaml")
}

/// `config/argocd/application.yaml` with this machine's sources and namespace: the Helm
/// repository's URL (chart, version and release as shipped), the node's chart values as
/// `helm.valuesObject`, the Git remote's URL (branch and path as shipped), the destination and
/// `ignoreDifferences` namespace [`NAMESPACE`]. Everything else (sync policy, sync options, the
/// `ignoreDifferences` rule) as shipped.
fn application(argocd: &ArgoCd) -> Value {
    let text = std::fs::read_to_string(repo_root().join("config/argocd/application.yaml")).unwrap();
    let mut app: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(app["metadata"]["name"], RELEASE);
    let spec = &mut app["spec"];
    spec["destination"]["namespace"] = json!(NAMESPACE);
    let chart = &mut spec["sources"][0];
    assert_eq!(
        (
            &chart["chart"],
            &chart["targetRevision"],
            &chart["helm"]["releaseName"]
        ),
        (&json!("vcluster"), &json!(CHART_VERSION), &json!(RELEASE)),
        "the sample's chart source"
    );
    chart["repoURL"] = json!(argocd.helm_url());
    let node_values = std::fs::read_to_string(&tool_values()["VCLUSTER_VALUES"]).unwrap();
    chart["helm"]["valuesObject"] = serde_yaml::from_str(&node_values).unwrap();
    spec["sources"][1]["repoURL"] = json!(argocd.git_url());
    for rule in spec["ignoreDifferences"].as_array_mut().unwrap() {
        rule["namespace"] = json!(NAMESPACE);
    }
    app
}

/// The Application's live object.
pub fn live_application(argocd: &ArgoCd) -> Value {
    argocd.application(RELEASE).unwrap()
}

/// Argo CD's health (status, message) of the Application's resource of `kind`, as it reports it
/// in `status.resources`: the one named `name`, or the first of that kind when `name` is `None`.
pub fn resource_health(app: &Value, kind: &str, name: Option<&str>) -> Option<(String, String)> {
    let r = app["status"]["resources"]
        .as_array()?
        .iter()
        .find(|r| r["kind"] == kind && name.is_none_or(|n| r["name"] == n))?;
    Some((
        r["health"]["status"].as_str()?.to_string(),
        r["health"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    ))
}

/// The Application's `status.sync.status`, `status.health.status` and `status.reconciledAt`.
pub fn app_state(app: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&app["status"]["sync"]["status"]),
        s(&app["status"]["health"]["status"]),
        s(&app["status"]["reconciledAt"]),
    )
}

/// What [`synced_application`] returns: the commit the plugin is in.
pub struct Synced {
    /// The commit.
    pub commit: String,
}

/// Once per test binary: the operator installed (`kubectl apply -k config/default`), the static
/// volume of the chart's claim, the plugin committed to Git, the Application created; returns
/// once it is `Synced` and `Healthy` at that commit and the vCluster's pod runs with the
/// plugin's container (the operator rolled the StatefulSet).
pub async fn synced_application() -> &'static Synced {
    static SYNCED: tokio::sync::OnceCell<Synced> = tokio::sync::OnceCell::const_new();
    SYNCED
        .get_or_init(|| async {
            let node = Node::shared();
            installed_operator().await;
            let argocd = argocd();
            let tools = tool_values();
            let data = node.dir().join(format!("run/pv/{NAMESPACE}-{RELEASE}"));
            let pv = std::fs::read_to_string(&tools["VCLUSTER_PV"])
                .unwrap()
                .replace("@NAME@", &format!("{NAMESPACE}-{RELEASE}-data"))
                .replace("@NAMESPACE@", NAMESPACE)
                .replace("@CLAIM@", &format!("data-{RELEASE}-0"))
                .replace("@PATH@", &data.to_string_lossy());
            argocd.kubectl(&["apply", "-f", "-"], Some(&pv)).unwrap();
            let commit = argocd
                .commit(
                    &[(&plugin_path(PLUGIN), &plugin_manifest())],
                    "the pod hook plugin",
                )
                .unwrap();
            let started = Instant::now();
            argocd
                .kubectl(
                    &["apply", "-f", "-"],
                    Some(&application(argocd).to_string()),
                )
                .unwrap();
            let synced = poll_for(Duration::from_secs(600), || {
                let app = live_application(argocd);
                let commit = commit.clone();
                let (sync, health, _) = app_state(&app);
                let revisions = app["status"]["sync"]["revisions"].clone();
                async move {
                    (sync == "Synced"
                        && health == "Healthy"
                        && revisions == json!([CHART_VERSION, commit]))
                    .then_some(())
                }
            })
            .await;
            if synced.is_none() {
                panic!(
                    "the Application was not Synced and Healthy at {CHART_VERSION} and {commit} \
                     within 600 s:\n{}\ncontroller:\n{}\nrepo server:\n{}\npods:\n{}",
                    serde_json::to_string_pretty(&live_application(argocd)["status"]).unwrap(),
                    argocd.log_tail("application-controller", 30),
                    argocd.log_tail("repo-server", 20),
                    node.kubectl(&["-n", NAMESPACE, "get", "pods,vcp", "-o", "wide"])
                        .unwrap_or_else(|e| e.to_string())
                );
            }
            eprintln!(
                "gitops: Application created -> Synced and Healthy in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            Synced { commit }
        })
        .await
}

#[tokio::test]
async fn gitops_install_the_sample_application_syncs_the_chart_and_a_plugin_from_git() {
    let _scenario = scenario_lock().lock().await;
    let synced = synced_application().await;
    let node = Node::shared();
    let argocd = argocd();
    let client = node.client().await.unwrap();

    // Synced at the served chart version and the commit, Healthy, by an automated sync.
    let app = live_application(argocd);
    let (sync, health, _) = app_state(&app);
    assert_eq!((sync.as_str(), health.as_str()), ("Synced", "Healthy"));
    assert_eq!(
        app["status"]["sync"]["revisions"],
        json!([CHART_VERSION, synced.commit])
    );
    assert_eq!(
        app["status"]["operationState"]["phase"], "Succeeded",
        "{}",
        app["status"]["operationState"]
    );

    // The chart's StatefulSet, written by Argo CD, holds the operator's container beside
    // vCluster's syncer, under the operator's field manager; its pod runs both.
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NAMESPACE);
    let live = sts.get(RELEASE).await.unwrap();
    let managers: Vec<String> = live
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m == ARGOCD_FIELD_MANAGER)
            && managers.iter().any(|m| m == "vcluster-plugin-operator"),
        "managers of the StatefulSet: {managers:?}"
    );
    let mut containers: Vec<String> = live
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    containers.sort();
    assert_eq!(containers, [PLUGIN, "syncer"], "the live StatefulSet");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = pods.get(&format!("{RELEASE}-0")).await.unwrap();
    assert!(pod_ready(&pod), "the vCluster pod: {:?}", pod.status);
    assert_eq!(ready_containers(&pod), [PLUGIN, "syncer"]);
    // Applied with the chart, the runtime container started before vCluster wrote its
    // kubeconfig Secret, or after: either way it waited for the file and never restarted.
    let restarts: Vec<(String, i32)> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.name, c.restart_count))
        .collect();
    assert!(
        restarts.iter().all(|(_, n)| *n == 0),
        "restarts in the vCluster pod: {restarts:?}"
    );
    let waited = node
        .kubectl(&[
            "-n",
            NAMESPACE,
            "logs",
            &format!("{RELEASE}-0"),
            "-c",
            PLUGIN,
        ])
        .unwrap_or_default()
        .contains("waiting for the virtual cluster's kubeconfig");
    eprintln!("gitops: the runtime container waited for vCluster's kubeconfig Secret: {waited}");
    let sts_health = resource_health(&app, "StatefulSet", None);
    assert_eq!(
        sts_health.as_ref().map(|(status, _)| status.as_str()),
        Some("Healthy"),
        "Argo CD's health of the StatefulSet: {sts_health:?}"
    );
    eprintln!("gitops: Argo CD's health of the StatefulSet: {sts_health:?}");

    // The plugin is Ready with its runtime's report in (a `Ready=True` before the runtime's
    // first report can turn into `Starting` while the runtime lists), and Argo CD's health of it
    // is the shipped Lua's: Healthy with the Ready condition's `reason: message` (Argo CD has no
    // built-in health for vcp.dev kinds: without argocd-cm's check there would be none). Argo CD
    // refreshes on the plugin's status change, so both are read until they agree.
    assert_plugin_ready(node, NAMESPACE, PLUGIN, 60, " (synced by Argo CD)");
    let condition = |plugin: &Value, type_: &str| -> Option<Value> {
        plugin["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
    };
    let mut last = (None, None);
    let agreed = poll_for(Duration::from_secs(120), || {
        let plugin: Option<Value> = node
            .kubectl(&["-n", NAMESPACE, "get", "vcp", PLUGIN, "-o", "json"])
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        let health = resource_health(&live_application(argocd), "VClusterPlugin", None);
        let expected = plugin.as_ref().and_then(|plugin| {
            let ready = condition(plugin, "Ready")?;
            let runtime = condition(plugin, "RuntimeHealthy")?;
            if ready["status"] != "True" || runtime["status"] != "True" {
                return None;
            }
            // `reason: message`, the message `Installed` when the condition has none (the
            // status reasons' table, "Argo CD": Healthy, "Installed").
            let message = ready["message"].as_str().unwrap_or_default();
            Some((
                "Healthy".to_string(),
                format!(
                    "{}: {}",
                    ready["reason"].as_str().unwrap_or_default(),
                    if message.is_empty() {
                        "Installed"
                    } else {
                        message
                    }
                ),
            ))
        });
        let agree = expected.is_some() && health == expected;
        last = (health, plugin.map(|p| p["status"].clone()));
        async move { agree.then_some(()) }
    })
    .await;
    assert!(
        agreed.is_some(),
        "within 120 s, the plugin was not Ready with RuntimeHealthy=True and Argo CD's health of \
         it the shipped Lua's: Argo CD's health {:?}, the plugin's status {:?}",
        last.0,
        last.1
    );
}

/// The node API server's audit log: each complete JSON line.
fn audit_events(node: &Node) -> Vec<Value> {
    let text = std::fs::read_to_string(node.dir().join("audit.log")).unwrap();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the node's audit log holds every request answered before this call
/// ([`vcp_tests::audit_caught_up_in`]: a dry-run marker sent after them, whose event is written
/// after theirs).
async fn audit_caught_up(node: &Node) {
    vcp_tests::audit_caught_up_in(node.client().await.unwrap(), &node.dir().join("audit.log"))
        .await;
}

/// The writes to the StatefulSet `NAMESPACE/RELEASE` among `events`: `(user agent, verb,
/// request URI, response code)`.
fn statefulset_writes(events: &[Value]) -> Vec<(String, String, String, i64)> {
    events
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "statefulsets"
                && e["objectRef"]["namespace"] == NAMESPACE
                && e["objectRef"]["name"] == RELEASE
                && e["stage"] == "ResponseComplete"
        })
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["userAgent"]),
                s(&e["verb"]),
                s(&e["requestURI"]),
                e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

/// Whether a request was Argo CD's application controller's (user agent or field manager).
fn by_argocd(write: &(String, String, String, i64)) -> bool {
    write.0.starts_with(ARGOCD_USER_AGENT)
        || write
            .2
            .contains(&format!("fieldManager={ARGOCD_FIELD_MANAGER}"))
}

/// Whether a request was a dry run (`dryRun=All`: admitted, never stored; Argo CD's
/// server-side diff makes them), so not a write.
fn dry_run(write: &(String, String, String, i64)) -> bool {
    write.2.contains("dryRun=All")
}

/// Asks Argo CD's controller for a hard refresh of the Application (manifests regenerated, the
/// repo server's cache bypassed, Git's branch resolved again): the annotation
/// `argocd.argoproj.io/refresh=hard`, which the controller takes off once it has compared again.
pub fn request_hard_refresh(argocd: &ArgoCd) {
    argocd
        .kubectl(
            &[
                "-n",
                argocd_local::NAMESPACE,
                "annotate",
                "--overwrite",
                "application",
                RELEASE,
                "argocd.argoproj.io/refresh=hard",
            ],
            None,
        )
        .unwrap();
}

/// The controller's log lines of the Application's hard refreshes (`Refreshing app status
/// (hard refresh requested), level (3)`: compared with the latest manifests, regenerated).
fn hard_refreshes(argocd: &ArgoCd) -> Vec<String> {
    argocd.log_lines(
        "application-controller",
        &[
            "Refreshing app status (hard refresh requested)",
            &format!("application={RELEASE}"),
        ],
    )
}

/// The no-fight window, in the Application's current compare mode (`mode` names it in
/// messages): three reconciles (`status.reconciledAt` advancing, the StatefulSet among the
/// compared resources), one forced hard refresh and one reconcile after it; then asserts, from
/// the node's audit log, that Argo CD's controller wrote nothing to the StatefulSet (dry runs
/// are no writes), and that the Application is still Synced and Healthy. Returns the number of
/// Argo CD's dry-run requests on the StatefulSet in the window (server-side diff makes them).
async fn assert_no_fight(node: &Node, argocd: &ArgoCd, mode: &str) -> usize {
    // The window starts once every write so far is in the audit log.
    audit_caught_up(node).await;
    let before = audit_events(node).len();
    let all_before = statefulset_writes(&audit_events(node));
    assert!(
        all_before.iter().any(by_argocd),
        "the audit log does not show Argo CD's own creation of the StatefulSet, so it cannot \
         show its writes: {all_before:?}"
    );
    let reconciles_before = argocd
        .log_lines(
            "application-controller",
            &[
                "Reconciliation completed",
                &format!("application={RELEASE}"),
            ],
        )
        .len();

    // Three reconciles (status.reconciledAt advancing), each seeing the StatefulSet Synced.
    let mut reconciled = vec![app_state(&live_application(argocd)).2];
    let started = Instant::now();
    while reconciled.len() < 4 {
        let next = poll_for(Duration::from_secs(60), || {
            let app = live_application(argocd);
            let last = reconciled.last().unwrap().clone();
            async move {
                let (_, _, at) = app_state(&app);
                (at != last).then_some(app)
            }
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "no reconcile of the Application within 60 s after {reconciled:?}:\n{}",
                argocd.log_tail("application-controller", 20)
            )
        });
        let sts = next["status"]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == "StatefulSet")
            .cloned()
            .unwrap();
        eprintln!(
            "gitops: reconcile at {} ({:.1} s): Application {:?}, StatefulSet {}",
            app_state(&next).2,
            started.elapsed().as_secs_f64(),
            (
                next["status"]["sync"]["status"].as_str(),
                next["status"]["health"]["status"].as_str()
            ),
            sts["status"]
        );
        reconciled.push(app_state(&next).2);
    }

    let hard_before = hard_refreshes(argocd).len();
    request_hard_refresh(argocd);
    let last = reconciled.last().unwrap().clone();
    let refreshed = poll_for(Duration::from_secs(120), || {
        let app = live_application(argocd);
        let last = last.clone();
        async move {
            let pending = app["metadata"]["annotations"]["argocd.argoproj.io/refresh"].is_string();
            (!pending && app_state(&app).2 != last).then_some(app)
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the hard refresh was not done within 120 s:\n{}",
            argocd.log_tail("application-controller", 20)
        )
    });
    reconciled.push(app_state(&refreshed).2);
    let hard = hard_refreshes(argocd);
    assert!(
        hard.len() > hard_before,
        "{mode}: the controller logged no hard refresh of {RELEASE}"
    );
    eprintln!(
        "gitops: hard refresh done at {}; controller: {}",
        app_state(&refreshed).2,
        hard.last().map(String::as_str).unwrap_or_default()
    );
    // One more reconcile after it, so that a self-heal the refresh decided on has run.
    let settled = poll_for(Duration::from_secs(60), || {
        let app = live_application(argocd);
        let last = reconciled.last().unwrap().clone();
        async move { (app_state(&app).2 != last).then_some(app) }
    })
    .await
    .expect("a reconcile after the hard refresh");
    reconciled.push(app_state(&settled).2);

    audit_caught_up(node).await;
    let events = audit_events(node);
    let window = statefulset_writes(&events[before..]);
    let reconciles = argocd
        .log_lines(
            "application-controller",
            &[
                "Reconciliation completed",
                &format!("application={RELEASE}"),
            ],
        )
        .len()
        - reconciles_before;
    eprintln!(
        "gitops: reconciledAt {reconciled:?}; the controller logged {reconciles} reconciliations \
         of {RELEASE}; writes to the StatefulSet in the window: {window:?}"
    );
    assert!(
        reconciles >= 5,
        "the controller's reconciliations: {reconciles}"
    );
    let argocd_writes: Vec<_> = window
        .iter()
        .filter(|w| by_argocd(w) && !dry_run(w))
        .collect();
    assert!(
        argocd_writes.is_empty(),
        "Argo CD wrote to the StatefulSet {NAMESPACE}/{RELEASE} ({mode}; self-heal against the \
         operator): {argocd_writes:#?}\nall writes to it in the window: {window:#?}\nthe \
         Application's last operation: {}",
        settled["status"]["operationState"]
    );
    let (sync, health, _) = app_state(&settled);
    assert_eq!(
        (sync.as_str(), health.as_str()),
        ("Synced", "Healthy"),
        "{mode}"
    );
    window.iter().filter(|w| by_argocd(w) && dry_run(w)).count()
}

#[tokio::test]
async fn gitops_no_fight_selfheal_writes_nothing_to_the_statefulset_the_operator_patched() {
    let _scenario = scenario_lock().lock().await;
    synced_application().await;
    let node = Node::shared();
    let argocd = argocd();
    let app = live_application(argocd);
    assert_eq!(
        app["spec"]["ignoreDifferences"][0]["managedFieldsManagers"],
        json!(["vcluster-plugin-operator"]),
        "the sample's ignoreDifferences"
    );
    assert_eq!(app["spec"]["syncPolicy"]["automated"]["selfHeal"], true);
    assert_no_fight(
        node,
        argocd,
        "the sample's ignoreDifferences, client-side diff",
    )
    .await;

    // The control: real drift on a field the chart owns (the StatefulSet's `heritage` label,
    // which rolls nothing) is healed, and the same count sees Argo CD's write.
    audit_caught_up(node).await;
    let before = audit_events(node).len();
    node.kubectl(&[
        "-n",
        NAMESPACE,
        "label",
        "--overwrite",
        "statefulset",
        RELEASE,
        "heritage=drift",
    ])
    .unwrap();
    let healed = poll_for(Duration::from_secs(120), || {
        let label = node
            .kubectl(&[
                "-n",
                NAMESPACE,
                "get",
                "statefulset",
                RELEASE,
                "-o",
                "jsonpath={.metadata.labels.heritage}",
            ])
            .unwrap_or_default();
        async move { (label == "Helm").then_some(()) }
    })
    .await;
    assert!(
        healed.is_some(),
        "Argo CD did not heal the label heritage=drift within 120 s:\n{}",
        argocd.log_tail("application-controller", 20)
    );
    audit_caught_up(node).await;
    let heal: Vec<_> = statefulset_writes(&audit_events(node)[before..])
        .into_iter()
        .filter(|w| by_argocd(w) && !dry_run(w))
        .collect();
    eprintln!("gitops: the control's drift healed by: {heal:?}");
    assert!(
        heal.iter().any(|w| w.1 == "patch" && w.3 == 200),
        "the audit log does not show Argo CD's self-heal patch of the StatefulSet: {heal:?}"
    );
    // Its self-heal left the operator's container in place.
    assert_eq!(statefulset_containers(node).await, [PLUGIN, "syncer"]);
}

/// The container names of the live StatefulSet's pod template, sorted.
pub async fn statefulset_containers(node: &Node) -> Vec<String> {
    let sts: Api<StatefulSet> = Api::namespaced(node.client().await.unwrap(), NAMESPACE);
    let mut names: Vec<String> = sts
        .get(RELEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Restores the Application's spec and annotations (as [`application`] makes them) when
/// dropped, so that a failed server-side diff test leaves the shared Application as the others
/// expect it.
struct RestoreApplication(&'static ArgoCd);

impl Drop for RestoreApplication {
    fn drop(&mut self) {
        let argocd = self.0;
        let _ = argocd.kubectl(
            &[
                "-n",
                argocd_local::NAMESPACE,
                "annotate",
                "application",
                RELEASE,
                "argocd.argoproj.io/compare-options-",
            ],
            None,
        );
        let _ = argocd.kubectl(
            &["apply", "-f", "-"],
            Some(&application(argocd).to_string()),
        );
    }
}

#[tokio::test]
async fn gitops_server_side_diff_without_ignore_differences_does_not_fight_either() {
    let _scenario = scenario_lock().lock().await;
    synced_application().await;
    let node = Node::shared();
    let argocd = argocd();
    let _restore = RestoreApplication(argocd);

    // The Application without its ignoreDifferences, compared by Argo CD's server-side diff.
    let mut app = application(argocd);
    app["spec"]
        .as_object_mut()
        .unwrap()
        .remove("ignoreDifferences");
    app["metadata"]["annotations"] =
        json!({"argocd.argoproj.io/compare-options": "ServerSideDiff=true"});
    audit_caught_up(node).await;
    let before = audit_events(node).len();
    argocd
        .kubectl(&["apply", "-f", "-"], Some(&app.to_string()))
        .unwrap();
    let live = live_application(argocd);
    assert!(
        live["spec"]["ignoreDifferences"].is_null(),
        "{}",
        live["spec"]
    );
    // Server-side diff shows itself in the audit log: Argo CD's dry-run apply of the
    // StatefulSet (`dryRun=All`, under its field manager).
    let compared = poll_for(Duration::from_secs(60), || {
        let dry = statefulset_writes(&audit_events(node)[before..])
            .into_iter()
            .filter(|w| by_argocd(w) && dry_run(w))
            .count();
        async move { (dry > 0).then_some(dry) }
    })
    .await;
    assert!(
        compared.is_some(),
        "no dry-run apply of the StatefulSet by Argo CD within 60 s of ServerSideDiff=true:\n{}",
        argocd.log_tail("application-controller", 20)
    );
    let dry_runs = assert_no_fight(node, argocd, "server-side diff, no ignoreDifferences").await;
    eprintln!(
        "gitops: server-side diff: {} dry-run applies of the StatefulSet when switched on, {dry_runs} \
         in the no-fight window",
        compared.unwrap()
    );
    assert_eq!(statefulset_containers(node).await, [PLUGIN, "syncer"]);
}
