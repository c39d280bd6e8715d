//! One tenant's plugins of unserved types must not stall the operator for another tenant.
//!
//! Every reconcile of a plugin converges its whole vCluster under that vCluster's lock, and
//! discovers the types of *all* of its plugins (`operator/src/cache.rs`, `Discovery`). A type
//! the API server does not serve was never remembered, and an `UnknownType` plugin is looked at
//! again every `RECHECK` (20 s). Tenant A (`tenant-edit`: the built-in `edit` plus a namespace
//! admin's Roles and RoleBindings, admission installed) creates 120 plugins in its vCluster,
//! each `FromHost` of 23 versions of `example.loft.sh` `Car` that are not served
//! (`v1000` …: admission checks the group and the resource it holds, `cars`, not the version).
//! Before the fix each of A's reconciles made 2,760 discovery requests, A's reconciles queued
//! on A's lock held every reconcile slot (16) while they waited, and tenant B's new plugin was
//! still not `Ready` after 300 s (a plain image plugin, `Ready` in about 2 s without the
//! attack). Now "not served" is remembered for `NOT_SERVED_TTL` (10 s) and B's plugin is
//! `Ready` within [`FAIR`].
//!
//! One test, so this binary's control plane and its single operator replica are its own.

use std::time::{Duration, Instant};

use kube::Api;
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::plugins::{condition, poll_ready};
use vcp_tests::replica::{Replica, prepare_host};
use vcp_tests::{Cluster, ControlPlane, Identity};

const A: &str = "fair-disc-a";
const B: &str = "fair-disc-b";
/// Tenant A's plugins.
const PLUGINS: usize = 120;
/// Unserved types per plugin: 2 checks for the plugin's Role and RoleBinding, 3 per `FromHost`
/// type, within the 72 admission allows.
const TYPES: usize = 23;
/// How long tenant B's plugin may wait for `Ready` while A's plugins are rechecked.
const FAIR: Duration = Duration::from_secs(30);

/// Plugin `i` of tenant A: [`TYPES`] `FromHost` types, none served.
fn unserved_types(i: usize) -> serde_json::Value {
    let types: Vec<_> = (0..TYPES)
        .map(|k| {
            json!({"apiVersion": format!("example.loft.sh/v{}", 1000 + i * TYPES + k),
                   "kind": "Car", "direction": "FromHost"})
        })
        .collect();
    json!({"vcluster": {"name": "my-vcluster"}, "syncedTypes": types})
}

#[tokio::test]
async fn unserved_types_of_one_tenant_do_not_stall_another() {
    let cp = ControlPlane::shared();
    let admin = prepare_host().await;
    vcp_tests::admission::install_admission_policies(cp, &admin).await;
    for ns in [A, B] {
        vcp_tests::create_namespace(&admin, ns).await;
        vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(ns), Some(ns))
            .await
            .expect("the vCluster as its chart renders it");
    }
    vcp_tests::bind_tenant_rights(&admin, A).await;
    let tenant = cp.client(Cluster::Host, Identity::TenantEdit).await;
    let operator = Replica::start("fair-discovery", None).await;

    // Without the attack: B's image plugin is ready in seconds.
    let image = |name: &str| {
        json!({"vcluster": {"name": "my-vcluster"}, "image": format!("example.com/{name}:1"),
               "version": "v1"})
    };
    vcp_tests::create_plugin(&admin, B, "b-before", image("b-before")).await;
    poll_ready(&admin, B, "b-before", "True", None, FAIR)
        .await
        .expect("B's plugin Ready before the attack");

    // The attack, as the tenant (admission lets each plugin in).
    for i in 0..PLUGINS {
        vcp_tests::create_plugin(&tenant, A, &format!("a-{i}"), unserved_types(i)).await;
    }
    // A's plugins are judged (refused: their types are not served), and rechecked from now on.
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), A);
    let judged = vcp_tests::poll_for(Duration::from_secs(120), || {
        let plugins = plugins.clone();
        async move {
            let p = plugins.get(&format!("a-{}", PLUGINS - 1)).await.ok()?;
            condition(&p, "Ready").filter(|c| c.reason == "UnknownType")?;
            Some(())
        }
    })
    .await;
    assert!(judged.is_some(), "A's last plugin refused UnknownType");
    // Into A's recheck rounds: one recheck period after the last refusal, every plugin of A
    // has been requeued; the operator's count of finished reconciles shows it is at work on
    // them when B's plugin comes.
    let at_judged = operator.reconciles();
    tokio::time::sleep(vcp_operator_recheck()).await;
    let rechecked = operator.reconciles() - at_judged;
    assert!(
        rechecked > 0,
        "no reconcile finished in the recheck period after A's plugins were refused"
    );

    let started = Instant::now();
    vcp_tests::create_plugin(&admin, B, "b-during", image("b-during")).await;
    let ready = poll_ready(&admin, B, "b-during", "True", None, FAIR).await;
    assert!(
        ready.is_some(),
        "tenant B's plugin not Ready within {FAIR:?} while tenant A's {PLUGINS} plugins of \
         unserved types are rechecked (reconciles so far: {})",
        operator.reconciles()
    );
    eprintln!(
        "B's plugin Ready {:?} after its creation, beside A's {PLUGINS} plugins \
         ({rechecked} reconciles finished in the recheck period before it)",
        started.elapsed()
    );
    operator.stop().await;
}

/// The operator's recheck period of an `UnknownType` plugin.
fn vcp_operator_recheck() -> Duration {
    vcluster_plugin_operator::vcluster::RECHECK
}
