//! What the workload caches keep of an object ([`WorkloadMeta`]) and which full copy a
//! reconcile reads ([`WorkloadCopies`]).
//!
//! The `managedFields` below are written in the notation of Kubernetes' server-side apply
//! (`FieldsV1`: `f:<field>` for a field, `k:{"name":…}` for an item of a list keyed by name,
//! `.` for the item itself), as the API server records a field manager's set: what the
//! operator's entry owns is independent of this crate.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ObjectList;
use serde_json::{Value, json};
use vcp_crds::tolerant::{Tolerant, decode};

/// A field set owning the containers `containers` and init containers `init` of the pod
/// template, each by name, and a mount in `syncer`.
fn owning(containers: &[&str], init: &[&str]) -> Value {
    let items = |names: &[&str]| -> Value {
        names
            .iter()
            .map(|n| {
                (
                    format!("k:{}", json!({ "name": n })),
                    json!({ ".": {}, "f:image": {}, "f:name": {} }),
                )
            })
            .collect::<serde_json::Map<String, Value>>()
            .into()
    };
    json!({ "f:spec": { "f:template": { "f:spec": {
        "f:containers": items(containers),
        "f:initContainers": items(init),
        "f:volumes": { "k:{\"name\":\"plugins\"}": { ".": {}, "f:name": {} } },
    } } } })
}

/// A `PartialObjectMetadata` of a StatefulSet as the API server sends it to a metadata watch:
/// Helm's entry owns the chart's containers, the operator's `Apply` entry owns `containers`
/// and `init`, the controller manager's entry owns the status; `extra` is merged into
/// `metadata` (large annotations, labels).
fn partial(containers: &[&str], init: &[&str], extra: Value) -> String {
    let mut metadata = json!({
        "name": "vc", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
        "generation": 3, "creationTimestamp": "2026-12-07T10:00:00Z",
        "labels": { "app": "vcluster", "release": "vc" },
        "annotations": { "meta.helm.sh/release-name": "vc" },
        "managedFields": [
            { "manager": "helm", "operation": "Update", "apiVersion": "apps/v1",
              "time": "2026-12-07T10:00:00Z", "fieldsType": "FieldsV1",
              "fieldsV1": owning(&["syncer", "not-ours"], &[]) },
            { "manager": OPERATOR_FIELD_MANAGER, "operation": "Apply", "apiVersion": "apps/v1",
              "time": "2026-12-07T10:00:01Z", "fieldsType": "FieldsV1",
              "fieldsV1": owning(containers, init) },
            { "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
              "time": "2026-12-07T10:00:02Z", "fieldsType": "FieldsV1",
              "fieldsV1": { "f:status": { "f:replicas": {} } }, "subresource": "status" },
        ],
    });
    if let (Some(m), Some(e)) = (metadata.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata })
        .to_string()
}

/// Decoded as the watch decodes each item ([`vcp_crds::tolerant`]).
fn read(text: &str) -> WorkloadMeta<StatefulSet> {
    match decode::<WorkloadMeta<StatefulSet>>(text) {
        Tolerant::Whole(meta) => meta,
        other => panic!("not decoded whole: {other:?}"),
    }
}

fn identity() -> ObjectMeta {
    ObjectMeta {
        name: Some("vc".into()),
        namespace: Some("ns".into()),
        uid: Some("u1".into()),
        resource_version: Some("42".into()),
        generation: Some(3),
        ..ObjectMeta::default()
    }
}

fn names(list: &[&str]) -> std::collections::BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_workload_caches_ask_for_metadata_only() {
    // kube's `Api` sends `as=PartialObjectMetadataList` / `as=PartialObjectMetadata` for a
    // type that says so, through the tolerant reader too
    assert!(<Tolerant<WorkloadMeta<StatefulSet>> as Resource>::metadata_api());
    assert!(<Tolerant<WorkloadMeta<Deployment>> as Resource>::metadata_api());
    assert!(!<Tolerant<StatefulSet> as Resource>::metadata_api());
    // and it is still the workload's kind, in the URL and in the cached-objects metric
    assert_eq!(WorkloadMeta::<StatefulSet>::kind(&()), "StatefulSet");
    assert_eq!(
        WorkloadMeta::<Deployment>::url_path(&(), None),
        "/apis/apps/v1/deployments"
    );
}

#[test]
fn a_workload_keeps_its_identity_and_the_names_the_operator_owns() {
    let meta = read(&partial(&["car", "syncer"], &["v2"], json!({})));
    assert_eq!(meta.metadata, identity());
    assert_eq!(
        meta.owned,
        Owned {
            names: names(&["car", "syncer", "v2"]),
            truncated: false,
        }
    );
    // Helm's `not-ours` is not the operator's; nothing owned: nothing kept
    let none = read(&partial(&[], &[], json!({})));
    assert_eq!(none.owned, Owned::default());
}

#[test]
fn a_large_workload_keeps_no_more_than_a_small_one() {
    // 200 KiB of annotations, 2,000 labels, a 1 MiB pod template and status (a whole object,
    // as a GET answers): none of it is kept
    let annotations: serde_json::Map<String, Value> = (0..4)
        .map(|i| (format!("a{i}"), Value::String("x".repeat(50_000))))
        .collect();
    let labels: serde_json::Map<String, Value> = (0..2_000)
        .map(|i| (format!("l{i}"), Value::String("y".repeat(60))))
        .collect();
    let mut whole: Value = serde_json::from_str(&partial(
        &["car"],
        &[],
        json!({ "annotations": annotations, "labels": labels }),
    ))
    .unwrap();
    whole["kind"] = json!("StatefulSet");
    whole["apiVersion"] = json!("apps/v1");
    whole["spec"] = json!({ "template": { "spec": { "containers": [
        { "name": "big", "image": "busybox",
          "env": [{ "name": "E", "value": "z".repeat(1 << 20) }] }
    ] } } });
    whole["status"] = json!({ "replicas": 0 });
    let text = whole.to_string();
    assert!(text.len() > (1 << 20) + 300_000, "{}", text.len());
    let big = read(&text);
    let small = read(&partial(&["car"], &[], json!({})));
    assert_eq!(big.metadata, small.metadata);
    assert_eq!(big.owned, small.owned);
    assert_eq!(big.metadata, identity());
}

#[test]
fn only_the_operators_apply_entry_on_the_object_counts() {
    // the operator's manager name on an `Update` (a hand edit with that name) or on the
    // status subresource owns nothing the sweep may take back; the first `Apply` entry counts
    let text = json!({ "metadata": { "name": "vc", "managedFields": [
        { "manager": OPERATOR_FIELD_MANAGER, "operation": "Update", "fieldsV1": owning(&["edited"], &[]) },
        { "manager": OPERATOR_FIELD_MANAGER, "operation": "Apply", "subresource": "status",
          "fieldsV1": owning(&["status"], &[]) },
        { "manager": OPERATOR_FIELD_MANAGER, "operation": "Apply", "fieldsV1": owning(&["car"], &[]) },
        { "manager": OPERATOR_FIELD_MANAGER, "operation": "Apply", "fieldsV1": owning(&["second"], &[]) },
    ] } })
    .to_string();
    assert_eq!(read(&text).owned.names, names(&["car"]));
}

#[test]
fn more_names_than_kept_or_a_name_no_container_can_have_is_marked() {
    let many: Vec<String> = (0..meta::MAX_OWNED_NAMES + 4)
        .map(|i| format!("p{i:02}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let meta = read(&partial(&many, &[], json!({})));
    assert_eq!(meta.owned.names.len(), meta::MAX_OWNED_NAMES);
    assert!(meta.owned.truncated);
    // a container name is a DNS label: at most 63 characters
    let long = "n".repeat(meta::MAX_CONTAINER_NAME + 1);
    let meta = read(&partial(&["car", &long], &[], json!({})));
    assert_eq!(meta.owned.names, names(&["car"]));
    assert!(meta.owned.truncated);
    let fits = "n".repeat(meta::MAX_CONTAINER_NAME);
    assert!(!read(&partial(&[&fits], &[], json!({}))).owned.truncated);
}

#[test]
fn the_sweep_looks_at_a_workload_that_may_hold_a_gone_plugins_entries() {
    let owned = Owned {
        names: names(&["syncer", "car"]),
        truncated: false,
    };
    assert!(
        !owned.may_hold_other_than(|p| p == "car"),
        "car still targets it"
    );
    assert!(owned.may_hold_other_than(|_| false), "car is gone");
    let only_syncer = Owned {
        names: names(&["syncer"]),
        truncated: false,
    };
    assert!(!only_syncer.may_hold_other_than(|_| false));
    let unknown = Owned {
        truncated: true,
        ..only_syncer
    };
    assert!(unknown.may_hold_other_than(|_| true));
}

#[test]
fn a_list_of_metadata_decodes_item_by_item() {
    let list = format!(
        r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{{"resourceVersion":"50"}},"items":[{},{}]}}"#,
        partial(&["car"], &[], json!({})),
        // one item whose metadata this type cannot read: it alone is skipped
        r#"{"kind":"PartialObjectMetadata","metadata":{"name":"bad","namespace":"ns","managedFields":{"not":"a list"}}}"#,
    );
    let list: ObjectList<Tolerant<WorkloadMeta<StatefulSet>>> =
        serde_json::from_str(&list).expect("list");
    assert!(matches!(&list.items[0], Tolerant::Whole(m) if m.owned.names == names(&["car"])));
    assert!(
        matches!(&list.items[1], Tolerant::Undecodable(u) if u.metadata.name.as_deref() == Some("bad"))
    );
}

fn sts(uid: &str, resource_version: &str, generation: i64, image: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": {
            "name": "vc", "namespace": "ns", "uid": uid, "generation": generation,
            "resourceVersion": resource_version,
            "managedFields": [
                { "manager": "helm", "operation": "Update" },
                { "manager": OPERATOR_FIELD_MANAGER, "operation": "Apply" },
            ],
        },
        "spec": {
            "selector": {},
            "serviceName": "vc",
            "template": { "spec": { "containers": [{ "name": "syncer", "image": image }] } },
        },
    }))
    .expect("StatefulSet")
}

/// The metadata cache's view of a StatefulSet `vc` in `ns`.
fn shown(uid: &str, resource_version: &str, generation: i64) -> ObjectMeta {
    ObjectMeta {
        name: Some("vc".into()),
        namespace: Some("ns".into()),
        uid: Some(uid.into()),
        resource_version: Some(resource_version.into()),
        generation: Some(generation),
        ..ObjectMeta::default()
    }
}

fn image(w: &Workload) -> &str {
    w.pod_spec.containers[0]
        .image
        .as_deref()
        .unwrap_or_default()
}

const STS: WorkloadKind = WorkloadKind::StatefulSet;

#[test]
fn a_copy_is_read_while_the_cache_shows_its_version() {
    let copies = WorkloadCopies::default();
    let read = sts("u1", "5", 2, "read");
    copies.keep(Workload::from_statefulset(&read), Some("5"));
    let copy = copies.current(STS, &shown("u1", "5", 2)).expect("current");
    assert_eq!(image(&copy), "read");
    // only the operator's own managedFields entry is kept
    assert_eq!(
        copy.managed_fields
            .iter()
            .map(|f| f.manager.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        vec![OPERATOR_FIELD_MANAGER.to_string()]
    );
    // another kind of the same name is another object
    assert!(
        copies
            .current(WorkloadKind::Deployment, &shown("u1", "5", 2))
            .is_none()
    );
    // the watch shows a newer version (a status, a label): the copy is dropped, read again
    assert!(copies.current(STS, &shown("u1", "6", 2)).is_none());
    assert_eq!(copies.entries(), 0);
    assert_eq!(copies.bytes(), 0);
}

#[test]
fn the_operators_own_write_wins_until_the_cache_catches_up() {
    let copies = WorkloadCopies::default();
    copies.statefulset(&sts("u1", "7", 3, "written"));
    // the cache still shows the version before the apply: the write is newer
    let copy = copies.current(STS, &shown("u1", "5", 2)).expect("newer");
    assert_eq!(image(&copy), "written");
    // caught up
    assert!(copies.current(STS, &shown("u1", "7", 3)).is_some());
    // someone changed it since, at the same generation (a label): read again
    assert!(copies.current(STS, &shown("u1", "8", 3)).is_none());
}

#[test]
fn a_recreated_workload_is_not_shadowed_by_a_copy_of_the_old_one() {
    let copies = WorkloadCopies::default();
    copies.statefulset(&sts("old", "7", 7, "written"));
    assert!(copies.current(STS, &shown("new", "9", 1)).is_none());
    assert_eq!(copies.entries(), 0);
}

#[test]
fn copies_of_gone_or_untargeted_workloads_are_dropped() {
    let copies = WorkloadCopies::default();
    copies.statefulset(&sts("u1", "3", 1, "i"));
    copies.retain(|kind, namespace, name| (kind, namespace, name) == (STS, "ns", "vc"));
    assert_eq!(copies.entries(), 1, "it still exists and is targeted");
    copies.retain(|_, _, name| name == "other");
    assert_eq!(copies.entries(), 0);
    copies.statefulset(&sts("u1", "3", 1, "i"));
    copies.forget("ns", "vc");
    assert_eq!((copies.entries(), copies.bytes()), (0, 0));
}

/// A StatefulSet `name` whose pod template holds `bytes` bytes of one env value.
fn big(name: &str, bytes: usize) -> StatefulSet {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "ns", "uid": name, "generation": 1,
                      "resourceVersion": "1" },
        "spec": { "selector": {}, "serviceName": name, "template": { "spec": { "containers": [
            { "name": "syncer", "env": [{ "name": "E", "value": "x".repeat(bytes) }] }
        ] } } },
    }))
    .expect("StatefulSet")
}

fn meta_of(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(name.into()),
        resource_version: Some("1".into()),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

#[test]
fn the_copies_stay_within_their_budget_the_least_recently_used_going_first() {
    let copies = WorkloadCopies::default();
    let each = COPIES_BUDGET / 5;
    for i in 0..4 {
        copies.statefulset(&big(&format!("w{i}"), each));
    }
    assert_eq!(copies.entries(), 4);
    // w0 is used: w1 is now the least recently used
    assert!(copies.current(STS, &meta_of("w0")).is_some());
    copies.statefulset(&big("w4", each));
    copies.statefulset(&big("w5", each));
    assert!(copies.bytes() <= COPIES_BUDGET, "{}", copies.bytes());
    assert!(
        copies.current(STS, &meta_of("w1")).is_none(),
        "evicted first"
    );
    assert!(copies.current(STS, &meta_of("w0")).is_some(), "used: kept");
    assert!(
        copies.current(STS, &meta_of("w5")).is_some(),
        "the newest: kept"
    );
    // one larger than the whole budget is not kept (and evicts nothing)
    let before = copies.entries();
    copies.statefulset(&big("huge", COPIES_BUDGET + 1));
    assert!(copies.current(STS, &meta_of("huge")).is_none());
    assert_eq!(copies.entries(), before);
}

#[test]
fn the_size_of_a_copy_is_its_json() {
    let w = Workload::from_statefulset(&big("w", 1000));
    let text = serde_json::to_string(&w.pod_spec).unwrap().len()
        + serde_json::to_string(&w.labels).unwrap().len()
        + serde_json::to_string(&w.template_labels).unwrap().len()
        + serde_json::to_string(&w.managed_fields).unwrap().len()
        + "ns".len()
        + "w".len();
    assert_eq!(copies::json_bytes(&w), text);
}

#[test]
fn managed_fields_are_dropped_from_rbac_objects() {
    let mut s = sts("u", "1", 1, "i");
    drop_managed_fields(&mut s);
    assert!(s.metadata.managed_fields.is_none());
}
