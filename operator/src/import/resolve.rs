//! The kind, version and scope of `customResources` keys, from the host API server's discovery.
//!
//! vCluster's key is the CRD's name, `<resource>.<group>` (`certificates.cert-manager.io`);
//! vCluster reads that CRD from the host cluster (its `pkg/util/translate`
//! `EnsureCRDFromPhysicalCluster` gets the CRD by that name and copies it into the virtual
//! cluster). The import asks the host the way `kubectl get <resource>.<group>` resolves the
//! name: the group's preferred version in discovery, and in it the resource of that plural name,
//! which gives the kind, the scope and whether a `status` subresource exists. Reading discovery
//! needs no permission beyond what every authenticated user has (`system:discovery`).

use std::collections::BTreeMap;

use kube::Client;
use kube::discovery::{Discovery, Scope};

use super::custom_resources::{ResolvedType, split_key};

/// The types the host serves for `keys` (such as `certificates.cert-manager.io`); a key the
/// host does not serve is absent from the answer.
///
/// # Errors
/// The API server's error when discovery fails.
pub async fn resolve(
    client: Client,
    keys: &[String],
) -> Result<BTreeMap<String, ResolvedType>, kube::Error> {
    let wanted: Vec<(&String, &str, &str)> = keys
        .iter()
        .filter_map(|k| split_key(k).map(|(r, g)| (k, r, g)))
        .collect();
    let mut groups: Vec<&str> = wanted.iter().map(|(_, _, g)| *g).collect();
    groups.sort_unstable();
    groups.dedup();
    let discovery = Discovery::new(client).filter(&groups).run().await?;
    let mut out = BTreeMap::new();
    for (key, resource, group) in wanted {
        let Some(api_group) = discovery.groups().find(|g| g.name() == group) else {
            continue;
        };
        let version = api_group.preferred_version_or_latest();
        let found = api_group
            .versioned_resources(version)
            .into_iter()
            .find(|(ar, _)| ar.plural == resource);
        if let Some((ar, caps)) = found {
            out.insert(
                key.clone(),
                ResolvedType {
                    api_version: ar.api_version.clone(),
                    kind: ar.kind.clone(),
                    resource: ar.plural.clone(),
                    namespaced: caps.scope == Scope::Namespaced,
                    status_subresource: caps.subresources.iter().any(|(s, _)| s.plural == "status"),
                },
            );
        }
    }
    Ok(out)
}
