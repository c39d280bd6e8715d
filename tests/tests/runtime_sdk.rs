//! The plugin-author API end to end: the tutorial's Car syncer and pod hook
//! (`syncer-runtime/examples/car_syncer.rs`, included here as is) registered on a
//! `Plugin` and started against the real host and virtual API servers.
//!
//! This binary has its own control plane, so every virtual Car is the plugin's.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use vcp_crds::Car;
use vcp_syncer_runtime::sdk::{Plugin, RegisterContext};
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, string_map, wait_for};

#[allow(dead_code, unused_imports)]
#[path = "../../syncer-runtime/examples/car_syncer.rs"]
mod car_syncer;

const TIMEOUT: Duration = Duration::from_secs(30);
const HOST_NS: &str = "vc-sdk";
const VCLUSTER: &str = "sdk";

async fn apply_car(client: &Client, ns: &str, car: serde_json::Value) -> Car {
    let car: Car = serde_json::from_value(car).expect("car");
    let name = car.name_any();
    Api::<Car>::namespaced(client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&car),
        )
        .await
        .unwrap_or_else(|e| panic!("apply car {name}: {e}"))
}

#[tokio::test]
async fn tutorial_car_syncer_and_pod_hook() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, HOST_NS).await;
    vcp_tests::create_namespace(&virtual_, "team-a").await;

    let mut plugin = Plugin::new(RegisterContext::new(
        host.clone(),
        virtual_.clone(),
        HOST_NS,
        VCLUSTER,
    ));
    let car_syncer = car_syncer::CarSyncer::new(plugin.context());
    plugin.register(car_syncer);
    plugin.register_hook(car_syncer::PodHook);
    let stats = plugin.stats()[0].clone();
    let running = tokio::spawn(plugin.start());

    let host_cars: Api<Car> = Api::namespaced(host.clone(), HOST_NS);
    let virtual_cars: Api<Car> = Api::namespaced(virtual_.clone(), "team-a");

    // create: the host copy has exactly vCluster's name, labels and annotations
    let audi = apply_car(&virtual_, "team-a", json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": "audi", "labels": {"color": "red"}, "annotations": {"note": "fast"}},
        "spec": {"type": "Audi", "seats": 4}
    }))
    .await;
    let host_name = "audi-x-team-a-x-sdk";
    let host_audi = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt(host_name).await.ok().flatten() }
    })
    .await;
    assert_eq!(
        host_audi.labels(),
        &string_map([
            ("color", "red"),
            ("vcluster.loft.sh/managed-by", VCLUSTER),
            ("vcluster.loft.sh/namespace", "team-a"),
        ])
    );
    assert_eq!(
        host_audi.annotations(),
        &string_map([
            ("note", "fast"),
            ("vcluster.loft.sh/object-name", "audi"),
            ("vcluster.loft.sh/object-namespace", "team-a"),
            ("vcluster.loft.sh/object-uid", audi.uid().unwrap().as_str()),
            (
                "vcluster.loft.sh/object-kind",
                "example.loft.sh/v1, Kind=Car"
            ),
            ("vcluster.loft.sh/object-host-name", host_name),
            ("vcluster.loft.sh/object-host-namespace", HOST_NS),
            ("vcluster.loft.sh/managed-annotations", "note"),
        ])
    );
    assert_eq!(host_audi.spec.type_, "Audi");
    assert_eq!(host_audi.spec.seats, Some(4));
    assert!(host_audi.status.is_none());

    // a change the host copy does not depend on (the virtual status) sends no request:
    // translate_update returns None and sync_to_host_update does nothing
    let writes_before = stats.writes();
    virtual_cars
        .patch_status(
            "audi",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Parked"}})),
        )
        .await
        .expect("virtual status");
    // then a second car: once it is on the host, the status change above was seen too
    apply_car(
        &virtual_,
        "team-a",
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "bmw"}, "spec": {"type": "BMW"}
        }),
    )
    .await;
    wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt("bmw-x-team-a-x-sdk").await.ok().flatten() }
    })
    .await;
    assert_eq!(stats.writes(), writes_before + 1, "only bmw's create");
    let unchanged = host_cars.get(host_name).await.expect("host audi");
    assert_eq!(unchanged.resource_version(), host_audi.resource_version());

    // update: the spec and a removed label follow
    apply_car(
        &virtual_,
        "team-a",
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "audi", "annotations": {"note": "fast"}},
            "spec": {"type": "Audi", "seats": 2}
        }),
    )
    .await;
    let updated = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move {
            let car = api.get(host_name).await.ok()?;
            (car.spec.seats == Some(2) && !car.labels().contains_key("color")).then_some(car)
        }
    })
    .await;
    assert!(
        !updated
            .annotations()
            .contains_key("vcluster.loft.sh/managed-labels")
    );

    // the pod hook labels the host pods the vCluster made, and only those
    let pods: Api<Pod> = Api::namespaced(host.clone(), HOST_NS);
    for (name, managed) in [("synced", true), ("foreign", false)] {
        let mut labels = json!({"app": "web"});
        if managed {
            labels["vcluster.loft.sh/managed-by"] = json!(VCLUSTER);
        }
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced").await.ok()?;
            (pod.labels().get("created-by-plugin").map(String::as_str) == Some("pod-hook"))
                .then_some(())
        }
    })
    .await;
    let foreign = pods.get("foreign").await.expect("foreign pod");
    assert_eq!(foreign.labels(), &string_map([("app", "web")]));

    // delete: the host copy follows
    virtual_cars
        .delete("audi", &DeleteParams::default())
        .await
        .expect("delete audi");
    wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        async move { api.get_opt(host_name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(
        host_cars
            .get_opt("bmw-x-team-a-x-sdk")
            .await
            .unwrap()
            .is_some()
    );
    assert!(!running.is_finished());
    running.abort();
}
