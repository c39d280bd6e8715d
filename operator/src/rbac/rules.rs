//! The rules a plugin needs: derived from `syncedTypes`, physical hooks and the embedded
//! runtime, then the spec's `extraRules`; the host resource of each type from discovery.
//!
//! The rule (`rbac`): "Rules needed by `syncedTypes` are derived automatically (verbs on
//! the host resource, get/list/watch on the CRD)"; a synced or hooked type must be namespaced
//! (the runtime syncs into the vCluster's host namespace, "a Role suffices").
//!
//! Then the kinds a `ToHost` type brings back (`syncedTypes[].produced`): `get`, `list`,
//! `watch` in the vCluster's host namespace, nothing more (the runtime only reads the host
//! object and writes its copy in the virtual cluster). A `reference` patch derives nothing: it
//! translates a name on the way to the host, and the runtime never reads the object it names.
//!
//! The CRD read is narrow: nothing cluster-wide is derived. The embedded runtime reads a
//! custom resource's CustomResourceDefinition only in the *virtual* cluster, with the virtual
//! client, and takes a 403 as "unknown" (`syncer-runtime/src/vanish.rs`, `TypeGuard::presence`);
//! it discovers the type on the virtual API server (`syncer-runtime/src/runtime.rs`,
//! `resolve`). A host read would have made a ClusterRole for every custom-resource plugin,
//! which its author must be able to create (the requester admission policy,
//! `config/admission/requester.yaml`): no tenant could have installed the tutorial's Car
//! syncer. A plugin image that reads CRDs on the host (the vcluster-sdk's
//! `EnsureCRDFromPhysicalCluster`) declares it in `rbac.clusterRole.extraRules`, as the
//! README's crd-sync sample does.

use std::collections::BTreeMap;
use vcp_crds::Reason;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::ResourceExt;
use vcp_crds::{SyncDirection, VClusterPlugin};

use crate::workload::{PluginKind, Refusal, plugin_kind};

pub(super) const WRITE_VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];
pub(super) const READ_VERBS: [&str; 3] = ["get", "list", "watch"];
pub(super) const HOOK_VERBS: [&str; 5] = ["get", "list", "watch", "update", "patch"];

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

/// The group of an `apiVersion` (`""` for the core group `v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

/// The `(apiVersion, kind)` pairs the controller must discover: every synced type (with
/// `resource` too: its scope, and whether `resource` is the type's plural), every kind a
/// `ToHost` type brings back (`produced`), and the types of hooks on physical events.
pub fn types_to_resolve(plugin: &VClusterPlugin) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = plugin
        .spec
        .synced_types
        .iter()
        .map(|t| (t.api_version.clone(), t.kind.clone()))
        .chain(produced_kinds(plugin).map(|(_, _, p)| (p.api_version.clone(), p.kind.clone())))
        .chain(
            plugin
                .spec
                .hooks
                .iter()
                .filter(|h| h.events.iter().any(|e| e.is_physical()))
                .map(|h| (h.api_version.clone(), h.kind.clone())),
        )
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every `produced` entry of the plugin's `ToHost` synced types (a `FromHost` type brings
/// nothing back; the CRD refuses `produced` on one): `(type index, entry index, entry)`.
pub fn produced_kinds(
    plugin: &VClusterPlugin,
) -> impl Iterator<Item = (usize, usize, &vcp_crds::ProducedObject)> {
    plugin
        .spec
        .synced_types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.direction.is_to_host())
        .flat_map(|(i, t)| t.produced.iter().enumerate().map(move |(j, p)| (i, j, p)))
}

pub(super) fn rule(
    group: &str,
    resources: &[&str],
    verbs: &[&str],
    names: Option<Vec<String>>,
) -> PolicyRule {
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
/// A [`Refusal`] with [`ClusterScopedType`](vcp_crds::Reason::ClusterScopedType) when discovery says the type is
/// cluster-scoped; with [`UnknownType`](vcp_crds::Reason::UnknownType) when it is not served and `explicit` is absent.
fn host_resource(
    plurals: &Plurals,
    field: &str,
    api_version: &str,
    kind: &str,
    explicit: Option<&str>,
) -> Result<String, Refusal> {
    match (served(plurals, api_version, kind), explicit) {
        (Some(s), _) if !s.namespaced => Err(Refusal {
            reason: Reason::ClusterScopedType,
            message: format!(
                "{field} ({api_version} {kind}) is cluster-scoped on the host API server (resource {}); a plugin syncs and hooks namespaced types only, in the vCluster's namespace",
                s.plural
            ),
        }),
        (_, Some(r)) => Ok(r.to_string()),
        (Some(s), None) => Ok(s.plural.clone()),
        (None, None) => Err(Refusal {
            reason: Reason::UnknownType,
            message: format!(
                "the host API server serves no kind {kind} in {api_version}; install its CRD or set syncedTypes[].resource"
            ),
        }),
    }
}

/// The namespaced rules of the plugin's Role: derived rules, then `rbac.role.extraRules`.
///
/// # Errors
/// A [`Refusal`] with [`UnknownType`](vcp_crds::Reason::UnknownType) when a needed plural is not in `plurals`, with
/// [`ClusterScopedType`](vcp_crds::Reason::ClusterScopedType) when a synced or hooked type is cluster-scoped.
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
    // What a host controller produces for a synced object is read (never written) to be brought
    // back (`produced`, the runtime's `produced.rs`). A `reference` patch needs nothing: it only
    // translates a name, the runtime never reads the referenced object.
    for (i, j, p) in produced_kinds(plugin) {
        let resource = host_resource(
            plurals,
            &format!("spec.syncedTypes[{i}].produced[{j}]"),
            &p.api_version,
            &p.kind,
            None,
        )?;
        push_unique(
            &mut rules,
            rule(group_of(&p.api_version), &[&resource], &READ_VERBS, None),
        );
    }
    // The sidecar patches host objects after vCluster wrote them; a v2 plugin's hooks are
    // applied by vCluster itself (through `Mutate`) before its own write.
    let patches_afterwards = plugin_kind(plugin) != PluginKind::EmbeddedV2;
    for (i, h) in plugin.spec.hooks.iter().enumerate() {
        if !patches_afterwards || !h.events.iter().any(|e| e.is_physical()) {
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
            .any(|t| t.direction.is_to_host())
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

/// The cluster-scoped rules of the plugin's ClusterRole: `rbac.clusterRole.extraRules`, as
/// written (nothing is derived cluster-wide; see the module docs). Empty means no ClusterRole
/// and no ClusterRoleBinding.
pub fn cluster_rules(plugin: &VClusterPlugin) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
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
