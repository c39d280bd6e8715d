//! The syncers started for one version of the plugin's spec ([`Generation`]), and which of its
//! synced types the runtime syncs ([`syncable_types`]).

use std::sync::Arc;

use kube::ResourceExt;
use tokio::task::JoinSet;
use tracing::{Instrument, info, info_span, warn};
use vcp_crds::{SyncDirection, SyncedType, VClusterPlugin, VClusterPluginSpec};

use crate::acceptance::InForce;
use crate::controller::ConflictReporter;
use crate::error::Error;
use crate::hooks::{ClientHook, Hooks, declarative_hooks};
use crate::pods::{PodHookOptions, physical_pod_hooks, run_pod_hooks};
use crate::stats::{EventSink, TypeStats, WarnedKeys};

use super::config::{Config, PodSync};
use super::synced_type::run_type;

/// The syncers started for one version of the plugin's spec; dropping it stops them.
pub(super) struct Generation {
    pub(super) spec: VClusterPluginSpec,
    /// The hooks applied: the spec's once the operator accepted them
    /// ([`HookGate`](crate::acceptance::HookGate)).
    pub(super) in_force: InForce,
    pub(super) observed_generation: Option<i64>,
    /// One per synced type (and `v1 Pod` with `--pod-sync=full`), reported in
    /// `status.syncedObjects`.
    pub(super) types: Vec<Arc<TypeStats>>,
    /// The pod hooks' statistics: they count toward health, not toward `syncedObjects`.
    pub(super) pod_hooks: Option<Arc<TypeStats>>,
    pub(super) tasks: JoinSet<Result<(), Error>>,
}

impl Generation {
    pub(super) fn start(
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
