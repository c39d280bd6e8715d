//! `hooks[]`: a mutation the runtime applies to objects of one type ([`Hook`]), its JSON Patch
//! operations, and the CEL rules that keep a hook off what vCluster tracks its objects by
//! ([`protected_path_rule`], [`protected_from_rule`]).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CEL: `pointer` (a CEL expression of a JSON Pointer) folded the way vCluster's decoder
/// matches field names: Go's `encoding/json` matches a JSON key to a struct field
/// case-insensitively, with Unicode simple folding (its `fold.go`: `bytes.EqualFold`), under which
/// `ſ` (U+017F LATIN SMALL LETTER LONG S) equals `s` and `K` (U+212A KELVIN SIGN) equals `k`, the
/// only non-ASCII letters that fold to an ASCII one. So `/metadata/Finalizers` and
/// `/metadata/finalizerſ` both fold to `/metadata/finalizers`. A label or annotation key is a map
/// key (matched exactly), but its prefix must be a lowercase DNS subdomain, so a folded
/// `vcluster.loft.sh~1` matches every key vCluster tracks (an upper-case spelling is not a valid
/// key and is refused too). RFC 6901 has one spelling of `/` in a token (`~1`) and of `~` (`~0`),
/// and no other escape, so the raw pointer's `~1` is compared as it is.
fn folded_pointer(pointer: &str) -> String {
    format!("{pointer}.lowerAscii().replace('\\u017f', 's').replace('\\u212a', 'k')")
}

/// CEL: whether the folded pointer `p` ([`folded_pointer`]) writes what a hook may not touch (see
/// [`JsonPatchOperation`]).
const PROTECTED_FOLDED: &str = "p in ['', '/metadata', '/metadata/labels', '/metadata/annotations', '/metadata/labels/release'] || ['/metadata/name', '/metadata/namespace', '/metadata/generatename', '/metadata/uid', '/metadata/ownerreferences', '/metadata/finalizers'].exists(q, p == q || p.startsWith(q + '/')) || p.startsWith('/metadata/labels/vcluster.loft.sh~1') || p.startsWith('/metadata/annotations/vcluster.loft.sh~1')";

/// CEL: a JSON Patch operation's `path` writes nothing a hook may not touch, in any spelling
/// vCluster's decoder reads as a protected field ([`folded_pointer`]).
pub fn protected_path_rule() -> String {
    format!(
        "self.op == 'test' || [{}].all(p, !({PROTECTED_FOLDED}))",
        folded_pointer("self.path")
    )
}

/// CEL: a `move` takes its value from nowhere a hook may not touch (a `copy` only reads its
/// `from`: the protected field stays as it was, and its `path` is judged by
/// [`protected_path_rule`]).
pub fn protected_from_rule() -> String {
    format!(
        "self.op != 'move' || !has(self.from) || [{}].all(p, !({PROTECTED_FOLDED}))",
        folded_pointer("self.from")
    )
}

/// A mutation applied by the runtime to objects of one type on the listed events. It may not
/// touch the keys vCluster tracks its objects by (`vcluster.loft.sh/`): set or removed,
/// such a label or annotation would make a host object look owned by another vCluster or
/// virtual object (or by none), so a hook could take over or orphan objects it does not own.
/// Nor may it touch the label `release` (`RESERVED_LABELS`), which vCluster never lets a
/// virtual object carry to the host: with `app: vcluster` it would make a host pod an endpoint
/// of the vCluster's own Service, the virtual cluster's API server.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "!has(self.labels) || self.labels.all(k, !k.startsWith('vcluster.loft.sh/') && k != 'release')", "message": "hooks may not set vcluster.loft.sh/ labels or the release label: vCluster tracks the objects it manages by them, and never lets a virtual object's release label reach the host (the vCluster's own Service selects its pods by it)", "fieldPath": ".labels" },
    { "rule": "!has(self.annotations) || self.annotations.all(k, !k.startsWith('vcluster.loft.sh/'))", "message": "hooks may not set vcluster.loft.sh/ annotations: vCluster tracks the objects it manages by them", "fieldPath": ".annotations" },
    { "rule": "!has(self.removeLabels) || self.removeLabels.all(k, !k.startsWith('vcluster.loft.sh/') && k != 'release')", "message": "hooks may not remove vcluster.loft.sh/ labels or the release label: vCluster tracks the objects it manages by them, and never lets a virtual object's release label reach the host (the vCluster's own Service selects its pods by it)", "fieldPath": ".removeLabels" },
    { "rule": "!has(self.removeAnnotations) || self.removeAnnotations.all(k, !k.startsWith('vcluster.loft.sh/'))", "message": "hooks may not remove vcluster.loft.sh/ annotations: vCluster tracks the objects it manages by them", "fieldPath": ".removeAnnotations" },
]))]
pub struct Hook {
    /// Name of the hook, unique in the plugin.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// `group/version` of the objects, such as `v1`.
    #[schemars(length(min = 1, max = 317), regex(pattern = crate::schema::API_VERSION_PATTERN))]
    pub api_version: String,
    /// Kind of the objects, such as `Pod`.
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::schema::KIND_PATTERN))]
    pub kind: String,
    /// Events on which the hook runs, each at most once: `CreatePhysical`, `UpdatePhysical`
    /// (before a write to the host), `CreateVirtual`, `UpdateVirtual` (before a write to the
    /// virtual cluster).
    #[schemars(length(min = 1, max = 4), extend("x-kubernetes-list-type" = "set"))]
    pub events: Vec<HookEvent>,
    /// Labels to set (label keys and values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::labels_map")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to set (annotation keys).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::annotations_map")]
    pub annotations: BTreeMap<String, String>,
    /// Label keys to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::key_list")]
    pub remove_labels: Vec<String>,
    /// Annotation keys to remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::key_list")]
    pub remove_annotations: Vec<String>,
    /// RFC 6902 JSON Patch operations applied after the label and annotation actions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub json_patch: Vec<JsonPatchOperation>,
}

/// The write events a hook can run on (vcluster-sdk's `Mutate{Create,Update}{Physical,Virtual}`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum HookEvent {
    /// Before an object is created on the host.
    CreatePhysical,
    /// Before an object is updated on the host.
    UpdatePhysical,
    /// Before an object is created in the virtual cluster.
    CreateVirtual,
    /// Before an object is updated in the virtual cluster.
    UpdateVirtual,
}

impl HookEvent {
    /// Whether the event is a write to the host (`CreatePhysical`, `UpdatePhysical`): what a
    /// hook on it does reaches the host cluster (the operator's policy and judging, the RBAC
    /// granted for it, and the runtime's pod hooks depend on this).
    pub const fn is_physical(self) -> bool {
        match self {
            HookEvent::CreatePhysical | HookEvent::UpdatePhysical => true,
            HookEvent::CreateVirtual | HookEvent::UpdateVirtual => false,
        }
    }
}

/// One RFC 6902 operation: `from` is required by `move` and `copy` (a CEL rule). `value` is
/// required by `add`, `replace` and `test`, but an untyped field is invisible to CEL, so the
/// schema cannot check it: the runtime reports such an operation when it applies the hook.
///
/// A write (`add`, `remove`, `replace`, `move`, `copy`; `move` also removes its `from`) may not
/// target the object's identity or vCluster's bookkeeping: the whole document or
/// `/metadata`, `/metadata/labels` or `/metadata/annotations` as a whole, `/metadata/name`,
/// `/metadata/namespace`, `/metadata/generateName`, `/metadata/uid`,
/// `/metadata/ownerReferences`, `/metadata/finalizers`, or a `vcluster.loft.sh/` label or
/// annotation. Renaming an object on its way to the host would write over another object of
/// that name; a `test` may read any of them. Paths are compared as vCluster's decoder (Go's
/// `encoding/json`) matches field names: case-insensitively, with Unicode folding, so
/// `/metadata/Finalizers` is refused like `/metadata/finalizers` ([`protected_path_rule`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "!(self.op in ['move', 'copy']) || has(self.from)", "message": "from is required by the move and copy operations", "fieldPath": ".from", "reason": "FieldValueRequired" },
    { "rule": protected_path_rule(), "message": "a hook may not write the object's identity (name, namespace, generateName, uid, ownerReferences, finalizers), its labels or annotations as a whole, a vcluster.loft.sh/ key, or the release label", "fieldPath": ".path" },
    { "rule": protected_from_rule(), "message": "a move may not take its value from the object's identity, its labels or annotations as a whole, a vcluster.loft.sh/ key, or the release label", "fieldPath": ".from" },
]))]
pub struct JsonPatchOperation {
    /// `add`, `remove`, `replace`, `move`, `copy` or `test`.
    pub op: JsonPatchOp,
    /// JSON Pointer (RFC 6901) of the target, such as `/metadata/labels/team`.
    #[schemars(length(max = 1024), regex(pattern = crate::schema::JSON_POINTER_PATTERN))]
    pub path: String,
    /// Source pointer of `move` and `copy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), regex(pattern = crate::schema::JSON_POINTER_PATTERN))]
    pub from: Option<String>,
    /// Value of `add`, `replace` and `test`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::any_value")]
    pub value: Option<serde_json::Value>,
}

/// RFC 6902 operation names.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JsonPatchOp {
    /// `add`
    Add,
    /// `remove`
    Remove,
    /// `replace`
    Replace,
    /// `move`
    Move,
    /// `copy`
    Copy,
    /// `test`
    Test,
}
