//! One synced type of a spec generation: resolved (retrying while it is not served), then
//! run as a [`DeclarativeSyncer`] under the [`controller`] for `ToHost`, or
//! [`from_host::run`] for `FromHost`, with its `produced` entries ([`produced::run`]).

use std::sync::Arc;

use kube::api::ApiResource;
use kube::core::Selector;
use tracing::warn;
use vcp_crds::{SyncDirection, SyncedType};

use crate::context::{RegisterContext, SyncContext, vcluster_owner_uid};
use crate::controller::{self, ConflictReporter};
use crate::error::Error;
use crate::from_host::{self, FromHostOptions};
use crate::hooks::{ClientHook, Hooks};
use crate::patches::Patches;
use crate::pods::update_filter;
use crate::produced::{self, ProducedOptions};
use crate::retry::Retry;
use crate::stats::TypeStats;
use crate::syncer::DeclarativeSyncer;
use crate::translate::{FromHostMapping, NamespacedTranslator};

use super::config::Config;
use super::discovery::{cluster_scoped_kinds, resolve, resolve_on};

/// Resolves a synced type (retrying with backoff while it is not served) and runs its syncer:
/// a [`DeclarativeSyncer`] under the [`controller`](crate::controller) for `ToHost`,
/// [`from_host::run`] for `FromHost`.
pub(super) async fn run_type(
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
