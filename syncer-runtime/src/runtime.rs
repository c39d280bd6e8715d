//! The declarative runtime: reads its `VClusterPlugin` from the host and runs what it
//! declares — a [`DeclarativeSyncer`](crate::syncer::DeclarativeSyncer) per `ToHost` entry of `syncedTypes[]` (driven by the same
//! [`controller`](crate::controller) as plugin-author syncers), a [`from_host`](crate::from_host) sync per
//! `FromHost` entry, the declared hooks as [`ClientHook`](crate::hooks::ClientHook)s, and the pods
//! ([`PodSync`]) — and reports `status.syncedObjects`, `status.syncedTotal` and the
//! `RuntimeHealthy` condition. A host object of a translated name that the vCluster does not
//! manage is never touched: it is counted in `syncedObjects[].conflicts` and reported once as
//! a `Warning` Event (reason `HostObjectConflict`) on the `VClusterPlugin`. The status itself
//! is computed by the pure [`status`](crate::status) module.
//!
//! The parts: `config` (what [`run`] is given), `generation` (the syncers of one spec),
//! `synced_type` (one synced type, run), `discovery` and `reporter` (the status written).
//!
//! The plugin is watched: when its `spec` changes, every syncer is stopped and started again
//! from the new spec (no process restart). When the plugin is deleted, syncing stops (host
//! objects are left as they are) until an object of that name appears again.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter as EventReporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{error, info, warn};
use vcp_crds::tolerant::{Skipped, StatusPolicy, Tolerant};
use vcp_crds::{RUNTIME_FIELD_MANAGER, Reason, VClusterPlugin};

use crate::acceptance::HookGate;
pub use crate::context::{DEFAULT_RESYNC_PERIOD, DEFAULT_WORKERS};
use crate::controller::ConflictReporter;
use crate::error::Error;
use crate::stats::{EventSink, Severity, WarnedKeys};

mod config;
mod discovery;
mod generation;
mod reporter;
mod synced_type;

pub use config::{Config, PodSync};
pub use generation::syncable_types;

use generation::Generation;
use reporter::Reporter;

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

/// Reads the plugin `namespace/name` from the host at start, tolerantly
/// (`vcp_crds::tolerant`): a status the API server accepted but these types cannot read (a
/// condition's `lastTransitionTime` such as `2024-01-01T10:00:00Zt`, which anyone who may patch
/// the status can write) must not stop the runtime. It needs only the spec, and writes only its
/// own status fields, so the plugin is read without its status then (with a warning log).
///
/// # Errors
/// [`Error::ReadPlugin`] when the API server does not answer the read,
/// [`Error::PluginNotFound`] when there is no such plugin, [`Error::UndecodablePlugin`] when
/// its spec or metadata cannot be decoded.
pub async fn read_plugin(
    host: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<VClusterPlugin, Error> {
    let api: Api<Tolerant<VClusterPlugin>> = Api::namespaced(host.clone(), namespace);
    let plugin = api
        .get_opt(name)
        .await
        .map_err(|source| Error::ReadPlugin {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source: Box::new(source),
        })?
        .ok_or_else(|| Error::PluginNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    match plugin {
        Tolerant::Whole(plugin) => Ok(plugin),
        Tolerant::WithoutStatus { object, error } => {
            warn!(plugin = %name, %error, "the VClusterPlugin's status cannot be decoded; its spec is read without it");
            Ok(object)
        }
        Tolerant::Undecodable(u) => Err(Error::UndecodablePlugin {
            namespace: namespace.to_string(),
            name: name.to_string(),
            error: u.error,
        }),
    }
}

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
    let plugin = read_plugin(&config.host, &config.namespace, &config.plugin).await?;
    let api: Api<Tolerant<VClusterPlugin>> =
        Api::namespaced(config.host.clone(), &config.namespace);
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

#[cfg(test)]
mod tests;
