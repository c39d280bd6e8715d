//! A `reference` patch: the referenced name becomes its host name on the way down
//! (vCluster's single-namespace `HostName`), and a host name of this vCluster the virtual name
//! again on the way up; a cluster-scoped kind keeps its name (the rules: [`super`]).

use serde_json::Value;
use vcp_crds::patch_path::{Location, PatchPath};

use crate::translate::host_name;

use super::{Compiled, PatchError, Patches, Reference};

impl Patches {
    /// The referenced object at `location` of `target`: the locations of its name, and of its
    /// namespace, kind and apiVersion when their paths are found.
    fn reference_parts(
        patch: &Compiled,
        reference: &Reference,
        location: &Location,
        target: &Value,
    ) -> Result<Option<Parts>, PatchError> {
        let Some(value) = location.get(target) else {
            return Ok(None);
        };
        let base = match value {
            Value::Null => return Ok(None),
            Value::String(_) => Location::default(),
            Value::Object(_) => location.clone(),
            _ => {
                return Err(Self::wrong_shape(
                    patch,
                    "reference",
                    location,
                    "a reference is a name (a string) or an object holding one",
                ));
            }
        };
        let name = match (value, &reference.name_path) {
            (Value::String(_), _) => Some(location.clone()),
            (_, Some(name_path)) => base.join(name_path, target).into_iter().next(),
            (_, None) => {
                return Err(Self::wrong_shape(
                    patch,
                    "reference",
                    location,
                    "the value is an object: set reference.namePath to the name inside it",
                ));
            }
        };
        let Some(name) = name else {
            return Ok(None);
        };
        let relative = |path: &Option<PatchPath>| {
            path.as_ref()
                .and_then(|p| base.join(p, target).into_iter().next())
                .filter(|l| l.get(target).is_some_and(Value::is_string))
        };
        Ok(Some(Parts {
            name,
            namespace: relative(&reference.namespace_path),
            kind: relative(&reference.kind_path),
            api_version: relative(&reference.api_version_path),
        }))
    }

    fn is_cluster_scoped(&self, reference: &Reference, parts: &Parts, target: &Value) -> bool {
        let read = |l: &Option<Location>| {
            l.as_ref()
                .and_then(|l| l.get(target))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let kind = read(&parts.kind).unwrap_or_else(|| reference.kind.clone());
        let api_version = read(&parts.api_version).unwrap_or_else(|| reference.api_version.clone());
        let group = match api_version.split_once('/') {
            Some((group, _)) => group.to_string(),
            // a bare group (cert-manager's issuerRef.group) or a core version (`v1`)
            None if api_version.contains('.') => api_version,
            None => String::new(),
        };
        self.cluster_scoped.contains(&(group, kind))
    }

    pub(super) fn reference_down(
        &self,
        patch: &Compiled,
        reference: &Reference,
        namespace: &str,
        host: &mut Value,
    ) -> Result<(), PatchError> {
        for location in patch.path.locate(host) {
            let Some(parts) = Self::reference_parts(patch, reference, &location, host)? else {
                continue;
            };
            if self.is_cluster_scoped(reference, &parts, host) {
                continue;
            }
            let Some(name) = parts.name.get(host).cloned() else {
                continue;
            };
            let Value::String(name) = name else {
                return Err(Self::wrong_shape(
                    patch,
                    "reference",
                    &parts.name,
                    "the referenced name is not a string",
                ));
            };
            let referenced_namespace = parts
                .namespace
                .as_ref()
                .and_then(|l| l.get(host))
                .and_then(Value::as_str)
                .unwrap_or(namespace)
                .to_string();
            let translated = host_name(&name, &referenced_namespace, &self.vcluster);
            parts.name.set(host, Some(Value::String(translated)));
            if let Some(ns) = &parts.namespace {
                ns.set(host, Some(Value::String(self.host_namespace.clone())));
            }
        }
        Ok(())
    }

    pub(super) fn reference_up(
        &self,
        patch: &Compiled,
        reference: &Reference,
        namespace: &str,
        virtual_obj: &Value,
        target: &mut Value,
    ) -> Result<(), PatchError> {
        for location in patch.path.locate(target) {
            let Some(parts) = Self::reference_parts(patch, reference, &location, target)? else {
                continue;
            };
            if self.is_cluster_scoped(reference, &parts, target) {
                continue;
            }
            let Some(Value::String(name)) = parts.name.get(target).cloned() else {
                continue;
            };
            // the virtual object's own value at the same place, when it names this host object
            let known = parts
                .name
                .get(virtual_obj)
                .and_then(Value::as_str)
                .filter(|candidate| {
                    let ns = parts
                        .namespace
                        .as_ref()
                        .and_then(|l| l.get(virtual_obj))
                        .and_then(Value::as_str)
                        .unwrap_or(namespace);
                    host_name(candidate, ns, &self.vcluster) == name
                })
                .map(|candidate| {
                    let ns = parts
                        .namespace
                        .as_ref()
                        .and_then(|l| l.get(virtual_obj))
                        .and_then(Value::as_str)
                        .unwrap_or(namespace);
                    (candidate.to_string(), ns.to_string())
                });
            let Some((virtual_name, virtual_namespace)) =
                known.or_else(|| self.split_host_name(&name))
            else {
                continue; // not a host name of this vCluster: kept as it is
            };
            parts.name.set(target, Some(Value::String(virtual_name)));
            if let Some(ns) = &parts.namespace {
                ns.set(target, Some(Value::String(virtual_namespace)));
            }
        }
        Ok(())
    }

    /// `<name>-x-<namespace>-x-<vcluster>` back to `(name, namespace)`, when `host` is exactly
    /// [`host_name`] of them (not shortened).
    fn split_host_name(&self, host: &str) -> Option<(String, String)> {
        let rest = host.strip_suffix(&format!("-x-{}", self.vcluster))?;
        let (name, namespace) = rest.rsplit_once("-x-")?;
        (host_name(name, namespace, &self.vcluster) == host)
            .then(|| (name.to_string(), namespace.to_string()))
    }
}

/// The locations of a referenced object's name, and of its namespace, kind and apiVersion
/// when their paths are found.
struct Parts {
    name: Location,
    namespace: Option<Location>,
    kind: Option<Location>,
    api_version: Option<Location>,
}
