//! The pod policy: what a pod of the vCluster may carry after the plugins' hooks ran on it.
//!
//! Issue 21, hole 1: a `Pod` hook (`CreatePhysical` / `UpdatePhysical`) changes every pod the
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

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSecurityContext, PodSpec, SecurityContext, Volume,
};
use serde_json::Value;

use super::Denial;
use super::containers::{self, ContainerPolicy};
use vcp_crds::fold::go_fold;

/// The volume types Pod Security's `restricted` level allows ("Volume Types": `spec.volumes[*]`
/// "must be one of" these); every other type, `hostPath` first, reaches the node.
pub const RESTRICTED_VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The sysctls Pod Security's `baseline` level allows ("Sysctls": "the safe subset"), as of
/// Kubernetes 1.34; any other sysctl is namespaced to the node or unsafe.
pub const BASELINE_SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

fn denial(
    source: impl Into<String>,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> Denial {
    Denial {
        source: source.into(),
        reason: reason.into(),
        rule: format!("= {}", value.into()),
    }
}

/// The type of `volume`: its one field besides `name` (`hostPath`, `emptyDir`, ...).
pub fn volume_type(volume: &Volume) -> String {
    volume_types(volume).into_iter().next().unwrap_or_default()
}

/// Every source field `volume` sets besides `name`, in the API's field order: one for a valid
/// volume (the API server refuses a volume with more than one source), so the pod policy judges
/// each of them rather than the first only (the seventh security review: `configMap` beside
/// `hostPath` in one volume passed the pod policy and was stopped by the dry run alone).
pub fn volume_types(volume: &Volume) -> Vec<String> {
    serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object().map(|o| {
                o.iter()
                    .filter(|(k, v)| k.as_str() != "name" && !v.is_null())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
        })
        .unwrap_or_default()
}

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

fn host_namespaces(spec: &PodSpec) -> Result<(), Denial> {
    for (field, value) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if value == Some(true) {
            return Err(denial(
                format!("spec.{field}"),
                "true",
                "the pod would share the node's namespace (Pod Security baseline: Host Namespaces)",
            ));
        }
    }
    Ok(())
}

/// `value` for a message: the string in quotes, or `absent`.
fn shown(value: Option<&str>) -> String {
    value.map_or_else(|| "absent".to_string(), |v| format!("{v:?}"))
}

/// Refuses a change of a field that the vCluster sets for each pod (or the cluster owner's
/// configuration does). The message names the value written, not the one it replaced: the
/// representative pod holds a value no real pod has in these fields
/// (`crate::judge::hooks::UNWRITTEN`, the security review's finding F2), so that writing one
/// that a real pod has is seen too; a hook may not write them at all.
fn identity(before: &PodSpec, after: &PodSpec) -> Result<(), Denial> {
    let changed = |field: &str, b: &Option<String>, a: &Option<String>, why: &str| {
        (b != a).then(|| {
            denial(
                format!("spec.{field}"),
                shown(a.as_deref()),
                format!(
                    "{why}; a hook may not write spec.{field}, with any value: the vCluster sets it for each pod, so even a value one pod has would be forced on all of them (remove the operation that writes it)"
                ),
            )
        })
    };
    let identity = "the pods would run with a host service account of the hook's choosing (such as the vCluster control plane's own, vc-<vcluster>) instead of the one the vCluster gives them";
    let checks = [
        changed(
            "nodeName",
            &before.node_name,
            &after.node_name,
            "a pod pinned to a node of the hook's choosing bypasses the scheduler",
        ),
        changed(
            "serviceAccountName",
            &before.service_account_name,
            &after.service_account_name,
            identity,
        ),
        changed(
            "serviceAccount",
            &before.service_account,
            &after.service_account,
            identity,
        ),
        changed(
            "runtimeClassName",
            &before.runtime_class_name,
            &after.runtime_class_name,
            "the container runtime (and its isolation) is the cluster owner's choice",
        ),
        changed(
            "priorityClassName",
            &before.priority_class_name,
            &after.priority_class_name,
            "a priority class (such as system-node-critical) lets the pod evict others: the cluster owner's choice",
        ),
    ];
    if let Some(d) = checks.into_iter().flatten().next() {
        return Err(d);
    }
    // The representative pod has `false`, the one value whose write is harmless (it can only
    // take a token away).
    if before.automount_service_account_token != after.automount_service_account_token {
        return Err(denial(
            "spec.automountServiceAccountToken",
            after
                .automount_service_account_token
                .map_or_else(|| "absent".to_string(), |v| v.to_string()),
            "the pods would mount a token of their host service account (absent means true); a hook may only leave it false",
        ));
    }
    Ok(())
}

/// Refuses a change of the fields that choose the nodes a pod runs on (like `nodeName`):
/// `nodeSelector`, `affinity`, `tolerations`, `topologySpreadConstraints`, `schedulerName`. The
/// security review's finding F4: vCluster enforces its own node selector and tolerations on
/// the host pods (the cluster owner's configuration), and a v2 plugin's hooks run after its
/// translation, so a hook could replace them and put the tenant's pods on control-plane nodes
/// or on other tenants' nodes. As for the identity fields, the representative pod holds a value
/// no real pod has in each (`crate::judge::hooks::UNWRITTEN`), so any write is a change.
fn scheduling(before: &PodSpec, after: &PodSpec) -> Result<(), Denial> {
    fn json<T: serde::Serialize>(value: Option<&T>) -> String {
        let text = value
            .and_then(|v| serde_json::to_string(v).ok())
            .unwrap_or_else(|| "absent".into());
        match text.char_indices().nth(200) {
            Some((i, _)) => format!("{}…", &text[..i]),
            None => text,
        }
    }
    let checks = [
        (
            "nodeSelector",
            before.node_selector != after.node_selector,
            json(after.node_selector.as_ref()),
            "a node selector of the hook's choosing replaces the one the vCluster gives its pods (the cluster owner's choice of nodes): they could run on control-plane nodes or on other tenants' nodes",
        ),
        (
            "affinity",
            before.affinity != after.affinity,
            json(after.affinity.as_ref()),
            "node and pod affinity choose the nodes the pods run on: they could run on control-plane nodes, on other tenants' nodes or next to other tenants' pods",
        ),
        (
            "tolerations",
            before.tolerations != after.tolerations,
            json(after.tolerations.as_ref()),
            "a toleration lets the pods onto tainted nodes (control-plane nodes, nodes kept for other tenants), and replacing the vCluster's tolerations takes the ones it enforces away",
        ),
        (
            "topologySpreadConstraints",
            before.topology_spread_constraints != after.topology_spread_constraints,
            json(after.topology_spread_constraints.as_ref()),
            "topology spread constraints choose the nodes and zones the pods run on",
        ),
        (
            "schedulerName",
            before.scheduler_name != after.scheduler_name,
            json(after.scheduler_name.as_ref()),
            "another scheduler than the cluster owner's chooses the pods' nodes (and can ignore every constraint)",
        ),
    ];
    match checks.into_iter().find(|(_, changed, _, _)| *changed) {
        Some((field, _, value, why)) => Err(denial(
            format!("spec.{field}"),
            value,
            format!(
                "{why}; a hook may not write spec.{field}, with any value: where the vCluster's pods run is the cluster owner's choice (remove the operation that writes it)"
            ),
        )),
        None => Ok(()),
    }
}

/// The [`denial`] of `value` at `source`, which is not among `allowed`: the reason is `what`,
/// then the Pod Security `control` (level and name) with the list it allows.
fn not_listed(
    source: String,
    value: String,
    what: &str,
    (control, allowed): (&str, &[&str]),
) -> Denial {
    let allowed = allowed.join(", ");
    denial(
        source,
        value,
        format!("{what} (Pod Security {control}: {allowed})"),
    )
}

/// Refuses, in `<at>.securityContext.windowsOptions` (a pod's or a container's):
/// `hostProcess: true` (Pod Security baseline: HostProcess), and any
/// `gmsaCredentialSpecName`, `gmsaCredentialSpec` or `runAsUserName`: a Windows identity (an
/// Active Directory account by its group-managed service account, or the user in the
/// container) which Pod Security never judges, and which the representative pod has none of,
/// so a hook would be its only author (the seventh security review). A pod the virtual
/// cluster's user gave such options keeps them: the hook may not write them.
fn host_process(
    at: &str,
    windows: Option<&k8s_openapi::api::core::v1::WindowsSecurityContextOptions>,
) -> Result<(), Denial> {
    let Some(w) = windows else { return Ok(()) };
    if w.host_process == Some(true) {
        return Err(denial(
            format!("{at}.securityContext.windowsOptions.hostProcess"),
            "true",
            "a Windows host process has the node's full access (Pod Security baseline: HostProcess)",
        ));
    }
    for (field, value) in [
        ("gmsaCredentialSpecName", &w.gmsa_credential_spec_name),
        ("gmsaCredentialSpec", &w.gmsa_credential_spec),
        ("runAsUserName", &w.run_as_user_name),
    ] {
        if let Some(value) = value {
            return Err(denial(
                format!("{at}.securityContext.windowsOptions.{field}"),
                format!("{value:?}"),
                "a hook may not give the vCluster's pods a Windows identity (Pod Security does not judge it)",
            ));
        }
    }
    Ok(())
}

fn pod_security_context(policy: &ContainerPolicy, sc: &PodSecurityContext) -> Result<(), Denial> {
    for (i, s) in sc.sysctls.iter().flatten().enumerate() {
        if !BASELINE_SAFE_SYSCTLS.contains(&s.name.as_str()) {
            return Err(not_listed(
                format!("spec.securityContext.sysctls[{i}].name"),
                format!("{:?}", s.name),
                "a sysctl outside the safe set",
                ("baseline: Sysctls", BASELINE_SAFE_SYSCTLS.as_slice()),
            ));
        }
    }
    host_process("spec", sc.windows_options.as_ref())?;
    if !policy.allow_run_as_root {
        let root_group = sc
            .fs_group
            .filter(|g| *g == 0)
            .map(|_| "spec.securityContext.fsGroup".to_string())
            .or_else(|| {
                sc.supplemental_groups
                    .iter()
                    .flatten()
                    .position(|g| *g == 0)
                    .map(|i| format!("spec.securityContext.supplementalGroups[{i}]"))
            });
        if let Some(source) = root_group {
            return Err(denial(
                source,
                "0",
                "the root group (policy containers.allowRunAsRoot: false)",
            ));
        }
    }
    // The fields a container's securityContext shares with the pod's, judged alike.
    let shared = SecurityContext {
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
        run_as_non_root: sc.run_as_non_root,
        seccomp_profile: sc.seccomp_profile.clone(),
        app_armor_profile: sc.app_armor_profile.clone(),
        se_linux_options: sc.se_linux_options.clone(),
        ..Default::default()
    };
    // Its denials name `spec.securityContext.<field>`: the pod's own field.
    containers::security_context(policy, &shared)
}

fn volumes(policy: &ContainerPolicy, before: &PodSpec, after: &PodSpec) -> Result<(), Denial> {
    let had: Vec<&Volume> = before.volumes.iter().flatten().collect();
    for (i, v) in after.volumes.iter().flatten().enumerate() {
        let at = format!("spec.volumes[{i}]");
        for kind in volume_types(v) {
            if !RESTRICTED_VOLUME_TYPES.contains(&kind.as_str()) {
                return Err(not_listed(
                    format!("{at}.{kind}"),
                    format!("{{name: {:?}}}", v.name),
                    &format!("a {kind} volume reaches outside the pod"),
                    (
                        "restricted: Volume Types",
                        RESTRICTED_VOLUME_TYPES.as_slice(),
                    ),
                ));
            }
        }
        if had.contains(&v) {
            continue;
        }
        if let Some(claim) = &v.persistent_volume_claim {
            return Err(denial(
                format!("{at}.persistentVolumeClaim.claimName"),
                format!("{:?}", claim.claim_name),
                "a host claim the pod did not have (it could be the vCluster's own data)",
            ));
        }
        // a claim made for the pod from another claim or a snapshot is a copy of that data:
        // `dataSource: {kind: PersistentVolumeClaim, name: data-<vcluster>-0}` cloned the
        // vCluster's own datastore into each pod (issue 24's second attacker)
        let template = v
            .ephemeral
            .as_ref()
            .and_then(|e| e.volume_claim_template.as_ref());
        if let Some(spec) = template.map(|t| &t.spec) {
            let source = spec
                .data_source
                .as_ref()
                .map(|d| ("dataSource", d.kind.clone(), d.name.clone()))
                .or_else(|| {
                    spec.data_source_ref
                        .as_ref()
                        .map(|d| ("dataSourceRef", d.kind.clone(), d.name.clone()))
                });
            // a claim bound to a named volume, or to volumes by label, takes an existing one
            // (someone else's data) instead of a new, empty one
            let existing = spec
                .volume_name
                .as_ref()
                .map(|v| ("volumeName", format!("{v:?}")))
                .or_else(|| spec.selector.as_ref().map(|_| ("selector", "{...}".into())));
            if let Some((field, value)) = existing {
                return Err(denial(
                    format!("{at}.ephemeral.volumeClaimTemplate.spec.{field}"),
                    value,
                    "a claim bound to an existing volume (it could be someone else's data)",
                ));
            }
            if let Some((field, kind, name)) = source {
                return Err(denial(
                    format!("{at}.ephemeral.volumeClaimTemplate.spec.{field}"),
                    format!("{{kind: {kind:?}, name: {name:?}}}"),
                    "a claim filled from another claim or snapshot (it could be the vCluster's own data)",
                ));
            }
        }
        // an inline CSI volume mounts whatever its driver gives (a host path, a secret store's
        // secrets): the cluster owner's drivers, not a hook's choice
        if let Some(csi) = &v.csi {
            return Err(denial(
                format!("{at}.csi.driver"),
                format!("{:?}", csi.driver),
                "an inline CSI volume the pod did not have (its driver decides what it mounts)",
            ));
        }
        if let Some(secret) = &v.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            if !containers::secret_allowed(policy, &name) {
                return Err(denial(
                    format!("{at}.secret.secretName"),
                    format!("{name:?}"),
                    containers::secret_reason(policy, &name),
                ));
            }
        }
        for (j, source) in v
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .enumerate()
        {
            if source.service_account_token.is_some() {
                return Err(denial(
                    format!("{at}.projected.sources[{j}].serviceAccountToken"),
                    "{...}",
                    "a token of the pod's host service account",
                ));
            }
            if source.pod_certificate.is_some() {
                return Err(denial(
                    format!("{at}.projected.sources[{j}].podCertificate"),
                    "{...}",
                    "a certificate of the pod's host identity",
                ));
            }
            if let Some(secret) = &source.secret {
                let name = secret.name.clone();
                if !containers::secret_allowed(policy, &name) {
                    return Err(denial(
                        format!("{at}.projected.sources[{j}].secret.name"),
                        format!("{name:?}"),
                        containers::secret_reason(policy, &name),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn container(
    policy: &ContainerPolicy,
    at: &str,
    c: &Container,
    before: Option<&Container>,
) -> Result<(), Denial> {
    if let Some(sc) = &c.security_context {
        host_process(at, sc.windows_options.as_ref())?;
        containers::security_context(policy, sc).map_err(|d| Denial {
            source: d.source.replacen("spec.", &format!("{at}."), 1),
            ..d
        })?;
    }
    for (j, p) in c.ports.iter().flatten().enumerate() {
        if let Some(port) = p.host_port.filter(|p| *p != 0) {
            return Err(denial(
                format!("{at}.ports[{j}].hostPort"),
                port.to_string(),
                "a port of the node (Pod Security baseline: Host Ports)",
            ));
        }
    }
    for (j, env) in c.env.iter().flatten().enumerate() {
        if let Some(r) = env
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            && !containers::secret_allowed(policy, &r.name)
        {
            return Err(denial(
                format!("{at}.env[{j}].valueFrom.secretKeyRef"),
                format!("{{name: {:?}, key: {:?}}}", r.name, r.key),
                containers::secret_reason(policy, &r.name),
            ));
        }
    }
    for (j, from) in c.env_from.iter().flatten().enumerate() {
        if let Some(r) = &from.secret_ref
            && !containers::secret_allowed(policy, &r.name)
        {
            return Err(denial(
                format!("{at}.envFrom[{j}].secretRef"),
                format!("{{name: {:?}}}", r.name),
                containers::secret_reason(policy, &r.name),
            ));
        }
    }
    probe_hosts(at, c, before)?;
    let image = c.image.clone().unwrap_or_default();
    let image_changed = before.is_none_or(|b| b.image.as_deref() != Some(image.as_str()));
    if image_changed
        && !policy.allowed_images.is_empty()
        && !policy
            .allowed_images
            .iter()
            .any(|entry| containers::image_matches(entry, &image))
    {
        return Err(denial(
            format!("{at}.image"),
            format!("{image:?}"),
            format!(
                "an image from outside the allowed registries (policy containers.allowedImages: [{}])",
                policy.allowed_images.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The `host` of every probe and lifecycle handler of `c` (`livenessProbe`, `readinessProbe`,
/// `startupProbe`, `lifecycle.postStart`, `lifecycle.preStop`; `httpGet` and `tcpSocket`), as
/// `(field, host)` with the field under `at`; empty hosts are left out.
fn handler_hosts(at: &str, c: &Container) -> Vec<(String, String)> {
    use k8s_openapi::api::core::v1::{HTTPGetAction, TCPSocketAction};
    let mut out = Vec::new();
    let mut add = |field: String, http: Option<&HTTPGetAction>, tcp: Option<&TCPSocketAction>| {
        for (kind, host) in [
            ("httpGet", http.and_then(|h| h.host.as_deref())),
            ("tcpSocket", tcp.and_then(|t| t.host.as_deref())),
        ] {
            if let Some(host) = host.filter(|h| !h.is_empty()) {
                out.push((format!("{at}.{field}.{kind}.host"), host.to_string()));
            }
        }
    };
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            add(field.into(), p.http_get.as_ref(), p.tcp_socket.as_ref());
        }
    }
    if let Some(lifecycle) = &c.lifecycle {
        for (field, handler) in [
            ("lifecycle.postStart", &lifecycle.post_start),
            ("lifecycle.preStop", &lifecycle.pre_stop),
        ] {
            if let Some(h) = handler {
                add(field.into(), h.http_get.as_ref(), h.tcp_socket.as_ref());
            }
        }
    }
    out
}

/// Refuses a `host` the hooks gave a probe or lifecycle handler (Pod Security baseline, "Host
/// Probes / Lifecycle Hooks", Kubernetes 1.34: undefined or `""`): the kubelet sends those
/// requests from the node, past the namespace's NetworkPolicies, to any address the hook names
/// (the node's own ports, the cloud's metadata service). A host the container had before the
/// hooks is not theirs to answer for.
fn probe_hosts(at: &str, c: &Container, before: Option<&Container>) -> Result<(), Denial> {
    let had = before.map(|b| handler_hosts(at, b)).unwrap_or_default();
    match handler_hosts(at, c).into_iter().find(|h| !had.contains(h)) {
        Some((field, host)) => Err(denial(
            field,
            format!("{host:?}"),
            "a probe or lifecycle request the kubelet sends from the node to the host it names (Pod Security baseline: Host Probes / Lifecycle Hooks)",
        )),
        None => Ok(()),
    }
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

/// Refuses `imagePullSecrets` the hooks added that the container policy does not allow (a
/// Secret reference, like an `env` one: `vc-<vcluster>` or another team's registry
/// credential), and any change of `resourceClaims` (another workload's device claim). The
/// third fresh attacker (issue 24).
fn pull_secrets_and_claims(
    policy: &ContainerPolicy,
    before: &PodSpec,
    after: &PodSpec,
) -> Result<(), Denial> {
    let had: Vec<&str> = before
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.as_str())
        .collect();
    for (i, r) in after.image_pull_secrets.iter().flatten().enumerate() {
        if !had.contains(&r.name.as_str()) && !containers::secret_allowed(policy, &r.name) {
            return Err(denial(
                format!("spec.imagePullSecrets[{i}].name"),
                format!("{:?}", r.name),
                containers::secret_reason(policy, &r.name),
            ));
        }
    }
    if before.resource_claims != after.resource_claims {
        return Err(denial(
            "spec.resourceClaims",
            "{...}",
            "a device claim the pod did not have (it could be another workload's)",
        ));
    }
    Ok(())
}

/// Prefixes of the annotation keys the API server turns into a pod's or a container's
/// `securityContext` (or that older kubelets read as such): `…apparmor…/<container>: unconfined`
/// became `appArmorProfile: {type: Unconfined}` on a v1.34 API server (issue 24's second
/// attacker).
pub const SECURITY_ANNOTATION_PREFIXES: [&str; 3] = [
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
];

/// Refuses a hook's change of an annotation the API server reads as a security setting
/// ([`SECURITY_ANNOTATION_PREFIXES`], keys compared ignoring ASCII case).
fn security_annotations(before: &Pod, after: &Pod) -> Result<(), Denial> {
    let empty = std::collections::BTreeMap::new();
    let b = before.metadata.annotations.as_ref().unwrap_or(&empty);
    let a = after.metadata.annotations.as_ref().unwrap_or(&empty);
    let security = |k: &String| {
        let k = k.to_ascii_lowercase();
        SECURITY_ANNOTATION_PREFIXES
            .iter()
            .any(|p| k.starts_with(p) || k == p.trim_end_matches('/'))
    };
    for key in a.keys().chain(b.keys()).filter(|k| security(k)) {
        if a.get(key) != b.get(key) {
            return Err(denial(
                format!("metadata.annotations[{key:?}]"),
                format!("{:?} (was {:?})", a.get(key), b.get(key)),
                "the API server reads this annotation as the pod's seccomp or AppArmor profile",
            ));
        }
    }
    Ok(())
}

/// The JSON Schema of a Pod as k8s-openapi's typed view reads it (its `schemars` schema; the
/// definitions it refers to under `$defs`): which JSON objects of a pod are structs, with which
/// fields, and which are maps (`additionalProperties`: labels, annotations, `nodeSelector`,
/// resource lists, ...).
fn pod_schema() -> &'static Value {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let schema =
            k8s_openapi::schemars::SchemaGenerator::default().into_root_schema_for::<Pod>();
        serde_json::to_value(schema).unwrap_or_default()
    })
}

/// `schema` (a part of [`pod_schema`]), or the definition its `$ref` names.
fn resolved(schema: &Value) -> &Value {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        Some(pointer) => pod_schema().pointer(pointer).unwrap_or(&Value::Null),
        None => schema,
    }
}

/// The fields of the struct `schema` describes, if it describes one.
fn struct_fields(schema: Option<&Value>) -> Option<&serde_json::Map<String, Value>> {
    schema?.get("properties")?.as_object()
}

/// Whether `schema` describes a map (`additionalProperties`, no fields): Go decodes its keys
/// exactly, as map keys.
fn is_map(schema: Option<&Value>) -> bool {
    schema.is_some_and(|s| s.get("additionalProperties").is_some())
        && struct_fields(schema).is_none()
}

/// The schema of the value under `key` of an object of schema `schema`: the field's (the field
/// Go's decoder reads it as, [`go_fold`]), or a map's values'.
fn child_schema<'a>(schema: Option<&'a Value>, key: &str) -> Option<&'a Value> {
    match struct_fields(schema) {
        Some(fields) => fields.get(key).or_else(|| {
            fields
                .iter()
                .find(|(f, _)| go_fold(f) == go_fold(key))
                .map(|(_, s)| s)
        }),
        None => schema?.get("additionalProperties"),
    }
    .map(resolved)
}

fn child_path(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// The keys of `original` (a Pod as JSON) that `typed` (the same value decoded into a typed
/// object and encoded again) lost, as paths such as `spec.HostNetwork`. A key the typed
/// decoder does not know is dropped by it; vCluster's decoder (Go's `encoding/json`) matches
/// keys to fields case-insensitively, so such a key can still set a field there
/// (`HostNetwork` sets `hostNetwork`): a hooked object with a lost key is not judged by its
/// typed view. A `null` under a field of the typed view is no key (both decoders leave the
/// field unset); a `null` under a key that is no field of its struct (the typed view's schema) is lost,
/// since Go's decoder may unset the field it folds to: `automountſerviceAccountToken: null`
/// beside `automountServiceAccountToken: false` (the security review's finding F3).
pub fn lost_keys(original: &Value, typed: &Value) -> Vec<String> {
    fn walk(o: &Value, t: &Value, schema: Option<&Value>, at: &str, out: &mut Vec<String>) {
        match (o, t) {
            (Value::Object(o), Value::Object(t)) => {
                let fields = struct_fields(schema);
                for (k, v) in o {
                    let path = child_path(at, k);
                    if v.is_null() {
                        if fields.is_some_and(|f| !f.contains_key(k)) {
                            out.push(path);
                        }
                        continue;
                    }
                    match t.get(k) {
                        Some(tv) => walk(v, tv, child_schema(schema, k), &path, out),
                        None => out.push(path),
                    }
                }
            }
            (Value::Array(o), Value::Array(t)) => {
                let items = schema.and_then(|s| s.get("items")).map(resolved);
                for (i, v) in o.iter().enumerate() {
                    match t.get(i) {
                        Some(tv) => walk(v, tv, items, &format!("{at}[{i}]"), out),
                        None => out.push(format!("{at}[{i}]")),
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(original, typed, Some(pod_schema()), "", &mut out);
    out
}

/// Two keys of one JSON object of `pod` (a Pod as JSON) that Go's `encoding/json` reads as the
/// same field, as `(object's path, key, other key)`: equal after [`go_fold`], in an object
/// that is a struct in Go (the typed view's schema; an object at a path the schema does not know is
/// taken for one). vCluster decodes a hook's result with it, and each key sets the field in
/// turn, so the last one in the text wins, while the typed view reads the key spelled as the
/// field. The security review's finding F3: a `spec` holding `automountServiceAccountToken:
/// false` and `automountſerviceAccountToken: null` (`ſ`, U+017F, folds to `s`; serde_json
/// writes it after the other) was judged `false`, and vCluster's decoder mounted the token.
/// Map keys (labels, annotations, `nodeSelector`, resource lists, ...) are matched exactly by
/// Go, so two keys of a map that fold alike are two keys.
pub fn folded_duplicate_keys(pod: &Value) -> Option<(String, String, String)> {
    fn walk(v: &Value, schema: Option<&Value>, at: &str) -> Option<(String, String, String)> {
        match v {
            Value::Object(o) => {
                if !is_map(schema) {
                    let mut seen: std::collections::BTreeMap<String, &String> =
                        std::collections::BTreeMap::new();
                    for k in o.keys() {
                        if let Some(first) = seen.insert(go_fold(k), k) {
                            return Some((at.to_string(), first.clone(), k.clone()));
                        }
                    }
                }
                o.iter()
                    .find_map(|(k, v)| walk(v, child_schema(schema, k), &child_path(at, k)))
            }
            Value::Array(a) => {
                let items = schema.and_then(|s| s.get("items")).map(resolved);
                a.iter()
                    .enumerate()
                    .find_map(|(i, v)| walk(v, items, &format!("{at}[{i}]")))
            }
            _ => None,
        }
    }
    walk(pod, Some(pod_schema()), "")
}

#[cfg(test)]
mod tests;
