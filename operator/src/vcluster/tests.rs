//! The decide step ([`super::decide`]) without an API server: install, delete, conflict and
//! refusal. Expected values follow the operator's rules (README, "Security model": a plugin refused
//! for any reason gets nothing and leaves the workload untouched; the older of two conflicting
//! plugins wins; on delete exactly what was added is removed; a missing workload does not block a
//! delete, and an install waits for it with `VClusterNotFound`).

use std::collections::{BTreeMap, BTreeSet};
use vcp_crds::Reason;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use vcp_crds::{FINALIZER, SyncedType, VClusterPlugin, VClusterPluginSpec, VClusterRef};

use super::decide::*;
use crate::policy::Policy;
use crate::rbac::Served;
use crate::status::Check;
use crate::workload::{Refusal, SYNCER_CONTAINER, Workload, WorkloadKind};

const RUNTIME: &str = "ghcr.io/vcp-dev/vcluster-plugin-operator:0.1.0";
const SA: &str = "vc-my-vcluster";

/// A plugin of the vCluster `my-vcluster` in `team-a`, carrying the finalizer, created at
/// `secs`, with an image (a v2 plugin) and syncing `types` (`(apiVersion, kind)`).
fn plugin(name: &str, secs: i64, types: &[(&str, &str)]) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        name,
        VClusterPluginSpec {
            vcluster: VClusterRef {
                name: "my-vcluster".into(),
            },
            image: Some(format!("registry.example/{name}:1")),
            synced_types: types
                .iter()
                .map(|(api_version, kind)| SyncedType {
                    api_version: (*api_version).into(),
                    kind: (*kind).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("team-a".into());
    p.metadata.finalizers = Some(vec![FINALIZER.into()]);
    p.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
    ));
    p
}

/// The vCluster chart's StatefulSet: the chart's labels, one `syncer` container.
fn workload() -> Workload {
    let labels = BTreeMap::from([
        ("app".to_string(), "vcluster".to_string()),
        ("release".to_string(), "my-vcluster".to_string()),
    ]);
    Workload {
        kind: Some(WorkloadKind::StatefulSet),
        name: "my-vcluster".into(),
        namespace: "team-a".into(),
        labels: labels.clone(),
        template_labels: labels,
        pod_spec: PodSpec {
            service_account_name: Some(SA.into()),
            containers: vec![Container {
                name: SYNCER_CONTAINER.into(),
                image: Some("ghcr.io/loft-sh/vcluster-pro:0.26.0".into()),
                ..Default::default()
            }],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Facts of a vCluster whose pods run as [`SA`], where the host serves ConfigMaps and the
/// example `Car` type in two versions (all namespaced).
fn facts() -> ClusterFacts {
    let served = |plural: &str| Served {
        plural: plural.into(),
        namespaced: true,
    };
    ClusterFacts {
        service_account: Ok(SA.into()),
        plurals: BTreeMap::from([
            (("v1".into(), "ConfigMap".into()), served("configmaps")),
            (("example.loft.sh/v1".into(), "Car".into()), served("cars")),
            (("example.loft.sh/v2".into(), "Car".into()), served("cars")),
        ]),
        vcluster_role: None,
        roles: None,
    }
}

fn observed(plugins: Vec<VClusterPlugin>) -> Observed {
    Observed {
        workload: workload(),
        plugins: plugins.into_iter().map(std::sync::Arc::new).collect(),
        facts: facts(),
        judged: BTreeMap::new(),
    }
}

/// The names of the containers and init containers of a workload apply body.
fn entries(patch: &Value) -> BTreeSet<String> {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|list| patch.pointer(&format!("/spec/template/spec/{list}")))
        .filter_map(Value::as_array)
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
        .collect()
}

fn reason(check: &Check) -> &str {
    match check {
        Check::Ok => "",
        Check::Failed { reason, .. } => reason,
    }
}

fn decide_for(observed: Option<&Observed>, intent: Intent<'_>) -> Plan {
    decide(observed, intent, &Policy::default(), RUNTIME)
}

#[test]
fn an_install_plans_the_workload_the_rbac_and_a_ready_status() {
    let p = plugin("cars", 1, &[("v1", "ConfigMap")]);
    let seen = observed(vec![p.clone()]);
    let plan = decide_for(Some(&seen), Intent::Install(&p));

    assert!(
        entries(plan.workload.as_ref().unwrap()).contains("cars"),
        "the plugin's entry is in the body: {:?}",
        plan.workload
    );
    let RbacPlan::Grant(grant) = &plan.rbac else {
        panic!("granted: {:?}", plan.rbac)
    };
    // Dedicated mode: its own Role in its namespace, bound to the vCluster's service account.
    let role = grant.rbac.role.as_ref().expect("a Role");
    assert_eq!(role.metadata.name.as_deref(), Some("vcp-plugin-cars"));
    let rules = role.rules.as_ref().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r.resources.as_deref() == Some(&["configmaps".to_string()][..])),
        "{rules:?}"
    );
    let subjects = grant
        .rbac
        .role_binding
        .as_ref()
        .and_then(|b| b.subjects.clone())
        .unwrap();
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("ServiceAccount", SA)
    );
    assert!(grant.vcluster_role.is_none());

    let status = plan.status.expect("an install reports");
    assert_eq!(status.workload_patched, Check::Ok);
    assert_eq!(status.rbac, Check::Ok);
    assert!(!status.terminating);
    let wl = status.workload.unwrap();
    assert_eq!(
        (wl.kind.as_str(), wl.name.as_str()),
        ("StatefulSet", "my-vcluster")
    );
    assert_eq!(plan.requeue, Some(RESYNC));
    assert!(plan.verdicts["cars"].is_ok());
}

#[test]
fn a_delete_plans_the_workload_without_the_plugin_and_its_removal() {
    let gone = plugin("gone", 1, &[]);
    let stays = plugin("stays", 2, &[]);
    // What observe hands over for a delete: the plugins installed into the workload, less the
    // deleted one.
    let seen = observed(vec![stays.clone()]);
    let plan = decide_for(Some(&seen), Intent::Delete(&gone));

    let names = entries(plan.workload.as_ref().unwrap());
    assert!(names.contains("stays"), "{names:?}");
    assert!(!names.contains("gone"), "{names:?}");
    assert!(matches!(plan.rbac, RbacPlan::Remove), "{:?}", plan.rbac);
    // The Terminating status is written before anything is read (`decide::terminating`).
    assert!(plan.status.is_none());
    assert_eq!(plan.requeue, None);

    let t = terminating(Some(&seen.workload));
    assert!(t.terminating);
    assert_eq!(t.workload.unwrap().name, "my-vcluster");
}

#[test]
fn a_missing_workload_blocks_an_install_but_not_a_delete() {
    let p = plugin("early", 1, &[]);
    let install = decide_for(None, Intent::Install(&p));
    assert!(install.workload.is_none());
    assert!(matches!(install.rbac, RbacPlan::Keep), "nothing created");
    let status = install.status.unwrap();
    assert_eq!(reason(&status.workload_patched), "VClusterNotFound");
    assert_eq!(reason(&status.rbac), "VClusterNotFound");
    assert!(status.workload.is_none());
    assert_eq!(install.requeue, Some(RESYNC));

    let delete = decide_for(None, Intent::Delete(&p));
    assert!(delete.workload.is_none());
    assert!(matches!(delete.rbac, RbacPlan::Remove), "{:?}", delete.rbac);
    assert!(terminating(None).workload.is_none());
}

#[test]
fn of_two_conflicting_plugins_the_newer_is_refused_and_gets_nothing() {
    let old = plugin("zz-old", 1, &[("example.loft.sh/v1", "Car")]);
    let new = plugin("aa-new", 2, &[("example.loft.sh/v2", "Car")]);
    let seen = observed(vec![new.clone(), old.clone()]);

    let plan = decide_for(Some(&seen), Intent::Install(&new));
    let names = entries(plan.workload.as_ref().unwrap());
    assert!(
        names.contains("zz-old") && !names.contains("aa-new"),
        "{names:?}"
    );
    assert!(matches!(plan.rbac, RbacPlan::Revoke), "{:?}", plan.rbac);
    let status = plan.status.unwrap();
    assert_eq!(reason(&status.workload_patched), "Conflict");
    assert_eq!(reason(&status.rbac), "Conflict");
    assert_eq!(plan.requeue, Some(RESYNC));
    assert!(plan.verdicts["zz-old"].is_ok());
    assert_eq!(
        reason(plan.verdicts["aa-new"].as_ref().unwrap_err()),
        "Conflict"
    );

    // The older one's own reconcile plans the same body, and installs it.
    let plan_old = decide_for(Some(&seen), Intent::Install(&old));
    assert_eq!(plan_old.workload, plan.workload);
    assert!(matches!(plan_old.rbac, RbacPlan::Grant(_)));
}

#[test]
fn refusals_keep_the_refused_plugin_out_and_the_others_in() {
    // A type the host does not serve: `UnknownType`, judged again soon.
    let unknown = plugin("unknown", 1, &[("example.loft.sh/v1", "Boat")]);
    // The API server's dry run refused this one's part (observed).
    let invalid = plugin("invalid", 2, &[]);
    let fine = plugin("fine", 3, &[]);
    let mut seen = observed(vec![unknown.clone(), invalid.clone(), fine.clone()]);
    seen.judged.insert(
        "invalid".into(),
        Refusal {
            reason: Reason::InvalidWorkload,
            message: "the API server refused it".into(),
        },
    );

    let plan = decide_for(Some(&seen), Intent::Install(&unknown));
    let names = entries(plan.workload.as_ref().unwrap());
    assert!(names.contains("fine"), "{names:?}");
    assert!(
        !names.contains("unknown") && !names.contains("invalid"),
        "{names:?}"
    );
    assert!(matches!(plan.rbac, RbacPlan::Revoke));
    assert_eq!(reason(&plan.status.unwrap().rbac), "UnknownType");
    assert_eq!(plan.requeue, Some(RECHECK));

    let plan = decide_for(Some(&seen), Intent::Install(&invalid));
    let status = plan.status.unwrap();
    assert_eq!(reason(&status.rbac), "InvalidWorkload");
    assert_eq!(plan.requeue, Some(RESYNC));
    assert!(plan.verdicts["fine"].is_ok());
}

#[test]
fn a_workload_that_is_not_a_vcluster_gets_no_plugin() {
    let p = plugin("p", 1, &[]);
    let mut seen = observed(vec![p.clone()]);
    seen.facts.service_account = Err(Refusal {
        reason: Reason::NotAVCluster,
        message: "not the vCluster chart's".into(),
    });
    let plan = decide_for(Some(&seen), Intent::Install(&p));
    assert!(entries(plan.workload.as_ref().unwrap()).is_empty());
    assert!(matches!(plan.rbac, RbacPlan::Revoke));
    assert_eq!(
        reason(&plan.status.unwrap().workload_patched),
        "NotAVCluster"
    );
    // A workload that becomes a vCluster triggers a reconcile through the workload watch.
    assert_eq!(plan.requeue, Some(RESYNC));
}

#[test]
fn refusals_that_depend_on_the_cluster_are_rechecked_soon() {
    assert_eq!(next_reconcile(&Check::Ok), RESYNC);
    for reason in [
        Reason::UnknownType,
        Reason::VClusterRoleNotFound,
        Reason::SharedVClusterRole,
    ] {
        assert_eq!(
            next_reconcile(&Check::failed(reason, "m")),
            RECHECK,
            "{reason}"
        );
    }
    // A workload that becomes a vCluster triggers a reconcile through the workload watch.
    for reason in [
        "PolicyDenied",
        "Conflict",
        "VClusterNotFound",
        "NotAVCluster",
    ] {
        assert_eq!(
            next_reconcile(&Check::failed(reason, "m")),
            RESYNC,
            "{reason}"
        );
    }
}

#[test]
fn a_patch_path_that_does_not_parse_refuses_the_plugin_only() {
    let mut broken = plugin("broken", 1, &[("example.loft.sh/v1", "Car")]);
    broken.spec.synced_types[0].patches = vec![vcp_crds::TranslatePatch {
        path: "spec[x]".into(),
        expression: Some("value".into()),
        ..Default::default()
    }];
    let fine = plugin("fine", 2, &[]);
    let seen = observed(vec![broken.clone(), fine]);
    let plan = decide_for(Some(&seen), Intent::Install(&broken));
    let names = entries(plan.workload.as_ref().unwrap());
    assert!(
        names.contains("fine") && !names.contains("broken"),
        "{names:?}"
    );
    let check = plan.verdicts["broken"].as_ref().unwrap_err();
    assert_eq!(reason(check), "InvalidConfig");
    let Check::Failed { message, .. } = check else {
        panic!("refused")
    };
    assert!(
        message.starts_with("spec.syncedTypes[0].patches[0].path: invalid patch path"),
        "{message}"
    );
    assert!(plan.verdicts["fine"].is_ok());
}

/// A remembered verdict of the resources' judgement lasts as long as the recheck period of a
/// plugin refused for the cluster's state, so such a plugin is judged on fresh facts each time.
#[test]
fn resource_verdicts_last_one_recheck_period() {
    assert_eq!(crate::judge::resources::REMEMBERED_FOR, RECHECK);
    let remembered = crate::judge::resources::Remembered::default();
    let now = std::time::Instant::now();
    remembered.put("StatefulSet/a/vc", 7, now, BTreeMap::new());
    assert!(remembered.get("StatefulSet/a/vc", 7, now).is_some());
    assert!(
        remembered.get("StatefulSet/a/vc", 8, now).is_none(),
        "another body"
    );
    assert!(
        remembered
            .get("StatefulSet/a/vc", 7, now + RECHECK)
            .is_none(),
        "too old"
    );
    remembered.retain(|_| false);
    assert!(remembered.is_empty());
}
