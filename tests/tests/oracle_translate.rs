//! Translation oracle: vCluster's own code is the referee of the runtime's translation.
//!
//! `scripts/oracles build` builds `tests/vcluster-go/cmd/translate-oracle`, a Go program that
//! imports `github.com/loft-sh/vcluster/pkg/util/translate`, once for each version of
//! [`vcp_tests::VCLUSTER_VERSIONS`] (v0.30.0, pinned in `tests/vcluster-go/go.mod`, and v0.36.1,
//! `tests/vcluster-go-v0.36/go.mod`; the same cases are asked of both), and answers, one JSON line per request, what vCluster's
//! syncer writes on the host (`HostMetadata` with the single-namespace translator, `VClusterName`
//! and the owner Service set as its start-up sets them; `HostLabels` / `HostAnnotations` of an
//! existing host object; `SingleNamespaceHostName`; `SafeConcatName`; `HostLabel`;
//! `HostLabelSelector`, the rule of a `labels` patch). This test
//! asks it and `vcp_syncer_runtime::translate` the same questions — at least 10,000 generated
//! cases and the committed table `tests/fixtures/translate-oracle/edge-cases.json` — and demands
//! identical answers. The only accepted differences are the deliberate ones in
//! [`DELIBERATE_DIFFERENCES`], each applied by name to vCluster's answer (so the rest of that
//! answer is still compared) and each shown to occur. The number of cases compared is printed.

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use vcp_syncer_runtime::translate::{
    NamespacedTranslator, host_label, host_name, safe_concat_name,
};
use vcp_tests::repo_root;

/// The differences between the runtime and vCluster that are there on purpose. Each is applied,
/// by name, to vCluster's answer before the comparison, and the test fails when one never
/// applies (a difference listed here must exist). README.md ("vCluster compatibility") says why.
const DELIBERATE_DIFFERENCES: [(&str, &str); 1] = [(
    "host-added-labels-kept",
    "on update, labels someone else added to a host copy stay on the host; vCluster's \
     HostLabels(vObj, pObj) keeps only the virtual object's labels (its syncers keep host \
     labels by syncing them up into the virtual object, which the runtime never writes)",
)];

/// The field manager the runtime writes host copies with (its label ownership is read from
/// `managedFields` on update).
const RUNTIME_FIELD_MANAGER: &str = "vcluster-plugin-syncer";

/// Every `vcluster.loft.sh/*` key that appears in vCluster v0.30.0's Go code (grep of its
/// module), and the ones v0.36.1's code adds (the last nine), used as label and annotation keys
/// of the generated virtual objects (asked of both versions).
const VCLUSTER_KEYS: [&str; 70] = [
    "vcluster.loft.sh/apply",
    "vcluster.loft.sh/belongs-to",
    "vcluster.loft.sh/block-deletion",
    "vcluster.loft.sh/controlled-by",
    "vcluster.loft.sh/created",
    "vcluster.loft.sh/created-by-cli",
    "vcluster.loft.sh/csi-volumesnapshot-class",
    "vcluster.loft.sh/disable-subdomain-rewrite",
    "vcluster.loft.sh/distro",
    "vcluster.loft.sh/dynamicvolumesnapshot",
    "vcluster.loft.sh/fake-node",
    "vcluster.loft.sh/fake-pv",
    "vcluster.loft.sh/force-sync",
    "vcluster.loft.sh/host-pv",
    "vcluster.loft.sh/host-volumesnapshotcontent",
    "vcluster.loft.sh/hosts-rewritten",
    "vcluster.loft.sh/join-script-endpoint",
    "vcluster.loft.sh/label",
    "vcluster.loft.sh/label-suffix-x-101dcd4e86",
    "vcluster.loft.sh/label-suffix-x-a4d451ec23",
    "vcluster.loft.sh/label-suffix-x-e5f1b28ab2",
    "vcluster.loft.sh/labels",
    "vcluster.loft.sh/lock",
    "vcluster.loft.sh/managed-annotations",
    "vcluster.loft.sh/managed-by",
    "vcluster.loft.sh/managed-labels",
    "vcluster.loft.sh/migrated-from-k3s",
    "vcluster.loft.sh/name",
    "vcluster.loft.sh/namespace",
    "vcluster.loft.sh/node",
    "vcluster.loft.sh/ns-label",
    "vcluster.loft.sh/object-host-name",
    "vcluster.loft.sh/object-host-namespace",
    "vcluster.loft.sh/object-imported",
    "vcluster.loft.sh/object-kind",
    "vcluster.loft.sh/object-name",
    "vcluster.loft.sh/object-namespace",
    "vcluster.loft.sh/object-uid",
    "vcluster.loft.sh/original-taints",
    "vcluster.loft.sh/owner-references",
    "vcluster.loft.sh/owner-set-kind",
    "vcluster.loft.sh/persistentvolumeclaim",
    "vcluster.loft.sh/physical-volumesnapshotcontent-gc",
    "vcluster.loft.sh/preprovisionedvolumesnapshot",
    "vcluster.loft.sh/restore-controller",
    "vcluster.loft.sh/restore-request",
    "vcluster.loft.sh/service-account-name",
    "vcluster.loft.sh/service-cidr",
    "vcluster.loft.sh/skip-backsync",
    "vcluster.loft.sh/skip-translate",
    "vcluster.loft.sh/snapshot-controller",
    "vcluster.loft.sh/snapshot-request",
    "vcluster.loft.sh/standalone-endpoints",
    "vcluster.loft.sh/status",
    "vcluster.loft.sh/store",
    "vcluster.loft.sh/token",
    "vcluster.loft.sh/token-node-type",
    "vcluster.loft.sh/uid",
    "vcluster.loft.sh/upgrade-node",
    "vcluster.loft.sh/vcluster-name",
    "vcluster.loft.sh/vcluster-namespace",
    // added by v0.36.1
    "vcluster.loft.sh/cert-rotation-at",
    "vcluster.loft.sh/certificate-refs-sanitized",
    "vcluster.loft.sh/imported-gateway",
    "vcluster.loft.sh/join-token",
    "vcluster.loft.sh/ns-label-team",
    "vcluster.loft.sh/preserve-host-rule",
    "vcluster.loft.sh/preserve-request-mirror-filters",
    "vcluster.loft.sh/protected",
    "vcluster.loft.sh/source-gateway",
];

/// Other label / annotation keys: plain, prefixed, and the Helm ones.
const OTHER_KEYS: [&str; 12] = [
    "release",
    "app",
    "tier",
    "a",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "example.com/release",
    "kubectl.kubernetes.io/last-applied-configuration",
    "x.y/managed-by",
    "heritage",
];

/// vCluster `version`'s answers to `requests`, in order (one oracle process for all of them).
fn ask_vcluster(version: &str, requests: &[Value]) -> Vec<Value> {
    vcp_tests::translate_oracle_at(version, requests)
}

fn str_of<'a>(request: &'a Value, key: &str) -> &'a str {
    request[key].as_str().unwrap_or_default()
}

fn translator_of(request: &Value) -> NamespacedTranslator {
    let object = &request["object"];
    NamespacedTranslator::new(
        str_of(request, "vcluster"),
        str_of(request, "hostNamespace"),
        object["apiVersion"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or_default(),
    )
    .with_owner_uid(request["ownerUID"].as_str().map(str::to_string))
}

fn non_empty(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

/// The runtime's answer to one request, in the oracle's shape.
fn ask_runtime(request: &Value) -> Value {
    match str_of(request, "op") {
        "metadata" => {
            let object: DynamicObject =
                serde_json::from_value(request["object"].clone()).expect("virtual object");
            let meta = translator_of(request).translate_metadata(&object.metadata);
            json!({"metadata": meta})
        }
        "update" => {
            let object: DynamicObject =
                serde_json::from_value(request["object"].clone()).expect("virtual object");
            let host: DynamicObject =
                serde_json::from_value(request["host"].clone()).expect("host object");
            let (labels, annotations) = match translator_of(request)
                .translate_metadata_update(&object.metadata, &host.metadata)
            {
                Some(update) => (update.labels, update.annotations),
                None => (
                    host.metadata.labels.clone().unwrap_or_default(),
                    host.metadata.annotations.clone().unwrap_or_default(),
                ),
            };
            let mut answer = json!({});
            if let Some(labels) = non_empty(labels) {
                answer["labels"] = json!(labels);
            }
            if let Some(annotations) = non_empty(annotations) {
                answer["annotations"] = json!(annotations);
            }
            answer
        }
        "hostName" => json!({"name": host_name(
            str_of(request, "name"),
            str_of(request, "namespace"),
            str_of(request, "vcluster"),
        )}),
        "concat" => {
            let parts: Vec<&str> = request["parts"]
                .as_array()
                .expect("parts")
                .iter()
                .map(|p| p.as_str().expect("a part is a string"))
                .collect();
            json!({"name": safe_concat_name(&parts)})
        }
        "hostLabel" => {
            json!({"name": host_label(str_of(request, "key"), str_of(request, "vcluster"))})
        }
        op => panic!("unknown op {op}"),
    }
}

/// Applies the deliberate differences to vCluster's answer `expected` for `request`; returns
/// the names of those that applied.
fn apply_deliberate_differences(request: &Value, expected: &mut Value) -> Vec<&'static str> {
    let mut applied = Vec::new();
    if str_of(request, "op") == "update" {
        // host-added-labels-kept: host labels the runtime did not write and the virtual
        // object does not set stay on the host.
        let owned = owned_labels(&request["host"]);
        let reserved = [
            "vcluster.loft.sh/managed-by",
            "vcluster.loft.sh/namespace",
            "vcluster.loft.sh/controlled-by",
        ];
        let labels = expected["labels"].as_object_mut().expect("labels");
        for (key, value) in request["host"]["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if !owned.contains(key)
                && !reserved.contains(&key.as_str())
                && !labels.contains_key(key)
            {
                labels.insert(key.clone(), value.clone());
                if !applied.contains(&DELIBERATE_DIFFERENCES[0].0) {
                    applied.push(DELIBERATE_DIFFERENCES[0].0);
                }
            }
        }
    }
    applied
}

/// The label keys the runtime wrote on a host object, read here independently of the
/// runtime: those its field manager owns in `managedFields`, and those listed in the
/// `vcluster.loft.sh/managed-labels` annotation of a copy an older runtime made.
fn owned_labels(host: &Value) -> Vec<String> {
    let legacy = host["metadata"]["annotations"]["vcluster.loft.sh/managed-labels"]
        .as_str()
        .unwrap_or_default()
        .split('\n')
        .map(str::to_string);
    host["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["manager"] == RUNTIME_FIELD_MANAGER)
        .flat_map(|entry| {
            entry["fieldsV1"]["f:metadata"]["f:labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("f:").map(str::to_string))
                .collect::<Vec<_>>()
        })
        .chain(legacy)
        .collect()
}

/// Compares vCluster `version`'s and the runtime's answers to every request; returns how many
/// were compared and which deliberate differences applied.
fn compare(
    version: &str,
    what: &str,
    requests: &[Value],
) -> (usize, BTreeMap<&'static str, usize>) {
    let answers = ask_vcluster(version, requests);
    let mut differences: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut mismatches = Vec::new();
    for (request, vcluster) in requests.iter().zip(answers) {
        let mut expected = vcluster;
        for name in apply_deliberate_differences(request, &mut expected) {
            *differences.entry(name).or_default() += 1;
        }
        let got = ask_runtime(request);
        if got != expected {
            mismatches.push(format!(
                "request: {request}\n  vCluster: {expected}\n  runtime:  {got}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{what}: {} of {} cases differ from vCluster {version}; the first ones:\n{}",
        mismatches.len(),
        requests.len(),
        mismatches
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    (requests.len(), differences)
}

/// A deterministic pseudo-random sequence (xorshift64*), so every run compares the same cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A lower-case name of `len` bytes starting at letter `seed`.
fn letters(len: usize, seed: usize) -> String {
    (0..len)
        .map(|i| char::from(b'a' + ((i + seed) % 26) as u8))
        .collect()
}

/// vCluster names of every length from 1 to 63 bytes (with a dash or dot inside some).
fn vcluster_names() -> Vec<String> {
    (1..=63)
        .map(|len| {
            let mut name = letters(len, len);
            if len > 4 && len % 3 == 0 {
                name.replace_range(len / 2..len / 2 + 1, "-");
            }
            name
        })
        .collect()
}

/// `SingleNamespaceHostName` cases: vCluster and namespace names of several lengths, and names
/// chosen so that the joined `<name>-x-<namespace>-x-<vcluster>` has every length from 40 to
/// 80 bytes, with a dot or a dash placed around the cut at byte 52.
fn host_name_cases() -> Vec<Value> {
    let mut cases = Vec::new();
    let vcluster_lengths = [1, 2, 3, 10, 28, 40, 51, 52, 53, 62, 63];
    let namespace_lengths = [1, 5, 15, 46, 52, 63];
    // (position in the joined name, character)
    let marks: [&[(usize, char)]; 8] = [
        &[],
        &[(51, '.')],
        &[(51, '-')],
        &[(52, '.')],
        &[(50, '.')],
        &[(52, '-')],
        &[(50, '.'), (51, '-')],
        &[(51, '.'), (53, '-')],
    ];
    for &vc_len in &vcluster_lengths {
        for &ns_len in &namespace_lengths {
            for joined in 40..=80usize {
                let Some(name_len) = joined.checked_sub(ns_len + vc_len + 6) else {
                    continue;
                };
                if name_len == 0 {
                    continue;
                }
                for mark in marks {
                    let mut parts = [
                        letters(name_len, joined).into_bytes(),
                        letters(ns_len, ns_len + 7).into_bytes(),
                        letters(vc_len, vc_len + 3).into_bytes(),
                    ];
                    for &(at, c) in mark {
                        // the byte `at` of the joined name falls into one part (or a separator)
                        let offsets = [0, name_len + 3, name_len + ns_len + 6];
                        for (i, part) in parts.iter_mut().enumerate() {
                            if at > offsets[i] && at + 1 < offsets[i] + part.len() {
                                part[at - offsets[i]] = c as u8;
                            }
                        }
                    }
                    let [name, namespace, vcluster] =
                        parts.map(|p| String::from_utf8(p).expect("ascii"));
                    cases.push(
                        json!({"op": "hostName", "name": name, "namespace": namespace,
                                      "vcluster": vcluster}),
                    );
                }
            }
        }
    }
    cases
}

/// `SafeConcatName` cases: one to six parts, total lengths around 52 and 63 bytes, dots and
/// dashes at the ends of parts.
fn concat_cases(rng: &mut Rng) -> Vec<Value> {
    let mut cases = Vec::new();
    for total in 45..=75usize {
        for _ in 0..40 {
            let count = 1 + rng.below(6);
            let mut parts = Vec::new();
            let mut left = total.saturating_sub(count - 1);
            for i in 0..count {
                let len = if i + 1 == count {
                    left
                } else {
                    rng.below(left.max(1) + 1)
                };
                left -= len.min(left);
                let mut part = letters(len, rng.below(26)).into_bytes();
                if !part.is_empty() && rng.chance(40) {
                    let at = rng.below(part.len());
                    part[at] = *rng.pick(b".-");
                }
                parts.push(String::from_utf8(part).expect("ascii"));
            }
            cases.push(json!({"op": "concat", "parts": parts}));
        }
    }
    cases
}

fn host_label_cases(vclusters: &[String]) -> Vec<Value> {
    let mut cases = Vec::new();
    for vcluster in vclusters {
        for key in OTHER_KEYS.iter().chain(VCLUSTER_KEYS.iter()) {
            cases.push(json!({"op": "hostLabel", "vcluster": vcluster, "key": key}));
        }
    }
    cases
}

/// `vcluster.loft.sh/label-<vcluster>-x-<10 hex of sha256(key)>` for the keys vCluster
/// translates, spelled out here (not by the runtime) to put translated-looking keys on virtual
/// objects; only short enough vCluster names give the uncut form.
fn translated_looking_keys(vcluster: &str) -> Vec<String> {
    [
        "release",
        "vcluster.loft.sh/namespace",
        "vcluster.loft.sh/managed-by",
        "vcluster.loft.sh/controlled-by",
    ]
    .iter()
    .map(|key| {
        let digest: String = Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("vcluster.loft.sh/label-{vcluster}-x-{}", &digest[..10])
    })
    .collect()
}

/// A random label or annotation map over `keys` (absent, empty, or a few keys).
fn random_map(rng: &mut Rng, keys: &[String]) -> Option<Value> {
    match rng.below(10) {
        0 => None,
        1 => Some(json!({})),
        _ => {
            let mut map = Map::new();
            for _ in 0..1 + rng.below(6) {
                let key = rng.pick(keys).clone();
                let value = match rng.below(6) {
                    0 => String::new(),
                    1 => "note\nrelease".to_string(),
                    2 => "r1".to_string(),
                    _ => letters(1 + rng.below(20), rng.below(26)),
                };
                map.insert(key, json!(value));
            }
            Some(Value::Object(map))
        }
    }
}

/// Random virtual objects for `HostMetadata` (and, from vCluster's own answer as the existing
/// host object, for `HostLabels` / `HostAnnotations` on update).
fn metadata_cases(rng: &mut Rng, vclusters: &[String], count: usize) -> Vec<Value> {
    let types = [
        ("example.loft.sh/v1", "Car"),
        ("v1", "ConfigMap"),
        ("apps/v1", "Deployment"),
        ("networking.k8s.io/v1", "Ingress"),
    ];
    let namespaces = [
        "default".to_string(),
        "team-a".to_string(),
        "a".to_string(),
        letters(30, 3),
        letters(63, 5),
    ];
    let mut cases = Vec::new();
    for i in 0..count {
        let vcluster = vclusters[i % vclusters.len()].clone();
        let host_namespace = if rng.chance(20) {
            letters(63, 9)
        } else {
            format!("vcluster-{}", &vcluster[..vcluster.len().min(40)])
        };
        let mut keys: Vec<String> = OTHER_KEYS
            .iter()
            .chain(VCLUSTER_KEYS.iter())
            .map(|k| k.to_string())
            .collect();
        keys.extend(translated_looking_keys(&vcluster));
        keys.extend(translated_looking_keys("other"));
        let (api_version, kind) = *rng.pick(&types);
        let namespace = rng.pick(&namespaces).clone();
        let mut name = letters(1 + rng.below(62), rng.below(26)).into_bytes();
        if name.len() > 2 && rng.chance(30) {
            let at = 1 + rng.below(name.len() - 2);
            name[at] = *rng.pick(b".-");
        }
        let name = String::from_utf8(name).expect("ascii");
        let mut metadata = json!({"name": name, "namespace": namespace,
                                  "uid": if rng.chance(5) { String::new() } else { format!("uid-{i}") }});
        if let Some(labels) = random_map(rng, &keys) {
            metadata["labels"] = labels;
        }
        if let Some(annotations) = random_map(rng, &keys) {
            metadata["annotations"] = annotations;
        }
        // server-owned fields that a host copy must not carry
        for (field, value) in [
            ("resourceVersion", json!("42")),
            ("generation", json!(3)),
            ("creationTimestamp", json!("2026-01-01T00:00:00Z")),
            ("generateName", json!("gen-")),
            ("finalizers", json!(["example.com/keep"])),
            ("deletionTimestamp", json!("2026-01-02T00:00:00Z")),
            ("deletionGracePeriodSeconds", json!(30)),
            ("selfLink", json!("/apis/x")),
            (
                "managedFields",
                json!([{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:spec": {}}}]),
            ),
        ] {
            if rng.chance(15) {
                metadata[field] = value;
            }
        }
        match rng.below(4) {
            0 => {
                metadata["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true}])
            }
            1 => {
                metadata["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
                    "name": "cm", "uid": "cm-uid"}])
            }
            2 => {
                metadata["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
                    "name": "cm", "uid": "cm-uid", "controller": false}])
            }
            _ => {}
        }
        let mut request = json!({"op": "metadata", "vcluster": vcluster,
            "hostNamespace": host_namespace,
            "object": {"apiVersion": api_version, "kind": kind, "metadata": metadata,
                       "spec": {"type": "BMW"}}});
        if rng.chance(70) {
            request["ownerUID"] = json!(format!("svc-uid-{}", rng.below(1000)));
        }
        cases.push(request);
    }
    cases
}

/// Update cases: vCluster's own host copy of a generated object (its `HostMetadata` answer,
/// with the `managedFields` the API server records for the runtime's create), then a changed
/// virtual object, and sometimes labels and annotations added on the host by someone else.
fn update_cases(rng: &mut Rng, creates: &[Value], created: &[Value]) -> Vec<Value> {
    let mut cases = Vec::new();
    for (create, host_meta) in creates.iter().zip(created) {
        let mut host_meta = host_meta["metadata"].clone();
        let owned: Map<String, Value> = host_meta["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| (format!("f:{k}"), json!({})))
            .collect();
        let mut managed_fields = vec![json!({"manager": RUNTIME_FIELD_MANAGER,
            "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": owned}}})];
        if rng.chance(30) {
            let key = if rng.chance(50) {
                "host-added".to_string()
            } else {
                rng.pick(&OTHER_KEYS).to_string()
            };
            host_meta["labels"][&key] = json!("h");
            managed_fields.push(json!({"manager": "kubectl", "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {format!("f:{key}"): {}}}}}));
        }
        if rng.chance(30) {
            host_meta["labels"]["vcluster.loft.sh/controlled-by"] = json!("ctrl");
        }
        if rng.chance(30) {
            host_meta["annotations"]["host-note"] = json!("h");
        }
        host_meta["managedFields"] = json!(managed_fields);
        let mut object = create["object"].clone();
        let keys: Vec<String> = OTHER_KEYS
            .iter()
            .chain(VCLUSTER_KEYS.iter())
            .map(|k| k.to_string())
            .collect();
        if rng.chance(70) {
            match random_map(rng, &keys) {
                Some(labels) => object["metadata"]["labels"] = labels,
                None => {
                    object["metadata"]
                        .as_object_mut()
                        .expect("metadata")
                        .remove("labels");
                }
            }
        }
        if rng.chance(70) {
            match random_map(rng, &keys) {
                Some(annotations) => object["metadata"]["annotations"] = annotations,
                None => {
                    object["metadata"]
                        .as_object_mut()
                        .expect("metadata")
                        .remove("annotations");
                }
            }
        }
        let host = json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
                          "metadata": host_meta});
        cases.push(json!({"op": "update", "vcluster": create["vcluster"],
            "hostNamespace": create["hostNamespace"], "object": object, "host": host}));
    }
    cases
}

/// The committed table of edge cases (requests in the oracle's format, each with a `case`
/// naming what it covers).
fn edge_cases() -> Vec<Value> {
    let path = repo_root().join("tests/fixtures/translate-oracle/edge-cases.json");
    let table: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read the edge-case table"))
            .expect("edge-case table is JSON");
    table
        .into_iter()
        .map(|mut case| {
            case.as_object_mut()
                .expect("a case is an object")
                .remove("case");
            case
        })
        .collect()
}

/// Every vCluster version of the matrix: the same generated cases (same seed) asked of each.
#[test]
fn translation_matches_vcluster() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        translation_matches(version);
    }
}

fn translation_matches(version: &str) {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let vclusters = vcluster_names();
    let mut total = 0;
    let mut differences: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut count = |what: &str, cases: &[Value]| {
        let (n, d) = compare(version, what, cases);
        for (name, k) in d {
            *differences.entry(name).or_default() += k;
        }
        eprintln!("oracle_translate: {what}: {n} cases identical to vCluster {version}");
        total += n;
    };

    count("SingleNamespaceHostName", &host_name_cases());
    count("SafeConcatName", &concat_cases(&mut rng));
    count("HostLabel", &host_label_cases(&vclusters));
    let creates = metadata_cases(&mut rng, &vclusters, 4000);
    count("HostMetadata", &creates);
    let created = ask_vcluster(version, &creates);
    count(
        "HostLabels/HostAnnotations on update",
        &update_cases(&mut rng, &creates, &created),
    );
    let table = edge_cases();
    assert!(
        table.len() >= 20,
        "the edge-case table has {} cases",
        table.len()
    );
    count("edge-case table", &table);

    for (name, why) in DELIBERATE_DIFFERENCES {
        let n = differences.get(name).copied().unwrap_or_default();
        eprintln!(
            "oracle_translate: {version}: deliberate difference {name} applied to {n} cases: {why}"
        );
        assert!(
            n > 0,
            "deliberate difference {name} never applied: remove it from the list"
        );
    }
    println!("oracle_translate: {total} cases compared with vCluster {version}, all identical");
    assert!(total >= 10_000, "only {total} cases compared");
}

/// `labels` patches (`syncedTypes[].patches[].labels`) against vCluster's own
/// `translate.HostLabelSelector` (the oracle's `hostLabelSelector`): generated selectors with
/// `matchLabels` and `matchExpressions` over vCluster's keys, the ones it translates and plain
/// ones, empty and absent parts, in vClusters of every name length; the runtime's host selector
/// (what [`vcp_syncer_runtime::patches::Patches::to_host`] writes at the patch's path) must be
/// vCluster's answer exactly, and the way back must give the virtual selector again (up to the
/// parts Go leaves out when empty).
#[test]
fn label_selector_patches_match_vcluster() {
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        label_selector_patches_match(version);
    }
}

fn label_selector_patches_match(version: &str) {
    use vcp_crds::{TranslatePatch, TranslatePatchLabels};
    use vcp_syncer_runtime::patches::Patches;

    let mut rng = Rng(0x5eed_1abe_15e1_0001);
    let vclusters = vcluster_names();
    let keys: Vec<&str> = VCLUSTER_KEYS
        .iter()
        .chain(OTHER_KEYS.iter())
        .copied()
        .collect();
    let operators = ["In", "NotIn", "Exists", "DoesNotExist"];
    let mut requests = Vec::new();
    for n in 0..2000 {
        let vcluster = rng.pick(&vclusters).clone();
        let mut selector = Map::new();
        if rng.chance(80) {
            let labels: Map<String, Value> = (0..rng.below(5))
                .map(|i| ((*rng.pick(&keys)).to_string(), json!(format!("v{i}"))))
                .collect();
            selector.insert("matchLabels".into(), Value::Object(labels));
        }
        if rng.chance(70) {
            let expressions: Vec<Value> = (0..rng.below(4))
                .map(|_| {
                    let operator = *rng.pick(&operators);
                    let values: Vec<String> = if operator.ends_with("In") {
                        (0..rng.below(3)).map(|i| format!("x{i}")).collect()
                    } else {
                        Vec::new()
                    };
                    json!({"key": rng.pick(&keys), "operator": operator, "values": values})
                })
                .collect();
            selector.insert("matchExpressions".into(), Value::Array(expressions));
        }
        requests.push(json!({
            "op": "hostLabelSelector",
            "vcluster": vcluster,
            "hostNamespace": format!("vcluster-{n}"),
            "selector": selector,
        }));
    }
    let answers = ask_vcluster(version, &requests);
    let patch = TranslatePatch {
        path: "spec.selector".into(),
        labels: Some(TranslatePatchLabels {}),
        ..TranslatePatch::default()
    };
    let mut translated_keys = 0;
    for (request, answer) in requests.iter().zip(&answers) {
        let patches = Patches::new(
            std::slice::from_ref(&patch),
            str_of(request, "vcluster"),
            str_of(request, "hostNamespace"),
        )
        .expect("a labels patch");
        let virtual_obj =
            json!({"metadata": {"namespace": "team-a"}, "spec": {"selector": request["selector"]}});
        let mut host = virtual_obj.clone();
        patches.to_host(&virtual_obj, &mut host).expect("translate");
        assert_eq!(
            host["spec"]["selector"], answer["selector"],
            "vCluster {version}: {request}"
        );
        if host["spec"]["selector"]
            .to_string()
            .contains("vcluster.loft.sh/label-")
        {
            translated_keys += 1;
        }
        // the way back: the host selector read back and translated again is vCluster's answer
        let mut up = host.clone();
        patches.to_virtual(&virtual_obj, &mut up).expect("reverse");
        let mut again = up.clone();
        patches.to_host(&up, &mut again).expect("translate");
        assert_eq!(
            again["spec"]["selector"], answer["selector"],
            "vCluster {version}: {request}"
        );
    }
    println!(
        "oracle_translate: {} label selectors identical to vCluster {version}'s HostLabelSelector ({translated_keys} with translated keys)",
        requests.len()
    );
    assert!(
        translated_keys > 100,
        "only {translated_keys} selectors had a translated key"
    );
}
