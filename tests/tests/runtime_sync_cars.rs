//! The declarative runtime (`vcp_syncer_runtime::run`) end to end, on the real host and virtual
//! API servers (RBAC on).
//!
//! The runtime runs in-process under the `vcp-syncer` identity, which each test grants only a
//! Role in its own host namespace (plus read access to Cars in the virtual cluster): the host
//! is watched in that namespace only. The virtual cluster is shared by all tests, so each
//! test's VClusterPlugin selects its own Cars with a label selector (`e2e=<test>`), and each
//! test uses its own host namespace and vCluster name.

//!
//! This binary: Cars to the host: create, update, delete, garbage collection, unmanaged objects, spec changes, terminating and offline changes, own writes, earlier objects. The harness ([`vcp_tests::World`]) is in
//! tests/src/runtime.rs; the other `runtime_sync_*` binaries cover the rest.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use vcp_crds::VClusterPlugin;
use vcp_tests::runtime::{TIMEOUT, apply_dynamic as apply, cars_resource, world};
use vcp_tests::{Cluster, ControlPlane, Identity, start_runtime, wait_for};

/// sha256 hex, computed here independently of the runtime.
fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn cars_sync_create_update_delete_across_namespaces() {
    let w = world("cars", &["cars-team-a", "cars-team-b"]).await;

    // create in two virtual namespaces, one with a name that makes the host name too long
    let audi = w
        .put_car(
            "cars-team-a",
            "audi",
            json!({"color": "red"}),
            json!({"note": "fast"}),
            json!({"type": "Audi", "seats": 4}),
        )
        .await;
    let bmw = w
        .put_car(
            "cars-team-b",
            "bmw",
            json!({}),
            json!({}),
            json!({"type": "BMW"}),
        )
        .await;
    let long_name = "a-very-long-car-name-that-does-not-fit-into-sixty-three";
    let long = w
        .put_car(
            "cars-team-a",
            long_name,
            json!({}),
            json!({}),
            json!({"type": "Tesla"}),
        )
        .await;

    let audi_host_name = "audi-x-cars-team-a-x-vc-cars";
    let bmw_host_name = "bmw-x-cars-team-b-x-vc-cars";
    let long_joined = format!("{long_name}-x-cars-team-a-x-vc-cars");
    assert!(long_joined.len() > 63);
    let long_host_name = format!("{}-{}", &long_joined[..52], &sha256_hex(&long_joined)[..10]);

    for (virtual_car, host_name, spec) in [
        (
            &audi,
            audi_host_name.to_string(),
            json!({"type": "Audi", "seats": 4}),
        ),
        (&bmw, bmw_host_name.to_string(), json!({"type": "BMW"})),
        (&long, long_host_name.clone(), json!({"type": "Tesla"})),
    ] {
        let host_car = w.host_car_where(&host_name, |_| true).await;
        let (labels, annotations) = w.expected_metadata(virtual_car, &host_name, &[], &[]);
        assert_eq!(host_car.labels(), &labels, "labels of {host_name}");
        assert_eq!(
            host_car.annotations(),
            &annotations,
            "annotations of {host_name}"
        );
        assert_eq!(host_car.data["spec"], spec, "spec of {host_name}");
        assert_eq!(
            json!(host_car.metadata.owner_references),
            w.expected_owner().await,
            "owner of {host_name}"
        );
        assert!(host_car.metadata.finalizers.is_none());
    }

    // a label added on the host is kept through updates
    let host_cars = w.host_cars();
    host_cars
        .patch(
            audi_host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"host-added": "yes"}}})),
        )
        .await
        .expect("label host car");

    // update: drop a label and the annotation, add a label, change the spec
    let audi = w
        .put_car(
            "cars-team-a",
            "audi",
            json!({"size": "large"}),
            json!({}),
            json!({"type": "Audi", "seats": 2}),
        )
        .await;
    let host_audi = w
        .host_car_where(audi_host_name, |car| {
            car.data["spec"]["seats"] == json!(2) && car.labels().contains_key("size")
        })
        .await;
    let (labels, mut annotations) =
        w.expected_metadata(&audi, audi_host_name, &[("host-added", "yes")], &[]);
    annotations.remove("vcluster.loft.sh/managed-annotations");
    assert_eq!(host_audi.labels(), &labels);
    assert!(!host_audi.labels().contains_key("color"));
    assert_eq!(host_audi.annotations(), &annotations);
    assert_eq!(host_audi.data["spec"], json!({"type": "Audi", "seats": 2}));

    // drift on the host is reverted
    let writes_pre_drift = w.runtime_writes(&format!("/cars/{audi_host_name}")).len();
    host_cars
        .patch(
            audi_host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"seats": 9}})),
        )
        .await
        .expect("drift");
    w.host_car_where(audi_host_name, |car| car.data["spec"]["seats"] == json!(2))
        .await;
    // the API server writes its audit log after it answers: wait until the revert is in it,
    // so that it is not counted as a write of the in-sync check below
    let revert_audited = vcp_tests::poll_for(TIMEOUT, || {
        let seen = w.runtime_writes(&format!("/cars/{audi_host_name}")).len();
        async move { (seen > writes_pre_drift).then_some(()) }
    })
    .await;
    assert!(
        revert_audited.is_some(),
        "the runtime's revert of the drift is not in the audit log"
    );

    // in sync: no further writes. The trigger is a label only the host has (kept, like
    // vCluster keeps keys added on the host): the runtime reconciles the Car again, and once
    // that reconcile finished, the audit log shows no write of the host copy since the trigger
    // (the resourceVersion stays at the trigger's).
    let before = w.reconciles.reconciles("Car", "cars-team-a/audi");
    let writes_before = w.runtime_writes(&format!("/cars/{audi_host_name}"));
    let poked = host_cars
        .patch(
            audi_host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-host-only": "poke"}}})),
        )
        .await
        .expect("poke the host copy");
    let after = w.wait_reconciled("Car", "cars-team-a/audi", before).await;
    let writes_after = w.runtime_writes(&format!("/cars/{audi_host_name}"));
    let later = host_cars.get(audi_host_name).await.expect("host audi");
    println!(
        "in sync: runtime reconciled cars-team-a/audi {} more time(s) after a host-only label; \
         its writes of the host copy: {} before, {} after",
        after - before,
        writes_before.len(),
        writes_after.len()
    );
    assert_eq!(writes_after, writes_before, "no write when nothing differs");
    assert_eq!(later.resource_version(), poked.resource_version());

    // status set on the host is copied up (syncStatus)
    host_cars
        .patch_status(
            audi_host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Driving"}})),
        )
        .await
        .expect("host status");
    let virtual_audi_api = w.virtual_cars("cars-team-a");
    wait_for(TIMEOUT, || {
        let api = virtual_audi_api.clone();
        async move {
            (api.get("audi").await.ok()?.data["status"]["phase"] == json!("Driving")).then_some(())
        }
    })
    .await;

    // the plugin status reports the synced objects and RuntimeHealthy
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let healthy = status
                .conditions
                .iter()
                .any(|c| c.type_ == "RuntimeHealthy" && c.status == "True");
            let cars = status.synced_objects.iter().find(|s| s.kind == "Car")?;
            (healthy && cars.count == 3 && status.synced_total == Some(3)).then_some(())
        }
    })
    .await;

    // delete: the host copy follows; the others stay
    w.virtual_cars("cars-team-b")
        .delete("bmw", &DeleteParams::default())
        .await
        .expect("delete bmw");
    wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move {
            api.get_opt(bmw_host_name)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert!(host_cars.get_opt(audi_host_name).await.unwrap().is_some());
    assert!(host_cars.get_opt(&long_host_name).await.unwrap().is_some());

    // a host copy deleted by someone else is recreated
    host_cars
        .delete(&long_host_name, &DeleteParams::default())
        .await
        .expect("delete host copy");
    let recreated = w.host_car_where(&long_host_name, |_| true).await;
    assert_eq!(
        recreated.annotations().get("vcluster.loft.sh/object-uid"),
        long.uid().as_ref()
    );
}

/// vCluster's `setOwner`: every host copy is owned by the vCluster's Service, so when the
/// vCluster goes (its syncer stops, its Service is deleted), Kubernetes' garbage collector
/// (kube-controller-manager's, run here for the host cluster) deletes the host copies, as in a
/// real cluster; a host Car of no vCluster stays.
#[tokio::test]
async fn host_copies_are_garbage_collected_with_the_vcluster_service() {
    let mut w = world("gc", &["gc-a"]).await;
    tokio::task::spawn_blocking(|| ControlPlane::shared().start_garbage_collector())
        .await
        .expect("join")
        .expect("start the garbage collector");
    let names = ["audi", "bmw"];
    for name in names {
        w.put_car("gc-a", name, json!({}), json!({}), json!({"type": "BMW"}))
            .await;
    }
    let owner = w.expected_owner().await;
    for name in names {
        let host_name = format!("{name}-x-gc-a-x-vc-gc");
        let copy = w.host_car_where(&host_name, |_| true).await;
        assert_eq!(json!(copy.metadata.owner_references), owner, "{host_name}");
    }
    let host_cars = w.host_cars();
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "foreign", "namespace": w.host_ns}, "spec": {"type": "Audi"}
        }),
    )
    .await;

    // the vCluster goes: its syncer stops, then its Service is deleted
    w.runtime.abort();
    let _ = (&mut w.runtime).await;
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(w.host.clone(), &w.host_ns);
    services
        .delete(&w.vcluster, &DeleteParams::background())
        .await
        .expect("delete the vCluster's Service");
    for name in names {
        let host_name = format!("{name}-x-gc-a-x-vc-gc");
        wait_for(Duration::from_secs(90), || {
            let api = host_cars.clone();
            let host_name = host_name.clone();
            async move { api.get_opt(&host_name).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }
    // collected by the garbage collector (the syncer was stopped), and only the owned copies
    assert!(
        host_cars.get_opt("foreign").await.expect("get").is_some(),
        "a host Car of no vCluster is not collected"
    );
}

#[tokio::test]
async fn unmanaged_host_object_is_never_touched() {
    let w = world("conflict", &["conflict-a"]).await;
    let host_name = "taken-x-conflict-a-x-vc-conflict";
    let foreign = apply(&w.host, &cars_resource(), Some(&w.host_ns), json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": host_name, "namespace": w.host_ns, "labels": {"owner": "someone-else"}},
        "spec": {"type": "Foreign"}
    }))
    .await;
    w.put_car(
        "conflict-a",
        "taken",
        json!({}),
        json!({}),
        json!({"type": "Audi"}),
    )
    .await;
    w.put_car(
        "conflict-a",
        "free",
        json!({}),
        json!({}),
        json!({"type": "BMW"}),
    )
    .await;
    // the other car syncs, so the runtime is working
    w.host_car_where("free-x-conflict-a-x-vc-conflict", |_| true)
        .await;
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let cars = status.synced_objects.iter().find(|s| s.kind == "Car")?;
            (cars.count == 1 && cars.conflicts == Some(1)).then_some(())
        }
    })
    .await;
    // a conflict means an object is not synced: RuntimeHealthy=False while it lasts
    let unhealthy = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "RuntimeHealthy" && c.reason == "HostObjectConflict")
        }
    })
    .await;
    assert_eq!(unhealthy.status, "False");
    assert!(
        unhealthy.message.starts_with("1 object(s) not synced"),
        "{}",
        unhealthy.message
    );
    println!(
        "conflict: RuntimeHealthy=False reason HostObjectConflict: {}",
        unhealthy.message
    );
    // reported as a Warning Event on the VClusterPlugin too
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        "HostObjectConflict",
        TIMEOUT,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains(host_name),
        "{:?}",
        event.note
    );
    let after = w.host_cars().get(host_name).await.expect("foreign car");
    assert_eq!(after.resource_version(), foreign.resource_version());
    assert_eq!(after.data["spec"], json!({"type": "Foreign"}));

    // deleting the virtual car does not delete the foreign host object either: once the
    // runtime reconciled the deleted key, the audit log shows no write of it at all
    let before = w.reconciles.reconciles("Car", "conflict-a/taken");
    w.virtual_cars("conflict-a")
        .delete("taken", &DeleteParams::default())
        .await
        .expect("delete");
    let after = w.wait_reconciled("Car", "conflict-a/taken", before).await;
    let writes = w.runtime_writes(&format!("/cars/{host_name}"));
    println!(
        "foreign host Car: runtime reconciled conflict-a/taken {} time(s) after the virtual \
         delete; its writes of {host_name}: {}",
        after - before,
        writes.len()
    );
    assert_eq!(writes, Vec::<(String, String)>::new());
    let kept = w
        .host_cars()
        .get_opt(host_name)
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(kept.resource_version(), foreign.resource_version());
    // the conflict is gone with its virtual object: healthy again
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "RuntimeHealthy" && c.status == "True")
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn spec_change_takes_effect_without_restart() {
    let w = world("respec", &["respec-a"]).await;
    w.put_car(
        "respec-a",
        "audi",
        json!({}),
        json!({}),
        json!({"type": "Audi"}),
    )
    .await;
    let host_name = "audi-x-respec-a-x-vc-respec";
    w.host_car_where(host_name, |_| true).await;

    // add a Car hook to the plugin: the running runtime restarts on the new spec, but applies
    // the hook only once the operator accepted it (`acceptance`)
    let key = "respec-a/audi";
    let before = w.reconciles.reconciles("Car", key);
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    plugins
        .patch(
            "car-plugin",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hooks": [{
                "name": "car-hook", "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "events": ["CreatePhysical", "UpdatePhysical"],
                "labels": {"hooked": "yes"},
                "jsonPatch": [{"op": "add", "path": "/spec/seats", "value": 7}]
            }]}})),
        )
        .await
        .expect("patch plugin");
    let after = w.wait_reconciled("Car", key, before).await;
    let unhooked = w.host_cars().get(host_name).await.expect("host car");
    println!(
        "Car hook not accepted yet: the runtime reconciled {key} {} more time(s); host labels {:?}",
        after - before,
        unhooked.labels()
    );
    assert_eq!(
        unhooked.labels().get("hooked"),
        None,
        "no hook before acceptance"
    );
    assert_eq!(unhooked.data["spec"], json!({"type": "Audi"}));
    vcp_tests::accept_as_operator(&w.host, &w.host_ns, "car-plugin").await;
    let hooked = w
        .host_car_where(host_name, |car| {
            car.labels().get("hooked").map(String::as_str) == Some("yes")
        })
        .await;
    assert_eq!(hooked.data["spec"], json!({"type": "Audi", "seats": 7}));
    assert!(!w.runtime.is_finished());
}

#[tokio::test]
async fn terminating_virtual_object_and_offline_changes() {
    let mut w = world("offline", &["offline-a"]).await;
    let cars = w.virtual_cars("offline-a");
    let host_cars = w.host_cars();

    // a virtual Car with a pending finalizer: deleting it deletes the host copy for good
    apply(
        &w.virtual_,
        &cars_resource(),
        Some("offline-a"),
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "held", "namespace": "offline-a", "labels": {"e2e": "offline"},
                         "finalizers": ["example.com/hold"]},
            "spec": {"type": "Audi"}
        }),
    )
    .await;
    let held_host = "held-x-offline-a-x-vc-offline";
    w.host_car_where(held_host, |_| true).await;
    cars.delete("held", &DeleteParams::default())
        .await
        .expect("delete held");
    wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt(held_host).await.ok()?.is_none().then_some(()) }
    })
    .await;
    // not resurrected while terminating: the trigger is a label on the terminating virtual
    // Car; once the runtime reconciled it, the audit log shows only the first create
    let before = w.reconciles.reconciles("Car", "offline-a/held");
    cars.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"e2e-poke": "1"}}})),
    )
    .await
    .expect("poke the terminating car");
    let after = w.wait_reconciled("Car", "offline-a/held", before).await;
    let creates = w
        .runtime_writes("/cars")
        .into_iter()
        .filter(|(verb, _)| verb == "create")
        .count();
    println!(
        "terminating virtual Car: runtime reconciled offline-a/held {} more time(s) after a \
         label change; host creates by the runtime so far: {creates}",
        after - before
    );
    assert!(
        host_cars.get_opt(held_host).await.unwrap().is_none(),
        "not resurrected while terminating"
    );
    assert_eq!(creates, 1, "only the first create of {held_host}");
    let virtual_held = cars.get("held").await.expect("still terminating");
    assert!(virtual_held.metadata.deletion_timestamp.is_some());

    // changes while the runtime is down are reconciled when it starts again
    w.put_car(
        "offline-a",
        "stays",
        json!({}),
        json!({}),
        json!({"type": "BMW"}),
    )
    .await;
    w.put_car(
        "offline-a",
        "goes",
        json!({}),
        json!({}),
        json!({"type": "BMW"}),
    )
    .await;
    w.host_car_where("stays-x-offline-a-x-vc-offline", |_| true)
        .await;
    w.host_car_where("goes-x-offline-a-x-vc-offline", |_| true)
        .await;
    w.runtime.abort();
    let _ = (&mut w.runtime).await;
    cars.delete("goes", &DeleteParams::default())
        .await
        .expect("delete goes");
    w.put_car(
        "offline-a",
        "stays",
        json!({}),
        json!({}),
        json!({"type": "BMW", "seats": 3}),
    )
    .await;
    w.put_car(
        "offline-a",
        "new",
        json!({}),
        json!({}),
        json!({"type": "Tesla"}),
    )
    .await;

    let cp = ControlPlane::shared();
    w.runtime = start_runtime(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &w.host_ns,
        "car-plugin",
        |_| {},
    )
    .task;
    w.host_car_where("new-x-offline-a-x-vc-offline", |_| true)
        .await;
    w.host_car_where("stays-x-offline-a-x-vc-offline", |car| {
        car.data["spec"]["seats"] == json!(3)
    })
    .await;
    wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move {
            api.get_opt("goes-x-offline-a-x-vc-offline")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;

    // release the finalizer so the virtual object goes away
    cars.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release finalizer");
}

/// The watch event of the runtime's own write (its echo) is not reconciled again (it cost one
/// reconcile per synced object). 20 Cars are synced; after their host
/// copies exist, a host-only label on the last copy (kept, no write) shows that the runtime's
/// host watch has delivered every copy's event before it (one watch stream delivers in order):
/// each Car was then reconciled exactly once (its create), the last twice (create, label).
/// A spec change then costs one reconcile more (the patch), not two.
#[tokio::test]
async fn the_watch_event_of_an_own_write_is_not_reconciled() {
    let w = world("echo", &["echo-a"]).await;
    let host_name = |name: &str| format!("{name}-x-echo-a-x-{}", w.vcluster);
    // the runtime is syncing before the counted Cars exist (its first listing reconciles
    // every key once more)
    w.put_car(
        "echo-a",
        "first",
        json!({}),
        json!({}),
        json!({"type": "Fiat"}),
    )
    .await;
    w.host_car_where(&host_name("first"), |_| true).await;

    let names: Vec<String> = (0..20).map(|i| format!("car-{i}")).collect();
    for name in &names {
        w.put_car(
            "echo-a",
            name,
            json!({}),
            json!({}),
            json!({"type": "Audi"}),
        )
        .await;
    }
    for name in &names {
        w.host_car_where(&host_name(name), |_| true).await;
    }
    let last = names.last().expect("cars");
    let poke = |label: &'static str| {
        let host_cars = w.host_cars();
        let name = host_name(last);
        async move {
            host_cars
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"e2e-host-only": label}}})),
                )
                .await
                .expect("host-only label");
        }
    };
    poke("one").await;
    w.wait_reconciled("Car", &format!("echo-a/{last}"), 1).await;
    let counts: Vec<(String, u64)> = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                w.reconciles.reconciles("Car", &format!("echo-a/{n}")),
            )
        })
        .collect();
    println!(
        "echo: reconciles per Car after the create and a host-only label on {last}: {counts:?}"
    );
    for (name, count) in &counts {
        let expected = if name == last { 2 } else { 1 };
        assert_eq!(*count, expected, "reconciles of echo-a/{name}");
    }

    // an update: one reconcile for the virtual change, none for the echo of the patch
    w.put_car(
        "echo-a",
        "car-0",
        json!({}),
        json!({}),
        json!({"type": "BMW"}),
    )
    .await;
    w.host_car_where(&host_name("car-0"), |h| {
        h.data["spec"]["type"] == json!("BMW")
    })
    .await;
    poke("two").await;
    w.wait_reconciled("Car", &format!("echo-a/{last}"), 2).await;
    assert_eq!(w.reconciles.reconciles("Car", "echo-a/car-0"), 2);
    // the patch (the create went to the collection's URI)
    assert_eq!(
        w.runtime_writes(&format!("/cars/{}", host_name("car-0")))
            .len(),
        1
    );
}

#[tokio::test]
async fn host_copy_of_an_earlier_object_is_replaced() {
    let w = world("uid", &["uid-a"]).await;
    let host_name = "car-x-uid-a-x-vc-uid";
    // a host copy made (by this vCluster) from an earlier virtual Car of the same name
    let stale = apply(&w.host, &cars_resource(), Some(&w.host_ns), json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": host_name, "namespace": w.host_ns,
            "labels": {"vcluster.loft.sh/managed-by": w.vcluster, "vcluster.loft.sh/namespace": "uid-a"},
            "annotations": {"vcluster.loft.sh/object-name": "car", "vcluster.loft.sh/object-namespace": "uid-a",
                "vcluster.loft.sh/object-uid": "uid-of-an-earlier-car",
                "vcluster.loft.sh/object-kind": "example.loft.sh/v1, Kind=Car"}},
        "spec": {"type": "Old"}
    }))
    .await;
    let car = w
        .put_car("uid-a", "car", json!({}), json!({}), json!({"type": "New"}))
        .await;
    let replaced = w
        .host_car_where(host_name, |h| {
            h.annotations().get("vcluster.loft.sh/object-uid") == car.uid().as_ref()
        })
        .await;
    assert_ne!(
        replaced.uid(),
        stale.uid(),
        "deleted and created, not patched"
    );
    assert_eq!(replaced.data["spec"], json!({"type": "New"}));
    let (labels, annotations) = w.expected_metadata(&car, host_name, &[], &[]);
    assert_eq!(replaced.labels(), &labels);
    assert_eq!(replaced.annotations(), &annotations);
}
