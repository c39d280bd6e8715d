use super::*;
use crate::{JsonPatchOp, JsonPatchOperation};
use serde_json::json;

fn pod_hook() -> Hook {
    Hook {
        name: "pod-hook".into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
        events: vec![HookEvent::CreatePhysical, HookEvent::UpdatePhysical],
        labels: [("created-by-plugin".to_string(), "pod-hook".to_string())].into(),
        ..Hook::default()
    }
}

#[test]
fn sets_label_on_object_without_labels() {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    apply_hook(&mut pod, &pod_hook()).unwrap();
    assert_eq!(
        pod["metadata"]["labels"],
        json!({"created-by-plugin": "pod-hook"})
    );
    // idempotent
    let before = pod.clone();
    apply_hook(&mut pod, &pod_hook()).unwrap();
    assert_eq!(pod, before);
}

#[test]
fn removals_and_annotations() {
    let hook = Hook {
        name: "h".into(),
        annotations: [("team".to_string(), "a".to_string())].into(),
        remove_labels: vec!["drop".into(), "absent".into()],
        remove_annotations: vec!["old".into()],
        ..Hook::default()
    };
    let mut obj =
        json!({"metadata": {"labels": {"drop": "x", "keep": "y"}, "annotations": {"old": "1"}}});
    apply_hook(&mut obj, &hook).unwrap();
    assert_eq!(
        obj,
        json!({"metadata": {"labels": {"keep": "y"}, "annotations": {"team": "a"}}})
    );
    // a removal does not create a missing map
    let mut bare = json!({"metadata": {"name": "n"}});
    let removal_only = Hook {
        name: "r".into(),
        remove_labels: vec!["x".into()],
        ..Hook::default()
    };
    apply_hook(&mut bare, &removal_only).unwrap();
    assert_eq!(bare, json!({"metadata": {"name": "n"}}));
}

#[test]
fn json_patch_after_labels() {
    let hook = Hook {
        name: "patch".into(),
        labels: [("a".to_string(), "1".to_string())].into(),
        json_patch: vec![
            JsonPatchOperation {
                op: JsonPatchOp::Add,
                path: "/spec/seats".into(),
                from: None,
                value: Some(json!(5)),
            },
            JsonPatchOperation {
                op: JsonPatchOp::Replace,
                path: "/metadata/labels/a".into(),
                from: None,
                value: Some(json!("2")),
            },
            JsonPatchOperation {
                op: JsonPatchOp::Copy,
                path: "/spec/copied".into(),
                from: Some("/spec/type".into()),
                value: None,
            },
        ],
        ..Hook::default()
    };
    let mut car = json!({"metadata": {"name": "c"}, "spec": {"type": "BMW"}});
    apply_hook(&mut car, &hook).unwrap();
    assert_eq!(
        car,
        json!({"metadata": {"name": "c", "labels": {"a": "2"}},
               "spec": {"type": "BMW", "seats": 5, "copied": "BMW"}})
    );
}

#[test]
fn failing_patch_is_reported_and_atomic() {
    let hook = Hook {
        name: "bad".into(),
        json_patch: vec![
            JsonPatchOperation {
                op: JsonPatchOp::Add,
                path: "/spec/x".into(),
                from: None,
                value: Some(json!(1)),
            },
            JsonPatchOperation {
                op: JsonPatchOp::Remove,
                path: "/spec/missing".into(),
                from: None,
                value: None,
            },
        ],
        ..Hook::default()
    };
    let mut obj = json!({"spec": {}});
    let err = apply_hook(&mut obj, &hook).unwrap_err();
    assert!(err.to_string().contains("\"bad\""), "{err}");
    assert_eq!(obj, json!({"spec": {}}));
    assert!(apply_hook(&mut json!([1]), &hook).is_err());
}

#[test]
fn selects_hooks_by_type_and_event() {
    let hooks = vec![
        pod_hook(),
        Hook {
            name: "car".into(),
            api_version: "example.loft.sh/v1".into(),
            kind: "Car".into(),
            events: vec![HookEvent::CreateVirtual],
            ..Hook::default()
        },
    ];
    assert_eq!(
        hooks_for(&hooks, "v1", "Pod", HookEvent::UpdatePhysical).len(),
        1
    );
    assert!(hooks_for(&hooks, "v1", "Pod", HookEvent::CreateVirtual).is_empty());
    assert!(
        hooks_for(
            &hooks,
            "example.loft.sh/v1",
            "Car",
            HookEvent::CreatePhysical
        )
        .is_empty()
    );
    assert_eq!(
        hooks_for(
            &hooks,
            "example.loft.sh/v1",
            "Car",
            HookEvent::CreateVirtual
        )[0]
        .name,
        "car"
    );
}
