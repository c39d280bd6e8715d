use std::collections::{BTreeMap, BTreeSet};
use vcp_crds::Reason;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, Container, EnvFromSource, EnvVar, PodSpec, ResourceRequirements, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use serde_json::{Value, json};
use vcp_crds::{
    FINALIZER, OPERATOR_FIELD_MANAGER, PluginVersion, PullPolicy, VClusterPlugin,
    VClusterPluginSpec, VClusterRef,
};

use super::converge::{list_key, to_value};
use super::*;

const RUNTIME: &str = "ghcr.io/vcp-dev/vcluster-plugin-operator:0.1.0";

pub(super) fn plugin(
    name: &str,
    image: Option<&str>,
    version: Option<PluginVersion>,
) -> VClusterPlugin {
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
pub(super) fn workload() -> Workload {
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
                    "command": ["/usr/local/bin/vcluster-plugin-syncer"],
                    "args": ["--namespace", "team-a", "--vcluster", "my-vcluster",
                             "--virtual-kubeconfig", "/var/run/vcp/vcluster/config",
                             "--metrics-bind-address", "0.0.0.0:9460"],
                    "env": [{ "name": "VCLUSTER_PLUGIN_NAME", "value": "car-syncer" }],
                    "resources": {
                        "requests": { "cpu": "100m", "memory": "96Mi" },
                        "limits": { "cpu": "1", "memory": "256Mi" },
                    },
                    "volumeMounts": [{ "name": "vcp-vcluster-kubeconfig", "mountPath": "/var/run/vcp/vcluster", "readOnly": true }],
                }],
                "volumes": [{ "name": "vcp-vcluster-kubeconfig", "secret": { "secretName": "vc-my-vcluster", "optional": true } }],
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
    // The embedded runtime takes no mount of a spec's (refused by the CRD; not copied from a
    // spec stored before that rule).
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
            { "name": "vcp-vcluster-kubeconfig", "secret": { "secretName": "vc-my-vcluster", "optional": true } },
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
    assert_eq!(mounts(&cs[2]), [kubeconfig]);
    assert_eq!(
        cs[2].args.as_ref().unwrap()[4..6],
        ["--virtual-kubeconfig", "/var/run/vcp/vcluster/config"]
    );
    // One `/metrics` port per sidecar of the pod, in install order.
    assert_eq!(
        cs[1].args.as_ref().unwrap()[6..],
        ["--metrics-bind-address", "0.0.0.0:9460"]
    );
    assert_eq!(
        cs[2].args.as_ref().unwrap()[6..],
        ["--metrics-bind-address", "0.0.0.0:9461"]
    );
    // A port a container the operator did not add declares is never taken.
    let mut busy = workload();
    busy.pod_spec.containers.push(Container {
        name: "exporter".into(),
        ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            container_port: 9460,
            ..Default::default()
        }]),
        ..Default::default()
    });
    let beside = plan(&busy, &[&b, &a], RUNTIME);
    let ports: Vec<String> = containers(&beside.patch)
        .iter()
        .map(|c| c.args.as_ref().unwrap()[7].clone())
        .collect();
    assert_eq!(ports, ["0.0.0.0:9461", "0.0.0.0:9462"]);
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

/// The embedded runtime's command line, arguments and environment sources are
/// the operator's, whatever a spec stored before the CRD's rules holds; the plugin's name is
/// written once (`VCLUSTER_PLUGIN_NAME`, first), and spec env of reserved names is not copied.
#[test]
fn nothing_in_a_spec_points_the_embedded_runtime_at_another_plugin() {
    let mut p = plugin("mine", None, None);
    p.spec.command = Some(vec![
        "vcluster-plugin-syncer".into(),
        "--plugin".into(),
        "victim".into(),
    ]);
    p.spec.args = Some(vec!["--plugin".into(), "victim".into()]);
    p.spec.env_from = Some(vec![EnvFromSource {
        config_map_ref: Some(ConfigMapEnvSource {
            name: "settings".into(),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let env = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    };
    p.spec.env = Some(vec![
        env("VCLUSTER_PLUGIN_NAME", "victim"),
        env("VCP_FAULT_STOP_AFTER_WRITES", "1"),
        env("RUST_LOG", "debug"),
    ]);
    let c = embedded_container(&p, RUNTIME, 9460);
    assert_eq!(
        serde_json::to_value(&c).unwrap(),
        json!({
            "name": "mine",
            "image": RUNTIME,
            "command": ["/usr/local/bin/vcluster-plugin-syncer"],
            "args": ["--namespace", "team-a", "--vcluster", "my-vcluster",
                     "--virtual-kubeconfig", "/var/run/vcp/vcluster/config",
                     "--metrics-bind-address", "0.0.0.0:9460"],
            "env": [
                { "name": "VCLUSTER_PLUGIN_NAME", "value": "mine" },
                { "name": "RUST_LOG", "value": "debug" },
            ],
            "resources": {
                "requests": { "cpu": "100m", "memory": "96Mi" },
                "limits": { "cpu": "1", "memory": "256Mi" },
            },
            "volumeMounts": [{ "name": "vcp-vcluster-kubeconfig", "mountPath": "/var/run/vcp/vcluster", "readOnly": true }],
        })
    );
    // As a v2 plugin: the folder (the name vCluster's syncer gives the runtime) is the
    // operator's too.
    p.spec.version = Some(PluginVersion::V2);
    let init = embedded_v2_init_container(&p, RUNTIME);
    assert_eq!(
        init.command.as_deref().unwrap(),
        [
            "/usr/local/bin/vcluster-plugin-syncer",
            "install-plugin",
            "/plugins/mine"
        ]
    );
    assert_eq!((init.args, init.env_from), (None, None));
}

/// An attack: the embedded runtime's container is the operator's. Of a spec
/// stored before the CRD's rules, no mount (such as `plugins` over `/usr/local/bin`, where
/// another plugin's v2 init container dropped a script) and no variable but `RUST_LOG` (such as
/// `PATH`, `LD_PRELOAD` or `KUBECONFIG`) is copied, in the sidecar as in the v2 init container,
/// and the runtime runs by absolute path.
#[test]
fn the_embedded_runtime_takes_no_mount_and_no_variable_of_a_spec_but_rust_log() {
    let mut p = plugin("victim-runtime", None, None);
    let mount = |name: &str, path: &str| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    };
    p.spec.volume_mounts = Some(vec![
        mount("plugins", "/usr/local/bin"),
        mount("data", "/data"),
    ]);
    let env = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    };
    p.spec.env = Some(vec![
        env("PATH", "/x:/usr/local/bin:/usr/bin:/bin"),
        env("LD_PRELOAD", "/plugins/evil.so"),
        env("KUBECONFIG", "/plugins/kubeconfig"),
        env("HOST_KUBECONFIG", "/plugins/kubeconfig"),
        env("RUST_LOG", "debug"),
    ]);
    let c = embedded_container(&p, RUNTIME, 9460);
    assert_eq!(
        serde_json::to_value(&c).unwrap(),
        json!({
            "name": "victim-runtime",
            "image": RUNTIME,
            "command": ["/usr/local/bin/vcluster-plugin-syncer"],
            "args": ["--namespace", "team-a", "--vcluster", "my-vcluster",
                     "--virtual-kubeconfig", "/var/run/vcp/vcluster/config",
                     "--metrics-bind-address", "0.0.0.0:9460"],
            "env": [
                { "name": "VCLUSTER_PLUGIN_NAME", "value": "victim-runtime" },
                { "name": "RUST_LOG", "value": "debug" },
            ],
            "resources": {
                "requests": { "cpu": "100m", "memory": "96Mi" },
                "limits": { "cpu": "1", "memory": "256Mi" },
            },
            "volumeMounts": [{ "name": "vcp-vcluster-kubeconfig", "mountPath": "/var/run/vcp/vcluster", "readOnly": true }],
        })
    );
    p.spec.version = Some(PluginVersion::V2);
    let init = embedded_v2_init_container(&p, RUNTIME);
    assert_eq!(
        serde_json::to_value(&init).unwrap(),
        json!({
            "name": "victim-runtime",
            "image": RUNTIME,
            "command": ["/usr/local/bin/vcluster-plugin-syncer", "install-plugin", "/plugins/victim-runtime"],
            "env": [{ "name": "RUST_LOG", "value": "debug" }],
            "volumeMounts": [{ "name": "plugins", "mountPath": "/plugins" }],
        })
    );
}

/// An attack: `plugins` (the v2 plugins' binaries, which vCluster's syncer
/// runs) is mounted by the operator's v2 init containers and `syncer` only: a v1 sidecar's or a
/// v2 init container's own mount of it (a spec stored before the CRD's rule) is not copied.
#[test]
fn only_the_v2_init_containers_and_syncer_mount_the_plugins_volume() {
    let elsewhere = VolumeMount {
        name: PLUGINS_VOLUME.into(),
        mount_path: "/x".into(),
        ..Default::default()
    };
    let mut v1 = created_at(plugin("thief-v1", Some("img"), Some(PluginVersion::V1)), 1);
    v1.spec.volume_mounts = Some(vec![elsewhere.clone()]);
    let mut v2 = created_at(plugin("thief-v2", Some("img"), None), 2);
    v2.spec.volume_mounts = Some(vec![elsewhere]);
    let embedded = created_at(plugin("runtime", None, None), 3);
    let both = plan(&workload(), &[&v1, &v2, &embedded], RUNTIME);
    let mounts: BTreeMap<String, Vec<String>> = containers(&both.patch)
        .iter()
        .chain(init_containers(&both.patch).iter())
        .map(|c| {
            let paths = c
                .volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == PLUGINS_VOLUME)
                .map(|m| m.mount_path.clone())
                .collect();
            (c.name.clone(), paths)
        })
        .collect();
    let owned = |name: &str, paths: &[&str]| {
        (
            name.to_string(),
            paths.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        mounts,
        BTreeMap::from([
            owned("syncer", &["/plugins"]),
            owned("thief-v1", &[]),
            owned("runtime", &[]),
            owned("thief-v2", &["/plugins"]),
        ])
    );
}

/// The kubeconfig volume goes only into the runtime sidecars the operator
/// builds; a v1 sidecar's or a v2 init container's own mount of it (a spec stored before the
/// CRD's rule) is not copied, even with an embedded sidecar beside them, and without one the
/// volume is not in the pod at all.
#[test]
fn only_the_runtime_sidecar_mounts_the_vcluster_kubeconfig() {
    let steal = VolumeMount {
        name: VCLUSTER_KUBECONFIG_VOLUME.into(),
        mount_path: "/steal".into(),
        ..Default::default()
    };
    let mut v1 = created_at(plugin("thief-v1", Some("img"), Some(PluginVersion::V1)), 1);
    v1.spec.volume_mounts = Some(vec![steal.clone()]);
    let mut v2 = created_at(plugin("thief-v2", Some("img"), None), 2);
    v2.spec.volume_mounts = Some(vec![steal]);
    let embedded = created_at(plugin("runtime", None, None), 3);
    let mounted_by = |patch: &Value| -> Vec<String> {
        containers(patch)
            .iter()
            .chain(init_containers(patch).iter())
            .filter(|c| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == VCLUSTER_KUBECONFIG_VOLUME)
            })
            .map(|c| c.name.clone())
            .collect()
    };
    let volumes = |patch: &Value| -> Vec<String> {
        patch["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    };
    let with_runtime = plan(&workload(), &[&v1, &v2, &embedded], RUNTIME);
    assert_eq!(with_runtime.installed.len(), 3);
    assert_eq!(mounted_by(&with_runtime.patch), ["runtime"]);
    assert_eq!(
        volumes(&with_runtime.patch),
        [VCLUSTER_KUBECONFIG_VOLUME, "plugins"]
    );
    let alone = plan(&workload(), &[&v1, &v2], RUNTIME);
    assert_eq!(mounted_by(&alone.patch), Vec::<String>::new());
    assert_eq!(volumes(&alone.patch), ["plugins"]);
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
                "command": ["/usr/local/bin/vcluster-plugin-syncer", "install-plugin", "/plugins/cars"],
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

/// A v1 sidecar as vCluster's chart renders it for the values entry `plugin.<key>`
/// (`chart/templates/_plugin.tpl`, `vcluster.legacyPlugins.containers`, lines 56-101 at
/// v0.30.0 and v0.36.1 alike): the container is named after the key, and its env begins with
/// `VCLUSTER_PLUGIN_ADDRESS: "localhost:{{ add 14000 $counter }}"` and
/// `VCLUSTER_PLUGIN_NAME: "{{ $key }}"`; `address` is that rendered address.
fn chart_v1_sidecar(key: &str, address: &str) -> Container {
    let env = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    };
    Container {
        name: key.into(),
        image: Some(format!("ghcr.io/example/{key}:1")),
        env: Some(vec![
            env("VCLUSTER_PLUGIN_ADDRESS", address),
            env("VCLUSTER_PLUGIN_NAME", key),
        ]),
        ..Default::default()
    }
}

/// `workload()` with the v1 sidecars the chart renders for the values
/// `plugin: { a-legacy: {image, version: v1}, b-modern: {image, version: v2}, c-legacy: {image} }`:
/// the template ranges over `plugin:` in key order with `$counter` from -1, skips only
/// `version: v2` entries (`b-modern`, rendered as no sidecar) and adds 1 to `$counter` for every
/// other entry, with or without `version`: `a-legacy` on `localhost:14000`, `c-legacy` on
/// `localhost:14001`.
fn workload_with_chart_v1_sidecars() -> Workload {
    let mut w = workload();
    w.pod_spec.containers.extend([
        chart_v1_sidecar("a-legacy", "localhost:14000"),
        chart_v1_sidecar("c-legacy", "localhost:14001"),
    ]);
    w
}

/// The `VCLUSTER_PLUGIN_ADDRESS` of each of the operator's containers in `patch` that has one,
/// by container name.
fn v1_addresses(patch: &Value) -> BTreeMap<String, String> {
    containers(patch)
        .into_iter()
        .filter_map(|c| {
            let address = c
                .env
                .iter()
                .flatten()
                .find(|e| e.name == "VCLUSTER_PLUGIN_ADDRESS")?
                .value
                .clone()?;
            Some((c.name, address))
        })
        .collect()
}

/// The bug: the chart numbers its own v1 sidecars from `localhost:14000` too, and a pod's
/// containers share one network namespace, so an operator sidecar on `localhost:14000` beside
/// the chart's `a-legacy` could not listen. The operator's v1 sidecars take the ports after the
/// chart's (`a-legacy` 14000, `c-legacy` 14001, as the template numbers them); the chart's
/// containers are not in the apply body.
#[test]
fn v1_sidecars_do_not_take_the_ports_of_the_charts_v1_sidecars() {
    // One chart sidecar: the case of the bug report.
    let mut one = workload();
    one.pod_spec
        .containers
        .push(chart_v1_sidecar("a-legacy", "localhost:14000"));
    let p = created_at(plugin("hook", Some("img"), Some(PluginVersion::V1)), 1);
    let single = plan(&one, &[&p], RUNTIME);
    assert_eq!(single.installed, BTreeSet::from(["hook".to_string()]));
    assert_eq!(
        v1_addresses(&single.patch),
        BTreeMap::from([("hook".to_string(), "localhost:14001".to_string())])
    );

    // Two chart sidecars and a v2 entry between them; two operator v1 plugins, an embedded one
    // and an image v2 one.
    let w = workload_with_chart_v1_sidecars();
    let older = created_at(plugin("zz-older", Some("img"), Some(PluginVersion::V1)), 1);
    let newer = created_at(plugin("aa-newer", Some("img"), Some(PluginVersion::V1)), 2);
    let embedded = created_at(plugin("runtime", None, None), 0);
    let v2 = created_at(plugin("modern", Some("img"), None), 0);
    let both = plan(&w, &[&newer, &embedded, &older, &v2], RUNTIME);
    assert!(both.refused.is_empty(), "{:?}", both.refused);
    assert_eq!(
        v1_addresses(&both.patch),
        BTreeMap::from([
            ("zz-older".to_string(), "localhost:14002".to_string()),
            ("aa-newer".to_string(), "localhost:14003".to_string()),
        ])
    );
    let names: Vec<_> = containers(&both.patch)
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["syncer", "runtime", "zz-older", "aa-newer"]);

    // Whatever host the foreign address names, and in an init container too (a native
    // sidecar shares the pod's network namespace as well).
    let mut other = workload();
    other.pod_spec.init_containers = Some(vec![Container {
        restart_policy: Some("Always".into()),
        ..chart_v1_sidecar("native", "127.0.0.1:14000")
    }]);
    other
        .pod_spec
        .containers
        .push(chart_v1_sidecar("gap", "0.0.0.0:14002"));
    let a = created_at(plugin("a", Some("img"), Some(PluginVersion::V1)), 1);
    let b = created_at(plugin("b", Some("img"), Some(PluginVersion::V1)), 2);
    assert_eq!(
        v1_addresses(&plan(&other, &[&a, &b], RUNTIME).patch),
        BTreeMap::from([
            ("a".to_string(), "localhost:14001".to_string()),
            ("b".to_string(), "localhost:14003".to_string()),
        ])
    );
}

/// The rule is computed the same way from the same inputs on every reconcile: the operator's
/// own sidecar (its address now in the live pod template) does not push itself to another
/// port, so the applied body is converged; a plugin created later, of any kind, leaves the
/// older ones' ports alone.
#[test]
fn v1_ports_are_stable_across_reconciles_and_plugins_added_later() {
    let chart = workload_with_chart_v1_sidecars();
    let first = created_at(plugin("first", Some("img"), Some(PluginVersion::V1)), 10);
    let plan1 = plan(&chart, &[&first], RUNTIME);
    let expected_first = ("first".to_string(), "localhost:14002".to_string());
    assert_eq!(
        v1_addresses(&plan1.patch),
        BTreeMap::from([expected_first.clone()])
    );
    let live = applied(chart.clone(), &plan1.patch);
    for _ in 0..3 {
        let again = plan(&live, &[&first], RUNTIME);
        assert_eq!(again.patch, plan1.patch);
        assert!(is_converged(&live, &again.patch));
    }

    // Plugins created later: an embedded sidecar, an image v2 plugin and another v1 sidecar.
    let embedded = created_at(plugin("a-runtime", None, None), 20);
    let v2 = created_at(plugin("b-modern-2", Some("img"), None), 21);
    let second = created_at(plugin("a-second", Some("img"), Some(PluginVersion::V1)), 22);
    let plan2 = plan(&live, &[&second, &v2, &first, &embedded], RUNTIME);
    assert!(plan2.refused.is_empty(), "{:?}", plan2.refused);
    assert_eq!(
        v1_addresses(&plan2.patch),
        BTreeMap::from([
            expected_first.clone(),
            ("a-second".to_string(), "localhost:14003".to_string()),
        ])
    );
    let live2 = applied(live, &plan2.patch);
    let again2 = plan(&live2, &[&first, &embedded, &v2, &second], RUNTIME);
    assert_eq!(again2.patch, plan2.patch);
    assert!(is_converged(&live2, &again2.patch));
    // The same plugins installed from scratch get the same ports: nothing depends on history.
    assert_eq!(
        v1_addresses(&plan(&chart, &[&first, &embedded, &v2, &second], RUNTIME).patch),
        v1_addresses(&plan2.patch)
    );
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

/// An image plugin's `command` / `args` replace the chart's defaults; the embedded runtime's
/// are the operator's (see `nothing_in_a_spec_points_the_embedded_runtime_at_another_plugin`).
#[test]
fn spec_command_and_args_replace_the_defaults_of_an_image_plugin() {
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
    assert_eq!(plan.refused["syncer"].reason, Reason::Conflict);
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
    assert_eq!(r.reason, Reason::Conflict);
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
        assert_eq!(r.reason, Reason::NotAVCluster);
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
    assert_eq!(plan.refused["a"].reason, Reason::NotAVCluster);
    assert_eq!(plan.refused["b"].reason, Reason::NotAVCluster);
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
        name: "RUST_LOG".into(),
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

fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect(),
    )
}

/// The runtime sidecar's defaults, and a plugin's `spec.resources` overriding them per
/// resource and kind, a request never left above its limit (Kubernetes refuses such a
/// container: `ValidateResourceRequirements`).
#[test]
fn the_runtime_sidecar_gets_default_requests_and_limits_a_spec_overrides() {
    let defaults = runtime_resources(None);
    assert_eq!(
        defaults.requests,
        quantities(&[("cpu", "100m"), ("memory", "96Mi")])
    );
    assert_eq!(
        defaults.limits,
        quantities(&[("cpu", "1"), ("memory", "256Mi")])
    );
    // more memory: the limit given, the default request kept
    let more = ResourceRequirements {
        limits: quantities(&[("memory", "1Gi")]),
        ..Default::default()
    };
    let r = runtime_resources(Some(&more));
    assert_eq!(r.limits, quantities(&[("cpu", "1"), ("memory", "1Gi")]));
    assert_eq!(
        r.requests,
        quantities(&[("cpu", "100m"), ("memory", "96Mi")])
    );
    // a limit alone below the default request: it is the request too
    let less = ResourceRequirements {
        limits: quantities(&[("cpu", "50m"), ("memory", "64Mi")]),
        ..Default::default()
    };
    let r = runtime_resources(Some(&less));
    assert_eq!(
        r.requests,
        quantities(&[("cpu", "50m"), ("memory", "64Mi")])
    );
    // a request alone above the default limit: it is the limit too; other resources kept
    let asks = ResourceRequirements {
        requests: quantities(&[("memory", "0.5Gi"), ("ephemeral-storage", "1Gi")]),
        ..Default::default()
    };
    let r = runtime_resources(Some(&asks));
    assert_eq!(
        r.requests,
        quantities(&[
            ("cpu", "100m"),
            ("ephemeral-storage", "1Gi"),
            ("memory", "0.5Gi")
        ])
    );
    assert_eq!(r.limits, quantities(&[("cpu", "1"), ("memory", "0.5Gi")]));
    // in the sidecar, not in a v1 or v2 image's container (their author's own)
    let p = plugin("e", None, None);
    assert_eq!(
        embedded_container(&p, RUNTIME, 9460).resources,
        Some(defaults)
    );
    let v1 = plugin("v1", Some("img:1"), Some(PluginVersion::V1));
    assert_eq!(v1_container(&v1, 14000).unwrap().resources, None);
}

/// The runtime's `/metrics` port skips a port a foreign v1 sidecar listens on
/// (`VCLUSTER_PLUGIN_ADDRESS`), even one it does not declare.
#[test]
fn the_metrics_port_skips_a_foreign_v1_sidecars_address() {
    let mut wl = workload();
    wl.pod_spec.containers.push(Container {
        name: "chart-plugin".into(),
        env: Some(vec![EnvVar {
            name: PLUGIN_ADDRESS_ENV.into(),
            value: Some("localhost:9460".into()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let p = plugin("e", None, None);
    let planned = plan(&wl, &[&p], RUNTIME);
    assert_eq!(
        containers(&planned.patch)[0].args.as_ref().unwrap()[7],
        "0.0.0.0:9461"
    );
}
