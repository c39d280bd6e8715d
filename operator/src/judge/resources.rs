//! Judging what the vCluster's pods would ask for with each plugin, against the namespace's
//! LimitRanges and ResourceQuotas and the nodes' allocatable, before the install (pure).
//!
//! A plugin's container (its `spec.resources`, or the embedded runtime's defaults,
//! `crate::workload::RUNTIME_REQUESTS`) joins the vCluster's pod. The dry runs of
//! [`super::judge`] do not see what such a container would do to the pod: the API server
//! accepts the StatefulSet or Deployment (LimitRange and ResourceQuota admission judge Pods,
//! and a workload's dry run creates none), and the pod built from it is judged for its Pod
//! Security level only (a 403 of LimitRange or quota admission is no refusal there,
//! [`super::PodAnswer::Unjudged`]). So a plugin asking for 100Ti of memory was installed,
//! the new pod could not be created or scheduled, and every plugin of the vCluster, the
//! vCluster itself, went down with it while the plugin said `Ready`. Now each plugin is judged
//! here first, from the facts read by `crate::vcluster::observe` ([`ResourceFacts`]):
//!
//! | rule | as Kubernetes applies it |
//! | --- | --- |
//! | a container's missing requests and limits | a request left out is its limit (API defaulting); then the LimitRanges' `default` and `defaultRequest` of type `Container` fill what is still missing (the LimitRanger admission plugin) |
//! | LimitRange `Container`: `max`, `min`, `maxLimitRequestRatio` | per container and resource: a limit (and a request) at most `max`, a request (and a limit) at least `min`, limit ÷ request at most the ratio; a bound on a value the container does not set is a refusal too |
//! | LimitRange `Pod`: `max`, `min` | on the sums over the pod's containers |
//! | a request above a LimitRange's default limit | refused by the API server's validation once the default is filled in (a request above a limit the container sets itself is refused by the dry runs, `InvalidWorkload`) |
//! | ResourceQuota on `cpu`, `memory`, `requests.*`, `limits.*` | every container must set what the quota tracks; the pods' new usage (each pod's usage × `spec.replicas`), in place of the current pods', must fit `hard − used` |
//! | nodes' allocatable | some node must hold the pod's CPU and memory requests (a pod's request is the sum over its containers, or its largest init container if more) |
//!
//! Plugins are judged one at a time in installation order ([`install_order`]), as the dry runs
//! are: each step judges the pod with the plugins accepted so far plus the next one, and the
//! plugin is refused (`ResourcesExceeded`, naming the rule, the figures and the remedy) when
//! its step breaks a rule the step before it kept. A rule the vCluster's own containers already
//! break (a quota already full) refuses no plugin that adds nothing to it. With no node listed
//! (none registered, or the operator may not list them) the node rule is not judged. What the
//! pod's `nodeSelector`, affinity or taints exclude is not judged either: the largest node is
//! taken as the bound.
//!
//! Cost: nothing is read while the workload holds the body of its plugins (converged). Else
//! the facts are read and the verdict is remembered per workload ([`Remembered`]) for
//! [`REMEMBERED_FOR`], as long as the workload (uid, generation) and the body stay the same: a
//! vCluster with a refused plugin does not list LimitRanges, quotas and nodes on every
//! reconcile, and a changed LimitRange, quota or node is seen within that time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LimitRange, PodSpec, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use vcp_crds::{Reason, VClusterPlugin};

use crate::quantity::Amount;
use crate::workload::{Refusal, Workload, install_order, plan, planned_pod_spec};

/// What [`refusals`] judges against, read by `crate::vcluster::observe` when the workload is
/// not converged.
#[derive(Clone, Debug, Default)]
pub struct ResourceFacts {
    /// The LimitRanges of the workload's namespace.
    pub limit_ranges: Vec<LimitRange>,
    /// The ResourceQuotas of the workload's namespace.
    pub quotas: Vec<ResourceQuota>,
    /// Every node's name and `status.allocatable`; empty when none could be listed (the node
    /// rule is then not judged).
    pub nodes: Vec<(String, BTreeMap<String, Quantity>)>,
    /// The workload's `spec.replicas` (1 when unset).
    pub replicas: i64,
}

/// How long a verdict of [`refusals`] is reused for the same body of the same workload: the
/// period after which a plugin refused for the cluster's state is judged again
/// (`crate::vcluster::RECHECK`, 20 s; checked by its unit tests).
pub const REMEMBERED_FOR: Duration = Duration::from_secs(20);

/// The verdicts of [`refusals`], per workload (`kind/namespace/name`): a hash of what was
/// judged (the workload's uid and generation and the body), when, and the refusals.
#[derive(Debug, Default)]
pub struct Remembered(Mutex<HashMap<String, Verdict>>);

/// One remembered verdict: the hash of what was judged, when, and the refusals.
type Verdict = (u64, Instant, BTreeMap<String, Refusal>);

impl Remembered {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Verdict>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The refusals judged for `input` of the workload `key` less than [`REMEMBERED_FOR`]
    /// before `now`.
    pub fn get(&self, key: &str, input: u64, now: Instant) -> Option<BTreeMap<String, Refusal>> {
        let map = self.lock();
        let (hash, at, refused) = map.get(key)?;
        (*hash == input && now.duration_since(*at) < REMEMBERED_FOR).then(|| refused.clone())
    }

    /// Remembers `refused`, judged for `input` of the workload `key` at `now`.
    pub fn put(&self, key: &str, input: u64, now: Instant, refused: BTreeMap<String, Refusal>) {
        self.lock().insert(key.to_string(), (input, now, refused));
    }

    /// Keeps the verdicts of the workloads whose key `keep` accepts only.
    pub fn retain(&self, keep: impl Fn(&String) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    /// Verdicts held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Amounts per resource name.
type Amounts = BTreeMap<String, Amount>;

/// A container's requests and limits after defaulting (see the module docs).
#[derive(Clone, Debug, Default)]
struct Effective {
    name: String,
    requests: Amounts,
    limits: Amounts,
    /// The limits a LimitRange's `default` filled in.
    defaulted_limits: BTreeSet<String>,
    /// An init container that runs to completion before the others (not a restartable
    /// sidecar): counted by the largest, not summed.
    run_once: bool,
}

/// A broken rule: `key` identifies the rule (and the container, for per-container rules) so
/// that a step is compared with the one before it.
#[derive(Clone, Debug)]
struct Violation {
    key: String,
    message: String,
}

fn amounts(values: Option<&BTreeMap<String, Quantity>>) -> Amounts {
    values
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), Amount::parse(&v.0).ok()?)))
        .collect()
}

/// The `default` and `defaultRequest` of every LimitRange item of type `Container`.
fn container_defaults(facts: &ResourceFacts) -> (Amounts, Amounts) {
    let mut limits = Amounts::new();
    let mut requests = Amounts::new();
    for item in limit_items(facts, "Container") {
        limits.extend(amounts(item.1.default.as_ref()));
        requests.extend(amounts(item.1.default_request.as_ref()));
    }
    (requests, limits)
}

/// `(LimitRange name, item)` for every item of `type_`.
fn limit_items<'a>(
    facts: &'a ResourceFacts,
    type_: &'a str,
) -> impl Iterator<Item = (String, &'a k8s_openapi::api::core::v1::LimitRangeItem)> + 'a {
    facts.limit_ranges.iter().flat_map(move |lr| {
        let name = lr.name_any();
        lr.spec
            .iter()
            .flat_map(|s| s.limits.iter())
            .filter(move |item| item.type_ == type_)
            .map(move |item| (name.clone(), item))
    })
}

fn effective(c: &Container, run_once: bool, defaults: &(Amounts, Amounts)) -> Effective {
    let resources = c.resources.as_ref();
    let mut requests = amounts(resources.and_then(|r| r.requests.as_ref()));
    let mut limits = amounts(resources.and_then(|r| r.limits.as_ref()));
    // API defaulting: a request left out is the limit
    for (r, v) in &limits {
        requests.entry(r.clone()).or_insert(*v);
    }
    // the LimitRanger: defaults for what is still missing
    let mut defaulted_limits = BTreeSet::new();
    for (r, v) in &defaults.1 {
        if !limits.contains_key(r) {
            limits.insert(r.clone(), *v);
            defaulted_limits.insert(r.clone());
        }
    }
    for (r, v) in &defaults.0 {
        requests.entry(r.clone()).or_insert(*v);
    }
    Effective {
        name: c.name.clone(),
        requests,
        limits,
        defaulted_limits,
        run_once,
    }
}

fn containers(pod: &PodSpec, defaults: &(Amounts, Amounts)) -> Vec<Effective> {
    let init = pod.init_containers.iter().flatten().map(|c| {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        effective(c, !sidecar, defaults)
    });
    pod.containers
        .iter()
        .map(|c| effective(c, false, defaults))
        .chain(init)
        .collect()
}

/// The pod's total of `pick` (requests or limits) for `resource`: the sum over the containers
/// that run together, or the largest run-once init container if more; `None` when a container
/// does not set it.
fn pod_total(cs: &[Effective], resource: &str, pick: fn(&Effective) -> &Amounts) -> Option<Amount> {
    let mut sum = Amount(0);
    let mut largest_init = Amount(0);
    for c in cs {
        let v = *pick(c).get(resource)?;
        if c.run_once {
            largest_init = largest_init.max(v);
        } else {
            sum = sum + v;
        }
    }
    Some(sum.max(largest_init))
}

/// The pod's total for `resource`, counting a container that does not set it as 0 (as the
/// scheduler and quota count a missing request).
fn pod_total_or_zero(cs: &[Effective], resource: &str, pick: fn(&Effective) -> &Amounts) -> Amount {
    let mut sum = Amount(0);
    let mut largest_init = Amount(0);
    for c in cs {
        let v = pick(c).get(resource).copied().unwrap_or_default();
        if c.run_once {
            largest_init = largest_init.max(v);
        } else {
            sum = sum + v;
        }
    }
    sum.max(largest_init)
}

fn requests(c: &Effective) -> &Amounts {
    &c.requests
}

fn limits(c: &Effective) -> &Amounts {
    &c.limits
}

fn q(resource: &str, a: Amount) -> String {
    a.display(resource)
}

fn limit_range_rules(facts: &ResourceFacts, cs: &[Effective], out: &mut Vec<Violation>) {
    // a request above a limit the container set itself is the API server's refusal
    // (`InvalidWorkload`, the dry runs); one above a LimitRange's default limit is this one
    for c in cs {
        for (r, request) in &c.requests {
            if let Some(limit) = c.limits.get(r)
                && c.defaulted_limits.contains(r)
                && request > limit
            {
                out.push(Violation {
                    key: format!("request-above-limit/{r}/{}", c.name),
                    message: format!(
                        "container {} would request {} of {r}, above its limit {} (a LimitRange default limit of the namespace is lower than the request)",
                        c.name,
                        q(r, *request),
                        q(r, *limit)
                    ),
                });
            }
        }
    }
    for (lr, item) in limit_items(facts, "Container") {
        for c in cs {
            let at =
                |rule: &str, r: &str| format!("limitrange/{lr}/Container/{rule}/{r}/{}", c.name);
            for (r, max) in amounts(item.max.as_ref()) {
                let message = match (c.limits.get(&r), c.requests.get(&r)) {
                    (None, _) => Some(format!("sets no {r} limit")),
                    (Some(l), _) if *l > max => {
                        Some(format!("asks for a {r} limit of {}", q(&r, *l)))
                    }
                    (_, Some(v)) if *v > max => {
                        Some(format!("asks for a {r} request of {}", q(&r, *v)))
                    }
                    _ => None,
                };
                if let Some(m) = message {
                    out.push(Violation {
                        key: at("max", &r),
                        message: format!(
                            "LimitRange {lr} allows at most {} of {r} per container, and container {} {m}",
                            q(&r, max),
                            c.name
                        ),
                    });
                }
            }
            for (r, min) in amounts(item.min.as_ref()) {
                let message = match (c.requests.get(&r), c.limits.get(&r)) {
                    (None, _) => Some(format!("sets no {r} request")),
                    (Some(v), _) if *v < min => {
                        Some(format!("asks for a {r} request of {}", q(&r, *v)))
                    }
                    (_, Some(l)) if *l < min => {
                        Some(format!("asks for a {r} limit of {}", q(&r, *l)))
                    }
                    _ => None,
                };
                if let Some(m) = message {
                    out.push(Violation {
                        key: at("min", &r),
                        message: format!(
                            "LimitRange {lr} asks for at least {} of {r} per container, and container {} {m}",
                            q(&r, min),
                            c.name
                        ),
                    });
                }
            }
            for (r, ratio) in amounts(item.max_limit_request_ratio.as_ref()) {
                let (Some(l), Some(v)) = (c.limits.get(&r), c.requests.get(&r)) else {
                    out.push(Violation {
                        key: at("ratio", &r),
                        message: format!(
                            "LimitRange {lr} bounds the {r} limit-to-request ratio, and container {} does not set both",
                            c.name
                        ),
                    });
                    continue;
                };
                // l / v > ratio, in units of 10⁻⁹ on both sides: l * 10⁹ > ratio * v
                if v.0 > 0 && l.0.saturating_mul(1_000_000_000) > ratio.0.saturating_mul(v.0) {
                    out.push(Violation {
                        key: at("ratio", &r),
                        message: format!(
                            "LimitRange {lr} allows a {r} limit at most {} times the request, and container {} asks for {} and {}",
                            q("", ratio),
                            c.name,
                            q(&r, *l),
                            q(&r, *v)
                        ),
                    });
                }
            }
        }
    }
    for (lr, item) in limit_items(facts, "Pod") {
        for (r, max) in amounts(item.max.as_ref()) {
            let over = match pod_total(cs, &r, limits) {
                None => Some(format!("a container sets no {r} limit")),
                Some(t) if t > max => {
                    Some(format!("its containers' {r} limits add up to {}", q(&r, t)))
                }
                Some(_) => match pod_total(cs, &r, requests) {
                    Some(t) if t > max => Some(format!(
                        "its containers' {r} requests add up to {}",
                        q(&r, t)
                    )),
                    _ => None,
                },
            };
            if let Some(m) = over {
                out.push(Violation {
                    key: format!("limitrange/{lr}/Pod/max/{r}"),
                    message: format!(
                        "LimitRange {lr} allows at most {} of {r} per pod, and {m}",
                        q(&r, max)
                    ),
                });
            }
        }
        for (r, min) in amounts(item.min.as_ref()) {
            if pod_total(cs, &r, requests).is_none_or(|t| t < min) {
                out.push(Violation {
                    key: format!("limitrange/{lr}/Pod/min/{r}"),
                    message: format!(
                        "LimitRange {lr} asks for at least {} of {r} per pod, more than its containers request",
                        q(&r, min)
                    ),
                });
            }
        }
    }
}

/// The resources a ResourceQuota may track that a pod's containers use: `(quota key, the
/// resource, requests or limits)`.
const QUOTA_KEYS: [(&str, &str, bool); 6] = [
    ("cpu", "cpu", true),
    ("memory", "memory", true),
    ("requests.cpu", "cpu", true),
    ("requests.memory", "memory", true),
    ("limits.cpu", "cpu", false),
    ("limits.memory", "memory", false),
];

fn quota_rules(
    facts: &ResourceFacts,
    cs: &[Effective],
    live: &[Effective],
    out: &mut Vec<Violation>,
) {
    let replicas = Amount(i128::from(facts.replicas.max(0)));
    for quota in &facts.quotas {
        let name = quota.name_any();
        let status = quota.status.as_ref();
        let hard = amounts(
            status
                .and_then(|s| s.hard.as_ref())
                .or_else(|| quota.spec.as_ref().and_then(|s| s.hard.as_ref())),
        );
        let used = amounts(status.and_then(|s| s.used.as_ref()));
        for (key, resource, is_request) in QUOTA_KEYS {
            let Some(hard) = hard.get(key) else {
                continue;
            };
            let pick: fn(&Effective) -> &Amounts = if is_request { requests } else { limits };
            for c in cs.iter().filter(|c| !pick(c).contains_key(resource)) {
                out.push(Violation {
                    key: format!("quota/{name}/{key}/unset/{}", c.name),
                    message: format!(
                        "ResourceQuota {name} tracks {key}, so every container must set it, and container {} does not (set it in spec.resources, or give the namespace a LimitRange default)",
                        c.name
                    ),
                });
            }
            let new = pod_total_or_zero(cs, resource, pick);
            let old = pod_total_or_zero(live, resource, pick);
            let used = used.get(key).copied().unwrap_or_default();
            // the workload's pods replaced: their usage goes, the new pods' comes
            let after = used - Amount(old.0.saturating_mul(replicas.0))
                + Amount(new.0.saturating_mul(replicas.0));
            if new > old && after > *hard {
                out.push(Violation {
                    key: format!("quota/{name}/{key}"),
                    message: format!(
                        "ResourceQuota {name} allows {} of {key} in the namespace, {} are used, and the vCluster's {} pod(s) would ask for {} each instead of {}",
                        q(resource, *hard),
                        q(resource, used),
                        facts.replicas,
                        q(resource, new),
                        q(resource, old)
                    ),
                });
            }
        }
    }
}

fn node_rule(facts: &ResourceFacts, cs: &[Effective], out: &mut Vec<Violation>) {
    if facts.nodes.is_empty() {
        return;
    }
    let wanted: Vec<(&str, Amount)> = ["cpu", "memory"]
        .into_iter()
        .map(|r| (r, pod_total_or_zero(cs, r, requests)))
        .collect();
    let fits = |allocatable: &BTreeMap<String, Quantity>| {
        let a = amounts(Some(allocatable));
        wanted
            .iter()
            .all(|(r, w)| a.get(*r).is_some_and(|have| have >= w))
    };
    if facts.nodes.iter().any(|(_, a)| fits(a)) {
        return;
    }
    let asked: Vec<String> = wanted
        .iter()
        .map(|(r, w)| format!("{r} {}", q(r, *w)))
        .collect();
    let largest = facts
        .nodes
        .iter()
        .max_by_key(|(_, a)| amounts(Some(a)).get("memory").copied().unwrap_or_default())
        .map(|(name, a)| {
            let a = amounts(Some(a));
            let show = |r: &str| a.get(r).map_or("none".into(), |v| q(r, *v));
            format!(
                "node {name} with cpu {}, memory {}",
                show("cpu"),
                show("memory")
            )
        })
        .unwrap_or_default();
    out.push(Violation {
        key: "nodes".into(),
        message: format!(
            "no node can hold the vCluster's pod, which would request {}; the node with the most memory allocatable is {largest}",
            asked.join(", ")
        ),
    });
}

fn violations(pod: &PodSpec, live: &[Effective], facts: &ResourceFacts) -> Vec<Violation> {
    let defaults = container_defaults(facts);
    let cs = containers(pod, &defaults);
    let mut out = Vec::new();
    limit_range_rules(facts, &cs, &mut out);
    quota_rules(facts, &cs, live, &mut out);
    node_rule(facts, &cs, &mut out);
    out
}

/// The plugins of `plugins` (those of `workload` let in so far) refused for what the
/// vCluster's pods would ask for with them, by name (see the module docs).
pub fn refusals(
    workload: &Workload,
    plugins: &[&VClusterPlugin],
    facts: &ResourceFacts,
    runtime_image: &str,
) -> BTreeMap<String, Refusal> {
    let defaults = container_defaults(facts);
    let live = containers(&workload.pod_spec, &defaults);
    let mut refused = BTreeMap::new();
    let mut accepted: Vec<&VClusterPlugin> = Vec::new();
    let before = plan(workload, &accepted, runtime_image);
    let mut kept: BTreeSet<String> = violations(&planned_pod_spec(workload, &before), &live, facts)
        .into_iter()
        .map(|v| v.key)
        .collect();
    for plugin in install_order(plugins) {
        let name = plugin.name_any();
        let mut trial = accepted.clone();
        trial.push(plugin);
        let step = plan(workload, &trial, runtime_image);
        if !step.installed.contains(&name) {
            // refused by `plan` itself (a conflict): reported from the final plan
            continue;
        }
        let found = violations(&planned_pod_spec(workload, &step), &live, facts);
        match found.iter().find(|v| !kept.contains(&v.key)) {
            Some(v) => {
                refused.insert(
                    name,
                    Refusal {
                        reason: Reason::ResourcesExceeded,
                        message: format!(
                            "with this plugin's container the vCluster's pods could not be created or scheduled: {}; nothing is installed for it (lower spec.resources, or have the namespace's limits raised)",
                            v.message
                        ),
                    },
                );
            }
            None => {
                accepted.push(plugin);
                kept = found.into_iter().map(|v| v.key).collect();
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests;
