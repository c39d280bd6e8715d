//! Real CRDs that refer to other objects, end to end: each case installs CRDs from the files of
//! their own Go modules (`vcp_tests::real_crds`: Gateway API's standard channel from
//! `sigs.k8s.io/gateway-api`, Prometheus' `ServiceMonitor` from the prometheus-operator module),
//! syncs virtual objects to the host with the runtime in-process and vCluster-shaped `patches`,
//! and asserts that each host copy's spec is the virtual spec with exactly its references and
//! selectors pointing at the host copies. The expected values come from vCluster's own code
//! through the translate oracle: `SingleNamespaceHostName` for a `reference`, `HostLabelSelector`
//! for `labels`.
//!
//! | case | types | patches |
//! | --- | --- | --- |
//! | `gateway-api` | `Gateway`, `HTTPRoute` | `spec.parentRefs[*].name` a reference to the Gateway, `spec.rules[*].backendRefs[*].name` a reference to Services |
//! | `service-monitor` | `ServiceMonitor` | `spec.selector` a `labels` patch |

use std::path::PathBuf;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{apply_dynamic, world_with};
use vcp_tests::{
    Cluster, ControlPlane, Identity, create_namespace, gateway_api_crd_file, install_crd_files,
    service_monitor_crd_file, vcluster_host_label_selector, vcluster_host_name, wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// What the host copy holds at a JSON pointer of its spec.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// The host name of the object named there in the virtual object's namespace.
    HostName,
    /// The host selector of the label selector there.
    HostSelector,
}

/// One virtual object of a case and the pointers (into the stored virtual object) its patches
/// rewrite on the host.
struct Object {
    resource: ApiResource,
    body: Value,
    rewritten: Vec<(&'static str, Expect)>,
}

struct Case {
    name: &'static str,
    crds: Vec<PathBuf>,
    /// `(apiGroup, plural)` of the synced types, for the runtime's RBAC.
    resources: Vec<(&'static str, &'static str)>,
    /// `syncedTypes` of the plugin (each gets the case's selector).
    synced_types: Vec<Value>,
    objects: Vec<Object>,
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn cases(ns: &str) -> Vec<Case> {
    let gateways = resource("gateway.networking.k8s.io", "v1", "Gateway", "gateways");
    let routes = resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");
    let monitors = resource(
        "monitoring.coreos.com",
        "v1",
        "ServiceMonitor",
        "servicemonitors",
    );
    vec![
        Case {
            name: "gateway-api",
            crds: vec![
                gateway_api_crd_file("gateways"),
                gateway_api_crd_file("httproutes"),
            ],
            resources: vec![
                ("gateway.networking.k8s.io", "gateways"),
                ("gateway.networking.k8s.io", "httproutes"),
            ],
            synced_types: vec![
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway"}),
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "patches": [
                    {"path": "spec.parentRefs[*].name",
                     "reference": {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway"}},
                    {"path": "spec.rules[*].backendRefs[*].name",
                     "reference": {"apiVersion": "v1", "kind": "Service"}}
                ]}),
            ],
            objects: vec![
                Object {
                    resource: gateways,
                    body: json!({
                        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                        "metadata": {"name": "web-gateway", "namespace": ns},
                        "spec": {"gatewayClassName": "e2e",
                                 "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
                    }),
                    rewritten: vec![],
                },
                Object {
                    resource: routes,
                    body: json!({
                        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                        "metadata": {"name": "web", "namespace": ns},
                        "spec": {
                            "parentRefs": [{"name": "web-gateway"}],
                            "hostnames": ["web.example.test"],
                            "rules": [
                                {"backendRefs": [{"name": "web", "port": 8080, "weight": 90},
                                                 {"name": "web-canary", "port": 8080, "weight": 10}]},
                                {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                                 "backendRefs": [{"name": "api", "port": 80}]}
                            ]
                        }
                    }),
                    rewritten: vec![
                        ("/spec/parentRefs/0/name", Expect::HostName),
                        ("/spec/rules/0/backendRefs/0/name", Expect::HostName),
                        ("/spec/rules/0/backendRefs/1/name", Expect::HostName),
                        ("/spec/rules/1/backendRefs/0/name", Expect::HostName),
                    ],
                },
            ],
        },
        Case {
            name: "service-monitor",
            crds: vec![service_monitor_crd_file()],
            resources: vec![("monitoring.coreos.com", "servicemonitors")],
            synced_types: vec![json!({
                "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "patches": [{"path": "spec.selector", "labels": {}}]
            })],
            objects: vec![Object {
                resource: monitors,
                body: json!({
                    "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                    "metadata": {"name": "web", "namespace": ns},
                    "spec": {
                        // `release` is one of the keys vCluster translates on the host
                        "selector": {"matchLabels": {"app": "web", "release": "prod"},
                                     "matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend"]}]},
                        "endpoints": [{"port": "http", "interval": "30s"}]
                    }
                }),
                rewritten: vec![("/spec/selector", Expect::HostSelector)],
            }],
        },
    ]
}

fn rbac(kind: &str, plural: &str) -> ApiResource {
    resource("rbac.authorization.k8s.io", "v1", kind, plural)
}

/// The CRDs in both clusters, and the runtime's RBAC for the case's types beyond
/// [`world_with`]'s: written in the host namespace, read (and their status written) in the
/// virtual cluster.
async fn prepare(case: &Case, host_ns: &str) {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    install_crd_files(&host, &case.crds).await;
    install_crd_files(&virtual_, &case.crds).await;
    create_namespace(&host, host_ns).await;
    let name = format!("vcp-syncer-{}", case.name);
    let groups: Vec<&str> = case.resources.iter().map(|(g, _)| *g).collect();
    let plurals: Vec<&str> = case.resources.iter().map(|(_, r)| *r).collect();
    let statuses: Vec<String> = plurals.iter().map(|r| format!("{r}/status")).collect();
    apply_dynamic(
        &host,
        &rbac("Role", "roles"),
        Some(host_ns),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": host_ns},
            "rules": [{"apiGroups": groups, "resources": plurals,
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
        }),
    )
    .await;
    apply_dynamic(&host, &rbac("RoleBinding", "rolebindings"), Some(host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": host_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    }))
    .await;
    apply_dynamic(
        &virtual_,
        &rbac("ClusterRole", "clusterroles"),
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": groups, "resources": plurals, "verbs": ["get", "list", "watch"]},
                {"apiGroups": groups, "resources": statuses, "verbs": ["get", "patch", "update"]}
            ]
        }),
    )
    .await;
    apply_dynamic(&virtual_, &rbac("ClusterRoleBinding", "clusterrolebindings"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    }))
    .await;
}

/// The host spec vCluster's rules give the stored virtual object `stored` of `object`.
fn expected_spec(object: &Object, stored: &Value, vcluster: &str, host_ns: &str) -> Value {
    let ns = stored["metadata"]["namespace"].as_str().expect("namespace");
    let mut expected = stored.clone();
    for (pointer, expect) in &object.rewritten {
        let virtual_value = stored
            .pointer(pointer)
            .unwrap_or_else(|| panic!("{pointer} in {stored}"));
        let host_value = match expect {
            Expect::HostName => json!(vcluster_host_name(
                virtual_value.as_str().expect("a name"),
                ns,
                vcluster
            )),
            Expect::HostSelector => vcluster_host_label_selector(virtual_value, vcluster, host_ns)
                .unwrap_or(Value::Null),
        };
        *expected.pointer_mut(pointer).expect("pointer") = host_value;
    }
    expected["spec"].take()
}

async fn run_case(case: &Case, ns: &str) {
    let test = format!("crd-{}", case.name);
    let host_ns = format!("vc-{test}");
    prepare(case, &host_ns).await;
    let synced_types: Vec<Value> = case
        .synced_types
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t["selector"] = json!({"matchLabels": {"e2e": test}});
            t
        })
        .collect();
    let vcluster = format!("vc-{test}");
    let spec = json!({"vcluster": {"name": vcluster}, "syncedTypes": synced_types});
    let world = world_with(&test, &[ns], spec, PodSync::Hooks).await;
    for object in &case.objects {
        let mut body = object.body.clone();
        body["metadata"]["labels"] = json!({"e2e": test});
        let name = body["metadata"]["name"].as_str().expect("name").to_string();
        let virtual_api: Api<DynamicObject> =
            Api::namespaced_with(world.virtual_.clone(), ns, &object.resource);
        let obj: DynamicObject = serde_json::from_value(body).expect("object");
        // the CRD's discovery may lag behind its creation: retry until served
        let stored = wait_for(TIMEOUT, || {
            let (api, obj, name) = (virtual_api.clone(), obj.clone(), name.clone());
            async move {
                api.patch(
                    &name,
                    &PatchParams::apply("e2e-user").force(),
                    &Patch::Apply(&obj),
                )
                .await
                .ok()
            }
        })
        .await;
        let stored = serde_json::to_value(&stored).expect("JSON");
        let expected = expected_spec(object, &stored, &vcluster, &host_ns);
        let host_name = vcluster_host_name(&name, ns, &vcluster);
        let host_api: Api<DynamicObject> =
            Api::namespaced_with(world.host.clone(), &host_ns, &object.resource);
        let copy = wait_for(TIMEOUT, || {
            let (api, host_name) = (host_api.clone(), host_name.clone());
            async move { api.get_opt(&host_name).await.ok().flatten() }
        })
        .await;
        assert_eq!(
            copy.data["spec"], expected,
            "{}: the host copy {host_name} of {} {ns}/{name}",
            case.name, object.resource.kind
        );
        println!(
            "{}: {} {ns}/{name} -> {host_ns}/{host_name}, {} rewritten: {}",
            case.name,
            object.resource.kind,
            object.rewritten.len(),
            object
                .rewritten
                .iter()
                .map(|(p, _)| format!("{p} = {}", copy.data.pointer(p).unwrap_or(&Value::Null)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

#[tokio::test]
async fn references_and_selectors_of_real_crds_point_at_the_host_copies() {
    let ns = "real-crds";
    let cp = ControlPlane::shared();
    create_namespace(&cp.client(Cluster::Virtual, Identity::Admin).await, ns).await;
    for case in cases(ns) {
        run_case(&case, ns).await;
    }
}
