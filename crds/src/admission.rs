//! What the requester-bound admission policy (`config/admission/requester.yaml`) checks, as far
//! as the rest of the project must agree with it.
//!
//! The policy asks the API server's authorizer, for the user creating or changing a
//! `VClusterPlugin`, about every permission the plugin would give the vCluster (README.md,
//! "Security model"). Two things it decides must match elsewhere:
//! - the resource (plural) of a synced or hooked type: admission cannot run API discovery, so
//!   it checks `syncedTypes[].resource` when given, else [`admission_plural`] of the kind; the
//!   operator compares that with the plural discovery returns and refuses the plugin
//!   (`PolicyDenied`) when they differ, so the Role never grants a resource admission did not
//!   check;
//! - how many checks one plugin may need: the API server allows two authorizer checks per CEL
//!   expression and about 28 per policy binding (`k8s.io/apiserver`'s cost model: 350,000 per
//!   check, a budget of 10,000,000), so the policy of granted permissions
//!   (`vcp-plugin-requester`) runs in shards of [`CHECKS_PER_SHARD`] checks, one binding each,
//!   and the CRD refuses a plugin needing more than [`MAX_PERMISSION_CHECKS`]
//!   ([`permission_checks_rule`]);
//! - which RBAC objects the operator writes for a plugin ([`written_rbac`]): its author must be
//!   able to write each of them (`create` on the Role and RoleBinding, or the ClusterRole and
//!   ClusterRoleBinding, in `vcp-plugin-requester`; `update` or `patch` on roles when the
//!   vCluster's Role is patched, and on the workload, in `vcp-plugin-requester-changes`).

use crate::{RbacMode, RoleRules, VClusterPluginSpec};

/// Checks one binding of the requester policy makes (its ConfigMap names the first).
pub const CHECKS_PER_SHARD: u32 = 24;

/// Shards (bindings) of the requester policy in `config/admission/requester.yaml`.
pub const SHARDS: u32 = 3;

/// Most permission checks a `VClusterPlugin` may need at admission: [`CHECKS_PER_SHARD`] x
/// [`SHARDS`].
pub const MAX_PERMISSION_CHECKS: u32 = CHECKS_PER_SHARD * SHARDS;

/// The RBAC objects the operator writes for a plugin, as the requester admission policies derive
/// them from the spec alone; the operator's own
/// derivation (`operator/src/rbac`) is compared with this one in its unit tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrittenRbac {
    /// Role and RoleBinding `vcp-plugin-<name>` in the plugin's namespace (`rbac.mode:
    /// Dedicated` with namespaced rules): the author needs `create` on roles and rolebindings.
    pub role_and_binding: bool,
    /// The vCluster's own Role, patched (`rbac.mode: PatchVClusterRoles` with namespaced
    /// rules): the author needs `update` or `patch` on roles in the namespace.
    pub patched_role: bool,
    /// ClusterRole and ClusterRoleBinding `vcp:<namespace>:<name>` (any mode, with
    /// `rbac.clusterRole.extraRules`): the author needs `create` on both, cluster-wide.
    pub cluster_role_and_binding: bool,
}

/// What [`WrittenRbac`] the operator writes for a plugin with `spec`. The plugin has namespaced
/// rules when it has no `image` (the embedded runtime's fixed rules), a synced type, a hook on a
/// physical event, or an `rbac.role.extraRules` entry; cluster rules when it has an
/// `rbac.clusterRole.extraRules` entry (nothing cluster-wide is derived).
pub fn written_rbac(spec: &VClusterPluginSpec) -> WrittenRbac {
    let physical_hook = spec
        .hooks
        .iter()
        .any(|h| h.events.iter().any(|e| e.is_physical()));
    let extra = |rules: Option<&RoleRules>| rules.is_some_and(|r| !r.extra_rules.is_empty());
    let rbac = spec.rbac.as_ref();
    let namespaced = spec.image.is_none()
        || !spec.synced_types.is_empty()
        || physical_hook
        || extra(rbac.and_then(|r| r.role.as_ref()));
    let patch_mode = rbac.is_some_and(|r| r.mode == RbacMode::PatchVClusterRoles);
    WrittenRbac {
        role_and_binding: namespaced && !patch_mode,
        patched_role: namespaced && patch_mode,
        cluster_role_and_binding: extra(rbac.and_then(|r| r.cluster_role.as_ref())),
    }
}

/// The plural resource name admission checks for `kind` when `syncedTypes[].resource` is not
/// given: Kubernetes' own guess, `k8s.io/apimachinery/pkg/api/meta.UnsafeGuessKindToResource`
/// — the lower-cased kind, unchanged when it ends in `endpoints`, else `+es` after a final `s`,
/// `y` → `ies`, otherwise `+s` (`Car` → `cars`, `NetworkPolicy` → `networkpolicies`,
/// `Ingress` → `ingresses`, `Endpoints` → `endpoints`). It is a guess: a CRD may declare
/// another plural, which the operator then refuses (`PolicyDenied`) until
/// `syncedTypes[].resource` names it.
///
/// Checked against Kubernetes' own `UnsafeGuessKindToResource` (through the Go plural oracle)
/// for every kind of the test CRDs and every kind the API server serves, and against the plural
/// each of them is really served under: `tests/tests/oracle_plural.rs`.
pub fn admission_plural(kind: &str) -> String {
    let singular = kind.to_ascii_lowercase();
    if singular.ends_with("endpoints") {
        singular
    } else if singular.ends_with('s') {
        format!("{singular}es")
    } else if let Some(stem) = singular.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{singular}s")
    }
}

/// CEL (a root `x-kubernetes-validations` rule of the CRD): the number of permission checks
/// the requester policy makes for an object is at most [`MAX_PERMISSION_CHECKS`]. The count is
/// the sharded policy's (`vcp-plugin-requester`; the workload is checked by
/// `vcp-plugin-requester-changes`, outside this count): 7 per `ToHost` synced type (get, list, watch, create,
/// update, patch, delete), 3 per `FromHost` one (get, list, watch); 3 per `reference` patch and
/// 3 per `produced` entry of a `ToHost` type (get, list, watch on the kind it names); 5 per hook with a physical
/// event (get, list, watch, update, patch); per extra rule, apiGroups x resources x verbs x
/// resourceNames (1 when none), plus nonResourceURLs x verbs; then 2 for the Role and
/// RoleBinding and 2 for the ClusterRole and ClusterRoleBinding the operator creates
/// ([`written_rbac`]).
pub fn permission_checks_rule() -> String {
    // `has()` guards rather than optionals: the CRD's static cost estimate takes the size of an
    // `orValue([])` as unbounded, while a guarded list keeps its maxItems.
    let rules = |parent: &str| {
        format!(
            "(has({parent}) && has({parent}.extraRules) ? {parent}.extraRules.map(r, (has(r.apiGroups) ? size(r.apiGroups) : 0) * (has(r.resources) ? size(r.resources) : 0) * size(r.verbs) * (has(r.resourceNames) && size(r.resourceNames) > 0 ? size(r.resourceNames) : 1) + (has(r.nonResourceURLs) ? size(r.nonResourceURLs) : 0) * size(r.verbs)).sum() : 0)"
        )
    };
    format!(
        "{ROLE} + {CLUSTER_ROLE} + (has(self.spec.syncedTypes) ? self.spec.syncedTypes.map(t, (t.direction == 'FromHost' ? 3 : 7) + (has(t.patches) ? size(t.patches.filter(p, has(p.reference))) * 3 : 0) + (has(t.produced) && t.direction != 'FromHost' ? size(t.produced) * 3 : 0)).sum() : 0) + (has(self.spec.hooks) ? size(self.spec.hooks.filter(h, h.events.exists(e, e == 'CreatePhysical' || e == 'UpdatePhysical'))) * 5 : 0) + (has(self.spec.rbac) ? {} + {} : 0) <= {MAX_PERMISSION_CHECKS}",
        rules("self.spec.rbac.role"),
        rules("self.spec.rbac.clusterRole"),
    )
}

/// CEL (with `self` the object): 2 when the operator creates a Role and a RoleBinding for it
/// ([`WrittenRbac::role_and_binding`]), else 0.
const ROLE: &str = "((!has(self.spec.image) || (has(self.spec.syncedTypes) && size(self.spec.syncedTypes) > 0) || (has(self.spec.hooks) && self.spec.hooks.exists(h, h.events.exists(e, e == 'CreatePhysical' || e == 'UpdatePhysical'))) || (has(self.spec.rbac) && has(self.spec.rbac.role) && has(self.spec.rbac.role.extraRules) && size(self.spec.rbac.role.extraRules) > 0)) && !(has(self.spec.rbac) && has(self.spec.rbac.mode) && self.spec.rbac.mode == 'PatchVClusterRoles') ? 2 : 0)";

/// CEL (with `self` the object): 2 when the operator creates a ClusterRole and a
/// ClusterRoleBinding for it ([`WrittenRbac::cluster_role_and_binding`]), else 0.
const CLUSTER_ROLE: &str = "(has(self.spec.rbac) && has(self.spec.rbac.clusterRole) && has(self.spec.rbac.clusterRole.extraRules) && size(self.spec.rbac.clusterRole.extraRules) > 0 ? 2 : 0)";

/// The message of [`permission_checks_rule`].
pub fn permission_checks_message() -> String {
    format!(
        "the plugin needs more than {MAX_PERMISSION_CHECKS} permission checks at admission (2 for a Role and its binding, 2 for a ClusterRole and its binding, 7 per ToHost synced type, 3 per FromHost one, 3 per reference patch and per produced kind, 5 per hook on physical events, apiGroups x resources x verbs x resourceNames per extra rule): split it into several VClusterPlugins"
    )
}
