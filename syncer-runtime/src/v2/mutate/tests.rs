use super::*;
use crate::hooks::HookPoint;
use crate::v2::test_hooks::PodHook;
use serde_json::json;

struct Refuse;
impl ClientHook for Refuse {
    fn name(&self) -> &str {
        "refuse"
    }
    fn api_version(&self) -> &str {
        "v1"
    }
    fn kind(&self) -> &str {
        "Pod"
    }
    fn handles(&self, point: HookPoint) -> bool {
        point == HookPoint::DeletePhysical
    }
    fn mutate_delete_physical(&self, _: Value) -> Result<Value, HookError> {
        Err(HookError::Custom {
            hook: "refuse".into(),
            message: "kept".into(),
        })
    }
}

fn request(kind: &str, point: &str, object: &str) -> MutateRequest {
    MutateRequest {
        api_version: "v1".into(),
        kind: kind.into(),
        object: object.into(),
        r#type: point.into(),
    }
}

fn hooks() -> Vec<Arc<dyn ClientHook>> {
    vec![
        Arc::new(PodHook(&[
            HookPoint::CreatePhysical,
            HookPoint::UpdatePhysical,
        ])),
        Arc::new(Refuse),
    ]
}

#[test]
fn the_pod_hook_labels_a_physical_create() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-x-default-x-vc", "labels": {"app": "web"}}});
    let response = mutate(
        &hooks(),
        &request("Pod", "CreatePhysical", &pod.to_string()),
    )
    .unwrap();
    assert!(response.mutated);
    let mut expected = pod.clone();
    expected["metadata"]["labels"]["created-by-plugin"] = json!("pod-hook");
    assert_eq!(
        serde_json::from_str::<Value>(&response.object).unwrap(),
        expected
    );
}

/// A hook that needs the type (as a typed deserialisation does) sees it even when vCluster's
/// object has none; the answer carries no type the request did not.
#[test]
fn the_type_is_filled_in_for_the_hooks_only() {
    struct NeedsType;
    impl ClientHook for NeedsType {
        fn name(&self) -> &str {
            "needs-type"
        }
        fn api_version(&self) -> &str {
            "v1"
        }
        fn kind(&self) -> &str {
            "Pod"
        }
        fn handles(&self, point: HookPoint) -> bool {
            point == HookPoint::CreatePhysical
        }
        fn mutate_create_physical(&self, mut obj: Value) -> Result<Value, HookError> {
            assert_eq!(
                (obj["apiVersion"].as_str(), obj["kind"].as_str()),
                (Some("v1"), Some("Pod"))
            );
            obj["metadata"]["labels"] = json!({"seen": "yes"});
            Ok(obj)
        }
    }
    let hooks: Vec<Arc<dyn ClientHook>> = vec![Arc::new(NeedsType)];
    let response = mutate(
        &hooks,
        &request("Pod", "CreatePhysical", r#"{"metadata": {"name": "p"}}"#),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&response.object).unwrap(),
        json!({"metadata": {"name": "p", "labels": {"seen": "yes"}}})
    );
}

#[test]
fn unchanged_unhooked_and_unknown_are_not_mutated() {
    let labelled = json!({"metadata": {"labels": {"created-by-plugin": "pod-hook"}}});
    let empty = MutateResponse::default();
    for req in [
        request("Pod", "UpdatePhysical", &labelled.to_string()),
        request("Pod", "CreateVirtual", "{}"),
        request("Secret", "CreatePhysical", "{}"),
        request("Pod", "Patch", "{}"),
    ] {
        assert_eq!(mutate(&hooks(), &req).unwrap(), empty, "{req:?}");
    }
    // an unhooked point is not even parsed
    assert_eq!(
        mutate(&hooks(), &request("Pod", "GetPhysical", "not json")).unwrap(),
        empty
    );
}

#[test]
fn errors_name_the_hook_and_the_object() {
    let error = mutate(&hooks(), &request("Pod", "DeletePhysical", "{}")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "DeletePhysical hooks of v1 Pod: hook \"refuse\": kept"
    );
    let error = mutate(&hooks(), &request("Pod", "CreatePhysical", "{")).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("the Pod object to mutate is not JSON"),
        "{error}"
    );
}
