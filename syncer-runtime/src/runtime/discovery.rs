//! What the runtime learns from discovery: a synced or produced kind's `ApiResource` and
//! whether it has a status subresource ([`resolve`], [`resolve_on`]), and the cluster-scoped
//! kinds a reference patch may name ([`cluster_scoped_kinds`]).

use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use tracing::warn;
use vcp_crds::SyncedType;

use crate::error::Error;

use super::config::Config;

/// `(group, kind)` of the cluster-scoped kinds in the API groups that `referenced` (the
/// `(apiVersion, kind)` of a type's reference patches) name, discovered on the virtual API
/// server: a reference to one of them keeps its name ([`crate::patches`]). The whole group is
/// read because a reference's `kindPath` may name another kind of it (cert-manager's
/// `issuerRef.kind: ClusterIssuer` beside `Issuer`). A group that cannot be discovered counts
/// as having no cluster-scoped kind (its references are translated), with a log line.
pub(super) async fn cluster_scoped_kinds(
    client: &kube::Client,
    referenced: &[(String, String)],
) -> Vec<(String, String)> {
    let mut groups: Vec<String> = referenced
        .iter()
        .map(|(api_version, _)| match api_version.split_once('/') {
            Some((group, _)) => group.to_string(),
            None => String::new(),
        })
        .collect();
    groups.sort();
    groups.dedup();
    let mut scoped = Vec::new();
    for group in groups {
        match kube::discovery::oneshot::group(client, &group).await {
            Ok(api_group) => {
                for (resource, caps) in api_group.recommended_resources() {
                    if caps.scope == Scope::Cluster {
                        scoped.push((group.clone(), resource.kind));
                    }
                }
            }
            Err(error) => {
                warn!(%error, group = %group, "cannot discover the referenced API group; its kinds count as namespaced");
            }
        }
    }
    scoped
}

/// The `ApiResource` of a synced type and whether it has a status subresource, discovered on
/// the virtual API server; `syncedTypes[].resource` is used when discovery is not possible.
pub(super) async fn resolve(
    config: &Config,
    synced: &SyncedType,
) -> Result<(ApiResource, bool), Error> {
    resolve_on(
        &config.virtual_,
        "virtual",
        &synced.api_version,
        &synced.kind,
        synced.resource.as_deref(),
    )
    .await
}

/// The `ApiResource` of `api_version` / `kind` and whether it has a status subresource,
/// discovered with `client` (on the `cluster` it talks to); `resource` is used when discovery
/// is not possible. Only a namespaced type is accepted.
pub(super) async fn resolve_on(
    client: &Client,
    cluster: &'static str,
    api_version: &str,
    kind: &str,
    resource: Option<&str>,
) -> Result<(ApiResource, bool), Error> {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    match pinned_kind(client, &gvk).await {
        Ok((resource, caps)) => {
            if caps.scope != Scope::Namespaced {
                return Err(Error::ClusterScoped {
                    api_version: api_version.to_string(),
                    kind: kind.to_string(),
                });
            }
            let status = caps.subresources.iter().any(|(r, _)| r.plural == "status");
            Ok((resource, status))
        }
        Err(source) => match resource {
            Some(plural) => Ok((ApiResource::from_gvk_with_plural(&gvk, plural), true)),
            None => Err(Error::Discovery {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                cluster,
                source: Box::new(source),
            }),
        },
    }
}
