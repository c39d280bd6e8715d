//! vCluster's `mappings.byName` of a `FromHost` type: which host objects are copied into the
//! virtual cluster, and under which virtual namespace and name ([`FromHostMapping`]).
//!
//! The rule reproduced is vCluster v0.30.0's (`config.FromHostMappings` in `config/config.go`,
//! its matching in `pkg/syncer/translator/from_config_translator.go`, `matchesHostObject`, and
//! its validation in `pkg/config/validation.go`, `validateFromHostMappingEntry`). Keys name host
//! objects, values virtual ones:
//!
//! | key | value | host object → virtual object |
//! | --- | --- | --- |
//! | `ns/name` | `vns/vname` | that one object, renamed |
//! | `ns/name` | `vns/*` | that one object, same name |
//! | `ns/*` | `vns/*` | every object of `ns`, same names |
//! | `/name` | `vns/vname` | that object of the vCluster's host namespace |
//! | `""` | `vns` or `vns/*` | every object of the vCluster's host namespace |
//!
//! and a host object is matched in that order (the exact name first, then `ns/*`, then `/name`,
//! then `""`), as vCluster matches it.
//!
//! What differs on purpose: the runtime watches only the vCluster's host namespace (a Role
//! suffices), so every key must name that namespace (`ns` equal to
//! it, or the `/name` and `""` forms, which mean it); [`FromHostMapping::new`] refuses any other
//! ([`MappingError::ForeignNamespace`]), and so do the operator (`Ready=False`) and the
//! requester admission policy. No mapping at all is the identity mapping
//! (`"<host namespace>/*": "<host namespace>/*"`), the runtime's behaviour before mappings.

use std::collections::BTreeMap;
use std::fmt;

/// A refused `mappings.byName` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappingError {
    /// The key names a host namespace other than the vCluster's: the runtime never reads
    /// another namespace.
    ForeignNamespace {
        /// The key as written.
        key: String,
        /// The vCluster's host namespace.
        host_namespace: String,
    },
    /// The entry is not of one of the shapes in the module docs.
    Malformed {
        /// The key as written.
        key: String,
        /// The value as written.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl fmt::Display for MappingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappingError::ForeignNamespace {
                key,
                host_namespace,
            } => write!(
                f,
                "mappings.byName key {key:?} names a host namespace other than the vCluster's ({host_namespace}); a mapping may only read the vCluster's host namespace"
            ),
            MappingError::Malformed { key, value, why } => write!(
                f,
                "mappings.byName entry {key:?}: {value:?} is malformed: {why}"
            ),
        }
    }
}

impl std::error::Error for MappingError {}

/// Where a virtual object comes from, read from a mapping value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// `vns/*` (or `vns` for the `""` key): the host object's own name in `vns`.
    SameName(String),
    /// `vns/vname`.
    Named(String, String),
}

impl Target {
    fn resolve(&self, host_name: &str) -> (String, String) {
        match self {
            Target::SameName(ns) => (ns.clone(), host_name.to_string()),
            Target::Named(ns, name) => (ns.clone(), name.clone()),
        }
    }
}

/// The `mappings.byName` of one `FromHost` type, checked against the vCluster's host namespace
/// (see the module docs): [`FromHostMapping::virtual_target`] of a host object's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FromHostMapping {
    host_namespace: String,
    /// `ns/name` keys, by host name.
    by_name: BTreeMap<String, Target>,
    /// The `ns/*` key (at most one can name the host namespace).
    all: Option<Target>,
    /// `/name` keys, by host name (matched after `ns/*`, as in vCluster).
    by_slash_name: BTreeMap<String, Target>,
    /// The `""` key.
    host_namespace_all: Option<Target>,
}

impl FromHostMapping {
    /// The identity mapping of `host_namespace`: every object into the virtual namespace of the
    /// same name, under the same name (no `mappings` given).
    pub fn identity(host_namespace: &str) -> Self {
        Self {
            host_namespace: host_namespace.to_string(),
            by_name: BTreeMap::new(),
            all: Some(Target::SameName(host_namespace.to_string())),
            by_slash_name: BTreeMap::new(),
            host_namespace_all: None,
        }
    }

    /// The mapping `by_name` (vCluster's `mappings.byName`) of the vCluster whose host namespace
    /// is `host_namespace`; the identity mapping when `by_name` is empty.
    ///
    /// # Errors
    /// [`MappingError::ForeignNamespace`] for a key naming another host namespace;
    /// [`MappingError::Malformed`] for an entry of no shape of the module docs (vCluster's
    /// `validateFromHostMappingEntry`: at most one `/` on each side, `*` only as a whole name,
    /// `ns/*` only with `vns/*`, a value without `/` only for the `""` key, non-empty names).
    pub fn new(
        host_namespace: &str,
        by_name: &BTreeMap<String, String>,
    ) -> Result<Self, MappingError> {
        if by_name.is_empty() {
            return Ok(Self::identity(host_namespace));
        }
        let mut mapping = Self {
            host_namespace: host_namespace.to_string(),
            by_name: BTreeMap::new(),
            all: None,
            by_slash_name: BTreeMap::new(),
            host_namespace_all: None,
        };
        for (key, value) in by_name {
            let malformed = |why| MappingError::Malformed {
                key: key.clone(),
                value: value.clone(),
                why,
            };
            if key.matches('/').count() > 1 || value.matches('/').count() > 1 {
                return Err(malformed(
                    "each side is NAMESPACE/NAME, NAMESPACE/*, /NAME or \"\"",
                ));
            }
            let target = match value.split_once('/') {
                Some(("", _)) => {
                    return Err(malformed("the value needs a virtual namespace"));
                }
                Some((ns, "*")) => Target::SameName(ns.to_string()),
                Some((_, "")) => return Err(malformed("the value needs a name or *")),
                Some((_, name)) if name.contains('*') => {
                    return Err(malformed("* is only a whole name"));
                }
                Some((ns, name)) => Target::Named(ns.to_string(), name.to_string()),
                None if key.is_empty() && !value.is_empty() && !value.contains('*') => {
                    Target::SameName(value.clone())
                }
                None => {
                    return Err(malformed(
                        "a value without / (a whole virtual namespace) is only for the \"\" key",
                    ));
                }
            };
            if key.is_empty() {
                if matches!(target, Target::Named(..)) {
                    return Err(malformed(
                        "the \"\" key maps a whole namespace: its value is NAMESPACE or NAMESPACE/*",
                    ));
                }
                mapping.host_namespace_all = Some(target);
                continue;
            }
            let Some((ns, name)) = key.split_once('/') else {
                return Err(malformed(
                    "each side is NAMESPACE/NAME, NAMESPACE/*, /NAME or \"\"",
                ));
            };
            if !ns.is_empty() && ns != host_namespace {
                return Err(MappingError::ForeignNamespace {
                    key: key.clone(),
                    host_namespace: host_namespace.to_string(),
                });
            }
            match name {
                "" => return Err(malformed("the key needs a name or *")),
                "*" if ns.is_empty() => return Err(malformed("/* is written \"\"")),
                "*" => {
                    if matches!(target, Target::Named(..)) {
                        return Err(malformed(
                            "a key matching every object of a namespace needs a value NAMESPACE/*",
                        ));
                    }
                    mapping.all = Some(target);
                }
                name if name.contains('*') => return Err(malformed("* is only a whole name")),
                name if ns.is_empty() => {
                    mapping.by_slash_name.insert(name.to_string(), target);
                }
                name => {
                    mapping.by_name.insert(name.to_string(), target);
                }
            }
        }
        Ok(mapping)
    }

    /// The vCluster's host namespace, the only one read.
    pub fn host_namespace(&self) -> &str {
        &self.host_namespace
    }

    /// `(virtual namespace, virtual name)` of the host object `host_name` (in the vCluster's
    /// host namespace), or `None` when no entry maps it (vCluster's `matchesHostObject`: the
    /// exact key first, then `ns/*`, then `/name`, then `""`).
    pub fn virtual_target(&self, host_name: &str) -> Option<(String, String)> {
        self.by_name
            .get(host_name)
            .or(self.all.as_ref())
            .or_else(|| self.by_slash_name.get(host_name))
            .or(self.host_namespace_all.as_ref())
            .map(|t| t.resolve(host_name))
    }

    /// Every virtual namespace an entry names (the namespaces the runtime may write into).
    pub fn virtual_namespaces(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .by_name
            .values()
            .chain(&self.all)
            .chain(self.by_slash_name.values())
            .chain(&self.host_namespace_all)
            .map(|t| match t {
                Target::SameName(ns) | Target::Named(ns, _) => ns.clone(),
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The host name whose [`Self::virtual_target`] is `virtual_namespace/virtual_name`, if
    /// any (to find the host object a virtual object stands in the way of).
    pub fn host_source(&self, virtual_namespace: &str, virtual_name: &str) -> Option<String> {
        let wanted = (virtual_namespace.to_string(), virtual_name.to_string());
        let exact = self
            .by_name
            .iter()
            .chain(&self.by_slash_name)
            .find_map(|(host, t)| {
                (t.resolve(host) == wanted && self.virtual_target(host).as_ref() == Some(&wanted))
                    .then(|| host.clone())
            });
        exact.or_else(|| {
            let candidate = virtual_name.to_string();
            (self.virtual_target(&candidate) == Some(wanted)).then_some(candidate)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(entries: &[(&str, &str)]) -> Result<FromHostMapping, MappingError> {
        let by_name = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        FromHostMapping::new("vcluster", &by_name)
    }

    fn target(ns: &str, name: &str) -> Option<(String, String)> {
        Some((ns.to_string(), name.to_string()))
    }

    /// The cases of vCluster v0.30.0's `TestMatches`
    /// (`pkg/syncer/translator/from_config_translator_test.go`) whose keys name the vCluster's
    /// host namespace (`vcluster`), with their expected virtual objects; the cases whose keys
    /// name other host namespaces are refused here (next test).
    #[test]
    fn host_objects_map_as_in_vcluster() {
        // "all from vCluster host namespace to another namespace in virtual"
        let m = mapping(&[("", "my-ns")]).unwrap();
        assert_eq!(m.virtual_target("my-cm"), target("my-ns", "my-cm"));
        // "a few objects from vcluster's namespace"
        let m = mapping(&[
            ("/my-cm", "my-ns-2/my-cm-2"),
            ("/my-cm-2", "my-ns-3/my-cm-3"),
        ])
        .unwrap();
        assert_eq!(m.virtual_target("my-cm"), target("my-ns-2", "my-cm-2"));
        assert_eq!(m.virtual_target("my-cm-2"), target("my-ns-3", "my-cm-3"));
        assert_eq!(m.virtual_target("my-cm-3"), None);
        // "vcluster's namespace match all but for several configmaps" (its entries for this
        // namespace)
        let m = mapping(&[
            ("", "my-new-ns"),
            ("/my-cm-5", "my-virtual-namespace/my-cm-5"),
            ("/my-cm-6", "my-virtual-namespace6/my-cm-6"),
        ])
        .unwrap();
        assert_eq!(
            m.virtual_target("my-cm-6"),
            target("my-virtual-namespace6", "my-cm-6")
        );
        assert_eq!(m.virtual_target("other"), target("my-new-ns", "other"));
        // "mirror" and "change name and namespace", with the host namespace `vcluster`
        let m = mapping(&[
            ("vcluster/my-cm", "my-ns/my-cm"),
            ("vcluster/my-cm-2", "my-ns/my-cm-3"),
        ])
        .unwrap();
        assert_eq!(m.virtual_target("my-cm"), target("my-ns", "my-cm"));
        assert_eq!(m.virtual_target("my-cm-2"), target("my-ns", "my-cm-3"));
        // "no match"
        assert_eq!(m.virtual_target("my-cm-4"), None);
        // "match all in namespace"
        let m = mapping(&[("vcluster/*", "my-ns-2/*")]).unwrap();
        assert_eq!(m.virtual_target("my-cm"), target("my-ns-2", "my-cm"));
        // a single name mapped to `vns/*` keeps its name (matchesHostObject: name == "*")
        let m = mapping(&[("vcluster/a", "x/*")]).unwrap();
        assert_eq!(m.virtual_target("a"), target("x", "a"));
        assert_eq!(m.virtual_target("b"), None);
    }

    /// vCluster's order (`matchesHostObject`): `ns/name`, then `ns/*`, then `/name`, then `""`.
    #[test]
    fn the_exact_key_wins_then_the_namespace_then_slash_name_then_the_empty_key() {
        let m = mapping(&[
            ("vcluster/x", "c/z"),
            ("vcluster/*", "a/*"),
            ("/x", "b/y"),
            ("/w", "b/w2"),
            ("", "d"),
        ])
        .unwrap();
        assert_eq!(m.virtual_target("x"), target("c", "z"));
        assert_eq!(m.virtual_target("w"), target("a", "w"));
        let m = mapping(&[("/w", "b/w2"), ("", "d")]).unwrap();
        assert_eq!(m.virtual_target("w"), target("b", "w2"));
        assert_eq!(m.virtual_target("v"), target("d", "v"));
        assert_eq!(m.virtual_namespaces(), ["b", "d"]);
        assert_eq!(m.host_source("b", "w2").as_deref(), Some("w"));
        assert_eq!(m.host_source("d", "v").as_deref(), Some("v"));
        assert_eq!(m.host_source("d", "w").as_deref(), None, "w goes to b/w2");
        assert_eq!(m.host_source("e", "v"), None);
    }

    #[test]
    fn no_mapping_is_the_identity_of_the_host_namespace() {
        let m = FromHostMapping::new("vc-ns", &BTreeMap::new()).unwrap();
        assert_eq!(m, FromHostMapping::identity("vc-ns"));
        assert_eq!(m.virtual_target("car"), target("vc-ns", "car"));
        assert_eq!(m.virtual_namespaces(), ["vc-ns"]);
        assert_eq!(m.host_source("vc-ns", "car").as_deref(), Some("car"));
        assert_eq!(m.host_source("other", "car"), None);
    }

    #[test]
    fn keys_naming_another_host_namespace_are_refused() {
        for key in [
            "kube-system/*",
            "kube-system/token",
            "vcluster-other/*",
            "vclusters/a",
        ] {
            assert_eq!(
                mapping(&[(key, "a/*")]),
                Err(MappingError::ForeignNamespace {
                    key: key.to_string(),
                    host_namespace: "vcluster".into()
                }),
                "{key}"
            );
        }
    }

    /// The shapes vCluster's `validateFromHostSyncMappings` / `validateFromHostMappingEntry`
    /// refuse.
    #[test]
    fn malformed_entries_are_refused() {
        for (key, value) in [
            ("vcluster/*", "a/b"),
            ("vcluster/a*", "a/*"),
            ("vcluster/a", "a/b*"),
            ("vcluster/x", "a"),
            ("vcluster/a/b", "x/y"),
            ("vcluster/a", "x/y/z"),
            ("vcluster", "x/y"),
            ("", "a/b"),
            ("", ""),
            ("/*", "a/*"),
            ("vcluster/", "a/*"),
            ("vcluster/a", "/a"),
            ("vcluster/a", "a/"),
        ] {
            assert!(
                matches!(
                    mapping(&[(key, value)]),
                    Err(MappingError::Malformed { .. })
                ),
                "{key}: {value}"
            );
        }
    }
}
