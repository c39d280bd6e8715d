//! The fields of the operator's tracing spans: one span per reconcile
//! ([`crate::controller::reconcile`], fields `plugin` and `vcluster`) and one per write
//! ([`crate::writes`], [`crate::vcluster::act`], [`crate::finalizer`], [`crate::sweep`]: fields
//! `kind` and `object`). The binary's JSON log lines carry the fields of the current span
//! (`span`) and of every span it is in (`spans`), so a log site names neither the plugin nor
//! the object itself.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

/// An object's key as the spans show it: `namespace/name`, or `name` when cluster-scoped.
#[derive(Clone, Copy, Debug)]
pub struct Key<'a> {
    namespace: Option<&'a str>,
    name: &'a str,
}

impl<'a> Key<'a> {
    /// The key `namespace/name` (`name` alone when `namespace` is empty).
    pub fn new(namespace: &'a str, name: &'a str) -> Self {
        Key {
            namespace: (!namespace.is_empty()).then_some(namespace),
            name,
        }
    }

    /// The key of `obj` from its metadata.
    pub fn of<K: Resource>(obj: &'a K) -> Self {
        Self::of_meta(obj.meta())
    }

    /// The key of the object of `meta`.
    pub fn of_meta(meta: &'a ObjectMeta) -> Self {
        Key {
            namespace: meta.namespace.as_deref().filter(|n| !n.is_empty()),
            name: meta.name.as_deref().unwrap_or_default(),
        }
    }
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.namespace {
            Some(namespace) => write!(f, "{namespace}/{}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// The Kubernetes kind of `K` (`Role`, `ClusterRoleBinding`, ...), the `kind` field of a
/// write's span.
pub fn kind<K: Resource>() -> String
where
    K::DynamicType: Default,
{
    K::kind(&Default::default()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};

    #[test]
    fn keys_and_kinds() {
        assert_eq!(Key::new("team-a", "vc").to_string(), "team-a/vc");
        assert_eq!(Key::new("", "vc").to_string(), "vc");
        let role = Role {
            metadata: ObjectMeta {
                namespace: Some("team-a".into()),
                name: Some("r".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(Key::of(&role).to_string(), "team-a/r");
        let cluster_role = ClusterRole {
            metadata: ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(Key::of(&cluster_role).to_string(), "c");
        assert_eq!(kind::<Role>(), "Role");
        assert_eq!(kind::<ClusterRole>(), "ClusterRole");
    }
}
