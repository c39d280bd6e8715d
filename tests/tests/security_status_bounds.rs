//! The plugin's status is bounded, whoever writes it: the vCluster's ServiceAccount (which a
//! tenant with `edit` may impersonate, and which the runtime's status grant names) stored a
//! `syncedObjects` of 1.3 MB before the CRD bounded it (`vcp_crds::status_bounds`).
//!
//! On the real API server, with the admission policies of `config/admission` installed, as
//! `vc-my-vcluster` impersonated by `tenant-edit`:
//! - the runtime's own report of more kinds than the bound and of a message over the bound
//!   (made by `vcp_syncer_runtime::status`, as the runtime makes it) is accepted, and stored
//!   within the bounds with `syncedTotal` counting every object;
//! - a `syncedObjects` of one entry over `maxItems`, the attack's list of 1.3 MB, an
//!   `apiVersion` over its length, and a `RuntimeHealthy` message one character over the bound
//!   are refused by the CRD's schema, and the stored status is unchanged.

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_crds::status_bounds::{MAX_CONDITION_MESSAGE, MAX_SYNCED_OBJECTS};
use vcp_syncer_runtime::stats::TypeSummary;
use vcp_syncer_runtime::status;
use vcp_tests::{Cluster, ControlPlane, Identity};

const NS: &str = "status-bounds";
const NAME: &str = "bounded";

/// `vc-my-vcluster` of [`NS`], impersonated by `tenant-edit` (whom `edit` lets impersonate it).
async fn as_vcluster_account() -> Client {
    let mut config = ControlPlane::shared()
        .config(Cluster::Host, Identity::TenantEdit)
        .await
        .expect("tenant-edit kubeconfig");
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{NS}:vc-my-vcluster"));
    Client::try_from(config).expect("impersonating client")
}

/// A server-side apply of the runtime's part of the status, as the runtime sends it.
async fn apply_status(client: &Client, body: &Value) -> Result<VClusterPlugin, kube::Error> {
    Api::<VClusterPlugin>::namespaced(client.clone(), NS)
        .patch_status(
            NAME,
            &PatchParams::apply(vcp_crds::RUNTIME_FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
}

/// A raw runtime status: `entries` in `syncedObjects`, and `RuntimeHealthy` with `message`.
fn raw_status(entries: Vec<Value>, message: &str) -> Value {
    json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": NAME },
        "status": {
            "syncedObjects": entries,
            "syncedTotal": 1,
            "conditions": [{
                "type": "RuntimeHealthy", "status": "True", "reason": "Syncing",
                "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        }
    })
}

fn entry(api_version: &str, kind: &str) -> Value {
    json!({ "apiVersion": api_version, "kind": kind, "count": 1 })
}

/// The API server's refusal of `result`, which must be one (422, the schema's).
fn refused(result: Result<VClusterPlugin, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{what}: {e:?}");
            e.message
        }
        other => panic!("{what}: not refused: {:?}", other.map(|p| p.status)),
    }
}

#[tokio::test]
async fn an_oversized_status_is_refused_and_the_runtime_keeps_within_it() {
    let cp = ControlPlane::shared();
    let admin = vcp_tests::replica::prepare_host().await;
    vcp_tests::install_admission_policies(cp, &admin).await;
    vcp_tests::create_namespace(&admin, NS).await;
    vcp_tests::bind_tenant_rights(&admin, NS).await;
    // What the operator grants the runtime (operator/src/rbac/rules.rs: `patch` on
    // `vclusterplugins/status`).
    vcp_tests::apply_yaml(
        &admin,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: runtime-status, namespace: {NS} }}
rules:
  - {{ apiGroups: [vcp.dev], resources: [vclusterplugins/status], verbs: [get, patch] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: runtime-status, namespace: {NS} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: runtime-status }}
subjects:
  - {{ kind: ServiceAccount, name: vc-my-vcluster, namespace: {NS} }}
"#
        ),
        Some(NS),
    )
    .await
    .expect("the runtime's status grant");
    vcp_tests::create_plugin(
        &admin,
        NS,
        NAME,
        json!({ "vcluster": { "name": "my-vcluster" }, "image": "example.com/p:1", "version": "v1" }),
    )
    .await;
    let vc = as_vcluster_account().await;

    // The runtime's own report: 70 kinds, one type's error message over the bound.
    let mut types: Vec<TypeSummary> = (0..70)
        .map(|i| TypeSummary {
            api_version: "example.loft.sh/v1".into(),
            kind: format!("Kind{i}"),
            in_sync: 3,
            ready: true,
            ..TypeSummary::default()
        })
        .collect();
    types[0].type_error = Some("y".repeat(MAX_CONDITION_MESSAGE + 100));
    let report = status::desired(&types, None, Some(1));
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let condition = status::condition(&report, None, &now);
    let stored = apply_status(&vc, &status::apply_body(NAME, &report, &condition))
        .await
        .expect("the runtime's report is within the CRD's bounds");
    let s = stored.status.expect("a status");
    assert_eq!(s.synced_objects.len(), 64);
    assert_eq!(s.synced_total, Some(210), "every object is counted");
    let healthy = s
        .conditions
        .iter()
        .find(|c| c.type_ == "RuntimeHealthy")
        .expect("RuntimeHealthy");
    assert_eq!(healthy.reason, "TypeUnavailable");
    assert!(healthy.message.chars().count() <= 32768);
    assert!(healthy.message.ends_with("characters left out)"));
    let version = stored.metadata.resource_version.clone();
    println!(
        "the runtime's report of 70 kinds and a {}-character message: stored with {} kinds and a \
         {}-character message",
        MAX_CONDITION_MESSAGE + 100,
        s.synced_objects.len(),
        healthy.message.chars().count()
    );

    // Over the bounds, written by hand: refused by the schema.
    let kinds = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| entry("example.loft.sh/v1", &format!("Kind{i}")))
            .collect()
    };
    let message = refused(
        apply_status(&vc, &raw_status(kinds(MAX_SYNCED_OBJECTS + 1), "x")).await,
        "65 kinds",
    );
    assert!(
        message.contains("status.syncedObjects") && message.contains("must have at most 64 items"),
        "{message}"
    );
    // the attack's shape: 1.3 MB of syncedObjects
    let long_group = format!("{}.example/v1", "g".repeat(240));
    let attack: Vec<Value> = (0..5000)
        .map(|i| entry(&long_group, &format!("K{i}")))
        .collect();
    let size = serde_json::to_vec(&attack).unwrap().len();
    assert!(size > 1_300_000, "{size}");
    let message = refused(
        apply_status(&vc, &raw_status(attack, "x")).await,
        "1.3 MB of syncedObjects",
    );
    assert!(message.contains("must have at most 64 items"), "{message}");
    let message = refused(
        apply_status(
            &vc,
            &raw_status(
                vec![entry(&format!("{}.example/v1", "g".repeat(310)), "Car")],
                "x",
            ),
        )
        .await,
        "an apiVersion of 321 characters",
    );
    assert!(
        message.contains("status.syncedObjects[0].apiVersion")
            && message.contains("may not be more than 317"),
        "{message}"
    );
    let message = refused(
        apply_status(
            &vc,
            &raw_status(kinds(1), &"z".repeat(MAX_CONDITION_MESSAGE + 1)),
        )
        .await,
        "a message one character over",
    );
    assert!(
        message.contains("status.conditions[0].message")
            && message.contains("may not be more than 32768"),
        "{message}"
    );
    let after = Api::<VClusterPlugin>::namespaced(admin.clone(), NS)
        .get(NAME)
        .await
        .expect("read the plugin");
    assert_eq!(
        after.resource_version(),
        version,
        "no refused write was stored"
    );
    println!(
        "refused: 65 kinds, {size} bytes of syncedObjects, a 321-character apiVersion, a \
         32769-character message"
    );
}
