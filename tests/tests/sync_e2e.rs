//! The declarative runtime (`vcp_syncer_runtime::run`) end to end, on the real host and virtual
//! API servers (RBAC on).
//!
//! The runtime runs in-process under the `vcp-syncer` identity, which each test grants only a
//! Role in its own host namespace (plus read access to Cars in the virtual cluster): the host
//! is watched in that namespace only. The virtual cluster is shared by all tests, so each
//! test's VClusterPlugin selects its own Cars with a label selector (`e2e=<test>`), and each
//! test uses its own host namespace and vCluster name.

use std::collections::BTreeMap;
use std::time::Duration;
use vcp_crds::Reason;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::{Config, PodSync, run};
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, string_map, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);

fn cars_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    )
}

fn pods_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

async fn apply(
    client: &Client,
    ar: &ApiResource,
    namespace: Option<&str>,
    obj: Value,
) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(obj).expect("object");
    let name = obj.name_any();
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(
        &name,
        &PatchParams::apply(TEST_FIELD_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"))
}

/// A test's world: host namespace `host_ns` with a VClusterPlugin `plugin` for vCluster
/// `vcluster`, virtual namespaces, and the runtime running as `vcp-syncer`.
struct World {
    host: Client,
    virtual_: Client,
    host_ns: String,
    vcluster: String,
    selector: String,
    runtime: tokio::task::JoinHandle<Result<(), vcp_syncer_runtime::Error>>,
    /// The runtime's count of finished reconciles per object ([`Config::reconciles`]).
    reconciles: std::sync::Arc<vcp_syncer_runtime::stats::ReconcileLog>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.runtime.abort();
    }
}

/// The default plugin spec of a test: Cars labelled `e2e=<test>` to the host with status, and
/// the tutorial's pod hook.
fn default_spec(test: &str) -> Value {
    json!({
        "vcluster": {"name": format!("vc-{test}")},
        "syncedTypes": [{
            "apiVersion": "example.loft.sh/v1", "kind": "Car", "syncStatus": true,
            "selector": {"matchLabels": {"e2e": test}}
        }],
        "hooks": [{
            "name": "pod-hook", "apiVersion": "v1", "kind": "Pod",
            "events": ["CreatePhysical", "UpdatePhysical"],
            "labels": {"created-by-plugin": "pod-hook"}
        }]
    })
}

/// [`world_with`] the default spec and `--pod-sync=hooks`.
async fn world(test: &str, virtual_namespaces: &[&str]) -> World {
    world_with(test, virtual_namespaces, default_spec(test), PodSync::Hooks).await
}

/// Installs CRDs in both clusters, the syncer's RBAC, the plugin with `spec`, and starts the
/// runtime with `pod_sync`.
async fn world_with(
    test: &str,
    virtual_namespaces: &[&str],
    spec: Value,
    pod_sync: PodSync,
) -> World {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    let host_ns = format!("vc-{test}");
    let vcluster = format!("vc-{test}");
    vcp_tests::create_namespace(&host, &host_ns).await;
    for ns in virtual_namespaces {
        vcp_tests::create_namespace(&virtual_, ns).await;
    }
    let rbac = |kind: &str, plural: &str, version: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", version, kind),
            plural,
        )
    };
    // Host: a Role in the vCluster's namespace only.
    apply(&host, &rbac("Role", "roles", "v1"), Some(&host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "vcp-syncer", "namespace": host_ns},
        "rules": [
            {"apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
            {"apiGroups": ["e2e.vcp.test"], "resources": ["widgets"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["vcp.dev"], "resources": ["vclusterplugins"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["vcp.dev"], "resources": ["vclusterplugins/status"], "verbs": ["get", "patch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get"], "resourceNames": [vcluster]}
        ]
    })).await;
    // The vCluster's Service (named like the vCluster, as the chart makes it): the owner of
    // every host copy (vCluster's setOwner).
    let services =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Service"), "services");
    apply(&host, &services, Some(&host_ns), json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": vcluster, "namespace": host_ns},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}
    })).await;
    apply(&host, &rbac("RoleBinding", "rolebindings", "v1"), Some(&host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "vcp-syncer", "namespace": host_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-syncer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
    // Virtual: Cars (written by FromHost), their status, pods (--pod-sync=full), namespaces.
    apply(&virtual_, &rbac("ClusterRole", "clusterroles", "v1"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "vcp-e2e-syncer"},
        "rules": [
            {"apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["example.loft.sh"], "resources": ["cars/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["e2e.vcp.test"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]}
        ]
    })).await;
    apply(&virtual_, &rbac("ClusterRoleBinding", "clusterrolebindings", "v1"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "vcp-e2e-syncer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp-e2e-syncer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;

    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), &host_ns);
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "car-plugin", "namespace": host_ns},
        "spec": spec
    }))
    .expect("plugin");
    plugins
        .patch(
            "car-plugin",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&plugin),
        )
        .await
        .expect("apply plugin");

    let host_syncer = cp.client(Cluster::Host, Identity::Syncer).await;
    let virtual_syncer = cp.client(Cluster::Virtual, Identity::Syncer).await;
    let mut config = Config::new(host_syncer, virtual_syncer, &host_ns, "car-plugin");
    config.status_interval = Duration::from_millis(300);
    config.pod_sync = pod_sync;
    let reconciles = config.reconciles.clone();
    let runtime = tokio::spawn(run(config));
    World {
        host,
        virtual_,
        host_ns,
        vcluster,
        selector: test.to_string(),
        runtime,
        reconciles,
    }
}

impl World {
    /// Waits until the runtime has finished a reconcile of `key` (`namespace/name`) of `kind`
    /// beyond its `after`-th — the evidence that it looked after a change — and returns the
    /// count then.
    async fn wait_reconciled(&self, kind: &str, key: &str, after: u64) -> u64 {
        let log = self.reconciles.clone();
        vcp_tests::poll_for(TIMEOUT, || {
            let log = log.clone();
            async move { Some(log.reconciles(kind, key)).filter(|n| *n > after) }
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "the runtime did not reconcile {kind} {key} after its reconcile #{after} within {TIMEOUT:?}"
            )
        })
    }

    /// The runtime's (`vcp-syncer`'s) write requests on the host, from the audit log, whose
    /// URI is in this test's host namespace and contains `part`.
    fn runtime_writes(&self, part: &str) -> Vec<(String, String)> {
        vcp_tests::audited_writes(
            ControlPlane::shared(),
            Cluster::Host,
            Identity::Syncer.user(),
        )
        .expect("audit log")
        .into_iter()
        .filter(|(_, uri)| {
            uri.contains(&format!("/namespaces/{}/", self.host_ns)) && uri.contains(part)
        })
        .collect()
    }

    fn virtual_cars(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.virtual_.clone(), ns, &cars_resource())
    }

    fn host_cars(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.host.clone(), &self.host_ns, &cars_resource())
    }

    /// Creates or updates a virtual Car with exactly these labels (plus the test's selector
    /// label), annotations and spec.
    async fn put_car(
        &self,
        ns: &str,
        name: &str,
        labels: Value,
        annotations: Value,
        spec: Value,
    ) -> DynamicObject {
        let mut labels = labels;
        labels["e2e"] = json!(self.selector);
        apply(&self.virtual_, &cars_resource(), Some(ns), json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": spec
        }))
        .await
    }

    /// Waits until the host Car `name` satisfies `check`.
    async fn host_car_where(
        &self,
        name: &str,
        check: impl Fn(&DynamicObject) -> bool,
    ) -> DynamicObject {
        let api = self.host_cars();
        wait_for(TIMEOUT, || {
            let api = api.clone();
            let check = &check;
            async move { api.get_opt(name).await.ok().flatten().filter(check) }
        })
        .await
    }

    /// The ownerReferences vCluster puts on every host copy (with `setOwner`, its default):
    /// the vCluster's Service, `controller: false` (a Car has no controller), no
    /// `blockOwnerDeletion` (vCluster's `GetOwnerReference`).
    async fn expected_owner(&self) -> Value {
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(self.host.clone(), &self.host_ns);
        let service = services
            .get(&self.vcluster)
            .await
            .expect("the vCluster's Service");
        json!([{"apiVersion": "v1", "kind": "Service", "name": self.vcluster,
                "uid": service.metadata.uid.expect("uid"), "controller": false}])
    }

    /// The exact labels and annotations a host Car must have.
    fn expected_metadata(
        &self,
        virtual_car: &DynamicObject,
        host_name: &str,
        extra_labels: &[(&str, &str)],
        extra_annotations: &[(&str, &str)],
    ) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let ns = virtual_car.namespace().unwrap();
        let mut labels = virtual_car.labels().clone();
        labels.insert("vcluster.loft.sh/managed-by".into(), self.vcluster.clone());
        labels.insert("vcluster.loft.sh/namespace".into(), ns.clone());
        let mut annotations = virtual_car.annotations().clone();
        let managed_annotations = annotations.keys().cloned().collect::<Vec<_>>().join("\n");
        annotations.extend(string_map([
            (
                "vcluster.loft.sh/object-name",
                virtual_car.name_any().as_str(),
            ),
            ("vcluster.loft.sh/object-namespace", ns.as_str()),
            (
                "vcluster.loft.sh/object-uid",
                virtual_car.uid().unwrap().as_str(),
            ),
            (
                "vcluster.loft.sh/object-kind",
                "example.loft.sh/v1, Kind=Car",
            ),
            ("vcluster.loft.sh/object-host-name", host_name),
            (
                "vcluster.loft.sh/object-host-namespace",
                self.host_ns.as_str(),
            ),
        ]));
        if !managed_annotations.is_empty() {
            annotations.insert(
                "vcluster.loft.sh/managed-annotations".into(),
                managed_annotations,
            );
        }
        for (k, v) in extra_labels {
            labels.insert(k.to_string(), v.to_string());
        }
        for (k, v) in extra_annotations {
            annotations.insert(k.to_string(), v.to_string());
        }
        (labels, annotations)
    }
}

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
async fn pod_hook_labels_host_pods_of_the_vcluster() {
    let w = world("pods", &[]).await;
    let pods = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = |name: &str, labels: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": w.host_ns, "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        })
    };
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod(
            "synced-pod",
            json!({"vcluster.loft.sh/managed-by": w.vcluster, "app": "web"}),
        ),
    )
    .await;
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod("other-pod", json!({"app": "web"})),
    )
    .await;

    let hooked = wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            (pod.labels().get("created-by-plugin").map(String::as_str) == Some("pod-hook"))
                .then_some(pod)
        }
    })
    .await;
    assert_eq!(
        hooked.labels(),
        &string_map([
            ("vcluster.loft.sh/managed-by", w.vcluster.as_str()),
            ("app", "web"),
            ("created-by-plugin", "pod-hook"),
        ])
    );
    // idempotent: no further write once applied. The trigger is a label the hook does not
    // manage: once the runtime reconciled the pod again, the audit log shows no write since.
    let key = format!("{}/synced-pod", w.host_ns);
    let before = w.reconciles.reconciles("Pod", &key);
    let writes_before = w.runtime_writes("/pods/synced-pod");
    assert_eq!(
        writes_before.len(),
        1,
        "one write applied the hook: {writes_before:?}"
    );
    let poked = pods
        .patch(
            "synced-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-poke": "1"}}})),
        )
        .await
        .expect("poke the pod");
    let after = w.wait_reconciled("Pod", &key, before).await;
    let writes_after = w.runtime_writes("/pods/synced-pod");
    let later = pods.get("synced-pod").await.expect("pod");
    println!(
        "pod hook applied: runtime reconciled {key} {} more time(s) after a label change; its \
         writes of the pod: {} before, {} after; of other-pod: {}",
        after - before,
        writes_before.len(),
        writes_after.len(),
        w.runtime_writes("/pods/other-pod").len()
    );
    assert_eq!(
        writes_after, writes_before,
        "no write once the hook is applied"
    );
    assert_eq!(later.resource_version(), poked.resource_version());
    // a pod of no vCluster is not touched
    let other = pods.get("other-pod").await.expect("other pod");
    assert_eq!(other.labels(), &string_map([("app", "web")]));
    assert_eq!(
        w.runtime_writes("/pods/other-pod"),
        Vec::<(String, String)>::new()
    );

    // a label removed on the host is put back (UpdatePhysical)
    pods.patch(
        "synced-pod",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"created-by-plugin": null}}})),
    )
    .await
    .expect("unlabel");
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            pod.labels().contains_key("created-by-plugin").then_some(())
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

    // add a Car hook to the plugin: the running runtime picks it up
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
    let config = Config::new(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &w.host_ns,
        "car-plugin",
    );
    w.runtime = tokio::spawn(run(config));
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

/// The watch event of the runtime's own write (its echo) is not reconciled again (issue 15,
/// item 1: it cost one reconcile per synced object). 20 Cars are synced; after their host
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

#[tokio::test]
async fn from_host_copies_host_objects_into_the_virtual_cluster() {
    let test = "fromhost";
    let spec = json!({
        "vcluster": {"name": "vc-fromhost"},
        "syncedTypes": [{
            "apiVersion": "example.loft.sh/v1", "kind": "Car", "direction": "FromHost",
            "syncStatus": true, "selector": {"matchLabels": {"e2e": test}}
        }],
        "hooks": [{
            "name": "import-hook", "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "events": ["CreateVirtual", "UpdateVirtual"],
            "labels": {"imported": "yes"},
            "jsonPatch": [{"op": "add", "path": "/metadata/annotations/imported-by", "value": "runtime"}]
        }]
    });
    let w = world_with(test, &[], spec, PodSync::Hooks).await;
    // identity mapping: host namespace vc-fromhost → virtual namespace vc-fromhost
    let virtual_cars = w.virtual_cars(&w.host_ns);
    let host_car = |name: &str, labels: Value, spec: Value| {
        json!({"apiVersion": "example.loft.sh/v1", "kind": "Car",
               "metadata": {"name": name, "namespace": w.host_ns, "labels": labels}, "spec": spec})
    };
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car(
            "shared",
            json!({"e2e": test, "tier": "gold"}),
            json!({"type": "Audi"}),
        ),
    )
    .await;
    // a host copy some vCluster made from a virtual object is never imported back
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car(
            "copy-x-a-x-vc",
            json!({"e2e": test, "vcluster.loft.sh/managed-by": "vc"}),
            json!({"type": "BMW"}),
        ),
    )
    .await;
    let wait_virtual = |check: Box<dyn Fn(&DynamicObject) -> bool>| {
        let api = virtual_cars.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let check = &check;
                async move {
                    api.get_opt("shared")
                        .await
                        .ok()
                        .flatten()
                        .filter(|c| check(c))
                }
            })
            .await
        }
    };
    let imported = wait_virtual(Box::new(|_| true)).await;
    assert_eq!(
        imported.labels(),
        &string_map([("e2e", test), ("tier", "gold"), ("imported", "yes")])
    );
    assert_eq!(
        imported.annotations(),
        &string_map([
            ("vcluster.loft.sh/object-host-name", "shared"),
            ("vcluster.loft.sh/object-host-namespace", w.host_ns.as_str()),
            ("imported-by", "runtime"),
        ])
    );
    assert_eq!(imported.data["spec"], json!({"type": "Audi"}));

    // (the runtime created the virtual namespace) a virtual object of a name the host also has, not made by the runtime: untouched
    let mine = apply(
        &w.virtual_,
        &cars_resource(),
        Some(&w.host_ns),
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "taken", "namespace": w.host_ns}, "spec": {"type": "Mine"}
        }),
    )
    .await;
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car("taken", json!({"e2e": test}), json!({"type": "Theirs"})),
    )
    .await;

    // host changes follow (UpdateVirtual hooks applied), status included (syncStatus)
    let host_cars = w.host_cars();
    host_cars
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"seats": 5}})),
        )
        .await
        .expect("host spec");
    host_cars
        .patch_status(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Imported"}})),
        )
        .await
        .expect("host status");
    let updated = wait_virtual(Box::new(|c| {
        c.data["spec"]["seats"] == json!(5) && c.data["status"]["phase"] == json!("Imported")
    }))
    .await;
    assert_eq!(
        updated.labels().get("imported").map(String::as_str),
        Some("yes")
    );

    // drift in the virtual cluster is reverted
    virtual_cars
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "Drift"}})),
        )
        .await
        .expect("virtual drift");
    wait_virtual(Box::new(|c| c.data["spec"]["type"] == json!("Audi"))).await;

    // the unmanaged virtual object is reported and untouched; the managed-by copy not imported
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
    let still_mine = virtual_cars.get("taken").await.expect("mine");
    assert_eq!(still_mine.resource_version(), mine.resource_version());
    assert!(
        virtual_cars
            .get_opt("copy-x-a-x-vc")
            .await
            .unwrap()
            .is_none()
    );

    // a deleted host object deletes its virtual copy
    host_cars
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete host");
    wait_for(TIMEOUT, || {
        let api = virtual_cars.clone();
        async move { api.get_opt("shared").await.ok()?.is_none().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn pod_sync_full_syncs_pods_and_their_status() {
    let w = world_with(
        "podfull",
        &["podfull-a"],
        default_spec("podfull"),
        PodSync::Full,
    )
    .await;
    let virtual_pods =
        Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), "podfull-a", &pods_resource());
    let host_pods =
        Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = apply(
        &w.virtual_,
        &pods_resource(),
        Some("podfull-a"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "podfull-a", "labels": {"app": "web"}},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
        }),
    )
    .await;
    let host_name = "web-x-podfull-a-x-vc-podfull";
    let host_pod = wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move { api.get_opt(host_name).await.ok().flatten() }
    })
    .await;
    // translated metadata, with the pod hook applied before the write (CreatePhysical)
    assert_eq!(
        host_pod.labels(),
        &string_map([
            ("app", "web"),
            ("vcluster.loft.sh/managed-by", "vc-podfull"),
            ("vcluster.loft.sh/namespace", "podfull-a"),
            ("created-by-plugin", "pod-hook"),
        ])
    );
    assert_eq!(
        host_pod.annotations().get("vcluster.loft.sh/object-uid"),
        pod.uid().as_ref()
    );
    assert_eq!(
        host_pod
            .annotations()
            .get("vcluster.loft.sh/object-kind")
            .map(String::as_str),
        Some("/v1, Kind=Pod")
    );
    assert_eq!(
        host_pod.data["spec"]["containers"][0]["image"],
        json!("registry.invalid/web:1")
    );

    // no node runs it: the status is written on the host as admin and copied up
    host_pods
        .patch_status(
            host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"message": "set on the host", "reason": "HostSide"}})),
        )
        .await
        .expect("host pod status");
    wait_for(TIMEOUT, || {
        let api = virtual_pods.clone();
        async move {
            let pod = api.get("web").await.ok()?;
            (pod.data["status"]["message"] == json!("set on the host")).then_some(())
        }
    })
    .await;

    // a label change follows; deleting the virtual pod deletes the host pod
    apply(&w.virtual_, &pods_resource(), Some("podfull-a"), json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "podfull-a", "labels": {"app": "web", "v": "2"}},
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
    }))
    .await;
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move {
            let pod = api.get(host_name).await.ok()?;
            (pod.labels().get("v").map(String::as_str) == Some("2")).then_some(())
        }
    })
    .await;
    virtual_pods
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete virtual pod");
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move { api.get_opt(host_name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// `syncedTypes[].selector` changes, as vCluster v0.30.0 treats an object that leaves a sync
/// selector (`pkg/controllers/resources/ingressclasses/syncer.go`: the copy of a source that no
/// longer matches is deleted, with a log line saying why): a virtual Car relabelled out of the
/// selector, or left out by a narrowed selector (`matchLabels` and `matchExpressions` with
/// `In`, `NotIn`, `Exists`, `DoesNotExist`), loses its host copy and the runtime says so (a
/// `Normal` Event `SelectorNoLongerMatches` naming the object, a log line, a counter); the
/// virtual Car is never touched, the Cars that still match are not rewritten, and a Car
/// labelled back in is synced again.
#[tokio::test]
async fn selector_changes_delete_the_host_copies_that_left_it_and_say_so() {
    let test = "selsync";
    let ns = "selsync-a";
    let selector =
        |expressions: Value| json!({"matchLabels": {"e2e": test}, "matchExpressions": expressions});
    let mut spec = default_spec(test);
    spec["syncedTypes"][0]["selector"] =
        selector(json!([{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]));
    let w = world_with(test, &[ns], spec, PodSync::Hooks).await;
    let started = std::time::Instant::now();
    let host = |name: &str| format!("{name}-x-{ns}-x-vc-{test}");
    let car = |name: &'static str, labels: Value| {
        let w = &w;
        async move {
            w.put_car(ns, name, labels, json!({}), json!({"type": "Audi"}))
                .await
        }
    };
    car("gold", json!({"tier": "gold"})).await;
    car("silver", json!({"tier": "silver"})).await;
    car("team", json!({"tier": "gold", "team": "x"})).await;
    car("bronze", json!({"tier": "bronze"})).await;
    for name in ["gold", "silver", "team"] {
        w.host_car_where(&host(name), |_| true).await;
    }
    let host_cars = w.host_cars();
    let gone = |name: String| {
        let api = host_cars.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let name = name.clone();
                async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
            })
            .await;
        }
    };
    let events = || async {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::SelectorNoLongerMatches.as_str()))
            .map(|e| {
                // kube's Recorder folds repeats of one reason on one object into a series
                let count = e.series.as_ref().map_or(1, |s| s.count);
                (
                    e.type_.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    count,
                )
            })
            .collect::<Vec<_>>()
    };
    let total = |found: &[(String, String, i32)]| found.iter().map(|e| e.2).sum::<i32>();
    let wait_events = |n: i32| async move {
        vcp_tests::poll_for(TIMEOUT, || async move {
            let found = events().await;
            (total(&found) >= n).then_some(found)
        })
        .await
        .unwrap_or_else(|| panic!("fewer than {n} SelectorNoLongerMatches Events"))
    };
    // bronze never matched: never copied
    assert!(host_cars.get_opt(&host("bronze")).await.unwrap().is_none());

    // 1. relabelled out (In no longer holds): the host copy goes, an Event names the Car
    let silver_before = w
        .virtual_cars(ns)
        .get("silver")
        .await
        .expect("virtual silver");
    car("silver", json!({"tier": "bronze"})).await;
    gone(host("silver")).await;
    let found = wait_events(1).await;
    assert_eq!(total(&found), 1, "{found:?}");
    assert_eq!(found[0].0, "Normal");
    assert!(
        found[0].1.contains(&format!("{ns}/silver ")) && found[0].1.contains(&host("silver")),
        "{found:?}"
    );
    let silver_after = w
        .virtual_cars(ns)
        .get("silver")
        .await
        .expect("virtual silver");
    assert_eq!(
        silver_after.uid(),
        silver_before.uid(),
        "the virtual Car stays"
    );

    // 2. labelled back in: synced again, a new host copy
    car("silver", json!({"tier": "silver"})).await;
    w.host_car_where(&host("silver"), |c| {
        c.labels().get("tier").map(String::as_str) == Some("silver")
    })
    .await;

    // 3. the selector narrowed (In gold, and DoesNotExist team): silver and team go, gold stays
    //    and is not rewritten
    let gold_writes = w.runtime_writes(&format!("/cars/{}", host("gold")));
    let gold_reconciles = w.reconciles.reconciles("Car", &format!("{ns}/gold"));
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let narrow = |expressions: Value| {
        let plugins = plugins.clone();
        let mut types = default_spec(test)["syncedTypes"].clone();
        types[0]["selector"] = selector(expressions);
        async move {
            plugins
                .patch(
                    "car-plugin",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"syncedTypes": types}})),
                )
                .await
                .expect("change the selector");
        }
    };
    narrow(json!([
        {"key": "tier", "operator": "In", "values": ["gold"]},
        {"key": "team", "operator": "DoesNotExist"}
    ]))
    .await;
    gone(host("silver")).await;
    gone(host("team")).await;
    w.wait_reconciled("Car", &format!("{ns}/gold"), gold_reconciles)
        .await;
    assert!(host_cars.get_opt(&host("gold")).await.unwrap().is_some());
    assert_eq!(
        w.runtime_writes(&format!("/cars/{}", host("gold"))),
        gold_writes,
        "a Car that still matches is not rewritten"
    );
    let found = wait_events(3).await;

    // 4. NotIn and Exists: only the Car with a team that is not bronze matches
    narrow(json!([
        {"key": "tier", "operator": "NotIn", "values": ["bronze"]},
        {"key": "team", "operator": "Exists"}
    ]))
    .await;
    gone(host("gold")).await;
    w.host_car_where(&host("team"), |_| true).await;
    let found_all = wait_events(4).await;
    for name in ["silver", "bronze"] {
        assert!(
            host_cars.get_opt(&host(name)).await.unwrap().is_none(),
            "{name}"
        );
    }
    // every virtual Car is still there
    let virtual_names: Vec<String> = w
        .virtual_cars(ns)
        .list(&Default::default())
        .await
        .expect("virtual cars")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(virtual_names, ["bronze", "gold", "silver", "team"]);
    let deletes = w
        .runtime_writes("/cars/")
        .into_iter()
        .filter(|(verb, _)| verb == "delete")
        .count();
    println!(
        "selector changes: relabelled out 1, narrowed (In + DoesNotExist) 2, narrowed (NotIn + \
         Exists) 1; host copies deleted by the runtime: {deletes}; SelectorNoLongerMatches \
         Events (with their series count): {} after step 3, {} in all; virtual Cars kept: {}; \
         {:.1} s",
        total(&found),
        total(&found_all),
        virtual_names.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(total(&found), 3, "{found:?}");
    assert_eq!(total(&found_all), 4, "{found_all:?}");
    assert_eq!(deletes, 4);
}

/// An `UpdatePhysical` pod hook whose JSON patch renames a container — a field Kubernetes does
/// not let change on an existing pod (`ValidatePodUpdate`) — with `--pod-sync=full`: the
/// runtime leaves that change out and says so once (a `Warning` Event `ImmutablePodFields` and a
/// log line), never sends the refused update, and keeps syncing the labels.
#[tokio::test]
async fn pod_hook_on_an_immutable_field_is_skipped_once_and_labels_keep_syncing() {
    let mut spec = default_spec("immut");
    spec["hooks"] = json!([{
        "name": "rename-container", "apiVersion": "v1", "kind": "Pod",
        "events": ["UpdatePhysical"],
        "labels": {"hooked": "yes"},
        "jsonPatch": [{"op": "replace", "path": "/spec/containers/0/name", "value": "renamed"}]
    }]);
    // only this test's pods: the virtual cluster is shared, and another test's pod synced here
    // drew a second ImmutablePodFields Warning, which the Event recorder counted as series 2
    spec["syncedTypes"]
        .as_array_mut()
        .expect("types")
        .push(json!({
            "apiVersion": "v1", "kind": "Pod", "syncStatus": true,
            "selector": {"matchLabels": {"e2e": "immut"}}
        }));
    let w = world_with("immut", &["immut-a"], spec, PodSync::Full).await;
    let host_pods =
        Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let virtual_pod = |mut labels: Value| {
        labels["e2e"] = json!("immut");
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "immut-a", "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
        })
    };
    apply(
        &w.virtual_,
        &pods_resource(),
        Some("immut-a"),
        virtual_pod(json!({"app": "web"})),
    )
    .await;
    let host_name = "web-x-immut-a-x-vc-immut";
    let started = std::time::Instant::now();
    // the hook's label arrives (UpdatePhysical), its container rename does not
    let hooked = wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move {
            let pod = api.get_opt(host_name).await.ok()??;
            (pod.labels().get("hooked").map(String::as_str) == Some("yes")).then_some(pod)
        }
    })
    .await;
    assert_eq!(hooked.data["spec"]["containers"][0]["name"], json!("c"));
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        Reason::ImmutablePodFields.as_str(),
        TIMEOUT,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.clone().unwrap_or_default();
    assert!(
        note.contains(host_name) && note.contains("/spec/containers/0/name"),
        "{note}"
    );

    // several more syncs of the pod: each label change on the virtual pod reaches the host pod
    let key = "immut-a/web";
    let first = w.reconciles.reconciles("Pod", key);
    for round in 1..=3 {
        let before = w.reconciles.reconciles("Pod", key);
        apply(
            &w.virtual_,
            &pods_resource(),
            Some("immut-a"),
            virtual_pod(json!({"app": "web", "round": round.to_string()})),
        )
        .await;
        let round_label = round.to_string();
        wait_for(TIMEOUT, || {
            let api = host_pods.clone();
            let round_label = round_label.clone();
            async move {
                let pod = api.get(host_name).await.ok()?;
                (pod.labels().get("round") == Some(&round_label)
                    && pod.labels().get("hooked").map(String::as_str) == Some("yes"))
                .then_some(())
            }
        })
        .await;
        w.wait_reconciled("Pod", key, before).await;
    }
    let syncs = w.reconciles.reconciles("Pod", key) - first;

    // exactly one Event, never repeated; no update refused by the API server
    let events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::ImmutablePodFields.as_str()))
            .collect();
    let repeats: i32 = events
        .iter()
        .map(|e| e.series.as_ref().map_or(0, |s| s.count))
        .sum();
    let writes: Vec<_> = vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| {
            w.user == Identity::Syncer.user() && w.uri.contains(&format!("/pods/{host_name}"))
        })
        .collect();
    let refused = writes.iter().filter(|w| w.code >= 400).count();
    println!(
        "fault: UpdatePhysical hook renames spec.containers[0].name (immutable on a pod); {syncs} \
         syncs of the pod after the warning, {} ImmutablePodFields Event(s) (series count \
         {repeats}), runtime writes of the host pod: {} ({refused} refused), {:.1} s",
        events.len(),
        writes.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(syncs >= 3, "the runtime synced the pod {syncs} times");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(repeats, 0, "{events:?}");
    assert_eq!(refused, 0, "{writes:?}");
    let last = host_pods.get(host_name).await.expect("host pod");
    assert_eq!(last.data["spec"]["containers"][0]["name"], json!("c"));
}

/// The same beside a vCluster (`--pod-sync=hooks`, the default), where the host pods exist
/// before any hook runs: a pod hook that sets `spec.nodeName` and a label gets its label onto
/// the vCluster's host pod, the `nodeName` change is left out and reported once, and no update
/// is refused, over several syncs of the pod.
#[tokio::test]
async fn pod_hook_on_an_immutable_field_beside_a_vcluster_is_skipped_once() {
    let mut spec = default_spec("immuthooks");
    spec["hooks"] = json!([{
        "name": "pin-node", "apiVersion": "v1", "kind": "Pod",
        "events": ["CreatePhysical", "UpdatePhysical"],
        "labels": {"hooked": "yes"},
        "jsonPatch": [{"op": "add", "path": "/spec/nodeName", "value": "node-1"}]
    }]);
    let w = world_with("immuthooks", &[], spec, PodSync::Hooks).await;
    let pods = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = |labels: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "synced-pod", "namespace": w.host_ns, "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        })
    };
    let managed = json!({"vcluster.loft.sh/managed-by": w.vcluster});
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod(managed.clone()),
    )
    .await;
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            (pod.labels().get("hooked").map(String::as_str) == Some("yes")).then_some(())
        }
    })
    .await;
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        Reason::ImmutablePodFields.as_str(),
        TIMEOUT,
    )
    .await;
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("/spec/nodeName"),
        "{:?}",
        event.note
    );
    let key = format!("{}/synced-pod", w.host_ns);
    let first = w.reconciles.reconciles("Pod", &key);
    for round in 1..=3 {
        let before = w.reconciles.reconciles("Pod", &key);
        let mut labels = managed.clone();
        labels["round"] = json!(round.to_string());
        labels["hooked"] = json!("yes");
        apply(&w.host, &pods_resource(), Some(&w.host_ns), pod(labels)).await;
        w.wait_reconciled("Pod", &key, before).await;
    }
    let syncs = w.reconciles.reconciles("Pod", &key) - first;
    let events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::ImmutablePodFields.as_str()))
            .collect();
    let writes: Vec<_> = vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| w.user == Identity::Syncer.user() && w.uri.contains("/pods/synced-pod"))
        .collect();
    let refused = writes.iter().filter(|w| w.code >= 400).count();
    let last = pods.get("synced-pod").await.expect("pod");
    println!(
        "fault: pod hook adds spec.nodeName to existing host pods (--pod-sync=hooks); {syncs} \
         syncs after the warning, {} ImmutablePodFields Event(s) (series {:?}), runtime writes \
         of the pod: {} ({refused} refused)",
        events.len(),
        events
            .iter()
            .map(|e| e.series.as_ref().map(|s| s.count))
            .collect::<Vec<_>>(),
        writes.len()
    );
    assert!(syncs >= 3, "{syncs}");
    assert_eq!(events.len(), 1);
    assert!(events[0].series.is_none(), "{events:?}");
    assert_eq!(refused, 0, "{writes:?}");
    assert_eq!(last.data["spec"].get("nodeName"), None);
    assert_eq!(last.labels().get("hooked").map(String::as_str), Some("yes"));
}

/// A CRD `widgets.e2e.vcp.test` whose `spec` has the given schema.
fn widget_crd(spec_schema: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.e2e.vcp.test"},
        "spec": {"group": "e2e.vcp.test", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}}}]}
    })
}

#[tokio::test]
async fn malformed_object_is_reported_and_the_rest_keep_syncing() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    // the host CRD wants an integer size; the virtual one accepts anything
    let crds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    apply(
        &host,
        &crds,
        None,
        widget_crd(json!({"type": "object",
        "properties": {"size": {"type": "integer"}}})),
    )
    .await;
    apply(
        &virtual_,
        &crds,
        None,
        widget_crd(json!({"type": "object",
        "x-kubernetes-preserve-unknown-fields": true})),
    )
    .await;
    let widgets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Widget"),
        "widgets",
    );
    let spec = json!({
        "vcluster": {"name": "vc-malformed"},
        "syncedTypes": [{"apiVersion": "e2e.vcp.test/v1", "kind": "Widget"}]
    });
    let w = world_with("malformed", &["malformed-a"], spec, PodSync::Hooks).await;
    let widget = |name: &str, size: Value| {
        json!({"apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
               "metadata": {"name": name, "namespace": "malformed-a"}, "spec": {"size": size}})
    };
    // the discovery of the new CRD may lag: retry the virtual applies until served
    for (name, size) in [("bad", json!("big")), ("good", json!(3))] {
        let obj: DynamicObject = serde_json::from_value(widget(name, size)).unwrap();
        let api =
            Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), "malformed-a", &widgets);
        wait_for(TIMEOUT, || {
            let api = api.clone();
            let obj = obj.clone();
            async move {
                api.patch(
                    &obj.name_any(),
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&obj),
                )
                .await
                .ok()
            }
        })
        .await;
    }
    let host_widgets = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &widgets);
    let good = wait_for(TIMEOUT, || {
        let api = host_widgets.clone();
        async move {
            api.get_opt("good-x-malformed-a-x-vc-malformed")
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(good.data["spec"], json!({"size": 3}));
    // the bad one is refused by the host API server, reported, and retried (not dropped)
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let condition = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let widgets = status.synced_objects.iter().find(|s| s.kind == "Widget")?;
            let condition = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RuntimeHealthy")?
                .clone();
            (widgets.count == 1 && condition.reason == "SyncErrors").then_some(condition)
        }
    })
    .await;
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains("1 object(s) failed"),
        "{}",
        condition.message
    );
    assert!(
        host_widgets
            .get_opt("bad-x-malformed-a-x-vc-malformed")
            .await
            .unwrap()
            .is_none()
    );
}
