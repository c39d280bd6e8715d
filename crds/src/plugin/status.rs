//! The status of a `VClusterPlugin` ([`VClusterPluginStatus`]): its phase, its conditions (the
//! types, and how each is written: [`condition`]), its workload and what the runtime syncs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type: the plugin is installed (workload and RBAC); written by the operator.
pub const READY: &str = "Ready";

/// Condition type: the plugin's containers / volumes are in the vCluster's workload; written by
/// the operator.
pub const WORKLOAD_PATCHED: &str = "WorkloadPatched";

/// Condition type: the plugin's Role / ClusterRole and bindings exist; written by the operator.
pub const RBAC_READY: &str = "RBACReady";

/// Condition type: the embedded runtime syncs what the plugin declares; written by the runtime.
pub const RUNTIME_HEALTHY: &str = "RuntimeHealthy";

/// A condition of `type_` as the operator and the runtime write it: status `True` when `holds`,
/// else `False`; `lastTransitionTime` kept from `previous` (the condition as last written) when
/// its status is the same, `now` otherwise (Kubernetes API conventions: the last time the
/// condition went from one status to another). A `message` over the CRD's bound is cut to it
/// ([`crate::status_bounds::bounded_message`]).
pub fn condition(
    type_: &str,
    holds: bool,
    reason: impl Into<String>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let status = if holds { "True" } else { "False" };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: crate::status_bounds::bounded_message(message.into()),
        observed_generation,
        last_transition_time,
    }
}

/// Observed state, written by the operator (phase, conditions other than `RuntimeHealthy`,
/// workload) and by the runtime (`syncedObjects`, `syncedTotal`, `RuntimeHealthy`), each with
/// server-side apply under its own field manager. Every list and string of it is bounded
/// (`maxItems`, `maxLength`), whoever writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::paragraphs)]
pub struct VClusterPluginStatus {
    /// `metadata.generation` the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle phase: `Pending`, `Installing`, `Ready`, `Degraded`, `Failed`, `Terminating`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The plugin image, or `embedded` (shown in the RUNTIME column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub runtime: Option<String>,
    /// Conditions `Ready`, `WorkloadPatched`, `RBACReady`, `RuntimeHealthy`, keyed by type; at
    /// most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = crate::status_bounds::bounded_conditions, extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The vCluster workload the plugin is installed into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRef>,
    /// Objects in sync per type, reported by the runtime; at most 64 kinds (the runtime's
    /// `RuntimeHealthy` message says how many more it left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::status_bounds::MAX_SYNCED_OBJECTS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["apiVersion", "kind"]))]
    pub synced_objects: Vec<SyncedObjects>,
    /// Sum of `syncedObjects[].count` (shown in the SYNCED column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_total: Option<i64>,
}

/// Lifecycle phase of a plugin.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Accepted, not yet acted on.
    Pending,
    /// Being installed into the workload.
    Installing,
    /// Installed; `Ready=True`.
    Ready,
    /// Installed, but something is wrong at run time.
    Degraded,
    /// Cannot be installed; see the `Ready` condition.
    Failed,
    /// Being removed.
    Terminating,
}

/// The vCluster workload a plugin is installed into.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkloadRef {
    /// `StatefulSet` or `Deployment`.
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Name of the workload.
    #[schemars(length(max = 253))]
    pub name: String,
}

/// Count of objects in sync for one type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncedObjects {
    /// `group/version` of the type.
    #[schemars(length(max = 317))]
    pub api_version: String,
    /// Kind of the type.
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Objects whose host copy matches the virtual object.
    #[schemars(range(min = 0))]
    pub count: i64,
    /// Host objects of the same name that this vCluster does not manage (never touched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub conflicts: Option<i64>,
}
