//! The operator's operations, end to end on the real host API server (RBAC on): least
//! privilege of its RBAC, leader election between replicas, its HTTP endpoints, conditions and
//! Events that move only on a change, and idempotency (zero writes after convergence). Every
//! operator runs in-process under the `vcp-operator` identity (config/rbac) as a
//! [`vcp_tests::Replica`] on a runtime of its own, so a test can stop it gracefully or kill it.
//! Drift and lifecycle are in `operator_drift.rs`.
//!
//! Tests that run an operator hold [`LOCK`]: two operators of one control plane would both
//! reconcile every plugin. Each test keeps to its own namespaces.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use vcluster_plugin_operator::LeaderElection;
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};
use vcp_tests::replica::user_agent;
use vcp_tests::workload::{Kind, VC, create_vcluster, create_workload};
use vcp_tests::{
    Audit, AuditedWrite, Identity, Replica, condition, create_plugin, delete_plugin, metric,
    wait_for, wait_ready,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Serializes the tests that run an operator.
static LOCK: Mutex<()> = Mutex::const_new(());

/// The operator's (user `vcp-operator`) write requests so far concerning namespace `ns` or its
/// cluster-scoped objects, Leases excluded.
fn operator_writes(ns: &str) -> Vec<AuditedWrite> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(ns)
        .and_its_cluster_objects()
        .excluding("/leases")
        .attempts()
}

/// Merge-patches an annotation onto the plugin (a watch event: one more reconcile); returns
/// the plugin's new `resourceVersion`.
async fn touch_plugin(admin: &Client, ns: &str, name: &str, value: &str) -> String {
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": value } } })),
        )
        .await
        .expect("touch plugin")
        .metadata
        .resource_version
        .unwrap_or_default()
}

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

// Operations (item 8)

/// Two replicas on one Lease: only the holder reconciles and writes; a standby is ready but
/// idle; killing the leader (no release) lets the standby take over once the Lease expired;
/// a graceful stop releases the Lease.
#[tokio::test]
async fn two_replicas_only_the_leader_writes_and_a_dead_leader_is_replaced() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-ha";
    create_vcluster(&admin, ns, Kind::StatefulSet).await;
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

    create_plugin(
        &admin,
        ns,
        "first",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "first", "True", None, TIMEOUT).await;
    vcp_tests::audit_caught_up(vcp_tests::ControlPlane::shared(), vcp_tests::Cluster::Host).await;
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
    // Installing a new plugin deletes nothing: the new leader's start-up sweep runs while
    // `first` is created and reconciled, and once took the Role that reconcile had just
    // written for a deleted plugin's (fresh-clone CI, `--debounce-ms 0`; `crate::sweep`).
    assert!(
        !writes.iter().any(|w| w.verb == "delete"),
        "the install of `first` deleted something: {writes:?}"
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
    vcp_tests::audit_caught_up(vcp_tests::ControlPlane::shared(), vcp_tests::Cluster::Host).await;
    let after: Vec<_> = operator_writes(ns).into_iter().skip(before).collect();
    assert!(!after.is_empty(), "the new leader installed `second`");
    assert!(
        after
            .iter()
            .all(|w| w.user_agent == user_agent("replica-b")),
        "only the new leader writes: {after:?}"
    );
    assert!(
        !after.iter().any(|w| w.verb == "delete"),
        "the install of `second` deleted something: {after:?}"
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
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-metrics";
    create_vcluster(&admin, ns, Kind::StatefulSet).await;
    let r = Replica::start("metrics", None).await;
    assert_eq!(r.get("/healthz").await, (200, "ok\n".to_string()));
    wait_for(TIMEOUT, || async {
        (r.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(r.get("/nope").await.0, 404);

    create_plugin(
        &admin,
        ns,
        "measured",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
    wait_ready(&admin, ns, "measured", "True", None, TIMEOUT).await;
    r.wait_reconciles(1).await;
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

// Status (item 7)

/// Conditions `Ready`, `WorkloadPatched`, `RBACReady`: `lastTransitionTime` stays on reconciles
/// that change nothing and on a new generation with the same status, and moves when the status
/// flips; Events `VClusterNotFound` (Warning) and `Installed` (Normal) on the VClusterPlugin.
#[tokio::test]
async fn conditions_move_only_on_a_change_and_events_are_published() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
    let ns = "ops-status";
    vcp_tests::create_namespace(&admin, ns).await;
    let r = Replica::start("status", None).await;
    create_plugin(
        &admin,
        ns,
        "watched",
        vcp_tests::workload::embedded_car_spec(),
    )
    .await;
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
    r.wait_reconciles(done + 1).await;
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let same = api.get("watched").await.unwrap();
    assert_eq!(times(&same), t0);

    // Timestamps have a resolution of one second: let one pass so a transition is visible
    // (not a wait for the operator: `wait_ready` below waits for the transition itself).
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

    // A new generation with the same status: observedGeneration follows, times stay. The
    // pause is not a wait for the operator (`wait_ready` below waits for the new generation):
    // lastTransitionTime has a resolution of one second, so a transition time wrongly moved
    // by this reconcile would be equal to the one before it unless a second has passed.
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

// Idempotency (item 6)

/// Many converged objects (4 vClusters — 2 StatefulSets, 2 Deployments — with an embedded, a
/// v1 and a v2 plugin each): a restarted operator reconciles every plugin again, and again
/// after every plugin and workload is touched, and makes zero write requests.
#[tokio::test]
async fn restart_and_touches_after_convergence_make_zero_writes() {
    let _guard = LOCK.lock().await;
    let admin = vcp_tests::replica::prepare_host().await;
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
        ("embedded", vcp_tests::workload::embedded_car_spec()),
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
        create_vcluster(&admin, ns, *kind).await;
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
    vcp_tests::audit_caught_up(vcp_tests::ControlPlane::shared(), vcp_tests::Cluster::Host).await;
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
    second.wait_reconciles(total).await;
    // ... and again for each touch of a workload and of a plugin. A workload touch reconciles
    // its plugins, but that reconcile is not counted per workload: the evidence that every
    // one of them ran is a barrier per watch, then a touch per plugin. The operator's
    // StatefulSet and Deployment caches each fill from one watch, in resourceVersion order, and
    // hand every event to the controller's queue before the next: once a marker workload
    // created after the touches is in a cache (`vcp_operator_cached_objects` counts it), the
    // touches of that kind are queued. A plugin touched after that is reconciled at the
    // touched version only after (or together with) every reconcile queued before for it.
    let cached = |kind: &str| second.telemetry.cached_objects(kind);
    let (statefulsets, deployments) = (cached("StatefulSet"), cached("Deployment"));
    for (ns, kind) in &namespaces {
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
    create_vcluster(&admin, "ops-idem-mark-sts", Kind::StatefulSet).await;
    create_vcluster(&admin, "ops-idem-mark-deploy", Kind::Deployment).await;
    wait_for(TIMEOUT, || async move {
        (cached("StatefulSet") > statefulsets && cached("Deployment") > deployments).then_some(())
    })
    .await;
    let mut touched = Vec::new();
    for (ns, _) in &namespaces {
        for (name, _) in &plugins {
            let rv = touch_plugin(&admin, ns, name, "2").await;
            touched.push((ns.clone(), *name, rv));
        }
    }
    let telemetry = &second.telemetry;
    for (ns, name, rv) in &touched {
        wait_for(TIMEOUT, || async move {
            let seen = telemetry.reconciled(ns, name)?;
            (seen.resource_version == *rv).then_some(())
        })
        .await;
    }
    assert!(
        second.telemetry.reconciles() >= 2 * total,
        "every plugin reconciled at start and after its touch: {} reconciles",
        second.telemetry.reconciles()
    );
    // The writes of those reconciles are all in the audit log.
    vcp_tests::audit_caught_up(vcp_tests::ControlPlane::shared(), vcp_tests::Cluster::Host).await;
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
