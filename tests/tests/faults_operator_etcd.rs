//! The operator through etcd faults: etcd restarted (same port and data folder), then
//! etcd compacted at its current revision and the host API server restarted, so that every
//! watch of the operator must resume from a revision etcd no longer holds (410 Gone) and list
//! again. After each fault a VClusterPlugin created and one changed are installed correctly
//! (`Ready=True` at their generation, the workload's containers, the new plugin's Role); after
//! the compaction a rule of a `PatchVClusterRoles` plugin taken out of the chart's Role is
//! still put back (the operator's watch of that namespace's Roles resumed); at the end removing
//! every plugin gives back the workload's original pod template and the chart's Role.
//!
//! Each fault is shown to have happened before anything is asserted of the operator: the
//! restarted process has a new pid (the control plane's `pids` file) and is running; during the
//! etcd restart a write of the test was held or refused (the API server felt etcd go; its
//! watch cache outlives etcd, so the operator's watches are not ended by it: the count of watches
//! it opened again is reported, not asserted); after the compaction every watch of the operator
//! re-listed (its re-list counter, `Telemetry::relists`, feature `reconcile-log`, moved for each
//! kind).
//!
//! The faults would disturb other tests: the test starts a control plane of its own
//! ([`ControlPlane::start`]). The operator runs in-process as `vcp-operator` with its RBAC
//! (`config/rbac`); no runtime runs (the subject is the operator's install).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use vcluster_plugin_operator::{Config, Telemetry};
use vcp_crds::VClusterPlugin;
use vcp_tests::workload::{VC, container, container_names};
use vcp_tests::{Cluster, ControlPlane, Identity, create_plugin, delete_plugin, wait_for};

const NS: &str = "faults-operator";
/// The Role vCluster's chart binds to the vCluster's service account.
const CHART_ROLE: &str = "vc-my-vcluster";

/// The rule the `PatchVClusterRoles` plugin appends to [`CHART_ROLE`].
static PATCHER_RULE: std::sync::LazyLock<Value> = std::sync::LazyLock::new(
    || json!({ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }),
);
const TIMEOUT: Duration = Duration::from_secs(90);

/// The watches of the operator whose re-lists `Telemetry::relists` counts (kinds).
const WATCHED: [&str; 7] = [
    "VClusterPlugin",
    "StatefulSet",
    "Deployment",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];

/// The operator's re-lists so far, per watched kind.
fn relists(t: &Telemetry) -> Vec<(&'static str, u64)> {
    WATCHED.iter().map(|k| (*k, t.relists(k))).collect()
}

/// The `watch` requests `vcp-operator` made so far on the host (audit log).
fn operator_watches(cp: &ControlPlane) -> usize {
    vcp_tests::audited_reads(cp, Cluster::Host, Identity::Operator.user())
        .expect("audit log")
        .iter()
        .filter(|(verb, _)| verb == "watch")
        .count()
}

/// Waits until plugin `name` is `Ready=True` for its current generation, and returns it.
async fn ready_at_generation(admin: &Client, name: &str) -> VClusterPlugin {
    let api: Api<VClusterPlugin> = Api::namespaced(admin.clone(), NS);
    let ready = vcp_tests::poll_for(TIMEOUT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let status = p.status.as_ref()?;
            let ready = vcp_tests::condition(&p, "Ready")?;
            (ready.status == "True"
                && status.observed_generation == p.metadata.generation
                && ready.observed_generation == p.metadata.generation)
                .then_some(p)
        }
    })
    .await;
    ready.unwrap_or_else(|| {
        panic!(
            "{name} is not Ready=True at its generation within {TIMEOUT:?}: {:?}",
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(api.get(name))
            })
            .map(|p| (p.metadata.generation, p.status))
        )
    })
}

/// An embedded plugin of the vCluster syncing `api_version` `kind` (each plugin its own type:
/// two plugins syncing one type are a `Conflict`).
fn embedded(api_version: &str, kind: &str) -> Value {
    json!({
        "vcluster": { "name": VC },
        "syncedTypes": [{ "apiVersion": api_version, "kind": kind }],
    })
}

/// The live pod template of the vCluster.
async fn template(admin: &Client) -> Value {
    vcp_tests::workload::template(admin, NS, vcp_tests::workload::Kind::StatefulSet).await
}

/// The `RUST_LOG` value of plugin `name`'s container in `template`.
fn rust_log(template: &Value, name: &str) -> Option<String> {
    container(template, name)["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == "RUST_LOG")?["value"]
        .as_str()
        .map(str::to_string)
}

/// A custom resource of the tutorial's group for the third plugin, beside `Car` and
/// `ConfigMap`.
const BOAT_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: boats.example.loft.sh }
spec:
  group: example.loft.sh
  names: { kind: Boat, plural: boats, singular: boat, listKind: BoatList }
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true }
"#;

/// After a fault: plugin `new` (syncing `synced`, an `(apiVersion, kind)`) created and
/// `changed`'s `RUST_LOG` set to `tag` are installed:
/// both `Ready=True` at their generation, the workload holds `expected` containers in order
/// and `changed`'s new value, and `new`'s Role exists. Returns how long that took.
async fn install_after_fault(
    admin: &Client,
    new: &str,
    synced: (&str, &str),
    changed: &str,
    tag: &str,
    expected: &[&str],
) -> Duration {
    let began = Instant::now();
    create_plugin(admin, NS, new, embedded(synced.0, synced.1)).await;
    Api::<VClusterPlugin>::namespaced(admin.clone(), NS)
        .patch(
            changed,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "env": [{ "name": "RUST_LOG", "value": tag }] } })),
        )
        .await
        .expect("change the plugin after the fault");
    ready_at_generation(admin, new).await;
    ready_at_generation(admin, changed).await;
    let live = wait_for(TIMEOUT, || async {
        let t = template(admin).await;
        (container_names(&t, "containers") == expected
            && rust_log(&t, changed).as_deref() == Some(tag))
        .then_some(t)
    })
    .await;
    assert_eq!(
        container(&live, new)["image"],
        "vcp-test/runtime:faults-operator"
    );
    Api::<Role>::namespaced(admin.clone(), NS)
        .get(&format!("vcp-plugin-{new}"))
        .await
        .unwrap_or_else(|e| panic!("the Role of {new}: {e}"));
    began.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_installs_after_an_etcd_restart_and_a_compaction() {
    let cp = Arc::new(ControlPlane::start().expect("a control plane of this test's own"));
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&admin).await;
    // a third type to sync (a plugin may sync custom resources and ConfigMaps only)
    vcp_tests::apply_yaml(&admin, BOAT_CRD, None)
        .await
        .expect("the Boat CRD");
    vcp_tests::install_operator_role(&admin).await;
    vcp_tests::create_namespace(&admin, NS).await;
    vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(NS), Some(NS))
        .await
        .expect("the vCluster's workload");
    // The chart's Role and RoleBinding too: a plugin in `rbac.mode: PatchVClusterRoles` appends
    // to that Role, which the operator watches in this namespace (`patched_roles`).
    let rendered = vcp_tests::render_vcluster_chart(NS, "").expect("render the chart");
    for doc in rendered.split("---\n") {
        let Ok(value) = serde_yaml::from_str::<Value>(doc) else {
            continue;
        };
        if matches!(value["kind"].as_str(), Some("Role" | "RoleBinding")) {
            vcp_tests::create_yaml(&admin, doc, Some(NS), "helm")
                .await
                .expect("create the chart's RBAC");
        }
    }
    let roles: Api<Role> = Api::namespaced(admin.clone(), NS);
    let chart_role = roles.get(CHART_ROLE).await.expect("the chart's Role");
    let original = template(&admin).await;

    let telemetry = Arc::new(Telemetry::new());
    let mut config = Config::new(cp.client(Cluster::Host, Identity::Operator).await);
    config.runtime_image = "vcp-test/runtime:faults-operator".into();
    config.telemetry = telemetry.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(vcluster_plugin_operator::run_until(config, async {
        let _ = stopped.await;
    }));

    create_plugin(
        &admin,
        NS,
        "before",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    create_plugin(
        &admin,
        NS,
        "patcher",
        json!({
            "vcluster": { "name": VC },
            "image": "example.com/patcher:1",
            "rbac": { "mode": "PatchVClusterRoles", "role": { "extraRules": [PATCHER_RULE.clone()] } },
        }),
    )
    .await;
    ready_at_generation(&admin, "before").await;
    ready_at_generation(&admin, "patcher").await;
    assert_eq!(
        container_names(&template(&admin).await, "containers"),
        ["syncer", "before"]
    );
    let patched = roles.get(CHART_ROLE).await.expect("the chart's Role");
    assert_eq!(
        patched.rules.as_ref().map(Vec::len),
        chart_role.rules.as_ref().map(|r| r.len() + 1),
        "the patcher's rule appended"
    );
    assert_eq!(relists(&telemetry).iter().map(|(_, n)| n).sum::<u64>(), 0);

    // Fault 1: etcd restarts. Meanwhile the test writes a ConfigMap in a loop: a write held or
    // refused shows that the API server felt etcd go.
    let etcd_before = cp.pid_of("etcd");
    let watches_before = operator_watches(&cp);
    let writing = Arc::new(AtomicBool::new(true));
    let (slowest_ms, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicUsize::new(0)));
    let writer = {
        let (admin, writing) = (admin.clone(), writing.clone());
        let (slowest_ms, failed) = (slowest_ms.clone(), failed.clone());
        tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(admin, NS);
            let mut n = 0_u64;
            while writing.load(Ordering::SeqCst) {
                n += 1;
                let began = Instant::now();
                let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": { "name": "probe" }, "data": { "n": n.to_string() } });
                let result = tokio::time::timeout(
                    Duration::from_secs(30),
                    api.patch(
                        "probe",
                        &PatchParams::apply("faults-test").force(),
                        &Patch::Apply(&cm),
                    ),
                )
                .await;
                let took = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
                slowest_ms.fetch_max(took, Ordering::SeqCst);
                if !matches!(result, Ok(Ok(_))) {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let restarted = {
        let cp = cp.clone();
        tokio::task::spawn_blocking(move || cp.restart_etcd())
    };
    restarted
        .await
        .expect("restart task")
        .expect("restart etcd");
    // A write after etcd is back, then the writer stops.
    tokio::time::sleep(Duration::from_secs(1)).await;
    writing.store(false, Ordering::SeqCst);
    writer.await.expect("writer");
    cp.assert_restarted("etcd", etcd_before, "");
    let (slowest, failed_writes) = (
        Duration::from_millis(slowest_ms.load(Ordering::SeqCst)),
        failed.load(Ordering::SeqCst),
    );
    assert!(
        slowest >= Duration::from_secs(1) || failed_writes > 0,
        "the etcd restart took effect: the test's writes were neither held (slowest {slowest:?}) \
         nor refused"
    );
    let took_etcd = install_after_fault(
        &admin,
        "after-etcd",
        ("v1", "ConfigMap"),
        "before",
        "etcd",
        &["syncer", "before", "after-etcd"],
    )
    .await;
    // For the report: the API server serves watches from its watch cache, which outlives an
    // etcd restart, so the operator's watches need not be opened again (seen: none were).
    let watches_after_etcd = operator_watches(&cp);

    // Fault 2: a write the operator does not watch (so that the revision etcd is compacted at
    // is newer than every revision the operator's watches hold), etcd compacted at its current
    // revision, the host API server restarted (its watch cache no longer holds the old
    // revisions either).
    Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .patch(
            "probe",
            &PatchParams::apply("faults-test").force(),
            &Patch::Apply(json!({ "apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": { "name": "probe" }, "data": { "n": "last" } })),
        )
        .await
        .expect("write before the compaction");
    let relists_before = relists(&telemetry);
    let patcher_reconciles = telemetry.reconciled(NS, "patcher").map_or(0, |r| r.count);
    let apiserver_before = cp.pid_of("apiserver-host");
    let revision = {
        let cp = cp.clone();
        tokio::task::spawn_blocking(move || {
            let revision = cp.compact_etcd()?;
            cp.restart(Cluster::Host)?;
            anyhow::Ok(revision)
        })
        .await
        .expect("compaction task")
        .expect("compact etcd, restart the host API server")
    };
    cp.assert_restarted("apiserver-host", apiserver_before, "");
    // The operator's watches were answered 410 and listed again: every one of them.
    let moved = |now: &[(&'static str, u64)]| -> Vec<(&'static str, u64)> {
        now.iter()
            .zip(&relists_before)
            .filter(|((_, n), (_, b))| n > b)
            .map(|((k, n), (_, b))| (*k, n - b))
            .collect()
    };
    // Each watch re-lists on its own 410, so the two watches of Roles may do so a moment apart:
    // wait for every kind, and for both of them.
    let role_relists = |moved: &[(&'static str, u64)]| {
        moved
            .iter()
            .find(|(k, _)| *k == "Role")
            .map_or(0, |(_, n)| *n)
    };
    vcp_tests::poll_for(TIMEOUT, || async {
        let now = moved(&relists(&telemetry));
        (now.len() == WATCHED.len() && role_relists(&now) >= 2).then_some(())
    })
    .await;
    let moved = moved(&relists(&telemetry));
    assert_eq!(
        moved.len(),
        WATCHED.len(),
        "the compaction took effect: every watch of the operator re-listed (re-lists since the \
         fault, by kind: {moved:?})"
    );
    // The namespace's Role watch (besides the cluster-wide cache of plugins' own Roles)
    // re-listed too, and still triggers: the patcher's rule taken out comes back.
    let role_relists = role_relists(&moved);
    assert!(
        role_relists >= 2,
        "both watches of Roles re-listed after the compaction: {role_relists}"
    );
    // The edit comes once the reconciles the re-lists caused are over (the patcher's count
    // moved, then no reconcile finished for 2 s), so that none of them repairs it by chance
    // (`operator_drift.rs` proves the trigger strictly; this shows it survives the 410).
    vcp_tests::wait_for(TIMEOUT, || async {
        telemetry
            .reconciled(NS, "patcher")
            .filter(|r| r.count > patcher_reconciles)
            .map(|_| ())
    })
    .await;
    let mut quiet_since = (telemetry.reconciles(), Instant::now());
    vcp_tests::wait_for(TIMEOUT, || {
        let now = telemetry.reconciles();
        if now != quiet_since.0 {
            quiet_since = (now, Instant::now());
        }
        let quiet = quiet_since.1.elapsed() >= Duration::from_secs(2);
        async move { quiet.then_some(()) }
    })
    .await;
    let mut edited = roles.get(CHART_ROLE).await.expect("the chart's Role");
    edited.rules = chart_role.rules.clone();
    edited.metadata.managed_fields = None;
    roles
        .replace(
            CHART_ROLE,
            &kube::api::PostParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &edited,
        )
        .await
        .expect("take the patcher's rule out");
    let repaired = vcp_tests::poll_for(Duration::from_secs(30), || async {
        let rules = roles.get(CHART_ROLE).await.ok()?.rules;
        (rules == patched.rules).then_some(())
    })
    .await;
    assert!(
        repaired.is_some(),
        "the patcher's rule taken out after the compaction is not back within 30 s"
    );
    let took_compaction = install_after_fault(
        &admin,
        "after-compaction",
        ("example.loft.sh/v1", "Boat"),
        "before",
        "compaction",
        &["syncer", "before", "after-etcd", "after-compaction"],
    )
    .await;

    // Everything removed: the workload's original pod template.
    for name in ["after-compaction", "after-etcd", "before", "patcher"] {
        delete_plugin(&admin, NS, name, TIMEOUT).await;
    }
    assert_eq!(template(&admin).await, original);
    assert_eq!(
        roles.get(CHART_ROLE).await.expect("the chart's Role").rules,
        chart_role.rules
    );
    assert!(
        Api::<StatefulSet>::namespaced(admin.clone(), NS)
            .get(VC)
            .await
            .is_ok()
    );
    assert!(!operator.is_finished(), "the operator stopped");
    let _ = stop.send(());
    operator
        .await
        .expect("operator task")
        .expect("the operator ends cleanly");
    println!(
        "etcd restart: the test's slowest write {slowest:?}, {failed_writes} refused; the \
         operator opened {} watches again (audit log); a plugin created and one changed installed {took_etcd:?} \
         later. Compaction at revision {revision} and host API server restart: the operator's \
         re-lists {moved:?} (Role: the cache and the namespace's watch), the chart's Role \
         repaired; a plugin created and one changed installed {took_compaction:?} later",
        watches_after_etcd - watches_before
    );
}
