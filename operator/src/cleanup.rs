//! The finalizer path: what happens when a `VClusterPlugin` carrying `vcp.dev/cleanup` is
//! deleted.
//!
//! DESIGN.md ("Operator contract"): remove exactly what was added, then the finalizer.
//! - the workload: the apply body is recomputed from the *other* plugins installed into the
//!   vCluster, less those refused (judged as in [`crate::install`], including the size budgets
//!   of [`crate::workload::budget`] and the dry runs of [`crate::judge`], so a plugin too large
//!   or whose part the API server refuses never holds up another's removal), and applied
//!   ([`apply_without`]); server-side apply then removes this plugin's containers, and, when
//!   it was the last v2 plugin, the shared `plugins` volume and `/plugins` mount. With no
//!   plugin left the operator's field manager owns nothing and the pod template is the
//!   original;
//! - a workload that no longer exists does not block deletion;
//! - RBAC: the Role / RoleBinding (owned, but no garbage collector is guaranteed to run) and
//!   the ClusterRole / ClusterRoleBinding (labelled) are deleted by name; with
//!   `rbac.mode: PatchVClusterRoles`, the entries recorded in the vCluster's Roles are taken out
//!   again ([`crate::rbac::patch_role`]), restoring each Role exactly;
//! - the finalizer itself is removed by [`crate::controller::reconcile`] once this returns `Ok`
//!   ([`crate::finalizer::remove_finalizer`]).
//!
//! A plugin deleted without this (its finalizer removed by hand, or deleted while the operator
//! was stopped) is cleaned up by the sweep ([`crate::sweep`]), which removes the same objects
//! for every plugin that no longer exists.
//!
//! Unlike the install path, this reads the workload and the RBAC objects from the API server,
//! not from the watch caches: a removal skipped because a cache had not yet seen an object
//! would not be corrected by any later event once the finalizer is gone.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use vcp_crds::{VClusterPlugin, WorkloadRef};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::install::{self, ClusterFacts};
use crate::rbac;
use crate::status::{Check, Outcome};
use crate::workload::{self, Workload};
use crate::writes::{apply_workload, delete_if_ours, fetch_workload, write_status};

/// Removes everything the operator added for `plugin`.
///
/// # Errors
/// API errors; the finalizer stays and the cleanup is retried.
pub async fn cleanup(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = lock.lock().await;
    let wl = fetch_workload(&ctx.client, &namespace, &vcluster).await?;

    let outcome = Outcome {
        workload: wl.as_ref().map(|w| WorkloadRef {
            kind: w.kind_str().into(),
            name: w.name.clone(),
        }),
        workload_patched: Check::Ok,
        rbac: Check::Ok,
        terminating: true,
    };
    if let Err(e) = write_status(plugin, &outcome, ctx).await {
        // Only informative: never let it block the removal.
        tracing::warn!(plugin = %format!("{namespace}/{name}"), error = %e, "cannot write Terminating status");
    }

    if let Some(wl) = wl {
        apply_without(ctx, &wl, Some(&name)).await?;
    }
    drop(guard);

    // PatchVClusterRoles: take this plugin's entries out of every Role that records them.
    let roles = install::list_roles(&ctx.client, &namespace).await?;
    install::sync_vcluster_roles(ctx, plugin, None, roles).await?;

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
    .await?;
    Ok(Action::await_change())
}

/// Applies `wl` again with the entries of the plugins installed into it ([`install::candidates`])
/// except `without`, judged as the install path judges them: refused plugins stay out (all of
/// them when the workload is not a vCluster: the apply then only takes out what was added),
/// including those over the size budgets ([`workload::budget`]) and those whose part the API
/// server refuses, so that none of them holds up a removal. Used by [`cleanup`] (without the
/// deleted plugin) and by the sweep ([`crate::sweep`]: the plugins that still exist). The
/// caller holds the workload's lock ([`Context::workload_lock`]) and read `wl` from the API
/// server. Returns whether it wrote.
///
/// # Errors
/// Discovery, the dry runs and the apply.
pub async fn apply_without(ctx: &Context, wl: &Workload, without: Option<&str>) -> Result<bool> {
    let others = install::candidates(ctx, &wl.namespace, &wl.name, &[], without);
    let refs: Vec<&VClusterPlugin> = others.iter().collect();
    let facts = ClusterFacts::read(ctx, wl, &refs).await?;
    let (sized, _) =
        workload::budget::admit(wl, facts.accepted(&ctx.policy, &refs), &ctx.runtime_image);
    let (kept, _) = install::judge_parts(ctx, wl, sized).await?;
    let plan = workload::plan(wl, &kept, &ctx.runtime_image);
    apply_workload(ctx, wl, &plan.patch).await
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
