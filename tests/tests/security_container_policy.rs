//! The container policy, per-plugin judgement and the namespace's Pod Security level, end to
//! end on the real host API server (RBAC on, Pod Security admission on by default) with the
//! operator in-process under the `vcp-operator` identity (`config/rbac/role.yaml`).
//!
//! The holes: container fields were copied unchecked into the vCluster's pod, and
//! one plugin with an invalid container field made the API server refuse the whole workload
//! apply, so no other plugin installed and deletions hung on the finalizer.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};
use vcp_tests::{
    Audit, Identity, apply_yaml, condition, create_plugin, delete_plugin, vcluster_workload,
    wait_event, wait_for, wait_ready,
};

const TIMEOUT: Duration = Duration::from_secs(30);

async fn setup() -> Client {
    vcp_tests::start_shared_operator("vcp-test/runtime:container-policy").await
}

/// The namespace `ns` with the vCluster as its chart renders it (`my-vcluster`, container
/// `syncer`).
async fn vcluster(admin: &Client, ns: &str) -> Value {
    vcp_tests::create_namespace(admin, ns).await;
    apply_yaml(admin, &vcluster_workload(ns), Some(ns))
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

fn container_names(template: &Value) -> Vec<String> {
    template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

/// The `(reason, message)` of the plugin's `Ready` condition once it has `status` for its
/// current generation.
async fn ready_reason(admin: &Client, ns: &str, name: &str, status: &str) -> (String, String) {
    let p = wait_ready(admin, ns, name, status, None, TIMEOUT).await;
    let ready = condition(&p, "Ready").expect("Ready condition");
    (ready.reason.clone(), ready.message.clone())
}

/// How long an Event may take to appear after the status write it follows.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The operator's requests that write (or dry-run a write) in namespace `ns`:
/// `(verb, request URI)`, from the host API server's audit log once it holds every request
/// answered before the call.
async fn operator_writes(ns: &str) -> Vec<(String, String)> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(ns)
        .caught_up()
        .await
        .requests()
}

fn is_dry_run(uri: &str) -> bool {
    uri.contains("dryRun=All")
}

/// The response codes of the operator's dry-run Pod creates in `ns` (the Pod Security check),
/// once the audit log holds every request answered before the call.
async fn dry_run_pod_codes(ns: &str) -> Vec<u16> {
    Audit::writes()
        .by(Identity::Operator)
        .verb("create")
        .uri_contains(&format!("/api/v1/namespaces/{ns}/pods?"))
        .uri_contains("dryRun=All")
        .caught_up()
        .await
        .attempts()
        .into_iter()
        .map(|w| w.code)
        .collect()
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

/// Hole 1: a privileged v1 plugin with `envFrom` of a namespace Secret, a v2 plugin reading a
/// Secret by `envFrom` (the embedded runtime's `envFrom` is refused by the CRD),
/// and an embedded one mounting the vCluster's `data` volume are refused
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
            "image": "ghcr.io/example/plugin:1",
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
            "image": "ghcr.io/example/plugin:1",
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
        let (reason, got) = ready_reason(&admin, ns, name, "False").await;
        assert_eq!(reason, "PolicyDenied", "{name}: {got}");
        assert_eq!(got, message, "{name}");
        wait_event(&admin, ns, name, "PolicyDenied", EVENT_TIMEOUT).await;
    }

    let writes = operator_writes(ns).await;
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

/// Hole 7: three plugins with container fields only the API server judges (a negative user id,
/// requests above limits, `value` beside `valueFrom`) are each refused
/// with `InvalidWorkload` and the API server's message, while a good plugin beside them is
/// installed; deleting the good one completes while the bad ones exist; a converged state
/// with bad plugins costs no dry run.
#[tokio::test]
async fn a_bad_plugin_blocks_neither_the_install_nor_the_deletion_of_another() {
    let admin = setup().await;
    let ns = "cp-invalid";
    let original = vcluster(&admin, ns).await;

    let bad = [
        (
            "bad-user",
            json!({ "vcluster": { "name": "my-vcluster" },
                    "securityContext": { "runAsUser": -1 } }),
            "must be between 0 and 2147483647",
        ),
        (
            "bad-resources",
            json!({ "vcluster": { "name": "my-vcluster" },
                    "resources": { "requests": { "cpu": "2" }, "limits": { "cpu": "1" } } }),
            "must be less than or equal to cpu limit",
        ),
        (
            "bad-env",
            json!({ "vcluster": { "name": "my-vcluster" },
                    "env": [{ "name": "RUST_LOG", "value": "debug",
                              "valueFrom": { "configMapKeyRef": { "name": "settings", "key": "mode" } } }] }),
            "may not be specified when `value` is not empty",
        ),
    ];
    for (name, spec, _) in &bad {
        create_plugin(&admin, ns, name, spec.clone()).await;
    }
    create_plugin(
        &admin,
        ns,
        "good",
        json!({ "vcluster": { "name": "my-vcluster" } }),
    )
    .await;

    let (reason, message) = ready_reason(&admin, ns, "good", "True").await;
    assert_eq!(reason, "Installed", "{message}");
    for (name, _, api_message) in &bad {
        let (reason, message) = ready_reason(&admin, ns, name, "False").await;
        assert_eq!(reason, "InvalidWorkload", "{name}: {message}");
        assert!(
            message.starts_with(
                "the API server refuses StatefulSet cp-invalid/my-vcluster with this plugin's part: StatefulSet.apps \"my-vcluster\" is invalid: spec.template.spec."
            ),
            "{name}: {message}"
        );
        assert!(message.contains(api_message), "{name}: {message}");
        wait_event(&admin, ns, name, "InvalidWorkload", EVENT_TIMEOUT).await;
    }
    let installed = template(&admin, ns).await;
    assert_eq!(container_names(&installed), ["syncer", "good"]);

    // Converged with refused plugins: a change of the good plugin that does not change the
    // workload body (a new RBAC rule) is reconciled (new observedGeneration, Role written) and
    // costs no dry run.
    // Settled first: a reconcile of the poked good plugin finished after its install.
    vcp_tests::poke_plugin(&admin, ns, "good", TIMEOUT).await;
    let dry_runs = |w: &[(String, String)]| w.iter().filter(|(_, u)| is_dry_run(u)).count();
    let before = operator_writes(ns).await;
    assert!(dry_runs(&before) > 0, "the plugins were judged: {before:?}");
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "rbac": { "role": { "extraRules": [
                { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }
            ] } } } })),
        )
        .await
        .expect("change good");
    wait_for(TIMEOUT, || {
        let admin = admin.clone();
        async move {
            let p = Api::<VClusterPlugin>::namespaced(admin, ns)
                .get("good")
                .await
                .ok()?;
            (p.status?.observed_generation == Some(2)).then_some(())
        }
    })
    .await;
    // The reconciles that follow the status write have finished too: one of the poked plugin.
    let reconciles = vcp_tests::poke_plugin(&admin, ns, "good", TIMEOUT).await;
    let after = operator_writes(ns).await;
    println!(
        "converged with refused plugins: good reconciled {reconciles} times; operator dry runs \
         in {ns}: {} before the change, {} after",
        dry_runs(&before),
        dry_runs(&after)
    );
    assert!(
        after[before.len()..]
            .iter()
            .any(|(_, uri)| uri.contains("/roles/vcp-plugin-good")),
        "the change was reconciled: {:?}",
        &after[before.len()..]
    );
    assert_eq!(
        dry_runs(&after),
        dry_runs(&before),
        "no dry run for an unchanged body: {:?}",
        &after[before.len()..]
    );
    // The Pods built from the chart's template for the Pod Security check passed the API
    // server's validation (a Pod it refused for another reason would leave the level unjudged).
    let pod_checks = dry_run_pod_codes(ns).await;
    assert!(!pod_checks.is_empty(), "the plugins' Pods were judged");
    assert!(pod_checks.iter().all(|c| *c == 201), "{pod_checks:?}");

    // Deleting the good plugin completes while the bad ones exist.
    delete_plugin(&admin, ns, "good", TIMEOUT).await;
    assert_eq!(container_names(&template(&admin, ns).await), ["syncer"]);
    for (name, _, _) in &bad {
        delete_plugin(&admin, ns, name, TIMEOUT).await;
    }
    let after = sts(&admin, ns).await;
    assert_eq!(
        serde_json::to_value(&after.spec.unwrap().template).unwrap(),
        original
    );
    assert!(
        !after
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|m| m.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER)),
        "the operator owns nothing any more"
    );
}

/// A namespace enforcing `restricted`: a plugin whose container lacks
/// `allowPrivilegeEscalation: false` and `capabilities.drop: [ALL]` is refused with
/// `PolicyDenied` naming the level and the API server's reason, before the workload is written;
/// one that meets the level is installed.
#[tokio::test]
async fn the_namespaces_pod_security_level_is_respected() {
    let admin = setup().await;
    let ns = "cp-restricted";
    apply_yaml(
        &admin,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels: {{ pod-security.kubernetes.io/enforce: restricted }}\n"
        ),
        None,
    )
    .await
    .expect("namespace");
    apply_yaml(
        &admin,
        &vcp_tests::vcluster_workload_with(ns, vcp_tests::RESTRICTED_VALUES),
        Some(ns),
    )
    .await
    .expect("vCluster");
    let original = template(&admin, ns).await;

    create_plugin(
        &admin,
        ns,
        "loose",
        json!({ "vcluster": { "name": "my-vcluster" } }),
    )
    .await;
    let (reason, message) = ready_reason(&admin, ns, "loose", "False").await;
    assert_eq!(reason, "PolicyDenied", "{message}");
    assert!(
        message.starts_with(
            "with this plugin's container the vCluster's pods would violate the Pod Security level \"restricted:latest\" enforced in namespace cp-restricted (label pod-security.kubernetes.io/enforce); the API server's reason: "
        ),
        "{message}"
    );
    for part in [
        "allowPrivilegeEscalation != false (container \"loose\"",
        "unrestricted capabilities (container \"loose\"",
    ] {
        assert!(message.contains(part), "{part} in {message}");
    }
    wait_event(&admin, ns, "loose", "PolicyDenied", EVENT_TIMEOUT).await;
    let writes = operator_writes(ns).await;
    assert!(
        writes
            .iter()
            .any(|(v, uri)| v == "create" && uri.contains("/pods?") && is_dry_run(uri)),
        "the API server judged a Pod (dry run): {writes:?}"
    );
    assert_eq!(workload_or_rbac_writes(&writes), Vec::new());
    assert_eq!(template(&admin, ns).await, original);

    create_plugin(
        &admin,
        ns,
        "tight",
        json!({
            "vcluster": { "name": "my-vcluster" },
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": { "drop": ["ALL"] },
                "runAsNonRoot": true,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
        }),
    )
    .await;
    let (reason, message) = ready_reason(&admin, ns, "tight", "True").await;
    assert_eq!(reason, "Installed", "{message}");
    assert_eq!(
        container_names(&template(&admin, ns).await),
        ["syncer", "tight"]
    );
    // The Pods built from the template passed the API server's validation: one was admitted
    // (with `tight`), one refused by Pod Security admission (with `loose`).
    let pod_checks = dry_run_pod_codes(ns).await;
    assert!(pod_checks.contains(&201), "{pod_checks:?}");
    assert!(pod_checks.contains(&403), "{pod_checks:?}");
    // `loose` stays refused.
    let (reason, _) = ready_reason(&admin, ns, "loose", "False").await;
    assert_eq!(reason, "PolicyDenied");
    let names: Vec<String> = Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["loose", "tight"]);
}
