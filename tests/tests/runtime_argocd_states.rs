//! The inputs of the Argo CD health check (tests/fixtures/argocd/*.yaml), captured from what the
//! real operator and runtime write: the operator (shared, in-process) installs
//! plugins into vCluster's own chart, the runtime runs with the service account the operator
//! bound, and the VClusterPlugin is read at each state:
//!
//! | fixture | how the state is reached |
//! | --- | --- |
//! | `ready.yaml` | installed, the runtime syncing one Car |
//! | `degraded-host-object-conflict.yaml` | a host Car of a synced Car's name that the vCluster does not manage |
//! | `degraded-type-unavailable.yaml` | the Car CRD deleted in the virtual cluster |
//! | `installing-runtime-updating.yaml` | a new spec while the runtime is stopped |
//! | `terminating.yaml` | deleted while a finalizer of the test's holds it (the operator's own is gone) |
//! | `pending-vcluster-not-found.yaml` | a plugin for a vCluster that does not exist |
//! | `failed-policy-denied.yaml` | a plugin asking for a wildcard rule |
//!
//! Each state's shape (phase, `Ready` and `RuntimeHealthy` status and reason, every condition
//! type, being deleted or not, the generation observed) must equal the committed fixture's, so
//! a change of what the operator or runtime writes fails here until the fixtures are recorded
//! again: `VCP_RECORD_ARGOCD_FIXTURES=1 cargo test -p vcp-tests --test runtime_argocd_states`
//! (uids, resource versions, managed fields and times are normalized away). Recorded or
//! compared, each capture must then get the Argo CD health the README's table gives its
//! fixture, from Argo CD's own engine (`vcp_tests::argocd`: config/argocd/health.lua in
//! gopher-lua with Argo CD's libraries); tests/tests/oracle_argocd_health.rs checks the
//! committed fixtures in Lua 5.1 too, and the transient states made from them.

use std::time::Duration;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, apply_yaml, wait_for};

const TIMEOUT: Duration = Duration::from_secs(60);
const FIXED_TIME: &str = "2026-01-01T00:00:00Z";
const HOLD: &str = "e2e.vcp.test/hold";

fn plugin(name: &str, extra: &str) -> String {
    format!(
        r"
---
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: {{ name: {name} }}
spec:
  vcluster: {{ name: my-vcluster }}
  syncedTypes:
    - {{ apiVersion: example.loft.sh/v1, kind: Car }}
{extra}"
    )
}

fn cars() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    )
}

/// The object as Argo CD would get it, without what differs from run to run.
fn normalized(plugin: &VClusterPlugin) -> Value {
    let mut v = serde_json::to_value(plugin).expect("plugin as JSON");
    let meta = v["metadata"].as_object_mut().expect("metadata");
    for key in ["uid", "resourceVersion", "managedFields", "annotations"] {
        meta.remove(key);
    }
    meta.insert("creationTimestamp".into(), json!(FIXED_TIME));
    if meta.contains_key("deletionTimestamp") {
        meta.insert("deletionTimestamp".into(), json!(FIXED_TIME));
    }
    if let Some(conditions) = v["status"]["conditions"].as_array_mut() {
        conditions.sort_by_key(|c| c["type"].as_str().unwrap_or_default().to_string());
        for c in conditions {
            c["lastTransitionTime"] = json!(FIXED_TIME);
        }
    }
    v
}

/// What must not change without re-recording: phase, the status and reason of `Ready` and
/// `RuntimeHealthy`, the condition types, deletion, and whether the operator observed the
/// current generation.
fn shape(v: &Value) -> Value {
    let condition = |t: &str| {
        v["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .map(|c| json!([c["status"], c["reason"]]))
            .unwrap_or(Value::Null)
    };
    let types: Vec<&Value> = v["status"]["conditions"]
        .as_array()
        .map(|cs| cs.iter().map(|c| &c["type"]).collect())
        .unwrap_or_default();
    json!({
        "phase": v["status"]["phase"],
        "Ready": condition("Ready"),
        "RuntimeHealthy": condition("RuntimeHealthy"),
        "conditionTypes": types,
        "deleting": v["metadata"].get("deletionTimestamp").is_some(),
        "observedCurrentGeneration": v["status"]["observedGeneration"] == v["metadata"]["generation"],
    })
}

/// Compares the captured `plugin` with the committed fixture `file`, or, with
/// `VCP_RECORD_ARGOCD_FIXTURES` set, records it as that fixture; either way then checks that
/// Argo CD's own engine gives the fixture's content the health the README's table says
/// ([`vcp_tests::argocd::assert_fixture_health`]): a recording is asserted too, against Argo
/// CD rather than against itself.
fn check_fixture(file: &str, what: &str, plugin: &VClusterPlugin) {
    let path = vcp_tests::repo_root()
        .join("tests/fixtures/argocd")
        .join(file);
    let captured = normalized(plugin);
    let recording = std::env::var_os("VCP_RECORD_ARGOCD_FIXTURES").is_some();
    if recording {
        let yaml = serde_yaml::to_string(&captured).expect("YAML");
        let text = format!(
            "# Captured by tests/tests/runtime_argocd_states.rs from the real operator and runtime: \
             {what}.\n# Re-record: VCP_RECORD_ARGOCD_FIXTURES=1 cargo test -p vcp-tests --test \
             runtime_argocd_states\n{yaml}"
        );
        std::fs::write(&path, text).expect("write fixture");
        println!("recorded {file}");
    }
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let committed: Value = serde_yaml::from_str(&text).expect("fixture YAML");
    if recording {
        assert_eq!(
            committed, captured,
            "{file}: the recording reads back as captured"
        );
    }
    assert_eq!(
        shape(&captured),
        shape(&committed),
        "{file}: what the operator and runtime write ({what}) no longer matches the committed \
         fixture; re-record with VCP_RECORD_ARGOCD_FIXTURES=1 cargo test -p vcp-tests --test \
         runtime_argocd_states and check tests/tests/oracle_argocd_health.rs"
    );
    let (health, message) = vcp_tests::argocd::assert_fixture_health(file, &committed);
    println!(
        "{file}: {what}: {}; Argo CD: {health} ({message})",
        shape(&captured)
    );
}

/// Waits until the plugin satisfies `check`; returns it.
async fn plugin_where(
    admin: &Client,
    ns: &str,
    name: &str,
    check: impl Fn(&VClusterPlugin) -> bool,
) -> VClusterPlugin {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    wait_for(TIMEOUT, || {
        let api = api.clone();
        let check = &check;
        async move { api.get(name).await.ok().filter(check) }
    })
    .await
}

/// Every version of the plugin `name` that its watch delivers, one line each (resource
/// version, phase, and `Ready` and `RuntimeHealthy` as status/reason/message, `syncedTotal`):
/// what a failed count of status writes prints, so that it says which writes were made.
fn status_history(
    admin: &Client,
    ns: &str,
    name: &str,
) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let history = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let seen = history.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config).applied_objects());
        while let Some(event) = events.next().await {
            let Ok(p) = event else { continue };
            let cond = |t: &str| {
                vcp_tests::condition(&p, t)
                    .map(|c| format!("{}/{}/{:?}", c.status, c.reason, c.message))
                    .unwrap_or_default()
            };
            let line = format!(
                "rv={} phase={} Ready={} RuntimeHealthy={} syncedTotal={:?}",
                p.resource_version().unwrap_or_default(),
                phase(&p),
                cond("Ready"),
                cond("RuntimeHealthy"),
                p.status.as_ref().and_then(|s| s.synced_total),
            );
            if let Ok(mut seen) = seen.lock() {
                seen.push(line);
            }
        }
    });
    history
}

fn has(p: &VClusterPlugin, type_: &str, status: &str, reason: &str) -> bool {
    vcp_tests::condition(p, type_).is_some_and(|c| c.status == status && c.reason == reason)
}

fn phase(p: &VClusterPlugin) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase)
        .map(|p| format!("{p:?}"))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_inputs_are_what_operator_and_runtime_write() {
    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:argocd").await;
    let cp = ControlPlane::shared();
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&virtual_, "team").await;

    // A vCluster (the chart's own objects) with one embedded-runtime plugin.
    let ns = "argocd-health";
    vcp_tests::create_namespace(&admin, ns).await;
    let workload = vcp_tests::vcluster_workload(ns);
    apply_yaml(
        &admin,
        &format!("{workload}{}", plugin("car-sync", "")),
        Some(ns),
    )
    .await
    .expect("vCluster and plugin");
    vcp_tests::wait_ready(&admin, ns, "car-sync", "True", None, TIMEOUT).await;

    // The runtime, with the token of the service account the operator bound.
    let account = cp
        .service_account_client(Cluster::Host, ns, "vc-my-vcluster")
        .await
        .expect("a token of the vCluster's service account");
    let history = status_history(&admin, ns, "car-sync");
    let runtime = vcp_tests::start_runtime(account, virtual_.clone(), ns, "car-sync", |c| {
        c.status_interval = Duration::from_millis(300);
    })
    .task;
    let virtual_cars = Api::<DynamicObject>::namespaced_with(virtual_.clone(), "team", &cars());
    let put_car = |name: &'static str| {
        let virtual_cars = virtual_cars.clone();
        async move {
            let car: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "metadata": {"name": name, "namespace": "team"},
                "spec": {"type": "Audi"}
            }))
            .expect("car");
            virtual_cars
                .patch(
                    name,
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&car),
                )
                .await
                .expect("virtual Car");
        }
    };
    put_car("beetle").await;
    let ready = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "RuntimeHealthy", "True", "Syncing")
            && has(p, "Ready", "True", "Installed")
            && phase(p) == "Ready"
            && p.status.as_ref().and_then(|s| s.synced_total) == Some(1)
    })
    .await;
    check_fixture("ready.yaml", "installed, the runtime syncing 1 Car", &ready);
    let status_writes = || {
        vcp_tests::Audit::writes()
            .in_control_plane(cp)
            .by(Identity::Operator)
            .uri_contains(&format!("/namespaces/{ns}/vclusterplugins/car-sync/status"))
            .attempts()
            .len()
    };
    // The audit log is read once it holds every request answered so far (the write that made
    // the plugin Ready reaches this test's read before its own audit event may be written).
    vcp_tests::audit_caught_up(cp, Cluster::Host).await;
    let writes_when_ready = status_writes();

    // A host Car in the way of a synced one.
    let host_cars = Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &cars());
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": "taken-x-team-x-my-vcluster", "namespace": ns},
        "spec": {"type": "Foreign"}
    }))
    .expect("foreign car");
    host_cars
        .patch(
            "taken-x-team-x-my-vcluster",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&foreign),
        )
        .await
        .expect("foreign host Car");
    put_car("taken").await;
    let conflict = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "False", "HostObjectConflict") && phase(p) == "Degraded"
    })
    .await;
    check_fixture(
        "degraded-host-object-conflict.yaml",
        "a host Car of a synced Car's name that the vCluster does not manage",
        &conflict,
    );
    // The runtime's report was reconciled into one status write; the reconciles that follow
    // (its own write's watch event, two pokes) write nothing: no loop.
    vcp_tests::poke_plugin(&admin, ns, "car-sync", TIMEOUT).await;
    vcp_tests::poke_plugin(&admin, ns, "car-sync", TIMEOUT).await;
    vcp_tests::audit_caught_up(cp, Cluster::Host).await;
    let writes = status_writes() - writes_when_ready;
    let versions = history.lock().map(|h| h.join("\n")).unwrap_or_default();
    assert_eq!(
        writes, 1,
        "operator status writes from Ready to Degraded and two reconciles after; the plugin's \
         versions seen by a watch since the runtime started:\n{versions}"
    );
    println!(
        "RuntimeHealthy=False HostObjectConflict -> Ready=False, Degraded: 1 operator status write, 0 in the 2 reconciles after"
    );
    virtual_cars
        .delete("taken", &DeleteParams::default())
        .await
        .expect("delete the conflicting Car");
    plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "True", "Installed") && phase(p) == "Ready"
    })
    .await;
    println!("conflict resolved: Ready=True again");

    // The Car CRD goes away in the virtual cluster.
    let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(virtual_.clone());
    crds.delete("cars.example.loft.sh", &DeleteParams::default())
        .await
        .expect("delete the virtual Car CRD");
    let unavailable = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "False", "TypeUnavailable") && phase(p) == "Degraded"
    })
    .await;
    check_fixture(
        "degraded-type-unavailable.yaml",
        "the Car CRD deleted in the virtual cluster",
        &unavailable,
    );
    vcp_tests::install_crds(&virtual_).await;
    put_car("beetle").await;
    plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "True", "Installed") && has(p, "RuntimeHealthy", "True", "Syncing")
    })
    .await;
    println!("the Car CRD back: Ready=True again");
    runtime.abort();
    let _ = runtime.await;

    // A new spec while the runtime is not running: it has not reported the new generation.
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    plugins
        .patch(
            "car-sync",
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(json!({
                "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
                "metadata": {"name": "car-sync", "namespace": ns},
                "spec": {
                    "vcluster": {"name": "my-vcluster"},
                    "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car", "syncStatus": true}]
                }
            })),
        )
        .await
        .expect("change the plugin's spec");
    let updating = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "False", "RuntimeUpdating") && phase(p) == "Installing"
    })
    .await;
    check_fixture(
        "installing-runtime-updating.yaml",
        "a new spec the runtime has not reported yet (it is not running)",
        &updating,
    );

    // Deleted, held by a finalizer of the test's after the operator removed its own.
    plugins
        .patch(
            "car-sync",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}
                ]))
                .expect("patch"),
            ),
        )
        .await
        .expect("add the test's finalizer");
    plugins
        .delete("car-sync", &DeleteParams::default())
        .await
        .expect("delete the plugin");
    let terminating = plugin_where(&admin, ns, "car-sync", |p| {
        p.finalizers() == [HOLD.to_string()] && phase(p) == "Terminating"
    })
    .await;
    check_fixture(
        "terminating.yaml",
        "deleted; the operator's cleanup done, a finalizer of the test's left",
        &terminating,
    );
    plugins
        .patch(
            "car-sync",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the test's finalizer");

    // A plugin for a vCluster that does not exist.
    let ns = "argocd-pending";
    vcp_tests::create_namespace(&admin, ns).await;
    apply_yaml(&admin, &plugin("car-sync", ""), Some(ns))
        .await
        .expect("plugin");
    let pending = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "False", "VClusterNotFound") && phase(p) == "Pending"
    })
    .await;
    check_fixture(
        "pending-vcluster-not-found.yaml",
        "a plugin for a vCluster that does not exist",
        &pending,
    );

    // A plugin the operator policy refuses.
    let ns = "argocd-denied";
    vcp_tests::create_namespace(&admin, ns).await;
    let workload = vcp_tests::vcluster_workload(ns);
    let extra = "  rbac:\n    role:\n      extraRules:\n        - { apiGroups: [\"\"], resources: [\"*\"], verbs: [get] }\n";
    apply_yaml(
        &admin,
        &format!("{workload}{}", plugin("car-sync", extra)),
        Some(ns),
    )
    .await
    .expect("vCluster and plugin");
    let denied = plugin_where(&admin, ns, "car-sync", |p| {
        has(p, "Ready", "False", "PolicyDenied") && phase(p) == "Failed"
    })
    .await;
    check_fixture(
        "failed-policy-denied.yaml",
        "a plugin asking for a wildcard rule",
        &denied,
    );
}
