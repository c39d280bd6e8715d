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
mod tests;
