//! Judging each plugin's part of a vCluster's workload with the API server, before the real
//! apply, so that one bad plugin never blocks the others.
//!
//! The rule: the operator judges each plugin apart so one bad plugin never blocks another or a
//! deletion, and respects the namespace's Pod Security level.
//! All plugins of a vCluster share one server-side apply of its workload ([`crate::workload`]),
//! so a container field only the API server can judge (a mount of a volume the pod does not
//! have, requests above limits, `value` beside `valueFrom`) would otherwise make it refuse the
//! whole apply: no plugin of that vCluster would install, and no deletion could take its
//! plugin's entries out. Instead, before the real apply:
//!
//! 1. the apply body of every plugin ([`plan`]) is sent as a **server-side dry run**
//!    (`dryRun=All`: admission and validation run, nothing is stored); when the API server
//!    accepts it,
//! 2. a **Pod** built from the answer's pod template, as the workload's controller would build
//!    it ([`pod_of_statefulset`], [`pod_of_deployment`]), is created as a dry run too: the
//!    API server's Pod Security admission enforces the namespace's level
//!    (`pod-security.kubernetes.io/enforce`, or the API server's configured default) on Pods
//!    only (on a StatefulSet or Deployment it merely warns, at the `warn` level), so this is its
//!    own evaluation of exactly what the vCluster's pods would be;
//! 3. when both pass, nothing is refused. Otherwise the plugins are judged one at a time, in
//!    installation order ([`install_order`]): each step dry-runs the body of the plugins
//!    accepted so far plus the next one. A plugin whose step the API server refuses gets
//!    `Ready=False, reason=InvalidWorkload` ([`InvalidWorkload`](vcp_crds::Reason::InvalidWorkload)) with the API server's
//!    message; one whose step's Pod violates the Pod Security level, where the violation names
//!    the plugin's container (its name), gets `reason=PolicyDenied` naming the level and the
//!    API server's reason. Violations that name no plugin's container (the vCluster's own
//!    containers) refuse no plugin. The others are installed.
//!
//! The caller then plans and applies the workload without the refused plugins, and does the
//! same on deletion (the cleanup's apply leaves out a plugin that would fail), so a bad plugin
//! holds up neither another plugin's installation nor its deletion.
//!
//! Cost: nothing when the workload already holds the body of every plugin (converged), and the
//! verdict of a body is remembered per workload ([`Verdicts`]), keyed by the workload's uid and
//! `metadata.generation` and a hash of the body; so a reconcile of an unchanged vCluster with a
//! refused plugin makes no request either. A dry run happens only when the desired body or the
//! workload's spec changed. A change of the namespace's labels alone is not noticed until then
//! (plugins already installed stay installed).
//!
//! **Hooks** ([`hooks`], [`Verdicts::hook_refusals`], judged before the parts): the plugins'
//! `Pod` hooks are applied, in vCluster's order, to a representative pod of the vCluster, which
//! is judged after every hook by the pod policy (`crate::policy::pod`) and, once all are
//! applied, by the namespace's Pod Security level through a server-side dry run of the hooked
//! pod ([`DryRun::pod`]); hooks on any kind are judged for touching an object's identity. A
//! refused plugin gets `Ready=False, reason=PolicyDenied` naming the hook and the field, and is
//! left out of the workload like any refused plugin.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use vcp_crds::Reason;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::Value;
use vcp_crds::VClusterPlugin;

use crate::error::Result;
use crate::policy::ContainerPolicy;
use crate::workload::{Refusal, Workload, WorkloadPlan, install_order, is_converged, plan};

pub mod hooks;
pub mod resources;

/// The namespace label whose level Pod Security admission enforces on Pods.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// The API server's answer to a server-side dry run of a workload apply body.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadAnswer {
    /// Accepted: the Pod the workload's controller would create from the answer.
    Accepted(Box<Pod>),
    /// Refused (400 Bad Request or 422 Invalid): the API server's message.
    Refused(String),
}

/// The dry runs of [`judge`]; the operator's implementation sends them to the API server
/// (`crate::writes`), unit tests use a fake.
pub trait DryRun {
    /// Server-side apply of `body` to `workload` as a dry run.
    ///
    /// # Errors
    /// Failures other than a refusal of the body (unreachable server, 403, 404, ...).
    fn workload(
        &self,
        workload: &Workload,
        body: &Value,
    ) -> impl Future<Output = Result<WorkloadAnswer>> + Send;

    /// Creates `pod` as a dry run ([`PodAnswer`]).
    ///
    /// # Errors
    /// Failures to reach the API server.
    fn pod(&self, pod: &Pod) -> impl Future<Output = Result<PodAnswer>> + Send;
}

/// The API server's answer to a server-side dry run of a Pod create ([`DryRun::pod`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodAnswer {
    /// Admitted.
    Admitted,
    /// Neither admitted nor refused for what the pod is: the API server answered with another
    /// error (a pod quota's or a missing `create pods` permission's 403, a 500, a webhook's
    /// timeout), so the namespace's Pod Security level could not judge the pod now. The API
    /// server's code and message.
    ///
    /// The judgement lets the pod pass as if [`PodAnswer::Admitted`] (fail-open): the real pods
    /// are still judged by Pod Security admission when they are created, and a namespace's pod
    /// quota must not block a plugin's installation. But nothing was judged, so
    /// [`Verdicts::hook_refusals`] remembers no verdict that involved such an answer: the next
    /// reconcile asks the API server again (the security review's F6: a transient failure was
    /// remembered as admitted, and the namespace's level never judged those hooks until they
    /// changed).
    Unjudged(String),
    /// Refused by Pod Security admission.
    Violates(PodSecurityViolation),
    /// Refused as invalid (400 Bad Request or 422 Invalid), with the API server's message. The
    /// API server validates a create before its validating admission runs
    /// (k8s.io/apiserver `registry/generic/registry/store.go`, `Create`: `rest.BeforeCreate`,
    /// then `createValidation`), so Pod Security admission never judged this pod.
    Invalid(String),
}

impl PodAnswer {
    /// Whether the judgement lets the pod pass: [`PodAnswer::Admitted`], or
    /// [`PodAnswer::Unjudged`] (fail-open, see there).
    pub fn passes(&self) -> bool {
        matches!(self, PodAnswer::Admitted | PodAnswer::Unjudged(_))
    }
}

/// A refusal by Pod Security admission: `violates PodSecurity "<level>": <detail>`
/// (k8s.io/pod-security-admission, `admission.go`, `EvaluatePod`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSecurityViolation {
    /// The enforced level and version, such as `restricted:latest`.
    pub level: String,
    /// The checks that failed, each naming its containers in quotes, such as
    /// `allowPrivilegeEscalation != false (container "x" must set securityContext.allowPrivilegeEscalation=false)`.
    pub detail: String,
}

/// The Pod Security violation in an API server message, if it is one.
pub fn pod_security_violation(message: &str) -> Option<PodSecurityViolation> {
    let rest = message.split_once("violates PodSecurity \"")?.1;
    let (level, detail) = rest.split_once("\": ")?;
    Some(PodSecurityViolation {
        level: level.to_string(),
        detail: detail.to_string(),
    })
}

/// The containers a violation's detail names: Pod Security admission writes them as
/// `container "x"` or `containers "x", "y"` (init containers alike; `pod or container "x"`
/// when the pod could set the field instead). Other quoted words (volume names, capabilities)
/// are not containers.
pub fn named_containers(violation: &PodSecurityViolation) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, word) in violation.detail.match_indices("container") {
        let rest = &violation.detail[i + word.len()..];
        let rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(mut rest) = rest.strip_prefix(" \"") else {
            continue;
        };
        while let Some(end) = rest.find('"') {
            out.insert(rest[..end].to_string());
            match rest[end + 1..].strip_prefix(", \"") {
                Some(next) => rest = next,
                None => break,
            }
        }
    }
    out
}

/// Whether a violation names the container `container` ([`named_containers`]).
pub fn blames(violation: &PodSecurityViolation, container: &str) -> bool {
    named_containers(violation).contains(container)
}

/// The Pod a StatefulSet's controller creates (the first ordinal): the pod template, plus one
/// `persistentVolumeClaim` volume per `volumeClaimTemplates` entry named after it, replacing a
/// template volume of the same name, with claim `<template>-<statefulset>-0`
/// (k8s.io/kubernetes `pkg/controller/statefulset/stateful_set_utils.go`, `updateStorage`
/// and `getPersistentVolumeClaimName`).
pub fn pod_of_statefulset(sts: &StatefulSet) -> Pod {
    let name = sts.name_any();
    let spec = sts.spec.clone().unwrap_or_default();
    let mut pod = pod_from_template(&name, sts.namespace(), spec.template);
    let claims = spec.volume_claim_templates.unwrap_or_default();
    if !claims.is_empty()
        && let Some(pod_spec) = pod.spec.as_mut()
    {
        let names: Vec<String> = claims.iter().map(|c| c.name_any()).collect();
        let mut volumes: Vec<Volume> = names
            .iter()
            .map(|claim| Volume {
                name: claim.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: format!("{claim}-{name}-0"),
                    read_only: None,
                }),
                ..Default::default()
            })
            .collect();
        volumes.extend(
            pod_spec
                .volumes
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|v| !names.contains(&v.name)),
        );
        pod_spec.volumes = Some(volumes);
    }
    pod
}

/// The Pod a Deployment's ReplicaSet creates: its pod template.
pub fn pod_of_deployment(deploy: &Deployment) -> Pod {
    let template = deploy.spec.clone().unwrap_or_default().template;
    pod_from_template(&deploy.name_any(), deploy.namespace(), template)
}

fn pod_from_template(workload: &str, namespace: Option<String>, template: PodTemplateSpec) -> Pod {
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            // A generated name never collides with a running pod of the workload.
            generate_name: Some(format!("{workload}-vcp-check-")),
            namespace,
            labels: meta.labels,
            annotations: meta.annotations,
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// The outcome of one step.
enum Verdict {
    Fine,
    Invalid(String),
    PodSecurity(PodSecurityViolation),
}

async fn verdict<D: DryRun>(dry: &D, workload: &Workload, plan: &WorkloadPlan) -> Result<Verdict> {
    if is_converged(workload, &plan.patch) {
        // The workload holds exactly this already: the API server took it.
        return Ok(Verdict::Fine);
    }
    match dry.workload(workload, &plan.patch).await? {
        WorkloadAnswer::Refused(message) => Ok(Verdict::Invalid(message)),
        // The pod of a workload the API server just accepted: when it is refused as invalid,
        // that is how this pod was built, not the plugins' part, which the workload's own dry
        // run validated.
        WorkloadAnswer::Accepted(pod) => Ok(match dry.pod(&pod).await? {
            PodAnswer::Violates(v) => Verdict::PodSecurity(v),
            PodAnswer::Admitted | PodAnswer::Unjudged(_) | PodAnswer::Invalid(_) => Verdict::Fine,
        }),
    }
}

fn invalid(workload: &Workload, message: &str) -> Refusal {
    Refusal {
        reason: Reason::InvalidWorkload,
        message: format!(
            "the API server refuses {} {}/{} with this plugin's part: {message}",
            workload.kind_str(),
            workload.namespace,
            workload.name
        ),
    }
}

fn pod_security(workload: &Workload, v: &PodSecurityViolation) -> Refusal {
    Refusal {
        reason: Reason::PolicyDenied,
        message: format!(
            "with this plugin's container the vCluster's pods would violate the Pod Security level {:?} enforced in namespace {} (label {POD_SECURITY_ENFORCE_LABEL}); the API server's reason: {}",
            v.level, workload.namespace, v.detail
        ),
    }
}

/// The plugins of `plugins` (all those installed into `workload`, refusals of policy and
/// cluster state already left out) whose part the API server refuses, by name, with their
/// [`Refusal`] (see the module docs). Refusals [`plan`] decides itself (conflicts, no `syncer`)
/// are not among them.
///
/// # Errors
/// The dry runs' errors other than a refusal.
pub async fn judge<D: DryRun>(
    dry: &D,
    workload: &Workload,
    plugins: &[&VClusterPlugin],
    runtime_image: &str,
) -> Result<BTreeMap<String, Refusal>> {
    let all = plan(workload, plugins, runtime_image);
    let mut refused = BTreeMap::new();
    match verdict(dry, workload, &all).await? {
        Verdict::Fine => return Ok(refused),
        Verdict::PodSecurity(v) if !all.installed.iter().any(|n| blames(&v, n)) => {
            return Ok(refused);
        }
        _ => {}
    }
    let mut accepted: Vec<&VClusterPlugin> = Vec::new();
    for plugin in install_order(plugins) {
        let name = plugin.name_any();
        let mut trial = accepted.clone();
        trial.push(plugin);
        let step = plan(workload, &trial, runtime_image);
        if !step.installed.contains(&name) {
            // Refused by `plan` itself (a conflict): reported from the final plan.
            continue;
        }
        match verdict(dry, workload, &step).await? {
            Verdict::Invalid(message) => {
                refused.insert(name, invalid(workload, &message));
            }
            Verdict::PodSecurity(v) if blames(&v, &name) => {
                refused.insert(name, pod_security(workload, &v));
            }
            _ => accepted.push(plugin),
        }
    }
    Ok(refused)
}

/// A verdict of [`judge`], remembered for one workload.
#[derive(Clone, Debug)]
struct Judged {
    uid: Option<String>,
    generation: Option<i64>,
    body: u64,
    refused: BTreeMap<String, Refusal>,
}

/// A verdict of [`Verdicts::hook_refusals`]: a hash of what was judged, and the refusals.
type HookVerdict = (u64, BTreeMap<String, Refusal>);

/// The verdicts of [`judge`], one per workload (`kind/namespace/name`): valid while the
/// workload's uid and `metadata.generation` and the body of all its plugins stay the same.
#[derive(Debug, Default)]
pub struct Verdicts {
    by_workload: Mutex<HashMap<String, Judged>>,
    /// The refusals of [`Verdicts::hook_refusals`] per workload, with a hash of what they
    /// were judged from.
    by_hooks: Mutex<HashMap<String, HookVerdict>>,
    /// The verdicts of [`resources::refusals`] per workload.
    pub resources: resources::Remembered,
}

/// The key of `workload`'s verdicts: `kind/namespace/name`.
pub fn key(workload: &Workload) -> String {
    format!(
        "{}/{}/{}",
        workload.kind_str(),
        workload.namespace,
        workload.name
    )
}

/// A hash of an apply body (its JSON text; object keys are sorted, so equal bodies hash alike).
pub fn body_hash(body: &Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.to_string().hash(&mut h);
    h.finish()
}

/// A representative pod the API server refuses in [`Verdicts::hook_refusals`]: the refusing
/// answers of [`PodAnswer`].
enum PodRefusal {
    /// [`PodAnswer::Violates`].
    Violates(PodSecurityViolation),
    /// [`PodAnswer::Invalid`].
    Invalid(String),
}

/// The API server's answer ([`PodAnswer`]) to a dry-run create of `pod` (a hooked
/// representative pod of `workload`): created under a generated name in the workload's
/// namespace, with its labels, annotations and spec. An answer that judged nothing
/// ([`PodAnswer::Unjudged`]) sets `unjudged`.
async fn pod_security_of<D: DryRun>(
    dry: &D,
    workload: &Workload,
    pod: &Pod,
    unjudged: &mut bool,
) -> Result<PodAnswer> {
    let check = Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-vcp-hooks-check-", workload.name)),
            namespace: Some(workload.namespace.clone()),
            labels: pod.metadata.labels.clone(),
            annotations: pod.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    };
    let answer = dry.pod(&check).await?;
    *unjudged |= matches!(answer, PodAnswer::Unjudged(_));
    Ok(answer)
}

impl Verdicts {
    fn lock_hooks(&self) -> std::sync::MutexGuard<'_, HashMap<String, HookVerdict>> {
        self.by_hooks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Judged>> {
        self.by_workload
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The refusals of [`judge`] for `plugins` of `workload`: none without a request when the
    /// workload holds all of them (converged), the remembered ones when the same body was
    /// judged for the same generation of the workload, else judged now and remembered.
    ///
    /// # Errors
    /// As [`judge`].
    pub async fn refusals<D: DryRun>(
        &self,
        dry: &D,
        workload: &Workload,
        plugins: &[&VClusterPlugin],
        runtime_image: &str,
    ) -> Result<BTreeMap<String, Refusal>> {
        let all = plan(workload, plugins, runtime_image);
        if all.installed.is_empty() || is_converged(workload, &all.patch) {
            return Ok(BTreeMap::new());
        }
        let body = body_hash(&all.patch);
        if let Some(j) = self.lock().get(&key(workload))
            && j.uid == workload.uid
            && j.generation == workload.generation
            && j.body == body
        {
            return Ok(j.refused.clone());
        }
        let refused = judge(dry, workload, plugins, runtime_image).await?;
        self.lock().insert(
            key(workload),
            Judged {
                uid: workload.uid.clone(),
                generation: workload.generation,
                body,
                refused: refused.clone(),
            },
        );
        Ok(refused)
    }

    /// The plugins of `plugins` (those of `workload` that policy and cluster state let in)
    /// refused for what their hooks do ([`hooks::judge`] on a representative pod of the
    /// vCluster, judged with the container policy `policy`; then the namespace's Pod Security
    /// level on the hooked pod by a dry run, [`DryRun::pod`]), by name. Nothing is requested
    /// when no plugin has a hook, or when the same hooks were judged for the same workload
    /// (its uid and service account) before. A dry run the API server could not judge
    /// ([`PodAnswer::Unjudged`]) passes, and the verdict it took part in is not remembered: the
    /// next call asks again.
    ///
    /// # Errors
    /// The dry runs' errors other than a refusal.
    pub async fn hook_refusals<D: DryRun>(
        &self,
        dry: &D,
        workload: &Workload,
        plugins: &[&VClusterPlugin],
        policy: &ContainerPolicy,
    ) -> Result<BTreeMap<String, Refusal>> {
        if plugins.iter().all(|p| p.spec.hooks.is_empty()) {
            return Ok(BTreeMap::new());
        }
        // The account of the vCluster's pod template (the control plane's, `vc-<vcluster>`):
        // it exists, so the dry runs' pods run as it; the pod policy never sees it, the
        // representative pod holds `hooks::UNWRITTEN` there (a hook writing this very account
        // passed before, the security review's finding F2).
        let service_account = workload
            .pod_spec
            .service_account_name
            .clone()
            .or_else(|| workload.pod_spec.service_account.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let input = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&workload.uid, &service_account).hash(&mut h);
            for p in hooks::hook_order(plugins) {
                // the inputs of `hook_order` (`plugin_kind`: image, version, hooks)
                (p.name_any(), &p.spec.image, format!("{:?}", p.spec.version)).hash(&mut h);
                serde_json::to_string(&p.spec.hooks)
                    .unwrap_or_default()
                    .hash(&mut h);
            }
            format!("{policy:?}").hash(&mut h);
            h.finish()
        };
        if let Some((hash, refused)) = self.lock_hooks().get(&key(workload))
            && *hash == input
        {
            return Ok(refused.clone());
        }
        let mut remaining: Vec<&VClusterPlugin> = plugins.to_vec();
        let mut refused = BTreeMap::new();
        let mut baseline_checked = false;
        // Whether an answer judged nothing: then the verdict is not remembered.
        let mut unjudged = false;
        loop {
            let judged = hooks::judge(
                policy,
                &remaining,
                &workload.namespace,
                &workload.name,
                &service_account,
            );
            refused.extend(judged.refused.clone());
            remaining.retain(|p| !judged.refused.contains_key(&p.name_any()));
            let Some((_, last)) = judged.steps.last() else {
                break;
            };
            if pod_security_of(dry, workload, last, &mut unjudged)
                .await?
                .passes()
            {
                break;
            }
            // A violation, or a pod the API server refuses as invalid before Pod Security
            // admission could judge it (the fourth attacker's finding 6: counted as a pass
            // before): the hooks' doing only when the pod without hooks is admitted.
            if !baseline_checked {
                baseline_checked = true;
                if !pod_security_of(dry, workload, &judged.before, &mut unjudged)
                    .await?
                    .passes()
                {
                    break;
                }
            }
            // The first plugin whose hooks (with those before it) make the pod refused.
            let mut blamed = None;
            for (name, pod) in &judged.steps {
                let refusal = match pod_security_of(dry, workload, pod, &mut unjudged).await? {
                    PodAnswer::Admitted | PodAnswer::Unjudged(_) => continue,
                    PodAnswer::Violates(v) => PodRefusal::Violates(v),
                    PodAnswer::Invalid(m) => PodRefusal::Invalid(m),
                };
                blamed = Some((name.clone(), refusal));
                break;
            }
            let Some((name, v)) = blamed else { break };
            let plugin = remaining.iter().find(|p| p.name_any() == name);
            let hook_names: Vec<String> = plugin
                .map(|p| {
                    p.spec
                        .hooks
                        .iter()
                        .enumerate()
                        .filter(|(_, h)| h.api_version == "v1" && h.kind == "Pod")
                        .map(|(i, h)| format!("spec.hooks[{i}] ({})", h.name))
                        .collect()
                })
                .unwrap_or_default();
            let message = match v {
                PodRefusal::Violates(v) => format!(
                    "{} change the vCluster's pods so that they would violate the Pod Security level {:?} enforced in namespace {} (label {POD_SECURITY_ENFORCE_LABEL}); the API server's reason for a representative pod: {}",
                    hook_names.join(", "),
                    v.level,
                    workload.namespace,
                    v.detail
                ),
                PodRefusal::Invalid(m) => format!(
                    "{} make a representative pod of the vCluster invalid, so the Pod Security level of namespace {} cannot judge what they do to its pods (the API server validates a pod before Pod Security admission runs); the API server's answer: {m}",
                    hook_names.join(", "),
                    workload.namespace,
                ),
            };
            refused.insert(
                name.clone(),
                Refusal {
                    reason: Reason::PolicyDenied,
                    message,
                },
            );
            remaining.retain(|p| p.name_any() != name);
        }
        // An answer that judged nothing let the hooks pass (fail-open): not remembered, so the
        // next reconcile asks the API server again.
        if !unjudged {
            self.lock_hooks()
                .insert(key(workload), (input, refused.clone()));
        }
        Ok(refused)
    }

    /// The operator applied `workload` (as judged) and the API server answered with
    /// `generation`: the verdict holds for the new generation too (the same body against the
    /// workload with the operator's own part replaced judges the same).
    pub fn applied(&self, workload: &Workload, generation: Option<i64>) {
        if let Some(j) = self.lock().get_mut(&key(workload))
            && j.uid == workload.uid
            && j.generation == workload.generation
        {
            j.generation = generation;
        }
    }

    /// Forgets the verdict of `workload` (its real apply failed: judge again next time).
    pub fn forget(&self, workload: &Workload) {
        self.lock().remove(&key(workload));
    }

    /// Keeps the verdicts of the workloads for which `exists(kind, namespace, name)` holds
    /// only: the others are gone ([`crate::sweep`] prunes with the workloads' watch caches, so
    /// no verdict outlives its workload by more than one full sweep).
    pub fn retain(&self, exists: impl Fn(&str, &str, &str) -> bool) {
        // `kind/namespace/name`, as `key` writes it.
        let keep = |k: &String| {
            let mut parts = k.splitn(3, '/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(kind), Some(namespace), Some(name)) => exists(kind, namespace, name),
                _ => false,
            }
        };
        self.lock().retain(|k, _| keep(k));
        self.lock_hooks().retain(|k, _| keep(k));
        self.resources.retain(keep);
    }

    /// Verdicts held: `(workloads judged by dry runs, workloads judged for hooks)`.
    pub fn entries(&self) -> (usize, usize) {
        (self.lock().len(), self.lock_hooks().len())
    }
}

#[cfg(test)]
mod tests;
