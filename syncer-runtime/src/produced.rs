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
//!   [`PRODUCED_FOR_ANNOTATION`] (`<Kind>.<group>/<name>` of the synced object),
//!   [`PRODUCED_PATH_ANNOTATION`] (the `namePath`), [`HOST_NAME_ANNOTATION`] and
//!   [`HOST_NAMESPACE_ANNOTATION`] (the host object, as vCluster marks what it imports), through
//!   the one write path (`write.rs`: the produced kind's `CreateVirtual` / `UpdateVirtual`
//!   hooks, a guarded merge patch of what differs);
//! - a virtual object at that place without the marks of this synced object and `namePath` is
//!   never touched: a conflict (the driver's [`ConflictReporter`]: a `Warning` Event
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::Selector;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::Value;
use vcp_crds::Reason;

use crate::cache::Cache;
use crate::driver::{self, ConflictReporter, ObjectKey, Reconcile, Settings, Side, Watch};
use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::patch::to_json;
use crate::stats::{Outcome, TypeStats};
use crate::translate::{
    HOST_NAME_ANNOTATION, HOST_NAMESPACE_ANNOTATION, MANAGED_BY_LABEL, NamespacedTranslator,
    PRODUCED_FOR_ANNOTATION, PRODUCED_PATH_ANNOTATION, copy_content,
};
use crate::write::{Cluster, Part, Target, Writer};

/// Everything [`run`] needs.
#[derive(Clone)]
pub struct ProducedOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster.
    pub virtual_: Client,
    /// The synced (`ToHost`) type's translator: vCluster name, host namespace, its kind.
    pub translator: NamespacedTranslator,
    /// The synced type (the same in both clusters).
    pub source: ApiResource,
    /// Only synced objects matching this label selector (the synced type's) bring anything back.
    pub selector: Option<Selector>,
    /// The produced kind (the same in both clusters, namespaced).
    pub produced: ApiResource,
    /// Path of the name in the synced object (`produced[].namePath`).
    pub name_path: String,
    /// The produced kind's hooks (`CreateVirtual`, `UpdateVirtual`, `DeleteVirtual` are used).
    pub hooks: Hooks,
    /// Statistics of the produced kind, shared with the status reporter.
    pub stats: Arc<TypeStats>,
    /// Every synced object is reconciled again this often.
    pub resync_period: Duration,
    /// Told once about each virtual object in the way of a copy.
    pub on_conflict: Option<ConflictReporter>,
    /// The longest delay between two attempts of a failing watch ([`crate::retry`]).
    pub retry_max: Duration,
    /// The host names declared by every `produced` entry of the runtime's synced types, shared
    /// by them all ([`Claims`]).
    pub claims: Arc<Claims>,
}

/// The host names that the `produced` entries of all synced types of one runtime declare,
/// so that a claim is judged against every other place that declares the same host object,
/// whatever its synced type. The third fresh attacker (issue 24) took another namespace's
/// private key through a second synced type: each entry's own index saw no rival.
///
/// Nothing is brought back until every entry the runtime runs has listed its synced objects
/// ([`Claims::expect`], [`Claims::waiting`]): after a restart, an entry that listed first
/// would otherwise copy before the rival places of the others were known.
#[derive(Debug, Default)]
pub struct Claims {
    /// `(produced apiVersion/kind, host name)` → `(entry, synced object)` → `(virtual name,
    /// synced kind)`; an entry is `<Kind>.<group>/` of its synced type and its `namePath`.
    by_host_name: Mutex<HashMap<(String, String), Places>>,
    /// The entries the runtime runs → whether each has listed its objects.
    entries: Mutex<BTreeMap<String, bool>>,
}

/// The places that declare one host name, per [`Claims`] entry and synced object: `(virtual
/// name, synced kind)`.
type Places = BTreeMap<(String, ObjectKey), (String, String)>;

impl Claims {
    /// The entry of `produced[]` entry `name_path` of the synced type `api_version` / `kind`.
    pub fn entry(api_version: &str, kind: &str, name_path: &str) -> String {
        format!("{}{name_path}", produced_for(api_version, kind, ""))
    }

    /// The entries of the `produced[]` of `synced` ([`Claims::entry`]); none for a `FromHost`
    /// type (its `produced` declares no host name).
    pub fn entries_of(synced: &vcp_crds::SyncedType) -> Vec<String> {
        synced
            .produced
            .iter()
            .filter(|_| synced.direction.is_to_host())
            .map(|p| Self::entry(&synced.api_version, &synced.kind, &p.name_path))
            .collect()
    }

    /// Waits for `entry` (see [`Claims::entry`]) to list its objects before anything is
    /// brought back (an entry already listed stays so).
    pub fn expect(&self, entry: String) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.entry(entry).or_insert(false);
        }
    }

    /// Stops waiting for `entry` (its produced kind is not served: it lists nothing).
    pub fn unexpect(&self, entry: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.remove(entry);
        }
    }

    /// `entry` has listed its objects (every cache of its driver holds its first list).
    fn listed(&self, entry: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(entry.to_string(), true);
        }
    }

    /// The entries not listed yet.
    fn waiting(&self) -> Vec<String> {
        self.entries
            .lock()
            .map(|e| {
                e.iter()
                    .filter(|(_, l)| !**l)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records that `key` of `entry` declares `declared` (or nothing) for `produced`, in place
    /// of `before`.
    fn declare(
        &self,
        produced: &str,
        (entry, kind): (&str, &str),
        key: &ObjectKey,
        before: Option<&Declared>,
        declared: Option<&Declared>,
    ) {
        let Ok(mut map) = self.by_host_name.lock() else {
            return;
        };
        let id = (entry.to_string(), key.clone());
        if let Some((_, host_name)) = before {
            let slot = (produced.to_string(), host_name.clone());
            if let Some(set) = map.get_mut(&slot) {
                set.remove(&id);
                if set.is_empty() {
                    map.remove(&slot);
                }
            }
        }
        if let Some((virtual_name, host_name)) = declared {
            map.entry((produced.to_string(), host_name.clone()))
                .or_default()
                .insert(id, (virtual_name.clone(), kind.to_string()));
        }
    }

    /// The places of other entries (other synced types, or another `namePath`) that declare
    /// `host_name` of `produced`: `(synced kind, synced object, virtual name)`.
    fn others(
        &self,
        produced: &str,
        host_name: &str,
        entry: &str,
    ) -> Vec<(String, ObjectKey, String)> {
        let Ok(map) = self.by_host_name.lock() else {
            return Vec::new();
        };
        map.get(&(produced.to_string(), host_name.to_string()))
            .into_iter()
            .flatten()
            .filter(|((e, _), _)| e != entry)
            .map(|((_, key), (virtual_name, kind))| {
                (kind.clone(), key.clone(), virtual_name.clone())
            })
            .collect()
    }
}

/// The value of [`PRODUCED_FOR_ANNOTATION`] for the synced object `name` of `api_version` /
/// `kind`: `<Kind>.<group>/<name>`, or `<Kind>/<name>` for the core group (kubectl's spelling
/// of a resource of a group, such as `Certificate.cert-manager.io/web`).
pub fn produced_for(api_version: &str, kind: &str, name: &str) -> String {
    match api_version.rsplit_once('/') {
        Some((group, _)) => format!("{kind}.{group}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The non-empty string at `path` (vCluster's patch notation: dots, brackets, `[*]`, parsed by
/// [`vcp_crds::patch_path::PatchPath`]; the first match) in `data` (an object's top-level
/// fields but `metadata`). `None` when the path does not parse (the operator refuses such a
/// plugin), is not found, or holds no string.
fn string_at<'a>(data: &'a Value, path: &str) -> Option<&'a str> {
    vcp_crds::patch_path::PatchPath::parse(path)
        .ok()?
        .get(data)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The names a synced object declares: `(virtual name, host name of the virtual name)`.
type Declared = (String, String);

/// What the watches told about names (hints: every reconcile reads the caches again).
#[derive(Default)]
struct Index {
    /// Synced object → what its virtual object declares.
    declared: HashMap<ObjectKey, Declared>,
    /// Host name of a declared virtual name → the synced objects declaring it.
    by_host_name: HashMap<String, BTreeSet<ObjectKey>>,
    /// `(namespace, virtual name)` → the synced objects declaring it.
    by_virtual_name: HashMap<(String, String), BTreeSet<ObjectKey>>,
    /// Synced object → the virtual objects marked as its copies.
    copies: HashMap<ObjectKey, BTreeSet<String>>,
}

impl Index {
    /// Records what `key` declares (`None`: nothing, or it is gone) and returns the other
    /// synced objects that declare the host name it declared before or declares now: a rival
    /// that comes or goes changes their [`claim`], so they are reconciled too.
    fn declare(&mut self, key: &ObjectKey, declared: Option<Declared>) -> BTreeSet<ObjectKey> {
        let mut rivals = BTreeSet::new();
        let names = self
            .declared
            .get(key)
            .map(|d| d.1.clone())
            .into_iter()
            .chain(declared.as_ref().map(|d| d.1.clone()));
        for host_name in names {
            rivals.extend(
                self.by_host_name
                    .get(&host_name)
                    .into_iter()
                    .flatten()
                    .filter(|k| *k != key)
                    .cloned(),
            );
        }
        if let Some((virtual_name, host_name)) = self.declared.remove(key) {
            remove(&mut self.by_host_name, &host_name, key);
            remove(
                &mut self.by_virtual_name,
                &(key.namespace.clone(), virtual_name),
                key,
            );
        }
        if let Some((virtual_name, host_name)) = declared {
            self.by_host_name
                .entry(host_name.clone())
                .or_default()
                .insert(key.clone());
            self.by_virtual_name
                .entry((key.namespace.clone(), virtual_name.clone()))
                .or_default()
                .insert(key.clone());
            self.declared.insert(key.clone(), (virtual_name, host_name));
        }
        rivals
    }

    fn copy(&mut self, key: &ObjectKey, name: &str, deleted: bool) {
        if deleted {
            remove(&mut self.copies, key, &name.to_string());
        } else {
            self.copies
                .entry(key.clone())
                .or_default()
                .insert(name.to_string());
        }
    }
}

fn remove<K: std::hash::Hash + Eq, V: Ord>(map: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V) {
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

struct Produced {
    opts: ProducedOptions,
    /// `<Kind>.<group>/` of the synced type, the prefix of [`PRODUCED_FOR_ANNOTATION`].
    for_prefix: String,
    /// This entry in [`Claims`]: `<Kind>.<group>/` of the synced type and the `namePath`
    /// ([`Claims::entry`]).
    entry: String,
    /// The produced kind in [`Claims`]: `apiVersion/kind`.
    produced_kind: String,
    virtual_sources: Cache<DynamicObject>,
    host_sources: Cache<DynamicObject>,
    host_produced: Cache<DynamicObject>,
    virtual_produced: Cache<DynamicObject>,
    index: Mutex<Index>,
    writer: Writer,
}

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

/// A synced object that declares a host name: its key, the virtual name it declares, and whether
/// a copy of the host object is already there under that name for it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Claimant {
    key: ObjectKey,
    virtual_name: String,
    holds_copy: bool,
    /// Its synced kind (the claimants of other synced types are rivals too, [`Claims`]).
    kind: String,
}

/// Whether `ours` may bring back the host object `host_name`, which `others` declare too.
///
/// vCluster's host names are ambiguous: `<name>-x-<namespace>-x-<vcluster>` is the same for
/// `web-tls` in namespace `a-x-team` and for `web-tls-x-a` in namespace `team`, so a tenant of
/// `team` could name another namespace's produced object (a Secret with its private key) as
/// its own. A host object is therefore brought back to one place only: when other synced
/// objects declare it under another namespace or virtual name, every claim is refused until
/// one is left; the copies already made are left as they are, no longer updated.
///
/// Whether a place already holds a copy is *not* a reason to keep copying to it: that is known
/// from marks on virtual objects (`vcp.dev/produced-for`, ...), which any virtual user can
/// write on an object of their own namespace, and a forged mark made the earlier rule ("the
/// first holder keeps it") copy another namespace's Secret, private key included, to the
/// forger (a fresh attacker, issue 24's second round). `holds_copy` only words the message.
///
/// # Errors
/// The refusal's message, naming the other claims.
fn claim(
    ours: &Claimant,
    others: &[Claimant],
    host_name: &str,
    source_kind: &str,
    produced_kind: &str,
) -> Result<(), String> {
    let rivals: Vec<&Claimant> = others
        .iter()
        .filter(|o| o.key.namespace != ours.key.namespace || o.virtual_name != ours.virtual_name)
        .collect();
    if rivals.is_empty() {
        return Ok(());
    }
    let named = |c: &Claimant| {
        format!(
            "{}/{} (for {} {})",
            c.key.namespace, c.virtual_name, c.kind, c.key
        )
    };
    if let Some(holder) = rivals.iter().find(|c| c.holds_copy) {
        return Err(format!(
            "{source_kind} {}: the host {produced_kind} {host_name:?} was brought back as {}; the host name of {:?} in namespace {} is the same (vCluster's `<name>-x-<namespace>-x-<vcluster>` is ambiguous), so it is brought back nowhere while both declare it (copies already made are left as they are, no longer updated)",
            ours.key,
            named(holder),
            ours.virtual_name,
            ours.key.namespace
        ));
    }
    Err(format!(
        "{source_kind} {}: the host {produced_kind} {host_name:?} is the host name of {:?} in namespace {} and also of {}: an ambiguous name (vCluster's `<name>-x-<namespace>-x-<vcluster>`) is brought back nowhere while more than one place declares it",
        ours.key,
        ours.virtual_name,
        ours.key.namespace,
        rivals
            .iter()
            .map(|c| named(c))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Why the host name of `virtual_name` in virtual namespace `namespace` of vCluster `vcluster`
/// could also be another place's, or `None` when no other place can have it.
///
/// vCluster's host name is `<name>-x-<namespace>-x-<vcluster>` (shortened past 63 characters
/// to a prefix and a hash of that whole string, [`crate::translate::safe_concat_name`]). When
/// that whole string holds the separator `-x-` exactly twice (occurrences counted overlapping),
/// every (name, namespace, vCluster) that spells it puts its two separators at those two
/// places, so it is the only one: no other virtual namespace, no other synced type or plugin
/// (another runtime process) and no other vCluster in the same host namespace can declare the
/// same host name. With a third occurrence (`-x-` inside the name, the namespace or the
/// vCluster's name, or across a boundary as in `a-x` + `-x-` + `x-b`) another place can
/// (`web-tls` in `a-x-team` and `web-tls-x-a` in `team`), and a produced object made for one
/// (a Secret with its private key) would be copied to the other; while the one it was made for
/// exists the claims of one runtime see both ([`claim`]), but not another runtime's, nor a
/// claim made after it was deleted and its host object left behind. So such a name is brought
/// back nowhere (the fourth fresh attacker, issue 24).
pub fn ambiguous_host_name(virtual_name: &str, namespace: &str, vcluster: &str) -> Option<String> {
    let full = [virtual_name, "x", namespace, "x", vcluster].join("-");
    // bytes, not `&full[i..]`: the virtual name is a virtual user's string at `namePath`, and a
    // slice inside a multi-byte character panicked the type's whole task (ASCII `-x-` never
    // occurs inside a UTF-8 sequence, so the count is the same)
    let separators = full.as_bytes().windows(3).filter(|w| *w == b"-x-").count();
    (separators != 2).then(|| {
        format!(
            "{full:?} ({virtual_name:?} in virtual namespace {namespace:?} of vCluster {vcluster:?}) holds the separator \"-x-\" {separators} times, so another namespace, plugin or vCluster could declare the same host name and be given this one's object: objects of such a name are brought back nowhere; use a name and a namespace without \"-x-\""
        )
    })
}

/// What one synced object asks for.
enum Wanted {
    /// Its host copy is not there yet: change nothing.
    Keep,
    /// No name, or no host object of that name: no copy.
    Nothing,
    /// The host name is not the host name of the virtual name (the message says why).
    Refused(String),
    /// The host name is declared by more than one place ([`claim`]): nothing is copied, and
    /// the copies already there are left as they are (no longer updated).
    Ambiguous(String),
    /// Copy this host object to this virtual name.
    Copy(String, Box<DynamicObject>),
}

impl Produced {
    /// The synced object `source` brings nothing back: one `ProducedNameRefused` Event per
    /// object, about it (the Event's related object, so that the refusals of two objects are
    /// two Events, not a repeat of the first), and the object counts as failed.
    fn refused(&self, source: &DynamicObject, message: String) -> Outcome {
        let uid = source.uid().unwrap_or_default();
        let related = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(self.opts.source.api_version.clone()),
            kind: Some(self.opts.source.kind.clone()),
            namespace: source.namespace(),
            name: Some(source.name_any()),
            uid: source.uid(),
            ..Default::default()
        };
        self.opts.stats.warn_once_about(
            Some(related),
            &format!(
                "{uid} {} {}",
                Reason::ProducedNameRefused,
                self.opts.name_path
            ),
            Reason::ProducedNameRefused,
            message.clone(),
        );
        Outcome::Failed(message)
    }

    /// What the virtual object `obj` (the synced object `key`) declares, from its `namePath`.
    fn declared(&self, obj: &DynamicObject, key: &ObjectKey) -> Option<Declared> {
        let name = string_at(&obj.data, &self.opts.name_path)?;
        Some((
            name.to_string(),
            self.opts.translator.host_name(name, &key.namespace),
        ))
    }

    fn wanted(&self, key: &ObjectKey, source: &DynamicObject) -> Wanted {
        let translator = &self.opts.translator;
        let Some((virtual_name, expected)) = self.declared(source, key) else {
            return Wanted::Nothing;
        };
        let Some(host_copy) = self
            .host_sources
            .get(
                translator.host_namespace(),
                &translator.host_name(&key.name, &key.namespace),
            )
            .filter(|h| translator.is_host_copy_of(&h.metadata, &key.name, &key.namespace))
        else {
            return Wanted::Keep;
        };
        let Some(host_name) = string_at(&host_copy.data, &self.opts.name_path) else {
            return Wanted::Nothing;
        };
        if host_name != expected {
            return Wanted::Refused(format!(
                "{} {key}: {} {:?} of its host copy is not the host name of {:?} in namespace {} ({expected:?}); only objects named as a reference patch on {} names them are brought back, so {} {}/{host_name} is not copied",
                self.opts.source.kind,
                self.opts.name_path,
                host_name,
                virtual_name,
                key.namespace,
                self.opts.name_path,
                self.opts.produced.kind,
                translator.host_namespace(),
            ));
        }
        if let Some(why) = ambiguous_host_name(&virtual_name, &key.namespace, translator.vcluster())
        {
            // as for a name two places declare: what looks like a copy made for it is left as
            // it is (its marks may be a virtual user's, on an object of their own)
            return Wanted::Ambiguous(format!(
                "{} {key}: {} {}/{host_name} is not copied: {why}",
                self.opts.source.kind,
                self.opts.produced.kind,
                translator.host_namespace(),
            ));
        }
        if let Err(message) = self.claim(key, &virtual_name, &expected) {
            return Wanted::Ambiguous(message);
        }
        match self
            .host_produced
            .get(translator.host_namespace(), host_name)
            .filter(|h| {
                h.metadata.deletion_timestamp.is_none()
                    && !h.labels().contains_key(MANAGED_BY_LABEL)
            }) {
            Some(host) => Wanted::Copy(virtual_name, Box::new(host)),
            None => Wanted::Nothing,
        }
    }

    /// Whether the synced object `key` may bring back the host object `host_name` as
    /// `virtual_name` in its namespace ([`claim`] over what the index knows of the other
    /// synced objects that declare the same host name).
    fn claim(&self, key: &ObjectKey, virtual_name: &str, host_name: &str) -> Result<(), String> {
        let Ok(index) = self.index.lock() else {
            return Ok(());
        };
        let holds =
            |k: &ObjectKey, name: &str| index.copies.get(k).is_some_and(|c| c.contains(name));
        let others: Vec<Claimant> = index
            .by_host_name
            .get(host_name)
            .into_iter()
            .flatten()
            .filter(|k| *k != key)
            .filter_map(|k| {
                let (name, _) = index.declared.get(k)?;
                Some(Claimant {
                    key: k.clone(),
                    virtual_name: name.clone(),
                    holds_copy: holds(k, name),
                    kind: self.opts.source.kind.clone(),
                })
            })
            .chain(
                self.opts
                    .claims
                    .others(&self.produced_kind, host_name, &self.entry)
                    .into_iter()
                    .map(|(kind, key, virtual_name)| Claimant {
                        key,
                        virtual_name,
                        holds_copy: false,
                        kind,
                    }),
            )
            .collect();
        claim(
            &Claimant {
                key: key.clone(),
                virtual_name: virtual_name.to_string(),
                holds_copy: holds(key, virtual_name),
                kind: self.opts.source.kind.clone(),
            },
            &others,
            host_name,
            &self.opts.source.kind,
            &self.opts.produced.kind,
        )
    }

    /// The synced object's name a virtual object of the produced kind is marked as a copy for,
    /// when it is a copy this runtime made for this `namePath` from the vCluster's host
    /// namespace.
    fn copy_source(&self, obj: &DynamicObject) -> Option<String> {
        let annotations = obj.metadata.annotations.as_ref()?;
        if annotations.get(PRODUCED_PATH_ANNOTATION) != Some(&self.opts.name_path)
            || annotations
                .get(HOST_NAMESPACE_ANNOTATION)
                .map(String::as_str)
                != Some(self.opts.translator.host_namespace())
        {
            return None;
        }
        annotations
            .get(PRODUCED_FOR_ANNOTATION)?
            .strip_prefix(&self.for_prefix)
            .map(str::to_string)
    }

    fn is_copy_for(&self, obj: &DynamicObject, key: &ObjectKey) -> bool {
        obj.namespace().as_deref() == Some(key.namespace.as_str())
            && self.copy_source(obj).as_deref() == Some(key.name.as_str())
    }

    /// Deletes the copies made for `key` but the one named `keep`.
    async fn delete_copies(&self, key: &ObjectKey, keep: Option<&str>) -> Result<(), Error> {
        let known: Vec<String> = self
            .index
            .lock()
            .map(|i| {
                i.copies
                    .get(key)
                    .map(|c| c.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        for name in known {
            if Some(name.as_str()) == keep {
                continue;
            }
            if let Some(copy) = self.virtual_produced.get(&key.namespace, &name)
                && self.is_copy_for(&copy, key)
                && copy.metadata.deletion_timestamp.is_none()
            {
                self.writer
                    .delete(
                        &self.target(&key.namespace),
                        HookPoint::DeleteVirtual,
                        &copy,
                    )
                    .await?;
            }
        }
        Ok(())
    }

    fn target(&self, namespace: &str) -> Target<DynamicObject> {
        Target {
            api: Api::namespaced_with(self.opts.virtual_.clone(), namespace, &self.opts.produced),
            cluster: Cluster::Virtual,
            namespace: namespace.to_string(),
        }
    }

    /// The copy of `host` as `key.namespace/name` for the synced object `key`, on top of the
    /// existing virtual object `base` (see the module docs).
    fn copy_of(
        &self,
        key: &ObjectKey,
        name: &str,
        host: &DynamicObject,
        base: Option<&DynamicObject>,
    ) -> DynamicObject {
        produced_copy(
            host,
            (&key.namespace, name),
            &produced_for(
                &self.opts.source.api_version,
                &self.opts.source.kind,
                &key.name,
            ),
            &self.opts.name_path,
            base,
        )
    }

    async fn update(
        &self,
        key: &ObjectKey,
        name: &str,
        host: &DynamicObject,
        current: &DynamicObject,
    ) -> Result<(), Error> {
        let desired = self.copy_of(key, name, host, Some(current));
        let mut current = current.clone();
        current.types.clone_from(&desired.types);
        let rv = current.resource_version();
        let current = to_json(&current, name)?;
        let desired = to_json(&desired, name)?;
        self.writer
            .patch(
                &self.target(&key.namespace),
                name,
                Part::Object,
                &[HookPoint::UpdateVirtual],
                &current,
                desired,
                rv,
            )
            .await?;
        Ok(())
    }
}

/// The virtual copy of the produced host object `host` at `target` (`(namespace, name)`) for the
/// synced object `produced_for` ([`produced_for`]) through `name_path`, on top of the existing
/// virtual object `base` (none for a create): `host`'s labels and annotations except
/// `vcluster.loft.sh/` keys, plus [`PRODUCED_FOR_ANNOTATION`], [`PRODUCED_PATH_ANNOTATION`],
/// [`HOST_NAME_ANNOTATION`] and [`HOST_NAMESPACE_ANNOTATION`]; every top-level field of `host`
/// but `metadata` and `status`; `base`'s other metadata (`uid`, `resourceVersion`, ...) and
/// `status` kept.
pub fn produced_copy(
    host: &DynamicObject,
    target: (&str, &str),
    produced_for: &str,
    name_path: &str,
    base: Option<&DynamicObject>,
) -> DynamicObject {
    let ours = |key: &String| !key.starts_with("vcluster.loft.sh/");
    let mut metadata = base.map(|b| b.metadata.clone()).unwrap_or_default();
    metadata.name = Some(target.1.to_string());
    metadata.namespace = Some(target.0.to_string());
    metadata.labels = Some(
        host.labels()
            .iter()
            .filter(|(k, _)| ours(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    let mut annotations: std::collections::BTreeMap<String, String> = host
        .annotations()
        .iter()
        .filter(|(k, _)| ours(k) && !k.starts_with("vcp.dev/produced-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(PRODUCED_FOR_ANNOTATION.into(), produced_for.to_string());
    annotations.insert(PRODUCED_PATH_ANNOTATION.into(), name_path.to_string());
    annotations.insert(HOST_NAME_ANNOTATION.into(), host.name_any());
    annotations.insert(
        HOST_NAMESPACE_ANNOTATION.into(),
        host.namespace().unwrap_or_default(),
    );
    metadata.annotations = Some(annotations);
    DynamicObject {
        types: host.types.clone(),
        metadata,
        data: copy_content(&host.data, base.and_then(|b| b.data.get("status"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_source_is_named_as_kubectl_names_a_resource_of_a_group() {
        assert_eq!(
            produced_for("cert-manager.io/v1", "Certificate", "web"),
            "Certificate.cert-manager.io/web"
        );
        assert_eq!(produced_for("v1", "ConfigMap", "a"), "ConfigMap/a");
    }

    /// The index follows what a synced object declares: a changed name leaves no stale entry,
    /// two objects declaring one name are both found, a forgotten object is gone everywhere.
    fn claimant(namespace: &str, name: &str, virtual_name: &str, holds_copy: bool) -> Claimant {
        Claimant {
            kind: "Certificate".into(),
            key: ObjectKey {
                namespace: namespace.into(),
                name: name.into(),
            },
            virtual_name: virtual_name.into(),
            holds_copy,
        }
    }

    #[test]
    fn a_host_name_with_one_reading_only_is_not_ambiguous() {
        assert_eq!(ambiguous_host_name("web-tls", "team", "vc"), None);
        assert_eq!(ambiguous_host_name("a-xb", "xa-b", "x"), None);
        // the fourth attacker's pair, and the other ways to a third separator
        for (name, namespace, vcluster) in [
            ("web-tls", "a-x-team", "vc"),
            ("web-tls-x-a", "team", "vc"),
            ("tls", "q", "a-x-b"),
            ("a-x", "b", "vc"),
            ("a", "x-b", "vc"),
        ] {
            let why = ambiguous_host_name(name, namespace, vcluster).expect(name);
            assert!(why.contains("3 times"), "{why}");
        }
    }

    /// The name at `namePath` is any string a virtual user writes: one with multi-byte
    /// characters is judged like any other (before, slicing it inside a character panicked,
    /// and the panic ended the task of the synced type: no object of the type synced any more).
    #[test]
    fn a_name_with_multi_byte_characters_is_judged_without_panicking() {
        assert_eq!(ambiguous_host_name("é-tls", "team", "vc"), None);
        assert_eq!(ambiguous_host_name("wéb", "tëam", "vç"), None);
        let why = ambiguous_host_name("é-x-ü", "team", "vc").expect("three separators");
        assert!(why.contains("3 times"), "{why}");
    }

    /// Against brute force: every DNS label of up to 4 characters over `a`, `x` and `-` as
    /// name, namespace and vCluster: a triple [`ambiguous_host_name`] lets through spells a
    /// string no other triple spells (and many it refuses share theirs with another).
    #[test]
    fn the_ambiguity_rule_matches_an_exhaustive_search() {
        let mut labels = Vec::new();
        for len in 1..=4u32 {
            for n in 0..3usize.pow(len) {
                let label: String = (0..len)
                    .map(|i| ['a', 'x', '-'][n / 3usize.pow(i) % 3])
                    .collect();
                if !label.starts_with('-') && !label.ends_with('-') {
                    labels.push(label);
                }
            }
        }
        let mut spelled: HashMap<String, Vec<(usize, usize, usize)>> = HashMap::new();
        for (a, n) in labels.iter().enumerate() {
            for (b, ns) in labels.iter().enumerate() {
                for (c, vc) in labels.iter().enumerate() {
                    spelled
                        .entry(format!("{n}-x-{ns}-x-{vc}"))
                        .or_default()
                        .push((a, b, c));
                }
            }
        }
        let (mut unique, mut shared) = (0, 0);
        for triples in spelled.values() {
            for &(a, b, c) in triples {
                let refused = ambiguous_host_name(&labels[a], &labels[b], &labels[c]).is_some();
                if refused {
                    shared += usize::from(triples.len() > 1);
                } else {
                    unique += 1;
                    assert_eq!(
                        triples.len(),
                        1,
                        "{:?}",
                        (&labels[a], &labels[b], &labels[c])
                    );
                }
            }
        }
        // both kinds occur, so the search tested something
        assert!(unique > 1000 && shared > 1000, "{unique} {shared}");
    }

    #[test]
    fn an_ambiguous_host_name_is_brought_back_nowhere() {
        // the attack: `web-tls` in `a-x-team` and `web-tls-x-a` in `team` have one host name
        let host = "web-tls-x-a-x-team-x-vc";
        let translator = NamespacedTranslator::new("vc", "host-ns", "v1", "Secret");
        assert_eq!(translator.host_name("web-tls", "a-x-team"), host);
        assert_eq!(translator.host_name("web-tls-x-a", "team"), host);
        let victim = |holds| claimant("a-x-team", "web", "web-tls", holds);
        let attacker = |holds| claimant("team", "grab", "web-tls-x-a", holds);
        // the second round's attack: the attacker forged the marks of a held copy on an object
        // of their own namespace; holding a copy wins nothing, for either side
        for (attacker_holds, victim_holds) in [(true, true), (true, false), (false, true)] {
            let refused = claim(
                &attacker(attacker_holds),
                &[victim(victim_holds)],
                host,
                "Certificate",
                "Secret",
            )
            .unwrap_err();
            assert!(refused.contains("a-x-team/web-tls"), "{refused}");
            assert!(
                claim(
                    &victim(victim_holds),
                    &[attacker(attacker_holds)],
                    host,
                    "Certificate",
                    "Secret"
                )
                .is_err()
            );
        }
        let refused = claim(
            &attacker(false),
            &[victim(true)],
            host,
            "Certificate",
            "Secret",
        )
        .unwrap_err();
        assert!(
            refused.contains("was brought back as a-x-team/web-tls"),
            "{refused}"
        );
        // neither holds one: both are refused until one is left
        assert!(
            claim(
                &victim(false),
                &[attacker(false)],
                host,
                "Certificate",
                "Secret"
            )
            .is_err()
        );
        assert!(
            claim(
                &attacker(false),
                &[victim(false)],
                host,
                "Certificate",
                "Secret"
            )
            .is_err()
        );
        assert_eq!(
            claim(&victim(false), &[], host, "Certificate", "Secret"),
            Ok(())
        );
        // two synced objects of one namespace naming the same virtual name are one place
        let twin = claimant("a-x-team", "web-2", "web-tls", false);
        assert_eq!(
            claim(&victim(false), &[twin], host, "Certificate", "Secret"),
            Ok(())
        );
    }

    /// The third attacker's H2: one host name declared through two synced types (two entries):
    /// each entry sees the other's places as rivals, its own not (its index has them); what a
    /// place no longer declares is forgotten.
    #[test]
    fn claims_are_shared_across_synced_types() {
        let claims = Claims::default();
        let key = |ns: &str, name: &str| ObjectKey {
            namespace: ns.into(),
            name: name.into(),
        };
        let host = "web-tls-x-a-x-team-x-vc";
        let certs = ("Certificate.cert-manager.io/spec.secretName", "Certificate");
        let widgets = ("Widget.e2e.vcp.test/spec.secretName", "Widget");
        let victim: Declared = ("web-tls".into(), host.into());
        let attacker: Declared = ("web-tls-x-a".into(), host.into());
        claims.declare(
            "v1/Secret",
            certs,
            &key("a-x-team", "web"),
            None,
            Some(&victim),
        );
        claims.declare(
            "v1/Secret",
            widgets,
            &key("team", "grab"),
            None,
            Some(&attacker),
        );
        assert_eq!(
            claims.others("v1/Secret", host, widgets.0),
            [(
                "Certificate".to_string(),
                key("a-x-team", "web"),
                "web-tls".to_string()
            )]
        );
        assert_eq!(
            claims.others("v1/Secret", host, certs.0),
            [(
                "Widget".to_string(),
                key("team", "grab"),
                "web-tls-x-a".to_string()
            )]
        );
        // another produced kind of the same host name is another object
        assert!(claims.others("v1/ConfigMap", host, widgets.0).is_empty());
        // the claim of the attacker's Widget is refused, naming the victim's Certificate
        let ours = Claimant {
            key: key("team", "grab"),
            virtual_name: "web-tls-x-a".into(),
            holds_copy: false,
            kind: "Widget".into(),
        };
        let others: Vec<Claimant> = claims
            .others("v1/Secret", host, widgets.0)
            .into_iter()
            .map(|(kind, key, virtual_name)| Claimant {
                key,
                virtual_name,
                holds_copy: false,
                kind,
            })
            .collect();
        let refused = claim(&ours, &others, host, "Widget", "Secret").unwrap_err();
        assert!(
            refused.contains("a-x-team/web-tls (for Certificate a-x-team/web)"),
            "{refused}"
        );
        // the victim's place goes: the attacker's is the only one left
        claims.declare(
            "v1/Secret",
            certs,
            &key("a-x-team", "web"),
            Some(&victim),
            None,
        );
        assert!(claims.others("v1/Secret", host, widgets.0).is_empty());
        claims.declare(
            "v1/Secret",
            widgets,
            &key("team", "grab"),
            Some(&attacker),
            None,
        );
        assert!(claims.by_host_name.lock().unwrap().is_empty());
    }

    /// Nothing comes back until every entry the runtime runs has listed; an entry whose kind
    /// is not served is not waited for.
    #[test]
    fn nothing_comes_back_before_every_entry_has_listed() {
        let claims = Claims::default();
        let certs = Claims::entry("cert-manager.io/v1", "Certificate", "spec.secretName");
        let widgets = Claims::entry("e2e.vcp.test/v1", "Widget", "spec.secretName");
        assert_eq!(certs, "Certificate.cert-manager.io/spec.secretName");
        claims.expect(certs.clone());
        claims.expect(widgets.clone());
        claims.listed(&widgets);
        assert_eq!(claims.waiting(), std::slice::from_ref(&certs));
        claims.unexpect(&certs);
        assert!(claims.waiting().is_empty());
        claims.expect(certs.clone());
        claims.listed(&certs);
        claims.expect(certs);
        assert!(claims.waiting().is_empty(), "a listed entry stays listed");
    }

    #[test]
    fn the_index_follows_declared_names_and_copies() {
        let key = |name: &str| ObjectKey {
            namespace: "a".into(),
            name: name.into(),
        };
        let mut index = Index::default();
        let none = BTreeSet::new();
        assert_eq!(
            index.declare(&key("web"), Some(("tls".into(), "tls-x-a-x-vc".into()))),
            none
        );
        // a rival that comes is reported, so that the first declarer is reconciled too
        assert_eq!(
            index.declare(&key("api"), Some(("tls".into(), "tls-x-a-x-vc".into()))),
            BTreeSet::from([key("web")])
        );
        assert_eq!(index.by_host_name["tls-x-a-x-vc"].len(), 2);
        // and one that goes: `web` leaves the name, `api` is told
        assert_eq!(
            index.declare(
                &key("web"),
                Some(("web-tls".into(), "web-tls-x-a-x-vc".into())),
            ),
            BTreeSet::from([key("api")])
        );
        assert_eq!(
            index.by_host_name["tls-x-a-x-vc"],
            BTreeSet::from([key("api")])
        );
        assert_eq!(
            index.by_virtual_name[&("a".to_string(), "web-tls".to_string())],
            BTreeSet::from([key("web")])
        );
        index.declare(&key("api"), None);
        index.declare(&key("web"), None);
        assert!(index.declared.is_empty() && index.by_host_name.is_empty());
        assert!(index.by_virtual_name.is_empty());
        index.copy(&key("web"), "tls", false);
        index.copy(&key("web"), "web-tls", false);
        index.copy(&key("web"), "tls", true);
        assert_eq!(
            index.copies[&key("web")],
            BTreeSet::from(["web-tls".to_string()])
        );
        index.copy(&key("web"), "web-tls", true);
        assert!(index.copies.is_empty());
    }

    #[test]
    fn a_dotted_path_reads_a_non_empty_string() {
        let obj = json!({"spec": {"secretName": "web-tls", "empty": "", "n": 1, "o": {}}});
        assert_eq!(string_at(&obj, "spec.secretName"), Some("web-tls"));
        for path in [
            "spec.empty",
            "spec.n",
            "spec.o",
            "spec.missing",
            "spec",
            "x.y",
        ] {
            assert_eq!(string_at(&obj, path), None, "{path}");
        }
    }

    /// The copy of a Secret cert-manager issued on the host for the host copy of Certificate
    /// `team-a/web` (its `secretName` `web-tls` translated to `web-tls-x-team-a-x-vc`).
    #[test]
    fn a_copy_carries_the_content_and_the_marks_of_its_source() {
        let host: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "web-tls-x-team-a-x-vc", "namespace": "vc-ns", "uid": "h",
                         "resourceVersion": "5",
                         "labels": {"controller.cert-manager.io/fao": "true",
                                    "vcluster.loft.sh/managed-by": "vc"},
                         "annotations": {"cert-manager.io/certificate-name": "web-x-team-a-x-vc",
                                         "vcluster.loft.sh/object-name": "x",
                                         "vcp.dev/produced-for": "Certificate.cert-manager.io/forged"}},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y3J0", "tls.key": "a2V5"}
        }))
        .unwrap();
        let copy = produced_copy(
            &host,
            ("team-a", "web-tls"),
            "Certificate.cert-manager.io/web",
            "spec.secretName",
            None,
        );
        let expected: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "web-tls", "namespace": "team-a",
                         "labels": {"controller.cert-manager.io/fao": "true"},
                         "annotations": {
                             "cert-manager.io/certificate-name": "web-x-team-a-x-vc",
                             "vcp.dev/produced-for": "Certificate.cert-manager.io/web",
                             "vcp.dev/produced-path": "spec.secretName",
                             "vcluster.loft.sh/object-host-name": "web-tls-x-team-a-x-vc",
                             "vcluster.loft.sh/object-host-namespace": "vc-ns"}},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y3J0", "tls.key": "a2V5"}
        }))
        .unwrap();
        assert_eq!(copy, expected);

        // an update keeps the virtual object's own metadata
        let mut base = copy.clone();
        base.metadata.uid = Some("v".into());
        base.metadata.resource_version = Some("9".into());
        let mut renewed = host.clone();
        renewed.data["data"]["tls.crt"] = json!("bmV3");
        let updated = produced_copy(
            &renewed,
            ("team-a", "web-tls"),
            "Certificate.cert-manager.io/web",
            "spec.secretName",
            Some(&base),
        );
        assert_eq!(updated.metadata.uid.as_deref(), Some("v"));
        assert_eq!(updated.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(updated.data["data"]["tls.crt"], json!("bmV3"));
    }
}
