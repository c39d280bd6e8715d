//! The pod-level fields of the pod policy ([`super::check`]): host namespaces, the fields the
//! vCluster sets for each pod (identity, scheduling), the pod's `securityContext` and Windows
//! options, pull secrets and resource claims, and the security annotations.

use k8s_openapi::api::core::v1::{Pod, PodSecurityContext, PodSpec, SecurityContext};

use crate::policy::Denial;
use crate::policy::containers::{self, ContainerPolicy};

use super::deny::{denial, not_listed};

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

/// Prefixes of the annotation keys the API server turns into a pod's or a container's
/// `securityContext` (or that older kubelets read as such): `…apparmor…/<container>: unconfined`
/// became `appArmorProfile: {type: Unconfined}` on a v1.34 API server (an attacker's hook did
/// so).
pub const SECURITY_ANNOTATION_PREFIXES: [&str; 3] = [
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
];

/// Refuses the node's namespaces (`hostNetwork`, `hostPID`, `hostIPC`).
pub(super) fn host_namespaces(spec: &PodSpec) -> Result<(), Denial> {
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
pub(super) fn identity(before: &PodSpec, after: &PodSpec) -> Result<(), Denial> {
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
pub(super) fn scheduling(before: &PodSpec, after: &PodSpec) -> Result<(), Denial> {
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

/// Refuses, in `<at>.securityContext.windowsOptions` (a pod's or a container's):
/// `hostProcess: true` (Pod Security baseline: HostProcess), and any
/// `gmsaCredentialSpecName`, `gmsaCredentialSpec` or `runAsUserName`: a Windows identity (an
/// Active Directory account by its group-managed service account, or the user in the
/// container) which Pod Security never judges, and which the representative pod has none of,
/// so a hook would be its only author (the seventh security review). A pod the virtual
/// cluster's user gave such options keeps them: the hook may not write them.
pub(super) fn host_process(
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

/// Judges the pod's `securityContext`: its sysctls, Windows options, root groups, and the
/// fields it shares with a container's, as the container policy judges those.
pub(super) fn pod_security_context(
    policy: &ContainerPolicy,
    sc: &PodSecurityContext,
) -> Result<(), Denial> {
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

/// Refuses `imagePullSecrets` the hooks added that the container policy does not allow (a
/// Secret reference, like an `env` one: `vc-<vcluster>` or another team's registry
/// credential), and any change of `resourceClaims` (another workload's device claim), as an
/// attacker's hooks tried.
pub(super) fn pull_secrets_and_claims(
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

/// Refuses a hook's change of an annotation the API server reads as a security setting
/// ([`SECURITY_ANNOTATION_PREFIXES`], keys compared ignoring ASCII case).
pub(super) fn security_annotations(before: &Pod, after: &Pod) -> Result<(), Denial> {
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
