//! The reasons of the conditions and Events the operator and the runtime write on a
//! `VClusterPlugin` (the README, "Status and condition reasons"), as one
//! type: [`Reason`]. It serializes as the reason string the API carries (`"PolicyDenied"`), so
//! the conditions and Events are unchanged; code compares reasons as values of this type, not
//! as strings spread over the crates.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A condition or Event reason written by the operator or the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Reason {
    /// An operator condition that holds.
    Installed,
    /// The `Ready` condition while the finalizer cleans up.
    Terminating,
    /// The operator's conditions when the vCluster has neither a StatefulSet nor a Deployment.
    VClusterNotFound,
    /// `Ready` while `RuntimeHealthy` was reported for an older generation of the spec: the
    /// runtime has not yet started the syncers of the current one.
    RuntimeUpdating,
    /// `Ready=False`: the plugin's target workload is not a vCluster.
    NotAVCluster,
    /// `Ready=False`: the policy refuses the plugin's rules, container or hooks.
    PolicyDenied,
    /// `Ready=False`: the plugin names a type the API server does not serve.
    UnknownType,
    /// `Ready=False`: the plugin syncs or hooks a cluster-scoped type (the runtime syncs
    /// namespaced objects into the vCluster's host namespace, and a Role cannot grant access to
    /// a cluster-scoped resource).
    ClusterScopedType,
    /// `Ready=False`: `rbac.mode: PatchVClusterRoles` and no Role is bound to the vCluster's
    /// service account.
    VClusterRoleNotFound,
    /// `Ready=False`: `rbac.mode: PatchVClusterRoles` and the vCluster's Role is bound to some
    /// subject besides the vCluster's service account (appending to it would grant the plugin's
    /// rules to them too).
    SharedVClusterRole,
    /// `Ready=False`: the plugin's container name or a synced type is taken (by a container
    /// the operator did not add, or by an older plugin).
    Conflict,
    /// `Ready=False`: the plugin's part would make the workload too large to store.
    TooLarge,
    /// `Ready=False`: the plugin's configuration cannot be used: a v1 plugin's `spec.config`
    /// cannot be rendered as YAML, or a `syncedTypes[].patches[]` path does not parse.
    InvalidConfig,
    /// `Ready=False`: the API server refuses the plugin's part of the workload.
    InvalidWorkload,
    /// `RuntimeHealthy=True`: every synced type is listed and no object is failing.
    Syncing,
    /// `RuntimeHealthy=False`: a synced type is still being listed.
    Starting,
    /// `RuntimeHealthy=False`: a synced type cannot be discovered or watched (retried).
    TypeUnavailable,
    /// `RuntimeHealthy=False`: some objects failed to sync and are being retried.
    SyncErrors,
    /// `RuntimeHealthy=False`, and the runtime's `Warning` Event once per object and patch: a
    /// `syncedTypes[].patches[]` entry failed on an object (an expression threw or ran past its
    /// time or memory bound, a reference or selector has the wrong shape). That object is not
    /// written and is retried with backoff; the others keep syncing.
    PatchFailed,
    /// The runtime's `Warning` Event (and `RuntimeHealthy=False`) for a host object of a
    /// translated name that the vCluster does not manage (or a virtual object in the way of a
    /// `FromHost` copy).
    HostObjectConflict,
    /// The runtime's `Warning` Event, once per pod and set of fields, when pod hooks would
    /// change fields of an existing host pod that the API server refuses to change
    /// (Kubernetes' `ValidatePodUpdate`): those changes are skipped, the labels and
    /// annotations still written.
    ImmutablePodFields,
    /// The runtime's `Normal` Event when it deleted a host copy because its virtual object no
    /// longer matches `syncedTypes[].selector`.
    SelectorNoLongerMatches,
    /// `Ready=False`: a `FromHost` type's `mappings.byName` names a host namespace other than
    /// the vCluster's (the plugin's own): the runtime only ever reads its own host namespace.
    ForeignNamespace,
    /// The runtime's `Warning` Event, once per synced object, when the name at a `produced`
    /// entry's `namePath` in the host copy is not the host name of the virtual object's value
    /// there (no `reference` patch translated it): that host object is not brought back.
    ProducedNameRefused,
    /// An object the operator or the runtime could not decode (`vcp_crds::tolerant`): for a
    /// plugin, the operator's `Ready=False` when the plugin's spec or metadata cannot be read;
    /// for a synced object, the runtime's `Warning` Event and the message of `RuntimeHealthy`
    /// naming it. That object is skipped; every other one goes on.
    Undecodable,
    /// `Ready=False`: with the plugin's container the vCluster's pods would break the
    /// namespace's LimitRange or ResourceQuota, or no node could hold them; nothing is
    /// installed for it.
    ResourcesExceeded,
    /// `RuntimeHealthy=False` and the runtime's `Warning` Event: the runtime cannot listen on
    /// its `/metrics` and `/healthz` address (another container of the pod holds the port); it
    /// syncs on without them and tries the address again.
    MetricsUnavailable,
    /// `Ready=False` (phase `Degraded`) and a `Warning` Event: a pod of the vCluster that carries
    /// the plugin's container cannot run it, and the kubelet or the scheduler says why (a pull
    /// error, `CrashLoopBackOff`, a failed init container, `OOMKilled`, `Unschedulable`); the
    /// message names the pod, the container, and the kubelet's own reason and message.
    RolloutFailed,
    /// `Ready=False`: an embedded plugin asks for the sidecar (`version: v1`) and a
    /// `CreatePhysical` pod hook of it changes what Kubernetes does not let change on an
    /// existing pod, so the hook could not take effect; the message names each such change.
    /// Nothing is installed for it.
    HookCannotTakeEffect,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 29] = [
        Reason::Installed,
        Reason::Terminating,
        Reason::VClusterNotFound,
        Reason::RuntimeUpdating,
        Reason::NotAVCluster,
        Reason::PolicyDenied,
        Reason::UnknownType,
        Reason::ClusterScopedType,
        Reason::VClusterRoleNotFound,
        Reason::SharedVClusterRole,
        Reason::Conflict,
        Reason::TooLarge,
        Reason::InvalidConfig,
        Reason::InvalidWorkload,
        Reason::Syncing,
        Reason::Starting,
        Reason::TypeUnavailable,
        Reason::SyncErrors,
        Reason::PatchFailed,
        Reason::HostObjectConflict,
        Reason::ImmutablePodFields,
        Reason::SelectorNoLongerMatches,
        Reason::ForeignNamespace,
        Reason::ProducedNameRefused,
        Reason::Undecodable,
        Reason::ResourcesExceeded,
        Reason::MetricsUnavailable,
        Reason::RolloutFailed,
        Reason::HookCannotTakeEffect,
    ];

    /// The reason as the API carries it (CamelCase, the variant's name).
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Installed => "Installed",
            Reason::Terminating => "Terminating",
            Reason::VClusterNotFound => "VClusterNotFound",
            Reason::RuntimeUpdating => "RuntimeUpdating",
            Reason::NotAVCluster => "NotAVCluster",
            Reason::PolicyDenied => "PolicyDenied",
            Reason::UnknownType => "UnknownType",
            Reason::ClusterScopedType => "ClusterScopedType",
            Reason::VClusterRoleNotFound => "VClusterRoleNotFound",
            Reason::SharedVClusterRole => "SharedVClusterRole",
            Reason::Conflict => "Conflict",
            Reason::TooLarge => "TooLarge",
            Reason::InvalidConfig => "InvalidConfig",
            Reason::InvalidWorkload => "InvalidWorkload",
            Reason::Syncing => "Syncing",
            Reason::Starting => "Starting",
            Reason::TypeUnavailable => "TypeUnavailable",
            Reason::SyncErrors => "SyncErrors",
            Reason::PatchFailed => "PatchFailed",
            Reason::HostObjectConflict => "HostObjectConflict",
            Reason::ImmutablePodFields => "ImmutablePodFields",
            Reason::SelectorNoLongerMatches => "SelectorNoLongerMatches",
            Reason::ForeignNamespace => "ForeignNamespace",
            Reason::ProducedNameRefused => "ProducedNameRefused",
            Reason::Undecodable => "Undecodable",
            Reason::ResourcesExceeded => "ResourcesExceeded",
            Reason::MetricsUnavailable => "MetricsUnavailable",
            Reason::RolloutFailed => "RolloutFailed",
            Reason::HookCannotTakeEffect => "HookCannotTakeEffect",
        }
    }

    /// The reason a condition carries as `s`, when it is one of these.
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<Reason> for String {
    fn from(r: Reason) -> String {
        r.as_str().to_string()
    }
}

impl PartialEq<Reason> for str {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Reason> for &str {
    fn eq(&self, other: &Reason) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Reason> for String {
    fn eq(&self, other: &Reason) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Reason {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_serialize_as_the_strings_the_api_carries() {
        // The strings of the README's table, written out independently.
        let expected = [
            "Installed",
            "Terminating",
            "VClusterNotFound",
            "RuntimeUpdating",
            "NotAVCluster",
            "PolicyDenied",
            "UnknownType",
            "ClusterScopedType",
            "VClusterRoleNotFound",
            "SharedVClusterRole",
            "Conflict",
            "TooLarge",
            "InvalidConfig",
            "InvalidWorkload",
            "Syncing",
            "Starting",
            "TypeUnavailable",
            "SyncErrors",
            "PatchFailed",
            "HostObjectConflict",
            "ImmutablePodFields",
            "SelectorNoLongerMatches",
            "ForeignNamespace",
            "ProducedNameRefused",
            "Undecodable",
            "ResourcesExceeded",
            "MetricsUnavailable",
            "RolloutFailed",
            "HookCannotTakeEffect",
        ];
        assert_eq!(Reason::ALL.len(), expected.len());
        for (r, s) in Reason::ALL.into_iter().zip(expected) {
            assert_eq!(r.as_str(), s);
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(s));
            assert_eq!(
                serde_json::from_value::<Reason>(serde_json::json!(s)).unwrap(),
                r
            );
            assert_eq!(Reason::parse(s), Some(r));
            assert_eq!(String::from(r), s);
        }
        assert_eq!(Reason::parse("Other"), None);
    }
}
