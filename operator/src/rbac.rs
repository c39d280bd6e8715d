//! Pure translation: a `VClusterPlugin` → the RBAC objects of `rbac.mode: Dedicated`.
//!
//! DESIGN.md ("API", `rbac`): a Role / ClusterRole of the plugin's own, bound to the vCluster's
//! service account (the one its pod template runs as, `vc-<vcluster>` by the chart's default;
//! see [`crate::workload::vcluster_identity`]); the namespaced ones owned by the VClusterPlugin (an
//! ownerReference), the cluster-scoped ones labelled ([`vcp_crds::PLUGIN_NAME_LABEL`],
//! [`vcp_crds::PLUGIN_NAMESPACE_LABEL`]) and removed by the finalizer. Rules needed by
//! `syncedTypes` are derived automatically:
//! - `ToHost`: get/list/watch/create/update/patch/delete on the host resource;
//! - `FromHost`: get/list/watch (the host side is only read);
//! - a type of a CustomResourceDefinition (a group with a dot outside `*.k8s.io`): get/list/watch
//!   on `customresourcedefinitions`, cluster-wide;
//! - hooks on physical events: get/list/watch/update/patch on the hooked resource;
//! - a synced or hooked type must be namespaced: discovery's `namespaced: false` refuses the
//!   plugin with [`REASON_CLUSTER_SCOPED_TYPE`] (the runtime syncs objects into the vCluster's
//!   host namespace, and a Role cannot grant a cluster-scoped resource);
//! - the embedded runtime: read VClusterPlugins of the namespace, patch its own status, and
//!   write Events; with a `ToHost` type, get the vCluster's Service (named like the vCluster):
//!   its uid is the ownerReference vCluster puts on every host copy (`setOwner`).
//!
//! `rbac.mode: PatchVClusterRoles` ([`patch_role`], [`restore_role`]): the plugin's namespaced
//! rules are appended to the Role bound to the vCluster's service account (found through the
//! RoleBindings of the namespace, [`target_role`]), unless any RoleBinding also binds that Role
//! to another subject ([`other_subjects`], refused with [`REASON_SHARED_ROLE`]: the appended
//! rules would widen them too); the rules added are recorded in the Role's
//! annotation [`added_rules_annotation`] (JSON), so that removal takes exactly those entries
//! out again and the Role's `rules`, labels and annotations are what they were, byte for byte.
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

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{
    HookEvent, PLUGIN_NAME_LABEL, PLUGIN_NAMESPACE_LABEL, SyncDirection, VClusterPlugin,
};

use crate::workload::{PluginKind, Refusal, plugin_kind};

/// `Ready` reason of a plugin naming a type the API server does not serve.
pub const REASON_UNKNOWN_TYPE: &str = "UnknownType";
/// `Ready` reason of a `PatchVClusterRoles` plugin when no Role is bound to the vCluster's
/// service account.
pub const REASON_NO_VCLUSTER_ROLE: &str = "VClusterRoleNotFound";
/// `Ready` reason of a `PatchVClusterRoles` plugin whose vCluster Role is bound to some subject
/// besides the vCluster's service account ([`other_subjects`]): appending to it would grant
/// the plugin's rules to them too.
pub const REASON_SHARED_ROLE: &str = "SharedVClusterRole";
/// `Ready` reason of a plugin syncing or hooking a cluster-scoped type (discovery's
/// `namespaced: false`): the runtime syncs namespaced objects into the vCluster's host
/// namespace, and a Role cannot grant access to a cluster-scoped resource.
pub const REASON_CLUSTER_SCOPED_TYPE: &str = "ClusterScopedType";
/// Prefix of the annotation recording the rules a plugin appended to a vCluster Role.
pub const ADDED_RULES_PREFIX: &str = "vcp.dev/added-rules.";

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const WRITE_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];
const HOOK_VERBS: [&str; 5] = ["get", "list", "watch", "update", "patch"];

/// What API discovery says of one served type: its plural and its scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The resource name, such as `secrets` or `ingresses`.
    pub plural: String,
    /// Whether objects of the type live in a namespace (discovery's `namespaced`).
    pub namespaced: bool,
}

impl Served {
    /// A namespaced type with this plural.
    pub fn namespaced(plural: &str) -> Self {
        Served {
            plural: plural.to_string(),
            namespaced: true,
        }
    }

    /// A cluster-scoped type with this plural.
    pub fn cluster_scoped(plural: &str) -> Self {
        Served {
            plural: plural.to_string(),
            namespaced: false,
        }
    }
}

/// What discovery found by `(apiVersion, kind)`, for the types [`types_to_resolve`] lists; a
/// type the host API server does not serve is absent.
pub type Plurals = BTreeMap<(String, String), Served>;

/// The service account of the vCluster `vcluster` (the vCluster chart's `vc-<release>`).
pub fn service_account_name(vcluster: &str) -> String {
    format!("vc-{vcluster}")
}

/// Name of the plugin's Role and RoleBinding in its namespace: `vcp-plugin-<name>`.
pub fn role_name(plugin_name: &str) -> String {
    format!("vcp-plugin-{plugin_name}")
}

/// Name of the plugin's ClusterRole and ClusterRoleBinding: `vcp:<namespace>:<name>`
/// (unambiguous, as neither part can contain `:`).
pub fn cluster_role_name(namespace: &str, plugin_name: &str) -> String {
    format!("vcp:{namespace}:{plugin_name}")
}

/// The group of an `apiVersion` (`""` for the core group `v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// Whether a group is served by a CustomResourceDefinition rather than built in.
fn is_crd_group(group: &str) -> bool {
    group.contains('.') && !group.ends_with(".k8s.io")
}

/// The `(apiVersion, kind)` pairs the controller must discover: every synced type (with
/// `resource` too: its scope, and whether `resource` is the type's plural), and the types of
/// hooks on physical events.
pub fn types_to_resolve(plugin: &VClusterPlugin) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = plugin
        .spec
        .synced_types
        .iter()
        .map(|t| (t.api_version.clone(), t.kind.clone()))
        .chain(
            plugin
                .spec
                .hooks
                .iter()
                .filter(|h| h.events.iter().any(is_physical))
                .map(|h| (h.api_version.clone(), h.kind.clone())),
        )
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_physical(e: &HookEvent) -> bool {
    matches!(e, HookEvent::CreatePhysical | HookEvent::UpdatePhysical)
}

fn rule(group: &str, resources: &[&str], verbs: &[&str], names: Option<Vec<String>>) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        resource_names: names,
        non_resource_urls: None,
    }
}

/// A rule with empty lists written as absent, the way the API server returns it.
pub fn normalize(rule: &PolicyRule) -> PolicyRule {
    let some = |v: &Option<Vec<String>>| v.clone().filter(|v| !v.is_empty());
    PolicyRule {
        api_groups: some(&rule.api_groups),
        resources: some(&rule.resources),
        resource_names: some(&rule.resource_names),
        non_resource_urls: some(&rule.non_resource_urls),
        verbs: rule.verbs.clone(),
    }
}

fn push_unique(rules: &mut Vec<PolicyRule>, r: PolicyRule) {
    let r = normalize(&r);
    if !rules.contains(&r) {
        rules.push(r);
    }
}

/// What discovery found for `kind` in `api_version`, when served.
pub fn served<'a>(plurals: &'a Plurals, api_version: &str, kind: &str) -> Option<&'a Served> {
    plurals.get(&(api_version.to_string(), kind.to_string()))
}

/// The resource of a synced type or hook (`field`, such as `spec.syncedTypes[0]`) on the host:
/// `explicit` (`syncedTypes[].resource`) when given, else the plural discovery found.
///
/// # Errors
/// A [`Refusal`] with [`REASON_CLUSTER_SCOPED_TYPE`] when discovery says the type is
/// cluster-scoped; with [`REASON_UNKNOWN_TYPE`] when it is not served and `explicit` is absent.
fn host_resource(
    plurals: &Plurals,
    field: &str,
    api_version: &str,
    kind: &str,
    explicit: Option<&str>,
) -> Result<String, Refusal> {
    match (served(plurals, api_version, kind), explicit) {
        (Some(s), _) if !s.namespaced => Err(Refusal {
            reason: REASON_CLUSTER_SCOPED_TYPE,
            message: format!(
                "{field} ({api_version} {kind}) is cluster-scoped on the host API server (resource {}); a plugin syncs and hooks namespaced types only, in the vCluster's namespace",
                s.plural
            ),
        }),
        (_, Some(r)) => Ok(r.to_string()),
        (Some(s), None) => Ok(s.plural.clone()),
        (None, None) => Err(Refusal {
            reason: REASON_UNKNOWN_TYPE,
            message: format!(
                "the host API server serves no kind {kind} in {api_version}; install its CRD or set syncedTypes[].resource"
            ),
        }),
    }
}

/// The namespaced rules of the plugin's Role: derived rules, then `rbac.role.extraRules`.
///
/// # Errors
/// A [`Refusal`] with [`REASON_UNKNOWN_TYPE`] when a needed plural is not in `plurals`, with
/// [`REASON_CLUSTER_SCOPED_TYPE`] when a synced or hooked type is cluster-scoped.
pub fn namespaced_rules(
    plugin: &VClusterPlugin,
    plurals: &Plurals,
) -> Result<Vec<PolicyRule>, Refusal> {
    let mut rules = Vec::new();
    for (i, t) in plugin.spec.synced_types.iter().enumerate() {
        let resource = host_resource(
            plurals,
            &format!("spec.syncedTypes[{i}]"),
            &t.api_version,
            &t.kind,
            t.resource.as_deref(),
        )?;
        let verbs: &[&str] = match t.direction {
            SyncDirection::ToHost => &WRITE_VERBS,
            SyncDirection::FromHost => &READ_VERBS,
        };
        push_unique(
            &mut rules,
            rule(group_of(&t.api_version), &[&resource], verbs, None),
        );
    }
    // The sidecar patches host objects after vCluster wrote them; a v2 plugin's hooks are
    // applied by vCluster itself (through `Mutate`) before its own write.
    let patches_afterwards = plugin_kind(plugin) != PluginKind::EmbeddedV2;
    for (i, h) in plugin.spec.hooks.iter().enumerate() {
        if !patches_afterwards || !h.events.iter().any(is_physical) {
            continue;
        }
        let resource = host_resource(
            plurals,
            &format!("spec.hooks[{i}]"),
            &h.api_version,
            &h.kind,
            None,
        )?;
        push_unique(
            &mut rules,
            rule(group_of(&h.api_version), &[&resource], &HOOK_VERBS, None),
        );
    }
    if plugin_kind(plugin).is_embedded() {
        push_unique(
            &mut rules,
            rule("vcp.dev", &["vclusterplugins"], &READ_VERBS, None),
        );
        push_unique(
            &mut rules,
            rule(
                "vcp.dev",
                &["vclusterplugins/status"],
                &["get", "patch", "update"],
                Some(vec![plugin.name_any()]),
            ),
        );
        push_unique(
            &mut rules,
            rule("events.k8s.io", &["events"], &["create", "patch"], None),
        );
        push_unique(
            &mut rules,
            rule("", &["events"], &["create", "patch"], None),
        );
        // The owner of the host copies (vCluster's setOwner): the runtime reads the uid of the
        // vCluster's Service, named like the vCluster.
        if plugin
            .spec
            .synced_types
            .iter()
            .any(|t| t.direction == SyncDirection::ToHost)
        {
            push_unique(
                &mut rules,
                rule(
                    "",
                    &["services"],
                    &["get"],
                    Some(vec![plugin.spec.vcluster.name.clone()]),
                ),
            );
        }
    }
    let extra = plugin.spec.rbac.as_ref().and_then(|r| r.role.as_ref());
    for r in extra.map(|r| r.extra_rules.as_slice()).unwrap_or_default() {
        push_unique(&mut rules, r.clone());
    }
    Ok(rules)
}

/// The cluster-scoped rules of the plugin's ClusterRole: get/list/watch on CRDs when a synced
/// type is a custom resource, then `rbac.clusterRole.extraRules`.
pub fn cluster_rules(plugin: &VClusterPlugin) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    if plugin
        .spec
        .synced_types
        .iter()
        .any(|t| is_crd_group(group_of(&t.api_version)))
    {
        push_unique(
            &mut rules,
            rule(
                "apiextensions.k8s.io",
                &["customresourcedefinitions"],
                &READ_VERBS,
                None,
            ),
        );
    }
    let extra = plugin
        .spec
        .rbac
        .as_ref()
        .and_then(|r| r.cluster_role.as_ref());
    for r in extra.map(|r| r.extra_rules.as_slice()).unwrap_or_default() {
        push_unique(&mut rules, r.clone());
    }
    rules
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
/// the vCluster's Role, see [`patch_role`]). The bindings' subject is `service_account` (in the
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

// ---------------------------------------------------------------------------------------------
// rbac.mode: PatchVClusterRoles

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

#[cfg(test)]
mod tests {
    use super::*;
    use vcp_crds::{Hook, PluginRbac, RoleRules, SyncedType, VClusterPluginSpec, VClusterRef};

    fn plugin(image: Option<&str>) -> VClusterPlugin {
        let mut p = VClusterPlugin::new(
            "car-syncer",
            VClusterPluginSpec {
                vcluster: VClusterRef {
                    name: "my-vcluster".into(),
                },
                image: image.map(String::from),
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("team-a".into());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    fn cars() -> SyncedType {
        SyncedType {
            api_version: "example.loft.sh/v1".into(),
            kind: "Car".into(),
            ..Default::default()
        }
    }

    fn plurals() -> Plurals {
        Plurals::from([
            (
                ("example.loft.sh/v1".into(), "Car".into()),
                Served::namespaced("cars"),
            ),
            (("v1".into(), "Pod".into()), Served::namespaced("pods")),
        ])
    }

    /// The vCluster chart's default service account of release `my-vcluster`.
    const SA: &str = "vc-my-vcluster";

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names() {
        assert_eq!(service_account_name("my-vcluster"), "vc-my-vcluster");
        assert_eq!(role_name("car-syncer"), "vcp-plugin-car-syncer");
        assert_eq!(
            cluster_role_name("team-a", "car-syncer"),
            "vcp:team-a:car-syncer"
        );
        assert_eq!(group_of("v1"), "");
        assert_eq!(group_of("example.loft.sh/v1"), "example.loft.sh");
    }

    #[test]
    fn synced_type_gets_write_verbs_on_host_and_crd_read_cluster_wide() {
        let mut p = plugin(Some("img"));
        p.spec.synced_types = vec![cars()];
        let d = desired(&p, &plurals(), SA).unwrap();
        let role = d.role.unwrap();
        assert_eq!(
            role.rules.unwrap(),
            vec![PolicyRule {
                api_groups: Some(strs(&["example.loft.sh"])),
                resources: Some(strs(&["cars"])),
                verbs: strs(&WRITE_VERBS),
                ..Default::default()
            }]
        );
        assert_eq!(role.metadata.owner_references.unwrap()[0].uid, "uid-1");
        let cr = d.cluster_role.unwrap();
        assert_eq!(cr.metadata.name.as_deref(), Some("vcp:team-a:car-syncer"));
        assert_eq!(
            cr.rules.unwrap()[0].resources,
            Some(strs(&["customresourcedefinitions"]))
        );
        assert!(
            cr.metadata.owner_references.is_none(),
            "cluster-scoped: labels only"
        );
        assert_eq!(
            cr.metadata.labels.unwrap()[PLUGIN_NAMESPACE_LABEL],
            "team-a"
        );
    }

    #[test]
    fn from_host_is_read_only_and_explicit_resource_works_without_discovery() {
        let mut p = plugin(Some("img"));
        p.spec.synced_types = vec![SyncedType {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            resource: Some("configmaps".into()),
            direction: SyncDirection::FromHost,
            ..Default::default()
        }];
        // Discovered all the same (for its scope), but not needed when not served.
        assert_eq!(
            types_to_resolve(&p),
            vec![("v1".into(), "ConfigMap".into())]
        );
        let rules = namespaced_rules(&p, &Plurals::new()).unwrap();
        assert_eq!(rules[0].api_groups, Some(strs(&[""])));
        assert_eq!(rules[0].verbs, strs(&READ_VERBS));
        assert!(
            cluster_rules(&p).is_empty(),
            "core types need no CRD access"
        );
    }

    #[test]
    fn cluster_scoped_types_are_refused_from_discoverys_scope() {
        // Kubernetes serves Namespace and Node cluster-scoped, Secret namespaced.
        let served = Plurals::from([
            (
                ("v1".into(), "Namespace".into()),
                Served::cluster_scoped("namespaces"),
            ),
            (
                ("v1".into(), "Node".into()),
                Served::cluster_scoped("nodes"),
            ),
            (
                ("v1".into(), "Secret".into()),
                Served::namespaced("secrets"),
            ),
        ]);
        let synced = |kind: &str, resource: Option<&str>| SyncedType {
            api_version: "v1".into(),
            kind: kind.into(),
            resource: resource.map(String::from),
            ..Default::default()
        };
        let mut p = plugin(Some("img"));
        p.spec.synced_types = vec![synced("Secret", None), synced("Namespace", None)];
        let err = desired(&p, &served, SA).unwrap_err();
        assert_eq!(err.reason, REASON_CLUSTER_SCOPED_TYPE);
        assert!(
            err.message
                .starts_with("spec.syncedTypes[1] (v1 Namespace)"),
            "{}",
            err.message
        );
        // An explicit resource does not hide the scope.
        p.spec.synced_types = vec![synced("Namespace", Some("namespaces"))];
        assert_eq!(
            namespaced_rules(&p, &served).unwrap_err().reason,
            REASON_CLUSTER_SCOPED_TYPE
        );
        // Nor does a hook.
        let mut p = plugin(Some("img"));
        p.spec.hooks = vec![Hook {
            name: "nodes".into(),
            api_version: "v1".into(),
            kind: "Node".into(),
            events: vec![HookEvent::UpdatePhysical],
            ..Default::default()
        }];
        let err = namespaced_rules(&p, &served).unwrap_err();
        assert_eq!(err.reason, REASON_CLUSTER_SCOPED_TYPE);
        assert!(
            err.message.starts_with("spec.hooks[0] (v1 Node)"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_bindings_subject_is_the_pod_templates_service_account() {
        let mut p = plugin(None);
        p.spec.synced_types = vec![cars()];
        p.spec.rbac = Some(PluginRbac {
            cluster_role: Some(RoleRules {
                extra_rules: vec![rule("", &["nodes"], &READ_VERBS, None)],
            }),
            ..Default::default()
        });
        let d = desired(&p, &plurals(), "custom-sa").unwrap();
        let custom = Subject {
            kind: "ServiceAccount".into(),
            name: "custom-sa".into(),
            namespace: Some("team-a".into()),
            api_group: None,
        };
        assert_eq!(
            d.role_binding.unwrap().subjects.unwrap(),
            vec![custom.clone()]
        );
        assert_eq!(
            d.cluster_role_binding.unwrap().subjects.unwrap(),
            vec![custom]
        );
    }

    #[test]
    fn unknown_type_is_refused() {
        let mut p = plugin(Some("img"));
        p.spec.synced_types = vec![cars()];
        assert_eq!(
            types_to_resolve(&p),
            vec![("example.loft.sh/v1".into(), "Car".into())]
        );
        let err = desired(&p, &Plurals::new(), SA).unwrap_err();
        assert_eq!(err.reason, REASON_UNKNOWN_TYPE);
        assert!(err.message.contains("Car"));
    }

    #[test]
    fn physical_hooks_need_patch_on_the_hooked_resource() {
        let mut p = plugin(Some("img"));
        p.spec.hooks = vec![
            Hook {
                name: "label-pods".into(),
                api_version: "v1".into(),
                kind: "Pod".into(),
                events: vec![HookEvent::CreatePhysical],
                ..Default::default()
            },
            Hook {
                name: "virtual-only".into(),
                api_version: "v1".into(),
                kind: "Secret".into(),
                events: vec![HookEvent::CreateVirtual],
                ..Default::default()
            },
        ];
        assert_eq!(types_to_resolve(&p), vec![("v1".into(), "Pod".into())]);
        let rules = namespaced_rules(&p, &plurals()).unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources, Some(strs(&["pods"])));
        assert_eq!(rules[0].verbs, strs(&HOOK_VERBS));
    }

    #[test]
    fn embedded_runtime_may_read_plugins_and_patch_only_its_own_status() {
        let d = desired(&plugin(None), &Plurals::new(), SA).unwrap();
        let rules = d.role.unwrap().rules.unwrap();
        let status = rules
            .iter()
            .find(|r| r.resources == Some(strs(&["vclusterplugins/status"])))
            .unwrap();
        assert_eq!(status.resource_names, Some(strs(&["car-syncer"])));
        assert!(rules.iter().any(
            |r| r.resources == Some(strs(&["vclusterplugins"])) && r.verbs == strs(&READ_VERBS)
        ));
        let rb = d.role_binding.unwrap();
        assert_eq!(rb.role_ref.name, "vcp-plugin-car-syncer");
        assert_eq!(
            rb.subjects.unwrap(),
            vec![Subject {
                kind: "ServiceAccount".into(),
                name: "vc-my-vcluster".into(),
                namespace: Some("team-a".into()),
                api_group: None,
            }]
        );
        assert!(d.cluster_role.is_none() && d.cluster_role_binding.is_none());
    }

    #[test]
    fn embedded_runtime_with_to_host_types_may_get_the_vcluster_service_only() {
        let services = |p: &VClusterPlugin| {
            desired(p, &plurals(), SA)
                .unwrap()
                .role
                .unwrap()
                .rules
                .unwrap()
                .into_iter()
                .filter(|r| r.resources == Some(strs(&["services"])))
                .collect::<Vec<_>>()
        };
        let mut p = plugin(None);
        assert!(services(&p).is_empty(), "nothing synced: no owner to read");
        p.spec.synced_types = vec![cars()];
        assert_eq!(
            services(&p),
            vec![PolicyRule {
                api_groups: Some(strs(&[""])),
                resources: Some(strs(&["services"])),
                verbs: strs(&["get"]),
                resource_names: Some(strs(&["my-vcluster"])),
                non_resource_urls: None,
            }]
        );
        let mut image = plugin(Some("img"));
        image.spec.synced_types = vec![cars()];
        assert!(
            services(&image).is_empty(),
            "an image plugin brings its own"
        );
    }

    #[test]
    fn image_plugin_without_rules_gets_no_role() {
        assert_eq!(
            desired(&plugin(Some("img")), &Plurals::new(), SA).unwrap(),
            DesiredRbac::default()
        );
    }

    #[test]
    fn extra_rules_are_appended_normalized_and_deduplicated() {
        let mut p = plugin(Some("img"));
        let secrets = PolicyRule {
            api_groups: Some(strs(&[""])),
            resources: Some(strs(&["secrets"])),
            verbs: strs(&["get"]),
            resource_names: Some(vec![]),
            non_resource_urls: None,
        };
        p.spec.rbac = Some(PluginRbac {
            role: Some(RoleRules {
                extra_rules: vec![secrets.clone(), secrets.clone()],
            }),
            cluster_role: Some(RoleRules {
                extra_rules: vec![PolicyRule {
                    api_groups: Some(strs(&[""])),
                    resources: Some(strs(&["nodes"])),
                    verbs: strs(&["get"]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        });
        let d = desired(&p, &Plurals::new(), SA).unwrap();
        let rules = d.role.unwrap().rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resource_names, None);
        assert_eq!(
            d.cluster_role.unwrap().rules.unwrap()[0].resources,
            Some(strs(&["nodes"]))
        );
        assert_eq!(d.cluster_role_binding.unwrap().role_ref.kind, "ClusterRole");
    }

    #[test]
    fn matching_ignores_server_additions_and_catches_edits() {
        let mut p = plugin(None);
        p.spec.synced_types = vec![cars()];
        let want = desired(&p, &plurals(), SA).unwrap().role.unwrap();
        let mut live = want.clone();
        live.metadata.resource_version = Some("42".into());
        live.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("extra".into(), "x".into());
        assert!(role_matches(&live, &want));

        let mut edited = live.clone();
        edited.rules.as_mut().unwrap().pop();
        assert!(!role_matches(&edited, &want));

        let mut unlabelled = live.clone();
        unlabelled.metadata.labels = None;
        assert!(!role_matches(&unlabelled, &want));

        let mut orphan = live;
        orphan.metadata.owner_references = None;
        assert!(!role_matches(&orphan, &want));
    }

    fn chart_role() -> Role {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "vc-my-vcluster", "namespace": "team-a", "resourceVersion": "7",
                          "annotations": { "meta.helm.sh/release-name": "my-vcluster" } },
            "rules": [
                { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"] },
                { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"] },
            ],
        }))
        .unwrap()
    }

    /// Applies a merge patch as the API server does, checking the resourceVersion precondition.
    fn apply_patch(role: &Role, patch: &Value) -> Role {
        fn merge(target: &mut Value, patch: &Value) {
            match (target, patch) {
                (Value::Object(t), Value::Object(p)) => {
                    for (k, v) in p {
                        if v.is_null() {
                            t.remove(k);
                        } else {
                            merge(t.entry(k.clone()).or_insert(Value::Null), v);
                        }
                    }
                }
                (t, p) => *t = p.clone(),
            }
        }
        let mut doc = serde_json::to_value(role).unwrap();
        assert_eq!(
            patch["metadata"]["resourceVersion"], doc["metadata"]["resourceVersion"],
            "precondition"
        );
        merge(&mut doc, patch);
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn patch_mode_appends_records_and_restores_exactly() {
        let original = chart_role();
        let cars = rule("example.loft.sh", &["cars"], &WRITE_VERBS, None);
        let patch = patch_role(&original, "car-syncer", Some(std::slice::from_ref(&cars))).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        let installed = apply_patch(&original, &patch);
        let rules = installed.rules.clone().unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[..2], original.rules.clone().unwrap()[..]);
        assert_eq!(rules[2], cars);
        assert_eq!(
            installed.annotations()["vcp.dev/added-rules.car-syncer"],
            serde_json::to_string(&vec![cars.clone()]).unwrap()
        );
        assert_eq!(
            patch_role(&installed, "car-syncer", Some(std::slice::from_ref(&cars))),
            None,
            "converged"
        );

        // A second plugin appending the same rule, then the first one leaving.
        let both = apply_patch(
            &installed,
            &patch_role(&installed, "other", Some(std::slice::from_ref(&cars))).unwrap(),
        );
        let first_gone = apply_patch(&both, &restore_role(&both, "car-syncer").unwrap());
        assert_eq!(first_gone.rules.as_ref().unwrap().len(), 3);
        let all_gone = apply_patch(&first_gone, &restore_role(&first_gone, "other").unwrap());
        assert_eq!(
            serde_json::to_value(&all_gone).unwrap(),
            serde_json::to_value(&original).unwrap()
        );
        assert_eq!(
            restore_role(&original, "car-syncer"),
            None,
            "nothing to restore"
        );
    }

    #[test]
    fn patch_mode_changed_rules_replace_the_recorded_ones_and_keep_foreign_edits() {
        let mut role = chart_role();
        role.metadata.annotations = None;
        let a = rule("", &["services"], &READ_VERBS, None);
        let b = rule("", &["endpoints"], &READ_VERBS, None);
        let v1 = apply_patch(
            &role,
            &patch_role(&role, "p", Some(std::slice::from_ref(&a))).unwrap(),
        );
        // Someone (Helm) appends a rule afterwards.
        let mut edited = v1.clone();
        let helm = rule("", &["secrets"], &["get"], None);
        edited.rules.as_mut().unwrap().push(helm.clone());
        let v2 = apply_patch(
            &edited,
            &patch_role(&edited, "p", Some(std::slice::from_ref(&b))).unwrap(),
        );
        let rules = v2.rules.clone().unwrap();
        assert_eq!(rules[2..], [helm.clone(), b]);
        let restored = apply_patch(&v2, &restore_role(&v2, "p").unwrap());
        let mut expected = role.rules.clone().unwrap();
        expected.push(helm);
        assert_eq!(restored.rules.unwrap(), expected);
        assert_eq!(
            restored.metadata.annotations.unwrap_or_default(),
            BTreeMap::new()
        );
    }

    #[test]
    fn target_role_prefers_the_charts_role_bound_to_the_service_account() {
        let binding = |name: &str, role: &str, sa: &str, labelled: bool| -> RoleBinding {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "labels": if labelled { serde_json::json!({ PLUGIN_NAME_LABEL: "x" }) } else { serde_json::json!({}) } },
                "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": role },
                "subjects": [{ "kind": "ServiceAccount", "name": sa, "namespace": "team-a" }],
            }))
            .unwrap()
        };
        let bs = vec![
            binding("a", "aaa-extra", "vc-my-vcluster", false),
            binding("b", "vc-my-vcluster", "vc-my-vcluster", false),
            binding("c", "zzz", "someone-else", false),
            binding("d", "vcp-plugin-x", "vc-my-vcluster", true),
        ];
        assert_eq!(
            target_role(&bs, "team-a", "my-vcluster", SA).as_deref(),
            Some("vc-my-vcluster")
        );
        assert_eq!(
            target_role(&bs[..1], "team-a", "my-vcluster", SA).as_deref(),
            Some("aaa-extra")
        );
        assert_eq!(
            target_role(&bs[2..], "team-a", "my-vcluster", SA),
            None,
            "dedicated roles never"
        );
        assert_eq!(
            target_role(&bs, "team-b", "my-vcluster", SA),
            None,
            "other namespace's SA"
        );
    }

    #[test]
    fn a_role_bound_to_anyone_else_is_shared() {
        let binding = |role: &str, subjects: Value| -> RoleBinding {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": format!("b-{role}") },
                "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": role },
                "subjects": subjects,
            }))
            .unwrap()
        };
        let only_sa = binding(
            "vc-my-vcluster",
            serde_json::json!([{ "kind": "ServiceAccount", "name": SA, "namespace": "team-a" }]),
        );
        // The chart's own binding: nobody else.
        assert!(
            other_subjects(
                std::slice::from_ref(&only_sa),
                "team-a",
                "vc-my-vcluster",
                SA
            )
            .is_empty()
        );
        // RBAC: a ServiceAccount subject without namespace is in the binding's namespace.
        let implicit_ns = binding(
            "vc-my-vcluster",
            serde_json::json!([{ "kind": "ServiceAccount", "name": SA }]),
        );
        assert!(other_subjects(&[implicit_ns], "team-a", "vc-my-vcluster", SA).is_empty());
        let shared = vec![
            only_sa,
            binding(
                "vc-my-vcluster",
                serde_json::json!([
                    { "kind": "User", "apiGroup": RBAC_GROUP, "name": "jane" },
                    { "kind": "ServiceAccount", "name": SA, "namespace": "team-b" },
                ]),
            ),
            binding(
                "vc-my-vcluster",
                serde_json::json!([{ "kind": "Group", "apiGroup": RBAC_GROUP, "name": "system:serviceaccounts:team-a" }]),
            ),
            // Bindings of other Roles, or of a ClusterRole of the same name, do not count.
            binding(
                "other",
                serde_json::json!([{ "kind": "User", "apiGroup": RBAC_GROUP, "name": "joe" }]),
            ),
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "cluster-role-of-same-name" },
                "roleRef": { "apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "vc-my-vcluster" },
                "subjects": [{ "kind": "User", "apiGroup": RBAC_GROUP, "name": "joe" }],
            }))
            .unwrap(),
        ];
        assert_eq!(
            other_subjects(&shared, "team-a", "vc-my-vcluster", SA),
            [
                "Group system:serviceaccounts:team-a",
                "ServiceAccount team-b/vc-my-vcluster",
                "User jane"
            ]
        );
    }

    #[test]
    fn target_role_follows_a_custom_service_account() {
        let b: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "custom" },
            "roleRef": { "apiGroup": RBAC_GROUP, "kind": "Role", "name": "custom-role" },
            "subjects": [{ "kind": "ServiceAccount", "name": "custom-sa", "namespace": "team-a" }],
        }))
        .unwrap();
        let bs = [b];
        assert_eq!(
            target_role(&bs, "team-a", "my-vcluster", "custom-sa").as_deref(),
            Some("custom-role")
        );
        assert_eq!(target_role(&bs, "team-a", "my-vcluster", SA), None);
    }

    #[test]
    fn patch_mode_has_no_dedicated_role_and_long_names_fit_the_annotation() {
        let mut p = plugin(None);
        p.spec.rbac = Some(PluginRbac {
            mode: vcp_crds::RbacMode::PatchVClusterRoles,
            ..Default::default()
        });
        let d = desired(&p, &Plurals::new(), SA).unwrap();
        assert!(d.role.is_none() && d.role_binding.is_none());
        assert!(!namespaced_rules(&p, &Plurals::new()).unwrap().is_empty());
        let long = "x".repeat(63);
        let key = added_rules_annotation(&long);
        assert_eq!(key.len() - "vcp.dev/".len(), 63);
        assert_ne!(key, added_rules_annotation(&"x".repeat(62)));
        assert_eq!(
            added_rules_annotation("car-syncer"),
            "vcp.dev/added-rules.car-syncer"
        );
    }
}
