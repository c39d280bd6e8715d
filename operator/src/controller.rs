//! The controller: watches, the mappers from watched objects to plugins, the reconcile of one
//! `VClusterPlugin`, and the error policy.
//!
//! Where each rule of a reconcile lives:
//!
//! | step of a reconcile | module |
//! | --- | --- |
//! | add the finalizer `vcp.dev/cleanup` (to this plugin and its sibling plugins), remove it after the cleanup | [`crate::finalizer`] |
//! | converging the plugin's vCluster, for an install or a delete: observe (workload, plugins, cluster facts, dry runs) → decide (a pure plan: every refusal before any write) → act (workload, RBAC) → report (status) | [`crate::vcluster`] |
//! | nothing left behind by a plugin deleted without the finalizer's cleanup: at start, after each delete, periodically | [`crate::sweep`] |
//! | every write to the API server (server-side apply under [`vcp_crds::OPERATOR_FIELD_MANAGER`], deletes of the plugin's own objects, the status and its Event) | [`crate::writes`] |
//! | state shared by reconciles (client, recorder, policy, caches, per-workload locks) | [`crate::context`] |
//!
//! A reconcile of a plugin that is not being deleted runs [`crate::vcluster::install`], which
//! adds the finalizer and installs in the same reconcile. A plugin being deleted that carries
//! the finalizer runs [`crate::vcluster::delete`], then the finalizer is removed
//! ([`crate::finalizer::remove_finalizer`]); one without it is left alone. (Why not
//! kube-runtime's `finalizer` helper: see [`crate::finalizer`].)
//!
//! Reads: the install path reads the vCluster workload and the plugin's own RBAC objects from
//! label-selected watch caches ([`crate::cache`]) and the plurals of synced types from a
//! discovery cache, so a converged plugin in `rbac.mode: Dedicated` costs no request but the
//! reads of its vCluster's own pods (one GET per replica of a StatefulSet, one bounded list for a
//! Deployment: [`crate::rollout`]; what else costs direct reads: see [`crate::cache`]). The same watches trigger
//! reconciles (of the plugins targeting a changed workload; of the plugin whose RBAC object
//! changed), debounced by [`DEBOUNCE`](crate::DEBOUNCE) (default of [`Config::debounce`]). The
//! vCluster Roles `rbac.mode: PatchVClusterRoles` plugins append to are not in those caches;
//! they are watched per namespace ([`crate::patched_roles`]), so an edit that takes a plugin's
//! rule out triggers the reconcile that puts it back.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{debug, instrument, warn};
use vcp_crds::tolerant::{self, Skipped, StatusPolicy, Tolerant};
use vcp_crds::{FINALIZER, PLUGIN_NAME_LABEL, VClusterPlugin};

use crate::cache::{Caches, Discovery, WorkloadCopies};
use crate::config::Config;
use crate::context::{Context, WorkloadLocks};
use crate::error::{Error, Result};
use crate::judge::Verdicts;
use crate::patched_roles::{self, PatchedRoleWatches};
use crate::retry::Retries;
use crate::tolerant::UndecodablePlugins;
use crate::trace::Key;
use crate::{finalizer, sweep, vcluster};

/// Name under which the operator reports Events.
pub const CONTROLLER_NAME: &str = "vcluster-plugin-operator";

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
    // consistent lists in small pages, as every operator watch (`cache::watch_config`)
    let wc = crate::cache::watch_config();
    // The plugins' cache, as `Controller::new` makes it, but without `managedFields` and with
    // refused plugins slimmed ([`for_the_cache`]).
    let (store, writer) = reflector::store();
    // The sweep ([`crate::sweep`]) runs once this cache holds its first full list, and after
    // every delete it reports (with or without the finalizer having run).
    let (plugins_ready_tx, plugins_ready) = tokio::sync::watch::channel(false);
    let (sweeps, scopes) = sweep::channel();
    let gone = sweeps.clone();
    // The per-plugin retry delays ([`crate::retry`]): a deleted plugin's go with it, and a
    // re-list drops those of plugins deleted during a watch outage.
    let retries = Arc::new(Retries::default());
    let (listed, retries_of_deleted) = (store.clone(), retries.clone());
    // The vCluster Roles of `rbac.mode: PatchVClusterRoles` plugins: watched per namespace
    // while such a plugin lives there ([`crate::patched_roles`]), started and stopped here as
    // the plugins' cache changes.
    let (role_watches, patched_roles) = PatchedRoleWatches::new(&client, &config.telemetry);
    let (telemetry, mut lists) = (config.telemetry.clone(), 0);
    // Tolerant reading ([`crate::tolerant`]): a plugin the operator's types cannot read skips
    // only itself; one whose status alone cannot be read is reconciled without it. An
    // unreadable plugin is reported (`Ready=False`, `Undecodable`) by its own task.
    let (undecodable, to_report) = UndecodablePlugins::new();
    let report_to = undecodable.clone();
    let (noted, skipped_telemetry) = (undecodable.clone(), config.telemetry.clone());
    let plugins = tolerant::watcher(
        Api::<Tolerant<VClusterPlugin>>::all(client.clone()),
        wc,
        StatusPolicy::PassWithout,
        move |s: &Skipped| {
            crate::tolerant::log_skipped("VClusterPlugin", s, &skipped_telemetry);
            noted.note(s);
        },
        crate::tolerant::ghost_of(store.clone()),
    )
    .modify(for_the_cache(config.runtime_image.clone()))
    .reflect(writer)
    .inspect(move |event| match event {
        Ok(watcher::Event::Init) => telemetry.count_list("VClusterPlugin", &mut lists),
        // A re-list after a watch error: deletes during the outage came as no event.
        Ok(watcher::Event::InitDone) if *plugins_ready_tx.borrow() => {
            retries_of_deleted.retain(|p| listed.get(p).is_some());
            role_watches.sync_all(&listed);
            sweeps.sweep(sweep::Scope::All);
        }
        Ok(watcher::Event::InitDone) => {
            role_watches.sync_all(&listed);
            let _ = plugins_ready_tx.send(true);
        }
        Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
            undecodable.readable(p.metadata.uid.as_deref());
            if matches!(event, Ok(watcher::Event::Apply(_))) {
                role_watches.sync(&listed, p, false);
            }
        }
        Ok(watcher::Event::Delete(p)) => {
            undecodable.readable(p.metadata.uid.as_deref());
            retries_of_deleted.forget(&ObjectRef::from_obj(p));
            role_watches.sync(&listed, p, true);
            sweeps.sweep(sweep::Scope::Plugin {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
            });
        }
        _ => {}
    })
    .applied_objects();
    let controller = Controller::for_stream(plugins, store.clone());
    let (caches, streams) = Caches::new(&client, &config.telemetry);
    let context = Arc::new(Context {
        client: client.clone(),
        runtime_image: config.runtime_image.clone(),
        reporter: Reporter {
            controller: CONTROLLER_NAME.into(),
            instance: config.instance.clone(),
        },
        plugins: store.clone(),
        policy: config.policy.clone(),
        telemetry: config.telemetry.clone(),
        caches_ready: caches.ready_signal(),
        caches,
        copies: WorkloadCopies::default(),
        written_statuses: Default::default(),
        discovery: Discovery::default(),
        verdicts: Verdicts::default(),
        workload_locks: WorkloadLocks::default(),
        retries,
    });
    // The test endpoint `/state` (feature `reconcile-log`): this controller's per-object state.
    #[cfg(feature = "reconcile-log")]
    {
        let (of, backlog) = (Arc::downgrade(&context), gone.backlog());
        config.telemetry.set_state_probe(Box::new(move || {
            // This controller has stopped: nothing to report.
            let Some(context) = of.upgrade() else {
                return Vec::new();
            };
            let mut figures = context.state();
            figures.push((
                "sweep_backlog",
                i64::try_from(backlog.pending()).unwrap_or(i64::MAX),
            ));
            figures
        }));
    }

    // Ready (while leading) once the API server answers a list of VClusterPlugins with the
    // operator's identity (reachable, CRD installed, RBAC in place; retried every second) and
    // every watch cache holds its first full list (reconciles wait for the same).
    let telemetry = config.telemetry.clone();
    let probe: Api<VClusterPlugin> = Api::all(client.clone());
    let caches_ready = context.caches_ready.clone();
    let readiness = AbortOnDropHandle::new(tokio::spawn(async move {
        loop {
            match probe.list_metadata(&ListParams::default().limit(1)).await {
                // An answer the metadata types cannot decode is still an answer: the API
                // server is reachable, the CRD installed and the list allowed, which is all
                // this probe asks (like every other read, one object never blocks it).
                Ok(_) | Err(kube::Error::SerdeError(_)) => break,
                Err(e) => debug!(error = %e, "not ready: cannot list VClusterPlugins"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if caches_ready.wait().await.is_ok() {
            telemetry.set_synced(true);
        }
    }));

    // The background tasks end with this function, also when it is dropped mid-way (a replica
    // that loses its Lease drops the controller's future): a sweep must never go on writing on
    // a replica that no longer leads.
    let sweeper = AbortOnDropHandle::new(sweep::spawn(context.clone(), plugins_ready, scopes));
    let reporter = AbortOnDropHandle::new(tokio::spawn(crate::tolerant::report_undecodable(
        client.clone(),
        context.reporter.clone(),
        report_to,
        to_report,
    )));
    let trimmer = AbortOnDropHandle::new(tokio::spawn(crate::trim::after_bursts(
        config.telemetry.clone(),
        crate::trim::IDLE,
        crate::trim::BUSY_INTERVALS,
        crate::trim::SETTLE_INTERVALS,
    )));

    let sts_store = store.clone();
    let deploy_store = store.clone();
    let role_store = store.clone();

    // The cache streams both fill `context.caches` and trigger reconciles: a change of a
    // workload reconciles the plugins targeting it, a change of a plugin's own RBAC object
    // (owned, or labelled when cluster-scoped) reconciles that plugin, a vCluster Role that may
    // no longer hold what `PatchVClusterRoles` plugins appended reconciles those of its
    // namespace.
    controller
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(config.concurrency)
                .debounce(config.debounce),
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
        .watches_stream(patched_roles, move |role| {
            patched_roles::plugins_of_role(&role_store, &role.namespace().unwrap_or_default())
        })
        .watches_stream(streams.cluster_roles, plugin_of_labels)
        .watches_stream(streams.cluster_role_bindings, plugin_of_labels)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|res| {
            let gone = gone.clone();
            async move {
                match res {
                    Ok((obj, _)) => debug!(plugin = %obj, "reconciled"),
                    // A trigger (a change of an owned or labelled object) of a plugin that is
                    // gone: an ordinary delete, not a failure. The object may have been written by
                    // a reconcile in flight during the delete, after the delete's sweep: sweep
                    // that plugin again.
                    Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                        debug!(plugin = %obj, "triggered for a plugin that no longer exists");
                        gone.sweep(sweep::Scope::Plugin {
                            namespace: obj.namespace.clone().unwrap_or_default(),
                            name: obj.name.clone(),
                        });
                    }
                    Err(e) => warn!(error = %e, "reconcile failed"),
                }
            }
        })
        .await;
    drop((readiness, sweeper, trimmer, reporter));
    config.telemetry.set_synced(false);
    Ok(())
}

/// What the plugins' watch stream does to each object before the cache stores it: drops
/// `managedFields` (nothing reads them; in memory they are larger than the rest of a plugin
/// with its status), then slims a refused plugin ([`crate::slim`]: its free-form parts
/// dropped, so that a tenant's refused plugins do not hold the operator's memory).
/// Only the in-memory copy changes. `runtime_image` is the operator's `--runtime-image`.
fn for_the_cache(runtime_image: String) -> impl FnMut(&mut VClusterPlugin) {
    move |p: &mut VClusterPlugin| {
        p.metadata.managed_fields = None;
        if let Some(dropped) = crate::slim::slim(p, &runtime_image) {
            debug!(plugin = %Key::of(&*p), bytes = dropped.bytes, why = ?dropped.why, "slimmed a refused plugin's cached copy");
        }
    }
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

/// Reconciles one VClusterPlugin: [`vcluster::install`] while it is not
/// being deleted, [`vcluster::delete`] once it is. The finalizer `vcp.dev/cleanup` is added
/// before anything is installed (in the same reconcile), and removed only after a successful
/// cleanup.
///
/// Runs in a span `reconcile` with the fields `plugin` (`namespace/name`) and `vcluster`
/// (`namespace/name` of its workload); the spans of its writes nest in it ([`crate::trace`]).
/// A success resets the plugin's retry delays ([`crate::retry`]).
///
/// # Errors
/// Any API error; the controller retries after a delay that grows with each consecutive
/// failure of the plugin ([`error_policy`]).
#[instrument(
    skip_all,
    fields(
        plugin = %Key::of(&*plugin),
        vcluster = %Key::new(plugin.metadata.namespace.as_deref().unwrap_or_default(), &plugin.spec.vcluster.name),
    )
)]
pub async fn reconcile(plugin: Arc<VClusterPlugin>, ctx: Arc<Context>) -> Result<Action> {
    let started = std::time::Instant::now();
    let telemetry = ctx.telemetry.clone();
    let retries = ctx.retries.clone();
    let key = ObjectRef::from_obj(&*plugin);
    #[cfg(feature = "reconcile-log")]
    let (namespace, name, resource_version, deleting) = (
        plugin.namespace().unwrap_or_default(),
        plugin.name_any(),
        plugin.resource_version().unwrap_or_default(),
        plugin.metadata.deletion_timestamp.is_some(),
    );
    let result = reconcile_inner(plugin, ctx).await;
    if result.is_ok() {
        retries.succeeded(&key);
    }
    #[cfg(feature = "reconcile-log")]
    {
        telemetry.observe_reconcile_of(&namespace, &name, &resource_version);
        // A deleting plugin's successful reconcile is its last: the finalizer is gone.
        if deleting && result.is_ok() {
            telemetry.plugin_gone(&namespace, &name);
        }
    }
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
        (false, _) => vcluster::install(&plugin, &ctx).await,
        (true, Some(i)) => {
            let action = vcluster::delete(&plugin, &ctx).await?;
            let api: Api<Tolerant<VClusterPlugin>> =
                Api::namespaced(ctx.client.clone(), &namespace);
            finalizer::remove_finalizer(&api, &plugin, i).await?;
            ctx.written_statuses
                .forget(&plugin.uid().unwrap_or_default());
            Ok(action)
        }
        // Being deleted, and nothing of ours to remove.
        (true, None) => Ok(Action::await_change()),
    }
}

/// Logs the error (in a span `error_policy` with the fields of [`reconcile`]'s) and retries
/// after the plugin's next delay ([`crate::retry`]: 0.5 s doubling up to 30 s, plus jitter,
/// reset by a success).
#[instrument(
    skip_all,
    fields(
        plugin = %Key::of(&*plugin),
        vcluster = %Key::new(plugin.metadata.namespace.as_deref().unwrap_or_default(), &plugin.spec.vcluster.name),
    )
)]
pub fn error_policy(plugin: Arc<VClusterPlugin>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.retries.failed(&ObjectRef::from_obj(&*plugin));
    warn!(
        error = %error,
        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        "reconcile failed; retrying"
    );
    Action::requeue(delay)
}
