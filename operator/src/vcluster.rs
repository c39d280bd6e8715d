//! Converging one vCluster is the unit of the operator's work (ARCHITECTURE.md, "The operator:
//! observe → decide → act → report, per vCluster"). A reconcile of a `VClusterPlugin` converges the
//! vCluster the plugin targets, in four steps, whatever the reconcile is for ([`Intent`]: install a
//! plugin, remove a deleted one, or re-apply the workload for the sweep):
//! 1. *observe* ([`observe`]): read the workload, the plugins installed into it, the cluster
//!    facts their refusals depend on and the verdicts of the hooks' judging and the dry runs;
//! 2. *decide* ([`decide`], pure, unit-tested without an API server): compute the [`Plan`],
//!    every write, every plugin's verdict and the reconciled plugin's status;
//! 3. *act* ([`act`]): apply the workload, unless converged, under the workload's lock, then
//!    the reconciled plugin's RBAC;
//! 4. *report* ([`act::report`]): write its status (and an Event when `Ready`'s reason changed),
//!    after [`install`] has looked at the vCluster's pods ([`observe::pods`],
//!    [`crate::rollout`]): a pod that cannot run the plugin makes it `RolloutFailed`.
//!
//! The workload's lock ([`Context::workload_lock`]) is held from the first read of the
//! workload to its apply, so reconciles of plugins of the same vCluster (and the sweep) compute
//! and send the workload's body one at a time. A reconcile does not wait for it while holding
//! one of the controller's `--concurrency` slots, or one tenant's many plugins of one vCluster
//! would take every slot and stall the other tenants: [`install`] only tries the lock and, when
//! another reconcile holds it, is requeued to come back in its turn
//! ([`crate::context::WorkloadLock::retry_after`]: its place among the plugins turned away
//! times the hold so far, 0.1–5 s, with jitter; the holder converges the whole vCluster
//! meanwhile); [`delete`] waits at most [`DELETE_WAIT`], then fails and is retried with the
//! plugin's backoff.
//!
//! [`install`] adds the finalizer `vcp.dev/cleanup` first ([`crate::finalizer`]: to this plugin,
//! and, once the workload is found, to the other plugins of the vCluster that lack it, so that
//! the workload is applied once with all of them). It reads the workload from the watch caches
//! ([`crate::cache::workload`]); [`delete`] and [`reapply`] (the sweep) read it from the API
//! server ([`crate::cache::fetch_workload`]), for a removal skipped because a cache had not yet
//! seen an object would not be corrected by any later event once the finalizer is gone.

pub mod act;
pub mod decide;
pub mod observe;
#[cfg(test)]
mod tests;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;
use vcp_crds::{FINALIZER, VClusterPlugin};

use crate::cache;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::finalizer::with_finalizer;
use crate::rollout;
use crate::status::Check;
use crate::workload::Workload;
pub use decide::{
    ClusterFacts, Grant, Intent, Observed, Plan, RECHECK, RESYNC, RbacPlan, decide, next_reconcile,
};

/// How long [`delete`] waits for its vCluster's lock before it gives its `--concurrency` slot
/// back (an error, retried with the plugin's backoff, `crate::retry`): a reconcile of one
/// vCluster holds it for well under a second unless that vCluster's plugins are many, so a
/// delete normally gets it in time.
pub const DELETE_WAIT: Duration = Duration::from_secs(2);

/// Converges the vCluster of `plugin`, which is not being deleted, to install it (see the
/// module docs).
///
/// Under the workload's lock, before anything is installed, the finalizer is added to this
/// plugin and, when its workload exists, at the same time to every other plugin of the
/// vCluster that lacks it and is not being deleted (each would add it in its own reconcile
/// before anything is installed for it): the workload is then planned with all of them and
/// applied once, instead of once per plugin as each gains its finalizer.
///
/// # Errors
/// API errors (the finalizer patches, discovery, the dry runs, the writes); the controller
/// retries.
pub async fn install(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = match lock.try_lock_for(&plugin.name_any()) {
        Ok(guard) => guard,
        Err(after) => {
            // Another reconcile converges this vCluster now: come back in turn, with no slot
            // held meanwhile.
            ctx.telemetry.deferred(&namespace, &plugin.name_any());
            tracing::debug!(
                retry_in_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                "the vCluster's workload is being converged by another reconcile; requeued"
            );
            return Ok(Action::requeue(after));
        }
    };
    // The cached copy may be newer than the one this reconcile was started with (another
    // reconcile of the vCluster may have added its finalizer meanwhile).
    let Some(latest) = ctx.plugins.get(&ObjectRef::from_obj(plugin)) else {
        // Gone since this reconcile started (deleted without the finalizer): nothing may be
        // written for it; the sweep (`crate::sweep`) removes what it had.
        return Ok(Action::await_change());
    };
    if latest.metadata.deletion_timestamp.is_some() {
        // Deleted since this reconcile started: the deletion's own trigger runs the cleanup.
        return Ok(Action::await_change());
    }
    // The workload first (from the watch caches: no request once they hold it): the siblings'
    // finalizers are added only when there is a workload to install them into.
    let wl = cache::workload(&ctx.client, &ctx.caches, &ctx.copies, &namespace, &vcluster).await?;
    // What the rollout's look at the pods needs of the workload, kept past `observed`.
    let rollout_of = wl.as_ref().map(|w| Workload {
        kind: w.kind,
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        template_labels: w.template_labels.clone(),
        managed_fields: w.managed_fields.clone(),
        uid: w.uid.clone(),
        replicas: w.replicas,
        ..Default::default()
    });
    let mut fresher = with_finalizers(ctx, &latest, wl.is_some()).await?;
    let observed = match wl {
        Some(wl) => Some(observe::vcluster(ctx, wl, &fresher, None).await?),
        None => None,
    };
    // Only the reconciled plugin's copy is used from here: the siblings' copies go with
    // `observed`'s plugins, before the lock is released (so a waiting reconcile holds no copy
    // of them).
    fresher.truncate(1);
    let plugin = &*fresher[0];
    let (mut plan, wrote) =
        decide_and_act(ctx, plugin, observed, Intent::Install(plugin), guard).await?;
    if let Some(outcome) = plan.status.as_mut() {
        if let Some(wl) = &rollout_of
            && outcome.workload_patched == Check::Ok
            && outcome.rbac == Check::Ok
        {
            let look = look_at_pods(ctx, wl, &plugin.name_any()).await;
            let (failure, settled, seen) = match look {
                Some(look) => look,
                // Not read this time: the last verdict stands, and the pods are read again soon.
                None => (previous_failure(plugin), false, true),
            };
            let now = k8s_openapi::jiff::Timestamp::now();
            let manager = vcp_crds::OPERATOR_FIELD_MANAGER;
            let fields = &wl.managed_fields;
            let failing = failure.is_some();
            if rollout::watching(failing, settled, seen, wrote, fields, manager, now) {
                let sooner = plan
                    .requeue
                    .map_or(rollout::RECHECK, |r| r.min(rollout::RECHECK));
                plan.requeue = Some(sooner);
            }
            outcome.rollout = failure;
        }
        act::report(ctx, plugin, outcome).await?;
    }
    Ok(requeue(&plan))
}

/// [`rollout::failure`] (as its message), [`rollout::settled`], and whether there are pods, of
/// the plugin's container `container` over `wl`'s pods ([`observe::pods`]); `None` when they
/// cannot be read (logged).
async fn look_at_pods(
    ctx: &Context,
    wl: &Workload,
    container: &str,
) -> Option<(Option<String>, bool, bool)> {
    match observe::pods(ctx, wl).await {
        Ok(pods) => Some((
            rollout::failure(container, &pods).map(|f| f.to_string()),
            rollout::settled(container, &pods),
            !pods.is_empty(),
        )),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the vCluster's pods; they are read again");
            None
        }
    }
}

/// The message of `plugin`'s `Ready=False RolloutFailed`, when that is its status now.
fn previous_failure(plugin: &VClusterPlugin) -> Option<String> {
    let ready = plugin
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == crate::status::READY)?;
    (ready.status == "False" && ready.reason == vcp_crds::Reason::RolloutFailed.as_str())
        .then(|| ready.message.clone())
}

/// Converges the vCluster of `plugin`, which is being deleted and carries the finalizer, to
/// remove exactly what was added for it (nothing else): its `Terminating`
/// status first ([`decide::terminating`]; only informative, a failure is logged), then the
/// workload applied from the *other* plugins installed into the vCluster, less those refused
/// (judged as for an install, so a plugin too large or whose part the API server refuses never
/// holds up another's removal; server-side apply then removes this plugin's containers, and,
/// when it was the last v2 plugin, the shared `plugins` volume and `/plugins` mount; with no
/// plugin left the operator's field manager owns nothing and the pod template is the
/// original), then its RBAC ([`RbacPlan::Remove`]). A workload that no longer exists does not
/// block this. The finalizer itself is removed by [`crate::controller::reconcile`] once this
/// returns `Ok` ([`crate::finalizer::remove_finalizer`]).
///
/// A plugin deleted without this (its finalizer removed by hand, or deleted while the operator
/// was stopped) is cleaned up by the sweep ([`crate::sweep`]).
///
/// # Errors
/// API errors; the finalizer stays and the removal is retried.
pub async fn delete(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = tokio::time::timeout(DELETE_WAIT, lock.lock())
        .await
        .map_err(|_| Error::WorkloadBusy {
            vcluster: format!("{namespace}/{vcluster}"),
            waited: DELETE_WAIT,
        })?;
    lock.leave(&name);
    let wl = cache::fetch_workload(&ctx.client, &namespace, &vcluster).await?;
    if let Err(e) = act::report(ctx, plugin, &decide::terminating(wl.as_ref())).await {
        // Only informative: never let it block the removal.
        tracing::warn!(error = %e, "cannot write Terminating status");
    }
    let observed = match wl {
        Some(wl) => Some(observe::vcluster(ctx, wl, &[], Some(&name)).await?),
        None => None,
    };
    let (plan, _) = decide_and_act(ctx, plugin, observed, Intent::Delete(plugin), guard).await?;
    Ok(requeue(&plan))
}

/// The decide and act steps of [`install`] and [`delete`] for `plugin`: the plan for `intent`
/// from `observed`, the workload applied while `guard` (the vCluster's workload lock) is held,
/// then the lock released and the plugin's RBAC converged. Returns the plan (its status and
/// requeue are the caller's) and whether the workload was written. `observed`'s plugins are dropped with the lock: the RBAC step
/// reads only its facts, and a reconcile waiting for the RBAC writes and its status write
/// holds no copy of the vCluster's plugins (those waits overlap across up to 16 reconciles,
/// and each copy held would multiply the operator's memory).
///
/// # Errors
/// The workload's apply and the RBAC writes.
async fn decide_and_act(
    ctx: &Context,
    plugin: &VClusterPlugin,
    observed: Option<Observed>,
    intent: Intent<'_>,
    guard: tokio::sync::MutexGuard<'_, ()>,
) -> Result<(Plan, bool)> {
    let plan = decide(observed.as_ref(), intent, &ctx.policy, &ctx.runtime_image);
    let wrote = act::workload(ctx, observed.as_ref(), &plan).await?;
    let facts = observed.map(|o| Observed {
        plugins: Vec::new(),
        ..o
    });
    drop(guard);
    act::rbac(ctx, plugin, facts.as_ref(), &plan.rbac).await?;
    Ok((plan, wrote))
}

/// Applies the workload `wl` again from the plugins installed into it, judged as an install
/// judges them (the sweep, [`crate::sweep`]: the entries of plugins that no longer exist come
/// out). The caller holds the workload's lock ([`Context::workload_lock`]) and read `wl` from
/// the API server. Returns whether it wrote.
///
/// # Errors
/// Discovery, the dry runs and the apply.
#[tracing::instrument(skip_all, fields(vcluster = %crate::trace::Key::new(&wl.namespace, &wl.name)))]
pub async fn reapply(ctx: &Context, wl: crate::workload::Workload) -> Result<bool> {
    let observed = observe::vcluster(ctx, wl, &[], None).await?;
    let plan = decide(
        Some(&observed),
        Intent::Sweep,
        &ctx.policy,
        &ctx.runtime_image,
    );
    act::workload(ctx, Some(&observed), &plan).await
}

/// `plugin` (first) and, when `siblings`, the other plugins of its vCluster that are not being
/// deleted, each carrying the finalizer (added now to those that lack it, [`with_finalizer`]):
/// the copies newer than the plugins' watch cache. The patches are sent at once, not one
/// after the other (one round trip instead of one per plugin). A plugin that carries
/// the finalizer already is the cache's copy itself, shared (`plugin`, from the cache, too).
///
/// # Errors
/// The finalizer patches.
async fn with_finalizers(
    ctx: &Context,
    plugin: &Arc<VClusterPlugin>,
    siblings: bool,
) -> Result<Vec<Arc<VClusterPlugin>>> {
    let namespace = plugin.namespace().unwrap_or_default();
    let vcluster = &plugin.spec.vcluster.name;
    let unfinalized: Vec<Arc<VClusterPlugin>> = if siblings {
        ctx.plugins
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace.as_str())
                    && &p.spec.vcluster.name == vcluster
                    && p.name_any() != plugin.name_any()
                    && p.metadata.deletion_timestamp.is_none()
                    && !p.finalizers().iter().any(|f| f == FINALIZER)
            })
            .collect()
    } else {
        Vec::new()
    };
    // The patches' answers are metadata only ([`crate::finalizer`]): each copy is the cache's,
    // slimmed, with its new finalizers. One read again in full (its spec changed meanwhile) is
    // slimmed as it arrives ([`crate::slim`]), as the watch stream slims the cache's copies: a
    // tenant's flood of plugins too large for certain is never held in full, 64 answers at a
    // time, by each reconcile of its vCluster.
    futures::future::try_join_all(std::iter::once(plugin).chain(unfinalized.iter()).map(
        |p| async move {
            if p.finalizers().iter().any(|f| f == FINALIZER) {
                return Ok(Arc::clone(p));
            }
            let mut answer = with_finalizer(ctx, p).await?;
            answer.metadata.managed_fields = None;
            crate::slim::slim(&mut answer, &ctx.runtime_image);
            Ok::<_, crate::error::Error>(Arc::new(answer))
        },
    ))
    .await
}

/// The controller's [`Action`] for `plan`'s requeue.
fn requeue(plan: &Plan) -> Action {
    match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    }
}
