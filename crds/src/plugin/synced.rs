//! `syncedTypes[]`: one resource type the runtime keeps in sync ([`SyncedType`]), its
//! direction, the host objects a `FromHost` type maps ([`FromHostMappings`]) and the objects a
//! `ToHost` type brings back ([`ProducedObject`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::patch::TranslatePatch;

/// One resource type kept in sync by the runtime.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    { "rule": "!has(self.mappings) || (has(self.direction) && self.direction == 'FromHost')", "message": "mappings (vCluster's sync.fromHost mappings.byName) only apply to a FromHost type", "fieldPath": ".mappings" },
    { "rule": "!has(self.produced) || size(self.produced) == 0 || !has(self.direction) || self.direction == 'ToHost'", "message": "produced brings back what a host controller makes for the host copies of a ToHost type: a FromHost type has no host copies", "fieldPath": ".produced" },
]))]
pub struct SyncedType {
    /// `group/version` of the type, such as `example.loft.sh/v1` (`v1` for the core group).
    #[schemars(length(min = 1, max = 317), regex(pattern = crate::schema::API_VERSION_PATTERN))]
    pub api_version: String,
    /// Kind of the type, such as `Car`.
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::schema::KIND_PATTERN))]
    pub kind: String,
    /// Plural resource name, such as `cars`. Discovered from the API server when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub resource: Option<String>,
    /// `ToHost` (default): virtual objects are copied to the host namespace.
    /// `FromHost`: host objects are copied into the virtual cluster.
    #[serde(default)]
    pub direction: SyncDirection,
    /// Copy the host object's `.status` up to the virtual object.
    #[serde(default)]
    pub sync_status: bool,
    /// Only source objects matching this label selector are synced (`matchLabels` and
    /// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`, checked like
    /// Kubernetes checks a selector). An object that stops matching (relabelled, or the
    /// selector narrowed) is treated as vCluster treats an object leaving a sync selector: its
    /// copy is deleted, with a log line and an Event `SelectorNoLongerMatches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::label_selector")]
    pub selector: Option<LabelSelector>,
    /// vCluster's `patches` of a custom resource (`config.TranslatePatch` of the v0.30 module's
    /// `config/config.go`, documented under `sync.*.customResources.*.patches`), applied in
    /// order to the copy on its way to the other side, and reversed on the way back.
    /// Two patches may not have the same path (vCluster's `validatePatches`: "have the same
    /// path"): the list is a map keyed by `path`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["path"]))]
    pub patches: Vec<TranslatePatch>,
    /// `FromHost` only: vCluster's `mappings` of `sync.fromHost.customResources.*` (which host
    /// objects are copied, and where to). Absent: the identity mapping of the vCluster's host
    /// namespace into the virtual namespace of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mappings: Option<FromHostMappings>,
    /// `ToHost` only: objects a host controller produces for a synced object (the Secret
    /// cert-manager issues for a Certificate), brought back into the synced object's virtual
    /// namespace under the virtual name, kept up to date, and removed when the synced object
    /// or the host object goes. This project's addition: vCluster has no such option. The host
    /// object is brought back only when its name is the host name of the virtual name
    /// (`<name>-x-<namespace>-x-<vcluster>`, as a `reference` patch on `namePath` makes it);
    /// a virtual object of that name the runtime did not make is never overwritten (a
    /// `HostObjectConflict`). The copies carry the annotations `vcp.dev/produced-for`
    /// (`<Kind>.<group>/<name>` of the synced object), `vcp.dev/produced-path` (the
    /// `namePath`), `vcluster.loft.sh/object-host-name` and `-host-namespace`. The runtime is
    /// granted `get`, `list`, `watch` on the kind in the vCluster's host namespace, which the
    /// plugin's author must hold. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub produced: Vec<ProducedObject>,
}

/// vCluster's `config.FromHostMappings`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FromHostMappings {
    /// Host object → virtual object, in vCluster's shapes (its `validateFromHostMappingEntry`):
    /// `"host-namespace/name": "virtual-namespace/name"` (one object, renamed; a value
    /// `"virtual-namespace/*"` keeps its name), `"host-namespace/*": "virtual-namespace/*"`
    /// (every object of the namespace), `"/name": "virtual-namespace/name"` and `"":
    /// "virtual-namespace"` (one object, or every object, of the vCluster's host namespace). A
    /// host object is matched by the exact key first, then `namespace/*`, then `/name`, then
    /// `""`, as in vCluster. `*` is only a whole name. The host namespace must be the vCluster's
    /// own (the plugin's namespace): another is refused at admission, by the operator
    /// (`Ready=False`, `ForeignNamespace`) and by the runtime, which never reads it. At most 64
    /// entries.
    #[serde(default)]
    #[schemars(extend(
        "maxProperties" = 64,
        "additionalProperties" = { "type": "string", "maxLength": 317 },
        "x-kubernetes-validations" = [
            { "rule": "self.all(k, size(k) <= 317)", "message": "a mappings.byName key is at most 317 characters (a namespace, '/', a name)" },
            { "rule": "self.all(k, k == '' || k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?/([*]|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$'))", "message": "a mappings.byName key is NAMESPACE/NAME, NAMESPACE/*, /NAME or \"\" (vCluster's shapes; * only as a whole name)" },
            { "rule": "self.all(k, k != '/*')", "message": "a mappings.byName key for every object of the vCluster's host namespace is \"\" or NAMESPACE/*, not /*" },
            { "rule": "self.all(k, k == '' ? self[k].matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[*])?$') : self[k].matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?/([*]|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$'))", "message": "a mappings.byName value is VIRTUAL-NAMESPACE/NAME or VIRTUAL-NAMESPACE/* (VIRTUAL-NAMESPACE alone for the \"\" key); * only as a whole name" },
            { "rule": "self.all(k, !k.endsWith('/*') || self[k].endsWith('/*'))", "message": "a mappings.byName key matching every object of a namespace (NAMESPACE/*) needs a value VIRTUAL-NAMESPACE/*" },
        ]
    ))]
    pub by_name: BTreeMap<String, String>,
}

impl FromHostMappings {
    /// The keys of `byName` that name a host namespace other than `host_namespace` (the
    /// vCluster's, the plugin's own): a key `namespace/...` with another namespace. The `""` and
    /// `/name` keys mean the vCluster's host namespace (vCluster's
    /// `VClusterNamespaceInHostMappingSpecialCharacter`), so they are never foreign. The runtime
    /// never reads another host namespace: the operator refuses such a plugin (`Ready=False`,
    /// `ForeignNamespace`), and so does the requester admission policy.
    pub fn foreign_keys(&self, host_namespace: &str) -> Vec<&str> {
        self.by_name
            .keys()
            .filter(|key| {
                key.split_once('/')
                    .is_some_and(|(ns, _)| !ns.is_empty() && ns != host_namespace)
            })
            .map(String::as_str)
            .collect()
    }
}

/// An object a host controller produces for a synced object, brought back (see
/// [`SyncedType::produced`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProducedObject {
    /// `group/version` of the produced object (`v1` for a Secret).
    #[schemars(length(min = 1, max = 317), regex(pattern = crate::schema::API_VERSION_PATTERN))]
    pub api_version: String,
    /// Kind of the produced object.
    #[schemars(length(min = 1, max = 63), regex(pattern = crate::schema::KIND_PATTERN))]
    pub kind: String,
    /// Path of its name in the synced object (vCluster's `namePath`): the host copy's value is
    /// the host object's name, the virtual object's value the name it comes back under. Plain
    /// dots for now (`spec.secretName`).
    #[schemars(length(min = 1, max = 512))]
    pub name_path: String,
}

/// Direction of a synced type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SyncDirection {
    /// Virtual cluster to host namespace.
    #[default]
    ToHost,
    /// Host namespace to virtual cluster.
    FromHost,
}

impl SyncDirection {
    /// Whether objects are copied to the host (`ToHost`): the runtime writes host objects
    /// (and owns them through the vCluster's Service), rather than only reading them.
    pub const fn is_to_host(self) -> bool {
        match self {
            SyncDirection::ToHost => true,
            SyncDirection::FromHost => false,
        }
    }
}
