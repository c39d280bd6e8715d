//! Unit tests of [`super`]: when the operator has accepted a spec.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

fn plugin(generation: Option<i64>, conditions: Vec<Condition>) -> VClusterPlugin {
    let mut p = VClusterPlugin::new("p", VClusterPluginSpec::default());
    p.metadata.generation = generation;
    p.status = Some(VClusterPluginStatus {
        conditions,
        ..Default::default()
    });
    p
}

fn workload_patched(status: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: WORKLOAD_PATCHED.into(),
        status: status.into(),
        reason: "Installed".into(),
        message: String::new(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

#[test]
fn accepted_only_when_workload_patched_is_true_for_the_current_generation() {
    assert!(accepted_by_operator(&plugin(
        Some(3),
        vec![workload_patched("True", Some(3))]
    )));
    // judged an older generation: the edit is not judged yet
    assert!(!accepted_by_operator(&plugin(
        Some(4),
        vec![workload_patched("True", Some(3))]
    )));
    // refused
    assert!(!accepted_by_operator(&plugin(
        Some(3),
        vec![workload_patched("False", Some(3))]
    )));
    // another condition, even True for the generation, is not the verdict
    let mut ready = workload_patched("True", Some(3));
    ready.type_ = READY.into();
    assert!(!accepted_by_operator(&plugin(Some(3), vec![ready])));
    // being deleted: the operator's Terminating status judges nothing
    let mut deleting = plugin(Some(3), vec![workload_patched("True", Some(3))]);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert!(!accepted_by_operator(&deleting));
    // no status, or no generation (not yet stored by an API server)
    let mut bare = plugin(Some(3), vec![]);
    bare.status = None;
    assert!(!accepted_by_operator(&bare));
    assert!(!accepted_by_operator(&plugin(
        None,
        vec![workload_patched("True", None)]
    )));
}
