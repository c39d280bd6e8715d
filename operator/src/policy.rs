//! The operator policy: which RBAC rules a `VClusterPlugin` may grant to its vCluster, and
//! what its container may ask for in the vCluster's pod ([`containers`]).
//!
//! The rule: a namespaced object must not become a way to gain
//! cluster power. By default the operator refuses
//! - wildcards (`*`, also inside a name such as `pods/*`) in `apiGroups`, `resources`, `verbs`;
//! - the verbs `escalate`, `bind`, `impersonate`, in any rule;
//! - write verbs in cluster-scoped rules (only `get`, `list`, `watch` are allowed there), so the
//!   tutorial's get/list/watch on CustomResourceDefinitions passes;
//! - cluster-wide access to `secrets` (any verb, any group, subresources included).
//!
//! A policy given at start (`--policy-file`, YAML) widens or narrows this. Its schema, every
//! field optional (an absent field keeps the default shown):
//!
//! ```yaml
//! allowWildcards: false                  # true: `*` is allowed anywhere
//! forbiddenVerbs: [escalate, bind, impersonate]   # refused in every rule
//! forbiddenResources: []                 # refused in every rule (namespaced too), e.g. [pods/exec]
//! clusterScoped:
//!   allowedVerbs: [get, list, watch]     # the only verbs a cluster-scoped rule may hold
//!   forbiddenResources: [secrets]        # never granted cluster-wide
//! containers:                            # the container policy, see `containers`
//!   allowPrivileged: false               # securityContext.privileged: true
//!   allowPrivilegeEscalation: false      # securityContext.allowPrivilegeEscalation: true
//!   allowedCapabilities: []              # securityContext.capabilities.add, e.g. [NET_BIND_SERVICE]
//!   allowRunAsRoot: false                # runAsUser: 0, runAsGroup: 0, runAsNonRoot: false
//!   allowUnconfined: false               # Unconfined seccomp/AppArmor, procMount Unmasked, seLinuxOptions
//!   allowSecretReferences: false         # true: env / envFrom may reference any Secret
//!   allowedSecrets: []                   # Secrets that may be referenced: names, or prefixes `x-*`
//!   allowedVolumes: []                   # volumes of the vCluster's pod that may be mounted
//!   allowedImages: []                    # empty: any image; else prefixes `reg/` or repositories
//!   maxResources: {}                     # the most spec.resources may ask for, e.g. {cpu: "2", memory: 1Gi}
//! ```
//!
//! Resource names match exactly or by their base (`secrets` also refuses `secrets/status`).
//! Unknown fields are an error, so a typo cannot silently keep the default.
//!
//! What is checked ([`evaluate`]): the container fields ([`containers::check`]), then
//! `spec.rbac.role.extraRules` (namespaced), `spec.rbac.clusterRole.extraRules`
//! (cluster-scoped), and the rules the operator derives from `syncedTypes` / `hooks`
//! ([`crate::rbac`]), exactly as they would be granted: their verbs are fixed sets and their
//! resource is the explicit `syncedTypes[].resource` or the plural API discovery returned
//! (`kind: Secret` is judged as `secrets`, the resource the Role gets).
//!
//! Then what admission could not know ([`check_admitted_resources`]): the requester-bound
//! admission policy (`config/admission`) checks the requester's rights on each synced and
//! hooked type under the resource [`admitted_resource`] names (`syncedTypes[].resource`, else
//! Kubernetes' guess from the kind), since it has no discovery. When discovery's plural differs
//! (a CRD of kind `Person` whose plural is `people`, guessed `persons`), admission checked the
//! wrong resource, and the plugin is refused.
//!
//! A refusal becomes `Ready=False, reason=PolicyDenied` with a message naming the rule (or
//! container field) and the
//! policy field, and nothing is applied for the plugin (workload and RBAC untouched).

use std::path::Path;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use vcp_crds::VClusterPlugin;

use crate::rbac::{self, Plurals};

pub mod containers;
mod denial;
pub mod pod;
pub use containers::ContainerPolicy;
pub use denial::Denial;

/// The operator policy (see the module docs for the YAML schema and the defaults).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// `*` allowed in `apiGroups`, `resources` and `verbs`; default `false`.
    pub allow_wildcards: bool,
    /// Verbs refused in every rule; default `escalate`, `bind`, `impersonate`.
    pub forbidden_verbs: Vec<String>,
    /// Resources refused in every rule, namespaced or not; default none.
    pub forbidden_resources: Vec<String>,
    /// Limits of cluster-scoped rules (`rbac.clusterRole` and the derived CRD read).
    pub cluster_scoped: ClusterScopedPolicy,
    /// What a plugin's container may ask for ([`containers`]).
    pub containers: ContainerPolicy,
}

/// The part of [`Policy`] that applies to cluster-scoped rules only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClusterScopedPolicy {
    /// The only verbs allowed; default `get`, `list`, `watch` (read-only).
    pub allowed_verbs: Vec<String>,
    /// Resources never granted cluster-wide; default `secrets`.
    pub forbidden_resources: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            allow_wildcards: false,
            forbidden_verbs: strings(&["escalate", "bind", "impersonate"]),
            forbidden_resources: Vec::new(),
            cluster_scoped: ClusterScopedPolicy::default(),
            containers: ContainerPolicy::default(),
        }
    }
}

impl Default for ClusterScopedPolicy {
    fn default() -> Self {
        ClusterScopedPolicy {
            allowed_verbs: strings(&["get", "list", "watch"]),
            forbidden_resources: strings(&["secrets"]),
        }
    }
}

/// Why a policy file cannot be used.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// The file cannot be read.
    #[error("cannot read the policy file {path}: {source}")]
    Read {
        /// The path given with `--policy-file`.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not match the schema (unknown field, wrong type).
    #[error(
        "invalid operator policy{}: {source}; fields: allowWildcards, forbiddenVerbs, forbiddenResources, clusterScoped.allowedVerbs, clusterScoped.forbiddenResources, containers.allowPrivileged, containers.allowPrivilegeEscalation, containers.allowedCapabilities, containers.allowRunAsRoot, containers.allowUnconfined, containers.allowSecretReferences, containers.allowedSecrets, containers.allowedVolumes, containers.allowedImages, containers.maxResources",
        .path.as_deref().map(|p| format!(" in {p}")).unwrap_or_default()
    )]
    Parse {
        /// The file, when read from one.
        path: Option<String>,
        /// The YAML error (with line and column).
        #[source]
        source: serde_yaml::Error,
    },
    /// A value of the right type that cannot be used (a `maxResources` value that is not a
    /// quantity).
    #[error(
        "invalid operator policy{}: {key}: {source}",
        .path.as_deref().map(|p| format!(" in {p}")).unwrap_or_default()
    )]
    Invalid {
        /// The file, when read from one.
        path: Option<String>,
        /// The field, such as `containers.maxResources.memory`.
        key: String,
        /// Why the value cannot be used.
        #[source]
        source: crate::quantity::QuantityError,
    },
}

impl Policy {
    /// Parses a policy from YAML; absent fields keep their defaults, an empty document is the
    /// default policy.
    ///
    /// # Errors
    /// [`PolicyError::Parse`] on an unknown field or a wrong type, [`PolicyError::Invalid`] on
    /// a `containers.maxResources` value that is not a quantity.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        if text.trim().is_empty() {
            return Ok(Policy::default());
        }
        let policy: Policy = serde_yaml::from_str(text)
            .map_err(|source| PolicyError::Parse { path: None, source })?;
        policy
            .containers
            .validate()
            .map_err(|(key, source)| PolicyError::Invalid {
                path: None,
                key,
                source,
            })?;
        Ok(policy)
    }

    /// Reads a policy file (`--policy-file`).
    ///
    /// # Errors
    /// [`PolicyError::Read`] when unreadable, [`PolicyError::Parse`] when invalid.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Policy::from_yaml(&text).map_err(|e| match e {
            PolicyError::Parse { source, .. } => PolicyError::Parse {
                path: Some(path.display().to_string()),
                source,
            },
            PolicyError::Invalid { key, source, .. } => PolicyError::Invalid {
                path: Some(path.display().to_string()),
                key,
                source,
            },
            other => other,
        })
    }
}

/// Where a rule is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// In a Role of the vCluster's namespace.
    Namespaced,
    /// In a ClusterRole: cluster-wide.
    Cluster,
}

/// A rule as `{apiGroups: [..], resources: [..], verbs: [..]}` (plus resourceNames /
/// nonResourceURLs when present), for messages.
pub fn render(rule: &PolicyRule) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if let Some(g) = &rule.api_groups {
        parts.push(format!("apiGroups: [{}]", list(g)));
    }
    if let Some(r) = &rule.resources {
        parts.push(format!("resources: [{}]", list(r)));
    }
    if let Some(n) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
        parts.push(format!("resourceNames: [{}]", list(n)));
    }
    if let Some(u) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
        parts.push(format!("nonResourceURLs: [{}]", list(u)));
    }
    parts.push(format!("verbs: [{}]", list(&rule.verbs)));
    format!("{{{}}}", parts.join(", "))
}

fn matches_resource(listed: &str, resource: &str) -> bool {
    resource == listed || resource.split('/').next() == Some(listed)
}

/// The first reason `policy` refuses `rule` granted in `scope`, or `None` when allowed.
pub fn check_rule(policy: &Policy, scope: Scope, rule: &PolicyRule) -> Option<String> {
    let groups = rule.api_groups.as_deref().unwrap_or_default();
    let resources = rule.resources.as_deref().unwrap_or_default();
    let urls = rule.non_resource_urls.as_deref().unwrap_or_default();
    if !policy.allow_wildcards {
        for (field, values) in [
            ("apiGroups", groups),
            ("resources", resources),
            ("verbs", rule.verbs.as_slice()),
            ("nonResourceURLs", urls),
        ] {
            if let Some(v) = values.iter().find(|v| v.contains('*')) {
                return Some(format!(
                    "wildcard {v:?} in {field} (policy allowWildcards: false)"
                ));
            }
        }
    }
    let forbidden = &policy.forbidden_resources;
    let namespaced = first_refused(
        &rule.verbs,
        |v| {
            policy
                .forbidden_verbs
                .iter()
                .any(|f| f.eq_ignore_ascii_case(v))
        },
        |v| format!("verb {v:?}"),
        ("forbiddenVerbs", policy.forbidden_verbs.as_slice()),
    )
    .or_else(|| {
        first_refused(
            resources,
            |r| forbidden.iter().any(|f| matches_resource(f, r)),
            |r| format!("resource {r:?}"),
            ("forbiddenResources", forbidden.as_slice()),
        )
    });
    if namespaced.is_some() || scope != Scope::Cluster {
        return namespaced;
    }
    let cluster = &policy.cluster_scoped;
    first_refused(
        &rule.verbs,
        |v| !cluster.allowed_verbs.iter().any(|a| a == v || a == "*"),
        |v| format!("verb {v:?} in a cluster-scoped rule"),
        (
            "clusterScoped.allowedVerbs",
            cluster.allowed_verbs.as_slice(),
        ),
    )
    .or_else(|| {
        first_refused(
            resources,
            |r| {
                cluster.forbidden_resources.iter().any(|f| {
                    matches_resource(f, r) || (r.starts_with('*') && policy.allow_wildcards)
                })
            },
            |r| format!("cluster-wide access to {r:?}"),
            (
                "clusterScoped.forbiddenResources",
                cluster.forbidden_resources.as_slice(),
            ),
        )
    })
}

/// The first of `values` that `refused` holds for, as `what` says it, followed by the policy
/// `setting` (its name and its list) that refuses it.
fn first_refused(
    values: &[String],
    refused: impl Fn(&str) -> bool,
    what: impl Fn(&str) -> String,
    (setting, listed): (&str, &[String]),
) -> Option<String> {
    let v = values.iter().find(|v| refused(v))?;
    Some(format!(
        "{} (policy {setting}: {})",
        what(v),
        listed.join(", ")
    ))
}

/// Checks the container fields of `plugin` and every rule it would grant (see the module
/// docs) against `policy`, the derived rules with the resources discovery found (`plurals`,
/// from [`crate::cache::Discovery`]), then [`check_admitted_resources`].
///
/// A derived rule whose type is not served or is cluster-scoped cannot be granted at all: that
/// refusal (`UnknownType`, `ClusterScopedType`) is [`rbac::namespaced_rules`]'s, and the
/// derived namespaced rules are then not judged here.
///
/// # Errors
/// The first [`Denial`]: container fields first ([`containers::check`]), then extra rules (in
/// spec order), then the derived rules, then the admitted resources.
pub fn evaluate(policy: &Policy, plugin: &VClusterPlugin, plurals: &Plurals) -> Result<(), Denial> {
    containers::check(&policy.containers, plugin)?;
    let rbac_spec = plugin.spec.rbac.as_ref();
    let extras = [
        (
            Scope::Namespaced,
            "spec.rbac.role.extraRules",
            rbac_spec.and_then(|r| r.role.as_ref()),
        ),
        (
            Scope::Cluster,
            "spec.rbac.clusterRole.extraRules",
            rbac_spec.and_then(|r| r.cluster_role.as_ref()),
        ),
    ];
    for (scope, field, rules) in extras {
        for (i, rule) in rules
            .map(|r| r.extra_rules.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if let Some(reason) = check_rule(policy, scope, rule) {
                return Err(Denial {
                    source: format!("{field}[{i}]"),
                    reason,
                    rule: render(rule),
                });
            }
        }
    }
    // Derived rules, as granted: with the discovered plurals.
    let derived = [
        (
            Scope::Namespaced,
            rbac::namespaced_rules(plugin, plurals).unwrap_or_default(),
        ),
        (Scope::Cluster, rbac::cluster_rules(plugin)),
    ];
    for (scope, rules) in derived {
        for rule in &rules {
            if let Some(reason) = check_rule(policy, scope, rule) {
                return Err(Denial {
                    source: "a rule derived from spec.syncedTypes / spec.hooks".into(),
                    reason,
                    rule: render(rule),
                });
            }
        }
    }
    check_admitted_resources(plugin, plurals)
}

/// The resource the requester-bound admission policy (`config/admission/requester.yaml`) checks
/// the requester's rights on for a synced or hooked type of kind `kind`: `explicit`
/// (`syncedTypes[].resource`) when given, else [`guess_plural`] of the kind (admission has no
/// discovery).
pub fn admitted_resource(kind: &str, explicit: Option<&str>) -> String {
    explicit.map_or_else(|| guess_plural(kind), str::to_string)
}

/// Kubernetes' guess of a kind's plural, the one the admission policy makes
/// (`k8s.io/apimachinery/pkg/api/meta.UnsafeGuessKindToResource`; `Car` → `cars`, `Ingress` →
/// `ingresses`, `NetworkPolicy` → `networkpolicies`; a CRD may declare any other plural). One
/// definition, [`vcp_crds::admission_plural`], serves the CRD's admission rules and the
/// operator alike.
pub use vcp_crds::admission_plural as guess_plural;

/// The operator's re-check of admission: for every synced type, every kind brought back
/// (`produced`) and every hook on physical events that the host serves (`plurals`), the resource admission checked
/// ([`admitted_resource`]) must be the plural discovery returned, which is what the runtime
/// uses and the Role grants. Types not served are left to `UnknownType`.
///
/// # Errors
/// A [`Denial`] naming the field, both resources and the remedy (`syncedTypes[].resource`).
pub fn check_admitted_resources(plugin: &VClusterPlugin, plurals: &Plurals) -> Result<(), Denial> {
    let synced = plugin.spec.synced_types.iter().enumerate().map(|(i, t)| {
        (
            format!("spec.syncedTypes[{i}]"),
            &t.api_version,
            &t.kind,
            t.resource.as_deref(),
        )
    });
    let hooks = plugin
        .spec
        .hooks
        .iter()
        .enumerate()
        .filter(|(_, h)| h.events.iter().any(|e| e.is_physical()))
        .map(|(i, h)| (format!("spec.hooks[{i}]"), &h.api_version, &h.kind, None));
    let produced = rbac::produced_kinds(plugin).map(|(i, j, p)| {
        (
            format!("spec.syncedTypes[{i}].produced[{j}]"),
            &p.api_version,
            &p.kind,
            None,
        )
    });
    for (field, api_version, kind, explicit) in synced.chain(hooks).chain(produced) {
        let Some(served) = rbac::served(plurals, api_version, kind) else {
            continue;
        };
        let admitted = admitted_resource(kind, explicit);
        if served.plural != admitted {
            let remedy = if field.contains(".produced[") {
                "a produced kind of another plural cannot be admitted".to_string()
            } else if field.starts_with("spec.syncedTypes") {
                format!(
                    "set {field}.resource: {} so that admission checks the requester's rights on it",
                    served.plural
                )
            } else {
                "a hook on this kind cannot be admitted".to_string()
            };
            return Err(Denial {
                source: field,
                rule: format!("({api_version} {kind})"),
                reason: format!(
                    "the host API server serves it as resource {:?}, but admission checked the requester's rights on {admitted:?} ({}); {remedy}",
                    served.plural,
                    if explicit.is_some() {
                        "its resource field"
                    } else {
                        "Kubernetes' guess from the kind"
                    },
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
