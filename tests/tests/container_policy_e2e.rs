//! The container policy, per-plugin judgement and the namespace's Pod Security level, end to
//! end on the real host API server (RBAC on, Pod Security admission on by default) with the
//! operator in-process under the `vcp-operator` identity (`config/rbac/role.yaml`).
//!
//! Issue 9, holes 1 and 7: container fields were copied unchecked into the vCluster's pod, and
//! one plugin with an invalid container field made the API server refuse the whole workload
//! apply, so no other plugin installed and deletions hung on the finalizer.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, VCLUSTER_WORKLOAD, apply_yaml, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);

async fn setup() -> Client {
    vcp_tests::start_shared_operator("vcp-test/runtime:container-policy").await
}

/// The namespace `ns` with the shared vCluster fixture (`my-vcluster`, container `syncer`).
async fn vcluster(admin: &Client, ns: &str) -> Value {
    vcp_tests::create_namespace(admin, ns).await;
    apply_yaml(admin, VCLUSTER_WORKLOAD, Some(ns))
        .await
        .expect("vCluster fixture");
    template(admin, ns).await
}

async fn sts(admin: &Client, ns: &str) -> StatefulSet {
    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .expect("get StatefulSet")
}

async fn template(admin: &Client, ns: &str) -> Value {
    serde_json::to_value(&sts(admin, ns).await.spec.unwrap().template).unwrap()
}

async fn create_plugin(admin: &Client, ns: &str, name: &str, spec: Value) {
    let p: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": name, "namespace": ns },
        "spec": spec,
    }))
    .expect("plugin");
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("create VClusterPlugin {name}: {e}"));
}

/// Waits until the plugin's `Ready` condition has `status` for its current generation;
/// returns `(reason, message)`.
async fn wait_ready(admin: &Client, ns: &str, name: &str, status: &str) -> (String, String) {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    wait_for(TIMEOUT, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let s = p.status.as_ref()?;
            let ready = s.conditions.iter().find(|c| c.type_ == "Ready")?;
            (ready.status == status && s.observed_generation == p.metadata.generation)
                .then(|| (ready.reason.clone(), ready.message.clone()))
        }
    })
    .await
}

/// Waits for an Event with `reason` on the plugin `name`.
async fn wait_event(admin: &Client, ns: &str, name: &str, reason: &str) {
    let events = Api::<Event>::namespaced(admin.clone(), ns);
    wait_for(Duration::from_secs(10), || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .any(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.reason.as_deref() == Some(reason)
                })
                .then_some(())
        }
    })
    .await;
}

/// The operator's requests that write (or dry-run a write) in namespace `ns`:
/// `(verb, request URI)`, from the host API server's audit log.
fn operator_writes(ns: &str) -> Vec<(String, String)> {
    vcp_tests::audited_writes(
        ControlPlane::shared(),
        Cluster::Host,
        Identity::Operator.user(),
    )
    .expect("audit log")
    .into_iter()
    .filter(|(_, uri)| uri.contains(&format!("/namespaces/{ns}/")))
    .collect()
}

fn is_dry_run(uri: &str) -> bool {
    uri.contains("dryRun=All")
}

/// Writes to the StatefulSet (real ones; dry runs apart) and to Roles / RoleBindings.
fn workload_or_rbac_writes(writes: &[(String, String)]) -> Vec<(String, String)> {
    writes
        .iter()
        .filter(|(_, uri)| {
            (uri.contains("/statefulsets") && !is_dry_run(uri))
                || uri.contains("/roles")
                || uri.contains("/rolebindings")
        })
        .cloned()
        .collect()
}

/// Hole 1: a privileged v1 plugin with `envFrom` of a namespace Secret, an embedded plugin
/// reading a Secret by `envFrom`, and one mounting the vCluster's `data` volume are refused
/// with `PolicyDenied` naming the field and the policy key; the operator wrote their status
/// (it looked) and nothing to the workload or RBAC, not even a dry run.
#[tokio::test]
async fn dangerous_container_fields_are_policy_denied_with_zero_workload_writes() {
    let admin = setup().await;
    let ns = "cp-denied";
    let original = vcluster(&admin, ns).await;

    create_plugin(
        &admin,
        ns,
        "privileged",
        json!({
            "vcluster": { "name": "my-vcluster" },
            "image": "ghcr.io/example/plugin:1", "version": "v1",
            "securityContext": { "privileged": true },
            "envFrom": [{ "secretRef": { "name": "vc-my-vcluster" } }],
        }),
    )
    .await;
    create_plugin(
        &admin,
        ns,
        "secret-reader",
        json!({
            "vcluster": { "name": "my-vcluster" },
            "envFrom": [{ "secretRef": { "name": "vc-my-vcluster" } }],
        }),
    )
    .await;
    create_plugin(
        &admin,
        ns,
        "data-mounter",
        json!({
            "vcluster": { "name": "my-vcluster" },
            "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
        }),
    )
    .await;

    // Expected messages: README's container policy table (field path, value, policy key).
    let expected = [
        (
            "privileged",
            "spec.securityContext.privileged = true is refused by the operator policy: a privileged container has full access to the node (policy containers.allowPrivileged: false)",
        ),
        (
            "secret-reader",
            "spec.envFrom[0].secretRef = {name: \"vc-my-vcluster\"} is refused by the operator policy: a reference to Secret \"vc-my-vcluster\" (policy containers.allowSecretReferences: false, containers.allowedSecrets: [])",
        ),
        (
            "data-mounter",
            "spec.volumeMounts[0].name = \"data\" is refused by the operator policy: a mount of the vCluster's volume \"data\", which vcluster-plugin-operator did not add (policy containers.allowedVolumes: [])",
        ),
    ];
    for (name, message) in expected {
        let (reason, got) = wait_ready(&admin, ns, name, "False").await;
        assert_eq!(reason, "PolicyDenied", "{name}: {got}");
        assert_eq!(got, message, "{name}");
        wait_event(&admin, ns, name, "PolicyDenied").await;
    }

    let writes = operator_writes(ns);
    for (name, _) in expected {
        assert!(
            writes
                .iter()
                .any(|(_, uri)| uri.contains(&format!("/vclusterplugins/{name}/status"))),
            "the operator wrote the status of {name} (it looked): {writes:?}"
        );
    }
    assert_eq!(
        writes
            .iter()
            .filter(|(_, uri)| uri.contains("/statefulsets") || uri.contains("/pods"))
            .collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "no write and no dry run of the workload for a plugin the policy refuses"
    );
    assert_eq!(workload_or_rbac_writes(&writes), Vec::new());
    assert_eq!(template(&admin, ns).await, original);
}
