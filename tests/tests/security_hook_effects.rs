//! End to end: what a plugin's `Pod` hooks do to the vCluster's pods is
//! judged by the namespace's Pod Security level, through a server-side dry run of a
//! representative pod of the vCluster with the hooks applied, on the real host API server (Pod
//! Security admission on) with the operator in-process as `vcp-operator`.
//!
//! The pod policy refuses every `baseline` power by itself (the attack corpus shows privileged,
//! hostPath, hostNetwork and AppArmor-annotation hooks refused); here the namespace enforces
//! `restricted`, and the hook takes the pod's seccomp profile away: no node power, nothing the
//! operator's own policy refuses, and only the API server's Pod Security admission judges it.
//! A hook that makes the pod invalid, which Pod Security admission then never sees, is refused
//! too; so is one that writes the pods' service account, even the account the vCluster's own
//! pod template has, or their tolerations, or two keys Go's decoder reads as one field.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use vcp_tests::{Audit, Identity, apply_yaml, condition, create_plugin, wait_event, wait_ready};

const TIMEOUT: Duration = Duration::from_secs(30);
const NS: &str = "hooks-restricted";

async fn template(admin: &Client) -> Value {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS)
        .get("my-vcluster")
        .await
        .expect("get StatefulSet");
    serde_json::to_value(&sts.spec.unwrap().template).unwrap()
}

/// The operator's writes (dry runs included) in [`NS`] from the audit log:
/// `(verb, request URI, response code)`, once the audit log holds every request answered
/// before the call.
async fn operator_writes() -> Vec<(String, String, u16)> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(NS)
        .caught_up()
        .await
        .attempts()
        .into_iter()
        .map(|w| (w.verb, w.uri, w.code))
        .collect()
}

/// Whether `writes` ([`operator_writes`]) hold a dry-run create of a Pod in [`NS`] that the API
/// server answered with `code`.
fn pod_dry_run_answered(writes: &[(String, String, u16)], code: u16) -> bool {
    writes.iter().any(|(verb, uri, c)| {
        verb == "create"
            && uri.starts_with(&format!("/api/v1/namespaces/{NS}/pods?"))
            && uri.contains("dryRun=All")
            && *c == code
    })
}

/// A plugin of one `Pod` hook (`hook`: its actions), whose embedded runtime container meets
/// `restricted`.
fn pod_hook(name: &str, hook: Value) -> Value {
    let mut h = json!({
        "name": name, "apiVersion": "v1", "kind": "Pod", "events": ["CreatePhysical"],
    });
    for (k, v) in hook.as_object().expect("actions") {
        h[k] = v.clone();
    }
    json!({
        "vcluster": { "name": "my-vcluster" },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"] },
            "runAsNonRoot": true,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "hooks": [h],
    })
}

/// Creates plugin `name` of one `Pod` hook ([`pod_hook`]: `hook`, with `actions`) in [`NS`],
/// waits for its `Ready=False`, and asserts the reason `PolicyDenied` and a message that starts
/// with `prefix`; returns the message.
async fn create_refused(
    admin: &Client,
    name: &str,
    hook: &str,
    actions: Value,
    prefix: &str,
) -> String {
    create_plugin(admin, NS, name, pod_hook(hook, actions)).await;
    let p = wait_ready(admin, NS, name, "False", None, TIMEOUT).await;
    let ready = condition(&p, "Ready").unwrap();
    assert_eq!(ready.reason, "PolicyDenied", "{}", ready.message);
    assert!(ready.message.starts_with(prefix), "{}", ready.message);
    ready.message.clone()
}

#[tokio::test]
async fn a_hook_that_breaks_the_namespaces_pod_security_level_is_refused() {
    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:hook-effects").await;
    apply_yaml(
        &admin,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n  labels: {{ pod-security.kubernetes.io/enforce: restricted }}\n"
        ),
        None,
    )
    .await
    .expect("namespace");
    apply_yaml(
        &admin,
        &vcp_tests::vcluster_workload_with(NS, vcp_tests::RESTRICTED_VALUES),
        Some(NS),
    )
    .await
    .expect("vCluster");

    // A harmless Pod hook is installed.
    create_plugin(
        &admin,
        NS,
        "team",
        pod_hook(
            "team",
            json!({ "annotations": { "example.com/team": "a" } }),
        ),
    )
    .await;
    let p = wait_ready(&admin, NS, "team", "True", None, TIMEOUT).await;
    assert_eq!(condition(&p, "Ready").unwrap().reason, "Installed");
    let installed = template(&admin).await;
    let writes_before = operator_writes().await.len();

    // Every pod of the vCluster would run without a seccomp profile.
    let message = create_refused(
        &admin,
        "unconfined",
        "seccomp",
        json!({ "jsonPatch": [{ "op": "remove", "path": "/spec/securityContext/seccompProfile" }] }),
        "spec.hooks[0] (seccomp) change the vCluster's pods so that they would violate the Pod Security level \"restricted:latest\" enforced in namespace hooks-restricted (label pod-security.kubernetes.io/enforce); the API server's reason for a representative pod: ",
    )
    .await;
    assert!(message.contains("seccompProfile"), "{message}");
    wait_event(
        &admin,
        NS,
        "unconfined",
        "PolicyDenied",
        Duration::from_secs(10),
    )
    .await;

    // The API server judged the hooked pod (a dry run it refused, 403), and the operator wrote
    // nothing but dry runs and statuses: the workload is as the good plugin left it.
    let since: Vec<(String, String, u16)> = operator_writes().await.split_off(writes_before);
    assert!(
        pod_dry_run_answered(&since, 403),
        "no refused dry run of the hooked pod: {since:?}"
    );
    let written: Vec<&(String, String, u16)> = since
        .iter()
        .filter(|(_, uri, _)| !uri.contains("dryRun=All"))
        .filter(|(_, uri, _)| {
            ["/statefulsets", "/roles", "/rolebindings"]
                .iter()
                .any(|p| uri.contains(p))
        })
        .collect();
    assert!(written.is_empty(), "{written:?}");
    assert_eq!(template(&admin).await, installed);
    let p = wait_ready(&admin, NS, "team", "True", None, TIMEOUT).await;
    assert_eq!(condition(&p, "Ready").unwrap().reason, "Installed");

    // The fourth attacker's finding 6: a hook whose result the API server refuses as invalid
    // on the representative pod. Validation runs before Pod Security admission, so the level
    // never judged it, and the operator counted that as a pass. (A `copy` of a label a virtual
    // user sets, into the seccomp profile's type, was the attack: `Unconfined` on real pods;
    // copies may now write only labels and annotations, so the invalid value is a literal
    // here, one the operator's own policy does not refuse.)
    let writes_before = operator_writes().await.len();
    let message = create_refused(
        &admin,
        "invalid",
        "bogus-seccomp",
        json!({ "jsonPatch": [{ "op": "replace", "path": "/spec/securityContext/seccompProfile/type", "value": "vcp-bogus" }] }),
        "spec.hooks[0] (bogus-seccomp) make a representative pod of the vCluster invalid, so the Pod Security level of namespace hooks-restricted cannot judge what they do to its pods (the API server validates a pod before Pod Security admission runs); the API server's answer: ",
    )
    .await;
    // the API server's own words for the field (k8s.io/kubernetes pkg/apis/core/validation)
    assert!(
        message.contains("seccompProfile.type")
            && message.contains("Unsupported value: \"vcp-bogus\""),
        "{message}"
    );
    let since: Vec<(String, String, u16)> = operator_writes().await.split_off(writes_before);
    assert!(
        pod_dry_run_answered(&since, 422),
        "no dry run of the hooked pod refused as invalid: {since:?}"
    );
    assert_eq!(template(&admin).await, installed);

    // The security review's finding F2: the representative pod ran as the pod template's
    // account, `vc-my-vcluster` (the control plane's), so a hook writing that very account
    // changed nothing there and passed, while the vCluster's real pods (another account) would
    // all have moved to the control plane's. Any write of the field is refused now; and the
    // harmless `team` plugin above was admitted by a dry run of a pod running as an existing
    // account.
    let message = create_refused(
        &admin,
        "control-plane-account",
        "sa",
        json!({ "jsonPatch": [{ "op": "replace", "path": "/spec/serviceAccountName", "value": "vc-my-vcluster" }] }),
        "spec.hooks[0] (sa, CreatePhysical on v1 Pod) makes the vCluster's pods carry spec.serviceAccountName = \"vc-my-vcluster\" is refused by the operator policy: ",
    )
    .await;
    assert!(
        message.contains("a hook may not write spec.serviceAccountName, with any value"),
        "{message}"
    );
    assert_eq!(template(&admin).await, installed);

    // The security review's finding F4: tolerations of the hook's choosing (here of every
    // taint, in place of those vCluster's translation enforces, which v2 hooks run after) would
    // let the vCluster's pods onto control-plane nodes and nodes kept for other tenants. The
    // representative pod had no tolerations, and Pod Security does not judge them: installed.
    let message = create_refused(
        &admin,
        "any-node",
        "anywhere",
        json!({ "jsonPatch": [{ "op": "add", "path": "/spec/tolerations", "value": [{ "operator": "Exists" }] }] }),
        "spec.hooks[0] (anywhere, CreatePhysical on v1 Pod) makes the vCluster's pods carry spec.tolerations = ",
    )
    .await;
    assert!(
        message.contains("a toleration lets the pods onto tainted nodes"),
        "{message}"
    );
    assert_eq!(template(&admin).await, installed);

    // The security review's finding F3: a container's securityContext with
    // `allowPrivilegeEscalation: false` and `allowPrivilegeEſcalation: null` (U+017F, which Go's
    // encoding/json folds to `s`). The typed view read `false` and so did the dry run; vCluster
    // decodes the hook's result with Go, where the later key, `null`, wins: escalation allowed.
    create_refused(
        &admin,
        "two-spellings",
        "escalation",
        json!({ "jsonPatch": [{ "op": "replace", "path": "/spec/containers/0/securityContext", "value": {
            "allowPrivilegeEscalation": false,
            "allowPrivilegeE\u{17f}calation": null,
            "capabilities": { "drop": ["ALL"] },
        } }] }),
        "spec.hooks[0] (escalation, CreatePhysical on v1 Pod) writes both \"allowPrivilegeEscalation\" and \"allowPrivilegeE\u{17f}calation\" in spec.containers[0].securityContext, which vCluster's decoder",
    )
    .await;
    assert_eq!(template(&admin).await, installed);
    let p = wait_ready(&admin, NS, "team", "True", None, TIMEOUT).await;
    assert_eq!(condition(&p, "Ready").unwrap().reason, "Installed");
}
