//! Pure translation: a `VClusterPlugin` → the RBAC objects of `rbac.mode: Dedicated`.
//!
//! The rule (`rbac`): a Role / ClusterRole of the plugin's own, bound to the vCluster's
//! service account (the one its pod template runs as, `vc-<vcluster>` by the chart's default;
//! see [`crate::workload::vcluster_identity`]); the namespaced ones owned by the VClusterPlugin (an
//! ownerReference), the cluster-scoped ones labelled ([`vcp_crds::PLUGIN_NAME_LABEL`],
//! [`vcp_crds::PLUGIN_NAMESPACE_LABEL`]) and removed by the finalizer. Rules needed by
//! `syncedTypes` are derived automatically:
//! - `ToHost`: get/list/watch/create/update/patch/delete on the host resource;
//! - `FromHost`: get/list/watch (the host side is only read);
//! - nothing cluster-wide: a custom resource's CustomResourceDefinition is read in the virtual
//!   cluster only (see [`cluster_rules`]), so a ClusterRole holds `rbac.clusterRole.extraRules`
//!   alone;
//! - hooks on physical events: get/list/watch/update/patch on the hooked resource;
//! - a synced or hooked type must be namespaced: discovery's `namespaced: false` refuses the
//!   plugin with [`ClusterScopedType`](vcp_crds::Reason::ClusterScopedType) (the runtime syncs objects into the vCluster's
//!   host namespace, and a Role cannot grant a cluster-scoped resource);
//! - the embedded runtime: read VClusterPlugins of the namespace, patch its own status, and
//!   write Events; with a `ToHost` type, get the vCluster's Service (named like the vCluster):
//!   its uid is the ownerReference vCluster puts on every host copy (`setOwner`).
//!
//! `rbac.mode: PatchVClusterRoles` ([`patch_role`], [`restore_role`]): the plugin's namespaced
//! rules are appended to the Role bound to the vCluster's service account (found through the
//! RoleBindings of the namespace, [`target_role`]), unless any RoleBinding also binds that Role
//! to another subject ([`other_subjects`], refused with [`SharedVClusterRole`](vcp_crds::Reason::SharedVClusterRole): the appended
//! rules would widen them too); the rules added are recorded in the Role's
//! annotation [`added_rules_annotation`] (JSON, a [`Record`]), so that removal takes exactly
//! those entries out again and the Role's `rules`, labels and annotations are what they were,
//! byte for byte. A rule the Role already grants outside the plugin's record is not appended
//! but recorded as `present`, so removal never takes out a rule of the chart's or a user's.
//! Cluster-scoped rules still get the plugin's own ClusterRole in this mode (the vCluster chart
//! binds no ClusterRole to patch in the common case).
//!
//! Why a merge patch with a `resourceVersion` precondition, not server-side apply: a Role's `rules` is an
//! atomic list, so an apply that sets it takes ownership of the *whole* list, Helm's rules
//! included. A forced apply would steal Helm's ownership; and when the plugin goes, an apply
//! without `rules` would delete the entire list (the manager owned it), not just the appended
//! entries. Instead the operator reads the Role, computes the new list (the live one without
//! the recorded entries, plus the desired ones) and sends it with the annotation change and the
//! `metadata.resourceVersion` it read as one JSON merge patch: optimistic concurrency, so a
//! concurrent writer (Helm, Argo CD, another reconcile) makes the patch fail with a conflict and
//! the next reconcile recomputes from the fresh object instead of overwriting its change.
//!
//! One concern a submodule, all re-exported here: the rules a plugin needs (`rules`), the
//! dedicated objects and their comparison (`objects`), `PatchVClusterRoles` (`vcluster_roles`).

mod objects;
mod rules;
mod vcluster_roles;

pub use objects::{
    DesiredRbac, cluster_role_binding_matches, cluster_role_matches, cluster_role_name, desired,
    labels, meta_matches, owner_reference, patches_vcluster_roles, role_binding_matches,
    role_matches, role_name, service_account_name,
};
pub use rules::{
    Plurals, Served, cluster_rules, group_of, namespaced_rules, normalize, produced_kinds, served,
    types_to_resolve,
};
pub use vcluster_roles::{
    ADDED_RULES_MAX_NAME, ADDED_RULES_PREFIX, Record, added_rules_annotation,
    legacy_added_rules_annotation, other_subjects, patch_records, patch_role, record_keys,
    recorded_rules, records_held, restore_role, rules_under, target_role, without_recorded,
};

#[cfg(test)]
mod tests;
