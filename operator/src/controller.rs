//! The controller: watches, the reconcile of one `VClusterPlugin`, and the error policy.
//!
//! Reconcile (DESIGN.md, "Operator contract"), for a plugin that is not being deleted:
//! 0. add the finalizer `vcp.dev/cleanup` when missing (to this plugin, and, once the
//!    workload is found, to the other plugins of the vCluster that lack it, so that the
//!    workload is applied once with all of them), and go on in the same reconcile;
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
//! [`vcp_crds::OPERATOR_FIELD_MANAGER`] (the finalizer: a JSON patch; a vCluster Role in
//! `PatchVClusterRoles` mode: a merge patch with `resourceVersion`).
//!
//! Reads: the install path reads the workload, the RBAC objects and the namespace's Roles and
//! RoleBindings from watch caches ([`crate::cache`]) and the plurals of synced types from a
//! discovery cache, so a converged plugin costs no request at all. The same watches trigger
//! reconciles (of the plugins targeting a changed workload; of the plugin whose RBAC object
//! changed), debounced by [`DEBOUNCE`].

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
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{debug, info, warn};
use vcp_crds::{FINALIZER, OPERATOR_FIELD_MANAGER, PLUGIN_NAME_LABEL, VClusterPlugin, WorkloadRef};

use crate::cache::{self, Caches, CachesReady, Discovery, WrittenWorkloads};
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

/// How soon a plugin refused for the state of the cluster rather than its own spec
/// (`UnknownType`: a type the host does not serve; `VClusterRoleNotFound`: no Role bound to the
/// vCluster's service account) is judged again. The CRD or Role that resolves the refusal is
/// not watched for this plugin (it is not the plugin's own), so without this the plugin would
/// wait for [`RESYNC`].
pub const RECHECK: Duration = Duration::from_secs(20);

/// How long the controller waits after the last trigger of a plugin before reconciling it
/// (trailing-edge debounce, `kube::runtime::controller::Config::debounce`): the watch events
/// of one reconcile's own writes (finalizer, workload, RBAC objects, status) coalesce into at
/// most one more reconcile, which then reads caches that have seen those writes.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

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
    /// Watch caches of workloads and RBAC objects (the install path reads these, not the API
    /// server; see [`crate::cache`]).
    pub caches: Caches,
    /// Set once [`Context::caches`] hold their initial lists; reconciles wait for it.
    pub caches_ready: CachesReady,
    /// The workloads this operator applied, until [`Context::caches`] shows them.
    pub written: WrittenWorkloads,
    /// Plurals found by API discovery.
    pub discovery: Discovery,
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
    /// except `without`, with the copies in `fresher` (newer than the cache, such as the
    /// answers to the finalizer patches) in place of their cached ones.
    /// Plugins the policy refuses are left out: they get nothing in the workload. Those the
    /// cluster state refuses are left out by [`ClusterFacts::accepted`] before planning.
    pub fn installed_plugins(
        &self,
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
        let mut out: Vec<VClusterPlugin> = self
            .plugins
            .state()
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
    // Consistent lists (the default, not `any_semantic`): after an API server restart a list
    // served from its still-filling watch cache can return a resourceVersion the cache has
    // already compacted away, and the watch from it fails with `410 Expired` again and again
    // (minutes without reconciles, seen by hand before this was changed).
    let wc = watcher::Config::default();
    let controller = Controller::new(Api::<VClusterPlugin>::all(client.clone()), wc.clone());
    let store = controller.store();
    let (caches, streams) = Caches::new(&client);
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
        caches_ready: caches.ready_signal(),
        caches,
        written: WrittenWorkloads::default(),
        discovery: Discovery::default(),
        workload_locks: Mutex::default(),
    });

    // Ready (while leading) once the API server answers a list of VClusterPlugins with the
    // operator's identity (reachable, CRD installed, RBAC in place; retried every second) and
    // every watch cache holds its first full list (reconciles wait for the same).
    let telemetry = config.telemetry.clone();
    let probe: Api<VClusterPlugin> = Api::all(client.clone());
    let caches_ready = context.caches_ready.clone();
    let readiness = tokio::spawn(async move {
        loop {
            match probe.list_metadata(&ListParams::default().limit(1)).await {
                Ok(_) => break,
                Err(e) => debug!(error = %e, "not ready: cannot list VClusterPlugins"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if caches_ready.wait().await.is_ok() {
            telemetry.set_synced(true);
        }
    });

    let sts_store = store.clone();
    let deploy_store = store.clone();

    // The cache streams both fill `context.caches` and trigger reconciles: a change of a
    // workload reconciles the plugins targeting it, a change of a plugin's own RBAC object
    // (owned, or labelled when cluster-scoped) reconciles that plugin.
    controller
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(config.concurrency)
                .debounce(DEBOUNCE),
        )
        .trigger_backoff(trigger_backoff())
        .watches_stream(streams.statefulsets, move |sts| {
            plugins_of_workload(
                &sts_store,
                &sts.namespace().unwrap_or_default(),
                &sts.name_any(),
            )
        })
        .watches_stream(streams.deployments, move |d| {
            plugins_of_workload(
                &deploy_store,
                &d.namespace().unwrap_or_default(),
                &d.name_any(),
            )
        })
        .owns_stream(streams.roles)
        .owns_stream(streams.role_bindings)
        .watches_stream(streams.cluster_roles, plugin_of_labels)
        .watches_stream(streams.cluster_role_bindings, plugin_of_labels)
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

/// The pause of all triggers after an error of any trigger watch: 100 ms doubling to at most
/// 2 s, with jitter.
///
/// kube-runtime's default (0.8 s doubling to 30 s, reset only after 120 s without an error)
/// pauses *every* watch of the controller on each error of *one*; the seven watches here each
/// fail during an API server restart and once more when they re-list, so with the default the
/// operator sat for minutes after the API server was back (reproduced by
/// `tests/tests/operator_restart.rs`). Each cache stream backs off on its own
/// ([`crate::cache`]), so this pause only needs to keep an error loop from spinning.
fn trigger_backoff() -> kube::runtime::watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
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

/// Reconciles one VClusterPlugin: the install path (see the module docs) while it is not
/// being deleted, [`cleanup::cleanup`] once it is. The finalizer `vcp.dev/cleanup` is added
/// before anything is installed (in the same reconcile), and removed only after a successful
/// cleanup.
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
    ctx.caches_ready.wait().await?;
    let index = plugin.finalizers().iter().position(|f| f == FINALIZER);
    match (plugin.metadata.deletion_timestamp.is_some(), index) {
        // The install path adds the finalizer when missing, and goes on in the same reconcile.
        (false, _) => apply(&plugin, &ctx).await,
        (true, Some(i)) => {
            let action = cleanup::cleanup(&plugin, &ctx).await?;
            let api: Api<VClusterPlugin> = Api::namespaced(ctx.client.clone(), &namespace);
            remove_finalizer(&api, &plugin, i).await?;
            Ok(action)
        }
        // Being deleted, and nothing of ours to remove.
        (true, None) => Ok(Action::await_change()),
    }
}

/// `plugin` carrying [`FINALIZER`]: as it is when it does, else the answer to
/// [`add_finalizer`]. When that patch fails (its `test` found other finalizers than the copy
/// read: the copy was stale, or someone else changed them), the plugin is read again and
/// returned when it carries the finalizer by now.
///
/// # Errors
/// [`Error::Finalizer`] when the patch failed and the plugin still lacks the finalizer.
async fn with_finalizer(ctx: &Context, plugin: &VClusterPlugin) -> Result<VClusterPlugin> {
    if plugin.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(plugin.clone());
    }
    let namespace = plugin.namespace().unwrap_or_default();
    let api: Api<VClusterPlugin> = Api::namespaced(ctx.client.clone(), &namespace);
    match add_finalizer(&api, plugin).await {
        Ok(p) => Ok(p),
        Err(e @ Error::Finalizer { .. }) => {
            let fresh = api.get_opt(&plugin.name_any()).await.map_err(|g| {
                Error::kube(
                    format!("get VClusterPlugin {namespace}/{}", plugin.name_any()),
                    g,
                )
            })?;
            match fresh {
                Some(f) if f.finalizers().iter().any(|x| x == FINALIZER) => Ok(f),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Adds [`FINALIZER`] to `plugin` with a JSON patch whose `test` operation fails when
/// `metadata.finalizers` changed since `plugin` was read (finalizers are not deduplicated by
/// the API server). Returns the patched object.
///
/// # Errors
/// [`Error::Finalizer`]: the API server's answer (such as 422 when the test failed; the
/// reconcile is then retried from the watch event of that change).
async fn add_finalizer(
    api: &Api<VClusterPlugin>,
    plugin: &VClusterPlugin,
) -> Result<VClusterPlugin> {
    let finalizers = plugin.finalizers();
    let ops = if finalizers.is_empty() {
        serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": null },
            { "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] },
        ])
    } else {
        serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": finalizers },
            { "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER },
        ])
    };
    finalizer_patch(api, plugin, "add", ops).await
}

/// Removes [`FINALIZER`] (at `index` of `metadata.finalizers`) from `plugin`; the `test`
/// operation makes the patch fail instead of removing another finalizer that moved there.
///
/// # Errors
/// [`Error::Finalizer`]: the API server's answer (404 is success: the object is gone).
async fn remove_finalizer(
    api: &Api<VClusterPlugin>,
    plugin: &VClusterPlugin,
    index: usize,
) -> Result<()> {
    let path = format!("/metadata/finalizers/{index}");
    let ops = serde_json::json!([
        { "op": "test", "path": path, "value": FINALIZER },
        { "op": "remove", "path": path },
    ]);
    match finalizer_patch(api, plugin, "remove", ops).await {
        Err(Error::Finalizer {
            source: kube::Error::Api(s),
            ..
        }) if s.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Sends the JSON patch `ops` (RFC 6902) to `plugin`'s `metadata.finalizers`.
async fn finalizer_patch(
    api: &Api<VClusterPlugin>,
    plugin: &VClusterPlugin,
    action: &'static str,
    ops: Value,
) -> Result<VClusterPlugin> {
    let name = plugin.name_any();
    let object = format!("{}/{name}", plugin.namespace().unwrap_or_default());
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| Error::Finalizer {
        action,
        object: object.clone(),
        source: kube::Error::SerdeError(e),
    })?;
    api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| Error::Finalizer {
            action,
            object,
            source,
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

/// The workload of the vCluster `name` in `namespace`: the StatefulSet, else the Deployment,
/// read from the API server (the finalizer path; the install path reads
/// [`cache::workload`]).
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
/// The API server's answer is remembered in [`Context::written`].
///
/// # Errors
/// The API server's answer to the apply.
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
    match workload.kind {
        Some(WorkloadKind::Deployment) => {
            let applied = Api::<Deployment>::namespaced(ctx.client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(|e| Error::kube(action.clone(), e))?;
            ctx.written.deployment(&applied);
        }
        _ => {
            let applied = Api::<StatefulSet>::namespaced(ctx.client.clone(), &workload.namespace)
                .patch(&workload.name, &pp, &Patch::Apply(patch))
                .await
                .map_err(|e| Error::kube(action.clone(), e))?;
            ctx.written.statefulset(&applied);
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

/// The install path of a plugin that is not being deleted.
///
/// Under the workload's lock, the finalizer is added first to this plugin and then to every
/// other plugin of the vCluster that lacks it and is not being deleted (each would add it in
/// its own reconcile before anything is installed for it): the workload is then planned with
/// all of them and applied once, instead of once per plugin as each gains its finalizer.
async fn apply(plugin: &VClusterPlugin, ctx: &Context) -> Result<Action> {
    let namespace = plugin.namespace().unwrap_or_default();
    let vcluster = plugin.spec.vcluster.name.clone();

    let lock = ctx.workload_lock(&namespace, &vcluster);
    let guard = lock.lock().await;
    // The cached copy may be newer than the one this reconcile was started with (another
    // reconcile of the vCluster may have added its finalizer meanwhile).
    let latest = ctx
        .plugins
        .get(&ObjectRef::from_obj(plugin))
        .map_or_else(|| plugin.clone(), |p| (*p).clone());
    if latest.metadata.deletion_timestamp.is_some() {
        // Deleted since this reconcile started: the deletion's own trigger runs the cleanup.
        return Ok(Action::await_change());
    }
    let plugin = &with_finalizer(ctx, &latest).await?;
    let Some(wl) = cache::workload(&ctx.caches, &ctx.written, &namespace, &vcluster) else {
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
    let candidates = ctx.installed_plugins(&namespace, &vcluster, &fresher, None);
    let refs: Vec<&VClusterPlugin> = candidates.iter().collect();
    let facts = ClusterFacts::read(ctx, &namespace, &vcluster, &refs).await?;
    let installed = facts.accepted(&refs);
    let plan = workload::plan(&wl, &installed, &ctx.runtime_image);
    apply_workload(ctx, &wl, &plan.patch).await?;
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
            apply_rbac(ctx, plugin, grant.rbac).await?;
            let target = grant
                .vcluster_role
                .as_ref()
                .map(|(role, rules)| (role.as_str(), rules.as_slice()));
            let roles = ctx.caches.roles_in(&namespace);
            sync_vcluster_roles(&ctx.client, plugin, target, roles).await?;
            (Check::Ok, Check::Ok)
        }
        Err(refused) => {
            // A refused plugin gets nothing, and loses what an earlier generation was given:
            // its own Role / RoleBinding / ClusterRole / ClusterRoleBinding and the rules it
            // appended to the vCluster's Roles (reads only when there is nothing to remove).
            apply_rbac(ctx, plugin, DesiredRbac::default()).await?;
            let roles = ctx.caches.roles_in(&namespace);
            sync_vcluster_roles(&ctx.client, plugin, None, roles).await?;
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

/// When to reconcile a plugin again after its install path ended with `rbac`: [`RECHECK`] when
/// it was refused for the cluster's state (see there), else [`RESYNC`].
pub fn next_reconcile(rbac: &Check) -> Duration {
    match rbac {
        Check::Failed { reason, .. }
            if reason == rbac::REASON_UNKNOWN_TYPE || reason == rbac::REASON_NO_VCLUSTER_ROLE =>
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
    /// `PatchVClusterRoles` only: the Role bound to `vc-<vcluster>` and the plugin's rules.
    pub vcluster_role: Option<(String, Vec<k8s_openapi::api::rbac::v1::PolicyRule>)>,
}

/// The cluster state the refusals of the plugins of one vCluster depend on, read once per
/// reconcile (discovery results are shared by every plugin of the vCluster):
/// - the plurals of the types the plugins name ([`Discovery::plurals_of`]); a type missing
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
    /// Reads the facts `plugins` (all of the vCluster `vcluster` in `namespace`) depend on:
    /// plurals from [`Context::discovery`], Roles and RoleBindings from [`Context::caches`].
    ///
    /// # Errors
    /// Discovery failures other than "not served".
    pub async fn read(
        ctx: &Context,
        namespace: &str,
        vcluster: &str,
        plugins: &[&VClusterPlugin],
    ) -> Result<Self> {
        let plurals = ctx.discovery.plurals_of(&ctx.client, plugins).await?;
        let vcluster_role = if plugins.iter().any(|p| rbac::patches_vcluster_roles(p)) {
            Some(find_vcluster_role(&ctx.caches, namespace, vcluster))
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
    let kind = K::kind(&Default::default()).to_string();
    match (desired, live) {
        (Some(d), Some(l)) if matches(&l, &d) => Ok(()),
        (Some(d), _) => {
            let name = d.name_any();
            api.patch(
                &name,
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(&d),
            )
            .await
            .map_err(|e| Error::kube(format!("server-side apply {kind} {name}"), e))?;
            info!("server-side apply {kind} {name}");
            Ok(())
        }
        (None, Some(l)) => delete_if_ours(&api, &l.name_any(), &l, plugin).await,
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
/// binds to `vc-<vcluster>` ([`rbac::target_role`]), when it exists (both read from `caches`).
///
/// Returns a [`Refusal`] with [`rbac::REASON_NO_VCLUSTER_ROLE`] when no Role is bound to the
/// service account, or the bound Role does not exist.
pub fn find_vcluster_role(
    caches: &Caches,
    namespace: &str,
    vcluster: &str,
) -> std::result::Result<String, Refusal> {
    let bindings = caches.role_bindings_in(namespace);
    let sa = rbac::service_account_name(vcluster);
    let Some(target) = rbac::target_role(&bindings, namespace, vcluster) else {
        return Err(Refusal {
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
            message: format!(
                "no RoleBinding in {namespace} binds a Role to ServiceAccount {sa}, so rbac.mode PatchVClusterRoles has no Role to append to; use rbac.mode Dedicated"
            ),
        });
    };
    let exists = caches
        .roles
        .get(&ObjectRef::new(&target).within(namespace))
        .is_some();
    if exists {
        Ok(target)
    } else {
        Err(Refusal {
            reason: rbac::REASON_NO_VCLUSTER_ROLE,
            message: format!(
                "a RoleBinding binds ServiceAccount {sa} to Role {target}, which does not exist in {namespace}; rbac.mode PatchVClusterRoles appends to it"
            ),
        })
    }
}

/// Every Role of `namespace`, read from the API server (the finalizer path).
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
    client: &Client,
    plugin: &VClusterPlugin,
    target: Option<(&str, &[k8s_openapi::api::rbac::v1::PolicyRule])>,
    roles: Vec<Role>,
) -> Result<()> {
    let namespace = plugin.namespace().unwrap_or_default();
    let name = plugin.name_any();
    let roles_api = Api::<Role>::namespaced(client.clone(), &namespace);
    let key = rbac::added_rules_annotation(&name);
    for role in &roles {
        let role_name = role.name_any();
        let desired = match target {
            Some((t, r)) if t == role_name => Some(r),
            _ if role.annotations().contains_key(&key) => None,
            _ => continue,
        };
        let Some(patch) = rbac::patch_role(role, &name, desired) else {
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
                let Some(patch) = fresh.and_then(|r| rbac::patch_role(&r, &name, desired)) else {
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
        for reason in [rbac::REASON_UNKNOWN_TYPE, rbac::REASON_NO_VCLUSTER_ROLE] {
            assert_eq!(
                next_reconcile(&Check::failed(reason, "m")),
                RECHECK,
                "{reason}"
            );
        }
        for reason in ["PolicyDenied", "Conflict", "VClusterNotFound"] {
            assert_eq!(
                next_reconcile(&Check::failed(reason, "m")),
                RESYNC,
                "{reason}"
            );
        }
    }
}
