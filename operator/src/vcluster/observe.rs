//! *Observe*: the reads of converging one vCluster ([`super`]): the plugins installed into its
//! workload ([`candidates`], from the plugins' watch cache), the cluster facts their refusals
//! depend on ([`cluster_facts`]: the workload's identity, discovery, the namespace's Roles and
//! RoleBindings), and the verdicts of the hooks' judging, of what the pods would ask for
//! ([`resource_facts`], [`crate::judge::resources`]) and of the server-side dry runs
//! ([`judge_parts`], [`crate::judge`]; dry runs store nothing). The workload itself is read by
//! [`crate::cache::workload`] (install) or [`crate::cache::fetch_workload`] (delete, sweep).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{LimitRange, Node, ResourceQuota};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use vcp_crds::VClusterPlugin;

use super::decide::{ClusterFacts, Observed, admitted, find_vcluster_role};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::judge::resources::{self, ResourceFacts};
use crate::rbac::{self, Plurals};
use crate::workload::{self, Refusal, Workload, WorkloadKind};
use crate::writes::ApiDryRun;

/// Observes the vCluster whose workload is `wl`: the plugins installed into it
/// ([`candidates`], with the copies in `fresher` in place of their cached ones, except
/// `without`), the cluster facts ([`cluster_facts`]), and the verdicts of the hooks' judging
/// and the dry runs for the plugins [`admitted`] lets in ([`judge_parts`]).
///
/// A plugin that [`admitted`] lets in while only its slimmed copy is cached
/// ([`crate::slim`]: it was refused, and its free-form parts were dropped) is read in full
/// from the API server ([`in_full`]), and the facts and sizes are judged again with that copy.
/// So the dry runs, the conflicts and the workload's body see the full spec only. The copies
/// refused before the dry runs (policy, cluster facts, size budgets) stay slim: those steps
/// read nothing that was dropped.
///
/// # Errors
/// Discovery, the lists of Roles and RoleBindings, the reads of slimmed plugins, the dry runs.
pub async fn vcluster(
    ctx: &Context,
    wl: Workload,
    fresher: &[Arc<VClusterPlugin>],
    without: Option<&str>,
) -> Result<Observed> {
    let mut plugins = candidates(ctx, &wl.namespace, &wl.name, fresher, without);
    loop {
        let refs: Vec<&VClusterPlugin> = plugins.iter().map(|p| &**p).collect();
        let facts = cluster_facts(ctx, &wl, &refs).await?;
        let (sized, _) = admitted(&wl, &facts, &ctx.policy, &refs, &ctx.runtime_image);
        let slimmed: Vec<String> = sized
            .iter()
            .filter(|p| crate::slim::is_slimmed(p))
            .map(|p| p.name_any())
            .collect();
        if slimmed.is_empty() {
            let judged = judge_parts(ctx, &wl, sized).await?;
            return Ok(Observed {
                workload: wl,
                plugins,
                facts,
                judged,
            });
        }
        // Each round reads the slimmed ones let in, which come back full: the loop ends.
        plugins = in_full(ctx, plugins, &slimmed).await?;
    }
}

/// `plugins` with each plugin named in `slimmed` read again from the API server, in full
/// (without `managedFields`, as the cache holds them); one deleted meanwhile, or no longer
/// installed into the workload ([`workload::contributes`]), is left out.
///
/// # Errors
/// The API server's answers to the reads.
pub async fn in_full(
    ctx: &Context,
    plugins: Vec<Arc<VClusterPlugin>>,
    slimmed: &[String],
) -> Result<Vec<Arc<VClusterPlugin>>> {
    let mut out = Vec::with_capacity(plugins.len());
    for p in plugins {
        let name = p.name_any();
        if !slimmed.contains(&name) {
            out.push(p);
            continue;
        }
        let namespace = p.namespace().unwrap_or_default();
        let api: Api<VClusterPlugin> = Api::namespaced(ctx.client.clone(), &namespace);
        let fresh = api
            .get_opt(&name)
            .await
            .map_err(|e| Error::kube(format!("get VClusterPlugin {namespace}/{name}"), e))?;
        if let Some(mut full) = fresh {
            full.metadata.managed_fields = None;
            if workload::contributes(&full, &namespace, &p.spec.vcluster.name) {
                out.push(Arc::new(full));
            }
        }
    }
    Ok(out)
}

/// The plugins installed into `vcluster` of `namespace` according to the watch cache
/// ([`workload::contributes`]), except `without`, with the copies in `fresher` (newer than the
/// cache, such as the answers to the finalizer patches) in place of their cached ones. Which of
/// them are refused is decided by [`super::decide`]. The copies are the cache's (and
/// `fresher`'s), shared: a reconcile holds no copy of its vCluster's plugins of its own.
pub fn candidates(
    ctx: &Context,
    namespace: &str,
    vcluster: &str,
    fresher: &[Arc<VClusterPlugin>],
    without: Option<&str>,
) -> Vec<Arc<VClusterPlugin>> {
    let is_fresher = |p: &VClusterPlugin| {
        fresher
            .iter()
            .any(|f| f.name_any() == p.name_any() && f.namespace() == p.namespace())
    };
    let cached = ctx.plugins.state();
    cached
        .iter()
        .filter(|p| workload::contributes(p, namespace, vcluster))
        .filter(|p| !is_fresher(p))
        .cloned()
        .chain(
            fresher
                .iter()
                .filter(|p| workload::contributes(p, namespace, vcluster))
                .cloned(),
        )
        .filter(|p| without.is_none_or(|w| p.name_any() != w))
        .collect()
}

/// Reads the facts ([`ClusterFacts`]) `plugins` (all of the vCluster whose workload is `wl`) depend on: the
/// workload's identity, plurals from [`Context::discovery`], and, when some plugin uses
/// `rbac.mode: PatchVClusterRoles`, the namespace's Roles and RoleBindings from the API
/// server (one list of each). Not a vCluster: nothing is read.
///
/// # Errors
/// Discovery failures other than "not served"; the API server's answers to the lists.
pub async fn cluster_facts(
    ctx: &Context,
    wl: &Workload,
    plugins: &[&VClusterPlugin],
) -> Result<ClusterFacts> {
    let service_account = workload::vcluster_identity(wl);
    let Ok(sa) = &service_account else {
        return Ok(ClusterFacts {
            service_account,
            plurals: Plurals::new(),
            vcluster_role: None,
            roles: None,
        });
    };
    let plurals = ctx.discovery.plurals_of(&ctx.client, plugins).await?;
    let (vcluster_role, roles) = if plugins.iter().any(|p| rbac::patches_vcluster_roles(p)) {
        let roles = list_roles(ctx, &wl.namespace).await?;
        let bindings = list_role_bindings(ctx, &wl.namespace).await?;
        let found = find_vcluster_role(&bindings, &roles, &wl.namespace, &wl.name, sa);
        (Some(found), Some(roles))
    } else {
        (None, None)
    };
    Ok(ClusterFacts {
        service_account,
        plurals,
        vcluster_role,
        roles,
    })
}

/// The refusals, by name, of the plugins of `accepted` (those of `wl` that policy, cluster
/// state and size budgets let in, [`admitted`]) whose hooks, resources or part of `wl` are
/// refused: the hooks first ([`crate::judge::hooks`]), then, when the workload does not hold
/// the remaining plugins' body yet, what its pods would ask for against the namespace's
/// LimitRanges and ResourceQuotas and the nodes ([`resources::refusals`] on
/// [`resource_facts`], read for that judgement only), then the server-side dry runs of what is
/// left ([`crate::judge`], made only when the body or the workload changed; verdicts are kept
/// in [`Context::verdicts`]).
///
/// # Errors
/// The reads of the facts and the dry runs' errors other than a refusal.
pub async fn judge_parts(
    ctx: &Context,
    wl: &Workload,
    accepted: Vec<&VClusterPlugin>,
) -> Result<BTreeMap<String, Refusal>> {
    let dry = ApiDryRun(&ctx.client);
    // What the plugins' hooks do to the vCluster's pods first: a refused plugin's
    // part is then not judged, nor installed.
    let hooked = ctx
        .verdicts
        .hook_refusals(&dry, wl, &accepted, &ctx.policy.containers)
        .await?;
    let accepted: Vec<&VClusterPlugin> = accepted
        .into_iter()
        .filter(|p| !hooked.contains_key(&p.name_any()))
        .collect();
    let all = workload::plan(wl, &accepted, &ctx.runtime_image);
    let sized = if all.installed.is_empty() || workload::is_converged(wl, &all.patch) {
        BTreeMap::new()
    } else {
        let key = crate::judge::key(wl);
        let input = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&wl.uid, wl.generation, crate::judge::body_hash(&all.patch)).hash(&mut h);
            h.finish()
        };
        let now = std::time::Instant::now();
        match ctx.verdicts.resources.get(&key, input, now) {
            Some(refused) => refused,
            None => {
                let facts = resource_facts(ctx, wl).await?;
                let refused = resources::refusals(wl, &accepted, &facts, &ctx.runtime_image);
                ctx.verdicts
                    .resources
                    .put(&key, input, now, refused.clone());
                refused
            }
        }
    };
    let accepted: Vec<&VClusterPlugin> = accepted
        .into_iter()
        .filter(|p| !sized.contains_key(&p.name_any()))
        .collect();
    let mut refused = ctx
        .verdicts
        .refusals(&dry, wl, &accepted, &ctx.runtime_image)
        .await?;
    refused.extend(hooked);
    refused.extend(sized);
    Ok(refused)
}

/// The facts [`resources::refusals`] judges against: the LimitRanges and ResourceQuotas of
/// `wl`'s namespace, every node's allocatable (listed in pages of 100, only the allocatable
/// kept), and, when a quota tracks CPU or memory, the workload's `spec.replicas` (read from
/// the API server). A list the operator may not read (403: a deployment whose ClusterRole
/// predates these rules, `config/rbac/role.yaml`) leaves that part unjudged, with a warning.
///
/// # Errors
/// The API server's answers other than 403.
pub async fn resource_facts(ctx: &Context, wl: &Workload) -> Result<ResourceFacts> {
    let limit_ranges = forbidden_is_empty(
        "LimitRange",
        list_in::<LimitRange>(ctx, &wl.namespace).await,
    )?;
    let quotas = forbidden_is_empty(
        "ResourceQuota",
        list_in::<ResourceQuota>(ctx, &wl.namespace).await,
    )?;
    let nodes = forbidden_is_empty("Node", list_nodes(ctx).await)?;
    let tracked = quotas.iter().any(|q| {
        let hard = q
            .status
            .as_ref()
            .and_then(|s| s.hard.as_ref())
            .or_else(|| q.spec.as_ref().and_then(|s| s.hard.as_ref()));
        hard.is_some_and(|h| {
            [
                "cpu",
                "memory",
                "requests.cpu",
                "requests.memory",
                "limits.cpu",
                "limits.memory",
            ]
            .iter()
            .any(|k| h.contains_key(*k))
        })
    });
    let replicas = if tracked { replicas(ctx, wl).await? } else { 1 };
    Ok(ResourceFacts {
        limit_ranges,
        quotas,
        nodes,
        replicas,
    })
}

/// `listed`, or nothing when the operator may not list `kind` (403), with a warning.
fn forbidden_is_empty<T>(kind: &str, listed: Result<Vec<T>>) -> Result<Vec<T>> {
    match listed {
        Err(Error::Kube {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 403 => {
            tracing::warn!(kind, error = %e.message, "cannot list; plugins' resources are not judged against them");
            Ok(Vec::new())
        }
        other => other,
    }
}

/// Every node's name and allocatable, listed in pages of 100.
async fn list_nodes(
    ctx: &Context,
) -> Result<
    Vec<(
        String,
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    )>,
> {
    let api = Api::<Node>::all(ctx.client.clone());
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(100);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| Error::kube("list Nodes", e))?;
        out.extend(page.items.into_iter().map(|n| {
            let name = n.name_any();
            (
                name,
                n.status.and_then(|s| s.allocatable).unwrap_or_default(),
            )
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(out),
        }
    }
}

/// `spec.replicas` of `wl` (1 when unset, as the API server defaults it).
async fn replicas(ctx: &Context, wl: &Workload) -> Result<i64> {
    let what = format!("get {} {}/{}", wl.kind_str(), wl.namespace, wl.name);
    let replicas = match wl.kind.unwrap_or(WorkloadKind::StatefulSet) {
        WorkloadKind::StatefulSet => {
            Api::<StatefulSet>::namespaced(ctx.client.clone(), &wl.namespace)
                .get_opt(&wl.name)
                .await
                .map_err(|e| Error::kube(&what, e))?
                .and_then(|s| s.spec?.replicas)
        }
        WorkloadKind::Deployment => {
            Api::<Deployment>::namespaced(ctx.client.clone(), &wl.namespace)
                .get_opt(&wl.name)
                .await
                .map_err(|e| Error::kube(&what, e))?
                .and_then(|d| d.spec?.replicas)
        }
    };
    Ok(i64::from(replicas.unwrap_or(1)))
}

/// The Roles of the plugin's namespace that [`super::act::sync_vcluster_roles`] must look at:
/// all of them (`listed`: those [`cluster_facts`] listed, else listed now) when the plugin uses
/// `rbac.mode: PatchVClusterRoles` or its spec changed since the status was last written
/// (`status.observedGeneration`: it may have left that mode, and its added rules must come
/// out); else the cached ones (labelled as made for a plugin, [`crate::cache`]), for a plugin
/// that has been in `rbac.mode: Dedicated` since its status was written has no rules in any
/// other Role.
///
/// # Errors
/// The API server's answer to the list.
pub async fn roles_to_sync(
    ctx: &Context,
    plugin: &VClusterPlugin,
    listed: Option<&[Role]>,
) -> Result<Vec<Role>> {
    let namespace = plugin.namespace().unwrap_or_default();
    if let Some(roles) = listed {
        return Ok(roles.to_vec());
    }
    let observed = plugin.status.as_ref().and_then(|s| s.observed_generation);
    if rbac::patches_vcluster_roles(plugin) || observed != plugin.metadata.generation {
        return list_roles(ctx, &namespace).await;
    }
    Ok(ctx.caches.roles_in(&namespace))
}

/// Every Role of `namespace` that can be read, from the API server (the finalizer path, and
/// `rbac.mode: PatchVClusterRoles`: [`cluster_facts`], [`roles_to_sync`]); one that cannot is
/// left out, named and counted ([`crate::tolerant::readable`]).
///
/// # Errors
/// The API server's answer to the list.
pub async fn list_roles(ctx: &Context, namespace: &str) -> Result<Vec<Role>> {
    list_in(ctx, namespace).await
}

/// Every RoleBinding of `namespace` that can be read, from the API server ([`cluster_facts`]),
/// as [`list_roles`].
///
/// # Errors
/// The API server's answer to the list.
pub async fn list_role_bindings(ctx: &Context, namespace: &str) -> Result<Vec<RoleBinding>> {
    list_in(ctx, namespace).await
}

/// Every object of kind `K` in `namespace` that can be read, from the API server, each decoded
/// alone ([`crate::tolerant::readable`]).
async fn list_in<K>(ctx: &Context, namespace: &str) -> Result<Vec<K>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&());
    let items = Api::<vcp_crds::tolerant::Tolerant<K>>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("list {kind}s in {namespace}"), e))?
        .items;
    Ok(crate::tolerant::readable(&kind, items, &ctx.telemetry))
}

/// The most pods of one vCluster [`pods`] reads.
pub const MAX_PODS: i32 = 8;

/// The pods of the vCluster's workload `wl`, for [`crate::rollout`]: for a StatefulSet its pods
/// by name (`<name>-<ordinal>` for each of `spec.replicas`, default 1, at most [`MAX_PODS`]),
/// kept when the StatefulSet (by uid) controls them; for a Deployment the pods with its
/// template's labels whose controller is one of its ReplicaSets (`<name>-<hash>`), from a list
/// of at most [`MAX_PODS`] that have not ended. Read by name or with a limit, and each pod
/// trimmed at once ([`crate::rollout::trimmed`]): no one's other pods pass through the
/// operator's memory, and of the vCluster's own only what the verdict reads is kept.
///
/// # Errors
/// The API server's answers to the reads (a pod not found is skipped).
pub async fn pods(ctx: &Context, wl: &Workload) -> Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    use k8s_openapi::api::core::v1::Pod;
    let api = Api::<Pod>::namespaced(ctx.client.clone(), &wl.namespace);
    let controlled_by = |pod: &Pod, kind: &str, owned: &dyn Fn(&str, &str) -> bool| {
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == kind && owned(&o.name, &o.uid))
    };
    match wl.kind.unwrap_or(WorkloadKind::StatefulSet) {
        WorkloadKind::StatefulSet => {
            let mut pods = Vec::new();
            for ordinal in 0..wl.replicas.unwrap_or(1).clamp(0, MAX_PODS) {
                let name = format!("{}-{ordinal}", wl.name);
                let pod = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| Error::kube(format!("get Pod {}/{name}", wl.namespace), e))?;
                let ours = |owner: &str, uid: &str| {
                    owner == wl.name && wl.uid.as_deref().is_none_or(|u| u == uid)
                };
                let pod = pod.filter(|p| controlled_by(p, "StatefulSet", &ours));
                pods.extend(pod.map(crate::rollout::trimmed));
            }
            Ok(pods)
        }
        WorkloadKind::Deployment => {
            let selector = wl
                .template_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let listed = api
                .list(
                    &ListParams::default()
                        .labels(&selector)
                        .limit(MAX_PODS as u32),
                )
                .await
                .map_err(|e| {
                    Error::kube(format!("list Pods of {}/{}", wl.namespace, wl.name), e)
                })?;
            let prefix = format!("{}-", wl.name);
            let ours = |owner: &str, _: &str| owner.starts_with(&prefix);
            Ok(listed
                .items
                .into_iter()
                .filter(|p| controlled_by(p, "ReplicaSet", &ours))
                .map(crate::rollout::trimmed)
                .collect())
        }
    }
}
