//! `syncedTypes[].patches[]` ([`TranslatePatch`]) in vCluster's shape, and the CEL rules that
//! keep a patch off the object's identity ([`PROTECTED_PATCH_PATH_RULE`],
//! [`protected_reference_path_rule`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CEL: a patch's `path` (vCluster's notation, [`crate::patch_path`]) writes nothing that
/// identifies the object ([`crate::patch_path::PatchPath::is_protected`], which the runtime checks
/// again). The path is folded as the hooks' rule folds a JSON Pointer (ASCII lower case,
/// `ſ` → `s`, `K` → `k`) and its brackets become dots (`metadata["name"]`, `metadata['name']`
/// → `metadata.name`, `[*]` → `.*`), so every spelling of a protected field is refused; a key
/// containing dots can only be refused more often than the parser would, never less. The
/// label [`RESERVED_LABELS`](crate::RESERVED_LABELS) (`release`) is protected like a
/// `vcluster.loft.sh/` one.
pub const PROTECTED_PATCH_PATH_RULE: &str = "[self.path.lowerAscii().replace('\\u017f', 's').replace('\\u212a', 'k').replace('[\\\"', '.').replace('\\\"]', '').replace(\"['\", '.').replace(\"']\", '').replace('[', '.').replace(']', '')].all(n, !(n.matches('^[.]?(apiversion|kind|[*])([.].*)?$') || n.matches('^[.]?metadata([.][*].*)?$') || n.matches('^[.]?metadata[.](name|namespace|generatename|uid|ownerreferences|finalizers)([.].*)?$') || n.matches('^[.]?metadata[.](labels|annotations)([.]([*]|vcluster[.]loft[.]sh/).*)?$') || n.matches('^[.]?metadata[.]labels[.]release$')))";

/// One patch of a synced type, in vCluster's shape (`config.TranslatePatch`): `path`, and
/// exactly one of `expression` / `reverseExpression` (either or both, as vCluster's
/// `validatePatches` counts them as one kind), `reference` or `labels`. The path may not write
/// the object's identity ([`PROTECTED_PATCH_PATH_RULE`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "[has(self.expression) || has(self.reverseExpression), has(self.reference), has(self.labels)].filter(x, x).size() == 1", "message": "a patch has exactly one of expression / reverseExpression, reference or labels, as in vCluster's config.TranslatePatch" },
    { "rule": PROTECTED_PATCH_PATH_RULE, "message": "a patch may not write the object's identity (apiVersion, kind, metadata as a whole, name, namespace, generateName, uid, ownerReferences, finalizers), its labels or annotations as a whole or through [*], a vcluster.loft.sh/ key, or the release label", "fieldPath": ".path" },
]))]
pub struct TranslatePatch {
    /// The field the patch targets, in vCluster's notation: dots, brackets (`a["b.c"]`,
    /// `a['b']`, `a[0]`) and `[*]` for every element. A path that is not found is skipped. It
    /// may not write the object's identity (`apiVersion`, `kind`, `metadata` as a whole, its
    /// name, namespace, generateName, uid, ownerReferences, finalizers, labels or annotations
    /// as a whole or through `[*]`, a `vcluster.loft.sh/` key). Unique among the type's patches.
    #[schemars(length(min = 1, max = 512))]
    pub path: String,
    /// JavaScript that computes the host value on the way to the host (for `FromHost`: the
    /// virtual value), as in vCluster: `value`, `valueExists`, `context.vcluster.name` /
    /// `namespace`, `context.hostObject`, `context.virtualObject`, `context.path`, `btoa`,
    /// `atob`. The script's completion value replaces the value; `undefined` or `null` remove
    /// the field. Evaluated in a sandbox without I/O, bounded to 100 ms and 16 MiB per
    /// evaluation; a failure fails that object only (`RuntimeHealthy=False`, `PatchFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub expression: Option<String>,
    /// JavaScript that computes the value on the way back (host to virtual for `ToHost`: on the
    /// status `syncStatus` copies up). Allowed without `expression`, as in vCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub reverse_expression: Option<String>,
    /// The value names another object: on the way down it becomes that object's host name
    /// (`<name>-x-<namespace>-x-<vcluster>`, vCluster's single-namespace host name; a
    /// cluster-scoped kind keeps its name), on the way back the virtual name again (vCluster's
    /// `TranslatePatchReference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<TranslatePatchReference>,
    /// The value is a label selector, translated so that it selects the host copies of the
    /// objects it selects in the virtual cluster (vCluster's `TranslatePatchLabels`, translated
    /// by vCluster's `HostLabelSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<TranslatePatchLabels>,
}

/// CEL on a reference's relative path `field` (`namePath`, `namespacePath`: the two a reference
/// writes), when set: the rule of `path` ([`PROTECTED_PATCH_PATH_RULE`]) on that field's value,
/// read as a path from the object's root. When the value at the patch's `path` is a string, the
/// runtime reads `namespacePath` from the object's root (vCluster's meaning) and writes the
/// host namespace there, so `namespacePath: metadata.labels["vcluster.loft.sh/managed-by"]`
/// wrote the host copy's owner label; when the value is an object, the path
/// is below `path`, which the rule of `path` already keeps off the identity, so reading it
/// from the root can only refuse more often. `kindPath` and `apiVersionPath` are only read
/// (cert-manager's `issuerRef` has `kindPath: kind`), never written, and are not checked.
pub fn protected_reference_path_rule(field: &str) -> String {
    format!(
        "!has(self.{field}) || {}",
        PROTECTED_PATCH_PATH_RULE.replacen("self.path", &format!("self.{field}"), 1)
    )
}

/// The message of [`protected_reference_path_rule`] for `field`.
fn protected_reference_path_message(field: &str) -> String {
    format!(
        "a reference's {field} is written (the host name or namespace) and may not name the object's identity (apiVersion, kind, metadata as a whole, name, namespace, generateName, uid, ownerReferences, finalizers), its labels or annotations as a whole or through [*], a vcluster.loft.sh/ key, or the release label"
    )
}

/// A reference patch (vCluster's `config.TranslatePatchReference`). The paths are relative to
/// the patch's `path` when that names an object, as in vCluster, and to the object's root when
/// it is a string (the name itself). `namePath` and `namespacePath`, which the runtime writes,
/// may not name the object's identity ([`protected_reference_path_rule`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": protected_reference_path_rule("namePath"), "message": protected_reference_path_message("namePath"), "fieldPath": ".namePath" },
    { "rule": protected_reference_path_rule("namespacePath"), "message": protected_reference_path_message("namespacePath"), "fieldPath": ".namespacePath" },
]))]
pub struct TranslatePatchReference {
    /// `group/version` of the referenced object (`v1` for the core group).
    #[schemars(length(min = 1, max = 317), regex(pattern = crate::schema::API_VERSION_PATTERN))]
    pub api_version: String,
    /// Path of the referenced object's `apiVersion`; `apiVersion` when not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub api_version_path: Option<String>,
    /// Kind of the referenced object.
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::schema::KIND_PATTERN))]
    pub kind: String,
    /// Path of the referenced object's kind; `kind` when not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub kind_path: Option<String>,
    /// Path of the referenced name, when the value at `path` is an object; the patch's value
    /// itself when it is a string. Written (the host name), so it may not name the object's
    /// identity, as `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub name_path: Option<String>,
    /// Path of the referenced namespace (relative to the object's root when the value at
    /// `path` is a string); the object's own namespace when absent or not found. A namespace
    /// found there becomes the vCluster's host namespace on the host copy, so it may not name
    /// the object's identity, as `path` (`metadata.labels["vcluster.loft.sh/managed-by"]` is
    /// refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub namespace_path: Option<String>,
}

/// A label-selector patch (vCluster's `config.TranslatePatchLabels`, an empty object).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TranslatePatchLabels {}
