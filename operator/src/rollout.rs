//! Whether the vCluster's pods can run the plugin: a pure verdict ([`failure`]) over the pods of
//! the vCluster's workload, read after an install (`crate::vcluster`), so that a plugin whose
//! container cannot start is `Ready=False` (`RolloutFailed`, phase `Degraded`) with the
//! kubelet's own words, not `Ready=True` because the operator's write succeeded.
//!
//! The pods looked at are those of the workload that carry a container or init container named
//! as the plugin's (every container the operator adds is named after its plugin,
//! `crate::workload::containers`). In each such pod, sorted by name, the first of these is the
//! failure. Only the plugin's own container is judged (and the pod's placement): the vCluster's
//! `syncer` may restart while it starts, and a v2 plugin's failure inside it is not yet told
//! apart from the syncer's own.
//!
//! - the scheduler could not place the pod: condition `PodScheduled=False`, reason
//!   `Unschedulable` (`PodReasonUnschedulable`, k8s.io/api `core/v1/types.go`);
//! - the container waits for a reason the kubelet gives only when it cannot start it:
//!   [`FAILING_WAITING_REASONS`] (`CrashLoopBackOff`: it exited twice);
//! - the container runs but is not ready, restarted at least [`LOOPING_RESTARTS`] times, its
//!   last exit non-zero: the same crash loop between two back-offs;
//! - a container was last stopped by the kernel's OOM killer (`OOMKilled`), now or before its
//!   current wait;
//! - an init container ended with a non-zero exit code (the pod cannot start past it).
//!
//! A pod being deleted, or ended (phase `Failed` or `Succeeded`, such as an evicted pod of a
//! Deployment), is skipped: its replacement is what runs next. Nothing here talks to the API
//! server.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

/// The reasons of a container's `state.waiting` that say the kubelet cannot start it (as
/// opposed to `ContainerCreating` or `PodInitializing`, which say it is on its way). From
/// Kubernetes' kubelet (v1.36): `pkg/kubelet/images/types.go` (the image errors),
/// `pkg/kubelet/container/sync_result.go` (`CrashLoopBackOff`, `RunContainerError`) and
/// `pkg/kubelet/kuberuntime/kuberuntime_container.go` (the create and hook errors).
pub const FAILING_WAITING_REASONS: [&str; 12] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "ImageInspectError",
    "CrashLoopBackOff",
    "RunContainerError",
    "CreateContainerConfigError",
    "CreateContainerError",
    "PreCreateHookError",
    "PreStartHookError",
    "PostStartHookError",
];

/// The kubelet's reason for a container waiting out the back-off after it exited.
pub const CRASH_LOOP: &str = "CrashLoopBackOff";
/// The restarts from which a container that runs but is not ready, its last exit non-zero, is
/// still in its crash loop: between two back-offs it runs for a moment, and the plugin would
/// otherwise flip back to `Ready` each time. (The kubelet restarts a container at once after
/// its first exit and says `CrashLoopBackOff` from the second on, with `restartCount` 1.)
pub const LOOPING_RESTARTS: i32 = 2;
/// The reason the kubelet gives a container the kernel's OOM killer stopped.
pub const OOM_KILLED: &str = "OOMKilled";
/// The reason of the condition `PodScheduled=False` when no node fits the pod.
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// How soon a plugin is reconciled again while its pods are looked at ([`watching`]): the
/// kubelet's failure is in its status within this.
pub const RECHECK: Duration = Duration::from_secs(10);
/// How long after the operator's last write of the vCluster's workload its pods are looked at
/// every [`RECHECK`] (as a Deployment's default `progressDeadlineSeconds`, 600); after that, on
/// every reconcile of the plugin (its changes and the resync).
pub const WATCHED_FOR: Duration = Duration::from_secs(600);

/// Whether a plugin's pods are to be looked at again in [`RECHECK`]. `failing`: a pod cannot run
/// it now (to see it recover). Otherwise only when the vCluster has pods (`pods_seen`; on an API
/// server with no nodes there are none, and nothing would change) and either the reconcile just
/// wrote the workload (`wrote`: its old pod is still there) or the rollout is not [`settled`]
/// and the operator's last apply of the workload (its `managedFields` entry of `manager`) is
/// less than [`WATCHED_FOR`] before `now`.
pub fn watching(
    failing: bool,
    settled: bool,
    pods_seen: bool,
    wrote: bool,
    managed_fields: &[ManagedFieldsEntry],
    manager: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> bool {
    let last_write = managed_fields
        .iter()
        .filter(|m| m.manager.as_deref() == Some(manager))
        .filter_map(|m| m.time.as_ref().map(|t| t.0))
        .max();
    let recent = last_write.is_some_and(|t| {
        now.duration_since(t)
            .try_into()
            .is_ok_and(|since: Duration| since < WATCHED_FOR)
    });
    failing || (pods_seen && (wrote || (!settled && recent)))
}

/// Whether the rollout of the plugin's `container` is over: no pod is being deleted, and every
/// other one that has not ended carries the container and is `Ready`. `true` for no pods at
/// all.
pub fn settled(container: &str, pods: &[Pod]) -> bool {
    pods.iter().all(|p| {
        p.metadata.deletion_timestamp.is_none()
            && (!live(p)
                || (carries(p, container)
                    && p.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .flatten()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })))
    })
}

/// Why a pod of the vCluster cannot run the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The pod's name.
    pub pod: String,
    /// The container that fails and whether it is an init container; `None` when the pod
    /// itself is not placed (`Unschedulable`).
    pub container: Option<(String, bool)>,
    /// The kubelet's or the scheduler's reason (`ErrImageNeverPull`, `OOMKilled`, ...).
    pub reason: String,
    /// Their message, or what the exit says when they give none.
    pub message: String,
}

impl fmt::Display for Failure {
    /// `pod <pod>: init container <c>: <reason>: <message>` (`container` for a regular one;
    /// no container part for an unschedulable pod; no `: <message>` when it is empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {}: ", self.pod)?;
        if let Some((name, init)) = &self.container {
            let kind = if *init { "init container" } else { "container" };
            write!(f, "{kind} {name}: ")?;
        }
        f.write_str(&self.reason)?;
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// `pod` with only what this module reads: its name, deletion time and owners; its containers'
/// and init containers' names; its phase, conditions and container statuses. A vCluster's pod
/// template is its author's to fill (up to the size budgets, `crate::workload::budget`), so a
/// pod read is trimmed at once and no copy of the rest is kept.
pub fn trimmed(pod: Pod) -> Pod {
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let names = |containers: Vec<Container>| -> Vec<Container> {
        containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                ..Default::default()
            })
            .collect()
    };
    let spec = pod.spec.map(|spec| PodSpec {
        containers: names(spec.containers),
        init_containers: spec.init_containers.map(names),
        ..Default::default()
    });
    let status = pod.status.map(|status| PodStatus {
        phase: status.phase,
        conditions: status.conditions,
        container_statuses: status.container_statuses,
        init_container_statuses: status.init_container_statuses,
        ..Default::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name,
            deletion_timestamp: pod.metadata.deletion_timestamp,
            owner_references: pod.metadata.owner_references,
            ..Default::default()
        },
        spec,
        status,
    }
}

/// The first failure (module docs) among `pods` that carry a container or init container named
/// `container`; `None` when none of them fails (or none carries it yet).
pub fn failure(container: &str, pods: &[Pod]) -> Option<Failure> {
    let mut carrying: Vec<&Pod> = pods
        .iter()
        .filter(|p| live(p) && carries(p, container))
        .collect();
    carrying.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    carrying.into_iter().find_map(|p| pod_failure(p, container))
}

/// Whether `pod` is neither being deleted nor ended (phase `Failed` or `Succeeded`).
fn live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Failed" | "Succeeded"))
}

/// Whether `pod`'s spec has a container or init container named `container`.
fn carries(pod: &Pod, container: &str) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    })
}

/// The failure of one pod carrying the plugin's `container`, if any.
fn pod_failure(pod: &Pod, container: &str) -> Option<Failure> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref()?;
    if let Some(c) = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some(UNSCHEDULABLE)
    }) {
        return Some(Failure {
            pod: name,
            container: None,
            reason: UNSCHEDULABLE.into(),
            message: c.message.clone().unwrap_or_default(),
        });
    }
    let init = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|s| (s, true));
    let regular = status
        .container_statuses
        .iter()
        .flatten()
        .map(|s| (s, false));
    let mut statuses = init.chain(regular).filter(|(s, _)| s.name == container);
    statuses.find_map(|(s, init)| {
        container_failure(s, init).map(|(reason, message)| Failure {
            pod: name.clone(),
            container: Some((s.name.clone(), init)),
            reason,
            message,
        })
    })
}

/// The reason and message of a failing container (module docs), if it fails.
fn container_failure(status: &ContainerStatus, init: bool) -> Option<(String, String)> {
    let state = status.state.as_ref();
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    let last_oom = last.filter(|t| t.reason.as_deref() == Some(OOM_KILLED));
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        if !FAILING_WAITING_REASONS.contains(&reason) {
            return None;
        }
        if let Some(oom) = last_oom {
            return Some((
                OOM_KILLED.into(),
                format!(
                    "stopped by the OOM killer (exit code {}), restarted {} times, now {reason}",
                    oom.exit_code, status.restart_count
                ),
            ));
        }
        return Some((reason.into(), waiting.message.clone().unwrap_or_default()));
    }
    if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
        if terminated.reason.as_deref() == Some(OOM_KILLED) {
            return Some((
                OOM_KILLED.into(),
                format!(
                    "stopped by the OOM killer (exit code {})",
                    terminated.exit_code
                ),
            ));
        }
        if init && terminated.exit_code != 0 {
            let reason = terminated.reason.clone().unwrap_or_else(|| "Error".into());
            let mut message = format!("exited with code {}", terminated.exit_code);
            if let Some(m) = terminated.message.as_deref().filter(|m| !m.is_empty()) {
                message.push_str(": ");
                message.push_str(m);
            }
            return Some((reason, message));
        }
        return None;
    }
    // Running between two back-offs of a crash loop.
    let running = state.and_then(|s| s.running.as_ref()).is_some();
    let failed_exit = last.filter(|t| t.exit_code != 0)?;
    if !(running && !status.ready && status.restart_count >= LOOPING_RESTARTS) {
        return None;
    }
    let reason = if last_oom.is_some() {
        OOM_KILLED
    } else {
        CRASH_LOOP
    };
    Some((
        reason.into(),
        format!(
            "restarted {} times, its last exit code {} ({}); running again, not ready",
            status.restart_count,
            failed_exit.exit_code,
            failed_exit.reason.as_deref().unwrap_or("Error")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pod named `name` whose spec has `containers` and `init` (names only) and whose status
    /// is `status` (JSON, as the API server serves it).
    fn pod(name: &str, containers: &[&str], init: &[&str], status: serde_json::Value) -> Pod {
        let named = |names: &[&str]| -> Vec<serde_json::Value> {
            names
                .iter()
                .map(|n| json!({ "name": n, "image": "x" }))
                .collect()
        };
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "team-x" },
            "spec": { "containers": named(containers), "initContainers": named(init) },
            "status": status,
        }))
        .unwrap()
    }

    /// A container status named `name` with `state` (and `lastState` when given).
    fn cs(
        name: &str,
        state: serde_json::Value,
        last: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut s = json!({
            "name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 3,
            "state": state,
        });
        if let Some(last) = last {
            s["lastState"] = last;
        }
        s
    }

    fn waiting(reason: &str, message: &str) -> serde_json::Value {
        json!({ "waiting": { "reason": reason, "message": message } })
    }

    /// The status the node showed: a v2 image plugin's init container that the kubelet
    /// cannot pull with `imagePullPolicy: Never` (`Init:ErrImageNeverPull`).
    #[test]
    fn an_init_container_the_kubelet_cannot_pull_is_named_with_its_reason() {
        let message = "Container image \"localhost/vcp/does-not-exist:0.1.0\" is not present with pull policy of Never";
        let p = pod(
            "team-x-0",
            &["syncer"],
            &["broken-image"],
            json!({
                "phase": "Pending",
                "initContainerStatuses": [cs("broken-image", waiting("ErrImageNeverPull", message), None)],
                "containerStatuses": [cs("syncer", waiting("PodInitializing", ""), None)],
            }),
        );
        let f = failure("broken-image", &[p]).expect("a failure");
        assert_eq!(f.reason, "ErrImageNeverPull");
        assert_eq!(f.container, Some(("broken-image".into(), true)));
        assert_eq!(
            f.to_string(),
            format!("pod team-x-0: init container broken-image: ErrImageNeverPull: {message}")
        );
    }

    #[test]
    fn every_failing_waiting_reason_fails_and_the_ones_on_their_way_do_not() {
        for reason in FAILING_WAITING_REASONS {
            let p = pod(
                "v-0",
                &["syncer", "car"],
                &[],
                json!({ "containerStatuses": [cs("car", waiting(reason, "m"), None)] }),
            );
            assert_eq!(
                failure("car", &[p]).map(|f| f.reason),
                Some(reason.to_string())
            );
        }
        // The kubelet's first CrashLoopBackOff (after the second exit) is a loop.
        let mut twice = cs("car", waiting("CrashLoopBackOff", "back-off 10s"), None);
        twice["restartCount"] = json!(1);
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [twice] }),
        );
        assert_eq!(failure("car", &[p]).unwrap().reason, "CrashLoopBackOff");
        // Between two back-offs: running, not ready, its last exit an error.
        let mut looping = cs(
            "car",
            json!({ "running": {} }),
            Some(json!({ "terminated": { "reason": "Error", "exitCode": 1 } })),
        );
        looping["restartCount"] = json!(2);
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [looping.clone()] }),
        );
        assert_eq!(failure("car", &[p]).unwrap().reason, "CrashLoopBackOff");
        // Restarted once after an error and now running: a start, not a loop.
        looping["restartCount"] = json!(1);
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [looping.clone()] }),
        );
        assert_eq!(failure("car", &[p]), None);
        // Ready again: recovered.
        looping["restartCount"] = json!(5);
        looping["ready"] = json!(true);
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [looping] }),
        );
        assert_eq!(failure("car", &[p]), None);
        // An evicted pod of a Deployment is not looked at.
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "phase": "Failed", "containerStatuses": [cs("car", waiting("ErrImagePull", ""), None)] }),
        );
        assert_eq!(failure("car", &[p]), None);
        for reason in ["ContainerCreating", "PodInitializing", ""] {
            let p = pod(
                "v-0",
                &["syncer", "car"],
                &[],
                json!({ "containerStatuses": [cs("car", waiting(reason, ""), None)] }),
            );
            assert_eq!(failure("car", &[p]), None, "{reason}");
        }
    }

    #[test]
    fn a_crash_loop_after_the_oom_killer_is_named_oom_killed() {
        let last = json!({ "terminated": { "reason": "OOMKilled", "exitCode": 137 } });
        let p = pod(
            "v-0",
            &["syncer", "car"],
            &[],
            json!({ "containerStatuses": [
                cs("car", waiting("CrashLoopBackOff", "back-off 40s restarting failed container"), Some(last)),
            ]}),
        );
        let f = failure("car", &[p]).unwrap();
        assert_eq!(f.reason, "OOMKilled");
        assert!(f.message.contains("exit code 137") && f.message.contains("CrashLoopBackOff"));
        // Stopped right now, before any back-off.
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [
                cs("car", json!({ "terminated": { "reason": "OOMKilled", "exitCode": 137 } }), None),
            ]}),
        );
        assert_eq!(failure("car", &[p]).unwrap().reason, "OOMKilled");
    }

    #[test]
    fn an_unschedulable_pod_is_named_with_the_schedulers_message() {
        let message = "0/1 nodes are available: 1 Insufficient memory.";
        let p = pod(
            "v-0",
            &["syncer", "car"],
            &[],
            json!({ "phase": "Pending", "conditions": [
                { "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message },
            ]}),
        );
        let f = failure("car", &[p]).unwrap();
        assert_eq!(f.container, None);
        assert_eq!(f.to_string(), format!("pod v-0: Unschedulable: {message}"));
    }

    #[test]
    fn a_failed_init_container_fails_and_a_regular_exit_alone_does_not() {
        let exited = |code: i32| json!({ "terminated": { "reason": "Error", "exitCode": code } });
        let p = pod(
            "v-0",
            &["syncer"],
            &["car"],
            json!({ "initContainerStatuses": [cs("car", exited(2), None)] }),
        );
        let f = failure("car", &[p]).unwrap();
        assert_eq!(
            (f.reason.as_str(), f.message.as_str()),
            ("Error", "exited with code 2")
        );
        // A completed init container is what a v2 plugin's copy does.
        let p = pod(
            "v-0",
            &["syncer"],
            &["car"],
            json!({ "initContainerStatuses": [cs("car", exited(0), None)] }),
        );
        assert_eq!(failure("car", &[p]), None);
        // A sidecar that exited once is restarted; only a crash loop is a failure.
        let p = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [cs("car", exited(1), None)] }),
        );
        assert_eq!(failure("car", &[p]), None);
    }

    #[test]
    fn a_trimmed_pod_keeps_what_the_verdict_reads_and_nothing_else() {
        let mut p = pod(
            "v-0",
            &["car"],
            &["copy"],
            json!({ "phase": "Pending", "containerStatuses": [cs("car", waiting("ErrImagePull", "m"), None)] }),
        );
        let big = "x".repeat(100_000);
        p.metadata.annotations = Some([("a".to_string(), big.clone())].into());
        p.spec.as_mut().unwrap().containers[0].env =
            Some(vec![k8s_openapi::api::core::v1::EnvVar {
                name: "BIG".into(),
                value: Some(big),
                ..Default::default()
            }]);
        let before = failure("car", std::slice::from_ref(&p));
        let t = trimmed(p);
        assert_eq!(failure("car", std::slice::from_ref(&t)), before);
        assert!(carries(&t, "copy"));
        assert!(serde_json::to_vec(&t).unwrap().len() < 1_000, "{t:?}");
    }

    #[test]
    fn only_the_plugins_own_container_is_judged() {
        let status = json!({ "containerStatuses": [
            cs("syncer", waiting("CrashLoopBackOff", "syncer"), None),
            cs("car", waiting("ImagePullBackOff", "car"), None),
        ]});
        let p = pod("v-0", &["syncer", "car"], &[], status);
        let f = failure("car", std::slice::from_ref(&p)).unwrap();
        assert_eq!(
            (f.reason.as_str(), f.container),
            ("ImagePullBackOff", Some(("car".into(), false)))
        );
        let status = json!({ "containerStatuses": [
            cs("syncer", waiting("CrashLoopBackOff", "starting"), None),
            cs("car", json!({ "running": {} }), None),
        ]});
        let p = pod("v-0", &["syncer", "car"], &[], status);
        assert_eq!(failure("car", &[p]), None);
    }

    #[test]
    fn pods_are_watched_while_failing_or_after_a_write_until_the_rollout_settles() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
        let entry = |manager: &str, secs: i64| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            time: Some(Time(at(secs))),
            ..Default::default()
        };
        let fields = [
            entry("vcluster-plugin-operator", 1_000),
            entry("helm", 5_000),
        ];
        let op = "vcluster-plugin-operator";
        // (failing, settled, pods seen, wrote), then the time.
        assert!(watching(
            false,
            false,
            true,
            false,
            &fields,
            op,
            at(1_000 + 599)
        ));
        assert!(!watching(
            false,
            false,
            true,
            false,
            &fields,
            op,
            at(1_000 + 600)
        ));
        // Helm's later write is not the operator's.
        assert!(!watching(false, false, true, false, &fields, op, at(5_001)));
        // Just written: its old pod still looks settled.
        assert!(watching(false, true, true, true, &fields, op, at(9_000)));
        assert!(!watching(false, true, true, false, &fields, op, at(1_001)));
        assert!(watching(true, true, true, false, &fields, op, at(9_000)));
        // No pods at all (an API server without nodes): nothing to wait for.
        assert!(!watching(false, true, false, true, &fields, op, at(1_001)));
        assert!(!watching(false, false, false, false, &[], op, at(9_000)));
    }

    #[test]
    fn a_rollout_settles_when_every_pod_carries_the_container_and_is_ready() {
        let ready = |r: &str| json!({ "conditions": [{ "type": "Ready", "status": r }] });
        assert!(settled("car", &[]));
        // A pod being deleted: its replacement is still to come.
        let mut leaving = pod("v-0", &["syncer", "car"], &[], ready("True"));
        leaving.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!settled("car", &[leaving]));
        assert!(settled(
            "car",
            &[pod("v-0", &["syncer", "car"], &[], ready("True"))]
        ));
        assert!(!settled(
            "car",
            &[pod("v-0", &["syncer", "car"], &[], ready("False"))]
        ));
        // The pod of the template before the install: not rolled yet.
        assert!(!settled(
            "car",
            &[pod("v-0", &["syncer"], &[], ready("True"))]
        ));
        assert!(!settled(
            "car",
            &[
                pod("v-0", &["syncer", "car"], &[], ready("True")),
                pod("v-1", &["syncer"], &[], ready("True")),
            ]
        ));
    }

    #[test]
    fn pods_without_the_plugin_or_being_deleted_are_not_looked_at() {
        let failing =
            json!({ "containerStatuses": [cs("syncer", waiting("CrashLoopBackOff", ""), None)] });
        // An earlier pod of the workload, without the plugin's container.
        let before = pod("v-0", &["syncer"], &[], failing.clone());
        assert_eq!(failure("car", &[before]), None);
        let mut deleted = pod("v-0", &["syncer", "car"], &[], failing);
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(failure("car", &[deleted]), None);
        // Several pods: the first by name.
        let a = pod(
            "v-1",
            &["car"],
            &[],
            json!({ "containerStatuses": [cs("car", waiting("ErrImagePull", "b"), None)] }),
        );
        let b = pod(
            "v-0",
            &["car"],
            &[],
            json!({ "containerStatuses": [cs("car", waiting("ErrImagePull", "a"), None)] }),
        );
        assert_eq!(failure("car", &[a, b]).unwrap().pod, "v-0");
    }
}
