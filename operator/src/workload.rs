//! Pure translation: every `VClusterPlugin` of one vCluster + the vCluster's workload → the
//! server-side-apply body the operator sends for that workload.
//!
//! DESIGN.md rules implemented here ("API" and "Operator contract"):
//! - the workload is the StatefulSet, else the Deployment, named `spec.vcluster.name`, and it
//!   must be a vCluster made by the vCluster chart ([`vcluster_identity`]: the chart's labels,
//!   a `syncer` container, a service account); any other workload gets no plugin at all
//!   (`Ready=False, reason=NotAVCluster`);
//! - no `image`: the embedded-runtime sidecar (a container named after the plugin, running
//!   `vcluster-plugin-syncer`); it reaches the virtual cluster with the kubeconfig vCluster keeps
//!   in the host Secret `vc-<vcluster>` (key `config`, server `https://localhost:8443`, the
//!   vCluster API server in the same pod), mounted read-only from one shared volume
//!   [`VCLUSTER_KUBECONFIG_VOLUME`] at [`VCLUSTER_KUBECONFIG_DIR`];
//! - `image` + `v2` (default): an init container named after the plugin running
//!   `cp -r /plugin /plugins/<name>`, an emptyDir volume `plugins`, mounted at `/plugins` in the
//!   init container and in the `syncer` container;
//! - no `image` + `version: v2` (explicit): the embedded runtime as a v2 plugin, loaded by
//!   vCluster's syncer itself: an init container named after the plugin, from the runtime
//!   image, running `vcluster-plugin-syncer install-plugin /plugins/<name>` (the runtime copies
//!   itself to `/plugins/<name>/plugin`; the image has no shell), with the same `plugins`
//!   volume and mounts as an image `v2` plugin; no sidecar and no kubeconfig Secret volume;
//! - `image` + `v1`: a legacy sidecar with `VCLUSTER_PLUGIN_ADDRESS=localhost:<14000+i>`,
//!   `VCLUSTER_PLUGIN_NAME` and `PLUGIN_CONFIG`;
//! - only the fields the operator owns are applied: a partial object (apiVersion, kind,
//!   metadata.name/namespace, pod template containers / initContainers / volumes by name), so
//!   Helm- or Argo CD-owned fields are never touched;
//! - conflicts are reported, never fought: a plugin whose container name is already used by a
//!   container the operator did not add, or that syncs a type (same API group and kind, any
//!   version) an older plugin of the same vCluster already syncs, is left out and gets
//!   `Ready=False, reason=Conflict`; "older" is by creationTimestamp, then name, so the
//!   plugin that was there first keeps working.
//!
//! All plugins share one field manager, and the `plugins` volume and the `/plugins` mount in
//! `syncer` are shared by every v2 plugin. A server-side apply *replaces* everything the manager
//! owned in that object, so the body must always hold the entries of **all** plugins installed
//! into the workload: [`plan`] takes them all and the controller sends one apply per workload.
//! Removing a plugin is the same apply without it; when no plugin is left the body holds no
//! `spec` at all, so the operator's field manager owns nothing and the pod template is back
//! to what it was.
//!
//! Refusals the operator decides from policy or cluster state (a rule the policy forbids, a
//! type the host does not serve, no vCluster Role to append to) are judged for every plugin of
//! the vCluster before [`plan`] runs, by every reconcile of that workload alike
//! (`crate::install::ClusterFacts`): [`plan`] is only given the plugins those checks let
//! through, and decides conflicts among them. A refused plugin therefore never appears in any
//! reconcile's apply body, and the workload is not written for it.
//!
//! [`is_converged`] decides whether the apply can be skipped (DESIGN.md: a reconcile of a
//! converged object performs zero writes).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PodSpec, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::ResourceExt;
use serde_json::{Map, Value, json};
use vcp_crds::{FINALIZER, OPERATOR_FIELD_MANAGER, PluginVersion, VClusterPlugin};

/// Name of the vCluster chart's main container, into which `/plugins` is mounted for v2 plugins.
pub const SYNCER_CONTAINER: &str = "syncer";
/// Name of the emptyDir volume shared by the v2 init containers and `syncer`.
pub const PLUGINS_VOLUME: &str = "plugins";
/// Mount path of [`PLUGINS_VOLUME`].
pub const PLUGINS_MOUNT_PATH: &str = "/plugins";
/// Binary of the embedded runtime inside the runtime image.
pub const RUNTIME_BINARY: &str = "vcluster-plugin-syncer";
/// Volume (a Secret volume of `vc-<vcluster>`) shared by every embedded-runtime sidecar.
pub const VCLUSTER_KUBECONFIG_VOLUME: &str = "vcp-vcluster-kubeconfig";
/// Mount path of [`VCLUSTER_KUBECONFIG_VOLUME`] in the embedded-runtime sidecars.
pub const VCLUSTER_KUBECONFIG_DIR: &str = "/var/run/vcp/vcluster";
/// Key of the vCluster's kubeconfig in its Secret `vc-<vcluster>` (and so the file name under
/// [`VCLUSTER_KUBECONFIG_DIR`]).
pub const VCLUSTER_KUBECONFIG_KEY: &str = "config";
/// Port of the first v1 plugin; the i-th (0-based) v1 plugin listens on `14000 + i`.
pub const V1_BASE_PORT: u32 = 14000;

/// `Ready` reason of a plugin whose container name is taken by a container the operator did
/// not add.
pub const REASON_CONFLICT: &str = "Conflict";
/// `Ready` reason of a v1 plugin whose `spec.config` cannot be rendered as YAML.
pub const REASON_INVALID_CONFIG: &str = "InvalidConfig";

/// Kind of a vCluster workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    /// `apps/v1` StatefulSet (the vCluster chart's default).
    StatefulSet,
    /// `apps/v1` Deployment.
    Deployment,
}

impl WorkloadKind {
    /// The Kubernetes kind, `StatefulSet` or `Deployment`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::Deployment => "Deployment",
        }
    }
}

/// What the operator needs to know of a vCluster workload: its identity, its labels and its
/// pod template's labels (to tell a vCluster from any other workload, [`vcluster_identity`]),
/// its pod template's spec and its managed fields (to know which entries the operator owns).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    /// StatefulSet or Deployment.
    pub kind: Option<WorkloadKind>,
    /// Name (the vCluster release name).
    pub name: String,
    /// Namespace (the plugin's namespace).
    pub namespace: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.template.metadata.labels`.
    pub template_labels: BTreeMap<String, String>,
    /// `spec.template.spec` (empty when absent).
    pub pod_spec: PodSpec,
    /// `metadata.managedFields`.
    pub managed_fields: Vec<ManagedFieldsEntry>,
    /// `metadata.uid` (a recreated workload is another object).
    pub uid: Option<String>,
    /// `metadata.generation`: grows with every change of the spec.
    pub generation: Option<i64>,
}

impl Workload {
    /// The workload view of a StatefulSet.
    pub fn from_statefulset(sts: &StatefulSet) -> Self {
        let template = sts.spec.as_ref().map(|s| &s.template);
        Workload {
            kind: Some(WorkloadKind::StatefulSet),
            name: sts.name_any(),
            namespace: sts.namespace().unwrap_or_default(),
            labels: sts.labels().clone(),
            template_labels: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            pod_spec: template.and_then(|t| t.spec.clone()).unwrap_or_default(),
            managed_fields: sts.metadata.managed_fields.clone().unwrap_or_default(),
            uid: sts.metadata.uid.clone(),
            generation: sts.metadata.generation,
        }
    }

    /// The workload view of a Deployment.
    pub fn from_deployment(deploy: &Deployment) -> Self {
        let template = deploy.spec.as_ref().map(|s| &s.template);
        Workload {
            kind: Some(WorkloadKind::Deployment),
            name: deploy.name_any(),
            namespace: deploy.namespace().unwrap_or_default(),
            labels: deploy.labels().clone(),
            template_labels: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            pod_spec: template.and_then(|t| t.spec.clone()).unwrap_or_default(),
            managed_fields: deploy.metadata.managed_fields.clone().unwrap_or_default(),
            uid: deploy.metadata.uid.clone(),
            generation: deploy.metadata.generation,
        }
    }

    /// `StatefulSet` or `Deployment` (StatefulSet when unset).
    pub fn kind_str(&self) -> &'static str {
        self.kind.unwrap_or(WorkloadKind::StatefulSet).as_str()
    }
}

/// The label the vCluster chart gives its workload and the workload's pods, with
/// [`VCLUSTER_APP_VALUE`] (`chart/templates/statefulset.yaml` of vCluster v0.30.0:
/// `metadata.labels` and `spec.template.metadata.labels` both carry `app: vcluster` and
/// `release: <release>`; the selector matches on the same two).
pub const VCLUSTER_APP_LABEL: &str = "app";
/// The value of [`VCLUSTER_APP_LABEL`] on a vCluster's workload (the chart's external etcd, for
/// one, is `app: vcluster-etcd`, and is no vCluster).
pub const VCLUSTER_APP_VALUE: &str = "vcluster";
/// The label naming the Helm release on a vCluster's workload; the workload itself is named
/// after the release.
pub const VCLUSTER_RELEASE_LABEL: &str = "release";

/// `Ready` reason of a plugin whose target workload is not a vCluster ([`vcluster_identity`]).
pub const REASON_NOT_A_VCLUSTER: &str = "NotAVCluster";

/// Decides whether `workload` is a vCluster, and which service account its pods run as.
///
/// What counts (the vCluster chart, v0.30.0, `chart/templates/statefulset.yaml`, which renders
/// both the StatefulSet and the Deployment form of the control plane):
/// - `metadata.labels` hold `app: vcluster` and `release: <the workload's name>`;
/// - the pod template's labels hold the same two;
/// - the pod template has a container named `syncer`;
/// - the pod template names its `serviceAccountName` (the chart always sets it: `vc-<release>`
///   unless `controlPlane.advanced.serviceAccount.name` overrides it). A pod template without
///   one runs as the namespace's `default` account, shared by every pod that names none; the
///   plugin's rules are never bound to it.
///
/// Returns the pod template's service account: the subject of the plugin's RBAC, whatever its
/// name (the deprecated `serviceAccount` alias is read when `serviceAccountName` is empty, as
/// the API server does).
///
/// # Errors
/// A [`Refusal`] with [`REASON_NOT_A_VCLUSTER`] naming the first requirement missed.
pub fn vcluster_identity(workload: &Workload) -> Result<String, Refusal> {
    let what = format!(
        "{} {}/{}",
        workload.kind_str(),
        workload.namespace,
        workload.name
    );
    let refuse = |missing: String| Refusal {
        reason: REASON_NOT_A_VCLUSTER,
        message: format!(
            "{what} is not a vCluster: {missing}; a VClusterPlugin is only installed into the StatefulSet or Deployment the vCluster chart makes (labels app: vcluster and release: <name> on it and on its pod template, a container `syncer`, a serviceAccountName); nothing was written"
        ),
    };
    let wanted = [
        (VCLUSTER_APP_LABEL, VCLUSTER_APP_VALUE),
        (VCLUSTER_RELEASE_LABEL, workload.name.as_str()),
    ];
    for (place, labels) in [
        ("its labels", &workload.labels),
        ("its pod template's labels", &workload.template_labels),
    ] {
        for (key, value) in wanted {
            match labels.get(key) {
                Some(v) if v == value => {}
                Some(v) => {
                    return Err(refuse(format!(
                        "{place} have {key}: {v}, not {key}: {value}"
                    )));
                }
                None => return Err(refuse(format!("{place} lack {key}: {value}"))),
            }
        }
    }
    if !workload
        .pod_spec
        .containers
        .iter()
        .any(|c| c.name == SYNCER_CONTAINER)
    {
        return Err(refuse(format!(
            "its pod template has no container `{SYNCER_CONTAINER}`"
        )));
    }
    let spec = &workload.pod_spec;
    spec.service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .or(spec.service_account.as_deref().filter(|s| !s.is_empty()))
        .map(str::to_string)
        .ok_or_else(|| {
            refuse(
                "its pod template sets no serviceAccountName, so its pods run as the namespace's `default` account, which the plugin's rules are never bound to".into(),
            )
        })
}

/// How a plugin runs inside the vCluster pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginKind {
    /// No `image` (and no explicit `version: v2`): the embedded runtime as a sidecar
    /// container.
    Embedded,
    /// No `image` + `version: v2`: the embedded runtime copied into `/plugins/<name>` by an
    /// init container and started by vCluster's syncer as a v2 plugin.
    EmbeddedV2,
    /// `image` + `version: v1`: a legacy gRPC sidecar.
    V1,
    /// `image` + `version: v2` (default): an init container copying the plugin to `/plugins`.
    V2,
}

impl PluginKind {
    /// Whether the plugin is run by this project's embedded runtime (sidecar or v2).
    pub fn is_embedded(self) -> bool {
        matches!(self, PluginKind::Embedded | PluginKind::EmbeddedV2)
    }
}

/// How `plugin` runs. For the embedded runtime `version` defaults to the sidecar; only an
/// explicit `version: v2` makes it a v2 plugin (`v1` is the sidecar too).
pub fn plugin_kind(plugin: &VClusterPlugin) -> PluginKind {
    match (&plugin.spec.image, plugin.spec.version.unwrap_or_default()) {
        (None, PluginVersion::V2) if plugin.spec.version.is_some() => PluginKind::EmbeddedV2,
        (None, _) => PluginKind::Embedded,
        (Some(_), PluginVersion::V1) => PluginKind::V1,
        (Some(_), PluginVersion::V2) => PluginKind::V2,
    }
}

/// Why a plugin was left out of the workload; becomes its `Ready=False` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Condition reason, such as [`REASON_CONFLICT`].
    pub reason: &'static str,
    /// Human-readable message naming what to change.
    pub message: String,
}

/// Result of [`plan`].
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadPlan {
    /// The server-side-apply body (a partial StatefulSet or Deployment).
    pub patch: Value,
    /// Names of the plugins whose entries are in [`WorkloadPlan::patch`].
    pub installed: BTreeSet<String>,
    /// Plugins left out, by name, with the reason.
    pub refused: BTreeMap<String, Refusal>,
}

/// Whether `plugin` is installed into the vCluster `vcluster` of `namespace`: it targets it,
/// carries the operator's finalizer (so its removal is guaranteed to run the cleanup) and is
/// not being deleted.
pub fn contributes(plugin: &VClusterPlugin, namespace: &str, vcluster: &str) -> bool {
    plugin.namespace().as_deref() == Some(namespace)
        && plugin.spec.vcluster.name == vcluster
        && plugin.metadata.deletion_timestamp.is_none()
        && plugin.finalizers().iter().any(|f| f == FINALIZER)
}

/// `plugins` in the order [`plan`] installs them: by creationTimestamp, then name (so that v1
/// ports stay stable, and the older of two conflicting plugins wins).
pub fn install_order<'a>(plugins: &[&'a VClusterPlugin]) -> Vec<&'a VClusterPlugin> {
    let mut sorted: Vec<&VClusterPlugin> = plugins.to_vec();
    sorted.sort_by(|a, b| {
        (a.metadata.creation_timestamp.as_ref(), a.name_any())
            .cmp(&(b.metadata.creation_timestamp.as_ref(), b.name_any()))
    });
    sorted
}

/// Computes the apply body of `workload` holding the entries of every plugin in `plugins`
/// (callers pass those for which [`contributes`] holds; order does not matter: plugins are
/// ordered by creation time, then name, so that v1 ports stay stable).
///
/// `runtime_image` is the image of the embedded runtime (the operator's `--runtime-image`).
pub fn plan(workload: &Workload, plugins: &[&VClusterPlugin], runtime_image: &str) -> WorkloadPlan {
    let sorted = install_order(plugins);

    let owned = owned_entries(&workload.managed_fields);
    // Not a vCluster: every plugin is refused, and the body (no `spec`) takes out whatever
    // the operator added earlier (nothing at all when it owns nothing: no write).
    let not_a_vcluster = vcluster_identity(workload).err();

    let mut containers: Vec<Container> = Vec::new();
    let mut init_containers: Vec<Container> = Vec::new();
    let mut installed = BTreeSet::new();
    let mut refused = BTreeMap::new();
    let mut v1_index = 0u32;
    // (group, kind) → the installed plugin syncing it.
    let mut synced_by: BTreeMap<(String, String), String> = BTreeMap::new();

    for plugin in sorted {
        let name = plugin.name_any();
        if let Some(refusal) = &not_a_vcluster {
            refused.insert(name, refusal.clone());
            continue;
        }
        if let Some(refusal) = name_conflict(workload, &owned, &name) {
            refused.insert(name, refusal);
            continue;
        }
        if let Some(refusal) = synced_type_conflict(workload, &synced_by, plugin) {
            refused.insert(name, refusal);
            continue;
        }
        match plugin_kind(plugin) {
            PluginKind::Embedded => containers.push(embedded_container(plugin, runtime_image)),
            PluginKind::V1 => match v1_container(plugin, V1_BASE_PORT + v1_index) {
                Ok(c) => {
                    v1_index += 1;
                    containers.push(c);
                }
                Err(refusal) => {
                    refused.insert(name, refusal);
                    continue;
                }
            },
            kind @ (PluginKind::V2 | PluginKind::EmbeddedV2) => {
                init_containers.push(if kind == PluginKind::EmbeddedV2 {
                    embedded_v2_init_container(plugin, runtime_image)
                } else {
                    v2_init_container(plugin)
                });
            }
        }
        for t in &plugin.spec.synced_types {
            synced_by
                .entry(synced_type_key(&t.api_version, &t.kind))
                .or_insert_with(|| name.clone());
        }
        installed.insert(name);
    }

    let mut volumes = Vec::new();
    if containers.iter().any(|c| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == VCLUSTER_KUBECONFIG_VOLUME)
    }) {
        volumes.push(vcluster_kubeconfig_volume(&workload.name));
    }
    if !init_containers.is_empty() {
        // The shared entries, exactly once, whatever the number of v2 plugins.
        containers.insert(
            0,
            Container {
                name: SYNCER_CONTAINER.into(),
                volume_mounts: Some(vec![plugins_mount()]),
                ..Default::default()
            },
        );
        volumes.push(Volume {
            name: PLUGINS_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }

    let mut pod_spec = Map::new();
    if !containers.is_empty() {
        pod_spec.insert("containers".into(), to_value(&containers));
    }
    if !init_containers.is_empty() {
        pod_spec.insert("initContainers".into(), to_value(&init_containers));
    }
    if !volumes.is_empty() {
        pod_spec.insert("volumes".into(), to_value(&volumes));
    }

    let mut patch = json!({
        "apiVersion": "apps/v1",
        "kind": workload.kind_str(),
        "metadata": { "name": workload.name, "namespace": workload.namespace },
    });
    if !pod_spec.is_empty() {
        patch["spec"] = json!({ "template": { "spec": Value::Object(pod_spec) } });
    }
    WorkloadPlan {
        patch,
        installed,
        refused,
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    // Serializing k8s-openapi types to a JSON value cannot fail (no non-string map keys).
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The Secret volume holding the vCluster's kubeconfig: vCluster writes it to the host Secret
/// `vc-<vcluster>` (key [`VCLUSTER_KUBECONFIG_KEY`]).
pub fn vcluster_kubeconfig_volume(vcluster: &str) -> Volume {
    Volume {
        name: VCLUSTER_KUBECONFIG_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(format!("vc-{vcluster}")),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn vcluster_kubeconfig_mount() -> VolumeMount {
    VolumeMount {
        name: VCLUSTER_KUBECONFIG_VOLUME.into(),
        mount_path: VCLUSTER_KUBECONFIG_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

fn plugins_mount() -> VolumeMount {
    VolumeMount {
        name: PLUGINS_VOLUME.into(),
        mount_path: PLUGINS_MOUNT_PATH.into(),
        ..Default::default()
    }
}

/// A plugin's container name is taken when a container or init container of that name exists
/// whose `image` the operator does not own (so someone else added it, such as `syncer`).
fn name_conflict(workload: &Workload, owned: &Value, name: &str) -> Option<Refusal> {
    let spec = &workload.pod_spec;
    let none = Vec::new();
    for (list, entries) in [
        ("containers", &spec.containers),
        (
            "initContainers",
            spec.init_containers.as_ref().unwrap_or(&none),
        ),
    ] {
        if entries.iter().any(|c| c.name == name) {
            let ours = owned
                .pointer(&format!("/f:{list}"))
                .and_then(|l| l.get(item_key("name", name)))
                .is_some_and(|item| item.get("f:image").is_some());
            if !ours {
                return Some(Refusal {
                    reason: REASON_CONFLICT,
                    message: format!(
                        "{} {}/{} already has a {} named `{name}` that vcluster-plugin-operator did not add; rename the VClusterPlugin",
                        workload.kind_str(),
                        workload.namespace,
                        workload.name,
                        if list == "containers" {
                            "container"
                        } else {
                            "init container"
                        },
                    ),
                });
            }
        }
    }
    None
}

fn synced_type_key(api_version: &str, kind: &str) -> (String, String) {
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    (group.to_string(), kind.to_string())
}

/// A plugin syncing a type that an older installed plugin (in `synced_by`) already syncs.
fn synced_type_conflict(
    workload: &Workload,
    synced_by: &BTreeMap<(String, String), String>,
    plugin: &VClusterPlugin,
) -> Option<Refusal> {
    plugin
        .spec
        .synced_types
        .iter()
        .enumerate()
        .find_map(|(i, t)| {
            let owner = synced_by.get(&synced_type_key(&t.api_version, &t.kind))?;
            Some(Refusal {
                reason: REASON_CONFLICT,
                message: format!(
                    "spec.syncedTypes[{i}] ({} {}) is already synced by the older VClusterPlugin `{owner}` in vCluster {}/{}; two plugins syncing one type would fight over the same host objects: remove the type from one of them",
                    t.api_version, t.kind, workload.namespace, workload.name
                ),
            })
        })
}

/// The container fields every kind of plugin copies from its spec.
fn base_container(plugin: &VClusterPlugin, image: &str) -> Container {
    let spec = &plugin.spec;
    Container {
        name: plugin.name_any(),
        image: Some(image.to_string()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: spec.command.clone(),
        args: spec.args.clone(),
        env: spec.env.clone().filter(|e| !e.is_empty()),
        env_from: spec.env_from.clone().filter(|e| !e.is_empty()),
        resources: spec.resources.clone(),
        security_context: spec.security_context.clone(),
        volume_mounts: spec.volume_mounts.clone().filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// The embedded-runtime sidecar: `vcluster-plugin-syncer --plugin <name> --namespace <ns>
/// --vcluster <vcluster> --virtual-kubeconfig /var/run/vcp/vcluster/config` (spec `command` /
/// `args`, when given, replace these), with the vCluster's kubeconfig Secret mounted
/// read-only at [`VCLUSTER_KUBECONFIG_DIR`] (before the spec's own `volumeMounts`; a spec
/// mount at the same path is dropped, as a mount path can be used only once).
pub fn embedded_container(plugin: &VClusterPlugin, runtime_image: &str) -> Container {
    let mut c = base_container(plugin, runtime_image);
    let mut mounts = c.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| m.mount_path != VCLUSTER_KUBECONFIG_DIR);
    mounts.insert(0, vcluster_kubeconfig_mount());
    c.volume_mounts = Some(mounts);
    if c.command.is_none() {
        c.command = Some(vec![RUNTIME_BINARY.to_string()]);
    }
    if c.args.is_none() {
        c.args = Some(vec![
            "--plugin".into(),
            plugin.name_any(),
            "--namespace".into(),
            plugin.namespace().unwrap_or_default(),
            "--vcluster".into(),
            plugin.spec.vcluster.name.clone(),
            "--virtual-kubeconfig".into(),
            format!("{VCLUSTER_KUBECONFIG_DIR}/{VCLUSTER_KUBECONFIG_KEY}"),
        ]);
    }
    c
}

/// The legacy v1 sidecar listening on `localhost:<port>`: env `VCLUSTER_PLUGIN_ADDRESS` and
/// `VCLUSTER_PLUGIN_NAME` first, then `spec.env`, as vCluster's chart renders it
/// (`vcluster.legacyPlugins.containers`), then `PLUGIN_CONFIG` from `spec.config` rendered as
/// YAML (the chart has no such env: a deliberate difference, see tests/tests/chart_oracle.rs).
///
/// # Errors
/// A [`Refusal`] with [`REASON_INVALID_CONFIG`] when `spec.config` cannot be rendered.
pub fn v1_container(plugin: &VClusterPlugin, port: u32) -> Result<Container, Refusal> {
    let mut c = base_container(plugin, plugin.spec.image.as_deref().unwrap_or_default());
    let own = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let mut env = vec![
        own("VCLUSTER_PLUGIN_ADDRESS", format!("localhost:{port}")),
        own("VCLUSTER_PLUGIN_NAME", plugin.name_any()),
    ];
    env.extend(c.env.take().unwrap_or_default().into_iter().filter(|e| {
        !matches!(
            e.name.as_str(),
            "VCLUSTER_PLUGIN_ADDRESS" | "VCLUSTER_PLUGIN_NAME" | "PLUGIN_CONFIG"
        )
    }));
    let mut push = |name: &str, value: String| env.push(own(name, value));
    if let Some(config) = &plugin.spec.config {
        let yaml = serde_yaml::to_string(config).map_err(|e| Refusal {
            reason: REASON_INVALID_CONFIG,
            message: format!("spec.config cannot be rendered as YAML for PLUGIN_CONFIG: {e}"),
        })?;
        push("PLUGIN_CONFIG", yaml);
    }
    c.env = Some(env);
    Ok(c)
}

/// The v2 init container: `sh -c "cp -r /plugin /plugins/<name>"` (as the vCluster chart
/// does; spec `command` / `args` replace it), with `plugins` mounted at `/plugins`.
pub fn v2_init_container(plugin: &VClusterPlugin) -> Container {
    let mut c = base_container(plugin, plugin.spec.image.as_deref().unwrap_or_default());
    if c.command.is_none() && c.args.is_none() {
        c.command = Some(vec!["sh".into()]);
        c.args = Some(vec![
            "-c".into(),
            format!("cp -r /plugin {PLUGINS_MOUNT_PATH}/{}", plugin.name_any()),
        ]);
    }
    let mut mounts = c.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| m.mount_path != PLUGINS_MOUNT_PATH);
    mounts.insert(0, plugins_mount());
    c.volume_mounts = Some(mounts);
    c
}

/// The init container of the embedded runtime as a v2 plugin: `vcluster-plugin-syncer
/// install-plugin /plugins/<name>` from the runtime image (the runtime copies itself to
/// `/plugins/<name>/plugin`, where vCluster's syncer finds and starts it; spec `command` /
/// `args` replace it), with `plugins` mounted at `/plugins`.
pub fn embedded_v2_init_container(plugin: &VClusterPlugin, runtime_image: &str) -> Container {
    let mut c = base_container(plugin, runtime_image);
    if c.command.is_none() && c.args.is_none() {
        c.command = Some(vec![
            RUNTIME_BINARY.to_string(),
            "install-plugin".into(),
            format!("{PLUGINS_MOUNT_PATH}/{}", plugin.name_any()),
        ]);
    }
    let mut mounts = c.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| m.mount_path != PLUGINS_MOUNT_PATH);
    mounts.insert(0, plugins_mount());
    c.volume_mounts = Some(mounts);
    c
}

// ---------------------------------------------------------------------------------------------
// Convergence: does the live workload already hold exactly what `plan` would apply?

/// Lists of the pod spec that are maps keyed by a field (`+listType=map`) among those the
/// operator writes; every other list is atomic. Used to turn an apply body into the field set
/// the API server records in `managedFields`.
const KEYED_LISTS: [(&str, &str); 5] = [
    ("containers", "name"),
    ("initContainers", "name"),
    ("volumes", "name"),
    ("env", "name"),
    ("volumeMounts", "mountPath"),
];

fn list_key(field: &str) -> Option<&'static str> {
    KEYED_LISTS
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, k)| *k)
}

/// `k:{"name":"x"}`, the managedFields key of a map-list item.
fn item_key(key: &str, value: &str) -> String {
    format!("k:{}", json!({ key: value }))
}

/// The operator's owned field set of the pod spec (`f:spec`/`f:template`/`f:spec` of its
/// `Apply` entry in `managedFields`), or `{}` when it owns nothing.
pub fn owned_entries(managed_fields: &[ManagedFieldsEntry]) -> Value {
    managed_fields
        .iter()
        .find(|e| {
            e.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER)
                && e.operation.as_deref() == Some("Apply")
                && e.subresource.as_deref().unwrap_or_default().is_empty()
        })
        .and_then(|e| e.fields_v1.as_ref())
        .and_then(|f| f.0.pointer("/f:spec/f:template/f:spec"))
        .cloned()
        .unwrap_or_else(|| json!({}))
}

/// The field set (managedFields `FieldsV1` notation) an apply of `value` would own.
pub fn field_set(value: &Value) -> Value {
    fn walk(value: &Value, field: &str) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (format!("f:{k}"), walk(v, k)))
                    .collect(),
            ),
            Value::Array(items) => match list_key(field) {
                Some(key) => {
                    let mut out = Map::new();
                    for item in items {
                        let id = item.get(key).and_then(Value::as_str).unwrap_or_default();
                        let mut fields = match walk(item, "") {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        fields.insert(".".into(), json!({}));
                        out.insert(item_key(key, id), Value::Object(fields));
                    }
                    Value::Object(out)
                }
                None => json!({}),
            },
            _ => json!({}),
        }
    }
    walk(value, "")
}

/// Whether every value in `desired` is present and equal in `live`: objects key by key,
/// keyed lists item by item (matched by key; other items in `live` are someone else's),
/// atomic lists element by element with the same length.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    fn walk(desired: &Value, live: &Value, field: &str) -> bool {
        match (desired, live) {
            (Value::Object(d), Value::Object(l)) => d
                .iter()
                .all(|(k, dv)| l.get(k).is_some_and(|lv| walk(dv, lv, k))),
            (Value::Array(d), Value::Array(l)) => match list_key(field) {
                Some(key) => d.iter().all(|di| {
                    let id = di.get(key);
                    l.iter()
                        .find(|li| li.get(key) == id)
                        .is_some_and(|li| walk(di, li, ""))
                }),
                None => d.len() == l.len() && d.iter().zip(l).all(|(di, li)| walk(di, li, "")),
            },
            (d, l) => d == l,
        }
    }
    walk(desired, live, "")
}

/// Whether applying `patch` (from [`plan`]) to `workload` would change nothing: the operator
/// already owns exactly the fields of `patch` (so no stale entry is left to remove) and the
/// live values equal the desired ones.
///
/// Known gap: quantities the API server canonicalizes (`1000m` is stored as `1`) compare
/// unequal, which costs a no-op apply on every reconcile of such a plugin.
pub fn is_converged(workload: &Workload, patch: &Value) -> bool {
    let desired = patch
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let live = to_value(&workload.pod_spec);
    field_set(&desired) == owned_entries(&workload.managed_fields) && is_subset(&desired, &live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use vcp_crds::{PullPolicy, VClusterPluginSpec, VClusterRef};

    const RUNTIME: &str = "ghcr.io/vcp-dev/vcluster-plugin-operator:0.1.0";

    fn plugin(name: &str, image: Option<&str>, version: Option<PluginVersion>) -> VClusterPlugin {
        let mut p = VClusterPlugin::new(
            name,
            VClusterPluginSpec {
                vcluster: VClusterRef {
                    name: "my-vcluster".into(),
                },
                image: image.map(String::from),
                version,
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("team-a".into());
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        p
    }

    fn created_at(mut p: VClusterPlugin, secs: i64) -> VClusterPlugin {
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
        ));
        p
    }

    /// A vCluster-chart-shaped StatefulSet: the chart's labels, one `syncer` container, one
    /// volume, the chart's default service account.
    fn workload() -> Workload {
        let labels = BTreeMap::from([
            ("app".to_string(), "vcluster".to_string()),
            ("release".to_string(), "my-vcluster".to_string()),
        ]);
        Workload {
            kind: Some(WorkloadKind::StatefulSet),
            name: "my-vcluster".into(),
            namespace: "team-a".into(),
            labels: labels.clone(),
            template_labels: labels,
            pod_spec: PodSpec {
                service_account_name: Some("vc-my-vcluster".into()),
                containers: vec![Container {
                    name: SYNCER_CONTAINER.into(),
                    image: Some("ghcr.io/loft-sh/vcluster-pro:0.26.0".into()),
                    volume_mounts: Some(vec![VolumeMount {
                        name: "data".into(),
                        mount_path: "/data".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                volumes: Some(vec![Volume {
                    name: "data".into(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            managed_fields: vec![],
            ..Default::default()
        }
    }

    /// `workload` after the API server merged `patch` (a naive merge of keyed lists, which is
    /// what server-side apply does for the lists the operator writes), with `managedFields` as
    /// the API server records them.
    fn applied(mut w: Workload, patch: &Value) -> Workload {
        let mut live = to_value(&w.pod_spec);
        let desired = patch
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(json!({}));
        fn merge(live: &mut Value, desired: &Value, field: &str) {
            match (live, desired) {
                (Value::Object(l), Value::Object(d)) => {
                    for (k, dv) in d {
                        let lv = l.entry(k.clone()).or_insert(Value::Null);
                        if lv.is_null() {
                            *lv = dv.clone();
                        } else {
                            merge(lv, dv, k);
                        }
                    }
                }
                (Value::Array(l), Value::Array(d)) if list_key(field).is_some() => {
                    let key = list_key(field).unwrap();
                    for di in d {
                        match l.iter_mut().find(|li| li.get(key) == di.get(key)) {
                            Some(li) => merge(li, di, ""),
                            None => l.push(di.clone()),
                        }
                    }
                }
                (l, d) => *l = d.clone(),
            }
        }
        merge(&mut live, &desired, "");
        w.pod_spec = serde_json::from_value(live).unwrap();
        w.managed_fields = vec![ManagedFieldsEntry {
            manager: Some(OPERATOR_FIELD_MANAGER.into()),
            operation: Some("Apply".into()),
            api_version: Some("apps/v1".into()),
            fields_v1: Some(FieldsV1(json!({
                "f:spec": { "f:template": { "f:spec": field_set(&desired) } }
            }))),
            ..Default::default()
        }];
        w
    }

    fn containers(patch: &Value) -> Vec<Container> {
        serde_json::from_value(
            patch
                .pointer("/spec/template/spec/containers")
                .cloned()
                .unwrap_or(json!([])),
        )
        .unwrap()
    }

    fn init_containers(patch: &Value) -> Vec<Container> {
        serde_json::from_value(
            patch
                .pointer("/spec/template/spec/initContainers")
                .cloned()
                .unwrap_or(json!([])),
        )
        .unwrap()
    }

    #[test]
    fn embedded_plugin_adds_only_its_sidecar() {
        let p = plugin("car-syncer", None, None);
        let plan = plan(&workload(), &[&p], RUNTIME);
        assert_eq!(
            plan.patch,
            json!({
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": { "name": "my-vcluster", "namespace": "team-a" },
                "spec": { "template": { "spec": {
                    "containers": [{
                        "name": "car-syncer",
                        "image": RUNTIME,
                        "command": ["vcluster-plugin-syncer"],
                        "args": ["--plugin", "car-syncer", "--namespace", "team-a", "--vcluster", "my-vcluster",
                                 "--virtual-kubeconfig", "/var/run/vcp/vcluster/config"],
                        "volumeMounts": [{ "name": "vcp-vcluster-kubeconfig", "mountPath": "/var/run/vcp/vcluster", "readOnly": true }],
                    }],
                    "volumes": [{ "name": "vcp-vcluster-kubeconfig", "secret": { "secretName": "vc-my-vcluster" } }],
                }}}
            })
        );
        assert_eq!(plan.installed, BTreeSet::from(["car-syncer".to_string()]));
        assert!(plan.refused.is_empty());
    }

    #[test]
    fn embedded_sidecars_share_one_kubeconfig_volume_that_goes_with_the_last() {
        let a = created_at(plugin("a", None, None), 1);
        let mut b = created_at(plugin("b", None, None), 2);
        // A spec mount at the kubeconfig path would be a duplicate mount path: dropped.
        b.spec.volume_mounts = Some(vec![
            VolumeMount {
                name: "mine".into(),
                mount_path: VCLUSTER_KUBECONFIG_DIR.into(),
                ..Default::default()
            },
            VolumeMount {
                name: "data".into(),
                mount_path: "/data".into(),
                ..Default::default()
            },
        ]);
        let v2 = created_at(plugin("v2", Some("img"), None), 3);
        let both = plan(&workload(), &[&b, &a, &v2], RUNTIME);
        let spec = &both.patch["spec"]["template"]["spec"];
        assert_eq!(
            spec["volumes"],
            json!([
                { "name": "vcp-vcluster-kubeconfig", "secret": { "secretName": "vc-my-vcluster" } },
                { "name": "plugins", "emptyDir": {} },
            ])
        );
        let cs = containers(&both.patch);
        let mounts = |c: &Container| -> Vec<(String, String, Option<bool>)> {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only))
                .collect()
        };
        let kubeconfig = (
            VCLUSTER_KUBECONFIG_VOLUME.to_string(),
            VCLUSTER_KUBECONFIG_DIR.to_string(),
            Some(true),
        );
        assert_eq!(cs[1].name, "a");
        assert_eq!(mounts(&cs[1]), std::slice::from_ref(&kubeconfig));
        assert_eq!(cs[2].name, "b");
        assert_eq!(
            mounts(&cs[2]),
            [kubeconfig, ("data".into(), "/data".into(), None)]
        );
        assert_eq!(
            cs[2].args.as_ref().unwrap()[6..],
            ["--virtual-kubeconfig", "/var/run/vcp/vcluster/config"]
        );
        // The v2 init container does not get the kubeconfig.
        assert_eq!(
            init_containers(&both.patch)[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .len(),
            1
        );

        // Only the image plugin left: the Secret volume goes, the plugins volume stays.
        let live = applied(workload(), &both.patch);
        let only_v2 = plan(&live, &[&v2], RUNTIME);
        assert_eq!(
            only_v2.patch["spec"]["template"]["spec"]["volumes"],
            json!([{ "name": "plugins", "emptyDir": {} }])
        );
        assert!(!is_converged(&live, &only_v2.patch));
        assert!(is_converged(
            &live,
            &plan(&live, &[&a, &b, &v2], RUNTIME).patch
        ));
    }

    #[test]
    fn embedded_v2_plugin_is_an_init_container_copying_the_runtime() {
        let p = plugin("cars", None, Some(PluginVersion::V2));
        assert_eq!(plugin_kind(&p), PluginKind::EmbeddedV2);
        let plan = plan(&workload(), &[&p], RUNTIME);
        // As an image v2 plugin (the vCluster chart's `plugins:` layout), but from the runtime
        // image, whose binary installs itself (the image has no shell for `cp`); no sidecar, no
        // kubeconfig Secret volume.
        assert_eq!(
            plan.patch["spec"]["template"]["spec"],
            json!({
                "containers": [{ "name": "syncer", "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }] }],
                "initContainers": [{
                    "name": "cars",
                    "image": RUNTIME,
                    "command": ["vcluster-plugin-syncer", "install-plugin", "/plugins/cars"],
                    "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }],
                }],
                "volumes": [{ "name": "plugins", "emptyDir": {} }],
            })
        );
        assert_eq!(plan.installed, BTreeSet::from(["cars".to_string()]));
    }

    #[test]
    fn the_embedded_runtime_is_a_sidecar_unless_v2_is_asked_for() {
        let p = plugin("x", None, Some(PluginVersion::V1));
        assert_eq!(plugin_kind(&p), PluginKind::Embedded);
        assert_eq!(plugin_kind(&plugin("x", None, None)), PluginKind::Embedded);
    }

    #[test]
    fn v2_plugin_adds_init_container_volume_and_syncer_mount() {
        let p = plugin(
            "hooks",
            Some("ghcr.io/loft-sh/vcluster-example:0.1.0"),
            None,
        );
        let plan = plan(&workload(), &[&p], RUNTIME);
        assert_eq!(
            plan.patch["spec"]["template"]["spec"],
            json!({
                "containers": [{ "name": "syncer", "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }] }],
                "initContainers": [{
                    "name": "hooks",
                    "image": "ghcr.io/loft-sh/vcluster-example:0.1.0",
                    "command": ["sh"],
                    "args": ["-c", "cp -r /plugin /plugins/hooks"],
                    "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }],
                }],
                "volumes": [{ "name": "plugins", "emptyDir": {} }],
            })
        );
    }

    #[test]
    fn shared_v2_entries_appear_once_for_several_plugins() {
        let a = created_at(plugin("a", Some("img-a"), None), 10);
        let b = created_at(plugin("b", Some("img-b"), Some(PluginVersion::V2)), 20);
        let plan = plan(&workload(), &[&b, &a], RUNTIME);
        let spec = &plan.patch["spec"]["template"]["spec"];
        assert_eq!(spec["volumes"].as_array().unwrap().len(), 1);
        let cs = containers(&plan.patch);
        assert_eq!(cs.len(), 1, "only the syncer mount entry: {cs:?}");
        assert_eq!(cs[0].name, SYNCER_CONTAINER);
        let names: Vec<_> = init_containers(&plan.patch)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["a", "b"], "ordered by creation time");
    }

    #[test]
    fn removing_one_v2_plugin_keeps_the_shared_entries_for_the_other() {
        let a = plugin("a", Some("img-a"), None);
        let b = plugin("b", Some("img-b"), None);
        let both = plan(&workload(), &[&a, &b], RUNTIME);
        let live = applied(workload(), &both.patch);
        let only_b = plan(&live, &[&b], RUNTIME);
        let spec = &only_b.patch["spec"]["template"]["spec"];
        assert_eq!(
            spec["volumes"],
            json!([{ "name": "plugins", "emptyDir": {} }])
        );
        assert_eq!(containers(&only_b.patch)[0].name, SYNCER_CONTAINER);
        assert_eq!(init_containers(&only_b.patch).len(), 1);
        assert!(
            !is_converged(&live, &only_b.patch),
            "a's init container must go"
        );
    }

    #[test]
    fn no_plugin_left_means_an_apply_that_owns_nothing() {
        let a = plugin("a", Some("img-a"), None);
        let live = applied(workload(), &plan(&workload(), &[&a], RUNTIME).patch);
        let none = plan(&live, &[], RUNTIME);
        assert_eq!(
            none.patch,
            json!({
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": { "name": "my-vcluster", "namespace": "team-a" },
            })
        );
        assert!(!is_converged(&live, &none.patch));
        assert!(
            is_converged(&workload(), &none.patch),
            "nothing owned, nothing wanted"
        );
    }

    #[test]
    fn mixed_plugins_in_one_apply() {
        let e = created_at(plugin("embedded", None, None), 1);
        let v1a = created_at(
            plugin("legacy-a", Some("img-1"), Some(PluginVersion::V1)),
            2,
        );
        let v2 = created_at(plugin("modern", Some("img-2"), None), 3);
        let v1b = created_at(
            plugin("legacy-b", Some("img-3"), Some(PluginVersion::V1)),
            4,
        );
        let plan = plan(&workload(), &[&v1b, &v2, &e, &v1a], RUNTIME);
        let cs = containers(&plan.patch);
        let names: Vec<_> = cs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["syncer", "embedded", "legacy-a", "legacy-b"]);
        let addr = |c: &Container| {
            c.env
                .as_ref()
                .unwrap()
                .iter()
                .find(|e| e.name == "VCLUSTER_PLUGIN_ADDRESS")
                .and_then(|e| e.value.clone())
        };
        assert_eq!(addr(&cs[2]).as_deref(), Some("localhost:14000"));
        assert_eq!(addr(&cs[3]).as_deref(), Some("localhost:14001"));
        assert_eq!(plan.installed.len(), 4);
    }

    #[test]
    fn v1_sidecar_carries_name_config_and_container_fields() {
        let mut p = plugin("legacy", Some("img:1"), Some(PluginVersion::V1));
        p.spec.config = Some(json!({ "greeting": "hi" }));
        p.spec.image_pull_policy = Some(PullPolicy::Always);
        p.spec.args = Some(vec!["--verbose".into()]);
        p.spec.env = Some(vec![EnvVar {
            name: "LOG".into(),
            value: Some("debug".into()),
            ..Default::default()
        }]);
        p.spec.resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
            ..Default::default()
        });
        let c = v1_container(&p, 14003).unwrap();
        assert_eq!(c.image.as_deref(), Some("img:1"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(c.args, Some(vec!["--verbose".to_string()]));
        assert!(c.resources.is_some());
        let env: Vec<(String, String)> = c
            .env
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap()))
            .collect();
        assert_eq!(
            env,
            [
                (
                    "VCLUSTER_PLUGIN_ADDRESS".to_string(),
                    "localhost:14003".to_string()
                ),
                ("VCLUSTER_PLUGIN_NAME".into(), "legacy".into()),
                ("LOG".into(), "debug".into()),
                ("PLUGIN_CONFIG".into(), "greeting: hi\n".into()),
            ]
        );
    }

    #[test]
    fn spec_command_and_args_replace_the_defaults() {
        let mut p = plugin("e", None, None);
        p.spec.args = Some(vec!["--x".into()]);
        let c = embedded_container(&p, RUNTIME);
        assert_eq!(c.command, Some(vec![RUNTIME_BINARY.to_string()]));
        assert_eq!(c.args, Some(vec!["--x".to_string()]));
        let mut p = plugin("v2", Some("img"), None);
        p.spec.command = Some(vec!["/bin/install".into()]);
        let c = v2_init_container(&p);
        assert_eq!(c.command, Some(vec!["/bin/install".to_string()]));
        assert_eq!(c.args, None);
    }

    #[test]
    fn plugin_named_like_a_foreign_container_is_refused_not_fought() {
        let bad = plugin("syncer", None, None);
        let good = plugin("ok", None, None);
        let plan = plan(&workload(), &[&bad, &good], RUNTIME);
        assert_eq!(plan.refused["syncer"].reason, REASON_CONFLICT);
        assert_eq!(plan.installed, BTreeSet::from(["ok".to_string()]));
        let names: Vec<_> = containers(&plan.patch)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["ok"]);
    }

    #[test]
    fn the_newer_of_two_plugins_syncing_one_type_is_refused() {
        let car = |v: &str| vcp_crds::SyncedType {
            api_version: format!("example.loft.sh/{v}"),
            kind: "Car".into(),
            ..Default::default()
        };
        let mut old = created_at(plugin("zz-old", None, None), 1);
        old.spec.synced_types = vec![car("v1")];
        let mut new = created_at(plugin("aa-new", Some("img"), None), 2);
        new.spec.synced_types = vec![
            vcp_crds::SyncedType {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                ..Default::default()
            },
            car("v2"),
        ];
        let plan1 = plan(&workload(), &[&new, &old], RUNTIME);
        assert_eq!(plan1.installed, BTreeSet::from(["zz-old".to_string()]));
        let r = &plan1.refused["aa-new"];
        assert_eq!(r.reason, REASON_CONFLICT);
        assert!(r.message.starts_with("spec.syncedTypes[1] (example.loft.sh/v2 Car) is already synced by the older VClusterPlugin `zz-old`"), "{}", r.message);
        assert!(
            init_containers(&plan1.patch).is_empty(),
            "nothing of the newer one"
        );

        // Same creation time: the name decides.
        let mut b = created_at(plugin("b", None, None), 5);
        b.spec.synced_types = vec![car("v1")];
        let mut a = created_at(plugin("a", None, None), 5);
        a.spec.synced_types = vec![car("v1")];
        let plan2 = plan(&workload(), &[&b, &a], RUNTIME);
        assert_eq!(plan2.installed, BTreeSet::from(["a".to_string()]));
        assert!(plan2.refused.contains_key("b"));

        // A refused plugin claims nothing: a third one behind it is judged against the installed.
        let mut other = created_at(plugin("c", None, None), 9);
        other.spec.synced_types = vec![vcp_crds::SyncedType {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            ..Default::default()
        }];
        let plan3 = plan(&workload(), &[&old, &new, &other], RUNTIME);
        assert!(plan3.installed.contains("c"), "{:?}", plan3.refused);
    }

    #[test]
    fn the_operators_own_container_is_not_a_conflict() {
        let p = plugin("car-syncer", None, None);
        let first = plan(&workload(), &[&p], RUNTIME);
        let live = applied(workload(), &first.patch);
        let again = plan(&live, &[&p], RUNTIME);
        assert!(again.refused.is_empty());
        assert_eq!(again.patch, first.patch);
    }

    /// The StatefulSet the vCluster chart (v0.30.0, `chart/templates/statefulset.yaml`)
    /// renders for release `my-vcluster` in `team-a` with default values, trimmed to metadata,
    /// selector, pod template labels, service account and the `syncer` container; `extra`
    /// is merged over it (JSON merge patch).
    fn chart_statefulset(extra: Value) -> StatefulSet {
        let mut sts = json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {
                "name": "my-vcluster", "namespace": "team-a",
                "labels": { "app": "vcluster", "chart": "vcluster-0.30.0", "release": "my-vcluster", "heritage": "Helm" },
            },
            "spec": {
                "selector": { "matchLabels": { "app": "vcluster", "release": "my-vcluster" } },
                "serviceName": "my-vcluster-headless",
                "template": {
                    "metadata": {
                        "annotations": { "vClusterConfigHash": "0" },
                        "labels": { "app": "vcluster", "release": "my-vcluster" },
                    },
                    "spec": {
                        "serviceAccountName": "vc-my-vcluster",
                        "containers": [{ "name": "syncer", "image": "ghcr.io/loft-sh/vcluster-pro:0.30.0" }],
                    },
                },
            },
        });
        json_patch::merge(&mut sts, &extra);
        serde_json::from_value(sts).unwrap()
    }

    #[test]
    fn a_chart_made_vcluster_counts_and_its_service_account_is_the_subject() {
        let sts = chart_statefulset(json!({}));
        assert_eq!(
            vcluster_identity(&Workload::from_statefulset(&sts)),
            Ok("vc-my-vcluster".to_string())
        );
        // `controlPlane.advanced.serviceAccount.name: custom-sa`: the chart's pods run as it.
        let custom = chart_statefulset(
            json!({ "spec": { "template": { "spec": { "serviceAccountName": "custom-sa" } } } }),
        );
        assert_eq!(
            vcluster_identity(&Workload::from_statefulset(&custom)),
            Ok("custom-sa".to_string())
        );
        // The chart's Deployment form (no persistence, external datastore): same labels.
        let sts_value = serde_json::to_value(&sts).unwrap();
        let mut d = sts_value.clone();
        d["kind"] = json!("Deployment");
        d["spec"].as_object_mut().unwrap().remove("serviceName");
        let d: Deployment = serde_json::from_value(d).unwrap();
        assert_eq!(
            vcluster_identity(&Workload::from_deployment(&d)),
            Ok("vc-my-vcluster".to_string())
        );
    }

    #[test]
    fn other_workloads_are_not_vclusters() {
        let refused = |sts: StatefulSet| {
            let r = vcluster_identity(&Workload::from_statefulset(&sts)).unwrap_err();
            assert_eq!(r.reason, REASON_NOT_A_VCLUSTER);
            r.message
        };
        // A database: its own labels, its own container, its own service account.
        let postgres: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "postgres", "namespace": "team-a",
                          "labels": { "app.kubernetes.io/name": "postgresql" } },
            "spec": {
                "selector": { "matchLabels": { "app.kubernetes.io/name": "postgresql" } },
                "serviceName": "postgres",
                "template": {
                    "metadata": { "labels": { "app.kubernetes.io/name": "postgresql" } },
                    "spec": { "serviceAccountName": "postgres",
                              "containers": [{ "name": "postgresql", "image": "postgres:16" }] },
                },
            },
        }))
        .unwrap();
        let m = refused(postgres);
        assert!(
            m.contains("StatefulSet team-a/postgres is not a vCluster"),
            "{m}"
        );
        assert!(m.contains("lack app: vcluster"), "{m}");
        // The chart's own external etcd: release label, but app: vcluster-etcd.
        let etcd = chart_statefulset(json!({
            "metadata": { "name": "my-vcluster-etcd", "labels": { "app": "vcluster-etcd" } },
        }));
        assert!(refused(etcd).contains("app: vcluster-etcd, not app: vcluster"));
        // Another release's labels (the workload is named after its release).
        let other = chart_statefulset(json!({ "metadata": { "name": "other" } }));
        assert!(refused(other).contains("release: my-vcluster, not release: other"));
        // Labelled on the outside only.
        let pods = chart_statefulset(
            json!({ "spec": { "template": { "metadata": { "labels": { "app": null } } } } }),
        );
        assert!(refused(pods).contains("its pod template's labels lack app: vcluster"));
        // No `syncer` container.
        let no_syncer = chart_statefulset(json!({ "spec": { "template": { "spec": {
            "containers": [{ "name": "vcluster", "image": "x" }] } } } }));
        assert!(refused(no_syncer).contains("no container `syncer`"));
        // No service account: its pods would run as `default`.
        let no_sa = chart_statefulset(json!({ "spec": { "template": { "spec": {
            "serviceAccountName": null } } } }));
        assert!(refused(no_sa).contains("`default`"));
    }

    #[test]
    fn a_workload_that_is_not_a_vcluster_gets_no_plugin_and_loses_ours() {
        let mut w = workload();
        w.labels.clear();
        let a = plugin("a", None, None);
        let b = plugin("b", Some("img"), None);
        let plan = plan(&w, &[&a, &b], RUNTIME);
        assert_eq!(plan.refused["a"].reason, REASON_NOT_A_VCLUSTER);
        assert_eq!(plan.refused["b"].reason, REASON_NOT_A_VCLUSTER);
        assert!(plan.installed.is_empty());
        assert!(plan.patch.get("spec").is_none());
        // Owning nothing, that body is converged: no write at all.
        assert!(is_converged(&w, &plan.patch));
        // Owning an earlier plugin's sidecar, it takes it out.
        let installed = applied(workload(), &super::plan(&workload(), &[&a], RUNTIME).patch);
        let mut relabelled = installed.clone();
        relabelled.labels.clear();
        let again = super::plan(&relabelled, &[&a], RUNTIME);
        assert!(!is_converged(&relabelled, &again.patch));
        assert!(again.patch.get("spec").is_none());
    }

    #[test]
    fn contributes_requires_target_finalizer_and_no_deletion() {
        let p = plugin("a", None, None);
        assert!(contributes(&p, "team-a", "my-vcluster"));
        assert!(!contributes(&p, "team-b", "my-vcluster"));
        assert!(!contributes(&p, "team-a", "other"));
        let mut no_finalizer = p.clone();
        no_finalizer.metadata.finalizers = None;
        assert!(!contributes(&no_finalizer, "team-a", "my-vcluster"));
        let mut deleting = p.clone();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(!contributes(&deleting, "team-a", "my-vcluster"));
    }

    #[test]
    fn field_set_matches_the_api_servers_notation() {
        let fs = field_set(&json!({
            "containers": [{ "name": "syncer", "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }] }],
            "volumes": [{ "name": "plugins", "emptyDir": {} }],
        }));
        assert_eq!(
            fs,
            json!({
                "f:containers": { "k:{\"name\":\"syncer\"}": {
                    ".": {}, "f:name": {},
                    "f:volumeMounts": { "k:{\"mountPath\":\"/plugins\"}": { ".": {}, "f:mountPath": {}, "f:name": {} } },
                }},
                "f:volumes": { "k:{\"name\":\"plugins\"}": { ".": {}, "f:emptyDir": {}, "f:name": {} } },
            })
        );
    }

    #[test]
    fn converged_after_apply_and_not_before() {
        let p = plugin("a", Some("img"), None);
        let plan1 = plan(&workload(), &[&p], RUNTIME);
        assert!(!is_converged(&workload(), &plan1.patch));
        let live = applied(workload(), &plan1.patch);
        assert!(is_converged(&live, &plan(&live, &[&p], RUNTIME).patch));
    }

    #[test]
    fn server_defaults_in_live_do_not_break_convergence() {
        let p = plugin("a", None, None);
        let plan1 = plan(&workload(), &[&p], RUNTIME);
        let mut live = applied(workload(), &plan1.patch);
        let c = live
            .pod_spec
            .containers
            .iter_mut()
            .find(|c| c.name == "a")
            .unwrap();
        c.termination_message_path = Some("/dev/termination-log".into());
        c.image_pull_policy = Some("IfNotPresent".into());
        assert!(is_converged(&live, &plan1.patch));
    }

    #[test]
    fn drift_is_detected() {
        let p = plugin("a", None, None);
        let plan1 = plan(&workload(), &[&p], RUNTIME);
        let live = applied(workload(), &plan1.patch);

        let mut image_changed = live.clone();
        image_changed.pod_spec.containers[1].image = Some("other".into());
        assert!(!is_converged(&image_changed, &plan1.patch));

        let mut removed = live.clone();
        removed.pod_spec.containers.retain(|c| c.name != "a");
        assert!(!is_converged(&removed, &plan1.patch));
    }

    #[test]
    fn a_field_dropped_from_the_spec_is_detected_as_stale() {
        let mut p = plugin("a", None, None);
        p.spec.env = Some(vec![EnvVar {
            name: "X".into(),
            value: Some("1".into()),
            ..Default::default()
        }]);
        let live = applied(workload(), &plan(&workload(), &[&p], RUNTIME).patch);
        p.spec.env = None;
        assert!(!is_converged(&live, &plan(&live, &[&p], RUNTIME).patch));
    }

    #[test]
    fn foreign_mounts_in_syncer_do_not_matter() {
        let p = plugin("a", Some("img"), None);
        let plan1 = plan(&workload(), &[&p], RUNTIME);
        let live = applied(workload(), &plan1.patch);
        assert_eq!(
            live.pod_spec.containers[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .len(),
            2
        );
        assert!(is_converged(&live, &plan1.patch));
    }

    #[test]
    fn subset_compares_atomic_lists_exactly() {
        assert!(is_subset(
            &json!({"args": ["a"]}),
            &json!({"args": ["a"], "x": 1})
        ));
        assert!(!is_subset(
            &json!({"args": ["a"]}),
            &json!({"args": ["a", "b"]})
        ));
        assert!(is_subset(
            &json!({"env": [{"name": "A", "value": "1"}]}),
            &json!({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]})
        ));
        assert!(!is_subset(
            &json!({"env": [{"name": "A", "value": "1"}]}),
            &json!({"env": []})
        ));
    }
}
