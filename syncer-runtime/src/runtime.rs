//! The declarative runtime: reads its `VClusterPlugin` from the host and runs what it
//! declares — a [`DeclarativeSyncer`] per `ToHost` entry of `syncedTypes[]` (driven by the same
//! [`controller`] as plugin-author syncers), a [`from_host`] sync per
//! `FromHost` entry, the declared hooks as [`ClientHook`]s, and the pods
//! ([`PodSync`]) — and reports `status.syncedObjects`, `status.syncedTotal` and the
//! `RuntimeHealthy` condition. A host object of a translated name that the vCluster does not
//! manage is never touched: it is counted in `syncedObjects[].conflicts` and reported once as
//! a `Warning` Event (reason `HostObjectConflict`) on the `VClusterPlugin`. The status itself
//! is computed by the pure [`status`] module.
//!
//! The plugin is watched: when its `spec` changes, every syncer is stopped and started again
//! from the new spec (no process restart). When the plugin is deleted, syncing stops (host
//! objects are left as they are) until an object of that name appears again.

use std::sync::Arc;
use std::time::Duration;
use vcp_crds::Reason;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{Api, ApiResource, GroupVersionKind, Patch, PatchParams};
use kube::core::Selector;
use kube::discovery::{Scope, pinned_kind};
use vcp_crds::tolerant::{Skipped, StatusPolicy, Tolerant};

use crate::patches::Patches;
use kube::runtime::events::{Event, EventType, Recorder, Reporter as EventReporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::task::JoinSet;
use tracing::{Instrument, error, info, info_span, warn};
use vcp_crds::{
    RUNTIME_FIELD_MANAGER, SyncDirection, SyncedType, VClusterPlugin, VClusterPluginSpec,
};

use crate::acceptance::{HookGate, InForce};
pub use crate::context::{DEFAULT_RESYNC_PERIOD, DEFAULT_WORKERS};
use crate::context::{RegisterContext, SyncContext, vcluster_owner_uid};
use crate::controller::{self, ConflictReporter};
use crate::error::Error;
use crate::from_host::{self, FromHostOptions};
use crate::hooks::{ClientHook, Hooks, declarative_hooks};
use crate::pods::{PodHookOptions, physical_pod_hooks, run_pod_hooks, update_filter};
use crate::produced::{self, ProducedOptions};
use crate::retry::Retry;
use crate::stats::{EventSink, Severity, TypeStats, WarnedKeys};
use crate::status::{self, RuntimeStatus};
use crate::syncer::DeclarativeSyncer;
use crate::translate::{FromHostMapping, NamespacedTranslator};

/// How host pods are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodSync {
    /// Beside a real vCluster (whose syncer syncs pods): apply the plugin's physical `Pod`
    /// hooks to the host pods labelled `vcluster.loft.sh/managed-by=<vcluster>`.
    #[default]
    Hooks,
    /// Standalone (no vCluster syncer present): the runtime syncs pods itself, virtual to host
    /// with the translated metadata (the spec is copied at creation; afterwards only labels
    /// and annotations follow, the rest of a pod's spec being immutable), status host to
    /// virtual, and the `Pod` hooks applied before each host write.
    Full,
    /// A v2 plugin started by vCluster's syncer ([`crate::v2`]): vCluster calls the plugin's
    /// `Pod` hooks through `Mutate` before it writes a host pod, so the runtime neither syncs
    /// nor patches host pods.
    Mutate,
}

/// Configuration of [`run`].
#[derive(Clone)]
pub struct Config {
    /// Client of the host cluster (where the `VClusterPlugin` and the host copies live).
    pub host: Client,
    /// Client of the virtual cluster (the vCluster's own API server).
    pub virtual_: Client,
    /// Host namespace of the vCluster (and of its `VClusterPlugin`); the only host namespace
    /// watched or written.
    pub namespace: String,
    /// Name of the `VClusterPlugin` to run.
    pub plugin: String,
    /// vCluster name used in host names and labels; `None`: the plugin's `spec.vcluster.name`.
    pub vcluster: Option<String>,
    /// How host pods are handled (default [`PodSync::Hooks`]).
    pub pod_sync: PodSync,
    /// Every synced object is reconciled again this often (default 5 minutes).
    pub resync_period: Duration,
    /// The status is recomputed this often and written when it changed (default 2 seconds).
    pub status_interval: Duration,
    /// Concurrent workers per synced type (default 4).
    pub workers: usize,
    /// The longest delay between two attempts of a failing watch or of a synced type that is
    /// not served (default 30 s; [`crate::retry`]).
    pub retry_max: Duration,
    /// The expression evaluations of every synced type and every spec generation of this
    /// runtime ([`crate::patches::running`]): once
    /// [`MAX_OVERRUNNING`](crate::patches::running::MAX_OVERRUNNING) run past twice their time
    /// bound, no new one starts until they end (those already started may still overrun: at
    /// most the types' workers in all), and each that does is reported (`RuntimeHealthy=False`, `PatchFailed`,
    /// and a `Warning` Event). Default: fresh; a caller (a test) may keep a clone to count them.
    pub evaluations: Arc<crate::patches::running::Evaluations>,
    /// A v2 plugin's hooks ([`PodSync::Mutate`]): set to the declared hooks whenever the
    /// syncers start from a spec, emptied while the `VClusterPlugin` is gone, so that
    /// vCluster's `Mutate` calls apply the current spec.
    pub hook_table: Option<Arc<crate::v2::HookTable>>,
    /// Counts every finished reconcile per object, across spec changes (default: fresh); the
    /// caller may keep a clone to read it. Test machinery: only with the cargo feature
    /// `reconcile-log`.
    #[cfg(feature = "reconcile-log")]
    pub reconciles: Arc<crate::stats::ReconcileLog>,
    /// Where [`run`] serves `/metrics` and `/healthz` ([`crate::metrics`]) while it runs;
    /// `None` (the default): no listener.
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// The counters of `/metrics`, over every spec generation of this runtime (default: fresh;
    /// a caller may keep a clone to read them).
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Config {
    /// A configuration with the defaults: vCluster name from the plugin, [`PodSync::Hooks`],
    /// resync every 5 minutes, status every 2 seconds.
    pub fn new(
        host: Client,
        virtual_: Client,
        namespace: impl Into<String>,
        plugin: impl Into<String>,
    ) -> Self {
        Self {
            host,
            virtual_,
            namespace: namespace.into(),
            plugin: plugin.into(),
            vcluster: None,
            pod_sync: PodSync::Hooks,
            resync_period: DEFAULT_RESYNC_PERIOD,
            status_interval: Duration::from_secs(2),
            workers: DEFAULT_WORKERS,
            retry_max: crate::retry::DEFAULT_RETRY_MAX,
            evaluations: Arc::default(),
            hook_table: None,
            #[cfg(feature = "reconcile-log")]
            reconciles: Arc::default(),
            metrics_bind_address: None,
            metrics: Arc::default(),
        }
    }

    /// `stats`, counting into [`Config::metrics`], and its reconciles in
    /// [`Config::reconciles`] with the test feature `reconcile-log`.
    fn logged(&self, stats: TypeStats) -> TypeStats {
        let stats = stats.with_metrics(self.metrics.clone());
        #[cfg(feature = "reconcile-log")]
        return stats.with_log(self.reconciles.clone());
        #[cfg(not(feature = "reconcile-log"))]
        stats
    }
}

/// The keys warned about by every run of this process ([`TypeStats::sharing_warned`]).
static PROCESS_WARNED: std::sync::LazyLock<WarnedKeys> =
    std::sync::LazyLock::new(WarnedKeys::default);

/// Logged (info, with the `resource_version` of the `VClusterPlugin` read) each time the runtime
/// restarts its syncers on a new spec of its `VClusterPlugin`, or on a change of the hooks the
/// operator accepted ([`crate::acceptance`]).
pub const RESTARTED: &str = "VClusterPlugin spec or its accepted hooks changed, restarting syncers";

/// Logged (info, with the object's `resource_version`) for each version of a `VClusterPlugin`
/// being deleted the runtime reads: nothing of it is accepted any more
/// ([`vcp_crds::accepted_by_operator`]), the hooks in force stay as they were.
pub const DELETING: &str =
    "VClusterPlugin is being deleted: its hooks stay those accepted before the delete";

/// Runs the declarative runtime until the future is dropped (or the task aborted).
///
/// Reads the `VClusterPlugin` `config.plugin` in `config.namespace` on the host, then syncs
/// each `syncedTypes[]` entry with direction `ToHost` from the virtual cluster to the host
/// namespace, and applies the physical `Pod` hooks to the vCluster's host pods. A synced type
/// whose API is not served yet is retried with backoff and reported in `RuntimeHealthy`.
///
/// # Errors
/// [`Error::ReadPlugin`] / [`Error::PluginNotFound`] when the plugin cannot be read at start,
/// [`Error::NoVCluster`] when no vCluster name is known. Later failures, and an address of
/// [`Config::metrics_bind_address`] that cannot be listened on ([`crate::listener`]), are
/// logged, retried and reported in the status instead.
pub async fn run(config: Config) -> Result<(), Error> {
    // `/metrics` and `/healthz` while this future lives (stopped when it is dropped)
    let mut listener =
        crate::listener::Listener::start(config.metrics_bind_address, &config.metrics).await;
    // Read tolerantly (issue 38, `vcp_crds::tolerant`): a status the API server accepted but our
    // types cannot read (a condition's `lastTransitionTime` such as `2024-01-01T10:00:00Zt`,
    // which anyone who may patch the status can write) must not stop the runtime; it needs only
    // the spec, and writes only its own status fields.
    let api: Api<Tolerant<VClusterPlugin>> =
        Api::namespaced(config.host.clone(), &config.namespace);
    let plugin = api
        .get_opt(&config.plugin)
        .await
        .map_err(|source| Error::ReadPlugin {
            namespace: config.namespace.clone(),
            name: config.plugin.clone(),
            source: Box::new(source),
        })?
        .ok_or_else(|| Error::PluginNotFound {
            namespace: config.namespace.clone(),
            name: config.plugin.clone(),
        })?;
    let plugin = match plugin {
        Tolerant::Whole(plugin) => plugin,
        Tolerant::WithoutStatus { object, error } => {
            warn!(plugin = %config.plugin, %error, "the VClusterPlugin's status cannot be decoded; its spec is read without it");
            object
        }
        Tolerant::Undecodable(u) => {
            return Err(Error::UndecodablePlugin {
                namespace: config.namespace.clone(),
                name: config.plugin.clone(),
                error: u.error,
            });
        }
    };
    let config = Arc::new(config);
    // Events on the VClusterPlugin: `(type, reason, note)`.
    let (warning_tx, mut warnings) = tokio::sync::mpsc::unbounded_channel::<(
        Severity,
        Reason,
        String,
        Option<ObjectReference>,
    )>();
    let on_conflict: ConflictReporter = {
        let warning_tx = warning_tx.clone();
        Arc::new(move |message| {
            let _ = warning_tx.send((Severity::Warning, Reason::HostObjectConflict, message, None));
        })
    };
    let on_warning: EventSink = Arc::new(move |severity, reason, note, related| {
        let _ = warning_tx.send((severity, reason, note, related));
    });
    let recorder = Recorder::new(
        config.host.clone(),
        EventReporter {
            controller: RUNTIME_FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let mut plugin_ref = plugin.object_ref(&());
    // One set of warned keys for the whole process: a spec change restarts the syncers with
    // new statistics, and a restarted run must not repeat a warning already given
    // (`TypeStats::warn_once`).
    let warned = PROCESS_WARNED.clone();
    // only hooks the operator accepted are applied (`acceptance`)
    let mut gate = HookGate::default();
    let mut running = Some(Generation::start(
        &config,
        &plugin,
        gate.observe(&plugin),
        on_conflict.clone(),
        on_warning.clone(),
        &warned,
    )?);
    let mut reporter = Reporter::new(api.clone(), &config.plugin);

    // Whether the plugin was seen, decodable or not, in the listing in progress: an
    // undecodable plugin is not passed on, but it exists (its syncers run on, as last read).
    let skipped_in_init = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let events = {
        let plugin = config.plugin.clone();
        let skipped_in_init = skipped_in_init.clone();
        let metrics = config.metrics.clone();
        vcp_crds::tolerant::watcher(
            api,
            watcher::Config::default().fields(&format!("metadata.name={}", config.plugin)),
            // only the spec is read: a status that does not decode is left out
            StatusPolicy::PassWithout,
            move |skipped: &Skipped| {
                if skipped.passed_without_status {
                    warn!(%plugin, error = %skipped.error, "the VClusterPlugin's status cannot be decoded; its spec is read without it");
                } else if !skipped.deleted {
                    skipped_in_init.store(true, std::sync::atomic::Ordering::Relaxed);
                    metrics.count_undecodable(
                        &VClusterPlugin::api_version(&()),
                        &VClusterPlugin::kind(&()),
                        "host",
                    );
                    warn!(%plugin, error = %skipped.error, "the VClusterPlugin cannot be decoded; the syncers run on with its spec as last read until it decodes again");
                }
            },
            // an undecodable plugin is not a deleted one: nothing is stopped
            |_: &ObjectMeta| None,
        )
        .default_backoff()
    };
    let mut events = std::pin::pin!(events);
    let mut seen_in_init = false;
    let mut tick = tokio::time::interval(config.status_interval);
    let mut metrics_warned = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(plugin) | watcher::Event::InitApply(plugin))) => {
                    seen_in_init = true;
                    if plugin.metadata.deletion_timestamp.is_some() {
                        let resource_version = plugin.resource_version().unwrap_or_default();
                        info!(plugin = %config.plugin, %resource_version, "{DELETING}");
                    }
                    let in_force = gate.observe(&plugin);
                    let changed = running
                        .as_ref()
                        .is_none_or(|g| g.spec != plugin.spec || g.in_force != in_force);
                    if changed {
                        let resource_version = plugin.resource_version().unwrap_or_default();
                        info!(plugin = %config.plugin, %resource_version, "{RESTARTED}");
                        running = None;
                        plugin_ref = plugin.object_ref(&());
                        match Generation::start(&config, &plugin, in_force, on_conflict.clone(), on_warning.clone(), &warned) {
                            Ok(generation) => running = Some(generation),
                            Err(error) => error!(%error, "cannot start the syncers of the new spec"),
                        }
                    }
                    if let Some(generation) = running.as_mut() {
                        generation.observed_generation = plugin.metadata.generation;
                    }
                }
                Some(Ok(watcher::Event::Delete(_))) => stop(&mut running, &config),
                Some(Ok(watcher::Event::Init)) => {
                    seen_in_init = false;
                    skipped_in_init.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if !seen_in_init && !skipped_in_init.load(std::sync::atomic::Ordering::Relaxed) {
                        stop(&mut running, &config);
                    }
                }
                Some(Err(error)) => warn!(%error, "watching the VClusterPlugin failed, retrying"),
                None => return Ok(()),
            },
            Some(joined) = join_next(&mut running) => match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => error!(%error, "a syncer stopped"),
                Err(error) => error!(%error, "a syncer task failed"),
            },
            Some((severity, reason, message, related)) = warnings.recv() => {
                let event = Event {
                    type_: match severity {
                        Severity::Normal => EventType::Normal,
                        Severity::Warning => EventType::Warning,
                    },
                    reason: reason.into(),
                    note: Some(message.chars().take(1000).collect()),
                    action: "Sync".into(),
                    // the object the Event is about, if not the plugin: its own Event
                    secondary: related,
                };
                if let Err(error) = recorder.publish(&event, &plugin_ref).await {
                    warn!(%error, "cannot publish an Event on the VClusterPlugin (the syncer identity needs create on events.k8s.io events)");
                }
            }
            _ = tick.tick() => {
                // the metrics address: tried again while taken, a Warning once per failure
                listener.retry(&config.metrics).await;
                match listener.failure() {
                    Some(failure) if !metrics_warned => {
                        on_warning(Severity::Warning, Reason::MetricsUnavailable, failure.to_string(), None);
                        metrics_warned = true;
                    }
                    None => metrics_warned = false,
                    Some(_) => {}
                }
                // evaluations running past their bound: once each as an Event, and in the
                // status for as long as they run (patches::running)
                let now = std::time::Instant::now();
                for overrun in config.evaluations.announce(now) {
                    let message = overrun.message();
                    warn!(%message, "an expression runs past its time bound");
                    on_warning(Severity::Warning, Reason::PatchFailed, message, overrun.related);
                }
                if let Some(generation) = running.as_ref() {
                    reporter.report(generation, &config.evaluations.overrunning(now), listener.failure()).await;
                }
            }
        }
    }
}

fn stop(running: &mut Option<Generation>, config: &Config) {
    if let Some(table) = &config.hook_table {
        table.set(Vec::new());
    }
    if running.take().is_some() {
        warn!(plugin = %config.plugin, "VClusterPlugin deleted, syncing stopped until it exists again");
    }
}

async fn join_next(
    running: &mut Option<Generation>,
) -> Option<Result<Result<(), Error>, tokio::task::JoinError>> {
    match running {
        Some(generation) if !generation.tasks.is_empty() => generation.tasks.join_next().await,
        _ => std::future::pending().await,
    }
}

/// The syncers started for one version of the plugin's spec; dropping it stops them.
struct Generation {
    spec: VClusterPluginSpec,
    /// The hooks applied: the spec's once the operator accepted them ([`HookGate`]).
    in_force: InForce,
    observed_generation: Option<i64>,
    /// One per synced type (and `v1 Pod` with `--pod-sync=full`), reported in
    /// `status.syncedObjects`.
    types: Vec<Arc<TypeStats>>,
    /// The pod hooks' statistics: they count toward health, not toward `syncedObjects`.
    pod_hooks: Option<Arc<TypeStats>>,
    tasks: JoinSet<Result<(), Error>>,
}

impl Generation {
    fn start(
        config: &Arc<Config>,
        plugin: &VClusterPlugin,
        in_force: InForce,
        on_conflict: ConflictReporter,
        on_warning: EventSink,
        warned: &WarnedKeys,
    ) -> Result<Self, Error> {
        let spec = plugin.spec.clone();
        let vcluster = config
            .vcluster
            .clone()
            .unwrap_or_else(|| spec.vcluster.name.clone());
        if vcluster.is_empty() {
            return Err(Error::NoVCluster {
                namespace: config.namespace.clone(),
                name: plugin.name_any(),
            });
        }
        let mut generation = Generation {
            observed_generation: plugin.metadata.generation,
            types: Vec::new(),
            pod_hooks: None,
            tasks: JoinSet::new(),
            spec: spec.clone(),
            in_force: in_force.clone(),
        };
        let accepted = in_force.hooks().unwrap_or_default();
        let hooks: Arc<[Arc<dyn ClientHook>]> = declarative_hooks(accepted).into();
        if let Some(table) = &config.hook_table {
            match &in_force {
                InForce::Hooks(_) => table.set(hooks.clone()),
                InForce::Pending(message) => table.hold(message.clone()),
            }
        }
        // While no hooks are accepted, a type the spec hooks waits: none of its objects is
        // written without its hooks.
        let held = |api_version: &str, kind: &str| {
            in_force.hooks().is_none()
                && spec
                    .hooks
                    .iter()
                    .any(|h| h.api_version == api_version && h.kind == kind)
        };
        if let InForce::Pending(message) = &in_force {
            info!(plugin = %config.plugin, "{message}");
        }
        let (mut synced_types, refused) = syncable_types(&spec.synced_types, config.pod_sync);
        for message in refused {
            // the operator refuses such a plugin (PolicyDenied); this holds when the runtime
            // reads a newer spec before the operator does, or runs without the operator
            warn!(plugin = %config.plugin, "{message}; not synced");
        }
        if config.pod_sync == PodSync::Full
            && !synced_types
                .iter()
                .any(|t| t.api_version == "v1" && t.kind == "Pod")
        {
            synced_types.push(SyncedType {
                api_version: "v1".into(),
                kind: "Pod".into(),
                resource: Some("pods".into()),
                direction: SyncDirection::ToHost,
                sync_status: true,
                ..SyncedType::default()
            });
        }
        // the host names every `produced` entry declares, shared by all synced types; nothing
        // is brought back before each entry has listed
        let claims = Arc::new(crate::produced::Claims::default());
        for entry in synced_types
            .iter()
            .flat_map(crate::produced::Claims::entries_of)
        {
            claims.expect(entry);
        }
        for synced in synced_types {
            if held(&synced.api_version, &synced.kind)
                || synced
                    .produced
                    .iter()
                    .any(|p| held(&p.api_version, &p.kind))
            {
                info!(plugin = %config.plugin, kind = %synced.kind, "not synced until the operator accepts the hooks of this type");
                // not synced: it declares no host name, the other types do not wait for it
                for entry in crate::produced::Claims::entries_of(&synced) {
                    claims.unexpect(&entry);
                }
                continue;
            }
            let stats = Arc::new(
                config
                    .logged(TypeStats::new(&synced.api_version, &synced.kind))
                    .with_warnings(on_warning.clone())
                    .sharing_warned(warned.clone()),
            );
            generation.types.push(stats.clone());
            // the objects brought back for this type: one statistics per `produced` entry,
            // reported under the produced kind (summed with a synced type of that kind)
            let produced: Vec<Arc<TypeStats>> = synced
                .produced
                .iter()
                .filter(|_| synced.direction.is_to_host())
                .map(|p| {
                    Arc::new(
                        config
                            .logged(TypeStats::new(&p.api_version, &p.kind))
                            .with_warnings(on_warning.clone())
                            .sharing_warned(warned.clone()),
                    )
                })
                .collect();
            generation.types.extend(produced.iter().cloned());
            let span = info_span!("sync", plugin = %config.plugin, vcluster = %vcluster, kind = %synced.kind);
            generation.tasks.spawn(
                run_type(
                    config.clone(),
                    vcluster.clone(),
                    synced,
                    hooks.clone(),
                    (stats, produced),
                    on_conflict.clone(),
                    claims.clone(),
                )
                .instrument(span),
            );
        }
        if config.pod_sync == PodSync::Hooks && !physical_pod_hooks(accepted).is_empty() {
            let stats = Arc::new(
                config
                    .logged(TypeStats::new("v1", "Pod"))
                    .with_warnings(on_warning.clone())
                    .sharing_warned(warned.clone()),
            );
            generation.pod_hooks = Some(stats.clone());
            let span =
                info_span!("sync", plugin = %config.plugin, vcluster = %vcluster, kind = "Pod");
            generation.tasks.spawn(
                run_pod_hooks(PodHookOptions {
                    host: config.host.clone(),
                    namespace: config.namespace.clone(),
                    vcluster: vcluster.clone(),
                    hooks: Hooks::for_type(&hooks, "v1", "Pod"),
                    stats,
                })
                .instrument(span),
            );
        }
        info!(
            vcluster = %vcluster,
            synced_types = spec.synced_types.len(),
            hooks = spec.hooks.len(),
            pod_sync = ?config.pod_sync,
            "syncers started"
        );
        Ok(generation)
    }
}

/// The synced types of `declared` the runtime syncs, and the refusals of the others
/// ([`vcp_crds::built_in::refusal`]: a kind Kubernetes serves itself other than `ConfigMap`),
/// except that with [`PodSync::Full`] (standalone, the runtime is the pod syncer) a `v1`
/// `Pod` entry (a selector narrowing the pods it syncs) is kept.
pub fn syncable_types(
    declared: &[SyncedType],
    pod_sync: PodSync,
) -> (Vec<SyncedType>, Vec<String>) {
    let mut kept = Vec::new();
    let mut refused = Vec::new();
    for (i, t) in declared.iter().enumerate() {
        let own_pods = pod_sync == PodSync::Full && t.api_version == "v1" && t.kind == "Pod";
        match vcp_crds::built_in::refusal(i, t) {
            Some(message) if !own_pods => refused.push(message),
            _ => kept.push(t.clone()),
        }
    }
    (kept, refused)
}

/// Resolves a synced type (retrying with backoff while it is not served) and runs its syncer:
/// a [`DeclarativeSyncer`] under the [`controller`](crate::controller) for `ToHost`,
/// [`from_host::run`] for `FromHost`.
async fn run_type(
    config: Arc<Config>,
    vcluster: String,
    synced: SyncedType,
    hooks: Arc<[Arc<dyn ClientHook>]>,
    (stats, produced_stats): (Arc<TypeStats>, Vec<Arc<TypeStats>>),
    on_conflict: ConflictReporter,
    claims: Arc<crate::produced::Claims>,
) -> Result<(), Error> {
    // The `produced` entries of this type. While the type is not served in the virtual cluster
    // it has no object there, so it declares no host name, and the other types' entries must
    // not wait for it to list ([`crate::produced::Claims`]); once served, they wait again until
    // it has listed. A type that never runs (refused below) declares nothing either.
    let entries = crate::produced::Claims::entries_of(&synced);
    let declares_nothing = || {
        for entry in &entries {
            claims.unexpect(entry);
        }
    };
    let selector = match synced.selector.clone().map(Selector::try_from).transpose() {
        Ok(selector) => selector,
        Err(error) => {
            let error = Error::InvalidSelector {
                api_version: synced.api_version.clone(),
                kind: synced.kind.clone(),
                message: error.to_string(),
            };
            stats.set_type_error(Some(error.to_string()));
            declares_nothing();
            return Err(error);
        }
    };
    let patches = match Patches::new(&synced.patches, &vcluster, &config.namespace) {
        Ok(patches) => patches.sharing_evaluations(config.evaluations.clone()),
        Err(source) => {
            let error = Error::InvalidPatch {
                api_version: synced.api_version.clone(),
                kind: synced.kind.clone(),
                source: Box::new(source),
            };
            stats.set_type_error(Some(error.to_string()));
            declares_nothing();
            return Err(error);
        }
    };
    // A mapping reaching outside the vCluster's host namespace is refused before anything is
    // watched (the operator refuses such a plugin too, and so does admission).
    let mapping = if synced.direction == SyncDirection::FromHost {
        let by_name = synced
            .mappings
            .as_ref()
            .map(|m| m.by_name.clone())
            .unwrap_or_default();
        match FromHostMapping::new(&config.namespace, &by_name) {
            Ok(mapping) => Some(mapping),
            Err(source) => {
                let error = Error::InvalidMapping {
                    api_version: synced.api_version.clone(),
                    kind: synced.kind.clone(),
                    source,
                };
                stats.set_type_error(Some(error.to_string()));
                declares_nothing();
                return Err(error);
            }
        }
    } else {
        None
    };
    let mut retry = Retry::new(config.retry_max);
    let (resource, status_subresource) = loop {
        match resolve(&config, &synced).await {
            Ok(resolved) => {
                for entry in &entries {
                    claims.expect(entry.clone());
                }
                break resolved;
            }
            Err(error) => {
                declares_nothing();
                let delay = retry.next_delay();
                warn!(
                    %error,
                    kind = %synced.kind,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "synced type not available yet, retrying"
                );
                stats.set_type_error(Some(error.to_string()));
                tokio::time::sleep(delay).await;
            }
        }
    };
    stats.set_type_error(None);
    let scoped = cluster_scoped_kinds(&config.virtual_, &patches.referenced_kinds()).await;
    let patches = Arc::new(patches.with_cluster_scoped(scoped));
    let type_hooks = Hooks::for_type(&hooks, &synced.api_version, &synced.kind);
    // FromHost: the host-to-virtual sync; ToHost: the virtual-to-host sync below.
    if let Some(mapping) = mapping {
        return from_host::run(FromHostOptions {
            host: config.host.clone(),
            virtual_: config.virtual_.clone(),
            mapping,
            resource,
            selector,
            sync_status: synced.sync_status,
            status_subresource,
            hooks: type_hooks,
            stats,
            resync_period: config.resync_period,
            on_conflict: Some(on_conflict),
            retry_max: config.retry_max,
            patches,
        })
        .await;
    }
    // The owner of every host copy, read once per type as vCluster's syncer reads it once at
    // start-up (experimental.syncSettings.setOwner, its default).
    let owner_uid = vcluster_owner_uid(&config.host, &config.namespace, &vcluster).await;
    let translator = NamespacedTranslator::new(
        vcluster,
        &config.namespace,
        &synced.api_version,
        &synced.kind,
    )
    .with_owner_uid(owner_uid.clone());
    let is_pod = synced.api_version == "v1" && synced.kind == "Pod";
    let syncer = DeclarativeSyncer {
        translator: translator.clone(),
        resource: resource.clone(),
        selector,
        sync_status: synced.sync_status,
        status_subresource,
        spec_updates: !is_pod,
        patches,
    };
    let register = RegisterContext {
        host: config.host.clone(),
        virtual_: config.virtual_.clone(),
        host_namespace: config.namespace.clone(),
        vcluster: translator.vcluster().to_string(),
        resync_period: config.resync_period,
        workers: config.workers,
        owner_uid,
        retry_max: config.retry_max,
    };
    let mut options = controller::Options::from(&register);
    options.on_conflict = Some(on_conflict.clone());
    let filter = update_filter(&synced.api_version, &synced.kind);
    let ctx = SyncContext::new(
        register,
        resource.clone(),
        translator.clone(),
        type_hooks,
        stats,
    )
    .with_update_filter(filter);
    let brought_back = synced
        .produced
        .iter()
        .zip(produced_stats)
        .map(|(p, stats)| {
            run_produced(
                config.clone(),
                ProducedOptions {
                    host: config.host.clone(),
                    virtual_: config.virtual_.clone(),
                    translator: translator.clone(),
                    source: resource.clone(),
                    selector: syncer.selector.clone(),
                    produced: ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
                    name_path: p.name_path.clone(),
                    hooks: Hooks::for_type(&hooks, &p.api_version, &p.kind),
                    stats,
                    resync_period: config.resync_period,
                    on_conflict: Some(on_conflict.clone()),
                    retry_max: config.retry_max,
                    claims: claims.clone(),
                },
                (p.api_version.clone(), p.kind.clone()),
            )
        });
    let brought_back = futures::future::try_join_all(brought_back);
    futures::future::try_join(controller::run(syncer, ctx, options), brought_back)
        .await
        .map(drop)
}

/// Resolves a produced kind on the host (retrying with backoff while it is not served; it
/// must be namespaced) and runs [`produced::run`] for it.
async fn run_produced(
    config: Arc<Config>,
    mut opts: ProducedOptions,
    (api_version, kind): (String, String),
) -> Result<(), Error> {
    let mut retry = Retry::new(config.retry_max);
    let entry = crate::produced::Claims::entry(
        &opts.source.api_version,
        &opts.source.kind,
        &opts.name_path,
    );
    opts.produced = loop {
        match resolve_on(&config.host, "host", &api_version, &kind, None).await {
            Ok((resource, _)) => {
                opts.claims.expect(entry);
                break resource;
            }
            Err(error) => {
                // a kind not served lists nothing: the other entries do not wait for it
                opts.claims.unexpect(&entry);
                let delay = retry.next_delay();
                warn!(%error, %kind, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "produced kind not available yet, retrying");
                opts.stats.set_type_error(Some(error.to_string()));
                tokio::time::sleep(delay).await;
            }
        }
    };
    opts.stats.set_type_error(None);
    produced::run(opts).await
}

/// `(group, kind)` of the cluster-scoped kinds in the API groups that `referenced` (the
/// `(apiVersion, kind)` of a type's reference patches) name, discovered on the virtual API
/// server: a reference to one of them keeps its name ([`crate::patches`]). The whole group is
/// read because a reference's `kindPath` may name another kind of it (cert-manager's
/// `issuerRef.kind: ClusterIssuer` beside `Issuer`). A group that cannot be discovered counts
/// as having no cluster-scoped kind (its references are translated), with a log line.
async fn cluster_scoped_kinds(
    client: &kube::Client,
    referenced: &[(String, String)],
) -> Vec<(String, String)> {
    let mut groups: Vec<String> = referenced
        .iter()
        .map(|(api_version, _)| match api_version.split_once('/') {
            Some((group, _)) => group.to_string(),
            None => String::new(),
        })
        .collect();
    groups.sort();
    groups.dedup();
    let mut scoped = Vec::new();
    for group in groups {
        match kube::discovery::oneshot::group(client, &group).await {
            Ok(api_group) => {
                for (resource, caps) in api_group.recommended_resources() {
                    if caps.scope == Scope::Cluster {
                        scoped.push((group.clone(), resource.kind));
                    }
                }
            }
            Err(error) => {
                warn!(%error, group = %group, "cannot discover the referenced API group; its kinds count as namespaced");
            }
        }
    }
    scoped
}

/// The `ApiResource` of a synced type and whether it has a status subresource, discovered on
/// the virtual API server; `syncedTypes[].resource` is used when discovery is not possible.
async fn resolve(config: &Config, synced: &SyncedType) -> Result<(ApiResource, bool), Error> {
    resolve_on(
        &config.virtual_,
        "virtual",
        &synced.api_version,
        &synced.kind,
        synced.resource.as_deref(),
    )
    .await
}

/// The `ApiResource` of `api_version` / `kind` and whether it has a status subresource,
/// discovered with `client` (on the `cluster` it talks to); `resource` is used when discovery
/// is not possible. Only a namespaced type is accepted.
async fn resolve_on(
    client: &Client,
    cluster: &'static str,
    api_version: &str,
    kind: &str,
    resource: Option<&str>,
) -> Result<(ApiResource, bool), Error> {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    match pinned_kind(client, &gvk).await {
        Ok((resource, caps)) => {
            if caps.scope != Scope::Namespaced {
                return Err(Error::ClusterScoped {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                });
            }
            let status = caps.subresources.iter().any(|(r, _)| r.plural == "status");
            Ok((resource, status))
        }
        Err(source) => match resource {
            Some(plural) => Ok((ApiResource::from_gvk_with_plural(&gvk, plural), true)),
            None => Err(Error::Discovery {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                cluster,
                source: Box::new(source),
            }),
        },
    }
}

/// Writes the runtime's part of the plugin status ([`status`]) by server-side apply (best
/// effort), only when it changed since the last successful write.
struct Reporter {
    api: Api<Tolerant<VClusterPlugin>>,
    name: String,
    /// The last status written, and its `RuntimeHealthy` condition.
    last: Option<(RuntimeStatus, Condition)>,
    last_error: Option<String>,
}

impl Reporter {
    fn new(api: Api<Tolerant<VClusterPlugin>>, name: &str) -> Self {
        Self {
            api,
            name: name.to_string(),
            last: None,
            last_error: None,
        }
    }

    async fn report(
        &mut self,
        generation: &Generation,
        overrunning: &[crate::patches::running::Overrun],
        metrics_failure: Option<&str>,
    ) {
        let types: Vec<_> = generation.types.iter().map(|t| t.summary()).collect();
        let pod_hooks = generation.pod_hooks.as_ref().map(|p| p.summary());
        let desired = status::desired(&types, pod_hooks.as_ref(), generation.observed_generation);
        let desired = status::with_overrunning(desired, overrunning);
        let desired = status::with_metrics_failure(desired, metrics_failure);
        if self.last.as_ref().is_some_and(|(last, _)| *last == desired) {
            return;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = status::condition(&desired, self.last.as_ref().map(|(_, c)| c), &now);
        let body = status::apply_body(&self.name, &desired, &condition);
        let params = PatchParams::apply(RUNTIME_FIELD_MANAGER).force();
        match self
            .api
            .patch_status(&self.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                self.last = Some((desired, condition));
                self.last_error = None;
            }
            Err(error) => {
                let error = error.to_string();
                if self.last_error.as_ref() != Some(&error) {
                    warn!(%error, "cannot write the VClusterPlugin status (the syncer identity needs patch on vclusterplugins/status); will retry");
                    self.last_error = Some(error);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synced(api_version: &str, kind: &str) -> SyncedType {
        SyncedType {
            api_version: api_version.into(),
            kind: kind.into(),
            ..SyncedType::default()
        }
    }

    /// The second attacker's plugin (`syncedTypes: [v1 Pod]`) syncs no pod beside a vCluster;
    /// the standalone pod syncer keeps its own `Pod` entry.
    #[test]
    fn kinds_kubernetes_acts_on_are_not_synced() {
        let declared = [
            synced("example.loft.sh/v1", "Car"),
            synced("v1", "Pod"),
            synced("v1", "ConfigMap"),
            synced("apps/v1", "Deployment"),
        ];
        for pod_sync in [PodSync::Hooks, PodSync::Mutate] {
            let (kept, refused) = syncable_types(&declared, pod_sync);
            assert_eq!(kept, [declared[0].clone(), declared[2].clone()]);
            assert_eq!(refused.len(), 2);
            assert!(
                refused[0].starts_with("spec.syncedTypes[1] (v1 Pod)"),
                "{}",
                refused[0]
            );
            assert!(
                refused[1].starts_with("spec.syncedTypes[3] (apps/v1 Deployment)"),
                "{}",
                refused[1]
            );
        }
        let (kept, refused) = syncable_types(&declared, PodSync::Full);
        assert_eq!(kept, declared[..3]);
        assert_eq!(refused.len(), 1);
    }
}
