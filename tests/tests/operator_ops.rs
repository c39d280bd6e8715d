//! The operator's operations, drift handling, lifecycle, idempotency and status, end to end on
//! the real host API server (RBAC on). Every operator runs in-process under the
//! `vcp-operator` identity (config/rbac) on a runtime of its own, so a test can stop it
//! gracefully or kill it (drop its runtime: no cleanup, no Lease release, like a crashed pod).
//! Each replica sends its own `User-Agent`, so the audit log tells replicas apart.
//!
//! Tests that run an operator hold [`LOCK`]: two operators of one control plane would both
//! reconcile every plugin. Each test keeps to its own namespaces.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, OnceCell, oneshot};
use vcluster_plugin_operator::policy::Policy;
use vcluster_plugin_operator::{Config, LeaderElection, Telemetry, run_until};
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};
use vcp_tests::{
    AuditedWrite, Cluster, ControlPlane, Identity, condition, create_plugin, delete_plugin,
    wait_for, wait_ready,
};

const RUNTIME_IMAGE: &str = "vcp-test/runtime:e2e";
const TIMEOUT: Duration = Duration::from_secs(60);
const VC: &str = "my-vcluster";

/// Serializes the tests that run an operator.
static LOCK: Mutex<()> = Mutex::const_new(());

// ---------------------------------------------------------------------------------------------
// Support

/// CRDs, the operator's RBAC (cluster and leader-election), namespace `vcp-system`; once.
async fn setup() -> Client {
    static SETUP: OnceCell<()> = OnceCell::const_new();
    let cp = ControlPlane::shared();
    SETUP
        .get_or_init(|| async {
            let admin = cp.client(Cluster::Host, Identity::Admin).await;
            vcp_tests::install_operator_rbac(&admin).await;
        })
        .await;
    cp.client(Cluster::Host, Identity::Admin).await
}

fn user_agent(replica: &str) -> String {
    format!("vcluster-plugin-operator/{replica}")
}

/// One operator replica on its own runtime, serving /metrics, /healthz, /readyz on a free port.
struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    telemetry: Arc<Telemetry>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<Result<(), String>>>,
}

impl Replica {
    async fn start(name: &str, election: Option<LeaderElection>) -> Replica {
        Replica::start_with_policy(name, election, Policy::default()).await
    }

    /// A replica with the operator policy `policy` (what `--policy-file` sets).
    async fn start_with_policy(
        name: &str,
        election: Option<LeaderElection>,
        policy: Policy,
    ) -> Replica {
        let mut kc = ControlPlane::shared()
            .config(Cluster::Host, Identity::Operator)
            .await
            .expect("operator kubeconfig");
        kc.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(&user_agent(name)).unwrap(),
        ));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("replica runtime");
        let telemetry = Arc::new(Telemetry::new());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let (addr_tx, addr_rx) = oneshot::channel();
        let t = telemetry.clone();
        let instance = name.to_string();
        runtime.spawn(async move {
            let client = Client::try_from(kc).expect("operator client");
            let listener = vcluster_plugin_operator::http::bind("127.0.0.1:0".parse().unwrap())
                .await
                .expect("bind");
            let _ = addr_tx.send(listener.local_addr().unwrap());
            tokio::spawn(vcluster_plugin_operator::http::serve(
                listener,
                t.clone(),
                std::future::pending(),
            ));
            let mut config = Config::new(client);
            config.runtime_image = RUNTIME_IMAGE.into();
            config.telemetry = t;
            config.leader_election = election;
            config.instance = Some(instance);
            config.policy = policy;
            let res = run_until(config, async {
                let _ = stop_rx.await;
            })
            .await;
            let _ = done_tx.send(res.map_err(|e| e.to_string()));
        });
        let addr = addr_rx.await.expect("replica started");
        Replica {
            runtime: Some(runtime),
            telemetry,
            addr,
            stop: Some(stop_tx),
            done: Some(done_rx),
        }
    }

    /// Graceful stop (as on SIGTERM): `run_until` must return `Ok`.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let res = self.done.take().unwrap().await.expect("operator ended");
        assert_eq!(res, Ok(()), "graceful stop");
        self.runtime.take().unwrap().shutdown_background();
    }

    /// Dies on the spot: nothing more runs, nothing is released.
    fn kill(mut self) {
        self.runtime.take().unwrap().shutdown_background();
    }

    async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).await
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A minimal HTTP/1.1 GET: status code and body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// The value of a metric line `name` (exact, with labels) in a Prometheus text body.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    StatefulSet,
    Deployment,
}

/// The chart values that make vCluster's chart render a Deployment instead of a StatefulSet
/// (no volume claim: the data lives in an emptyDir).
const DEPLOYMENT_VALUES: &str =
    "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: false\n";

/// Creates the vCluster in `ns` as its chart (vCluster v0.30.0) renders it, the way
/// `helm install` does (field manager `helm`): its ServiceAccounts, config Secret and Services
/// once, and the workload `my-vcluster` of `kind`; returns the workload's original
/// `spec.template`.
async fn create_workload(admin: &Client, ns: &str, kind: Kind) -> Value {
    let values = match kind {
        Kind::StatefulSet => "",
        Kind::Deployment => DEPLOYMENT_VALUES,
    };
    let yaml = vcp_tests::vcluster_workload_with(ns, values);
    let mut workload = None;
    for doc in yaml.split("---\n") {
        let created = vcp_tests::create_yaml(admin, doc, Some(ns), "helm").await;
        let is_workload =
            doc.contains("\nkind: StatefulSet\n") || doc.contains("\nkind: Deployment\n");
        match created {
            Ok(objects) => {
                for object in objects {
                    if object
                        .types
                        .as_ref()
                        .is_some_and(|t| t.kind == "StatefulSet" || t.kind == "Deployment")
                    {
                        workload = Some(object);
                    }
                }
            }
            // the ServiceAccounts, Secret and Services survive a deleted workload
            Err(error) if !is_workload && format!("{error:#}").contains("AlreadyExists") => {}
            Err(error) => panic!("create the vCluster: {error:#}"),
        }
    }
    // the template as the typed objects serialize it, like `template` reads it back
    let workload = serde_json::to_value(workload.expect("the chart's workload")).expect("json");
    match kind {
        Kind::StatefulSet => {
            let sts: StatefulSet = serde_json::from_value(workload).expect("StatefulSet");
            serde_json::to_value(sts.spec.expect("spec").template)
        }
        Kind::Deployment => {
            let d: Deployment = serde_json::from_value(workload).expect("Deployment");
            serde_json::to_value(d.spec.expect("spec").template)
        }
    }
    .expect("json")
}

async fn vcluster(admin: &Client, ns: &str, kind: Kind) -> Value {
    vcp_tests::create_namespace(admin, ns).await;
    create_workload(admin, ns, kind).await
}

/// The live pod template of the workload.
async fn template(admin: &Client, ns: &str, kind: Kind) -> Value {
    match kind {
        Kind::StatefulSet => serde_json::to_value(
            Api::<StatefulSet>::namespaced(admin.clone(), ns)
                .get(VC)
                .await
                .expect("get StatefulSet")
                .spec
                .unwrap()
                .template,
        ),
        Kind::Deployment => serde_json::to_value(
            Api::<Deployment>::namespaced(admin.clone(), ns)
                .get(VC)
                .await
                .expect("get Deployment")
                .spec
                .unwrap()
                .template,
        ),
    }
    .unwrap()
}

fn containers(template: &Value, list: &str) -> Vec<Value> {
    template["spec"][list]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn container_names(template: &Value, list: &str) -> Vec<String> {
    containers(template, list)
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

fn container<'a>(template: &'a Value, name: &str) -> &'a Value {
    template["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {template:#}"))
}

/// The operator's (user `vcp-operator`) write requests so far concerning namespace `ns` or its
/// cluster-scoped objects, Leases excluded.
fn operator_writes(ns: &str) -> Vec<AuditedWrite> {
    vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| w.user == Identity::Operator.user() && !w.uri.contains("/leases"))
        .filter(|w| {
            w.uri.contains(&format!("/namespaces/{ns}/")) || w.uri.contains(&format!("vcp:{ns}:"))
        })
        .collect()
}

/// Merge-patches an annotation onto the plugin (a watch event: one more reconcile).
async fn touch_plugin(admin: &Client, ns: &str, name: &str, value: &str) {
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": value } } })),
        )
        .await
        .expect("touch plugin");
}

/// Waits until `replica` has finished at least `n` reconciles.
async fn wait_reconciles(replica: &Replica, n: u64) {
    let t = replica.telemetry.clone();
    wait_for(TIMEOUT, || {
        let t = t.clone();
        async move { (t.reconciles() >= n).then_some(()) }
    })
    .await;
}

fn embedded_car_spec() -> Value {
    json!({
        "vcluster": { "name": VC },
        "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }],
    })
}

// ---------------------------------------------------------------------------------------------
// Least privilege (item 9)

/// No rule of the operator's RBAC (config/rbac/*.yaml) uses a wildcard.
#[test]
fn operator_rbac_has_no_wildcards() {
    let dir = vcp_tests::repo_root().join("config/rbac");
    let mut rules_seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.file_name().and_then(|n| n.to_str()) == Some("kustomization.yaml")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).unwrap();
            for rule in value["rules"].as_array().into_iter().flatten() {
                rules_seen += 1;
                for field in [
                    "apiGroups",
                    "resources",
                    "verbs",
                    "resourceNames",
                    "nonResourceURLs",
                ] {
                    for item in rule[field].as_array().into_iter().flatten() {
                        let s = item.as_str().unwrap_or_default();
                        assert!(
                            !s.contains('*'),
                            "{}: wildcard {s:?} in {field} of {rule}",
                            path.display()
                        );
                    }
                }
            }
        }
    }
    assert!(
        rules_seen >= 6,
        "read the rules of config/rbac ({rules_seen})"
    );
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    assert!(
        kustomization.contains("leader_election_role.yaml"),
        "the Lease Role is deployed with the rest"
    );
}

// ---------------------------------------------------------------------------------------------
// Operations (item 8)

/// Two replicas on one Lease: only the holder reconciles and writes; a standby is ready but
/// idle; killing the leader (no release) lets the standby take over once the Lease expired;
/// a graceful stop releases the Lease.
#[tokio::test]
async fn two_replicas_only_the_leader_writes_and_a_dead_leader_is_replaced() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-ha";
    vcluster(&admin, ns, Kind::StatefulSet).await;
    let election = |id: &str| LeaderElection {
        lease_name: "ops-ha".into(),
        namespace: "vcp-system".into(),
        identity: id.into(),
        duration_seconds: 4,
    };
    let leases = Api::<Lease>::namespaced(admin.clone(), "vcp-system");
    let holder = || {
        let leases = leases.clone();
        async move {
            leases
                .get_opt("ops-ha")
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
        }
    };

    let a = Replica::start("replica-a", Some(election("replica-a"))).await;
    let ta = a.telemetry.clone();
    wait_for(TIMEOUT, || {
        let ta = ta.clone();
        async move { ta.is_leading().then_some(()) }
    })
    .await;
    let b = Replica::start("replica-b", Some(election("replica-b"))).await;
    // The standby is ready (it knows it does not lead) and says so.
    wait_for(TIMEOUT, || async {
        (b.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    let (_, b_metrics) = b.get("/metrics").await;
    assert_eq!(metric(&b_metrics, "vcp_leader"), Some(0.0), "{b_metrics}");
    assert_eq!(holder().await.as_deref(), Some("replica-a"));

    create_plugin(&admin, ns, "first", embedded_car_spec()).await;
    wait_ready(&admin, ns, "first", "True", None, TIMEOUT).await;
    let writes = operator_writes(ns);
    assert!(
        writes
            .iter()
            .any(|w| w.user_agent == user_agent("replica-a")),
        "the leader installed the plugin: {writes:?}"
    );
    assert!(
        writes
            .iter()
            .all(|w| w.user_agent == user_agent("replica-a")),
        "only the leader writes: {writes:?}"
    );
    assert_eq!(
        b.telemetry.reconciles(),
        0,
        "the standby reconciles nothing"
    );

    // The leader dies without releasing the Lease.
    let before = writes.len();
    let killed = Instant::now();
    a.kill();
    let tb = b.telemetry.clone();
    wait_for(Duration::from_secs(3 * 4 + 10), || {
        let tb = tb.clone();
        async move { tb.is_leading().then_some(()) }
    })
    .await;
    println!(
        "handover after the leader was killed: {:?} (lease duration 4 s)",
        killed.elapsed()
    );
    assert_eq!(holder().await.as_deref(), Some("replica-b"));

    // (Not a second Car syncer: that would be a Conflict with `first`.)
    create_plugin(&admin, ns, "second", json!({ "vcluster": { "name": VC } })).await;
    wait_ready(&admin, ns, "second", "True", None, TIMEOUT).await;
    let after: Vec<_> = operator_writes(ns).into_iter().skip(before).collect();
    assert!(!after.is_empty(), "the new leader installed `second`");
    assert!(
        after
            .iter()
            .all(|w| w.user_agent == user_agent("replica-b")),
        "only the new leader writes: {after:?}"
    );
    let (_, b_metrics) = b.get("/metrics").await;
    assert_eq!(metric(&b_metrics, "vcp_leader"), Some(1.0), "{b_metrics}");

    // SIGTERM-like stop: the Lease is released for the next replica at once.
    b.stop().await;
    assert_eq!(holder().await, None, "a graceful stop releases the Lease");
}

/// `/healthz`, `/readyz` and `/metrics` (reconcile count by result, duration histogram,
/// leader gauge) of a replica without leader election; unknown paths are 404.
#[tokio::test]
async fn metrics_healthz_and_readyz_are_served() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-metrics";
    vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("metrics", None).await;
    assert_eq!(r.get("/healthz").await, (200, "ok\n".to_string()));
    wait_for(TIMEOUT, || async {
        (r.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(r.get("/nope").await.0, 404);

    create_plugin(&admin, ns, "measured", embedded_car_spec()).await;
    wait_ready(&admin, ns, "measured", "True", None, TIMEOUT).await;
    wait_reconciles(&r, 1).await;
    let (code, body) = r.get("/metrics").await;
    assert_eq!(code, 200);
    let success = metric(&body, "vcp_reconcile_total{result=\"success\"}").unwrap_or(0.0);
    assert!(success >= 1.0, "{body}");
    let count = metric(&body, "vcp_reconcile_duration_seconds_count").expect("histogram count");
    assert!(count >= success, "{body}");
    assert!(
        body.contains("vcp_reconcile_duration_seconds_bucket{le=\"+Inf\"}"),
        "{body}"
    );
    assert_eq!(
        metric(&body, "vcp_reconcile_total{result=\"error\"}"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(metric(&body, "vcp_leader"), Some(1.0), "{body}");
    r.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Drift and lifecycle (item 5)

/// The sidecar removed by someone else — a full update without it (a replace-style upgrade) or
/// a JSON patch — is added back; a foreign server-side apply without it leaves it alone.
#[tokio::test]
async fn removed_sidecar_is_added_back() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-drift-sidecar";
    let original = vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("drift-sidecar", None).await;
    create_plugin(&admin, ns, "car-syncer", embedded_car_spec()).await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let installed = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&installed, "containers"),
        ["syncer", "car-syncer"]
    );

    let api = Api::<StatefulSet>::namespaced(admin.clone(), ns);
    let back = || {
        let admin = admin.clone();
        let installed = installed.clone();
        async move { (template(&admin, ns, Kind::StatefulSet).await == installed).then_some(()) }
    };

    // A replace-style upgrade: the whole object without the sidecar, by another manager.
    let mut live = api.get(VC).await.unwrap();
    live.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers
        .retain(|c| c.name == "syncer");
    live.metadata.managed_fields = None;
    api.replace(
        VC,
        &PostParams {
            field_manager: Some("helm".into()),
            ..Default::default()
        },
        &live,
    )
    .await
    .expect("replace without the sidecar");
    wait_for(TIMEOUT, back).await;

    // A JSON patch removing it.
    api.patch(
        VC,
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([
                { "op": "test", "path": "/spec/template/spec/containers/1/name", "value": "car-syncer" },
                { "op": "remove", "path": "/spec/template/spec/containers/1" },
            ]))
            .unwrap(),
        ),
    )
    .await
    .expect("JSON patch removing the sidecar");
    wait_for(TIMEOUT, back).await;

    // A Helm-like server-side apply of the chart's own fields does not remove what the
    // operator owns: nothing to repair, and the sidecar stays.
    let chart: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": { "name": VC, "namespace": ns },
        "spec": { "serviceName": "my-vcluster-headless",
                  "selector": { "matchLabels": { "app": "vcluster", "release": VC } },
                  "template": original },
    }))
    .unwrap();
    api.patch(
        VC,
        &PatchParams::apply("helm").force(),
        &Patch::Apply(&chart),
    )
    .await
    .expect("helm apply");
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, installed);

    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    r.stop().await;
}

/// The dedicated Role edited by someone else is restored; its RoleBinding deleted is created
/// again.
#[tokio::test]
async fn edited_dedicated_role_is_restored() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-drift-role";
    vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("drift-role", None).await;
    create_plugin(&admin, ns, "car-syncer", embedded_car_spec()).await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let roles = Api::<Role>::namespaced(admin.clone(), ns);
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), ns);
    let role_name = "vcp-plugin-car-syncer";
    let rules = roles.get(role_name).await.expect("Role").rules;
    let subjects = bindings.get(role_name).await.expect("RoleBinding").subjects;

    roles
        .patch(
            role_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": [{
                "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"],
            }] })),
        )
        .await
        .expect("edit Role");
    wait_for(TIMEOUT, || {
        let roles = roles.clone();
        let rules = rules.clone();
        async move { (roles.get(role_name).await.ok()?.rules == rules).then_some(()) }
    })
    .await;

    bindings
        .delete(role_name, &DeleteParams::default())
        .await
        .expect("delete RoleBinding");
    wait_for(TIMEOUT, || {
        let bindings = bindings.clone();
        let subjects = subjects.clone();
        async move { (bindings.get_opt(role_name).await.ok()??.subjects == subjects).then_some(()) }
    })
    .await;
    let p = wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    assert_eq!(condition(&p, "RBACReady").unwrap().status, "True");
    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    r.stop().await;
}

/// The vCluster StatefulSet deleted → `Ready=False, VClusterNotFound` (phase Pending);
/// created again → installed again.
#[tokio::test]
async fn deleted_vcluster_is_reported_and_reinstalled_when_it_returns() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-vcluster-gone";
    let original = vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("vcluster-gone", None).await;
    create_plugin(&admin, ns, "car-syncer", embedded_car_spec()).await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;

    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .delete(VC, &DeleteParams::default())
        .await
        .expect("delete StatefulSet");
    let p = wait_ready(
        &admin,
        ns,
        "car-syncer",
        "False",
        Some("VClusterNotFound"),
        TIMEOUT,
    )
    .await;
    assert_eq!(
        p.status.as_ref().unwrap().phase,
        Some(vcp_crds::Phase::Pending)
    );
    assert!(condition(&p, "Ready").unwrap().message.contains(VC));

    let recreated = create_workload(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(recreated, original);
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let live = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&live, "containers"),
        ["syncer", "car-syncer"]
    );
    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    r.stop().await;
}

/// A plugin deleted while the operator is down keeps its finalizer and its sidecar; when the
/// operator returns it removes exactly what it added, then the finalizer.
#[tokio::test]
async fn plugin_deleted_while_the_operator_is_down_is_cleaned_up_when_it_returns() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-down";
    let original = vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("down-1", None).await;
    create_plugin(&admin, ns, "car-syncer", embedded_car_spec()).await;
    wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    r.stop().await;

    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    api.delete("car-syncer", &DeleteParams::default())
        .await
        .expect("delete plugin");
    let pending = api.get("car-syncer").await.expect("still there: finalizer");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.finalizers(), [vcp_crds::FINALIZER]);
    let live = template(&admin, ns, Kind::StatefulSet).await;
    assert_eq!(
        container_names(&live, "containers"),
        ["syncer", "car-syncer"]
    );

    let r = Replica::start("down-2", None).await;
    wait_for(TIMEOUT, || {
        let api = api.clone();
        async move {
            api.get_opt("car-syncer")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert_eq!(template(&admin, ns, Kind::StatefulSet).await, original);
    assert!(
        Api::<Role>::namespaced(admin.clone(), ns)
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none()
    );
    r.stop().await;
}

/// A vCluster that runs as a Deployment, with an embedded, a v2 and a v1 plugin (the v1 one
/// with every container field): each is added and removed without touching the others'
/// entries; removing the last restores the original template.
#[tokio::test]
async fn deployment_vcluster_with_several_plugins_added_and_removed_independently() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-deploy";
    let original = vcluster(&admin, ns, Kind::Deployment).await;
    // `legacy` mounts the vCluster's own volume `data`, which the default container policy
    // refuses: the platform team allows it (README, "Operator policy").
    let policy = Policy::from_yaml("containers:\n  allowedVolumes: [data]\n").unwrap();
    let r = Replica::start_with_policy("deploy", None, policy).await;

    create_plugin(&admin, ns, "embedded", embedded_car_spec()).await;
    let p = wait_ready(&admin, ns, "embedded", "True", None, TIMEOUT).await;
    let w = p.status.unwrap().workload.unwrap();
    assert_eq!((w.kind.as_str(), w.name.as_str()), ("Deployment", VC));
    let with_embedded = template(&admin, ns, Kind::Deployment).await;
    let embedded = container(&with_embedded, "embedded").clone();
    let syncer = container(&with_embedded, "syncer").clone();
    assert_eq!(syncer, original["spec"]["containers"][0]);

    create_plugin(
        &admin,
        ns,
        "legacy",
        json!({
            "vcluster": { "name": VC },
            "image": "ghcr.io/loft-sh/vcluster-example:0.0.1",
            "version": "v1",
            "imagePullPolicy": "Always",
            "command": ["/plugin"],
            "args": ["--verbose"],
            "env": [{ "name": "LOG_LEVEL", "value": "debug" }],
            "envFrom": [{ "configMapRef": { "name": "legacy-env" } }],
            "resources": { "requests": { "cpu": "10m" }, "limits": { "memory": "64Mi" } },
            "securityContext": { "runAsNonRoot": true, "readOnlyRootFilesystem": true },
            "volumeMounts": [{ "name": "data", "mountPath": "/legacy-data", "readOnly": true }],
            "config": { "greeting": "hello", "replicas": 2 },
        }),
    )
    .await;
    wait_ready(&admin, ns, "legacy", "True", None, TIMEOUT).await;
    let with_legacy = template(&admin, ns, Kind::Deployment).await;
    assert_eq!(
        container_names(&with_legacy, "containers"),
        ["syncer", "embedded", "legacy"]
    );
    assert_eq!(container(&with_legacy, "embedded"), &embedded, "untouched");
    assert_eq!(container(&with_legacy, "syncer"), &syncer, "untouched");
    let legacy: Container =
        serde_json::from_value(container(&with_legacy, "legacy").clone()).unwrap();
    assert_eq!(
        legacy.image.as_deref(),
        Some("ghcr.io/loft-sh/vcluster-example:0.0.1")
    );
    assert_eq!(legacy.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(legacy.command, Some(vec!["/plugin".to_string()]));
    assert_eq!(legacy.args, Some(vec!["--verbose".to_string()]));
    let env: Vec<(String, String)> = legacy
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    let config_yaml =
        serde_yaml::to_string(&json!({ "greeting": "hello", "replicas": 2 })).unwrap();
    assert_eq!(
        env,
        // the chart's order (tests/tests/oracle_chart.rs): the plugin address and name first
        [
            (
                "VCLUSTER_PLUGIN_ADDRESS".to_string(),
                "localhost:14000".to_string()
            ),
            ("VCLUSTER_PLUGIN_NAME".into(), "legacy".into()),
            ("LOG_LEVEL".into(), "debug".into()),
            ("PLUGIN_CONFIG".into(), config_yaml),
        ]
    );
    assert_eq!(
        serde_json::to_value(&legacy.env_from).unwrap(),
        json!([{ "configMapRef": { "name": "legacy-env" } }])
    );
    assert_eq!(
        serde_json::to_value(&legacy.resources).unwrap(),
        json!({ "requests": { "cpu": "10m" }, "limits": { "memory": "64Mi" } })
    );
    assert_eq!(
        serde_json::to_value(&legacy.security_context).unwrap(),
        json!({ "runAsNonRoot": true, "readOnlyRootFilesystem": true })
    );
    assert_eq!(
        serde_json::to_value(&legacy.volume_mounts).unwrap(),
        json!([{ "name": "data", "mountPath": "/legacy-data", "readOnly": true }])
    );
    let legacy_json = container(&with_legacy, "legacy").clone();

    create_plugin(
        &admin,
        ns,
        "v2",
        json!({ "vcluster": { "name": VC }, "image": "ghcr.io/example/v2-plugin:1.0" }),
    )
    .await;
    wait_ready(&admin, ns, "v2", "True", None, TIMEOUT).await;
    let with_v2 = template(&admin, ns, Kind::Deployment).await;
    // after the chart's own init container (init-container-order, tests/tests/oracle_chart.rs)
    assert_eq!(
        container_names(&with_v2, "initContainers"),
        ["kubernetes", "v2"]
    );
    assert_eq!(container(&with_v2, "embedded"), &embedded, "untouched");
    assert_eq!(container(&with_v2, "legacy"), &legacy_json, "untouched");

    // Remove them one at a time: what remains is exactly what it was.
    delete_plugin(&admin, ns, "legacy", TIMEOUT).await;
    let without_legacy = template(&admin, ns, Kind::Deployment).await;
    assert_eq!(
        container_names(&without_legacy, "containers"),
        ["syncer", "embedded"]
    );
    assert_eq!(container(&without_legacy, "embedded"), &embedded);
    assert_eq!(
        containers(&without_legacy, "initContainers"),
        containers(&with_v2, "initContainers")
    );
    assert_eq!(
        without_legacy["spec"]["volumes"],
        with_v2["spec"]["volumes"]
    );

    delete_plugin(&admin, ns, "v2", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::Deployment).await, with_embedded);

    delete_plugin(&admin, ns, "embedded", TIMEOUT).await;
    assert_eq!(template(&admin, ns, Kind::Deployment).await, original);
    r.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Status (item 7)

/// Conditions `Ready`, `WorkloadPatched`, `RBACReady`: `lastTransitionTime` stays on reconciles
/// that change nothing and on a new generation with the same status, and moves when the status
/// flips; Events `VClusterNotFound` (Warning) and `Installed` (Normal) on the VClusterPlugin.
#[tokio::test]
async fn conditions_move_only_on_a_change_and_events_are_published() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let ns = "ops-status";
    vcp_tests::create_namespace(&admin, ns).await;
    let r = Replica::start("status", None).await;
    create_plugin(&admin, ns, "watched", embedded_car_spec()).await;
    let missing = wait_ready(
        &admin,
        ns,
        "watched",
        "False",
        Some("VClusterNotFound"),
        TIMEOUT,
    )
    .await;
    let times = |p: &VClusterPlugin| -> Vec<(String, String, String)> {
        ["Ready", "WorkloadPatched", "RBACReady"]
            .iter()
            .map(|t| {
                let c = condition(p, t).unwrap_or_else(|| panic!("condition {t}"));
                (
                    c.type_.clone(),
                    c.status.clone(),
                    format!("{:?}", c.last_transition_time),
                )
            })
            .collect()
    };
    let t0 = times(&missing);
    assert!(t0.iter().all(|(_, s, _)| s == "False"), "{t0:?}");

    // A reconcile that changes nothing: no status write, same times.
    let done = r.telemetry.reconciles();
    touch_plugin(&admin, ns, "watched", "1").await;
    wait_reconciles(&r, done + 1).await;
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let same = api.get("watched").await.unwrap();
    assert_eq!(times(&same), t0);

    // Timestamps have a resolution of one second: let one pass so a transition is visible.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_workload(&admin, ns, Kind::StatefulSet).await;
    let ready = wait_ready(&admin, ns, "watched", "True", None, TIMEOUT).await;
    let t1 = times(&ready);
    for ((type_, status, time), (_, _, before)) in t1.iter().zip(&t0) {
        assert_eq!(status, "True", "{type_}");
        assert_ne!(
            time, before,
            "{type_}: lastTransitionTime moves on a status change"
        );
    }

    // A new generation with the same status: observedGeneration follows, times stay.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    api.patch(
        "watched",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "env": [{ "name": "RUST_LOG", "value": "debug" }] } })),
    )
    .await
    .expect("change spec");
    let next = wait_ready(&admin, ns, "watched", "True", None, TIMEOUT).await;
    assert!(next.metadata.generation > ready.metadata.generation);
    assert_eq!(times(&next), t1);
    for t in ["Ready", "WorkloadPatched", "RBACReady"] {
        assert_eq!(
            condition(&next, t).unwrap().observed_generation,
            next.metadata.generation
        );
    }

    let events = Api::<Event>::namespaced(admin.clone(), ns);
    let found = wait_for(TIMEOUT, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            let about: Vec<_> = list
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("watched"))
                .map(|e| {
                    (
                        e.type_.unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.reporting_controller.unwrap_or_default(),
                    )
                })
                .collect();
            (about.iter().any(|e| e.1 == "VClusterNotFound")
                && about.iter().any(|e| e.1 == "Installed"))
            .then_some(about)
        }
    })
    .await;
    for (type_, reason, controller) in &found {
        assert_eq!(controller, "vcluster-plugin-operator");
        match reason.as_str() {
            "VClusterNotFound" => assert_eq!(type_, "Warning"),
            "Installed" => assert_eq!(type_, "Normal"),
            _ => {}
        }
    }
    delete_plugin(&admin, ns, "watched", TIMEOUT).await;
    r.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Idempotency (item 6)

/// Many converged objects (4 vClusters — 2 StatefulSets, 2 Deployments — with an embedded, a
/// v1 and a v2 plugin each): a restarted operator reconciles every plugin again, and again
/// after every plugin and workload is touched, and makes zero write requests.
#[tokio::test]
async fn restart_and_touches_after_convergence_make_zero_writes() {
    let _guard = LOCK.lock().await;
    let admin = setup().await;
    let namespaces: Vec<(String, Kind)> = (0..4)
        .map(|i| {
            (
                format!("ops-idem-{i}"),
                if i % 2 == 0 {
                    Kind::StatefulSet
                } else {
                    Kind::Deployment
                },
            )
        })
        .collect();
    let plugins = [
        ("embedded", embedded_car_spec()),
        (
            "legacy",
            json!({ "vcluster": { "name": VC }, "image": "ghcr.io/example/v1:1", "version": "v1",
                    "config": { "a": 1 }, "rbac": { "role": { "extraRules": [
                        { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"] }
                    ] } } }),
        ),
        (
            "v2",
            json!({ "vcluster": { "name": VC }, "image": "ghcr.io/example/v2:1" }),
        ),
    ];
    let first = Replica::start("idem-1", None).await;
    for (ns, kind) in &namespaces {
        vcluster(&admin, ns, *kind).await;
        for (name, spec) in &plugins {
            create_plugin(&admin, ns, name, spec.clone()).await;
        }
    }
    for (ns, _) in &namespaces {
        for (name, _) in &plugins {
            wait_ready(&admin, ns, name, "True", None, TIMEOUT).await;
        }
    }
    first.stop().await;
    let total = (namespaces.len() * plugins.len()) as u64;
    let writes = || -> Vec<AuditedWrite> {
        namespaces
            .iter()
            .flat_map(|(ns, _)| operator_writes(ns))
            .collect()
    };
    let before = writes();
    assert!(
        before.len() as u64 >= total,
        "the install wrote: {before:?}"
    );

    let second = Replica::start("idem-2", None).await;
    // Every plugin is reconciled once at start ...
    wait_reconciles(&second, total).await;
    // ... and again for each touch of a plugin and of a workload.
    for (ns, kind) in &namespaces {
        for (name, _) in &plugins {
            touch_plugin(&admin, ns, name, "2").await;
        }
        let touch = Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": "2" } } }));
        match kind {
            Kind::StatefulSet => {
                Api::<StatefulSet>::namespaced(admin.clone(), ns)
                    .patch(VC, &PatchParams::default(), &touch)
                    .await
                    .expect("touch StatefulSet");
            }
            Kind::Deployment => {
                Api::<Deployment>::namespaced(admin.clone(), ns)
                    .patch(VC, &PatchParams::default(), &touch)
                    .await
                    .expect("touch Deployment");
            }
        }
    }
    wait_reconciles(&second, 2 * total).await;
    // Reconciles queued by the workload touches finish too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = writes();
    assert_eq!(
        after.len(),
        before.len(),
        "converged objects must cost zero writes; new: {:?}",
        &after[before.len().min(after.len())..]
    );
    let (_, body) = second.get("/metrics").await;
    assert_eq!(
        metric(&body, "vcp_reconcile_total{result=\"error\"}").unwrap_or(0.0),
        0.0,
        "{body}"
    );
    assert!(
        !after.iter().any(|w| w.user_agent == user_agent("idem-2")),
        "no write from the restarted operator"
    );
    second.stop().await;
    // The operator owns something in every workload (sanity of the filter above).
    for (ns, kind) in &namespaces {
        let managed = match kind {
            Kind::StatefulSet => {
                Api::<StatefulSet>::namespaced(admin.clone(), ns)
                    .get(VC)
                    .await
                    .unwrap()
                    .metadata
                    .managed_fields
            }
            Kind::Deployment => {
                Api::<Deployment>::namespaced(admin.clone(), ns)
                    .get(VC)
                    .await
                    .unwrap()
                    .metadata
                    .managed_fields
            }
        };
        assert!(
            managed
                .unwrap_or_default()
                .iter()
                .any(|m| m.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER))
        );
    }
}
