//! What the operator reads without asking the API server on every reconcile: watch caches of
//! the objects it reads (vCluster workloads, its own labelled Roles, RoleBindings,
//! ClusterRoles and ClusterRoleBindings), the full copies of the workloads plugins target
//! ([`copies`]), and the plurals API discovery returned.
//!
//! The caches follow the vClusters and the plugins, not the cluster: every watch carries a
//! label selector, so the operator's memory does not grow with the StatefulSets, Deployments,
//! Roles and RoleBindings of the cluster that are not a vCluster or made for a plugin
//! (`vcp_operator_cached_objects{kind}` counts what each cache holds, [`crate::telemetry`]):
//! - StatefulSets and Deployments labelled `app=vcluster` ([`VCLUSTER_APP_LABEL`]), the chart
//!   label a vCluster's workload must carry anyway ([`crate::workload::vcluster_identity`]),
//!   **metadata only** ([`meta`], [`WorkloadMeta`]: identity, version, and the names of the
//!   pod-template entries the operator owns; listed in pages of [`WORKLOAD_LIST_PAGE_SIZE`]).
//!   Anyone who may create a StatefulSet can set that label, so the cache must not grow with
//!   what such objects hold: the operator's memory does not grow with the size of workloads
//!   no plugin targets. A workload's events trigger the reconcile of the plugins targeting it
//!   ([`crate::controller`]), whatever changed in it (a metadata watch sees every change).
//!   Its pod template is read only by a reconcile of a plugin that targets it ([`workload`]:
//!   one GET, kept as its full copy, [`WorkloadCopies`], within [`COPIES_BUDGET`], until the
//!   watch shows a newer version). A workload that gains a plugin is thus read in full by that
//!   plugin's first reconcile. A plugin whose target is not in the cache costs one direct GET
//!   of the StatefulSet and one of the Deployment per reconcile ([`fetch_workload`]): a
//!   workload without the label is then still found and refused with `NotAVCluster` (not
//!   `VClusterNotFound`), as before. A workload that gains the label enters the watch (an
//!   event: its plugins are reconciled); one that loses it leaves the watch as a delete event,
//!   which triggers its plugins the same way;
//! - Roles and RoleBindings labelled [`PLUGIN_NAME_LABEL`]: the plugins' own objects (the only
//!   ones `crate::writes::apply_rbac` reads). `rbac.mode: PatchVClusterRoles` needs the other
//!   Roles and RoleBindings of the vCluster's namespace (the Role bound to its service account,
//!   every binding of that Role for `SharedVClusterRole`, the Roles carrying a plugin's added
//!   rules): those are listed from the API server in that one namespace when needed
//!   (`crate::vcluster::observe`: one list of each per reconcile of a plugin in that mode, or of a plugin
//!   whose spec changed since its status was written, which may have left that mode); their
//!   changes are watched, not cached, and only in the namespaces of plugins in that mode
//!   ([`crate::patched_roles`]);
//! - ClusterRoles and ClusterRoleBindings labelled [`PLUGIN_NAME_LABEL`].
//!
//! A cache may lag behind the API server. The rules that keep a lag from causing a wrong
//! write:
//! - every install-path write is a server-side apply or a merge patch with `resourceVersion`
//!   (optimistic concurrency): a write decided from a stale copy is idempotent or refused with
//!   409 Conflict, never a lost update;
//! - a "nothing to do" decided from a stale copy is corrected by the watch event of the change
//!   the copy missed, which triggers a reconcile of the plugins concerned;
//! - the operator's own workload writes are kept as the workloads' copies
//!   ([`WorkloadCopies::statefulset`], [`WorkloadCopies::deployment`]) and preferred to the
//!   older version the metadata cache still shows (a higher `generation`), so that the next
//!   reconcile of the same workload does not act on the state before that write; a copy older
//!   than what the cache shows is never used (it is read again);
//! - the finalizer path ([`crate::vcluster::delete`]) reads the API server directly: it removes objects,
//!   and no later event would correct a removal skipped on a stale copy.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::Api;
use kube::core::GroupVersionKind;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use vcp_crds::tolerant::{self, Skipped, StatusPolicy, Tolerant};
use vcp_crds::{OPERATOR_FIELD_MANAGER, PLUGIN_NAME_LABEL, VClusterPlugin};

use crate::error::{Error, Result};
use crate::rbac::{self, Plurals, Served};
use crate::telemetry::Telemetry;
use crate::workload::{VCLUSTER_APP_LABEL, VCLUSTER_APP_VALUE, Workload, WorkloadKind};

pub mod copies;
pub mod meta;
#[cfg(test)]
mod tests;

pub use copies::{COPIES_BUDGET, WorkloadCopies};
pub use meta::{Owned, WorkloadMeta};

/// How long a discovered plural is trusted before it is discovered again (a CRD deleted or
/// recreated with another plural is noticed within this time). A type that is not served is
/// remembered for [`NOT_SERVED_TTL`] only.
pub const PLURAL_TTL: Duration = Duration::from_secs(60);

/// How long "not served" is trusted for a type: 10 s, half of
/// [`RECHECK`](crate::vcluster::RECHECK), so that the recheck of an `UnknownType` plugin always
/// asks the API server again (the refusal resolves at the first recheck after the CRD is
/// installed, as before), while the reconciles of the other plugins of the same vCluster in
/// between do not.
///
/// Every reconcile of a plugin discovers the types of *all* plugins of its vCluster
/// ([`Discovery::plurals_of`]), under the vCluster's lock. Before this cache, a tenant's 120
/// plugins of 23 unserved types each (`example.loft.sh/v1000` … : admission checks the group
/// and the resource, not the version) cost 2,760 discovery requests per reconcile, 120 such
/// reconciles every [`RECHECK`](crate::vcluster::RECHECK) queued on one lock, and while they
/// waited they held every reconcile slot of the operator: another tenant's new plugin was not
/// reconciled for minutes (`tests/tests/operator_fairness_discovery.rs`).
pub const NOT_SERVED_TTL: Duration = Duration::from_secs(10);

/// Watch caches (reflector stores) of the objects the install path reads, filled by the
/// streams [`Caches::new`] returns; those streams also trigger reconciles
/// ([`crate::controller::run_until`]).
#[derive(Clone)]
pub struct Caches {
    /// StatefulSets labelled `app=vcluster`: their metadata only ([`WorkloadMeta`]).
    pub statefulsets: Store<WorkloadMeta<StatefulSet>>,
    /// Deployments labelled `app=vcluster`: their metadata only ([`WorkloadMeta`]).
    pub deployments: Store<WorkloadMeta<Deployment>>,
    /// Roles labelled [`PLUGIN_NAME_LABEL`], without `managedFields`.
    pub roles: Store<Role>,
    /// RoleBindings labelled [`PLUGIN_NAME_LABEL`], without `managedFields`.
    pub role_bindings: Store<RoleBinding>,
    /// ClusterRoles labelled [`PLUGIN_NAME_LABEL`], without `managedFields`.
    pub cluster_roles: Store<ClusterRole>,
    /// ClusterRoleBindings labelled [`PLUGIN_NAME_LABEL`], without `managedFields`.
    pub cluster_role_bindings: Store<ClusterRoleBinding>,
}

/// Set once every cache of a [`Caches`] holds its initial list ([`Caches::ready_signal`]);
/// cheap to clone, any number of tasks may wait on it.
#[derive(Clone, Debug)]
pub struct CachesReady(tokio::sync::watch::Receiver<bool>);

impl CachesReady {
    /// Waits until the caches hold their initial lists (immediately once they do).
    ///
    /// # Errors
    /// [`Error::CacheClosed`] when a cache's stream was dropped before its initial list (the
    /// controller is stopping).
    pub async fn wait(&self) -> Result<()> {
        let mut rx = self.0.clone();
        rx.wait_for(|ready| *ready)
            .await
            .map(|_| ())
            .map_err(|_| Error::CacheClosed)
    }

    /// Whether the caches hold their initial lists now.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }
}

/// A watch stream that fills a cache; each item is an object that was added, changed or
/// deleted (to be mapped to the plugins to reconcile).
pub type Reflected<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// The streams feeding [`Caches`], in the same order as its fields.
pub struct CacheStreams {
    /// Events of StatefulSets labelled `app=vcluster` (one that loses the label comes as a
    /// delete), metadata only.
    pub statefulsets: Reflected<WorkloadMeta<StatefulSet>>,
    /// Events of Deployments labelled `app=vcluster` (likewise).
    pub deployments: Reflected<WorkloadMeta<Deployment>>,
    /// Labelled Role events.
    pub roles: Reflected<Role>,
    /// Labelled RoleBinding events.
    pub role_bindings: Reflected<RoleBinding>,
    /// Labelled ClusterRole events.
    pub cluster_roles: Reflected<ClusterRole>,
    /// Labelled ClusterRoleBinding events.
    pub cluster_role_bindings: Reflected<ClusterRoleBinding>,
}

/// Objects per page of every list the operator's watches make: 100, not kube's 500.
///
/// A list page arrives whole (one response body) and is parsed whole before its objects are
/// trimmed ([`drop_managed_fields`], [`keep_own_managed_fields`]) and stored, so each
/// concurrent initial list holds a page of full objects, `managedFields` included, at once. On
/// a restart every cache lists at the same time; at 1,000 vClusters (2,000 plugins, 1,000
/// StatefulSets with Helm's and the operator's `managedFields`) the operator's peak resident set
/// was the restart's, above the install's (`docs/BENCHMARKS.md`). Smaller pages cost
/// more list requests (20 instead of 4 for 2,000 objects), each a few milliseconds.
pub const LIST_PAGE_SIZE: u32 = 100;

/// Objects per page of the lists of the workload caches: 25.
///
/// Those lists hold metadata only ([`WorkloadMeta`]), but anyone who may create a StatefulSet
/// can make its metadata as large as the object (annotations up to 256 KiB, labels, or
/// `managedFields` written by hand), up to what etcd stores (1.5 MiB). The text of a page
/// arrives whole before it is decoded (and then skipped, module docs of [`meta`]), so a page
/// is at most 25 × 1.5 MiB, about 38 MiB, whatever a tenant writes; a vCluster chart's
/// StatefulSet's metadata is a few KiB, so 1,000 vClusters are 40 lists of about 100 KiB.
pub const WORKLOAD_LIST_PAGE_SIZE: u32 = 25;

/// The watch configuration of every operator watch: consistent lists (kube's default, not
/// `any_semantic`: after an API server restart a list served from its still-filling watch
/// cache can return a resourceVersion the cache has already compacted away, and the watch from
/// it fails with `410 Expired` again and again; minutes without reconciles, seen by hand), in
/// pages of [`LIST_PAGE_SIZE`].
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

/// A reflector on `api`: the store and the stream that fills it (the store fills only while
/// the stream is polled). `strip` trims each object before it is stored. After each event
/// the store's size is set as `vcp_operator_cached_objects{kind=<K's kind>}` in `telemetry`,
/// and each list after the first is counted there as a re-list of K's kind
/// ([`Telemetry::count_list`]).
///
/// The watch reads tolerantly ([`crate::tolerant`]): an object that cannot be decoded is
/// skipped (logged, counted as `vcp_operator_undecodable_objects_total{kind}`) and dropped from
/// the store; one whose status alone cannot be read is stored without it (the operator reads
/// no workload's status, and RBAC objects have none).
fn reflect<K>(
    api: Api<Tolerant<K>>,
    wc: watcher::Config,
    strip: fn(&mut K),
    telemetry: &Arc<Telemetry>,
) -> (Store<K>, Reflected<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&()).to_string();
    let counted = reader.clone();
    let telemetry = telemetry.clone();
    let mut lists = 0;
    let skipped = {
        let (kind, telemetry) = (kind.clone(), telemetry.clone());
        move |s: &Skipped| crate::tolerant::log_skipped(&kind, s, &telemetry)
    };
    let stream = tolerant::watcher(
        api,
        wc,
        StatusPolicy::PassWithout,
        skipped,
        crate::tolerant::ghost_of(reader.clone()),
    )
    .default_backoff()
    .modify(strip)
    .reflect(writer)
    .inspect(move |event| {
        if let Ok(watcher::Event::Init) = event {
            telemetry.count_list(&kind, &mut lists);
        }
        telemetry.set_cached_objects(&kind, counted.len());
    })
    .touched_objects();
    (reader, Box::pin(stream))
}

/// Drops every `managedFields` entry (the RBAC comparisons do not use them).
fn drop_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

impl Caches {
    /// The caches and the streams that fill them, watching with `client` (the operator's
    /// identity: list/watch on each type, `config/rbac/role.yaml`), each with its label
    /// selector (module docs); the size of each cache is reported in `telemetry`.
    pub fn new(client: &Client, telemetry: &Arc<Telemetry>) -> (Self, CacheStreams) {
        let wc = watch_config();
        let labelled = wc.clone().labels(PLUGIN_NAME_LABEL);
        let vclusters = wc
            .clone()
            .page_size(WORKLOAD_LIST_PAGE_SIZE)
            .labels(&format!("{VCLUSTER_APP_LABEL}={VCLUSTER_APP_VALUE}"));
        // Metadata only, decoded already trimmed ([`meta`]): nothing left to strip.
        let (statefulsets, sts) = reflect(
            Api::<Tolerant<WorkloadMeta<StatefulSet>>>::all(client.clone()),
            vclusters.clone(),
            |_| {},
            telemetry,
        );
        let (deployments, deploy) = reflect(
            Api::<Tolerant<WorkloadMeta<Deployment>>>::all(client.clone()),
            vclusters,
            |_| {},
            telemetry,
        );
        let (roles, role) = reflect(
            Api::<Tolerant<Role>>::all(client.clone()),
            labelled.clone(),
            drop_managed_fields,
            telemetry,
        );
        let (role_bindings, rb) = reflect(
            Api::<Tolerant<RoleBinding>>::all(client.clone()),
            labelled.clone(),
            drop_managed_fields,
            telemetry,
        );
        let (cluster_roles, cr) = reflect(
            Api::<Tolerant<ClusterRole>>::all(client.clone()),
            labelled.clone(),
            drop_managed_fields,
            telemetry,
        );
        let (cluster_role_bindings, crb) = reflect(
            Api::<Tolerant<ClusterRoleBinding>>::all(client.clone()),
            labelled,
            drop_managed_fields,
            telemetry,
        );
        (
            Caches {
                statefulsets,
                deployments,
                roles,
                role_bindings,
                cluster_roles,
                cluster_role_bindings,
            },
            CacheStreams {
                statefulsets: sts,
                deployments: deploy,
                roles: role,
                role_bindings: rb,
                cluster_roles: cr,
                cluster_role_bindings: crb,
            },
        )
    }

    /// Starts the one task that waits until every cache holds its initial list, and returns
    /// the signal it sets then, which any number of tasks may wait on
    /// ([`CachesReady::wait`]). Call once per set of caches, inside a tokio runtime.
    ///
    /// Why one task: kube-runtime's `Store::wait_until_ready` keeps a single waker, so of
    /// several tasks waiting on the same store concurrently only the last one to poll is woken
    /// (the others wait forever). Reconciles run concurrently, so they must not each wait on
    /// the stores; and nothing here waits on the controller's own VClusterPlugin store, which
    /// kube-runtime's applier already waits on.
    pub fn ready_signal(&self) -> CachesReady {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let caches = self.clone();
        tokio::spawn(async move {
            if caches.wait_for_initial_lists().await.is_ok() {
                let _ = tx.send(true);
            }
            // On error `tx` is dropped: waiters get `Error::CacheClosed`.
        });
        CachesReady(rx)
    }

    /// Waits until every cache holds its initial list (immediately once they do). Only the
    /// task of [`Caches::ready_signal`] calls this (see there).
    ///
    /// # Errors
    /// [`Error::CacheClosed`] when a cache's stream was dropped (the controller is stopping).
    async fn wait_for_initial_lists(&self) -> Result<()> {
        let closed = |_| Error::CacheClosed;
        self.statefulsets.wait_until_ready().await.map_err(closed)?;
        self.deployments.wait_until_ready().await.map_err(closed)?;
        self.roles.wait_until_ready().await.map_err(closed)?;
        self.role_bindings
            .wait_until_ready()
            .await
            .map_err(closed)?;
        self.cluster_roles
            .wait_until_ready()
            .await
            .map_err(closed)?;
        self.cluster_role_bindings
            .wait_until_ready()
            .await
            .map_err(closed)
    }

    /// The cached (labelled [`PLUGIN_NAME_LABEL`]) Roles of `namespace`.
    pub fn roles_in(&self, namespace: &str) -> Vec<Role> {
        self.roles
            .state()
            .iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
            .map(|r| (**r).clone())
            .collect()
    }
}

/// The workload of the vCluster `name` in `namespace`, as a plugin that targets it reads it:
/// its full copy ([`WorkloadCopies::current`]: the version the metadata caches show, or the
/// operator's own newer write), else read from the API server and kept as the copy (one GET
/// of the kind the caches hold it as).
///
/// The caches hold only workloads labelled `app=vcluster` (module docs): on a miss the
/// StatefulSet, else the Deployment, is read from the API server ([`fetch_workload`]: at most
/// two GETs, nothing kept), so that a workload without the chart's labels is still found (and
/// refused as `NotAVCluster`), and `None` means that neither exists.
///
/// # Errors
/// API errors of the direct reads other than 404.
pub async fn workload(
    client: &Client,
    caches: &Caches,
    copies: &WorkloadCopies,
    namespace: &str,
    name: &str,
) -> Result<Option<Workload>> {
    let key = ObjectRef::new(name).within(namespace);
    let cached = match caches.statefulsets.get(&key) {
        Some(sts) => Some((WorkloadKind::StatefulSet, sts.metadata.clone())),
        None => caches
            .deployments
            .get(&ObjectRef::new(name).within(namespace))
            .map(|d| (WorkloadKind::Deployment, d.metadata.clone())),
    };
    let Some((kind, meta)) = cached else {
        copies.forget(namespace, name);
        return fetch_workload(client, namespace, name).await;
    };
    if let Some(copy) = copies.current(kind, &meta) {
        return Ok(Some(copy));
    }
    let read = match kind {
        WorkloadKind::StatefulSet => get::<StatefulSet>(client, namespace, name)
            .await?
            .map(|s| (Workload::from_statefulset(&s), s.metadata.resource_version)),
        WorkloadKind::Deployment => get::<Deployment>(client, namespace, name)
            .await?
            .map(|d| (Workload::from_deployment(&d), d.metadata.resource_version)),
    };
    match read {
        Some((mut wl, resource_version)) => {
            wl.managed_fields
                .retain(|f| f.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER));
            copies.keep(wl.clone(), resource_version.as_deref());
            Ok(Some(wl))
        }
        // Gone since the cache saw it (or now of the other kind): as on a miss.
        None => fetch_workload(client, namespace, name).await,
    }
}

/// The workload of the vCluster `name` in `namespace`: the StatefulSet, else the Deployment,
/// read from the API server (the cleanup and the sweep, and [`workload`] on a cache miss).
///
/// # Errors
/// API errors other than 404.
pub async fn fetch_workload(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Workload>> {
    if let Some(s) = get::<StatefulSet>(client, namespace, name).await? {
        return Ok(Some(Workload::from_statefulset(&s)));
    }
    Ok(get::<Deployment>(client, namespace, name)
        .await?
        .map(|d| Workload::from_deployment(&d)))
}

/// The object `name` of kind `K` in `namespace` from the API server, `None` when it does not
/// exist.
///
/// # Errors
/// API errors other than 404.
async fn get<K>(client: &Client, namespace: &str, name: &str) -> Result<Option<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let kind = K::kind(&());
    Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| Error::kube(format!("get {kind} {namespace}/{name}"), e))
}

/// Plurals and scopes found by API discovery, by `(apiVersion, kind)`, each trusted for
/// [`PLURAL_TTL`]; `None` (not served) for [`NOT_SERVED_TTL`].
#[derive(Default)]
pub struct Discovery {
    found: Mutex<Found>,
}

/// What [`Discovery`] holds: by `(apiVersion, kind)`, what discovery said (`None`: not
/// served) and when.
type Found = HashMap<(String, String), (Option<Served>, Instant)>;

impl Discovery {
    /// The plurals and scopes of the types every plugin of `plugins` names
    /// ([`rbac::types_to_resolve`]): from this cache when
    /// discovered less than [`PLURAL_TTL`] ago (found not served less than [`NOT_SERVED_TTL`]
    /// ago), else by discovery (one request per type). A type the API server does not serve is
    /// left out (and refused by [`rbac::desired`]). Expired "not served" entries are dropped
    /// on each call, so the types of deleted plugins are not held.
    ///
    /// # Errors
    /// Discovery failures other than "not served".
    pub async fn plurals_of(
        &self,
        client: &Client,
        plugins: &[&VClusterPlugin],
    ) -> Result<Plurals> {
        let mut types: Vec<(String, String)> = plugins
            .iter()
            .flat_map(|p| rbac::types_to_resolve(p))
            .collect();
        types.sort();
        types.dedup();
        let mut plurals = Plurals::new();
        let fresh = |(served, at): &(Option<Served>, Instant)| {
            at.elapsed()
                < if served.is_some() {
                    PLURAL_TTL
                } else {
                    NOT_SERVED_TTL
                }
        };
        self.lock()
            .retain(|_, entry| entry.0.is_some() || fresh(entry));
        for t in types {
            let cached = self
                .lock()
                .get(&t)
                .filter(|entry| fresh(entry))
                .map(|(served, _)| served.clone());
            let plural = match cached {
                Some(known) => known,
                None => {
                    let found = discover(client, &t.0, &t.1).await?;
                    self.lock()
                        .insert(t.clone(), (found.clone(), Instant::now()));
                    found
                }
            };
            if let Some(p) = plural {
                plurals.insert(t, p);
            }
        }
        Ok(plurals)
    }

    /// Types held (one per `(apiVersion, kind)` discovered).
    pub fn entries(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Found> {
        self.found
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The plural and scope of `kind` in `api_version`, or `None` when the API server does not
/// serve it.
///
/// # Errors
/// Discovery failures other than "not served".
pub async fn discover(client: &Client, api_version: &str, kind: &str) -> Result<Option<Served>> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, kind);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, caps)) => Ok(Some(Served {
            plural: ar.plural,
            namespaced: caps.scope == kube::discovery::Scope::Namespaced,
        })),
        Err(kube::Error::Discovery(_)) => Ok(None),
        // A group the API server does not serve answers a plain-text `404 page not found`,
        // which kube turns into a `Status` without the `NotFound` reason: match the code.
        Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(format!("discover {kind} in {api_version}"), e)),
    }
}
