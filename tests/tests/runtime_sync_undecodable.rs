//! One virtual object that the runtime cannot decode stops only itself, on the real host and
//! virtual API servers (RBAC on), the runtime in-process as `vcp-syncer`.
//!
//! A test CRD `Blob` (`e2e.vcp.test/v1`) has a free-form `spec`
//! (`x-kubernetes-preserve-unknown-fields`, as HelmRelease `values` and many others), so the
//! API server stores an object nested 140 levels deep, beyond serde_json's recursion limit of
//! 128. Before the fix, such an object's watch event was dropped live, and after a restart the
//! list of the whole type failed (`recursion limit exceeded`): the plugin went
//! `RuntimeHealthy=False TypeUnavailable` and no Blob of any namespace synced any more.
//!
//! Here: ordinary Blobs in three namespaces sync (create, update, delete) beside deep ones,
//! live and after a restart of the runtime; each deep one is skipped and named (a `Warning`
//! Event `Undecodable`, `RuntimeHealthy=False Undecodable` naming it, and the runtime's
//! `vcp_runtime_undecodable_objects_total` on its `/metrics`, scraped over HTTP: exactly one
//! count per deep object the test stored (each is sent once by the API server, on its create or
//! its one change, or once by the list of a restarted runtime), none for the reconciles and
//! resyncs that find it still undecodable, none for its delete); a synced Blob made deep keeps
//! its host copy (it is not "missing"); made shallow again, it syncs with no restart.

use std::net::SocketAddr;
use std::time::Duration;

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde_json::{Value, json};
use vcp_crds::tolerant::Tolerant;
use vcp_crds::{Reason, VClusterPlugin};
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{TIMEOUT, apply_dynamic as apply, start_runtime, world_with};
use vcp_tests::{Cluster, ControlPlane, Identity, http_get, metric, poll_event_where, wait_for};

const TEST: &str = "undecodable";
const VCLUSTER: &str = "vc-undecodable";
const NS_A: &str = "undecodable-a";
const NS_B: &str = "undecodable-b";
const NS_C: &str = "undecodable-c";
/// Deeper than serde_json's recursion limit (128) with the object's own levels.
const DEEP: usize = 140;

fn blobs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Blob"),
        "blobs",
    )
}

/// The `Blob` CRD: namespaced, a free-form `spec`.
fn blob_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "blobs.e2e.vcp.test"},
        "spec": {"group": "e2e.vcp.test", "scope": "Namespaced",
            "names": {"plural": "blobs", "singular": "blob", "kind": "Blob"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

/// The line of the runtime's counter of skipped virtual Blobs.
const SKIPPED_BLOBS: &str = r#"vcp_runtime_undecodable_objects_total{api_version="e2e.vcp.test/v1",kind="Blob",side="virtual"}"#;

/// The runtime's `/metrics` at `addr` (it answers `200`).
async fn scrape(addr: SocketAddr) -> String {
    let (code, body) = http_get(addr, "/metrics")
        .await
        .unwrap_or_else(|| panic!("the runtime serves /metrics on {addr}"));
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of `line` on the runtime's `/metrics` at `addr` (0 when the line is absent: a
/// counter has no line before its first count).
async fn counted(addr: SocketAddr, line: &str) -> u64 {
    metric(&scrape(addr).await, line).map_or(0, |v| v as u64)
}

/// `{"a": {"a": ... "leaf" ...}}`, `depth` objects deep.
fn nested(depth: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..depth {
        v = json!({ "a": v });
    }
    v
}

/// The CRD in both clusters, and `vcp-syncer`'s grants on Blobs (host: written; virtual: read).
async fn prepare(host_ns: &str) {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    let crds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    apply(&host, &crds, None, blob_crd()).await;
    apply(&virtual_, &crds, None, blob_crd()).await;
    vcp_tests::create_namespace(&host, host_ns).await;
    let rbac = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        )
    };
    apply(&host, &rbac("Role", "roles"), Some(host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "vcp-syncer-blobs", "namespace": host_ns},
        "rules": [{"apiGroups": ["e2e.vcp.test"], "resources": ["blobs"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    })).await;
    apply(&host, &rbac("RoleBinding", "rolebindings"), Some(host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "vcp-syncer-blobs", "namespace": host_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-syncer-blobs"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
    apply(&virtual_, &rbac("ClusterRole", "clusterroles"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "vcp-e2e-syncer-blobs"},
        "rules": [{"apiGroups": ["e2e.vcp.test"], "resources": ["blobs"], "verbs": ["get", "list", "watch"]}]
    })).await;
    apply(&virtual_, &rbac("ClusterRoleBinding", "clusterrolebindings"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "vcp-e2e-syncer-blobs"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp-e2e-syncer-blobs"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
}

/// `<name>-x-<ns>-x-vc-undecodable`, written out (vCluster's host name of a short name).
fn host_name(name: &str, ns: &str) -> String {
    format!("{name}-x-{ns}-x-{VCLUSTER}")
}

/// Puts the virtual Blob `ns/name` with `spec`, read back tolerantly (a deep object's response
/// does not decode as a `DynamicObject`); retried while the CRD's discovery lags.
async fn put(client: &kube::Client, ns: &str, name: &str, spec: Value) {
    let api = Api::<Tolerant<DynamicObject>>::namespaced_with(client.clone(), ns, &blobs());
    let body = json!({
        "apiVersion": "e2e.vcp.test/v1", "kind": "Blob",
        "metadata": {"name": name, "namespace": ns, "labels": {"e2e": TEST}},
        "spec": spec
    });
    wait_for(TIMEOUT, || {
        let api = api.clone();
        let body = body.clone();
        async move {
            api.patch(
                name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&body),
            )
            .await
            .map_err(|e| println!("put {ns}/{name}: {e}"))
            .ok()
        }
    })
    .await;
}

/// The `RuntimeHealthy` condition's `(reason, message)` once `check` holds for it.
async fn runtime_healthy_where(
    plugins: &Api<VClusterPlugin>,
    check: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let check = &check;
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RuntimeHealthy")?;
            check(&c.reason, &c.message).then(|| (c.reason.clone(), c.message.clone()))
        }
    })
    .await
}

#[tokio::test]
async fn a_deep_virtual_object_is_skipped_and_named_and_the_others_sync() {
    let host_ns = format!("vc-{TEST}");
    prepare(&host_ns).await;
    let spec = json!({
        "vcluster": {"name": VCLUSTER},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Blob",
            "selector": {"matchLabels": {"e2e": TEST}}
        }]
    });
    let mut w = world_with(TEST, &[NS_A, NS_B, NS_C], spec, PodSync::Hooks).await;
    let v = w.virtual_.clone();
    let host_blobs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &blobs());
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &host_ns);
    let host_where = |name: String, check: Box<dyn Fn(&DynamicObject) -> bool>| {
        let api = host_blobs.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let name = name.clone();
                let check = &check;
                async move { api.get_opt(&name).await.ok().flatten().filter(|o| check(o)) }
            })
            .await
        }
    };
    let gone = |name: String| {
        let api = host_blobs.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let name = name.clone();
                async move { matches!(api.get_opt(&name).await, Ok(None)).then_some(()) }
            })
            .await
        }
    };
    let spec_is = |expected: Value| -> Box<dyn Fn(&DynamicObject) -> bool> {
        Box::new(move |o: &DynamicObject| o.data["spec"] == expected)
    };

    // 1. ordinary Blobs in three namespaces sync; `victim` is still shallow
    put(&v, NS_A, "a1", json!({"size": 1})).await;
    put(&v, NS_B, "b1", json!({"size": 2})).await;
    put(&v, NS_C, "victim", json!({"size": 3})).await;
    host_where(host_name("a1", NS_A), spec_is(json!({"size": 1}))).await;
    host_where(host_name("b1", NS_B), spec_is(json!({"size": 2}))).await;
    host_where(host_name("victim", NS_C), spec_is(json!({"size": 3}))).await;
    // the runtime served its counters before any deep object: nothing skipped yet
    let (code, _) = http_get(w.metrics, "/healthz")
        .await
        .expect("/healthz answers");
    assert_eq!(code, 200);
    assert_eq!(counted(w.metrics, SKIPPED_BLOBS).await, 0);
    let writes = r#"vcp_runtime_writes_total{api_version="e2e.vcp.test/v1",kind="Blob"}"#;
    assert!(
        counted(w.metrics, writes).await >= 3,
        "a create per synced Blob: {}",
        scrape(w.metrics).await
    );

    // 2. live: a deep Blob appears, and `victim` is made deep
    put(&v, NS_A, "deep", json!({"values": nested(DEEP)})).await;
    let victim_looked = w.reconciles.reconciles("Blob", &format!("{NS_C}/victim"));
    put(&v, NS_C, "victim", json!({"values": nested(DEEP)})).await;
    for object in [format!("{NS_A}/deep"), format!("{NS_C}/victim")] {
        let event = poll_event_where(&w.host, &host_ns, TIMEOUT, |e| {
            e.reason.as_deref() == Some(Reason::Undecodable.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains(&object))
        })
        .await
        .unwrap_or_else(|| panic!("a Warning Event Undecodable naming {object}"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let note = event.note.unwrap_or_default();
        assert!(note.contains("recursion limit exceeded"), "{note}");
        // the path of the first field that fails: its managedFields or its spec
        assert!(
            note.contains("f:spec.f:values.f:a.f:a") || note.contains("spec.values.a.a"),
            "the error's path: {note}"
        );
        println!("event: {note}");
    }
    let (_, message) = runtime_healthy_where(&plugins, |reason, message| {
        reason == "Undecodable" && message.starts_with("2 object(s) cannot be decoded")
    })
    .await;
    assert!(
        message.contains(&format!("virtual Blob {NS_A}/deep: "))
            && message.ends_with("recursion limit exceeded"),
        "{message}"
    );
    // the runtime looked at victim's key after it turned deep, and its host copy stays
    w.wait_reconciled("Blob", &format!("{NS_C}/victim"), victim_looked)
        .await;
    // the two deep Blobs stored, each skipped once (its reconciles count nothing)
    assert_eq!(
        counted(w.metrics, SKIPPED_BLOBS).await,
        2,
        "{}",
        scrape(w.metrics).await
    );
    assert_eq!(
        counted(w.metrics, &SKIPPED_BLOBS.replace("virtual", "host")).await,
        0,
        "no host Blob was deep"
    );
    // 3. the others sync meanwhile: update, create, delete
    put(&v, NS_A, "a1", json!({"size": 10})).await;
    put(&v, NS_B, "b2", json!({"size": 20})).await;
    vcp_tests::runtime::apply_dynamic(
        &v,
        &blobs(),
        Some(NS_C),
        json!({
            "apiVersion": "e2e.vcp.test/v1", "kind": "Blob",
            "metadata": {"name": "c1", "namespace": NS_C, "labels": {"e2e": TEST}},
            "spec": {"size": 30}
        }),
    )
    .await;
    Api::<DynamicObject>::namespaced_with(v.clone(), NS_B, &blobs())
        .delete("b1", &DeleteParams::default())
        .await
        .expect("delete b1");
    host_where(host_name("a1", NS_A), spec_is(json!({"size": 10}))).await;
    host_where(host_name("b2", NS_B), spec_is(json!({"size": 20}))).await;
    host_where(host_name("c1", NS_C), spec_is(json!({"size": 30}))).await;
    gone(host_name("b1", NS_B)).await;
    let victim_copy = host_blobs
        .get_opt(&host_name("victim", NS_C))
        .await
        .expect("read the victim's host copy")
        .expect("the host copy of a virtual object that turned undecodable is kept");
    assert_eq!(victim_copy.data["spec"], json!({"size": 3}));
    assert!(
        host_blobs
            .get_opt(&host_name("deep", NS_A))
            .await
            .expect("read")
            .is_none(),
        "nothing is created for an undecodable object"
    );
    // the others' syncing (and the reconciles it caused) skipped nothing more
    assert_eq!(counted(w.metrics, SKIPPED_BLOBS).await, 2);

    // 4. a restart on the poisoned state: the list does not fail
    w.runtime.abort();
    let _ = (&mut w.runtime).await;
    put(&v, NS_B, "b3", json!({"size": 40})).await;
    let cp = ControlPlane::shared();
    let restarted = start_runtime(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &host_ns,
        "car-plugin",
        |config| config.status_interval = Duration::from_millis(300),
    );
    w.runtime = restarted.task;
    w.reconciles = restarted.reconciles;
    w.metrics = restarted.metrics;
    host_where(host_name("b3", NS_B), spec_is(json!({"size": 40}))).await;
    put(&v, NS_A, "a1", json!({"size": 11})).await;
    host_where(host_name("a1", NS_A), spec_is(json!({"size": 11}))).await;
    // the restarted runtime looked at victim (its host copy's key, from the host list)
    w.wait_reconciled("Blob", &format!("{NS_C}/victim"), 0)
        .await;
    let (reason, message) = runtime_healthy_where(&plugins, |reason, _| reason != "Starting").await;
    assert_eq!(reason, "Undecodable", "{message}");
    assert!(
        message.starts_with("2 object(s) cannot be decoded"),
        "{message}"
    );
    assert_eq!(
        counted(w.metrics, SKIPPED_BLOBS).await,
        2,
        "the restarted runtime's list skipped both, once each"
    );
    let victim_copy = host_blobs
        .get_opt(&host_name("victim", NS_C))
        .await
        .expect("read")
        .expect("still kept after a restart");
    assert_eq!(victim_copy.data["spec"], json!({"size": 3}));

    // 5. removing the poison heals, with no restart: victim syncs, deep is deleted
    put(&v, NS_C, "victim", json!({"size": 4})).await;
    host_where(host_name("victim", NS_C), spec_is(json!({"size": 4}))).await;
    put(&v, NS_A, "deep", json!({"size": 5})).await;
    host_where(host_name("deep", NS_A), spec_is(json!({"size": 5}))).await;
    let (_, message) = runtime_healthy_where(&plugins, |reason, _| reason == "Syncing").await;
    println!("healed: {message}");
    // poisoned again, then deleted while undecodable: its host copy goes with it
    put(&v, NS_A, "deep", json!({"values": nested(DEEP)})).await;
    runtime_healthy_where(&plugins, |reason, _| reason == "Undecodable").await;
    assert_eq!(
        counted(w.metrics, SKIPPED_BLOBS).await,
        3,
        "poisoned again: one more skip"
    );
    Api::<Tolerant<DynamicObject>>::namespaced_with(v.clone(), NS_A, &blobs())
        .delete("deep", &DeleteParams::default())
        .await
        .expect("delete deep");
    gone(host_name("deep", NS_A)).await;
    runtime_healthy_where(&plugins, |reason, _| reason == "Syncing").await;
    assert_eq!(
        counted(w.metrics, SKIPPED_BLOBS).await,
        3,
        "its delete is not a skip"
    );
}
