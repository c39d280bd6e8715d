//! The runtime's part of `VClusterPlugin.status` (pure): `syncedObjects`, `syncedTotal` and the
//! `RuntimeHealthy` condition, from the statistics of the running syncers.
//!
//! The rules: the runtime reports `syncedObjects`
//! (per type) and `RuntimeHealthy` into the plugin's status; `syncedTotal` is what the SYNCED
//! column shows; conditions carry `type/status/reason/message/lastTransitionTime/
//! observedGeneration`, and `lastTransitionTime` moves only when `status` changes. The reasons
//! (the README's table "Status and condition reasons"), first match wins:
//!
//! | reason | status | when |
//! | --- | --- | --- |
//! | `TypeUnavailable` | `False` | a type cannot be discovered or watched (messages joined by `; `) |
//! | `PatchFailed` | `False` | an expression's evaluation is still running past its time bound inside one native call ([`with_overrunning`], [`crate::patches::running`]): the message names the type, object and patch of the longest-running one |
//! | `PatchFailed` | `False` | a declared patch failed on some objects (an expression threw or ran past its bounds, a reference or selector of the wrong shape): those objects are not written and are retried; the message gives the count and one failure |
//! | `Undecodable` | `False` | objects of a synced type (virtual or host) cannot be decoded (a free-form field nested deeper than serde_json's limit of 128): each is skipped and never acted on (its host copy is kept), every other object syncs; the message gives the count and names one (`vcp_crds::tolerant`). The type stays available |
//! | `SyncErrors` | `False` | objects failed to sync and are retried |
//! | `HostObjectConflict` | `False` | a host object of a synced object's name is not managed by this vCluster: it is left untouched, so that object is not synced (counted in `syncedObjects[].conflicts`) |
//! | `MetricsUnavailable` | `False` | the runtime cannot listen on its `/metrics` and `/healthz` address ([`with_metrics_failure`], [`crate::listener`]): it syncs on without them; the message says why and what to do |
//! | `Starting` | `False` | a type is not listed yet |
//! | `Syncing` | `True` | otherwise |
//!
//! The pod hooks (`--pod-sync=hooks`) count toward health but not toward `syncedObjects`: they
//! sync nothing, they hook the pods vCluster's own syncer made. The objects brought back for a
//! synced type (`produced`, [`crate::produced`]) count under their own kind, added to a synced
//! type of the same `apiVersion` and `kind` if there is one (`syncedObjects` is a list map).
//!
//! The status stays within the CRD's bounds (`vcp_crds::status_bounds`), so that its write is
//! never refused for its size: `syncedObjects` lists at most
//! [`MAX_SYNCED_OBJECTS`] kinds, the first ones in the order of `spec.syncedTypes` (the kinds
//! brought back after their type), and the `RuntimeHealthy` message then says how many kinds
//! it left out; their objects stay counted in `syncedTotal` and in the reasons above. The
//! message itself is cut to the bound by `vcp_crds::condition`.
//!
//! The status is written with server-side apply on the status subresource under the runtime's
//! field manager, so [`apply_body`] holds only the runtime's fields; the operator's
//! (`phase`, its conditions) are never sent and never removed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Resource;
use serde_json::{Value, json};
use vcp_crds::Reason;
use vcp_crds::status_bounds::MAX_SYNCED_OBJECTS;
use vcp_crds::{RUNTIME_HEALTHY, SyncedObjects, VClusterPlugin};

use crate::patches::running::{MAX_OVERRUNNING, Overrun};
use crate::stats::TypeSummary;

/// What the runtime reports, without times: compared with the last report to skip writes.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeStatus {
    /// `status.syncedObjects`: per synced type, the objects in sync and, when any, the
    /// conflicts.
    pub synced_objects: Vec<SyncedObjects>,
    /// `status.syncedTotal`: the sum of `synced_objects[].count`.
    pub synced_total: i64,
    /// Whether `RuntimeHealthy` is `True`.
    pub healthy: bool,
    /// Reason of `RuntimeHealthy` (see the module docs).
    pub reason: Reason,
    /// Message of `RuntimeHealthy`.
    pub message: String,
    /// `metadata.generation` of the spec the syncers run.
    pub observed_generation: Option<i64>,
}

/// The runtime's status for the synced `types` and the pod hooks' summary `pod_hooks`, running
/// the spec of generation `observed_generation` (see the module docs).
pub fn desired(
    types: &[TypeSummary],
    pod_hooks: Option<&TypeSummary>,
    observed_generation: Option<i64>,
) -> RuntimeStatus {
    let all: Vec<&TypeSummary> = types.iter().chain(pod_hooks).collect();
    let synced_total: i64 = types.iter().map(|s| s.in_sync).sum();
    let failed: i64 = all.iter().map(|s| s.failed).sum();
    let patch_failed: i64 = all.iter().map(|s| s.patch_failed).sum();
    let conflicts: i64 = all.iter().map(|s| s.conflicts).sum();
    let undecodable: i64 = all.iter().map(|s| s.undecodable).sum();
    let type_errors: Vec<&str> = all.iter().filter_map(|s| s.type_error.as_deref()).collect();
    let not_ready: Vec<String> = all
        .iter()
        .filter(|s| !s.ready)
        .map(|s| format!("{} {}", s.api_version, s.kind))
        .collect();
    let (healthy, reason, message) = if !type_errors.is_empty() {
        (false, Reason::TypeUnavailable, type_errors.join("; "))
    } else if patch_failed > 0 {
        let example = all
            .iter()
            .find_map(|s| s.patch_error.as_deref())
            .unwrap_or_default();
        (
            false,
            Reason::PatchFailed,
            format!(
                "{patch_failed} object(s) not synced: a patch failed, nothing of them is written \
                 and they are retried (see the PatchFailed Events); for example {example}"
            ),
        )
    } else if undecodable > 0 {
        let example = all
            .iter()
            .find_map(|s| s.undecodable_example.as_deref())
            .unwrap_or_default();
        (
            false,
            Reason::Undecodable,
            format!(
                "{undecodable} object(s) cannot be decoded and are skipped, nothing is done \
                 for them until they decode again (see the Undecodable Events); for example \
                 {example}"
            ),
        )
    } else if failed > 0 {
        (
            false,
            Reason::SyncErrors,
            format!(
                "{failed} object(s) failed to sync and are being retried; see the runtime's logs"
            ),
        )
    } else if conflicts > 0 {
        (
            false,
            Reason::HostObjectConflict,
            format!(
                "{conflicts} object(s) not synced: a host object of the same name is not managed \
                 by this vCluster and is left untouched (see the HostObjectConflict Events)"
            ),
        )
    } else if !not_ready.is_empty() {
        (
            false,
            Reason::Starting,
            format!("listing {}", not_ready.join(", ")),
        )
    } else {
        (
            true,
            Reason::Syncing,
            format!(
                "{synced_total} object(s) in sync across {} type(s)",
                types.len()
            ),
        )
    };
    // one entry per apiVersion and kind (a list map): the objects brought back of a kind
    // (`produced`) are added to those of a synced type of that kind
    let mut synced_objects: Vec<SyncedObjects> = Vec::new();
    for s in types {
        let conflicts = (s.conflicts > 0).then_some(s.conflicts);
        match synced_objects
            .iter_mut()
            .find(|o| o.api_version == s.api_version && o.kind == s.kind)
        {
            Some(entry) => {
                entry.count += s.in_sync;
                entry.conflicts = match (entry.conflicts, conflicts) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            None => synced_objects.push(SyncedObjects {
                api_version: s.api_version.clone(),
                kind: s.kind.clone(),
                count: s.in_sync,
                conflicts,
            }),
        }
    }
    let listed = synced_objects.len();
    let message = if listed > MAX_SYNCED_OBJECTS {
        synced_objects.truncate(MAX_SYNCED_OBJECTS);
        format!(
            "{message}; syncedObjects lists {MAX_SYNCED_OBJECTS} of {listed} kinds, {} left \
             out (their objects are counted in syncedTotal)",
            listed - MAX_SYNCED_OBJECTS
        )
    } else {
        message
    };
    RuntimeStatus {
        synced_objects,
        synced_total,
        healthy,
        reason,
        message,
        observed_generation,
    }
}

/// `status` with the runtime's evaluations `overrunning` (running past their time bound, the
/// longest-running first: [`crate::patches::running::Evaluations::overrunning`]): when there is
/// one, `RuntimeHealthy` is `False` with reason `PatchFailed` and a message naming the first
/// one's type, object and patch, unless a type is unavailable (`TypeUnavailable` comes first,
/// as in [`desired`]). Such an evaluation fails no object yet (its reconcile has not returned),
/// so nothing else would show it.
pub fn with_overrunning(mut status: RuntimeStatus, overrunning: &[Overrun]) -> RuntimeStatus {
    let Some(first) = overrunning.first() else {
        return status;
    };
    if status.reason == Reason::TypeUnavailable {
        return status;
    }
    status.healthy = false;
    status.reason = Reason::PatchFailed;
    // no elapsed time: the message stays the same while they run (no status write per tick)
    status.message = format!(
        "{} expression evaluation(s) running past their time bound inside one native call the \
         bound cannot interrupt, each holding a thread (new ones are refused while \
         {MAX_OVERRUNNING} are; see the PatchFailed Events); the longest: {}, past its bound of \
         {:?}, and its object is not synced",
        overrunning.len(),
        first.what,
        first.bound
    );
    status
}

/// `status` with the failure to listen on the metrics address `failure`, when there is one:
/// `RuntimeHealthy` is `False` with reason `MetricsUnavailable` and `failure` as its message,
/// unless another reason of `False` comes first (see the module docs: it comes after
/// `HostObjectConflict`, before `Starting`).
pub fn with_metrics_failure(mut status: RuntimeStatus, failure: Option<&str>) -> RuntimeStatus {
    let Some(failure) = failure else {
        return status;
    };
    if matches!(status.reason, Reason::Syncing | Reason::Starting) {
        status.healthy = false;
        status.reason = Reason::MetricsUnavailable;
        status.message = failure.to_string();
    }
    status
}

/// The `RuntimeHealthy` condition of `status`; `lastTransitionTime` is `previous`'s when the
/// condition's status is unchanged, `now` otherwise.
pub fn condition(status: &RuntimeStatus, previous: Option<&Condition>, now: &Time) -> Condition {
    vcp_crds::condition(
        RUNTIME_HEALTHY,
        status.healthy,
        status.reason,
        status.message.as_str(),
        status.observed_generation,
        previous,
        now,
    )
}

/// The server-side apply body of the plugin `name`'s status: `syncedObjects`, `syncedTotal`
/// and the one condition `healthy` (from [`condition`]), nothing of the operator's.
pub fn apply_body(name: &str, status: &RuntimeStatus, healthy: &Condition) -> Value {
    json!({
        "apiVersion": VClusterPlugin::api_version(&()),
        "kind": VClusterPlugin::kind(&()),
        "metadata": {"name": name},
        "status": {
            "syncedObjects": status.synced_objects,
            "syncedTotal": status.synced_total,
            "conditions": [healthy],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(kind: &str, in_sync: i64) -> TypeSummary {
        TypeSummary {
            api_version: "example.loft.sh/v1".into(),
            kind: kind.into(),
            in_sync,
            ready: true,
            ..TypeSummary::default()
        }
    }

    fn t(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn syncing_counts_per_type_and_in_total() {
        let mut cars = summary("Car", 3);
        cars.conflicts = 1;
        let trucks = summary("Truck", 2);
        let s = desired(&[cars.clone(), trucks.clone()], None, Some(4));
        // a conflict means an object is not synced: not healthy (README, "Status")
        assert!(!s.healthy);
        assert_eq!(s.reason.as_str(), "HostObjectConflict");
        assert_eq!(
            s.message,
            "1 object(s) not synced: a host object of the same name is not managed by this \
             vCluster and is left untouched (see the HostObjectConflict Events)"
        );
        assert_eq!(s.synced_total, 5);
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(
            serde_json::to_value(&s.synced_objects).unwrap(),
            json!([
                {"apiVersion": "example.loft.sh/v1", "kind": "Car", "count": 3, "conflicts": 1},
                {"apiVersion": "example.loft.sh/v1", "kind": "Truck", "count": 2}
            ])
        );
        cars.conflicts = 0;
        let s = desired(&[cars, trucks], None, Some(4));
        assert!(s.healthy);
        assert_eq!(s.reason.as_str(), "Syncing");
        assert_eq!(s.message, "5 object(s) in sync across 2 type(s)");
    }

    /// `syncedObjects` is a list map keyed by apiVersion and kind: the objects brought back of a
    /// kind (`produced`) and a synced type of that kind make one entry.
    #[test]
    fn objects_brought_back_add_to_their_kind() {
        let certificates = summary("Certificate", 2);
        let mut secrets = summary("Secret", 2);
        secrets.api_version = "v1".into();
        let mut synced_secrets = summary("Secret", 1);
        synced_secrets.api_version = "v1".into();
        synced_secrets.conflicts = 1;
        let s = desired(&[certificates, secrets, synced_secrets], None, None);
        assert_eq!(
            serde_json::to_value(&s.synced_objects).unwrap(),
            json!([
                {"apiVersion": "example.loft.sh/v1", "kind": "Certificate", "count": 2},
                {"apiVersion": "v1", "kind": "Secret", "count": 3, "conflicts": 1}
            ])
        );
        assert_eq!(s.synced_total, 5);
    }

    /// More kinds than the CRD's `maxItems` of `syncedObjects`: the first ones are listed, the
    /// message says how many are left out, and the total still counts every object.
    #[test]
    fn synced_objects_stay_within_the_crds_bound() {
        let types: Vec<TypeSummary> = (0..MAX_SYNCED_OBJECTS + 6)
            .map(|i| summary(&format!("Kind{i}"), 2))
            .collect();
        let s = desired(&types, None, Some(1));
        assert_eq!(s.synced_objects.len(), 64);
        assert_eq!(s.synced_objects[0].kind, "Kind0");
        assert_eq!(s.synced_objects[63].kind, "Kind63");
        assert_eq!(s.synced_total, 2 * 70);
        assert!(s.healthy);
        assert_eq!(
            s.message,
            "140 object(s) in sync across 70 type(s); syncedObjects lists 64 of 70 kinds, 6 \
             left out (their objects are counted in syncedTotal)"
        );
        // an unhealthy reason keeps its words, and the note follows them
        let mut failing = types.clone();
        failing[69].failed = 1;
        let s = desired(&failing, None, None);
        assert_eq!(s.reason.as_str(), "SyncErrors");
        assert!(
            s.message.starts_with("1 object(s) failed to sync")
                && s.message
                    .ends_with("6 left out (their objects are counted in syncedTotal)"),
            "{}",
            s.message
        );
        // exactly the bound: nothing left out, no note
        let s = desired(&types[..64], None, None);
        assert_eq!(s.synced_objects.len(), 64);
        assert_eq!(s.message, "128 object(s) in sync across 64 type(s)");
    }

    /// A message over the CRD's bound (here, the errors of many unavailable types joined) is
    /// cut by the condition, so the report is still accepted.
    #[test]
    fn a_long_message_is_cut_to_the_crds_bound() {
        let types: Vec<TypeSummary> = (0..32)
            .map(|i| {
                let mut t = summary(&format!("Kind{i}"), 0);
                t.type_error = Some("x".repeat(2000));
                t
            })
            .collect();
        let s = desired(&types, None, None);
        assert_eq!(s.reason.as_str(), "TypeUnavailable");
        assert!(s.message.chars().count() > 32768);
        let c = condition(&s, None, &t(1));
        assert!(c.message.chars().count() <= 32768, "{}", c.message.len());
        assert!(c.message.ends_with("characters left out)"));
    }

    #[test]
    fn reasons_in_order_of_precedence() {
        let mut failing = summary("Car", 1);
        failing.failed = 2;
        let mut listing = summary("Truck", 0);
        listing.ready = false;
        let mut unavailable = summary("Boat", 0);
        unavailable.type_error = Some("boats are not served".into());
        unavailable.ready = false;

        let s = desired(&[failing.clone(), listing.clone(), unavailable], None, None);
        assert_eq!((s.healthy, s.reason.as_str()), (false, "TypeUnavailable"));
        assert_eq!(s.message, "boats are not served");

        let mut conflicting = summary("Van", 1);
        conflicting.conflicts = 1;
        let s = desired(
            &[failing.clone(), listing.clone(), conflicting.clone()],
            None,
            None,
        );
        assert_eq!((s.healthy, s.reason.as_str()), (false, "SyncErrors"));
        assert_eq!(
            s.message,
            "2 object(s) failed to sync and are being retried; see the runtime's logs"
        );
        let s = desired(&[listing.clone(), conflicting], None, None);
        assert_eq!(
            (s.healthy, s.reason.as_str()),
            (false, "HostObjectConflict")
        );

        let s = desired(&[summary("Car", 1), listing], None, None);
        assert_eq!((s.healthy, s.reason.as_str()), (false, "Starting"));
        assert_eq!(s.message, "listing example.loft.sh/v1 Truck");
    }

    /// Undecodable objects: named, after a failing patch and before sync errors;
    /// the type stays available (not `TypeUnavailable`).
    #[test]
    fn undecodable_objects_are_named_and_leave_the_type_available() {
        let mut blobs = summary("Blob", 3);
        blobs.undecodable = 2;
        blobs.undecodable_example =
            Some("virtual Blob a/deep: spec.values.a: recursion limit exceeded".into());
        let mut failing = summary("Car", 1);
        failing.failed = 1;
        let s = desired(&[blobs.clone(), failing.clone()], None, Some(2));
        assert_eq!((s.healthy, s.reason.as_str()), (false, "Undecodable"));
        assert_eq!(
            s.message,
            "2 object(s) cannot be decoded and are skipped, nothing is done for them until they \
             decode again (see the Undecodable Events); for example virtual Blob a/deep: \
             spec.values.a: recursion limit exceeded"
        );
        assert_eq!(s.synced_total, 4);
        let mut patching = summary("Cert", 0);
        patching.patch_failed = 1;
        let s = desired(&[blobs.clone(), patching], None, None);
        assert_eq!(s.reason.as_str(), "PatchFailed");
        blobs.undecodable = 0;
        blobs.undecodable_example = None;
        let s = desired(&[blobs, failing], None, None);
        assert_eq!(s.reason.as_str(), "SyncErrors");
    }

    #[test]
    fn a_failing_patch_is_its_own_reason_and_recovers() {
        let mut certificates = summary("Certificate", 2);
        certificates.patch_failed = 1;
        certificates.patch_error = Some("patch \"spec.x\" (expression): boom".into());
        let mut failing = summary("Car", 1);
        failing.failed = 1;
        let s = desired(&[certificates.clone(), failing], None, Some(3));
        assert_eq!((s.healthy, s.reason.as_str()), (false, "PatchFailed"));
        assert_eq!(
            s.message,
            "1 object(s) not synced: a patch failed, nothing of them is written and they are \
             retried (see the PatchFailed Events); for example patch \"spec.x\" (expression): boom"
        );
        // a type that cannot be watched still comes first
        let mut unavailable = summary("Boat", 0);
        unavailable.type_error = Some("x".into());
        let s = desired(&[certificates.clone(), unavailable], None, None);
        assert_eq!(s.reason.as_str(), "TypeUnavailable");
        // nothing fails any more: healthy again
        certificates.patch_failed = 0;
        certificates.patch_error = None;
        let s = desired(&[certificates], None, None);
        assert_eq!((s.healthy, s.reason.as_str()), (true, "Syncing"));
    }

    /// The fourth attacker's stuck evaluation left the plugin `RuntimeHealthy=True`.
    #[test]
    fn an_evaluation_past_its_bound_makes_the_runtime_unhealthy() {
        let overrun = Overrun {
            what: "e2e.vcp.test/v1 Widget a/w: patch \"spec.x\" (expression) at spec.x".into(),
            related: None,
            elapsed: std::time::Duration::from_millis(2500),
            bound: std::time::Duration::from_millis(100),
        };
        let healthy = desired(&[summary("Widget", 3)], None, Some(5));
        assert!(healthy.healthy);
        // nothing overrunning: unchanged
        assert_eq!(with_overrunning(healthy.clone(), &[]), healthy);
        let s = with_overrunning(healthy, std::slice::from_ref(&overrun));
        assert_eq!((s.healthy, s.reason.as_str()), (false, "PatchFailed"));
        assert_eq!(
            s.message,
            "1 expression evaluation(s) running past their time bound inside one native call \
             the bound cannot interrupt, each holding a thread (new ones are refused while 2 \
             are; see the PatchFailed Events); the longest: e2e.vcp.test/v1 Widget a/w: patch \
             \"spec.x\" (expression) at spec.x, past its bound of 100ms, and its object is not \
             synced"
        );
        // the same while it runs on: no new status write
        let later = Overrun {
            elapsed: std::time::Duration::from_secs(9),
            ..overrun.clone()
        };
        assert_eq!(with_overrunning(s.clone(), &[later]), s);
        assert_eq!(s.synced_total, 3);
        assert_eq!(s.observed_generation, Some(5));
        let c = condition(&s, None, &t(1));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "PatchFailed")
        );
        // an unavailable type still comes first
        let mut boat = summary("Boat", 0);
        boat.type_error = Some("boats are not served".into());
        let s = with_overrunning(desired(&[boat], None, None), &[overrun]);
        assert_eq!(s.reason.as_str(), "TypeUnavailable");
    }

    /// The sixth attacker's v1 plugin held the runtime's metrics port: the runtime crash-looped.
    /// Now the failure is a reason of its own, after the sync's own failures.
    #[test]
    fn a_metrics_address_that_cannot_be_listened_on_is_reported() {
        let syncing = desired(&[summary("Car", 3)], None, Some(2));
        assert_eq!(with_metrics_failure(syncing.clone(), None), syncing);
        let s = with_metrics_failure(syncing, Some("port taken"));
        assert_eq!(
            (s.healthy, s.reason.as_str()),
            (false, "MetricsUnavailable")
        );
        assert_eq!(s.message, "port taken");
        assert_eq!(s.synced_total, 3);
        let mut listing = summary("Car", 0);
        listing.ready = false;
        let s = with_metrics_failure(desired(&[listing], None, None), Some("port taken"));
        assert_eq!(s.reason.as_str(), "MetricsUnavailable");
        let mut failing = summary("Car", 1);
        failing.failed = 1;
        let s = with_metrics_failure(desired(&[failing], None, None), Some("port taken"));
        assert_eq!(s.reason.as_str(), "SyncErrors");
    }

    #[test]
    fn pod_hooks_count_toward_health_not_toward_synced_objects() {
        let mut pods = TypeSummary {
            api_version: "v1".into(),
            kind: "Pod".into(),
            in_sync: 7,
            ready: true,
            ..TypeSummary::default()
        };
        let s = desired(&[summary("Car", 1)], Some(&pods), None);
        assert_eq!(s.synced_total, 1);
        assert_eq!(s.synced_objects.len(), 1);
        assert_eq!(s.reason.as_str(), "Syncing");
        pods.type_error = Some("watching v1 Pod failed".into());
        pods.failed = 1;
        let s = desired(&[summary("Car", 1)], Some(&pods), None);
        assert_eq!((s.healthy, s.reason.as_str()), (false, "TypeUnavailable"));
        // no synced type at all: healthy, nothing in sync
        let s = desired(&[], None, Some(1));
        assert_eq!((s.healthy, s.reason.as_str()), (true, "Syncing"));
        assert_eq!(s.message, "0 object(s) in sync across 0 type(s)");
    }

    #[test]
    fn last_transition_time_moves_only_on_a_status_change() {
        let healthy = desired(&[summary("Car", 1)], None, Some(2));
        let first = condition(&healthy, None, &t(100));
        assert_eq!(first.type_, "RuntimeHealthy");
        assert_eq!(first.status, "True");
        assert_eq!(first.reason.as_str(), "Syncing");
        assert_eq!(first.observed_generation, Some(2));
        assert_eq!(first.last_transition_time, t(100));
        // same status, other message: time kept
        let more = desired(&[summary("Car", 2)], None, Some(2));
        assert_eq!(
            condition(&more, Some(&first), &t(200)).last_transition_time,
            t(100)
        );
        // status flips: time moves
        let mut failing = summary("Car", 0);
        failing.failed = 1;
        let broken = desired(&[failing], None, Some(2));
        let flipped = condition(&broken, Some(&first), &t(300));
        assert_eq!(flipped.status, "False");
        assert_eq!(flipped.last_transition_time, t(300));
    }

    #[test]
    fn apply_body_holds_only_the_runtime_fields() {
        let s = desired(&[summary("Car", 3)], None, None);
        let c = condition(&s, None, &t(1));
        let body = apply_body("my-plugin", &s, &c);
        assert_eq!(body["apiVersion"], "vcp.dev/v1alpha1");
        assert_eq!(body["kind"], "VClusterPlugin");
        assert_eq!(body["metadata"], json!({"name": "my-plugin"}));
        let mut fields: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(fields, ["conditions", "syncedObjects", "syncedTotal"]);
        assert_eq!(body["status"]["syncedTotal"], 3);
        assert_eq!(
            body["status"]["conditions"],
            json!([{
                "type": "RuntimeHealthy", "status": "True", "reason": "Syncing",
                "message": "3 object(s) in sync across 1 type(s)",
                "lastTransitionTime": "1970-01-01T00:00:01Z"
            }])
        );
    }
}
