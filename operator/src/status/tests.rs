//! Unit tests of [`super`]: the status a reconcile writes, from its outcome.

use super::*;
use k8s_openapi::jiff::Timestamp;
use vcp_crds::{VClusterPluginSpec, VClusterRef};

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn plugin() -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        "p",
        VClusterPluginSpec {
            vcluster: VClusterRef { name: "vc".into() },
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("ns".into());
    p.metadata.generation = Some(3);
    p
}

fn installed() -> Outcome {
    Outcome {
        workload: Some(WorkloadRef {
            kind: "StatefulSet".into(),
            name: "vc".into(),
        }),
        workload_patched: Check::Ok,
        rbac: Check::Ok,
        terminating: false,
        rollout: None,
    }
}

fn not_found() -> Outcome {
    let c = Check::failed(Reason::VClusterNotFound, "no vc");
    Outcome {
        workload: None,
        workload_patched: c.clone(),
        rbac: c,
        terminating: false,
        rollout: None,
    }
}

fn cond<'a>(s: &'a VClusterPluginStatus, t: &str) -> &'a Condition {
    s.conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[test]
fn a_written_status_stands_in_for_a_cache_still_at_the_version_it_was_written_from() {
    let written = WrittenStatuses::default();
    let mut read = plugin();
    read.metadata.uid = Some("u1".into());
    read.metadata.resource_version = Some("10".into());
    let status = desired(&read, &installed(), &t(100));
    written.remember(&read, &status);
    // a later reconcile starts from the same cached version: the written status is live,
    // so nothing needs writing and the Ready reason has not changed (no second Event)
    let live = written.live(&read);
    assert_eq!(
        live.as_ref(),
        Some(&status),
        "no runtime fields cached: the written status"
    );
    let mut view = read.clone();
    view.status = live;
    let again = desired(&view, &installed(), &t(200));
    assert!(!needs_write(view.status.as_ref(), &again));
    assert!(ready_reason_is(
        view.status.as_ref(),
        Reason::Installed.as_str()
    ));
    assert!(needs_write(
        read.status.as_ref(),
        &desired(&read, &installed(), &t(200))
    ));
    // the cache moved on (the write's echo, or someone's edit): the cache wins, record gone
    let mut moved = read.clone();
    moved.metadata.resource_version = Some("11".into());
    moved.status = Some(status.clone());
    assert_eq!(written.live(&moved), None);
    assert_eq!(written.entries(), 0);
    assert_eq!(written.live(&read), None);
}

#[test]
fn the_overlay_keeps_the_runtime_fields_of_the_cache() {
    let mut read = plugin();
    read.metadata.uid = Some("u1".into());
    read.metadata.resource_version = Some("10".into());
    let runtime_healthy = Condition {
        type_: "RuntimeHealthy".into(),
        status: "False".into(),
        reason: "Starting".into(),
        message: "caches not listed".into(),
        observed_generation: Some(3),
        last_transition_time: t(50),
    };
    read.status = Some(VClusterPluginStatus {
        conditions: vec![runtime_healthy.clone()],
        synced_total: Some(7),
        ..Default::default()
    });
    let status = desired(&read, &installed(), &t(100));
    let written = WrittenStatuses::default();
    written.remember(&read, &status);
    let live = written
        .live(&read)
        .expect("the cache is at the written-from version");
    assert_eq!(live.synced_total, Some(7));
    assert_eq!(cond(&live, "RuntimeHealthy"), &runtime_healthy);
    assert_eq!(cond(&live, READY), cond(&status, READY));
    assert_eq!(
        cond(&live, READY).reason,
        "Starting",
        "Ready follows RuntimeHealthy"
    );
    assert_eq!(live.phase, Some(Phase::Installing));
    // the next reconcile from it computes the same status: no write
    let mut view = read.clone();
    view.status = Some(live);
    assert!(!needs_write(
        view.status.as_ref(),
        &desired(&view, &installed(), &t(200))
    ));
}

/// A plugin passed on without its unreadable status (`status: None` at every
/// version) is written once, not on every echo of the write.
#[test]
fn a_plugin_whose_status_cannot_be_read_is_written_once() {
    let written = WrittenStatuses::default();
    let mut read = plugin();
    read.metadata.uid = Some("u1".into());
    read.metadata.resource_version = Some("10".into());
    let first = desired(&read, &installed(), &t(100));
    assert!(needs_write(read.status.as_ref(), &first));
    written.remember(&read, &first);
    // the echo: a new version, still without a readable status
    let mut echo = read.clone();
    echo.metadata.resource_version = Some("11".into());
    let live = written.live(&echo).expect("the written status stands in");
    let mut view = echo.clone();
    view.status = Some(live);
    assert!(!needs_write(
        view.status.as_ref(),
        &desired(&view, &installed(), &t(200))
    ));
    assert_eq!(written.entries(), 1);
    // once the status reads again, the cache wins
    echo.metadata.resource_version = Some("12".into());
    echo.status = Some(first);
    assert_eq!(written.live(&echo), None);
    assert_eq!(written.entries(), 0);
}

#[test]
fn a_forgotten_or_unidentified_plugin_keeps_no_written_status() {
    let written = WrittenStatuses::default();
    let anonymous = plugin(); // no uid, no resourceVersion
    written.remember(&anonymous, &desired(&anonymous, &installed(), &t(1)));
    assert_eq!(written.entries(), 0);
    let mut read = plugin();
    read.metadata.uid = Some("u1".into());
    read.metadata.resource_version = Some("10".into());
    written.remember(&read, &desired(&read, &installed(), &t(1)));
    written.forget("u1");
    assert_eq!(written.live(&read), None);
}

#[test]
fn installed_is_ready() {
    let s = desired(&plugin(), &installed(), &t(100));
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(s.runtime.as_deref(), Some("embedded"));
    for c in &s.conditions {
        assert_eq!(c.status, "True", "{c:?}");
        assert_eq!(c.observed_generation, Some(3));
    }
    assert_eq!(s.conditions.len(), 3);
}

/// A pod of the vCluster that cannot run the plugin outranks the runtime's report (a
/// sidecar that reported `RuntimeHealthy=True` before its pod began to crash-loop), and the
/// install's own conditions still hold.
#[test]
fn a_pod_that_cannot_run_the_plugin_is_degraded_whatever_the_runtime_said() {
    let mut p = plugin();
    runtime_says(&mut p, "True", "Syncing", "");
    let failure = crate::rollout::Failure {
        pod: "my-vcluster-0".into(),
        container: Some(("car".into(), true)),
        reason: "ErrImageNeverPull".into(),
        message: "not present with pull policy of Never".into(),
    };
    let o = Outcome {
        rollout: Some(failure.to_string()),
        ..installed()
    };
    let s = desired(&p, &o, &t(100));
    assert_eq!(s.phase, Some(Phase::Degraded));
    let ready = cond(&s, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "RolloutFailed")
    );
    assert_eq!(
        ready.message,
        "pod my-vcluster-0: init container car: ErrImageNeverPull: not present with pull policy of Never"
    );
    assert_eq!(cond(&s, WORKLOAD_PATCHED).status, "True");
    assert_eq!(cond(&s, RBAC_READY).status, "True");
}

/// The runtime applies a generation's hooks only once the operator accepted it
/// (`vcp_crds::accepted_by_operator`): the status of an install says so, a refusal does not.
#[test]
fn an_install_is_the_runtimes_acceptance_and_a_refusal_is_not() {
    let mut p = plugin();
    p.status = Some(desired(&p, &installed(), &t(100)));
    assert!(vcp_crds::accepted_by_operator(&p));
    // the author edits the spec: not accepted until the operator has judged it again
    p.metadata.generation = Some(4);
    assert!(!vcp_crds::accepted_by_operator(&p));
    let refused = Check::failed(Reason::PolicyDenied, "hooks make privileged pods");
    let o = Outcome {
        workload_patched: refused.clone(),
        rbac: refused,
        ..installed()
    };
    p.status = Some(desired(&p, &o, &t(101)));
    assert!(!vcp_crds::accepted_by_operator(&p));
    // being deleted: the Terminating status judges nothing (the seventh security review)
    p.metadata.deletion_timestamp = Some(t(102));
    let terminating = Outcome {
        terminating: true,
        ..installed()
    };
    p.status = Some(desired(&p, &terminating, &t(102)));
    assert!(!vcp_crds::accepted_by_operator(&p));
}

#[test]
fn missing_vcluster_is_pending_with_reason() {
    let mut p = plugin();
    p.spec.image = Some("img".into());
    let s = desired(&p, &not_found(), &t(100));
    assert_eq!(s.phase, Some(Phase::Pending));
    assert_eq!(s.runtime.as_deref(), Some("img"));
    assert_eq!(cond(&s, READY).status, "False");
    assert_eq!(cond(&s, READY).reason, Reason::VClusterNotFound);
    assert!(ready_reason_is(Some(&s), Reason::VClusterNotFound.as_str()));
}

#[test]
fn other_failures_are_failed_and_name_the_first_failing_part() {
    let mut o = installed();
    o.rbac = Check::failed("UnknownType", "no Car");
    let s = desired(&plugin(), &o, &t(1));
    assert_eq!(s.phase, Some(Phase::Failed));
    assert_eq!(cond(&s, READY).reason, "UnknownType");
    assert_eq!(cond(&s, WORKLOAD_PATCHED).status, "True");
}

#[test]
fn terminating_phase() {
    let mut o = installed();
    o.terminating = true;
    let s = desired(&plugin(), &o, &t(1));
    assert_eq!(s.phase, Some(Phase::Terminating));
    assert_eq!(cond(&s, READY).reason, Reason::Terminating);
}

#[test]
fn last_transition_time_moves_only_on_a_status_change() {
    let mut p = plugin();
    p.status = Some(desired(&p, &not_found(), &t(100)));
    // Same status, later: time kept, no write.
    let again = desired(&p, &not_found(), &t(200));
    assert_eq!(cond(&again, READY).last_transition_time, t(100));
    assert!(!needs_write(p.status.as_ref(), &again));
    // Status flips: time moves, write.
    let fixed = desired(&p, &installed(), &t(300));
    assert_eq!(cond(&fixed, READY).last_transition_time, t(300));
    assert!(needs_write(p.status.as_ref(), &fixed));
    // Same status, other reason: time kept, but a write.
    let mut other = not_found();
    other.workload_patched = Check::failed("Conflict", "x");
    let changed = desired(&p, &other, &t(400));
    assert_eq!(cond(&changed, READY).last_transition_time, t(100));
    assert!(needs_write(p.status.as_ref(), &changed));
}

#[test]
fn runtime_fields_are_neither_compared_nor_applied() {
    let mut p = plugin();
    let mut live = desired(&p, &installed(), &t(1));
    live.conditions.push(Condition {
        type_: "RuntimeHealthy".into(),
        status: "True".into(),
        reason: "Syncing".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: t(5),
    });
    live.synced_total = Some(7);
    p.status = Some(live);
    let want = desired(&p, &installed(), &t(9));
    assert!(!needs_write(p.status.as_ref(), &want));
    let body = apply_body(&p, &want);
    assert!(body["status"].get("syncedTotal").is_none());
    assert!(body["status"].get("syncedObjects").is_none());
    let types: Vec<_> = body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, OPERATOR_CONDITIONS);
    assert_eq!(body["kind"], "VClusterPlugin");
    assert_eq!(body["metadata"]["namespace"], "ns");
}

fn runtime_says(p: &mut VClusterPlugin, status: &str, reason: &str, message: &str) {
    let mut s = p.status.clone().unwrap_or_default();
    s.conditions.retain(|c| c.type_ != "RuntimeHealthy");
    s.conditions.push(Condition {
        type_: "RuntimeHealthy".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: Some(3),
        last_transition_time: t(5),
    });
    p.status = Some(s);
}

#[test]
fn runtime_health_combines_into_ready_and_phase() {
    // (RuntimeHealthy status, reason) -> (Ready, Ready's reason, phase): the module's table.
    let table = [
        ("True", "Syncing", "True", "Installed", Phase::Ready),
        ("False", "Starting", "False", "Starting", Phase::Installing),
        (
            "Unknown",
            "Starting",
            "False",
            "Starting",
            Phase::Installing,
        ),
        (
            "False",
            "TypeUnavailable",
            "False",
            "TypeUnavailable",
            Phase::Degraded,
        ),
        (
            "False",
            "SyncErrors",
            "False",
            "SyncErrors",
            Phase::Degraded,
        ),
        (
            "False",
            "HostObjectConflict",
            "False",
            "HostObjectConflict",
            Phase::Degraded,
        ),
    ];
    for (status, reason, ready, ready_reason, phase) in table {
        let mut p = plugin();
        runtime_says(&mut p, status, reason, "the runtime's words");
        let s = desired(&p, &installed(), &t(9));
        assert_eq!(s.phase, Some(phase), "{status} {reason}");
        let c = cond(&s, READY);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (ready, ready_reason)
        );
        if ready == "False" {
            assert_eq!(c.message, "the runtime's words");
        }
        // the operator's own checks stay what the install found
        assert_eq!(cond(&s, WORKLOAD_PATCHED).status, "True");
        assert_eq!(cond(&s, RBAC_READY).status, "True");
    }
    // reported for an older generation: whatever it says, the new spec is not running yet
    let mut p = plugin();
    runtime_says(&mut p, "True", "Syncing", "");
    p.metadata.generation = Some(4);
    let s = desired(&p, &installed(), &t(9));
    assert_eq!(s.phase, Some(Phase::Installing));
    assert_eq!(cond(&s, READY).reason, "RuntimeUpdating");
    assert_eq!(
        cond(&s, READY).message,
        "the runtime reports generation 3, not yet 4 (it restarts its syncers on a spec change)"
    );
    // not reported (an image plugin, or before the runtime's first report): installed
    let s = desired(&plugin(), &installed(), &t(9));
    assert_eq!(
        (s.phase, cond(&s, READY).status.as_str()),
        (Some(Phase::Ready), "True")
    );
}

#[test]
fn runtime_health_does_not_hide_install_failures_or_deletion() {
    let mut p = plugin();
    runtime_says(&mut p, "True", "Syncing", "");
    let s = desired(&p, &not_found(), &t(9));
    assert_eq!(s.phase, Some(Phase::Pending));
    let mut o = installed();
    o.rbac = Check::failed("PolicyDenied", "no");
    runtime_says(&mut p, "False", "SyncErrors", "x");
    let s = desired(&p, &o, &t(9));
    assert_eq!(
        (s.phase, cond(&s, READY).reason.as_str()),
        (Some(Phase::Failed), "PolicyDenied")
    );
    o = installed();
    o.terminating = true;
    let s = desired(&p, &o, &t(9));
    assert_eq!(s.phase, Some(Phase::Terminating));
}

#[test]
fn a_runtime_change_is_one_write_then_none() {
    let mut p = plugin();
    p.status = Some(desired(&p, &installed(), &t(1)));
    runtime_says(&mut p, "False", "TypeUnavailable", "no Car");
    let degraded = desired(&p, &installed(), &t(2));
    assert!(needs_write(p.status.as_ref(), &degraded));
    // the operator's write lands (conditions merged by type): the next reconcile is quiet
    let mut live = p.status.clone().unwrap();
    for c in &degraded.conditions {
        live.conditions.retain(|l| l.type_ != c.type_);
        live.conditions.push(c.clone());
    }
    live.phase = degraded.phase;
    p.status = Some(live);
    assert!(!needs_write(
        p.status.as_ref(),
        &desired(&p, &installed(), &t(3))
    ));
}

#[test]
fn generation_change_needs_a_write() {
    let mut p = plugin();
    p.status = Some(desired(&p, &installed(), &t(1)));
    p.metadata.generation = Some(4);
    assert!(needs_write(
        p.status.as_ref(),
        &desired(&p, &installed(), &t(2))
    ));
}
