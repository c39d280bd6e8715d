//! `vcluster-plugin-operator import` end to end: the tutorial's `plugin.yaml` and a legacy v1
//! values file, converted by the same function the binary calls (the binary's own stdout,
//! stderr and exit code are checked in `operator/tests/cli.rs`, where cargo provides its path),
//! are accepted by the host API server with exactly the expected spec.
//!
//! The plugins are applied in a namespace without a vCluster workload: the test is about the
//! manifests, not the operator (which is not running here).

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::Api;
use vcluster_plugin_operator::import::import;
use vcp_crds::{PluginVersion, PullPolicy, VClusterPlugin};
use vcp_tests::{
    Cluster, ControlPlane, Identity, apply_yaml, create_namespace, install_crds, repo_root,
};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/fixtures/import").join(name))
        .unwrap_or_else(|e| panic!("read fixture {name}: {e}"))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn tutorial_plugin_yaml_is_accepted_with_its_spec() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    install_crds(&client).await;
    let ns = "import-tutorial";
    create_namespace(&client, ns).await;

    let out = import(&fixture("plugin.yaml"), "my-vcluster", ns).expect("import the tutorial");
    let applied = apply_yaml(&client, &out.yaml, None)
        .await
        .expect("the API server accepts the imported manifests");
    assert_eq!(applied.len(), 1);

    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    let p = api.get("crd-sync").await.expect("get crd-sync");
    assert_eq!(p.spec.vcluster.name, "my-vcluster");
    assert_eq!(
        p.spec.image.as_deref(),
        Some("ghcr.io/loft-sh/vcluster-example-crd-sync:v3")
    );
    assert_eq!(p.spec.version, Some(PluginVersion::V2));
    assert_eq!(p.spec.image_pull_policy, Some(PullPolicy::IfNotPresent));
    assert!(p.spec.synced_types.is_empty() && p.spec.hooks.is_empty());
    assert_eq!(p.spec.config, None);
    let rbac = p.spec.rbac.as_ref().expect("rbac");
    assert_eq!(
        rbac.role.as_ref().expect("role").extra_rules,
        vec![PolicyRule {
            api_groups: Some(strings(&["example.loft.sh"])),
            resources: Some(strings(&["cars"])),
            verbs: strings(&[
                "create", "delete", "patch", "update", "get", "list", "watch"
            ]),
            ..Default::default()
        }]
    );
    assert_eq!(
        rbac.cluster_role.as_ref().expect("clusterRole").extra_rules,
        vec![PolicyRule {
            api_groups: Some(strings(&["apiextensions.k8s.io"])),
            resources: Some(strings(&["customresourcedefinitions"])),
            verbs: strings(&["get", "list", "watch"]),
            ..Default::default()
        }]
    );
    // What the server stored is what import produced (no field dropped or defaulted away).
    assert_eq!(
        serde_json::to_value(&p.spec).expect("spec"),
        serde_json::to_value(&out.plugins[0].spec).expect("spec")
    );
}

#[tokio::test]
async fn legacy_v1_values_are_accepted_with_config_and_container_fields() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    install_crds(&client).await;
    let ns = "import-legacy";
    create_namespace(&client, ns).await;

    let out = import(&fixture("legacy-v1.yaml"), "old-vcluster", ns).expect("import legacy");
    apply_yaml(&client, &out.yaml, None).await.expect(
        "the API server accepts the imported manifests (v1 with config passes the CEL rule)",
    );

    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    for want in &out.plugins {
        let name = want.metadata.name.as_deref().expect("name");
        let have = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get {name}: {e}"));
        assert_eq!(
            serde_json::to_value(&have.spec).expect("spec"),
            serde_json::to_value(&want.spec).expect("spec"),
            "{name}"
        );
    }
    let car = api.get("car-sync").await.expect("car-sync");
    assert_eq!(car.spec.version, Some(PluginVersion::V1));
    assert_eq!(
        car.spec.config,
        Some(serde_json::json!({"brands": ["BMW", "Tesla"], "seats": {"max": 7}}))
    );
    assert_eq!(car.spec.env.as_ref().expect("env")[0].name, "SYNC_INTERVAL");
    let pods = api.get("pod-labels").await.expect("pod-labels");
    assert_eq!(pods.spec.version, Some(PluginVersion::V2));
}
