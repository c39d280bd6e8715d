//! `spec.rbac`: the RBAC a plugin needs on the host ([`PluginRbac`]).

use k8s_openapi::api::rbac::v1::PolicyRule;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// RBAC of a plugin on the host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginRbac {
    /// `Dedicated` (default): a Role / ClusterRole of the plugin's own, bound to the vCluster's
    /// service account. `PatchVClusterRoles`: rules appended to the Roles already bound to it.
    #[serde(default)]
    pub mode: RbacMode,
    /// Namespaced rules, in the vCluster's host namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<RoleRules>,
    /// Cluster-scoped rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role: Option<RoleRules>,
}

/// How the plugin's rules are granted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RbacMode {
    /// The plugin's own Role / ClusterRole and bindings.
    #[default]
    Dedicated,
    /// Append to the Roles bound to the vCluster's service account, recording what was added.
    PatchVClusterRoles,
}

/// Extra policy rules.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleRules {
    /// Standard Kubernetes PolicyRules, added to those derived from `syncedTypes`; verbs from
    /// the known set (a custom verb is refused as a likely typo), at most 64 rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::policy_rules")]
    pub extra_rules: Vec<PolicyRule>,
}
