use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, ObjectMeta, OwnerReference,
};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::json;
use sha2::{Digest, Sha256};
use vcp_crds::RUNTIME_FIELD_MANAGER;

use super::*;

#[test]
fn slim_for_cache_keeps_only_the_runtime_owned_labels() {
    let mut obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {
            "name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
            "labels": {"l": "1", "h": "2"}, "annotations": {"a": "1"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [
                {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {"f:h": {}}}, "f:spec": {"f:type": {}}}},
                {"manager": "vcluster-plugin-syncer", "operation": "Update",
                 "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:l": {}},
                                             "f:annotations": {"f:a": {}}},
                              "f:spec": {"f:type": {}}}},
                {"manager": "vcluster-plugin-syncer", "operation": "Update",
                 "subresource": "status", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:status": {"f:ok": {}}}}
            ]
        },
        "spec": {"type": "BMW"}, "status": {"ok": true}
    }))
    .unwrap();
    let mut expected = obj.clone();
    expected.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("vcluster-plugin-syncer".into()),
        operation: Some("Update".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": {"f:l": {}}}}))),
        ..ManagedFieldsEntry::default()
    }]);
    assert_eq!(runtime_owned_labels(&obj.metadata), vec!["l".to_string()]);
    slim_for_cache(&mut obj.metadata);
    assert_eq!(obj, expected);
    assert_eq!(runtime_owned_labels(&obj.metadata), vec!["l".to_string()]);
    assert_eq!(obj.metadata.uid.as_deref(), Some("u1"));
    assert_eq!(obj.data["status"], json!({"ok": true}));

    // nothing owned by the runtime: no managedFields at all
    let mut other = expected.metadata.clone();
    other.managed_fields.as_mut().unwrap()[0].manager = Some("kubectl".into());
    slim_for_cache(&mut other);
    assert_eq!(other.managed_fields, None);
}

/// sha256 hex of `s`, computed here independently of the module's helper.
fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn meta(name: &str, namespace: &str, uid: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        uid: Some(uid.into()),
        ..ObjectMeta::default()
    }
}

fn cars() -> NamespacedTranslator {
    NamespacedTranslator::new(
        "my-vcluster",
        "vcluster-my-vcluster",
        "example.loft.sh/v1",
        "Car",
    )
}

#[test]
fn host_name_table() {
    let long_name = "a".repeat(60);
    let long_joined = format!("{long_name}-x-default-x-my-vcluster");
    // 51 characters, then a dot at index 51: the cut keeps the dot, `.-` becomes `-`.
    let dotted = format!("{}.{}", "b".repeat(51), "c".repeat(20));
    let dotted_joined = format!("{dotted}-x-ns-x-vc");
    // exactly 63 characters joined: kept as is.
    let at_limit_name = "d".repeat(63 - "-x-ns-x-vc".len());
    // 64 characters joined: truncated.
    let over_limit_name = "e".repeat(64 - "-x-ns-x-vc".len());
    let over_limit_joined = format!("{over_limit_name}-x-ns-x-vc");
    let cases: Vec<(&str, &str, &str, String)> = vec![
        (
            "my-car",
            "default",
            "my-vcluster",
            "my-car-x-default-x-my-vcluster".into(),
        ),
        ("audi", "team-a", "vc", "audi-x-team-a-x-vc".into()),
        ("with.dots", "ns", "vc", "with.dots-x-ns-x-vc".into()),
        (
            &long_name,
            "default",
            "my-vcluster",
            format!("{}-{}", &long_joined[..52], &sha256_hex(&long_joined)[..10]),
        ),
        (
            &dotted,
            "ns",
            "vc",
            format!("{}-{}", "b".repeat(51), &sha256_hex(&dotted_joined)[..10]),
        ),
        (
            &at_limit_name,
            "ns",
            "vc",
            format!("{at_limit_name}-x-ns-x-vc"),
        ),
        (
            &over_limit_name,
            "ns",
            "vc",
            format!(
                "{}-{}",
                &over_limit_joined[..52],
                &sha256_hex(&over_limit_joined)[..10]
            ),
        ),
        ("", "ns", "vc", String::new()),
    ];
    for (name, namespace, vcluster, expected) in cases {
        let got = host_name(name, namespace, vcluster);
        assert_eq!(
            got, expected,
            "host_name({name:?}, {namespace:?}, {vcluster:?})"
        );
        assert!(got.len() <= MAX_NAME_LENGTH, "{got:?} is longer than 63");
    }
}

#[test]
fn long_name_is_52_chars_dash_10_hex() {
    let name = "a-very-long-car-name-that-will-not-fit-into-a-kubernetes-label";
    let joined = format!("{name}-x-default-x-my-vcluster");
    assert!(joined.len() > 63);
    let got = host_name(name, "default", "my-vcluster");
    assert_eq!(got.len(), 63);
    assert_eq!(&got[..52], &joined[..52]);
    assert_eq!(&got[52..53], "-");
    assert_eq!(&got[53..], &sha256_hex(&joined)[..10]);
}

#[test]
fn object_kind_matches_go_gvk_string() {
    assert_eq!(
        object_kind("example.loft.sh/v1", "Car"),
        "example.loft.sh/v1, Kind=Car"
    );
    assert_eq!(object_kind("v1", "Pod"), "/v1, Kind=Pod");
    assert_eq!(
        object_kind("apps/v1", "Deployment"),
        "apps/v1, Kind=Deployment"
    );
}

#[test]
fn translate_metadata_sets_exact_labels_and_annotations() {
    let mut virtual_meta = meta("my-car", "team-a", "uid-1");
    virtual_meta.labels = Some(map(&[("app", "cars"), ("tier", "gold")]));
    virtual_meta.annotations = Some(map(&[("note", "fast"), (NAME_ANNOTATION, "spoofed")]));
    virtual_meta.generate_name = Some("my-".into());
    virtual_meta.resource_version = Some("42".into());
    virtual_meta.generation = Some(3);
    virtual_meta.finalizers = Some(vec!["example.com/keep".into()]);
    virtual_meta.owner_references = Some(vec![Default::default()]);

    let host = cars().translate_metadata(&virtual_meta);
    let expected_name = "my-car-x-team-a-x-my-vcluster";
    assert_eq!(host.name.as_deref(), Some(expected_name));
    assert_eq!(host.namespace.as_deref(), Some("vcluster-my-vcluster"));
    assert_eq!(
        host.labels,
        Some(map(&[
            ("app", "cars"),
            ("tier", "gold"),
            (MANAGED_BY_LABEL, "my-vcluster"),
            (NAMESPACE_LABEL, "team-a"),
        ]))
    );
    // vCluster's create path writes no managed-labels annotation
    assert_eq!(
        host.annotations,
        Some(map(&[
            ("note", "fast"),
            (NAME_ANNOTATION, "my-car"),
            (NAMESPACE_ANNOTATION, "team-a"),
            (UID_ANNOTATION, "uid-1"),
            (KIND_ANNOTATION, "example.loft.sh/v1, Kind=Car"),
            (HOST_NAME_ANNOTATION, expected_name),
            (HOST_NAMESPACE_ANNOTATION, "vcluster-my-vcluster"),
            (MANAGED_ANNOTATIONS_ANNOTATION, "note"),
        ]))
    );
    for stripped in [
        host.generate_name.is_none(),
        host.uid.is_none(),
        host.resource_version.is_none(),
        host.generation.is_none(),
        host.finalizers.is_none(),
        host.owner_references.is_none(),
        host.creation_timestamp.is_none(),
        host.managed_fields.is_none(),
    ] {
        assert!(stripped, "{host:?}");
    }
}

#[test]
fn no_managed_annotations_when_virtual_has_none() {
    let host = cars().translate_metadata(&meta("c", "ns", "u"));
    let annotations = host.annotations.unwrap();
    assert!(!annotations.contains_key(MANAGED_LABELS_ANNOTATION));
    assert!(!annotations.contains_key(MANAGED_ANNOTATIONS_ANNOTATION));
    assert_eq!(annotations.len(), 6, "{annotations:?}");
}

#[test]
fn update_is_none_when_in_sync() {
    let t = cars();
    let mut v = meta("c", "ns", "u");
    v.labels = Some(map(&[("a", "1")]));
    let host = t.translate_metadata(&v);
    assert_eq!(t.translate_metadata_update(&v, &host), None);
}

/// A managedFields entry of `manager` owning the label keys `keys`.
fn owns_labels(manager: &str, keys: &[&str]) -> ManagedFieldsEntry {
    let labels: serde_json::Map<String, serde_json::Value> =
        keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": labels}}))),
        ..ManagedFieldsEntry::default()
    }
}

#[test]
fn label_and_annotation_bookkeeping_on_update() {
    let t = cars();
    let mut v = meta("c", "ns", "u");
    v.labels = Some(map(&[("keep", "1"), ("drop", "2")]));
    v.annotations = Some(map(&[("a-keep", "1"), ("a-drop", "2")]));
    let mut host = t.translate_metadata(&v);
    // what the API server records for the runtime's create, and for someone else's later
    // additions on the host
    host.managed_fields = Some(vec![
        owns_labels(
            RUNTIME_FIELD_MANAGER,
            &["keep", "drop", MANAGED_BY_LABEL, NAMESPACE_LABEL],
        ),
        owns_labels("kubectl", &["host-added"]),
    ]);
    host.labels
        .as_mut()
        .unwrap()
        .insert("host-added".into(), "h".into());
    host.annotations
        .as_mut()
        .unwrap()
        .insert("host-note".into(), "h".into());
    // still in sync: host-added keys are not ours
    assert_eq!(t.translate_metadata_update(&v, &host), None);

    // the virtual object drops a label and an annotation, changes another, adds one
    v.labels = Some(map(&[("keep", "changed"), ("new", "3")]));
    v.annotations = Some(map(&[("a-keep", "1")]));
    let update = t.translate_metadata_update(&v, &host).expect("changes");
    assert_eq!(
        update.labels,
        map(&[
            ("keep", "changed"),
            ("new", "3"),
            ("host-added", "h"),
            (MANAGED_BY_LABEL, "my-vcluster"),
            (NAMESPACE_LABEL, "ns"),
        ])
    );
    assert!(!update.annotations.contains_key(MANAGED_LABELS_ANNOTATION));
    assert_eq!(
        update
            .annotations
            .get(MANAGED_ANNOTATIONS_ANNOTATION)
            .unwrap(),
        "a-keep"
    );
    assert_eq!(update.annotations.get("host-note").unwrap(), "h");
    assert!(!update.annotations.contains_key("a-drop"));

    // all virtual labels removed: only the host's own label and vCluster's stay
    v.labels = None;
    host.labels = Some(update.labels);
    host.annotations = Some(update.annotations);
    host.managed_fields = Some(vec![
        owns_labels(
            RUNTIME_FIELD_MANAGER,
            &["keep", "new", MANAGED_BY_LABEL, NAMESPACE_LABEL],
        ),
        owns_labels("kubectl", &["host-added"]),
    ]);
    let update = t.translate_metadata_update(&v, &host).expect("changes");
    assert_eq!(
        update.labels,
        map(&[
            ("host-added", "h"),
            (MANAGED_BY_LABEL, "my-vcluster"),
            (NAMESPACE_LABEL, "ns")
        ])
    );
}

#[test]
fn legacy_managed_labels_annotation_is_read_and_kept() {
    // a host copy made by an older runtime: bookkeeping in the annotation, no managedFields
    let t = cars();
    let v = meta("c", "ns", "u");
    let mut host = t.translate_metadata(&v);
    host.labels
        .as_mut()
        .unwrap()
        .extend(map(&[("old", "1"), ("host-added", "h")]));
    host.annotations
        .as_mut()
        .unwrap()
        .insert(MANAGED_LABELS_ANNOTATION.into(), "old".into());
    let update = t.translate_metadata_update(&v, &host).expect("changes");
    assert_eq!(
        update.labels,
        map(&[
            ("host-added", "h"),
            (MANAGED_BY_LABEL, "my-vcluster"),
            (NAMESPACE_LABEL, "ns")
        ])
    );
    assert_eq!(update.annotations[MANAGED_LABELS_ANNOTATION], "old");
}

#[test]
fn translated_label_keys() {
    // the example of vCluster's own issue: `release: r1` in vCluster `vc`
    assert_eq!(
        host_label("release", "vc"),
        format!(
            "vcluster.loft.sh/label-vc-x-{}",
            &sha256_hex("release")[..10]
        )
    );
    assert_eq!(&sha256_hex("release")[..10], "a4d451ec23");
    assert_eq!(host_label("app", "vc"), "app");
    let t = NamespacedTranslator::new("vc", "host", "example.loft.sh/v1", "Car");
    let mut v = meta("c", "ns", "u");
    let spoofed = host_label(CONTROLLED_BY_LABEL, "vc");
    v.labels = Some(map(&[
        ("release", "r1"),
        (MANAGED_BY_LABEL, "other"),
        (spoofed.as_str(), "dropped"),
        ("app", "a"),
    ]));
    let host = t.translate_metadata(&v);
    assert_eq!(
        host.labels.unwrap(),
        map(&[
            ("vcluster.loft.sh/label-vc-x-a4d451ec23", "r1"),
            (host_label(MANAGED_BY_LABEL, "vc").as_str(), "other"),
            ("app", "a"),
            (MANAGED_BY_LABEL, "vc"),
            (NAMESPACE_LABEL, "ns"),
        ])
    );
}

#[test]
fn owner_reference_to_the_vcluster_service() {
    let t = cars().with_owner_uid(Some("svc-uid".into()));
    let mut v = meta("c", "ns", "u");
    let host = t.translate_metadata(&v);
    let expected = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: "my-vcluster".into(),
        uid: "svc-uid".into(),
        controller: Some(false),
        block_owner_deletion: None,
    };
    assert_eq!(host.owner_references, Some(vec![expected.clone()]));
    // a virtual object with a controller: the reference is marked controller too
    v.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "rs".into(),
        uid: "rs-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let host = t.translate_metadata(&v);
    let mut controller = expected;
    controller.controller = Some(true);
    assert_eq!(host.owner_references, Some(vec![controller]));
    // no uid: no owner
    let host = cars()
        .with_owner_uid(Some(String::new()))
        .translate_metadata(&v);
    assert_eq!(host.owner_references, None);
}

#[test]
fn update_restores_reserved_values() {
    let t = cars();
    let v = meta("c", "ns", "u");
    let mut host = t.translate_metadata(&v);
    host.labels
        .as_mut()
        .unwrap()
        .insert(MANAGED_BY_LABEL.into(), "my-vcluster".into());
    host.annotations
        .as_mut()
        .unwrap()
        .insert(UID_ANNOTATION.into(), "tampered".into());
    let update = t.translate_metadata_update(&v, &host).expect("changes");
    assert_eq!(update.annotations.get(UID_ANNOTATION).unwrap(), "u");
}

#[test]
fn host_object_copies_spec_not_status() {
    let t = cars();
    let virtual_obj = DynamicObject {
        types: None,
        metadata: meta("c", "ns", "u"),
        data: json!({"spec": {"type": "BMW", "seats": 4}, "status": {"moving": true}}),
    };
    let host = t.host_object(&virtual_obj);
    assert_eq!(host.data, json!({"spec": {"type": "BMW", "seats": 4}}));
    assert_eq!(host.types.as_ref().unwrap().kind, "Car");

    // update: spec replaced, host status kept, removed fields removed
    let mut existing = host.clone();
    existing.data =
        json!({"spec": {"type": "Audi", "color": "red"}, "status": {"ok": 1}, "extra": 1});
    existing.metadata.resource_version = Some("7".into());
    let desired = t.host_object_update(&virtual_obj, &existing);
    assert_eq!(
        desired.data,
        json!({"spec": {"type": "BMW", "seats": 4}, "status": {"ok": 1}})
    );
    assert_eq!(desired.metadata.resource_version.as_deref(), Some("7"));
}

#[test]
fn from_host_copy_keeps_name_and_marks_the_source() {
    let t = FromHostTranslator::new("vc-ns", "example.loft.sh/v1", "Car");
    let host: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": "imported", "namespace": "vc-ns", "uid": "host-uid",
                     "resourceVersion": "9", "labels": {"team": "a"},
                     "annotations": {"note": "n"}},
        "spec": {"type": "Audi"}, "status": {"host": true}, "extra": [1]
    }))
    .unwrap();
    let created = t.virtual_object(&host, ("vc-ns", "imported"), None);
    let expected: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": "imported", "namespace": "vc-ns", "labels": {"team": "a"},
                     "annotations": {"note": "n",
                                     "vcluster.loft.sh/object-host-name": "imported",
                                     "vcluster.loft.sh/object-host-namespace": "vc-ns"}},
        "spec": {"type": "Audi"}, "extra": [1]
    }))
    .unwrap();
    assert_eq!(created, expected);
    assert!(t.is_virtual_copy_of(&created.metadata, "imported"));
    assert!(!t.is_virtual_copy_of(&created.metadata, "other"));
    assert!(!t.is_virtual_copy_of(&meta("imported", "vc-ns", "u"), "imported"));
    let elsewhere = FromHostTranslator::new("other-ns", "example.loft.sh/v1", "Car");
    assert!(!elsewhere.is_virtual_copy_of(&created.metadata, "imported"));
    // an object brought back for a synced object is not a FromHost copy, whatever it names
    let mut produced = created.clone();
    produced.annotations_mut().insert(
        "vcp.dev/produced-for".into(),
        "Car.example.loft.sh/c".into(),
    );
    assert!(!t.is_virtual_copy_of(&produced.metadata, "imported"));
    // a mapping renames: the marks still name the host object
    let renamed = t.virtual_object(&host, ("team-a", "car-a"), None);
    assert_eq!(renamed.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(renamed.metadata.name.as_deref(), Some("car-a"));
    assert_eq!(
        t.host_source(&renamed.metadata).as_deref(),
        Some("imported")
    );

    // an update keeps the virtual object's own metadata and status
    let mut base = created.clone();
    base.metadata.uid = Some("virtual-uid".into());
    base.metadata.resource_version = Some("3".into());
    base.metadata.labels = Some(map(&[("virtual-only", "x")]));
    base.data = json!({"spec": {"type": "BMW"}, "status": {"virtual": true}});
    let updated = t.virtual_object(&host, ("vc-ns", "imported"), Some(&base));
    assert_eq!(updated.metadata.uid.as_deref(), Some("virtual-uid"));
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(updated.metadata.labels, Some(map(&[("team", "a")])));
    assert_eq!(
        updated.data,
        json!({"spec": {"type": "Audi"}, "extra": [1], "status": {"virtual": true}})
    );
}

#[test]
fn host_copy_recognition() {
    let t = cars();
    let v = meta("c", "ns", "u");
    let host = t.translate_metadata(&v);
    assert!(t.is_host_copy_of(&host, "c", "ns"));
    assert!(!t.is_host_copy_of(&host, "c", "other"));
    assert_eq!(t.virtual_key(&host), Some(("ns".into(), "c".into())));
    let other_vcluster =
        NamespacedTranslator::new("other", "vcluster-my-vcluster", "example.loft.sh/v1", "Car");
    assert!(!other_vcluster.is_host_copy_of(&host, "c", "ns"));
    assert_eq!(other_vcluster.virtual_key(&host), None);
    let other_kind =
        NamespacedTranslator::new("my-vcluster", "vcluster-my-vcluster", "v1", "ConfigMap");
    assert!(!other_kind.is_host_copy_of(&host, "c", "ns"));
}

/// The labels hooks and patches may not write outside `vcluster.loft.sh/`
/// (`vcp_crds::RESERVED_LABELS`) are exactly the translated ones outside that prefix, the list
/// the translation oracle proves against vCluster's `translate.HostLabel`.
#[test]
fn reserved_labels_are_the_translated_labels_outside_vclusters_prefix() {
    let translated: Vec<&str> = TRANSLATED_LABELS
        .iter()
        .copied()
        .filter(|k| !k.starts_with("vcluster.loft.sh/"))
        .collect();
    assert_eq!(translated, vcp_crds::RESERVED_LABELS);
}
