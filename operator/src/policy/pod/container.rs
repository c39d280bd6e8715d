//! One container of the pod policy ([`super::check`]): its `securityContext`, host ports, Secret
//! references, probe and lifecycle hosts, and image.

use k8s_openapi::api::core::v1::Container;

use crate::policy::Denial;
use crate::policy::containers::{self, ContainerPolicy};

use super::deny::denial;
use super::spec::host_process;

/// Judges the container `c` at `at` (such as `spec.containers[0]`), which was `before` ahead of
/// the hooks (`None`: the hooks added it).
pub(super) fn container(
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
