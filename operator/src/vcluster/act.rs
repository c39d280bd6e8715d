//! *Act* and *report*: the writes of one reconcile of a vCluster ([`super`]), as its
//! [`Plan`] says: the workload's apply ([`workload`], under the workload's lock), the
//! reconciled plugin's RBAC ([`rbac`]: its own objects, its entries in the vCluster's Roles,
//! [`sync_vcluster_roles`]) and its status and Event ([`report`]). Every write goes through
//! [`crate::writes`] (server-side apply under one field manager, zero writes once converged,
//! deletes only of the plugin's own objects) or is a guarded merge patch of a Role here.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use tracing::{info, instrument};
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};

use super::decide::{Observed, Plan, RbacPlan};
use super::observe;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::rbac::{self, DesiredRbac};
use crate::status::Outcome;
use crate::trace::Key;
use crate::writes::{apply_rbac, apply_workload, delete_if_ours, write_status};

/// Sends the plan's workload body unless the workload is already converged. The caller holds
/// the workload's lock ([`Context::workload_lock`]). Returns whether it wrote.
///
/// # Errors
/// The API server's answer to the apply.
pub async fn workload(ctx: &Context, observed: Option<&Observed>, plan: &Plan) -> Result<bool> {
    match (observed, &plan.workload) {
        (Some(o), Some(patch)) => apply_workload(ctx, &o.workload, patch).await,
        _ => Ok(false),
    }
}

/// Makes `plugin`'s RBAC what `plan` says ([`RbacPlan`]); `observed` gives the Roles already
/// listed for the cluster facts (`rbac.mode: PatchVClusterRoles`).
///
/// # Errors
/// The API server's answers.
pub async fn rbac(
    ctx: &Context,
    plugin: &VClusterPlugin,
    observed: Option<&Observed>,
    plan: &RbacPlan,
) -> Result<()> {
    let listed = observed.and_then(|o| o.facts.roles.as_deref());
    match plan {
        RbacPlan::Keep => Ok(()),
        RbacPlan::Grant(grant) => {
            apply_rbac(ctx, plugin, grant.rbac.clone()).await?;
            let target = grant
                .vcluster_role
                .as_ref()
                .map(|(role, rules)| (role.as_str(), rules.as_slice()));
            let roles = observe::roles_to_sync(ctx, plugin, listed).await?;
            sync_vcluster_roles(ctx, plugin, target, roles).await
        }
        RbacPlan::Revoke => {
            // A refused plugin gets nothing, and loses what an earlier generation was given:
            // its own Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules it
            // appended to the vCluster's Roles (reads only when there is nothing to remove).
            apply_rbac(ctx, plugin, DesiredRbac::default()).await?;
            let roles = observe::roles_to_sync(ctx, plugin, listed).await?;
            sync_vcluster_roles(ctx, plugin, None, roles).await
        }
        RbacPlan::Remove => remove_all(ctx, plugin).await,
    }
}

/// Writes `plugin`'s status for `outcome` when it changed, with an Event when the `Ready`
/// reason changed ([`crate::writes::write_status`]).
///
/// # Errors
/// The API server's answer to the status apply.
pub async fn report(ctx: &Context, plugin: &VClusterPlugin, outcome: &Outcome) -> Result<()> {
    write_status(plugin, outcome, ctx).await
}

/// The removal of a deleted plugin's RBAC: its entries in every Role of the namespace
/// (`rbac.mode: PatchVClusterRoles`, listed from the API server), then its Role, RoleBinding,
/// ClusterRole and ClusterRoleBinding, deleted by name when labelled as made for it. Reads the
/// API server, not the watch caches: a removal skipped because a cache had not yet seen an
/// object would not be corrected by any later event once the finalizer is gone.
async fn remove_all(ctx: &Context, plugin: &VClusterPlugin) -> Result<()> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let roles = observe::list_roles(ctx, &namespace).await?;
    sync_vcluster_roles(ctx, plugin, None, roles).await?;

    let role = rbac::role_name(&name);
    let cluster = rbac::cluster_role_name(&namespace, &name);
    remove(
        Api::<Role>::namespaced(ctx.client.clone(), &namespace),
        &role,
        plugin,
    )
    .await?;
    remove(
        Api::<RoleBinding>::namespaced(ctx.client.clone(), &namespace),
        &role,
        plugin,
    )
    .await?;
    remove(
        Api::<ClusterRole>::all(ctx.client.clone()),
        &cluster,
        plugin,
    )
    .await?;
    remove(
        Api::<ClusterRoleBinding>::all(ctx.client.clone()),
        &cluster,
        plugin,
    )
    .await
}

/// `rbac.mode: PatchVClusterRoles` ([`rbac::patch_role`]): makes the Role `target.0` (found
/// by [`super::decide::find_vcluster_role`]) carry `target.1` as this plugin's appended entries, and restores
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
        patch_role_rules(&roles_api, role, patch, desired.is_some(), |fresh| {
            rbac::patch_role(fresh, &name, &others, desired)
        })
        .await?;
    }
    Ok(())
}

/// Sends the merge patch `patch` of the reconciled plugin's entries (appended when `appends`,
/// removed otherwise) to the Role `role`, under [`OPERATOR_FIELD_MANAGER`]; on 409 Conflict
/// reads the Role again and sends `recompute` of the fresh copy once (nothing when it needs
/// none). Runs in a span with `kind` Role and `object` ([`crate::trace`]).
///
/// # Errors
/// The API server's answers, including a second 409 Conflict.
#[instrument(skip_all, fields(kind = "Role", object = %Key::of(role)))]
async fn patch_role_rules(
    roles_api: &Api<Role>,
    role: &Role,
    patch: serde_json::Value,
    appends: bool,
    recompute: impl Fn(&Role) -> Option<serde_json::Value>,
) -> Result<()> {
    let role_name = role.name_any();
    let key = Key::of(role);
    let action = format!("merge-patch the rules of Role {key}");
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
                .map_err(|e| Error::kube(format!("get Role {key}"), e))?;
            let Some(patch) = fresh.as_ref().and_then(recompute) else {
                return Ok(());
            };
            roles_api
                .patch(&role_name, &pp, &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::kube(action.clone(), e))?;
        }
        Err(e) => return Err(Error::kube(action, e)),
    }
    info!(
        "{} the plugin's rules",
        if appends { "appended" } else { "removed" }
    );
    Ok(())
}

/// Deletes the object `name` when it exists and is labelled as made for `plugin`.
async fn remove<K>(api: Api<K>, name: &str, plugin: &VClusterPlugin) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    match api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get {kind} {name}"), e))?
    {
        Some(live) => delete_if_ours(&api, name, &live, plugin).await,
        None => Ok(()),
    }
}
