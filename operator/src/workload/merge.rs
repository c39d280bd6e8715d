//! The apply body of one workload: the entries of every plugin installed into it, merged in
//! install order, and the conflicts among them.
//!
//! The rule: one field manager, entries added and removed by name so
//! Helm- or Argo CD-owned fields are never touched; conflicts are reported, never fought (a
//! container name someone else uses, a type an older plugin already syncs: `Conflict` on the
//! newer one).

use std::collections::{BTreeMap, BTreeSet};
use vcp_crds::Reason;

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec, Volume};
use kube::ResourceExt;
use serde_json::{Map, Value, json};
use vcp_crds::{FINALIZER, VClusterPlugin};

use super::containers::{
    PLUGIN_ADDRESS_ENV, PLUGINS_VOLUME, PluginKind, RUNTIME_METRICS_BASE_PORT, V1_BASE_PORT,
    embedded_container, embedded_v2_init_container, plugin_kind, plugins_mount, v1_container,
    v2_init_container, vcluster_kubeconfig_volume,
};
use super::converge::{item_key, owned_entries, to_value};
use super::identity::{Refusal, SYNCER_CONTAINER, Workload, vcluster_identity};

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
/// ports stay stable, see [`V1_BASE_PORT`], and the older of two conflicting plugins wins).
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
/// A v1 plugin's port is the lowest from [`V1_BASE_PORT`] that no container the operator did
/// not add names in its `VCLUSTER_PLUGIN_ADDRESS` (such as a v1 sidecar vCluster's chart
/// renders from its own `plugin:` values, numbered from 14000 too) and no earlier v1 plugin of
/// this plan took. An embedded-runtime sidecar's `/metrics` port is, likewise, the lowest from
/// [`RUNTIME_METRICS_BASE_PORT`] that no container the operator did not add declares or names
/// in its `VCLUSTER_PLUGIN_ADDRESS`, no v1 sidecar of this plan listens on and no earlier
/// sidecar of this plan took. (A process that listens on a port its container does not declare
/// cannot be seen from the pod template: the runtime then reports it, `MetricsUnavailable`.)
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
    // Ports a v1 sidecar must not take: those of the containers the operator did not add,
    // then those of the operator's v1 sidecars as they are placed.
    let mut taken_ports = foreign_plugin_ports(workload, &owned);
    // Ports an embedded sidecar's `/metrics` must not take: those the containers the operator
    // did not add declare or listen on as v1 sidecars, then those of the operator's sidecars
    // (runtimes and v1 plugins) as they are placed.
    let mut taken_metrics_ports = foreign_declared_ports(workload, &owned);
    taken_metrics_ports.extend(taken_ports.iter().copied());
    // Whether an embedded-runtime sidecar is installed: the only container that gets the
    // vCluster's kubeconfig volume (whatever other containers ask for).
    let mut runtime_sidecar = false;
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
        if let Some(refusal) = super::hook_mode::sidecar_refusal(plugin) {
            refused.insert(name, refusal);
            continue;
        }
        match plugin_kind(plugin) {
            PluginKind::Embedded => {
                runtime_sidecar = true;
                let port = lowest_free_port(RUNTIME_METRICS_BASE_PORT, &taken_metrics_ports);
                taken_metrics_ports.insert(port);
                containers.push(embedded_container(plugin, runtime_image, port));
            }
            PluginKind::V1 => {
                let port = lowest_free_port(V1_BASE_PORT, &taken_ports);
                match v1_container(plugin, port) {
                    Ok(c) => {
                        taken_ports.insert(port);
                        taken_metrics_ports.insert(port);
                        containers.push(c);
                    }
                    Err(refusal) => {
                        refused.insert(name, refusal);
                        continue;
                    }
                }
            }
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
    if runtime_sidecar {
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

/// The pod spec of `workload`'s pods once `planned` (a [`plan`] of it) is applied: the live
/// template with the containers and init containers the operator added replaced by the plan's
/// (the plan's `syncer` entry, a mount only, merges into the live `syncer` and changes nothing
/// else of it). For judging what the pods would ask for before the apply
/// (`crate::judge::resources`).
pub fn planned_pod_spec(workload: &Workload, planned: &WorkloadPlan) -> PodSpec {
    let owned = owned_entries(&workload.managed_fields);
    let template = planned.patch.pointer("/spec/template/spec");
    let entries = |list: &str| -> Vec<Container> {
        template
            .and_then(|t| t.get(list))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default()
    };
    let merged = |list: &'static str, live: &[Container]| -> Vec<Container> {
        let mut out: Vec<Container> = live
            .iter()
            .filter(|c| !is_operators(&owned, list, &c.name))
            .cloned()
            .collect();
        for c in entries(list) {
            if !out.iter().any(|o| o.name == c.name) {
                out.push(c);
            }
        }
        out
    };
    let mut spec = workload.pod_spec.clone();
    spec.containers = merged("containers", &workload.pod_spec.containers);
    let init = merged(
        "initContainers",
        workload
            .pod_spec
            .init_containers
            .as_deref()
            .unwrap_or_default(),
    );
    spec.init_containers = Some(init).filter(|i| !i.is_empty());
    spec
}

/// The live containers and init containers of `workload`, each with the name of its list
/// (`containers`, `initContainers`).
fn live_containers(workload: &Workload) -> impl Iterator<Item = (&'static str, &Container)> {
    let spec = &workload.pod_spec;
    let containers = spec.containers.iter().map(|c| ("containers", c));
    let init = spec.init_containers.iter().flatten();
    containers.chain(init.map(|c| ("initContainers", c)))
}

/// Whether the operator added the container `name` of `list`: its `image` is in the operator's
/// owned field set `owned` (the `syncer` entry, where the operator owns a mount only, is not).
fn is_operators(owned: &Value, list: &str, name: &str) -> bool {
    owned
        .pointer(&format!("/f:{list}"))
        .and_then(|l| l.get(item_key("name", name)))
        .is_some_and(|item| item.get("f:image").is_some())
}

/// The ports in the `VCLUSTER_PLUGIN_ADDRESS` env (a literal `value`, its port after the last
/// `:`) of the containers and init containers of `workload` that the operator did not add:
/// the v1 sidecars vCluster's chart renders from its own `plugin:` values, or anyone else's.
fn foreign_plugin_ports(workload: &Workload, owned: &Value) -> BTreeSet<u32> {
    live_containers(workload)
        .filter(|(list, c)| !is_operators(owned, list, &c.name))
        .flat_map(|(_, c)| c.env.iter().flatten())
        .filter(|e| e.name == PLUGIN_ADDRESS_ENV)
        .filter_map(|e| e.value.as_deref()?.rsplit_once(':')?.1.trim().parse().ok())
        .collect()
}

/// The `ports[].containerPort`s declared by the containers and init containers of `workload`
/// that the operator did not add (such as the syncer's `8443`).
fn foreign_declared_ports(workload: &Workload, owned: &Value) -> BTreeSet<u32> {
    live_containers(workload)
        .filter(|(list, c)| !is_operators(owned, list, &c.name))
        .flat_map(|(_, c)| c.ports.iter().flatten())
        .filter_map(|p| u32::try_from(p.container_port).ok())
        .collect()
}

/// The lowest port from `base` not in `taken`.
fn lowest_free_port(base: u32, taken: &BTreeSet<u32>) -> u32 {
    let mut port = base;
    while taken.contains(&port) {
        port += 1;
    }
    port
}

/// A plugin's container name is taken when a container or init container of that name exists
/// whose `image` the operator does not own (so someone else added it, such as `syncer`).
fn name_conflict(workload: &Workload, owned: &Value, name: &str) -> Option<Refusal> {
    for (list, c) in live_containers(workload) {
        if c.name == name && !is_operators(owned, list, name) {
            return Some(Refusal {
                reason: Reason::Conflict,
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
                reason: Reason::Conflict,
                message: format!(
                    "spec.syncedTypes[{i}] ({} {}) is already synced by the older VClusterPlugin `{owner}` in vCluster {}/{}; two plugins syncing one type would fight over the same host objects: remove the type from one of them",
                    t.api_version, t.kind, workload.namespace, workload.name
                ),
            })
        })
}
