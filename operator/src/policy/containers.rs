//! The container policy: what a `VClusterPlugin`'s container may ask for in the vCluster's pod.
//!
//! The rule (README, "Security model"): a plugin's container runs inside the vCluster's
//! pod, beside its datastore and with its service account, so the container fields a plugin
//! copies into the pod (`image`, `securityContext`, `env`, `envFrom`, `volumeMounts`) must not
//! let its author do more than they could do themselves. By default the operator refuses:
//!
//! | field (in `spec`) | refused | policy key that allows it |
//! | --- | --- | --- |
//! | `securityContext.privileged` | `true` | `containers.allowPrivileged: true` |
//! | `securityContext.allowPrivilegeEscalation` | `true` | `containers.allowPrivilegeEscalation: true` |
//! | `securityContext.capabilities.add[i]` | any capability | `containers.allowedCapabilities: [NET_BIND_SERVICE, ...]` |
//! | `securityContext.runAsUser` | `0` | `containers.allowRunAsRoot: true` |
//! | `securityContext.runAsGroup` | `0` | `containers.allowRunAsRoot: true` |
//! | `securityContext.runAsNonRoot` | `false` | `containers.allowRunAsRoot: true` |
//! | `securityContext.seccompProfile.type`, `appArmorProfile.type` | `Unconfined` | `containers.allowUnconfined: true` |
//! | `securityContext.procMount` | `Unmasked` | `containers.allowUnconfined: true` |
//! | `securityContext.seLinuxOptions` | any | `containers.allowUnconfined: true` |
//! | `env[i].valueFrom.secretKeyRef` | any Secret | `containers.allowedSecrets: [name, prefix-*]`, or `containers.allowSecretReferences: true` |
//! | `envFrom[i].secretRef` | any Secret | the same |
//! | `volumeMounts[i].name` | `vcp-vcluster-kubeconfig` (the vCluster's admin kubeconfig) | none: always refused |
//! | `volumeMounts[i].name` | `plugins` (the v2 plugins' binaries, which vCluster's syncer runs) | none: always refused |
//! | `volumeMounts[i].name` | a volume the operator did not add | `containers.allowedVolumes: [name, ...]` |
//! | `image` | not in `containers.allowedImages` (when that list is not empty) | `containers.allowedImages: [registry/, registry/repo, ...]` |
//! | `resources.requests[r]`, `resources.limits[r]` | above `containers.maxResources[r]` (when set for `r`) | `containers.maxResources: {cpu: "2", memory: 1Gi, ...}` |
//!
//! Running as root: a plugin may not *ask* for root: `runAsUser: 0` / `runAsGroup: 0`, or
//! `runAsNonRoot: false`, which would override a `runAsNonRoot: true` of the vCluster's pod.
//! Fields left unset inherit the pod's `securityContext` and the image's user, which the
//! vCluster's owner chose; `allowPrivilegeEscalation` left unset is the container runtime's
//! default. Where a namespace requires more (`runAsNonRoot: true`, a seccomp profile, ...), its
//! Pod Security level does, which the operator also respects (`crate::judge`).
//!
//! Volumes: the operator adds two volumes of its own, and a spec's mount of either is refused
//! whatever `allowedVolumes` says (the CRD refuses both at admission too; this check covers
//! objects stored before those rules). [`VCLUSTER_KUBECONFIG_VOLUME`] (the Secret
//! `vc-<vcluster>`: the vCluster's admin kubeconfig) is mounted into the embedded runtime
//! containers the operator builds and nowhere else (else it would hand the vCluster's admin
//! credentials to a tenant who cannot read Secrets). [`PLUGINS_VOLUME`] (the
//! emptyDir of the v2 plugins' binaries, which vCluster's syncer runs) is mounted into the
//! operator's v2 init containers and `syncer` only, as vCluster's chart does (an attack found
//! it: a tenant's mount of it over `/usr/local/bin` of the embedded runtime
//! made the runtime, with the admin kubeconfig, run a script another plugin's init container
//! dropped there; a sidecar mounting it could replace any v2 plugin's binary). Every other volume of the pod is the vCluster's own, such as `data` (its datastore
//! and certificates), and is refused unless `allowedVolumes` names it.
//!
//! Images: an `allowedImages` entry ending in `/` is a prefix (a registry such as `ghcr.io/` or a
//! path such as `ghcr.io/loft-sh/`); any other entry is a repository, which matches the image
//! with any tag or digest (`ghcr.io/loft-sh/vcluster-example` matches
//! `ghcr.io/loft-sh/vcluster-example:0.1.0`). Images are compared as written (`nginx` is not
//! `docker.io/library/nginx`). The list applies to `spec.image` only: the embedded runtime's
//! image is the operator's own (`--runtime-image`).
//!
//! Secrets: an `allowedSecrets` entry ending in `*` is a name prefix, any other an exact name.
//!
//! Resources: `maxResources` bounds what a plugin asks for in `spec.resources`, the same for
//! every kind of plugin: the container of an image (v1 sidecar, v2 init container) and the
//! embedded runtime's sidecar, whose `spec.resources` overrides the operator's defaults per
//! resource (`crate::workload::RUNTIME_REQUESTS`, `RUNTIME_LIMITS`: `100m` / `96Mi` requested,
//! `1` / `256Mi` at most). The defaults themselves are the operator's and are not judged here.
//! Quantities are compared as Kubernetes reads them (`crate::quantity`: `1Gi` is `1024Mi`).
//! Unset (the default), a plugin may ask for any amount; what the namespace's LimitRange and
//! ResourceQuota allow and what a node can hold are judged apart, before the install
//! (`crate::judge::resources`).
//!
//! The first refusal found (in the order of the table) becomes `Ready=False`,
//! `reason=PolicyDenied`, with a message naming the field path and the policy key, such as
//! `spec.securityContext.privileged = true is refused by the operator policy: a privileged
//! container has full access to the node (policy containers.allowPrivileged: false)`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::SecurityContext;
use serde::{Deserialize, Serialize};
use vcp_crds::VClusterPlugin;

use super::denial::Denial;
use crate::quantity::{Amount, QuantityError};
use crate::workload::{PLUGINS_VOLUME, VCLUSTER_KUBECONFIG_VOLUME};

/// What a plugin's container may ask for; every field optional in the policy file, the
/// defaults refuse everything listed in the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainerPolicy {
    /// `securityContext.privileged: true` allowed; default `false`.
    pub allow_privileged: bool,
    /// `securityContext.allowPrivilegeEscalation: true` allowed; default `false`.
    pub allow_privilege_escalation: bool,
    /// Capabilities `securityContext.capabilities.add` may name (compared without case and
    /// without a `CAP_` prefix; `ALL` only when listed); default none.
    pub allowed_capabilities: Vec<String>,
    /// `runAsUser: 0`, `runAsGroup: 0` and `runAsNonRoot: false` allowed; default `false`.
    pub allow_run_as_root: bool,
    /// `Unconfined` seccomp / AppArmor profiles, `procMount: Unmasked` and custom
    /// `seLinuxOptions` allowed; default `false`.
    pub allow_unconfined: bool,
    /// Any Secret may be referenced from `env` / `envFrom`; default `false`.
    pub allow_secret_references: bool,
    /// Secrets that may be referenced (exact names, or prefixes ending in `*`); default none.
    pub allowed_secrets: Vec<String>,
    /// Volumes of the vCluster's pod (other than the operator's own) that may be mounted;
    /// default none.
    pub allowed_volumes: Vec<String>,
    /// Images `spec.image` may use (prefixes ending in `/`, else repositories); empty (the
    /// default): any image.
    pub allowed_images: Vec<String>,
    /// The most `spec.resources` may request or limit, per resource name (`cpu`, `memory`,
    /// `ephemeral-storage`, ...), as Kubernetes quantities; empty (the default): no bound.
    pub max_resources: BTreeMap<String, String>,
}

impl ContainerPolicy {
    /// Checks that every `maxResources` value is a quantity.
    ///
    /// # Errors
    /// The first value that is not, with its key.
    pub fn validate(&self) -> Result<(), (String, QuantityError)> {
        for (resource, max) in &self.max_resources {
            Amount::parse(max).map_err(|e| (format!("containers.maxResources.{resource}"), e))?;
        }
        Ok(())
    }
}

fn list(values: &[String]) -> String {
    format!("[{}]", values.join(", "))
}

fn denial(source: String, value: String, reason: String) -> Denial {
    Denial {
        source,
        reason,
        rule: format!("= {value}"),
    }
}

/// Whether `image` is allowed by the `allowedImages` entry `entry` (see the module docs).
pub fn image_matches(entry: &str, image: &str) -> bool {
    if entry.ends_with('/') {
        return image.starts_with(entry);
    }
    match image.strip_prefix(entry) {
        Some("") => true,
        Some(rest) => rest.starts_with(':') || rest.starts_with('@'),
        None => false,
    }
}

pub(crate) fn secret_allowed(policy: &ContainerPolicy, name: &str) -> bool {
    policy.allow_secret_references
        || policy
            .allowed_secrets
            .iter()
            .any(|a| match a.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => a == name,
            })
}

fn capability(c: &str) -> String {
    let upper = c.to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .map(str::to_string)
        .unwrap_or(upper)
}

pub(crate) fn secret_reason(policy: &ContainerPolicy, name: &str) -> String {
    format!(
        "a reference to Secret {name:?} (policy containers.allowSecretReferences: false, containers.allowedSecrets: {})",
        list(&policy.allowed_secrets)
    )
}

pub(crate) fn security_context(
    policy: &ContainerPolicy,
    sc: &SecurityContext,
) -> Result<(), Denial> {
    let at = |field: &str| format!("spec.securityContext.{field}");
    if sc.privileged == Some(true) && !policy.allow_privileged {
        return Err(denial(
            at("privileged"),
            "true".into(),
            "a privileged container has full access to the node (policy containers.allowPrivileged: false)".into(),
        ));
    }
    if sc.allow_privilege_escalation == Some(true) && !policy.allow_privilege_escalation {
        return Err(denial(
            at("allowPrivilegeEscalation"),
            "true".into(),
            "a process of the container could gain more privileges than its parent (policy containers.allowPrivilegeEscalation: false)".into(),
        ));
    }
    let added = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_deref())
        .unwrap_or_default();
    let allowed: Vec<String> = policy
        .allowed_capabilities
        .iter()
        .map(|c| capability(c))
        .collect();
    if let Some((i, c)) = added
        .iter()
        .enumerate()
        .find(|(_, c)| !allowed.contains(&capability(c)))
    {
        return Err(denial(
            at(&format!("capabilities.add[{i}]")),
            format!("{c:?}"),
            format!(
                "an added Linux capability (policy containers.allowedCapabilities: {})",
                list(&policy.allowed_capabilities)
            ),
        ));
    }
    if !policy.allow_run_as_root {
        let root = "running as root (policy containers.allowRunAsRoot: false)";
        if sc.run_as_user == Some(0) {
            return Err(denial(at("runAsUser"), "0".into(), root.into()));
        }
        if sc.run_as_group == Some(0) {
            return Err(denial(at("runAsGroup"), "0".into(), root.into()));
        }
        if sc.run_as_non_root == Some(false) {
            return Err(denial(
                at("runAsNonRoot"),
                "false".into(),
                "it would let the container run as root, overriding the pod's runAsNonRoot (policy containers.allowRunAsRoot: false)".into(),
            ));
        }
    }
    if !policy.allow_unconfined {
        let unconfined = "a container without the runtime's confinement (policy containers.allowUnconfined: false)";
        let profiles = [
            (
                "seccompProfile.type",
                sc.seccomp_profile.as_ref().map(|p| &p.type_),
            ),
            (
                "appArmorProfile.type",
                sc.app_armor_profile.as_ref().map(|p| &p.type_),
            ),
        ];
        for (field, type_) in profiles {
            if let Some(type_) = type_.filter(|t| *t == "Unconfined") {
                return Err(denial(at(field), format!("{type_:?}"), unconfined.into()));
            }
        }
        if let Some(m) = sc.proc_mount.as_ref().filter(|m| *m == "Unmasked") {
            return Err(denial(at("procMount"), format!("{m:?}"), unconfined.into()));
        }
        if sc.se_linux_options.is_some() {
            return Err(denial(
                at("seLinuxOptions"),
                "{...}".into(),
                "a custom SELinux label (policy containers.allowUnconfined: false)".into(),
            ));
        }
    }
    Ok(())
}

/// `spec.resources` of `plugin` against `containers.maxResources` (see the module docs):
/// requests first, then limits, each in resource-name order. A value that is not a quantity
/// is left to the API server (its dry run refuses it, `InvalidWorkload`).
fn resources(policy: &ContainerPolicy, plugin: &VClusterPlugin) -> Result<(), Denial> {
    let Some(asked) = &plugin.spec.resources else {
        return Ok(());
    };
    for (kind, values) in [("requests", &asked.requests), ("limits", &asked.limits)] {
        for (resource, value) in values.iter().flatten() {
            let Some(max) = policy.max_resources.get(resource) else {
                continue;
            };
            if let (Ok(v), Ok(m)) = (Amount::parse(&value.0), Amount::parse(max))
                && v > m
            {
                return Err(denial(
                    format!("spec.resources.{kind}.{resource}"),
                    value.0.clone(),
                    format!(
                        "more {resource} than a plugin's container may ask for (policy containers.maxResources.{resource}: {max})"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Checks the container fields of `plugin` against `policy` (see the module docs).
///
/// # Errors
/// The first [`Denial`], in the order of the module docs' table (image last).
pub fn check(policy: &ContainerPolicy, plugin: &VClusterPlugin) -> Result<(), Denial> {
    let spec = &plugin.spec;
    if let Some(sc) = &spec.security_context {
        security_context(policy, sc)?;
    }
    for (i, env) in spec.env.iter().flatten().enumerate() {
        if let Some(r) = env
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            && !secret_allowed(policy, &r.name)
        {
            return Err(denial(
                format!("spec.env[{i}].valueFrom.secretKeyRef"),
                format!("{{name: {:?}, key: {:?}}}", r.name, r.key),
                secret_reason(policy, &r.name),
            ));
        }
    }
    for (i, from) in spec.env_from.iter().flatten().enumerate() {
        if let Some(r) = &from.secret_ref
            && !secret_allowed(policy, &r.name)
        {
            return Err(denial(
                format!("spec.envFrom[{i}].secretRef"),
                format!("{{name: {:?}}}", r.name),
                secret_reason(policy, &r.name),
            ));
        }
    }
    for (i, m) in spec.volume_mounts.iter().flatten().enumerate() {
        if m.name == VCLUSTER_KUBECONFIG_VOLUME {
            return Err(denial(
                format!("spec.volumeMounts[{i}].name"),
                format!("{:?}", m.name),
                format!(
                    "a mount of the vCluster's admin kubeconfig (Secret vc-{}), which vcluster-plugin-operator mounts into its own runtime container only (no policy key allows it)",
                    spec.vcluster.name
                ),
            ));
        }
        if m.name == PLUGINS_VOLUME {
            return Err(denial(
                format!("spec.volumeMounts[{i}].name"),
                format!("{:?}", m.name),
                "a mount of the v2 plugins' binaries, which vCluster's syncer runs: vcluster-plugin-operator mounts it into its own v2 init containers and the syncer only (no policy key allows it)".into(),
            ));
        }
        if !policy.allowed_volumes.contains(&m.name) {
            return Err(denial(
                format!("spec.volumeMounts[{i}].name"),
                format!("{:?}", m.name),
                format!(
                    "a mount of the vCluster's volume {:?}, which vcluster-plugin-operator did not add (policy containers.allowedVolumes: {})",
                    m.name,
                    list(&policy.allowed_volumes)
                ),
            ));
        }
    }
    resources(policy, plugin)?;
    if let Some(image) = &spec.image
        && !policy.allowed_images.is_empty()
        && !policy
            .allowed_images
            .iter()
            .any(|entry| image_matches(entry, image))
    {
        return Err(denial(
            "spec.image".into(),
            format!("{image:?}"),
            format!(
                "an image from outside the allowed registries (policy containers.allowedImages: {})",
                list(&policy.allowed_images)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
