//! The containers, init containers and volumes one plugin adds to the vCluster's pod template.
//!
//! The rules (`image`, `version`, the container fields as in the vCluster chart; the README, "The
//! two ways a Rust plugin runs in vCluster"): the embedded-runtime sidecar with the kubeconfig
//! Secret `vc-<vcluster>`, the embedded runtime as a v2 plugin (`install-plugin`), an image's v2
//! init container (`cp -r /plugin /plugins/<name>`, as vCluster's chart does) and the legacy v1
//! sidecar (`VCLUSTER_PLUGIN_ADDRESS` / `VCLUSTER_PLUGIN_NAME`, as the chart's
//! `vcluster.legacyPlugins.containers` renders them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use vcp_crds::Reason;
use vcp_crds::{PluginVersion, RUNTIME_ENV, VClusterPlugin};

use super::identity::Refusal;
use crate::quantity::Amount;

/// Name of the emptyDir volume shared by the v2 init containers and `syncer`: vCluster's syncer
/// runs every `/plugins/<name>/plugin` in it. Mounted only into the init containers the operator
/// builds for v2 plugins and into `syncer` (as vCluster's chart does); a spec's own mount of it
/// is never copied (and is refused by the CRD and by `crate::policy::containers`), so no
/// sidecar, and above all no embedded-runtime container holding the vCluster's admin
/// kubeconfig, sees a file another plugin wrote there.
pub const PLUGINS_VOLUME: &str = "plugins";
/// Mount path of [`PLUGINS_VOLUME`].
pub const PLUGINS_MOUNT_PATH: &str = "/plugins";
/// Binary of the embedded runtime inside the runtime image, by absolute path (the Dockerfile's
/// `COPY ... /usr/local/bin/vcluster-plugin-syncer`): the container's command is never looked up
/// in a `PATH`, so nothing in the container's environment or mounts chooses what runs.
pub const RUNTIME_BINARY: &str = "/usr/local/bin/vcluster-plugin-syncer";
/// Volume (a Secret volume of `vc-<vcluster>`) shared by every embedded-runtime sidecar: the
/// vCluster's admin kubeconfig. Mounted only into the runtime containers the operator builds
/// ([`embedded_container`]); a spec's own mount of it is never copied (and is refused by the
/// CRD and by `crate::policy::containers`, whatever `allowedVolumes` says).
pub const VCLUSTER_KUBECONFIG_VOLUME: &str = "vcp-vcluster-kubeconfig";
/// Environment variable holding the plugin's name in the operator's sidecars: the embedded
/// runtime runs only the plugin named there (syncer-runtime/src/main.rs), and a v1 sidecar gets
/// it as vCluster's chart renders it.
pub const PLUGIN_NAME_ENV: &str = "VCLUSTER_PLUGIN_NAME";
/// Prefixes of environment variable names reserved for the operator and its runtime: refused in
/// a spec's `env` by the CRD, and never copied from a spec into a container.
pub const RESERVED_ENV_PREFIXES: [&str; 2] = ["VCP_", "VCLUSTER_"];
/// Mount path of [`VCLUSTER_KUBECONFIG_VOLUME`] in the embedded-runtime sidecars.
pub const VCLUSTER_KUBECONFIG_DIR: &str = "/var/run/vcp/vcluster";
/// Key of the vCluster's kubeconfig in its Secret `vc-<vcluster>` (and so the file name under
/// [`VCLUSTER_KUBECONFIG_DIR`]).
pub const VCLUSTER_KUBECONFIG_KEY: &str = "config";
/// Environment variable holding the address a v1 sidecar listens on (`localhost:<port>`), the
/// name vCluster's chart gives it (`chart/templates/_plugin.tpl`,
/// `vcluster.legacyPlugins.containers`, v0.30.0 and v0.36.1 alike).
pub const PLUGIN_ADDRESS_ENV: &str = "VCLUSTER_PLUGIN_ADDRESS";
/// Lowest port of a v1 sidecar. vCluster's chart numbers the v1 sidecars it renders itself
/// from the same base (`chart/templates/_plugin.tpl`, `vcluster.legacyPlugins.containers`,
/// v0.30.0 and v0.36.1 alike: `localhost:{{ add 14000 $counter }}`, the counter running over
/// the entries of the values' `plugin:` map in key order, every entry but `version: v2`
/// counted), and all containers of a pod share one network namespace. So the operator's v1
/// plugins, in install order ([`install_order`](super::install_order): creationTimestamp, then
/// name), each take the lowest port from this base that no container the operator did not add
/// names in its [`PLUGIN_ADDRESS_ENV`] and no earlier v1 plugin of the operator took
/// ([`plan`](super::plan)). Without chart-rendered v1 sidecars the i-th (0-based) v1 plugin
/// gets `14000 + i`; beside `n` of them, `14000 + n + i`.
pub const V1_BASE_PORT: u32 = 14000;

/// Lowest port on which an embedded-runtime sidecar serves `/metrics` and `/healthz`
/// (`--metrics-bind-address 0.0.0.0:<port>`). The containers of a pod share one network
/// namespace, so each sidecar of the pod gets its own port: in install order, the lowest from
/// this base that no container the operator did not add declares (`ports[].containerPort`) and
/// no earlier sidecar of the operator took ([`plan`](super::plan)); without such a container
/// the i-th (0-based) embedded plugin gets `9460 + i`. The base is clear of what vCluster
/// v0.30.0's pod listens on: the syncer's `8443` (its probes' port too), the virtual
/// kube-apiserver's `6443`, embedded etcd's `2379`-`2381`, konnectivity's `8132`, the Istio
/// integration's `9090`, the Kubernetes components' `10250`-`10259`, and the v1 sidecars from
/// [`V1_BASE_PORT`]. The port is not declared as a `containerPort` (a scrape config names it).
pub const RUNTIME_METRICS_BASE_PORT: u32 = 9460;

/// Requests of the embedded-runtime sidecar for each resource its plugin's `resources` does not
/// name: CPU `100m`, memory `96Mi`. Limits: [`RUNTIME_LIMITS`].
///
/// The figures hold at 50,000 synced objects, measured by `scripts/bench sync`
/// (`docs/BENCHMARKS.md`, "runtime: peak RSS at 50,000 objects" and "the restart on 50,000"):
/// - memory: the runtime's resident set peaks at 62.6–69.2 MiB once 50,000 objects are in
///   sync, and at 76.5–95.8 MiB (medians of the runs) while a restarted runtime lists them
///   again; the request covers those medians. The limit, `256Mi`, leaves room above the
///   highest single peak measured (103.6 MiB, a busy machine) for the expression sandbox: up to
///   `EVALUATION_SLOTS` (4) evaluations at once and `MAX_OVERRUNNING` (2) past their bound, each
///   bounded to 16 MiB (`vcp_syncer_runtime::patches`), 96 MiB together: 200 MiB in the worst
///   case measured plus the worst case allowed;
/// - CPU: the runtime runs its syncers on one worker thread (`syncer-runtime/src/main.rs`);
///   syncing 50,000 objects costs 0.25–0.47 ms of CPU each (the same benchmark), about 0.6 to
///   0.9 of a core while the initial sync runs and next to nothing once in sync. The limit,
///   one core, keeps that pace and bounds what a flood of its `/metrics` port can take from the
///   pod's other containers; the request, `100m`, is what it needs between bursts.
///
/// A plugin's own `spec.resources` overrides these per resource and per kind
/// ([`runtime_resources`]), within the operator policy's `containers.maxResources`
/// (`crate::policy::containers`). A v2 plugin, embedded or not, runs inside vCluster's `syncer`
/// container (its process is started by vCluster's syncer from `/plugins`): the `syncer`
/// container's own requests and limits (the vCluster chart's
/// `controlPlane.statefulSet.resources`) apply to it, the operator sets none, and a v2
/// plugin's `spec.resources` applies only to its init container, which copies its binary.
pub const RUNTIME_REQUESTS: [(&str, &str); 2] = [("cpu", "100m"), ("memory", "96Mi")];

/// Limits of the embedded-runtime sidecar for each resource its plugin's `resources` does not
/// name: CPU `1`, memory `256Mi` (the source of the figures: [`RUNTIME_REQUESTS`]).
pub const RUNTIME_LIMITS: [(&str, &str); 2] = [("cpu", "1"), ("memory", "256Mi")];

/// The requests and limits of the embedded-runtime sidecar for a plugin whose `spec.resources`
/// is `spec`: everything `spec` names, and for CPU and memory the defaults
/// ([`RUNTIME_REQUESTS`], [`RUNTIME_LIMITS`]) where `spec` names none, kept consistent with
/// what it names as Kubernetes keeps a container's (a request is never above its limit): a
/// limit given alone below the default request is the request too, a request given alone above
/// the default limit is the limit too. A quantity that cannot be read is kept as written (the
/// API server's dry run then refuses it, `InvalidWorkload`).
pub fn runtime_resources(spec: Option<&ResourceRequirements>) -> ResourceRequirements {
    let mut requests: BTreeMap<String, Quantity> =
        spec.and_then(|r| r.requests.clone()).unwrap_or_default();
    let mut limits: BTreeMap<String, Quantity> =
        spec.and_then(|r| r.limits.clone()).unwrap_or_default();
    let below = |a: &Quantity, b: &str| match (Amount::parse(&a.0), Amount::parse(b)) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    };
    for ((resource, request), (_, limit)) in RUNTIME_REQUESTS.iter().zip(RUNTIME_LIMITS) {
        let given_request = requests.get(*resource).cloned();
        let given_limit = limits.get(*resource).cloned();
        if given_request.is_none() {
            let request = match &given_limit {
                Some(l) if below(l, request) => l.clone(),
                _ => Quantity((*request).to_string()),
            };
            requests.insert((*resource).to_string(), request);
        }
        if given_limit.is_none() {
            let limit = match &given_request {
                Some(r) if !below(r, limit) => r.clone(),
                _ => Quantity(limit.to_string()),
            };
            limits.insert((*resource).to_string(), limit);
        }
    }
    ResourceRequirements {
        claims: spec.and_then(|r| r.claims.clone()),
        limits: Some(limits),
        requests: Some(requests),
    }
}

/// How a plugin runs inside the vCluster pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginKind {
    /// No `image`, `version: v1` or none (with no create-time pod hook, [`plugin_kind`]): the
    /// embedded runtime as a sidecar container.
    Embedded,
    /// No `image`, `version: v2` or none with a create-time pod hook ([`plugin_kind`]): the
    /// embedded runtime copied into `/plugins/<name>` by an init container and started by
    /// vCluster's syncer as a v2 plugin.
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

/// How `plugin` runs. For the embedded runtime, `version: v2` makes it a v2 plugin and
/// `version: v1` the sidecar; without `version` it is the sidecar, unless a `CreatePhysical`
/// pod hook changes what an existing pod cannot change: then the v2 way, where vCluster calls
/// the hook before it creates the pod ([`super::hook_mode`]).
pub fn plugin_kind(plugin: &VClusterPlugin) -> PluginKind {
    match (&plugin.spec.image, plugin.spec.version) {
        (None, Some(PluginVersion::V2)) => PluginKind::EmbeddedV2,
        (None, None) if !super::hook_mode::create_time_changes(plugin).is_empty() => {
            PluginKind::EmbeddedV2
        }
        (None, _) => PluginKind::Embedded,
        (Some(_), Some(PluginVersion::V1)) => PluginKind::V1,
        (Some(_), _) => PluginKind::V2,
    }
}

/// The Secret volume holding the vCluster's kubeconfig: vCluster writes it to the host Secret
/// `vc-<vcluster>` (key [`VCLUSTER_KUBECONFIG_KEY`]).
///
/// `optional: true`: vCluster's syncer writes that Secret only on its first start, in the very
/// pod this volume is part of. A plugin applied together with its vCluster (one `kubectl
/// apply`, one Argo CD sync wave) patches the StatefulSet before that first start, and a
/// required Secret volume would keep the whole pod, `syncer` included, in `ContainerCreating`
/// (`FailedMount`) for ever, a deadlock seen on the real node. Optional, the pod starts with the
/// folder empty, the kubelet fills it once the Secret exists, and the runtime sidecar waits for
/// the file (`vcp_syncer_runtime::sdk::wait_for_kubeconfig`).
pub fn vcluster_kubeconfig_volume(vcluster: &str) -> Volume {
    Volume {
        name: VCLUSTER_KUBECONFIG_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(format!("vc-{vcluster}")),
            optional: Some(true),
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

pub(super) fn plugins_mount() -> VolumeMount {
    VolumeMount {
        name: PLUGINS_VOLUME.into(),
        mount_path: PLUGINS_MOUNT_PATH.into(),
        ..Default::default()
    }
}

/// Puts the operator's `mount` first in `c`'s mounts, dropping a spec mount at the same path
/// (a mount path can be used only once in a container).
fn mount_first(c: &mut Container, mount: VolumeMount) {
    let mut mounts = c.volume_mounts.take().unwrap_or_default();
    mounts.retain(|m| m.mount_path != mount.mount_path);
    mounts.insert(0, mount);
    c.volume_mounts = Some(mounts);
}

/// Whether `name` is an environment variable name reserved for the operator and its runtime
/// ([`RESERVED_ENV_PREFIXES`]).
pub fn is_reserved_env(name: &str) -> bool {
    RESERVED_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether `name` is one of the operator's volumes ([`PLUGINS_VOLUME`],
/// [`VCLUSTER_KUBECONFIG_VOLUME`]), which only the containers the operator builds mount.
pub fn is_operator_volume(name: &str) -> bool {
    name == PLUGINS_VOLUME || name == VCLUSTER_KUBECONFIG_VOLUME
}

/// The container fields every kind of plugin copies from its spec, without a spec `env` entry of
/// a reserved name ([`is_reserved_env`]) and without a spec mount of one of the operator's
/// volumes ([`is_operator_volume`]) (both refused at admission; dropped here too for objects
/// stored before those rules existed).
fn base_container(plugin: &VClusterPlugin, image: &str) -> Container {
    let spec = &plugin.spec;
    let env = kept(spec.env.as_deref(), |e: &EnvVar| !is_reserved_env(&e.name));
    let mounts = kept(spec.volume_mounts.as_deref(), |m: &VolumeMount| {
        !is_operator_volume(&m.name)
    });
    Container {
        name: plugin.name_any(),
        image: Some(image.to_string()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: spec.command.clone(),
        args: spec.args.clone(),
        env: Some(env).filter(|e| !e.is_empty()),
        env_from: spec.env_from.clone().filter(|e| !e.is_empty()),
        resources: spec.resources.clone(),
        security_context: spec.security_context.clone(),
        volume_mounts: Some(mounts).filter(|m| !m.is_empty()),
        ..Default::default()
    }
}

/// The entries of `items` (none when absent) that `keep` accepts, in order.
fn kept<T: Clone>(items: Option<&[T]>, keep: impl Fn(&T) -> bool) -> Vec<T> {
    items
        .into_iter()
        .flatten()
        .filter(|item| keep(item))
        .cloned()
        .collect()
}

/// [`base_container`] for the embedded runtime, whose container is the operator's: it holds the
/// vCluster's admin kubeconfig (the sidecar) or writes the binary vCluster's syncer runs (the v2
/// init container). So the command line, the environment sources and the mounts are the
/// operator's alone, and of the spec's `env` only the names of [`RUNTIME_ENV`] (`RUST_LOG`) are
/// copied: an allow list, as the variables a loader, a C library or a Kubernetes client obeys
/// (`PATH`, `LD_PRELOAD`, `KUBECONFIG`, `KUBERNETES_SERVICE_HOST`, ...) are too many to refuse
/// one by one. The CRD refuses the rest (`command`, `args`, `envFrom`, `volumeMounts`, other
/// `env` names) for a plugin without `image`; objects stored before those rules are not copied.
fn runtime_base_container(plugin: &VClusterPlugin, runtime_image: &str) -> Container {
    let base = base_container(plugin, runtime_image);
    let env: Vec<EnvVar> = base
        .env
        .into_iter()
        .flatten()
        .filter(|e| RUNTIME_ENV.contains(&e.name.as_str()))
        .collect();
    Container {
        command: None,
        args: None,
        env: Some(env).filter(|e| !e.is_empty()),
        env_from: None,
        volume_mounts: None,
        ..base
    }
}

/// The embedded-runtime sidecar: `/usr/local/bin/vcluster-plugin-syncer --namespace <ns>
/// --vcluster <vcluster> --virtual-kubeconfig /var/run/vcp/vcluster/config
/// --metrics-bind-address 0.0.0.0:<metrics_port>` with env
/// `VCLUSTER_PLUGIN_NAME=<name>` first (the one place the plugin's name is written: the
/// runtime refuses to run any other), then the spec's `RUST_LOG` ([`runtime_base_container`]);
/// with the vCluster's kubeconfig Secret mounted read-only at [`VCLUSTER_KUBECONFIG_DIR`], its
/// only mount; `/metrics` served on `0.0.0.0:<metrics_port>` (`--metrics-bind-address`,
/// [`RUNTIME_METRICS_BASE_PORT`]); requests and limits from [`runtime_resources`].
pub fn embedded_container(
    plugin: &VClusterPlugin,
    runtime_image: &str,
    metrics_port: u32,
) -> Container {
    let mut c = runtime_base_container(plugin, runtime_image);
    mount_first(&mut c, vcluster_kubeconfig_mount());
    c.resources = Some(runtime_resources(plugin.spec.resources.as_ref()));
    c.command = Some(vec![RUNTIME_BINARY.to_string()]);
    c.args = Some(vec![
        "--namespace".into(),
        plugin.namespace().unwrap_or_default(),
        "--vcluster".into(),
        plugin.spec.vcluster.name.clone(),
        "--virtual-kubeconfig".into(),
        format!("{VCLUSTER_KUBECONFIG_DIR}/{VCLUSTER_KUBECONFIG_KEY}"),
        "--metrics-bind-address".into(),
        format!("0.0.0.0:{metrics_port}"),
    ]);
    let mut env = vec![EnvVar {
        name: PLUGIN_NAME_ENV.into(),
        value: Some(plugin.name_any()),
        ..Default::default()
    }];
    env.extend(c.env.take().unwrap_or_default());
    c.env = Some(env);
    c
}

/// The legacy v1 sidecar listening on `localhost:<port>`: env `VCLUSTER_PLUGIN_ADDRESS` and
/// `VCLUSTER_PLUGIN_NAME` first, then `spec.env`, as vCluster's chart renders it
/// (`vcluster.legacyPlugins.containers`), then `PLUGIN_CONFIG` from `spec.config` rendered as
/// YAML (the chart has no such env: a deliberate difference, see tests/tests/oracle_chart.rs).
///
/// # Errors
/// A [`Refusal`] with [`InvalidConfig`](vcp_crds::Reason::InvalidConfig) when `spec.config` cannot be rendered.
pub fn v1_container(plugin: &VClusterPlugin, port: u32) -> Result<Container, Refusal> {
    let mut c = base_container(plugin, plugin.spec.image.as_deref().unwrap_or_default());
    let own = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let mut env = vec![
        own(PLUGIN_ADDRESS_ENV, format!("localhost:{port}")),
        own(PLUGIN_NAME_ENV, plugin.name_any()),
    ];
    // Reserved names (VCLUSTER_PLUGIN_ADDRESS, VCLUSTER_PLUGIN_NAME) are already out.
    env.extend(
        c.env
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.name != "PLUGIN_CONFIG"),
    );
    let mut push = |name: &str, value: String| env.push(own(name, value));
    if let Some(config) = &plugin.spec.config {
        let yaml = serde_yaml::to_string(config).map_err(|e| Refusal {
            reason: Reason::InvalidConfig,
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
    mount_first(&mut c, plugins_mount());
    c
}

/// The init container of the embedded runtime as a v2 plugin: `/usr/local/bin/vcluster-plugin-syncer
/// install-plugin /plugins/<name>` from the runtime image (the runtime copies itself to
/// `/plugins/<name>/plugin`, where vCluster's syncer finds and starts it; the folder's name is
/// the one place the plugin's name is written, and the runtime runs no other), with `plugins`
/// mounted at `/plugins` (its only mount).
pub fn embedded_v2_init_container(plugin: &VClusterPlugin, runtime_image: &str) -> Container {
    let mut c = runtime_base_container(plugin, runtime_image);
    c.command = Some(vec![
        RUNTIME_BINARY.to_string(),
        "install-plugin".into(),
        format!("{PLUGINS_MOUNT_PATH}/{}", plugin.name_any()),
    ]);
    mount_first(&mut c, plugins_mount());
    c
}
