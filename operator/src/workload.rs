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
mod tests;
