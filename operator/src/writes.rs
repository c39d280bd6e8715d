//! The operator's requests to the API server, made by converging a vCluster
//! ([`crate::vcluster::act`]) and by the sweep ([`crate::sweep`]).
//!
//! The rule: every write is a server-side apply under one field manager,
//! [`vcp_crds::OPERATOR_FIELD_MANAGER`], so only the fields the operator owns change; an object
//! that already matches is not written (zero writes once converged); an object is deleted only
//! when labelled as made for the plugin ([`crate::rbac::labels`]). The reads are in
//! [`crate::cache`] and [`crate::vcluster::observe`]. The dry
//! runs that judge each plugin's part before the workload is applied ([`crate::judge`]) are
//! sent by [`ApiDryRun`]; they store nothing.
//!
//! Each request runs in a span of its own with the fields `kind` and `object` (`namespace/name`
//! of the object written, [`crate::trace`]), nested in the reconcile's span (`plugin`,
//! `vcluster`); the log lines say what was done, the spans to what.

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{info, instrument, warn};
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::judge::{self, DryRun, WorkloadAnswer};
use crate::rbac::{self, DesiredRbac};
use crate::status::{self, Outcome};
use crate::trace::{self, Key};
use crate::workload::{self, Workload, WorkloadKind};

/// Sends `patch` for `workload` unless it is already converged. Returns whether it wrote.
/// The API server's answer is remembered in [`Context::written`].
///
/// # Errors
/// The API server's answer to the apply.
#[instrument(skip_all, fields(kind = workload.kind_str(), object = %Key::new(&workload.namespace, &workload.name)))]
pub async fn apply_workload(ctx: &Context, workload: &Workload, patch: &Value) -> Result<bool> {
    if workload::is_converged(workload, patch) {
        return Ok(false);
    }
    let pp = PatchParams::apply(OPERATOR_FIELD_MANAGER).force();
    let action = format!(
        "server-side apply {} {}/{}",
        workload.kind_str(),
        workload.namespace,
        workload.name
    );
    // A refusal of a judged body (the workload changed between the dry run and this apply, or
    // an admission webhook judges dry runs apart) must not be remembered as accepted: the next
    // reconcile judges again instead of failing the same way for every plugin.
    let refused = |e: kube::Error| {
        if matches!(&e, kube::Error::Api(s) if s.code == 400 || s.code == 422) {
            ctx.verdicts.forget(workload);
        }
        Error::kube(action.clone(), e)
    };
    let generation = match workload.kind {
        Some(WorkloadKind::Deployment) => {
            let applied = Api::<Deployment>::namespaced(ctx.client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(refused)?;
            ctx.copies.deployment(&applied);
            applied.metadata.generation
        }
        _ => {
            let applied = Api::<StatefulSet>::namespaced(ctx.client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(refused)?;
            ctx.copies.statefulset(&applied);
            applied.metadata.generation
        }
    };
    ctx.verdicts.applied(workload, generation);
    info!("server-side apply");
    Ok(true)
}

/// The dry runs of [`crate::judge`], sent with the operator's identity: a server-side apply of
/// a workload body and a create of a Pod, both with `dryRun=All` (admitted and validated,
/// never stored).
pub struct ApiDryRun<'a>(pub &'a Client);

impl DryRun for ApiDryRun<'_> {
    #[instrument(name = "dry_run_workload", skip_all, fields(kind = workload.kind_str(), object = %Key::new(&workload.namespace, &workload.name)))]
    async fn workload(&self, workload: &Workload, body: &Value) -> Result<WorkloadAnswer> {
        let pp = PatchParams::apply(OPERATOR_FIELD_MANAGER).force().dry_run();
        let action = format!(
            "dry-run server-side apply {} {}/{}",
            workload.kind_str(),
            workload.namespace,
            workload.name
        );
        let answer = match workload.kind {
            Some(WorkloadKind::Deployment) => {
                Api::<Deployment>::namespaced(self.0.clone(), &workload.namespace)
                    .patch(&workload.name, &pp, &Patch::Apply(body))
                    .await
                    .map(|d| judge::pod_of_deployment(&d))
            }
            _ => Api::<StatefulSet>::namespaced(self.0.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(body))
                .await
                .map(|s| judge::pod_of_statefulset(&s)),
        };
        match answer {
            Ok(pod) => Ok(WorkloadAnswer::Accepted(Box::new(pod))),
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
                Ok(WorkloadAnswer::Refused(s.message))
            }
            Err(e) => Err(Error::kube(action, e)),
        }
    }

    #[instrument(name = "dry_run_pod", skip_all, fields(kind = "Pod", object = %Key::of(pod)))]
    async fn pod(&self, pod: &Pod) -> Result<judge::PodAnswer> {
        let namespace = pod.namespace().unwrap_or_default();
        let pp = PostParams {
            dry_run: true,
            field_manager: Some(OPERATOR_FIELD_MANAGER.into()),
        };
        match Api::<Pod>::namespaced(self.0.clone(), &namespace)
            .create(&pp, pod)
            .await
        {
            Ok(_) => Ok(judge::PodAnswer::Admitted),
            Err(kube::Error::Api(s)) => match judge::pod_security_violation(&s.message) {
                Some(v) => Ok(judge::PodAnswer::Violates(v)),
                None if s.code == 400 || s.code == 422 => Ok(judge::PodAnswer::Invalid(s.message)),
                None => {
                    // Not the plugins' doing (such as a quota, or no `create pods` permission):
                    // the Pod Security level cannot be judged now; the workload's own dry run
                    // still was. The judgement lets the pod pass (PodAnswer::Unjudged: fail-open,
                    // and a hook verdict it took part in is not remembered).
                    warn!(
                        code = s.code,
                        error = %s.message,
                        "cannot check the vCluster's pod against the namespace's Pod Security level"
                    );
                    Ok(judge::PodAnswer::Unjudged(format!(
                        "{}: {}",
                        s.code, s.message
                    )))
                }
            },
            Err(e) => Err(Error::kube(
                format!("dry-run create a Pod in {namespace}"),
                e,
            )),
        }
    }
}

/// Writes the operator's status fields of `plugin` for `outcome` when they changed, and
/// publishes an Event when the `Ready` reason changed.
///
/// # Errors
/// The API server's answer to the status apply (Event failures are only logged).
#[instrument(skip_all, fields(kind = "VClusterPlugin", object = %Key::of(plugin)))]
pub async fn write_status(plugin: &VClusterPlugin, outcome: &Outcome, ctx: &Context) -> Result<()> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The cached plugin may not show this process's last status write yet
    // ([`status::WrittenStatuses`]): then that status is the live one.
    let seen;
    let read = plugin;
    let plugin = match ctx.written_statuses.live(read) {
        Some(live) => {
            seen = VClusterPlugin {
                status: Some(live),
                ..read.clone()
            };
            &seen
        }
        None => read,
    };
    let desired = status::desired(plugin, outcome, &now);
    if !status::needs_write(plugin.status.as_ref(), &desired) {
        return Ok(());
    }
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    // The answer is not read: it is asked for as metadata only and skipped while parsed
    // ([`crate::answer`]), for a plugin's whole answer is its spec, up to the request limit
    // (a tenant's flood of large plugins must not pass through the operator's memory), and
    // one whose status the operator's types cannot read must not turn
    // a write that was made into a failed reconcile.
    let action = || format!("apply status of VClusterPlugin {namespace}/{name}");
    let request = kube::core::Request::new(
        Api::<VClusterPlugin>::namespaced(ctx.client.clone(), &namespace).resource_url(),
    )
    .patch_subresource(
        "status",
        &name,
        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
        &Patch::Apply(status::apply_body(plugin, &desired)),
    )
    .map_err(|e| Error::kube(action(), kube::Error::BuildRequest(e)))?;
    ctx.client
        .request::<serde::de::IgnoredAny>(crate::answer::metadata_only(request))
        .await
        .map_err(|e| Error::kube(action(), e))?;
    ctx.written_statuses.remember(read, &desired);

    let ready = desired.conditions.iter().find(|c| c.type_ == status::READY);
    if let Some(ready) = ready
        && !status::ready_reason_is(plugin.status.as_ref(), &ready.reason)
    {
        let event = Event {
            type_: if ready.status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: ready.reason.clone(),
            note: Some(if ready.message.is_empty() {
                format!(
                    "installed into {:?}",
                    desired
                        .workload
                        .as_ref()
                        .map(|w| format!("{} {}", w.kind, w.name))
                        .unwrap_or_default()
                )
            } else {
                ready.message.chars().take(1000).collect()
            }),
            action: "Reconcile".into(),
            secondary: None,
        };
        // A Recorder for this Event alone (`Context::reporter`): kube-runtime's Recorder keeps each
        // Event it published for 6 minutes to fold a repeat into a series, in a map whose capacity
        // stays at its largest, so one Recorder for the process held the Events of every plugin of
        // the last 6 minutes and the memory of the busiest 6 minutes for ever (no per-object state
        // may outlive its object). An Event is published only when the `Ready` reason changes, so
        // there is no repeat to fold; a return to an earlier reason within 6 minutes is now an
        // Event of its own instead of a count on the earlier one.
        let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
        if let Err(e) = recorder.publish(&event, &plugin.object_ref(&())).await {
            warn!(error = %e, "cannot publish Event");
        }
    }
    Ok(())
}

/// Applies the RBAC objects of `desired` that differ from the cached ones
/// ([`Context::caches`]), and deletes those the plugin no longer needs (only when labelled as
/// made for it).
///
/// # Errors
/// The API server's answers.
pub async fn apply_rbac(
    ctx: &Context,
    plugin: &VClusterPlugin,
    desired: DesiredRbac,
) -> Result<()> {
    let client = &ctx.client;
    let caches = &ctx.caches;
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let role_name = rbac::role_name(&name);
    let cluster_name = rbac::cluster_role_name(&namespace, &name);
    let namespaced = ObjectRef::new(&role_name).within(&namespace);
    let cluster = ObjectRef::new(&cluster_name);
    ensure(
        Api::<Role>::namespaced(client.clone(), &namespace),
        caches.roles.get(&namespaced),
        desired.role,
        plugin,
        rbac::role_matches,
    )
    .await?;
    ensure(
        Api::<RoleBinding>::namespaced(client.clone(), &namespace),
        caches
            .role_bindings
            .get(&ObjectRef::new(&role_name).within(&namespace)),
        desired.role_binding,
        plugin,
        rbac::role_binding_matches,
    )
    .await?;
    ensure(
        Api::<ClusterRole>::all(client.clone()),
        caches.cluster_roles.get(&cluster),
        desired.cluster_role,
        plugin,
        rbac::cluster_role_matches,
    )
    .await?;
    ensure(
        Api::<ClusterRoleBinding>::all(client.clone()),
        caches
            .cluster_role_bindings
            .get(&ObjectRef::new(&cluster_name)),
        desired.cluster_role_binding,
        plugin,
        rbac::cluster_role_binding_matches,
    )
    .await?;
    Ok(())
}

/// Makes the object `desired` names equal to `desired`, given its cached copy `live`: nothing
/// when it matches, a server-side apply when it differs, a delete when it is not desired but
/// exists and is labelled as made for `plugin` (`desired: None` names nothing; the object
/// deleted is `live`'s).
async fn ensure<K>(
    api: Api<K>,
    live: Option<Arc<K>>,
    desired: Option<K>,
    plugin: &VClusterPlugin,
    matches: fn(&K, &K) -> bool,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    match (desired, live) {
        (Some(d), Some(l)) if matches(&l, &d) => Ok(()),
        (Some(d), _) => apply(&api, &d).await,
        (None, Some(l)) => delete_if_ours(&api, &l.name_any(), &l, plugin).await,
        (None, None) => Ok(()),
    }
}

/// Server-side applies `desired` under [`OPERATOR_FIELD_MANAGER`], in a span with its `kind`
/// and `object`.
#[instrument(skip_all, fields(kind = %trace::kind::<K>(), object = %Key::of(desired)))]
async fn apply<K>(api: &Api<K>, desired: &K) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    let name = desired.name_any();
    api.patch(
        &name,
        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await
    .map_err(|e| {
        Error::kube(
            format!("server-side apply {} {name}", trace::kind::<K>()),
            e,
        )
    })?;
    info!("server-side apply");
    Ok(())
}

/// Deletes `live` (named `name`) when it carries the labels of `plugin`; 404 is success. Runs
/// in a span with the object's `kind` and `object`.
///
/// # Errors
/// The API server's answer to the delete.
#[instrument(skip_all, fields(kind = %trace::kind::<K>(), object = %Key::of(live)))]
pub async fn delete_if_ours<K>(
    api: &Api<K>,
    name: &str,
    live: &K,
    plugin: &VClusterPlugin,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let ours = rbac::labels(plugin)
        .iter()
        .all(|(k, v)| live.labels().get(k) == Some(v));
    if !ours {
        return Ok(());
    }
    let kind = K::kind(&Default::default()).to_string();
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            info!("deleted");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {kind} {name}"), e)),
    }
}
