//! Which synced types the runtime may sync: custom resources, and of the kinds Kubernetes
//! serves itself, `ConfigMap` only.
//!
//! The runtime's generic syncer copies an object with its metadata translated and its content
//! as written (the README, "Syncing real custom resources"). For a custom resource that is vCluster's own
//! `sync.*.customResources` behaviour (its key is a CRD name). For a kind Kubernetes itself
//! acts on by content, the copy bypasses what vCluster's own syncer for that kind does: a
//! virtual `Pod` synced this way reached the host with the vCluster's own service account,
//! `privileged`, `hostPath: /` and the vCluster's kubeconfig Secret mounted (found by an
//! attacker); a `Secret` of type `kubernetes.io/service-account-token`
//! would have the host mint a token, a `PersistentVolumeClaim` clone another one's data, a
//! `Deployment` or `Job` run pods, a `Role` grant. vCluster syncs those kinds itself, with its
//! translation. So a synced type of a group Kubernetes serves ([`BUILT_IN_GROUPS`]) is refused,
//! except `ConfigMap` (data only: whatever uses it is itself synced and translated by
//! vCluster). The operator refuses such a plugin (`PolicyDenied`) and the runtime does not
//! sync such a type ([`refusal`]).

use crate::plugin::SyncedType;

/// The API groups kube-apiserver v1.34 serves itself (its discovery, without any CRD or
/// aggregated API: `tests/tests/harness_control_plane.rs` compares it with the real API
/// server's), plus `extensions` and `metrics.k8s.io` (served by older API servers and by the
/// metrics server). Compared ignoring ASCII case.
pub const BUILT_IN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "extensions",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "metrics.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// The group of an `apiVersion` (`""` for `v1`, `apps` for `apps/v1`).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether `group` is one Kubernetes serves itself ([`BUILT_IN_GROUPS`], ignoring case).
pub fn is_built_in_group(group: &str) -> bool {
    BUILT_IN_GROUPS
        .iter()
        .any(|g| g.eq_ignore_ascii_case(group))
}

/// Why the runtime does not sync `synced` (see the module docs), or `None` when it may: a
/// type of a group Kubernetes serves itself other than `v1` `ConfigMap` (kind ignoring ASCII
/// case; an explicit `resource` must then be `configmaps`). `index` names the entry in the
/// message.
pub fn refusal(index: usize, synced: &SyncedType) -> Option<String> {
    let group = group_of(&synced.api_version);
    if !is_built_in_group(group) {
        return None;
    }
    let config_map = group.is_empty()
        && synced.kind.eq_ignore_ascii_case("ConfigMap")
        && synced.resource.as_deref().is_none_or(|r| r == "configmaps");
    if config_map {
        return None;
    }
    let resource = synced
        .resource
        .as_deref()
        .map(|r| format!(" (resource {r:?})"))
        .unwrap_or_default();
    Some(format!(
        "spec.syncedTypes[{index}] ({} {}{resource}) is a kind Kubernetes serves itself: the runtime copies objects with only their metadata translated, which for such a kind bypasses what vCluster's own syncer does with it (a Pod would keep its service account, host paths and privileges); only custom resources and v1 ConfigMap are synced by a plugin, vCluster syncs the others itself",
        synced.api_version, synced.kind
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synced(api_version: &str, kind: &str, resource: Option<&str>) -> SyncedType {
        SyncedType {
            api_version: api_version.into(),
            kind: kind.into(),
            resource: resource.map(Into::into),
            ..SyncedType::default()
        }
    }

    #[test]
    fn custom_resources_and_config_maps_only() {
        for (api_version, kind, resource) in [
            ("example.loft.sh/v1", "Car", None),
            ("cert-manager.io/v1", "Certificate", None),
            // Gateway API's group ends in k8s.io but is served by its CRDs
            ("gateway.networking.k8s.io/v1", "HTTPRoute", None),
            ("monitoring.coreos.com/v1", "ServiceMonitor", None),
            ("v1", "ConfigMap", None),
            ("v1", "configmap", Some("configmaps")),
        ] {
            assert_eq!(
                refusal(0, &synced(api_version, kind, resource)),
                None,
                "{api_version} {kind}"
            );
        }
        for (api_version, kind, resource) in [
            ("v1", "Pod", None),
            ("v1", "pod", None),
            ("v1", "Secret", None),
            ("v1", "ServiceAccount", None),
            ("v1", "PersistentVolumeClaim", None),
            // a ConfigMap's kind with another resource is that resource
            ("v1", "ConfigMap", Some("pods")),
            ("apps/v1", "Deployment", None),
            ("Apps/v1", "StatefulSet", None),
            ("batch/v1", "Job", None),
            ("rbac.authorization.k8s.io/v1", "Role", None),
            ("networking.k8s.io/v1", "NetworkPolicy", None),
            ("RBAC.authorization.k8s.io/v1", "RoleBinding", None),
        ] {
            let message = refusal(3, &synced(api_version, kind, resource))
                .unwrap_or_else(|| panic!("{api_version} {kind} {resource:?}"));
            assert!(
                message.starts_with(&format!("spec.syncedTypes[3] ({api_version} {kind}")),
                "{message}"
            );
        }
    }
}
