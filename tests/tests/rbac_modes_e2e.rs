//! `rbac.mode: PatchVClusterRoles` end to end on the real host API server, the operator
//! in-process under the `vcp-operator` identity: the plugin's rules are appended to the Role the
//! vCluster chart binds to `vc-<vcluster>`, recorded in an annotation, and removing the plugin
//! restores that Role's rules, labels and annotations exactly.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::Role;
use kube::Client;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, apply_yaml, wait_for};

const NS: &str = "rbac-patch-mode";
const TIMEOUT: Duration = Duration::from_secs(30);

/// CRDs, the operator's RBAC, and one operator for this test binary on its own runtime.
async fn setup() -> Client {
    static STARTED: OnceLock<()> = OnceLock::new();
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    if STARTED.get().is_none() {
        vcp_tests::install_crds(&admin).await;
        for file in [
            "config/rbac/role.yaml",
            "config/rbac/test-user-binding.yaml",
        ] {
            vcp_tests::apply_yaml_file(&admin, file, None)
                .await
                .unwrap_or_else(|e| panic!("apply {file}: {e:#}"));
        }
        STARTED.get_or_init(|| {
            std::thread::spawn(|| {
                let rt = tokio::runtime::Runtime::new().expect("operator runtime");
                rt.block_on(async {
                    let client = ControlPlane::shared()
                        .client(Cluster::Host, Identity::Operator)
                        .await;
                    let mut config = vcluster_plugin_operator::Config::new(client);
                    config.runtime_image = "vcp-test/runtime:rbac-modes".into();
                    vcluster_plugin_operator::run(config)
                        .await
                        .expect("operator stopped");
                });
            });
        });
    }
    admin
}

const VCLUSTER: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: { name: vc-my-vcluster }
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: my-vcluster }
spec:
  serviceName: my-vcluster-headless
  selector: { matchLabels: { app: vcluster } }
  template:
    metadata: { labels: { app: vcluster } }
    spec:
      serviceAccountName: vc-my-vcluster
      containers:
        - { name: syncer, image: "ghcr.io/loft-sh/vcluster-pro:0.26.0" }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: vc-my-vcluster
  labels: { app.kubernetes.io/managed-by: Helm }
  annotations: { meta.helm.sh/release-name: my-vcluster }
rules:
  - apiGroups: [""]
    resources: [pods, services]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [apps]
    resources: [statefulsets]
    verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vc-my-vcluster }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }
subjects:
  - { kind: ServiceAccount, name: vc-my-vcluster, namespace: rbac-patch-mode }
"#;

/// The parts of the Role that must come back exactly: rules, labels, annotations.
fn restorable(r: &Role) -> Value {
    json!({
        "rules": r.rules,
        "labels": r.metadata.labels,
        "annotations": r.metadata.annotations,
    })
}

#[tokio::test]
async fn patch_mode_appends_to_the_vcluster_role_and_removal_restores_it_exactly() {
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, VCLUSTER, Some(NS))
        .await
        .expect("vCluster");
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let original = roles.get("vc-my-vcluster").await.unwrap();

    apply_yaml(
        &admin,
        r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: car-syncer }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
  rbac:
    mode: PatchVClusterRoles
    role:
      extraRules:
        - { apiGroups: [""], resources: [configmaps], verbs: [get] }
"#,
        Some(NS),
    )
    .await
    .expect("plugin");
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let p = plugins.get("car-syncer").await.ok()?;
            p.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        }
    })
    .await;

    // The chart's Role carries the original rules first, then the plugin's, recorded.
    let patched = roles.get("vc-my-vcluster").await.unwrap();
    let rules = patched.rules.clone().unwrap();
    let original_rules = original.rules.clone().unwrap();
    assert_eq!(rules[..original_rules.len()], original_rules[..]);
    let added = &rules[original_rules.len()..];
    assert!(
        added
            .iter()
            .any(|r| r.resources == Some(vec!["cars".into()])
                && r.verbs.contains(&"delete".to_string())),
        "{added:?}"
    );
    assert!(
        added
            .iter()
            .any(|r| r.resources == Some(vec!["configmaps".into()]))
    );
    let recorded: Vec<k8s_openapi::api::rbac::v1::PolicyRule> = serde_json::from_str(
        &patched.metadata.annotations.as_ref().unwrap()["vcp.dev/added-rules.car-syncer"],
    )
    .unwrap();
    assert_eq!(recorded, added);
    assert!(
        roles
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none(),
        "no dedicated Role in PatchVClusterRoles mode"
    );

    // Converged: another reconcile does not touch the Role.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        roles
            .get("vc-my-vcluster")
            .await
            .unwrap()
            .metadata
            .resource_version,
        patched.metadata.resource_version
    );

    plugins
        .delete("car-syncer", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            plugins
                .get_opt("car-syncer")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    let restored = roles.get("vc-my-vcluster").await.unwrap();
    assert_eq!(restorable(&restored), restorable(&original));
    assert_eq!(
        serde_json::to_string(&restored.rules).unwrap(),
        serde_json::to_string(&original.rules).unwrap(),
        "byte for byte"
    );
}
