//! The trust model's admission policies (`config/admission`) as the tests install them, and the
//! tenant identities' rights ([`crate::Identity::TenantEdit`] and the others).

use std::process::Command;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};

use crate::control_plane::{Cluster, ControlPlane, Identity, repo_root};
use crate::fixtures::{apply_yaml, create_namespace};
use crate::wait::wait_for;

/// Folder of the kustomize overlay that installs `config/admission` for the tests: the same
/// policies, the operator's bounded to the static-token user `vcp-operator`.
pub const ADMISSION_OVERLAY: &str = "tests/fixtures/admission";

/// Installs the admission policies of `config/admission` on `cp`'s host cluster as the tests
/// use them ([`ADMISSION_OVERLAY`], rendered with `kubectl kustomize`; namespace `vcp-system`
/// for the requester policy's ConfigMaps), then waits until the API server enforces all four:
/// a server-side dry run of a ClusterRoleBinding to `cluster-admin` as `vcp-operator` is
/// refused by the operator's policy, and three of VClusterPlugins by a probe user (`vcp-syncer`,
/// a Role and RoleBinding in `vcp-system`, left in place: `create` on VClusterPlugins and on
/// Roles and RoleBindings, `update` on the StatefulSet and Deployment `probe`) are refused by
/// one policy each: a plugin for the workload `other`, which the probe may not
/// change, by `vcp-plugin-requester-changes`; one for `probe` with a rule the probe does not
/// hold by `vcp-plugin-requester`; one for `probe` whose `config` nests one level deeper than
/// `vcp_crds::free_form::MAX_FREE_FORM_DEPTH` by `vcp-plugin-free-form-depth`. Idempotent.
///
/// # Panics
/// When rendering or applying fails, or a policy is not enforced within 30 s.
pub async fn install_admission_policies(cp: &ControlPlane, admin: &Client) {
    create_namespace(admin, "vcp-system").await;
    let out = Command::new(cp.kubectl())
        .arg("kustomize")
        .arg(repo_root().join(ADMISSION_OVERLAY))
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {ADMISSION_OVERLAY}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");
    apply_yaml(admin, &rendered, None)
        .await
        .unwrap_or_else(|e| panic!("apply {ADMISSION_OVERLAY}: {e:#}"));
    // A probe user that may create VClusterPlugins in vcp-system and hold nothing else.
    apply_yaml(
        admin,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: vcp-admission-probe, namespace: vcp-system }
rules:
  - { apiGroups: [vcp.dev], resources: [vclusterplugins], verbs: [create] }
  - { apiGroups: [rbac.authorization.k8s.io], resources: [roles, rolebindings], verbs: [create] }
  - { apiGroups: [apps], resources: [statefulsets, deployments], resourceNames: [probe], verbs: [update] }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vcp-admission-probe, namespace: vcp-system }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vcp-admission-probe }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: vcp-syncer }
"#,
        None,
    )
    .await
    .expect("probe RBAC");
    let operator = cp.client(Cluster::Host, Identity::Operator).await;
    let probe = cp.client(Cluster::Host, Identity::Syncer).await;
    let dry = PostParams {
        dry_run: true,
        field_manager: None,
    };
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vcp-admission-probe"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "vcp-operator"}]
        }))
        .expect("probe binding");
    let probe_plugin = |vcluster: &str, spec: serde_json::Value| -> DynamicObject {
        let mut full =
            serde_json::json!({"vcluster": {"name": vcluster}, "image": "example.com/probe:1"});
        full.as_object_mut()
            .unwrap()
            .extend(spec.as_object().cloned().unwrap_or_default());
        serde_json::from_value(serde_json::json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": {"name": "vcp-admission-probe", "namespace": "vcp-system"},
            "spec": full
        }))
        .expect("probe plugin")
    };
    // Refused by the policy of changed objects only (no update or patch on `other`).
    let changes_probe = probe_plugin("other", serde_json::json!({}));
    // Refused by the sharded policy only (no get on configmaps).
    let grants_probe = probe_plugin(
        "probe",
        serde_json::json!({"rbac": {"role": {"extraRules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
        ]}}}),
    );
    // Refused by the nesting bound only (a v1 config one level deeper than allowed; a v2
    // plugin takes no config).
    let mut deep = serde_json::json!({});
    for _ in 0..vcp_crds::free_form::MAX_FREE_FORM_DEPTH {
        deep = serde_json::json!({ "a": deep });
    }
    let depth_probe = probe_plugin(
        "probe",
        serde_json::json!({ "version": "v1", "config": deep }),
    );
    let plugins = kube::discovery::ApiResource {
        group: "vcp.dev".into(),
        version: "v1alpha1".into(),
        api_version: "vcp.dev/v1alpha1".into(),
        kind: "VClusterPlugin".into(),
        plural: "vclusterplugins".into(),
    };
    wait_for(Duration::from_secs(30), || {
        let operator = operator.clone();
        let probe = probe.clone();
        let binding = binding.clone();
        let changes_probe = changes_probe.clone();
        let grants_probe = grants_probe.clone();
        let depth_probe = depth_probe.clone();
        let plugins = plugins.clone();
        let dry = dry.clone();
        async move {
            let bound = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(operator)
                .create(&dry, &binding)
                .await;
            let api = Api::<DynamicObject>::namespaced_with(probe, "vcp-system", &plugins);
            let changes = api.create(&dry, &changes_probe).await;
            let grants = api.create(&dry, &grants_probe).await;
            let deep = api.create(&dry, &depth_probe).await;
            let refused_by = |r: Option<kube::Error>, policy: &str| {
                matches!(r, Some(kube::Error::Api(e)) if e.message.contains(policy))
            };
            (refused_by(bound.err(), "vcluster-plugin-operator-bounds")
                && refused_by(changes.err(), "'vcp-plugin-requester-changes'")
                && refused_by(grants.err(), "'vcp-plugin-requester'")
                && refused_by(deep.err(), "'vcp-plugin-free-form-depth'"))
            .then_some(())
        }
    })
    .await;
}

/// The tenants' rights in one namespace, as YAML for [`apply_yaml`] (`NAMESPACE` replaced):
/// - [`Identity::TenantEdit`]: the rules of the built-in ClusterRole `edit` — bound through
///   `system:aggregate-to-edit` and `system:aggregate-to-view`, which hold them (the local
///   control plane runs no controller-manager to aggregate them into `edit`) — plus what a
///   namespace admin has on Roles and RoleBindings (the built-in `admin`: every verb but
///   `escalate` and `bind`), which the operator writes for most plugins;
/// - [`Identity::TenantNoRbac`]: `edit` alone, so no Role or RoleBinding: the author who may not
///   make the RBAC objects a plugin would make;
/// - [`Identity::TenantNoSecrets`]: read-write pods, configmaps, services, StatefulSets and
///   Deployments, read serviceaccounts, the namespace admin's Roles and RoleBindings; nothing on
///   secrets;
/// - [`Identity::TenantNoPatch`]: as `tenant-nosecrets` plus secrets, but StatefulSets without
///   `patch`, and `update` only on the StatefulSet `my-vcluster` (so it may change that
///   vCluster's workload by `update` alone, and no other StatefulSet at all);
/// - all four: every verb on VClusterPlugins and on the tutorial's Cars.
pub const TENANT_RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-plugin-author, namespace: NAMESPACE }
rules:
  - apiGroups: [vcp.dev]
    resources: [vclusterplugins]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [example.loft.sh]
    resources: [cars]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-plugin-author, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-plugin-author }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-edit }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nosecrets }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nopatch }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-norbac }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-edit, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:aggregate-to-edit" }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-edit }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-norbac }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-edit-view, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:aggregate-to-view" }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-edit }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-norbac }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-rbac-admin, namespace: NAMESPACE }
rules:
  - apiGroups: [rbac.authorization.k8s.io]
    resources: [roles, rolebindings]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-rbac-admin, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-rbac-admin }
subjects:
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-edit }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nosecrets }
  - { apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nopatch }
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-nosecrets, namespace: NAMESPACE }
rules:
  - apiGroups: [""]
    resources: [pods, configmaps, services]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [serviceaccounts]
    verbs: [get, list, watch]
  - apiGroups: [apps]
    resources: [statefulsets, deployments]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-nosecrets, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-nosecrets }
subjects: [{ apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nosecrets }]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: tenant-nopatch, namespace: NAMESPACE }
rules:
  - apiGroups: [""]
    resources: [pods, configmaps, services, secrets]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [serviceaccounts]
    verbs: [get, list, watch]
  - apiGroups: [apps]
    resources: [statefulsets]
    verbs: [get, list, watch, create, delete]
  - apiGroups: [apps]
    resources: [statefulsets]
    resourceNames: [my-vcluster]
    verbs: [update]
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: tenant-nopatch, namespace: NAMESPACE }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant-nopatch }
subjects: [{ apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant-nopatch }]
"#;

/// Gives the four tenants their rights in `namespace` ([`TENANT_RBAC`]).
///
/// # Panics
/// When the API server refuses the Roles or RoleBindings.
pub async fn bind_tenant_rights(admin: &Client, namespace: &str) {
    apply_yaml(admin, &TENANT_RBAC.replace("NAMESPACE", namespace), None)
        .await
        .unwrap_or_else(|e| panic!("tenant RBAC in {namespace}: {e:#}"));
}
