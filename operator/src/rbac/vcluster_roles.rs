//! `rbac.mode: PatchVClusterRoles`: the plugin's namespaced rules appended to the vCluster's
//! own Role, recorded so that removal restores the Role byte for byte.
//!
//! DESIGN.md ("API", `rbac.mode`): "append the rules to the Roles bound to that service
//! account, recording exactly what was added so that removal restores the Role byte for byte".
//! The Role is found through the RoleBindings of the namespace with RBAC's subject semantics
//! (a ServiceAccount subject without a namespace is in the binding's namespace); a Role also
//! bound to another subject is refused, as the rules would widen that subject too. Why a merge
//! patch with a `resourceVersion` precondition rather than server-side apply: see the
//! [`rbac`](super) module.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, Subject};
use kube::ResourceExt;
use serde_json::{Value, json};
use vcp_crds::PLUGIN_NAME_LABEL;

use super::objects::{RBAC_GROUP, service_account_name};
use super::rules::normalize;

/// `Ready` reason of a `PatchVClusterRoles` plugin when no Role is bound to the vCluster's
/// service account.
pub const REASON_NO_VCLUSTER_ROLE: &str = "VClusterRoleNotFound";
/// `Ready` reason of a `PatchVClusterRoles` plugin whose vCluster Role is bound to some subject
/// besides the vCluster's service account ([`other_subjects`]): appending to it would grant
/// the plugin's rules to them too.
pub const REASON_SHARED_ROLE: &str = "SharedVClusterRole";
/// Prefix of the annotation recording the rules a plugin appended to a vCluster Role.
pub const ADDED_RULES_PREFIX: &str = "vcp.dev/added-rules.";

/// The annotation on a vCluster Role holding the JSON list of the rules `plugin_name` appended:
/// `vcp.dev/added-rules.<name>`. An annotation name is at most 63 characters, so a plugin name
/// longer than 51 is cut to 40 characters plus `-` and 10 hex digits of its FNV-1a hash.
pub fn added_rules_annotation(plugin_name: &str) -> String {
    const MAX_NAME: usize = 63 - "added-rules.".len();
    if plugin_name.len() <= MAX_NAME {
        return format!("{ADDED_RULES_PREFIX}{plugin_name}");
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in plugin_name.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let hex = format!("{hash:016x}");
    format!("{ADDED_RULES_PREFIX}{}-{}", &plugin_name[..40], &hex[..10])
}

/// The Role a `PatchVClusterRoles` plugin appends to: among the Roles that RoleBindings of the
/// namespace bind to the vCluster's service account `service_account` (and that are not a
/// plugin's dedicated Role, labelled [`PLUGIN_NAME_LABEL`]), the one named `vc-<vcluster>`
/// (the vCluster chart's) when bound, else the first by name. `None` when no Role is bound.
pub fn target_role(
    bindings: &[RoleBinding],
    namespace: &str,
    vcluster: &str,
    service_account: &str,
) -> Option<String> {
    let chart_role = service_account_name(vcluster);
    let sa = service_account;
    let mut roles: Vec<String> = bindings
        .iter()
        .filter(|b| b.role_ref.kind == "Role" && b.role_ref.api_group == RBAC_GROUP)
        .filter(|b| b.labels().get(PLUGIN_NAME_LABEL).is_none())
        .filter(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| is_service_account(s, namespace, sa))
        })
        .map(|b| b.role_ref.name.clone())
        .collect();
    roles.sort();
    roles.dedup();
    if roles.contains(&chart_role) {
        return Some(chart_role);
    }
    roles.into_iter().next()
}

/// Whether `subject` (of a RoleBinding in `namespace`) is the ServiceAccount `service_account`
/// of `namespace` (RBAC semantics: a ServiceAccount subject without a namespace is in the
/// binding's namespace).
fn is_service_account(subject: &Subject, namespace: &str, service_account: &str) -> bool {
    subject.kind == "ServiceAccount"
        && subject.name == service_account
        && subject.namespace.as_deref().unwrap_or(namespace) == namespace
}

/// The subjects, other than the ServiceAccount `service_account` of `namespace`, that any
/// RoleBinding of `namespace` binds the Role `role` to, each as `<kind> <name>` (with
/// `<namespace>/` for a ServiceAccount), sorted and deduplicated. Not empty means appending to
/// the Role (`rbac.mode: PatchVClusterRoles`) would grant the plugin's rules to them as well:
/// users, groups (even one the service account belongs to, such as
/// `system:serviceaccounts:<namespace>`) and other service accounts.
pub fn other_subjects(
    bindings: &[RoleBinding],
    namespace: &str,
    role: &str,
    service_account: &str,
) -> Vec<String> {
    let mut out: Vec<String> = bindings
        .iter()
        .filter(|b| {
            b.role_ref.kind == "Role"
                && b.role_ref.api_group == RBAC_GROUP
                && b.role_ref.name == role
        })
        .flat_map(|b| b.subjects.iter().flatten())
        .filter(|s| !is_service_account(s, namespace, service_account))
        .map(|s| match s.kind.as_str() {
            "ServiceAccount" => format!(
                "ServiceAccount {}/{}",
                s.namespace.as_deref().unwrap_or(namespace),
                s.name
            ),
            kind => format!("{kind} {}", s.name),
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The rules `plugin_name` recorded in `role` (empty when none or unreadable).
pub fn recorded_rules(role: &Role, plugin_name: &str) -> Vec<PolicyRule> {
    role.annotations()
        .get(&added_rules_annotation(plugin_name))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// `rules` without the `recorded` entries: for each recorded rule, from the last, its last
/// occurrence is removed (equal rules are interchangeable, so this restores the list exactly
/// even when another plugin appended the same rule later).
pub fn without_recorded(rules: &[PolicyRule], recorded: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = rules.to_vec();
    for r in recorded.iter().rev() {
        let r = normalize(r);
        if let Some(i) = out.iter().rposition(|x| normalize(x) == r) {
            out.remove(i);
        }
    }
    out
}

/// The JSON merge patch (RFC 7386) that makes `live` hold `desired` as the rules appended for
/// `plugin_name` (`None`: remove what it appended), or `None` when `live` already does.
///
/// The patch carries `metadata.resourceVersion` of `live` (the API server refuses it with 409
/// Conflict when the Role changed since: optimistic concurrency), the whole new `rules` (the
/// live list minus the recorded entries plus `desired`; a merge patch replaces a list whole)
/// and the annotation [`added_rules_annotation`] (set, or `null` to remove it).
pub fn patch_role(live: &Role, plugin_name: &str, desired: Option<&[PolicyRule]>) -> Option<Value> {
    let key = added_rules_annotation(plugin_name);
    let recorded_raw = live.annotations().get(&key);
    let recorded = recorded_rules(live, plugin_name);
    let live_rules = live.rules.clone().unwrap_or_default();
    let desired: Vec<PolicyRule> = desired.unwrap_or_default().iter().map(normalize).collect();
    let desired_json = serde_json::to_string(&desired).unwrap_or_default();

    let mut rules = without_recorded(&live_rules, &recorded);
    rules.extend(desired.iter().cloned());
    let annotation = if desired.is_empty() {
        Value::Null
    } else {
        Value::String(desired_json)
    };
    let annotation_ok = match (&annotation, recorded_raw) {
        (Value::Null, None) => true,
        (Value::String(want), Some(have)) => want == have,
        _ => false,
    };
    if annotation_ok && rules == live_rules {
        return None;
    }
    let mut metadata = json!({ "resourceVersion": live.metadata.resource_version });
    if !(annotation.is_null() && recorded_raw.is_none()) {
        metadata["annotations"] = json!({ key: annotation });
    }
    Some(json!({ "metadata": metadata, "rules": rules }))
}

/// The patch restoring `live` to what it was before `plugin_name` appended to it; `None` when
/// it carries nothing of the plugin.
pub fn restore_role(live: &Role, plugin_name: &str) -> Option<Value> {
    patch_role(live, plugin_name, None)
}
