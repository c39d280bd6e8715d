//! The declarative runtime (`vcp_syncer_runtime::run`) in-process: [`start_runtime`], and the
//! [`World`] of a runtime test (a host namespace with its plugin, RBAC for `vcp-syncer`, the
//! runtime running under that identity), shared by the `runtime_sync_*` binaries.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::{Config, PodSync};

use crate::control_plane::{Cluster, ControlPlane, Identity};
use crate::fixtures::{TEST_FIELD_MANAGER, string_map};
use crate::wait::wait_for;

/// Binds the runtime's identity (`vcp-syncer`) to `cluster-admin` on the cluster of `client`,
/// for tests where RBAC is not the subject.
///
/// # Panics
/// When the binding cannot be applied.
pub async fn syncer_is_cluster_admin(client: &Client) {
    crate::fixtures::apply_yaml(
        client,
        r"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: vcp-syncer-cluster-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: vcp-syncer}]
",
        None,
    )
    .await
    .expect("bind vcp-syncer to cluster-admin");
}

/// How long the [`World`] helpers wait for the runtime.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A runtime started by [`start_runtime`].
pub struct Runtime {
    /// The spawned `vcp_syncer_runtime::run`; it runs until it fails or is aborted (dropping
    /// the handle leaves it running).
    pub task: tokio::task::JoinHandle<Result<(), vcp_syncer_runtime::Error>>,
    /// Its count of finished reconciles per object ([`Config::reconciles`]).
    pub reconciles: std::sync::Arc<vcp_syncer_runtime::stats::ReconcileLog>,
    /// Where it serves `/metrics` and `/healthz` ([`Config::metrics_bind_address`]: a free
    /// local port).
    pub metrics: SocketAddr,
}

/// A free port of `127.0.0.1` (bound, read and released: the runtime binds it again).
pub fn free_local_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port")
}

/// Spawns the runtime on the current tokio runtime for plugin `plugin` in host namespace
/// `host_ns`, with `host` and `virtual_` as its clients (the identity they carry is the one
/// it runs as), after `tune` has adjusted its [`Config`] (status interval, pod sync, ...).
pub fn start_runtime(
    host: Client,
    virtual_: Client,
    host_ns: &str,
    plugin: &str,
    tune: impl FnOnce(&mut Config),
) -> Runtime {
    let mut config = Config::new(host, virtual_, host_ns, plugin);
    let metrics = free_local_addr();
    config.metrics_bind_address = Some(metrics);
    tune(&mut config);
    let reconciles = config.reconciles.clone();
    Runtime {
        task: tokio::spawn(vcp_syncer_runtime::run(config)),
        reconciles,
        metrics,
    }
}

/// The tutorial's `Car` (`example.loft.sh/v1`, plural `cars`).
pub fn cars_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    )
}

/// Core `v1` `Pod`s.
pub fn pods_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

/// Server-side applies `obj` (forced, as [`TEST_FIELD_MANAGER`]) with `client`, in `namespace`
/// or cluster-scoped, and returns the stored object.
///
/// # Panics
/// When the API server refuses it.
pub async fn apply_dynamic(
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
pub struct World {
    /// Admin client of the host cluster.
    pub host: Client,
    /// Admin client of the virtual cluster.
    pub virtual_: Client,
    /// The test's host namespace, `vc-<test>`.
    pub host_ns: String,
    /// The vCluster's name (and its Service's), `vc-<test>`.
    pub vcluster: String,
    /// The value of the `e2e` label that the default spec selects.
    pub selector: String,
    /// The runtime task; aborted when the world is dropped.
    pub runtime: tokio::task::JoinHandle<Result<(), vcp_syncer_runtime::Error>>,
    /// The runtime's count of finished reconciles per object ([`Config::reconciles`]).
    pub reconciles: std::sync::Arc<vcp_syncer_runtime::stats::ReconcileLog>,
    /// Where the runtime serves `/metrics` ([`Runtime::metrics`]).
    pub metrics: SocketAddr,
}

impl Drop for World {
    fn drop(&mut self) {
        self.runtime.abort();
    }
}

/// The default plugin spec of a test: Cars labelled `e2e=<test>` to the host with status, and
/// the tutorial's pod hook.
pub fn default_spec(test: &str) -> Value {
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
pub async fn world(test: &str, virtual_namespaces: &[&str]) -> World {
    world_with(test, virtual_namespaces, default_spec(test), PodSync::Hooks).await
}

/// Installs CRDs in both clusters, the syncer's RBAC, the plugin with `spec`, and starts the
/// runtime with `pod_sync`.
pub async fn world_with(
    test: &str,
    virtual_namespaces: &[&str],
    spec: Value,
    pod_sync: PodSync,
) -> World {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    crate::install_crds(&host).await;
    crate::install_crds(&virtual_).await;
    let host_ns = format!("vc-{test}");
    let vcluster = format!("vc-{test}");
    crate::create_namespace(&host, &host_ns).await;
    for ns in virtual_namespaces {
        crate::create_namespace(&virtual_, ns).await;
    }
    let rbac = |kind: &str, plural: &str, version: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", version, kind),
            plural,
        )
    };
    // Host: a Role in the vCluster's namespace only.
    apply_dynamic(&host, &rbac("Role", "roles", "v1"), Some(&host_ns), json!({
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
    apply_dynamic(&host, &services, Some(&host_ns), json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": vcluster, "namespace": host_ns},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}
    })).await;
    apply_dynamic(&host, &rbac("RoleBinding", "rolebindings", "v1"), Some(&host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "vcp-syncer", "namespace": host_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-syncer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
    // Virtual: Cars (written by FromHost), their status, pods (--pod-sync=full), namespaces.
    apply_dynamic(&virtual_, &rbac("ClusterRole", "clusterroles", "v1"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "vcp-e2e-syncer"},
        "rules": [
            {"apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["example.loft.sh"], "resources": ["cars/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["e2e.vcp.test"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["e2e.vcp.test"], "resources": ["widgets/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]}
        ]
    })).await;
    apply_dynamic(&virtual_, &rbac("ClusterRoleBinding", "clusterrolebindings", "v1"), None, json!({
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
    // no operator runs here: its verdict is stood in for, so the hooks apply
    crate::accept_as_operator(&host, &host_ns, "car-plugin").await;

    let Runtime {
        task: runtime,
        reconciles,
        metrics,
    } = start_runtime(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &host_ns,
        "car-plugin",
        |config| {
            config.status_interval = Duration::from_millis(300);
            config.pod_sync = pod_sync;
        },
    );
    World {
        host,
        virtual_,
        host_ns,
        vcluster,
        selector: test.to_string(),
        runtime,
        reconciles,
        metrics,
    }
}

impl World {
    /// Waits until the runtime has finished a reconcile of `key` (`namespace/name`) of `kind`
    /// beyond its `after`-th — the evidence that it looked after a change — and returns the
    /// count then.
    pub async fn wait_reconciled(&self, kind: &str, key: &str, after: u64) -> u64 {
        let log = self.reconciles.clone();
        crate::wait::poll_for(TIMEOUT, || {
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
    pub fn runtime_writes(&self, part: &str) -> Vec<(String, String)> {
        crate::audit::Audit::writes()
            .by(Identity::Syncer)
            .in_namespace(&self.host_ns)
            .uri_contains(part)
            .requests()
    }

    /// The Cars of virtual namespace `ns`.
    pub fn virtual_cars(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.virtual_.clone(), ns, &cars_resource())
    }

    /// The Cars of the host namespace.
    pub fn host_cars(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.host.clone(), &self.host_ns, &cars_resource())
    }

    /// Creates or updates a virtual Car with exactly these labels (plus the test's selector
    /// label), annotations and spec.
    pub async fn put_car(
        &self,
        ns: &str,
        name: &str,
        labels: Value,
        annotations: Value,
        spec: Value,
    ) -> DynamicObject {
        let mut labels = labels;
        labels["e2e"] = json!(self.selector);
        apply_dynamic(&self.virtual_, &cars_resource(), Some(ns), json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": spec
        }))
        .await
    }

    /// Waits until the host Car `name` satisfies `check`.
    pub async fn host_car_where(
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
    pub async fn expected_owner(&self) -> Value {
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
    pub fn expected_metadata(
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
