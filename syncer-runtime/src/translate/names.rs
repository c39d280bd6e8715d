//! How vCluster names and marks a host object: the labels and annotations it writes
//! (`MarkerLabel`, `object-*` annotations), `SafeConcatName`, the host name of a virtual
//! object, the host key of a translated label, and the `object-kind` value.
//!
//! The rules: name `<name>-x-<namespace>-x-<vcluster>`, shortened past 63
//! characters to 52, `-` and 10 hex of sha256, then `.-` → `-`; the translated label keys
//! `vcluster.loft.sh/label-<vcluster>-x-<10 hex of sha256(key)>`; as vCluster v0.30.0's
//! `pkg/util/translate` does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

/// Label with the name of the vCluster that manages a host object (vCluster's `MarkerLabel`).
pub const MANAGED_BY_LABEL: &str = "vcluster.loft.sh/managed-by";
/// Label with the virtual namespace of the object a host object was made from.
pub const NAMESPACE_LABEL: &str = "vcluster.loft.sh/namespace";
/// Label vCluster copies from an existing host object onto its update (vCluster's
/// `ControllerLabel`); a virtual label of this key is translated ([`host_label`]).
pub const CONTROLLED_BY_LABEL: &str = "vcluster.loft.sh/controlled-by";
/// The Helm release label; a virtual label of this key is translated ([`host_label`]) so that a
/// tenant's `release` never collides with the host's own Helm release label.
pub const RELEASE_LABEL: &str = "release";
/// Prefix of the host keys of translated labels (vCluster's `LabelPrefix`).
pub const LABEL_PREFIX: &str = "vcluster.loft.sh/label";
/// The virtual label keys vCluster never copies as they are: each becomes [`host_label`] on the
/// host (the single-namespace translator's `LabelsToTranslate`).
pub const TRANSLATED_LABELS: [&str; 4] = [
    RELEASE_LABEL,
    NAMESPACE_LABEL,
    MANAGED_BY_LABEL,
    CONTROLLED_BY_LABEL,
];
/// Annotation with the virtual object's name.
pub const NAME_ANNOTATION: &str = "vcluster.loft.sh/object-name";
/// Annotation with the virtual object's namespace (absent for cluster-scoped objects).
pub const NAMESPACE_ANNOTATION: &str = "vcluster.loft.sh/object-namespace";
/// Annotation with the virtual object's `metadata.uid`.
pub const UID_ANNOTATION: &str = "vcluster.loft.sh/object-uid";
/// Annotation with the virtual object's kind, formatted by [`object_kind`].
pub const KIND_ANNOTATION: &str = "vcluster.loft.sh/object-kind";
/// Annotation with the host object's own name.
pub const HOST_NAME_ANNOTATION: &str = "vcluster.loft.sh/object-host-name";
/// Annotation with the host object's own namespace.
pub const HOST_NAMESPACE_ANNOTATION: &str = "vcluster.loft.sh/object-host-namespace";
/// Annotation on an object the runtime brought back into the virtual cluster for a synced
/// object (`syncedTypes[].produced`, [`crate::produced`]): the synced object it was produced for,
/// as `<Kind>.<group>/<name>` (`<Kind>/<name>` for the core group), in the same namespace, such
/// as `Certificate.cert-manager.io/web`. With [`HOST_NAME_ANNOTATION`] /
/// [`HOST_NAMESPACE_ANNOTATION`] (the host object it copies, as vCluster marks what it imports)
/// and [`PRODUCED_PATH_ANNOTATION`], it is how the runtime recognises its own copies (after a
/// restart too); an object without it is never overwritten.
pub const PRODUCED_FOR_ANNOTATION: &str = "vcp.dev/produced-for";
/// Annotation on an object brought back (see [`PRODUCED_FOR_ANNOTATION`]): the `namePath` of the
/// `produced` entry that named it, such as `spec.secretName`.
pub const PRODUCED_PATH_ANNOTATION: &str = "vcp.dev/produced-path";
/// Annotation listing label keys copied from the virtual object (sorted, `\n`-joined). vCluster
/// writes it only for nodes, and neither does the runtime: it is never computed here, only
/// passed through like vCluster's `HostAnnotations` does (from the virtual object on create,
/// from the host object on update), and, on host copies an older runtime made, read as the
/// labels that came from the virtual object.
pub const MANAGED_LABELS_ANNOTATION: &str = "vcluster.loft.sh/managed-labels";
/// Annotation listing the annotation keys copied from the virtual object (sorted, `\n`-joined).
pub const MANAGED_ANNOTATIONS_ANNOTATION: &str = "vcluster.loft.sh/managed-annotations";

/// Maximum length of a Kubernetes object name that is also a DNS label (RFC 1123).
pub const MAX_NAME_LENGTH: usize = 63;

/// Characters of the joined name kept before the hash when a name is too long.
const TRUNCATED_PREFIX: usize = 52;

/// Hex characters of the sha256 digest appended to a truncated name.
const HASH_HEX_CHARS: usize = 10;

/// Joins `parts` with `-`; a result longer than 63 bytes becomes its first 52 bytes, `-`, and
/// the first 10 hex characters of the sha256 of the full joined string, and then every `.-` in
/// it becomes `-` (a cut right after a dot would otherwise leave an invalid name).
///
/// Reproduces vCluster's `translate.SafeConcatName`, including that the `.-` replacement only
/// happens on the truncated branch (a valid DNS-1123 name never contains `.-`, so a short
/// joined name of valid parts never needs it). Lengths are in bytes, as in Go; Kubernetes names
/// are ASCII.
pub fn safe_concat_name(parts: &[&str]) -> String {
    let full = parts.join("-");
    if full.len() <= MAX_NAME_LENGTH {
        return full;
    }
    let digest = hex(&Sha256::digest(full.as_bytes()));
    let prefix = full.get(..TRUNCATED_PREFIX).unwrap_or(&full);
    format!("{prefix}-{}", &digest[..HASH_HEX_CHARS]).replace(".-", "-")
}

/// The host name of the virtual object `name` in virtual namespace `namespace` of vCluster
/// `vcluster`: `<name>-x-<namespace>-x-<vcluster>`, shortened by [`safe_concat_name`].
///
/// Reproduces vCluster's single-namespace `PhysicalName` / `HostName`. An empty `name` maps to
/// an empty string, as in vCluster.
pub fn host_name(name: &str, namespace: &str, vcluster: &str) -> String {
    if name.is_empty() {
        return String::new();
    }
    safe_concat_name(&[name, "x", namespace, "x", vcluster])
}

/// The host key of the virtual label `key` in vCluster `vcluster` (vCluster's `HostLabel`): the
/// keys of [`TRANSLATED_LABELS`] become [`safe_concat_name`] of [`LABEL_PREFIX`], `vcluster`,
/// `x` and the first 10 hex characters of sha256(`key`) — `release` in vCluster `vc` becomes
/// `vcluster.loft.sh/label-vc-x-a4d451ec23`; every other key is kept as it is.
pub fn host_label(key: &str, vcluster: &str) -> String {
    if TRANSLATED_LABELS.contains(&key) {
        let digest = hex(&Sha256::digest(key.as_bytes()));
        safe_concat_name(&[LABEL_PREFIX, vcluster, "x", &digest[..HASH_HEX_CHARS]])
    } else {
        key.to_string()
    }
}

/// The value of [`KIND_ANNOTATION`] for `api_version` (`group/version`, or `version` for the
/// core group) and `kind`: Go's `schema.GroupVersionKind.String()`, i.e.
/// `<group>/<version>, Kind=<Kind>` — `example.loft.sh/v1, Kind=Car`, and `/v1, Kind=Pod` for
/// the core group (the group is empty, the slash stays).
pub fn object_kind(api_version: &str, kind: &str) -> String {
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    format!("{group}/{version}, Kind={kind}")
}

/// Whether `host` carries [`MANAGED_BY_LABEL`]`=<vcluster>`, i.e. claims to be made by the
/// vCluster `vcluster` (of any kind and from any virtual object).
pub fn is_managed_by(host: &ObjectMeta, vcluster: &str) -> bool {
    host.labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL))
        .is_some_and(|value| value == vcluster)
}

/// Lower-case hex encoding.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}
