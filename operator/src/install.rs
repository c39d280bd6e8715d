//! The install path of a `VClusterPlugin` that is not being deleted (DESIGN.md, "Operator
//! contract"), in the order [`install`] runs it:
//! 0. add the finalizer `vcp.dev/cleanup` when missing ([`crate::finalizer`]: to this plugin,
//!    and, once the workload is found, to the other plugins of the vCluster that lack it, so
//!    that the workload is applied once with all of them), and go on in the same reconcile;
//! 1. find the vCluster workload (StatefulSet, else Deployment, named `spec.vcluster.name`);
//!    none → `Ready=False, reason=VClusterNotFound`, an Event, and nothing created;
//! 2. decide every refusal before any write, from facts read once per reconcile
//!    ([`ClusterFacts`]), in this order ([`ClusterFacts::verdict`]): the workload is not a
//!    vCluster ([`crate::workload::vcluster_identity`]) → `NotAVCluster` (and nothing is read
//!    further); the policy ([`crate::policy`], with the plurals discovery found) →
//!    `PolicyDenied`; the cluster state: a type the host does not serve → `UnknownType`, a
//!    cluster-scoped one → `ClusterScopedType`, `rbac.mode: PatchVClusterRoles` with no Role
//!    bound to the vCluster's service account → `VClusterRoleNotFound`, or with that Role bound
//!    to anyone else too → `SharedVClusterRole`. They are judged for **every** plugin of the
//!    vCluster, not only the one being reconciled;
//!    a plugin whose part would cross the size budgets ([`crate::workload::budget`]) →
//!    `TooLarge`, the later-installed one; what the plugins' hooks do to a representative pod
//!    of the vCluster and to any object's identity is judged next ([`judge_parts`],
//!    [`crate::judge::hooks`]: `PolicyDenied`);
//!    the API server then judges each remaining plugin's part by server-side dry runs
//!    ([`judge_parts`], [`crate::judge`]: a part it refuses → `InvalidWorkload`; a container
//!    that would break the namespace's Pod Security level → `PolicyDenied`), and conflicts are
//!    decided among the plugins left ([`crate::workload::plan`]). Every reconcile of the same
//!    workload (and the cleanup of a deleted plugin) thus computes the same set of installed
//!    plugins, so no reconcile adds a refused plugin's container that its own reconcile would
//!    take out again, and one bad plugin never keeps the others out;
//! 3. compute the apply body of that workload from all plugins not refused and apply it,
//!    unless already converged ([`crate::writes::apply_workload`]);
//! 4. a plugin that is not refused gets its RBAC objects ([`crate::rbac::desired`], bound to the
//!    service account the vCluster's pod template runs as) that differ
//!    from the live ones (or its rules appended to the vCluster's Role,
//!    [`sync_vcluster_roles`]); a refused one gets nothing, and loses what an earlier
//!    generation was given (as on delete);
//! 5. apply the operator's status fields, unless unchanged ([`crate::status`],
//!    [`crate::writes::write_status`]); requeue after [`RESYNC`], or [`RECHECK`] when refused
//!    for the state of the cluster ([`next_reconcile`]).
//!
//! The vCluster's Roles (`rbac.mode: PatchVClusterRoles`) are found here too
//! ([`find_vcluster_role`]) and restored by [`sync_vcluster_roles`], which the cleanup uses.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::info;
use vcp_crds::{FINALIZER, OPERATOR_FIELD_MANAGER, VClusterPlugin, WorkloadRef};

use crate::cache;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::finalizer::with_finalizer;
use crate::policy::{self, Policy};
use crate::rbac::{self, DesiredRbac, Plurals};
use crate::status::{self, Check, Outcome};
use crate::workload::{self, Refusal, Workload};
use crate::writes::{ApiDryRun, apply_rbac, apply_workload, write_status};

/// How often a converged plugin is reconciled again (drift the watches cannot see).
pub const RESYNC: Duration = Duration::from_secs(600);

/// How soon a plugin refused for the state of the cluster rather than its own spec
/// (`UnknownType`: a type the host does not serve; `VClusterRoleNotFound`: no Role bound to the
/// vCluster's service account; `SharedVClusterRole`: that Role is bound to others too) is
/// judged again. The CRD or Role that resolves the refusal is
/// not watched for this plugin (it is not the plugin's own), so without this the plugin would
/// wait for [`RESYNC`].
pub const RECHECK: Duration = Duration::from_secs(20);

/// The install path of a plugin that is not being deleted (the steps: see the module docs).
///
/// Under the workload's lock, the finalizer is added first to this plugin and then to every
/// other plugin of the vCluster that lacks it and is not being deleted (each would add it in
/// its own reconcile before anything is installed for it): the workload is then planned with
/// all of them and applied once, instead of once per plugin as each gains its finalizer.
///
/// # Errors
/// API errors (the finalizer patches, discovery, the writes); the controller retries.
pub async fn install(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = lock.lock().await;
    // The cached copy may be newer than the one this reconcile was started with (another
    // reconcile of the vCluster may have added its finalizer meanwhile).
    let Some(latest) = ctx.plugins.get(&ObjectRef::from_obj(plugin)) else {
        // Gone since this reconcile started (deleted without the finalizer): nothing may be
        // written for it; the sweep (`crate::sweep`) removes what it had.
        return Ok(Action::await_change());
    };
    let latest = (*latest).clone();
    if latest.metadata.deletion_timestamp.is_some() {
        // Deleted since this reconcile started: the deletion's own trigger runs the cleanup.
        return Ok(Action::await_change());
    }
    let plugin = &with_finalizer(ctx, &latest).await?;
    let Some(wl) = cache::workload(
        &ctx.client,
        &ctx.caches,
        &ctx.written,
        &namespace,
        &vcluster,
    )
    .await?
    else {
        drop(guard);
        let missing = Check::failed(
            status::REASON_VCLUSTER_NOT_FOUND,
            format!(
                "no StatefulSet or Deployment named {vcluster} in namespace {namespace}; the plugin is installed once the vCluster exists"
            ),
        );
        let outcome = Outcome {
            workload: None,
            workload_patched: missing.clone(),
            rbac: missing,
            terminating: false,
        };
        write_status(plugin, &outcome, ctx).await?;
        return Ok(Action::requeue(RESYNC));
    };

    let mut fresher = vec![plugin.clone()];
    let unfinalized: Vec<Arc<VClusterPlugin>> = ctx
        .plugins
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(namespace.as_str())
                && p.spec.vcluster.name == vcluster
                && p.name_any() != plugin.name_any()
                && p.metadata.deletion_timestamp.is_none()
                && !p.finalizers().iter().any(|f| f == FINALIZER)
        })
        .collect();
    for other in unfinalized {
        fresher.push(with_finalizer(ctx, &other).await?);
    }

    // Every refusal is decided before the workload is written (see the module docs).
    let candidates = candidates(ctx, &namespace, &vcluster, &fresher, None);
    let refs: Vec<&VClusterPlugin> = candidates.iter().collect();
    let facts = ClusterFacts::read(ctx, &wl, &refs).await?;
    // Size budgets before the dry runs (`TooLarge`: `workload::budget`).
    let (sized, too_large) =
        workload::budget::admit(&wl, facts.accepted(&ctx.policy, &refs), &ctx.runtime_image);
    let (installed, mut judged) = judge_parts(ctx, &wl, sized).await?;
    judged.extend(too_large);
    let plan = workload::plan(&wl, &installed, &ctx.runtime_image);
    apply_workload(ctx, &wl, &plan.patch).await?;
    drop(guard);

    let grant = facts.verdict(&ctx.policy, plugin).and_then(|g| {
        match judged
            .get(&plugin.name_any())
            .or_else(|| plan.refused.get(&plugin.name_any()))
        {
            Some(r) => Err(Check::failed(r.reason, r.message.clone())),
            None => Ok(g),
        }
    });
    let (workload_patched, rbac) = match grant {
        Ok(grant) => {
            apply_rbac(ctx, plugin, grant.rbac).await?;
            let target = grant
                .vcluster_role
                .as_ref()
                .map(|(role, rules)| (role.as_str(), rules.as_slice()));
            let roles = roles_to_sync(ctx, plugin, &facts).await?;
            sync_vcluster_roles(ctx, plugin, target, roles).await?;
            (Check::Ok, Check::Ok)
        }
        Err(refused) => {
            // A refused plugin gets nothing, and loses what an earlier generation was given:
            // its own Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules it
            // appended to the vCluster's Roles (reads only when there is nothing to remove).
            apply_rbac(ctx, plugin, DesiredRbac::default()).await?;
            let roles = roles_to_sync(ctx, plugin, &facts).await?;
            sync_vcluster_roles(ctx, plugin, None, roles).await?;
            (refused.clone(), refused)
        }
    };
    let outcome = Outcome {
        workload: Some(WorkloadRef {
            kind: wl.kind_str().into(),
            name: wl.name.clone(),
        }),
        workload_patched,
        rbac,
        terminating: false,
    };
    write_status(plugin, &outcome, ctx).await?;
    Ok(Action::requeue(next_reconcile(&outcome.rbac)))
}

/// The Roles of the plugin's namespace that [`sync_vcluster_roles`] must look at: all of them
/// (those [`ClusterFacts::read`] listed, else listed now) when the plugin uses
/// `rbac.mode: PatchVClusterRoles` or its spec changed since the status was last written
/// (`status.observedGeneration`: it may have left that mode, and its added rules must come
/// out); else the cached ones (labelled as made for a plugin, [`crate::cache`]), for a plugin
/// that has been in `rbac.mode: Dedicated` since its status was written has no rules in any
/// other Role.
///
/// # Errors
/// The API server's answer to the list.
async fn roles_to_sync(
    ctx: &Context,
    plugin: &VClusterPlugin,
    facts: &ClusterFacts,
) -> Result<Vec<Role>> {
    let namespace = plugin.namespace().unwrap_or_default();
    if let Some(roles) = &facts.roles {
        return Ok(roles.clone());
    }
    let observed = plugin.status.as_ref().and_then(|s| s.observed_generation);
    if rbac::patches_vcluster_roles(plugin) || observed != plugin.metadata.generation {
        return list_roles(&ctx.client, &namespace).await;
    }
    Ok(ctx.caches.roles_in(&namespace))
}

/// The plugins of `accepted` (all those of `wl` that policy and cluster state let in) whose
/// part of `wl` the API server takes, and the refusals of the others by name
/// ([`crate::judge`]: server-side dry runs, made only when the body or the workload changed;
/// verdicts are kept in [`Context::verdicts`]).
///
/// # Errors
/// The dry runs' errors other than a refusal.
pub async fn judge_parts<'a>(
    ctx: &Context,
    wl: &Workload,
    accepted: Vec<&'a VClusterPlugin>,
) -> Result<(Vec<&'a VClusterPlugin>, BTreeMap<String, Refusal>)> {
    let dry = ApiDryRun(&ctx.client);
    // What the plugins' hooks do to the vCluster's pods first (issue 21): a refused plugin's
    // part is then not judged, nor installed.
    let hooked = ctx
        .verdicts
        .hook_refusals(&dry, wl, &accepted, &ctx.policy.containers)
        .await?;
    let accepted: Vec<&VClusterPlugin> = accepted
        .into_iter()
        .filter(|p| !hooked.contains_key(&p.name_any()))
        .collect();
    let mut refused = ctx
        .verdicts
        .refusals(&dry, wl, &accepted, &ctx.runtime_image)
        .await?;
    refused.extend(hooked);
    let kept = accepted
        .into_iter()
        .filter(|p| !refused.contains_key(&p.name_any()))
        .collect();
    Ok((kept, refused))
}

/// When to reconcile a plugin again after its install path ended with `rbac`: [`RECHECK`] when
/// it was refused for the cluster's state (see there), else [`RESYNC`].
pub fn next_reconcile(rbac: &Check) -> Duration {
    match rbac {
        Check::Failed { reason, .. }
            if reason == rbac::REASON_UNKNOWN_TYPE
                || reason == rbac::REASON_NO_VCLUSTER_ROLE
                || reason == rbac::REASON_SHARED_ROLE =>
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

/// The plugins installed into `vcluster` of `namespace` according to the watch cache
/// ([`workload::contributes`]), except `without`, with the copies in `fresher` (newer than the
/// cache, such as the answers to the finalizer patches) in place of their cached ones. Which of
/// them are refused is decided by [`ClusterFacts::verdict`].
pub fn candidates(
    ctx: &Context,
    namespace: &str,
    vcluster: &str,
    fresher: &[VClusterPlugin],
    without: Option<&str>,
) -> Vec<VClusterPlugin> {
    let is_fresher = |p: &VClusterPlugin| {
        fresher
            .iter()
            .any(|f| f.name_any() == p.name_any() && f.namespace() == p.namespace())
    };
    let cached = ctx.plugins.state();
    cached
        .iter()
        .filter(|p| workload::contributes(p, namespace, vcluster))
        .filter(|p| !is_fresher(p))
        .map(|p| (**p).clone())
        .chain(
            fresher
                .iter()
                .filter(|p| workload::contributes(p, namespace, vcluster))
                .cloned(),
        )
        .filter(|p| without.is_none_or(|w| p.name_any() != w))
        .collect()
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
/// which plugins are installed (DESIGN.md: a refusal "leaves the workload untouched").
#[derive(Clone, Debug)]
pub struct ClusterFacts {
    /// The service account the vCluster's pod template runs as (the RBAC subject), or why
    /// the workload is not a vCluster.
    pub service_account: std::result::Result<String, Refusal>,
    /// Plurals and scopes of the served types among those the plugins name.
    pub plurals: Plurals,
    /// The vCluster Role `PatchVClusterRoles` appends to, or why there is none; `None` when
    /// no plugin read with [`ClusterFacts::read`] uses that mode.
    pub vcluster_role: Option<std::result::Result<String, Refusal>>,
    /// Every Role of the vCluster's namespace as listed to find the vCluster Role; `None`
    /// when not listed (no plugin uses `PatchVClusterRoles`, or not a vCluster).
    pub roles: Option<Vec<Role>>,
}

impl ClusterFacts {
    /// Reads the facts `plugins` (all of the vCluster whose workload is `wl`) depend on: the
    /// workload's identity, plurals from [`Context::discovery`], and, when some plugin uses
    /// `rbac.mode: PatchVClusterRoles`, the namespace's Roles and RoleBindings from the API
    /// server (one list of each). Not a vCluster: nothing is read.
    ///
    /// # Errors
    /// Discovery failures other than "not served"; the API server's answers to the lists.
    pub async fn read(ctx: &Context, wl: &Workload, plugins: &[&VClusterPlugin]) -> Result<Self> {
        let service_account = workload::vcluster_identity(wl);
        let Ok(sa) = &service_account else {
            return Ok(Self {
                service_account,
                plurals: Plurals::new(),
                vcluster_role: None,
                roles: None,
            });
        };
        let plurals = ctx.discovery.plurals_of(&ctx.client, plugins).await?;
        let (vcluster_role, roles) = if plugins.iter().any(|p| rbac::patches_vcluster_roles(p)) {
            let roles = list_roles(&ctx.client, &wl.namespace).await?;
            let bindings = list_role_bindings(&ctx.client, &wl.namespace).await?;
            let found = find_vcluster_role(&bindings, &roles, &wl.namespace, &wl.name, sa);
            (Some(found), Some(roles))
        } else {
            (None, None)
        };
        Ok(Self {
            service_account,
            plurals,
            vcluster_role,
            roles,
        })
    }

    /// Whether `plugin` is installed, with what, or why not as its condition: not a vCluster
    /// (`NotAVCluster`), the policy (`PolicyDenied`, judged on the discovered plurals), then
    /// the cluster state ([`ClusterFacts::grant`]). Conflicts are judged by
    /// [`workload::plan`].
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
        policy::evaluate(policy, plugin, &self.plurals)
            .map_err(|d| Check::failed(policy::REASON_POLICY_DENIED, d.message()))?;
        self.grant(plugin)
            .map_err(|r| Check::failed(r.reason, r.message))
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
                        reason: rbac::REASON_NO_VCLUSTER_ROLE,
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

/// The Role `rbac.mode: PatchVClusterRoles` appends to in `namespace`: the one a RoleBinding
/// binds to the vCluster's service account `service_account` ([`rbac::target_role`]), when it
/// exists and no RoleBinding binds it to anyone else ([`rbac::other_subjects`]); `bindings`
/// and `roles` are every RoleBinding and Role of `namespace`.
///
/// Returns a [`Refusal`] with [`rbac::REASON_NO_VCLUSTER_ROLE`] when no Role is bound to the
/// service account, or the bound Role does not exist; with [`rbac::REASON_SHARED_ROLE`] when
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
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
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
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
            message: format!(
                "a RoleBinding binds ServiceAccount {sa} to Role {target}, which does not exist in {namespace}; rbac.mode PatchVClusterRoles appends to it"
            ),
        });
    }
    let others = rbac::other_subjects(bindings, namespace, &target, sa);
    if !others.is_empty() {
        return Err(Refusal {
            reason: rbac::REASON_SHARED_ROLE,
            message: format!(
                "Role {target} in {namespace} is bound to {} besides ServiceAccount {sa}: rbac.mode PatchVClusterRoles would grant the plugin's rules to them too; use rbac.mode Dedicated, or bind that Role to the vCluster's service account only",
                others.join(", ")
            ),
        });
    }
    Ok(target)
}

/// Every Role of `namespace`, read from the API server (the finalizer path, and
/// `rbac.mode: PatchVClusterRoles`: [`ClusterFacts::read`], [`roles_to_sync`]).
///
/// # Errors
/// The API server's answer to the list.
pub async fn list_roles(client: &Client, namespace: &str) -> Result<Vec<Role>> {
    Ok(Api::<Role>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list Roles in {namespace}"), e))?
        .items)
}

/// Every RoleBinding of `namespace`, read from the API server ([`ClusterFacts::read`]).
///
/// # Errors
/// The API server's answer to the list.
pub async fn list_role_bindings(client: &Client, namespace: &str) -> Result<Vec<RoleBinding>> {
    Ok(Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list RoleBindings in {namespace}"), e))?
        .items)
}

/// `rbac.mode: PatchVClusterRoles` ([`rbac::patch_role`]): makes the Role `target.0` (found
/// by [`find_vcluster_role`]) carry `target.1` as this plugin's appended entries, and restores
/// every other Role of the namespace that carries entries of this plugin (after a mode switch,
/// or when the bindings changed). `target: None` restores every such Role (`Dedicated` mode, a
/// refused plugin, and the finalizer). `roles` are the namespace's Roles (cached, or listed
/// by the finalizer). Writes only Roles that differ.
///
/// A patch carries the `resourceVersion` it was computed from; when the API server refuses it
/// with 409 Conflict (the Role changed since, or the copy was stale), the Role is read again
/// and the patch recomputed once.
///
/// # Errors
/// API errors, including a second 409 Conflict (the reconcile is then retried).
pub async fn sync_vcluster_roles(
    ctx: &Context,
    plugin: &VClusterPlugin,
    target: Option<(&str, &[k8s_openapi::api::rbac::v1::PolicyRule])>,
    roles: Vec<Role>,
) -> Result<()> {
    let client = &ctx.client;
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let roles_api = Api::<Role>::namespaced(client.clone(), &namespace);
    // The other plugins of the namespace: a record under this plugin's earlier key may be
    // theirs (`rbac::record_keys`).
    let others: Vec<String> = ctx
        .plugins
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()) && p.name_any() != name)
        .map(|p| p.name_any())
        .collect();
    let keys = rbac::record_keys(&name, &others);
    for role in &roles {
        let role_name = role.name_any();
        let desired = match target {
            Some((t, r)) if t == role_name => Some(r),
            _ if keys.iter().any(|k| role.annotations().contains_key(k)) => None,
            _ => continue,
        };
        let Some(patch) = rbac::patch_role(role, &name, &others, desired) else {
            continue;
        };
        let action = format!("merge-patch the rules of Role {namespace}/{role_name}");
        let pp = PatchParams {
            field_manager: Some(OPERATOR_FIELD_MANAGER.into()),
            ..Default::default()
        };
        match roles_api
            .patch(&role_name, &pp, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let fresh = roles_api
                    .get_opt(&role_name)
                    .await
                    .map_err(|e| Error::kube(format!("get Role {namespace}/{role_name}"), e))?;
                let Some(patch) = fresh.and_then(|r| rbac::patch_role(&r, &name, &others, desired))
                else {
                    continue;
                };
                roles_api
                    .patch(&role_name, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(|e| Error::kube(action.clone(), e))?;
            }
            Err(e) => return Err(Error::kube(action, e)),
        }
        info!(
            "{} rules of VClusterPlugin {name} in Role {namespace}/{role_name}",
            if desired.is_some() {
                "appended"
            } else {
                "removed the"
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_that_depend_on_the_cluster_are_rechecked_soon() {
        assert_eq!(next_reconcile(&Check::Ok), RESYNC);
        for reason in [
            rbac::REASON_UNKNOWN_TYPE,
            rbac::REASON_NO_VCLUSTER_ROLE,
            rbac::REASON_SHARED_ROLE,
        ] {
            assert_eq!(
                next_reconcile(&Check::failed(reason, "m")),
                RECHECK,
                "{reason}"
            );
        }
        // A workload that becomes a vCluster triggers a reconcile through the workload watch.
        for reason in [
            "PolicyDenied",
            "Conflict",
            "VClusterNotFound",
            "NotAVCluster",
        ] {
            assert_eq!(
                next_reconcile(&Check::failed(reason, "m")),
                RESYNC,
                "{reason}"
            );
        }
    }
}
