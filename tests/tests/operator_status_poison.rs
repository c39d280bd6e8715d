//! One tenant's unreadable plugin must not stop the operator for the others.
//!
//! Two tenants, each with a vCluster (namespaces `poison-a`, `poison-b`). Tenant A's plugin
//! gets a condition whose `lastTransitionTime` (`2024-01-01T10:00:00Zt`) the API server's
//! `date-time` check accepts and k8s-openapi's `Time` cannot parse; before the fix every typed
//! list of VClusterPlugins failed from then on. First the way the attacker took: a write as
//! A's vCluster ServiceAccount `vc-my-vcluster` (impersonated by `tenant-edit`, whom `edit`
//! lets impersonate it), which the status-writers admission policy now refuses; then the same
//! poison written as an admin (the state stored before the policy). With the operator running,
//! and again with an operator started on the poisoned state: tenant B's new plugin gets its
//! finalizer and `Ready=True`, B's deleted plugin is cleaned up (its container leaves the
//! StatefulSet, its finalizer is removed), a poisoned plugin of A is deleted cleanly too; the
//! counter `vcp_operator_undecodable_objects_total` moved and the log names the object.
//! Removing the poison heals with no restart (the runtime's `RuntimeHealthy` reads again). A
//! plugin whose spec cannot be read (a `config` 140 levels deep, stored while the nesting
//! policy was not installed) gets `Ready=False` with reason `Undecodable` naming the field and a
//! Warning Event, and nothing is installed for it.
//!
//! One test, so this binary's control plane and its single operator replica at a time are its
//! own.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::replica::{Replica, prepare_host};
use vcp_tests::{Cluster, ControlPlane, Identity, poll_for, wait_for};

const A: &str = "poison-a";
const B: &str = "poison-b";
const TIMEOUT: Duration = Duration::from_secs(40);
/// The value an attack found: accepted by the API server's `date-time` format check.
const BAD_TIME: &str = "2024-01-01T10:00:00Zt";

fn plugins_resource() -> ApiResource {
    ApiResource {
        group: "vcp.dev".into(),
        version: "v1alpha1".into(),
        api_version: "vcp.dev/v1alpha1".into(),
        kind: "VClusterPlugin".into(),
        plural: "vclusterplugins".into(),
    }
}

/// The plugins of `ns` read untyped (a poisoned one does not decode as `VClusterPlugin`).
fn raw(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &plugins_resource())
}

/// A v1 image plugin: the operator adds a sidecar named after it (plugins of one vCluster
/// syncing the same type would refuse each other as `Conflict`, so none syncs one).
async fn create(admin: &Client, ns: &str, name: &str) {
    vcp_tests::create_plugin(
        admin,
        ns,
        name,
        json!({
            "vcluster": { "name": "my-vcluster" },
            "image": format!("example.com/{name}:1"),
            "version": "v1",
        }),
    )
    .await;
}

/// The container names of `ns`'s vCluster StatefulSet.
async fn containers(admin: &Client, ns: &str) -> Vec<String> {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .expect("get the StatefulSet");
    sts.spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

/// The `Ready` condition (status, reason, message) and finalizers of the plugin, read from its
/// raw text member by member (neither a poisoned status nor a spec deeper than serde_json's
/// recursion limit then stops the read).
async fn ready(
    admin: &Client,
    ns: &str,
    name: &str,
) -> Option<(String, String, String, Vec<String>)> {
    let request = http::Request::get(format!(
        "/apis/vcp.dev/v1alpha1/namespaces/{ns}/vclusterplugins/{name}"
    ))
    .body(Vec::new())
    .unwrap();
    let text = admin.request_text(request).await.ok()?;
    let members: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(&text).ok()?;
    let status: Value = serde_json::from_str(members.get("status")?.get()).ok()?;
    let metadata: Value = serde_json::from_str(members.get("metadata")?.get()).ok()?;
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    let finalizers = metadata["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Some((s("status"), s("reason"), s("message"), finalizers))
}

/// Waits until the plugin has `Ready` `status` (and `reason`) and the finalizer.
async fn wait_ready_with_finalizer(
    admin: &Client,
    ns: &str,
    name: &str,
    status: &str,
    reason: &str,
) {
    poll_for(TIMEOUT, || async {
        let (s, r, _, f) = ready(admin, ns, name).await?;
        (s == status && r == reason && f.iter().any(|f| f == vcp_crds::FINALIZER)).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!("{ns}/{name}: Ready={status} ({reason}) with the finalizer not reached within {TIMEOUT:?}")
    });
}

/// Deletes the plugin and waits until it is gone and its container left the StatefulSet.
async fn delete_and_wait_clean(admin: &Client, ns: &str, name: &str) {
    raw(admin, ns)
        .delete(name, &Default::default())
        .await
        .expect("delete the plugin");
    poll_for(TIMEOUT, || async {
        let gone = raw(admin, ns).get_opt(name).await.ok()?.is_none();
        (gone && !containers(admin, ns).await.iter().any(|c| c == name)).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!("{ns}/{name}: not removed with its container within {TIMEOUT:?} (finalizer cleanup did not run)")
    });
}

/// The condition patch of the attack, of `type_` with `time`.
fn condition_patch(type_: &str, time: &str) -> Patch<Value> {
    Patch::Json(
        serde_json::from_value(
            json!([{ "op": "add", "path": "/status/conditions/-", "value": {
                "type": type_, "status": "True", "reason": "X", "message": "x",
                "lastTransitionTime": time,
            }}]),
        )
        .unwrap(),
    )
}

/// Tenant A's vCluster ServiceAccount, impersonated by `tenant-edit`.
async fn as_vcluster_account() -> Client {
    let mut config = ControlPlane::shared()
        .config(Cluster::Host, Identity::TenantEdit)
        .await
        .expect("tenant-edit kubeconfig");
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{A}:vc-my-vcluster"));
    Client::try_from(config).expect("impersonating client")
}

/// Poisons the plugin `name` of tenant A as an admin (the state stored before the policy).
async fn poison(admin: &Client, name: &str) {
    raw(admin, A)
        .patch_status(
            name,
            &PatchParams::default(),
            &condition_patch("Evil", BAD_TIME),
        )
        .await
        .unwrap_or_else(|e| panic!("poison {A}/{name} as admin: {e}"));
    let typed = Api::<VClusterPlugin>::namespaced(admin.clone(), A)
        .get(name)
        .await;
    assert!(
        matches!(&typed, Err(kube::Error::SerdeError(_))),
        "the poisoned plugin no longer decodes as VClusterPlugin: {typed:?}"
    );
}

/// `vcp_operator_undecodable_objects_total{kind="VClusterPlugin",part}` on the replica's
/// `/metrics` (0 when absent).
async fn undecodable(replica: &Replica, part: &str) -> f64 {
    let (_, body) = replica.get("/metrics").await;
    vcp_tests::metric(
        &body,
        &format!(
            "vcp_operator_undecodable_objects_total{{kind=\"VClusterPlugin\",part=\"{part}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// Whether a captured warning names `ns/name` and contains `fragment`.
fn logged(ns: &str, name: &str, fragment: &str) -> bool {
    vcp_tests::logs::warnings().lock().unwrap().iter().any(|w| {
        w.contains(&format!("namespace=\"{ns}\""))
            && w.contains(&format!("name=\"{name}\""))
            && w.contains(fragment)
    })
}

/// The status-writers policy of `config/admission`, bound to the tests' operator user, and
/// nothing else of that folder (the nesting bound would refuse the deep plugin of this test).
async fn install_status_policy(admin: &Client) {
    let yaml = std::fs::read_to_string(
        vcp_tests::repo_root().join("config/admission/status-writers.yaml"),
    )
    .expect("read status-writers.yaml")
    .replace(
        "system:serviceaccount:vcp-system:vcluster-plugin-operator",
        "vcp-operator",
    );
    vcp_tests::apply_yaml(admin, &yaml, None)
        .await
        .expect("apply the status policy");
}

#[tokio::test]
async fn one_tenants_unreadable_plugin_stops_nothing_else() {
    let _ = vcp_tests::logs::warnings();
    let admin = prepare_host().await;
    install_status_policy(&admin).await;
    for ns in [A, B] {
        vcp_tests::create_namespace(&admin, ns).await;
        vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(ns), Some(ns))
            .await
            .expect("the vCluster as its chart renders it");
    }
    vcp_tests::bind_tenant_rights(&admin, A).await;
    // What the operator grants the runtime of an embedded plugin (operator/src/rbac/rules.rs:
    // `patch` on `vclusterplugins/status`), here for every plugin of A's namespace.
    vcp_tests::apply_yaml(
        &admin,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: runtime-status, namespace: {A} }}
rules:
  - {{ apiGroups: [vcp.dev], resources: [vclusterplugins/status], verbs: [get, patch, update] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: runtime-status, namespace: {A} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: runtime-status }}
subjects:
  - {{ kind: ServiceAccount, name: vc-my-vcluster, namespace: {A} }}
"#
        ),
        Some(A),
    )
    .await
    .expect("the runtime's status grant");
    let first = Replica::start("poison-first", None).await;
    for (ns, name) in [
        (A, "a-poisoned"),
        (A, "a-leaving"),
        (B, "b-old"),
        (B, "b-doomed"),
    ] {
        create(&admin, ns, name).await;
    }
    for (ns, name) in [
        (A, "a-poisoned"),
        (A, "a-leaving"),
        (B, "b-old"),
        (B, "b-doomed"),
    ] {
        wait_ready_with_finalizer(&admin, ns, name, "True", "Installed").await;
    }

    // The attacker's way: refused now (the policy), whatever the time's spelling.
    let vc = as_vcluster_account().await;
    for (type_, time, fragment) in [
        (
            "Evil",
            BAD_TIME,
            "may write only the RuntimeHealthy condition",
        ),
        (
            "Evil",
            "2024-01-01T10:00:00Z",
            "may write only the RuntimeHealthy condition",
        ),
        ("RuntimeHealthy", BAD_TIME, "must be an RFC 3339 time"),
    ] {
        let refused = raw(&vc, A)
            .patch_status(
                "a-poisoned",
                &PatchParams::default(),
                &condition_patch(type_, time),
            )
            .await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(e)) if e.message.contains(fragment) && e.message.contains("vcp-plugin-status-writers")),
            "{type_} at {time} as the vCluster's ServiceAccount: {refused:?}"
        );
    }
    // The same poison stored by an admin (as before the policy): the running operator.
    let seen = undecodable(&first, "status").await;
    poison(&admin, "a-poisoned").await;
    poison(&admin, "a-leaving").await;
    create(&admin, B, "b-new").await;
    wait_ready_with_finalizer(&admin, B, "b-new", "True", "Installed").await;
    delete_and_wait_clean(&admin, B, "b-old").await;
    assert!(
        undecodable(&first, "status").await > seen,
        "the counter moved"
    );
    assert!(
        logged(A, "a-poisoned", "lastTransitionTime"),
        "the log names the object"
    );
    // The poisoned plugin itself is still installed and its status is not rewritten on every
    // echo of the operator's own write (its resourceVersion settles).
    assert!(
        containers(&admin, A)
            .await
            .contains(&"a-poisoned".to_string())
    );
    let rv = |p: Option<DynamicObject>| p.and_then(|p| p.resource_version());
    let before = rv(raw(&admin, A).get_opt("a-poisoned").await.unwrap());
    // The operator looks in the window: a change of A's StatefulSet (an annotation only, nothing
    // the operator owns) reconciles the plugins of that vCluster, a-poisoned among them.
    let reconciled = first.reconciles();
    Api::<StatefulSet>::namespaced(admin.clone(), A)
        .patch(
            "my-vcluster",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/poke": "1"}}})),
        )
        .await
        .expect("annotate A's StatefulSet");
    first.wait_reconciles(reconciled + 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        before,
        rv(raw(&admin, A).get_opt("a-poisoned").await.unwrap()),
        "no write loop"
    );

    // An operator started on the poisoned state.
    first.stop().await;
    create(&admin, B, "b-later").await;
    let second = Replica::start("poison-second", None).await;
    wait_ready_with_finalizer(&admin, B, "b-later", "True", "Installed").await;
    delete_and_wait_clean(&admin, B, "b-doomed").await;
    delete_and_wait_clean(&admin, A, "a-leaving").await;
    assert!(
        undecodable(&second, "status").await > 0.0,
        "the counter of the new operator moved"
    );

    // Removing the poison heals with no restart: the runtime's report reads again.
    let p = raw(&admin, A).get("a-poisoned").await.unwrap();
    let evil = p.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["type"] == "Evil")
        .expect("the poison");
    raw(&admin, A)
        .patch_status(
            "a-poisoned",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{ "op": "remove", "path": format!("/status/conditions/{evil}") }]),
                )
                .unwrap(),
            ),
        )
        .await
        .expect("remove the poison");
    let generation = p.metadata.generation.unwrap();
    raw(&vc, A)
        .patch_status(
            "a-poisoned",
            &PatchParams::apply("vcp-test-runtime").force(),
            &Patch::Apply(json!({
                "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
                "status": { "conditions": [{
                    "type": "RuntimeHealthy", "status": "False", "reason": "TypeUnavailable",
                    "message": "healed", "observedGeneration": generation,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }]},
            })),
        )
        .await
        .expect("the runtime's own condition, as the vCluster's ServiceAccount");
    wait_ready_with_finalizer(&admin, A, "a-poisoned", "False", "TypeUnavailable").await;

    // A plugin whose spec cannot be read: refused alone, named, nothing installed for it.
    let mut deep = json!(1);
    for _ in 0..140 {
        deep = json!([deep]);
    }
    let created = raw(&admin, A)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
                "metadata": { "name": "a-deep", "namespace": A },
                "spec": { "vcluster": { "name": "my-vcluster" }, "image": "example.com/deep:1",
                          "version": "v1", "config": { "values": deep } },
            }))
            .unwrap(),
        )
        .await;
    // The answer is as deep as the object: the client cannot read it, but it was stored.
    assert!(
        matches!(created, Ok(_) | Err(kube::Error::SerdeError(_))),
        "store the deep plugin (no nesting policy in this binary): {created:?}"
    );
    let (_, _, message, _) = poll_for(TIMEOUT, || async {
        ready(&admin, A, "a-deep")
            .await
            .filter(|(s, r, _, _)| s == "False" && r == "Undecodable")
    })
    .await
    .expect("Ready=False Undecodable on the deep plugin");
    assert!(message.contains("spec.config"), "{message}");
    let event = vcp_tests::wait_event(&admin, A, "a-deep", "Undecodable", TIMEOUT).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(!containers(&admin, A).await.contains(&"a-deep".to_string()));
    assert!(undecodable(&second, "object").await > 0.0);
    assert!(
        logged(A, "a-deep", "recursion limit"),
        "the log names the deep plugin"
    );
    // and the other plugins still go on
    create(&admin, B, "b-last").await;
    wait_ready_with_finalizer(&admin, B, "b-last", "True", "Installed").await;
    wait_for(TIMEOUT, || async {
        containers(&admin, B)
            .await
            .contains(&"b-last".to_string())
            .then_some(())
    })
    .await;
    second.stop().await;
}
