//! `VClusterPlugin` (`vcp.dev/v1alpha1`): one vCluster plugin as a Kubernetes object.
//!
//! The object lives in the host namespace of the vCluster it targets. The operator reads
//! `spec` and installs the plugin into the vCluster's workload and RBAC; the embedded runtime
//! reads `spec.syncedTypes` / `spec.hooks` and performs the syncing. The README's "Concepts"
//! and "Syncing real custom resources" explain the fields.
//!
//! The parts of the spec and status: `synced` (`syncedTypes[]`), `patch` (their `patches[]`),
//! `hook` (`hooks[]`), `rbac` (`rbac`) and `status`; every type keeps its path here and at the
//! crate's root.

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, ResourceRequirements, SecurityContext, VolumeMount,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod hook;
mod patch;
mod rbac;
mod status;
mod synced;

pub use hook::{
    Hook, HookEvent, JsonPatchOp, JsonPatchOperation, protected_from_rule, protected_path_rule,
};
pub use patch::{
    PROTECTED_PATCH_PATH_RULE, TranslatePatch, TranslatePatchLabels, TranslatePatchReference,
    protected_reference_path_rule,
};
pub use rbac::{PluginRbac, RbacMode, RoleRules};
pub use status::{
    Phase, RBAC_READY, READY, RUNTIME_HEALTHY, SyncedObjects, VClusterPluginStatus,
    WORKLOAD_PATCHED, WorkloadRef, condition,
};
pub use synced::{FromHostMappings, ProducedObject, SyncDirection, SyncedType};

/// Finalizer the operator puts on every `VClusterPlugin` it installed; removed once everything
/// the operator added (containers, volumes, RBAC) is gone again.
pub const FINALIZER: &str = "vcp.dev/cleanup";

/// Whether the operator has accepted the plugin's current spec: `WorkloadPatched` is `True`
/// for `metadata.generation` (its `observedGeneration`), and the plugin is not being deleted.
/// The operator writes it so after judging that generation's hooks (only hooks the operator
/// judged ever run; the operator's `vcluster::decide`: `WorkloadPatched` carries the plugin's
/// verdict) and putting it into the workload; a refused generation gets `False` and leaves the
/// workload.
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

/// Desired state of a plugin in one vCluster.
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
    /// `image` (the embedded runtime): `v2` copies the runtime into `/plugins/<name>` with an
    /// init container, so that the vCluster syncer starts it as a v2 plugin and applies its
    /// hooks before its own writes; `v1` is a sidecar; absent, a sidecar, unless a
    /// `CreatePhysical` pod hook changes what an existing pod cannot change, which only takes
    /// effect the `v2` way (such a hook with `v1` is refused, `HookCannotTakeEffect`). Run the
    /// `v2` way, the runtime lives in vCluster's `syncer` container: no `/metrics` port of its
    /// own, and `resources` and `securityContext` apply to its init container only.
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
/// Without `image` (the embedded runtime): `v2` makes it a v2 plugin started by the vCluster
/// syncer, `v1` a sidecar; absent, a sidecar, unless a `CreatePhysical` pod hook changes more
/// of the pod than an existing pod may change: then `v2`.
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

#[cfg(test)]
mod tests;
