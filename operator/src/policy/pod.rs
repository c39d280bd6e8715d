//! The pod policy: what a pod of the vCluster may carry after the plugins' hooks ran on it.
//!
//! Why: a `Pod` hook (`CreatePhysical` / `UpdatePhysical`) changes every pod the
//! vCluster runs on the host, so it has the power of whoever can write any pod spec of the
//! namespace, and more: the tenant's own pods are checked by the host's Pod Security admission,
//! a hook's change of them is not judged by anyone but the operator before the plugin is
//! installed. [`check`] judges the pod a hook produces from a representative pod
//! (`crate::judge::hooks`), with `before` the representative pod and `after` the hooked one.
//!
//! The pod-level controls follow the Pod Security Standards
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>), `baseline`
//! unless said otherwise, and are not relaxed by the policy file:
//!
//! | field | refused | control |
//! | --- | --- | --- |
//! | `spec.hostNetwork`, `spec.hostPID`, `spec.hostIPC` | `true` | baseline: Host Namespaces |
//! | `spec.securityContext.windowsOptions.hostProcess` (pod and containers) | `true` | baseline: HostProcess |
//! | `spec.volumes[i]` | a type other than [`RESTRICTED_VOLUME_TYPES`] (`hostPath` among them) | restricted: Volume Types (baseline: HostPath Volumes) |
//! | `spec.volumes[i].persistentVolumeClaim` | a claim the pod did not have | a hook may not hand the vCluster's pods a host claim (such as the vCluster's own data) |
//! | `spec.volumes[i].projected.sources[j].serviceAccountToken` | added | a token of the host's service account |
//! | `spec.volumes[i].secret`, `projected.sources[j].secret` | a Secret outside `containers.allowedSecrets` | as a container's Secret references |
//! | `spec.securityContext.sysctls[i]` | a name outside [`BASELINE_SAFE_SYSCTLS`] | baseline: Sysctls |
//! | `spec.containers[i].ports[j].hostPort` (and init / ephemeral containers) | other than `0` | baseline: Host Ports |
//! | `spec.nodeName` | changed (written, with any value†) | bypasses the scheduler: the pod lands on a node of the hook's choosing |
//! | `spec.serviceAccountName`, `spec.serviceAccount` | changed (written, with any value†) | the pod would run with another host identity (the control plane's own `vc-<vcluster>`, say) |
//! | `spec.automountServiceAccountToken` | other than `false` | the pod would mount a token of its host identity |
//! | `spec.nodeSelector`, `spec.affinity`, `spec.tolerations`, `spec.topologySpreadConstraints`, `spec.schedulerName` | changed (written, with any value†) | they choose the nodes the pod runs on: vCluster's enforced node selector and tolerations (the cluster owner's) replaced, the pod lands on control-plane or other tenants' nodes |
//! | `spec.runtimeClassName` | changed (written, with any value†) | the container runtime (its isolation) is the cluster owner's choice |
//! | `spec.priorityClassName` | changed (written, with any value†) | a priority such as `system-node-critical` evicts other pods: the cluster owner's choice |
//! | `spec.volumes[i].ephemeral.volumeClaimTemplate.spec.dataSource` / `dataSourceRef` | added | a clone of another claim or a snapshot (it could be the vCluster's own data) |
//! | `spec.volumes[i].csi` | added | an inline CSI volume: its driver decides what it mounts |
//! | `spec.volumes[i].ephemeral.volumeClaimTemplate.spec.volumeName` / `selector` | added | binds an existing volume (it could be someone else's data) |
//! | `spec.volumes[i].projected.sources[j].podCertificate` | added | a certificate of the pod's host identity |
//! | `spec.imagePullSecrets[i]` | a Secret outside `containers.allowedSecrets`, added | as a container's Secret references |
//! | `spec.resourceClaims` | changed | another workload's device claim |
//! | `spec.securityContext.fsGroup`, `supplementalGroups[j]` | `0` unless `containers.allowRunAsRoot` | the root group |
//! | `spec.containers[i].{liveness,readiness,startup}Probe.{httpGet,tcpSocket}.host`, `lifecycle.{postStart,preStop}.…host` (and init / ephemeral containers) | a non-empty host the container did not have | baseline: Host Probes / Lifecycle Hooks (the kubelet sends them from the node) |
//! | `metadata.annotations` of [`SECURITY_ANNOTATION_PREFIXES`] | changed | the API server turns them into seccomp / AppArmor profiles (`unconfined`) |
//!
//! † The vCluster sets these for each pod, so a value one real pod has is no value a hook may
//! give all of them: the representative pod holds a value no real pod has there
//! (`crate::judge::hooks::UNWRITTEN`), and [`check`], comparing, sees any write.
//!
//! The pod's `securityContext` (`runAsUser: 0`, `runAsGroup: 0`, `runAsNonRoot: false`,
//! `Unconfined` seccomp / AppArmor, `seLinuxOptions`) and every container, init container and
//! ephemeral container (`securityContext`, Secret references in `env` / `envFrom`, the image of
//! a container the hooks added or changed) are judged by the container policy
//! ([`super::containers`]) and its keys.
//!
//! The parts: `spec` (the pod-level fields), `volumes`, `container` (one container's fields),
//! `deny` (how a refusal is worded) and `keys` (the keys of a hooked pod as Go's decoder reads
//! them: [`lost_keys`], [`folded_duplicate_keys`]).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::Denial;
use super::containers::ContainerPolicy;

mod container;
mod deny;
mod keys;
mod spec;
mod volumes;

pub use keys::{folded_duplicate_keys, lost_keys};
pub use spec::{BASELINE_SAFE_SYSCTLS, SECURITY_ANNOTATION_PREFIXES};
pub use volumes::{RESTRICTED_VOLUME_TYPES, volume_type, volume_types};

use container::container;
use spec::{
    host_namespaces, identity, pod_security_context, pull_secrets_and_claims, scheduling,
    security_annotations,
};
use volumes::volumes;

/// A container, init container or ephemeral container of `spec`, with its path.
fn containers_of(spec: &PodSpec) -> Vec<(String, Container)> {
    let mut out: Vec<(String, Container)> = Vec::new();
    for (field, list) in [
        ("containers", Some(&spec.containers)),
        ("initContainers", spec.init_containers.as_ref()),
    ] {
        for (i, c) in list.into_iter().flatten().enumerate() {
            out.push((format!("spec.{field}[{i}]"), c.clone()));
        }
    }
    for (i, e) in spec.ephemeral_containers.iter().flatten().enumerate() {
        // An ephemeral container has a container's fields (plus `targetContainerName`).
        let c = serde_json::to_value(e)
            .ok()
            .and_then(|v| serde_json::from_value::<Container>(v).ok())
            .unwrap_or_default();
        out.push((format!("spec.ephemeralContainers[{i}]"), c));
    }
    out
}

/// Judges `after`, the pod `before` became through hooks (see the module docs for the table):
/// pod-level fields, volumes, then every container, init container and ephemeral container
/// against the container policy `policy`.
///
/// # Errors
/// The first [`Denial`], naming the field of `after` (such as `spec.volumes[0].hostPath`).
pub fn check(policy: &ContainerPolicy, before: &Pod, after: &Pod) -> Result<(), Denial> {
    let empty = PodSpec::default();
    let b = before.spec.as_ref().unwrap_or(&empty);
    let a = after.spec.as_ref().unwrap_or(&empty);
    host_namespaces(a)?;
    identity(b, a)?;
    scheduling(b, a)?;
    security_annotations(before, after)?;
    pull_secrets_and_claims(policy, b, a)?;
    if let Some(sc) = &a.security_context {
        pod_security_context(policy, sc)?;
    }
    volumes(policy, b, a)?;
    let old: Vec<(String, Container)> = containers_of(b);
    let names: BTreeSet<&str> = old.iter().map(|(_, c)| c.name.as_str()).collect();
    for (at, c) in containers_of(a) {
        let previous = names
            .contains(c.name.as_str())
            .then(|| old.iter().find(|(_, o)| o.name == c.name).map(|(_, o)| o))
            .flatten();
        container(policy, &at, &c, previous)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
