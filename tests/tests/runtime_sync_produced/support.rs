//! What the tests of this binary share: the test CRD `Cert` in both clusters and the grants
//! `vcp-syncer` needs for it beyond the World's.

use kube::api::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use vcp_tests::runtime::apply_dynamic as apply;
use vcp_tests::{Cluster, ControlPlane, Identity, create_namespace};

pub(crate) fn certs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Cert"),
        "certs",
    )
}

/// The `Cert` CRD (namespaced, `spec.secretName`, a status subresource).
pub(crate) fn cert_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "certs.e2e.vcp.test"},
        "spec": {"group": "e2e.vcp.test", "scope": "Namespaced",
            "names": {"plural": "certs", "singular": "cert", "kind": "Cert"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"secretName": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}
    })
}

/// The CRD in both clusters, and what `vcp-syncer` needs beyond the World's grants: Certs
/// (written) and Secrets (read) in the host namespace; Certs and Secrets in the virtual cluster.
pub(crate) async fn prepare(host_ns: &str) {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    let crds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    apply(&host, &crds, None, cert_crd()).await;
    apply(&virtual_, &crds, None, cert_crd()).await;
    create_namespace(&host, host_ns).await;
    let rbac = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        )
    };
    apply(&host, &rbac("Role", "roles"), Some(host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "vcp-syncer-produced", "namespace": host_ns},
        "rules": [
            {"apiGroups": ["e2e.vcp.test"], "resources": ["certs"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}
        ]
    })).await;
    apply(&host, &rbac("RoleBinding", "rolebindings"), Some(host_ns), json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "vcp-syncer-produced", "namespace": host_ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vcp-syncer-produced"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
    apply(&virtual_, &rbac("ClusterRole", "clusterroles"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "vcp-e2e-syncer-produced"},
        "rules": [
            {"apiGroups": ["e2e.vcp.test"], "resources": ["certs"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
        ]
    })).await;
    apply(&virtual_, &rbac("ClusterRoleBinding", "clusterrolebindings"), None, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "vcp-e2e-syncer-produced"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp-e2e-syncer-produced"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
    })).await;
}
