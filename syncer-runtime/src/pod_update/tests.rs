//! Unit tests of [`super::mutable_update`]; the expected splits follow Kubernetes'
//! `ValidatePodUpdate` message (see the module documentation), not the function.

use serde_json::json;

use super::*;

fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "c", "image": "nginx:1", "ports": [{"containerPort": 80}]}],
            "serviceAccountName": "default",
            "tolerations": [{"key": "a", "operator": "Exists"}]
        },
        "status": {"phase": "Pending"}
    })
}

fn with(mut obj: Value, pointer: &str, value: Value) -> Value {
    *obj.pointer_mut(pointer).expect(pointer) = value;
    obj
}

#[test]
fn labels_and_annotations_always_pass() {
    let mut desired = pod();
    desired["metadata"]["labels"]["hooked"] = json!("yes");
    desired["metadata"]["annotations"] = json!({"note": "x"});
    let update = mutable_update(&pod(), &desired);
    assert_eq!(update.desired, desired);
    assert!(update.skipped.is_empty());
}

#[test]
fn image_active_deadline_and_appended_tolerations_are_mutable() {
    let mut desired = with(pod(), "/spec/containers/0/image", json!("nginx:2"));
    desired["spec"]["activeDeadlineSeconds"] = json!(30);
    desired["spec"]["tolerations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "b", "operator": "Exists"}));
    let update = mutable_update(&pod(), &desired);
    assert_eq!(update.desired, desired);
    assert!(update.skipped.is_empty());
}

#[test]
fn immutable_spec_fields_are_skipped_and_the_labels_kept() {
    for (pointer, value) in [
        ("/spec/containers/0/name", json!("renamed")),
        ("/spec/serviceAccountName", json!("other")),
        ("/spec/containers/0/ports/0/containerPort", json!(8080)),
        ("/spec/tolerations/0/key", json!("changed")),
    ] {
        let mut desired = with(pod(), pointer, value);
        desired["metadata"]["labels"]["hooked"] = json!("yes");
        let update = mutable_update(&pod(), &desired);
        let mut expected = pod();
        expected["metadata"]["labels"]["hooked"] = json!("yes");
        assert_eq!(update.desired, expected, "{pointer}");
        assert_eq!(update.skipped, [pointer], "{pointer}");
    }
}

#[test]
fn added_spec_fields_that_are_immutable_are_skipped() {
    let mut desired = pod();
    desired["spec"]["nodeName"] = json!("node-1");
    desired["spec"]["volumes"] = json!([{"name": "v", "emptyDir": {}}]);
    let update = mutable_update(&pod(), &desired);
    assert_eq!(update.desired, pod());
    assert_eq!(update.skipped, ["/spec/nodeName", "/spec/volumes"]);
}

#[test]
fn all_or_none_of_the_spec_changes() {
    // the image alone would pass, but not with the name of the same container
    let desired = with(
        with(pod(), "/spec/containers/0/image", json!("nginx:2")),
        "/spec/containers/0/name",
        json!("renamed"),
    );
    let update = mutable_update(&pod(), &desired);
    assert_eq!(update.desired, pod());
    assert_eq!(
        update.skipped,
        ["/spec/containers/0/image", "/spec/containers/0/name"]
    );
}

#[test]
fn status_is_not_written_through_the_pod() {
    let desired = with(pod(), "/status/phase", json!("Running"));
    let update = mutable_update(&pod(), &desired);
    assert_eq!(update.desired, pod());
    assert_eq!(update.skipped, ["/status/phase"]);
}
