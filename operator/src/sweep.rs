//! The sweep: nothing the operator made for a plugin outlives the plugin.
//!
//! The finalizer `vcp.dev/cleanup` ([`crate::vcluster::delete`]) removes what was added when a plugin is
//! deleted, but a tenant may remove the finalizer by hand, and an operator stopped during a
//! delete may never see it. The sweep removes, for every plugin that no longer exists, every
//! object the operator itself labelled or annotated for it:
//! - ClusterRoles, ClusterRoleBindings, Roles and RoleBindings labelled
//!   [`PLUGIN_NAME_LABEL`] / [`PLUGIN_NAMESPACE_LABEL`] (deleted; a garbage collector would
//!   collect only the namespaced ones, and only where one runs);
//! - rules recorded in a vCluster Role under `rbac.mode: PatchVClusterRoles` (the annotations
//!   `vcp.dev/added-rules.*` of every key scheme, [`crate::rbac::record_keys`], and the rules
//!   they record as appended, taken out with [`crate::rbac::patch_records`]);
//! - containers, init containers and volumes in a vCluster workload: the operator's
//!   server-side-apply entry owns a container or init container named after a plugin that no
//!   longer targets that workload (deleted, or moved to another vCluster): the workload's
//!   apply is recomputed from the plugins that still exist ([`crate::vcluster::reapply`]: the
//!   same observe → decide → act as a reconcile).
//!
//! Only the operator's own marks count ([`owned_by_operator`]): a label or annotation counts
//! when the operator's field manager ([`OPERATOR_FIELD_MANAGER`]) owns it in `managedFields`,
//! so an object a user labelled so is never swept.
//!
//! When it runs ([`spawn`]): once the plugins' watch cache and the other caches hold their
//! first full lists (the start of the operator, or of its leadership), for every plugin
//! ([`Scope::All`]); after each plugin delete the plugins' watch reports
//! ([`Scope::Plugin`]: the plugin's own labelled objects and its namespace's Roles and
//! workloads), whether or not the finalizer ran; and every [`SWEEP_INTERVAL`] for every plugin,
//! the safety net for a delete missed while the watch was down. Deletes that come together
//! are swept together: more than [`SWEEP_ALL_ABOVE`] plugin scopes waiting at once are swept
//! as one `Scope::All` that also looks at their namespaces' Roles ([`pass_of`]). What one
//! object's read or write fails never stops the rest: the sweep goes on, collects the failures
//! ([`Swept::failed`]), and retries the scope after [`crate::config::RETRY`], doubling up to
//! [`SWEEP_INTERVAL`].
//!
//! The pure part ([`Existing`], [`labelled_orphan`], [`orphan_records`], [`orphan_entries`])
//! decides from the live objects and the existing plugins; [`sweep`] reads and writes. Reads
//! are lists from the API server (with `managedFields`), not the watch caches, as in the
//! cleanup; the workloads are picked from the cache and read again before they are applied.
//!
//! Which plugins exist is read from the plugins' watch cache *after* each list (or read) it
//! judges, never from a copy taken when the sweep began ([`Existing::now`]): a plugin created
//! while a sweep runs is reconciled at once (its objects are written by a reconcile that read
//! it from that cache), so an earlier copy could judge the objects its first reconcile had
//! just created, listed a moment later, as a deleted plugin's. That is what a fresh-clone CI
//! run of `operator_ops` saw with `--debounce-ms 0`: the new leader's start-up sweep began
//! without `first`, `first` was created and reconciled meanwhile, and the sweep's list of
//! labelled Roles (after its list of RoleBindings) held `first`'s new Role, which it deleted;
//! the Role's delete event made the next reconcile create it again 12 ms later. Read after the
//! list, the cache holds every plugin whose reconcile wrote an object the list holds (a plugin
//! leaves it only with its delete), so an object is judged an orphan only when its plugin is
//! gone.
//! Cost: after a delete, one labelled list of each RBAC kind (selecting that plugin's objects),
//! one list of the namespace's Roles and one GET per vCluster workload of the namespace. A
//! sweep of every plugin lists the four labelled kinds cluster-wide (what the caches hold) and
//! the Roles of each namespace holding a vCluster workload or a plugin (records sit on Roles
//! no label selects, and a cluster-wide list of Roles would hold every Role of the cluster in
//! memory); a record on a Role of a namespace with neither is not looked for.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::BackoffBuilder as _;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tracing::{Instrument, debug, info, info_span, instrument, warn};
use vcp_crds::tolerant::Tolerant;
use vcp_crds::{OPERATOR_FIELD_MANAGER, PLUGIN_NAME_LABEL, PLUGIN_NAMESPACE_LABEL, VClusterPlugin};

use crate::cache::Owned;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::rbac::{self, ADDED_RULES_PREFIX};
use crate::trace::{self, Key};
use crate::workload::{SYNCER_CONTAINER, Workload, WorkloadKind, owned_entries};

/// How often every plugin is swept besides the start and the deletes (the same period as the
/// install path's resync, [`crate::vcluster::RESYNC`]).
pub const SWEEP_INTERVAL: Duration = crate::vcluster::RESYNC;

/// How long the sweeper waits after a trigger for more (the deletes of one `kubectl delete`
/// of several plugins), to sweep them together.
pub const COALESCE: Duration = Duration::from_millis(300);

/// Above this many plugin scopes waiting together, the sweeper sweeps them as one
/// [`Scope::All`] (with their namespaces' Roles, [`sweep_all`]) instead of one by one.
///
/// A plugin scope costs five requests (four labelled lists and the namespace's Roles) plus a
/// GET per workload of its namespace, one after the other; `Scope::All` costs the same four
/// lists cluster-wide and one list of Roles per namespace. 10,000 plugins deleted in chunks of
/// 1,000 (`tests/tests/memory_churn.rs`) left a backlog of over 11,000 plugin scopes that
/// took longer to sweep than the deletes took to happen; swept as `All`, a chunk is a few
/// sweeps. 16 scopes cost 80 requests, more than an `All` of a cluster with a few namespaces
/// of vClusters.
pub const SWEEP_ALL_ABOVE: usize = 16;

/// What one sweep looks at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every plugin's objects, cluster-wide (start and [`SWEEP_INTERVAL`]).
    All,
    /// The objects of the plugin `name` of `namespace`, just deleted: its labelled objects, the
    /// Roles and vCluster workloads of its namespace.
    Plugin {
        /// The plugin's namespace.
        namespace: String,
        /// The plugin's name.
        name: String,
    },
}

/// The plugins that exist (the plugins' watch cache), as the sweep needs them.
#[derive(Clone, Debug, Default)]
pub struct Existing {
    /// Plugin names by namespace.
    names: BTreeMap<String, BTreeSet<String>>,
    /// Plugin names by (namespace, targeted vCluster).
    targets: BTreeMap<(String, String), BTreeSet<String>>,
}

impl Existing {
    /// The plugins `plugins` (the plugins' watch cache) holds now. Read after the list of the
    /// objects judged with it, never before (module docs).
    pub fn now(plugins: &Store<VClusterPlugin>) -> Self {
        Self::new(plugins.state().iter().map(|p| &**p))
    }

    /// The plugins of `plugins` (those being deleted included: their finalizer's cleanup
    /// removes what they have).
    pub fn new<'a>(plugins: impl IntoIterator<Item = &'a VClusterPlugin>) -> Self {
        let mut out = Self::default();
        for p in plugins {
            let namespace = p.namespace().unwrap_or_default();
            out.names
                .entry(namespace.clone())
                .or_default()
                .insert(p.name_any());
            out.targets
                .entry((namespace, p.spec.vcluster.name.clone()))
                .or_default()
                .insert(p.name_any());
        }
        out
    }

    /// Whether the plugin `name` exists in `namespace`.
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.names.get(namespace).is_some_and(|n| n.contains(name))
    }

    /// Whether some plugin of `namespace` targets the vCluster `vcluster`.
    pub fn targets_any(&self, namespace: &str, vcluster: &str) -> bool {
        self.targets
            .get(&(namespace.to_string(), vcluster.to_string()))
            .is_some_and(|n| !n.is_empty())
    }

    /// Whether the plugin `name` of `namespace` targets the vCluster `vcluster`.
    pub fn targets(&self, namespace: &str, vcluster: &str, name: &str) -> bool {
        self.targets
            .get(&(namespace.to_string(), vcluster.to_string()))
            .is_some_and(|n| n.contains(name))
    }

    /// The names of the plugins of `namespace`.
    pub fn names_in(&self, namespace: &str) -> impl Iterator<Item = &str> {
        self.names
            .get(namespace)
            .into_iter()
            .flatten()
            .map(String::as_str)
    }
}

/// Whether the operator's field manager owns `metadata.<field>.<key>` of `meta` (an entry of
/// `managedFields` with manager [`OPERATOR_FIELD_MANAGER`], any operation: its server-side
/// applies and its merge patches alike).
pub fn owned_by_operator(meta: &ObjectMeta, field: &str, key: &str) -> bool {
    meta.managed_fields.iter().flatten().any(|e| {
        e.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER)
            && e.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata"))
                .and_then(|m| m.get(format!("f:{field}")))
                .and_then(|l| l.get(format!("f:{key}")))
                .is_some()
    })
}

/// The plugin (namespace, name) an object was labelled for by the operator, when both labels
/// are there, the operator owns them, and the object is where and what the operator makes for
/// that plugin: a namespaced object lives in the plugin's namespace and is named
/// [`rbac::role_name`], a cluster-scoped one is named [`rbac::cluster_role_name`] (the same
/// names `config/admission/operator-bounds.yaml` lets the operator delete).
///
/// `managedFields` alone proves nothing: any client that may update an object may rewrite
/// them, so a tenant could claim an object of theirs (or of a name the operator may not
/// delete) as the operator's; the name and namespace are what the operator itself derives.
pub fn labelled_for(meta: &ObjectMeta) -> Option<(String, String)> {
    let labels = meta.labels.as_ref()?;
    let name = labels.get(PLUGIN_NAME_LABEL)?;
    let namespace = labels.get(PLUGIN_NAMESPACE_LABEL)?;
    let ours = owned_by_operator(meta, "labels", PLUGIN_NAME_LABEL)
        && owned_by_operator(meta, "labels", PLUGIN_NAMESPACE_LABEL);
    let derived = match meta.namespace.as_deref() {
        Some(ns) => ns == namespace && meta.name.as_deref() == Some(&rbac::role_name(name)),
        None => meta.name.as_deref() == Some(&rbac::cluster_role_name(namespace, name)),
    };
    (ours && derived).then(|| (namespace.clone(), name.clone()))
}

/// Whether the object of `meta` was labelled by the operator for a plugin that no longer
/// exists.
pub fn labelled_orphan(meta: &ObjectMeta, existing: &Existing) -> bool {
    labelled_for(meta).is_some_and(|(namespace, name)| !existing.contains(&namespace, &name))
}

/// The annotations of `role` recording rules (`vcp.dev/added-rules.*`, written by the
/// operator) of no plugin that exists in the Role's namespace: no key of theirs, of the current
/// or the earlier scheme ([`rbac::record_keys`]), is the annotation's.
pub fn orphan_records(role: &Role, existing: &Existing) -> Vec<String> {
    let namespace = role.namespace().unwrap_or_default();
    let claimed: BTreeSet<String> = existing
        .names_in(&namespace)
        .flat_map(|n| rbac::record_keys(n, &[]))
        .collect();
    role.annotations()
        .keys()
        .filter(|k| k.starts_with(ADDED_RULES_PREFIX))
        .filter(|k| owned_by_operator(&role.metadata, "annotations", k))
        .filter(|k| !claimed.contains(*k))
        .cloned()
        .collect()
}

/// The containers and init containers of `workload` that the operator's apply owns (by name;
/// not `syncer`, of which it owns only the `/plugins` mount) and that no existing plugin
/// targeting the workload is named after, sorted.
pub fn orphan_entries(workload: &Workload, existing: &Existing) -> Vec<String> {
    let owned = owned_entries(&workload.managed_fields);
    let mut out: BTreeSet<String> = BTreeSet::new();
    for list in ["f:containers", "f:initContainers"] {
        for key in owned
            .get(list)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let Some(name) = key
                .0
                .strip_prefix("k:")
                .and_then(|k| serde_json::from_str::<Value>(k).ok())
                .and_then(|k| k.get("name").and_then(Value::as_str).map(String::from))
            else {
                continue;
            };
            if name != SYNCER_CONTAINER
                && !existing.targets(&workload.namespace, &workload.name, &name)
            {
                out.insert(name);
            }
        }
    }
    out.into_iter().collect()
}

/// What one [`sweep`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Labelled RBAC objects deleted, as `<Kind> <namespace/>name`.
    pub deleted: Vec<String>,
    /// vCluster Roles whose orphaned records were taken out, as `namespace/name`.
    pub restored_roles: Vec<String>,
    /// Workloads applied again without orphaned entries, as `namespace/name`.
    pub workloads: Vec<String>,
    /// What could not be read or written, each with the API server's answer; the sweep went
    /// on with the rest, and retries the whole scope later ([`spawn`]).
    pub failed: Vec<String>,
}

impl Swept {
    fn is_empty(&self) -> bool {
        self.deleted.is_empty()
            && self.restored_roles.is_empty()
            && self.workloads.is_empty()
            && self.failed.is_empty()
    }

    /// Records `result`'s error, if any, in [`Swept::failed`] (the sweep goes on: one object
    /// the operator cannot remove, such as one a tenant made to look like the operator's,
    /// never holds up the others).
    fn note(&mut self, result: Result<()>) {
        if let Err(e) = result {
            self.failed.push(e.to_string());
        }
    }
}

/// Sweeps `scope` (module docs): deletes the labelled RBAC objects of plugins that no longer
/// exist, takes their records out of vCluster Roles, and applies the workloads that hold their
/// entries again from the plugins that exist.
///
/// Every read and write is tried whatever failed before it: the API server's refusals are
/// collected in [`Swept::failed`] (a 404 or a failed precondition on delete, and a 409
/// Conflict on a Role's patch, are not failures: the object changed, the next sweep looks
/// again).
pub async fn sweep(ctx: &Context, scope: &Scope) -> Swept {
    sweep_in(ctx, scope, &BTreeSet::new()).await
}

/// [`sweep`] of [`Scope::All`] that also takes the records of deleted plugins out of the Roles
/// of `namespaces` (the namespaces of the plugin scopes it stands for: their Roles are
/// looked at even when no plugin or vCluster workload is left there, as a plugin scope would).
pub async fn sweep_all(ctx: &Context, namespaces: &BTreeSet<String>) -> Swept {
    sweep_in(ctx, &Scope::All, namespaces).await
}

/// What one pass of the sweeper sweeps of the scopes `pending`, and the namespaces whose Roles
/// a sweep of [`Scope::All`] looks at besides its own ([`sweep_all`]): `All` alone when it
/// is pending (it covers every plugin scope) or when more than [`SWEEP_ALL_ABOVE`] plugin
/// scopes are (then with their namespaces); else the plugin scopes one by one.
pub fn pass_of(pending: BTreeSet<Scope>) -> (Vec<Scope>, BTreeSet<String>) {
    if !pending.contains(&Scope::All) && pending.len() <= SWEEP_ALL_ABOVE {
        return (pending.into_iter().collect(), BTreeSet::new());
    }
    let namespaces = pending
        .into_iter()
        .filter_map(|s| match s {
            Scope::Plugin { namespace, .. } => Some(namespace),
            Scope::All => None,
        })
        .collect();
    (vec![Scope::All], namespaces)
}

/// [`sweep`] of `scope`, and for [`Scope::All`] the Roles of the namespaces `also` too.
async fn sweep_in(ctx: &Context, scope: &Scope, also: &BTreeSet<String>) -> Swept {
    if *scope == Scope::All {
        prune_gone_workloads(ctx);
    }
    // Only to pick the namespaces and workloads to look at: each orphan is judged with the
    // plugins the cache holds after the list that found it (`Existing::now`, module docs).
    let existing = Existing::now(&ctx.plugins);
    // The full copies of workloads no plugin targets any more (a deleted plugin's) go now.
    ctx.copies
        .retain(|_, namespace, name| existing.targets_any(namespace, name));
    let mut swept = Swept::default();
    let (selector, namespace) = match scope {
        Scope::All => (PLUGIN_NAME_LABEL.to_string(), None),
        Scope::Plugin { namespace, name } => (
            format!("{PLUGIN_NAME_LABEL}={name},{PLUGIN_NAMESPACE_LABEL}={namespace}"),
            Some(namespace.as_str()),
        ),
    };
    let labelled = ListParams::default().labels(&selector);
    let client = &ctx.client;

    // Bindings before roles: the grant goes first.
    let result = delete_orphans(
        Api::<Tolerant<ClusterRoleBinding>>::all(client.clone()),
        |_| Api::all(client.clone()),
        &labelled,
        ctx,
        &mut swept,
    )
    .await;
    swept.note(result);
    let result = delete_orphans(
        Api::<Tolerant<ClusterRole>>::all(client.clone()),
        |_| Api::all(client.clone()),
        &labelled,
        ctx,
        &mut swept,
    )
    .await;
    swept.note(result);
    let (bindings, roles) = match namespace {
        Some(ns) => (
            Api::<Tolerant<RoleBinding>>::namespaced(client.clone(), ns),
            Api::<Tolerant<Role>>::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let result = delete_orphans(
        bindings,
        |ns| Api::namespaced(client.clone(), ns),
        &labelled,
        ctx,
        &mut swept,
    )
    .await;
    swept.note(result);
    let result = delete_orphans(
        roles,
        |ns| Api::namespaced(client.clone(), ns),
        &labelled,
        ctx,
        &mut swept,
    )
    .await;
    swept.note(result);
    // Records are on Roles no label selects (the vCluster's own), so they are listed per
    // namespace, never cluster-wide (the operator's reads of Roles across the cluster carry a
    // label selector, `crate::cache`): the deleted plugin's namespace, or every namespace with
    // a vCluster workload or a plugin.
    let namespaces: BTreeSet<String> = match namespace {
        Some(ns) => BTreeSet::from([ns.to_string()]),
        None => ctx
            .caches
            .statefulsets
            .state()
            .iter()
            .filter_map(|s| s.namespace())
            .chain(
                ctx.caches
                    .deployments
                    .state()
                    .iter()
                    .filter_map(|d| d.namespace()),
            )
            .chain(existing.names.keys().cloned())
            .chain(also.iter().cloned())
            .collect(),
    };
    for ns in namespaces {
        let result = restore_orphan_records(ctx, &ns, &mut swept).await;
        swept.note(result);
    }

    // Workloads: picked from the metadata cache (all of the namespace after a delete: the cache
    // may not show yet an apply a reconcile in flight made; else those whose operator-owned
    // entries name a plugin that no longer targets them, [`Owned`]), read again and applied
    // under the workload's lock.
    let pick = |meta: &ObjectMeta, owned: &Owned| {
        let (ns, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let picked = match namespace {
            Some(only) => ns == only,
            None => owned.may_hold_other_than(|plugin| existing.targets(&ns, &name, plugin)),
        };
        picked.then_some((ns, name))
    };
    let cached: Vec<(String, String)> = ctx
        .caches
        .statefulsets
        .state()
        .iter()
        .filter_map(|s| pick(&s.metadata, &s.owned))
        .chain(
            ctx.caches
                .deployments
                .state()
                .iter()
                .filter_map(|d| pick(&d.metadata, &d.owned)),
        )
        .collect();
    for (wl_namespace, wl_name) in cached {
        let lock = ctx.workload_lock(&wl_namespace, &wl_name);
        let _guard = lock.lock().await;
        let fresh = match crate::cache::fetch_workload(client, &wl_namespace, &wl_name).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => continue,
            Err(e) => {
                swept.failed.push(e.to_string());
                continue;
            }
        };
        let orphans = orphan_entries(&fresh, &Existing::now(&ctx.plugins));
        if orphans.is_empty() {
            continue;
        }
        if let Err(e) = crate::vcluster::reapply(ctx, fresh.clone()).await {
            swept.failed.push(e.to_string());
            continue;
        }
        swept.workloads.push(format!(
            "{}/{} ({})",
            fresh.namespace,
            fresh.name,
            orphans.join(", ")
        ));
    }
    swept
}

/// Drops the per-workload state of the workloads the watch caches no longer hold (deleted, or
/// no longer a vCluster): the dry-run verdicts ([`crate::judge::Verdicts`]) and the full
/// copies ([`crate::cache::WorkloadCopies`]), which nothing else removes once their workload
/// is gone (no per-object state outlives its object). Run with every sweep of [`Scope::All`].
fn prune_gone_workloads(ctx: &Context) {
    let statefulsets: BTreeSet<(String, String)> = ctx
        .caches
        .statefulsets
        .state()
        .iter()
        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    let deployments: BTreeSet<(String, String)> = ctx
        .caches
        .deployments
        .state()
        .iter()
        .map(|d| (d.namespace().unwrap_or_default(), d.name_any()))
        .collect();
    let exists = |set: &BTreeSet<(String, String)>, namespace: &str, name: &str| {
        set.contains(&(namespace.to_string(), name.to_string()))
    };
    ctx.verdicts.retain(|kind, namespace, name| match kind {
        "StatefulSet" => exists(&statefulsets, namespace, name),
        "Deployment" => exists(&deployments, namespace, name),
        _ => false,
    });
    ctx.copies.retain(|kind, namespace, name| match kind {
        WorkloadKind::StatefulSet => exists(&statefulsets, namespace, name),
        WorkloadKind::Deployment => exists(&deployments, namespace, name),
    });
}

/// Takes the records of plugins that no longer exist ([`orphan_records`], judged with the
/// plugins' watch cache as it is once the Roles are listed: [`Existing::now`]) out of the Roles
/// of `namespace`, recording each Role in `swept`.
async fn restore_orphan_records(ctx: &Context, namespace: &str, swept: &mut Swept) -> Result<()> {
    let api = Api::<Role>::namespaced(ctx.client.clone(), namespace);
    let roles = Api::<Tolerant<Role>>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list Roles in {namespace}"), e))?
        .items;
    // one Role that cannot be read is named and left out, never the sweep of the others
    let roles = crate::tolerant::readable("Role", roles, &ctx.telemetry);
    let existing = &Existing::now(&ctx.plugins);
    let pp = PatchParams {
        field_manager: Some(OPERATOR_FIELD_MANAGER.into()),
        ..Default::default()
    };
    for role in roles {
        let name = role.name_any();
        let orphans = orphan_records(&role, existing);
        let Some(patch) = (!orphans.is_empty())
            .then(|| rbac::patch_records(&role, &orphans, None))
            .flatten()
        else {
            continue;
        };
        let span = info_span!("restore_role", kind = "Role", object = %Key::of(&role));
        let sent = api
            .patch(&name, &pp, &Patch::Merge(&patch))
            .instrument(span.clone())
            .await;
        match sent {
            Ok(_) => swept.restored_roles.push(format!("{namespace}/{name}")),
            // Changed since the list: the next sweep (or the Role's plugin) looks again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                span.in_scope(|| debug!("Role changed during the sweep"));
            }
            Err(e) => swept.failed.push(
                Error::kube(
                    format!("merge-patch the rules of Role {namespace}/{name}"),
                    e,
                )
                .to_string(),
            ),
        }
    }
    Ok(())
}

/// Deletes every object `api` lists with `params` that the operator labelled for a plugin that
/// no longer exists (through `api_of` its namespace, or `api` when cluster-scoped), recording
/// each in `swept`. Which plugins exist is read from `plugins` (their watch cache) once the
/// list has answered ([`Existing::now`], module docs).
async fn delete_orphans<K>(
    list: Api<Tolerant<K>>,
    api_of: impl Fn(&str) -> Api<K>,
    params: &ListParams,
    ctx: &Context,
    swept: &mut Swept,
) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    let plugins = &ctx.plugins;
    // each listed object decoded alone: one that cannot be read is named and left out
    let items = list
        .list(params)
        .await
        .map_err(|e| Error::kube(format!("list labelled {kind}s"), e))?
        .items;
    let items = crate::tolerant::readable(&kind, items, &ctx.telemetry);
    let existing = &Existing::now(plugins);
    for obj in items {
        if !labelled_orphan(obj.meta(), existing) {
            continue;
        }
        // a cluster-scoped object's API is the same for any namespace given
        let api = api_of(obj.meta().namespace.as_deref().unwrap_or_default());
        let deleted = match delete(&api, obj.meta()).await {
            Ok(deleted) => deleted,
            Err(e) => {
                swept.failed.push(e.to_string());
                continue;
            }
        };
        if deleted {
            swept.deleted.push(format!(
                "{kind} {}{}",
                obj.meta()
                    .namespace
                    .as_deref()
                    .map(|n| format!("{n}/"))
                    .unwrap_or_default(),
                obj.name_any()
            ));
        }
    }
    Ok(())
}

/// Deletes the object of `meta` with its uid and resourceVersion as preconditions (one
/// recreated or changed since it was listed is left for the next look). Returns whether it was
/// deleted. Runs in a span with the object's `kind` and `object` ([`crate::trace`]).
#[instrument(skip_all, fields(kind = %trace::kind::<K>(), object = %Key::of_meta(meta)))]
async fn delete<K>(api: &Api<K>, meta: &ObjectMeta) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    let name = meta.name.clone().unwrap_or_default();
    let dp = DeleteParams::default().preconditions(Preconditions {
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
    });
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(
            format!("delete {} {name}", K::kind(&Default::default())),
            e,
        )),
    }
}

/// Sends scopes to the sweeper task of [`spawn`].
#[derive(Clone, Debug)]
pub struct Trigger(mpsc::UnboundedSender<Scope>, Arc<Backlog>);

impl Trigger {
    /// Asks for a sweep of `scope` (dropped when the sweeper has stopped).
    pub fn sweep(&self, scope: Scope) {
        if self.0.send(scope).is_ok() {
            self.1.asked.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The count of the scopes asked for and not swept yet ([`Backlog::pending`]).
    pub fn backlog(&self) -> Arc<Backlog> {
        self.1.clone()
    }
}

/// Scopes asked for through a [`Trigger`] and scopes the sweeper has taken and swept (a scope
/// asked for twice before it was swept counts as swept twice).
#[derive(Debug, Default)]
pub struct Backlog {
    asked: AtomicU64,
    swept: AtomicU64,
}

impl Backlog {
    /// Scopes asked for that the sweeper has not swept yet (0 once it has caught up with every
    /// delete it was told of).
    pub fn pending(&self) -> u64 {
        // `swept` is read first: it never passes `asked`.
        let swept = self.swept.load(Ordering::SeqCst);
        self.asked.load(Ordering::SeqCst).saturating_sub(swept)
    }
}

/// A [`Trigger`] and the receiver to give [`spawn`].
pub fn channel() -> (Trigger, Scopes) {
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = Arc::new(Backlog::default());
    (Trigger(tx, backlog.clone()), Scopes(rx, backlog))
}

/// The receiving end of a [`Trigger`] ([`channel`]).
#[derive(Debug)]
pub struct Scopes(mpsc::UnboundedReceiver<Scope>, Arc<Backlog>);

/// Starts the sweeper task (module docs): it waits until `plugins_ready` is `true` (the
/// plugins' watch cache holds its first full list: sweeping before would take every plugin
/// for deleted) and the other caches are ready, sweeps [`Scope::All`], then each scope sent
/// through the [`Trigger`] of `scopes` and [`Scope::All`] every [`SWEEP_INTERVAL`]. Abort the
/// handle to stop it.
pub fn spawn(
    ctx: Arc<Context>,
    mut plugins_ready: watch::Receiver<bool>,
    scopes: Scopes,
) -> tokio::task::JoinHandle<()> {
    let Scopes(mut rx, backlog) = scopes;
    tokio::spawn(async move {
        if plugins_ready.wait_for(|r| *r).await.is_err() || ctx.caches_ready.wait().await.is_err() {
            return;
        }
        let mut pending: BTreeSet<Scope> = BTreeSet::from([Scope::All]);
        let mut next_all = tokio::time::Instant::now() + SWEEP_INTERVAL;
        // The delays between retries of sweeps that left failures, reset by a clean sweep.
        let mut retries: Option<backon::ExponentialBackoff> = None;
        // Scopes taken from the channel into `pending`, counted as swept after the next pass.
        let mut taken = 0u64;
        loop {
            let mut failed = BTreeSet::new();
            let (pass, namespaces) = pass_of(std::mem::take(&mut pending));
            if pass.contains(&Scope::All) {
                next_all = tokio::time::Instant::now() + SWEEP_INTERVAL;
            }
            for scope in pass {
                let swept = match scope {
                    Scope::All => sweep_all(&ctx, &namespaces).await,
                    Scope::Plugin { .. } => sweep(&ctx, &scope).await,
                };
                if swept.is_empty() {
                    debug!(?scope, "swept: nothing left behind");
                    continue;
                }
                info!(
                    ?scope,
                    deleted = ?swept.deleted,
                    roles = ?swept.restored_roles,
                    workloads = ?swept.workloads,
                    "swept what deleted plugins left behind"
                );
                if !swept.failed.is_empty() {
                    warn!(?scope, failed = ?swept.failed, "the sweep could not remove everything; the rest was swept, the scope is retried");
                    failed.insert(scope);
                }
            }
            backlog
                .swept
                .fetch_add(std::mem::take(&mut taken), Ordering::SeqCst);
            let wake = if failed.is_empty() {
                retries = None;
                next_all
            } else {
                let delay = retries
                    .get_or_insert_with(|| retry_builder().build())
                    .next()
                    .unwrap_or(SWEEP_INTERVAL);
                tokio::time::Instant::now() + delay
            };
            pending = failed;
            tokio::select! {
                got = rx.recv() => {
                    let Some(scope) = got else { return };
                    pending.insert(scope);
                    taken += 1;
                    tokio::time::sleep(COALESCE).await;
                    while let Ok(scope) = rx.try_recv() {
                        pending.insert(scope);
                        taken += 1;
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if tokio::time::Instant::now() >= next_all {
                        pending.insert(Scope::All);
                    }
                }
            }
        }
    })
}

/// The delays between retries of a sweep that left failures: [`crate::config::RETRY`]
/// doubling up to [`SWEEP_INTERVAL`], never exhausted. A failure that stays (an object the
/// operator may not delete, a workload whose apply the API server refuses) is thus retried a
/// few times, then every [`SWEEP_INTERVAL`], instead of every few seconds for ever.
fn retry_builder() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(crate::config::RETRY)
        .with_max_delay(SWEEP_INTERVAL)
        .with_factor(2.0)
        .without_max_times()
}

#[cfg(test)]
mod tests;
