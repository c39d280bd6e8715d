//! The dedicated RBAC objects of `rbac.mode: Dedicated` (and the ClusterRole of every mode):
//! their names, labels, owner and subject, and whether a live object already is the desired one.
//!
//! The rule (`rbac`): "a Role / ClusterRole of the plugin's own, bound to the vCluster's
//! service account; the namespaced ones owned by the VClusterPlugin, the cluster-scoped ones
//! labelled and removed by the finalizer, since a cluster-scoped object cannot have a
//! namespaced owner"; ("Operator contract") a converged object is not written again.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use vcp_crds::{PLUGIN_NAME_LABEL, PLUGIN_NAMESPACE_LABEL, VClusterPlugin};

use super::rules::{Plurals, cluster_rules, namespaced_rules, normalize};
use crate::workload::Refusal;

/// The API group of Roles and their bindings.
pub(super) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The service account of the vCluster `vcluster` (the vCluster chart's `vc-<release>`).
pub fn service_account_name(vcluster: &str) -> String {
    format!("vc-{vcluster}")
}

/// Name of the plugin's Role and RoleBinding in its namespace: `vcp-plugin-<name>`, the full
/// name after a fixed prefix, so injective (no key derived from a plugin may collide); at
/// most 74 characters, as the CRD makes a plugin name a DNS-1123 label of at most 63.
pub fn role_name(plugin_name: &str) -> String {
    format!("vcp-plugin-{plugin_name}")
}

/// Name of the plugin's ClusterRole and ClusterRoleBinding: `vcp:<namespace>:<name>`
/// (injective, as neither part can contain `:`; at most 131 characters, both parts being
/// DNS-1123 labels).
pub fn cluster_role_name(namespace: &str, plugin_name: &str) -> String {
    format!("vcp:{namespace}:{plugin_name}")
}

/// The RBAC objects a plugin should have; `None` where it needs none (no rules).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredRbac {
    /// `vcp-plugin-<name>` in the plugin's namespace.
    pub role: Option<Role>,
    /// Binds [`DesiredRbac::role`] to the vCluster's service account.
    pub role_binding: Option<RoleBinding>,
    /// `vcp:<namespace>:<name>`.
    pub cluster_role: Option<ClusterRole>,
    /// Binds [`DesiredRbac::cluster_role`] to the vCluster's service account.
    pub cluster_role_binding: Option<ClusterRoleBinding>,
}

/// Labels every object made for `plugin` carries.
pub fn labels(plugin: &VClusterPlugin) -> BTreeMap<String, String> {
    BTreeMap::from([
        (PLUGIN_NAME_LABEL.to_string(), plugin.name_any()),
        (
            PLUGIN_NAMESPACE_LABEL.to_string(),
            plugin.namespace().unwrap_or_default(),
        ),
    ])
}

/// The ownerReference of a namespaced object made for `plugin` (`controller: true`; no
/// `blockOwnerDeletion`, which would need `update` on `vclusterplugins/finalizers`).
pub fn owner_reference(plugin: &VClusterPlugin) -> OwnerReference {
    OwnerReference {
        api_version: VClusterPlugin::api_version(&()).to_string(),
        kind: VClusterPlugin::kind(&()).to_string(),
        name: plugin.name_any(),
        uid: plugin.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn subject(plugin: &VClusterPlugin, service_account: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: service_account.to_string(),
        namespace: plugin.namespace(),
        api_group: None,
    }
}

/// Whether `plugin` uses `rbac.mode: PatchVClusterRoles`.
pub fn patches_vcluster_roles(plugin: &VClusterPlugin) -> bool {
    plugin
        .spec
        .rbac
        .as_ref()
        .is_some_and(|r| r.mode == vcp_crds::RbacMode::PatchVClusterRoles)
}

/// The dedicated RBAC objects of `plugin`: in `Dedicated` mode all four (where rules exist); in
/// `PatchVClusterRoles` mode only the ClusterRole and its binding (the namespaced rules go into
/// the vCluster's Role, see [`patch_role`](super::patch_role)). The bindings' subject is `service_account` (in the
/// plugin's namespace): the account the vCluster's pod template runs as
/// ([`crate::workload::vcluster_identity`]).
///
/// # Errors
/// As [`namespaced_rules`].
pub fn desired(
    plugin: &VClusterPlugin,
    plurals: &Plurals,
    service_account: &str,
) -> Result<DesiredRbac, Refusal> {
    let name = plugin.name_any();
    let namespace = plugin.namespace().unwrap_or_default();
    let namespaced = namespaced_rules(plugin, plurals)?;
    let cluster = cluster_rules(plugin);
    let meta = |name: String, namespaced: bool| ObjectMeta {
        name: Some(name),
        namespace: namespaced.then(|| namespace.clone()),
        labels: Some(labels(plugin)),
        owner_references: namespaced.then(|| vec![owner_reference(plugin)]),
        ..Default::default()
    };
    let mut out = DesiredRbac::default();
    if !namespaced.is_empty() && !patches_vcluster_roles(plugin) {
        out.role = Some(Role {
            metadata: meta(role_name(&name), true),
            rules: Some(namespaced),
        });
        out.role_binding = Some(RoleBinding {
            metadata: meta(role_name(&name), true),
            role_ref: RoleRef {
                api_group: RBAC_GROUP.into(),
                kind: "Role".into(),
                name: role_name(&name),
            },
            subjects: Some(vec![subject(plugin, service_account)]),
        });
    }
    if !cluster.is_empty() {
        let cname = cluster_role_name(&namespace, &name);
        out.cluster_role = Some(ClusterRole {
            metadata: meta(cname.clone(), false),
            rules: Some(cluster),
            aggregation_rule: None,
        });
        out.cluster_role_binding = Some(ClusterRoleBinding {
            metadata: meta(cname.clone(), false),
            role_ref: RoleRef {
                api_group: RBAC_GROUP.into(),
                kind: "ClusterRole".into(),
                name: cname,
            },
            subjects: Some(vec![subject(plugin, service_account)]),
        });
    }
    Ok(out)
}

/// Whether `live` carries every label and ownerReference of `desired`.
pub fn meta_matches(live: &ObjectMeta, desired: &ObjectMeta) -> bool {
    let labels_ok = desired
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| live.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    let owners_ok = desired.owner_references.iter().flatten().all(|o| {
        live.owner_references
            .iter()
            .flatten()
            .any(|l| l.uid == o.uid && l.controller == o.controller)
    });
    labels_ok && owners_ok
}

fn rules_match(live: &Option<Vec<PolicyRule>>, desired: &Option<Vec<PolicyRule>>) -> bool {
    let norm = |r: &Option<Vec<PolicyRule>>| -> Vec<PolicyRule> {
        r.iter().flatten().map(normalize).collect()
    };
    norm(live) == norm(desired)
}

/// Whether a live Role already is the desired one (no apply needed).
pub fn role_matches(live: &Role, desired: &Role) -> bool {
    meta_matches(&live.metadata, &desired.metadata) && rules_match(&live.rules, &desired.rules)
}

/// Whether a live ClusterRole already is the desired one.
pub fn cluster_role_matches(live: &ClusterRole, desired: &ClusterRole) -> bool {
    meta_matches(&live.metadata, &desired.metadata) && rules_match(&live.rules, &desired.rules)
}

/// Whether a live RoleBinding already is the desired one.
pub fn role_binding_matches(live: &RoleBinding, desired: &RoleBinding) -> bool {
    meta_matches(&live.metadata, &desired.metadata)
        && live.role_ref == desired.role_ref
        && live.subjects == desired.subjects
}

/// Whether a live ClusterRoleBinding already is the desired one.
pub fn cluster_role_binding_matches(
    live: &ClusterRoleBinding,
    desired: &ClusterRoleBinding,
) -> bool {
    meta_matches(&live.metadata, &desired.metadata)
        && live.role_ref == desired.role_ref
        && live.subjects == desired.subjects
}
