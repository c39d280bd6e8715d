//! The controller: watches, the reconcile of one `VClusterPlugin`, and the error policy.
//!
//! Reconcile (DESIGN.md, "Operator contract"), for a plugin that is not being deleted:
//! 1. find the vCluster workload (StatefulSet, else Deployment, named `spec.vcluster.name`);
//!    none → `Ready=False, reason=VClusterNotFound`, an Event, and nothing created;
//! 2. decide every refusal before any write. The policy ([`crate::policy`]) and the cluster
//!    state ([`ClusterFacts`]: a type the host does not serve → `UnknownType`; `rbac.mode:
//!    PatchVClusterRoles` with no Role bound to `vc-<vcluster>` → `VClusterRoleNotFound`) are
//!    judged for **every** plugin of the vCluster, not only the one being reconciled, from
//!    facts read once per reconcile; conflicts are then decided among the plugins left
//!    ([`crate::workload::plan`]). Every reconcile of the same workload (and the cleanup of
//!    a deleted plugin) thus computes the same set of installed plugins, so no reconcile adds a
//!    refused plugin's container that its own reconcile would take out again;
//! 3. compute the apply body of that workload from all plugins not refused and apply it,
//!    unless already converged;
//! 4. a plugin that is not refused gets its RBAC objects ([`crate::rbac::desired`]) that differ
//!    from the live ones (or its rules appended to the vCluster's Role); a refused one gets
//!    nothing, and loses what an earlier generation was given (as on delete);
//! 5. apply the operator's status fields, unless unchanged ([`crate::status`]).
//!
//! Deletion is [`crate::cleanup`]. Every write is a server-side apply under
//! [`vcp_crds::OPERATOR_FIELD_MANAGER`]; a converged plugin costs reads only.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, info, warn};
use vcp_crds::{FINALIZER, OPERATOR_FIELD_MANAGER, PLUGIN_NAME_LABEL, VClusterPlugin, WorkloadRef};

use crate::error::{Error, Result};
use crate::policy::{self, Policy};
use crate::rbac::{self, DesiredRbac, Plurals};
use crate::status::{self, Check, Outcome};
use crate::workload::{self, Refusal, Workload, WorkloadKind};
use crate::{Config, cleanup};

/// Name under which the operator reports Events.
pub const CONTROLLER_NAME: &str = "vcluster-plugin-operator";

/// How often a converged plugin is reconciled again (drift the watches cannot see).
pub const RESYNC: Duration = Duration::from_secs(600);

/// Delay before a failed reconcile is retried.
pub const RETRY: Duration = Duration::from_secs(5);

/// State shared by every reconcile.
pub struct Context {
    /// Client with the operator's identity.
    pub client: Client,
    /// Image of the embedded-runtime sidecar (`--runtime-image`).
    pub runtime_image: String,
    /// Publishes Events on VClusterPlugins.
    pub recorder: Recorder,
    /// Which RBAC rules a plugin may grant (`--policy-file`).
    pub policy: Policy,
    /// Every VClusterPlugin, from the controller's watch cache (used to build the workload's
    /// apply body from all plugins of a vCluster).
    pub plugins: Store<VClusterPlugin>,
    /// Reconcile metrics and readiness.
    pub telemetry: Arc<crate::Telemetry>,
    /// One lock per workload (`namespace/vcluster`): reconciles of plugins of the same vCluster
    /// compute and send the workload's apply body one at a time.
    workload_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Context {
    /// The lock serializing writes to the workload of `vcluster` in `namespace`.
    pub fn workload_lock(&self, namespace: &str, vcluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .workload_locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks
            .entry(format!("{namespace}/{vcluster}"))
            .or_default()
            .clone()
    }

    /// The plugins installed into `vcluster` of `namespace` according to the watch cache,
    /// except `without`, with `current` (fresher than the cache) in place of its cached copy.
    /// Plugins the policy refuses are left out: they get nothing in the workload. Those the
    /// cluster state refuses are left out by [`ClusterFacts::accepted`] before planning.
    pub fn installed_plugins(
        &self,
        namespace: &str,
        vcluster: &str,
        current: Option<&VClusterPlugin>,
        without: Option<&str>,
    ) -> Vec<VClusterPlugin> {
        let current_name = current.map(|c| c.name_any());
        let mut out: Vec<VClusterPlugin> = self
            .plugins
            .state()
            .iter()
            .filter(|p| Some(p.name_any()) != current_name)
            .map(|p| (**p).clone())
            .chain(current.cloned())
            .filter(|p| workload::contributes(p, namespace, vcluster))
            .filter(|p| policy::evaluate(&self.policy, p).is_ok())
            .collect();
        if let Some(without) = without {
            out.retain(|p| p.name_any() != without);
        }
        out
    }
}

/// Runs the controller until `shutdown` completes (then in-flight reconciles finish) or the
/// returned future is dropped.
///
/// # Errors
/// None today: watch errors are retried with backoff and logged. The `Result` leaves room for
/// start-up checks.
pub async fn run_until(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let client = config.client.clone();
    let wc = watcher::Config::default().any_semantic();
    let controller = Controller::new(Api::<VClusterPlugin>::all(client.clone()), wc.clone());
    let store = controller.store();
    let context = Arc::new(Context {
        client: client.clone(),
        runtime_image: config.runtime_image.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.into(),
                instance: config.instance.clone(),
            },
        ),
        plugins: store.clone(),
        policy: config.policy.clone(),
        telemetry: config.telemetry.clone(),
        workload_locks: Mutex::default(),
    });

    // Ready (while leading) once the API server answers a list of VClusterPlugins with the
    // operator's identity (reachable, CRD installed, RBAC in place); retried every second.
    let telemetry = config.telemetry.clone();
    let probe: Api<VClusterPlugin> = Api::all(client.clone());
    let readiness = tokio::spawn(async move {
        loop {
            match probe.list_metadata(&ListParams::default().limit(1)).await {
                Ok(_) => {
                    telemetry.set_synced(true);
                    return;
                }
                Err(e) => debug!(error = %e, "not ready: cannot list VClusterPlugins"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    let sts_store = store.clone();
    let deploy_store = store.clone();
    let labelled = watcher::Config::default()
        .labels(PLUGIN_NAME_LABEL)
        .any_semantic();

    controller
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .watches(
            Api::<StatefulSet>::all(client.clone()),
            wc.clone(),
            move |sts| {
                plugins_of_workload(
                    &sts_store,
                    &sts.namespace().unwrap_or_default(),
                    &sts.name_any(),
                )
            },
        )
        .watches(
            Api::<Deployment>::all(client.clone()),
            wc.clone(),
            move |d| {
                plugins_of_workload(
                    &deploy_store,
                    &d.namespace().unwrap_or_default(),
                    &d.name_any(),
                )
            },
        )
        .owns(Api::<Role>::all(client.clone()), wc.clone())
        .owns(Api::<RoleBinding>::all(client.clone()), wc.clone())
        .watches(
            Api::<ClusterRole>::all(client.clone()),
            labelled.clone(),
            plugin_of_labels,
        )
        .watches(
            Api::<ClusterRoleBinding>::all(client.clone()),
            labelled,
            plugin_of_labels,
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(plugin = %obj, "reconciled"),
                Err(e) => warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
    readiness.abort();
    config.telemetry.set_synced(false);
    Ok(())
}

/// The plugins (in the watch cache) targeting the workload `name` of `namespace`.
fn plugins_of_workload(
    store: &Store<VClusterPlugin>,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<VClusterPlugin>> {
    store
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace) && p.spec.vcluster.name == name)
        .map(|p| ObjectRef::from_obj(&**p))
        .collect()
}

/// The plugin a labelled cluster-scoped object was made for.
fn plugin_of_labels<K: Resource>(obj: K) -> Option<ObjectRef<VClusterPlugin>> {
    let labels = obj.labels();
    let name = labels.get(PLUGIN_NAME_LABEL)?;
    let namespace = labels.get(vcp_crds::PLUGIN_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(namespace))
}

/// Reconciles one VClusterPlugin: the finalizer wraps the install path (see the module docs)
/// and [`cleanup::cleanup`].
///
/// # Errors
/// Any API error; the controller retries after [`RETRY`] ([`error_policy`]).
pub async fn reconcile(plugin: Arc<VClusterPlugin>, ctx: Arc<Context>) -> Result<Action> {
    let started = std::time::Instant::now();
    let telemetry = ctx.telemetry.clone();
    let result = reconcile_inner(plugin, ctx).await;
    telemetry.observe_reconcile(
        started.elapsed(),
        result.as_ref().err().map(Error::metric_reason),
    );
    result
}

/// [`reconcile`] without the metrics.
async fn reconcile_inner(plugin: Arc<VClusterPlugin>, ctx: Arc<Context>) -> Result<Action> {
    let namespace = plugin
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<VClusterPlugin> = Api::namespaced(ctx.client.clone(), &namespace);
    let object = format!("{namespace}/{}", plugin.name_any());
    finalizer(&api, FINALIZER, plugin, |event| async {
        match event {
            FinalizerEvent::Apply(p) => apply(&p, &ctx).await,
            FinalizerEvent::Cleanup(p) => cleanup::cleanup(&p, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer {
        object,
        source: Box::new(e),
    })
}

/// Logs the error and retries after [`RETRY`].
pub fn error_policy(plugin: Arc<VClusterPlugin>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(
        plugin = %format!("{}/{}", plugin.namespace().unwrap_or_default(), plugin.name_any()),
        error = %error,
        "reconcile failed; retrying in {}s",
        RETRY.as_secs()
    );
    Action::requeue(RETRY)
}

/// The workload of the vCluster `name` in `namespace`: the StatefulSet, else the Deployment.
///
/// # Errors
/// API errors other than 404.
pub async fn fetch_workload(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Workload>> {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    if let Some(s) = sts
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get StatefulSet {namespace}/{name}"), e))?
    {
        return Ok(Some(Workload::from_statefulset(&s)));
    }
    let deploy: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    Ok(deploy
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get Deployment {namespace}/{name}"), e))?
        .map(|d| Workload::from_deployment(&d)))
}

/// Sends `patch` for `workload` unless it is already converged. Returns whether it wrote.
///
/// # Errors
/// The API server's answer to the apply.
pub async fn apply_workload(client: &Client, workload: &Workload, patch: &Value) -> Result<bool> {
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
    match workload.kind {
        Some(WorkloadKind::Deployment) => {
            Api::<Deployment>::namespaced(client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(|e| Error::kube(action.clone(), e))?;
        }
        _ => {
            Api::<StatefulSet>::namespaced(client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(|e| Error::kube(action.clone(), e))?;
        }
    }
    info!("{action}");
    Ok(true)
}

/// Writes the operator's status fields of `plugin` for `outcome` when they changed, and
/// publishes an Event when the `Ready` reason changed.
///
/// # Errors
/// The API server's answer to the status apply (Event failures are only logged).
pub async fn write_status(plugin: &VClusterPlugin, outcome: &Outcome, ctx: &Context) -> Result<()> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired = status::desired(plugin, outcome, &now);
    if !status::needs_write(plugin.status.as_ref(), &desired) {
        return Ok(());
    }
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    Api::<VClusterPlugin>::namespaced(ctx.client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(status::apply_body(plugin, &desired)),
        )
        .await
        .map_err(|e| {
            Error::kube(
                format!("apply status of VClusterPlugin {namespace}/{name}"),
                e,
            )
        })?;

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
        if let Err(e) = ctx.recorder.publish(&event, &plugin.object_ref(&())).await {
            warn!(plugin = %format!("{namespace}/{name}"), error = %e, "cannot publish Event");
        }
    }
    Ok(())
}

/// The install path of a plugin that carries the finalizer and is not being deleted.
async fn apply(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = lock.lock().await;
    let Some(wl) = fetch_workload(&ctx.client, &namespace, &vcluster).await? else {
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

    // Every refusal is decided before the workload is written (see the module docs).
    let candidates = ctx.installed_plugins(&namespace, &vcluster, Some(plugin), None);
    let refs: Vec<&VClusterPlugin> = candidates.iter().collect();
    let facts = ClusterFacts::read(&ctx.client, &namespace, &vcluster, &refs).await?;
    let installed = facts.accepted(&refs);
    let plan = workload::plan(&wl, &installed, &ctx.runtime_image);
    apply_workload(&ctx.client, &wl, &plan.patch).await?;
    drop(guard);

    let grant = match policy::evaluate(&ctx.policy, plugin) {
        Err(d) => Err(Check::failed(policy::REASON_POLICY_DENIED, d.message())),
        Ok(()) => facts
            .grant(plugin)
            .map_err(|r| Check::failed(r.reason, r.message))
            .and_then(|g| match plan.refused.get(&plugin.name_any()) {
                Some(r) => Err(Check::failed(r.reason, r.message.clone())),
                None => Ok(g),
            }),
    };
    let (workload_patched, rbac) = match grant {
        Ok(grant) => {
            apply_rbac(&ctx.client, plugin, grant.rbac).await?;
            let target = grant
                .vcluster_role
                .as_ref()
                .map(|(role, rules)| (role.as_str(), rules.as_slice()));
            sync_vcluster_roles(&ctx.client, plugin, target).await?;
            (Check::Ok, Check::Ok)
        }
        Err(refused) => {
            // A refused plugin gets nothing, and loses what an earlier generation was given:
            // its own Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules it
            // appended to the vCluster's Roles (reads only when there is nothing to remove).
            apply_rbac(&ctx.client, plugin, DesiredRbac::default()).await?;
            sync_vcluster_roles(&ctx.client, plugin, None).await?;
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
    Ok(Action::requeue(RESYNC))
}

/// What one plugin is given when it is not refused: its RBAC objects and, in
/// `rbac.mode: PatchVClusterRoles`, the vCluster Role to append to with the rules to append.
#[derive(Clone, Debug, Default)]
pub struct Grant {
    /// The plugin's own RBAC objects ([`rbac::desired`]).
    pub rbac: DesiredRbac,
    /// `PatchVClusterRoles` only: the Role bound to `vc-<vcluster>` and the plugin's rules.
    pub vcluster_role: Option<(String, Vec<k8s_openapi::api::rbac::v1::PolicyRule>)>,
}

/// The cluster state the refusals of the plugins of one vCluster depend on, read once per
/// reconcile (discovery results are shared by every plugin of the vCluster):
/// - the plurals of the types the plugins name ([`resolve_plurals_of`]); a type missing
///   here is refused with `UnknownType`;
/// - when some plugin uses `rbac.mode: PatchVClusterRoles`, the Role bound to the vCluster's
///   service account ([`find_vcluster_role`]); none is refused with `VClusterRoleNotFound`.
///
/// Every reconcile of a workload judges all its plugins from these facts, so they agree on
/// which plugins are installed (DESIGN.md: a refusal "leaves the workload untouched").
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    /// Plurals of the served types among those the plugins name.
    pub plurals: Plurals,
    /// The vCluster Role `PatchVClusterRoles` appends to, or why there is none; `None` when
    /// no plugin read with [`ClusterFacts::read`] uses that mode.
    pub vcluster_role: Option<std::result::Result<String, Refusal>>,
}

impl ClusterFacts {
    /// Reads the facts `plugins` (all of the vCluster `vcluster` in `namespace`) depend on.
    ///
    /// # Errors
    /// Discovery failures other than "not served", and list errors.
    pub async fn read(
        client: &Client,
        namespace: &str,
        vcluster: &str,
        plugins: &[&VClusterPlugin],
    ) -> Result<Self> {
        let plurals = resolve_plurals_of(client, plugins).await?;
        let vcluster_role = if plugins.iter().any(|p| rbac::patches_vcluster_roles(p)) {
            Some(find_vcluster_role(client, namespace, vcluster).await?)
        } else {
            None
        };
        Ok(Self {
            plurals,
            vcluster_role,
        })
    }

    /// What `plugin` is given, or why the cluster state refuses it (`UnknownType`,
    /// `VClusterRoleNotFound`). Policy and conflicts are judged elsewhere.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn grant(&self, plugin: &VClusterPlugin) -> std::result::Result<Grant, Refusal> {
        let desired = rbac::desired(plugin, &self.plurals)?;
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

    /// The plugins of `plugins` the cluster state does not refuse.
    pub fn accepted<'a>(&self, plugins: &[&'a VClusterPlugin]) -> Vec<&'a VClusterPlugin> {
        plugins
            .iter()
            .copied()
            .filter(|p| self.grant(p).is_ok())
            .collect()
    }
}

/// The plurals of the types every plugin of `plugins` needs, each type discovered once.
///
/// # Errors
/// Discovery failures other than "not served".
pub async fn resolve_plurals_of(client: &Client, plugins: &[&VClusterPlugin]) -> Result<Plurals> {
    let mut plurals = Plurals::new();
    let mut types: Vec<(String, String)> = plugins
        .iter()
        .flat_map(|p| rbac::types_to_resolve(p))
        .collect();
    types.sort();
    types.dedup();
    for (api_version, kind) in types {
        if let Some(plural) = discover_plural(client, &api_version, &kind).await? {
            plurals.insert((api_version, kind), plural);
        }
    }
    Ok(plurals)
}

/// The plural of `kind` in `api_version`, or `None` when the API server does not serve it.
///
/// # Errors
/// Discovery failures other than "not served".
async fn discover_plural(client: &Client, api_version: &str, kind: &str) -> Result<Option<String>> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, kind);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, _)) => Ok(Some(ar.plural)),
        Err(kube::Error::Discovery(_)) => Ok(None),
        // A group the API server does not serve answers a plain-text `404 page not found`,
        // which kube turns into a `Status` without the `NotFound` reason: match the code.
        Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(format!("discover {kind} in {api_version}"), e)),
    }
}

/// Plural names of the types [`rbac::types_to_resolve`] lists, by API discovery. A type the
/// API server does not serve is left out (and refused by [`rbac::desired`]).
///
/// # Errors
/// Discovery failures other than "not served".
pub async fn resolve_plurals(client: &Client, plugin: &VClusterPlugin) -> Result<Plurals> {
    resolve_plurals_of(client, &[plugin]).await
}

/// Applies the RBAC objects of `desired` that differ from the live ones, and deletes those the
/// plugin no longer needs (only when labelled as made for it).
///
/// # Errors
/// The API server's answers.
pub async fn apply_rbac(
    client: &Client,
    plugin: &VClusterPlugin,
    desired: DesiredRbac,
) -> Result<()> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let role_name = rbac::role_name(&name);
    let cluster_name = rbac::cluster_role_name(&namespace, &name);
    ensure(
        Api::<Role>::namespaced(client.clone(), &namespace),
        &role_name,
        desired.role,
        plugin,
        rbac::role_matches,
    )
    .await?;
    ensure(
        Api::<RoleBinding>::namespaced(client.clone(), &namespace),
        &role_name,
        desired.role_binding,
        plugin,
        rbac::role_binding_matches,
    )
    .await?;
    ensure(
        Api::<ClusterRole>::all(client.clone()),
        &cluster_name,
        desired.cluster_role,
        plugin,
        rbac::cluster_role_matches,
    )
    .await?;
    ensure(
        Api::<ClusterRoleBinding>::all(client.clone()),
        &cluster_name,
        desired.cluster_role_binding,
        plugin,
        rbac::cluster_role_binding_matches,
    )
    .await?;
    Ok(())
}

/// Makes the object `name` of `api` equal to `desired`: nothing when it matches, a server-side
/// apply when it differs, a delete when it is not desired but exists and is labelled as made
/// for `plugin`.
async fn ensure<K>(
    api: Api<K>,
    name: &str,
    desired: Option<K>,
    plugin: &VClusterPlugin,
    matches: fn(&K, &K) -> bool,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    let live = api
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get {kind} {name}"), e))?;
    match (desired, live) {
        (Some(d), Some(l)) if matches(&l, &d) => Ok(()),
        (Some(d), _) => {
            api.patch(
                name,
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(&d),
            )
            .await
            .map_err(|e| Error::kube(format!("server-side apply {kind} {name}"), e))?;
            info!("server-side apply {kind} {name}");
            Ok(())
        }
        (None, Some(l)) => delete_if_ours(&api, name, &l, plugin).await,
        (None, None) => Ok(()),
    }
}

/// Deletes `live` (named `name`) when it carries the labels of `plugin`; 404 is success.
///
/// # Errors
/// The API server's answer to the delete.
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
            info!("deleted {kind} {name}");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {kind} {name}"), e)),
    }
}

/// The Role `rbac.mode: PatchVClusterRoles` appends to in `namespace`: the one a RoleBinding
/// binds to `vc-<vcluster>` ([`rbac::target_role`]), when it exists. Reads only.
///
/// Returns a [`Refusal`] with [`rbac::REASON_NO_VCLUSTER_ROLE`] when no Role is bound to the
/// service account, or the bound Role does not exist.
///
/// # Errors
/// List errors.
pub async fn find_vcluster_role(
    client: &Client,
    namespace: &str,
    vcluster: &str,
) -> Result<std::result::Result<String, Refusal>> {
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list RoleBindings in {namespace}"), e))?
        .items;
    let sa = rbac::service_account_name(vcluster);
    let Some(target) = rbac::target_role(&bindings, namespace, vcluster) else {
        return Ok(Err(Refusal {
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
            message: format!(
                "no RoleBinding in {namespace} binds a Role to ServiceAccount {sa}, so rbac.mode PatchVClusterRoles has no Role to append to; use rbac.mode Dedicated"
            ),
        }));
    };
    let exists = Api::<Role>::namespaced(client.clone(), namespace)
        .get_opt(&target)
        .await
        .map_err(|e| Error::kube(format!("get Role {namespace}/{target}"), e))?
        .is_some();
    Ok(if exists {
        Ok(target)
    } else {
        Err(Refusal {
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
            message: format!(
                "a RoleBinding binds ServiceAccount {sa} to Role {target}, which does not exist in {namespace}; rbac.mode PatchVClusterRoles appends to it"
            ),
        })
    })
}

/// `rbac.mode: PatchVClusterRoles` ([`rbac::patch_role`]): makes the Role `target.0` (found
/// by [`find_vcluster_role`]) carry `target.1` as this plugin's appended entries, and restores
/// every other Role of the namespace that carries entries of this plugin (after a mode switch,
/// or when the bindings changed). `target: None` restores every such Role (`Dedicated` mode, a
/// refused plugin, and the finalizer). Writes only Roles that differ.
///
/// # Errors
/// API errors, including 409 Conflict when a Role changed between the read and the patch (the
/// reconcile is retried from fresh reads).
pub async fn sync_vcluster_roles(
    client: &Client,
    plugin: &VClusterPlugin,
    target: Option<(&str, &[k8s_openapi::api::rbac::v1::PolicyRule])>,
) -> Result<()> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let roles_api = Api::<Role>::namespaced(client.clone(), &namespace);
    let roles = roles_api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list Roles in {namespace}"), e))?
        .items;
    let key = rbac::added_rules_annotation(&name);
    for role in &roles {
        let role_name = role.name_any();
        let desired = match target {
            Some((t, r)) if t == role_name => Some(r),
            _ if role.annotations().contains_key(&key) => None,
            _ => continue,
        };
        if let Some(patch) = rbac::patch_role(role, &name, desired) {
            roles_api
                .patch(
                    &role_name,
                    &PatchParams {
                        field_manager: Some(OPERATOR_FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| {
                    Error::kube(
                        format!("merge-patch the rules of Role {namespace}/{role_name}"),
                        e,
                    )
                })?;
            info!(
                "{} rules of VClusterPlugin {name} in Role {namespace}/{role_name}",
                if desired.is_some() {
                    "appended"
                } else {
                    "removed the"
                }
            );
        }
    }
    Ok(())
}
