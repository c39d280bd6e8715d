//! What the plugins' declared hooks (`spec.hooks`) do, judged on representative objects before
//! a plugin is installed; pure, the Pod Security dry run of the
//! result is [`crate::judge`]'s.
//!
//! **Pods.** Every `v1` `Pod` hook with a physical event (`CreatePhysical`, `UpdatePhysical`)
//! changes every pod the vCluster runs on the host. [`judge`] applies them, in the order vCluster
//! and the runtime do ([`hook_order`]), to a pod like the ones vCluster creates
//! ([`representative_pod`]), and judges the pod after every hook:
//! - it must still decode as a Pod without losing a key ([`crate::policy::pod::lost_keys`]):
//!   vCluster reads a hook's result with Go's `encoding/json`, which matches field names
//!   case-insensitively, so `/spec/HostNetwork` would set `hostNetwork` there; and no struct
//!   of it may hold two keys that decoder reads as one field
//!   ([`crate::policy::pod::folded_duplicate_keys`]: the later one wins there);
//! - its identity must be unchanged ([`identity_change`]);
//! - the pod policy ([`crate::policy::pod::check`]: host namespaces, volume types, node,
//!   service account, runtime class, sysctls, host ports, and the container policy on every
//!   container, init container and ephemeral container).
//!
//! - a `copy` or `move` may write only one label or annotation ([`copy_destination_allowed`]):
//!   the value it writes comes from each real pod, which the representative pod cannot show.
//!
//! A hook's `test` operations are left out (the rest is judged as if they passed: a guard does
//! not make a change safe); a hook that still fails on the representative pod is refused, since
//! what it does to the vCluster's pods cannot be judged (on a pod where it fails, vCluster's
//! write of the pod fails).
//!
//! **Other kinds, and virtual events.** A hook may not touch an object's identity or
//! ownership: [`identity_change`] compares `metadata.{name, namespace, uid, finalizers,
//! ownerReferences, generateName}` and the `vcluster.loft.sh/` labels and annotations of a
//! representative object of the hook's kind ([`representative_object`]) before and after the
//! hook, as vCluster's decoder reads them ([`go_fold`]). Its operations are applied one at a
//! time; one that fails there (its path does not exist on the representative object) is judged
//! by its path instead ([`protected_pointer`]), as the CRD's CEL rule does.
//!
//! A refusal names the plugin's hook (`spec.hooks[i]`, its name and event) and the field.

use std::collections::BTreeMap;
use vcp_crds::Reason;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::ResourceExt;
use serde_json::{Value, json};
use vcp_crds::fold::go_fold;
use vcp_crds::hooks::apply_hook;
use vcp_crds::{Hook, HookEvent, JsonPatchOp, VClusterPlugin};

use crate::workload::{PluginKind, plugin_kind};

use crate::policy::ContainerPolicy;
use crate::policy::pod::{self, lost_keys};
use crate::workload::Refusal;

/// The prefix of the label and annotation keys vCluster tracks its objects by.
pub const VCLUSTER_KEY_PREFIX: &str = "vcluster.loft.sh/";

/// The `metadata` fields that make an object's identity and ownership, as spelled in the API.
pub const IDENTITY_FIELDS: [&str; 6] = [
    "name",
    "namespace",
    "uid",
    "finalizers",
    "ownerReferences",
    "generateName",
];

/// The order in which the plugins' hooks run on a host pod: first the v2 plugins (image or
/// embedded, [`crate::workload::plugin_kind`]), by name, as vCluster's syncer calls each v2
/// plugin's `Mutate` in the order it loaded them (`os.ReadDir` of `/plugins`, sorted by the folder name, which is the plugin's name);
/// then the others, by name (an embedded sidecar applies its hooks to the pod vCluster created).
pub fn hook_order<'a>(plugins: &[&'a VClusterPlugin]) -> Vec<&'a VClusterPlugin> {
    let mut sorted: Vec<&VClusterPlugin> = plugins.to_vec();
    sorted.sort_by_key(|p| {
        let v2 = matches!(plugin_kind(p), PluginKind::V2 | PluginKind::EmbeddedV2);
        (!v2, p.name_any())
    });
    sorted
}

/// The value the representative pod carries in each field whose value differs from one real
/// pod of the vCluster to another (or is the cluster owner's choice, through the vCluster's
/// configuration) and which the pod policy refuses a change of ([`UNWRITTEN_FIELDS`]): no real
/// pod has it, so a hook that writes the field with any value, even one that some real pods
/// have, changes it and is refused. With only the value of the vCluster's own pod template
/// there (its service account, `vc-<vcluster>`), a hook writing that very value changed nothing
/// on the representative pod and passed, while it moved every real pod to the control plane's
/// account (the security review's finding F2); with nothing there, a hook writing `null` (or
/// a whole `spec` without the field) changed nothing either, while it took the node selector or
/// tolerations vCluster enforces away from every real pod (finding F4). It is no DNS subdomain
/// and no label name or value (`:`), so a hook that writes exactly it makes every real pod
/// invalid (the API server validates these fields), which takes nothing from anyone else; and
/// no API server dry run sees it ([`for_the_api_server`]).
pub const UNWRITTEN: &str = "vcp:unwritten";

/// The fields of a pod's `spec` where the representative pod holds [`UNWRITTEN`] (the pod
/// policy, `crate::policy::pod`, refuses any change of each): as the value of
/// `serviceAccountName` and its deprecated alias `serviceAccount`, `nodeName`,
/// `runtimeClassName`, `priorityClassName` and `schedulerName`; as the value of a
/// `nodeSelector` entry, the key of a `tolerations` entry, of a required node affinity's
/// expression (`affinity`) and the topology key of a `topologySpreadConstraints` entry. The pod
/// policy's other fields refused on change hold no value a hook could repeat with an effect:
/// `automountServiceAccountToken` is `false` on the representative pod, and writing `false` can
/// only take a token away; `resourceClaims` is absent, and taking a real pod's claims away makes
/// that pod invalid (its containers name them), nothing more; a container image equal to the
/// representative container's (`registry.k8s.io/pause:3.10`, not judged against
/// `containers.allowedImages` as unchanged) runs nothing of the hook's.
pub const UNWRITTEN_FIELDS: [&str; 10] = [
    "serviceAccountName",
    "serviceAccount",
    "nodeName",
    "runtimeClassName",
    "priorityClassName",
    "schedulerName",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
];

/// A host pod as vCluster creates it for a pod of the virtual cluster, in namespace
/// `namespace` of vCluster `vcluster`: vCluster's name translation
/// (`<name>-x-<namespace>-x-<vcluster>`), its tracking labels and annotations, an owner
/// reference to the vCluster's Service, no token of the host account
/// (`automountServiceAccountToken: false`, the virtual token read from an annotation),
/// [`UNWRITTEN`] in each of [`UNWRITTEN_FIELDS`], and a container that meets the Pod Security
/// `restricted` level, so that whatever a hook makes of it is the hook's doing. The API server
/// gets it through [`for_the_api_server`].
pub fn representative_pod(namespace: &str, vcluster: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("vcp-representative-x-default-x-{vcluster}"),
            "namespace": namespace,
            "uid": "00000000-0000-0000-0000-000000000000",
            "labels": {
                "app": "vcp-representative",
                "vcluster.loft.sh/managed-by": vcluster,
                "vcluster.loft.sh/namespace": "default",
            },
            "annotations": {
                "vcluster.loft.sh/object-name": "vcp-representative",
                "vcluster.loft.sh/object-namespace": "default",
                "vcluster.loft.sh/object-uid": "00000000-0000-0000-0000-000000000001",
                "vcluster.loft.sh/token-vcp": "token",
            },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Service",
                "name": vcluster,
                "uid": "00000000-0000-0000-0000-000000000002",
            }],
        },
        "spec": {
            "serviceAccountName": UNWRITTEN,
            "serviceAccount": UNWRITTEN,
            "nodeName": UNWRITTEN,
            "runtimeClassName": UNWRITTEN,
            "priorityClassName": UNWRITTEN,
            "schedulerName": UNWRITTEN,
            "nodeSelector": {"vcp.dev/unwritten": UNWRITTEN},
            "tolerations": [{"key": UNWRITTEN, "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": UNWRITTEN, "operator": "Exists"}]}],
            }}},
            "topologySpreadConstraints": [{
                "maxSkew": 1,
                "topologyKey": UNWRITTEN,
                "whenUnsatisfiable": "DoNotSchedule",
            }],
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "securityContext": {
                "runAsNonRoot": true,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "workload",
                "image": "registry.k8s.io/pause:3.10",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{
                    "name": "kube-api-access-vcp",
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "readOnly": true,
                }],
            }],
            "volumes": [{
                "name": "kube-api-access-vcp",
                "projected": {"sources": [{"downwardAPI": {"items": [{
                    "path": "token",
                    "fieldRef": {"fieldPath": "metadata.annotations['vcluster.loft.sh/token-vcp']"},
                }]}}]},
            }],
        },
    })
}

/// An object of `api_version` / `kind` as vCluster keeps it on the host (or in the virtual
/// cluster): [`representative_pod`]'s metadata, no spec.
pub fn representative_object(
    api_version: &str,
    kind: &str,
    namespace: &str,
    vcluster: &str,
) -> Value {
    let pod = representative_pod(namespace, vcluster);
    json!({"apiVersion": api_version, "kind": kind, "metadata": pod["metadata"].clone()})
}

/// `pod` (the representative pod, hooked or not) as the API server may judge it in a dry run:
/// each of [`UNWRITTEN_FIELDS`] that still holds the representative pod's value (with
/// [`UNWRITTEN`]) gets the value of a pod the
/// vCluster's workload would run, `serviceAccountName` the workload's `service_account` (the
/// ServiceAccount admission plugin refuses a pod whose account does not exist), the others
/// none. A field the hooks wrote is kept as they wrote it (the pod policy refuses such a pod
/// before any dry run).
pub fn for_the_api_server(pod: &Pod, service_account: &str) -> Pod {
    let representative: PodSpec =
        serde_json::from_value(representative_pod("", "")["spec"].clone()).unwrap_or_default();
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        if spec.service_account_name == representative.service_account_name {
            spec.service_account_name = Some(service_account.to_string());
        }
        macro_rules! unset {
            ($($field:ident),*) => {$(
                if spec.$field == representative.$field {
                    spec.$field = None;
                }
            )*};
        }
        unset!(
            service_account,
            node_name,
            runtime_class_name,
            priority_class_name,
            scheduler_name,
            node_selector,
            tolerations,
            affinity,
            topology_spread_constraints
        );
    }
    pod
}

/// The first identity or ownership field of `after` that differs from `before` as vCluster's
/// decoder reads them (see the module docs), as `(field, what)`:
/// - a top-level key other than `metadata` that folds to it ([`go_fold`]), or a key of
///   `metadata` spelled otherwise than the field it folds to: vCluster's decoder would read it
///   as that field, which a check of the exact spelling misses;
/// - one of [`IDENTITY_FIELDS`] changed;
/// - a `vcluster.loft.sh/` label or annotation added, changed or removed (map keys are matched
///   exactly, as Go decodes map keys; a key's prefix must be a lowercase DNS subdomain, so an
///   upper-case spelling is no key vCluster reads, and the API server refuses it);
/// - a label of [`vcp_crds::RESERVED_LABELS`] (`release`) added, changed or removed: vCluster
///   never lets a virtual object carry it to the host, and on a pod it selects the pod as an
///   endpoint of the vCluster's own Service.
pub fn identity_change(before: &Value, after: &Value) -> Option<(String, String)> {
    if let Some(root) = after.as_object() {
        for key in root.keys() {
            if key != "metadata" && go_fold(key) == "metadata" {
                return Some((
                    key.clone(),
                    "is read as metadata by vCluster's decoder (field names match case-insensitively)".into(),
                ));
            }
        }
    }
    let meta = after.get("metadata").and_then(Value::as_object);
    let protected: Vec<&str> = IDENTITY_FIELDS
        .iter()
        .copied()
        .chain(["labels", "annotations"])
        .collect();
    for key in meta.iter().flat_map(|m| m.keys()) {
        if let Some(field) = protected
            .iter()
            .find(|f| go_fold(f) == go_fold(key) && **f != key)
        {
            return Some((
                format!("metadata.{key}"),
                format!(
                    "is read as metadata.{field} by vCluster's decoder (field names match case-insensitively)"
                ),
            ));
        }
    }
    for field in IDENTITY_FIELDS {
        let (b, a) = (&before["metadata"][field], &after["metadata"][field]);
        if b != a {
            return Some((
                format!("metadata.{field}"),
                format!("changed from {b} to {a}"),
            ));
        }
    }
    for field in ["labels", "annotations"] {
        let tracked = |v: &Value| -> BTreeMap<String, Value> {
            v["metadata"][field]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| {
                            k.starts_with(VCLUSTER_KEY_PREFIX)
                                || (field == "labels"
                                    && vcp_crds::RESERVED_LABELS.contains(&k.as_str()))
                        })
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (b, a) = (tracked(before), tracked(after));
        if let Some(key) = b.keys().chain(a.keys()).find(|k| b.get(*k) != a.get(*k)) {
            return Some((
                format!("metadata.{field}[{key:?}]"),
                format!(
                    "changed from {} to {}: {}",
                    b.get(key).map_or("absent".into(), Value::to_string),
                    a.get(key).map_or("absent".into(), Value::to_string),
                    if key.starts_with(VCLUSTER_KEY_PREFIX) {
                        "vCluster tracks its objects by it"
                    } else {
                        "vCluster never lets a virtual object carry this label to the host (the vCluster's own Service selects its pods by it)"
                    }
                ),
            ));
        }
    }
    None
}

/// Whether the JSON Pointer `pointer` writes a protected field in some spelling vCluster's
/// decoder reads as it (the CRD's CEL rule, `vcp_crds::protected_path_rule`, in Rust): the
/// whole object, `/metadata`, its labels or annotations as a whole, one of
/// [`IDENTITY_FIELDS`] or below it, a `vcluster.loft.sh/` label or annotation, or the label
/// [`vcp_crds::RESERVED_LABELS`] (`release`); compared after [`go_fold`].
pub fn protected_pointer(pointer: &str) -> bool {
    let p = go_fold(pointer);
    if ["", "/metadata", "/metadata/labels", "/metadata/annotations"].contains(&p.as_str()) {
        return true;
    }
    if IDENTITY_FIELDS.iter().any(|f| {
        let q = format!("/metadata/{}", go_fold(f));
        p == q || p.starts_with(&format!("{q}/"))
    }) {
        return true;
    }
    p.starts_with("/metadata/labels/vcluster.loft.sh~1")
        || p.starts_with("/metadata/annotations/vcluster.loft.sh~1")
        || vcp_crds::RESERVED_LABELS
            .iter()
            .any(|k| p == format!("/metadata/labels/{k}"))
}

/// Whether a `copy` or `move` of a Pod hook may write the JSON Pointer `pointer`: the value it
/// writes comes from each real pod (fields the vCluster's tenants write), which the
/// representative pod cannot show, so it may only land where no value changes what the pod
/// may do: one label or annotation, other than a protected one ([`protected_pointer`]: a
/// `vcluster.loft.sh/` key or the `release` label) and other than the seccomp / AppArmor
/// annotations the API server turns into profiles
/// ([`pod::SECURITY_ANNOTATION_PREFIXES`]); compared after [`go_fold`] and JSON Pointer
/// unescaping. An attacker's hooks did: `copy` from a container's
/// `allowPrivilegeEscalation` to its `privileged`, or from a label to the pod's
/// `seccompProfile.type`, passed a judge that saw only the representative pod's values.
pub fn copy_destination_allowed(pointer: &str) -> bool {
    if protected_pointer(pointer) {
        return false;
    }
    let folded = go_fold(pointer);
    let segments: Vec<&str> = folded.split('/').collect();
    let ["", "metadata", map @ ("labels" | "annotations"), key] = segments.as_slice() else {
        return false;
    };
    let key = key.replace("~1", "/").replace("~0", "~");
    *map == "labels"
        || !pod::SECURITY_ANNOTATION_PREFIXES
            .iter()
            .any(|prefix| key.starts_with(&go_fold(prefix)))
}

/// The first `copy` or `move` of a physical Pod hook of `plugin` whose destination is not
/// [`copy_destination_allowed`], as a refusal.
fn copy_into_the_pod(plugin: &VClusterPlugin) -> Option<Refusal> {
    for (i, hook) in plugin.spec.hooks.iter().enumerate() {
        let Some(&event) = hook.events.iter().find(|e| e.is_physical()) else {
            continue;
        };
        if !is_pod(hook) {
            continue;
        }
        for op in &hook.json_patch {
            if matches!(op.op, JsonPatchOp::Copy | JsonPatchOp::Move)
                && !copy_destination_allowed(&op.path)
            {
                return Some(refusal(
                    i,
                    hook,
                    event,
                    format!(
                        "copies a value of the vCluster's pods into {:?}: what a copy or move writes comes from each real pod, which the judge cannot see, so it may only land in one label or annotation (not a vcluster.loft.sh/ key, the release label or a seccomp / AppArmor annotation): refused by the operator policy",
                        op.path
                    ),
                ));
            }
        }
    }
    None
}

/// `hook` without its `test` operations (see the module docs).
fn without_tests(hook: &Hook) -> Hook {
    let mut h = hook.clone();
    h.json_patch.retain(|op| op.op != JsonPatchOp::Test);
    h
}

/// `hook` split into single actions: its label and annotation actions, then each `jsonPatch`
/// operation (tests left out).
fn single_actions(hook: &Hook) -> Vec<Hook> {
    let base = Hook {
        name: hook.name.clone(),
        api_version: hook.api_version.clone(),
        kind: hook.kind.clone(),
        events: hook.events.clone(),
        ..Hook::default()
    };
    let mut out = vec![Hook {
        labels: hook.labels.clone(),
        annotations: hook.annotations.clone(),
        remove_labels: hook.remove_labels.clone(),
        remove_annotations: hook.remove_annotations.clone(),
        ..base.clone()
    }];
    for op in hook
        .json_patch
        .iter()
        .filter(|op| op.op != JsonPatchOp::Test)
    {
        out.push(Hook {
            json_patch: vec![op.clone()],
            ..base.clone()
        });
    }
    out
}

fn is_pod(hook: &Hook) -> bool {
    hook.api_version == "v1" && hook.kind == "Pod"
}

/// Why a physical hook (`CreatePhysical` / `UpdatePhysical`: vCluster applies it, through
/// `Mutate`, to the host object before it writes it) on a kind Kubernetes serves itself is
/// refused, other than `v1 Pod` (judged as the pod it makes, [`judge`]) and `v1 ConfigMap`
/// (data only): Kubernetes acts on such objects by their content, which the hook writes. The
/// attacker's hooks had vCluster's own loader return host Secrets of type
/// `kubernetes.io/service-account-token` for the vCluster's service account, claims cloned
/// from the vCluster's data volume and Services with `externalIPs`. Same groups as the synced
/// types' rule, [`vcp_crds::built_in`]. `None` for other hooks.
fn built_in_host_kind(hook: &Hook, event: HookEvent) -> Option<String> {
    let group = vcp_crds::built_in::group_of(&hook.api_version);
    let config_map = group.is_empty() && hook.kind == "ConfigMap";
    (event.is_physical() && vcp_crds::built_in::is_built_in_group(group) && !config_map).then(|| {
        "changes host objects of a kind Kubernetes acts on by their content (a Secret's type makes the host mint a token, a claim's data source clones a volume, a Service's external IPs take traffic): of the kinds Kubernetes serves itself, only Pod hooks (judged as the pod they make) and ConfigMap hooks may change host objects; refused by the operator policy".to_string()
    })
}

fn refusal(i: usize, hook: &Hook, event: HookEvent, what: String) -> Refusal {
    Refusal {
        reason: Reason::PolicyDenied,
        message: format!(
            "spec.hooks[{i}] ({}, {event:?} on {} {}) {what}",
            hook.name, hook.api_version, hook.kind
        ),
    }
}

/// The identity check of every hook of `plugin` that is not a physical `Pod` hook (those are
/// judged on the hooked pod by [`judge`]), on [`representative_object`]s.
fn other_kinds(plugin: &VClusterPlugin, namespace: &str, vcluster: &str) -> Option<Refusal> {
    for (i, hook) in plugin.spec.hooks.iter().enumerate() {
        for &event in &hook.events {
            if is_pod(hook) && event.is_physical() {
                continue;
            }
            if let Some(what) = built_in_host_kind(hook, event) {
                return Some(refusal(i, hook, event, what));
            }
            let before = representative_object(&hook.api_version, &hook.kind, namespace, vcluster);
            let mut obj = before.clone();
            for action in single_actions(hook) {
                let mut next = obj.clone();
                match apply_hook(&mut next, &action) {
                    Ok(()) => obj = next,
                    Err(_) => {
                        // Fails here, may apply elsewhere: judged by its pointers.
                        if let Some(op) = action.json_patch.first() {
                            let from = op.from.as_deref().filter(|_| op.op == JsonPatchOp::Move);
                            if let Some(p) = [Some(op.path.as_str()), from]
                                .into_iter()
                                .flatten()
                                .find(|p| protected_pointer(p))
                            {
                                return Some(refusal(
                                    i,
                                    hook,
                                    event,
                                    format!(
                                        "writes {p:?}, which vCluster's decoder reads as the object's identity, its labels or annotations as a whole, a vcluster.loft.sh/ key or the release label: refused by the operator policy"
                                    ),
                                ));
                            }
                        }
                    }
                }
                if let Some((field, what)) = identity_change(&before, &obj) {
                    return Some(refusal(
                        i,
                        hook,
                        event,
                        format!(
                            "changes {field} of a representative {} ({what}): a hook may not touch an object's identity, ownership, vcluster.loft.sh/ keys or the release label (operator policy)",
                            hook.kind
                        ),
                    ));
                }
            }
        }
    }
    None
}

/// The pod after `hooked` was applied: its typed view, or why it cannot be judged or is
/// refused (identity, lost keys, the pod policy).
fn judge_pod(policy: &ContainerPolicy, before: &Value, hooked: &Value) -> Result<Pod, String> {
    if let Some((field, what)) = identity_change(before, hooked) {
        return Err(format!(
            "changes {field} of the vCluster's pods ({what}): a hook may not touch an object's identity, ownership, vcluster.loft.sh/ keys or the release label (operator policy)"
        ));
    }
    if let Some((at, key, other)) = pod::folded_duplicate_keys(hooked) {
        let at = if at.is_empty() { "the pod".into() } else { at };
        return Err(format!(
            "writes both {key:?} and {other:?} in {at}, which vCluster's decoder (Go's encoding/json: field names match case-insensitively, and ſ (U+017F) as s and K (U+212A) as k) reads as one field, the later one winning, so the pods would not get what the operator judged: write each field once, spelled as the API spells it (refused by the operator policy)"
        ));
    }
    let typed: Pod = serde_json::from_value(hooked.clone()).map_err(|e| {
        format!("makes the vCluster's pods something that is not a valid Pod ({e})")
    })?;
    let lost = serde_json::to_value(&typed)
        .map(|round| lost_keys(hooked, &round))
        .unwrap_or_default();
    if let Some(key) = lost.first() {
        return Err(format!(
            "writes {key}, which is no field of a Pod as spelled; vCluster's decoder matches field names case-insensitively, so it may set another field: refused by the operator policy"
        ));
    }
    let original: Pod = serde_json::from_value(before.clone()).unwrap_or_default();
    pod::check(policy, &original, &typed)
        .map_err(|d| format!("makes the vCluster's pods carry {}", d.message()))?;
    Ok(typed)
}

/// The pods of the vCluster after each plugin's `Pod` hooks, and the plugins refused.
#[derive(Clone, Debug, Default)]
pub struct Judged {
    /// The representative pod, before any hook, as the API server may judge it
    /// ([`for_the_api_server`]).
    pub before: Pod,
    /// For each plugin (not refused) whose hooks changed the pod, in [`hook_order`]: its name
    /// and the pod after its hooks and those of the plugins before it (as the API server may
    /// judge it, [`for_the_api_server`]).
    pub steps: Vec<(String, Pod)>,
    /// The refused plugins by name, with their `PolicyDenied` refusal.
    pub refused: BTreeMap<String, Refusal>,
}

/// Judges the hooks of `plugins` (all those of the vCluster `vcluster` in `namespace` that are
/// not refused otherwise; the pods [`Judged`] holds for the API server run as its workload's
/// `service_account`), see the module docs. A refused plugin's hooks are left out of the pods
/// the plugins after it are judged on.
pub fn judge(
    policy: &ContainerPolicy,
    plugins: &[&VClusterPlugin],
    namespace: &str,
    vcluster: &str,
    service_account: &str,
) -> Judged {
    let before = representative_pod(namespace, vcluster);
    let mut out = Judged {
        before: for_the_api_server(
            &serde_json::from_value(before.clone()).unwrap_or_default(),
            service_account,
        ),
        ..Judged::default()
    };
    let mut current = before.clone();
    'plugins: for plugin in hook_order(plugins) {
        let name = plugin.name_any();
        if let Some(r) =
            other_kinds(plugin, namespace, vcluster).or_else(|| copy_into_the_pod(plugin))
        {
            out.refused.insert(name, r);
            continue;
        }
        let mut pod = current.clone();
        let mut typed = None;
        // As the runtime applies them: the CreatePhysical hooks, then the UpdatePhysical ones.
        for event in [HookEvent::CreatePhysical, HookEvent::UpdatePhysical] {
            for (i, hook) in plugin.spec.hooks.iter().enumerate() {
                if !is_pod(hook) || !hook.events.contains(&event) {
                    continue;
                }
                if let Err(e) = apply_hook(&mut pod, &without_tests(hook)) {
                    out.refused.insert(
                        name,
                        refusal(
                            i,
                            hook,
                            event,
                            format!(
                                "fails on a representative pod of the vCluster ({e}), so what it does to the vCluster's pods cannot be judged: refused by the operator policy"
                            ),
                        ),
                    );
                    continue 'plugins;
                }
                match judge_pod(policy, &before, &pod) {
                    Ok(t) => typed = Some(t),
                    Err(what) => {
                        out.refused.insert(name, refusal(i, hook, event, what));
                        continue 'plugins;
                    }
                }
            }
        }
        if let Some(t) = typed
            && pod != current
        {
            current = pod;
            out.steps
                .push((name, for_the_api_server(&t, service_account)));
        }
    }
    out
}

#[cfg(test)]
mod tests;
