//! *Decide*: the pure step of converging one vCluster ([`super`]). From what was observed
//! ([`Observed`]: the workload, the plugins installed into it, the cluster facts, the verdicts
//! of the hooks' judging and of the dry runs) and what the reconcile is for ([`Intent`]:
//! install a plugin, remove a deleted one, or re-apply the workload for the sweep), [`decide`]
//! computes the [`Plan`]: the workload's apply body, the verdict of every plugin of the
//! vCluster, what the reconciled plugin's RBAC becomes, its status and when to look again.
//! Nothing here talks to the API server; the unit tests (`vcluster/tests.rs`) run without one.
//!
//! The order of the refusals: the workload is not a
//! vCluster ([`crate::workload::vcluster_identity`]) → `NotAVCluster`; the policy
//! ([`crate::policy`], with the plurals discovery found) → `PolicyDenied`; the cluster state
//! ([`ClusterFacts::grant`]: `UnknownType`, `ClusterScopedType`, `VClusterRoleNotFound`,
//! `SharedVClusterRole`); the size budgets ([`crate::workload::budget`]: `TooLarge`, the
//! later-installed plugin); the hooks' judging, what the pods would ask for and the dry runs
//! (observed, [`Observed::judged`]: `PolicyDenied`, `ResourcesExceeded`, `InvalidWorkload`); conflicts among the plugins left
//! ([`crate::workload::plan`]: `Conflict`). They are judged for **every** plugin of the
//! vCluster, not only the one being reconciled, so every reconcile of the same workload (and
//! the cleanup of a deleted plugin, and the sweep) computes the same set of installed plugins:
//! no reconcile adds a refused plugin's container that its own reconcile would take out again,
//! and one bad plugin never keeps the others out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use vcp_crds::Reason;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use kube::ResourceExt;
use serde_json::Value;
use vcp_crds::{VClusterPlugin, WorkloadRef};

use crate::policy::{self, Policy};
use crate::rbac::{self, DesiredRbac, Plurals};
use crate::status::{Check, Outcome};
use crate::workload::{self, Refusal, Workload};

/// How often a converged plugin is reconciled again (drift the watches cannot see).
pub const RESYNC: Duration = Duration::from_secs(600);

/// How soon a plugin refused for the state of the cluster rather than its own spec
/// (`UnknownType`: a type the host does not serve; `VClusterRoleNotFound`: no Role bound to the
/// vCluster's service account; `SharedVClusterRole`: that Role is bound to others too;
/// `ResourcesExceeded`: the namespace's LimitRange or ResourceQuota, or the nodes) is
/// judged again. The CRD or RoleBinding that resolves the refusal is
/// not watched for this plugin (it is not the plugin's own; of the namespace's Roles only those
/// of a plugin in `PatchVClusterRoles` mode are, [`crate::patched_roles`]), so without this the
/// plugin would wait for [`RESYNC`].
pub const RECHECK: Duration = Duration::from_secs(20);

/// What a reconcile converges the vCluster for: the inputs of [`decide`] besides what was
/// observed.
#[derive(Clone, Copy, Debug)]
pub enum Intent<'a> {
    /// Install this plugin (not being deleted, carrying the finalizer `vcp.dev/cleanup`): its
    /// part of the workload, its RBAC and its status.
    Install(&'a VClusterPlugin),
    /// Remove what was added for this plugin (being deleted, carrying the finalizer): the
    /// workload is applied without it ([`Observed::plugins`] does not hold it) and its RBAC
    /// objects and Role entries are removed. Its `Terminating` status ([`terminating`]) is
    /// written before anything else is read.
    Delete(&'a VClusterPlugin),
    /// Apply the workload again from the plugins that exist (the sweep, [`crate::sweep`]).
    Sweep,
}

/// What was observed about one vCluster whose workload exists ([`super::observe::vcluster`]).
#[derive(Clone, Debug)]
pub struct Observed {
    /// The vCluster's workload (from the watch caches for an install, from the API server for
    /// a delete and the sweep).
    pub workload: Workload,
    /// The plugins installed into the workload ([`crate::workload::contributes`]), less the
    /// one being deleted: the watch cache's copies themselves, shared, not copies of them
    /// (up to 16 reconciles at once each held a copy of every plugin of a
    /// tenant's vCluster, 900 MiB for 32 plugins of 700 KB of config, until they returned).
    pub plugins: Vec<Arc<VClusterPlugin>>,
    /// The cluster state the refusals depend on.
    pub facts: ClusterFacts,
    /// The refusals, by plugin name, of the hooks' judging ([`crate::judge::hooks`]) and of
    /// the server-side dry runs ([`crate::judge`]), made for the plugins [`admitted`] lets in.
    pub judged: BTreeMap<String, Refusal>,
}

/// What the reconciled plugin's RBAC becomes.
#[derive(Clone, Debug)]
pub enum RbacPlan {
    /// Nothing is written (no workload yet, or the sweep).
    Keep,
    /// Not refused: its objects are applied when they differ, and in
    /// `rbac.mode: PatchVClusterRoles` its rules are appended to the vCluster's Role.
    Grant(Box<Grant>),
    /// Refused: it gets nothing, and loses what an earlier generation was given (its objects,
    /// from the caches, and its entries in the vCluster's Roles).
    Revoke,
    /// Deleted: its objects are deleted by name and its entries taken out of every Role of
    /// the namespace, all read from the API server.
    Remove,
}

/// Everything one reconcile writes for a vCluster, and what it reports.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload's server-side-apply body ([`crate::workload::plan`]), sent unless already
    /// converged; `None` when there is no workload.
    pub workload: Option<Value>,
    /// The verdict of every plugin of [`Observed::plugins`] by name: what it is given, or why
    /// it is refused (the condition [`Intent::Install`] would report for it).
    pub verdicts: BTreeMap<String, Result<Grant, Check>>,
    /// What the reconciled plugin's RBAC becomes.
    pub rbac: RbacPlan,
    /// The reconciled plugin's status ([`Intent::Install`] only: a deleted plugin's is
    /// [`terminating`], written first).
    pub status: Option<Outcome>,
    /// When to reconcile the plugin again: `None` waits for a change.
    pub requeue: Option<Duration>,
}

/// The plugins of `plugins` (all of `wl`'s) that the cluster facts, the policy and the size
/// budgets let in, in their given order, and the plugins over the budgets with their
/// `TooLarge` refusals. The hooks' judging and the dry runs judge only the plugins let in.
pub fn admitted<'a>(
    wl: &Workload,
    facts: &ClusterFacts,
    policy: &Policy,
    plugins: &[&'a VClusterPlugin],
    runtime_image: &str,
) -> (Vec<&'a VClusterPlugin>, BTreeMap<String, Refusal>) {
    workload::budget::admit(wl, facts.accepted(policy, plugins), runtime_image)
}

/// The plan of one reconcile of a vCluster: `observed` is `None` when the vCluster has no
/// workload (neither StatefulSet nor Deployment). See the module docs for the order of the
/// refusals.
pub fn decide(
    observed: Option<&Observed>,
    intent: Intent<'_>,
    policy: &Policy,
    runtime_image: &str,
) -> Plan {
    let Some(observed) = observed else {
        return without_workload(intent);
    };
    let wl = &observed.workload;
    let facts = &observed.facts;
    let refs: Vec<&VClusterPlugin> = observed.plugins.iter().map(|p| &**p).collect();
    let (sized, too_large) = admitted(wl, facts, policy, &refs, runtime_image);
    let installed: Vec<&VClusterPlugin> = sized
        .into_iter()
        .filter(|p| !observed.judged.contains_key(&p.name_any()))
        .collect();
    let planned = workload::plan(wl, &installed, runtime_image);
    let verdict = |p: &VClusterPlugin| -> Result<Grant, Check> {
        let grant = facts.verdict(policy, p)?;
        let name = p.name_any();
        match observed
            .judged
            .get(&name)
            .or_else(|| too_large.get(&name))
            .or_else(|| planned.refused.get(&name))
        {
            Some(r) => Err(Check::failed(r.reason, r.message.clone())),
            None => Ok(grant),
        }
    };
    let verdicts = observed
        .plugins
        .iter()
        .map(|p| (p.name_any(), verdict(p.as_ref())))
        .collect();
    let (rbac, status, requeue) = match intent {
        Intent::Install(plugin) => {
            let (rbac, check) = match verdict(plugin) {
                Ok(grant) => (RbacPlan::Grant(Box::new(grant)), Check::Ok),
                Err(refused) => (RbacPlan::Revoke, refused),
            };
            let outcome = Outcome {
                workload: Some(workload_ref(wl)),
                workload_patched: check.clone(),
                rbac: check,
                terminating: false,
                rollout: None,
            };
            let requeue = next_reconcile(&outcome.rbac);
            (rbac, Some(outcome), Some(requeue))
        }
        Intent::Delete(_) => (RbacPlan::Remove, None, None),
        Intent::Sweep => (RbacPlan::Keep, None, None),
    };
    Plan {
        workload: Some(planned.patch),
        verdicts,
        rbac,
        status,
        requeue,
    }
}

/// The plan when the vCluster has no workload: an install reports `VClusterNotFound` and
/// creates nothing (it is installed once the vCluster exists); a delete still removes the
/// plugin's RBAC (a missing workload does not block it).
fn without_workload(intent: Intent<'_>) -> Plan {
    let (rbac, status, requeue) = match intent {
        Intent::Install(plugin) => {
            let namespace = plugin.namespace().unwrap_or_default();
            let vcluster = &plugin.spec.vcluster.name;
            let missing = Check::failed(
                Reason::VClusterNotFound,
                format!(
                    "no StatefulSet or Deployment named {vcluster} in namespace {namespace}; the plugin is installed once the vCluster exists"
                ),
            );
            let outcome = Outcome {
                workload: None,
                workload_patched: missing.clone(),
                rbac: missing,
                terminating: false,
                rollout: None,
            };
            (RbacPlan::Keep, Some(outcome), Some(RESYNC))
        }
        Intent::Delete(_) => (RbacPlan::Remove, None, None),
        Intent::Sweep => (RbacPlan::Keep, None, None),
    };
    Plan {
        workload: None,
        verdicts: BTreeMap::new(),
        rbac,
        status,
        requeue,
    }
}

/// The status of a plugin being deleted, written before its removal: `Terminating`, naming
/// the workload when there is one.
pub fn terminating(wl: Option<&Workload>) -> Outcome {
    Outcome {
        workload: wl.map(workload_ref),
        workload_patched: Check::Ok,
        rbac: Check::Ok,
        terminating: true,
        rollout: None,
    }
}

/// The status's reference to `wl`.
fn workload_ref(wl: &Workload) -> WorkloadRef {
    WorkloadRef {
        kind: wl.kind_str().into(),
        name: wl.name.clone(),
    }
}

/// When to reconcile a plugin again after its install path ended with `rbac`: [`RECHECK`] when
/// it was refused for the cluster's state (see there), else [`RESYNC`].
pub fn next_reconcile(rbac: &Check) -> Duration {
    match rbac {
        Check::Failed { reason, .. }
            if Reason::parse(reason).is_some_and(|r| {
                matches!(
                    r,
                    Reason::UnknownType
                        | Reason::VClusterRoleNotFound
                        | Reason::SharedVClusterRole
                        | Reason::ResourcesExceeded
                )
            }) =>
        {
            RECHECK
        }
        _ => RESYNC,
    }
}

/// What one plugin is given when it is not refused: its RBAC objects and, in
/// `rbac.mode: PatchVClusterRoles`, the vCluster Role to append to with the rules to append.
#[derive(Clone, Debug, Default)]
pub struct Grant {
    /// The plugin's own RBAC objects ([`rbac::desired`]).
    pub rbac: DesiredRbac,
    /// `PatchVClusterRoles` only: the Role bound to the vCluster's service account and the
    /// plugin's rules.
    pub vcluster_role: Option<(String, Vec<PolicyRule>)>,
}

/// The cluster state the refusals of the plugins of one vCluster depend on, read once per
/// reconcile (discovery results are shared by every plugin of the vCluster):
/// - whether the workload is a vCluster, and the service account its pod template runs as
///   ([`workload::vcluster_identity`]); not a vCluster is refused with `NotAVCluster`, and
///   nothing else is read;
/// - the plurals and scopes of the types the plugins name
///   ([`crate::cache::Discovery::plurals_of`]); a type missing here is refused with
///   `UnknownType`, a cluster-scoped one with `ClusterScopedType`; the policy judges the rules
///   derived with these plurals;
/// - when some plugin uses `rbac.mode: PatchVClusterRoles`, the Role bound to the vCluster's
///   service account ([`find_vcluster_role`], from the namespace's Roles and RoleBindings
///   listed from the API server: the watch caches hold only the plugins' own); none is
///   refused with `VClusterRoleNotFound`, one bound to anyone else too with
///   `SharedVClusterRole`.
///
/// Every reconcile of a workload judges all its plugins from these facts, so they agree on
/// which plugins are installed (a refusal leaves the workload untouched).
#[derive(Clone, Debug)]
pub struct ClusterFacts {
    /// The service account the vCluster's pod template runs as (the RBAC subject), or why
    /// the workload is not a vCluster.
    pub service_account: std::result::Result<String, Refusal>,
    /// Plurals and scopes of the served types among those the plugins name.
    pub plurals: Plurals,
    /// The vCluster Role `PatchVClusterRoles` appends to, or why there is none; `None` when
    /// no plugin read with [`super::observe::cluster_facts`] uses that mode.
    pub vcluster_role: Option<std::result::Result<String, Refusal>>,
    /// Every Role of the vCluster's namespace as listed to find the vCluster Role; `None`
    /// when not listed (no plugin uses `PatchVClusterRoles`, or not a vCluster).
    pub roles: Option<Vec<Role>>,
}

impl ClusterFacts {
    /// Whether `plugin` is installed, with what, or why not as its condition: not a vCluster
    /// (`NotAVCluster`), a patch path that cannot be used (`InvalidConfig`), the policy (`PolicyDenied`, judged on the discovered plurals), then
    /// the cluster state ([`ClusterFacts::grant`]), then a synced type of a kind Kubernetes
    /// serves itself other than `ConfigMap` (`PolicyDenied`, [`vcp_crds::built_in`]).
    /// Conflicts are judged by [`workload::plan`].
    ///
    /// # Errors
    /// The failed [`Check`].
    pub fn verdict(
        &self,
        policy: &Policy,
        plugin: &VClusterPlugin,
    ) -> std::result::Result<Grant, Check> {
        if let Err(r) = &self.service_account {
            return Err(Check::failed(r.reason, r.message.clone()));
        }
        if let Some(r) = foreign_mappings(plugin) {
            return Err(Check::failed(r.reason, r.message));
        }
        // patch paths the CRD's CEL cannot parse (vcp_crds::patch_path): the runtime could not
        // apply them
        let unusable = vcp_crds::patch_path::unusable_patch_paths(&plugin.spec.synced_types);
        if !unusable.is_empty() {
            return Err(Check::failed(Reason::InvalidConfig, unusable.join("; ")));
        }
        policy::evaluate(policy, plugin, &self.plurals)
            .map_err(|d| Check::failed(Reason::PolicyDenied, d.message()))?;
        let grant = self
            .grant(plugin)
            .map_err(|r| Check::failed(r.reason, r.message))?;
        // what the runtime would write: a kind Kubernetes acts on by content is not synced
        // (vcp_crds::built_in), judged after the cluster state so that a type the host does not
        // serve or a cluster-scoped one keeps its own reason
        if let Some(message) = plugin
            .spec
            .synced_types
            .iter()
            .enumerate()
            .find_map(|(i, t)| vcp_crds::built_in::refusal(i, t))
        {
            return Err(Check::failed(Reason::PolicyDenied, message));
        }
        Ok(grant)
    }

    /// What `plugin` is given, or why the cluster state refuses it (`NotAVCluster`,
    /// `UnknownType`, `ClusterScopedType`, `VClusterRoleNotFound`, `SharedVClusterRole`).
    /// Policy and conflicts are judged elsewhere.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn grant(&self, plugin: &VClusterPlugin) -> std::result::Result<Grant, Refusal> {
        let sa = self.service_account.as_ref().map_err(Clone::clone)?;
        let desired = rbac::desired(plugin, &self.plurals, sa)?;
        let namespaced = rbac::namespaced_rules(plugin, &self.plurals)?;
        let vcluster_role = if rbac::patches_vcluster_roles(plugin) {
            match &self.vcluster_role {
                Some(Ok(role)) => Some((role.clone(), namespaced)),
                Some(Err(r)) => return Err(r.clone()),
                // Not read: the plugin was not among those given to `read`.
                None => {
                    return Err(Refusal {
                        reason: Reason::VClusterRoleNotFound,
                        message: "the vCluster's Roles were not read".into(),
                    });
                }
            }
        } else {
            None
        };
        Ok(Grant {
            rbac: desired,
            vcluster_role,
        })
    }

    /// The plugins of `plugins` that [`ClusterFacts::verdict`] does not refuse.
    pub fn accepted<'a>(
        &self,
        policy: &Policy,
        plugins: &[&'a VClusterPlugin],
    ) -> Vec<&'a VClusterPlugin> {
        plugins
            .iter()
            .copied()
            .filter(|p| self.verdict(policy, p).is_ok())
            .collect()
    }
}

/// Why `plugin` is refused when a `FromHost` type's `mappings.byName` names a host namespace
/// other than the plugin's own (the vCluster's host namespace): a [`Refusal`] with
/// [`ForeignNamespace`](vcp_crds::Reason::ForeignNamespace) naming the field and the keys. The
/// embedded runtime only ever reads its own host namespace (a Role suffices), and a mapping
/// must not reach objects its author could not read themselves (the README, "Trust");
/// admission refuses it too (`config/admission/requester.yaml`), the
/// operator judges it again for plugins written without that policy.
pub fn foreign_mappings(plugin: &VClusterPlugin) -> Option<Refusal> {
    let namespace = plugin.metadata.namespace.as_deref().unwrap_or_default();
    plugin
        .spec
        .synced_types
        .iter()
        .enumerate()
        .find_map(|(i, t)| {
            let keys = t.mappings.as_ref()?.foreign_keys(namespace);
            (!keys.is_empty()).then(|| Refusal {
                reason: Reason::ForeignNamespace,
                message: format!(
                    "spec.syncedTypes[{i}].mappings.byName: {} name(s) a host namespace other than the plugin's ({namespace}); a mapping may only copy objects of the vCluster's own host namespace, which is all the runtime reads",
                    keys.iter()
                        .map(|k| format!("{k:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
        })
}

/// The Role `rbac.mode: PatchVClusterRoles` appends to in `namespace`: the one a RoleBinding
/// binds to the vCluster's service account `service_account` ([`rbac::target_role`]), when it
/// exists and no RoleBinding binds it to anyone else ([`rbac::other_subjects`]); `bindings`
/// and `roles` are every RoleBinding and Role of `namespace`.
///
/// Returns a [`Refusal`] with [`VClusterRoleNotFound`](vcp_crds::Reason::VClusterRoleNotFound) when no Role is bound to the
/// service account, or the bound Role does not exist; with [`SharedVClusterRole`](vcp_crds::Reason::SharedVClusterRole) when
/// the Role is bound to other subjects too (appending would widen them).
pub fn find_vcluster_role(
    bindings: &[RoleBinding],
    roles: &[Role],
    namespace: &str,
    vcluster: &str,
    service_account: &str,
) -> std::result::Result<String, Refusal> {
    let sa = service_account;
    let Some(target) = rbac::target_role(bindings, namespace, vcluster, sa) else {
        return Err(Refusal {
            reason: Reason::VClusterRoleNotFound,
            message: format!(
                "no RoleBinding in {namespace} binds a Role to ServiceAccount {sa}, so rbac.mode PatchVClusterRoles has no Role to append to; use rbac.mode Dedicated"
            ),
        });
    };
    let exists = roles
        .iter()
        .any(|r| r.metadata.namespace.as_deref() == Some(namespace) && r.name_any() == target);
    if !exists {
        return Err(Refusal {
            reason: Reason::VClusterRoleNotFound,
            message: format!(
                "a RoleBinding binds ServiceAccount {sa} to Role {target}, which does not exist in {namespace}; rbac.mode PatchVClusterRoles appends to it"
            ),
        });
    }
    let others = rbac::other_subjects(bindings, namespace, &target, sa);
    if !others.is_empty() {
        return Err(Refusal {
            reason: Reason::SharedVClusterRole,
            message: format!(
                "Role {target} in {namespace} is bound to {} besides ServiceAccount {sa}: rbac.mode PatchVClusterRoles would grant the plugin's rules to them too; use rbac.mode Dedicated, or bind that Role to the vCluster's service account only",
                others.join(", ")
            ),
        });
    }
    Ok(target)
}

#[cfg(test)]
mod foreign_mapping_tests {
    use super::*;
    use std::collections::BTreeMap;
    use vcp_crds::{FromHostMappings, SyncDirection, SyncedType, VClusterPluginSpec, VClusterRef};

    fn plugin(by_name: &[(&str, &str)]) -> VClusterPlugin {
        let mut p = VClusterPlugin::new(
            "import",
            VClusterPluginSpec {
                vcluster: VClusterRef { name: "vc".into() },
                synced_types: vec![SyncedType {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    direction: SyncDirection::FromHost,
                    mappings: Some(FromHostMappings {
                        by_name: by_name
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect::<BTreeMap<_, _>>(),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("team-a".into());
        p
    }

    /// vCluster's key shapes (`config.FromHostMappings`): `ns/name`, `ns/*` with `ns` the
    /// plugin's namespace, and `/name`, `""`, which mean the vCluster's host namespace, pass;
    /// any other host namespace is refused with `ForeignNamespace`, naming the keys.
    #[test]
    fn mappings_may_only_read_the_plugins_namespace() {
        for own in [
            vec![("team-a/*", "a/*")],
            vec![("team-a/cm", "a/cm2"), ("/other", "b/x"), ("", "c")],
        ] {
            assert!(foreign_mappings(&plugin(&own)).is_none(), "{own:?}");
        }
        let refused = foreign_mappings(&plugin(&[
            ("team-a/*", "a/*"),
            ("kube-system/*", "a/*"),
            ("team-b/token", "a/token"),
        ]))
        .expect("refused");
        assert_eq!(refused.reason, Reason::ForeignNamespace);
        assert_eq!(
            refused.message,
            "spec.syncedTypes[0].mappings.byName: \"kube-system/*\", \"team-b/token\" name(s) a host namespace other than the plugin's (team-a); a mapping may only copy objects of the vCluster's own host namespace, which is all the runtime reads"
        );
    }
}
