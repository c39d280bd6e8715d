//! The operator's part of `VClusterPlugin.status`: `observedGeneration`, `phase`, `runtime`,
//! `workload` and the conditions `Ready`, `WorkloadPatched`, `RBACReady`.
//!
//! The rules: conditions carry `type/status/reason/message/lastTransitionTime/
//! observedGeneration`; `lastTransitionTime` moves only when `status` changes. The runtime
//! writes `RuntimeHealthy`, `syncedObjects` and `syncedTotal` under its own field manager;
//! the status is written with server-side apply on the status subresource and `conditions` is a
//! map-list keyed by `type`, so [`apply_body`] never includes the runtime's fields and never
//! removes them. [`needs_write`] compares desired and live so that a converged object gets no
//! status write.
//!
//! `Ready` and `phase` combine the operator's install with the runtime's `RuntimeHealthy`
//! ([`runtime_health`]; the README's "Status and condition reasons" and "Argo CD" hold the
//! same table, and `config/argocd/health.lua` gives Argo CD the same answer):
//!
//! | install | `RuntimeHealthy` | `Ready` (reason) | phase | Argo CD |
//! | --- | --- | --- | --- | --- |
//! | being deleted | any | `False` (`Terminating`) | `Terminating` | `Progressing` |
//! | vCluster missing | any | `False` (`VClusterNotFound`) | `Pending` | `Progressing` |
//! | refused | any | `False` (the refusal's reason) | `Failed` | `Degraded` |
//! | done, a pod of the vCluster cannot run it | any | `False` (`RolloutFailed`: the pod, the container, the kubelet's reason and message) | `Degraded` | `Degraded` |
//! | done | not reported | `True` (`Installed`) | `Ready` | `Healthy` |
//! | done | `True` | `True` (`Installed`) | `Ready` | `Healthy` |
//! | done | `False`, `Starting`, or `Unknown` | `False` (the runtime's reason) | `Installing` | `Progressing` |
//! | done | any, for an older generation | `False` (`RuntimeUpdating`) | `Installing` | `Progressing` |
//! | done | `False`, any other reason (`TypeUnavailable`, `PatchFailed`, `SyncErrors`, `HostObjectConflict`) | `False` (the runtime's reason and message) | `Degraded` | `Degraded` |
//!
//! "A pod cannot run it" is [`crate::rollout`]'s verdict over the vCluster's pods that carry the
//! plugin's container (a pull error, `CrashLoopBackOff`, a failed init container, `OOMKilled`,
//! `Unschedulable`), read after each install and again every [`crate::rollout::RECHECK`] for
//! [`crate::rollout::WATCHED_FOR`] after the workload was written.
//!
//! "Not reported" is `Ready=True` on purpose: a plugin with an `image` (a vcluster-sdk plugin)
//! never writes `RuntimeHealthy`, and the embedded runtime writes `Starting` within seconds of
//! its start. The operator re-reconciles on every change of the VClusterPlugin, status
//! included (its main watch has no predicate), so a new `RuntimeHealthy` is reflected in
//! `Ready` at once; a reconcile that changes nothing writes nothing ([`needs_write`]), so the
//! operator's own status write ends the loop.

use std::collections::HashMap;
use std::sync::Mutex;
use vcp_crds::Reason;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{Phase, VClusterPlugin, VClusterPluginStatus, WorkloadRef};

// The condition types and reasons are shared with the runtime and defined in `vcp_crds`;
// re-exported here for the operator's other modules.
pub use vcp_crds::{RBAC_READY, READY, RUNTIME_HEALTHY, WORKLOAD_PATCHED};

/// The conditions the operator owns; every other type (`RuntimeHealthy`) is the runtime's.
pub const OPERATOR_CONDITIONS: [&str; 3] = [READY, WORKLOAD_PATCHED, RBAC_READY];
/// `status.runtime` of a plugin without `image`.
pub const RUNTIME_EMBEDDED: &str = "embedded";

/// Result of one part of a reconcile: holds, or does not with a reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The part is done.
    Ok,
    /// The part is not done (reason in CamelCase, message for humans).
    Failed {
        /// Condition reason.
        reason: String,
        /// Condition message.
        message: String,
    },
}

impl Check {
    /// A failed check.
    pub fn failed(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Check::Failed {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// What a reconcile found out; [`desired`] turns it into status.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The workload the plugin targets, when it exists.
    pub workload: Option<WorkloadRef>,
    /// Whether the plugin's entries are in the workload.
    pub workload_patched: Check,
    /// Whether the plugin's RBAC objects are in place.
    pub rbac: Check,
    /// `Terminating`: the finalizer is cleaning up.
    pub terminating: bool,
    /// Why a pod of the vCluster cannot run the installed plugin ([`crate::rollout::Failure`],
    /// as its message), when one cannot; read after the install only.
    pub rollout: Option<String>,
}

/// What the runtime's `RuntimeHealthy` condition says about an installed plugin (see the
/// module docs for how it combines into `Ready` and `phase`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeHealth {
    /// No `RuntimeHealthy` condition: no runtime reports (an `image` plugin), or not yet.
    NotReported,
    /// `RuntimeHealthy=True`.
    Healthy,
    /// `RuntimeHealthy=False` with reason `Starting`, or `Unknown`: the runtime is listing.
    Starting {
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// `RuntimeHealthy=False` with any other reason: objects are not in sync.
    Unhealthy {
        /// The condition's reason (`TypeUnavailable`, `PatchFailed`, `SyncErrors`, `HostObjectConflict`).
        reason: String,
        /// The condition's message.
        message: String,
    },
}

/// Reads `RuntimeHealthy` from `status` (the runtime writes it under its own field manager) for
/// the plugin's current `generation`: a report for an older generation is
/// [`RuntimeHealth::Starting`] with reason [`RuntimeUpdating`](vcp_crds::Reason::RuntimeUpdating), whatever it says.
pub fn runtime_health(
    status: Option<&VClusterPluginStatus>,
    generation: Option<i64>,
) -> RuntimeHealth {
    let Some(c) = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == RUNTIME_HEALTHY))
    else {
        return RuntimeHealth::NotReported;
    };
    if let (Some(reported), Some(current)) = (c.observed_generation, generation)
        && reported < current
    {
        return RuntimeHealth::Starting {
            reason: Reason::RuntimeUpdating.to_string(),
            message: format!(
                "the runtime reports generation {reported}, not yet {current} (it restarts its syncers on a spec change)"
            ),
        };
    }
    let reason = if c.reason.is_empty() {
        "RuntimeUnhealthy".to_string()
    } else {
        c.reason.clone()
    };
    match c.status.as_str() {
        "True" => RuntimeHealth::Healthy,
        "False" if reason != Reason::Starting => RuntimeHealth::Unhealthy {
            reason,
            message: c.message.clone(),
        },
        _ => RuntimeHealth::Starting {
            reason,
            message: c.message.clone(),
        },
    }
}

/// A condition of `type_` for generation `generation`, keeping `lastTransitionTime` from
/// `previous` when the status did not change, `now` otherwise.
pub fn condition(
    type_: &str,
    check: &Check,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let (holds, reason, message) = match check {
        Check::Ok => (true, Reason::Installed.as_str(), ""),
        Check::Failed { reason, message } => (false, reason.as_str(), message.as_str()),
    };
    vcp_crds::condition(type_, holds, reason, message, generation, previous, now)
}

/// The operator-owned status of `plugin` for `outcome` (runtime fields left empty).
///
/// Phase: `Terminating` while deleting; `Pending` when the vCluster does not exist yet (it is
/// installed once it appears); `Failed` when the install is refused; once installed, `Ready`,
/// `Installing` or `Degraded` after the runtime's `RuntimeHealthy` (the table in the module
/// docs).
pub fn desired(plugin: &VClusterPlugin, outcome: &Outcome, now: &Time) -> VClusterPluginStatus {
    let generation = plugin.meta().generation;
    let previous = |t: &str| {
        plugin
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
    };
    let ready = if outcome.terminating {
        Check::failed(Reason::Terminating, "the VClusterPlugin is being deleted")
    } else {
        match (&outcome.workload_patched, &outcome.rbac) {
            (Check::Ok, Check::Ok) => Check::Ok,
            (Check::Failed { .. }, _) => outcome.workload_patched.clone(),
            (_, failed) => failed.clone(),
        }
    };
    let (ready, phase) = match ready {
        _ if outcome.terminating => (ready, Phase::Terminating),
        Check::Ok if outcome.rollout.is_some() => {
            let failure = outcome.rollout.clone().unwrap_or_default();
            (
                Check::failed(Reason::RolloutFailed, failure),
                Phase::Degraded,
            )
        }
        Check::Ok => match runtime_health(plugin.status.as_ref(), generation) {
            RuntimeHealth::NotReported | RuntimeHealth::Healthy => (Check::Ok, Phase::Ready),
            RuntimeHealth::Starting { reason, message } => {
                (Check::failed(reason, message), Phase::Installing)
            }
            RuntimeHealth::Unhealthy { reason, message } => {
                (Check::failed(reason, message), Phase::Degraded)
            }
        },
        Check::Failed { ref reason, .. } if *reason == Reason::VClusterNotFound => {
            (ready, Phase::Pending)
        }
        Check::Failed { .. } => (ready, Phase::Failed),
    };
    VClusterPluginStatus {
        observed_generation: generation,
        phase: Some(phase),
        runtime: Some(
            plugin
                .spec
                .image
                .clone()
                .unwrap_or_else(|| RUNTIME_EMBEDDED.to_string()),
        ),
        conditions: vec![
            condition(READY, &ready, generation, previous(READY), now),
            condition(
                WORKLOAD_PATCHED,
                &outcome.workload_patched,
                generation,
                previous(WORKLOAD_PATCHED),
                now,
            ),
            condition(
                RBAC_READY,
                &outcome.rbac,
                generation,
                previous(RBAC_READY),
                now,
            ),
        ],
        workload: outcome.workload.clone(),
        ..Default::default()
    }
}

/// Whether the live status differs from `desired` in any operator-owned field (and so a status
/// apply is needed). Runtime-owned fields are ignored.
pub fn needs_write(live: Option<&VClusterPluginStatus>, desired: &VClusterPluginStatus) -> bool {
    let Some(live) = live else { return true };
    let same_conditions = desired.conditions.iter().all(|d| {
        live.conditions.iter().any(|l| {
            l.type_ == d.type_
                && l.status == d.status
                && l.reason == d.reason
                && l.message == d.message
                && l.observed_generation == d.observed_generation
                && l.last_transition_time == d.last_transition_time
        })
    });
    !(same_conditions
        && live.observed_generation == desired.observed_generation
        && live.phase == desired.phase
        && live.runtime == desired.runtime
        && live.workload == desired.workload)
}

/// The server-side-apply body for the status subresource: identity plus the operator's fields.
pub fn apply_body(plugin: &VClusterPlugin, status: &VClusterPluginStatus) -> Value {
    json!({
        "apiVersion": VClusterPlugin::api_version(&()),
        "kind": VClusterPlugin::kind(&()),
        "metadata": { "name": plugin.name_any(), "namespace": plugin.namespace() },
        "status": status,
    })
}

/// Whether the `Ready` condition of `status` has reason `reason` (used to emit an Event only
/// on a change).
pub fn ready_reason_is(status: Option<&VClusterPluginStatus>, reason: &str) -> bool {
    status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY))
        .is_some_and(|c| c.reason == reason)
}

/// `cached` with the operator's fields of `written` (`observedGeneration`, `phase`, `runtime`,
/// `workload`, and the conditions `written` has, replacing those of the same type), the rest
/// (the runtime's `RuntimeHealthy`, `syncedObjects`, `syncedTotal`) kept: what the status is
/// once an apply of `written` (made with [`apply_body`]) has landed on `cached`.
pub fn overlay(
    cached: Option<&VClusterPluginStatus>,
    written: &VClusterPluginStatus,
) -> VClusterPluginStatus {
    let mut status = cached.cloned().unwrap_or_default();
    status.observed_generation = written.observed_generation;
    status.phase = written.phase;
    status.runtime = written.runtime.clone();
    status.workload = written.workload.clone();
    for condition in &written.conditions {
        match status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == condition.type_)
        {
            Some(c) => *c = condition.clone(),
            None => status.conditions.push(condition.clone()),
        }
    }
    status
}

/// The operator-owned status this process last wrote to each plugin, kept until the watch cache
/// moves past the version it was written from.
///
/// Under load a reconcile can start from a cached plugin that does not show the status the
/// previous reconcile of the same plugin just wrote (the watch lags behind the write): it then
/// wrote the same status again and published the same Event again (17 of 2,000 plugins at
/// concurrency 16 in `scripts/bench operator`). A reconcile that finds the cache at exactly
/// the `resourceVersion` the last status was written from uses that status instead; any other
/// version (the write's echo, or anyone's later change, such as a user's edit of the status)
/// means the cache has moved on, and the record is dropped: the cache wins, as before.
#[derive(Debug, Default)]
pub struct WrittenStatuses(Mutex<HashMap<String, WrittenStatus>>);

#[derive(Debug)]
struct WrittenStatus {
    /// `resourceVersion` of the plugin the status was computed from.
    from_version: String,
    status: VClusterPluginStatus,
}

impl WrittenStatuses {
    /// Remembers that `status` was written to `plugin` (as read: its `resourceVersion` is the
    /// version the status was computed from). Plugins without uid or version are not kept.
    pub fn remember(&self, plugin: &VClusterPlugin, status: &VClusterPluginStatus) {
        let (Some(uid), Some(version)) = (plugin.uid(), plugin.resource_version()) else {
            return;
        };
        self.lock().insert(
            uid,
            WrittenStatus {
                from_version: version,
                status: status.clone(),
            },
        );
    }

    /// The status to take as live for `plugin` (as cached) instead of `plugin.status`: when the
    /// cache is still at the version the last status was written from, the cached status with
    /// the operator's fields as written ([`overlay`]; the runtime's fields are the cached ones,
    /// which that write was computed from). `None`: `plugin.status` stands (a record the cache
    /// has moved past is dropped).
    ///
    /// A cached plugin without any status, once this process has written one, is a plugin
    /// whose status the operator's types cannot read (passed on without it,
    /// [`crate::tolerant`]): the status last written stands for it, whatever the version, so
    /// that the echo of a write does not cause the next one (a write loop, as each would carry
    /// a new `lastTransitionTime`). The runtime's `RuntimeHealthy` is then unknown: such a
    /// plugin is judged as one whose runtime has not reported.
    pub fn live(&self, plugin: &VClusterPlugin) -> Option<VClusterPluginStatus> {
        let uid = plugin.uid().unwrap_or_default();
        let mut map = self.lock();
        let written = map.get(&uid)?;
        if plugin.status.is_none()
            || plugin.resource_version().as_deref() == Some(written.from_version.as_str())
        {
            return Some(overlay(plugin.status.as_ref(), &written.status));
        }
        map.remove(&uid);
        None
    }

    /// Drops the record of the plugin with `uid` (its finalizer is gone: it is not written
    /// again).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, WrittenStatus>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records kept (one per plugin written to whose echo the cache has not shown yet).
    pub fn entries(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests;
