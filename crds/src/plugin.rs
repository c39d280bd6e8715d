//! `VClusterPlugin` (`vcp.dev/v1alpha1`): one vCluster plugin as a Kubernetes object.
//!
//! The object lives in the host namespace of the vCluster it targets. The operator reads
//! `spec` and installs the plugin into the vCluster's workload and RBAC; the embedded runtime
//! reads `spec.syncedTypes` / `spec.hooks` and performs the syncing. The contract is
//! `shared/DESIGN.md`, section "API".

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, ResourceRequirements, SecurityContext, VolumeMount,
};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Finalizer the operator puts on every `VClusterPlugin` it installed; removed once everything
/// the operator added (containers, volumes, RBAC) is gone again.
pub const FINALIZER: &str = "vcp.dev/cleanup";

/// Condition type: the plugin is installed (workload and RBAC); written by the operator.
pub const READY: &str = "Ready";
/// Condition type: the plugin's containers / volumes are in the vCluster's workload; written by
/// the operator.
pub const WORKLOAD_PATCHED: &str = "WorkloadPatched";
/// Condition type: the plugin's Role / ClusterRole and bindings exist; written by the operator.
pub const RBAC_READY: &str = "RBACReady";
/// Condition type: the embedded runtime syncs what the plugin declares; written by the runtime.
pub const RUNTIME_HEALTHY: &str = "RuntimeHealthy";

/// A condition of `type_` as the operator and the runtime write it: status `True` when `holds`,
/// else `False`; `lastTransitionTime` kept from `previous` (the condition as last written) when
/// its status is the same, `now` otherwise (Kubernetes API conventions: the last time the
/// condition went from one status to another). A `message` over the CRD's bound is cut to it
/// ([`crate::status_bounds::bounded_message`]).
pub fn condition(
    type_: &str,
    holds: bool,
    reason: impl Into<String>,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    previous: Option<&Condition>,
    now: &Time,
) -> Condition {
    let status = if holds { "True" } else { "False" };
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => now.clone(),
    };
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: crate::status_bounds::bounded_message(message.into()),
        observed_generation,
        last_transition_time,
    }
}

/// Whether the operator has accepted the plugin's current spec: `WorkloadPatched` is `True`
/// for `metadata.generation` (its `observedGeneration`), and the plugin is not being deleted.
/// The operator writes it so after judging that generation's hooks (DESIGN.md "Trust model";
/// the operator's `vcluster::decide`: `WorkloadPatched` carries the plugin's verdict) and
/// putting it into the workload; a refused generation gets `False` and leaves the workload.
/// A plugin being deleted is never accepted: the operator's `Terminating` status judges
/// nothing, yet it says `WorkloadPatched=True` for the deleting generation (the seventh
/// security review: hooks refused just before a `kubectl delete`, held by a finalizer of the
/// author's, were otherwise taken as accepted).
///
/// The runtime applies only accepted hooks (`vcp_syncer_runtime::acceptance`): a spec edited
/// after the judgement waits for this before its hooks change any pod. The status subresource
/// is written by the operator and the runtime (`config/rbac`); a user who could write
/// `vclusterplugins/status` could claim acceptance, so it is not granted to plugin authors.
pub fn accepted_by_operator(plugin: &VClusterPlugin) -> bool {
    let Some(generation) = plugin.metadata.generation else {
        return false;
    };
    if plugin.metadata.deletion_timestamp.is_some() {
        return false;
    }
    plugin.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == WORKLOAD_PATCHED
                && c.status == "True"
                && c.observed_generation == Some(generation)
        })
    })
}

/// Field manager of every server-side apply the operator sends.
pub const OPERATOR_FIELD_MANAGER: &str = "vcluster-plugin-operator";

/// Field manager of every write the embedded runtime sends (host objects and its status).
pub const RUNTIME_FIELD_MANAGER: &str = "vcluster-plugin-syncer";

/// Label with the `VClusterPlugin`'s name on every object the operator made for it. A
/// cluster-scoped object (ClusterRole, ClusterRoleBinding) cannot have a namespaced owner, so
/// the finalizer finds those by this label and [`PLUGIN_NAMESPACE_LABEL`].
pub const PLUGIN_NAME_LABEL: &str = "vcp.dev/plugin-name";

/// Label with the `VClusterPlugin`'s namespace on every object the operator made for it.
pub const PLUGIN_NAMESPACE_LABEL: &str = "vcp.dev/plugin-namespace";

/// The environment variables a plugin without `image` may set in the embedded runtime's
/// container (the CRD refuses every other name, and the operator copies no other): `RUST_LOG`,
/// the runtime's log filter (`tracing_subscriber`'s `EnvFilter`). The runtime's container holds
/// the vCluster's admin kubeconfig, so its environment is the operator's: the loader and the C
/// library obey `PATH`, `LD_*`, `GCONV_PATH` and more, the Kubernetes client `KUBECONFIG` and
/// `KUBERNETES_SERVICE_HOST`, the runtime its own flags' variables (`HOST_KUBECONFIG`,
/// `VIRTUAL_KUBECONFIG`, `POD_NAMESPACE`, `PLUGIN_*`), a list no one can close, so the names a
/// user may set are listed instead.
pub const RUNTIME_ENV: [&str; 1] = ["RUST_LOG"];

/// The label keys outside `vcluster.loft.sh/` that vCluster translates on every object it
/// syncs to the host (v0.30 `pkg/util/translate`, `HostLabel`: a virtual label of such a key
/// becomes a `vcluster.loft.sh/label-…` key; the runtime's `translate::TRANSLATED_LABELS`,
/// proven by the translation oracle), so that no virtual object can carry it on the host:
/// `release`, by which the chart's Service (`app: vcluster`, `release: <name>`) selects the
/// vCluster's own pods. Hooks and patches may not set or remove it either (the CRD's CEL, the
/// operator's judge and the runtime): a host pod labelled `release: <vcluster>` would receive
/// the traffic of the virtual cluster's API server.
pub const RESERVED_LABELS: [&str; 1] = ["release"];

/// CEL (on the whole object): a plugin without `image` sets only the environment variables of
/// [`RUNTIME_ENV`].
fn runtime_env_rule() -> String {
    let names: Vec<String> = RUNTIME_ENV.iter().map(|n| format!("'{n}'")).collect();
    format!(
        "has(self.spec.image) || !has(self.spec.env) || self.spec.env.all(e, e.name in [{}])",
        names.join(", ")
    )
}

/// Desired state of a plugin in one vCluster. See `shared/DESIGN.md`, "API".
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "vcp.dev",
    version = "v1alpha1",
    kind = "VClusterPlugin",
    plural = "vclusterplugins",
    singular = "vclusterplugin",
    shortname = "vcp",
    category = "vcluster",
    namespaced,
    status = "VClusterPluginStatus",
    doc = "A vCluster plugin, installed by vcluster-plugin-operator into the vCluster `spec.vcluster.name` of the same namespace.",
    printcolumn(name = "VCluster", type_ = "string", json_path = ".spec.vcluster.name", description = "The vCluster this plugin is installed into"),
    printcolumn(name = "Runtime", type_ = "string", json_path = ".status.runtime", description = "The plugin image, or `embedded` for the embedded runtime"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status", description = "Status of the Ready condition"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Lifecycle phase"),
    printcolumn(name = "Synced", type_ = "integer", json_path = ".status.syncedTotal", description = "Objects the runtime keeps in sync, all types together"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 63").message("metadata.name must be at most 63 characters: it names the plugin container and is a label value"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS-1123 label (lowercase letters, digits and '-', no dots): it names the plugin container in the vCluster's workload"),
    validation = Rule::new("!has(self.spec.config) || (has(self.spec.image) && has(self.spec.version) && self.spec.version == 'v1')").message("spec.config is only passed to a v1 (sidecar) plugin image: a v2 plugin gets its config from the vCluster's values, and the embedded runtime reads syncedTypes and hooks").field_path(".spec.config"),
    validation = Rule::new("!has(oldSelf.spec) || self.spec.vcluster.name == oldSelf.spec.vcluster.name").message("spec.vcluster.name is immutable: moving a plugin would strand its entries in the old vCluster's workload; delete the VClusterPlugin and create a new one").field_path(".spec.vcluster.name"),
    validation = Rule::new("!has(self.spec.rbac) || !has(self.spec.rbac.role) || !has(self.spec.rbac.role.extraRules) || self.spec.rbac.role.extraRules.all(r, !has(r.nonResourceURLs))").message("nonResourceURLs are cluster-scoped: put such a rule in spec.rbac.clusterRole.extraRules").field_path(".spec.rbac.role.extraRules"),
    validation = Rule::new("has(self.spec.image) || !has(self.spec.command)").message("spec.command is refused for the embedded runtime (no spec.image): vcluster-plugin-operator writes its command line, which names the plugin it runs").field_path(".spec.command"),
    validation = Rule::new("has(self.spec.image) || !has(self.spec.args)").message("spec.args is refused for the embedded runtime (no spec.image): vcluster-plugin-operator writes its arguments, and the runtime runs only the plugin the operator named").field_path(".spec.args"),
    validation = Rule::new("has(self.spec.image) || !has(self.spec.envFrom)").message("spec.envFrom is refused for the embedded runtime (no spec.image): its environment is vcluster-plugin-operator's, and a ConfigMap or Secret could hold the operator's own variables").field_path(".spec.envFrom"),
    validation = Rule::new(runtime_env_rule()).message("spec.env is refused for the embedded runtime (no spec.image), but for RUST_LOG (its log filter): its environment is vcluster-plugin-operator's, and a variable such as PATH, LD_PRELOAD or KUBECONFIG would change which binary runs in the container holding the vCluster's admin kubeconfig, or which cluster it trusts").field_path(".spec.env"),
    validation = Rule::new("has(self.spec.image) || !has(self.spec.volumeMounts)").message("spec.volumeMounts is refused for the embedded runtime (no spec.image): its container, which holds the vCluster's admin kubeconfig, is vcluster-plugin-operator's, and a mount could replace the files it runs").field_path(".spec.volumeMounts"),
    validation = Rule::new(crate::admission::permission_checks_rule()).message(crate::admission::permission_checks_message().as_str()).field_path(".spec")
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::paragraphs)]
pub struct VClusterPluginSpec {
    /// The vCluster this plugin is installed into.
    pub vcluster: VClusterRef,

    /// A plugin image built with the vcluster-sdk, such as `ghcr.io/loft-sh/vcluster-example:0.1.0`.
    /// Absent: the embedded runtime of this project performs `syncedTypes` and `hooks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512), regex(pattern = crate::schema::IMAGE_PATTERN))]
    pub image: Option<String>,

    /// How the plugin is run. With `image`: `v2` (default; copied by an init container into
    /// `/plugins` and started by the vCluster syncer) or `v1` (legacy gRPC sidecar). Without
    /// `image` (the embedded runtime): a sidecar unless `v2` is given explicitly, which copies
    /// the runtime into `/plugins/<name>` with an init container so that the vCluster syncer
    /// starts it as a v2 plugin and applies its hooks before its own writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<PluginVersion>,

    /// Image pull policy of the plugin container (`Always`, `IfNotPresent`, `Never`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Entrypoint of the plugin container, as in a Pod's container; at most 64 entries of at
    /// most 4096 characters. Only with `image`: refused for the embedded runtime, whose command
    /// line is the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), extend("x-kubernetes-validations" = [
        { "rule": "self.all(a, size(a) <= 4096)", "message": "each command entry is at most 4096 characters" },
    ]))]
    pub command: Option<Vec<String>>,

    /// Arguments of the plugin container, as in a Pod's container; at most 64 entries of at
    /// most 4096 characters. Only with `image`: refused for the embedded runtime, whose
    /// arguments (and the plugin they name) are the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), extend("x-kubernetes-validations" = [
        { "rule": "self.all(a, size(a) <= 4096)", "message": "each args entry is at most 4096 characters" },
    ]))]
    pub args: Option<Vec<String>>,

    /// Environment variables of the plugin container; at most 64, each `value` at most 32768
    /// characters (the whole spec is copied into the vCluster's workload). Names beginning with
    /// `VCP_` or `VCLUSTER_` are refused: they are the operator's and its runtime's (such as
    /// `VCLUSTER_PLUGIN_NAME`, the plugin a container runs). For the embedded runtime (no
    /// `image`) only `RUST_LOG` (its log filter) is accepted: its container is the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), extend("x-kubernetes-validations" = [
        { "rule": "self.all(e, !has(e.value) || size(e.value) <= 32768)", "message": "each env value is at most 32768 characters" },
        { "rule": "self.all(e, !e.name.startsWith('VCP_') && !e.name.startsWith('VCLUSTER_'))", "message": "env names beginning with VCP_ or VCLUSTER_ are reserved for vcluster-plugin-operator and its runtime (such as VCLUSTER_PLUGIN_NAME, the plugin a container runs)" },
    ]))]
    pub env: Option<Vec<EnvVar>>,

    /// Environment sources of the plugin container; at most 16. Only with `image`: refused for
    /// the embedded runtime. A `prefix` beginning with `VCP_` or `VCLUSTER_` is refused (the
    /// keys of a ConfigMap or Secret cannot be judged at admission; the operator's own variables
    /// are in `env`, which Kubernetes gives precedence over `envFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), extend("x-kubernetes-validations" = [
        { "rule": "self.all(f, !has(f.prefix) || (!f.prefix.startsWith('VCP_') && !f.prefix.startsWith('VCLUSTER_')))", "message": "envFrom prefixes beginning with VCP_ or VCLUSTER_ are reserved for vcluster-plugin-operator and its runtime" },
    ]))]
    pub env_from: Option<Vec<EnvFromSource>>,

    /// Compute resources of the plugin container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Security context of the plugin container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Extra volume mounts of the plugin container (the volumes must exist in the vCluster's
    /// pod); at most 16; only with `image` (refused for the embedded runtime, whose container
    /// is the operator's). The operator's volumes are refused: `vcp-vcluster-kubeconfig` (the
    /// vCluster's admin kubeconfig, which the operator mounts into its own runtime container
    /// only) and `plugins` (the emptyDir of the v2 plugins' binaries, which only the v2 init
    /// containers and vCluster's `syncer` mount, as vCluster's chart does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), extend("x-kubernetes-validations" = [
        { "rule": "self.all(m, m.name != 'vcp-vcluster-kubeconfig')", "message": "vcp-vcluster-kubeconfig is the vCluster's admin kubeconfig: vcluster-plugin-operator mounts it into its own runtime container only, and no plugin may mount it" },
        { "rule": "self.all(m, m.name != 'plugins')", "message": "plugins is the volume of the v2 plugins' binaries, which vCluster's syncer runs: only vcluster-plugin-operator's v2 init containers and the syncer mount it, and no plugin's container may" },
    ]))]
    pub volume_mounts: Option<Vec<VolumeMount>>,

    /// Free-form plugin configuration, passed as YAML in env `PLUGIN_CONFIG` to a `v1` sidecar.
    /// Refused with `v2`: a v2 plugin is started by the vCluster syncer, which passes it the
    /// config from the vCluster's own values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::free_form_object")]
    pub config: Option<serde_json::Value>,

    /// Resource types the runtime keeps in sync between the virtual cluster and the host; at
    /// most one entry per `apiVersion` and `kind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["apiVersion", "kind"]))]
    pub synced_types: Vec<SyncedType>,

    /// Mutations applied to objects on their way between the virtual cluster and the host;
    /// names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub hooks: Vec<Hook>,

    /// RBAC the plugin needs on the host, granted to the vCluster's service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rbac: Option<PluginRbac>,
}

/// Reference to the vCluster (a Helm release of the vCluster chart) in the plugin's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct VClusterRef {
    /// Name of the vCluster release. Its workload is the StatefulSet, else the Deployment, of
    /// that name in the plugin's namespace; its service account is `vc-<name>`.
    #[schemars(
        length(min = 1, max = 53),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// How the plugin is run inside the vCluster pod. With `image`: `v2` (the default) or `v1`.
/// Without `image` (the embedded runtime): a sidecar, unless `v2` is given, which makes it a
/// v2 plugin started by the vCluster syncer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PluginVersion {
    /// Legacy sidecar: it registers with the syncer's plugin server on `localhost:10099` and
    /// serves its hooks on the port in its env `VCLUSTER_PLUGIN_ADDRESS` (from 14000, past the
    /// ports of the chart's own v1 sidecars).
    #[serde(rename = "v1")]
    V1,
    /// Init container that copies `/plugin` to `/plugins/<name>`; the syncer starts it.
    #[default]
    #[serde(rename = "v2")]
    V2,
}

/// Container image pull policy, as in a Pod's container.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Always pull.
    Always,
    /// Pull when the image is not on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl PullPolicy {
    /// The string Kubernetes uses for this policy.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

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

/// CEL: a patch's `path` (vCluster's notation, [`crate::patch_path`]) writes nothing that
/// identifies the object ([`crate::patch_path::PatchPath::is_protected`], which the runtime checks
/// again). The path is folded as the hooks' rule folds a JSON Pointer ([`folded_pointer`]: ASCII
/// lower case, `ſ` → `s`, `K` → `k`) and its brackets become dots (`metadata["name"]`,
/// `metadata['name']` → `metadata.name`, `[*]` → `.*`), so every spelling of a protected field
/// is refused; a key containing dots can only be refused more often than the parser would, never
/// less. The label [`RESERVED_LABELS`] (`release`) is protected like a `vcluster.loft.sh/` one.
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
/// wrote the host copy's owner label (issue 38, hole 4); when the value is an object, the path
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

/// RBAC of a plugin on the host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginRbac {
    /// `Dedicated` (default): a Role / ClusterRole of the plugin's own, bound to the vCluster's
    /// service account. `PatchVClusterRoles`: rules appended to the Roles already bound to it.
    #[serde(default)]
    pub mode: RbacMode,
    /// Namespaced rules, in the vCluster's host namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<RoleRules>,
    /// Cluster-scoped rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role: Option<RoleRules>,
}

/// How the plugin's rules are granted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RbacMode {
    /// The plugin's own Role / ClusterRole and bindings.
    #[default]
    Dedicated,
    /// Append to the Roles bound to the vCluster's service account, recording what was added.
    PatchVClusterRoles,
}

/// Extra policy rules.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleRules {
    /// Standard Kubernetes PolicyRules, added to those derived from `syncedTypes`; verbs from
    /// the known set (a custom verb is refused as a likely typo), at most 64 rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::policy_rules")]
    pub extra_rules: Vec<PolicyRule>,
}

/// Observed state, written by the operator (phase, conditions other than `RuntimeHealthy`,
/// workload) and by the runtime (`syncedObjects`, `syncedTotal`, `RuntimeHealthy`), each with
/// server-side apply under its own field manager. Every list and string of it is bounded
/// (`maxItems`, `maxLength`), whoever writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::paragraphs)]
pub struct VClusterPluginStatus {
    /// `metadata.generation` the operator last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle phase: `Pending`, `Installing`, `Ready`, `Degraded`, `Failed`, `Terminating`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The plugin image, or `embedded` (shown in the RUNTIME column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub runtime: Option<String>,
    /// Conditions `Ready`, `WorkloadPatched`, `RBACReady`, `RuntimeHealthy`, keyed by type; at
    /// most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = crate::status_bounds::bounded_conditions, extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The vCluster workload the plugin is installed into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRef>,
    /// Objects in sync per type, reported by the runtime; at most 64 kinds (the runtime's
    /// `RuntimeHealthy` message says how many more it left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = crate::status_bounds::MAX_SYNCED_OBJECTS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["apiVersion", "kind"]))]
    pub synced_objects: Vec<SyncedObjects>,
    /// Sum of `syncedObjects[].count` (shown in the SYNCED column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_total: Option<i64>,
}

/// Lifecycle phase of a plugin.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Accepted, not yet acted on.
    Pending,
    /// Being installed into the workload.
    Installing,
    /// Installed; `Ready=True`.
    Ready,
    /// Installed, but something is wrong at run time.
    Degraded,
    /// Cannot be installed; see the `Ready` condition.
    Failed,
    /// Being removed.
    Terminating,
}

/// The vCluster workload a plugin is installed into.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WorkloadRef {
    /// `StatefulSet` or `Deployment`.
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Name of the workload.
    #[schemars(length(max = 253))]
    pub name: String,
}

/// Count of objects in sync for one type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncedObjects {
    /// `group/version` of the type.
    #[schemars(length(max = 317))]
    pub api_version: String,
    /// Kind of the type.
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Objects whose host copy matches the virtual object.
    #[schemars(range(min = 0))]
    pub count: i64,
    /// Host objects of the same name that this vCluster does not manage (never touched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub conflicts: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(generation: Option<i64>, conditions: Vec<Condition>) -> VClusterPlugin {
        let mut p = VClusterPlugin::new("p", VClusterPluginSpec::default());
        p.metadata.generation = generation;
        p.status = Some(VClusterPluginStatus {
            conditions,
            ..Default::default()
        });
        p
    }

    fn workload_patched(status: &str, generation: Option<i64>) -> Condition {
        Condition {
            type_: WORKLOAD_PATCHED.into(),
            status: status.into(),
            reason: "Installed".into(),
            message: String::new(),
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn accepted_only_when_workload_patched_is_true_for_the_current_generation() {
        assert!(accepted_by_operator(&plugin(
            Some(3),
            vec![workload_patched("True", Some(3))]
        )));
        // judged an older generation: the edit is not judged yet
        assert!(!accepted_by_operator(&plugin(
            Some(4),
            vec![workload_patched("True", Some(3))]
        )));
        // refused
        assert!(!accepted_by_operator(&plugin(
            Some(3),
            vec![workload_patched("False", Some(3))]
        )));
        // another condition, even True for the generation, is not the verdict
        let mut ready = workload_patched("True", Some(3));
        ready.type_ = READY.into();
        assert!(!accepted_by_operator(&plugin(Some(3), vec![ready])));
        // being deleted: the operator's Terminating status judges nothing
        let mut deleting = plugin(Some(3), vec![workload_patched("True", Some(3))]);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!accepted_by_operator(&deleting));
        // no status, or no generation (not yet stored by an API server)
        let mut bare = plugin(Some(3), vec![]);
        bare.status = None;
        assert!(!accepted_by_operator(&bare));
        assert!(!accepted_by_operator(&plugin(
            None,
            vec![workload_patched("True", None)]
        )));
    }
}
