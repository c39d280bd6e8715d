//! Compatibility table: host names, labels and annotations exactly as vCluster's own syncer
//! makes them (vCluster `pkg/util/translate`: `SafeConcatName` — joined with `-`, over 63
//! bytes cut to 52 + `-` + 10 hex of sha256, then `.-` → `-`; single-namespace `HostName`
//! `<name>-x-<namespace>-x-<vcluster>`; `HostLabels` / `HostAnnotations` with the
//! `managed-annotations` bookkeeping of `applyMaps`; no `managed-labels` on create). The
//! translation oracle (`tests/tests/oracle_translate.rs`) checks the same against vCluster's
//! own code on generated cases.
//!
//! The expected names are literals computed outside this crate (Python's hashlib), not by the
//! function under test.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use vcp_syncer_runtime::translate::{NamespacedTranslator, host_name};

#[test]
fn host_names() {
    let cases: Vec<(&str, String, String, String, &str)> = vec![
        (
            "short name",
            String::from("my-car"),
            String::from("default"),
            String::from("my-vcluster"),
            "my-car-x-default-x-my-vcluster",
        ),
        (
            "short names",
            String::from("audi"),
            String::from("team-a"),
            String::from("vc"),
            "audi-x-team-a-x-vc",
        ),
        (
            "dots are kept when short",
            String::from("with.dots"),
            String::from("ns"),
            String::from("vc"),
            "with.dots-x-ns-x-vc",
        ),
        (
            "joined exactly 63: kept",
            "a".repeat(53),
            String::from("ns"),
            String::from("vc"),
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x-ns-x-vc",
        ),
        (
            "joined 64: cut at 52 + sha256",
            "a".repeat(54),
            String::from("ns"),
            String::from("vc"),
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-b8d0c4da7c",
        ),
        (
            "dot right before the cut: `.-` becomes `-`",
            format!("{}.{}", "b".repeat(51), "c".repeat(20)),
            String::from("ns"),
            String::from("vc"),
            "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-8f842dd8e4",
        ),
        (
            "dot two before the cut stays",
            format!("{}.c{}", "b".repeat(50), "d".repeat(20)),
            String::from("ns"),
            String::from("vc"),
            "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.c-562a10db36",
        ),
        (
            "long namespace, joined 62: kept",
            String::from("x"),
            "n".repeat(53),
            String::from("vc"),
            "x-x-nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn-x-vc",
        ),
        (
            "long vCluster name: cut",
            String::from("x"),
            String::from("ns"),
            "v".repeat(60),
            "x-x-ns-x-vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv-0dc0bfd40c",
        ),
        (
            "pod-like name",
            String::from("web-0"),
            String::from("kube-system"),
            String::from("vcluster"),
            "web-0-x-kube-system-x-vcluster",
        ),
        (
            "tutorial long name",
            String::from("a-very-long-car-name-that-will-not-fit-into-a-kubernetes-label"),
            String::from("default"),
            String::from("my-vcluster"),
            "a-very-long-car-name-that-will-not-fit-into-a-kubern-766e2a4534",
        ),
        (
            "dotted name",
            String::from("car.v1.example"),
            String::from("prod"),
            String::from("vc-1"),
            "car.v1.example-x-prod-x-vc-1",
        ),
        (
            "digits, joined 70",
            "1234567890".repeat(6),
            String::from("ns"),
            String::from("vc"),
            "1234567890123456789012345678901234567890123456789012-3c3d4d3a16",
        ),
        (
            "long vCluster, short name",
            String::from("z"),
            String::from("default"),
            String::from("my-vcluster-with-a-very-long-name-that-is-long-enough-too"),
            "z-x-default-x-my-vcluster-with-a-very-long-name-that-bbe267da76",
        ),
    ];
    assert!(cases.len() >= 14);
    for (what, name, namespace, vcluster, expected) in cases {
        let got = host_name(&name, &namespace, &vcluster);
        assert_eq!(got, expected, "{what}");
        assert!(got.len() <= 63, "{what}: {got} longer than 63");
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn virtual_meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some("car".into()),
        namespace: Some("team-a".into()),
        uid: Some("uid-1".into()),
        labels: (!labels.is_empty()).then(|| map(labels)),
        annotations: (!annotations.is_empty()).then(|| map(annotations)),
        ..ObjectMeta::default()
    }
}

fn translator() -> NamespacedTranslator {
    NamespacedTranslator::new("vc", "host-ns", "example.loft.sh/v1", "Car")
}

/// The annotations vCluster always sets on a host copy of `team-a/car`.
fn base_annotations() -> Vec<(&'static str, &'static str)> {
    vec![
        ("vcluster.loft.sh/object-name", "car"),
        ("vcluster.loft.sh/object-namespace", "team-a"),
        ("vcluster.loft.sh/object-uid", "uid-1"),
        (
            "vcluster.loft.sh/object-kind",
            "example.loft.sh/v1, Kind=Car",
        ),
        ("vcluster.loft.sh/object-host-name", "car-x-team-a-x-vc"),
        ("vcluster.loft.sh/object-host-namespace", "host-ns"),
    ]
}

/// Label or annotation pairs of a case.
type Pairs = &'static [(&'static str, &'static str)];

const MANAGED_BY: (&str, &str) = ("vcluster.loft.sh/managed-by", "vc");
const NAMESPACE: (&str, &str) = ("vcluster.loft.sh/namespace", "team-a");

#[test]
fn label_and_annotation_sets_on_create() {
    /// (what, virtual labels, virtual annotations, expected extra labels, expected extra
    /// annotations)
    type Case = (
        &'static str,
        Pairs,
        Pairs,
        Vec<(&'static str, &'static str)>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        ("no labels, no annotations", &[], &[], vec![], vec![]),
        (
            "labels copied, no managed-labels annotation",
            &[("tier", "gold"), ("app", "cars")],
            &[],
            vec![("app", "cars"), ("tier", "gold")],
            vec![],
        ),
        (
            "release is translated (vCluster's HostLabel)",
            &[("release", "r1")],
            &[],
            vec![("vcluster.loft.sh/label-vc-x-a4d451ec23", "r1")],
            vec![],
        ),
        (
            "annotations into managed-annotations",
            &[],
            &[("note", "fast"), ("a.example.com/x", "1")],
            vec![],
            vec![
                ("note", "fast"),
                ("a.example.com/x", "1"),
                (
                    "vcluster.loft.sh/managed-annotations",
                    "a.example.com/x\nnote",
                ),
            ],
        ),
        (
            "a spoofed reserved annotation is overwritten, not managed",
            &[],
            &[("vcluster.loft.sh/object-name", "spoofed")],
            vec![],
            vec![],
        ),
        (
            "a virtual managed-by label is translated, not taken",
            &[("vcluster.loft.sh/managed-by", "other")],
            &[],
            // sha256("vcluster.loft.sh/managed-by") starts e5f1b28ab2 (computed with sha256sum)
            vec![("vcluster.loft.sh/label-vc-x-e5f1b28ab2", "other")],
            vec![],
        ),
        (
            "prefixed label keys",
            &[("app.kubernetes.io/name", "car")],
            &[],
            vec![("app.kubernetes.io/name", "car")],
            vec![],
        ),
    ];
    for (what, labels, annotations, extra_labels, extra_annotations) in cases {
        let host = translator().translate_metadata(&virtual_meta(labels, annotations));
        let mut want_labels = extra_labels;
        want_labels.extend([MANAGED_BY, NAMESPACE]);
        let mut want_annotations = base_annotations();
        want_annotations.extend(extra_annotations);
        assert_eq!(host.name.as_deref(), Some("car-x-team-a-x-vc"), "{what}");
        assert_eq!(host.namespace.as_deref(), Some("host-ns"), "{what}");
        assert_eq!(host.labels, Some(map(&want_labels)), "{what}: labels");
        assert_eq!(
            host.annotations,
            Some(map(&want_annotations)),
            "{what}: annotations"
        );
    }
}

/// The managedFields entry the API server records for `manager` writing the label keys `keys`.
fn owns_labels(manager: &str, keys: &[&str]) -> ManagedFieldsEntry {
    let labels: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|k| (format!("f:{k}"), serde_json::json!({})))
        .collect();
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(
            serde_json::json!({"f:metadata": {"f:labels": labels}}),
        )),
        ..ManagedFieldsEntry::default()
    }
}

#[test]
fn label_bookkeeping_on_update() {
    // (what, virtual labels before, labels added on the host, virtual labels after,
    //  expected host labels after (besides managed-by/namespace))
    type Case = (&'static str, Pairs, Pairs, Pairs, Pairs);
    let cases: Vec<Case> = vec![
        (
            "unchanged: no update",
            &[("a", "1")],
            &[],
            &[("a", "1")],
            &[("a", "1")],
        ),
        (
            "value changed",
            &[("a", "1")],
            &[],
            &[("a", "2")],
            &[("a", "2")],
        ),
        (
            "key removed in the virtual cluster is removed on the host",
            &[("a", "1"), ("b", "2")],
            &[],
            &[("a", "1")],
            &[("a", "1")],
        ),
        (
            "key added on the host is kept",
            &[("a", "1")],
            &[("host", "h")],
            &[("a", "1")],
            &[("a", "1"), ("host", "h")],
        ),
        (
            "all virtual keys removed: host key kept",
            &[("a", "1")],
            &[("host", "h")],
            &[],
            &[("host", "h")],
        ),
        (
            "key added in the virtual cluster",
            &[],
            &[],
            &[("n", "1")],
            &[("n", "1")],
        ),
        (
            "virtual takes over a key the host added",
            &[],
            &[("k", "host")],
            &[("k", "virtual")],
            &[("k", "virtual")],
        ),
    ];
    for (what, before, host_added, after, want) in cases {
        let t = translator();
        let mut host = t.translate_metadata(&virtual_meta(before, &[]));
        host.labels
            .get_or_insert_with(Default::default)
            .extend(map(host_added));
        // what the API server records: the runtime wrote the labels of the create, someone
        // else the labels added on the host
        let mut created: Vec<&str> = before.iter().map(|(k, _)| *k).collect();
        created.extend([MANAGED_BY.0, NAMESPACE.0]);
        host.managed_fields = Some(vec![
            owns_labels("vcluster-plugin-syncer", &created),
            owns_labels(
                "kubectl",
                &host_added.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ),
        ]);
        let update = t.translate_metadata_update(&virtual_meta(after, &[]), &host);
        let (labels, annotations) = match update {
            Some(update) => (update.labels, update.annotations),
            None => {
                assert_eq!(before, after, "{what}: an update was expected");
                (
                    host.labels.clone().unwrap(),
                    host.annotations.clone().unwrap(),
                )
            }
        };
        let mut want_labels = want.to_vec();
        want_labels.extend([MANAGED_BY, NAMESPACE]);
        assert_eq!(labels, map(&want_labels), "{what}: labels");
        assert_eq!(
            annotations.get("vcluster.loft.sh/managed-labels"),
            None,
            "{what}: no managed-labels annotation"
        );
    }
}
