//! Objects that come back (`syncedTypes[].produced`): for each synced object of a `ToHost` type,
//! the object a host controller produced for its host copy (the Secret cert-manager issues for
//! a Certificate) is copied into the synced object's **virtual** namespace under the
//! **virtual** name, kept up to date, and removed when it is no longer produced for it.
//!
//! This project's addition (vCluster has no such option); the spelling is the API's
//! (`crds/src/plugin.rs`, [`ProducedObject`](vcp_crds::ProducedObject)): `apiVersion`, `kind`,
//! `namePath`. One [`run`] per `produced` entry of a synced type, on the runtime's one driver
//! (`driver.rs`): four watches, each with its cache — the synced type in the virtual cluster
//! (all namespaces, with the type's selector) and on the host (the host copies), the produced
//! kind on the host (the vCluster's host namespace) and in the virtual cluster (all
//! namespaces). The key of the work queue is the synced object's virtual `namespace/name`.
//!
//! For a synced object `ns/name` (reconcile):
//!
//! - the **host name** is the value at `namePath` in its host copy, the **virtual name** the
//!   value at `namePath` in the virtual object (the host copy's value is the one a `reference`
//!   patch on that path translated);
//! - the host name must be the host name of the virtual name in `ns`
//!   (`<virtual name>-x-<ns>-x-<vcluster>`, as a `reference` patch makes it): otherwise a
//!   tenant of one virtual namespace could bring back any object of the host namespace (another
//!   namespace's host copies, the vCluster's own Secrets) by naming it in a synced object. Such
//!   an object is not brought back: a `Warning` Event [`ProducedNameRefused`](vcp_crds::Reason)
//!   once per object, and it counts as failed in the status;
//! - the host name must have one reading only ([`ambiguous_host_name`]: `-x-` exactly twice in
//!   `<virtual name>-x-<ns>-x-<vcluster>`), else another namespace, plugin or vCluster could
//!   declare it too: refused in the same way, and what looks like a copy made for it is left as
//!   it is, no longer updated (as for a name two places declare);
//! - the host object of that name in the vCluster's host namespace (not one labelled
//!   `vcluster.loft.sh/managed-by`: a host copy vCluster made of a virtual object is never
//!   brought back) is copied to `ns/<virtual name>`: its labels and annotations but
//!   `vcluster.loft.sh/` keys, every top-level field but `metadata` and `status`, and the marks
//!   [`PRODUCED_FOR_ANNOTATION`](crate::translate::PRODUCED_FOR_ANNOTATION)
//!   (`<Kind>.<group>/<name>` of the synced object),
//!   [`PRODUCED_PATH_ANNOTATION`](crate::translate::PRODUCED_PATH_ANNOTATION) (the `namePath`),
//!   [`HOST_NAME_ANNOTATION`](crate::translate::HOST_NAME_ANNOTATION) and
//!   [`HOST_NAMESPACE_ANNOTATION`](crate::translate::HOST_NAMESPACE_ANNOTATION) (the host
//!   object, as vCluster marks what it imports), through
//!   the one write path (`write.rs`: the produced kind's `CreateVirtual` / `UpdateVirtual`
//!   hooks, a guarded merge patch of what differs);
//! - a virtual object at that place without the marks of this synced object and `namePath` is
//!   never touched: a conflict (the driver's
//!   [`ConflictReporter`](crate::driver::ConflictReporter): a `Warning` Event
//!   `HostObjectConflict` on the `VClusterPlugin`, and `syncedObjects[].conflicts` of the
//!   produced kind);
//! - the runtime's copies for this synced object elsewhere (the virtual name changed), and all of
//!   them when the synced object is gone or terminating, or when the host object is gone, are
//!   deleted (with their uid as precondition). While the host copy does not exist yet, nothing
//!   is changed.
//!
//! The copies are recognised by their marks after a restart (the virtual watch lists them), so
//! nothing is ever created twice. The runtime only reads the produced kind on the host (`get`,
//! `list`, `watch` in the vCluster's host namespace: the RBAC the operator derives).
//!
//! The parts: `claims` (shared by every entry of the runtime), `index` (what one entry's
//! watches told), `names` (the pure rules on names), `decide` (what a synced object asks for)
//! and `copies` (what a copy holds, and its writes); `entry` holds one entry's options and
//! state, which this module runs.

use std::collections::BTreeSet;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::watcher;

use crate::cache::Cache;
use crate::driver::{self, ObjectKey, Reconcile, Settings, Side, Watch};
use crate::error::Error;
use crate::hooks::HookPoint;
use crate::stats::{Outcome, TypeStats};
use crate::write::Writer;

mod claims;
mod copies;
mod decide;
mod entry;
mod index;
mod names;

pub use claims::Claims;
pub use copies::produced_copy;
pub use entry::ProducedOptions;
pub use names::{ambiguous_host_name, produced_for};

use decide::Wanted;
use entry::Produced;
use index::Index;

/// Brings back the objects of one `produced` entry of a synced type until the future is
/// dropped (see the module docs), on one worker.
///
/// # Errors
/// None at present: failures are retried with backoff and recorded in the statistics.
pub async fn run(opts: ProducedOptions) -> Result<(), Error> {
    let host_ns = opts.translator.host_namespace().to_string();
    let mut source_config = watcher::Config::default();
    if let Some(selector) = &opts.selector {
        source_config = source_config.labels_from(selector);
    }
    let watches = vec![
        Watch {
            side: Side::Virtual,
            api: driver::tolerant_api(opts.virtual_.clone(), None, &opts.source),
            config: source_config,
        },
        Watch {
            side: Side::Host,
            api: driver::tolerant_api(opts.host.clone(), Some(&host_ns), &opts.source),
            config: watcher::Config::default(),
        },
        Watch {
            side: Side::HostProduced,
            api: driver::tolerant_api(opts.host.clone(), Some(&host_ns), &opts.produced),
            config: watcher::Config::default(),
        },
        Watch {
            side: Side::VirtualProduced,
            api: driver::tolerant_api(opts.virtual_.clone(), None, &opts.produced),
            config: watcher::Config::default(),
        },
    ];
    let settings = Settings {
        workers: 1,
        resync_period: Some(opts.resync_period),
        on_conflict: opts.on_conflict.clone(),
        retry_max: opts.retry_max,
    };
    let produced = Produced {
        for_prefix: produced_for(&opts.source.api_version, &opts.source.kind, ""),
        entry: Claims::entry(&opts.source.api_version, &opts.source.kind, &opts.name_path),
        produced_kind: format!("{}/{}", opts.produced.api_version, opts.produced.kind),
        virtual_sources: Cache::new(),
        host_sources: Cache::new(),
        host_produced: Cache::new(),
        virtual_produced: Cache::new(),
        index: Mutex::new(Index::default()),
        writer: Writer::new(
            &opts.produced.api_version,
            &opts.produced.kind,
            opts.hooks.clone(),
            opts.stats.clone(),
        ),
        opts,
    };
    driver::run(produced, watches, settings).await;
    Ok(())
}

impl Reconcile for Produced {
    type Object = DynamicObject;

    fn stats(&self) -> &TypeStats {
        &self.opts.stats
    }

    fn cache(&self, side: Side) -> &Cache<DynamicObject> {
        match side {
            Side::Virtual => &self.virtual_sources,
            Side::Host => &self.host_sources,
            Side::HostProduced => &self.host_produced,
            Side::VirtualProduced => &self.virtual_produced,
        }
    }

    fn key_of(&self, side: Side, obj: &DynamicObject, deleted: bool) -> Option<ObjectKey> {
        self.keys_of(side, obj, deleted).into_iter().next()
    }

    fn keys_of(&self, side: Side, obj: &DynamicObject, deleted: bool) -> Vec<ObjectKey> {
        let Ok(mut index) = self.index.lock() else {
            return Vec::new();
        };
        match side {
            Side::Virtual => {
                let key = ObjectKey {
                    namespace: obj.namespace().unwrap_or_default(),
                    name: obj.name_any(),
                };
                let declared = (!deleted).then(|| self.declared(obj, &key)).flatten();
                self.opts.claims.declare(
                    &self.produced_kind,
                    (&self.entry, &self.opts.source.kind),
                    &key,
                    index.declared.get(&key),
                    declared.as_ref(),
                );
                let rivals = index.declare(&key, declared);
                std::iter::once(key).chain(rivals).collect()
            }
            Side::Host => self
                .opts
                .translator
                .virtual_key(&obj.metadata)
                .map(|(namespace, name)| ObjectKey { namespace, name })
                .into_iter()
                .collect(),
            Side::HostProduced => index
                .by_host_name
                .get(&obj.name_any())
                .map(|keys| keys.iter().cloned().collect())
                .unwrap_or_default(),
            Side::VirtualProduced => {
                let namespace = obj.namespace().unwrap_or_default();
                let name = obj.name_any();
                let mut keys: BTreeSet<ObjectKey> = index
                    .by_virtual_name
                    .get(&(namespace.clone(), name.clone()))
                    .cloned()
                    .unwrap_or_default();
                if let Some(source) = self.copy_source(obj) {
                    let key = ObjectKey {
                        namespace,
                        name: source,
                    };
                    index.copy(&key, &name, deleted);
                    keys.insert(key);
                }
                keys.into_iter().collect()
            }
        }
    }

    fn undecodable(&self, key: &ObjectKey) -> Option<String> {
        let translator = &self.opts.translator;
        let host_ns = translator.host_namespace();
        if let Some(error) = self.virtual_sources.undecodable(&key.namespace, &key.name) {
            return Some(format!("virtual {key}: {error}"));
        }
        let host_copy = translator.host_name(&key.name, &key.namespace);
        if let Some(error) = self.host_sources.undecodable(host_ns, &host_copy) {
            return Some(format!("host {host_ns}/{host_copy}: {error}"));
        }
        // what it declares: the host object brought back, and its copy
        let declared = self.index.lock().ok()?.declared.get(key).cloned()?;
        let (virtual_name, host_name) = (declared.0, declared.1);
        if let Some(error) = self.host_produced.undecodable(host_ns, &host_name) {
            return Some(format!(
                "host {} {host_ns}/{host_name}: {error}",
                self.opts.produced.kind
            ));
        }
        self.virtual_produced
            .undecodable(&key.namespace, &virtual_name)
            .map(|error| {
                format!(
                    "virtual {} {}/{virtual_name}: {error}",
                    self.opts.produced.kind, key.namespace
                )
            })
    }

    fn keys_of_undecodable(&self, side: Side, meta: &ObjectMeta) -> Vec<ObjectKey> {
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let Ok(index) = self.index.lock() else {
            return Vec::new();
        };
        match side {
            Side::Virtual => vec![ObjectKey { namespace, name }],
            Side::Host => Vec::new(),
            Side::HostProduced => index
                .by_host_name
                .get(&name)
                .map(|keys| keys.iter().cloned().collect())
                .unwrap_or_default(),
            Side::VirtualProduced => index
                .by_virtual_name
                .get(&(namespace, name))
                .map(|keys| keys.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    fn for_each_key(&self, push: &mut dyn FnMut(ObjectKey)) {
        self.virtual_sources.for_each_key(|namespace, name| {
            push(ObjectKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        });
        let copies: Vec<ObjectKey> = self
            .index
            .lock()
            .map(|index| index.copies.keys().cloned().collect())
            .unwrap_or_default();
        copies.into_iter().for_each(push);
    }

    fn caches_ready(&self) {
        self.opts.claims.listed(&self.entry);
    }

    async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
        let source = self
            .virtual_sources
            .get(&key.namespace, &key.name)
            .filter(|s| s.metadata.deletion_timestamp.is_none());
        let wanted = match &source {
            None => None,
            Some(source) => match self.wanted(key, source) {
                Wanted::Keep => return Ok(None),
                Wanted::Refused(message) => {
                    self.delete_copies(key, None).await?;
                    return Ok(Some(self.refused(source, message)));
                }
                Wanted::Ambiguous(message) => return Ok(Some(self.refused(source, message))),
                Wanted::Nothing => None,
                Wanted::Copy(name, host) => {
                    let waiting = self.opts.claims.waiting();
                    if !waiting.is_empty() {
                        return Err(Error::ProducedNotSettled {
                            waiting: waiting.join(", "),
                        });
                    }
                    Some((name, host))
                }
            },
        };
        self.delete_copies(key, wanted.as_ref().map(|(name, _)| name.as_str()))
            .await?;
        let Some((name, host)) = wanted else {
            return Ok(None);
        };
        match self.virtual_produced.get(&key.namespace, &name) {
            Some(current) if !self.is_copy_for(&current, key) => Ok(Some(Outcome::Conflict)),
            Some(current) if current.metadata.deletion_timestamp.is_some() => {
                Ok(Some(Outcome::Pending))
            }
            Some(current) => {
                self.update(key, &name, &host, &current).await?;
                Ok(Some(Outcome::InSync))
            }
            None => {
                let copy = self.copy_of(key, &name, &host, None);
                self.writer
                    .create(&self.target(&key.namespace), HookPoint::CreateVirtual, copy)
                    .await?;
                Ok(Some(Outcome::InSync))
            }
        }
    }

    fn conflict_message(&self, key: &ObjectKey) -> String {
        let name = self
            .index
            .lock()
            .ok()
            .and_then(|i| i.declared.get(key).map(|d| d.0.clone()))
            .unwrap_or_default();
        format!(
            "virtual {} {}/{name} exists and was not brought back by this runtime (it is produced on the host for {} {key}, {}); it is left untouched",
            self.opts.produced.kind, key.namespace, self.opts.source.kind, self.opts.name_path
        )
    }
}

#[cfg(test)]
mod tests;
